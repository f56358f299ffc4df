# %% [markdown]
# # 7. Transformer：编码器、解码器、训练与解码
#
# 《动手学深度学习》注意力机制一章的最后一节把 Transformer 作为编码器－解码器架构的一个实例来介绍：
# 它完全基于注意力机制，没有任何卷积层或循环神经网络层，整个模型画在一张架构图里。
# 本章此前讲过的内容都是这张图的组成部分：多头注意力（教程 5）、自注意力和位置编码（教程 6），
# 以及编码器－解码器注意力——它的查询来自解码器，键和值则来自编码器的输出。
#
# 本教程将
#
# 1. 画出这张架构图，并逐一搭建它的各个部件：基于位置的前馈网络、加法和规范化、编码器块、
#    带因果掩蔽的解码器块，每个论断都用数值加以检验；
# 2. 用 `minitensor.train` 训练《动手学深度学习》中的小型 Transformer，让它把日期规范化
#    （“3rd of May 2021” → “2021-05-03”）；
# 3. 用贪心搜索和束搜索解码，并按《动手学深度学习》的定义用 BLEU 打分；
# 4. 画出训练好的 Transformer 所具有的三种注意力。
#
# 运行方式：`python tutorials/zh/07_transformer.py`（在 2 个空闲的 CPU 核上约需一分钟），
# 或用 jupytext 把它作为笔记本打开。设置 `MINITENSOR_TUTORIAL_SMOKE=1` 会把一切缩小到几秒钟。
#
# 参考资料：《动手学深度学习》的注意力机制一章，中文版（zh.d2l.ai）10.7 Transformer，
# 英文版 *Dive into Deep Learning*（d2l.ai）11.7 "The Transformer Architecture"；
# 强制教学、BLEU 和束搜索见该章之前的两节：9.7 序列到序列学习（seq2seq）和 9.8 束搜索
# （英文版：10.7 "Sequence-to-Sequence Learning for Machine Translation" 和 10.8 "Beam Search"）。
# 论文：Vaswani et al. (2017), "Attention Is All You Need"；Ba, Kiros and Hinton (2016),
# "Layer Normalization"；Xiong et al. (2020), "On Layer Normalization in the Transformer
# Architecture"；Papineni et al. (2002), "BLEU: a Method for Automatic Evaluation of Machine
# Translation"。

# %%
import time

import numpy as np
from _tutorial import LANG, SMOKE, figure_path, pick, text  # text()：图中的文字随教程的语言而变

import minitensor as mt
from minitensor.metrics import bleu, corpus_bleu, exact_match
from minitensor.train import TrainConfig, plot_loss, plot_transformer_attention, train, translate
from minitensor.train.config import build_data

T = "07_transformer"
FIGURES = figure_path(T, "architecture.png").parent  # 本教程的所有 PNG 都写到这里
mt.manual_seed(0)
print("smoke mode" if SMOKE else "full mode")

# %% [markdown]
# ## 架构
#
# **编码器**（encoder）把源词元 $x_1, \dots, x_n$ 变成同样多个向量；**解码器**（decoder）
# 一次生成一个目标词元，每一步都读取它至今已生成的词元，并通过编码器－解码器注意力读取编码器的向量。
# 两者的开头相同：嵌入（embedding）乘以 $\sqrt{d}$，再加上位置编码
# （《动手学深度学习》：乘以嵌入维度的平方根进行重新缩放，然后再与位置编码相加）：
#
# $$\mathbf X^{(0)} = \text{dropout}\big(\text{Embedding}(\text{tokens})\sqrt{d} + \mathbf P\big),
# \qquad d = \texttt{num\_hiddens}.$$
#
# 然后是 `num_blks` 个相同的块。**编码器块**有两个子层：
#
# $$\mathbf Y = \text{AddNorm}\big(\mathbf X, \text{MultiHead}(\mathbf X, \mathbf X, \mathbf X)\big),
# \qquad \mathbf Z = \text{AddNorm}\big(\mathbf Y, \text{FFN}(\mathbf Y)\big).$$
#
# **解码器块**有三个子层：对目前为止的目标序列做掩蔽（因果）自注意力；编码器－解码器注意力
# （常称为交叉注意力（cross-attention），查询来自解码器，键 = 值 = 编码器的输出 $\mathbf H$）；
# 以及前馈网络：
#
# $$\mathbf Y = \text{AddNorm}\big(\mathbf X, \text{MaskedMultiHead}(\mathbf X, \mathbf X, \mathbf X)\big),\quad
# \mathbf Z = \text{AddNorm}\big(\mathbf Y, \text{MultiHead}(\mathbf Y, \mathbf H, \mathbf H)\big),\quad
# \text{out} = \text{AddNorm}\big(\mathbf Z, \text{FFN}(\mathbf Z)\big).$$
#
# 其中每个多头注意力都是教程 5 中的那个：
#
# $$\text{MultiHead}(\mathbf Q, \mathbf K, \mathbf V) = \text{concat}(\mathbf h_1, \dots, \mathbf h_h)\mathbf W_o,
# \qquad \mathbf h_i = \text{softmax}\Big(\frac{\mathbf Q\mathbf W_q^{(i)}
#   (\mathbf K\mathbf W_k^{(i)})^\top}{\sqrt{d_h}}\Big)\mathbf V\mathbf W_v^{(i)}.$$
#
# 最后，一个线性层把解码器的输出变成目标词表上的 logits。
# 下面这张图仿照 Vaswani et al. (2017) 的图 1 绘制，《动手学深度学习》中也是这张图：

# %%
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch


def draw_architecture(path):
    """The encoder-decoder Transformer (Vaswani et al. 2017, Figure 1) as boxes and arrows."""
    fig = Figure(figsize=(7.5, 7.2))
    ax = fig.add_axes([0, 0, 1, 1])
    ax.set_xlim(0, 10)
    ax.set_ylim(0, 11)
    ax.axis("off")
    colours = {"attn": "#fbd7a8", "norm": "#f7f3b0", "ffn": "#b9e3f7", "emb": "#f4c6cf", "out": "#d4d4f7"}

    def box(x, y, label, kind, w=3.2, h=0.55):
        ax.add_patch(
            FancyBboxPatch(
                (x - w / 2, y - h / 2),
                w,
                h,
                boxstyle="round,pad=0.05",
                facecolor=colours[kind],
                edgecolor="black",
                linewidth=0.8,
            )
        )
        ax.text(x, y, label, ha="center", va="center", fontsize=8.5)
        return (x, y, h)

    def arrow(a, b, **kw):
        ax.add_patch(FancyArrowPatch(a, b, arrowstyle="-|>", mutation_scale=10, linewidth=0.9, **kw))

    def up(a, b):
        arrow((a[0], a[1] + a[2] / 2 + 0.05), (b[0], b[1] - b[2] / 2 - 0.05))

    ex, dx = 2.6, 7.2
    # 编码器
    ax.text(ex, 0.35, text("source tokens"), ha="center", fontsize=9)
    e0 = box(ex, 1.1, text("embedding x sqrt(d) + positional encoding"), "emb", w=3.9)
    e1 = box(ex, 2.5, text("multi-head self-attention"), "attn")
    e2 = box(ex, 3.3, text("add & norm"), "norm")
    e3 = box(ex, 4.3, text("position-wise FFN"), "ffn")
    e4 = box(ex, 5.1, text("add & norm"), "norm")
    for a, b in ((e0, e1), (e1, e2), (e2, e3), (e3, e4)):
        up(a, b)
    ax.add_patch(
        FancyBboxPatch(
            (ex - 2.0, 1.95), 4.0, 3.55, boxstyle="round,pad=0.05", fill=False, linestyle="--", edgecolor="gray"
        )
    )
    ax.text(ex - 2.15, 3.7, "x num_blks", ha="right", va="center", fontsize=9, rotation=90, color="gray")
    ax.text(ex, 6.05, text("encoder outputs H"), ha="center", va="center", fontsize=9)
    arrow((ex, 5.45), (ex, 5.85))
    # 解码器
    ax.text(dx, 0.35, text("target tokens, shifted right (<bos> first)"), ha="center", fontsize=9)
    d0 = box(dx, 1.1, text("embedding x sqrt(d) + positional encoding"), "emb", w=3.9)
    d1 = box(dx, 2.5, text("masked multi-head self-attention"), "attn")
    d2 = box(dx, 3.3, text("add & norm"), "norm")
    d3 = box(dx, 4.3, text("encoder-decoder attention"), "attn")
    d4 = box(dx, 5.1, text("add & norm"), "norm")
    d5 = box(dx, 6.1, text("position-wise FFN"), "ffn")
    d6 = box(dx, 6.9, text("add & norm"), "norm")
    d7 = box(dx, 8.6, text("linear -> vocabulary logits"), "out")
    d8 = box(dx, 9.6, text("softmax: P(next token)"), "out")
    for a, b in ((d0, d1), (d1, d2), (d2, d3), (d3, d4), (d4, d5), (d5, d6), (d6, d7), (d7, d8)):
        up(a, b)
    ax.add_patch(
        FancyBboxPatch(
            (dx - 2.0, 1.95), 4.0, 5.35, boxstyle="round,pad=0.05", fill=False, linestyle="--", edgecolor="gray"
        )
    )
    ax.text(dx + 2.15, 4.6, "x num_blks", ha="left", va="center", fontsize=9, rotation=270, color="gray")
    # 交叉注意力：键和值来自编码器，查询来自解码器
    arrow((ex + 0.95, 6.05), (dx - 1.65, 4.3), connectionstyle="arc3,rad=-0.3", color="C3")
    ax.text(5.0, 6.15, text("keys, values"), color="C3", fontsize=9, ha="center")
    ax.text(dx + 0.12, 3.8, text("queries"), color="C3", fontsize=8, ha="left", va="center")
    ax.text(5.0, 10.5, text("The Transformer: an encoder-decoder for sequence pairs"), ha="center", fontsize=11)
    fig.savefig(path, dpi=110)


draw_architecture(figure_path(T, "architecture.png"))
print("wrote", figure_path(T, "architecture.png"))

# %% [markdown]
# ## 基于位置的前馈网络
#
# 基于位置的前馈网络（positionwise feed-forward network）是一个两层的多层感知机，
# 以*相同*的权重作用于每一个位置：
#
# $$\text{FFN}(\mathbf x) = \max(0, \mathbf x\mathbf W_1 + \mathbf b_1)\mathbf W_2 + \mathbf b_2 .$$
#
# “基于位置”是指它从不混合不同的位置：位置 $t$ 上的输出只取决于位置 $t$ 上的输入。
# 注意力是唯一在位置之间传递信息的子层。两项检验：单独输入一个位置，得到的还是同一行；
# 打乱各位置的顺序，输出也按同样的方式被打乱。

# %%
ffn = mt.nn.PositionWiseFFN(16, 32)  # (ffn_num_input, ffn_num_hiddens)；输出大小为 16
X = mt.randn(2, 5, 16)
out = ffn(X).numpy()
for t in range(5):
    alone = ffn(X[:, t : t + 1]).numpy()
    assert np.allclose(alone[:, 0], out[:, t], atol=1e-6), "the FFN mixed positions"
perm = np.random.default_rng(0).permutation(5)
shuffled = ffn(mt.tensor(X.numpy()[:, perm])).numpy()
assert np.allclose(shuffled, out[:, perm], atol=1e-6), "shuffling positions must shuffle the FFN's outputs"
print(ffn)
print("FFN output", out.shape, "- position by position: checked")

# %% [markdown]
# ## 加法和规范化：残差连接和层规范化
#
# 每个子层都包在一个残差连接（residual connection）里，其后接层规范化（layer normalization），
# 合称“加法和规范化”（add & norm）：
#
# $$\text{AddNorm}(\mathbf X, \mathbf Y) = \text{LayerNorm}(\mathbf X + \text{dropout}(\mathbf Y)),\qquad
# \text{LayerNorm}(\mathbf x) = \boldsymbol\gamma \odot \frac{\mathbf x - \mu}{\sqrt{\sigma^2 + \epsilon}}
#   + \boldsymbol\beta,$$
#
# 其中 $\mu$ 和 $\sigma^2$ 是*某一个位置*上 $d$ 个特征的均值和方差。
# 与批量规范化不同，这里的计算既不依赖批量中的其他样本，也不依赖序列长度（它在不同批量之间会变化）。
# 残差路径让梯度可以绕过子层；规范化则让每个位置保持固定的尺度。
# 当 $\boldsymbol\gamma = 1$、$\boldsymbol\beta = 0$ 时（新建的层即如此），
# 输出在每个位置上的均值都为 0、方差都为 1：

# %%
add_norm = mt.nn.AddNorm(16, dropout=0.0)  # norm_first=False：书中的（post-LN）形式
X, Y = mt.randn(2, 5, 16) * 3 + 1, mt.randn(2, 5, 16)
Z = add_norm(X, Y).numpy()
mean, var = Z.mean(axis=-1), Z.var(axis=-1)
print(f"per-position mean: max |.| = {np.abs(mean).max():.1e}; variance in [{var.min():.6f}, {var.max():.6f}]")
assert np.allclose(mean, 0, atol=1e-5), "AddNorm output: every position has mean 0"
assert np.allclose(var, 1, atol=1e-3), "AddNorm output: every position has variance 1 (up to eps)"

# %% [markdown]
# 《动手学深度学习》10.7.2（英文版 11.7.2）把两者放在一起比较：一个批量有两个样本，每个样本两个特征。层规范化让每一*行*
# （一个样本）的均值为 0、方差为 1，批量规范化则让每一*列*（一个特征，在批量上统计）如此。
# 训练模式下，批量规范化使用当前批量自己的统计量；`model.eval()` 之后改用它一路保存的滑动平均，
# 这样一个预测就不依赖于同一批量中的其他样本。Transformer 的批量里混有长度不同、填充到同一长度的序列，
# 这是它按位置做规范化的原因之一。

# %%
ln = mt.nn.LayerNorm(2)
bn = mt.nn.LazyBatchNorm1d()  # 它的 num_features（2）取自第一个输入
X2 = mt.tensor([[1, 2], [2, 3]], dtype=mt.float32)
print("layer norm:", ln(X2), "\nbatch norm:", bn(X2))
assert np.allclose(ln(X2).numpy(), [[-1, 1], [-1, 1]], atol=1e-4), "layer norm: each example"
assert np.allclose(bn(X2).numpy(), [[-1, -1], [1, 1]], atol=1e-4), "batch norm: each feature"

# %% [markdown]
# > **勘误 / 代码实现的是哪个版本**
# >
# > *Post-LN（书中的形式）还是 pre-LN（minitensor 默认的训练配方）。*
# >
# > 原始的 Transformer 和《动手学深度学习》都在残差相加*之后*做规范化，即 post-LN：
# > $\mathbf X \leftarrow \text{LayerNorm}(\mathbf X + \text{sublayer}(\mathbf X))$。`mt.nn.AddNorm`、
# > `TransformerEncoder` 和 `TransformerDecoder` 默认（`norm_first=False`）实现的正是这种形式。
# > 此后训练的许多 Transformer（GPT-2、PyTorch 的 `norm_first=True`；Xiong et al. 2020）
# > 则改为规范化*进入*子层的输入，即 pre-LN：
# > $\mathbf X \leftarrow \mathbf X + \text{sublayer}(\text{LayerNorm}(\mathbf X))$，
# > 并在最后一个块之后再加一个 LayerNorm。这样残差流本身从不被规范化，梯度可以不衰减地到达最前面的块，
# > 训练也能承受大得多的学习率。因此 `minitensor train`（`TrainConfig`）采用 pre-LN、
# > 不用暂退法（dropout），峰值学习率为 1e-2：在日期任务上 4 个迭代周期就达到 100% 的留出集精确匹配率；
# > 而书中的 post-LN 配方（`--no-norm-first`、暂退概率 0.1、学习率 3e-3）在同样的时间内只达到约 66%。
# > 两种形式使用同一组 `AddNorm` 参数：
# > `Y = sublayer(addnorm.sublayer_input(X)); X = addnorm(X, Y)`。
# >
# > 与《动手学深度学习》代码的其他细小差异：`PositionWiseFFN` 的第一个参数是输入大小
# > （minitensor 没有延后初始化的层）；解码器缓存的是过去词元*投影后*的键和值，
# > 而不是块的输入（《动手学深度学习》中的 `state[2]`）——线性层逐位置作用，所以两者得到相同的数值；
# > 嵌入表的初始值服从 $N(0, 1/d)$ 而不是 $N(0, 1)$，这样乘以 $\sqrt d$ 之后，
# > 嵌入与它要加上的位置编码尺度相当，而不会把位置编码淹没。

# %%
pre_ln = mt.nn.AddNorm(16, dropout=0.0, norm_first=True)
assert np.allclose(pre_ln(X, Y).numpy(), (X + Y).numpy()), "pre-LN: the residual stream is X + Y, not normalised"
assert np.allclose(pre_ln.sublayer_input(X).numpy().mean(axis=-1), 0, atol=1e-5), "pre-LN normalises the input"
for norm_first in (False, True):
    enc = mt.nn.TransformerEncoder(20, 16, 32, 2, 2, 0.0, norm_first=norm_first)
    print(f"norm_first={norm_first}: final LayerNorm after the blocks: {enc.ln is not None}")
    assert (enc.ln is not None) == norm_first

# %% [markdown]
# ## 编码器
#
# 编码器块保持形状 (batch, steps, `num_hiddens`) 不变，因此块可以堆叠。
# 它的自注意力用《动手学深度学习》中的 `valid_lens` 掩蔽较短源序列的填充：
# 每个头的每个查询给填充位置上的键的权重都恰好为 0。

# %%
vocab_size, num_hiddens, ffn_num_hiddens, num_heads, num_blks = 20, 16, 32, 2, 2
encoder = mt.nn.TransformerEncoder(vocab_size, num_hiddens, ffn_num_hiddens, num_heads, num_blks, dropout=0.0)
src = mt.tensor(np.random.default_rng(1).integers(4, vocab_size, (2, 6)))
enc_valid_lens = mt.tensor([6, 3])
H = encoder(src, enc_valid_lens)
print("encoder:", tuple(src.shape), "->", tuple(H.shape))
assert H.shape == (2, 6, num_hiddens)
for w in encoder.attention_weights:  # 每个块一个 (batch, num_heads, T, T) 数组
    w = w.numpy()
    assert w.shape == (2, num_heads, 6, 6)
    assert (w[1, :, :, 3:] == 0).all(), "padded source positions must get exactly zero weight"
    assert np.allclose(w.sum(-1), 1, atol=1e-6)
print("padding hidden in every block and head: checked")

# %% [markdown]
# 编码器只需要《动手学深度学习》中的五个尺寸和暂退法的概率；其余设置（位置编码、注意力插件、
# pre-LN、分组查询注意力）都取默认值。编码器把它们连同默认值一起保存为一个值：
# `encoder.config`，即一个 `TransformerConfig`：写下来的架构。模型也可以由这样的配置构建——
# 下面的解码器就是这样得到编码器的架构的；`config.replace(...)` 则生成一个修改过的副本，
# 并重新检查（这里：更深的堆叠）。

# %%
config = encoder.config  # 上面的设置，连同默认值
print(config)
assert config == mt.nn.TransformerConfig(vocab_size, num_hiddens, ffn_num_hiddens, num_heads, num_blks, dropout=0.0)
deeper = mt.nn.TransformerEncoder(config.replace(num_blks=3))  # 同样的架构，多一个块
assert len(deeper.blks) == 3 and deeper.config.num_hiddens == num_hiddens

# %% [markdown]
# ## 解码器及其因果掩蔽
#
# 训练时解码器一次读入整个目标序列（强制教学（teacher forcing）：输入是右移一位、以 `<bos>` 开头的目标序列），
# 但对词元 $t+1$ 的预测只能用到词元 $1..t$，就像预测时那样——那时后面的词元还不存在。
# 掩蔽自注意力（《动手学深度学习》：掩蔽（masked）注意力，见其中的掩蔽多头解码器自注意力层）保证了这一点：
# 查询 $i$ 只有在 $j \le i$ 时才能关注键 $j$，
#
# $$\alpha_{ij} = 0 \quad (j > i),$$
#
# 这使解码器成为自回归（auto-regressive）的。三项检验：自注意力权重在对角线以上恰好为零；
# 改变一个*未来*的目标词元，不会改变任何更早的输出；逐词元解码（使用预测时所用的键值缓存）
# 得到的 logits 与一次性的强制教学前向传播相同。

# %%
decoder = mt.nn.TransformerDecoder(config)  # 编码器的架构，取自它的配置
model = mt.nn.EncoderDecoder(encoder, decoder)
dec_X = np.random.default_rng(2).integers(4, vocab_size, (2, 5))
logits = model(src, mt.tensor(dec_X), enc_valid_lens).numpy()
self_weights, cross_weights = decoder.attention_weights
for w in self_weights:
    w = w.numpy()
    assert (np.triu(w, k=1) == 0).all(), "the causal mask must hide the future: weights above the diagonal are 0"
for w in cross_weights:
    assert (w.numpy()[1, :, :, 3:] == 0).all(), "encoder-decoder attention must ignore the source padding"

changed = dec_X.copy()
changed[:, 3:] = (changed[:, 3:] + 1) % vocab_size  # 只在位置 3 和 4 换上新词元
logits_changed = model(src, mt.tensor(changed), enc_valid_lens).numpy()
assert np.allclose(logits_changed[:, :3], logits[:, :3], atol=1e-6), "a future token changed an earlier output"
assert not np.allclose(logits_changed[:, 3:], logits[:, 3:]), "...while the changed positions do change"

state = model.begin_decoding(src, enc_valid_lens)
steps = []
for t in range(dec_X.shape[1]):  # 每次一个词元，缓存逐步增长
    step_logits, state = model.decode_step(mt.tensor(dec_X[:, t : t + 1]), state)
    steps.append(step_logits.numpy())
assert np.allclose(np.concatenate(steps, axis=1), logits, atol=1e-5), "token-by-token decoding != one pass"
print("causal mask: zero above the diagonal, the future cannot leak, the cache reproduces the full pass")
print(f"decoder self-attention weights of block 1, head 1, example 1:\n{np.round(self_weights[0].numpy()[0, 0], 2)}")

# %% [markdown]
# ## 在日期任务上训练
#
# 任务：读入以 13 种人类书写格式之一写成的日期，把它写成 ISO 格式的日期。
# 词元（token）是字符；源和目标各有自己的词表（vocabulary），其中有保留词元 `<pad>`（填充）、
# `<bos>`、`<eos>` 和 `<unk>`。`minitensor.train` 生成数据（留出的*日历日期*不会以任何格式出现在训练数据中），
# 搭建《动手学深度学习》中的小型 Transformer（`num_hiddens` 为 32，`ffn_num_hiddens` 为 64，
# 4 个头，编码器和解码器各 2 个块），并用强制教学训练它，最小化有效目标词元上的交叉熵：
#
# $$L = -\frac{1}{N}\sum_{\text{valid } t} \log P(y_t \mid y_1, \dots, y_{t-1}, \mathbf x),$$
#
# 优化器是 Adam，学习率先预热、再按余弦衰减，并做梯度裁剪。每个迭代周期结束后，它报告留出集上的损失、
# 贪心解码的精确匹配准确率和语料库 BLEU，并写出一个检查点。我们在第一个迭代周期之后停下，
# 留着这个训练了一半的模型供后面比较解码方法，然后恢复训练直到结束（结果与不中断的训练逐位相同）。
# 完整模式用的是 `minitensor train` 的默认配方，冒烟模式是它的微缩版。
# 一个运行文件夹只属于一次运行：`overwrite=True`（`minitensor train --overwrite`）
# 让本教程每次运行都从头开始，删除它自己之前的运行结果；没有它，第二次运行会被拒绝。

# %%
run_dir = figure_path(T, "date_run")  # 检查点和这次运行自己的图
# 完整模式：`minitensor train` 的默认值；冒烟模式：640 个样本，1 + 1 个块，3 个迭代周期、每个迭代周期 20 步
sizes = pick({}, dict(num_train=640, num_heldout=64, batch_size=32, epochs=3, num_blks=1))
config = TrainConfig(task="date", out=str(run_dir), progress=False, seed=0, **sizes)
start = time.perf_counter()
first = train(config, overwrite=True, stop_after_epochs=1)  # 训练一个迭代周期，然后“中断”
result = train(config, resume=True, lang=LANG)  # ……再继续训练到结束
print(f"training took {time.perf_counter() - start:.1f} s")

losses = np.array(result.history["loss"])
head, tail = losses[:10].mean(), losses[-10:].mean()
print(
    f"loss: first 10 steps {head:.3f}, last 10 steps {tail:.4f}; held-out exact match after epoch 1 "
    f"{first.accuracy:.1%}, at the end {result.accuracy:.1%}"
)
assert tail < 0.5 * head, "the training loss must fall"
if not SMOKE:
    assert result.accuracy >= 0.95, "the default recipe reaches ~100% held-out exact match"
title = text("Transformer on the date task")
plot_loss(result.history, path=figure_path(T, "loss.png"), smooth=0.9, title=title, lang=LANG)

# %% [markdown]
# ## 贪心搜索和束搜索
#
# 解码器应该输出哪个序列？使下式最大的那个：
#
# $$\frac{1}{L^\alpha}\log P(y_1, \dots, y_L \mid \mathbf x)
#   = \frac{1}{L^\alpha}\sum_{t=1}^{L}\log P(y_t \mid y_1, \dots, y_{t-1}, \mathbf x),$$
#
# 其中 $\alpha$（《动手学深度学习》取 0.75）使长序列不至于仅仅因为负项更多而吃亏。
# 在 $|V|^L$ 个序列上做穷举搜索是不可能的；
#
# * **贪心搜索**（greedy search）在每一步都取最可能的词元，$y_t = \arg\max_y P(y \mid y_{<t}, \mathbf x)$；
# * **束搜索**（beam search）保留 $k$ 个最好的部分序列，用每个词元分别扩展其中的每一个，
#   再从这 $k|V|$ 个扩展中保留最好的 $k$ 个；$k = 1$ 就是贪心搜索。
#
# `translate(model, sources, ..., beam_size=k)` 用同一个循环实现这两种搜索（`minitensor/inference/decoding.py`）。
# 训练了一半的模型（第 1 个迭代周期之后）还拿不太准，在一部分样本上，
# 束搜索找到的序列比贪心搜索选定的序列得分更高：

# %%
mt.manual_seed(config.seed)  # 与 train() 生成的数据相同
data = build_data(config, vocabs=(result.src_vocab, result.tgt_vocab))
assert [s for s, *_ in result.samples] == ["".join(s) for s, _ in data.heldout[: len(result.samples)]]
sources = [s for s, _ in data.heldout]
references = [t for _, t in data.heldout]


def decode_heldout(model, beam_size):
    hyps = translate(
        model, sources, data.src_vocab, data.tgt_vocab, data.num_steps, beam_size=beam_size, max_len=data.tgt_num_steps
    )
    preds = [h.tokens for h in hyps]
    return hyps, {
        "exact match": exact_match(preds, references),
        "corpus BLEU": corpus_bleu(preds, references),
        "mean score": float(np.mean([h.score for h in hyps])),
    }


comparison = {}
for name, model_ in (("after epoch 1", first.model), ("trained", result.model)):
    greedy_hyps, greedy_m = decode_heldout(model_, 1)
    beam_hyps, beam_m = decode_heldout(model_, 4)
    diff = np.array([b.score - g.score for g, b in zip(greedy_hyps, beam_hyps)])
    comparison[name] = (greedy_hyps, beam_hyps, greedy_m, beam_m, diff)
    print(f"{name}:  greedy  {greedy_m}\n{' ' * len(name)}   beam 4  {beam_m}")
    print(
        f"{' ' * len(name)}   beam's score higher on {(diff > 1e-9).sum()}, equal on {(abs(diff) <= 1e-9).sum()}, "
        f"lower on {(diff < -1e-9).sum()} of {len(diff)} examples"
    )
_, _, greedy_m, beam_m, diff = comparison["after epoch 1"]
assert beam_m["mean score"] >= greedy_m["mean score"], "beam search should reach a higher mean score"
assert (diff > 1e-9).any(), "on a half-trained model beam search finds likelier sequences than greedy search"

# %% [markdown]
# 束搜索同样是一种启发式方法，它的停止规则就是露出破绽的地方。
# fairseq 在某个样本已有 $k$ 个假设以 `<eos>` 结束时就停止搜索；对于一个很有把握的模型，
# 正确延续旁边的 $k - 1$ 个位置会被不太可能的假设填满，其中一些会过早结束（“195`<eos>`”、“19`<eos>`”），
# 于是搜索会在好的假设结束之前就停下——返回一个比贪心搜索*更差*的序列。
# minitensor 的规则 4（`decoding.py`）加上了第二个条件：这一步最可能的扩展本身必须是 `<eos>`。
# 当长度惩罚偏好另一个长度时，束搜索仍可能返回比贪心搜索得分更低的结果；
# 下面列出训练好的模型上的这类样本（如果有的话），即 `n_best` 个假设及其得分。

# %%
greedy_hyps, beam_hyps = comparison["trained"][:2]
worse = [i for i, (g, b) in enumerate(zip(greedy_hyps, beam_hyps)) if b.score < g.score - 1e-9][:2]
for i in worse:
    n_best = translate(
        result.model,
        sources[i],
        data.src_vocab,
        data.tgt_vocab,
        data.num_steps,
        beam_size=4,
        max_len=data.tgt_num_steps,
        n_best=4,
    )
    print(
        f"{''.join(sources[i])!r}: greedy {''.join(greedy_hyps[i].tokens)!r} (score {greedy_hyps[i].score:.4f});"
        " beam's finished hypotheses:"
    )
    for h in n_best:
        print(f"    {''.join(h.tokens)!r:14} score {h.score:8.4f}  log P {h.log_prob:8.4f}")
print(f"{len(worse)} such example(s) shown")

# %% [markdown]
# ## BLEU
#
# 精确匹配是全有或全无的。BLEU（Papineni et al. 2002）对匹配上的 n 元语法给予部分得分；
# 《动手学深度学习》中的逐句版本为
#
# $$\text{BLEU} = \exp\Big(\min\Big(0, 1 - \frac{\text{len}_\text{label}}{\text{len}_\text{pred}}\Big)\Big)
#   \prod_{n=1}^{k} p_n^{1/2^n},$$
#
# 其中 $p_n$ 是预测中出现在标签里的 n 元语法所占的比例（标签中的每个 n 元语法至多按它在标签中出现的次数被匹配，
# 即所谓“截断”）。匹配较长的 n 元语法更难，所以《动手学深度学习》给它更高的奖励：
# 在精确度 $p_n < 1$ 相同时，$n$ 越大，因子 $p_n^{1/2^n}$ 越接近 1。
# 第一个因子惩罚比标签短的预测，否则预测可以靠少说话来获得很高的精确度。
# 下面针对一个预测手算一遍，并与 `minitensor.metrics.bleu` 比对：

# %%
from collections import Counter

pred, label = list("2021-05-30"), list("2021-05-03")


def p_n(pred, label, n):
    grams = Counter(tuple(pred[i : i + n]) for i in range(len(pred) - n + 1))
    ref = Counter(tuple(label[i : i + n]) for i in range(len(label) - n + 1))
    return sum(min(c, ref[g]) for g, c in grams.items()) / (len(pred) - n + 1)


by_hand = np.exp(min(0, 1 - len(label) / len(pred))) * np.prod([p_n(pred, label, n) ** 0.5**n for n in range(1, 5)])
print("p_1..p_4 =", [round(p_n(pred, label, n), 3) for n in range(1, 5)], f"BLEU = {by_hand:.4f}")
assert abs(bleu(pred, label, k=4) - by_hand) < 1e-12
assert bleu(label, label, k=4) == 1.0, "a perfect prediction scores 1"
assert bleu(label[:7], label, k=4) < 1.0, "a correct but short prediction is penalised"
for src_, pred_, ref_, score in result.samples:
    print(f"  {src_!r:24} => {pred_!r}  (reference {ref_!r}, BLEU {score:.3f})")

# %% [markdown]
# 训练循环打印的 `minitensor.metrics.corpus_bleu` 是论文中使用的 BLEU
# （n 元语法的计数在整个语料库上累加，即 sacrebleu 的约定）；`bleu` 则是上面《动手学深度学习》的逐句得分。
#
# ## 三种注意力
#
# 一个训练好的编码器－解码器 Transformer，在每个块的每个头上都有三张注意力图：
#
# 1. **编码器自注意力**：源 × 源，查询、键和值来自同一个序列，即前一个编码器层的输出
#    （《动手学深度学习》10.7：在计算编码器的自注意力时，查询、键和值都来自前一个编码器层的输出）；
# 2. **解码器自注意力**：目标 × 目标，一个下三角（因果掩蔽所致）；
# 3. **编码器－解码器注意力**：目标 × 源，对齐关系就体现在这里：每个输出字符看的是哪些源字符。
#
# 为了给一个留出的日期画出这三张图，我们先对它做贪心解码，再把模型自己的输出作为强制教学的输入，
# 把模型运行一遍（这样各层保存的就是整个序列的权重），然后调用 `plot_transformer_attention`：
# 它为每一种注意力写出一个 PNG，每个块一行子图、每个头一列（`show_heatmaps`）。

# %%
from minitensor.data import build_array

model = result.model
example = next((s for s in sources if any(c.isalpha() for c in s)), sources[0])
hyp = translate(model, example, data.src_vocab, data.tgt_vocab, data.num_steps, max_len=data.tgt_num_steps)
enc_X, enc_valid = build_array([example], data.src_vocab, len(example) + 1)  # 不填充：只有它自己的词元
dec_in = [data.tgt_vocab.bos] + data.tgt_vocab[list(hyp.tokens)]
model.eval()
with mt.no_grad():
    model(mt.tensor(enc_X), mt.tensor(np.array([dec_in])), mt.tensor(enc_valid))
src_labels, tgt_labels = list(example) + ["<eos>"], ["<bos>"] + list(hyp.tokens)
plot_transformer_attention(model, src_labels, tgt_labels, folder=FIGURES, prefix="date", lang=LANG)
print(
    f"{''.join(example)!r} => {''.join(hyp.tokens)!r}; heatmaps: date_encoder_self.png, date_decoder_self.png, "
    "date_cross.png"
)

self_w, cross_w = model.decoder.attention_weights
for w in self_w:
    w = w.numpy()[0]
    assert (np.triu(w, k=1) == 0).all() and np.allclose(w.sum(-1), 1, atol=1e-5)
for w in cross_w:
    assert np.allclose(w.numpy()[0].sum(-1), 1, atol=1e-5), "each target position spreads weight 1 over the source"
last = cross_w[-1].numpy()[0].mean(axis=0)  # 最后一个块，对各头取平均：(target, source)
for i, ch in enumerate(tgt_labels[1:], start=1):
    top = np.argsort(-last[i - 1])[:2]
    print(f"  output {ch!r} (fed {tgt_labels[i - 1]!r}) looks most at source {[src_labels[j] for j in top]}")

# %% [markdown]
# 看什么：每张图的第 $i$ 行是解码器输入 $i$ 的查询，也就是*写出*下一个字符的那个位置。
# 在编码器－解码器注意力图中，写年份的那些行看的是源中的年份数字，写月份的行看的是月份的名称或数字，
# 写日的行看的是日——模型自己找到了不同格式之间的对齐关系。
# 解码器自注意力是一个下三角；编码器自注意力中，有的头看相邻的字符，有的头看分隔符。
# 运行文件夹（`date_run/`）中保存着训练循环自己画的损失曲线、第一个留出日期的同样三张图，以及检查点：
# `minitensor translate --checkpoint tutorial_figures/07_transformer/date_run/checkpoint "3 May 2021"`。
#
# 这些图不仅可以看，还可以交互地探索：`mt.viz.attention_page` 对日期解码，
# 在 `mt.viz.capture` 中以强制教学的方式运行模型（它记录每一层在汇聚之前的评分、位置偏置、
# 查询可见的键以及权重），再写出一个能在浏览器中离线打开的 HTML 页面。
# 在页面上可以选择块和头，在评分和权重之间切换，把鼠标悬停在格子上查看数值，读出每个查询的熵，
# 还可以在中英文标签之间切换（本教程写出的页面默认显示中文）；
# `minitensor explain --checkpoint RUN "3 May 2021"` 在命令行上写出同样的页面。

# %%
page = mt.viz.attention_page(model, example, data.src_vocab, data.tgt_vocab, max_len=data.tgt_num_steps, lang=LANG)
page.save(figure_path(T, "date_explain.html"))
kinds = [(layer["kind"], layer["block"]) for layer in page.layers]
shown = np.array(page.layers[kinds.index(("cross", len(cross_w)))]["weights"])
assert page.output == list(hyp.tokens) and np.allclose(shown, cross_w[-1].numpy()[0], atol=1e-6)
print("wrote", figure_path(T, "date_explain.html"), f"({len(page.html) / 1024:.0f} KiB)")

# %% [markdown]
# ## 练习
#
# 1. 训练书中的 post-LN 模型 `config.replace(norm_first=False)`（命令行为 `minitensor train --no-norm-first`），
#    先用默认学习率 1e-2，再用 3e-3 并把暂退概率设为 0.1。哪一个学得会？各自在 4 个迭代周期内能达到什么程度？
# 2. 用 `beam_size` 为 1、2、4、8，`length_penalty` 为 0 和 0.75，对训练了一半的模型解码。
#    精确匹配率与平均得分的变化一致吗？找一个束搜索与贪心搜索结果不同的样本，
#    打印 `n_best=4` 个假设及其对数概率。
# 3. 训练《动手学深度学习》前面的模型，即带加性（Bahdanau）注意力的 GRU 编码器－解码器，
#    `config.replace(model="bahdanau")`，把它的留出集准确率、每个迭代周期的耗时以及它唯一的那张注意力图
#    （`date_run/attention.png`）与 Transformer 的作比较。
#
# ## 这些内容在引擎中的位置
#
# * `minitensor/core/nn/transformer.py`：`PositionWiseFFN`、`AddNorm`（post-LN 和 pre-LN）、
#   `TransformerEncoderBlock`、`TransformerDecoderBlock`（带键值缓存）、
#   `TransformerEncoder`、`TransformerDecoder`、`EncoderDecoder`、`TransformerLM`；
# * `minitensor/core/nn/attention.py`：`MultiHeadAttention`、`causal_mask`；
# * `minitensor/train/config.py`：`TrainConfig` 以及数据和模型的构建函数；
#   `minitensor/train/loop.py`：`train`、评估、检查点、恢复训练；
# * `minitensor/inference/decoding.py`：贪心搜索、束搜索、`translate`；
# * `minitensor/metrics.py`：《动手学深度学习》的 `bleu`，以及 `corpus_bleu`、`exact_match`；
# * `minitensor/train/plots.py`：`plot_loss`、`show_heatmaps`、`plot_transformer_attention`；
# * `minitensor/data/tasks.py`：日期任务。
