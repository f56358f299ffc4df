# %% [markdown]
# # 3. Attention scoring functions
#
# Chapter 2 computed attention weights as a softmax of $-\frac12 (q - k_i)^2$. This chapter
# takes that apart: a **scoring function** rates each query–key pair, a **softmax** — masked,
# so that padding is never attended — turns the ratings into weights, and the two classic
# scoring functions that D2L presents are built, checked against their formulas and compared:
# **additive** attention, the scorer of the RNN encoder–decoder where attention began (Bahdanau
# et al. 2015), and **scaled dot-product** attention, the one that the Transformer (Vaswani et
# al. 2017) and nearly every model since use. At the end we pick scorers and poolings by name
# from minitensor's plugin registry.
#
# Sources: D2L's attention chapter, in the Chinese edition 《动手学深度学习》 (zh.d2l.ai),
# 10.3 注意力评分函数, and in the English edition *Dive into Deep Learning* (d2l.ai), 11.3
# "Attention Scoring Functions"; Bahdanau, Cho and Bengio (2015), "Neural Machine Translation
# by Jointly Learning to Align and Translate", for additive attention, and Vaswani et al.
# (2017), "Attention Is All You Need", for the scaled dot product.

# %%
import time

import numpy
from _tutorial import SMOKE, expect_error, figure_path, pick, text  # noqa: F401  (the helpers every tutorial shares)
from matplotlib.figure import Figure  # a Figure without pyplot: no window, no global state

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
# ## Scores and weights
#
# With the Gaussian kernel, attention pooling was
#
# $$f(q) = \sum_i \alpha(q, k_i)\, v_i = \sum_{i=1}^n \mathrm{softmax}\big(-\tfrac12 (q - k_i)^2\big)\, v_i .$$
#
# D2L treats the exponent $-\frac12 (q - k_i)^2$ of the Gaussian kernel as an **attention
# scoring function** (注意力评分函数, 简称评分函数: scoring function for short) $a(q, k)$,
# whose value for one pair we call the **attention score**: an *unnormalised* attention
# weight, any real number, that should say how relevant key $k$ is to query $q$. The softmax
# normalises the scores into **attention weights** (注意力权重), each in $[0, 1]$ and summing
# to 1 over the keys:
#
# $$f\big(q, (k_1, v_1), \ldots, (k_n, v_n)\big) = \sum_{i=1}^{n} \alpha(q, k_i)\, v_i \in \mathbb R^v,$$
#
# $$\alpha(q, k_i) = \mathrm{softmax}\big(a(q, k_i)\big) = \frac{\exp a(q, k_i)}{\sum_{j=1}^{n} \exp a(q, k_j)} \in \mathbb R .$$
#
# Different attention mechanisms differ in $a$. In minitensor a scoring function is a
# **scorer** plugin and the normalisation a **pooling** plugin; an `mt.nn.Attention` layer
# holds one of each (`layer.scorer`, `layer.pooling`) and keeps the last weights in
# `layer.attention_weights`. Here is the Gaussian score of chapter 2 on three queries and five
# keys, scores and weights side by side:

# %%
gauss = mt.nn.Attention(scorer="gaussian", pooling="softmax", dropout=0.0, query_size=1, key_size=1)
q = mt.tensor([[0.0], [1.0], [2.5]])  # 3 queries of size 1
k = mt.tensor([[0.0], [0.5], [1.0], [2.0], [4.0]])  # 5 keys
v = mt.tensor([[0.0], [1.0], [2.0], [3.0], [4.0]])  # 5 values
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
# ## Masked softmax
#
# Sequences in a minibatch have different lengths and are padded to one length; the padding
# tokens are keys nobody should attend to. D2L's **masked softmax** (掩蔽softmax操作) takes,
# beside the scores, the **valid lengths** `valid_lens` (有效长度, a number of tokens per
# sequence): query $i$ of example $b$ may see only the first `valid_lens[b]` keys
# (shape `(batch,)`), or the first `valid_lens[b, i]` (shape `(batch, Q)`). Masked keys get
# weight **exactly** 0, the rest a softmax among themselves. `mt.masked_softmax(scores,
# valid_lens)` runs it on a fused numba kernel; D2L's two examples:

# %%
scores = mt.rand(2, 2, 4)
for valid_lens in ([2, 3], [[1, 3], [2, 4]]):
    masked = mt.masked_softmax(scores, mt.tensor(valid_lens))
    print(f"valid_lens = {valid_lens}:\n{masked.numpy().round(4)}")
    lens = numpy.broadcast_to(numpy.array(valid_lens).reshape(2, -1), (2, 2))  # one length per row
    beyond = numpy.arange(4) >= lens[..., None]  # (2, 2, 4): True past the valid length
    assert (masked.numpy()[beyond] == 0.0).all(), "masked keys get weight exactly zero"
    assert numpy.allclose(masked.numpy().sum(axis=-1), 1.0, atol=1e-6), "valid keys share all the weight"

# %% [markdown]
# ### A query with nothing to see
#
# What if a row has **no** valid key (`valid_lens` 0: an example made only of padding, or a
# query that a mask forbids everything)? The formula divides $0$ by $0$, and the three usual
# implementations disagree:
#
# - the naive one sets masked scores to $-\infty$ and runs a softmax: the row's maximum is
#   $-\infty$, $-\infty - (-\infty)$ is NaN, and the **NaN** spreads to the output, the loss
#   and, after one optimiser step, to every parameter (`torch.softmax` of a row of `-inf`s
#   is NaN, so a `-inf` mask in PyTorch does this);
# - D2L sets masked scores to $-10^6$ instead: the row's scores are all equal, and the
#   softmax makes them **uniform** — the query attends to padding, silently;
# - minitensor returns **all-zero weights**: the query takes nothing from any value, its
#   output is the zero vector, and no gradient flows through it.
#
# Zero is the only one of the three that says "nothing was attended". Compare them on one
# example with a per-query `valid_lens` of $(6, 4, 2, 0)$:

# %%
scores = rng.standard_normal((1, 4, 6)).astype(numpy.float32)
valid_lens = numpy.array([[6, 4, 2, 0]])
allowed = numpy.arange(6) < valid_lens[..., None]  # (1, 4, 6)
values = rng.standard_normal((1, 6, 3)).astype(numpy.float32)

with numpy.errstate(invalid="ignore"):  # -inf - (-inf): NumPy warns, then returns NaN
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
# The backward pass agrees: through minitensor's masked softmax the masked scores, and the
# whole fully masked row, receive a gradient of exactly 0 — finite, so training goes on.

# %%
x = mt.tensor(scores, requires_grad=True)
out = mt.masked_softmax(x, mt.tensor(valid_lens)) @ mt.tensor(values)
(out * out).sum().backward()
grad = x.grad.numpy()
assert numpy.isfinite(grad).all(), "no NaN in the gradient"
assert (grad[~allowed] == 0.0).all(), "masked scores get no gradient"

# %% [markdown]
# ## Additive attention
#
# When queries and keys are vectors of **different lengths**, a natural scoring function is
# **additive attention** (加性注意力, Bahdanau et al. 2015). For $\mathbf q \in \mathbb R^q$ and
# $\mathbf k \in \mathbb R^k$,
#
# $$a(\mathbf q, \mathbf k) = \mathbf w_v^\top \tanh(\mathbf W_q \mathbf q + \mathbf W_k \mathbf k) \in \mathbb R,$$
#
# with learnable $\mathbf W_q \in \mathbb R^{h \times q}$, $\mathbf W_k \in \mathbb R^{h \times k}$
# and $\mathbf w_v \in \mathbb R^h$. Both vectors are projected into a common $h$-dimensional
# space, added, squashed and read out: this is the same as feeding the concatenation
# $[\mathbf q; \mathbf k]$ into an MLP with **one hidden layer** of $h$ tanh units and one
# output, no biases (D2L: 将查询和键连结起来后输入到一个多层感知机（MLP）中，感知机包含一个隐藏层).
#
# D2L's example: a batch of 2, one query of length 20 each, ten keys of length 2 (all ones),
# values $0, 1, \ldots, 39$ in ten rows of 4, valid lengths 2 and 6, $h = 8$. The scorer is the
# plugin `additive`, with its option `num_hiddens`.

# %%
queries = mt.randn(2, 1, 20)
keys = mt.ones(2, 10, 2)
values = mt.tensor(numpy.tile(numpy.arange(40, dtype=numpy.float32).reshape(1, 10, 4), (2, 1, 1)))
valid_lens = mt.tensor([2, 6])

additive = mt.nn.Attention(
    "additive", "softmax", dropout=0.1, query_size=20, key_size=2, scorer_options={"num_hiddens": 8}
)
additive.eval()  # no dropout on the weights when we look at them
with mt.no_grad():
    out = additive(queries, keys, values, valid_lens)
print("output shape:", out.shape)  # (batch, number of queries, value size)
weights = additive.attention_weights.numpy()  # (2, 1, 10)
assert out.shape == (2, 1, 4)
# All keys are equal, so every valid key scores the same: uniform over 2 and over 6 keys.
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
# Check the formula, and the MLP reading of it, against the layer's own parameters
# (`nn.Linear` stores $W$ as (out, in), as PyTorch does):

# %%
scorer = additive.scorer
W_q, W_k = scorer.W_q.weight.numpy(), scorer.W_k.weight.numpy()  # (8, 20), (8, 2)
w_v = scorer.w_v.weight.numpy()[0]  # (8,)
qs, ks = rng.standard_normal((3, 20)).astype(numpy.float32), rng.standard_normal((5, 2)).astype(numpy.float32)
with mt.no_grad():
    a = scorer(mt.tensor(qs), mt.tensor(ks)).numpy()  # (3, 5)
by_formula = numpy.array([[w_v @ numpy.tanh(W_q @ qi + W_k @ kj) for kj in ks] for qi in qs])
W = numpy.concatenate([W_q, W_k], axis=1)  # the hidden layer of an MLP on [q; k]
by_mlp = numpy.array([[w_v @ numpy.tanh(W @ numpy.concatenate([qi, kj])) for kj in ks] for qi in qs])
assert numpy.allclose(a, by_formula, atol=1e-5), "a(q, k) = w_v^T tanh(W_q q + W_k k)"
assert numpy.allclose(a, by_mlp, atol=1e-5), "= a one-hidden-layer MLP on the concatenation [q; k]"

# %% [markdown]
# ## Scaled dot-product attention
#
# When queries and keys have the **same length** $d$, their dot product is a cheaper score:
# one multiplication per feature, no parameters. If the entries of $\mathbf q$ and
# $\mathbf k$ are independent with mean 0 and variance 1, then $\mathbf q^\top \mathbf k$ is a
# sum of $d$ such products and has mean 0 and variance $d$; dividing by $\sqrt d$ keeps the
# variance at 1 whatever $d$ is. That is **scaled dot-product attention**
# (缩放点积注意力):
#
# $$a(\mathbf q, \mathbf k) = \frac{\langle \mathbf q, \mathbf k \rangle}{\sqrt d} .$$
#
# Batched over $n$ queries $\mathbf Q \in \mathbb R^{n \times d}$, $m$ keys
# $\mathbf K \in \mathbb R^{m \times d}$ and their values $\mathbf V \in \mathbb R^{m \times v}$:
#
# $$f(\mathbf Q) = \mathrm{softmax}\Big(\frac{\mathbf Q \mathbf K^\top}{\sqrt d}\Big) \mathbf V \in \mathbb R^{n \times v}.$$
#
# The plugin is `scaled_dot` (and `dot`, without the $\sqrt d$). First the formula, by hand:

# %%
d = 16
Qs, Ks = mt.randn(2, 3, d), mt.randn(2, 7, d)
scaled = mt.nn.Attention("scaled_dot", "softmax", dropout=0.0)
with mt.no_grad():
    s = scaled.scorer(Qs, Ks).numpy()  # (2, 3, 7)
by_hand = numpy.einsum("bqd,bkd->bqk", Qs.numpy(), Ks.numpy()) / numpy.sqrt(d)
assert numpy.abs(s - by_hand).max() < 1e-5, "scaled_dot score = q.k / sqrt(d)"

# %% [markdown]
# D2L's example with it: queries of length 2, the same ten keys of ones, valid lengths 2 and 6
# — the weights are again uniform over the valid keys.

# %%
with mt.no_grad():
    out = scaled(mt.randn(2, 1, 2), mt.ones(2, 10, 2), values, valid_lens)
weights = scaled.attention_weights.numpy()
assert out.shape == (2, 1, 4)
assert numpy.allclose(weights[0, 0, :2], 1 / 2) and numpy.allclose(weights[1, 0, :6], 1 / 6)
assert (weights[0, 0, 2:] == 0).all() and (weights[1, 0, 6:] == 0).all(), "masked weights are exactly zero"

# %% [markdown]
# ### Why divide by $\sqrt d$
#
# Measure it: many random query–key pairs with unit-variance entries, at several $d$. The
# variance of the plain dot product grows like $d$; the scaled one stays near 1.

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
# Why it matters: large scores push the softmax into saturation. With $d = 256$ and ten keys,
# unscaled scores have a standard deviation of 16; the softmax puts nearly all the weight on
# one key, and its gradient — $\alpha_j (g_j - \sum_k g_k \alpha_k)$, which vanishes as
# $\alpha$ becomes one-hot — nearly stops. Scaled, the weights stay spread out and the
# gradient alive.

# %%
d, num_keys, rows = 256, 10, pick(2_000, 500)
q_big, k_big = mt.randn(rows, 1, d), mt.randn(rows, num_keys, d)
raw = (q_big @ k_big.swapaxes(-1, -2)).detach()
peak, grad_size = {}, {}
for name, score in (("unscaled", raw), ("scaled", raw * (1.0 / numpy.sqrt(d)))):
    score = score.detach().requires_grad_()
    w = mt.softmax(score)
    (w * mt.randn(rows, 1, num_keys)).sum().backward()  # a random upstream gradient
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
# ## Which one when
#
# - **Queries and keys of different lengths**: additive attention; its $\mathbf W_q$ and
#   $\mathbf W_k$ bring both into one space. A dot product is not even defined, and the
#   `scaled_dot` plugin says so:

# %%
with expect_error("scaled_dot with queries of length 20 and keys of length 2", ValueError):
    mt.nn.Attention("scaled_dot", "softmax", 0.0, query_size=20, key_size=2)

# %% [markdown]
# - **Queries and keys of one length**: the (scaled) dot product. It has no parameters and, for
#   $n$ queries and $m$ keys, is one matrix product $\mathbf Q \mathbf K^\top$ — $O(nmd)$
#   multiply-adds that BLAS runs at full speed. Additive attention first builds an
#   $(n, m, h)$ tensor of $\tanh(\mathbf W_q \mathbf q_i + \mathbf W_k \mathbf k_j)$ and then
#   reduces it: $O(nmh)$ `tanh`s and as many floats of memory, in slower elementwise code.
#
# Measured here (forward and backward of one layer, self-attention on a batch of 4 with
# $d = h = 32$; the best of a few runs — timings on a shared machine vary, so nothing is
# asserted about them):


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
# bench/README.md's table tells the same story at the scale of a whole Transformer: trained on the
# date task, `additive` takes over twice as long as `scaled_dot` for the same steps. That is
# why Transformers use scaled dot products — their queries and keys are projections of one
# width anyway (chapter 5) — while additive attention lives on in recurrent models whose
# decoder state and encoder outputs may differ in size (D2L's Bahdanau decoder of 10.4
# Bahdanau 注意力 / 11.4 "The Bahdanau Attention Mechanism", `minitensor/core/nn/seq2seq.py`).

# %% [markdown]
# > **Common slips, and which version the code implements**
# >
# > - *Shapes.* A common slip in the batched formula is to give the values as many rows as the
# >   queries, $\mathbf V \in \mathbb R^{n \times v}$. Values pair with keys, so
# >   $\mathbf V \in \mathbb R^{m \times v}$ (as D2L writes it), and it is the *output* that
# >   has one row per query, $n \times v$. Likewise the softmax's sum runs over the same $m$
# >   keys as the weighted sum of the values.
# > - *Names.* Papers and notes write the scoring function as $a(q, k)$ (D2L), $s(q, k)$ or
# >   $\mathrm{score}(q, k)$; they are the same thing, minitensor's *scorer*.
# > - *Fully masked rows.* D2L's `masked_softmax` fills masked scores with $-10^6$, which gives
# >   a row without valid keys uniform weights; minitensor gives it zeros (see above) — never
# >   uniform, never NaN — because only zeros mean "attend to nothing", in the output and in
# >   the gradient. Rows with at least one valid key get D2L's weights exactly.

# %% [markdown]
# ## Scorers and poolings by name
#
# Every scorer and pooling above was chosen by a *name*; the names come from minitensor's
# plugin registry, filled by the built-in plugins (`plugins/minitensor_plugins/`) exactly as a
# plugin of your own would fill it (chapter 4 writes one). The registry can be listed:

# %%
for row in mt.plugins.describe():
    if row["kind"] in ("scorer", "pooling"):
        print(f"{row['name']:<20} {row['kind']:<8} {row['source']:<10} {row['class']}")
assert {"dot", "scaled_dot", "additive", "gaussian", "parametric_gaussian", "kernel"} <= set(mt.plugins.scorers())
assert {"softmax", "average", "sparsemax"} <= set(mt.plugins.poolings())

# %% [markdown]
# A misspelt name is an error that lists what there is and suggests the closest (the typo
# below is deliberate):

# %%
with expect_error("the scorer name 'scaled_dott' (misspelt)", KeyError) as caught:
    mt.nn.Attention("scaled_dott")
assert "did you mean 'scaled_dot'" in str(caught.error)

# %% [markdown]
# Every built-in scorer on the same six queries and eight keys of size 8 (the last two keys
# masked out by `valid_lens`), each followed by a softmax. The scores differ in scale and in
# what they reward — a large inner product (`dot`, `scaled_dot`), a small angle (`cosine`),
# closeness (`gaussian`, `parametric_gaussian`, `kernel`, `l2`), or whatever a small MLP learns
# (`additive`, here untrained) — but in every panel the masked keys get nothing and each row
# sums to 1.

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
# The poolings are swapped the same way. On one set of `scaled_dot` scores: `softmax`;
# `sparsemax` (Martins & Astudillo 2016, a modern variant), the projection of the scores onto
# the probability simplex, which gives low-scoring keys weight *exactly* 0; and `average`, the
# query-blind baseline of chapters 1 and 2.

# %%
panels = []
for pooling in ("softmax", "sparsemax", "average"):
    layer = mt.nn.Attention("scaled_dot", pooling, 0.0)
    with mt.no_grad():
        layer(Qn * 3.0, Kn, Vn, valid_lens=[6])  # sharper scores, so that sparsemax has keys to drop
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
# The same names work in `mt.nn.MultiHeadAttention(..., scorer="additive")` (chapter 5), in the
# Transformer (chapter 7) and on the command line, `minitensor train --scorer additive`.
#
# ## Summary
#
# - An attention score $a(q, k)$ is any real number; the softmax turns the scores of one query
#   into attention weights.
# - The masked softmax gives keys beyond `valid_lens` weight exactly 0, and a query with no
#   valid key all-zero weights: not NaN, not uniform.
# - Additive attention, $\mathbf w_v^\top \tanh(\mathbf W_q \mathbf q + \mathbf W_k \mathbf k)$,
#   works for queries and keys of different lengths; it is a one-hidden-layer MLP, and the
#   scorer of the RNN encoder–decoder where attention began (Bahdanau et al. 2015).
# - Scaled dot-product attention, $\mathbf q^\top \mathbf k / \sqrt d$, needs one length and is
#   one matrix product; the $\sqrt d$ keeps the scores' variance at 1 and the softmax out of
#   saturation. It is the scorer of the Transformer and of nearly every model since.

# %% [markdown]
# ## Exercises
#
# 1. Give the additive scorer of the D2L example keys that differ (`mt.randn(2, 10, 2)`
#    instead of ones). Are the weights still uniform? Train `w_v`, `W_q`, `W_k` so that the
#    query attends to the key nearest to $(1, 1)$.
# 2. Show that with $\mathbf W_q = \mathbf W_k$ and queries and keys of one length, additive
#    attention is *not* a function of $\mathbf q^\top \mathbf k$ alone. Which of the two can
#    express "attend to keys far from the query"?
# 3. Scaled dot products assume unit-variance entries. Repeat the variance measurement with
#    entries of variance 4. What scale would keep the scores at variance 1? (Chapter 7's
#    layer norm is one answer.)
#
# ## Where this lives in the engine
#
# - `plugins/minitensor_plugins/scorers.py` — `dot`, `scaled_dot`, `additive`, `gaussian`,
#   `parametric_gaussian`, `kernel`, `cosine`, `l2`.
# - `plugins/minitensor_plugins/poolings.py` — `softmax`, `sparsemax`, `average`, `entmax15`,
#   `alpha_entmax` (tutorial 9), and `allowed_keys` (valid_lens and masks).
# - `minitensor/core/ops/softmax.py` — `masked_softmax` and its backward; `minitensor/core/kernels/cpu.py`
#   — the fused numba kernel that gives a fully masked row zeros.
# - `minitensor/core/nn/attention.py` — the `Attention` layer: scorer, pooling, dropout, weighted sum.
# - `minitensor/core/plugins.py` — the registry: `scorers()`, `poolings()`, `lookup()`, `describe()`.
