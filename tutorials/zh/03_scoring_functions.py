# %% [markdown]
# # 3. 注意力评分函数
#
# 教程 2 把注意力权重算作 $-\frac12 (q - k_i)^2$ 的 softmax。本教程把这一步拆开来看：
# **注意力评分函数**（attention scoring function）为每一对查询和键打分，**softmax** 运算
# （经过掩蔽，因而永远不会关注填充词元）把这些评分变成权重；然后我们实现 D2L 介绍的两个经典
# 评分函数，对照公式检验它们，并加以比较：**加性注意力**（additive attention），即注意力诞生之初
# 循环神经网络编码器－解码器所用的评分函数（Bahdanau et al. 2015）；以及**缩放点积注意力**
# （scaled dot-product attention），Transformer（Vaswani et al. 2017）和此后几乎所有模型用的都是它。
# 最后，我们按名字从 minitensor 的插件注册表中挑选评分器和汇聚方式。
#
# 参考资料：D2L 的注意力机制一章，中文版《动手学深度学习》（zh.d2l.ai）10.3 注意力评分函数，
# 英文版 *Dive into Deep Learning*（d2l.ai）11.3 "Attention Scoring Functions"；加性注意力见
# Bahdanau、Cho 和 Bengio（2015）的论文 "Neural Machine Translation by Jointly Learning to Align
# and Translate"，缩放点积见 Vaswani 等人（2017）的论文 "Attention Is All You Need"。

# %%
import time

import numpy
from _tutorial import SMOKE, expect_error, figure_path, pick, text  # noqa: F401  （每个教程共用的辅助函数）
from matplotlib.figure import Figure  # 不经过 pyplot 的 Figure：不开窗口，没有全局状态

import minitensor as mt
from minitensor.train.plots import show_heatmaps

TUTORIAL = "03_scoring_functions"
mt.manual_seed(0)
rng = numpy.random.default_rng(0)


def softmax_numpy(x):
    """The textbook softmax, row-wise, in plain NumPy (for checking)."""
    e = numpy.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


# %% [markdown]
# ## 评分与权重
#
# 使用高斯核时，注意力汇聚为
#
# $$f(q) = \sum_i \alpha(q, k_i)\, v_i = \sum_{i=1}^n \mathrm{softmax}\big(-\tfrac12 (q - k_i)^2\big)\, v_i .$$
#
# D2L 把高斯核的指数部分 $-\frac12 (q - k_i)^2$ 视为**注意力评分函数**（attention scoring
# function），简称**评分函数**（scoring function），记作 $a(q, k)$；它在一对查询和键上的取值，
# 我们称为**注意力评分**（attention score）：一个*未经归一化*的注意力权重，可以是任意实数，
# 应当刻画键 $k$ 与查询 $q$ 的相关程度。softmax 把评分归一化为**注意力权重**（attention
# weight），每个权重都在 $[0, 1]$ 之间，并且对所有键求和为 1：
#
# $$f\big(q, (k_1, v_1), \ldots, (k_n, v_n)\big) = \sum_{i=1}^{n} \alpha(q, k_i)\, v_i \in \mathbb R^v,$$
#
# $$\alpha(q, k_i) = \mathrm{softmax}\big(a(q, k_i)\big) = \frac{\exp a(q, k_i)}{\sum_{j=1}^{n} \exp a(q, k_j)} \in \mathbb R .$$
#
# 不同的注意力机制，区别就在于 $a$ 的选择。在 minitensor 中，评分函数是一个**评分器**（scorer）
# 插件，归一化则是一个**汇聚**（pooling）插件；`mt.nn.Attention` 层各持有一个（`layer.scorer`、
# `layer.pooling`），并把最近一次算出的权重保存在 `layer.attention_weights` 中。下面是教程 2 的
# 高斯评分，作用于 3 个查询和 5 个键，评分与权重并列打印：

# %%
gauss = mt.nn.Attention(scorer="gaussian", pooling="softmax", dropout=0.0, query_size=1, key_size=1)
q = mt.tensor([[0.0], [1.0], [2.5]])  # 3 个大小为 1 的查询
k = mt.tensor([[0.0], [0.5], [1.0], [2.0], [4.0]])  # 5 个键
v = mt.tensor([[0.0], [1.0], [2.0], [3.0], [4.0]])  # 5 个值
with mt.no_grad():
    scores = gauss.scorer(q, k).numpy()
    output = gauss(q, k, v).numpy()
weights = gauss.attention_weights.numpy()
print("scores (any real number):\n", scores.round(3))
print("weights (each row in [0, 1], summing to 1):\n", weights.round(3))
assert scores.min() < -1.0, "scores are not limited to [0, 1]"
assert numpy.allclose(scores, -0.5 * (q.numpy() - k.numpy().T) ** 2, atol=1e-6), "a(q, k) = -(q - k)^2 / 2"
assert numpy.allclose(weights, softmax_numpy(scores), atol=1e-6), "weights = softmax(scores)"
assert numpy.allclose(weights.sum(axis=1), 1.0, atol=1e-6) and (weights >= 0).all(), "rows are distributions"
assert numpy.allclose(output, weights @ v.numpy(), atol=1e-6), "output = weights @ values"

# %% [markdown]
# ## 掩蔽 softmax
#
# 一个小批量中的序列长短不一，要填充到同一长度；填充词元是谁都不应关注的键。D2L 的
# **掩蔽 softmax 操作**（masked softmax operation）除了评分之外，还接受**有效长度** `valid_lens`
# （每个序列的词元个数）：样本 $b$ 的查询 $i$ 只能看到前 `valid_lens[b]` 个键（形状为
# `(batch,)` 时），或前 `valid_lens[b, i]` 个键（形状为 `(batch, Q)` 时）。被掩蔽的键得到的权重
# **恰好**为 0，其余的键在彼此之间做 softmax。`mt.masked_softmax(scores, valid_lens)` 在一个
# 融合的 numba 计算内核上完成这一运算；下面是 D2L 的两个例子：

# %%
scores = mt.rand(2, 2, 4)
for valid_lens in ([2, 3], [[1, 3], [2, 4]]):
    masked = mt.masked_softmax(scores, mt.tensor(valid_lens))
    print(f"valid_lens = {valid_lens}:\n{masked.numpy().round(4)}")
    lens = numpy.broadcast_to(numpy.array(valid_lens).reshape(2, -1), (2, 2))  # 每行一个有效长度
    beyond = numpy.arange(4) >= lens[..., None]  # (2, 2, 4)：超出有效长度处为 True
    assert (masked.numpy()[beyond] == 0.0).all(), "masked keys get weight exactly zero"
    assert numpy.allclose(masked.numpy().sum(axis=-1), 1.0, atol=1e-6), "valid keys share all the weight"

# %% [markdown]
# ### 无键可看的查询
#
# 如果某一行**没有**任何有效的键（`valid_lens` 为 0：一个全由填充组成的样本，或一个被掩码禁止
# 看任何键的查询），会怎样？公式变成 $0$ 除以 $0$，而三种常见的实现给出的结果各不相同：
#
# - 朴素的实现把被掩蔽的评分设为 $-\infty$，再做 softmax：这一行的最大值是 $-\infty$，
#   $-\infty - (-\infty)$ 得到 NaN，于是 **NaN** 扩散到输出、损失，并在一步优化之后扩散到每个
#   参数（对一行全是 `-inf` 的输入，`torch.softmax` 返回 NaN，所以 PyTorch 中的 `-inf` 掩码
#   正会如此）；
# - D2L 则把被掩蔽的评分设为 $-10^6$：这一行的评分全部相等，softmax 使权重**均匀**分布——
#   查询悄无声息地关注了填充；
# - minitensor 返回**全零的权重**：这个查询不从任何值中取得信息，它的输出是零向量，也没有梯度
#   流经它。
#
# 三者之中只有零表示“什么也没有关注”。在一个样本上比较这三种做法，逐查询的 `valid_lens` 为
# $(6, 4, 2, 0)$：

# %%
scores = rng.standard_normal((1, 4, 6)).astype(numpy.float32)
valid_lens = numpy.array([[6, 4, 2, 0]])
allowed = numpy.arange(6) < valid_lens[..., None]  # (1, 4, 6)
values = rng.standard_normal((1, 6, 3)).astype(numpy.float32)

with numpy.errstate(invalid="ignore"):  # -inf - (-inf)：NumPy 先发出警告，再返回 NaN
    naive = softmax_numpy(numpy.where(allowed, scores, -numpy.inf))
d2l = softmax_numpy(numpy.where(allowed, scores, -1e6))
ours = mt.masked_softmax(mt.tensor(scores), mt.tensor(valid_lens)).numpy()

print("last row, naive -inf:", naive[0, -1].round(3))
print("last row, D2L -1e6:  ", d2l[0, -1].round(3))
print("last row, minitensor:", ours[0, -1])
assert numpy.isnan(naive[0, -1]).all() and numpy.isnan((naive @ values).sum()), "NaN spreads to the output"
assert numpy.allclose(d2l[0, -1], 1 / 6), "D2L's -1e6: uniform weights over padding"
assert (ours[0, -1] == 0.0).all() and not numpy.isnan(ours).any(), "minitensor: a fully masked row is all zeros"
assert numpy.allclose(ours[0, :3], naive[0, :3], atol=1e-6), "on rows with a valid key all three agree"
assert (ours[~allowed] == 0.0).all(), "every masked weight is exactly zero"

show_heatmaps(
    numpy.stack([naive[0], d2l[0], ours[0]])[None],
    xlabel=text("Keys"),
    ylabel=text("Queries"),
    titles=[text("naive -inf: NaN row (blank)"), text("D2L -1e6: uniform row"), text("minitensor: zero row")],
    figsize=(10, 3.2),
    path=figure_path(TUTORIAL, "masked_softmax.png"),
)

# %% [markdown]
# 反向传播的结果与此一致：经过 minitensor 的掩蔽 softmax，被掩蔽的评分以及整行被掩蔽的那一行
# 得到的梯度都恰好为 0——是有限值，因此训练可以继续。

# %%
x = mt.tensor(scores, requires_grad=True)
out = mt.masked_softmax(x, mt.tensor(valid_lens)) @ mt.tensor(values)
(out * out).sum().backward()
grad = x.grad.numpy()
assert numpy.isfinite(grad).all(), "no NaN in the gradient"
assert (grad[~allowed] == 0.0).all(), "masked scores get no gradient"

# %% [markdown]
# ## 加性注意力
#
# 当查询和键是**长度不同**的向量时，一个自然的评分函数是**加性注意力**（additive attention，
# Bahdanau et al. 2015）。给定 $\mathbf q \in \mathbb R^q$ 和 $\mathbf k \in \mathbb R^k$，
#
# $$a(\mathbf q, \mathbf k) = \mathbf w_v^\top \tanh(\mathbf W_q \mathbf q + \mathbf W_k \mathbf k) \in \mathbb R,$$
#
# 其中 $\mathbf W_q \in \mathbb R^{h \times q}$、$\mathbf W_k \in \mathbb R^{h \times k}$ 和
# $\mathbf w_v \in \mathbb R^h$ 是可学习的参数。两个向量先被投影到同一个 $h$ 维空间，相加，经
# tanh 压缩，再读出一个数：这等价于将查询和键连结成 $[\mathbf q; \mathbf k]$ 后输入到一个
# 多层感知机（MLP）中，感知机包含**一个隐藏层**（$h$ 个 tanh 隐藏单元）和一个输出，且没有偏置。
#
# D2L 的例子：批量大小为 2，每个样本有一个长度为 20 的查询、十个长度为 2 的键（元素全为 1），
# 值为 $0, 1, \ldots, 39$，排成十行、每行 4 个，有效长度为 2 和 6，$h = 8$。评分器是插件
# `additive`，隐藏单元数由它的选项 `num_hiddens` 给出。

# %%
queries = mt.randn(2, 1, 20)
keys = mt.ones(2, 10, 2)
values = mt.tensor(numpy.tile(numpy.arange(40, dtype=numpy.float32).reshape(1, 10, 4), (2, 1, 1)))
valid_lens = mt.tensor([2, 6])

additive = mt.nn.Attention(
    "additive", "softmax", dropout=0.1, query_size=20, key_size=2, scorer_options={"num_hiddens": 8}
)
additive.eval()  # 查看权重时，不对它们做暂退（dropout）
with mt.no_grad():
    out = additive(queries, keys, values, valid_lens)
print("output shape:", out.shape)  # （批量大小，查询的个数，值的维度）
weights = additive.attention_weights.numpy()  # (2, 1, 10)
assert out.shape == (2, 1, 4)
# 所有键都相同，所以每个有效的键得分相同：权重分别在 2 个和 6 个键上均匀分布。
assert numpy.allclose(weights[0, 0, :2], 1 / 2) and numpy.allclose(weights[1, 0, :6], 1 / 6)
assert (weights[0, 0, 2:] == 0).all() and (weights[1, 0, 6:] == 0).all(), "masked weights are exactly zero"

show_heatmaps(
    weights.reshape(1, 1, 2, 10),
    xlabel=text("Keys"),
    ylabel=text("Queries"),
    figsize=(6, 2.2),
    row_labels=[text("example 1"), text("example 2")],
    path=figure_path(TUTORIAL, "additive_weights.png"),
)

# %% [markdown]
# 对照层自身的参数，检验这个公式及其 MLP 解读（`nn.Linear` 与 PyTorch 一样，把 $W$ 存为
# (out, in) 的形状）：

# %%
scorer = additive.scorer
W_q, W_k = scorer.W_q.weight.numpy(), scorer.W_k.weight.numpy()  # (8, 20), (8, 2)
w_v = scorer.w_v.weight.numpy()[0]  # (8,)
qs, ks = rng.standard_normal((3, 20)).astype(numpy.float32), rng.standard_normal((5, 2)).astype(numpy.float32)
with mt.no_grad():
    a = scorer(mt.tensor(qs), mt.tensor(ks)).numpy()  # (3, 5)
by_formula = numpy.array([[w_v @ numpy.tanh(W_q @ qi + W_k @ kj) for kj in ks] for qi in qs])
W = numpy.concatenate([W_q, W_k], axis=1)  # 作用于 [q; k] 的 MLP 的隐藏层
by_mlp = numpy.array([[w_v @ numpy.tanh(W @ numpy.concatenate([qi, kj])) for kj in ks] for qi in qs])
assert numpy.allclose(a, by_formula, atol=1e-5), "a(q, k) = w_v^T tanh(W_q q + W_k k)"
assert numpy.allclose(a, by_mlp, atol=1e-5), "= a one-hidden-layer MLP on the concatenation [q; k]"

# %% [markdown]
# ## 缩放点积注意力
#
# 当查询和键的**长度相同**，都为 $d$ 时，它们的点积是计算代价更低的评分：每个特征只需一次
# 乘法，而且没有参数。如果 $\mathbf q$ 和 $\mathbf k$ 的元素相互独立，均值为 0、方差为 1，那么
# $\mathbf q^\top \mathbf k$ 是 $d$ 个这样的乘积之和，均值为 0、方差为 $d$；除以 $\sqrt d$ 之后，
# 无论 $d$ 多大，方差都保持为 1。这就是**缩放点积注意力**（scaled dot-product attention）：
#
# $$a(\mathbf q, \mathbf k) = \frac{\langle \mathbf q, \mathbf k \rangle}{\sqrt d} .$$
#
# 在小批量上，对 $n$ 个查询 $\mathbf Q \in \mathbb R^{n \times d}$、$m$ 个键
# $\mathbf K \in \mathbb R^{m \times d}$ 及其值 $\mathbf V \in \mathbb R^{m \times v}$：
#
# $$f(\mathbf Q) = \mathrm{softmax}\Big(\frac{\mathbf Q \mathbf K^\top}{\sqrt d}\Big) \mathbf V \in \mathbb R^{n \times v}.$$
#
# 对应的插件是 `scaled_dot`（以及不除以 $\sqrt d$ 的 `dot`）。先手工验证公式：

# %%
d = 16
Qs, Ks = mt.randn(2, 3, d), mt.randn(2, 7, d)
scaled = mt.nn.Attention("scaled_dot", "softmax", dropout=0.0)
with mt.no_grad():
    s = scaled.scorer(Qs, Ks).numpy()  # (2, 3, 7)
by_hand = numpy.einsum("bqd,bkd->bqk", Qs.numpy(), Ks.numpy()) / numpy.sqrt(d)
assert numpy.abs(s - by_hand).max() < 1e-5, "scaled_dot score = q.k / sqrt(d)"

# %% [markdown]
# 用它来跑 D2L 的例子：长度为 2 的查询，同样是十个元素全为 1 的键，有效长度为 2 和 6——权重
# 同样在有效的键上均匀分布。

# %%
with mt.no_grad():
    out = scaled(mt.randn(2, 1, 2), mt.ones(2, 10, 2), values, valid_lens)
weights = scaled.attention_weights.numpy()
assert out.shape == (2, 1, 4)
assert numpy.allclose(weights[0, 0, :2], 1 / 2) and numpy.allclose(weights[1, 0, :6], 1 / 6)
assert (weights[0, 0, 2:] == 0).all() and (weights[1, 0, 6:] == 0).all(), "masked weights are exactly zero"

# %% [markdown]
# ### 为什么要除以 $\sqrt d$
#
# 动手测量一下：在几个不同的 $d$ 下，取大量随机的查询和键，元素的方差都为 1。普通点积的方差
# 随 $d$ 线性增长；缩放后的点积，方差保持在 1 附近。

# %%
num_pairs = pick(20_000, 5_000)
dims = (4, 16, 64, 256)
raw_var, scaled_var, raw_samples, scaled_samples = {}, {}, {}, {}
for d in dims:
    qd, kd = mt.randn(num_pairs, d), mt.randn(num_pairs, d)
    dots = (qd * kd).sum(axis=-1).numpy()
    raw_var[d], scaled_var[d] = float(dots.var()), float((dots / numpy.sqrt(d)).var())
    raw_samples[d], scaled_samples[d] = dots, dots / numpy.sqrt(d)
    print(f"d = {d:>3}: var(q.k) = {raw_var[d]:7.2f},  var(q.k / sqrt d) = {scaled_var[d]:.3f}")
    assert 0.85 < raw_var[d] / d < 1.15, "the variance of a dot product grows like d"
    assert 0.85 < scaled_var[d] < 1.15, "scaled by sqrt(d), it stays about 1"

# %% [markdown]
# 这为什么重要：过大的评分会把 softmax 推入饱和区。当 $d = 256$、有十个键时，未缩放评分的
# 标准差为 16；softmax 几乎把全部权重都放在一个键上，而它的梯度
# $\alpha_j (g_j - \sum_k g_k \alpha_k)$ 在 $\alpha$ 趋于独热（one-hot）时趋于零，于是几乎停止
# 更新。缩放之后，权重保持分散，梯度依然有效。

# %%
d, num_keys, rows = 256, 10, pick(2_000, 500)
q_big, k_big = mt.randn(rows, 1, d), mt.randn(rows, num_keys, d)
raw = (q_big @ k_big.swapaxes(-1, -2)).detach()
peak, grad_size = {}, {}
for name, score in (("unscaled", raw), ("scaled", raw * (1.0 / numpy.sqrt(d)))):
    score = score.detach().requires_grad_()
    w = mt.softmax(score)
    (w * mt.randn(rows, 1, num_keys)).sum().backward()  # 一个随机的上游梯度
    peak[name] = float(w.max(axis=-1).mean().item())
    grad_size[name] = float(numpy.abs(score.grad.numpy()).mean())
    print(f"{name:>9}: mean largest weight {peak[name]:.2f}, mean |d loss / d score| {grad_size[name]:.4f}")
assert peak["unscaled"] > 0.8 > 0.5 > peak["scaled"], "unscaled: nearly one-hot; scaled: spread out"
assert grad_size["unscaled"] < grad_size["scaled"] / 2, "saturated softmax, vanishing gradient"

fig = Figure(figsize=(10, 3.2), layout="constrained")
ax_raw, ax_scaled = fig.subplots(1, 2)
for d in dims:
    ax_raw.hist(raw_samples[d], bins=80, histtype="step", density=True, label=f"d = {d}")
    ax_scaled.hist(scaled_samples[d], bins=80, histtype="step", density=True, label=f"d = {d}")
ax_raw.set_title(text("$q^\\top k$: variance $d$"), fontsize="medium")
ax_scaled.set_title(text("$q^\\top k / \\sqrt{d}$: variance 1"), fontsize="medium")
ax_scaled.legend(fontsize="small")
fig.savefig(figure_path(TUTORIAL, "dot_product_variance.png"), dpi=100)

# %% [markdown]
# ## 何时用哪一个
#
# - **查询和键长度不同**：用加性注意力；它的 $\mathbf W_q$ 和 $\mathbf W_k$ 把两者带入同一个
#   空间。点积在这里根本没有定义，`scaled_dot` 插件也会这样报错：

# %%
with expect_error("scaled_dot with queries of length 20 and keys of length 2", ValueError):
    mt.nn.Attention("scaled_dot", "softmax", 0.0, query_size=20, key_size=2)

# %% [markdown]
# - **查询和键长度相同**：用（缩放）点积。它没有参数，对 $n$ 个查询和 $m$ 个键只是一次矩阵乘法
#   $\mathbf Q \mathbf K^\top$——$O(nmd)$ 次乘加，BLAS 能全速完成。加性注意力则要先构造一个由
#   $\tanh(\mathbf W_q \mathbf q_i + \mathbf W_k \mathbf k_j)$ 组成的 $(n, m, h)$ 张量，再把它
#   归约成评分：$O(nmh)$ 次 `tanh`，占用同样多个浮点数的内存，而且是较慢的逐元素代码。
#
# 下面实际测量（单层的前向和反向传播，在批量大小为 4、$d = h = 32$ 的自注意力上；取几次运行中
# 最快的一次——共享机器上的计时会有波动，所以不对它们做任何断言）：


# %%
def best_time(layer, X, repeats=5):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        layer(X, X, X).sum().backward()
        times.append(time.perf_counter() - start)
    return min(times)


lengths = pick((16, 32, 64, 128), (8, 16, 32))
timings = {"scaled_dot": [], "additive": []}
for n in lengths:
    X = mt.randn(4, n, 32, requires_grad=True)
    for name in timings:
        timings[name].append(best_time(mt.nn.Attention(name, "softmax", 0.0, 32, 32), X))
    print(
        f"n = m = {n:>3}: scaled_dot {1e3 * timings['scaled_dot'][-1]:6.2f} ms, "
        f"additive {1e3 * timings['additive'][-1]:6.2f} ms"
    )

fig = Figure(figsize=(4.5, 3.2), layout="constrained")
ax = fig.subplots()
for name, ts in timings.items():
    ax.loglog(lengths, [1e3 * t for t in ts], "o-", label=name)
ax.set_xlabel(text("sequence length n = m"))
ax.set_ylabel(text("forward + backward (ms)"))
ax.legend()
fig.savefig(figure_path(TUTORIAL, "scorer_cost.png"), dpi=100)

# %% [markdown]
# bench/README.md 中的表格在整个 Transformer 的规模上讲述了同样的事：在日期任务上训练同样的步数，
# `additive` 的耗时是 `scaled_dot` 的两倍多。这就是 Transformer 使用缩放点积的原因——它的查询和键
# 本来就是同一宽度的投影（教程 5）；而加性注意力则延续在循环神经网络模型中，那里解码器的状态与
# 编码器的输出大小可能不同（D2L 的 Bahdanau 解码器，见 10.4 Bahdanau 注意力 / 11.4 "The Bahdanau
# Attention Mechanism"，以及 `minitensor/core/nn/seq2seq.py`）。

# %% [markdown]
# > **常见的笔误，以及代码实现的是哪个版本**
# >
# > - *形状。* 批量公式中一个常见的笔误，是让值的行数与查询相同，即
# >   $\mathbf V \in \mathbb R^{n \times v}$。值与键成对，所以 $\mathbf V \in \mathbb R^{m \times v}$
# >   （D2L 正是这样写的），每个查询对应一行的是*输出*，形状为 $n \times v$。同理，softmax 的求和
# >   与值的加权求和遍历的是同样的 $m$ 个键。
# > - *名称。* 论文和笔记把评分函数写作 $a(q, k)$（D2L）、$s(q, k)$ 或 $\mathrm{score}(q, k)$；
# >   它们是同一个东西，也就是 minitensor 的*评分器*。
# > - *完全被掩蔽的行。* D2L 的 `masked_softmax` 用 $-10^6$ 填充被掩蔽的评分，这让没有有效键的行
# >   得到均匀的权重；minitensor 给它全零的权重（见上文）——既不均匀，也不是 NaN——因为只有零才
# >   意味着“什么也不关注”，在输出中如此，在梯度中也如此。至少有一个有效键的行，得到的权重与
# >   D2L 的完全相同。

# %% [markdown]
# ## 按名字选择评分器和汇聚方式
#
# 上面的每个评分器和汇聚方式都是按*名字*选出的；这些名字来自 minitensor 的插件注册表，由内置
# 插件（`plugins/minitensor_plugins/`）填入，方式与你自己编写的插件完全相同（教程 4 会写一个）。
# 注册表可以列出来：

# %%
for row in mt.plugins.describe():
    if row["kind"] in ("scorer", "pooling"):
        print(f"{row['name']:<20} {row['kind']:<8} {row['source']:<10} {row['class']}")
assert {"dot", "scaled_dot", "additive", "gaussian", "parametric_gaussian", "kernel"} <= set(mt.plugins.scorers())
assert {"softmax", "average", "sparsemax"} <= set(mt.plugins.poolings())

# %% [markdown]
# 拼错的名字会引发一个错误，错误信息列出已有的名字，并给出最接近的建议（下面的拼写错误是
# 故意的）：

# %%
with expect_error("the scorer name 'scaled_dott' (misspelt)", KeyError) as caught:
    mt.nn.Attention("scaled_dott")
assert "did you mean 'scaled_dot'" in str(caught.error)

# %% [markdown]
# 所有内置评分器作用于同样的六个查询和八个大小为 8 的键（最后两个键被 `valid_lens` 掩蔽），
# 各自接一个 softmax。这些评分的尺度不同，奖励的东西也不同——内积大（`dot`、`scaled_dot`）、
# 夹角小（`cosine`）、距离近（`gaussian`、`parametric_gaussian`、`kernel`、`l2`），或者一个小型
# MLP 学到的任何东西（`additive`，这里未经训练）——但在每个面板中，被掩蔽的键都得不到权重，
# 每一行的和都是 1。

# %%
Qn, Kn, Vn = mt.randn(1, 6, 8), mt.randn(1, 8, 8), mt.randn(1, 8, 8)
options = {"kernel": {"kernel": "gaussian", "width": 2.0}, "parametric_gaussian": {"w_init": 0.5}}
names = sorted(mt.plugins.scorers())
panels = []
for name in names:
    layer = mt.nn.Attention(name, "softmax", 0.0, query_size=8, key_size=8, scorer_options=options.get(name))
    with mt.no_grad():
        layer(Qn, Kn, Vn, valid_lens=[6])
    w = layer.attention_weights.numpy()[0]
    assert (w[:, 6:] == 0).all() and numpy.allclose(w.sum(axis=-1), 1.0, atol=1e-5), name
    panels.append(w)
show_heatmaps(
    numpy.stack(panels)[None],
    xlabel=text("Keys"),
    ylabel=text("Queries"),
    titles=names,
    figsize=(16, 2.6),
    path=figure_path(TUTORIAL, "scorers_by_name.png"),
)

# %% [markdown]
# 汇聚方式也以同样的方式替换。在同一组 `scaled_dot` 评分上比较：`softmax`；`sparsemax`
# （Martins & Astudillo 2016，一种较新的变体），它把评分投影到概率单纯形上，使评分低的键的
# 权重*恰好*为 0；以及 `average`，即教程 1 和教程 2 中不看查询的基线。

# %%
panels = []
for pooling in ("softmax", "sparsemax", "average"):
    layer = mt.nn.Attention("scaled_dot", pooling, 0.0)
    with mt.no_grad():
        layer(Qn * 3.0, Kn, Vn, valid_lens=[6])  # 让评分更尖锐，使 sparsemax 有可以舍弃的键
    w = layer.attention_weights.numpy()[0]
    assert (w[:, 6:] == 0).all() and numpy.allclose(w.sum(axis=-1), 1.0, atol=1e-5), pooling
    panels.append(w)
assert (panels[1][:, :6] == 0).any(), "sparsemax drops some valid keys entirely"
assert (panels[0][:, :6] > 0).all(), "softmax never does"
assert numpy.allclose(panels[2][:, :6], 1 / 6), "average: 1/n over the valid keys"
show_heatmaps(
    numpy.stack(panels)[None],
    xlabel=text("Keys"),
    ylabel=text("Queries"),
    titles=["softmax", "sparsemax", "average"],
    figsize=(8, 2.8),
    path=figure_path(TUTORIAL, "poolings_by_name.png"),
)

# %% [markdown]
# 同样的名字也可用于 `mt.nn.MultiHeadAttention(..., scorer="additive")`（教程 5）、Transformer
# （教程 7）以及命令行 `minitensor train --scorer additive`。
#
# ## 小结
#
# - 注意力评分 $a(q, k)$ 可以是任意实数；softmax 把一个查询的各个评分变成注意力权重。
# - 掩蔽 softmax 让超出 `valid_lens` 的键的权重恰好为 0，让没有有效键的查询得到全零的权重：
#   既不是 NaN，也不是均匀的权重。
# - 加性注意力 $\mathbf w_v^\top \tanh(\mathbf W_q \mathbf q + \mathbf W_k \mathbf k)$ 适用于长度
#   不同的查询和键；它是一个单隐藏层的 MLP，也是注意力诞生之初循环神经网络编码器－解码器所用的
#   评分函数（Bahdanau et al. 2015）。
# - 缩放点积注意力 $\mathbf q^\top \mathbf k / \sqrt d$ 要求长度相同，只需一次矩阵乘法；
#   $\sqrt d$ 让评分的方差保持为 1，使 softmax 不致饱和。Transformer 和此后几乎所有模型用的
#   都是它。

# %% [markdown]
# ## 练习
#
# 1. 给 D2L 例子中的加性评分器换上各不相同的键（用 `mt.randn(2, 10, 2)` 代替全 1 的键）。
#    权重还是均匀的吗？训练 `w_v`、`W_q`、`W_k`，使查询关注离 $(1, 1)$ 最近的键。
# 2. 证明：当 $\mathbf W_q = \mathbf W_k$ 且查询和键长度相同时，加性注意力*并不*只是
#    $\mathbf q^\top \mathbf k$ 的函数。两者之中，哪一个能表达“关注离查询远的键”？
# 3. 缩放点积假设元素的方差为 1。用方差为 4 的元素重复上面的方差测量。用什么缩放系数才能让
#    评分的方差保持为 1？（教程 7 的层规范化是一种答案。）
#
# ## 这些内容在引擎中的位置
#
# - `plugins/minitensor_plugins/scorers.py`——`dot`、`scaled_dot`、`additive`、`gaussian`、
#   `parametric_gaussian`、`kernel`、`cosine`、`l2`。
# - `plugins/minitensor_plugins/poolings.py`——`softmax`、`sparsemax`、`average`、`entmax15`、
#   `alpha_entmax`（教程 9），以及 `allowed_keys`（处理 `valid_lens` 和掩码）。
# - `minitensor/core/ops/softmax.py`——`masked_softmax` 及其反向传播；`minitensor/core/kernels/cpu.py`
#   ——让完全被掩蔽的行得到全零的融合 numba 计算内核。
# - `minitensor/core/nn/attention.py`——`Attention` 层：评分器、汇聚、暂退法、加权求和。
# - `minitensor/core/plugins.py`——注册表：`scorers()`、`poolings()`、`lookup()`、`describe()`。
