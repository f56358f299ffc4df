# %% [markdown]
# # 11. Bahdanau 注意力：学会往哪里看的编码器－解码器
#
# 在 Transformer 之前，注意力是在循环神经网络的编码器－解码器里进入深度学习的。
# 《动手学深度学习》的序列到序列学习模型把整个源序列编码成一个固定形状的上下文变量，
# 再从它解码出目标序列。Bahdanau、Cho 和 Bengio（2014）看出，对长句子来说这一个向量是瓶颈，
# 于是让解码器在每一步都对编码器的*全部*隐状态另取一个加权平均：权重来自一个对齐模型，
# 由加性注意力打分。《动手学深度学习》称之为一个没有严格单向对齐限制的可微注意力模型。
#
# 本教程将
#
# 1. 写出*不带*注意力的编码器－解码器及其固定的上下文变量；
# 2. 写出 Bahdanau 的解码器：以加性评分函数作为对齐模型，并按公式手算加以检验；
# 3. 用同样的方式训练这两个模型来反转字母串，测量瓶颈：精确匹配随输入长度的变化，
#    每个模型一条曲线；
# 4. 画出训练好的模型找到的对齐；
# 5. 在同一任务上把两者与教程 7 的 Transformer 比较：准确率、训练时间、参数量。
#
# 运行方式：`python tutorials/zh/11_bahdanau_attention.py`（在 2 个 CPU 核上约需一分钟），
# 或用 jupytext 把它作为笔记本打开。设置 `MINITENSOR_TUTORIAL_SMOKE=1` 会把一切缩小到几秒钟。
#
# 参考资料：《动手学深度学习》的注意力机制一章，中文版（zh.d2l.ai）10.4 Bahdanau 注意力，
# 英文版 *Dive into Deep Learning*（d2l.ai）11.4 "The Bahdanau Attention Mechanism"；
# 不带注意力的编码器－解码器见该章之前的 9.7 序列到序列学习（seq2seq）（英文版：10.7
# "Sequence-to-Sequence Learning for Machine Translation"）；加性评分函数见 10.3 注意力评分函数
# （英文版：11.3 "Attention Scoring Functions"）。论文：Bahdanau, Cho and Bengio (2014),
# "Neural Machine Translation by Jointly Learning to Align and Translate"，arXiv:1409.0473。

# %%
import time

import numpy as np
from _tutorial import LANG, SMOKE, figure_path, pick, text  # text()：图中的文字随教程的语言而变

import minitensor as mt
from minitensor import nn
from minitensor.data import Batches, seq2seq_arrays
from minitensor.train import TrainConfig, plot_seq2seq_attention, translate
from minitensor.train.config import build_data, build_model, build_optimizer, build_scheduler

T = "11_bahdanau_attention"
mt.manual_seed(0)
print("smoke mode" if SMOKE else "full mode")

# %% [markdown]
# ## 不带注意力的编码器－解码器
#
# 编码器是一个门控循环单元（GRU），依次读入源词元 $x_1, \dots, x_T$；读完第 $t$ 个词元后的
# 隐状态为 $\mathbf h_t = f(\mathbf x_t, \mathbf h_{t-1})$。《动手学深度学习》的解码器
# （中文版 9.7 / 英文版 10.7）把最后一个隐状态作为上下文变量：
#
# $$\mathbf c = \mathbf h_T, \qquad
# \mathbf s_{t'} = g\big([\mathbf e(y_{t'-1}); \mathbf c], \mathbf s_{t'-1}\big), \qquad
# P(y_{t'} \mid y_{<t'}, \mathbf x) = \text{softmax}(\mathbf W \mathbf s_{t'} + \mathbf b),$$
#
# 其中 $\mathbf e(y)$ 是上一个目标词元的嵌入，$\mathbf s_0$ 是编码器的最终隐状态。每一步的
# 输入都拼接上同一个 $\mathbf c$。解码器关于源序列所能知道的一切，都必须经过 $\mathbf c$ 和
# $\mathbf s_0$：各自只有 `num_hiddens` 个数，源序列有 3 个词元是这样，有 300 个也是这样。
# `nn.Seq2SeqDecoder` 就是这个解码器；它与本库的每个解码器遵循同一套接口
# （`state = decoder.init_state(encoder(X))`，`logits, state = decoder(Y, state)`），
# 因此同一个训练循环、贪心搜索和束搜索都能驱动它。

# %%
vocab_size, num_hiddens = 14, 32
encoder = nn.Seq2SeqEncoder(vocab_size, num_hiddens, num_hiddens, 1)  # （词表大小、嵌入维度、隐藏单元数、层数）
decoder = nn.Seq2SeqDecoder(vocab_size, num_hiddens, num_hiddens, 1)
for length in (3, 30):
    src = mt.tensor(np.random.default_rng(length).integers(4, vocab_size, (2, length)))
    outputs, enc_state = encoder(src)  # outputs 形状为 (T, batch, num_hiddens)：h_1 .. h_T
    state = decoder.init_state((outputs, enc_state))
    print(f"source of {length:2} tokens: encoder outputs {tuple(outputs.shape)}, context {tuple(state.context.shape)}")
    assert state.context.shape == (2, num_hiddens), "one vector per example, whatever the length"
    assert np.array_equal(state.context.numpy(), outputs.numpy()[-1]), "the context is h_T"
logits, _ = decoder(mt.tensor([[1, 5, 6]] * 2), state)  # <bos> 和两个词元，强制教学
assert logits.shape == (2, 3, vocab_size)

# %% [markdown]
# ## Bahdanau 的解码器：加性评分函数作为对齐模型
#
# Bahdanau 注意力把固定的 $\mathbf c$ 换成每个解码时间步 $t'$ 各自的上下文变量
# （《动手学深度学习》10.4）：
#
# $$\mathbf c_{t'} = \sum_{t=1}^{T} \alpha(\mathbf s_{t'-1}, \mathbf h_t)\, \mathbf h_t, \qquad
# \alpha(\mathbf s_{t'-1}, \mathbf h_t) = \text{softmax}_t\big(a(\mathbf s_{t'-1}, \mathbf h_t)\big),$$
#
# 这是一次注意力汇聚：查询是解码器上一时间步的隐状态 $\mathbf s_{t'-1}$，键和值是编码器的
# 隐状态 $\mathbf h_t$（《动手学深度学习》：编码器隐状态 $\mathbf h_t$ 既是键，也是值）。
# 评分函数 $a$ 就是教程 3 的加性注意力，一个包含一个隐藏层、以 tanh 为激活函数的多层感知机：
#
# $$a(\mathbf q, \mathbf k) = \mathbf w_v^\top \tanh(\mathbf W_q \mathbf q + \mathbf W_k \mathbf k).$$
#
# Bahdanau 等人把 $a$ 称为*对齐模型*：它评价位置 $t$ 附近的输入与位置 $t'$ 的输出有多匹配；
# 它和模型的其余部分一起用反向传播训练，只凭翻译的损失，从来没有人给出对齐。
# 随后上下文变量拼接到输入上：$\mathbf s_{t'} = g([\mathbf c_{t'}; \mathbf e(y_{t'-1})], \mathbf s_{t'-1})$。
# 在 minitensor 中，评分函数是按名字查找的插件（`scorer="additive"`），任何别的评分函数都能
# 放在它的位置上试一试。下面对第一步按公式手算加以检验，这一步的查询是编码器的最终隐状态
# $\mathbf s_0 = \mathbf h_T$：

# %%
att_decoder = nn.Seq2SeqAttentionDecoder(vocab_size, num_hiddens, num_hiddens, 1)  # 默认 scorer="additive"
src = mt.tensor(np.random.default_rng(0).integers(4, vocab_size, (2, 7)))
outputs, enc_state = encoder(src)
state = att_decoder.init_state((outputs, enc_state), [7, 4])  # 样本 2：只有 4 个有效的源词元
att_decoder(mt.tensor([[1], [1]]), state)  # 一步：<bos>
scorer = att_decoder.attention.scorer
print(att_decoder.attention)


def additive_scores(scorer, q, k):
    """w_v^T tanh(W_q q + W_k k) for every query and key, in NumPy from the scorer's weights."""
    Wq, Wk, wv = (layer.weight.numpy() for layer in (scorer.W_q, scorer.W_k, scorer.w_v))
    features = np.tanh((q @ Wq.T)[:, :, None, :] + (k @ Wk.T)[:, None, :, :])  # 形状 (batch, Q, K, h)
    return features @ wv[0]  # 形状 (batch, Q, K)


q, k = enc_state.numpy()[-1][:, None, :], state.enc_outputs.numpy()  # 查询 s_0 = h_T；键 h_1 .. h_T
scores = additive_scores(scorer, q, k)
assert np.allclose(scores, scorer(mt.tensor(q), mt.tensor(k)).numpy(), atol=1e-5)
scores[1, :, 4:] = -np.inf  # 样本 2 的填充（valid_lens = 4）得不到权重
by_hand = np.exp(scores - scores.max(-1, keepdims=True))
by_hand /= by_hand.sum(-1, keepdims=True)
weights = att_decoder.attention_weights[0].numpy()  # 第 1 步：(batch, 1, T)
assert np.allclose(by_hand, weights, atol=1e-6) and (weights[1, 0, 4:] == 0).all()
print("step 1's attention weights, example 2:", np.round(weights[1, 0], 3))

# %% [markdown]
# 新增的参数只有评分函数的：$\mathbf W_q$ 和 $\mathbf W_k$（各为 `num_hiddens` × $h$）以及
# $\mathbf w_v$（$h$ 个）；两个解码器中 GRU 的输入宽度都是 `embed_size + num_hiddens`。


# %%
def count(model):
    return sum(p.numel() for p in model.parameters())


extra = count(att_decoder) - count(decoder)
h = scorer.num_hiddens
print(f"decoder without attention {count(decoder):,} parameters, with attention {count(att_decoder):,}: +{extra:,}")
assert extra == 2 * num_hiddens * h + h

# %% [markdown]
# ## 测量瓶颈：反转字母串
#
# 任务：读入由字母 `a`–`j` 组成的字符串，把它倒过来写出（`minitensor.data.reverse_task`，
# `minitensor train --task reverse`）。它正好能回答我们的问题：每个输出词元都需要一个源词元，
# 而在输出的开头，所需的源词元离源序列的末尾——编码器最后的隐状态形成之处——最远。
# 训练用的字符串有 1 到 16 个字母；600 个同样长度范围的留出字符串用贪心搜索解码，
# 按精确匹配打分（每个字母都对，长度也对）。
#
# 两个 GRU 模型的规模相同（嵌入和隐状态都是 32 维，一层），以同样的顺序看同样的
# 600 个小批量（每批 128 个字符串），并采用 `minitensor train` 的训练配方
# （`build_optimizer`、`build_scheduler`：Adam，学习率先预热到 0.01 再按余弦衰减，
# 梯度按范数 1 裁剪），用强制教学最小化目标词元的交叉熵。冒烟模式只训练 250 个小批量，
# 每批 64 个长为 1 到 8 个字母的字符串。

# %%
max_len, steps, batch_size = pick((16, 600, 128), (8, 250, 64))
config = TrainConfig(task="reverse", min_len=1, max_len=max_len, num_train=steps * batch_size, num_heldout=600)
data = build_data(config)
train_arrays = seq2seq_arrays(data.train, data.src_vocab, data.tgt_vocab, data.num_steps, data.tgt_num_steps)
pad = data.tgt_vocab["<pad>"]
print(f"{len(data.train)} training pairs, e.g. {''.join(data.train[0][0])!r} -> {''.join(data.train[0][1])!r}")


def fit(model):
    """Train ``model`` on the reversal pairs with the recipe of `minitensor train`: (seconds, last loss)."""
    optimizer = build_optimizer(config, model)
    scheduler = build_scheduler(config, optimizer, steps)
    batches = Batches(*train_arrays, batch_size=batch_size, rng=np.random.default_rng(0))  # 所有模型顺序相同
    start = time.perf_counter()
    model.train()
    for enc_X, enc_valid_lens, dec_X, _, Y in batches:
        loss = mt.cross_entropy(model(enc_X, dec_X, enc_valid_lens), Y, ignore_index=pad)
        optimizer.zero_grad()
        loss.backward()
        mt.optim.clip_grad_norm_(model.parameters(), config.clip_grad_norm)
        optimizer.step()
        scheduler.step()
    return time.perf_counter() - start, loss.item()


sources = [s for s, _ in data.heldout]
lengths = np.array([len(s) for s in sources])
sizes = np.arange(1, max_len + 1)


def exact_by_length(model):
    """Greedy decoding of every held-out string; exact match overall and per input length."""
    hyps = translate(model, sources, data.src_vocab, data.tgt_vocab, data.num_steps, max_len=data.tgt_num_steps)
    right = np.array([hyp.tokens == target for hyp, (_, target) in zip(hyps, data.heldout)])
    return right.mean(), np.array([right[lengths == n].mean() for n in sizes])


def gru_model(attention):
    mt.manual_seed(0)  # 两个模型的编码器初始值相同
    encoder = nn.Seq2SeqEncoder(len(data.src_vocab), 32, 32, 1)
    cls = nn.Seq2SeqAttentionDecoder if attention else nn.Seq2SeqDecoder
    return nn.Seq2Seq(encoder, cls(len(data.tgt_vocab), 32, 32, 1))


results = {}
for name, attention in (("no attention", False), ("Bahdanau", True)):
    model = gru_model(attention)
    seconds, loss = fit(model)
    overall, by_length = exact_by_length(model)
    results[name] = dict(model=model, seconds=seconds, loss=loss, exact=overall, by_length=by_length)
    print(f"{name:>12}: {seconds:5.1f} s, final loss {loss:.3f}, held-out exact match {overall:.1%}")
    print("              by length:", " ".join(f"{n}:{a:.0%}" for n, a in zip(sizes, by_length)))

# %% [markdown]
# 精确匹配随输入长度的变化：

# %%
from matplotlib.figure import Figure

fig = Figure(figsize=(6.4, 3.8))
ax = fig.subplots()
for name, label, marker in (
    ("no attention", "without attention (context = last state)", "o"),
    ("Bahdanau", "Bahdanau attention (additive)", "s"),
):
    ax.plot(sizes, results[name]["by_length"], marker=marker, label=text(label))
ax.set_xlabel(text("input length n (letters)"))
ax.set_ylabel(text("held-out exact match"))
ax.set_ylim(-0.03, 1.03)
ax.set_xticks(sizes)
ax.legend(loc="best")
ax.set_title(text("reversing strings: the fixed context is a bottleneck"))
fig.tight_layout()
fig.savefig(figure_path(T, "accuracy_vs_length.png"), dpi=110)
print("wrote", figure_path(T, "accuracy_vs_length.png"))

plain, bahdanau = results["no attention"]["by_length"], results["Bahdanau"]["by_length"]
short, long = sizes <= max_len // 4, sizes > 3 * max_len // 4
print(
    f"lengths 1-{max_len // 4}: {plain[short].mean():.0%} without attention, {bahdanau[short].mean():.0%} with; "
    f"lengths {3 * max_len // 4 + 1}-{max_len}: {plain[long].mean():.0%} without, {bahdanau[long].mean():.0%} with"
)
assert plain[short].mean() >= 0.9, "short strings fit through the bottleneck"
assert plain[long].mean() <= 0.1, "long ones do not"
assert bahdanau[long].mean() >= plain[long].mean() + 0.3, "attention reads the source where it needs it"
if not SMOKE:
    assert bahdanau.min() >= 0.9, "with attention every length up to 16 is reversed"

# %% [markdown]
# 完整运行的曲线（600 个留出字符串，每种长度约 37 个）：不带注意力的模型能反转所有 1 到 2
# 个字母的留出字符串、97% 的 3 个字母的字符串、87% 的 4 个字母的字符串——然后跌下悬崖：
# 5 个字母时 68%，6 个时 35%，8 个时 20%，10 个时 3%，从 11 个字母起一个也反转不了
# （全部留出字符串的 32.3%）。带注意力的同一个 GRU 反转了其中的 100%，直到 16 个字母的每种
# 长度都是如此——数据相同、步数相同，参数只多 2,080 个。32 个数组成的向量原则上装得下 16 个
# 取自 10 个字母的字母表的字母（约 53 比特）；瓶颈的代价在于要用梯度下降学会把它们按顺序
# 装进这个向量、再取出来。这正是《动手学深度学习》10.4 的出发点：即使并非所有输入（源）词元
# 都对解码某个词元都有用，在每个解码步骤中仍使用编码相同的上下文变量。
#
# ## 模型找到的对齐
#
# 每个输出步看了哪些源字母？`translate(..., attention=True)` 保留每个解码步的注意力权重；
# `plot_seq2seq_attention` 把它们画出来，每个输出步一行（其查询是读完此前词元后的隐状态），
# 每个源位置一列。

# %%
model = results["Bahdanau"]["model"]
example = next(s for s in sources if len(s) == max_len)
hyp = translate(
    model, example, data.src_vocab, data.tgt_vocab, data.num_steps, max_len=data.tgt_num_steps, attention=True
)
src_labels, tgt_labels = list(example) + ["<eos>"], list(hyp.tokens) + ["<eos>"] * hyp.ended
plot_seq2seq_attention(
    hyp.attention,
    src_labels,
    tgt_labels,
    path=figure_path(T, "alignment.png"),
    lang=LANG,
    suptitle=text("Bahdanau attention, reversing {source}", source="".join(example)),
)
print(f"{''.join(example)!r} -> {''.join(hyp.tokens)!r}; wrote {figure_path(T, 'alignment.png')}")
W = hyp.attention  # （输出步, 源位置），每个打分的词元一行，含 <eos>
n = len(example)
assert W.shape == (len(hyp.tokens) + hyp.ended, n + 1) and np.allclose(W.sum(-1), 1, atol=1e-5)
# 第 t 个输出步（从 0 起）写出源字母 j = n - 1 - t；键 h_j 是读完它之后的隐状态
rows = range(min(n, len(hyp.tokens)))
on_letter = {d: np.mean([W[t, n - 1 - t + d] for t in rows]) for d in (-1, 0, 1)}  # h_{j+d} 上的权重
band = np.mean([W[t, n - 1 - t : n + 1 - t].sum() for t in rows])  # h_j 或 h_{j+1} 上的权重
for d, w in on_letter.items():
    print(f"mean weight on h_(j{d:+d}): {w:.2f}")
print(f"mean weight on h_j and h_(j+1) together: {band:.2f} (uniform: {2 / (n + 1):.2f})")
assert band > 1.5 * (2 / (n + 1)), "attention concentrates where the letter being written was read"
if not SMOKE:
    assert band >= 0.8, "the trained model's alignment is the anti-diagonal"

# %% [markdown]
# 这张图是一条反对角线：第 $t'$ 个输出步要写出倒过来读的源字母 $x_j$，它看的是 $x_j$ 附近的
# 源序列。不过并不恰好是 $x_j$ 的键 $\mathbf h_j$：在完整运行中，$\mathbf h_j$ 上的平均权重为
# 0.11，而晚一步的编码器隐状态 $\mathbf h_{j+1}$ 上为 0.76（两者合计 0.87，均匀的权重只会给
# 0.12）。两者都含有 $x_j$：这个编码器只从前往后读，$\mathbf h_{j+1}$ 由 $x_{j+1}$ *和*
# $\mathbf h_j$ 算出，模型发现这个隐状态是更好的键。（Bahdanau 等人用的是双向编码器，
# 它对第 $j$ 个词的注释概括了这个词两侧的词。）没有人告诉模型反转就是倒着读：对齐模型
# 从损失中学会了这一点，这就是 Bahdanau 等人在论文图 3 中画出的软对齐，英语词和法语词
# 大体沿着对角线排列。
#
# ## 与教程 7 的 Transformer 比较
#
# 同一任务、同样的 600 个小批量、同样的训练配方，换成教程 7 的模型：`minitensor train` 的
# 默认模型，即《动手学深度学习》中的小型 Transformer（`num_hiddens` 32，4 个头，2 + 2 个块，
# pre-LN）。它完全没有循环：源序列的每个位置到目标序列的每个位置都只隔一步注意力。

# %%
mt.manual_seed(0)
transformer = build_model(config, data.src_vocab, data.tgt_vocab)  # config.model 为 "transformer"
seconds, loss = fit(transformer)
overall, by_length = exact_by_length(transformer)
results["Transformer"] = dict(model=transformer, seconds=seconds, loss=loss, exact=overall, by_length=by_length)

rows = []
print(f"{'model':<30} {'parameters':>10} {'training (s)':>12} {'exact match':>11} {'longest quarter':>15}")
for name, label in (
    ("no attention", "GRU, no attention (D2L 9.7)"),
    ("Bahdanau", "GRU + Bahdanau (D2L 10.4)"),
    ("Transformer", "Transformer (D2L 10.7)"),
):
    r = results[name]
    r["parameters"] = count(r["model"])
    print(
        f"{label:<30} {r['parameters']:>10,} {r['seconds']:>12.1f} {r['exact']:>11.1%} {r['by_length'][long].mean():>15.1%}"
    )
params = {name: r["parameters"] for name, r in results.items()}
assert params["no attention"] < params["Bahdanau"] < params["Transformer"]
assert results["Transformer"]["by_length"][long].mean() >= results["no attention"]["by_length"][long].mean() + 0.3
if not SMOKE:
    assert min(results[m]["exact"] for m in ("Bahdanau", "Transformer")) >= 0.95

# %% [markdown]
# 完整运行的结果（在 2 个 CPU 核上计时；时间因机器、因每次运行而异）：
#
# | 模型 | 参数量 | 训练（秒） | 精确匹配 | 长度 13–16 |
# |---|---:|---:|---:|---:|
# | GRU，无注意力（《动手学深度学习》9.7） | 17,102 | 6.1 | 32.3% | 0.0% |
# | GRU + Bahdanau（《动手学深度学习》10.4） | 19,182 | 27.2 | 100.0% | 100.0% |
# | Transformer（《动手学深度学习》10.7） | 43,470 | 20.8 | 100.0% | 100.0% |
#
# 两个带注意力的模型都解决了这个任务，不带注意力的模型则没有。Transformer 的参数量是
# Bahdanau 模型的 2.3 倍，在这里训练用时却略少一些。时间花在不同的地方。不带注意力的解码器
# 一次调用就让 GRU 跑完整个目标序列；Bahdanau 解码器却必须为每个目标词元依次在 Python 中
# 运行一步 GRU 和一次注意力，因为第 $t'$ 步的查询是第 $t'-1$ 步产生的隐状态——因此它的
# 训练用时是不带注意力的模型的数倍（这次运行是 4.5 倍）。Transformer 没有循环：训练时它一次处理一个序列的
# 全部位置，用的是更大的矩阵乘法，这正是它能随硬件一起扩展的原因（《动手学深度学习》10.6
# 比较了两者：循环神经网络的顺序操作为 $\mathcal O(n)$，自注意力为 $\mathcal O(1)$）。
#
# ## 练习
#
# 1. 给不带注意力的模型 64 或 128 个隐藏单元（`gru_model` 构建两个 GRU 模型）。悬崖向后
#    移了多远？它会消失吗？
# 2. 《动手学深度学习》的模型有两层 GRU。用 `num_layers=2` 构建两个 GRU 模型，重新测量曲线。
# 3. 把加性评分函数换成 `scorer="scaled_dot"`（`nn.Seq2SeqAttentionDecoder(...,
#    scorer="scaled_dot")`）：查询和键于是直接比较，没有可学习的 $\mathbf W_q$、$\mathbf W_k$。
#    模型还能找到反对角线吗？
# 4. 在 1 到 12 个字母的字符串上训练，在 13 到 16 个字母的字符串上测试
#    （`TrainConfig(heldout_min_len=13, heldout_max_len=16)`）。三个模型中哪一个能外推到更长的输入？
# 5. 用 `minitensor train --model bahdanau` 在教程 7 的日期任务上训练 Bahdanau 模型，
#    看看运行目录中的 `attention.png`。
#
# ## 在引擎中的位置
#
# * `minitensor/core/nn/seq2seq.py` —— `Seq2SeqEncoder`、`Seq2SeqDecoder`（无注意力）、
#   `Seq2SeqAttentionDecoder`（Bahdanau）、`Seq2Seq`；
# * `plugins/minitensor_plugins/scorers.py` —— `additive` 评分函数（`AdditiveScorer`）；
# * `minitensor/core/nn/attention.py` —— `Attention`，把评分函数和汇聚连在一起的层；
# * `minitensor/core/nn/rnn.py` —— `GRU`；
# * `minitensor/data/tasks.py` —— `reverse_task`；`minitensor/data/batching.py` —— `seq2seq_arrays`、`Batches`；
# * `minitensor/train/config.py` —— `build_model`、`build_optimizer`、`build_scheduler`；
# * `minitensor/inference/decoding.py` —— `translate`、贪心搜索和束搜索；
# * `minitensor/train/plots.py` —— `plot_seq2seq_attention`。
