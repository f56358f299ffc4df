"""An encoder-decoder Transformer as two ONNX graphs, and greedy decoding with ONNX Runtime.

``export_encoder_decoder(model, folder, src_vocab, tgt_vocab, num_steps, max_len)`` writes

- ``encoder.onnx``: (src (batch, num_steps) int64, src_valid_lens (batch,) int64) -> enc_outputs;
- ``decoder_step.onnx``: (tokens (batch, t), enc_outputs, src_valid_lens, and per block
  ``cache_k_i``, ``cache_v_i`` (batch, num_kv_heads, past, d_head)) -> (logits (batch, t,
  |V|), the caches extended to past + t): one step of D2L's decoding with the key/value
  cache as inputs and outputs. Batch, source length, t and past are dynamic axes; the first
  step feeds caches with past = 0;
- ``vocab.json``: both vocabularies, the source length and the longest output.

``OnnxTranslator(folder)`` loads them with ONNX Runtime and translates as
``minitensor translate`` does with greedy search, without minitensor's model code.
"""

import json
import os

import numpy

from ..data import build_array
from ..nn import Module
from ..tensor import tensor
from .export import export

FILES = ("encoder.onnx", "decoder_step.onnx", "vocab.json")


class _Encoder(Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, src, src_valid_lens):
        return self.model.encoder(src, src_valid_lens)


class _DecoderStep(Module):
    """tokens, enc_outputs, src_valid_lens, k_0, v_0, ... -> logits, k_0', v_0', ..."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, tokens, enc_outputs, src_valid_lens, *caches):
        pairs = [(caches[2 * i], caches[2 * i + 1]) for i in range(len(caches) // 2)]
        state = [enc_outputs, src_valid_lens, pairs]
        logits, state = self.model.decoder(tokens, state)
        return (logits, *[t for pair in state[2] for t in pair])


def _empty_caches(model, batch, past=0):
    """Zero caches of ``past`` positions for every decoder block: (batch, num_kv_heads, past, d_head)."""
    caches = []
    for blk in model.decoder.blks:
        attention = blk.attention1
        shape = (batch, attention.num_kv_heads, past, attention.head_size)
        caches += [tensor(numpy.zeros(shape, dtype=attention.W_k.weight.data.dtype)) for _ in range(2)]
    return caches


def export_encoder_decoder(model, folder, src_vocab, tgt_vocab, num_steps, max_len):
    """Write the encoder, one decoder step and the vocabularies into ``folder`` (see the module
    docstring); returns the paths. The traces run on a batch of two, with two cached steps."""
    os.makedirs(folder, exist_ok=True)
    num_blks = len(model.decoder.blks)
    src = tensor(numpy.array([[src_vocab.bos if hasattr(src_vocab, "bos") else 1] * 3, [1] * 3], dtype=numpy.int64))
    src_valid_lens = tensor(numpy.array([3, 2], dtype=numpy.int64))
    paths = [os.path.join(folder, name) for name in FILES]
    export(
        _Encoder(model),
        (src, src_valid_lens),
        paths[0],
        input_names=["src", "src_valid_lens"],
        output_names=["enc_outputs"],
        dynamic_axes={"src": {0: "batch", 1: "src_len"}, "src_valid_lens": {0: "batch"}},
    )
    model.eval()
    enc_outputs = model.encoder(src, src_valid_lens).detach()
    cache_names = [f"cache_{kv}_{i}" for i in range(num_blks) for kv in "kv"]
    axes = {"tokens": {0: "batch", 1: "steps"}, "enc_outputs": {0: "batch", 1: "src_len"}}
    axes["src_valid_lens"] = {0: "batch"}
    axes.update({name: {0: "batch", 2: "past"} for name in cache_names})
    export(
        _DecoderStep(model),
        (tensor(numpy.array([[2], [2]], dtype=numpy.int64)), enc_outputs, src_valid_lens, *_empty_caches(model, 2, 2)),
        paths[1],
        input_names=["tokens", "enc_outputs", "src_valid_lens", *cache_names],
        output_names=["logits", *[f"new_{name}" for name in cache_names]],
        dynamic_axes=axes,
    )
    with open(paths[2], "w", encoding="utf-8") as f:
        json.dump(
            {
                "src": src_vocab.to_tokens(list(range(len(src_vocab)))),
                "tgt": tgt_vocab.to_tokens(list(range(len(tgt_vocab)))),
                "num_steps": num_steps,
                "max_len": max_len,
                "num_blks": num_blks,
            },
            f,
            ensure_ascii=False,
        )
    return paths
