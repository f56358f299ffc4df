"""Choosing between values elementwise: where and masked_fill."""

from __future__ import annotations

from ..autograd import Function, Grads
from ..tensor import Array, Number, Tensor
from .promote import promote


class Where(Function):
    """z = a where cond else b;  dL/da = dL/dz where cond (else 0), dL/db the rest."""

    @staticmethod
    def forward(ctx: Function, cond: Array, a: Array, b: Array) -> Array:
        ctx.save_for_backward(cond)
        return ctx.xp.where(cond, a, b)

    @staticmethod
    def backward(ctx: Function, grad: Array) -> Grads:
        (cond,) = ctx.saved
        xp = ctx.xp
        _, need_a, need_b = ctx.needs_input_grad
        ga = xp.where(cond, grad, 0) if need_a else None
        gb = xp.where(cond, 0, grad) if need_b else None
        return None, ga, gb


def _as_bool(cond: Tensor | Array, like: Tensor) -> Tensor:
    if isinstance(cond, Tensor):
        if cond.dtype.kind != "b":
            raise TypeError(f"where/masked_fill: the condition must be a bool tensor, got {cond.dtype}")
        return cond
    return Tensor._make(like._backend.array(cond, "bool"), like._backend, None)


def where(cond: Tensor, a: Tensor, b: Tensor) -> Tensor:
    """Elementwise ``a if cond else b`` (all three broadcast together)."""
    a, b = promote(a, b)
    like = a if isinstance(a, Tensor) else b
    return Where.apply(_as_bool(cond, like), a, b)


def masked_fill(a: Tensor, mask: Tensor, value: Number) -> Tensor:
    """``a`` with ``value`` wherever ``mask`` is True (PyTorch's ``masked_fill``)."""
    return Where.apply(_as_bool(mask, a), value, a)
