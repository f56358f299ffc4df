"""Tests for float32 <-> bfloat16 on the bits (``minitensor/core/kernels/bfloat16.py``) and the
backends' ``astype`` and ``round_to_bfloat16``, which ``mt.autocast``'s products call.

ml_dtypes' ``astype`` is the reference, bit for bit, on any float32 bit pattern (NaN: a NaN). The
CUDA kernels of the same names are tested in ``test_cuda_kernels.py``, in the CUDA emulator."""

import numpy as np
import pytest
from fake_cupy import fake_cuda_backend
from hypothesis import given
from hypothesis import strategies as st
from minitensor.kernels.bfloat16 import bfloat16_narrow, bfloat16_round, bfloat16_widen

import minitensor as mt

BF16 = mt.bfloat16
SPECIAL_BITS = [
    0x00000000, 0x80000000,  # signed zeros
    0x7F800000, 0xFF800000,  # infinities
    0x7F7FFFFF, 0xFF7FFFFF, 0x7F7F7FFF, 0x7F7F8000,  # the largest floats: up to infinity, or not
    0x3F808000, 0x3F818000,  # ties: to the even neighbour, down and up
    0x3F807FFF, 0x3F808001,  # just below and above a tie
    0x3FFFFFFF,  # a carry into the exponent: 2.0
    0x00000001, 0x00008000, 0x00018000, 0x807FFFFF,  # subnormals
    0x7F800001, 0x7FC00000, 0xFFFFFFFF, 0x7FBFFFFF,  # NaNs, one with only its lowest bit set
]  # fmt: skip


def as_floats(bits):
    return np.asarray(bits, dtype=np.uint32).view(np.float32)


def reference(x):
    with np.errstate(invalid="ignore"):  # (ml_dtypes warns of each NaN it casts)
        return x.astype(BF16)


def assert_same_bits(got, want):
    """Equal bit patterns, but any NaN for a NaN."""
    got16, want16 = got.astype(np.float32), want.astype(np.float32)
    nan = np.isnan(want16)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(np.isnan(got16), nan)
    np.testing.assert_array_equal(got16[~nan].view(np.uint32), want16[~nan].view(np.uint32))


def test_special_values_round_as_ml_dtypes():
    x = as_floats(SPECIAL_BITS)
    assert_same_bits(bfloat16_narrow(x), reference(x))
    assert_same_bits(bfloat16_round(x), reference(x).astype(np.float32))
    assert bfloat16_narrow(as_floats([0x7F800001]))[0] != np.inf  # a NaN does not become infinity


@given(st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=300))
def test_any_float32_bits_round_as_ml_dtypes(bits):
    x = as_floats(bits)
    assert_same_bits(bfloat16_narrow(x), reference(x))
    assert_same_bits(bfloat16_round(x), reference(x).astype(np.float32))


def test_every_bfloat16_widens_exactly():
    h = np.arange(2**16, dtype=np.uint32).astype(np.uint16).view(BF16)
    assert_same_bits(bfloat16_widen(h), h.astype(np.float32))


@pytest.mark.parametrize(
    "make",
    [
        lambda a: a,
        lambda a: a.T,  # stays a transposed (F-contiguous) array
        lambda a: a[:, ::3],
        lambda a: a[2],
        lambda a: a[2, 3][()] * np.ones((), np.float32),  # 0-d
        lambda a: a[:0],
    ],
    ids=["C", "F", "strided", "1-d", "0-d", "empty"],
)
def test_any_shape_and_layout(make):
    x = make(np.random.default_rng(0).standard_normal((6, 9)).astype(np.float32))
    for got, want in [
        (bfloat16_narrow(x), reference(x)),
        (bfloat16_round(x), reference(x).astype(np.float32)),
        (bfloat16_widen(reference(x)), reference(x).astype(np.float32)),
    ]:
        assert_same_bits(got, want)
        assert got.flags.c_contiguous or got.flags.f_contiguous


def test_transposes_keep_their_layout_and_wrong_dtypes_are_refused():
    x = np.ones((3, 5), np.float32).T
    assert bfloat16_narrow(x).flags.f_contiguous and bfloat16_round(x).flags.f_contiguous
    with pytest.raises(TypeError, match="bfloat16_narrow: takes float32 arrays, got float64"):
        bfloat16_narrow(np.zeros(3))
    with pytest.raises(TypeError, match="bfloat16_widen: takes bfloat16 arrays, got float32"):
        bfloat16_widen(np.zeros(3, np.float32))


def backends():
    cpu = mt.get_backend("cpu")
    return {"cpu": cpu, "strict": mt.get_backend("strict"), "cuda stand-in": fake_cuda_backend()}


@pytest.mark.parametrize("name", ["cpu", "strict", "cuda stand-in"])
def test_backends_convert_alike(name):
    """The CPU's numba kernels, the strict device's ml_dtypes casts and the CuPy backend's kernels
    (the stand-in runs the CPU's under the GPU's names) give the same bits."""
    backend = backends()[name]
    x = np.concatenate([as_floats(SPECIAL_BITS), np.random.default_rng(1).standard_normal(50).astype(np.float32)])
    on = backend.array(x)
    narrow = backend.astype(on, BF16)
    assert_same_bits(backend.to_numpy(narrow), reference(x))
    assert_same_bits(backend.to_numpy(backend.astype(narrow, np.float32)), reference(x).astype(np.float32))
    assert_same_bits(backend.to_numpy(backend.round_to_bfloat16(on)), reference(x).astype(np.float32))
    assert_same_bits(backend.to_numpy(backend.round_to_bfloat16(narrow)), reference(x).astype(np.float32))
    assert backend.to_numpy(backend.astype(on[-50:], np.float64)).dtype == np.float64  # others: astype's


def test_astype_copies_as_numpy_does_and_the_plain_path_is_the_same():
    cpu = mt.get_backend("cpu")
    x = np.linspace(-3, 3, 101, dtype=np.float32)
    assert cpu.astype(x, np.float32, copy=False) is x and cpu.astype(x, np.float32) is not x
    fast = cpu.astype(x, BF16)
    plain = type(cpu)()
    plain.use_fused_kernels = False  # ml_dtypes' casts, the definition
    assert plain.bfloat16_kernels is None
    assert_same_bits(fast, plain.astype(x, BF16))
    assert_same_bits(cpu.round_to_bfloat16(x), plain.round_to_bfloat16(x))
