"""Key/value cache policies (contract v3): the built-ins against their definitions for every
registered plugin, a user's policy written from the docs, the int8 bound, memory, errors."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from minitensor_plugins.kv_caches import Int8Cache, SinksCache, WindowCache

import minitensor as mt
from minitensor.testing import (
    KEEPS,
    attention_error_bound,
    check_cached_generation,
    check_kv_cache,
)

SMALL = {"full": {}, "window": {"window": 5}, "sinks": {"sinks": 2, "window": 5}}


def attention_plugins():
    """Every registered scorer, pooling and attention-level positional encoding, one at a time."""
    cases = [{"scorer": s} for s in mt.plugins.scorers()] + [{"pooling": p} for p in mt.plugins.poolings()]
    for name, cls in mt.plugins.positional_encodings().items():
        if cls.applies_to != "inputs":
            cases.append({"positional": name})
    return cases


def case_id(case):
    return ",".join(f"{k}={v}" for k, v in case.items())


@pytest.mark.parametrize("policy", sorted(SMALL))
@pytest.mark.parametrize("plugins", attention_plugins(), ids=case_id)
def test_every_exact_policy_equals_its_definition_for_every_plugin(policy, plugins):
    assert check_kv_cache(policy, SMALL[policy], **plugins)


@pytest.mark.parametrize("policy", sorted(SMALL))
def test_grouped_heads(policy):
    assert check_kv_cache(policy, SMALL[policy], num_heads=4, num_kv_heads=2, num_hiddens=16, positional="rotary")


@pytest.mark.parametrize("positional", [None, "rotary", "alibi", "t5_relative"])
@pytest.mark.parametrize("scorer", ["dot", "scaled_dot"])
def test_int8_stays_within_its_bound(scorer, positional):
    assert check_kv_cache("int8", tolerance="bound", scorer=scorer, positional=positional)
    assert check_kv_cache("int8", tolerance="bound", scorer=scorer, positional=positional, num_kv_heads=1)


def test_the_bound_is_tight_enough_to_mean_something():
    """int8's error is within the bound and not vanishingly far below it (a bound of 1e6 would pass too)."""
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((2, 6, 16)) for _ in range(3))
    cache = Int8Cache()
    kq, vq = (Int8Cache.dequantize(*Int8Cache.quantize(mt.tensor(x)), "float64").numpy() for x in (k, v))
    exact = mt.softmax(mt.tensor(q @ k.swapaxes(-1, -2) / 4), axis=-1).numpy() @ v
    approx = mt.softmax(mt.tensor(q @ kq.swapaxes(-1, -2) / 4), axis=-1).numpy() @ vq
    bound = attention_error_bound(q, k, kq, v, vq, 0.25)
    error = np.abs(exact - approx)
    assert (error <= bound).all()
    assert 0.01 < error.max() / bound.max() <= 1
    assert cache.bytes() == 0


@settings(max_examples=40, deadline=None)
@given(
    shape=st.tuples(st.integers(1, 3), st.integers(1, 3), st.integers(1, 5), st.integers(1, 9)),
    spread=st.floats(1e-6, 1e3),
    seed=st.integers(0, 2**16),
)
def test_int8_error_is_at_most_half_a_step(shape, spread, seed):
    """Per head and token: |x - x^| <= scale / 2, scale (float16) about (max - min) / 255."""
    x = np.random.default_rng(seed).standard_normal(shape) * spread
    codes, scale, zero = Int8Cache.quantize(mt.tensor(x))
    assert codes.dtype == np.uint8 and scale.dtype == zero.dtype == np.float16
    back = Int8Cache.dequantize(codes, scale, zero, "float64").numpy()
    step = scale.numpy().astype(np.float64)
    assert (np.abs(back - x) <= step / 2 * (1 + 1e-6)).all()
    low = x.min(-1, keepdims=True)
    spread = x.max(-1, keepdims=True) - low + np.abs(low) * 2**-9  # what rounding the zero point may add
    exact = (back == x).all(-1, keepdims=True)  # a row the zero point alone holds keeps scale 1
    assert ((step <= np.maximum(spread / 255 * (1 + 2**-9), 2**-14)) | exact).all()  # not a loose scale


def test_a_constant_row_reads_back_exactly():
    x = mt.tensor(np.full((1, 1, 2, 4), 3.5))
    assert np.array_equal(Int8Cache.dequantize(*Int8Cache.quantize(x), "float64").numpy(), x.numpy())


def test_int8_refuses_what_float16_cannot_hold():
    with pytest.raises(ValueError, match="'int8': values beyond float16's range"):
        Int8Cache.quantize(mt.tensor([[1.0, 1e6]]))


# -- the definitions can fail: policies with a bug ------------------------------------------------------
class OneSinkShort(SinksCache):
    def append(self, keys, values, positions):
        self.sinks -= 1  # evicts with one sink fewer than it reports
        super().append(keys, values, positions)
        self.sinks += 1


class WindowOneShort(WindowCache):
    def append(self, keys, values, positions):
        self.window -= 1
        super().append(keys, values, positions)
        self.window += 1


class NotReindexed(SinksCache):
    """Keeps the right keys but at their positions in the text: a gap between sinks and window."""

    def positions(self):
        return self.text_positions


@pytest.mark.parametrize(
    "cls, name, message",
    [
        (OneSinkShort, "sinks", "the definition"),
        (WindowOneShort, "window", "the definition"),
        (NotReindexed, "sinks", "not consecutive"),
    ],
)
def test_a_policy_with_a_bug_fails_its_definition(cls, name, message):
    with pytest.raises(AssertionError, match=message):
        check_kv_cache(cls, SMALL[name], keeps=KEEPS[name](SMALL[name]), positional="rotary")


def test_a_lossy_policy_fails_an_exact_check():
    with pytest.raises(AssertionError, match="the definition"):
        check_kv_cache("int8")


# -- a user's policy, from the docs alone -----------------------------------------------------------------
class Float16Cache(mt.nn.KVCache):
    """Every position, stored in half precision: half the memory of float32, a small error."""

    def __init__(self, **options):
        mt.plugins.check_options(type(self), options)
        self.k = self.v = None

    def append(self, keys, values, positions):
        keys, values = keys.astype("float16"), values.astype("float16")
        self.k = keys if self.k is None else mt.concat([self.k, keys], axis=2)
        self.v = values if self.v is None else mt.concat([self.v, values], axis=2)

    def keys(self):
        return self.k.astype("float64")

    def values(self):
        return self.v.astype("float64")

    def positions(self):
        return np.arange(self.k.shape[2])


class UserCaches:
    @mt.hookimpl
    def minitensor_kv_caches(self):
        return {"my_float16": Float16Cache}


@pytest.fixture
def user_cache():
    name = mt.plugins.register(UserCaches())
    yield "my_float16"
    mt.plugins.unregister(name=name)


def tiny_lm(**fields):
    mt.manual_seed(0)
    config = dict(vocab_size=12, num_hiddens=16, ffn_num_hiddens=32, num_heads=2, num_blks=2, dropout=0.0)
    return mt.nn.TransformerLM(**{**config, **fields}, dtype="float64").eval()


def test_a_user_policy_is_checked_and_used_by_name(user_cache):
    assert check_kv_cache(user_cache, tolerance="bound", positional="rotary")
    lm = tiny_lm(positional="rotary")
    state = lm.begin_decoding(cache=user_cache)
    assert isinstance(state[2][0], Float16Cache)
    X = mt.tensor(np.random.default_rng(0).integers(0, 12, (1, 9)))
    with mt.no_grad():
        logits, state = lm.decode_step(X, state)
        np.testing.assert_allclose(logits.numpy(), lm(X).numpy(), atol=1e-2)
    assert state[2][0].bytes() == 2 * 1 * 2 * 9 * 8 * 2  # keys and values, float16
    names = {row["name"]: row for row in mt.plugins.describe()}
    assert names[user_cache]["kind"] == "kv cache"


# -- models: full over 1,000 tokens for every registered plugin --------------------------------------------
def test_full_cache_equals_recomputation_over_1000_tokens():
    assert check_cached_generation(tiny_lm(max_len=1001, positional="rotary"), steps=1000) < 1e-10


def model_cases():
    cases = attention_plugins()
    cases += [{"positional": n} for n, c in mt.plugins.positional_encodings().items() if c.applies_to == "inputs"]
    return cases


@pytest.mark.slow
@pytest.mark.parametrize("fields", model_cases(), ids=case_id)
def test_full_cache_equals_recomputation_over_1000_tokens_for_every_plugin(fields):
    assert check_cached_generation(tiny_lm(max_len=1001, **fields), steps=1000) < 1e-5


@pytest.mark.parametrize("policy", ["int8", "window", "sinks"])
def test_other_policies_generate_in_a_model(policy):
    lm = tiny_lm(positional="rotary")
    options = {"window": 6} if policy != "int8" else {}
    with mt.no_grad():
        state = lm.begin_decoding(policy, options)
        for t in range(20):
            logits, state = lm.decode_step(mt.tensor([[t % 12]]), state)
        assert np.isfinite(logits.numpy()).all()
    kept = len(state[2][0].positions())
    assert kept == {"int8": 20, "window": 6, "sinks": 10}[policy]
    assert lm.decoder.num_cached_steps(state) == 20


def test_a_model_with_window_cache_equals_the_sliding_window_mask_pass():
    """Token by token through every block, ``window`` equals the full pass with a sliding-window
    score bias of the same width (the built-in ``sliding_window`` encoding allows |j - i| <= w)."""
    W = 4
    lm = tiny_lm(positional="sliding_window", positional_options={"window": W - 1})
    X = mt.tensor(np.random.default_rng(3).integers(0, 12, (2, 15)))
    with mt.no_grad():
        state = lm.begin_decoding("window", {"window": W})
        rows = []
        for t in range(15):
            logits, state = lm.decode_step(X[:, t : t + 1], state)
            rows.append(logits.numpy())
        np.testing.assert_allclose(np.concatenate(rows, axis=1), lm(X).numpy(), atol=1e-10)


# -- memory -----------------------------------------------------------------------------------------
def fill(policy, options, tokens, d_head=64, dtype="float32"):
    mha = mt.nn.MultiHeadAttention(2 * d_head, 2, dtype=dtype)
    cache = mt.nn.attention.new_cache(policy, options)
    with mt.no_grad():
        for _ in range(tokens):
            _, cache = mha.cached_self_attention(mt.tensor(np.ones((1, 1, 2 * d_head)), dtype=dtype), cache)
    return cache


def test_memory():
    full, int8 = fill("full", {}, 40), fill("int8", {}, 40)
    assert full.bytes() == 2 * 40 * 2 * 64 * 4
    assert int8.bytes() == 2 * 40 * 2 * (64 + 4)  # d bytes + a float16 scale and zero per head and token
    assert int8.bytes() <= 0.3 * full.bytes()
    assert fill("int8", {}, 40, d_head=32).bytes() <= 0.3 * fill("full", {}, 40, d_head=32).bytes()
    assert fill("window", {"window": 8}, 40).bytes() == fill("window", {"window": 8}, 9).bytes()
    assert fill("sinks", {"sinks": 2, "window": 8}, 40).bytes() == 2 * 10 * 2 * 64 * 4


# -- beam search, copies, crop ---------------------------------------------------------------------------
@pytest.mark.parametrize("policy", ["full", "window", "sinks", "int8"])
def test_beam_search_reorders_every_policy(policy):
    from minitensor.inference import beam_search

    lm = tiny_lm(positional="rotary")
    state = lm.begin_decoding(policy, {"window": 4} if policy in ("window", "sinks") else {})
    (hyp,) = beam_search(lm, state, None, None, 12, beam_size=3, prompt=[[1, 2, 3]])
    assert len(hyp.tokens) == 12 and np.isfinite(hyp.score)


def test_decode_step_leaves_the_callers_state_as_it_was():
    lm = tiny_lm()
    with mt.no_grad():
        _, state = lm.decode_step(mt.tensor([[1, 2, 3]]), lm.begin_decoding())
        a, _ = lm.decode_step(mt.tensor([[4]]), state)
        b, _ = lm.decode_step(mt.tensor([[4]]), state)
    np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert lm.decoder.num_cached_steps(state) == 3


def test_crop_state_rolls_back():
    lm = tiny_lm(positional="rotary")
    with mt.no_grad():
        _, state = lm.decode_step(mt.tensor([[1, 2, 3, 4, 5]]), lm.begin_decoding())
        cropped = lm.crop_state(state, 3)
        again, _ = lm.decode_step(mt.tensor([[4]]), cropped)
        _, direct = lm.decode_step(mt.tensor([[1, 2, 3]]), lm.begin_decoding())
        expected, _ = lm.decode_step(mt.tensor([[4]]), direct)
    np.testing.assert_allclose(again.numpy(), expected.numpy(), atol=1e-12)
    assert lm.decoder.num_cached_steps(state) == 5  # the original state is untouched


# -- errors -----------------------------------------------------------------------------------------
def test_errors_name_the_policy_and_the_values():
    lm = tiny_lm()
    with pytest.raises(KeyError, match="unknown kv cache 'ful'; did you mean 'full'"):
        lm.begin_decoding("ful")
    with pytest.raises(TypeError, match="key/value cache 'window'.*'widnow'.*did you mean 'window'"):
        lm.begin_decoding("window", {"widnow": 3})
    for options in ({"window": 0}, {"window": 2.5}, {"window": True}):
        with pytest.raises(ValueError, match="'window': window must be an integer >= 1"):
            lm.begin_decoding("window", options)
    with pytest.raises(ValueError, match="'sinks': sinks must be an integer >= 0, got -1"):
        lm.begin_decoding("sinks", {"sinks": -1})
    with mt.no_grad():
        _, state = lm.decode_step(mt.tensor([[1, 2, 3]]), lm.begin_decoding("window", {"window": 2}))
    with pytest.raises(NotImplementedError, match="WindowCache cannot roll back to 1 tokens.*'full' or 'int8'"):
        lm.crop_state(state, 1)
    with pytest.raises(ValueError, match="crop_state: num_tokens must be between 0 and the 3 tokens seen, got 4"):
        lm.crop_state(state, 4)


class DropsTheNewTokens(WindowCache):
    def keys(self):
        return super().keys()[:, :, :1]

    def values(self):
        return super().values()[:, :, :1]

    def positions(self):
        return super().positions()[:1]


def test_a_broken_policy_is_named_by_the_layer():
    mha = mt.nn.MultiHeadAttention(8, 2)
    with pytest.raises(ValueError, match="key/value cache DropsTheNewTokens: it keeps 1 positions after appending 3"):
        mha.cached_self_attention(mt.randn(1, 3, 8), DropsTheNewTokens(window=4))


class UndeclaredReindexing(SinksCache):
    reindexes = False  # re-indexes (positions within the cache) without saying so


def test_a_policy_that_reindexes_must_declare_it():
    mha = mt.nn.MultiHeadAttention(8, 2, positional="rotary")
    cache = UndeclaredReindexing(sinks=1, window=2)
    with mt.no_grad():
        for _ in range(3):
            _, cache = mha.cached_self_attention(mt.randn(1, 1, 8), cache)
        with pytest.raises(ValueError, match="UndeclaredReindexing: positions.. place the new tokens at 2, not at"):
            mha.cached_self_attention(mt.randn(1, 1, 8), cache)


def test_kept_names_the_tokens_in_the_cache():
    lm = tiny_lm(positional="rotary")
    expected = {"full": list(range(12)), "window": list(range(7, 12)), "sinks": [0, 1] + list(range(9, 12))}
    for policy, options in (("full", {}), ("window", {"window": 5}), ("sinks", {"sinks": 2, "window": 3})):
        with mt.no_grad():
            state = lm.begin_decoding(policy, options)
            for t in range(12):
                _, state = lm.decode_step(mt.tensor([[t % 12]]), state)
        assert state[2][0].kept().tolist() == expected[policy], policy


class KeepsFloat16(WindowCache):
    def keys(self):
        return super().keys().astype("float16")


def test_a_policy_that_changes_the_dtype_is_named():
    mha = mt.nn.MultiHeadAttention(8, 2)
    with pytest.raises(ValueError, match="KeepsFloat16: keys.. and values.. are float16 and float32; what was"):
        mha.cached_self_attention(mt.randn(1, 3, 8), KeepsFloat16(window=4))


class Minimal:
    """A policy with the four required methods only (no KVCache base): what the contract asks."""

    def __init__(self):
        self.seen_tokens, self.k, self.v = 0, None, None

    def append(self, keys, values, positions):
        self.k = keys if self.k is None else mt.concat([self.k, keys], axis=2)
        self.v = values if self.v is None else mt.concat([self.v, values], axis=2)

    def keys(self):
        return self.k

    def values(self):
        return self.v

    def positions(self):
        return np.arange(self.k.shape[2])

    def bytes(self):
        return self.k.data.nbytes + self.v.data.nbytes


class MinimalCaches:
    @mt.hookimpl
    def minitensor_kv_caches(self):
        return {"my_minimal": Minimal}


def test_a_policy_with_only_the_required_methods_decodes_and_refuses_to_crop():
    name = mt.plugins.register(MinimalCaches())
    try:
        assert check_kv_cache(Minimal, positional="rotary")  # copy, select and crop are optional
        lm = tiny_lm(positional="rotary")
        X = mt.tensor(np.random.default_rng(0).integers(0, 12, (1, 6)))
        with mt.no_grad():
            state = lm.begin_decoding("my_minimal")
            rows = []
            for t in range(6):
                logits, state = lm.decode_step(X[:, t : t + 1], state)
                rows.append(logits.numpy())
            np.testing.assert_allclose(np.concatenate(rows, axis=1), lm(X).numpy(), atol=1e-10)
        with pytest.raises(NotImplementedError, match="Minimal has no crop"):
            lm.crop_state(state, 2)
    finally:
        mt.plugins.unregister(name=name)
