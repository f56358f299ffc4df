"""In-place updates: ``x -= lr * x.grad`` as D2L writes it, the dtype rule, and backward's
refusal of a gradient computed from values that were changed in place after their use
(``autograd.WriteLog``, PyTorch's version counters)."""

import numpy as np
import pytest

import minitensor as mt
from minitensor.core import autograd


# -- the operators: in place outside the graph, a new tensor in it ---------------------------------
def test_d2l_sgd_updates_the_parameters_in_place():
    """D2L 3.4's ``sgd`` trains D2L 3.4's linear regression: ``param -= lr * param.grad /
    batch_size`` changes the parameter itself and ``param.grad.zero_()`` finds its gradient."""

    def sgd(params, lr, batch_size):  # D2L 3.4, word for word
        with mt.no_grad():
            for param in params:
                param -= lr * param.grad / batch_size
                param.grad.zero_()

    mt.manual_seed(0)
    true_w, true_b = mt.tensor([2, -3.4]), 4.2
    X = mt.normal(0, 1, (1000, 2))
    y = (X @ true_w + true_b).reshape(-1, 1)
    w = mt.normal(0, 0.01, size=(2, 1), requires_grad=True)
    b = mt.zeros(1, requires_grad=True)
    w_before = w
    for _ in range(3):
        for i in range(0, 1000, 10):
            loss = ((X[i : i + 10] @ w + b - y[i : i + 10]) ** 2 / 2).sum()
            loss.backward()
            sgd([w, b], 0.03, 10)
    assert w is w_before and w.requires_grad and w.is_leaf
    np.testing.assert_allclose(w.numpy().ravel(), [2, -3.4], atol=2e-3)
    np.testing.assert_allclose(b.item(), 4.2, atol=2e-3)


def test_augmented_assignment_keeps_the_tensor():
    """D2L 2.1's "saving memory": ``X += Y`` keeps X's identity and its memory."""
    X, Y = mt.ones(3, 4), mt.arange(12).reshape(3, 4).float()
    before, array = id(X), X.data
    X += Y
    X -= 1
    X *= 2
    X /= 4
    assert id(X) == before and X.data is array
    np.testing.assert_allclose(X.numpy(), (1 + Y.numpy() - 1) * 2 / 4)


def test_underscore_methods():
    x = mt.tensor([4.0, 6.0])
    assert x.sub_(1).add_(mt.tensor([1.0, 1.0]), alpha=2).mul_(2).div_(4) is x
    np.testing.assert_allclose(x.numpy(), [2.5, 3.5])
    x.sub_(mt.tensor([0.5, 0.5]), alpha=2)
    np.testing.assert_allclose(x.numpy(), [1.5, 2.5])


def test_same_as_pytorch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((2, 3)).astype(np.float32), rng.standard_normal(3).astype(np.float32)
    x, tx = mt.tensor(a), torch.tensor(a)
    for op, value in [("__iadd__", b), ("__isub__", 0.5), ("__imul__", b), ("__itruediv__", 3.0)]:
        x = getattr(x, op)(mt.tensor(value) if isinstance(value, np.ndarray) else value)
        tx = getattr(tx, op)(torch.tensor(value) if isinstance(value, np.ndarray) else value)
    np.testing.assert_allclose(x.numpy(), tx.numpy(), rtol=1e-6)
    i, ti = mt.tensor([1, 2, 3]), torch.tensor([1, 2, 3])
    i += 2
    ti += 2
    i *= mt.tensor([2, 2, 2])
    ti *= torch.tensor([2, 2, 2])
    assert i.dtype == mt.int64 and i.tolist() == ti.tolist()


def test_a_result_that_does_not_fit_the_dtype_is_refused():
    i = mt.tensor([1, 2])
    for update in (lambda: i.__iadd__(0.5), lambda: i.__itruediv__(2), lambda: i.mul_(2.5)):
        with pytest.raises(mt.DTypeError, match=r"int64, shape \(2,\)\) cannot hold in place"):
            update()
    with pytest.raises(mt.DTypeError, match="bool"):
        mask = mt.tensor([True, False])
        mask += 1
    f = mt.tensor([1.0, 2.0])
    f += mt.tensor([1, 1])  # integers into floats: fine, as in PyTorch
    assert f.dtype == mt.float32 and f.tolist() == [2.0, 3.0]
    assert i.tolist() == [1, 2]  # the refused updates changed nothing


def test_shape_and_device_errors_name_the_update():
    x = mt.zeros(2, 3)
    with pytest.raises(TypeError, match=r"add_: takes a tensor or a number, not a list"):
        x.add_([1.0, 2.0, 3.0], alpha=2)
    with pytest.raises(TypeError, match=r"\+=: takes a tensor or a number, not a list"):
        x += [1.0, 2.0, 3.0]
    with pytest.raises(mt.ShapeError, match=r"\+=: a value of shape \(5,\)"):
        x += mt.ones(5)
    with pytest.raises(mt.ShapeError, match=r"__setitem__: values of shape \(5,\)"):
        x[0] = mt.ones(5)
    with pytest.raises(mt.ShapeError, match=r"copy_: values of shape \(4,\)"):
        x.copy_(mt.ones(4))
    with pytest.raises(mt.DeviceError, match="add_"):
        x.add_(mt.ones(3, device="strict"))


def test_in_the_graph():
    """A leaf that requires grad is refused, as in PyTorch; a non-leaf gets a new tensor (the
    name moves to ``h + 1``) and the gradient flows through it."""
    w = mt.tensor([1.0, 2.0], requires_grad=True)
    with pytest.raises(mt.GraphError, match=r"\+=: in-place update of a leaf tensor that requires grad"):
        w += 1
    h = w * 3
    old = h
    h += w
    assert h is not old and old.tolist() == [3.0, 6.0]
    h.sum().backward()
    assert w.grad.tolist() == [4.0, 4.0]
    acc = mt.zeros(2)
    acc += w * 2  # a constant taking a value that requires grad: in the graph too
    assert acc.requires_grad


# -- backward refuses what an in-place change would make wrong ---------------------------------------
def _write(how, x):
    with mt.no_grad():
        if how == "mul_":
            x.mul_(5)
        elif how == "+=":
            x += 1
        elif how == "setitem":
            x[0] = 10.0
        elif how == "copy_":
            x.copy_(mt.full(x.shape, 7.0))
        elif how == "detach":
            x.detach().add_(1)
        elif how == "view":
            v = x.reshape(-1)
            v[0] = 10.0
        elif how == "zero_":
            x.zero_()


@pytest.mark.parametrize("how", ["mul_", "+=", "setitem", "copy_", "detach", "view", "zero_"])
@pytest.mark.parametrize("which", ["constant", "leaf"])
def test_a_change_after_use_is_refused(how, which):
    """``c = a * x`` saved x (and a) for its backward; changing either before ``backward()``
    would give the gradient of other values without a sound (PyTorch raises here too)."""
    a = mt.tensor([1.0, 2.0, 3.0], requires_grad=True)
    x = mt.tensor([1.0, 1.0, 1.0])
    c = a * x
    _write(how, x if which == "constant" else a)
    with pytest.raises(mt.GraphError, match=r"an input of mul \(shape \(3,\), float32\) was changed in place"):
        c.sum().backward()


def test_a_change_to_what_backward_does_not_read_is_fine():
    """``h - running_mean``, the buffer updated before backward: subtraction's backward reads
    no input (``Function.reads_inputs``), so PyTorch runs it, and so does minitensor."""
    w = mt.tensor([[1.0]], requires_grad=True)
    running_mean = mt.zeros(1)
    h = mt.ones(2, 1) @ w
    out = (h - running_mean) + running_mean
    with mt.no_grad():
        running_mean.mul_(0.9).add_(0.1 * h.mean(0))
    out.sum().backward()
    assert w.grad.tolist() == [[2.0]]


def test_flip_is_a_copy():
    """As PyTorch's: a write into the flipped tensor does not reach the original."""
    x = mt.tensor([1.0, 2.0, 3.0])
    y = x.flip(0)
    y += 10
    assert x.tolist() == [1.0, 2.0, 3.0] and y.tolist() == [13.0, 12.0, 11.0]


def test_a_change_before_use_or_after_backward_is_fine():
    a = mt.tensor([1.0, 2.0], requires_grad=True)
    x = mt.tensor([1.0, 1.0])
    x.mul_(3)  # before the op: its forward saw the new values
    c = (a * x).sum()
    c.backward(retain_graph=True)
    with mt.no_grad():
        a += 1
    assert a.grad.tolist() == [3.0, 3.0]
    d = (a * a).sum()  # a new graph, made after the write
    d.backward()
    assert a.grad.tolist() == [3.0 + 4.0, 3.0 + 6.0]


@pytest.mark.parametrize(
    "make",
    [
        lambda params: mt.optim.SGD(params, lr=0.1),
        lambda params: mt.optim.Adam(params, lr=0.1),  # fused: a kernel writes the arrays directly
        lambda params: mt.optim.Adam(params, lr=0.1, fused=False),
    ],
    ids=["SGD", "Adam", "Adam-unfused"],
)
def test_a_stray_optimiser_step_between_forward_and_backward_is_refused(make):
    layer = mt.nn.Linear(3, 2)
    optimizer = make(layer.parameters())
    x = mt.ones(4, 3)
    layer(x).sum().backward()
    loss = layer(x).sum()
    optimizer.step()  # the weights the forward used are gone
    with pytest.raises(mt.GraphError, match="changed in place"):
        loss.backward()


@pytest.mark.parametrize("optimizer", [mt.optim.SGD, mt.optim.Adam, mt.optim.AdamW])
def test_a_training_loop_is_never_refused(optimizer):
    """Forward, backward, step, with clipping: every write comes after the backward it follows."""
    mt.manual_seed(0)
    model = mt.nn.Sequential(mt.nn.Linear(4, 8), mt.nn.ReLU(), mt.nn.Linear(8, 1))
    opt = optimizer(model.parameters(), lr=0.01)
    x, y = mt.randn(16, 4), mt.randn(16, 1)
    losses = []
    for _ in range(20):
        loss = mt.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        mt.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


def test_the_write_log_is_bounded():
    log = autograd.WriteLog()
    tensors = [mt.zeros(1) for _ in range(log.CAPACITY + 10)]
    for t in tensors:
        log.note(t)
    assert len(log.stamps) == log.CAPACITY
    assert id(tensors[0].data) not in log.stamps and id(tensors[-1].data) in log.stamps  # the oldest go first


@pytest.mark.parametrize("device", ["cpu", "strict"])
def test_a_write_through_any_view_counts(device):
    """A view's writes stamp the memory's owner, which every view of it shares."""
    x = mt.zeros(2, 3, device=device)
    views = [x, x.detach(), x.reshape(6), x[0], x.transpose(0, 1)]
    owners = {id(x._backend.memory_owner(v.data)) for v in views}
    assert len(owners) == 1


# -- .grad -----------------------------------------------------------------------------------------
def test_grad_must_fit_its_tensor():
    """An optimiser's fused kernel walks a gradient beside its parameter: one of another shape
    would send it past the end of the array (PyTorch refuses such an assignment too)."""
    p = mt.nn.Parameter(mt.ones(4))
    with pytest.raises(mt.ShapeError, match=r"grad: a gradient \(float32, shape \(\), on 'cpu'\) for a tensor"):
        p.grad = mt.tensor(5.0)
    with pytest.raises(mt.DTypeError, match="float64"):
        p.grad = mt.ones(4, dtype=mt.float64)
    with pytest.raises(mt.DeviceError, match="strict"):
        p.grad = mt.ones(4, device="strict")
    with pytest.raises(TypeError, match="Tensor or None, not ndarray"):
        p.grad = np.ones(4, dtype=np.float32)
    p.grad = mt.full((4,), 2.0)
    p.grad = None
    assert p.grad is None


def test_a_second_backward_adds_into_the_same_grad():
    """As in PyTorch: whoever holds ``a.grad`` sees the sum."""
    a = mt.tensor([1.0, 2.0], requires_grad=True)
    (a * a).sum().backward()
    g = a.grad
    (a * 3).sum().backward()
    assert a.grad is g and g.tolist() == [5.0, 7.0]
