"""GELU, exact (the default, as in PyTorch) and in the tanh approximation.

gelu(x) = x Phi(x) = x/2 (1 + erf(x / sqrt 2)); its erf comes from ``minitensor/core/kernels/gelu.py``
(numba on the CPU, CUDA C++ on a GPU, array arithmetic on other backends). The oracle is
``math.erf``, evaluated one number at a time in float64.
"""

import math

import minitensor.nn.functional as F
import numpy as np
import pytest
from helpers import check, rand
from minitensor.kernels import gelu as kernels

import minitensor as mt
from minitensor import nn

# 0, tiny, moderate, the tails where Phi underflows, and beyond float32's range of interest
VALUES = np.concatenate(
    [
        np.linspace(-10, 10, 401),
        [0.0, -0.0, 1e-300, -1e-300, 1e-8, -1e-8, 3.7, -3.7, 25.0, -25.0, 38.0, -38.0, 1e3, -1e3, 1e12, -1e12],
    ]
)


def gelu_math(x):
    return x * 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


def gelu_grad_math(x):
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0))) + x * math.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)


def gelu_tanh_numpy(a):
    """The formula minitensor's gelu computed before it was exact (now approximate="tanh")."""
    return 0.5 * a * (1 + np.tanh(np.sqrt(2 / np.pi) * (a + 0.044715 * a**3)))


REFERENCE = np.array([gelu_math(v) for v in VALUES])
REFERENCE_GRAD = np.array([gelu_grad_math(v) for v in VALUES])


# -- values ---------------------------------------------------------------------------------------
def test_float64_matches_math_erf(device):
    x = mt.tensor(VALUES, dtype=mt.float64, device=device)
    np.testing.assert_allclose(mt.gelu(x).numpy(), REFERENCE, rtol=1e-12, atol=1e-12)
    assert mt.gelu(mt.tensor(0.0, dtype=mt.float64, device=device)).item() == 0.0


def test_float64_gradient_matches_the_formula(device):
    x = mt.tensor(VALUES, dtype=mt.float64, device=device, requires_grad=True)
    mt.gelu(x).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), REFERENCE_GRAD, rtol=1e-12, atol=1e-12)


def test_float32_is_close_and_stays_float32(device):
    x = mt.tensor(VALUES, dtype=mt.float32, device=device, requires_grad=True)
    y = mt.gelu(x)
    assert y.dtype == mt.float32
    x32 = VALUES.astype(np.float32).astype(np.float64)  # the float32 inputs, exactly
    ref = np.array([gelu_math(v) for v in x32])
    np.testing.assert_allclose(y.numpy(), ref, rtol=2e-6, atol=1e-7)
    y.sum().backward()
    assert x.grad.dtype == mt.float32
    np.testing.assert_allclose(x.grad.numpy(), [gelu_grad_math(v) for v in x32], rtol=2e-6, atol=1e-6)


def test_the_left_tail_is_not_rounded_to_zero():
    # 1 + erf(-10/sqrt 2) is 0 in float64, but Phi(-10) = 7.6e-24: erfc keeps it
    y = mt.gelu(mt.tensor([-10.0], dtype=mt.float64)).item()
    assert y == pytest.approx(-10 * 0.5 * math.erfc(10 / math.sqrt(2)), rel=1e-13) and y < 0


def test_infinities_and_nan_as_in_pytorch():
    x = mt.tensor([-np.inf, np.inf, np.nan], dtype=mt.float64, requires_grad=True)
    y = mt.gelu(x)
    np.testing.assert_array_equal(y.numpy(), [np.nan, np.inf, np.nan])  # -inf * Phi(-inf) = -inf * 0
    y.sum().backward()
    assert np.isnan(x.grad.numpy()).all()


def test_tanh_form_is_the_former_gelu(device):
    a = np.array([[-3.0, -0.5, 0.0, 0.25, 2.0, 6.0]])
    x = mt.tensor(a, dtype=mt.float64, device=device)
    np.testing.assert_allclose(mt.gelu(x, approximate="tanh").numpy(), gelu_tanh_numpy(a), rtol=1e-15)
    # the two forms are close but not equal
    exact = mt.gelu(x).numpy()
    assert 0 < np.abs(exact - gelu_tanh_numpy(a)).max() < 5e-4


def test_every_spelling_takes_approximate(device):
    x = rand(device, 3, 4, low=-4, high=4, requires_grad=False)
    exact, approx = mt.gelu(x).numpy(), mt.gelu(x, approximate="tanh").numpy()
    for fn in (F.gelu, nn.GELU(), x.__class__.gelu):
        np.testing.assert_array_equal(fn(x).numpy(), exact)
    np.testing.assert_array_equal(x.gelu(approximate="tanh").numpy(), approx)
    np.testing.assert_array_equal(F.gelu(x, approximate="tanh").numpy(), approx)
    np.testing.assert_array_equal(nn.GELU(approximate="tanh")(x).numpy(), approx)


def test_an_unknown_form_is_a_value_error_naming_it():
    x = mt.randn(3)
    for call in (lambda: mt.gelu(x, approximate="exact"), lambda: F.gelu(x, "exact"), lambda: nn.GELU("exact")):
        with pytest.raises(ValueError, match=r"approximate must be 'none' or 'tanh', got 'exact'"):
            call()
    with pytest.raises(ValueError, match="got None"):
        mt.gelu(x, approximate=None)


def test_module_repr():
    assert repr(nn.GELU()) == "GELU(approximate='none')"
    assert repr(nn.GELU("tanh")) == "GELU(approximate='tanh')"


# -- gradients ------------------------------------------------------------------------------------
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gradcheck(device, approximate):
    check(lambda x: mt.gelu(x, approximate=approximate), rand(device, 4, 5, low=-5, high=5))
    check(lambda x: mt.gelu(x * 3, approximate=approximate).sum(axis=0), rand(device, 3, 2))


def test_gradient_of_a_non_contiguous_input():
    x = rand("cpu", 6, 4)
    check(lambda x: mt.gelu(x.transpose(0, 1)[:, ::2]), x)


# -- against PyTorch ------------------------------------------------------------------------------
@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_matches_torch(device, approximate, dtype):
    torch = pytest.importorskip("torch")
    values = VALUES[np.abs(VALUES) < 1e3]  # torch's float32 tanh form is NaN far out
    x = mt.tensor(values, dtype=getattr(mt, dtype), device=device, requires_grad=True)
    xt = torch.tensor(values, dtype=getattr(torch, dtype), requires_grad=True)
    y, yt = mt.gelu(x, approximate=approximate), torch.nn.functional.gelu(xt, approximate=approximate)
    rtol, atol = (1e-12, 1e-12) if dtype == "float64" else (2e-6, 1e-6)
    np.testing.assert_allclose(y.numpy(), yt.detach().numpy(), rtol=rtol, atol=atol)
    g = np.cos(values)  # a gradient that is not all ones
    y.backward(mt.tensor(g, dtype=getattr(mt, dtype), device=device))
    yt.backward(torch.tensor(g, dtype=getattr(torch, dtype)))
    np.testing.assert_allclose(x.grad.numpy(), xt.grad.numpy(), rtol=rtol, atol=atol)
    assert repr(nn.GELU(approximate)) == repr(torch.nn.GELU(approximate))


# -- the kernels themselves -----------------------------------------------------------------------
def test_reference_erfc_matches_math_erfc():
    x = np.concatenate([np.linspace(-8, 8, 3201), [2.4999999, 2.5, 2.5000001, -2.5, 26.0, 27.5, 1e5, -1e5]])
    ref = np.array([math.erfc(v) for v in x])
    got = kernels.reference_erfc(np, x)
    np.testing.assert_allclose(got, ref, rtol=1e-13, atol=2e-15)
    # relative accuracy in the right tail, where erfc is tiny
    tail = x > 2.5
    np.testing.assert_allclose(got[tail], ref[tail], rtol=1e-14)
    with np.errstate(over="raise", invalid="raise", divide="raise"):  # no warning, even at the ends
        special = kernels.reference_erfc(np, np.array([np.inf, -np.inf, 1e300, -1e300]))
    np.testing.assert_array_equal(special, [0.0, 2.0, 0.0, 2.0])
    assert np.isnan(kernels.reference_erfc(np, np.array([np.nan]))).all()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cpu_kernel_agrees_with_the_reference(dtype):
    x = np.linspace(-12, 12, 999).astype(dtype).reshape(27, 37)
    g = np.cos(x).astype(dtype)
    y = kernels.CpuGelu.forward(x)
    assert y.dtype == dtype and y.shape == x.shape
    rtol = 1e-14 if dtype == np.float64 else 1e-6
    np.testing.assert_allclose(y, kernels.reference_forward(np, x.astype(np.float64)), rtol=rtol, atol=rtol)
    dx = kernels.CpuGelu.backward(x, g)
    ref = kernels.reference_backward(np, x.astype(np.float64), g.astype(np.float64))
    np.testing.assert_allclose(dx, ref, rtol=rtol, atol=rtol)
    # a strided view gives the same as its contiguous copy
    np.testing.assert_array_equal(kernels.CpuGelu.forward(x.T[::2]), y.T[::2])


@pytest.mark.parametrize(
    "forward, backward, dtype",
    [
        (kernels._gelu_loop, kernels._gelu_backward_loop, np.float64),
        (kernels._gelu_loop_f32, kernels._gelu_backward_loop_f32, np.float32),
    ],
)
def test_cpu_parallel_and_serial_twins_agree(forward, backward, dtype):
    x = np.linspace(-6, 6, 1001).astype(dtype)
    y1, y2 = np.empty_like(x), np.empty_like(x)
    forward.parallel(x, y1)
    forward.serial(x, y2)
    np.testing.assert_array_equal(y1, y2)
    backward.parallel(x, np.cos(x), y1)
    backward.serial(x, np.cos(x), y2)
    np.testing.assert_array_equal(y1, y2)


def test_float32_kernel_accuracy_on_a_dense_grid():
    # erfc from Numerical Recipes' polynomial (1.2e-7) and exp_f32 (1 ulp); rounding z^2 to
    # float32 adds |z^2| * 6e-8 relative in the tail: below 2e-6 wherever |gelu| > 1e-6
    x = np.linspace(-12, 12, 60_001).astype(np.float32)
    x64 = x.astype(np.float64)
    y = kernels.CpuGelu.forward(x).astype(np.float64)
    ref = np.array([gelu_math(v) for v in x64])
    err = np.abs(y - ref)
    assert err.max() < 4e-7
    big = np.abs(ref) > 1e-6
    assert (err[big] / np.abs(ref[big])).max() < 2e-6
    dx = kernels.CpuGelu.backward(x, np.ones_like(x)).astype(np.float64)
    ref = np.array([gelu_grad_math(v) for v in x64])
    assert np.abs(dx - ref).max() < 2e-7


def test_float32_kernel_special_values_as_in_pytorch():
    x = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, 1e30, -1e30, 3.4e38, -3.4e38], np.float32)
    y = kernels.CpuGelu.forward(x)
    # gelu(-inf) = -inf * Phi(-inf) = -inf * 0 is NaN, as in PyTorch
    expected = np.array([np.inf, np.nan, np.nan, 0.0, 0.0, 1e30, 0.0, 3.4e38, 0.0], np.float32)
    np.testing.assert_array_equal(y, expected)
    assert y.dtype == np.float32 and np.signbit(y[6])  # gelu(-1e30) = -1e30 * Phi(-1e30) = -0
    dx = kernels.CpuGelu.backward(x, np.ones_like(x))
    # +-inf: inf * phi(inf) = inf * 0 is NaN, as in PyTorch; large finite values: 1 and 0
    np.testing.assert_array_equal(dx, [np.nan, np.nan, np.nan, 0.5, 0.5, 1.0, 0.0, 1.0, 0.0])


def test_float16_takes_the_reference_path():
    x = mt.tensor([-1.0, 0.5, 2.0], dtype=mt.float16)
    y = mt.gelu(x)
    assert y.dtype == mt.float16
    np.testing.assert_allclose(y.numpy(), [gelu_math(v) for v in (-1.0, 0.5, 2.0)], rtol=2e-3)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_cuda_kernels_in_the_emulator(dtype):
    """The CUDA C++ kernels (``kernels/cuda/elementwise.cu``), run by the tests' CUDA emulator."""
    from cuda_emulator import EmulatedModule, available
    from minitensor.kernels.cuda import CudaKernels

    if not available():
        pytest.skip("the CUDA emulator needs a C++ compiler")
    # 2 blocks x 8 threads < 45 elements: the threads stride
    k = kernels.CudaGelu(CudaKernels(np, load_module=EmulatedModule, elementwise_threads=8, max_blocks=2))
    x = np.linspace(-9, 9, 90).astype(dtype).reshape(9, 10)[:, ::2]  # not contiguous
    g = np.sin(x).astype(dtype)
    y, dx = k.forward(x), k.backward(x, g)
    assert y.dtype == dtype and y.shape == x.shape
    rtol = 1e-14 if dtype == np.float64 else 2e-6
    np.testing.assert_allclose(y, kernels.CpuGelu.forward(x), rtol=rtol, atol=rtol)
    np.testing.assert_allclose(dx, kernels.CpuGelu.backward(x, g), rtol=rtol, atol=rtol)
    assert k.forward(np.zeros((0, 3), dtype)).shape == (0, 3)
    half = x.astype(np.float16)  # other dtypes take the reference
    np.testing.assert_allclose(k.forward(half), kernels.reference_forward(np, half), rtol=1e-3)


def test_kernels_are_chosen_by_array_library():
    assert kernels.for_backend(mt.get_backend("cpu")) is kernels.CpuGelu
    strict = kernels.for_backend(mt.get_backend("strict"))
    assert isinstance(strict, kernels.ReferenceGelu)


def test_on_the_cupy_backend_without_a_gpu(monkeypatch):
    """The CuPy backend's own code on FakeCupy (arrays that refuse host conversion)."""
    from fake_cupy import fake_cuda_backend

    from minitensor import backends

    monkeypatch.setitem(backends._BACKENDS, "cuda", fake_cuda_backend())
    x = mt.tensor(VALUES[:50], dtype=mt.float64, device="cuda", requires_grad=True)
    y = mt.gelu(x)
    assert y.device == "cuda"
    np.testing.assert_allclose(y.numpy(), REFERENCE[:50], rtol=1e-12, atol=1e-12)
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), REFERENCE_GRAD[:50], rtol=1e-12, atol=1e-12)
