"""Indexing ``x[...]``, writing ``x[...] = v`` in the graph, embedding lookup and ``gather``:
reading some elements, possibly repeatedly.

Backward writes the gradient back into a zero tensor of the input's shape. With basic
indexing (ints, slices, ``None``, ``...``) every input element is read at most once, so a
plain assignment does; with integer-array indexing one element can be read many times
(``x[[0, 0, 1]]``) and its gradients must be *added* (a scatter-add, ``index_add``).
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any

import numpy

from ..autograd import Function, GradAt, Grads
from ..backends import Backend, get_backend
from ..errors import DeviceError, ShapeError
from ..tensor import Array, Tensor
from .axes import normalize_axis, torch_names


def normalize_index(index: Any, like: Tensor | None = None) -> Any:
    """Replace Tensors inside an index by their arrays (which must be on ``like``'s device)."""

    def unwrap(i: Any) -> Any:
        if not isinstance(i, Tensor):
            return i
        if like is not None and i._backend is not like._backend:
            raise DeviceError(
                f"indexing a tensor on {like.device!r} with an index tensor on {i.device!r}; "
                f"move the index with .to({like.device!r})"
            )
        return i.data

    if isinstance(index, tuple):
        return tuple(unwrap(i) for i in index)
    return unwrap(index)


def _is_basic(index: Any) -> bool:
    parts = index if isinstance(index, tuple) else (index,)
    return all(p is None or p is Ellipsis or isinstance(p, (int, slice)) for p in parts)


def _check_array_parts(shape: tuple[int, ...], index: Any, backend: Backend | None = None) -> Any:
    """``index`` with its integer-array parts checked against their axes: IndexError for one
    that points outside its axis, raised as ``backend.check`` does (default: the CPU's, at once).

    NumPy checks this itself; CuPy does not (an out-of-range array index wraps around, so
    ``x[[0, 7]]`` of a 3-row array silently reads row 1), so on any other array library the
    check is made here: on the device, without waiting for it (``Backend.check``), raised at the
    next read. Until then a part out of range reads position 0: the index returned has it so.
    """
    backend = backend or get_backend("cpu")
    parts = index if isinstance(index, tuple) else (index,)

    def width(p: Any) -> int:  # how many axes of ``a`` the part consumes
        if p is None or p is Ellipsis:
            return 0
        if hasattr(p, "dtype") and p.dtype.kind == "b":
            return p.ndim
        return 1

    checked, axis = list(parts), 0
    for k, p in enumerate(parts):
        if p is Ellipsis:
            axis = len(shape) - sum(width(q) for q in parts[parts.index(Ellipsis) + 1 :])
            continue
        if hasattr(p, "dtype") and p.dtype.kind in "iu" and p.size and axis < len(shape):
            n = shape[axis]
            inside = (p >= -n) & (p < n)
            backend.check(inside.all(), partial(_out_of_bounds, p, axis, n))
            if not backend.on_host and backend.is_array(p):  # (a host array part was checked at once)
                checked[k] = backend.xp.where(inside, p, 0)
        axis += width(p)
    return tuple(checked) if isinstance(index, tuple) else checked[0]


def in_range(indices: Array, n: int) -> Array:
    """``0 <= indices < n`` elementwise, in one comparison where it can be: seen as unsigned
    integers of the same width, negative ones are 2**(bits - 1) and more (two's complement: -1
    is all ones), so they fail ``< n`` as well. One pass instead of three (on a GPU, one kernel
    launch instead of three, in every step that looks up an embedding or scores a target)."""
    bits = 8 * indices.dtype.itemsize
    if indices.dtype.kind == "i" and bits >= 32 and n < 2 ** (bits - 1):
        return indices.view(f"u{indices.dtype.itemsize}") < n
    return (indices >= 0) & (indices < n)


def _out_of_bounds(p: Array, axis: int, n: int) -> str:
    """The message of ``_check_array_parts`` (read from the device only when it fails)."""
    low, high = int(p.min()), int(p.max())
    return f"getitem: index {high if high >= n else low} is out of bounds for axis {axis} with size {n}"


class GetItem(Function):
    """z = a[index];  dL/da = zeros with dL/dz added at the positions read (for a basic index,
    a ``GradAt``: the zeros are left to the engine, which adds the slice into a's gradient)."""

    @staticmethod
    def forward(ctx: Function, a: Array, index: Any) -> Array:
        index = normalize_index(index)  # index tensors come inside ``index``, seen by mt.onnx's tracer
        if type(index) is tuple and len(index) == 1 and not _is_basic(index):
            index = index[0]  # x[(i,)] is x[i]: one array, for the backends' fast scatter-add
        if not ctx.backend.on_host and not _is_basic(index):
            index = _check_array_parts(a.shape, index, ctx.backend)
        ctx.shape, ctx.dtype, ctx.index = a.shape, a.dtype, index
        try:
            return a[index]
        except IndexError as e:
            raise IndexError(f"getitem: index {index!r} does not fit shape {tuple(a.shape)}: {e}") from None

    @staticmethod
    def backward(ctx: Function, grad: Array) -> Grads:
        basic = _is_basic(ctx.index)
        if basic and grad.ndim:
            # zero but on the slice read: the engine adds it where it belongs (a loop over x's
            # rows then costs one array in backward, not one per row: see autograd.GradAt)
            return GradAt(ctx.shape, ctx.index, grad)
        out = ctx.xp.zeros(ctx.shape, dtype=ctx.dtype)
        if basic:
            out[ctx.index] = grad
        else:
            ctx.backend.index_add(out, ctx.index, grad)
        return out


def getitem(a: Tensor, index: Any) -> Tensor:
    """``a[index]`` (what indexing a tensor calls): ints, slices, ``None``, ``...``, integer and
    bool arrays or tensors (on a's device), as in NumPy.

    Backward writes the gradient into zeros of a's shape at the positions read, adding it up
    where integer-array indexing read one element several times (``x[[0, 0, 1]]``).
    """
    normalize_index(index, a)  # index tensors on another device: a clear error now
    if isinstance(index, Tensor):  # kept inside the index (not a second input of the op)
        index = (index,)
    return GetItem.apply(a, index)


class SetItem(Function):
    """z = a with z[index] = v (``x[index] = v`` on a tensor in the graph);  dL/da = dL/dz with 0
    at the positions written (their old values no longer matter), dL/dv = dL/dz[index] (summed
    back to v's shape where v was broadcast). Out of place: z is a new array, so the arrays that
    earlier ops saved for their backward keep the values they saw -- unless ``in_place``, which
    ``Tensor.__setitem__`` passes when nothing else can reach a's array (``autograd.sole_holder``):
    then z is a itself, and ``outputs[t] = y`` in a loop of T steps writes T slices, not T copies."""

    writes_input = True  # the output is x rebound; ``a`` is the value x had (see autograd.backward)

    @staticmethod
    def forward(ctx: Function, a: Array, v: Any, index: Any, in_place: bool = False) -> Array:
        index = normalize_index(index)
        ctx.index, ctx.v_dtype, ctx.v_shape = index, getattr(v, "dtype", None), getattr(v, "shape", ())
        ctx.grad_is_own = False  # (autograd.backward says whether the gradient it passes is its alone)
        ctx.mask = select_mask(index, a.shape, v)
        if ctx.mask is not None:
            # one value where a mask of a's own shape says (D2L's X[~mask] = -1e6): a select, which
            # a GPU runs without first counting the mask's True entries on the host
            if ctx.backend.is_array(v):
                v = v.reshape(())
            elif isinstance(v, numpy.ndarray):
                v = v.item()  # (a number is an argument of the kernel: nothing copied to the device)
            return ctx.xp.where(ctx.mask, v, a).astype(a.dtype, copy=False)
        if not ctx.backend.on_host and not _is_basic(index):
            index = ctx.index = _check_array_parts(a.shape, index, ctx.backend)
        z = a if in_place else a.copy()
        try:
            z[index] = v
        except (IndexError, ValueError) as e:  # a position outside, or values that do not broadcast
            error = IndexError if isinstance(e, IndexError) else ShapeError
            shape = tuple(getattr(v, "shape", ()))
            raise error(
                f"setitem: cannot write values of shape {shape} at {index!r} of shape {tuple(a.shape)}: {e}"
            ) from None
        return z

    @staticmethod
    def backward(ctx: Function, grad: Array) -> Grads:
        need_a, need_v, _ = ctx.needs_input_grad
        if ctx.mask is not None:  # the select's: dL/dv sums dL/dz over the mask, a's keeps the rest
            xp = ctx.xp
            gv = xp.where(ctx.mask, grad, 0).sum().reshape(ctx.v_shape).astype(ctx.v_dtype) if need_v else None
            return (xp.where(ctx.mask, 0, grad) if need_a else None), gv, None
        in_place = need_a and ctx.grad_is_own  # grad is backward's alone: zero the slice in it
        gv = grad[ctx.index].astype(ctx.v_dtype, copy=in_place) if need_v else None
        ga = None
        if need_a:
            ga = grad if in_place else grad.copy()
            ga[ctx.index] = 0
        return ga, gv, None


def select_mask(index: Any, shape: tuple[int, ...], value: Any) -> Any:
    """The mask of a write ``x[index] = value`` that is a select, where(mask, value, x): ``index``
    one bool mask of x's whole ``shape`` and ``value`` one number (D2L's ``X[~mask] = -1e6``);
    else None. Arrays or tensors alike (``mt.onnx`` asks it of the recorded write too)."""
    parts = index if type(index) is tuple else (index,)
    if len(parts) != 1 or math.prod(getattr(value, "shape", ())) != 1:
        return None
    mask = parts[0]
    if getattr(mask, "dtype", None) is None:
        return None
    return mask if mask.dtype.kind == "b" and tuple(mask.shape) == tuple(shape) else None


def setitem(a: Tensor, index: Any, value: Any, in_place: bool = False) -> Tensor:
    """A tensor equal to ``a`` with ``value`` written at ``index`` (what ``x[index] = value`` records
    when x or value is in the graph); value may be a number, an array or a tensor, broadcast to
    the positions. Differentiable in both: the positions written take value's gradient, the rest
    a's. Where integer-array indexing names one position twice, the last write wins (as in NumPy).
    ``in_place``: write into a's array (only where nothing else can reach it: see SetItem)."""
    normalize_index(index, a)  # index tensors on another device: a clear error now
    if isinstance(index, Tensor):
        index = (index,)
    if isinstance(value, Tensor) and value.dtype != a.dtype:
        value = value.astype(a.dtype)  # as the assignment into an array would (and differentiable)
    return SetItem.apply(a, value, index, in_place=in_place)


class Embedding(Function):
    """z[..., :] = W[i, :] for each index i;  dL/dW[i] = sum of dL/dz over the places i was used.

    An embedding layer is a table look-up: the same as ``one_hot(indices) @ W`` without
    building the one-hot matrix, and its gradient is the matching scatter-add.
    """

    @staticmethod
    def forward(ctx: Function, weight: Array, indices: Array) -> Array:
        if indices.dtype.kind not in "iu":
            raise TypeError(f"embedding: indices must be an integer tensor, got {indices.dtype}")
        n = weight.shape[0]
        if indices.size:
            # On a device the check waits there for the next read (Backend.check): reading it
            # now would make every training step wait for the GPU.
            inside = in_range(indices, n)
            ctx.backend.check(inside.all(), partial(_out_of_range, indices, n))
            if not ctx.backend.on_host:
                indices = ctx.xp.where(inside, indices, 0)  # until it raises, a bad index reads row 0
        ctx.shape, ctx.indices = weight.shape, indices
        return weight[indices]

    @staticmethod
    def backward(ctx: Function, grad: Array) -> Grads:
        out = ctx.xp.zeros(ctx.shape, dtype=grad.dtype)
        ctx.backend.index_add(out, ctx.indices.reshape(-1), grad.reshape(-1, ctx.shape[1]))
        return out, None


def _out_of_range(indices: Array, n: int) -> str:
    """The message of Embedding's check (read from the device only when it fails)."""
    low, high = int(indices.min()), int(indices.max())
    bad = high if high >= n else low
    return f"embedding: index {bad} is out of range for a table of {n} embeddings (valid: 0..{n - 1})"


def embedding(indices: Tensor, weight: Tensor) -> Tensor:
    """Rows of ``weight`` (num_embeddings, embedding_dim) picked by integer ``indices`` of any
    shape: (*indices.shape, embedding_dim), the same as one_hot(indices) @ weight without
    building the one-hot vectors. The gradient adds up into the rows that were used."""
    if weight.ndim != 2:
        raise ShapeError(f"embedding: weight must be 2-D (num_embeddings, embedding_dim), got shape {weight.shape}")
    if not isinstance(indices, Tensor):
        indices = Tensor._make(weight._backend.array(indices), weight._backend, None)
    return Embedding.apply(weight, indices)


class OneHot(Function):
    """z[..., c] = 1 where c = indices[...], else 0, int64 (PyTorch's ``F.one_hot``): the one-hot
    vectors of D2L 9.5, which ``embedding`` spares building. Outside the graph: class indices
    have no gradient."""

    differentiable = False

    @staticmethod
    def forward(ctx: Any, indices: Array, num_classes: int) -> Array:
        if indices.size:  # (ctx is the backend: an op outside the graph has no node)
            ctx.check(in_range(indices, num_classes).all(), partial(_one_hot_out_of_range, indices, num_classes))
        return (indices[..., None] == ctx.xp.arange(num_classes)).astype(numpy.int64)


def _one_hot_out_of_range(indices: Array, n: int) -> str:
    low, high = int(indices.min()), int(indices.max())
    bad = high if high >= n else low
    return f"one_hot: class index {bad} is out of range for {n} classes (valid: 0..{n - 1})"


def one_hot(indices: Tensor, num_classes: int = -1) -> Tensor:
    """The one-hot vectors of integer class ``indices`` of any shape: (*indices.shape,
    num_classes), int64, a 1 at each index and 0 elsewhere (PyTorch's ``F.one_hot``, D2L 9.5's
    inputs to an RNN from scratch). ``num_classes=-1``: one more than the largest index (read
    from the device, as PyTorch reads it)."""
    if not isinstance(indices, Tensor) or indices.dtype.kind not in "iu":
        what = indices.dtype if isinstance(indices, Tensor) else type(indices).__name__
        raise TypeError(f"one_hot: indices must be an integer tensor of class indices, got {what}")
    if num_classes == -1:
        if not indices.numel():
            raise ValueError("one_hot: cannot infer num_classes from an empty tensor; pass num_classes")
        num_classes = int(indices.max().item()) + 1
    if isinstance(num_classes, bool) or not isinstance(num_classes, (int, numpy.integer)) or num_classes < 1:
        raise ValueError(f"one_hot: num_classes must be an integer >= 1 (or -1 to infer it), got {num_classes!r}")
    indices._backend.check_fits("one_hot", (*indices.shape, int(num_classes)), 8)
    return OneHot.apply(indices, int(num_classes))


class Gather(Function):
    """``z[i][j][k] = a[index[i][j][k]][j][k]`` along axis 0 (likewise along any ``axis``): each
    element of ``index`` picks one element of its row of ``a``.  dL/da = zeros with dL/dz
    *added* at the positions read: a scatter-add, since an index may pick one element twice.
    """

    @staticmethod
    def forward(ctx: Function, a: Array, index: Array, axis: int) -> Array:
        xp, n = ctx.xp, a.shape[axis]
        if index.size:
            inside = in_range(index, n)
            ctx.backend.check(inside.all(), partial(_gather_out_of_range, index, axis, n))
            if not ctx.backend.on_host:
                index = xp.where(inside, index, 0)  # until it raises, a bad index reads position 0
        # index may be shorter than a along the other axes (PyTorch's rule): read that corner of a
        corner = tuple(slice(None) if d == axis else slice(0, m) for d, m in enumerate(index.shape))
        # where each element of z comes from in a: index along ``axis``, its own position elsewhere
        ctx.where = tuple(
            index if d == axis else xp.arange(m).reshape([m if e == d else 1 for e in range(index.ndim)])
            for d, m in enumerate(index.shape)
        )
        ctx.shape = a.shape
        return xp.take_along_axis(a[corner], index, axis=axis)

    @staticmethod
    def backward(ctx: Function, grad: Array) -> Grads:
        out = ctx.xp.zeros(ctx.shape, dtype=grad.dtype)
        ctx.backend.index_add(out, ctx.where, grad)
        return out, None


def _gather_out_of_range(index: Array, axis: int, n: int) -> str:
    """The message of Gather's check (read from the device only when it fails)."""
    low, high = int(index.min()), int(index.max())
    return (
        f"gather: index {high if high >= n else low} is out of range for axis {axis} of length {n} (valid: 0..{n - 1})"
    )


@torch_names
def gather(a: Tensor, axis: int, index: Tensor) -> Tensor:
    """Elements of ``a`` picked along ``axis`` by the integer tensor ``index`` (PyTorch's
    ``gather``): ``out[i][j] = a[index[i][j]][j]`` for axis 0, ``a[i][index[i][j]]`` for axis 1. The
    result has index's shape; index has a's number of axes and is no longer than a along the
    others. ``y_hat.gather(1, y.reshape(-1, 1))`` picks each row's probability of its label (D2L
    4.1's cross-entropy from scratch). The gradient adds up at the positions picked."""
    if not isinstance(a, Tensor) or not isinstance(index, Tensor):
        raise TypeError(f"gather: a and index must be Tensors, got {type(a).__name__} and {type(index).__name__}")
    if index.dtype.kind not in "iu":
        raise TypeError(f"gather: index must be an integer tensor (int64), got {index.dtype}")
    if index._backend is not a._backend:
        raise DeviceError(f"gather: index on {index.device!r}, the tensor on {a.device!r}; move one with .to()")
    if a.ndim == 0:  # a number: index 0 along axis 0 or -1 reads it, as in PyTorch
        normalize_axis(axis, 1, "gather")
        return gather(a.reshape(1), 0, index.reshape(-1)).reshape(index.shape)
    axis = normalize_axis(axis, a.ndim, "gather")
    if index.ndim != a.ndim or any(m > n for d, (m, n) in enumerate(zip(index.shape, a.shape)) if d != axis):
        raise ShapeError(
            f"gather: index of shape {index.shape} for a tensor of shape {a.shape} along axis {axis}: index "
            f"must have {a.ndim} axes, none longer than the tensor's but axis {axis}"
        )
    return Gather.apply(a, index, axis=axis)
