"""Capabilities, not names: a plugin of yours reaches the fast paths exactly as a built-in does.

The streamed attention path (``ops.flash_attention``) and the grouped-heads scoring are chosen
by what the scorer and the pooling *declare* (``row_wise``, ``dot_scale``, ``softmax_like``:
``minitensor/core/hookspecs.py``), never by their registered names; and the conformance kit tests
that a declaration is true. Here a learner's own scaled dot product, registered under a new
name, streams (same result as the built-in), and false declarations are caught by the kit.
"""

import math

import numpy as np
import pytest

import minitensor as mt
from minitensor import hookimpl, nn
from minitensor import plugins as mtp
from minitensor.testing import check_pooling, check_scorer


class MyScaledDot(nn.Module):
    """A learner's scorer: the scaled dot product, written out, with its capabilities declared."""

    row_wise = True

    def __init__(self, query_size, key_size, **options):
        super().__init__()

    def forward(self, queries, keys):
        return queries @ keys.swapaxes(-1, -2) / math.sqrt(queries.shape[-1])

    def dot_scale(self, d_head):
        return 1.0 / math.sqrt(d_head)


class Undeclared(MyScaledDot):
    """The same numbers, declaring nothing: the plain path."""

    row_wise = False
    dot_scale = None


class MySoftmax(nn.Module):
    softmax_like = True

    def forward(self, scores, valid_lens=None, mask=None):
        return mt.masked_softmax(scores, valid_lens, mask)


class Plugin:
    @hookimpl
    def minitensor_scorers(self):
        return {"my_scaled_dot": MyScaledDot, "undeclared_dot": Undeclared}

    @hookimpl
    def minitensor_poolings(self):
        return {"my_softmax": MySoftmax}


@pytest.fixture
def registered():
    plugin = Plugin()
    mtp.register(plugin, name="capabilities-test")
    yield
    mtp.unregister(plugin)


def layers(scorer, pooling, **kwargs):
    mt.manual_seed(0)
    return mt.nn.MultiHeadAttention(32, 4, scorer=scorer, pooling=pooling, **kwargs)


def run(layer, x, causal=True):
    x = mt.tensor(x, requires_grad=True)
    out = layer(x, x, x, causal=causal)
    out.sum().backward()
    return out.numpy(), x.grad.numpy()


def test_a_users_scaled_dot_takes_the_streamed_path_with_the_builtins_result(registered):
    x = np.random.default_rng(0).standard_normal((2, 40, 32)).astype(np.float32)
    builtin = layers("scaled_dot", "softmax", fused=True)
    mine = layers("my_scaled_dot", "my_softmax", fused=True)  # True: it must stream, or raise
    assert mine.why_not_fused() is None
    for got, want in zip(run(mine, x), run(builtin, x)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert mine._stream is not None  # the streamed plan of its last call: it did stream
    plain = layers("my_scaled_dot", "my_softmax", fused=False)
    for got, want in zip(run(plain, x), run(mine, x)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_without_the_declarations_the_plain_path_says_why(registered):
    layer = layers("undeclared_dot", "softmax")
    assert "does not declare dot_scale" in layer.why_not_fused()
    with pytest.raises(ValueError, match="undeclared_dot.*does not declare dot_scale"):
        layers("undeclared_dot", "softmax", fused=True)
    with pytest.raises(ValueError, match="'average' does not declare softmax_like"):
        layers("scaled_dot", "average", fused=True)


def test_grouped_heads_score_a_row_wise_scorer_once_per_group(registered, monkeypatch):
    """With 2 key/value heads for 4 query heads, a row_wise scorer sees each group's 2 x Q
    queries against the group's keys; an undeclared one sees keys repeated to every head."""
    seen = []
    for cls in (MyScaledDot, Undeclared):
        original = cls.forward
        monkeypatch.setattr(
            cls, "forward", lambda self, q, k, f=original: seen.append((q.shape, k.shape)) or f(self, q, k)
        )
    x = np.random.default_rng(1).standard_normal((2, 5, 32)).astype(np.float32)
    results = []
    for name in ("my_scaled_dot", "undeclared_dot"):
        seen.clear()
        results.append(run(layers(name, "softmax", num_kv_heads=2, fused=False), x))
        shapes = seen[0]
        if name == "my_scaled_dot":
            assert shapes == ((2, 2, 10, 8), (2, 2, 5, 8))  # (batch, groups, 2 heads x 5 queries, d)
        else:
            assert shapes == ((2, 4, 5, 8), (2, 4, 5, 8))
    for got, want in zip(*results):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_every_builtin_declares_its_capabilities():
    assert all(getattr(mtp.lookup("scorer", name), "row_wise", False) for name in mtp.scorers())
    declares_dot = {name for name in mtp.scorers() if getattr(mtp.lookup("scorer", name), "dot_scale", None)}
    assert declares_dot == {"dot", "scaled_dot"}
    assert {name for name in mtp.poolings() if getattr(mtp.lookup("pooling", name), "softmax_like", False)} == {
        "softmax"
    }


def test_no_code_path_tests_a_plugins_name():
    """The attention layers choose their paths by declared capability only."""
    import inspect

    from minitensor.nn import attention

    source = inspect.getsource(attention)
    for name in ("'dot'", '"dot"', "'scaled_dot'", '"scaled_dot"', "'softmax'", '"softmax"', "'cosine'", "'l2'"):
        code = [line for line in source.splitlines() if name in line and not line.strip().startswith("#")]
        defaults = ("scorer=", "pooling=", "scorer: str =", "pooling: str =")  # arguments' defaults
        code = [line for line in code if not any(d in line for d in defaults)]
        assert not code, f"nn/attention.py mentions the plugin name {name}: {code}"


# -- the kit catches a declaration that is not true -------------------------------------------------
class CosineClaimingDot(MyScaledDot):
    """Declares dot_scale, yet normalises q and k first: not scale * q . k."""

    def forward(self, queries, keys):
        q = queries / (queries * queries).sum(axis=-1, keepdims=True).sqrt()
        k = keys / (keys * keys).sum(axis=-1, keepdims=True).sqrt()
        return q @ k.swapaxes(-1, -2)


class ColumnNormalised(MyScaledDot):
    """Declares row_wise, yet centres each key's scores over the queries: rows are coupled."""

    dot_scale = None

    def forward(self, queries, keys):
        scores = queries @ keys.swapaxes(-1, -2)
        return scores - scores.mean(axis=-2, keepdims=True)


class AverageClaimingSoftmax(nn.Module):
    softmax_like = True

    def forward(self, scores, valid_lens=None, mask=None):
        return mtp.lookup("pooling", "average")()(scores, valid_lens, mask)


def test_the_kit_checks_each_declaration():
    assert check_scorer(MyScaledDot) and check_pooling(MySoftmax)
    with pytest.raises(AssertionError, match=r"dot_scale: the class says dot_scale\(4\) = 0.5, yet"):
        check_scorer(CosineClaimingDot)
    with pytest.raises(AssertionError, match="row_wise: the class says row_wise = True, yet the queries of two heads"):
        check_scorer(ColumnNormalised)
    with pytest.raises(AssertionError, match="softmax_like: the class says softmax_like = True"):
        check_pooling(AverageClaimingSoftmax)
