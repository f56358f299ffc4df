"""Decoding: turning a trained model's next-token distributions into sequences (D2L 10.8).

A decoder gives, at every step, a distribution over the next token given the source c and
the tokens y_1 .. y_{t-1} chosen so far. Choosing the output sequence is a search over all
sequences for

    argmax_y  (1 / L^alpha) * log P(y | c)
            = (1 / L^alpha) * sum_{t=1..L} log P(y_t | y_1 .. y_{t-1}, c)

where L counts the scored tokens (the final <eos> included when the sequence has one) and
alpha is the *length penalty*: with alpha = 0 long sequences lose simply for having more
(negative) terms; alpha = 0.75 is D2L's choice (10.8.3) and roughly undoes that bias.
There are |V|^L sequences of length L, so exhaustive search is out of the question; two
approximations are in use:

- **greedy search**: take the most likely token at every step. One model call per step,
  but a token that looks good now may lead only to poor continuations.
- **beam search**: keep the k best partial sequences ("hypotheses"). At every step extend
  each of them by every token, and keep the k best of the k * |V| extensions. With k = 1 it
  is greedy search; with k large enough to keep every hypothesis it is exhaustive search.

Both run here through one loop (``_search``): greedy search *is* beam search with k = 1,
and sampling is the same loop with k = 1 ranking Gumbel-perturbed scores (see ``sample``).

*Processors* may reshape every step's log-probabilities before the ranking: a temperature, a
truncation to the top-k tokens, a repetition penalty (``decoders.py``; the built-ins and the
searches built on this loop are plugins, ``plugins/minitensor_plugins/decoders.py``). The
loop then ranks by the processed scores, summed along each hypothesis as log P is below,
while the scores it reports stay the model's own log P. Without processors the two are the
same numbers. <pad> and <bos> are kept out by one (``Forbid``).

The rules of this beam search, per example (fairseq's, and Hugging Face's with
``early_stopping=True``, except for the second half of rule 4):

1. Every live hypothesis h of length t - 1 is extended by every token v; an extension's
   score is its total log-probability, score(h) + log P(v | h, c). All extensions have the
   same length t, so ranking them by this sum is the same as ranking them by the length-
   normalised score.
2. An extension by <eos> that ranks among the k best extensions is a *finished* hypothesis:
   it leaves the beam and is never extended again.
3. The k best extensions by any other token form the new beam.
4. An example is done once it has k finished hypotheses *and* the best of this step's
   extensions was an <eos>; every hypothesis still alive after ``max_len`` steps is
   finished too, without an <eos>.
5. The answer is the finished hypothesis with the best length-normalised score
   log P / L^alpha (or the ``n_best`` best).

Rule 4 is a heuristic: a hypothesis still alive might have finished with a better score
than the finished ones (all the likelier with alpha > 0, which rewards length). Its second
half matters for a confident model: fairseq and Hugging Face (``early_stopping=True``)
stop at k finished hypotheses, and the k - 1 spare slots of a confident beam fill with
unlikely prefixes that end early ("195<eos>", "19<eos>"), so the search could stop before
the likely hypothesis reaches its <eos> and return worse than greedy search. Nothing else
is approximate, so a beam wide enough never to prune anything (k above the number of
possible sequences) returns exactly what exhaustive search would.

With k = 1, rule 2 finishes the hypothesis exactly when <eos> is the most likely token and
rule 3 continues with the most likely token otherwise: greedy search, step for step.

Batching. Each example's hypotheses are rows of one batch: row ``e * width + j`` is
hypothesis j of example e. After every step the chosen rows are gathered with the model's
``reorder_state(state, parents)`` (rows may repeat: two hypotheses can share a parent), and
examples that are done simply drop out of the gather, so later steps cost nothing for them.
The bookkeeping (scores, choices, back-pointers) is small and lives on the host in NumPy;
the model runs on its own device, and each step moves only the (rows, |V|) log-probabilities
to the host and one (rows, 1) tensor of chosen tokens back.

A hypothesis is not stored as a growing list: each step records the chosen tokens and the row
each came from (a back-pointer), and the finished sequences are read backwards at the end,
as in the Viterbi algorithm -- O(1) work per row and step instead of copying prefixes.

The model is any object with D2L's incremental decoding API (``EncoderDecoder``,
``Seq2Seq``, ``TransformerLM``):

    state = model.begin_decoding(enc_X, enc_valid_lens)      # or lm.begin_decoding()
    logits, state = model.decode_step(tokens, state)         # (batch, t) -> (batch, t, |V|)
    state = model.reorder_state(state, indices)              # keep / repeat batch rows
"""

import contextlib
from typing import NamedTuple

import numpy

from .. import Tensor, tensor
from ..backends import get_backend
from ..data.batching import build_array
from ..grad_mode import no_grad
from ..nn.attention import plain_attention
from ..ops import log_softmax
from ..random import host_rng
from .decoders import Decoder, Forbid, apply_processors, decoder

__all__ = [
    "Hypothesis",
    "beam_search",
    "greedy",
    "sample",
    "translate",
    "generate",
    "step_attention",
    "run_search",
]

# The temperature at which a character LM's text is sampled (``minitensor generate`` and the
# samples at the end of training): greedy search repeats a phrase, temperature 1 strays into
# non-words. Of the words the example LM (docs/guide.md) writes at 0.4 / 0.5 / 0.6 / 0.7, 89 / 92 / 86
# / 83% are words of its book.
SAMPLE_TEMPERATURE = 0.5


class Hypothesis(NamedTuple):
    """One decoded sequence.

    ``tokens``: the generated token ids (without <bos>, the prompt and the final <eos>;
    ``translate`` and ``generate`` give token strings instead). ``log_prob``: log P of the
    generated tokens, the <eos> included when there is one. ``score``: log_prob / L^alpha,
    L = len(tokens) + ended, what beam search maximises (with processors, it ranks by their
    scores' sum / L^alpha instead; ``log_prob`` and ``score`` stay the model's). ``ended``: True when the model chose
    <eos>, False when ``max_len`` cut the sequence. ``attention``: with ``attention=True``, a
    NumPy array (..., L, K), one query row per scored token (<eos> included, as in D2L's
    ``predict_seq2seq``) and one column per key: (L, num_enc_steps) for the Bahdanau model,
    (num_blks, num_heads, L, num_enc_steps) for the Transformer -- the layout
    ``show_heatmaps`` draws, a row of panels per block and a column per head; else None.
    """

    tokens: list
    score: float
    log_prob: float
    ended: bool
    attention: numpy.ndarray | None = None


# -- what the loop needs from the model ------------------------------------------------------------
def model_device(model):
    """The device of the model's parameters (where the tokens we feed must live)."""
    for p in getattr(model, "parameters", lambda: ())():
        return p.device
    return "cpu"


def _check_model(model, op, vocabs):
    """Refuse, by name, a model without the decoding API above, and a vocabulary with more
    tokens than the model embeds (``vocabs``: (vocab, the module whose ``config.vocab_size``
    sizes its table, what the vocabulary is)), before the model runs: otherwise the error is an
    AttributeError or an embedding's index error from inside it."""
    missing = [name for name in ("begin_decoding", "decode_step", "reorder_state") if not hasattr(model, name)]
    if missing:
        raise TypeError(
            f"{op}: a {type(model).__name__} cannot decode, it has no {', '.join(missing)} (the decoding API of "
            "TransformerLM, EncoderDecoder and Seq2Seq: minitensor/inference/decoding.py)"
        )
    for vocab, module, what in vocabs:
        size = getattr(getattr(module, "config", None), "vocab_size", None)
        if isinstance(size, int) and len(vocab) > size:
            raise ValueError(
                f"{op}: the {what} has {len(vocab)} tokens, more than the {size} that the model embeds; "
                "is it the vocabulary the model was trained with?"
            )


@contextlib.contextmanager
def _inference(model):
    """Evaluation mode (no dropout) and no autograd graph for the duration, then every
    module's own mode back as it was (a model may be mid-training, or mixed on purpose)."""
    modules = list(model.modules()) if hasattr(model, "modules") else []
    modes = [m.training for m in modules]
    for m in modules:
        m.training = False
    try:
        with no_grad():
            yield
    finally:
        for m, mode in zip(modules, modes):
            m.training = mode


def _first_tensor(obj):
    if isinstance(obj, Tensor):
        return obj
    if isinstance(obj, (list, tuple)):
        for o in obj:
            t = _first_tensor(o)
            if t is not None:
                return t
    return None


def _batch_size(state, prompt, batch_size):
    """How many examples: given, else the prompt's rows, else the first axis of the first
    tensor in the state (the encoder's outputs, for both built-in encoder-decoders), else 1
    (a language model's empty state fits any batch)."""
    if batch_size is not None:
        return int(batch_size)
    if prompt is not None and prompt.ndim == 2:
        return prompt.shape[0]
    first = _first_tensor(state)
    return 1 if first is None else first.shape[0]


def _start_tokens(bos, prompt, batch):
    """The first input, (batch, t): <bos> (if any) followed by the prompt (if any)."""
    head = numpy.empty((batch, 0), dtype=numpy.int64) if bos is None else numpy.full((batch, 1), bos, numpy.int64)
    if prompt is None:
        start = head
    else:
        if prompt.ndim == 1:  # one prompt for every example
            prompt = numpy.broadcast_to(prompt, (batch, prompt.shape[0]))
        if prompt.shape[0] != batch:
            raise ValueError(f"the prompt has {prompt.shape[0]} rows for a batch of {batch} examples")
        start = numpy.concatenate([head, prompt], axis=1)
    if start.shape[1] == 0:
        raise ValueError("nothing to start decoding from: give bos, or a non-empty prompt")
    return start


def _as_prompt(prompt):
    """A prompt as an int64 array: (t,) for one shared by all examples, (batch, t) per example.
    Prompts of different lengths cannot share a batch: the decoders have no padding mask for
    their own past, so a pad token would be attended as if it were text."""
    if prompt is None:
        return None
    if isinstance(prompt, Tensor):
        prompt = prompt.numpy()
    if not isinstance(prompt, numpy.ndarray):
        prompt = list(prompt)
        if prompt and isinstance(prompt[0], (list, tuple, numpy.ndarray)):
            lengths = {len(p) for p in prompt}
            if len(lengths) > 1:
                raise ValueError(
                    f"prompts of different lengths {sorted(lengths)} cannot be decoded in one batch "
                    "(the decoder has no mask for padding in its own past); decode them separately"
                )
    prompt = numpy.asarray(prompt, dtype=numpy.int64)
    if prompt.ndim not in (1, 2):
        raise ValueError(f"a prompt is (t,) or (batch, t) token ids, got shape {prompt.shape}")
    return prompt


def step_attention(model):
    """The attention weights of the last query of the last ``decode_step``, one row per batch
    row, as a host array; None if the model keeps none. Reads ``model.attention_weights`` or
    ``model.decoder.attention_weights``:

    - a Transformer decoder's ``[self-attention per block, cross-attention per block]``:
      the cross-attention (the source positions a target token looked at), or the
      self-attention without an encoder -> (batch, num_blks, num_heads, K);
    - a list of (batch, num_heads, Q, K) tensors, one per block (``TransformerLM``)
      -> (batch, num_blks, num_heads, K);
    - a list of (batch, Q, K) tensors, one per step (the Bahdanau decoder) -> (batch, K).

    Pass your own ``attention=fn`` to ``beam_search`` for any other layout: ``fn(model)``
    returns a (batch, ..., K) array.
    """
    weights = getattr(model, "attention_weights", None)
    if weights is None:
        weights = getattr(getattr(model, "decoder", None), "attention_weights", None)
    if not weights:
        return None
    if isinstance(weights[0], (list, tuple)):  # [self, cross] of a Transformer decoder
        cross = weights[1] if len(weights) > 1 else None
        weights = cross if cross and cross[0] is not None else weights[0]
    if weights[0].ndim == 3:  # one (batch, Q, K) tensor per step: the last step, last query
        return weights[-1][:, -1].numpy()
    # one (batch, heads, Q, K) tensor per block: the last query of each, blocks stacked
    return numpy.stack([w[:, :, -1].numpy() for w in weights], axis=1)


# -- the one search loop ------------------------------------------------------------------------
def _check_beam_fits(k, n, V, max_len):
    """Refuse, at the first step, a beam whose scores could not fit the host's memory: a step
    holds (examples, width, |V|) float64 scores, the width growing to k or to the |V|^max_len
    sequences there are. A beam that wide is exhaustive search (module docstring), affordable on a
    small vocabulary; a mistyped beam_size=100000000 must not allocate until the system kills it."""
    sequences = 1
    for _ in range(max_len):  # |V|^max_len without building a huge integer
        sequences *= V
        if sequences >= k:
            break
    widest = min(k, sequences)
    get_backend("cpu").check_fits(f"beam_size {k}: a decoding step's scores", (n, widest, V), 8)


def _search(model, state, start, eos, max_len, beam_size, length_penalty, attention, noise, history, processors=()):
    """Beam search over ``start.shape[0]`` examples (see the module docstring for the rules).

    Returns, per example, every finished hypothesis as (rank key, score, log_prob, ended,
    step, row): the sequence is read back from ``history`` (a list the loop fills: per step,
    the chosen tokens, their parent rows and the attention weights of the rows fed) by
    ``_backtrack(history, step, row)``, plus <eos> when ``ended``. ``noise(shape)``, if given,
    is added to the extensions' scores when *ranking* them, never to the scores themselves:
    sampling (see ``sample``). ``processors``: the chain that reshapes every step's
    log-probabilities before the ranking (``apply_processors``; <pad> and <bos> are kept out
    by one, ``Forbid``). The search ranks by the *processed* scores, summed along the
    hypothesis; ``log_prob`` and ``score`` stay the model's own log P (the two sums are the
    same number without processors). The rank key is the processed sum / L^alpha.
    """
    k = beam_size
    device = model_device(model)
    examples = numpy.arange(start.shape[0])  # the examples still decoding, in row order
    width = 1  # hypotheses per example: one (the start) until the first step has branched
    scores = numpy.zeros(start.shape[0])  # the processed log P of each row's hypothesis, on the host
    # the model's own log P of each row's hypothesis: a second sum only when processors may
    # make the ranked scores differ from it
    separate = bool(processors)
    log_probs = scores.copy() if separate else scores
    # per example: (processed log P, log P, length, ended, step, row)
    finished = [[] for _ in examples]
    num_finished = numpy.zeros(start.shape[0], dtype=numpy.int64)
    # Each row's tokens so far, for the processors that read them (a repetition penalty): kept
    # only when there are processors, since it copies every prefix at every step.
    prefix = start if processors else None
    inputs = start
    for step in range(1, max_len + 1):
        logits, state = model.decode_step(tensor(inputs, device=device), state)
        # The distribution of the next token sits at the last position; normalise on the
        # device, then bring (rows, |V|) to the host for the (cheap) bookkeeping.
        logp = log_softmax(logits[:, -1], axis=-1).numpy().astype(numpy.float64)
        processed = apply_processors(processors, logp, prefix) if processors else logp
        weights = attention(model) if attention is not None else None
        n, V = len(examples), logp.shape[-1]
        if step == 1:
            _check_beam_fits(k, n, V, max_len)
        rows_fed = n * width
        total = (scores[:, None] + processed).reshape(n, width, V)  # processed log P of every extension
        model_total = (log_probs[:, None] + logp).reshape(n, width, V) if separate else total
        rank = total if noise is None else total + noise(total.shape)

        best_ends = numpy.zeros(n, dtype=bool)
        if eos is not None:
            # Rule 2: an <eos> extension among the k best of its example ends there. The
            # k-th best extension is the bar; an -inf one is no hypothesis at all.
            flat = rank.reshape(n, width * V)
            best_ends = flat.argmax(axis=1) % V == eos  # for rule 4
            bar = (
                numpy.partition(flat, width * V - k, axis=1)[:, width * V - k]
                if width * V > k
                else numpy.full(n, -numpy.inf)
            )
            ends = (rank[:, :, eos] >= bar[:, None]) & numpy.isfinite(total[:, :, eos])
            for a, j in zip(*numpy.nonzero(ends)):  # at most k per example
                finished[examples[a]].append(
                    (total[a, j, eos], model_total[a, j, eos], step, True, step - 1, a * width + j)
                )
                num_finished[examples[a]] += 1
            rank = rank.copy()
            rank[:, :, eos] = -numpy.inf  # rule 3: the beam goes on with the other tokens
        # Rule 4: an example with k finished hypotheses whose likeliest extension ended is
        # done and leaves the batch.
        live = ~((num_finished[examples] >= k) & best_ends)

        # Rule 3: the new beam, the best `new_width` extensions of each live example. Never
        # wider than the number of allowed (finite) extensions other than <eos>, so that no
        # slot holds a dead -inf -- unless the processors leave one example fewer than another
        # (top-k under a wide beam): such an example's spare slots stay -inf, never finish and
        # are left out at the end (``_hypotheses``).
        allowed = numpy.isfinite(rank[live]).reshape(-1, width * V).sum(axis=1)
        new_width = int(min(k, max(1, allowed.max(initial=1))))
        flat = rank[live].reshape(-1, width * V)
        best = numpy.argpartition(-flat, new_width - 1, axis=1)[:, :new_width]
        # best first (argpartition leaves them unordered): row order = rank within the beam
        best = numpy.take_along_axis(best, numpy.argsort(-numpy.take_along_axis(flat, best, 1), 1, "stable"), 1)
        parent, token = numpy.divmod(best, V)  # which hypothesis, extended by which token
        parents = (numpy.flatnonzero(live)[:, None] * width + parent).ravel()  # rows fed this step
        tokens = token.ravel()
        scores = total.reshape(n * width, V)[parents, tokens]
        log_probs = model_total.reshape(n * width, V)[parents, tokens] if separate else scores
        if prefix is not None:
            prefix = numpy.concatenate([prefix[parents], tokens[:, None]], axis=1)
        history.append((tokens, parents, weights))
        examples, width = examples[live], new_width

        if step == max_len:  # rule 4: what is still alive is cut here, without <eos>
            for r, e in enumerate(numpy.repeat(examples, width)):
                finished[e].append((scores[r], log_probs[r], step, False, step, r))
        if len(examples) == 0 or step == max_len:
            break
        # Gather the chosen rows' states. Greedy search with no example done keeps every row
        # where it is: skip the gather (a copy of every cache) then.
        if len(parents) != rows_fed or (parents != numpy.arange(rows_fed)).any():
            state = model.reorder_state(state, parents)
        inputs = tokens[:, None]
    alpha = length_penalty
    return [
        [(s / length**alpha, lp / length**alpha, lp, ended, st, r) for s, lp, length, ended, st, r in f]
        for f in finished
    ]


def _backtrack(history, step, row):
    """Tokens (and attention rows) of the hypothesis in ``row`` after ``step`` steps, read
    backwards through the back-pointers."""
    tokens, weights = [], []
    for s in range(step, 0, -1):
        chosen, parents, attention = history[s - 1]
        tokens.append(int(chosen[row]))
        row = parents[row]  # the row fed at step s whose distribution chose this token
        if attention is not None:
            weights.append(attention[row])
    return tokens[::-1], weights[::-1]


def _stack_rows(rows):
    """One (..., L, K) array from the L per-step rows (..., K): the queries (the generated
    tokens) on the second-to-last axis, as in an attention matrix. Self-attention rows of an
    LM grow by one key per step, so shorter ones are padded with zeros -- the weight a causal
    mask gives a future key, so the result is the full (lower-triangular) attention matrix."""
    if not rows:
        return None
    K = max(r.shape[-1] for r in rows)
    pad = [numpy.pad(r, [(0, 0)] * (r.ndim - 1) + [(0, K - r.shape[-1])]) for r in rows]
    return numpy.stack(pad, axis=-2)


def _hypotheses(history, finished, n_best, want_attention):
    out = []
    for candidates in finished:
        # a beam slot the processors left at -inf is no hypothesis (see _search's rule 3)
        candidates = [c for c in candidates if numpy.isfinite(c[0])] or candidates
        # best rank key first; sorted() is stable, so ties keep the order found
        ranked = sorted(candidates, key=lambda c: -c[0])[:n_best]
        hyps = []
        for _, score, log_prob, ended, step, row in ranked:
            tokens, weights = _backtrack(history, step, row)
            if ended and want_attention:  # the <eos> was chosen from row `row` at step + 1
                weights.append(history[step][2][row])
            attention = _stack_rows(weights) if want_attention else None
            hyps.append(Hypothesis(tokens, float(score), float(log_prob), bool(ended), attention))
        out.append(hyps)
    return out


def _run(
    model,
    state,
    bos,
    eos,
    max_len,
    beam_size,
    length_penalty,
    prompt,
    batch_size,
    attention,
    n_best,
    noise=None,
    forbid=(),
):
    """The public searches' common part: the start tokens from ``bos`` and the prompt, <pad>
    and <bos> kept out by a ``Forbid`` processor, then ``run_search``."""
    prompt = _as_prompt(prompt)
    start = _start_tokens(bos, prompt, _batch_size(state, prompt, batch_size))
    processors = [Forbid(forbid, eos)] if forbid else []
    return run_search(
        model,
        state,
        start,
        eos,
        max_len,
        beam_size,
        length_penalty,
        processors,
        noise=noise,
        attention=attention,
        n_best=n_best,
    )


def run_search(
    model,
    state,
    start,
    eos,
    max_len,
    beam_size=1,
    length_penalty=0.75,
    processors=(),
    *,
    noise=None,
    attention=False,
    n_best=None,
):
    """The one loop (``_search``) from the start tokens: check the arguments, run it in
    inference mode, read the hypotheses back. What the built-in searches ``greedy``, ``beam``
    and ``sample`` call (``plugins/minitensor_plugins/decoders.py``) and the public functions
    above them.

    ``start``: int64 (batch, t), the first tokens fed (<bos> and / or the prompt).
    ``processors``: the chain applied to every step's log-probabilities (see
    ``apply_processors``). ``noise(shape)``: added to the ranking only (sampling). The rest as
    for ``beam_search``. Returns one ``Hypothesis`` per row of ``start``, or lists of the
    ``n_best`` best.
    """
    if max_len < 1:
        raise ValueError(f"max_len must be at least 1, got {max_len}")
    if beam_size < 1:
        raise ValueError(f"beam_size must be at least 1, got {beam_size}")
    if n_best is not None and n_best < 1:
        raise ValueError(f"n_best must be at least 1, got {n_best}")
    start = numpy.asarray(start, dtype=numpy.int64)
    if start.ndim != 2 or start.shape[1] == 0:
        raise ValueError(f"the start tokens must be (batch, t) ids with t >= 1, got shape {start.shape}")
    attention_fn = step_attention if attention is True else (attention or None)
    history = []
    # recording attention needs each step's weights, which a streamed layer does not keep
    keep_weights = plain_attention(model) if attention_fn is not None else contextlib.nullcontext()
    with _inference(model), keep_weights:
        finished = _search(
            model, state, start, eos, max_len, beam_size, length_penalty, attention_fn, noise, history, processors
        )
    hyps = _hypotheses(history, finished, n_best or 1, attention_fn is not None)
    return [h[0] for h in hyps] if n_best is None else hyps


# -- the public searches ------------------------------------------------------------------------------
def beam_search(
    model,
    state,
    bos,
    eos,
    max_len,
    beam_size=4,
    length_penalty=0.75,
    prompt=None,
    *,
    n_best=None,
    batch_size=None,
    attention=False,
    forbid=(),
):
    """Beam search (D2L 10.8.3) for every example of ``state``; see the module docstring.

    ``state``: from ``model.begin_decoding(...)``. ``bos``: the id fed first (None to start
    from the prompt alone, e.g. a language model). ``eos``: the id that ends a sequence (None:
    every sequence runs ``max_len`` tokens). ``max_len``: at most this many tokens are
    generated per sequence, <eos> included (as D2L's ``predict_seq2seq``: ``num_steps``
    predictions). ``beam_size``: k, hypotheses kept per example (1: greedy search).
    ``length_penalty``: alpha of the score log P / L^alpha, L the number of scored tokens
    (<eos> included): 0.75 as in D2L, 0 for the plain log-probability. ``prompt``: token ids
    forced after <bos> and not scored -- (t,) for all examples or (batch, t), e.g. the start
    of a text for an LM. ``batch_size``: the number of examples, when neither the prompt nor
    the state tells it (see ``_batch_size``). ``attention``: True to keep the attention
    weights of each returned hypothesis (see ``step_attention``), or a function
    ``fn(model) -> (batch, ..., K) array`` to read them your way. ``forbid``: token ids that
    are never generated (``translate`` and ``generate`` forbid <pad> and <bos>, which are no
    text: a model that gives them a little probability must not print them).

    Runs under ``no_grad`` with the model in eval mode (restored after). The ``state`` should
    come from eval mode too (``translate`` and ``generate`` see to both).

    Returns one ``Hypothesis`` per example (its best), or with ``n_best=n`` a list of the n
    best per example, best first.
    """
    return _run(
        model, state, bos, eos, max_len, beam_size, length_penalty, prompt, batch_size, attention, n_best, forbid=forbid
    )


def greedy(
    model, state, bos, eos, max_len, prompt=None, *, length_penalty=0.75, batch_size=None, attention=False, forbid=()
):
    """Greedy search (D2L 10.8.1): the most likely token at every step, until <eos> or
    ``max_len`` tokens. Exactly ``beam_search`` with ``beam_size=1`` (the same loop); the
    arguments and the returned ``Hypothesis`` per example are as there."""
    return beam_search(
        model,
        state,
        bos,
        eos,
        max_len,
        1,
        length_penalty,
        prompt,
        batch_size=batch_size,
        attention=attention,
        forbid=forbid,
    )


def sample(
    model,
    state,
    bos,
    eos,
    max_len,
    temperature=1.0,
    prompt=None,
    *,
    length_penalty=0.75,
    batch_size=None,
    attention=False,
    rng=None,
    forbid=(),
):
    """Sampling: draw every next token from softmax(logits / temperature), until <eos> or
    ``max_len`` tokens. One ``Hypothesis`` per example; arguments as for ``beam_search``.

    It runs the beam-search loop with k = 1, ranking the extensions by

        log P(v | h) + temperature * g_v,      g_v ~ Gumbel(0, 1) independent,

    whose argmax is a sample from softmax(log P / temperature) (the Gumbel-max trick), so the
    "best" extension *is* the drawn token; the reported scores stay the model's log P.
    temperature -> 0 is greedy search; larger temperatures flatten the distribution. ``rng``:
    a NumPy Generator (default: the one ``mt.manual_seed`` seeds).
    """
    if not temperature >= 0 or not numpy.isfinite(temperature):  # NaN fails the first test
        raise ValueError(f"sample: temperature must be a finite number >= 0, got {temperature}")
    rng = host_rng() if rng is None else rng

    def gumbel(shape):
        return -temperature * numpy.log(-numpy.log(rng.uniform(numpy.finfo(float).tiny, 1.0, shape)))

    return _run(model, state, bos, eos, max_len, 1, length_penalty, prompt, batch_size, attention, None, gumbel, forbid)


# -- from tokens to tokens ---------------------------------------------------------------------------
def _token_lists(tokens, what):
    """(list of token lists, True if one sequence was given)."""
    if isinstance(tokens, str):
        raise TypeError(f"{what}: give a list of tokens, not a str (text.split() for words, list(text) for characters)")
    tokens = list(tokens)
    if tokens and isinstance(tokens[0], (list, tuple)):
        return [list(t) for t in tokens], False
    return [tokens], True


def _check_not_ids(lines, vocab, what):
    """Refuse token ids given for tokens: the vocabulary would read each as <unk>, silently."""
    for line in lines:
        for token in line:
            if isinstance(token, (int, numpy.integer)) and not isinstance(token, bool) and token not in vocab:
                raise TypeError(
                    f"{what}: {token!r} is not a token of the vocabulary; give tokens, not their ids "
                    "(vocab.to_tokens(ids) turns ids into tokens)"
                )


def translate(
    model,
    src_tokens,
    src_vocab,
    tgt_vocab,
    num_steps,
    beam_size=1,
    device=None,
    *,
    max_len=None,
    length_penalty=0.75,
    attention=False,
    n_best=None,
):
    """Translate source tokens with an encoder-decoder (D2L's ``predict_seq2seq``).

    ``src_tokens``: one sentence (a list of tokens) or a batch of them (a list of lists).
    Each is encoded as the training data are (``data.build_array``): ids + <eos>, truncated
    or padded with <pad> to ``num_steps``, with ``valid_lens`` counting the real positions.
    The whole batch is decoded at once: beam search with ``beam_size`` (1: greedy), at most
    ``max_len`` target tokens (default ``num_steps``). ``device``: where the source goes
    (default: the model's).

    Returns a ``Hypothesis`` per sentence -- one for one sentence, a list for a batch (lists
    of n with ``n_best=n``) -- whose ``tokens`` are target *tokens* (strings), <eos> and what
    follows it left out; ``attention`` as in ``beam_search`` (D2L's heatmaps).
    """
    lines, single = _token_lists(src_tokens, "translate")
    _check_not_ids(lines, src_vocab, "translate")
    _check_model(
        model,
        "translate",
        [
            (src_vocab, getattr(model, "encoder", None), "source vocabulary"),
            (tgt_vocab, getattr(model, "decoder", None), "target vocabulary"),
        ],
    )
    device = model_device(model) if device is None else device
    enc_X, enc_valid_lens = build_array(lines, src_vocab, num_steps)
    with _inference(model):  # the encoder too runs without dropout and without a graph
        state = model.begin_decoding(tensor(enc_X, device=device), tensor(enc_valid_lens, device=device))
        results = beam_search(
            model,
            state,
            tgt_vocab.bos,
            tgt_vocab.eos,
            num_steps if max_len is None else max_len,
            beam_size,
            length_penalty,
            n_best=n_best,
            batch_size=len(lines),
            attention=attention,
            forbid=_no_text(tgt_vocab),
        )
    results = [_as_tokens(r, tgt_vocab) for r in results]
    return results[0] if single else results


def _no_text(vocab):
    """The ids of the tokens that are no output: <pad> and <bos> (those the vocabulary has)."""
    return tuple(vocab.token_to_idx[t] for t in ("<pad>", "<bos>") if t in vocab)


def _as_tokens(result, vocab, prefix=()):
    if isinstance(result, list):
        return [_as_tokens(r, vocab, prefix) for r in result]
    return result._replace(tokens=list(prefix) + vocab.to_tokens(result.tokens))


def generate(
    lm,
    prompt_tokens,
    vocab,
    max_len,
    beam_size=1,
    temperature=None,
    *,
    length_penalty=None,
    rng=None,
    window=None,
    decoder=None,
    cache=None,
    cache_options=None,
):
    """Continue a prompt with a language model (D2L's ``predict_ch8``).

    ``prompt_tokens``: a list of tokens, or a batch of lists of equal length. The prompt is
    fed in one ``decode_step`` (an empty prompt starts from <bos>); then up to ``max_len``
    tokens follow, until the vocabulary's <eos> if it has one. <pad> and <bos> are never
    generated (a ``Forbid`` processor runs first in every chain).

    How the tokens are chosen: ``decoder``, a name (``"top_p"``, ``"top_k,sample"``) or a
    ``Decoder`` from ``minitensor.inference.decoder(names, **options)`` (the processors and
    searches of ``minitensor.plugins.decoders()``; a name takes its defaults). Without it,
    the shorthands: ``temperature`` None for search (``beam_size`` 1: ``greedy``, else
    ``beam`` with ``length_penalty``, default 0.75), a number > 0 to sample
    (``temperature,sample``; beam_size 1 only). ``rng``: the NumPy Generator a sampling
    decoder draws from (default: the one ``mt.manual_seed`` seeds).

    ``cache``, ``cache_options``: the key/value cache policy of the model's self-attention
    and its options (``lm.begin_decoding(cache=..., cache_options=...)``; None: the model's
    default, ``full``).

    ``window``: the longest sequence the model was trained on (``lm_num_steps``). Positions
    beyond it were never trained, and a model read there produces noise; so a longer text is
    generated piece by piece, each piece continuing from the last ``window // 2`` tokens (of
    the prompt too, if it is longer). None: one piece, however long.

    Returns a ``Hypothesis`` per prompt (one, or a list for a batch) whose ``tokens`` are the
    prompt followed by its continuation, as strings, as D2L's ``predict_ch8`` returns them;
    the scores are those of the continuation.
    """
    prompts, single = _token_lists(prompt_tokens, "generate")
    _check_not_ids(prompts, vocab, "generate")
    _check_model(lm, "generate", [(vocab, lm, "vocabulary")])
    if len({len(p) for p in prompts}) > 1:
        raise ValueError("generate: prompts of different lengths cannot share a batch; generate them separately")
    chain = _generate_decoder(decoder, beam_size, temperature, length_penalty)
    if window is not None and (len(prompts[0]) + max_len > window):
        if window < 2:
            raise ValueError(f"generate: window must be at least 2, got {window}")
        results = [
            _generate_in_pieces(lm, p, vocab, max_len, chain, rng, window, cache, cache_options) for p in prompts
        ]
        return results[0] if single else results
    eos = vocab.eos if "<eos>" in vocab else None
    ids = numpy.array([vocab[p] for p in prompts], dtype=numpy.int64).reshape(len(prompts), -1)
    start = _start_tokens(vocab.bos, None, len(prompts)) if ids.shape[1] == 0 else ids
    # only what was asked for: a model without cache policies takes no such arguments
    cache_arguments = {k: v for k, v in (("cache", cache), ("cache_options", cache_options)) if v is not None}
    with _inference(lm):
        state = lm.begin_decoding(**cache_arguments)
        results = chain(lm, state, start, eos, max_len, rng, before=[Forbid(_no_text(vocab), eos)])
    results = [_as_tokens(r, vocab, p) for r, p in zip(results, prompts)]
    return results[0] if single else results


def _generate_decoder(chosen, beam_size, temperature, length_penalty):
    """``generate``'s decoder: the one given (built from its name if a name), or the one its
    shorthands ``beam_size``, ``temperature`` and ``length_penalty`` stand for."""
    if chosen is not None:
        given = [
            f"{name}={value}"
            for name, value, default in (
                ("beam_size", beam_size, 1),
                ("temperature", temperature, None),
                ("length_penalty", length_penalty, None),
            )
            if value != default
        ]
        if given:
            raise ValueError(
                f"generate: give the decoder's options to it (decoder(names, **options)), not as {', '.join(given)}"
            )
        if isinstance(chosen, (str, list, tuple)):
            return decoder(chosen)
        if not isinstance(chosen, Decoder):
            raise TypeError(
                f"generate: decoder must be a name or a minitensor.inference.decoder(...), got {type(chosen).__name__}"
            )
        return chosen
    if beam_size != 1 and temperature is not None:
        raise ValueError(f"generate: sampling draws one sequence per prompt; beam_size must be 1, got {beam_size}")
    alpha = 0.75 if length_penalty is None else length_penalty
    if temperature is not None:
        return decoder("temperature,sample", temperature=temperature, length_penalty=alpha)
    if beam_size == 1:
        return decoder("greedy", length_penalty=alpha)
    return decoder("beam", beam_size=beam_size, length_penalty=alpha)


def _generate_in_pieces(lm, prompt, vocab, max_len, chain, rng, window, cache, cache_options):
    """``generate`` for one prompt, a piece at a time, every piece inside ``window`` positions."""
    keep = window // 2
    text, log_prob, ended = list(prompt), 0.0, False
    while len(text) - len(prompt) < max_len and not ended:
        context = text[-keep:] if len(text) > window - 1 or len(text) > len(prompt) else text
        budget = min(window - len(context), max_len - (len(text) - len(prompt)))
        piece = generate(lm, context, vocab, budget, rng=rng, decoder=chain, cache=cache, cache_options=cache_options)
        text += piece.tokens[len(context) :]
        log_prob += piece.log_prob
        ended = piece.ended
    length = len(text) - len(prompt) + ended
    alpha = getattr(chain.search, "length_penalty", 0.75)
    return Hypothesis(text, log_prob / max(length, 1) ** alpha, log_prob, ended)
