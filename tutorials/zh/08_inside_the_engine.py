# %% [markdown]
# # 8. 引擎内部：反向模式自动微分与融合的 softmax 计算内核
#
# 前面各个教程中的每个模型都是用梯度下降训练的，而每个梯度都出自同一个地方：
# `minitensor/core/autograd.py`，大约 500 行代码。本教程就来打开它。我们将：
#
# 1. 从零开始为标量编写反向模式自动微分（reverse-mode automatic differentiation），
#    只用 30 行，并与 minitensor 的结果相互核对；
# 2. 看看 minitensor 如何记录计算图（computational graph）：
#    一个 `Tensor` 会记住产生它的那次 `Function` 调用；
# 3. 编写我们自己的可微运算，即一个带有 `forward` 和 `backward`（前向传播 / 反向传播）的
#    `mt.Function`，并用梯度检验（gradient check）`mt.gradcheck` 检查它——
#    它也能查出一个故意写错的 `backward`；
# 4. 画出缩放点积注意力的计算图，观察 `backward` 访问各个节点的顺序，
#    以及写入计算图中张量的 `x[i] = v` 变成了什么；
# 5. 弄清注意力核心处的 softmax 为什么以*融合*的 numba 计算内核（fused kernel）运行，
#    并与普通的 NumPy 实现比较运行时间；然后舍入到 bfloat16，看看混合精度（`mt.autocast`）
#    把哪些运算留在 float32 中；
# 6. 走出单个进程：在三个模拟的进程上追踪数据并行训练的一步，看看为什么它们的梯度要按
#    各自的词元数加权求和。
#
# 可以用 `python tutorials/zh/08_inside_the_engine.py` 运行它（几秒钟），
# 也可以借助 jupytext 把它作为笔记本打开；设置 `MINITENSOR_TUTORIAL_SMOKE=1` 会让数组变小。
#
# 参考资料：D2L 的中文版《动手学深度学习》（zh.d2l.ai）2.4 微积分（链式法则）、
# 2.5 自动微分和 4.7 前向传播、反向传播和计算图，以及英文版 *Dive into Deep Learning*（d2l.ai）
# 2.4 "Calculus"、2.5 "Automatic Differentiation" 和 5.3 "Forward Propagation, Backward
# Propagation, and Computational Graphs"；我们要遍历其计算图的注意力，
# 是 10.3 注意力评分函数 / 11.3 "Attention Scoring Functions" 中的缩放点积注意力；
# 数据并行见计算性能一章的 12.5 多GPU训练 / 13.5 "Training on Multiple GPUs"
# （以及 12.6 / 13.6；环同步见 12.7 / 13.7）。

# %%
import itertools
import math
import statistics
import timeit

import numpy as np
from _tutorial import LANG, SMOKE, expect_error, figure_path, pick, text  # text、LANG：图中文字的语言

import minitensor as mt

T = "08_inside_the_engine"
mt.manual_seed(0)
print("smoke mode" if SMOKE else "full mode")

# %% [markdown]
# ## 用一段话讲清反向模式
#
# 程序从输入出发，经过一系列基本运算 $z = f(x, y)$ 算出一个标量损失 $L$，
# 每个运算的局部导数 $\partial z/\partial x$、$\partial z/\partial y$ 都是已知的。
# 链式法则（chain rule）告诉我们，如果 $z$ 还被后续的运算使用，那么
#
# $$\frac{\partial L}{\partial x} \mathrel{+}= \frac{\partial L}{\partial z}\,\frac{\partial z}{\partial x}
#   \qquad\text{对每个由 } x \text{ 算出的 } z .$$
#
# *反向*模式从输出处的 $\partial L/\partial L = 1$ 出发，沿计算图倒着走，
# 每个节点把“自己的梯度乘以自己的局部导数”传给它的输入——这就是反向传播（backpropagation）。
# 一次反向传播就能同时得到*每个*输入 $w$ 的 $\partial L/\partial w$，
# 代价只是前向传播的一个小倍数：这正是训练所需要的，因为训练只有一个标量损失，却有许多参数。
# （前向模式则要对每个输入各做一遍。）唯一需要留意的是顺序：
# 一个节点只有收到了*所有*由它算出的节点传回的梯度之后，才能把自己的梯度继续往下传。
# 任何让每个节点都排在它的全部使用者之后的顺序——即逆拓扑排序（reverse topological order）——都可行，
# 而创建顺序本身就白送了一个拓扑排序：一个运算的输入总是先于它的输出而存在。
#
# ## 从零实现标量的自动微分
#
# 每个 `Value` 记录它的父节点，以及在前向传播中算出的、它对每个父节点的局部导数。
# `backward` 从最新的值开始依次访问每个值，
# 把“我的梯度乘以我的局部导数”累加到每个父节点的梯度上。


# %%
class Value:
    """A scalar that remembers how it was made: its parents and d(self)/d(parent) for each."""

    _created = itertools.count()

    def __init__(self, data, parents=(), local_grads=(), op=""):
        self.data, self.grad = float(data), 0.0
        self.parents, self.local_grads, self.op = parents, local_grads, op
        self.seq = next(Value._created)  # 创建顺序即一种拓扑排序

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
        for v in sorted(self.graph(), key=lambda v: v.seq, reverse=True):  # 最新的先处理
            for parent, local in zip(v.parents, v.local_grads):
                parent.grad += v.grad * local  # 链式法则


a, b, c = Value(0.5), Value(-1.5), Value(0.25)
L = (a * b + c).tanh() * a  # a 被用了两次：它的梯度有两项
L.backward()
print(f"L = {L.data:.6f};  dL/da = {a.grad:.6f}, dL/db = {b.grad:.6f}, dL/dc = {c.grad:.6f}")

# %% [markdown]
# 同一个表达式在 minitensor 中（float64 的 0 维张量）得到相同的数值；
# 手算的话，记 $u = \tanh(ab + c)$，则 $\partial L/\partial a = u + a(1-u^2)b$——
# 这是从 $a$ 到 $L$ 的两条路径之和。

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
# ## minitensor 如何存储计算图
#
# minitensor 在数组上做的是同一件事。`Tensor`（`minitensor/core/tensor.py`）保存
# `data`（一个 NumPy 或 CuPy 数组）、`requires_grad`、`grad` 和 `_ctx`；
# `_ctx` 以 `grad_fn` 之名对外公开，它是产生该张量的那次调用的 `Function` 对象
# （对叶子节点（leaf）而言为 None）。这个对象就是计算图中的节点：
# 它保存 `inputs`（它所作用的张量）和 `saved`（`forward` 为 `backward` 留下的任何东西），
# 而两个静态方法则定义在它的类中。`Function.apply`（`minitensor/core/autograd.py`）
# 取出张量中的数组，在原始数组上调用 `forward`，再把结果包装成张量并附上 `ctx`——
# 但只有当某个输入需要梯度、且不在 `mt.no_grad()` 之内时才这样做。
#
# 运算产生的每一个张量都出自 `apply`，即使其中没有梯度：比较、`argmax`、`arange` 和 `zeros`
# 都是声明为 `differentiable = False` 的 Function（`minitensor/core/ops/compare.py`），
# `apply` 不为它们建立节点。于是 `apply` 成了工具观察一次前向传播的唯一位置：用
# `mt.tracing.install` 安装的*追踪器*（tracer，`minitensor/core/tracing.py`）会得知每个运算、
# 它的参数和它的输出。`mt.onnx.export` 就是这样记录模型的；引擎的其他部分并不知道追踪器的存在。

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
mask = x > 0  # 比较也是一个 Function，声明为 differentiable = False
assert mask.grad_fn is None and not mask.requires_grad, "an op outside the graph builds no node"


class Printer:  # 一个追踪器：Function.apply 把每个运算报告给已安装的那一个
    def function(self, cls, args, kwargs, out):
        print(f"  {cls.__name__} made a tensor of shape {out.shape}")


with mt.tracing.install(Printer()):
    (x * w > 0).any()

# %% [markdown]
# ## 我们自己的 Function
#
# 一个运算就是 `mt.Function` 的一个子类，其中 `forward(ctx, ...)` 和 `backward(ctx, grad)`
# 并排写在一起——这是 PyTorch 的惯用写法，`minitensor/core/ops/` 中的每个运算都遵循它
# （`elementwise.py` 中的最简单）。`forward` 接收原始数组，并用 `ctx.xp`
# （NumPy 或 CuPy：同一份代码可以在两种后端上运行）进行计算；
# 它用 `ctx.save_for_backward` 留下 `backward` 需要的东西。
# `backward` 接收 $\partial L/\partial y$，并为每个输入返回 $\partial L/\partial x$
# （对非张量的参数返回 None）。
#
# Softplus，一个平滑的 ReLU：
#
# $$y = \log(1 + e^x), \qquad \frac{dy}{dx} = \frac{e^x}{1+e^x} = \sigma(x)
#   = \tfrac12\big(1 + \tanh(x/2)\big).$$
#
# 两者的写法都不会溢出：`logaddexp(0, x)` 以数值稳定的方式计算 $\log(e^0 + e^x)$，
# 而 $\sigma$ 的 tanh 形式在 $x$ 是很大的负数时也从不计算 $e^{-x}$。


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
# `mt.gradcheck(fn, inputs)`（`minitensor/core/gradcheck.py`）把解析梯度与中心有限差分（finite differences）相比较：
#
# $$\frac{\partial L}{\partial x_i} \approx \frac{L(x + \epsilon e_i) - L(x - \epsilon e_i)}{2\epsilon},$$
#
# 其误差为 $O(\epsilon^2)$。比较在 float64 中进行（若用 float32，
# $L$ 的舍入误差约为 $10^{-7}|L|/\epsilon$，会淹没这个差分）。
# 输出为张量的函数会用固定的*随机*权重归约成一个标量，$L = \sum_j v_j\, \text{fn}(x)_j$。
#
# 为什么要用随机权重？下面是手写 `backward` 时最常见的错误：忘了乘以传入的梯度。
# 若 $L = \sum_j y_j$，传入的梯度全是 1，这个错误就无从察觉：


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
# ### 广播由引擎撤销，而不由每个运算各自处理
#
# 一个双输入的运算：$z = \sqrt{a^2 + b^2}$（`hypot`），$\partial z/\partial a = a/z$，
# $\partial z/\partial b = b/z$。如果 `b` 的形状是 (4,)，`a` 的形状是 (3, 4)，
# NumPy 就会把 `b` 广播（broadcasting）到各行上，每个 `b[j]` 影响 3 个输出，
# 因此它的梯度是对这些输出的求和。我们的 `backward` 照样为 `b` 返回一个 (3, 4) 的梯度：
# `autograd.sum_to_shape` 会一次性把它求和回 (4,)，对所有运算都如此，因此哪个运算都不必自己处理。


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
        return grad * a / z, grad * b / z  # 两者的形状都是 (3, 4)：由引擎把 b 的梯度求和回 (4,)


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
# ## 缩放点积注意力的计算图
#
# 现在来看本章中的一个小表达式：单个头的缩放点积注意力，再加上一个损失，
# $L = \sum \text{softmax}(\mathbf Q\mathbf K^\top/\sqrt d)\mathbf V$。
# 我们从 $L$ 出发，沿着每个张量的 `grad_fn` 及其 `inputs` 遍历计算图
# （像 $\sqrt d$ 这样的 Python 数值是常量，不是节点），
# 把它打印成构建它的那段程序，再把它画出来。

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
    return sorted(tensors, key=lambda t: t._seq), edges  # 按创建顺序


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
for p, t in edges:  # 逆拓扑排序：每个输出都先于它的输入处理
    if p.grad_fn is not None:
        assert rank[id(t)] < rank[id(p)], "backward must reach an output before its inputs"

# %% [markdown]
# 图中，张量画成椭圆（叶子节点为绿色），Function 节点画成方框，
# 并按 `backward` 访问它们的顺序编号。箭头顺着前向的方向，从输入指向输出；梯度则逆着箭头流动。

# %%
from matplotlib.figure import Figure


def draw_graph(tensors, edges, names, path):
    # 分列：算出的张量放在它最深的输入右边一列；叶子节点放在它的第一个使用者左边一列，
    # 画在链的上方，使箭头不穿过任何节点。
    depth = {}
    for t in tensors:  # 按创建顺序：先放置输入
        ins = [p for p in (t.grad_fn.inputs if t.grad_fn else ()) if isinstance(p, mt.Tensor)]
        depth[id(t)] = 1 + max((depth[id(p)] for p in ins), default=-1)
    leaf_column = {}
    for p, t in edges:
        if p.grad_fn is None:
            leaf_column[id(p)] = min(leaf_column.get(id(p), depth[id(t)]), depth[id(t)] - 1)
    depth.update(leaf_column)
    columns = {}
    for t in sorted(tensors, key=lambda t: t.grad_fn is None):  # 先放算出的张量
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
        if t.grad_fn is not None:  # 它的 Function 方框位于它的输入与它之间
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
# minitensor 自己也能画出同样的计算图：`mt.viz.graph(loss)` 像 `walk` 那样遍历它，
# 并把它分层排成一幅 SVG（输入在上，$L$ 在下）：每个 Function 一个方框，
# 标出其输出的形状和 dtype、它为反向传播保存的字节数，以及它在反向传播顺序中的编号；
# `.backward()` 执行反向传播，并为每个节点添上其梯度的范数。
# 它在笔记本中会直接显示出来，`.save(path)` 则把它写入文件；
# `minitensor explain` 会把一个真实注意力层的计算图放进它生成的页面。

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
# ## `backward` 如何排定节点的顺序
#
# `autograd.backward` 做的正是我们的 `Value.backward` 所做的事，只是不必先对整个计算图排序：
# 每个张量都有一个创建编号 `_seq`，一个堆每次从已经收到梯度的张量中取出编号最大的那个。
# 由于输出总是比它的输入更新，一个张量只有在由它算出的每个张量都把梯度传回之后，才会从堆中取出；
# 沿不同路径到达的梯度会相加。整个过程不涉及递归，所以包含数千个运算的链也没有问题
# （递归的深度优先搜索会撞上 Python 约 1000 层的递归上限）。
#
# 我们可以用一个前向时什么也不做、在 `backward` 中记下自己名字的 `Function` 来观察这个顺序。
# 下面的 `h` 同时输入到 `u` 和 `v` 两个分支中（形成一个菱形）：`h` 必须等这两个分支都传回梯度。

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
        return grad, None  # 标签没有梯度


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

n = pick(20_000, 3_000)  # 远远超过 Python 的递归深度上限
x = mt.tensor(1.0, dtype=mt.float64, requires_grad=True)
y = x
for _ in range(n):
    y = y * 1.0001
y.backward()
assert abs(x.grad.item() - 1.0001**n) < 1e-9 * 1.0001**n
print(f"a chain of {n:,} multiplications: dL/dx = {x.grad.item():.6f} = 1.0001^{n}")

# %% [markdown]
# `backward` 结束后，计算图即被释放——保存的数组和指向输入的链接都被丢弃，内存立即归还。
# 第二次沿同一个计算图调用 `backward` 是一个错误，错误信息会说明这一点，
# 除非第一次调用时传入了 `retain_graph=True`；梯度会在 `.grad` 中*累加*
# （这正是优化器要调用 `zero_grad()` 的原因）。

# %%
x = mt.randn(3, dtype=mt.float64, requires_grad=True)
y = (x * x).sum()
y.backward(retain_graph=True)
first = x.grad.numpy()
y.backward()  # 允许：计算图被保留了
assert np.allclose(x.grad.numpy(), 2 * first), "gradients accumulate"
with expect_error("a third backward through the graph the second one freed", mt.GraphError):
    y.backward()

# %% [markdown]
# ## 写入计算图中的张量
#
# D2L 的 `masked_softmax` 在需要梯度的评分上写入 `X[~mask] = -1e6`，PyTorch 用户也常用
# `outputs[t] = y` 逐步填好解码器的输出。minitensor 把这样的写入记录为一个运算，即
# `ops/indexing.py` 中的 `SetItem`：x 被重新绑定到一个新节点，这个节点的输入是 x 原来的值，
# 所以在写入之前用过 x 的运算，仍把梯度传给它们当时用到的那个值。它的反向传播两边各一行：
# 被写入的位置取 `v` 的梯度，其余位置取旧 x 的梯度。
#
# 新值放在哪里？如果某个运算为反向传播保存了 x 的数组（乘积就会保存），往这个数组里写就会改变
# 反向传播读到的值：写入必须复制。如果除了 x 之外没有谁持有这个数组，复制与原地写入就无从区分，
# 而每次都复制的话，一个写入 T 次的循环要搬动 T 个与 x 一样大的数组（T² 的工作量）。
# `autograd.sole_holder` 通过数一数数组的引用（`sys.getrefcount`）来决定，正如 NumPy 在
# `a + b + c` 中复用 `a + b` 的临时数组时所做的那样。下面把同一个循环运行两遍：一遍照原样写，
# 一遍在每次写入时都让一个分离出来的张量共享 `outputs` 的数组（第二个持有者）。弱引用不是持有者，
# 它告诉我们 `outputs` 是否保留了自己的数组。

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
# 原地写入时，耗时随步数翻倍而翻倍；每次都复制时，耗时增长得更快：T 次复制一个大小随 T 增长的张量
# （每种情况取三次运行中最快的一次）。无论哪种情况，写入的节点都只保留 x 原来的值的形状，
# 而不保留它的数组：一个旧值只在它的其他持有者（比如保存了它的运算）还在时才存活，而不是一直活到
# 反向传播。PyTorch 总是原地写入，并给每个张量配一个版本计数器：如果反向传播需要的值在此后被写过，
# 它会报错，而不是去复制。

# %% [markdown]
# ## 为什么 softmax 计算内核是融合的
#
# 注意力要对形状为（批量大小, 头数, 查询数, 键数）的评分的每一行计算 softmax；
# 在教程 7 中规范化日期的那个 Transformer 里，它是最频繁的运算之一。
# 用 NumPy 编写时（`minitensor/core/kernels/reference.py`），数值稳定的 softmax
#
# $$\text{softmax}(\mathbf x)_j = \frac{e^{x_j - m}}{\sum_k e^{x_k - m}},\qquad m = \max_k x_k,$$
#
# 是一串针对整个数组的运算：行最大值（读 $\mathbf x$）、$\mathbf x - m$（读 $\mathbf x$，写一个临时数组）、
# `exp`（读它，再写一个临时数组）、行和（读这个数组）、除法（再读一遍，写出输出）。
# 对内存走了五遍，还有两个与输入一样大的临时数组：对一个 (4096, 512) 的 float32 数组来说，
# 每个 8 MiB，总共约读 40 MiB、写 24 MiB——远超缓存的容量，所以时间都花在了搬运数据上。
#
# numba 计算内核（`minitensor/core/kernels/cpu.py`）是*融合*的（算子融合，operator fusion）：
# 一个函数逐行遍历数组，一行 512 个浮点数（2 KiB）始终留在 L1 缓存中，
# 在这一行上依次完成最大值、指数及其求和，以及缩放。主存只看到输入被读一次、输出被写一次：16 MiB。
# 各行相互独立，因此还把它们分配到多个线程上（`prange`）；float32 的 `exp` 用普通的算术写成，
# 由 LLVM 将其向量化。减去 $m$ 在数学上不改变任何结果（分子和分母都乘以 $e^{-m}$），
# 但能防止 `exp` 溢出：每个指数都 $\le 0$。

# %%
import tracemalloc

import numba
from minitensor.kernels import cpu, reference

rows, cols = pick((4096, 512), (256, 128))
scores = np.random.default_rng(0).standard_normal((rows, cols)).astype(np.float32) * 3

fused = cpu.softmax_forward(scores)  # 第一次调用会加载（或编译）这个计算内核
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
# 计时：取多次重复 `timeit` 运行的中位数，融合计算内核分别在全部线程和单个线程上运行
# （单线程是为了只拿融合本身与 NumPy 比较，因为 NumPy 在单个线程上执行这些运算）。


# %%
def median_ms(fn, number, repeat):
    return 1e3 * statistics.median(timeit.repeat(fn, number=number, repeat=repeat)) / number


number, repeat = pick((5, 15), (20, 5))
threads = numba.get_num_threads()
plain_bar, one_thread_bar = text("plain NumPy\n(reference.py)"), text("numba kernel\n1 thread")  # 各个柱子的名称
times = {plain_bar: median_ms(lambda: reference.softmax_forward(np, scores), number, repeat)}
if threads > 1 and scores.size >= cpu.PARALLEL_MIN_SIZE:  # 更小的数组总在单线程上运行
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
if not SMOKE:  # 只在完整规模下断言；冒烟模式下数组太小，计时没有多大意义
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
# 即便只用一个线程，单靠融合就比 NumPy 快好几倍：同样的算术，四分之一的内存流量。
# 更多线程只有在核心空闲时才有帮助：在一台忙于其他工作的机器上，
# 线程池在每个并行循环处都要等待最慢的那个线程，2 个线程的耗时可能比 1 个线程*更长*
# （这也是元素少于 `cpu.PARALLEL_MIN_SIZE` 个的数组总在单线程上运行的原因）。
#
# 这只是在机器同时忙着别的事情时的一次粗略观察。正式的基准测试是 `python bench/softmax.py`：
# 前向与反向、softmax 与 log-softmax、两种形状、1 个和 2 个线程，与普通 NumPy *以及*
# `torch.softmax` 交替运行，并给出该计算内核达到的内存带宽
# （bench/README.md 列出了它的结果：在一台双核机器上，比普通 NumPy 快约 4 倍，也比 PyTorch 快）。

# %% [markdown]
# ## 更少的位：bfloat16 与混合精度
#
# 一个 float32 数有 8 位指数和 24 位尾数。bfloat16（16 位，出自 Google Brain）保留了这 8 位指数，
# 因而有 float32 的表示范围，尾数只有 8 位：大约两位十进制有效数字，相对舍入误差至多 $2^{-8}$，
# 内存却只占一半。float16 的位分配恰好相反（5 位指数、11 位尾数），超过 65,504 就会溢出，
# 所以用它训练需要损失缩放。GPU 的张量核心做 bfloat16 矩阵乘法比 float32 快好几倍，
# 而搬运一半的字节也缩短了它们周围每个受内存带宽限制的运算。混合精度
# 在舍入危害不大的地方取得这份速度，在危害大的地方保留 float32
# （Micikevicius 等，“Mixed Precision Training”，2018；Kalamkar 等，
# “A Study of BFLOAT16 for Deep Learning Training”，2019）：
#
# * 矩阵的*乘积*把许多舍入后的数的乘积在 float32 中累加（张量核心的累加器），只在最后把结果舍入一次；
# * 许多数的*求和*在 bfloat16 中会停止增长：256 + 1 舍入后还是 256，所以 4,096 个 1 加起来是 256。
#   softmax、规范化、均值和损失都是求和，而指数函数会放大其输入的舍入误差；
# * *权重*保持 float32：一次更新 lr × 梯度 往往小于权重所在处 bfloat16 步长的一半，
#   bfloat16 的权重根本不会动。
#
# `mt.autocast`（`minitensor/core/amp.py`，即 PyTorch 的 `torch.autocast`）在一个代码块内逐个运算地
# 应用这些规则：乘积用 bfloat16；softmax、规范化、求和与损失用 float32；其余运算保持输入的数据类型。
# 乘积在它自己的节点内舍入 float32 权重，它的反向给权重一个 float32 的梯度。

# %%
x = mt.tensor([1.0, 1.0 + 2**-9, 1.0 + 2**-7, math.pi])
print("float32: ", x.numpy())
print("bfloat16:", x.bfloat16().float().numpy())
assert x.bfloat16().float()[1].item() == 1.0, "1 + 2^-9 is less than half a bfloat16 step above 1"

ones = np.ones(4096, dtype=mt.bfloat16)
print(f"4,096 ones added in bfloat16: {float(ones.sum()):g}; by mt.sum, in float32: {mt.tensor(ones).sum().item():g}")
assert float(ones.sum()) == 256 and mt.tensor(ones).sum().item() == 4096, "why sums run in float32"

weight, update = mt.tensor([1.0]), 1e-3 * 0.5  # 学习率乘以一个梯度
print(f"w - update: {(weight - update).item():.6f} in float32, {(weight.bfloat16() - update).item():g} in bfloat16")

layer = mt.nn.Linear(8, 4)
X = mt.randn(3, 8)
with mt.autocast("cpu"):
    Y = layer(X)
    P = mt.softmax(Y, axis=-1)
    loss = -P.log().mean()
loss.backward()  # 在代码块之外，与 PyTorch 相同
print(
    f"in the block: Linear gives {Y.dtype}, softmax {P.dtype}, the loss {loss.dtype}; .grad {layer.weight.grad.dtype}"
)
assert (Y.dtype, P.dtype, loss.dtype, layer.weight.grad.dtype) == (mt.bfloat16, mt.float32, mt.float32, mt.float32)
full = -mt.softmax(layer(X), axis=-1).log().mean()
print(f"the same loss in float32: {full.item():.6f}, in mixed precision: {loss.item():.6f}")

# %% [markdown]
# 损失与 float32 的结果在第三或第四位有效数字上不同，而 `minitensor train --autocast`
# 训练出同样的曲线（`tests/test_amp.py` 逐步检查一个语言模型的损失）。在这台 CPU 上没有什么可得：
# NumPy 没有 bfloat16 矩阵乘法，所以 minitensor 在 float32 中计算舍入后的数的乘积，还要为舍入付出时间。
# 加速属于 GPU（`docs/gpu.md`）。
#
# float32 怎样变成 bfloat16？bfloat16 就是 float32 的高半部分，所以舍入可以直接在位上做：把 float32
# 当作 32 位整数 $u$，加上 $\texttt{0x7FFF}$ 再加上保留部分的最后一位 $(u \gg 16) \,\&\, 1$，
# 然后留下高 16 位。当被丢掉的低半部分超过半个步长，或恰好是半个步长（平局）而最后一位是奇数时，
# 这次加法恰好向保留部分进位：舍入到最近的数，平局时取偶数。$1 + 2^{-8}$ 就是这样的平局，向下舍入为 1；
# $1 + 3 \cdot 2^{-8}$ 也是，向上舍入为 $1 + 2^{-6}$。反过来的加宽是精确的：这 16 位成为一个低半部分为零的
# float32 的高半部分。

# %%
# float32 to bfloat16 on the bits: keep the upper 16, rounded to nearest, a tie to the even one
values = np.array([1 + 2**-9, 1 + 2**-8, 1 + 3 * 2**-8, math.pi], dtype=np.float32)
u = values.view(np.uint32).astype(np.int64)  # each float32 read as an integer
h = (u + 0x7FFF + ((u >> 16) & 1)) >> 16  # the bfloat16's 16 bits
print([f"{a:08x}" for a in u], "->", [f"{b:04x}" for b in h])
print("as numbers:", (h.astype(np.uint32) << 16).view(np.float32))  # widened back: the lower half zero
assert np.array_equal(h.astype(np.uint16), values.astype(mt.bfloat16).view(np.uint16)), "ml_dtypes rounds the same"

# %% [markdown]
# minitensor 在 `minitensor/core/kernels/bfloat16.py` 中正是这样做的，对整个数组只走一遍（numba；
# GPU 上 `cuda/elementwise.cu` 的三个核函数是同样的几行）。代码块中的乘积也这样舍入它的 float32
# 操作数，*结果仍存成 float32 数组*：两个 bfloat16 数的乘积在 float32 中是精确的，所以舍入后操作数的
# float32 矩阵乘积，正是 bfloat16 张量核心算出的结果。
#
# ## 走出单个进程：数据并行与全归约
#
# 到目前为止，一切都在一个进程里运行。`minitensor train --workers 2` 让多个进程同时训练同一个
# 模型：这就是数据并行（data parallelism）。在 D2L 列举的几种把训练拆分到多个设备上的方法中，
# 它最简单（12.5 多GPU训练 / 13.5 "Training on Multiple GPUs"），也是各个框架替用户封装好的
# 那一种（12.6 多GPU的简洁实现 / 13.6 "Concise Implementation for Multiple GPUs"）。
# 每个进程有一个*进程号*（rank，从 0 到 R − 1），持有模型的一份完整拷贝，即*模型副本*
# （replica）。每一步：
#
# 1. R 个进程抽取同一个全局小批量，也就是单个进程会抽到的那一个，每个进程取走其中属于
#    自己的那些行，即它的*分片*（shard）；
# 2. 每个进程只在自己的分片上执行前向传播和反向传播；
# 3. 各进程对梯度做**全归约**（all-reduce）：每个进程放入一个向量，每个进程都拿回所有
#    向量之和（即 D2L 中的 `allreduce` 函数）；
# 4. 于是每个进程都持有相同的梯度，执行相同的优化器更新；各副本在开始时相同，因为进程 0
#    的参数被*广播*（broadcast）给了其他进程，此后也一直相同。
#
# 该求哪一种和？损失是小批量中有效目标词元上的平均值，而各个分片含有的有效词元数各不相同：
# 每一行带有的填充多少不一。设进程 $r$ 上有 $n_r$ 个有效词元，$N = \sum_r n_r$，$L_r$ 是
# 进程 $r$ 的分片上的平均损失，$g_r$ 是它的梯度，则
#
# $$L = \frac1N \sum_{\text{valid } t} \ell_t = \sum_r \frac{n_r}{N}\,L_r
#   \qquad\Longrightarrow\qquad g = \nabla L = \sum_r \frac{n_r}{N}\, g_r :$$
#
# 每个进程把自己的梯度乘以 $n_r$，一次全归约把这些缩放后的梯度加起来，每个进程再除以 $N$
# （$N$ 本身就是各个 $n_r$ 的全归约）。
#
# 下面在本进程内追踪一步：R = 3 个进程，一个 float64 的小型 Transformer，任务是反转序列
# （长 1 到 10 个字母，因此各行带有的填充多少不一），一个 10 行的全局小批量，用
# `shard_bounds` 切分，切法与 `Batches(shard=(rank, size))` 完全相同。真正训练时，每个进程
# 都用同一个随机种子构建模型；这里三个副本是依次抽取的，所以在广播让它们合而为一之前，
# 它们各不相同。

# %%
import threading

from minitensor.data import build_vocabs, reverse_task, seq2seq_arrays
from minitensor.data.batching import shard_bounds
from minitensor.train.distributed import allreduce_gradients, broadcast_parameters, buckets, rank_seed, world

R, B = 3, 10  # 进程数；全局小批量的行数
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


mt.manual_seed(0)  # 追踪的数值不取决于上面各单元抽取过的随机数
replicas = [make_replica() for _ in range(R)]
print(
    "largest |replica r - replica 0| before the broadcast:",
    [f"{np.abs(flat(m) - flat(replicas[0])).max():.3f}" for m in replicas],
)

# %% [markdown]
# 为了在没有 MPI 的情况下运行库自己的集合通信代码，我们需要一个替身来代替它的 `World`
# （`minitensor/train/distributed.py`）：用 R 个线程扮演 R 个进程，每个线程持有自己的副本，
# 并用一道屏障（barrier）代替网络。`sum`、`allreduce_` 和 `broadcast_` 所做的，正是 `World`
# 用 `MPI_Allreduce` 和 `MPI_Bcast` 所做的事：每个进程放入自己的缓冲区，等到所有进程都放入
# 之后，取走它们的和（或者进程 0 的缓冲区）。


# %%
class ThreadWorld:
    """Rank ``rank`` of ``size`` ranks that are threads of this process: MPI's collectives, with
    a barrier where MPI would use the network."""

    def __init__(self, rank, size, slots, barrier):
        self.rank, self.size, self.slots, self.barrier = rank, size, slots, barrier
        self.allreduces = 0  # 本进程全归约过的缓冲区个数

    def _exchange(self, buffer):
        """Every rank's buffer, in rank order."""
        self.slots[self.rank] = np.array(buffer)  # 一份拷贝：本进程发送的内容
        self.barrier.wait()  # 每个进程都已发送
        everyone = list(self.slots)
        self.barrier.wait()  # 每个进程都已接收：这些槽位可以再次使用
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
        except BaseException as e:  # 不让任何进程一直等在屏障处
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
one_process = make_replica()  # 单个进程的模型，用于比较：权重相同
one_process.load_state_dict(replicas[0].state_dict())
print("after the broadcast: the replicas are identical")

# %% [markdown]
# 现在执行这一步。每个进程在自己的分片上执行前向传播和反向传播；单个进程则在全部 10 行上
# 做同样的事。追踪结果打印出每个进程的行、有效词元数 $n_r$、平均损失 $L_r$ 以及梯度 $g_r$
# 的范数。


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

weighted = [sum(n * g[i] for n, g in zip(counts, local)) / N for i in range(len(full))]  # 逐个参数
plain = [sum(g[i] for g in local) / R for i in range(len(full))]
terms = " + ".join(f"{n} g_{r}" for r, n in enumerate(counts))
print(f"all-reduce: g = ({terms}) / {N};  |g| = {norm(weighted):.5f}")
error_weighted, error_plain = largest_difference(weighted, full), largest_difference(plain, full)
print(f"largest |g - one process's gradient|: {error_weighted:.1e}")
print(f"the same for the plain average (1/R) sum_r g_r: {error_plain:.1e}")
assert error_weighted < 1e-12, "the token-weighted sum is the gradient of the global loss"
assert error_plain > 1e-4, "the plain average weighs a token of a short shard more: another gradient"

# %% [markdown]
# 库用 MPI 计算的正是同一个和。每个进程完成反向传播之后，训练循环（`minitensor/train/loop.py`
# 中的 `_distributed_backward`）调用 `allreduce_gradients(model.parameters(), n_r, world)`：
# 先用一次很小的全归约求出 $N$，以及哪些参数在某个进程上有梯度；然后梯度打包成*桶*来传输
# （梯度分桶，bucket）：相邻的参数被复制进一块连续的主机缓冲区，乘以 $n_r$，用一次
# `MPI_Allreduce` 做全归约，除以 $N$，再复制回去。每个进程最终得到的数完全相同，而且逐位
# 相同，因为每个进程都按同样的顺序把同样的缓冲区相加。

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
# 为什么要分桶？一条消息的代价是一个固定的延迟，加上它的大小除以带宽；而 Transformer 有许多
# 小张量（偏置、层规范化的参数）：每个张量发一条消息，时间大多会花在延迟上。大小不超过
# `BUCKET_BYTES` = 4 MiB 的桶则把它们合成少数几条大消息。PyTorch 的 `DistributedDataParallel`
# 使用 25 MiB 的桶（Li et al. 2020, "PyTorch Distributed: Experiences on Accelerating Data
# Parallel Training", arXiv:2006.15704），Horovod 称之为张量融合（tensor fusion；Sergeev and
# Del Balso 2018, "Horovod: fast and easy distributed deep learning in TensorFlow",
# arXiv:1802.05799）。大消息随后由带宽最优的算法做全归约，例如环形算法（环同步，
# D2L 12.7 参数服务器 / 13.7 "Parameter Servers"；Patarasuk and Yuan 2009, "Bandwidth optimal
# all-reduce algorithms for clusters of workstations"）：每个进程发送和接收的数据量约为缓冲区
# 的 $2(R-1)/R$ 倍，几乎与 $R$ 无关。算法由 MPI 选择，桶由库来划分。
#
# 我们的小模型放得进一个 4 MiB 的桶：每步一次 Allreduce。换成 16 KiB 的桶就需要四个，而数值
# 不变，因为分桶只决定哪些加法一起传输：

# %%
names = {id(p): name for name, p in replicas[0].named_parameters()}
groups = buckets(list(replicas[0].parameters()), bucket_bytes=16 << 10)
for i, group in enumerate(groups):
    size, first, last = sum(p.data.nbytes for p in group), names[id(group[0])], names[id(group[-1])]
    print(f"bucket {i}: {len(group):2} parameters, {size / 1024:4.1f} KiB  ({first} ... {last})")
assert len(buckets(list(replicas[0].parameters()))) == 1, "one 4 MiB bucket holds this whole model"
assert [p for group in groups for p in group] == list(replicas[0].parameters()), "consecutive parameters, in order"

for model, grads in zip(replicas, local):  # 恢复每个进程自己的梯度，再全归约一次
    for p, g in zip(model.parameters(), grads):
        p.grad = mt.tensor(g)
_, worlds = on_every_rank(
    lambda world: allreduce_gradients(replicas[world.rank].parameters(), counts[world.rank], world, 16 << 10)
)
assert [w.allreduces for w in worlds] == [len(groups)] * R, "one Allreduce per bucket"
assert all(np.array_equal(p.grad.numpy(), g) for p, g in zip(replicas[0].parameters(), reduced[0])), "the same bits"
print(f"{len(groups)} buckets: {len(groups)} Allreduce calls, the same gradient to the last bit")

# %% [markdown]
# 全归约之后，每个进程裁剪梯度范数（`--clip-grad-norm`，默认为 1.0），再让优化器更新一步。
# 顺序很重要：裁剪在全归约*之后*进行，作用于全局梯度，与单个进程中一样。在较少词元上求得
# 的平均值噪声更大：这里有的分片的梯度长度超过 1.0，而全局梯度没有，所以先裁剪它们会缩短
# 一个单个进程根本不会去动的梯度。然后 Adam 在每个进程上执行相同的一步：各副本保持相同，
# 逐位相同，并且在舍入误差范围内等于单个进程的模型。

# %%
assert max(norm(g) for g in local) > 1.0 > norm(full), "a shard's gradient is longer than 1.0, g is not"
clipped_first = [sum(n * g[i] * min(1.0, 1.0 / norm(g)) for n, g in zip(counts, local)) / N for i in range(len(full))]
change = largest_difference(clipped_first, full)
print(f"|g_r| = {', '.join(f'{norm(g):.3f}' for g in local)}; |g| = {norm(full):.3f}")
print(f"clipping each g_r to 1.0 before the all-reduce would change g by up to {change:.1e}")
assert change > 1e-3, "clipping first is another gradient"

for model in replicas + [one_process]:
    mt.optim.clip_grad_norm_(model.parameters(), 1.0)  # 作用于全局梯度：每个进程上都相同
    mt.optim.Adam(model.parameters(), lr=1e-2).step()
assert all(np.array_equal(flat(m), flat(replicas[0])) for m in replicas), "identical steps keep the replicas identical"
difference = np.abs(flat(replicas[0]) - flat(one_process)).max()
print(f"after the step: the replicas are identical; largest |replica - one process| = {difference:.1e}")
assert difference < 1e-12, "N processes train the model of one, up to rounding"

# %% [markdown]
# 训练循环的其余部分留给进程 0：只有它打印输出、绘制进度条、在留出集上评估并写入检查点
# （`World.is_main`），其他进程则默默训练，在下一次全归约时与它会合。有一样东西必须因进程
# 而异：暂退法（dropout）的随机掩码。每个分片都应当得到自己的掩码，就像单个进程中每一行都有
# 自己的掩码一样；而一次运行又必须可复现。因此进程 0 沿用这次运行自己的随机数流，进程
# $r > 0$ 则在训练开始（或在第 `step` 步恢复）时用 `rank_seed(seed, r, step)` 重新设置种子：
# 每个进程一条不同的随机数流，相同的 (seed, rank, step) 给出同一条流。作为普通脚本运行时，
# 本进程就是只有一个成员的 world，`train` 的行为与以前完全相同。

# %%
seeds = [rank_seed(0, r, 0) for r in range(1, 4)]
print("dropout seeds of ranks 1, 2, 3 (seed 0, step 0):", seeds)
assert len(set(seeds)) == 3 and seeds == [rank_seed(0, r, 0) for r in range(1, 4)], "different, and reproducible"
assert rank_seed(0, 1, 100) != seeds[0], "resumed at step 100, rank 1 does not draw its first masks again"
here = world()
assert here.size == 1 and here.rank == 0 and here.is_main, "not started by mpiexec: a world of one"
print(f"this process: rank {here.rank} of {here.size}")

# %% [markdown]
# ### 运行它
#
# 数据并行需要 `dist` 这个额外依赖，即 mpi4py 和 MPICH 的 wheel（它带来 `mpiexec`）：
#
# ```bash
# pip install -e ".[dist]"
# minitensor train --workers 2                   # 自己启动 mpiexec -n 2，在本机上运行
# mpiexec -n 2 minitensor train --epochs 8       # 效果相同，手动启动（多台主机：见 docs/guide.md）
# ```
#
# 哪些是精确的：全局小批量、学习率及其调度都与单个进程相同，因此 N 个进程训练出的模型与
# 一个进程训练出的相同，只差浮点舍入（求和的顺序不同）；检查点可以用任意数量的进程恢复
# （`--resume --workers 4`）。在 `--device cuda` 上，每个进程使用自己的 GPU，桶经由主机内存
# 传输（NCCL 直接在 GPU 上做全归约，可以省去这些拷贝）。N 个进程能让训练快多少，取决于机器
# 和模型：分片变小了，全归约却没有变小；`python bench/data_parallel.py` 会测量它。
#
# ## 练习
#
# 1. 把 `Sigmoid` 和 `LogCosh` 写成 `mt.Function`（其中 $\frac{d}{dx}\log\cosh x = \tanh x$），
#    并用 `mt.gradcheck` 检查它们。然后用不同的方式弄坏每个 `backward`
#    （符号写反、漏掉因子 2、在原地修改某个输入*之后*才保存它），读一读 gradcheck 给出的信息。
# 2. 为从零实现的 `Value` 添加 `__pow__`、`exp` 和除法，并用它训练一个单神经元的回归模型。
#    然后把 `graph()` 改成递归实现，找出 `Value` 链长到多深时会出错。
# 3. 下面哪些会让接下来的 `outputs[t] = y` 复制：`row = outputs[0]`、`host = outputs.numpy()`、
#    `doubled = outputs * 2`、`squared = outputs * outputs`？先预测，再用 `fill` 中那样的弱引用检验。
#    为什么 `x[0] = x[1]` 会复制，尽管 `x[1]` 只是被读取？
# 4. 用 numba 为形状为 (rows, n) 的评分和 `valid_lens` 编写一个融合的*掩蔽* softmax
#    （每次 `prange` 迭代处理一行，有效长度之外为零，没有有效元素的行全为零），
#    把它与 `reference.softmax_forward(np, x, lens)` 和 `cpu.softmax_forward(x, lens)` 相比较，
#    并对三者计时。
# 5. 用 `R = 12` 个进程对这 10 行运行追踪：有两个分片是空的。`allreduce_gradients` 为它们
#    加上了什么？每个进程是否仍然持有单个进程的梯度？然后用 `dropout=0.1` 构建副本 1：
#    为什么更新之后各副本仍然相同，尽管梯度已经不再等于单个进程的梯度？
# 6. 手动训练混合精度一节中的 `Linear`：一次让权重保持 float32 并使用 `mt.autocast`，
#    一次让权重本身是 bfloat16（`layer.weight.data = layer.weight.data.astype(mt.bfloat16)`，
#    优化器的更新写成 `w -= lr * g`）。学习率为 1e-3 时，bfloat16 的权重在多少步之后不再变化？
#
# ## 这些内容在引擎中的位置
#
# * `minitensor/core/tensor.py` —— `Tensor`：`data`、`grad`、`requires_grad`、`grad_fn`（`_ctx`）、
#   创建编号 `_seq`，以及类体中的每个运算符：`x * w` 就是 `Tensor.__mul__`，一行调用 `Mul.apply` 的代码；
# * `minitensor/core/autograd.py` —— `Function`（`apply`、`save_for_backward`、`needs_input_grad`、
#   `differentiable`）、`backward`（堆）、`GradAt`（只在一个切片上非零的梯度，如 `x[t]` 的：加进同一个数组的
#   那个切片里，所以对 x 的各行循环的开销是线性的）、`sum_to_shape`（撤销广播）、`_accumulate`
#   （叶子节点如何像 PyTorch 那样，不加复制地接收一个别处都不持有的梯度）、`sole_holder`
#   （同样靠引用计数判断，让 `outputs[t] = y` 原地写入）；
#   `minitensor/core/tracing.py` —— 追踪器安装的唯一钩子；
# * `minitensor/core/ops/elementwise.py` —— 最简单的运算，每个运算的前向都紧挨着它的反向；
#   `minitensor/core/ops/compare.py` —— 比较运算，在计算图之外；
#   `minitensor/core/ops/softmax.py` —— 建立在这些计算内核之上的 softmax Function；
# * `minitensor/core/gradcheck.py` —— `mt.gradcheck`；
# * `minitensor/core/kernels/cpu.py`（融合的 numba 计算内核）和 `minitensor/core/kernels/reference.py`
#   （用普通 NumPy 写的同样计算：测试的参照，也是基准测试的基线）；
#   `minitensor/core/kernels/fused.py` 以同样的方式融合了一个训练步骤中其余的逐元素运算
#   （暂退法、ReLU、层规范化、Adam 的更新），每一个都与其运算的 NumPy 代码对照测试；
# * `bench/softmax.py` —— 正式的基准测试；
# * `minitensor/core/amp.py` —— `mt.autocast`：代码块的状态，以及各运算调用的两行代码，
#   `amp.product_dtype`（乘积）和 `amp.in_float32`（softmax、规范化、求和、损失）；
#   `minitensor/core/dtypes.py` —— `mt.bfloat16` 和 `is_floating`（bfloat16 在 NumPy 中的 kind 是 "V"）；
# * `minitensor/train/distributed.py` —— 数据并行：`World`（MPI 的 `COMM_WORLD`，或者只有
#   本进程）、`broadcast_parameters`、`buckets`、`allreduce_gradients`、`rank_seed`；它的
#   文档字符串就是本节理论的简述。`minitensor/data/batching.py` 中的 `shard_bounds` 和
#   `Batches(shard=)` 切分全局小批量；`minitensor/train/loop.py` 中的 `_distributed_backward`
#   是一步训练；`minitensor/cli.py` 中的 `--workers` 启动 `mpiexec`；
#   `bench/data_parallel.py` 测量加速比。
