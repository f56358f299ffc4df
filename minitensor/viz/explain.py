"""From a trained model and an input to an ``AttentionPage``: ``mt.viz.attention_page``.

1. Decode the input as the CLI does (``translate`` for an encoder-decoder, greedy or beam
   search; ``generate`` for a language model, greedy).
2. Run the model once more, teacher-forced on its own output, inside ``mt.viz.capture`` and
   with gradients on: every attention layer records its scores, bias, allowed keys and
   weights for exactly what the page shows.
3. The cross-entropy of that pass against the output is the loss of the page's backward:
   the graph of the first attention call (``mt.viz.graph``) records each node's gradient
   norm under it.
"""

import numpy

from .. import tensor
from ..data.batching import build_array
from ..grad_mode import enable_grad
from ..inference import generate, model_device, translate
from ..ops.loss import cross_entropy
from .capture import capture
from .graph import graph
from .page import AttentionPage


def attention_page(
    model,
    source,
    src_vocab,
    tgt_vocab=None,
    *,
    max_len=20,
    beam_size=1,
    num_steps=None,
    lang="en",
    title=None,
    token_label=str,
):
    """The page of ``model`` on ``source`` (a list of tokens, or a string: its characters).

    An encoder-decoder (Transformer or Bahdanau) translates ``source`` with ``src_vocab`` and
    ``tgt_vocab`` (beam search with ``beam_size`` > 1: the page shows the best hypothesis'
    attention and lists the others with their scores), at most ``max_len`` tokens, the source
    padded to ``num_steps`` as in training (default: no padding); a language model
    (``tgt_vocab`` None) continues the prompt ``source`` by ``max_len`` tokens. ``lang``:
    "en" or "zh", the language the page opens in; ``token_label``: the text a token shows as
    (a BPE model's: ``minitensor.data.bpe.symbol_text``).
    """
    tokens = list(source)
    if not tokens:
        raise ValueError("attention_page: the input is empty; give a sentence (or, for a language model, a prompt)")
    device = model_device(model)
    was_training = model.training
    model.eval()
    try:
        if hasattr(model, "encoder"):
            steps = max(num_steps or 0, len(tokens) + 1)
            page_input = _seq2seq(model, tokens, src_vocab, tgt_vocab or src_vocab, max_len, beam_size, steps, device)
        else:
            page_input = _language_model(model, tokens, src_vocab, max_len, device)
    finally:
        model.train(was_training)
    cap, loss, shown_tokens, output, alternatives = page_input
    first = next(iter(cap.outputs.values()), None)
    names = dict(model.named_parameters())  # the leaves drawn by the names of their parameters
    # the graph's words (leaf, saved, |grad|) in the language the page opens in
    drawing = None if first is None or not first.requires_grad else graph(first, names, lang).backward(loss=loss)
    return AttentionPage(
        cap, shown_tokens, output, alternatives, drawing, title=title, lang=lang, token_label=token_label
    )


def _seq2seq(model, tokens, src_vocab, tgt_vocab, max_len, beam_size, steps, device):
    hyps = translate(model, tokens, src_vocab, tgt_vocab, steps, beam_size, max_len=max_len, n_best=beam_size)
    best = hyps[0]
    # the source as it was encoded (its tokens, <eos>, padding to ``steps``); the decoder's
    # input is <bos> and the output, its target the output and <eos>
    enc_X, enc_valid_lens = build_array([tokens], src_vocab, steps)
    out_ids = tgt_vocab[list(best.tokens)]
    dec_X = numpy.array([[tgt_vocab.bos] + out_ids])
    target = numpy.array([out_ids + [tgt_vocab.eos]])
    with enable_grad(), capture(model) as cap:
        enc_X, dec_X, enc_valid_lens = (tensor(a, device=device) for a in (enc_X, dec_X, enc_valid_lens))
        logits = model(enc_X, dec_X, enc_valid_lens)
        loss = cross_entropy(logits, tensor(target, device=device))
    source = tokens + ["<eos>"] + ["<pad>"] * (steps - len(tokens) - 1)
    shown = {"encoder": source, "decoder": ["<bos>"] + list(best.tokens)}
    alternatives = [(h.tokens, h.score) for h in hyps[1:]]
    return cap, loss, shown, list(best.tokens), alternatives


def _language_model(model, tokens, vocab, max_len, device):
    hyp = generate(model, tokens, vocab, max_len)
    sequence = list(hyp.tokens)  # the prompt and its continuation
    ids = numpy.array([vocab[sequence]])
    with enable_grad(), capture(model) as cap:
        logits = model(tensor(ids[:, :-1], device=device))
        loss = cross_entropy(logits, tensor(ids[:, 1:], device=device))
    return cap, loss, {"decoder": sequence[:-1]}, sequence[len(tokens) :], []
