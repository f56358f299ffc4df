"""The ops a D2L reader reaches for beyond the core: maximum / minimum (and ``max(a, b)``), dot,
mv, mm, norm, cumsum, prod, std, logsumexp, isnan / isinf / isfinite, flip, gather, the new
makers (linspace, randperm, full_like, rand_like, randn_like, empty, empty_like) and the Tensor
methods int, bool, expand_as, view_as, type_as.

Each differentiable op is gradchecked in float64 on every device (broadcasting where it applies)
and compared with PyTorch where torch is installed (those tests skip cleanly without it).
"""

import math

import numpy as np
import pytest
from helpers import check, distinct, rand
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import array_shapes, mutually_broadcastable_shapes
from minitensor.errors import AxisError, DTypeError, ShapeError

import minitensor as mt

SETTINGS = settings(max_examples=25, deadline=None)
BROADCAST_PAIRS = [((3, 4), (3, 4)), ((3, 1), (4,)), ((2, 3, 4), (3, 1)), ((), (2, 3)), ((2, 1, 4), (1, 3, 1))]


def torch_or_skip():
    return pytest.importorskip("torch")


def both(torch, a):
    """A float64 minitensor leaf and a torch leaf holding the same values."""
    return (
        mt.tensor(a, dtype=mt.float64, requires_grad=True),
        torch.tensor(a, dtype=torch.float64, requires_grad=True),
    )


# -- maximum / minimum, max(a, b) ---------------------------------------------------------------
@pytest.mark.parametrize("sa,sb", BROADCAST_PAIRS)
@pytest.mark.parametrize("op", ["maximum", "minimum"])
def test_maximum_minimum_gradcheck_broadcasting(device, op, sa, sb):
    a = rand(device, *sa, seed=1)
    b = rand(device, *sb, seed=2)  # no ties (continuous draws): there the derivative jumps
    check(getattr(mt, op), a, b)


# -- floor division and remainder: // and % ---------------------------------------------------------
def off_the_jumps(device, shape, seed, scale=1.5, signs=False):
    """``scale`` times numbers at least 0.1 from a whole number (with random signs: +-scale):
    floor(a / b) jumps where a / b is whole, and a finite difference across a jump is no
    derivative. Dividends made with ``scale`` divided by divisors of +-``scale`` stay off them."""
    rng = np.random.default_rng([seed, *shape])
    values = (
        np.where(rng.random(shape) < 0.5, -1.0, 1.0)
        if signs
        else rng.integers(-3, 4, shape) + rng.uniform(0.1, 0.9, shape)
    )
    return mt.tensor(scale * values, dtype=mt.float64, device=device, requires_grad=True)


@pytest.mark.parametrize("sa,sb", BROADCAST_PAIRS)
def test_remainder_gradcheck_broadcasting(device, sa, sb):
    """dz/da = 1, dz/db = -floor(a / b), against finite differences away from the jumps, with
    divisors of both signs."""
    a, b = off_the_jumps(device, sa, seed=1), off_the_jumps(device, sb, seed=2, signs=True)
    check(lambda a, b: a % b, a, b)
    check(mt.remainder, a, b)
    check(lambda a: a % 1.5, a)
    check(lambda b: 2.25 % b, b)  # 2.25 / +-1.5 = +-1.5


@pytest.mark.parametrize("dtype", [mt.int64, mt.float32, mt.float64])
def test_floor_divide_and_remainder_round_as_python_does(device, dtype):
    """As Python's // and %: toward minus infinity, the remainder with the divisor's sign."""
    pairs = [(a, b) for a in (-7, -6, -1, 0, 1, 6, 7) for b in (-3, -2, 2, 3)]
    a = mt.tensor([a for a, _ in pairs], dtype=dtype, device=device)
    b = mt.tensor([b for _, b in pairs], dtype=dtype, device=device)
    assert (a // b).tolist() == [x // y for x, y in pairs] and (a // b).dtype == dtype
    assert (a % b).tolist() == [x % y for x, y in pairs] and (a % b).dtype == dtype
    assert a.floor_divide(b).tolist() == mt.floor_divide(a, b).tolist() == (a // b).tolist()
    assert a.remainder(b).tolist() == mt.remainder(a, b).tolist() == (a % b).tolist()
    assert (a // 2).tolist() == [x // 2 for x, _ in pairs] and (7 // b).tolist() == [7 // y for _, y in pairs]
    assert (a % 2).tolist() == [x % 2 for x, _ in pairs] and (7 % b).tolist() == [7 % y for _, y in pairs]
    assert (mt.tensor([7, -7], device=device) // 2.0).tolist() == [3.0, -4.0]  # an int tensor and a float: float


def test_floor_divide_is_outside_the_graph_and_integers_refuse_the_number_zero(device):
    x = rand(device, 3, seed=5)
    assert not (x // 2).requires_grad and (x % 2).requires_grad
    for op in ("floor_divide", "remainder"):
        with pytest.raises(ZeroDivisionError, match=f"{op}: integer division by zero"):
            getattr(mt.tensor([1, 2], device=device), op)(0)
    with np.errstate(divide="ignore"):
        assert (mt.tensor([1.0, -1.0], device=device) // 0).tolist() == [math.inf, -math.inf]  # floats: as PyTorch


def test_floor_divide_and_remainder_match_torch():
    torch = torch_or_skip()
    rng = np.random.default_rng(1)
    a, b = rng.uniform(-5, 5, (4, 5)), rng.uniform(0.5, 2, (5,)) * np.array([1, -1, 1, -1, 1])
    (ma, ta), (mb, tb) = both(torch, a), both(torch, b)
    np.testing.assert_array_equal((ma // mb).numpy(), (ta // tb).detach().numpy())
    g = rng.standard_normal((4, 5))
    (ma % mb).backward(g)
    torch.remainder(ta, tb).backward(torch.tensor(g))
    np.testing.assert_allclose(ma.grad.numpy(), ta.grad.numpy())
    np.testing.assert_allclose(mb.grad.numpy(), tb.grad.numpy())


def test_max_of_two_tensors_is_maximum(device):
    x = rand(device, 3, 4, seed=3, away=0.1)
    zeros = mt.zeros_like(x)
    np.testing.assert_array_equal(mt.max(x, zeros).numpy(), np.maximum(x.numpy(), 0))
    np.testing.assert_array_equal(x.max(zeros).numpy(), np.maximum(x.numpy(), 0))
    np.testing.assert_array_equal(mt.min(x, zeros).numpy(), np.minimum(x.numpy(), 0))
    np.testing.assert_array_equal(x.min(zeros).numpy(), np.minimum(x.numpy(), 0))
    check(lambda x: mt.max(x, mt.zeros_like(x)), x)  # D2L 5.1's relu from scratch
    assert mt.max(x, 1).shape == (3,)  # an axis stays an axis
    with pytest.raises(TypeError, match="max: keepdims goes with an axis"):
        mt.max(x, zeros, keepdims=True)


def test_maximum_ties_share_the_gradient_as_pytorch(device):
    a = mt.tensor([1.0, 2.0, 3.0], dtype=mt.float64, device=device, requires_grad=True)
    b = mt.tensor([1.0, 5.0, 0.0], dtype=mt.float64, device=device, requires_grad=True)
    mt.maximum(a, b).sum().backward()
    np.testing.assert_array_equal(a.grad.numpy(), [0.5, 0.0, 1.0])
    np.testing.assert_array_equal(b.grad.numpy(), [0.5, 1.0, 0.0])
    a.grad = b.grad = None
    mt.minimum(a, b).sum().backward()
    np.testing.assert_array_equal(a.grad.numpy(), [0.5, 1.0, 0.0])
    np.testing.assert_array_equal(b.grad.numpy(), [0.5, 0.0, 1.0])


def test_maximum_minimum_match_torch():
    torch = torch_or_skip()
    rng = np.random.default_rng(0)
    a, b = rng.integers(-2, 3, (4, 5)).astype(float), rng.integers(-2, 3, (5,)).astype(float)  # many ties
    for op in ("maximum", "minimum"):
        (ma, ta), (mb, tb) = both(torch, a), both(torch, b)
        g = rng.standard_normal((4, 5))
        getattr(mt, op)(ma, mb).backward(g)
        getattr(torch, op)(ta, tb).backward(torch.tensor(g))
        np.testing.assert_allclose(ma.grad.numpy(), ta.grad.numpy())
        np.testing.assert_allclose(mb.grad.numpy(), tb.grad.numpy())
    x = mt.tensor(a)
    np.testing.assert_array_equal(mt.max(x, mt.zeros_like(x)).numpy(), torch.max(torch.tensor(a), torch.zeros(4, 5)))


def test_maximum_keeps_dtypes_and_propagates_nan(device):
    x = mt.tensor([1.0, float("nan")], device=device)
    assert mt.maximum(x, mt.zeros_like(x)).dtype == mt.float32
    assert np.isnan(mt.maximum(x, mt.zeros_like(x)).numpy()[1])
    assert mt.maximum(mt.tensor([1, 5]), mt.tensor([3, 2])).tolist() == [3, 5]
    assert mt.maximum(mt.tensor([1, 5]), 2.5).dtype == mt.float32  # a float meets integers: float32


# -- dot, mv, mm ------------------------------------------------------------------------------
def test_dot_mv_mm_gradcheck(device):
    v, w = rand(device, 5, seed=1), rand(device, 5, seed=2)
    A, B = rand(device, 3, 5, seed=3), rand(device, 5, 4, seed=4)
    check(mt.dot, v, w)
    check(mt.mv, A, v)
    check(mt.mm, A, B)
    check(lambda a, b: a.mm(b), A, B)
    np.testing.assert_allclose(v.dot(w).numpy(), v.numpy() @ w.numpy())
    np.testing.assert_allclose(A.mv(v).numpy(), A.numpy() @ v.numpy())


@pytest.mark.parametrize(
    "op,shapes,words",
    [
        ("dot", ((3,), (4,)), "dot: the vectors differ in length, 3 and 4"),
        ("dot", ((3, 1), (3,)), r"dot: needs two 1-D tensors \(vectors\), got shapes \(3, 1\) and \(3,\)"),
        ("mv", ((3,), (3,)), r"mv: needs a 2-D tensor \(matrix\) and a 1-D tensor"),
        ("mv", ((2, 3), (4,)), r"mv: a matrix of shape \(2, 3\) times a vector of length 4"),
        ("mm", ((2, 3, 4), (4, 2)), r"mm: needs two 2-D tensors"),
        ("mm", ((2, 3), (4, 2)), r"mm: shapes \(2, 3\) and \(4, 2\) do not fit: 3 != 4"),
    ],
)
def test_dot_mv_mm_check_ranks_and_name_the_op(op, shapes, words):
    with pytest.raises(ShapeError, match=words):
        getattr(mt, op)(mt.ones(shapes[0]), mt.ones(shapes[1]))


def test_dot_mv_mm_match_torch():
    torch = torch_or_skip()
    rng = np.random.default_rng(1)
    A, B, v = rng.standard_normal((3, 5)), rng.standard_normal((5, 2)), rng.standard_normal(5)
    for op, args in (("dot", (v, v + 1)), ("mv", (A, v)), ("mm", (A, B))):
        mine, theirs = zip(*(both(torch, a) for a in args))
        z, t = getattr(mt, op)(*mine), getattr(torch, op)(*theirs)
        np.testing.assert_allclose(z.numpy(), t.detach().numpy())
        z.sum().backward()
        t.sum().backward()
        for m, th in zip(mine, theirs):
            np.testing.assert_allclose(m.grad.numpy(), th.grad.numpy())


# -- norm -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs", [{}, {"p": 1}, {"p": 3}, {"p": 1.5, "axis": 1}, {"axis": 0, "keepdims": True}, {"p": math.inf}]
)
def test_norm_gradcheck(device, kwargs):
    x = distinct(device, 3, 4) if kwargs.get("p") == math.inf else rand(device, 3, 4, away=0.1)
    check(lambda x: mt.norm(x, **kwargs), x)


def test_norm_is_d2l_s_length_and_its_gradient_at_zero_is_zero(device):
    u = mt.tensor([3.0, -4.0], device=device)
    assert u.norm().item() == 5.0  # D2L 2.3.11
    assert mt.norm(mt.ones(4, 9, device=device)).item() == 6.0  # the Frobenius norm
    x = mt.zeros(3, dtype=mt.float64, device=device, requires_grad=True)
    x.norm().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [0.0, 0.0, 0.0])  # not NaN
    assert mt.norm(mt.tensor([3, 4])).dtype == mt.float32
    with pytest.raises(ValueError, match="norm: p must be 'fro' or a number > 0"):
        mt.norm(u, p="nuc")


def test_norm_matches_torch():
    torch = torch_or_skip()
    a = np.random.default_rng(2).standard_normal((3, 4))
    for kwargs in ({}, {"p": 1, "dim": 1}, {"p": 3, "dim": 0, "keepdim": True}, {"p": math.inf}):
        (m, t) = both(torch, a)
        z, r = mt.norm(m, **kwargs), torch.norm(t, **kwargs)
        np.testing.assert_allclose(z.numpy(), r.detach().numpy())
        z.sum().backward()
        r.sum().backward()
        np.testing.assert_allclose(m.grad.numpy(), t.grad.numpy(), err_msg=str(kwargs))
    (m, t) = both(torch, np.zeros(3))
    m.norm().backward()
    torch.norm(t).backward()
    np.testing.assert_array_equal(m.grad.numpy(), t.grad.numpy())


# -- cumsum -----------------------------------------------------------------------------------
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_cumsum_gradcheck(device, axis):
    check(lambda x: mt.cumsum(x, axis), rand(device, 3, 4))
    check(lambda x: x.cumsum(dim=axis), rand(device, 3, 4))


def test_cumsum_values_dtypes_and_numbers(device):
    x = mt.tensor([[1, 2, 3], [4, 5, 6]], device=device)
    assert x.cumsum(1).tolist() == [[1, 3, 6], [4, 9, 15]]
    assert x.cumsum(0).dtype == mt.int64
    assert (x > 2).cumsum(1).dtype == mt.int64
    assert mt.cumsum(mt.tensor(2.0), 0).shape == ()
    with pytest.raises(AxisError, match="cumsum: axis 2 is out of bounds"):
        x.cumsum(2)


# -- prod, std, logsumexp ---------------------------------------------------------------------
@pytest.mark.parametrize("kwargs", [{}, {"axis": 0}, {"axis": 1, "keepdims": True}, {"axis": (0, 2)}])
@pytest.mark.parametrize("op", ["prod", "std", "logsumexp"])
def test_reductions_gradcheck(device, op, kwargs):
    x = rand(device, 2, 3, 4, away=0.3, low=-1.5, high=1.5)
    check(lambda x: getattr(mt, op)(x, **kwargs), x)
    check(lambda x: getattr(x, op)(**kwargs), x)


def test_prod_gradient_with_zeros(device):
    """One zero: only it gets a gradient (the product of the others); two or more: none does."""
    x = mt.tensor(
        [[2.0, 3.0, 4.0], [2.0, 0.0, 4.0], [0.0, 3.0, 0.0]], dtype=mt.float64, device=device, requires_grad=True
    )
    x.prod(1).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [[12.0, 8.0, 6.0], [0.0, 8.0, 0.0], [0.0, 0.0, 0.0]])
    y = mt.tensor([[0.0, 1.5, -2.0]], dtype=mt.float64, device=device, requires_grad=True)
    check(lambda y: y.prod(), y, eps=1e-6)


def test_std_is_sqrt_var_with_the_same_correction(device):
    x = rand(device, 4, 5, requires_grad=False)
    np.testing.assert_allclose(x.std().numpy(), np.std(x.numpy(), ddof=1))
    np.testing.assert_allclose(x.std(dim=1, correction=0).numpy(), np.std(x.numpy(), axis=1))
    np.testing.assert_allclose(x.std(0, keepdims=True).numpy() ** 2, x.var(0, keepdims=True).numpy())


def test_logsumexp_does_not_overflow(device):
    x = mt.tensor([[1000.0, 1000.0], [-1000.0, 0.0]], dtype=mt.float64, device=device, requires_grad=True)
    z = x.logsumexp(1)
    np.testing.assert_allclose(z.numpy(), [1000 + math.log(2), 0.0])
    z.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [[0.5, 0.5], [0.0, 1.0]])
    assert mt.logsumexp(mt.tensor([-math.inf, -math.inf])).item() == -math.inf


def test_reductions_match_torch():
    torch = torch_or_skip()
    a = np.random.default_rng(3).standard_normal((3, 4))
    a[1, 2] = 0.0  # one zero in a row of the product
    cases = [
        ("prod", {}, {}),
        ("prod", {"dim": 1}, {"dim": 1}),
        ("std", {}, {}),
        ("std", {"dim": 0, "keepdim": True}, {"dim": 0, "keepdim": True}),
        ("std", {"dim": 1, "correction": 0}, {"dim": 1, "correction": 0}),
        ("logsumexp", {"dim": 1}, {"dim": 1}),
        ("logsumexp", {"dim": (0, 1)}, {"dim": (0, 1)}),
        ("cumsum", {"dim": 1}, {"dim": 1}),
    ]
    for op, mine, theirs in cases:
        m, t = both(torch, a)
        z, r = getattr(mt, op)(m, **mine), getattr(torch, op)(t, **theirs)
        np.testing.assert_allclose(z.numpy(), r.detach().numpy(), rtol=1e-12, err_msg=op)
        g = np.random.default_rng(4).standard_normal(r.shape)
        z.backward(g)
        r.backward(torch.tensor(g))
        np.testing.assert_allclose(m.grad.numpy(), t.grad.numpy(), rtol=1e-10, err_msg=f"{op} {mine}")


def test_prod_with_zeros_matches_torch():
    torch = torch_or_skip()
    for row in ([0.0, 2.0, 3.0], [0.0, 2.0, 0.0], [1.0, 2.0, 3.0]):
        m, t = both(torch, np.array(row))
        m.prod().backward()
        t.prod().backward()
        np.testing.assert_array_equal(m.grad.numpy(), t.grad.numpy())


# -- isnan, isinf, isfinite -------------------------------------------------------------------
def test_isnan_isinf_isfinite(device):
    x = mt.tensor([1.0, math.nan, math.inf, -math.inf, 0.0], device=device, requires_grad=True)
    assert mt.isnan(x).tolist() == [False, True, False, False, False]
    assert x.isinf().tolist() == [False, False, True, True, False]
    assert mt.isfinite(x).tolist() == [True, False, False, False, True]
    assert x.isnan().dtype == mt.bool and not x.isnan().requires_grad
    assert mt.isfinite(mt.tensor([1, 2])).all()


# -- flip and gather --------------------------------------------------------------------------
@pytest.mark.parametrize("axis", [0, -1, (0, 1), (2, 0)])
def test_flip_gradcheck_and_values(device, axis):
    x = rand(device, 2, 3, 4)
    check(lambda x: mt.flip(x, axis), x)
    np.testing.assert_array_equal(x.flip(axis).numpy(), np.flip(x.numpy(), axis))
    with pytest.raises(AxisError, match="flip: axis 3 is out of bounds"):
        x.flip(3)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather_gradcheck_with_repeated_indices(device, axis):
    x = rand(device, 3, 4)
    n = x.shape[axis]
    index = mt.tensor(np.random.default_rng(axis + 5).integers(0, n, (3, 4)), device=device)
    index[0, 0] = index[1, 0] = index[2, 0] = 0  # one element picked several times: gradients add up
    check(lambda x: mt.gather(x, axis, index), x)
    np.testing.assert_array_equal(x.gather(axis, index).numpy(), np.take_along_axis(x.numpy(), index.numpy(), axis))


def test_gather_a_shorter_index_and_d2l_s_cross_entropy(device):
    y_hat = mt.tensor([[0.1, 0.3, 0.6], [0.3, 0.2, 0.5]], device=device)
    y = mt.tensor([0, 2], device=device)
    np.testing.assert_allclose(y_hat.gather(1, y.reshape(-1, 1)).numpy(), [[0.1], [0.5]])  # D2L 4.1
    x = rand(device, 3, 4)
    index = mt.tensor([[2, 0], [1, 1]], device=device)  # shorter along both axes
    check(lambda x: mt.gather(x, 0, index), x)
    np.testing.assert_array_equal(mt.gather(x, dim=0, index=index).numpy(), x.numpy()[[[2, 0], [1, 1]], [0, 1]])


def test_gather_checks_name_the_op():
    x = mt.ones(3, 4)
    with pytest.raises(TypeError, match="gather: index must be an integer tensor"):
        mt.gather(x, 1, mt.ones(3, 1))
    with pytest.raises(ShapeError, match=r"gather: index of shape \(3,\) for a tensor of shape \(3, 4\)"):
        mt.gather(x, 1, mt.tensor([0, 1, 2]))
    with pytest.raises(ShapeError, match="gather: index of shape"):
        mt.gather(x, 1, mt.zeros(4, 1, dtype=mt.int64))
    with pytest.raises(IndexError, match=r"gather: index 4 is out of range for axis 1 of length 4 \(valid: 0..3\)"):
        mt.gather(x, 1, mt.tensor([[4]]))
    with pytest.raises(IndexError, match="gather: index -1 is out of range"):
        mt.gather(x, 1, mt.tensor([[-1]]))
    with pytest.raises(AxisError, match="gather: axis 2 is out of bounds"):
        mt.gather(x, 2, mt.tensor([[0]]))


def test_flip_and_gather_match_torch():
    torch = torch_or_skip()
    a = np.random.default_rng(6).standard_normal((3, 4))
    index = np.array([[0, 0, 3], [2, 1, 0]])
    m, t = both(torch, a)
    z, r = mt.gather(m, 1, mt.tensor(index)), torch.gather(t, 1, torch.tensor(index))
    np.testing.assert_array_equal(z.numpy(), r.detach().numpy())
    (z * z).sum().backward()
    (r * r).sum().backward()
    np.testing.assert_allclose(m.grad.numpy(), t.grad.numpy())
    m, t = both(torch, a)
    mt.flip(m, (0, 1)).cumsum(1).sum().backward()
    torch.flip(t, (0, 1)).cumsum(1).sum().backward()
    np.testing.assert_array_equal(m.grad.numpy(), t.grad.numpy())


# -- makers -----------------------------------------------------------------------------------
def test_linspace(device):
    x = mt.linspace(-4, 4, 9, device=device)
    assert x.dtype == mt.float32 and x.device == device
    np.testing.assert_allclose(x.numpy(), np.linspace(-4, 4, 9))
    assert mt.linspace(0, 1, 1).tolist() == [0.0]
    assert mt.linspace(0, 1, 0).shape == (0,)
    assert mt.linspace(0, 1, 5, dtype=mt.float64, requires_grad=True).requires_grad
    with pytest.raises(ValueError, match="linspace: steps must be an integer >= 0, got -1"):
        mt.linspace(0, 1, -1)
    with pytest.raises(ValueError, match="linspace: steps must be an integer >= 0, got 2.5"):
        mt.linspace(0, 1, 2.5)
    with pytest.raises(ValueError, match="linspace: end must be a finite number"):
        mt.linspace(0, math.inf, 3)
    with pytest.raises(ValueError, match="linspace: the result would have shape"):
        mt.linspace(0, 1, 10**15)


def test_randperm_is_seeded_and_a_permutation(device):
    mt.manual_seed(0)
    p = mt.randperm(50, device=device)
    mt.manual_seed(0)
    assert mt.randperm(50, device=device).tolist() == p.tolist()
    assert p.dtype == mt.int64 and p.device == device
    assert sorted(p.tolist()) == list(range(50)) and p.tolist() != list(range(50))
    assert mt.randperm(0).shape == (0,)
    with pytest.raises(ValueError, match="randperm: n must be an integer >= 0"):
        mt.randperm(-3)
    with pytest.raises(ValueError, match="randperm: the result would have shape"):
        mt.randperm(10**15)


def test_like_makers_and_empty(device):
    x = mt.ones(2, 3, dtype=mt.float64, device=device)
    f = mt.full_like(x, 7)
    assert f.tolist() == [[7.0] * 3] * 2 and f.dtype == mt.float64 and f.device == device
    assert mt.full_like(x, 1, dtype=mt.int64).dtype == mt.int64
    for maker in (mt.rand_like, mt.randn_like, mt.empty_like):
        y = maker(x)
        assert (y.shape, y.dtype, y.device) == ((2, 3), mt.float64, device)
    assert mt.rand_like(x, requires_grad=True).requires_grad
    assert (0 <= mt.rand_like(x).numpy()).all() and (mt.rand_like(x).numpy() < 1).all()
    assert mt.empty(2, 3).tolist() == [[0.0] * 3] * 2  # zeros here, documented
    assert mt.empty((4,), dtype=mt.int64).dtype == mt.int64
    with pytest.raises(ValueError, match=r"empty: a shape is whole numbers >= 0, got \(-1,\)"):
        mt.empty(-1)
    with pytest.raises(ValueError, match="empty: the result would have shape"):
        mt.empty(10**8, 10**8)
    with pytest.raises(DTypeError, match="randn: draws real numbers"):
        mt.randn_like(mt.tensor([1, 2]))


# -- Tensor methods ---------------------------------------------------------------------------
def test_int_bool_type_as_view_as_expand_as(device):
    x = mt.tensor([[1.7, -2.5, 0.0]], device=device, requires_grad=True)
    assert x.int().dtype == mt.int32 and x.int().tolist() == [[1, -2, 0]] and not x.int().requires_grad
    assert x.bool().tolist() == [[True, True, False]] and x.bool().dtype == mt.bool
    assert x.type_as(mt.tensor([1], device=device)).dtype == mt.int64
    d = rand(device, 1, 3)
    check(lambda d: d.type_as(d).view_as(mt.ones(3, 1)).expand_as(mt.ones(3, 4)), d)
    assert d.expand_as(mt.ones(2, 3)).shape == (2, 3)
    with pytest.raises(ShapeError):
        d.view_as(mt.ones(2, 2))


def test_methods_match_torch():
    torch = torch_or_skip()
    a = np.array([[1.7, -2.5, 0.0]])
    x, t = mt.tensor(a), torch.tensor(a)
    assert x.int().tolist() == t.int().tolist()
    assert x.bool().tolist() == t.bool().tolist()
    assert x.view_as(mt.ones(3, 1)).shape == tuple(t.view_as(torch.ones(3, 1)).shape)
    assert x.reshape(3, 1).expand_as(mt.ones(3, 2)).tolist() == t.reshape(3, 1).expand_as(torch.ones(3, 2)).tolist()


# -- properties -------------------------------------------------------------------------------
@SETTINGS
@given(
    shapes=mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=3, max_side=3),
    seed=st.integers(0, 2**16),
)
def test_maximum_property(shapes, seed):
    """maximum's gradients sum back to each input's shape and add up to dL/dz, ties or not."""
    (sa, sb), out = shapes.input_shapes, shapes.result_shape
    rng = np.random.default_rng(seed)
    a, b = rng.integers(-1, 2, sa).astype(float), rng.integers(-1, 2, sb).astype(float)
    ta = mt.tensor(a, dtype=mt.float64, requires_grad=True)
    tb = mt.tensor(b, dtype=mt.float64, requires_grad=True)
    z = mt.maximum(ta, tb)
    np.testing.assert_array_equal(z.numpy(), np.maximum(a, b))
    z.sum().backward()
    assert ta.grad.shape == sa and tb.grad.shape == sb
    assert ta.grad.numpy().sum() + tb.grad.numpy().sum() == pytest.approx(float(np.prod(out)))


@SETTINGS
@given(shape=array_shapes(min_dims=1, max_dims=3, max_side=4), data=st.data())
def test_reductions_property(shape, data):
    """prod, logsumexp, std and norm over a random axis agree with NumPy, cumsum too, and pass gradcheck."""
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    a = rng.uniform(0.5, 1.5, shape) * rng.choice([-1.0, 1.0], shape)
    x = mt.tensor(a, dtype=mt.float64, requires_grad=True)
    np.testing.assert_allclose(x.prod(axis).numpy(), a.prod(axis))
    np.testing.assert_allclose(x.cumsum(axis).numpy(), a.cumsum(axis))
    np.testing.assert_allclose(x.norm(dim=axis).numpy(), np.sqrt((a * a).sum(axis)))
    np.testing.assert_allclose(x.logsumexp(axis).numpy(), np.log(np.exp(a).sum(axis)))
    assert mt.gradcheck(lambda x: x.prod(axis).sum() + x.logsumexp(axis).sum() + x.cumsum(axis).sum(), [x])
    if shape[axis] > 1:
        np.testing.assert_allclose(x.std(axis).numpy(), np.std(a, axis=axis, ddof=1))
        assert mt.gradcheck(lambda x: x.std(axis).sum(), [x])


# -- F.one_hot (D2L 9.5) and nn.Flatten (D2L 4.2's first layer) ---------------------------------------
def test_one_hot_matches_pytorch(device):
    F = mt.nn.functional
    indices = np.array([[0, 3], [2, 1]])
    got = F.one_hot(mt.tensor(indices, device=device), 4)
    assert got.dtype == mt.int64 and got.shape == (2, 2, 4) and not got.requires_grad
    np.testing.assert_array_equal(got.numpy(), np.eye(4, dtype=np.int64)[indices])
    assert F.one_hot(mt.tensor([1, 2], device=device)).shape == (2, 3)  # num_classes inferred
    torch = pytest.importorskip("torch")
    np.testing.assert_array_equal(got.numpy(), torch.nn.functional.one_hot(torch.tensor(indices), 4).numpy())


@pytest.mark.parametrize(
    "call, error, words",
    [
        (lambda F: F.one_hot(mt.tensor([0, 5]), 3), IndexError, r"class index 5 is out of range for 3 classes"),
        (lambda F: F.one_hot(mt.tensor([-1]), 3), IndexError, r"class index -1 is out of range"),
        (lambda F: F.one_hot(mt.tensor([1.0])), TypeError, r"one_hot: indices must be an integer tensor"),
        (lambda F: F.one_hot(mt.tensor([1]), 0), ValueError, r"num_classes must be an integer >= 1"),
        (lambda F: F.one_hot(mt.zeros(0, dtype=mt.int64)), ValueError, r"cannot infer num_classes"),
        (lambda F: F.one_hot(mt.tensor([1]), 10**13), ValueError, r"one_hot: the result would have shape"),
    ],
)
def test_one_hot_refuses_what_it_cannot_encode(call, error, words):
    with pytest.raises(error, match=words):
        call(mt.nn.functional)


def test_flatten_layer():
    net = mt.nn.Sequential(mt.nn.Flatten(), mt.nn.LazyLinear(10))
    X = mt.randn(2, 1, 28, 28)
    assert net(X).shape == (2, 10) and mt.nn.Flatten(0)(X).shape == (2 * 28 * 28,)
    assert mt.nn.Flatten(1, 2)(X).shape == (2, 28, 28) and mt.nn.Flatten(start_dim=2)(X).shape == (2, 1, 784)
    assert repr(mt.nn.Flatten()) == "Flatten(start_axis=1, end_axis=-1)"
