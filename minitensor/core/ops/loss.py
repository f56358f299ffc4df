"""Cross-entropy for classification and sequence models, fused with log_softmax.

For logits z (..., C) and an integer target t per position, with optional label smoothing e:

    q = (1 - e) onehot(t) + e / C            (the target distribution)
    loss_i = -sum_c q_c log softmax(z_i)_c
    dloss_i/dz_i = softmax(z_i) - q

Positions whose target equals ``ignore_index`` or where ``mask`` is False (padding) count
for nothing; ``reduction="mean"`` averages over the *valid* positions only, as D2L's masked
loss does per token. With no valid position at all the loss is 0 and so is its gradient
(not 0/0 = NaN).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy

from .. import amp
from ..autograd import Function, Grads
from ..dtypes import compute_dtype
from ..errors import ShapeError
from ..tensor import Array, Tensor
from .indexing import in_range
from .promote import full_precision


class CrossEntropy(Function):
    @staticmethod
    def forward(
        ctx: Function,
        logits: Array,
        target: Array,
        mask: Array | None,
        ignore_index: int,
        reduction: str,
        label_smoothing: float,
    ) -> Array:
        xp = ctx.xp
        num_classes = logits.shape[-1]
        # float16 and bfloat16 logits are computed in float32 (log-probabilities and the sum over
        # positions, which in float16 would overflow past 65,504 and in bfloat16 stop growing at
        # 256 ones), as PyTorch does; the results are rounded back to the logits' dtype
        ctx.dtype = logits.dtype
        work = compute_dtype(logits.dtype)
        rows = xp.ascontiguousarray(logits, dtype=work).reshape(-1, num_classes)
        t = target.reshape(-1)
        valid = t != ignore_index
        if mask is not None:
            valid = valid & xp.broadcast_to(mask, target.shape).reshape(-1)
        safe_t = xp.where(valid, t, 0)
        # checked on the device, without waiting for it (Backend.check: raised at the next read)
        inside = in_range(safe_t, num_classes)
        ctx.backend.check(inside.all(), partial(_out_of_range, safe_t, inside, num_classes, ignore_index))
        if not ctx.backend.on_host:
            safe_t = xp.where(inside, safe_t, 0)  # until it raises, a bad target counts as class 0
        logp = ctx.backend.kernels.log_softmax_forward(rows)
        positions = xp.arange(t.size)  # kept for backward, which writes where this reads
        picked = logp[positions, safe_t]
        if label_smoothing:
            per_row = -(1 - label_smoothing) * picked - label_smoothing * logp.mean(axis=-1)
        else:
            per_row = -picked
        weight = valid.astype(work)
        per_row = xp.where(valid, per_row, 0)
        if reduction == "mean":
            # the number of valid positions stays on the device (read, it would make the host wait)
            count = xp.maximum(valid.sum(), 1).astype(work)
            weight = weight / count
            out = per_row.sum() / count
        elif reduction == "sum":
            out = per_row.sum()
        else:
            out = per_row.reshape(target.shape)
        ctx.save_for_backward(logp, positions, safe_t, weight)
        ctx.reduction, ctx.smoothing, ctx.shape = reduction, label_smoothing, logits.shape
        return out.astype(logits.dtype, copy=False)  # (a copy only where the dtype changes)

    @staticmethod
    def backward(ctx: Function, grad: Array) -> Grads:
        xp = ctx.xp
        logp, positions, t, weight = ctx.saved
        num_classes = logp.shape[-1]
        d = xp.exp(logp)  # softmax
        d[positions, t] -= 1 - ctx.smoothing
        if ctx.smoothing:
            d -= ctx.smoothing / num_classes
        scale = weight * (grad.reshape(-1) if ctx.reduction == "none" else grad)
        return (d * scale[:, None]).reshape(ctx.shape).astype(ctx.dtype, copy=False), None, None


def _out_of_range(safe_t: Array, inside: Array, num_classes: int, ignore_index: int) -> str:
    """The message of CrossEntropy's check (read from the device only when it fails)."""
    return (
        f"cross_entropy: target {int(safe_t[~inside][0])} is out of range for {num_classes} classes "
        f"(valid: 0..{num_classes - 1}, or ignore_index={ignore_index})"
    )


def cross_entropy(
    logits: Tensor,
    target: Tensor,
    ignore_index: int = -100,
    mask: Tensor | None = None,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
) -> Tensor:
    """Cross-entropy between ``logits`` (..., C) and integer class ``target`` (...).

    ``ignore_index``: target value that marks padding (PyTorch's default -100).
    ``mask``: optional bool tensor of the target's shape, True = this position counts.
    ``reduction``: "mean" over valid positions, "sum", or "none" (per position, 0 where ignored).
    ``label_smoothing``: e in [0, 1), see the module docstring.
    """
    logits = full_precision("cross_entropy", logits)
    if not isinstance(target, Tensor):
        target = Tensor._make(logits._backend.array(target), logits._backend, None)
    if target.dtype.kind not in "iu":
        raise TypeError(f"cross_entropy: target must hold integer class indices, got {target.dtype}")
    if tuple(logits.shape[:-1]) != tuple(target.shape):
        torch_layout = logits.ndim >= 3 and tuple(target.shape) == tuple(logits.shape[:1] + logits.shape[2:])
        raise ShapeError(
            f"cross_entropy: logits of shape {logits.shape} need a target of shape {logits.shape[:-1]}, "
            f"got {target.shape}"
            + (
                "; the classes are the last axis of the logits here, where PyTorch reads axis 1: "
                "for logits laid out (N, C, d), pass logits.permute(0, 2, 1)"
                if torch_layout
                else ""
            )
        )
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"cross_entropy: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    if not 0.0 <= label_smoothing < 1.0:
        raise ValueError(f"cross_entropy: label_smoothing must be in [0, 1), got {label_smoothing}")
    if mask is not None and not isinstance(mask, Tensor):
        mask = Tensor._make(logits._backend.array(mask, "bool"), logits._backend, None)
    return CrossEntropy.apply(logits, target, mask, ignore_index, reduction, label_smoothing)


def mse_loss(input: Tensor, target: Tensor | Any, reduction: str = "mean") -> Tensor:  # noqa: A002
    """The squared error (input - target)^2 of D2L 3.1.1, elementwise, then averaged ("mean"),
    summed ("sum") or kept ("none"): PyTorch's ``mse_loss``. A composition of ops (``sub``,
    ``mul``, ``mean``), so its gradient, 2 (input - target) / n for the mean, is theirs.

    The target may broadcast to the input's shape (a number, say), never beyond it: predictions
    of shape (n, 1) against targets of shape (n,) would broadcast to (n, n), every prediction
    compared with every target, a wrong loss that still decreases. PyTorch warns there; this is
    a ShapeError."""
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"mse_loss: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    shape, target_shape = tuple(input.shape), tuple(target.shape) if isinstance(target, Tensor) else numpy.shape(target)
    try:
        both = numpy.broadcast_shapes(shape, target_shape)
    except ValueError:
        both = None  # (checked here so that the error names mse_loss, not the subtraction inside it)
    if both != shape:
        meet = "do not fit" if both is None else f"broadcast to {both}, comparing each prediction with several targets"
        raise ShapeError(
            f"mse_loss: input of shape {shape} and target of shape {target_shape} {meet}; give the target the "
            f"input's shape" + ("" if both is None else f" (target.reshape{shape})")
        )
    diff = amp.in_float32(input) - target
    error = diff * diff
    return error if reduction == "none" else error.mean() if reduction == "mean" else error.sum()
