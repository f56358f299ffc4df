# %% [markdown]
# # 1. Attention cues: queries, keys and values
#
# Where attention comes from, in the words of psychology, and how those words become three
# tensors: **queries**, **keys** and **values**. By the end we have an attention layer
# (`mt.nn.Attention`) choosing among five objects on a desk, and the attention-weight heatmap
# that every later chapter draws.
#
# Sources: D2L's attention chapter, in the Chinese edition 《动手学深度学习》 (zh.d2l.ai),
# 10.1 注意力提示, and in the English edition *Dive into Deep Learning* (d2l.ai), 11.1
# "Queries, Keys, and Values". The English 11.1 tells the query–key–value idea as a soft
# look-up in a database; the story of the two cues below is the one of the Chinese 10.1,
# translated from the English edition's earlier section "Attention Cues". Chinese terms
# stand beside the English ones the first time they appear, as the Chinese edition writes
# them; `GLOSSARY.md` maps them all.

# %%
import numpy
from _tutorial import SMOKE, figure_path, pick, text  # noqa: F401  (shared helpers; text(): figure labels in the tutorial's language)
from matplotlib.figure import Figure  # a Figure without pyplot: no window, no global state

import minitensor as mt
from minitensor.train.plots import show_heatmaps

TUTORIAL = "01_attention_cues"
mt.manual_seed(0)

# %% [markdown]
# ## Two kinds of cue
#
# Attention is a scarce resource: we cannot look at everything at once, so we *select*.
# Psychology describes that selection with a **two-component framework**, which goes back to
# William James in the 1890s (D2L: 双组件（two-component）的框架): a subject (受试者) directs
# attention using both
#
# - **non-volitional cues** (非自主性提示): what is salient and conspicuous in the environment
#   (突出性和易见性) grabs attention by itself;
# - **volitional cues** (自主性提示): what we *want*; selection under cognitive, conscious
#   control (受到了认知和意识的控制).
#
# D2L's example (10.1): five objects lie in front of us, a newspaper, a research paper, a cup of
# coffee, a notebook and a book. All the paper products are printed in black and white; the
# coffee cup is **red**. The red cup stands out and we notice it at a glance: a non-volitional
# cue. After the coffee we are awake and want to read, so we look for the book *on purpose*:
# a volitional cue.
#
# Let us put the desk into numbers. Each object is described by five features (does it look
# red, does it carry print, can we drink from it, is it bound, are its pages blank); those
# descriptions are what the objects offer to be matched against, their **keys**.

# %%
objects = ["newspaper", "research paper", "coffee cup", "notebook", "book"]
features = ["red", "printed", "drinkable", "bound", "blank pages"]
keys = numpy.array(
    [
        # red printed drink bound blank
        [0.0, 1.0, 0.0, 0.0, 0.0],  # newspaper
        [0.0, 1.0, 0.0, 0.5, 0.0],  # research paper (stapled: a little bound)
        [1.0, 0.0, 1.0, 0.0, 0.0],  # coffee cup, the only red thing
        [0.0, 0.0, 0.0, 1.0, 1.0],  # notebook
        [0.0, 1.0, 0.0, 1.0, 0.0],  # book
    ],
    dtype=numpy.float32,
)

# %% [markdown]
# A non-volitional cue needs no intention: the eye is drawn by saliency, here the colour red.
# Turn the saliency of each object into a probability of being looked at with a softmax,
# $\alpha_i = \exp(s_i) / \sum_j \exp(s_j)$, where $s_i$ is object $i$'s redness (times a
# strength, 3, that sets how strongly red pulls):

# %%
saliency = 3.0 * keys[:, features.index("red")]
glance = mt.softmax(mt.tensor(saliency)).numpy()
for name, a in zip(objects, glance):
    print(f"{name:>15}: {a:.3f}")
assert objects[int(glance.argmax())] == "coffee cup", "the salient red cup must draw the glance"
assert abs(glance.sum() - 1.0) < 1e-6, "a softmax over the objects sums to 1"

# %% [markdown]
# ## Queries, keys and values
#
# Fully connected layers (全连接层) and max or average pooling layers (最大汇聚层或平均汇聚层),
# and convolutions alike, use only non-volitional cues: what they do to an input depends on
# the input alone. A fully connected layer applies the same trained $W$ to whatever arrives;
# max pooling passes on the largest activation (the most salient one), average pooling all of
# them equally — none has an argument for "what I am looking for". What attention adds is the
# volitional cue: in D2L's words, “是否包含自主性提示”将注意力机制与全连接层或汇聚层区别开来
# ("whether a volitional cue is included" is what sets attention apart from fully connected
# and pooling layers).
#
# In an attention mechanism (注意力机制):
#
# - the volitional cue is the **query** (查询, $q$);
# - the non-volitional cues are the **keys** (键, $k_i$), each paired with a **value**
#   (值, $v_i$), the **sensory input** (感官输入) itself: keys and values come in pairs
#   (键和值是成对的), **key–value pairs** (键值对);
# - **attention pooling** (注意力汇聚) combines the query with the keys
#   and so *biases the selection* (选择倾向) over the values:
#
# $$f\big(q, (k_1, v_1), \ldots, (k_n, v_n)\big) = \sum_{i=1}^n \alpha(q, k_i)\, v_i,
# \qquad \alpha(q, k_i) \ge 0,\ \sum_i \alpha(q, k_i) = 1 .$$
#
# The output is a **weighted average** (加权平均) of the values, and the **attention weights**
# (注意力权重) $\alpha(q, k_i)$ say how much of each value the query takes. How $\alpha$ is
# computed is what distinguishes one attention mechanism from another (chapters 2 and 3).
#
# Here the keys are the object descriptions above; the values are what we *see* of each object
# (a one-hot "which object" vector, so the output tells directly how much of each object
# reached us); the queries are intentions, written in the same five features (the first,
# "nothing in mind", responds only to red: the glance above, written as a query). We score each
# pair by a dot product, $a(q, k) = q^\top k$, and pool with a softmax — the layer
# `mt.nn.Attention` with the scorer plugin `dot` and the pooling plugin `softmax`.

# %%
intentions = ["(nothing in mind)", "I want coffee", "I want to read", "I want to take notes"]
queries = 3.0 * numpy.array(
    [
        [1.0, 0.0, 0.0, 0.0, 0.0],  # no intention: only the red-detector of the eye is at work
        [0.0, 0.0, 1.0, 0.0, 0.0],  # something to drink
        [0.0, 1.0, 0.0, 1.0, 0.0],  # something printed and bound
        [0.0, 0.0, 0.0, 1.0, 1.0],  # bound blank pages
    ],
    dtype=numpy.float32,
)
values = numpy.eye(len(objects), dtype=numpy.float32)  # what reaches the eye: object i itself

attention = mt.nn.Attention(scorer="dot", pooling="softmax", dropout=0.0, query_size=5, key_size=5)
with mt.no_grad():
    seen = attention(mt.tensor(queries), mt.tensor(keys), mt.tensor(values))
weights = attention.attention_weights.numpy()  # (4 queries, 5 keys)
for intention, row in zip(intentions, weights):
    print(f"{intention:>22}: looks at the {objects[int(row.argmax())]} (weight {row.max():.2f})")

# %% [markdown]
# Every row of weights is a probability distribution over the five objects, and because the
# values are one-hot, the output $f(q)$ *is* that row. The query changes what is chosen:

# %%
assert numpy.allclose(weights.sum(axis=1), 1.0, atol=1e-6), "each query's weights sum to 1"
assert numpy.allclose(seen.numpy(), weights, atol=1e-6), "one-hot values: the output is the weight row"
chosen = [objects[i] for i in weights.argmax(axis=1)]
assert chosen == ["coffee cup", "coffee cup", "book", "notebook"], chosen

# %% [markdown]
# Now the same desk seen by a layer *without* a volitional cue. The `average` pooling plugin
# ignores the scores (and so the query): every key gets $1/n$. Whatever we want, it delivers
# the same blend of all five objects — that is average pooling, a layer that only uses what
# the inputs themselves offer. D2L: 平均汇聚层可以被视为输入的加权平均值，其中各输入的权重是一样的
# (an average pooling layer is a weighted average of its inputs with equal weights).

# %%
pooling_only = mt.nn.Attention(scorer="dot", pooling="average", dropout=0.0, query_size=5, key_size=5)
with mt.no_grad():
    blended = pooling_only(mt.tensor(queries), mt.tensor(keys), mt.tensor(values)).numpy()
print(blended.round(3))
assert numpy.allclose(blended, blended[0], atol=1e-7), "without a query every intention sees the same"
assert numpy.allclose(blended, 1 / len(objects)), "average pooling: weight 1/n on every value"

# %% [markdown]
# A picture of both: the weights as bars, one panel per intention, the "no intention" glance
# (only the red cup's saliency) on the left, the query-free average at the right.

# %%
fig = Figure(figsize=(12, 2.8), layout="constrained")
axes = fig.subplots(1, len(intentions) + 1, sharey=True)
panels = list(zip(intentions, weights)) + [("average pooling (any query)", numpy.full(5, 1 / 5))]
for ax, (title, row) in zip(axes, panels):
    colours = ["tab:red" if name == "coffee cup" else "0.4" for name in objects]
    ax.bar(range(len(objects)), row, color=colours)
    ax.set_xticks(range(len(objects)), [text(name) for name in objects], rotation=60, ha="right", fontsize="small")
    ax.set_title(text(title), fontsize="medium")
axes[0].set_ylabel(text("attention weight"))
fig.savefig(figure_path(TUTORIAL, "desk_attention.png"), dpi=100)

# %% [markdown]
# > **A common slip: "attention uses the volitional cue instead of the non-volitional ones"**
# >
# > The cue story is often summed up as "fully connected and pooling layers consider
# > non-volitional cues, attention considers the volitional one". That is a shorthand, and a
# > misleading one: an attention layer still uses the non-volitional cues, the keys. D2L's
# > words are more careful: what sets attention apart is that it *includes* the volitional
# > cue, and attention pooling *combines* it with the keys — 将查询（自主性提示）和键（非自主性提示）结合在一起
# > (the caption of the query–key–value figure in 10.1) — to bias the selection over the
# > values (sensory inputs). minitensor implements exactly that: every scorer is a
# > function of both, `score(q, k)` (`plugins/minitensor_plugins/scorers.py`), and a pooling
# > that looks at neither (`average`) gives back the query-free layer above.

# %% [markdown]
# ## Visualising attention: the heatmap
#
# Attention weights are a matrix — one row per query, one column per key — and they are drawn
# as a heatmap, D2L's `show_heatmaps` (`minitensor.train.plots.show_heatmaps`, which takes
# `(num_rows, num_cols, Q, K)` arrays and draws a grid of panels). D2L's first example is the
# identity matrix: each query gives all its weight to the key with the same index and none to
# the others.

# %%
identity = numpy.eye(10, dtype=numpy.float32)
show_heatmaps(
    identity.reshape(1, 1, 10, 10),
    xlabel=text("Keys"),
    ylabel=text("Queries"),
    path=figure_path(TUTORIAL, "identity_heatmap.png"),
)
assert numpy.allclose(identity.sum(axis=1), 1.0) and (identity >= 0).all(), "a valid weight matrix"

# %% [markdown]
# The desk's weights from above are such a matrix too, four intentions by five objects: the
# query picks the column.

# %%
show_heatmaps(
    weights,
    xlabel=text("Keys (objects)"),
    ylabel=text("Queries (intentions)"),
    row_labels=[text(intention) for intention in intentions],
    col_labels=[text(name) for name in objects],
    figsize=(6, 4),
    path=figure_path(TUTORIAL, "desk_heatmap.png"),
)

# %% [markdown]
# Such a matrix can also come out of real queries and keys. Put ten keys at the positions
# $0, 1, \ldots, 9$ on a line and ten queries at the same positions, and score each pair by how
# close they are, $a(q, k) = -\tfrac12 \big((q - k)\,w\big)^2$ — the Gaussian kernel of the
# next chapter, as the scorer plugin `parametric_gaussian` with its parameter $w$ (an
# *inverse* width) fixed. A small $w$ spreads each query's attention over its neighbours; a
# large one concentrates it on the key at the query's own position, and the weights approach
# the identity.

# %%
positions = mt.arange(10, dtype=mt.float32).reshape(10, 1)  # 10 queries / keys of size 1
ws = [0.5, 1.0, 5.0]
panels = []
for w in ws:
    layer = mt.nn.Attention(
        "parametric_gaussian", "softmax", 0.0, query_size=1, key_size=1, scorer_options={"w_init": w}
    )
    with mt.no_grad():
        layer(positions, positions, positions)
    panels.append(layer.attention_weights.numpy())
panels = numpy.stack(panels)  # (3, 10, 10)
show_heatmaps(
    panels.reshape(1, len(ws), 10, 10),
    xlabel=text("Keys"),
    ylabel=text("Queries"),
    titles=[f"w = {w}" for w in ws],
    path=figure_path(TUTORIAL, "gaussian_heatmaps.png"),
)

assert numpy.allclose(panels.sum(axis=-1), 1.0, atol=1e-6), "every row of weights sums to 1"
assert numpy.abs(panels[-1] - identity).max() < 1e-4, "a narrow kernel gives (almost) the identity"
diagonal = [round(float(numpy.diag(p).mean()), 4) for p in panels]
assert diagonal == sorted(diagonal), "the larger w, the more weight each query keeps on its own key"
print("mean weight on the diagonal:", dict(zip(ws, diagonal)))

# %% [markdown]
# Reading the heatmaps: row $i$ is query $i$, column $j$ is key $j$, the colour is
# $\alpha(q_i, k_j)$, and each row sums to 1. Every later chapter draws this picture — for
# kernel regression (chapter 2), masked and unmasked scoring functions (chapter 3), each head
# of multi-head attention (chapter 5) and the three kinds of attention inside a Transformer
# (chapter 7).
#
# ## Summary
#
# - Human attention combines non-volitional cues (saliency) and volitional cues (intention).
# - Fully connected, convolution and pooling layers use only non-volitional cues.
# - Attention mechanisms add the volitional cue: queries (volitional) meet keys
#   (non-volitional) and attention pooling biases the selection over the values (sensory
#   inputs) paired with the keys.
# - Attention weights form a matrix, queries by keys, drawn as a heatmap.

# %% [markdown]
# ## Exercises
#
# 1. Put a red notebook on the desk (set its "red" feature to 1). Which rows of the weights
#    change, which do not, and why? What does that say about a salient object that matches
#    no intention?
# 2. Multiply the queries by 0.3 instead of 3. What happens to the weights, and what would a
#    query of all zeros give? (Compare with the `average` pooling.)
# 3. In machine translation the decoder attends to the words of the source sentence. What
#    plays the query, the keys and the values there? (Chapter 7 draws those weights.)
#
# ## Where this lives in the engine
#
# - `minitensor/core/nn/attention.py` — `Attention`: scorer, pooling, dropout and the weighted sum
#   of the values; `attention_weights` kept for plotting.
# - `plugins/minitensor_plugins/scorers.py` — the `dot` and `parametric_gaussian` scorers.
# - `plugins/minitensor_plugins/poolings.py` — the `softmax` and `average` poolings.
# - `minitensor/core/ops/softmax.py` and `minitensor/core/kernels/cpu.py` — the softmax itself.
# - `minitensor/train/plots.py` — `show_heatmaps`.
