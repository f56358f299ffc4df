"""Comparisons and logic: ``a < b``, ``a == b``, ``a & b``, ``~a``, ``a.any()``... as bool tensors.

They are Functions like every op, so that every tensor an op makes comes out of
``Function.apply``, but declared ``differentiable = False``: a comparison is a step, its
derivative 0 wherever it is defined, so its output never requires grad and there is no
``backward`` to write. A mask built from them (``arange(K) < valid_len``) stops the gradient;
the scores it selects (``where``, ``masked_fill``) carry it.
"""

from typing import Any

from ..autograd import Function
from ..tensor import Array, Tensor


class Compare(Function):
    """The base of the comparisons and logical ops: elementwise, a bool tensor, outside the graph."""

    differentiable = False


class Equal(Compare):
    """``a == b`` elementwise."""

    @staticmethod
    def forward(ctx: Any, a: Array, b: Any) -> Array:
        return a == b


class NotEqual(Compare):
    """``a != b`` elementwise."""

    @staticmethod
    def forward(ctx: Any, a: Array, b: Any) -> Array:
        return a != b


class Less(Compare):
    """``a < b`` elementwise."""

    @staticmethod
    def forward(ctx: Any, a: Array, b: Any) -> Array:
        return a < b


class LessEqual(Compare):
    """``a <= b`` elementwise."""

    @staticmethod
    def forward(ctx: Any, a: Array, b: Any) -> Array:
        return a <= b


class Greater(Compare):
    """``a > b`` elementwise."""

    @staticmethod
    def forward(ctx: Any, a: Array, b: Any) -> Array:
        return a > b


class GreaterEqual(Compare):
    """``a >= b`` elementwise."""

    @staticmethod
    def forward(ctx: Any, a: Array, b: Any) -> Array:
        return a >= b


class And(Compare):
    """``a & b``: logical and of bool tensors (bitwise of integer ones)."""

    @staticmethod
    def forward(ctx: Any, a: Array, b: Any) -> Array:
        return a & b


class Or(Compare):
    """``a | b``: logical or of bool tensors (bitwise of integer ones)."""

    @staticmethod
    def forward(ctx: Any, a: Array, b: Any) -> Array:
        return a | b


class Xor(Compare):
    """``a ^ b``: exclusive or of bool tensors (bitwise of integer ones)."""

    @staticmethod
    def forward(ctx: Any, a: Array, b: Any) -> Array:
        return a ^ b


class Invert(Compare):
    """``~a``: logical not of a bool tensor (bitwise of an integer one)."""

    @staticmethod
    def forward(ctx: Any, a: Array) -> Array:
        return ~a


class AnyTrue(Compare):
    """Whether any element is true (nonzero), over all or along ``axis``."""

    @staticmethod
    def forward(ctx: Any, a: Array, axis: int | None = None) -> Array:
        return a.any(axis=axis)


class AllTrue(Compare):
    """Whether every element is true (nonzero), over all or along ``axis``."""

    @staticmethod
    def forward(ctx: Any, a: Array, axis: int | None = None) -> Array:
        return a.all(axis=axis)


class IsNaN(Compare):
    """``isnan(a)``: True where an element is NaN (not a number: 0/0, inf - inf)."""

    @staticmethod
    def forward(ctx: Any, a: Array) -> Array:
        return ctx.xp.isnan(a)


class IsInf(Compare):
    """``isinf(a)``: True where an element is +inf or -inf."""

    @staticmethod
    def forward(ctx: Any, a: Array) -> Array:
        return ctx.xp.isinf(a)


class IsFinite(Compare):
    """``isfinite(a)``: True where an element is neither NaN nor infinite."""

    @staticmethod
    def forward(ctx: Any, a: Array) -> Array:
        return ctx.xp.isfinite(a)


def isnan(a: Tensor) -> Tensor:
    """True where ``a`` is NaN, a bool tensor outside the graph: ``loss.isnan()`` catches a
    diverging run (NaN is the one value not equal to itself, ``a != a``)."""
    return IsNaN.apply(a)


def isinf(a: Tensor) -> Tensor:
    """True where ``a`` is +inf or -inf (an overflow, a masked score), a bool tensor outside the graph."""
    return IsInf.apply(a)


def isfinite(a: Tensor) -> Tensor:
    """True where ``a`` is an ordinary number, neither NaN nor +-inf, a bool tensor outside the
    graph: ``isfinite(grad).all()`` before an optimiser step."""
    return IsFinite.apply(a)
