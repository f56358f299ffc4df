"""The PyTorch that D2L's attention chapter (chapter 11 of d2l.ai, PyTorch edition) writes, as
minitensor has it: ``sin``/``cos``, ``bmm``, ``repeat_interleave``, ``Tensor.repeat``, ``sort``,
``eye``, ``normal``, ``Tensor.type``, ``Tensor.t``, ``nn.LazyLinear``, ``nn.MSELoss``, and
``X[~mask] = value`` on a tensor in the graph.

The last tests write the chapter's models once, in the book's habits, for any ``torch``-like
namespace (11.2's Nadaraya-Watson regression, 11.3's masked softmax with ``sequence_mask`` and
its two scoring functions, 11.4's Bahdanau decoder on 10.7's GRU encoder, 11.5's multi-head
attention, 11.6's sinusoidal positions, 11.7.2's layer norm against batch norm, 11.7's
Transformer, 11.8's vision Transformer): with minitensor as ``torch`` they
learn; with PyTorch, where it is installed, they give the same outputs and gradients from the
same weights.
"""

import math
import re

import numpy as np
import pytest
from d2l_chapter import chapter_of, translate
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from minitensor.errors import GraphError, ShapeError

import minitensor as mt


def _f64(device, *shape, seed=0):
    data = np.random.default_rng(seed).standard_normal(shape)
    return mt.tensor(data, dtype=mt.float64, device=device, requires_grad=True)


# -- the new ops, each against NumPy and its gradient against finite differences ---------------------
def test_sin_and_cos_with_their_gradients(device):
    x = _f64(device, 3, 4)
    np.testing.assert_allclose(mt.sin(x).numpy(), np.sin(x.numpy()))
    np.testing.assert_allclose(x.cos().numpy(), np.cos(x.numpy()))
    assert mt.gradcheck(mt.sin, [x]) and mt.gradcheck(lambda t: t.cos() * t, [x])


def test_bmm_multiplies_matrix_by_matrix_and_refuses_a_broadcast(device):
    a, b = _f64(device, 2, 3, 4, seed=1), _f64(device, 2, 4, 5, seed=2)
    np.testing.assert_allclose(mt.bmm(a, b).numpy(), a.numpy() @ b.numpy())
    assert mt.gradcheck(mt.bmm, [a, b]) and mt.gradcheck(lambda s, t: s.bmm(t), [a, b])
    for shapes in [((2, 3, 4), (1, 4, 5)), ((3, 4), (4, 5)), ((2, 3, 4), (2, 3, 5))]:
        with pytest.raises(ShapeError, match=rf"bmm: needs two 3-D tensors .*got shapes {re.escape(str(shapes[0]))}"):
            mt.bmm(mt.ones(*shapes[0], device=device), mt.ones(*shapes[1], device=device))


@pytest.mark.parametrize(
    "shape,repeats,axis",
    [((2, 3), 2, None), ((2, 3), 3, 1), ((2, 3), [1, 0, 2], 1), ((4,), [2, 2, 0, 1], 0), ((2, 3, 2), [3, 1], 0)],
)
def test_repeat_interleave_repeats_each_slice_in_place(device, shape, repeats, axis):
    x = _f64(device, *shape)
    want = np.repeat(x.numpy(), repeats, axis=axis)
    np.testing.assert_array_equal(mt.repeat_interleave(x, repeats, axis=axis).numpy(), want)
    counts = mt.tensor(repeats, device=device) if isinstance(repeats, list) else repeats
    np.testing.assert_array_equal(x.repeat_interleave(counts, dim=axis).numpy(), want)
    assert mt.gradcheck(lambda t: mt.repeat_interleave(t, repeats, axis=axis) ** 2, [x])  # noqa: B023


@pytest.mark.parametrize("shape,reps", [((3,), (2,)), ((2, 3), (2, 1)), ((2, 3), (2, 1, 3)), ((1, 2), ((4, 1),))])
def test_repeat_tiles_the_whole_tensor(device, shape, reps):
    x = _f64(device, *shape)
    counts = reps[0] if isinstance(reps[0], tuple) else reps
    np.testing.assert_array_equal(x.repeat(*reps).numpy(), np.tile(x.numpy(), counts))
    assert mt.gradcheck(lambda t: t.repeat(*reps) ** 2, [x])  # noqa: B023


@settings(max_examples=40, deadline=None)
@given(
    shape=st.lists(st.integers(0, 4), min_size=1, max_size=3),
    data=st.data(),
)
def test_repeat_and_repeat_interleave_keep_numpys_shapes(shape, data):
    a = np.arange(math.prod(shape), dtype=np.float64).reshape(shape)
    extra = data.draw(st.integers(0, 2))
    reps = data.draw(st.lists(st.integers(0, 3), min_size=len(shape) + extra, max_size=len(shape) + extra))
    np.testing.assert_array_equal(mt.tensor(a).repeat(*reps).numpy(), np.tile(a, reps))
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    counts = data.draw(st.lists(st.integers(0, 3), min_size=shape[axis], max_size=shape[axis]))
    np.testing.assert_array_equal(mt.repeat_interleave(mt.tensor(a), counts, axis).numpy(), np.repeat(a, counts, axis))


def test_repeats_that_cannot_be_are_refused_before_anything_is_allocated():
    x = mt.ones(2, 3)
    for bad, message in [
        ((2,), "a count .* for each of the 2 axes"),
        ((2, -1), "a count"),
        ((2.0, 1), "a count"),
        ((10**6, 10**6), r"would have shape \(2000000, 3000000\), .* GiB, more than the .* GiB of the device"),
    ]:
        with pytest.raises(ValueError, match=message):
            x.repeat(*bad)
    for bad, message in [
        ([1, 2], "one per slice \\(3 along axis 1\\)"),
        ([1.5, 1, 1], "must be one integer"),
        (-1, "must not be negative"),
        (10**12, "would have shape"),
    ]:
        with pytest.raises(ValueError, match=f"repeat_interleave: .*{message}"):
            x.repeat_interleave(bad, dim=1)
    with pytest.raises(ValueError, match="eye: the result would have shape"):
        mt.eye(10**7)


@settings(max_examples=40, deadline=None)
@given(shape=st.lists(st.integers(1, 5), min_size=1, max_size=3), descending=st.booleans(), data=st.data())
def test_sort_matches_numpys_stable_sort(shape, descending, data):
    a = np.random.default_rng(data.draw(st.integers(0, 99))).integers(0, 3, shape).astype(np.float64)  # ties
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    values, indices = mt.sort(mt.tensor(a), dim=axis, descending=descending)
    order = np.argsort(-a if descending else a, axis=axis, kind="stable")
    np.testing.assert_array_equal(indices.numpy(), order)
    np.testing.assert_array_equal(values.numpy(), np.take_along_axis(a, order, axis))


def test_sort_gives_each_gradient_back_to_its_position(device):
    x = _f64(device, 3, 5)
    assert mt.gradcheck(lambda t: mt.sort(t).values * mt.arange(5.0, device=device).double(), [x])
    assert mt.gradcheck(lambda t: t.sort(axis=0, descending=True).values ** 2, [x])
    assert mt.sort(mt.tensor([2.0, float("nan"), 1.0])).indices.tolist() == [2, 0, 1]  # NaN last, as PyTorch


def test_eye_and_normal_make_what_their_names_say(device):
    np.testing.assert_array_equal(mt.eye(3, device=device).numpy(), np.eye(3))
    assert mt.eye(2, 4, dtype=mt.int64).dtype == mt.int64 and mt.eye(0).shape == (0, 0)
    mt.manual_seed(0)
    noise = mt.normal(1.0, 0.5, (20000,), device=device)
    assert noise.device == device and not noise.requires_grad
    assert abs(noise.mean().item() - 1.0) < 0.02 and abs(noise.var().item() ** 0.5 - 0.5) < 0.02
    means = mt.tensor([0.0, 100.0], device=device)
    draws = mt.normal(means.reshape(2, 1), mt.tensor([[1.0] * 3], device=device))
    assert draws.shape == (2, 3) and (draws[1] > 50).all().item() and (draws[0] < 50).all().item()
    for call, message in [
        (lambda: mt.normal(0.0, 1.0), "give size"),
        (lambda: mt.normal(means, 1.0, (2,)), "size goes with numbers"),
        (lambda: mt.normal(0.0, -1.0, (2,)), "std must be >= 0"),
        (lambda: mt.normal(means, mt.tensor([1.0, float("nan")], device=device)), "std must be >= 0"),
        (lambda: mt.eye(2.5), "n and m must be integers"),
    ]:
        with pytest.raises(ValueError, match=message):
            call()
    with pytest.raises(TypeError, match="normal: the samples are floating-point numbers, not int64"):
        mt.normal(mt.tensor([1, 2], device=device), 1.0)


def test_type_converts_or_names_the_dtype():
    x = mt.tensor([0.0, 2.0], requires_grad=True)
    assert x.type(mt.bool).tolist() == [False, True] and x.type() == "minitensor.float32"
    (x.type(mt.float64) * 3).sum().backward()
    assert x.grad.tolist() == [3.0, 3.0]


# -- x[index] = value in the graph ---------------------------------------------------------------------
def test_a_write_into_a_tensor_in_the_graph_is_differentiable(device):
    def masked(t):  # D2L's sequence_mask: X[~mask] = value
        X = t * 1.0
        X[~(mt.arange(4, device=device)[None, :] < mt.tensor([1, 3, 4], device=device)[:, None])] = -1e6
        return X.softmax(-1)

    def slices(t, v):  # 11.6's P[:, :, 0::2] = sin(...), with the values in the graph too
        X = t * 2
        X[:, 0::2] = v.sin()
        return X

    def broadcast(t, v):  # one value to many positions: its gradient adds them up
        X = t.exp()
        X[[0, 2], 1:] = v
        return X

    def selected(t, v):  # one value (in the graph) where a mask of t's whole shape says
        X = t * 3
        X[mt.tensor(np.arange(12).reshape(3, 4) % 3 == 0, device=device)] = v * 2
        return X

    x = _f64(device, 3, 4)
    assert mt.gradcheck(masked, [x])
    assert mt.gradcheck(selected, [x, _f64(device, 1, seed=3)]) and mt.gradcheck(selected, [x, _f64(device, seed=4)])
    assert mt.gradcheck(slices, [x, _f64(device, 3, 2, seed=1)])
    assert mt.gradcheck(broadcast, [x, _f64(device, 1, seed=2)])
    weights = masked(x)
    np.testing.assert_array_equal((weights.numpy() > 0).sum(axis=1), [1, 3, 4])


def test_the_books_masked_softmax_never_waits_for_the_device():
    """D2L's ``X[~mask] = -1e6`` writes one value where a mask of X's whole shape says: a select,
    with nothing read back to the host (a boolean index would count the mask's True entries
    there first), forward and backward."""
    from strict_backend import count_syncs

    ch = chapter_of(mt, mt.nn, mt.nn.functional)
    scores = mt.randn(2, 3, 4, device="strict", requires_grad=True)
    with count_syncs() as log:
        weights = ch["masked_softmax"](scores, mt.tensor([2, 3], device="strict"))
        (weights * weights).sum().backward()
    assert not log.waits, log
    np.testing.assert_array_equal(weights.numpy()[0, :, 2:], 0.0)


@settings(max_examples=60, deadline=None)
@given(data=st.data(), shape=hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=4))
def test_a_write_in_the_graph_is_numpys_assignment_and_its_gradient_splits_there(data, shape):
    """Any basic index (ints, slices with any step, None, ...): the values are NumPy's, the
    gradient of sum(z * w) is w with zeros where the write went (for x) and w there (for v)."""
    index = data.draw(hnp.basic_indices(shape, allow_newaxis=True, allow_ellipsis=True))
    rng = np.random.default_rng(0)
    a, w = rng.standard_normal(shape), rng.standard_normal(shape)
    target = a[index].shape
    v = rng.standard_normal(data.draw(st.sampled_from([target, target[1:], ()])) if target else ())
    x, value = mt.tensor(a, requires_grad=True), mt.tensor(v, requires_grad=True)
    z = x * 1.0
    z[index] = value
    want = a.copy()
    want[index] = v
    np.testing.assert_array_equal(z.numpy(), want)
    (z * mt.tensor(w)).sum().backward()
    written = np.zeros(shape, bool)
    written[index] = True
    np.testing.assert_allclose(x.grad.numpy(), np.where(written, 0.0, w))
    lead = tuple(range(len(target) - v.ndim))  # the axes v was broadcast along
    np.testing.assert_allclose(value.grad.numpy(), w[index].sum(axis=lead), atol=1e-12)


def test_a_write_into_a_plain_tensor_makes_it_part_of_the_graph(device):
    v = _f64(device, 3)
    P = mt.zeros(2, 3, dtype=mt.float64, device=device)
    P[1] = v
    assert P.requires_grad and not P.is_leaf
    (P * P).sum().backward()
    np.testing.assert_allclose(v.grad.numpy(), 2 * v.numpy())


def test_ops_that_used_a_tensor_before_a_write_get_the_value_they_used(device):
    """x[...] = v rebinds x; an op that used x before the write sends its gradient to the value
    it used, write after write (as PyTorch's graph does)."""

    def f(w):
        X = w * 2
        Y = (X + 1) * 3  # uses X before both writes
        X[0] = 0.0
        Z = X * X  # between the writes (PyTorch refuses this backward: X*X saved X, written next)
        X[1:] = w[2] * 5
        return Y.sum() + Z.sum() + (X * 7).sum()

    w = _f64(device, 3)
    assert mt.gradcheck(f, [w])
    w.grad = None
    f(w).backward()
    a = w.detach().numpy()  # by hand: d/dw of 6 sum(w) + 4 (w1^2 + w2^2) + 7 * 2 * 5 w2
    np.testing.assert_allclose(w.grad.numpy(), [6.0, 6 + 8 * a[1], 6 + 8 * a[2] + 70], rtol=1e-12)
    w.grad, X = None, w * 2
    Y = X * 3
    X[0] = 0.0
    Y.sum().backward(retain_graph=True)  # the write's node never reached: the link is on x
    Y.sum().backward()  # and again, through the kept graph
    np.testing.assert_array_equal(w.grad.numpy(), [12.0, 12.0, 12.0])


def test_what_a_write_would_make_wrong_is_refused_with_a_reason():
    w = mt.randn(2, 3, requires_grad=True)
    with pytest.raises(GraphError, match="__setitem__: in-place write to a leaf tensor that requires grad"):
        w[0] = 1.0
    X = w * 2
    with pytest.raises(ShapeError, match=r"setitem: cannot write values of shape \(4,\) at 0 of shape \(2, 3\)"):
        X[0] = mt.ones(4)
    with pytest.raises(IndexError, match="setitem: .* index 5 is out of bounds for axis 0"):
        X[[0, 5]] = 1.0
    np.testing.assert_array_equal(X.numpy(), 2 * w.detach().numpy())  # (written in place: nothing, still)
    with mt.no_grad():  # outside the graph a write stays in place, views see it
        row = w[0]
        w[0, 1] = 5.0
    assert row[1].item() == 5.0


def test_a_written_tensor_keeps_what_earlier_ops_saved():
    x = mt.tensor([1.0, 2.0, 3.0], requires_grad=True)
    X = x * 1.0
    Y = X.exp()  # saves exp(X) for its backward
    X2 = Y * 1.0
    X2[0] = 100.0
    (X2 * X2).sum().backward()  # Y and exp's saved output are as they were: d/dx sum(exp(x)^2) at 1..
    np.testing.assert_allclose(x.grad.numpy(), [0.0, 2 * np.exp(4.0), 2 * np.exp(6.0)], rtol=1e-6)


# -- writes in a loop: in place where nothing else can see x's array ---------------------------------------
def test_writes_in_a_loop_cost_slices_not_copies():
    """``outputs[t] = y`` for t = 0 .. T-1 (a decoder filling its outputs, as PyTorch tutorials
    write it): nothing else holds the array of ``outputs``, so each write goes into it -- no copy
    of outputs per step, forward or backward, where out-of-place writes made T copies and kept
    all T alive until backward (T^2 time and memory)."""
    from strict_backend import count_launches

    for T in (4, 16):
        X = mt.randn(T, 8, device="strict", requires_grad=True)
        outputs = mt.zeros(T, 8, device="strict")
        with count_launches() as log:
            for t in range(T):
                outputs[t] = X[t] * 2
        assert log.by("what") == {"__mul__": T, "setitem": T}, log  # the product, its slice written
        with count_launches() as log:
            (outputs * outputs).sum().backward()
        launched = log.by("what")
        assert ".copy" not in launched and len(log) <= 5 * T + 6, log  # a few slices per step
        np.testing.assert_allclose(X.grad.numpy(), 8 * X.detach().numpy(), rtol=1e-6)


def test_a_tensor_written_into_itself_writes_the_value_it_had(device):
    """``y[:] = y`` (or ``y[0] = y`` where y broadcasts): the right-hand side is y's value before
    the write, as in NumPy and PyTorch -- not the node the write makes (which backward would then
    visit twice: "the graph through SetItem was freed")."""
    w = _f64(device, 2)
    y = w.sum(keepdims=True) * 1.0
    y[:] = y
    P = w * 1.0
    P2 = P.reshape(2, 1) * 1.0
    P2[0] = P2[1]
    (y * 3 + P2.sum()).sum().backward()
    np.testing.assert_allclose(y.numpy(), [w.detach().numpy().sum()])
    np.testing.assert_allclose(w.grad.numpy(), [3.0, 5.0])


def test_a_copied_write_lets_the_old_value_go():
    """Where a write must copy (here a detached tensor shares x's array for one step), the graph
    does not keep the old array: it lives as long as its other holders (here until the next
    step), not until backward -- T writes would otherwise keep T copies of x."""
    import weakref

    X = mt.randn(6, 5, requires_grad=True)
    outputs = mt.zeros(6, 5)
    old = []
    for t in range(6):
        last = outputs.detach()  # a second holder of outputs' array: this write copies
        old.append(weakref.ref(last.data))
        outputs[t] = X[t] * 2
    del last
    assert sum(ref() is not None for ref in old) == 0
    (outputs * outputs).sum().backward()
    np.testing.assert_allclose(X.grad.numpy(), 8 * X.detach().numpy(), rtol=1e-6)


def _holders(x):
    """Ways something other than x comes to hold x's array (or a view of it)."""
    return {
        "a view, read before": lambda: x[0],
        "a detached tensor": lambda: x.detach(),
        "an op that saved x": lambda: x * x,
        "an array of the caller": lambda: x.data,
    }


@pytest.mark.parametrize("holder", list(_holders(None)))
def test_a_write_copies_where_something_else_holds_the_array(holder):
    """A write in the graph never changes what another holder of x's array sees (as before:
    out of place), and gradients stay right either way."""
    w = _f64("cpu", 3, 2)
    x = w * 1.0
    held = _holders(x)[holder]()
    seen = np.array(held.data if isinstance(held, mt.Tensor) else held, copy=True)
    array = x.data
    x[0] = 7.0
    assert x.data is not array
    np.testing.assert_array_equal(held.data if isinstance(held, mt.Tensor) else held, seen)
    np.testing.assert_array_equal(x.numpy()[0], 7.0)
    loss = (x * x).sum() + (held.sum() if isinstance(held, mt.Tensor) and held.requires_grad else 0)
    loss.backward()
    expected = 2 * w.detach().numpy()  # x * x after the write: rows 1 and 2 reach w
    expected[0] = 0
    if holder == "a view, read before":
        expected[0] += 1
    elif holder == "an op that saved x":
        expected += 2 * w.detach().numpy()
    np.testing.assert_allclose(w.grad.numpy(), expected)


def test_a_written_tensor_whose_gradient_is_shared_leaves_the_other_alone(device):
    """Add hands one gradient array to both inputs: the write's backward zeroes its slice in a
    copy then, not in the array that y's gradient is too. Either order of creation."""
    for written_first in (True, False):
        w = _f64(device, 3, 2)
        if written_first:
            z = w * 1.0
            y = w * 2.0
        else:
            y = w * 2.0
            z = w * 1.0
        z[1] = 0.0
        y.retain_grad()
        (z + y).sum().backward()
        np.testing.assert_array_equal(y.grad.numpy(), np.ones((3, 2)))
        np.testing.assert_allclose(w.grad.numpy(), [[3, 3], [2, 2], [3, 3]])
    z = _f64(device, 3, 2) * 1.0
    z[0] = 0.0
    g = mt.ones(3, 2, dtype=mt.float64, device=device)
    z.backward(g)  # the caller's gradient: read, never written
    np.testing.assert_array_equal(g.numpy(), 1.0)


def test_a_graph_kept_for_a_second_backward_gives_the_same_gradient_twice(device):
    w = _f64(device, 4)
    outputs = mt.zeros(4, dtype=mt.float64, device=device)
    for t in range(4):
        outputs[t] = w[t] * (t + 1)
    outputs.retain_grad()
    loss = (outputs * outputs).sum()
    loss.backward(retain_graph=True)
    first = w.grad.numpy().copy()
    np.testing.assert_allclose(first, 2 * np.arange(1, 5) ** 2 * w.detach().numpy())
    np.testing.assert_allclose(outputs.grad.numpy(), 2 * outputs.detach().numpy())
    loss.backward()
    np.testing.assert_allclose(w.grad.numpy(), 2 * first)


@st.composite
def write_sequences(draw):
    """A shape, then writes at basic indices, each followed (or not) by a read of the whole tensor."""
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)))
    steps = []
    for _ in range(draw(st.integers(1, 5))):
        index = draw(hnp.basic_indices(shape, allow_ellipsis=True))
        steps.append((index, draw(st.booleans())))
    return shape, steps, draw(st.booleans())


@settings(max_examples=60, deadline=None)
@given(write_sequences())
def test_writes_and_reads_in_any_order_give_numpys_gradients(case):
    """x written at any basic indices, read in between: each read's weight w_k reaches, at every
    position, whoever wrote it last before the read (x itself where nobody did). The same whether
    the writes go in place or, with a detached copy of x's array held throughout, out of place."""
    shape, steps, hold = case
    rng = np.random.default_rng(0)
    a = rng.standard_normal(shape)
    x = mt.tensor(a, requires_grad=True)
    z = x * 1.0
    keep = z.detach() if hold else None
    owner = np.full(shape, -1)  # who wrote each position last: -1 for x, else the write's number
    values, reads, total = [], [], None
    for j, (index, read) in enumerate(steps):
        v = mt.tensor(rng.standard_normal(a[index].shape), requires_grad=True)
        z[index] = v
        values.append((index, v))
        owner[index] = j
        if read or j == len(steps) - 1:
            w_k = rng.standard_normal(shape)
            part = (z * mt.tensor(w_k)).sum()
            total = part if total is None else total + part
            reads.append((owner.copy(), w_k))
    if keep is not None:
        np.testing.assert_array_equal(keep.numpy(), a)
    total.backward()
    np.testing.assert_allclose(x.grad.numpy(), sum(np.where(o == -1, w, 0) for o, w in reads), atol=1e-12)
    for j, (index, v) in enumerate(values):
        full = sum(np.where(o == j, w, 0) for o, w in reads)
        np.testing.assert_allclose(v.grad.numpy(), full[index], atol=1e-12)


# -- layers --------------------------------------------------------------------------------------------
def test_lazy_linear_takes_its_width_from_the_first_input():
    layer = mt.nn.LazyLinear(4).to(mt.float64)
    optimizer = mt.optim.SGD(layer.parameters(), lr=0.1)  # made before the first call, as D2L's may be
    assert layer.weight.shape == (4, 0) and "in_features=None" in repr(layer)
    before = layer.weight
    Y = layer(mt.ones(2, 3, dtype=mt.float64))
    assert Y.shape == (2, 4) and Y.dtype == mt.float64 and layer.weight is before and layer.in_features == 3
    assert layer.weight.shape == (4, 3) and np.abs(layer.weight.numpy()).max() <= 1 / math.sqrt(3)
    Y.sum().backward()
    old = layer.weight.numpy().copy()
    optimizer.step()
    np.testing.assert_allclose(layer.weight.numpy(), old - 0.1 * 2)  # dY/dW = the ones, twice
    with pytest.raises(ShapeError, match="linear: input of shape"):
        layer(mt.ones(2, 5, dtype=mt.float64))  # the width is fixed now
    adam_layer = mt.nn.LazyLinear(2)
    adam = mt.optim.Adam(adam_layer.parameters(), lr=0.1)  # Adam's moments: made at its first step
    adam.step()  # nothing to do yet: no gradient
    adam_layer(mt.ones(1, 3)).sum().backward()
    adam.step()
    assert adam_layer.weight.shape == (2, 3)


def test_a_lazy_model_takes_its_shapes_from_a_saved_state_dict():
    """D2L 5.6's file I/O: a model of LazyLinear layers saved after a call, loaded into a fresh
    one that has never seen an input."""

    def mlp():
        return mt.nn.Sequential(mt.nn.LazyLinear(8), mt.nn.ReLU(), mt.nn.LazyLinear(2))

    net, X = mlp(), mt.randn(3, 5)
    Y = net(X)
    saved = {k: v.numpy() for k, v in net.state_dict().items()}
    clone = mlp()
    weight = clone[0].weight
    assert isinstance(weight, mt.nn.UninitializedParameter) and clone[0].in_features is None
    clone.load_state_dict(saved)
    assert clone[0].weight is weight and type(weight) is mt.nn.Parameter and clone[0].in_features == 5
    np.testing.assert_array_equal(clone(X).numpy(), Y.numpy())
    fresh = mlp()
    with pytest.raises(RuntimeError, match=r"shape mismatch for '0.weight': the state_dict has shape \(9, 5\)"):
        fresh.load_state_dict({**saved, "0.weight": np.zeros((9, 5), np.float32)})
    assert fresh[0].in_features is None  # nothing was changed


@pytest.mark.parametrize("reduction,want", [("none", [[1.0, 4.0]]), ("sum", 5.0), ("mean", 2.5)])
def test_mse_loss_reduces_as_asked(device, reduction, want):
    y_hat, y = mt.tensor([[1.0, 2.0]], device=device), mt.tensor([0.0, 0.0], device=device)
    np.testing.assert_allclose(mt.nn.MSELoss(reduction=reduction)(y_hat, y).numpy(), want)
    np.testing.assert_allclose(mt.nn.functional.mse_loss(y_hat, y, reduction=reduction).numpy(), want)
    loss = lambda a, b: mt.nn.functional.mse_loss(a, b, reduction=reduction)  # noqa: E731
    assert mt.gradcheck(loss, [_f64(device, 2, 3), _f64(device, 3, seed=1)])  # broadcast: y for every row
    with pytest.raises(ValueError, match="MSELoss: reduction must be"):
        mt.nn.MSELoss(reduction="avg")


# -- D2L's chapter 11, in its own habits ----------------------------------------------------------------
def nadaraya_watson(torch, nn, F, x_train, noise, w, epochs=5):
    """11.2 from its data to its training loop: the nonparametric estimate at the test points,
    the losses of the parametric one, trained from weight ``w``; every tensor of ``torch``."""
    ch = chapter_of(torch, nn, F)
    n_train = len(x_train)
    x_train, _ = torch.sort(torch.tensor(x_train))  # the book's: torch.sort(torch.rand(n_train) * 5)

    def f(x):
        return 2 * torch.sin(x) + x**0.8

    y_train = f(x_train) + torch.tensor(noise)  # the book's noise: torch.normal(0.0, 0.5, (n_train,))
    x_test = torch.arange(0, 5, 0.1)
    X_repeat = x_test.repeat_interleave(n_train).reshape((-1, n_train))
    attention_weights = F.softmax(-((X_repeat - x_train) ** 2) / 2, dim=1)
    y_hat = torch.matmul(attention_weights, y_train)
    X_tile, Y_tile = x_train.repeat((n_train, 1)), y_train.repeat((n_train, 1))
    keys = X_tile[(1 - torch.eye(n_train)).type(torch.bool)].reshape((n_train, -1))
    values = Y_tile[(1 - torch.eye(n_train)).type(torch.bool)].reshape((n_train, -1))
    net = ch["NWKernelRegression"]()
    with torch.no_grad():
        net.w.fill_(w)
    loss = nn.MSELoss(reduction="none")
    trainer = torch.optim.SGD(net.parameters(), lr=0.5)
    losses = []
    for _ in range(epochs):
        trainer.zero_grad()
        l = loss(net(x_train, keys, values), y_train)  # noqa: E741  (the book's name)
        l.sum().backward()
        trainer.step()
        losses.append(l.sum().item())
    return y_hat.numpy(), losses, net.attention_weights.detach().numpy()


def _nw_data(n_train=50, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.random(n_train) * 5).astype(np.float32), rng.normal(0.0, 0.5, n_train).astype(np.float32)


def test_nadaraya_watson_as_the_book_writes_it_learns_on_minitensor():
    x_train, noise = _nw_data()
    y_hat, losses, weights = nadaraya_watson(mt, mt.nn, mt.nn.functional, x_train, noise, w=0.5, epochs=8)
    assert y_hat.shape == (50,) and losses[-1] < 0.8 * losses[0]
    np.testing.assert_allclose(weights.sum(axis=1), 1.0, rtol=1e-5)


def _transformer(lib, nn, F, vocab=11):
    ch = chapter_of(lib, nn, F)
    encoder = ch["TransformerEncoder"](vocab, 8, 16, 2, 2, 0.0)
    decoder = ch["TransformerDecoder"](vocab, 8, 16, 2, 2, 0.0)
    return ch, encoder, decoder


def _batch(vocab=11):
    rng = np.random.default_rng(3)
    return rng.integers(0, vocab, (3, 5)), rng.integers(0, vocab, (3, 4)), np.array([5, 2, 3])


def _overfit(encoder, decoder, lr, steps):
    """The losses of ``steps`` Adam steps on one batch (the book's loop, without its padding mask)."""
    src, tgt, valid_lens = _batch()
    translate(mt, encoder, decoder, src, tgt, valid_lens)  # the lazy layers take their widths
    optimizer = mt.optim.Adam(list(encoder.parameters()) + list(decoder.parameters()), lr=lr)
    losses = []
    for _ in range(steps):
        logits = translate(mt, encoder, decoder, src, tgt, valid_lens)
        loss = mt.nn.CrossEntropyLoss()(logits.reshape(-1, 11), mt.tensor(tgt.reshape(-1)))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def test_the_books_transformer_trains_on_minitensor_and_masks_what_it_should():
    ch, encoder, decoder = _transformer(mt, mt.nn, mt.nn.functional)
    _, _, valid_lens = _batch()
    losses = _overfit(encoder, decoder, lr=0.01, steps=30)
    assert losses[-1] < 0.2 * losses[0]
    weights = encoder.attention_weights[0].numpy().reshape(3, 2, 5, 5)  # (batch, heads, queries, keys)
    for row, n in enumerate(valid_lens):
        assert np.all(weights[row, :, :, n:] < 1e-6) and np.allclose(weights[row].sum(-1), 1.0, rtol=1e-5)
    P = ch["PositionalEncoding"](8, 0.0).P.numpy()[0]
    i, j = 7, 2  # position 7, columns 2j and 2j + 1: sin and cos of i / 10000^(2j/d)
    angle = i / 10000 ** (2 * j / 8)
    np.testing.assert_allclose(P[i, 2 * j : 2 * j + 2], [math.sin(angle), math.cos(angle)], rtol=1e-5)


def _bahdanau(lib, nn, F, vocab=11):
    ch = chapter_of(lib, nn, F)
    return ch["Seq2SeqEncoder"](vocab, 6, 8, 2), ch["Seq2SeqAttentionDecoder"](vocab, 6, 8, 2)


def test_the_books_bahdanau_model_trains_on_minitensor():
    encoder, decoder = _bahdanau(mt, mt.nn, mt.nn.functional)
    _, _, valid_lens = _batch()
    losses = _overfit(encoder, decoder, lr=0.02, steps=40)
    assert losses[-1] < 0.3 * losses[0]
    weights = np.stack([w.numpy() for w in decoder._attention_weights])  # (steps, batch, 1, keys)
    for row, n in enumerate(valid_lens):
        assert np.all(weights[:, row, :, n:] < 1e-6)


@pytest.mark.parametrize("build", ["transformer", "bahdanau"])
def test_a_training_step_of_the_books_models_never_waits_for_the_device(build):
    """On the GPU stand-in, which records every read back to the host: the book's code, forward,
    loss, backward and Adam's step, reads nothing back (issue 25's rule for minitensor's own
    models, here for a learner's)."""
    from strict_backend import count_syncs

    lib = (mt, mt.nn, mt.nn.functional)
    encoder, decoder = _transformer(*lib)[1:] if build == "transformer" else _bahdanau(*lib)
    encoder.to("strict")
    decoder.to("strict")
    src, tgt, valid_lens = (mt.tensor(a, device="strict") for a in _batch())
    translate(lambda a: a, encoder, decoder, src, tgt, valid_lens)  # the lazy layers take their widths
    optimizer = mt.optim.Adam(list(encoder.parameters()) + list(decoder.parameters()), lr=0.01)
    with count_syncs() as log:
        logits = translate(lambda a: a, encoder, decoder, src, tgt, valid_lens)
        loss = mt.nn.CrossEntropyLoss()(logits.reshape(-1, 11), tgt.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert not log.waits, log


def test_the_books_layer_norm_against_batch_norm():
    """11.7.2's cell: layer norm normalises each row, batch norm (in training mode) each column,
    and keeps running averages of the columns' means and variances."""
    ln, bn, layer = chapter_of(mt, mt.nn, mt.nn.functional)["layer_norm_and_batch_norm"]()
    np.testing.assert_allclose(ln.detach().numpy(), [[-1, 1], [-1, 1]], atol=1e-4)
    np.testing.assert_allclose(bn.detach().numpy(), [[-1, -1], [1, 1]], atol=1e-4)
    np.testing.assert_allclose(layer.running_mean.numpy(), [0.15, 0.25])  # 0.9 * 0 + 0.1 * the batch's
    np.testing.assert_allclose(layer.running_var.numpy(), [0.95, 0.95])  # 0.9 * 1 + 0.1 * 0.5 (unbiased)


def _vit(lib, nn, F):
    return chapter_of(lib, nn, F)["ViT"](16, 4, 16, 32, 2, 2, 0.0, 0.0, num_classes=3)


def test_the_books_vision_transformer_learns_on_minitensor():
    """11.8's ViT, written once: 16 x 16 images, patches of 4, a <cls> token; it overfits a batch."""
    rng = np.random.default_rng(5)
    X, y = mt.tensor(rng.normal(size=(12, 1, 16, 16)).astype(np.float32)), mt.tensor(np.arange(12) % 3)
    model = _vit(mt, mt.nn, mt.nn.functional)
    assert model(X).shape == (12, 3)  # the lazy layers take their widths
    optimizer = mt.optim.Adam(model.parameters(), lr=0.01)
    losses = []
    for _ in range(30):
        loss = mt.nn.functional.cross_entropy(model(X), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.1 * losses[0]


def test_the_same_chapter_source_gives_pytorchs_numbers():
    torch = pytest.importorskip("torch")
    images = np.random.default_rng(6).normal(size=(3, 1, 16, 16)).astype(np.float32)
    vit, vit_t = _vit(mt, mt.nn, mt.nn.functional), _vit(torch, torch.nn, torch.nn.functional)
    vit(mt.tensor(images)), vit_t(torch.tensor(images))  # the lazy layers take their widths
    vit_t.load_state_dict({k: torch.tensor(v.numpy()) for k, v in vit.state_dict().items()})
    logits, logits_t = vit(mt.tensor(images)), vit_t(torch.tensor(images))
    np.testing.assert_allclose(logits.numpy(), logits_t.detach().numpy(), rtol=1e-4, atol=1e-5)
    (logits * logits).sum().backward()
    (logits_t * logits_t).sum().backward()
    grads_t = dict(vit_t.named_parameters())
    for name, p in vit.named_parameters():
        np.testing.assert_allclose(p.grad.numpy(), grads_t[name].grad.numpy(), rtol=1e-3, atol=1e-5, err_msg=name)
    for ours, theirs in zip(
        chapter_of(mt, mt.nn, mt.nn.functional)["layer_norm_and_batch_norm"](),
        chapter_of(torch, torch.nn, torch.nn.functional)["layer_norm_and_batch_norm"](),
        strict=True,
    ):
        ours, theirs = (ours, theirs) if isinstance(ours, mt.Tensor) else (ours.state_dict(), theirs.state_dict())
        if isinstance(ours, dict):
            assert list(ours) == list(theirs)
            for name in ours:
                np.testing.assert_allclose(ours[name].numpy(), theirs[name].numpy(), rtol=1e-6, err_msg=name)
        else:
            np.testing.assert_allclose(ours.detach().numpy(), theirs.detach().numpy(), rtol=1e-5, atol=1e-6)
    x_train, noise = _nw_data()
    ours = nadaraya_watson(mt, mt.nn, mt.nn.functional, x_train, noise, w=0.5)
    theirs = nadaraya_watson(torch, torch.nn, torch.nn.functional, x_train, noise, w=0.5)
    np.testing.assert_allclose(ours[0], theirs[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ours[1], theirs[1], rtol=1e-4)
    np.testing.assert_allclose(ours[2], theirs[2], rtol=1e-4, atol=1e-6)

    src, tgt, valid_lens = _batch()
    for build in (lambda *lib: _transformer(*lib)[1:], _bahdanau):
        encoder, decoder = build(mt, mt.nn, mt.nn.functional)
        encoder_t, decoder_t = build(torch, torch.nn, torch.nn.functional)
        translate(mt, encoder, decoder, src, tgt, valid_lens)  # the lazy layers take their widths
        translate(torch, encoder_t, decoder_t, src, tgt, valid_lens)
        for model, model_t in ((encoder, encoder_t), (decoder, decoder_t)):
            model_t.load_state_dict({k: torch.tensor(v.numpy()) for k, v in model.state_dict().items()})
        logits = translate(mt, encoder, decoder, src, tgt, valid_lens)
        logits_t = translate(torch, encoder_t, decoder_t, src, tgt, valid_lens)
        np.testing.assert_allclose(logits.detach().numpy(), logits_t.detach().numpy(), rtol=1e-4, atol=1e-5)
        (logits * logits).sum().backward()
        (logits_t * logits_t).sum().backward()
        for model, model_t in ((encoder, encoder_t), (decoder, decoder_t)):
            grads_t = dict(model_t.named_parameters())
            for name, p in model.named_parameters():
                np.testing.assert_allclose(
                    p.grad.numpy(), grads_t[name].grad.numpy(), rtol=1e-3, atol=1e-4, err_msg=name
                )
