# %% [markdown]
# # 2. 注意力汇聚：Nadaraya-Watson 核回归
#
# 教程 1 把注意力写成了 $f(q) = \sum_i \alpha(q, k_i)\, v_i$。这里是它最古老的可用实例，
# 出自 20 世纪 60 年代：**Nadaraya-Watson核回归**（Nadaraya-Watson kernel regression）。
# 我们用三种方法拟合一个带噪声的一维函数——平均汇聚、使用核的非参数注意力汇聚，以及只有一个
# 可学习参数 $w$ 的带参数注意力汇聚——逐个公式地跟随 D2L，并观察预测结果和它们背后的注意力权重。
#
# 下面的一切都来自 `minitensor/nadaraya_watson.py`：它用评分函数插件和汇聚插件把每种方法
# 搭建成一个 `mt.nn.Attention` 层。阅读本教程时，不妨对照着它看。
#
# 参考：D2L 的注意力一章，中文版《动手学深度学习》（zh.d2l.ai）的
# 10.2 注意力汇聚：Nadaraya-Watson 核回归，以及英文版 *Dive into Deep Learning*（d2l.ai）的
# 11.2 "Attention Pooling by Similarity"。两个版本提供了不同的部分。中文版 10.2 提供了全文使用的
# 数据集、平均汇聚、高斯核，以及带参数的汇聚和它的留一法训练。英文版 11.2 提供了四种核、四种
# 带宽下的高斯核，以及这个估计器收敛所需的条件；它使用自己的数据，并把学习带宽留作练习。
# 把每种核都画在每种带宽下，则是本教程自己的组合。这个估计器出自 Nadaraya (1964),
# "On Estimating Regression" 和 Watson (1964), "Smooth Regression Analysis"；英文版 11.2
# 引用的收敛性结果是 Mack and Silverman (1982), "Weak and Strong Uniform Consistency of
# Kernel Regression Estimates"。

# %%
import numpy
from _tutorial import SMOKE, figure_path, pick, text  # noqa: F401  （共用的辅助函数；text：按教程的语言给出图的标签）
from matplotlib.figure import Figure  # 不经过 pyplot 的 Figure：没有窗口，没有全局状态

import minitensor as mt
from minitensor import nadaraya_watson as nw
from minitensor.train.plots import show_heatmaps

TUTORIAL = "02_attention_pooling"
SEED = 0


def draw_fit(ax, data, prediction, title):
    """Truth, noisy training samples and one prediction curve on one axes."""
    ax.plot(data.x_test, data.y_truth, label=text("truth  $2\\sin x + x^{0.8}$"))
    ax.plot(data.x_test, prediction.y_hat, "--", label=text("prediction"))
    ax.plot(data.x_train, data.y_train, "o", alpha=0.5, markersize=4, label=text("training samples"))
    ax.set_title(title, fontsize="medium")
    ax.set_xlim(0, 5)
    ax.set_ylim(-1, 5)


# %% [markdown]
# ## 数据：键、值和查询
#
# 采用中文版 10.2 的回归问题：从 $[0, 5)$ 中均匀抽取 $n = 50$ 个训练输入 $x_i$（排好序，
# 这样下面的热图会显示出一条带），输出为
#
# $$y_i = 2 \sin(x_i) + x_i^{0.8} + \epsilon, \qquad \epsilon \sim \mathcal N(0, 0.5^2).$$
#
# （英文版 11.2 抽取的是 40 个点，函数为 $2 \sin(x_i) + x_i + \epsilon$，其中 $\epsilon \sim
# \mathcal N(0, 1)$；本教程所有的图都使用上面的数据。）
#
# 用注意力的语言来说，训练输入是**键**（key）$k_i = x_i$，训练输出是**值**（value）
# $v_i = y_i$（二者构成键值对），而每个需要预测的测试输入 $x = 0, 0.1, \ldots, 4.9$
# 都是一个**查询**（query）$q$。`nw.make_data` 用一个随机种子生成全部数据。

# %%
data = nw.make_data(n_train=50, noise=0.5, seed=SEED)
print(f"{len(data.x_train)} key-value pairs, {len(data.x_test)} queries")
assert (numpy.diff(data.x_train) >= 0).all(), "the keys come sorted"

# %% [markdown]
# ## 平均汇聚
#
# 最简单的汇聚没有任何参数，也不理会查询：在任何地方都预测全部训练输出的平均值，
#
# $$f(q) = \frac{1}{n} \sum_{i=1}^n v_i .$$
#
# 这就是**平均汇聚**（average pooling，D2L 所说的“最简单的估计器”）：注意力权重
# $\alpha(q, k_i) = 1/n$ 既与 $q$ 无关，也与 $k_i$ 无关——预测是一条水平线。在 minitensor
# 中它是 `average` 汇聚插件，它不理会评分函数给出的任何评分。

# %%
average = nw.average_pooling(data)
mse_average = nw.mse(average, data)
print(f"average pooling: mse {mse_average:.3f}")
assert numpy.allclose(average.y_hat, data.y_train.mean(), atol=1e-5), "f(q) = mean of the values"
assert numpy.allclose(average.attention_weights, 1 / len(data.x_train)), "every weight is 1/n"

# %% [markdown]
# ## 非参数注意力汇聚
#
# 更好的想法是按键与查询的接近程度为每个值加权。Nadaraya (1964) 和 Watson (1964) 提出了
#
# $$f(q) = \sum_{i=1}^{n} \frac{K(q - k_i)}{\sum_{j=1}^n K(q - k_j)}\, v_i
#        = \sum_{i=1}^n \alpha(q, k_i)\, v_i ,$$
#
# 其中 $K$ 是一个**核**（kernel）：查询与键接近时取值大、相距远时取值小的函数。（D2L 写作
# $K(q - k_i)$，即差值的函数；一般而言，核是查询与某一个键的函数 $K(q, k_i)$——后面的提示框
# 还会谈到这一点。）这就是**非参数注意力汇聚**（nonparametric attention pooling）：没有任何
# 需要学习的东西，数据本身就是模型。这些权重非负且和为 1，正如注意力权重所必须满足的
# （$\alpha(q, k_i) \ge 0$，$\sum_i \alpha(q, k_i) = 1$）；键离查询越近，它所对应的值的权重
# 就越大——这个值得到的*注意力*就越多。
#
# 使用**高斯核**（Gaussian kernel）$K(u) = \frac{1}{\sqrt{2\pi}} \exp(-\frac{u^2}{2})$ 时，
# 常数 $1/\sqrt{2\pi}$ 在分子和分母之间相互抵消，这个比值就是一个 softmax：
#
# $$f(q) = \sum_{i=1}^{n} \frac{\exp(-\frac12 (q - k_i)^2)}{\sum_{j=1}^{n} \exp(-\frac12 (q - k_j)^2)}\, v_i
#        = \sum_{i=1}^{n} \mathrm{softmax}\big(-\tfrac12 (q - k_i)^2\big)\, v_i .$$
#
# 所以核回归就是以 $a(q, k) = -\frac12 (q - k)^2$ 为**评分**（score）、再接一个 softmax 的
# 注意力。minitensor 正是这样计算的：一个评分函数插件给出 $\log K(q - k)$，`softmax` 汇聚再把它
# 变成 $K / \sum K$（因为 $\mathrm{softmax}(\log K) = K / \sum K$）。

# %%
gaussian = nw.nadaraya_watson(data, kernel="gaussian", width=1.0)
mse_gaussian = nw.mse(gaussian, data)
print(f"Nadaraya-Watson, Gaussian kernel: mse {mse_gaussian:.3f}   (average pooling: {mse_average:.3f})")

# 手工算出同样的权重，并保留核的 1/sqrt(2 pi)：它在比值中抵消。
K = numpy.exp(-0.5 * (data.x_test[:, None] - data.x_train[None, :]) ** 2) / numpy.sqrt(2 * numpy.pi)
by_hand = K / K.sum(axis=1, keepdims=True)
assert numpy.abs(gaussian.attention_weights - by_hand).max() < 1e-5, "softmax(-(q-k)^2/2) = K / sum K"
assert numpy.allclose(gaussian.attention_weights.sum(axis=1), 1.0, atol=1e-5), "weights rows sum to 1"
assert (gaussian.attention_weights >= 0).all(), "weights are non-negative"
# 键越近，权重越大：每一行按 |q - k| 排序后，权重从不上升。
distance = numpy.abs(data.x_test[:, None] - data.x_train[None, :])
by_distance = numpy.take_along_axis(gaussian.attention_weights, numpy.argsort(distance, axis=1), axis=1)
assert (numpy.diff(by_distance, axis=1) <= 1e-7).all(), "a closer key never gets less weight"
assert mse_gaussian < mse_average, "weighing by closeness beats the flat average"

# %% [markdown]
# 下面是预测结果和它们背后的注意力权重：第 $j$ 行是测试查询 $x_j$，第 $i$ 列是训练键 $x_i$。
# 两个轴都已排序，所以权重落在沿对角线的一条带上——每个查询看的都是它附近的训练点。平均汇聚的
# 热图则是均匀的一种颜色：每个查询对所有训练点一视同仁。

# %%
fig = Figure(figsize=(10, 3.6), layout="constrained")
ax_avg, ax_nw = fig.subplots(1, 2, sharey=True)
draw_fit(ax_avg, data, average, text("average pooling (mse {mse:.2f})", mse=mse_average))
draw_fit(ax_nw, data, gaussian, text("Nadaraya-Watson, Gaussian kernel (mse {mse:.2f})", mse=mse_gaussian))
ax_avg.legend(fontsize="small", loc="upper right")
fig.savefig(figure_path(TUTORIAL, "average_vs_gaussian.png"), dpi=100)

show_heatmaps(
    numpy.stack([average.attention_weights, gaussian.attention_weights])[None],
    xlabel=text("Sorted training inputs (keys)"),
    ylabel=text("Sorted test inputs (queries)"),
    titles=[text("average pooling"), text("Gaussian kernel")],
    figsize=(8, 4.2),
    path=figure_path(TUTORIAL, "weights_average_gaussian.png"),
)

# %% [markdown]
# ## 其他的核，其他的带宽
#
# 任何核都可以。英文版 11.2 画出了四种：高斯核、boxcar 核（矩形窗）、常数核和 Epanechikov 核
# （沿用该书的拼写）。这里每种核都是缩放后的距离 $u = |q - k| / h$ 的函数，其中**带宽**
# （bandwidth）$h > 0$ 就是核的宽度（width，即代码里的 `width=` 选项），它决定离查询多远的键
# 仍然算数；英文版 11.2 画的是 $h = 1$ 的情形。对高斯核而言，$h$ 就是标准差，也就是英文版 11.2
# 的 $\exp\big(-\|q - k\|^2 / (2\sigma^2)\big)$ 中的 $\sigma$。
#
# | 核 | $K(u)$ | 评分 $\log K(u)$ |
# |---|---|---|
# | gaussian | $\exp(-u^2/2)$ | $-u^2/2$ |
# | boxcar | $u < 1$ 时为 $1$，否则为 $0$ | $0$ 或 $-\infty$ |
# | epanechnikov（D2L 的定义） | $\max(0, 1 - u)$ | $\log(1 - u)$ 或 $-\infty$ |
# | constant | $1$ | $0$ |
#
# 在 minitensor 中，它们是同一个评分函数插件 `kernel`，带有选项 `kernel=` 和 `width=`。
# 评分为 $-\infty$ 表示“在核的支撑集之外”：softmax 给这个键的权重恰好是 0。先来看这些核本身：

# %%
u = numpy.linspace(-2.5, 2.5, 501, dtype=numpy.float32)
KernelScorer = mt.plugins.lookup("scorer", "kernel")  # 以名称 "kernel" 注册的类
scorer = {name: KernelScorer(1, 1, kernel=name) for name in nw.KERNELS}  # query_size = key_size = 1
fig = Figure(figsize=(12, 2.6), layout="constrained")
for ax, name in zip(fig.subplots(1, len(nw.KERNELS), sharey=True), nw.KERNELS):
    with mt.no_grad():  # K(u) = exp(score(u, 0))：一个查询 u 对唯一的键 0
        kernel_values = scorer[name](mt.tensor(u.reshape(-1, 1)), mt.zeros(1, 1)).exp().numpy().ravel()
    ax.plot(u, kernel_values)
    ax.set_title(text(name), fontsize="medium")  # 核的名称：minitensor 自带的标签
    ax.set_xlabel("$u = q - k$")
fig.savefig(figure_path(TUTORIAL, "kernels.png"), dpi=100)

# %% [markdown]
# 接着看带宽。英文版 11.2 只对高斯核改变带宽，取 $\sigma = 0.1, 0.2, 0.5, 1$；这里把每种核都
# 分别画在这四个带宽 $h$ 下，这张网格图是本教程自己的组合。窄的核（$h$ 小）只相信最近的几个
# 训练点，会跟着噪声走；宽的核（$h$ 大）在很长一段范围内求平均，把曲线压平；而常数核无论带宽
# 多大，都又回到了平均汇聚。

# %%
grid = nw.compare_kernels(data)  # {(kernel, width): Prediction}
fig = Figure(figsize=(12, 9), layout="constrained")
axes = fig.subplots(len(nw.KERNELS), len(nw.WIDTHS), sharex=True, sharey=True)
for (kernel, width), prediction in grid.items():
    ax = axes[nw.KERNELS.index(kernel), nw.WIDTHS.index(width)]
    title = text("{kernel}, h = {width}: mse {mse:.3f}", kernel=text(kernel), width=width, mse=nw.mse(prediction, data))
    draw_fit(ax, data, prediction, title)
fig.savefig(figure_path(TUTORIAL, "kernel_grid.png"), dpi=80)

for (kernel, width), prediction in grid.items():
    print(f"{kernel:>13}, width {width:<4}: mse {nw.mse(prediction, data):.3f}")

# %% [markdown]
# 这张网格图显示了两件事，代码也保证了它们。带宽为 0.1 的 boxcar 核或 epanechnikov 核，可能在
# 某个查询够得着的范围内*一个*训练点也找不到：所有评分都是 $-\infty$，公式会变成 0 除以 0。
# minitensor 的 softmax 给这样的一行全零的权重（预测值为 0：即 $h = 0.1$ 时 boxcar 和
# epanechnikov 子图中跌到零的地方），而绝不会给出 NaN——教程 3 会解释原因。
# 另外，常数核与平均汇聚的结果完全相同。

# %%
for (kernel, width), prediction in grid.items():
    sums = prediction.attention_weights.sum(axis=1)
    assert not numpy.isnan(prediction.attention_weights).any(), f"{kernel}, {width}: no NaN"
    assert numpy.all((numpy.abs(sums - 1) < 1e-5) | (sums == 0)), f"{kernel}, {width}: rows sum to 1 or are empty"
empty = (grid["boxcar", 0.1].attention_weights.sum(axis=1) == 0).sum()
print(f"boxcar, width 0.1: {empty} of {len(data.x_test)} queries have no training point within reach")
for width in nw.WIDTHS:
    assert numpy.allclose(grid["constant", width].y_hat, average.y_hat, atol=1e-5), "constant kernel = average"

# %% [markdown]
# ### 数据足够多时，非参数汇聚会收敛
#
# D2L 把这称为非参数 Nadaraya-Watson核回归的**一致性**（consistency）。中文版 10.2 说：
# “如果有足够的数据，此模型会收敛到最优结果”；英文版 11.2 给出了为此所需的条件：随着数据增多，
# 核必须变窄。确切地说，有 $n$ 个训练点时，带宽必须缩小，$h \to 0$，但又要缩小得足够慢，使
# $n h \to \infty$，这样每个查询够得着的键才会越来越多。带宽固定时，估计收敛到的只是真实函数
# 的一个平滑版本，而不是函数本身；带宽若像 $1/n$ 那样快地缩小，够得着的键数始终有界，它们的
# 噪声就永远平均不掉。这里没有任何需要学习的东西，所以一切改进都只能来自更多的键和值：采用
# 经典的选择 $h \propto n^{-1/5}$（它同时满足这两个条件），相对真实函数的误差就会趋于零。

# %%
sizes = pick((50, 500, 5_000, 50_000), (50, 500, 5_000))
errors = []
for n in sizes:
    big = nw.make_data(n_train=n, seed=SEED)
    errors.append(nw.mse(nw.nadaraya_watson(big, "gaussian", width=0.3 * (n / 50) ** -0.2), big))
    print(f"n = {n:>6}: width {0.3 * (n / 50) ** -0.2:.3f}, mse {errors[-1]:.4f}")
assert errors[-1] < errors[0] / 4, "more data, smaller error"

fig = Figure(figsize=(4.5, 3.2), layout="constrained")
ax = fig.subplots()
ax.loglog(sizes, errors, "o-")
ax.set_xlabel(text("training points n"))
ax.set_ylabel(text("mse against the truth"))
ax.set_title(text("Gaussian kernel, width $0.3\\,(n/50)^{-1/5}$"), fontsize="medium")
fig.savefig(figure_path(TUTORIAL, "convergence.png"), dpi=100)

# %% [markdown]
# ## 带参数注意力汇聚
#
# 非参数汇聚的带宽是手工定下的。**带参数注意力汇聚**（parametric attention pooling）让数据
# 来选择它：在高斯核内部，把查询与键之间的距离乘以一个可学习参数$w$，
#
# $$f(q) = \sum_{i=1}^{n} \mathrm{softmax}\big(-\tfrac12 ((q - k_i)\, w)^2\big)\, v_i .$$
#
# 评分 $-\tfrac12 ((q - k)\, w)^2$ 就是高斯核的 $-\tfrac12 ((q - k) / h)^2$ 取 $w = 1/h$：
# $w$ 是带宽的倒数。$w$ 大（核窄）时，权重集中在最近的键上；$w$ 小时，权重分散开来。这就是
# D2L 的 `NWKernelRegression`，在这里是 `nw.NWKernelRegression`——评分函数插件
# `parametric_gaussian` 加上 `softmax` 汇聚——$w$ 从 1 开始，即上面用过的带宽 $h = 1$ 的高斯核。
#
# **训练。** 我们用随机梯度下降（SGD）在训练集本身上最小化平方误差。这里有一个陷阱：如果查询
# $x_i$ 能看到它自己的键值对 $(x_i, y_i)$，最优的 $w$ 就是无穷大——核窄到使 $f(x_i) = y_i$，
# 把噪声死记了下来。因此 D2L 让每个训练查询只使用*其他* $n - 1$ 个点的键和值（“任何一个训练
# 样本的输入都会和除自己以外的所有训练样本的‘键－值’对进行计算”）；minitensor 则掩蔽对角线
# （`nw.leave_one_out_mask`），两者的计算完全相同。于是损失就是留一法（leave-one-out）误差
# $\sum_i \big(f_{-i}(x_i) - y_i\big)^2$。

# %%
mt.manual_seed(SEED)
epochs = pick(200, 60)
net, losses = nw.train_parametric(data, epochs=epochs, lr=0.2, w_init=1.0)
w = net.w.item()
loss_start, loss_end = nw.loss_at(1.0, data), nw.loss_at(w, data)
print(f"{epochs} epochs of SGD: w = 1.00 -> {w:.2f}, training loss {loss_start:.2f} -> {loss_end:.2f}")
assert loss_end < loss_start, "the learned w fits better than w at its start"
assert losses[-1] < losses[0], "the training loss fell"

# %% [markdown]
# **书中的代码在这里照样运行。** D2L 用 PyTorch 构造这些留一法的键：把训练输入铺成
# $n \times n$ 的表，用 `(1 - torch.eye(n)).type(torch.bool)` 去掉对角线，变形为
# $n \times (n - 1)$，再用 `torch.bmm` 汇聚。写成 `import minitensor as torch` 后，这几行
# 无须改动即可运行——书中本章各个模型的 PyTorch 代码也是如此，`tests/test_d2l_habits.py` 在两个库上运行
# 它并加以比较——而且在学到的 $w$ 处，它们给出与上面的掩蔽相同的损失：

# %%
import minitensor as torch  # the book's PyTorch lines below, unchanged

n_train = len(data.x_train)
x_train, y_train = torch.tensor(data.x_train), torch.tensor(data.y_train)
X_tile, Y_tile = x_train.repeat((n_train, 1)), y_train.repeat((n_train, 1))
keys = X_tile[(1 - torch.eye(n_train)).type(torch.bool)].reshape((n_train, -1))
values = Y_tile[(1 - torch.eye(n_train)).type(torch.bool)].reshape((n_train, -1))
queries = x_train.repeat_interleave(keys.shape[1]).reshape((-1, keys.shape[1]))
weights = torch.nn.functional.softmax(-(((queries - keys) * w) ** 2) / 2, dim=1)
y_hat = torch.bmm(weights.unsqueeze(1), values.unsqueeze(-1)).reshape(-1)
loss_cut = torch.nn.MSELoss(reduction="none")(y_hat, y_train).sum().item()
print(f"the book's keys cut to (n, n - 1): loss {loss_cut:.4f}; the mask: loss {loss_end:.4f}")
assert abs(loss_cut - loss_end) < 1e-4 * loss_end, "cutting the diagonal out is masking it"

# %% [markdown]
# 这就是最好的 $w$ 吗？只有一个参数时，我们可以直接试许多个取值：在 $w$ 上做网格搜索，算的是
# 同一个损失，应当找到大致相同的最小值。这个损失在 $w$ 小的地方很陡，在最小值附近几乎是平的，
# 所以 `train_parametric` 没有照搬 D2L 的 5 个迭代周期、学习率 0.5，而是走更多、更小的步
# （见它的文档字符串）。

# %%
ws = numpy.linspace(0.5, 15.0, pick(59, 30))
grid_losses = [nw.loss_at(float(v), data) for v in ws]
best_w, best_loss = nw.grid_search(data, ws)
print(f"grid search: best w = {best_w:.2f} with loss {best_loss:.2f}; SGD found w = {w:.2f} with loss {loss_end:.2f}")
assert loss_end < 1.05 * best_loss, "SGD reaches (nearly) the best loss the grid finds"

fig = Figure(figsize=(10, 3.4), layout="constrained")
ax_epochs, ax_w = fig.subplots(1, 2)
ax_epochs.plot(range(1, epochs + 1), losses)
ax_epochs.set_xlabel(text("epoch"))
ax_epochs.set_ylabel(text("leave-one-out training loss"))
ax_w.plot(ws, grid_losses)
ax_w.axvline(w, color="tab:orange", linestyle="--", label=text("learned w = {w:.2f}", w=w))
ax_w.set_xlabel("w")
ax_w.legend()
fig.savefig(figure_path(TUTORIAL, "parametric_training.png"), dpi=100)

# %% [markdown]
# 训练好的模型在测试查询上预测时，可以使用全部训练键值对（测试点不在训练集中，无须掩蔽）。
# 它的权重集中在一条比 $w = 1$ 的高斯核更窄的带上：$w$ 更大，带宽 $h = 1/w$ 更小，曲线也更
# 贴近 $2\sin x + x^{0.8}$。

# %%
parametric = nw.predict_parametric(net, data)
mse_parametric = nw.mse(parametric, data)
print(f"mse: average {mse_average:.3f}, Gaussian w=1 {mse_gaussian:.3f}, parametric w={w:.2f} {mse_parametric:.3f}")
assert numpy.allclose(parametric.attention_weights.sum(axis=1), 1.0, atol=1e-5), "weights rows sum to 1"
assert mse_parametric < mse_gaussian < mse_average, "learned width < fixed width < no width at all"
peak = lambda p: float(p.attention_weights.max(axis=1).mean())  # noqa: E731
assert peak(parametric) > peak(gaussian), "a larger w concentrates each query's weights"

fig = Figure(figsize=(12, 3.6), layout="constrained")
for ax, (title, prediction) in zip(
    fig.subplots(1, 3, sharey=True),
    [
        (text("average pooling (mse {mse:.2f})", mse=mse_average), average),
        (text("Gaussian, w = 1 (mse {mse:.2f})", mse=mse_gaussian), gaussian),
        (text("parametric, learned w = {w:.2f} (mse {mse:.2f})", w=w, mse=mse_parametric), parametric),
    ],
):
    draw_fit(ax, data, prediction, title)
fig.axes[0].legend(fontsize="small", loc="upper right")
fig.savefig(figure_path(TUTORIAL, "three_poolings.png"), dpi=100)

show_heatmaps(
    numpy.stack([gaussian.attention_weights, parametric.attention_weights])[None],
    xlabel=text("Sorted training inputs (keys)"),
    ylabel=text("Sorted test inputs (queries)"),
    titles=[text("non-parametric, w = 1"), text("parametric, w = {w:.2f}", w=w)],
    figsize=(8, 4.2),
    path=figure_path(TUTORIAL, "weights_nonparametric_parametric.png"),
)

# %% [markdown]
# > **常见的疏漏，以及代码实现的是哪个版本**
# >
# > - *核的自变量。* 一个常见的疏漏是把核写成键与其值的函数 $K(k_i, v_i)$，或者说核度量的是
# >   查询与键之间的*距离*。核比较的是**查询与键**——值从不参与其中——而且它度量的是二者的
# >   *相似度*，相似度随距离增大而下降。D2L 的 $K(q - k_i)$ 是 $K(q, k_i)$ 只依赖于差值的特例；
# >   D2L 的核都属于这一类，`kernel` 评分函数计算的是 $\log K(|q - k| / h)$。
# > - *参数放在哪里。* 也可以把评分*乘以*一个可学习的 $\omega$ 来让汇聚带参数，即
# >   $\mathrm{softmax}\big(\omega\, a(q, k_i)\big)$；D2L 则把 $w$ 放在平方的*里面*，即
# >   $\mathrm{softmax}\big(-\frac12 ((q - k_i) w)^2\big)$。对高斯评分而言，两者在 $\omega = w^2$
# >   时一致；D2L 的形式不可能让 $\omega$ 为负（那样会偏向*最远*的键），而且 $w$ 可以直接读作
# >   带宽的倒数，$w = 1/h$。minitensor 实现的是 D2L 的形式：`parametric_gaussian` 评分函数，
# >   $-\frac12 w^2 |q - k|^2$。
# > - *常数。* 高斯核的 $1/\sqrt{2\pi}$（D2L 的定义里有它）在比值中抵消，所以代码省去了它；
# >   上面的检查保留了它，得到的权重相同。
# > - *英文版 11.2 的“Epanechikov”核*是 $\max(0, 1 - |u|)$，即三角核；教科书中的 Epanechnikov
# >   核是 $\frac34 (1 - u^2)$。minitensor 沿用 D2L 的名称（拼作 `epanechnikov`，也接受
# >   `triangular` 指同一个核），以便复现书中的图。

# %% [markdown]
# ## 从核到注意力
#
# D2L 的小结做了推广：无论用什么核，预测都是
#
# $$f(q) = \sum_{i=1}^n \alpha(q, k_i)\, v_i ,$$
#
# 即以**注意力权重**（attention weight）$\alpha(q, k_i)$ 对值做加权平均，而设计注意力就是设计
# 这些权重的计算方式。这里是一个评分（$-\frac12 (q - k)^2$，带或不带 $w$）经过 softmax；
# 教程 3 会把这两步分开——**评分函数**以及 softmax 和它的掩蔽——并介绍 D2L 的两种评分函数：
# 加性注意力，以及每个 Transformer 都在用的缩放点积注意力。
#
# ## 小结
#
# - 平均汇聚不理会查询：预测是一条水平线。
# - Nadaraya-Watson核回归按键与查询之间的核相似度为值加权：这是非参数注意力汇聚。数据增多时，
#   它收敛到真实函数，前提是带宽随 $n$ 缩小，但缩小得足够慢（$h \to 0$，$n h \to \infty$）。
# - 高斯核使权重成为 $-\frac12 (q - k_i)^2$ 的 softmax；任何核都是 $\log K$ 的 softmax。
# - 带参数汇聚学习 $w = 1/h$，即带宽的倒数；训练时必须对每个点隐藏它自己的键值对（留一法），
#   否则 $w$ 会一路跑向无穷大。

# %% [markdown]
# ## 练习
#
# 1. 训练带参数模型时*不*使用留一法的掩蔽（在你自己的损失里调用 `net(x, x, y)`）。观察 $w$
#    如何一个迭代周期接一个迭代周期地增长。预测曲线是什么样子？
# 2. 把 `nw.make_data` 中的 `noise` 增大到 1.0。学到的 $w$ 是变大还是变小？为什么这是正确的
#    方向？
# 3. 给带参数模型更多的参数：每个*键*一个可学习的带宽（每个 $k_i$ 对应 $w_i = 1/h_i$）。写出
#    这个评分函数（教程 4 介绍如何注册它）并训练它。测试误差改善了，还是过拟合了？
#
# ## 它在引擎中的位置
#
# - `minitensor/nadaraya_watson.py`——数据、平均汇聚、`nadaraya_watson`、`compare_kernels`、
#   `NWKernelRegression`、留一法损失、`train_parametric`、`grid_search`。
# - `plugins/minitensor_plugins/scorers.py`——`kernel` 评分函数（gaussian、boxcar、
#   epanechnikov、constant）和 `parametric_gaussian` 评分函数。
# - `plugins/minitensor_plugins/poolings.py`——`softmax` 汇聚和 `average` 汇聚。
# - `minitensor/core/nn/attention.py`——把它们组合在一起的 `Attention` 层。
# - `minitensor/core/optim/`——学习 $w$ 的 SGD。
