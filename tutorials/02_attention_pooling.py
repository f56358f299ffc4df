# %% [markdown]
# # 2. Attention pooling: Nadaraya–Watson kernel regression
#
# Chapter 1 wrote attention as $f(q) = \sum_i \alpha(q, k_i)\, v_i$. Here is the oldest
# working example of it, from the 1960s: **Nadaraya–Watson kernel regression**
# (Nadaraya-Watson核回归). We fit a noisy one-dimensional function three ways —
# average pooling, non-parametric attention pooling with a kernel, and parametric attention
# pooling with one learned parameter $w$ — following D2L formula by formula, and look at the
# predictions and at the attention weights behind them.
#
# Everything below comes from `minitensor/nadaraya_watson.py`, which builds each method as an
# `mt.nn.Attention` layer from scorer and pooling plugins. Read it beside this chapter.
#
# Sources: D2L's attention chapter, in the Chinese edition 《动手学深度学习》 (zh.d2l.ai),
# 10.2 注意力汇聚：Nadaraya-Watson 核回归, and in the English edition *Dive into Deep
# Learning* (d2l.ai), 11.2 "Attention Pooling by Similarity". The two editions contribute
# different pieces. The Chinese 10.2 has the data set used throughout, average pooling, the
# Gaussian kernel and the parametric pooling with its leave-one-out training. The English
# 11.2 has the four kernels, the Gaussian kernel at four widths, and the condition under
# which the estimator converges; it uses data of its own and leaves learning the width to an
# exercise. Drawing every kernel at every width is this tutorial's own combination. The
# estimator is Nadaraya (1964), "On Estimating Regression", and Watson (1964), "Smooth
# Regression Analysis"; the convergence result the English 11.2 cites is Mack and Silverman
# (1982), "Weak and Strong Uniform Consistency of Kernel Regression Estimates".

# %%
import numpy
from _tutorial import SMOKE, figure_path, pick, text  # noqa: F401  (shared helpers; text: figure labels in the language)
from matplotlib.figure import Figure  # a Figure without pyplot: no window, no global state

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
# ## The data: keys, values and queries
#
# The regression problem of the Chinese 10.2: $n = 50$ training inputs $x_i$ drawn uniformly
# from $[0, 5)$ (sorted, so that the heatmaps below show a band), with outputs
#
# $$y_i = 2 \sin(x_i) + x_i^{0.8} + \epsilon, \qquad \epsilon \sim \mathcal N(0, 0.5^2).$$
#
# (The English 11.2 draws 40 points of $2 \sin(x_i) + x_i + \epsilon$ with $\epsilon \sim
# \mathcal N(0, 1)$; every figure here uses the data above.)
#
# In attention words the training inputs are the **keys** $k_i = x_i$, the training outputs
# the **values** $v_i = y_i$ (键值对, key–value pairs), and every test input $x = 0, 0.1,
# \ldots, 4.9$ at which we want a prediction is a **query** $q$. `nw.make_data` generates
# all of it from one seed.

# %%
data = nw.make_data(n_train=50, noise=0.5, seed=SEED)
print(f"{len(data.x_train)} key-value pairs, {len(data.x_test)} queries")
assert (numpy.diff(data.x_train) >= 0).all(), "the keys come sorted"

# %% [markdown]
# ## Average pooling
#
# The simplest pooling has no parameters at all and ignores the query: predict the mean of
# all training outputs, everywhere,
#
# $$f(q) = \frac{1}{n} \sum_{i=1}^n v_i .$$
#
# This is **average pooling** (平均汇聚, D2L's "simplest estimator"): attention weights $\alpha(q, k_i) = 1/n$ that
# involve neither $q$ nor $k_i$ — a flat line. In minitensor it is the `average` pooling
# plugin, which ignores whatever the scorer says.

# %%
average = nw.average_pooling(data)
mse_average = nw.mse(average, data)
print(f"average pooling: mse {mse_average:.3f}")
assert numpy.allclose(average.y_hat, data.y_train.mean(), atol=1e-5), "f(q) = mean of the values"
assert numpy.allclose(average.attention_weights, 1 / len(data.x_train)), "every weight is 1/n"

# %% [markdown]
# ## Non-parametric attention pooling
#
# A better idea is to weigh each value by how close its key is to the query. Nadaraya (1964)
# and Watson (1964) proposed
#
# $$f(q) = \sum_{i=1}^{n} \frac{K(q - k_i)}{\sum_{j=1}^n K(q - k_j)}\, v_i
#        = \sum_{i=1}^n \alpha(q, k_i)\, v_i ,$$
#
# where $K$ is a **kernel** (核): a function that is large when the query and the key are
# close and small when they are far apart. (D2L writes $K(q - k_i)$, a function of the
# difference; in general a kernel is a function $K(q, k_i)$ of the query and one key — the
# box further down comes back to this.) This is **non-parametric attention pooling**
# (非参数注意力汇聚): nothing is learned, the data themselves are the model. The weights are
# non-negative and sum to 1, as attention weights must ($\alpha(q, k_i) \ge 0$,
# $\sum_i \alpha(q, k_i) = 1$); the closer a key to the query, the larger the weight of its
# value — the more *attention* that value gets.
#
# With the **Gaussian kernel** (高斯核) $K(u) = \frac{1}{\sqrt{2\pi}} \exp(-\frac{u^2}{2})$
# the constant $1/\sqrt{2\pi}$ cancels between numerator and denominator and the ratio is a
# softmax:
#
# $$f(q) = \sum_{i=1}^{n} \frac{\exp(-\frac12 (q - k_i)^2)}{\sum_{j=1}^{n} \exp(-\frac12 (q - k_j)^2)}\, v_i
#        = \sum_{i=1}^{n} \mathrm{softmax}\big(-\tfrac12 (q - k_i)^2\big)\, v_i .$$
#
# So kernel regression is attention with the **score** $a(q, k) = -\frac12 (q - k)^2$ and a
# softmax on top. That is how minitensor computes it: a scorer plugin produces
# $\log K(q - k)$ and the `softmax` pooling turns it into $K / \sum K$
# (because $\mathrm{softmax}(\log K) = K / \sum K$).

# %%
gaussian = nw.nadaraya_watson(data, kernel="gaussian", width=1.0)
mse_gaussian = nw.mse(gaussian, data)
print(f"Nadaraya-Watson, Gaussian kernel: mse {mse_gaussian:.3f}   (average pooling: {mse_average:.3f})")

# The same weights by hand, with the kernel's 1/sqrt(2 pi) kept: it cancels in the ratio.
K = numpy.exp(-0.5 * (data.x_test[:, None] - data.x_train[None, :]) ** 2) / numpy.sqrt(2 * numpy.pi)
by_hand = K / K.sum(axis=1, keepdims=True)
assert numpy.abs(gaussian.attention_weights - by_hand).max() < 1e-5, "softmax(-(q-k)^2/2) = K / sum K"
assert numpy.allclose(gaussian.attention_weights.sum(axis=1), 1.0, atol=1e-5), "weights rows sum to 1"
assert (gaussian.attention_weights >= 0).all(), "weights are non-negative"
# The closer the key, the larger its weight: in every row, sorted by |q - k|, the weights never rise.
distance = numpy.abs(data.x_test[:, None] - data.x_train[None, :])
by_distance = numpy.take_along_axis(gaussian.attention_weights, numpy.argsort(distance, axis=1), axis=1)
assert (numpy.diff(by_distance, axis=1) <= 1e-7).all(), "a closer key never gets less weight"
assert mse_gaussian < mse_average, "weighing by closeness beats the flat average"

# %% [markdown]
# The predictions, and the attention weights behind them: row $j$ is test query $x_j$,
# column $i$ training key $x_i$. Both axes are sorted, so the weight sits on a band along the
# diagonal — each query looks at the training points near it. Average pooling's heatmap is one
# uniform colour: every query looks at everything alike.

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
# ## Other kernels, other widths
#
# Any kernel will do. The English 11.2 draws four: Gaussian, boxcar, constant and
# Epanechikov (its spelling). Here each is a function of the scaled distance
# $u = |q - k| / h$, where the **width** $h > 0$ (also called the bandwidth) says how far from
# the query a key still counts; the English 11.2 draws them with $h = 1$. For the Gaussian,
# $h$ is the standard deviation: it is the $\sigma$ of the English 11.2's
# $\exp\big(-\|q - k\|^2 / (2\sigma^2)\big)$.
#
# | kernel | $K(u)$ | score $\log K(u)$ |
# |---|---|---|
# | gaussian | $\exp(-u^2/2)$ | $-u^2/2$ |
# | boxcar | $1$ if $u < 1$, else $0$ | $0$ or $-\infty$ |
# | epanechnikov (D2L's) | $\max(0, 1 - u)$ | $\log(1 - u)$ or $-\infty$ |
# | constant | $1$ | $0$ |
#
# In minitensor they are one scorer plugin, `kernel`, with the options `kernel=` and
# `width=`. A score of $-\infty$ means "outside the kernel's support": the softmax gives that
# key weight exactly 0. First the kernels themselves:

# %%
u = numpy.linspace(-2.5, 2.5, 501, dtype=numpy.float32)
KernelScorer = mt.plugins.lookup("scorer", "kernel")  # the class registered under the name "kernel"
scorer = {name: KernelScorer(1, 1, kernel=name) for name in nw.KERNELS}  # query_size = key_size = 1
fig = Figure(figsize=(12, 2.6), layout="constrained")
for ax, name in zip(fig.subplots(1, len(nw.KERNELS), sharey=True), nw.KERNELS):
    with mt.no_grad():  # K(u) = exp(score(u, 0)): one query u against the single key 0
        kernel_values = scorer[name](mt.tensor(u.reshape(-1, 1)), mt.zeros(1, 1)).exp().numpy().ravel()
    ax.plot(u, kernel_values)
    ax.set_title(text(name), fontsize="medium")  # the kernel's name: minitensor's own label
    ax.set_xlabel("$u = q - k$")
fig.savefig(figure_path(TUTORIAL, "kernels.png"), dpi=100)

# %% [markdown]
# Then the width. The English 11.2 varies it for the Gaussian kernel alone, $\sigma = 0.1,
# 0.2, 0.5, 1$; here every kernel is drawn at each of those four widths $h$, a grid of this
# tutorial's own. A narrow kernel (small $h$) trusts only the nearest training points and
# follows the noise; a wide one (large $h$) averages over a long stretch and flattens the
# curve; the constant kernel is average pooling again, whatever the width.

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
# Two things the grid shows and the code guarantees. A boxcar or epanechnikov kernel of width
# 0.1 may find *no* training point within reach of a query: every score is $-\infty$, and the
# formula would divide 0 by 0. minitensor's softmax gives such a row all-zero weights (a
# prediction of 0: the dips to zero in the boxcar and epanechnikov panels at $h = 0.1$), never
# NaN — chapter 3 explains why.
# And the constant kernel reproduces average pooling exactly.

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
# ### With enough data, non-parametric pooling converges
#
# D2L calls this the *consistency* (一致性) of non-parametric Nadaraya–Watson regression. The
# Chinese 10.2 says 如果有足够的数据，此模型会收敛到最优结果 (given enough data, the model
# converges to the optimal result); the English 11.2 states the condition this needs: the
# kernel must be narrowed as the data grow. Precisely, with $n$ training points the width
# must shrink, $h \to 0$, but slowly enough that $n h \to \infty$, so that every query still
# has more and more keys within reach. A fixed width converges to a smoothed copy of the true
# function, never the function itself; a width that shrinks as fast as $1/n$ keeps a bounded
# number of keys within reach, and their noise never averages out. Nothing is learned, so all
# the improvement must come from more keys and values: with the classical choice
# $h \propto n^{-1/5}$, which meets both conditions, the error against the true function
# goes to zero.

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
# ## Parametric attention pooling
#
# Non-parametric pooling fixes the kernel's width by hand. **Parametric attention pooling**
# (带参数注意力汇聚) lets the data choose it: multiply the distance between query and key by
# one learnable parameter $w$ (可学习参数$w$) inside the Gaussian,
#
# $$f(q) = \sum_{i=1}^{n} \mathrm{softmax}\big(-\tfrac12 ((q - k_i)\, w)^2\big)\, v_i .$$
#
# The score $-\tfrac12 ((q - k)\, w)^2$ is the Gaussian kernel's $-\tfrac12 ((q - k) / h)^2$
# with $w = 1/h$: $w$ is the inverse of the width. A large $w$ (a narrow kernel) makes the
# weights peak on the nearest keys, a small one spreads them out. This is D2L's
# `NWKernelRegression`, here `nw.NWKernelRegression` — the scorer plugin
# `parametric_gaussian` with the `softmax` pooling — and $w$ starts at 1, the Gaussian
# kernel of width $h = 1$ used above.
#
# **Training.** We minimise the squared error on the training set itself, by SGD. One trap:
# if the query $x_i$ may see its own key–value pair $(x_i, y_i)$, the best $w$ is infinite —
# a kernel so narrow that $f(x_i) = y_i$, the noise memorised. D2L therefore gives each
# training query the keys and values of the *other* $n - 1$ points (任何一个训练样本的输入都会和除自己以外的所有训练样本的“键－值”对进行计算); minitensor masks the
# diagonal (`nw.leave_one_out_mask`), which is the same computation. The loss is then the
# leave-one-out error $\sum_i \big(f_{-i}(x_i) - y_i\big)^2$.

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
# **The book's own code runs here.** D2L builds those leave-one-out keys in PyTorch: tile the
# training inputs into an $n \times n$ table, cut its diagonal out with
# `(1 - torch.eye(n)).type(torch.bool)`, reshape to $n \times (n - 1)$, and pool with
# `torch.bmm`. With `import minitensor as torch` those lines run unchanged — as do the
# chapter's models in the book's PyTorch code, which `tests/test_d2l_habits.py` runs on both
# libraries and compares — and at the learned $w$ they give the loss of the mask above:

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
# Is that the best $w$? With a single parameter we can simply try many values: a grid search
# over $w$ evaluates the same loss and should find about the same minimum. The loss is steep
# for small $w$ and nearly flat around its minimum, which is why `train_parametric` uses more,
# smaller steps than D2L's five epochs at learning rate 0.5 (see its docstring).

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
# The trained model predicts on the test queries with every training pair available (the
# test points are not in the training set, so nothing needs masking). Its weights are
# concentrated on a narrower band than the $w = 1$ Gaussian's: a larger $w$, a smaller width
# $h = 1/w$, a curve that follows $2\sin x + x^{0.8}$ more closely.

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
# > **Common slips, and which version the code implements**
# >
# > - *The kernel's arguments.* A common slip is to write the kernel as a function of a key
# >   and its value, $K(k_i, v_i)$, or to say that it measures the *distance* between query
# >   and key. A kernel compares the **query with a key** — values never enter it — and it
# >   measures their *similarity*, which falls as the distance grows. D2L's $K(q - k_i)$ is the
# >   special case of $K(q, k_i)$ that depends only on the difference; all of D2L's kernels are
# >   of that kind, and the `kernel` scorer computes $\log K(|q - k| / h)$.
# > - *Where the parameter goes.* One could also make the pooling parametric by *multiplying*
# >   the score by a learnable $\omega$, $\mathrm{softmax}\big(\omega\, a(q, k_i)\big)$; D2L
# >   puts $w$ *inside* the square, $\mathrm{softmax}\big(-\frac12 ((q - k_i) w)^2\big)$. For the
# >   Gaussian score the two agree with $\omega = w^2$; D2L's form cannot make $\omega$
# >   negative (which would favour the *farthest* keys), and $w$ reads directly as the inverse
# >   of the width, $w = 1/h$. minitensor implements D2L's: the `parametric_gaussian` scorer,
# >   $-\frac12 w^2 |q - k|^2$.
# > - *The constant.* The Gaussian kernel's $1/\sqrt{2\pi}$ (in D2L's definition) cancels in
# >   the ratio, so the code leaves it out; the check above keeps it and gets the same weights.
# > - *The English 11.2's "Epanechikov" kernel* is $\max(0, 1 - |u|)$, the triangular kernel;
# >   the textbook Epanechnikov kernel is $\frac34 (1 - u^2)$. minitensor keeps D2L's name
# >   (spelt `epanechnikov`, and accepts `triangular` for the same kernel) so that the book's
# >   figures are reproduced.

# %% [markdown]
# ## From kernels to attention
#
# D2L's summary generalises: whatever the kernel, the prediction is
#
# $$f(q) = \sum_{i=1}^n \alpha(q, k_i)\, v_i ,$$
#
# a weighted average of the values with **attention weights** (注意力权重) $\alpha(q, k_i)$,
# and designing attention means designing how those weights are computed. Here a score
# ($-\frac12 (q - k)^2$, with or without $w$) went through a softmax; chapter 3 separates the
# two steps — **scoring functions** and the softmax with its mask — and meets D2L's two
# scoring functions, additive attention and the scaled dot product that every Transformer
# uses.
#
# ## Summary
#
# - Average pooling ignores the query: one flat prediction.
# - Nadaraya–Watson kernel regression weighs values by kernel similarity of their keys to the
#   query: non-parametric attention pooling. It converges to the true function as the data
#   grow, provided the width shrinks with $n$ but slowly enough ($h \to 0$, $n h \to \infty$).
# - A Gaussian kernel makes the weights a softmax of $-\frac12 (q - k_i)^2$; any kernel is a
#   softmax of $\log K$.
# - Parametric pooling learns $w = 1/h$, the inverse of the width; training must hide each point's own
#   pair from it (leave-one-out), or $w$ runs away to infinity.

# %% [markdown]
# ## Exercises
#
# 1. Train the parametric model *without* the leave-one-out mask (call `net(x, x, y)` in your
#    own loss). Watch $w$ grow epoch after epoch. What does the prediction curve look like?
# 2. Increase `noise` in `nw.make_data` to 1.0. Does the learned $w$ get larger or smaller?
#    Why is that the right direction?
# 3. Give the parametric model one more parameter, a learnable width per *key*
#    ($w_i = 1/h_i$ for each $k_i$). Write the scorer (chapter 4 shows how to register it) and train
#    it. Does the test error improve, or does it overfit?
#
# ## Where this lives in the engine
#
# - `minitensor/nadaraya_watson.py` — the data, average pooling, `nadaraya_watson`,
#   `compare_kernels`, `NWKernelRegression`, the leave-one-out loss, `train_parametric`,
#   `grid_search`.
# - `plugins/minitensor_plugins/scorers.py` — the `kernel` (gaussian, boxcar, epanechnikov,
#   constant) and `parametric_gaussian` scorers.
# - `plugins/minitensor_plugins/poolings.py` — the `softmax` and `average` poolings.
# - `minitensor/core/nn/attention.py` — the `Attention` layer that puts them together.
# - `minitensor/core/optim/` — the SGD that learns $w$.
