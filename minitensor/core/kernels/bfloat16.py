"""float32 to bfloat16 and back, on the bits: the roundings of ``mt.autocast``'s products.

bfloat16 is float32's upper half: the same sign bit and 8 exponent bits, and the first 7 of the
23 mantissa bits. Read a float32 as a 32-bit unsigned integer ``u`` and a bfloat16 as a 16-bit
one ``h``:

- **widening** is exact: the 16 bits become a float32's upper half, its lower half zero::

      u = h << 16

- **narrowing** rounds to the nearest bfloat16, a tie to the one whose last bit is 0 (even)::

      h = (u + 0x7FFF + ((u >> 16) & 1)) >> 16

  Adding 0x7FFF carries into bit 16 exactly when the lower half is above 0x8000, and at 0x8000
  (a tie) exactly when bit 16, the last bit kept, is 1. A carry out of the mantissa raises the
  exponent, which is right (the next power of two), and the largest finite float32 numbers
  round up to infinity, as IEEE rounding does. A NaN is the exception: its lower bits may be all
  that makes it one (0x7F800001), and the rule would round it to infinity; it keeps its upper
  half with the quiet bit (0x0040) set.

- **rounding in place of a float32** (what a product's operands need: bfloat16 values, summed in
  float32) is a narrowing shifted back, ``h << 16``: one pass where a narrowing and a widening
  are two.

ml_dtypes, whose ``bfloat16`` is ``mt.bfloat16``, converts the same way (the tests compare
every kernel with its ``astype``, bit for bit; a NaN is a NaN, its payload aside) but one element
at a time through a C++ function;
these loops on integers are vectorised by LLVM, 1.3 to 5 times faster (``bench/autocast.py``).
The CPU backend's ``astype`` and ``round_to_bfloat16`` call them (``Backend.bfloat16_kernels``);
a GPU's are the CUDA kernels of the same names in ``cuda/elementwise.cu``, the same three lines.
Each takes and returns NumPy arrays of any shape; the result is C-contiguous (a transposed matrix
stays transposed).
"""

import numba
import numpy as np

from ..dtypes import bfloat16, float32
from .cpu import _kernel


@numba.njit(inline="always")
def _narrowed(u):
    """The bfloat16 bits nearest the float32 with bits ``u`` (module docstring)."""
    if u & 0x7FFFFFFF > 0x7F800000:  # NaN: keep it one, quiet
        return (u >> 16) | 0x0040
    return (u + 0x7FFF + ((u >> 16) & 1)) >> 16


def _narrow_loop(u, h):
    for i in numba.prange(u.size):
        h[i] = _narrowed(u[i])


def _round_loop(u, r):
    for i in numba.prange(u.size):
        r[i] = _narrowed(u[i]) << 16


def _widen_loop(h, u):
    for i in numba.prange(h.size):
        u[i] = np.uint32(h[i]) << 16


# One thread up to 2M elements, as the GELU's loops (kernels/gelu.py): a pass this light is bound
# by memory before a second thread pays for waking.
_OPTIONS = dict(cache=True, nogil=True, error_model="numpy")
_narrow_loop = _kernel(_narrow_loop, _OPTIONS, min_size=2**21)
_round_loop = _kernel(_round_loop, _OPTIONS, min_size=2**21)
_widen_loop = _kernel(_widen_loop, _OPTIONS, min_size=2**21)


def _run(loop, x, in_dtype, in_bits, out_bits, out_dtype):
    """``loop`` over ``x``'s elements, seen as ``in_bits`` integers, into a new array of x's shape
    and layout (C, or F for a transposed matrix; anything else is made C-contiguous first)."""
    if x.dtype != in_dtype:
        raise TypeError(f"bfloat16_{loop.__name__.split('_')[1]}: takes {in_dtype} arrays, got {x.dtype}")
    if x.flags.f_contiguous and not x.flags.c_contiguous:
        return _run(loop, x.T, in_dtype, in_bits, out_bits, out_dtype).T
    x = x if x.flags.c_contiguous else x.copy()  # (not ascontiguousarray, which makes a 0-d array 1-d)
    out = np.empty(x.shape, out_bits)
    loop(x.reshape(-1).view(in_bits), out.reshape(-1))
    return out.view(out_dtype)


def bfloat16_narrow(x):
    """float32 ``x`` rounded to bfloat16 (``x.astype(mt.bfloat16)``)."""
    return _run(_narrow_loop, x, float32, np.uint32, np.uint16, bfloat16)


def bfloat16_widen(x):
    """bfloat16 ``x`` as float32, exactly (``x.astype(np.float32)``)."""
    return _run(_widen_loop, x, bfloat16, np.uint16, np.uint32, float32)


def bfloat16_round(x):
    """float32 ``x``'s values rounded to bfloat16, kept in float32 (a narrowing widened again)."""
    return _run(_round_loop, x, float32, np.uint32, np.uint32, float32)
