"""The exceptions minitensor raises.

Each is a subclass of a built-in exception, so ``except ValueError`` keeps working, but
carries a message that names the operation and the values involved and says what to do.
"""

from __future__ import annotations

try:
    from numpy.exceptions import AxisError as _NumPyAxisError
except ImportError:  # NumPy < 1.25
    # NumPy 2's stubs, which mypy reads, have no numpy.AxisError: this line is for NumPy 1.24 only
    from numpy import AxisError as _NumPyAxisError  # type: ignore[attr-defined,no-redef]


class ShapeError(ValueError):
    """Operands whose shapes do not fit the operation (broadcasting, matmul, reshape...)."""


class AxisError(ShapeError, _NumPyAxisError):
    """An axis argument that does not fit the tensor: out of range, repeated, not a permutation.

    Also NumPy's AxisError, so ``except numpy.exceptions.AxisError`` catches it, and like
    that one both a ValueError and an IndexError. ``axis`` and ``ndim`` hold the values
    involved (None where the message names several).
    """

    def __init__(self, message: str, axis: int | None = None, ndim: int | None = None) -> None:
        _NumPyAxisError.__init__(self, message)
        self.message = message
        self.axis, self.ndim = axis, ndim

    def __str__(self) -> str:
        return self.message  # NumPy's __str__ would append its own sentence to ours


class DeviceError(RuntimeError):
    """Tensors on different devices meet in one operation, or a device is unavailable."""


class DTypeError(TypeError):
    """Tensors whose dtypes cannot combine, or a dtype an operation cannot take."""


class GraphError(RuntimeError):
    """Misuse of the autograd graph: backward on a non-scalar, through a freed graph..."""


class GradcheckError(AssertionError):
    """Analytic and numerical gradients disagree (raised by ``minitensor.gradcheck``)."""
