"""Streamed attention (``ops.flash_attention``, ``MultiHeadAttention(fused=...)``): the same
numbers as the plain path for every mask, bias and head layout, nothing of size Q x K kept or
allocated, tiles skipped where masks leave them empty, and weights on demand."""

import importlib
import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from minitensor.nn.attention import causal_mask
from minitensor.ops.flash_attention import flash_attention

import minitensor as mt
from minitensor import nn

fa = importlib.import_module("minitensor.ops.flash_attention")  # the module (mt.ops.flash_attention is the function)

TOLERANCE = {"float64": 1e-10, "float32": 1e-5}


@pytest.fixture
def small_blocks(monkeypatch):
    """Tiles of 4 queries x 8 keys, so that short sequences cross many blocks."""
    monkeypatch.setattr(fa, "BLOCK_Q", 4)
    monkeypatch.setattr(fa, "BLOCK_K", 8)


def plain_attention(q, k, v, valid_lens=None, mask=None, causal=False, table=None, dropout_p=0.0):
    """The reference: scores, dense bias, masked softmax, dropout, weights @ values, keys repeated
    per group."""
    B, H, Q, d = q.shape
    g, K = k.shape[1], k.shape[2]
    k = k.unsqueeze(2).expand(B, g, H // g, K, d).reshape(B, H, K, d)
    v = v.unsqueeze(2).expand(B, g, H // g, K, v.shape[-1]).reshape(B, H, K, v.shape[-1])
    scores = (q @ k.swapaxes(-1, -2)) * (1 / np.sqrt(d))
    if table is not None:
        columns = np.arange(K)[None, :] - np.arange(Q)[:, None] + Q - 1
        scores = scores + table[:, mt.tensor(columns, device=q.device)]
    if causal:
        allowed = causal_mask(Q, K, device=q.device)
        mask = allowed if mask is None else mask & allowed
    return mt.dropout(mt.masked_softmax(scores, valid_lens, mask), dropout_p) @ v


def random_case(rng, B, H, g, Q, K, d, dtype, device="cpu", table=False):
    def leaf(*shape):
        return mt.tensor(rng.standard_normal(shape), dtype=dtype, device=device, requires_grad=True)

    return leaf(B, H, Q, d), leaf(B, g, K, d), leaf(B, g, K, d), (leaf(H, Q + K - 1) if table else None)


def outputs_and_grads(fn, leaves, seed):
    for x in leaves:
        if x is not None:
            x.grad = None
    out = fn()
    G = np.random.default_rng(seed).standard_normal(out.shape)
    (out * mt.tensor(G, dtype=out.dtype, device=out.device)).sum().backward()
    return [out.numpy()] + [x.grad.numpy() for x in leaves if x is not None]


def assert_same(a, b, dtype):
    for x, y in zip(a, b, strict=True):
        assert not np.isnan(x).any()
        np.testing.assert_allclose(x, y, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype])


MASKS = ["none", "lens", "lens_per_query", "mask_qk", "mask_bqk", "mask_bhqk", "zero_lens"]


def make_masks(kind, rng, B, H, Q, K, device):
    if kind == "lens":
        return mt.tensor(rng.integers(1, K + 1, size=B), device=device), None
    if kind == "zero_lens":  # example 0 sees no key at all: its rows must be zeros
        return mt.tensor([0] + list(rng.integers(1, K + 1, size=B - 1)), device=device), None
    if kind == "lens_per_query":
        return mt.tensor(rng.integers(0, K + 1, size=(B, Q)), device=device), None
    shape = {"mask_qk": (Q, K), "mask_bqk": (B, 1, Q, K), "mask_bhqk": (B, H, Q, K)}.get(kind)
    if shape is None:
        return None, None
    return None, mt.tensor(rng.random(shape) > 0.3, device=device)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("masks", MASKS)
@pytest.mark.parametrize("causal", [False, True])
def test_flash_attention_equals_the_plain_path(small_blocks, dtype, masks, causal, device):
    rng = np.random.default_rng(len(masks) + causal)
    B, H, g, Q, K, d = 3, 4, 2, 13, 21, 8
    q, k, v, table = random_case(rng, B, H, g, Q, K, d, dtype, device, table=True)
    valid_lens, mask = make_masks(masks, rng, B, H, Q, K, device)
    leaves = (q, k, v, table)
    fused = outputs_and_grads(
        lambda: flash_attention(q, k, v, valid_lens, mask, causal, relative_bias=table), leaves, 1
    )
    plain = outputs_and_grads(lambda: plain_attention(q, k, v, valid_lens, mask, causal, table), leaves, 1)
    assert_same(fused, plain, dtype)


@settings(max_examples=25, deadline=None)
@given(
    B=st.integers(1, 2),
    layout=st.sampled_from([(1, 1), (2, 1), (2, 2), (4, 2), (4, 1)]),
    Q=st.integers(1, 19),
    K=st.integers(1, 19),
    blocks=st.tuples(st.integers(1, 9), st.integers(1, 9)),
    causal=st.booleans(),
    with_table=st.booleans(),
    dropout_p=st.sampled_from([0.0, 0.0, 0.4]),
    seed=st.integers(0, 2**16),
)
def test_any_shape_and_block_size_gives_the_plain_result(
    B, layout, Q, K, blocks, causal, with_table, dropout_p, seed
):  # fmt: skip
    rng = np.random.default_rng(seed)
    H, g = layout
    q, k, v, table = random_case(rng, B, H, g, Q, K, 3, "float64", table=with_table)
    valid_lens = mt.tensor(rng.integers(0, K + 1, size=B))
    leaves = (q, k, v, table)
    fused = outputs_and_grads(
        seeded(
            lambda: flash_attention(
                q, k, v, valid_lens, causal=causal, relative_bias=table, block_q=blocks[0], block_k=blocks[1],
                dropout_p=dropout_p,
            )
        ),
        leaves,
        seed,
    )  # fmt: skip
    plain = outputs_and_grads(
        seeded(lambda: plain_attention(q, k, v, valid_lens, None, causal, table, dropout_p)), leaves, seed
    )
    assert_same(fused, plain, "float64")


# -- dropout on the weights, inside the stream ------------------------------------------------------
def seeded(fn, seed=7):
    """``fn`` run after ``mt.manual_seed(seed)``: both paths draw their dropout seed from there."""

    def run():
        mt.manual_seed(seed)
        return fn()

    return run


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("masks", ["none", "lens_per_query", "mask_bhqk", "zero_lens"])
@pytest.mark.parametrize("causal", [False, True])
def test_dropout_in_the_stream_drops_what_mt_dropout_drops(small_blocks, dtype, masks, causal, device):
    """flash_attention(dropout_p=p) equals mt.dropout(weights, p) @ V with the same seed: the
    stream numbers each weight as in the whole (batch, H, Q, K) weights, tile by tile, in the
    forward pass and again in backward (grouped heads, a bias table, masks)."""
    rng = np.random.default_rng(3 + causal)
    B, H, g, Q, K, d = 3, 4, 2, 13, 21, 8
    q, k, v, table = random_case(rng, B, H, g, Q, K, d, dtype, device, table=True)
    valid_lens, mask = make_masks(masks, rng, B, H, Q, K, device)
    leaves = (q, k, v, table)
    fused = outputs_and_grads(
        seeded(lambda: flash_attention(q, k, v, valid_lens, mask, causal, relative_bias=table, dropout_p=0.3)),
        leaves,
        1,
    )
    plain = outputs_and_grads(
        seeded(lambda: plain_attention(q, k, v, valid_lens, mask, causal, table, dropout_p=0.3)), leaves, 1
    )
    assert_same(fused, plain, dtype)
    undropped = outputs_and_grads(
        lambda: flash_attention(q, k, v, valid_lens, mask, causal, relative_bias=table), leaves, 1
    )
    assert not np.allclose(fused[0], undropped[0])  # it did drop something


def test_dropout_in_the_stream_keeps_1_minus_p_of_the_weights_and_draws_anew(small_blocks):
    """Equal scores and values e_j: each output row is that row's dropped weights, 1 / (K (1 - p))
    where kept: about 1 - p of them kept, independently from tile to tile and call to call."""
    mt.manual_seed(0)
    B, H, Q, K, p = 2, 2, 40, 64, 0.25
    q = mt.zeros(B, H, Q, K)
    k = mt.zeros(B, H, K, K)
    v = mt.tensor(np.broadcast_to(np.eye(K, dtype=np.float32), (B, H, K, K)).copy())
    first = flash_attention(q, k, v, dropout_p=p).numpy()
    kept = first != 0
    np.testing.assert_allclose(first[kept], 1 / (K * (1 - p)), rtol=1e-6)
    assert abs(kept.mean() - (1 - p)) < 0.02  # 10,240 weights
    second = flash_attention(q, k, v, dropout_p=p).numpy()
    assert (kept != (second != 0)).mean() > 0.2  # a new seed, a new mask
    assert not flash_attention(q, k, v, dropout_p=1.0).numpy().any()
    np.testing.assert_allclose(flash_attention(q, k, v, dropout_p=0.0).numpy(), 1 / K, rtol=1e-6)
    for bad in (-0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match="flash_attention: dropout_p must be a probability"):
            flash_attention(q, k, v, dropout_p=bad)
    for bad in ("0.1", None, True):
        with pytest.raises(TypeError, match="flash_attention: dropout_p must be a number"):
            flash_attention(q, k, v, dropout_p=bad)


def test_gradcheck_through_the_stream_with_dropout(small_blocks):
    rng = np.random.default_rng(2)
    q, k, v, table = random_case(rng, 2, 2, 1, 6, 10, 3, "float64", table=True)
    lens = mt.tensor([10, 4])
    assert mt.gradcheck(
        lambda q, k, v, t: seeded(
            lambda: flash_attention(q, k, v, lens, causal=True, relative_bias=t, dropout_p=0.4)
        )(),
        (q, k, v, table),
    )


def test_gradcheck_through_queries_keys_values_and_the_bias_table(small_blocks):
    rng = np.random.default_rng(0)
    q, k, v, table = random_case(rng, 2, 2, 1, 6, 10, 3, "float64", table=True)
    lens = mt.tensor([10, 4])
    assert mt.gradcheck(
        lambda q, k, v, t: flash_attention(q, k, v, lens, causal=True, relative_bias=t), (q, k, v, table)
    )


def test_a_fully_masked_row_gives_zeros_and_zero_gradients(small_blocks):
    rng = np.random.default_rng(1)
    q, k, v, _ = random_case(rng, 2, 2, 2, 5, 9, 4, "float32")
    mask = mt.tensor(rng.random((2, 2, 5, 9)) > 0.5)
    mask.data[0, 1, 3] = False  # head 1, query 3 of example 0: no key
    out = flash_attention(q, k, v, mt.tensor([0, 9]), mask)  # example 0: valid_lens 0, no key anywhere
    out.sum().backward()
    assert np.array_equal(out.numpy()[0], np.zeros((2, 5, 4)))
    assert not np.isnan(q.grad.numpy()).any() and np.array_equal(q.grad.numpy()[0], np.zeros((2, 5, 4)))
    _, lse = flash_attention(q, k, v, mt.tensor([0, 9]), mask, return_lse=True)
    assert np.isinf(lse.numpy()[0]).all() and np.isfinite(lse.numpy()[1]).all()


# -- what is computed, what is kept -------------------------------------------------------------------
def count_tiles(monkeypatch):
    calls = []
    scores = fa.StreamPlan.scores

    def counted(self, q_block, k, i0, i1, j0, j1):
        calls.append((i0, j0))
        return scores(self, q_block, k, i0, i1, j0, j1)

    monkeypatch.setattr(fa.StreamPlan, "scores", counted)
    return calls


def test_causal_tiles_in_the_future_are_skipped(monkeypatch):
    calls = count_tiles(monkeypatch)
    rng = np.random.default_rng(2)
    q, k, v, _ = random_case(rng, 1, 1, 1, 32, 32, 4, "float64")
    flash_attention(q, k, v, causal=True, block_q=8, block_k=8).sum().backward()
    # 4 x 4 tiles, 10 on or below the diagonal: forward 10, backward 10
    assert len(calls) == 20 and all(j0 <= i0 for i0, j0 in calls)


def test_a_window_and_valid_lens_skip_the_tiles_they_empty(monkeypatch):
    calls = count_tiles(monkeypatch)
    rng = np.random.default_rng(3)
    q, k, v, _ = random_case(rng, 1, 2, 2, 64, 64, 4, "float64")
    window = nn.MultiHeadAttention(8, 2, positional="sliding_window", positional_options={"window": 3})
    table = window.positional.relative_bias(-63, 63).to(mt.float64)
    flash_attention(q, k, v, relative_bias=table, window=3, block_q=8, block_k=8)
    assert len(calls) == 8 * 3 - 2  # the diagonal tiles and their two neighbours
    calls.clear()
    flash_attention(q, k, v, valid_lens=mt.tensor([20]), block_q=8, block_k=8)
    assert len(calls) == 8 * 3  # key blocks 0..2 hold the 20 valid keys


def test_nothing_of_size_q_by_k_is_saved_or_allocated():
    """At T = 2048 one (Q, K) float64 array is 32 MiB; the stream's tiles are 256 x 256."""
    T, d = 2048, 16
    rng = np.random.default_rng(4)
    q, k, v, _ = random_case(rng, 1, 1, 1, T, T, d, "float64")
    table = mt.tensor(rng.standard_normal((1, 2 * T - 1)), requires_grad=True)
    q_by_k = T * T * 8
    tracemalloc.start()
    try:
        out = flash_attention(q, k, v, mt.tensor([T - 5]), causal=True, relative_bias=table)
        saved = out.grad_fn.saved
        out.backward(mt.ones(out.shape, dtype=mt.float64))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert max(a.nbytes for a in saved) < q_by_k / 64
    assert peak < q_by_k / 4, f"peak traced allocation {peak / 2**20:.1f} MiB"
    assert q.grad is not None and table.grad is not None


# -- one tile: the stream's form for short sequences, its weights kept ----------------------------------
def one_tile(q, k, v, valid_lens=None, mask=None, causal=False, table=None, dropout_p=0.0):
    """``flash_attention`` as ``MultiHeadAttention`` calls it on a short sequence (keep_weights)."""
    plan = fa.stream_plan(
        q, k, v, valid_lens, mask, causal, relative_bias=table, keep_weights=True, dropout_p=dropout_p
    )
    assert plan.keep_weights  # one tile, on the CPU
    return fa.FlashAttention.apply(q, k, v, table, plan=plan, masks=plan.masks)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("masks", MASKS)
@pytest.mark.parametrize("causal", [False, True])
def test_one_tile_equals_the_plain_path(dtype, masks, causal):
    rng = np.random.default_rng(len(masks) + 2 * causal)
    B, H, g, Q, K, d = 3, 4, 2, 13, 21, 8
    q, k, v, table = random_case(rng, B, H, g, Q, K, d, dtype, table=True)
    valid_lens, mask = make_masks(masks, rng, B, H, Q, K, "cpu")
    leaves = (q, k, v, table)
    fused = outputs_and_grads(lambda: one_tile(q, k, v, valid_lens, mask, causal, table), leaves, 2)
    plain = outputs_and_grads(lambda: plain_attention(q, k, v, valid_lens, mask, causal, table), leaves, 2)
    assert_same(fused, plain, dtype)


@settings(max_examples=25, deadline=None)
@given(
    B=st.integers(1, 2),
    layout=st.sampled_from([(1, 1), (2, 1), (2, 2), (4, 2), (4, 1)]),
    Q=st.integers(1, 40),
    K=st.integers(1, 40),
    causal=st.booleans(),
    per_query=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_one_tile_of_any_shape_gives_the_plain_result(B, layout, Q, K, causal, per_query, seed):
    rng = np.random.default_rng(seed)
    H, g = layout
    q, k, v, _ = random_case(rng, B, H, g, Q, K, 3, "float64")
    valid_lens = mt.tensor(rng.integers(0, K + 1, size=(B, Q) if per_query else B))
    fused = outputs_and_grads(lambda: one_tile(q, k, v, valid_lens, causal=causal), (q, k, v), seed)
    plain = outputs_and_grads(lambda: plain_attention(q, k, v, valid_lens, None, causal), (q, k, v), seed)
    assert_same(fused, plain, "float64")


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("causal", [False, True])
def test_one_tile_with_dropout_equals_the_plain_path(dtype, causal):
    """One tile drops its kept weights with the plain path's mask (the same seed): the output and
    every gradient, and the weights it keeps are those before dropout, as the plain path's."""
    rng = np.random.default_rng(4)
    B, H, g, Q, K, d = 2, 4, 2, 13, 21, 8
    q, k, v, table = random_case(rng, B, H, g, Q, K, d, dtype, table=True)
    valid_lens = mt.tensor(rng.integers(0, K + 1, size=(B, Q)))
    leaves = (q, k, v, table)
    fused = outputs_and_grads(seeded(lambda: one_tile(q, k, v, valid_lens, None, causal, table, 0.3)), leaves, 2)
    plain = outputs_and_grads(
        seeded(lambda: plain_attention(q, k, v, valid_lens, None, causal, table, dropout_p=0.3)), leaves, 2
    )
    assert_same(fused, plain, dtype)
    assert mt.gradcheck(
        lambda q, k, v: seeded(lambda: one_tile(q, k, v, valid_lens, causal=causal, dropout_p=0.5))(),
        tuple(mt.tensor(x.numpy(), dtype="float64", requires_grad=True) for x in (q, k, v)),
    )


def test_float16_short_sequences_stream_their_tiles():
    """The one-tile form runs the softmax kernels, which take float32 and float64: a float16 call
    (a layer in half precision) streams its one tile instead, and gives the float32 result to
    float16's precision, dropout included."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 40, 16))
    results = []
    for dtype in ("float32", "float16"):
        mt.manual_seed(0)
        layer = nn.MultiHeadAttention(16, 2, dropout=0.2, dtype=dtype)  # fused="auto", in training
        X = mt.tensor(x, dtype=dtype, requires_grad=True)
        mt.manual_seed(1)
        out = layer(X, X, X, causal=True)
        out.sum().backward()
        assert layer._stream is not None and layer._stream.keep_weights == (dtype == "float32")
        results.append((out.numpy().astype(np.float64), X.grad.numpy().astype(np.float64)))
    for want, got in zip(*results):
        np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2)


def test_gradcheck_through_one_tile():
    rng = np.random.default_rng(1)
    q, k, v, table = random_case(rng, 2, 2, 1, 6, 10, 3, "float64", table=True)
    lens = mt.tensor([10, 4])
    assert mt.gradcheck(lambda q, k, v, t: one_tile(q, k, v, lens, causal=True, table=t), (q, k, v, table))


SHORT_CASES = [{}, {"num_kv_heads": 2}, {"num_kv_heads": 1, "scorer": "dot"}, {"positional": "rotary"}]


@pytest.mark.parametrize("options", SHORT_CASES, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "plain")
def test_a_short_sequence_takes_one_tile_with_the_plain_result(options):
    mt.manual_seed(0)
    plain = nn.MultiHeadAttention(16, 4, fused=False, dtype="float64", **options)
    auto = nn.MultiHeadAttention(16, 4, dtype="float64", **options)
    auto.load_state_dict(plain.state_dict())
    X = mt.tensor(np.random.default_rng(8).standard_normal((2, 11, 16)))
    results = []
    for layer in (plain, auto):
        out = layer(X, X, X, valid_lens=mt.tensor([11, 6]), causal=True)
        out.sum().backward()
        results.append([out.numpy(), layer.attention_weights.numpy()] + [p.grad.numpy() for p in layer.parameters()])
    assert auto._stream.keep_weights and plain._stream is None
    assert_same(results[1], results[0], "float64")  # the output, the kept weights, every gradient
    np.testing.assert_allclose(
        auto.attention_weights_for(heads=1, rows=[2, 3]).numpy(), results[0][1][:, [1]][:, :, [2, 3]]
    )
    with mt.no_grad():  # decoding with a cache: Q = 1 against the cached keys, the same text
        caches, outs = [None, None], [[], []]
        for t, size in ((0, 5), (5, 1), (6, 2)):
            for n, layer in enumerate((plain, auto)):
                out, caches[n] = layer.cached_self_attention(X[:, t : t + size], caches[n])
                outs[n].append(out.numpy())
    for a, b in zip(*outs, strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-10, atol=1e-10)


# -- the layer: fused="auto" | True | False ------------------------------------------------------------
def twin_layers(dtype="float64", **options):
    mt.manual_seed(0)
    plain = nn.MultiHeadAttention(16, 4, fused=False, dtype=dtype, **options)
    fused = nn.MultiHeadAttention(16, 4, fused=True, dtype=dtype, **options)
    fused.load_state_dict(plain.state_dict())
    return plain, fused


LAYER_CASES = [
    {},
    {"num_kv_heads": 2},
    {"num_kv_heads": 1, "scorer": "dot"},
    {"positional": "alibi"},
    {"positional": "t5_relative"},
    {"positional": "sliding_window", "positional_options": {"window": 2}},
    {"positional": "rotary"},
    {"positional": "t5_relative", "num_kv_heads": 2},
]


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("options", LAYER_CASES, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "plain")
def test_the_layer_streams_to_the_same_result(small_blocks, dtype, options):
    plain, fused = twin_layers(dtype, **options)
    rng = np.random.default_rng(5)
    X = mt.tensor(rng.standard_normal((2, 11, 16)), dtype=dtype)
    lens = mt.tensor([11, 6])
    results = []
    for layer in (plain, fused):
        out = layer(X, X, X, valid_lens=lens, causal=True)
        out.sum().backward()
        results.append([out.numpy()] + [p.grad.numpy() for p in layer.parameters()])
    assert fused._stream is not None and plain._stream is None
    assert_same(results[1], results[0], dtype)


@pytest.mark.parametrize("options", LAYER_CASES, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "plain")
def test_a_training_layer_with_weight_dropout_streams_to_the_same_result(small_blocks, options):
    """In training, a layer with dropout on its weights streams (fused="auto" at any length here,
    fused=True) and drops inside the stream exactly what its plain twin's Dropout drops."""
    plain, fused = twin_layers("float64", dropout=0.2, **options)
    rng = np.random.default_rng(8)
    X = mt.tensor(rng.standard_normal((2, 11, 16)), dtype="float64")
    results = []
    for layer in (plain, fused):
        mt.manual_seed(21)
        out = layer(X, X, X, valid_lens=mt.tensor([11, 6]), causal=True)
        out.sum().backward()
        results.append([out.numpy()] + [p.grad.numpy() for p in layer.parameters()])
    assert fused._stream is not None and fused._stream.dropout_p == 0.2 and plain._stream is None
    assert_same(results[1], results[0], "float64")


@pytest.mark.parametrize("options", LAYER_CASES[:6], ids=str)
def test_cached_decoding_streams_to_the_same_result(small_blocks, options):
    plain, fused = twin_layers(**options)
    rng = np.random.default_rng(6)
    X = mt.tensor(rng.standard_normal((2, 9, 16)), dtype="float64")
    with mt.no_grad():
        caches = [None, None]
        for t, size in ((0, 5), (5, 1), (6, 1), (7, 2)):  # a prompt of 5, then Q = 1 steps, then 2
            outs = []
            for n, layer in enumerate((plain, fused)):
                out, caches[n] = layer.cached_self_attention(X[:, t : t + size], caches[n])
                outs.append(out.numpy())
            np.testing.assert_allclose(outs[1], outs[0], rtol=1e-10, atol=1e-10)


def test_attention_weights_for_recomputes_what_the_plain_path_keeps(small_blocks):
    plain, fused = twin_layers(positional="alibi", num_kv_heads=2)
    X = mt.tensor(np.random.default_rng(7).standard_normal((2, 10, 16)))
    with mt.no_grad():
        plain(X, X, X, valid_lens=[10, 3], causal=True)
        fused(X, X, X, valid_lens=[10, 3], causal=True)
    assert fused.attention_weights is None
    full = plain.attention_weights.numpy()
    np.testing.assert_allclose(fused.attention_weights_for().numpy(), full, atol=1e-12)
    np.testing.assert_allclose(
        fused.attention_weights_for(heads=[3, 0], rows=[9, 2, 4]).numpy(), full[:, [3, 0]][:, :, [9, 2, 4]], atol=1e-12
    )
    np.testing.assert_allclose(
        fused.attention_weights_for(heads=1, rows=-1).numpy(), full[:, [1]][:, :, [9]], atol=1e-12
    )
    assert plain.attention_weights_for(heads=[1], rows=[2]).shape == (2, 1, 1, 10)
    with pytest.raises(IndexError, match="heads"):
        fused.attention_weights_for(heads=[4])


def test_auto_streams_long_sequences_only_where_exact():
    mt.manual_seed(0)
    layer = nn.MultiHeadAttention(8, 2)
    assert layer.fused == "auto"
    short = mt.randn(1, 16, 8)
    long = mt.randn(1, nn.attention.FUSED_MIN_LENGTH, 8)
    with mt.no_grad():
        layer(short, short, short, causal=True)  # one tile: the stream keeps its weights
        assert layer._stream.keep_weights and layer.attention_weights is not None
        layer(long, long, long, causal=True)
        assert not layer._stream.keep_weights and layer.attention_weights is None
    dropping = nn.MultiHeadAttention(8, 2, dropout=0.1)
    dropping(long, long, long)  # training with dropout on the weights: streamed, dropped inside
    assert dropping._stream is not None and dropping._stream.dropout_p == 0.1
    dropping.eval()
    dropping(long, long, long)
    assert dropping._stream is not None and dropping._stream.dropout_p == 0
    additive = nn.MultiHeadAttention(8, 2, scorer="additive")
    with mt.no_grad():
        additive(long, long, long)
    assert additive._stream is None


def test_auto_keeps_a_dense_mask_on_the_plain_path_on_a_gpu(monkeypatch):
    """The GPU's kernels take valid_lens and causal but no bool mask; streaming one there would
    be a loop over tiles of CuPy operators, thousands of launches: "auto" takes the plain path
    (the CPU streams it), and fused=True still streams it."""
    from fake_cupy import fake_cuda_backend

    from minitensor import backends

    monkeypatch.setitem(backends._BACKENDS, "cuda", fake_cuda_backend())
    T = nn.attention.FUSED_MIN_LENGTH
    for device, streams in (("cuda", False), ("cpu", True)):
        mt.manual_seed(0)
        layer = nn.MultiHeadAttention(8, 2).to(device)
        X, mask = mt.randn(1, T, 8, device=device), mt.ones(1, T, T, dtype=mt.bool, device=device)
        with mt.no_grad():
            layer(X, X, X, mask=mask)
            assert (layer._stream is not None) == streams, device
            layer(X, X, X, valid_lens=mt.tensor([T - 3], device=device))
            assert layer._stream is not None, device  # lengths: the kernels take them
            layer.fused = True
            layer(X, X, X, mask=mask)
            assert layer._stream is not None, device


def test_fused_true_says_why_it_cannot_stream():
    with pytest.raises(ValueError, match="scorer 'additive'"):
        nn.MultiHeadAttention(8, 2, scorer="additive", fused=True)
    with pytest.raises(ValueError, match="pooling 'sparsemax'"):
        nn.MultiHeadAttention(8, 2, pooling="sparsemax", fused=True)
    with pytest.raises(ValueError, match="fused must be 'auto', True or False"):
        nn.MultiHeadAttention(8, 2, fused="yes")
    assert nn.MultiHeadAttention(8, 2, dropout=0.2, fused=True).why_not_fused() is None  # dropped in the stream


def test_a_dense_only_score_bias_cannot_stream():
    class Dense(nn.Module):
        applies_to = "scores"

        def __init__(self, num_heads, max_len=1000, **options):
            super().__init__()

        def forward(self, num_queries, num_keys, q_offset=0, k_offset=0):
            return mt.zeros(1, num_queries, num_keys)

    with pytest.raises(ValueError, match="not relative"):
        nn.MultiHeadAttention(8, 2, positional=Dense(2), fused=True)
    assert nn.MultiHeadAttention(8, 2, positional=Dense(2)).why_not_fused() is not None


def test_wrong_inputs_are_named():
    q = mt.randn(1, 2, 3, 4)
    with pytest.raises(mt.ShapeError, match="keys"):
        flash_attention(q, mt.randn(1, 3, 3, 4), mt.randn(1, 3, 3, 4))
    with pytest.raises(mt.ShapeError, match="relative_bias of shape"):
        flash_attention(q, q, q, relative_bias=mt.randn(2, 3))
    with pytest.raises(mt.ShapeError, match="valid_lens of shape"):
        flash_attention(q, q, q, valid_lens=[1, 2])
    with pytest.raises(TypeError, match="valid_lens must be integers"):
        flash_attention(q, q, q, valid_lens=mt.tensor([1.5]))
    with pytest.raises(mt.ShapeError, match="mask of shape"):
        flash_attention(q, q, q, mask=mt.tensor(np.ones((2, 2), dtype=bool)))
    with pytest.raises(ValueError, match="window=2 comes with the relative_bias table"):
        flash_attention(q, q, q, window=2)
    assert mt.flash_attention is flash_attention


def test_plain_attention_keeps_the_weights_of_a_pass_that_would_stream():
    mt.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8))
    model.attn = nn.MultiHeadAttention(8, 2, fused=True)
    X = mt.randn(1, 6, 8)
    with nn.attention.plain_attention(model):
        model.attn(X, X, X)
        assert model.attn._stream is None and model.attn.attention_weights.shape == (1, 2, 6, 6)
    assert model.attn.fused is True
