"""Attention layers: Attention (one head, plugins by name) and MultiHeadAttention, against
NumPy references written from the formulas; masks, causality with a cache, dropout, gradients,
the strict device, plugin errors, and (optionally) PyTorch's MultiheadAttention."""

import numpy as np
import pytest
from helpers import array_type, check

import minitensor as mt
from minitensor import hookimpl


# -- NumPy references ---------------------------------------------------------------------------
def np_attention(q, k, v, scale=1.0, allowed=None):
    """softmax(q k^T * scale) v over the allowed keys (bool, broadcast to the scores);
    a row with no allowed key gets zero weights. Returns (output, weights)."""
    scores = q @ np.swapaxes(k, -1, -2) * scale
    if allowed is not None:
        scores = np.where(allowed, scores, -np.inf)
    top = scores.max(axis=-1, keepdims=True)
    e = np.exp(scores - np.where(np.isfinite(top), top, 0))
    total = e.sum(axis=-1, keepdims=True)
    weights = np.divide(e, total, out=np.zeros_like(e), where=total > 0)
    return weights @ v, weights


def lens_to_allowed(valid_lens, Q, K):
    """(batch,) or (batch, Q) lengths -> bool (batch, Q, K): key j allowed when j < length."""
    lens = np.asarray(valid_lens)
    lens = np.broadcast_to(lens[:, None], (len(lens), Q)) if lens.ndim == 1 else lens
    return np.arange(K) < lens[:, :, None]


def np_causal(Q, K):
    return np.arange(K)[None, :] <= np.arange(Q)[:, None] + (K - Q)


def np_mha(mha, queries, keys, values, allowed=None):
    """Multi-head attention written head by head from its own weights (loop over heads here,
    never in the code under test): head_i = attention(Q W_q^(i), K W_k^(i), V W_v^(i)),
    output = concat(heads) W_o. ``allowed``: bool (batch, Q, K) or (Q, K)."""

    def weight(layer):
        return layer.weight.numpy(), (0 if layer.bias is None else layer.bias.numpy())

    (Wq, bq), (Wk, bk), (Wv, bv), (Wo, bo) = (weight(m) for m in (mha.W_q, mha.W_k, mha.W_v, mha.W_o))
    d = mha.head_size
    heads, all_weights = [], []
    for i in range(mha.num_heads):
        rows = slice(i * d, (i + 1) * d)
        q = queries @ Wq[rows].T + (bq[rows] if mha.W_q.bias is not None else 0)
        k = keys @ Wk[rows].T + (bk[rows] if mha.W_k.bias is not None else 0)
        v = values @ Wv[rows].T + (bv[rows] if mha.W_v.bias is not None else 0)
        out, w = np_attention(q, k, v, 1 / np.sqrt(d), allowed)
        heads.append(out)
        all_weights.append(w)
    return np.concatenate(heads, axis=-1) @ Wo.T + bo, np.stack(all_weights, axis=1)


def randn(*shape, seed=0, dtype="float64", device="cpu", requires_grad=False):
    a = np.random.default_rng([seed, *shape]).standard_normal(shape)
    return mt.tensor(a, dtype=dtype, device=device, requires_grad=requires_grad)


def make_mha(*args, seed=0, device="cpu", **kwargs):
    """A float64 layer (its rotary tables computed in float64 too) on ``device``."""
    mt.manual_seed(seed)
    return mt.nn.MultiHeadAttention(*args, dtype=mt.float64, **kwargs).to(device)


# -- Attention ----------------------------------------------------------------------------------
@pytest.mark.parametrize("scorer, scale", [("dot", 1.0), ("scaled_dot", 1 / np.sqrt(6))])
def test_attention_equals_the_formula(device, scorer, scale):
    attn = mt.nn.Attention(scorer, "softmax", 0.0, 6, 6)
    q, k = randn(2, 3, 6, device=device), randn(2, 5, 6, seed=1, device=device)
    v = randn(2, 5, 4, seed=2, device=device)
    out = attn(q, k, v)
    ref, weights = np_attention(q.numpy(), k.numpy(), v.numpy(), scale)
    np.testing.assert_allclose(out.numpy(), ref, atol=1e-12)
    np.testing.assert_allclose(attn.attention_weights.numpy(), weights, atol=1e-12)
    assert isinstance(out.data, array_type(device))


@pytest.mark.parametrize("kind", ["lens 1-D", "lens 2-D", "bool mask"])
def test_masked_keys_get_zero_weight(device, kind):
    attn = mt.nn.Attention("scaled_dot", "softmax", 0.0, 4, 4)
    q, k = randn(2, 3, 4, device=device), randn(2, 5, 4, seed=1, device=device)
    v = randn(2, 5, 3, seed=2, device=device)
    if kind == "lens 1-D":
        arguments, allowed = {"valid_lens": [2, 4]}, lens_to_allowed([2, 4], 3, 5)
    elif kind == "lens 2-D":
        lens = np.array([[1, 2, 5], [3, 0, 4]])  # a query with no key at all: zero weights
        arguments, allowed = {"valid_lens": mt.tensor(lens, device=device)}, lens_to_allowed(lens, 3, 5)
    else:
        allowed = np.random.default_rng(3).random((2, 3, 5)) < 0.6
        arguments = {"mask": mt.tensor(allowed, device=device)}
    out = attn(q, k, v, **arguments)
    weights = attn.attention_weights.numpy()
    assert (weights[~allowed] == 0).all()
    ref, ref_weights = np_attention(q.numpy(), k.numpy(), v.numpy(), 0.5, allowed)
    np.testing.assert_allclose(weights, ref_weights, atol=1e-12)
    np.testing.assert_allclose(out.numpy(), ref, atol=1e-12)
    assert np.isfinite(out.numpy()).all()


def test_valid_lens_as_array_list_or_tensor_agree():
    attn = mt.nn.Attention("dot", "softmax", 0.0, 4, 4)
    q, k, v = randn(3, 2, 4), randn(3, 4, 4, seed=1), randn(3, 4, 4, seed=2)
    outs = [attn(q, k, v, valid_lens=lens).numpy() for lens in ([1, 2, 3], np.array([1, 2, 3]), mt.tensor([1, 2, 3]))]
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_array_equal(outs[0], outs[2])


def test_causal_outputs_ignore_later_inputs():
    attn = mt.nn.Attention("scaled_dot", "softmax", 0.0, 4, 4)
    X = randn(2, 6, 4)
    out = attn(X, X, X, causal=True).numpy()
    for t in range(5):
        changed = X.numpy().copy()
        changed[:, t + 1 :] += np.random.default_rng(t).standard_normal(changed[:, t + 1 :].shape)
        Y = mt.tensor(changed)
        new = attn(Y, Y, Y, causal=True).numpy()
        np.testing.assert_allclose(new[:, : t + 1], out[:, : t + 1], atol=1e-12)
        assert np.abs(new[:, t + 1 :] - out[:, t + 1 :]).max() > 1e-3  # the later outputs did change


def test_causal_with_a_cache_of_keys_and_a_mask():
    """K > Q: the queries are the last Q positions; query i sees keys j <= i + (K - Q). A given
    mask is combined with the causal one by AND."""
    attn = mt.nn.Attention("dot", "softmax", 0.0, 3, 3)
    q, k, v = randn(2, 2, 3), randn(2, 5, 3, seed=1), randn(2, 5, 3, seed=2)
    attn(q, k, v, causal=True)
    allowed = np_causal(2, 5)
    assert allowed.tolist() == [[True, True, True, True, False], [True, True, True, True, True]]
    causal_only = np_attention(q.numpy(), k.numpy(), v.numpy(), 1.0, allowed)[1]
    np.testing.assert_allclose(attn.attention_weights.numpy(), causal_only, atol=1e-12)

    mask = np.array([[True, False, True, True, True]] * 2)
    attn(q, k, v, mask=mt.tensor(mask), causal=True)
    both = np_attention(q.numpy(), k.numpy(), v.numpy(), 1.0, allowed & mask)[1]
    np.testing.assert_allclose(attn.attention_weights.numpy(), both, atol=1e-12)


def test_attention_weights_are_detached_and_kept_before_dropout():
    attn = mt.nn.Attention("dot", "softmax", 0.5, 4, 4)
    q = randn(2, 3, 4, requires_grad=True)
    attn(q, q, q)
    w = attn.attention_weights
    assert w.shape == (2, 3, 3) and not w.requires_grad and w.grad_fn is None
    np.testing.assert_allclose(w.numpy().sum(axis=-1), 1.0)


def test_dropout_acts_on_the_weights():
    """With values all 1 the output is the sum of a row's weights: 1 without dropout; with
    the weights dropped (p = 0.5, survivors doubled) a sum of some doubled weights, which is
    neither 0 nor 2 as dropping the *outputs* would give, and 1 on average."""
    attn = mt.nn.Attention("dot", "softmax", 0.5, 4, 4)
    q, k = randn(50, 8, 4), randn(50, 8, 4, seed=1)
    ones = mt.ones(50, 8, 1, dtype=mt.float64)
    mt.manual_seed(0)
    out = attn(q, k, ones).numpy()
    assert ((out > 1e-9) & (np.abs(out - 2) > 1e-9)).mean() > 0.5
    assert abs(out.mean() - 1) < 0.05
    np.testing.assert_allclose(attn.eval()(q, k, ones).numpy(), 1.0)


def test_attention_gradcheck(device):
    attn = mt.nn.Attention("scaled_dot", "softmax", 0.0, 3, 3)
    q = randn(2, 2, 3, device=device, requires_grad=True)
    k = randn(2, 4, 3, seed=1, device=device, requires_grad=True)
    v = randn(2, 4, 2, seed=2, device=device, requires_grad=True)
    check(lambda q, k, v: attn(q, k, v, valid_lens=[3, 4], causal=True), q, k, v)


# -- plugins in the layer: lookups and shape errors ---------------------------------------------
class WrongShapeScorer(mt.nn.Module):
    """Forgets the query axis: (..., Q, d), (..., K, d) -> (..., K) instead of (..., Q, K)."""

    def __init__(self, query_size, key_size, **options):
        super().__init__()

    def forward(self, queries, keys):
        return keys.sum(axis=-1)


class WrongShapePooling(mt.nn.Module):
    def __init__(self, **options):
        super().__init__()

    def forward(self, scores, valid_lens=None, mask=None):
        return scores[..., :1]


class BadPlugins:
    @hookimpl
    def minitensor_scorers(self):
        return {"wrong_shape": WrongShapeScorer}

    @hookimpl
    def minitensor_poolings(self):
        return {"wrong_shape_pooling": WrongShapePooling}


def test_plugin_with_wrong_output_shape_is_named_with_both_shapes():
    plugin = BadPlugins()
    mt.plugins.register(plugin)
    try:
        q, k = randn(2, 3, 4), randn(2, 5, 4, seed=1)
        attn = mt.nn.Attention("wrong_shape", "softmax", 0.0, 4, 4)
        with pytest.raises(mt.ShapeError) as error:
            attn(q, k, k)
        message = str(error.value)
        for part in ("scorer", "'wrong_shape'", "WrongShapeScorer", "(2, 5)", "expected (2, 3, 5)"):
            assert part in message

        attn = mt.nn.Attention("dot", "wrong_shape_pooling", 0.0, 4, 4)
        pattern = r"pooling 'wrong_shape_pooling' \(.*WrongShapePooling\).*\(2, 3, 1\).*\(2, 3, 5\)"
        with pytest.raises(mt.ShapeError, match=pattern):
            attn(q, k, k)

        mha = mt.nn.MultiHeadAttention(8, 2, scorer="wrong_shape")  # inside multi-head attention too
        X = mt.randn(2, 3, 8)
        with pytest.raises(mt.ShapeError, match=r"'wrong_shape'.*\(2, 2, 3\).*expected \(2, 2, 3, 3\)"):
            mha(X, X, X)
    finally:
        mt.plugins.unregister(plugin)
    with pytest.raises(KeyError, match="wrong_shape"):
        mt.plugins.lookup("scorer", "wrong_shape")


def test_unknown_plugin_names_and_bad_options():
    with pytest.raises(KeyError, match="scaled_dot"):  # lists what there is / the close match
        mt.nn.Attention("scaled_dott", "softmax", 0.0, 4, 4)
    with pytest.raises(TypeError, match="registered name"):
        mt.nn.Attention(lambda q, k: q @ k, "softmax", 0.0, 4, 4)
    with pytest.raises(TypeError) as error:
        mt.nn.MultiHeadAttention(8, 2, positional="rotary", positional_options={"bse": 10})
    assert "bse" in str(error.value) and "positional encoding 'rotary'" in str(error.value)


def test_keys_and_values_must_pair_up():
    attn = mt.nn.Attention("dot", "softmax", 0.0, 4, 4)
    with pytest.raises(mt.ShapeError, match="4 keys but 3 values"):
        attn(randn(1, 2, 4), randn(1, 4, 4), randn(1, 3, 4))


# -- MultiHeadAttention -------------------------------------------------------------------------
@pytest.mark.parametrize("bias", [False, True])
def test_mha_equals_the_per_head_reference(bias):
    mha = make_mha(12, 3, bias=bias)
    X = randn(2, 5, 12)
    out = mha(X, X, X)
    ref, weights = np_mha(mha, X.numpy(), X.numpy(), X.numpy())
    np.testing.assert_allclose(out.numpy(), ref, atol=1e-12)
    assert mha.attention_weights.shape == (2, 3, 5, 5)
    assert not mha.attention_weights.requires_grad and mha.attention_weights.grad_fn is None
    np.testing.assert_allclose(mha.attention_weights.numpy(), weights, atol=1e-12)


def test_mha_cross_attention_sizes_and_masks():
    mha = make_mha(8, 2, query_size=6, key_size=5, value_size=3)
    q, k, v = randn(2, 3, 6), randn(2, 4, 5, seed=1), randn(2, 4, 3, seed=2)
    for arguments, allowed in [
        ({"valid_lens": [2, 4]}, lens_to_allowed([2, 4], 3, 4)),
        ({"valid_lens": [[1, 2, 3], [4, 0, 2]]}, lens_to_allowed([[1, 2, 3], [4, 0, 2]], 3, 4)),
        ({"mask": np.array([[[True, False, True, True]] * 3, [[False, True, True, False]] * 3])}, None),
        ({"mask": np.tril(np.ones((3, 4), dtype=bool))}, np.tril(np.ones((3, 4), dtype=bool))),
    ]:
        allowed = arguments["mask"] if allowed is None else allowed
        out = mha(q, k, v, **arguments)
        ref, weights = np_mha(mha, q.numpy(), k.numpy(), v.numpy(), allowed)
        np.testing.assert_allclose(out.numpy(), ref, atol=1e-12)
        np.testing.assert_allclose(mha.attention_weights.numpy(), weights, atol=1e-12)
        assert out.shape == (2, 3, 8)


def test_mha_causal_outputs_ignore_later_inputs_and_a_cache_gives_the_same():
    for positional in (None, "rotary"):
        mha = make_mha(8, 2, positional=positional)
        X = randn(2, 6, 8)
        full = mha(X, X, X, causal=True).numpy()
        changed = X.numpy().copy()
        changed[:, 4:] += 1.0
        Y = mt.tensor(changed)
        np.testing.assert_allclose(mha(Y, Y, Y, causal=True).numpy()[:, :4], full[:, :4], atol=1e-12)
        # a decoder with the first 4 positions cached: queries are the last 2 of the 6 positions
        last = X[:, 4:]
        np.testing.assert_allclose(mha(last, X, X, causal=True).numpy(), full[:, 4:], atol=1e-12)


def test_mha_with_rotary_rotates_queries_and_keys_by_position():
    mha = make_mha(8, 2, positional="rotary")
    plain = make_mha(8, 2)
    X = randn(1, 5, 8)
    assert np.abs(mha(X, X, X).numpy() - plain(X, X, X).numpy()).max() > 1e-3
    # the relative-position property through the whole layer: one offset shared by queries
    # and keys changes nothing
    np.testing.assert_allclose(mha(X, X, X, q_offset=7, k_offset=7).numpy(), mha(X, X, X).numpy(), atol=1e-12)


def test_mha_dropout_on_weights_only_in_training():
    mha = make_mha(8, 2, dropout=0.5)
    reference = make_mha(8, 2, dropout=0.0)  # the same weights (same seed)
    X = randn(2, 6, 8)
    mt.manual_seed(1)
    first = mha(X, X, X).numpy()
    second = mha(X, X, X).numpy()
    assert np.abs(first - second).max() > 1e-6  # training: random
    np.testing.assert_allclose(mha.attention_weights.numpy().sum(axis=-1), 1.0)  # weights kept before dropout
    mha.eval()
    np.testing.assert_array_equal(mha(X, X, X).numpy(), mha(X, X, X).numpy())
    np.testing.assert_allclose(mha(X, X, X).numpy(), reference(X, X, X).numpy(), atol=1e-12)


@pytest.mark.parametrize("positional", [None, "rotary"])
def test_mha_gradcheck(device, positional):
    mha = make_mha(4, 2, positional=positional, bias=True, device=device)
    X = randn(2, 3, 4, device=device, requires_grad=True)
    params = list(mha.parameters())
    check(lambda X, *params: mha(X, X, X, valid_lens=[2, 3], causal=True), X, *params)


def test_mha_on_the_strict_device_matches_cpu():
    cpu = make_mha(8, 2, positional="rotary", bias=True)
    strict = make_mha(8, 2, positional="rotary", bias=True, device="strict")
    X = randn(2, 4, 8)
    Xs = randn(2, 4, 8, device="strict")
    out, out_strict = cpu(X, X, X, valid_lens=[3, 4], causal=True), strict(Xs, Xs, Xs, valid_lens=[3, 4], causal=True)
    assert isinstance(out_strict.data, array_type("strict"))
    np.testing.assert_allclose(out_strict.numpy(), out.numpy(), atol=1e-12)
    out.sum().backward()
    out_strict.sum().backward()
    for (name, p), p_strict in zip(cpu.named_parameters(), strict.parameters()):
        assert isinstance(p_strict.grad.data, array_type("strict")), name
        np.testing.assert_allclose(p_strict.grad.numpy(), p.grad.numpy(), atol=1e-12, err_msg=name)


@pytest.mark.parametrize("scorer", sorted(mt.plugins.scorers()))
@pytest.mark.parametrize("pooling", sorted(mt.plugins.poolings()))
def test_every_registered_plugin_works_inside_mha(scorer, pooling):
    """Plugins by name, wherever they come from: each scorer with each pooling, built in float64
    on the strict device (plugins with parameters included), forward and backward."""
    mt.manual_seed(0)
    mha = mt.nn.MultiHeadAttention(8, 2, scorer=scorer, pooling=pooling, dtype=mt.float64, device="strict")
    X = randn(2, 5, 8, device="strict", requires_grad=True)
    out = mha(X, X, X, valid_lens=[3, 5], causal=True)
    assert out.shape == (2, 5, 8) and isinstance(out.data, array_type("strict"))
    assert np.isfinite(out.numpy()).all()
    assert mha.attention_weights.shape == (2, 2, 5, 5)
    out.sum().backward()
    assert np.isfinite(X.grad.numpy()).all()
    for name, p in mha.named_parameters():
        assert p.device == "strict" and p.dtype == mt.float64, name
        assert p.grad is None or isinstance(p.grad.data, array_type("strict")), name


def test_mha_errors():
    with pytest.raises(ValueError, match="num_hiddens=10.*num_heads=3"):
        mt.nn.MultiHeadAttention(10, 3)
    with pytest.raises(ValueError, match="'sinusoidal'.*\"inputs\""):
        mt.nn.MultiHeadAttention(8, 2, positional="sinusoidal")
    mha = mt.nn.MultiHeadAttention(8, 2)
    with pytest.raises(mt.ShapeError, match=r"keys of shape \(2, 3, 6\).*\(batch, steps, 8\)"):
        mha(mt.zeros(2, 3, 8), mt.zeros(2, 3, 6), mt.zeros(2, 3, 8))


def test_mha_parameters_and_state_dict():
    mha = mt.nn.MultiHeadAttention(8, 2, positional="rotary")
    assert [name for name, _ in mha.named_parameters()] == ["W_q.weight", "W_k.weight", "W_v.weight", "W_o.weight"]
    assert list(mha.state_dict()) == ["W_q.weight", "W_k.weight", "W_v.weight", "W_o.weight"]  # no tables


def test_mha_equals_torch_multihead_attention():
    torch = pytest.importorskip("torch")
    mha = make_mha(12, 3, bias=True)
    ref = torch.nn.MultiheadAttention(12, 3, bias=True, batch_first=True, dtype=torch.float64)
    projections = (mha.W_q, mha.W_k, mha.W_v)
    with torch.no_grad():
        ref.in_proj_weight.copy_(torch.from_numpy(np.concatenate([m.weight.numpy() for m in projections])))
        ref.in_proj_bias.copy_(torch.from_numpy(np.concatenate([m.bias.numpy() for m in projections])))
        ref.out_proj.weight.copy_(torch.from_numpy(mha.W_o.weight.numpy()))
        ref.out_proj.bias.copy_(torch.from_numpy(mha.W_o.bias.numpy()))
    X = randn(2, 5, 12)
    valid_lens = np.array([3, 5])
    ours = mha(X, X, X, valid_lens=valid_lens, causal=True).numpy()
    tX = torch.from_numpy(X.numpy())
    padding = torch.from_numpy(np.arange(5)[None, :] >= valid_lens[:, None])  # PyTorch: True = ignore
    future = torch.from_numpy(~np_causal(5, 5))
    theirs, weights = ref(tX, tX, tX, key_padding_mask=padding, attn_mask=future, average_attn_weights=False)
    np.testing.assert_allclose(ours, theirs.detach().numpy(), atol=1e-12)
    np.testing.assert_allclose(mha.attention_weights.numpy(), weights.detach().numpy(), atol=1e-12)
