"""Built-in score biases: positions as a number added to every attention score.

The third place to put word order (after the inputs and the queries/keys, see
``positional.py``): ``applies_to = "scores"``. An encoding of this kind adds a bias B to the
scores of every attention layer, before the pooling,

    weights = pooling(scorer(q, k) + B),    B[h, i, j] = bias of head h for query i, key j,

and ``-inf`` in B means "may not attend" (the pooling gives that key weight 0). What such
an encoding is built with, what ``forward`` returns for which positions, and the attributes
``relative``, ``window`` and ``cross``: the contract, ``minitensor/core/hookspecs.py``.

All three built-ins here are *relative*: B[h, i, j] depends only on the distance
j - i (key position minus query position), so each offers ``relative_bias(min_distance,
max_distance)``, the (num_heads, D) table of the D = max - min + 1 distinct values, O(T)
numbers instead of O(T^2): what a streaming (fused) attention kernel would read.
``forward`` is built from it by indexing with the grid of distances, so both give the same
numbers and gradients reach a learned table through either. The distances are made with
tensor ops (``mt.arange``, arithmetic, comparisons), not NumPy, so that ``mt.onnx.export``
records them and the exported graph computes them for any length. None has a length limit:
``max_len`` is accepted (the models pass it to every encoding) and ignored.
"""

import math
import operator

import numpy
from minitensor.plugins import check_options

import minitensor as mt
from minitensor import hookimpl, nn


def _check_int(name, what, value, minimum=None):
    """``value`` as a Python int (>= minimum, if given): ints and NumPy integers, not floats or bools."""
    if isinstance(value, (bool, numpy.bool_)):
        raise TypeError(f"{name}: {what} must be an int, got {value!r}")
    try:
        # ints kept as they are (a length mt.onnx traces is an int subclass), NumPy integers converted
        value = value if isinstance(value, int) else operator.index(value)
    except TypeError:
        raise TypeError(f"{name}: {what} must be an int, got {value!r}") from None
    if minimum is not None and value < minimum:
        raise ValueError(f"{name}: {what} must be >= {minimum}, got {value}")
    return value


class _RelativeScoreBias(nn.Module):
    """What the relative score biases share: argument checks, and the dense bias built from
    ``relative_bias`` (which each subclass defines, in the dtype and on the device of its
    parameter or buffer)."""

    applies_to = "scores"
    relative = True
    window = None
    cross = False

    def __init__(self, num_heads, max_len):
        super().__init__()
        name = type(self).__name__
        self.num_heads = _check_int(name, "num_heads", num_heads, 1)
        self.max_len = max_len  # no limit: any length works

    def _distances(self, min_distance, max_distance, device):
        """The distances min .. max as an int64 tensor on ``device`` (checked)."""
        name = f"{type(self).__name__}.relative_bias"
        low = _check_int(name, "min_distance", min_distance)
        high = _check_int(name, "max_distance", max_distance)
        if high < low:
            raise ValueError(f"{name}: max_distance={high} is below min_distance={low}")
        return mt.arange(low, high + 1, dtype=mt.int64, device=device)

    def forward(self, num_queries, num_keys, q_offset=0, k_offset=0):
        """B (num_heads, Q, K) with B[h, i, j] = relative_bias at distance
        (k_offset + j) - (q_offset + i)."""
        name = type(self).__name__
        Q = _check_int(name, "num_queries", num_queries, 0)
        K = _check_int(name, "num_keys", num_keys, 0)
        q_offset = _check_int(name, "q_offset", q_offset, 0)
        k_offset = _check_int(name, "k_offset", k_offset, 0)
        if Q == 0 or K == 0:  # nothing to attend: an empty bias of the table's dtype and device
            table = self.relative_bias(0, 0)
            return table[:, mt.tensor(numpy.zeros((Q, K), dtype=numpy.int64), device=table.device)]
        low = k_offset - (q_offset + Q - 1)  # the smallest distance: last query, first key
        table = self.relative_bias(low, k_offset + K - 1 - q_offset)  # (num_heads, Q + K - 1)
        # column of cell (i, j): its distance minus the smallest one, (j - i) + (Q - 1)
        keys, queries = mt.arange(K, device=table.device), mt.arange(Q, device=table.device)
        columns = keys.reshape(1, K) - queries.reshape(Q, 1) + (Q - 1)
        # integer-array indexing is differentiable: a learned table's gradient is scatter-added
        return table[:, columns]


class ALiBi(_RelativeScoreBias):
    """Attention with Linear Biases, ALiBi (Press, Smith and Lewis 2022, "Train Short, Test
    Long: Attention with Linear Biases Enables Input Length Extrapolation", ICLR):

        B[h, i, j] = -m_h * |j - i|

    a penalty growing linearly with the distance, steeper in some heads (local ones) than in
    others, with no parameter at all. Slopes: for n heads, n a power of 2,

        m_h = 2^(-8h / n),   h = 1 .. n         (8 heads: 1/2, 1/4, ..., 1/256)

    otherwise the paper's rule (its code's ``get_slopes``): the slopes for p, the largest
    power of 2 below n, followed by every other slope for 2p, the first n - p of them
    ([0::2][:n - p]), so they interleave with the first ones.

    The paper's decoder adds m_h * (j - i) to causal self-attention; on every cell the
    causal mask leaves (j <= i) that is the formula above, and the symmetric form is what
    encoders use. The bias never runs out of positions: trained on short sequences, ALiBi
    extrapolates to longer ones. The slopes are a non-persistent buffer (a formula, not
    learned state), like the sinusoidal table.
    """

    def __init__(self, num_heads, max_len=1000, dtype=None, device=None, **options):
        super().__init__(num_heads, max_len)
        check_options(type(self), options)
        slopes = numpy.asarray(self.slopes_for(self.num_heads), dtype=numpy.float64)
        self.register_buffer("slopes", mt.tensor(slopes, dtype=dtype or mt.float32, device=device), persistent=False)

    @staticmethod
    def slopes_for(n):
        """The n head slopes m_1 .. m_n (Python floats, float64), by the paper's rule."""
        if n & (n - 1) == 0:  # a power of 2
            return [2.0 ** (-8.0 * h / n) for h in range(1, n + 1)]
        p = 2 ** int(math.floor(math.log2(n)))
        return ALiBi.slopes_for(p) + ALiBi.slopes_for(2 * p)[0::2][: n - p]

    def relative_bias(self, min_distance, max_distance):
        """(num_heads, D): column c is -m_h |d| at distance d = min_distance + c."""
        distances = self._distances(min_distance, max_distance, self.slopes.device)
        minus_d = (-distances.abs()).astype(self.slopes.dtype)  # negated as integers: 0, not -0
        return self.slopes.reshape(self.num_heads, 1) * minus_d.reshape(1, -1)

    def extra_repr(self):
        return f"num_heads={self.num_heads}"


class T5RelativeBias(_RelativeScoreBias):
    """T5's learned relative position bias (Raffel et al. 2020, "Exploring the Limits of
    Transfer Learning with a Unified Text-to-Text Transformer", JMLR, section 2.1):

        B[h, i, j] = table[bucket(j - i), h]

    one learned scalar per head and *bucket* of distances, table a Parameter of shape
    (num_buckets, num_heads). The buckets (T5's ``_relative_position_bucket``, as in the
    reference implementation, HF transformers ``T5Attention``), for d = key position - query
    position:

    - bidirectional (encoders): half of the buckets for d > 0 (future keys), half for d <= 0;
      within a half of b buckets, n = |d|:
          n < b/2                      -> bucket n (exact: nearby words matter one by one)
          b/2 <= n                     -> b/2 + floor(log(n / (b/2)) / log(max_distance / (b/2))
                                                      * (b - b/2)),  at most b - 1
      (log-spaced up to max_distance; every farther distance shares the last bucket);
    - unidirectional (decoders): n = max(-d, 0), the same rule on all num_buckets buckets;
      future keys (d > 0) all land in bucket 0, where the causal mask hides them anyway.

    The log step is computed in float32, as the reference does (``.float()``), so both put
    every distance in the same bucket; only where log(n / (b/2)) / log(max_distance / (b/2))
    * (b - b/2) is exactly an integer in real arithmetic (rare settings, never the default
    32 / 128) does the last bit of float32 log decide, and there float32 libraries differ
    among themselves; here it is the float32 nearest to the true log. Any length works: far
    distances saturate in the last bucket.
    The table starts as N(0, std^2), std = 0.02 (like the learned position table: a small
    nudge next to the content scores, grown by training).
    """

    def __init__(
        self,
        num_heads,
        max_len=1000,
        num_buckets=32,
        max_distance=128,
        bidirectional=True,
        std=0.02,
        dtype=None,
        device=None,
        **options,
    ):
        super().__init__(num_heads, max_len)
        check_options(type(self), options)
        name = type(self).__name__
        if not isinstance(bidirectional, (bool, numpy.bool_)):
            raise TypeError(f"{name}: bidirectional must be True or False, got {bidirectional!r}")
        self.bidirectional = bool(bidirectional)
        self.num_buckets = _check_int(name, "num_buckets", num_buckets, 2)
        self.max_distance = _check_int(name, "max_distance", max_distance, 1)
        half = self.num_buckets // 2 if self.bidirectional else self.num_buckets
        if half < 2:
            raise ValueError(
                f"{name}: num_buckets={self.num_buckets} is too few for bidirectional=True: each sign needs at "
                "least one exact and one log-spaced bucket; use num_buckets >= 4"
            )
        if self.max_distance <= half // 2:
            raise ValueError(
                f"{name}: max_distance={self.max_distance} must exceed the {half // 2} distances that get exact "
                f"buckets (num_buckets={self.num_buckets}, bidirectional={self.bidirectional}); the log-spaced "
                "buckets cover the distances from there up to max_distance"
            )
        self.table = nn.Parameter(mt.zeros(self.num_buckets, self.num_heads, dtype=dtype, device=device))
        nn.init.normal_(self.table, 0.0, std)
        # The buckets of the distances -L .. L, L = 2 max_distance, computed once: every distance
        # beyond +-L is in the last bucket of its sign, as +-L is (the buckets grow with |d| and
        # reach the last one by |d| = max_distance, up to the float32 rounding of the log step).
        self.reach = 2 * self.max_distance
        lookup = self.bucket(numpy.arange(-self.reach, self.reach + 1))
        self.register_buffer("buckets", mt.tensor(lookup, dtype=mt.int64, device=device), persistent=False)

    def bucket(self, relative_position):
        """T5's bucket of each distance (key position - query position), a host int64 array."""
        return t5_bucket(relative_position, self.bidirectional, self.num_buckets, self.max_distance)

    def relative_bias(self, min_distance, max_distance):
        """(num_heads, D): column c is table[bucket(min_distance + c)], differentiable w.r.t. the table."""
        distances = self._distances(min_distance, max_distance, self.table.device)
        buckets = self.buckets[distances.clip(-self.reach, self.reach) + self.reach]  # bucket(d), any d
        return self.table[buckets].swapaxes(0, 1)

    def extra_repr(self):
        return (
            f"num_heads={self.num_heads}, num_buckets={self.num_buckets}, max_distance={self.max_distance}, "
            f"bidirectional={self.bidirectional}"
        )


def t5_bucket(relative_position, bidirectional=True, num_buckets=32, max_distance=128):
    """T5's ``_relative_position_bucket`` in NumPy, step by step as in the reference (HF
    transformers ``T5Attention``), its float32 log step included."""
    n = numpy.asarray(relative_position, dtype=numpy.int64)
    buckets = numpy.zeros(n.shape, dtype=numpy.int64)
    if bidirectional:
        num_buckets //= 2
        buckets += (n > 0).astype(numpy.int64) * num_buckets
        n = numpy.abs(n)
    else:
        n = -numpy.minimum(n, 0)
    max_exact = num_buckets // 2  # the first half of the buckets: one per distance
    is_small = n < max_exact
    # the other half: log-spaced up to max_distance (n is clipped below only to keep log(0) out;
    # those cells take the exact branch)
    ratio = numpy.maximum(n, max_exact).astype(numpy.float32) / numpy.float32(max_exact)
    log = numpy.log(ratio.astype(numpy.float64)).astype(numpy.float32)  # the float32 nearest to log(ratio)
    scaled = log / numpy.float32(math.log(max_distance / max_exact)) * numpy.float32(num_buckets - max_exact)
    if_large = numpy.minimum(max_exact + scaled.astype(numpy.int64), num_buckets - 1)
    return buckets + numpy.where(is_small, n, if_large)


class SlidingWindow(_RelativeScoreBias):
    """Local attention: each query sees only the keys within ``window`` positions of it
    (Beltagy, Peters and Cohan 2020, "Longformer: The Long-Document Transformer"; Child et
    al. 2019, "Generating Long Sequences with Sparse Transformers"):

        B[h, i, j] = 0      if |j - i| <= window
                     -inf   otherwise                     (every head alike)

    so a layer costs O(T * window) useful scores instead of O(T^2), and a stack of L layers
    still sees L * window positions away. With a causal mask (decoders) a query sees the
    last window + 1 positions, itself included. ``window`` (an int >= 0, default 8) is also
    the instance's ``window`` attribute, with which a fused kernel could skip key blocks.
    The two values 0 and -inf are kept as a non-persistent buffer, so the bias takes the
    module's dtype and device.
    """

    def __init__(self, num_heads, max_len=1000, window=8, dtype=None, device=None, **options):
        super().__init__(num_heads, max_len)
        check_options(type(self), options)
        self.window = _check_int(type(self).__name__, "window", window, 0)
        values = numpy.array([0.0, -numpy.inf])
        self.register_buffer("values", mt.tensor(values, dtype=dtype or mt.float32, device=device), persistent=False)

    def relative_bias(self, min_distance, max_distance):
        """(num_heads, D): 0 at distances |d| <= window, -inf beyond."""
        distances = self._distances(min_distance, max_distance, self.values.device)
        outside = (distances.abs() > self.window).astype(mt.int64)  # 1 picks values[1] = -inf
        return self.values[outside.reshape(1, -1).expand(self.num_heads, -1)]

    def extra_repr(self):
        return f"num_heads={self.num_heads}, window={self.window}"


@hookimpl
def minitensor_positional_encodings():
    return {
        "alibi": ALiBi,
        "t5_relative": T5RelativeBias,
        "sliding_window": SlidingWindow,
    }
