"""Tensor: an array on a device, plus what autograd needs to differentiate through it.

A Tensor holds

- ``data``: the backend array (``numpy.ndarray`` on ``"cpu"``, ``cupy.ndarray`` on ``"cuda"``);
- ``requires_grad``: whether gradients should flow back to it;
- ``grad``: after ``backward()``, a Tensor with dL/d(this), for leaves (and ``retain_grad()``);
- ``_ctx``: the Function call that produced it (None for leaves), the link into the graph.

The arithmetic lives in ``minitensor/ops``, one Function per operation; the methods here
only forward to those, so ``x.exp()`` and ``mt.exp(x)`` are the same call.
"""

import itertools

import numpy

from . import grad_mode
from .backends import get_backend
from .dtypes import as_dtype
from .errors import DeviceError, DTypeError, GraphError

_creation_counter = itertools.count()


class Tensor:
    __slots__ = ("data", "grad", "requires_grad", "_ctx", "_backend", "_retain_grad", "_seq", "__weakref__")

    # NumPy must hand ``ndarray * tensor`` back to Tensor.__rmul__ instead of looping
    # over the tensor as if it were a sequence.
    __array_ufunc__ = None
    __array_priority__ = 1000

    def __init__(self, data, requires_grad=False, dtype=None, device=None):
        t = tensor(data, requires_grad=requires_grad, dtype=dtype, device=device)
        self.data, self.grad, self.requires_grad = t.data, None, t.requires_grad
        self._ctx, self._backend, self._retain_grad, self._seq = None, t._backend, False, t._seq

    @classmethod
    def _make(cls, data, backend, ctx):
        """The fast internal constructor used by every operation (no checks, no copies)."""
        if not data.shape:
            # NumPy turns 0-d results into NumPy scalars; keep tensors backed by arrays.
            data = backend.xp.asarray(data)
        t = object.__new__(cls)
        t.data = data
        t.grad = None
        t.requires_grad = ctx is not None
        t._ctx = ctx
        t._backend = backend
        t._retain_grad = False
        t._seq = next(_creation_counter)  # creation order = a topological order (autograd.backward)
        return t

    # -- what a tensor is ---------------------------------------------------------------
    @property
    def shape(self):
        return tuple(self.data.shape)

    @property
    def ndim(self):
        return self.data.ndim

    @property
    def dtype(self):
        return self.data.dtype

    @property
    def device(self):
        return self._backend.device

    @property
    def is_leaf(self):
        return self._ctx is None

    @property
    def grad_fn(self):
        """The Function that produced this tensor, or None for a leaf."""
        return self._ctx

    def size(self, axis=None):
        """The shape (PyTorch's ``x.size()``), or its length along ``axis``."""
        if axis is None:
            return self.shape
        from .ops.axes import normalize_axis

        return self.data.shape[normalize_axis(axis, self.data.ndim, "size")]

    def numel(self):
        return int(self.data.size)

    def __len__(self):
        if not self.data.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.data.shape[0]

    # -- leaving the graph, leaving the device --------------------------------------------
    def detach(self):
        """The same data, cut from the graph (no copy)."""
        return Tensor._make(self.data, self._backend, None)

    def numpy(self):
        """A NumPy copy of the data on the host (a copy even on the CPU: yours to modify)."""
        return self._backend.to_numpy(self.data)

    def item(self):
        """The value of a one-element tensor as a Python number."""
        if self.data.size != 1:
            raise ValueError(
                f"item(): the tensor has {self.data.size} elements (shape {self.shape}); item() needs exactly one"
            )
        return self.data.item()

    def tolist(self):
        return self.numpy().tolist()

    def __array__(self, dtype=None, copy=None):
        # np.asarray(t) works on the CPU, as in PyTorch; device data is never copied to
        # the host behind the user's back.
        if self.device != "cpu":
            raise TypeError(f"a tensor on {self.device!r} cannot turn into a NumPy array implicitly; call .numpy()")
        return self.data if dtype is None else self.data.astype(dtype)

    # -- DLPack: zero-copy exchange with NumPy, CuPy, PyTorch, JAX... ------------------------
    def __dlpack__(self, *args, **kwargs):
        """The data as a DLPack capsule (no copy); ``torch.from_dlpack(t)`` shares memory with ``t``.

        As in PyTorch, a tensor that requires grad is refused: the consumer would write
        behind autograd's back. ``mt.from_dlpack`` is the way in.
        """
        if self.requires_grad:
            raise RuntimeError("__dlpack__: cannot export a tensor that requires grad; export t.detach() instead")
        return self.data.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        """(device type, device id) as DLPack numbers them: (1, 0) for the CPU, (2, n) for CUDA GPU n."""
        return self.data.__dlpack_device__()

    def __float__(self):
        return float(self.item())

    def __int__(self):
        return int(self.item())

    def __bool__(self):
        if self.data.size != 1:
            raise ValueError(
                f"the truth value of a tensor with {self.data.size} elements is ambiguous; use .any() or .all()"
            )
        return bool(self.data.item())

    def to(self, target=None, dtype=None, device=None):
        """A copy on another device and/or with another dtype: ``x.to("cuda")``,
        ``x.to(mt.float64)``. Returns ``self`` when nothing changes. Differentiable."""
        from . import ops

        if target is not None:
            # A string names a device ("cpu", "cuda") unless it is a dtype name ("float64").
            if isinstance(target, str) and not _is_dtype_name(target):
                device = target
            else:
                dtype = target
        out = self
        if dtype is not None and as_dtype(dtype) != self.dtype:
            out = ops.astype(out, as_dtype(dtype))
        if device is not None and get_backend(device) is not self._backend:
            out = ops.to_device(out, get_backend(device))
        return out

    def float(self):
        return self.to(dtype="float32")

    def double(self):
        return self.to(dtype="float64")

    def long(self):
        return self.to(dtype="int64")

    def astype(self, dtype):
        return self.to(dtype=dtype)

    def cpu(self):
        return self.to(device="cpu")

    # -- autograd -------------------------------------------------------------------------
    def backward(self, grad=None, retain_graph=False):
        """Compute d(self)/d(leaf) for every leaf of the graph and add it to ``leaf.grad``.

        ``self`` must be a scalar unless ``grad`` (dL/dself, same shape) is given. The graph
        is freed afterwards unless ``retain_graph=True``.
        """
        from .autograd import backward

        backward(self, grad, retain_graph)

    def requires_grad_(self, requires_grad=True):
        if requires_grad and self.data.dtype.kind != "f":
            raise DTypeError(
                f"requires_grad: only floating-point tensors can require gradients, this one "
                f"is {self.data.dtype}; convert it first with .float() or .double()"
            )
        if not self.is_leaf and not requires_grad:
            raise GraphError("requires_grad_(False) on a non-leaf tensor: use .detach() instead")
        self.requires_grad = requires_grad
        return self

    def retain_grad(self):
        """Keep ``.grad`` for this non-leaf tensor too after backward."""
        self._retain_grad = True
        return self

    # -- in-place updates (optimisers, initialisation): only outside the graph -------------
    def _check_inplace(self, name):
        if self.requires_grad and grad_mode._enabled:
            raise GraphError(
                f"{name}: in-place update of a tensor that requires grad; values saved for "
                "backward would silently change. Do it inside `with mt.no_grad():` (as "
                "optimisers do), or use the out-of-place form"
            )

    def _value(self, other):
        if isinstance(other, Tensor):
            if other._backend is not self._backend:
                raise DeviceError(
                    f"in-place update: a tensor on {self.device!r} cannot take values from one on "
                    f"{other.device!r}; move them with .to({self.device!r}) first"
                )
            return other.data
        return other

    def copy_(self, other):
        """Overwrite the values with ``other``'s (broadcast to this shape)."""
        self._check_inplace("copy_")
        self.data[...] = self._value(other)
        return self

    def zero_(self):
        self._check_inplace("zero_")
        self.data[...] = 0
        return self

    def fill_(self, value):
        self._check_inplace("fill_")
        self.data[...] = value
        return self

    def add_(self, other, alpha=1.0):
        """self += alpha * other, in place."""
        self._check_inplace("add_")
        other = self._value(other)
        self.data += other if alpha == 1.0 else alpha * other
        return self

    def mul_(self, other):
        self._check_inplace("mul_")
        self.data *= self._value(other)
        return self

    def __setitem__(self, index, value):
        self._check_inplace("__setitem__")
        from .ops.indexing import normalize_index

        self.data[normalize_index(index, self)] = self._value(value)

    # -- printing ---------------------------------------------------------------------------
    def __repr__(self):
        body = numpy.array2string(
            self.numpy(), precision=4, threshold=20, edgeitems=2, separator=", ", prefix="tensor("
        )
        extras = []
        if self.dtype.kind == "f" and self.dtype != numpy.float32:
            extras.append(f"dtype={self.dtype}")
        if self.device != "cpu":
            extras.append(f"device={self.device!r}")
        if self._ctx is not None:
            extras.append(f"grad_fn={type(self._ctx).__name__}")
        elif self.requires_grad:
            extras.append("requires_grad=True")
        if self.data.size > 20:
            extras.insert(0, f"shape={self.shape}")
        return "tensor(" + body + "".join(", " + e for e in extras) + ")"

    __hash__ = object.__hash__  # == is elementwise (as in PyTorch), identity hashing stays


def _is_dtype_name(name):
    try:
        numpy.dtype(name)
        return True
    except TypeError:
        return False


def tensor(data, requires_grad=False, dtype=None, device=None):
    """A new leaf tensor holding a copy of ``data``.

    ``data``: a number, nested lists, a NumPy array or a Tensor. Floating-point Python data
    becomes float32 (the default), integers int64, booleans bool; a NumPy array keeps its
    dtype unless ``dtype`` says otherwise (as in PyTorch).
    """
    if isinstance(data, Tensor):
        backend = get_backend(device) if device is not None else data._backend
        if backend is data._backend:
            arr = data.data.copy()
        else:
            arr = backend.array(data.numpy())
    else:
        backend = get_backend("cpu" if device is None else device)
        if backend.is_array(data):
            arr = data.copy()
        else:
            host = numpy.asarray(data)
            if dtype is None and not isinstance(data, numpy.ndarray) and host.dtype.kind == "f":
                host = host.astype(numpy.float32)
            arr = backend.array(host)
    dtype = as_dtype(dtype)
    if dtype is not None and arr.dtype != dtype:
        arr = arr.astype(dtype)
    if arr.dtype.kind not in "fiub":
        raise TypeError(f"tensor: unsupported data of dtype {arr.dtype} (numbers or booleans expected)")
    t = Tensor._make(arr, backend, None)
    if requires_grad:
        t.requires_grad_(True)
    return t
