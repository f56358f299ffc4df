# %% [markdown]
# # 7. The Transformer: encoder, decoder, training, decoding
#
# D2L's last section on attention presents the Transformer as an instance of the
# encoder–decoder architecture (Transformer作为编码器－解码器架构的一个实例), based entirely on
# attention, without any convolutional or recurrent layer
# (完全基于注意力机制，没有任何卷积层或循环神经网络层), and draws it in one architecture
# diagram. Everything before it in the chapter is a part of that diagram: multi-head
# attention (多头注意力, tutorial 5), self-attention (自注意力) and the positional encoding
# (位置编码, tutorial 6), and encoder–decoder attention (编码器－解码器注意力), whose queries
# come from the decoder while its keys and values come from the encoder's output.
#
# This tutorial
#
# 1. draws the diagram and builds its pieces one by one — position-wise FFN, add & norm,
#    encoder block, decoder block with its causal mask — checking each claim numerically;
# 2. trains D2L's small Transformer to normalise dates ("3rd of May 2021" → "2021-05-03")
#    with `minitensor.train`;
# 3. decodes with greedy search and beam search, scores with BLEU as D2L defines it;
# 4. draws the three kinds of attention a trained Transformer has.
#
# Run it as `python tutorials/07_transformer.py` (about a minute on 2 idle CPU cores) or open
# it as a notebook with jupytext. `MINITENSOR_TUTORIAL_SMOKE=1` shrinks everything to a few
# seconds.
#
# Sources: D2L's attention chapter, in the Chinese edition 《动手学深度学习》 (zh.d2l.ai),
# 10.7 Transformer, and in the English edition *Dive into Deep Learning* (d2l.ai), 11.7 "The
# Transformer Architecture"; for teacher forcing, BLEU and beam search the sections before
# the chapter, 9.7 序列到序列学习（seq2seq） and 9.8 束搜索 (English: 10.7 "Sequence-to-Sequence
# Learning for Machine Translation" and 10.8 "Beam Search"). Papers: Vaswani et al. (2017),
# "Attention Is All You Need"; Ba, Kiros and Hinton (2016), "Layer Normalization"; Xiong et
# al. (2020), "On Layer Normalization in the Transformer Architecture"; Papineni et al.
# (2002), "BLEU: a Method for Automatic Evaluation of Machine Translation".

# %%
import time

import numpy as np
from _tutorial import LANG, SMOKE, figure_path, pick, text  # text(): figure labels in the tutorial's language

import minitensor as mt
from minitensor.metrics import bleu, corpus_bleu, exact_match
from minitensor.train import TrainConfig, plot_loss, plot_transformer_attention, train, translate
from minitensor.train.config import build_data

T = "07_transformer"
FIGURES = figure_path(T, "architecture.png").parent  # where every PNG of this tutorial goes
mt.manual_seed(0)
print("smoke mode" if SMOKE else "full mode")

# %% [markdown]
# ## The architecture
#
# The **encoder** (编码器) turns the source tokens $x_1, \dots, x_n$ into as many vectors; the
# **decoder** (解码器) produces the target one token at a time, each step reading the tokens
# it has produced so far and, through encoder–decoder attention, the encoder's vectors. Both
# start the same way, with embeddings scaled by $\sqrt{d}$ and the positional encoding added
# (D2L: 乘以嵌入维度的平方根进行重新缩放，然后再与位置编码相加, "rescaled by the square root
# of the embedding dimension, then added to the positional encoding"):
#
# $$\mathbf X^{(0)} = \text{dropout}\big(\text{Embedding}(\text{tokens})\sqrt{d} + \mathbf P\big),
# \qquad d = \texttt{num\_hiddens}.$$
#
# Then `num_blks` identical blocks. An **encoder block** has two sublayers:
#
# $$\mathbf Y = \text{AddNorm}\big(\mathbf X, \text{MultiHead}(\mathbf X, \mathbf X, \mathbf X)\big),
# \qquad \mathbf Z = \text{AddNorm}\big(\mathbf Y, \text{FFN}(\mathbf Y)\big).$$
#
# A **decoder block** has three: masked (causal) self-attention over the target so far,
# encoder–decoder attention (编码器－解码器注意力, often called cross-attention, with
# queries from the decoder and keys = values = the encoder's output $\mathbf H$), and the FFN:
#
# $$\mathbf Y = \text{AddNorm}\big(\mathbf X, \text{MaskedMultiHead}(\mathbf X, \mathbf X, \mathbf X)\big),\quad
# \mathbf Z = \text{AddNorm}\big(\mathbf Y, \text{MultiHead}(\mathbf Y, \mathbf H, \mathbf H)\big),\quad
# \text{out} = \text{AddNorm}\big(\mathbf Z, \text{FFN}(\mathbf Z)\big).$$
#
# Every multi-head attention is the one of tutorial 5,
#
# $$\text{MultiHead}(\mathbf Q, \mathbf K, \mathbf V) = \text{concat}(\mathbf h_1, \dots, \mathbf h_h)\mathbf W_o,
# \qquad \mathbf h_i = \text{softmax}\Big(\frac{\mathbf Q\mathbf W_q^{(i)}
#   (\mathbf K\mathbf W_k^{(i)})^\top}{\sqrt{d_h}}\Big)\mathbf V\mathbf W_v^{(i)}.$$
#
# A final linear layer turns the decoder's output into logits over the target vocabulary.
# The diagram, after Figure 1 of Vaswani et al. (2017), which D2L reproduces:

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
    # the encoder
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
    # the decoder
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
    # cross-attention: keys and values from the encoder, queries from the decoder
    arrow((ex + 0.95, 6.05), (dx - 1.65, 4.3), connectionstyle="arc3,rad=-0.3", color="C3")
    ax.text(5.0, 6.15, text("keys, values"), color="C3", fontsize=9, ha="center")
    ax.text(dx + 0.12, 3.8, text("queries"), color="C3", fontsize=8, ha="left", va="center")
    ax.text(5.0, 10.5, text("The Transformer: an encoder-decoder for sequence pairs"), ha="center", fontsize=11)
    fig.savefig(path, dpi=110)


draw_architecture(figure_path(T, "architecture.png"))
print("wrote", figure_path(T, "architecture.png"))

# %% [markdown]
# ## The position-wise feed-forward network
#
# The position-wise FFN (基于位置的前馈网络) is a two-layer MLP applied to every position with
# the *same* weights:
#
# $$\text{FFN}(\mathbf x) = \max(0, \mathbf x\mathbf W_1 + \mathbf b_1)\mathbf W_2 + \mathbf b_2 .$$
#
# "Position-wise" means it never mixes positions: the output at position $t$ depends only
# on the input at position $t$. Attention is the only sublayer that moves information
# between positions. Two checks: feeding one position alone gives the same row, and
# shuffling the positions shuffles the outputs the same way.

# %%
ffn = mt.nn.PositionWiseFFN(16, 32)  # (ffn_num_input, ffn_num_hiddens); output size 16
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
# ## Add & norm: the residual connection and layer normalisation
#
# Every sublayer is wrapped in a residual connection (残差连接) followed by layer
# normalisation (层规范化) — "add & norm" (加法和规范化):
#
# $$\text{AddNorm}(\mathbf X, \mathbf Y) = \text{LayerNorm}(\mathbf X + \text{dropout}(\mathbf Y)),\qquad
# \text{LayerNorm}(\mathbf x) = \boldsymbol\gamma \odot \frac{\mathbf x - \mu}{\sqrt{\sigma^2 + \epsilon}}
#   + \boldsymbol\beta,$$
#
# with $\mu$ and $\sigma^2$ the mean and variance of the $d$ features *of one position*.
# Unlike batch normalisation nothing depends on the other examples or on the sequence
# length, which varies from batch to batch. The residual path lets gradients skip the
# sublayer; the normalisation keeps every position at a fixed scale. With
# $\boldsymbol\gamma = 1$, $\boldsymbol\beta = 0$ (a fresh layer) the output has mean 0 and
# variance 1 at every position:

# %%
add_norm = mt.nn.AddNorm(16, dropout=0.0)  # norm_first=False: the book's (post-LN) form
X, Y = mt.randn(2, 5, 16) * 3 + 1, mt.randn(2, 5, 16)
Z = add_norm(X, Y).numpy()
mean, var = Z.mean(axis=-1), Z.var(axis=-1)
print(f"per-position mean: max |.| = {np.abs(mean).max():.1e}; variance in [{var.min():.6f}, {var.max():.6f}]")
assert np.allclose(mean, 0, atol=1e-5), "AddNorm output: every position has mean 0"
assert np.allclose(var, 1, atol=1e-3), "AddNorm output: every position has variance 1 (up to eps)"

# %% [markdown]
# D2L 11.7.2 (Chinese edition 10.7.2) sets the two side by side on a batch of two examples with
# two features each: layer normalisation makes each *row* (one example) mean 0 and variance 1,
# batch normalisation each *column* (one feature, over the batch). In training mode batch norm
# uses the batch's own statistics; `model.eval()` switches it to the running averages it kept,
# so that a prediction does not depend on what else is in the batch. A Transformer's batches
# mix sequences of different lengths padded to one, which is one reason it normalises per
# position.

# %%
ln = mt.nn.LayerNorm(2)
bn = mt.nn.LazyBatchNorm1d()  # its num_features, 2, comes from the first input
X2 = mt.tensor([[1, 2], [2, 3]], dtype=mt.float32)
print("layer norm:", ln(X2), "\nbatch norm:", bn(X2))
assert np.allclose(ln(X2).numpy(), [[-1, 1], [-1, 1]], atol=1e-4), "layer norm: each example"
assert np.allclose(bn(X2).numpy(), [[-1, -1], [1, 1]], atol=1e-4), "batch norm: each feature"

# %% [markdown]
# > **Errata / which version the code implements**
# >
# > *Post-LN (the book) or pre-LN (minitensor's default recipe).*
# >
# > The original Transformer and D2L normalise *after* the residual sum, "post-LN":
# > $\mathbf X \leftarrow \text{LayerNorm}(\mathbf X + \text{sublayer}(\mathbf X))$. `mt.nn.AddNorm`,
# > `TransformerEncoder` and `TransformerDecoder` implement exactly that by default
# > (`norm_first=False`). Many Transformers trained since (GPT-2, PyTorch's `norm_first=True`;
# > Xiong et al. 2020) normalise what goes *into* the sublayer instead, "pre-LN":
# > $\mathbf X \leftarrow \mathbf X + \text{sublayer}(\text{LayerNorm}(\mathbf X))$, plus one final
# > LayerNorm after the last block. The residual stream is then never normalised, the
# > gradients reach the first blocks undiminished, and training tolerates a much larger
# > learning rate. `minitensor train` (`TrainConfig`) therefore uses pre-LN, no dropout (暂退法) and
# > a peak learning rate of 1e-2: 100% held-out exact match on the date task in 4 epochs,
# > where the book's post-LN recipe (`--no-norm-first`, dropout 0.1, lr 3e-3) reaches about
# > 66% in the same time. The same `AddNorm` parameters serve both forms:
# > `Y = sublayer(addnorm.sublayer_input(X)); X = addnorm(X, Y)`.
# >
# > Smaller departures from D2L's code: `PositionWiseFFN` takes its input size first
# > (minitensor has no lazy layers); the decoder caches the *projected* keys and values of
# > past tokens rather than the block inputs (D2L's `state[2]`) — a Linear layer acts
# > position by position, so both give the same numbers; and the embedding table starts as
# > $N(0, 1/d)$ rather than $N(0, 1)$, so that after the $\sqrt d$ scaling the embeddings
# > have the scale of the positional encoding they are added to, instead of drowning it.

# %%
pre_ln = mt.nn.AddNorm(16, dropout=0.0, norm_first=True)
assert np.allclose(pre_ln(X, Y).numpy(), (X + Y).numpy()), "pre-LN: the residual stream is X + Y, not normalised"
assert np.allclose(pre_ln.sublayer_input(X).numpy().mean(axis=-1), 0, atol=1e-5), "pre-LN normalises the input"
for norm_first in (False, True):
    enc = mt.nn.TransformerEncoder(20, 16, 32, 2, 2, 0.0, norm_first=norm_first)
    print(f"norm_first={norm_first}: final LayerNorm after the blocks: {enc.ln is not None}")
    assert (enc.ln is not None) == norm_first

# %% [markdown]
# ## The encoder
#
# An encoder block keeps the shape, (batch, steps, `num_hiddens`), so blocks stack. Its
# self-attention uses D2L's `valid_lens` to hide the padding of shorter sources: a padded
# key gets weight exactly 0 from every query of every head.

# %%
vocab_size, num_hiddens, ffn_num_hiddens, num_heads, num_blks = 20, 16, 32, 2, 2
encoder = mt.nn.TransformerEncoder(vocab_size, num_hiddens, ffn_num_hiddens, num_heads, num_blks, dropout=0.0)
src = mt.tensor(np.random.default_rng(1).integers(4, vocab_size, (2, 6)))
enc_valid_lens = mt.tensor([6, 3])
H = encoder(src, enc_valid_lens)
print("encoder:", tuple(src.shape), "->", tuple(H.shape))
assert H.shape == (2, 6, num_hiddens)
for w in encoder.attention_weights:  # one (batch, num_heads, T, T) array per block
    w = w.numpy()
    assert w.shape == (2, num_heads, 6, 6)
    assert (w[1, :, :, 3:] == 0).all(), "padded source positions must get exactly zero weight"
    assert np.allclose(w.sum(-1), 1, atol=1e-6)
print("padding hidden in every block and head: checked")

# %% [markdown]
# D2L's five sizes and the dropout are all the encoder asks for; every other setting (the
# positional encoding, the attention plugins, pre-LN, grouped-query attention) keeps its
# default. The encoder keeps them all, defaults included, as one value: `encoder.config`, a
# `TransformerConfig`, the architecture written down. A model can be built from such a config
# as well -- the decoder below gets the encoder's architecture that way -- and
# `config.replace(...)` makes a changed copy, checked again (here: a deeper stack).

# %%
config = encoder.config  # the settings above, defaults included
print(config)
assert config == mt.nn.TransformerConfig(vocab_size, num_hiddens, ffn_num_hiddens, num_heads, num_blks, dropout=0.0)
deeper = mt.nn.TransformerEncoder(config.replace(num_blks=3))  # the same architecture, one block more
assert len(deeper.blks) == 3 and deeper.config.num_hiddens == num_hiddens

# %% [markdown]
# ## The decoder and its causal mask
#
# In training the decoder reads the whole target at once (teacher forcing, 强制教学: the
# input is the target shifted right by `<bos>`), yet the prediction of token $t+1$ may only
# use tokens $1..t$, as at prediction time, when the later ones do not exist yet. Masked
# self-attention (D2L: 掩蔽（masked）注意力, in the 掩蔽多头解码器自注意力层) enforces it:
# query $i$ may attend key $j$ only when $j \le i$,
#
# $$\alpha_{ij} = 0 \quad (j > i),$$
#
# which makes the decoder auto-regressive (自回归). Three checks: the self-attention weights
# are exactly zero above the diagonal; changing a *future* target token changes no earlier
# output; and decoding token by token (with the key/value cache, 键值缓存, that prediction
# uses) gives the same logits as the single teacher-forced pass.

# %%
decoder = mt.nn.TransformerDecoder(config)  # the encoder's architecture, from its config
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
changed[:, 3:] = (changed[:, 3:] + 1) % vocab_size  # new tokens at positions 3 and 4 only
logits_changed = model(src, mt.tensor(changed), enc_valid_lens).numpy()
assert np.allclose(logits_changed[:, :3], logits[:, :3], atol=1e-6), "a future token changed an earlier output"
assert not np.allclose(logits_changed[:, 3:], logits[:, 3:]), "...while the changed positions do change"

state = model.begin_decoding(src, enc_valid_lens)
steps = []
for t in range(dec_X.shape[1]):  # one token at a time, the cache growing
    step_logits, state = model.decode_step(mt.tensor(dec_X[:, t : t + 1]), state)
    steps.append(step_logits.numpy())
assert np.allclose(np.concatenate(steps, axis=1), logits, atol=1e-5), "token-by-token decoding != one pass"
print("causal mask: zero above the diagonal, the future cannot leak, the cache reproduces the full pass")
print(f"decoder self-attention weights of block 1, head 1, example 1:\n{np.round(self_weights[0].numpy()[0, 0], 2)}")

# %% [markdown]
# ## Training on the date task
#
# The task: read a date written in one of 13 human formats and write it as an ISO date.
# The tokens (词元) are characters; each side has its vocabulary (词表) with the reserved
# tokens `<pad>` (padding, 填充), `<bos>`, `<eos>` and `<unk>`. `minitensor.train` generates the data (held-out *calendar dates*
# never appear in training in any format), builds D2L's small Transformer (`num_hiddens`
# 32, `ffn_num_hiddens` 64, 4 heads, 2 + 2 blocks), and trains it with teacher forcing,
# minimising the cross-entropy over the valid target tokens,
#
# $$L = -\frac{1}{N}\sum_{\text{valid } t} \log P(y_t \mid y_1, \dots, y_{t-1}, \mathbf x),$$
#
# with Adam, a warm-up then cosine-decaying learning rate, and gradient clipping. After
# every epoch it reports the held-out loss, the exact-match accuracy of greedy decoding and
# the corpus BLEU, and writes a checkpoint. We stop after the first epoch, keep that half-
# trained model for the decoding comparison below, then resume (bit for bit as an
# uninterrupted run) to the end. Full mode is the default recipe of `minitensor train`;
# smoke mode a tiny version of it. A run folder belongs to one run: `overwrite=True`
# (`minitensor train --overwrite`) lets this tutorial start afresh each time it runs,
# deleting its own earlier run; without it a second run would be refused.

# %%
run_dir = figure_path(T, "date_run")  # the checkpoint and the run's own figures
# full: the defaults of `minitensor train`; smoke: 640 examples, 1 + 1 blocks, 3 epochs of 20 steps
sizes = pick({}, dict(num_train=640, num_heldout=64, batch_size=32, epochs=3, num_blks=1))
config = TrainConfig(task="date", out=str(run_dir), progress=False, seed=0, **sizes)
start = time.perf_counter()
first = train(config, overwrite=True, stop_after_epochs=1)  # one epoch, then "interrupted"
result = train(config, resume=True, lang=LANG)  # ... and continued to the end
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
# ## Greedy search and beam search
#
# Which output sequence should the decoder produce? The one that maximises
#
# $$\frac{1}{L^\alpha}\log P(y_1, \dots, y_L \mid \mathbf x)
#   = \frac{1}{L^\alpha}\sum_{t=1}^{L}\log P(y_t \mid y_1, \dots, y_{t-1}, \mathbf x),$$
#
# where $\alpha$ (D2L: 0.75) keeps long sequences from losing just for having more
# negative terms. Exhaustive search (穷举搜索) over $|V|^L$ sequences is out of the question;
#
# * **greedy search** (贪心搜索) takes the most likely token at every step, $y_t = \arg\max_y P(y \mid y_{<t}, \mathbf x)$;
# * **beam search** (束搜索) keeps the $k$ best partial sequences, extends each by every
#   token, and keeps the $k$ best of the $k|V|$ extensions; $k = 1$ is greedy search.
#
# `translate(model, sources, ..., beam_size=k)` runs both through one loop
# (`minitensor/inference/decoding.py`). The half-trained model (after epoch 1) is still unsure,
# and on a share of the examples beam search finds a sequence with a higher score than the
# one greedy search commits to:

# %%
mt.manual_seed(config.seed)  # the same data train() generated
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
# Beam search is a heuristic too, and its stopping rule is where it shows. fairseq stops an
# example once $k$ hypotheses have ended with `<eos>`; with a confident model the $k - 1$
# slots beside the right continuation fill with unlikely ones, some of which end early
# ("195`<eos>`", "19`<eos>`"), and the search would stop before the good hypothesis ends --
# returning a *worse* sequence than greedy search. minitensor's rule 4 (`decoding.py`) adds a
# second condition: the likeliest extension of the step must itself be an `<eos>`. A search
# can still return less than greedy when the length penalty prefers a different length; the
# listing below shows such cases on the trained model, if any (the `n_best` hypotheses with
# their scores).

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
# Exact match is all-or-nothing. BLEU (Papineni et al. 2002) gives partial credit for
# matching n-grams; D2L's sentence version is
#
# $$\text{BLEU} = \exp\Big(\min\Big(0, 1 - \frac{\text{len}_\text{label}}{\text{len}_\text{pred}}\Big)\Big)
#   \prod_{n=1}^{k} p_n^{1/2^n},$$
#
# where $p_n$ is the fraction of the prediction's n-grams that occur in the label (each
# label n-gram matched at most as often as it occurs there, "clipped"). Matching a long
# n-gram is harder, so D2L rewards it more: for the same precision $p_n < 1$ the factor
# $p_n^{1/2^n}$ is closer to 1 the larger $n$ is. The first factor punishes predictions
# shorter than the label, which could otherwise score a high precision by saying little.
# Checked by hand for one prediction against `minitensor.metrics.bleu`:

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
# `minitensor.metrics.corpus_bleu`, printed by the training loop, is the BLEU of papers
# (n-gram counts summed over the whole corpus, sacrebleu's convention); `bleu` is D2L's
# per-sentence score above.
#
# ## The three kinds of attention
#
# A trained encoder–decoder Transformer has three attention maps per block and head:
#
# 1. **encoder self-attention**: source × source — queries, keys and values from the same
#    sequence, the previous encoder layer's output (D2L 10.7: 在计算编码器的自注意力时，查询、键和值都来自
#    前一个编码器层的输出);
# 2. **decoder self-attention**: target × target, a lower triangle (the causal mask);
# 3. **encoder–decoder attention**: target × source — where the alignment shows: which
#    source characters each output character looked at.
#
# To draw them for one held-out date we decode it greedily, run the model once more
# teacher-forced on its own output (so the layers hold the weights of the whole sequence)
# and call `plot_transformer_attention`, which writes one PNG per kind, a row of panels per
# block and a column per head (`show_heatmaps`).

# %%
from minitensor.data import build_array

model = result.model
example = next((s for s in sources if any(c.isalpha() for c in s)), sources[0])
hyp = translate(model, example, data.src_vocab, data.tgt_vocab, data.num_steps, max_len=data.tgt_num_steps)
enc_X, enc_valid = build_array([example], data.src_vocab, len(example) + 1)  # no padding: just its tokens
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
last = cross_w[-1].numpy()[0].mean(axis=0)  # last block, averaged over the heads: (target, source)
for i, ch in enumerate(tgt_labels[1:], start=1):
    top = np.argsort(-last[i - 1])[:2]
    print(f"  output {ch!r} (fed {tgt_labels[i - 1]!r}) looks most at source {[src_labels[j] for j in top]}")

# %% [markdown]
# What to look for: row $i$ of each map is the query of the decoder input $i$, the position
# that *writes* the next character. In the encoder–decoder map the rows that write the
# year look at the source's year digits, those that write the month at the month's name or
# number, those that write the day at the day — the model found the alignment between the
# formats itself. The decoder self-attention is
# a lower triangle, and the encoder self-attention shows heads that look at neighbours and
# heads that look at separators. The run folder (`date_run/`) holds the training loop's own
# loss curve and the same three maps for the first held-out date, and the checkpoint:
# `minitensor translate --checkpoint tutorial_figures/07_transformer/date_run/checkpoint "3 May 2021"`.
#
# The same maps can be explored instead of looked at: `mt.viz.attention_page` decodes the
# date, runs the model teacher-forced inside `mt.viz.capture` (which records every layer's
# scores before the pooling, its positional bias, the keys it may see and its weights) and
# writes one HTML page that opens offline in a browser. Pick a block and a head, switch
# between scores and weights, hover a cell for its numbers, read each query's entropy, and
# switch the labels to Chinese; `minitensor explain --checkpoint RUN "3 May 2021"` writes the
# same page from the command line.

# %%
page = mt.viz.attention_page(model, example, data.src_vocab, data.tgt_vocab, max_len=data.tgt_num_steps, lang=LANG)
page.save(figure_path(T, "date_explain.html"))
kinds = [(layer["kind"], layer["block"]) for layer in page.layers]
shown = np.array(page.layers[kinds.index(("cross", len(cross_w)))]["weights"])
assert page.output == list(hyp.tokens) and np.allclose(shown, cross_w[-1].numpy()[0], atol=1e-6)
print("wrote", figure_path(T, "date_explain.html"), f"({len(page.html) / 1024:.0f} KiB)")

# %% [markdown]
# ## Exercises
#
# 1. Train the book's post-LN model, `config.replace(norm_first=False)` (the command line's
#    `minitensor train --no-norm-first`), at the default lr of 1e-2, then at 3e-3 with
#    dropout 0.1. Which one learns, and how far does each get in 4 epochs?
# 2. Decode the half-trained model with `beam_size` 1, 2, 4, 8 and `length_penalty` 0 and
#    0.75. Does exact match follow the mean score? Find an example where beam search and
#    greedy search disagree and print `n_best=4` hypotheses with their log-probabilities.
# 3. Train D2L's earlier model, a GRU encoder–decoder with additive (Bahdanau) attention,
#    `config.replace(model="bahdanau")`, and compare its held-out accuracy, its time per
#    epoch and its single attention map (`date_run/attention.png`) with the Transformer's.
#
# ## Where this lives in the engine
#
# * `minitensor/core/nn/transformer.py` — `PositionWiseFFN`, `AddNorm` (post- and pre-LN),
#   `TransformerEncoderBlock`, `TransformerDecoderBlock` (with the key/value cache),
#   `TransformerEncoder`, `TransformerDecoder`, `EncoderDecoder`, `TransformerLM`;
# * `minitensor/core/nn/attention.py` — `MultiHeadAttention`, `causal_mask`;
# * `minitensor/train/config.py` — `TrainConfig` and the builders of data and model;
#   `minitensor/train/loop.py` — `train`, evaluation, checkpoints, resuming;
# * `minitensor/inference/decoding.py` — greedy search, beam search, `translate`;
# * `minitensor/metrics.py` — D2L's `bleu`, `corpus_bleu`, `exact_match`;
# * `minitensor/train/plots.py` — `plot_loss`, `show_heatmaps`, `plot_transformer_attention`;
# * `minitensor/data/tasks.py` — the date task.
