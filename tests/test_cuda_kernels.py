"""Tests for the GPU's CUDA C++ kernels in ``minitensor/core/kernels/cuda`` (softmax.cu, elementwise.cu).

Without a GPU, ``tests/cuda_emulator`` compiles the very same sources with the host's C++
compiler, every CUDA thread a fiber of its own and ``__syncthreads`` and the warp shuffles real
barriers, so ``CudaKernels(numpy, load_module=EmulatedModule)`` runs the kernels a GPU runs.
Where CuPy finds a GPU, the tests marked ``gpu`` compile them with NVRTC and run them on CuPy
arrays.

Every softmax result is compared with ``kernels/reference.py`` evaluated in float64 (the oracle)
and with the numba CPU kernels of ``kernels/cpu.py`` (the same numerics); dropout's masks with
the CPU's fused kernel, bit for bit; GELU with its reference. The emulator starts a thread per
CUDA thread, so the arrays are small and blocks are one or two warps; the shapes still cover
rows shorter than a warp, longer and not a multiple of it, n = 1, and grids that stride.
"""

import os
import re
import subprocess
import sys
import zlib
from pathlib import Path

import cuda_emulator
import numpy as np
import nvrtc
import pytest
from cuda_emulator import EmulatedModule, RecordingModule
from gpu import requires_gpu
from helpers import special_rows
from hypothesis import given, settings
from hypothesis import strategies as st
from minitensor.kernels import cpu, fused, gelu, reference
from minitensor.kernels.cuda import (
    ELEMENTWISE_THREADS,
    KERNELS,
    MAX_BLOCKS,
    NVRTC_OPTIONS,
    ROW_THREADS,
    CudaKernels,
    source,
)
from minitensor.ops.flash_attention import FlashAttention, flash_attention, stream_plan

import minitensor as mt

REPO_ROOT = Path(__file__).resolve().parents[1]
DTYPES = [np.float32, np.float64]
KINDS = ["softmax", "log_softmax"]
# (rtol, atol) against the float64 oracle, as in test_kernels.py
TOLERANCE = {np.float32: (2e-5, 1e-6), np.float64: (1e-11, 1e-13)}

CPU_FORWARD = {"softmax": cpu.softmax_forward, "log_softmax": cpu.log_softmax_forward}
CPU_BACKWARD = {"softmax": cpu.softmax_backward, "log_softmax": cpu.log_softmax_backward}
REFERENCE_FORWARD = {"softmax": reference.softmax_forward, "log_softmax": reference.log_softmax_forward}
REFERENCE_BACKWARD = {"softmax": reference.softmax_backward, "log_softmax": reference.log_softmax_backward}

# A missing compiler fails under CI=true (.ci/run installs one) and skips elsewhere.
if not cuda_emulator.available() and os.environ.get("CI") != "true":
    pytest.skip(f"the CUDA emulator needs a C++ compiler ({cuda_emulator.COMPILER})", allow_module_level=True)


def emulated(row_threads=64, elementwise_threads=32, max_blocks=MAX_BLOCKS, attention_splits=None):
    """The kernels on NumPy arrays, run by the emulator (small blocks: each thread is a thread)."""
    return CudaKernels(
        np,
        load_module=EmulatedModule,
        row_threads=row_threads,
        elementwise_threads=elementwise_threads,
        max_blocks=max_blocks,
        attention_splits=attention_splits,
    )


@pytest.fixture(scope="module")
def kernels():
    return emulated()


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


@settings(max_examples=10)
@given(
    kind=st.sampled_from(KINDS),
    dtype=st.sampled_from(DTYPES),
    rows=st.integers(1, 5),
    n=st.integers(1, 80),
    row_threads=st.sampled_from([32, 64, 96]),
    masked=st.booleans(),
    scale=st.sampled_from([1.0, 30.0, 1e4]),
    seed=st.integers(0, 2**32 - 1),
)
def test_hypothesis_shapes(kind, dtype, rows, n, row_threads, masked, scale, seed):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((rows, n)) * scale).astype(dtype)
    g = rng.standard_normal((rows, n)).astype(dtype)
    lens = rng.integers(-2, n + 3, size=rows) if masked else None
    check(emulated(row_threads=row_threads), kind, x, lens, g, scale)


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
# Launch configuration: grids, argument types, empty arrays, errors
# ---------------------------------------------------------------------------


def test_a_warp_per_row_and_a_thread_per_element_up_to_max_blocks(recorded):
    x = np.zeros((7, 3), np.float32)
    CudaKernels(np, load_module=RecordingModule).softmax_forward(x)
    CudaKernels(np, load_module=RecordingModule, row_threads=64, max_blocks=2).log_softmax_forward(x, np.arange(7))
    CudaKernels(np, load_module=RecordingModule).gelu_forward(np.zeros(1000))
    CudaKernels(np, load_module=RecordingModule, max_blocks=3).dropout(np.zeros(1000, np.float32), 1, 2, 3.0)
    (name1, grid1, block1, args1), (name2, grid2, block2, args2), gelu_launch, dropout_launch = recorded
    assert (name1, grid1, block1) == ("softmax_forward_float32", (2,), (ROW_THREADS,))  # 4 warps: 7 rows in 2
    assert (name2, grid2, block2) == ("masked_log_softmax_forward_float32", (2,), (64,))  # 4 blocks wanted, 2 max
    assert gelu_launch[:3] == ("gelu_forward_float64", (4,), (ELEMENTWISE_THREADS,))
    assert dropout_launch[:3] == ("dropout_float32", (3,), (ELEMENTWISE_THREADS,))
    # what the C signatures take: arrays, then int64 sizes, uint64 seeds, a scale of x's dtype
    assert args1[0] is x and [type(a) for a in args1[2:]] == [np.int64, np.int64]
    assert args2[1].dtype == np.int64 and list(args2[3:]) == [7, 3]
    assert [type(a) for a in dropout_launch[3][2:]] == [np.int64, np.uint64, np.ndarray, np.uint64, np.float32]


@pytest.mark.parametrize("max_blocks", [1, 2, 3])
def test_more_rows_than_the_grid_holds_stride_over_it(kernels, max_blocks):
    rng = rng_for("stride", max_blocks)
    x = rng.standard_normal((7, 40)).astype(np.float32)
    g = rng.standard_normal((7, 40)).astype(np.float32)
    lens = mixed_lens(7, 40)
    strided = emulated(row_threads=32, max_blocks=max_blocks)
    for kind in KINDS:
        y, dx = check(strided, kind, x, lens, g)
        np.testing.assert_array_equal(y, forward(kernels, kind, x, lens))
        np.testing.assert_array_equal(dx, backward(kernels, kind, y, g))


@pytest.mark.parametrize("shape", [(0, 5), (4, 0), (0, 0)])
def test_empty_arrays_launch_nothing(shape, recorded):
    kernels = CudaKernels(np, load_module=RecordingModule)
    x = np.zeros(shape, np.float32)
    for kind in KINDS:
        assert forward(kernels, kind, x).shape == shape
        assert forward(kernels, kind, x, np.zeros(shape[0], np.int64)).shape == shape
        assert backward(kernels, kind, x, x).shape == shape
    assert kernels.gelu_forward(x).shape == kernels.dropout(x, 1, 2, 3.0).shape == shape
    assert recorded == []


def test_bad_arguments_are_rejected_before_launching(recorded):
    kernels = CudaKernels(np, load_module=RecordingModule)
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
    with pytest.raises(TypeError, match="float32 or float64"):
        kernels.dropout(np.zeros(3, np.int64), 1, 2, 3.0)
    assert recorded == []
    for threads in (0, 16, 48, 2048):
        with pytest.raises(ValueError, match="multiple of 32"):
            CudaKernels(np, row_threads=threads)
    with pytest.raises(ValueError, match="max_blocks"):
        CudaKernels(np, max_blocks=0)


def test_a_kernel_that_does_not_compile_says_what_to_install():
    class NoCompiler:
        def __init__(self, code):
            pass

        def get_function(self, name):
            raise RuntimeError("nvrtc: libnvrtc.so.13: cannot open shared object file\nmore detail")

    with pytest.raises(mt.DeviceError) as caught:
        CudaKernels(np, load_module=NoCompiler).softmax_forward(np.zeros((2, 2), np.float32))
    message = str(caught.value)
    assert "softmax_forward_float32 (softmax.cu) could not be compiled" in message and "libnvrtc" in message
    assert "cupy-cuda13x[ctk]" in message and "more detail" not in message


def test_the_emulator_checks_argument_types(kernels):
    """What a GPU would read as garbage is an error here: a float64 where float is taken; and a
    launch it refuses."""
    softmax = EmulatedModule(source("softmax"))
    function = softmax.get_function("softmax_forward_float32")
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(TypeError, match="argument 1 must be a C-contiguous float32 array"):
        function((1,), (32,), (x, np.zeros((2, 3)), np.int64(2), np.int64(3)))
    with pytest.raises(TypeError, match="argument 2 must be a numpy.int64"):
        function((1,), (32,), (x, x.copy(), 2, np.int64(3)))
    with pytest.raises(TypeError, match="takes 4 arguments"):
        function((1,), (32,), (x, x))
    # a launch a GPU refuses ("invalid configuration argument"), where the emulator would run
    # nothing, or divide by zero, quietly
    for grid, block in [(0, 32), (1, 0), (1, 2048)]:
        with pytest.raises(ValueError, match="1 or more blocks of 1 to 1,024 threads"):
            function((grid,), (block,), (x, x.copy(), np.int64(2), np.int64(3)))


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


def test_non_contiguous_inputs_are_made_contiguous(kernels):
    x = rng_for("strided").standard_normal((6, 10))
    np.testing.assert_allclose(kernels.softmax_forward(x[::2, ::3]), cpu.softmax_forward(x[::2, ::3].copy()))


def test_importing_imports_neither_numba_nor_cupy():
    code = (
        "import minitensor, minitensor.kernels.cuda as k, sys, numpy\n"
        "k.CudaKernels(numpy)\n"
        "assert 'numba' not in sys.modules and 'cupy' not in sys.modules\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


# ---------------------------------------------------------------------------
# Elementwise: dropout's masks equal the CPU's, GELU its reference
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("p, size", [(0.1, 1000), (0.5, 777), (0.9, 64), (0.0, 5)])
def test_dropout_masks_are_the_cpus_bit_for_bit(kernels, dtype, p, size):
    x = rng_for("dropout", dtype, p).standard_normal(size).astype(dtype)
    seed, threshold, scale = np.uint64(2**62 - 12345), np.uint64(round(p * 2**32)), dtype(1 / (1 - p))
    got = kernels.dropout(x, seed, threshold, scale)
    np.testing.assert_array_equal(got, fused.dropout_forward(x, seed, threshold, scale))
    assert got.dtype == dtype


def test_dropout_keeps_about_one_minus_p_and_strides_over_a_small_grid():
    x = np.ones(4096, np.float32)
    once = emulated(elementwise_threads=64, max_blocks=4).dropout(x, 7, round(0.3 * 2**32), 1 / 0.7)
    kept = np.count_nonzero(once) / x.size
    assert abs(kept - 0.7) < 0.03  # 4096 Bernoulli(0.7) draws: sd 0.007
    np.testing.assert_array_equal(
        once, fused.dropout_forward(x, np.uint64(7), np.uint64(round(0.3 * 2**32)), np.float32(1 / 0.7))
    )


def test_a_seed_on_the_device_is_read_where_it_lies(kernels):
    """In a captured CUDA graph a dropout's seed is a uint64 on the device that the graph rewrites
    before each replay: the kernel, given its address, drops what it drops given the number, and
    a seed rewritten in that word changes the mask (the same launch arguments)."""
    x = rng_for("seed on device").standard_normal(999).astype(np.float32)
    threshold, scale = round(0.4 * 2**32), 1 / 0.6
    word = np.array(2**61 + 5, np.uint64).reshape(())  # a 0-d array: a captured seed, table[k]
    first = kernels.dropout(x, word, threshold, scale)
    np.testing.assert_array_equal(first, kernels.dropout(x, 2**61 + 5, threshold, scale))
    word[...] = 77
    np.testing.assert_array_equal(kernels.dropout(x, word, threshold, scale), kernels.dropout(x, 77, threshold, scale))
    with pytest.raises(TypeError, match="one uint64"):
        kernels.dropout(x, np.array([1, 2], np.uint64), threshold, scale)


def test_seeds_drawn_on_the_device_are_the_hosts_draws():
    """``draw_seeds`` fills a graph's table with the draws the CuPy backend's ``draw_seed`` would
    have made on the host (a replayed step drops what an eager one would), over a small grid."""
    from minitensor.backends.cupy_backend import CupyBackend, _splitmix64

    host = CupyBackend.__new__(CupyBackend)  # its generator alone: no CuPy needed
    host.seed(2**63 + 12345)
    skipped = [host.draw_seed() for _ in range(5)]
    want = [host.draw_seed() for _ in range(300)]
    seeds = np.zeros(300, np.uint64)
    emulated(elementwise_threads=32, max_blocks=3).draw_seeds(seeds, _splitmix64(2**63 + 12345), len(skipped) + 1)
    assert seeds.tolist() == want


@pytest.mark.parametrize("dtype", DTYPES)
def test_gelu_matches_its_reference(kernels, dtype):
    """Against the float64 reference; float32 within a few ulp of erfcf far out in the tail."""
    x = np.concatenate([np.linspace(-12, 12, 301), [0.0, -0.0, np.inf, -np.inf]]).astype(dtype)
    g = rng_for("gelu", dtype).standard_normal(x.size).astype(dtype)
    x64, g64 = x.astype(np.float64), g.astype(np.float64)
    rtol = 2e-5 if dtype == np.float32 else 1e-12  # the reference's own erfc is good to ~1e-13
    y = kernels.gelu_forward(x)
    assert y.dtype == dtype
    np.testing.assert_allclose(y, gelu.reference_forward(np, x64), rtol=rtol, atol=1e-30)
    finite = np.isfinite(x)
    np.testing.assert_allclose(
        kernels.gelu_backward(x, g)[finite], gelu.reference_backward(np, x64, g64)[finite], rtol=rtol, atol=1e-30
    )
    part = x.reshape(5, -1)[:, ::2]  # any shape, any layout
    np.testing.assert_allclose(
        kernels.gelu_forward(part), gelu.reference_forward(np, part.astype(np.float64)), rtol=rtol
    )


@pytest.mark.parametrize("dtype", DTYPES)
def test_relu_matches_the_cpu_kernel(kernels, dtype):
    x = np.array([-2.0, -0.0, 0.0, 1.5, np.nan, np.inf, -np.inf], dtype=dtype)
    g = np.array([1.0, 2.0, 3.0, 4.0, 5.0, np.nan, 7.0], dtype=dtype)
    y = kernels.relu_forward(x)
    np.testing.assert_array_equal(y, fused.relu_forward(x))  # NaN stays NaN
    np.testing.assert_array_equal(kernels.relu_backward(y, g), fused.relu_backward(y, g))


def test_bfloat16_conversions_match_ml_dtypes_bit_for_bit(kernels):
    """elementwise.cu's float32 <-> bfloat16 kernels against ml_dtypes' astype (kernels/bfloat16.py
    holds the rule): ties to even, carries into the exponent, overflow to infinity, subnormals,
    signed zeros; a NaN stays a NaN."""
    bits = [0, 0x80000000, 0x7F800000, 0xFF800000, 0x7F7FFFFF, 0x7F7F7FFF, 0x00008000, 0x00018000, 0x00017FFF]
    bits += [0x3F808000, 0x3F818000, 0x3F80C000, 0x00000001, 0x807FFFFF, 0x7F800001, 0xFFC00000, 0x7FBFFFFF]
    rng = rng_for("bfloat16")
    u = np.concatenate([np.array(bits, np.uint32), rng.integers(0, 2**32, 333, dtype=np.uint64).astype(np.uint32)])
    x = np.stack([u, u[::-1]], axis=1).view(np.float32).T  # (2, 350), not C-contiguous: any layout
    with np.errstate(invalid="ignore"):  # (ml_dtypes warns of each NaN it casts)
        want = x.astype(mt.bfloat16)
    nan = np.isnan(x)
    narrow, rounded = kernels.bfloat16_narrow(x), kernels.bfloat16_round(x)
    assert narrow.dtype == mt.bfloat16 and rounded.dtype == np.float32 and narrow.shape == rounded.shape == x.shape
    assert np.array_equal(narrow.view(np.uint16)[~nan], want.view(np.uint16)[~nan])
    assert np.array_equal(rounded[~nan], want.astype(np.float32)[~nan])
    assert np.isnan(narrow.astype(np.float32)[nan]).all() and np.isnan(rounded[nan]).all()
    widened = kernels.bfloat16_widen(want)
    assert widened.dtype == np.float32 and np.array_equal(widened[~nan], want.astype(np.float32)[~nan])
    assert kernels.bfloat16_round(np.float32(3.0)[()] * np.ones((), np.float32)).shape == ()
    with pytest.raises(TypeError, match="bfloat16_narrow kernel takes float32 arrays, got float64"):
        kernels.bfloat16_narrow(np.zeros(3))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1), (5, 33), (70, 100)])
def test_layer_norm_matches_the_cpu_kernels(kernels, dtype, shape):
    rng = rng_for("layer_norm", dtype, shape)
    x = (rng.standard_normal(shape) * 3 + 1).astype(dtype)
    weight, bias, grad = (rng.standard_normal(n).astype(dtype) for n in (shape[1], shape[1], shape))
    eps = dtype(1e-5)
    want = fused.layer_norm_forward(x, weight, bias, eps)
    got = kernels.layer_norm_forward(x, weight, bias, eps)
    tol = dict(rtol=2e-5, atol=2e-5) if dtype == np.float32 else dict(rtol=1e-12, atol=1e-12)
    for name, g, w in zip(("y", "xhat", "rstd"), got, want):
        assert g.shape == w.shape and g.dtype == dtype, name
        np.testing.assert_allclose(g, w, err_msg=name, **tol)
    got_back = kernels.layer_norm_backward(grad, got[1], got[2], weight)
    want_back = fused.layer_norm_backward(grad, want[1], want[2], weight)
    for name, g, w in zip(("dx", "dweight", "dbias"), got_back, want_back):
        assert g.shape == w.shape and g.dtype == dtype, name
        np.testing.assert_allclose(g, w, err_msg=name, **tol)


class _PoisonedEmpty:
    """NumPy, but ``empty`` hands out NaN: an array a kernel must fill whole shows where it did not."""

    def __getattr__(self, name):
        return getattr(np, name)

    @staticmethod
    def empty(shape, dtype=float):
        return np.full(shape, np.nan, dtype)

    @staticmethod
    def empty_like(a):
        return np.full_like(a, np.nan)


@pytest.mark.parametrize("shape", [(1, 3), (70, 100), (200, 5)])
def test_layer_norms_partial_sums_are_written_whole_not_zeroed_first(shape):
    """layer_norm_backward's column kernel writes every partial sum, so its buffers need no
    zeroing launches: with every new buffer NaN, dweight and dbias still equal the CPU's."""
    kernels = CudaKernels(_PoisonedEmpty(), load_module=EmulatedModule, row_threads=64, elementwise_threads=32)
    rng = rng_for("layer_norm poisoned", np.float64, shape)
    x, grad = rng.standard_normal(shape), rng.standard_normal(shape)
    weight, bias = rng.standard_normal(shape[1]), rng.standard_normal(shape[1])
    _, xhat, rstd = kernels.layer_norm_forward(x, weight, bias, 1e-5)
    got = kernels.layer_norm_backward(grad, xhat, rstd, weight)
    want = fused.layer_norm_backward(grad, xhat, rstd, weight)
    for name, g, w in zip(("dx", "dweight", "dbias"), got, want):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12, err_msg=name)


@pytest.mark.parametrize("dtype", DTYPES)
def test_adam_update_matches_the_cpu_kernel_in_place(kernels, dtype):
    rng = rng_for("adam", dtype)
    w, g, m = (rng.standard_normal((7, 9)).astype(dtype) for _ in range(3))
    v = np.abs(rng.standard_normal((7, 9))).astype(dtype)
    f = dtype
    scalars = (f(1e-3 / (1 - 0.9**3)), (f(0.9), f(1 - 0.9)), (f(0.999), f(1 - 0.999)), f(1e-8), f(0.01))
    scalars += (f(np.sqrt(1 - 0.999**3)),)
    want = [a.copy() for a in (w, g, m, v)]
    fused.adam_update(want[0], want[1], want[2], want[3], *scalars)
    kernels.adam_update(w, g, m, v, *scalars)
    tol = dict(rtol=1e-6) if dtype == np.float32 else dict(rtol=1e-14)
    for name, got, expected in zip(("w", "g", "m", "v"), (w, g, m, v), want):
        np.testing.assert_allclose(got, expected, err_msg=name, **tol)
    with pytest.raises(ValueError, match="C-contiguous"):
        kernels.adam_update(w.T, g.T, m.T, v.T, *scalars)


def test_the_gpu_backend_hands_the_ops_its_fused_kernels():
    """Layer norm, ReLU, dropout and Adam on the CuPy backend call these kernels, as the CPU's ops
    call kernels/fused.py: the same functions, through backend.fused(name, dtype)."""
    from fake_cupy import FakeCupy
    from minitensor.backends.cupy_backend import CupyBackend

    backend = CupyBackend(FakeCupy())
    backend._kernels = kernels = emulated()
    for name in CupyBackend.FUSED:
        assert backend.fused(name, np.float32) == getattr(kernels, CupyBackend.FUSED[name])
    assert backend.fused("layer_norm_forward", np.float16) is None


# ---------------------------------------------------------------------------
# On a real GPU: compiled by NVRTC, on CuPy arrays and CuPy's stream
# ---------------------------------------------------------------------------


@pytest.fixture
def cupy_kernels():
    import cupy

    return cupy, CudaKernels(cupy)


@requires_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (1000, 300), (64, 2049)])
def test_on_cupy_arrays(cupy_kernels, dtype, shape):
    cupy, kernels = cupy_kernels
    rng = rng_for("cupy", dtype, shape)
    x_host = (rng.standard_normal(shape) * 10).astype(dtype)
    g_host = rng.standard_normal(shape).astype(dtype)
    lens_host = mixed_lens(*shape)
    x, g, lens = cupy.asarray(x_host), cupy.asarray(g_host), cupy.asarray(lens_host)
    for kind in KINDS:
        for masked in (None, lens):
            y = forward(kernels, kind, x, masked)
            dx = backward(kernels, kind, y, g)
            assert isinstance(y, cupy.ndarray) and isinstance(dx, cupy.ndarray)
            assert y.dtype == dtype and dx.dtype == dtype
            lens_used = None if masked is None else lens_host
            y_host = cupy.asnumpy(y)
            want = forward("reference", kind, x_host.astype(np.float64), lens_used)
            assert_close(y_host, want, dtype, scale=10, factor=10)  # expf may be off by 2 ulp
            want_dx = backward("reference", kind, y_host.astype(np.float64), g_host.astype(np.float64))
            assert_close(cupy.asnumpy(dx), want_dx, dtype, factor=100)


@requires_gpu
@pytest.mark.gpu
def test_on_a_non_default_cupy_stream_with_a_small_grid(cupy_kernels):
    cupy, kernels = cupy_kernels
    strided = CudaKernels(cupy, row_threads=256, max_blocks=7)
    x_host = rng_for("stream-gpu").standard_normal((500, 777)).astype(np.float32)
    with cupy.cuda.Stream(non_blocking=True) as stream:
        x = cupy.asarray(x_host) * 3  # queued on `stream`
        y = strided.softmax_forward(x)
        logy = kernels.log_softmax_forward(x, cupy.full(500, 600))
        total = y.sum(axis=1)  # CuPy reads the kernel's output in order
        mask = kernels.dropout(x, 11, round(0.25 * 2**32), 1 / 0.75)
    stream.synchronize()
    want = reference.softmax_forward(np, x_host.astype(np.float64) * 3)
    np.testing.assert_allclose(cupy.asnumpy(y), want, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(cupy.asnumpy(total), 1, rtol=1e-5)
    want_log = reference.log_softmax_forward(np, x_host.astype(np.float64) * 3, np.full(500, 600))
    assert_close(cupy.asnumpy(logy), want_log, np.float32, scale=10, factor=10)
    on_cpu = fused.dropout_forward(x_host * 3, np.uint64(11), np.uint64(round(0.25 * 2**32)), np.float32(1 / 0.75))
    np.testing.assert_array_equal(cupy.asnumpy(mask), on_cpu)


@requires_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("dtype, d", [(np.float32, 64), (np.float32, 100), (np.float64, 32)])
@pytest.mark.parametrize("splits", [None, 1])  # None: as the launcher picks them for this GPU
def test_streamed_attention_on_cupy_arrays(cupy_kernels, dtype, d, splits):
    cupy, _ = cupy_kernels
    kernels = CudaKernels(cupy, attention_splits=splits)

    def on_the_gpu(method):  # the same call, on device copies, results brought back
        def call(*args, **kwargs):
            kwargs = dict(zip(kwargs, _to_gpu(cupy, kwargs.values())))
            return tuple(cupy.asnumpy(x) for x in getattr(kernels, method)(*_to_gpu(cupy, args), **kwargs))

        return staticmethod(call)

    class OnTheGpu:
        attention_forward = on_the_gpu("attention_forward")
        attention_backward = on_the_gpu("attention_backward")

    check_attention(OnTheGpu, 2, 8, 4, 300, 333, d, dtype, True, [200, 333])
    # a learned relative bias with a window, its gradient included
    bias = relative_table(np.random.default_rng(6), 8, 300, 333, dtype, 40, 33, 0)
    check_attention(OnTheGpu, 2, 8, 4, 300, 333, d, dtype, True, None, bias=bias, table_grad=True)
    # dropout on the weights inside the kernels: what the tiles drop with the same seed
    check_attention(OnTheGpu, 2, 8, 4, 300, 333, d, dtype, True, [200, 333], dropout=0.2)


def _to_gpu(cupy, args):
    return [cupy.asarray(a) if isinstance(a, np.ndarray) else a for a in args]


# -- through the ops: the kernels as a backend's, under autograd -----------------------------------
def test_ops_differentiate_through_the_cuda_kernels(monkeypatch):
    """softmax, masked_softmax, log_softmax and cross_entropy call the CUDA kernels exactly as
    they call the CPU ones (layout, lens dtype, shapes): gradcheck through them in float64."""
    from minitensor.backends import _BACKENDS, NumpyBackend

    class EmulatedGPU(NumpyBackend):
        device = "emulated-cuda"
        kernels = emulated(row_threads=32)

    monkeypatch.setitem(_BACKENDS, "emulated-cuda", EmulatedGPU())
    rng = np.random.default_rng(0)
    x = mt.tensor(rng.standard_normal((3, 3)), dtype=mt.float64, device="emulated-cuda", requires_grad=True)
    lens = mt.tensor([3, 2, 0], device="emulated-cuda")
    targets = mt.tensor([0, 1, 2], device="emulated-cuda")
    assert mt.gradcheck(lambda a: mt.softmax(a, axis=-1), [x])
    assert mt.gradcheck(lambda a: mt.masked_softmax(a, lens), [x])
    assert mt.gradcheck(lambda a: mt.log_softmax(a, axis=-1), [x])
    assert mt.gradcheck(lambda a: mt.cross_entropy(a, targets, label_smoothing=0.1), [x])
    weights = mt.masked_softmax(x, lens).numpy()
    assert np.all(weights[2] == 0) and weights[1, 2] == 0 and np.allclose(weights[:2].sum(-1), 1)


def test_compile_all_compiles_every_kernel_of_every_source():
    names = emulated().compile_all()
    assert "masked_log_softmax_forward_float64" in names and "dropout_float32" in names
    assert "attention_backward_dkv_d128_float32" in names and "attention_forward_d128_float64" not in names
    in_sources = {name for module in KERNELS for name in EmulatedModule(source(module)).kernels}
    assert sorted(names) == sorted(in_sources)  # none left out of KERNELS, none listed that is not there


def test_the_launcher_compiles_only_the_attention_kernels_a_call_needs():
    """attention.cu holds five sizes and dtypes of kernels, NVRTC four times slower over all of
    them than over one: a call compiles its own (D, dtype) once, a learned table's gradient its
    small kernel alone, and ``source`` leaves the other instantiations out."""
    loaded = []

    class Loaded(RecordingModule):
        def __init__(self, code):
            super().__init__(code)
            loaded.append([line for line in code.splitlines() if line.startswith("ATTENTION_KERNELS(")])

    kernels = CudaKernels(np, load_module=Loaded)
    q = np.zeros((1, 2, 4, 64), np.float32)
    for _ in range(2):  # the second call finds the kernels compiled
        out, lse = kernels.attention_forward(q, q, q, None, True, 0.125)
        kernels.attention_backward(q, q, q, None, True, 0.125, out, lse, q)
    assert loaded == [["ATTENTION_KERNELS(float, 64, float32)"]]
    table = np.zeros((2, 7), np.float64)
    q = np.zeros((1, 2, 4, 20), np.float64)
    out, lse = kernels.attention_forward(q, q, q, None, True, 0.2, table=table)
    kernels.attention_backward(q, q, q, None, True, 0.2, out, lse, q, table=table, table_grad=True)
    assert loaded[1:] == [["ATTENTION_KERNELS(double, 32, float64)"], []]  # d 20 in rows of 32; the bias's
    assert "attention_bias_grad_float64" in source("attention", (None, "float64"))


# ---------------------------------------------------------------------------
# Streamed attention (attention.cu) against the tiles of ops/flash_attention.py
# ---------------------------------------------------------------------------


def tiled_attention(q, k, v, lens, causal, scale, grad, bias=None, table_grad=False, dropout=0.0):
    """The reference: flash_attention's tiles on the CPU (tested against plain attention in
    test_flash_attention.py), with small tiles so that every code path of the stream runs.
    ``bias``: None or (table, window, q_offset, k_offset), a relative bias; ``table_grad``:
    the table's gradient too, last; ``dropout``: p on the weights, the seed drawn after
    ``mt.manual_seed(DROPOUT_SEED)``."""
    mt.manual_seed(DROPOUT_SEED)
    leaves = [mt.tensor(a, requires_grad=True) for a in (q, k, v)]
    lens_t = None if lens is None else mt.tensor(lens)
    table, window, q_offset, k_offset = (None, None, 0, 0) if bias is None else bias
    table = None if table is None else mt.tensor(table, requires_grad=table_grad)
    out, lse = flash_attention(
        *leaves, valid_lens=lens_t, causal=causal, scale=scale, block_q=8, block_k=8, return_lse=True,
        relative_bias=table, window=window, q_offset=q_offset, k_offset=k_offset, dropout_p=dropout,
    )  # fmt: skip
    out.backward(mt.tensor(grad))
    grads = [leaf.grad.numpy() for leaf in leaves + ([table] if table_grad else [])]
    return out.numpy(), lse.numpy(), *grads


def relative_table(rng, H, Q, K, dtype, window=None, q_offset=0, k_offset=0):
    """A relative bias as a "scores" encoding gives it: (H, Q + K - 1), -inf beyond ``window``."""
    table = rng.standard_normal((H, Q + K - 1))
    if window is not None:
        distance = k_offset - (q_offset + Q - 1) + np.arange(Q + K - 1)
        table[:, np.abs(distance) > window] = -np.inf
    return table.astype(dtype), window, q_offset, k_offset


DROPOUT_SEED = 11


def check_attention(
    kernels, B, H, G, Q, K, d, dtype, causal, lens, seed=0, bias=None, table_grad=False, dropout=0.0,
    seed_on_device=False,
):  # fmt: skip
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, H, Q, d)).astype(dtype)
    k, v = (rng.standard_normal((B, G, K, d)).astype(dtype) for _ in range(2))
    grad = rng.standard_normal((B, H, Q, d)).astype(dtype)
    scale = 1 / np.sqrt(d)
    want = tiled_attention(q, k, v, lens, causal, scale, grad, bias, table_grad, dropout)
    by_row = None if lens is None else np.broadcast_to(np.asarray(lens).reshape(B, -1), (B, Q))
    table = {} if bias is None else dict(table=bias[0], window=bias[1], shift=bias[3] - bias[2])
    if dropout:  # the seed the tiles drew, drawn again (as a captured graph holds it, on the device)
        mt.manual_seed(DROPOUT_SEED)
        scale_kept = 1 / (1 - dropout) if dropout < 1 else 0.0
        drawn = mt.zeros(1)._backend.draw_seed()
        seed = np.array(drawn, np.uint64).reshape(()) if seed_on_device else drawn
        table["dropout"] = (seed, round(dropout * 2**32), scale_kept)
    out, lse = kernels.attention_forward(q, k, v, by_row, causal, scale, **table)
    if table_grad:
        table["table_grad"] = True
    got = (out, lse, *kernels.attention_backward(q, k, v, by_row, causal, scale, out, lse, grad, **table))
    assert len(got) == len(want)
    tol = dict(rtol=2e-4, atol=2e-5) if dtype == np.float32 else dict(rtol=1e-10, atol=1e-12)
    for name, g, w in zip(("out", "lse", "dq", "dk", "dv", "dtable"), got, want):
        assert g.dtype == dtype and g.shape == w.shape, name
        np.testing.assert_array_equal(np.isinf(g), np.isinf(w), err_msg=name)  # rows that see no key
        np.testing.assert_allclose(np.where(np.isinf(g), 0, g), np.where(np.isinf(w), 0, w), err_msg=name, **tol)
    return got


# (B, H, G, Q, K, d, causal, lens) of the streamed kernels' tests against the tiles
STREAMED_CASES = [
    (1, 2, 2, 70, 70, 16, True, None),  # causal self-attention, two query tiles, a partial key tile
    (2, 4, 2, 37, 45, 8, True, [30, 45]),  # grouped heads (2 query heads per key head), K > Q, lengths
    (2, 2, 1, 20, 13, 5, True, None),  # K < Q: the first rows see no key at all
    (2, 2, 2, 9, 33, 32, False, [[0] * 9, list(range(9))]),  # per-query lengths, empty rows, d = D
    (1, 1, 1, 1, 1, 3, False, None),  # one query, one key
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B, H, G, Q, K, d, causal, lens", STREAMED_CASES)
def test_streamed_attention_matches_the_tiles(kernels, dtype, B, H, G, Q, K, d, causal, lens):
    check_attention(kernels, B, H, G, Q, K, d, dtype, causal, lens)


@pytest.mark.parametrize("splits", [1, 4])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B, H, G, Q, K, d, causal, lens", STREAMED_CASES)
def test_streamed_attention_with_dropout_on_the_weights(splits, dtype, B, H, G, Q, K, d, causal, lens):
    """Dropout inside the kernels: each drops the weights the tiles drop (the counter-based mask
    of ``mt.dropout`` on the whole (B, H, Q, K) weights, from the same seed, made again in dQ and
    in dK/dV), the softmax's log-sum-exp untouched, with one walker a row and with four."""
    check_attention(emulated(attention_splits=splits), B, H, G, Q, K, d, dtype, causal, lens, dropout=0.3)


def test_streamed_dropout_reads_a_seed_on_the_device():
    """The three kernels read a captured graph's seed at its address: the same weights dropped."""
    check_attention(emulated(), 2, 4, 2, 37, 45, 8, np.float32, True, [30, 45], dropout=0.3, seed_on_device=True)


def test_streamed_dropout_with_a_learned_bias_and_edge_probabilities():
    """Dropout with a learned windowed bias and its gradient (ds is the gradient through the
    mask); p = 1 drops every weight (zero output and gradients, lse still the softmax's)."""
    bias = relative_table(np.random.default_rng(3), 2, 40, 45, np.float64, 9, 3, 0)
    check_attention(
        emulated(), 2, 2, 2, 40, 45, 8, np.float64, False, [40, 20], bias=bias, table_grad=True, dropout=0.5
    )
    out, lse, dq, dk, dv = check_attention(emulated(), 1, 2, 1, 20, 20, 8, np.float64, True, None, dropout=1.0)
    assert not out.any() and not dq.any() and not dk.any() and not dv.any() and np.isfinite(lse).all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "B, H, G, Q, K, causal, lens, window, q_offset, k_offset",
    [
        (2, 4, 2, 70, 70, True, None, None, 0, 0),  # ALiBi's kind: a bias on every key
        (1, 2, 1, 37, 45, False, [40], None, 0, 0),  # K > Q with lengths
        (2, 2, 2, 70, 70, True, None, 5, 0, 0),  # a sliding window: most key tiles skipped
        (1, 2, 2, 9, 70, False, None, 8, 61, 0),  # a window with the queries at positions 61..69
        (2, 4, 2, 70, 45, False, [[20] * 70, list(range(70))], 30, 10, 3),  # window both ways, empty rows
    ],
)
def test_streamed_attention_with_a_relative_bias(dtype, B, H, G, Q, K, causal, lens, window, q_offset, k_offset):
    """A "scores" encoding's relative bias (ALiBi, sliding_window, a plugin declaring ``relative``)
    enters the kernels as its (H, Q + K - 1) table, -inf beyond its window; they add it to every
    score and skip the keys, and the blocks of keys, that the window hides."""
    bias = relative_table(np.random.default_rng(1), H, Q, K, dtype, window, q_offset, k_offset)
    check_attention(emulated(), B, H, G, Q, K, 16, dtype, causal, lens, bias=bias)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "B, H, G, Q, K, causal, lens, window, q_offset, k_offset",
    [
        (2, 4, 2, 70, 70, True, None, None, 0, 0),  # T5's kind: a learned table on every key
        (3, 2, 1, 130, 45, False, [40, 3, 45], None, 0, 0),  # three query tiles, K < Q, lengths
        (2, 2, 2, 70, 100, True, None, 9, 0, 30),  # a window: tiles skipped, keys past a tile's end
        (1, 2, 2, 1, 37, False, None, None, 36, 0),  # one query (a decoding step)
    ],
)
def test_the_gradient_of_a_learned_bias_table(dtype, B, H, G, Q, K, causal, lens, window, q_offset, k_offset):
    """``table_grad``: dL/dtable[h, c] sums dL/ds over the cells (i, j) of column c = j - i + Q - 1
    and the batch, as the tiles' ``bincount`` does: per-block partial sums along the diagonals
    of each key tile, then one ordered sum per column (no atomics)."""
    bias = relative_table(np.random.default_rng(5), H, Q, K, dtype, window, q_offset, k_offset)
    check_attention(emulated(), B, H, G, Q, K, 16, dtype, causal, lens, bias=bias, table_grad=True)


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_bias_that_hides_a_rows_first_keys_without_a_window(dtype):
    """-inf inside the table, with no window to say where: here every key before the query
    (a plugin that looks ahead only), so that the first keys each row meets are hidden, and a
    row's running max is still -inf when they come (exp(-inf - -inf) would be NaN)."""
    table, *_ = relative_table(np.random.default_rng(2), 2, 40, 40, dtype)
    table[:, : 40 - 1] = -np.inf  # distances j - i < 0
    check_attention(emulated(), 1, 2, 2, 40, 40, 8, dtype, False, None, bias=(table, None, 0, 0))


def test_a_bias_table_of_the_wrong_shape_or_a_window_without_one_is_refused(recorded):
    kernels = CudaKernels(np, load_module=RecordingModule)
    q = k = v = np.zeros((1, 2, 5, 8), np.float32)
    with pytest.raises(ValueError, match=r"expected \(H, Q \+ K - 1\) = \(2, 9\)"):
        kernels.attention_forward(q, k, v, None, False, 1.0, table=np.zeros((2, 5), np.float32))
    with pytest.raises(ValueError, match="window=3 needs a relative bias table"):
        kernels.attention_forward(q, k, v, None, False, 1.0, window=3)
    lse = np.zeros((1, 2, 5), np.float32)
    with pytest.raises(ValueError, match="table_grad=True needs the bias table"):
        kernels.attention_backward(q, k, v, None, False, 1.0, q, lse, q, table_grad=True)
    assert not recorded


@pytest.mark.parametrize(
    "dtype, d",
    [(np.float32, 128), (np.float32, 97), (np.float64, 64), (np.float64, 40)],  # four threads a row
)
def test_streamed_attention_in_the_widest_rows(dtype, d):
    """Rows of 128 floats or 64 doubles are split over four threads (two would hold more than a
    thread's registers): grouped heads, two query tiles, a partial key tile, lengths."""
    from minitensor.kernels.cuda import attention_split

    assert attention_split(dtype, emulated().attention_row_size(dtype, d)) == 4
    check_attention(emulated(), 2, 4, 2, 70, 45, d, dtype, True, [30, 45])


def test_the_launchers_sizes_are_the_kernels():
    """The launcher sizes grids and scratch buffers by attention.cu's QUERY_ROWS and KEY_TILE:
    written twice (C++ and Python), they must agree; and every number of walkers must divide
    the rows of a block and the tiles (each walker takes as many keys or queries of a tile)."""
    from minitensor.kernels.cuda import ATTENTION_KEY_TILE, ATTENTION_MAX_SPLITS, ATTENTION_ROWS

    defines = {name: int(value) for name, value in re.findall(r"#define (\w+) (\d+)", source("attention"))}
    assert (defines["QUERY_ROWS"], defines["KEY_TILE"]) == (ATTENTION_ROWS, ATTENTION_KEY_TILE)
    for size in (defines["QUERY_ROWS"], defines["KEY_TILE"], defines["QUERY_TILE"]):
        assert size % ATTENTION_MAX_SPLITS == 0


# -- a row's keys split among walkers: small grids on a large GPU -----------------------------
@pytest.mark.parametrize("splits", [2, 4])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "B, H, G, Q, K, d, causal, lens",
    STREAMED_CASES + [(1, 2, 1, 3, 2, 3, False, None)],  # and fewer keys than walkers
)
def test_walkers_that_split_the_keys_give_the_same_attention(splits, dtype, B, H, G, Q, K, d, causal, lens):
    """With ``splits`` walkers a row (attention.cu: each takes every splits-th key in the forward
    and dQ, every splits-th query in dK/dV, and they merge at the end), the kernels give the
    tiles' results: the walkers' running maxima, sums and outputs merge into the whole row's."""
    check_attention(emulated(attention_splits=splits), B, H, G, Q, K, d, dtype, causal, lens)


@pytest.mark.parametrize("splits", [2, 4])
def test_walkers_with_a_learned_windowed_bias_and_its_gradient(splits):
    """The bias table's gradient with walkers: a tile's ds comes from every walker of its rows
    before the block sums its diagonals, in tiles of QUERY_ROWS / splits queries; three such
    tiles, a window both ways and lengths."""
    bias = relative_table(np.random.default_rng(7), 2, 40, 45, np.float64, 9, 3, 0)
    check_attention(
        emulated(attention_splits=splits), 2, 2, 2, 40, 45, 8, np.float64, False, [40, 20], bias=bias, table_grad=True
    )


@pytest.mark.parametrize("dtype, d", [(np.float32, 128), (np.float64, 64)])
def test_four_walkers_of_four_threads_in_the_widest_rows(dtype, d):
    """16 threads a row (four threads hold each row, four walkers split its keys): the shuffles
    of a dot product and of the merge reach across the whole row within one warp."""
    check_attention(emulated(attention_splits=4), 1, 2, 1, 20, 19, d, dtype, True, None)


@pytest.mark.parametrize(
    "rows, split, multiprocessors, expected",
    [
        (8 * 4096, 2, 132, 1),  # one sequence of 4,096 tokens, 8 heads, on 132 multiprocessors: full already
        (8 * 2048, 2, 132, 2),
        (8 * 1024, 2, 132, 4),  # 16,384 threads: 4 walkers give 65,536, 8 warps for each of 132
        (8 * 256, 2, 132, 4),  # no more than 4, however small
        (64 * 8 * 256, 2, 132, 1),  # nanoGPT's batch of 64: plenty of rows
        (8 * 1024, 4, 16, 1),  # a small GPU
    ],
)
def test_the_walkers_are_the_fewest_that_fill_the_gpu(rows, split, multiprocessors, expected):
    kernels = CudaKernels(np, load_module=RecordingModule, multiprocessors=multiprocessors)
    assert kernels.attention_splits(rows, split) == expected
    assert CudaKernels(np, attention_splits=2, multiprocessors=1).attention_splits(rows, split) == 2


def test_the_walkers_are_asked_of_the_current_gpu_once():
    """Without ``multiprocessors``, the launcher asks CuPy for the current device's count (the
    stand-in answers 132, an H200's) once; NumPy (the emulator) has none and counts as one."""
    from fake_cupy import FakeCupy

    cupy = FakeCupy()
    asked = []
    properties = cupy.cuda.runtime.getDeviceProperties
    cupy.cuda.runtime.getDeviceProperties = lambda device: asked.append(device) or properties(device)
    kernels = CudaKernels(cupy, load_module=RecordingModule)
    assert [kernels.attention_splits(8 * 1024, 2) for _ in range(3)] == [4, 4, 4] and asked == [0]
    assert CudaKernels(np, load_module=RecordingModule).attention_splits(100, 2) == 2  # 200 threads < 256


def test_the_walkers_are_refused_unless_1_2_or_4():
    for wrong in (0, 3, 8, "2"):
        with pytest.raises(ValueError, match=f"attention_splits must be None, 1, 2 or 4, got {wrong!r}"):
            CudaKernels(np, attention_splits=wrong)
    with pytest.raises(ValueError, match="multiprocessors must be at least 1, got 0"):
        CudaKernels(np, multiprocessors=0)


@pytest.mark.parametrize("splits", [1, 2, 4])
def test_the_walkers_launch_the_grid_and_scratch_of_their_rows(recorded, splits):
    """The launcher's side of the walkers: QUERY_ROWS / splits rows a block (a grid `splits`
    times as long), as many threads a block as ever, `splits` passed to every kernel, and the
    learned bias's scratch and partial sums sized by the dQ kernel's tiles of rows."""
    kernels = CudaKernels(np, load_module=RecordingModule, attention_splits=splits)
    q = k = v = grad = np.zeros((1, 2, 100, 16), np.float32)
    table = np.zeros((2, 199), np.float32)
    out, lse = kernels.attention_forward(q, k, v, None, True, 0.25, table=table)
    kernels.attention_backward(q, k, v, None, True, 0.25, out, lse, grad, table=table, table_grad=True)
    (name, grid, block, args), *backward = recorded
    rows = 64 // splits
    assert name == "attention_forward_d32_float32" and args[-1] == splits
    assert grid == (2 * -(-100 // rows),) and block == (2 * 64,)
    dq, dkv, bias_grad = backward
    assert [launch[1:3] for launch in (dq, dkv)] == [(grid, block)] * 2
    assert dq[3][-1] == dkv[3][-1] == splits
    scratch, partial = dq[3][10:12]
    assert scratch.shape == (grid[0], rows * 32) and partial.shape == (grid[0], 100 + rows - 1)
    assert bias_grad[3][-1] == rows


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_threads_of_a_row_read_a_tile_without_bank_conflicts(dtype):
    """attention.cu deals each row out to its threads in 16-byte chunks, chunk c to thread
    c % SPLIT: together the threads hold every column once, and at each step they read
    neighbouring chunks of a shared tile, which lie in different banks of shared memory (32 banks
    of 4 bytes), so the reads of one row never wait for each other. With walkers, each reads
    its own row of the tile at the same step: the rows' padding (``Split::stride``) starts them
    in different banks, so no bank serves more reads than the number of bytes asks for. Read
    from the kernel's own ``held_column`` and ``stride`` through the emulator."""
    from minitensor.kernels.cuda import ATTENTION_MAX_SPLITS, ATTENTION_ROW_SIZES, attention_split

    name, itemsize = np.dtype(dtype).name, np.dtype(dtype).itemsize
    ctype = "float" if dtype == np.float32 else "double"
    probes = "".join(
        f'extern "C" __global__ void held_columns_d{D}(int* out, int* stride) {{\n'
        f"    for (int c = 0; c < Split<{ctype}, {D}>::part; ++c)\n"
        f"        out[threadIdx.x * Split<{ctype}, {D}>::part + c] = held_column<{ctype}, {D}>(threadIdx.x, c);\n"
        f"    if (threadIdx.x == 0) *stride = Split<{ctype}, {D}>::stride;\n}}\n"
        for D in ATTENTION_ROW_SIZES[name]
    )
    module = EmulatedModule(source("attention") + probes)
    for D in ATTENTION_ROW_SIZES[name]:
        split = attention_split(dtype, D)
        part = D // split
        assert part * itemsize <= 128  # at most 128 bytes of a row a thread
        columns, stride = np.zeros(split * part, np.int32), np.zeros(1, np.int32)
        module.get_function(f"held_columns_d{D}")((1,), (split,), (columns, stride))
        columns = columns.reshape(split, part)
        assert sorted(columns.ravel()) == list(range(D))
        for c in range(0, part, 16 // itemsize):  # one 16-byte load per thread
            for splits in (1, 2, ATTENTION_MAX_SPLITS):  # walker w reads row w of the tile
                words = [
                    (w * int(stride[0]) + column) * itemsize // 4 + i
                    for w in range(splits)
                    for column in columns[:, c]
                    for i in range(4)
                ]
                reads_per_bank = np.bincount(np.array(words) % 32, minlength=32)
                assert reads_per_bank.max() == -(-len(words) // 32), (D, c, splits)


@pytest.mark.parametrize("Q, K, causal", [(20, 13, True), (9, 70, False), (70, 70, True)])
def test_streamed_attention_writes_every_gradient_row_not_zeroed_first(Q, K, causal):
    """dq, dk and dv start uninitialised (no zeroing launches): with every new buffer NaN, rows
    that see no key and keys that no query sees still come out 0, and the rest as the tiles'."""
    kernels = CudaKernels(_PoisonedEmpty(), load_module=EmulatedModule, row_threads=64, elementwise_threads=32)
    check_attention(kernels, 2, 2, 1, Q, K, 16, np.float64, causal, [Q, K // 2] if not causal else None)


def test_a_grid_too_large_for_cuda_is_refused_before_launching(recorded):
    from minitensor.kernels.cuda import _attention_grid

    assert _attention_grid(2 * 8, 4096) == 2 * 8 * 64
    with pytest.raises(ValueError, match="more than a CUDA grid holds"):
        _attention_grid(2**26, 2**12)


def test_the_row_size_is_the_smallest_kernel_that_holds_the_head(kernels):
    sizes = [kernels.attention_row_size(np.float32, d) for d in (1, 32, 33, 64, 65, 128, 129)]
    assert sizes == [32, 32, 64, 64, 128, 128, None]
    assert kernels.attention_row_size(np.float64, 100) is None and kernels.attention_row_size(np.float16, 8) is None
    check_attention(kernels, 1, 1, 1, 5, 7, 100, np.float32, True, None)  # d = 100 in rows of 128


@settings(max_examples=6)
@given(
    groups=st.sampled_from([(1, 1), (2, 1), (4, 2)]),
    Q=st.integers(1, 70),
    K=st.integers(1, 70),
    d=st.integers(1, 40),
    causal=st.booleans(),
    with_lens=st.booleans(),
    window=st.sampled_from([None, "none", 0, 3, 40]),  # None: no bias; "none": a bias, no window
    offsets=st.tuples(st.integers(0, 50), st.integers(0, 50)),
    seed=st.integers(0, 2**16),
    splits=st.sampled_from([None, 1, 2, 4]),  # walkers a row; None: as the launcher picks them
    dropout=st.sampled_from([0.0, 0.0, 0.3]),
)
def test_hypothesis_attention_shapes(groups, Q, K, d, causal, with_lens, window, offsets, seed, splits, dropout):
    rng = np.random.default_rng(seed)
    lens = rng.integers(0, K + 2, size=2) if with_lens else None
    bias = None
    if window is not None:  # a learned relative bias, with or without a window
        bias = relative_table(rng, groups[0], Q, K, np.float64, None if window == "none" else window, *offsets)
    kernels = emulated(attention_splits=splits)
    check_attention(kernels, 2, *groups, Q, K, d, np.float64, causal, lens, seed, bias, bias is not None, dropout)


@pytest.fixture
def kernel_calls(monkeypatch):
    """Device "emulated-cuda": the CPU backend plus the emulated attention kernels, as a GPU
    backend has them; returns the list of each ``attention_forward`` call's keyword arguments."""
    from minitensor.backends import _BACKENDS, NumpyBackend

    calls = []

    class EmulatedGPU(NumpyBackend):
        device = "emulated-cuda"
        attention_kernels = emulated()

    original = CudaKernels.attention_forward
    monkeypatch.setattr(
        CudaKernels, "attention_forward", lambda self, *a, **kw: calls.append(kw) or original(self, *a, **kw)
    )
    monkeypatch.setitem(_BACKENDS, "emulated-cuda", EmulatedGPU())
    return calls


def test_flash_attention_runs_the_kernels_on_a_backend_that_has_them(kernel_calls):
    """Through the op, under autograd: gradcheck in float64, the weights recomputed on demand,
    and the tiles still run where the kernels cannot (a bool mask)."""
    calls = kernel_calls
    rng = np.random.default_rng(3)
    q, k, v = (
        mt.tensor(rng.standard_normal((1, 2, 6, 4)), dtype=mt.float64, device="emulated-cuda", requires_grad=True)
        for _ in range(3)
    )
    lens = mt.tensor([5], device="emulated-cuda")
    assert mt.gradcheck(lambda a, b, c: flash_attention(a, b, c, valid_lens=lens, causal=True), [q, k, v])
    assert calls
    plan = stream_plan(q, k, v, lens, causal=True)
    FlashAttention.apply(q, k, v, None, plan=plan, masks=plan.masks)
    cpu = [mt.tensor(x.numpy()) for x in (q, k, v)]
    reference = stream_plan(*cpu, mt.tensor([5]), causal=True, block_q=2, block_k=2)
    FlashAttention.apply(*cpu, None, plan=reference, masks=reference.masks)
    np.testing.assert_allclose(plan.weights(), reference.weights(), rtol=1e-12, atol=1e-15)
    calls.clear()
    mask = mt.tensor(rng.random((1, 1, 6, 6)) > 0.3, device="emulated-cuda")
    flash_attention(q, k, v, mask=mask)
    assert calls == []  # a bool mask: the tiles


@pytest.mark.parametrize("positional", ["alibi", "sliding_window", "t5_relative"])
def test_a_layers_relative_bias_takes_the_kernels(kernel_calls, positional):
    """A streamed MultiHeadAttention with a "scores" encoding declaring ``relative`` (ALiBi, a
    sliding window: fixed tables; T5: a learned one, which gets its gradient from the kernels)
    runs the GPU kernels, as the same layer with no bias does, and computes what the CPU
    computes, gradients included."""
    options = {"window": 6} if positional == "sliding_window" else {}
    mt.manual_seed(0)
    layer = mt.nn.MultiHeadAttention(
        16, 4, positional=positional, positional_options=options, fused=True, dtype=mt.float64
    )
    grads = same_on_the_cpu_and_the_emulated_gpu(layer, np.random.default_rng(4).standard_normal((2, 20, 16)))
    assert len(kernel_calls) == 1 and kernel_calls[0]["table"] is not None
    assert kernel_calls[0]["window"] == options.get("window")
    assert len(grads) == 5 + (positional == "t5_relative")  # X, the four projections (, T5's table)


def same_on_the_cpu_and_the_emulated_gpu(layer, x, lens=None, seed=None):
    """``layer`` (float64) run on the CPU, then on "emulated-cuda" (``mt.manual_seed(seed)``
    before each, if given): the same output and gradients (of X and of every parameter),
    which are returned."""
    outputs, grads = [], []
    for device in ("cpu", "emulated-cuda"):
        layer.to(device)
        layer.zero_grad()
        X = mt.tensor(x, dtype=mt.float64, device=device, requires_grad=True)
        if seed is not None:
            mt.manual_seed(seed)
        valid_lens = None if lens is None else mt.tensor(lens, device=device)
        out = layer(X, X, X, valid_lens=valid_lens, causal=True)
        (out * out).sum().backward()
        outputs.append(out.numpy())
        grads.append([X.grad.numpy()] + [p.grad.numpy() for p in layer.parameters()])
    np.testing.assert_allclose(outputs[1], outputs[0], rtol=1e-10, atol=1e-12)
    for got, want in zip(grads[1], grads[0]):
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
    return grads[0]


def test_a_training_layer_drops_in_the_kernels_what_the_cpu_drops(kernel_calls):
    """A streamed MultiHeadAttention in training with dropout on its weights: the GPU kernels
    get the seed the layer drew and drop inside the stream what the CPU's tiles drop with that
    seed (the same draw on both backends after ``mt.manual_seed``), gradients included."""
    mt.manual_seed(0)
    layer = mt.nn.MultiHeadAttention(16, 4, num_kv_heads=2, dropout=0.25, fused=True, dtype=mt.float64)
    x = np.random.default_rng(6).standard_normal((2, 20, 16))
    same_on_the_cpu_and_the_emulated_gpu(layer, x, lens=[20, 13], seed=9)
    assert len(kernel_calls) == 1 and kernel_calls[0]["dropout"][1] == round(0.25 * 2**32)
    layer.eval()  # no dropout in evaluation: the kernels get none
    with mt.no_grad():
        X = mt.tensor(x, dtype=mt.float64, device="emulated-cuda")
        layer(X, X, X, causal=True)
    assert kernel_calls[-1]["dropout"] is None


def test_the_emulator_stops_at_an_index_past_a_fixed_size_array():
    """A GPU would read or write a neighbour's memory; the emulator stops the process instead."""
    code = (
        "import numpy, sys\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "from cuda_emulator import EmulatedModule\n"
        "source = 'extern \"C\" __global__ void past_the_end(float* out, long long n) {\\n'\n"
        "source += '    __shared__ float tile[4];\\n    tile[threadIdx.x] = 1.0f;\\n    out[threadIdx.x] = n;\\n}\\n'\n"
        "kernel = EmulatedModule(source).get_function('past_the_end')\n"
        "kernel((1,), (int(sys.argv[2]),), (numpy.zeros(8, numpy.float32), numpy.int64(3)))\n"
        "print('finished')\n"
    )
    tests = str(Path(__file__).parent)
    within = subprocess.run([sys.executable, "-c", code, tests, "4"], capture_output=True, text=True)
    assert within.returncode == 0 and "finished" in within.stdout, within.stderr
    past = subprocess.run([sys.executable, "-c", code, tests, "8"], capture_output=True, text=True)
    assert past.returncode != 0 and "finished" not in past.stdout


def test_shared_memory_not_written_in_this_block_reads_nan():
    """A GPU's shared memory holds, at a block's start, whatever was there before; the emulator
    gives each block memory of its own, NaN until written (-1 for an integer), so that a kernel
    that reads a slot it did not write fails its test instead of reading zeros or an earlier
    block's values. (A ``load_tile`` that left a tile's padding unwritten passed every attention
    test while the emulator's shared memory was static: zeros at the start.)"""
    code = (
        'extern "C" __global__ void leftovers(float* out, long long* ints) {\n'
        "    __shared__ float tile[4];\n"
        "    __shared__ long long counts[2];\n"
        "    if (blockIdx.x == 0) tile[threadIdx.x] = 5.0f;  // block 1 writes nothing\n"
        "    if (threadIdx.x == 0) counts[0] = 7;  // and counts[1] is never written\n"
        "    __syncthreads();\n"
        "    out[blockIdx.x * 4 + threadIdx.x] = tile[threadIdx.x];\n"
        "    if (threadIdx.x == 0) ints[2 * blockIdx.x] = counts[0], ints[2 * blockIdx.x + 1] = counts[1];\n"
        "}\n"
    )
    out, ints = np.zeros(8, np.float32), np.zeros(4, np.int64)
    EmulatedModule(code).get_function("leftovers")((2,), (4,), (out, ints))
    assert out[:4].tolist() == [5.0] * 4 and np.isnan(out[4:]).all()
    assert ints.tolist() == [7, -1, 7, -1]
    with pytest.raises(ValueError, match="shared arrays only"):  # what the emulator cannot rewrite, it refuses
        EmulatedModule('extern "C" __global__ void scalar(float* out) {\n    __shared__ float total;\n}\n')


def test_a_shuffle_from_a_lane_that_is_not_there_reads_nan():
    """A shuffle that reads a lane which has returned, or which a partial warp (a block of fewer
    than 32 threads) does not have, gets an undefined value on a GPU; the emulator gives NaN, so
    that a reduction over lanes that are not there fails its test. The same sum over the lanes
    that are there is right."""
    code = (
        'extern "C" __global__ void lane_sum(float* out, int alive, int widest) {\n'
        "    if (threadIdx.x >= alive) return;  // these lanes have nothing to add\n"
        "    float v = float(threadIdx.x);\n"
        "    for (int offset = widest; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);\n"
        "    out[threadIdx.x] = v;\n"
        "}\n"
    )
    kernel = EmulatedModule(code).get_function("lane_sum")
    for threads, alive, widest, right in [(32, 32, 16, True), (32, 16, 16, False), (32, 16, 8, True),
                                          (16, 16, 16, False), (16, 16, 8, True)]:  # fmt: skip
        out = np.zeros(32, np.float32)
        kernel((1,), (threads,), (out, np.int32(alive), np.int32(widest)))
        if right:
            assert out[:alive].tolist() == [float(sum(range(alive)))] * alive, (threads, alive, widest)
        else:  # lane ^ 16 has returned, or is not in the block
            assert np.isnan(out[:alive]).all(), (threads, alive, widest)


DIVERGENT = """
extern "C" __global__ void divergent(float* out) {
    float v = float(threadIdx.x);
    if (threadIdx.x % 32 < 16) v += __shfl_xor_sync(0xffffffffu, v, 1);  // half of each warp shuffles
    __syncthreads();  // while the other half waits here
    out[threadIdx.x] = v;
}
"""


def test_threads_that_wait_at_different_barriers_stop_with_deadlock():
    """Half of each warp waits at a shuffle, the other half at __syncthreads(): neither barrier
    ever fills, and a GPU would hang (or, since Volta, give undefined values). The emulator's
    fibers find that no thread can go on and stop the process, naming the block, instead of
    waiting forever as threads would. (A thread that returns is no such case: it leaves its
    barriers, as on a GPU; the emulator's own tests above rely on it.)"""
    code = cuda_emulator.program(
        DIVERGENT, "divergent", "kernel((2,), (64,), (np.zeros(64, np.float32),))\nprint('finished')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=Path(cuda_emulator.__file__).parent.parent,
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode != 0 and "finished" not in done.stdout, done.stdout
    expected = "cuda emulator: deadlock in block 0: 64 of its 64 threads wait at a barrier"
    assert expected in done.stderr, done.stderr[-2000:]


NVCC = __import__("shutil").which("nvcc")


@pytest.mark.slow
@pytest.mark.skipif(NVCC is None, reason="needs NVIDIA's nvcc (the CUDA toolkit), absent here")
@pytest.mark.parametrize("name", sorted(KERNELS))
def test_each_source_compiles_for_a_gpu_and_its_rows_stay_in_registers(name, tmp_path):
    """What the emulator cannot see: NVIDIA's own compiler accepts the source (the emulator's g++
    takes things NVRTC refuses, such as a name only the emulator's header defines), every kernel
    the launcher looks up exists, and every kernel keeps its register arrays in registers (a
    spill to local memory costs a memory access per use).
    sm_80, the oldest GPU with TF32; ``-Xptxas -v`` reports each kernel's registers and spills."""
    cubin = tmp_path / f"{name}.cubin"
    done = subprocess.run(
        [NVCC, "-arch=sm_80", "-std=c++17", "-ftz=true", "-cubin", "-Xptxas", "-v", "-o", str(cubin),
         str(Path(cuda_emulator.__file__).parent.parent.parent / "minitensor/core/kernels/cuda" / f"{name}.cu")],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    spills = local_memory(done.stderr)
    assert set(KERNELS[name]) <= set(spills), sorted(set(KERNELS[name]) - set(spills))
    # a thread holds at most 128 bytes of each row (two threads a row, four for the widest): the
    # forward keeps two such parts in registers, dQ three and dK/dV four, with none spilled
    assert all(n == 0 for n in spills.values()), {k: n for k, n in spills.items() if n}


def local_memory(report):
    """{kernel: bytes of local memory} from ptxas's ``-v`` report (nvcc's or NVRTC's): its stack
    frame and spill stores, an array indexed at run time or registers spilled."""
    kernel, spills = None, {}
    for line in report.splitlines():
        if "Compiling entry function" in line:
            kernel = line.split("'")[1]
        elif kernel and (found := re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores", line)):
            spills[kernel] = int(found[1]) + int(found[2])
    return spills


NVRTC_LIBRARY = nvrtc.library_path()


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["compute_80", "sm_90"])
def test_nvrtc_compiles_every_text_the_launcher_hands_to_cupy(arch):
    """What a GPU run compiles, compiled as it will be: every text the launcher gives
    ``cupy.RawModule`` (each source with its includes pasted in, the attention kernels one size
    and dtype at a time), by NVRTC, with this package's options and those CuPy adds, for the
    oldest GPU with TF32 (PTX, what CuPy makes for a GPU newer than its NVRTC knows) and for an
    H100 or H200 (a cubin: ptxas too, and no kernel may spill to local memory there either).
    NVRTC has no host headers, so it refuses what g++ (the emulator) and nvcc accept; and every
    kernel the launcher looks up must be in what it made.
    Needs libnvrtc, not a GPU: missing, it skips, and fails under CI=true (.ci/run installs it)."""
    if NVRTC_LIBRARY is None:
        message = "needs NVIDIA's NVRTC (pip install nvidia-cuda-nvrtc), absent here"
        if os.environ.get("CI") == "true":
            pytest.fail("under CI=true the kernels must compile with NVRTC: " + message)
        pytest.skip(message)
    compiler = nvrtc.Nvrtc(NVRTC_LIBRARY)
    texts, spills = [], {}

    class Compiled:
        """``load_module`` for the launcher: NVRTC compiles the text; a kernel must be in it."""

        def __init__(self, code):
            texts.append(code)
            options = NVRTC_OPTIONS + nvrtc.CUPY_OPTIONS + (f"-arch={arch}",)
            if arch.startswith("sm_"):  # ptxas runs: its report, as in the nvcc test above
                options += ("--ptxas-options=-v",)
            compiled, log = compiler.compile(code, options)
            spills.update(local_memory(log))
            assert compiled is not None, (
                f"NVRTC {compiler.version} refused a text of {code.count(chr(10))} lines:\n{log}"
            )
            self.entries = nvrtc.entries(compiled)

        def get_function(self, name):
            assert name in self.entries, f"{name} is not a kernel of what NVRTC compiled"
            return name

    names = CudaKernels(np, load_module=Compiled).compile_all()
    assert len(names) == sum(len(kernels) for kernels in KERNELS.values())
    # softmax, elementwise, multi_tensor, layer_norm; attention's five (D, dtype) and two bias kernels
    assert len(texts) == len(KERNELS) - 1 + 7
    if arch.startswith("sm_"):  # on the H100 / H200 too, every kernel keeps its arrays in registers
        assert set(names) <= set(spills) and not any(spills.values()), {k: n for k, n in spills.items() if n}
