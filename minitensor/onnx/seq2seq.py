"""An encoder-decoder as two ONNX graphs, and greedy decoding with ONNX Runtime.

``export_encoder_decoder(model, folder, src_vocab, tgt_vocab, num_steps, max_len)`` writes, for
an encoder-decoder Transformer (``EncoderDecoder(TransformerEncoder, TransformerDecoder)``) or
D2L's GRU with Bahdanau attention (``Seq2Seq(Seq2SeqEncoder, Seq2SeqAttentionDecoder)``):

- ``encoder.onnx``: (src (batch, num_steps) int64, src_valid_lens (batch,) int64) ->
  enc_outputs (batch, num_steps, num_hiddens), and for the GRU also hidden_state
  (num_layers, batch, num_hiddens), the encoder's last state, where the decoder's GRU starts;
- ``decoder_step.onnx``: one step of D2L's decoding, the decoder's state as inputs and outputs:
  (tokens (batch, t), enc_outputs, src_valid_lens, *state) -> (logits (batch, t, |V|),
  *new_state), where the state is

  - Transformer: ``cache_k_i``, ``cache_v_i`` per block, (batch, num_kv_heads, past, d_head),
    the keys and values of the past tokens (a ``full`` cache's); the new ones are extended to
    past + t. t and past are dynamic; the first step feeds caches with past = 0;
  - Bahdanau: ``hidden_state`` (num_layers, batch, num_hiddens), the GRU's state; t is 1 (the
    decoder runs its GRU one token after another, and the trace unrolls one step);

  a state input ``name`` comes back as the output ``new_name``; enc_outputs and src_valid_lens
  do not change. Batch and the source length are dynamic axes of both graphs;
- ``vocab.json``: both vocabularies, the model's kind, the source length and the longest output.

``OnnxTranslator(folder)`` loads them with ONNX Runtime and translates as ``minitensor
translate`` does with greedy search, without minitensor's model code.
"""

import json
import os

import numpy

from .. import tensor
from ..atomic import write_atomic
from ..data import Vocab, build_array
from ..grad_mode import no_grad
from ..nn import Module
from ..nn.seq2seq import AttentionDecoderState, Seq2SeqAttentionDecoder
from ..nn.transformer import TransformerDecoder
from .export import export
from .graph import ExportError

FILES = ("encoder.onnx", "decoder_step.onnx", "vocab.json")
KINDS = ("transformer", "bahdanau")


def model_kind(model):
    """ "transformer" or "bahdanau": which encoder-decoder ``model`` is, by its decoder."""
    decoder = getattr(model, "decoder", None)
    if isinstance(decoder, TransformerDecoder) and getattr(model, "encoder", None) is not None:
        return "transformer"
    if isinstance(decoder, Seq2SeqAttentionDecoder):
        return "bahdanau"
    raise ExportError(
        f"export_encoder_decoder writes encoder-decoder Transformers and GRUs with Bahdanau attention; "
        f"{type(model).__name__} with decoder {type(decoder).__name__} is neither "
        "(mt.onnx.export writes any module's forward pass)"
    )


class _TransformerEncoder(Module):
    """src (batch, num_steps), src_valid_lens (batch,) -> enc_outputs (batch, num_steps, num_hiddens)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, src, src_valid_lens):
        return self.model.encoder(src, src_valid_lens)


class _TransformerStep(Module):
    """tokens (batch, t), enc_outputs, src_valid_lens, cache_k_0, cache_v_0, ... -> logits
    (batch, t, |V|), the caches extended by t positions."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, tokens, enc_outputs, src_valid_lens, *caches):
        state = self.model.decoder.init_state(enc_outputs, src_valid_lens)  # a `full` cache per block
        for i, cache in enumerate(state[2]):  # holding the past tokens' keys and values given
            keys, values = caches[2 * i], caches[2 * i + 1]
            past = keys.shape[2]
            cache.append(keys, values, numpy.arange(past, dtype=numpy.int64))
            cache.seen_tokens = past
        logits, state = self.model.decode_step(tokens, state)
        return (logits, *[t for cache in state[2] for t in (cache.keys(), cache.values())])


class _BahdanauEncoder(Module):
    """src (batch, num_steps), src_valid_lens (batch,) -> the decoder's first state:
    enc_outputs (batch, num_steps, num_hiddens), batch-major as attention takes them, and
    hidden_state (num_layers, batch, num_hiddens), the encoder's last state."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, src, src_valid_lens):
        state = self.model.begin_decoding(src, src_valid_lens)
        return state.enc_outputs, state.hidden_state


class _BahdanauStep(Module):
    """tokens (batch, 1), enc_outputs (batch, num_steps, num_hiddens), src_valid_lens (batch,),
    hidden_state (num_layers, batch, num_hiddens) -> logits (batch, 1, |V|), the new hidden_state."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, tokens, enc_outputs, src_valid_lens, hidden_state):
        state = AttentionDecoderState(enc_outputs, hidden_state, src_valid_lens)
        logits, state = self.model.decode_step(tokens, state)
        return logits, state.hidden_state


def _empty_caches(model, batch, past=0):
    """Zero caches of ``past`` positions for every decoder block: (batch, num_kv_heads, past, d_head)."""
    caches = []
    for blk in model.decoder.blks:
        attention = blk.attention1
        shape = (batch, attention.num_kv_heads, past, attention.head_size)
        caches += [tensor(numpy.zeros(shape, dtype=attention.W_k.weight.data.dtype)) for _ in range(2)]
    return caches


def _decoder_step(model, kind, encoded):
    """(the step module, its state's names, example state values, the state's dynamic axes, the
    tokens' dynamic axes) for ``kind``; ``encoded``: the encoder graph's example outputs."""
    if kind == "transformer":
        names = [f"cache_{kv}_{i}" for i in range(len(model.decoder.blks)) for kv in "kv"]
        axes = {name: {0: "batch", 2: "past"} for name in names}
        return _TransformerStep(model), names, _empty_caches(model, 2, 2), axes, {0: "batch", 1: "steps"}
    hidden_state = encoded[1]
    return _BahdanauStep(model), ["hidden_state"], [hidden_state], {"hidden_state": {1: "batch"}}, {0: "batch"}


def export_encoder_decoder(model, folder, src_vocab, tgt_vocab, num_steps, max_len, tokens="char"):
    """Write the encoder, one decoder step and the vocabularies into ``folder`` (see the module
    docstring); returns the paths. ``model``: a Transformer or Bahdanau encoder-decoder
    (``ExportError`` for another); ``num_steps``: the source length of training (sources are
    padded to it); ``max_len``: the longest output; ``tokens``: "char" or "word", how a typed
    line becomes source tokens. The traces run on a batch of two (the Transformer's with two
    cached steps); the model is left in the mode it was in."""
    kind = model_kind(model)
    os.makedirs(folder, exist_ok=True)
    src = tensor(numpy.array([[src_vocab.eos] * 3, [src_vocab.eos] * 3], dtype=numpy.int64))
    src_valid_lens = tensor(numpy.array([3, 2], dtype=numpy.int64))
    paths = [os.path.join(folder, name) for name in FILES]
    source_axes = {"src": {0: "batch", 1: "src_len"}, "src_valid_lens": {0: "batch"}}

    encoder = _TransformerEncoder(model) if kind == "transformer" else _BahdanauEncoder(model)
    encoder_outputs = ["enc_outputs"] + (["hidden_state"] if kind == "bahdanau" else [])
    export(
        encoder,
        (src, src_valid_lens),
        paths[0],
        input_names=["src", "src_valid_lens"],
        output_names=encoder_outputs,
        dynamic_axes=source_axes,
    )
    was_training = model.training
    model.eval()
    try:
        with no_grad():
            encoded = encoder(src, src_valid_lens)
        encoded = encoded if isinstance(encoded, tuple) else (encoded,)
        step, state_names, state, state_axes, token_axes = _decoder_step(model, kind, encoded)
        first_tokens = tensor(numpy.full((2, 1), tgt_vocab.bos, dtype=numpy.int64))
        export(
            step,
            (first_tokens, encoded[0], src_valid_lens, *state),
            paths[1],
            input_names=["tokens", "enc_outputs", "src_valid_lens", *state_names],
            output_names=["logits", *[f"new_{name}" for name in state_names]],
            dynamic_axes={
                "tokens": token_axes,
                "enc_outputs": {0: "batch", 1: "src_len"},
                "src_valid_lens": {0: "batch"},
                **state_axes,
            },
        )
    finally:
        model.train(was_training)
    num_blks = len(model.decoder.blks) if kind == "transformer" else model.decoder.num_layers
    meta = {
        "model": kind,
        "src_vocab": src_vocab.to_dict(),
        "tgt_vocab": tgt_vocab.to_dict(),
        "num_steps": num_steps,
        "max_len": max_len,
        "tokens": tokens,  # "char" or "word": how a typed line becomes source tokens
        "num_blks": num_blks,  # Transformer blocks, or GRU layers
    }
    write_atomic(paths[2], json.dumps(meta, ensure_ascii=False).encode("utf-8"))
    return paths


class OnnxTranslator:
    """Greedy translation with the graphs ``export_encoder_decoder`` wrote, run by ONNX Runtime:
    the source encoded once, then one decoder step per output token, the decoder's state fed
    back (a state input ``name`` gets the step's output ``new_name``), the most likely token
    chosen (never <pad> or <bos>) until <eos> or ``max_len`` -- the search ``minitensor
    translate`` runs with ``--beam 1``.

    The state starts as the encoder graph's output of the same name (the GRU's
    ``hidden_state``) or, where there is none, empty (the Transformer's caches: past = 0)."""

    def __init__(self, folder):
        try:
            import onnxruntime
        except ImportError as e:
            raise ImportError(f'running an exported model needs ONNX Runtime ({e}): pip install -e ".[onnx]"') from None
        missing = [name for name in FILES if not os.path.isfile(os.path.join(folder, name))]
        if missing:
            if os.path.isfile(os.path.join(folder, "model.onnx")):
                raise ValueError(
                    f"{folder}: this is an exported language model (model.onnx), not an encoder-decoder; "
                    "translate needs encoder.onnx and decoder_step.onnx"
                )
            raise FileNotFoundError(
                f"{folder}: no exported model here (missing {', '.join(missing)}); write one with "
                "minitensor export --checkpoint RUN --onnx DIR"
            )
        with open(os.path.join(folder, "vocab.json"), encoding="utf-8") as f:
            meta = json.load(f)
        self.kind = meta.get("model", "transformer")
        self.src_vocab, self.tgt_vocab = Vocab.from_dict(meta["src_vocab"]), Vocab.from_dict(meta["tgt_vocab"])
        self.num_steps, self.max_len, self.tokens = meta["num_steps"], meta["max_len"], meta.get("tokens", "char")
        options = onnxruntime.SessionOptions()
        options.log_severity_level = 3  # no warnings about the traced sizes of dynamic outputs
        self.encoder = onnxruntime.InferenceSession(os.path.join(folder, FILES[0]), options)
        self.decoder = onnxruntime.InferenceSession(os.path.join(folder, FILES[1]), options)
        fixed = ("tokens", "enc_outputs", "src_valid_lens")
        self.state_inputs = [i for i in self.decoder.get_inputs() if i.name not in fixed]

    def _initial_state(self, encoded, batch):
        """The decoder's first state: each state input from the encoder's output of its name, or
        zeros whose named axes other than the batch are empty (the Transformer's caches)."""
        state = {}
        for i in self.state_inputs:
            if i.name in encoded:
                state[i.name] = encoded[i.name]
            else:
                shape = [batch if d == "batch" else (d if isinstance(d, int) else 0) for d in i.shape]
                state[i.name] = numpy.zeros(shape, dtype=encoded["enc_outputs"].dtype)
        return state

    def translate(self, sources, max_len=None):
        """The greedy translations (target token lists) of ``sources`` (source token lists)."""
        sources = [list(s) for s in sources]
        # padded as in training, longer sources kept whole (as minitensor translate does); the
        # GRU encoder reads the padding too, so sources of one padded length go together
        lengths = [max(self.num_steps, len(s) + 1) for s in sources]
        results = [None] * len(sources)
        for steps in sorted(set(lengths)):
            rows = [i for i, n in enumerate(lengths) if n == steps]
            for i, out in zip(rows, self._translate([sources[i] for i in rows], steps, max_len)):
                results[i] = out
        return results

    def _translate(self, sources, steps, max_len):
        X, valid_lens = build_array(sources, self.src_vocab, steps)
        X, valid_lens = X.astype(numpy.int64), valid_lens.astype(numpy.int64)
        outputs = self.encoder.run(None, {"src": X, "src_valid_lens": valid_lens})
        encoded = dict(zip([o.name for o in self.encoder.get_outputs()], outputs))
        batch = len(X)
        state = self._initial_state(encoded, batch)
        forbid = [self.tgt_vocab.token_to_idx[t] for t in ("<pad>", "<bos>") if t in self.tgt_vocab]
        tokens = numpy.full((batch, 1), self.tgt_vocab.bos, dtype=numpy.int64)
        outputs, done = [[] for _ in range(batch)], numpy.zeros(batch, dtype=bool)
        for _ in range(max_len or self.max_len or 2 * self.num_steps):
            feed = {"tokens": tokens, "enc_outputs": encoded["enc_outputs"], "src_valid_lens": valid_lens, **state}
            logits, *new = self.decoder.run(["logits", *[f"new_{name}" for name in state]], feed)
            state = dict(zip(state, new))
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
