# %% [markdown]
# # 5. 多头注意力
#
# 一个注意力汇聚只计算一种加权平均。在实践中，当给定相同的查询、键和值的集合时，我们希望模型可以基于
# 相同的注意力机制学习到*不同的*行为，然后将不同的行为作为知识组合起来，捕获序列内各种范围的依赖关系
# （例如短距离依赖和长距离依赖）。**多头注意力**（multihead attention）的做法是：用独立学习得到的
# $h$ 组不同的**线性投影**（linear projections）来变换查询、键和值；这 $h$ 组变换后的查询、键和值
# 并行地送到注意力汇聚中；最后把 $h$ 个输出拼接在一起，再做一次变换。每一个注意力汇聚都被称为一个
# **头**（head）。
#
# 在本教程中，我们用 `mt.nn.MultiHeadAttention` 的权重亲手把它搭出来；看各个头如何靠*变形*
# （reshape）而不是循环来并行计算；验证 D2L 的“先拼接，再乘 $W_o$”与头的加权和（权重是矩阵）
# 是同一个线性映射；最后训练一个小模型，它的任务一个头也能学会，但两个头会明显地把工作分开来做。
#
# 参考资料：D2L 的注意力机制一章，中文版《动手学深度学习》（zh.d2l.ai）的
# 10.5 多头注意力，以及英文版 *Dive into Deep Learning*（d2l.ai）的 11.5
# "Multi-Head Attention"；多头注意力出自 Vaswani 等人（2017）的论文“Attention Is All You Need”。

# %%
import math

import numpy
from _tutorial import SMOKE, figure_path, pick, text  # noqa: F401  （各教程共用的辅助工具；text()：按教程的语言给出图中的标签）
from matplotlib.figure import Figure

import minitensor as mt
from minitensor.train.plots import show_heatmaps

TUTORIAL = "05_multi_head_attention"
mt.manual_seed(0)

# %% [markdown]
# ## 模型
#
# 给定查询 $\mathbf{q} \in \mathbb{R}^{d_q}$、键 $\mathbf{k} \in \mathbb{R}^{d_k}$ 和
# 值 $\mathbf{v} \in \mathbb{R}^{d_v}$，头 $i$（$i = 1, \dots, h$）就是把注意力汇聚 $f$
# 作用在它自己的投影上：
#
# $$\mathbf{h}_i = f\left(\mathbf{W}_i^{(q)} \mathbf{q},\; \mathbf{W}_i^{(k)} \mathbf{k},\;
# \mathbf{W}_i^{(v)} \mathbf{v}\right) \in \mathbb{R}^{p_v},$$
#
# 其中可学习的参数包括 $\mathbf{W}_i^{(q)} \in \mathbb{R}^{p_q \times d_q}$、
# $\mathbf{W}_i^{(k)} \in \mathbb{R}^{p_k \times d_k}$ 和 $\mathbf{W}_i^{(v)} \in \mathbb{R}^{p_v \times d_v}$；
# 输出则是对所有头一起再做一次线性变换：
#
# $$\mathbf{W}_o \begin{bmatrix} \mathbf{h}_1 \\ \vdots \\ \mathbf{h}_h \end{bmatrix} \in \mathbb{R}^{p_o},
# \qquad \mathbf{W}_o \in \mathbb{R}^{p_o \times h p_v}.$$
#
# 这些是 D2L 的公式（10.5 / 11.5）：向量是列向量，权重矩阵从左边乘上去，所以每个矩阵的形状都是
# （输出大小）×（输入大小）。Transformer 论文用行向量写同样的映射，即 $\mathbf{Q} W_i^Q$ 和
# $\operatorname{Concat}(\text{head}_1, \dots, \text{head}_h) W^O$，其中
# $W_i^Q \in \mathbb{R}^{d_{\text{model}} \times d_k}$，
# $W^O \in \mathbb{R}^{h d_v \times d_{\text{model}}}$：它们是转置，形状为（输入大小）×（输出大小）。
#
# 注意力汇聚 $f$ 通常选用缩放点积注意力（scaled dot-product attention，D2L 10.3）。
# 对于由查询、键和值组成的整个矩阵，每行一个向量（代码中张量的布局也是如此），列向量的
# $\mathbf{W} \mathbf{x}$ 就变成了行向量的 $\mathbf{x}^\top \mathbf{W}^\top$，于是头 $i$ 计算的是
#
# $$\mathbf{Q}_i = \mathbf{Q} \mathbf{W}_i^{(q)\top},\; \mathbf{K}_i = \mathbf{K} \mathbf{W}_i^{(k)\top},\;
# \mathbf{V}_i = \mathbf{V} \mathbf{W}_i^{(v)\top},
# \qquad \mathbf{h}_i = \operatorname{softmax}\left(\frac{\mathbf{Q}_i \mathbf{K}_i^\top}{\sqrt{d}}\right) \mathbf{V}_i ,$$
#
# 其中 $d$ 是一个头的查询和键的长度，$p_q = p_k$（代码除以的是 $\sqrt{\texttt{num\_hiddens} / h}$），
# 而 $\mathbf{h}_i$ 的每一行是头 $i$ 对一个查询的输出 $\mathbf{h}_i^\top$。
#
# D2L 示例中的大小：$p_o$ = `num_hiddens` = 100，$h$ = 5 个头，因此每个头在
# $p_q = p_k = p_v = p_o / h = 20$ 维中工作；一个小批量有 2 个样本，每个样本有 4 个查询和
# 6 个键值对，其中有效的分别是前 3 个（样本 1）和前 2 个（样本 2）。
# `mt.nn.MultiHeadAttention(num_hiddens, num_heads, dropout, scorer="scaled_dot",
# pooling="softmax", bias=False, query_size=None, key_size=None, value_size=None, ...)`
# 按 D2L 的顺序调用，即 `attention(queries, keys, values, valid_lens)`，并把每个头最近一次的权重保存在
# `attention.attention_weights` 中，形状为 (batch, num_heads, Q, K)。

# %%
num_hiddens, num_heads = 100, 5
batch_size, num_queries, num_kvpairs = 2, 4, 6
attention = mt.nn.MultiHeadAttention(num_hiddens, num_heads, dropout=0.0)
attention.eval()
X = mt.randn(batch_size, num_queries, num_hiddens)  # 查询
Y = mt.randn(batch_size, num_kvpairs, num_hiddens)  # 键 = 值
valid_lens = mt.tensor([3, 2])
output = attention(X, Y, Y, valid_lens)
weights = attention.attention_weights.numpy()
print("output", output.shape, " attention_weights", weights.shape)
assert output.shape == (batch_size, num_queries, num_hiddens)
assert weights.shape == (batch_size, num_heads, num_queries, num_kvpairs)
# 各个头共用 valid_lens：样本 0 的每个头都忽略第 3 个及之后的键，样本 1 的则忽略第 2 个及之后的键
assert (weights[0, :, :, 3:] == 0).all() and (weights[1, :, :, 2:] == 0).all(), "masked keys get weight 0"
assert numpy.allclose(weights.sum(axis=-1), 1.0, atol=1e-6), "each head's rows sum to 1"

# %% [markdown]
# ## 一个矩阵装下 h 个投影
#
# 这个层有四个 `Linear` 层：`W_q`、`W_k`、`W_v` 和 `W_o`。`mt.nn.Linear` 和 PyTorch 的
# `nn.Linear` 一样，把权重存成 (out_features, in_features)，并对行向量 $x$ 计算
# $y = x W^\top + b$（见 `minitensor/core/nn/linear.py`）：存下来的矩阵就是 D2L 的（输出 × 输入）布局，
# 乘积中的转置则是换成行向量的那一步。因此 `W_q.weight` 的形状为
# (num_hiddens, query_size) = (100, 100)（这里是方阵：单看形状分辨不出布局），它把 $h$ 个矩阵
# $\mathbf{W}_i^{(q)} \in \mathbb{R}^{20 \times 100}$ 上下叠在一起。代码中的头从 0 开始编号：
# 第 $20 i, \dots, 20 i + 19$ 行是头 $i$（即公式中的头 $i + 1$）的 $\mathbf{W}^{(q)}$，
# 一行查询经过它的计算是 `queries @ W_q[rows].T`。用整个矩阵做投影，就一次完成了所有头的投影。
# 先来看慢而直白的写法，照公式字面计算：用 Python 循环遍历各个头，每个头使用自己那一片权重。

# %%
d_head = num_hiddens // num_heads
# 每个权重都存成 (out_features, in_features)，即 D2L 的布局；行向量 x 映射为 x @ W.T。
W_q, W_k, W_v, W_o = (layer.weight for layer in (attention.W_q, attention.W_k, attention.W_v, attention.W_o))
print("W_q", W_q.shape, " W_o", W_o.shape, " d_head", d_head)


def one_head(i, queries, keys, values, valid_lens):
    """Head i alone: its slices of W_q, W_k, W_v, then scaled dot-product attention."""
    rows = slice(i * d_head, (i + 1) * d_head)
    Q_i = queries @ W_q[rows].T  # 每行是一个向量：x W_i^T，形状 (batch, Q, d_head)
    K_i = keys @ W_k[rows].T  # (batch, K, d_head)
    V_i = values @ W_v[rows].T
    scores = Q_i @ K_i.swapaxes(-1, -2) / math.sqrt(d_head)  # (batch, Q, K)
    return mt.masked_softmax(scores, valid_lens) @ V_i  # (batch, Q, d_head)


with mt.no_grad():
    heads_loop = [one_head(i, X, Y, Y, valid_lens) for i in range(num_heads)]
print(len(heads_loop), "heads of shape", heads_loop[0].shape)

# %% [markdown]
# ## 通过变形并行计算各个头
#
# 对头做循环，就要一个接一个地计算 $h$ 个小矩阵乘法。D2L 的做法是用完整的 (100, 100) 矩阵只投影一次，
# 再通过*变形*把各个头变成批量中额外的元素；这样一次批量注意力计算就能同时算出所有样本的所有头。
# `transpose_qkv` 把最后一个轴拆成 (num_heads, d_head)，并把头所在的轴移到批量轴旁边；
# `transpose_output` 做相反的操作，把各个头的输出沿最后一个轴并排放在一起：每一行恰好就是拼接的结果，
# 写成行向量为 $[\mathbf{h}_1^\top, \dots, \mathbf{h}_h^\top]$（即 D2L 中上下叠起的列向量的转置）。


# %%
def transpose_qkv(X, num_heads):
    """(batch, T, num_hiddens) -> (batch * num_heads, T, num_hiddens / num_heads)."""
    X = X.reshape(X.shape[0], X.shape[1], num_heads, -1)  # (batch, T, num_heads, d_head)
    X = X.permute(0, 2, 1, 3)  # (batch, num_heads, T, d_head)
    return X.reshape(-1, X.shape[2], X.shape[3])  # (batch * num_heads, T, d_head)


def transpose_output(X, num_heads):
    """The reverse of transpose_qkv: (batch * num_heads, T, d_head) -> (batch, T, num_hiddens)."""
    X = X.reshape(-1, num_heads, X.shape[1], X.shape[2])  # (batch, num_heads, T, d_head)
    X = X.permute(0, 2, 1, 3)  # (batch, T, num_heads, d_head)
    return X.reshape(X.shape[0], X.shape[1], -1)  # (batch, T, num_hiddens)


with mt.no_grad():
    projected = X @ W_q.T
    print("X @ W_q^T      ", projected.shape)
    print("transpose_qkv  ", transpose_qkv(projected, num_heads).shape)
    queries = transpose_qkv(X @ W_q.T, num_heads)  # (10, 4, 20)
    keys = transpose_qkv(Y @ W_k.T, num_heads)  # (10, 6, 20)
    values = transpose_qkv(Y @ W_v.T, num_heads)  # (10, 6, 20)
    # 样本 b 的有效长度，它的每个头各重复一次：[3, 3, 3, 3, 3, 2, 2, 2, 2, 2]
    lens_per_head = mt.tensor(numpy.repeat(valid_lens.numpy(), num_heads))
    scores = queries @ keys.swapaxes(-1, -2) / math.sqrt(d_head)  # (10, 4, 6)
    heads = mt.masked_softmax(scores, lens_per_head) @ values  # (10, 4, 20)：一次算出所有头
    concat = transpose_output(heads, num_heads)  # (2, 4, 100)
    print("heads          ", heads.shape, "\ntranspose_output", concat.shape)

assert queries.shape == (batch_size * num_heads, num_queries, d_head)
assert keys.shape == values.shape == (batch_size * num_heads, num_kvpairs, d_head)
assert heads.shape == (batch_size * num_heads, num_queries, d_head)
assert concat.shape == (batch_size, num_queries, num_hiddens)
assert numpy.array_equal(transpose_output(transpose_qkv(X, num_heads), num_heads).numpy(), X.numpy()), (
    "transpose_output undoes transpose_qkv"
)
by_head = heads.numpy().reshape(batch_size, num_heads, num_queries, d_head)
for i in range(num_heads):
    assert numpy.allclose(by_head[:, i], heads_loop[i].numpy(), atol=1e-5), f"head {i}: reshaping == looping"

# %% [markdown]
# minitensor 的层也是这样做的，只有一处不同：它停在 (batch, num_heads, T, d_head)，
# 而不把头并入批量轴（`project_and_split`），这样评分插件和汇聚插件看到的头是一个单独的轴；
# 形状为 (batch, Q, K) 的掩码随后会沿这个轴广播。算出的数值是一样的：

# %%
with mt.no_grad():
    split = attention.project_and_split(attention.W_q, X)
print("project_and_split", split.shape)
assert split.shape == (batch_size, num_heads, num_queries, d_head)
assert numpy.allclose(split.numpy().reshape(-1, num_queries, d_head), queries.numpy(), atol=1e-6)

# %% [markdown]
# ## 先拼接再乘 $W_o$，也就是对各个头求和
#
# 输出是 $\mathbf{W}_o$ 乘以拼接的结果。把 D2L 的 $\mathbf{W}_o \in \mathbb{R}^{p_o \times h p_v}$
# （输出 × 输入）按列切成 $h$ 块 $\mathbf{W}_o^{(i)} \in \mathbb{R}^{p_o \times p_v}$，每个头一块；
# 分块矩阵乘以上下叠起的向量，等于各块分别乘以对应的分量再求和：
#
# $$\mathbf{W}_o \begin{bmatrix} \mathbf{h}_1 \\ \vdots \\ \mathbf{h}_h \end{bmatrix}
# = \sum_{i=1}^{h} \mathbf{W}_o^{(i)} \mathbf{h}_i .$$
#
# （在 Transformer 论文的行向量布局中，$W^O = \mathbf{W}_o^\top \in \mathbb{R}^{h p_v \times p_o}$，
# 这些块就是它按行切出的 $h$ 块。）在代码中，`W_o.weight` 和 D2L 的 $\mathbf{W}_o$ 一样存成
# (out, in)，所以第 $i$ 块（头从 0 开始编号）是 `W_o[:, 20 i : 20 i + 20]`；各个头是行向量，
# 因此一个头对一行输出的贡献是 $\mathbf{h}_i^\top \mathbf{W}_o^{(i)\top}$，即 `head_i @ block.T`。

# %%
with mt.no_grad():
    concat_then_Wo = concat @ W_o.T  # 每一行：[h_1^T, ..., h_h^T] W_o^T
    sum_over_heads = sum(heads_loop[i] @ W_o[:, i * d_head : (i + 1) * d_head].T for i in range(num_heads))
gap_layer = numpy.abs(concat_then_Wo.numpy() - output.numpy()).max()
gap_sum = numpy.abs(concat_then_Wo.numpy() - sum_over_heads.numpy()).max()
print(f"|concat W_o - MultiHeadAttention| = {gap_layer:.1e}   |concat W_o - sum_i W_o^(i) h_i| = {gap_sum:.1e}")
assert gap_layer < 1e-5, "the by-hand computation reproduces mt.nn.MultiHeadAttention"
assert gap_sum < 1e-5, "concatenation then W_o equals the sum over heads of W_o's column blocks times each head"

# %% [markdown]
# > **一种常见的概括：“把各个头线性加权”**
# >
# > 有一种常见的概括把多头注意力的最后一步说成对各个头的输出做线性加权，
# > $f(\mathbf{Q}) = \sum_i \omega_i \mathbf{h}_i$。应当依据的定义是 D2L（10.5 / 11.5）和
# > Transformer 论文（Vaswani 等人，2017，3.2.2 节）给出的：将这 $h$ 个注意力汇聚的输出拼接在一起，
# > 并且通过另一个可以学习的线性投影 $\mathbf{W}_o$ 进行变换。minitensor 实现的正是先拼接、再乘
# > $\mathbf{W}_o$（`MultiHeadAttention.merge_and_project`）：这是一次大的矩阵乘法，也是 D2L、
# > PyTorch 和 Transformer 论文的做法。只要把每个权重 $\omega_i$ 理解为一个矩阵，即列块
# > $\mathbf{W}_o^{(i)}$，这种概括描述的就是*同一个*线性映射，上面的恒等式说明了这一点
# > （代码单元也验证到了 1e-5 以内）。如果 $\omega_i$ 是标量（或 $\mathbf{W}_o^{(i)} = \omega_i I$），
# > 求和得到的就是一个严格更小的模型：它只能缩放每个头，而不能把头的特征混合到输出的特征中。

# %% [markdown]
# ## 代价是多少
#
# 每个头在 $p_o / h$ 维中工作，所以 $h$ 个头合起来的参数恰好与一个全宽度的头相同：
# 无论 $h$ 是多少，都是 $4\, p_o^2$ 个权重（$\mathbf{W}_q, \mathbf{W}_k, \mathbf{W}_v, \mathbf{W}_o$）。
# 头越多并不增加参数，只是每个头变小了。

# %%
for h in (1, 2, 4, 5, 10):
    count = mt.nn.MultiHeadAttention(num_hiddens, h).num_parameters()
    print(f"num_heads={h:2d}: {count:,} parameters")
    assert count == 4 * num_hiddens * num_hiddens, "the parameter count does not depend on num_heads"

# %% [markdown]
# ## 不同的头关注什么
#
# “每个头都可能会关注输入的不同部分”，因而多头注意力可以表示比简单加权平均值更复杂的函数（D2L 10.5）。
# 下面这个小任务就能展示这一点：一个由 8 个词元组成的序列，词元取自大小为 5 的字母表；位置 $i$
# 上的答案要同时说出*两个*邻居，即把词元对 $(x_{i-1}, x_{i+1})$ 作为 25 个类别之一（位置在两端循环）。
# 一个自注意力层通过 `mt.nn.TransformerEmbedding` 看到这些词元，位置编码使用 `learned`
# （按名字选用的插件；位置是教程 6 的内容），再由一个线性层从它的输出中读出答案。我们分别用 2 个头
# 和 1 个头（作为对照）来训练它。这个任务并不*需要*两个头：一个头也能学会，代码单元会验证这一点。
# 它展示的是两个头如何分工，各自负责一个邻居。

# %%
vocab_size, num_steps, width = 5, 8, 16


def make_batch(rng, n):
    x = rng.integers(0, vocab_size, size=(n, num_steps))
    y = numpy.roll(x, 1, axis=1) * vocab_size + numpy.roll(x, -1, axis=1)  # (x_{i-1}, x_{i+1}) 对应的类别
    return mt.tensor(x), mt.tensor(y)


class NeighbourModel(mt.nn.Module):
    def __init__(self, num_heads):
        super().__init__()
        self.embedding = mt.nn.TransformerEmbedding(vocab_size, width, 0.0, max_len=num_steps, positional="learned")
        self.attention = mt.nn.MultiHeadAttention(width, num_heads, dropout=0.0)
        self.output = mt.nn.Linear(width, vocab_size**2)

    def forward(self, tokens):
        X = self.embedding(tokens)
        return self.output(self.attention(X, X, X))  # 自注意力：查询 = 键 = 值


def train(num_heads, steps=400, seed=2):
    mt.manual_seed(seed)
    rng = numpy.random.default_rng(seed)
    model = NeighbourModel(num_heads)
    optimizer = mt.optim.Adam(model.parameters(), lr=0.02)
    losses = []
    for _ in range(steps):
        x, y = make_batch(rng, 64)
        loss = mt.cross_entropy(model(x).reshape(-1, vocab_size**2), y.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return model, losses


def evaluate(model, n):
    x, y = make_batch(numpy.random.default_rng(123), n)
    model.eval()
    with mt.no_grad():
        accuracy = float((model(x).numpy().argmax(axis=-1) == y.numpy()).mean())
    weights = model.attention.attention_weights.numpy()  # (n, num_heads, 8, 8)
    # 每个头放在前一个位置和后一个位置上的平均权重。
    rows = numpy.arange(num_steps)
    prev = weights[:, :, rows, (rows - 1) % num_steps].mean(axis=(0, 2))
    nxt = weights[:, :, rows, (rows + 1) % num_steps].mean(axis=(0, 2))
    return accuracy, prev, nxt, weights


two_heads, losses2 = train(num_heads=2)
one_head_model, losses1 = train(num_heads=1)
num_eval = pick(2000, 200)
acc2, prev2, next2, weights2 = evaluate(two_heads, num_eval)
acc1, prev1, next1, weights1 = evaluate(one_head_model, num_eval)
print(f"2 heads: loss {losses2[0]:.2f} -> {losses2[-1]:.1e}, accuracy {acc2:.1%}")
for i in range(2):
    print(f"   head {i + 1}: weight on x_(i-1) {prev2[i]:.2f}, on x_(i+1) {next2[i]:.2f}")
print(f"1 head:  loss {losses1[0]:.2f} -> {losses1[-1]:.1e}, accuracy {acc1:.1%}")
print(f"   head 1: weight on x_(i-1) {prev1[0]:.2f}, on x_(i+1) {next1[0]:.2f}")

assert losses2[-1] < 0.1 * losses2[0] and acc2 > 0.95, "two heads learn the task"
assert losses1[-1] < 0.1 * losses1[0] and acc1 > 0.95, "one head learns the task too: it does not need two"
# 各个头有了分工：一个看左边，另一个看右边。
left, right = int(prev2.argmax()), int(next2.argmax())
assert left != right, "the two heads must attend to different neighbours"
assert prev2[left] > 0.6 and next2[right] > 0.6, "each head puts most of its weight on its neighbour"
# 单独一个头要同时照顾两个邻居：它的权重分给了两边。
assert min(prev1[0], next1[0]) > 0.15 and prev1[0] + next1[0] > 0.8, "one head splits its weight"

# %% [markdown]
# 下面为一个序列的每个头画一张热图（行是查询的位置，列是键的位置）。2 头模型的头 1 和头 2
# 各自选中一条次对角线，即某一侧的邻居，并在两端循环；1 头模型中唯一的那个头则把权重分散在两个邻居上。
# 它照样解决了这个任务，办法是以不相等的权重混合两个邻居的值：有 16 个维度，一个头的容量绰绰有余。
# 所以这里并不需要两个头，两个头只是分了工。当需要关注的位置更多时，一个头是否还应付得了，
# 留作练习 1。

# %%
tokens = [str(t) for t in make_batch(numpy.random.default_rng(123), 1)[0].numpy()[0]]
panels = numpy.stack([weights2[0, 0], weights2[0, 1], weights1[0, 0]])[None]
show_heatmaps(
    panels,
    xlabel=text("keys (position: token)"),
    ylabel=text("queries"),
    titles=[text("2 heads: head 1"), text("2 heads: head 2"), text("1 head")],
    figsize=(10, 3.8),
    row_labels=[f"{i}:{t}" for i, t in enumerate(tokens)],
    col_labels=[f"{i}:{t}" for i, t in enumerate(tokens)],
    path=figure_path(TUTORIAL, "heads.png"),
)

fig = Figure(figsize=(5.5, 3.2), layout="constrained")
ax = fig.subplots()
ax.plot(losses2, label=text("2 heads"))
ax.plot(losses1, label=text("1 head"))
ax.set(xlabel=text("step"), ylabel=text("cross-entropy"), yscale="log", title=text("training the neighbour task"))
ax.legend()
fig.savefig(figure_path(TUTORIAL, "neighbour_loss.png"), dpi=100)

# %% [markdown]
# ## 练习
#
# 1. 让任务需要关注三个位置：位置 $i$ 上的答案要说出 $(x_{i-2}, x_{i-1}, x_{i+1})$。
#    需要多少个头，才能让每个头各负责一个位置？头的数量少于要关注的位置数时，模型会怎样？
# 2. 把拼接换成*标量*加权 $\sum_i \omega_i \mathbf{h}_i$（写一个带 $h$ 个标量参数的 Module，
#    每个头的大小为 $p_o$，使求和结果与输出大小相同）。数一数它的参数，并在相邻词元任务上比较它的损失。
# 3. 给 `MultiHeadAttention` 的头换一个评分函数（`scorer="additive"`，或教程 4 中你自己写的
#    双线性评分函数）。本教程中亲手计算的哪些部分会改变，哪些不会？
#
# ## 在引擎中的位置
#
# - `minitensor/core/nn/attention.py`：`MultiHeadAttention`（`project_and_split`、一次算出所有头的注意力、
#   `merge_and_project`）以及它所用的单头 `Attention`。
# - `plugins/minitensor_plugins/scorers.py`（`scaled_dot`）和
#   `plugins/minitensor_plugins/poolings.py`（`softmax`）：每个头的评分函数和汇聚。
# - `minitensor/core/ops/softmax.py` 和 `minitensor/core/kernels/`：`mt.masked_softmax` 及其 numba 计算内核。
# - `minitensor/core/ops/shape.py`：`reshape` 和 `permute`，并行计算各个头的全部诀窍就在这里。
# - `minitensor/core/nn/transformer.py`：`TransformerEmbedding`；
#   `plugins/minitensor_plugins/positional.py`：位置编码 `learned`。
# - `minitensor/train/plots.py`：`show_heatmaps`。
