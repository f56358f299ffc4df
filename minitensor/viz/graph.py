"""The graph autograd walks: ``mt.viz.graph(tensor)``, drawn as SVG without Graphviz.

Every tensor made by an operation links to the ``Function`` object that made it
(``tensor._ctx``), and that object links to its inputs (``ctx.inputs``): following the
links back from a result visits every operation it came from. ``graph(y)`` collects them
into a ``Graph``:

- one node per Function, with the name of its op, the shape and dtype of its output, and the
  bytes it saved for backward (``ctx.saved``: what the graph costs in memory);
- one node per leaf that requires grad (a parameter, an input with ``requires_grad=True``):
  where gradients end;
- one edge per tensor input of a Function, from the node that made the input;
- the order in which ``backward`` visits the Functions: decreasing creation number, the
  reverse topological order of ``minitensor/core/autograd.py`` (1 = the result's own op).

``Graph.backward()`` runs backward from the result and records each node's gradient norm
|dL/d(output)|, which the drawing then shows. The layout is computed here, in Python, and
is deterministic: layers by longest path from the leaves (inputs on top, the result at the
bottom; a leaf just above its first consumer), each layer ordered by the mean position of
its inputs (one barycentre pass, ties by creation order), then the SVG is written as text.

``graph(y, lang="zh")`` labels the boxes in Chinese (叶子节点, 保存, |梯度|: ``minitensor.i18n``)
and names CJK fonts first in the SVG's font list; an op's class name, a leaf's name, shapes and
dtypes are the graph's data and stay as they are.
"""

import html
import math
from dataclasses import dataclass, field

from .. import Tensor
from ..atomic import write_atomic
from ..i18n import CJK_FAMILIES, check_lang, label

# the drawing's geometry, in SVG pixels
NODE_WIDTH, NODE_HEIGHT = 196, 58
LEAF_HEIGHT = 40
GAP_X, GAP_Y = 28, 46
MARGIN = 16


@dataclass
class Node:
    """One box of the drawing: a Function (``kind="op"``) or a leaf (``kind="leaf"``)."""

    index: int
    kind: str
    label: str  # the op's name, or "leaf" / the tensor's name
    shape: tuple
    dtype: str
    saved_bytes: int = 0
    order: int | None = None  # backward's visiting order, from 1 (ops only)
    grad_norm: float | None = None  # |dL/d(output)| after Graph.backward()
    inputs: list = field(default_factory=list)  # indices of the nodes feeding this one
    layer: int = 0
    x: float = 0.0
    y: float = 0.0


class Graph:
    """The autograd graph that produced ``root`` (see the module docstring).

    ``nodes``: every node; ``ops`` / ``leaves``: the Function and leaf nodes; ``edges``:
    (from, to) index pairs, one per tensor input; ``svg``: the drawing; ``save(path)``
    writes it; in a notebook the graph shows itself (``_repr_svg_``). ``lang`` ("en" or "zh")
    and ``labels`` ({English text: label}): the words of the boxes, see ``graph``.
    """

    def __init__(self, root, names=None, lang="en", labels=None):
        if not isinstance(root, Tensor):
            raise TypeError(f"mt.viz.graph: expected a Tensor, got {type(root).__name__}")
        self.root = root
        self.lang, self.labels = check_lang(lang), labels
        names = {id(t): name for name, t in (names or {}).items()}
        self.nodes, self._tensors = [], []
        self._index = {}  # id(tensor) -> node index
        self._collect(root, names)
        self.edges = [(i, node.index) for node in self.nodes for i in node.inputs]
        self._layout()

    @property
    def ops(self):
        """The nodes of Functions (``kind == "op"``), one per operation recorded, in the order of ``nodes``."""
        return [n for n in self.nodes if n.kind == "op"]

    @property
    def leaves(self):
        """The nodes of leaves that require grad (``kind == "leaf"``): parameters and inputs, where
        the gradients end."""
        return [n for n in self.nodes if n.kind == "leaf"]

    # -- collecting ------------------------------------------------------------------------
    def _collect(self, root, names):
        """Every tensor reachable from ``root`` through ``_ctx.inputs``, oldest first."""
        seen, stack, found = {id(root)}, [root], [root]
        while stack:
            t = stack.pop()
            ctx = t._ctx
            if ctx is None:
                continue
            if ctx.inputs is None:
                raise ValueError(
                    f"mt.viz.graph: the graph through {type(ctx).__name__} was freed by a backward(); draw the "
                    "graph before calling backward (Graph.backward() runs it and keeps what the drawing needs)"
                )
            for p in ctx.inputs:
                if isinstance(p, Tensor) and p.requires_grad and id(p) not in seen:
                    seen.add(id(p))
                    stack.append(p)
                    found.append(p)
        found.sort(key=lambda t: t._seq)  # creation order: inputs before what is made from them
        ops = sorted((t for t in found if t._ctx is not None), key=lambda t: -t._seq)
        order = {id(t): k for k, t in enumerate(ops, 1)}  # backward pops the newest tensor first
        for t in found:
            ctx = t._ctx
            index = len(self.nodes)
            self._index[id(t)] = index
            self._tensors.append(t)
            shape, dtype = tuple(t.shape), str(t.dtype)
            if ctx is None:
                self.nodes.append(Node(index, "leaf", names.get(id(t), self._text("leaf")), shape, dtype))
                continue
            saved = sum(getattr(a, "nbytes", 0) for a in (getattr(ctx, "saved", None) or ()) if a is not None)
            inputs = [self._index[id(p)] for p in ctx.inputs if isinstance(p, Tensor) and id(p) in self._index]
            label = type(ctx).__name__
            self.nodes.append(Node(index, "op", label, shape, dtype, saved, order[id(t)], inputs=inputs))

    # -- gradients -------------------------------------------------------------------------
    def backward(self, grad=None, loss=None):
        """Run ``root.backward(grad)`` -- or ``loss.backward()``, for a ``loss`` computed from
        the root, as a training step would -- and record every node's gradient norm
        |dL/d(output)|. Leaves keep their ``.grad`` as usual; the intermediate gradients are
        read and dropped."""
        kept = [t._retain_grad for t in self._tensors]
        for t in self._tensors:
            if t._ctx is not None:
                t.retain_grad()
        try:
            (self.root if loss is None else loss).backward(grad)
            for node, t in zip(self.nodes, self._tensors, strict=True):
                if t.grad is not None:
                    g = t._backend.to_numpy(t.grad.data if isinstance(t.grad, Tensor) else t.grad)
                    node.grad_norm = float(math.sqrt(float((g.astype("float64") ** 2).sum())))
        finally:
            for t, keep in zip(self._tensors, kept, strict=True):
                if t._ctx is not None and not keep:
                    t._retain_grad, t.grad = False, None
        return self

    # -- layout ----------------------------------------------------------------------------
    def _layout(self):
        """Layers by longest path from a leaf; within a layer, the mean x of the inputs."""
        for node in self.nodes:  # creation order: every input is placed before its consumer
            node.layer = 1 + max((self.nodes[i].layer for i in node.inputs), default=-1)
        for node in self.nodes:  # a leaf sits just above its first consumer: shorter edges
            if node.kind == "leaf":
                consumers = [n.layer for n in self.nodes if node.index in n.inputs]
                node.layer = min(consumers, default=1) - 1
        layers = {}
        for node in self.nodes:
            layers.setdefault(node.layer, []).append(node)
        widest = max(len(row) for row in layers.values())
        self.width = 2 * MARGIN + widest * (NODE_WIDTH + GAP_X) - GAP_X
        self.height = 2 * MARGIN + len(layers) * (NODE_HEIGHT + GAP_Y) - GAP_Y
        for depth in sorted(layers):
            row = layers[depth]
            row.sort(key=lambda n: (sum(self.nodes[i].x for i in n.inputs) / len(n.inputs) if n.inputs else 0, n.index))
            left = (self.width - (len(row) * (NODE_WIDTH + GAP_X) - GAP_X)) / 2  # centred
            for k, node in enumerate(row):
                node.x = left + k * (NODE_WIDTH + GAP_X)
                node.y = MARGIN + depth * (NODE_HEIGHT + GAP_Y)

    # -- drawing ---------------------------------------------------------------------------
    def _text(self, english, **fields):
        return label(english, self.lang, self.labels, **fields)

    @property
    def svg(self):
        """The drawing, an SVG document as a string (deterministic for a given graph)."""
        fonts = "sans-serif"
        if self.lang == "zh":  # the viewer's CJK font, whichever it has, before its default
            fonts = html.escape(", ".join([f"'{family}'" for family in CJK_FAMILIES] + [fonts]))
        parts = [
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{self.width:.0f}" height="{self.height:.0f}" '
            f'viewBox="0 0 {self.width:.0f} {self.height:.0f}" font-family="{fonts}" font-size="11">',
            '<defs><marker id="arrow" viewBox="0 0 8 8" refX="8" refY="4" markerWidth="7" markerHeight="7" '
            'orient="auto"><path d="M0,0 L8,4 L0,8 z" fill="#666"/></marker></defs>',
        ]
        for source, target in self.edges:
            a, b = self.nodes[source], self.nodes[target]
            x1, y1 = a.x + NODE_WIDTH / 2, a.y + self._height(a)
            x2, y2 = b.x + NODE_WIDTH / 2, b.y
            middle = (y1 + y2) / 2
            parts.append(
                f'<path class="edge" d="M{x1:.1f},{y1:.1f} C{x1:.1f},{middle:.1f} {x2:.1f},{middle:.1f} '
                f'{x2:.1f},{y2:.1f}" fill="none" stroke="#666" marker-end="url(#arrow)"/>'
            )
        for node in self.nodes:
            parts.append(self._box(node))
        parts.append("</svg>")
        return "\n".join(parts)

    @staticmethod
    def _height(node):
        return NODE_HEIGHT if node.kind == "op" else LEAF_HEIGHT

    def _box(self, node):
        shape = "(" + ", ".join(map(str, node.shape)) + ("," if len(node.shape) == 1 else "") + ")"
        if node.kind == "leaf":
            lines = [node.label, f"{shape} {node.dtype}"]
            fill, stroke = "#eef6ee", "#5a9a5a"
        else:
            saved = self._text("saved {size}", size=_bytes(node.saved_bytes))
            lines = [f"{node.order}. {node.label}", f"{shape} {node.dtype}", saved]
            fill, stroke = "#eef2fa", "#5a6fa0"
        if node.grad_norm is not None:
            lines[-1] += " · " + self._text("|grad| {norm}", norm=f"{node.grad_norm:.3g}")
        title = html.escape(" | ".join(lines))
        bold = ' font-weight="bold"'
        text = "".join(
            f'<text x="{node.x + 8:.1f}" y="{node.y + 16 + 14 * k:.1f}"{bold if k == 0 else ""}>'
            f"{html.escape(line)}</text>"
            for k, line in enumerate(lines)
        )
        return (
            f'<g class="node {node.kind}" data-index="{node.index}"><title>{title}</title>'
            f'<rect x="{node.x:.1f}" y="{node.y:.1f}" width="{NODE_WIDTH}" height="{self._height(node)}" rx="6" '
            f'fill="{fill}" stroke="{stroke}"/>{text}</g>'
        )

    def _repr_svg_(self):
        return self.svg

    def save(self, path):
        """Write the SVG to ``path`` (UTF-8), whole or not at all (``atomic.write_atomic``)."""
        write_atomic(path, self.svg)
        return path

    def __repr__(self):
        return f"Graph({len(self.ops)} ops, {len(self.leaves)} leaves, {len(self.edges)} edges)"


def _bytes(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def graph(tensor, names=None, lang="en", labels=None):
    """The autograd graph that produced ``tensor``: a ``Graph`` (``.svg``, ``.save(path)``,
    ``.backward()``; shown inline in a notebook). ``names``: {name: leaf tensor} to label
    leaves, e.g. ``dict(model.named_parameters())``. ``lang``: "en" or "zh", the language of
    the boxes' words (leaf, saved, |grad|); ``labels``: {English text: label} of your own, e.g.
    ``{"saved {size}": "kept {size}"}``. Draw it before calling backward, which frees the graph
    (or call ``Graph.backward()``, which records the gradient norms)."""
    return Graph(tensor, names, lang, labels)
