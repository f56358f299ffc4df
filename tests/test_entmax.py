"""entmax15 and alpha_entmax (ops and poolings) against plain NumPy references."""

import numpy as np
import pytest
from helpers import allowed_keys_np as _allowed
from helpers import check
from helpers import ints as _ints
from hypothesis import given, settings
from hypothesis import strategies as st
from minitensor.errors import ShapeError
from minitensor_plugins.poolings import AlphaEntmaxPooling, Entmax15Pooling

import minitensor as mt
from minitensor.testing import check_pooling


def _scores(device, shape, seed=0, scale=1.0, requires_grad=False):
    a = np.random.default_rng(seed).standard_normal(shape) * scale
    return a, mt.tensor(a, dtype=mt.float64, device=device, requires_grad=requires_grad)


def _np_entmax(z, alpha, allowed):
    """alpha-entmax row by row, tau by plain bisection to 1e-13: p = [(a-1) z - tau]_+^(1/(a-1))."""
    out = np.zeros(np.broadcast_shapes(z.shape, allowed.shape))
    z, allowed = np.broadcast_to(z, out.shape), np.broadcast_to(allowed, out.shape)
    for idx in np.ndindex(out.shape[:-1]):
        ok = allowed[idx]
        if not ok.any():
            continue
        x = (alpha - 1) * z[idx][ok]
        lo, hi = x.max() - 1, x.max()  # the weights sum to >= 1 at lo, to 0 at hi
        while hi - lo > 1e-13:
            mid = (lo + hi) / 2
            if (np.maximum(x - mid, 0) ** (1 / (alpha - 1))).sum() >= 1:
                lo = mid
            else:
                hi = mid
        p = np.maximum(x - (lo + hi) / 2, 0) ** (1 / (alpha - 1))
        out[idx][ok] = p / p.sum()
    return out


CASES = [
    ((4, 6), None, None),
    ((2, 3, 5), [3, 5], None),
    ((2, 3, 5), [[1, 4, 5], [0, 2, 5]], None),
    ((3, 5), None, np.tril(np.ones((3, 5), dtype=bool), k=1)),
    ((2, 2, 3, 4), [[1, 2, 4], [3, 0, 4]], np.random.default_rng(3).random((2, 1, 3, 4)) < 0.7),
]


def _case(device, shape, valid_lens, mask, seed=0):
    z, scores = _scores(device, shape, seed=seed, scale=2.0)
    lens = None if valid_lens is None else _ints(valid_lens, device)
    m = None if mask is None else mt.tensor(mask, device=device)
    return z, scores, lens, m, _allowed(shape, valid_lens, mask)


# -- the conformance kit ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "cls,options",
    [
        (Entmax15Pooling, {}),
        (AlphaEntmaxPooling, {}),
        (AlphaEntmaxPooling, {"alpha": 1.2}),
        (AlphaEntmaxPooling, {"alpha": 3.0}),
        (AlphaEntmaxPooling, {"learn_alpha": True}),
        (AlphaEntmaxPooling, {"alpha": 1.3, "learn_alpha": True}),
    ],
)
def test_the_poolings_pass_the_conformance_kit(cls, options, device):
    assert cls.sparse is True and cls.sums_to_one is True
    assert check_pooling(cls, device=device, **options) is True


def test_the_poolings_are_registered():
    poolings = mt.plugins.poolings()
    assert poolings["entmax15"] is Entmax15Pooling and poolings["alpha_entmax"] is AlphaEntmaxPooling


# -- forward against references ----------------------------------------------------------------------
@pytest.mark.parametrize("shape,valid_lens,mask", CASES)
@pytest.mark.parametrize("alpha", [None, 1.2, 1.5, 2.0, 3.0])  # None: entmax15
def test_matches_the_numpy_bisection_reference(shape, valid_lens, mask, alpha, device):
    z, scores, lens, m, allowed = _case(device, shape, valid_lens, mask)
    p = (mt.entmax15(scores, lens, m) if alpha is None else mt.alpha_entmax(scores, alpha, lens, m)).numpy()
    np.testing.assert_allclose(p, _np_entmax(z, 1.5 if alpha is None else alpha, allowed), rtol=0, atol=1e-10)


def test_entmax15_closed_forms():
    # z = x / 2 = (0.5, 0): (0.5 - tau)^2 + tau^2 = 1 gives tau = (1 - sqrt(7)) / 4
    tau = (1 - np.sqrt(7)) / 4
    p = mt.entmax15(mt.tensor([[1.0, 0.0], [2.0, 0.0], [3.0, 3.0]], dtype=mt.float64)).numpy()
    np.testing.assert_allclose(p, [[(0.5 - tau) ** 2, tau**2], [1.0, 0.0], [0.5, 0.5]], atol=1e-15)
    assert p[1, 1] == 0.0  # (1 - tau)^2 = 1 at tau = 0: the second key is exactly out


def test_alpha_1_5_is_entmax15_and_2_is_sparsemax(device):
    _, scores = _scores(device, (6, 7), seed=1, scale=3.0)
    lens = _ints([7, 3, 1, 0, 5, 7], device)
    np.testing.assert_allclose(
        mt.alpha_entmax(scores, 1.5, lens).numpy(), mt.entmax15(scores, lens).numpy(), rtol=0, atol=1e-13
    )
    np.testing.assert_allclose(
        mt.alpha_entmax(scores, 2.0, lens).numpy(), mt.sparsemax(scores, lens).numpy(), rtol=0, atol=1e-13
    )


def test_alpha_near_1_is_close_to_softmax(device):
    _, scores = _scores(device, (5, 6), seed=2)
    soft = mt.masked_softmax(scores).numpy()
    far = np.abs(mt.alpha_entmax(scores, 1.05, None).numpy() - soft).max()
    near = np.abs(mt.alpha_entmax(scores, 1.001, None).numpy() - soft).max()
    assert near < 2e-3 and near < far / 10


def test_exact_zeros(device):
    z, scores = _scores(device, (4, 8), seed=3, scale=3.0)
    for p in (mt.entmax15(scores), mt.alpha_entmax(scores, 1.3), mt.alpha_entmax(scores, 2.5)):
        p = p.numpy()
        assert ((p == 0.0).sum(-1) > 0).all()  # every row drops some keys exactly
        assert (p[np.arange(4), z.argmax(-1)] > 0).all()  # never the best one
        np.testing.assert_allclose(p.sum(-1), 1, rtol=1e-12)


def test_shift_invariance_and_minus_infinity(device):
    z = np.array([[0.3, -np.inf, 0.2, -np.inf, -1.0], [-np.inf] * 5])
    scores = mt.tensor(z, dtype=mt.float64, device=device)
    for fn in (mt.entmax15, lambda s: mt.alpha_entmax(s, 1.7)):
        p = fn(scores).numpy()
        np.testing.assert_allclose(p, _np_entmax(z, 1.5 if fn is mt.entmax15 else 1.7, z > -np.inf), atol=1e-12)
        assert (p[:, [1, 3]] == 0).all() and (p[1] == 0).all()
        np.testing.assert_allclose(fn(scores + 12.5).numpy(), p, atol=1e-12)


def test_float32_stays_float32(device):
    _, scores = _scores(device, (3, 7), seed=4)
    scores = scores.float()
    for p in (mt.entmax15(scores, [2, 7, 0]), mt.alpha_entmax(scores, 1.25, [2, 7, 0])):
        assert p.dtype == mt.float32
        np.testing.assert_allclose(p.numpy().sum(-1), [1, 1, 0], rtol=1e-5)


# -- gradients --------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape,valid_lens,mask", CASES)
def test_entmax15_gradcheck(shape, valid_lens, mask, device):
    _, scores, lens, m, _ = _case(device, shape, valid_lens, mask, seed=5)
    scores.requires_grad = True
    check(lambda s: mt.entmax15(s, lens, m), scores)


@pytest.mark.parametrize("shape,valid_lens,mask", CASES)
@pytest.mark.parametrize("alpha", [1.2, 2.5])
def test_alpha_entmax_gradcheck_in_x_and_alpha(shape, valid_lens, mask, alpha, device):
    _, scores, lens, m, _ = _case(device, shape, valid_lens, mask, seed=6)
    scores.requires_grad = True
    a = mt.tensor(alpha, dtype=mt.float64, device=device, requires_grad=True)
    check(lambda s, a: mt.alpha_entmax(s, a, lens, m), scores, a)


def test_gradients_with_a_mask_that_broadcasts_the_scores_up(device):
    # scores (Q, K) shared by a batch of masks (B, Q, K): the output is (B, Q, K) and the
    # gradient sums back over the batch
    _, scores = _scores(device, (3, 4), seed=7, requires_grad=True)
    mask = mt.tensor(np.random.default_rng(1).random((2, 3, 4)) < 0.7, device=device)
    a = mt.tensor([1.4], dtype=mt.float64, device=device, requires_grad=True)  # shape (1,) works too
    assert mt.entmax15(scores, mask=mask).shape == (2, 3, 4)
    check(lambda s: mt.entmax15(s, mask=mask), scores)
    check(lambda s, a: mt.alpha_entmax(s, a, mask=mask), scores, a)


def test_entmax15_backward_is_the_sqrt_p_projection(device):
    _, scores = _scores(device, (5, 8), seed=8, requires_grad=True)
    g = np.random.default_rng(9).standard_normal((5, 8))
    p = mt.entmax15(scores)
    p.backward(mt.tensor(g, device=device))
    s = np.sqrt(p.numpy())
    expected = s * g - s * (s * g).sum(-1, keepdims=True) / s.sum(-1, keepdims=True)
    np.testing.assert_allclose(scores.grad.numpy(), expected, rtol=1e-12, atol=1e-15)


def test_fully_masked_rows_are_zeros_with_zero_gradient(device):
    _, scores = _scores(device, (3, 4), seed=10, requires_grad=True)
    lens = _ints([4, 0, 2], device)
    a = mt.tensor(1.6, dtype=mt.float64, device=device, requires_grad=True)
    g = mt.tensor(np.random.default_rng(2).standard_normal((3, 4)), device=device)
    for fn in (lambda: mt.entmax15(scores, lens), lambda: mt.alpha_entmax(scores, a, lens)):
        scores.grad = a.grad = None
        p = fn()
        assert (p.numpy()[1] == 0).all() and np.isfinite(p.numpy()).all()
        p.backward(g)
        grad = scores.grad.numpy()
        assert np.isfinite(grad).all() and (grad[1] == 0).all() and (grad[2, 2:] == 0).all()
    assert np.isfinite(a.grad.numpy()).all()
    # every row empty: zeros everywhere, gradient zero, alpha's gradient zero
    scores.grad = a.grad = None
    p = mt.alpha_entmax(scores, a, _ints([0, 0, 0], device))
    p.backward(g)
    assert (p.numpy() == 0).all() and (scores.grad.numpy() == 0).all() and a.grad.item() == 0


# -- properties -------------------------------------------------------------------------------------
@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(1, 4),
    K=st.integers(1, 9),
    seed=st.integers(0, 2**16),
    scale=st.sampled_from([1e-3, 0.1, 1.0, 10.0, 1e3]),
    alpha=st.sampled_from([None, 1.1, 1.5, 2.0, 4.0]),
)
def test_property_simplex_and_order(rows, K, seed, scale, alpha):
    z = np.random.default_rng(seed).standard_normal((rows, K)) * scale
    x = mt.tensor(z, dtype=mt.float64)
    p = (mt.entmax15(x) if alpha is None else mt.alpha_entmax(x, alpha)).numpy()
    assert (p >= 0).all() and np.isfinite(p).all()
    np.testing.assert_allclose(p.sum(-1), 1, rtol=1e-9)
    # order-preserving: a higher score never gets less weight
    higher = z[:, :, None] > z[:, None, :]
    assert (p[:, :, None] >= p[:, None, :])[higher].all()


# -- learning alpha -------------------------------------------------------------------------------
def test_learn_alpha_starts_at_the_option_and_gets_a_gradient():
    pooling = AlphaEntmaxPooling(alpha=1.7, learn_alpha=True, dtype=mt.float64)
    ((name, raw),) = pooling.named_parameters()
    assert name == "raw" and raw.dtype == mt.float64
    assert abs(pooling.alpha.item() - 1.7) < 1e-12
    _, scores = _scores("cpu", (2, 3, 5), seed=11, scale=2.0, requires_grad=True)
    lens = _ints([[1, 4, 5], [0, 2, 5]], "cpu")
    w = pooling(scores, valid_lens=lens)
    (w * mt.tensor(np.random.default_rng(3).standard_normal(w.shape))).sum().backward()
    assert raw.grad is not None and np.isfinite(raw.grad.item()) and raw.grad.item() != 0
    assert mt.gradcheck(lambda s, r: pooling(s, valid_lens=lens), [scores, raw])
    # a fixed alpha has no parameter, and matches the op
    fixed = AlphaEntmaxPooling(alpha=1.7)
    assert list(fixed.parameters()) == [] and fixed.alpha == 1.7
    np.testing.assert_allclose(fixed(scores, lens).numpy(), w.numpy(), atol=1e-12)


def test_learn_alpha_in_an_attention_layer():
    attn = mt.nn.Attention("dot", "alpha_entmax", 0.0, 4, 4, pooling_options={"learn_alpha": True}, dtype=mt.float64)
    assert [n for n, _ in attn.named_parameters()] == ["pooling.raw"]
    q, k = mt.randn(2, 3, 4, dtype=mt.float64), mt.randn(2, 5, 4, dtype=mt.float64)
    attn(q, k, k, valid_lens=[3, 5]).sum().backward()
    assert attn.pooling.raw.grad is not None


@pytest.mark.parametrize("alpha", [1.0, 0.5, -2.0, float("nan")])
def test_alpha_at_most_1_is_refused(alpha):
    with pytest.raises(ValueError, match="alpha must be > 1"):
        AlphaEntmaxPooling(alpha=alpha)
    with pytest.raises(ValueError, match="alpha must be > 1"):
        AlphaEntmaxPooling(alpha=alpha, learn_alpha=True)
    x = mt.randn(2, 3, dtype=mt.float64)
    with pytest.raises(ValueError, match="alpha_entmax: alpha must be > 1"):
        mt.alpha_entmax(x, alpha)
    with pytest.raises(ValueError, match="alpha_entmax: alpha must be > 1"):
        mt.alpha_entmax(x, mt.tensor(alpha, dtype=mt.float64))


def test_errors():
    x = mt.randn(2, 3, 4)
    with pytest.raises(TypeError, match="unknown option.*'temperature'"):
        Entmax15Pooling(temperature=2.0)
    with pytest.raises(TypeError, match="unknown option.*'temperature'"):
        AlphaEntmaxPooling(temperature=2.0)
    with pytest.raises(TypeError, match="alpha must be a number"):
        AlphaEntmaxPooling(alpha="sparse")
    with pytest.raises(ShapeError, match="entmax15: valid_lens of shape"):
        mt.entmax15(x, valid_lens=[1, 2, 3])
    with pytest.raises(TypeError, match="alpha_entmax: mask must be a bool"):
        mt.alpha_entmax(x, 1.5, mask=mt.ones(3, 4))
    with pytest.raises(ShapeError, match="entmax15: mask of shape"):
        mt.entmax15(x, mask=mt.tensor(np.ones((5, 4), dtype=bool)))
    with pytest.raises(ShapeError, match="alpha_entmax: alpha must be one number"):
        mt.alpha_entmax(x, mt.tensor([1.5, 2.0]))


# -- the reference implementation, when it happens to be installed -------------------------------
def test_agrees_with_the_entmax_package():
    entmax = pytest.importorskip("entmax")
    torch = pytest.importorskip("torch")
    z = np.random.default_rng(12).standard_normal((4, 7)) * 2
    np.testing.assert_allclose(
        mt.entmax15(mt.tensor(z)).numpy(), entmax.entmax15(torch.tensor(z), dim=-1).numpy(), atol=1e-10
    )
    np.testing.assert_allclose(
        mt.alpha_entmax(mt.tensor(z), 1.3).numpy(),
        entmax.entmax_bisect(torch.tensor(z), alpha=1.3, dim=-1).numpy(),
        atol=1e-6,
    )
