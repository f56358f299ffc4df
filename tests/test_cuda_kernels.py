"""Tests for the numba CUDA softmax kernels in ``minitensor.kernels.cuda``.

Without a GPU, ``tests/gpu.py`` switches on numba's CUDA simulator before numba is imported,
and ``CudaKernels(numpy)`` runs the real kernels thread by thread in Python (shared arrays
and barriers included). Where CuPy finds a GPU, the same NumPy tests run on the device (numba
copies the arrays) and the tests marked ``gpu`` run on CuPy arrays on CuPy's stream.

Every result is compared with ``kernels/reference.py`` evaluated in float64 (the oracle) and
with the numba CPU kernels of ``kernels/cpu.py`` (the same numerics). The simulator runs
every CUDA thread as a Python thread, so the arrays are small and blocks have 32 threads;
the shapes still cover rows shorter than a block, longer and not a multiple of it, and n = 1.
"""

import subprocess
import sys
import threading
import zlib
from pathlib import Path

import numpy as np
import pytest
from gpu import GPU, SIMULATED, requires_gpu
from helpers import special_rows
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minitensor.kernels import cpu, reference
from minitensor.kernels.cuda import SIMULATOR_THREADS_PER_BLOCK, THREADS_PER_BLOCK, CudaKernels

REPO_ROOT = Path(__file__).resolve().parents[1]
DTYPES = [np.float32, np.float64]
KINDS = ["softmax", "log_softmax"]
THREADS = 32
# (rtol, atol) against the float64 oracle, as in test_kernels.py
TOLERANCE = {np.float32: (2e-5, 1e-6), np.float64: (1e-11, 1e-13)}

CPU_FORWARD = {"softmax": cpu.softmax_forward, "log_softmax": cpu.log_softmax_forward}
CPU_BACKWARD = {"softmax": cpu.softmax_backward, "log_softmax": cpu.log_softmax_backward}
REFERENCE_FORWARD = {"softmax": reference.softmax_forward, "log_softmax": reference.log_softmax_forward}
REFERENCE_BACKWARD = {"softmax": reference.softmax_backward, "log_softmax": reference.log_softmax_backward}


@pytest.fixture(autouse=True, scope="module")
def _fast_thread_switching():
    """Let the simulator's Python threads take turns every 0.1 ms instead of every 5 ms.

    A block's threads wait at each barrier while the simulator polls them; with Python's
    default switch interval most of that is waiting for the GIL (measured: 4x faster).
    """
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-4)
    yield
    sys.setswitchinterval(interval)


@pytest.fixture(autouse=True, scope="module")
def _atomic_simulated_shared_arrays():
    """Make the simulator hand every thread of a block the same shared array.

    numba's simulator allocates a block's shared array when the first of its threads asks,
    keyed by the calling line, with a check-then-set that is not atomic
    (``numba/cuda/simulator/kernelapi.py``, ``FakeCUDAShared.array``): with the short switch
    interval above, two threads of one block now and then each get an array of their own, so
    a reduction sums garbage (seen as a softmax of 0 instead of 1 for a single element). A GPU
    has no such problem; here the same lookup runs under a lock.
    """
    if not SIMULATED:
        yield
        return
    from numba.cuda.simulator import kernelapi

    original = kernelapi.FakeCUDAShared.array
    lock = threading.Lock()

    def array(self, shape, dtype):
        if shape == 0:  # dynamic shared memory: one preallocated buffer, no race
            return original(self, shape, dtype)
        caller = sys._getframe(1)
        key = (caller.f_code.co_filename, caller.f_lineno)
        with lock:
            if key not in self._allocations:
                self._allocations[key] = np.empty(shape, np.dtype(str(dtype)))
            return self._allocations[key]

    kernelapi.FakeCUDAShared.array = array
    yield
    kernelapi.FakeCUDAShared.array = original


@pytest.fixture(scope="module")
def kernels():
    return CudaKernels(np, threads_per_block=THREADS)


# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------


def rng_for(*key):
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def mixed_lens(rows, n):
    """Per row, in turn: a partial length, 0 (empty), beyond n (clipped), negative (empty)."""
    pattern = [n // 2 + 1, 0, n + 5, -3]
    return np.array([pattern[r % 4] for r in range(rows)], dtype=np.int64)


def forward(impl, kind, x, lens=None):
    if impl == "reference":
        return REFERENCE_FORWARD[kind](np, x, lens)
    if impl == "cpu":
        return CPU_FORWARD[kind](x) if lens is None else CPU_FORWARD[kind](x, lens)
    return getattr(impl, kind + "_forward")(x, lens)


def backward(impl, kind, y, g):
    if impl == "reference":
        return REFERENCE_BACKWARD[kind](np, y, g)
    if impl == "cpu":
        return CPU_BACKWARD[kind](y, g)
    return getattr(impl, kind + "_backward")(y, g)


def assert_close(got, want, dtype, scale=1.0, factor=1.0):
    """Same dtype, same -inf pattern, no NaN, finite values within the dtype's tolerance."""
    assert got.dtype == dtype and got.shape == want.shape
    assert not np.isnan(got).any()
    np.testing.assert_array_equal(got == -np.inf, want == -np.inf)
    rtol, atol = TOLERANCE[dtype]
    finite = want != -np.inf
    np.testing.assert_allclose(got[finite], want[finite], rtol=factor * rtol, atol=factor * atol * scale)


def check(kernels, kind, x, lens, g, scale=1.0):
    """Forward and backward of ``kernels`` against the float64 reference and the CPU kernels."""
    dtype = x.dtype.type
    y = forward(kernels, kind, x, lens)
    oracle = forward("reference", kind, x.astype(np.float64), lens)
    assert_close(y, oracle, dtype, scale)
    assert_close(y, forward("cpu", kind, x, lens).astype(np.float64), dtype, scale)
    # Backward from the same y for all three, so only the backward formula is compared.
    dx = backward(kernels, kind, y, g)
    oracle_dx = backward("reference", kind, y.astype(np.float64), g.astype(np.float64))
    assert_close(dx, oracle_dx, dtype, factor=10)
    assert_close(dx, backward("cpu", kind, y, g).astype(np.float64), dtype, factor=10)
    return y, dx


# ---------------------------------------------------------------------------
# Forward and backward against reference.py and cpu.py
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "shape", [(1, 1), (3, 7), (2, 64), (4, 70)], ids=["n=1", "n<block", "n=2 blocks", "n not a multiple"]
)
def test_random_rows_with_and_without_lens(kernels, kind, dtype, shape):
    rng = rng_for(kind, dtype, shape)
    x = rng.standard_normal(shape).astype(dtype)
    g = rng.standard_normal(shape).astype(dtype)
    check(kernels, kind, x, None, g)
    check(kernels, kind, x, mixed_lens(*shape), g)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_huge_logits_are_stable(kernels, kind, dtype):
    rng = rng_for("huge", kind, dtype)
    x = (rng.standard_normal((3, 40)) * 1e4).astype(dtype)
    x[0, :] = 1e4  # ties at a huge value
    x[1, :] = -1e4
    g = rng.standard_normal(x.shape).astype(dtype)
    check(kernels, kind, x, None, g, scale=1e4)
    y = kernels.softmax_forward(x)
    np.testing.assert_allclose(y[0], 1 / 40, rtol=1e-6)
    np.testing.assert_allclose(y.sum(axis=1), 1, rtol=1e-5)


def test_log_softmax_keeps_precision_next_to_a_large_max(kernels):
    # (x - m) - log(s), in that order: in float32 m + log(s) rounds to a multiple of 1e-3.
    x = (1e4 + rng_for("precision").standard_normal((2, 40))).astype(np.float32)
    want = reference.log_softmax_forward(np, x.astype(np.float64))
    np.testing.assert_allclose(kernels.log_softmax_forward(x), want, rtol=1e-6, atol=1e-5)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kind=st.sampled_from(KINDS),
    dtype=st.sampled_from(DTYPES),
    rows=st.integers(1, 3),
    n=st.integers(1, 80),
    threads=st.sampled_from([8, 32]),
    masked=st.booleans(),
    scale=st.sampled_from([1.0, 30.0, 1e4]),
    seed=st.integers(0, 2**32 - 1),
)
def test_hypothesis_shapes(kind, dtype, rows, n, threads, masked, scale, seed):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((rows, n)) * scale).astype(dtype)
    g = rng.standard_normal((rows, n)).astype(dtype)
    lens = rng.integers(-2, n + 3, size=rows) if masked else None
    check(CudaKernels(np, threads_per_block=threads), kind, x, lens, g, scale)


@pytest.mark.parametrize("threads", [1, 4, 64])
def test_every_power_of_two_block_size_reduces_correctly(threads):
    rng = rng_for("threads", threads)
    x = rng.standard_normal((2, 70))
    g = rng.standard_normal((2, 70))
    for kind in KINDS:
        check(CudaKernels(np, threads_per_block=threads), kind, x, np.array([70, 9]), g)


# ---------------------------------------------------------------------------
# -inf, empty rows and lengths
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_empty_rows_give_zeros_and_minus_inf_never_nan(kernels, dtype):
    x, lens = special_rows(dtype)
    g = np.full_like(x, 3)
    for kind in KINDS:
        check(kernels, kind, x, lens, g)
    y, logy = kernels.softmax_forward(x, lens), kernels.log_softmax_forward(x, lens)
    empty = [0, 3, 5, 6]
    assert np.all(y[empty] == 0)  # never uniform weights
    assert np.all(logy[empty] == -np.inf)
    assert not np.isnan(y).any() and not np.isnan(logy).any()
    np.testing.assert_array_equal(y[1, [0, 2, 4]], 0)  # the masked -inf entries of a row
    np.testing.assert_array_equal(logy[1, [0, 2, 4]], -np.inf)
    np.testing.assert_allclose(y[2], [1, 0, 0, 0, 0])
    np.testing.assert_allclose(y[4], cpu.softmax_forward(x[4:5])[0], rtol=1e-6)  # 99 -> 5
    # masked entries receive no gradient
    dx, dlog = kernels.softmax_backward(y, g), kernels.log_softmax_backward(logy, g)
    assert np.all(dx[y == 0] == 0) and np.all(dlog[logy == -np.inf] == 0)
    assert not np.isnan(dx).any() and not np.isnan(dlog).any()


@pytest.mark.parametrize("lens_dtype", [np.int32, np.int64, np.uint8])
def test_lens_of_any_integer_type(kernels, lens_dtype):
    x = np.arange(10, dtype=np.float64).reshape(2, 5)
    lens = np.array([3, 1], dtype=lens_dtype)
    want = cpu.softmax_forward(x, np.array([3, 1]))
    np.testing.assert_allclose(kernels.softmax_forward(x, lens), want, rtol=1e-12)
    np.testing.assert_allclose(np.exp(kernels.log_softmax_forward(x, lens)), want, rtol=1e-12)


def test_nan_stays_in_its_row(kernels):
    x = np.zeros((4, 8), dtype=np.float32)
    x[1, 2] = np.nan
    x[3] = -np.inf
    x[3, 5] = np.nan  # NaN must win the max over -inf too
    for kind in KINDS:
        y = forward(kernels, kind, x)
        assert np.isnan(y[[1, 3]]).all() and not np.isnan(y[[0, 2]]).any()
        np.testing.assert_allclose(y, forward("cpu", kind, x), rtol=1e-6)  # NaN == NaN here


# ---------------------------------------------------------------------------
# Launch configuration: the grid limit, the stream, empty arrays, errors
# ---------------------------------------------------------------------------


class RecordingKernel:
    """Stands in for a compiled kernel: records ``kernel[grid, block, stream](*args)``."""

    def __init__(self):
        self.launches = []

    def __getitem__(self, config):
        return lambda *args: self.launches.append((config, args))


def test_the_grid_is_one_block_per_row_up_to_max_blocks():
    x, y = np.zeros((7, 3)), np.zeros((7, 3))
    kernel = RecordingKernel()
    CudaKernels(np, threads_per_block=THREADS)._launch(kernel, 7, x, y)
    CudaKernels(np, threads_per_block=THREADS, max_blocks=2)._launch(kernel, 7, x, y)
    assert [config for config, _ in kernel.launches] == [(7, THREADS, 0), (2, THREADS, 0)]
    assert kernel.launches[0][1] == (x, y)  # NumPy arrays go in unchanged


@pytest.mark.parametrize("max_blocks", [1, 2, 3])
def test_more_rows_than_blocks_stride_over_the_grid(kernels, max_blocks):
    rng = rng_for("stride", max_blocks)
    x = rng.standard_normal((7, 40)).astype(np.float32)
    g = rng.standard_normal((7, 40)).astype(np.float32)
    lens = mixed_lens(7, 40)
    strided = CudaKernels(np, threads_per_block=THREADS, max_blocks=max_blocks)
    for kind in KINDS:
        y, dx = check(strided, kind, x, lens, g)
        np.testing.assert_array_equal(y, forward(kernels, kind, x, lens))
        np.testing.assert_array_equal(dx, backward(kernels, kind, y, g))


def test_every_launch_asks_the_stream_callable():
    from numba import cuda

    calls = []

    def stream():
        calls.append(1)
        return cuda.stream()  # a simulated stream under the simulator

    on_stream = CudaKernels(np, stream=stream, threads_per_block=THREADS)
    x = rng_for("stream").standard_normal((2, 9))
    y = on_stream.softmax_forward(x)
    on_stream.softmax_backward(y, x)
    on_stream.log_softmax_forward(x, np.array([3, 0]))
    assert len(calls) == 3
    np.testing.assert_allclose(y, cpu.softmax_forward(x), rtol=1e-12)


@pytest.mark.parametrize("shape", [(0, 5), (4, 0), (0, 0)])
def test_empty_arrays_launch_nothing(shape, monkeypatch):
    monkeypatch.setattr(CudaKernels, "_launch", lambda *a: pytest.fail("launched a kernel"))
    kernels = CudaKernels(np, threads_per_block=THREADS)
    x = np.zeros(shape, np.float32)
    for kind in KINDS:
        assert forward(kernels, kind, x).shape == shape
        assert forward(kernels, kind, x, np.zeros(shape[0], np.int64)).shape == shape
        assert backward(kernels, kind, x, x).shape == shape


def test_bad_arguments_are_rejected_before_launching(monkeypatch):
    monkeypatch.setattr(CudaKernels, "_launch", lambda *a: pytest.fail("launched a kernel"))
    kernels = CudaKernels(np, threads_per_block=THREADS)
    x = np.zeros((3, 4), np.float32)
    for kind in KINDS:
        fwd, bwd = getattr(kernels, kind + "_forward"), getattr(kernels, kind + "_backward")
        with pytest.raises(ValueError, match="one entry per row"):
            fwd(x, np.zeros(2, np.int64))
        with pytest.raises(ValueError, match="one entry per row"):
            fwd(x, np.zeros((3, 1), np.int64))
        with pytest.raises(TypeError, match="integers"):
            fwd(x, np.zeros(3, np.float32))
        with pytest.raises(ValueError, match="2-D"):
            fwd(np.zeros(4, np.float32))
        with pytest.raises(ValueError, match="same shape"):
            bwd(x, np.zeros((3, 5), np.float32))
        with pytest.raises(TypeError, match="float32 or float64"):
            fwd(np.zeros((3, 4), np.float16))
        with pytest.raises(TypeError, match="float32 or float64"):
            bwd(np.zeros((3, 4), np.int64), np.zeros((3, 4), np.int64))
    for threads in (0, 3, 48, 2048):
        with pytest.raises(ValueError, match="power of two"):
            CudaKernels(np, threads_per_block=threads)
    with pytest.raises(ValueError, match="max_blocks"):
        CudaKernels(np, max_blocks=0)


def test_inputs_are_not_modified_and_outputs_are_new(kernels):
    rng = rng_for("inputs")
    x = rng.standard_normal((3, 33)).astype(np.float32)
    g = rng.standard_normal((3, 33)).astype(np.float32)
    lens = np.array([20, 0, 40])
    x0, g0, lens0 = x.copy(), g.copy(), lens.copy()
    y = kernels.softmax_forward(x, lens)
    dx = kernels.softmax_backward(y, g)
    np.testing.assert_array_equal(x, x0)
    np.testing.assert_array_equal(g, g0)
    np.testing.assert_array_equal(lens, lens0)
    assert not np.shares_memory(y, x) and not np.shares_memory(dx, g)


def test_default_block_size():
    expected = SIMULATOR_THREADS_PER_BLOCK if SIMULATED else THREADS_PER_BLOCK
    assert CudaKernels(np)._threads() == expected
    assert THREADS_PER_BLOCK == 128 and SIMULATOR_THREADS_PER_BLOCK == 32


def test_importing_does_not_import_numba():
    code = (
        "import minitensor, minitensor.kernels.cuda as k, sys, numpy\n"
        "k.CudaKernels(numpy)\n"
        "assert 'numba' not in sys.modules\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


# ---------------------------------------------------------------------------
# On a real GPU: CuPy arrays, CuPy's stream, nothing through the host
# ---------------------------------------------------------------------------


@pytest.fixture
def cupy_kernels():
    import cupy
    from numba import cuda

    def current_stream():
        return cuda.external_stream(cupy.cuda.get_current_stream().ptr)

    return cupy, CudaKernels(cupy, stream=current_stream)


@pytest.fixture
def no_host_traffic(monkeypatch):
    """Fail on any copy between host and device through numba, and count stream syncs."""
    from numba.cuda.cudadrv import driver

    def refuse(*args, **kwargs):
        raise AssertionError("data went through the host")

    monkeypatch.setattr(driver, "host_to_device", refuse)
    monkeypatch.setattr(driver, "device_to_host", refuse)
    syncs = []
    synchronize = driver.Stream.synchronize
    monkeypatch.setattr(driver.Stream, "synchronize", lambda self: (syncs.append(self), synchronize(self)))
    return syncs


@requires_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (1000, 300), (64, 2049)])
def test_on_cupy_arrays(cupy_kernels, no_host_traffic, dtype, shape):
    cupy, kernels = cupy_kernels
    rng = rng_for("cupy", dtype, shape)
    x_host = (rng.standard_normal(shape) * 10).astype(dtype)
    g_host = rng.standard_normal(shape).astype(dtype)
    lens_host = mixed_lens(*shape)
    x, g, lens = cupy.asarray(x_host), cupy.asarray(g_host), cupy.asarray(lens_host)
    results = {}
    for kind in KINDS:
        for masked in (None, lens):
            y = forward(kernels, kind, x, masked)
            dx = backward(kernels, kind, y, g)
            assert isinstance(y, cupy.ndarray) and isinstance(dx, cupy.ndarray)
            assert y.dtype == dtype and dx.dtype == dtype
            results[kind, masked is None] = (y, dx)
    assert no_host_traffic == []  # launches were not synchronized
    cupy.cuda.get_current_stream().synchronize()
    for (kind, unmasked), (y, dx) in results.items():
        lens_used = None if unmasked else lens_host
        y_host = cupy.asnumpy(y)
        want = forward("reference", kind, x_host.astype(np.float64), lens_used)
        assert_close(y_host, want, dtype, scale=10, factor=10)  # expf may be off by 2 ulp
        want_dx = backward("reference", kind, y_host.astype(np.float64), g_host.astype(np.float64))
        assert_close(cupy.asnumpy(dx), want_dx, dtype, factor=100)


@requires_gpu
@pytest.mark.gpu
def test_on_a_non_default_cupy_stream_with_a_small_grid(cupy_kernels):
    cupy, kernels = cupy_kernels
    strided = CudaKernels(cupy, stream=kernels.stream, threads_per_block=256, max_blocks=7)
    x_host = rng_for("stream-gpu").standard_normal((500, 777)).astype(np.float32)
    with cupy.cuda.Stream(non_blocking=True) as stream:
        x = cupy.asarray(x_host) * 3  # queued on `stream`
        y = strided.softmax_forward(x)
        logy = kernels.log_softmax_forward(x, cupy.full(500, 600))
        total = y.sum(axis=1)  # CuPy reads the kernel's output in order
    stream.synchronize()
    want = reference.softmax_forward(np, x_host.astype(np.float64) * 3)
    np.testing.assert_allclose(cupy.asnumpy(y), want, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(cupy.asnumpy(total), 1, rtol=1e-5)
    want_log = reference.log_softmax_forward(np, x_host.astype(np.float64) * 3, np.full(500, 600))
    assert_close(cupy.asnumpy(logy), want_log, np.float32, scale=10, factor=10)


# -- through the ops: the kernels as a backend's, under autograd -----------------------------------
@pytest.mark.skipif(GPU, reason="the simulator stands in only where there is no GPU")
def test_ops_differentiate_through_the_cuda_kernels(monkeypatch):
    """softmax, masked_softmax, log_softmax and cross_entropy call the CUDA kernels exactly as
    they call the CPU ones (layout, lens dtype, shapes): gradcheck through them in float64."""
    import minitensor as mt
    from minitensor.backends import _BACKENDS, NumpyBackend

    class SimulatedGPU(NumpyBackend):
        device = "simcuda"

        @property
        def kernels(self):
            return CudaKernels(np, threads_per_block=8)

    monkeypatch.setitem(_BACKENDS, "simcuda", SimulatedGPU())
    rng = np.random.default_rng(0)
    x = mt.tensor(rng.standard_normal((3, 3)), dtype=mt.float64, device="simcuda", requires_grad=True)
    lens = mt.tensor([3, 2, 0], device="simcuda")
    targets = mt.tensor([0, 1, 2], device="simcuda")
    assert mt.gradcheck(lambda a: mt.softmax(a, axis=-1), [x])
    assert mt.gradcheck(lambda a: mt.masked_softmax(a, lens), [x])
    assert mt.gradcheck(lambda a: mt.log_softmax(a, axis=-1), [x])
    assert mt.gradcheck(lambda a: mt.cross_entropy(a, targets, label_smoothing=0.1), [x])
    weights = mt.masked_softmax(x, lens).numpy()
    assert np.all(weights[2] == 0) and weights[1, 2] == 0 and np.allclose(weights[:2].sum(-1), 1)
