"""The exceptions minitensor raises.

Each is a subclass of a built-in exception, so ``except ValueError`` keeps working, but
carries a message that names the operation and the values involved and says what to do.
"""


class ShapeError(ValueError):
    """Operands whose shapes do not fit the operation (broadcasting, matmul, reshape...)."""


class DeviceError(RuntimeError):
    """Tensors on different devices meet in one operation, or a device is unavailable."""


class DTypeError(TypeError):
    """Tensors whose dtypes cannot combine, or a dtype an operation cannot take."""


class GraphError(RuntimeError):
    """Misuse of the autograd graph: backward on a non-scalar, through a freed graph..."""


class GradcheckError(AssertionError):
    """Analytic and numerical gradients disagree (raised by ``minitensor.gradcheck``)."""
