"""sparsemax (Martins & Astudillo, 2016): like softmax, but with exact zeros.

softmax never gives a key exactly zero weight; sparsemax is the Euclidean projection of the
scores z onto the probability simplex,

    sparsemax(z) = argmin_{p >= 0, sum p = 1} |p - z|^2 = max(z - tau, 0),

where the threshold tau is the one number that makes the weights sum to 1. Keys scoring
below tau get weight exactly 0, so the attention is *sparse*: only a few keys are read.

Finding tau (sort-based, O(K log K) per row). Sort the scores in decreasing order,
z_(1) >= z_(2) >= ... >= z_(K). Key (j) is in the support when

    1 + j z_(j) > z_(1) + ... + z_(j),

which holds for j = 1 .. k and fails after; then tau = (z_(1) + ... + z_(k) - 1) / k.

Backward. On the support S (the keys with p > 0) p = z - tau with tau the mean of z over S
minus 1/|S|, so the Jacobian is diag(s) - s s^T / |S| (s the 0/1 support indicator), and

    dL/dz = s * (g - mean_{j in S} g_j),

zero outside the support. Masked keys (``valid_lens``, ``mask``, or a score of -inf) are
simply not candidates: they are left out of the sort's support and get weight 0 and no
gradient; a row with no candidate left gets all-zero weights (never NaN).
"""

from __future__ import annotations

import math
from typing import Any

from ..autograd import Function, Grads
from ..tensor import Array, Tensor
from .softmax import apply_mask, as_mask_tensors, lens_per_row


def candidate_rows(
    xp: Any, x: Array, valid_lens: Array | None, mask: Array | None, op: str
) -> tuple[Array, Array, tuple[int, ...]]:
    """The scores as a (rows, K) matrix, the bool matrix of allowed keys (the candidates),
    and the scores' shape; shared by the sparse maps (sparsemax, entmax).

    Disallowed keys (beyond ``valid_lens``, where ``mask`` is False, or scoring -inf) are
    replaced by 0 *and* flagged, so no inf ever enters the sums (inf - inf would be NaN);
    the flag keeps them out of the support."""
    if mask is not None:
        x = apply_mask(xp, x, mask, op)
    shape = x.shape  # a mask may broadcast the scores up (backward sums it back)
    K, rows = shape[-1], math.prod(shape[:-1])
    z = xp.ascontiguousarray(x).reshape(rows, K)
    allowed = z > -xp.inf  # -inf scores (and masked keys, set to -inf above) are out
    if valid_lens is not None:
        lens = lens_per_row(xp, valid_lens, shape, op)
        allowed = allowed & (xp.arange(K)[None, :] < lens[:, None])
    return xp.where(allowed, z, 0), allowed, shape


def sorted_candidates(xp: Any, z: Array, allowed: Array) -> tuple[Array, Array]:
    """Each row of ``z`` sorted in decreasing order with its disallowed keys last (as 0), and
    the flags of the allowed ones in that order."""
    z_sorted = -xp.sort(xp.where(allowed, -z, xp.inf), axis=-1)  # disallowed sort as -inf
    allowed_sorted = z_sorted > -xp.inf
    return xp.where(allowed_sorted, z_sorted, 0), allowed_sorted


class Sparsemax(Function):
    """p = sparsemax(x) over the last axis;  dL/dx = s * (g - mean_S(g)), s = (p > 0)."""

    @staticmethod
    def forward(ctx: Function, x: Array, valid_lens: Array | None = None, mask: Array | None = None) -> Array:
        xp = ctx.xp
        z, allowed, shape = candidate_rows(xp, x, valid_lens, mask, "sparsemax")
        K = shape[-1]
        z_sorted, allowed_sorted = sorted_candidates(xp, z, allowed)
        cumsum = xp.cumsum(z_sorted, axis=-1)
        j = xp.arange(1, K + 1, dtype=z.dtype)
        in_support = allowed_sorted & (1 + j * z_sorted > cumsum)  # True for j = 1 .. k
        k = in_support.sum(axis=-1, keepdims=True)  # support size; 0 for an empty row
        # tau = (z_(1) + ... + z_(k) - 1) / k; for k = 0 any value does (the row is zeroed)
        top_sum = (z_sorted * in_support).sum(axis=-1, keepdims=True)
        tau = (top_sum - 1) / xp.maximum(k, 1).astype(z.dtype)
        p = xp.where(allowed, xp.maximum(z - tau, 0), 0)
        ctx.save_for_backward(p)
        return p.reshape(shape)

    @staticmethod
    def backward(ctx: Function, grad: Array) -> Grads:
        (p,) = ctx.saved
        xp = ctx.xp
        g = grad.reshape(p.shape)
        s = (p > 0).astype(g.dtype)
        size = xp.maximum(s.sum(axis=-1, keepdims=True), 1)  # |S|, 1 for an empty row
        mean_g = (s * g).sum(axis=-1, keepdims=True) / size
        return (s * (g - mean_g)).reshape(grad.shape), None, None


def sparsemax(x: Tensor, valid_lens: Tensor | None = None, mask: Tensor | None = None) -> Tensor:
    """Sparsemax over the last axis, keeping only valid keys (see ``Sparsemax``).

    ``valid_lens`` (batch,) or (batch, Q) and ``mask`` (bool, True = may attend) as in
    ``masked_softmax``. Weights sum to 1 on every row with an allowed key, with exact zeros.
    """
    valid_lens, mask = as_mask_tensors(x, valid_lens, mask)
    return Sparsemax.apply(x, valid_lens, mask)
