# %% [markdown]
# # 4. 编写自己的评分函数插件
#
# 教程 3 介绍了 D2L 讲注意力评分函数的那一节中的两种评分函数：加性注意力和缩放点积注意力。这里
# 我们自己动手写一个新的评分函数，只需十几行，并让它成为 minitensor 中的一等公民：用契约检查
# 工具包（conformance kit）对照契约检查它，在程序运行时注册它，在 `mt.nn.MultiHeadAttention`
# 中按名称使用它，最后把它打包成一个可安装的小发行包，让 `minitensor train --scorer bilinear`
# 通过入口点（entry point）找到它。一路上我们会遇到插件作者常踩的两个 pluggy 陷阱，以及几个
# 看似合理的错误：每个错误都是故意犯的，在输出中以 `(deliberate mistake: ...)` 标明，
# 随后是 minitensor 对它给出的 `expected error`。
#
# 回顾 D2L 的定义。**注意力评分函数**（attention scoring function，简称**评分函数**，scoring
# function）$a(q, k)$ 把一个查询和一个键映射为一个实数，即**注意力评分**，其取值范围没有限制；
# 对键做 softmax，就把评分变成**注意力权重**（attention weight）$\alpha(q, k_i) \in [0, 1]$：
#
# $$\alpha(q, k_i) = \operatorname{softmax}(a(q, k_i)) = \frac{\exp(a(q, k_i))}{\sum_{j=1}^{m} \exp(a(q, k_j))},
# \qquad f(q) = \sum_{i=1}^{m} \alpha(q, k_i)\, v_i .$$
#
# 正如中文版 10.3 所说，“选择不同的注意力评分函数$a$会导致不同的注意力汇聚操作”：选择 $a$
# 就是全部的设计空间，这也正是 minitensor 把评分函数做成插件的原因。
#
# 参考：D2L 的注意力一章，中文版《动手学深度学习》（zh.d2l.ai）的 10.3 注意力评分函数，以及
# 英文版 *Dive into Deep Learning*（d2l.ai）的 11.3 "Attention Scoring Functions"；双线性评分
# 出自 Luong, Pham and Manning (2015), "Effective Approaches to Attention-based Neural Machine
# Translation"。插件系统：[pluggy](https://pluggy.readthedocs.io)。

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
from _tutorial import SMOKE, expect_error, figure_path, pick, text  # noqa: F401  （共用的辅助函数；text：按教程的语言给出图的标签）
from minitensor.plugins import PluginError, check_options

import minitensor as mt
from minitensor import hookimpl, hookspecs
from minitensor.testing import check_scorer
from minitensor.train.plots import show_heatmaps

TUTORIAL = "04_write_a_scorer_plugin"
mt.manual_seed(0)

# %% [markdown]
# ## 带温度的双线性评分函数
#
# 缩放点积 $q^\top k / \sqrt{d}$ 要求查询和键的长度同为 $d$；加性评分函数
# $w_v^\top \tanh(W_q q + W_k k)$ 接受不同的长度，但在归约之前要先构造一个 (…, Q, K, h) 的
# 张量。介于两者之间的是**双线性**（bilinear）评分（Luong 等人 2015 年称之为 "general"）
#
# $$a(q, k) = \frac{q^\top W k}{\tau}, \qquad q \in \mathbb{R}^{d_q},\; k \in \mathbb{R}^{d_k},\;
# W \in \mathbb{R}^{d_q \times d_k} \text{ learned},$$
#
# 它既接受不同的长度，*又*只是两次矩阵乘法：$(Q W) K^\top$。当 $W = I / \sqrt{d}$ 时，它又变回
# 缩放点积。**温度**（temperature）$\tau > 0$ 是一个选项：$\tau$ 小会拉大评分之间的差距，
# softmax 随之变尖锐，偏向最好的那个键；$\tau$ 大则把它压平，趋向平均汇聚。
#
# 每个评分函数都要遵守的契约（`minitensor/core/hookspecs.py`）：它是一个 `mt.nn.Module`，以
# `cls(query_size, key_size, **options)` 的方式构建，其 `forward(queries, keys)` 把形状为
# (…, Q, d_q) 的查询和 (…, K, d_k) 的键映射为 (…, Q, K) 的评分，而且前面可以有*任意*多个批量轴
# （多头注意力传入的是 (batch, num_heads, Q, d_head)）。选项以关键字参数传入；`check_options`
# 拒绝不认识的选项，所以像 `scorer_options={"temprature": 0.5}` 这样的拼写错误会报错，而不是
# 被悄悄忽略。


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
        # (..., Q, dq) @ (dq, dk) -> (..., Q, dk)；再 @ (..., dk, K)：每个查询都与每个键相遇
        return (queries @ self.W) @ keys.swapaxes(-1, -2) * (1.0 / self.temperature)

    def extra_repr(self):
        return f"temperature={self.temperature}"


scorer = BilinearScorer(4, 6, temperature=0.5)
q, k = mt.randn(2, 3, 4), mt.randn(2, 5, 6)
print(scorer, scorer(q, k).shape)
assert scorer(q, k).shape == (2, 3, 5), "scores are (..., Q, K)"

# %% [markdown]
# ## 对照契约检查：契约检查工具包
#
# 一个评分函数在我们试过的那一种形状上能用，放进多头注意力里却仍可能出错。
# `minitensor.testing.check_scorer` 用我们给出的选项构建这个类，并检查每个注意力层所依赖的
# 性质：有 0、1、2 个前导批量轴时的形状，float32 和 float64，没有 NaN，批量独立性（改变样本 1
# 不会改变其他任何样本），以及在 float64 下用 `mt.gradcheck` 检验对查询、键和每个参数（这里是
# $W$）的梯度。它返回 True，或者抛出一个指明被破坏性质的 AssertionError。

# %%
assert check_scorer(BilinearScorer, query_size=4, key_size=6, temperature=0.5)
assert check_scorer(BilinearScorer, query_size=5, key_size=5)  # 方阵 W，默认温度
print("BilinearScorer keeps the scorer contract")

# %% [markdown]
# 下面故意犯两个看似合理的错误，看看工具包怎么说。`keys.T` 看起来像 $K^\top$，在 (K, d) 矩阵上
# 也没问题，但对带批量轴的键，它会把*所有*轴都倒过来；按整个张量的均值（而不是逐行）把评分
# 中心化，则会悄悄地把一个批量中的各个样本混在一起。工具包必须拒绝这两者。


# %%
class TransposeEverything(BilinearScorer):
    def forward(self, queries, keys):
        return (queries @ self.W) @ keys.T  # 只对二维的键正确


class MixesTheBatch(BilinearScorer):
    def forward(self, queries, keys):
        scores = (queries @ self.W) @ keys.swapaxes(-1, -2)
        return scores - scores.mean()  # 对所有样本和所有头只取一个均值


with expect_error("keys.T on batched keys, checked by the conformance kit", AssertionError) as caught:
    check_scorer(TransposeEverything, query_size=4, key_size=6)
assert "TransposeEverything" in str(caught.error), "the kit names the scorer it rejects"
with expect_error("one mean over the whole batch, checked by the conformance kit", AssertionError) as caught:
    check_scorer(MixesTheBatch, query_size=4, key_size=6)
assert "batch independence" in str(caught.error), "the kit names the broken property"

# %% [markdown]
# ## 在程序运行时注册它
#
# minitensor 用 [pluggy](https://pluggy.readthedocs.io)（pytest 的插件系统）来发现插件。插件
# 可以是任何对象（一个模块、一个类的实例），其中的函数用 `@minitensor.hookimpl` 标记，且函数
# *名*是 `minitensor/core/hookspecs.py` 中列出的钩子：`minitensor_scorers`、`minitensor_poolings`、
# `minitensor_positional_encodings`。每个钩子都不接受参数，返回 `{name: class}`。
# `mt.plugins.register(plugin, name=...)` 立即加入插件（各注册表在下一次查找时重建），
# `mt.plugins.unregister` 则再把它移除。


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
# 从这里开始，凡是可以用内置评分函数名称的地方，都可以用 `"bilinear"`。在
# `mt.nn.MultiHeadAttention` 中，每个头都有自己的评分函数，按每个头的大小构建（查询和键都是
# num_hiddens / num_heads），看到的是形状为 (batch, num_heads, Q, d_head) 的张量；
# `scorer_options` 把温度传递进去。

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

# 拼错的选项会报错，并指出是哪个插件：
with expect_error("the option 'temprature' (misspelt)", TypeError) as caught:
    mt.nn.MultiHeadAttention(16, 2, scorer="bilinear", scorer_options={"temprature": 0.5})
assert "temprature" in str(caught.error), "the error names the unknown option"

# %% [markdown]
# ## 双线性评分函数能学到什么
#
# 查询和键的长度*不同*，正是 D2L 10.3 推荐加性注意力的情形（“当查询和键是不同长度的矢量时，
# 可以使用加性注意力作为评分函数”）：有八样东西，每样东西都用一个 4 维的查询描述一次，再用一个
# 6 维的键描述一次（同一个隐藏的单位向量 $z_i$ 的两种不同的线性视图，$q_i = A z_i$，
# $k_i = B z_i$）。注意力能学会把查询 $i$ 引向键 $i$ 吗？权重是关于 $W$ 线性的评分的 softmax，
# 所以最大化 $\log \alpha(q_i, k_i)$ 是一个凸问题，几百步 Adam 就能解决。我们训练一个按名称使用
# 我们的评分函数的单头 `mt.nn.Attention`。

# %%
rng = numpy.random.default_rng(0)
num_items = 8
z = rng.standard_normal((num_items, 3))
z /= numpy.linalg.norm(z, axis=1, keepdims=True)
queries = mt.tensor(z @ rng.standard_normal((3, 4)), dtype=mt.float32)  # (8, 4)
keys = mt.tensor(z @ rng.standard_normal((3, 6)), dtype=mt.float32)  # (8, 6)
values = mt.tensor(numpy.eye(num_items), dtype=mt.float32)  # 值 i = “第 i 样东西”：输出就是权重的那一行

attn = mt.nn.Attention("bilinear", "softmax", 0.0, query_size=4, key_size=6, scorer_options={"temperature": 1.0})
with mt.no_grad():
    attn(queries, keys, values)
before = attn.attention_weights.numpy()

optimizer = mt.optim.Adam(attn.parameters(), lr=0.1)
losses = []
for _ in range(300):
    weights = attn(queries, keys, values)  # (8, 8)：第 i 行 = 查询 i 看向哪里
    loss = -(weights.log() * values).sum() / num_items  # 以“键 i”为目标的交叉熵
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    losses.append(loss.item())
with mt.no_grad():
    attn(queries, keys, values)
after = attn.attention_weights.numpy()
attn.scorer.temperature = 0.25  # 选项只是普通的状态：训练之后，现在把温度调低
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
# 热图（第 $i$ 行 = 查询 $i$，第 $j$ 列 = 键 $j$）：训练前评分是随机的；训练后权重落在对角线上，
# 而更低的温度让它更加集中。

# %%
show_heatmaps(
    numpy.stack([before, after, colder])[None],
    xlabel=text("keys (6-dim)"),
    ylabel=text("queries (4-dim)"),
    titles=[text("before training"), text("trained, tau = 1"), text("trained, tau = 0.25")],
    path=figure_path(TUTORIAL, "bilinear_attention.png"),
)

# %% [markdown]
# ## 两个 pluggy 陷阱，以及 minitensor 的提示
#
# pluggy 把钩子实现与钩子**按名称、并按参数名**匹配起来，这会带来一些后果。
#
# **1. 拼错的钩子。** 名为 `minitensor_scorer`（少了 "s"）的函数根本不是钩子；pluggy 会注册它，
# 却永远不会调用它。minitensor 在每次注册之后都会运行 `pm.check_pending()`，所以这个拼写错误会
# 报错，并指出你可能想写的那个钩子（这里的拼写错误是故意的，报错也在意料之中）：


# %%
class Misspelt:
    @hookimpl
    def minitensor_scorer(self):  # 应为 minitensor_scorers
        return {"bilinear2": BilinearScorer}


with expect_error("a hook named minitensor_scorer, without the s", PluginError) as caught:
    mt.plugins.register(Misspelt(), name="misspelt")
assert "did you mean 'minitensor_scorers'" in str(caught.error), "the error names the hook meant"
assert not mt.plugins.get_plugin_manager().has_plugin("misspelt"), "a rejected plugin leaves nothing behind"

# %% [markdown]
# **2. 钩子只能用关键字参数调用**，pluggy 传给一个实现的，恰好是它的参数所命名的那些参数。所以
# 钩子中没有的参数会在注册时报错；但如果给这个参数一个**默认值**，pluggy 就会把它当作“不归我
# 填”：pluggy 本身会接受这个插件，而那个默认值会被永远使用下去，不管调用者本来想要什么。这就是
# 为什么钩子实现不能给参数设默认值，也是 minitensor 检查这一点的原因：这样的插件会被拒绝，并
# 给出说明原因的 `PluginError`（单用 pluggy 则会悄无声息地注册它）。


# %%
class ExtraParameter:
    @hookimpl
    def minitensor_scorers(self, temperature):  # 钩子没有这个参数
        return {"bilinear_cold": BilinearScorer}


with expect_error("a hook implementation with a parameter the hook does not have", PluginError) as caught:
    mt.plugins.register(ExtraParameter(), name="extra-parameter")
assert "temperature" in str(caught.error), "the error names the parameter"

seen = []


class WithDefault:
    @hookimpl
    def minitensor_scorers(self, temperature=0.1):  # 有默认值：悄无声息地永远不会被传入
        seen.append(temperature)
        return {"bilinear_cold": BilinearScorer}


with expect_error("a hook parameter with a default value", PluginError) as caught:
    mt.plugins.register(WithDefault(), name="with-default")
assert "default" in str(caught.error), "the error says what is wrong"
assert "bilinear_cold" not in mt.plugins.scorers(), "refused, and nothing left behind"

# 单用 pluggy 会怎样处理它：注册它，调用时不传这个参数。
bare = pluggy.PluginManager("minitensor")
bare.add_hookspecs(hookspecs)
bare.register(WithDefault())
bare.hook.minitensor_scorers()
print("under plain pluggy the hook ran with temperature =", seen[-1], "(its default: pluggy passed nothing)")
assert seen == [0.1]

# 自己调用钩子：只能用关键字参数。结果是每个插件一个答案。
hook = mt.plugins.get_plugin_manager().hook.minitensor_scorers
print(len(hook()), "plugins answer minitensor_scorers()")
with expect_error("calling a hook with a positional argument", TypeError):
    hook("positional")

# %% [markdown]
# ## 快速路径：声明你的评分函数是什么
#
# 对长序列，`mt.nn.MultiHeadAttention` 可以流式计算注意力（教程 10：FlashAttention 对键逐块的在线
# softmax），从不构造 (Q, K) 的注意力评分矩阵。这时评分由它自己计算，所以它必须知道评分就是
# `scale * q . k`：层不会从插件的名字去猜，而是读取插件**声明**的能力（`minitensor/core/hookspecs.py`
# 中的“capabilities”）。评分函数可以声明 `row_wise = True`（每个评分只来自一个查询和一个键：分组
# 的头因此可以整组一起打分），以及方法 `dot_scale(d_head)`，返回缩放系数（评分恰好是它乘以
# q . k）；汇聚可以声明 `softmax_like = True`。内置插件也用同样的方式声明。契约检查工具包会检查每
# 一项声明，所以错误的声明会在 `check_scorer` 中失败，而不是在模型里。我们的双线性评分函数不是
# 点积，也什么都没有声明：它走普通路径。


# %%
class DotOfMine(mt.nn.Module):
    """The scaled dot product once more, under a new name, declaring what it computes."""

    row_wise = True  # 每个评分只来自一个查询行和一个键行

    def __init__(self, query_size, key_size, **options):
        super().__init__()
        check_options(type(self), options)

    def forward(self, queries, keys):
        return queries @ keys.swapaxes(-1, -2) / math.sqrt(queries.shape[-1])

    def dot_scale(self, d_head):  # 评分恰好是 dot_scale * q . k
        return 1.0 / math.sqrt(d_head)


class DotOfMinePlugin:
    @hookimpl
    def minitensor_scorers(self):
        return {"dot_of_mine": DotOfMine}


assert check_scorer(DotOfMine)  # 工具包也会检查这些声明
mt.plugins.register(DotOfMinePlugin(), name="tutorial-dot-of-mine")
for name in ("scaled_dot", "dot_of_mine", "bilinear"):
    print(f"{name:12} streams: {mt.nn.MultiHeadAttention(32, 4, scorer=name).why_not_fused() or 'yes'}")

X = mt.randn(1, 64, 32)
outputs = {}
for name in ("scaled_dot", "dot_of_mine"):
    mt.manual_seed(1)  # 两个层用同样的权重
    layer = mt.nn.MultiHeadAttention(32, 4, scorer=name, fused=True)  # fused=True：流式计算，否则报错并说明原因
    outputs[name] = layer(X, X, X, causal=True).numpy()
numpy.testing.assert_allclose(outputs["dot_of_mine"], outputs["scaled_dot"], rtol=1e-5, atol=1e-6)
assert "does not declare dot_scale" in mt.nn.MultiHeadAttention(32, 4, scorer="bilinear").why_not_fused()
mt.plugins.unregister(name="tutorial-dot-of-mine")

# %% [markdown]
# ## 发布它：带入口点的插件包
#
# 运行时注册只在 Python 进程存活期间有效。要让 `bilinear` 对所有程序（包括 `minitensor`
# 命令行）都可用，就要把它放进一个发行包，并在 `"minitensor"` 组中声明一个**入口点**（entry
# point）；minitensor 在第一次查找注册表时加载这些入口点（`plugins/example-cosine/` 就是这样的
# 一个包，它的 `pyproject.toml` 中写着：
#
#     [project.entry-points.minitensor]
#     cosine = "minitensor_cosine"
#
# ）。对 `importlib.metadata` 而言，一个*已安装*的发行包无非就是路径上的一个模块，加上一个存放
# `METADATA` 和 `entry_points.txt` 的 `<name>-<version>.dist-info` 文件夹：也就是
# `pip install` 会留下的东西。我们把正好这些写进一个临时文件夹，评分函数写成模块
# `minitensor_bilinear.py`（即上面的类，再把它的钩子写成一个模块级函数）。

# %%
site = tempfile.mkdtemp(prefix="minitensor-bilinear-")
# 模块就是上面的类，一字不差（``inspect.getsource``），前面是它所需的导入，后面是它的钩子。
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
    f.write("[minitensor]\nbilinear = minitensor_bilinear\n")  # 先是组，然后是 名称 = 模块
for root, _, files in os.walk(site):
    for name in files:
        print(os.path.relpath(os.path.join(root, name), site))

# %% [markdown]
# 现在，一个把该文件夹放在 `PYTHONPATH` 上的新进程就能看到这个插件，并列出它来自哪个发行包。
# `MINITENSOR_STRICT_PLUGINS=1` 让加载失败的插件报错而不只是警告，这正是插件作者想要的。
# （`python -m minitensor` 就是 `minitensor` 命令，由当前这个解释器运行。）

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
# 整个训练流程也都会用到它：`minitensor train --scorer bilinear --scorer-opt temperature=0.5`
# 构建一个编码器－解码器 Transformer，每个块的每个头都使用双线性注意力，在序列反转任务上训练它，
# 并报告留出集上的精确匹配率。在冒烟测试模式下，规模很小，只是为了说明它能在另一个进程中端到端
# 地运行；在我们的机器上，完整规模的运行（4 个迭代周期，几秒钟）能把每个留出序列都正确反转。

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
# ## 清理
#
# 注销我们注册的插件：各注册表会立即忘掉 `bilinear`，此时再向层请求它，就会得到一个列出现有
# 插件的 `UnknownPluginError`（一种 `KeyError`）——请求它是我们最后一个故意犯的错误。

# %%
mt.plugins.unregister(plugin)
assert "bilinear" not in mt.plugins.scorers()
with expect_error("asking for the scorer we just unregistered", KeyError) as caught:
    mt.nn.MultiHeadAttention(16, 2, scorer="bilinear")
assert type(caught.error).__name__ == "UnknownPluginError"
shutil.rmtree(site, ignore_errors=True)

# %% [markdown]
# ## 练习
#
# 1. 写一个带温度的**余弦**评分函数 $a(q, k) = \cos(q, k) / \tau$，用 `check_scorer` 检查它
#    （全零的查询会怎样？与 `plugins/example-cosine/minitensor_cosine.py` 比较，其中的评分函数
#    是 `cosine_temperature`），用它自己的名称注册它（`cosine` 已被占用：那是内置的评分函数，
#    它学习 $1/\tau$），并用它训练日期任务。
# 2. 当 `query_size == key_size` 时，让双线性的 $W$ 从 $I / \sqrt{d}$ 开始，使它一开始就是缩放
#    点积。日期任务（`minitensor train --scorer bilinear`）会比随机初始化训练得更快吗？
# 3. 写一个**汇聚**插件（钩子 `minitensor_poolings`）：例如带自己温度的 softmax，或者只保留最好
#    的两个键的 “top-2” 注意力。用 `minitensor.testing.check_pooling` 检查它。工具包测试的哪些
#    性质可能被你的插件破坏？
#
# ## 它在引擎中的位置
#
# - `minitensor/core/hookspecs.py`：三个钩子，以及评分函数、汇聚和位置编码的契约。
# - `minitensor/core/plugins.py`：插件管理器、`register` / `unregister`、入口点的加载、
#   `check_options`，以及我们见到的那些错误信息。
# - `minitensor/testing.py`：契约检查工具包（`check_scorer`、`check_pooling`、
#   `check_positional_encoding`）。
# - `plugins/minitensor_plugins/scorers.py`：内置的评分函数，以同样的方式注册。
# - `plugins/example-cosine/`：一个可以照抄的完整插件发行包。
# - `minitensor/core/nn/attention.py`：`Attention` 和 `MultiHeadAttention` 如何按名称构建插件；
#   `minitensor/cli.py` 和 `minitensor/train/`：`minitensor train --scorer`。
