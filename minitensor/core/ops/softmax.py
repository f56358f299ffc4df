"""softmax, log_softmax and masked_softmax, on the fused kernels of the tensor's backend.

softmax(x)_j = exp(x_j - m) / sum_k exp(x_k - m), with m = max_k x_k (subtracting m changes
nothing mathematically and keeps exp from overflowing). Its backward, with y = softmax(x):

    dL/dx_j = y_j (g_j - sum_k g_k y_k)

log_softmax(x)_j = x_j - m - log sum_k exp(x_k - m), with backward
dL/dx_j = g_j - softmax(x)_j sum_k g_k.

Masking (D2L's ``masked_softmax``) sets the scores of keys that may not be attended to
-inf, so their weight exp(-inf) = 0. A row where *no* key may be attended gets all-zero
weights: D2L's -1e6 trick gives uniform weights there instead, and PyTorch's -inf gives NaN.

The kernels work on C-contiguous 2-D arrays (rows, n) along the last axis, so these
Functions first move ``axis`` to the end and flatten the rest.
"""

from __future__ import annotations

import math
from typing import Any

import numpy

from ..autograd import Function, Grads
from ..dtypes import is_low_precision
from ..errors import ShapeError
from ..tensor import Array, Tensor
from .axes import normalize_axis, torch_names
from .promote import full_precision


def run_rows(backend: Any, name: str, x: Array, *rest: Any) -> Array:
    """The backend's row kernel ``name`` (``softmax_forward``, ``log_softmax_backward``, ...: the
    contract of kernels/cpu.py) on the rows ``x``, for every float dtype. The kernels are compiled
    for float32 and float64; float16 and bfloat16 rows go through float32 and the result is rounded
    once, as PyTorch computes a half-precision softmax (its exponentials and sums in float32)."""
    kernel = getattr(backend.kernels, name)
    if not is_low_precision(x.dtype):
        return kernel(x, *rest)
    rest = tuple(backend.astype(a, numpy.float32) if getattr(a, "dtype", None) == x.dtype else a for a in rest)
    return backend.astype(kernel(backend.astype(x, numpy.float32), *rest), x.dtype)


def as_rows(x: Array) -> Array:
    """``x`` (..., n) as a (rows, n) matrix; reshape(-1, n) cannot say how many rows when n is 0."""
    return x.reshape(math.prod(x.shape[:-1]), x.shape[-1])


def _to_rows(xp: Any, x: Array, axis: int) -> tuple[Array, tuple[tuple[int, ...], int]]:
    """View ``x`` as a contiguous (rows, n) matrix with ``axis`` (0..ndim-1) last; return how to undo it."""
    if axis != x.ndim - 1:
        x = xp.moveaxis(x, axis, -1)
    shape = x.shape
    rows = as_rows(xp.ascontiguousarray(x)) if shape else x.reshape(1, 1)
    return rows, (shape, axis)


def _from_rows(xp: Any, rows: Array, layout: tuple[tuple[int, ...], int]) -> Array:
    shape, axis = layout
    out = rows.reshape(shape)
    if axis != len(shape) - 1:
        out = xp.moveaxis(out, -1, axis)
    return out


class Softmax(Function):
    """y = softmax(x) along ``axis``;  dL/dx = y * (g - sum(g * y))."""

    kernel = "softmax"  # the backend kernels ``<kernel>_forward`` / ``<kernel>_backward``

    @staticmethod
    def forward(ctx: Function, x: Array, axis: int = -1) -> Array:
        axis = normalize_axis(axis, x.ndim, ctx.kernel)  # the kernel's name is the op's
        rows, ctx.layout = _to_rows(ctx.xp, x, axis)
        y = run_rows(ctx.backend, ctx.kernel + "_forward", rows)
        ctx.save_for_backward(y)
        return _from_rows(ctx.xp, y, ctx.layout)

    @staticmethod
    def backward(ctx: Function, grad: Array) -> Grads:
        (y,) = ctx.saved
        g, _ = _to_rows(ctx.xp, grad, ctx.layout[1])
        dx = run_rows(ctx.backend, ctx.kernel + "_backward", y, g)
        return _from_rows(ctx.xp, dx, ctx.layout)


class LogSoftmax(Softmax):
    """y = log_softmax(x) along ``axis``;  dL/dx = g - exp(y) * sum(g).

    The same plumbing as Softmax (rows in, rows out) on the log-softmax kernels.
    """

    kernel = "log_softmax"


def lens_per_row(xp: Any, valid_lens: Array, shape: tuple[int, ...], op: str = "masked_softmax") -> Array:
    """D2L's ``valid_lens`` as one length per row of scores of ``shape`` (..., Q, K).

    valid_lens (batch,): every query of batch b sees the first valid_lens[b] keys.
    valid_lens (batch, Q): query q of batch b sees the first valid_lens[b, q] keys.
    Axes in between (attention heads) share the lengths.
    """
    lead = shape[:-1]
    if valid_lens.ndim == 0 or valid_lens.ndim > len(lead) or valid_lens.shape[0] != lead[0]:
        raise ShapeError(
            f"{op}: valid_lens of shape {tuple(valid_lens.shape)} does not fit scores of "
            f"shape {tuple(shape)}; expected (batch,) = ({lead[0]},) or (batch, Q) = ({lead[0]}, {lead[-1]})"
        )
    if valid_lens.dtype.kind not in "iu":
        raise TypeError(f"{op}: valid_lens must be integers, got {valid_lens.dtype}")
    # batch first, the remaining axes of valid_lens aligned with the last axes of `lead`
    middle = len(lead) - valid_lens.ndim
    lens = valid_lens.reshape(valid_lens.shape[:1] + (1,) * middle + valid_lens.shape[1:])
    try:
        lens = xp.broadcast_to(lens, lead)
    except ValueError:
        raise ShapeError(
            f"{op}: valid_lens of shape {tuple(valid_lens.shape)} does not broadcast to the scores' rows {tuple(lead)}"
        ) from None
    return xp.ascontiguousarray(lens.reshape(-1).astype("int64", copy=False))  # a copy only when needed


def apply_mask(xp: Any, scores: Array, mask: Array, op: str = "masked_softmax") -> Array:
    """``scores`` with -inf wherever the bool ``mask`` is False (True = may attend)."""
    if mask.dtype.kind != "b":
        raise TypeError(f"{op}: mask must be a bool tensor (True = keep), got {mask.dtype}")
    try:
        return xp.where(mask, scores, -xp.inf)
    except ValueError:
        raise ShapeError(
            f"{op}: mask of shape {tuple(mask.shape)} does not broadcast to scores of shape {tuple(scores.shape)}"
        ) from None


def as_mask_tensors(x: Tensor, valid_lens: Any, mask: Any) -> tuple[Tensor | None, Tensor | None]:
    """``valid_lens`` and ``mask`` given as lists or arrays -> Tensors on ``x``'s backend."""
    if valid_lens is not None and not isinstance(valid_lens, Tensor):
        valid_lens = Tensor._make(x._backend.array(valid_lens), x._backend, None)
    if mask is not None and not isinstance(mask, Tensor):
        mask = Tensor._make(x._backend.array(mask, "bool"), x._backend, None)
    return valid_lens, mask


class MaskedSoftmax(Function):
    """Softmax over the last axis in which masked-out keys get weight exactly 0.

    ``valid_lens``: see ``lens_per_row``. ``mask``: bool, broadcastable to the scores,
    True = may attend. A row with no key left gets zeros (never NaN, never uniform).
    Backward is softmax's: masked positions have y = 0, so they receive no gradient.
    """

    @staticmethod
    def forward(ctx: Function, x: Array, valid_lens: Array | None = None, mask: Array | None = None) -> Array:
        xp = ctx.xp
        if mask is not None:
            x = apply_mask(xp, x, mask)
        rows, ctx.layout = _to_rows(xp, x, normalize_axis(-1, x.ndim, "masked_softmax"))
        lens = None if valid_lens is None else lens_per_row(xp, valid_lens, x.shape)
        y = run_rows(ctx.backend, "softmax_forward", rows, lens)
        ctx.save_for_backward(y)
        return y.reshape(x.shape)

    @staticmethod
    def backward(ctx: Function, grad: Array) -> Grads:
        (y,) = ctx.saved
        g, _ = _to_rows(ctx.xp, grad, grad.ndim - 1)
        return run_rows(ctx.backend, "softmax_backward", y, g).reshape(grad.shape), None, None


@torch_names
def softmax(x: Tensor, axis: int = -1) -> Tensor:
    """softmax(x)_i = exp(x_i) / sum_j exp(x_j) along ``axis`` (the last by default): weights,
    each at least 0, that sum to 1 (D2L 3.4 / 4.1, softmax regression).

    Computed as exp(x_i - m) / sum_j exp(x_j - m) with m = max_j x_j, which is the same
    number and never overflows. Backward, with y = softmax(x) and g = dL/dy:
    dL/dx_i = y_i (g_i - sum_j g_j y_j). Same shape as ``x``; a masked version for attention
    is ``masked_softmax``.
    """
    return Softmax.apply(full_precision("softmax", x), axis=axis)


@torch_names
def log_softmax(x: Tensor, axis: int = -1) -> Tensor:
    """log_softmax(x)_i = x_i - log sum_j exp(x_j) along ``axis`` (the last by default), computed
    as x_i - m - log sum_j exp(x_j - m) with m = max_j x_j, so no exp overflows.

    The log-probabilities a cross-entropy loss needs, without the round trip through a
    softmax that underflows to log 0. Backward: dL/dx_i = g_i - softmax(x)_i sum_j g_j.
    """
    return LogSoftmax.apply(full_precision("log_softmax", x), axis=axis)


def masked_softmax(x: Tensor, valid_lens: Tensor | None = None, mask: Tensor | None = None) -> Tensor:
    """D2L's ``masked_softmax`` (10.3 / 11.3): softmax over the last axis of the scores ``x``
    (..., Q, K) in which the keys a query may not attend get weight exactly 0.

    ``valid_lens`` (integers): (batch_size,) -- every query of example b sees the first
    valid_lens[b] keys -- or (batch_size, Q), one length per query; axes in between (heads)
    share them. ``mask``: bool, broadcastable to x, True = may attend. Either may be a list or
    array. A query with no key left gets all-zero weights (never NaN, never uniform). Returns
    weights of x's shape; masked keys receive no gradient.
    """
    return MaskedSoftmax.apply(full_precision("masked_softmax", x), *as_mask_tensors(x, valid_lens, mask))
