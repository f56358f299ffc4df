"""How each of minitensor's ops is written in ONNX (opset 17).

One function per op, registered with ``@maps(op)``: it gets the ``GraphBuilder`` ``g`` and the
recorded ``Node`` (``node.args``, ``node.kwargs``, ``node.out``: what the op got and made, see
``trace.py``) and returns the name of the output. A Function of your own is written the same
way, as a ``to_onnx(g, node)`` static method on the class; one with neither is an
``ExportError`` that names it.

Some ops need more than one ONNX operator to mean the same thing:

- ``masked_softmax`` (and ``softmax``): ONNX's Softmax of a row whose every score is -inf is
  NaN; minitensor's is zeros (a query with nothing to attend to attends to nothing). So the
  allowed positions are computed once (``arange(K) < valid_len``, and the mask), the scores
  outside them set to -inf, and every -inf score's weight set to exactly 0 after the Softmax:
  a fully masked row (or one that a -inf bias, a sliding window, leaves empty) comes out
  zeros, its NaNs never leave the node.
- ``Linear`` stores W as (out, in), PyTorch's layout: y = x W^T + b is MatMul(x, Transpose(W)).
- indexing with integer or bool arrays (NumPy's advanced indexing): Gather or GatherND, the
  axes moved as NumPy moves them (``getitem``).
- the sparse poolings (``sparsemax``, ``entmax15``, ``alpha_entmax``): their forward passes'
  formulas, the sort by TopK, the cumulative sums by CumSum, the bisection by a Loop.
- ``FlashAttention`` (streamed attention): the same attention computed on whole arrays.
"""

import importlib

import numpy

from .. import Tensor
from ..creation import Arange, Eye, Full
from ..ops import compare, conv, convert, elementwise, entmax, indexing, join, norm, reduce, select, shape
from .graph import ExportError, onnx_dtype
from .trace import symbolic_shape

# ops.matmul, ops.softmax... are also functions of ``minitensor.ops``: the modules by path
matmul = importlib.import_module("minitensor.ops.matmul")
softmax = importlib.import_module("minitensor.ops.softmax")
dropout = importlib.import_module("minitensor.ops.dropout")
sparsemax_ = importlib.import_module("minitensor.ops.sparsemax")
flash = importlib.import_module("minitensor.ops.flash_attention")

MAPPINGS = {}
"""{Function class: function(g, node) -> output name}: the ONNX form of each built-in op; ``maps`` fills it."""
INT64_MAX = numpy.iinfo(numpy.int64).max


def maps(*ops):
    """Register the decorated function as the ONNX form of ``ops`` (Function classes)."""

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
    return symbolic_shape(tensor)


def axes_tensor(g, axes):
    """``axes`` as the 1-D int64 constant that Squeeze, Unsqueeze, Slice and ReduceSum take."""
    return g.constant(numpy.array(list(axes), dtype=numpy.int64), "axes")


def _range(g, n, start=0):
    """start, start + 1, ..., n - 1 (int64; ``n`` may be a SymDim)."""
    return g.op("Range", g.scalar(start), g.scalar(n), g.scalar(1))


def _arg(node, i, name):
    """The argument ``name`` of the op, given at position ``i`` or by keyword (None if absent)."""
    return node.args[i] if len(node.args) > i else node.kwargs.get(name)


def _row_sum(g, value):
    """The sum over the last axis, kept as an axis of length 1."""
    return g.op("ReduceSum", value, axes_tensor(g, [-1]), keepdims=1)


# -- elementwise --------------------------------------------------------------------------------
def _binary(onnx_op):
    def write(g, node):
        """a <op> b, elementwise with broadcasting (or the matrix product)."""
        a, b = node.args  # a number on either side (``1 + x`` is Add(1, x)) takes the output's dtype
        like = node.out.data.dtype
        return g.op(onnx_op, g.value(a, dtype=like), g.value(b, dtype=like))

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


# Python's // and % round toward minus infinity. ONNX's Div truncates integers toward zero, and its
# Mod takes the divisor's sign (fmod=0) for integers only: integers go through Mod, with
# a // b = (a - a mod b) / b exactly, and floats through Floor(a / b).
@maps(elementwise.FloorDivide)
def floor_divide(g, node):
    """a // b"""
    like = node.out.data.dtype
    a, b = (g.value(v, dtype=like) for v in node.args)
    if like.kind in "iu":
        return g.op("Div", g.op("Sub", a, g.op("Mod", a, b, fmod=0)), b)
    return g.op("Floor", g.op("Div", a, b))


@maps(elementwise.Remainder)
def remainder(g, node):
    """a % b, with b's sign: a - b floor(a / b)"""
    like = node.out.data.dtype
    a, b = (g.value(v, dtype=like) for v in node.args)
    if like.kind in "iu":
        return g.op("Mod", a, b, fmod=0)
    return g.op("Sub", a, g.op("Mul", b, g.op("Floor", g.op("Div", a, b))))


def _unary(onnx_op):
    def write(g, node):
        """f(a), elementwise."""
        return g.op(onnx_op, g.value(node.args[0]))

    return write


for _op, _onnx in [
    (elementwise.Neg, "Neg"),
    (elementwise.Exp, "Exp"),
    (elementwise.Log, "Log"),
    (elementwise.Sqrt, "Sqrt"),
    (elementwise.Tanh, "Tanh"),
    (elementwise.Sin, "Sin"),
    (elementwise.Cos, "Cos"),
    (elementwise.Sigmoid, "Sigmoid"),
    (elementwise.ReLU, "Relu"),
    (elementwise.Abs, "Abs"),
]:
    MAPPINGS[_op] = _unary(_onnx)


def _constant_like(g, value, tensor):
    """The number ``value`` as a 0-d constant of ``tensor``'s dtype."""
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
    """min(max(a, low), high), either bound may be absent."""
    a = node.args[0]
    low, high = (
        node.kwargs.get("low", node.args[1] if len(node.args) > 1 else None),
        node.kwargs.get("high", node.args[2] if len(node.args) > 2 else None),
    )
    bound = [("" if v is None else _constant_like(g, v, a)) for v in (low, high)]
    return g.op("Clip", g.value(a), *bound)


@maps(select.Where)
def where(g, node):
    """a where cond, else b."""
    cond, a, b = node.args
    like = node.out.data.dtype
    return g.op("Where", g.value(cond), g.value(a, dtype=like), g.value(b, dtype=like))


@maps(convert.AsType)
def astype(g, node):
    """a converted to the output's dtype (``astype``, or a cast made by ``promote``)."""
    return g.op("Cast", g.value(node.args[0]), to=onnx_dtype(node.out.data.dtype))


@maps(dropout.Dropout)
def dropout_in_training(g, node):
    """Refused: dropout in eval mode is the identity and never records a node."""
    raise ExportError("mt.onnx: dropout ran in training mode; export a model in eval mode (model.eval())")


# -- products and normalisation -------------------------------------------------------------------
@maps(matmul.Linear)
def linear(g, node):
    """x W^T + b."""
    x, weight, bias = node.args
    y = g.op("MatMul", g.value(x), g.op("Transpose", g.value(weight), perm=[1, 0]))
    return y if bias is None else g.op("Add", y, g.value(bias))


@maps(norm.LayerNorm)
def layer_norm(g, node):
    """(x - mean) / sqrt(var + eps) * weight + bias over the last ``num_axes`` axes."""
    x, weight, bias, num_axes, eps = node.args
    normalized = x.data.shape[x.data.ndim - num_axes :]
    scale = g.value(weight) if weight is not None else g.constant(numpy.ones(normalized, x.data.dtype), "ones")
    inputs = [g.value(x), scale] + ([g.value(bias)] if bias is not None else [])
    return g.op("LayerNormalization", *inputs, axis=-num_axes, epsilon=float(eps))


@maps(conv.Conv1d, conv.Conv2d)
def convolution(g, node):
    """The cross-correlation of ``conv1d`` / ``conv2d`` (no bias: they add it after), with zero
    padding at both ends of each spatial axis; Conv2d's settings are (H, W) pairs, Conv1d's ints.
    ONNX's pads list every axis's begin, then every axis's end."""
    x, weight, stride, padding, dilation = node.args
    stride, padding, dilation = ((v,) if isinstance(v, int) else tuple(v) for v in (stride, padding, dilation))
    strides, pads, dilations = list(stride), list(padding) * 2, list(dilation)
    return g.op("Conv", g.value(x), g.value(weight), strides=strides, pads=pads, dilations=dilations)


@maps(indexing.Embedding)
def embedding(g, node):
    """weight[indices]: the rows picked."""
    weight, indices = node.args
    return g.op("Gather", g.value(weight), g.value(indices), axis=0)


# -- softmax and friends --------------------------------------------------------------------------
@maps(softmax.Softmax)
def softmax_(g, node):
    """exp(x - max) / sum exp(x - max) along ``axis``; a row of -inf is zeros, as minitensor's kernel gives."""
    x = node.args[0]
    axis = node.kwargs.get("axis", node.args[1] if len(node.args) > 1 else -1)
    scores = g.value(x)
    kept = g.op("Greater", scores, _constant_like(g, -numpy.inf, x))
    return g.op("Where", kept, g.op("Softmax", scores, axis=axis), _constant_like(g, 0.0, x))


def allowed_positions(g, ndim, keys, valid_lens, mask):
    """The bool tensor (broadcastable to scores (..., Q, K) of ``ndim`` axes, K = ``keys``) of
    the keys each row may attend to: ``arange(K) < valid_len`` of its row (``lens_per_row``),
    and ``mask``; None when neither is given."""
    allowed = None
    if valid_lens is not None:
        lead = ndim - 1  # the axes of the rows: (batch, ..., Q)
        middle = lead - valid_lens.data.ndim
        lens = g.value(valid_lens)
        if valid_lens.data.dtype != numpy.int64:
            lens = g.op("Cast", lens, to=onnx_dtype(numpy.int64))
        # (batch, 1 x middle, rest..., 1): batch first, the rest aligned with the last row axes
        new_axes = list(range(1, 1 + middle)) + [lead]
        lens = g.op("Unsqueeze", lens, axes_tensor(g, new_axes))
        allowed = g.op("Less", _range(g, keys), lens)
    if mask is not None:
        allowed = g.value(mask) if allowed is None else g.op("And", allowed, g.value(mask))
    return allowed


@maps(softmax.MaskedSoftmax)
def masked_softmax(g, node):
    """Softmax over the allowed keys (``allowed_positions``, and scores > -inf), 0 elsewhere:
    a row with no allowed finite score is zeros, as minitensor's kernel gives (Softmax is NaN)."""
    x = node.args[0]
    allowed = allowed_positions(g, x.data.ndim, dims(g, x)[-1], _arg(node, 1, "valid_lens"), _arg(node, 2, "mask"))
    scores = g.value(x)
    if allowed is not None:
        scores = g.op("Where", allowed, scores, _constant_like(g, -numpy.inf, x))
    weights = g.op("Softmax", scores, axis=-1)
    # -inf scores (masked, or from a bias) get exactly 0; so does a row that has nothing else
    kept = g.op("Greater", scores, _constant_like(g, -numpy.inf, x))
    return g.op("Where", kept, weights, _constant_like(g, 0.0, x))


# -- sparse poolings: sparsemax, 1.5-entmax, alpha-entmax ------------------------------------------
# Each is written from its formula on the scores' own shape (..., K), masked as ``candidate_rows``
# masks them: a key is a candidate when it is allowed (``valid_lens``, ``mask``) and its score is
# not -inf; the others are 0 in the sums and get weight 0, so a row with no candidate is zeros.
def _candidates(g, node, x, valid_lens, mask):
    """(z, allowed, K): the scores with the non-candidates set to 0, the bool candidates, and
    the number of keys (a SymDim); as ``candidate_rows``."""
    scores = g.value(x)
    if mask is not None:
        scores = g.op("Where", g.value(mask), scores, _constant_like(g, -numpy.inf, x))
    allowed = g.op("Greater", scores, _constant_like(g, -numpy.inf, x))
    keys = dims(g, x)[-1]
    lens = allowed_positions(g, node.out.data.ndim, keys, valid_lens, None)
    if lens is not None:
        allowed = g.op("And", allowed, lens)
    return g.op("Where", allowed, scores, _constant_like(g, 0.0, x)), allowed, keys


def _sorted_candidates(g, z, allowed, keys, x):
    """Each row sorted in decreasing order (TopK with k = K), its non-candidates last as 0, and
    the candidates' flags in that order; as ``sorted_candidates``."""
    minus_inf = _constant_like(g, -numpy.inf, x)
    values = g.op("TopK", g.op("Where", allowed, z, minus_inf), g.dim(keys), axis=-1, outputs=2)[0]
    allowed_sorted = g.op("Greater", values, minus_inf)
    return g.op("Where", allowed_sorted, values, _constant_like(g, 0.0, x)), allowed_sorted


def _one_to_k(g, keys, x):
    """j = 1, 2, ..., K in the scores' dtype."""
    return g.op("Cast", _range(g, keys + 1, start=1), to=onnx_dtype(x.data.dtype))


@maps(sparsemax_.Sparsemax)
def sparsemax(g, node):
    """max(z - tau, 0), tau = (z_(1) + ... + z_(k) - 1) / k: z_(j) the row sorted decreasingly,
    k the last j with 1 + j z_(j) > z_(1) + ... + z_(j) (CumSum)."""
    x = node.args[0]
    z, allowed, keys = _candidates(g, node, x, _arg(node, 1, "valid_lens"), _arg(node, 2, "mask"))
    z_sorted, allowed_sorted = _sorted_candidates(g, z, allowed, keys, x)
    cumsum = g.op("CumSum", z_sorted, g.value(-1))
    j = _one_to_k(g, keys, x)
    bound = g.op("Add", g.op("Mul", j, z_sorted), _constant_like(g, 1.0, x))
    in_support = g.op("Cast", g.op("And", allowed_sorted, g.op("Greater", bound, cumsum)), to=onnx_dtype(x.data.dtype))
    k = _row_sum(g, in_support)
    top_sum = _row_sum(g, g.op("Mul", z_sorted, in_support))
    tau = g.op("Div", g.op("Sub", top_sum, _constant_like(g, 1.0, x)), g.op("Max", k, _constant_like(g, 1.0, x)))
    weights = g.op("Relu", g.op("Sub", z, tau))  # max(z - tau, 0)
    return g.op("Where", allowed, weights, _constant_like(g, 0.0, x))


@maps(entmax.Entmax15)
def entmax15(g, node):
    """[z - tau]_+^2 with z = x / 2 shifted by the row max: tau = tau_k, the last k with
    tau_k <= z_(k), tau_k = M_k - sqrt(max((1 - k (M2_k - M_k^2)) / k, 0)), M_k and M2_k the
    means of the top k z_(j) and of their squares (CumSum / k)."""
    x = node.args[0]
    z, allowed, keys = _candidates(g, node, x, _arg(node, 1, "valid_lens"), _arg(node, 2, "mask"))
    z = g.op("Div", z, _constant_like(g, 2.0, x))
    z_sorted, allowed_sorted = _sorted_candidates(g, z, allowed, keys, x)
    top = g.op("Slice", z_sorted, g.shape([0]), g.shape([1]), axes_tensor(g, [-1]))  # the row max (0: no key)
    z = g.op("Sub", z, top)
    z_sorted = g.op("Mul", g.op("Sub", z_sorted, top), g.op("Cast", allowed_sorted, to=onnx_dtype(x.data.dtype)))
    j = _one_to_k(g, keys, x)
    mean = g.op("Div", g.op("CumSum", z_sorted, g.value(-1)), j)
    mean_sq = g.op("Div", g.op("CumSum", g.op("Mul", z_sorted, z_sorted), g.value(-1)), j)
    spread = g.op("Mul", j, g.op("Sub", mean_sq, g.op("Mul", mean, mean)))
    delta = g.op("Div", g.op("Sub", _constant_like(g, 1.0, x), spread), j)
    tau = g.op("Sub", mean, g.op("Sqrt", g.op("Max", delta, _constant_like(g, 0.0, x))))
    in_support = g.op("And", allowed_sorted, g.op("LessOrEqual", tau, z_sorted))
    k = _row_sum(g, g.op("Cast", in_support, to=onnx_dtype(numpy.int64)))
    tau_star = g.op("GatherElements", tau, g.op("Max", g.op("Sub", k, g.value(1)), g.value(0)), axis=-1)
    shifted = g.op("Relu", g.op("Sub", z, tau_star))
    return g.op("Where", allowed, g.op("Mul", shifted, shifted), _constant_like(g, 0.0, x))


@maps(entmax.AlphaEntmax)
def alpha_entmax(g, node):
    """[X - tau]_+^(1 / (alpha - 1)), X = (alpha - 1) z shifted to max 0 (non-candidates at -2),
    tau by the forward's bisection: from tau = -1 and a bracket of width 1 - (1/d)^(alpha - 1)
    (d candidates), ``BISECTION_STEPS`` halvings (a Loop) keeping tau where the weights sum to
    >= 1; then the weights at the bracket's middle, divided by their sum."""
    x, alpha = node.args[0], node.args[1]
    z, allowed, _ = _candidates(g, node, x, _arg(node, 2, "valid_lens"), _arg(node, 3, "mask"))
    if isinstance(alpha, Tensor):  # learned: 0-d or one element, in the graph
        am1 = g.op("Reshape", g.value(alpha), g.shape([]))
        if alpha.data.dtype != x.data.dtype:
            am1 = g.op("Cast", am1, to=onnx_dtype(x.data.dtype))
        am1 = g.op("Sub", am1, _constant_like(g, 1.0, x))
        power = g.op("Div", _constant_like(g, 1.0, x), am1)
    else:  # a float: alpha - 1 and 1 / (alpha - 1) in double, then the scores' dtype, as NumPy
        am1 = _constant_like(g, float(alpha) - 1.0, x)
        power = _constant_like(g, 1 / (float(alpha) - 1.0), x)
    zero, one = _constant_like(g, 0.0, x), _constant_like(g, 1.0, x)
    X = g.op("Mul", z, am1)
    top = g.op("ReduceMax", g.op("Where", allowed, X, _constant_like(g, -numpy.inf, x)), axes=[-1], keepdims=1)
    count = _row_sum(g, g.op("Cast", allowed, to=onnx_dtype(x.data.dtype)))
    top = g.op("Where", g.op("Greater", count, zero), top, zero)
    X = g.op("Where", allowed, g.op("Sub", X, top), _constant_like(g, -2.0, x))
    d = g.op("Max", count, one)

    def weights(tau):
        return g.op("Pow", g.op("Relu", g.op("Sub", X, tau)), power)

    tau_lo = g.op("Sub", g.op("Mul", d, zero), one)  # -1, one per row
    width = g.op("Sub", one, g.op("Pow", g.op("Div", one, d), am1))
    half = _constant_like(g, 0.5, x)

    def bisect(lo, width):
        width = g.op("Div", width, _constant_like(g, 2.0, x))
        mid = g.op("Add", lo, width)
        enough = g.op("GreaterOrEqual", _row_sum(g, weights(mid)), one)
        return g.op("Where", enough, mid, lo), width

    tau_lo, width = _loop(g, entmax.BISECTION_STEPS, bisect, [tau_lo, width], x.data.dtype)
    p = g.op("Where", allowed, weights(g.op("Add", tau_lo, g.op("Mul", width, half))), zero)
    total = _row_sum(g, p)
    return g.op("Div", p, g.op("Where", g.op("Greater", total, zero), total, one))


def _loop(g, steps, body, carried, dtype):
    """``carried`` (value names of ``dtype``) after ``steps`` runs of ``body(*carried) ->
    carried``, as one ONNX Loop whose body graph ``body`` writes with ``g`` (outer values are
    read by name, as ONNX allows)."""
    from onnx import TensorProto, helper

    outer, g.nodes = g.nodes, []
    inputs = [g.fresh("step"), g.fresh("cond")] + [g.fresh("carried") for _ in carried]
    try:
        results = body(*inputs[2:])
        cond_out = g.op("Identity", inputs[1])
    finally:
        body_nodes, g.nodes = g.nodes, outer
    element = onnx_dtype(dtype)
    graph = helper.make_graph(
        body_nodes,
        "loop_body",
        [
            helper.make_tensor_value_info(inputs[0], TensorProto.INT64, []),
            helper.make_tensor_value_info(inputs[1], TensorProto.BOOL, []),
        ]
        + [helper.make_tensor_value_info(name, element, None) for name in inputs[2:]],
        [helper.make_tensor_value_info(cond_out, TensorProto.BOOL, [])]
        + [helper.make_tensor_value_info(name, element, None) for name in results],
    )
    return g.op("Loop", g.value(steps), "", *carried, outputs=len(carried), body=graph)


# -- streamed attention ---------------------------------------------------------------------------
@maps(flash.FlashAttention)
def flash_attention(g, node):
    """The attention FlashAttention streams, as whole arrays: S = (scale q) k^T (+ table[h,
    j - i + Q - 1]), -inf where masked (valid_lens, mask, causal: j - i <= K - Q), then
    exp(S - m) with m the row max (0 for a row of -inf), normalised after the product with v:
    a row with no key is zeros. Query head h reads key/value head h // (H / g)."""
    q, k, v, table = node.args
    plan = node.kwargs["plan"]
    if plan.dropout_p:  # as the Dropout op: dropout in training, which an exported graph has not
        raise ExportError(
            f"mt.onnx: streamed attention dropped its weights (dropout_p={plan.dropout_p}) in training mode; "
            "export a model in eval mode (model.eval())"
        )
    valid_lens, mask = node.kwargs.get("masks") or (None, None)
    heads, groups, d = q.data.shape[1], k.data.shape[1], q.data.shape[-1]
    queries, keys = dims(g, q)[2], dims(g, k)[2]
    scaled = g.op("Mul", g.value(q), _constant_like(g, q.data.dtype.type(plan.scale), q))
    # the r = H / g query heads of a group stacked, (batch, g, r Q, d), against the group's keys
    grouped = g.op("Reshape", scaled, g.shape([0, groups, -1, d]))
    scores = g.op("MatMul", grouped, g.op("Transpose", g.value(k), perm=[0, 1, 3, 2]))
    scores = g.op("Reshape", scores, g.shape([0, heads, -1, 0]))  # (batch, H, Q, K)
    if table is not None or plan.causal:  # j - i, (Q, K): what the table and the causal mask read
        i = g.op("Unsqueeze", _range(g, queries), axes_tensor(g, [1]))
        distance = g.op("Sub", g.op("Unsqueeze", _range(g, keys), axes_tensor(g, [0])), i)
    if table is not None:
        columns = g.op("Add", distance, g.scalar(queries - 1))  # (j - i) + (Q - 1)
        scores = g.op("Add", scores, g.op("Gather", g.value(table), columns, axis=1))
    allowed = allowed_positions(g, 4, keys, valid_lens, mask)
    if plan.causal:
        causal = g.op("LessOrEqual", distance, g.scalar(keys - queries))
        allowed = causal if allowed is None else g.op("And", allowed, causal)
    minus_inf = _constant_like(g, -numpy.inf, q)
    if allowed is not None:
        scores = g.op("Where", allowed, scores, minus_inf)
    top = g.op("ReduceMax", scores, axes=[-1], keepdims=1)
    shift = g.op("Where", g.op("Equal", top, minus_inf), _constant_like(g, 0.0, q), top)
    weights = g.op("Exp", g.op("Sub", scores, shift))  # unnormalised: exp(-inf) = 0 for masked keys
    total = _row_sum(g, weights)
    grouped = g.op("Reshape", weights, g.shape([0, groups, -1, 0]))  # (batch, g, r Q, K)
    out = g.op("Reshape", g.op("MatMul", grouped, g.value(v)), g.shape([0, heads, -1, v.data.shape[-1]]))
    seen = g.op("Greater", total, _constant_like(g, 0.0, q))
    return g.op("Div", out, g.op("Where", seen, total, _constant_like(g, 1.0, q)))


# -- shapes ---------------------------------------------------------------------------------------
@maps(shape.Reshape)
def reshape(g, node):
    """a with the new shape (its lengths computed in the graph where they are traced)."""
    a, new_shape = node.args
    return g.op("Reshape", g.value(a), g.shape(tuple(new_shape)))


@maps(shape.Permute)
def permute(g, node):
    """a with its axes reordered."""
    a, axes = node.args
    return g.op("Transpose", g.value(a), perm=[int(x) % a.data.ndim for x in axes])


@maps(shape.Clone)
def clone(g, node):
    """a itself: ONNX values have no memory layout to copy into."""
    return g.op("Identity", g.value(node.args[0]))


@maps(select.Triangle)
def triangle(g, node):
    """tril / triu: the triangle of the last two axes, the rest zeros."""
    (a,) = node.args
    k = g.constant(numpy.array(node.kwargs["diagonal"], dtype=numpy.int64), "k")
    return g.op("Trilu", g.value(a), k, upper=int(not node.kwargs["lower"]))


@maps(reduce.TopKIndices)
def topk_indices(g, node):
    """The positions of the k largest (smallest) along ``axis``, in order: TopK's second output."""
    (a,) = node.args
    k = g.constant(numpy.array([node.kwargs["k"]], dtype=numpy.int64), "k")
    largest = int(bool(node.kwargs["largest"]))
    return g.op("TopK", g.value(a), k, axis=node.kwargs["axis"], largest=largest, sorted=1, outputs=2)[1]


@maps(reduce.TakeAlongAxis)
def take_along_axis(g, node):
    """a at ``indices`` along ``axis``: GatherElements."""
    a, indices = node.args
    return g.op("GatherElements", g.value(a), g.value(indices), axis=node.kwargs["axis"])


@maps(shape.BroadcastTo)
def broadcast_to(g, node):
    """a repeated along its axes of length 1 to the new shape."""
    a, new_shape = node.args
    return g.op("Expand", g.value(a), g.shape(tuple(new_shape)))


@maps(join.Tile)
def tile(g, node):
    """a copied end to end along each axis (``Tensor.repeat``): Tile, after Unsqueeze where the
    counts add leading axes. A count may be a traced length (``.repeat(batch_size, 1)``)."""
    a, reps = node.args
    x, lead = g.value(a), len(reps) - a.data.ndim
    if lead:
        x = g.op("Unsqueeze", x, axes_tensor(g, range(lead)))
    return g.op("Tile", x, g.shape(tuple(reps)))


@maps(join.RepeatInterleave)
def repeat_interleave(g, node):
    """Each slice along ``axis`` repeated in place. One count r: a new axis after ``axis``, tiled
    r times, merged back (the other lengths read from the input, so they may vary); a count
    per slice: a Gather of the positions, which those counts fix."""
    a, counts, axis = node.args
    x, ndim = g.value(a), a.data.ndim
    if not isinstance(counts, int):
        positions = numpy.repeat(numpy.arange(len(counts), dtype=numpy.int64), counts)
        return g.op("Gather", x, g.constant(positions, "positions"), axis=axis)
    reps = (1,) * (axis + 1) + (counts,) + (1,) * (ndim - axis - 1)  # (the count may be a traced length)
    tiled = g.op("Tile", g.op("Unsqueeze", x, axes_tensor(g, [axis + 1])), g.shape(reps))
    shape = g.op("Shape", x)
    parts = [g.op("Slice", shape, axes_tensor(g, [0]), axes_tensor(g, [axis]))] if axis else []
    parts.append(axes_tensor(g, [-1]))
    if axis + 1 < ndim:
        parts.append(g.op("Slice", shape, axes_tensor(g, [axis + 1]), axes_tensor(g, [ndim])))
    return g.op("Reshape", tiled, g.op("Concat", *parts, axis=0))


@maps(indexing.SetItem)
def setitem(g, node):
    """``x[mask] = v`` with a bool mask of x's whole shape and one value (D2L's ``X[~mask] = -1e6``):
    Where. Other writes are refused with the form that exports."""
    a, value, index = node.args
    mask = indexing.select_mask(index, a.data.shape, value)  # (the rule the op's forward follows)
    if mask is None:
        raise ExportError(
            "mt.onnx: x[index] = v exports where index is a bool mask of x's whole shape and v one value "
            "(D2L's X[~mask] = -1e6); write the new value as x = mt.where(mask, v, x) instead"
        )
    v = g.value(value, dtype=a.data.dtype)
    if isinstance(value, Tensor) and value.data.dtype != a.data.dtype:
        v = g.op("Cast", v, to=onnx_dtype(a.data.dtype))
    return g.op("Where", g.value(mask), v, g.value(a))


@maps(join.Concat)
def concat(g, node):
    """The tensors joined along an existing axis."""
    axis = node.kwargs.get("axis", 0)
    return g.op("Concat", *[g.value(t) for t in node.args], axis=axis)


@maps(join.Stack)
def stack(g, node):
    """The tensors joined along a new axis."""
    axis = node.kwargs.get("axis", 0) % (node.out.data.ndim)
    parts = [g.op("Unsqueeze", g.value(t), axes_tensor(g, [axis])) for t in node.args]
    return g.op("Concat", *parts, axis=axis)


@maps(indexing.GetItem)
def getitem(g, node):
    """``a[index]`` with NumPy's rules: basic parts (ints, slices, None, ...) by Slice, Squeeze
    and Unsqueeze; integer or bool arrays and tensors (advanced indexing) by Gather or GatherND
    (``_advanced_getitem``). Lengths in the slices may be SymDims (``P[:, :num_steps]``)."""
    a, index = node.args
    parts = [_index_part(p) for p in (index if isinstance(index, tuple) else (index,))]
    if any(isinstance(p, (Tensor, numpy.ndarray)) for p in parts):
        return _advanced_getitem(g, a, parts)
    if not all(p is None or p is Ellipsis or isinstance(p, (int, slice)) for p in parts):
        raise ExportError(f"mt.onnx: cannot export indexing with {index!r}")
    ndim = a.data.ndim
    if Ellipsis in parts:
        at = parts.index(Ellipsis)
        used = sum(1 for p in parts if p is not None and p is not Ellipsis)
        parts[at : at + 1] = [slice(None)] * (ndim - used)
    axis, squeeze, unsqueeze = 0, [], []
    out_axis = 0
    sliced = {}  # axis -> the slice that reads it
    for p in parts:
        if p is None:
            unsqueeze.append(out_axis)
            out_axis += 1
            continue
        if isinstance(p, slice):
            sliced[axis] = p
            out_axis += 1
        else:  # an int: a one-long slice, squeezed away below
            sliced[axis] = slice(p, INT64_MAX if p == -1 else p + 1)
            squeeze.append(axis)
        axis += 1
    out = _slice(g, g.value(a), sliced)
    if squeeze:
        out = g.op("Squeeze", out, axes_tensor(g, squeeze))
    if unsqueeze:
        out = g.op("Unsqueeze", out, axes_tensor(g, unsqueeze))
    return out if out != g.value(a) else g.op("Identity", out)


def _index_part(p):
    """One part of an index, with lists as arrays and NumPy integers as ints."""
    if isinstance(p, list):
        return numpy.asarray(p)
    if isinstance(p, numpy.integer):
        return int(p)
    return p


def _slice(g, x, slices):
    """``x`` read through ``slices`` ({axis: slice}; full slices are skipped): one Slice node."""
    starts, ends, steps, axes = [], [], [], []
    for axis, p in slices.items():
        step = 1 if p.step is None else p.step
        if (p.start, p.stop, step) == (None, None, 1):
            continue
        default_end = INT64_MAX if step > 0 else -INT64_MAX
        starts.append(0 if p.start is None and step > 0 else (-1 if p.start is None else p.start))
        ends.append(default_end if p.stop is None else p.stop)
        steps.append(step)
        axes.append(axis)
    if not axes:
        return x
    return g.op("Slice", x, g.shape(starts), g.shape(ends), axes_tensor(g, axes), axes_tensor(g, steps))


def _advanced_getitem(g, a, parts):
    """Integer-array indexing, NumPy's rules: the index arrays (and the ints beside them)
    broadcast together; their shape replaces the axes they index, in place when those axes are
    adjacent, first otherwise. A bool array stands for its ``nonzero()`` (NonZero for a traced
    one); ``None`` is a new axis of length 1, read whole; slices are applied first.

    One index array: ``Gather`` on its axis. Several: the indexed axes moved first, the arrays
    broadcast and stacked on a last axis, ``GatherND``, the result's axes moved in place."""

    def array(p):
        return p.data if isinstance(p, Tensor) else p

    ndim = a.data.ndim
    at = next((k for k, p in enumerate(parts) if p is Ellipsis), None)  # (``in`` would compare arrays)
    if at is not None:
        used = sum(array(p).ndim if _is_bool(p) else (p is not None and p is not Ellipsis) for p in parts)
        parts[at : at + 1] = [slice(None)] * (ndim - used)
    axes, new_axes = [], []  # one entry per axis of ``a`` with its new axes: a slice or an index
    for p in parts:
        if p is None:
            new_axes.append(len(axes))
            axes.append(slice(None))
        elif isinstance(p, (slice, int)):
            axes.append(p)
        elif _is_bool(p):  # True cells, axis by axis: NumPy's nonzero(), ONNX's NonZero rows
            if isinstance(p, Tensor):
                nonzero = g.op("NonZero", g.value(p))
                axes += [(g.op("Gather", nonzero, g.scalar(k), axis=0), 1) for k in range(p.data.ndim)]
            else:
                axes += [c.astype(numpy.int64) for c in numpy.nonzero(p)]
        elif array(p).dtype.kind in "iu":
            axes.append(p)
        else:
            raise ExportError(f"mt.onnx: cannot index with an array of {array(p).dtype}")
    x = g.value(a)
    if new_axes:
        x = g.op("Unsqueeze", x, axes_tensor(g, new_axes))
    axes += [slice(None)] * (ndim + len(new_axes) - len(axes))
    x = _slice(g, x, {axis: p for axis, p in enumerate(axes) if isinstance(p, slice)})
    picked = [axis for axis, p in enumerate(axes) if not isinstance(p, slice)]
    ranks = [axes[i][1] if isinstance(axes[i], tuple) else numpy.ndim(array(axes[i])) for i in picked]
    if len(picked) == 1:
        return g.op("Gather", x, _index_value(g, axes[picked[0]]), axis=picked[0])
    rest = [axis for axis in range(len(axes)) if axis not in picked]
    if picked != list(range(len(picked))):
        x = g.op("Transpose", x, perm=picked + rest)
    indices = [axes[i] for i in picked]
    if all(isinstance(i, (int, numpy.ndarray)) for i in indices):  # all constants: stacked here
        stacked = g.constant(numpy.stack(numpy.broadcast_arrays(*indices), axis=-1).astype(numpy.int64), "index")
    else:  # i + (0 * i_1 + 0 * i_2 + ...): each index broadcast to their common shape
        names = [_index_value(g, i) for i in indices]
        zero = g.value(0)
        common = names[0] if len(names) == 1 else g.op("Mul", names[0], zero)
        for name in names[1:]:
            common = g.op("Add", common, g.op("Mul", name, zero))
        last = axes_tensor(g, [-1])
        stacked = g.op("Concat", *[g.op("Unsqueeze", g.op("Add", n, common), last) for n in names], axis=-1)
    out = g.op("GatherND", x, stacked)  # (broadcast shape..., the other axes...)
    first, nb = picked[0], max(ranks)
    if picked == list(range(first, first + len(picked))) and first > 0:  # adjacent: back in place
        perm = [nb + i for i in range(first)] + list(range(nb)) + [nb + i for i in range(first, len(rest))]
        out = g.op("Transpose", out, perm=perm)
    return out


def _is_bool(p):
    return isinstance(p, (Tensor, numpy.ndarray)) and (p.data if isinstance(p, Tensor) else p).dtype.kind == "b"


def _index_value(g, index):
    """An index part as an int64 value: an int, an integer array or Tensor, or (name, ndim) of
    one computed in the graph."""
    if isinstance(index, tuple):
        return index[0]
    if isinstance(index, int):
        return g.value(index)
    if isinstance(index, numpy.ndarray):
        return g.constant(index.astype(numpy.int64), "index")
    name = g.value(index)
    return name if index.data.dtype == numpy.int64 else g.op("Cast", name, to=onnx_dtype(numpy.int64))


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
    """The sum over ``axis`` (all axes by default)."""
    a = node.args[0]
    axes = _axes(node, a.data.ndim)
    inputs = [g.value(a)] + ([] if axes is None else [axes_tensor(g, axes)])
    return g.op("ReduceSum", *inputs, keepdims=_keepdims(node))


def _reduce_attr(onnx_op):
    def write(g, node):
        """The mean / max over ``axis`` (all axes by default)."""
        a = node.args[0]
        axes = _axes(node, a.data.ndim)
        attrs = {"keepdims": _keepdims(node)} | ({} if axes is None else {"axes": axes})
        return g.op(onnx_op, g.value(a), **attrs)

    return write


MAPPINGS[reduce.Mean] = _reduce_attr("ReduceMean")
MAPPINGS[reduce.Max] = _reduce_attr("ReduceMax")


@maps(reduce.Var)
def var(g, node):
    """sum (a - mean)^2 / max(n - correction, 0) over ``axis``."""
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
for _op, _onnx in [
    (compare.Less, "Less"),
    (compare.LessEqual, "LessOrEqual"),
    (compare.Greater, "Greater"),
    (compare.GreaterEqual, "GreaterOrEqual"),
    (compare.Equal, "Equal"),
]:

    def _compare(g, node, _onnx=_onnx):
        """a < b, a <= b, ... elementwise, as bools."""
        a, b = node.args
        return g.op(_onnx, g.value(a), g.value(b, dtype=a.data.dtype))

    MAPPINGS[_op] = _compare


@maps(compare.NotEqual)
def not_equal(g, node):
    """a != b elementwise, as bools."""
    a, b = node.args
    return g.op("Not", g.op("Equal", g.value(a), g.value(b, dtype=a.data.dtype)))


for _op, _onnx in [(compare.And, "And"), (compare.Or, "Or"), (compare.Xor, "Xor")]:

    def _logical(g, node, _onnx=_onnx):
        """a & b, a | b, a ^ b of bool tensors."""
        a, b = node.args
        if a.data.dtype != numpy.bool_:
            raise ExportError(f"mt.onnx: {_onnx.lower()} of {a.data.dtype} tensors (bitwise) cannot be exported")
        return g.op(_onnx, g.value(a), g.value(b, dtype=numpy.bool_))

    MAPPINGS[_op] = _logical


@maps(compare.Invert)
def invert(g, node):
    """~a of a bool tensor."""
    (a,) = node.args
    if a.data.dtype != numpy.bool_:
        raise ExportError(f"mt.onnx: ~ of a {a.data.dtype} tensor (bitwise not) cannot be exported")
    return g.op("Not", g.value(a))


@maps(compare.AnyTrue, compare.AllTrue)
def any_all(g, node):
    """Whether any / every element along ``axis`` is True."""
    (a,) = node.args
    axis = node.kwargs.get("axis")
    as_int = g.op("Cast", g.value(a), to=onnx_dtype(numpy.int64))
    attrs = {"keepdims": 0} | ({} if axis is None else {"axes": [int(x) for x in numpy.atleast_1d(axis)]})
    reduced = g.op("ReduceMax" if node.op is compare.AnyTrue else "ReduceMin", as_int, **attrs)
    return g.op("Cast", reduced, to=onnx_dtype(numpy.bool_))


@maps(Arange)
def arange(g, node):
    """start, start + step, ... below stop (the bounds may be traced lengths)."""
    start, stop, step = node.args
    dtype = node.out.data.dtype
    if dtype == numpy.int64:
        return g.op("Range", *[g.scalar(v) if isinstance(v, int) else g.value(v) for v in (start, stop, step)])
    values = [
        g.op("Cast", g.scalar(v), to=onnx_dtype(dtype)) if isinstance(v, int) else g.value(v, dtype)
        for v in (start, stop, step)
    ]
    return g.op("Range", *values)


@maps(reduce.ArgMax, reduce.ArgMin)
def arg_extreme(g, node):
    """The index of the largest / smallest element along ``axis`` (of all, flattened, by default)."""
    (a,) = node.args
    axis, keepdims = node.kwargs["axis"], node.kwargs["keepdims"]
    x = g.value(a)
    if axis is None:
        x, axis = g.op("Reshape", x, g.shape((-1,))), 0
    return g.op("ArgMax" if node.op is reduce.ArgMax else "ArgMin", x, axis=axis, keepdims=int(bool(keepdims)))


@maps(Eye)
def eye(g, node):
    """The identity matrix, a constant."""
    n, m = node.args
    return g.constant(numpy.eye(int(n), int(m), dtype=node.out.data.dtype), "eye")


@maps(Full)
def full(g, node):
    """zeros / ones / full of a shape that may hold traced lengths: ConstantOfShape."""
    shape, fill = node.args
    value = numpy.array([fill], dtype=node.out.data.dtype)
    return g.op("ConstantOfShape", g.shape(tuple(shape)), value=g.tensor_attribute(value))
