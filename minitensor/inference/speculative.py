"""Speculative decoding: a small draft model proposes, the large target model verifies.

Decoding a large model is slow because every token needs a full pass over its weights, and
the tokens come one after another. Yet scoring k given tokens costs the target about as much
as scoring one (one pass, k + 1 rows of logits instead of 1). Speculative decoding (Leviathan,
Kalman and Matias 2023, https://arxiv.org/abs/2211.17192; Chen et al. 2023,
https://arxiv.org/abs/2302.01318) therefore lets a cheap *draft* model guess k tokens and the
target check them all at once. One round, with x the last accepted token:

1. the draft proposes d_1 .. d_k autoregressively, d_i from its processed scores after
   x, d_1 .. d_{i-1} (their argmax, or a draw from q_i = softmax of them);
2. the target scores x, d_1 .. d_k in ONE ``decode_step``: k + 1 next-token distributions
   p_1 .. p_{k+1} (softmax of its processed scores);
3. the proposals are accepted left to right, and the round adds one token of the target's:

   - greedy: d_i is accepted while d_i = argmax p_i; at the first disagreement the target's
     argmax p_i replaces it; all k accepted, argmax p_{k+1} is a bonus token. Every emitted
     token is the target's argmax given the tokens before it: the output is the target's
     greedy output, token for token;
   - sampling: d_i is accepted with probability min(1, p_i(d_i) / q_i(d_i)); the first
     rejected one is replaced by a draw from r_i = max(0, p_i - q_i) / sum max(0, p_i - q_i);
     all accepted, a bonus token ~ p_{k+1}. The emitted token is distributed exactly as p_i:

         P(emit v) = q(v) min(1, p(v)/q(v)) + (1 - sum_u min(q(u), p(u))) r(v)
                   = min(q(v), p(v)) + max(0, p(v) - q(v))  =  p(v),

     since 1 - sum_u min(q(u), p(u)) = sum_u max(0, p(u) - q(u)) is r's normaliser.

4. rejected tokens leave both models' key/value caches: ``model.crop_state(state, n)`` keeps
   the first n positions (a cache policy that drops tokens, such as ``window``, cannot
   give them back, and says so).

The speed-up depends on the acceptance rate alpha (the share of proposals accepted): a round
emits between 1 and k + 1 tokens for one target call and k draft calls. ``stats`` reports it.

The target holds, between rounds, every token but the last accepted one, so that the round's
one call scores that token and the proposals. One sequence at a time: the sequences of a
batch would accept different numbers of tokens and their caches would fall out of step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy

from .. import tensor
from ..ops import log_softmax
from .decoders import apply_processors
from .decoding import Hypothesis, _inference, model_device

__all__ = ["MAX_DRAFT_TOKENS", "SpeculativeStats", "speculative_search"]

MAX_DRAFT_TOKENS = 64
"""The most draft tokens per round ``speculative`` takes: past a few, almost every round is
rejected before its end, and the draft's work is wasted."""


@dataclass
class SpeculativeStats:
    """What speculative decoding did: ``proposed`` draft tokens, of which ``accepted``;
    ``rounds``, the target's calls after the prompt (a plain search makes one per token);
    ``generated`` tokens (<eos> included). ``a += b`` adds up two counts."""

    proposed: int = 0
    accepted: int = 0
    rounds: int = 0
    generated: int = 0

    def __iadd__(self, other: SpeculativeStats) -> SpeculativeStats:
        self.proposed += other.proposed
        self.accepted += other.accepted
        self.rounds += other.rounds
        self.generated += other.generated
        return self

    @property
    def acceptance_rate(self) -> float:
        """accepted / proposed (NaN before any proposal)."""
        return self.accepted / self.proposed if self.proposed else float("nan")


def _softmax(scores: numpy.ndarray) -> numpy.ndarray:
    e = numpy.exp(scores - scores.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _greedy_choice(scores: numpy.ndarray, eos: int | None) -> int:
    """The token greedy search picks from one row: <eos> when it ties for the best (its rule
    2 with one beam: an <eos> reaching the bar ends the hypothesis), else the first argmax."""
    best = scores.max()
    if eos is not None and numpy.isfinite(scores[eos]) and scores[eos] >= best:
        return eos
    return int(numpy.argmax(scores))


def _draw(probs: numpy.ndarray, rng: numpy.random.Generator) -> int:
    """One draw from ``probs`` (summing to about 1) by the inverse CDF, never a 0-probability token."""
    cumulative = numpy.cumsum(probs)
    i = int(numpy.searchsorted(cumulative, rng.uniform() * cumulative[-1], side="right"))
    return min(i, int(numpy.flatnonzero(probs)[-1]))


def _log_probs(logits: Any) -> numpy.ndarray:
    return log_softmax(logits, axis=-1).numpy().astype(numpy.float64)


def _check_model(role: str, model: Any) -> None:
    missing = [m for m in ("begin_decoding", "decode_step", "crop_state") if not callable(getattr(model, m, None))]
    if missing:
        raise TypeError(
            f"speculative decoding: the {role} ({type(model).__name__}) has no {', '.join(missing)}; it needs the "
            "decoding API of a language model (TransformerLM) with crop_state to roll back rejected tokens"
        )


def _crop(model: Any, role: str, state: Any, num_tokens: int) -> Any:
    try:
        return model.crop_state(state, num_tokens)
    except NotImplementedError as e:  # a cache policy that drops tokens: the user's choice, not a bug
        raise ValueError(f"speculative decoding: the {role}'s cache: {e}") from e


def speculative_search(
    target: Any,
    draft: Any,
    state: Any,
    start: numpy.ndarray,
    eos: int | None,
    max_len: int,
    processors: Any,
    rng: numpy.random.Generator,
    k: int = 4,
    sample: bool = False,
    length_penalty: float = 0.75,
) -> tuple[list[Hypothesis], SpeculativeStats]:
    """Speculative decoding of one sequence (see the module docstring): the ``speculative``
    search's work.

    ``target``: the model whose output this is, ``state`` from its ``begin_decoding()`` (any
    cache policy that can crop); ``draft``: a model with the same vocabulary, started here
    with ``draft.begin_decoding()``; ``start``: (1, t) the first tokens; ``processors``: the
    chain, applied to both models' log-probabilities (row by row, each row with its own
    tokens so far); ``k``: proposals per round; ``sample``: the sampling acceptance rule
    instead of greedy agreement. At most ``max_len`` tokens are generated; fewer proposals
    are made near the end.

    Returns ([one Hypothesis], SpeculativeStats). The hypothesis's ``log_prob`` is the
    target's log P of the generated tokens (<eos> included), as the other searches report.
    """
    start = numpy.asarray(start, dtype=numpy.int64)
    if start.ndim != 2 or start.shape[1] == 0:
        raise ValueError(f"speculative decoding: the start tokens must be (1, t), t >= 1, got shape {start.shape}")
    if start.shape[0] != 1:
        raise ValueError(
            f"speculative decoding takes one sequence at a time (batch size 1), got {start.shape[0]}: decode the "
            "prompts one by one"
        )
    if max_len < 1:
        raise ValueError(f"max_len must be at least 1, got {max_len}")
    _check_model("target", target)
    _check_model("draft", draft)
    stats = SpeculativeStats()
    processors = list(processors)
    target_device, draft_device = model_device(target), model_device(draft)

    def rows(scores: numpy.ndarray, contexts: list[list[int]]) -> numpy.ndarray:
        # each row has its own tokens so far (of different lengths): one chain call per row
        return numpy.concatenate(
            [apply_processors(processors, scores[i : i + 1], numpy.array([c])) for i, c in enumerate(contexts)]
        )

    seq = [int(t) for t in start[0]]
    n_start = len(seq)
    log_prob, ended = 0.0, False
    with _inference(target), _inference(draft):
        if n_start > 1:  # the target holds every token but the last
            _, state = target.decode_step(tensor(start[:, :-1], device=target_device), state)
        # a cache that cannot roll back is refused now, not at the first rejected proposal
        _crop(target, "target", state, n_start - 1)
        try:
            draft_state = draft.begin_decoding()
        except TypeError as e:  # an encoder-decoder's begin_decoding needs the source
            raise TypeError(
                f"speculative decoding: the draft's begin_decoding() takes no source here ({e}); the draft must be "
                "a language model (TransformerLM)"
            ) from e
        draft_held = 0  # tokens in the draft's cache
        vocab_size = None
        while len(seq) - n_start < max_len and not ended:
            budget = max_len - (len(seq) - n_start)
            # 1. the draft proposes (none when one token is left: then this is a plain step)
            proposals: list[int] = []
            q_probs = []
            for _ in range(min(k, budget - 1)):
                context = seq + proposals
                feed = numpy.array([context[draft_held:]], dtype=numpy.int64)
                logits, draft_state = draft.decode_step(tensor(feed, device=draft_device), draft_state)
                draft_held = len(context)
                q_scores = rows(_log_probs(logits[:, -1]), [context])[0]
                if vocab_size is None:
                    vocab_size = q_scores.shape[-1]
                if sample:
                    q = _softmax(q_scores)
                    proposals.append(_draw(q, rng))
                    q_probs.append(q)
                else:
                    proposals.append(_greedy_choice(q_scores, eos))
                if proposals[-1] == eos:  # nothing follows an <eos>
                    break
            # 2. the target scores the last accepted token and every proposal in one call
            feed = numpy.array([[seq[-1]] + proposals], dtype=numpy.int64)
            logits, state = target.decode_step(tensor(feed, device=target_device), state)
            target_logp = _log_probs(logits[0])  # (m + 1, V)
            if vocab_size is not None and target_logp.shape[-1] != vocab_size:
                raise ValueError(
                    f"speculative decoding: the draft has {vocab_size} tokens, the target {target_logp.shape[-1]}; "
                    "the two must share one vocabulary"
                )
            p_scores = rows(target_logp, [seq + proposals[:i] for i in range(len(proposals) + 1)])
            # 3. accept left to right; the target adds one token of its own
            accepted = 0
            for i, d in enumerate(proposals):
                if sample:
                    p, q = _softmax(p_scores[i]), q_probs[i]
                    if rng.uniform() * q[d] < p[d]:  # u < p(d) / q(d): accepted with probability min(1, p/q)
                        accepted += 1
                        continue
                    residual = numpy.maximum(p - q, 0.0)
                    # p = q to rounding leaves no residual (and almost never rejects): draw from p
                    own = _draw(residual if residual.sum() > 0 else p, rng)
                else:
                    own = _greedy_choice(p_scores[i], eos)
                    if own == d:
                        accepted += 1
                        continue
                break
            else:  # every proposal accepted: the target's last row gives a bonus token
                last = p_scores[len(proposals)]
                own = _draw(_softmax(last), rng) if sample else _greedy_choice(last, eos)
            stats.rounds += 1
            stats.proposed += len(proposals)
            stats.accepted += accepted
            new = proposals[:accepted] + [own]
            if eos is not None and eos in new:
                new = new[: new.index(eos) + 1]
                ended = True
            log_prob += float(sum(target_logp[i, t] for i, t in enumerate(new)))
            # 4. roll back: the target keeps the new sequence but its last token, the draft
            # whatever of its cache is still the sequence
            held = len(seq) - 1 + len(proposals) + 1
            seq += new
            if not ended:
                if held > len(seq) - 1:
                    state = _crop(target, "target", state, len(seq) - 1)
                keep = min(draft_held, len(seq) - 1)
                if draft_held > keep:
                    draft_state = _crop(draft, "draft", draft_state, keep)
                    draft_held = keep
    tokens = seq[n_start:]
    if ended:
        tokens = tokens[:-1]
    stats.generated = len(tokens) + ended
    length = max(len(tokens) + ended, 1)
    return [Hypothesis(tokens, log_prob / length**length_penalty, log_prob, ended)], stats
