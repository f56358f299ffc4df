"""Operations that move elements around without changing them: reshape, permute,
broadcast, squeeze/unsqueeze. Each backward applies the inverse move to the gradient."""

from __future__ import annotations

import math
from typing import Any

from ..autograd import Function, Grads, sum_to_shape
from ..errors import AxisError, ShapeError
from ..tensor import Array, Axes, Shape, Tensor
from .axes import axis_error, normalize_axes, normalize_axis, torch_names


class Reshape(Function):
    """Same elements, new shape;  backward reshapes the gradient back."""

    reads_inputs = False  # (its backward needs only shapes: see Function.reads_inputs)

    @staticmethod
    def forward(ctx: Function, a: Array, shape: tuple[int, ...]) -> Array:
        ctx.shape = a.shape
        try:
            return a.reshape(shape)
        except ValueError:
            raise ShapeError(
                f"reshape: cannot view {a.size} elements of shape {tuple(a.shape)} as {tuple(shape)}; "
                "the new shape must hold the same number of elements (one axis may be -1 to infer it)"
            ) from None

    @staticmethod
    def backward(ctx: Function, grad: Array) -> Grads:
        return grad.reshape(ctx.shape)


class Permute(Function):
    """Reorder the axes;  backward applies the inverse permutation."""

    reads_inputs = False  # (its backward needs only shapes: see Function.reads_inputs)

    @staticmethod
    def forward(ctx: Function, a: Array, axes: tuple[int, ...]) -> Array:
        n, given = a.ndim, axes
        if len(axes) == n:
            axes = tuple(normalize_axis(x, n, "permute") for x in axes)
        if len(axes) != n or len(set(axes)) != n:
            raise AxisError(
                f"permute: {tuple(given)} is not a permutation of the {n} axes of shape {tuple(a.shape)}: "
                "it must name every axis once",
                None,
                n,
            )
        ctx.inverse = tuple(sorted(range(len(axes)), key=axes.__getitem__))
        return ctx.xp.transpose(a, axes)

    @staticmethod
    def backward(ctx: Function, grad: Array) -> Grads:
        return ctx.xp.transpose(grad, ctx.inverse)


class Clone(Function):
    """z = a, a copy laid out in memory row by row (C order): ``Tensor.clone`` and
    ``Tensor.contiguous``'s copy; dz/da = 1."""

    @staticmethod
    def forward(ctx: Function, a: Array) -> Array:
        return a.copy(order="C")

    @staticmethod
    def backward(ctx: Function, grad: Array) -> Grads:
        return grad


class BroadcastTo(Function):
    """Repeat along axes of length 1 (and new leading axes);  backward sums them back."""

    @staticmethod
    def forward(ctx: Function, a: Array, shape: tuple[int, ...]) -> Array:
        ctx.shape = a.shape
        try:
            return ctx.xp.broadcast_to(a, shape)
        except ValueError:
            raise ShapeError(f"broadcast_to: cannot broadcast shape {tuple(a.shape)} to {tuple(shape)}") from None

    @staticmethod
    def backward(ctx: Function, grad: Array) -> Grads:
        return sum_to_shape(grad, ctx.shape)


def _shape_arg(shape: tuple[Any, ...]) -> tuple[int, ...]:
    """Accept both ``x.reshape(2, 3)`` and ``x.reshape((2, 3))``, as PyTorch does."""
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        return tuple(shape[0])
    return tuple(shape)


def reshape(a: Tensor, *shape: Shape) -> Tensor:
    """The same elements in a new shape: ``reshape(x, 2, 3)`` or ``reshape(x, (2, 3))``; one axis
    may be -1, inferred from the others. A ``ShapeError`` if the element counts differ;
    backward reshapes the gradient back."""
    shape = _shape_arg(shape)
    try:
        below = min(shape, default=0) < -1  # (NumPy would read any negative length as -1)
    except TypeError:  # a length that is no number at all
        raise TypeError(f"reshape: lengths are integers, got {shape}") from None
    if below:
        raise ShapeError(f"reshape: lengths are >= 0, or -1 for the one to infer; got {shape}")
    return Reshape.apply(a, shape)


@torch_names
def flatten(a: Tensor, start_axis: int = 0, end_axis: int = -1) -> Tensor:
    """Merge axes start_axis..end_axis into one (a 0-d tensor becomes shape (1,), as in PyTorch)."""
    n = a.ndim
    if n == 0:
        for axis in (start_axis, end_axis):
            if axis not in (0, -1):
                raise axis_error("flatten", axis, 0, valid="0 or -1, as in PyTorch")
        return reshape(a, 1)
    s, e = normalize_axis(start_axis, n, "flatten"), normalize_axis(end_axis, n, "flatten")
    if s > e:
        raise AxisError(
            f"flatten: start_axis {start_axis} comes after end_axis {end_axis} (axes {s} and {e} of a "
            f"tensor of {n} dimensions)",
            None,
            n,
        )
    return Reshape.apply(a, a.shape[:s] + (math.prod(a.shape[s : e + 1]),) + a.shape[e + 1 :])


def permute(a: Tensor, *axes: Axes) -> Tensor:
    """The axes reordered: axis i of the result is axis ``axes[i]`` of ``a``. For instance
    ``permute(X, 0, 2, 1, 3)`` turns (batch_size, num_steps, num_heads, d) into (batch_size,
    num_heads, num_steps, d), as multi-head attention does (D2L 10.5 / 11.5). Every axis must
    be named once (``AxisError`` otherwise); backward applies the inverse permutation."""
    return Permute.apply(a, _shape_arg(axes))


@torch_names
def transpose(a: Tensor, axis0: int = -2, axis1: int = -1) -> Tensor:
    """Swap two axes (PyTorch's ``transpose``; NumPy calls it ``swapaxes``)."""
    n = a.ndim
    axis0, axis1 = normalize_axis(axis0, n, "transpose"), normalize_axis(axis1, n, "transpose")
    axes = list(range(n))
    axes[axis0], axes[axis1] = axes[axis1], axes[axis0]
    return Permute.apply(a, tuple(axes))


swapaxes = transpose
"""NumPy's name for ``transpose``, the same function: two axes swapped (by default the last two)."""


class Flip(Function):
    """z = a with the order of the elements reversed along the axes;  backward reverses the
    gradient along the same axes (a reversal is its own inverse)."""

    @staticmethod
    def forward(ctx: Function, a: Array, axes: tuple[int, ...]) -> Array:
        ctx.axes = axes
        return ctx.xp.flip(a, axis=axes).copy()  # a copy, as PyTorch's: a write to it must not reach a

    @staticmethod
    def backward(ctx: Function, grad: Array) -> Grads:
        return ctx.xp.flip(grad, axis=ctx.axes)


@torch_names
def flip(a: Tensor, axis: Axes) -> Tensor:
    """``a`` reversed along ``axis`` (an int or a tuple of ints; PyTorch's ``dims``, required as
    there): ``flip(x, 0)`` puts the last row first. A bidirectional RNN reads the sequence
    flipped along time. The gradient is flipped back."""
    return Flip.apply(a, normalize_axes(axis, a.ndim, "flip"))


def broadcast_to(a: Tensor, *shape: Shape) -> Tensor:
    """``a`` repeated along its axes of length 1 (and new leading axes) to ``shape``, NumPy's
    broadcasting rule made explicit; the gradient is summed back over the repeated axes."""
    return BroadcastTo.apply(a, _shape_arg(shape))


def expand(a: Tensor, *shape: Shape) -> Tensor:
    """PyTorch's ``expand``: like broadcast_to, with -1 meaning "keep this axis"."""
    shape = _shape_arg(shape)
    lead = len(shape) - a.ndim
    if -1 in shape[: max(lead, 0)]:
        raise ShapeError(
            f"expand: -1 (keep the size) in {shape} at a new leading axis, which {tuple(a.shape)} does "
            "not have; give its size"
        )
    shape = tuple(a.shape[i - lead] if n == -1 else n for i, n in enumerate(shape))
    return BroadcastTo.apply(a, shape)


@torch_names
def squeeze(a: Tensor, axis: Axes | None = None) -> Tensor:
    """Remove axes of length 1 (all of them, or the given ones)."""
    if axis is None:
        shape = tuple(n for n in a.shape if n != 1)
    else:
        axes = normalize_axes(axis, a.ndim, "squeeze")
        for x in axes:
            if a.shape[x] != 1:
                raise ShapeError(f"squeeze: axis {x} of shape {a.shape} has length {a.shape[x]}, not 1")
        shape = tuple(n for i, n in enumerate(a.shape) if i not in axes)
    return Reshape.apply(a, shape)


@torch_names
def unsqueeze(a: Tensor, axis: int) -> Tensor:
    """Insert an axis of length 1 at ``axis`` (negative counts from the new end)."""
    axis = normalize_axis(axis, a.ndim, "unsqueeze", new=True)
    return Reshape.apply(a, a.shape[:axis] + (1,) + a.shape[axis:])
