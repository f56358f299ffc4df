"""``mt.onnx.export``: trace a module's forward pass and write it as an ONNX model.

    mt.onnx.export(model, (X, valid_lens), "model.onnx",
                   input_names=["X", "valid_lens"], output_names=["Y"],
                   dynamic_axes={"X": {0: "batch", 1: "num_steps"}, "valid_lens": {0: "batch"}})

The forward pass runs once on the example inputs, in eval mode, while ``tracing()`` records
every op (``trace.py``); each recorded op that the outputs depend on is then written with
its mapping (``ops.py``, or the Function's own ``to_onnx``). Lengths read from the inputs'
shapes stay computed in the graph, so the model accepts other sizes along the axes named in
``dynamic_axes`` (the others are fixed in the graph's input types). Parameters and buffers
become initializers, under their ``named_parameters`` names. ``onnx.checker`` checks the
model before it is written; the file appears complete or not at all.
"""

from .. import Tensor, is_autocast_enabled, nn
from ..atomic import write_atomic
from .graph import ExportError, GraphBuilder, onnx_dtype
from .ops import mapping_of
from .trace import SymDim, tracing

DEFAULT_OPSET = 17


def _tensors_in(value):
    """Every Tensor and SymDim inside a node's argument (tuples, lists, dicts and slices included)."""
    if isinstance(value, (Tensor, SymDim)):
        yield value
    elif isinstance(value, (tuple, list)):
        for v in value:
            yield from _tensors_in(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors_in(v)
    elif isinstance(value, slice):
        yield from _tensors_in((value.start, value.stop, value.step))


def _needed(nodes, outputs):
    """The nodes the outputs depend on (through their inputs and the lengths they read), in order."""
    made_by = {id(node.out): node for node in nodes}
    wanted, stack = set(), [id(t) for t in outputs]
    while stack:
        key = stack.pop()
        node = made_by.get(key)
        if node is None or id(node) in wanted:
            continue
        wanted.add(id(node))
        for value in _tensors_in((node.args, node.kwargs)):
            if isinstance(value, SymDim):
                stack.extend(id(x) for x in _tensors_in(_expr_tensors(value)))
            else:
                stack.append(id(value))
    return [node for node in nodes if id(node) in wanted]


def _expr_tensors(dim):
    kind, a, b = dim.expr
    if kind == "dim":
        return [a]
    return [x for part in (a, b) if isinstance(part, SymDim) for x in _expr_tensors(part)]


def _as_tuple(outputs):
    if isinstance(outputs, Tensor):
        return (outputs,)
    if isinstance(outputs, (tuple, list)) and all(isinstance(t, Tensor) for t in outputs):
        return tuple(outputs)
    raise ExportError(
        f"mt.onnx.export: the forward pass must return a Tensor or a tuple of Tensors, got {outputs!r:.80}"
    )


def export(module, example_inputs, path, *, input_names=None, output_names=None, dynamic_axes=None, opset=None):
    """Write ``module``'s forward pass on ``example_inputs`` (a Tensor or a tuple; ``None`` and
    numbers pass through as constants) to the ONNX file ``path``; returns the ``onnx.ModelProto``.

    ``input_names`` / ``output_names``: names of the graph's inputs (one per Tensor of
    ``example_inputs``) and outputs (default ``input_0``..., ``output_0``...).
    ``dynamic_axes``: {name: {axis: label}} (or {name: [axes]}): the axes whose length may differ
    from the example's. ``opset``: the ONNX opset (default 17).

    Raises ``ExportError`` naming the op that has no ONNX form (give a Function of your own a
    ``to_onnx(g, node)`` static method) or an opset the installed onnx does not know, and
    ``ImportError`` naming the ``onnx`` extra when the ``onnx`` package is missing.
    """
    if not isinstance(module, nn.Module):  # (its parameters become the graph's initializers, by name)
        raise TypeError(f"mt.onnx.export: module must be an mt.nn.Module, got {type(module).__name__}")
    try:
        import onnx
        from onnx import helper
    except ImportError as e:
        raise ImportError(f'mt.onnx.export needs the onnx package ({e}): pip install -e ".[onnx]"') from None
    if is_autocast_enabled("cpu") or is_autocast_enabled("cuda"):
        raise ExportError(
            "mt.onnx.export: called inside mt.autocast, which would write bfloat16 products (ONNX Runtime's CPU "
            "has no bfloat16 MatMul); export outside the block: the weights are float32"
        )
    opset = opset or DEFAULT_OPSET
    if not (isinstance(opset, int) and 0 < opset <= onnx.defs.onnx_opset_version()):
        raise ExportError(
            f"mt.onnx.export: opset {opset!r} is not one that the installed onnx {onnx.__version__} knows; "
            f"give an int up to {onnx.defs.onnx_opset_version()} (default {DEFAULT_OPSET})"
        )
    inputs = example_inputs if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
    tensors = [x for x in inputs if isinstance(x, Tensor)]
    input_names = list(input_names or [f"input_{i}" for i in range(len(tensors))])
    if len(input_names) != len(tensors):
        raise ExportError(f"mt.onnx.export: {len(input_names)} input_names for {len(tensors)} example tensors")
    dynamic_axes = {
        name: (axes if isinstance(axes, dict) else {a: f"{name}_{a}" for a in axes})
        for name, axes in (dynamic_axes or {}).items()
    }
    unknown = sorted(set(dynamic_axes) - set(input_names) - set(output_names or ()))
    if unknown:
        raise ExportError(
            f"mt.onnx.export: dynamic_axes names {unknown}, which are neither inputs {input_names} "
            f"nor outputs {list(output_names or [])}"
        )

    was_training = module.training
    module.eval()
    try:
        with tracing(*inputs) as trace:
            outputs = _as_tuple(module(*inputs))
    finally:
        module.train(was_training)
    output_names = list(output_names or [f"output_{i}" for i in range(len(outputs))])
    if len(output_names) != len(outputs):
        raise ExportError(f"mt.onnx.export: {len(output_names)} output_names for {len(outputs)} outputs")

    names = {id(p): name for name, p in module.named_parameters()}
    names.update({id(b): name for name, b in getattr(module, "named_buffers", lambda: [])()})
    g = GraphBuilder(names)

    def value_info(name, tensor, output=False):
        axes = dynamic_axes.get(name)
        if axes is None and output:  # an output's lengths follow the inputs': named, not fixed
            axes = {i: f"{name}_{i}" for i in range(tensor.data.ndim)}
        shape = [(axes or {}).get(i, n) for i, n in enumerate(tensor.data.shape)]
        return helper.make_tensor_value_info(name, onnx_dtype(tensor.data.dtype), shape)

    graph_inputs = []
    for name, t in zip(input_names, tensors):
        g.fresh(name)  # reserve it
        g.bind(trace.original(t), name)  # (an input written in the pass: its value before the write)
        graph_inputs.append(value_info(name, t))

    for node in _needed(trace.nodes, outputs):
        write = mapping_of(node.op)
        if write is None:
            raise ExportError(
                f"mt.onnx.export: the op {node.name} has no ONNX form: give the Function a static method "
                f"to_onnx(g, node) that writes it (see mt.onnx), or export a model without it"
            )
        g.bind(node.out, write(g, node))

    graph_outputs = []
    for name, t in zip(output_names, outputs):
        g.nodes.append(helper.make_node("Identity", [g.value(t)], [name]))
        graph_outputs.append(value_info(name, t, output=True))
    graph = helper.make_graph(g.nodes, type(module).__name__, graph_inputs, graph_outputs, g.initializers)
    opsets = [helper.make_opsetid("", opset)]
    # The file's IR version: the oldest that holds the opset (8 for 17), not the onnx package's
    # newest, so that older runtimes load it too (onnx 1.23 writes 14; ONNX Runtime 1.23, the last
    # for Python 3.10, reads 11 at most, and 1.18 10).
    ir_version = helper.find_min_ir_version_for(opsets)
    model = helper.make_model(graph, opset_imports=opsets, producer_name="minitensor", ir_version=ir_version)
    onnx.checker.check_model(model)
    write_atomic(path, model.SerializeToString())
    return model
