"""Dropout (Srivastava et al., 2014), "inverted" as in PyTorch and D2L.

In training each element is zeroed with probability p and the survivors are scaled by
1/(1 - p), so the expected value of every element is unchanged and evaluation needs no
rescaling. The random mask comes from the tensor's backend (generated on its device) and is
reproducible through ``mt.manual_seed``.
"""

from __future__ import annotations

from typing import Any

import numpy

from ..autograd import Function, Grads
from ..dtypes import float32, is_low_precision
from ..tensor import Array, Tensor


class Dropout(Function):
    """z = a * m / (1 - p), m_i ~ Bernoulli(1 - p);  dL/da = dL/dz * m / (1 - p).

    The mask comes from a counter-based generator (``kernels/fused.py``,
    ``kernels/cuda/elementwise.cu``): the random number of element i is a hash of (seed, i),
    so one pass makes the mask and the product on every thread, and backward makes the same
    mask again from the seed instead of keeping it (what PyTorch's GPU dropout does). The seed
    is drawn on the host (``backend.draw_seed()``), so a GPU step never waits to read it back.
    Where a backend has no kernel (the tests' strict device) the same hash runs as array code
    (``counter_bits``): the same mask for the same seed on every backend, which is also what
    the streamed attention (``ops.flash_attention``) makes of its weights' tiles.
    """

    @staticmethod
    def forward(ctx: Function, a: Array, p: float) -> Array:
        ctx.mask = counter_mask(ctx.backend, p)
        return apply_counter_mask(ctx.backend, a, *ctx.mask)

    @staticmethod
    def backward(ctx: Function, grad: Array) -> Grads:
        # the gradient goes through the kept elements, scaled: the same mask, made again
        return apply_counter_mask(ctx.backend, grad, *ctx.mask)


def check_probability(op: str, name: str, p: Any) -> None:
    """Refuse a dropout probability ``p`` (the argument ``name`` of ``op``) that is not a number in
    [0, 1], naming both."""
    if not isinstance(p, (int, float, numpy.floating)) or isinstance(p, bool):
        raise TypeError(f"{op}: {name} must be a number in [0, 1], got {p!r}")
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"{op}: {name} must be a probability in [0, 1], got {p}")


def counter_mask(backend: Any, p: float) -> tuple[int, int, float]:
    """(seed, threshold, scale) of a counter-based dropout mask of probability ``p``: the seed
    drawn from the backend's generator (on the host: ``mt.manual_seed`` and checkpoints
    reproduce it like any other draw, and a GPU step never waits to read it), element i kept
    where bits(seed, i) >= threshold = round(p 2^32), times scale = 1 / (1 - p) (0 for p = 1)."""
    return backend.draw_seed(), round(p * 2**32), 1.0 / (1.0 - p) if p < 1 else 0.0


def apply_counter_mask(
    backend: Any, x: Array, seed: int, threshold: int, scale: float, row_start: Array | None = None
) -> Array:
    """x * scale where bits(seed, i) >= threshold, else 0, i each element's number: its flat
    index in x, or, with ``row_start`` (x 2-D, a tile of a larger matrix), row_start[r] + c for
    element c of row r, its index in the whole. The backend's kernel where it has one for x's
    dtype (``dropout_forward``, ``dropout_rows``), else the same hash as array code. A bfloat16
    or float16 ``x`` is masked and scaled in float32 and rounded once: the kernels' path, and a
    scale such as 1/0.9 not first rounded to 8 bits."""
    if is_low_precision(x.dtype):  # bfloat16, float16: the float32 kernels, rounded once (as PyTorch's opmath)
        kept = apply_counter_mask(backend, backend.astype(x, float32), seed, threshold, scale, row_start)
        return backend.astype(kept, x.dtype)
    xp = backend.xp
    x = xp.ascontiguousarray(x).reshape(x.shape)  # (ascontiguousarray makes a 0-d array 1-d)
    args = (as_seed(seed), numpy.uint64(threshold), x.dtype.type(scale))
    if row_start is None:
        kernel = backend.fused("dropout_forward", x.dtype)
        if kernel is not None:
            return kernel(x, *args)
        flat = x.reshape(1, -1)
        return dropout_rows(xp, flat, xp.zeros(1, dtype=numpy.int64), seed, threshold, scale).reshape(x.shape)
    kernel = backend.fused("dropout_rows", x.dtype)
    return dropout_rows(xp, x, row_start, seed, threshold, scale) if kernel is None else kernel(x, row_start, *args)


# The counter-based generator of the dropout kernels (kernels/fused.py), in array code: what the
# kernels are tested against, and what a backend without them runs. SplitMix64 (Steele et al.,
# 2014): number i of seed s is mix(s + (i + 1) * gamma), whose top 32 bits are uniform.
_GAMMA = numpy.uint64(0x9E3779B97F4A7C15)
_MIX1 = numpy.uint64(0xBF58476D1CE4E5B9)
_MIX2 = numpy.uint64(0x94D049BB133111EB)


def as_seed(seed: Any) -> Any:
    """A seed drawn on the host as a uint64 scalar. Inside a captured CUDA graph a seed is a 0-d
    uint64 array on the device instead (``minitensor.cuda.graph``: the graph rewrites it before
    each replay, so that each replay drops other elements), and it stays one."""
    return numpy.uint64(seed) if isinstance(seed, (int, numpy.integer)) else seed


def counter_bits(seed: int, index: Array) -> Array:
    """The top 32 bits of SplitMix64's output number ``index`` (each element) for ``seed``: the
    dropout kernels keep element i when this is at least round(p * 2^32). uint64 arithmetic
    wraps around, as the hash wants."""
    z = index.astype(numpy.uint64) + numpy.uint64(1)
    z *= _GAMMA
    z += as_seed(seed)
    z ^= z >> 30
    z *= _MIX1
    z ^= z >> 27
    z *= _MIX2
    z ^= z >> 31
    return z >> 32


def dropout_rows(xp: Any, x: Array, row_start: Array, seed: int, threshold: int, scale: float) -> Array:
    """``kernels/fused.py``'s ``dropout_rows`` in array code: x (rows, n) with element c of row r
    kept, times ``scale``, where bits(seed, row_start[r] + c) >= ``threshold``, else 0."""
    index = row_start[:, None] + xp.arange(x.shape[1], dtype=numpy.int64)
    keep = counter_bits(seed, index) >= numpy.uint64(threshold)
    return xp.where(keep, x * x.dtype.type(scale), x.dtype.type(0))


def dropout(a: Tensor, p: float = 0.5, training: bool = True) -> Tensor:
    """Inverted dropout (Srivastava et al. 2014; D2L 4.6 / 5.6): in training each element is
    zeroed with probability ``p`` and the others scaled by 1/(1 - p),

        z = a * m / (1 - p),   m_i ~ Bernoulli(1 - p),   so E[z] = a;

    with ``training=False`` (or p = 0) ``a`` is returned as it is. ``p`` outside [0, 1] is a
    ``ValueError``, a ``p`` that is not a number a ``TypeError`` (``check_probability``).
    """
    check_probability("dropout", "p", p)
    if not training or p == 0.0:
        return a
    return Dropout.apply(a, p)
