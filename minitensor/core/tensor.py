"""Tensor: an array on a device, plus what autograd needs to differentiate through it.

A Tensor holds

- ``data``: the backend array (``numpy.ndarray`` on ``"cpu"``, ``cupy.ndarray`` on ``"cuda"``);
- ``requires_grad``: whether gradients should flow back to it;
- ``grad``: after ``backward()``, a Tensor with dL/d(this), for leaves (and ``retain_grad()``);
- ``_ctx``: the Function call that produced it (None for leaves), the link into the graph.

The arithmetic lives in ``minitensor/core/ops``, one Function per operation; the operators and
methods here are one line each that calls it: ``x * y`` is ``Mul.apply(x, y)``, ``x.exp()``
and ``mt.exp(x)`` are the same call.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy

from . import _printing, grad_mode
from .backends import Backend, get_backend
from .dtypes import as_dtype, is_dtype_name, is_floating
from .errors import DeviceError, DTypeError, GraphError, ShapeError

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self, from Python 3.11 on

_creation_counter = itertools.count()

# The names the annotations use (the engine's other modules import them from here):
#: a backend array, ``numpy.ndarray`` on "cpu" or ``cupy.ndarray`` on "cuda" (Any: the two share no type)
Array = Any
#: a shape: ``2`` or ``(2, 3)``; the functions taking ``*shape`` also take the ints one by one
Shape = int | Sequence[int]
#: an axis or several: ``-1``, ``(0, 2)``
Axes = int | Sequence[int]
#: where a tensor lives: a device name ("cpu", "cuda") or a Backend; None where it means the default (the CPU)
Device = str | Backend | None
#: a dtype: ``mt.float32``, ``"float32"``, a NumPy dtype; None for the function's default
DType = Any
#: a Python number; inside class Tensor ``float`` names the method ``x.float()``, hence this name
Number = int | float


class Tensor:
    """An n-dimensional array on a device, plus what autograd needs to differentiate through it.

    ``Tensor(data, requires_grad=False, dtype=None, device=None)`` is ``mt.tensor(data, ...)``:
    a new leaf holding a copy of ``data``; tensors also come from the creation functions
    (``mt.zeros``, ``mt.randn``, ...) and from every operation. A tensor holds

    - ``data``: the backend array, ``numpy.ndarray`` on ``"cpu"``, ``cupy.ndarray`` on ``"cuda"``;
    - ``requires_grad``: whether gradients flow back to it;
    - ``grad``: after ``backward()``, a Tensor holding dL/d(this tensor), for leaves (and for
      tensors that called ``retain_grad()``);
    - ``grad_fn``: the Function call that produced it (None for a leaf), its link into the graph.

    The operators ``+ - * / ** @``, unary ``-`` and indexing ``x[...]`` record operations in the
    graph; so do the methods named after ops, one line each that calls the op: ``x.exp()`` is
    ``mt.exp(x)``, ``x.sum(axis)`` is ``mt.sum(x, axis)``. Python numbers are constants that keep
    the tensor's dtype (``x * 2`` stays float32). Comparisons (``==``, ``<``, ...), ``& | ^ ~``,
    ``any`` and ``all`` give bool tensors outside the graph. Methods ending in ``_`` change the
    tensor in place and are refused (``GraphError``) on a tensor that requires grad unless grad
    mode is off (``mt.no_grad()``), since values saved for backward would silently change. A
    write ``x[index] = v`` in the graph is recorded instead (``ops.setitem``, out of place).

    D2L 2.1 (data manipulation) and 2.5 (automatic differentiation).
    """

    __slots__ = ("data", "_grad", "requires_grad", "_ctx", "_backend", "_retain_grad", "_seq", "__weakref__")

    # NumPy must hand ``ndarray * tensor`` back to Tensor.__rmul__ instead of looping
    # over the tensor as if it were a sequence.
    __array_ufunc__ = None
    __array_priority__ = 1000

    data: Array
    _grad: Tensor | None
    requires_grad: bool
    _ctx: autograd.Function | None
    _backend: Backend
    _retain_grad: bool
    _seq: int

    def __init__(self, data: Any, requires_grad: bool = False, dtype: DType = None, device: Device = None) -> None:
        t = tensor(data, requires_grad=requires_grad, dtype=dtype, device=device)
        self.data, self._grad, self.requires_grad = t.data, None, t.requires_grad
        self._ctx, self._backend, self._retain_grad, self._seq = None, t._backend, False, t._seq

    @classmethod
    def _make(cls, data: Array, backend: Backend, ctx: autograd.Function | None) -> Self:
        """The fast internal constructor used by every operation (no checks, no copies)."""
        if data.ndim == 0:
            # NumPy turns 0-d results into NumPy scalars; keep tensors backed by arrays.
            data = backend.xp.asarray(data)
        t = object.__new__(cls)
        t.data = data
        t._grad = None
        t.requires_grad = ctx is not None
        t._ctx = ctx
        t._backend = backend
        t._retain_grad = False
        t._seq = next(_creation_counter)  # creation order = a topological order (autograd.backward)
        return t

    # -- what a tensor is ---------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        """The length of every axis, a tuple of ints: ``(batch_size, num_steps, num_hiddens)`` for a
        batch of sequences of feature vectors, ``()`` for a 0-d tensor."""
        return tuple(self.data.shape)

    @property
    def ndim(self) -> int:
        """The number of axes, ``len(x.shape)`` (0 for a 0-d tensor, a single number)."""
        return self.data.ndim

    @property
    def dtype(self) -> numpy.dtype:
        """The element type, a NumPy dtype: ``mt.float32`` (the default for floating-point data),
        ``mt.float64``, ``mt.int64`` (indices, labels), ``mt.bool``, ..."""
        return self.data.dtype

    @property
    def device(self) -> str:
        """Where the data lives: the device name of the tensor's backend, ``"cpu"`` (NumPy) or
        ``"cuda"`` (CuPy). Operands of one operation must share it."""
        return self._backend.device

    @property
    def is_leaf(self) -> bool:
        """True when no recorded operation produced this tensor (it was created, or computed with
        grad mode off): backward stops here and stores ``.grad`` on leaves that require grad."""
        return self._ctx is None

    @property
    def grad(self) -> Tensor | None:
        """dL/d(this tensor) after ``backward()``, for leaves that require grad (and tensors that
        called ``retain_grad()``): a Tensor of this tensor's shape, dtype and device, or None.
        A second backward adds into it, in place (``optimizer.zero_grad()`` clears it)."""
        return self._grad

    @grad.setter
    def grad(self, value: Tensor | None) -> None:
        # Checked as in PyTorch: an optimiser's fused kernel walks the gradient element by
        # element beside the parameter, and one of another shape would send it past the end.
        if value is not None:
            if not isinstance(value, Tensor):
                raise TypeError(f"grad: can only be a Tensor or None, not {type(value).__name__}")
            if value.shape != self.shape or value.dtype != self.dtype or value._backend is not self._backend:
                error: type[Exception] = DeviceError if value._backend is not self._backend else ShapeError
                if value.dtype != self.dtype:
                    error = DTypeError
                raise error(
                    f"grad: a gradient ({value.dtype}, shape {value.shape}, on {value.device!r}) for a "
                    f"tensor ({self.dtype}, shape {self.shape}, on {self.device!r}); the two must "
                    "match in shape, dtype and device"
                )
        self._grad = value

    @property
    def grad_fn(self) -> autograd.Function | None:
        """The Function that produced this tensor, or None for a leaf."""
        return self._ctx

    def size(self, axis: int | None = None) -> tuple[int, ...] | int:
        """The shape (PyTorch's ``x.size()``), or its length along ``axis``."""
        if axis is None:
            return self.shape
        return self.shape[normalize_axis(axis, self.data.ndim, "size")]  # (shape: a traced length under mt.onnx)

    def dim(self) -> int:
        """PyTorch's ``x.dim()``: the number of axes, ``ndim``."""
        return self.data.ndim

    def numel(self) -> int:
        """The number of elements, the product of ``shape`` (1 for a 0-d tensor), as a Python int."""
        return int(self.data.size)

    def is_floating_point(self) -> bool:
        """PyTorch's ``x.is_floating_point()``: True for float16, bfloat16, float32 and float64
        data, the dtypes a gradient can flow through."""
        return is_floating(self.data.dtype)

    def contiguous(self) -> Tensor:
        """PyTorch's ``x.contiguous()``: ``x`` itself when its elements lie in memory row by row
        (C order), else a copy that does, the gradient passing through. The ops take any
        layout, so it is about speed: a product reads a row-by-row operand fastest."""
        if self.data.flags.c_contiguous:
            return self
        return ops.shape.Clone.apply(self)

    def __len__(self) -> int:
        if not self.data.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.data.shape[0]

    def __iter__(self) -> Any:
        """``for row in x``: ``x[0]``, ``x[1]``, ... along the first axis, as in PyTorch (D2L's
        decoders loop over time steps this way)."""
        if not self.data.shape:
            raise TypeError("iteration over a 0-d tensor")
        return (self[i] for i in range(self.data.shape[0]))

    # -- leaving the graph, leaving the device --------------------------------------------
    def detach(self) -> Tensor:
        """The same data, cut from the graph (no copy)."""
        return Tensor._make(self.data, self._backend, None)

    def clone(self) -> Tensor:
        """A copy of the data that stays in the graph: the gradient passes back to ``x``
        (``x.clone().detach()``, PyTorch's idiom, is a copy cut from it)."""
        return ops.shape.Clone.apply(self)

    # The reads from the device below (and .to("cpu")) are where the host waits for the device
    # anyway: there the checks the ops left on the device are made (Backend.check), first.
    def numpy(self) -> numpy.ndarray:
        """A NumPy copy of the data on the host (a copy even on the CPU: yours to modify)."""
        self._backend.raise_failed_checks()
        return self._backend.to_numpy(self.data)

    def item(self) -> float | int | bool:
        """The value of a one-element tensor as a Python number."""
        if self.data.size != 1:
            raise ValueError(
                f"item(): the tensor has {self.data.size} elements (shape {self.shape}); item() needs exactly one"
            )
        self._backend.raise_failed_checks()
        return self.data.item()

    def tolist(self) -> Any:
        """The values as nested Python lists (a plain number for a 0-d tensor), copied to the host."""
        return self.numpy().tolist()

    def __array__(self, dtype: DType = None, copy: bool | None = None) -> Array:
        # np.asarray(t) works on the CPU, as in PyTorch; device data is never copied to
        # the host behind the user's back.
        if self.device != "cpu":
            raise TypeError(f"a tensor on {self.device!r} cannot turn into a NumPy array implicitly; call .numpy()")
        return self.data if dtype is None else self.data.astype(dtype)

    # -- DLPack: zero-copy exchange with NumPy, CuPy, PyTorch, JAX... ------------------------
    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        """The data as a DLPack capsule (no copy); ``torch.from_dlpack(t)`` shares memory with ``t``.

        As in PyTorch, a tensor that requires grad is refused: the consumer would write
        behind autograd's back. ``mt.from_dlpack`` is the way in.
        """
        if self.requires_grad:
            raise RuntimeError("__dlpack__: cannot export a tensor that requires grad; export t.detach() instead")
        return self.data.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        """(device type, device id) as DLPack numbers them: (1, 0) for the CPU, (2, n) for CUDA GPU n."""
        return self.data.__dlpack_device__()

    def __format__(self, spec: str) -> str:
        """``f"{loss:.4f}"``: a 0-d tensor formats as its number, as in PyTorch."""
        if self.data.ndim == 0 and spec:
            return format(self.item(), spec)
        return super().__format__(spec)

    def __float__(self) -> float:
        return float(self.item())

    def __int__(self) -> int:
        return int(self.item())

    def __index__(self) -> int:
        """An integer tensor of one element where Python wants an index (``data[i : i + 8]``,
        ``range(n)``), as in PyTorch: a read, like ``int(x)``."""
        if self.data.dtype.kind not in "iu" or self.data.size != 1:
            raise TypeError(
                f"only an integer tensor of one element can be an index, not one of shape {self.shape} and {self.dtype}"
            )
        return int(self.item())

    def __bool__(self) -> bool:
        if self.data.size != 1:
            raise ValueError(
                f"the truth value of a tensor with {self.data.size} elements is ambiguous; use .any() or .all()"
            )
        self._backend.raise_failed_checks()
        return bool(self.data.item())

    def to(self, target: Device | DType = None, dtype: DType = None, device: Device = None) -> Tensor:
        """A copy on another device and/or with another dtype: ``x.to("cuda")``,
        ``x.to(mt.float64)``. Returns ``self`` when nothing changes. Differentiable."""
        if target is not None:
            # A string names a device ("cpu", "cuda") unless it is a dtype name ("float64").
            if isinstance(target, str) and not is_dtype_name(target):
                device = target
            else:
                dtype = target
        out, dtype = self, as_dtype(dtype, "to")
        if dtype is not None and dtype != self.dtype:
            out = ops.astype(out, dtype)
        if device is not None and get_backend(device) is not self._backend:
            out = ops.to_device(out, get_backend(device))
        return out

    def float(self) -> Tensor:
        """``x.to(mt.float32)``: a float32 copy (``x`` itself if it is float32 already); differentiable."""
        return self.to(dtype="float32")

    def double(self) -> Tensor:
        """``x.to(mt.float64)``: a float64 copy (``x`` itself if it is float64 already); what
        ``mt.gradcheck`` needs."""
        return self.to(dtype="float64")

    def half(self) -> Tensor:
        """``x.to(mt.float16)``: a float16 copy (``x`` itself if it is float16 already); differentiable."""
        return self.to(dtype="float16")

    def bfloat16(self) -> Tensor:
        """``x.to(mt.bfloat16)``: a bfloat16 copy (``x`` itself if it is bfloat16 already);
        differentiable, the gradient turned back into x's dtype. ``mt.autocast`` makes these."""
        return self.to(dtype="bfloat16")

    def long(self) -> Tensor:
        """``x.to(mt.int64)``: an int64 copy (``x`` itself if it is int64 already), the dtype of token
        indices and class labels."""
        return self.to(dtype="int64")

    def type_as(self, other: Tensor) -> Tensor:
        """``x.to(other.dtype)``: a copy with ``other``'s dtype (``x`` itself if it has it already);
        differentiable between float dtypes."""
        return self.to(dtype=other.dtype)

    def type(self, dtype: DType = None) -> Tensor | str:
        """PyTorch's ``x.type(mt.bool)``: ``x.to(dtype=dtype)``; with no dtype, the name of this
        one (``"minitensor.float32"``, where PyTorch says ``"torch.FloatTensor"``)."""
        if dtype is None:
            return f"minitensor.{self.dtype}"
        return self.to(dtype=dtype)

    def astype(self, dtype: DType) -> Tensor:
        """``x.to(dtype=dtype)``: a copy with another dtype (``x`` itself when nothing changes),
        NumPy's name for it; differentiable (the gradient is converted back)."""
        return self.to(dtype=dtype)

    def cpu(self) -> Tensor:
        """``x.to("cpu")``: a copy in host memory (``x`` itself if it is there already);
        differentiable, the gradient goes back to the original device."""
        return self.to(device="cpu")

    def cuda(self) -> Tensor:
        """``x.to("cuda")``: a copy on the GPU (``x`` itself if it is there already);
        differentiable. A ``DeviceError`` says what is missing where CUDA is not available."""
        return self.to(device="cuda")

    # -- autograd -------------------------------------------------------------------------
    def backward(self, grad: Tensor | Array | None = None, retain_graph: bool = False) -> None:
        """Compute d(self)/d(leaf) for every leaf of the graph and add it to ``leaf.grad``.

        ``self`` must be a scalar unless ``grad`` (dL/dself, same shape) is given. The graph
        is freed afterwards unless ``retain_graph=True``.
        """
        autograd.backward(self, grad, retain_graph)

    def requires_grad_(self, requires_grad: bool = True) -> Self:
        """Start (or, with ``False``, stop) recording operations on this tensor for backward, in
        place; returns ``self``.

        Only floating-point tensors can require gradients (``DTypeError`` otherwise: convert with
        ``.float()`` first); a non-leaf cannot stop (``GraphError``: use ``detach()``).
        """
        if requires_grad and not is_floating(self.data.dtype):
            raise DTypeError(
                f"requires_grad: only floating-point tensors can require gradients, this one "
                f"is {self.data.dtype}; convert it first with .float() or .double()"
            )
        if not self.is_leaf and not requires_grad:
            raise GraphError("requires_grad_(False) on a non-leaf tensor: use .detach() instead")
        self.requires_grad = requires_grad
        return self

    def retain_grad(self) -> Self:
        """Keep ``.grad`` for this non-leaf tensor too after backward."""
        self._retain_grad = True
        return self

    # -- in-place updates (optimisers, initialisation): outside the graph; x[i] = v in it too ----
    def _check_inplace(self, name: str) -> None:
        if self.requires_grad and grad_mode._enabled:
            raise GraphError(
                f"{name}: in-place update of a tensor that requires grad; values saved for "
                "backward would silently change. Do it inside `with mt.no_grad():` (as "
                "optimisers do), or use the out-of-place form"
            )

    def _value(self, other: Tensor | Array, name: str = "in-place update") -> Array:
        if isinstance(other, Tensor):
            if other._backend is not self._backend:
                raise DeviceError(
                    f"{name}: a tensor on {self.device!r} cannot take values from one on "
                    f"{other.device!r}; move them with .to({self.device!r}) first"
                )
            return other.data
        return other

    def _operand(self, name: str, other: Any) -> Any:
        """The array or number an in-place update takes: a tensor, a number or an array of this
        device, as PyTorch takes a tensor or a number (a list is refused, not repeated)."""
        if isinstance(other, (Tensor, int, float, numpy.generic)) or self._backend.is_array(other):
            return self._value(other, name)
        raise TypeError(
            f"{name}: takes a tensor or a number, not a {type(other).__name__}; make it one: mt.tensor(...)"
        )

    def _write(self, name: str, ufunc: str, other: Tensor | Number | Array) -> Self:
        """self = self <ufunc> other in self's own array (``ufunc``: NumPy's name, "add",
        "multiply"...), as ``add_``, ``x += y`` and the others do outside the graph. As in
        PyTorch, the result must fit self's dtype: ``int_tensor += 0.5`` is refused, not rounded."""
        value = self._operand(name, other)
        dtype = self.data.dtype
        if not (dtype.kind == "f" and (type(value) is float or getattr(value, "dtype", None) == dtype)):
            _check_fits(name, ufunc, dtype, value, self.shape)  # (a float tensor taking its own dtype or a float fits)
        try:
            getattr(self._backend.xp, ufunc)(self.data, value, out=self.data, casting="unsafe")
        except ValueError as e:
            shape = getattr(value, "shape", ())
            raise ShapeError(
                f"{name}: a value of shape {tuple(shape)} does not broadcast to the tensor's shape "
                f"{self.shape}, which an in-place update keeps ({e})"
            ) from None
        autograd.writes.note(self)
        return self

    def copy_(self, other: Tensor | Array) -> Self:
        """Overwrite the values with ``other``'s (broadcast to this shape)."""
        self._check_inplace("copy_")
        value = self._value(other, "copy_")
        try:
            self.data[...] = value
        except ValueError as e:
            raise ShapeError(
                f"copy_: values of shape {tuple(getattr(value, 'shape', ()))} do not broadcast to the "
                f"tensor's shape {self.shape} ({e})"
            ) from None
        autograd.writes.note(self)
        return self

    def zero_(self) -> Self:
        """Set every element to 0, in place; returns ``self``.

        Refused (``GraphError``) on a tensor that requires grad while grad mode is on: do it inside
        ``with mt.no_grad():``, as optimisers and initialisers do.
        """
        self._check_inplace("zero_")
        self.data[...] = 0
        autograd.writes.note(self)
        return self

    def fill_(self, value: Number) -> Self:
        """Set every element to ``value`` (a number), in place; returns ``self``. The rule of
        ``zero_``: not on a tensor that requires grad unless grad mode is off."""
        self._check_inplace("fill_")
        self.data[...] = value
        autograd.writes.note(self)
        return self

    def add_(self, other: Tensor | Number, alpha: Number = 1.0) -> Self:
        """self += alpha * other, in place; returns ``self``. The rule of ``zero_``: not on a
        tensor that requires grad unless grad mode is off."""
        self._check_inplace("add_")
        if alpha != 1.0:
            other = alpha * self._operand("add_", other)
        return self._write("add_", "add", other)

    def sub_(self, other: Tensor | Number, alpha: Number = 1.0) -> Self:
        """self -= alpha * other, in place; returns ``self``. The rule of ``zero_``."""
        self._check_inplace("sub_")
        if alpha != 1.0:
            other = alpha * self._operand("sub_", other)
        return self._write("sub_", "subtract", other)

    def mul_(self, other: Tensor | Number) -> Self:
        """self *= other, in place: ``other`` a number or a tensor on the same device, broadcast to
        this shape; returns ``self``. The rule of ``zero_``: not on a tensor that requires grad
        unless grad mode is off."""
        self._check_inplace("mul_")
        return self._write("mul_", "multiply", other)

    def div_(self, other: Tensor | Number) -> Self:
        """self /= other, in place; returns ``self``. The rule of ``zero_``."""
        self._check_inplace("div_")
        return self._write("div_", "true_divide", other)

    # ``x -= lr * x.grad`` (D2L 3.4's ``sgd``, under no_grad): Python calls ``x.__isub__(...)`` and
    # binds the name to what it returns. Outside the graph that is x itself, changed in place, as
    # in PyTorch. In the graph it is a new tensor, ``x - y``: the name moves to it, while other
    # names for the old x keep the old value (PyTorch would change that tensor in place and
    # rewrite its history; here only ``x[i] = v`` does that).
    def _update(self, name: str, ufunc: str, out_of_place: Any, other: Tensor | Number) -> Tensor:
        if grad_mode._enabled and (self.requires_grad or (isinstance(other, Tensor) and other.requires_grad)):
            if self.requires_grad and self._ctx is None:
                raise GraphError(
                    f"{name}: in-place update of a leaf tensor that requires grad (a parameter, or an "
                    "input created with requires_grad=True); update it inside `with mt.no_grad():`, "
                    "as D2L's sgd and the optimisers do"
                )
            return out_of_place(self, other)  # type: ignore[no-any-return]
        return self._write(name, ufunc, other)

    def __iadd__(self, other: Tensor | Number) -> Tensor:
        return self._update("+=", "add", Tensor.__add__, other)

    def __isub__(self, other: Tensor | Number) -> Tensor:
        return self._update("-=", "subtract", Tensor.__sub__, other)

    def __imul__(self, other: Tensor | Number) -> Tensor:
        return self._update("*=", "multiply", Tensor.__mul__, other)

    def __itruediv__(self, other: Tensor | Number) -> Tensor:
        return self._update("/=", "true_divide", Tensor.__truediv__, other)

    def __setitem__(self, index: Any, value: Tensor | Array | Number) -> None:
        """``x[index] = value``. Outside the graph, the values are written in place. In the graph
        (x or value requires grad, grad mode on), as in PyTorch: D2L's ``X[~mask] = -1e6`` on
        scores, ``P[:, 0::2] = sin(...)``. x then stands for the new value (``ops.setitem``, out
        of place, so what earlier ops saved keeps its values), and the ops that used x before the
        write still get the gradient of the value they used (``autograd.backward`` follows the
        write's link). Unlike PyTorch's, such a write does not reach through views: x gets a new
        array -- or keeps its own, written in place, where nothing else can see it
        (``autograd.sole_holder``; ``outputs[t] = y`` in a loop). A leaf that requires grad is
        refused: write to it under no_grad()."""
        if grad_mode._enabled and (self.requires_grad or (isinstance(value, Tensor) and value.requires_grad)):
            if self.requires_grad and self._ctx is None:
                raise GraphError(
                    "__setitem__: in-place write to a leaf tensor that requires grad (a parameter or an "
                    "input created with requires_grad=True); do it inside `with mt.no_grad():` (as "
                    "initialisers do), or write to a copy: y = x.clone(); y[...] = v"
                )
            in_place = value is not self and autograd.sole_holder(self)
            before = Tensor._make(self.data, self._backend, self._ctx)  # the value x had, in the graph
            before._seq = self._seq  # (where the ops that used x find it in backward's order)
            if value is self:  # x[index] = x writes the value x had (x itself is about to be the new one)
                value = before
            after = setitem(before, index, value, in_place=in_place)
            self.data, self._ctx, self._seq, self.requires_grad = after.data, after._ctx, after._seq, True
            # ``before`` keeps its place in the graph and its shape, not its array: no backward
            # reads that (the write's needs only the index); held, it would keep every earlier
            # value of x alive until backward, or, written in place, make the next write copy.
            xp = self._backend.xp
            before.data = xp.broadcast_to(xp.empty((), dtype=self.data.dtype), self.data.shape)
            return
        index = normalize_index(index, self)
        value = self._value(value, "__setitem__")
        try:
            self.data[index] = value
        except ValueError as e:
            raise ShapeError(
                f"__setitem__: values of shape {tuple(getattr(value, 'shape', ()))} do not fit "
                f"x[index] of a tensor of shape {self.shape} ({e})"
            ) from None
        autograd.writes.note(self)

    # -- arithmetic: ``x * y`` is ``Mul.apply(x, y)`` (ops/elementwise.py) -------------------------
    # ``2 * x``: int.__mul__ does not know Tensors, so Python calls ``x.__rmul__(2)``.
    def __add__(self, other: Tensor | Number) -> Tensor:
        return _binary(Add, self, other)

    def __radd__(self, other: Number) -> Tensor:
        return _reflected(Add, self, other)

    def __sub__(self, other: Tensor | Number) -> Tensor:
        return _binary(Sub, self, other)

    def __rsub__(self, other: Number) -> Tensor:
        return _reflected(Sub, self, other)

    def __mul__(self, other: Tensor | Number) -> Tensor:
        return _binary(Mul, self, other)

    def __rmul__(self, other: Number) -> Tensor:
        return _reflected(Mul, self, other)

    def __truediv__(self, other: Tensor | Number) -> Tensor:
        if is_floating(self.data.dtype):
            return _binary(Div, self, other)
        return ops.div(self, other)  # integers divided give float32 (true division, as in PyTorch)

    def __rtruediv__(self, other: Number) -> Tensor:
        return ops.div(other, self)

    def __pow__(self, other: Tensor | Number) -> Tensor:
        return _binary(Pow, self, other)

    def __rpow__(self, other: Number) -> Tensor:
        return _reflected(Pow, self, other)

    def __floordiv__(self, other: Tensor | Number) -> Tensor:
        return _binary(FloorDivide, self, other)

    def __rfloordiv__(self, other: Number) -> Tensor:
        return _reflected(FloorDivide, self, other)

    def __mod__(self, other: Tensor | Number) -> Tensor:
        return _binary(Remainder, self, other)

    def __rmod__(self, other: Number) -> Tensor:
        return _reflected(Remainder, self, other)

    def __matmul__(self, other: Tensor) -> Tensor:
        return ops.matmul(self, other)  # (through mt.autocast's rule for products)

    def __rmatmul__(self, other: Array) -> Tensor:
        return ops.matmul(other, self)

    def __pos__(self) -> Tensor:
        return self

    def __abs__(self) -> Tensor:
        return ops.abs(self)

    def __neg__(self) -> Tensor:
        return Neg.apply(self)

    def __getitem__(self, index: Any) -> Tensor:
        return ops.getitem(self, index)

    # the same as named methods, as in PyTorch: x.add(y), x.matmul(w)
    def add(self, other: Tensor | Number) -> Tensor:
        """``x.add(y)`` is ``x + y`` (``mt.add``): the elementwise sum, with broadcasting."""
        return _binary(Add, self, other)

    def sub(self, other: Tensor | Number) -> Tensor:
        """``x.sub(y)`` is ``x - y`` (``mt.sub``): the elementwise difference, with broadcasting."""
        return _binary(Sub, self, other)

    def mul(self, other: Tensor | Number) -> Tensor:
        """``x.mul(y)`` is ``x * y`` (``mt.mul``): the elementwise product, with broadcasting."""
        return _binary(Mul, self, other)

    def div(self, other: Tensor | Number) -> Tensor:
        """``x.div(y)`` is ``x / y`` (``mt.div``): the elementwise quotient, with broadcasting."""
        return self / other

    def pow(self, other: Tensor | Number) -> Tensor:
        """``x.pow(p)`` is ``x ** p`` (``mt.pow``): the elementwise power; ``p`` a number or a tensor."""
        return _binary(Pow, self, other)

    def floor_divide(self, other: Tensor | Number) -> Tensor:
        """``x.floor_divide(y)`` is ``x // y`` (``mt.floor_divide``): rounded toward minus infinity."""
        return _binary(FloorDivide, self, other)

    def remainder(self, other: Tensor | Number) -> Tensor:
        """``x.remainder(y)`` is ``x % y`` (``mt.remainder``): with the sign of ``y``, as Python's ``%``."""
        return _binary(Remainder, self, other)

    def matmul(self, other: Tensor) -> Tensor:
        """``x.matmul(y)`` is ``x @ y`` (``mt.matmul``): the matrix product, batched over leading axes
        by NumPy's rules."""
        return ops.matmul(self, other)

    # -- comparisons and logic: bool tensors outside the graph (no useful derivative) -----------
    def __eq__(self, other: object) -> Tensor:  # type: ignore[override]  # elementwise, not a bool (as in PyTorch)
        return _binary(Equal, self, other)

    def __ne__(self, other: object) -> Tensor:  # type: ignore[override]  # elementwise, as __eq__
        return _binary(NotEqual, self, other)

    def __lt__(self, other: Tensor | Number) -> Tensor:
        return _binary(Less, self, other)

    def __le__(self, other: Tensor | Number) -> Tensor:
        return _binary(LessEqual, self, other)

    def __gt__(self, other: Tensor | Number) -> Tensor:
        return _binary(Greater, self, other)

    def __ge__(self, other: Tensor | Number) -> Tensor:
        return _binary(GreaterEqual, self, other)

    __hash__ = object.__hash__  # == is elementwise (as in PyTorch), identity hashing stays

    def __and__(self, other: Tensor | bool) -> Tensor:
        return And.apply(self, other)

    def __or__(self, other: Tensor | bool) -> Tensor:
        return Or.apply(self, other)

    def __xor__(self, other: Tensor | bool) -> Tensor:
        return Xor.apply(self, other)

    def __invert__(self) -> Tensor:
        return Invert.apply(self)

    def any(self, axis: Axes | None = None) -> Tensor:
        """Whether any element is true (nonzero), over all or along ``axis``: a bool tensor."""
        if axis is not None:
            axis = normalize_axes(axis, self.ndim, "any")
        return AnyTrue.apply(self, axis=axis)

    def all(self, axis: Axes | None = None) -> Tensor:
        """Whether every element is true (nonzero), over all or along ``axis``: a bool tensor."""
        if axis is not None:
            axis = normalize_axes(axis, self.ndim, "all")
        return AllTrue.apply(self, axis=axis)

    # -- the ops as methods: ``x.exp()`` is ``mt.exp(x)``, same parameters ------------------------
    def neg(self) -> Tensor:
        """``x.neg()`` is ``-x`` (``mt.neg``): every element with its sign flipped."""
        return Neg.apply(self)

    def exp(self) -> Tensor:
        """``mt.exp(x)``: e^x elementwise; its derivative is the output itself."""
        return ops.exp(self)

    def log(self) -> Tensor:
        """``mt.log(x)``: the natural logarithm ln x elementwise; derivative 1/x."""
        return ops.log(self)

    def sqrt(self) -> Tensor:
        """``mt.sqrt(x)``: the square root elementwise; derivative 1 / (2 sqrt(x))."""
        return ops.sqrt(self)

    def tanh(self) -> Tensor:
        """``mt.tanh(x)``: the hyperbolic tangent elementwise, in (-1, 1); derivative 1 - tanh(x)^2."""
        return ops.tanh(self)

    def sin(self) -> Tensor:
        """``mt.sin(x)``: the sine elementwise (radians); derivative cos x."""
        return ops.sin(self)

    def cos(self) -> Tensor:
        """``mt.cos(x)``: the cosine elementwise (radians); derivative -sin x."""
        return ops.cos(self)

    def sigmoid(self) -> Tensor:
        """``mt.sigmoid(x)``: 1 / (1 + exp(-x)) elementwise, in (0, 1); derivative s (1 - s)."""
        return ops.sigmoid(self)

    def relu(self) -> Tensor:
        """``mt.relu(x)``: max(x, 0) elementwise; derivative 1 where x > 0, else 0."""
        return ReLU.apply(self)

    def gelu(self, approximate: str = "none") -> Tensor:
        """``mt.gelu(x, approximate)``: x Phi(x) (Phi the standard normal CDF), exactly with
        ``approximate="none"`` or in the tanh approximation with ``"tanh"``."""
        return ops.gelu(self, approximate=approximate)

    def abs(self) -> Tensor:
        """``mt.abs(x)``: |x| elementwise; derivative sign(x) (0 at x = 0, as in PyTorch)."""
        return Abs.apply(self)

    def clip(self, min: Number | None = None, max: Number | None = None) -> Tensor:
        """``mt.clip(x, min, max)``: every element clamped to [min, max] (either bound may be None, not
        both); the gradient passes only where the element was inside."""
        return ops.clip(self, min=min, max=max)

    def clamp(self, min: Number | None = None, max: Number | None = None) -> Tensor:
        """``mt.clamp(x, min, max)``, PyTorch's name for ``clip``: every element clamped to [min, max]."""
        return ops.clamp(self, min=min, max=max)

    def sum(self, axis: Axes | None = None, keepdims: bool = False) -> Tensor:
        """``mt.sum(x, axis, keepdims)``: the sum over ``axis`` (an int, a tuple of ints, or None for
        every axis); ``keepdims=True`` keeps the reduced axes with length 1."""
        return ops.sum(self, axis=axis, keepdims=keepdims)

    def mean(self, axis: Axes | None = None, keepdims: bool = False) -> Tensor:
        """``mt.mean(x, axis, keepdims)``: the average over ``axis`` (None: every axis)."""
        return ops.mean(self, axis=axis, keepdims=keepdims)

    def max(self, axis: Axes | None = None, keepdims: bool = False) -> Tensor:
        """``mt.max(x, axis, keepdims)``: the largest value over ``axis`` (None: every axis); tied
        maxima share the gradient. Values only: ``argmax`` gives positions."""
        return ops.max(self, axis=axis, keepdims=keepdims)

    def min(self, axis: Axes | None = None, keepdims: bool = False) -> Tensor:
        """``mt.min(x, axis, keepdims)``: the smallest value over ``axis``, computed as -max(-x)."""
        return ops.min(self, axis=axis, keepdims=keepdims)

    def var(self, axis: Axes | None = None, keepdims: bool = False, correction: int = 1) -> Tensor:
        """``mt.var(x, axis, keepdims, correction)``: sum (x - mean)^2 / (N - correction) over
        ``axis``; ``correction=1`` (the default) is the unbiased estimate, 0 the population variance."""
        return ops.var(self, axis=axis, keepdims=keepdims, correction=correction)

    def argmax(self, axis: int | None = None, keepdims: bool = False) -> Tensor:
        """``mt.argmax(x, axis, keepdims)``: the positions of the maxima (int64, outside the graph);
        over the flattened tensor when ``axis`` is None."""
        return ops.argmax(self, axis=axis, keepdims=keepdims)

    def argmin(self, axis: int | None = None, keepdims: bool = False) -> Tensor:
        """``mt.argmin(x, axis, keepdims)``: the positions of the minima (int64, outside the graph);
        over the flattened tensor when ``axis`` is None."""
        return ops.argmin(self, axis=axis, keepdims=keepdims)

    def std(self, axis: Axes | None = None, keepdims: bool = False, correction: int = 1) -> Tensor:
        """``mt.std(x, axis, keepdims, correction)``: sqrt(var), the standard deviation over ``axis``;
        ``correction=1`` (the default) as for ``var``."""
        return ops.std(self, axis=axis, keepdims=keepdims, correction=correction)

    def prod(self, axis: Axes | None = None, keepdims: bool = False) -> Tensor:
        """``mt.prod(x, axis, keepdims)``: the product over ``axis`` (None: every axis); the gradient,
        the product of the others, is right where some elements are 0."""
        return ops.prod(self, axis=axis, keepdims=keepdims)

    def logsumexp(self, axis: Axes | None = None, keepdims: bool = False) -> Tensor:
        """``mt.logsumexp(x, axis, keepdims)``: log sum exp(x) over ``axis``, computed without
        overflow; derivative softmax(x)."""
        return ops.logsumexp(self, axis=axis, keepdims=keepdims)

    def cumsum(self, axis: int) -> Tensor:
        """``mt.cumsum(x, axis)``: the running sum along ``axis``; the gradient is the running sum of
        the gradient from the other end."""
        return ops.cumsum(self, axis=axis)

    def norm(self, p: Number | str = "fro", axis: Axes | None = None, keepdims: bool = False) -> Tensor:
        """``mt.norm(x, p, axis, keepdims)``: the p-norm, by default the 2-norm of all elements
        (``x.norm()``, D2L 2.3); derivative x / ||x|| for p = 2 (0 at x = 0)."""
        return ops.reduce.norm(self, p, axis=axis, keepdims=keepdims)

    def maximum(self, other: Tensor | Number) -> Tensor:
        """``mt.maximum(x, other)``: the larger of the two elementwise, broadcasting; ties share the
        gradient half and half."""
        return ops.maximum(self, other)

    def minimum(self, other: Tensor | Number) -> Tensor:
        """``mt.minimum(x, other)``: the smaller of the two elementwise, broadcasting; ties share the
        gradient half and half."""
        return ops.minimum(self, other)

    def dot(self, other: Tensor) -> Tensor:
        """``mt.dot(x, other)``: the dot product of two 1-D tensors, sum_i x_i other_i."""
        return ops.dot(self, other)

    def mv(self, vec: Tensor) -> Tensor:
        """``mt.mv(x, vec)``: the product of the matrix x (n, m) and the vector ``vec`` (m,), (n,)."""
        return ops.mv(self, vec)

    def mm(self, other: Tensor) -> Tensor:
        """``mt.mm(x, other)``: the product of two matrices, (n, k) @ (k, m) -> (n, m)."""
        return ops.mm(self, other)

    def gather(self, axis: int, index: Tensor) -> Tensor:
        """``mt.gather(x, axis, index)``: the elements picked along ``axis`` by the integer ``index``
        (its shape is the result's); the gradient adds up at the positions picked."""
        return ops.gather(self, axis, index)

    def flip(self, axis: Axes) -> Tensor:
        """``mt.flip(x, axis)``: the elements in reverse order along ``axis`` (an int or a tuple)."""
        return ops.flip(self, axis)

    def isnan(self) -> Tensor:
        """``mt.isnan(x)``: True where an element is NaN (a bool tensor, outside the graph)."""
        return ops.isnan(self)

    def isinf(self) -> Tensor:
        """``mt.isinf(x)``: True where an element is +inf or -inf (a bool tensor, outside the graph)."""
        return ops.isinf(self)

    def isfinite(self) -> Tensor:
        """``mt.isfinite(x)``: True where an element is neither NaN nor infinite (a bool tensor)."""
        return ops.isfinite(self)

    def reshape(self, *shape: Shape) -> Tensor:
        """``mt.reshape(x, *shape)``: the same elements in a new shape, ``x.reshape(2, 3)`` or
        ``x.reshape((2, 3))``; one axis may be -1, inferred from the others."""
        return ops.reshape(self, *shape)

    def view(self, *shape: Shape) -> Tensor:
        """PyTorch's ``view``: here the same as ``reshape`` (``mt.reshape(x, *shape)``)."""
        return ops.reshape(self, *shape)

    def flatten(self, start_axis: int = 0, end_axis: int = -1) -> Tensor:
        """``mt.flatten(x, start_axis, end_axis)``: axes start_axis..end_axis merged into one (all of
        them by default: a 1-D tensor)."""
        return ops.flatten(self, start_axis=start_axis, end_axis=end_axis)

    def permute(self, *axes: Axes) -> Tensor:
        """``mt.permute(x, *axes)``: the axes reordered, ``x.permute(0, 2, 1, 3)`` or with a tuple;
        every axis must be named once."""
        return ops.permute(self, *axes)

    def transpose(self, axis0: int = -2, axis1: int = -1) -> Tensor:
        """``mt.transpose(x, axis0, axis1)``: two axes swapped, by default the last two (PyTorch's
        ``transpose``, NumPy's ``swapaxes``)."""
        return ops.transpose(self, axis0=axis0, axis1=axis1)

    def swapaxes(self, axis0: int = -2, axis1: int = -1) -> Tensor:
        """``mt.swapaxes(x, axis0, axis1)``, NumPy's name for ``transpose``: two axes swapped."""
        return ops.swapaxes(self, axis0=axis0, axis1=axis1)

    @property
    def T(self) -> Tensor:
        """All axes reversed (the transpose of a matrix)."""
        return ops.permute(self, tuple(reversed(range(self.ndim))))

    def t(self) -> Tensor:
        """The transpose of a matrix (PyTorch's ``x.t()``: at most two axes, D2L 10.7's
        ``X.t()`` turning (batch, steps) tokens time-major); ``x.T`` reverses any number."""
        if self.ndim > 2:
            raise ShapeError(f"t: expects at most 2 axes, got shape {tuple(self.shape)}; use transpose or permute")
        return self.T

    def view_as(self, other: Tensor) -> Tensor:
        """``x.reshape(other.shape)``: the same elements in ``other``'s shape (PyTorch's ``view_as``)."""
        return ops.reshape(self, other.shape)

    def expand_as(self, other: Tensor) -> Tensor:
        """``x.expand(other.shape)``: repeated along axes of length 1 to ``other``'s shape; the
        gradient is summed back."""
        return ops.expand(self, other.shape)

    def broadcast_to(self, *shape: Shape) -> Tensor:
        """``mt.broadcast_to(x, *shape)``: repeated along axes of length 1 (and new leading axes) to
        ``shape``; the gradient is summed back."""
        return ops.broadcast_to(self, *shape)

    def expand(self, *shape: Shape) -> Tensor:
        """``mt.expand(x, *shape)``, PyTorch's ``expand``: ``broadcast_to`` where -1 keeps an axis's
        length."""
        return ops.expand(self, *shape)

    def squeeze(self, axis: Axes | None = None) -> Tensor:
        """``mt.squeeze(x, axis)``: axes of length 1 removed, all of them (``axis=None``) or the ones
        given (``ShapeError`` if one of those is longer)."""
        return ops.squeeze(self, axis=axis)

    def unsqueeze(self, axis: int) -> Tensor:
        """``mt.unsqueeze(x, axis)``: a new axis of length 1 inserted at ``axis`` (negative counts from
        the end of the new shape)."""
        return ops.unsqueeze(self, axis=axis)

    def softmax(self, axis: int = -1) -> Tensor:
        """``mt.softmax(x, axis)``: softmax(x)_i = exp(x_i) / sum_j exp(x_j) along ``axis`` (the last
        by default)."""
        return ops.softmax(self, axis=axis)

    def log_softmax(self, axis: int = -1) -> Tensor:
        """``mt.log_softmax(x, axis)``: x_i - log sum_j exp(x_j) along ``axis``, computed without
        overflow."""
        return ops.log_softmax(self, axis=axis)

    def masked_fill(self, mask: Tensor, value: Number) -> Tensor:
        """``mt.masked_fill(x, mask, value)``: ``x`` with ``value`` wherever the bool ``mask`` (broadcast
        to x's shape) is True."""
        return ops.masked_fill(self, mask, value)

    def topk(self, k: int, axis: int = -1, largest: bool = True, sorted: bool = True) -> ops.reduce.TopK:  # noqa: A002
        """``mt.topk(x, k, axis, largest, sorted)``: the k largest elements along ``axis`` and their
        positions, ``(values, indices)``; values largest first."""
        return ops.topk(self, k, axis=axis, largest=largest, sorted=sorted)

    def sort(self, axis: int = -1, descending: bool = False, stable: bool = False) -> ops.reduce.Sort:
        """``mt.sort(x, axis, descending)``: the elements along ``axis`` in order and the positions
        they came from, ``(values, indices)``."""
        return ops.sort(self, axis=axis, descending=descending, stable=stable)

    def repeat(self, *reps: int | Sequence[int]) -> Tensor:
        """``mt.repeat(x, *reps)``: x copied ``reps[k]`` times along each axis k, end to end
        (PyTorch's ``x.repeat(2, 1)``, NumPy's ``tile``)."""
        return ops.repeat(self, *reps)

    def repeat_interleave(self, repeats: int | Sequence[int] | Tensor, axis: int | None = None) -> Tensor:
        """``mt.repeat_interleave(x, repeats, axis)``: each element (or slice along ``axis``)
        repeated in place, ``repeats`` times (one count, or one per slice)."""
        return ops.repeat_interleave(self, repeats, axis=axis)

    def bmm(self, other: Tensor) -> Tensor:
        """``mt.bmm(x, other)``: the batched product of two 3-D tensors, matrix by matrix."""
        return ops.bmm(self, other)

    def split(self, split_size_or_sections: int | Sequence[int], axis: int = 0) -> list[Tensor]:
        """``mt.split(x, split_size_or_sections, axis)``: a list of pieces along ``axis``, each of the
        given size (an int; the last may be smaller) or of the sizes listed."""
        return ops.split(self, split_size_or_sections, axis=axis)

    def chunk(self, chunks: int, axis: int = 0) -> list[Tensor]:
        """``mt.chunk(x, chunks, axis)``: at most ``chunks`` pieces along ``axis``, of equal length
        but the last."""
        return ops.chunk(self, chunks, axis=axis)

    # -- printing ---------------------------------------------------------------------------
    def __repr__(self) -> str:
        """``tensor([...], dtype=..., device=..., grad_fn=...)``, laid out as PyTorch does (_printing.py)."""
        data = self.numpy()
        extras = []
        if data.size > _printing.OPTIONS.threshold or (data.size == 0 and data.ndim != 1):
            extras.append(f"shape={self.shape}")  # abbreviated (or empty): the shape is not on show
        if self.dtype not in _DTYPES_NOT_SHOWN or (data.size == 0 and self.dtype != numpy.float32):
            extras.append(f"dtype={self.dtype}")
        if self.device != "cpu":
            extras.append(f"device={self.device!r}")
        if self._ctx is not None:
            extras.append(f"grad_fn={type(self._ctx).__name__}")
        elif self.requires_grad:
            extras.append("requires_grad=True")
        return _printing.tensor_repr("tensor(", data, extras)

    # Last in the class: from here on, ``int`` and ``bool`` in this body name these methods.
    def int(self) -> Tensor:
        """``x.to(mt.int32)``: an int32 copy (``x`` itself if it is int32 already), outside the graph
        (integers carry no gradient), as PyTorch's ``x.int()``; floats are truncated toward 0."""
        return self.to(dtype="int32")

    def bool(self) -> Tensor:
        """``x.to(mt.bool)``: True where an element is nonzero (``x`` itself if it is bool already),
        outside the graph, as PyTorch's ``x.bool()``."""
        return self.to(dtype="bool")


# PyTorch's defaults, left out of the repr; an empty tensor shows any dtype but float32
_DTYPES_NOT_SHOWN = (numpy.dtype("float32"), numpy.dtype("int64"), numpy.dtype("bool"))
_KIND_ORDER = "biuf"  # bool < integers < floats: an in-place result may not climb this (``_write``)


def _check_fits(name: str, ufunc: str, dtype: numpy.dtype, value: Any, shape: tuple[int, ...]) -> None:
    """Raise if ``x <ufunc>= value`` has a result of a kind ``x`` (of ``dtype``) cannot hold."""
    result = numpy.result_type(dtype, getattr(value, "dtype", value))
    if ufunc == "true_divide" and not is_floating(result):
        result = numpy.dtype(numpy.float64)  # (i / j is a float even for integers)
    if _KIND_ORDER.index(_kind(result)) > _KIND_ORDER.index(_kind(dtype)):
        raise DTypeError(
            f"{name}: the result is {result}, which this tensor ({dtype}, shape {shape}) "
            "cannot hold in place (PyTorch refuses it too); compute a new tensor instead, or "
            "convert first: x = x.float()"
        )


def _kind(dtype: numpy.dtype) -> str:
    """NumPy's kind letter of ``dtype``, with bfloat16 (``ml_dtypes``'s, kind "V") a float, "f"."""
    return "f" if is_floating(dtype) else dtype.kind


_PLAIN_NUMBER = {int, float}  # exact types: np.float64 subclasses float but is not weak


def _binary(function: type[autograd.Function], a: Tensor, b: Any) -> Tensor:
    """``a <op> b`` for the Function ``function`` (Add, Mul, MatMul...), ``a`` a Tensor.

    The common cases, two tensors of one dtype or a float tensor and a Python number, go
    straight to ``function.apply``; the rest (NumPy scalars, lists, int meets float) goes
    through ``promote`` first (ops/promote.py).
    """
    if (isinstance(b, Tensor) and b.data.dtype == a.data.dtype) or (
        type(b) in _PLAIN_NUMBER and is_floating(a.data.dtype)
    ):
        return function.apply(a, b)
    return function.apply(*promote(a, b))


def _reflected(function: type[autograd.Function], a: Tensor, b: Any) -> Tensor:
    """``b <op> a`` where ``b`` is not a Tensor: ``2 - x`` is ``x.__rsub__(2)``."""
    a, b = promote(a, b)
    return function.apply(b, a)


def _carried_float(data: Any) -> numpy.dtype:
    """The float dtype ``tensor`` gives floating-point ``data``: that of a NumPy array or a Tensor
    (for nested lists, of their first element: ``[t1, t2]`` of float64 tensors stays float64),
    else float32, PyTorch's default, for Python floats and NumPy scalars alike (``promote``
    treats a NumPy scalar as a Python number too: ``mt.tensor(np.sqrt(d))`` must combine with
    float32 tensors, as its 0-d PyTorch twin does)."""
    while isinstance(data, (list, tuple)) and data:
        data = data[0]
    if isinstance(data, (numpy.ndarray, Tensor)) and is_floating(data.dtype):
        return data.dtype
    return numpy.dtype(numpy.float32)


def _int_beyond_int64(data: Any) -> int | None:
    """The first Python int in nested lists ``data`` that int64 cannot hold, or None."""
    if isinstance(data, (list, tuple)):
        for item in data:
            if (big := _int_beyond_int64(item)) is not None:
                return big
        return None
    if isinstance(data, int) and not isinstance(data, bool) and not -(2**63) <= data < 2**63:
        return data
    return None


def tensor(data: Any, requires_grad: bool = False, dtype: DType = None, device: Device = None) -> Tensor:
    """A new leaf tensor holding a copy of ``data``.

    ``data``: a number, nested lists, a NumPy array or a Tensor. Floating-point Python data
    becomes float32 (the default), integers int64, booleans bool; a NumPy array, or a list of
    tensors, keeps its dtype unless ``dtype`` says otherwise (as in PyTorch), in this machine's
    byte order. A NumPy float scalar becomes float32, as a Python float does (PyTorch: float64).
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
            try:
                host = numpy.asarray(data)
            except ValueError as e:  # nested lists of different lengths, mostly: NumPy's words say which
                raise ValueError(f"tensor: the data do not form a rectangular array of numbers ({e})") from None
            if dtype is None and is_floating(host.dtype):
                host = host.astype(_carried_float(data), copy=False)
            if dtype is None and host.size and host.dtype.kind in "uf" and not isinstance(data, numpy.generic):
                # NumPy keeps Python ints in 2**63 .. 2**64 - 1 as uint64, and mixed with smaller ones
                # as float64 (rounded): look for such an int only where a value is that large
                if host.dtype.kind == "u" or max(float(host.max()), -float(host.min())) >= 2.0**63:
                    big = _int_beyond_int64(data)
                    if big is not None:
                        raise OverflowError(f"tensor: the integer {big} does not fit int64 (-2**63 .. 2**63 - 1)")
            arr = backend.array(host)
    if not arr.dtype.isnative:  # a big-endian file's ">f4": the copy in this machine's byte order, float32
        arr = arr.astype(arr.dtype.newbyteorder("="))
    dtype = as_dtype(dtype, "tensor")
    if dtype is not None and arr.dtype != dtype:
        arr = arr.astype(dtype)
    if _kind(arr.dtype) not in "fiub":
        if arr.dtype == object and all(isinstance(v, int) for v in arr.flat):  # NumPy's home for huge ints
            big = max(arr.flat, key=abs)
            raise OverflowError(f"tensor: the integer {big} does not fit int64 (-2**63 .. 2**63 - 1)")
        raise TypeError(f"tensor: unsupported data of dtype {arr.dtype} (numbers or booleans expected)")
    t = Tensor._make(arr, backend, None)
    if requires_grad:
        t.requires_grad_(True)
    return t


# The one import cycle: autograd and the ops make Tensors (they import this module) and the
# methods above call them, so they load here, once Tensor and tensor() exist. Hence
# minitensor/__init__.py imports this module before the others.
from . import autograd, ops  # noqa: E402
from .ops.axes import normalize_axes, normalize_axis, torch_names  # noqa: E402
from .ops.compare import AllTrue, And, AnyTrue, Equal, Greater, GreaterEqual, Invert, Less, LessEqual, NotEqual, Or, Xor  # noqa: E402
from .ops.elementwise import Abs, Add, Div, FloorDivide, Mul, Neg, Pow, ReLU, Remainder, Sub  # noqa: E402
from .ops.indexing import normalize_index, setitem  # noqa: E402
from .ops.promote import promote  # noqa: E402

# PyTorch's words for the axis parameters, ``x.sum(dim=1, keepdim=True)``, as the ops take them
# (ops/axes.py); the methods are wrapped here, where the ops' module has loaded
for _name in ("sum", "mean", "max", "min", "var", "argmax", "argmin", "all", "any", "size", "flatten", "transpose",
              "swapaxes", "squeeze", "unsqueeze", "softmax", "log_softmax", "split", "chunk", "topk", "sort",
              "repeat_interleave", "std", "prod", "logsumexp", "cumsum", "norm", "gather", "flip"):  # fmt: skip
    setattr(Tensor, _name, torch_names(getattr(Tensor, _name)))
del _name
