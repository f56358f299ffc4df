"""Recording a forward pass: every op it runs, and where every length comes from.

The autograd graph is not enough to export a model: it records only what needs a gradient,
so it misses what runs under ``no_grad``, the masks built by comparisons and ``arange``, and
-- most of all -- the shape arithmetic. ``reshape(batch_size, num_steps, num_heads, -1)``
asks for the lengths of *this* input; exported as numbers, the graph would accept that one
size only. So, while ``tracing()`` is on:

- every ``Function.apply`` and every tensor made outside the graph (a comparison, ``arange``,
  ``argmax``, a cast) is appended to ``Trace.nodes`` with its inputs, its other arguments
  and its output tensor;
- ``Tensor.shape`` returns ``SymDim``s: ints with their value in this pass that also remember
  how to compute them, ``("dim", tensor, axis)``, and what arithmetic made them from others
  (``t.shape[1] // 2`` is ``("floordiv", ("dim", t, 1), 2)``). Comparisons and ``int()``
  give plain numbers: Python ``if``s take this pass's branch, as every tracer does.

``mt.onnx.export`` then turns the nodes into ONNX operators (``onnx/ops.py``).
"""

import contextlib
import operator

from ..core import tracing as seam  # the engine's one hook for a tracer
from ..grad_mode import no_grad


class SymDim(int):
    """A length read from a traced tensor's shape: an int (its value in this pass) that keeps
    ``expr``, how the exported graph computes it: ``("dim", tensor, axis)`` or
    ``(op, a, b)`` for ``+ - * // %`` of SymDims and ints."""

    def __new__(cls, value, expr):
        obj = int.__new__(cls, value)
        obj.expr = expr
        return obj

    def __repr__(self):
        return f"SymDim({int(self)})"


def _arithmetic(name, function):
    def forward(self, other):
        if type(other) is bool or not isinstance(other, int):
            return NotImplemented  # a float: the result is a plain number of this pass
        return SymDim(function(int(self), int(other)), (name, self, other))

    def reflected(self, other):
        if type(other) is bool or not isinstance(other, int):
            return NotImplemented
        return SymDim(function(int(other), int(self)), (name, other, self))

    return forward, reflected


for _name, _function in [
    ("add", operator.add),
    ("sub", operator.sub),
    ("mul", operator.mul),
    ("floordiv", operator.floordiv),
    ("mod", operator.mod),
]:
    _forward, _reflected = _arithmetic(_name, _function)
    setattr(SymDim, f"__{_name}__", _forward)
    setattr(SymDim, f"__r{_name}__", _reflected)
SymDim.__neg__ = lambda self: SymDim(-int(self), ("sub", 0, self))
SymDim.__index__ = lambda self: int(self)


class Node:
    """One recorded op: ``op`` (a Function subclass, or the name of an op made outside the
    graph: "lt", "arange", "astype"...), its positional ``args`` and keyword ``kwargs`` as
    the call got them (Tensors, numbers, SymDims, tuples of them), and its ``out`` Tensor."""

    __slots__ = ("op", "args", "kwargs", "out")

    def __init__(self, op, args, kwargs, out):
        self.op, self.args, self.kwargs, self.out = op, tuple(args), dict(kwargs), out

    @property
    def name(self):
        return self.op.__name__ if isinstance(self.op, type) else self.op

    def __repr__(self):
        return f"Node({self.name}, out shape {tuple(self.out.data.shape)})"


class Trace:
    """The nodes of one recorded forward pass, in the order they ran (see the module docstring)."""

    def __init__(self):
        self.nodes = []

    def function(self, cls, args, kwargs, out):
        self.nodes.append(Node(cls, args, kwargs, out))

    def plain(self, name, inputs, attrs, out):
        self.nodes.append(Node(name, inputs, attrs, out))

    def shape(self, tensor):
        return symbolic_shape(tensor)


def symbolic_shape(tensor):
    """``tensor``'s shape as SymDims: each length with the tensor and axis it is read from."""
    return tuple(SymDim(n, ("dim", tensor, axis)) for axis, n in enumerate(tensor.data.shape))


@contextlib.contextmanager
def tracing():
    """Record every op run inside the block into the ``Trace`` it yields (no gradients: export
    is of the forward pass). Traces do not nest."""
    if seam.active is not None:
        raise RuntimeError("mt.onnx: a forward pass is already being traced (traces do not nest)")
    trace = Trace()
    seam.active = trace
    try:
        with no_grad():
            yield trace
    finally:
        seam.active = None
