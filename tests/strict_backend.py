"""A test backend that behaves like a GPU array library where it matters.

The engine promises that adding CuPy touches only ``backends/`` and ``kernels/``: no op may
call ``numpy`` on tensor data or turn device data into a NumPy array behind the user's back.
CuPy enforces that at run time, so a hidden host conversion would only show up on a GPU.
This backend enforces it on any machine: its arrays (``StrictArray``) hold a NumPy array
privately and, like ``cupy.ndarray``,

- refuse implicit conversion (``numpy.asarray(a)`` raises TypeError, as in CuPy: "Implicit
  conversion to a NumPy array is not allowed. Please use `.get()`");
- refuse every NumPy function and ufunc (``__array_ufunc__ = None``, ``__array_function__``
  returns NotImplemented), so ``numpy.exp(a)`` and ``numpy.moveaxis(a, ...)`` fail loudly;
- refuse host arrays as operands (``a + numpy_array`` raises, as in CuPy), while Python and
  NumPy scalars are fine;
- return 0-d arrays, not NumPy scalars, from reductions and element access (as CuPy does);
- allow ``item()``, ``bool()``, ``float()``, ``int()`` on one-element arrays (explicit syncs,
  allowed by CuPy too) and ``get()`` for an explicit host copy.

``xp`` is a stand-in for the ``cupy`` module: every function is NumPy's, wrapped so that
StrictArray arguments are unwrapped and array results wrapped again. The kernels unwrap
explicitly and call the numba CPU kernels: the analogue of a CUDA kernel receiving device
arrays.

Used by ``conftest.py``: ``register_backend(StrictBackend())`` makes ``device="strict"``
available, and the op tests run on both "cpu" and "strict".
"""

import numbers
import operator

import numpy

from minitensor.backends import Backend

_IMPLICIT = (
    "Implicit conversion to a NumPy array is not allowed. Please use `.get()` to construct a NumPy array explicitly."
)


def _unwrap(obj, host_ok=False, where="operation"):
    """StrictArrays -> their private NumPy arrays, recursively in tuples, lists and dicts.

    A NumPy array found here came from the host: CuPy refuses it, so do we (unless
    ``host_ok``, for the functions that create device arrays from host data).
    """
    if isinstance(obj, StrictArray):
        return obj._a
    if isinstance(obj, numpy.ndarray):
        if host_ok:
            return obj
        raise TypeError(
            f"strict backend: {where} got a host numpy.ndarray {obj.shape} among device arrays "
            "(CuPy: Unsupported type <class 'numpy.ndarray'>); move it with backend.array() first"
        )
    if isinstance(obj, tuple):
        return tuple(_unwrap(o, host_ok, where) for o in obj)
    if isinstance(obj, list):
        return [_unwrap(o, host_ok, where) for o in obj]
    if isinstance(obj, dict):
        return {k: _unwrap(v, host_ok, where) for k, v in obj.items()}
    return obj


def _wrap(obj):
    """NumPy arrays and scalars -> StrictArrays (CuPy returns 0-d arrays, not scalars)."""
    if isinstance(obj, numpy.ndarray):
        return StrictArray(obj)
    if isinstance(obj, numpy.generic):
        return StrictArray(numpy.asarray(obj))
    if isinstance(obj, tuple):
        return tuple(_wrap(o) for o in obj)
    if isinstance(obj, list):
        return [_wrap(o) for o in obj]
    return obj


def _index(index):
    """Unwrap an index: device arrays inside; lists and host arrays are allowed (CuPy
    converts them) as are ints, slices, None and Ellipsis."""
    return _unwrap(index, host_ok=True)


def _operand(other, op):
    if isinstance(other, StrictArray):
        return other._a
    if isinstance(other, numpy.ndarray):
        raise TypeError(
            f"strict backend: {op} between a device array and a host numpy.ndarray {other.shape} "
            "(CuPy refuses it: Unsupported type <class 'numpy.ndarray'>)"
        )
    if isinstance(other, (numbers.Number, numpy.generic)):
        return other
    return NotImplemented


def _binary(op, name):
    def forward(self, other):
        b = _operand(other, name)
        if b is NotImplemented:
            return NotImplemented
        return _wrap(op(self._a, b))

    def reflected(self, other):
        b = _operand(other, name)
        if b is NotImplemented:
            return NotImplemented
        return _wrap(op(b, self._a))

    def inplace(self, other):
        b = _operand(other, name)
        if b is NotImplemented:
            return NotImplemented
        self._a = getattr(operator, f"__i{name}__")(self._a, b)
        return self

    return forward, reflected, inplace


class StrictArray:
    """A NumPy array that behaves like a ``cupy.ndarray``: see the module docstring."""

    __slots__ = ("_a", "__weakref__")
    __array_ufunc__ = None  # numpy.exp(a), a_numpy + a: refused
    __hash__ = None  # like ndarray: == is elementwise

    def __init__(self, a):
        assert isinstance(a, numpy.ndarray), type(a)
        self._a = a

    # -- refusing the host ----------------------------------------------------------
    def __array__(self, dtype=None, copy=None):
        raise TypeError(_IMPLICIT)

    def __array_function__(self, func, types, args, kwargs):
        return NotImplemented  # numpy.moveaxis(a, ...) etc.: TypeError from NumPy

    def get(self):
        """An explicit host copy (``cupy.ndarray.get()``)."""
        return self._a.copy()

    # -- metadata ---------------------------------------------------------------------
    shape = property(lambda self: self._a.shape)
    ndim = property(lambda self: self._a.ndim)
    dtype = property(lambda self: self._a.dtype)
    size = property(lambda self: self._a.size)
    itemsize = property(lambda self: self._a.itemsize)
    nbytes = property(lambda self: self._a.nbytes)
    strides = property(lambda self: self._a.strides)
    flags = property(lambda self: self._a.flags)
    T = property(lambda self: _wrap(self._a.T))

    def __len__(self):
        return len(self._a)

    def __iter__(self):
        if self._a.ndim == 0:
            raise TypeError("iteration over a 0-d array")
        return (StrictArray(self._a[i]) for i in range(len(self._a)))

    def __repr__(self):
        return f"StrictArray({self._a!r})"

    # -- explicit synchronisation points CuPy allows on one-element arrays -------------
    def _scalar(self, what):
        if self._a.size != 1:
            raise TypeError(f"{what}: only one-element arrays can be converted, this one has shape {self._a.shape}")
        return self._a.reshape(()).item()

    def item(self):
        if self._a.size != 1:
            raise ValueError("can only convert an array of size 1 to a Python scalar")
        return self._a.item()

    def __bool__(self):
        if self._a.size != 1:
            raise ValueError("The truth value of an array with more than one element is ambiguous.")
        return bool(self._a.reshape(()).item())

    def __float__(self):
        return float(self._scalar("float()"))

    def __int__(self):
        return int(self._scalar("int()"))

    # -- indexing ------------------------------------------------------------------------
    def __getitem__(self, index):
        return _wrap(self._a[_index(index)])

    def __setitem__(self, index, value):
        self._a[_index(index)] = _unwrap(value, where="__setitem__")

    # -- unary operators -------------------------------------------------------------------
    def __neg__(self):
        return _wrap(-self._a)

    def __pos__(self):
        return _wrap(+self._a)

    def __abs__(self):
        return _wrap(abs(self._a))

    def __invert__(self):
        return _wrap(~self._a)


def _method(name):
    def method(self, *args, **kwargs):
        args, kwargs = _unwrap(args, where=name), _unwrap(kwargs, where=name)
        return _wrap(getattr(self._a, name)(*args, **kwargs))

    method.__name__ = name
    return method


# Methods (cupy.ndarray has them all): arguments unwrapped, array results wrapped.
for _name in (
    "reshape",
    "astype",
    "sum",
    "mean",
    "max",
    "min",
    "argmax",
    "argmin",
    "any",
    "all",
    "copy",
    "transpose",
    "swapaxes",
    "squeeze",
    "ravel",
    "flatten",
    "clip",
    "prod",
    "var",
    "std",
    "cumsum",
    "fill",
    "repeat",
    "take",
    "nonzero",
    "dot",
    "round",
    "sort",
    "argsort",
    "view",
    "tolist",
):
    setattr(StrictArray, _name, _method(_name))

# Arithmetic, comparison and logical operators, forward / reflected / in place.
for _name, _op in (
    ("add", operator.add),
    ("sub", operator.sub),
    ("mul", operator.mul),
    ("truediv", operator.truediv),
    ("floordiv", operator.floordiv),
    ("mod", operator.mod),
    ("pow", operator.pow),
    ("matmul", operator.matmul),
    ("and", operator.and_),
    ("or", operator.or_),
    ("xor", operator.xor),
):
    _f, _r, _i = _binary(_op, _name)
    setattr(StrictArray, f"__{_name}__", _f)
    setattr(StrictArray, f"__r{_name}__", _r)
    setattr(StrictArray, f"__i{_name}__", _i)
for _name in ("eq", "ne", "lt", "le", "gt", "ge"):
    setattr(StrictArray, f"__{_name}__", _binary(getattr(operator, _name), _name)[0])
del _name, _op, _f, _r, _i


# -- the "cupy" module ----------------------------------------------------------------------
_FROM_HOST = {"array", "asarray", "asanyarray"}  # cupy.array(host) is the explicit upload


class _Function:
    """A NumPy function that takes and returns StrictArrays."""

    def __init__(self, fn, name):
        self._fn, self._name = fn, name
        self._host_ok = name in _FROM_HOST

    def __call__(self, *args, **kwargs):
        where = f"xp.{self._name}"
        args = _unwrap(args, self._host_ok, where)
        kwargs = _unwrap(kwargs, self._host_ok, where)
        return _wrap(self._fn(*args, **kwargs))

    def __repr__(self):
        return f"<strict xp.{self._name}>"


class _Ufunc(_Function):
    """A ufunc: callable, plus ``at``, ``reduce``, ``accumulate``, ``outer``, ``reduceat``."""

    def __getattr__(self, name):
        attr = getattr(self._fn, name)
        if callable(attr):
            return _Function(attr, f"{self._name}.{name}")
        return attr


class StrictNamespace:
    """``xp``: NumPy's namespace seen through StrictArrays, like the ``cupy`` module."""

    def __init__(self, module, prefix=""):
        self._module, self._prefix = module, prefix

    def __getattr__(self, name):
        if name == "ndarray":
            return StrictArray
        attr = getattr(self._module, name)  # AttributeError for names NumPy lacks
        full = self._prefix + name
        if isinstance(attr, numpy.ufunc):
            out = _Ufunc(attr, full)
        elif isinstance(attr, type):  # dtypes (xp.float32), xp.dtype, xp.errstate
            out = attr
        elif type(attr).__name__ == "module":
            out = StrictNamespace(attr, full + ".")
        elif callable(attr):
            out = _Function(attr, full)
        else:  # constants: xp.inf, xp.pi, xp.newaxis
            out = attr
        setattr(self, name, out)  # cache
        return out

    def __repr__(self):
        return "<strict xp (NumPy behind CuPy's manners)>"


strict_xp = StrictNamespace(numpy)


# -- the kernels: explicit unwrapping, as a CUDA kernel receives device pointers --------------
def _device_rows(x, what):
    if not isinstance(x, StrictArray):
        raise TypeError(f"strict kernel {what}: expected a device array, got {type(x).__name__}")
    a = x._a
    if a.ndim != 2 or not a.flags.c_contiguous:
        raise ValueError(f"strict kernel {what}: needs a C-contiguous 2-D array, got shape {a.shape}")
    return a


def _device_lens(lens, rows):
    if lens is None:
        return None
    if not isinstance(lens, StrictArray):
        raise TypeError(f"strict kernel: lens must be a device array, got {type(lens).__name__}")
    a = lens._a
    if a.shape != (rows,) or a.dtype.kind not in "iu":
        raise ValueError(f"strict kernel: lens must be integers of shape ({rows},), got {a.dtype} {a.shape}")
    return a


class StrictKernels:
    """The four softmax kernels of ``minitensor.kernels`` on StrictArrays, and the GPU's dropout
    (the CPU's fused kernel: the CUDA one makes the same mask)."""

    def attention_row_size(self, dtype, d):
        """No streamed-attention kernel here: ``flash_attention`` runs its tiles of CuPy operators."""
        return None

    def dropout(self, x, seed, threshold, scale):
        from minitensor.kernels import fused

        a = numpy.ascontiguousarray(_unwrap(x, where="dropout"))
        return StrictArray(fused.dropout_forward(a, numpy.uint64(seed), numpy.uint64(threshold), a.dtype.type(scale)))

    @staticmethod
    def _impl():
        from minitensor.kernels import cpu

        return cpu

    def softmax_forward(self, x, lens=None):
        a = _device_rows(x, "softmax_forward")
        return StrictArray(self._impl().softmax_forward(a, _device_lens(lens, a.shape[0])))

    def softmax_backward(self, y, g):
        return StrictArray(
            self._impl().softmax_backward(_device_rows(y, "softmax_backward"), _device_rows(g, "softmax_backward"))
        )

    def log_softmax_forward(self, x, lens=None):
        a = _device_rows(x, "log_softmax_forward")
        return StrictArray(self._impl().log_softmax_forward(a, _device_lens(lens, a.shape[0])))

    def log_softmax_backward(self, y, g):
        return StrictArray(
            self._impl().log_softmax_backward(
                _device_rows(y, "log_softmax_backward"), _device_rows(g, "log_softmax_backward")
            )
        )


def _on_device_arrays(name):
    """The CPU's fused kernel ``name`` on StrictArrays: what the GPU backend's own kernel of that
    name computes (in place where the CPU's is: the unwrapped arrays are the device arrays)."""

    def run(self, *args):
        from minitensor.kernels import fused

        arrays = [numpy.ascontiguousarray(_unwrap(a, where=name)) if isinstance(a, StrictArray) else a for a in args]
        return _wrap(getattr(fused, name)(*arrays))

    run.__name__ = name
    return run


for _name in ("relu_forward", "relu_backward", "layer_norm_forward", "layer_norm_backward", "adam_update"):
    setattr(StrictKernels, _name, _on_device_arrays(_name))


class StrictBackend(Backend):
    """device "strict": NumPy underneath, CuPy's manners on top."""

    device = "strict"
    xp = strict_xp

    def __init__(self):
        self._rng = numpy.random.default_rng()
        self._kernels = StrictKernels()

    def array(self, data, dtype=None):
        if isinstance(data, StrictArray):
            return StrictArray(numpy.array(data._a, dtype=dtype))
        return StrictArray(numpy.array(data, dtype=dtype))

    def to_numpy(self, array):
        return array.get()

    def is_array(self, obj):
        return isinstance(obj, StrictArray)

    def seed(self, seed):
        self._rng = numpy.random.default_rng(seed)

    def normal(self, shape, dtype):
        return StrictArray(self._rng.standard_normal(shape, dtype=dtype))

    def random(self, shape, dtype):
        return StrictArray(self._rng.random(shape, dtype=dtype))

    def integers(self, low, high, shape):
        return StrictArray(self._rng.integers(low, high, shape, dtype=numpy.int64))

    def index_add(self, target, index, values):
        # cupyx.scatter_add(target, index, values) on a GPU
        numpy.add.at(_unwrap(target, where="index_add"), _index(index), _unwrap(values, where="index_add"))

    @property
    def kernels(self):
        return self._kernels
