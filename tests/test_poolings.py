"""The built-in poolings (softmax, average, sparsemax) against independent NumPy references."""

import math

import numpy as np
import pytest
from helpers import allowed_keys_np as _allowed
from helpers import check
from helpers import ints as _ints
from minitensor.errors import ShapeError
from minitensor_plugins.poolings import AveragePooling, SoftmaxPooling, SparsemaxPooling, allowed_keys

import minitensor as mt

POOLINGS = {"softmax": SoftmaxPooling, "average": AveragePooling, "sparsemax": SparsemaxPooling}


def _scores(device, shape, seed=0, scale=1.0, requires_grad=False, dtype=mt.float64):
    a = np.random.default_rng(seed).standard_normal(shape) * scale
    return a, mt.tensor(a, dtype=dtype, device=device, requires_grad=requires_grad)


def _np_softmax(z, allowed):
    z = np.where(allowed, z, -np.inf)
    m = np.max(np.where(allowed, z, -1e300), axis=-1, keepdims=True)
    e = np.where(allowed, np.exp(np.where(allowed, z - m, 0)), 0)
    total = e.sum(-1, keepdims=True)
    return np.divide(e, total, out=np.zeros_like(e), where=total > 0)


def _np_sparsemax(z, allowed):
    """Projection onto the simplex by bisection on tau: sum_j max(z_j - tau, 0) = 1.

    A different algorithm from the op's sort-based one, so the two check each other."""
    out = np.zeros_like(z)
    for idx in np.ndindex(z.shape[:-1]):
        zs = z[idx][allowed[idx]]
        if zs.size == 0:
            continue
        lo, hi = zs.max() - 1.0, zs.max()  # sum(max(z - lo, 0)) >= 1 >= sum(max(z - hi, 0))
        for _ in range(200):
            mid = (lo + hi) / 2
            if np.maximum(zs - mid, 0).sum() > 1:
                lo = mid
            else:
                hi = mid
        p = np.zeros(z.shape[-1])
        p[allowed[idx]] = np.maximum(zs - (lo + hi) / 2, 0)
        out[idx] = p
    return out


MASK_CASES = [
    # (scores shape, valid_lens, mask)
    ((3, 4, 6), None, None),
    ((3, 4, 6), [2, 6, 1], None),
    ((3, 2, 4, 6), [2, 6, 1], None),  # (batch, heads, Q, K): the heads share the lengths
    ((3, 4, 6), [[1, 2, 3, 4], [6, 6, 5, 5], [1, 1, 6, 2]], None),
    ((3, 2, 4, 6), [[1, 2, 3, 4], [6, 6, 5, 5], [1, 1, 6, 2]], None),
    ((3, 4, 6), None, np.tril(np.ones((4, 6), dtype=bool))),  # causal, broadcast over the batch
    ((3, 2, 4, 6), [4, 3, 6], np.tril(np.ones((4, 6), dtype=bool), k=1)),
]


def _case(device, shape, valid_lens, mask, seed=0):
    z, scores = _scores(device, shape, seed=seed)
    lens = None if valid_lens is None else _ints(valid_lens, device)
    m = None if mask is None else mt.tensor(mask, device=device)
    return z, scores, lens, m, _allowed(shape, valid_lens, mask)


@pytest.mark.parametrize("shape,valid_lens,mask", MASK_CASES)
def test_softmax_pooling_is_masked_softmax(shape, valid_lens, mask, device):
    z, scores, lens, m, allowed = _case(device, shape, valid_lens, mask)
    weights = SoftmaxPooling()(scores, lens, m).numpy()
    np.testing.assert_allclose(weights, mt.masked_softmax(scores, lens, m).numpy(), rtol=0, atol=0)
    np.testing.assert_allclose(weights, _np_softmax(z, allowed), rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("shape,valid_lens,mask", MASK_CASES)
def test_average_pooling_is_one_over_n_on_the_valid_keys(shape, valid_lens, mask, device):
    _, scores, lens, m, allowed = _case(device, shape, valid_lens, mask)
    weights = AveragePooling()(scores, lens, m)
    assert weights.device == device and weights.dtype == mt.float64 and weights.shape == shape
    n = allowed.sum(-1, keepdims=True)
    np.testing.assert_allclose(weights.numpy(), np.where(allowed, 1.0 / n, 0.0), rtol=1e-15)


def test_average_pooling_ignores_the_scores_and_passes_no_gradient(device):
    _, scores = _scores(device, (2, 3, 4), requires_grad=True)
    other = mt.tensor(np.full((2, 3, 4), 7.0), device=device)
    weights = AveragePooling()(scores, _ints([3, 4], device))
    assert (weights.numpy() == AveragePooling()(other, _ints([3, 4], device)).numpy()).all()
    assert not weights.requires_grad  # a constant of the scores: nothing to differentiate
    assert AveragePooling()(mt.randn(2, 3).to(device)).dtype == mt.float32  # the scores' dtype


def test_average_pooling_is_the_seeds_baseline():
    # f(q) = 1/n sum_i v_i, whatever the query
    values = mt.tensor([[1.0], [2.0], [6.0]])
    weights = AveragePooling()(mt.randn(4, 3))
    np.testing.assert_allclose((weights @ values).numpy(), np.full((4, 1), 3.0), rtol=1e-6)


@pytest.mark.parametrize("shape,valid_lens,mask", MASK_CASES)
def test_sparsemax_matches_the_projection_onto_the_simplex(shape, valid_lens, mask, device):
    z, scores, lens, m, allowed = _case(device, shape, valid_lens, mask)
    weights = SparsemaxPooling()(scores, lens, m).numpy()
    np.testing.assert_allclose(weights, _np_sparsemax(z, allowed), rtol=0, atol=1e-12)
    np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-12)  # every row here keeps a key
    assert (weights >= 0).all() and (weights[~np.broadcast_to(allowed, shape)] == 0).all()


def test_sparsemax_closed_forms():
    # a clear winner takes everything; close scores share: p = z - tau
    p = mt.sparsemax(mt.tensor([[1.0, 2.0, 0.5], [0.1, 0.2, 0.3], [0.0, 0.0, 0.0]], dtype=mt.float64)).numpy()
    tau = (0.1 + 0.2 + 0.3 - 1) / 3
    np.testing.assert_allclose(p, [[0, 1, 0], [0.1 - tau, 0.2 - tau, 0.3 - tau], [1 / 3] * 3], atol=1e-15)
    # two of three in the support: tau = (z1 + z2 - 1) / 2
    p = mt.sparsemax(mt.tensor([0.9, 0.6, -0.4], dtype=mt.float64)).numpy()
    np.testing.assert_allclose(p, [0.65, 0.35, 0.0], atol=1e-15)


def test_sparsemax_has_exact_zeros_and_is_shift_invariant(device):
    z, scores = _scores(device, (4, 10), scale=2.0)
    p = mt.sparsemax(scores).numpy()
    assert ((p == 0).sum(-1) > 0).all()  # spread-out scores: some keys get exactly nothing
    np.testing.assert_allclose(p.sum(-1), 1.0, rtol=1e-12)
    np.testing.assert_allclose(mt.sparsemax(scores + 3.5).numpy(), p, atol=1e-12)
    # and softmax never gives exact zeros on the same scores
    assert (mt.softmax(scores).numpy() > 0).all()


def test_sparsemax_keeps_float32():
    p = mt.sparsemax(mt.randn(3, 7), valid_lens=[2, 7, 0])
    assert p.dtype == mt.float32
    np.testing.assert_allclose(p.numpy().sum(-1), [1, 1, 0], rtol=1e-6)


def test_sparsemax_excludes_minus_infinity():
    z = np.array([[0.3, -np.inf, 0.2, -np.inf], [-np.inf] * 4])
    p = mt.sparsemax(mt.tensor(z, dtype=mt.float64)).numpy()
    np.testing.assert_allclose(p, [[0.55, 0, 0.45, 0], [0, 0, 0, 0]], atol=1e-15)


def test_sparsemax_backward_is_the_support_projection(device):
    # J = diag(s) - s s^T / |S|, so dL/dz = s * (g - mean over the support of g)
    z, scores = _scores(device, (5, 8), seed=2, requires_grad=True)
    g = np.random.default_rng(9).standard_normal((5, 8))
    p = mt.sparsemax(scores)
    p.backward(mt.tensor(g, device=device))
    s = (p.numpy() > 0).astype(float)
    expected = s * (g - (s * g).sum(-1, keepdims=True) / s.sum(-1, keepdims=True))
    np.testing.assert_allclose(scores.grad.numpy(), expected, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize(
    "valid_lens,mask",
    [(None, None), ([3, 5], None), ([[1, 4, 5], [0, 2, 5]], None), (None, np.tril(np.ones((3, 5), dtype=bool), k=1))],
)
def test_sparsemax_gradcheck(valid_lens, mask, device):
    _, scores = _scores(device, (2, 3, 5), seed=4, requires_grad=True)
    lens = None if valid_lens is None else _ints(valid_lens, device)
    m = None if mask is None else mt.tensor(mask, device=device)
    check(lambda s: mt.sparsemax(s, lens, m), scores)


def test_sparsemax_gradient_with_a_mask_that_broadcasts_the_scores_up(device):
    # scores (Q, K) shared by a batch of masks (B, Q, K): the output is (B, Q, K) and the
    # gradient sums back over the batch
    _, scores = _scores(device, (3, 4), seed=5, requires_grad=True)
    mask = mt.tensor(np.random.default_rng(1).random((2, 3, 4)) < 0.7, device=device)
    assert mt.sparsemax(scores, mask=mask).shape == (2, 3, 4)
    check(lambda s: mt.sparsemax(s, mask=mask), scores)


@pytest.mark.parametrize("name", ["softmax", "sparsemax"])
def test_pooling_gradcheck_with_heads_and_masks(name, device):
    _, scores = _scores(device, (2, 2, 3, 4), seed=6, requires_grad=True)
    lens = _ints([[1, 2, 4], [3, 0, 4]], device)
    pooling = POOLINGS[name]()
    check(
        lambda s: pooling(s, valid_lens=lens, mask=mt.tensor(np.tril(np.ones((3, 4), dtype=bool), 1), device=device)),
        scores,
    )


def test_sparsemax_errors():
    x = mt.randn(2, 3, 4)
    with pytest.raises(ShapeError, match="sparsemax: valid_lens of shape"):
        mt.sparsemax(x, valid_lens=[1, 2, 3])
    with pytest.raises(TypeError, match="sparsemax: mask must be a bool"):
        mt.sparsemax(x, mask=mt.ones(3, 4))
    with pytest.raises(ShapeError, match="sparsemax: mask of shape"):
        mt.sparsemax(x, mask=mt.tensor(np.ones((5, 4), dtype=bool)))


# -- fully masked rows and masked keys, every pooling ----------------------------------------------
EMPTY_CASES = [
    # (scores shape, valid_lens, mask, index of a -inf row); the rows with no allowed key
    ((3, 4, 5), [0, 2, 5], None, None),
    ((3, 2, 4, 5), [0, 2, 5], None, None),
    ((3, 4, 5), [[0, 1, 2, 0], [5, 5, 0, 5], [3, 3, 3, 3]], None, None),
    ((3, 4, 5), None, np.array([[True] * 5, [False] * 5, [True, False] * 2 + [True], [False] * 5]), None),
    ((3, 4, 5), None, None, (1, 2)),
    ((3, 4, 5), [5, 0, 5], None, (0, 0)),
]


@pytest.mark.filterwarnings("error")
@pytest.mark.parametrize("shape,valid_lens,mask,inf_row", EMPTY_CASES)
@pytest.mark.parametrize("name", sorted(POOLINGS))
def test_fully_masked_rows_get_zero_weights(name, shape, valid_lens, mask, inf_row, device):
    z = np.random.default_rng(0).standard_normal(shape)
    if inf_row is not None:
        z[inf_row] = -np.inf
    scores = mt.tensor(z, device=device)
    lens = None if valid_lens is None else _ints(valid_lens, device)
    m = None if mask is None else mt.tensor(mask, device=device)
    weights = POOLINGS[name]()(scores, lens, m).numpy()
    allowed = np.broadcast_to(_allowed(shape, valid_lens, mask, z), shape)
    empty = ~allowed.any(-1)
    assert empty.any()
    assert np.isfinite(weights).all()
    assert (weights[empty] == 0).all()  # zeros: not NaN, not uniform
    assert (weights[~allowed] == 0).all()  # and no weight on any masked key
    np.testing.assert_allclose(weights[~empty].sum(-1), 1.0, rtol=1e-12)  # the other rows still sum to 1


@pytest.mark.parametrize("name", sorted(POOLINGS))
def test_masked_scores_change_nothing(name, device):
    shape, valid_lens, mask = (
        (3, 2, 4, 6),
        [[1, 2, 3, 4], [6, 6, 5, 5], [1, 1, 6, 2]],
        np.tril(np.ones((4, 6), dtype=bool), 1),
    )
    z, scores, lens, m, allowed = _case(device, shape, valid_lens, mask)
    changed = mt.tensor(np.where(allowed, z, 100.0 * np.random.default_rng(1).standard_normal(shape)), device=device)
    pooling = POOLINGS[name]()
    np.testing.assert_array_equal(pooling(scores, lens, m).numpy(), pooling(changed, lens, m).numpy())


def test_allowed_keys_reads_valid_lens_the_d2l_way():
    scores = mt.zeros(2, 3, 4, 5)  # (batch, heads, Q, K)
    a = allowed_keys(scores, valid_lens=[2, 5]).numpy()
    assert a.shape == (2, 3, 4, 5)
    assert (a[0] == [True, True, False, False, False]).all() and a[1].all()  # every head, every query
    a = allowed_keys(scores, valid_lens=[[1, 2, 3, 4], [5, 5, 0, 1]]).numpy()
    assert (a.sum(-1) == np.array([[1, 2, 3, 4], [5, 5, 0, 1]])[:, None, :]).all()
    with pytest.raises(ShapeError, match=r"valid_lens of shape \(3,\) does not fit scores of shape \(2, 3, 4, 5\)"):
        allowed_keys(scores, valid_lens=[1, 2, 3])


@pytest.mark.parametrize("cls", list(POOLINGS.values()))
def test_a_pooling_refuses_unknown_options(cls):
    with pytest.raises(TypeError, match="unknown option.*'temperature'"):
        cls(temperature=2.0)


def test_poolings_registry():
    poolings = mt.plugins.poolings()
    for name, cls in POOLINGS.items():
        assert poolings[name] is cls


def test_sparsemax_attention_reads_few_keys():
    # the point of sparsemax: with a clear favourite the weights are one-hot, and the
    # weighted sum of values is that key's value exactly
    scores = mt.tensor([[5.0, 1.0, 0.0, -math.inf]])
    values = mt.tensor([[1.0, 0.0], [0.0, 1.0], [2.0, 2.0], [9.0, 9.0]])
    np.testing.assert_array_equal((SparsemaxPooling()(scores) @ values).numpy(), [[1.0, 0.0]])
