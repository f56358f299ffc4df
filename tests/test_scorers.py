"""The built-in scorers against their formulas, computed independently in NumPy."""

import math

import numpy as np
import pytest
from helpers import check
from minitensor_plugins.scorers import (
    AdditiveScorer,
    CosineScorer,
    DotProduct,
    GaussianScorer,
    KernelScorer,
    L2Scorer,
    ParametricGaussianScorer,
    ScaledDotProduct,
)

import minitensor as mt

KERNELS = ("gaussian", "boxcar", "epanechnikov", "triangular", "constant")


def _qk(device, q_shape, k_shape, seed=0, scale=1.0, requires_grad=False):
    rng = np.random.default_rng(seed)
    q, k = rng.standard_normal(q_shape) * scale, rng.standard_normal(k_shape) * scale
    as_t = lambda a: mt.tensor(a, dtype=mt.float64, device=device, requires_grad=requires_grad)  # noqa: E731
    return q, k, as_t(q), as_t(k)


def _sq_dist(q, k):
    """|q_i - k_j|^2 by brute force: (..., Q, K)."""
    return ((q[..., :, None, :] - k[..., None, :, :]) ** 2).sum(-1)


def test_the_registry_names_the_scorer_classes():
    scorers = mt.plugins.scorers()
    assert scorers["dot"] is DotProduct and scorers["scaled_dot"] is ScaledDotProduct
    assert scorers["additive"] is AdditiveScorer and scorers["gaussian"] is GaussianScorer
    assert scorers["parametric_gaussian"] is ParametricGaussianScorer and scorers["kernel"] is KernelScorer
    assert scorers["cosine"] is CosineScorer and scorers["l2"] is L2Scorer


def test_dot_and_scaled_dot_are_qk_over_sqrt_d(device):
    q, k, Qt, Kt = _qk(device, (2, 3, 4, 6), (2, 3, 5, 6))  # (batch, heads, Q/K, d)
    np.testing.assert_allclose(DotProduct(6, 6)(Qt, Kt).numpy(), q @ k.swapaxes(-1, -2), rtol=1e-12)
    np.testing.assert_allclose(
        ScaledDotProduct(6, 6)(Qt, Kt).numpy(), q @ k.swapaxes(-1, -2) / math.sqrt(6), rtol=1e-12
    )


def test_additive_is_wv_tanh_wq_q_plus_wk_k(device):
    # queries and keys of different lengths (3 and 5), as in D2L's example, with a head axis
    q, k, Qt, Kt = _qk(device, (2, 2, 4, 3), (2, 2, 6, 5))
    scorer = AdditiveScorer(3, 5, num_hiddens=7).double().to(device)
    Wq, Wk = scorer.W_q.weight.numpy(), scorer.W_k.weight.numpy()  # (7, 3), (7, 5)
    wv = scorer.w_v.weight.numpy()[0]  # (7,)
    assert Wq.shape == (7, 3) and Wk.shape == (7, 5) and wv.shape == (7,)
    assert scorer.W_q.bias is None and scorer.W_k.bias is None and scorer.w_v.bias is None  # as D2L
    expected = np.empty((2, 2, 4, 6))
    for idx in np.ndindex(2, 2, 4, 6):
        b, h, i, j = idx
        expected[idx] = wv @ np.tanh(Wq @ q[b, h, i] + Wk @ k[b, h, j])
    np.testing.assert_allclose(scorer(Qt, Kt).numpy(), expected, rtol=1e-10, atol=1e-12)


def test_scorers_with_parameters_are_made_in_the_dtype_and_device_asked(device):
    additive = AdditiveScorer(3, 5, dtype=mt.float64, device=device)
    w = ParametricGaussianScorer(2, 2, w_init=0.3, dtype=mt.float64, device=device).w
    for p in list(additive.parameters()) + [w]:
        assert p.dtype == mt.float64 and p.device == device
    assert w.numpy()[0] == 0.3  # no float32 rounding on the way


def test_additive_needs_both_sizes():
    with pytest.raises(ValueError, match="needs query_size and key_size"):
        AdditiveScorer(None, 4)


def test_additive_in_the_attention_layer():
    attention = mt.nn.Attention("additive", "softmax", 0.0, query_size=3, key_size=5, scorer_options={"num_hiddens": 4})
    out = attention(mt.randn(2, 1, 3), mt.randn(2, 6, 5), mt.randn(2, 6, 2), valid_lens=[2, 6])
    assert out.shape == (2, 1, 2) and attention.scorer.num_hiddens == 4


def test_additive_num_hiddens_defaults_to_the_larger_size():
    assert AdditiveScorer(3, 5).num_hiddens == 5
    assert AdditiveScorer(8, 8).num_hiddens == 8
    assert "num_hiddens=4" in repr(AdditiveScorer(3, 5, num_hiddens=4))


def test_gaussian_is_minus_half_squared_distance(device):
    q, k, Qt, Kt = _qk(device, (2, 3, 4, 6), (2, 3, 5, 6))
    np.testing.assert_allclose(GaussianScorer(6, 6)(Qt, Kt).numpy(), -0.5 * _sq_dist(q, k), rtol=1e-10, atol=1e-12)


def test_gaussian_is_accurate_in_float32_where_softmax_looks():
    # the |q|^2 - 2 q.k + |k|^2 expansion: errors ~ 1e-7 |q|^2, harmless next to O(1) gaps
    q, k, _, _ = _qk("cpu", (4, 8), (6, 8), scale=3.0)
    scores = GaussianScorer(8, 8)(mt.tensor(q, dtype=mt.float32), mt.tensor(k, dtype=mt.float32))
    assert scores.dtype == mt.float32
    np.testing.assert_allclose(scores.numpy(), -0.5 * _sq_dist(q, k), atol=1e-4 * (q**2).sum(-1).max())


def test_parametric_gaussian_is_minus_half_of_w_times_distance_squared(device):
    q, k, Qt, Kt = _qk(device, (3, 4, 2), (3, 5, 2))
    scorer = ParametricGaussianScorer(2, 2, w_init=0.7).double().to(device)
    w = scorer.w.numpy()[0]  # 0.7 stored as a float32 Parameter, then made float64
    assert scorer.w.shape == (1,) and scorer.w.requires_grad and w == np.float32(0.7)
    np.testing.assert_allclose(scorer(Qt, Kt).numpy(), -0.5 * w**2 * _sq_dist(q, k), rtol=1e-10, atol=1e-12)
    # D2L's NWKernelRegression, scalar queries and keys: -((q - k) * w)^2 / 2
    q1, k1, Q1, K1 = _qk(device, (4, 1), (7, 1), seed=1)
    d2l = -(((q1 - k1.T) * w) ** 2) / 2
    scalar_scorer = ParametricGaussianScorer(1, 1, w_init=0.7).double().to(device)
    np.testing.assert_allclose(scalar_scorer(Q1, K1).numpy(), d2l, rtol=1e-10, atol=1e-12)


def test_parametric_gaussian_starts_as_the_gaussian_scorer():
    q, k, Qt, Kt = _qk("cpu", (3, 4), (5, 4))
    np.testing.assert_allclose(
        ParametricGaussianScorer(4, 4).double()(Qt, Kt).numpy(), GaussianScorer(4, 4)(Qt, Kt).numpy(), rtol=1e-12
    )


def _kernel(name, u):
    """D2L's kernels (the new edition's "Attention Pooling by Similarity")."""
    if name == "gaussian":
        return np.exp(-(u**2) / 2)
    if name == "boxcar":
        return (np.abs(u) < 1.0).astype(float)
    if name in ("epanechnikov", "triangular"):
        return np.maximum(1 - np.abs(u), 0)
    return np.ones_like(u)


def _nadaraya_watson_weights(q, k, kernel, width):
    """alpha(q, k_i) = K(|q - k_i| / width) / sum_j K(|q - k_j| / width); 0 for a query no
    key supports."""
    Kq = _kernel(kernel, np.sqrt(_sq_dist(q, k)) / width)
    total = Kq.sum(-1, keepdims=True)
    return np.divide(Kq, total, out=np.zeros_like(Kq), where=total > 0)


@pytest.mark.filterwarnings("error")  # no log(0), no 0/0, no inf - inf leaking out as warnings
@pytest.mark.parametrize("width", [0.5, 2.0])
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("dim", [1, 3])
def test_kernel_scorer_and_softmax_is_nadaraya_watson(kernel, width, dim, device):
    rng = np.random.default_rng(dim)
    # D2L's setting in 1-D: sorted keys (training inputs) in [0, 5], queries on a grid, and
    # one query (7.5) far away from every key.
    k = np.sort(rng.uniform(0, 5, (2, 12, dim)), axis=1)
    q = np.concatenate([np.broadcast_to(np.linspace(0, 5, 9)[:, None], (9, dim)), np.full((1, dim), 7.5)])
    q = np.broadcast_to(q, (2, 10, dim)) + 0.01 * rng.standard_normal((2, 10, dim))
    Qt, Kt = mt.tensor(q, dtype=mt.float64, device=device), mt.tensor(k, dtype=mt.float64, device=device)
    scores = KernelScorer(dim, dim, kernel=kernel, width=width)(Qt, Kt)
    weights = mt.plugins.poolings()["softmax"]()(scores)
    expected = _nadaraya_watson_weights(q, k, kernel, width)
    np.testing.assert_allclose(weights.numpy(), expected, rtol=1e-10, atol=1e-12)
    if kernel in ("boxcar", "epanechnikov", "triangular"):
        # the far query has no key inside the support: -inf scores, and zero weights
        assert np.isneginf(scores.numpy()[:, -1]).all()
        assert (weights.numpy()[:, -1] == 0).all()
        assert not np.isnan(scores.numpy()).any()


def test_kernel_scores_are_log_k():
    q = mt.tensor([[0.0]], dtype=mt.float64)
    k = mt.tensor([[0.0], [0.5], [-1.5], [3.0]], dtype=mt.float64)
    u = np.array([0.0, 0.25, 0.75, 1.5])  # |q - k| / width with width 2
    with np.errstate(divide="ignore"):
        for name in KERNELS:
            got = KernelScorer(1, 1, kernel=name, width=2.0)(q, k).numpy()[0]
            np.testing.assert_allclose(got, np.log(_kernel(name, u)), rtol=1e-12)


def test_kernel_support_boundary_is_open_as_in_d2l():
    # D2L's boxcar is abs(x) < 1.0: a key at exactly one width is outside
    q, k = mt.tensor([[0.0]]), mt.tensor([[1.0], [0.5]])
    assert KernelScorer(1, 1, kernel="boxcar")(q, k).numpy().tolist() == [[-math.inf, 0.0]]
    assert KernelScorer(1, 1, kernel="epanechnikov")(q, k).numpy()[0, 0] == -math.inf


@pytest.mark.filterwarnings("error")
@pytest.mark.parametrize("kernel", ["epanechnikov", "boxcar", "gaussian"])
def test_kernel_gradient_is_finite_and_right_inside_the_support(kernel, device):
    # one key equal to the query (u = 0, where |q - k| has no derivative), one inside, one
    # outside the support
    q = mt.tensor([[0.3, -0.2]], dtype=mt.float64, device=device, requires_grad=True)
    k = mt.tensor([[0.3, -0.2], [0.6, 0.1], [3.0, 3.0]], dtype=mt.float64, device=device, requires_grad=True)
    scores = KernelScorer(2, 2, kernel=kernel, width=1.0)(q, k)
    finite = np.isfinite(scores.numpy())
    (scores.masked_fill(mt.tensor(~finite, device=device), 0.0)).sum().backward()
    assert np.isfinite(q.grad.numpy()).all() and np.isfinite(k.grad.numpy()).all()
    if kernel == "epanechnikov":
        # d/dq log(1 - |q - k|) = -(q - k) / (|q - k| (1 - |q - k|)), from the key inside only
        d = np.array([0.3 - 0.6, -0.2 - 0.1])
        r = np.linalg.norm(d)
        np.testing.assert_allclose(q.grad.numpy()[0], -d / (r * (1 - r)), rtol=1e-10)
        np.testing.assert_allclose(k.grad.numpy()[1], d / (r * (1 - r)), rtol=1e-10)
        assert (k.grad.numpy()[[0, 2]] == 0).all()  # u = 0: the subgradient 0; outside: 0


def test_kernel_errors():
    with pytest.raises(ValueError, match="unknown kernel 'cosine'.*gaussian, boxcar, epanechnikov"):
        KernelScorer(2, 2, kernel="cosine")
    with pytest.raises(ValueError, match="width must be positive"):
        KernelScorer(2, 2, width=0)
    assert "kernel='boxcar', width=0.5" in repr(KernelScorer(2, 2, kernel="boxcar", width=0.5))


@pytest.mark.parametrize(
    "cls",
    [DotProduct, ScaledDotProduct, GaussianScorer, ParametricGaussianScorer, KernelScorer, CosineScorer, L2Scorer],
)
def test_scorers_needing_one_length_refuse_two(cls):
    with pytest.raises(ValueError, match="one length d.*additive"):
        cls(3, 5)


@pytest.mark.parametrize(
    "cls", [DotProduct, AdditiveScorer, KernelScorer, ParametricGaussianScorer, CosineScorer, L2Scorer]
)
def test_a_misspelt_option_is_an_error(cls):
    with pytest.raises(TypeError, match="unknown option.*'num_hidden'"):
        cls(4, 4, num_hidden=8)


def test_scorers_through_the_attention_lookup():
    scorer = mt.plugins.lookup("scorer", "kernel")(2, 2, kernel="boxcar", width=1.5)
    assert isinstance(scorer, KernelScorer) and scorer.kernel == "boxcar"


# -- gradients, float64, on every device ---------------------------------------------------------------
@pytest.mark.parametrize(
    "cls,options",
    [
        (DotProduct, {}),
        (ScaledDotProduct, {}),
        (AdditiveScorer, {"num_hiddens": 5}),
        (GaussianScorer, {}),
        (ParametricGaussianScorer, {"w_init": 0.8}),
        (KernelScorer, {"kernel": "gaussian", "width": 1.5}),
        (KernelScorer, {"kernel": "constant"}),
        (CosineScorer, {"scale": 2.5}),
        (CosineScorer, {"learn_scale": False}),
        (L2Scorer, {}),
    ],
)
def test_scorer_gradients(cls, options, device):
    _, _, Qt, Kt = _qk(device, (2, 2, 3), (2, 4, 3), requires_grad=True)
    scorer = cls(3, 3, **options).double().to(device)
    params = list(scorer.parameters())
    check(lambda q, k, *p: scorer(q, k), Qt, Kt, *params)


@pytest.mark.parametrize("kernel", ["boxcar", "epanechnikov", "triangular"])
def test_nadaraya_watson_gradients_through_minus_infinity(kernel, device):
    # weights = softmax(log K): the -inf scores outside the support must pass gradients
    # through the pooling without NaN
    _, _, Qt, Kt = _qk(device, (2, 3, 2), (2, 5, 2), seed=3, requires_grad=True)
    scorer = KernelScorer(2, 2, kernel=kernel, width=2.0)
    scores = scorer(Qt, Kt).numpy()
    assert np.isneginf(scores).any() and np.isfinite(scores).any()  # both regimes present
    check(lambda q, k: mt.masked_softmax(scorer(q, k)), Qt, Kt)


def test_parametric_gaussian_learns_w():
    # one gradient step on a regression loss moves w (the parameter is really in the graph)
    q, k, Qt, Kt = _qk("cpu", (6, 1), (8, 1))
    v = mt.tensor(np.sin(k[:, 0]), dtype=mt.float64)
    scorer = ParametricGaussianScorer(1, 1, w_init=0.5).double()
    y_hat = mt.softmax(scorer(Qt, Kt)) @ v
    ((y_hat - mt.tensor(np.sin(q[:, 0]))) ** 2).sum().backward()
    assert scorer.w.grad is not None and scorer.w.grad.numpy()[0] != 0


def test_scores_follow_the_input_dtype():
    q, k = mt.randn(2, 3, 4), mt.randn(2, 5, 4)
    for name, options in [
        ("additive", {}),
        ("gaussian", {}),
        ("parametric_gaussian", {}),
        ("kernel", {"kernel": "boxcar"}),
        ("cosine", {}),
        ("l2", {}),
    ]:
        assert mt.plugins.scorers()[name](4, 4, **options)(q, k).dtype == mt.float32


# -- cosine (query-key normalisation) and l2 -----------------------------------------------------------
def _unit(a):
    return a / np.linalg.norm(a, axis=-1, keepdims=True)


@pytest.mark.parametrize(
    "cls,options",
    [(CosineScorer, {}), (CosineScorer, {"learn_scale": False}), (CosineScorer, {"seq_len": 20}), (L2Scorer, {})],
)
def test_cosine_and_l2_pass_the_conformance_kit(cls, options, device):
    assert mt.testing.check_scorer(cls, device=device, **options) is True


def test_cosine_is_g_times_the_cosine_of_the_angle(device):
    # in the plane, q at angle a and k at angle b (any lengths): cos(q, k) = cos(a - b)
    rng = np.random.default_rng(0)
    a, b = rng.uniform(-np.pi, np.pi, 7), rng.uniform(-np.pi, np.pi, 9)
    q = rng.uniform(0.1, 5.0, (7, 1)) * np.stack([np.cos(a), np.sin(a)], -1)
    k = rng.uniform(0.1, 5.0, (9, 1)) * np.stack([np.cos(b), np.sin(b)], -1)
    scorer = CosineScorer(2, 2, scale=3.5, dtype=mt.float64, device=device)
    got = scorer(mt.tensor(q, dtype=mt.float64, device=device), mt.tensor(k, dtype=mt.float64, device=device))
    np.testing.assert_allclose(got.numpy(), 3.5 * np.cos(a[:, None] - b[None, :]), rtol=1e-12, atol=1e-12)


def test_cosine_against_numpy_and_within_minus_g_to_g(device):
    q, k, Qt, Kt = _qk(device, (2, 3, 4, 6), (2, 3, 5, 6), scale=4.0)  # (batch, heads, Q/K, d)
    scorer = CosineScorer(6, 6, scale=2.0, dtype=mt.float64, device=device)
    scores = scorer(Qt, Kt).numpy()
    np.testing.assert_allclose(scores, 2.0 * _unit(q) @ _unit(k).swapaxes(-1, -2), rtol=1e-12, atol=1e-12)
    assert np.abs(scores).max() <= 2.0 + 1e-12
    # a key along the query scores g, the opposite key -g
    q1 = mt.tensor([[1.0, -2.0, 0.5]], dtype=mt.float64)
    k1 = mt.tensor([[3.0, -6.0, 1.5], [-0.1, 0.2, -0.05]], dtype=mt.float64)
    np.testing.assert_allclose(CosineScorer(3, 3, scale=2.0).double()(q1, k1).numpy(), [[2.0, -2.0]], rtol=1e-12)


def test_cosine_ignores_the_lengths_of_queries_and_keys(device):
    _, _, Qt, Kt = _qk(device, (2, 4, 5), (2, 6, 5))
    scorer = CosineScorer(5, 5, dtype=mt.float64, device=device)
    base = scorer(Qt, Kt).numpy()
    np.testing.assert_allclose(scorer(Qt * 1e3, Kt).numpy(), base, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(scorer(Qt, Kt * 1e-3).numpy(), base, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(scorer(Qt * 7.0, Kt * 0.2).numpy(), base, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(scorer(Qt * -1.0, Kt).numpy(), -base, rtol=1e-12, atol=1e-12)  # direction counts


@pytest.mark.filterwarnings("error")  # no 0/0 on the way either
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_cosine_of_a_zero_vector_is_zero_not_nan(dtype):
    q = mt.tensor(np.array([[0.0, 0.0, 0.0], [1.0, 2.0, -1.0]]), dtype=dtype, requires_grad=dtype != "float16")
    k = mt.tensor(np.array([[0.0, 0.0, 0.0], [0.5, -1.0, 2.0]]), dtype=dtype, requires_grad=dtype != "float16")
    scorer = CosineScorer(3, 3).to(dtype=dtype)
    scores = scorer(q, k)
    assert scores.dtype == dtype
    got = scores.numpy()
    assert np.isfinite(got).all() and (got[0] == 0).all() and (got[:, 0] == 0).all()
    if dtype != "float16":
        scores.sum().backward()
        for t in (q, k, scorer.scale):
            assert np.isfinite(t.grad.numpy()).all()


def test_cosine_scale_defaults_and_the_papers_initialisation():
    assert CosineScorer(4, 4).scale.numpy()[0] == CosineScorer.DEFAULT_SCALE == 10.0
    # Henry et al.: g0 = log2(L^2 - L), L the (97.5th percentile) training sequence length
    g0 = CosineScorer(4, 4, seq_len=20, dtype=mt.float64).scale.numpy()[0]
    assert g0 == pytest.approx(math.log2(20 * 20 - 20)) and g0 == pytest.approx(8.569855608330948)
    assert CosineScorer(4, 4, scale=0.3, dtype=mt.float64).scale.numpy()[0] == 0.3  # no float32 rounding
    assert "scale=2.5, learn_scale=False" in repr(CosineScorer(4, 4, scale=2.5, learn_scale=False))


def test_cosine_option_errors():
    with pytest.raises(
        TypeError,
        match=r"CosineScorer: unknown option\(s\) 'sclae' \(did you mean 'scale'\?\); "
        r"it takes scale, seq_len, learn_scale",
    ):
        CosineScorer(4, 4, sclae=2.0)
    with pytest.raises(ValueError, match="scale or seq_len, not both"):
        CosineScorer(4, 4, scale=2.0, seq_len=10)
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="scale must be positive and finite"):
            CosineScorer(4, 4, scale=bad)
    for bad in (1, 0, 2.5):
        with pytest.raises(ValueError, match="seq_len must be an integer >= 2"):
            CosineScorer(4, 4, seq_len=bad)
    with pytest.raises(TypeError, match="learn_scale must be True or False, got 'no'"):
        CosineScorer(4, 4, learn_scale="no")


def test_cosine_scale_gets_its_gradient_and_is_learned():
    q, k, Qt, Kt = _qk("cpu", (6, 3), (8, 3))
    scorer = CosineScorer(3, 3, scale=1.5).double()
    assert [name for name, _ in scorer.named_parameters()] == ["scale"] and scorer.scale.requires_grad
    scorer(Qt, Kt).sum().backward()
    # the scores are linear in g: d sum(scores) / dg = sum of the cosines
    np.testing.assert_allclose(scorer.scale.grad.numpy(), [(_unit(q) @ _unit(k).T).sum()], rtol=1e-12)
    # softmax regression towards sharper weights than g = 1.5 gives: SGD raises g
    v = mt.tensor(np.sin(3 * k[:, 0]), dtype=mt.float64)
    target = mt.tensor(np.sin(3 * q[:, 0]), dtype=mt.float64)
    opt = mt.optim.SGD(scorer.parameters(), lr=0.1)
    losses = []
    for _ in range(20):
        opt.zero_grad()
        loss = ((mt.softmax(scorer(Qt, Kt)) @ v - target) ** 2).sum()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert scorer.scale.numpy()[0] != 1.5 and losses[-1] < losses[0]


def test_cosine_scale_stays_fixed_when_asked(device):
    _, _, Qt, Kt = _qk(device, (4, 3), (5, 3), requires_grad=True)
    scorer = CosineScorer(3, 3, scale=4.0, learn_scale=False, dtype=mt.float64, device=device)
    assert list(scorer.parameters()) == [] and not scorer.scale.requires_grad
    assert list(scorer.state_dict()) == ["scale"]  # still saved with the model (a buffer)
    scorer(Qt, Kt).sum().backward()
    assert scorer.scale.grad is None and Qt.grad is not None
    assert scorer.scale.numpy()[0] == 4.0 and scorer.scale.dtype == mt.float64 and scorer.scale.device == device
    moved = CosineScorer(3, 3, scale=4.0, learn_scale=False).to(dtype=mt.float64)
    assert moved.scale.dtype == mt.float64  # the buffer moves with .to()
    # inside a layer, through --scorer-opt's parsed value: nothing of the scorer is trained
    mha = mt.nn.MultiHeadAttention(16, 2, scorer="cosine", scorer_options={"learn_scale": False})
    assert not any("scorer" in name for name, _ in mha.named_parameters())


def test_cosine_scale_is_made_in_the_dtype_and_device_asked(device):
    g = CosineScorer(2, 2, scale=0.7, dtype=mt.float64, device=device).scale
    assert g.dtype == mt.float64 and g.device == device and g.shape == (1,)
    mha = mt.nn.MultiHeadAttention(8, 2, scorer="cosine", dtype=mt.float64, device=device)
    assert mha.attention.scorer.scale.dtype == mt.float64 and mha.attention.scorer.scale.device == device


def test_l2_is_minus_squared_distance_over_sqrt_d(device):
    q, k, Qt, Kt = _qk(device, (2, 3, 4, 6), (2, 3, 5, 6))  # (batch, heads, Q/K, d)
    expected = -_sq_dist(q, k) / math.sqrt(6)
    np.testing.assert_allclose(L2Scorer(6, 6)(Qt, Kt).numpy(), expected, rtol=1e-10, atol=1e-12)
    # the formula as the brief writes it, one head: -((q[:, None] - k[None]) ** 2).sum(-1) / sqrt(d)
    q0, k0 = q[0, 0], k[0, 0]
    np.testing.assert_allclose(
        L2Scorer(6, 6)(Qt[0, 0], Kt[0, 0]).numpy(),
        -((q0[:, None] - k0[None]) ** 2).sum(-1) / math.sqrt(6),
        rtol=1e-10,
        atol=1e-12,
    )


def test_l2_is_largest_and_zero_where_the_key_is_the_query(device):
    q, k, _, _ = _qk(device, (5, 8), (7, 8), seed=2)
    k[[6, 1, 3, 0, 4]] = q  # query i is key perm[i]
    perm = np.array([6, 1, 3, 0, 4])
    scores = L2Scorer(8, 8)(mt.tensor(q, device=device), mt.tensor(k, device=device)).numpy()
    assert (scores.argmax(-1) == perm).all()
    np.testing.assert_allclose(scores[np.arange(5), perm], 0.0, atol=1e-12)
    assert (scores <= 1e-12).all()


def test_l2_matches_torch_cdist():
    torch = pytest.importorskip("torch")
    q, k, Qt, Kt = _qk("cpu", (2, 3, 4, 6), (2, 3, 5, 6))
    expected = -(torch.cdist(torch.from_numpy(q), torch.from_numpy(k)) ** 2) / math.sqrt(6)
    np.testing.assert_allclose(L2Scorer(6, 6)(Qt, Kt).numpy(), expected.numpy(), rtol=1e-8, atol=1e-10)


def test_l2_is_the_gaussian_kernel_of_width_d_to_the_quarter_over_sqrt2():
    # as its docstring says: -|q - k|^2 / sqrt(d) = -1/2 |q - k|^2 / w^2 with w^2 = sqrt(d) / 2
    _, _, Qt, Kt = _qk("cpu", (2, 4, 9), (2, 5, 9))
    kernel = KernelScorer(9, 9, kernel="gaussian", width=9**0.25 / math.sqrt(2))
    np.testing.assert_allclose(L2Scorer(9, 9)(Qt, Kt).numpy(), kernel(Qt, Kt).numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("scorer", ["cosine", "l2"])
def test_cosine_and_l2_by_name_in_multi_head_attention(scorer, device):
    mt.manual_seed(0)
    mha = mt.nn.MultiHeadAttention(16, 2, scorer=scorer, dtype=mt.float64, device=device)
    X = mt.tensor(
        np.random.default_rng(0).standard_normal((2, 5, 16)), dtype=mt.float64, device=device, requires_grad=True
    )
    out = mha(X, X, X, valid_lens=[3, 5])
    assert out.shape == (2, 5, 16) and np.isfinite(out.numpy()).all()
    out.sum().backward()
    assert np.isfinite(X.grad.numpy()).all()
    assert type(mha.attention.scorer) is {"cosine": CosineScorer, "l2": L2Scorer}[scorer]
    if scorer == "cosine":
        assert mha.attention.scorer.scale.grad is not None
    assert mt.nn.MultiHeadAttention(16, 2, scorer=scorer)(
        mt.randn(1, 3, 16), mt.randn(1, 3, 16), mt.randn(1, 3, 16)
    ).shape == (1, 3, 16)
