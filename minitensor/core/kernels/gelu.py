"""The exact GELU, gelu(x) = x Phi(x), and its derivative, on every backend -- without SciPy.

Phi is the cumulative distribution function of the standard normal distribution and phi its
density::

    Phi(x) = (1 + erf(x / sqrt 2)) / 2 = erfc(-x / sqrt 2) / 2
    phi(x) = exp(-x^2 / 2) / sqrt(2 pi)

    gelu(x)   = x Phi(x)
    gelu'(x)  = Phi(x) + x phi(x)          (product rule; Phi' = phi)

*Why erfc and not 1 + erf?*  The two are equal, but for x << 0 erf(x / sqrt 2) is -1 plus a
tiny number, and 1 + erf rounds the tiny number away: at x = -10, Phi = 7.6e-24 while
1 + erf gives exactly 0. erfc(-x / sqrt 2) computes the tail itself. Elsewhere the two forms
agree to about 1e-16.

NumPy has no erf (SciPy has, but minitensor does not depend on SciPy), so the error function
comes from one of three places, chosen by :func:`for_backend` from the backend's arrays:

``numpy`` (device "cpu")
    numba kernels (:class:`CpuGelu`): a loop over the flattened array, spread over threads
    with ``prange`` for large arrays, compiled on first use and cached on disk like
    ``cpu.py``'s. float64 calls ``math.erfc``, which numba compiles to the C library's
    ``erfc`` (correct to the last bits, one scalar call per element). float32 -- what a
    model trains in -- uses no library call at all: erfc from a fitted polynomial and
    ``exp`` from ``cpu.exp_f32``, plain arithmetic that LLVM turns into SIMD instructions,
    about 9 times faster (the section "the CPU, float32" below).

``cupy`` (device "cuda")
    the CUDA C++ kernels ``gelu_forward`` / ``gelu_backward`` of ``cuda/elementwise.cu``
    (:class:`CudaGelu`): one thread per element with a grid-stride loop, calling CUDA's own
    ``erfc``/``erfcf``. float32 stays float32 (float64 is slow on most GPUs). Without a GPU
    the tests run them in the CUDA emulator (``tests/cuda_emulator``).

anything else (the tests' "strict" backend, a backend a user registers)
    :func:`reference_forward` / :func:`reference_backward`: erfc written with plain array
    operations (``xp.exp``, ``+``, ``*``, ``/``, ``xp.where``), so they run on any
    NumPy-compatible array library. They also define what the kernels compute.

numba is imported with this module, which ``ops/elementwise.py`` imports on the first exact
GELU, never at ``import minitensor``.
"""

import math

import numba
import numpy as np

from ..dtypes import is_floating
from .cpu import _STRICT, _kernel, exp_f32
from .reference import _quiet

SQRT1_2 = math.sqrt(0.5)  # 1 / sqrt 2
INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)
SQRT_PI = math.sqrt(math.pi)


# -- the reference: erfc from array arithmetic ---------------------------------------------------
# Below |z| = 2.5 erf comes from its power series, above it erfc from its continued fraction;
# 40 terms of each give erfc to about 1e-15 (absolute) on either side of the split, where
# both converge quickly. A series in powers of z alone would alternate in sign and lose
# digits to cancellation; the continued fraction converges slowly near 0. Hence the split.
_SPLIT = 2.5
_TERMS = 40


def reference_erfc(xp, x):
    """erfc(x) = 1 - erf(x) = 2/sqrt(pi) * integral_x^inf exp(-t^2) dt, elementwise.

    With z = |x|:

    z < 2.5, the series with positive terms only (no cancellation)::

        erf(z) = 2/sqrt(pi) exp(-z^2) sum_{n>=0} z (2 z^2)^n / (1 * 3 * 5 * ... * (2n + 1))

    z >= 2.5, Laplace's continued fraction, evaluated from the bottom up::

        erfc(z) = exp(-z^2) / sqrt(pi) / (z + (1/2) / (z + 1 / (z + (3/2) / (z + 2 / (z + ...)))))

    and erfc(-z) = 2 - erfc(z). Each branch is evaluated on its own side of the split (the
    argument clipped to it), so neither sees a value it cannot handle; +-inf gives 0 and 2,
    NaN gives NaN.
    """
    z = xp.abs(x)
    s = xp.minimum(z, _SPLIT)  # the series' argument
    term = total = s
    for n in range(1, _TERMS):
        term = term * (2 * s * s) / (2 * n + 1)
        total = total + term
    near = 1 - TWO_OVER_SQRT_PI * xp.exp(-s * s) * total
    c = xp.maximum(z, _SPLIT)  # the continued fraction's argument
    f = c
    for n in range(_TERMS, 0, -1):
        f = c + (n / 2) / f
    # exp(-c^2) is 0 in float64 beyond c = 27.3; clipping keeps c * c from overflowing
    c = xp.minimum(c, 30.0)
    far = xp.exp(-c * c) / (SQRT_PI * f)
    erfc_z = xp.where(z < _SPLIT, near, far)
    return xp.where(x < 0, 2 - erfc_z, erfc_z)


def reference_forward(xp, x):
    """gelu(x) = x Phi(x) = x erfc(-x / sqrt 2) / 2, with array operations only."""
    x64 = x.astype("float64")
    with _quiet(xp):  # gelu(-inf) = -inf * 0 = NaN, as in PyTorch; no warning about it
        y = x64 * (0.5 * reference_erfc(xp, -x64 * SQRT1_2))
    return _like(y, x)


def reference_backward(xp, x, g):
    """dL/dx = g (Phi(x) + x phi(x)), with array operations only."""
    x64 = x.astype("float64")
    with _quiet(xp):  # at x = +-inf, x phi(x) = inf * 0 = NaN, as in PyTorch
        cdf = 0.5 * reference_erfc(xp, -x64 * SQRT1_2)
        h = xp.minimum(xp.abs(x64), 40.0)  # phi(40) = 0 in float64; clipping keeps h * h finite
        pdf = INV_SQRT_2PI * xp.exp(-0.5 * h * h)
        dx = g * (cdf + x64 * pdf)
    return _like(dx, x)


def _like(y, x):
    # Computed in float64 and rounded once: in float32, 1 - erf loses the relative accuracy
    # of Phi's left tail (erfc(2.4) = 7e-4 from 1 - 0.9993). Float results keep x's dtype.
    return y.astype(x.dtype) if is_floating(x.dtype) else y


# -- the CPU, float64: numba and libm ------------------------------------------------------------
# No fastmath: "afn" would let LLVM substitute approximations for library calls, and the
# float64 results are meant to agree with math.erfc to the last few bits.
_OPTIONS = dict(cache=True, nogil=True, error_model="numpy")


def _gelu_loop(x, y):
    for i in numba.prange(x.size):
        v = x[i]
        y[i] = v * (0.5 * math.erfc(-v * SQRT1_2))


def _gelu_backward_loop(x, g, dx):
    for i in numba.prange(x.size):
        v = x[i]
        cdf = 0.5 * math.erfc(-v * SQRT1_2)
        pdf = INV_SQRT_2PI * math.exp(-0.5 * v * v)
        dx[i] = g[i] * (cdf + v * pdf)


# threaded for large arrays, a plain loop for small ones (see cpu._kernel)
_gelu_loop = _kernel(_gelu_loop, _OPTIONS)
_gelu_backward_loop = _kernel(_gelu_backward_loop, _OPTIONS)


# -- the CPU, float32: arithmetic that LLVM can vectorise ----------------------------------------
# One libm call per element keeps a loop scalar: on GPT's feed-forward activations the float64
# kernels above are about 9 times slower than PyTorch's GELU (bench/gelu.py). In float32 both
# functions are arithmetic instead, and one loop iteration becomes a few dozen SIMD
# instructions for 8 elements at a time:
#
#   erfc(z) ~ t exp(-z^2 + P(t)),   t = 1 / (1 + z/2),   z >= 0,
#
# Numerical Recipes' ``erfcc`` (Press et al., *Numerical Recipes*, 2nd ed., section 6.2): P is a
# degree-9 polynomial fitted (Chebyshev) so that the relative error is below 1.2e-7 for every
# z >= 0 -- the tail included, where 1 + erf would round to 0. ``exp`` is ``cpu.exp_f32``
# (range reduction, a polynomial and an exponent-bit add; 1 ulp).
#
# bench/gelu.py (figures in bench/README.md): 9 times the libm kernels' speed, as fast as
# PyTorch's. Against math.erfc in float64 the forward's relative error is below 2e-6
# wherever |gelu(x)| > 1e-6 (rounding z^2 to float32 is what grows with |z|: exp turns an
# absolute error in its argument into a relative error of the result), the absolute error
# below 4e-7 everywhere.
_F32 = np.float32
_P0, _P1, _P2, _P3, _P4, _P5, _P6, _P7, _P8, _P9 = (
    _F32(c)  # P's coefficients, constant term first
    for c in (
        -1.26551223,
        1.00002368,
        0.37409196,
        0.09678418,
        -0.18628806,
        0.27886807,
        -1.13520398,
        1.48851587,
        -0.82215223,
        0.17087277,
    )
)
_HALF, _ONE, _TWO = _F32(0.5), _F32(1.0), _F32(2.0)
_SQRT1_2_F32, _INV_SQRT_2PI_F32 = _F32(SQRT1_2), _F32(INV_SQRT_2PI)


@numba.njit(inline="always", fastmath=_STRICT)
def _erfc_terms(v):
    """For gelu at float32 ``v``: ``z = |v| / sqrt 2`` and ``t``, ``a`` with erfc(z) ~ t exp(a).
    (Phi(v) = erfc(-v / sqrt 2) / 2 is erfc(z) / 2 for v <= 0 and 1 - erfc(z) / 2 above.)"""
    z = abs(v) * _SQRT1_2_F32
    t = _ONE / (_ONE + _HALF * z)
    p = _P9
    p = p * t + _P8
    p = p * t + _P7
    p = p * t + _P6
    p = p * t + _P5
    p = p * t + _P4
    p = p * t + _P3
    p = p * t + _P2
    p = p * t + _P1
    p = p * t + _P0
    return z, t, p - z * z


@numba.njit(inline="always", fastmath=_STRICT)
def _phi_cdf(v, erfc_z):
    """Phi(v) from erfc(|v| / sqrt 2): erfc(-x) = 2 - erfc(x) on the right (a select, not a branch)."""
    return _HALF * (erfc_z if v <= 0 else _TWO - erfc_z)


def _gelu_loop_f32(x, y):
    for i in numba.prange(x.size):
        v = x[i]
        z, t, a = _erfc_terms(v)
        y[i] = v * _phi_cdf(v, t * exp_f32(a))


def _gelu_backward_loop_f32(x, g, dx):
    for i in numba.prange(x.size):
        v = x[i]
        z, t, a = _erfc_terms(v)
        pdf = _INV_SQRT_2PI_F32 * exp_f32(-(z * z))  # exp(-v^2 / 2) = exp(-z^2)
        dx[i] = g[i] * (_phi_cdf(v, t * exp_f32(a)) + v * pdf)


# One thread up to 2M elements: these loops are fast enough that waking the second thread costs
# about what it saves (on 2 cores a second thread made the forward slower up to 2**20 elements,
# bench/README.md's bench/gelu.py section), and the forward is bound by memory well before that.
_F32_OPTIONS = dict(cache=True, nogil=True, error_model="numpy", fastmath=_STRICT)
_gelu_loop_f32 = _kernel(_gelu_loop_f32, _F32_OPTIONS, min_size=2**21)
_gelu_backward_loop_f32 = _kernel(_gelu_backward_loop_f32, _F32_OPTIONS, min_size=2**21)


class CpuGelu:
    """The numba kernels on NumPy arrays of any shape: float64 through libm, float32 through the
    vectorised loops (other dtypes, such as float16, take the reference path)."""

    @staticmethod
    def forward(x):
        if x.dtype not in (np.float32, np.float64):
            return reference_forward(np, x)
        loop = _gelu_loop_f32 if x.dtype == np.float32 else _gelu_loop
        x = np.ascontiguousarray(x).reshape(x.shape)  # (ascontiguousarray makes a 0-d array 1-d)
        y = np.empty_like(x)
        loop(x.reshape(-1), y.reshape(-1))
        return y

    @staticmethod
    def backward(x, g):
        if x.dtype not in (np.float32, np.float64):
            return reference_backward(np, x, g)
        loop = _gelu_backward_loop_f32 if x.dtype == np.float32 else _gelu_backward_loop
        x, g = np.ascontiguousarray(x).reshape(x.shape), np.ascontiguousarray(g, dtype=x.dtype).reshape(x.shape)
        dx = np.empty_like(x)
        loop(x.reshape(-1), g.reshape(-1), dx.reshape(-1))
        return dx


# -- choosing ------------------------------------------------------------------------------------
class ReferenceGelu:
    """:func:`reference_forward` and :func:`reference_backward` on one array library."""

    def __init__(self, xp):
        self.xp = xp

    def forward(self, x):
        return reference_forward(self.xp, x)

    def backward(self, x, g):
        return reference_backward(self.xp, x, g)


class CudaGelu:
    """The CUDA kernels of ``cuda/elementwise.cu`` for float32 and float64, the reference for
    other dtypes. ``kernels``: a :class:`minitensor.kernels.cuda.CudaKernels` (the backend's)."""

    def __init__(self, kernels):
        self.kernels = kernels

    def forward(self, x):
        if x.dtype not in (np.float32, np.float64):
            return reference_forward(self.kernels.xp, x)
        return self.kernels.gelu_forward(x)

    def backward(self, x, g):
        if x.dtype not in (np.float32, np.float64):
            return reference_backward(self.kernels.xp, x, g)
        return self.kernels.gelu_backward(x, g)


def for_backend(backend):
    """The object whose ``forward(x)`` and ``backward(x, g)`` compute the exact GELU on
    ``backend``'s arrays: numba on NumPy, CUDA C++ on CuPy, the reference elsewhere."""
    xp = backend.xp
    if xp is np:
        return CpuGelu
    if getattr(xp, "__name__", None) == "cupy":
        return CudaGelu(backend.kernels)
    return ReferenceGelu(xp)
