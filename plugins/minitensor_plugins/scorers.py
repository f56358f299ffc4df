"""Built-in attention scoring functions: score(q, k) for every query-key pair.

The contract -- what a scorer is built with, takes and returns, what a score of -inf means,
how options arrive -- is in ``minitensor/core/hookspecs.py``.

An attention weight is a pooling of these scores, usually softmax: alpha(q, k_i) =
exp(a(q, k_i)) / sum_j exp(a(q, k_j)). So every scorer below is an *unnormalised log
weight*; the kernel scorers make that literal, score = log K(q - k), and then softmax gives
Nadaraya-Watson's K(q - k_i) / sum_j K(q - k_j). Each refuses options it does not know
(``check_options``).
"""

import math

import numpy as np
from minitensor.plugins import check_options

import minitensor as mt
from minitensor import hookimpl, nn


def _same_sizes(cls, query_size, key_size):
    if query_size is not None and key_size is not None and query_size != key_size:
        raise ValueError(
            f"{cls.__name__}: queries and keys must have one length d, got query_size={query_size} "
            f"and key_size={key_size}; use the 'additive' scorer for different lengths"
        )


def _squared_distance(queries, keys):
    """|q_i - k_j|^2 for every pair, (..., Q, K), by broadcasting the differences.

    Computed from the differences rather than as |q|^2 - 2 q.k + |k|^2: that expansion
    cancels catastrophically when q is close to k (it can even come out negative), and the
    kernel scorers must tell reliably whether |q - k| is below the kernel's width. The price
    is a (..., Q, K, d) intermediate, which the small Nadaraya-Watson problems can afford.
    """
    diff = queries.unsqueeze(-2) - keys.unsqueeze(-3)  # (..., Q, 1, d) - (..., 1, K, d)
    return (diff * diff).sum(axis=-1)


def _half_squared_distance(queries, keys):
    """1/2 |q_i - k_j|^2 for every pair, (..., Q, K), as 1/2 |q|^2 + 1/2 |k|^2 - q.k: one
    matrix product (see ``GaussianScorer`` for why, and for its rounding)."""
    q_sq = (queries * queries).sum(axis=-1, keepdims=True)  # (..., Q, 1)
    k_sq = (keys * keys).sum(axis=-1).unsqueeze(-2)  # (..., 1, K)
    return 0.5 * q_sq + 0.5 * k_sq - (queries @ keys.swapaxes(-1, -2))


class DotProduct(nn.Module):
    """score(q, k) = q . k  (queries and keys of one length d)."""

    # capabilities (minitensor/core/hookspecs.py): each score from one query row and one key row;
    # the scores are scale * q . k (streamed attention computes them itself)
    row_wise = True

    def dot_scale(self, d_head):
        return 1.0

    def __init__(self, query_size, key_size, **options):
        super().__init__()
        _same_sizes(type(self), query_size, key_size)
        check_options(type(self), options)

    def forward(self, queries, keys):
        return queries @ keys.swapaxes(-1, -2)


class ScaledDotProduct(nn.Module):
    """score(q, k) = q . k / sqrt(d): the dot product scaled so that, for q and k with
    independent unit-variance entries, the scores keep unit variance whatever d is.

    Batched: scores = Q K^T / sqrt(d), queries (..., Q, d), keys (..., K, d).
    """

    row_wise = True

    def dot_scale(self, d_head):
        return 1.0 / math.sqrt(d_head)

    def __init__(self, query_size, key_size, **options):
        super().__init__()
        _same_sizes(type(self), query_size, key_size)
        check_options(type(self), options)

    def forward(self, queries, keys):
        return (queries @ keys.swapaxes(-1, -2)) * (1.0 / math.sqrt(queries.shape[-1]))


class CosineScorer(nn.Module):
    """Query-key normalisation (Henry, Dachapally, Pawar and Chen, "Query-Key Normalization
    for Transformers", Findings of EMNLP 2020):

        score(q, k) = g * <q / |q|, k / |k|> = g cos(q, k)

    with one learned scalar g. A cosine lies in [-1, 1], so the scores lie in [-g, g] however
    large q and k grow: softmax cannot saturate by accident, and how sharp the attention is
    is left to g alone. (Cosines alone would be too flat: softmax weights within a factor
    e^2 ~ 7.4 of each other; g is what lets the weights peak.)

    Options:

    - ``scale``: the starting value of g (its fixed value with ``learn_scale=False``).
      Default 10.0, the paper's start for sequences of about 32 tokens: it sets
      g0 = log2(L^2 - L), L the 97.5th percentile of the training sequence lengths (8.6 for
      L = 20, 10 for L = 32, 12 for L = 64), and a scorer is not told L.
    - ``seq_len``: L, to start at exactly that g0 instead (L >= 2; not together with ``scale``).
    - ``learn_scale`` (default True): False keeps g fixed, a buffer rather than a parameter
      (plain cosine attention with an inverse temperature).
    - ``dtype``, ``device``: where g is made (the attention layers pass theirs).

    A zero (or tiny) q or k would divide by |q| = 0: the norm is taken as max(|q|, eps),
    eps = 1e-6, so a zero vector scores 0 against everything, with finite (if large, up to
    about g / eps) gradients. The floor sits under the sqrt (on |q|^2), where sqrt's
    derivative is still finite; float16 raises it to its smallest normal number, eps^2
    being 0 there.
    """

    row_wise = True

    DEFAULT_SCALE = 10.0
    eps = 1e-6

    def __init__(
        self, query_size, key_size, scale=None, seq_len=None, learn_scale=True, dtype=None, device=None, **options
    ):
        super().__init__()
        _same_sizes(type(self), query_size, key_size)
        check_options(type(self), options, ("scale", "seq_len", "learn_scale"))
        if scale is not None and seq_len is not None:
            raise ValueError(f"CosineScorer: pass scale or seq_len, not both (got scale={scale}, seq_len={seq_len})")
        if seq_len is not None:
            if seq_len != int(seq_len) or seq_len < 2:
                raise ValueError(f"CosineScorer: seq_len must be an integer >= 2, got {seq_len!r}")
            scale = math.log2(seq_len * seq_len - seq_len)
        scale = self.DEFAULT_SCALE if scale is None else float(scale)
        if not (math.isfinite(scale) and scale > 0):
            raise ValueError(f"CosineScorer: scale must be positive and finite, got {scale}")
        if learn_scale not in (True, False):
            # a string such as "no" would be truthy and silently learn g
            raise TypeError(f"CosineScorer: learn_scale must be True or False, got {learn_scale!r}")
        self.learn_scale = bool(learn_scale)
        # shape (1,), like parametric_gaussian's w
        g = mt.tensor([scale], dtype=dtype or mt.float32, device=device or "cpu")
        if self.learn_scale:
            self.scale = nn.Parameter(g)
        else:
            self.register_buffer("scale", g)

    def forward(self, queries, keys):
        floor = max(self.eps * self.eps, float(np.finfo(queries.dtype).tiny))
        q = queries / (queries * queries).sum(axis=-1, keepdims=True).clip(floor, None).sqrt()
        k = keys / (keys * keys).sum(axis=-1, keepdims=True).clip(floor, None).sqrt()
        # g scales the Q x d unit queries rather than the Q x K scores: the same, for less work
        return (q * self.scale) @ k.swapaxes(-1, -2)

    def extra_repr(self):
        return f"scale={float(self.scale.numpy()[0]):.4g}, learn_scale={self.learn_scale}"


class L2Scorer(nn.Module):
    """The negative squared Euclidean distance, scaled like ``scaled_dot``:

        score(q, k) = -|q - k|^2 / sqrt(d)

    the score of L2 self-attention (Kim, Papamakarios and Mnih, "The Lipschitz Constant of
    Self-Attention", ICML 2021), which they prove Lipschitz (with tied query and key
    projections) where dot-product self-attention is not. A key scores highest (0) where it
    equals the query. Since -|q - k|^2 = 2 q.k - |k|^2 - |q|^2
    and softmax ignores a constant per query, this is scaled_dot's 2 q.k / sqrt(d) with a
    penalty -|k|^2 / sqrt(d) on long keys. It is also the ``kernel`` scorer's Gaussian with
    width d^(1/4) / sqrt(2), which broadcasts the (..., Q, K, d) differences instead.

    Computed as one matrix product (``_half_squared_distance``), so it costs what scaled_dot
    does, with the Gaussian scorer's rounding: off by about eps (|q|^2 + |k|^2) / sqrt(d),
    so q = k can score a hair above or below 0.
    """

    row_wise = True

    def __init__(self, query_size, key_size, **options):
        super().__init__()
        _same_sizes(type(self), query_size, key_size)
        check_options(type(self), options)

    def forward(self, queries, keys):
        return _half_squared_distance(queries, keys) * (-2.0 / math.sqrt(queries.shape[-1]))


class AdditiveScorer(nn.Module):
    """Additive attention (Bahdanau), D2L's ``AdditiveAttention`` scorer:

        score(q, k) = w_v^T tanh(W_q q + W_k k)

    with W_q (num_hiddens x query_size), W_k (num_hiddens x key_size), w_v (num_hiddens),
    all learned, no biases (as in D2L). Queries and keys may have different lengths: the
    same as a one-hidden-layer MLP with tanh units applied to the concatenation [q; k].

    Options: ``num_hiddens`` (h, the hidden width); default max(query_size, key_size), which
    in D2L's Bahdanau decoder (queries and keys both of the GRU's width) is that width.
    ``dtype``, ``device``: where the parameters are made (the attention layers pass theirs).
    """

    row_wise = True

    def __init__(self, query_size, key_size, num_hiddens=None, dtype=None, device=None, **options):
        super().__init__()
        check_options(type(self), options, ("num_hiddens",))
        if query_size is None or key_size is None:
            # D2L's LazyLinear infers them at the first call; minitensor has no lazy layers
            raise ValueError(
                f"AdditiveScorer needs query_size and key_size (its W_q and W_k are learned), got "
                f"query_size={query_size}, key_size={key_size}; pass them to the attention layer"
            )
        if num_hiddens is None:
            num_hiddens = max(query_size, key_size)
        self.num_hiddens = int(num_hiddens)
        self.W_q = nn.Linear(query_size, self.num_hiddens, bias=False, dtype=dtype, device=device)
        self.W_k = nn.Linear(key_size, self.num_hiddens, bias=False, dtype=dtype, device=device)
        self.w_v = nn.Linear(self.num_hiddens, 1, bias=False, dtype=dtype, device=device)

    def forward(self, queries, keys):
        queries, keys = self.W_q(queries), self.W_k(keys)
        # Every query meets every key by broadcasting: (..., Q, 1, h) + (..., 1, K, h)
        # -> features (..., Q, K, h); the Linear maps h -> 1 and the last axis goes.
        features = (queries.unsqueeze(-2) + keys.unsqueeze(-3)).tanh()
        return self.w_v(features).squeeze(-1)

    def extra_repr(self):
        return f"num_hiddens={self.num_hiddens}"


class GaussianScorer(nn.Module):
    """The Gaussian kernel as a score (D2L 10.2's non-parametric attention pooling):

        score(q, k) = -1/2 |q - k|^2

    so softmax(score) = exp(-|q - k_i|^2 / 2) / sum_j exp(-|q - k_j|^2 / 2), Nadaraya-Watson
    kernel regression with a Gaussian kernel (its 1/sqrt(2 pi) cancels in the ratio).

    Computed as -1/2 (|q|^2 - 2 q.k + |k|^2): a matrix product, like dot-product attention,
    with (..., Q, K) memory instead of the (..., Q, K, d) differences, so it scales to a
    Transformer's heads. The price is rounding: each score is off by about
    eps (|q|^2 + |k|^2) (eps ~ 1e-7 in float32), far below the O(1) score differences that
    matter to softmax. The ``kernel`` scorer, which must compare |q - k| with its width
    exactly, broadcasts the differences instead.
    """

    row_wise = True

    def __init__(self, query_size, key_size, **options):
        super().__init__()
        _same_sizes(type(self), query_size, key_size)
        check_options(type(self), options)

    def forward(self, queries, keys):
        return -_half_squared_distance(queries, keys)


class ParametricGaussianScorer(nn.Module):
    """D2L 10.2's *parametric* attention pooling (its ``NWKernelRegression``):

        score(q, k) = -1/2 ((q - k) w)^2 = -1/2 w^2 |q - k|^2

    with one learned scalar w, the inverse width of the Gaussian kernel: a large w makes
    the weights peak on the nearest keys, a small one averages widely.

    Option ``w_init`` (default 1.0): the starting value of w. D2L draws it from U(0, 1)
    (``torch.rand((1,))``); 1.0 instead starts training exactly at the non-parametric
    ``gaussian`` scorer and does not depend on the random seed. Pass
    ``w_init=mt.rand(1).item()`` for D2L's start. ``dtype``, ``device``: where w is made.
    """

    row_wise = True

    def __init__(self, query_size, key_size, w_init=1.0, dtype=None, device=None, **options):
        super().__init__()
        _same_sizes(type(self), query_size, key_size)
        check_options(type(self), options, ("w_init",))
        # shape (1,), as in D2L's nn.Parameter(torch.rand((1,)))
        self.w = nn.Parameter(mt.tensor([float(w_init)], dtype=dtype or mt.float32, device=device or "cpu"))

    def forward(self, queries, keys):
        return -(self.w * self.w) * _half_squared_distance(queries, keys)


class KernelScorer(nn.Module):
    """Nadaraya-Watson with any of D2L's kernels, as a score:

        score(q, k) = log K(u),   u = |q - k| / width

    so that softmax over the keys gives exactly the kernel regression weights
    K(u_i) / sum_j K(u_j) (softmax(log K) = K / sum K). The kernels (option ``kernel``):

        gaussian       K(u) = exp(-u^2 / 2)     log K = -u^2 / 2
        boxcar         K(u) = 1 if u < 1 else 0  log K = 0 or -inf
        epanechnikov   K(u) = max(0, 1 - u)      log K = log(1 - u) or -inf
        constant       K(u) = 1                  log K = 0  (plain averaging)

    "epanechnikov" is D2L's kernel of that name, which is the triangular kernel 1 - |u|
    (the textbook Epanechnikov kernel is 3/4 (1 - u^2)); "triangular" is the same kernel
    under its usual name. Outside a kernel's support (u >= 1 for boxcar and epanechnikov,
    as in D2L's ``abs(x) < 1``) the score is -inf, so the key gets weight exactly 0; a
    query with no key in the support gets all-zero weights from the pooling.

    Option ``width`` (default 1.0): the kernel's bandwidth, K((q - k) / width).
    """

    row_wise = True

    KERNELS = ("gaussian", "boxcar", "epanechnikov", "triangular", "constant")

    def __init__(self, query_size, key_size, kernel="gaussian", width=1.0, **options):
        super().__init__()
        _same_sizes(type(self), query_size, key_size)
        check_options(type(self), options, ("kernel", "width"))
        if kernel not in self.KERNELS:
            raise ValueError(f"KernelScorer: unknown kernel {kernel!r}; the kernels are {', '.join(self.KERNELS)}")
        width = float(width)
        if not width > 0:
            raise ValueError(f"KernelScorer: width must be positive, got {width}")
        self.kernel, self.width = kernel, width

    def forward(self, queries, keys):
        u2 = _squared_distance(queries, keys) * (1.0 / (self.width * self.width))  # u^2
        if self.kernel == "gaussian":
            return -0.5 * u2
        if self.kernel == "constant":
            # 0 * u^2 rather than a new zeros tensor: the scores stay in the graph, so a
            # loss built on them can still call backward() (every gradient is 0).
            return 0.0 * u2
        inside = u2 < 1.0  # the support: u < 1
        if self.kernel == "boxcar":
            return (0.0 * u2).masked_fill(~inside, -math.inf)
        # epanechnikov / triangular: log(1 - u). Two guards keep NaN out of the values and
        # the gradients: u = sqrt(u^2) has an infinite derivative at u^2 = 0 (q = k), so
        # there u is set to 0 (gradient 0, the symmetric choice) without calling sqrt on 0;
        # and log runs only on 1 - u > 0, the -inf outside coming from masked_fill.
        positive = u2 > 0.0
        u = mt.where(positive, u2.masked_fill(~positive, 1.0).sqrt(), 0.0)
        return (1.0 - u).masked_fill(~inside, 1.0).log().masked_fill(~inside, -math.inf)

    def extra_repr(self):
        return f"kernel={self.kernel!r}, width={self.width}"


@hookimpl
def minitensor_scorers():
    return {
        "dot": DotProduct,
        "scaled_dot": ScaledDotProduct,
        "cosine": CosineScorer,
        "l2": L2Scorer,
        "additive": AdditiveScorer,
        "gaussian": GaussianScorer,
        "parametric_gaussian": ParametricGaussianScorer,
        "kernel": KernelScorer,
    }
