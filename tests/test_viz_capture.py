"""mt.viz.capture: every attention call's scores, bias, allowed keys and weights, recorded
without changing what the model computes, on the plain path even for a streamed layer."""

import numpy as np
import pytest

import minitensor as mt
from minitensor import nn


def softmax_where(scores, allowed):
    s = np.where(allowed, scores, -np.inf)
    m = np.max(s, axis=-1, keepdims=True)
    e = np.where(allowed, np.exp(s - np.where(np.isfinite(m), m, 0)), 0)
    total = e.sum(axis=-1, keepdims=True)
    return np.divide(e, total, out=np.zeros_like(e), where=total > 0)


@pytest.mark.parametrize("fused", [False, True])
def test_a_layer_records_scores_bias_allowed_keys_and_weights(fused):
    mt.manual_seed(0)
    layer = nn.MultiHeadAttention(8, 2, positional="alibi", fused=fused, dtype="float64")
    X = mt.randn(2, 5, 8, dtype="float64")
    expected = layer(X, X, X, valid_lens=[5, 3], causal=True).numpy()
    with mt.viz.capture(layer) as cap:
        out = layer(X, X, X, valid_lens=[5, 3], causal=True)
        assert layer.attention_weights is not None  # the plain path, even with fused=True
    np.testing.assert_allclose(out.numpy(), expected, atol=1e-12)  # nothing changed
    (record,) = cap.records
    assert record.name == "attention" and record.scores.shape == (2, 2, 5, 5) and record.bias.shape == (2, 5, 5)
    assert not record.allowed[1, :, :, 3:].any()  # example 1: valid_lens 3
    assert not record.allowed[0, :, 0, 1:].any() and record.allowed[0, :, 4].all()  # causal
    np.testing.assert_allclose(record.weights, softmax_where(record.scores + record.bias, record.allowed), atol=1e-12)
    assert layer.fused is fused and not layer.heads_through_attention  # all restored
    assert not layer.attention._forward_hooks and not layer.attention.scorer._forward_hooks and not layer._forward_hooks


def test_grouped_heads_and_cached_decoding_are_recorded_through_the_hooks():
    """Grouped heads normally score a whole group without calling their Attention module; inside
    capture they call it (keys repeated), so its hooks record them, and the output is the same.
    Cached decoding calls the Attention module at each step: one record per step."""
    mt.manual_seed(0)
    layer = nn.MultiHeadAttention(8, 4, num_kv_heads=2, dtype="float64")
    X = mt.randn(2, 5, 8, dtype="float64")
    expected = layer(X, X, X, causal=True).numpy()
    with mt.viz.capture(layer) as cap:
        out = layer(X, X, X, causal=True)
    np.testing.assert_allclose(out.numpy(), expected, atol=1e-12)
    (record,) = cap.records
    assert record.scores.shape == record.weights.shape == (2, 4, 5, 5)
    np.testing.assert_allclose(record.weights, softmax_where(record.scores, record.allowed), atol=1e-12)
    assert set(cap.outputs) == {"attention", "MultiHeadAttention"}

    mt.manual_seed(0)
    lm = nn.TransformerLM(vocab_size=7, num_hiddens=8, ffn_num_hiddens=8, num_heads=2, num_blks=1, dropout=0.0)
    lm.eval()
    with mt.viz.capture(lm) as cap:
        logits, state = lm.decode_step(mt.tensor([[1, 2, 3]]), lm.begin_decoding())
        for token in (4, 5):
            logits, state = lm.decode_step(mt.tensor([[token]]), state)
    shapes = [r.scores.shape for r in cap.records]
    assert shapes == [(1, 2, 3, 3), (1, 2, 1, 4), (1, 2, 1, 5)], shapes  # the prompt, then one query per step


def test_every_layer_of_a_transformer_is_named_in_call_order():
    mt.manual_seed(0)
    config = dict(vocab_size=11, num_hiddens=8, ffn_num_hiddens=8, num_heads=2, num_blks=2, dropout=0.0)
    model = nn.EncoderDecoder(nn.TransformerEncoder(**config), nn.TransformerDecoder(**config))
    enc_X, dec_X = mt.tensor(np.ones((1, 4), dtype=np.int64)), mt.tensor(np.ones((1, 3), dtype=np.int64))
    with mt.viz.capture(model) as cap:
        model(enc_X, dec_X, mt.tensor([4]))
    names = [r.name for r in cap.records]
    assert names[:2] == ["encoder.blks.0.attention.attention", "encoder.blks.1.attention.attention"]
    assert len(names) == 6 and cap.for_layer("decoder.blks.1.attention2.attention")[0].scores.shape == (1, 2, 3, 4)
    assert repr(cap) == "Capture(6 attention calls)"


def test_capture_names_what_is_not_a_module():
    with pytest.raises(TypeError, match="mt.viz.capture: model must be an mt.nn.Module, got int"):
        with mt.viz.capture(3):
            pass
