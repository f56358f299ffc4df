"""Recording a forward pass: every op it runs, and where every length comes from.

The autograd graph is not enough to export a model: it records only what needs a gradient,
so it misses what runs under ``no_grad``, the masks built by comparisons and ``arange``, and
-- most of all -- the shape arithmetic. ``reshape(batch_size, num_steps, num_heads, -1)``
asks for the lengths of *this* input; exported as numbers, the graph would accept that one
size only. So ``tracing(*inputs)`` installs a ``Trace`` at the engine's one hook for a tracer
(``minitensor/core/tracing.py``: ``Function.apply`` reports every op to it), and then:

- every op -- the differentiable ones and those outside the graph alike (a comparison,
  ``arange``, ``argmax``, ``zeros``: Functions too) -- is appended to ``Trace.nodes`` with its
  inputs, its other arguments and its output tensor;
- that output, and each example input, becomes a ``TracedTensor`` for the length of the trace:
  the same tensor, whose ``shape`` gives ``SymDim``s, ints with their value in this pass that
  also remember how to compute them, ``("dim", tensor, axis)``, and what arithmetic made them
  from others (``t.shape[1] // 2`` is ``("floordiv", ("dim", t, 1), 2)``). Comparisons and
  ``int()`` give plain numbers: Python ``if``s take this pass's branch, as every tracer does.
  A tensor made before the trace (a parameter, a buffer) keeps plain lengths: it is a
  constant of the graph. When the trace ends every TracedTensor is a plain ``Tensor`` again;
- a write ``x[index] = v`` into a TracedTensor (D2L's ``X[~mask] = -1e6``) is recorded as an op
  whose output is x, after the value x had before it has taken x's place in every node recorded
  so far (``Trace.write``): the nodes follow tensors by identity, and x names two values.

``mt.onnx.export`` then turns the nodes into ONNX operators (``onnx/ops.py``).
"""

import contextlib
import operator

from .. import Tensor
from .. import tracing as engine_tracing
from ..grad_mode import no_grad
from ..ops import indexing
from ..tracing import install


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
    """One recorded op: ``op`` (the Function class), its positional ``args`` and keyword ``kwargs``
    as the call got them (Tensors, numbers, SymDims, tuples of them), and its ``out`` Tensor."""

    __slots__ = ("op", "args", "kwargs", "out")

    def __init__(self, op, args, kwargs, out):
        self.op, self.args, self.kwargs, self.out = op, tuple(args), dict(kwargs), out

    @property
    def name(self):
        return self.op.__name__

    def __repr__(self):
        return f"Node({self.name}, out shape {tuple(self.out.data.shape)})"


class TracedTensor(Tensor):
    """A tensor of the pass being traced: the same Tensor, whose ``shape`` is ``SymDim``s.

    The tracer gives this class to the example inputs and to every tensor an op makes while
    it runs, and gives them back ``Tensor`` when the trace ends (``Trace.end``): the engine's
    ``Tensor.shape`` stays plain code, and no tensor outlives the trace with symbolic lengths.
    """

    __slots__ = ()  # the same layout as Tensor's, so that a tensor can change class

    @property
    def shape(self):
        """The lengths as SymDims: plain ints of this pass that remember where they came from."""
        return symbolic_shape(self)

    def __setitem__(self, index, value):
        """``x[index] = value`` in the pass being traced: recorded as the write's op, whose output
        is x itself from here on, while the nodes recorded so far are made to name the value x
        had (``Trace.write``). Export runs under no_grad, where a plain tensor's write would be
        in place and record nothing."""
        engine_tracing.tracer.write(self, index, value)


class Trace:
    """The nodes of one recorded forward pass, in the order they ran (see the module docstring)."""

    def __init__(self):
        self.nodes = []
        self._traced = []  # the tensors made TracedTensors, to be given back their class
        self._originals = {}  # id(x) -> the tensor that holds x's value from before its first write

    def function(self, cls, args, kwargs, out):
        """The engine's hook: ``Function.apply`` ran ``cls`` on ``args``, ``kwargs`` and made ``out``."""
        self.nodes.append(Node(cls, args, kwargs, out))
        self.watch(out)

    def watch(self, tensor):
        """Read ``tensor``'s lengths as SymDims until the trace ends (an input of the pass)."""
        if type(tensor) is Tensor:  # (a Parameter or another subclass keeps its class and plain lengths)
            tensor.__class__ = TracedTensor
            self._traced.append(tensor)

    def write(self, x, index, value):
        """``x[index] = value``: a new tensor takes over the value x had -- in every node recorded
        so far and every length read from x (they ran before the write) -- then the write is
        recorded as the op ``setitem`` of that value, with x as its output. Ops before the write
        read the old value and ops after it the new one, as the pass ran; the graph has no
        in-place writes."""
        before = Tensor._make(x.data, x._backend, None)
        self.watch(before)
        for node in self.nodes:
            node.args, node.kwargs = _renamed((node.args, node.kwargs), x, before)
            if node.out is x:
                node.out = before
        self._originals.setdefault(id(x), before)
        after = indexing.setitem(before, index, value)
        self.nodes[-1].out = x
        x.data = after.data

    def original(self, tensor):
        """The tensor holding ``tensor``'s value as the pass began (itself unless written in it)."""
        return self._originals.get(id(tensor), tensor)

    def end(self):
        """Every tensor of the trace a plain Tensor again (the outputs, the inputs, a cached state)."""
        for t in self._traced:
            t.__class__ = Tensor
        self._traced.clear()


def _renamed(value, old, new):
    """``value`` (nested tuples, lists, dicts, slices, SymDims, Tensors) with ``new`` wherever
    ``old`` was: a new object where something changed, ``value`` itself where nothing did."""
    if value is old:
        return new
    if isinstance(value, SymDim):
        kind, a, b = value.expr
        if kind == "dim":
            return SymDim(int(value), ("dim", new, b)) if a is old else value
        a2, b2 = _renamed(a, old, new), _renamed(b, old, new)
        return value if a2 is a and b2 is b else SymDim(int(value), (kind, a2, b2))
    if isinstance(value, (tuple, list)):
        parts = [_renamed(v, old, new) for v in value]
        return value if all(p is v for p, v in zip(parts, value)) else type(value)(parts)
    if isinstance(value, dict):
        return {k: _renamed(v, old, new) for k, v in value.items()}
    if isinstance(value, slice):
        return slice(*(_renamed(v, old, new) for v in (value.start, value.stop, value.step)))
    return value


def symbolic_shape(tensor):
    """``tensor``'s shape as SymDims: each length with the tensor and axis it is read from."""
    return tuple(SymDim(n, ("dim", tensor, axis)) for axis, n in enumerate(tensor.data.shape))


@contextlib.contextmanager
def tracing(*inputs):
    """Record every op run inside the block into the ``Trace`` it yields (no gradients: export
    is of the forward pass). The lengths of ``inputs`` (Tensors; anything else is passed over)
    and of every tensor made inside are SymDims while it runs. Traces do not nest."""
    trace = Trace()
    with install(trace), no_grad():
        try:
            for x in inputs:
                if isinstance(x, Tensor):
                    trace.watch(x)
            yield trace
        finally:
            trace.end()
