# %% [markdown]
# # 6. 自注意力和位置编码
#
# 到目前为止，查询、键和值都是给定的。在**自注意力**（self-attention）中，它们都是同一个
# 序列：每个词元都向自己所在序列中的每个词元发出查询。这一个想法就把注意力变成了一种把序列
# 映射为序列的层，与卷积或 RNN 一样；我们用 minitensor 的 `Conv1d`、`GRU` 和
# `MultiHeadAttention` 来度量它与二者相比如何（时间、并行度、路径长度）。结果会发现自注意力
# 看不到顺序，而这正是**位置编码**（positional encoding）所要弥补的：Transformer 的正弦位置
# 编码、它像二进制计数器的样子、让相对位置成为线性关系的旋转，以及一种现代变体：旋转位置编码。
#
# 参考资料：D2L 的注意力机制一章，中文版《动手学深度学习》（zh.d2l.ai）的
# 10.6 自注意力和位置编码（编码器－解码器注意力见 10.7 Transformer），英文版
# *Dive into Deep Learning*（d2l.ai）的 11.6 "Self-Attention and Positional Encoding"（以及
# 11.7 "The Transformer Architecture"）；正弦位置编码出自 Vaswani 等人（2017）的论文
# “Attention Is All You Need”；旋转位置编码出自 Su 等人（2021）的论文“RoFormer: Enhanced
# Transformer with Rotary Position Embedding”。

# %%
import contextlib
import math
import time

import numba
import numpy
from _tutorial import SMOKE, expect_error, figure_path, pick, text  # noqa: F401  （各篇教程共用的辅助函数；text()：按教程的语言给出图标签）
from matplotlib.figure import Figure

import minitensor as mt

TUTORIAL = "06_self_attention_and_positional_encoding"
mt.manual_seed(0)

# %% [markdown]
# ## 自注意力
#
# 在注意力机制的框架中，查询、键和值可以代表模型中的不同部分。三者都是同一个 $\mathbf{x}$
# 的特殊情况就是自注意力，用 D2L 的话说：“由于查询、键和值来自同一组输入，因此被称为
# *自注意力*”。给定序列 $\mathbf{x}_1, \dots, \mathbf{x}_n$，$\mathbf{x}_i \in \mathbb{R}^d$，
# 每个词元都作为查询，而所有词元都作为键值对：
#
# $$\mathbf{y}_i = f(\mathbf{x}_i, (\mathbf{x}_1, \mathbf{x}_1), \dots, (\mathbf{x}_n, \mathbf{x}_n)) \in \mathbb{R}^d .$$
#
# 它由序列自身完成编码（D2L：使用自注意力进行序列编码），不需要其他查询、键或值参与：输入
# 一个序列，输出一个同样长度的序列，并且只用到序列*内部*的信息。写成批量的形式，
# 用缩放点积注意力汇聚，并让 $\mathbf{X} \in \mathbb{R}^{n \times d}$ 的每一行是一个词元，则有
#
# $$f(\mathbf{X}) = \operatorname{softmax}\left(\frac{\mathbf{X}\mathbf{X}^\top}{\sqrt{d}}\right)\mathbf{X}.$$
#
# 这就是把同一个张量传三次给 `mt.nn.Attention`（单头，`scaled_dot` 评分函数，`softmax`
# 汇聚）：

# %%
n, d = 6, 8
X = mt.randn(1, n, d)
plain = mt.nn.Attention("scaled_dot", "softmax", 0.0)
Y = plain(X, X, X)
x = X.numpy()[0]
scores = x @ x.T / math.sqrt(d)
weights = numpy.exp(scores - scores.max(axis=1, keepdims=True))
weights /= weights.sum(axis=1, keepdims=True)
print("self-attention:", X.shape, "->", Y.shape)
assert Y.shape == X.shape, "a sequence in, a sequence of the same shape out"
assert numpy.abs(Y.numpy()[0] - weights @ x).max() < 1e-5, "Attention(X, X, X) = softmax(X X^T / sqrt(d)) X"

# %% [markdown]
# 在实践中（如 Transformer），词元会先经过可学习的线性映射，每个角色各用一个：
#
# $$f(\mathbf{X}) = \operatorname{softmax}\left(\frac{\mathbf{X}\mathbf{W}_Q (\mathbf{X}\mathbf{W}_K)^\top}{\sqrt{d}}\right)\mathbf{X}\mathbf{W}_V .$$
#
# `mt.nn.MultiHeadAttention(X, X, X)` 正是带 $h$ 个头的这个公式，后面再接 $\mathbf{W}_o$
# （见教程 5）。用单头和这个层自己的权重来验证（权重按 (out, in) 存放，所以
# $\mathbf{X}\mathbf{W}_Q$ 就是 `X @ W_q.weight.T`）：

# %%
mha = mt.nn.MultiHeadAttention(d, num_heads=1, dropout=0.0)
W_Q, W_K, W_V, W_O = (layer.weight.numpy().T for layer in (mha.W_q, mha.W_k, mha.W_v, mha.W_o))
Q, K, V = x @ W_Q, x @ W_K, x @ W_V
scores = Q @ K.T / math.sqrt(d)
weights = numpy.exp(scores - scores.max(axis=1, keepdims=True))
weights /= weights.sum(axis=1, keepdims=True)
gap = numpy.abs(mha(X, X, X).numpy()[0] - weights @ V @ W_O).max()
print(f"|MultiHeadAttention(X, X, X) - softmax(X W_Q (X W_K)^T / sqrt(d)) X W_V W_O| = {gap:.1e}")
assert gap < 1e-5

# 一个常见的笔误是只把转置放在 X 上，写成 X W_Q X^T W_K：当 n != d 时，形状根本对不上。
with expect_error("the scores written as X W_Q X^T W_K, with n = 6 tokens of d = 8", ValueError):
    x @ W_Q @ x.T @ W_K  # (n, d) (d, d) (d, n) = (n, n)，接着是 (n, n) @ (d, d)

# %% [markdown]
# > **常见笔误：转置放在哪里**
# >
# > 带可学习参数的自注意力很容易被错写成
# > $\operatorname{softmax}(\mathbf{X}\mathbf{W}_Q\mathbf{X}^\top\mathbf{W}_K / \sqrt{d})\,\mathbf{X}\mathbf{W}_V$。
# > 转置应当作用于投影之后的键，$(\mathbf{X}\mathbf{W}_K)^\top = \mathbf{W}_K^\top \mathbf{X}^\top$：
# > minitensor 实现的是 $\operatorname{softmax}(\mathbf{X}\mathbf{W}_Q(\mathbf{X}\mathbf{W}_K)^\top / \sqrt{d})\,\mathbf{X}\mathbf{W}_V$
# > （之后再乘 $\mathbf{W}_o$），即 Transformer 的公式，上面已验证到 1e-5 以内；错写的形式是把
# > 一个 $n \times n$ 矩阵乘以一个 $d \times d$ 矩阵，除非 $n = d$ 否则会出错，而即使
# > $n = d$，它也是另一个函数。

# %% [markdown]
# ## 自注意力不知道顺序
#
# $f(\mathbf{X})$ 中没有任何东西涉及位置：权重只取决于词元的内容。把词元的顺序打乱，输出也会
# 按同样的方式被打乱：自注意力是*置换等变*（permutation-equivariant）的。一行就能证明：对置换
# 矩阵 $\boldsymbol{\Pi}$，评分 $\mathbf{S} = \mathbf{X}\mathbf{W}_Q(\mathbf{X}\mathbf{W}_K)^\top / \sqrt{d}$
# 变为 $\boldsymbol{\Pi}\mathbf{S}\boldsymbol{\Pi}^\top$，按行的 softmax 与行、列的置换可以交换
# 次序，并且 $\boldsymbol{\Pi}^\top\boldsymbol{\Pi} = \mathbf{I}$，所以
#
# $$f(\boldsymbol{\Pi}\mathbf{X}) = \boldsymbol{\Pi}\operatorname{softmax}(\mathbf{S})\boldsymbol{\Pi}^\top\boldsymbol{\Pi}\mathbf{X}\mathbf{W}_V = \boldsymbol{\Pi} f(\mathbf{X})$$
#
# （逐行作用的 $\mathbf{W}_o$ 也不改变这一点）。一个词元的输出取决于序列中有哪些词元，而与它们
# 所在的位置无关：“狗咬人”和“人咬狗”中，“狗”得到的输出完全相同。下面的代码在上面那个层上
# 验证这一点：

# %%
permutation = numpy.random.default_rng(0).permutation(n)
with mt.no_grad():
    Y = mha(X, X, X).numpy()[0]
    X_perm = mt.tensor(x[permutation][None])
    Y_perm = mha(X_perm, X_perm, X_perm).numpy()[0]
print("permutation", permutation)
assert numpy.abs(Y_perm - Y[permutation]).max() < 1e-5, "permuting the inputs permutes the outputs"

# %% [markdown]
# ## 编码器－解码器注意力（交叉注意力）
#
# 在**编码器－解码器注意力**（encoder-decoder attention，D2L 10.7）中，查询来自一个输入，
# 键和值来自另一个输入，这种注意力通常称为**交叉注意力**（cross-attention）。用 D2L 的话说：
# “查询来自前一个解码器层的输出，而键和值来自整个编码器的输出”。解码器的状态发问，编码器的
# 输出作答，于是解码器把源序列的上下文与它自己的上下文结合起来。两个序列的长度和宽度都可以
# 不同（`key_size`、`value_size`）；注意力权重的形状是
# （批量大小，头数，查询的个数，键的个数）。

# %%
decoder_states = mt.randn(2, 3, 16)  # 3 个目标位置，宽度 16
encoder_outputs = mt.randn(2, 7, 24)  # 7 个源位置，宽度 24
cross = mt.nn.MultiHeadAttention(16, num_heads=4, key_size=24, value_size=24)
out = cross(decoder_states, encoder_outputs, encoder_outputs, valid_lens=mt.tensor([7, 5]))
print("cross-attention:", out.shape, "weights", cross.attention_weights.shape)
assert out.shape == (2, 3, 16) and cross.attention_weights.shape == (2, 4, 3, 7)
assert (cross.attention_weights.numpy()[1, :, :, 5:] == 0).all(), "padding of the source gets no weight"

# %% [markdown]
# ## CNN、RNN 和自注意力
#
# 三者都把 $n$ 个词元的序列映射为 $n$ 个词元的序列，输入和输出都是 $d$ 个通道。它们在三个方面
# 有所不同（D2L 10.6，比较卷积神经网络、循环神经网络和自注意力 / 11.6.2 "Comparing CNNs,
# RNNs, and Self-Attention"）：**计算复杂度**（computational complexity）；**顺序操作**
# （sequential operations），它会妨碍并行计算；以及**最大路径长度**（maximum path length）。
# 对每一对位置，取网络中连接二者的*最短*路径的长度（信号从一个位置到达另一个位置至少要穿过
# 多少层或多少个循环步）；最大路径长度就是所有位置对中这一长度的最大值。路径越短，就越容易
# 学习序列中的远距离依赖关系。
#
# | 层 | 计算复杂度 | 顺序操作（并行度） | 最大路径长度 |
# |---|---|---|---|
# | CNN，卷积核大小 $k$ | $O(knd^2)$ | $O(1)$（并行度 $O(n)$） | $O(n/k)$ |
# | RNN | $O(nd^2)$ | $O(n)$（并行度 $O(1)$） | $O(n)$ |
# | 自注意力 | $O(n^2d)$ | $O(1)$（并行度 $O(n)$） | $O(1)$ |
#
# - **CNN**：$n$ 个输出位置中的每一个，都要把一个 $k$ 个位置 $\times$ $d$ 个输入通道的窗口
#   乘以一个 $(k d) \times d$ 的权重（$d$ 个输出通道），共 $O(knd^2)$；所有输出都可以独立
#   计算；两个相距很远的词元要经过足够多的堆叠层才能相遇，每一层把感受野扩大约 $k$。
# - **RNN**：更新隐状态要把 $d \times d$ 矩阵与 $d$ 维向量相乘，共 $n$ 次，即
#   $O(nd^2)$；第 $t$ 步需要第 $t - 1$ 步的结果，所以沿着序列方向没有任何部分可以并行；
#   词元 1 要经过 $n - 1$ 次隐状态更新才能到达词元 $n$。
# - **自注意力**：查询、键和值都是 $n \times d$ 矩阵；每个词元都要与每个词元计算评分，每次
#   代价为 $d$，共 $O(n^2 d)$；所有输出彼此独立；每个词元在一层之内就能看到所有其他词元。
#
# （若改为计算*并行度*，这一列就倒过来：$O(1)$ 的顺序操作意味着有 $O(n)$ 的工作可以同时
# 进行，反之亦然。D2L：顺序操作会妨碍并行计算。）与其相信，不如实测。首先是前向传播时间随
# $n$ 的变化，通道数 $d = 32$：`mt.nn.Conv1d`（卷积核大小 3）、`mt.nn.GRU`（一种门控
# RNN）和单头自注意力，每个都在单个 CPU 线程上运行几次，取最快的一次。

# %%
d, batch = 32, 4
lengths = pick([16, 32, 64, 128, 256, 512, 1024], [16, 64, 256])
repeats = pick(7, 3)
conv = mt.nn.Conv1d(d, d, kernel_size=3, padding=1)
gru = mt.nn.GRU(d, d, batch_first=True)
self_attention = mt.nn.MultiHeadAttention(d, num_heads=1)
layers = {
    "CNN (Conv1d, k=3)": lambda X: conv(X.swapaxes(1, 2)).swapaxes(1, 2),  # Conv1d 要求 (batch, d, n)
    "RNN (GRU)": lambda X: gru(X)[0],
    "self-attention": lambda X: self_attention(X, X, X),
}


def best_time(fn, X, repeats):
    fn(X)  # 预热：第一次调用可能要加载编译好的 numba 计算内核
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn(X)
        best = min(best, time.perf_counter() - start)
    return best


@contextlib.contextmanager
def one_thread():
    """Time on one core: the table counts operations and their order, not how well a library
    spreads one operation over cores (and a busy machine makes threaded timings erratic).
    BLAS threads are limited with threadpoolctl when it is installed, numba's directly."""
    try:
        from threadpoolctl import threadpool_limits

        blas = threadpool_limits(limits=1)
    except ImportError:
        blas = contextlib.nullcontext()
    before = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        with blas:
            yield
    finally:
        numba.set_num_threads(before)


times = {name: [] for name in layers}
with mt.no_grad(), one_thread():
    for length in lengths:
        X = mt.randn(batch, length, d)
        for name, fn in layers.items():
            times[name].append(best_time(fn, X, repeats))
print("n      " + "".join(f"{name:>22}" for name in layers))
for i, length in enumerate(lengths):
    print(f"{length:<7}" + "".join(f"{times[name][i] * 1e3:19.2f} ms" for name in layers))
for name in layers:  # 在最长的几个序列上，log(时间) 对 log(n) 的斜率
    slope = numpy.polyfit(numpy.log(lengths[-3:]), numpy.log(times[name][-3:]), 1)[0]
    print(f"{name}: time ~ n^{slope:.2f} at the largest n")

# %% [markdown]
# 即使只用一个线程，“顺序操作”这一列也显现出来了：GRU 要一个接一个地走 $n$ 个相互依赖的
# 小步（一个沿时间的循环，每步只有几个小的数组运算），而卷积和注意力是在所有位置上同时进行的
# 几个大的数组运算，更多的 CPU 核心或 GPU 可以把它们分摊开。卷积的时间随 $n$ 线性增长；一旦 $n$
# 明显大于 $d$，注意力的 $n^2 d$ 就占了上风。（这些计时是在共享的机器上测得的：本教程只打印
# 它们，不对它们做任何断言。）
#
# 现在来看序列两端之间的**路径长度**，即词元 0 与输出 $n - 1$ 这一相距最远的位置对。它数的
# 是什么，取决于架构：对 CNN 和自注意力，数的是*层数*，它们靠堆叠层来连接各个位置；对 RNN，
# 数的是*时间步数*，它只用一层，靠循环把各个位置连接起来（见下一个代码单元）。来自词元 0 的
# 信号要穿过多少层，输出 $n - 1$ 才会依赖于它？我们一层一层地堆叠，并用自动微分来检查：
# $\partial \mathbf{y}_{n-1} / \partial \mathbf{x}_0$ 是否已经不为零？对卷积核大小为 $k$
# 的卷积（用填充保持长度不变），每一层向外多覆盖 $(k - 1)/2$ 个位置，所以需要
# $\lceil (n-1) / ((k-1)/2) \rceil$ 层，即 $O(n/k)$；自注意力只需一层。


# %%
def conv_layer(kernel_size):
    layer = mt.nn.Conv1d(d, d, kernel_size, padding=(kernel_size - 1) // 2)
    return lambda X: layer(X.swapaxes(1, 2)).swapaxes(1, 2).tanh()


def attention_layer():
    layer = mt.nn.MultiHeadAttention(d, num_heads=1)
    return lambda X: layer(X, X, X)


def layers_to_reach(make_layer, n, max_layers):
    """The fewest stacked layers after which output n - 1 depends on input 0 (by gradient)."""
    x = mt.randn(1, n, d, requires_grad=True)
    stack = []
    for num_layers in range(1, max_layers + 1):
        stack.append(make_layer())
        x.grad = None
        y = x
        for layer in stack:
            y = layer(y)
        y[:, n - 1].sum().backward()
        if (x.grad.numpy()[0, 0] != 0).any():
            return num_layers
    return None


mt.manual_seed(1)
path_lengths = pick([8, 16, 32, 64], [8, 16, 32])
reach = {"CNN, k=3": [], "CNN, k=5": [], "self-attention": []}
for length in path_lengths:
    reach["CNN, k=3"].append(layers_to_reach(lambda: conv_layer(3), length, length))
    reach["CNN, k=5"].append(layers_to_reach(lambda: conv_layer(5), length, length))
    reach["self-attention"].append(layers_to_reach(attention_layer, length, 3))
for name, counts in reach.items():
    print(f"{name:15}", dict(zip(path_lengths, counts)))
for length, c3, c5, ca in zip(path_lengths, *reach.values()):
    assert c3 == length - 1, "kernel 3 widens the reach by 1 per layer: n - 1 layers"
    assert c5 == math.ceil((length - 1) / 2), "kernel 5 widens it by 2: ceil((n - 1) / 2) layers"
    assert ca == 1, "one self-attention layer connects every pair of positions"

# %% [markdown]
# RNN 又有所不同：一层 GRU 就已经把词元 0 与之后的每个输出连接起来了，但到达输出 $j$ 的路径
# 要经过 $j$ 个循环步，每一步都让信号再乘上一个雅可比矩阵。下面是 $n = 32$ 时，每种层各用
# 一层之后的梯度 $|\partial \mathbf{y}_j / \partial \mathbf{x}_0|$：

# %%
mt.manual_seed(2)
n_profile = 32
one_layer = {"CNN (Conv1d, k=3)": conv_layer(3), "RNN (GRU)": lambda X: gru(X)[0], "self-attention": attention_layer()}
profile = {}
x0 = mt.randn(1, n_profile, d, requires_grad=True)
for name, layer in one_layer.items():
    row = []
    for j in range(n_profile):
        x0.grad = None
        layer(x0)[:, j].sum().backward()
        row.append(float(numpy.abs(x0.grad.numpy()[0, 0]).sum()))
    profile[name] = numpy.array(row)
gru_factor = math.exp(numpy.polyfit(numpy.arange(1, n_profile), numpy.log(profile["RNN (GRU)"][1:]), 1)[0])
print(
    f"GRU: the gradient shrinks by a factor {gru_factor:.2f} per step; "
    f"|dy_31/dx_0| / |dy_1/dx_0| = {profile['RNN (GRU)'][-1] / profile['RNN (GRU)'][1]:.1e}"
)
print(
    f"self-attention: |dy_j/dx_0| between {profile['self-attention'][1:].min():.2f} and "
    f"{profile['self-attention'][1:].max():.2f} for every j >= 1"
)
assert (profile["CNN (Conv1d, k=3)"][2:] == 0).all() and (profile["CNN (Conv1d, k=3)"][:2] > 0).all()
assert (profile["RNN (GRU)"] > 0).all(), "one GRU layer reaches every later position ..."
assert profile["RNN (GRU)"][-1] < 1e-3 * profile["RNN (GRU)"][1], "... but through a long path that fades"
assert profile["self-attention"][1:].min() > 0.1 * profile["self-attention"][1:].max(), (
    "attention reaches every position directly, about equally"
)

# %%
fig = Figure(figsize=(14, 4), layout="constrained")
ax_time, ax_path, ax_grad = fig.subplots(1, 3)
for name in layers:
    ax_time.plot(lengths, numpy.array(times[name]) * 1e3, "o-", label=text(name))
ax_time.set(
    xscale="log",
    yscale="log",
    xlabel=text("sequence length n"),
    ylabel=text("forward time (ms)"),
    title=text("time vs n (d = {d}, batch {batch}, 1 thread)", d=d, batch=batch),
)
ax_time.legend()
for name, counts in reach.items():
    ax_path.plot(path_lengths, counts, "o-", label=text("{name}: layers", name=text(name)))
ax_path.plot(
    path_lengths, [length - 1 for length in path_lengths], "k--", label=text("RNN, one layer: n - 1 time steps")
)
ax_path.set(
    xlabel=text("sequence length n"),
    ylabel=text("layers (CNN, self-attention) or\ntime steps (RNN) from x_0 to y_(n-1)"),
    title=text("maximum path length"),
)
ax_path.legend()
for name, row in profile.items():
    js = numpy.flatnonzero(row)
    ax_grad.plot(js, row[js], "o-", markersize=3, label=text(name))
ax_grad.set(
    yscale="log",
    xlabel=text("output position j"),
    ylabel="|dy_j / dx_0|",
    title=text("how far one layer carries x_0"),
)
ax_grad.legend()
fig.savefig(figure_path(TUTORIAL, "cnn_rnn_self_attention.png"), dpi=100)

# %% [markdown]
# 小结一下：自注意力把 $\mathbf{x}$ 同时当作查询、键和值来对序列进行编码；它可以完全并行，
# 最大路径长度为 1，但其代价随 $n^2$ 增长，对长序列来说很沉重（D2L：“因为其计算复杂度是关于
# 序列长度的二次方，所以在很长的序列中计算会非常慢”）。
#
# ## 位置编码
#
# 自注意力不记录任何位置，原因在于它是置换等变的（上面已经验证过），而不是因为它的路径长度
# 为 1：路径长度说的是信息在两个位置之间要走多远，而不是它们的顺序能否被看到（本教程最后的
# 旋转位置编码注意力，路径长度同样为 1，却能看到顺序）。为了在不放弃并行计算的前提下引入
# 位置，我们不改动注意力本身，而是把位置*编码*进输入：对 $\mathbf{X} \in \mathbb{R}^{n \times d}$，
# 计算一个同样形状的矩阵 $\mathbf{P} \in \mathbb{R}^{n \times d}$（D2L：位置嵌入矩阵），
# 然后把 $\mathbf{X} + \mathbf{P}$ 输入自注意力。“位置编码可以通过学习得到也可以直接固定
# 得到”；Transformer 的位置编码是固定的，由正弦函数和余弦函数构成：
#
# $$p_{i, 2j} = \sin\left(\frac{i}{10000^{2j/d}}\right), \qquad p_{i, 2j+1} = \cos\left(\frac{i}{10000^{2j/d}}\right).$$
#
# 在 minitensor 中，位置编码是插件（`plugins/minitensor_plugins/positional.py`），和评分
# 函数一样按名字查找：`sinusoidal`、`learned`、`rotary`、`none`。作用于“inputs”（输入）的
# 编码以 $\mathbf{X}$ 为参数调用，返回 $\mathbf{X} + \mathbf{P}$；它的表就是缓冲区 `P`。
# 采用 D2L 的大小：$d = 32$，60 个位置。

# %%
Sinusoidal = mt.plugins.lookup("positional encoding", "sinusoidal")
encoding_dim, num_steps = 32, 60
pos_encoding = Sinusoidal(encoding_dim, max_len=num_steps)
X = mt.randn(1, num_steps, encoding_dim)
P = (pos_encoding(X) - X).numpy()[0]  # 这个层加上的部分
i = numpy.arange(num_steps)[:, None]
omega = 1.0 / 10000 ** (numpy.arange(0, encoding_dim, 2) / encoding_dim)  # 每对列 j 一个频率
assert numpy.abs(P[:, 0::2] - numpy.sin(i * omega)).max() < 1e-5, "even columns: sin(i / 10000^(2j/d))"
assert numpy.abs(P[:, 1::2] - numpy.cos(i * omega)).max() < 1e-5, "odd columns: cos(i / 10000^(2j/d))"
print("P:", P.shape, " frequencies omega_j:", numpy.round(omega[:4], 4), "...", f"{omega[-1]:.2e}")

# %% [markdown]
# ## 绝对位置：像一个二进制计数器
#
# 这种编码既能表示绝对位置，也能表示相对位置。先看**绝对位置信息**，可以类比二进制表示。
# 把 0 到 7 写成二进制：最低位每一步翻转一次，次低位每两步翻转一次，再高一位每四步翻转一次。
# 位置编码用波做同样的事：沿着列往后，频率 $\omega_j = 1/10000^{2j/d}$ 不断下降
# （在编码维度上降低频率），所以前面的列振荡得快，后面的列振荡得慢。由于是连续的（浮点数而
# 不是比特），这种表示还比二进制编码更节省空间。

# %%
for k in range(8):
    print(f"{k} in binary is {k:>03b}")
bits = numpy.array([[(k >> b) & 1 for b in range(3)] for k in range(8)])  # 第 b 列 = 第 b 位，最低位在前
bit_flips = (numpy.diff(bits, axis=0) != 0).sum(axis=0)
sign_changes = (numpy.diff(numpy.sign(P[:, 0::2]), axis=0) != 0).sum(axis=0)  # 每个正弦列一个
print("flips of bits 0, 1, 2 over 0..7:", bit_flips)
print("sign changes of the sine columns over 60 positions:", sign_changes)
assert list(bit_flips) == [7, 3, 1], "higher bits flip less often"
assert (numpy.diff(sign_changes) <= 0).all() and sign_changes[0] > sign_changes[-1], (
    "higher columns oscillate less often, like higher bits"
)
assert (numpy.diff(omega) < 0).all()

# %%
fig = Figure(figsize=(14, 4), layout="constrained")
ax_heat, ax_cols, ax_bits = fig.subplots(1, 3, gridspec_kw={"width_ratios": [1.2, 1.3, 0.5]})
image = ax_heat.imshow(P, cmap="Blues", aspect="auto")
ax_heat.set(xlabel=text("encoding dimension"), ylabel=text("position i"), title=text("P (sinusoidal, d = 32)"))
fig.colorbar(image, ax=ax_heat)
for col in range(6, 10):
    ax_cols.plot(numpy.arange(num_steps), P[:, col], label=text("col {col}", col=col))
ax_cols.set(xlabel=text("position i"), title=text("columns 6 to 9"))
ax_cols.legend()
ax_bits.imshow(bits, cmap="Blues", aspect="auto")
ax_bits.set(
    xlabel=text("bit (lowest first)"),
    ylabel=text("number"),
    title=text("0..7 in binary"),
    xticks=range(3),
    yticks=range(8),
)
fig.savefig(figure_path(TUTORIAL, "positional_encoding.png"), dpi=100)

# %% [markdown]
# ## 相对位置：一个旋转
#
# 再看**相对位置信息**：对任何确定的位置偏移 $\delta$，位置 $i + \delta$ 处的编码是位置 $i$
# 处编码的*线性*函数，并且对每个 $i$ 都相同。取频率为 $\omega_j$ 的一对列 $(2j, 2j+1)$，
# 记 $a = i\omega_j$，$b = \delta\omega_j$。由两角和公式
#
# $$\sin(a + b) = \cos b \sin a + \sin b \cos a, \qquad \cos(a + b) = -\sin b \sin a + \cos b \cos a$$
#
# 写成矩阵形式就是
#
# $$\begin{bmatrix} p_{i+\delta, 2j} \\ p_{i+\delta, 2j+1} \end{bmatrix} =
# \begin{bmatrix} \cos(\delta\omega_j) & \sin(\delta\omega_j) \\ -\sin(\delta\omega_j) & \cos(\delta\omega_j) \end{bmatrix}
# \begin{bmatrix} p_{i, 2j} \\ p_{i, 2j+1} \end{bmatrix} .$$
#
# 这个 $2 \times 2$ 矩阵是旋转角为 $-\delta\omega_j$ 的旋转矩阵；它依赖于 $\delta$ 和 $j$，
# 但不依赖于 $i$。所以一个层只需学会一次“往回看 $\delta$ 个位置”，就对所有位置都适用：
# 由这些旋转构成的 $\mathbf{W}_Q^\top \mathbf{W}_K$ 把键的 $\mathbf{p}_j$ 变成 $\mathbf{p}_{j+\delta}$，
# 评分中的位置项 $\mathbf{p}_i^\top \mathbf{p}_{j+\delta}$ 对每个查询 $i$ 都在 $j = i - \delta$ 处最大
# （在评分中它只是四项之一，还混有内容：教程 9 接着讨论这一点）。我们在
# 插件的表上，对每个 $j$、每个 $i$ 和许多个 $\delta$ 验证这一点：

# %%
worst = 0.0
for j, w in enumerate(omega):
    pair = P[:, 2 * j : 2 * j + 2]  # 各行：(p_{i,2j}, p_{i,2j+1})
    for delta in range(1, pick(num_steps, 20)):
        rotation = numpy.array(
            [[math.cos(delta * w), math.sin(delta * w)], [-math.sin(delta * w), math.cos(delta * w)]]
        )
        predicted = pair[:-delta] @ rotation.T  # 一次算出所有 i 的 rotation @（列向量）
        worst = max(worst, float(numpy.abs(pair[delta:] - predicted).max()))
print(f"max |P[i + delta] - R(delta) P[i]| over all j, i, delta: {worst:.1e}")
assert worst < 1e-5, "the encoding at i + delta is the rotation of the encoding at i"

# %% [markdown]
# ## 旋转位置编码：把相对位置放进评分
#
# 把 $\mathbf{P}$ 加到输入上，只是让相对位置*可以被利用*；注意力评分看到的仍是绝对位置，并且
# 经过 $\mathbf{W}_Q$ 和 $\mathbf{W}_K$ 与内容混在一起。**旋转位置编码**（rotary position
# embedding，RoPE，Su 等人 2021）如今被许多大语言模型采用（LLaMA 即是其一），它不加任何东西，
# 而是用同样的频率去旋转投影之后的查询和键：位置 $m$ 处的查询或键，其第 $(2j, 2j+1)$ 对分量
# 旋转 $m\theta_j$ 角，频率取正弦位置编码的频率 $\theta_j = \omega_j$。旋转不改变长度，并且
# $R(m\theta)^\top R(n\theta) = R((n - m)\theta)$，所以
#
# $$\langle R(m\theta)\mathbf{q}, R(n\theta)\mathbf{k}\rangle = \mathbf{q}^\top R((n - m)\theta)\,\mathbf{k}:$$
#
# 评分只通过 $n - m$ 依赖于位置。在 minitensor 中它是 `rotary` 插件，一种作用于“qk”的编码，
# 由 `MultiHeadAttention(..., positional="rotary")` 在每个头中施加。在每个位置放上同一个
# 查询和同一个键，算出所有评分：用旋转位置编码时，它们构成一个托普利茨矩阵（Toeplitz matrix，
# 每条对角线上为常数，即 $n - m$ 固定）；把正弦位置编码加到输入上时则不然。

# %%
Rotary = mt.plugins.lookup("positional encoding", "rotary")
length, head = 16, 8
rope = Rotary(head, max_len=length)
rng = numpy.random.default_rng(0)
q_vec, k_vec = rng.standard_normal(head), rng.standard_normal(head)
q_all = mt.tensor(numpy.tile(q_vec, (length, 1)), dtype=mt.float32)  # 位置 0..15 上是同一个查询
k_all = mt.tensor(numpy.tile(k_vec, (length, 1)), dtype=mt.float32)
q_rot, k_rot = rope(q_all, k_all)
rotary_scores = q_rot.numpy() @ k_rot.numpy().T  # [m, n] = <R(m theta) q, R(n theta) k>

# 加法的做法：每个位置上都是同一个词元 x，加上 P，再乘 W_Q 和 W_K。
token = rng.standard_normal(head)
P_small = Sinusoidal(head, max_len=length).P.numpy()
W_Q, W_K = rng.standard_normal((head, head)) / math.sqrt(head), rng.standard_normal((head, head)) / math.sqrt(head)
additive_scores = ((token + P_small) @ W_Q) @ ((token + P_small) @ W_K).T


def off_toeplitz(S):
    """How far S is from constant diagonals: max |S[m+1, n+1] - S[m, n]|."""
    return float(numpy.abs(S[1:, 1:] - S[:-1, :-1]).max())


print(f"rotary:     max |S[m+1, n+1] - S[m, n]| = {off_toeplitz(rotary_scores):.1e}")
print(f"sinusoidal: max |S[m+1, n+1] - S[m, n]| = {off_toeplitz(additive_scores):.2f}")
assert off_toeplitz(rotary_scores) < 1e-5, "rotary scores depend only on n - m"
assert off_toeplitz(additive_scores) > 1e-2, "added positions give scores that depend on m and n themselves"
# 旋转只改变方向，从不改变长度：
assert numpy.allclose(numpy.linalg.norm(q_rot.numpy(), axis=1), numpy.linalg.norm(q_vec), atol=1e-5)

# 有了位置信息，自注意力就不再看不到顺序了：
order_aware = mt.nn.MultiHeadAttention(d, num_heads=4, positional="rotary")
X = mt.randn(1, n, d)
with mt.no_grad():
    Y = order_aware(X, X, X).numpy()[0]
    X_perm = mt.tensor(X.numpy()[0][permutation][None])
    Y_perm = order_aware(X_perm, X_perm, X_perm).numpy()[0]
assert numpy.abs(Y_perm - Y[permutation]).max() > 1e-3, "rotary attention depends on the order"

fig = Figure(figsize=(14, 4), layout="constrained")
ax_rot, ax_add, ax_rel = fig.subplots(1, 3)
for ax, S, title in (
    (ax_rot, rotary_scores, text("rotary: constant diagonals")),
    (ax_add, additive_scores, text("sinusoidal added to the inputs")),
):
    fig.colorbar(ax.imshow(S, cmap="viridis"), ax=ax, shrink=0.8)
    ax.set(xlabel=text("key position n"), ylabel=text("query position m"), title=title)
m_idx, n_idx = numpy.indices((length, length))
ax_rel.plot((n_idx - m_idx).ravel(), additive_scores.ravel(), ".", alpha=0.5, label=text("sinusoidal added"))
ax_rel.plot((n_idx - m_idx).ravel(), rotary_scores.ravel(), "o", markersize=3, label=text("rotary"))
ax_rel.set(xlabel=text("relative position n - m"), ylabel=text("score"), title=text("every score against n - m"))
ax_rel.legend()
fig.savefig(figure_path(TUTORIAL, "rotary_scores.png"), dpi=100)

# %% [markdown]
# ## 练习
#
# 1. 用空洞卷积（dilated convolution，`Conv1d(..., dilation=2 ** layer)`，与 WaveNet
#    中一样）重做路径长度的测量。现在 $x_0$ 要经过多少层才能到达 $y_{n-1}$？把它写成 $n$
#    的函数。
# 2. 用数值验证 $\mathbf{p}_i^\top \mathbf{p}_{i+\delta}$（正弦位置编码）只依赖于 $\delta$，
#    并画出它随 $\delta$ 变化的曲线。为什么这并不能让上面加法版本的*评分*只依赖于 $n - m$？
# 3. 把计时扩展到 $n = 4096$ 和 $d = 128$。自注意力的 $n^2 d$ 在哪里超过 GRU 的
#    $n d^2$？这与表格是否一致？
#
# ## 在引擎中的位置
#
# - `minitensor/core/nn/attention.py`：`Attention`、`MultiHeadAttention`（自注意力和交叉注意力，
#   `positional="rotary"` 作用于投影之后的查询和键）。
# - `plugins/minitensor_plugins/positional.py`：`sinusoidal`、`learned`、`rotary`、`none`
#   （公式，以及 `SinusoidalEncoding` 文档字符串中的旋转性质）。
# - `minitensor/core/ops/conv.py`（用 im2col 实现的卷积及其反向传播）和 `minitensor/core/ops/rnn.py`
#   （GRU 的顺序循环及通过时间反向传播），以及建立在它们之上的层 `nn.Conv1d` 和 `nn.GRU`：
#   这次比较的基线。
# - `minitensor/core/autograd.py`：我们测得的每个梯度背后的反向传播。
# - `minitensor/core/plugins.py`：`lookup`，按名字找到一个编码的方式。
