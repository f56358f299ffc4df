"""Nadaraya-Watson kernel regression end to end (minitensor/nadaraya_watson.py, D2L 10.2).

Every prediction is checked against the formula written out in NumPy (float64), independent
of the attention layer and the plugins that compute it.
"""

import numpy as np
import pytest

import minitensor as mt
from minitensor import nadaraya_watson as nw


@pytest.fixture(scope="module")
def data():
    return nw.make_data(seed=0)


# D2L 11.2's kernels, written as in the book (a width w means K(u / w)).
KERNELS = {
    "gaussian": lambda u: np.exp(-(u**2) / 2),
    "boxcar": lambda u: (np.abs(u) < 1.0).astype(float),
    "epanechnikov": lambda u: np.maximum(1 - np.abs(u), 0.0),
    "constant": lambda u: np.ones_like(u),
}


def direct_nadaraya_watson(data, kernel, width):
    """f(q) = sum_i K((q - k_i)/w) v_i / sum_j K((q - k_j)/w), and its weight matrix; a row
    with sum K = 0 gets zero weights (the attention layer's rule for an empty row)."""
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (data.x_test, data.x_train, data.y_train))
    K = KERNELS[kernel]((q[:, None] - k[None, :]) / width)
    total = K.sum(axis=1, keepdims=True)
    weights = np.divide(K, total, out=np.zeros_like(K), where=total > 0)
    return weights @ v, weights


def test_data_follows_d2l():
    data = nw.make_data(seed=3)
    assert data.x_train.shape == data.y_train.shape == (50,)
    assert data.x_test.shape == data.y_truth.shape == (50,)
    assert all(a.dtype == np.float32 for a in data)
    assert np.all(np.diff(data.x_train) >= 0) and 0 <= data.x_train.min() and data.x_train.max() < 5
    np.testing.assert_allclose(data.x_test, np.arange(0, 5, 0.1), rtol=1e-6)
    x = data.x_test.astype(np.float64)
    np.testing.assert_allclose(data.y_truth, 2 * np.sin(x) + x**0.8, rtol=1e-6)
    np.testing.assert_allclose(nw.f(np.array([0.0, 1.0, 4.0])), [0.0, 2 * np.sin(1) + 1, 2 * np.sin(4) + 4**0.8])


def test_data_noise_is_normal_with_the_given_scale():
    data = nw.make_data(n_train=20000, noise=0.5, seed=1)
    residual = data.y_train - nw.f(data.x_train.astype(np.float64))
    assert abs(residual.mean()) < 0.02
    assert abs(residual.std() - 0.5) < 0.02
    assert abs(data.x_train.mean() - 2.5) < 0.05  # uniform on [0, 5)


def test_data_is_reproducible_from_the_seed():
    a, b, c = nw.make_data(seed=7), nw.make_data(seed=7), nw.make_data(seed=8)
    np.testing.assert_array_equal(a.x_train, b.x_train)
    np.testing.assert_array_equal(a.y_train, b.y_train)
    assert not np.array_equal(a.x_train, c.x_train)


def test_average_pooling_predicts_the_mean_everywhere(data):
    prediction = nw.average_pooling(data)
    np.testing.assert_allclose(prediction.y_hat, np.full(50, data.y_train.mean()), rtol=1e-5)
    assert prediction.attention_weights.shape == (50, 50)
    np.testing.assert_allclose(prediction.attention_weights, 1 / 50, rtol=1e-6)


@pytest.mark.parametrize("width", [1.0, 0.5, 0.2])
def test_gaussian_nadaraya_watson_is_the_direct_formula(data, width):
    prediction = nw.nadaraya_watson(data, "gaussian", width)
    y_hat, weights = direct_nadaraya_watson(data, "gaussian", width)
    assert prediction.attention_weights.shape == (50, 50)
    np.testing.assert_allclose(prediction.attention_weights, weights, rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(prediction.y_hat, y_hat, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(prediction.attention_weights.sum(axis=1), 1.0, rtol=1e-5)


def test_gaussian_kernel_is_softmax_of_minus_half_squared_distance(data):
    """The seeds' identity: K / sum K = softmax(-1/2 (q - k)^2) -- the ``gaussian`` scorer."""
    by_kernel = nw.nadaraya_watson(data, "gaussian", 1.0)
    by_scorer = nw.attention_pooling(data, "gaussian", "softmax")
    np.testing.assert_allclose(by_scorer.y_hat, by_kernel.y_hat, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kernel", ["boxcar", "epanechnikov", "constant"])
@pytest.mark.parametrize("width", [1.0, 0.5, 0.1])
def test_every_kernel_is_its_direct_formula(data, kernel, width):
    prediction = nw.nadaraya_watson(data, kernel, width)
    y_hat, weights = direct_nadaraya_watson(data, kernel, width)
    np.testing.assert_allclose(prediction.attention_weights, weights, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(prediction.y_hat, y_hat, rtol=1e-4, atol=1e-5)
    assert np.isfinite(prediction.y_hat).all()


def test_constant_kernel_is_average_pooling(data):
    np.testing.assert_allclose(
        nw.nadaraya_watson(data, "constant", 0.3).y_hat, nw.average_pooling(data).y_hat, rtol=1e-5
    )


def test_compare_kernels_covers_the_grid_and_beats_the_baseline(data):
    results = nw.compare_kernels(data, kernels=("gaussian", "epanechnikov"), widths=(0.5, 1.0))
    assert set(results) == {("gaussian", 0.5), ("gaussian", 1.0), ("epanechnikov", 0.5), ("epanechnikov", 1.0)}
    baseline = nw.mse(nw.average_pooling(data), data)
    assert all(nw.mse(p, data) < baseline / 2 for p in results.values())


def test_leave_one_out_mask():
    mask = nw.leave_one_out_mask(4)
    assert mask.dtype == bool and mask.shape == (4, 4)
    assert not mask.diagonal().any() and mask.sum() == 12


def test_training_uses_the_other_points_only(data):
    net = nw.NWKernelRegression(w_init=2.0)
    with mt.no_grad():
        nw.training_loss(net, data)
    weights = net.attention_weights.numpy()
    assert weights.shape == (50, 50)
    np.testing.assert_array_equal(weights.diagonal(), 0.0)
    np.testing.assert_allclose(weights.sum(axis=1), 1.0, rtol=1e-5)


def test_training_loss_is_the_leave_one_out_formula(data):
    x, y = data.x_train.astype(np.float64), data.y_train.astype(np.float64)
    w = 2.5
    scores = -0.5 * ((x[:, None] - x[None, :]) * w) ** 2
    np.fill_diagonal(scores, -np.inf)
    alpha = np.exp(scores - scores.max(axis=1, keepdims=True))
    alpha /= alpha.sum(axis=1, keepdims=True)
    assert nw.loss_at(w, data) == pytest.approx(((alpha @ y - y) ** 2).sum(), rel=1e-4)


@pytest.fixture(scope="module")
def trained(data):
    net, losses = nw.train_parametric(data)
    return net, losses


def test_parametric_training_learns_w(data, trained):
    net, losses = trained
    w = net.w.item()
    assert net.w.shape == (1,) and net.w.requires_grad
    assert abs(w - 1.0) > 0.5  # moved away from w_init = 1.0
    assert nw.loss_at(w, data) < nw.loss_at(1.0, data)
    assert losses[-1] < losses[0]
    assert len(losses) == 200


def test_learned_w_is_near_the_grid_search_minimum(data, trained):
    net, _ = trained
    w = abs(net.w.item())  # the loss depends on w^2 only: -w and w are one model
    best_w, best_loss = nw.grid_search(data, np.linspace(0.05, 20.0, 400))
    assert abs(w - best_w) <= 0.1 * best_w
    assert nw.loss_at(w, data) <= best_loss * 1.01


def test_parametric_prediction_on_the_test_points(data, trained):
    net, _ = trained
    prediction = nw.predict_parametric(net, data)
    assert prediction.y_hat.shape == (50,) and prediction.attention_weights.shape == (50, 50)
    np.testing.assert_allclose(prediction.attention_weights.sum(axis=1), 1.0, rtol=1e-5)
    # the learned kernel is the Gaussian kernel of width 1 / w: compare with the direct formula
    y_hat, _ = direct_nadaraya_watson(data, "gaussian", 1.0 / abs(net.w.item()))
    np.testing.assert_allclose(prediction.y_hat, y_hat, rtol=1e-3, atol=1e-4)
    assert nw.mse(prediction, data) < nw.mse(nw.nadaraya_watson(data, "gaussian", 1.0), data)


def test_main_prints_a_summary(capsys):
    assert nw.main(seed=0) == 0
    out = capsys.readouterr().out
    assert "average pooling" in out and "epanechnikov, width 0.5" in out and "learned w" in out
