# %% [markdown]
# # 10. 从熟悉的 softmax 到 FlashAttention
#
# 到目前为止，每个注意力层都按 D2L 的方式计算权重：对每个头求出所有查询对所有键的评分，得到一个 (Q, K) 矩阵，用教程 3 的掩蔽 softmax 把它变成权重，再乘以值。D2L 10.6 / 11.6 把 $n$ 个词元上自注意力的计算复杂度记为 $O(n^2 d)$；而在长序列上，最先耗尽的是内存，也就是每个头那个 $n \times n$ 的权重矩阵。在 2048 个词元、8 个头时，它的一份 float32 副本就占每个样本 128 MiB，而训练时在反向传播之前要保留的还不止一份。
#
# **FlashAttention** 计算出完全相同的输出，却从不保存这个矩阵。它不是近似，也不是新的架构：它靠的是关于 softmax 的一个恒等式，即**在线 softmax**（online softmax），让每个查询行只需记住几个数，就能一次一块地访问键；再加上一个观察：反向传播所需的权重可以由每行一个数重新算出来，这个数就是 **log-sum-exp**（lse）。本教程先在一个 2 x 6 的例子上手工推导这个恒等式，再测量它节省的内存，逐步讲解 minitensor 的实现（`minitensor/core/ops/flash_attention.py`）及其反向传播，说明 `MultiHeadAttention` 如何决定何时流式计算，最后在 2048 个字符的窗口上训练字符级语言模型。
#
# 参考资料：D2L 的注意力一章，中文版《动手学深度学习》（zh.d2l.ai）的 10.3 注意力评分函数（掩蔽 softmax）、10.6 自注意力和位置编码（计算复杂度：自注意力的代价随序列长度呈二次增长）和 10.7 Transformer（解码器的因果掩蔽），以及英文版 *Dive into Deep Learning*（d2l.ai）的 11.3 "Attention Scoring Functions"、11.6 "Self-Attention and Positional Encoding" 和 11.7 "The Transformer Architecture"；语言模型就是 8.3 语言模型和数据集 / 9.3 "Language Models" 中的那个。书中总是构建整个矩阵；流式计算来自后来的论文（列在文末）：在线 softmax 出自 Milakov 和 Gimelshein（2018），内存随序列长度线性增长的注意力出自 Rabe 和 Staats（2021），FlashAttention 出自 Dao 等人（2022），FlashAttention-2 的循环顺序出自 Dao（2023）。

# %%
import dataclasses
import math
import pathlib
import tempfile
import time
import tracemalloc

import minitensor.nn.functional as F
import numpy
from _tutorial import SMOKE, expect_error, figure_path, pick, text  # noqa: F401  （共用的辅助函数；text：图的标签）
from matplotlib.figure import Figure
from minitensor.nn.attention import FUSED_MIN_LENGTH, plain_attention
from minitensor.ops.flash_attention import BLOCK_K, BLOCK_Q, flash_attention, stream_plan

import minitensor as mt
from minitensor.data import unigram_baseline
from minitensor.train import TrainConfig, train
from minitensor.train.config import build_data, build_model

TUTORIAL = "10_flash_attention"
mt.manual_seed(0)
rng = numpy.random.default_rng(0)
MiB = 2**20
print("smoke mode" if SMOKE else "full mode")

# %% [markdown]
# ## 1. 一次一块键的 softmax
#
# 教程 3 把一个查询的权重写成其评分 $s_1, \dots, s_n$ 的掩蔽 softmax（查询不能看到的键有 $s_j = -\infty$，因此其权重 $e^{-\infty} = 0$）：
#
# $$\alpha_j = \frac{e^{s_j - m}}{\ell}, \qquad m = \max_j s_j, \qquad \ell = \sum_j e^{s_j - m}, \qquad
# \mathbf{o} = \sum_j \alpha_j \mathbf{v}_j = \frac{1}{\ell} \sum_j e^{s_j - m}\, \mathbf{v}_j .$$
#
# 减去该行的最大值 $m$ 在数学上不改变任何结果，却让每个指数都不超过 1，因而不会上溢（D2L 在 3.7 softmax回归的简洁实现 / 4.5 "Concise Implementation of Softmax Regression" 中解释了这一平移，以及建立在它之上的 LogSumExp 技巧）。但这样似乎必须先拿到整行：$m$ 是所有键上的最大值。**在线 softmax**（Milakov 和 Gimelshein 2018）消除了这一要求：把键分块读入，每行只保留三样东西，即目前见过的最大评分 $m$、对已见过的键求的和 $\ell = \sum e^{s_j - m}$，以及对同样这些键求的*未归一化*输出 $\mathbf{o} = \sum e^{s_j - m} \mathbf{v}_j$。新的一块到来时，最大值可能增大到 $m'$，已经累加的每一项都必须改为相对于 $m'$ 来表示，而这只需一次乘法，因为 $e^{s_j - m} \cdot e^{m - m'} = e^{s_j - m'}$：
#
# $$m' = \max\big(m, \max_{j \in \text{block}} s_j\big), \qquad
# \ell' = \ell\, e^{m - m'} + \sum_{j \in \text{block}} e^{s_j - m'}, \qquad
# \mathbf{o}' = \mathbf{o}\, e^{m - m'} + \sum_{j \in \text{block}} e^{s_j - m'} \mathbf{v}_j .$$
#
# 处理完最后一块之后，$\mathbf{o} / \ell$ *就是*按 softmax 加权的和，分毫不差（每一项都带有同一个因子 $e^{-m}$，除法把它消去了）；而 $\text{lse} = m + \log \ell = \log \sum_j e^{s_j}$，即该行的 **log-sum-exp**，是日后重新计算任意权重所需的那一个数：$\alpha_j = e^{s_j - \text{lse}}$。
#
# 下面手工演算两个查询、六个键，键分成两块，每块三个；查询 0 不能看到键 4（那正是它评分最高的键，所以掩蔽确实起作用）：

# %%
S = numpy.array(
    [
        [1.0, 3.0, 2.0, 0.5, 4.0, 1.5],  # 查询 0
        [2.0, 0.0, 1.0, 3.0, 1.0, 2.5],  # 查询 1
    ]
)
allowed = numpy.ones_like(S, dtype=bool)
allowed[0, 4] = False  # 查询 0 不能关注键 4
V = numpy.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [2.0, 0.0], [0.0, 2.0], [1.0, -1.0]])  # 6 个大小为 2 的值


def online_softmax(S, allowed, V, blocks, show=True):
    """softmax(S masked) @ V, reading the keys block by block: the running max m, sum l and output o."""
    s_all = numpy.where(allowed, S, -numpy.inf)
    m = numpy.full(len(S), -numpy.inf)  # 目前见过的最大评分
    l = numpy.zeros(len(S))  # 对已见过的键求 exp(s - m) 之和
    o = numpy.zeros((len(S), V.shape[1]))  # 对已见过的键求 exp(s - m) v 之和
    for j0, j1 in blocks:
        s = s_all[:, j0:j1]
        m_new = numpy.maximum(m, s.max(axis=1))
        shift = numpy.where(m_new == -numpy.inf, 0.0, m_new)  # 尚未见过任何键的行：平移 0
        p = numpy.exp(s - shift[:, None])
        rescale = numpy.exp(m - shift)  # exp(m - m')：旧的和缩小多少
        l = l * rescale + p.sum(axis=1)
        o = o * rescale[:, None] + p @ V[j0:j1]
        m = m_new
        if show:
            print(f"after keys {j0}..{j1 - 1}: m = {m}, rescale = {rescale.round(4)}, l = {l.round(4)}")
            print(f"{'':20}o = {o.round(4).tolist()}")
    seen = l > 0
    out = o / numpy.where(seen, l, 1.0)[:, None]  # 没见过任何键的行保持 o = 0
    lse = numpy.where(seen, m + numpy.log(numpy.where(seen, l, 1.0)), numpy.inf)
    return out, lse


out, lse = online_softmax(S, allowed, V, blocks=[(0, 3), (3, 6)])
reference = mt.masked_softmax(mt.tensor(S), mask=mt.tensor(allowed)).numpy() @ V
print("o / l          =", out.round(6).tolist())
print("softmax(S) @ V =", reference.round(6).tolist())
log_sum_exp = numpy.log(numpy.where(allowed, numpy.exp(S), 0.0).sum(axis=1))  # log sum_j e^(s_j)，只含允许的键
print("m + log l      =", lse.round(6).tolist(), "  log sum_j e^(s_j):", log_sum_exp.round(6).tolist())
assert numpy.abs(out - reference).max() < 1e-12, "the online softmax is the softmax, exactly"
assert numpy.abs(lse - log_sum_exp).max() < 1e-12, "lse = m + log l = log sum_j e^(s_j)"
weights = numpy.where(allowed, numpy.exp(S - lse[:, None]), 0.0)
assert numpy.allclose(weights, mt.masked_softmax(mt.tensor(S), mask=mt.tensor(allowed)).numpy(), atol=1e-12), (
    "any weight comes back from its score and the row's lse: alpha_j = exp(s_j - lse)"
)
one_block, _ = online_softmax(S, allowed, V, blocks=[(0, 6)], show=False)
per_key, _ = online_softmax(S, allowed, V, blocks=[(j, j + 1) for j in range(6)], show=False)
assert numpy.abs(one_block - reference).max() < 1e-12 and numpy.abs(per_key - reference).max() < 1e-12, (
    "any split into blocks gives the same result: one block of 6, or 6 blocks of 1"
)

# %% [markdown]
# 看查询 0 的第二块：它的最大值仍是 3（键 4 的评分 4 被掩蔽了），所以重缩放因子（rescale）为 1；查询 1 的最大值从 2 增长到 3，旧的和在加上新项之前先乘以 $e^{2 - 3} \approx 0.368$。（在第一块中，重缩放因子是 $e^{-\infty - m'} = 0$：没有旧的东西需要保留。）
#
# ### 无键可看的行
#
# 教程 3 坚持：一个没有任何键可看的查询得到全零的权重，绝不会是 NaN。在线 softmax 在*一行的中途*也必须守住这个承诺：如果一行前面的块全被掩蔽，那么 $m = -\infty$，而教科书式的平移 $s_j - m = -\infty - (-\infty)$ 是 NaN。因此上面的代码中有一行是公式里没有的：当 $m' = -\infty$ 时改为平移 0，这样每个 $e^{s_j - 0} = e^{-\infty} = 0$；等到后面出现有限的最大值时，$e^{m - m'} = e^{-\infty} = 0$ 会干净地抹掉（本就为零的）旧的和。始终没见到任何键的行最后有 $\ell = 0$、$\mathbf{o} = \mathbf{0}$：输出为零。它的 log-sum-exp 在数学上是 $\log 0 = -\infty$；实现中却存为 **$+\infty$**，这样反向传播中的 $e^{s_j - \text{lse}}$ 就是 $e^{-\infty - \infty} = 0$，而不是 $e^{-\infty + \infty}$ = NaN。
#
# `flash_attention(q, k, v, ...)` 按 $\text{scale} \cdot \mathbf{q}^\top \mathbf{k}$ 计算评分；若键取单位矩阵、scale 取 1，评分就是 $\mathbf{q}$ 本身的各行，因此可以直接拿我们手造的评分来运行它。再加上第三个什么键都不能看的查询：

# %%
S3 = numpy.vstack([S, [[0.5, 1.0, 2.0, 1.0, 0.0, 3.0]]])
allowed3 = numpy.vstack([allowed, numpy.zeros((1, 6), dtype=bool)])  # 查询 2 不能关注任何键
with numpy.errstate(invalid="ignore"):
    naive = numpy.exp(numpy.full(6, -numpy.inf) - numpy.max(numpy.full(6, -numpy.inf)))  # 教科书式的平移
print("query 2 with the textbook shift s - m:", naive)
assert numpy.isnan(naive).all(), "-inf - (-inf) is NaN"

out3, lse3 = online_softmax(S3, allowed3, V, blocks=[(0, 3), (3, 6)], show=False)
fused3, fused_lse3 = flash_attention(
    mt.tensor(S3[None, None]),  # 查询：就是评分本身……
    mt.tensor(numpy.eye(6)[None, None]),  # ……对着单位矩阵的键
    mt.tensor(V[None, None]),
    mask=mt.tensor(allowed3),
    scale=1.0,
    block_q=2,
    block_k=3,  # 两块，每块三个键，与手工演算相同
    return_lse=True,
)
print("streamed output:", fused3.numpy()[0, 0].round(6).tolist())
print("streamed lse:   ", fused_lse3.numpy()[0, 0])
assert (out3[2] == 0).all() and lse3[2] == numpy.inf, "no key: a zero output and lse = +inf"
assert not numpy.isnan(fused3.numpy()).any(), "never NaN"
assert numpy.abs(fused3.numpy()[0, 0] - out3).max() < 1e-12 and numpy.array_equal(fused_lse3.numpy()[0, 0], lse3)
reference3 = mt.masked_softmax(mt.tensor(S3), mask=mt.tensor(allowed3)).numpy() @ V  # 教程 3 的零行
assert numpy.abs(fused3.numpy()[0, 0] - reference3).max() < 1e-12

# %% [markdown]
# > **要点。** 一行的 softmax 可以逐块计算：维护当前最大值 $m$、累计和 $\ell$ 和未归一化的输出 $\mathbf{o}$，每当最大值增长，就把旧的和乘以 $e^{m - m'}$ 重新缩放；$\mathbf{o}/\ell$ 是精确的答案，$m + \log \ell$ 则记住了这一行。没有键的行平移 0，结果为零，lse $= +\infty$。
#
# ## 2. 实测 (T, T) 矩阵的代价
#
# 分块循环在任何时刻都只需要一个分块（tile）的评分，即一块查询对一块键，因此它的内存应随 $T$ 增长，而不是随 $T^2$。我们来测量：一次批量大小为 1、8 个大小为 64 的头、float32 的因果自注意力，包括前向和反向传播，分别用普通层 `mt.nn.Attention("scaled_dot", "softmax")(q, k, v, causal=True)`（评分、掩蔽 softmax、权重 @ 值：都是 (batch, heads, T, T) 的数组，由计算图保留下来供反向传播使用；下文称为普通路径，输出中记作 plain）和 `flash_attention(q, k, v, causal=True)`（`BLOCK_Q` x `BLOCK_K` = 256 x 256 的分块；下文称为流式路径，输出中记作 fused，即融合）计算。
#
# 峰值内存由 Python 的 `tracemalloc` 测得：NumPy 把它分配的每个数组都报告给它（minitensor 的 numba 计算内核返回的数组也计算在内），因此 `tracemalloc.start()` 之后所分配内存的峰值，就是前向和反向传播期间同时存活的新数组内存的最大量（之前创建的输入不计在内），而且是在进程内部测得的。时间取不开 `tracemalloc` 时两次运行中最快的一次（冒烟模式下只有开着它的那一次），而 CPU 可能正忙于其他工作：只把它们当作数量级来看。

# %%
HEADS, D_HEAD = pick(8, 2), pick(64, 16)
LENGTHS = pick([256, 512, 1024, 2048], [256, 512, 1024])
plain_layer = mt.nn.Attention("scaled_dot", "softmax")


def plain_causal(q, k, v):
    return plain_layer(q, k, v, causal=True)


def fused_causal(q, k, v):
    return flash_attention(q, k, v, causal=True)


def forward_backward(attend, T):
    """One causal self-attention of batch 1, forward and backward: (peak bytes, seconds)."""
    q, k, v = (mt.randn(1, HEADS, T, D_HEAD, requires_grad=True) for _ in range(3))
    G = mt.randn(1, HEADS, T, D_HEAD)  # 到达输出的梯度
    tracemalloc.start()  # 从这里开始，每个新数组都被计入
    start = time.perf_counter()
    (attend(q, k, v) * G).sum().backward()
    times = [time.perf_counter() - start]
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    for _ in range(pick(2, 0)):  # 不开 tracemalloc（它会拖慢 Python）再计时：取最快的一次
        q.grad = k.grad = v.grad = None
        start = time.perf_counter()
        (attend(q, k, v) * G).sum().backward()
        times.append(time.perf_counter() - start)
    return peak, min(times)


for attend in (plain_causal, fused_causal):  # 预热：numba 在首次使用时编译（或加载）它的计算内核
    q, k, v = (mt.randn(1, HEADS, 512, D_HEAD, requires_grad=True) for _ in range(3))
    attend(q, k, v).sum().backward()
memory = {"plain": [], "fused": []}
seconds = {"plain": [], "fused": []}
print(f"batch 1, {HEADS} heads of size {D_HEAD}, float32, causal, forward + backward")
print("     T | one (T,T) array |  plain peak |  fused peak | plain/fused |  plain time |  fused time")
for T in LENGTHS:
    for name, attend in (("plain", plain_causal), ("fused", fused_causal)):
        peak, secs = forward_backward(attend, T)
        memory[name].append(peak)
        seconds[name].append(secs)
    array = HEADS * T * T * 4  # 一个 (batch, heads, T, T) 的 float32 数组
    print(
        f"{T:>6} | {array / MiB:>11.1f} MiB | {memory['plain'][-1] / MiB:>7.1f} MiB | "
        f"{memory['fused'][-1] / MiB:>7.1f} MiB | {memory['plain'][-1] / memory['fused'][-1]:>10.1f}x | "
        f"{seconds['plain'][-1] * 1e3:>8.0f} ms | {seconds['fused'][-1] * 1e3:>8.0f} ms"
    )
    assert memory["plain"][-1] > 2 * array, "the plain path holds the scores and the weights at once, and more"
array = HEADS * LENGTHS[-1] ** 2 * 4
print(f"at T = {LENGTHS[-1]} the plain peak is {memory['plain'][-1] / array:.1f} (T, T) arrays")
assert memory["fused"][-1] < array, "the streamed path never holds even one (T, T) array"
growth_plain = memory["plain"][-1] / memory["plain"][-2]
growth_fused = memory["fused"][-1] / memory["fused"][-2]
print(f"doubling T from {LENGTHS[-2]} to {LENGTHS[-1]}: plain peak x{growth_plain:.2f}, fused peak x{growth_fused:.2f}")
assert growth_plain > 3.0 and growth_fused < 2.5, "quadratic (x4 per doubling) against linear (x2)"

# %% [markdown]
# 普通路径的峰值是好几个 $(T, T)$ 数组：乘积 $QK^\top$、缩放后的评分和权重都一直存活到反向传播（计算图保留每个运算的输入，softmax 还保留它的输出），随后反向传播又生成同样大小的权重梯度和评分梯度。$T$ 每翻一倍，它就乘以 4。流式路径保存 $Q$、$K$、$V$、输出、它们的梯度以及每行一个数（都随 $T$ 线性增长），外加每个头几个 256 x 256 的分块，与 $T$ 无关；它的峰值至多随 $T$ 线性增长（在较短的长度上，分块的固定开销占主导，增长得更慢）。
#
# 时间则是另一回事。流式路径跳过因果对角线上方的分块（几乎一半的工作量），但它要把评分计算两次（反向传播中再算一次），并且在 Python 循环中执行许多小矩阵乘法，而普通路径执行的是少数几个大矩阵乘法，由 NumPy 的 BLAS 高效完成；在 CPU 上哪个更快，取决于 $T$ 和机器。在 FlashAttention 诞生的 GPU 上，时间上的收益来自把一个分块留在芯片上快速的片上内存（SRAM）中，而不是把 (T, T) 数组写入 GPU 的主存再读回来：主存是高带宽存储器（HBM），它不在芯片上，而是堆叠在芯片旁、同一封装之内，容量比 SRAM 大得多，带宽却只有它的十分之一左右（A100 上是 1.5–2.0 TB/s 对约 19 TB/s：Dao 等人 2022，第 2.1 节和第 3 节；GPU 内存见 D2L 12.4 / 13.4）；NumPy 无法表达这一点，所以这里的收获在于内存。`python bench/long_attention.py` 对两条路径（以及 PyTorch）做了更仔细的测量：交错采样，每个内存数据都用一个新进程测得。
#
# > **要点。** 实测表明，普通注意力的峰值内存按 $T^2$ 增长（为反向传播保留了好几个评分大小的数组），流式注意力的则按 $T$ 增长：在 2048 个词元、8 个头时，是几百 MiB 对几十 MiB。
#
# ## 3. 逐个分块的循环
#
# 下面是用 NumPy 写的单个头的完整前向传播：查询分块（外层循环），键也分块（内层循环），带有因果掩蔽，并跳过它留下的空分块。它就是第 1 节的在线 softmax，只不过一次对一块查询行运行：


# %%
def streamed_attention(q, k, v, block=4, causal=False):
    """softmax(q k^T / sqrt(d)) v for one head, q (Q, d), k and v (K, d): (output, lse).
    causal: query i sees keys j <= i (queries and keys at the same positions)."""
    Q, d = q.shape
    out, lse = numpy.zeros((Q, v.shape[1])), numpy.full(Q, numpy.inf)
    for i0 in range(0, Q, block):
        qi = q[i0 : i0 + block] / math.sqrt(d)  # 一块查询，只缩放一次
        i = numpy.arange(i0, i0 + len(qi))[:, None]  # 它们的位置
        m, l, o = numpy.full(len(qi), -numpy.inf), numpy.zeros(len(qi)), numpy.zeros((len(qi), v.shape[1]))
        for j0 in range(0, len(k), block):
            if causal and j0 > i[-1, 0]:
                continue  # 这个分块的每个键都在每个查询的未来：跳过
            j = numpy.arange(j0, min(j0 + block, len(k)))  # 一块键
            s = qi @ k[j].T  # 这个分块的评分
            if causal:
                s = numpy.where(j <= i, s, -numpy.inf)
            m_new = numpy.maximum(m, s.max(axis=1))
            shift = numpy.where(m_new == -numpy.inf, 0.0, m_new)
            p = numpy.exp(s - shift[:, None])
            rescale = numpy.exp(m - shift)
            l, o, m = l * rescale + p.sum(axis=1), o * rescale[:, None] + p @ v[j], m_new
        seen = l > 0
        out[i0 : i0 + len(qi)] = o / numpy.where(seen, l, 1.0)[:, None]
        lse[i0 : i0 + len(qi)] = numpy.where(seen, m + numpy.log(numpy.where(seen, l, 1.0)), numpy.inf)
    return out, lse


T, d = 10, 3  # 10 个位置，每块 4 个：共三块，最后一块不满
q, k, v, dO = (rng.standard_normal((T, d)) for _ in range(4))
ours, ours_lse = streamed_attention(q, k, v, block=4, causal=True)
Q4, K4, V4 = (mt.tensor(x[None, None], requires_grad=True) for x in (q, k, v))  # (批量 1, 头 1, T, d)，float64
fused_out, fused_lse = flash_attention(Q4, K4, V4, causal=True, block_q=4, block_k=4, return_lse=True)
plain64 = mt.nn.Attention("scaled_dot", "softmax", dtype=mt.float64)
Q4p, K4p, V4p = (mt.tensor(x[None, None], requires_grad=True) for x in (q, k, v))
plain_out = plain64(Q4p, K4p, V4p, causal=True)
print("largest difference, our loop vs flash_attention:", numpy.abs(ours - fused_out.numpy()[0, 0]).max())
print("largest difference, our loop vs the plain layer:", numpy.abs(ours - plain_out.numpy()[0, 0]).max())
assert numpy.abs(ours - fused_out.numpy()[0, 0]).max() < 1e-10, "our loop computes what flash_attention computes"
assert numpy.abs(ours_lse - fused_lse.numpy()[0, 0]).max() < 1e-10
assert numpy.abs(ours - plain_out.numpy()[0, 0]).max() < 1e-10, "... and what the plain softmax path computes"

# %% [markdown]
# `flash_attention`（`FlashAttention.forward`）就是这个循环，只是每个数组都以批量和头作为前导轴，于是每个分块是一次批量矩阵乘法；掩蔽、偏置和跳过的规则都放在一个 `StreamPlan` 中（`plan.scores(...)` 构建一个分块的评分，`plan.visits(...)` 决定一个分块是否运行）。有两处细节不同：查询在整个调用中只乘一次缩放因子；分块的两次矩阵乘法之间的逐元素步骤（求最大值、平移、求指数、求和）在分块的评分上原地进行，因此每个分块在每个头上只占一个 (block, block) 数组。
#
# ### 反向传播：重新计算，而不是存储
#
# 普通路径的反向传播读取它保留的权重 $P$。流式路径只保留了 $O$ 和每行的 lse，并由它们重新计算每个分块的权重 $P_{ij} = e^{s_{ij} - \text{lse}_i}$（这正是 lse 的用途）。记 $dO$ 为到达输出的梯度，对 $O = PV$ 和 softmax 应用链式法则，得到
#
# $$dV = P^\top dO, \qquad dP = dO\, V^\top, \qquad dS_{ij} = P_{ij}\,(dP_{ij} - D_i), \qquad
# D_i = \sum_j P_{ij}\, dP_{ij} = \sum_c dO_{ic}\, O_{ic},$$
#
# $$dQ = \text{scale}\cdot dS\, K, \qquad dK = \text{scale}\cdot dS^\top Q .$$
#
# softmax 的反向传播需要 $D_i = \sum_j P_{ij} dP_{ij}$，这是对一整行键的求和，似乎又要用到整行。最后一个等式（Dao 等人 2022，附录 B）避开了这一点：$\sum_j P_{ij} (dO_i \cdot v_j) = dO_i \cdot \sum_j P_{ij} v_j = dO_i \cdot O_i$，即在循环开始前由保存的输出算出的每行一个数。这样每个分块只需要它自己的 $P$、$dP$ 和该行的 $D$。循环顺序采用 FlashAttention-2（Dao 2023）的：前向传播把查询块放在外层（如上所示：一个块的 $m$、$\ell$ 和 $\mathbf{o}$ 在它处理完之前一直是局部的，而最初的 FlashAttention 把键块放在外层，每处理一块都要更新内存中的输出），并且只保存 lse 这一个数，而不是 $m$ 和 $\ell$ 两个；反向传播则把键块放在外层、查询块放在内层，使一个键块的 $dK$ 和 $dV$ 原地累加，而 $dQ$ 从每个键块收集一份贡献。下面在整个矩阵上使用这些公式（$P$ 由 lse 得到），并与 `flash_attention` 和普通层的梯度作对比：

# %%
(fused_out * mt.tensor(dO[None, None])).sum().backward()
(plain_out * mt.tensor(dO[None, None])).sum().backward()
scale = 1 / math.sqrt(d)
i, j = numpy.indices((T, T))
s = numpy.where(j <= i, q @ k.T * scale, -numpy.inf)
P = numpy.exp(s - ours_lse[:, None])  # 由 lse 重新计算的权重
dP = dO @ v.T
D = (dO * ours).sum(axis=1)
assert numpy.allclose(D, (P * dP).sum(axis=1), atol=1e-12), "D_i = sum_j P_ij dP_ij = dO_i . O_i"
dS = P * (dP - D[:, None])
by_hand = {"dQ": scale * dS @ k, "dK": scale * dS.T @ q, "dV": P.T @ dO}
for name, fused_leaf, plain_leaf in (("dQ", Q4, Q4p), ("dK", K4, K4p), ("dV", V4, V4p)):
    fused_grad, plain_grad = fused_leaf.grad.numpy()[0, 0], plain_leaf.grad.numpy()[0, 0]
    print(
        f"{name}: formulas vs flash_attention {numpy.abs(by_hand[name] - fused_grad).max():.1e}, "
        f"flash_attention vs plain {numpy.abs(fused_grad - plain_grad).max():.1e}"
    )
    assert numpy.abs(by_hand[name] - fused_grad).max() < 1e-10 and numpy.abs(fused_grad - plain_grad).max() < 1e-10

# %% [markdown]
# 与普通路径一致是一种检验；`mt.gradcheck`（教程 8）是另一种独立的检验，它与有限差分对比，不需要第二个实现。下面用它在 2 x 2 的分块上、在分组的头和因果掩蔽下，检验查询、键、值*以及*一张相对偏置表（见下文“偏置与分组的头”一节）的梯度：


# %%
def leaf(*shape):
    """A random float64 tensor that requires grad."""
    return mt.tensor(rng.standard_normal(shape), requires_grad=True)


Tg = 5
assert mt.gradcheck(
    lambda q, k, v, table: flash_attention(q, k, v, causal=True, relative_bias=table, block_q=2, block_k=2),
    [leaf(1, 4, Tg, 3), leaf(1, 2, Tg, 3), leaf(1, 2, Tg, 3), leaf(4, 2 * Tg - 1)],
)
print("gradcheck: queries, keys, values and the bias table of flash_attention pass")

# %% [markdown]
# ### 从不运行的分块
#
# 因果掩蔽会让第一个键位于最后一个查询之后的每个分块都成为空的：上面的循环跳过它（`continue`），`flash_attention` 在前向和反向传播中也都跳过它（`StreamPlan.visits`）。若每个轴上有 $n$ 块，则 $n^2$ 个分块中只有 $n(n+1)/2$ 个运行：2048 个词元、每块 256 时是 64 个中的 36 个，比整个矩阵工作量的一半略多。滑动窗口（教程 9）留下的是一条带：窗口为 256 个键时，每一行分块只运行两个。下面的计划是为 2048 个位置构建的，从不真正计算（`stream_plan` 只检查形状并记下掩蔽）：

# %%
Tt = 2048
tiny = mt.zeros(1, 1, Tt, 1)  # 对计划来说只有形状是重要的
SlidingWindow = mt.plugins.lookup("positional encoding", "sliding_window")
window_table = SlidingWindow(1, window=256).relative_bias(-(Tt - 1), Tt - 1)  # 256 个位置以内为 0，以外为 -inf
plans = {
    "causal": stream_plan(tiny, tiny, tiny, causal=True),
    "causal, window 256": stream_plan(tiny, tiny, tiny, causal=True, relative_bias=window_table, window=256),
}
grids = {}
for name, plan in plans.items():
    grids[name] = numpy.array(
        [[plan.visits(i0, i1, j0, j1) for j0, j1 in plan.key_blocks()] for i0, i1 in plan.query_blocks()]
    )
n = Tt // BLOCK_Q
print(f"tiles of {BLOCK_Q} queries (rows) x {BLOCK_K} keys (columns), # = computed, . = skipped")
for row in range(n):
    print("   ".join("".join("#" if x else "." for x in grid[row]) for grid in grids.values()))
for name, grid in grids.items():
    print(f"{name}: {grid.sum()} of {grid.size} tiles run")
assert grids["causal"].sum() == n * (n + 1) // 2 and (grids["causal"] == numpy.tri(n, dtype=bool)).all()
assert grids["causal, window 256"].sum() == n + (n - 1), "the diagonal tiles and the ones just below them"

# %% [markdown]
# ### 偏置与分组的头
#
# 教程 9 的相对注意力偏置同样可以流式计算，而且永远不必成为一个 $(Q, K)$ 矩阵。只依赖距离 $j - i$ 的偏置在每个头上只有 $Q + K - 1$ 个不同的值：`relative_bias(min_distance, max_distance)` 把它们作为一张 (heads, Q + K - 1) 的表返回，每个分块从表中读取自己的格子，$B_{h,i,j} = \text{table}[h, (j - i) + (Q - 1)]$（查询和键都从位置 0 开始时）。当这张表是学习得到的（T5 的相对位置分桶）时，它的梯度在反向传播中按距离累加。分组查询的头（教程 9 第 5 节）也不需要复制：共享同一个键/值头的 $r$ 个查询头被堆叠成一个含 $r \cdot n$ 个查询的块，因此一个分块仍然只是与该组的键的一次乘法。下面把两者都与普通层（使用稠密的偏置和重复的键）作对比：

# %%
ALiBi = mt.plugins.lookup("positional encoding", "alibi")
Tb, H, g = 12, 4, 2  # 4 个查询头共享 2 个键/值头
alibi = ALiBi(H, dtype=mt.float64)
table = alibi.relative_bias(-(Tb - 1), Tb - 1)  # (4, 23)：距离 -11 .. 11 各占一列
dense = alibi(Tb, Tb)  # (4, 12, 12)：普通路径加到评分上的偏置
i, j = numpy.indices((Tb, Tb))
assert numpy.array_equal(dense.numpy(), table.numpy()[:, j - i + Tb - 1]), (
    "the dense bias is the table, read by distance"
)
qg, kg, vg = leaf(2, H, Tb, 8), leaf(2, g, Tb, 8), leaf(2, g, Tb, 8)
streamed = flash_attention(qg, kg, vg, causal=True, relative_bias=table, block_q=4, block_k=4)
repeated = [x.unsqueeze(2).expand(2, g, H // g, Tb, 8).reshape(2, H, Tb, 8) for x in (kg, vg)]  # 头 h 读取 h // 2
plain = plain64(qg, *repeated, causal=True, bias=dense)
print(
    f"ALiBi table {tuple(table.shape)} instead of a bias {tuple(dense.shape)}; grouped heads: q {tuple(qg.shape)}, "
    f"k {tuple(kg.shape)}; largest difference to the plain layer {numpy.abs(streamed.numpy() - plain.numpy()).max():.1e}"
)
assert numpy.abs(streamed.numpy() - plain.numpy()).max() < 1e-10

# %% [markdown]
# > **要点。** 前向传播就是在线 softmax 外面套两层循环；反向传播由 lse 重新计算每个分块的权重，每行只多需要一个数 $D_i = dO_i \cdot O_i$。空分块被跳过，相对偏置以每个头 $Q + K - 1$ 个值的表进入，分组的头以堆叠的查询块进入：任何大小为 $Q \times K$ 的东西都从未被构建。
#
# ## 4. 按需计算的权重
#
# 流式计算的层没有权重可以展示：教程 5 到 9 画成热图的 `attention_weights`，在一次流式调用之后是 None。它保留下来的东西，即投影后的查询和键以及每行的 lse，足以重新计算任何权重，因此 `MultiHeadAttention.attention_weights_for(heads, rows)` 返回所请求的头和查询行的权重，形状为 (batch, len(heads), len(rows), K)，且只计算包含这些行的查询块的分块。画长序列中几行的热图，代价只是几块行，而不是整个矩阵。
#
# 两个孪生层，一个流式计算（`fused=True`），一个走普通路径（`fused=False`），权重相同（`load_state_dict`），都运行一次带 ALiBi 的因果自注意力：

# %%
Tw, hidden = pick(1024, 300), 64
streaming = mt.nn.MultiHeadAttention(hidden, 4, positional="alibi", fused=True).eval()
twin = mt.nn.MultiHeadAttention(hidden, 4, positional="alibi", fused=False).eval()
twin.load_state_dict(streaming.state_dict())
X = mt.randn(1, Tw, hidden)
with mt.no_grad():
    out_streamed = streaming(X, X, X, causal=True)
    out_plain = twin(X, X, X, causal=True)
assert numpy.abs(out_streamed.numpy() - out_plain.numpy()).max() < 1e-5, "the same layer, float32 rounding apart"
assert streaming.attention_weights is None and twin.attention_weights is not None
heads, rows = [0, 3], [0, Tw // 2, Tw - 1]
recomputed = streaming.attention_weights_for(heads=heads, rows=rows).numpy()
kept = twin.attention_weights.numpy()[:, heads][:, :, rows]
print(
    f"streamed layer: attention_weights = {streaming.attention_weights}; attention_weights_for(heads={heads}, "
    f"rows={rows}) -> {recomputed.shape}"
)
print(f"largest difference to the plain twin's kept weights: {numpy.abs(recomputed - kept).max():.1e}")
assert numpy.abs(recomputed - kept).max() < 1e-6
assert numpy.allclose(recomputed.sum(axis=-1), 1.0, atol=1e-5), "each recomputed row is a distribution"
assert (recomputed[0, :, 0, 1:] == 0).all(), "row 0 sees only key 0: causal"
band = list(range(Tw - 48, Tw))  # 最后 48 个查询，用于作图
last_rows = streaming.attention_weights_for(heads=heads, rows=band).numpy()[0][:, :, Tw - 48 :]
with plain_attention(streaming), mt.no_grad():  # 捷径：同一个层，只在这一次传递中走普通路径
    streaming(X, X, X, causal=True)
assert streaming.attention_weights is not None and streaming.fused is True, "full weights kept; the setting is back"
assert numpy.abs(streaming.attention_weights.numpy()[:, heads][:, :, rows] - recomputed).max() < 1e-6

# %% [markdown]
# 上面最后几行用到的 `minitensor.nn.attention.plain_attention(model)`，在一个 `with` 块的范围内把模型中的每个 `MultiHeadAttention` 都切换到普通路径：要为一次本会流式计算的传递画出完整的热图，就用这个办法（训练运行自己的图就是这样画的）。本教程的图：第 2 节测得的内存，以及两个头中最后 48 个查询重新计算出的权重（代码中的下标是 0 和 3；图的标题与教程 9 和库自己的图一样，从 1 开始给头编号），各用自己的颜色刻度。ALiBi 最陡的头只看最近的键，最平缓的头则几乎均匀地看所有的键。

# %%
fig = Figure(figsize=(13, 3.8), layout="constrained")
ax_memory, *ax_heads = fig.subplots(1, 3, gridspec_kw={"width_ratios": [1.3, 1, 1]})
lengths = numpy.array(LENGTHS)
for name, style in (("plain", "o-"), ("fused", "s-")):
    ax_memory.loglog(lengths, numpy.array(memory[name]) / MiB, style, base=2, label=text(f"{name} (measured)"))
ax_memory.loglog(lengths, HEADS * lengths**2 * 4 / MiB, "k:", base=2, label=text("one (T, T) array"))
ax_memory.set(
    xlabel=text("sequence length T"),
    ylabel=text("peak memory (MiB)"),
    title=text("causal, forward + backward, {heads} heads", heads=HEADS),
)
ax_memory.legend()
slopes = streaming.positional.slopes.numpy()
for ax, h, w in zip(ax_heads, heads, last_rows):
    image = ax.imshow(w, cmap="Reds", extent=(Tw - 48.5, Tw - 0.5, Tw - 0.5, Tw - 48.5))
    ax.set(
        xlabel=text("key position"),
        ylabel=text("query position"),
        title=text("head {h} (ALiBi slope 1/{inverse:.0f})", h=h + 1, inverse=1 / slopes[h]),
    )
    fig.colorbar(image, ax=ax, shrink=0.8)
fig.suptitle(text("streamed attention: memory linear in T; weights recomputed on demand from lse (last 48 queries)"))
fig.savefig(figure_path(TUTORIAL, "flash_attention.png"), dpi=100)
print("wrote", figure_path(TUTORIAL, "flash_attention.png"))

# %% [markdown]
# > **要点。** 流式计算的层不保留权重，但保留了让重新计算变得廉价的东西：`attention_weights_for(heads, rows)` 给出你想看的那些行，与普通路径的相同；`plain_attention(model)` 则为一次传递给出完整的矩阵。
#
# ## 5. 层何时流式计算：`fused="auto"` 与 `why_not_fused`
#
# `MultiHeadAttention(..., fused=...)` 接受三种取值。`False`：总是走普通路径。`True`：总是流式计算，如果这个层做不到就立即报错。`"auto"`（默认值）：在结果精确且值得时流式计算，也就是查询和键的长度都至少为 `FUSED_MIN_LENGTH` = 384（短于此长度时，普通路径少数几个大数组运算胜过分块循环），并且层中没有任何需要权重本身的东西。`layer.why_not_fused()` 用一句话说明障碍是什么，没有障碍时返回 None。流式计算按 $\text{scale} \cdot \mathbf{q}^\top\mathbf{k}$ 计算评分，再用 softmax 汇聚，因此它要求评分函数为 `dot` 或 `scaled_dot`、汇聚为 `softmax`，并且注意力偏置是相对的（一张按距离的表）。

# %%
layer = mt.nn.MultiHeadAttention(32, 4).eval()  # fused="auto"（默认值）
for length in (16, FUSED_MIN_LENGTH):
    with mt.no_grad():
        Xl = mt.randn(1, length, 32)
        layer(Xl, Xl, Xl)
    path = "plain (weights kept)" if layer.attention_weights is not None else "streamed (no weights kept)"
    print(f"fused='auto', {length:>4} tokens: {path}")
    assert (layer.attention_weights is None) == (length >= FUSED_MIN_LENGTH)

for options in ({"scorer": "additive"}, {"pooling": "sparsemax"}, {"dropout": 0.1}):
    print(f"{options}: {mt.nn.MultiHeadAttention(32, 4, **options).why_not_fused()}")
assert mt.nn.MultiHeadAttention(32, 4, dropout=0.1).why_not_fused() is None, "dropout streams too"
assert mt.nn.MultiHeadAttention(32, 4, scorer="additive").why_not_fused() is not None

with expect_error("fused=True on a layer with the additive scorer", ValueError) as caught:
    mt.nn.MultiHeadAttention(32, 4, scorer="additive", fused=True)
assert "additive" in str(caught.error)

# %% [markdown]
# 权重上的暂退法（D2L 10.3 中的 `self.dropout(self.attention_weights)`）看起来需要它所丢弃的那些权重，而流式计算从不持有它们。它只需要一次一个分块的权重：暂退法作用在 softmax 之后，即 $(M \odot P)\,V$，其中 $M$ 是按 $1/(1 - p)$ 缩放的掩码，因此累计和 $l$ 仍然加上每一个权重（softmax 的分母不被丢弃），只有累计输出 $\mathbf{o}$ 只加上被保留的那些。反向传播需要同一个掩码，而它并没有被存下来：minitensor 的暂退法从一个*基于计数器*的生成器取随机数，权重 $(b, h, i, j)$ 的随机数是 (种子, 它在整个 (batch, heads, Q, K) 权重中的下标) 的哈希值，所以每个分块都能在反向传播中像在前向传播中一样重新生成自己那一部分掩码（FlashAttention 用 Philox 生成器做同样的事）。在反向传播中，$dV = (M \odot P)^\top dO$，$dP = M \odot (dO\,V^\top)$，而行和 $D_i = dO_i \cdot O_i$ 不需要改变。由于下标是整个矩阵中的下标，在种子相同时，流式计算丢弃的正是 `mt.dropout` 从普通路径的权重中丢弃的那些：

# %%
mt.manual_seed(3)
dropping = {fused: mt.nn.MultiHeadAttention(32, 4, dropout=0.2, fused=fused) for fused in (False, True)}
dropping[True].load_state_dict(dropping[False].state_dict())
Xd = mt.randn(2, 40, 32)
outs = {}
for fused, layer in dropping.items():  # 两者都处于训练模式：暂退法起作用
    mt.manual_seed(7)  # 两条路径的暂退法使用同一个种子
    outs[fused] = layer(Xd, Xd, Xd, causal=True)
gap = float(numpy.abs(outs[True].numpy() - outs[False].numpy()).max())
print(f"training, dropout 0.2: streamed vs plain, the same seed: max |difference| = {gap:.1e}")
assert gap < 1e-5 and dropping[True]._stream is not None and dropping[False]._stream is None
mt.manual_seed(8)
assert float(numpy.abs(dropping[True](Xd, Xd, Xd, causal=True).numpy() - outs[True].numpy()).max()) > 1e-3

# %% [markdown]
# ### PyTorch 的一次调用
#
# 为 PyTorch 写的模型用一个函数计算注意力，nanoGPT 就是这样：`F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False)`。`minitensor.nn.functional` 中也有它，规则与 PyTorch 相同：在 `fused="auto"` 会流式计算的地方流式计算，流式计算接不了的调用（浮点型的 `attn_mask`，它是加在评分上的稠密偏置）走普通路径。有一条规则与 minitensor 自己的 `causal=` 不同。查询比键少时，PyTorch 的 `is_causal` 让查询 $i$ 看到键 $j \le i$，即掩码的左上角；带缓存的解码器需要它的最后一个查询看到所有键，$j \le i + K - Q$，即右下角，这正是 minitensor 中 `causal=True` 的含义：

# %%
Xs = mt.randn(2, 4, 48, 8)  # (batch, heads, steps, d_head)：查询、键和值都是它
mine = flash_attention(Xs, Xs, Xs, causal=True)
theirs = F.scaled_dot_product_attention(Xs, Xs, Xs, is_causal=True)  # PyTorch 的调用，即 nanoGPT 的调用
gap = float(numpy.abs(mine.numpy() - theirs.numpy()).max())
print(f"F.scaled_dot_product_attention vs flash_attention, 48 x 48: max |difference| = {gap:.1e}")
assert gap < 1e-5
last = Xs[:, :, -1:]  # 只取最后一个查询，对着全部 48 个键
upper_left = F.scaled_dot_product_attention(last, Xs, Xs, is_causal=True)  # 只看到键 0
lower_right = flash_attention(last, Xs, Xs, causal=True)  # 看到每个键，与完整计算中一样
assert numpy.allclose(upper_left.numpy(), Xs[:, :, :1].numpy()), "one key: its value, weight 1"
assert numpy.allclose(lower_right.numpy(), mine[:, :, -1:].numpy(), atol=1e-6)

# %% [markdown]
#
# nanoGPT 的 `model.py` 的其余部分也能照原样在 minitensor 上运行：让 minitensor 代替 `torch` 来执行它（`bench/nanogpt_model.py`），从同样的权重出发，它给出与 PyTorch 相同的损失和梯度，在 CPU 上的训练速度也与 PyTorch 相当。
#
# 模型接受同样的参数（`TransformerEncoder(..., fused=...)` 及其他模型会把它传给每个层），训练运行也一样：`TrainConfig(fused="auto" | "on" | "off")`，`minitensor train --fused auto|on|off`。在 `--resume` 时可以更改它，因为它既不改变参数，也不改变结果。
#
# > **要点。** 当评分函数是点积、汇聚是 softmax、注意力偏置（如果有）是相对的时，`fused="auto"` 对 384 个词元及以上的序列进行流式计算，权重上的暂退法也包括在内（每个分块由种子重新生成自己那一部分掩码）；做不到时，`why_not_fused()` 说出原因，而 `fused=True` 把这个原因变成一个错误。
#
# ## 6. 回报：在 2048 个字符的窗口上训练语言模型
#
# `minitensor train --text FILE` 的字符级语言模型（D2L 8.3 / 9.3，实现为仅含解码器的 Transformer；`minitensor/train/config.py` 中的 `LM_RECIPE`：128 个隐藏单元、4 个头、2 个块）默认读取 128 个字符的窗口。使用 `--lm-num-steps 2048` 时，每个窗口有 2048 个字符，每个因果自注意力都有 2048 个查询和键，`fused="auto"` 会对它们流式计算。其他什么都不用改（模型按窗口的长度构建位置表），不过这里我们选用 ALiBi（教程 9）作为位置编码：它是加在评分上的偏置，因此流式计算会逐个分块地从它的 `relative_bias` 表中取值加上，这正是第 3 节的情形出现在一个真实模型中。
#
# 先做一个训练步，即批量大小为 1 的一次前向和反向传播，在两条路径上分别测量：使用 `fused="auto"` 的模型（在这个长度上会流式计算），以及使用 `fused="off"` 的同一个模型。

# %%
TEXT = str(pathlib.Path(mt.__file__).parent / "data" / "texts" / "time_machine.txt")
config = TrainConfig.recipe(
    "lm",
    text=TEXT,
    positional="alibi",
    lm_num_steps=pick(2048, 600),
    batch_size=1,
    steps=pick(24, 2),
    progress=False,
    **pick({}, {"num_hiddens": 32, "ffn_num_hiddens": 64, "num_heads": 2, "num_blks": 1, "max_examples": 8000}),
)
Tlm = config.lm_num_steps
assert config.fused == "auto" and Tlm >= FUSED_MIN_LENGTH
mt.manual_seed(config.seed)
data = build_data(config)
window = numpy.array(data.train[: Tlm + 1])
X_lm, Y_lm = mt.tensor(window[None, :-1]), mt.tensor(window[None, 1:])  # 预测每个位置的下一个字符

step = {}
for fused in ("off", "auto"):
    mt.manual_seed(config.seed)
    model = build_model(config.replace(fused=fused), data.src_vocab, data.tgt_vocab)
    mt.ops.cross_entropy(model(X_lm[:, :512]), Y_lm[:, :512]).backward()  # 预热：numba 的计算内核在首次使用时加载
    model.zero_grad()
    tracemalloc.start()
    start = time.perf_counter()
    loss = mt.ops.cross_entropy(model(X_lm), Y_lm)
    loss.backward()
    step[fused] = {
        "seconds": time.perf_counter() - start,
        "peak": tracemalloc.get_traced_memory()[1],
        "loss": loss.item(),
    }
    tracemalloc.stop()
    attention_layers = [m for m in model.modules() if isinstance(m, mt.nn.MultiHeadAttention)]
    assert all((layer.attention_weights is None) == (fused == "auto") for layer in attention_layers), "auto streamed"

array = config.num_heads * Tlm**2 * 4  # 一个 (批量 1, heads, T, T) 的 float32 数组
print(f"one (1, {config.num_heads}, {Tlm}, {Tlm}) float32 array: {array / MiB:.1f} MiB")
for fused, measured in step.items():
    print(
        f"fused={fused!r:6}: loss {measured['loss']:.6f}, peak {measured['peak'] / MiB:6.1f} MiB "
        f"({measured['peak'] / array:4.1f} arrays), {measured['seconds']:.2f} s"
    )
assert abs(step["auto"]["loss"] - step["off"]["loss"]) < 1e-4, "the same model, the same loss"
assert step["off"]["peak"] > 2 * config.num_blks * array, "plain: at least scores and weights of every layer"
assert step["auto"]["peak"] < step["off"]["peak"] / 4
if not SMOKE:
    assert step["off"]["peak"] > 2 * (2 * config.num_blks * array), "more than twice the lower bound below"
    assert step["auto"]["peak"] < array, "the whole streamed step: less than one (T, T) array"

# %% [markdown]
# 按形状估算（完整模式的大小）：一个 (batch, heads, T, T) 的 float32 数组是 $1 \cdot 4 \cdot 2048^2 \cdot 4$ 字节 = 64 MiB。每一层的普通注意力至少要生成它的评分和权重，并为反向传播保留它们：2 个数组 x 2 层 = 256 MiB，这只是下界，反向传播还会再加上同样大小的梯度。计算图实际保留的更多（第 2 节）：$QK^\top$、缩放后的评分、ALiBi 稠密的 (heads, T, T) 偏置、加上偏置后的评分以及权重，每层 5 个数组，在反向传播开始之前两层共 640 MiB。上面测得的普通路径一步的峰值超过下界的两倍；而整个流式的一步，连同模型在内，都低于一个这样的数组。批量大小为 $B$ 时，所有大小为 $T \times T$ 的东西都会大 $B$ 倍：下面的留出集评估把 8 个 2048 字符的窗口作为一个批量运行，在普通路径上会让这些数组每个再大 8 倍（各 512 MiB）。
#
# 现在进行训练本身，用的是 `minitensor train` 所调用的同一个 `train`，全程由 `tracemalloc` 监视：数据、模型、Adam 的矩估计、每一步、留出集评估以及最终报告中的两个样本：

# %%
with tempfile.TemporaryDirectory() as folder:
    lines = []
    tracemalloc.start()
    result = train(dataclasses.replace(config, out=f"{folder}/run"), log=lines.append, figures=False)
    run_peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
print("\n".join(line for line in lines if not line.startswith("sample")))
losses = result.history["loss"]
print("training loss by step:", " ".join(f"{x:.2f}" for x in losses))
print(
    f"the whole run peaked at {run_peak / MiB:.1f} MiB of array memory; one step on the plain path peaked at "
    f"{step['off']['peak'] / MiB:.0f} MiB (measured above)"
)
vocab_size = len(data.tgt_vocab)
baseline = unigram_baseline(data.train, data.heldout, vocab_size)
print(
    f"{vocab_size} characters: log V = {math.log(vocab_size):.2f} nats (knowing nothing), unigram baseline "
    f"{baseline:.2f} (knowing how common each character is), held-out loss after {config.steps} steps "
    f"{result.heldout_loss:.2f}"
)
assert all(math.isfinite(x) for x in losses) and min(losses[1:]) < losses[0], "the loss falls"
if not SMOKE:
    assert numpy.mean(losses[-4:]) < losses[0] - 1.0, "a few dozen steps take the loss well below its start"
    assert result.heldout_loss < baseline, "... and below what character frequencies alone can do"
    assert run_peak < step["off"]["peak"], "the whole streamed run needs less than one plain step"
per_step = result.wall_time / config.steps  # 包含评估和采样：是一个上界
print(
    f"the run took {result.wall_time:.0f} s, {per_step:.1f} s a step with its evaluation; at that pace 1000 steps "
    f"of batch 1 would take about {1000 * per_step / 60:.0f} minutes here"
)

# %% [markdown]
# 训练损失从 $\log V$ 附近开始，这是一个把赌注平均押在 $V$ 个字符上的模型的损失；二十几步之内，留出集损失就低于一元语法（unigram）基线，即一个只知道每个字符有多常见的模型的损失：模型已经开始利用它的上下文，哪怕只是最后几个字符。每个位置都能看到 2047 个字符，模型能学会利用其中多少，需要一次真正的训练来回答，这只是耐心的问题；在命令行中运行：
#
# ```
# minitensor train --text minitensor/data/texts/time_machine.txt --lm-num-steps 2048 \
#     --positional alibi --batch-size 2 --steps 1000 --out runs/lm2048
# ```
#
# （不加 `--positional alibi` 时，运行沿用配方中加在输入上的正弦位置编码，它同样可以流式计算；批量大小为 2 时，每步大约需要上面打印的时间的两倍；`--fused off` 走普通路径以作比较：同样的数字，每步多用几百 MiB；`--fused on` 坚持流式计算，做不到时说明原因。）流式的一步是否也更快取决于机器（比较上面打印的两个时间）；这次运行要说明的是：窗口的长度不再受 $T^2$ 数组所需内存的限制。有了 2048 个字符的上下文，模型原则上可以利用一整页文字；一个只有 40 万个参数的模型能否学会这样做，则是另一个问题，也是一个好练习。
#
# > **要点。** 使用 `fused="auto"`，一个 2048 字符的窗口只需几十 MiB 的注意力内存就能训练，而普通路径每步需要几百 MiB；模型及其结果都没有任何变化。
#
# ## 小结
#
# - 在线 softmax 为每个查询行保存当前最大值 $m$、累计和 $\ell$ 和未归一化的输出 $\mathbf{o}$；当 $m$ 增长到 $m'$ 时，旧的和乘以 $e^{m - m'}$。处理完最后一块后，$\mathbf{o}/\ell$ 精确地就是 softmax 的输出，而 $\text{lse} = m + \log \ell$ 记住了这一行。
# - 完全被掩蔽的行平移 0 而不是 $-\infty$：结果为零，绝不是 NaN，且 lse $= +\infty$。
# - FlashAttention 在查询和键的分块上运行上述过程，并在反向传播中借助 $D_i = dO_i \cdot O_i$ 由 lse 重新计算权重；内存按 $T$ 而不是 $T^2$ 增长。
# - 在因果掩蔽和滑动窗口下不含任何允许的键的分块会被跳过；相对偏置以 (heads, Q + K - 1) 的表进入；分组的头以堆叠的查询块进入。
# - `MultiHeadAttention(fused="auto")` 在 384 个词元及以上且结果精确时流式计算；`why_not_fused()` 说明为什么不能；`attention_weights_for(heads, rows)` 按需重新计算权重。
#
# ## 练习
#
# 1. 在 T = 2048 时，对 b = 32、64、128、256、512 分别计时 `flash_attention(q, k, v, causal=True, block_q=b, block_k=b)`。为什么小分块在 CPU 上很慢（数一数 Python 层面的迭代次数以及每次矩阵乘法的大小）？在 GPU 上，限制分块大小的又是什么？
# 2. 由 $O = PV$ 和 $P_{ij} = e^{s_{ij}} / \sum_k e^{s_{ik}}$ 推导 $D_i = \sum_j P_{ij}\, dP_{ij} = dO_i \cdot O_i$ 以及 softmax 的反向传播 $dS_{ij} = P_{ij}(dP_{ij} - D_i)$。
# 3. 给第 3 节的 `streamed_attention` 加一个 `valid_lens` 参数（每个查询一个长度），跳过超出一个查询块中最大长度的键块，并与 `flash_attention(..., valid_lens=...)` 比较。用 `stream_plan(..., valid_lens=...).visits` 数一数它运行的分块数。
# 4. 为一个逐个到达的数字流（一个生成器）编写在线 *log-sum-exp*，只用常数内存，并与 `numpy.logaddexp.reduce` 对照检验。这就是 Milakov 和 Gimelshein（2018）中归一化项的那一半。
# 5. 分别用 `--fused off` 和 `--fused auto` 训练 2048 字符的语言模型各 20 步，比较它们的峰值内存（`/usr/bin/time -v` 会打印 `Maximum resident set size`）和留出集损失。然后用 `--fused auto` 试试 `--lm-num-steps 8192`。
#
# ## 参考文献
#
# - D2L 中文版《动手学深度学习》（zh.d2l.ai）：10.3 注意力评分函数，10.6 自注意力和位置编码，10.7 Transformer，8.3 语言模型和数据集。英文版 *Dive into Deep Learning*（d2l.ai）：11.3 "Attention Scoring Functions"，11.6 "Self-Attention and Positional Encoding"，11.7 "The Transformer Architecture"，9.3 "Language Models"。
# - Milakov 和 Gimelshein（2018），"Online normalizer calculation for softmax"，arXiv:1805.02867。
# - Rabe 和 Staats（2021），"Self-attention Does Not Need $O(n^2)$ Memory"，arXiv:2112.05682。
# - Dao、Fu、Ermon、Rudra 和 Ré（2022），"FlashAttention: Fast and Memory-Efficient Exact Attention with IO-Awareness"，NeurIPS 2022，arXiv:2205.14135。
# - Dao（2023），"FlashAttention-2: Faster Attention with Better Parallelism and Work Partitioning"，arXiv:2307.08691（ICLR 2024）。
# - Press、Smith 和 Lewis（2022），"Train Short, Test Long: Attention with Linear Biases Enables Input Length Extrapolation"，ICLR 2022（ALiBi，教程 9）。
#
# ## 代码在引擎中的位置
#
# - `minitensor/core/ops/flash_attention.py`：`flash_attention`（`return_lse=`、`block_q=`、`block_k=`），`FlashAttention`（前向循环和反向传播，采用 FlashAttention-2 的循环顺序），`StreamPlan`（`visits`、`scores`、`bias`、`weights`），`stream_plan`，`BLOCK_Q`，`BLOCK_K`。
# - `minitensor/core/nn/attention.py`：`MultiHeadAttention(fused=...)`、`why_not_fused`、`attention_weights_for`、`_attend_streamed`、`plain_attention`。
# - `minitensor/core/nn/sdpa.py`：`F.scaled_dot_product_attention`，PyTorch 的调用，在两条路径之上（`flash_attention.py` 中的 `stream_pays` 和 `FUSED_MIN_LENGTH` 为它和各个层做选择）。
# - `minitensor/core/ops/softmax.py` 和 `minitensor/core/kernels/cpu.py`：流式计算所复现的掩蔽 softmax。
# - `minitensor/core/kernels/cuda/attention.cu`（及 `docs/gpu.md`）：同一个算法写成的 CUDA 计算内核，GPU 用它代替分块循环：每个（样本、头、64 个查询的分块）一个线程块，每一行放在两个或四个线程的寄存器里，键以 32 个为一块流经共享内存，掩蔽和相对偏置表都在计算内核内部施加；反向传播按键的分块分配线程块，因此没有两个线程块往同一块内存里累加。序列太短、填不满 GPU 时，每一行的键分给至多四组线程，各组维护自己的当前最大值、累计和与输出，最后用同样的重新缩放规则合并：各自乘以 exp(自己的最大值 − 较大的最大值)，再相加。
# - `minitensor/train/config.py`：`TrainConfig.fused`（`--fused`）、`LM_RECIPE`、`lm_num_steps`（`--lm-num-steps`）。
# - `tests/test_flash_attention.py`：对每一种掩蔽、偏置和头的布局，流式计算都与普通路径相等；`bench/long_attention.py`：与普通路径和 PyTorch 对比时间和内存。
