"""Nadaraya-Watson kernel regression: attention pooling before deep learning (D2L 10.2).

The attention chapter's first example. We are given n pairs (x_i, y_i), the *keys* and
*values*, and want f(x) at a new point x, the *query*. Three answers, each an attention
pooling f(q) = sum_i alpha(q, k_i) v_i with different weights alpha:

1. average pooling, the baseline that ignores the query:

       f(q) = 1/n sum_i v_i                                   alpha(q, k_i) = 1/n

2. non-parametric Nadaraya-Watson (1964): keys close to the query weigh more,

       f(q) = sum_i K(q - k_i) / sum_j K(q - k_j) v_i

   for a kernel K. With the Gaussian kernel K(u) = exp(-u^2/2) / sqrt(2 pi) this is

       f(q) = sum_i softmax(-1/2 (q - k_i)^2) v_i

   i.e. attention with the score a(q, k) = -1/2 (q - k)^2 and softmax pooling. In general
   K / sum K = softmax(log K), so *any* kernel is a scorer log K(q - k) plus softmax: the
   built-in ``kernel`` scorer, option ``kernel=`` gaussian / boxcar / epanechnikov / constant
   (the English D2L 11.2's four kernels) and ``width=`` h (K((q - k) / h); for the Gaussian,
   h is the standard deviation sigma). No parameters are learned; it converges to the true
   function as n grows (D2L 10.2), provided the width shrinks with n, h -> 0, but slowly
   enough that n h -> infinity (D2L 11.2: narrow the kernel as the data grow).

3. parametric Nadaraya-Watson: one learned scalar w = 1/h, the inverse width of the Gaussian,

       f(q) = sum_i softmax(-1/2 ((q - k_i) w)^2) v_i

   the ``parametric_gaussian`` scorer plus softmax (D2L's ``NWKernelRegression``), w trained
   by SGD on the training set itself.

Everything here is an ``mt.nn.Attention`` layer whose scorer and pooling are plugins chosen by
name, which is the point: kernel regression *is* attention pooling, and swapping the kernel is
swapping a plugin. Every function returns NumPy arrays (the prediction curve on ``x_test``
and the (n_test, n_train) attention-weight matrix) ready for plotting.

    data = make_data(seed=0)
    nadaraya_watson(data, kernel="gaussian").y_hat      # (50,) predictions on x_test
    net, losses = train_parametric(data)                 # w learned by SGD
    predict_parametric(net, data).attention_weights      # (50, 50) heat map

``python -m minitensor.nadaraya_watson`` prints how close each method gets to the truth.
"""

from typing import NamedTuple

import numpy

import minitensor as mt

KERNELS = ("gaussian", "boxcar", "epanechnikov", "constant")
WIDTHS = (0.1, 0.2, 0.5, 1.0)  # the English D2L 11.2's widths (its sigmas, for the Gaussian kernel)


def f(x):
    """The true function: f(x) = 2 sin(x) + x^0.8 (D2L 10.2)."""
    return 2 * numpy.sin(x) + x**0.8


class Data(NamedTuple):
    """The Chinese D2L 10.2's data set, as float32 NumPy arrays.

    x_train (n_train,): sorted, uniform on [0, 5);  y_train = f(x_train) + N(0, noise^2) noise;
    x_test (n_test,) = 0, 0.1, ..., 4.9;             y_truth = f(x_test), without noise.
    """

    x_train: numpy.ndarray
    y_train: numpy.ndarray
    x_test: numpy.ndarray
    y_truth: numpy.ndarray


class Prediction(NamedTuple):
    """y_hat (n_test,): f(q) at each test query; attention_weights (n_test, n_train): row j
    holds alpha(x_test[j], x_train[i]) over the training points i (each row sums to 1, or is
    all zero where no training point lies inside the kernel's support)."""

    y_hat: numpy.ndarray
    attention_weights: numpy.ndarray


def make_data(n_train=50, noise=0.5, seed=None):
    """Generate the Chinese D2L 10.2's data: ``x_train = sort(rand(n_train) * 5)``,
    ``y_train = f(x_train) + normal(0, noise)``, ``x_test = arange(0, 5, 0.1)``,
    ``y_truth = f(x_test)``.

    Random numbers come from ``mt.random.host_rng()``; ``seed`` calls ``mt.manual_seed(seed)``
    first (which seeds everything else too), so one seed gives one data set.
    """
    if seed is not None:
        mt.manual_seed(seed)
    rng = mt.random.host_rng()
    x_train = numpy.sort(rng.random(n_train) * 5)
    y_train = f(x_train) + rng.normal(0.0, noise, n_train)
    x_test = numpy.arange(0, 5, 0.1)
    as32 = lambda a: numpy.asarray(a, dtype=numpy.float32)  # noqa: E731  (float32, like tensors)
    return Data(as32(x_train), as32(y_train), as32(x_test), as32(f(x_test)))


def _column(x):
    """(n,) numbers -> an (n, 1) tensor: n queries (or keys, or values) of size 1."""
    return mt.tensor(numpy.asarray(x, dtype=numpy.float32).reshape(-1, 1))


def attention_pooling(data, scorer, pooling="softmax", scorer_options=None, queries=None):
    """f(q) = sum_i alpha(q, x_train[i]) y_train[i] for every q in ``queries`` (default
    x_test), with alpha = pooling(scorer(q, x_train)) from the named plugins.

    Queries, keys and values are numbers, so they go in as (n, 1) tensors: Q = n_test queries
    of size 1 against K = n_train keys of size 1, giving the (Q, K) weight matrix.
    """
    queries = data.x_test if queries is None else queries
    attn = mt.nn.Attention(scorer, pooling, 0.0, query_size=1, key_size=1, scorer_options=scorer_options)
    with mt.no_grad():
        y_hat = attn(_column(queries), _column(data.x_train), _column(data.y_train))
    return Prediction(y_hat.numpy().reshape(-1), attn.attention_weights.numpy())


def average_pooling(data):
    """The baseline f(q) = 1/n sum_i y_i: the same prediction, mean(y_train), for every query.

    The ``average`` pooling ignores the scores, so the scorer does not matter; ``dot`` is the
    cheapest.
    """
    return attention_pooling(data, "dot", "average")


def nadaraya_watson(data, kernel="gaussian", width=1.0):
    """Non-parametric Nadaraya-Watson regression with one of D2L's kernels:

        f(q) = sum_i K((q - k_i) / width) / sum_j K((q - k_j) / width) v_i
             = sum_i softmax(log K((q - k_i) / width)) v_i

    gaussian K(u) = exp(-u^2/2); boxcar K(u) = [|u| < 1]; epanechnikov (D2L's, the
    triangular kernel) K(u) = max(0, 1 - |u|); constant K(u) = 1 (average pooling again).
    A small width trusts only the nearest training points (a wiggly curve that follows the
    noise); a large one averages widely (a smooth curve that misses the shape). With boxcar
    or epanechnikov, a query with no training point closer than ``width`` gets all-zero
    weights and predicts 0 (D2L's K / sum K would divide 0 by 0 there).
    """
    return attention_pooling(data, "kernel", "softmax", scorer_options={"kernel": kernel, "width": width})


def compare_kernels(data, kernels=KERNELS, widths=WIDTHS):
    """{(kernel, width): Prediction} for every kernel at every width: tutorial 2's grid (the
    English D2L 11.2 draws the four kernels at width 1, and the Gaussian alone at each width)."""
    return {(kernel, width): nadaraya_watson(data, kernel, width) for kernel in kernels for width in widths}


class NWKernelRegression(mt.nn.Module):
    """Parametric Nadaraya-Watson regression (D2L's ``NWKernelRegression``):

        f(q) = sum_i softmax(-1/2 ((q - k_i) w)^2) v_i

    one learned scalar w (``self.w``), the inverse width of the Gaussian kernel: the
    ``parametric_gaussian`` scorer with softmax pooling. ``w_init=1.0`` starts from the
    non-parametric Gaussian kernel (D2L draws w from U(0, 1); see ``train_parametric``).
    """

    def __init__(self, w_init=1.0):
        super().__init__()
        self.attention = mt.nn.Attention(
            "parametric_gaussian", "softmax", 0.0, query_size=1, key_size=1, scorer_options={"w_init": w_init}
        )

    @property
    def w(self):
        """The learned inverse width (a Parameter of shape (1,))."""
        return self.attention.scorer.w

    @property
    def attention_weights(self):
        return self.attention.attention_weights

    def forward(self, queries, keys, values, mask=None):
        """queries (n,), keys (m,), values (m,) -> predictions (n,); ``mask`` (n, m) bool,
        True where query j may use training pair i."""
        column = lambda t: t.reshape(-1, 1)  # noqa: E731  (numbers as vectors of size 1)
        return self.attention(column(queries), column(keys), column(values), mask=mask).reshape(-1)


def leave_one_out_mask(n):
    """The (n, n) bool mask that keeps every key except the query's own: True off the diagonal.

    Trained on its own training points with every key available, the model would predict
    y_i from the pair (x_i, y_i) itself, and the loss would drive w to infinity (a kernel so
    narrow that f(x_i) = y_i: memorising the noise). D2L therefore gives each training query
    the keys and values of the *other* n - 1 points, by cutting the diagonal out of an
    (n, n) tile and reshaping it to (n, n - 1); masking the diagonal is the same
    computation without the reshape. The loss is then leave-one-out cross-validation.
    """
    return ~numpy.eye(n, dtype=bool)


def training_loss(net, data):
    """The loss SGD minimises: sum_i (f_{-i}(x_i) - y_i)^2, the squared error of predicting
    each training point from all the others (D2L: ``MSELoss(reduction='none')`` then
    ``.sum()``). A Tensor, so that ``backward()`` reaches w."""
    x, y = mt.tensor(data.x_train), mt.tensor(data.y_train)
    y_hat = net(x, x, y, mask=leave_one_out_mask(len(data.x_train)))
    return ((y_hat - y) ** 2).sum()


def loss_at(w, data):
    """``training_loss`` at a given w, as a float (for grid searches and comparisons)."""
    with mt.no_grad():
        return training_loss(NWKernelRegression(w_init=w), data).item()


def train_parametric(data, epochs=200, lr=0.2, w_init=1.0):
    """Learn w by full-batch SGD on ``training_loss``. Returns (net, losses per epoch).

    Our choice, against D2L's 5 epochs at lr 0.5: the leave-one-out loss is steep for small
    w and nearly flat around its minimum (w between 3 and 10 on this data), so large steps
    overshoot to w ~ 10 - 25 and five of them stop far from the minimum (D2L's jagged learned
    curve). 200 epochs at lr 0.2 reach the minimum for every seed we tried; w_init = 1.0
    starts at the plain Gaussian kernel rather than D2L's random U(0, 1), where the loss is
    steepest and a step of 0.5 can jump far past the minimum.
    """
    net = NWKernelRegression(w_init=w_init)
    optimizer = mt.optim.SGD(net.parameters(), lr=lr)
    losses = []
    for _ in range(epochs):
        loss = training_loss(net, data)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return net, losses


def predict_parametric(net, data):
    """The trained model on the test queries, every training pair as a key-value pair (no
    leave-one-out here: the test points are not in the training set)."""
    with mt.no_grad():
        y_hat = net(mt.tensor(data.x_test), mt.tensor(data.x_train), mt.tensor(data.y_train))
    return Prediction(y_hat.numpy(), net.attention_weights.numpy())


def grid_search(data, ws):
    """(best w, its loss) over the candidate values ``ws``: a check on what SGD found."""
    losses = [loss_at(w, data) for w in ws]
    best = int(numpy.argmin(losses))
    return float(ws[best]), losses[best]


def mse(prediction, data):
    """Mean squared error of a prediction against the noise-free truth f(x_test)."""
    return float(numpy.mean((prediction.y_hat - data.y_truth) ** 2))


def main(seed=0):
    """Print each method's error against the truth on D2L's data."""
    data = make_data(seed=seed)
    print(f"Nadaraya-Watson kernel regression, n_train={len(data.x_train)}, seed={seed}")
    print(f"{'average pooling':<32} mse {mse(average_pooling(data), data):.3f}")
    for (kernel, width), prediction in compare_kernels(data).items():
        print(f"{f'{kernel}, width {width}':<32} mse {mse(prediction, data):.3f}")
    net, losses = train_parametric(data)
    print(
        f"{f'parametric, learned w = {net.w.item():.2f}':<32} mse {mse(predict_parametric(net, data), data):.3f}"
        f"   (training loss {losses[0]:.2f} -> {loss_at(net.w.item(), data):.2f})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
