# %% [markdown]
# # 1. 注意力提示：查询、键和值
#
# 注意力从何而来？本节先用心理学的语言讲述它，再看这些概念如何变成三个张量：**查询**、**键**和**值**。
# 读完本节，我们会得到一个注意力层（`mt.nn.Attention`），让它在桌上的五件物品中做出选择，
# 并画出此后每个教程都会出现的注意力权重热图。
#
# 参考资料：D2L 的注意力机制一章，中文版《动手学深度学习》（zh.d2l.ai）的
# 10.1 注意力提示，以及英文版 *Dive into Deep Learning*（d2l.ai）的 11.1
# "Queries, Keys, and Values"。英文版 11.1 把查询、键、值的思想讲成在数据库中的一次“软”查找；
# 下面关于两种提示的故事出自中文版 10.1，它译自英文版较早的一节“Attention Cues”。
# 术语第一次出现时，我们按中文版的写法给出，并附上英文；全部术语的对照见
# [`tutorials/GLOSSARY.md`](../GLOSSARY.md)。

# %%
import numpy
from _tutorial import SMOKE, figure_path, pick, text  # noqa: F401  （各教程共用的辅助工具；text()：按教程的语言给出图中的标签）
from matplotlib.figure import Figure  # 不经过 pyplot 的 Figure：不弹出窗口，没有全局状态

import minitensor as mt
from minitensor.train.plots import show_heatmaps

TUTORIAL = "01_attention_cues"
mt.manual_seed(0)

# %% [markdown]
# ## 两种提示
#
# 注意力是稀缺的资源：我们无法同时看清一切，只能有所*选择*。心理学用一个
# **双组件（two-component）的框架**来描述这种选择，它可以追溯到 19 世纪 90 年代的威廉·詹姆斯
# （William James）。在这个框架中，受试者同时基于两种提示有选择地引导注意力：
#
# - **非自主性提示**（non-volitional cue）：环境中物体的突出性和易见性，它们自己就能吸引注意力；
# - **自主性提示**（volitional cue）：我们*想要*什么，这样的选择受到了认知和意识的控制。
#
# D2L 的例子（10.1）：我们面前有五件物品，一份报纸、一篇研究论文、一杯咖啡、一本笔记本和一本书。
# 所有纸制品都是黑白印刷的，而咖啡杯是**红色**的。红色的咖啡杯格外突出，我们一眼就注意到了它：
# 这是非自主性提示。喝过咖啡之后，我们精神振奋，想要读书，于是*有意地*去找那本书：
# 这是自主性提示。
#
# 下面把这张桌子写成数字。每件物品用五个特征来描述（看起来是不是红色的、有没有印刷文字、
# 能不能喝、有没有装订、页面是不是空白的）；这些描述就是物品拿出来供匹配的东西，即它们的**键**。

# %%
objects = ["newspaper", "research paper", "coffee cup", "notebook", "book"]
features = ["red", "printed", "drinkable", "bound", "blank pages"]
keys = numpy.array(
    [
        # 红色 印刷 可喝 装订 空白
        [0.0, 1.0, 0.0, 0.0, 0.0],  # 报纸
        [0.0, 1.0, 0.0, 0.5, 0.0],  # 研究论文（用订书钉订着：算是有点装订）
        [1.0, 0.0, 1.0, 0.0, 0.0],  # 咖啡杯，唯一的红色物品
        [0.0, 0.0, 0.0, 1.0, 1.0],  # 笔记本
        [0.0, 1.0, 0.0, 1.0, 0.0],  # 书
    ],
    dtype=numpy.float32,
)

# %% [markdown]
# 非自主性提示不需要任何意图：吸引目光的是突出性，这里就是红色。用 softmax 把每件物品的突出程度
# 变成它被看到的概率，$\alpha_i = \exp(s_i) / \sum_j \exp(s_j)$，其中 $s_i$ 是物品 $i$
# 的“红色程度”乘以一个强度（取 3，它决定了红色的吸引力有多强）：

# %%
saliency = 3.0 * keys[:, features.index("red")]
glance = mt.softmax(mt.tensor(saliency)).numpy()
for name, a in zip(objects, glance):
    print(f"{name:>15}: {a:.3f}")
assert objects[int(glance.argmax())] == "coffee cup", "the salient red cup must draw the glance"
assert abs(glance.sum() - 1.0) < 1e-6, "a softmax over the objects sums to 1"

# %% [markdown]
# ## 查询、键和值
#
# 全连接层、最大汇聚层或平均汇聚层，以及卷积层，都只使用非自主性提示：它们对输入做什么，只取决于输入本身。
# 全连接层对任何到来的输入都施加同一个训练好的 $W$；最大汇聚传递最大的激活值（最突出的那个），
# 平均汇聚则把所有激活值同等对待，它们都没有一个输入用来表达“我在找什么”。注意力增加的正是自主性提示，
# 用 D2L 的话说：“是否包含自主性提示”将注意力机制与全连接层或汇聚层区别开来。
#
# 在注意力机制（attention mechanism）中：
#
# - 自主性提示是**查询**（query，$q$）；
# - 非自主性提示是**键**（key，$k_i$），每个键都与一个**值**（value，$v_i$）配对，值就是
#   **感官输入**（sensory inputs）本身：键和值是成对的，构成**键值对**；
# - **注意力汇聚**（attention pooling）把查询和键结合起来，从而实现对值的**选择倾向**：
#
# $$f\big(q, (k_1, v_1), \ldots, (k_n, v_n)\big) = \sum_{i=1}^n \alpha(q, k_i)\, v_i,
# \qquad \alpha(q, k_i) \ge 0,\ \sum_i \alpha(q, k_i) = 1 .$$
#
# 输出是值的**加权平均**，**注意力权重**（attention weight）$\alpha(q, k_i)$ 说明查询从每个值中取了多少。
# 不同的注意力机制，区别就在于 $\alpha$ 的计算方式（教程 2 和教程 3）。
#
# 这里的键就是上面对物品的描述；值是我们从每件物品*看到*的东西（一个表示“哪件物品”的独热向量，
# 这样输出直接告诉我们每件物品各有多少到达了眼睛）；查询是意图，用同样的五个特征来写
# （第一个查询“心中无所求”只对红色有反应：它就是上面的一瞥，只不过写成了查询）。
# 我们用点积 $a(q, k) = q^\top k$ 给每一对评分，再用 softmax 做汇聚，也就是使用评分插件 `dot`
# 和汇聚插件 `softmax` 的注意力层 `mt.nn.Attention`。

# %%
intentions = ["(nothing in mind)", "I want coffee", "I want to read", "I want to take notes"]
queries = 3.0 * numpy.array(
    [
        [1.0, 0.0, 0.0, 0.0, 0.0],  # 没有意图：只有眼睛对红色的感知在起作用
        [0.0, 0.0, 1.0, 0.0, 0.0],  # 想找能喝的东西
        [0.0, 1.0, 0.0, 1.0, 0.0],  # 想找印刷且装订的东西
        [0.0, 0.0, 0.0, 1.0, 1.0],  # 想找装订好的空白页
    ],
    dtype=numpy.float32,
)
values = numpy.eye(len(objects), dtype=numpy.float32)  # 到达眼睛的东西：物品 i 本身

attention = mt.nn.Attention(scorer="dot", pooling="softmax", dropout=0.0, query_size=5, key_size=5)
with mt.no_grad():
    seen = attention(mt.tensor(queries), mt.tensor(keys), mt.tensor(values))
weights = attention.attention_weights.numpy()  # （4 个查询，5 个键）
for intention, row in zip(intentions, weights):
    print(f"{intention:>22}: looks at the {objects[int(row.argmax())]} (weight {row.max():.2f})")

# %% [markdown]
# 每一行权重都是五件物品上的一个概率分布；又因为值是独热向量，输出 $f(q)$ *就是*这一行权重。
# 查询改变了被选中的物品：

# %%
assert numpy.allclose(weights.sum(axis=1), 1.0, atol=1e-6), "each query's weights sum to 1"
assert numpy.allclose(seen.numpy(), weights, atol=1e-6), "one-hot values: the output is the weight row"
chosen = [objects[i] for i in weights.argmax(axis=1)]
assert chosen == ["coffee cup", "coffee cup", "book", "notebook"], chosen

# %% [markdown]
# 现在换一个*没有*自主性提示的层来看同一张桌子。汇聚插件 `average` 忽略评分（因而也忽略查询）：
# 每个键都得到 $1/n$。不管我们想要什么，它给出的都是五件物品的同一种混合。这就是平均汇聚，
# 一个只使用输入自身所提供信息的层。D2L：平均汇聚层可以被视为输入的加权平均值，其中各输入的权重是一样的。

# %%
pooling_only = mt.nn.Attention(scorer="dot", pooling="average", dropout=0.0, query_size=5, key_size=5)
with mt.no_grad():
    blended = pooling_only(mt.tensor(queries), mt.tensor(keys), mt.tensor(values)).numpy()
print(blended.round(3))
assert numpy.allclose(blended, blended[0], atol=1e-7), "without a query every intention sees the same"
assert numpy.allclose(blended, 1 / len(objects)), "average pooling: weight 1/n on every value"

# %% [markdown]
# 把两者画在一张图里：权重画成柱状图，每个意图一个子图；最左边是“没有意图”时的一瞥
# （只有红色咖啡杯的突出性在起作用），最右边是与查询无关的平均。

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
# > **一个常见的误解：“注意力用自主性提示取代了非自主性提示”**
# >
# > 关于两种提示的故事常被概括为“全连接层和汇聚层考虑的是非自主性提示，注意力机制考虑的是自主性提示”。
# > 这是一种简化的说法，而且容易误导人：注意力层仍然使用非自主性提示，也就是键。D2L 的表述更严谨：
# > 注意力的不同之处在于它*包含*了自主性提示，而注意力汇聚把它与键*结合*在一起，
# > 即将查询（自主性提示）和键（非自主性提示）结合在一起（10.1 中查询、键、值示意图的图注），
# > 从而实现对值（感官输入）的选择倾向。minitensor 正是这样实现的：每个评分函数都同时是两者的函数，
# > 即 `score(q, k)`（`plugins/minitensor_plugins/scorers.py`），而一个两者都不看的汇聚（`average`）
# > 得到的就是上面那个与查询无关的层。

# %% [markdown]
# ## 注意力的可视化：热图
#
# 注意力权重是一个矩阵（每个查询一行，每个键一列），可以画成热图，即 D2L 的 `show_heatmaps`
# （`minitensor.train.plots.show_heatmaps`，它接受形状为 `(num_rows, num_cols, Q, K)`
# 的数组，画出一个由多个子图组成的网格）。D2L 的第一个例子是单位矩阵：每个查询把全部权重
# 给了下标相同的那个键，其他键一点也没有。

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
# 上面桌上物品的权重也是这样一个矩阵，4 个意图乘以 5 件物品：查询决定选中哪一列。

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
# 这样的矩阵也可以由真实的查询和键算出来。在一条直线上的位置 $0, 1, \ldots, 9$ 处放十个键，
# 在同样的位置放十个查询，按两者的远近给每一对评分，$a(q, k) = -\tfrac12 \big((q - k)\,w\big)^2$：
# 这就是下一个教程的高斯核，在这里写成评分插件 `parametric_gaussian`，并把它的参数 $w$
# （宽度的*倒数*）固定下来。$w$ 小时，每个查询的注意力分散到邻近的键上；$w$ 大时，注意力集中在
# 与查询位置相同的那个键上，权重也就趋近于单位矩阵。

# %%
positions = mt.arange(10, dtype=mt.float32).reshape(10, 1)  # 10 个大小为 1 的查询（同时也是键）
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
# 热图的读法：第 $i$ 行是查询 $i$，第 $j$ 列是键 $j$，颜色表示 $\alpha(q_i, k_j)$，每一行之和为 1。
# 此后每个教程都会画这样的图：核回归（教程 2）、带掩蔽和不带掩蔽的评分函数（教程 3）、
# 多头注意力的每一个头（教程 5），以及 Transformer 内部的三种注意力（教程 7）。
#
# ## 小结
#
# - 人类的注意力结合了非自主性提示（突出性）和自主性提示（意图）。
# - 全连接层、卷积层和汇聚层只使用非自主性提示。
# - 注意力机制加入了自主性提示：查询（自主性提示）与键（非自主性提示）相遇，
#   注意力汇聚实现对与键配对的值（感官输入）的选择倾向。
# - 注意力权重构成一个矩阵，行对应查询，列对应键，可以画成热图。

# %% [markdown]
# ## 练习
#
# 1. 在桌上放一本红色的笔记本（把它的“红色”特征设为 1）。权重的哪些行会变，哪些不会，为什么？
#    这说明了一个与任何意图都不匹配的突出物体会怎样？
# 2. 把查询乘以 0.3 而不是 3。权重会怎样变化？一个全为零的查询会得到什么？（与 `average` 汇聚比较。）
# 3. 在机器翻译中，解码器关注源语句中的词。在那里，什么充当查询，什么充当键和值？
#    （教程 7 会画出这些权重。）
#
# ## 在引擎中的位置
#
# - `minitensor/core/nn/attention.py`：`Attention`，包括评分函数、汇聚、暂退法以及对值的加权和；
#   它保存 `attention_weights`，供画图使用。
# - `plugins/minitensor_plugins/scorers.py`：评分插件 `dot` 和 `parametric_gaussian`。
# - `plugins/minitensor_plugins/poolings.py`：汇聚插件 `softmax` 和 `average`。
# - `minitensor/core/ops/softmax.py` 和 `minitensor/core/kernels/cpu.py`：softmax 本身。
# - `minitensor/train/plots.py`：`show_heatmaps`。
