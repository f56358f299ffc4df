"""Dropout (Srivastava et al., 2014), "inverted" as in PyTorch and D2L.

In training each element is zeroed with probability p and the survivors are scaled by
1/(1 - p), so the expected value of every element is unchanged and evaluation needs no
rescaling. The random mask comes from the tensor's backend (generated on its device) and is
reproducible through ``mt.manual_seed``.
"""

from __future__ import annotations

import numpy

from ..autograd import Function, Grads
from ..tensor import Array, Tensor


class Dropout(Function):
    """z = a * m / (1 - p), m_i ~ Bernoulli(1 - p);  dL/da = dL/dz * m / (1 - p).

    On the CPU and the GPU (float32, float64) the mask comes from a counter-based generator
    (``kernels/fused.py``, ``kernels/cuda/elementwise.cu``): the random number of element i
    is a hash of (seed, i), so one pass makes the mask and the product on every thread, and
    backward makes the same mask again from the seed instead of keeping it (what PyTorch's
    GPU dropout does). The seed is drawn on the host (``backend.draw_seed()``), so a GPU step
    never waits to read it back. Elsewhere the scaled mask is drawn from the backend's
    generator and saved.
    """

    @staticmethod
    def forward(ctx: Function, a: Array, p: float) -> Array:
        kernel = ctx.backend.fused("dropout_forward", a.dtype)
        if kernel is not None and p < 1:
            # The seed comes from the backend's generator: mt.manual_seed and checkpoints
            # reproduce it like any other draw.
            ctx.seed = numpy.uint64(ctx.backend.draw_seed())
            ctx.threshold = numpy.uint64(round(p * 2**32))  # kept where bits >= p * 2^32
            ctx.scale = a.dtype.type(1.0 / (1.0 - p))
            return kernel(ctx.xp.ascontiguousarray(a), ctx.seed, ctx.threshold, ctx.scale)
        keep = ctx.backend.uniform(a.shape, a.dtype) >= p
        scale = keep * a.dtype.type(1.0 / (1.0 - p)) if p < 1 else keep * a.dtype.type(0)
        ctx.save_for_backward(scale)
        return a * scale

    @staticmethod
    def backward(ctx: Function, grad: Array) -> Grads:
        if hasattr(ctx, "seed"):
            kernel = ctx.backend.fused("dropout_backward", grad.dtype)
            assert kernel is not None  # the backend that ran the forward kernel has this one
            return kernel(ctx.xp.ascontiguousarray(grad), ctx.seed, ctx.threshold, ctx.scale)
        (scale,) = ctx.saved
        return grad * scale


def dropout(a: Tensor, p: float = 0.5, training: bool = True) -> Tensor:
    """Inverted dropout (Srivastava et al. 2014; D2L 4.6 / 5.6): in training each element is
    zeroed with probability ``p`` and the others scaled by 1/(1 - p),

        z = a * m / (1 - p),   m_i ~ Bernoulli(1 - p),   so E[z] = a;

    with ``training=False`` (or p = 0) ``a`` is returned as it is. ``p`` outside [0, 1] is a
    ``ValueError``.
    """
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout: p must be a probability in [0, 1], got {p}")
    if not training or p == 0.0:
        return a
    return Dropout.apply(a, p)
