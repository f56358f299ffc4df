"""A language model (``TransformerLM``) as one ONNX graph.

``export_language_model(model, folder, vocab, num_steps)`` writes

- ``model.onnx``: tokens (batch, num_steps) int64 -> logits (batch, num_steps, |V|), the
  model's full-window forward pass: position i's logits predict token i + 1 from tokens
  0 .. i (causal). Batch and num_steps are dynamic axes; num_steps goes up to the length of
  the model's positional tables (``max_len`` in vocab.json). There is no key/value cache: generating with
  the graph means running the whole window again for every new token, the last position's
  logits giving the next one;
- ``vocab.json``: the vocabulary (``idx_to_token``: id -> token), the training window
  ``num_steps``, ``max_len`` and ``tokens`` ("char": one token per character; "bpe": byte-pair
  tokens, each written as GPT-2 writes them, "Ġthe" for " the");
- ``tokenizer.json`` (a BPE model only): the tokenizer's merges (``minitensor.data.ByteBPE.load``
  reads it); a token of the tokenizer is index ``len(reserved_tokens) + token`` of the model.

Running it without minitensor::

    import json, numpy, onnxruntime
    meta = json.load(open("DIR/vocab.json"))
    ids = {t: i for i, t in enumerate(meta["vocab"]["idx_to_token"])}
    session = onnxruntime.InferenceSession("DIR/model.onnx")
    (logits,) = session.run(None, {"tokens": numpy.array([[ids[c] for c in "the time"]])})
    next_char = meta["vocab"]["idx_to_token"][logits[0, -1].argmax()]
"""

import json
import os

import numpy

from .. import tensor
from ..atomic import write_atomic
from ..nn.transformer import TransformerLM
from .export import export
from .graph import ExportError

FILES = ("model.onnx", "vocab.json")
TOKENIZER_FILE = "tokenizer.json"  # a BPE model's, beside them


def positional_max_len(model):
    """The longest window ``model``'s positional encodings allow: the smallest ``max_len`` of
    its modules that have one (their tables' length), or None if none has."""
    lengths = [m.max_len for m in model.modules() if isinstance(getattr(m, "max_len", None), int)]
    return min(lengths, default=None)


def export_language_model(model, folder, vocab, num_steps, tokens="char", tokenizer=None):
    """Write ``model`` (a ``TransformerLM``) as ``model.onnx`` and its vocabulary as ``vocab.json``
    into ``folder`` (see the module docstring); returns the paths. ``num_steps``: the window the
    model was trained on; ``tokens``: "char", "word" or "bpe", what a token is; ``tokenizer``: a
    BPE model's ``ByteBPE`` (required with "bpe"), written as ``tokenizer.json``. The trace runs
    on a batch of two windows of three tokens; the model is left in the mode it was in."""
    if not isinstance(model, TransformerLM):
        raise ExportError(
            f"export_language_model writes a TransformerLM, got {type(model).__name__} "
            "(mt.onnx.export writes any module's forward pass)"
        )
    if (tokens == "bpe") != (tokenizer is not None):
        raise ExportError(
            f"export_language_model: tokens={tokens!r} with tokenizer={type(tokenizer).__name__}; "
            'a BPE model (tokens="bpe") needs its ByteBPE, and only it takes one'
        )
    os.makedirs(folder, exist_ok=True)
    paths = [os.path.join(folder, name) for name in FILES]
    example = tensor(numpy.zeros((2, 3), dtype=numpy.int64))
    export(
        model,
        (example,),
        paths[0],
        input_names=["tokens"],
        output_names=["logits"],
        dynamic_axes={"tokens": {0: "batch", 1: "num_steps"}, "logits": {0: "batch", 1: "num_steps"}},
    )
    meta = {
        "model": "lm",
        "vocab": vocab.to_dict(),
        "num_steps": num_steps,
        "max_len": positional_max_len(model),  # the longest window the graph takes
        "tokens": tokens,
    }
    write_atomic(paths[1], json.dumps(meta, ensure_ascii=False).encode("utf-8"))
    if tokenizer is not None:
        paths.append(tokenizer.save(os.path.join(folder, TOKENIZER_FILE)))
    return paths
