"""Batch normalisation as modules (``nn.BatchNorm1d``, ``BatchNorm2d`` and their lazy forms): the
running statistics, train and eval modes, the state_dict, PyTorch's numbers where PyTorch is at
hand, and the errors. The op's gradients are in test_gradients.py."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from minitensor.errors import DeviceError, ShapeError

import minitensor as mt


def test_d2l_11_7_2_layer_norm_against_batch_norm():
    """D2L 11.7.2's cell: layer norm normalises each example, batch norm each feature."""
    X = mt.tensor([[1, 2], [2, 3]], dtype=mt.float32)
    np.testing.assert_allclose(mt.nn.LayerNorm(2)(X).numpy(), [[-1, 1], [-1, 1]], atol=1e-4)
    np.testing.assert_allclose(mt.nn.LazyBatchNorm1d()(X).numpy(), [[-1, -1], [1, 1]], atol=1e-4)


def test_running_statistics_follow_the_formula_and_eval_uses_them():
    rng = np.random.default_rng(0)
    bn = mt.nn.BatchNorm1d(3, momentum=0.2).double()
    mean, var = np.zeros(3), np.ones(3)
    for step in range(3):
        x = rng.normal(2.0, 3.0, (5, 3, 4))
        y = bn(mt.tensor(x)).numpy()
        mu, v = x.mean((0, 2)), x.var((0, 2))
        np.testing.assert_allclose(y, (x - mu[:, None]) / np.sqrt(v[:, None] + 1e-5), rtol=1e-10)
        mean, var = 0.8 * mean + 0.2 * mu, 0.8 * var + 0.2 * x.var((0, 2), ddof=1)  # the unbiased variance
        np.testing.assert_allclose(bn.running_mean.numpy(), mean, rtol=1e-12)
        np.testing.assert_allclose(bn.running_var.numpy(), var, rtol=1e-12)
        assert int(bn.num_batches_tracked.item()) == step + 1
    bn.eval()
    x = rng.normal(size=(1, 3, 2))  # one example: fine outside training
    np.testing.assert_allclose(bn(mt.tensor(x)).numpy(), (x - mean[:, None]) / np.sqrt(var[:, None] + 1e-5))
    assert int(bn.num_batches_tracked.item()) == 3  # eval changes nothing


def test_on_every_device_the_statistics_stay_there(device):
    """The running statistics are updated in place on the input's device (no host array slips in,
    no wait for the device: ``num_batches_tracked`` is counted there too)."""
    from helpers import array_type

    rng = np.random.default_rng(3)
    here, cpu = mt.nn.BatchNorm1d(3).double().to(device), mt.nn.BatchNorm1d(3).double()
    for _ in range(2):
        x = rng.normal(size=(4, 3, 2))
        y = here(mt.tensor(x, device=device, requires_grad=True))
        y.sum().backward()
        np.testing.assert_allclose(y.numpy(), cpu(mt.tensor(x)).numpy(), rtol=1e-12)
    for name, value in here.state_dict().items():
        assert isinstance(value.data, array_type(device)), name
        np.testing.assert_allclose(value.numpy(), cpu.state_dict()[name].numpy(), rtol=1e-12)
    assert isinstance(here.weight.grad.data, array_type(device))


def test_momentum_none_is_the_plain_average_and_no_tracking_uses_the_batch():
    rng = np.random.default_rng(1)
    xs = [rng.normal(size=(4, 2)) for _ in range(3)]
    bn = mt.nn.BatchNorm1d(2, momentum=None).double()
    for x in xs:
        bn(mt.tensor(x))
    np.testing.assert_allclose(bn.running_mean.numpy(), np.mean([x.mean(0) for x in xs], axis=0), rtol=1e-12)
    free = mt.nn.BatchNorm1d(2, affine=False, track_running_stats=False).double().eval()
    assert free.running_mean is None and list(free.state_dict()) == []
    x = xs[0]
    np.testing.assert_allclose(free(mt.tensor(x)).numpy(), (x - x.mean(0)) / np.sqrt(x.var(0) + 1e-5))


def test_state_dict_names_and_loading_into_a_lazy_layer():
    bn = mt.nn.BatchNorm2d(3)
    bn(mt.randn(2, 3, 4, 4))
    state = bn.state_dict()
    assert list(state) == ["weight", "bias", "running_mean", "running_var", "num_batches_tracked"]
    assert state["num_batches_tracked"].dtype == mt.int64
    assert mt.nn.BatchNorm2d(3).to(mt.float64).num_batches_tracked.dtype == mt.int64  # (integers keep theirs)
    lazy = mt.nn.LazyBatchNorm2d()
    assert lazy.num_features is None
    lazy.load_state_dict(state)
    assert lazy.num_features == 3
    for name, value in state.items():
        np.testing.assert_array_equal(lazy.state_dict()[name].numpy(), value.numpy())
    x = mt.randn(2, 3, 4, 4)
    np.testing.assert_array_equal(lazy.eval()(x).numpy(), bn.eval()(x).numpy())


@pytest.mark.parametrize("make", [mt.nn.BatchNorm1d, lambda **kw: mt.nn.LazyBatchNorm1d(**kw)], ids=["eager", "lazy"])
def test_bias_false_keeps_gamma_alone(make):
    bn = make(**({"num_features": 3} if make is mt.nn.BatchNorm1d else {}), bias=False)
    x = mt.randn(4, 3) * 5 + 2
    y = bn(x)
    assert bn.bias is None and list(bn.state_dict()) == ["weight", "running_mean", "running_var", "num_batches_tracked"]
    np.testing.assert_allclose(y.numpy().mean(0), 0, atol=1e-5)  # no beta to shift it


def test_the_lazy_layer_takes_its_width_and_device_dtype_from_before_the_first_call():
    lazy = mt.nn.LazyBatchNorm1d().double()
    opt = mt.optim.SGD(lazy.parameters(), lr=0.1)  # made before the first call: still holds them after
    y = lazy(mt.randn(4, 5, dtype=mt.float64))
    assert lazy.num_features == 5 and lazy.weight.dtype == mt.float64 and lazy.running_var.dtype == mt.float64
    (y * mt.arange(5, dtype=mt.float64)).sum().backward()
    opt.step()
    assert lazy.bias.numpy().tolist() == pytest.approx([-0.0, -0.4, -0.8, -1.2, -1.6])
    assert "LazyBatchNorm1d(5, eps=1e-05, momentum=0.1" in repr(lazy)


@settings(max_examples=40, deadline=None)
@given(
    batch=st.integers(2, 5),
    channels=st.integers(1, 4),
    length=st.sampled_from([None, 1, 3]),
    seed=st.integers(0, 2**16),
)
def test_each_channel_is_normalised_and_its_input_gradient_sums_to_zero(batch, channels, length, seed):
    """Whatever the shape: each channel's output has mean 0 and variance 1 over the batch, and
    since shifting a channel's inputs changes nothing, dL/dx sums to 0 over each channel."""
    rng = np.random.default_rng(seed)
    shape = (batch, channels) if length is None else (batch, channels, length)
    x = mt.tensor(rng.normal(1.0, 2.0, shape), requires_grad=True)
    y = mt.nn.BatchNorm1d(channels).double()(x)
    axes = (0,) if length is None else (0, 2)
    values = y.numpy()
    np.testing.assert_allclose(values.mean(axes), 0, atol=1e-9)
    spread = x.numpy().var(axes)
    np.testing.assert_allclose(values.var(axes), spread / (spread + 1e-5), rtol=1e-9)
    (y * mt.tensor(rng.normal(size=shape))).sum().backward()
    np.testing.assert_allclose(x.grad.numpy().sum(axes), 0, atol=1e-9)


def test_in_bfloat16_the_statistics_are_taken_in_float32():
    x = mt.randn(8, 3) * 100 + 1000
    y = mt.nn.BatchNorm1d(3)(x.to(mt.bfloat16))
    assert y.dtype == mt.bfloat16
    np.testing.assert_allclose(y.float().numpy(), mt.nn.BatchNorm1d(3)(x.to(mt.bfloat16).float()).numpy(), atol=0.02)


def test_against_pytorch_over_training_steps_and_in_eval():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(2)
    ours, theirs = mt.nn.BatchNorm1d(4, momentum=0.3).double(), torch.nn.BatchNorm1d(4, momentum=0.3).double()
    with torch.no_grad():
        theirs.weight.copy_(torch.tensor(rng.normal(size=4)))
    ours.weight.data[...] = theirs.weight.detach().numpy()
    for _ in range(3):
        x = rng.normal(size=(6, 4, 3))
        g = rng.normal(size=(6, 4, 3))
        a, t = mt.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
        (ours(a) * mt.tensor(g)).sum().backward()
        (theirs(t) * torch.tensor(g)).sum().backward()
        np.testing.assert_allclose(a.grad.numpy(), t.grad.numpy(), rtol=1e-10, atol=1e-12)
    for name, value in theirs.state_dict().items():
        np.testing.assert_allclose(ours.state_dict()[name].numpy(), value.numpy(), rtol=1e-12)
    for ours_p, theirs_p in zip(ours.parameters(), theirs.parameters()):
        np.testing.assert_allclose(ours_p.grad.numpy(), theirs_p.grad.numpy(), rtol=1e-10)
    x = rng.normal(size=(2, 4, 3))
    np.testing.assert_allclose(ours.eval()(mt.tensor(x)).numpy(), theirs.eval()(torch.tensor(x)).detach().numpy())


@pytest.mark.parametrize(
    "make, x, error, words",
    [
        (
            lambda: mt.nn.BatchNorm1d(3),
            mt.randn(2, 3, 4, 5),
            ShapeError,
            "BatchNorm1d: expected (batch_size, num_features)",
        ),
        (
            lambda: mt.nn.BatchNorm2d(3),
            mt.randn(2, 3),
            ShapeError,
            "BatchNorm2d: expected (batch_size, num_features, height",
        ),
        (
            lambda: mt.nn.BatchNorm1d(3),
            mt.randn(2, 4),
            ShapeError,
            "has 4 channels (axis 1); the layer has num_features=3",
        ),
        (
            lambda: mt.nn.BatchNorm1d(3),
            mt.randn(1, 3),
            ValueError,
            "statistics (training mode, or no running statistics) need more than 1 value per channel",
        ),
        (
            lambda: mt.nn.BatchNorm1d(3),
            mt.randn(2, 3, dtype=mt.float64),
            mt.DTypeError,
            "batch_norm: weight is float32",
        ),
        (
            lambda: mt.nn.BatchNorm1d(3).eval(),
            mt.randn(2, 3, dtype=mt.float64),
            mt.DTypeError,
            "the layer with .to(mt.float64)",
        ),
        (lambda: mt.nn.BatchNorm1d(3), [[1.0, 2.0, 3.0]], TypeError, "BatchNorm1d: expected a Tensor, got list"),
        (lambda: mt.nn.BatchNorm1d(0), None, ValueError, "num_features must be at least 1, got 0"),
        (
            lambda: mt.nn.BatchNorm1d(3, track_running_stats=False).eval(),
            mt.randn(1, 3),
            ValueError,
            "got input of shape (1, 3)",
        ),
        (lambda: mt.nn.BatchNorm1d(True), None, TypeError, "num_features must be a whole number, got True"),
        (lambda: mt.nn.BatchNorm1d(3, eps=-1), None, ValueError, "BatchNorm1d: eps must be a finite number >= 0"),
        (lambda: mt.nn.BatchNorm1d(3, momentum=1.5), None, ValueError, "momentum must be a number in [0, 1] or None"),
    ],
)
def test_errors_name_the_layer_and_the_values(make, x, error, words):
    with pytest.raises(error) as raised:
        make()(x)
    assert words in str(raised.value)


def test_a_refused_batch_changes_nothing():
    bn = mt.nn.BatchNorm1d(3)
    bn(mt.randn(4, 3))
    before = {name: value.numpy().copy() for name, value in bn.state_dict().items()}
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        bn(mt.randn(1, 3))
    for name, value in bn.state_dict().items():
        np.testing.assert_array_equal(value.numpy(), before[name], err_msg=name)


def test_the_functional_form_checks_its_statistics():
    x = mt.randn(4, 3)
    with pytest.raises(ShapeError, match=r"batch_norm: running_mean has shape \(2,\), expected \(3,\)"):
        mt.batch_norm(x, mt.zeros(2), mt.ones(3))
    with pytest.raises(ValueError, match="outside training it normalises with running_mean and running_var"):
        mt.batch_norm(x, None, None, training=False)
    with pytest.raises(ShapeError, match=r"batch_norm: input of shape \(3,\)"):
        mt.batch_norm(mt.randn(3), None, None, training=True)
    with pytest.raises(DeviceError, match="batch_norm: running_var is on 'strict', the input on 'cpu'"):
        mt.batch_norm(x, mt.zeros(3), mt.ones(3, device="strict"))
