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

from ..data import Vocab, build_array
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


def export_encoder_decoder(model, folder, src_vocab, tgt_vocab, num_steps, max_len, tokens="char"):
    """Write the encoder, one decoder step and the vocabularies into ``folder`` (see the module
    docstring); returns the paths. The traces run on a batch of two, with two cached steps."""
    os.makedirs(folder, exist_ok=True)
    num_blks = len(model.decoder.blks)
    src = tensor(numpy.array([[src_vocab.eos] * 3, [src_vocab.eos] * 3], dtype=numpy.int64))
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
                "src_vocab": src_vocab.to_dict(),
                "tgt_vocab": tgt_vocab.to_dict(),
                "num_steps": num_steps,
                "max_len": max_len,
                "tokens": tokens,  # "char" or "word": how a typed line becomes source tokens
                "num_blks": num_blks,
            },
            f,
            ensure_ascii=False,
        )
    return paths


class OnnxTranslator:
    """Greedy translation with the graphs ``export_encoder_decoder`` wrote, run by ONNX Runtime:
    the source encoded once, then one decoder step per output token, the key/value caches fed
    back, the most likely token chosen (never <pad> or <bos>) until <eos> or ``max_len`` --
    the search ``minitensor translate`` runs with ``--beam 1``."""

    def __init__(self, folder):
        try:
            import onnxruntime
        except ImportError as e:
            raise ImportError(f'running an exported model needs ONNX Runtime ({e}): pip install -e ".[onnx]"') from None
        missing = [name for name in FILES if not os.path.isfile(os.path.join(folder, name))]
        if missing:
            raise FileNotFoundError(
                f"{folder}: no exported model here (missing {', '.join(missing)}); write one with "
                "minitensor export --checkpoint RUN --onnx DIR"
            )
        with open(os.path.join(folder, "vocab.json"), encoding="utf-8") as f:
            meta = json.load(f)
        self.src_vocab, self.tgt_vocab = Vocab.from_dict(meta["src_vocab"]), Vocab.from_dict(meta["tgt_vocab"])
        self.num_steps, self.max_len, self.tokens = meta["num_steps"], meta["max_len"], meta.get("tokens", "char")
        options = onnxruntime.SessionOptions()
        options.log_severity_level = 3  # no warnings about the traced sizes of dynamic outputs
        self.encoder = onnxruntime.InferenceSession(os.path.join(folder, FILES[0]), options)
        self.decoder = onnxruntime.InferenceSession(os.path.join(folder, FILES[1]), options)
        self.cache_inputs = [i for i in self.decoder.get_inputs() if i.name.startswith("cache_")]

    def translate(self, sources, max_len=None):
        """The greedy translations (target token lists) of ``sources`` (source token lists)."""
        sources = [list(s) for s in sources]
        # padded as in training, longer sources kept whole (as minitensor translate does)
        steps = max([self.num_steps] + [len(s) + 1 for s in sources])
        X, valid_lens = build_array(sources, self.src_vocab, steps)
        X, valid_lens = X.astype(numpy.int64), valid_lens.astype(numpy.int64)
        (enc_outputs,) = self.encoder.run(None, {"src": X, "src_valid_lens": valid_lens})
        batch = len(X)
        caches = {
            i.name: numpy.zeros((batch, i.shape[1], 0, i.shape[3]), dtype=enc_outputs.dtype) for i in self.cache_inputs
        }
        forbid = [self.tgt_vocab.token_to_idx[t] for t in ("<pad>", "<bos>") if t in self.tgt_vocab]
        tokens = numpy.full((batch, 1), self.tgt_vocab.bos, dtype=numpy.int64)
        outputs, done = [[] for _ in range(batch)], numpy.zeros(batch, dtype=bool)
        for _ in range(max_len or self.max_len or 2 * self.num_steps):
            logits, *new = self.decoder.run(
                None, {"tokens": tokens, "enc_outputs": enc_outputs, "src_valid_lens": valid_lens, **caches}
            )
            caches = dict(zip(caches, new))
            scores = logits[:, -1].copy()
            scores[:, forbid] = -numpy.inf
            choice = scores.argmax(axis=-1)
            for b in numpy.flatnonzero(~done):
                if choice[b] == self.tgt_vocab.eos:
                    done[b] = True
                else:
                    outputs[b].append(int(choice[b]))
            if done.all():
                break
            tokens = choice[:, None].astype(numpy.int64)
        return [self.tgt_vocab.to_tokens(o) for o in outputs]
