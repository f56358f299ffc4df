# %% [markdown]
# # 12. Inference: the cache, sinks, 8 bits, samplers and speculative decoding
#
# Training is over; now the model must write. A decoder-only language model (语言模型)
# writes one token (词元) at a time, each new token fed back as the next input: it is
# auto-regressive (自回归), as D2L's Transformer decoder is at prediction time. This tutorial
# is about what happens then, and every piece of it is a plugin that can be swapped and
# checked, as the scorers of tutorial 4 are:
#
# 1. the key/value cache (键值缓存) as the memory of the attention of tutorial 5: what it
#    keeps, that it changes nothing (measured), what it saves in time and what it costs in
#    memory;
# 2. attention sinks (注意力汇点) and StreamingLLM: where a small model trained here puts its
#    attention, and what happens when a text runs past the context it was trained on, with a
#    cache that keeps everything, the last $W$ positions, or the first few and the last $W$;
# 3. a cache in 8 bits, quantised (量化): the error per number and the error bound (误差界)
#    on the attention's output, checked on the model;
# 4. the samplers on the same prompt: greedy search (贪心搜索), sampling (采样) at a
#    temperature, top-k, top-p, min-p and the repetition penalty (重复惩罚), each with its
#    formula checked on the model's scores;
# 5. speculative decoding (推测解码): its acceptance rule (接受规则) derived and checked
#    exactly, then used with a small draft model (草稿模型);
# 6. a cache policy of our own, registered and checked by the conformance kit.
#
# Run it as `python tutorials/12_inference.py` (about a minute on 2 idle CPU cores, several
# when other programs share them) or open it as a notebook with jupytext. `MINITENSOR_TUTORIAL_SMOKE=1` shrinks everything to a few
# seconds.
#
# Sources: D2L's attention chapter, in the Chinese edition 《动手学深度学习》 (zh.d2l.ai),
# 10.5 多头注意力 and 10.7 Transformer (the decoder at prediction time), and in the English
# edition *Dive into Deep Learning* (d2l.ai), 11.5 "Multi-Head Attention" and 11.7 "The
# Transformer Architecture"; greedy search is 9.8 束搜索 (English: 10.8 "Beam Search"). The
# book stops before the rest, which comes from papers, listed at the end: Xiao et al. (2023)
# for attention sinks, Liu et al. (2024) for the 8-bit cache, Fan et al. (2018), Holtzman et
# al. (2020), Nguyen et al. (2024) and Keskar et al. (2019) for the samplers, Leviathan et al.
# (2023) and Chen et al. (2023) for speculative decoding.

# %%
import time

import numpy as np
from _tutorial import LABELS, SMOKE, expect_error, figure_path, pick, text  # text(): labels in the tutorial's language
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
LABELS["zh"].update(  # this tutorial's figure labels in Chinese (terms of tutorials/GLOSSARY.md)
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
# ## 1. The cache as the memory of attention
#
# Multi-head attention (多头注意力, tutorial 5) projects every token $\mathbf x_t$ into a query
# $\mathbf q_t = \mathbf W_q \mathbf x_t$, a key $\mathbf k_t = \mathbf W_k \mathbf x_t$ and
# a value $\mathbf v_t = \mathbf W_v \mathbf x_t$ per head, and in a decoder's masked
# self-attention the token at position $t$ attends the keys and values of positions
# $0, \dots, t$:
#
# $$\mathbf o_t = \sum_{j \le t} \alpha(\mathbf q_t, \mathbf k_j)\, \mathbf v_j, \qquad
# \alpha(\mathbf q_t, \mathbf k_j) = \operatorname{softmax}_j\big(\mathbf q_t^\top \mathbf k_j / \sqrt d\big).$$
#
# When the model writes token $t + 1$, nothing about positions $0, \dots, t$ has changed: their
# keys and values are the ones computed at the earlier steps (each depends on its own
# $\mathbf x_j$ only, and causality keeps $\mathbf x_j$ from seeing later tokens). So the layer
# keeps them, and each step computes only the new token's $\mathbf q, \mathbf k, \mathbf v$.
# That memory is the key/value cache. In minitensor it is an object the layer calls,
# a *cache policy* (缓存策略): `MultiHeadAttention.cached_self_attention(x_new, cache)` projects the
# new tokens, `cache.append(k, v, positions)` stores them, and the new queries attend
# `cache.keys()` and `cache.values()`. The policy `full` keeps everything; it must give
# exactly what the whole causal pass gives. A layer with rotary positions (旋转位置编码),
# float64, ten tokens:

# %%
mha = mt.nn.MultiHeadAttention(16, 4, 0.0, positional="rotary", max_len=64, dtype="float64").eval()
X = mt.tensor(np.random.default_rng(0).standard_normal((1, 10, 16)))
Full = mt.plugins.lookup("kv cache", "full")
with mt.no_grad():
    whole = mha(X, X, X, causal=True).numpy()  # training's pass: every position at once
    cache, rows = Full(), []
    for t in range(X.shape[1]):  # decoding: one token at a time
        out, cache = mha.cached_self_attention(X[:, t : t + 1], cache)
        rows.append(out.numpy())
        if t in (0, 1, 9):
            print(f"after token {t}: keys {tuple(cache.keys().shape)}, positions {cache.positions()}")
    q, k = mha.project_and_split(mha.W_q, X), mha.project_and_split(mha.W_k, X, mha.num_kv_heads)
    _, rotated = mha.positional(q, k)  # rotary rotates the keys at positions 0..9
    values = mha.project_and_split(mha.W_v, X, mha.num_kv_heads)
difference = np.abs(np.concatenate(rows, axis=1) - whole).max()
print(f"token by token with the full cache vs the whole causal pass: max difference {difference:.1e}")
assert difference < 1e-12
assert np.allclose(cache.keys().numpy(), rotated.numpy()) and np.allclose(cache.values().numpy(), values.numpy())
print(cache)

# %% [markdown]
# The cache holds, per head, the rotated keys $\mathbf k_j$ and the values $\mathbf v_j$ of
# every position so far (shape (batch, heads, positions, $d$)), and the queries are never
# kept: each is used once, at its own step. Which numbers the cache holds is what the policies
# below change; the rest of the layer stays as it is.
#
# ## 2. A small language model to decode with
#
# Everything below uses one model: a character-level GPT (D2L's Transformer decoder without
# the encoder–decoder attention) on the tiny Shakespeare text shipped with minitensor, with
# the recipe of `minitensor train --preset gpt-char` (pre-LN blocks, AdamW, a warm-up and a
# cosine decay of the learning rate, gradients clipped at norm 1) and rotary positions, so
# that positions past the trained context exist. Smaller than the preset's so that it trains
# in half a minute: 4 blocks of 64 hidden units, 4 heads, a context of 64 characters, 1,000
# minibatches of 16 random windows (smoke mode: 2 blocks of 32, a context of 16, 40
# minibatches). The last 10% of the text is held out. Then a *draft* model a quarter the size
# (one block), trained the same way, for section 7.

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
        window = train_ids[s[:, None] + np.arange(n + 1)]  # inputs and their next characters
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
# ## 3. What the cache saves, and what it costs
#
# On the model, `check_cached_generation` (from the conformance kit) generates greedily with
# the full cache, one `decode_step` per token, and compares every step's logits with one
# causal pass over the whole generated text — what recomputing at every step would give.

# %%
generated = pick(300, 40)
worst = check_cached_generation(lm, steps=generated, atol=1e-4)
print(f"{generated} tokens with the full cache vs recomputing: max logit difference {worst:.1e} (float32)")

# %% [markdown]
# Time. Without a cache, the token after a text of $t$ tokens costs a pass of the whole model
# over $t + 1$ positions; with one, a pass over one position, whose attention reads $t + 1$
# cached keys. Measured per new token after texts of growing length (the median of a few
# steps):

# %%
lengths = pick((32, 128, 512, 2048), (8, 32, 64))
repeats = pick(5, 2)
cached_ms, recomputed_ms = [], []
with mt.no_grad():
    for n in lengths:
        ids = heldout[: n + repeats + 1]
        _, state = lm.decode_step(mt.tensor([ids[:n]]), lm.begin_decoding())  # the text so far, in one step
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
if not SMOKE:  # smoke mode's texts are too short for the difference to stand out of the timing noise
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
# In the full run, from 32 to 2,048 tokens, a step with the cache took between 1.4 and 2.4 ms
# and recomputing from 1.9 to 127 ms: 54 times as long at 2,048 tokens, and the gap grows with
# $t$ (runs on a busier machine measured 52x and 101x at 2,048 tokens). The cached step grows
# too — its attention reads $t + 1$ keys — but at this size that is little next to the rest of
# the pass.
#
# Memory. Each block keeps a key and a value of $d$ numbers for each of its $g$ key/value
# heads (the heads of tutorial 5; fewer with grouped-query attention, tutorial 9) and each of
# the $t$ tokens:
#
# $$\text{cache} = 2 \cdot t \cdot g \cdot d \ \text{numbers per layer} \quad (\times 4 \text{ bytes in float32}, \times L \text{ layers}).$$
#
# The policies report what they hold with `bytes()`:

# %%
attention = lm.decoder.blks[0].attention1
g, d = attention.num_kv_heads, attention.head_size
with mt.no_grad():
    for n in (lengths[0], lengths[-1]):
        _, state = lm.decode_step(mt.tensor([heldout[:n]]), lm.begin_decoding("full"))
        held = sum(c.bytes() for c in state[2])  # state[2]: one cache per block
        print(f"t = {n:5,}: {held:>10,} bytes = {blocks} layers x 2 x {n} x g={g} x d={d} x 4 bytes")
        assert held == blocks * 2 * n * g * d * 4

# %% [markdown]
# Linear in $t$, and with no end: a model that keeps writing needs ever more memory, and
# each step reads all of it. Keeping less is the subject of the next two sections.
#
# ## 4. Attention sinks, and a text longer than the context
#
# Xiao et al. (2023, StreamingLLM) looked at the attention of trained language models
# (Llama-2, MPT, Falcon, Pythia) and found that, past the first two layers, most heads put a
# large share of their weight on the *first* token of the text, whatever that token is. Their
# explanation is the softmax: the weights of a row must sum to 1, so a head that finds nothing
# useful for the current query must still put its mass somewhere, and the first token, which
# every later query can see, is where training learns to park it. They call such tokens
# *attention sinks*. The consequence: a cache that keeps only the last $W$ positions (the
# `window` policy, sliding-window attention) loses the sinks once the text passes $W$ tokens,
# the mass they held moves onto tokens that carry meaning, and the model falls apart; keeping
# the first 4 tokens beside the window (`sinks`) repairs it.
#
# Does our small model do it? Its own attention weights, on 32 held-out windows of the trained
# length, for the queries in the second half of each window (whose uniform weight on one key
# would be about $1/48$):

# %%
windows = np.stack([heldout[s : s + context] for s in range(0, 32 * context, context)])
with mt.no_grad(), mt.nn.attention.plain_attention(lm):  # plain path: keep every weight
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
# In the full run the answer is no: the weight on position 0 lies between 0.005 and 0.018,
# below the uniform 0.021, in every block and head (it grows with depth, from 0.005–0.007 in
# block 1 to 0.014–0.018 in block 4, but stays under uniform). This model, 4 blocks trained
# for 1,000 steps on 64-character windows that start anywhere in the text, has learned no
# sink. (The models of the paper have billions of parameters, were trained on texts of
# thousands of tokens, and all start with the same token.) So what does a long text do to it?
# Streaming (流式生成): the held-out text fed one character at a time through the model, 16
# times its trained context, with three policies that hold the same 64 positions where they
# are bounded: `full` (everything), `window` (the last 64) and `sinks` (the first 4 and the
# last 60). The loss is the cross-entropy of each next character, averaged over ranges of
# positions:


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
for name in ("window", "sinks"):  # inside the context the three policies keep the same tokens
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
# In the full run (nats per character; the model's loss inside its context is the first
# column):
#
# | policy | positions 0–63 | 64–255 | 256–1023 |
# |---|---:|---:|---:|
# | `full` | 2.26 | 2.36 | 3.12 |
# | `window` (64) | 2.26 | 2.03 | 2.01 |
# | `sinks` (4 + 60) | 2.26 | 2.03 | 2.03 |
#
# What collapses here is not `window` but `full`: its queries meet keys at distances the model
# never saw in training (up to 1,023, against 63), and the loss climbs with the length of the
# text, to 3.12 nats past position 256 (and `full` holds 16 times the memory at the end).
# `window` and `sinks` keep every distance inside the trained range and stay at the model's
# level (a little below the first column, which includes the first characters of the text,
# predicted with almost no context). `window` does not collapse because this model has
# no sink to lose; `sinks` costs it nothing either. The paper's collapse of `window` is a
# property of models that have learned sinks, and the measurement above is how to find out
# whether a given model has.
#
# How `sinks` keeps a rotary model inside its trained distances: it *re-indexes* (重新编号). The kept
# tokens are given the positions $0, 1, \dots$ *in the cache*, not their positions in the text
# ("positions within the cache rather than those in the original text", Xiao et al. 2023), so
# the farthest key is never more than $S + W - 1$ positions from the query. `kept()` gives a
# token's position in the text, `positions()` the one the attention uses; the policy declares
# `reindexes = True`, and the layer then rotates the kept keys at every step at their new
# positions. With 2 sinks and a window of 4, after 10 tokens:

# %%
Sinks = mt.plugins.lookup("kv cache", "sinks")
with mt.no_grad():
    cache = Sinks(sinks=2, window=4)
    for t in range(10):
        _, cache = mha.cached_self_attention(X[:, t : t + 1], cache)
print("kept():     ", cache.kept(), "  (positions in the text)")
print("positions():", cache.positions(), "  (positions the attention uses)")
text_positions, positions = KEEPS["sinks"]({"sinks": 2, "window": 4})(9)  # the kit's definition of sinks
assert list(cache.kept()) == list(text_positions) == [0, 1, 6, 7, 8, 9] and list(positions) == [0, 1, 2, 3, 4, 5]
for name, options in (("window", {"window": 4}), ("sinks", {"sinks": 2, "window": 4})):
    assert check_kv_cache(name, options, positional="rotary")
    print(f"check_kv_cache({name!r}, {options}, positional='rotary'): decoding = its definition without a cache")

# %% [markdown]
# `check_kv_cache` decodes random tokens through a float64 layer with the policy and computes
# every token's output again *without* a cache, from the policy's definition (`KEEPS`: which
# tokens the token at $t$ attends, at which positions), for both policies here with rotary
# positions.
#
# ## 5. A cache in 8 bits
#
# The `int8` policy keeps every position but stores each key and value (the $d$ numbers of
# one head and one token) as 8-bit integers, with its own scale (缩放因子) $s$ and zero point
# (零点) $z$ (per-token
# asymmetric quantisation, as in KIVI, Liu et al. 2024):
#
# $$z = \min_i x_i, \qquad s = \frac{\max_i x_i - \min_i x_i}{255}, \qquad
# c_i = \operatorname{round}\Big(\frac{x_i - z}{s}\Big) \in \{0, \dots, 255\}, \qquad \hat x_i = c_i s + z.$$
#
# Rounding to the nearest code moves each number by at most half a step, $|x_i - \hat x_i| \le
# s / 2$. Memory per head and token: $d$ bytes plus the scale and zero point in float16 (4
# bytes), against $4d$ bytes in float32: a ratio of $(d + 4) / 4d$. On the keys and values
# the model's full cache holds after a held-out text:

# %%
Int8 = mt.plugins.lookup("kv cache", "int8")
n = pick(512, 48)
with mt.no_grad():
    _, full_state = lm.decode_step(mt.tensor([heldout[:n]]), lm.begin_decoding("full"))
    _, int8_state = lm.decode_step(mt.tensor([heldout[:n]]), lm.begin_decoding("int8"))
    worst = 0.0
    for c in full_state[2]:
        for x in (c.keys(), c.values()):
            codes, scale, zero = Int8.quantize(x)  # per head and token: (batch, heads, t, 1) scales
            error = np.abs(Int8.dequantize(codes, scale, zero).numpy() - x.numpy())
            worst = max(worst, (error / scale.numpy().astype(np.float32)).max())
ratio = sum(c.bytes() for c in int8_state[2]) / sum(c.bytes() for c in full_state[2])
print(f"largest error per number: {worst:.3f} of a step s (the bound: 0.5)")
print(f"int8 cache / full cache: {ratio:.3f} of the memory ((d + 4) / 4d = {(d + 4) / (4 * d):.3f} for d = {d})")
assert worst <= 0.5 + 1e-3 and np.isclose(ratio, (d + 4) / (4 * d))

# %% [markdown]
# What does that do to the attention? A key error of norm $e_k$ moves a score
# $c\, \mathbf q^\top \mathbf k$ by at most $\varepsilon = |c|\, \|\mathbf q\|_2\, e_k$ (Cauchy–
# Schwarz); every weight then changes by a factor within $e^{\pm 2\varepsilon}$, the weights of a
# row by at most $e^{2\varepsilon} - 1$ in total, and the output moves by at most
#
# $$|\mathbf o - \hat{\mathbf o}| \le \max_j |\mathbf v_j - \hat{\mathbf v}_j| + \big(e^{2\varepsilon} - 1\big) \frac{R}{2}$$
#
# per feature, $R$ the range of that feature over the values attended
# (`minitensor.testing.attention_error_bound`; the derivation is in the `int8` policy's
# docstring). Checked on the model: the input of each block's attention captured with a
# forward pre-hook, the attention of tutorial 5 computed in NumPy, once with the exact keys and
# values and once with their 8-bit copies, for every query of a window and every head:


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
        x = blk.addnorm1.sublayer_input(inputs[b])  # what the attention of block b reads (pre-LN)
        exact, quantised = Full(), Int8()
        layer.cached_self_attention(x, exact)
        layer.cached_self_attention(x, quantised)
        q = layer.project_and_split(layer.W_q, x)
        q, _ = layer.positional(q, q)  # the queries, rotated at their positions, as the keys are
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
# The bound holds everywhere, and is loose: it assumes that every key error points the worst
# way for every query. In the full run the largest output error of a block is between 0.004
# and 0.010 where the bound allows 0.14 to 0.21, the median error is about 1.3% of its bound,
# and the model's loss moves from 2.2571 to 2.2574 nats, for 0.31 of the memory (the head size
# here is 16; at $d = 128$ the ratio is $132 / 512 = 0.26$).
#
# ## 6. The samplers on one prompt
#
# At every step the model gives log-probabilities $s_v = \log p(v \mid y_{<t})$ over the
# vocabulary. A *decoder* turns them into the next token: a chain of *processors* (处理器),
# each reshaping the scores (a score of $-\infty$ rules a token out), then a *search* (搜索)
# that chooses. `decoder("top_p", p=0.9)` builds one from the registry; `generate(..., decoder=...)`
# runs it. The processors, each checked against its formula on the model's scores after the
# prompt:
#
# * `temperature` $\tau$: $s_v / \tau$, so that $q_v \propto p_v^{1/\tau}$: $\tau < 1$ sharpens, $\tau > 1$ flattens;
# * `top_k` (Fan et al. 2018): keep the $k$ most likely tokens;
# * `top_p`, nucleus sampling (核采样; Holtzman et al. 2020): keep the smallest set of most likely tokens
#   whose probability reaches $p$: token $v$ is kept when the tokens more likely than it hold less
#   than $p$;
# * `min_p` (Nguyen et al. 2024): keep the tokens at least $p$ times as likely as the most likely
#   one, a bar that rises with the model's confidence;
# * `repetition_penalty` $\theta$ (Keskar et al. 2019): a token already in the text gets
#   $s_v \theta$ (its scores are log-probabilities, all $\le 0$), i.e. $p_v^{\theta}$ before
#   renormalising.
#
# Without a search, a chain that has a processor *samples* from $\operatorname{softmax}$ of the
# processed scores; with none it is greedy search, $\arg\max_v s_v$.

# %%
prompt = "ROMEO:\n"
context_ids = np.array([vocab[list(prompt)]])
with mt.no_grad():
    logits = lm(mt.tensor(context_ids))
scores = mt.log_softmax(logits[0, -1:], axis=-1).numpy().astype(np.float64)  # (1, |V|): log p
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
by_hand = ranked[: np.searchsorted(np.cumsum(p[ranked]), 0.9) + 1]  # the sorted prefix that first reaches 0.9
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
# Then each decoder writes from the same prompt (a fixed seed per sampler, so the run
# repeats). The last column is the share of repeated 4-character sequences, a crude measure of
# the loops greedy search falls into:

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
# ## 7. Speculative decoding
#
# Generating with a large model is slow because every token needs a full pass and the tokens
# come one after another; yet one pass over $k + 1$ given tokens costs the model about what one
# token costs (the same weights, read once). Speculative decoding (Leviathan et al. 2023; Chen
# et al. 2023) lets a small *draft* model $q$ propose $k$ tokens, one after another, and the
# *target* model (目标模型) $p$ score them all in one pass; the target then accepts a prefix of them and
# adds one token of its own. Greedily, a proposal is accepted when it is the target's argmax:
# the output is the target's greedy output, token for token. When sampling, the rule is:
#
# * accept the proposal $x \sim q$ with probability $\min\big(1, p(x) / q(x)\big)$;
# * at the first rejection, draw the token instead from the residual distribution (残差分布)
#   $r(v) = \max(0, p(v) - q(v)) \,/\, \sum_u \max(0, p(u) - q(u))$.
#
# Why the emitted token is distributed exactly as $p$: it is $v$ either because $x = v$ was
# proposed and accepted, or because the proposal, whatever it was, was rejected and the
# residual drew $v$,
#
# $$P(v) = q(v) \min\Big(1, \frac{p(v)}{q(v)}\Big) + \Big(1 - \sum_u q(u) \min\Big(1, \frac{p(u)}{q(u)}\Big)\Big)\, r(v)
#        = \min(p(v), q(v)) + \Big(1 - \sum_u \min(p(u), q(u))\Big) r(v).$$
#
# Since $\min(a, b) + \max(0, a - b) = a$, summing over $u$ gives
# $1 - \sum_u \min(p(u), q(u)) = \sum_u \max(0, p(u) - q(u))$: exactly the residual's
# normaliser. So the second term is $\max(0, p(v) - q(v))$, and
# $P(v) = \min(p(v), q(v)) + \max(0, p(v) - q(v)) = p(v)$. The draft decides only how often a
# token comes cheaply. Checked exactly, with no sampling, on random pairs of distributions
# (one draft with zeros where the target has mass), next to a tempting wrong rule — on
# rejection, draw from $p$ itself:

# %%
rng = np.random.default_rng(0)
pairs = [(rng.dirichlet(np.ones(6)), rng.dirichlet(np.full(6, 0.3))) for _ in range(5)]
pairs.append((np.array([0.1, 0.2, 0.3, 0.4]), np.array([0.5, 0.5, 0.0, 0.0])))  # q cannot propose 2 and 3
for p_, q_ in pairs:
    accepted = np.minimum(p_, q_)  # q(v) min(1, p(v)/q(v)), written without dividing by q(v) = 0
    rejected = 1 - accepted.sum()  # the probability that the proposal is rejected
    residual = np.maximum(p_ - q_, 0) / np.maximum(p_ - q_, 0).sum()
    emitted = accepted + rejected * residual
    wrong = accepted + rejected * p_  # on rejection, draw from p
    assert np.allclose(emitted, p_, atol=1e-12, rtol=0)
    print(f"max |P - p| {np.abs(emitted - p_).max():.1e}; with the wrong rule {np.abs(wrong - p_).max():.3f}")

# %% [markdown]
# And by simulation of the rule itself, 200,000 proposals, as a second look:

# %%
p_, q_ = pairs[0]
x = rng.choice(len(q_), size=200_000, p=q_)  # the draft proposes
keep = rng.uniform(size=x.size) < np.minimum(1, p_[x] / q_[x])
residual = np.maximum(p_ - q_, 0) / np.maximum(p_ - q_, 0).sum()
tokens = np.where(keep, x, rng.choice(len(p_), size=x.size, p=residual))
frequency = np.bincount(tokens, minlength=len(p_)) / tokens.size
print("target p:          ", np.round(p_, 3))
print("emitted frequency: ", np.round(frequency, 3), f"(acceptance rate {keep.mean():.3f} = sum min(p, q))")
assert np.abs(frequency - p_).max() < 0.01 and np.isclose(keep.mean(), np.minimum(p_, q_).sum(), atol=0.01)

# %% [markdown]
# With the two models of section 2: the target (4 blocks) and the draft (1 block, the same
# width and vocabulary), greedy, $k = 4$ proposals per round. The output must be the target's
# greedy text, character for character; `stats` counts the proposals and acceptances (the
# acceptance rate, 接受率, is accepted / proposed). Then the cost of one round, from the time
# of single calls: $k$ draft steps and one target pass over $k + 1$ tokens, for the characters
# a round gives.

# %%
length = pick(300, 30)


def timed(chain):
    begin = time.perf_counter()
    hyp = generate(lm, list(prompt), vocab, length, decoder=chain)
    return time.perf_counter() - begin, "".join(hyp.tokens)


alone, fast = [], []
for _ in range(pick(3, 1)):  # interleaved, so that a slow moment of the machine hits both
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
        for _ in range(repeats):  # decode_step leaves the state it was given as it was
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
# In the full run 39% of the proposals were accepted (183 of 465), and a target pass gave 2.56
# characters instead of 1, with the same 300 characters as the target alone. On an idle
# machine one step of the one-block draft took 0.42 ms, a quarter of the four-block target's
# 1.59 ms, and the target's pass over five tokens 1.79 ms, about one step: a round costs
# $4 \times 0.42 + 1.79 = 3.5$ ms for 2.56 characters, 1.36 ms a character against 1.59 —
# a prediction of 1.17x, and 1.08x measured. Four draft steps cost as much as one target step,
# so a round costs about two target steps and must give more than two characters to gain at
# all; at 39% acceptance it gives 2.56. (On our 2 cores, when other programs shared them, the
# measured speed-up moved between 1.18x and 1.58x from run to run: read such timings as rough.)
# The method pays when the draft is *much* cheaper than the target — a model ten or a hundred
# times smaller, on hardware where the target's pass is bound by reading its weights from
# memory — and agrees with it more often than this one-block draft does. Whatever the speed,
# the output is the target's own.
#
# ## 8. A cache policy of your own
#
# A policy is a small class: `append`, `keys`, `values`, `positions` (and `bytes`, which
# `mt.nn.KVCache` gives for a policy that keeps its data in Tensor attributes). Ours keeps
# every position in float16: half the memory of float32 for about three significant digits.
# It is lossy, so the conformance kit checks it against `full` within
# `attention_error_bound` (`tolerance="bound"`) rather than exactly. Below the policy, a
# variant with a slip a learner could make (it hands back the float16 numbers as they are),
# which the kit catches, and the registration:


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

    def crop(self, num_tokens):  # speculative decoding rolls rejected tokens back
        self.k, self.v = self.k[:, :, :num_tokens], self.v[:, :, :num_tokens]
        self.seen_tokens = min(self.seen_tokens, num_tokens)


class ForgetfulHalfCache(HalfCache):
    def keys(self):
        return self.k  # float16, not what was appended


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
# Registered, `"half"` is a name like the built-ins': `lm.begin_decoding("half")`,
# `generate(..., cache="half")`, `minitensor generate --cache half` (from a plugin file given
# with `--plugin`). The kit ran it through a float64 layer, token by token and as a prompt
# followed by single tokens, with grouped heads and rotary positions, and checked `copy()`,
# `select()` and `crop()`.
#
# ## Exercises
#
# 1. Train the model longer (`steps` 4,000) or deeper, and measure the attention on position
#    0 again. Does a sink appear? Then try training with every window starting at a newline
#    (a fixed first token, as the paper's models have), and compare `window` with `sinks`.
# 2. StreamingLLM (section 3.3) proposes a learnable *sink token* added at the start of every
#    training text. Add one to the vocabulary and to each window, and measure what `window`
#    loses without it.
# 3. Write `int4`: 16 levels instead of 256. What are the error per number, the bound and the
#    memory ratio? Check it with `check_kv_cache(..., tolerance="bound")`.
# 4. Sample with `decoder("speculative", draft=draft, k=4, sample=True)` and compare the
#    acceptance rate with greedy agreement. Which $k$ is fastest here, and why does a larger
#    $k$ stop helping?
# 5. Write a processor: `no_repeat_ngram` (forbid any token that would repeat an n-gram already
#    in the text), registered with `minitensor_decoders`, with `kind = "processor"`. Does it
#    remove greedy search's loops?
#
# ## References
#
# * G. Xiao, Y. Tian, B. Chen, S. Han, M. Lewis, "Efficient Streaming Language Models with
#   Attention Sinks", ICLR 2024, [arXiv:2309.17453](https://arxiv.org/abs/2309.17453).
# * Z. Liu, J. Yuan, H. Jin, S. Zhong, Z. Xu, V. Braverman, B. Chen, X. Hu, "KIVI: A Tuning-Free
#   Asymmetric 2bit Quantization for KV Cache", ICML 2024,
#   [arXiv:2402.02750](https://arxiv.org/abs/2402.02750).
# * A. Fan, M. Lewis, Y. Dauphin, "Hierarchical Neural Story Generation", ACL 2018,
#   [arXiv:1805.04833](https://arxiv.org/abs/1805.04833) (top-k).
# * A. Holtzman, J. Buys, L. Du, M. Forbes, Y. Choi, "The Curious Case of Neural Text
#   Degeneration", ICLR 2020, [arXiv:1904.09751](https://arxiv.org/abs/1904.09751) (top-p).
# * M. N. Nguyen, A. Baker, C. Neo, A. Roush, A. Kirsch, R. Shwartz-Ziv, "Turning Up the Heat:
#   Min-p Sampling for Creative and Coherent LLM Outputs",
#   [arXiv:2407.01082](https://arxiv.org/abs/2407.01082).
# * N. S. Keskar, B. McCann, L. R. Varshney, C. Xiong, R. Socher, "CTRL: A Conditional
#   Transformer Language Model for Controllable Generation",
#   [arXiv:1909.05858](https://arxiv.org/abs/1909.05858) (the repetition penalty).
# * Y. Leviathan, M. Kalman, Y. Matias, "Fast Inference from Transformers via Speculative
#   Decoding", ICML 2023, [arXiv:2211.17192](https://arxiv.org/abs/2211.17192).
# * C. Chen, S. Borgeaud, G. Irving, J.-B. Lespiau, L. Sifre, J. Jumper, "Accelerating Large
#   Language Model Decoding with Speculative Sampling",
#   [arXiv:2302.01318](https://arxiv.org/abs/2302.01318).
#
# ## Where this lives in the engine
#
# * `minitensor/core/hookspecs.py` — the contract: "Key/value caches" and "Decoders";
# * `minitensor/core/nn/kv_cache.py` — `KVCache`, the base class of a policy;
# * `plugins/minitensor_plugins/kv_caches.py` — `full`, `window`, `sinks`, `int8`;
# * `minitensor/core/nn/attention.py` — `MultiHeadAttention.cached_self_attention`;
# * `minitensor/core/nn/transformer.py` — `TransformerLM.begin_decoding`, `decode_step`, `crop_state`;
# * `plugins/minitensor_plugins/decoders.py` — the processors and searches;
# * `minitensor/inference/decoders.py` — `decoder()`, the chain; `minitensor/inference/decoding.py` — `generate`;
# * `minitensor/inference/speculative.py` — speculative decoding;
# * `minitensor/testing_caches.py` — `check_kv_cache`, `KEEPS`, `attention_error_bound`, `check_cached_generation`.
