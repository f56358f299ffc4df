"""Joining and splitting: concat, stack, split, and joining copies (repeat_interleave, repeat).
Backward hands each input its own slice of the gradient; a copied element gets the sum of its
copies' gradients."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy

from ..autograd import Function, Grads
from ..errors import ShapeError
from ..tensor import Array, Tensor
from .axes import normalize_axis, torch_names
from .indexing import getitem
from .promote import promote_all


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
    return Concat.apply(*promote_all(tensors), axis=axis)


cat = concat
"""PyTorch's name for ``concat``, the same function: tensors joined along an existing axis."""


@torch_names
def stack(tensors: Sequence[Tensor], axis: int = 0) -> Tensor:
    """Join ``tensors`` (a sequence of tensors of one shape, at least one) along a new axis:
    z[..., k, ...] = a_k at position ``axis`` of the result; a_k's gradient is slice k."""
    tensors = list(tensors)
    if not tensors:
        raise ValueError("stack: needs at least one tensor")
    return Stack.apply(*promote_all(tensors), axis=axis)


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


# -- copies joined: each element repeated ------------------------------------------------------
class RepeatInterleave(Function):
    """z = each slice of ``a`` along ``axis`` repeated ``counts[i]`` times in place (NumPy's
    ``repeat``);  dL/da[i] = the sum of dL/dz over the copies of slice i."""

    @staticmethod
    def forward(ctx: Function, a: Array, counts: Any, axis: int) -> Array:
        ctx.shape, ctx.counts, ctx.axis = a.shape, counts, axis
        return ctx.xp.repeat(a, counts, axis=axis)

    @staticmethod
    def backward(ctx: Function, grad: Array) -> Grads:
        xp, n, counts = ctx.xp, ctx.shape[ctx.axis], ctx.counts
        g = xp.moveaxis(grad, ctx.axis, 0)
        if isinstance(counts, int):  # (n * r, ...) -> (n, r, ...), summed over the r copies
            out = g.reshape(n, counts, *g.shape[1:]).sum(axis=1)
        else:  # copy j came from slice source[j]: add it there (a count may be 0)
            out = xp.zeros((n, *g.shape[1:]), dtype=grad.dtype)
            source = xp.asarray(numpy.repeat(numpy.arange(n), counts))
            ctx.backend.index_add(out, source, g)
        return xp.moveaxis(out, 0, ctx.axis)


@torch_names
def repeat_interleave(a: Tensor, repeats: int | Sequence[int] | Tensor, axis: int | None = None) -> Tensor:
    """Each element (``axis=None``: of the flattened tensor) or each slice along ``axis`` repeated
    in place: ``repeat_interleave([1, 2], 3)`` is [1, 1, 1, 2, 2, 2] (PyTorch's name; NumPy's
    ``repeat``). ``repeats`` is one count for all, or one count per slice (a sequence or an
    integer tensor; its values are read to the host, since they size the result). Each copy's
    gradient adds up into its original. D2L 11.3.1 repeats the valid lengths this way, one per
    query row: ``repeat_interleave(valid_lens, num_queries)``.
    """
    if axis is None:
        a, axis = a.reshape(-1), 0
    axis = normalize_axis(axis, a.ndim, "repeat_interleave")
    n = a.shape[axis]
    count: int | list[int]
    if isinstance(repeats, int) and not isinstance(repeats, bool):
        # one count, kept as it is: under mt.onnx.export it may be a traced length (shape[1])
        if repeats < 0:
            raise ValueError(f"repeat_interleave: repeats must not be negative, got {repeats!r}")
        count, total = repeats, repeats * n
    else:
        counts = numpy.asarray(repeats._backend.to_numpy(repeats.data) if isinstance(repeats, Tensor) else repeats)
        if counts.size == 0:  # ([] is float64 to NumPy: the counts of an empty axis)
            counts = counts.astype(numpy.int64)
        if counts.dtype.kind not in "iu" or counts.ndim > 1 or (counts.ndim == 1 and counts.size not in (1, n)):
            raise ValueError(
                f"repeat_interleave: repeats must be one integer or one per slice ({n} along axis {axis}), "
                f"got {repeats!r}"
            )
        if (counts < 0).any():
            raise ValueError(f"repeat_interleave: repeats must not be negative, got {repeats!r}")
        if counts.size == 1:
            count = int(counts.reshape(-1)[0])
            total = count * n
        else:
            count, total = counts.tolist(), int(counts.sum())
    a._backend.check_fits("repeat_interleave", (*a.shape[:axis], total, *a.shape[axis + 1 :]), a.data.itemsize)
    return RepeatInterleave.apply(a, count, axis)


class Tile(Function):
    """z = ``a`` repeated ``reps[k]`` times along each axis k, end to end (NumPy's ``tile``,
    PyTorch's ``Tensor.repeat``);  dL/da = the sum of dL/dz over the copies."""

    @staticmethod
    def forward(ctx: Function, a: Array, reps: tuple[int, ...]) -> Array:
        ctx.shape, ctx.reps = a.shape, reps
        return ctx.xp.tile(a.reshape((1,) * (len(reps) - a.ndim) + a.shape), reps)

    @staticmethod
    def backward(ctx: Function, grad: Array) -> Grads:
        # (r0 * d0, r1 * d1, ...) -> (r0, d0, r1, d1, ...): summing the r axes adds the copies
        dims = (1,) * (len(ctx.reps) - len(ctx.shape)) + ctx.shape
        split_shape = [n for pair in zip(ctx.reps, dims, strict=True) for n in pair]
        return grad.reshape(split_shape).sum(axis=tuple(range(0, 2 * len(dims), 2))).reshape(ctx.shape)


def repeat(a: Tensor, *reps: int | Sequence[int]) -> Tensor:
    """``a`` copied ``reps[k]`` times along each axis k, the copies end to end: PyTorch's
    ``x.repeat(2, 1, 1)`` (NumPy's ``tile``); more counts than axes add leading axes. Each copy's
    gradient adds up into the original. Not ``repeat_interleave``, which repeats each element in
    place."""
    given = tuple(reps[0]) if len(reps) == 1 and isinstance(reps[0], (tuple, list)) else reps
    if len(given) < a.ndim or not all(is_count(r) for r in given):
        raise ValueError(
            f"repeat: needs a count (an integer >= 0) for each of the {a.ndim} axes of shape "
            f"{tuple(a.shape)}, or more, got {given!r}"
        )
    # (ints kept as they are: under mt.onnx.export a count may be a traced length, .repeat(batch_size, 1))
    counts = tuple(r if isinstance(r, int) else int(r) for r in given)  # type: ignore[arg-type]
    dims = (1,) * (len(counts) - a.ndim) + tuple(a.shape)
    a._backend.check_fits("repeat", tuple(r * d for r, d in zip(counts, dims, strict=True)), a.data.itemsize)
    return Tile.apply(a, counts)


def is_count(r: Any) -> bool:
    """An integer >= 0 (Python's or NumPy's; not a bool): a count a caller may give an op."""
    return bool(isinstance(r, (int, numpy.integer)) and not isinstance(r, bool) and r >= 0)
