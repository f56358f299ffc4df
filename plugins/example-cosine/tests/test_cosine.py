"""How a plugin author tests a plugin: the formula, the gradients, the options, and that
minitensor finds it.

Run from this folder after ``pip install -e .`` (or with this folder on PYTHONPATH for the
tests but the last): ``python -m pytest tests``. Set MINITENSOR_STRICT_PLUGINS=1 so a plugin
that fails to load is an error here rather than a warning.
"""

import numpy as np
import pytest

import minitensor as mt

minitensor_cosine = pytest.importorskip("minitensor_cosine")


def test_scores_are_cosine_similarities():
    rng = np.random.default_rng(0)
    q, k = rng.normal(size=(2, 3, 4)), rng.normal(size=(2, 5, 4))
    scores = minitensor_cosine.CosineScorer(4, 4, scale=2.0)(mt.tensor(q), mt.tensor(k)).numpy()
    expected = (
        2.0
        * np.einsum("bqd,bkd->bqk", q, k)
        / (np.linalg.norm(q, axis=-1)[:, :, None] * np.linalg.norm(k, axis=-1)[:, None, :])
    )
    assert scores.shape == (2, 3, 5)
    np.testing.assert_allclose(scores, expected, rtol=1e-5, atol=1e-6)


def test_gradients_match_finite_differences():
    scorer = minitensor_cosine.CosineScorer(4, 4)
    q = mt.randn(2, 3, 4, dtype=mt.float64, requires_grad=True)
    k = mt.randn(2, 5, 4, dtype=mt.float64, requires_grad=True)
    assert mt.gradcheck(lambda a, b: scorer(a, b), [q, k])


def test_an_unknown_option_is_refused_by_name():
    """The option rule: a typo must be an error, not a run with the default scale."""
    with pytest.raises(TypeError, match=r"CosineScorer: unknown option\(s\) 'sclae' .*; it takes scale, eps"):
        minitensor_cosine.CosineScorer(4, 4, sclae=10.0)
    assert minitensor_cosine.CosineScorer(4, 4, scale=10.0, eps=1e-6).scale == 10.0  # the known ones pass


def test_minitensor_finds_the_plugin_through_its_entry_point():
    mt.plugins._reset()  # load again, now with this distribution installed
    assert mt.plugins.lookup("scorer", "cosine_temperature") is minitensor_cosine.CosineScorer
    row = next(r for r in mt.plugins.describe() if r["name"] == "cosine_temperature")
    assert row["source"].startswith("minitensor-example-cosine ")
