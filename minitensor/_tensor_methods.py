"""Python operators and methods of Tensor, each forwarding to a function in ``ops``.

Kept apart from ``tensor.py`` so that file shows what a tensor *is*; this one lists what it
can *do*. ``x + y`` is ``ops.add(x, y)`` (that is, ``Add.apply(x, y)``), ``x.sum(axis=0)`` is
``ops.sum(x, axis=0)``.
"""

from . import ops
from .ops import elementwise
from .ops.axes import normalize_axes
from .ops.matmul import MatMul
from .ops.promote import promote
from .tensor import Tensor

_PLAIN_NUMBER = {int, float}  # exact types: np.float64 subclasses float but is not weak


def _binary(op):
    """``x + y`` and ``y + x`` for the Function ``op``; the common case goes straight to it."""
    apply = op.apply

    def method(self, other):
        if (isinstance(other, Tensor) and other.data.dtype == self.data.dtype) or (
            type(other) in _PLAIN_NUMBER and self.data.dtype.kind == "f"
        ):
            return apply(self, other)
        return apply(*promote(self, other))

    def reflected(self, other):
        a, b = promote(self, other)
        return apply(b, a)

    return method, reflected


Tensor.__add__, Tensor.__radd__ = _binary(elementwise.Add)
Tensor.__sub__, Tensor.__rsub__ = _binary(elementwise.Sub)
Tensor.__mul__, Tensor.__rmul__ = _binary(elementwise.Mul)
Tensor.__truediv__, Tensor.__rtruediv__ = _binary(elementwise.Div)
Tensor.__pow__, Tensor.__rpow__ = _binary(elementwise.Pow)
Tensor.__matmul__, Tensor.__rmatmul__ = _binary(MatMul)
Tensor.__neg__ = ops.neg
Tensor.__getitem__ = ops.getitem


def _comparison(name):
    """Comparisons give bool tensors outside the graph: they have no useful derivative."""

    def method(self, other):
        a, b = promote(self, other)
        b = b.data if isinstance(b, Tensor) else b
        return Tensor._make(getattr(a.data, name)(b), a._backend, None)

    return method


for _name in ("__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__"):
    setattr(Tensor, _name, _comparison(_name))


def _logical(name):
    def method(self, other):
        b = other.data if isinstance(other, Tensor) else other
        return Tensor._make(getattr(self.data, name)(b), self._backend, None)

    return method


Tensor.__and__ = _logical("__and__")
Tensor.__or__ = _logical("__or__")
Tensor.__xor__ = _logical("__xor__")
Tensor.__invert__ = lambda self: Tensor._make(~self.data, self._backend, None)


def _any(self, axis=None):
    if axis is not None:
        axis = normalize_axes(axis, self.ndim, "any")
    return Tensor._make(self.data.any(axis=axis), self._backend, None)


def _all(self, axis=None):
    if axis is not None:
        axis = normalize_axes(axis, self.ndim, "all")
    return Tensor._make(self.data.all(axis=axis), self._backend, None)


Tensor.any, Tensor.all = _any, _all

# -- methods that are plain ops ---------------------------------------------------------------
Tensor.add, Tensor.sub, Tensor.mul = Tensor.__add__, Tensor.__sub__, Tensor.__mul__
Tensor.div, Tensor.pow, Tensor.matmul = Tensor.__truediv__, Tensor.__pow__, Tensor.__matmul__
for _name in (
    "neg",
    "exp",
    "log",
    "sqrt",
    "tanh",
    "sigmoid",
    "relu",
    "gelu",
    "abs",
    "clip",
    "clamp",
    "sum",
    "mean",
    "max",
    "min",
    "var",
    "argmax",
    "argmin",
    "reshape",
    "flatten",
    "permute",
    "transpose",
    "swapaxes",
    "broadcast_to",
    "expand",
    "squeeze",
    "unsqueeze",
    "softmax",
    "log_softmax",
    "masked_fill",
    "split",
):
    setattr(Tensor, _name, getattr(ops, _name))

Tensor.view = ops.reshape
Tensor.T = property(lambda self: ops.permute(self, tuple(reversed(range(self.ndim)))))
