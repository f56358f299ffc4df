"""Joining and splitting: concat, stack, split. Backward hands each input its own slice
of the gradient."""

from __future__ import annotations

from collections.abc import Sequence

from ..autograd import Function, Grads
from ..errors import ShapeError
from ..tensor import Array, Tensor
from .axes import normalize_axis, torch_names
from .indexing import getitem


class Concat(Function):
    """z = [a_1 | a_2 | ...] along ``axis``;  dL/da_k is the k-th block of dL/dz."""

    @staticmethod
    def forward(ctx: Function, *arrays: Array, axis: int = 0) -> Array:
        ref = arrays[0]
        axis = normalize_axis(axis, ref.ndim, "concat")
        for a in arrays:
            if a.ndim != ref.ndim or a.shape[:axis] + a.shape[axis + 1 :] != ref.shape[:axis] + ref.shape[axis + 1 :]:
                raise ShapeError(
                    f"concat: shapes {[tuple(x.shape) for x in arrays]} must agree except along axis {axis}"
                )
        ctx.axis, ctx.sizes = axis, [a.shape[axis] for a in arrays]
        return ctx.xp.concatenate(arrays, axis=axis)

    @staticmethod
    def backward(ctx: Function, grad: Array) -> Grads:
        out, start = [], 0
        index = [slice(None)] * grad.ndim
        for n in ctx.sizes:
            index[ctx.axis] = slice(start, start + n)
            out.append(grad[tuple(index)])
            start += n
        return tuple(out)


class Stack(Function):
    """z[..., k, ...] = a_k (a new axis);  dL/da_k = dL/dz[..., k, ...]."""

    @staticmethod
    def forward(ctx: Function, *arrays: Array, axis: int = 0) -> Array:
        shapes = {tuple(a.shape) for a in arrays}
        if len(shapes) > 1:
            raise ShapeError(f"stack: all tensors need the same shape, got {[tuple(a.shape) for a in arrays]}")
        ctx.axis = normalize_axis(axis, arrays[0].ndim, "stack", new=True)
        return ctx.xp.stack(arrays, axis=ctx.axis)

    @staticmethod
    def backward(ctx: Function, grad: Array) -> Grads:
        return tuple(ctx.xp.moveaxis(grad, ctx.axis, 0))


@torch_names
def concat(tensors: Sequence[Tensor], axis: int = 0) -> Tensor:
    """Join ``tensors`` (a sequence, at least one) end to end along an existing ``axis``:
    z = [a_1 | a_2 | ...]; each input gets its own block of the gradient back.

    The shapes must agree except along ``axis`` (a ``ShapeError`` lists them otherwise).
    ``cat`` is the same function (PyTorch's name).
    """
    tensors = list(tensors)
    if not tensors:
        raise ValueError("concat: needs at least one tensor")
    return Concat.apply(*tensors, axis=axis)


cat = concat
"""PyTorch's name for ``concat``, the same function: tensors joined along an existing axis."""


@torch_names
def stack(tensors: Sequence[Tensor], axis: int = 0) -> Tensor:
    """Join ``tensors`` (a sequence of tensors of one shape, at least one) along a new axis:
    z[..., k, ...] = a_k at position ``axis`` of the result; a_k's gradient is slice k."""
    tensors = list(tensors)
    if not tensors:
        raise ValueError("stack: needs at least one tensor")
    return Stack.apply(*tensors, axis=axis)


@torch_names
def split(a: Tensor, split_size_or_sections: int | Sequence[int], axis: int = 0) -> list[Tensor]:
    """Split into pieces along ``axis`` (PyTorch's rule): an int is the size of each piece
    (the last may be smaller); a list gives every piece's size and must add up."""
    axis = normalize_axis(axis, a.ndim, "split")
    n = a.shape[axis]
    if isinstance(split_size_or_sections, int):
        step = split_size_or_sections
        if step <= 0:
            raise ValueError(f"split: piece size must be positive, got {step}")
        sizes = [min(step, n - s) for s in range(0, n, step)]
    else:
        sizes = list(split_size_or_sections)
        if any(size < 0 for size in sizes):
            raise ValueError(f"split: piece sizes must not be negative, got {sizes}")
        if sum(sizes) != n:
            raise ShapeError(f"split: sizes {sizes} add up to {sum(sizes)}, but axis {axis} has length {n}")
    pieces, start = [], 0
    lead = (slice(None),) * axis
    for size in sizes:
        pieces.append(getitem(a, lead + (slice(start, start + size),)))
        start += size
    return pieces


MAX_EMPTY_PIECES = 1 << 16  # chunk's pieces of an empty axis, at most


@torch_names
def chunk(a: Tensor, chunks: int, axis: int = 0) -> list[Tensor]:
    """At most ``chunks`` pieces along ``axis``, each ceil(n / chunks) long but the last (PyTorch's
    rule, so there may be fewer): ``q, k, v = qkv.chunk(3, dim=-1)``."""
    if not isinstance(chunks, int) or isinstance(chunks, bool) or chunks < 1:
        raise ValueError(f"chunk: chunks must be a positive integer, got {chunks!r}")
    n = a.shape[normalize_axis(axis, a.ndim, "chunk")]
    if n == 0:  # as many empty pieces as asked, as in PyTorch (the only count not bounded by n)
        if chunks > MAX_EMPTY_PIECES:
            raise ValueError(f"chunk: {chunks:,} empty pieces of an empty axis; at most {MAX_EMPTY_PIECES:,}")
        return split(a, [0] * chunks, axis=axis)
    return split(a, -(-n // chunks), axis=axis)
