"""``mt.set_float32_matmul_precision``: how float32 matrix products are computed, as in PyTorch.

A GPU from the Ampere generation on (compute capability 8.0) multiplies float32 matrices
several times faster on its tensor cores if it may round the inputs to TF32 first: 10 bits
of mantissa instead of 23 (the exponent, and so the range, stays float32's), with the
products summed in float32. A product of length k then carries a relative error of about
2^-11 sqrt(k) instead of 2^-24 sqrt(k): far below what training notices, and why PyTorch
offers it and nanoGPT's ``train.py`` turns it on (``torch.backends.cuda.matmul.allow_tf32``).

- ``"highest"`` (the default, PyTorch's too): float32 products in float32.
- ``"high"``: TF32 tensor cores where the GPU has them, for every product (2-D and batched).
- ``"medium"``: bfloat16 tensor cores (8 bits of mantissa, float32's range, float32 sums), as in
  PyTorch, about twice TF32's rate on an A100 or H100, with 8 times TF32's rounding error. CuPy
  multiplies float32 data in TF32 at best, so the engine's products (every one goes through
  ``Backend.matmul``: matmul and Linear, the streamed attention's tiles, the GRU and the
  convolution, forward and backward) call cuBLAS for it themselves (``backends/cublas_gemm.py``).
  Before Ampere: float32.

The CPU ignores it: NumPy's BLAS has no such mode, so CPU results never change. Float64 and
float16 products are unaffected everywhere. ``minitensor train`` sets it from
``--matmul-precision`` (the GPU recipe ``--preset gpt-char-gpu`` asks for ``high``, as nanoGPT
does). See NVIDIA's "Accelerating AI Training with NVIDIA TF32 Tensor Cores" (2020) and the
PyTorch documentation of ``torch.set_float32_matmul_precision``.
"""

from .backends import _BACKENDS, _MATMUL_PRECISION

PRECISIONS = ("highest", "high", "medium")


def set_float32_matmul_precision(precision: str) -> None:
    """Let float32 matrix products use TF32 tensor cores on a GPU (``"high"``), bfloat16 ones
    (``"medium"``), or neither (``"highest"``). Applies to every device, now and later (on
    a GPU, to CuPy's cuBLAS handle of the calling thread)."""
    if precision not in PRECISIONS:
        raise ValueError(
            f"set_float32_matmul_precision: precision must be one of {', '.join(map(repr, PRECISIONS))}, "
            f"got {precision!r}"
        )
    _MATMUL_PRECISION[0] = precision  # a backend registered later starts from it too
    for backend in _BACKENDS.values():
        backend.set_float32_matmul_precision(precision)


def get_float32_matmul_precision() -> str:
    """What ``set_float32_matmul_precision`` last set: ``"highest"`` unless changed."""
    return _MATMUL_PRECISION[0]
