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
    assert layer.fused is fused and "weigh" not in vars(layer.attention)  # all restored


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
