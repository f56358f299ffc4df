"""``backends/cublas_gemm.py``: the cuBLAS call behind ``set_float32_matmul_precision("medium")``.

Without a GPU the call itself cannot run, so ``run_like_cublas`` (``fake_cupy.py``) runs it in
NumPy as cuBLAS defines it (column-major matrices read from each operand's memory with its own ``trans``, ``ld``
and stride between matrices, the inputs rounded to bfloat16 and the products summed in float32):
if the arguments that ``gemm_arguments`` works out from shapes and strides were wrong, the
product would be. Every layout ``ops/matmul.py`` hands over is tried: contiguous, transposed
views, head-split views, broadcast stacks, padded rows.
"""

import numpy as np
import pytest
from fake_cupy import run_like_cublas, to_bfloat16
from hypothesis import given, settings
from hypothesis import strategies as st
from minitensor.backends.cublas_gemm import CUBLAS_OP_N, gemm_arguments


def rand(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def layouts(rng):
    """(name, a, b): the operands ops/matmul.py and the layers hand to a product."""
    q = rand(rng, 2, 7, 3, 8).transpose(0, 2, 1, 3)  # (2, 3, 7, 8), heads split from the features
    w = rand(rng, 6, 8)
    stack = rand(rng, 2, 3, 5, 8)
    yield "2-D", rand(rng, 7, 8), rand(rng, 8, 5)
    yield "Linear: X W^T (a transposed view)", rand(rng, 7, 8), w.T
    yield "Linear backward: G^T X", rand(rng, 7, 6).T, rand(rng, 7, 8)
    yield "scores Q K^T", stack, rand(rng, 2, 3, 9, 8).swapaxes(-1, -2)
    yield "weights @ V", rand(rng, 2, 3, 5, 9), rand(rng, 2, 3, 9, 4)
    yield "head-split queries (copied)", q, rand(rng, 2, 3, 8, 4)
    yield "a stack times one matrix", stack, rand(rng, 8, 4)
    yield "one matrix times a stack", rand(rng, 5, 8), rand(rng, 2, 3, 8, 4)
    yield "broadcast along one axis (copied)", rand(rng, 2, 1, 5, 8), rand(rng, 1, 3, 8, 4)
    yield "a stack from broadcast_to (stride 0)", np.broadcast_to(rand(rng, 5, 8), (4, 5, 8)), rand(rng, 4, 8, 3)
    yield "padded rows (a column slice)", rand(rng, 7, 12)[:, :8], rand(rng, 8, 10)[:, 2:7]
    yield "a row and a column", rand(rng, 1, 8), rand(rng, 8, 1)
    yield "decoding: one query", rand(rng, 2, 3, 1, 8), rand(rng, 2, 3, 8, 40)
    yield "reversed rows (copied)", rand(rng, 7, 8)[::-1], rand(rng, 8, 5)


@pytest.mark.parametrize("case", [name for name, _, _ in layouts(np.random.default_rng(0))])
def test_the_arguments_compute_a_at_b(case):
    a, b = next((a, b) for name, a, b in layouts(np.random.default_rng(0)) if name == case)
    call = gemm_arguments(np, a, b)
    want = np.matmul(a.astype(np.float64), b.astype(np.float64))
    np.testing.assert_allclose(run_like_cublas(call, bfloat16=False), want, rtol=1e-5, atol=1e-5)
    # on bfloat16 inputs: 8 bits of mantissa, an error of about 2^-9 per input, summed in float32
    np.testing.assert_allclose(run_like_cublas(call), want, rtol=0, atol=0.05 * np.abs(want).max() + 1e-3)


def test_operands_are_read_in_place_where_their_layout_allows():
    rng = np.random.default_rng(1)
    x, w = rand(rng, 7, 8), rand(rng, 6, 8)
    call = gemm_arguments(np, x, w.T)
    assert call.first.array.base is w and call.second.array is x  # no copy of either
    assert (call.first.trans, call.second.trans) != (CUBLAS_OP_N, CUBLAS_OP_N)  # W^T read as W, transposed
    stack, one = rand(rng, 2, 3, 5, 8), rand(rng, 8, 4)
    call = gemm_arguments(np, stack, one)
    assert call.second.stride == 5 * 8 and call.first.stride == 0 and call.batch_count == 6


@pytest.mark.parametrize(
    "a_shape, b_shape",
    [((3,), (3, 4)), ((2, 3), (4, 5)), ((0, 3), (3, 4)), ((2, 0), (0, 4)), ((2, 2, 3), (3, 3, 4))],
)
def test_what_cublas_should_not_take_falls_back_to_a_at_b(a_shape, b_shape):
    """A vector, shapes that do not fit or do not broadcast, no element: ``a @ b`` answers (or
    raises, in words ops/matmul.py turns into minitensor's)."""
    assert gemm_arguments(np, np.ones(a_shape, np.float32), np.ones(b_shape, np.float32)) is None


@settings(max_examples=60, deadline=None)
@given(
    batch_a=st.sampled_from([(), (1,), (3,), (2, 3), (2, 1), (1, 3)]),
    batch_b=st.sampled_from([(), (1,), (3,), (2, 3), (2, 1), (1, 3)]),
    M=st.integers(1, 6),
    K=st.integers(1, 6),
    N=st.integers(1, 6),
    transpose_a=st.booleans(),
    transpose_b=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_any_layout_and_broadcast(batch_a, batch_b, M, K, N, transpose_a, transpose_b, seed):
    try:
        np.broadcast_shapes(batch_a, batch_b)
    except ValueError:
        return
    rng = np.random.default_rng(seed)
    a = rand(rng, *batch_a, K, M).swapaxes(-1, -2) if transpose_a else rand(rng, *batch_a, M, K)
    b = rand(rng, *batch_b, N, K).swapaxes(-1, -2) if transpose_b else rand(rng, *batch_b, K, N)
    want = np.matmul(a.astype(np.float64), b.astype(np.float64))
    np.testing.assert_allclose(run_like_cublas(gemm_arguments(np, a, b), bfloat16=False), want, rtol=1e-5, atol=1e-5)


def test_bfloat16_rounding_keeps_8_bits():
    x = np.array([1.0, 1 + 2**-8, 1 + 2**-7, 3.14159265, -2.5e-3, 1e30], np.float32)
    y = to_bfloat16(x)
    assert y[0] == 1.0 and y[1] == 1.0 and y[2] == 1 + 2**-7  # 1 + 2^-8 is a tie: to even
    np.testing.assert_allclose(y, x, rtol=2**-8)


class RecordingCublas:
    """CuPy's ``cuda.cublas`` as ``launch`` uses it, recording calls; the handle starts in
    ``mode`` (0 host, 1 device: CuPy's own BLAS routines switch a shared handle to device mode)."""

    def __init__(self, mode):
        self.mode, self.calls = mode, []

    def getPointerMode(self, handle):  # noqa: N802  (cuBLAS's names)
        return self.mode

    def setPointerMode(self, handle, mode):  # noqa: N802
        self.calls.append(("setPointerMode", handle, mode))
        self.mode = mode

    def gemmStridedBatchedEx(self, handle, *args):  # noqa: N802
        self.calls.append(("gemm", handle, self.mode, args))


@pytest.mark.parametrize("mode", [0, 1], ids=["host mode", "device mode"])
def test_the_call_reads_alpha_and_beta_in_host_pointer_mode_and_leaves_the_handle_as_it_was(mode):
    """alpha and beta go as host pointers (``numpy`` arrays' addresses): cuBLAS must be in host
    pointer mode during the call, and the handle, which CuPy shares, is put back after it."""
    import types

    from minitensor.backends import cublas_gemm

    def on_device(array):  # a CuPy array's ``data.ptr``, here an address that names the operand
        return types.SimpleNamespace(data=types.SimpleNamespace(ptr=id(array)))

    rng = np.random.default_rng(0)
    call = gemm_arguments(np, rand(rng, 2, 3, 4), rand(rng, 2, 4, 5))
    call = call._replace(first=call.first._replace(array=on_device(call.first.array)),
                         second=call.second._replace(array=on_device(call.second.array)))  # fmt: skip
    recorder = RecordingCublas(mode)
    xp = types.SimpleNamespace(cuda=types.SimpleNamespace(cublas=recorder, get_cublas_handle=lambda: 7))
    cublas_gemm.launch(xp, call, on_device("out"))
    gemms = [c for c in recorder.calls if c[0] == "gemm"]
    assert len(gemms) == 1 and gemms[0][1] == 7 and gemms[0][2] == cublas_gemm.CUBLAS_POINTER_MODE_HOST
    args = gemms[0][3]  # transa, transb, m, n, k, alpha, A, Atype, lda, strideA, B, ..., beta, C, ...
    assert args[2:5] == (call.m, call.n, call.k) and args[-3:] == (2, 75, 99)  # batch, FAST_16BF, TENSOR_OP
    assert recorder.mode == mode  # as it was
    assert len(recorder.calls) == (1 if mode == 0 else 3)  # no pointer-mode calls where it was right


@pytest.mark.gpu
def test_the_enum_values_are_cupys():
    """cublas_gemm.py writes cuBLAS's enum values as numbers (CuPy names some, not all); where CuPy
    and its cuBLAS import (no GPU needed), they are CuPy's, and its call takes the 23 arguments
    passed (the stand-in's cuBLAS takes whatever it is given)."""
    cupy = pytest.importorskip("cupy")
    try:
        cublas = cupy.cuda.cublas  # loaded on first use, with the cuBLAS library
    except ImportError as e:
        pytest.skip(f"CuPy's cuBLAS does not load here: {e}")
    from minitensor.backends import cublas_gemm

    for name in ("CUBLAS_OP_N", "CUBLAS_OP_T", "CUBLAS_POINTER_MODE_HOST", "CUBLAS_COMPUTE_32F_FAST_16BF"):
        assert getattr(cublas_gemm, name) == getattr(cublas, name), name
    assert cublas_gemm.CUBLAS_GEMM_DEFAULT_TENSOR_OP == getattr(cublas, "CUBLAS_GEMM_DEFAULT_TENSOR_OP", 99)
    for name in ("CUBLAS_COMPUTE_32F", "CUBLAS_COMPUTE_64F", "CUBLAS_COMPUTE_32F_FAST_TF32", "CUBLAS_GEMM_DEFAULT"):
        assert getattr(cublas_gemm, name) == getattr(cublas, name, getattr(cublas_gemm, name)), (
            name
        )  # (a captured product's)
    assert cublas_gemm.CUDA_R_32F == 0  # cudaDataType_t's CUDA_R_32F (library_types.h)
    doc = cublas.gemmStridedBatchedEx.__doc__.splitlines()[0]  # Cython's signature line
    assert doc.count(",") + 1 == 23, doc


@pytest.mark.parametrize(
    "dtype, precision, types",
    [("float32", "highest", (0, 68)), ("float32", "high", (0, 77)), ("float32", "medium", (0, 75)),
     ("float64", "high", (1, 70))],
)  # fmt: skip
def test_a_captured_product_calls_cublas_directly_on_the_capture_stream(monkeypatch, dtype, precision, types):
    """Inside a CUDA graph's capture CuPy refuses its own cuBLAS calls, so ``captured_matmul`` calls
    libcublas through ctypes (``DirectCublas``): on CuPy's handle, with the current (capturing)
    stream, host pointer mode for alpha and beta (and the handle's mode put back), the
    precision's compute type, and the 23 arguments of ``cublasGemmStridedBatchedEx`` in order."""
    import ctypes
    import types as pytypes

    from minitensor.backends import cublas_gemm

    calls, loaded, alpha_beta = [], [], []

    class Function:
        def __init__(self, name):
            self.name, self.argtypes = name, None

        def __call__(self, *args):
            calls.append((self.name, args))
            if self.name == "cublasGemmStridedBatchedEx":  # alpha's and beta's bytes, while they live
                alpha_beta.extend(ctypes.string_at(args[i], 8) for i in (6, 15))
            if self.name == "cublasGetPointerMode_v2":
                args[1]._obj.value = 1  # device mode, as CuPy's own routines may leave the handle
            return 0

    class Library:
        def __getattr__(self, name):
            function = Function(name)
            setattr(self, name, function)
            return function

    monkeypatch.setattr(ctypes, "CDLL", lambda name: loaded.append(name) or loaded.append(Library()) or loaded[-1])
    stream = pytypes.SimpleNamespace(ptr=4242)
    runtime = pytypes.SimpleNamespace(runtimeGetVersion=lambda: 12040)
    cuda = pytypes.SimpleNamespace(runtime=runtime, get_cublas_handle=lambda: 7, get_current_stream=lambda: stream)

    class Device(np.ndarray):  # a NumPy array with CuPy's ``data.ptr``
        @property
        def data(self):
            return pytypes.SimpleNamespace(ptr=self.__array_interface__["data"][0])

    xp = pytypes.SimpleNamespace(
        cuda=cuda,
        empty=lambda shape, dtype: np.empty(shape, dtype).view(Device),
        ascontiguousarray=lambda x: np.ascontiguousarray(x).view(Device),
        broadcast_to=np.broadcast_to,
    )
    rng = np.random.default_rng(0)
    a = rng.standard_normal((2, 3, 4)).astype(dtype).view(Device)
    b = rng.standard_normal((4, 5)).astype(dtype).view(Device).T.T  # a view: read in place
    out = cublas_gemm.captured_matmul(xp, cublas_gemm.DirectCublas(xp), a, b, precision)
    assert loaded[0] == "libcublas.so.12" and out.shape == (2, 3, 5) and out.dtype == dtype
    names = [name for name, _ in calls]
    assert names == ["cublasSetStream_v2", "cublasGetPointerMode_v2", "cublasSetPointerMode_v2",
                     "cublasGemmStridedBatchedEx", "cublasSetPointerMode_v2"]  # fmt: skip
    assert calls[0][1][0].value == 7 and calls[0][1][1] == 4242
    assert calls[2][1][1] == cublas_gemm.CUBLAS_POINTER_MODE_HOST and calls[4][1][1] == 1  # put back
    args = calls[3][1]
    assert len(args) == 23 == len(loaded[1].cublasGemmStridedBatchedEx.argtypes)
    call = cublas_gemm.gemm_arguments(xp, a, b)
    assert args[1:6] == (call.first.trans, call.second.trans, call.m, call.n, call.k)
    assert args[8] == args[12] == args[17] == types[0] and args[-2:] == (types[1], cublas_gemm.CUBLAS_GEMM_DEFAULT)
    assert args[7] == b.data.ptr and args[11] == a.data.ptr and args[16] == out.data.ptr
    scalar = np.dtype(np.float64 if dtype == "float64" else np.float32)  # alpha 1, beta 0, as the compute's type
    assert [np.frombuffer(raw[: scalar.itemsize], scalar)[0] for raw in alpha_beta] == [1.0, 0.0]


def test_a_captured_product_of_nothing_is_zeros_and_one_too_large_is_refused():
    """No element: zeros of the product's shape (a sum over nothing), with no call; a count
    beyond cuBLAS's 32-bit ones: refused in words, never a wrong answer."""
    from minitensor.backends import cublas_gemm

    out = cublas_gemm.captured_matmul(np, None, np.ones((2, 3, 0), np.float32), np.ones((0, 4), np.float32), "high")
    assert out.shape == (2, 3, 4) and not out.any()
    huge = np.broadcast_to(np.ones(1, np.float32), (2**31, 1))  # 2^31 rows, no memory
    with pytest.raises(TypeError, match=r"product \(2147483648, 1\) @ \(1, 2\) cannot be captured"):
        cublas_gemm.captured_matmul(np, None, huge, np.ones((1, 2), np.float32), "highest")
    with pytest.raises(TypeError, match="float32 or float64 only"):
        cublas_gemm.captured_matmul(np, None, np.ones((2, 2), np.float16), np.ones((2, 2), np.float16), "high")


def test_every_product_of_the_ops_goes_through_the_backend():
    """The matmul precision and a CUDA graph's capture reach only the products that call
    ``Backend.matmul``: an array's ``@`` in an op would be CuPy's own product on a GPU, in float32
    at precision "medium" and refused inside a capture (as the GRU's were)."""
    import ast
    from pathlib import Path

    import minitensor.core.ops as ops

    found = []
    for path in sorted(Path(ops.__file__).parent.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.BinOp, ast.AugAssign)) and isinstance(node.op, ast.MatMult):
                found.append(f"{path.name}:{node.lineno}")
            if isinstance(node, ast.Attribute) and node.attr in ("matmul", "dot", "einsum", "tensordot"):
                if isinstance(node.value, ast.Name) and node.value.id in ("xp", "numpy", "np", "cupy"):
                    found.append(f"{path.name}:{node.lineno} ({node.value.id}.{node.attr})")
    assert not found, f"products that bypass Backend.matmul: {found}"
