"""Numba CPU kernels for row-wise softmax and log-softmax.

Every kernel takes C-contiguous 2-D arrays of shape ``(rows, n)`` (float32 or
float64) and works on each row independently, so the outer loop is a
``numba.prange`` that spreads rows over threads.  The kernels are compiled
lazily on their first call (``numba.njit`` never compiles at import time) and
``cache=True`` stores the machine code on disk so that the next process skips
compilation.  Callers pass C-contiguous arrays; the kernels check only what
would otherwise read out of bounds (one ``lens`` entry per row, ``y`` and
``g`` of equal shape) and raise ``ValueError`` for it.

The algorithm
-------------
For one row ``x`` of which only the first ``L`` entries are valid::

    m   = max_{j<L} x_j
    e_j = exp(x_j - m)                      for j < L
    s   = sum_{j<L} e_j
    softmax(x)_j     = e_j / s              (0 for j >= L)
    log_softmax(x)_j = (x_j - m) - log(s)   (-inf for j >= L)

*Why subtract the max?*  Softmax is invariant to adding a constant to every
logit, and after subtracting the max every exponent is <= 0: ``exp`` cannot
overflow (logits of 1e4 are fine) and at least one term equals exactly 1, so
``s >= 1`` and the division and the log are always well defined.

*Why does a fully masked row give zeros?*  If the row has no valid entry
(``L == 0``) or all of them are ``-inf``, then ``m == -inf`` and the formula
would compute ``-inf - (-inf) = NaN``.  Such a row has no probability mass to
distribute: it is treated as an empty distribution, so softmax returns all
zeros and log-softmax returns all ``-inf`` (log 0).  Spreading uniform weights
over entries the caller said do not exist would be wrong, and NaN would poison
every gradient that touches the row.

The backward passes follow from the Jacobian of softmax,
``dy_i/dx_j = y_i (delta_ij - y_j)``::

    softmax:      dx = y * (g - sum_j g_j y_j)
    log_softmax:  dx = g - exp(y) * sum_j g_j

Masked entries need no special case in the softmax backward because their
``y`` is 0.  In the log-softmax backward they have ``y = -inf``; they are
excluded from the sum and get a zero gradient.

Making it fast
--------------
Each row is processed by a few small loops (max; exp and sum; scale), each
simple enough for LLVM to turn into SIMD code; rows are spread over threads.
Four obstacles had to be removed, each found by measuring with
``bench/softmax.py`` (its figures, before and after, are in bench/README.md):

1. ``math.exp`` compiles to one scalar libm call per element (llvmlite ships
   no vector math library), which left the kernel several times slower than
   PyTorch's.  For float32 we therefore use :func:`exp_f32`, an exp written
   with plain arithmetic and two bit tricks that LLVM vectorises (about 20
   AVX-512 instructions per 16 values).  float64 keeps ``math.exp``: float64 is used
   for gradient checks, where accuracy matters more than speed.
2. A running max written as ``if v > m: m = v`` or ``max(m, v)`` stayed
   scalar, even with fastmath ``nnan``.  :func:`_maximum` calls LLVM's
   ``llvm.maximum`` (the NaN-propagating max) instead, which LLVM vectorises
   as a reduction.
3. Floating-point sums are only vectorised if re-association is allowed.  We
   enable the fastmath flags that permit that (``reassoc``) and a few other
   harmless ones, but *not* ``nnan``/``ninf``: with those LLVM may assume no
   value is ever ``-inf`` and fold away exactly the tests that implement
   masking.
4. A Python float literal is float64 in Numba: ``m = -np.inf`` or ``1 / s``
   silently turned float32 rows into float64 arithmetic (and sent them to the
   scalar ``math.exp``).  Constants and accumulators are therefore created
   with the array's own scalar type, e.g. ``x.dtype.type(0)``.

Numba compiles a helper that does not set ``fastmath`` itself with the flags
of its first caller, so every helper sets its flags explicitly; the ones whose
rounding must not change (the exp and the log-softmax shift) use the strict
set ``{"contract"}``.
"""

import functools
import math
import os
import threading
from types import FunctionType

import numba
import numpy as np
from llvmlite import ir
from numba import prange, types
from numba.extending import intrinsic, overload

# Fastmath flags for the kernels.  Allowed: ignore the sign of zero (nsz),
# multiply by a reciprocal instead of dividing (arcp), fuse a*b+c into one FMA
# (contract), approximate library functions (afn) and re-associate sums
# (reassoc, what makes reductions vectorisable).  Deliberately missing:
# ``nnan`` and ``ninf``, which would let LLVM assume away -inf masking.
FASTMATH = {"nsz", "arcp", "contract", "afn", "reassoc"}

# Helpers whose exact evaluation order matters use these.  Setting fastmath
# explicitly also stops Numba from letting the helper inherit the caller's
# flags.
_STRICT = {"contract"}

_KERNEL_OPTIONS = dict(cache=True, fastmath=FASTMATH, error_model="numpy", nogil=True)
_HELPER_OPTIONS = dict(cache=True, fastmath=FASTMATH)

# Below this many elements a kernel runs on one thread. Waking the thread pool
# costs microseconds, more than a small softmax takes, and milliseconds when the
# other cores are busy -- with other processes, or with NumPy's own BLAS threads
# in the same training step, whose attention softmaxes (51,200 elements at D2L's
# size) are far below this threshold. bench/train_step.py shows the effect on a
# whole step; the measurements behind the threshold are in bench/README.md.
PARALLEL_MIN_SIZE = 2**18


# Which thread pool runs ``prange``: numba's own ("workqueue"), not OpenMP. A training step
# alternates numba kernels with matrix products on OpenBLAS's threads, and OpenMP's threads
# spin for milliseconds after each kernel, holding the cores that OpenBLAS needs next: at 2
# threads a Transformer step was slower than at 1 (bench/train_step.py, bench/README.md).
# The workqueue's threads sleep as soon as they are done. (A process that has loaded
# PyTorch shares PyTorch's OpenMP runtime too, so its settings cannot fix this.) Set before
# numba starts its threads; a layer the user chose through NUMBA_THREADING_LAYER is kept.
if "NUMBA_THREADING_LAYER" not in os.environ:
    numba.config.THREADING_LAYER = "workqueue"

# The workqueue serves one caller at a time and aborts the process if two threads launch
# kernels at once: a kernel called while another thread holds the pool runs serially.
_POOL = threading.Lock()


def _kernel(fn, options=_KERNEL_OPTIONS, min_size=None):
    """Compile ``fn`` twice (with numba's ``options``), each lazily on first use: with
    ``prange`` spread over threads for arrays of ``min_size`` elements or more (default
    :data:`PARALLEL_MIN_SIZE`), and as a plain loop for smaller ones.

    The serial twin is a copy of the function under another name: numba's disk
    cache is keyed by the function's name, not by the ``parallel`` flag, so the
    two versions must not share a name.
    """
    twin = FunctionType(fn.__code__, fn.__globals__, fn.__name__ + "_serial", fn.__defaults__, fn.__closure__)
    twin.__qualname__ = fn.__qualname__ + "_serial"
    parallel = numba.njit(parallel=True, **options)(fn)
    serial = numba.njit(parallel=False, **options)(twin)

    @functools.wraps(fn)
    def run(x, *args):
        if x.size >= (PARALLEL_MIN_SIZE if min_size is None else min_size) and _POOL.acquire(blocking=False):
            try:
                return run.parallel(x, *args)
            finally:
                _POOL.release()
        return run.serial(x, *args)

    run.parallel, run.serial = parallel, serial
    return run


# ---------------------------------------------------------------------------
# Two tiny LLVM intrinsics
# ---------------------------------------------------------------------------


@intrinsic
def _add_to_exponent(typingctx, y, k_bits):
    """``y * 2**k`` for float32 ``y``, where the low bits of ``k_bits`` hold ``k``.

    A float32 is ``sign | 8-bit exponent | 23-bit mantissa``, so multiplying
    by ``2**k`` just adds ``k`` to the exponent field: add the integer
    ``k << 23`` to the bits of ``y`` (valid while the result stays a normal
    number).  ``k_bits`` is the float ``k + 1.5 * 2**23`` whose integer
    representation ends in ``k`` (see :func:`exp_f32`); shifting it left by 23
    discards everything but those low bits.

    Numba cannot reinterpret a scalar's bits (``view`` exists only for arrays,
    and a round trip through memory would stop vectorisation), so this emits
    the LLVM instructions directly: two ``bitcast`` float->int (free: same
    register, new type), a ``shl``, an integer ``add`` and a ``bitcast`` back.
    All of them vectorise to single SIMD integer instructions.
    """
    if y != types.float32 or k_bits != types.float32:
        return None

    def codegen(context, builder, signature, args):
        i32 = ir.IntType(32)
        y_int = builder.bitcast(args[0], i32)
        k_int = builder.shl(builder.bitcast(args[1], i32), ir.Constant(i32, 23))
        return builder.bitcast(builder.add(y_int, k_int), ir.FloatType())

    return types.float32(types.float32, types.float32), codegen


@intrinsic
def _maximum(typingctx, a, b):
    """NaN-propagating ``max(a, b)`` via LLVM's ``llvm.maximum`` intrinsic.

    Unlike ``a if a > b else b``, LLVM vectorises a reduction over
    ``llvm.maximum`` without being told that NaNs cannot occur.
    """
    if a != b or not isinstance(a, types.Float):
        return None

    def codegen(context, builder, signature, args):
        ty = args[0].type
        fn = builder.module.declare_intrinsic("llvm.maximum", [ty], ir.FunctionType(ty, [ty, ty]))
        return builder.call(fn, args)

    return a(a, b), codegen


# ---------------------------------------------------------------------------
# A vectorisable float32 exp
# ---------------------------------------------------------------------------

# Float32 constants: module-level NumPy scalars are frozen into the compiled
# code with their own type, so the arithmetic below stays in float32.
_F32 = np.float32
_LOG2E = _F32(1.44269504088896341)  # 1 / ln 2
_ROUND_MAGIC = _F32(12582912.0)  # 1.5 * 2**23, see exp_f32
_LN2_HI = _F32(0.693359375)  # ln 2 = _LN2_HI + _LN2_LO, and
_LN2_LO = _F32(-2.12194440e-4)  # k * _LN2_HI is exact for |k| < 2**9
# exp(r) ~ 1 + r + r^2 (c2 + c3 r + c4 r^2 + c5 r^3 + c6 r^4): a minimax fit
# of the relative error on |r| <= ln(2)/2 (approximation error 3e-9, far
# below float32 rounding).
_EXP_C2 = _F32(0.4999999403953552)
_EXP_C3 = _F32(0.1666651964187622)
_EXP_C4 = _F32(0.04166839271783829)
_EXP_C5 = _F32(0.008368780836462975)
_EXP_C6 = _F32(0.001381446374580264)
_EXP_MIN_ARG = _F32(-87.33654022216797)  # smallest x with exp(x) >= FLT_MIN
_EXP_MAX_ARG = _F32(88.72283172607422)  # largest x with exp(x) <= FLT_MAX
_ONE = _F32(1.0)
_ZERO = _F32(0.0)
_INF = _F32(np.inf)


@numba.njit(cache=True, fastmath=_STRICT)
def exp_f32(x):
    """``exp(x)`` for a float32 ``x``, written so that LLVM can vectorise it.

    Range reduction (Cody-Waite): write ``x = k ln2 + r`` with integer
    ``k = round(x / ln2)`` and ``|r| <= ln(2)/2``; then
    ``exp(x) = 2**k * exp(r)``.

    * Rounding without a rounding instruction: adding ``1.5 * 2**23`` to
      ``x / ln2`` pushes the fraction out of the float32 mantissa, so the sum
      ``k_bits`` is rounded to an integer, its low mantissa bits hold ``k``,
      and subtracting the constant again gives ``k`` as a float.
    * ``r = x - k ln2`` is computed in two steps with ln 2 split into a short
      head (whose product with ``k`` is exact) and a tail, so the
      cancellation loses nothing.
    * ``exp(r)`` is a degree-6 polynomial in Horner form (6 FMAs).
    * ``2**k`` is applied by adding ``k`` to the exponent bits
      (:func:`_add_to_exponent`) -- no multiply and no ``ldexp`` call.

    Accuracy: max relative error < 1e-7 (about 1 ulp) wherever the result is
    a normal float32.  Special cases: results that would be subnormal
    (``x < -87.3365``, including ``-inf``) are flushed to 0, ``x > 88.7228``
    gives ``inf`` and NaN gives NaN.  Outside ``[_EXP_MIN_ARG, _EXP_MAX_ARG]``
    the bit arithmetic produces garbage, which the final select replaces.

    Every step is arithmetic or a select, so a loop over ``exp_f32`` becomes
    about 20 SIMD instructions per vector of 16 (AVX-512) or 8 (AVX2)
    values.  The flags are ``contract`` only: with re-association LLVM may
    simplify ``(x/ln2 + C) - C`` to ``x/ln2`` (no rounding!) or merge the
    two-step reduction; compiled with the kernels' flags the relative error
    is 0.4 instead of 1e-7.
    """
    k_bits = x * _LOG2E + _ROUND_MAGIC
    k = k_bits - _ROUND_MAGIC
    r = x - k * _LN2_HI
    r = r - k * _LN2_LO
    p = _EXP_C6
    p = p * r + _EXP_C5
    p = p * r + _EXP_C4
    p = p * r + _EXP_C3
    p = p * r + _EXP_C2
    p = p * r + _ONE
    exp_r = p * r + _ONE
    y = _add_to_exponent(exp_r, k_bits)
    # Out of range: 0 below (also for -inf), x * inf = inf above, NaN stays NaN.
    outside = _ZERO if x < _EXP_MIN_ARG else x * _INF
    return y if _EXP_MIN_ARG <= x <= _EXP_MAX_ARG else outside


def _exp(x):
    """exp used by the kernels: :func:`exp_f32` for float32, else math.exp."""
    return math.exp(x)


@overload(_exp)
def _exp_overload(x):
    if x == types.float32:
        return lambda x: exp_f32(x)
    return lambda x: math.exp(x)


# ---------------------------------------------------------------------------
# Row helpers: each is one simple loop that LLVM can vectorise
# ---------------------------------------------------------------------------


@numba.njit(**_HELPER_OPTIONS)
def _check_lens(lens, rows):
    """The kernels read ``lens[r]`` unchecked, so its length must be right."""
    if lens is None:
        return
    if lens.shape[0] != rows:
        raise ValueError("lens must have one entry per row")


@numba.njit(**_HELPER_OPTIONS)
def _check_same_shape(y, g):
    if y.shape != g.shape:
        raise ValueError("y and g must have the same shape")


@numba.njit(**_HELPER_OPTIONS)
def _valid_length(lens, r, n):
    """Number of valid entries of row ``r``: ``lens[r]`` clipped to [0, n]."""
    if lens is None:
        return n
    return min(max(lens[r], 0), n)


@numba.njit(**_HELPER_OPTIONS)
def _row_max(x, length):
    """``max(x[:length])``; ``-inf`` for an empty prefix, NaN if any is NaN."""
    m = x.dtype.type(-np.inf)
    for j in range(length):
        m = _maximum(m, x[j])
    return m


@numba.njit(**_HELPER_OPTIONS)
def _exp_shifted_and_sum(x, shift, out, length):
    """``out[j] = exp(x[j] - shift)`` for ``j < length``; returns their sum."""
    total = x.dtype.type(0)
    for j in range(length):
        e = _exp(x[j] - shift)
        out[j] = e
        total += e
    return total


@numba.njit(**_HELPER_OPTIONS)
def _sum_exp_shifted(x, shift, length):
    """``sum(exp(x[:length] - shift))`` without storing the terms."""
    total = x.dtype.type(0)
    for j in range(length):
        total += _exp(x[j] - shift)
    return total


@numba.njit(**_HELPER_OPTIONS)
def _scale(out, factor, length):
    """``out[:length] *= factor``."""
    for j in range(length):
        out[j] *= factor


@numba.njit(**_HELPER_OPTIONS)
def _fill(out, start, value):
    """``out[start:] = value``."""
    for j in range(start, out.shape[0]):
        out[j] = value


@numba.njit(cache=True, fastmath=_STRICT)
def _subtract_twice(x, a, b, out, length):
    """``out[j] = (x[j] - a) - b`` for ``j < length``, in exactly that order.

    With re-association allowed LLVM hoists ``a + b`` out of the loop, and
    in float32 that sum loses the low bits of ``b`` when ``a`` is large:
    for logits ``1e4 + N(0, 1)`` the error grew from 7e-7 to 5e-4.
    """
    for j in range(length):
        out[j] = (x[j] - a) - b


@numba.njit(**_HELPER_OPTIONS)
def _dot(a, b):
    """``sum_j a[j] * b[j]``."""
    total = a.dtype.type(0)
    for j in range(a.shape[0]):
        total += a[j] * b[j]
    return total


@numba.njit(**_HELPER_OPTIONS)
def _sum_where_finite(g, y):
    """``sum of g[j] over the j where y[j] != -inf``."""
    zero = g.dtype.type(0)
    ninf = y.dtype.type(-np.inf)
    total = zero
    for j in range(g.shape[0]):
        total += g[j] if y[j] != ninf else zero
    return total


# ---------------------------------------------------------------------------
# The kernels
# ---------------------------------------------------------------------------


@_kernel
def softmax_forward(x, lens=None):
    """Row-wise softmax of a C-contiguous 2-D array.

    ``y_j = exp(x_j - m) / sum_{k<L} exp(x_k - m)`` for ``j < L``, where
    ``m = max_{k<L} x_k`` and ``L = clip(lens[r], 0, n)`` (``n`` if ``lens``
    is None); ``y_j = 0`` for ``j >= L``.  A row with ``L == 0`` or only
    ``-inf`` valid entries gives all zeros.
    """
    rows, n = x.shape
    _check_lens(lens, rows)
    y = np.empty_like(x)
    zero = x.dtype.type(0)
    one = x.dtype.type(1)
    ninf = x.dtype.type(-np.inf)
    for r in prange(rows):
        length = _valid_length(lens, r, n)
        xr = x[r]
        yr = y[r]
        m = _row_max(xr, length)
        if m == ninf:  # empty distribution
            _fill(yr, 0, zero)
            continue
        total = _exp_shifted_and_sum(xr, m, yr, length)
        _scale(yr, one / total, length)  # total >= 1: the max gives e^0
        _fill(yr, length, zero)
    return y


@_kernel
def softmax_backward(y, g):
    """Gradient of softmax: ``dx = y * (g - sum_j g_j y_j)`` per row.

    ``y`` is the forward output and ``g`` the gradient w.r.t. ``y``.  Masked
    entries have ``y = 0``, so their gradient is 0 without a special case.
    """
    rows, n = y.shape
    _check_same_shape(y, g)
    dx = np.empty_like(y)
    for r in prange(rows):
        yr = y[r]
        gr = g[r]
        dxr = dx[r]
        weighted = _dot(gr, yr)
        for j in range(n):
            dxr[j] = yr[j] * (gr[j] - weighted)
    return dx


@_kernel
def log_softmax_forward(x, lens=None):
    """Row-wise log-softmax of a C-contiguous 2-D array.

    ``y_j = (x_j - m) - log(sum_{k<L} exp(x_k - m))`` for ``j < L`` with
    ``m = max_{k<L} x_k``; ``y_j = -inf`` for ``j >= L``.  A row with
    ``L == 0`` or only ``-inf`` valid entries gives all ``-inf``.
    """
    rows, n = x.shape
    _check_lens(lens, rows)
    y = np.empty_like(x)
    ninf = x.dtype.type(-np.inf)
    for r in prange(rows):
        length = _valid_length(lens, r, n)
        xr = x[r]
        yr = y[r]
        m = _row_max(xr, length)
        if m == ninf:  # empty distribution: log 0
            _fill(yr, 0, ninf)
            continue
        log_total = math.log(_sum_exp_shifted(xr, m, length))
        _subtract_twice(xr, m, log_total, yr, length)
        _fill(yr, length, ninf)
    return y


@_kernel
def log_softmax_backward(y, g):
    """Gradient of log-softmax: ``dx_j = g_j - exp(y_j) * sum_k g_k``.

    The sum runs over the entries with finite ``y``; entries with
    ``y_j = -inf`` (masked) get ``dx_j = 0``.
    """
    rows, n = y.shape
    _check_same_shape(y, g)
    dx = np.empty_like(y)
    ninf = y.dtype.type(-np.inf)
    zero = y.dtype.type(0)
    for r in prange(rows):
        yr = y[r]
        gr = g[r]
        dxr = dx[r]
        total = _sum_where_finite(gr, yr)
        for j in range(n):
            grad = gr[j] - _exp(yr[j]) * total
            dxr[j] = grad if yr[j] != ninf else zero
    return dx
