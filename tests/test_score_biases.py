"""Score biases, the "scores" positional encodings: ALiBi (slopes and -m|j - i|), T5's relative
buckets (against a transcription of the reference) and learned table, the sliding window;
offsets, dtypes, option errors, the registry; and the conformance kit for the "scores" kind,
which passes the built-ins and rejects broken plugins, naming the property they break."""

import math

import numpy as np
import pytest

import minitensor as mt
from minitensor import nn
from minitensor.testing import check_positional_encoding

SCORES = ("alibi", "t5_relative", "sliding_window")


def build(name, *args, **kwargs):
    return mt.plugins.lookup("positional encoding", name)(*args, **kwargs)


def distances(Q, K, q_offset=0, k_offset=0):
    """(Q, K) grid of j - i: key position minus query position."""
    return (k_offset + np.arange(K))[None, :] - (q_offset + np.arange(Q))[:, None]


# -- the registry and the kit ---------------------------------------------------------------------
def test_lookup_by_name_finds_the_score_biases():
    assert "minitensor_plugins.score_biases" in mt.plugins.DEFAULT_PLUGINS
    for name in SCORES:
        cls = mt.plugins.lookup("positional encoding", name)
        assert cls is mt.plugins.positional_encodings()[name]
        assert (cls.applies_to, cls.relative, cls.cross) == ("scores", True, False)
    assert mt.plugins.lookup("positional", "alibi").window is None
    rows = {row["name"]: row for row in mt.plugins.describe()}
    assert rows["t5_relative"]["source"] == "built-in" and rows["t5_relative"]["kind"] == "positional encoding"


@pytest.mark.parametrize(
    "name,options",
    [
        ("alibi", {}),
        ("alibi", {"num_heads": 6}),
        ("t5_relative", {}),
        ("t5_relative", {"bidirectional": False}),
        ("t5_relative", {"num_buckets": 8, "max_distance": 6}),
        ("t5_relative", {"num_buckets": 5, "max_distance": 5, "bidirectional": False}),
        ("sliding_window", {}),
        ("sliding_window", {"window": 0}),
        ("sliding_window", {"window": 3}),
        ("sliding_window", {"window": 40}),
    ],
    ids=lambda v: v if isinstance(v, str) else "-".join(f"{k}={x}" for k, x in v.items()) or "defaults",
)
def test_the_kit_passes_the_built_ins(name, options, device):
    cls = mt.plugins.lookup("positional encoding", name)
    assert check_positional_encoding(cls, device=device, **options) is True


# -- ALiBi -----------------------------------------------------------------------------------------
def get_slopes(n):
    """The ALiBi paper's code (Press et al., attention_with_linear_biases), transcribed."""

    def get_slopes_power_of_2(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        ratio = start
        return [start * ratio**i for i in range(n)]

    if math.log2(n).is_integer():
        return get_slopes_power_of_2(n)
    closest_power_of_2 = 2 ** math.floor(math.log2(n))
    return (
        get_slopes_power_of_2(closest_power_of_2) + get_slopes(2 * closest_power_of_2)[0::2][: n - closest_power_of_2]
    )


def test_alibi_slopes_for_8_heads_are_powers_of_one_half():
    np.testing.assert_allclose(build("alibi", 8).slopes.numpy(), [2.0**-h for h in range(1, 9)], rtol=1e-7)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 6, 7, 12, 16, 24])
def test_alibi_slopes_follow_the_papers_code(n):
    enc = build("alibi", n, dtype=mt.float64)
    np.testing.assert_allclose(enc.slopes.numpy(), get_slopes(n), rtol=1e-12)


def test_alibi_bias_is_minus_slope_times_distance(device):
    enc = build("alibi", 6, max_len=4, device=device)  # max_len is no limit
    B = enc(5, 30, q_offset=25, k_offset=0)
    assert B.shape == (6, 5, 30) and B.dtype == mt.float32 and B.device == device
    expected = -np.asarray(get_slopes(6))[:, None, None] * np.abs(distances(5, 30, 25, 0))
    np.testing.assert_allclose(B.numpy(), expected, rtol=1e-6)
    assert not list(enc.parameters())
    assert "slopes" not in enc.state_dict()  # a formula, not learned state


def test_alibi_relative_bias_is_one_column_per_distance():
    enc = build("alibi", 4, dtype=mt.float64)
    table = enc.relative_bias(-3, 2).numpy()
    np.testing.assert_allclose(table, -np.asarray(get_slopes(4))[:, None] * np.abs(np.arange(-3, 3)))


# -- T5 -------------------------------------------------------------------------------------------
def t5_bucket_reference(relative_position, bidirectional=True, num_buckets=32, max_distance=128):
    """HF transformers T5Attention._relative_position_bucket, one distance at a time. The
    reference takes the log of ``relative_position.float()``: its float steps are float32."""
    f32 = np.float32
    relative_buckets = 0
    if bidirectional:
        num_buckets //= 2
        relative_buckets += (relative_position > 0) * num_buckets
        relative_position = abs(relative_position)
    else:
        relative_position = -min(relative_position, 0)
    max_exact = num_buckets // 2
    is_small = relative_position < max_exact
    if is_small:
        return relative_buckets + relative_position
    log = f32(math.log(f32(relative_position) / f32(max_exact)))
    relative_position_if_large = max_exact + int(
        log / f32(math.log(max_distance / max_exact)) * f32(num_buckets - max_exact)
    )
    relative_position_if_large = min(relative_position_if_large, num_buckets - 1)
    return relative_buckets + relative_position_if_large


def t5_bucket_float64(relative_position, bidirectional=True, num_buckets=32, max_distance=128):
    """The same in plain Python floats (float64)."""
    buckets = 0
    if bidirectional:
        num_buckets //= 2
        buckets += (relative_position > 0) * num_buckets
        relative_position = abs(relative_position)
    else:
        relative_position = -min(relative_position, 0)
    max_exact = num_buckets // 2
    if relative_position < max_exact:
        return buckets + relative_position
    large = max_exact + int(
        math.log(relative_position / max_exact) / math.log(max_distance / max_exact) * (num_buckets - max_exact)
    )
    return buckets + min(large, num_buckets - 1)


T5_SETTINGS = [(32, 128), (16, 64), (8, 20), (10, 30), (64, 256), (34, 27), (17, 27), (6, 7)]


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("num_buckets,max_distance", T5_SETTINGS)
def test_t5_buckets_equal_the_reference(bidirectional, num_buckets, max_distance):
    enc = build("t5_relative", 2, num_buckets=num_buckets, max_distance=max_distance, bidirectional=bidirectional)
    grid = range(-300, 301)
    got = enc.bucket(np.array(grid))
    assert got.tolist() == [t5_bucket_reference(d, bidirectional, num_buckets, max_distance) for d in grid]
    assert got.min() >= 0 and got.max() < num_buckets
    if (num_buckets, max_distance) in ((32, 128), (16, 64), (64, 256)):  # no distance on a float32 boundary
        assert got.tolist() == [t5_bucket_float64(d, bidirectional, num_buckets, max_distance) for d in grid]


def test_t5_default_buckets_by_hand():
    enc = build("t5_relative", 1)  # 32 buckets, max_distance 128, bidirectional
    b = dict(zip(range(-200, 201), enc.bucket(np.arange(-200, 201)).tolist()))
    assert [b[d] for d in range(0, -8, -1)] == list(range(8))  # exact: past keys 0..7
    assert [b[d] for d in range(1, 8)] == list(range(17, 24))  # future keys: the upper half
    assert b[-8] == 8 and b[-127] == 15 and b[-128] == b[-200] == 15 and b[200] == 31
    uni = build("t5_relative", 1, bidirectional=False).bucket(np.array([5, 1, 0, -1, -15, -16, -127, -500]))
    assert uni.tolist() == [0, 0, 0, 1, 15, 16, 31, 31]


@pytest.mark.parametrize("bidirectional", [True, False])
def test_t5_bias_is_the_table_at_the_bucket(bidirectional, device):
    enc = build("t5_relative", 3, num_buckets=8, max_distance=10, bidirectional=bidirectional, device=device)
    B = enc(4, 20, q_offset=16, k_offset=0)
    assert B.shape == (3, 4, 20) and B.dtype == mt.float32 and B.device == device
    buckets = enc.bucket(distances(4, 20, 16, 0))
    np.testing.assert_array_equal(B.numpy(), enc.table.numpy()[buckets].transpose(2, 0, 1))
    assert "table" in enc.state_dict()


def test_t5_table_gets_the_gradients():
    enc = build("t5_relative", 2, num_buckets=8, max_distance=10, dtype=mt.float64)
    assert enc.table.shape == (8, 2) and enc.table.requires_grad
    assert 0.005 < float(np.std(build("t5_relative", 16).table.numpy())) < 0.04  # N(0, 0.02^2)
    weights = np.random.default_rng(0).standard_normal((2, 3, 12))
    (enc(3, 12, q_offset=2, k_offset=0) * mt.tensor(weights)).sum().backward()
    expected = np.zeros((8, 2))
    np.add.at(expected, enc.bucket(distances(3, 12, 2, 0)), weights.transpose(1, 2, 0))
    np.testing.assert_allclose(enc.table.grad.numpy(), expected, rtol=1e-12)
    enc.table.grad = None
    (enc.relative_bias(-5, 3) * mt.tensor(weights[:, 0, :9])).sum().backward()
    expected = np.zeros((8, 2))
    np.add.at(expected, enc.bucket(np.arange(-5, 4)), weights[:, 0, :9].T)
    np.testing.assert_allclose(enc.table.grad.numpy(), expected, rtol=1e-12)


# -- sliding window -------------------------------------------------------------------------------
@pytest.mark.parametrize("window", [0, 1, 3])
def test_sliding_window_pattern(window, device):
    enc = build("sliding_window", 2, window=window, device=device)
    assert enc.window == window and type(enc).window is None
    B = enc(7, 9, q_offset=2, k_offset=0).numpy()
    inside = np.abs(distances(7, 9, 2, 0)) <= window
    assert B.shape == (2, 7, 9)
    assert (B[:, inside] == 0).all() and (B[:, ~inside] == -np.inf).all()


def test_sliding_window_with_a_causal_mask_sees_the_last_window_plus_one():
    enc = build("sliding_window", 1, window=2)
    B = enc(1, 10, q_offset=9, k_offset=0).numpy()[0, 0]  # one new query, nine cached keys
    causal = np.arange(10) <= 9
    assert np.flatnonzero((B == 0) & causal).tolist() == [7, 8, 9]


# -- offsets and dtypes -----------------------------------------------------------------------------
@pytest.mark.parametrize("name", SCORES)
def test_one_new_query_against_a_cache_is_the_last_row(name):
    enc = build(name, 4, dtype=mt.float64)
    full = enc(9, 9).numpy()
    np.testing.assert_array_equal(enc(1, 9, q_offset=8, k_offset=0).numpy(), full[:, 8:])
    np.testing.assert_array_equal(enc(3, 4, q_offset=5, k_offset=2).numpy(), full[:, 5:8, 2:6])
    assert enc(0, 3).shape == (4, 0, 3) and enc(2, 0).shape == (4, 2, 0)


@pytest.mark.parametrize("name", SCORES)
def test_float64_build_and_to(name):
    enc = build(name, 3, dtype=mt.float64)
    assert enc(2, 5).dtype == mt.float64 and enc.relative_bias(-1, 1).dtype == mt.float64
    enc.to(mt.float32)
    assert enc(2, 5).dtype == mt.float32 and enc.relative_bias(-1, 1).dtype == mt.float32


# -- errors ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name,args,kwargs,error,words",
    [
        ("alibi", (0,), {}, ValueError, ["ALiBi", "num_heads", "0"]),
        ("t5_relative", (2.5,), {}, TypeError, ["T5RelativeBias", "num_heads", "2.5"]),
        ("sliding_window", (2,), {"window": -1}, ValueError, ["SlidingWindow", "window", "-1"]),
        ("sliding_window", (2,), {"window": 1.5}, TypeError, ["SlidingWindow", "window", "1.5"]),
        ("sliding_window", (2,), {"window": True}, TypeError, ["SlidingWindow", "window", "True"]),
        ("t5_relative", (2,), {"num_buckets": 1}, ValueError, ["T5RelativeBias", "num_buckets", "1"]),
        ("t5_relative", (2,), {"num_buckets": 3}, ValueError, ["T5RelativeBias", "num_buckets=3", ">= 4"]),
        ("t5_relative", (2,), {"max_distance": 0}, ValueError, ["T5RelativeBias", "max_distance", "0"]),
        ("t5_relative", (2,), {"max_distance": 8}, ValueError, ["T5RelativeBias", "max_distance=8"]),
        ("t5_relative", (2,), {"bidirectional": "yes"}, TypeError, ["T5RelativeBias", "bidirectional", "'yes'"]),
        ("alibi", (2,), {"windw": 3}, TypeError, ["ALiBi", "windw"]),
        ("sliding_window", (2,), {"windw": 3}, TypeError, ["SlidingWindow", "windw"]),
        ("t5_relative", (2,), {"num_bucket": 3}, TypeError, ["T5RelativeBias", "num_bucket"]),
    ],
)
def test_bad_options_are_refused_clearly(name, args, kwargs, error, words):
    with pytest.raises(error) as info:
        build(name, *args, **kwargs)
    for word in words:
        assert word in str(info.value), str(info.value)


@pytest.mark.parametrize("name", SCORES)
def test_bad_offsets_are_refused_clearly(name):
    enc = build(name, 2)
    with pytest.raises(ValueError, match=r"q_offset must be >= 0, got -1"):
        enc(2, 3, q_offset=-1)
    with pytest.raises(TypeError, match=r"k_offset must be an int, got 1.5"):
        enc(2, 3, k_offset=1.5)
    with pytest.raises(ValueError, match=r"max_distance=-2 is below min_distance=1"):
        enc.relative_bias(1, -2)


# -- broken plugins: the kit names what they break --------------------------------------------------
class LinearBias(nn.Module):
    """A correct "scores" encoding written by hand: B[h, i, j] = -s_h |j - i|; the broken
    ones below change one thing each through ``value(query positions, key positions)``."""

    applies_to = "scores"
    relative = True

    def __init__(self, num_heads, max_len=1000, **options):
        super().__init__()
        self.register_buffer("s", mt.tensor(np.linspace(0.5, 1.0, num_heads)), persistent=False)

    def value(self, query, key):
        return -np.abs(key - query).astype(float)

    def forward(self, num_queries, num_keys, q_offset=0, k_offset=0):
        query = q_offset + np.arange(num_queries)[:, None]
        key = k_offset + np.arange(num_keys)[None, :]
        return self.s.reshape(-1, 1, 1) * mt.tensor(self.value(query, key), dtype=self.s.dtype, device=self.s.device)

    def relative_bias(self, min_distance, max_distance):
        d = np.arange(min_distance, max_distance + 1)
        return self.s.reshape(-1, 1) * mt.tensor(
            self.value(np.zeros_like(d), d), dtype=self.s.dtype, device=self.s.device
        )


class WindowedBias(LinearBias):
    """Correct too: the linear bias inside a window of 2, -inf beyond."""

    window = 2

    def value(self, query, key):
        d = key - query
        return np.where(np.abs(d) > self.window, -np.inf, -np.abs(d).astype(float))


class DependsOnQueryPosition(LinearBias):
    """Bug (a): declares relative = True, yet the bias depends on i too."""

    def value(self, query, key):
        return -np.abs(key - query) - 0.1 * query


class KeyOffsetOffByOne(LinearBias):
    """Bug (b): the keys' positions are counted from k_offset + 1."""

    def forward(self, num_queries, num_keys, q_offset=0, k_offset=0):
        return super().forward(num_queries, num_keys, q_offset, k_offset + 1 if k_offset else 0)


class IgnoresQueryOffset(LinearBias):
    """Bug (b'): a new query is put at position 0, whatever q_offset says."""

    def forward(self, num_queries, num_keys, q_offset=0, k_offset=0):
        return super().forward(num_queries, num_keys, 0, k_offset)


class MirroredRelativeBias(WindowedBias):
    """Bug (c): relative_bias reads the distances the wrong way round (i - j)."""

    def value(self, query, key):
        d = key - query
        return np.where(np.abs(d) > self.window, -np.inf, np.where(d > 0, -2.0 * d, d).astype(float))

    def relative_bias(self, min_distance, max_distance):
        return super().relative_bias(-max_distance, -min_distance)[:, ::-1]


class WindowNotHonoured(LinearBias):
    """Bug (d): declares window = 2 but masks nothing."""

    window = 2


class IndexErrorPastMaxLen(LinearBias):
    """Bug: a table of max_len rows, read past its end (an IndexError, not a clear ValueError)."""

    relative = False

    def __init__(self, num_heads, max_len=1000, **options):
        super().__init__(num_heads, max_len)
        self.max_len = max_len

    def forward(self, num_queries, num_keys, q_offset=0, k_offset=0):
        if max(q_offset + num_queries, k_offset + num_keys) > self.max_len:
            raise IndexError("index 16 is out of bounds")
        return super().forward(num_queries, num_keys, q_offset, k_offset)


class RefusesPastMaxLen(IndexErrorPastMaxLen):
    """Fine: refuses with a ValueError naming max_len."""

    def forward(self, num_queries, num_keys, q_offset=0, k_offset=0):
        try:
            return super().forward(num_queries, num_keys, q_offset, k_offset)
        except IndexError:
            raise ValueError(f"positions past max_len={self.max_len}") from None


class LosesHeads(LinearBias):
    """Bug: the bias of head 0 only, shaped (Q, K, 1): it does not broadcast to (batch, H, Q, K)."""

    def forward(self, num_queries, num_keys, q_offset=0, k_offset=0):
        return super().forward(num_queries, num_keys, q_offset, k_offset)[0].reshape(num_queries, num_keys, 1)


class BadAttributes(LinearBias):
    """Bug: a window of -1."""

    window = -1


class AlwaysFloat32(LinearBias):
    """Bug: the bias is made in float32 whatever the module's dtype (no buffer carries it)."""

    def forward(self, num_queries, num_keys, q_offset=0, k_offset=0):
        return super().forward(num_queries, num_keys, q_offset, k_offset).to(dtype=mt.float32)


class NaNOnTheDiagonal(LinearBias):
    """Bug: 0 * inf where the distance is 0."""

    def value(self, query, key):
        d = np.abs(key - query).astype(float)
        with np.errstate(invalid="ignore", divide="ignore"):
            return -d * (1.0 / d)


def _rejects(cls, *words, **kwargs):
    with pytest.raises(AssertionError) as info:
        check_positional_encoding(cls, **kwargs)
    message = str(info.value)
    assert cls.__name__ in message, message
    for word in words:
        assert word in message, message


def test_the_kit_passes_hand_written_biases():
    for cls in (LinearBias, WindowedBias, RefusesPastMaxLen):
        assert check_positional_encoding(cls) is True


def test_the_kit_rejects_a_relative_bias_that_depends_on_i():
    _rejects(DependsOnQueryPosition, "the bias depends only on j - i", "diagonal")


def test_the_kit_rejects_a_cache_offset_off_by_one():
    _rejects(KeyOffsetOffByOne, "offsets shift the bias consistently", "k_offset")
    _rejects(IgnoresQueryOffset, "offsets shift the bias consistently", "q_offset=15")


def test_the_kit_rejects_a_relative_bias_that_disagrees_with_forward():
    _rejects(MirroredRelativeBias, "relative_bias agrees with forward")


def test_the_kit_rejects_a_window_that_is_not_honoured():
    _rejects(WindowNotHonoured, "window is honoured", "not -inf")


def test_the_kit_rejects_other_breakages():
    _rejects(IndexErrorPastMaxLen, "lengths beyond max_len", "IndexError")
    _rejects(LosesHeads, "output shape", "broadcast")
    _rejects(BadAttributes, "attributes", "window is -1")
    _rejects(AlwaysFloat32, "output dtype", "module.to(float64)")
    _rejects(NaNOnTheDiagonal, "no NaN")
