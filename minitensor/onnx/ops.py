"""How each of minitensor's ops is written in ONNX (opset 17).

One function per op, registered with ``@maps(op)``: it gets the ``GraphBuilder`` ``g`` and the
recorded ``Node`` (``node.args``, ``node.kwargs``, ``node.out``: what the op got and made, see
``trace.py``) and returns the name of the output. A Function of your own is written the same
way, as a ``to_onnx(g, node)`` static method on the class; one with neither is an
``ExportError`` that names it.

Two ops need more than one ONNX operator to mean the same thing:

- ``masked_softmax``: ONNX's Softmax of a row whose every score is -inf is NaN; minitensor's
  is zeros (a query with nothing to attend to attends to nothing). So the allowed positions
  are computed once (``arange(K) < valid_len``, and the mask), the scores outside them set to
  -inf, and the weights outside them set to exactly 0 after the Softmax: a fully masked row
  comes out zeros, its NaNs never leave the node.
- ``Linear`` stores W as (out, in), PyTorch's layout: y = x W^T + b is MatMul(x, Transpose(W)).
"""

import importlib

import numpy

from ..ops import convert, elementwise, indexing, join, norm, reduce, select, shape
from .graph import ExportError, onnx_dtype
from .trace import SymDim

# ops.matmul, ops.softmax and ops.dropout are also functions of ``minitensor.ops``: the modules by path
matmul = importlib.import_module("minitensor.ops.matmul")
softmax = importlib.import_module("minitensor.ops.softmax")
dropout = importlib.import_module("minitensor.ops.dropout")

MAPPINGS = {}
INT64_MAX = numpy.iinfo(numpy.int64).max


def maps(*ops):
    """Register the decorated function as the ONNX form of ``ops`` (Function classes, or the
    names of ops made outside the graph: "lt", "arange"...)."""

    def register(function):
        for op in ops:
            MAPPINGS[op] = function
        return function

    return register


def mapping_of(op):
    """The function that writes ``op`` in ONNX: its own ``to_onnx``, a registered one, or None."""
    own = getattr(op, "to_onnx", None)
    return own if own is not None else MAPPINGS.get(op)


def dims(g, tensor):
    """``tensor``'s shape as lengths ``g`` can compute (SymDims of a traced tensor)."""
    return tuple(SymDim(n, ("dim", tensor, axis)) for axis, n in enumerate(tensor.data.shape))


def axes_tensor(g, axes):
    return g.constant(numpy.array(list(axes), dtype=numpy.int64), "axes")


# -- elementwise --------------------------------------------------------------------------------
def _binary(onnx_op):
    def write(g, node):
        a, b = node.args
        return g.op(onnx_op, g.value(a), g.value(b, dtype=node.out.data.dtype))

    return write


for _op, _onnx in [
    (elementwise.Add, "Add"),
    (elementwise.Sub, "Sub"),
    (elementwise.Mul, "Mul"),
    (elementwise.Div, "Div"),
    (elementwise.Pow, "Pow"),
    (matmul.MatMul, "MatMul"),
]:
    MAPPINGS[_op] = _binary(_onnx)


def _unary(onnx_op):
    def write(g, node):
        return g.op(onnx_op, g.value(node.args[0]))

    return write


for _op, _onnx in [
    (elementwise.Neg, "Neg"),
    (elementwise.Exp, "Exp"),
    (elementwise.Log, "Log"),
    (elementwise.Sqrt, "Sqrt"),
    (elementwise.Tanh, "Tanh"),
    (elementwise.Sigmoid, "Sigmoid"),
    (elementwise.ReLU, "Relu"),
    (elementwise.Abs, "Abs"),
]:
    MAPPINGS[_op] = _unary(_onnx)


def _constant_like(g, value, tensor):
    return g.value(value, dtype=tensor.data.dtype)


@maps(elementwise.GELU)
def gelu(g, node):
    """0.5 x (1 + erf(x / sqrt 2))"""
    x, t = g.value(node.args[0]), node.args[0]
    erf = g.op("Erf", g.op("Div", x, _constant_like(g, numpy.sqrt(2.0), t)))
    return g.op("Mul", g.op("Mul", x, _constant_like(g, 0.5, t)), g.op("Add", erf, _constant_like(g, 1.0, t)))


@maps(elementwise.GELUTanh)
def gelu_tanh(g, node):
    """0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))"""
    x, t = g.value(node.args[0]), node.args[0]
    cube = g.op("Mul", g.op("Mul", x, x), x)
    inner = g.op("Add", x, g.op("Mul", cube, _constant_like(g, 0.044715, t)))
    tanh = g.op("Tanh", g.op("Mul", inner, _constant_like(g, numpy.sqrt(2 / numpy.pi), t)))
    return g.op("Mul", g.op("Mul", x, _constant_like(g, 0.5, t)), g.op("Add", tanh, _constant_like(g, 1.0, t)))


@maps(elementwise.Clip)
def clip(g, node):
    a = node.args[0]
    low, high = (
        node.kwargs.get("low", node.args[1] if len(node.args) > 1 else None),
        node.kwargs.get("high", node.args[2] if len(node.args) > 2 else None),
    )
    bound = [("" if v is None else _constant_like(g, v, a)) for v in (low, high)]
    return g.op("Clip", g.value(a), *bound)


@maps(select.Where)
def where(g, node):
    cond, a, b = node.args
    like = node.out.data.dtype
    return g.op("Where", g.value(cond), g.value(a, dtype=like), g.value(b, dtype=like))


@maps(convert.AsType)
def astype(g, node):
    return g.op("Cast", g.value(node.args[0]), to=onnx_dtype(node.out.data.dtype))


@maps(dropout.Dropout)
def dropout_in_training(g, node):
    raise ExportError("mt.onnx: dropout ran in training mode; export a model in eval mode (model.eval())")


# -- products and normalisation -------------------------------------------------------------------
@maps(matmul.Linear)
def linear(g, node):
    x, weight, bias = node.args
    y = g.op("MatMul", g.value(x), g.op("Transpose", g.value(weight), perm=[1, 0]))
    return y if bias is None else g.op("Add", y, g.value(bias))


@maps(norm.LayerNorm)
def layer_norm(g, node):
    x, weight, bias, num_axes, eps = node.args
    normalized = x.data.shape[x.data.ndim - num_axes :]
    scale = g.value(weight) if weight is not None else g.constant(numpy.ones(normalized, x.data.dtype), "ones")
    inputs = [g.value(x), scale] + ([g.value(bias)] if bias is not None else [])
    return g.op("LayerNormalization", *inputs, axis=-num_axes, epsilon=float(eps))


@maps(indexing.Embedding)
def embedding(g, node):
    weight, indices = node.args
    return g.op("Gather", g.value(weight), g.value(indices), axis=0)


# -- softmax and friends --------------------------------------------------------------------------
@maps(softmax.Softmax)
def softmax_(g, node):
    x = node.args[0]
    axis = node.kwargs.get("axis", node.args[1] if len(node.args) > 1 else -1)
    return g.op("Softmax", g.value(x), axis=axis)


def allowed_positions(g, x, valid_lens, mask):
    """The bool tensor (broadcastable to ``x``'s (..., Q, K)) of the keys each row may attend
    to: ``arange(K) < valid_len`` of its row (``lens_per_row``), and ``mask``."""
    allowed = None
    if valid_lens is not None:
        lead = x.data.ndim - 1  # the axes of the rows: (batch, ..., Q)
        middle = lead - valid_lens.data.ndim
        lens = g.value(valid_lens)
        if valid_lens.data.dtype != numpy.int64:
            lens = g.op("Cast", lens, to=onnx_dtype(numpy.int64))
        # (batch, 1 x middle, rest..., 1): batch first, the rest aligned with the last row axes
        new_axes = list(range(1, 1 + middle)) + [lead]
        lens = g.op("Unsqueeze", lens, axes_tensor(g, new_axes))
        keys = dims(g, x)[-1]
        positions = g.op("Range", g.scalar(0), g.scalar(keys), g.scalar(1))
        allowed = g.op("Less", positions, lens)
    if mask is not None:
        allowed = g.value(mask) if allowed is None else g.op("And", allowed, g.value(mask))
    return allowed


@maps(softmax.MaskedSoftmax)
def masked_softmax(g, node):
    x = node.args[0]
    rest = list(node.args[1:]) + [None, None]
    valid_lens = node.kwargs.get("valid_lens", rest[0])
    mask = node.kwargs.get("mask", rest[1])
    allowed = allowed_positions(g, x, valid_lens, mask)
    if allowed is None:
        return g.op("Softmax", g.value(x), axis=-1)
    minus_inf = _constant_like(g, -numpy.inf, x)
    weights = g.op("Softmax", g.op("Where", allowed, g.value(x), minus_inf), axis=-1)
    return g.op("Where", allowed, weights, _constant_like(g, 0.0, x))  # a fully masked row: zeros, not NaN


# -- shapes ---------------------------------------------------------------------------------------
@maps(shape.Reshape)
def reshape(g, node):
    a, new_shape = node.args
    return g.op("Reshape", g.value(a), g.shape(tuple(new_shape)))


@maps(shape.Permute)
def permute(g, node):
    a, axes = node.args
    return g.op("Transpose", g.value(a), perm=[int(x) % a.data.ndim for x in axes])


@maps(shape.BroadcastTo)
def broadcast_to(g, node):
    a, new_shape = node.args
    return g.op("Expand", g.value(a), g.shape(tuple(new_shape)))


@maps(join.Concat)
def concat(g, node):
    axis = node.kwargs.get("axis", 0)
    return g.op("Concat", *[g.value(t) for t in node.args], axis=axis)


@maps(join.Stack)
def stack(g, node):
    axis = node.kwargs.get("axis", 0) % (node.out.data.ndim)
    parts = [g.op("Unsqueeze", g.value(t), axes_tensor(g, [axis])) for t in node.args]
    return g.op("Concat", *parts, axis=axis)


@maps(indexing.GetItem)
def getitem(g, node):
    """Basic indexing (ints, slices, None, ...): Slice, then Squeeze the int axes, then Unsqueeze
    the new ones. Lengths in the slices may be SymDims (``P[:, :num_steps]``)."""
    a, index = node.args
    parts = list(index) if isinstance(index, tuple) else [index]
    if not all(p is None or p is Ellipsis or isinstance(p, (int, slice)) for p in parts):
        raise ExportError(
            "mt.onnx: indexing with an array or a tensor (advanced indexing) cannot be exported yet; "
            "use mt.embedding / gather-style ops"
        )
    ndim = a.data.ndim
    if Ellipsis in parts:
        at = parts.index(Ellipsis)
        used = sum(1 for p in parts if p is not None and p is not Ellipsis)
        parts[at : at + 1] = [slice(None)] * (ndim - used)
    axis, starts, ends, steps, axes, squeeze, unsqueeze = 0, [], [], [], [], [], []
    out_axis = 0
    for p in parts:
        if p is None:
            unsqueeze.append(out_axis)
            out_axis += 1
            continue
        if isinstance(p, slice):
            step = 1 if p.step is None else p.step
            if (p.start, p.stop, step) != (None, None, 1):
                default_end = INT64_MAX if step > 0 else -INT64_MAX
                starts.append(0 if p.start is None and step > 0 else (-1 if p.start is None else p.start))
                ends.append(default_end if p.stop is None else p.stop)
                steps.append(step)
                axes.append(axis)
            out_axis += 1
        else:  # an int: a one-long slice, squeezed away below
            starts.append(p)
            ends.append(INT64_MAX if p == -1 else p + 1)
            steps.append(1)
            axes.append(axis)
            squeeze.append(axis)
        axis += 1
    out = g.value(a)
    if axes:
        out = g.op("Slice", out, g.shape(starts), g.shape(ends), axes_tensor(g, axes), axes_tensor(g, steps))
    if squeeze:
        out = g.op("Squeeze", out, axes_tensor(g, squeeze))
    if unsqueeze:
        out = g.op("Unsqueeze", out, axes_tensor(g, unsqueeze))
    return out if out != g.value(a) else g.op("Identity", out)


# -- reductions -----------------------------------------------------------------------------------
def _axes(node, ndim):
    axis = node.kwargs.get("axis", node.args[1] if len(node.args) > 1 else None)
    if axis is None:
        return None
    return sorted(int(x) % ndim for x in (axis if isinstance(axis, (tuple, list)) else (axis,)))


def _keepdims(node):
    return int(bool(node.kwargs.get("keepdims", node.args[2] if len(node.args) > 2 else False)))


@maps(reduce.Sum)
def sum_(g, node):
    a = node.args[0]
    axes = _axes(node, a.data.ndim)
    inputs = [g.value(a)] + ([] if axes is None else [axes_tensor(g, axes)])
    return g.op("ReduceSum", *inputs, keepdims=_keepdims(node))


def _reduce_attr(onnx_op):
    def write(g, node):
        a = node.args[0]
        axes = _axes(node, a.data.ndim)
        attrs = {"keepdims": _keepdims(node)} | ({} if axes is None else {"axes": axes})
        return g.op(onnx_op, g.value(a), **attrs)

    return write


MAPPINGS[reduce.Mean] = _reduce_attr("ReduceMean")
MAPPINGS[reduce.Max] = _reduce_attr("ReduceMax")


@maps(reduce.Var)
def var(g, node):
    a = node.args[0]
    axes = _axes(node, a.data.ndim) or list(range(a.data.ndim))
    correction = node.kwargs.get("correction", 1)
    x = g.value(a)
    centred = g.op("Sub", x, g.op("ReduceMean", x, axes=axes, keepdims=1))
    total = g.op("ReduceSum", g.op("Mul", centred, centred), axes_tensor(g, axes), keepdims=_keepdims(node))
    shape_ = dims(g, a)
    count = 1
    for axis in axes:
        count = count * shape_[axis]
    denominator = g.op("Cast", g.scalar(count - correction), to=onnx_dtype(a.data.dtype))
    return g.op("Div", total, g.op("Max", denominator, _constant_like(g, 0.0, a)))


# -- ops made outside the graph (comparisons, masks, positions) -----------------------------------
for _name, _onnx in [
    ("lt", "Less"),
    ("le", "LessOrEqual"),
    ("gt", "Greater"),
    ("ge", "GreaterOrEqual"),
    ("eq", "Equal"),
]:

    def _compare(g, node, _onnx=_onnx):
        a, b = node.args
        return g.op(_onnx, g.value(a), g.value(b, dtype=a.data.dtype))

    MAPPINGS[_name] = _compare


@maps("ne")
def not_equal(g, node):
    a, b = node.args
    return g.op("Not", g.op("Equal", g.value(a), g.value(b, dtype=a.data.dtype)))


for _name, _onnx in [("and", "And"), ("or", "Or"), ("xor", "Xor")]:

    def _logical(g, node, _onnx=_onnx):
        a, b = node.args
        if a.data.dtype != numpy.bool_:
            raise ExportError(f"mt.onnx: {_onnx.lower()} of {a.data.dtype} tensors (bitwise) cannot be exported")
        return g.op(_onnx, g.value(a), g.value(b, dtype=numpy.bool_))

    MAPPINGS[_name] = _logical


@maps("invert")
def invert(g, node):
    (a,) = node.args
    if a.data.dtype != numpy.bool_:
        raise ExportError(f"mt.onnx: ~ of a {a.data.dtype} tensor (bitwise not) cannot be exported")
    return g.op("Not", g.value(a))


@maps("any", "all")
def any_all(g, node):
    (a,) = node.args
    axis = node.kwargs.get("axis")
    as_int = g.op("Cast", g.value(a), to=onnx_dtype(numpy.int64))
    attrs = {"keepdims": 0} | ({} if axis is None else {"axes": [int(x) for x in numpy.atleast_1d(axis)]})
    reduced = g.op("ReduceMax" if node.op == "any" else "ReduceMin", as_int, **attrs)
    return g.op("Cast", reduced, to=onnx_dtype(numpy.bool_))


@maps("arange")
def arange(g, node):
    start, stop, step = node.args
    dtype = node.out.data.dtype
    if dtype == numpy.int64:
        return g.op("Range", *[g.scalar(v) if isinstance(v, int) else g.value(v) for v in (start, stop, step)])
    values = [
        g.op("Cast", g.scalar(v), to=onnx_dtype(dtype)) if isinstance(v, int) else g.value(v, dtype)
        for v in (start, stop, step)
    ]
    return g.op("Range", *values)


@maps("argmax", "argmin")
def arg_extreme(g, node):
    (a,) = node.args
    axis, keepdims = node.kwargs["axis"], node.kwargs["keepdims"]
    x = g.value(a)
    if axis is None:
        x, axis = g.op("Reshape", x, g.shape((-1,))), 0
    return g.op("ArgMax" if node.op == "argmax" else "ArgMin", x, axis=axis, keepdims=int(bool(keepdims)))


@maps("astype")
def cast(g, node):
    return g.op("Cast", g.value(node.args[0]), to=onnx_dtype(node.out.data.dtype))
