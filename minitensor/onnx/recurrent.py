"""Recurrent layers in ONNX: ``GRUSequence`` (``ops/rnn.py``) as ONNX's ``GRU`` operator.

``nn.GRU`` computes the inputs' share of the gates for every step outside the recurrence,
``gates_x = X W_ih^T + b_ih`` (num_steps, batch_size, 3 num_hiddens), and hands the rest to
``GRUSequence(gates_x, H0, W_hh, b_hh)``. ONNX's ``GRU`` (opset 14) with
``linear_before_reset=1`` computes the same equations (PyTorch's GRU: the reset gate acts on
``H_{t-1} W_hn^T + b_hn``, after the product). Three things differ, and the mapping bridges them:

- **Gate order.** minitensor (and PyTorch) stack the gates r, z, n; ONNX stacks them z, r, h
  (h is its name for n). The blocks of ``W_hh`` and ``b_hh`` are gathered in ONNX's order.
- **The input product.** ONNX's GRU takes X and W_ih and multiplies them itself; the op here
  gets ``gates_x``, already multiplied. So X = ``gates_x`` and W is the (3h, 3h) permutation
  matrix that reorders its blocks to z, r, n: a product with ones and zeros, exact.
  ``b_ih`` is already inside ``gates_x``, so the input half of ONNX's bias B is zeros.
- **Shapes.** ONNX's GRU has a direction axis: W, R, B and the initial state get one in
  front, and its output Y is (num_steps, 1, batch_size, num_hiddens), squeezed back to
  ``GRUSequence``'s (num_steps, batch_size, num_hiddens).

That is the float32 form. ONNX Runtime's GRU kernel takes float32 only, so other dtypes get
the recurrence written out, one step of ``GRUSequence.forward`` in the body of a ``Scan``.

A layer called with ``H=None`` starts from zeros it makes itself, ``zeros(num_layers,
batch_size, num_hiddens)``: a constant of the traced batch size, which would fix the batch
axis. The mapping leaves such a state out -- ONNX's GRU then starts from zeros of whatever
batch X has (the Scan, from zeros of gates_x's batch) -- so the exported layer keeps a dynamic
batch and sequence length.
"""

import numpy

from ..ops.rnn import GRUSequence
from .graph import onnx_dtype
from .ops import axes_tensor, dims, maps


def _onnx_gate_order(num_hiddens):
    """Row indices that take blocks stacked r, z, n to ONNX's z, r, n (= z, r, h)."""
    h = num_hiddens
    return numpy.concatenate([numpy.arange(h, 2 * h), numpy.arange(0, h), numpy.arange(2 * h, 3 * h)])


def _computed_from_constants(g, name):
    """Whether the value ``name`` depends on no input of the graph (only on initializers)."""
    producers = {out: node for node in g.nodes for out in node.output}
    initializers = {t.name for t in g.initializers}
    pending, seen = [name], set()
    while pending:
        value = pending.pop()
        if value in seen or value == "" or value in initializers:
            continue
        seen.add(value)
        node = producers.get(value)
        if node is None or node.op_type.startswith("Random"):  # an input of the graph, or a draw
            return False
        pending.extend(node.input)
    return True


def _zeros_made_for_the_trace(g, H0):
    """Whether ``H0`` is zeros computed from constants alone (a layer's ``H=None``): a state of
    the traced batch size that the exported graph should make for any batch instead."""
    if H0._backend.to_numpy(H0.data).any():
        return False
    # a tensor made before tracing is a constant (asked without g.value, which would store it)
    return id(H0) not in g.names or _computed_from_constants(g, g.names[id(H0)])


@maps(GRUSequence)
def gru_sequence(g, node):
    """``GRUSequence(gates_x, H0, W_hh, b_hh)``: gates_x (num_steps, batch_size, 3 num_hiddens),
    gates stacked r, z, n; H0 (batch_size, num_hiddens); W_hh (3 num_hiddens, num_hiddens);
    b_hh (3 num_hiddens,) or None -> H_1 .. H_T (num_steps, batch_size, num_hiddens).

    float32: ONNX's ``GRU`` operator (see the module docstring). Other dtypes: the same
    equations written out in a ``Scan`` over the steps, since ONNX Runtime's GRU kernel takes
    float32 only."""
    gates_x, H0, W_hh, b_hh = node.args
    initial = None if _zeros_made_for_the_trace(g, H0) else g.value(H0)
    if gates_x.data.dtype == numpy.float32:
        return _gru_operator(g, gates_x, initial, W_hh, b_hh)
    return _gru_scan(g, gates_x, initial, W_hh, b_hh)


def _gru_operator(g, gates_x, initial, W_hh, b_hh):
    """ONNX's ``GRU`` with ``linear_before_reset=1``: X = gates_x, W = the permutation to the
    gate order z, r, n, R = W_hh's blocks in that order, B = [zeros | b_hh's blocks];
    ``initial`` (batch_size, h), or None: ONNX's zeros."""
    h = W_hh.data.shape[-1]
    dtype = gates_x.data.dtype
    order = g.constant(_onnx_gate_order(h).astype(numpy.int64), "gru_gate_order")
    front = axes_tensor(g, [0])  # ONNX's direction axis (one direction) on W, R, B and initial_h

    W = g.constant(numpy.eye(3 * h, dtype=dtype)[_onnx_gate_order(h)][None], "gru_reorder")  # (1, 3h, 3h)
    R = g.op("Unsqueeze", g.op("Gather", g.value(W_hh), order, axis=0), front)  # (1, 3h, h), rows z, r, n
    B = ""
    if b_hh is not None:  # [W_b | R_b] (1, 6h): the input half is in gates_x already
        input_half = g.constant(numpy.zeros(3 * h, dtype=dtype), "gru_zero_bias")
        B = g.op("Unsqueeze", g.op("Concat", input_half, g.op("Gather", g.value(b_hh), order, axis=0), axis=0), front)
    initial_h = "" if initial is None else g.op("Unsqueeze", initial, front)  # (1, batch_size, h)

    # sequence_lens "": every sequence runs all num_steps, as in GRUSequence
    inputs = [g.value(gates_x), W, R, B, "", initial_h]
    while inputs[-1] == "":  # absent optional inputs at the end are left off
        inputs.pop()
    Y = g.op("GRU", *inputs, hidden_size=h, linear_before_reset=1)
    return g.op("Squeeze", Y, axes_tensor(g, [1]))  # (num_steps, 1, batch_size, h) -> (num_steps, batch_size, h)


def _gru_scan(g, gates_x, initial, W_hh, b_hh):
    """The recurrence as a ``Scan`` over the steps of gates_x, state H (batch_size, h), one step
    of ``GRUSequence.forward`` in its body:

        G = H W_hh^T + b_hh;  [x_r | x_z | x_n] = gates_x[t];  [G_r | G_z | G_n] = G
        R = sigmoid(x_r + G_r);  Z = sigmoid(x_z + G_z);  N = tanh(x_n + R G_n)
        H = N + Z (H - N)                              (the new state, and the step's output)
    """
    from onnx import helper

    h = W_hh.data.shape[-1]
    element = onnx_dtype(gates_x.data.dtype)
    if initial is None:  # zeros (batch_size, h), the batch read from gates_x
        zeros = g.constant(numpy.zeros((1, h), dtype=gates_x.data.dtype), "gru_zero_state")
        initial = g.op("Expand", zeros, g.shape((dims(g, gates_x)[1], h)))
    W_hh_T = g.op("Transpose", g.value(W_hh), perm=[1, 0])  # (h, 3h), read by the body from outside
    bias = None if b_hh is None else g.value(b_hh)

    H_prev, x_t = g.fresh("gru_H_prev"), g.fresh("gru_gates_x_t")
    outer_nodes, g.nodes = g.nodes, []  # g.op appends to g.nodes: collect the body's nodes apart
    try:
        G = g.op("MatMul", H_prev, W_hh_T)
        if bias is not None:
            G = g.op("Add", G, bias)
        x_r, x_z, x_n = g.op("Split", x_t, axis=1, outputs=3)
        G_r, G_z, G_n = g.op("Split", G, axis=1, outputs=3)
        R = g.op("Sigmoid", g.op("Add", x_r, G_r))
        Z = g.op("Sigmoid", g.op("Add", x_z, G_z))
        N = g.op("Tanh", g.op("Add", x_n, g.op("Mul", R, G_n)))
        H = g.op("Add", N, g.op("Mul", Z, g.op("Sub", H_prev, N)))
        H_out = g.op("Identity", H)
    finally:
        body_nodes, g.nodes = g.nodes, outer_nodes
    body = helper.make_graph(
        body_nodes,
        "gru_step",
        [
            helper.make_tensor_value_info(H_prev, element, [None, h]),
            helper.make_tensor_value_info(x_t, element, [None, 3 * h]),
        ],
        [
            helper.make_tensor_value_info(H, element, [None, h]),
            helper.make_tensor_value_info(H_out, element, [None, h]),
        ],
    )
    _, outputs = g.op("Scan", initial, g.value(gates_x), outputs=2, body=body, num_scan_inputs=1)
    return outputs  # (num_steps, batch_size, h)
