"""Reductions: sum, mean, max, min, var, std, prod, logsumexp and the vector norm over some axes
(``axis=None`` means all); topk, the k largest along one axis; cumsum, the running sum along one.

Backward has to undo the reduction's loss of axes: the gradient of the (smaller) output is
reshaped as if ``keepdims=True`` and broadcast back over the reduced axes.
"""

from __future__ import annotations

import builtins
import math
from typing import Any, NamedTuple

from .. import amp
from ..autograd import Function, Grads
from ..dtypes import float32, is_floating, is_low_precision
from ..errors import ShapeError
from ..tensor import Array, Axes, Tensor
from .axes import normalize_axes, normalize_axis, torch_names
from .elementwise import _quiet, maximum, minimum
from .promote import as_float


def reduced_axes(axis: Axes | None, ndim: int, op: str) -> tuple[int, ...]:
    """``axis`` (None for all, an int or a tuple, negatives allowed) as a sorted tuple of
    axes; out-of-range and repeated axes are refused (``ops/axes.py``)."""
    if axis is None:
        return tuple(range(ndim))
    if type(axis) is int:
        return (normalize_axis(axis, ndim, op),)
    return tuple(sorted(normalize_axes(axis, ndim, op)))


def _some(a: Tensor, axis: Axes | None, op: str) -> None:
    """Refuse a max, min, argmax or argmin over an axis with no element, which has no answer
    (a sum of nothing is 0; a largest of nothing is not anything), as PyTorch refuses it."""
    axes = reduced_axes(axis, a.ndim, op)
    empty = [i for i in axes if a.shape[i] == 0]
    if empty:
        where = f"axis {empty[0]}" if axis is not None else "the tensor"
        raise ShapeError(
            f"{op}: {where} of shape {tuple(a.shape)} has no element, and the {op} of nothing is undefined"
        )


def _keepdims_shape(shape: tuple[int, ...], axes: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(1 if i in axes else n for i, n in enumerate(shape))


def _expand(xp: Any, grad: Array, shape: tuple[int, ...], axes: tuple[int, ...]) -> Array:
    """Broadcast the gradient of a reduction back to the input's shape."""
    return xp.broadcast_to(grad.reshape(_keepdims_shape(shape, axes)), shape)


class Sum(Function):
    """z = sum_i a_i over the axes;  dz/da_i = 1."""

    reads_inputs = False  # (its backward needs only shapes: see Function.reads_inputs)

    @staticmethod
    def forward(ctx: Function, a: Array, axis: Axes | None = None, keepdims: bool = False) -> Array:
        ctx.shape, ctx.axes = a.shape, reduced_axes(axis, a.ndim, "sum")
        if is_low_precision(a.dtype):  # summed in float32, rounded once (a bfloat16 running sum stops at 256)
            return a.sum(axis=ctx.axes, keepdims=keepdims, dtype=float32).astype(a.dtype)
        return a.sum(axis=ctx.axes, keepdims=keepdims)

    @staticmethod
    def backward(ctx: Function, grad: Array) -> Grads:
        return _expand(ctx.xp, grad, ctx.shape, ctx.axes)


class Mean(Function):
    """z = (1/N) sum_i a_i;  dz/da_i = 1/N."""

    reads_inputs = False  # (its backward needs only shapes: see Function.reads_inputs)

    @staticmethod
    def forward(ctx: Function, a: Array, axis: Axes | None = None, keepdims: bool = False) -> Array:
        ctx.shape, ctx.axes = a.shape, reduced_axes(axis, a.ndim, "mean")
        if is_low_precision(a.dtype):  # as Sum
            return a.mean(axis=ctx.axes, keepdims=keepdims, dtype=float32).astype(a.dtype)
        return a.mean(axis=ctx.axes, keepdims=keepdims)

    @staticmethod
    def backward(ctx: Function, grad: Array) -> Grads:
        count = 1
        for i in ctx.axes:
            count *= ctx.shape[i]
        return _expand(ctx.xp, grad / count, ctx.shape, ctx.axes)


class Max(Function):
    """z = max_i a_i;  dz/da_i = 1/m where a_i is one of the m maxima, else 0.

    Ties share the gradient equally, which keeps it a true subgradient.
    """

    @staticmethod
    def forward(ctx: Function, a: Array, axis: Axes | None = None, keepdims: bool = False) -> Array:
        axes = reduced_axes(axis, a.ndim, "max")
        z = a.max(axis=axes, keepdims=True)
        is_max = (a == z).astype(a.dtype)  # bool / int count would be float64
        ctx.save_for_backward(is_max / is_max.sum(axis=axes, keepdims=True))
        ctx.shape, ctx.axes = a.shape, axes
        return z if keepdims else z.reshape(tuple(n for i, n in enumerate(a.shape) if i not in axes))

    @staticmethod
    def backward(ctx: Function, grad: Array) -> Grads:
        (share,) = ctx.saved
        return _expand(ctx.xp, grad, ctx.shape, ctx.axes) * share


class Var(Function):
    """z = sum_i (a_i - mean)^2 / (N - correction);  dz/da_i = 2 (a_i - mean) / (N - correction).

    ``correction=1`` (the default, as in PyTorch) is the unbiased estimate; 0 is the
    population variance that layer normalisation uses.
    """

    @staticmethod
    def forward(
        ctx: Function, a: Array, axis: Axes | None = None, keepdims: bool = False, correction: int = 1
    ) -> Array:
        axes = reduced_axes(axis, a.ndim, "var")
        count = 1
        for i in axes:
            count *= a.shape[i]
        centered = a - a.mean(axis=axes, keepdims=True)
        denom = builtins.max(count - correction, 0)
        ctx.save_for_backward(centered)
        ctx.shape, ctx.axes, ctx.denom = a.shape, axes, denom
        return (centered * centered).sum(axis=axes, keepdims=keepdims) / denom

    @staticmethod
    def backward(ctx: Function, grad: Array) -> Grads:
        (centered,) = ctx.saved
        return _expand(ctx.xp, grad, ctx.shape, ctx.axes) * (2 / ctx.denom) * centered


@torch_names
def sum(a: Tensor, axis: Axes | None = None, keepdims: bool = False) -> Tensor:  # noqa: A001
    """z = sum_i a_i over ``axis`` (an int, a tuple of ints, or None for every axis); dz/da_i = 1.

    ``keepdims=True`` keeps the reduced axes with length 1, so the result broadcasts against
    ``a``. Repeated or out-of-range axes are an ``AxisError``.
    """
    return Sum.apply(amp.in_float32(a), axis=axis, keepdims=keepdims)


@torch_names
def mean(a: Tensor, axis: Axes | None = None, keepdims: bool = False) -> Tensor:
    """z = (1/N) sum_i a_i over ``axis`` (an int, a tuple of ints, or None for every axis), N the
    number of elements averaged; dz/da_i = 1/N. ``keepdims`` as for ``sum``. The mean of
    integers or booleans (an accuracy, ``(pred == y).mean()``) is float32, not NumPy's float64."""
    return Mean.apply(amp.in_float32(as_float(a)), axis=axis, keepdims=keepdims)


@torch_names
def max(a: Tensor, axis: Axes | None = None, keepdims: bool = False) -> Tensor:  # noqa: A001
    """z = max_i a_i over ``axis`` (an int, a tuple of ints, or None for every axis), values
    only (see ``argmax`` for positions); ``keepdims`` as for ``sum``. The gradient goes to the
    maxima, shared equally among tied ones (1/m each for m ties).

    With a tensor in place of the axis, ``max(a, b)`` is PyTorch's other ``max``: ``maximum(a, b)``,
    elementwise, broadcasting (D2L 5.1's ``torch.max(X, torch.zeros_like(X))``)."""
    if isinstance(axis, Tensor):
        return _two_tensors("max", maximum, a, axis, keepdims)
    _some(a, axis, "max")
    return Max.apply(a, axis=axis, keepdims=keepdims)


@torch_names
def min(a: Tensor, axis: Axes | None = None, keepdims: bool = False) -> Tensor:  # noqa: A001
    """The smallest element(s) over ``axis`` (values only; see ``argmin`` for positions),
    computed as min(a) = -max(-a), so tied minima share the gradient as ``max``'s maxima do.
    With a tensor in place of the axis, ``min(a, b)`` is ``minimum(a, b)``, elementwise."""
    if isinstance(axis, Tensor):
        return _two_tensors("min", minimum, a, axis, keepdims)
    _some(a, axis, "min")  # so that an error names min, not max
    return -Max.apply(-a, axis=axis, keepdims=keepdims)


@torch_names
def var(a: Tensor, axis: Axes | None = None, keepdims: bool = False, correction: int = 1) -> Tensor:
    """z = sum_i (a_i - mean)^2 / (N - correction) over ``axis`` (None: every axis);
    dz/da_i = 2 (a_i - mean) / (N - correction).

    ``correction=1`` (the default, as in PyTorch) is the unbiased estimate; ``correction=0``
    the population variance, which layer normalisation uses. ``keepdims`` as for ``sum``.
    Integers or booleans give float32, as ``mean``.
    """
    a = amp.in_float32(as_float(a))
    if is_low_precision(a.data.dtype):  # float16 or bfloat16: summed in float32, rounded once
        return var(a.float(), axis, keepdims, correction).to(a.dtype)
    return Var.apply(a, axis=axis, keepdims=keepdims, correction=correction)


def _two_tensors(op: str, elementwise: Any, a: Tensor, b: Tensor, keepdims: bool) -> Tensor:
    if keepdims:
        raise TypeError(f"{op}: keepdims goes with an axis; {op}(a, b) of two tensors is elementwise")
    return elementwise(a, b)  # type: ignore[no-any-return]


@torch_names
def std(a: Tensor, axis: Axes | None = None, keepdims: bool = False, correction: int = 1) -> Tensor:
    """The standard deviation sqrt(var): z = sqrt(sum_i (a_i - mean)^2 / (N - correction)) over
    ``axis`` (None: every axis); dz/da_i = (a_i - mean) / ((N - correction) z).

    ``correction=1`` (the default, as PyTorch's and ``var``'s) is the square root of the unbiased
    variance, 0 that of the population variance. Built from ``var`` and ``sqrt``, so its gradient
    is their chain rule (infinite where every element is equal, z = 0, as in PyTorch)."""
    reduced_axes(axis, a.ndim, "std")  # so that an error names std, not var
    return var(a, axis=axis, keepdims=keepdims, correction=correction).sqrt()


class Prod(Function):
    """z = prod_i a_i over the axes;  dz/da_i = prod_{j != i} a_j.

    That is z / a_i where no a_j is 0. With zeros it is computed without dividing: where one
    a_j is 0, only that element gets a gradient (the product of the others), and where two or
    more are, none does (every product of the others holds a 0). PyTorch's values, never NaN.
    """

    @staticmethod
    def forward(ctx: Function, a: Array, axis: Axes | None = None, keepdims: bool = False) -> Array:
        axes = reduced_axes(axis, a.ndim, "prod")
        ctx.save_for_backward(a)
        ctx.shape, ctx.axes = a.shape, axes
        return a.prod(axis=axes, keepdims=keepdims)

    @staticmethod
    def backward(ctx: Function, grad: Array) -> Grads:
        (a,) = ctx.saved
        xp, axes = ctx.xp, ctx.axes
        zero = a == 0
        zeros = zero.sum(axis=axes, keepdims=True)
        nonzero = xp.where(zero, 1, a)
        others = nonzero.prod(axis=axes, keepdims=True)  # the product of the nonzero elements
        share = xp.where(zeros == 0, others / nonzero, xp.where(zero & (zeros == 1), others, 0))
        return _expand(xp, grad, ctx.shape, axes) * share.astype(grad.dtype, copy=False)


@torch_names
def prod(a: Tensor, axis: Axes | None = None, keepdims: bool = False) -> Tensor:
    """z = prod_i a_i over ``axis`` (an int, a tuple of ints, or None for every axis); dz/da_i =
    the product of the other elements, correct where some are 0 (see ``Prod``). ``keepdims`` as
    for ``sum``. Integers give int64, as in PyTorch (NumPy's product widens them)."""
    a = amp.in_float32(a)
    if is_low_precision(a.data.dtype):  # multiplied in float32, rounded once
        return prod(a.float(), axis, keepdims).to(a.dtype)
    return Prod.apply(a, axis=axis, keepdims=keepdims)


class LogSumExp(Function):
    """z = log sum_i exp(a_i) over the axes;  dz/da_i = exp(a_i - z), the softmax of a.

    Computed as m + log sum_i exp(a_i - m) with m the largest a_i, the same number, whose
    exponentials are at most 1: exp(1000) overflows, exp(1000 - m) does not.
    """

    @staticmethod
    def forward(ctx: Function, a: Array, axis: Axes | None = None, keepdims: bool = False) -> Array:
        xp = ctx.xp
        axes = reduced_axes(axis, a.ndim, "logsumexp")
        m = a.max(axis=axes, keepdims=True) if a.size else xp.zeros(_keepdims_shape(a.shape, axes), a.dtype)
        m = xp.where(xp.isfinite(m), m, 0)  # a row of -inf (or one inf): nothing to shift
        with _quiet(xp):  # a row of -inf: log 0 = -inf, the right answer
            z = xp.log(xp.exp(a - m).sum(axis=axes, keepdims=True)) + m
        ctx.save_for_backward(a, z)
        ctx.shape, ctx.axes = a.shape, axes
        return z if keepdims else z.reshape(tuple(n for i, n in enumerate(a.shape) if i not in axes))

    @staticmethod
    def backward(ctx: Function, grad: Array) -> Grads:
        a, z = ctx.saved
        return _expand(ctx.xp, grad, ctx.shape, ctx.axes) * ctx.xp.exp(a - z)


@torch_names
def logsumexp(a: Tensor, axis: Axes | None = None, keepdims: bool = False) -> Tensor:
    """z = log sum_i exp(a_i) over ``axis`` (None: every axis), computed without overflow as
    m + log sum_i exp(a_i - m), m the largest; dz/da_i = exp(a_i - z), the softmax along the
    axes. The log-partition function of D2L 4.1's softmax. Integers give float32."""
    a = amp.in_float32(as_float(a))
    if is_low_precision(a.data.dtype):  # summed in float32, rounded once
        return logsumexp(a.float(), axis, keepdims).to(a.dtype)
    return LogSumExp.apply(a, axis=axis, keepdims=keepdims)


class CumSum(Function):
    """z_k = sum_{i <= k} a_i along ``axis``;  dL/da_i = sum_{k >= i} dL/dz_k, the running sum of
    the gradient taken from the other end (reverse, cumsum, reverse)."""

    @staticmethod
    def forward(ctx: Function, a: Array, axis: int) -> Array:
        ctx.axis = axis
        return ctx.xp.cumsum(a, axis=axis)

    @staticmethod
    def backward(ctx: Function, grad: Array) -> Grads:
        xp, axis = ctx.xp, ctx.axis
        return xp.flip(xp.cumsum(xp.flip(grad, axis), axis=axis), axis)


@torch_names
def cumsum(a: Tensor, axis: int) -> Tensor:
    """The running sum along ``axis``: z_k = a_0 + ... + a_k (PyTorch's ``cumsum``, whose ``dim``
    is required too); dL/da_i = sum_{k >= i} dL/dz_k. Integers and booleans give int64, as in
    PyTorch."""
    if a.ndim == 0:  # a number: its own running sum (axis 0 or -1, as PyTorch takes)
        normalize_axis(axis, 1, "cumsum")
        return cumsum(a.reshape(1), 0).reshape(())
    axis = normalize_axis(axis, a.ndim, "cumsum")
    a = amp.in_float32(a)
    if is_low_precision(a.data.dtype):  # summed in float32, each running sum rounded once
        return cumsum(a.float(), axis).to(a.dtype)
    if a.data.dtype.kind in "bi" and a.data.dtype != "int64":
        a = a.astype("int64")
    return CumSum.apply(a, axis=axis)


class Norm(Function):
    """z = (sum_i |a_i|^p)^(1/p) over the axes;  dz/da_i = sign(a_i) |a_i|^(p-1) / z^(p-1).

    For p = 2 that is a_i / z, the vector divided by its length; for p = 1, sign(a_i); for
    p = inf, z = max_i |a_i| and the gradient goes to the largest |a_i| (ties share it, as
    ``max``'s). Where z = 0 (all zeros) the gradient is 0, not 0/0: PyTorch's subgradient.
    """

    @staticmethod
    def forward(ctx: Function, a: Array, p: float, axis: Axes | None = None, keepdims: bool = False) -> Array:
        xp = ctx.xp
        axes = reduced_axes(axis, a.ndim, "norm")
        size = abs(a)
        if p == math.inf:
            z = size.max(axis=axes, keepdims=True) if a.size else xp.zeros(_keepdims_shape(a.shape, axes), a.dtype)
        elif p == 2:
            z = xp.sqrt((a * a).sum(axis=axes, keepdims=True))
        elif p == 1:
            z = size.sum(axis=axes, keepdims=True)
        else:
            z = (size**p).sum(axis=axes, keepdims=True) ** (1 / p)
        ctx.save_for_backward(a, z)
        ctx.p, ctx.shape, ctx.axes = p, a.shape, axes
        return z if keepdims else z.reshape(tuple(n for i, n in enumerate(a.shape) if i not in axes))

    @staticmethod
    def backward(ctx: Function, grad: Array) -> Grads:
        a, z = ctx.saved
        xp, p = ctx.xp, ctx.p
        safe = xp.where(z == 0, 1, z)  # all zeros: any finite z, the share below is 0 anyway
        if p == math.inf:
            top = (abs(a) == z).astype(a.dtype)
            share = xp.sign(a) * top / top.sum(axis=ctx.axes, keepdims=True)
        elif p == 2:
            share = a / safe
        elif p == 1:
            share = xp.sign(a)
        else:
            share = xp.sign(a) * (abs(a) / safe) ** (p - 1)
        share = xp.where(z == 0, 0, share).astype(grad.dtype, copy=False)
        return _expand(xp, grad, ctx.shape, ctx.axes) * share


@torch_names
def norm(a: Tensor, p: float | str = "fro", axis: Axes | None = None, keepdims: bool = False) -> Tensor:
    """The p-norm (sum_i |a_i|^p)^(1/p) over ``axis`` (None: every element, as one long vector);
    by default p = 2 ("fro", the Frobenius norm of a matrix: the length of the vector of its
    elements), PyTorch's ``torch.norm(x)`` (D2L 2.3.11). ``p`` is any number > 0 or
    ``math.inf`` (the largest |a_i|). dz/da_i = sign(a_i) |a_i|^(p-1) / z^(p-1), which is a / z
    for p = 2 and 0 where z = 0. ``keepdims`` as for ``sum``. Integers give float32."""
    if p == "fro":
        p = 2.0
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not p > 0:
        raise ValueError(f"norm: p must be 'fro' or a number > 0 (math.inf for the largest |a_i|), got {p!r}")
    a = amp.in_float32(as_float(a))
    if is_low_precision(a.data.dtype):  # summed in float32, rounded once
        return norm(a.float(), p, axis, keepdims).to(a.dtype)
    return Norm.apply(a, float(p), axis=axis, keepdims=keepdims)


class ArgMax(Function):
    """The position of the largest element along ``axis`` (of all, flattened, when None), int64.
    Not differentiable: a position has no gradient (``differentiable = False``)."""

    differentiable = False

    @staticmethod
    def forward(ctx: Any, a: Array, axis: int | None, keepdims: bool) -> Array:
        return _positions(ctx.xp, a.argmax(axis=axis), axis, keepdims)


class ArgMin(Function):
    """The position of the smallest element along ``axis``, as ``ArgMax``."""

    differentiable = False

    @staticmethod
    def forward(ctx: Any, a: Array, axis: int | None, keepdims: bool) -> Array:
        return _positions(ctx.xp, a.argmin(axis=axis), axis, keepdims)


def _positions(xp: Any, out: Array, axis: int | None, keepdims: bool) -> Array:
    if keepdims and axis is not None:
        out = xp.expand_dims(out, axis)
    return out.astype("int64")


@torch_names
def argmax(a: Tensor, axis: int | None = None, keepdims: bool = False) -> Tensor:
    """Positions of the maxima (an int64 tensor, not differentiable)."""
    if axis is not None:
        axis = normalize_axis(axis, a.ndim, "argmax")
    _some(a, axis, "argmax")
    return ArgMax.apply(a, axis=axis, keepdims=keepdims)


@torch_names
def argmin(a: Tensor, axis: int | None = None, keepdims: bool = False) -> Tensor:
    """Positions of the minima (an int64 tensor, not differentiable)."""
    if axis is not None:
        axis = normalize_axis(axis, a.ndim, "argmin")
    _some(a, axis, "argmin")
    return ArgMin.apply(a, axis=axis, keepdims=keepdims)


class TopKIndices(Function):
    """The positions of the k largest (``largest=False``: smallest) elements along ``axis``, in
    order, int64. Not differentiable. The sort is stable, so of equal elements the first position
    comes first; NaN counts as larger than every number, as in PyTorch."""

    differentiable = False

    @staticmethod
    def forward(ctx: Any, a: Array, k: int, axis: int, largest: bool) -> Array:
        xp = ctx.xp
        keys = a
        if largest:  # a descending order as an ascending sort of keys that reverse the order
            keys = -a if is_floating(a.dtype) else ~a  # (~a = -a - 1 for integers, never overflows)
            if is_floating(a.dtype):
                keys = xp.where(xp.isnan(a), -xp.inf, keys)  # NaN first (ascending sorts put it last)
        order = xp.argsort(keys, axis=axis, kind="stable")
        return xp.take(order, xp.arange(k), axis=axis)


class TakeAlongAxis(Function):
    """z = a at ``indices`` along ``axis`` (NumPy's ``take_along_axis``, PyTorch's ``gather``);
    dL/da: zeros, with dL/dz put back at the positions read (here each is read at most once)."""

    @staticmethod
    def forward(ctx: Function, a: Array, indices: Array, axis: int) -> Array:
        ctx.shape, ctx.indices, ctx.axis = a.shape, indices, axis
        return ctx.xp.take_along_axis(a, indices, axis=axis)

    @staticmethod
    def backward(ctx: Function, grad: Array) -> Grads:
        out = ctx.xp.zeros(ctx.shape, grad.dtype)
        ctx.xp.put_along_axis(out, ctx.indices, grad, axis=ctx.axis)
        return out, None


class Sort(NamedTuple):
    """What ``sort`` returns: the sorted values and the positions they came from (PyTorch's)."""

    values: Tensor
    indices: Tensor


class TopK(NamedTuple):
    """What ``topk`` returns: the values and their positions, as PyTorch's ``topk`` does."""

    values: Tensor
    indices: Tensor


@torch_names
def topk(a: Tensor, k: int, axis: int = -1, largest: bool = True, sorted: bool = True) -> TopK:  # noqa: A002
    """The k largest elements along ``axis`` (``largest=False``: the k smallest) and their
    positions: ``values, indices = mt.topk(logits, 10)``. ``values`` is differentiable: each
    chosen element gets its value's gradient, the others none (as max's maxima do, k = 1).

    Values come in order, largest first (smallest first with ``largest=False``), whatever
    ``sorted`` says (PyTorch leaves the order unspecified when it is False); equal elements in
    the order of their positions.
    """
    axis = normalize_axis(axis, a.ndim, "topk") if a.ndim else 0
    _ordered("topk", a)
    n = a.shape[axis] if a.ndim else 1
    if not isinstance(k, int) or isinstance(k, bool) or not 0 <= k <= n:
        raise ValueError(f"topk: k must be an integer from 0 to {n} (the length of axis {axis}), got {k!r}")
    if a.ndim == 0:  # a number: its own top 1, as in PyTorch
        values, indices = topk(a.reshape(1), k, 0, largest)
        return TopK(values.reshape(()), indices.reshape(())) if k else TopK(values, indices)
    indices = TopKIndices.apply(a, k=k, axis=axis, largest=largest)
    return TopK(TakeAlongAxis.apply(a, indices, axis=axis), indices)


def _ordered(op: str, a: Tensor) -> None:
    """Refuse what ``op`` cannot order: booleans and anything not a float or an integer."""
    if not (is_floating(a.dtype) or a.dtype.kind == "i"):
        raise TypeError(f"{op}: needs a tensor of numbers, got {a.dtype}")


@torch_names
def sort(a: Tensor, axis: int = -1, descending: bool = False, stable: bool = False) -> Sort:
    """The elements along ``axis`` in increasing order (``descending=True``: decreasing) and the
    positions they came from: ``values, indices = mt.sort(x)``, ``values`` differentiable (each
    element's gradient goes back to the position it came from). Always stable: equal elements
    keep the order of their positions (``stable`` is accepted for PyTorch's sake); NaN counts as
    larger than every number, as in PyTorch. D2L 11.2 sorts its random training inputs."""
    _ordered("sort", a)
    if a.ndim == 0:
        return Sort(*topk(a, 1))
    n = a.shape[normalize_axis(axis, a.ndim, "sort")]
    return Sort(*topk(a, n, axis=axis, largest=descending))
