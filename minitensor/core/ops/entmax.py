"""alpha-entmax (Peters, Niculae & Martins, 2019): between softmax and sparsemax.

softmax (alpha = 1) and sparsemax (alpha = 2) are two members of one family,

    alpha-entmax(z) = argmax_{p >= 0, sum p = 1} p.z + H_alpha(p),
    H_alpha(p) = sum_i (p_i - p_i^alpha) / (alpha (alpha - 1))   (Tsallis entropy),

whose solution is

    p_i = [(alpha - 1) z_i - tau]_+ ^ (1 / (alpha - 1))

with the threshold tau the one number making the weights sum to 1. For every alpha > 1
keys scoring low enough get weight exactly 0 (sparse attention); as alpha -> 1 the map tends
to softmax, and alpha = 2 is sparsemax.

entmax15 (alpha = 1.5, exact, sort-based; "Sparse Sequence-to-Sequence Models", ACL 2019,
Algorithm 2). With z = x / 2, p_i = [z_i - tau]_+^2. Sort decreasing, z_(1) >= ... >= z_(K);
if the support were the top k keys, sum_{j<=k} (z_(j) - tau)^2 = 1 gives

    tau_k = M_k - sqrt(max((1 - k (M2_k - M_k^2)) / k, 0)),

M_k = mean of z_(1..k), M2_k = mean of their squares (the smaller root, so that every
z_(j) - tau_k >= 0 for j <= k). The support is the keys j with tau_j <= z_(j) (true for
j = 1 .. k, false after) and tau = tau_k. The scores are shifted by their maximum first
(entmax is shift-invariant) so nothing overflows.

alpha_entmax (any alpha > 1; "Adaptively Sparse Transformers", EMNLP 2019): tau by
bisection. With X = (alpha - 1) z shifted so that max X = 0, the sum of the weights is 1 at
tau = -1 or above (the top key alone gives 1^(...) = 1) and at most 1 at
tau = -(1/d)^(alpha - 1), d the number of allowed keys (every key gives at most 1/d), so tau
lies in a bracket of width < 1. ``BISECTION_STEPS`` = 60 halvings leave a bracket narrower
than 2^-60 ~ 1e-18, below the float64 spacing of the numbers near tau for all practical
alpha; the weights at the midpoint are then divided by their sum, so they sum to 1 to
rounding.

Backward. On the support S, dp_i/dz_j = g'_i (delta_ij - g'_j / sum_S g'), with
g' = p^(2 - alpha) (sqrt(p) for 1.5-entmax; the 0/1 support indicator for sparsemax), so

    dL/dz = g' * g - g' * (sum g' g) / (sum g'),

zero outside the support. The derivative with respect to alpha (Correia, Niculae & Martins,
2019, appendix; the reference ``entmax`` package's EntmaxBisectFunction), with
S_i = p_i log p_i (0 where p_i = 0), H = sum S and p~ = g' / sum g':

    dL/dalpha = sum_i g_i [ (p_i - p~_i) / (alpha - 1)^2 - (S_i - p~_i H) / (alpha - 1) ],

summed over every row (one alpha is shared by all rows).

Masking exactly as ``sparsemax``: keys beyond ``valid_lens``, where ``mask`` is False, or
scoring -inf are not candidates; they get weight 0 and no gradient, and a row with no
candidate left gets all-zero weights (never NaN).
"""

from __future__ import annotations

from typing import Any

from ..autograd import Function, Grads
from ..errors import ShapeError
from ..tensor import Array, Tensor
from .softmax import as_mask_tensors
from .sparsemax import candidate_rows, sorted_candidates

BISECTION_STEPS = 60  # bracket width < 2^-60: float64 accuracy (see the module docstring)


def _grad_x(xp: Any, gppr: Array, g: Array) -> Array:
    """dL/dz = g' g - g' (sum g' g) / (sum g'), row by row; zero on empty rows."""
    total = gppr.sum(axis=-1, keepdims=True)
    q = (gppr * g).sum(axis=-1, keepdims=True) / xp.where(total > 0, total, 1)
    return gppr * g - gppr * q


class Entmax15(Function):
    """p = 1.5-entmax(x) over the last axis (exact, sort-based);  g' = sqrt(p)."""

    @staticmethod
    def forward(ctx: Function, x: Array, valid_lens: Array | None = None, mask: Array | None = None) -> Array:
        xp = ctx.xp
        z, allowed, shape = candidate_rows(xp, x, valid_lens, mask, "entmax15")
        K = shape[-1]
        if K == 0:  # rows of no key: nothing to weigh
            ctx.save_for_backward(z)
            return z.reshape(shape)
        z = z / 2
        z_sorted, allowed_sorted = sorted_candidates(xp, z, allowed)
        top = z_sorted[:, :1]  # the row maximum (0 on an empty row)
        z, z_sorted = z - top, (z_sorted - top) * allowed_sorted
        j = xp.arange(1, K + 1, dtype=z.dtype)
        mean = xp.cumsum(z_sorted, axis=-1) / j
        mean_sq = xp.cumsum(z_sorted * z_sorted, axis=-1) / j
        delta = (1 - j * (mean_sq - mean * mean)) / j
        tau = mean - xp.sqrt(xp.maximum(delta, 0))  # tau_k, k = 1 .. K
        in_support = allowed_sorted & (tau <= z_sorted)  # True for k = 1 .. support size
        k = in_support.sum(axis=-1, keepdims=True)
        tau_star = xp.take_along_axis(tau, xp.maximum(k - 1, 0), axis=-1)
        p = xp.where(allowed, xp.maximum(z - tau_star, 0) ** 2, 0)
        ctx.save_for_backward(p)
        return p.reshape(shape)

    @staticmethod
    def backward(ctx: Function, grad: Array) -> Grads:
        (p,) = ctx.saved
        xp = ctx.xp
        g = grad.reshape(p.shape)
        return _grad_x(xp, xp.sqrt(p), g).reshape(grad.shape), None, None


class AlphaEntmax(Function):
    """p = alpha-entmax(x) over the last axis, tau by bisection;  g' = p^(2 - alpha).

    ``alpha`` is a Python float or a one-element array (a Tensor, which may require grad).
    """

    @staticmethod
    def forward(
        ctx: Function, x: Array, alpha: float, valid_lens: Array | None = None, mask: Array | None = None
    ) -> Array:
        xp = ctx.xp
        z, allowed, shape = candidate_rows(xp, x, valid_lens, mask, "alpha_entmax")
        if isinstance(alpha, (int, float)):
            am1 = float(alpha) - 1.0  # a Python float keeps the scores' dtype
            ctx.alpha_shape = None
        else:
            if alpha.size != 1:
                raise ShapeError(f"alpha_entmax: alpha must be one number, got shape {tuple(alpha.shape)}")
            ctx.alpha_shape = alpha.shape
            am1 = alpha.reshape(()).astype(z.dtype) - 1
            if not float(am1) > 0:  # one explicit sync: a clear error instead of NaN weights
                raise ValueError(f"alpha_entmax: alpha must be > 1, got {float(am1) + 1}")
        ctx.am1 = am1
        if shape[-1] == 0:  # rows of no key: nothing to weigh
            ctx.save_for_backward(z)
            return z.reshape(shape)
        X = z * am1
        top = xp.max(xp.where(allowed, X, -xp.inf), axis=-1, keepdims=True)
        top = xp.where(allowed.any(axis=-1, keepdims=True), top, 0)
        # Shifted so that max X = 0; disallowed keys at -2, below any tau tried (>= -1), so
        # they get [X - tau]_+ = 0 exactly.
        X = xp.where(allowed, X - top, -2)
        d = xp.maximum(allowed.sum(axis=-1, keepdims=True), 1).astype(z.dtype)
        power = 1 / am1

        def weights(tau: Array) -> Array:
            return xp.maximum(X - tau, 0) ** power

        tau_lo = xp.full(d.shape, -1, dtype=z.dtype)  # sum of weights >= 1 here
        width = 1 - (1 / d) ** am1  # tau_hi = -(1/d)^(alpha - 1): sum <= 1 there
        for _ in range(BISECTION_STEPS):
            width = width / 2
            tau_mid = tau_lo + width
            tau_lo = xp.where(weights(tau_mid).sum(axis=-1, keepdims=True) >= 1, tau_mid, tau_lo)
        p = xp.where(allowed, weights(tau_lo + width / 2), 0)
        total = p.sum(axis=-1, keepdims=True)
        p = p / xp.where(total > 0, total, 1)
        ctx.save_for_backward(p)
        return p.reshape(shape)

    @staticmethod
    def backward(ctx: Function, grad: Array) -> Grads:
        (p,) = ctx.saved
        xp, am1 = ctx.xp, ctx.am1
        g = grad.reshape(p.shape)
        support = p > 0
        gppr = xp.where(support, xp.where(support, p, 1) ** (1 - am1), 0)  # p^(2 - alpha)
        dx = _grad_x(xp, gppr, g).reshape(grad.shape)
        d_alpha = None
        if ctx.alpha_shape is not None and ctx.needs_input_grad[1]:
            S = xp.where(support, p * xp.log(xp.where(support, p, 1)), 0)
            ent = S.sum(axis=-1, keepdims=True)
            total = gppr.sum(axis=-1, keepdims=True)
            skewed = gppr / xp.where(total > 0, total, 1)
            d = g * ((p - skewed) / (am1 * am1) - (S - skewed * ent) / am1)
            d_alpha = d.sum(keepdims=True).reshape(ctx.alpha_shape)
        return dx, d_alpha, None, None


def entmax15(x: Tensor, valid_lens: Tensor | None = None, mask: Tensor | None = None) -> Tensor:
    """1.5-entmax over the last axis, keeping only valid keys (see ``Entmax15``).

    ``valid_lens`` (batch,) or (batch, Q) and ``mask`` (bool, True = may attend) as in
    ``masked_softmax``. Weights sum to 1 on every row with an allowed key, with exact zeros.
    """
    valid_lens, mask = as_mask_tensors(x, valid_lens, mask)
    return Entmax15.apply(x, valid_lens, mask)


def alpha_entmax(x: Tensor, alpha: float, valid_lens: Tensor | None = None, mask: Tensor | None = None) -> Tensor:
    """alpha-entmax over the last axis, keeping only valid keys (see ``AlphaEntmax``).

    ``alpha`` > 1: a float, or a one-element Tensor (which may require grad: alpha can be
    learned). alpha -> 1 tends to softmax, 1.5 is ``entmax15``, 2 is ``sparsemax``.
    ``valid_lens`` and ``mask`` as in ``masked_softmax``.
    """
    if not isinstance(alpha, Tensor):
        try:
            alpha = float(alpha)
        except (TypeError, ValueError):
            raise TypeError(f"alpha_entmax: alpha must be a number or a Tensor, got {type(alpha).__name__}") from None
        if not alpha > 1:
            raise ValueError(
                f"alpha_entmax: alpha must be > 1, got {alpha} (alpha = 1 is softmax: use mt.masked_softmax)"
            )
    valid_lens, mask = as_mask_tensors(x, valid_lens, mask)
    return AlphaEntmax.apply(x, alpha, valid_lens, mask)
