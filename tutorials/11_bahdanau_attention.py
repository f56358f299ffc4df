# %% [markdown]
# # 11. Bahdanau attention: an encoder–decoder that learns where to look
#
# Before the Transformer, attention entered deep learning inside a recurrent encoder–decoder.
# D2L's sequence-to-sequence model (序列到序列学习) encodes the whole source into one
# fixed-shape context variable (上下文变量) and decodes the target from it. Bahdanau, Cho and
# Bengio (2014) saw that this one vector is a bottleneck for long sentences, and let the
# decoder, at every step, take a different weighted average of *all* the encoder's states:
# the weights come from an alignment model (对齐) scored by additive attention (加性注意力).
# D2L calls the result a differentiable attention model without the restriction of a
# strictly one-way alignment (没有严格单向对齐限制的可微注意力模型).
#
# This tutorial
#
# 1. writes down the encoder–decoder *without* attention and its fixed context;
# 2. writes down Bahdanau's decoder: the additive scorer as the alignment model, checked by
#    hand against its formula;
# 3. trains both the same way to reverse strings of letters and measures the bottleneck:
#    exact match (精确匹配) against the input length, one curve per model;
# 4. draws the alignment that the trained model found;
# 5. compares both with the Transformer of tutorial 7 on the same task: accuracy, training
#    time, parameters.
#
# Run it as `python tutorials/11_bahdanau_attention.py` (about a minute on 2 CPU cores) or open
# it as a notebook with jupytext. `MINITENSOR_TUTORIAL_SMOKE=1` shrinks
# everything to a few seconds.
#
# Sources: D2L's attention chapter, in the Chinese edition 《动手学深度学习》 (zh.d2l.ai),
# 10.4 Bahdanau 注意力, and in the English edition *Dive into Deep Learning* (d2l.ai), 11.4
# "The Bahdanau Attention Mechanism"; the encoder–decoder without attention is the section
# before the chapter, 9.7 序列到序列学习（seq2seq） (English: 10.7 "Sequence-to-Sequence
# Learning for Machine Translation"); the additive scorer is 10.3 注意力评分函数 (English: 11.3
# "Attention Scoring Functions"). Paper: Bahdanau, Cho and Bengio (2014), "Neural Machine
# Translation by Jointly Learning to Align and Translate", arXiv:1409.0473.

# %%
import time

import numpy as np
from _tutorial import LANG, SMOKE, figure_path, pick, text  # text(): figure labels in the tutorial's language

import minitensor as mt
from minitensor import nn
from minitensor.data import Batches, seq2seq_arrays
from minitensor.train import TrainConfig, plot_seq2seq_attention, translate
from minitensor.train.config import build_data, build_model, build_optimizer, build_scheduler

T = "11_bahdanau_attention"
mt.manual_seed(0)
print("smoke mode" if SMOKE else "full mode")

# %% [markdown]
# ## The encoder–decoder without attention
#
# The encoder (编码器) is a GRU (门控循环单元（GRU）) reading the source tokens
# $x_1, \dots, x_T$; its hidden state (隐状态) after token $t$ is
# $\mathbf h_t = f(\mathbf x_t, \mathbf h_{t-1})$. D2L's decoder (解码器, zh 9.7 / en 10.7)
# takes the last one as the context variable,
#
# $$\mathbf c = \mathbf h_T, \qquad
# \mathbf s_{t'} = g\big([\mathbf e(y_{t'-1}); \mathbf c], \mathbf s_{t'-1}\big), \qquad
# P(y_{t'} \mid y_{<t'}, \mathbf x) = \text{softmax}(\mathbf W \mathbf s_{t'} + \mathbf b),$$
#
# with $\mathbf e(y)$ the embedding of the previous target token and $\mathbf s_0$ the
# encoder's final state. The same $\mathbf c$ joins every step's input. Whatever the decoder
# will ever know about the source must pass through $\mathbf c$ and $\mathbf s_0$: `num_hiddens`
# numbers each, for a source of 3 tokens as for one of 300. `nn.Seq2SeqDecoder` is that
# decoder; it speaks the same protocol as every decoder of the library
# (`state = decoder.init_state(encoder(X))`, `logits, state = decoder(Y, state)`), so the same
# training loop, greedy search and beam search drive it.

# %%
vocab_size, num_hiddens = 14, 32
encoder = nn.Seq2SeqEncoder(vocab_size, num_hiddens, num_hiddens, 1)  # (vocab, embed, hiddens, layers)
decoder = nn.Seq2SeqDecoder(vocab_size, num_hiddens, num_hiddens, 1)
for length in (3, 30):
    src = mt.tensor(np.random.default_rng(length).integers(4, vocab_size, (2, length)))
    outputs, enc_state = encoder(src)  # outputs (T, batch, num_hiddens): h_1 .. h_T
    state = decoder.init_state((outputs, enc_state))
    print(f"source of {length:2} tokens: encoder outputs {tuple(outputs.shape)}, context {tuple(state.context.shape)}")
    assert state.context.shape == (2, num_hiddens), "one vector per example, whatever the length"
    assert np.array_equal(state.context.numpy(), outputs.numpy()[-1]), "the context is h_T"
logits, _ = decoder(mt.tensor([[1, 5, 6]] * 2), state)  # <bos> and two tokens, teacher-forced
assert logits.shape == (2, 3, vocab_size)

# %% [markdown]
# ## Bahdanau's decoder: the additive scorer as the alignment model
#
# Bahdanau attention replaces the fixed $\mathbf c$ by one context per decoding step
# $t'$ (D2L 10.4),
#
# $$\mathbf c_{t'} = \sum_{t=1}^{T} \alpha(\mathbf s_{t'-1}, \mathbf h_t)\, \mathbf h_t, \qquad
# \alpha(\mathbf s_{t'-1}, \mathbf h_t) = \text{softmax}_t\big(a(\mathbf s_{t'-1}, \mathbf h_t)\big),$$
#
# an attention pooling (注意力汇聚) whose query (查询) is the decoder's previous hidden state
# $\mathbf s_{t'-1}$ and whose keys (键) and values (值) are the encoder's states
# $\mathbf h_t$ (D2L: 编码器隐状态 $\mathbf h_t$ 既是键，也是值, "the encoder hidden states are
# both the keys and the values"). The scoring function (评分函数) $a$ is the additive one of tutorial 3, an
# MLP with one hidden layer of tanh units:
#
# $$a(\mathbf q, \mathbf k) = \mathbf w_v^\top \tanh(\mathbf W_q \mathbf q + \mathbf W_k \mathbf k).$$
#
# Bahdanau et al. call $a$ the *alignment model*: it scores how well the inputs around
# position $t$ and the output at position $t'$ match, and it is trained with the rest of the
# model, by backpropagation, from the translation loss alone; no alignment is ever given.
# The context then joins the input, $\mathbf s_{t'} = g([\mathbf c_{t'}; \mathbf e(y_{t'-1})], \mathbf s_{t'-1})$.
# In minitensor the scorer is a plugin looked up by name (`scorer="additive"`), so any
# other scorer can be tried in its place. Checked by hand for the first step, whose query
# is the encoder's final state $\mathbf s_0 = \mathbf h_T$:

# %%
att_decoder = nn.Seq2SeqAttentionDecoder(vocab_size, num_hiddens, num_hiddens, 1)  # scorer="additive"
src = mt.tensor(np.random.default_rng(0).integers(4, vocab_size, (2, 7)))
outputs, enc_state = encoder(src)
state = att_decoder.init_state((outputs, enc_state), [7, 4])  # example 2: only 4 valid source tokens
att_decoder(mt.tensor([[1], [1]]), state)  # one step: <bos>
scorer = att_decoder.attention.scorer
print(att_decoder.attention)


def additive_scores(scorer, q, k):
    """w_v^T tanh(W_q q + W_k k) for every query and key, in NumPy from the scorer's weights."""
    Wq, Wk, wv = (layer.weight.numpy() for layer in (scorer.W_q, scorer.W_k, scorer.w_v))
    features = np.tanh((q @ Wq.T)[:, :, None, :] + (k @ Wk.T)[:, None, :, :])  # (batch, Q, K, h)
    return features @ wv[0]  # (batch, Q, K)


q, k = enc_state.numpy()[-1][:, None, :], state.enc_outputs.numpy()  # query s_0 = h_T; keys h_1 .. h_T
scores = additive_scores(scorer, q, k)
assert np.allclose(scores, scorer(mt.tensor(q), mt.tensor(k)).numpy(), atol=1e-5)
scores[1, :, 4:] = -np.inf  # the padding of example 2 (valid_lens = 4) gets no weight
by_hand = np.exp(scores - scores.max(-1, keepdims=True))
by_hand /= by_hand.sum(-1, keepdims=True)
weights = att_decoder.attention_weights[0].numpy()  # step 1: (batch, 1, T)
assert np.allclose(by_hand, weights, atol=1e-6) and (weights[1, 0, 4:] == 0).all()
print("step 1's attention weights, example 2:", np.round(weights[1, 0], 3))

# %% [markdown]
# The only new parameters are the scorer's: $\mathbf W_q$ and $\mathbf W_k$
# (`num_hiddens` × $h$ each) and $\mathbf w_v$ ($h$); the GRU's input is
# `embed_size + num_hiddens` wide in both decoders.


# %%
def count(model):
    return sum(p.numel() for p in model.parameters())


extra = count(att_decoder) - count(decoder)
h = scorer.num_hiddens
print(f"decoder without attention {count(decoder):,} parameters, with attention {count(att_decoder):,}: +{extra:,}")
assert extra == 2 * num_hiddens * h + h

# %% [markdown]
# ## Measuring the bottleneck: reversing strings
#
# The task: read a string of letters `a`–`j` and write it backwards (`minitensor.data.reverse_task`,
# `minitensor train --task reverse`). It suits the question: every output token needs one
# source token, and that token is far from the end of the source — where the encoder's last
# state was formed — at the start of the output. Training strings have 1 to 16 letters;
# 600 held-out strings, of the same lengths, are decoded greedily and scored by exact match
# (all letters right, and the length).
#
# Both GRU models get the same sizes (embedding and hidden state 32, one layer), the same
# 600 minibatches of 128 strings in the same order, and the recipe of `minitensor train`
# (`build_optimizer`, `build_scheduler`: Adam, a warm-up to a learning rate of 0.01 then a
# cosine decay, gradients clipped at norm 1), minimising the cross-entropy of the target
# tokens with teacher forcing (强制教学). Smoke mode trains 250 minibatches of 64 strings
# of 1 to 8 letters.

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
    batches = Batches(*train_arrays, batch_size=batch_size, rng=np.random.default_rng(0))  # same order for all
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
    mt.manual_seed(0)  # the same initial encoder for both
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
# Exact match against the length of the input:

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
# The curves of the full run (600 held-out strings, about 37 per length): without attention
# the model reverses every held-out string of 1 or 2 letters, 97% of those of 3 letters, 87%
# of 4 — then falls off a cliff: 68% at 5 letters, 35% at 6, 20% at 8, 3% at 10, and not a
# single string from 11 letters on (32.3% of all held-out strings). With attention the same
# GRU reverses 100% of them, every length up to 16 included — from the same data, the same
# steps and 2,080 more parameters. A vector of 32 numbers could in principle hold 16 letters
# of a 10-letter alphabet (about 53 bits); what the bottleneck costs is learning to pack them
# into it and out again, in order, by gradient descent. That is the problem D2L 10.4 starts
# from: even though not all the input (source) tokens are useful for decoding a given token,
# the same context variable, which encodes the entire input sequence, is still used at every
# decoding step (即使并非所有输入（源）词元都对解码某个词元都有用，在每个解码步骤中仍使用编码相同的上下文变量).
#
# ## The alignment the model found
#
# Which source letters did each output step look at? `translate(..., attention=True)` keeps
# the weights of every decoded step; `plot_seq2seq_attention` draws them, a row per output
# step (its query is the state after the tokens so far), a column per source position.

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
W = hyp.attention  # (output steps, source positions), one row per scored token, <eos> included
n = len(example)
assert W.shape == (len(hyp.tokens) + hyp.ended, n + 1) and np.allclose(W.sum(-1), 1, atol=1e-5)
# output step t (from 0) writes source letter j = n - 1 - t; the key h_j is the state after reading it
rows = range(min(n, len(hyp.tokens)))
on_letter = {d: np.mean([W[t, n - 1 - t + d] for t in rows]) for d in (-1, 0, 1)}  # weight on h_{j+d}
band = np.mean([W[t, n - 1 - t : n + 1 - t].sum() for t in rows])  # on h_j or h_{j+1}
for d, w in on_letter.items():
    print(f"mean weight on h_(j{d:+d}): {w:.2f}")
print(f"mean weight on h_j and h_(j+1) together: {band:.2f} (uniform: {2 / (n + 1):.2f})")
assert band > 1.5 * (2 / (n + 1)), "attention concentrates where the letter being written was read"
if not SMOKE:
    assert band >= 0.8, "the trained model's alignment is the anti-diagonal"

# %% [markdown]
# The map is an anti-diagonal: output step $t'$, which writes the source letter $x_j$ read
# backwards, looks at the source around $x_j$. Not exactly at its key $\mathbf h_j$, though:
# in the full run the mean weight on $\mathbf h_j$ is 0.11 and on $\mathbf h_{j+1}$, the
# encoder's state one step later, 0.76 (0.87 on the two together, where a uniform weight
# would put 0.12). Both hold $x_j$: this encoder reads forwards only, so $\mathbf h_{j+1}$
# is computed from $x_{j+1}$ *and* $\mathbf h_j$, and the model found that state the better
# key. (Bahdanau et al. use a bidirectional encoder, whose annotation of word $j$ sums up
# the words on both sides of it.) Nobody told the model that reversing means reading
# backwards: the alignment model learned it from the loss, the soft alignment that Bahdanau
# et al. draw in their Figure 3, where English and French words line up along the diagonal.
#
# ## Compared with the Transformer of tutorial 7
#
# The same task, the same 600 minibatches and the same recipe, for tutorial 7's model: the
# default of `minitensor train`, D2L's small Transformer (`num_hiddens` 32, 4 heads, 2 + 2
# blocks, pre-LN). It has no recurrence at all: every position of the source is one attention
# step from every position of the target.

# %%
mt.manual_seed(0)
transformer = build_model(config, data.src_vocab, data.tgt_vocab)  # config.model: "transformer"
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
# In the full run (times on 2 CPU cores; they vary from machine to machine and from run to run):
#
# | model | parameters | training (s) | exact match | lengths 13–16 |
# |---|---:|---:|---:|---:|
# | GRU, no attention (D2L 9.7) | 17,102 | 6.1 | 32.3% | 0.0% |
# | GRU + Bahdanau (D2L 10.4) | 19,182 | 27.2 | 100.0% | 100.0% |
# | Transformer (D2L 10.7) | 43,470 | 20.8 | 100.0% | 100.0% |
#
# Both attention models solve the task; the model without attention does not. The
# Transformer needs 2.3 times the Bahdanau model's parameters and trains in a little less
# time here. The time goes to different places. The decoder without attention runs its GRU
# over the whole target in one call; the Bahdanau decoder must run one GRU step and one
# attention per target token, one after another in Python, because the query of step
# $t'$ is the state that step $t'-1$ produced — its training takes several times as
# long as that of the model without attention (4.5 times in this run). The Transformer has no recurrence: in
# training it processes all the positions of a sequence at once, in larger matrix products,
# which is what lets it grow with the hardware (D2L 10.6 compares the two: $\mathcal O(n)$
# sequential operations for an RNN, $\mathcal O(1)$ for self-attention).
#
# ## Exercises
#
# 1. Give the model without attention 64 or 128 hidden units (`gru_model` builds both GRU
#    models). How far does the cliff move? Does it disappear?
# 2. D2L's models have two GRU layers. Build both GRU models with `num_layers=2` and
#    measure the curves again.
# 3. Replace the additive scorer by `scorer="scaled_dot"` (`nn.Seq2SeqAttentionDecoder(...,
#    scorer="scaled_dot")`): the query and the keys are then compared directly, with no
#    learned $\mathbf W_q$, $\mathbf W_k$. Does the model still find the anti-diagonal?
# 4. Train on strings of 1 to 12 letters and test on 13 to 16 (`TrainConfig(heldout_min_len=13,
#    heldout_max_len=16)`). Which of the three models extrapolates to longer inputs?
# 5. Train the Bahdanau model on the date task of tutorial 7 with `minitensor train --model
#    bahdanau` and look at the `attention.png` of its run folder.
#
# ## Where this lives in the engine
#
# * `minitensor/core/nn/seq2seq.py` — `Seq2SeqEncoder`, `Seq2SeqDecoder` (no attention),
#   `Seq2SeqAttentionDecoder` (Bahdanau), `Seq2Seq`;
# * `plugins/minitensor_plugins/scorers.py` — the `additive` scorer (`AdditiveScorer`);
# * `minitensor/core/nn/attention.py` — `Attention`, the layer that joins a scorer and a pooling;
# * `minitensor/core/nn/rnn.py` — `GRU`;
# * `minitensor/data/tasks.py` — `reverse_task`; `minitensor/data/batching.py` — `seq2seq_arrays`, `Batches`;
# * `minitensor/train/config.py` — `build_model`, `build_optimizer`, `build_scheduler`;
# * `minitensor/inference/decoding.py` — `translate`, greedy search and beam search;
# * `minitensor/train/plots.py` — `plot_seq2seq_attention`.
