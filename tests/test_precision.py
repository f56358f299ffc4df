"""``mt.set_float32_matmul_precision``: TF32 / bfloat16 tensor cores for float32 products on a GPU.

The CuPy backend sets cuBLAS's compute type for float32 through CuPy; the CuPy stand-in's
``_core._routines_linalg`` records what it is told. The CPU's results never change.
"""

import types
import warnings

import numpy as np
import pytest
from fake_cupy import FakeCupy, fake_cuda_backend
from gpu import requires_gpu

import minitensor as mt
from minitensor import backends
from minitensor.train.config import PRESETS, ConfigError, TrainConfig


@pytest.fixture(autouse=True)
def restore_precision():
    yield
    mt.set_float32_matmul_precision("highest")


@pytest.fixture
def cupy(monkeypatch):
    """ "cuda" on the CuPy stand-in, whose compute-type and math-mode setters record what they are told."""
    cupy = FakeCupy()
    monkeypatch.setitem(backends._BACKENDS, "cuda", fake_cuda_backend(cupy))
    return cupy


@pytest.fixture
def linalg(cupy):
    return cupy._core._routines_linalg


def test_the_default_is_pytorchs():
    assert mt.get_float32_matmul_precision() == "highest"


@pytest.mark.parametrize("precision, compute_type, math_mode", [("high", 7, 3), ("medium", 7, 3), ("highest", 1, 0)])
def test_each_precision_sets_cublas_compute_type_and_math_mode(cupy, precision, compute_type, math_mode):
    """The compute type reaches CuPy's 2-D products, the handle's math mode its batched ones
    (CUBLAS_TF32_TENSOR_OP_MATH = 3); at "medium" too, for the products minitensor leaves to
    CuPy: CuPy has no bfloat16 mode for float32 (its own products then call cuBLAS, below)."""
    mt.set_float32_matmul_precision(precision)
    assert cupy._core._routines_linalg.set == {np.dtype(np.float32): compute_type}  # float64, float16 untouched
    assert cupy.math_modes == {1: math_mode}
    assert mt.get_float32_matmul_precision() == precision


@pytest.fixture
def gemm_calls(monkeypatch):
    """cuBLAS's bfloat16 products (``cublas_gemm.launch``) run in NumPy on the stand-in, each
    call recorded as (M, N, K, batch count)."""
    from fake_cupy import launch_in_numpy
    from minitensor.backends import cublas_gemm

    calls = []

    def launch(xp, call, out):
        calls.append((call.n, call.m, call.k, call.batch_count))
        launch_in_numpy(xp, call, out)

    monkeypatch.setattr(cublas_gemm, "launch", launch)
    return calls


def test_medium_computes_minitensors_products_on_bfloat16_tensor_cores(cupy, gemm_calls):
    """Every product of a Linear layer and of a batched matmul, forward and backward, is one
    cuBLAS call at "medium" (bfloat16 inputs, float32 sums: PyTorch's "medium"), none at "high";
    float64 products never."""
    from fake_cupy import to_bfloat16

    rng = np.random.default_rng(0)
    x_, w_ = rng.standard_normal((2, 5, 16)), rng.standard_normal((8, 16))
    q_, k_ = rng.standard_normal((2, 3, 5, 16)), rng.standard_normal((2, 3, 7, 16))

    def run():
        x, w = (mt.tensor(a, dtype=mt.float32, device="cuda", requires_grad=True) for a in (x_, w_))
        q, k = (mt.tensor(a, dtype=mt.float32, device="cuda", requires_grad=True) for a in (q_, k_))
        y, s = mt.linear(x, w), q @ k.swapaxes(-1, -2)
        (y.sum() + s.sum()).backward()
        return y.numpy(), s.numpy(), w.grad.numpy(), k.grad.numpy()

    mt.set_float32_matmul_precision("high")
    exact = run()
    assert not gemm_calls
    mt.set_float32_matmul_precision("medium")
    y, s, w_grad, k_grad = run()
    assert sorted(gemm_calls) == sorted(
        [(10, 8, 16, 1), (10, 16, 8, 1), (8, 16, 10, 1), (5, 7, 16, 6), (5, 16, 7, 6), (16, 7, 5, 6)]
    )  # Linear: X W^T, G W, G^T X; scores S = Q K^T: G K, Q^T G (K^T's gradient)
    rounded = to_bfloat16(x_.astype(np.float32)).reshape(10, 16) @ to_bfloat16(w_.astype(np.float32)).T
    np.testing.assert_allclose(y.reshape(10, 8), rounded, rtol=1e-5, atol=1e-5)  # bfloat16 inputs, float32 sums
    for medium, high in zip((y, s, w_grad, k_grad), exact, strict=True):
        error = np.abs(medium - high).max() / np.abs(high).max()
        assert 1e-5 < error < 2e-2  # 8 bits of mantissa, not float32's 24
    gemm_calls.clear()
    mt.tensor(x_, device="cuda") @ mt.tensor(w_.T, device="cuda")  # float64
    assert not gemm_calls


def test_medium_on_a_gpu_before_ampere_keeps_float32(cupy, gemm_calls, monkeypatch):
    monkeypatch.setattr(backends._BACKENDS["cuda"], "_compute_capability", lambda: 75)
    mt.set_float32_matmul_precision("medium")
    a = mt.ones(4, 4, device="cuda")
    np.testing.assert_array_equal((a @ a).numpy(), 4 * np.ones((4, 4)))
    assert not gemm_calls


@pytest.mark.parametrize("precision", ["highest", "high"])
def test_autocasts_products_take_bfloat16_tensor_cores_at_any_precision(cupy, gemm_calls, monkeypatch, precision):
    """Inside ``mt.autocast`` a product's operands (and its gradient) hold bfloat16 values, which
    bfloat16 tensor cores multiply exactly: every product, forward and backward, is the cuBLAS
    call of "medium", whatever the precision set, with the CPU's numbers; before Ampere, none."""
    rng = np.random.default_rng(1)
    x_, w_ = rng.standard_normal((2, 5, 16)), rng.standard_normal((8, 16))
    q_, k_ = rng.standard_normal((2, 3, 5, 16)), rng.standard_normal((2, 3, 7, 16))

    def run(device):
        x, w, q, k = (mt.tensor(a, dtype=mt.float32, device=device, requires_grad=True) for a in (x_, w_, q_, k_))
        with mt.autocast(device):
            y, s = mt.linear(x, w), q @ k.swapaxes(-1, -2)
            (y.sum() + s.sum()).backward()
        return [t.float().numpy() for t in (y, s, x.grad, w.grad, q.grad, k.grad)]

    mt.set_float32_matmul_precision(precision)
    got = run("cuda")
    assert sorted(gemm_calls) == sorted(
        [(10, 8, 16, 1), (10, 16, 8, 1), (8, 16, 10, 1), (5, 7, 16, 6), (5, 16, 7, 6), (16, 7, 5, 6)]
    )
    for on_gpu, on_cpu in zip(got, run("cpu"), strict=True):
        np.testing.assert_allclose(on_gpu, on_cpu, rtol=2**-7, atol=1e-6)  # (sums in another order: an ulp)
    gemm_calls.clear()
    monkeypatch.setattr(backends._BACKENDS["cuda"], "_has_bfloat16_cores", None)
    monkeypatch.setattr(backends._BACKENDS["cuda"], "_compute_capability", lambda: 75)
    run("cuda")
    assert not gemm_calls


def test_a_gpu_backend_built_later_starts_at_the_precision_set_before(monkeypatch):
    mt.set_float32_matmul_precision("high")
    cupy = FakeCupy()
    monkeypatch.delitem(backends._BACKENDS, "cuda", raising=False)
    backend = backends.register_backend(fake_cuda_backend(cupy))
    try:
        assert cupy._core._routines_linalg.set == {np.dtype(np.float32): 7}
    finally:
        backends._BACKENDS.pop(backend.device, None)


def test_a_cupy_without_the_setting_warns_and_keeps_float32(monkeypatch):
    cupy = FakeCupy()
    cupy._core = types.SimpleNamespace(_routines_linalg=types.SimpleNamespace())  # no setter, no constants
    del cupy.cuda.cublas
    monkeypatch.setitem(backends._BACKENDS, "cuda", fake_cuda_backend(cupy))
    with pytest.warns(UserWarning, match=r"set_float32_matmul_precision\('high'\).*stay in float32"):
        mt.set_float32_matmul_precision("high")


def test_an_unknown_precision_is_named_with_the_choices():
    with pytest.raises(ValueError, match=r"'fast'.*'highest', 'high', 'medium'|'highest', 'high', 'medium'.*'fast'"):
        mt.set_float32_matmul_precision("fast")
    assert mt.get_float32_matmul_precision() == "highest"


def test_the_cpu_computes_the_same_bits_at_every_precision():
    rng = np.random.default_rng(0)
    a, b = (mt.tensor(rng.standard_normal((16, 64), dtype=np.float32)) for _ in range(2))
    want = (a @ b.T).numpy()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for precision in ("high", "medium"):
            mt.set_float32_matmul_precision(precision)
            np.testing.assert_array_equal((a @ b.T).numpy(), want)


def test_training_sets_the_configs_precision_and_the_gpu_recipe_asks_for_tf32(linalg, tmp_path):
    from minitensor.train.loop import set_up
    from minitensor.train.run import RunFolder

    assert PRESETS["gpt-char-gpu"]["matmul_precision"] == "high"
    assert TrainConfig().matmul_precision == "highest"
    config = TrainConfig(task="reverse", num_train=16, num_heldout=4, max_len=3, batch_size=4, epochs=1,
                         num_hiddens=8, ffn_num_hiddens=8, num_heads=2, num_blks=1, progress=False,
                         matmul_precision="high", out=str(tmp_path / "run"))  # fmt: skip
    with RunFolder(config.out) as run:
        set_up(config, run, lambda message: None, resume=False)
    assert mt.get_float32_matmul_precision() == "high" and linalg.set[np.dtype(np.float32)] == 7


def test_a_config_names_a_bad_precision():
    with pytest.raises(ConfigError, match="matmul_precision.*highest, high, medium"):
        TrainConfig.from_dict({"matmul_precision": "tf32"})


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("batch", [(), (4,)], ids=["2-D", "batched"])
def test_on_a_gpu_tf32_rounds_float32_products_and_highest_does_not(batch):
    """TF32 keeps 10 bits of mantissa: a product of length 4096 differs from float64's by
    about 1e-3 relative at "high", by about 1e-6 at "highest"; for a 2-D product (a Linear
    layer's, CuPy's compute type) and a batched one (attention's, the cuBLAS math mode). At
    "medium", cuBLAS's bfloat16 path (cublas_gemm.py), coarser still."""
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((*batch, 128, 4096)), rng.standard_normal((*batch, 4096, 128))
    exact = a @ b
    errors = {}
    for precision in ("highest", "high", "medium", "highest"):
        mt.set_float32_matmul_precision(precision)
        x, y = mt.tensor(a, dtype=mt.float32, device="cuda"), mt.tensor(b, dtype=mt.float32, device="cuda")
        errors[precision] = np.abs((x @ y).numpy() - exact).max() / np.abs(exact).max()
    assert errors["highest"] < 1e-5 and 1e-5 < errors["high"] < 1e-2, errors  # and "highest" again after "high"
    # bfloat16 keeps 8 bits (cublas_gemm.py): coarser than TF32, still a few parts in a thousand
    assert errors["high"] < errors["medium"] < 3e-2, errors
