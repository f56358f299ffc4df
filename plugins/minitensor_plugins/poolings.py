"""Built-in attention poolings: scores (..., Q, K) -> weights (..., Q, K).

The contract -- which keys are allowed (``valid_lens``, ``mask``, -inf scores), the
all-zero rows, the ``sums_to_one`` and ``sparse`` attributes -- is in
``minitensor/core/hookspecs.py``. ``allowed_keys`` below implements its masking rule, for a
pooling of your own to reuse.
"""

import math

from minitensor.errors import ShapeError
from minitensor.plugins import check_options

import minitensor as mt
from minitensor import hookimpl, nn


def allowed_keys(scores, valid_lens=None, mask=None):
    """Which keys each query may attend: a bool tensor broadcastable with the scores.

    True where the score is not -inf, the key's position is below the row's valid length,
    and ``mask`` is True. With scores (batch, ..., Q, K):
    valid_lens (batch,) becomes (batch, 1, ..., 1, 1) and (batch, Q) becomes
    (batch, 1, ..., Q, 1), compared with the key positions 0 .. K-1.
    """
    allowed = scores > -math.inf
    if valid_lens is not None:
        if not isinstance(valid_lens, mt.Tensor):
            valid_lens = mt.tensor(valid_lens, device=scores.device)
        n, lens_shape = scores.ndim, tuple(valid_lens.shape)
        if len(lens_shape) == 1 and n >= 2 and lens_shape[0] == scores.shape[0]:
            lens = valid_lens.reshape(lens_shape + (1,) * (n - 1))
        elif len(lens_shape) == 2 and n >= 3 and lens_shape == (scores.shape[0], scores.shape[-2]):
            lens = valid_lens.reshape(lens_shape[:1] + (1,) * (n - 3) + lens_shape[1:] + (1,))
        else:
            raise ShapeError(
                f"valid_lens of shape {lens_shape} does not fit scores of shape {scores.shape}; "
                f"expected (batch,) or (batch, Q) with batch = scores.shape[0] and Q = scores.shape[-2]"
            )
        positions = mt.arange(scores.shape[-1], device=scores.device)
        allowed = allowed & (positions < lens)
    if mask is not None:
        if not isinstance(mask, mt.Tensor):
            mask = mt.tensor(mask, dtype=mt.bool, device=scores.device)
        if mask.dtype.kind != "b":
            raise TypeError(f"mask must be a bool tensor (True = may attend), got {mask.dtype}")
        allowed = allowed & mask
    return allowed


class SoftmaxPooling(nn.Module):
    """weights = masked_softmax(scores):

        alpha(q, k_i) = exp(a(q, k_i)) / sum_{allowed j} exp(a(q, k_j)),  0 for masked keys

    on the fused numba kernels (``minitensor/core/kernels``).
    """

    sparse = False  # every allowed key gets some weight
    sums_to_one = True
    softmax_like = True  # capability (minitensor/core/hookspecs.py): the online softmax computes it

    def __init__(self, **options):
        super().__init__()
        check_options(type(self), options)

    def forward(self, scores, valid_lens=None, mask=None):
        return mt.masked_softmax(scores, valid_lens, mask)


class AveragePooling(nn.Module):
    """D2L 10.2's baseline, average pooling: f(q) = 1/n sum_i v_i, so

        alpha(q, k_i) = 1 / n   for each of the n allowed keys (0 for the others)

    whatever the scores say: the query plays no part (only the mask does). It is what
    attention does before it learns anything, and what Nadaraya-Watson improves on.
    The weights do not depend on the score *values*, so no gradient flows to the scores.
    """

    sparse = False  # every allowed key gets 1 / n
    sums_to_one = True

    def __init__(self, **options):
        super().__init__()
        check_options(type(self), options)

    def forward(self, scores, valid_lens=None, mask=None):
        allowed = allowed_keys(scores, valid_lens, mask).to(scores.dtype)  # 1 or 0
        n = allowed.sum(axis=-1, keepdims=True)
        # n = 0 (nothing allowed): 0 / 1 = 0, the all-zero row the contract asks for.
        return allowed / n.clip(1.0)


class SparsemaxPooling(nn.Module):
    """Sparsemax (Martins & Astudillo, 2016), the Euclidean projection onto the simplex:

        alpha = argmin_{p >= 0, sum p = 1} |p - a|^2 = max(a - tau, 0)

    with the threshold tau making the weights sum to 1. Unlike softmax it gives keys
    scoring below tau weight exactly 0: sparse, easier-to-read attention. See
    ``minitensor/core/ops/sparsemax.py`` for tau and the backward pass.
    """

    sparse = True  # exact zeros below the threshold
    sums_to_one = True

    def __init__(self, **options):
        super().__init__()
        check_options(type(self), options)

    def forward(self, scores, valid_lens=None, mask=None):
        return mt.sparsemax(scores, valid_lens, mask)


class Entmax15Pooling(nn.Module):
    """1.5-entmax (Peters, Niculae & Martins, 2019), halfway between softmax and sparsemax:

        alpha_i = [a_i / 2 - tau]_+^2

    with the threshold tau making the weights sum to 1. Like sparsemax it gives low-scoring
    keys weight exactly 0, but the weights of the others are smoother (quadratic, not
    linear, in the scores). Exact and sort-based: ``minitensor/core/ops/entmax.py``.
    """

    sparse = True
    sums_to_one = True

    def __init__(self, **options):
        super().__init__()
        check_options(type(self), options)

    def forward(self, scores, valid_lens=None, mask=None):
        return mt.entmax15(scores, valid_lens, mask)


class AlphaEntmaxPooling(nn.Module):
    """alpha-entmax (Peters et al., 2019; Correia, Niculae & Martins, 2019): the weight of key i is

        w_i = [(alpha - 1) a_i - tau]_+^(1 / (alpha - 1))

    (w_i is D2L's alpha(q, k_i); alpha here is entmax's exponent).
    alpha -> 1 tends to softmax, alpha = 1.5 is ``entmax15``, alpha = 2 is ``sparsemax``; for
    every alpha > 1 low-scoring keys get weight exactly 0. tau by bisection
    (``minitensor/core/ops/entmax.py``).

    Options: ``alpha`` (default 1.5, must be > 1); ``learn_alpha`` (default False): learn
    alpha by gradient descent ("Adaptively Sparse Transformers"). Then alpha is computed
    from a parameter ``raw`` as

        alpha = 1 + exp(raw),   raw initialised to log(alpha_option - 1),

    so it stays > 1 whatever the optimiser does (in floating point it could round to 1 only
    if training drove alpha - 1 below ~6e-8 in float32, and ``alpha_entmax`` then refuses it
    clearly).
    ``dtype``, ``device``: where ``raw`` is made (float32 on the CPU by default).
    """

    sparse = True
    sums_to_one = True

    def __init__(self, alpha=1.5, learn_alpha=False, dtype=None, device=None, **options):
        super().__init__()
        check_options(type(self), options, ("alpha", "learn_alpha"))
        try:
            alpha = float(alpha)
        except (TypeError, ValueError):
            raise TypeError(f"{type(self).__name__}: alpha must be a number > 1, got {alpha!r}") from None
        if not alpha > 1:
            raise ValueError(
                f"{type(self).__name__}: alpha must be > 1, got {alpha} "
                "(alpha = 1 is softmax: use the 'softmax' pooling)"
            )
        self.learn_alpha = bool(learn_alpha)
        if self.learn_alpha:
            raw = math.log(alpha - 1)
            self.raw = nn.Parameter(mt.tensor(raw, dtype=dtype or mt.float32, device=device or "cpu"))
        else:
            self.fixed_alpha = alpha

    @property
    def alpha(self):
        """The current alpha: a float, or a 0-d Tensor (in the graph) with ``learn_alpha``."""
        return 1 + self.raw.exp() if self.learn_alpha else self.fixed_alpha

    def forward(self, scores, valid_lens=None, mask=None):
        return mt.alpha_entmax(scores, self.alpha, valid_lens, mask)


@hookimpl
def minitensor_poolings():
    return {
        "softmax": SoftmaxPooling,
        "average": AveragePooling,
        "sparsemax": SparsemaxPooling,
        "entmax15": Entmax15Pooling,
        "alpha_entmax": AlphaEntmaxPooling,
    }
