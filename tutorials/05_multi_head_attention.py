# %% [markdown]
# # 5. Multi-head attention
#
# One attention pooling computes one kind of weighted average. Given the same queries, keys
# and values we would like a model to learn *different* behaviours with the same mechanism,
# and to combine them as knowledge, capturing dependencies of various ranges within a
# sequence, short and long (D2L: 捕获序列内各种范围的依赖关系). **Multi-head attention**
# (多头注意力) does this with $h$ independently learned **linear projections** (线性投影) of
# the queries, keys and values; the $h$ projected triples go through attention pooling in
# parallel (并行地送到注意力汇聚中), and the $h$ outputs are concatenated (拼接在一起) and
# transformed once more. Each attention pooling is called a **head** (头).
#
# In this tutorial we build it by hand from the weights of `mt.nn.MultiHeadAttention`, see
# how the heads run in parallel by *reshaping* rather than in a loop, check that D2L's
# "concatenate, then $W_o$" is one and the same linear map as a weighted sum of the heads
# (with matrices as weights), and train a small model on a task that one head can learn too
# but that two heads visibly split between them.
#
# Sources: D2L's attention chapter, in the Chinese edition 《动手学深度学习》 (zh.d2l.ai),
# 10.5 多头注意力, and in the English edition *Dive into Deep Learning* (d2l.ai), 11.5
# "Multi-Head Attention"; Vaswani et al. (2017), "Attention Is All You Need", where
# multi-head attention comes from.

# %%
import math

import numpy
from _tutorial import SMOKE, figure_path, pick, text  # noqa: F401  (shared helpers; text(): figure labels in the tutorial's language)
from matplotlib.figure import Figure

import minitensor as mt
from minitensor.train.plots import show_heatmaps

TUTORIAL = "05_multi_head_attention"
mt.manual_seed(0)

# %% [markdown]
# ## The model
#
# Given a query $\mathbf{q} \in \mathbb{R}^{d_q}$, a key $\mathbf{k} \in \mathbb{R}^{d_k}$ and a
# value $\mathbf{v} \in \mathbb{R}^{d_v}$, head $i$ ($i = 1, \dots, h$) is attention pooling $f$
# applied to its own projections,
#
# $$\mathbf{h}_i = f\left(\mathbf{W}_i^{(q)} \mathbf{q},\; \mathbf{W}_i^{(k)} \mathbf{k},\;
# \mathbf{W}_i^{(v)} \mathbf{v}\right) \in \mathbb{R}^{p_v},$$
#
# with learned $\mathbf{W}_i^{(q)} \in \mathbb{R}^{p_q \times d_q}$,
# $\mathbf{W}_i^{(k)} \in \mathbb{R}^{p_k \times d_k}$, $\mathbf{W}_i^{(v)} \in \mathbb{R}^{p_v \times d_v}$,
# and the output is one more linear map of all heads together,
#
# $$\mathbf{W}_o \begin{bmatrix} \mathbf{h}_1 \\ \vdots \\ \mathbf{h}_h \end{bmatrix} \in \mathbb{R}^{p_o},
# \qquad \mathbf{W}_o \in \mathbb{R}^{p_o \times h p_v}.$$
#
# These are D2L's equations (10.5 / 11.5): vectors are columns and a weight matrix multiplies
# them from the left, so every matrix is (output size) × (input size). The Transformer paper
# writes the same maps on row vectors, $\mathbf{Q} W_i^Q$ and
# $\operatorname{Concat}(\text{head}_1, \dots, \text{head}_h) W^O$ with
# $W_i^Q \in \mathbb{R}^{d_{\text{model}} \times d_k}$ and
# $W^O \in \mathbb{R}^{h d_v \times d_{\text{model}}}$: the transposes, (input size) × (output size).
#
# As pooling $f$ one usually takes scaled dot-product attention (缩放点积注意力, D2L 10.3).
# For whole matrices of queries, keys and values, one per row (the layout of the code's
# tensors too), a column vector's $\mathbf{W} \mathbf{x}$ becomes a row vector's
# $\mathbf{x}^\top \mathbf{W}^\top$, so head $i$ computes
#
# $$\mathbf{Q}_i = \mathbf{Q} \mathbf{W}_i^{(q)\top},\; \mathbf{K}_i = \mathbf{K} \mathbf{W}_i^{(k)\top},\;
# \mathbf{V}_i = \mathbf{V} \mathbf{W}_i^{(v)\top},
# \qquad \mathbf{h}_i = \operatorname{softmax}\left(\frac{\mathbf{Q}_i \mathbf{K}_i^\top}{\sqrt{d}}\right) \mathbf{V}_i ,$$
#
# where $d$ is the size of one head's queries and keys, $p_q = p_k$ (the code divides by
# $\sqrt{\texttt{num\_hiddens} / h}$), and the rows of $\mathbf{h}_i$ are head $i$'s outputs
# $\mathbf{h}_i^\top$, one per query.
#
# D2L's example sizes: $p_o$ = `num_hiddens` = 100 and $h$ = 5 heads, so that each head
# works in $p_q = p_k = p_v = p_o / h = 20$ dimensions; a batch of 2 examples with 4 queries
# and 6 key–value pairs each, of which the first 3 (example 1) and 2 (example 2) are valid.
# `mt.nn.MultiHeadAttention(num_hiddens, num_heads, dropout, scorer="scaled_dot",
# pooling="softmax", bias=False, query_size=None, key_size=None, value_size=None, ...)` is
# called as `attention(queries, keys, values, valid_lens)`, D2L's order, and keeps the last
# weights of every head in `attention.attention_weights`, (batch, num_heads, Q, K).

# %%
num_hiddens, num_heads = 100, 5
batch_size, num_queries, num_kvpairs = 2, 4, 6
attention = mt.nn.MultiHeadAttention(num_hiddens, num_heads, dropout=0.0)
attention.eval()
X = mt.randn(batch_size, num_queries, num_hiddens)  # queries
Y = mt.randn(batch_size, num_kvpairs, num_hiddens)  # keys = values
valid_lens = mt.tensor([3, 2])
output = attention(X, Y, Y, valid_lens)
weights = attention.attention_weights.numpy()
print("output", output.shape, " attention_weights", weights.shape)
assert output.shape == (batch_size, num_queries, num_hiddens)
assert weights.shape == (batch_size, num_heads, num_queries, num_kvpairs)
# valid_lens is shared by the heads: every head of example 0 ignores keys 3.., of example 1 keys 2..
assert (weights[0, :, :, 3:] == 0).all() and (weights[1, :, :, 2:] == 0).all(), "masked keys get weight 0"
assert numpy.allclose(weights.sum(axis=-1), 1.0, atol=1e-6), "each head's rows sum to 1"

# %% [markdown]
# ## h projections in one matrix
#
# The layer holds four `Linear` layers, `W_q`, `W_k`, `W_v`, `W_o`. `mt.nn.Linear` stores its
# weight as PyTorch's `nn.Linear` does, (out_features, in_features), and computes
# $y = x W^\top + b$ on row vectors $x$ (`minitensor/core/nn/linear.py`): the stored matrix is in
# D2L's (output × input) layout, and the transpose in the product is the switch to rows.
# So `W_q.weight`, of shape (num_hiddens, query_size) = (100, 100) (square here: the shape
# alone does not tell the layout), stacks the $h$ matrices
# $\mathbf{W}_i^{(q)} \in \mathbb{R}^{20 \times 100}$ on top of one another. The code counts
# heads from 0: rows $20 i, \dots, 20 i + 19$ are the $\mathbf{W}^{(q)}$ of head $i$ (the
# formula's head $i + 1$), and a row of queries goes through it as `queries @ W_q[rows].T`. Projecting with the whole matrix
# projects for all heads at once. First the slow, literal reading of the formula: a Python
# loop over the heads, each with its own slice of the weights.

# %%
d_head = num_hiddens // num_heads
# Each stored as (out_features, in_features), D2L's layout; a row vector x maps to x @ W.T.
W_q, W_k, W_v, W_o = (layer.weight for layer in (attention.W_q, attention.W_k, attention.W_v, attention.W_o))
print("W_q", W_q.shape, " W_o", W_o.shape, " d_head", d_head)


def one_head(i, queries, keys, values, valid_lens):
    """Head i alone: its slices of W_q, W_k, W_v, then scaled dot-product attention."""
    rows = slice(i * d_head, (i + 1) * d_head)
    Q_i = queries @ W_q[rows].T  # rows are vectors: x W_i^T, (batch, Q, d_head)
    K_i = keys @ W_k[rows].T  # (batch, K, d_head)
    V_i = values @ W_v[rows].T
    scores = Q_i @ K_i.swapaxes(-1, -2) / math.sqrt(d_head)  # (batch, Q, K)
    return mt.masked_softmax(scores, valid_lens) @ V_i  # (batch, Q, d_head)


with mt.no_grad():
    heads_loop = [one_head(i, X, Y, Y, valid_lens) for i in range(num_heads)]
print(len(heads_loop), "heads of shape", heads_loop[0].shape)

# %% [markdown]
# ## Heads in parallel by reshaping
#
# A loop over heads would run $h$ small products one after the other. D2L instead projects
# once, with the full (100, 100) matrices, and *reshapes* so that the heads become extra
# batch entries; then one batched attention computes all heads of all examples together.
# `transpose_qkv` splits the last axis into (num_heads, d_head) and moves the heads next to
# the batch; `transpose_output` undoes it, which places the heads' outputs side by side
# along the last axis: each row is exactly the concatenation, written as a row,
# $[\mathbf{h}_1^\top, \dots, \mathbf{h}_h^\top]$ (D2L's stacked column, transposed).


# %%
def transpose_qkv(X, num_heads):
    """(batch, T, num_hiddens) -> (batch * num_heads, T, num_hiddens / num_heads)."""
    X = X.reshape(X.shape[0], X.shape[1], num_heads, -1)  # (batch, T, num_heads, d_head)
    X = X.permute(0, 2, 1, 3)  # (batch, num_heads, T, d_head)
    return X.reshape(-1, X.shape[2], X.shape[3])  # (batch * num_heads, T, d_head)


def transpose_output(X, num_heads):
    """The reverse of transpose_qkv: (batch * num_heads, T, d_head) -> (batch, T, num_hiddens)."""
    X = X.reshape(-1, num_heads, X.shape[1], X.shape[2])  # (batch, num_heads, T, d_head)
    X = X.permute(0, 2, 1, 3)  # (batch, T, num_heads, d_head)
    return X.reshape(X.shape[0], X.shape[1], -1)  # (batch, T, num_hiddens)


with mt.no_grad():
    projected = X @ W_q.T
    print("X @ W_q^T      ", projected.shape)
    print("transpose_qkv  ", transpose_qkv(projected, num_heads).shape)
    queries = transpose_qkv(X @ W_q.T, num_heads)  # (10, 4, 20)
    keys = transpose_qkv(Y @ W_k.T, num_heads)  # (10, 6, 20)
    values = transpose_qkv(Y @ W_v.T, num_heads)  # (10, 6, 20)
    # Example b's valid length, once for each of its heads: [3, 3, 3, 3, 3, 2, 2, 2, 2, 2]
    lens_per_head = mt.tensor(numpy.repeat(valid_lens.numpy(), num_heads))
    scores = queries @ keys.swapaxes(-1, -2) / math.sqrt(d_head)  # (10, 4, 6)
    heads = mt.masked_softmax(scores, lens_per_head) @ values  # (10, 4, 20): all heads at once
    concat = transpose_output(heads, num_heads)  # (2, 4, 100)
    print("heads          ", heads.shape, "\ntranspose_output", concat.shape)

assert queries.shape == (batch_size * num_heads, num_queries, d_head)
assert keys.shape == values.shape == (batch_size * num_heads, num_kvpairs, d_head)
assert heads.shape == (batch_size * num_heads, num_queries, d_head)
assert concat.shape == (batch_size, num_queries, num_hiddens)
assert numpy.array_equal(transpose_output(transpose_qkv(X, num_heads), num_heads).numpy(), X.numpy()), (
    "transpose_output undoes transpose_qkv"
)
by_head = heads.numpy().reshape(batch_size, num_heads, num_queries, d_head)
for i in range(num_heads):
    assert numpy.allclose(by_head[:, i], heads_loop[i].numpy(), atol=1e-5), f"head {i}: reshaping == looping"

# %% [markdown]
# minitensor's layer does the same, with one difference: it stops at (batch, num_heads, T,
# d_head) instead of folding the heads into the batch axis (`project_and_split`), so the
# scorer and pooling plugins see the heads as an axis of their own; a (batch, Q, K) mask
# then broadcasts over it. The numbers are the same:

# %%
with mt.no_grad():
    split = attention.project_and_split(attention.W_q, X)
print("project_and_split", split.shape)
assert split.shape == (batch_size, num_heads, num_queries, d_head)
assert numpy.allclose(split.numpy().reshape(-1, num_queries, d_head), queries.numpy(), atol=1e-6)

# %% [markdown]
# ## Concatenate, then $W_o$, which is a sum of the heads
#
# The output is $\mathbf{W}_o$ times the concatenation. Cut D2L's
# $\mathbf{W}_o \in \mathbb{R}^{p_o \times h p_v}$ (output × input) into $h$ column blocks
# $\mathbf{W}_o^{(i)} \in \mathbb{R}^{p_o \times p_v}$, one per head; a block matrix times a
# stacked vector is the sum of the blocks times the pieces:
#
# $$\mathbf{W}_o \begin{bmatrix} \mathbf{h}_1 \\ \vdots \\ \mathbf{h}_h \end{bmatrix}
# = \sum_{i=1}^{h} \mathbf{W}_o^{(i)} \mathbf{h}_i .$$
#
# (In the Transformer paper's row layout, $W^O = \mathbf{W}_o^\top \in \mathbb{R}^{h p_v \times p_o}$,
# the same blocks are its $h$ row blocks.) In code, `W_o.weight` is stored (out, in), like
# D2L's $\mathbf{W}_o$, so block $i$ (heads from 0) is `W_o[:, 20 i : 20 i + 20]`; the heads
# are rows, so a head's share of a row of outputs is
# $\mathbf{h}_i^\top \mathbf{W}_o^{(i)\top}$, `head_i @ block.T`.

# %%
with mt.no_grad():
    concat_then_Wo = concat @ W_o.T  # rows: [h_1^T, ..., h_h^T] W_o^T
    sum_over_heads = sum(heads_loop[i] @ W_o[:, i * d_head : (i + 1) * d_head].T for i in range(num_heads))
gap_layer = numpy.abs(concat_then_Wo.numpy() - output.numpy()).max()
gap_sum = numpy.abs(concat_then_Wo.numpy() - sum_over_heads.numpy()).max()
print(f"|concat W_o - MultiHeadAttention| = {gap_layer:.1e}   |concat W_o - sum_i W_o^(i) h_i| = {gap_sum:.1e}")
assert gap_layer < 1e-5, "the by-hand computation reproduces mt.nn.MultiHeadAttention"
assert gap_sum < 1e-5, "concatenation then W_o equals the sum over heads of W_o's column blocks times each head"

# %% [markdown]
# > **A common summary: "the heads are combined by a linear weighting"**
# >
# > A common summary of multi-head attention describes its last step as a linear weighting
# > of the heads' outputs, $f(\mathbf{Q}) = \sum_i \omega_i \mathbf{h}_i$. The definition to go
# > by is D2L's (10.5 / 11.5) and the Transformer paper's (Vaswani et al. 2017, section
# > 3.2.2): concatenate the $h$ outputs and apply one more learned linear projection
# > $\mathbf{W}_o$ (10.5: 将这$h$个注意力汇聚的输出拼接在一起，并且通过另一个可以学习的线性投影进行变换).
# > minitensor implements the concatenation followed by
# > $\mathbf{W}_o$ (`MultiHeadAttention.merge_and_project`): it is one large matrix product,
# > and it is what D2L, PyTorch and the Transformer paper do. The summary describes the
# > *same* linear map, as the identity above shows (and the cell checks to 1e-5), provided
# > each weight $\omega_i$ is read as a matrix, the column block $\mathbf{W}_o^{(i)}$. With scalar
# > $\omega_i$ (or $\mathbf{W}_o^{(i)} = \omega_i I$) the sum would be a strictly smaller model
# > that can only rescale each head, not mix its features into the output's.

# %% [markdown]
# ## What it costs
#
# Each head works in $p_o / h$ dimensions, so the $h$ heads together have exactly the
# parameters of one head of full width: $4\, p_o^2$ weights ($\mathbf{W}_q, \mathbf{W}_k,
# \mathbf{W}_v, \mathbf{W}_o$), whatever $h$ is. More heads cost no parameters, only smaller
# heads.

# %%
for h in (1, 2, 4, 5, 10):
    count = mt.nn.MultiHeadAttention(num_hiddens, h).num_parameters()
    print(f"num_heads={h:2d}: {count:,} parameters")
    assert count == 4 * num_hiddens * num_hiddens, "the parameter count does not depend on num_heads"

# %% [markdown]
# ## What different heads attend to
#
# "Each head may attend to different parts of the input" (每个头都可能会关注输入的不同部分),
# which lets multi-head attention represent more complex functions than a simple weighted
# average (D2L 10.5). A small task shows heads doing so: a sequence of 8 tokens from an
# alphabet of 5; the answer at position $i$ names *both* neighbours, the pair
# $(x_{i-1}, x_{i+1})$ as one of 25 classes (positions wrap around at the ends). One
# self-attention layer sees the tokens through `mt.nn.TransformerEmbedding` with the
# `learned` positional encoding (a plugin, by name; chapter 6 is about positions), and a
# linear layer reads the answer off its output. We train it with 2 heads and, for
# comparison, with 1. The task does not *need* two heads: one head learns it too, and the
# cell checks that. What it shows is how two heads specialise, each taking one neighbour.

# %%
vocab_size, num_steps, width = 5, 8, 16


def make_batch(rng, n):
    x = rng.integers(0, vocab_size, size=(n, num_steps))
    y = numpy.roll(x, 1, axis=1) * vocab_size + numpy.roll(x, -1, axis=1)  # class of (x_{i-1}, x_{i+1})
    return mt.tensor(x), mt.tensor(y)


class NeighbourModel(mt.nn.Module):
    def __init__(self, num_heads):
        super().__init__()
        self.embedding = mt.nn.TransformerEmbedding(vocab_size, width, 0.0, max_len=num_steps, positional="learned")
        self.attention = mt.nn.MultiHeadAttention(width, num_heads, dropout=0.0)
        self.output = mt.nn.Linear(width, vocab_size**2)

    def forward(self, tokens):
        X = self.embedding(tokens)
        return self.output(self.attention(X, X, X))  # self-attention: queries = keys = values


def train(num_heads, steps=400, seed=2):
    mt.manual_seed(seed)
    rng = numpy.random.default_rng(seed)
    model = NeighbourModel(num_heads)
    optimizer = mt.optim.Adam(model.parameters(), lr=0.02)
    losses = []
    for _ in range(steps):
        x, y = make_batch(rng, 64)
        loss = mt.cross_entropy(model(x).reshape(-1, vocab_size**2), y.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return model, losses


def evaluate(model, n):
    x, y = make_batch(numpy.random.default_rng(123), n)
    model.eval()
    with mt.no_grad():
        accuracy = float((model(x).numpy().argmax(axis=-1) == y.numpy()).mean())
    weights = model.attention.attention_weights.numpy()  # (n, num_heads, 8, 8)
    # Average weight each head puts on the previous and on the next position.
    rows = numpy.arange(num_steps)
    prev = weights[:, :, rows, (rows - 1) % num_steps].mean(axis=(0, 2))
    nxt = weights[:, :, rows, (rows + 1) % num_steps].mean(axis=(0, 2))
    return accuracy, prev, nxt, weights


two_heads, losses2 = train(num_heads=2)
one_head_model, losses1 = train(num_heads=1)
num_eval = pick(2000, 200)
acc2, prev2, next2, weights2 = evaluate(two_heads, num_eval)
acc1, prev1, next1, weights1 = evaluate(one_head_model, num_eval)
print(f"2 heads: loss {losses2[0]:.2f} -> {losses2[-1]:.1e}, accuracy {acc2:.1%}")
for i in range(2):
    print(f"   head {i + 1}: weight on x_(i-1) {prev2[i]:.2f}, on x_(i+1) {next2[i]:.2f}")
print(f"1 head:  loss {losses1[0]:.2f} -> {losses1[-1]:.1e}, accuracy {acc1:.1%}")
print(f"   head 1: weight on x_(i-1) {prev1[0]:.2f}, on x_(i+1) {next1[0]:.2f}")

assert losses2[-1] < 0.1 * losses2[0] and acc2 > 0.95, "two heads learn the task"
assert losses1[-1] < 0.1 * losses1[0] and acc1 > 0.95, "one head learns the task too: it does not need two"
# The heads specialise: one looks left, the other right.
left, right = int(prev2.argmax()), int(next2.argmax())
assert left != right, "the two heads must attend to different neighbours"
assert prev2[left] > 0.6 and next2[right] > 0.6, "each head puts most of its weight on its neighbour"
# A single head has to serve both neighbours at once: its weight is split between them.
assert min(prev1[0], next1[0]) > 0.15 and prev1[0] + next1[0] > 0.8, "one head splits its weight"

# %% [markdown]
# A heatmap per head for one sequence (row = query position, column = key position). Head
# 1 and head 2 of the 2-head model each pick one off-diagonal, the neighbour on one side,
# wrapping around at the ends; the lone head of the 1-head model spreads its weight over
# both. It solves the task all the same, by mixing the two neighbours' values with unequal
# weights: with 16 dimensions a single head has room to spare. So two heads are not needed
# here; they divide the work. Whether one head still copes when there are more positions
# to look at is exercise 1.

# %%
tokens = [str(t) for t in make_batch(numpy.random.default_rng(123), 1)[0].numpy()[0]]
panels = numpy.stack([weights2[0, 0], weights2[0, 1], weights1[0, 0]])[None]
show_heatmaps(
    panels,
    xlabel=text("keys (position: token)"),
    ylabel=text("queries"),
    titles=[text("2 heads: head 1"), text("2 heads: head 2"), text("1 head")],
    figsize=(10, 3.8),
    row_labels=[f"{i}:{t}" for i, t in enumerate(tokens)],
    col_labels=[f"{i}:{t}" for i, t in enumerate(tokens)],
    path=figure_path(TUTORIAL, "heads.png"),
)

fig = Figure(figsize=(5.5, 3.2), layout="constrained")
ax = fig.subplots()
ax.plot(losses2, label=text("2 heads"))
ax.plot(losses1, label=text("1 head"))
ax.set(xlabel=text("step"), ylabel=text("cross-entropy"), yscale="log", title=text("training the neighbour task"))
ax.legend()
fig.savefig(figure_path(TUTORIAL, "neighbour_loss.png"), dpi=100)

# %% [markdown]
# ## Exercises
#
# 1. Give the task three positions to look at: the answer at $i$ names
#    $(x_{i-2}, x_{i-1}, x_{i+1})$. How many heads does it take for each head to keep one
#    position, and what happens to a model with fewer heads than positions to look at?
# 2. Replace the concatenation by a *scalar* weighting $\sum_i \omega_i \mathbf{h}_i$
#    (a Module with $h$ scalar parameters, heads of size $p_o$ each so the sum has the
#    output's size). Count its parameters and compare its loss on the neighbour task.
# 3. Give `MultiHeadAttention` a different scorer for the heads (`scorer="additive"`, or
#    your bilinear one from chapter 4). Which parts of this tutorial's by-hand computation
#    would change, and which would not?
#
# ## Where this lives in the engine
#
# - `minitensor/core/nn/attention.py`: `MultiHeadAttention` (`project_and_split`, the attention
#   of all heads at once, `merge_and_project`) and the single-head `Attention` it uses.
# - `plugins/minitensor_plugins/scorers.py` (`scaled_dot`) and
#   `plugins/minitensor_plugins/poolings.py` (`softmax`): the scorer and pooling of each head.
# - `minitensor/core/ops/softmax.py` and `minitensor/core/kernels/`: `mt.masked_softmax` and its
#   numba kernels.
# - `minitensor/core/ops/shape.py`: `reshape` and `permute`, the whole trick of running the heads
#   in parallel.
# - `minitensor/core/nn/transformer.py`: `TransformerEmbedding`;
#   `plugins/minitensor_plugins/positional.py`: the `learned` positional encoding.
# - `minitensor/train/plots.py`: `show_heatmaps`.
