# %% [markdown]
# # 8. Inside the engine: reverse-mode autograd and a fused softmax kernel
#
# Every model of the previous tutorials was trained by gradient descent, and every
# gradient came from one place: `minitensor/core/autograd.py`, about 500 lines. This tutorial
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
#    `backward` visits its nodes, and what a write `x[i] = v` into a tensor in the graph becomes;
# 5. see why the softmax at the heart of attention runs as a *fused* numba kernel (融合计算内核), and
#    time it against plain NumPy; then round to bfloat16 and see which operations mixed precision
#    (混合精度, `mt.autocast`) keeps in float32;
# 6. leave the single process: trace one step of data-parallel training over three simulated
#    ranks, and see why their gradients are summed weighted by their tokens.
#
# Run it as `python tutorials/08_inside_the_engine.py` (seconds) or open it as a notebook
# with jupytext; `MINITENSOR_TUTORIAL_SMOKE=1` makes the arrays smaller.
#
# Sources: D2L, in the Chinese edition 《动手学深度学习》 (zh.d2l.ai) 2.4 微积分 (the chain
# rule), 2.5 自动微分 and 4.7 前向传播、反向传播和计算图, and in the English edition *Dive into
# Deep Learning* (d2l.ai) 2.4 "Calculus", 2.5 "Automatic Differentiation" and 5.3 "Forward
# Propagation, Backward Propagation, and Computational Graphs"; the attention whose graph we
# walk is the scaled dot-product attention of 10.3 注意力评分函数 / 11.3 "Attention Scoring
# Functions"; data parallelism is 12.5 多GPU训练 / 13.5 "Training on Multiple GPUs" (with 12.6
# / 13.6 and, for the ring, 12.7 / 13.7 of the chapter on computational performance).

# %%
import itertools
import math
import statistics
import timeit

import numpy as np
from _tutorial import LANG, SMOKE, expect_error, figure_path, pick, text  # text, LANG: the figures' language

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
# minitensor does the same on arrays. A `Tensor` (`minitensor/core/tensor.py`) holds `data` (a
# NumPy or CuPy array), `requires_grad`, `grad`, and `_ctx` — exposed as `grad_fn`, the
# `Function` object of the call that produced it (None for a leaf, 叶子节点). That object is
# the node of the graph: it keeps `inputs` (the tensors it was applied to) and `saved`
# (whatever `forward` put aside for `backward`), and its class holds the two static methods.
# `Function.apply` (`minitensor/core/autograd.py`) unwraps the tensors, calls `forward` on raw
# arrays, and wraps the result with the `ctx` attached — only when an input requires a
# gradient and we are not inside `mt.no_grad()`.
#
# Every tensor an operation makes comes out of `apply`, even where there is no gradient: a
# comparison, `argmax`, `arange` and `zeros` are Functions declared `differentiable = False`
# (`minitensor/core/ops/compare.py`), for which `apply` builds no node. That makes `apply` the
# one place where a tool can watch a forward pass: a *tracer* installed with
# `mt.tracing.install` (`minitensor/core/tracing.py`) hears of every op, its arguments and its
# output. `mt.onnx.export` records a model this way; nothing else in the engine knows tracers
# exist.

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
mask = x > 0  # a comparison is a Function too, declared differentiable = False
assert mask.grad_fn is None and not mask.requires_grad, "an op outside the graph builds no node"


class Printer:  # a tracer: Function.apply reports every op to the one installed
    def function(self, cls, args, kwargs, out):
        print(f"  {cls.__name__} made a tensor of shape {out.shape}")


with mt.tracing.install(Printer()):
    (x * w > 0).any()

# %% [markdown]
# ## A Function of our own
#
# An operation is a subclass of `mt.Function` with `forward(ctx, ...)` and
# `backward(ctx, grad)` side by side — PyTorch's idiom, and the one every op in
# `minitensor/core/ops/` follows (`elementwise.py` is the simplest). `forward` receives raw arrays
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
# `mt.gradcheck(fn, inputs)` (`minitensor/core/gradcheck.py`) compares the analytic gradient with
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
drawing = mt.viz.graph(loss, names={"Q": Q, "K": K, "V": V}, lang=LANG)
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
# ## Writing into a tensor in the graph
#
# D2L's `masked_softmax` writes `X[~mask] = -1e6` into scores that require grad, and PyTorch
# users fill a decoder's outputs with `outputs[t] = y`. minitensor records such a write as an
# op, `SetItem` in `ops/indexing.py`: x is rebound to a new node whose input is the value x
# had, so the ops that used x before the write still send their gradient to the value they
# used. Its backward is one line each way: the positions written take the gradient of `v`,
# the others that of the old x.
#
# Where does the new value live? If an op saved x's array for its backward (a product does),
# writing into that array would change what the backward reads: the write must copy. If
# nothing but x holds the array, nobody could tell a copy from a write in place, and a loop of
# T writes that copied would move T arrays of x's size (T² work). `autograd.sole_holder`
# decides by counting the references to the array (`sys.getrefcount`), as NumPy does when it
# reuses the temporary of `a + b` in `a + b + c`. Below, the same loop twice: once as written,
# once with a detached tensor sharing `outputs`' array at every write (a second holder). A weak
# reference, which is not a holder, tells whether `outputs` kept its array.

# %%
import weakref


def fill(steps, second_holder):
    """outputs[t] = tanh(2 X[t]) for every step t, then backward: (kept its array?, seconds)."""
    X = mt.randn(steps, 32, 256, requires_grad=True)
    outputs = mt.zeros(steps, 32, 256)
    first_array = weakref.ref(outputs.data)
    start = timeit.default_timer()
    for t in range(steps):
        other = outputs.detach() if second_holder else None  # shares outputs' array
        outputs[t] = (X[t] * 2).tanh()
    del other
    (outputs * outputs).sum().backward()
    seconds = timeit.default_timer() - start
    y = np.tanh(2 * X.detach().numpy())
    assert np.allclose(X.grad.numpy(), 4 * y * (1 - y**2), atol=1e-5), "the same gradient either way"
    return first_array() is outputs.data, seconds


for steps in pick((50, 100, 200), (10, 20)):
    runs = {holder: [fill(steps, holder) for _ in range(3)] for holder in (False, True)}
    assert all(kept for kept, _ in runs[False]) and not any(kept for kept, _ in runs[True])
    alone, shared = (min(seconds for _, seconds in runs[holder]) for holder in (False, True))
    print(f"{steps:3d} steps: written in place {alone * 1e3:6.1f} ms, copied at every write {shared * 1e3:6.1f} ms")

# %% [markdown]
# Written in place, the time doubles with the number of steps; copied, it grows faster: T
# copies of a tensor whose size grows with T (the fastest of three runs each). Either way the
# write's node keeps only the shape of the value x had, not its array: an old value lives as
# long as its other holders (an op that saved it), not until backward. PyTorch writes in place
# always and keeps a version counter on each tensor: a backward that needs a value written
# since raises an error instead of copying.

# %% [markdown]
# ## Why the softmax kernel is fused
#
# Attention computes a softmax over every row of its (batch, heads, queries, keys) scores;
# in the date Transformer of tutorial 7 it is one of the most frequent operations. Written
# with NumPy (`minitensor/core/kernels/reference.py`), the numerically stable softmax
#
# $$\text{softmax}(\mathbf x)_j = \frac{e^{x_j - m}}{\sum_k e^{x_k - m}},\qquad m = \max_k x_k,$$
#
# is a sequence of whole-array operations: the row max (reads $\mathbf x$), $\mathbf x - m$
# (reads $\mathbf x$, writes a temporary), `exp` (reads it, writes another), the row sums
# (reads that), the division (reads it again, writes the output). Five passes over memory
# and two full-size temporaries: for a (4096, 512) float32 array, 8 MiB each, about 40 MiB
# read and 24 MiB written — far more than the caches hold, so the time goes to moving data.
#
# The numba kernel (`minitensor/core/kernels/cpu.py`) is *fused* (算子融合): one function walks
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
# memory bandwidth the kernel reaches (bench/README.md lists its results: about 4x faster than
# plain NumPy, and faster than PyTorch, on a 2-core machine).

# %% [markdown]
# ## Fewer bits: bfloat16 and mixed precision
#
# A float32 number has 8 bits of exponent and 24 of mantissa. bfloat16 (16 bits, from Google
# Brain) keeps the 8 exponent bits, so float32's range, and 8 bits of mantissa: about two
# decimal digits, a relative rounding error of at most $2^{-8}$, in half the memory. float16
# spends its bits the other way (5 of exponent, 11 of mantissa) and overflows past 65,504,
# which is why training in it needs a loss scaler. A GPU's tensor cores multiply bfloat16
# matrices several times faster than float32 ones, and moving half the bytes shortens every
# memory-bound op around them. Mixed precision (混合精度) takes that speed where rounding
# does little harm and keeps float32 where it does (Micikevicius et al., "Mixed Precision
# Training", 2018; Kalamkar et al., "A Study of BFLOAT16 for Deep Learning Training", 2019):
#
# * a *product* of matrices sums its many products of rounded numbers in float32 (the tensor
#   core's accumulator) and rounds only the result once;
# * a *sum* of many numbers stops growing in bfloat16: 256 + 1 rounds back to 256, so 4,096
#   ones add up to 256. Softmaxes, norms, means and losses are sums, and an exponential
#   magnifies the rounding of its input;
# * the *weights* stay float32: an update lr × gradient is often smaller than half a bfloat16
#   step of the weight, and a bfloat16 weight would not move at all.
#
# `mt.autocast` (`minitensor/core/amp.py`, PyTorch's `torch.autocast`) applies these rules op
# by op inside a block: products in bfloat16; softmaxes, norms, sums and losses in float32;
# everything else in the dtype it is given. A product rounds a float32 weight inside its own
# node, and its backward gives the weight a float32 gradient.

# %%
x = mt.tensor([1.0, 1.0 + 2**-9, 1.0 + 2**-7, math.pi])
print("float32: ", x.numpy())
print("bfloat16:", x.bfloat16().float().numpy())
assert x.bfloat16().float()[1].item() == 1.0, "1 + 2^-9 is less than half a bfloat16 step above 1"

ones = np.ones(4096, dtype=mt.bfloat16)
print(f"4,096 ones added in bfloat16: {float(ones.sum()):g}; by mt.sum, in float32: {mt.tensor(ones).sum().item():g}")
assert float(ones.sum()) == 256 and mt.tensor(ones).sum().item() == 4096, "why sums run in float32"

weight, update = mt.tensor([1.0]), 1e-3 * 0.5  # lr times a gradient
print(f"w - update: {(weight - update).item():.6f} in float32, {(weight.bfloat16() - update).item():g} in bfloat16")

layer = mt.nn.Linear(8, 4)
X = mt.randn(3, 8)
with mt.autocast("cpu"):
    Y = layer(X)
    P = mt.softmax(Y, axis=-1)
    loss = -P.log().mean()
loss.backward()  # outside the block, as in PyTorch
print(
    f"in the block: Linear gives {Y.dtype}, softmax {P.dtype}, the loss {loss.dtype}; .grad {layer.weight.grad.dtype}"
)
assert (Y.dtype, P.dtype, loss.dtype, layer.weight.grad.dtype) == (mt.bfloat16, mt.float32, mt.float32, mt.float32)
full = -mt.softmax(layer(X), axis=-1).log().mean()
print(f"the same loss in float32: {full.item():.6f}, in mixed precision: {loss.item():.6f}")

# %% [markdown]
# The loss differs from float32's in the third or fourth digit, and `minitensor train
# --autocast` trains the same curves (`tests/test_amp.py` checks a language model's losses
# step by step). On this CPU there is nothing to gain: NumPy has no bfloat16 matrix product,
# so minitensor multiplies the rounded numbers in float32 and pays for the roundings. The
# speed-up is a GPU's (`docs/gpu.md`).
#
# How does a float32 become a bfloat16? bfloat16 is float32's upper half, so rounding works on
# the bits: read the float32 as a 32-bit integer $u$, add $\texttt{0x7FFF}$ plus the last bit
# kept, $(u \gg 16) \,\&\, 1$, and keep the upper 16 bits. The addition carries into the kept
# part exactly when the dropped half is more than half a step, or exactly half a step (a tie)
# with an odd last bit: round to nearest, ties to even. $1 + 2^{-8}$ is such a tie and goes
# down to 1; $1 + 3 \cdot 2^{-8}$ is one too and goes up to $1 + 2^{-6}$. Widening back is
# exact: the 16 bits become the upper half of a float32 whose lower half is zero.

# %%
# float32 to bfloat16 on the bits: keep the upper 16, rounded to nearest, a tie to the even one
values = np.array([1 + 2**-9, 1 + 2**-8, 1 + 3 * 2**-8, math.pi], dtype=np.float32)
u = values.view(np.uint32).astype(np.int64)  # each float32 read as an integer
h = (u + 0x7FFF + ((u >> 16) & 1)) >> 16  # the bfloat16's 16 bits
print([f"{a:08x}" for a in u], "->", [f"{b:04x}" for b in h])
print("as numbers:", (h.astype(np.uint32) << 16).view(np.float32))  # widened back: the lower half zero
assert np.array_equal(h.astype(np.uint16), values.astype(mt.bfloat16).view(np.uint16)), "ml_dtypes rounds the same"

# %% [markdown]
# minitensor runs exactly this, one pass over an array, in `minitensor/core/kernels/bfloat16.py`
# (numba; a GPU's three kernels in `cuda/elementwise.cu` are the same lines), and a product in
# the block rounds its float32 operands this way *into float32 arrays*: every product of two
# bfloat16 numbers is exact in float32, so a float32 matrix product of the rounded operands is
# what a bfloat16 tensor core computes.
#
# ## Beyond one process: data parallelism and the all-reduce
#
# Everything so far ran in one process. `minitensor train --workers 2` trains one model in
# several at once: data parallelism (数据并行), the simplest of the ways D2L lists to split
# training over devices (12.5 多GPU训练 / 13.5 "Training on Multiple GPUs"), and the one
# every framework wraps for its users (12.6 多GPU的简洁实现 / 13.6 "Concise Implementation for
# Multiple GPUs"). Each process, a *rank* (进程号) numbered 0 to R − 1, holds a whole copy
# of the model, a *replica* (模型副本), and every step
#
# 1. the R ranks draw the same global minibatch, the one a single process would draw, and
#    each takes its own *shard* (分片) of its rows;
# 2. each rank runs forward and backward on its shard alone;
# 3. the ranks **all-reduce** (全归约) their gradients: each puts in a vector, and every rank
#    gets back the sum of all of them (D2L's `allreduce`);
# 4. every rank now holds the same gradient and takes the same optimiser step, so the
#    replicas, identical at the start because rank 0's parameters are *broadcast* (广播) to
#    the others, stay identical.
#
# Which sum? The loss is a mean over the valid target tokens of the minibatch, and shards
# hold different numbers of them: rows differ in how much padding they carry. With $n_r$
# valid tokens on rank $r$, $N = \sum_r n_r$, $L_r$ the mean loss of rank $r$'s shard and
# $g_r$ its gradient,
#
# $$L = \frac1N \sum_{\text{valid } t} \ell_t = \sum_r \frac{n_r}{N}\,L_r
#   \qquad\Longrightarrow\qquad g = \nabla L = \sum_r \frac{n_r}{N}\, g_r :$$
#
# each rank scales its gradient by $n_r$, one all-reduce sums the scaled gradients, and every
# rank divides by $N$ (itself the all-reduce of the $n_r$).
#
# Here is one step, traced in this process: R = 3 ranks, a small Transformer in float64 on
# the reverse task (1 to 10 letters, so rows carry different amounts of padding), a global
# minibatch of 10 rows cut by `shard_bounds` exactly as `Batches(shard=(rank, size))` cuts
# it. In training every rank builds its model from the same seed; here the three replicas
# are drawn one after another, so they differ until the broadcast makes them one.

# %%
import threading

from minitensor.data import build_vocabs, reverse_task, seq2seq_arrays
from minitensor.data.batching import shard_bounds
from minitensor.train.distributed import allreduce_gradients, broadcast_parameters, buckets, rank_seed, world

R, B = 3, 10  # ranks; rows of the global minibatch
pairs = reverse_task(B, rng=np.random.default_rng(1))
src_vocab, tgt_vocab = build_vocabs(pairs)
arrays = seq2seq_arrays(pairs, src_vocab, tgt_vocab, num_steps=11)  # enc_X, enc_valid_lens, dec_X, dec_valid_lens, Y
print("valid target tokens of the 10 rows:", arrays[3])


def make_replica():
    """A small encoder-decoder Transformer in float64, without dropout: its gradients are deterministic."""
    sizes = dict(num_hiddens=16, ffn_num_hiddens=32, num_heads=2, num_blks=1, dropout=0.0, dtype=mt.float64)
    encoder = mt.nn.TransformerEncoder(len(src_vocab), **sizes)
    return mt.nn.EncoderDecoder(encoder, mt.nn.TransformerDecoder(len(tgt_vocab), **sizes))


def mean_loss(model, rows):
    """(mean loss over the valid target tokens of ``rows``, their number), as the training loop's ``_loss``."""
    enc_X, enc_valid_lens, dec_X, dec_valid_lens, Y = (mt.tensor(a[rows]) for a in arrays)
    loss = mt.cross_entropy(model(enc_X, dec_X, enc_valid_lens), Y, ignore_index=tgt_vocab.pad)
    return loss, int(dec_valid_lens.numpy().sum())


def flat(model):
    return np.concatenate([p.numpy().ravel() for p in model.parameters()])


mt.manual_seed(0)  # the trace's numbers do not depend on what the cells above drew
replicas = [make_replica() for _ in range(R)]
print(
    "largest |replica r - replica 0| before the broadcast:",
    [f"{np.abs(flat(m) - flat(replicas[0])).max():.3f}" for m in replicas],
)

# %% [markdown]
# To run the library's own collective code without MPI we need a stand-in for its `World`
# (`minitensor/train/distributed.py`): R threads play the R processes, each with its replica,
# and a barrier stands in for the network. `sum`, `allreduce_` and `broadcast_` do what
# `World` does with `MPI_Allreduce` and `MPI_Bcast`: every rank puts in its buffer, waits
# until every rank has, and takes the sum (or rank 0's).


# %%
class ThreadWorld:
    """Rank ``rank`` of ``size`` ranks that are threads of this process: MPI's collectives, with
    a barrier where MPI would use the network."""

    def __init__(self, rank, size, slots, barrier):
        self.rank, self.size, self.slots, self.barrier = rank, size, slots, barrier
        self.allreduces = 0  # how many buffers this rank all-reduced

    def _exchange(self, buffer):
        """Every rank's buffer, in rank order."""
        self.slots[self.rank] = np.array(buffer)  # a copy: what this rank sends
        self.barrier.wait()  # every rank has sent
        everyone = list(self.slots)
        self.barrier.wait()  # every rank has received: the slots may be used again
        return everyone

    def sum(self, values):
        return np.sum(self._exchange(np.asarray(values, dtype=np.float64)), axis=0)

    def allreduce_(self, buffer):
        self.allreduces += 1
        buffer[...] = np.sum(self._exchange(buffer), axis=0)

    def broadcast_(self, buffer):
        buffer[...] = self._exchange(buffer)[0]


def on_every_rank(fn):
    """``fn(world)`` on R threads, one per rank: (the results in rank order, the R worlds)."""
    slots, barrier = [None] * R, threading.Barrier(R, timeout=60)
    worlds, results, errors = [ThreadWorld(r, R, slots, barrier) for r in range(R)], [None] * R, []

    def rank_main(world):
        try:
            results[world.rank] = fn(world)
        except BaseException as e:  # no rank is left waiting at the barrier
            errors.append(e)
            barrier.abort()

    threads = [threading.Thread(target=rank_main, args=(w,)) for w in worlds]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results, worlds


on_every_rank(lambda world: broadcast_parameters(replicas[world.rank].parameters(), world))
assert all(np.array_equal(flat(m), flat(replicas[0])) for m in replicas), "the broadcast makes the replicas one"
one_process = make_replica()  # the model of a single process, for comparison: the same weights
one_process.load_state_dict(replicas[0].state_dict())
print("after the broadcast: the replicas are identical")

# %% [markdown]
# Now the step. Each rank runs forward and backward on its shard; the single process does the
# same on all 10 rows. The trace prints each rank's rows, its valid tokens $n_r$, its mean loss
# $L_r$ and the norm of its gradient $g_r$.


# %%
def gradients(model):
    return [p.grad.numpy().copy() for p in model.parameters()]


def norm(grads):
    return math.sqrt(sum(float((g * g).sum()) for g in grads))


def largest_difference(grads, others):
    return max(float(np.abs(a - b).max()) for a, b in zip(grads, others))


counts, losses, local = [], [], []  # n_r, L_r, g_r
print(f"{'rank':>4}  {'rows':<5} {'n_r':>3}  {'loss_r':>8}  {'|g_r|':>8}")
for r, model in enumerate(replicas):
    start, stop = shard_bounds(B, r, R)
    loss, n = mean_loss(model, slice(start, stop))
    loss.backward()
    counts.append(n)
    losses.append(loss.item())
    local.append(gradients(model))
    print(f"{r:>4}  {f'{start}-{stop - 1}':<5} {n:>3}  {losses[-1]:8.5f}  {norm(local[-1]):8.5f}")
loss, N = mean_loss(one_process, slice(0, B))
loss.backward()
full = gradients(one_process)
assert N == sum(counts) and abs(sum(n * l for n, l in zip(counts, losses)) / N - loss.item()) < 1e-12
print(f"N = {N}: sum_r n_r L_r / N = {loss.item():.5f}, the loss of one process on all 10 rows")

weighted = [sum(n * g[i] for n, g in zip(counts, local)) / N for i in range(len(full))]  # parameter by parameter
plain = [sum(g[i] for g in local) / R for i in range(len(full))]
terms = " + ".join(f"{n} g_{r}" for r, n in enumerate(counts))
print(f"all-reduce: g = ({terms}) / {N};  |g| = {norm(weighted):.5f}")
error_weighted, error_plain = largest_difference(weighted, full), largest_difference(plain, full)
print(f"largest |g - one process's gradient|: {error_weighted:.1e}")
print(f"the same for the plain average (1/R) sum_r g_r: {error_plain:.1e}")
assert error_weighted < 1e-12, "the token-weighted sum is the gradient of the global loss"
assert error_plain > 1e-4, "the plain average weighs a token of a short shard more: another gradient"

# %% [markdown]
# The library computes the same sum with MPI. After each rank's backward the training loop
# (`_distributed_backward` in `minitensor/train/loop.py`) calls
# `allreduce_gradients(model.parameters(), n_r, world)`: one small all-reduce adds up $N$ and
# which parameters have a gradient anywhere, then the gradients travel packed in *buckets*
# (梯度分桶): consecutive parameters copied into one contiguous host buffer, multiplied by
# $n_r$, all-reduced in one `MPI_Allreduce`, divided by $N$ and copied back. Every rank ends
# with the same numbers — bit for bit, since every rank adds the same buffers in the same
# order.

# %%
results, worlds = on_every_rank(
    lambda world: allreduce_gradients(replicas[world.rank].parameters(), counts[world.rank], world)
)
reduced = [gradients(m) for m in replicas]
assert results == [N] * R, "allreduce_gradients returns N on every rank"
assert all(all(np.array_equal(a, b) for a, b in zip(reduced[0], g)) for g in reduced), "the same gradient on every rank"
assert largest_difference(reduced[0], full) < 1e-12, "the gradient of one process"
print(
    f"allreduce_gradients: every rank now holds one process's gradient ({worlds[0].allreduces} Allreduce: one bucket)"
)

# %% [markdown]
# Why buckets? A message costs a fixed latency plus its size over the bandwidth, and a
# Transformer has many small tensors (biases, layer norms): one message per tensor would be
# mostly latency. Buckets of up to `BUCKET_BYTES` = 4 MiB make a few large messages instead —
# PyTorch's `DistributedDataParallel` packs 25 MiB buckets (Li et al. 2020, "PyTorch Distributed:
# Experiences on Accelerating Data Parallel Training", arXiv:2006.15704), Horovod calls it
# tensor fusion (Sergeev and Del Balso 2018, "Horovod: fast and easy distributed deep learning
# in TensorFlow", arXiv:1802.05799). A large message is then all-reduced by a bandwidth-optimal
# algorithm such as the ring (环同步, D2L 12.7 参数服务器 / 13.7 "Parameter Servers"; Patarasuk
# and Yuan 2009, "Bandwidth optimal all-reduce algorithms for clusters of workstations"): each
# rank sends and receives about $2(R-1)/R$ times the buffer, nearly independent of $R$. MPI
# chooses the algorithm; the library chooses the buckets.
#
# Our small model fits in one 4 MiB bucket: one Allreduce per step. With 16 KiB buckets it
# takes four, and the numbers do not change, since bucketing decides only which additions
# travel together:

# %%
names = {id(p): name for name, p in replicas[0].named_parameters()}
groups = buckets(list(replicas[0].parameters()), bucket_bytes=16 << 10)
for i, group in enumerate(groups):
    size, first, last = sum(p.data.nbytes for p in group), names[id(group[0])], names[id(group[-1])]
    print(f"bucket {i}: {len(group):2} parameters, {size / 1024:4.1f} KiB  ({first} ... {last})")
assert len(buckets(list(replicas[0].parameters()))) == 1, "one 4 MiB bucket holds this whole model"
assert [p for group in groups for p in group] == list(replicas[0].parameters()), "consecutive parameters, in order"

for model, grads in zip(replicas, local):  # back to each rank's own gradient, and all-reduce again
    for p, g in zip(model.parameters(), grads):
        p.grad = mt.tensor(g)
_, worlds = on_every_rank(
    lambda world: allreduce_gradients(replicas[world.rank].parameters(), counts[world.rank], world, 16 << 10)
)
assert [w.allreduces for w in worlds] == [len(groups)] * R, "one Allreduce per bucket"
assert all(np.array_equal(p.grad.numpy(), g) for p, g in zip(replicas[0].parameters(), reduced[0])), "the same bits"
print(f"{len(groups)} buckets: {len(groups)} Allreduce calls, the same gradient to the last bit")

# %% [markdown]
# After the all-reduce every rank clips the gradient norm (`--clip-grad-norm`, 1.0 by default)
# and steps its optimiser. The order matters: clipping comes *after* the all-reduce, on the
# global gradient, as in one process. A mean over fewer tokens is noisier: here some of the
# shards' gradients are longer than 1.0 while the global one is not, so clipping them first
# would shrink a gradient that one process leaves alone. Then Adam takes the same step on
# every rank: the replicas stay identical, bit for bit, and equal to the single process's
# model up to rounding.

# %%
assert max(norm(g) for g in local) > 1.0 > norm(full), "a shard's gradient is longer than 1.0, g is not"
clipped_first = [sum(n * g[i] * min(1.0, 1.0 / norm(g)) for n, g in zip(counts, local)) / N for i in range(len(full))]
change = largest_difference(clipped_first, full)
print(f"|g_r| = {', '.join(f'{norm(g):.3f}' for g in local)}; |g| = {norm(full):.3f}")
print(f"clipping each g_r to 1.0 before the all-reduce would change g by up to {change:.1e}")
assert change > 1e-3, "clipping first is another gradient"

for model in replicas + [one_process]:
    mt.optim.clip_grad_norm_(model.parameters(), 1.0)  # on the global gradient: the same on every rank
    mt.optim.Adam(model.parameters(), lr=1e-2).step()
assert all(np.array_equal(flat(m), flat(replicas[0])) for m in replicas), "identical steps keep the replicas identical"
difference = np.abs(flat(replicas[0]) - flat(one_process)).max()
print(f"after the step: the replicas are identical; largest |replica - one process| = {difference:.1e}")
assert difference < 1e-12, "N processes train the model of one, up to rounding"

# %% [markdown]
# The rest of the loop stays with rank 0: it alone prints, draws the progress bar, evaluates
# on the held-out set and writes the checkpoints (`World.is_main`), while the other ranks
# train silently and meet it at the next all-reduce. One thing must differ from rank to rank:
# dropout's random masks. Each shard should get masks of its own, as each row does in one
# process, and a run must stay reproducible, so rank 0 keeps the run's own stream and rank
# $r > 0$ reseeds with `rank_seed(seed, r, step)` when training starts (or resumes at `step`):
# a different stream per rank, the same one for the same (seed, rank, step). Run as a plain
# script, this process is a world of one, and `train` does exactly what it did before.

# %%
seeds = [rank_seed(0, r, 0) for r in range(1, 4)]
print("dropout seeds of ranks 1, 2, 3 (seed 0, step 0):", seeds)
assert len(set(seeds)) == 3 and seeds == [rank_seed(0, r, 0) for r in range(1, 4)], "different, and reproducible"
assert rank_seed(0, 1, 100) != seeds[0], "resumed at step 100, rank 1 does not draw its first masks again"
here = world()
assert here.size == 1 and here.rank == 0 and here.is_main, "not started by mpiexec: a world of one"
print(f"this process: rank {here.rank} of {here.size}")

# %% [markdown]
# ### Running it
#
# Data parallelism needs the `dist` extra, mpi4py and the MPICH wheel, which brings `mpiexec`:
#
# ```bash
# pip install -e ".[dist]"
# minitensor train --workers 2                   # starts mpiexec -n 2 itself, on this machine
# mpiexec -n 2 minitensor train --epochs 8       # the same, started by hand (several hosts: see docs/guide.md)
# ```
#
# What stays exact: the global minibatch, the learning rate and its schedule are those of one
# process, so N processes train the same model as one, up to float rounding (the sums are
# added in another order), and a checkpoint resumes with any number of processes
# (`--resume --workers 4`). On `--device cuda` each rank takes its own GPU, and the buckets
# travel through host memory (NCCL, which all-reduces on the GPUs directly, would spare the
# copies). How much faster N processes train depends on the machine and the model: shards get
# smaller while the all-reduce does not; `python bench/data_parallel.py` measures it.
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
# 3. Which of these make the next `outputs[t] = y` copy: `row = outputs[0]`, `host =
#    outputs.numpy()`, `doubled = outputs * 2`, `squared = outputs * outputs`? Predict, then
#    check with a weak reference as `fill` does. Why does `x[0] = x[1]` copy, although `x[1]` is
#    only read?
# 4. Write a fused *masked* softmax for (rows, n) scores and `valid_lens` in numba (one row per
#    `prange` iteration, zeros past the valid length, zeros for a row with none), compare it
#    with `reference.softmax_forward(np, x, lens)` and with `cpu.softmax_forward(x, lens)`,
#    and time the three.
# 5. Run the trace with `R = 12` ranks for the 10 rows: two shards are empty. What does
#    `allreduce_gradients` add for them, and does every rank still hold one process's
#    gradient? Then build replica 1 with `dropout=0.1`: why do the replicas stay identical
#    after the step, although the gradient no longer equals one process's?
# 6. Train the `Linear` of the mixed-precision section by hand, once with its weight in float32
#    and `mt.autocast`, once with the weight itself in bfloat16 (`layer.weight.data =
#    layer.weight.data.astype(mt.bfloat16)`, the optimiser's update written as `w -= lr * g`).
#    With a learning rate of 1e-3, after how many steps does the bfloat16 weight stop changing?
#
# ## Where this lives in the engine
#
# * `minitensor/core/tensor.py` — `Tensor`: `data`, `grad`, `requires_grad`, `grad_fn` (`_ctx`),
#   the creation number `_seq`, and every operator in the class body: `x * w` is
#   `Tensor.__mul__`, one line calling `Mul.apply`;
# * `minitensor/core/autograd.py` — `Function` (`apply`, `save_for_backward`, `needs_input_grad`,
#   `differentiable`), `backward` (the heap), `GradAt` (a gradient that is zero but on a slice, such
#   as `x[t]`'s: added into its slice of one array, so a loop over x's rows stays linear),
#   `sum_to_shape` (undoing broadcasting), `_accumulate`
#   (how a leaf takes a gradient that nothing else holds without copying it, as PyTorch does),
#   `sole_holder` (the same test of reference counts lets `outputs[t] = y` write in place);
#   `minitensor/core/tracing.py` — the one hook a tracer installs;
# * `minitensor/core/ops/elementwise.py` — the simplest ops, each forward beside its backward;
#   `minitensor/core/ops/compare.py` — the comparisons, outside the graph;
#   `minitensor/core/ops/softmax.py` — the softmax Functions on top of the kernels;
# * `minitensor/core/gradcheck.py` — `mt.gradcheck`;
# * `minitensor/core/kernels/cpu.py` (the fused numba kernels) and `minitensor/core/kernels/reference.py`
#   (the same in plain NumPy: the oracle of the tests and the baseline of the benchmark);
#   `minitensor/core/kernels/fused.py` fuses the rest of a training step's elementwise work the
#   same way (dropout, ReLU, layer norm, Adam's update), each tested against its op's NumPy
#   code;
# * `bench/softmax.py` — the proper benchmark;
# * `minitensor/core/amp.py` — `mt.autocast`: the block's state and the two lines the ops call,
#   `amp.product_dtype` (the products) and `amp.in_float32` (softmaxes, norms, sums, losses);
#   `minitensor/core/dtypes.py` — `mt.bfloat16` and `is_floating` (bfloat16's NumPy kind is "V");
# * `minitensor/train/distributed.py` — data parallelism: `World` (MPI's `COMM_WORLD`, or this
#   process alone), `broadcast_parameters`, `buckets`, `allreduce_gradients`, `rank_seed`; its
#   docstring is this section's theory in brief. `shard_bounds` and `Batches(shard=)` in
#   `minitensor/data/batching.py` cut the global minibatch; `_distributed_backward` in
#   `minitensor/train/loop.py` is one step; `--workers` in `minitensor/cli.py` starts
#   `mpiexec`; `bench/data_parallel.py` measures the speed-up.
