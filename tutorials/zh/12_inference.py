# %% [markdown]
# # 12. 推理：键值缓存、注意力汇点、8 位量化、采样与推测解码
#
# 训练结束了，现在模型要开始写作。仅含解码器的语言模型一次写出一个词元，每个新词元又作为下一步的输入送回模型：
# 它是自回归的，正如 D2L 中 Transformer 的解码器在预测时那样。本教程讲的就是这时发生的事情，
# 其中每个部件都是可以替换、可以检查的插件，就像教程 4 中的评分函数一样：
#
# 1. 键值缓存：教程 5 中注意力的记忆。它保存什么，它不改变任何结果（实测），它节省多少时间，占用多少内存；
# 2. 注意力汇点与 StreamingLLM：这里训练的小模型把注意力放在哪里；当文本超出训练时的上下文长度时，
#    保留全部位置、只保留最后 $W$ 个位置、或者保留最前面几个位置加最后 $W$ 个位置的缓存各会怎样；
# 3. 8 位的缓存，即量化：每个数的误差，以及注意力输出的误差界，在模型上检验；
# 4. 同一个提示上的各种采样方法：贪心搜索、带温度的采样、top-k、top-p、min-p 和重复惩罚，
#    每一种都在模型的评分上对照其公式检验；
# 5. 推测解码：推导其接受规则并精确检验，然后配合一个小的草稿模型使用；
# 6. 我们自己的缓存策略：注册它，并用契约检查工具包检查它。
#
# 运行 `python tutorials/zh/12_inference.py`（在 2 个空闲的 CPU 核上约一分钟，与其他程序共享时要几分钟），或用 jupytext 把它作为笔记本打开。
# `MINITENSOR_TUTORIAL_SMOKE=1`（冒烟模式）把一切缩小到几秒钟。
#
# 资料来源：D2L 的注意力机制一章，中文版《动手学深度学习》（zh.d2l.ai）的 10.5 多头注意力和
# 10.7 Transformer（预测时的解码器），以及英文版 *Dive into Deep Learning*（d2l.ai）的
# 11.5 "Multi-Head Attention" 和 11.7 "The Transformer Architecture"；贪心搜索见 9.8 束搜索
# （英文版 10.8 "Beam Search"）。其余内容书中没有，来自论文，列在文末：注意力汇点见 Xiao 等人（2023），
# 8 位缓存见 Liu 等人（2024），各种采样方法见 Fan 等人（2018）、Holtzman 等人（2020）、Nguyen 等人（2024）
# 和 Keskar 等人（2019），推测解码见 Leviathan 等人（2023）和 Chen 等人（2023）。

# %%
import time

import numpy as np
from _tutorial import LABELS, SMOKE, expect_error, figure_path, pick, text  # text()：图中文字使用教程的语言
from matplotlib.figure import Figure

import minitensor as mt
from minitensor.data import TEXTS
from minitensor.inference import decoder, generate
from minitensor.testing import KEEPS, attention_error_bound, check_cached_generation, check_kv_cache
from minitensor.train import TrainConfig
from minitensor.train.config import build_data, build_model, build_optimizer, build_scheduler

T = "12_inference"
mt.manual_seed(0)
print("smoke mode" if SMOKE else "full mode")
LABELS["zh"].update(  # 本教程图中文字的中文（术语见 tutorials/GLOSSARY.md）
    {
        "tokens already in the text": "文本中已有的词元数",
        "time per new token (ms)": "每个新词元的时间（ms）",
        "with a key/value cache (full)": "使用键值缓存（full）",
        "recomputing the whole text": "重新计算整段文本",
        "decoding one token at a time": "一次解码一个词元",
        "attention weight on the first token": "第一个词元上的注意力权重",
        "uniform attention": "均匀注意力",
        "block {b}": "第 {b} 块",
        "the model's attention on position 0": "模型在位置 0 上的注意力",
        "position in the held-out text": "留出文本中的位置",
        "loss (nats per character)": "损失（每个字符的奈特数）",
        "trained context": "训练时的上下文长度",
        "streaming past the trained context": "越过训练时的上下文长度的流式生成",
    }
)

# %% [markdown]
# ## 1. 缓存：注意力的记忆
#
# 多头注意力（教程 5）把每个词元 $\mathbf x_t$ 在每个头中投影为查询 $\mathbf q_t = \mathbf W_q \mathbf x_t$、
# 键 $\mathbf k_t = \mathbf W_k \mathbf x_t$ 和值 $\mathbf v_t = \mathbf W_v \mathbf x_t$；在解码器的掩蔽自注意力中，
# 位置 $t$ 上的词元关注位置 $0, \dots, t$ 的键和值：
#
# $$\mathbf o_t = \sum_{j \le t} \alpha(\mathbf q_t, \mathbf k_j)\, \mathbf v_j, \qquad
# \alpha(\mathbf q_t, \mathbf k_j) = \operatorname{softmax}_j\big(\mathbf q_t^\top \mathbf k_j / \sqrt d\big).$$
#
# 当模型写第 $t + 1$ 个词元时，位置 $0, \dots, t$ 上的一切都没有变：它们的键和值就是前面各步算出的那些
# （每个只取决于自己的 $\mathbf x_j$，而因果掩蔽使 $\mathbf x_j$ 看不到后面的词元）。所以该层把它们保存下来，
# 每一步只计算新词元的 $\mathbf q, \mathbf k, \mathbf v$。这份记忆就是键值缓存。在 minitensor 中，它是该层调用的一个对象，
# 即*缓存策略*：`MultiHeadAttention.cached_self_attention(x_new, cache)` 对新词元做投影，
# `cache.append(k, v, positions)` 把它们存起来，新的查询再关注 `cache.keys()` 和 `cache.values()`。
# 策略 `full` 保存全部位置；它必须给出与整个因果前向传播完全相同的结果。下面是一个使用旋转位置编码的层，
# float64，十个词元：

# %%
mha = mt.nn.MultiHeadAttention(16, 4, 0.0, positional="rotary", max_len=64, dtype="float64").eval()
X = mt.tensor(np.random.default_rng(0).standard_normal((1, 10, 16)))
Full = mt.plugins.lookup("kv cache", "full")
with mt.no_grad():
    whole = mha(X, X, X, causal=True).numpy()  # 训练时的前向传播：一次处理所有位置
    cache, rows = Full(), []
    for t in range(X.shape[1]):  # 解码：一次一个词元
        out, cache = mha.cached_self_attention(X[:, t : t + 1], cache)
        rows.append(out.numpy())
        if t in (0, 1, 9):
            print(f"after token {t}: keys {tuple(cache.keys().shape)}, positions {cache.positions()}")
    q, k = mha.project_and_split(mha.W_q, X), mha.project_and_split(mha.W_k, X, mha.num_kv_heads)
    _, rotated = mha.positional(q, k)  # 旋转位置编码把键旋转到位置 0..9
    values = mha.project_and_split(mha.W_v, X, mha.num_kv_heads)
difference = np.abs(np.concatenate(rows, axis=1) - whole).max()
print(f"token by token with the full cache vs the whole causal pass: max difference {difference:.1e}")
assert difference < 1e-12
assert np.allclose(cache.keys().numpy(), rotated.numpy()) and np.allclose(cache.values().numpy(), values.numpy())
print(cache)

# %% [markdown]
# 缓存在每个头中保存到目前为止每个位置旋转后的键 $\mathbf k_j$ 和值 $\mathbf v_j$
# （形状为 (批量, 头, 位置, $d$)），而查询从不保存：每个查询只在自己那一步用一次。缓存保存哪些数，
# 正是下面各种策略所改变的；层的其余部分保持不变。
#
# ## 2. 一个用来解码的小语言模型
#
# 下面的内容都使用同一个模型：在 minitensor 自带的 tiny Shakespeare 文本上训练的字符级 GPT
# （即去掉编码器－解码器注意力的 D2L Transformer 解码器），采用 `minitensor train --preset gpt-char`
# 的训练方案（pre-LN 的块、AdamW、学习率先预热再余弦衰减、梯度按范数 1 裁剪），并使用旋转位置编码，
# 使得超出训练时上下文长度的位置也存在。它比该预设的模型小，半分钟就能训练完：4 个块，64 个隐藏单元，
# 4 个头，上下文长度为 64 个字符，1,000 个小批量，每个小批量含 16 个随机窗口（冒烟模式：2 个块，32 个隐藏单元，
# 上下文长度 16，40 个小批量）。文本的最后 10% 留作留出集。然后是一个只有其四分之一大小（一个块）、
# 以同样方式训练的*草稿*模型，供第 7 节使用。

# %%
context, blocks, hiddens, steps = pick((64, 4, 64, 1000), (16, 2, 32, 40))
config = TrainConfig.recipe(
    preset="gpt-char",
    text=TEXTS["tinyshakespeare"],
    positional="rotary",
    positional_options={"max_len": 8192},
    num_hiddens=hiddens,
    ffn_num_hiddens=4 * hiddens,
    num_heads=4,
    num_blks=blocks,
    lm_num_steps=context,
    batch_size=16,
    steps=steps,
    warmup_steps=pick(100, 5),
)
data = build_data(config)
train_ids, heldout, vocab = np.asarray(data.train), np.asarray(data.heldout), data.tgt_vocab
print(f"{len(train_ids):,} training and {len(heldout):,} held-out characters, {len(vocab)} in the vocabulary")


def fit(config, seed=0):
    """The gpt-char recipe on random windows of the training text: (model, seconds, last loss)."""
    mt.manual_seed(seed)
    model = build_model(config, vocab, vocab)
    optimizer = build_optimizer(config, model)
    scheduler = build_scheduler(config, optimizer, config.steps)
    n = config.lm_num_steps
    starts = np.random.default_rng(seed).integers(0, len(train_ids) - n - 1, (config.steps, config.batch_size))
    model.train()
    begin = time.perf_counter()
    for s in starts:
        window = train_ids[s[:, None] + np.arange(n + 1)]  # 输入及其各自的下一个字符
        loss = mt.cross_entropy(model(mt.tensor(window[:, :-1])), mt.tensor(window[:, 1:]))
        optimizer.zero_grad()
        loss.backward()
        mt.optim.clip_grad_norm_(model.parameters(), config.clip_grad_norm)
        optimizer.step()
        scheduler.step()
    return model.eval(), time.perf_counter() - begin, loss.item()


def count(model):
    return sum(p.numel() for p in model.parameters())


lm, seconds, loss = fit(config)
print(f"target: {count(lm):,} parameters, trained in {seconds:.0f} s, last training loss {loss:.2f}")
draft, seconds, loss = fit(TrainConfig(**{**vars(config), "num_blks": 1}))
print(f"draft:  {count(draft):,} parameters, trained in {seconds:.0f} s, last training loss {loss:.2f}")

# %% [markdown]
# ## 3. 缓存节省了什么，又花费了什么
#
# 在模型上，`check_cached_generation`（来自契约检查工具包）用完整缓存贪心地生成，每个词元调用一次 `decode_step`，
# 并把每一步的 logits 与对整段生成文本的一次因果前向传播相比较——后者就是每一步都重新计算所得到的结果。

# %%
generated = pick(300, 40)
worst = check_cached_generation(lm, steps=generated, atol=1e-4)
print(f"{generated} tokens with the full cache vs recomputing: max logit difference {worst:.1e} (float32)")

# %% [markdown]
# 时间。没有缓存时，长度为 $t$ 的文本之后的那个词元，需要整个模型对 $t + 1$ 个位置做一次前向传播；
# 有了缓存，只需对一个位置做一次前向传播，其注意力读取 $t + 1$ 个缓存的键。下面按文本长度递增，
# 测量每个新词元的时间（几步的中位数）：

# %%
lengths = pick((32, 128, 512, 2048), (8, 32, 64))
repeats = pick(5, 2)
cached_ms, recomputed_ms = [], []
with mt.no_grad():
    for n in lengths:
        ids = heldout[: n + repeats + 1]
        _, state = lm.decode_step(mt.tensor([ids[:n]]), lm.begin_decoding())  # 到目前为止的文本，一步送入
        times = []
        for i in range(repeats):
            begin = time.perf_counter()
            _, state = lm.decode_step(mt.tensor([ids[n + i : n + i + 1]]), state)
            times.append(time.perf_counter() - begin)
        cached_ms.append(1000 * np.median(times))
        times = []
        for i in range(repeats):
            begin = time.perf_counter()
            lm(mt.tensor([ids[: n + i + 1]]))
            times.append(time.perf_counter() - begin)
        recomputed_ms.append(1000 * np.median(times))
print(f"{'text length t':>14} {'cache (ms)':>11} {'recompute (ms)':>15} {'speed-up':>9}")
for n, c, r in zip(lengths, cached_ms, recomputed_ms):
    print(f"{n:>14,} {c:>11.2f} {r:>15.2f} {r / c:>8.1f}x")
if not SMOKE:  # 冒烟模式的文本太短，差别淹没在计时的噪声中
    assert recomputed_ms[-1] > 5 * cached_ms[-1], "at 2,048 tokens the cache is several times faster"

fig = Figure(figsize=(6.0, 3.6))
ax = fig.subplots()
ax.plot(lengths, cached_ms, marker="o", label=text("with a key/value cache (full)"))
ax.plot(lengths, recomputed_ms, marker="s", label=text("recomputing the whole text"))
ax.set_xscale("log", base=2)
ax.set_yscale("log")
ax.set_xlabel(text("tokens already in the text"))
ax.set_ylabel(text("time per new token (ms)"))
ax.set_title(text("decoding one token at a time"))
ax.legend(loc="best")
fig.tight_layout()
fig.savefig(figure_path(T, "time_per_token.png"), dpi=110)
print("wrote", figure_path(T, "time_per_token.png"))

# %% [markdown]
# 完整运行中，从 32 到 2,048 个词元，使用缓存的一步需要 1.4 到 2.4 ms，重新计算则需要 1.9 到 127 ms：
# 在 2,048 个词元时慢 54 倍，而且差距随 $t$ 增大（在机器更繁忙时的几次运行中，2,048 个词元时分别是 52 倍和 101 倍）。
# 使用缓存的一步也在变慢——它的注意力要读取 $t + 1$ 个键——但在这样的规模下，与前向传播的其余部分相比这一点很小。
#
# 内存。每个块为它的 $g$ 个键值头（即教程 5 中的头；使用分组查询注意力时更少，见教程 9）
# 中的每一个、以及 $t$ 个词元中的每一个，各保存一个 $d$ 维的键和一个 $d$ 维的值：
#
# $$\text{cache} = 2 \cdot t \cdot g \cdot d \ \text{numbers per layer} \quad (\times 4 \text{ bytes in float32}, \times L \text{ layers}).$$
#
# 即每层 $2tgd$ 个数（float32 每个数 4 字节，共 $L$ 层）。各策略用 `bytes()` 报告它们占用的内存：

# %%
attention = lm.decoder.blks[0].attention1
g, d = attention.num_kv_heads, attention.head_size
with mt.no_grad():
    for n in (lengths[0], lengths[-1]):
        _, state = lm.decode_step(mt.tensor([heldout[:n]]), lm.begin_decoding("full"))
        held = sum(c.bytes() for c in state[2])  # state[2]：每个块一个缓存
        print(f"t = {n:5,}: {held:>10,} bytes = {blocks} layers x 2 x {n} x g={g} x d={d} x 4 bytes")
        assert held == blocks * 2 * n * g * d * 4

# %% [markdown]
# 它随 $t$ 线性增长，而且没有尽头：一个不停写下去的模型需要越来越多的内存，每一步还要把它全部读一遍。
# 少保存一些，是接下来两节的主题。
#
# ## 4. 注意力汇点，以及比上下文更长的文本
#
# Xiao 等人（2023，StreamingLLM）观察了训练好的语言模型（Llama-2、MPT、Falcon、Pythia）的注意力，发现除了前两层，
# 大多数头把很大一部分权重放在文本的*第一个*词元上，无论这个词元是什么。他们的解释是 softmax：
# 一行的权重之和必须为 1，所以一个头即使对当前查询找不到任何有用的东西，也必须把权重放在某处；
# 而第一个词元是之后每个查询都能看到的，训练便学会了把权重停放在那里。他们把这样的词元称为*注意力汇点*。
# 后果是：只保存最后 $W$ 个位置的缓存（`window` 策略，即滑动窗口注意力）在文本超过 $W$ 个词元后就失去了汇点，
# 它们承载的权重转移到有意义的词元上，模型随之崩溃；在窗口之外再保留前 4 个词元（`sinks`）就能修复这一点。
#
# 我们的小模型也这样做吗？看它自己的注意力权重：在 32 个长度等于训练长度的留出窗口上，
# 取每个窗口后半部分的查询（均匀分配时每个键的权重约为 $1/48$）：

# %%
windows = np.stack([heldout[s : s + context] for s in range(0, 32 * context, context)])
with mt.no_grad(), mt.nn.attention.plain_attention(lm):  # 普通路径：保留全部权重
    lm(mt.tensor(windows))
first = np.array([w.numpy()[:, :, context // 2 :, 0].mean(axis=(0, 2)) for w in lm.attention_weights])
uniform = np.mean(1 / (np.arange(context // 2, context) + 1))
print("attention weight on position 0 (rows: blocks, columns: heads); uniform would be", f"{uniform:.3f}")
for b, row in enumerate(first):
    print(f"  block {b + 1}: " + "  ".join(f"{w:.3f}" for w in row))
strongest = np.unravel_index(first.argmax(), first.shape)
w0 = first.max()
print(
    f"largest: block {strongest[0] + 1}, head {strongest[1] + 1}, {w0:.3f} ({w0 / uniform:.1f} times uniform); "
    f"evicting position 0 would multiply its other weights by 1 / (1 - {w0:.3f}) = {1 / (1 - w0):.3f}"
)
assert first.shape == (blocks, 4) and ((0 <= first) & (first <= 1)).all()

fig = Figure(figsize=(6.4, 3.2))
ax = fig.subplots()
width = 0.8 / first.shape[1]
for h in range(first.shape[1]):
    ax.bar(np.arange(blocks) + h * width, first[:, h], width, label=text("head {h}", h=h + 1))
ax.axhline(uniform, color="black", linestyle="--", linewidth=1, label=text("uniform attention"))
ax.set_xticks(np.arange(blocks) + 0.4 - width / 2, [text("block {b}", b=b + 1) for b in range(blocks)])
ax.set_ylabel(text("attention weight on the first token"))
ax.set_title(text("the model's attention on position 0"))
ax.legend(loc="best", fontsize=8)
fig.tight_layout()
fig.savefig(figure_path(T, "first_token_attention.png"), dpi=110)
print("wrote", figure_path(T, "first_token_attention.png"))

# %% [markdown]
# 完整运行的答案是否定的：位置 0 上的权重在 0.005 到 0.018 之间，在每个块、每个头中都低于均匀值 0.021
# （它随深度增加，从第 1 块的 0.005–0.007 增加到第 4 块的 0.014–0.018，但仍低于均匀值）。这个模型有 4 个块，
# 在从文本任意位置开始的 64 个字符的窗口上训练了 1,000 步，没有学到汇点。（论文中的模型有数十亿个参数，
# 在数千个词元长的文本上训练，而且所有文本都以同一个词元开头。）那么长文本会对它造成什么影响？
# 流式生成：把留出文本一次一个字符地送入模型，长度为训练时上下文长度的 16 倍，使用三种在有界时都保存相同的
# 64 个位置的策略：`full`（全部）、`window`（最后 64 个）和 `sinks`（前 4 个加最后 60 个）。
# 损失是每个下一个字符的交叉熵，按位置区间取平均：


# %%
def streamed_losses(model, ids, cache, options):
    """The next-character loss at every position of ids, fed one token at a time through the cache."""
    losses = []
    with mt.no_grad():
        state = model.begin_decoding(cache, options)
        for t in range(len(ids) - 1):
            logits, state = model.decode_step(mt.tensor([[int(ids[t])]]), state)
            losses.append(-mt.log_softmax(logits[0, -1], axis=-1).numpy()[ids[t + 1]])
    return np.array(losses), sum(c.bytes() for c in state[2])


N = pick(1024, 96)
policies = {"full": {}, "window": {"window": context}, "sinks": {"sinks": 4, "window": context - 4}}
ranges = [(0, context), (context, 4 * context), (4 * context, N)]
curves, memory = {}, {}
for name, options in policies.items():
    curves[name], memory[name] = streamed_losses(lm, heldout[: N + 1], name, options)
print(f"{'policy':<8}" + "".join(f"{f'positions {a}-{b - 1}':>20}" for a, b in ranges) + f"{'cache at the end':>20}")
for name, curve in curves.items():
    means = "".join(f"{curve[a:b].mean():>20.3f}" for a, b in ranges)
    print(f"{name:<8}{means}{memory[name]:>14,} bytes")
for name in ("window", "sinks"):  # 在上下文长度以内，三种策略保存相同的词元
    assert np.allclose(curves[name][:context], curves["full"][:context], atol=1e-4)
assert memory["window"] == memory["sinks"] < memory["full"]

fig = Figure(figsize=(6.4, 3.6))
ax = fig.subplots()
smooth = np.ones(context) / context
for name, curve in curves.items():
    ax.plot(np.arange(len(curve) - context + 1) + context - 1, np.convolve(curve, smooth, "valid"), label=name)
ax.axvline(context, color="black", linestyle="--", linewidth=1, label=text("trained context"))
ax.set_xlabel(text("position in the held-out text"))
ax.set_ylabel(text("loss (nats per character)"))
ax.set_title(text("streaming past the trained context"))
ax.legend(loc="best")
fig.tight_layout()
fig.savefig(figure_path(T, "streaming_loss.png"), dpi=110)
print("wrote", figure_path(T, "streaming_loss.png"))

# %% [markdown]
# 完整运行的结果（每个字符的奈特数；第一列是模型在其上下文长度以内的损失）：
#
# | 策略 | 位置 0–63 | 64–255 | 256–1023 |
# |---|---:|---:|---:|
# | `full` | 2.26 | 2.36 | 3.12 |
# | `window`（64） | 2.26 | 2.03 | 2.01 |
# | `sinks`（4 + 60） | 2.26 | 2.03 | 2.03 |
#
# 这里崩溃的不是 `window` 而是 `full`：它的查询遇到了模型在训练中从未见过的距离（最远 1,023，而训练时最远 63），
# 损失随文本长度上升，在位置 256 之后达到 3.12 奈特（而且最后 `full` 占用的内存是其他两者的 16 倍）。
# `window` 和 `sinks` 使所有距离都保持在训练过的范围之内，损失保持在模型自身的水平
# （略低于第一列，因为第一列包含文本开头那几个几乎没有上下文可用来预测的字符）。
# `window` 没有崩溃，是因为这个模型没有汇点可以失去；`sinks` 也没有让它付出任何代价。
# 论文中 `window` 的崩溃是学到了汇点的模型的性质，而上面的测量就是检验一个模型是否学到了汇点的方法。
#
# `sinks` 如何让使用旋转位置编码的模型保持在训练过的距离以内：它*重新编号*。保存下来的词元得到的是它们
# *在缓存中*的位置 $0, 1, \dots$，而不是它们在文本中的位置（"positions within the cache rather than those in
# the original text"，Xiao 等人 2023），因此最远的键离查询永远不超过 $S + W - 1$ 个位置。
# `kept()` 给出词元在文本中的位置，`positions()` 给出注意力所用的位置；该策略声明 `reindexes = True`，
# 于是该层在每一步都按新的位置旋转保存下来的键。2 个汇点、窗口为 4，10 个词元之后：

# %%
Sinks = mt.plugins.lookup("kv cache", "sinks")
with mt.no_grad():
    cache = Sinks(sinks=2, window=4)
    for t in range(10):
        _, cache = mha.cached_self_attention(X[:, t : t + 1], cache)
print("kept():     ", cache.kept(), "  (positions in the text)")
print("positions():", cache.positions(), "  (positions the attention uses)")
text_positions, positions = KEEPS["sinks"]({"sinks": 2, "window": 4})(9)  # 契约检查工具包中 sinks 的定义
assert list(cache.kept()) == list(text_positions) == [0, 1, 6, 7, 8, 9] and list(positions) == [0, 1, 2, 3, 4, 5]
for name, options in (("window", {"window": 4}), ("sinks", {"sinks": 2, "window": 4})):
    assert check_kv_cache(name, options, positional="rotary")
    print(f"check_kv_cache({name!r}, {options}, positional='rotary'): decoding = its definition without a cache")

# %% [markdown]
# `check_kv_cache` 让随机词元逐个通过一个使用该策略的 float64 层进行解码，再根据策略的定义
# （`KEEPS`：位置 $t$ 上的词元关注哪些词元、把它们放在哪些位置）*不用*缓存重新计算每个词元的输出；
# 这里两种策略都用旋转位置编码检查。
#
# ## 5. 8 位的缓存
#
# `int8` 策略保存全部位置，但把每个键和值（一个头、一个词元的 $d$ 个数）存为 8 位整数，并带有它自己的
# 缩放因子 $s$ 和零点 $z$（逐词元的非对称量化，同 KIVI，Liu 等人 2024）：
#
# $$z = \min_i x_i, \qquad s = \frac{\max_i x_i - \min_i x_i}{255}, \qquad
# c_i = \operatorname{round}\Big(\frac{x_i - z}{s}\Big) \in \{0, \dots, 255\}, \qquad \hat x_i = c_i s + z.$$
#
# 舍入到最近的整数码，每个数最多移动半步：$|x_i - \hat x_i| \le s / 2$。每个头、每个词元的内存：
# $d$ 个字节加上 float16 的缩放因子和零点（4 个字节），而 float32 需要 $4d$ 个字节，比值为 $(d + 4) / 4d$。
# 在模型处理完一段留出文本后，对其完整缓存中的键和值检验：

# %%
Int8 = mt.plugins.lookup("kv cache", "int8")
n = pick(512, 48)
with mt.no_grad():
    _, full_state = lm.decode_step(mt.tensor([heldout[:n]]), lm.begin_decoding("full"))
    _, int8_state = lm.decode_step(mt.tensor([heldout[:n]]), lm.begin_decoding("int8"))
    worst = 0.0
    for c in full_state[2]:
        for x in (c.keys(), c.values()):
            codes, scale, zero = Int8.quantize(x)  # 每个头、每个词元一个缩放因子：(批量, 头, t, 1)
            error = np.abs(Int8.dequantize(codes, scale, zero).numpy() - x.numpy())
            worst = max(worst, (error / scale.numpy().astype(np.float32)).max())
ratio = sum(c.bytes() for c in int8_state[2]) / sum(c.bytes() for c in full_state[2])
print(f"largest error per number: {worst:.3f} of a step s (the bound: 0.5)")
print(f"int8 cache / full cache: {ratio:.3f} of the memory ((d + 4) / 4d = {(d + 4) / (4 * d):.3f} for d = {d})")
assert worst <= 0.5 + 1e-3 and np.isclose(ratio, (d + 4) / (4 * d))

# %% [markdown]
# 这对注意力有什么影响？范数为 $e_k$ 的键误差使评分 $c\, \mathbf q^\top \mathbf k$ 最多改变
# $\varepsilon = |c|\, \|\mathbf q\|_2\, e_k$（柯西－施瓦茨不等式）；于是每个权重改变的倍数在 $e^{\pm 2\varepsilon}$ 以内，
# 一行权重的总变化不超过 $e^{2\varepsilon} - 1$，而输出的每个特征最多改变
#
# $$|\mathbf o - \hat{\mathbf o}| \le \max_j |\mathbf v_j - \hat{\mathbf v}_j| + \big(e^{2\varepsilon} - 1\big) \frac{R}{2},$$
#
# 其中 $R$ 是该特征在被关注的值上的极差（`minitensor.testing.attention_error_bound`；推导见 `int8` 策略的文档字符串）。
# 在模型上检验：用前向传播的前置钩子截获每个块的注意力的输入，用 NumPy 计算教程 5 中的注意力，
# 一次用精确的键和值，一次用它们的 8 位副本，针对一个窗口的每个查询和每个头：


# %%
def heads_output(q, k, v, scale, allowed):
    """Per-head causal attention in NumPy: softmax(scale q k^T) v."""
    scores = np.where(allowed, scale * q @ k.swapaxes(-1, -2), -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    return (weights / weights.sum(-1, keepdims=True)) @ v


inputs = {}
hooks = [
    blk.register_forward_pre_hook(lambda module, args, b=b: inputs.__setitem__(b, args[0]))
    for b, blk in enumerate(lm.decoder.blks)
]
with mt.no_grad():
    lm(mt.tensor(windows[:1]))
    rows = []
    for b, blk in enumerate(lm.decoder.blks):
        layer = blk.attention1
        x = blk.addnorm1.sublayer_input(inputs[b])  # 第 b 块的注意力读取的输入（pre-LN）
        exact, quantised = Full(), Int8()
        layer.cached_self_attention(x, exact)
        layer.cached_self_attention(x, quantised)
        q = layer.project_and_split(layer.W_q, x)
        q, _ = layer.positional(q, q)  # 查询也像键一样在各自的位置上旋转
        K, Kq = exact.keys().numpy(), quantised.keys().numpy()
        V, Vq = exact.values().numpy(), quantised.values().numpy()
        scale = layer.attention.scorer.dot_scale(layer.head_size)
        allowed = np.tril(np.ones((context, context), dtype=bool))
        error = np.abs(heads_output(q.numpy(), K, V, scale, allowed) - heads_output(q.numpy(), Kq, Vq, scale, allowed))
        bound = attention_error_bound(
            q.numpy(), K, Kq, V, Vq, scale, np.broadcast_to(allowed, q.shape[:-1] + (context,))
        )
        assert (error <= bound + 1e-5).all(), f"block {b + 1}: the error exceeds the bound"
        rows.append((b + 1, error.max(), bound.max(), np.median(error / bound)))
for hook in hooks:
    hook.remove()
print(f"{'block':>5} {'largest error':>14} {'largest bound':>14} {'median error / bound':>21}")
for b, e, bd, r in rows:
    print(f"{b:>5} {e:>14.2e} {bd:>14.2e} {r:>21.3f}")
loss_full, _ = streamed_losses(lm, heldout[: context + 1], "full", {})
loss_int8, _ = streamed_losses(lm, heldout[: context + 1], "int8", {})
print(f"held-out loss over {context} characters: full {loss_full.mean():.4f}, int8 {loss_int8.mean():.4f} nats")

# %% [markdown]
# 误差界处处成立，而且很宽松：它假设每个键误差对每个查询都指向最坏的方向。完整运行中，
# 各块输出的最大误差在 0.004 到 0.010 之间，而误差界允许 0.14 到 0.21，误差的中位数约为其误差界的 1.3%；
# 模型的损失从 2.2571 变为 2.2574 奈特，而内存只用了 0.31（这里头的大小是 16；当 $d = 128$ 时，
# 比值为 $132 / 512 = 0.26$）。
#
# ## 6. 同一个提示上的采样方法
#
# 每一步，模型给出词表上的对数概率 $s_v = \log p(v \mid y_{<t})$。*解码方式*把它们变成下一个词元：
# 先是一串*处理器*，每个都重塑评分（评分为 $-\infty$ 表示排除这个词元），然后由一个*搜索*做出选择。
# `decoder("top_p", p=0.9)` 从注册表构建一个解码方式，`generate(..., decoder=...)` 运行它。
# 各处理器如下，每个都在提示之后模型给出的评分上对照其公式检验：
#
# * `temperature`（温度）$\tau$：$s_v / \tau$，于是 $q_v \propto p_v^{1/\tau}$：$\tau < 1$ 使分布更尖锐，$\tau > 1$ 使其更平坦；
# * `top_k`（Fan 等人 2018）：保留最可能的 $k$ 个词元；
# * `top_p`，即核采样（Holtzman 等人 2020）：保留概率之和达到 $p$ 的最可能词元的最小集合：
#   当比词元 $v$ 更可能的词元的概率之和小于 $p$ 时，保留 $v$；
# * `min_p`（Nguyen 等人 2024）：保留概率至少为最可能词元的 $p$ 倍的词元，这个门槛随模型的把握程度升高；
# * `repetition_penalty` $\theta$（Keskar 等人 2019）：文本中已出现过的词元的评分变为 $s_v \theta$
#   （这些评分是对数概率，都 $\le 0$），即重新归一化之前的 $p_v^{\theta}$。
#
# 没有搜索时，含有处理器的处理链从处理后评分的 $\operatorname{softmax}$ 中*采样*；没有处理器时就是贪心搜索，$\arg\max_v s_v$。

# %%
prompt = "ROMEO:\n"
context_ids = np.array([vocab[list(prompt)]])
with mt.no_grad():
    logits = lm(mt.tensor(context_ids))
scores = mt.log_softmax(logits[0, -1:], axis=-1).numpy().astype(np.float64)  # (1, |V|)：log p
p = np.exp(scores[0])
ranked = np.argsort(-p)


def processed(name, **options):
    """The scores after the one processor ``name``, and the distribution the sampler draws from."""
    out = decoder(name, **options).processors[0](scores.copy(), context_ids)[0]
    q = np.exp(out - out.max())
    return out, q / q.sum()


rows = []
out, q = processed("temperature", temperature=0.7)
assert np.allclose(q, p ** (1 / 0.7) / (p ** (1 / 0.7)).sum())
rows.append(("temperature 0.7", q))
out, q = processed("top_k", k=5)
assert set(np.flatnonzero(np.isfinite(out))) == set(ranked[:5])
rows.append(("top_k 5", q))
out, q = processed("top_p", p=0.9)
by_hand = ranked[: np.searchsorted(np.cumsum(p[ranked]), 0.9) + 1]  # 排序后第一个达到 0.9 的前缀
assert set(np.flatnonzero(np.isfinite(out))) == set(by_hand)
rows.append(("top_p 0.9", q))
out, q = processed("min_p", p=0.1)
assert set(np.flatnonzero(np.isfinite(out))) == set(np.flatnonzero(p >= 0.1 * p.max()))
rows.append(("min_p 0.1", q))
out, q = processed("repetition_penalty", penalty=1.3)
seen = np.zeros(len(p), dtype=bool)
seen[context_ids[0]] = True
assert np.allclose(out[seen], 1.3 * scores[0, seen]) and np.allclose(out[~seen], scores[0, ~seen])
rows.append(("repetition_penalty 1.3", q))
print(f"the model after {prompt!r}: most likely {[vocab.to_tokens(int(i)) for i in ranked[:5]]}")
print(f"{'processor':<24} {'tokens kept':>11} {'P(most likely)':>15} {'entropy (nats)':>15}")
for name, q in [("none (the model)", p)] + rows:
    entropy = -(q[q > 0] * np.log(q[q > 0])).sum()
    print(f"{name:<24} {(q > 0).sum():>11} {q.max():>15.3f} {entropy:>15.3f}")

# %% [markdown]
# 然后每种解码方式从同一个提示开始写作（每种采样方法使用固定的随机种子，所以运行结果可以重现）。
# 最后一列是重复出现的 4 字符序列所占的比例，粗略地衡量贪心搜索陷入的循环：

# %%
length = pick(200, 24)
samplers = [
    ("greedy", decoder("greedy")),
    ("sample", decoder("sample")),
    ("temperature 0.7", decoder("temperature", temperature=0.7)),
    ("top_k 5", decoder("top_k", k=5)),
    ("top_p 0.9", decoder("top_p", p=0.9)),
    ("min_p 0.1", decoder("min_p", p=0.1)),
    ("repetition 1.3", decoder("repetition_penalty", penalty=1.3)),
]
for name, chain in samplers:
    words = "".join(generate(lm, list(prompt), vocab, length, decoder=chain, rng=np.random.default_rng(1)).tokens)
    grams = [words[i : i + 4] for i in range(len(words) - 3)]
    repeated = 1 - len(set(grams)) / len(grams)
    print(f"{name:<16} {repeated:5.2f}  {words[len(prompt) :][:70]!r}")
first_draw = "".join(generate(lm, list(prompt), vocab, length, decoder="top_p", rng=np.random.default_rng(7)).tokens)
second_draw = "".join(generate(lm, list(prompt), vocab, length, decoder="top_p", rng=np.random.default_rng(7)).tokens)
assert first_draw == second_draw, "the same seed, the same text"

# %% [markdown]
# ## 7. 推测解码
#
# 用大模型生成很慢，因为每个词元都需要一次完整的前向传播，而且词元是一个接一个产生的；
# 然而对 $k + 1$ 个给定词元做一次前向传播，代价和一个词元差不多（同样的权重，只读一遍）。
# 推测解码（Leviathan 等人 2023；Chen 等人 2023）让一个小的*草稿*模型 $q$ 一个接一个地提出 $k$ 个词元，
# 再由*目标模型* $p$ 在一次前向传播中为它们全部打分；目标模型接受其中的一个前缀，再加上一个它自己的词元。
# 贪心解码时，当提议的词元正是目标模型的 argmax 时就接受它：输出与目标模型的贪心输出逐个词元相同。
# 采样时，规则是：
#
# * 以概率 $\min\big(1, p(x) / q(x)\big)$ 接受提议 $x \sim q$；
# * 在第一次拒绝时，改从残差分布 $r(v) = \max(0, p(v) - q(v)) \,/\, \sum_u \max(0, p(u) - q(u))$ 中抽取词元。
#
# 为什么输出的词元恰好服从 $p$：它等于 $v$，要么是因为提议了 $x = v$ 并被接受，要么是因为提议（无论是什么）被拒绝、
# 而残差分布抽到了 $v$：
#
# $$P(v) = q(v) \min\Big(1, \frac{p(v)}{q(v)}\Big) + \Big(1 - \sum_u q(u) \min\Big(1, \frac{p(u)}{q(u)}\Big)\Big)\, r(v)
#        = \min(p(v), q(v)) + \Big(1 - \sum_u \min(p(u), q(u))\Big) r(v).$$
#
# 由于 $\min(a, b) + \max(0, a - b) = a$，对 $u$ 求和得到
# $1 - \sum_u \min(p(u), q(u)) = \sum_u \max(0, p(u) - q(u))$：恰好是残差分布的归一化常数。
# 所以第二项就是 $\max(0, p(v) - q(v))$，于是 $P(v) = \min(p(v), q(v)) + \max(0, p(v) - q(v)) = p(v)$。
# 草稿模型只决定一个词元有多常被廉价地得到。下面在随机的分布对上精确检验，不做任何采样
# （其中一个草稿分布在目标分布有概率的地方为零），并与一个诱人的错误规则——拒绝时直接从 $p$ 中抽取——相比较：

# %%
rng = np.random.default_rng(0)
pairs = [(rng.dirichlet(np.ones(6)), rng.dirichlet(np.full(6, 0.3))) for _ in range(5)]
pairs.append((np.array([0.1, 0.2, 0.3, 0.4]), np.array([0.5, 0.5, 0.0, 0.0])))  # q 不可能提议 2 和 3
for p_, q_ in pairs:
    accepted = np.minimum(p_, q_)  # q(v) min(1, p(v)/q(v))，写成不需要除以 q(v) = 0 的形式
    rejected = 1 - accepted.sum()  # 提议被拒绝的概率
    residual = np.maximum(p_ - q_, 0) / np.maximum(p_ - q_, 0).sum()
    emitted = accepted + rejected * residual
    wrong = accepted + rejected * p_  # 拒绝时从 p 中抽取
    assert np.allclose(emitted, p_, atol=1e-12, rtol=0)
    print(f"max |P - p| {np.abs(emitted - p_).max():.1e}; with the wrong rule {np.abs(wrong - p_).max():.3f}")

# %% [markdown]
# 再对规则本身做 200,000 次提议的模拟，作为第二种检验：

# %%
p_, q_ = pairs[0]
x = rng.choice(len(q_), size=200_000, p=q_)  # 草稿模型提议
keep = rng.uniform(size=x.size) < np.minimum(1, p_[x] / q_[x])
residual = np.maximum(p_ - q_, 0) / np.maximum(p_ - q_, 0).sum()
tokens = np.where(keep, x, rng.choice(len(p_), size=x.size, p=residual))
frequency = np.bincount(tokens, minlength=len(p_)) / tokens.size
print("target p:          ", np.round(p_, 3))
print("emitted frequency: ", np.round(frequency, 3), f"(acceptance rate {keep.mean():.3f} = sum min(p, q))")
assert np.abs(frequency - p_).max() < 0.01 and np.isclose(keep.mean(), np.minimum(p_, q_).sum(), atol=0.01)

# %% [markdown]
# 使用第 2 节的两个模型：目标模型（4 个块）和草稿模型（1 个块，宽度和词表相同），贪心解码，
# 每个回合提议 $k = 4$ 个词元。输出必须与目标模型的贪心文本逐个字符相同；`stats` 统计提议和接受的数目
# （接受率即接受数 / 提议数）。然后根据单次调用的时间估计一个回合的代价：$k$ 步草稿模型，
# 加上目标模型对 $k + 1$ 个词元的一次前向传播，换来一个回合产生的字符。

# %%
length = pick(300, 30)


def timed(chain):
    begin = time.perf_counter()
    hyp = generate(lm, list(prompt), vocab, length, decoder=chain)
    return time.perf_counter() - begin, "".join(hyp.tokens)


alone, fast = [], []
for _ in range(pick(3, 1)):  # 交替运行，使机器偶尔变慢时两者都受影响
    seconds, target_text = timed(decoder("greedy"))
    alone.append(seconds)
    speculative = decoder("speculative", draft=draft, k=4)
    seconds, speculative_text = timed(speculative)
    fast.append(seconds)
    assert speculative_text == target_text, "greedy speculative decoding is the target's greedy decoding"
stats = speculative.search.stats
per_pass = stats.generated / stats.rounds
print(f"{length} characters, identical text: {speculative_text[len(prompt) :][:60]!r}...")
print(
    f"proposed {stats.proposed}, accepted {stats.accepted} (acceptance rate {stats.acceptance_rate:.2f}); "
    f"{stats.rounds} target passes for {stats.generated} characters: {per_pass:.2f} per pass"
)


def step_ms(model, width):
    """The median time of one cached decode_step of ``width`` tokens after 64, in ms."""
    times, repeats = [], pick(20, 3)
    with mt.no_grad():
        _, state = model.decode_step(mt.tensor([heldout[:64]]), model.begin_decoding())
        for _ in range(repeats):  # decode_step 不改变传给它的状态
            begin = time.perf_counter()
            model.decode_step(mt.tensor([heldout[64 : 64 + width]]), state)
            times.append(time.perf_counter() - begin)
    return 1000 * np.median(times)


target_1, target_5, draft_1 = step_ms(lm, 1), step_ms(lm, 5), step_ms(draft, 1)
expected = per_pass * target_1 / (4 * draft_1 + target_5)
print(
    f"one target step {target_1:.2f} ms, the target on 5 tokens {target_5:.2f} ms, one draft step {draft_1:.2f} ms: "
    f"a round costs 4 x {draft_1:.2f} + {target_5:.2f} ms for {per_pass:.2f} characters, "
    f"which predicts {expected:.2f}x"
)
print(
    f"measured: target alone {np.median(alone):.2f} s, speculative {np.median(fast):.2f} s: "
    f"{np.median(alone) / np.median(fast):.2f}x"
)

# %% [markdown]
# 完整运行中，39% 的提议被接受（465 个中的 183 个），目标模型的每次前向传播产生 2.56 个字符而不是 1 个，
# 而生成的 300 个字符与目标模型单独生成的完全相同。在空闲的机器上，只有一个块的草稿模型走一步需要 0.42 ms，
# 是四个块的目标模型一步（1.59 ms）的四分之一；目标模型对五个词元的前向传播需要 1.79 ms，约等于一步：
# 一个回合花费 $4 \times 0.42 + 1.79 = 3.5$ ms，产生 2.56 个字符，即每个字符 1.36 ms，而单独使用目标模型是 1.59 ms——
# 预测加速 1.17 倍，实测 1.08 倍。四步草稿模型的代价等于目标模型的一步，所以一个回合约相当于目标模型的两步，
# 必须产生两个以上的字符才有收益；在 39% 的接受率下它产生 2.56 个字符。（在我们的 2 个 CPU 核上，当有其他程序共享时，
# 实测的加速在各次运行之间从 1.18 倍到 1.58 倍不等：这样的计时只能粗略地看。）当草稿模型比目标模型*便宜得多*时——
# 小十倍或一百倍的模型，在目标模型的前向传播受限于从内存读取其权重的硬件上——并且与目标模型一致得比这个只有一个块的
# 草稿模型更频繁时，这种方法才划算。无论快慢，输出都是目标模型自己的。
#
# ## 8. 自己写一个缓存策略
#
# 缓存策略是一个小类：`append`、`keys`、`values`、`positions`（以及 `bytes`，对于把数据保存在张量属性中的策略，
# `mt.nn.KVCache` 已经提供）。我们的策略以 float16 保存全部位置：内存是 float32 的一半，约有三位有效数字。
# 它是有损的，所以契约检查工具包用 `attention_error_bound`（`tolerance="bound"`）而不是精确相等，
# 把它与 `full` 相比较。下面依次是这个策略、一个初学者可能写出的有疏漏的变体（它把 float16 的数原样交回）
# 及契约检查工具包对它的报错，以及注册：


# %%
class HalfCache(mt.nn.KVCache):
    """Every position, in float16; read back in the dtype that was appended."""

    def __init__(self, **options):
        mt.plugins.check_options(type(self), options)
        self.k = self.v = None

    def append(self, keys, values, positions):
        self.dtype = keys.dtype
        k, v = keys.astype("float16"), values.astype("float16")
        self.k = k if self.k is None else mt.concat([self.k, k], axis=2)
        self.v = v if self.v is None else mt.concat([self.v, v], axis=2)

    def keys(self):
        return self.k.astype(self.dtype)

    def values(self):
        return self.v.astype(self.dtype)

    def positions(self):
        return np.arange(self.k.shape[2], dtype=np.int64)

    def crop(self, num_tokens):  # 推测解码要撤回被拒绝的词元
        self.k, self.v = self.k[:, :, :num_tokens], self.v[:, :, :num_tokens]
        self.seen_tokens = min(self.seen_tokens, num_tokens)


class ForgetfulHalfCache(HalfCache):
    def keys(self):
        return self.k  # float16，而不是存入时的类型


with expect_error("a cache that returns float16 keys to a float64 layer", AssertionError) as caught:
    check_kv_cache(ForgetfulHalfCache, tolerance="bound")
assert "keys()" in str(caught.error) or "decoding" in str(caught.error)


class HalfPlugin:
    @mt.hookimpl
    def minitensor_kv_caches(self):
        return {"half": HalfCache}


plugin = HalfPlugin()
mt.plugins.register(plugin, name="tutorial-half")
assert check_kv_cache("half", tolerance="bound")
assert check_kv_cache("half", tolerance="bound", positional="rotary", num_kv_heads=1)
print("check_kv_cache('half', tolerance='bound'): within attention_error_bound of full, with and without rotary")
loss_half, half_bytes = streamed_losses(lm, heldout[: context + 1], "half", {})
_, full_bytes = streamed_losses(lm, heldout[: context + 1], "full", {})
print(
    f"on the model: loss {loss_half.mean():.4f} (full {loss_full.mean():.4f}), "
    f"memory {half_bytes / full_bytes:.2f} of full's"
)
assert half_bytes * 2 == full_bytes and abs(loss_half.mean() - loss_full.mean()) < 0.01
same = "".join(generate(lm, list(prompt), vocab, pick(60, 10), cache="half").tokens)
print(f"greedy with --cache half: {same[len(prompt) :]!r}")
mt.plugins.unregister(plugin)
assert "half" not in mt.plugins.kv_caches()

# %% [markdown]
# 注册之后，`"half"` 就和内置策略的名字一样可用：`lm.begin_decoding("half")`、`generate(..., cache="half")`，
# 以及 `minitensor generate --cache half`（插件文件用 `--plugin` 给出）。契约检查工具包让它通过一个 float64 层，
# 逐个词元解码，以及先一段提示再逐个词元解码，使用分组的头和旋转位置编码，并检查了 `copy()`、`select()` 和 `crop()`。
#
# ## 练习
#
# 1. 把模型训练得更久（`steps` 取 4,000）或更深，再测量位置 0 上的注意力。汇点出现了吗？
#    再试试让每个训练窗口都从换行符开始（即固定的第一个词元，正如论文中的模型那样），比较 `window` 与 `sinks`。
# 2. StreamingLLM（第 3.3 节）提出在每段训练文本的开头加一个可学习的*汇点词元*。把它加入词表和每个窗口，
#    测量没有它时 `window` 损失了多少。
# 3. 写一个 `int4`：16 个等级而不是 256 个。每个数的误差、误差界和内存比值各是多少？
#    用 `check_kv_cache(..., tolerance="bound")` 检查它。
# 4. 用 `decoder("speculative", draft=draft, k=4, sample=True)` 采样，把接受率与贪心一致性下的接受率比较。
#    这里哪个 $k$ 最快？为什么更大的 $k$ 不再有帮助？
# 5. 写一个处理器：`no_repeat_ngram`（禁止任何会重复文本中已有 n 元语法的词元），用 `minitensor_decoders` 注册，
#    `kind = "processor"`。它能消除贪心搜索的循环吗？
#
# ## 参考文献
#
# * G. Xiao, Y. Tian, B. Chen, S. Han, M. Lewis, "Efficient Streaming Language Models with
#   Attention Sinks", ICLR 2024, [arXiv:2309.17453](https://arxiv.org/abs/2309.17453).
# * Z. Liu, J. Yuan, H. Jin, S. Zhong, Z. Xu, V. Braverman, B. Chen, X. Hu, "KIVI: A Tuning-Free
#   Asymmetric 2bit Quantization for KV Cache", ICML 2024,
#   [arXiv:2402.02750](https://arxiv.org/abs/2402.02750).
# * A. Fan, M. Lewis, Y. Dauphin, "Hierarchical Neural Story Generation", ACL 2018,
#   [arXiv:1805.04833](https://arxiv.org/abs/1805.04833)（top-k）。
# * A. Holtzman, J. Buys, L. Du, M. Forbes, Y. Choi, "The Curious Case of Neural Text
#   Degeneration", ICLR 2020, [arXiv:1904.09751](https://arxiv.org/abs/1904.09751)（top-p）。
# * M. N. Nguyen, A. Baker, C. Neo, A. Roush, A. Kirsch, R. Shwartz-Ziv, "Turning Up the Heat:
#   Min-p Sampling for Creative and Coherent LLM Outputs",
#   [arXiv:2407.01082](https://arxiv.org/abs/2407.01082)。
# * N. S. Keskar, B. McCann, L. R. Varshney, C. Xiong, R. Socher, "CTRL: A Conditional
#   Transformer Language Model for Controllable Generation",
#   [arXiv:1909.05858](https://arxiv.org/abs/1909.05858)（重复惩罚）。
# * Y. Leviathan, M. Kalman, Y. Matias, "Fast Inference from Transformers via Speculative
#   Decoding", ICML 2023, [arXiv:2211.17192](https://arxiv.org/abs/2211.17192).
# * C. Chen, S. Borgeaud, G. Irving, J.-B. Lespiau, L. Sifre, J. Jumper, "Accelerating Large
#   Language Model Decoding with Speculative Sampling",
#   [arXiv:2302.01318](https://arxiv.org/abs/2302.01318).
#
# ## 在引擎中的位置
#
# * `minitensor/core/hookspecs.py`——契约："Key/value caches" 和 "Decoders" 两节；
# * `minitensor/core/nn/kv_cache.py`——`KVCache`，缓存策略的基类；
# * `plugins/minitensor_plugins/kv_caches.py`——`full`、`window`、`sinks`、`int8`；
# * `minitensor/core/nn/attention.py`——`MultiHeadAttention.cached_self_attention`；
# * `minitensor/core/nn/transformer.py`——`TransformerLM.begin_decoding`、`decode_step`、`crop_state`；
# * `plugins/minitensor_plugins/decoders.py`——各处理器和搜索；
# * `minitensor/inference/decoders.py`——`decoder()`，处理链；`minitensor/inference/decoding.py`——`generate`；
# * `minitensor/inference/speculative.py`——推测解码；
# * `minitensor/testing_caches.py`——`check_kv_cache`、`KEEPS`、`attention_error_bound`、`check_cached_generation`。
