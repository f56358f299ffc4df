# %% [markdown]
# # 9. Positions as score biases
#
# Tutorial 6 put word order in two places: added to the inputs (the sinusoidal and learned
# encodings, $\mathbf{X} + \mathbf{P}$) and into the queries and keys (rotary). This tutorial
# is about a third place, the one many recent models use: a number added to every attention
# **score** before the pooling,
#
# $$\alpha_{ij} = \operatorname{pooling}_j\Big(\underbrace{a(\mathbf{q}_i, \mathbf{k}_j)}_{\text{content}} + \underbrace{B_{h, i, j}}_{\text{position}}\Big),$$
#
# where $h$ is the head, $i$ the query's position and $j$ the key's, and $B_{h,i,j} = -\infty$
# means "query $i$ may not attend key $j$" (its weight is 0). We look at what such a bias can
# express — relative positions (ALiBi, T5's buckets, a sliding window) — and, since these
# biases are most at home in decoders that generate text token by token, at the decoding
# side too: grouped-query attention, which shrinks the key/value cache, sparse poolings, and
# the check that the cached decoder computes exactly what the model was trained to compute.
# The last section sets up an experiment: which positional encoding still works on
# sequences longer than any seen in training?
#
# In minitensor the three biases are positional-encoding plugins of the kind "scores"
# (`plugins/minitensor_plugins/score_biases.py`): `alibi`, `t5_relative`, `sliding_window`.
# Each is built as `cls(num_heads, max_len=..., **options)` and called as
# `bias(num_queries, num_keys, q_offset=0, k_offset=0)`, which returns $B$ of shape
# (num_heads, Q, K) for queries at positions `q_offset`, `q_offset + 1`, ... and keys at
# `k_offset`, ...; `mt.nn.Attention(...)(q, k, v, bias=B)` adds it to the scores, and
# `mt.nn.MultiHeadAttention(..., positional="alibi")` does all of this itself.
#
# Sources: D2L's attention chapter, in the Chinese edition 《动手学深度学习》 (zh.d2l.ai),
# 10.6 自注意力和位置编码 (positional encoding, absolute and relative position information),
# 10.5 多头注意力 and 10.7 Transformer (the causal mask of the decoder), and in the English
# edition *Dive into Deep Learning* (d2l.ai), 11.6 "Self-Attention and Positional Encoding",
# 11.5 "Multi-Head Attention" and 11.7 "The Transformer Architecture". The book stops at
# absolute encodings added to the inputs; everything after that comes from papers, cited
# where it is used and listed at the end: Shaw, Uszkoreit and Vaswani (2018) for relative
# positions, Press, Smith and Lewis (2022) for ALiBi, Raffel et al. (2020) for T5's buckets,
# Beltagy, Peters and Cohan (2020) for sliding windows, Shazeer (2019) and Ainslie et al.
# (2023) for multi-query and grouped-query attention, Martins and Astudillo (2016) and
# Peters, Niculae and Martins (2019) for sparse poolings.

# %%
import dataclasses
import math
import tempfile
import time

import matplotlib
import numpy
from _tutorial import SMOKE, expect_error, figure_path, pick, text  # the shared helpers; text: labels in LANG
from matplotlib.figure import Figure

import minitensor as mt
from minitensor.testing import check_incremental_decoding
from minitensor.train import TrainConfig, train
from minitensor.train.config import build_data
from minitensor.train.plots import show_heatmaps

TUTORIAL = "09_positions_as_score_biases"
mt.manual_seed(0)

ALiBi = mt.plugins.lookup("positional encoding", "alibi")
T5Relative = mt.plugins.lookup("positional encoding", "t5_relative")
SlidingWindow = mt.plugins.lookup("positional encoding", "sliding_window")
# Where each positional encoding acts: its class attribute applies_to (`minitensor plugins` lists it too)
for name in ("sinusoidal", "learned", "rotary", "alibi", "t5_relative", "sliding_window"):
    print(f"{name:15} applies_to = {mt.plugins.lookup('positional encoding', name).applies_to!r}")
assert all(cls.applies_to == "scores" for cls in (ALiBi, T5Relative, SlidingWindow))

# %% [markdown]
# ## 1. Relative positions
#
# An encoding added to the inputs gives token $i$ the vector $\mathbf{x}_i + \mathbf{p}_i$, and
# the score of query $i$ against key $j$ becomes
#
# $$(\mathbf{x}_i + \mathbf{p}_i)^\top \mathbf{W}_Q^\top \mathbf{W}_K (\mathbf{x}_j + \mathbf{p}_j),$$
#
# four terms in which content and *absolute* positions are mixed (tutorial 6 showed that
# these scores are not a function of $j - i$ alone). Two consequences. What a model learns
# about position 3 is tied to position 3: a learned table simply has no row past `max_len`,
# and the sinusoidal formula, which gives every position a row, gives the positions past the
# training lengths rows that training never showed to the model. And a rule such as "look at
# the previous token" is not handed to the model as such. With a learned table it has to be
# learned as a pattern over pairs of absolute positions. With the sinusoidal table one linear
# map takes $\mathbf{p}_i$ to $\mathbf{p}_{i+\delta}$ for every $i$ (tutorial 6; D2L 10.6.3 /
# 11.6.3), so $\mathbf{W}_Q$ and $\mathbf{W}_K$ can in principle learn it once for all
# positions, but only through the position–position term, which the three others mix with content.
#
# What matters for most rules is the **relative position** (D2L 10.6: 相对位置信息, relative
# position information) $j - i$, the key's position minus the query's. Shaw, Uszkoreit and
# Vaswani (2018) gave attention that directly: learned vectors $\mathbf{a}_{j-i}$ added to the
# keys inside the score, clipped at a largest distance so that all farther ones share one
# vector. Its simplest form is one learned *number* per head and distance, added to the
# score:
#
# $$s_{h,i,j} = \frac{\mathbf{q}_i^\top \mathbf{k}_j}{\sqrt{d}} + b_h(j - i), \qquad B_{h,i,j} = b_h(j - i).$$
#
# A matrix whose entries depend only on $j - i$ is constant along every diagonal (a
# *Toeplitz* matrix): $B_{h,i+1,j+1} = B_{h,i,j}$. It is the same at positions 5000 as at
# positions 0, so whatever is learned for "distance 1" applies at every position, including
# positions no training sequence reached. Such an encoding therefore also has $O(T)$ distinct
# values, not $O(T^2)$: `relative_bias(min_distance, max_distance)` returns them as a
# (num_heads, D) table, and $B_{h,i,j}$ is column $(j - i) - \text{min\_distance}$ of it.

# %%
T = 6
i, j = numpy.indices((T, T))  # query position i (rows), key position j (columns)
for cls, options in ((ALiBi, {}), (T5Relative, {}), (SlidingWindow, {"window": 2})):
    encoding = cls(4, **options)
    B = encoding(T, T).numpy()  # (num_heads, Q, K)
    table = encoding.relative_bias(-(T - 1), T - 1).numpy()  # (num_heads, 2T - 1): distances -(T-1) .. T-1
    far = encoding(T, T, q_offset=5000, k_offset=5000).numpy()  # the same six positions, 5000 steps later
    print(f"{cls.__name__:14} relative = {cls.relative}, bias {B.shape}, distinct values per head: {table.shape[1]}")
    assert cls.relative
    assert numpy.array_equal(B[:, 1:, 1:], B[:, :-1, :-1]), "constant along the diagonals: B[i+1, j+1] = B[i, j]"
    assert numpy.array_equal(B, table[:, j - i + (T - 1)]), "B[h, i, j] is the table's value at distance j - i"
    assert numpy.array_equal(far, B), "the same bias at positions 5000.. as at 0.."

# An absolute encoding stops where its table stops: a learned table of 10 positions meets a
# sequence of 12 (the relative biases above took positions 5000 .. 5005 in their stride).
Learned = mt.plugins.lookup("positional encoding", "learned")
with expect_error("a learned absolute table of max_len=10 given a sequence of 12 tokens", ValueError):
    Learned(8, max_len=10, dropout=0.0)(mt.randn(1, 12, 8))

# %% [markdown]
# > **Takeaway.** A relative bias $B_{h,i,j} = b_h(j - i)$ is constant along diagonals: one
# > number per head and distance, the same at every position, with no table that runs out.
#
# ## 2. ALiBi: a penalty that grows with distance
#
# **ALiBi** (Attention with Linear Biases; Press, Smith and Lewis 2022, "Train Short, Test
# Long") learns nothing at all. Head $h$ subtracts a fixed multiple of the distance:
#
# $$B_{h,i,j} = -m_h\,|i - j| .$$
#
# Far keys are penalised, near ones hardly; the **slope** $m_h$ decides how fast, and each
# head gets its own, from a geometric sequence: for $n$ heads, $n$ a power of 2,
#
# $$m_h = 2^{-8h/n}, \qquad h = 1, \dots, n \qquad (8 \text{ heads: } \tfrac12, \tfrac14, \dots, \tfrac1{256}).$$
#
# A head with $m = 1/2$ is local (a key 10 positions away loses $5$ from its score: under
# softmax, $e^{-5} \approx 0.007$ times the weight of an equally scoring key at distance 0);
# one with $m = 1/256$ sees almost the whole sequence alike. For a number of heads that is
# not a power of 2, the rule of the paper's code takes the slopes for $p$, the largest power
# of 2 below $n$, and adds the first $n - p$ of *every other* slope for $2p$: 6 heads get the
# 4 slopes $2^{-2}, 2^{-4}, 2^{-6}, 2^{-8}$ and then $2^{-1}, 2^{-3}$. The extra ones are not
# all in between: $2^{-3}$ falls between $2^{-2}$ and $2^{-4}$, but $2^{-1}$ lies above every
# earlier slope: the fifth head is the steepest, the most local of the six.

# %%
num_heads, T = 8, 10
alibi = ALiBi(num_heads)
slopes = alibi.slopes.numpy()
B = alibi(T, T).numpy()
i, j = numpy.indices((T, T))
print("slopes for 8 heads: ", " ".join(f"2^{math.log2(m):.0f}" for m in slopes))
print("slopes for 6 heads: ", " ".join(f"2^{math.log2(m):.0f}" for m in ALiBi.slopes_for(6)))
print("slopes for 12 heads:", " ".join(f"2^{math.log2(m):g}" for m in ALiBi.slopes_for(12)))
assert list(slopes) == [2.0**-h for h in range(1, 9)], "8 heads: 2^-1, 2^-2, ..., 2^-8"
assert ALiBi.slopes_for(6) == [2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8, 2.0**-1, 2.0**-3]
assert numpy.allclose(B, -slopes[:, None, None] * numpy.abs(i - j)), "B[h, i, j] = -m_h |i - j|"
assert numpy.array_equal(B[:, 1:, 1:], B[:, :-1, :-1]), "depends only on the distance"
# a distance of 1 / m_h costs head h one unit of score: 2, 4, ..., 256 positions
print("distance at which a head's penalty reaches -1:", [int(1 / m) for m in slopes])

# %% [markdown]
# The paper presents ALiBi in a causal language model: query $i$ sees keys $j \le i$ only
# (the decoder's causal mask, D2L 10.7 / 11.7), and it adds
# $m_h \cdot [-(i-1), \dots, -2, -1, 0]$ to the scores of query $i$ (positions counted from
# 1), that is $m_h (j - i)$ on the keys it may see. On those cells $j - i \le 0$ and
# $m_h (j - i) = -m_h |i - j|$: the symmetric form, which an encoder (no causal mask) uses,
# *is* the paper's form wherever the mask lets a query look. We check it on the weights of an
# `mt.nn.Attention` head (`bias=` adds a bias to the scores; (num_heads, Q, K) broadcasts
# over the batch):

# %%
d = 4
q, k, v = mt.randn(1, num_heads, T, d), mt.randn(1, num_heads, T, d), mt.randn(1, num_heads, T, d)
head = mt.nn.Attention("scaled_dot", "softmax", 0.0)
paper_causal = (slopes[:, None, None] * (j - i)).astype(numpy.float32)  # m_h (j - i), meaningful for j <= i
out_symmetric = head(q, k, v, causal=True, bias=mt.tensor(B)).numpy()
weights_symmetric = head.attention_weights.numpy()
out_paper = head(q, k, v, causal=True, bias=mt.tensor(paper_causal)).numpy()
weights_paper = head.attention_weights.numpy()
assert numpy.array_equal(B[:, j <= i], paper_causal[:, j <= i]), "equal on every cell the causal mask allows"
assert numpy.abs(weights_symmetric - weights_paper).max() < 1e-6 and numpy.abs(out_symmetric - out_paper).max() < 1e-5
assert (weights_symmetric[..., j > i] == 0).all(), "the future gets no weight"

show_heatmaps(
    B.reshape(2, 4, T, T),
    xlabel=text("key position j"),
    ylabel=text("query position i"),
    cmap="viridis",
    titles=[[text("head {h}: m = 1/{n}", h=h, n=2**h) for h in range(r * 4 + 1, r * 4 + 5)] for r in range(2)],
    figsize=(11, 6.4),
    suptitle=text("ALiBi: B[h, i, j] = -m_h |i - j|, 8 heads"),
    path=figure_path(TUTORIAL, "alibi_heads.png"),
)

# %% [markdown]
# > **Takeaway.** ALiBi is $-m_h |i - j|$ with fixed slopes $2^{-8h/n}$: no parameter, no
# > length limit, steep heads that look near and shallow ones that look far; under a causal
# > mask it is exactly the paper's $m_h (j - i)$.
#
# ## 3. T5's relative buckets
#
# T5 (Raffel et al. 2020, section 2.1) *learns* its bias, one number per head and **bucket**
# of distances: $B_{h,i,j} = \text{table}[\operatorname{bucket}(j - i), h]$. Near distances
# each get their own bucket (the words next to you matter one by one), farther ones share
# buckets whose widths grow logarithmically, and beyond `max_distance` everything falls in
# the last one. With $b$ buckets for one direction and $n = |j - i|$:
#
# $$\operatorname{bucket}(n) = \begin{cases} n & n < b/2 \quad\text{(exact)} \\
# \min\!\Big(b - 1,\; \tfrac b2 + \Big\lfloor \dfrac{\log(n / (b/2))}{\log(\text{max\_distance} / (b/2))} \cdot \tfrac b2 \Big\rfloor\Big) & n \ge b/2 \quad\text{(log-spaced)} \end{cases}$$
#
# **Bidirectional** (an encoder: keys on both sides) splits the `num_buckets` = 32 buckets
# into $b = 16$ for keys behind or at the query ($j - i \le 0$: buckets 0..15) and 16 for
# keys ahead ($j - i > 0$: buckets 16..31, of which 16, distance $+0$, stays unused).
# **Unidirectional** (a decoder) uses all $b = 32$ for the past, $n = \max(i - j, 0)$, and
# puts every future key in bucket 0, where the causal mask hides it anyway. The models
# choose: `TransformerEncoder` builds it bidirectional, `TransformerDecoder` not. T5's
# defaults are 32 buckets and `max_distance` 128.

# %%
t5 = T5Relative(4)  # num_buckets=32, max_distance=128, bidirectional=True
t5_decoder = T5Relative(4, bidirectional=False)
shown = [0, 1, 2, 3, 7, 8, 9, 11, 12, 16, 23, 24, 32, 45, 64, 90, 127, 128, 500, 10_000]
print("distance n     key n behind  key n ahead   decoder (n behind)")
for n in shown:
    print(f"{n:>10} {t5.bucket(-n):>13} {t5.bucket(n) if n else '-':>12} {t5_decoder.bucket(-n):>20}")

n = numpy.arange(0, 2001)
behind, ahead, past = t5.bucket(-n), t5.bucket(n[1:]), t5_decoder.bucket(-n)
assert list(behind[:8]) == list(range(8)) and list(ahead[:7]) == list(range(17, 24)), "exact buckets near 0"
assert list(past[:16]) == list(range(16)), "a decoder has 16 exact buckets (all 32 serve the past)"
for buckets in (behind, ahead, past):
    assert (numpy.diff(buckets) >= 0).all(), "monotone: a farther key never gets a nearer bucket"
assert (behind[128:] == 15).all() and (ahead[127:] == 31).all() and (past[128:] == 31).all(), (
    "saturating: from max_distance = 128 on, one bucket for every distance"
)
assert behind[64] < 15, "... but not before: 64 positions away is still a bucket of its own range"
assert (t5_decoder.bucket(numpy.arange(1, 100)) == 0).all(), "a decoder puts every future key in bucket 0"
widths = numpy.bincount(behind[:128])
print("distances per bucket (keys behind, up to 127):", widths.tolist())

# %% [markdown]
# The table is a Parameter of shape (num_buckets, num_heads), learned with the rest of the
# model, and T5 shares it: every layer of a stack uses the same table (each head its own
# column). `TransformerEncoder(..., positional="t5_relative")` therefore builds the
# encoding once and hands the same module to every block; a model counts its parameters
# once, and every block's gradient flows into that one table.

# %%
encoder = mt.nn.TransformerEncoder(
    vocab_size=20, num_hiddens=16, ffn_num_hiddens=32, num_heads=4, num_blks=3, dropout=0.0, positional="t5_relative"
)
biases = [blk.attention.positional for blk in encoder.blks]
shared = biases[0]
print("the bias module of each block:", [f"{type(b).__name__} at {hex(id(b))}" for b in biases])
assert all(b is shared for b in biases), "one module, shared by every encoder block"
assert shared.bidirectional and shared.table.shape == (32, 4)
assert sum(p is shared.table for p in encoder.parameters()) == 1, "a shared parameter is counted once"
encoder(mt.tensor(numpy.random.default_rng(0).integers(0, 20, size=(2, 9)))).sum().backward()
assert shared.table.grad is not None and numpy.abs(shared.table.grad.numpy()).sum() > 0, "learned: it gets a gradient"
decoder = mt.nn.TransformerDecoder(
    vocab_size=20, num_hiddens=16, ffn_num_hiddens=32, num_heads=4, num_blks=2, dropout=0.0, positional="t5_relative"
)
assert decoder.blks[0].attention1.positional is decoder.blks[1].attention1.positional
assert not decoder.blks[0].attention1.positional.bidirectional, "a decoder's is unidirectional"

fig = Figure(figsize=(12, 3.8), layout="constrained")
ax_buckets, ax_bias = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1.4, 1]})
rel = numpy.arange(-300, 301)
ax_buckets.step(rel, t5.bucket(rel), where="mid", label=text("bidirectional (encoder)"))
ax_buckets.step(rel, t5_decoder.bucket(rel), where="mid", label=text("unidirectional (decoder)"))
for x in (-128, 128):
    ax_buckets.axvline(x, color="grey", linestyle=":")
ax_buckets.set(
    xlabel=text("relative position j - i (key minus query)"),
    ylabel=text("bucket"),
    title=text("T5 buckets: exact near 0, log-spaced to ±128, then one"),
)
ax_buckets.legend()
image = ax_bias.imshow(t5(24, 24).detach().numpy()[0], cmap="viridis")
fig.colorbar(image, ax=ax_bias, shrink=0.8)
ax_bias.set(
    xlabel=text("key position j"),
    ylabel=text("query position i"),
    title=text("head 1's bias (random init., std 0.02)"),
)
fig.savefig(figure_path(TUTORIAL, "t5_buckets.png"), dpi=100)

# %% [markdown]
# > **Takeaway.** T5 learns one number per head and bucket; buckets are exact for the nearest
# > distances, logarithmically coarser up to `max_distance`, then saturate. One table serves
# > every layer of the stack.
#
# ## 4. Windows: -inf outside a band
#
# A bias may also forbid. The **sliding window** (local attention; Beltagy, Peters and Cohan
# 2020, Longformer) lets each query see only the keys within `window` positions:
#
# $$B_{h,i,j} = \begin{cases} 0 & |j - i| \le w \\ -\infty & \text{otherwise} \end{cases}$$
#
# A $-\infty$ score gets weight $e^{-\infty} = 0$ from softmax, exactly as a masked key does
# (D2L 10.3's masked softmax): the window is a mask written as a bias, the same for every
# head. Combined with the decoder's causal mask ($j \le i$) a query sees the last $w + 1$
# positions, itself included. Useful work drops from $T^2$ scores to about $T(2w + 1)$
# (minitensor computes all $T^2$ and masks them; a fused kernel can read the encoding's
# attribute `window` and skip the key blocks outside the band), and a stack of $L$ layers
# still connects positions $L w$ apart, as stacked convolutions do (tutorial 6).

# %%
window, T = 2, 8
i, j = numpy.indices((T, T))
sliding = SlidingWindow(2, window=window)
B = sliding(T, T).numpy()
print(f"window = {sliding.window}; bias of head 1 (0 = may attend):\n", B[0])
assert sliding.window == window and SlidingWindow.window is None, "the instance carries its window"
assert (B[:, numpy.abs(j - i) <= window] == 0).all() and (B[:, numpy.abs(j - i) > window] == -numpy.inf).all()

mha = mt.nn.MultiHeadAttention(16, 2, positional="sliding_window", positional_options={"window": window})
X = mt.randn(1, T, 16)
with mt.no_grad():
    mha(X, X, X)
    weights_window = mha.attention_weights.numpy()[0]  # (num_heads, Q, K)
    mha(X, X, X, causal=True)
    weights_causal = mha.attention_weights.numpy()[0]
inside = numpy.abs(j - i) <= window
inside_causal = inside & (j <= i)
assert (weights_window[:, ~inside] == 0).all() and (weights_window[:, inside] > 0).all(), (
    "keys beyond the window get weight exactly 0, those inside some weight"
)
assert (weights_causal[:, ~inside_causal] == 0).all() and (weights_causal[:, inside_causal] > 0).all()
assert list(inside_causal.sum(axis=1)) == [min(r, window) + 1 for r in range(T)], "causal: the last w + 1 positions"
assert numpy.allclose(weights_causal.sum(axis=-1), 1.0, atol=1e-6)


def layers_to_reach(n, window, max_layers):
    """The fewest stacked windowed layers after which output n - 1 depends on input 0 (by gradient)."""
    x = mt.randn(1, n, 16, requires_grad=True)
    stack = []
    for num_layers in range(1, max_layers + 1):
        stack.append(
            mt.nn.MultiHeadAttention(16, 2, positional="sliding_window", positional_options={"window": window})
        )
        x.grad = None
        y = x
        for layer in stack:
            y = layer(y, y, y)
        y[:, n - 1].sum().backward()
        if (x.grad.numpy()[0, 0] != 0).any():
            return num_layers
    return None


for n_tokens in (9, 13):
    needed = layers_to_reach(n_tokens, window, 8)
    print(f"n = {n_tokens}, window {window}: x_0 reaches y_{n_tokens - 1} after {needed} layers")
    assert needed == math.ceil((n_tokens - 1) / window), "L layers of window w reach L * w positions"

fig = Figure(figsize=(12, 4), layout="constrained")
reds = matplotlib.colormaps["Reds"].with_extremes(bad="white")  # exact zeros are masked: drawn white
for ax, w, title in zip(
    fig.subplots(1, 3),
    (numpy.isfinite(B[0]) * 1.0, weights_window[0], weights_causal[0]),
    (
        text("allowed by the bias (B = 0)"),
        text("weights, window {window}", window=window),
        text("weights, window {window} + causal mask", window=window),
    ),
):
    image = ax.imshow(numpy.ma.masked_equal(w, 0.0), cmap=reds, vmin=0, vmax=1)
    ax.set(xlabel=text("key position j"), ylabel=text("query position i"), title=title)
fig.colorbar(image, ax=ax, shrink=0.8)
fig.suptitle(text("sliding window, head 1 (white: exactly 0)"))
fig.savefig(figure_path(TUTORIAL, "sliding_window.png"), dpi=100)

# %% [markdown]
# > **Takeaway.** A window is a bias of 0 and $-\infty$: keys outside get weight exactly 0,
# > causal or not, and depth, not width, buys a longer reach.
#
# ## 5. Grouped heads: fewer keys and values to keep
#
# A decoder generating text keeps, for every layer, the projected keys and values of every
# past token (the key/value cache of tutorial 7), and at every new token reads all of it:
# for long texts, decoding speed is bound by that memory, not by arithmetic. **Multi-query
# attention** (Shazeer 2019) keeps the $h$ query heads but computes *one* head of keys and
# values, shared by all of them; **grouped-query attention** (GQA; Ainslie et al. 2023) is
# the middle ground, $g$ key/value heads, each shared by a group of $h / g$ query heads:
#
# $$\text{head}_i = \operatorname{attention}\big(\mathbf{Q}\mathbf{W}_Q^{(i)},\; \mathbf{K}\mathbf{W}_K^{(\lfloor i / r \rfloor)},\; \mathbf{V}\mathbf{W}_V^{(\lfloor i / r \rfloor)}\big), \qquad r = h / g, \; i = 0, \dots, h - 1 .$$
#
# $g = h$ is ordinary multi-head attention (D2L 10.5 / 11.5), $g = 1$ multi-query. $\mathbf{W}_K$
# and $\mathbf{W}_V$ shrink from $h \cdot d_\text{head}$ outputs to $g \cdot d_\text{head}$, and
# so does the cache: by a factor $h / g$. In minitensor: `MultiHeadAttention(...,
# num_kv_heads=g)`. First, $g = h$ is the layer we know: load a plain layer's weights into it
# and the outputs agree.

# %%
num_hiddens, num_heads, batch, T = 32, 8, 2, 6
d_head = num_hiddens // num_heads
X = mt.randn(batch, T, num_hiddens)
plain = mt.nn.MultiHeadAttention(num_hiddens, num_heads, positional="alibi")
full_groups = mt.nn.MultiHeadAttention(num_hiddens, num_heads, positional="alibi", num_kv_heads=num_heads)
full_groups.load_state_dict(plain.state_dict())
with mt.no_grad():
    assert numpy.array_equal(plain(X, X, X, causal=True).numpy(), full_groups(X, X, X, causal=True).numpy()), (
        "num_kv_heads = num_heads is multi-head attention: same weights, same outputs"
    )

# %% [markdown]
# And a grouped layer is a multi-head layer whose key and value projections are *tied* in
# groups: copy each of its $g$ key/value heads $r$ times into a plain layer and the two
# compute the same function.

# %%
g = 2
r = num_heads // g
grouped = mt.nn.MultiHeadAttention(num_hiddens, num_heads, positional="alibi", num_kv_heads=g)
print("W_k of the plain layer:", plain.W_k.weight.shape, " of the grouped one (g = 2):", grouped.W_k.weight.shape)
assert grouped.W_k.weight.shape == (g * d_head, num_hiddens)


def repeat_heads(W):
    """(g * d_head, in) -> (num_heads * d_head, in): key/value head k serves query heads k*r .. k*r + r - 1."""
    W = W.numpy().reshape(g, 1, d_head, -1)
    return numpy.broadcast_to(W, (g, r, d_head, W.shape[-1])).reshape(num_heads * d_head, -1)


untied = mt.nn.MultiHeadAttention(num_hiddens, num_heads, positional="alibi")
untied.load_state_dict(
    {
        "W_q.weight": grouped.W_q.weight,
        "W_o.weight": grouped.W_o.weight,
        "W_k.weight": repeat_heads(grouped.W_k.weight),
        "W_v.weight": repeat_heads(grouped.W_v.weight),
    }
)
with mt.no_grad():
    gap = numpy.abs(grouped(X, X, X, causal=True).numpy() - untied(X, X, X, causal=True).numpy()).max()
print(f"|grouped - plain with repeated key/value heads| = {gap:.1e}")
assert gap < 1e-5, "GQA = multi-head attention with key/value heads tied in groups"

# %% [markdown]
# Now the cache. `cached_self_attention(x_t, cache)` decodes one token at a time and returns
# the cache extended by it (a `full` cache: it keeps every position): keys and values of shape (batch, g, T, d_head).

# %%
print(" g   W_k + W_v parameters   cached numbers after 6 tokens   cache of multi-head / this")
for g in (num_heads, 2, 1):
    layer = mt.nn.MultiHeadAttention(num_hiddens, num_heads, positional="alibi", num_kv_heads=g)
    cache = None
    with mt.no_grad():
        for t in range(T):
            out, cache = layer.cached_self_attention(X[:, t : t + 1], cache)
    keys, values = cache.keys(), cache.values()
    assert keys.shape == values.shape == (batch, g, T, d_head), "the cache holds g heads: (batch, g, T, d_head)"
    cached = keys.numel() + values.numel()
    params = layer.W_k.weight.numel() + layer.W_v.weight.numel()
    print(f"{g:>2} {params:>22} {cached:>31} {2 * batch * num_heads * T * d_head / cached:>28.0f}")
    assert 2 * batch * num_heads * T * d_head == cached * (num_heads // g), "the cache shrinks by num_heads / g"

with expect_error("num_kv_heads=3 for 8 query heads (groups must be equal)", ValueError):
    mt.nn.MultiHeadAttention(num_hiddens, num_heads, num_kv_heads=3)

# %% [markdown]
# > **Takeaway.** $g$ key/value heads shared by groups of $h/g$ query heads: $g = h$ is
# > multi-head attention, $g = 1$ multi-query, and the decoder's cache is $h / g$ times
# > smaller. The score bias is unaffected: it has one slice per *query* head.
#
# ## 6. Sparse poolings: exact zeros
#
# A window sets weights to 0 by rule. Some poolings produce exact zeros by themselves.
# **sparsemax** (Martins and Astudillo 2016) is the Euclidean projection of the scores
# $\mathbf{z}$ onto the probability simplex,
#
# $$\operatorname{sparsemax}(\mathbf{z}) = \arg\min_{\mathbf{p} \in \Delta} \|\mathbf{p} - \mathbf{z}\|^2, \qquad \operatorname{sparsemax}(\mathbf{z})_j = [z_j - \tau]_+ ,$$
#
# with the threshold $\tau$ chosen so that the weights sum to 1: every score more than a
# margin below the best gets exactly 0. **1.5-entmax** (Peters, Niculae and Martins 2019),
# between softmax and sparsemax, squares instead:
#
# $$\operatorname{entmax}_{1.5}(\mathbf{z})_j = [z_j / 2 - \tau]_+^2 .$$
#
# Softmax never gives exactly 0 ($e^{z}$ is positive): it only gets very small. The
# built-in poolings say which kind they are, with the class attribute `sparse`.

# %%
poolings = {name: mt.plugins.lookup("pooling", name) for name in ("softmax", "sparsemax", "entmax15")}
z = mt.tensor([[2.0, 1.5, 1.2, -0.5, 0.1, -2.0]], dtype=mt.float64)  # one peaked row of scores
weights = {name: cls()(z).numpy()[0] for name, cls in poolings.items()}
for name, w in weights.items():
    print(
        f"{name:10} sparse = {poolings[name].sparse!s:5}  weights {numpy.round(w, 4)}  "
        f"exact zeros: {int((w == 0).sum())}"
    )
assert not poolings["softmax"].sparse and poolings["sparsemax"].sparse and poolings["entmax15"].sparse
assert (weights["softmax"] > 0).all(), "softmax: small, never zero"
for name in ("sparsemax", "entmax15"):
    w = weights[name]
    assert (w == 0).any() and abs(w.sum() - 1) < 1e-12 and w.argmax() == 0, f"{name}: exact zeros, sums to 1"
# The formulas: one threshold tau per row, the same for every key that keeps some weight.
zs, support = z.numpy()[0], weights["entmax15"] > 0
tau = zs[support] / 2 - numpy.sqrt(weights["entmax15"][support])
assert numpy.ptp(tau) < 1e-9 and (zs[~support] / 2 <= tau[0]).all(), "entmax15 = [z/2 - tau]_+^2"
tau = zs[weights["sparsemax"] > 0] - weights["sparsemax"][weights["sparsemax"] > 0]
assert numpy.ptp(tau) < 1e-9, "sparsemax = [z - tau]_+"

# %% [markdown]
# Sparse poolings meet score biases nicely. With ALiBi and sparsemax, a key whose score,
# penalty included, falls far enough below the best gets weight exactly 0: a window, but one
# whose width each head's slope sets. With content scores all equal (zero here), head $h$'s
# weights for a query in the middle of a long sequence:

# %%
T = 64
alibi = ALiBi(num_heads)
zero_q, zero_k = mt.zeros(1, num_heads, T, d_head), mt.zeros(1, num_heads, T, d_head)
values = mt.randn(1, num_heads, T, d_head)
sparse_head = mt.nn.Attention("scaled_dot", "sparsemax", 0.0)
sparse_head(zero_q, zero_k, values, bias=alibi(T, T))
row = sparse_head.attention_weights.numpy()[0, :, T // 2]  # (num_heads, K): the query at position 32
support = (row > 0).sum(axis=1)
print("keys with nonzero weight, per head (slopes 1/2 .. 1/256):", support.tolist())
assert support[0] == 3, "m = 1/2: the query and its two neighbours; keys 2 away (1 below the best) get 0"
assert (numpy.diff(support) >= 0).all() and support[-1] > support[0], "a shallower slope, a wider window"
assert (row[0, numpy.abs(numpy.arange(T) - T // 2) > 1] == 0).all()

# %% [markdown]
# > **Takeaway.** sparsemax and 1.5-entmax set the weights of low scores to exactly 0 and
# > still sum to 1; with a distance penalty they make windows that no `window=` option fixes.
# > The width follows from each head's ALiBi slope (set by the number of heads, not learned)
# > and from the content scores (which, in a trained layer, the learned $\mathbf{W}_Q$ and
# > $\mathbf{W}_K$ produce), query by query: with equal content scores, as here, 3 keys for
# > the slope 1/2 and at least as many for each shallower slope.
#
# ## 7. Cached decoding equals the full pass
#
# A decoder is trained on whole sequences at once, `mha(X, X, X, causal=True)`, and
# generates one token at a time, `mha.cached_self_attention(x_t, cache)`. For a score bias the
# two paths must agree on *where* the queries and keys are: in the full pass queries and keys
# are both at positions $0 .. T-1$; in decoding step $t$ the single query is at position $t$
# and the keys at $0 .. t$, the first $t$ from the cache. That is what the offsets are for
# (`bias(1, t + 1, q_offset=t, k_offset=0)`). If they disagree, the model that generates is
# not the model that was trained, and nothing crashes.
#
# `minitensor.testing.check_incremental_decoding` checks it: a float64 layer, seven random
# tokens fed whole, one at a time and as a prompt of three then one at a time, outputs
# compared to 1e-9. Here for the three biases with multi-query attention ($g = 1$):

# %%
for name, options in (("alibi", None), ("t5_relative", None), ("sliding_window", {"window": 2})):
    assert check_incremental_decoding(positional=name, positional_options=options, num_kv_heads=1)
    print(f"{name:15} decoding token by token = the full causal pass (num_kv_heads=1)")
assert check_incremental_decoding(positional="alibi", pooling="entmax15", num_kv_heads=2)

# %% [markdown]
# What an offset bug looks like. Below, each encoding gets a decoding bug on purpose: once a
# cache holds keys ($K > Q$), the new queries are placed **one position too late**
# (`q_offset + 1`). In the full pass $K = Q$, so training is unaffected; only generation is.
# The check catches it for T5's buckets (every key's bias is read one distance too far back)
# and for the window (its edge moves by one):


# %%
def one_position_late(cls):
    """``cls`` with a decoding bug: after a cache, the queries sit one position too late."""

    class OnePositionLate(cls):
        def forward(self, num_queries, num_keys, q_offset=0, k_offset=0):
            if num_keys > num_queries:
                q_offset += 1
            return super().forward(num_queries, num_keys, q_offset, k_offset)

    return OnePositionLate


with expect_error("T5's relative bias with the queries one position late in decoding", AssertionError):
    check_incremental_decoding(positional=one_position_late(T5Relative)(4, dtype=mt.float64))
with expect_error("a sliding window with the queries one position late in decoding", AssertionError):
    check_incremental_decoding(positional=one_position_late(SlidingWindow)(4, window=2, dtype=mt.float64))

# %% [markdown]
# And ALiBi? The same bug passes the check, and rightly so: it changes nothing. On the cells
# the causal mask leaves ($j \le i$), the late query's bias is
# $-m_h |j - (i + 1)| = -m_h (i - j) - m_h$: the right bias minus $m_h$, the *same* $m_h$ for
# every key of the row. Softmax does not see a constant added to a whole row,
#
# $$\operatorname{softmax}(\mathbf{z} + c)_j = \frac{e^{z_j + c}}{\sum_k e^{z_k + c}} = \frac{e^{z_j}}{\sum_k e^{z_k}} ,$$
#
# and sparsemax and entmax do not either (their threshold $\tau$ moves with it). For the same
# reason an implementation may add $m_h \cdot j$ (the key's position alone) instead of
# $m_h (j - i)$ under a causal mask. The shift is *not* harmless everywhere: without the
# causal mask (an encoder, keys on both sides of the query) the keys ahead of the query get
# $m_h$ more, the keys behind $m_h$ less. A real offset bug — forgetting `q_offset`
# altogether, so that every decoded query believes it is at position 0 — is caught for ALiBi
# too.

# %%
late_alibi = one_position_late(ALiBi)(4, dtype=mt.float64)
assert check_incremental_decoding(positional=late_alibi), "invisible: a constant per row under the causal mask"
T = 8
i, j = numpy.indices((T, T))
right = ALiBi(4)(T, T).numpy()
late = ALiBi(4)(T, T, q_offset=1).numpy()  # what the late queries see
shift = late - right
minus_m = -numpy.array(ALiBi.slopes_for(4))[:, None]
assert numpy.allclose(shift[:, j <= i], minus_m), "on the cells the causal mask allows: -m_h, the same in each"
assert numpy.allclose(shift[:, j > i], -minus_m), "on the keys ahead: +m_h (which an encoder would see)"
scores = mt.randn(4, T, T)
softmax = poolings["softmax"]()
causal = mt.tensor(j <= i)
same = softmax(scores + mt.tensor(right), mask=causal).numpy() - softmax(scores + mt.tensor(late), mask=causal).numpy()
differs = softmax(scores + mt.tensor(right)).numpy() - softmax(scores + mt.tensor(late)).numpy()
print(f"causal: max weight change {numpy.abs(same).max():.1e};  no mask (encoder): {numpy.abs(differs).max():.1e}")
assert numpy.abs(same).max() < 1e-6 and numpy.abs(differs).max() > 1e-3
key_only = (numpy.array(ALiBi.slopes_for(4))[:, None, None] * j).astype(numpy.float32)  # m_h j: no query position
assert (
    numpy.abs(
        softmax(scores + mt.tensor(key_only), mask=causal).numpy()
        - softmax(scores + mt.tensor(right), mask=causal).numpy()
    ).max()
    < 1e-6
), "m_h j works as well, causally"


class ForgetsQueryOffset(ALiBi):
    """A real bug: every query is taken to be at position 0."""

    def forward(self, num_queries, num_keys, q_offset=0, k_offset=0):
        return super().forward(num_queries, num_keys, 0, k_offset)


with expect_error("ALiBi that ignores q_offset (every decoded query at position 0)", AssertionError):
    check_incremental_decoding(positional=ForgetsQueryOffset(4, dtype=mt.float64))

# %% [markdown]
# > **Takeaway.** Training and generation must place queries and keys at the same
# > positions; `check_incremental_decoding` compares the two paths. A check passing is
# > evidence only of what it can see: an ALiBi bias shifted by one under a causal mask is
# > the same model, the same shift in T5's buckets is not.
#
# ## 8. The length-extrapolation experiment
#
# The question behind relative biases: a model trained on short sequences, does it still
# work on longer ones? Press, Smith and Lewis (2022) trained language models on short
# inputs and measured their perplexity on longer ones: the sinusoidal encoding broke down
# soon after the training length, rotary and T5's bias held on longer but degraded too, and
# ALiBi kept working on inputs several times longer than the training ones ("Train Short,
# Test Long").
#
# minitensor asks the same question of a small encoder–decoder on the **reverse task**
# ("a b c" → "c b a"), where every output token depends on an exact position: train on
# sequences of lengths 1–10, test on lengths 11–20, none of which training ever showed.
# One run from the command line:
#
# ```
# minitensor train --task reverse --positional alibi --heldout-min-len 11 --heldout-max-len 20
# ```
#
# (`--positional-opt window=4` sets an option such as the window, `--num-kv-heads 1` makes
# the attention multi-query). The whole experiment — sinusoidal, learned, rotary, alibi,
# t5_relative and sliding_window (window 4), three training seeds each, greedy-decoding
# exact match on 500 fresh examples of lengths 1–10 and 500 of lengths 11–20 — is a script,
# 15 to 20 minutes on 2 CPU cores (the run below took 19):
#
# ```
# python experiments/length_extrapolation.py                  # the table below
# python experiments/length_extrapolation.py --encodings alibi,sinusoidal --seeds 1
# python experiments/length_extrapolation.py --quick          # a smoke run, seconds
# ```
#
# Here we only build the data of such a run and check that its held-out sequences are longer
# than every training one. (In full mode, the tutorial then trains one tiny ALiBi model, a
# few hundred examples for one epoch: too little to learn the task, enough to see the run
# go end to end on lengths it has never seen.)

# %%
config = TrainConfig(
    task="reverse",
    positional="alibi",
    min_len=1,
    max_len=10,
    heldout_min_len=11,
    heldout_max_len=20,
    num_train=pick(300, 100),
    num_heldout=pick(100, 20),
    epochs=1,
    batch_size=pick(32, 50),
    seed=0,
    progress=False,
)
mt.manual_seed(config.seed)
data = build_data(config)
train_lengths = sorted({len(src) for src, _ in data.train})
heldout_lengths = sorted({len(src) for src, _ in data.heldout})
print("training source lengths:", train_lengths)
print("held-out source lengths:", heldout_lengths)
print("an example:", " ".join(data.heldout[0][0]), "->", " ".join(data.heldout[0][1]))
assert max(train_lengths) <= 10 and min(heldout_lengths) >= 11 and max(heldout_lengths) <= 20, (
    "every held-out sequence is longer than every training sequence"
)
assert all(tgt == src[::-1] for src, tgt in data.heldout)

if not SMOKE:  # one tiny model, end to end (well under a minute)
    with tempfile.TemporaryDirectory() as folder:
        start = time.perf_counter()
        result = train(dataclasses.replace(config, out=f"{folder}/run"), log=lambda message: None)
        print(
            f"trained on {config.num_train} examples of lengths 1-10 for 1 epoch in "
            f"{time.perf_counter() - start:.0f} s; held-out (lengths 11-20) exact match {result.accuracy:.0%}"
        )
        assert 0.0 <= result.accuracy <= 1.0

# %% [markdown]
# What `python experiments/length_extrapolation.py` measured (the default reverse-task model
# and recipe, 20,000 examples, 4 epochs, 3 seeds; greedy exact match of the final model on 500
# fresh examples per range; medians; 19 minutes on 2 CPU cores shared with other jobs, so an
# upper bound, 2026-12-01; `experiments/results/length_extrapolation.md` has the run):
#
# | encoding | lengths 1–10 | lengths 11–20 |
# |---|---:|---:|
# | sinusoidal | 100.0% | 0.2% |
# | learned | 100.0% | 0.0% |
# | rotary | 100.0% | 7.2% |
# | alibi | 100.0% | 18.0% |
# | t5_relative | 100.0% | 0.0% |
# | sliding_window (window 4) | 52.2% | 2.4% |
#
# Every encoding but the window learns the task, and none carries it far past length 10;
# ALiBi goes furthest, as Press et al. found for language models, but 18% is far from their
# near-lossless extrapolation. Reversal is a hard case: output t must read source position
# L - 1 - t, and the cross-attention has no position bias of its own, so it can only find that
# position through what the encoder wrote there about its distance from the end -- something
# trained for lengths up to 10 only. (Per-seed figures: `experiments/results/`.)
#
# When reading it: the lengths 1–10 column asks whether a model learned the task at all,
# the lengths 11–20 column whether what it learned carries over to positions it never saw.
# A learned absolute table has rows 11–20, but training never updated them; a window of 4
# sees the same neighbourhood at every length.
#
# > **Takeaway.** Length extrapolation is measured by training on lengths 1–10 and testing
# > on 11–20; `experiments/length_extrapolation.py` runs every encoding and prints the table.
#
# ## Exercises
#
# 1. Make ALiBi's slopes learnable: subclass `ALiBi`, turn `slopes` into an `nn.Parameter`,
#    register it under a new name (`mt.plugins.register`, tutorial 4) and check it with
#    `minitensor.testing.check_positional_encoding` and `check_incremental_decoding`. Train
#    it on the reverse task: where do the slopes go?
# 2. From the bucket formula, show that with 32 buckets and `max_distance` 128 the
#    log-spaced bucket $8 + k$ (keys behind) starts at the first distance
#    $\ge 8 \cdot 16^{k/8}$, and compare with the widths printed in section 3. How do the
#    boundaries move with `max_distance=512`? Check with `T5Relative(4, max_distance=512).bucket`.
# 3. Stack causal layers with `sliding_window` (window $w$) and measure, with the gradient
#    as in section 4, how far back the last output reaches after $L$ layers. Does the answer
#    change with the causal mask?
# 4. Time `cached_self_attention` for 512 cached tokens with $g = 8, 2, 1$ (or run
#    `python bench/attention.py`). How much of the gain shows on a CPU?
# 5. Run `python experiments/length_extrapolation.py --encodings alibi,sliding_window --seeds 1`
#    with `sliding_window` windows 2, 4 and 8 (edit `WINDOW`, or train with
#    `minitensor train ... --positional sliding_window --positional-opt window=2`). Which
#    window extrapolates best, and why might a too-small one fail even on lengths 1–10?
#
# ## References
#
# - D2L, Chinese edition 《动手学深度学习》 (zh.d2l.ai): 10.3 注意力评分函数, 10.5 多头注意力,
#   10.6 自注意力和位置编码, 10.7 Transformer. English edition *Dive into Deep Learning*
#   (d2l.ai): 11.3 "Attention Scoring Functions", 11.5 "Multi-Head Attention", 11.6
#   "Self-Attention and Positional Encoding", 11.7 "The Transformer Architecture".
# - Vaswani et al. (2017), "Attention Is All You Need", NeurIPS 2017.
# - Shaw, Uszkoreit and Vaswani (2018), "Self-Attention with Relative Position
#   Representations", NAACL-HLT 2018.
# - Press, Smith and Lewis (2022), "Train Short, Test Long: Attention with Linear Biases
#   Enables Input Length Extrapolation", ICLR 2022.
# - Raffel et al. (2020), "Exploring the Limits of Transfer Learning with a Unified
#   Text-to-Text Transformer", JMLR 21 (2020), section 2.1.
# - Beltagy, Peters and Cohan (2020), "Longformer: The Long-Document Transformer",
#   arXiv:2004.05150; Child, Gray, Radford and Sutskever (2019), "Generating Long Sequences
#   with Sparse Transformers", arXiv:1904.10509.
# - Shazeer (2019), "Fast Transformer Decoding: One Write-Head is All You Need",
#   arXiv:1911.02150.
# - Ainslie, Lee-Thorp, de Jong, Zemlyanskiy, Lebrón and Sanghai (2023), "GQA: Training
#   Generalized Multi-Query Transformer Models from Multi-Head Checkpoints", EMNLP 2023.
# - Martins and Astudillo (2016), "From Softmax to Sparsemax: A Sparse Model of Attention and
#   Multi-Label Classification", ICML 2016.
# - Peters, Niculae and Martins (2019), "Sparse Sequence-to-Sequence Models", ACL 2019.
#
# ## Where this lives in the engine
#
# - `plugins/minitensor_plugins/score_biases.py`: `alibi` (`ALiBi`, `slopes_for`),
#   `t5_relative` (`T5RelativeBias`, `t5_bucket`), `sliding_window` (`SlidingWindow`), and
#   the dense bias built from `relative_bias`.
# - `minitensor/core/nn/attention.py`: `Attention.forward(..., bias=)`, `MultiHeadAttention`
#   (`positional=`, `num_kv_heads=`, `attend`, `cached_self_attention`, `_attend_grouped`).
# - `minitensor/core/nn/transformer.py`: one "scores" encoding per stack, bidirectional in the
#   encoder and unidirectional in the decoder (`attention_positional`; `score_bias_options`
#   in `attention.py`).
# - `plugins/minitensor_plugins/poolings.py`: `sparsemax`, `entmax15`, `alpha_entmax`.
# - `minitensor/testing.py`: `check_positional_encoding`, `check_pooling`,
#   `check_incremental_decoding`.
# - `experiments/length_extrapolation.py`: the experiment of section 8.
