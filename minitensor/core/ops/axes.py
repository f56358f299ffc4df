"""Checking axis arguments: every op that takes an axis goes through these functions.

A tensor of ``ndim`` dimensions has the axes 0..ndim-1, and negative ones count from the
end: -1 is the last, -ndim the first. Anything else is refused, as NumPy refuses it, with
an ``AxisError`` whose one message (``axis_error``) names the op, the axis and the ndim:

    softmax: axis 2 is out of bounds for a tensor of 2 dimensions (valid: -2..1)

Never ``axis % ndim``: it turns ``axis=2`` of a 2-D tensor into axis 0, and the op
silently computes along the wrong axis. Ops that insert an axis (``stack``, ``unsqueeze``)
count the new one: -ndim-1..ndim. A 0-d tensor has no axes at all.

The common case, an in-range Python int, costs two comparisons (these run on every
softmax, concat, transpose...); NumPy integers and mistakes take the slow path.

The parameters carry NumPy's names (``axis``, ``keepdims``), those of the arrays underneath;
``torch_names`` lets every op that has them take PyTorch's too (``dim``, ``keepdim``), so
``x.sum(dim=1, keepdim=True)`` from a PyTorch program is ``x.sum(axis=1, keepdims=True)``.
"""

from __future__ import annotations

import functools
import inspect
import operator
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

from ..errors import AxisError

P = ParamSpec("P")
R = TypeVar("R")


def axis_error(op: str, axis: int, ndim: int, new: bool = False, valid: str | None = None) -> AxisError:
    """The AxisError for ``axis`` outside a tensor of ``ndim`` dimensions: the one wording.

    ``new``: the op inserts an axis, so one more position is valid. ``valid``: the valid
    axes in words, where an op's rule is not the usual range.
    """
    n = ndim + 1 if new else ndim
    if valid is None:
        if n == 0:
            valid = "none, a 0-d tensor has no axes"
        else:
            valid = f"{-n}..{n - 1}" + (", counting the new axis" if new else "")
    return AxisError(f"{op}: axis {axis} is out of bounds for {_tensor_of(ndim)} (valid: {valid})", axis, ndim)


def _tensor_of(ndim: int) -> str:
    return "a tensor of 1 dimension" if ndim == 1 else f"a tensor of {ndim} dimensions"


def _as_int(axis: Any, op: str) -> int:
    """An axis given as a NumPy integer (or anything with ``__index__``) as a Python int."""
    try:
        return operator.index(axis)
    except TypeError:
        raise TypeError(f"{op}: axis must be an integer, got {axis!r} ({type(axis).__name__})") from None


def normalize_axis(axis: int, ndim: int, op: str, new: bool = False) -> int:
    """``axis`` (negative counts from the end) as an index in 0..ndim-1, or AxisError.

    ``new=True`` for an op that inserts an axis: the result is in 0..ndim.
    """
    n = ndim + 1 if new else ndim
    if type(axis) is not int:
        axis = _as_int(axis, op)
    if -n <= axis < n:
        return axis + n if axis < 0 else axis
    raise axis_error(op, axis, ndim, new)


def normalize_axes(axes: Any, ndim: int, op: str) -> tuple[int, ...]:
    """An axis or a sequence of axes as a tuple of indices in 0..ndim-1, in the order
    given; an axis named twice (``(0, 0)``, or ``(0, -2)`` on a 2-D tensor) is refused."""
    if not isinstance(axes, (tuple, list)):
        try:
            axes = (operator.index(axes),)
        except TypeError:
            raise TypeError(
                f"{op}: axis must be an integer or a tuple of integers, got {axes!r} ({type(axes).__name__})"
            ) from None
    out = tuple(normalize_axis(a, ndim, op) for a in axes)
    if len(set(out)) != len(out):
        twice = next(a for a in out if out.count(a) > 1)
        raise AxisError(f"{op}: axis {twice} is repeated in {tuple(axes)} ({_tensor_of(ndim)})", None, ndim)
    return out


#: PyTorch's name of each axis parameter -> NumPy's, the one minitensor's signatures use
TORCH_NAMES = {
    "dim": "axis",
    "keepdim": "keepdims",
    "dim0": "axis0",
    "dim1": "axis1",
    "start_dim": "start_axis",
    "end_dim": "end_axis",
}


def torch_names(fn: Callable[P, R]) -> Callable[P, R]:
    """``fn``, also taking PyTorch's names of its axis parameters (``TORCH_NAMES``) as keywords.

    A call by position or by NumPy's names passes straight through (one check of the keywords);
    both names of one parameter in one call is a TypeError, as two values for one parameter are.
    """
    parameters = inspect.signature(fn).parameters
    renames = {theirs: ours for theirs, ours in TORCH_NAMES.items() if ours in parameters}
    if not renames:
        raise TypeError(f"torch_names: {fn.__qualname__} has no axis parameter to rename")

    @functools.wraps(fn)
    def taking_torch_names(*args: P.args, **kwargs: P.kwargs) -> R:
        if kwargs and not renames.keys().isdisjoint(kwargs):
            for theirs, ours in renames.items():
                if theirs in kwargs:
                    if ours in kwargs:
                        raise TypeError(
                            f"{fn.__qualname__}() got both {ours}= and {theirs}=, NumPy's and PyTorch's "
                            f"name of one parameter: give one"
                        )
                    kwargs[ours] = kwargs.pop(theirs)
        return fn(*args, **kwargs)

    return taking_torch_names
