"""Choosing between values elementwise: where and masked_fill; tril and triu keep a triangle."""

from __future__ import annotations

from ..autograd import Function, Grads
from ..errors import ShapeError
from ..tensor import Array, Number, Tensor, tensor
from .promote import promote


class Where(Function):
    """z = a where cond else b;  dL/da = dL/dz where cond (else 0), dL/db the rest."""

    @staticmethod
    def forward(ctx: Function, cond: Array, a: Array, b: Array) -> Array:
        ctx.save_for_backward(cond)
        # a Python number takes the array's dtype, as in PyTorch (NumPy makes bfloat16 float32)
        if not hasattr(a, "dtype"):
            a = b.dtype.type(a)
        elif not hasattr(b, "dtype"):
            b = a.dtype.type(b)
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
    if not isinstance(a, Tensor) and not isinstance(b, Tensor):  # where(cond, 1.0, 0.0): on cond's device
        a = tensor(a, device=cond.device) if isinstance(cond, Tensor) else tensor(a)
    a, b = promote(a, b)
    like = a if isinstance(a, Tensor) else b
    return Where.apply(_as_bool(cond, like), a, b)


def masked_fill(a: Tensor, mask: Tensor, value: Number) -> Tensor:
    """``a`` with ``value`` wherever ``mask`` is True (PyTorch's ``masked_fill``). The result
    keeps a's dtype, as in PyTorch: 2.7 written into integers is 2 (``Where`` makes a number
    the array's dtype; NumPy would make the whole result a float64)."""
    return Where.apply(_as_bool(mask, a), value, a)


class Triangle(Function):
    """z = a on and below (``lower``; else on and above) the ``diagonal``-th diagonal of the last
    two axes, 0 elsewhere;  dL/da = dL/dz on the kept triangle, 0 elsewhere."""

    @staticmethod
    def forward(ctx: Function, a: Array, diagonal: int, lower: bool) -> Array:
        ctx.diagonal, ctx.lower = diagonal, lower
        return (ctx.xp.tril if lower else ctx.xp.triu)(a, diagonal)

    @staticmethod
    def backward(ctx: Function, grad: Array) -> Grads:
        return (ctx.xp.tril if ctx.lower else ctx.xp.triu)(grad, ctx.diagonal)


def _triangle(a: Tensor, diagonal: int, lower: bool) -> Tensor:
    op = "tril" if lower else "triu"
    if a.ndim < 2:
        raise ShapeError(f"{op}: needs a tensor of at least 2 dimensions (matrices), got shape {a.shape}")
    if not isinstance(diagonal, int) or isinstance(diagonal, bool):
        raise TypeError(f"{op}: diagonal must be an integer, got {diagonal!r}")
    return Triangle.apply(a, diagonal=diagonal, lower=lower)


def tril(a: Tensor, diagonal: int = 0) -> Tensor:
    """The lower triangle of the last two axes, a[..., i, j] where j <= i + ``diagonal``, zeros
    above it. ``mt.tril(mt.ones(T, T))`` is the causal mask of self-attention, query i seeing
    the keys j <= i, as nanoGPT builds it (``== 0`` where a score gets -inf)."""
    return _triangle(a, diagonal, lower=True)


def triu(a: Tensor, diagonal: int = 0) -> Tensor:
    """The upper triangle of the last two axes, a[..., i, j] where j >= i + ``diagonal``, zeros
    below it: ``mt.triu(mt.ones(T, T), 1)`` marks the future keys a causal query must not see."""
    return _triangle(a, diagonal, lower=False)
