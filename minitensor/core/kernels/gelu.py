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
    numba kernels (:class:`CpuGelu`) calling ``math.erfc`` -- numba compiles it to the C
    library's ``erfc``. A loop over the flattened array, spread over threads with
    ``prange`` for large arrays (the threshold of the softmax kernels, for the reason given
    in ``cpu.py``), compiled on first use and cached on disk like ``cpu.py``'s. float32
    inputs are computed in float64 and rounded once at the end: both are one scalar libm
    call per element, equally fast here.

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

from .cpu import _kernel
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
    return y.astype(x.dtype) if x.dtype.kind == "f" else y


# -- the CPU: numba ------------------------------------------------------------------------------
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


class CpuGelu:
    """The numba kernels on NumPy arrays of any shape; float32 and float64 (other dtypes, such
    as float16, take the reference path)."""

    @staticmethod
    def forward(x):
        if x.dtype not in (np.float32, np.float64):
            return reference_forward(np, x)
        x = np.ascontiguousarray(x)
        y = np.empty_like(x)
        _gelu_loop(x.reshape(-1), y.reshape(-1))
        return y

    @staticmethod
    def backward(x, g):
        if x.dtype not in (np.float32, np.float64):
            return reference_backward(np, x, g)
        x, g = np.ascontiguousarray(x), np.ascontiguousarray(g, dtype=x.dtype)
        dx = np.empty_like(x)
        _gelu_backward_loop(x.reshape(-1), g.reshape(-1), dx.reshape(-1))
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
