"""From a trained model and an input to an ``AttentionPage``: ``mt.viz.attention_page``.

1. Decode the input as the CLI does (``translate`` for an encoder-decoder, greedy or beam
   search; ``generate`` for a language model, greedy).
2. Run the model once more, teacher-forced on its own output, inside ``mt.viz.capture`` and
   with gradients on: every attention layer records its scores, bias, allowed keys and
   weights for exactly what the page shows.
3. The cross-entropy of that pass against the output is the loss of the page's backward:
   the graph of the first attention call (``mt.viz.graph``) records each node's gradient
   norm under it.
4. With a key/value cache policy other than ``full`` (a language model's ``cache=``), the
   continuation is generated with that policy and decoded once more, token by token, through
   the same caches: at every step each block's cache reports the tokens it holds
   (``kept()``), the positions the attention gives them (``positions()``) and its memory
   (``bytes()``), and the step's query its weights over them. The teacher-forced pass of 2.
   attends every earlier token, as ``full`` does; these steps show what decoding with the
   policy really attended.
"""

import numpy

from .. import Tensor, tensor
from ..data.batching import build_array
from ..grad_mode import enable_grad, no_grad
from ..inference import generate, model_device, translate
from ..nn.attention import new_cache, plain_attention
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
    cache=None,
    cache_options=None,
):
    """The page of ``model`` on ``source`` (a list of tokens, or a string: its characters).

    An encoder-decoder (Transformer or Bahdanau) translates ``source`` with ``src_vocab`` and
    ``tgt_vocab`` (beam search with ``beam_size`` > 1: the page shows the best hypothesis'
    attention and lists the others with their scores), at most ``max_len`` tokens, the source
    padded to ``num_steps`` as in training (default: no padding); a language model
    (``tgt_vocab`` None) continues the prompt ``source`` by ``max_len`` tokens. ``lang``:
    "en" or "zh", the language the page opens in; ``token_label``: the text a token shows as
    (a BPE model's: ``minitensor.data.bpe.symbol_text``).

    ``cache``, ``cache_options``: a language model's key/value cache policy (a registered
    name, ``minitensor.plugins.kv_caches()``) and its options. ``None`` or ``"full"``: the page
    as without them. Any other policy generates the continuation with it, and the page gains
    a section that shows, for the decoding step the reader picks, the tokens each block's
    cache holds (those it dropped struck through), its memory and the weights that step's
    query gave the kept tokens (``AttentionPage.cache``). An encoder-decoder's page refuses
    one: ``translate`` decodes with the full cache.
    """
    tokens = list(source)
    if not tokens:
        raise ValueError("attention_page: the input is empty; give a sentence (or, for a language model, a prompt)")
    policy = _policy(model, cache, cache_options)
    device = model_device(model)
    was_training = model.training
    model.eval()
    try:
        if hasattr(model, "encoder"):
            steps = max(num_steps or 0, len(tokens) + 1)
            page_input = _seq2seq(model, tokens, src_vocab, tgt_vocab or src_vocab, max_len, beam_size, steps, device)
        else:
            page_input = _language_model(model, tokens, src_vocab, max_len, device, policy)
    finally:
        model.train(was_training)
    cap, loss, shown_tokens, output, alternatives, recorded = page_input
    first = next(iter(cap.outputs.values()), None)
    names = dict(model.named_parameters())  # the leaves drawn by the names of their parameters
    # the graph's words (leaf, saved, |grad|) in the language the page opens in
    drawing = None if first is None or not first.requires_grad else graph(first, names, lang).backward(loss=loss)
    return AttentionPage(
        cap,
        shown_tokens,
        output,
        alternatives,
        drawing,
        title=title,
        lang=lang,
        token_label=token_label,
        cache=recorded,
    )


def _policy(model, cache, cache_options):
    """(name, options) of the cache policy the page shows, or None for the page without one.
    Builds the policy once, so that an unknown name or option fails here, named, before any
    decoding."""
    if cache is None:
        if cache_options:
            raise ValueError(
                f"attention_page: cache_options {cache_options!r} set options of a cache policy: name it with cache="
            )
        return None
    new_cache(cache, cache_options)  # an unknown name lists the registered ones
    if cache == "full":  # the teacher-forced pass is what the full cache attends: the page as it is
        return None
    if hasattr(model, "encoder"):
        raise ValueError(
            f"attention_page: cache={cache!r}: an encoder-decoder's page translates with the full cache "
            "(translate takes no cache policy); the cache's steps are shown for a language model"
        )
    return cache, dict(cache_options or {})


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
    return cap, loss, shown, list(best.tokens), alternatives, None


def _language_model(model, tokens, vocab, max_len, device, policy):
    cache, options = policy or (None, None)
    hyp = generate(model, tokens, vocab, max_len, cache=cache, cache_options=options)
    sequence = list(hyp.tokens)  # the prompt and its continuation
    ids = numpy.array([vocab[sequence]])
    with enable_grad(), capture(model) as cap:
        logits = model(tensor(ids[:, :-1], device=device))
        loss = cross_entropy(logits, tensor(ids[:, 1:], device=device))
    steps = None
    if policy is not None:
        steps = {"policy": cache, "options": options, "tokens": sequence, "prompt": len(tokens)}
        steps["steps"] = cache_steps(model, ids[0], len(tokens), cache, options, device)
    return cap, loss, {"decoder": sequence[:-1]}, sequence[len(tokens) :], [], steps


def cache_steps(model, ids, prompt, cache, cache_options=None, device=None):
    """Decode ``ids`` (int (n,): a prompt of ``prompt`` tokens and its continuation) as
    ``generate`` did, with the cache policy ``cache``: the prompt in one ``decode_step``, then
    one token per step, the last token never fed. One record per step, i.e. per continuation
    token, whose query is the token before it, at text position ``t``:

    ``{"query": t, "blocks": [per block {"kept", "positions", "attended", "weights", "bytes",
    "full_bytes"}]}`` -- the text positions the block's cache holds after the step (``kept()``),
    the positions the attention gives them (``positions()``), which of them the query may see
    (the policy's ``mask``: a prompt longer than the window is held whole for one step), the
    weights (num_heads, K) that query gave them, the cache's ``bytes()`` and what a ``full``
    cache of the same keys and values would hold by then.
    """
    device = model_device(model) if device is None else device
    ids = numpy.asarray(ids, dtype=numpy.int64)
    steps = []
    was_training = model.training
    model.eval()
    # the plain path keeps every layer's weights (a streamed call keeps none)
    try:
        with no_grad(), plain_attention(model):
            state = model.begin_decoding(cache=cache, cache_options=cache_options)
            start = 0
            for end in range(prompt, len(ids)):
                _, state = model.decode_step(tensor(ids[None, start:end], device=device), state)
                blocks = [_cache_step(c, w, end - start) for c, w in zip(state[2], model.attention_weights)]
                steps.append({"query": end - 1, "blocks": blocks})
                start = end
    finally:
        model.train(was_training)
    return steps


def _cache_step(cache, weights, num_new):
    """What one block's cache holds after a step of ``num_new`` tokens, and its last query's weights."""
    # kept() and mask() are optional in the contract: without them, the positions and no mask
    kept = numpy.asarray(getattr(cache, "kept", cache.positions)(), dtype=numpy.int64)
    mask = cache.mask(num_new) if hasattr(cache, "mask") else None
    if isinstance(mask, Tensor):
        mask = mask.numpy()
    attended = numpy.ones(len(kept), dtype=bool)
    if mask is not None:
        attended = numpy.broadcast_to(numpy.asarray(mask, dtype=bool), (num_new, len(kept)))[-1].copy()
    keys, values = cache.keys(), cache.values()
    per_token = (keys.data.nbytes + values.data.nbytes) / max(keys.shape[-2], 1)  # as a full cache stores them
    return {
        "kept": kept,
        "positions": numpy.asarray(cache.positions(), dtype=numpy.int64),
        "attended": attended,
        "weights": weights.numpy()[0, :, -1, :],  # (batch 1, num_heads, num_new, K): the step's query
        "bytes": int(cache.bytes()),
        "full_bytes": int(round(per_token * cache.seen_tokens)),
    }
