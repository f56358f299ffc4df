"""The built-in scorers against their formulas, computed independently in NumPy."""

import math

import numpy as np
import pytest
from helpers import check

import minitensor as mt
from minitensor_plugins.scorers import (
    AdditiveScorer,
    DotProduct,
    GaussianScorer,
    KernelScorer,
    ParametricGaussianScorer,
    ScaledDotProduct,
)

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


def test_dot_and_scaled_dot_are_qk_over_sqrt_d(device):
    q, k, Qt, Kt = _qk(device, (2, 3, 4, 6), (2, 3, 5, 6))  # (batch, heads, Q/K, d)
    np.testing.assert_allclose(DotProduct(6, 6)(Qt, Kt).numpy(), q @ k.swapaxes(-1, -2), rtol=1e-12)
    np.testing.assert_allclose(ScaledDotProduct(6, 6)(Qt, Kt).numpy(), q @ k.swapaxes(-1, -2) / math.sqrt(6), rtol=1e-12)


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


@pytest.mark.parametrize("cls", [DotProduct, ScaledDotProduct, GaussianScorer, ParametricGaussianScorer, KernelScorer])
def test_scorers_needing_one_length_refuse_two(cls):
    with pytest.raises(ValueError, match="one length d.*additive"):
        cls(3, 5)


@pytest.mark.parametrize("cls", [DotProduct, AdditiveScorer, KernelScorer, ParametricGaussianScorer])
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
    for name, options in [("additive", {}), ("gaussian", {}), ("parametric_gaussian", {}), ("kernel", {"kernel": "boxcar"})]:
        assert mt.plugins.scorers()[name](4, 4, **options)(q, k).dtype == mt.float32
