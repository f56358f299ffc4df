# %% [markdown]
# # 8. Inside the engine: reverse-mode autograd and a fused softmax kernel
#
# Every model of the previous tutorials was trained by gradient descent, and every
# gradient came from one place: `minitensor/autograd.py`, about 300 lines. This tutorial
# opens it. We
#
# 1. write reverse-mode automatic differentiation (反向模式自动微分) from scratch for scalars,
#    in 30 lines, and check it against minitensor;
# 2. look at how minitensor records the computational graph (计算图): a `Tensor` remembers
#    the `Function` call that made it;
# 3. write our own differentiable operation, a `mt.Function` with `forward` and `backward`
#    (前向传播 / 反向传播), and check it with `mt.gradcheck`, the gradient check (梯度检验) —
#    which also catches a deliberately wrong backward;
# 4. draw the graph of scaled dot-product attention and watch the order in which
#    `backward` visits its nodes;
# 5. see why the softmax at the heart of attention runs as a *fused* numba kernel (融合核), and
#    time it against plain NumPy.
#
# Run it as `python tutorials/08_inside_the_engine.py` (seconds) or open it as a notebook
# with jupytext; `MINITENSOR_TUTORIAL_SMOKE=1` makes the arrays smaller.
#
# Sources: D2L, in the Chinese edition 《动手学深度学习》 (zh.d2l.ai) 2.4 微积分 (the chain
# rule), 2.5 自动微分 and 4.7 前向传播、反向传播和计算图, and in the English edition *Dive into
# Deep Learning* (d2l.ai) 2.4 "Calculus", 2.5 "Automatic Differentiation" and 5.3 "Forward
# Propagation, Backward Propagation, and Computational Graphs"; the attention whose graph we
# walk is the scaled dot-product attention of 10.3 注意力评分函数 / 11.3 "Attention Scoring
# Functions".

# %%
import itertools
import math
import statistics
import timeit

import numpy as np
from _tutorial import SMOKE, expect_error, figure_path, pick, text  # text: figure labels in the tutorial's language

import minitensor as mt

T = "08_inside_the_engine"
mt.manual_seed(0)
print("smoke mode" if SMOKE else "full mode")

# %% [markdown]
# ## Reverse mode in one paragraph
#
# A program computes a scalar loss $L$ from inputs through elementary operations,
# $z = f(x, y)$, each with known local derivatives $\partial z/\partial x$, $\partial z/\partial y$.
# The chain rule (链式法则) says that if $z$ is used by later operations,
#
# $$\frac{\partial L}{\partial x} \mathrel{+}= \frac{\partial L}{\partial z}\,\frac{\partial z}{\partial x}
#   \qquad\text{for every } z \text{ computed from } x .$$
#
# *Reverse* mode starts from $\partial L/\partial L = 1$ at the output and walks the graph
# backwards, each node passing "its gradient times its local derivative" to its inputs —
# backpropagation (反向传播). One backward pass gives $\partial L/\partial w$ for *every* input
# $w$ at once, at a cost of a small multiple of the forward pass: exactly what training
# needs, with one scalar loss and many parameters. (Forward mode would need one pass per
# input.) The only subtlety is order: a node may pass its gradient on only once it has
# received the gradients of *all* the nodes computed from it. Any order in which every node
# comes after all its consumers — a reverse topological order (拓扑排序) — works, and the
# order of creation is a topological order for free: an operation's inputs always exist
# before its output.
#
# ## Autograd from scratch, for scalars
#
# Each `Value` records its parents and, computed during the forward pass, its local
# derivative with respect to each of them. `backward` visits every value newest first and
# adds "my gradient times my local derivative" to each parent's gradient.


# %%
class Value:
    """A scalar that remembers how it was made: its parents and d(self)/d(parent) for each."""

    _created = itertools.count()

    def __init__(self, data, parents=(), local_grads=(), op=""):
        self.data, self.grad = float(data), 0.0
        self.parents, self.local_grads, self.op = parents, local_grads, op
        self.seq = next(Value._created)  # creation order = a topological order

    def __add__(self, other):
        return Value(self.data + other.data, (self, other), (1.0, 1.0), "+")

    def __mul__(self, other):
        return Value(self.data * other.data, (self, other), (other.data, self.data), "*")

    def tanh(self):
        t = math.tanh(self.data)
        return Value(t, (self,), (1.0 - t * t,), "tanh")

    def graph(self):
        """Every Value this one was computed from (an explicit stack: no recursion limit)."""
        seen, stack = {}, [self]
        while stack:
            v = stack.pop()
            if id(v) not in seen:
                seen[id(v)] = v
                stack.extend(v.parents)
        return seen.values()

    def backward(self):
        self.grad = 1.0
        for v in sorted(self.graph(), key=lambda v: v.seq, reverse=True):  # newest first
            for parent, local in zip(v.parents, v.local_grads):
                parent.grad += v.grad * local  # the chain rule


a, b, c = Value(0.5), Value(-1.5), Value(0.25)
L = (a * b + c).tanh() * a  # a is used twice: its gradient has two terms
L.backward()
print(f"L = {L.data:.6f};  dL/da = {a.grad:.6f}, dL/db = {b.grad:.6f}, dL/dc = {c.grad:.6f}")

# %% [markdown]
# The same expression in minitensor (float64, 0-d tensors) gives the same numbers; and by
# hand, with $u = \tanh(ab + c)$, $\partial L/\partial a = u + a(1-u^2)b$ — the two paths from
# $a$ to $L$, added.

# %%
ta, tb, tc = (mt.tensor(v, dtype=mt.float64, requires_grad=True) for v in (0.5, -1.5, 0.25))
tL = (ta * tb + tc).tanh() * ta
tL.backward()
u = math.tanh(0.5 * -1.5 + 0.25)
for name, ours, theirs in (("a", a.grad, ta.grad.item()), ("b", b.grad, tb.grad.item()), ("c", c.grad, tc.grad.item())):
    assert abs(ours - theirs) < 1e-12, f"dL/d{name}: from scratch {ours} vs minitensor {theirs}"
assert abs(a.grad - (u + 0.5 * (1 - u * u) * -1.5)) < 1e-12, "dL/da is the sum over both paths"
print("from-scratch gradients == minitensor's == the chain rule by hand")

# %% [markdown]
# ## How minitensor stores the graph
#
# minitensor does the same on arrays. A `Tensor` (`minitensor/tensor.py`) holds `data` (a
# NumPy or CuPy array), `requires_grad`, `grad`, and `_ctx` — exposed as `grad_fn`, the
# `Function` object of the call that produced it (None for a leaf, 叶子节点). That object is
# the node of the graph: it keeps `inputs` (the tensors it was applied to) and `saved`
# (whatever `forward` put aside for `backward`), and its class holds the two static methods.
# `Function.apply` (`minitensor/autograd.py`) unwraps the tensors, calls `forward` on raw
# arrays, and wraps the result with the `ctx` attached — only when an input requires a
# gradient and we are not inside `mt.no_grad()`.

# %%
x = mt.randn(2, 3, requires_grad=True)
w = mt.randn(2, 3, requires_grad=True)
y = x * w
print("y.grad_fn:", y.grad_fn, "| y.is_leaf:", y.is_leaf, "| x.is_leaf:", x.is_leaf, "| x.grad_fn:", x.grad_fn)
print("y.grad_fn.inputs are x and w:", y.grad_fn.inputs[0] is x and y.grad_fn.inputs[1] is w)
print("Mul saved for backward:", [tuple(s.shape) for s in y.grad_fn.saved], "(a and b: dz/da = b, dz/db = a)")
with mt.no_grad():
    z = x * w
assert z.grad_fn is None and not z.requires_grad, "no graph is recorded under no_grad"

# %% [markdown]
# ## A Function of our own
#
# An operation is a subclass of `mt.Function` with `forward(ctx, ...)` and
# `backward(ctx, grad)` side by side — PyTorch's idiom, and the one every op in
# `minitensor/ops/` follows (`elementwise.py` is the simplest). `forward` receives raw arrays
# and computes with `ctx.xp` (NumPy or CuPy: the same code runs on both backends); it keeps
# what `backward` needs with `ctx.save_for_backward`. `backward` receives $\partial L/\partial y$
# and returns $\partial L/\partial x$ for each input (None for a non-tensor argument).
#
# Softplus, a smooth ReLU:
#
# $$y = \log(1 + e^x), \qquad \frac{dy}{dx} = \frac{e^x}{1+e^x} = \sigma(x)
#   = \tfrac12\big(1 + \tanh(x/2)\big).$$
#
# Both are written so that they cannot overflow: `logaddexp(0, x)` is $\log(e^0 + e^x)$
# computed stably, and the tanh form of $\sigma$ never evaluates $e^{-x}$ for large negative
# $x$.


# %%
class Softplus(mt.Function):
    """y = log(1 + e^x);  dy/dx = sigmoid(x)."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return ctx.xp.logaddexp(x.dtype.type(0), x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved
        return grad * 0.5 * (1 + ctx.xp.tanh(x / 2))


def softplus(x):
    return Softplus.apply(x)


x = mt.randn(3, 4, dtype=mt.float64, requires_grad=True)
y = softplus(x)
assert np.allclose(y.numpy(), np.log1p(np.exp(x.numpy()))), "forward: log(1 + e^x)"
assert mt.gradcheck(softplus, [x]), "backward: sigmoid(x)"
print(y.grad_fn, "- forward and backward pass gradcheck")

# %% [markdown]
# `mt.gradcheck(fn, inputs)` (`minitensor/gradcheck.py`) compares the analytic gradient with
# central finite differences (有限差分),
#
# $$\frac{\partial L}{\partial x_i} \approx \frac{L(x + \epsilon e_i) - L(x - \epsilon e_i)}{2\epsilon},$$
#
# whose error is $O(\epsilon^2)$, in float64 (in float32 the rounding error of $L$, about
# $10^{-7}|L|/\epsilon$, would swamp the difference). A function with a tensor output is
# reduced to a scalar with fixed *random* weights, $L = \sum_j v_j\, \text{fn}(x)_j$.
#
# Why random weights? Here is the most common bug in a hand-written backward: forgetting to
# multiply by the incoming gradient. With $L = \sum_j y_j$ the incoming gradient is all
# ones, and the bug is invisible:


# %%
class ForgetfulSoftplus(Softplus):
    """A wrong backward: returns dy/dx instead of dL/dy * dy/dx."""

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved
        return 0.5 * (1 + ctx.xp.tanh(x / 2))


x_wrong = mt.tensor(x.numpy(), requires_grad=True)
ForgetfulSoftplus.apply(x_wrong).sum().backward()
x.grad = None
softplus(x).sum().backward()
assert np.allclose(x_wrong.grad.numpy(), x.grad.numpy()), "with L = sum(y) the bug hides"
print("L = sum(y): the wrong backward gives the right gradient")

with expect_error("ForgetfulSoftplus's backward, checked by gradcheck", mt.GradcheckError):
    mt.gradcheck(ForgetfulSoftplus.apply, [mt.tensor(x.numpy(), requires_grad=True)])

# %% [markdown]
# ### Broadcasting is undone by the engine, not by each op
#
# A two-input op: $z = \sqrt{a^2 + b^2}$ (`hypot`), $\partial z/\partial a = a/z$,
# $\partial z/\partial b = b/z$. If `b` has shape (4,) and `a` (3, 4), NumPy broadcasts `b`
# over the rows, and each `b[j]` influences 3 outputs, so its gradient is a sum over them.
# Our `backward` returns a (3, 4) gradient for `b` anyway: `autograd.sum_to_shape` sums it
# back to (4,) once, for every op, so no op has to.


# %%
class Hypot(mt.Function):
    """z = sqrt(a^2 + b^2);  dz/da = a / z, dz/db = b / z."""

    @staticmethod
    def forward(ctx, a, b):
        z = ctx.xp.sqrt(a * a + b * b)
        ctx.save_for_backward(a, b, z)
        return z

    @staticmethod
    def backward(ctx, grad):
        a, b, z = ctx.saved
        return grad * a / z, grad * b / z  # both (3, 4): the engine sums b's back to (4,)


a = mt.randn(3, 4, dtype=mt.float64, requires_grad=True)
b = mt.randn(4, dtype=mt.float64, requires_grad=True)
assert mt.gradcheck(Hypot.apply, [a, b]), "Hypot's backward, broadcasting included"
a.grad = b.grad = None
Hypot.apply(a, b).sum().backward()
ref_a, ref_b = (mt.tensor(t.numpy(), requires_grad=True) for t in (a, b))
(ref_a * ref_a + ref_b * ref_b).sqrt().sum().backward()
assert b.grad.shape == (4,) and np.allclose(b.grad.numpy(), ref_b.grad.numpy())
assert np.allclose(a.grad.numpy(), ref_a.grad.numpy())
print("Hypot: gradcheck passes; b.grad has b's shape", b.grad.shape)

# %% [markdown]
# ## The graph of scaled dot-product attention
#
# Now a small expression from this chapter: one head of scaled dot-product attention and a
# loss, $L = \sum \text{softmax}(\mathbf Q\mathbf K^\top/\sqrt d)\mathbf V$. We walk the graph
# from $L$ through each tensor's `grad_fn` and its `inputs` (Python numbers such as
# $\sqrt d$ are constants, not nodes), print it as the program that built it, and draw it.

# %%
d = 4
Q = mt.randn(2, d, requires_grad=True)
K = mt.randn(3, d, requires_grad=True)
V = mt.randn(3, d, requires_grad=True)
loss = ((Q @ K.T / math.sqrt(d)).softmax(axis=-1) @ V).sum()


def walk(root):
    """Every tensor of the graph behind ``root`` and the edges (input -> output)."""
    tensors, edges, stack, seen = [], [], [root], set()
    while stack:
        t = stack.pop()
        if id(t) in seen:
            continue
        seen.add(id(t))
        tensors.append(t)
        if t.grad_fn is not None:
            for p in t.grad_fn.inputs:
                if isinstance(p, mt.Tensor):
                    edges.append((p, t))
                    stack.append(p)
    return sorted(tensors, key=lambda t: t._seq), edges  # in creation order


tensors, edges = walk(loss)
names = {id(Q): "Q", id(K): "K", id(V): "V"}
for t in tensors:
    names.setdefault(id(t), f"t{len([n for n in names.values() if n.startswith('t')]) + 1}")
names[id(loss)] = "L"
print("the graph, in creation order (a topological order):")
for t in tensors:
    if t.grad_fn is None:
        print(f"  {names[id(t)]:>2}  leaf {tuple(t.shape)}")
    else:
        args = ", ".join(
            names[id(p)] if isinstance(p, mt.Tensor) else f"{p:.4g}" if isinstance(p, float) else repr(p)
            for p in t.grad_fn.inputs
        )
        print(f"  {names[id(t)]:>2} = {type(t.grad_fn).__name__}({args})  {tuple(t.shape)}")
functions = [t for t in tensors if t.grad_fn is not None]
backward_order = sorted(functions, key=lambda t: -t._seq)
print("backward visits:", " -> ".join(type(t.grad_fn).__name__ for t in backward_order))
rank = {id(t): i for i, t in enumerate(backward_order)}
for p, t in edges:  # reverse topological: every output is handled before its inputs
    if p.grad_fn is not None:
        assert rank[id(t)] < rank[id(p)], "backward must reach an output before its inputs"

# %% [markdown]
# The drawing: tensors are ovals (leaves in green), Function nodes boxes, numbered in the
# order `backward` visits them. Arrows point forward, from inputs to outputs; gradients
# flow against them.

# %%
from matplotlib.figure import Figure


def draw_graph(tensors, edges, names, path):
    # Columns: a computed tensor one column right of its deepest input; a leaf just left of
    # its first consumer, drawn above the chain so that no arrow crosses a node.
    depth = {}
    for t in tensors:  # creation order: inputs are placed first
        ins = [p for p in (t.grad_fn.inputs if t.grad_fn else ()) if isinstance(p, mt.Tensor)]
        depth[id(t)] = 1 + max((depth[id(p)] for p in ins), default=-1)
    leaf_column = {}
    for p, t in edges:
        if p.grad_fn is None:
            leaf_column[id(p)] = min(leaf_column.get(id(p), depth[id(t)]), depth[id(t)] - 1)
    depth.update(leaf_column)
    columns = {}
    for t in sorted(tensors, key=lambda t: t.grad_fn is None):  # computed tensors first
        columns.setdefault(depth[id(t)], []).append(t)
    pos = {id(t): (2.0 * k, float(i)) for k, column in columns.items() for i, t in enumerate(column)}
    fig = Figure(figsize=(1.6 * len(columns) + 1.5, 3.2))
    ax = fig.add_subplot(1, 1, 1)
    ax.axis("off")
    visit = {id(t): i + 1 for i, t in enumerate(sorted((t for t in tensors if t.grad_fn), key=lambda t: -t._seq))}
    arrow = dict(arrowstyle="-|>", color="0.35", linewidth=0.9, shrinkA=14, shrinkB=14)
    for t in tensors:
        x, y = pos[id(t)]
        label = f"{names[id(t)]}\n{tuple(t.shape)}"
        colour = "#c8e6c9" if t.grad_fn is None else "#e3f2fd"
        ax.text(
            x,
            y,
            label,
            ha="center",
            va="center",
            fontsize=8,
            bbox=dict(boxstyle="ellipse,pad=0.3", facecolor=colour, edgecolor="0.3"),
        )
        if t.grad_fn is not None:  # its Function box sits between its inputs and it
            fx, fy = x - 1.0, y
            constants = "".join(f" {c:.3g}" for c in t.grad_fn.inputs if isinstance(c, (int, float)))
            ax.text(
                fx,
                fy,
                f"{type(t.grad_fn).__name__}{constants}\n[{visit[id(t)]}]",
                ha="center",
                va="center",
                fontsize=8,
                bbox=dict(boxstyle="square,pad=0.3", facecolor="#ffe0b2", edgecolor="0.3"),
            )
            ax.annotate("", xy=(x, y), xytext=(fx, fy), arrowprops=arrow)
            for p in t.grad_fn.inputs:
                if isinstance(p, mt.Tensor):
                    ax.annotate("", xy=(fx, fy), xytext=pos[id(p)], arrowprops=arrow)
    xs = [p[0] for p in pos.values()]
    ys = [p[1] for p in pos.values()]
    ax.set_xlim(min(xs) - 0.8, max(xs) + 0.8)
    ax.set_ylim(min(ys) - 0.8, max(ys) + 0.8)
    ax.set_title(text("L = sum(softmax(Q K^T / sqrt(d)) V): tensors, Functions [backward order]"), fontsize=10)
    fig.savefig(path, dpi=110, bbox_inches="tight")


draw_graph(tensors, edges, names, figure_path(T, "graph_attention.png"))
print("wrote", figure_path(T, "graph_attention.png"))

# %% [markdown]
# minitensor draws the same graph itself: `mt.viz.graph(loss)` walks it as `walk` did and
# lays it out in layers (inputs on top, $L$ at the bottom) as an SVG, one box per Function
# with its output's shape and dtype, the bytes it saved for backward and its number in
# backward's order; `.backward()` runs the pass and adds each node's gradient norm. It shows
# itself in a notebook and `.save(path)` writes the file; `minitensor explain` puts the graph
# of a real attention layer into its page.

# %%
drawing = mt.viz.graph(loss, names={"Q": Q, "K": K, "V": V})
assert len(drawing.ops) == len(functions), "one node per Function"
assert [n.label for n in sorted(drawing.ops, key=lambda n: n.order)] == [
    type(t.grad_fn).__name__ for t in backward_order
], "numbered in backward's order"
drawing.backward()
assert drawing.ops[-1].grad_norm == 1.0, "dL/dL = 1 at the bottom"
drawing.save(figure_path(T, "graph_attention.svg"))
print(drawing, "- saved", figure_path(T, "graph_attention.svg"))

# %% [markdown]
# ## How `backward` orders the nodes
#
# `autograd.backward` does what our `Value.backward` did, without sorting the whole graph
# first: every tensor gets a creation number `_seq`, and a heap hands out the tensor with
# the largest number among those that have received some gradient. Because an output is
# always newer than its inputs, a tensor comes out of the heap only after every tensor
# computed from it has passed its gradient back; gradients that arrive along different paths
# are added. No recursion is involved, so a chain of thousands of operations is fine (a
# recursive depth-first search would hit Python's recursion limit of about 1000).
#
# We can watch the order with a `Function` that does nothing forward and writes its name
# down in `backward`. Below, `h` feeds two branches `u` and `v` (a diamond): `h` must wait
# for both.

# %%
visited = []


class Trace(mt.Function):
    """The identity, which records its label when the gradient passes through."""

    @staticmethod
    def forward(ctx, x, label):
        ctx.label = label
        return x

    @staticmethod
    def backward(ctx, grad):
        visited.append(ctx.label)
        return grad, None  # no gradient for the label


x = mt.randn(5, dtype=mt.float64, requires_grad=True)
h = Trace.apply(x * x, "h")
u = Trace.apply(h.tanh(), "u")
v = Trace.apply(h.exp(), "v")
L = Trace.apply((u * v).sum(), "L")
L.backward()
print("backward passed through:", " -> ".join(visited))
assert visited == ["L", "v", "u", "h"], "newest first; h only after both of its consumers"
xs = x.numpy()
expected = 2 * xs * np.exp(xs**2) * ((1 - np.tanh(xs**2) ** 2) + np.tanh(xs**2))
assert np.allclose(x.grad.numpy(), expected), "the two paths through h are added"

n = pick(20_000, 3_000)  # far deeper than Python's recursion limit
x = mt.tensor(1.0, dtype=mt.float64, requires_grad=True)
y = x
for _ in range(n):
    y = y * 1.0001
y.backward()
assert abs(x.grad.item() - 1.0001**n) < 1e-9 * 1.0001**n
print(f"a chain of {n:,} multiplications: dL/dx = {x.grad.item():.6f} = 1.0001^{n}")

# %% [markdown]
# After `backward` the graph is freed — the saved arrays and the links to the inputs are
# dropped, so memory returns at once. A second `backward` through the same graph is an
# error that says so, unless the first one was called with `retain_graph=True`; gradients
# *accumulate* in `.grad` (which is why optimisers call `zero_grad()`).

# %%
x = mt.randn(3, dtype=mt.float64, requires_grad=True)
y = (x * x).sum()
y.backward(retain_graph=True)
first = x.grad.numpy()
y.backward()  # allowed: the graph was retained
assert np.allclose(x.grad.numpy(), 2 * first), "gradients accumulate"
with expect_error("a third backward through the graph the second one freed", mt.GraphError):
    y.backward()

# %% [markdown]
# ## Why the softmax kernel is fused
#
# Attention computes a softmax over every row of its (batch, heads, queries, keys) scores;
# in the date Transformer of tutorial 7 it is one of the most frequent operations. Written
# with NumPy (`minitensor/kernels/reference.py`), the numerically stable softmax
#
# $$\text{softmax}(\mathbf x)_j = \frac{e^{x_j - m}}{\sum_k e^{x_k - m}},\qquad m = \max_k x_k,$$
#
# is a sequence of whole-array operations: the row max (reads $\mathbf x$), $\mathbf x - m$
# (reads $\mathbf x$, writes a temporary), `exp` (reads it, writes another), the row sums
# (reads that), the division (reads it again, writes the output). Five passes over memory
# and two full-size temporaries: for a (4096, 512) float32 array, 8 MiB each, about 40 MiB
# read and 24 MiB written — far more than the caches hold, so the time goes to moving data.
#
# The numba kernel (`minitensor/kernels/cpu.py`) is *fused* (算子融合): one function walks
# the array row by row, and a row of 512 floats (2 KiB) stays in the L1 cache while the
# max, the exponentials with their sum, and the scaling run over it. Main memory sees the
# input read once and the output written once: 16 MiB. Rows are independent, so they are
# also spread over threads (`prange`), and the float32 `exp` is written with plain
# arithmetic that LLVM vectorises. Subtracting $m$ changes nothing mathematically
# (numerator and denominator are both multiplied by $e^{-m}$), but it keeps `exp` from
# overflowing: every exponent is $\le 0$.

# %%
import tracemalloc

import numba

from minitensor.kernels import cpu, reference

rows, cols = pick((4096, 512), (256, 128))
scores = np.random.default_rng(0).standard_normal((rows, cols)).astype(np.float32) * 3

fused = cpu.softmax_forward(scores)  # the first call loads (or compiles) the kernel
plain = reference.softmax_forward(np, scores)
print(f"largest |fused - plain| = {np.abs(fused - plain).max():.2e}")
assert np.allclose(fused, plain, rtol=2e-5, atol=1e-7), "the fused kernel computes the same softmax"
assert np.array_equal(mt.tensor(scores).softmax(axis=-1).numpy(), fused), "mt.softmax runs this kernel"

big = np.array([[1e4, 1e4 - 1, 0.0]], dtype=np.float32)
with np.errstate(over="ignore", invalid="ignore"):
    unstable = np.exp(big) / np.exp(big).sum(axis=-1, keepdims=True)
assert np.isnan(unstable).any() and np.allclose(cpu.softmax_forward(big).sum(), 1), "why m is subtracted"
print("exp without the max: ", unstable[0], "| with it:", cpu.softmax_forward(big)[0])

tracemalloc.start()
reference.softmax_forward(np, scores)
_, peak = tracemalloc.get_traced_memory()
tracemalloc.stop()
print(
    f"plain NumPy softmax: at its peak {peak / scores.nbytes:.1f}x the input's size allocated (the output "
    "and two temporaries); the fused kernel allocates only its output"
)
assert peak >= 2 * scores.nbytes, "the plain version needs full-size temporaries"

# %% [markdown]
# Timing: medians of repeated `timeit` runs, the kernel on all threads and on one thread
# (so that fusion alone is compared with NumPy, which runs these operations on one
# thread).


# %%
def median_ms(fn, number, repeat):
    return 1e3 * statistics.median(timeit.repeat(fn, number=number, repeat=repeat)) / number


number, repeat = pick((5, 15), (20, 5))
threads = numba.get_num_threads()
plain_bar, one_thread_bar = text("plain NumPy\n(reference.py)"), text("numba kernel\n1 thread")  # the bars' names
times = {plain_bar: median_ms(lambda: reference.softmax_forward(np, scores), number, repeat)}
if threads > 1 and scores.size >= cpu.PARALLEL_MIN_SIZE:  # smaller arrays always run on one thread
    threads_bar = text("numba kernel\n{threads} threads", threads=threads)
    times[threads_bar] = median_ms(lambda: cpu.softmax_forward(scores), number, repeat)
numba.set_num_threads(1)
try:
    times[one_thread_bar] = median_ms(lambda: cpu.softmax_forward(scores), number, repeat)
finally:
    numba.set_num_threads(threads)
for name, ms in times.items():
    print(f"{name.replace(chr(10), ', '):36} {ms:8.3f} ms")
plain_ms, one_thread_ms = times[plain_bar], times[one_thread_bar]
print(f"fusion alone (1 thread): {plain_ms / one_thread_ms:.1f}x faster than plain NumPy")
if not SMOKE:  # at full size; in smoke mode the arrays are too small for timings to mean much
    assert one_thread_ms < plain_ms, "the fused kernel beats plain NumPy even on one thread"

fig = Figure(figsize=(6.0, 3.6), layout="constrained")
ax = fig.add_subplot(1, 1, 1)
bars = ax.bar(list(times), list(times.values()), color=["#9e9e9e", "#1e88e5", "#90caf9"][: len(times)])
ax.bar_label(bars, fmt="%.3g ms")
ax.margins(y=0.15)
ax.set_ylabel(text("median time per call (ms)"))
ax.set_title(text("softmax over the rows of a ({rows}, {cols}) float32 array", rows=rows, cols=cols))
fig.savefig(figure_path(T, "softmax_timing.png"), dpi=110)
print("wrote", figure_path(T, "softmax_timing.png"))

# %% [markdown]
# Fusion alone, on one thread, is several times faster than NumPy: the same arithmetic, a
# quarter of the memory traffic. More threads help only when the cores are free: on a
# machine busy with other work a thread pool waits at every parallel loop for its slowest
# thread, and the 2-thread time can be *worse* than the 1-thread one (which is also why
# arrays below `cpu.PARALLEL_MIN_SIZE` elements always run on one thread).
#
# This is a quick look on whatever else the machine is doing. The proper benchmark is
# `python bench/softmax.py`: forward and backward, softmax and log-softmax, two shapes, 1
# and 2 threads, interleaved runs against plain NumPy *and* `torch.softmax`, and the
# memory bandwidth the kernel reaches (the README lists its results: about 4x faster than
# plain NumPy, and faster than PyTorch, on a 2-core machine).
#
# ## Exercises
#
# 1. Write `Sigmoid` and `LogCosh` as `mt.Function`s (with $\frac{d}{dx}\log\cosh x = \tanh x$)
#    and check them with `mt.gradcheck`. Then break each backward in a different way (a wrong
#    sign, a missing factor 2, an input saved *after* modifying it in place) and read
#    gradcheck's message.
# 2. Extend the from-scratch `Value` with `__pow__`, `exp` and division, and train a
#    one-neuron regression with it. Then make `graph()` recursive and find the depth at which
#    a chain of `Value`s breaks.
# 3. Write a fused *masked* softmax for (rows, n) scores and `valid_lens` in numba (one row per
#    `prange` iteration, zeros past the valid length, zeros for a row with none), compare it
#    with `reference.softmax_forward(np, x, lens)` and with `cpu.softmax_forward(x, lens)`,
#    and time the three.
#
# ## Where this lives in the engine
#
# * `minitensor/tensor.py` — `Tensor`: `data`, `grad`, `requires_grad`, `grad_fn` (`_ctx`),
#   the creation number `_seq`, and every operator in the class body: `x * w` is
#   `Tensor.__mul__`, one line calling `Mul.apply`;
# * `minitensor/autograd.py` — `Function` (`apply`, `save_for_backward`, `needs_input_grad`),
#   `backward` (the heap), `sum_to_shape` (undoing broadcasting), `_accumulate` (how a leaf
#   takes a gradient that nothing else holds without copying it, as PyTorch does);
# * `minitensor/ops/elementwise.py` — the simplest ops, each forward beside its backward;
#   `minitensor/ops/softmax.py` — the softmax Functions on top of the kernels;
# * `minitensor/gradcheck.py` — `mt.gradcheck`;
# * `minitensor/kernels/cpu.py` (the fused numba kernels) and `minitensor/kernels/reference.py`
#   (the same in plain NumPy: the oracle of the tests and the baseline of the benchmark);
#   `minitensor/kernels/fused.py` fuses the rest of a training step's elementwise work the
#   same way (dropout, ReLU, layer norm, Adam's update), each tested against its op's NumPy
#   code;
# * `bench/softmax.py` — the proper benchmark.
