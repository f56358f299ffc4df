# %% [markdown]
# # 6. Self-attention and positional encoding
#
# So far queries, keys and values were given to us. In **self-attention** (自注意力) they are
# all the same sequence: every token asks every other token of its own sequence. That one
# idea turns attention into a layer that maps a sequence to a sequence, like a convolution or
# an RNN, and we measure how it compares with them (time, parallelism, path length) using
# minitensor's `Conv1d`, `GRU` and `MultiHeadAttention`. Self-attention turns out to be
# blind to order, which is what **positional encoding** (位置编码) repairs: the sinusoidal
# encoding of the Transformer, its binary-counter look, the rotation that makes relative
# positions linear, and rotary encoding, a modern variant.
#
# Sources: D2L's attention chapter, in the Chinese edition 《动手学深度学习》 (zh.d2l.ai),
# 10.6 自注意力和位置编码 (and 10.7 Transformer for encoder–decoder attention), and in the
# English edition *Dive into Deep Learning* (d2l.ai), 11.6 "Self-Attention and Positional
# Encoding" (and 11.7 "The Transformer Architecture"); Vaswani et al. (2017), "Attention Is
# All You Need", for the sinusoidal encoding; Su et al. (2021), "RoFormer: Enhanced
# Transformer with Rotary Position Embedding", for rotary encoding.

# %%
import contextlib
import math
import time

import numba
import numpy
from _tutorial import SMOKE, expect_error, figure_path, pick, text  # noqa: F401  (shared helpers; text(): figure labels in the tutorial's language)
from matplotlib.figure import Figure

import minitensor as mt

TUTORIAL = "06_self_attention_and_positional_encoding"
mt.manual_seed(0)

# %% [markdown]
# ## Self-attention
#
# In the attention framework the queries, keys and values may stand for different parts of a
# model. The special case where all three are the same $\mathbf{x}$ is self-attention — in
# D2L's words, 由于查询、键和值来自同一组输入，因此被称为*自注意力* (because the queries,
# keys and values come from the same set of inputs). Given a sequence
# $\mathbf{x}_1, \dots, \mathbf{x}_n$, $\mathbf{x}_i \in \mathbb{R}^d$, each token is a query
# against all tokens as key–value pairs:
#
# $$\mathbf{y}_i = f(\mathbf{x}_i, (\mathbf{x}_1, \mathbf{x}_1), \dots, (\mathbf{x}_n, \mathbf{x}_n)) \in \mathbb{R}^d .$$
#
# It encodes a sequence by itself (D2L: 使用自注意力进行序列编码), without any other queries,
# keys or values taking part: a sequence goes in, a sequence of the same length comes out,
# and only information *within* the sequence is used. Batched, with scaled dot-product pooling and $\mathbf{X} \in
# \mathbb{R}^{n \times d}$ holding the tokens as rows,
#
# $$f(\mathbf{X}) = \operatorname{softmax}\left(\frac{\mathbf{X}\mathbf{X}^\top}{\sqrt{d}}\right)\mathbf{X}.$$
#
# That is `mt.nn.Attention` (one head, `scaled_dot` scorer, `softmax` pooling) called with
# the same tensor three times:

# %%
n, d = 6, 8
X = mt.randn(1, n, d)
plain = mt.nn.Attention("scaled_dot", "softmax", 0.0)
Y = plain(X, X, X)
x = X.numpy()[0]
scores = x @ x.T / math.sqrt(d)
weights = numpy.exp(scores - scores.max(axis=1, keepdims=True))
weights /= weights.sum(axis=1, keepdims=True)
print("self-attention:", X.shape, "->", Y.shape)
assert Y.shape == X.shape, "a sequence in, a sequence of the same shape out"
assert numpy.abs(Y.numpy()[0] - weights @ x).max() < 1e-5, "Attention(X, X, X) = softmax(X X^T / sqrt(d)) X"

# %% [markdown]
# In practice (the Transformer) the tokens first go through learned linear maps, one for
# each role:
#
# $$f(\mathbf{X}) = \operatorname{softmax}\left(\frac{\mathbf{X}\mathbf{W}_Q (\mathbf{X}\mathbf{W}_K)^\top}{\sqrt{d}}\right)\mathbf{X}\mathbf{W}_V .$$
#
# `mt.nn.MultiHeadAttention(X, X, X)` is exactly this with $h$ heads, followed by
# $\mathbf{W}_o$ (chapter 5). With one head and the layer's own weights (stored as (out, in),
# so $\mathbf{X}\mathbf{W}_Q$ is `X @ W_q.weight.T`):

# %%
mha = mt.nn.MultiHeadAttention(d, num_heads=1, dropout=0.0)
W_Q, W_K, W_V, W_O = (layer.weight.numpy().T for layer in (mha.W_q, mha.W_k, mha.W_v, mha.W_o))
Q, K, V = x @ W_Q, x @ W_K, x @ W_V
scores = Q @ K.T / math.sqrt(d)
weights = numpy.exp(scores - scores.max(axis=1, keepdims=True))
weights /= weights.sum(axis=1, keepdims=True)
gap = numpy.abs(mha(X, X, X).numpy()[0] - weights @ V @ W_O).max()
print(f"|MultiHeadAttention(X, X, X) - softmax(X W_Q (X W_K)^T / sqrt(d)) X W_V W_O| = {gap:.1e}")
assert gap < 1e-5

# A common slip puts the transpose on X alone, X W_Q X^T W_K: for n != d the shapes do not
# even fit.
with expect_error("the scores written as X W_Q X^T W_K, with n = 6 tokens of d = 8", ValueError):
    x @ W_Q @ x.T @ W_K  # (n, d) (d, d) (d, n) = (n, n), then (n, n) @ (d, d)

# %% [markdown]
# > **A common slip: where the transpose goes**
# >
# > Self-attention with learned parameters is easily miswritten as
# > $\operatorname{softmax}(\mathbf{X}\mathbf{W}_Q\mathbf{X}^\top\mathbf{W}_K / \sqrt{d})\,\mathbf{X}\mathbf{W}_V$.
# > The transpose belongs to the projected keys, $(\mathbf{X}\mathbf{W}_K)^\top = \mathbf{W}_K^\top \mathbf{X}^\top$:
# > minitensor implements $\operatorname{softmax}(\mathbf{X}\mathbf{W}_Q(\mathbf{X}\mathbf{W}_K)^\top / \sqrt{d})\,\mathbf{X}\mathbf{W}_V$
# > (then $\mathbf{W}_o$), the Transformer's formula, checked above to 1e-5; the miswritten form
# > multiplies an $n \times n$ matrix by a $d \times d$ one, which fails unless $n = d$, and is
# > a different function even then.

# %% [markdown]
# ## Self-attention has no idea of order
#
# Nothing in $f(\mathbf{X})$ refers to positions: the weights depend only on the contents of
# the tokens. Permute the tokens and the outputs come out permuted the same way:
# self-attention is *permutation-equivariant*. In one line: for a permutation matrix
# $\boldsymbol{\Pi}$ the scores $\mathbf{S} = \mathbf{X}\mathbf{W}_Q(\mathbf{X}\mathbf{W}_K)^\top / \sqrt{d}$
# become $\boldsymbol{\Pi}\mathbf{S}\boldsymbol{\Pi}^\top$, a row-wise softmax commutes with
# permuting rows and columns, and $\boldsymbol{\Pi}^\top\boldsymbol{\Pi} = \mathbf{I}$, so
#
# $$f(\boldsymbol{\Pi}\mathbf{X}) = \boldsymbol{\Pi}\operatorname{softmax}(\mathbf{S})\boldsymbol{\Pi}^\top\boldsymbol{\Pi}\mathbf{X}\mathbf{W}_V = \boldsymbol{\Pi} f(\mathbf{X})$$
#
# (and $\mathbf{W}_o$, applied to each row, changes nothing). A token's output depends on what
# the tokens are, never on where they stand: "dog bites man" and "man bites dog" give "dog"
# the same output. The cell checks it on the layer above:

# %%
permutation = numpy.random.default_rng(0).permutation(n)
with mt.no_grad():
    Y = mha(X, X, X).numpy()[0]
    X_perm = mt.tensor(x[permutation][None])
    Y_perm = mha(X_perm, X_perm, X_perm).numpy()[0]
print("permutation", permutation)
assert numpy.abs(Y_perm - Y[permutation]).max() < 1e-5, "permuting the inputs permutes the outputs"

# %% [markdown]
# ## Encoder–decoder attention (cross-attention)
#
# In **encoder–decoder attention** (编码器－解码器注意力, D2L 10.7), usually called
# **cross-attention**, the queries come from one input and the keys and values from a
# second: 查询来自前一个解码器层的输出，而键和值来自整个编码器的输出 (the queries come from
# the previous decoder layer's output, the keys and values from the whole encoder's output).
# The decoder's states ask, the encoder's outputs answer, so the decoder combines the context
# of the source sequence with its own. The
# sequences may differ in length and in width (`key_size`, `value_size`); the weights are
# (batch, num_heads, number of queries, number of keys).

# %%
decoder_states = mt.randn(2, 3, 16)  # 3 target positions, width 16
encoder_outputs = mt.randn(2, 7, 24)  # 7 source positions, width 24
cross = mt.nn.MultiHeadAttention(16, num_heads=4, key_size=24, value_size=24)
out = cross(decoder_states, encoder_outputs, encoder_outputs, valid_lens=mt.tensor([7, 5]))
print("cross-attention:", out.shape, "weights", cross.attention_weights.shape)
assert out.shape == (2, 3, 16) and cross.attention_weights.shape == (2, 4, 3, 7)
assert (cross.attention_weights.numpy()[1, :, :, 5:] == 0).all(), "padding of the source gets no weight"

# %% [markdown]
# ## CNN, RNN and self-attention
#
# All three map a sequence of $n$ tokens to a sequence of $n$ tokens, each with $d$ channels
# in and out. They differ in three ways (D2L 10.6, 比较卷积神经网络、循环神经网络和自注意力 /
# 11.6.2 "Comparing CNNs, RNNs, and Self-Attention"): **computational complexity**
# (计算复杂度), **sequential operations** (顺序操作), which hinder parallel computation, and
# the **maximum path length** (最大路径长度). For each pair of positions, take the length of
# the *shortest* path through the network between them (how many layers, or recurrent steps,
# a signal must cross from one to the other); the maximum path length is the largest of these
# over all pairs. The shorter the paths, the easier long-range dependencies are to learn.
#
# | layer | computational complexity | sequential operations (parallelism) | maximum path length |
# |---|---|---|---|
# | CNN, kernel size $k$ | $O(knd^2)$ | $O(1)$ (parallelism $O(n)$) | $O(n/k)$ |
# | RNN | $O(nd^2)$ | $O(n)$ (parallelism $O(1)$) | $O(n)$ |
# | self-attention | $O(n^2d)$ | $O(1)$ (parallelism $O(n)$) | $O(1)$ |
#
# - **CNN**: each of the $n$ output positions multiplies a window of $k$ positions $\times$ $d$
#   input channels by a $(k d) \times d$ weight ($d$ output channels), $O(knd^2)$; all outputs
#   can be computed independently; two distant tokens meet only after enough stacked layers,
#   each widening the receptive field by about $k$.
# - **RNN**: updating the state multiplies a $d \times d$ matrix by a $d$-vector, $n$ times,
#   $O(nd^2)$; step $t$ needs step $t - 1$, so nothing runs in parallel along the sequence;
#   token 1 reaches token $n$ through $n - 1$ state updates.
# - **Self-attention**: queries, keys and values are $n \times d$; every token scores against
#   every token at cost $d$, $O(n^2 d)$; all outputs are independent; every token sees every
#   other in one layer.
#
# (Counting *parallelism* instead turns the column around: $O(1)$ sequential operations
# leave $O(n)$ work that can run at once, and vice versa. D2L: 顺序操作会妨碍并行计算,
# sequential operations hinder parallel computation.) Let us measure rather than believe. First the forward time against $n$, with $d = 32$ channels: `mt.nn.Conv1d` (kernel
# 3), `mt.nn.GRU` (a gated RNN) and one-head self-attention, each best of a few runs on
# one CPU thread.

# %%
d, batch = 32, 4
lengths = pick([16, 32, 64, 128, 256, 512, 1024], [16, 64, 256])
repeats = pick(7, 3)
conv = mt.nn.Conv1d(d, d, kernel_size=3, padding=1)
gru = mt.nn.GRU(d, d, batch_first=True)
self_attention = mt.nn.MultiHeadAttention(d, num_heads=1)
layers = {
    "CNN (Conv1d, k=3)": lambda X: conv(X.swapaxes(1, 2)).swapaxes(1, 2),  # Conv1d wants (batch, d, n)
    "RNN (GRU)": lambda X: gru(X)[0],
    "self-attention": lambda X: self_attention(X, X, X),
}


def best_time(fn, X, repeats):
    fn(X)  # warm-up: the first call may load the compiled numba kernels
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn(X)
        best = min(best, time.perf_counter() - start)
    return best


@contextlib.contextmanager
def one_thread():
    """Time on one core: the table counts operations and their order, not how well a library
    spreads one operation over cores (and a busy machine makes threaded timings erratic).
    BLAS threads are limited with threadpoolctl when it is installed, numba's directly."""
    try:
        from threadpoolctl import threadpool_limits

        blas = threadpool_limits(limits=1)
    except ImportError:
        blas = contextlib.nullcontext()
    before = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        with blas:
            yield
    finally:
        numba.set_num_threads(before)


times = {name: [] for name in layers}
with mt.no_grad(), one_thread():
    for length in lengths:
        X = mt.randn(batch, length, d)
        for name, fn in layers.items():
            times[name].append(best_time(fn, X, repeats))
print("n      " + "".join(f"{name:>22}" for name in layers))
for i, length in enumerate(lengths):
    print(f"{length:<7}" + "".join(f"{times[name][i] * 1e3:19.2f} ms" for name in layers))
for name in layers:  # the slope of log(time) against log(n) over the longest sequences
    slope = numpy.polyfit(numpy.log(lengths[-3:]), numpy.log(times[name][-3:]), 1)[0]
    print(f"{name}: time ~ n^{slope:.2f} at the largest n")

# %% [markdown]
# Even on one thread the "sequential operations" column shows: the GRU takes $n$ small
# dependent steps one after another (a loop over time, a few small array operations per
# step), while the convolution and attention are a few large array operations over all
# positions at once, which more cores or a GPU could spread out. The convolution stays
# linear in $n$; attention's $n^2 d$ takes over once $n$ is well above $d$. (These are
# timings on a shared machine: the tutorial prints them and asserts nothing about them.)
#
# Now the **path length** between the two ends of the sequence, token 0 and output $n - 1$, the
# pair farthest apart. What it counts depends on the architecture: *layers* for the CNN and
# self-attention, which connect positions by stacking, *time steps* for the RNN, whose single
# layer connects them through its recurrence (the next cell). How many layers must a signal
# from token 0 cross before output $n - 1$ depends on it? We stack layers one at a time and
# ask autograd: is $\partial \mathbf{y}_{n-1} / \partial \mathbf{x}_0$ nonzero yet? For a
# convolution with kernel $k$ (padding keeping the length) each layer reaches $(k - 1)/2$
# positions further, so it takes $\lceil (n-1) / ((k-1)/2) \rceil$ layers, $O(n/k)$;
# self-attention takes one.


# %%
def conv_layer(kernel_size):
    layer = mt.nn.Conv1d(d, d, kernel_size, padding=(kernel_size - 1) // 2)
    return lambda X: layer(X.swapaxes(1, 2)).swapaxes(1, 2).tanh()


def attention_layer():
    layer = mt.nn.MultiHeadAttention(d, num_heads=1)
    return lambda X: layer(X, X, X)


def layers_to_reach(make_layer, n, max_layers):
    """The fewest stacked layers after which output n - 1 depends on input 0 (by gradient)."""
    x = mt.randn(1, n, d, requires_grad=True)
    stack = []
    for num_layers in range(1, max_layers + 1):
        stack.append(make_layer())
        x.grad = None
        y = x
        for layer in stack:
            y = layer(y)
        y[:, n - 1].sum().backward()
        if (x.grad.numpy()[0, 0] != 0).any():
            return num_layers
    return None


mt.manual_seed(1)
path_lengths = pick([8, 16, 32, 64], [8, 16, 32])
reach = {"CNN, k=3": [], "CNN, k=5": [], "self-attention": []}
for length in path_lengths:
    reach["CNN, k=3"].append(layers_to_reach(lambda: conv_layer(3), length, length))
    reach["CNN, k=5"].append(layers_to_reach(lambda: conv_layer(5), length, length))
    reach["self-attention"].append(layers_to_reach(attention_layer, length, 3))
for name, counts in reach.items():
    print(f"{name:15}", dict(zip(path_lengths, counts)))
for length, c3, c5, ca in zip(path_lengths, *reach.values()):
    assert c3 == length - 1, "kernel 3 widens the reach by 1 per layer: n - 1 layers"
    assert c5 == math.ceil((length - 1) / 2), "kernel 5 widens it by 2: ceil((n - 1) / 2) layers"
    assert ca == 1, "one self-attention layer connects every pair of positions"

# %% [markdown]
# The RNN is different again: one GRU layer already connects token 0 to every later output,
# but along a path of $j$ recurrent steps to output $j$, each step multiplying the signal by
# one more Jacobian. The gradient $|\partial \mathbf{y}_j / \partial \mathbf{x}_0|$ after one
# layer of each kind, for $n = 32$:

# %%
mt.manual_seed(2)
n_profile = 32
one_layer = {"CNN (Conv1d, k=3)": conv_layer(3), "RNN (GRU)": lambda X: gru(X)[0], "self-attention": attention_layer()}
profile = {}
x0 = mt.randn(1, n_profile, d, requires_grad=True)
for name, layer in one_layer.items():
    row = []
    for j in range(n_profile):
        x0.grad = None
        layer(x0)[:, j].sum().backward()
        row.append(float(numpy.abs(x0.grad.numpy()[0, 0]).sum()))
    profile[name] = numpy.array(row)
gru_factor = math.exp(numpy.polyfit(numpy.arange(1, n_profile), numpy.log(profile["RNN (GRU)"][1:]), 1)[0])
print(
    f"GRU: the gradient shrinks by a factor {gru_factor:.2f} per step; "
    f"|dy_31/dx_0| / |dy_1/dx_0| = {profile['RNN (GRU)'][-1] / profile['RNN (GRU)'][1]:.1e}"
)
print(
    f"self-attention: |dy_j/dx_0| between {profile['self-attention'][1:].min():.2f} and "
    f"{profile['self-attention'][1:].max():.2f} for every j >= 1"
)
assert (profile["CNN (Conv1d, k=3)"][2:] == 0).all() and (profile["CNN (Conv1d, k=3)"][:2] > 0).all()
assert (profile["RNN (GRU)"] > 0).all(), "one GRU layer reaches every later position ..."
assert profile["RNN (GRU)"][-1] < 1e-3 * profile["RNN (GRU)"][1], "... but through a long path that fades"
assert profile["self-attention"][1:].min() > 0.1 * profile["self-attention"][1:].max(), (
    "attention reaches every position directly, about equally"
)

# %%
fig = Figure(figsize=(14, 4), layout="constrained")
ax_time, ax_path, ax_grad = fig.subplots(1, 3)
for name in layers:
    ax_time.plot(lengths, numpy.array(times[name]) * 1e3, "o-", label=text(name))
ax_time.set(
    xscale="log",
    yscale="log",
    xlabel=text("sequence length n"),
    ylabel=text("forward time (ms)"),
    title=text("time vs n (d = {d}, batch {batch}, 1 thread)", d=d, batch=batch),
)
ax_time.legend()
for name, counts in reach.items():
    ax_path.plot(path_lengths, counts, "o-", label=text("{name}: layers", name=text(name)))
ax_path.plot(
    path_lengths, [length - 1 for length in path_lengths], "k--", label=text("RNN, one layer: n - 1 time steps")
)
ax_path.set(
    xlabel=text("sequence length n"),
    ylabel=text("layers (CNN, self-attention) or\ntime steps (RNN) from x_0 to y_(n-1)"),
    title=text("maximum path length"),
)
ax_path.legend()
for name, row in profile.items():
    js = numpy.flatnonzero(row)
    ax_grad.plot(js, row[js], "o-", markersize=3, label=text(name))
ax_grad.set(
    yscale="log",
    xlabel=text("output position j"),
    ylabel="|dy_j / dx_0|",
    title=text("how far one layer carries x_0"),
)
ax_grad.legend()
fig.savefig(figure_path(TUTORIAL, "cnn_rnn_self_attention.png"), dpi=100)

# %% [markdown]
# To sum up: self-attention treats $\mathbf{x}$ as queries, keys and values to encode a
# sequence; it is fully parallel and its maximum path length is 1, but its cost grows with
# $n^2$, which is heavy for long sequences (D2L: 因为其计算复杂度是关于序列长度的二次方，
# 所以在很长的序列中计算会非常慢).
#
# ## Positional encoding
#
# Self-attention records no position because it is permutation-equivariant, as checked above,
# not because its path length is 1: a path length says how far information must travel
# between two positions, not whether their order is seen (the rotary attention at the end of
# this tutorial has path length 1 too, and sees order). To put positions in without giving up
# its parallel computation, we leave the attention alone and *encode* positions into the
# input: for $\mathbf{X} \in \mathbb{R}^{n \times d}$ compute a matrix
# $\mathbf{P} \in \mathbb{R}^{n \times d}$ of the same shape (D2L: 位置嵌入矩阵, the positional
# embedding matrix) and feed $\mathbf{X} + \mathbf{P}$ to self-attention. $\mathbf{P}$ can be
# learned or fixed (位置编码可以通过学习得到也可以直接固定得到); the Transformer's is fixed,
# made of sines and cosines:
#
# $$p_{i, 2j} = \sin\left(\frac{i}{10000^{2j/d}}\right), \qquad p_{i, 2j+1} = \cos\left(\frac{i}{10000^{2j/d}}\right).$$
#
# Positional encodings are plugins in minitensor (`plugins/minitensor_plugins/positional.py`),
# looked up by name like scorers: `sinusoidal`, `learned`, `rotary`, `none`. An "inputs"
# encoding is called on $\mathbf{X}$ and returns $\mathbf{X} + \mathbf{P}$; its table is the
# buffer `P`. D2L's sizes: $d = 32$, 60 positions.

# %%
Sinusoidal = mt.plugins.lookup("positional encoding", "sinusoidal")
encoding_dim, num_steps = 32, 60
pos_encoding = Sinusoidal(encoding_dim, max_len=num_steps)
X = mt.randn(1, num_steps, encoding_dim)
P = (pos_encoding(X) - X).numpy()[0]  # what the layer adds
i = numpy.arange(num_steps)[:, None]
omega = 1.0 / 10000 ** (numpy.arange(0, encoding_dim, 2) / encoding_dim)  # one frequency per pair j
assert numpy.abs(P[:, 0::2] - numpy.sin(i * omega)).max() < 1e-5, "even columns: sin(i / 10000^(2j/d))"
assert numpy.abs(P[:, 1::2] - numpy.cos(i * omega)).max() < 1e-5, "odd columns: cos(i / 10000^(2j/d))"
print("P:", P.shape, " frequencies omega_j:", numpy.round(omega[:4], 4), "...", f"{omega[-1]:.2e}")

# %% [markdown]
# ## Absolute positions: like a binary counter
#
# This encoding represents both absolute and relative positions. **Absolute position
# information** (绝对位置信息) first, by analogy with binary representation (二进制表示). Write 0 to 7 in binary: the lowest bit flips at every step, the next every two steps, the
# next every four. The encoding does the same with waves: down the columns, the frequency
# $\omega_j = 1/10000^{2j/d}$ falls (在编码维度上降低频率), so the first columns oscillate
# fast and later ones slowly. Being continuous (floats rather than bits), this representation is also more
# economical in space than a binary code.

# %%
for k in range(8):
    print(f"{k} in binary is {k:>03b}")
bits = numpy.array([[(k >> b) & 1 for b in range(3)] for k in range(8)])  # column b = bit b, lowest first
bit_flips = (numpy.diff(bits, axis=0) != 0).sum(axis=0)
sign_changes = (numpy.diff(numpy.sign(P[:, 0::2]), axis=0) != 0).sum(axis=0)  # per sine column
print("flips of bits 0, 1, 2 over 0..7:", bit_flips)
print("sign changes of the sine columns over 60 positions:", sign_changes)
assert list(bit_flips) == [7, 3, 1], "higher bits flip less often"
assert (numpy.diff(sign_changes) <= 0).all() and sign_changes[0] > sign_changes[-1], (
    "higher columns oscillate less often, like higher bits"
)
assert (numpy.diff(omega) < 0).all()

# %%
fig = Figure(figsize=(14, 4), layout="constrained")
ax_heat, ax_cols, ax_bits = fig.subplots(1, 3, gridspec_kw={"width_ratios": [1.2, 1.3, 0.5]})
image = ax_heat.imshow(P, cmap="Blues", aspect="auto")
ax_heat.set(xlabel=text("encoding dimension"), ylabel=text("position i"), title=text("P (sinusoidal, d = 32)"))
fig.colorbar(image, ax=ax_heat)
for col in range(6, 10):
    ax_cols.plot(numpy.arange(num_steps), P[:, col], label=text("col {col}", col=col))
ax_cols.set(xlabel=text("position i"), title=text("columns 6 to 9"))
ax_cols.legend()
ax_bits.imshow(bits, cmap="Blues", aspect="auto")
ax_bits.set(
    xlabel=text("bit (lowest first)"),
    ylabel=text("number"),
    title=text("0..7 in binary"),
    xticks=range(3),
    yticks=range(8),
)
fig.savefig(figure_path(TUTORIAL, "positional_encoding.png"), dpi=100)

# %% [markdown]
# ## Relative positions: a rotation
#
# **Relative position information** (相对位置信息): for any fixed offset $\delta$ (位置偏移),
# the encoding at position $i + \delta$ is a *linear* function of the encoding at $i$, the
# same for every $i$. Take one pair of columns $(2j, 2j+1)$ with frequency $\omega_j$ and write $a = i\omega_j$,
# $b = \delta\omega_j$. The addition theorems
#
# $$\sin(a + b) = \cos b \sin a + \sin b \cos a, \qquad \cos(a + b) = -\sin b \sin a + \cos b \cos a$$
#
# say, in matrix form,
#
# $$\begin{bmatrix} p_{i+\delta, 2j} \\ p_{i+\delta, 2j+1} \end{bmatrix} =
# \begin{bmatrix} \cos(\delta\omega_j) & \sin(\delta\omega_j) \\ -\sin(\delta\omega_j) & \cos(\delta\omega_j) \end{bmatrix}
# \begin{bmatrix} p_{i, 2j} \\ p_{i, 2j+1} \end{bmatrix} .$$
#
# The $2 \times 2$ matrix is a rotation by the angle $-\delta\omega_j$; it depends on $\delta$ and
# $j$ but not on $i$. So a layer can learn "look $\delta$ positions back" once, for all
# positions: a $\mathbf{W}_Q^\top \mathbf{W}_K$ made of these rotations turns the key's
# $\mathbf{p}_j$ into $\mathbf{p}_{j+\delta}$, and the position term of the score,
# $\mathbf{p}_i^\top \mathbf{p}_{j+\delta}$, is largest at $j = i - \delta$ for every query $i$
# (in the score it is one term of four, mixed with the content: tutorial 9 takes that up).
# We check it on the plugin's table for every $j$, every $i$ and many $\delta$:

# %%
worst = 0.0
for j, w in enumerate(omega):
    pair = P[:, 2 * j : 2 * j + 2]  # rows: (p_{i,2j}, p_{i,2j+1})
    for delta in range(1, pick(num_steps, 20)):
        rotation = numpy.array(
            [[math.cos(delta * w), math.sin(delta * w)], [-math.sin(delta * w), math.cos(delta * w)]]
        )
        predicted = pair[:-delta] @ rotation.T  # rotation @ (column vector) for every i at once
        worst = max(worst, float(numpy.abs(pair[delta:] - predicted).max()))
print(f"max |P[i + delta] - R(delta) P[i]| over all j, i, delta: {worst:.1e}")
assert worst < 1e-5, "the encoding at i + delta is the rotation of the encoding at i"

# %% [markdown]
# ## Rotary encoding: relative positions inside the scores
#
# Adding $\mathbf{P}$ to the inputs makes relative positions *available*; the attention scores
# still see absolute ones, mixed with the content through $\mathbf{W}_Q$ and $\mathbf{W}_K$.
# **Rotary position embedding** (RoPE, Su et al. 2021), used by many large language models
# today (LLaMA among them), applies rotations with the same frequencies to the projected
# queries and keys instead of adding anything: the pair $(2j, 2j+1)$ of a query or key at position $m$ is rotated by $m\theta_j$,
# with the sinusoidal frequencies $\theta_j = \omega_j$. Rotations keep lengths and
# $R(m\theta)^\top R(n\theta) = R((n - m)\theta)$, so
#
# $$\langle R(m\theta)\mathbf{q}, R(n\theta)\mathbf{k}\rangle = \mathbf{q}^\top R((n - m)\theta)\,\mathbf{k}:$$
#
# the score depends on the positions only through $n - m$. In minitensor it is the `rotary`
# plugin, a "qk" encoding that `MultiHeadAttention(..., positional="rotary")` applies in
# every head. Put the same query and the same key at every position and compute all scores:
# with rotary they form a Toeplitz matrix (constant along each diagonal, $n - m$ fixed);
# with the sinusoidal encoding added to the inputs they do not.

# %%
Rotary = mt.plugins.lookup("positional encoding", "rotary")
length, head = 16, 8
rope = Rotary(head, max_len=length)
rng = numpy.random.default_rng(0)
q_vec, k_vec = rng.standard_normal(head), rng.standard_normal(head)
q_all = mt.tensor(numpy.tile(q_vec, (length, 1)), dtype=mt.float32)  # the same query at positions 0..15
k_all = mt.tensor(numpy.tile(k_vec, (length, 1)), dtype=mt.float32)
q_rot, k_rot = rope(q_all, k_all)
rotary_scores = q_rot.numpy() @ k_rot.numpy().T  # [m, n] = <R(m theta) q, R(n theta) k>

# The additive alternative: one token x at every position, plus P, then W_Q and W_K.
token = rng.standard_normal(head)
P_small = Sinusoidal(head, max_len=length).P.numpy()
W_Q, W_K = rng.standard_normal((head, head)) / math.sqrt(head), rng.standard_normal((head, head)) / math.sqrt(head)
additive_scores = ((token + P_small) @ W_Q) @ ((token + P_small) @ W_K).T


def off_toeplitz(S):
    """How far S is from constant diagonals: max |S[m+1, n+1] - S[m, n]|."""
    return float(numpy.abs(S[1:, 1:] - S[:-1, :-1]).max())


print(f"rotary:     max |S[m+1, n+1] - S[m, n]| = {off_toeplitz(rotary_scores):.1e}")
print(f"sinusoidal: max |S[m+1, n+1] - S[m, n]| = {off_toeplitz(additive_scores):.2f}")
assert off_toeplitz(rotary_scores) < 1e-5, "rotary scores depend only on n - m"
assert off_toeplitz(additive_scores) > 1e-2, "added positions give scores that depend on m and n themselves"
# The rotation changes only directions, never lengths:
assert numpy.allclose(numpy.linalg.norm(q_rot.numpy(), axis=1), numpy.linalg.norm(q_vec), atol=1e-5)

# With positions inside, self-attention is no longer blind to order:
order_aware = mt.nn.MultiHeadAttention(d, num_heads=4, positional="rotary")
X = mt.randn(1, n, d)
with mt.no_grad():
    Y = order_aware(X, X, X).numpy()[0]
    X_perm = mt.tensor(X.numpy()[0][permutation][None])
    Y_perm = order_aware(X_perm, X_perm, X_perm).numpy()[0]
assert numpy.abs(Y_perm - Y[permutation]).max() > 1e-3, "rotary attention depends on the order"

fig = Figure(figsize=(14, 4), layout="constrained")
ax_rot, ax_add, ax_rel = fig.subplots(1, 3)
for ax, S, title in (
    (ax_rot, rotary_scores, text("rotary: constant diagonals")),
    (ax_add, additive_scores, text("sinusoidal added to the inputs")),
):
    fig.colorbar(ax.imshow(S, cmap="viridis"), ax=ax, shrink=0.8)
    ax.set(xlabel=text("key position n"), ylabel=text("query position m"), title=title)
m_idx, n_idx = numpy.indices((length, length))
ax_rel.plot((n_idx - m_idx).ravel(), additive_scores.ravel(), ".", alpha=0.5, label=text("sinusoidal added"))
ax_rel.plot((n_idx - m_idx).ravel(), rotary_scores.ravel(), "o", markersize=3, label=text("rotary"))
ax_rel.set(xlabel=text("relative position n - m"), ylabel=text("score"), title=text("every score against n - m"))
ax_rel.legend()
fig.savefig(figure_path(TUTORIAL, "rotary_scores.png"), dpi=100)

# %% [markdown]
# ## Exercises
#
# 1. Repeat the path-length measurement with dilated convolutions (`Conv1d(...,
#    dilation=2 ** layer)`, as in WaveNet). How many layers does it take now for $x_0$ to
#    reach $y_{n-1}$, as a function of $n$?
# 2. Show numerically that $\mathbf{p}_i^\top \mathbf{p}_{i+\delta}$ (sinusoidal) depends only on
#    $\delta$, and plot it against $\delta$. Why does that not make the *scores* of the additive
#    version above depend on $n - m$ only?
# 3. Extend the timing to $n = 4096$ and to $d = 128$. Where does self-attention's $n^2 d$
#    cross the GRU's $n d^2$, and how does that agree with the table?
#
# ## Where this lives in the engine
#
# - `minitensor/core/nn/attention.py`: `Attention`, `MultiHeadAttention` (self- and
#   cross-attention, `positional="rotary"` applied to the projected queries and keys).
# - `plugins/minitensor_plugins/positional.py`: `sinusoidal`, `learned`, `rotary`, `none`
#   (the formulas, and the rotation property in `SinusoidalEncoding`'s docstring).
# - `minitensor/core/ops/conv.py` (the convolution as im2col, and its backward) and
#   `minitensor/core/ops/rnn.py` (the GRU's sequential loop with backpropagation through time),
#   the layers `nn.Conv1d` and `nn.GRU` built on them: the comparison's baselines.
# - `minitensor/core/autograd.py`: the backward pass behind every gradient we measured.
# - `minitensor/core/plugins.py`: `lookup`, how an encoding is found by name.
