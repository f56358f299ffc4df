"""Dropout (Srivastava et al., 2014), "inverted" as in PyTorch and D2L.

In training each element is zeroed with probability p and the survivors are scaled by
1/(1 - p), so the expected value of every element is unchanged and evaluation needs no
rescaling. The random mask comes from the tensor's backend (generated on its device) and is
reproducible through ``mt.manual_seed``.
"""

from ..autograd import Function


class Dropout(Function):
    """z = a * m / (1 - p), m_i ~ Bernoulli(1 - p);  dL/da = dL/dz * m / (1 - p)."""

    @staticmethod
    def forward(ctx, a, p):
        keep = ctx.backend.uniform(a.shape, a.dtype) >= p
        scale = keep * a.dtype.type(1.0 / (1.0 - p)) if p < 1 else keep * a.dtype.type(0)
        ctx.save_for_backward(scale)
        return a * scale

    @staticmethod
    def backward(ctx, grad):
        (scale,) = ctx.saved
        return grad * scale


def dropout(a, p=0.5, training=True):
    """Zero elements with probability ``p`` in training; the identity otherwise."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout: p must be a probability in [0, 1], got {p}")
    if not training or p == 0.0:
        return a
    return Dropout.apply(a, p)
