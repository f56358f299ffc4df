# %% [markdown]
# # 4. Write your own scorer plugin
#
# Chapter 3 met the two attention scoring functions of D2L's section on them, additive and
# scaled dot product. Here we write a new one ourselves, in a dozen lines, and make it a first-class
# citizen of minitensor: checked against the contract with the conformance kit, registered
# while the program runs, used by name in `mt.nn.MultiHeadAttention`, and finally shipped
# as a tiny installable package that `minitensor train --scorer bilinear` picks up through
# an entry point. On the way we meet the two pluggy habits that trip up plugin authors, and
# a few plausible bugs: each is made on purpose, announced as "(deliberate mistake: ...)" in
# the output, and followed by the "expected error" minitensor gives for it.
#
# Recall D2L's definition. An **attention scoring function** (注意力评分函数, or simply
# 评分函数, scoring function) $a(q, k)$ maps a query and a key to a real number, the
# **attention score**, with no range restriction; a softmax over the keys turns the scores
# into **attention weights** (注意力权重) $\alpha(q, k_i) \in [0, 1]$:
#
# $$\alpha(q, k_i) = \operatorname{softmax}(a(q, k_i)) = \frac{\exp(a(q, k_i))}{\sum_{j=1}^{m} \exp(a(q, k_j))},
# \qquad f(q) = \sum_{i=1}^{m} \alpha(q, k_i)\, v_i .$$
#
# "Choosing a different attention scoring function $a$ leads to a different attention
# pooling" (选择不同的注意力评分函数$a$会导致不同的注意力汇聚操作, D2L 10.3): choosing $a$ is
# the whole design space, and that is why minitensor makes the scorer a plugin.
#
# Sources: D2L's attention chapter, in the Chinese edition 《动手学深度学习》 (zh.d2l.ai),
# 10.3 注意力评分函数, and in the English edition *Dive into Deep Learning* (d2l.ai),
# 11.3 "Attention Scoring Functions"; Luong, Pham and Manning (2015), "Effective Approaches to
# Attention-based Neural Machine Translation", for the bilinear score. Plugins:
# [pluggy](https://pluggy.readthedocs.io).

# %%
import inspect
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile

import numpy
import pluggy
from _tutorial import SMOKE, expect_error, figure_path, pick, text  # noqa: F401  (shared helpers; text: figure labels in the language)
from minitensor.plugins import PluginError, check_options

import minitensor as mt
from minitensor import hookimpl, hookspecs
from minitensor.testing import check_scorer
from minitensor.train.plots import show_heatmaps

TUTORIAL = "04_write_a_scorer_plugin"
mt.manual_seed(0)

# %% [markdown]
# ## A bilinear scorer with a temperature
#
# The scaled dot product $q^\top k / \sqrt{d}$ needs queries and keys of one length $d$;
# the additive scorer $w_v^\top \tanh(W_q q + W_k k)$ accepts different lengths but builds a
# (…, Q, K, h) tensor before reducing it. Between the two sits the **bilinear** score (Luong
# et al. 2015 call it "general")
#
# $$a(q, k) = \frac{q^\top W k}{\tau}, \qquad q \in \mathbb{R}^{d_q},\; k \in \mathbb{R}^{d_k},\;
# W \in \mathbb{R}^{d_q \times d_k} \text{ learned},$$
#
# which takes different lengths *and* is two matrix products: $(Q W) K^\top$. With
# $W = I / \sqrt{d}$ it is the scaled dot product again. The **temperature** $\tau > 0$ is an
# option: a small $\tau$ stretches the scores, so the softmax sharpens towards the best key;
# a large one flattens it towards average pooling.
#
# The contract every scorer keeps (`minitensor/core/hookspecs.py`): a `mt.nn.Module` built as
# `cls(query_size, key_size, **options)` whose `forward(queries, keys)` maps queries
# (…, Q, d_q) and keys (…, K, d_k) to scores (…, Q, K), for *any* leading batch axes
# (multi-head attention passes (batch, num_heads, Q, d_head)). Options arrive as keyword
# arguments; `check_options` refuses one we do not know, so a typo such as
# `scorer_options={"temprature": 0.5}` is an error instead of a silently ignored setting.


# %%
class BilinearScorer(mt.nn.Module):
    """score(q, k) = q^T W k / temperature, W (query_size, key_size) learned.

    queries (..., Q, dq), keys (..., K, dk) -> scores (..., Q, K). W starts ~ N(0, 1 / (dq dk)),
    so for q and k with unit-variance entries the scores start with unit variance, as the
    scaled dot product's do.
    """

    def __init__(self, query_size, key_size, temperature=1.0, **options):
        super().__init__()
        check_options(type(self), options, ("temperature",))
        if query_size is None or key_size is None:
            raise ValueError("BilinearScorer needs query_size and key_size (W is learned)")
        if not temperature > 0:
            raise ValueError(f"BilinearScorer: temperature must be > 0, got {temperature}")
        self.temperature = float(temperature)
        self.W = mt.nn.Parameter(mt.randn(query_size, key_size) * (1.0 / math.sqrt(query_size * key_size)))

    def forward(self, queries, keys):
        # (..., Q, dq) @ (dq, dk) -> (..., Q, dk); then @ (..., dk, K): every query meets every key
        return (queries @ self.W) @ keys.swapaxes(-1, -2) * (1.0 / self.temperature)

    def extra_repr(self):
        return f"temperature={self.temperature}"


scorer = BilinearScorer(4, 6, temperature=0.5)
q, k = mt.randn(2, 3, 4), mt.randn(2, 5, 6)
print(scorer, scorer(q, k).shape)
assert scorer(q, k).shape == (2, 3, 5), "scores are (..., Q, K)"

# %% [markdown]
# ## Check it against the contract: the conformance kit
#
# A scorer that works on the one shape we tried can still break inside multi-head
# attention. `minitensor.testing.check_scorer` builds the class with the options we give
# and checks what every attention layer relies on: shapes under 0, 1 and 2 leading batch
# axes, float32 and float64, no NaN, batch independence (changing example 1 changes no other
# example), and gradients to the queries, the keys and every parameter (here $W$) by
# `mt.gradcheck` in float64. It returns True or raises an AssertionError naming the broken
# property.

# %%
assert check_scorer(BilinearScorer, query_size=4, key_size=6, temperature=0.5)
assert check_scorer(BilinearScorer, query_size=5, key_size=5)  # square W, default temperature
print("BilinearScorer keeps the scorer contract")

# %% [markdown]
# Two plausible bugs, made on purpose, and what the kit says about them. `keys.T` looks like
# $K^\top$ and works on a (K, d) matrix, but on batched keys it reverses *all* axes; centring
# the scores by their mean over the whole tensor (instead of per row) quietly mixes the
# examples of a batch. The kit must reject both.


# %%
class TransposeEverything(BilinearScorer):
    def forward(self, queries, keys):
        return (queries @ self.W) @ keys.T  # fine for 2-D keys only


class MixesTheBatch(BilinearScorer):
    def forward(self, queries, keys):
        scores = (queries @ self.W) @ keys.swapaxes(-1, -2)
        return scores - scores.mean()  # one mean over every example and head


with expect_error("keys.T on batched keys, checked by the conformance kit", AssertionError) as caught:
    check_scorer(TransposeEverything, query_size=4, key_size=6)
assert "TransposeEverything" in str(caught.error), "the kit names the scorer it rejects"
with expect_error("one mean over the whole batch, checked by the conformance kit", AssertionError) as caught:
    check_scorer(MixesTheBatch, query_size=4, key_size=6)
assert "batch independence" in str(caught.error), "the kit names the broken property"

# %% [markdown]
# ## Register it while the program runs
#
# minitensor finds plugins with [pluggy](https://pluggy.readthedocs.io), pytest's plugin
# system. A plugin is any object (a module, a class instance) holding functions marked with
# `@minitensor.hookimpl` whose *names* are hooks listed in `minitensor/core/hookspecs.py`:
# `minitensor_scorers`, `minitensor_poolings`, `minitensor_positional_encodings`. Each takes
# no arguments and returns `{name: class}`. `mt.plugins.register(plugin, name=...)` adds it
# at once (the registries are rebuilt at the next look-up) and `mt.plugins.unregister`
# takes it away again.


# %%
class BilinearPlugin:
    """A plugin object: pluggy looks for methods named like hooks and marked @hookimpl."""

    @hookimpl
    def minitensor_scorers(self):
        return {"bilinear": BilinearScorer}


plugin = BilinearPlugin()
mt.plugins.register(plugin, name="tutorial-bilinear")
assert mt.plugins.lookup("scorer", "bilinear") is BilinearScorer
for row in mt.plugins.describe():
    if row["kind"] == "scorer":
        print(f"{row['name']:20} {row['source']}")

# %% [markdown]
# From here on `"bilinear"` works wherever a built-in scorer name does. In
# `mt.nn.MultiHeadAttention` every head gets its own scorer, built with the per-head size
# (num_hiddens / num_heads for queries and keys), and sees (batch, num_heads, Q, d_head)
# tensors; `scorer_options` passes the temperature through.

# %%
mha = mt.nn.MultiHeadAttention(
    num_hiddens=16, num_heads=2, dropout=0.0, scorer="bilinear", scorer_options={"temperature": 0.5}
)
X = mt.randn(2, 5, 16)
Y = mha(X, X, X, valid_lens=mt.tensor([5, 3]))
print(mha.attention.scorer)
assert Y.shape == (2, 5, 16), "multi-head attention keeps (batch, steps, num_hiddens)"
assert mha.attention_weights.shape == (2, 2, 5, 5), "weights are (batch, num_heads, Q, K)"
assert (mha.attention_weights.numpy()[1, :, :, 3:] == 0).all(), "keys beyond valid_lens get weight 0"
assert mha.attention.scorer.W.shape == (8, 8), "the scorer is built with the per-head size d_head = 16 / 2"

# A misspelt option is an error, naming the plugin:
with expect_error("the option 'temprature' (misspelt)", TypeError) as caught:
    mt.nn.MultiHeadAttention(16, 2, scorer="bilinear", scorer_options={"temprature": 0.5})
assert "temprature" in str(caught.error), "the error names the unknown option"

# %% [markdown]
# ## What the bilinear scorer can learn
#
# Queries and keys of *different* lengths, the case for which D2L 10.3 recommends additive
# attention (当查询和键是不同长度的矢量时，可以使用加性注意力作为评分函数): eight things, each described once by a 4-dimensional query and once by a
# 6-dimensional key (two different linear views $q_i = A z_i$, $k_i = B z_i$ of one hidden unit
# vector $z_i$). Can attention learn to send query $i$ to key $i$? The weights are a softmax
# of scores linear in $W$, so maximising $\log \alpha(q_i, k_i)$ is a convex problem, and a
# few hundred Adam steps solve it. We train a single-head `mt.nn.Attention` that uses our
# scorer by name.

# %%
rng = numpy.random.default_rng(0)
num_items = 8
z = rng.standard_normal((num_items, 3))
z /= numpy.linalg.norm(z, axis=1, keepdims=True)
queries = mt.tensor(z @ rng.standard_normal((3, 4)), dtype=mt.float32)  # (8, 4)
keys = mt.tensor(z @ rng.standard_normal((3, 6)), dtype=mt.float32)  # (8, 6)
values = mt.tensor(numpy.eye(num_items), dtype=mt.float32)  # value i = "item i": the output is the weights row

attn = mt.nn.Attention("bilinear", "softmax", 0.0, query_size=4, key_size=6, scorer_options={"temperature": 1.0})
with mt.no_grad():
    attn(queries, keys, values)
before = attn.attention_weights.numpy()

optimizer = mt.optim.Adam(attn.parameters(), lr=0.1)
losses = []
for _ in range(300):
    weights = attn(queries, keys, values)  # (8, 8): row i = where query i looks
    loss = -(weights.log() * values).sum() / num_items  # cross-entropy against "key i"
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    losses.append(loss.item())
with mt.no_grad():
    attn(queries, keys, values)
after = attn.attention_weights.numpy()
attn.scorer.temperature = 0.25  # an option is plain state: colder now, after training
with mt.no_grad():
    attn(queries, keys, values)
colder = attn.attention_weights.numpy()


def entropy(weights):
    return float(-(weights * numpy.log(weights + 1e-30)).sum(axis=-1).mean())


print(
    f"loss {losses[0]:.3f} -> {losses[-1]:.3f}; mean weight on the matching key "
    f"{numpy.diag(before).mean():.3f} -> {numpy.diag(after).mean():.3f} (tau=1) -> "
    f"{numpy.diag(colder).mean():.3f} (tau=0.25)"
)
print(f"entropy of the weights: tau=1 {entropy(after):.3f}, tau=0.25 {entropy(colder):.3f}")
assert losses[-1] < 0.5 * losses[0], "training the bilinear W must lower the loss"
assert (after.argmax(axis=1) == numpy.arange(num_items)).all(), "every query must find its own key"
assert numpy.diag(after).mean() > numpy.diag(before).mean() + 0.3
assert entropy(colder) < entropy(after), "a lower temperature sharpens the weights"

# %% [markdown]
# The heatmaps (row $i$ = query $i$, column $j$ = key $j$): before training the scores are
# random, afterwards the weight sits on the diagonal, and the colder temperature makes it
# sharper still.

# %%
show_heatmaps(
    numpy.stack([before, after, colder])[None],
    xlabel=text("keys (6-dim)"),
    ylabel=text("queries (4-dim)"),
    titles=[text("before training"), text("trained, tau = 1"), text("trained, tau = 0.25")],
    path=figure_path(TUTORIAL, "bilinear_attention.png"),
)

# %% [markdown]
# ## Two pluggy pitfalls, and what minitensor says
#
# pluggy matches hook implementations to hooks **by name and by parameter names**, and that
# has consequences.
#
# **1. A misspelt hook.** A function named `minitensor_scorer` (no "s") is no hook at all;
# pluggy would register it and never call it. minitensor runs `pm.check_pending()` after
# every registration, so the typo is an error, with the hook you probably meant (the typo is
# deliberate here, and so is the error):


# %%
class Misspelt:
    @hookimpl
    def minitensor_scorer(self):  # should be minitensor_scorers
        return {"bilinear2": BilinearScorer}


with expect_error("a hook named minitensor_scorer, without the s", PluginError) as caught:
    mt.plugins.register(Misspelt(), name="misspelt")
assert "did you mean 'minitensor_scorers'" in str(caught.error), "the error names the hook meant"
assert not mt.plugins.get_plugin_manager().has_plugin("misspelt"), "a rejected plugin leaves nothing behind"

# %% [markdown]
# **2. Hooks are called with keyword arguments only**, and pluggy passes an implementation
# exactly the arguments its parameters name. A parameter the hook does not have is
# therefore an error at registration; but give that parameter a **default value** and pluggy
# treats it as "not mine to fill": pluggy itself accepts the plugin and the default is used
# forever, whatever the caller meant. That is why a hook implementation must not give its
# parameters defaults, and why minitensor checks for it: such a plugin is refused with a
# `PluginError` that says so (pluggy alone would register it silently).


# %%
class ExtraParameter:
    @hookimpl
    def minitensor_scorers(self, temperature):  # the hook has no such parameter
        return {"bilinear_cold": BilinearScorer}


with expect_error("a hook implementation with a parameter the hook does not have", PluginError) as caught:
    mt.plugins.register(ExtraParameter(), name="extra-parameter")
assert "temperature" in str(caught.error), "the error names the parameter"

seen = []


class WithDefault:
    @hookimpl
    def minitensor_scorers(self, temperature=0.1):  # a default: silently never passed
        seen.append(temperature)
        return {"bilinear_cold": BilinearScorer}


with expect_error("a hook parameter with a default value", PluginError) as caught:
    mt.plugins.register(WithDefault(), name="with-default")
assert "default" in str(caught.error), "the error says what is wrong"
assert "bilinear_cold" not in mt.plugins.scorers(), "refused, and nothing left behind"

# What pluggy alone does with it: registers it, and calls it without the argument.
bare = pluggy.PluginManager("minitensor")
bare.add_hookspecs(hookspecs)
bare.register(WithDefault())
bare.hook.minitensor_scorers()
print("under plain pluggy the hook ran with temperature =", seen[-1], "(its default: pluggy passed nothing)")
assert seen == [0.1]

# Calling a hook yourself: keyword arguments only. The result is one answer per plugin.
hook = mt.plugins.get_plugin_manager().hook.minitensor_scorers
print(len(hook()), "plugins answer minitensor_scorers()")
with expect_error("calling a hook with a positional argument", TypeError):
    hook("positional")

# %% [markdown]
# ## Fast paths: declare what your scorer is
#
# For long sequences `mt.nn.MultiHeadAttention` can stream its attention (chapter 10:
# FlashAttention's online softmax over blocks of keys), never building the (Q, K) scores. It
# computes the scores itself then, so it must know that they are `scale * q . k`: the layer
# does not guess from a plugin's name, it reads what the plugin **declares**
# (`minitensor/core/hookspecs.py`, "capabilities"). A scorer may declare `row_wise = True` (each
# score comes from one query and one key: grouped heads can then score a whole group at once)
# and a method `dot_scale(d_head)` returning the scale (the scores are exactly that times
# q . k); a pooling may declare `softmax_like = True`. The built-ins declare theirs the same
# way. The kit checks every declaration, so a false one fails in `check_scorer`, not in a
# model. Our bilinear scorer is not a dot product, and says nothing: it takes the plain path.


# %%
class DotOfMine(mt.nn.Module):
    """The scaled dot product once more, under a new name, declaring what it computes."""

    row_wise = True  # each score from one query row and one key row

    def __init__(self, query_size, key_size, **options):
        super().__init__()
        check_options(type(self), options)

    def forward(self, queries, keys):
        return queries @ keys.swapaxes(-1, -2) / math.sqrt(queries.shape[-1])

    def dot_scale(self, d_head):  # the scores are exactly dot_scale * q . k
        return 1.0 / math.sqrt(d_head)


class DotOfMinePlugin:
    @hookimpl
    def minitensor_scorers(self):
        return {"dot_of_mine": DotOfMine}


assert check_scorer(DotOfMine)  # the kit checks the declarations too
mt.plugins.register(DotOfMinePlugin(), name="tutorial-dot-of-mine")
for name in ("scaled_dot", "dot_of_mine", "bilinear"):
    print(f"{name:12} streams: {mt.nn.MultiHeadAttention(32, 4, scorer=name).why_not_fused() or 'yes'}")

X = mt.randn(1, 64, 32)
outputs = {}
for name in ("scaled_dot", "dot_of_mine"):
    mt.manual_seed(1)  # the same weights for both layers
    layer = mt.nn.MultiHeadAttention(32, 4, scorer=name, fused=True)  # fused=True: stream, or raise saying why not
    outputs[name] = layer(X, X, X, causal=True).numpy()
numpy.testing.assert_allclose(outputs["dot_of_mine"], outputs["scaled_dot"], rtol=1e-5, atol=1e-6)
assert "does not declare dot_scale" in mt.nn.MultiHeadAttention(32, 4, scorer="bilinear").why_not_fused()
mt.plugins.unregister(name="tutorial-dot-of-mine")

# %% [markdown]
# ## Ship it: a plugin package with an entry point
#
# Run-time registration lasts as long as the Python process. To make `bilinear` available to
# every program, including the `minitensor` command line, it goes into a distribution that
# declares an **entry point** in the group `"minitensor"`; minitensor loads those at the first
# registry look-up (`plugins/example-cosine/` is such a package, with its `pyproject.toml`:
#
#     [project.entry-points.minitensor]
#     cosine = "minitensor_cosine"
#
# ). An *installed* distribution is, as far as `importlib.metadata` is concerned, nothing
# more than a module on the path plus a `<name>-<version>.dist-info` folder holding
# `METADATA` and `entry_points.txt`: what `pip install` would leave behind. We write exactly
# that into a temporary folder, the scorer as the module `minitensor_bilinear.py` (the class
# above, with its hook as a module-level function).

# %%
site = tempfile.mkdtemp(prefix="minitensor-bilinear-")
# The module is the class above, word for word (``inspect.getsource``), between the imports
# it needs and its hook.
module_source = "\n".join(
    [
        '"""A minitensor plugin: the bilinear attention scorer, score(q, k) = q^T W k / temperature."""',
        "",
        "import math",
        "",
        "import minitensor as mt",
        "from minitensor import hookimpl",
        "from minitensor.plugins import check_options",
        "",
        "",
        inspect.getsource(BilinearScorer),
        "",
        "@hookimpl",
        "def minitensor_scorers():",
        '    return {"bilinear": BilinearScorer}',
        "",
    ]
)
with open(os.path.join(site, "minitensor_bilinear.py"), "w", encoding="utf-8") as f:
    f.write(module_source)
info = os.path.join(site, "minitensor_bilinear-0.1.dist-info")
os.mkdir(info)
with open(os.path.join(info, "METADATA"), "w", encoding="utf-8") as f:
    f.write("Metadata-Version: 2.1\nName: minitensor-bilinear\nVersion: 0.1\n")
with open(os.path.join(info, "entry_points.txt"), "w", encoding="utf-8") as f:
    f.write("[minitensor]\nbilinear = minitensor_bilinear\n")  # group, then name = module
for root, _, files in os.walk(site):
    for name in files:
        print(os.path.relpath(os.path.join(root, name), site))

# %% [markdown]
# A fresh process with that folder on `PYTHONPATH` now sees the plugin, listed with the
# distribution it came from. `MINITENSOR_STRICT_PLUGINS=1` makes a plugin that fails to load
# an error instead of a warning, which is what a plugin author wants. (`python -m
# minitensor` is the `minitensor` command, run by this very interpreter.)

# %%
env = {k: v for k, v in os.environ.items() if k != "MINITENSOR_DISABLE_PLUGIN_AUTOLOAD"}
env["PYTHONPATH"] = os.pathsep.join(p for p in (site, env.get("PYTHONPATH")) if p)
env["MINITENSOR_STRICT_PLUGINS"] = "1"
listing = subprocess.run(
    [sys.executable, "-m", "minitensor", "plugins"], env=env, capture_output=True, text=True, timeout=120
)
print(listing.stdout)
assert listing.returncode == 0, listing.stderr
assert any(
    line.split() == ["bilinear", "scorer", "minitensor-bilinear", "0.1"] for line in listing.stdout.splitlines()
), "the entry point must be listed with its distribution"

# %% [markdown]
# And the whole training pipeline uses it: `minitensor train --scorer bilinear --scorer-opt
# temperature=0.5` builds the encoder–decoder Transformer with bilinear attention in every
# head of every block, trains it on the sequence-reversal task and reports the held-out exact
# match. In smoke mode the sizes are tiny and only show that it runs, end to end, in another
# process; the full-size run (four epochs, a few seconds) reverses every held-out sequence
# on our machine.

# %%
run_dir = os.path.join(site, "run")
size = pick(
    [
        "--num-train",
        "4000",
        "--num-heldout",
        "200",
        "--epochs",
        "4",
        "--max-len",
        "6",
        "--num-hiddens",
        "32",
        "--ffn-num-hiddens",
        "64",
        "--num-heads",
        "4",
        "--num-blks",
        "2",
    ],
    [
        "--num-train",
        "200",
        "--num-heldout",
        "20",
        "--epochs",
        "2",
        "--max-len",
        "4",
        "--num-hiddens",
        "16",
        "--ffn-num-hiddens",
        "32",
        "--num-heads",
        "2",
        "--num-blks",
        "1",
    ],
)
command = [
    sys.executable,
    "-m",
    "minitensor",
    "train",
    "--task",
    "reverse",
    "--scorer",
    "bilinear",
    "--scorer-opt",
    "temperature=0.5",
    "--batch-size",
    "32",
    "--seed",
    "0",
    "--no-progress",
    "--out",
    run_dir,
    *size,
]
print("$ minitensor " + " ".join(command[3:]).replace(run_dir, "RUN"))
done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
print(done.stdout[-2500:])
assert done.returncode == 0, f"minitensor train failed:\n{done.stderr[-3000:]}"
assert "scorer bilinear" in done.stdout, "the run must use the plugin's scorer"
accuracy = re.search(r"held-out exact match ([\d.]+)%", done.stdout)
assert accuracy, "the run must print its held-out accuracy"
heldout = [float(x) for x in re.findall(r"held-out loss ([\d.]+)", done.stdout)]
assert heldout[-1] < heldout[0], "the held-out loss must fall over the epochs"
print(f"held-out exact match with the bilinear scorer: {float(accuracy.group(1)):.1f}%")

# %% [markdown]
# ## Clean up
#
# Unregister what we registered: the registries forget `bilinear` at once, and a layer asked
# for it now gets an `UnknownPluginError` (a `KeyError`) listing what there is — asking for it
# is our last deliberate mistake.

# %%
mt.plugins.unregister(plugin)
assert "bilinear" not in mt.plugins.scorers()
with expect_error("asking for the scorer we just unregistered", KeyError) as caught:
    mt.nn.MultiHeadAttention(16, 2, scorer="bilinear")
assert type(caught.error).__name__ == "UnknownPluginError"
shutil.rmtree(site, ignore_errors=True)

# %% [markdown]
# ## Exercises
#
# 1. Write a **cosine** scorer with a temperature, $a(q, k) = \cos(q, k) / \tau$, run it
#    through `check_scorer` (what happens with an all-zero query? compare with
#    `plugins/example-cosine/minitensor_cosine.py`, whose scorer is `cosine_temperature`),
#    register it under a name of its own (`cosine` is taken: the built-in, which learns
#    $1/\tau$), and train the date task with it.
# 2. Start the bilinear $W$ at $I / \sqrt{d}$ when `query_size == key_size`, so that it begins
#    as the scaled dot product. Does the date task (`minitensor train --scorer bilinear`)
#    train faster than with the random start?
# 3. Write a **pooling** plugin (hook `minitensor_poolings`): e.g. a softmax with its own
#    temperature, or "top-2" attention that keeps the two best keys. Check it with
#    `minitensor.testing.check_pooling`. Which of its properties does the kit test that
#    yours might break?
#
# ## Where this lives in the engine
#
# - `minitensor/core/hookspecs.py`: the three hooks and the contracts of scorers, poolings and
#   positional encodings.
# - `minitensor/core/plugins.py`: the plugin manager, `register` / `unregister`, entry-point
#   loading, `check_options`, and the error messages we saw.
# - `minitensor/testing.py`: the conformance kit (`check_scorer`, `check_pooling`,
#   `check_positional_encoding`).
# - `plugins/minitensor_plugins/scorers.py`: the built-in scorers, registered the same way.
# - `plugins/example-cosine/`: a complete plugin distribution to copy.
# - `minitensor/core/nn/attention.py`: how `Attention` and `MultiHeadAttention` build a plugin
#   by name; `minitensor/cli.py` and `minitensor/train/`: `minitensor train --scorer`.
