"""mt.viz.graph: one node per Function and per leaf, one edge per tensor input, backward's
visiting order, gradient norms after Graph.backward(), and a deterministic SVG."""

import xml.etree.ElementTree as ET

import numpy as np
import pytest

import minitensor as mt


def small_graph():
    x = mt.tensor([[1.0, -2.0], [3.0, 4.0]], requires_grad=True)
    w = mt.tensor([[0.5], [-1.0]], requires_grad=True)
    y = (x @ w).relu().sum()
    return x, w, y


def test_one_node_per_function_and_leaf_one_edge_per_input():
    x, w, y = small_graph()
    g = mt.viz.graph(y, names={"x": x, "w": w})
    assert [n.label for n in g.ops] == ["MatMul", "ReLU", "Sum"]
    assert [n.label for n in g.leaves] == ["x", "w"]
    assert len(g.edges) == 4  # x and w into MatMul, MatMul into ReLU, ReLU into Sum
    matmul = g.ops[0]
    assert matmul.shape == (2, 1) and matmul.dtype == "float32" and matmul.saved_bytes == 16 + 8  # it saved x and w
    assert repr(g) == "Graph(3 ops, 2 leaves, 4 edges)"


def test_the_order_is_the_order_backward_visits_the_nodes():
    mt.manual_seed(0)
    attn = mt.nn.MultiHeadAttention(8, 2, positional="alibi")
    X = mt.randn(2, 4, 8)
    y = attn(X, X, X, valid_lens=[4, 2], causal=True).sum()
    g = mt.viz.graph(y)
    visited = []

    def recording(ctx):
        real = type(ctx).backward

        def backward(ctx_, grad):
            visited.append(id(ctx))
            return real(ctx_, grad)

        return backward

    seen, stack = set(), [y._ctx]
    while stack:  # wrap every node's backward to record when the real pass calls it
        ctx = stack.pop()
        if id(ctx) in seen:
            continue
        seen.add(id(ctx))
        ctx.backward = recording(ctx)
        stack.extend(p._ctx for p in ctx.inputs if isinstance(p, mt.Tensor) and p._ctx is not None)
    by_order = sorted(g.ops, key=lambda n: n.order)
    assert len(g.ops) == len(seen)  # one node per Function of the call
    tensors = {id(t._ctx): n for n, t in zip(g.nodes, g._tensors, strict=True) if t._ctx is not None}
    y.backward()
    assert [tensors[i].order for i in visited] == [n.order for n in by_order]


def test_backward_records_the_gradient_norms_and_keeps_the_leaves_grads():
    x, w, y = small_graph()
    g = mt.viz.graph(y).backward()
    relu_in = x.numpy() @ w.numpy()  # [[2.5], [-2.5]]: one positive row
    assert g.ops[2].grad_norm == 1.0  # dL/dL
    assert g.ops[1].grad_norm == pytest.approx(np.sqrt(2))  # dL/d relu(out): ones (2, 1)
    assert g.ops[0].grad_norm == pytest.approx(np.sqrt((relu_in > 0).sum()))
    assert g.leaves[0].grad_norm == pytest.approx(np.linalg.norm(x.grad.numpy()))
    assert x.grad is not None and w.grad is not None
    assert all(t.grad is None for t in g._tensors if t._ctx is not None)  # intermediates dropped
    assert "|grad| 1.41" in g.svg


def test_the_svg_is_deterministic_valid_and_saved(tmp_path):
    svgs = []
    for _ in range(2):
        _, _, y = small_graph()
        svgs.append(mt.viz.graph(y).svg)
    assert svgs[0] == svgs[1]
    root = ET.fromstring(svgs[0])
    groups = root.findall("{http://www.w3.org/2000/svg}g")
    assert len(groups) == 5 and len(root.findall("{http://www.w3.org/2000/svg}path")) == 4
    _, _, y = small_graph()
    g = mt.viz.graph(y)
    assert g._repr_svg_() == g.svg
    path = g.save(tmp_path / "graph.svg")
    assert path.read_text(encoding="utf-8") == g.svg
    # inputs above what is made from them
    ys = {n.label: n.y for n in g.nodes}
    assert ys["leaf"] < ys["MatMul"] < ys["ReLU"] < ys["Sum"]


def test_a_freed_graph_and_a_non_tensor_are_refused():
    _, _, y = small_graph()
    y.backward()
    with pytest.raises(ValueError, match="freed by a backward"):
        mt.viz.graph(y)
    with pytest.raises(TypeError, match="expected a Tensor"):
        mt.viz.graph(np.ones(3))
    leaf = mt.ones(2, requires_grad=True)
    assert repr(mt.viz.graph(leaf)) == "Graph(0 ops, 1 leaves, 0 edges)"
