"""Choosing between values elementwise: where and masked_fill."""

from ..autograd import Function
from ..tensor import Tensor
from .promote import promote


class Where(Function):
    """z = a where cond else b;  dL/da = dL/dz where cond (else 0), dL/db the rest."""

    @staticmethod
    def forward(ctx, cond, a, b):
        ctx.save_for_backward(cond)
        return ctx.xp.where(cond, a, b)

    @staticmethod
    def backward(ctx, grad):
        (cond,) = ctx.saved
        xp = ctx.xp
        _, need_a, need_b = ctx.needs_input_grad
        ga = xp.where(cond, grad, 0) if need_a else None
        gb = xp.where(cond, 0, grad) if need_b else None
        return None, ga, gb


def _as_bool(cond, like):
    if isinstance(cond, Tensor):
        if cond.dtype.kind != "b":
            raise TypeError(f"where/masked_fill: the condition must be a bool tensor, got {cond.dtype}")
        return cond
    return Tensor._make(like._backend.array(cond, "bool"), like._backend, None)


def where(cond, a, b):
    """Elementwise ``a if cond else b`` (all three broadcast together)."""
    a, b = promote(a, b)
    like = a if isinstance(a, Tensor) else b
    return Where.apply(_as_bool(cond, like), a, b)


def masked_fill(a, mask, value):
    """``a`` with ``value`` wherever ``mask`` is True (PyTorch's ``masked_fill``)."""
    return Where.apply(_as_bool(mask, a), value, a)
