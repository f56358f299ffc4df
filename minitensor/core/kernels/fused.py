"""Numba CPU kernels for the elementwise work of a training step: dropout, ReLU, layer
norm and Adam's update.

Why they exist. In a Transformer step most of the time is matrix products, which BLAS
spreads over every core. What is left is elementwise: masks, residual adds, layer norms,
the optimiser's update. Written with NumPy, each of those is several passes over memory
(one per operator, each allocating a temporary) on ONE core, while PyTorch runs the same
work as fused loops on all its threads. A numba loop with ``prange`` does what PyTorch
does: one pass, no temporaries, rows or chunks spread over the threads.

Each kernel has a plain array-library twin, which is the definition: the op's own
NumPy/CuPy code in ``minitensor/core/ops`` (``Dropout``, ``ReLU``, ``LayerNorm``) and the
textbook update in ``minitensor/core/optim/adam.py``. The ops ask their backend for a kernel
(``backend.fused(name, dtype)``, float32 and float64): the CPU backend gives these, the GPU
backend its CUDA C++ kernels of the same names and signatures (``kernels/cuda``), any other
backend None, and the op runs its twin. The tests run both and compare them;
``bench/train_step.py`` measures what the kernels buy.

All kernels take C-contiguous arrays (the ops make sure of it) and keep the arithmetic in
the arrays' own dtype: a Python float inside a numba loop is float64 and would silently
turn float32 work into float64 work.
"""

import math

import numba
import numpy as np
from numba import prange

from .cpu import PARALLEL_MIN_SIZE, _kernel

_OPTIONS = dict(cache=True, fastmath={"nsz", "arcp", "contract", "afn", "reassoc"}, nogil=True)


# ---------------------------------------------------------------------------
# Dropout with counter-based random numbers
# ---------------------------------------------------------------------------
# A sequential generator (NumPy's PCG64) is one long chain: element i+1's number needs
# element i's state, so it cannot be split over threads, and the mask must be stored for
# backward. A *counter-based* generator computes number i directly as hash(seed, i)
# (Salmon et al., 2011, "Parallel random numbers: as easy as 1, 2, 3"; PyTorch's GPU
# dropout uses one, Philox). Then any thread can make any element's number, and backward
# can make the same mask again from the seed instead of keeping it. The hash here is
# SplitMix64 (Steele et al., 2014), whose i-th output is exactly mix(seed + i * gamma).

_GAMMA = np.uint64(0x9E3779B97F4A7C15)  # 2^64 / golden ratio: consecutive counters spread out
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31, _S32 = np.uint64(30), np.uint64(27), np.uint64(31), np.uint64(32)


@numba.njit(inline="always", **_OPTIONS)
def _uniform_bits(seed, i):
    """The top 32 bits of SplitMix64's i-th output for ``seed``: uniform over [0, 2^32)."""
    z = seed + np.uint64(i + 1) * _GAMMA  # uint64 arithmetic wraps around, as the hash wants
    z = (z ^ (z >> _S30)) * _MIX1
    z = (z ^ (z >> _S27)) * _MIX2
    z = z ^ (z >> _S31)
    return z >> _S32


@_kernel
def dropout_forward(x, seed, threshold, scale):
    """out_i = x_i * scale if bits(seed, i) >= threshold else 0.

    ``threshold`` = round(p * 2^32), so an element is kept with probability 1 - p (to
    within 2^-32); ``scale`` = 1 / (1 - p) in x's dtype.
    """
    flat = x.reshape(-1)
    out = np.empty_like(flat)
    zero = flat.dtype.type(0)
    for i in prange(flat.size):
        out[i] = flat[i] * scale if _uniform_bits(seed, i) >= threshold else zero
    return out.reshape(x.shape)


# The backward is the same function: the gradient goes through the kept elements, scaled.
dropout_backward = dropout_forward


@_kernel
def dropout_rows(x, row_start, seed, threshold, scale):
    """out[r, c] = x[r, c] * scale if bits(seed, row_start[r] + c) >= threshold else 0.

    ``dropout_forward`` on a tile of a larger matrix, x (rows, n): element c of row r has the
    number row_start[r] + c it has in the whole, so the tile keeps exactly what dropout on the
    whole would keep (the streamed attention's tiles of the (batch, heads, Q, K) weights).
    """
    out = np.empty_like(x)
    zero = x.dtype.type(0)
    for r in prange(x.shape[0]):
        start = row_start[r]
        for c in range(x.shape[1]):
            out[r, c] = x[r, c] * scale if _uniform_bits(seed, start + c) >= threshold else zero
    return out


# ---------------------------------------------------------------------------
# ReLU
# ---------------------------------------------------------------------------
@_kernel
def relu_forward(x):
    """max(x, 0), one pass (NumPy's ``x * (x > 0)`` makes the mask, then the product)."""
    flat = x.reshape(-1)
    out = np.empty_like(flat)
    zero = flat.dtype.type(0)
    for i in prange(flat.size):
        out[i] = zero if flat[i] <= zero else flat[i]  # NaN stays NaN, as in NumPy and PyTorch
    return out.reshape(x.shape)


@_kernel
def relu_backward(y, grad):
    """grad where the output y > 0 (the same elements as x > 0), else 0."""
    yf, gf = y.reshape(-1), grad.reshape(-1)
    out = np.empty_like(gf)
    zero = yf.dtype.type(0)
    for i in prange(gf.size):
        out[i] = gf[i] * (yf[i] > zero)  # a product, like the NumPy twin: NaN * 0 is still NaN
    return out.reshape(grad.shape)


# ---------------------------------------------------------------------------
# Layer norm, rows of a matrix (N, D)
# ---------------------------------------------------------------------------
@_kernel
def layer_norm_forward(x, weight, bias, eps):
    """Per row: mu, var, xhat = (x - mu) / sqrt(var + eps), y = xhat * weight + bias.

    Returns y, xhat and rstd = 1 / sqrt(var + eps) (one per row), what backward needs.
    ``weight`` and ``bias`` are vectors of length D (ones and zeros when the layer has none).
    """
    N, D = x.shape
    y, xhat = np.empty_like(x), np.empty_like(x)
    rstd = np.empty((N, 1), dtype=x.dtype)
    zero, inv_d = x.dtype.type(0), x.dtype.type(1.0 / D)
    for i in prange(N):
        mean = zero
        for j in range(D):
            mean += x[i, j]
        mean *= inv_d
        var = zero
        for j in range(D):
            c = x[i, j] - mean
            var += c * c
        r = x.dtype.type(1) / math.sqrt(var * inv_d + eps)
        rstd[i, 0] = r
        for j in range(D):
            h = (x[i, j] - mean) * r
            xhat[i, j] = h
            y[i, j] = h * weight[j] + bias[j]
    return y, xhat, rstd


@_kernel
def layer_norm_backward(grad, xhat, rstd, weight):
    """dL/dx = rstd * (gxhat - mean(gxhat) - xhat * mean(gxhat * xhat)), gxhat = g * weight,
    and the column sums dL/dweight = sum_rows(g * xhat), dL/dbias = sum_rows(g).

    The column sums cross rows, which the threads share out: each chunk of rows adds into
    its own row of ``partial`` and the chunks are summed at the end (no two threads write
    the same memory, and the result does not depend on how threads are scheduled).
    """
    N, D = grad.shape
    gx = np.empty_like(grad)
    chunks = min(N, 64)
    partial_w = np.zeros((chunks, D), dtype=grad.dtype)
    partial_b = np.zeros((chunks, D), dtype=grad.dtype)
    zero, inv_d = grad.dtype.type(0), grad.dtype.type(1.0 / D)
    for c in prange(chunks):
        for i in range(c * N // chunks, (c + 1) * N // chunks):
            a = zero
            b = zero
            for j in range(D):
                gh = grad[i, j] * weight[j]
                a += gh
                b += gh * xhat[i, j]
                partial_w[c, j] += grad[i, j] * xhat[i, j]
                partial_b[c, j] += grad[i, j]
            a *= inv_d
            b *= inv_d
            r = rstd[i, 0]
            for j in range(D):
                gx[i, j] = r * (grad[i, j] * weight[j] - a - xhat[i, j] * b)
    return gx, partial_w.sum(axis=0), partial_b.sum(axis=0)


# ---------------------------------------------------------------------------
# Adam's update, in place
# ---------------------------------------------------------------------------
@_kernel
def adam_update(param, grad, exp_avg, exp_avg_sq, step_size, beta1, beta2, eps, weight_decay, bias_sqrt2):
    """One pass over a parameter, the textbook rule of ``optim/adam.py`` element by element:

        g <- g + weight_decay * w
        m <- beta1 m + (1 - beta1) g,   v <- beta2 v + (1 - beta2) g^2
        w <- w - step_size * m / (sqrt(v) / bias_sqrt2 + eps)

    with step_size = lr / (1 - beta1^t) and bias_sqrt2 = sqrt(1 - beta2^t). NumPy needs
    ten passes and five temporaries for the same; this reads and writes each array once.
    The scalars arrive in the parameter's dtype, betas as (beta, 1 - beta) pairs computed
    in float64 as the textbook lines do (1 - beta2 in float32 arithmetic is off by 5e-5).
    """
    w, g, m, v = param.reshape(-1), grad.reshape(-1), exp_avg.reshape(-1), exp_avg_sq.reshape(-1)
    b1, one_minus_b1 = beta1
    b2, one_minus_b2 = beta2
    for i in prange(w.size):
        gi = g[i] + weight_decay * w[i]
        mi = b1 * m[i] + one_minus_b1 * gi
        vi = b2 * v[i] + one_minus_b2 * gi * gi
        m[i] = mi
        v[i] = vi
        w[i] -= step_size * mi / (math.sqrt(vi) / bias_sqrt2 + eps)


__all__ = [
    "PARALLEL_MIN_SIZE",
    "adam_update",
    "dropout_backward",
    "dropout_forward",
    "layer_norm_backward",
    "layer_norm_forward",
    "relu_backward",
    "relu_forward",
]
