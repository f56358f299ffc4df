"""Writing ONNX: the names of values, constants, lengths computed in the graph, and nodes.

A mapping (``onnx/ops.py``, or a Function's own ``to_onnx``) receives a ``GraphBuilder`` ``g``
and the recorded ``Node``, and returns the name of the value that is the node's output:

    def to_onnx(g, node):                      # z = a * sigmoid(a)
        a = g.value(node.args[0])
        return g.op("Mul", a, g.op("Sigmoid", a))

``g.value(x)`` names anything the node got: a traced tensor (the output of an earlier node or
an input of the graph), a tensor made before tracing (a parameter, a buffer, a table: it
becomes an initializer), a number, or a ``SymDim`` (a length the graph computes). ``g.dim``
and ``g.shape`` give lengths as the 1-D int64 tensors that Reshape, Expand, Slice and Range
take; ``g.op`` appends a node and returns its output's name (names are made unique here).
"""

import numpy

from .. import Tensor
from .trace import SymDim

_ARITHMETIC = {"add": "Add", "sub": "Sub", "mul": "Mul", "floordiv": "Div", "mod": "Mod"}


class ExportError(ValueError):
    """The model (or one of its ops) cannot be written as ONNX; the message names what and why."""


def onnx_dtype(dtype):
    """The ONNX element type (TensorProto enum) of a NumPy dtype."""
    from onnx import helper

    return helper.np_dtype_to_tensor_dtype(numpy.dtype(dtype))


class GraphBuilder:
    """The nodes, initializers and value names of the graph being written."""

    def __init__(self, names=None):
        from onnx import helper, numpy_helper

        self._helper, self._numpy_helper = helper, numpy_helper
        self.nodes, self.initializers = [], []
        self.names = {}  # id(Tensor) -> its value's name
        self._alive = []  # the tensors named, so that their ids are not reused
        self._param_names = dict(names or {})  # id(Tensor) -> a parameter's name
        self._taken = set()
        self._constants = {}  # (dtype, shape, bytes) -> name: equal constants written once

    # -- names -----------------------------------------------------------------------------------
    def fresh(self, hint):
        """A value name not used yet, from ``hint``."""
        hint = "".join(c if c.isalnum() or c in "._" else "_" for c in hint) or "v"
        name, k = hint, 1
        while name in self._taken:
            k += 1
            name = f"{hint}_{k}"
        self._taken.add(name)
        return name

    def bind(self, tensor, name):
        """Record that ``tensor`` is the value ``name`` (a node's output, or an input of the graph)."""
        self.names[id(tensor)] = name
        self._alive.append(tensor)

    # -- values ----------------------------------------------------------------------------------
    def constant(self, array, hint="const"):
        """An initializer holding ``array`` (equal constants share one)."""
        array = numpy.asarray(array, order="C")  # (ascontiguousarray would make a 0-d array 1-d)
        key = (array.dtype.str, array.shape, array.tobytes())
        if key not in self._constants:
            name = self.fresh(hint)
            self.initializers.append(self._numpy_helper.from_array(array, name))
            self._constants[key] = name
        return self._constants[key]

    def value(self, x, dtype=None):
        """The name of ``x``: a Tensor (traced, or a constant), a SymDim (a 0-d int64 length), or a
        Python number (a 0-d constant of ``dtype``, default float32 for floats, int64 for ints)."""
        if isinstance(x, Tensor):
            if id(x) in self.names:
                return self.names[id(x)]
            hint = self._param_names.get(id(x), "const")
            name = self.constant(x._backend.to_numpy(x.data), hint)
            self.bind(x, name)
            return name
        if isinstance(x, SymDim):
            return self.scalar(x) if dtype is None else self.op("Cast", self.scalar(x), to=onnx_dtype(dtype))
        if isinstance(x, (bool, numpy.bool_)):
            return self.constant(numpy.array(x, dtype=dtype or bool))
        if isinstance(x, (int, numpy.integer)):
            return self.constant(numpy.array(x, dtype=dtype or numpy.int64))
        if isinstance(x, (float, numpy.floating)):
            return self.constant(numpy.array(x, dtype=dtype or numpy.float32))
        if isinstance(x, numpy.ndarray):
            return self.constant(x if dtype is None else x.astype(dtype))
        raise ExportError(f"mt.onnx: cannot write {type(x).__name__} {x!r} as an ONNX value")

    def tensor_attribute(self, array):
        """``array`` as a TensorProto, for an attribute that holds a tensor (ConstantOfShape's value)."""
        return self._numpy_helper.from_array(numpy.asarray(array), "value")

    # -- lengths ---------------------------------------------------------------------------------
    def dim(self, d):
        """A length as a 1-D int64 tensor of one element: computed in the graph for a SymDim of
        a traced tensor, a constant otherwise."""
        if not isinstance(d, SymDim):
            return self.constant(numpy.array([int(d)], dtype=numpy.int64), "len")
        kind, a, b = d.expr
        if kind == "dim":
            if id(a) not in self.names:  # a tensor made before tracing: its length is fixed
                return self.constant(numpy.array([int(d)], dtype=numpy.int64), "len")
            return self.op("Shape", self.names[id(a)], start=b, end=b + 1)
        if not isinstance(a, SymDim) and not isinstance(b, SymDim):
            return self.constant(numpy.array([int(d)], dtype=numpy.int64), "len")
        return self.op(_ARITHMETIC[kind], self.dim(a), self.dim(b))

    def scalar(self, d):
        """A length as a 0-d int64 tensor (what Range takes)."""
        if not isinstance(d, SymDim):
            return self.constant(numpy.array(int(d), dtype=numpy.int64), "len")
        return self.op("Squeeze", self.dim(d), self.constant(numpy.array([0], dtype=numpy.int64), "axes"))

    def shape(self, dims):
        """A shape (a tuple of ints and SymDims) as the 1-D int64 tensor Reshape and Expand take."""
        if not any(isinstance(d, SymDim) and self._computed(d) for d in dims):
            return self.constant(numpy.array([int(d) for d in dims], dtype=numpy.int64), "shape")
        return self.op("Concat", *[self.dim(d) for d in dims], axis=0)

    def _computed(self, d):
        kind, a, b = d.expr
        if kind == "dim":
            return id(a) in self.names
        return any(isinstance(x, SymDim) and self._computed(x) for x in (a, b))

    # -- nodes -----------------------------------------------------------------------------------
    def op(self, op_type, *inputs, outputs=1, **attributes):
        """Append an ``op_type`` node of ``inputs`` (names; "" for an absent optional input) and
        return its output name (a list of ``outputs`` names when more than one)."""
        names = [self.fresh(op_type.lower()) for _ in range(outputs)]
        self.nodes.append(self._helper.make_node(op_type, list(inputs), names, **attributes))
        return names[0] if outputs == 1 else names
