# %% [markdown]
# # 10. FlashAttention from the softmax you know
#
# Every attention layer so far computed its weights the way D2L does: the scores of all
# queries against all keys, a (Q, K) matrix per head, turned into weights by the masked
# softmax of tutorial 3 and multiplied by the values. D2L 10.6 / 11.6 counts the cost of a
# self-attention over $n$ tokens as $O(n^2 d)$ operations; on long sequences what runs out
# first is memory, for the $n \times n$ matrix of weights per head. At 2048 tokens and 8
# heads a single float32 copy of it is 128 MiB per example, and training keeps more than
# one copy until the backward pass.
#
# **FlashAttention** computes exactly the same output without ever holding that matrix. It
# is no approximation and no new architecture: it is an identity about the softmax — the
# **online softmax** — that lets the keys be visited one block at a time with a few numbers
# per query row, plus the observation that the backward pass can recompute the weights it
# needs from one number per row, the **log-sum-exp**. This tutorial derives the identity on
# a 2 x 6 example by hand, measures the memory it saves, walks through minitensor's
# implementation (`minitensor/core/ops/flash_attention.py`) and its backward, shows how
# `MultiHeadAttention` decides when to stream, and ends by training the character language
# model on 2048-character windows.
#
# Sources: D2L's attention chapter, in the Chinese edition 《动手学深度学习》 (zh.d2l.ai),
# 10.3 注意力评分函数 (the masked softmax), 10.6 自注意力和位置编码 (计算复杂度: the cost of
# self-attention, quadratic in the sequence length) and 10.7 Transformer (the decoder's
# causal mask), and in the English edition *Dive into Deep Learning* (d2l.ai), 11.3
# "Attention Scoring Functions", 11.6 "Self-Attention and Positional Encoding" and 11.7 "The
# Transformer Architecture"; the language model is that of 8.3 语言模型和数据集 / 9.3
# "Language Models". The book always builds the whole matrix; the streamed computation comes
# from papers, listed at the end: Milakov and Gimelshein (2018) for the online softmax, Rabe
# and Staats (2021) for attention in memory linear in the sequence, Dao et al. (2022) for
# FlashAttention and Dao (2023) for FlashAttention-2's loop order.

# %%
import dataclasses
import math
import pathlib
import tempfile
import time
import tracemalloc

import minitensor.nn.functional as F
import numpy
from _tutorial import SMOKE, expect_error, figure_path, pick, text  # noqa: F401  (shared helpers; text: figure labels)
from matplotlib.figure import Figure
from minitensor.nn.attention import FUSED_MIN_LENGTH, plain_attention
from minitensor.ops.flash_attention import BLOCK_K, BLOCK_Q, flash_attention, stream_plan

import minitensor as mt
from minitensor.data import unigram_baseline
from minitensor.train import TrainConfig, train
from minitensor.train.config import build_data, build_model

TUTORIAL = "10_flash_attention"
mt.manual_seed(0)
rng = numpy.random.default_rng(0)
MiB = 2**20
print("smoke mode" if SMOKE else "full mode")

# %% [markdown]
# ## 1. The softmax, one block of keys at a time
#
# Tutorial 3 wrote the weights of one query as a masked softmax of its scores
# $s_1, \dots, s_n$ (a key the query may not see has $s_j = -\infty$, so its weight
# $e^{-\infty} = 0$):
#
# $$\alpha_j = \frac{e^{s_j - m}}{\ell}, \qquad m = \max_j s_j, \qquad \ell = \sum_j e^{s_j - m}, \qquad
# \mathbf{o} = \sum_j \alpha_j \mathbf{v}_j = \frac{1}{\ell} \sum_j e^{s_j - m}\, \mathbf{v}_j .$$
#
# Subtracting the row's maximum $m$ changes nothing mathematically and keeps every
# exponential at most 1, so nothing overflows (D2L explains this shift, and the LogSumExp
# trick built on it, in 3.7 softmax回归的简洁实现 / 4.5 "Concise Implementation of Softmax
# Regression"). But it seems to need the whole row first: $m$ is a maximum over all keys.
# The **online softmax** (Milakov and Gimelshein 2018) removes that need. Read the keys in
# blocks, and keep for the row only three things: the largest score
# seen so far $m$, the sum $\ell = \sum e^{s_j - m}$ over the keys seen, and the
# *unnormalised* output $\mathbf{o} = \sum e^{s_j - m} \mathbf{v}_j$ over the same keys.
# When a new block arrives, the maximum may grow to $m'$, and every term already summed
# must be re-expressed against $m'$ — which is one multiplication, because
# $e^{s_j - m} \cdot e^{m - m'} = e^{s_j - m'}$:
#
# $$m' = \max\big(m, \max_{j \in \text{block}} s_j\big), \qquad
# \ell' = \ell\, e^{m - m'} + \sum_{j \in \text{block}} e^{s_j - m'}, \qquad
# \mathbf{o}' = \mathbf{o}\, e^{m - m'} + \sum_{j \in \text{block}} e^{s_j - m'} \mathbf{v}_j .$$
#
# After the last block, $\mathbf{o} / \ell$ *is* the softmax-weighted sum, exactly (every
# term carries the same factor $e^{-m}$, which the division cancels), and
# $\text{lse} = m + \log \ell = \log \sum_j e^{s_j}$, the **log-sum-exp** of the row, is the
# one number from which any weight can be recomputed later: $\alpha_j = e^{s_j - \text{lse}}$.
#
# By hand, on two queries and six keys in two blocks of three; query 0 may not see key 4
# (its highest score, so the mask matters):

# %%
S = numpy.array(
    [
        [1.0, 3.0, 2.0, 0.5, 4.0, 1.5],  # query 0
        [2.0, 0.0, 1.0, 3.0, 1.0, 2.5],  # query 1
    ]
)
allowed = numpy.ones_like(S, dtype=bool)
allowed[0, 4] = False  # query 0 may not attend key 4
V = numpy.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [2.0, 0.0], [0.0, 2.0], [1.0, -1.0]])  # 6 values of size 2


def online_softmax(S, allowed, V, blocks, show=True):
    """softmax(S masked) @ V, reading the keys block by block: the running max m, sum l and output o."""
    s_all = numpy.where(allowed, S, -numpy.inf)
    m = numpy.full(len(S), -numpy.inf)  # the largest score seen so far
    l = numpy.zeros(len(S))  # sum of exp(s - m) over the keys seen
    o = numpy.zeros((len(S), V.shape[1]))  # sum of exp(s - m) v over the keys seen
    for j0, j1 in blocks:
        s = s_all[:, j0:j1]
        m_new = numpy.maximum(m, s.max(axis=1))
        shift = numpy.where(m_new == -numpy.inf, 0.0, m_new)  # a row with nothing seen yet: shift by 0
        p = numpy.exp(s - shift[:, None])
        rescale = numpy.exp(m - shift)  # exp(m - m'): how much the old sums shrink
        l = l * rescale + p.sum(axis=1)
        o = o * rescale[:, None] + p @ V[j0:j1]
        m = m_new
        if show:
            print(f"after keys {j0}..{j1 - 1}: m = {m}, rescale = {rescale.round(4)}, l = {l.round(4)}")
            print(f"{'':20}o = {o.round(4).tolist()}")
    seen = l > 0
    out = o / numpy.where(seen, l, 1.0)[:, None]  # a row that saw no key keeps o = 0
    lse = numpy.where(seen, m + numpy.log(numpy.where(seen, l, 1.0)), numpy.inf)
    return out, lse


out, lse = online_softmax(S, allowed, V, blocks=[(0, 3), (3, 6)])
reference = mt.masked_softmax(mt.tensor(S), mask=mt.tensor(allowed)).numpy() @ V
print("o / l          =", out.round(6).tolist())
print("softmax(S) @ V =", reference.round(6).tolist())
log_sum_exp = numpy.log(numpy.where(allowed, numpy.exp(S), 0.0).sum(axis=1))  # log sum_j e^(s_j), allowed keys only
print("m + log l      =", lse.round(6).tolist(), "  log sum_j e^(s_j):", log_sum_exp.round(6).tolist())
assert numpy.abs(out - reference).max() < 1e-12, "the online softmax is the softmax, exactly"
assert numpy.abs(lse - log_sum_exp).max() < 1e-12, "lse = m + log l = log sum_j e^(s_j)"
weights = numpy.where(allowed, numpy.exp(S - lse[:, None]), 0.0)
assert numpy.allclose(weights, mt.masked_softmax(mt.tensor(S), mask=mt.tensor(allowed)).numpy(), atol=1e-12), (
    "any weight comes back from its score and the row's lse: alpha_j = exp(s_j - lse)"
)
one_block, _ = online_softmax(S, allowed, V, blocks=[(0, 6)], show=False)
per_key, _ = online_softmax(S, allowed, V, blocks=[(j, j + 1) for j in range(6)], show=False)
assert numpy.abs(one_block - reference).max() < 1e-12 and numpy.abs(per_key - reference).max() < 1e-12, (
    "any split into blocks gives the same result: one block of 6, or 6 blocks of 1"
)

# %% [markdown]
# Read the second block of query 0: its maximum stays 3 (key 4's score 4 is masked), so the
# rescale is 1; for query 1 the maximum grows from 2 to 3 and the old sums are multiplied by
# $e^{2 - 3} \approx 0.368$ before the new terms are added. (In the first block the rescale
# is $e^{-\infty - m'} = 0$: there is nothing old to keep.)
#
# ### A row with nothing to see
#
# Tutorial 3 insisted that a query with no key left gets all-zero weights, never NaN. The
# online softmax must keep that promise *mid-row* as well: a row whose first blocks are all
# masked has $m = -\infty$, and the textbook shift $s_j - m = -\infty - (-\infty)$ is NaN.
# Hence the one line above that is not in the formulas: when $m' = -\infty$, shift by 0
# instead, so that every $e^{s_j - 0} = e^{-\infty} = 0$, and when a finite maximum arrives
# later, $e^{m - m'} = e^{-\infty} = 0$ wipes the (zero) old sums cleanly. A row that never
# sees a key ends with $\ell = 0$ and $\mathbf{o} = \mathbf{0}$: the output is zeros. Its
# log-sum-exp is mathematically $\log 0 = -\infty$; the implementation stores **$+\infty$**
# instead, so that the backward pass's $e^{s_j - \text{lse}}$ is $e^{-\infty - \infty} = 0$
# rather than $e^{-\infty + \infty}$ = NaN.
#
# `flash_attention(q, k, v, ...)` computes scores as $\text{scale} \cdot \mathbf{q}^\top \mathbf{k}$;
# with the keys the identity matrix and scale 1, the scores are the rows of $\mathbf{q}$
# itself, so it can run on our hand-made scores. A third query that may see nothing:

# %%
S3 = numpy.vstack([S, [[0.5, 1.0, 2.0, 1.0, 0.0, 3.0]]])
allowed3 = numpy.vstack([allowed, numpy.zeros((1, 6), dtype=bool)])  # query 2 may attend no key
with numpy.errstate(invalid="ignore"):
    naive = numpy.exp(numpy.full(6, -numpy.inf) - numpy.max(numpy.full(6, -numpy.inf)))  # the textbook shift
print("query 2 with the textbook shift s - m:", naive)
assert numpy.isnan(naive).all(), "-inf - (-inf) is NaN"

out3, lse3 = online_softmax(S3, allowed3, V, blocks=[(0, 3), (3, 6)], show=False)
fused3, fused_lse3 = flash_attention(
    mt.tensor(S3[None, None]),  # queries: the scores themselves ...
    mt.tensor(numpy.eye(6)[None, None]),  # ... against the identity keys
    mt.tensor(V[None, None]),
    mask=mt.tensor(allowed3),
    scale=1.0,
    block_q=2,
    block_k=3,  # two blocks of three keys, as by hand
    return_lse=True,
)
print("streamed output:", fused3.numpy()[0, 0].round(6).tolist())
print("streamed lse:   ", fused_lse3.numpy()[0, 0])
assert (out3[2] == 0).all() and lse3[2] == numpy.inf, "no key: a zero output and lse = +inf"
assert not numpy.isnan(fused3.numpy()).any(), "never NaN"
assert numpy.abs(fused3.numpy()[0, 0] - out3).max() < 1e-12 and numpy.array_equal(fused_lse3.numpy()[0, 0], lse3)
reference3 = mt.masked_softmax(mt.tensor(S3), mask=mt.tensor(allowed3)).numpy() @ V  # tutorial 3's zero row
assert numpy.abs(fused3.numpy()[0, 0] - reference3).max() < 1e-12

# %% [markdown]
# > **Takeaway.** The softmax of a row can be computed block by block with a running
# > maximum $m$, a running sum $\ell$ and an unnormalised output $\mathbf{o}$, each old sum
# > rescaled by $e^{m - m'}$ when the maximum grows; $\mathbf{o}/\ell$ is the exact answer, and
# > $m + \log \ell$ remembers the row. A row with no key shifts by 0, ends as zeros and gets
# > lse $= +\infty$.
#
# ## 2. What the (T, T) matrices cost, measured
#
# The block loop never needs more than one tile of scores — a block of queries against a
# block of keys — at a time, so its memory should grow with $T$, not $T^2$. We measure it:
# one causal self-attention, forward and backward, of batch 1 with 8 heads of size 64 in
# float32, by the plain layer, `mt.nn.Attention("scaled_dot", "softmax")(q, k, v,
# causal=True)` (scores, masked softmax, weights @ values: (batch, heads, T, T) arrays, kept
# by the graph for backward), and by `flash_attention(q, k, v, causal=True)` (tiles of
# `BLOCK_Q` x `BLOCK_K` = 256 x 256).
#
# Peak memory comes from Python's `tracemalloc`: NumPy reports every array it allocates to
# it (the arrays minitensor's numba kernels return are counted as well), so the peak of
# what was allocated after `tracemalloc.start()` is the largest amount of new array memory
# alive at once during the forward and backward passes — the inputs, made before, are not
# counted — measured in the process itself. Times are the best of two runs without `tracemalloc` (in smoke mode, the
# one run with it) on a CPU that may be busy with other work: read them as orders of
# magnitude.

# %%
HEADS, D_HEAD = pick(8, 2), pick(64, 16)
LENGTHS = pick([256, 512, 1024, 2048], [256, 512, 1024])
plain_layer = mt.nn.Attention("scaled_dot", "softmax")


def plain_causal(q, k, v):
    return plain_layer(q, k, v, causal=True)


def fused_causal(q, k, v):
    return flash_attention(q, k, v, causal=True)


def forward_backward(attend, T):
    """One causal self-attention of batch 1, forward and backward: (peak bytes, seconds)."""
    q, k, v = (mt.randn(1, HEADS, T, D_HEAD, requires_grad=True) for _ in range(3))
    G = mt.randn(1, HEADS, T, D_HEAD)  # the gradient arriving at the output
    tracemalloc.start()  # from here on, every new array is counted
    start = time.perf_counter()
    (attend(q, k, v) * G).sum().backward()
    times = [time.perf_counter() - start]
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    for _ in range(pick(2, 0)):  # timed again without tracemalloc, which slows Python down: the best run counts
        q.grad = k.grad = v.grad = None
        start = time.perf_counter()
        (attend(q, k, v) * G).sum().backward()
        times.append(time.perf_counter() - start)
    return peak, min(times)


for attend in (plain_causal, fused_causal):  # warm-up: numba compiles (or loads) its kernels on first use
    q, k, v = (mt.randn(1, HEADS, 512, D_HEAD, requires_grad=True) for _ in range(3))
    attend(q, k, v).sum().backward()
memory = {"plain": [], "fused": []}
seconds = {"plain": [], "fused": []}
print(f"batch 1, {HEADS} heads of size {D_HEAD}, float32, causal, forward + backward")
print("     T | one (T,T) array |  plain peak |  fused peak | plain/fused |  plain time |  fused time")
for T in LENGTHS:
    for name, attend in (("plain", plain_causal), ("fused", fused_causal)):
        peak, secs = forward_backward(attend, T)
        memory[name].append(peak)
        seconds[name].append(secs)
    array = HEADS * T * T * 4  # one (batch, heads, T, T) float32 array
    print(
        f"{T:>6} | {array / MiB:>11.1f} MiB | {memory['plain'][-1] / MiB:>7.1f} MiB | "
        f"{memory['fused'][-1] / MiB:>7.1f} MiB | {memory['plain'][-1] / memory['fused'][-1]:>10.1f}x | "
        f"{seconds['plain'][-1] * 1e3:>8.0f} ms | {seconds['fused'][-1] * 1e3:>8.0f} ms"
    )
    assert memory["plain"][-1] > 2 * array, "the plain path holds the scores and the weights at once, and more"
array = HEADS * LENGTHS[-1] ** 2 * 4
print(f"at T = {LENGTHS[-1]} the plain peak is {memory['plain'][-1] / array:.1f} (T, T) arrays")
assert memory["fused"][-1] < array, "the streamed path never holds even one (T, T) array"
growth_plain = memory["plain"][-1] / memory["plain"][-2]
growth_fused = memory["fused"][-1] / memory["fused"][-2]
print(f"doubling T from {LENGTHS[-2]} to {LENGTHS[-1]}: plain peak x{growth_plain:.2f}, fused peak x{growth_fused:.2f}")
assert growth_plain > 3.0 and growth_fused < 2.5, "quadratic (x4 per doubling) against linear (x2)"

# %% [markdown]
# The plain path's peak is several $(T, T)$ arrays: the product $QK^\top$, the scaled
# scores and the weights all stay alive until backward (the graph keeps every operation's
# inputs, and the softmax its output), and backward then makes the gradients of the
# weights and of the scores, of the same size. Each
# doubling of $T$ multiplies it by 4. The streamed path holds $Q$, $K$, $V$, the output,
# their gradients and one number per row (all linear in $T$) plus a few tiles of
# 256 x 256 per head, whatever $T$ is; its peak grows at most linearly with $T$ (at short
# lengths the fixed cost of the tiles dominates, and it grows even less).
#
# Time is a different story. The streamed path skips the tiles above the causal diagonal
# (almost half the work), but it computes the scores twice (again in backward) and runs
# many small products from a Python loop, where the plain path runs a few large ones that
# NumPy's BLAS handles efficiently; which is faster on a CPU depends on $T$ and on the
# machine. On a GPU, where FlashAttention was born, the gain in time comes from keeping a tile in the
# chip's fast on-chip memory (SRAM) instead of writing (T, T) arrays to the GPU's main
# memory and reading them back: its high-bandwidth memory (HBM), which is not on the chip but
# stacked beside it on the package, far larger than SRAM but with about a tenth of its
# bandwidth (on an A100, 1.5–2.0 TB/s against about 19 TB/s: Dao et al. 2022, sections 2.1
# and 3; D2L 12.4 / 13.4 on GPU memory); NumPy cannot express that, so here
# the lesson is memory. `python bench/long_attention.py` measures both paths (and PyTorch)
# with more care: interleaved samples and a fresh process per memory figure.
#
# > **Takeaway.** Measured, plain attention's peak memory grows as $T^2$ (several
# > score-sized arrays kept for backward) and the streamed one's as $T$: at 2048 tokens and 8
# > heads that is hundreds of MiB against a few dozen.
#
# ## 3. The loop, tile by tile
#
# Here is the whole forward pass for one head in NumPy, queries in blocks (the outer loop)
# and keys in blocks (the inner loop), with the causal mask and the tiles it leaves empty
# skipped. It is the online softmax of section 1, run for a block of query rows at once:


# %%
def streamed_attention(q, k, v, block=4, causal=False):
    """softmax(q k^T / sqrt(d)) v for one head, q (Q, d), k and v (K, d): (output, lse).
    causal: query i sees keys j <= i (queries and keys at the same positions)."""
    Q, d = q.shape
    out, lse = numpy.zeros((Q, v.shape[1])), numpy.full(Q, numpy.inf)
    for i0 in range(0, Q, block):
        qi = q[i0 : i0 + block] / math.sqrt(d)  # a block of queries, scaled once
        i = numpy.arange(i0, i0 + len(qi))[:, None]  # their positions
        m, l, o = numpy.full(len(qi), -numpy.inf), numpy.zeros(len(qi)), numpy.zeros((len(qi), v.shape[1]))
        for j0 in range(0, len(k), block):
            if causal and j0 > i[-1, 0]:
                continue  # every key of this tile is in every query's future: skip it
            j = numpy.arange(j0, min(j0 + block, len(k)))  # a block of keys
            s = qi @ k[j].T  # the tile's scores
            if causal:
                s = numpy.where(j <= i, s, -numpy.inf)
            m_new = numpy.maximum(m, s.max(axis=1))
            shift = numpy.where(m_new == -numpy.inf, 0.0, m_new)
            p = numpy.exp(s - shift[:, None])
            rescale = numpy.exp(m - shift)
            l, o, m = l * rescale + p.sum(axis=1), o * rescale[:, None] + p @ v[j], m_new
        seen = l > 0
        out[i0 : i0 + len(qi)] = o / numpy.where(seen, l, 1.0)[:, None]
        lse[i0 : i0 + len(qi)] = numpy.where(seen, m + numpy.log(numpy.where(seen, l, 1.0)), numpy.inf)
    return out, lse


T, d = 10, 3  # 10 positions in blocks of 4: three blocks, the last one partial
q, k, v, dO = (rng.standard_normal((T, d)) for _ in range(4))
ours, ours_lse = streamed_attention(q, k, v, block=4, causal=True)
Q4, K4, V4 = (mt.tensor(x[None, None], requires_grad=True) for x in (q, k, v))  # (batch 1, head 1, T, d), float64
fused_out, fused_lse = flash_attention(Q4, K4, V4, causal=True, block_q=4, block_k=4, return_lse=True)
plain64 = mt.nn.Attention("scaled_dot", "softmax", dtype=mt.float64)
Q4p, K4p, V4p = (mt.tensor(x[None, None], requires_grad=True) for x in (q, k, v))
plain_out = plain64(Q4p, K4p, V4p, causal=True)
print("largest difference, our loop vs flash_attention:", numpy.abs(ours - fused_out.numpy()[0, 0]).max())
print("largest difference, our loop vs the plain layer:", numpy.abs(ours - plain_out.numpy()[0, 0]).max())
assert numpy.abs(ours - fused_out.numpy()[0, 0]).max() < 1e-10, "our loop computes what flash_attention computes"
assert numpy.abs(ours_lse - fused_lse.numpy()[0, 0]).max() < 1e-10
assert numpy.abs(ours - plain_out.numpy()[0, 0]).max() < 1e-10, "... and what the plain softmax path computes"

# %% [markdown]
# `flash_attention` (`FlashAttention.forward`) is this loop with the batch and the heads
# as leading axes of every array, so each tile is one batched matrix product; the masks,
# biases and skipping rules live in a `StreamPlan` (`plan.scores(...)` builds a tile's
# scores, `plan.visits(...)` decides whether a tile runs). Two details differ: the queries
# are multiplied by the scale once for the whole call, and the elementwise steps between
# the tile's two matrix products (maximum, shift, exponential, sum) work in place on the
# tile's scores, so a tile costs one (block, block) array per head.
#
# ### Backward: recompute, don't store
#
# The plain path's backward reads the weights $P$ it kept. The streamed one kept only
# $O$ and the lse of each row, and recomputes each tile's weights from them,
# $P_{ij} = e^{s_{ij} - \text{lse}_i}$ (that is what lse is for). With $dO$ the gradient
# arriving at the output, the chain rule through $O = PV$ and the softmax gives
#
# $$dV = P^\top dO, \qquad dP = dO\, V^\top, \qquad dS_{ij} = P_{ij}\,(dP_{ij} - D_i), \qquad
# D_i = \sum_j P_{ij}\, dP_{ij} = \sum_c dO_{ic}\, O_{ic},$$
#
# $$dQ = \text{scale}\cdot dS\, K, \qquad dK = \text{scale}\cdot dS^\top Q .$$
#
# The softmax's backward needs $D_i = \sum_j P_{ij} dP_{ij}$, a sum over a whole row of
# keys — which would need the row again. The last equality (Dao et al. 2022, appendix B)
# avoids it: $\sum_j P_{ij} (dO_i \cdot v_j) = dO_i \cdot \sum_j P_{ij} v_j = dO_i \cdot O_i$, one
# number per row computed from the saved output before the loop. Each tile then needs only
# its own $P$, $dP$ and the row's $D$. The loop orders are those of FlashAttention-2 (Dao
# 2023): the forward pass runs query blocks outside (as above: a block's $m$, $\ell$ and
# $\mathbf{o}$ stay local until it is finished, where the first FlashAttention ran key
# blocks outside and updated the output in memory for every block), it saves the one
# number lse instead of both $m$ and $\ell$, and the backward pass runs key blocks
# outside and query blocks inside, so that $dK$ and $dV$ of a key block accumulate in
# place while $dQ$ collects a contribution from every key block. Here the formulas on whole
# matrices, with $P$ from lse, against the gradients of `flash_attention` and of the plain
# layer:

# %%
(fused_out * mt.tensor(dO[None, None])).sum().backward()
(plain_out * mt.tensor(dO[None, None])).sum().backward()
scale = 1 / math.sqrt(d)
i, j = numpy.indices((T, T))
s = numpy.where(j <= i, q @ k.T * scale, -numpy.inf)
P = numpy.exp(s - ours_lse[:, None])  # the weights, recomputed from lse
dP = dO @ v.T
D = (dO * ours).sum(axis=1)
assert numpy.allclose(D, (P * dP).sum(axis=1), atol=1e-12), "D_i = sum_j P_ij dP_ij = dO_i . O_i"
dS = P * (dP - D[:, None])
by_hand = {"dQ": scale * dS @ k, "dK": scale * dS.T @ q, "dV": P.T @ dO}
for name, fused_leaf, plain_leaf in (("dQ", Q4, Q4p), ("dK", K4, K4p), ("dV", V4, V4p)):
    fused_grad, plain_grad = fused_leaf.grad.numpy()[0, 0], plain_leaf.grad.numpy()[0, 0]
    print(
        f"{name}: formulas vs flash_attention {numpy.abs(by_hand[name] - fused_grad).max():.1e}, "
        f"flash_attention vs plain {numpy.abs(fused_grad - plain_grad).max():.1e}"
    )
    assert numpy.abs(by_hand[name] - fused_grad).max() < 1e-10 and numpy.abs(fused_grad - plain_grad).max() < 1e-10

# %% [markdown]
# Agreement with the plain path is one check; `mt.gradcheck` (tutorial 8) is an independent
# one, against finite differences, and it needs no second implementation. Below it checks
# the gradients of queries, keys, values *and* a relative-bias table (section "Biases and
# grouped heads" below) through tiles of 2 x 2, with grouped heads and the causal mask:


# %%
def leaf(*shape):
    """A random float64 tensor that requires grad."""
    return mt.tensor(rng.standard_normal(shape), requires_grad=True)


Tg = 5
assert mt.gradcheck(
    lambda q, k, v, table: flash_attention(q, k, v, causal=True, relative_bias=table, block_q=2, block_k=2),
    [leaf(1, 4, Tg, 3), leaf(1, 2, Tg, 3), leaf(1, 2, Tg, 3), leaf(4, 2 * Tg - 1)],
)
print("gradcheck: queries, keys, values and the bias table of flash_attention pass")

# %% [markdown]
# ### The tiles that never run
#
# A causal mask leaves every tile whose first key lies after its last query empty: the
# loop above skips it (`continue`) and so does `flash_attention`, in forward and backward
# (`StreamPlan.visits`). With $n$ blocks along each axis, $n(n+1)/2$ of the $n^2$ tiles run
# — 36 of 64 for 2048 tokens in blocks of 256, a little more than half the work of the full
# matrix. A sliding window (tutorial 9) leaves a band: with a window of 256 keys, each row
# of tiles runs two. The plans below are built for 2048 positions and never computed
# (`stream_plan` only checks the shapes and records the masks):

# %%
Tt = 2048
tiny = mt.zeros(1, 1, Tt, 1)  # only the shapes matter to a plan
SlidingWindow = mt.plugins.lookup("positional encoding", "sliding_window")
window_table = SlidingWindow(1, window=256).relative_bias(-(Tt - 1), Tt - 1)  # 0 within 256 positions, -inf beyond
plans = {
    "causal": stream_plan(tiny, tiny, tiny, causal=True),
    "causal, window 256": stream_plan(tiny, tiny, tiny, causal=True, relative_bias=window_table, window=256),
}
grids = {}
for name, plan in plans.items():
    grids[name] = numpy.array(
        [[plan.visits(i0, i1, j0, j1) for j0, j1 in plan.key_blocks()] for i0, i1 in plan.query_blocks()]
    )
n = Tt // BLOCK_Q
print(f"tiles of {BLOCK_Q} queries (rows) x {BLOCK_K} keys (columns), # = computed, . = skipped")
for row in range(n):
    print("   ".join("".join("#" if x else "." for x in grid[row]) for grid in grids.values()))
for name, grid in grids.items():
    print(f"{name}: {grid.sum()} of {grid.size} tiles run")
assert grids["causal"].sum() == n * (n + 1) // 2 and (grids["causal"] == numpy.tri(n, dtype=bool)).all()
assert grids["causal, window 256"].sum() == n + (n - 1), "the diagonal tiles and the ones just below them"

# %% [markdown]
# ### Biases and grouped heads
#
# Tutorial 9's relative score biases stream too, without ever being a $(Q, K)$ matrix. A
# bias that depends only on the distance $j - i$ has $Q + K - 1$ distinct values per head:
# `relative_bias(min_distance, max_distance)` returns them as a (heads, Q + K - 1) table,
# and each tile reads its cells from it, $B_{h,i,j} = \text{table}[h, (j - i) + (Q - 1)]$
# (for queries and keys both starting at position 0). Its gradient, when the table is
# learned (T5's buckets), is accumulated per distance in backward. Grouped-query heads
# (tutorial 9, section 5) need no copies either: the $r$ query heads sharing a key/value head
# are stacked into one block of $r \cdot n$ queries, so a tile is still one product with the
# group's keys. Both against the plain layer with its dense bias and repeated keys:

# %%
ALiBi = mt.plugins.lookup("positional encoding", "alibi")
Tb, H, g = 12, 4, 2  # 4 query heads sharing 2 key/value heads
alibi = ALiBi(H, dtype=mt.float64)
table = alibi.relative_bias(-(Tb - 1), Tb - 1)  # (4, 23): one column per distance -11 .. 11
dense = alibi(Tb, Tb)  # (4, 12, 12): what the plain path adds to the scores
i, j = numpy.indices((Tb, Tb))
assert numpy.array_equal(dense.numpy(), table.numpy()[:, j - i + Tb - 1]), (
    "the dense bias is the table, read by distance"
)
qg, kg, vg = leaf(2, H, Tb, 8), leaf(2, g, Tb, 8), leaf(2, g, Tb, 8)
streamed = flash_attention(qg, kg, vg, causal=True, relative_bias=table, block_q=4, block_k=4)
repeated = [x.unsqueeze(2).expand(2, g, H // g, Tb, 8).reshape(2, H, Tb, 8) for x in (kg, vg)]  # head h reads h // 2
plain = plain64(qg, *repeated, causal=True, bias=dense)
print(
    f"ALiBi table {tuple(table.shape)} instead of a bias {tuple(dense.shape)}; grouped heads: q {tuple(qg.shape)}, "
    f"k {tuple(kg.shape)}; largest difference to the plain layer {numpy.abs(streamed.numpy() - plain.numpy()).max():.1e}"
)
assert numpy.abs(streamed.numpy() - plain.numpy()).max() < 1e-10

# %% [markdown]
# > **Takeaway.** The forward pass is two loops around the online softmax; the backward
# > pass recomputes each tile's weights from lse and needs one more number per row,
# > $D_i = dO_i \cdot O_i$. Empty tiles are skipped, relative biases enter as a table of
# > $Q + K - 1$ values per head and grouped heads as stacked query blocks: nothing of size
# > $Q \times K$ is ever built.
#
# ## 4. Weights on demand
#
# A streamed layer has no weights to show: `attention_weights`, which tutorials 5 to 9
# drew as heatmaps, is None after a streamed call. What it kept — the projected queries and
# keys and the lse of every row — is enough to recompute any weight, so
# `MultiHeadAttention.attention_weights_for(heads, rows)` returns the weights of the heads
# and query rows asked for, (batch, len(heads), len(rows), K), computing only the tiles of
# the query blocks that hold those rows. A heatmap of a few rows of a long sequence costs a
# few blocks of rows, not the whole matrix.
#
# Two twins, one streaming (`fused=True`) and one plain (`fused=False`), with the same
# weights (`load_state_dict`), on a causal self-attention with ALiBi:

# %%
Tw, hidden = pick(1024, 300), 64
streaming = mt.nn.MultiHeadAttention(hidden, 4, positional="alibi", fused=True).eval()
twin = mt.nn.MultiHeadAttention(hidden, 4, positional="alibi", fused=False).eval()
twin.load_state_dict(streaming.state_dict())
X = mt.randn(1, Tw, hidden)
with mt.no_grad():
    out_streamed = streaming(X, X, X, causal=True)
    out_plain = twin(X, X, X, causal=True)
assert numpy.abs(out_streamed.numpy() - out_plain.numpy()).max() < 1e-5, "the same layer, float32 rounding apart"
assert streaming.attention_weights is None and twin.attention_weights is not None
heads, rows = [0, 3], [0, Tw // 2, Tw - 1]
recomputed = streaming.attention_weights_for(heads=heads, rows=rows).numpy()
kept = twin.attention_weights.numpy()[:, heads][:, :, rows]
print(
    f"streamed layer: attention_weights = {streaming.attention_weights}; attention_weights_for(heads={heads}, "
    f"rows={rows}) -> {recomputed.shape}"
)
print(f"largest difference to the plain twin's kept weights: {numpy.abs(recomputed - kept).max():.1e}")
assert numpy.abs(recomputed - kept).max() < 1e-6
assert numpy.allclose(recomputed.sum(axis=-1), 1.0, atol=1e-5), "each recomputed row is a distribution"
assert (recomputed[0, :, 0, 1:] == 0).all(), "row 0 sees only key 0: causal"
band = list(range(Tw - 48, Tw))  # the last 48 queries, for the figure
last_rows = streaming.attention_weights_for(heads=heads, rows=band).numpy()[0][:, :, Tw - 48 :]
with plain_attention(streaming), mt.no_grad():  # the shortcut: the same layer, for one pass, on the plain path
    streaming(X, X, X, causal=True)
assert streaming.attention_weights is not None and streaming.fused is True, "full weights kept; the setting is back"
assert numpy.abs(streaming.attention_weights.numpy()[:, heads][:, :, rows] - recomputed).max() < 1e-6

# %% [markdown]
# `minitensor.nn.attention.plain_attention(model)`, used in the last lines, switches every
# `MultiHeadAttention` of a model to the plain path for the length of a `with` block: the
# way to draw the full heatmaps of a pass that would stream (the training run's own
# figures do this). The figure of this tutorial: the memory measured in section 2, and the
# recomputed weights of the last 48 queries in two heads (indices 0 and 3 in the code; the
# titles number heads from 1, as tutorial 9 and the library's figures do), each with its own
# colour scale — ALiBi's steepest head looks at its nearest keys, its shallowest almost evenly at all.

# %%
fig = Figure(figsize=(13, 3.8), layout="constrained")
ax_memory, *ax_heads = fig.subplots(1, 3, gridspec_kw={"width_ratios": [1.3, 1, 1]})
lengths = numpy.array(LENGTHS)
for name, style in (("plain", "o-"), ("fused", "s-")):
    ax_memory.loglog(lengths, numpy.array(memory[name]) / MiB, style, base=2, label=text(f"{name} (measured)"))
ax_memory.loglog(lengths, HEADS * lengths**2 * 4 / MiB, "k:", base=2, label=text("one (T, T) array"))
ax_memory.set(
    xlabel=text("sequence length T"),
    ylabel=text("peak memory (MiB)"),
    title=text("causal, forward + backward, {heads} heads", heads=HEADS),
)
ax_memory.legend()
slopes = streaming.positional.slopes.numpy()
for ax, h, w in zip(ax_heads, heads, last_rows):
    image = ax.imshow(w, cmap="Reds", extent=(Tw - 48.5, Tw - 0.5, Tw - 0.5, Tw - 48.5))
    ax.set(
        xlabel=text("key position"),
        ylabel=text("query position"),
        title=text("head {h} (ALiBi slope 1/{inverse:.0f})", h=h + 1, inverse=1 / slopes[h]),
    )
    fig.colorbar(image, ax=ax, shrink=0.8)
fig.suptitle(text("streamed attention: memory linear in T; weights recomputed on demand from lse (last 48 queries)"))
fig.savefig(figure_path(TUTORIAL, "flash_attention.png"), dpi=100)
print("wrote", figure_path(TUTORIAL, "flash_attention.png"))

# %% [markdown]
# > **Takeaway.** A streamed layer keeps no weights, but it keeps what makes them cheap to
# > recompute: `attention_weights_for(heads, rows)` gives the rows you want to look at, equal
# > to the plain path's, and `plain_attention(model)` gives the full matrices for one pass.
#
# ## 5. When a layer streams: `fused="auto"` and `why_not_fused`
#
# `MultiHeadAttention(..., fused=...)` takes three values. `False`: always the plain path.
# `True`: always stream, and an error at once if this layer cannot. `"auto"`, the default:
# stream when it is exact and worth it — the queries and the keys both at least
# `FUSED_MIN_LENGTH` = 384 long (below that the plain path's few large array operations beat
# the tile loop), and nothing in the layer that needs the weights themselves.
# `layer.why_not_fused()` says in a sentence what stands in the way, or None. The streamed
# computation computes scores as $\text{scale} \cdot \mathbf{q}^\top\mathbf{k}$ and pools
# them with the softmax, so it needs the scorer `dot` or `scaled_dot`, the pooling
# `softmax`, and a score bias that is relative (a table by distance).

# %%
layer = mt.nn.MultiHeadAttention(32, 4).eval()  # fused="auto"
for length in (16, FUSED_MIN_LENGTH):
    with mt.no_grad():
        Xl = mt.randn(1, length, 32)
        layer(Xl, Xl, Xl)
    path = "plain (weights kept)" if layer.attention_weights is not None else "streamed (no weights kept)"
    print(f"fused='auto', {length:>4} tokens: {path}")
    assert (layer.attention_weights is None) == (length >= FUSED_MIN_LENGTH)

for options in ({"scorer": "additive"}, {"pooling": "sparsemax"}, {"dropout": 0.1}):
    print(f"{options}: {mt.nn.MultiHeadAttention(32, 4, **options).why_not_fused()}")
assert mt.nn.MultiHeadAttention(32, 4, dropout=0.1).why_not_fused() is None, "dropout streams too"
assert mt.nn.MultiHeadAttention(32, 4, scorer="additive").why_not_fused() is not None

with expect_error("fused=True on a layer with the additive scorer", ValueError) as caught:
    mt.nn.MultiHeadAttention(32, 4, scorer="additive", fused=True)
assert "additive" in str(caught.error)

# %% [markdown]
# Dropout on the weights (`self.dropout(self.attention_weights)` in D2L 10.3 / 11.3) seems to need
# the weights it drops, which the stream never holds. It needs them one tile at a time: dropout
# acts after the softmax, $(M \odot P)\,V$ with $M$ the mask scaled by $1/(1 - p)$, so the running sum $l$ keeps
# adding every weight (the softmax's denominator is not dropped) and only the running output
# $\mathbf{o}$ adds the kept ones. Backward needs the same mask again, and it is not stored:
# minitensor's dropout draws it from a *counter-based* generator, where the random number of
# weight $(b, h, i, j)$ is a hash of (seed, its index in the whole (batch, heads, Q, K)
# weights), so each tile makes its own part of the mask again, in backward as in forward
# (FlashAttention does the same with the Philox generator). In backward,
# $dV = (M \odot P)^\top dO$ and $dP = M \odot (dO\,V^\top)$, and the row sums
# $D_i = dO_i \cdot O_i$ need no change. Since the index is that of the whole matrix, the
# stream drops exactly what `mt.dropout` drops of the plain path's weights with the same
# seed:

# %%
mt.manual_seed(3)
dropping = {fused: mt.nn.MultiHeadAttention(32, 4, dropout=0.2, fused=fused) for fused in (False, True)}
dropping[True].load_state_dict(dropping[False].state_dict())
Xd = mt.randn(2, 40, 32)
outs = {}
for fused, layer in dropping.items():  # both in training mode: dropout acts
    mt.manual_seed(7)  # the same seed for both paths' dropout
    outs[fused] = layer(Xd, Xd, Xd, causal=True)
gap = float(numpy.abs(outs[True].numpy() - outs[False].numpy()).max())
print(f"training, dropout 0.2: streamed vs plain, the same seed: max |difference| = {gap:.1e}")
assert gap < 1e-5 and dropping[True]._stream is not None and dropping[False]._stream is None
mt.manual_seed(8)
assert float(numpy.abs(dropping[True](Xd, Xd, Xd, causal=True).numpy() - outs[True].numpy()).max()) > 1e-3

# %% [markdown]
# ### PyTorch's one call
#
# A model written for PyTorch attends with one function, as nanoGPT does:
# `F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False,
# scale=None, enable_gqa=False)`. `minitensor.nn.functional` has it too, with PyTorch's rules: it
# streams where `fused="auto"` would, and takes the plain path where the stream cannot take the
# call (a float `attn_mask`, which is a dense bias on the scores). One rule differs from
# minitensor's own `causal=`. With fewer queries than keys, PyTorch's `is_causal` lets query $i$
# see the keys $j \le i$, the upper-left corner of the mask; a decoder with a cache needs its
# last query to see every key, $j \le i + K - Q$, the lower-right corner, and that is what
# `causal=True` means in minitensor:

# %%
Xs = mt.randn(2, 4, 48, 8)  # (batch, heads, steps, d_head): queries, keys and values at once
mine = flash_attention(Xs, Xs, Xs, causal=True)
theirs = F.scaled_dot_product_attention(Xs, Xs, Xs, is_causal=True)  # PyTorch's call, nanoGPT's
gap = float(numpy.abs(mine.numpy() - theirs.numpy()).max())
print(f"F.scaled_dot_product_attention vs flash_attention, 48 x 48: max |difference| = {gap:.1e}")
assert gap < 1e-5
last = Xs[:, :, -1:]  # the last query alone, against all 48 keys
upper_left = F.scaled_dot_product_attention(last, Xs, Xs, is_causal=True)  # sees key 0 only
lower_right = flash_attention(last, Xs, Xs, causal=True)  # sees every key, as in the full pass
assert numpy.allclose(upper_left.numpy(), Xs[:, :, :1].numpy()), "one key: its value, weight 1"
assert numpy.allclose(lower_right.numpy(), mine[:, :, -1:].numpy(), atol=1e-6)

# %% [markdown]
#
# The rest of nanoGPT's `model.py` runs on minitensor as it is written: executed with
# minitensor in `torch`'s place (`bench/nanogpt_model.py`), it gives PyTorch's loss and
# gradients from the same weights and trains at PyTorch's pace on a CPU.
#
# The models take the same argument (`TransformerEncoder(..., fused=...)` and the others
# pass it to every layer), and so do training runs: `TrainConfig(fused="auto" | "on" |
# "off")`, `minitensor train --fused auto|on|off`. A run may change it on `--resume`, since it
# changes neither the parameters nor the results.
#
# > **Takeaway.** `fused="auto"` streams sequences of 384 tokens or more when the scorer is a
# > dot product, the pooling a softmax and any score bias relative, dropout on the weights
# > included (each tile remakes its part of the mask from the seed); `why_not_fused()` names
# > the reason when it cannot, and `fused=True` turns that
# > reason into an error.
#
# ## 6. The payoff: a language model on 2048-character windows
#
# The character language model of `minitensor train --text FILE` (D2L 8.3 / 9.3, as a
# decoder-only Transformer; `LM_RECIPE` in `minitensor/train/config.py`: 128 hidden units,
# 4 heads, 2 blocks) reads windows of 128 characters by default. With `--lm-num-steps 2048`
# each window is 2048 characters, every causal self-attention has 2048 queries and keys, and
# `fused="auto"` streams them. Nothing else has to change (the models build their position
# tables as long as the window), but we take ALiBi (tutorial 9) as the positional encoding
# here: a bias on the scores, so the stream adds it tile by tile from its `relative_bias`
# table, the case of section 3 inside a real model.
#
# First one training step, forward and backward at batch 1, measured on both paths: the
# model with `fused="auto"` (streaming at this length) and the same model with
# `fused="off"`.

# %%
TEXT = str(pathlib.Path(mt.__file__).parent / "data" / "texts" / "time_machine.txt")
config = TrainConfig.recipe(
    "lm",
    text=TEXT,
    positional="alibi",
    lm_num_steps=pick(2048, 600),
    batch_size=1,
    steps=pick(24, 2),
    progress=False,
    **pick({}, {"num_hiddens": 32, "ffn_num_hiddens": 64, "num_heads": 2, "num_blks": 1, "max_examples": 8000}),
)
Tlm = config.lm_num_steps
assert config.fused == "auto" and Tlm >= FUSED_MIN_LENGTH
mt.manual_seed(config.seed)
data = build_data(config)
window = numpy.array(data.train[: Tlm + 1])
X_lm, Y_lm = mt.tensor(window[None, :-1]), mt.tensor(window[None, 1:])  # predict each next character

step = {}
for fused in ("off", "auto"):
    mt.manual_seed(config.seed)
    model = build_model(config.replace(fused=fused), data.src_vocab, data.tgt_vocab)
    mt.ops.cross_entropy(model(X_lm[:, :512]), Y_lm[:, :512]).backward()  # warm-up: numba's kernels load on first use
    model.zero_grad()
    tracemalloc.start()
    start = time.perf_counter()
    loss = mt.ops.cross_entropy(model(X_lm), Y_lm)
    loss.backward()
    step[fused] = {
        "seconds": time.perf_counter() - start,
        "peak": tracemalloc.get_traced_memory()[1],
        "loss": loss.item(),
    }
    tracemalloc.stop()
    attention_layers = [m for m in model.modules() if isinstance(m, mt.nn.MultiHeadAttention)]
    assert all((layer.attention_weights is None) == (fused == "auto") for layer in attention_layers), "auto streamed"

array = config.num_heads * Tlm**2 * 4  # one (batch 1, heads, T, T) float32 array
print(f"one (1, {config.num_heads}, {Tlm}, {Tlm}) float32 array: {array / MiB:.1f} MiB")
for fused, measured in step.items():
    print(
        f"fused={fused!r:6}: loss {measured['loss']:.6f}, peak {measured['peak'] / MiB:6.1f} MiB "
        f"({measured['peak'] / array:4.1f} arrays), {measured['seconds']:.2f} s"
    )
assert abs(step["auto"]["loss"] - step["off"]["loss"]) < 1e-4, "the same model, the same loss"
assert step["off"]["peak"] > 2 * config.num_blks * array, "plain: at least scores and weights of every layer"
assert step["auto"]["peak"] < step["off"]["peak"] / 4
if not SMOKE:
    assert step["off"]["peak"] > 2 * (2 * config.num_blks * array), "more than twice the lower bound below"
    assert step["auto"]["peak"] < array, "the whole streamed step: less than one (T, T) array"

# %% [markdown]
# The estimate from the shapes, for the full-mode sizes: one (batch, heads, T, T) float32
# array is $1 \cdot 4 \cdot 2048^2 \cdot 4$ bytes = 64 MiB. Every layer's plain attention makes
# at least its scores and its weights and keeps them for backward — 2 arrays x 2 layers =
# 256 MiB, a lower bound, before the backward pass adds gradients of the same size. The
# graph actually keeps more (section 2): $QK^\top$, the scaled scores, ALiBi's dense
# (heads, T, T) bias, the biased scores and the weights, 5 arrays per layer, 640 MiB for
# the two layers before backward begins. The measured plain step above is more than twice
# the lower bound; the whole streamed step, model and all, stays below a single array. At
# batch $B$ everything of size $T \times T$ is $B$ times larger: the held-out evaluation below runs its 8 windows of 2048 characters
# as one batch, which on the plain path would make each of those arrays 8 times larger
# again (512 MiB each).
#
# Now the run itself, through the same `train` that `minitensor train` calls, with
# `tracemalloc` watching all of it — data, model, Adam's moments, every step, the
# held-out evaluation and the two samples of the final report:

# %%
with tempfile.TemporaryDirectory() as folder:
    lines = []
    tracemalloc.start()
    result = train(dataclasses.replace(config, out=f"{folder}/run"), log=lines.append, figures=False)
    run_peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
print("\n".join(line for line in lines if not line.startswith("sample")))
losses = result.history["loss"]
print("training loss by step:", " ".join(f"{x:.2f}" for x in losses))
print(
    f"the whole run peaked at {run_peak / MiB:.1f} MiB of array memory; one step on the plain path peaked at "
    f"{step['off']['peak'] / MiB:.0f} MiB (measured above)"
)
vocab_size = len(data.tgt_vocab)
baseline = unigram_baseline(data.train, data.heldout, vocab_size)
print(
    f"{vocab_size} characters: log V = {math.log(vocab_size):.2f} nats (knowing nothing), unigram baseline "
    f"{baseline:.2f} (knowing how common each character is), held-out loss after {config.steps} steps "
    f"{result.heldout_loss:.2f}"
)
assert all(math.isfinite(x) for x in losses) and min(losses[1:]) < losses[0], "the loss falls"
if not SMOKE:
    assert numpy.mean(losses[-4:]) < losses[0] - 1.0, "a few dozen steps take the loss well below its start"
    assert result.heldout_loss < baseline, "... and below what character frequencies alone can do"
    assert run_peak < step["off"]["peak"], "the whole streamed run needs less than one plain step"
per_step = result.wall_time / config.steps  # evaluation and samples included: an upper bound
print(
    f"the run took {result.wall_time:.0f} s, {per_step:.1f} s a step with its evaluation; at that pace 1000 steps "
    f"of batch 1 would take about {1000 * per_step / 60:.0f} minutes here"
)

# %% [markdown]
# The training loss starts near $\log V$, the loss of a model that spreads its bets evenly
# over the $V$ characters, and within two dozen steps the held-out loss is below the
# unigram baseline, the loss of a model that knows only how common each character is: the
# model has begun to use its context, if only the last few characters. How much of the
# 2047 characters that each position can see it learns to use takes a real run, which is a
# matter of patience; from the command line:
#
# ```
# minitensor train --text minitensor/data/texts/time_machine.txt --lm-num-steps 2048 \
#     --positional alibi --batch-size 2 --steps 1000 --out runs/lm2048
# ```
#
# (without `--positional alibi` the run keeps the recipe's sinusoidal encoding, added to the
# inputs, which streams just as well; batch 2 takes about twice the time per step printed above; `--fused off` runs the plain
# path for comparison: the same numbers, several hundred MiB more per step; `--fused on`
# insists on streaming and says why when it cannot.) Whether the streamed step is also the
# faster one depends on the machine (compare the two times printed above); the lesson of
# this run is that the window's length is no longer limited by memory for $T^2$ arrays.
# With 2048 characters of context the model could, in principle, use a whole page; whether a model of 400,000 parameters learns to is
# another question, and a good exercise.
#
# > **Takeaway.** With `fused="auto"` a 2048-character window trains in a few dozen MiB of
# > attention memory where the plain path needs hundreds per step; nothing in the model or
# > its results changes.
#
# ## Summary
#
# - The online softmax keeps, per query row, a running maximum $m$, a running sum $\ell$ and
#   an unnormalised output $\mathbf{o}$; when $m$ grows to $m'$ the old sums are multiplied by
#   $e^{m - m'}$. After the last block $\mathbf{o}/\ell$ is the softmax output, exactly, and
#   $\text{lse} = m + \log \ell$ remembers the row.
# - A fully masked row shifts by 0 instead of $-\infty$: zeros, never NaN, and lse $= +\infty$.
# - FlashAttention runs that over tiles of queries and keys, and in backward recomputes the
#   weights from lse with $D_i = dO_i \cdot O_i$; memory grows as $T$ instead of $T^2$.
# - Causal and windowed tiles that hold no allowed key are skipped; relative biases enter
#   as (heads, Q + K - 1) tables; grouped heads as stacked query blocks.
# - `MultiHeadAttention(fused="auto")` streams at 384 tokens and more when exact;
#   `why_not_fused()` says why not; `attention_weights_for(heads, rows)` recomputes weights on
#   demand.
#
# ## Exercises
#
# 1. Time `flash_attention(q, k, v, causal=True, block_q=b, block_k=b)` at T = 2048 for
#    b = 32, 64, 128, 256, 512. Why are small tiles slow on a CPU (count the Python-level
#    iterations and the size of each matrix product), and what limits the tile size on a
#    GPU instead?
# 2. Derive $D_i = \sum_j P_{ij}\, dP_{ij} = dO_i \cdot O_i$ and the softmax backward
#    $dS_{ij} = P_{ij}(dP_{ij} - D_i)$ from $O = PV$ and $P_{ij} = e^{s_{ij}} / \sum_k e^{s_{ik}}$.
# 3. Give `streamed_attention` of section 3 a `valid_lens` argument (one length per query)
#    that skips the key blocks beyond the longest length of a query block, and compare it
#    with `flash_attention(..., valid_lens=...)`. Count the tiles it runs with
#    `stream_plan(..., valid_lens=...).visits`.
# 4. Write the online *log-sum-exp* of a stream of numbers that arrive one at a time (a
#    generator), in constant memory, and check it against `numpy.logaddexp.reduce`. This is
#    the normaliser half of Milakov and Gimelshein (2018).
# 5. Train the 2048-character language model with `--fused off` and `--fused auto` for 20
#    steps each and compare their peak memory (`/usr/bin/time -v` prints "Maximum resident
#    set size") and their held-out losses. Then try `--lm-num-steps 8192` with `--fused auto`.
#
# ## References
#
# - D2L, Chinese edition 《动手学深度学习》 (zh.d2l.ai): 10.3 注意力评分函数, 10.6
#   自注意力和位置编码, 10.7 Transformer, 8.3 语言模型和数据集. English edition *Dive into Deep
#   Learning* (d2l.ai): 11.3 "Attention Scoring Functions", 11.6 "Self-Attention and
#   Positional Encoding", 11.7 "The Transformer Architecture", 9.3 "Language Models".
# - Milakov and Gimelshein (2018), "Online normalizer calculation for softmax",
#   arXiv:1805.02867.
# - Rabe and Staats (2021), "Self-attention Does Not Need $O(n^2)$ Memory", arXiv:2112.05682.
# - Dao, Fu, Ermon, Rudra and Ré (2022), "FlashAttention: Fast and Memory-Efficient Exact
#   Attention with IO-Awareness", NeurIPS 2022, arXiv:2205.14135.
# - Dao (2023), "FlashAttention-2: Faster Attention with Better Parallelism and Work
#   Partitioning", arXiv:2307.08691 (ICLR 2024).
# - Press, Smith and Lewis (2022), "Train Short, Test Long: Attention with Linear Biases
#   Enables Input Length Extrapolation", ICLR 2022 (ALiBi, tutorial 9).
#
# ## Where this lives in the engine
#
# - `minitensor/core/ops/flash_attention.py`: `flash_attention` (`return_lse=`, `block_q=`,
#   `block_k=`), `FlashAttention` (the forward loop and the backward, in FlashAttention-2's
#   loop orders),
#   `StreamPlan` (`visits`, `scores`, `bias`, `weights`), `stream_plan`, `BLOCK_Q`, `BLOCK_K`.
# - `minitensor/core/nn/attention.py`: `MultiHeadAttention(fused=...)`, `why_not_fused`,
#   `attention_weights_for`, `_attend_streamed`, `plain_attention`.
# - `minitensor/core/nn/sdpa.py`: `F.scaled_dot_product_attention`, PyTorch's call over the two
#   paths (`stream_pays` and `FUSED_MIN_LENGTH`, in `flash_attention.py`, pick for it and for the layers).
# - `minitensor/core/ops/softmax.py` and `minitensor/core/kernels/cpu.py`: the masked softmax the
#   stream reproduces.
# - `minitensor/core/kernels/cuda/attention.cu` (and `docs/gpu.md`): the same algorithm as CUDA
#   kernels, what a GPU runs in place of the tile loop: a block of threads per (example, head,
#   tile of 64 queries), each row in the registers of two or four threads, the keys streamed
#   through shared memory in tiles of 32, masks and a relative bias's table applied inside;
#   backward with a block per tile of keys, so that no two blocks add into the same memory.
#   A sequence too short to keep the GPU busy has each row's keys split among up to four groups
#   of threads, each with its own running max, sum and output, merged at the end by the same
#   rescaling rule: shrink each by exp(its max - the larger max), then add.
# - `minitensor/train/config.py`: `TrainConfig.fused` (`--fused`), `LM_RECIPE`,
#   `lm_num_steps` (`--lm-num-steps`).
# - `tests/test_flash_attention.py`: streamed equals plain for every mask, bias and head
#   layout; `bench/long_attention.py`: time and memory against the plain path and PyTorch.
