"""The backward pass itself: accumulation, graph lifetime, deep graphs, grad modes,
in-place rules, user-written Functions."""

import gc
import weakref

import numpy as np
import pytest
from helpers import rand
from hypothesis import given, settings
from hypothesis import strategies as st
from minitensor.autograd import Function

import minitensor as mt


# -- accumulation -----------------------------------------------------------------------------
def test_gradients_accumulate_across_backward_calls(device):
    x = mt.tensor([1.0, 2.0, 3.0], device=device, requires_grad=True)
    (x * x).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [2, 4, 6])
    (3 * x).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [5, 7, 9])
    x.grad = None
    x.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [1, 1, 1])


def test_gradients_add_up_over_paths(device):
    x = mt.tensor([1.0, -2.0], device=device, requires_grad=True)
    y = x * x + x  # x used three times, along two paths
    z = (y * x.exp()).sum() + x.sum()
    z.backward()
    a = np.array([1.0, -2.0])
    expected = (2 * a + 1) * np.exp(a) + (a * a + a) * np.exp(a) + 1
    np.testing.assert_allclose(x.grad.numpy(), expected, rtol=1e-6)


def test_diamond_graph(device):
    x = mt.tensor(2.0, device=device, requires_grad=True)
    a, b = x * 3, x * 5
    ((a * b) + a).backward()  # 15 x^2 + 3 x
    assert x.grad.item() == pytest.approx(30 * 2 + 3)


# -- graph lifetime -----------------------------------------------------------------------------
def test_retain_graph_allows_a_second_backward(device):
    x = mt.tensor([1.0, 2.0], device=device, requires_grad=True)
    y = (x * x).sum()
    y.backward(retain_graph=True)
    y.backward()
    np.testing.assert_allclose(x.grad.numpy(), [4, 8])


def test_backward_through_a_freed_graph_raises(device):
    x = mt.tensor([1.0, 2.0], device=device, requires_grad=True)
    y = (x.exp() * 2).sum()
    y.backward()
    with pytest.raises(mt.GraphError, match="freed") as e:
        y.backward()
    assert "retain_graph=True" in str(e.value)


def test_graph_is_released_after_backward(device):
    x = rand(device, 3, 4)
    h = x.exp()
    saved = h._ctx.saved[0]  # the array Exp saved for backward
    h_ref, saved_ref = weakref.ref(h), weakref.ref(saved)
    loss = (h * 2).sum()
    del h, saved
    assert h_ref() is not None and saved_ref() is not None  # the graph holds them
    loss.backward()
    assert h_ref() is None, "the intermediate tensor outlived backward()"
    assert saved_ref() is None, "a saved array outlived backward()"


def test_retain_graph_keeps_the_graph(device):
    x = rand(device, 3)
    h = x.tanh()
    h_ref = weakref.ref(h)
    loss = (h * h).sum()
    del h
    loss.backward(retain_graph=True)
    assert h_ref() is not None
    loss.backward()
    assert h_ref() is None


def test_graph_has_no_reference_cycles(device):
    gc.collect()
    gc.disable()
    try:
        x = rand(device, 3)
        h = x.sigmoid()
        ref = weakref.ref(h)
        loss = mt.layer_norm(h * x, 3).sum()
        del h, loss  # never backpropagated: freed by reference counting alone
        assert ref() is None
    finally:
        gc.enable()


@pytest.mark.parametrize("n", [10_000, 100_000])
def test_deep_chain_has_no_recursion_limit(n):
    x = mt.tensor([1.0], dtype=mt.float64, requires_grad=True)
    y = x
    if n == 10_000:
        for _ in range(n):
            y = y * 1.0001
        expected_value, expected_grad = 1.0001**n, 1.0001**n
    else:  # the cheapest op there is
        for _ in range(n):
            y = y + 1.0
        expected_value, expected_grad = 1.0 + n, 1.0
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [expected_grad], rtol=1e-9)
    assert y.item() == pytest.approx(expected_value)


def test_deep_chain_of_mixed_ops():
    x = mt.tensor([0.5], dtype=mt.float64, requires_grad=True)
    y = x
    for _ in range(3_000):
        y = (y.tanh() * 2.0).reshape(1, 1).sum(axis=0)  # 3 ops per step, 9,000 in all
    y.sum().backward()
    # d/dx of the iteration, computed by hand
    v, d = 0.5, 1.0
    for _ in range(3_000):
        t = np.tanh(v)
        d *= 2 * (1 - t * t)
        v = 2 * t
    np.testing.assert_allclose(x.grad.numpy(), [d], rtol=1e-9)


def test_deleting_a_deep_retained_graph_does_not_crash():
    x = mt.tensor([1.0], requires_grad=True)
    y = x
    for _ in range(100_000):
        y = y * 1.0
    y.sum().backward(retain_graph=True)
    del y  # a 100,000-deep chain of objects freed at once (no C stack overflow)
    gc.collect()


# -- grad modes ----------------------------------------------------------------------------------
def test_no_grad_records_nothing(device):
    x = rand(device, 3)
    with mt.no_grad():
        assert not mt.is_grad_enabled()
        y = x * 2 + x.exp()
    assert mt.is_grad_enabled()
    assert y.requires_grad is False and y.grad_fn is None and y.is_leaf
    with pytest.raises(mt.GraphError):
        y.sum().backward()


def test_no_grad_as_decorator(device):
    @mt.no_grad()
    def f(x):
        return x * 2

    x = rand(device, 3)
    y = f(x)
    assert not y.requires_grad and y.grad_fn is None
    assert mt.is_grad_enabled()
    assert f.__name__ == "f"


def test_no_grad_restores_mode_after_an_exception(device):
    with pytest.raises(ZeroDivisionError):
        with mt.no_grad():
            1 / 0
    assert mt.is_grad_enabled()


def test_enable_grad_inside_no_grad(device):
    x = rand(device, 3)
    with mt.no_grad():
        with mt.enable_grad():
            y = x * 2
        z = x * 2
    assert y.requires_grad and y.grad_fn is not None
    assert not z.requires_grad
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [2, 2, 2])


def test_set_grad_enabled(device):
    x = rand(device, 2)
    mt.set_grad_enabled(False)
    try:
        assert not (x * 2).requires_grad
    finally:
        mt.set_grad_enabled(True)
    assert (x * 2).requires_grad


def test_detach(device):
    x = rand(device, 3)
    y = x * 2
    d = y.detach()
    assert d.is_leaf and not d.requires_grad and d.grad_fn is None
    np.testing.assert_array_equal(d.numpy(), y.numpy())
    z = (d * x).sum()  # no gradient flows through d
    z.backward()
    np.testing.assert_allclose(x.grad.numpy(), y.numpy())


def test_retain_grad_on_a_non_leaf(device):
    x = rand(device, 3)
    h = x * 3
    h.retain_grad()
    k = x * 4
    (h * h + k).sum().backward()
    np.testing.assert_allclose(h.grad.numpy(), 2 * h.numpy())
    np.testing.assert_allclose(x.grad.numpy(), 18 * x.numpy() + 4)
    assert k.grad is None  # not retained


def test_non_leaf_and_constants_get_no_grad(device):
    x = rand(device, 3)
    c = mt.tensor([1.0, 2.0, 3.0], dtype=mt.float64, device=device)
    (x * c).sum().backward()
    assert c.grad is None and not c.requires_grad


# -- in-place updates ------------------------------------------------------------------------------
INPLACE = {
    "add_": lambda t, o: t.add_(o),
    "add_ alpha": lambda t, o: t.add_(o, alpha=-0.5),
    "mul_": lambda t, o: t.mul_(o),
    "zero_": lambda t, o: t.zero_(),
    "copy_": lambda t, o: t.copy_(o),
    "fill_": lambda t, o: t.fill_(3.0),
    "setitem": lambda t, o: t.__setitem__(slice(0, 2), 7.0),
    "setitem tensor": lambda t, o: t.__setitem__((Ellipsis,), o),
}
INPLACE_EXPECTED = {
    "add_": lambda a, o: a + o,
    "add_ alpha": lambda a, o: a - 0.5 * o,
    "mul_": lambda a, o: a * o,
    "zero_": lambda a, o: 0 * a,
    "copy_": lambda a, o: o + 0 * a,
    "fill_": lambda a, o: 0 * a + 3,
    "setitem": lambda a, o: np.concatenate([[7.0, 7.0], a[2:]]),
    "setitem tensor": lambda a, o: o + 0 * a,
}


@pytest.mark.parametrize("name", list(INPLACE))
def test_inplace_on_a_tensor_requiring_grad_raises(device, name):
    t = rand(device, 4)
    other = mt.tensor([1.0, 2.0, 3.0, 4.0], dtype=mt.float64, device=device)
    before = t.numpy()
    with pytest.raises(mt.GraphError, match="no_grad") as e:
        INPLACE[name](t, other)
    assert name.split()[0].replace("setitem", "__setitem__") in str(e.value)
    np.testing.assert_array_equal(t.numpy(), before)  # nothing was changed


@pytest.mark.parametrize("name", list(INPLACE))
def test_inplace_works_under_no_grad(device, name):
    t = rand(device, 4)
    other = mt.tensor([1.0, 2.0, 3.0, 4.0], dtype=mt.float64, device=device)
    a, o = t.numpy(), other.numpy()
    data = t.data
    with mt.no_grad():
        out = INPLACE[name](t, other)
    assert out is t or out is None
    assert t.data is data  # really in place (an optimiser relies on it)
    assert t.requires_grad
    np.testing.assert_allclose(t.numpy(), INPLACE_EXPECTED[name](a, o))


@pytest.mark.parametrize("name", list(INPLACE))
def test_inplace_on_a_plain_tensor_is_allowed(device, name):
    t = rand(device, 4, requires_grad=False)
    other = mt.tensor([1.0, 2.0, 3.0, 4.0], dtype=mt.float64, device=device)
    a, o = t.numpy(), other.numpy()
    INPLACE[name](t, other)
    np.testing.assert_allclose(t.numpy(), INPLACE_EXPECTED[name](a, o))


def test_inplace_across_devices_raises():
    t = mt.zeros(3)
    with pytest.raises(mt.DeviceError, match="strict"):
        t.copy_(mt.ones(3, device="strict"))


def test_optimizer_style_update(device):
    w = rand(device, 3)
    (w * w).sum().backward()
    expected = w.numpy() - 0.1 * w.grad.numpy()
    with mt.no_grad():
        w.add_(w.grad, alpha=-0.1)
        w.grad.zero_()
    np.testing.assert_allclose(w.numpy(), expected)
    np.testing.assert_array_equal(w.grad.numpy(), 0)


# -- backward with an explicit gradient --------------------------------------------------------------
def test_backward_with_a_given_gradient(device):
    x = rand(device, 2, 3)
    y = x * 2
    g = np.arange(6.0).reshape(2, 3)
    y.backward(mt.tensor(g, dtype=mt.float64, device=device))
    np.testing.assert_allclose(x.grad.numpy(), 2 * g)
    x.grad = None
    (x * 3).backward(g)  # a NumPy array works too
    np.testing.assert_allclose(x.grad.numpy(), 3 * g)


def test_backward_with_a_wrong_shaped_gradient(device):
    x = rand(device, 2, 3)
    with pytest.raises(mt.ShapeError, match=r"\(3, 2\).*\(2, 3\)"):
        (x * 2).backward(mt.ones(3, 2, dtype=mt.float64, device=device))


def test_backward_on_a_scalar_of_shape_1(device):
    x = rand(device, 1)
    (x * 2).backward()
    np.testing.assert_allclose(x.grad.numpy(), [2])


# -- leaf gradients are independent arrays ------------------------------------------------------------
def _independent(a, b):
    ga, gb = a.grad.numpy(), b.grad.numpy()
    with mt.no_grad():
        a.grad.add_(100.0)  # mutate one in place
    np.testing.assert_array_equal(b.grad.numpy(), gb)
    np.testing.assert_array_equal(a.grad.numpy(), ga + 100)


def test_leaf_grads_are_independent_arrays(device):
    a, b = rand(device, 3, seed=1), rand(device, 3, seed=2)
    (a + b).sum().backward()
    _independent(a, b)


def test_leaf_grads_are_independent_after_a_given_gradient(device):
    a, b = rand(device, 3, seed=1), rand(device, 3, seed=2)
    (a - b).backward(mt.ones(3, dtype=mt.float64, device=device))
    _independent(b, a)


def test_leaf_grads_are_independent_through_views(device):
    a, b = rand(device, 2, 3, seed=1), rand(device, 3, 2, seed=2)
    (a.T + b).backward(mt.ones(3, 2, dtype=mt.float64, device=device))
    _independent(a, b)


def test_leaf_grads_are_writable(device):
    a = rand(device, 2, 3)
    a.sum().backward()
    with mt.no_grad():
        a.grad.mul_(0.5)  # gradient clipping does this
    np.testing.assert_allclose(a.grad.numpy(), 0.5)


def test_given_gradient_is_not_aliased(device):
    x = rand(device, 3)
    g = mt.ones(3, dtype=mt.float64, device=device)
    x.backward(g)
    with mt.no_grad():
        x.grad.zero_()
    np.testing.assert_array_equal(g.numpy(), 1.0)


# -- a gradient that is zero but on a slice (x[t]: autograd.GradAt) --------------------------------
def test_reading_rows_in_a_loop_gives_each_row_its_gradient(device):
    """``for x_t in X``: every row's gradient lands in its row, added to the other paths' (a
    dense one from ``X * w``, overlapping slices, a row read twice), as the dense sum would."""
    X = rand(device, 5, 3)
    w = rand(device, 5, 3, seed=7)
    total = (X * w).sum()
    for t, x_t in enumerate(X):
        total = total + (x_t * (t + 1)).sum()
    total = total + (X[1:4] * 10).sum() + X[2].sum() + X[-1, 1:].sum()
    total.backward()
    expected = w.numpy() + np.arange(1, 6)[:, None]
    expected[1:4] += 10
    expected[2] += 1
    expected[-1, 1:] += 1
    np.testing.assert_allclose(X.grad.numpy(), expected)


@pytest.mark.parametrize("slice_first", [True, False])
def test_a_slice_gradient_never_writes_into_an_array_another_tensor_holds(device, slice_first):
    """Add hands one gradient array to both of its inputs; adding a[0]'s slice gradient into a's
    must copy it first, or b's gradient (the same array) would change too. Either order of
    arrival: the slice first (made after the sum, so visited first) or the shared array first."""
    x = rand(device, 3, 2)
    a, b = x * 1, x * 1
    a.retain_grad()
    b.retain_grad()
    if slice_first:
        loss = (a + b).sum() + a[0].sum() * 3
    else:
        row = a[0].sum() * 3
        loss = row + (a + b).sum()
    loss.backward()
    np.testing.assert_allclose(b.grad.numpy(), np.ones((3, 2)))
    np.testing.assert_allclose(a.grad.numpy(), [[4, 4], [1, 1], [1, 1]])
    np.testing.assert_allclose(x.grad.numpy(), [[5, 5], [2, 2], [2, 2]])


@st.composite
def basic_reads(draw):
    """A shape and a few basic indices into it, each keeping at least one axis."""
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)))
    reads = []
    for _ in range(draw(st.integers(1, 6))):
        index = []
        for axis, n in enumerate(shape):
            if axis < len(shape) - 1 and draw(st.booleans()):
                index.append(draw(st.integers(-n, n - 1)))  # an int drops the axis; the last axis stays
            else:
                start, stop = draw(st.integers(-n, n)), draw(st.integers(-n, n))
                index.append(slice(start, stop, draw(st.sampled_from([None, 1, 2, -1]))))
        reads.append((tuple(index), draw(st.floats(-2, 2, allow_nan=False))))
    return shape, reads, draw(st.booleans())


@settings(max_examples=60, deadline=None)
@given(basic_reads())
def test_slice_gradients_add_up_as_numpy_says(case):
    """Any basic reads of x (overlapping, empty, reversed, with a dense path or without): x's
    gradient is NumPy's sum of each read's weight at the positions it read."""
    shape, reads, dense = case
    x = mt.tensor(np.arange(np.prod(shape), dtype=np.float64).reshape(shape), requires_grad=True)
    total = (x * 0.5).sum() if dense else None
    expected = np.full(shape, 0.5 if dense else 0.0)
    for index, weight in reads:
        part = (x[index] * weight).sum()
        total = part if total is None else total + part
        expected[index] += weight
    total.backward()
    np.testing.assert_allclose(x.grad.numpy(), expected, atol=1e-12)


def test_a_loop_over_rows_allocates_one_gradient_not_one_per_row():
    """T reads of one row each: backward fills one array of X's shape (one ``zeros``) and adds
    each row's gradient into its row, where a dense gradient per read made T arrays of X's size
    and T - 1 sums of them (T^2 memory traffic; PyTorch's ``unbind`` costs T rows too)."""
    from strict_backend import count_launches

    for T in (4, 16):
        X = rand("strict", T, 8)
        total = None
        for x_t in X:
            total = x_t.sum() if total is None else total + x_t.sum()
        with count_launches() as log:
            total.backward()
        launched = log.by("what")
        assert launched.get("xp.zeros", 0) == 1, launched
        assert len(log) <= T + 4, log  # a row's add each, the zeros, the leaf's copy


# -- a user-written Function ---------------------------------------------------------------------------
class Cube(Function):
    """z = a^3;  dz/da = 3 a^2. The public pattern for a custom differentiable op."""

    @staticmethod
    def forward(ctx, a):
        ctx.save_for_backward(a)
        return a * a * a

    @staticmethod
    def backward(ctx, grad):
        (a,) = ctx.saved
        return grad * 3 * a * a


class ScaledAdd(Function):
    """z = a + alpha * b with a non-tensor argument;  dz/da = 1, dz/db = alpha."""

    @staticmethod
    def forward(ctx, a, b, alpha=1.0):
        ctx.alpha = alpha
        return a + alpha * b

    @staticmethod
    def backward(ctx, grad):
        return grad, grad * ctx.alpha


def test_custom_function(device):
    x = rand(device, 3, 2)
    y = Cube.apply(x)
    assert isinstance(y.grad_fn, Cube)
    np.testing.assert_allclose(y.numpy(), x.numpy() ** 3)
    assert mt.gradcheck(Cube.apply, [x])
    assert mt.gradcheck(
        lambda a, b: ScaledAdd.apply(a, b, alpha=-2.5), [rand(device, 3, 1, seed=1), rand(device, 4, seed=2)]
    )


def test_custom_function_under_no_grad(device):
    x = rand(device, 3)
    with mt.no_grad():
        y = Cube.apply(x)
    assert y.grad_fn is None and not y.requires_grad


def test_integer_array_indexing_adds_up_repeated_and_negative_indices(device):
    """x[[0, 0, 4, -1]]: row 0 is read twice and row 4 twice (as 4 and as -1)."""
    x = mt.zeros(5, 3, requires_grad=True, device=device)
    x[mt.tensor([0, 0, 4, -1], device=device)].sum().backward()
    np.testing.assert_array_equal(x.grad.numpy()[:, 0], [2, 0, 0, 0, 2])
