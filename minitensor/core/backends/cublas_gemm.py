"""float32 matrix products on bfloat16 tensor cores: ``set_float32_matmul_precision("medium")``
on a GPU, by one call of cuBLAS's ``cublasGemmStridedBatchedEx``.

PyTorch's "medium" lets a float32 product round its inputs to bfloat16 (8 bits of mantissa, the
exponent and so the range of float32) and sum the products in float32, on the tensor cores'
bfloat16 path, about twice the TF32 path's rate on an A100 or H100. cuBLAS offers it as the
compute type ``CUBLAS_COMPUTE_32F_FAST_16BF`` for float32 data; CuPy's own products never ask for
it (its compute-type setting maps "BF16" to plain float32 for float32 data), so minitensor's
products (``ops/matmul.py``, through ``Backend.matmul``) make the call themselves here.

cuBLAS reads matrices column-major (Fortran order) and NumPy lays them out row-major, so a
row-major C = A B is computed as its transpose, the column-major C^T = B^T A^T, which has the
very memory of the row-major C. Each operand's memory serves as it is, without a copy, where it
is one of two layouts:

- rows contiguous (row-major, rows ``ld`` numbers apart): seen column-major, the memory of a
  row-major X is X^T, taken with ``CUBLAS_OP_N``;
- columns contiguous (a transposed view, such as attention's K^T or Linear's W^T): the memory is
  X column-major, taken with ``CUBLAS_OP_T``.

A stack of matrices (batched products, attention's heads) must lie evenly spaced, one stride
apart, or be one matrix broadcast over the stack (stride 0); any other operand is copied first.
``gemm_arguments`` works this out from shapes and strides alone, so the tests check it on the CPU
by running the same call in NumPy (``tests/test_cublas_gemm.py``); ``launch`` makes it.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any, NamedTuple

import numpy

Array = Any  # a CuPy array (NumPy's in the tests)

CUBLAS_OP_N, CUBLAS_OP_T = 0, 1
CUBLAS_POINTER_MODE_HOST = 0  # cublasPointerMode_t: alpha and beta are read from host memory
CUDA_R_32F = 0  # cudaDataType_t (library_types.h)
CUBLAS_COMPUTE_32F_FAST_16BF = 75  # cublasComputeType_t (cublas_api.h)
CUBLAS_GEMM_DEFAULT_TENSOR_OP = 99
_INT32_MAX = 2**31 - 1


class Operand(NamedTuple):
    """How cuBLAS reads one operand: the array whose memory it reads (the operand itself, or a
    contiguous copy), its ``trans`` flag, leading dimension and stride between matrices."""

    array: Any
    trans: int
    ld: int
    stride: int


class GemmArguments(NamedTuple):
    """One ``cublasGemmStridedBatchedEx`` call computing out (batch..., M, N) = a @ b: cuBLAS's
    m, n, k are N, M, K, its first operand is ``b``'s memory and its second ``a``'s."""

    shape: tuple[int, ...]  # the output's
    m: int
    n: int
    k: int
    first: Operand  # b
    second: Operand  # a
    ldc: int
    stride_c: int
    batch_count: int


def gemm_arguments(xp: Any, a: Array, b: Array) -> GemmArguments | None:
    """The call for a (..., M, K) @ b (..., K, N), float32, or None where a plain ``a @ b``
    should take it (fewer than two axes, no element, shapes that do not fit: ``a @ b`` gives
    NumPy's answer or error; sizes beyond cuBLAS's 32-bit counts)."""
    if a.ndim < 2 or b.ndim < 2 or a.shape[-1] != b.shape[-2] or not (a.size and b.size):
        return None
    try:
        batch = tuple(numpy.broadcast_shapes(a.shape[:-2], b.shape[:-2]))
    except ValueError:
        return None
    (M, K), N = a.shape[-2:], b.shape[-1]
    count = math.prod(batch)
    if max(M, N, K, count) > _INT32_MAX:
        return None
    return GemmArguments(
        batch + (M, N), N, M, K, _operand(xp, b, batch), _operand(xp, a, batch), N, M * N, count
    )  # fmt: skip


def _operand(xp: Any, x: Array, batch: tuple[int, ...]) -> Operand:
    """How cuBLAS reads ``x`` (..., R, C) broadcast to the stack ``batch`` (see the module's
    docstring): in place where its layout allows, else from a contiguous copy."""
    R, C = x.shape[-2:]
    lead = (1,) * (len(batch) - (x.ndim - 2)) + tuple(x.shape[:-2])
    if any(n != 1 for n in lead) and lead != batch:  # broadcast along some batch axes only
        x = xp.ascontiguousarray(xp.broadcast_to(x, batch + (R, C)))
    found, stride = _layout(x), _stack_stride(x)
    if found is None or stride is None:
        x = xp.ascontiguousarray(x)
        found, stride = _layout(x), _stack_stride(x)
    assert found is not None and stride is not None  # (a contiguous copy has both)
    trans, ld = found
    return Operand(x, trans, ld, stride)


def _layout(x: Array) -> tuple[int, int] | None:
    """(trans, ld) of one matrix of ``x`` as it lies in memory, or None when it lies otherwise."""
    R, C = x.shape[-2:]
    size = x.itemsize
    row, column = x.strides[-2:]
    if row % size or column % size or row < 0 or column < 0:
        return None
    row, column = row // size, column // size
    if (C == 1 or column == 1) and (R == 1 or row >= C):  # rows contiguous, ld apart
        return CUBLAS_OP_N, max(row if R > 1 else C, C, 1)
    if (R == 1 or row == 1) and (C == 1 or column >= R):  # columns contiguous
        return CUBLAS_OP_T, max(column if C > 1 else R, R, 1)
    return None


def _stack_stride(x: Array) -> int | None:
    """The distance, in numbers, between successive matrices of the stack ``x`` flattened over
    its batch axes: 0 for one matrix (or one broadcast over the stack), None when they are not
    evenly spaced."""
    axes = [(n, s) for n, s in zip(x.shape[:-2], x.strides[:-2], strict=True) if n != 1]
    if all(s == 0 for _, s in axes):
        return 0
    expected = axes[-1][1]
    for n, s in reversed(axes):
        if s != expected:
            return None
        expected = s * n
    stride = axes[-1][1]
    return stride // x.itemsize if stride > 0 and stride % x.itemsize == 0 else None


def bf16_matmul(xp: Any, a: Array, b: Array) -> Array:
    """a @ b for float32 CuPy arrays on bfloat16 tensor cores (``CUBLAS_COMPUTE_32F_FAST_16BF``):
    the inputs rounded to bfloat16, the products summed in float32, a float32 result. Falls
    back to ``a @ b`` where ``gemm_arguments`` says so."""
    call = gemm_arguments(xp, a, b)
    if call is None:
        return a @ b
    out = xp.empty(call.shape, dtype=numpy.float32)
    launch(xp, call, out)
    return out


def launch(xp: Any, call: GemmArguments, out: Array) -> None:
    """The cuBLAS call itself, on CuPy's handle (and so its current stream): out = a @ b.

    alpha = 1 and beta = 0 are passed as host pointers, which cuBLAS reads as such only in the
    handle's host pointer mode: CuPy's default, but a handle is shared (CuPy's own BLAS calls
    switch it to device mode for some routines), so the mode is set for the call and put back."""
    one, zero = numpy.ones(1, numpy.float32), numpy.zeros(1, numpy.float32)  # read at the call
    cublas, handle = xp.cuda.cublas, xp.cuda.get_cublas_handle()
    with _host_pointer_mode(lambda: cublas.getPointerMode(handle), lambda mode: cublas.setPointerMode(handle, mode)):
        cublas.gemmStridedBatchedEx(
            handle,
            *_gemm_arguments(
                call, out, one, zero, CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_16BF, CUBLAS_GEMM_DEFAULT_TENSOR_OP
            ),
        )


def _gemm_arguments(
    call: GemmArguments, out: Array, one: Any, zero: Any, data_type: int, compute_type: int, algo: int
) -> tuple[Any, ...]:
    """The arguments of ``cublasGemmStridedBatchedEx`` after its handle, for ``call`` into
    ``out``: alpha and beta at the host addresses of ``one`` and ``zero`` (NumPy arrays the
    caller keeps alive through the call)."""
    first, second = call.first, call.second
    return (
        first.trans, second.trans, call.m, call.n, call.k,
        one.ctypes.data,
        first.array.data.ptr, data_type, first.ld, first.stride,
        second.array.data.ptr, data_type, second.ld, second.stride,
        zero.ctypes.data,
        out.data.ptr, data_type, call.ldc, call.stride_c,
        call.batch_count, compute_type, algo,
    )  # fmt: skip


@contextlib.contextmanager
def _host_pointer_mode(get_mode: Any, set_mode: Any) -> Iterator[None]:
    """The handle in host pointer mode for the block (alpha and beta go as host pointers), its
    mode put back after: CuPy shares the handle, and its own BLAS calls switch some to device mode."""
    mode = get_mode()
    if mode != CUBLAS_POINTER_MODE_HOST:
        set_mode(CUBLAS_POINTER_MODE_HOST)
    try:
        yield
    finally:
        if mode != CUBLAS_POINTER_MODE_HOST:
            set_mode(mode)


# -- products inside a CUDA graph's capture ----------------------------------------------------------
# CuPy refuses to call cuBLAS while a stream captures (each of its cuBLAS wrappers sets the
# handle's stream first, and that raises "calling cuBLAS API during stream capture is currently
# unsupported"; cuBLAS itself supports capture: the cuBLAS documentation's "CUDA Graphs Support").
# So a capture's products call cuBLAS here directly, through ctypes, on CuPy's handle with the
# capture's stream, with the compute type the precision asks for.
CUDA_R_64F = 1
CUBLAS_COMPUTE_32F, CUBLAS_COMPUTE_64F, CUBLAS_COMPUTE_32F_FAST_TF32 = 68, 70, 77
CUBLAS_GEMM_DEFAULT = -1
#: (data type, compute type) of a captured product, by dtype and float32 matmul precision
CAPTURED_TYPES = {
    ("float32", "highest"): (CUDA_R_32F, CUBLAS_COMPUTE_32F),
    ("float32", "high"): (CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32),
    ("float32", "medium"): (CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_16BF),
    ("float64", "highest"): (CUDA_R_64F, CUBLAS_COMPUTE_64F),
    ("float64", "high"): (CUDA_R_64F, CUBLAS_COMPUTE_64F),
    ("float64", "medium"): (CUDA_R_64F, CUBLAS_COMPUTE_64F),
}


class DirectCublas:
    """libcublas called through ctypes, not through CuPy: the library CuPy has already loaded
    (``dlopen`` of its soname, ``libcublas.so.<CUDA major>``, finds the loaded one) and CuPy's
    handle, taken before the capture began."""

    def __init__(self, xp: Any) -> None:
        import ctypes

        major = int(xp.cuda.runtime.runtimeGetVersion()) // 1000
        self.name = f"libcublas.so.{major}"
        self.lib = ctypes.CDLL(self.name)
        self.handle = ctypes.c_void_p(int(xp.cuda.get_cublas_handle()))
        p, i, ll = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong
        gemm: list[Any] = [p, i, i, i, i, i, p] + [p, i, i, ll] * 2 + [p, p, i, i, ll, i, i, i]
        self.lib.cublasSetStream_v2.argtypes = [p, p]
        self.lib.cublasGetPointerMode_v2.argtypes = [p, ctypes.POINTER(i)]
        self.lib.cublasSetPointerMode_v2.argtypes = [p, i]
        self.lib.cublasGemmStridedBatchedEx.argtypes = gemm
        self.xp, self.ctypes = xp, ctypes

    def _check(self, status: int, what: str) -> None:
        if status:
            raise RuntimeError(f"{what} failed: cuBLAS status {status}")

    def gemm(self, call: GemmArguments, out: Array, data_type: int, compute_type: int) -> None:
        """``out = a @ b`` on the current stream (the capture's): the call of ``launch``, direct."""
        ctypes, lib, handle = self.ctypes, self.lib, self.handle
        scalar = numpy.float64 if compute_type == CUBLAS_COMPUTE_64F else numpy.float32
        one, zero = numpy.ones(1, scalar), numpy.zeros(1, scalar)  # read at the call: baked into the graph
        self._check(lib.cublasSetStream_v2(handle, self.xp.cuda.get_current_stream().ptr), "cublasSetStream")
        mode = ctypes.c_int()

        def get_mode() -> int:
            self._check(lib.cublasGetPointerMode_v2(handle, ctypes.byref(mode)), "cublasGetPointerMode")
            return mode.value

        def set_mode(value: int) -> None:
            self._check(lib.cublasSetPointerMode_v2(handle, value), "cublasSetPointerMode")

        with _host_pointer_mode(get_mode, set_mode):
            arguments = _gemm_arguments(call, out, one, zero, data_type, compute_type, CUBLAS_GEMM_DEFAULT)
            self._check(lib.cublasGemmStridedBatchedEx(handle, *arguments), "cublasGemmStridedBatchedEx")


def captured_matmul(xp: Any, cublas: Any, a: Array, b: Array, precision: str) -> Array:
    """``a @ b`` inside a CUDA graph's capture, by ``cublas`` (a ``DirectCublas``): float32 at the
    matmul ``precision``'s compute type, float64 in float64; vectors as one-row or one-column
    matrices, as ``a @ b`` takes them. Refuses (``TypeError``) what cuBLAS's strided call cannot
    take in place of CuPy's product."""
    types = CAPTURED_TYPES.get((numpy.dtype(a.dtype).name, precision))
    if types is None or a.dtype != b.dtype:
        raise TypeError(
            f"cuda graph: a product of {a.dtype} and {b.dtype} cannot be captured (float32 or float64 only)"
        )
    vector_a, vector_b = a.ndim == 1, b.ndim == 1
    a2 = a[None, :] if vector_a else a
    b2 = b[:, None] if vector_b else b
    call = gemm_arguments(xp, a2, b2)
    if call is None:  # no element (a sum over nothing is 0), else shapes or sizes cuBLAS's call cannot take
        if a2.size and b2.size or a2.ndim < 2 or b2.ndim < 2 or a2.shape[-1] != b2.shape[-2]:
            raise TypeError(f"cuda graph: the product {a.shape} @ {b.shape} cannot be captured")
        batch = numpy.broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
        out = xp.zeros(batch + (a2.shape[-2], b2.shape[-1]), a.dtype)
    else:
        out = xp.empty(call.shape, dtype=a.dtype)
        cublas.gemm(call, out, *types)
    if vector_a:
        out = out[..., 0, :]
    if vector_b:
        out = out[..., 0]
    return out
