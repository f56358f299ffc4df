"""The built-in decoders: processors of next-token scores and searches (contract: "Decoders" in
``minitensor/core/hookspecs.py``). Registered exactly as a user's decoder would be.

A *processor* reshapes the scores of the next token: ``__call__(scores, tokens) -> scores``,
scores (rows, |V|) float64 -- the model's log-probabilities log p(v), or what the processors
before it made of them -- and tokens (rows, t), each row's tokens so far. Setting a score to
-inf rules the token out. The truncating processors (``top_k``, ``top_p``, ``min_p``) leave
the kept tokens' scores as they are: the search renormalises (sampling draws from
softmax(scores), which is the distribution restricted to the kept set). Their sets are defined
on the probabilities of the scores they receive, softmax(scores): after ``temperature`` if
that comes first, as in Hugging Face's ``generate``.

A *search* chooses: ``greedy``, ``beam``, ``sample`` and ``speculative``. The loop they share
is ``minitensor.inference.run_search`` (greedy search is beam search with one beam, sampling
the same with Gumbel noise on the ranking, ``minitensor/inference/decoding.py``); speculative
decoding is ``minitensor/inference/speculative.py``. The classes here only hold the options.

Each class refuses an option it does not know (``check_options``) and a bad value with a
ValueError naming itself and the value.
"""

import math
import numbers

import numpy
from minitensor.plugins import check_options

import minitensor as mt
from minitensor.inference import run_search
from minitensor.inference.speculative import MAX_DRAFT_TOKENS, SpeculativeStats, speculative_search


def _number(owner, option, value, low=None, low_open=True, high=None):
    """``value`` as a float, finite and inside the bounds, or a ValueError naming it."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{owner}: {option} must be a number, got {value!r}")
    value = float(value)
    below = low is not None and (value <= low if low_open else value < low)
    if not math.isfinite(value) or below or (high is not None and value > high):
        where = []
        if low is not None:
            where.append(f"{'>' if low_open else '>='} {low:g}")
        if high is not None:
            where.append(f"<= {high:g}")
        raise ValueError(f"{owner}: {option} must be a finite number {' and '.join(where)}, got {value}")
    return value


def _integer(owner, option, value, low, high=None):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        if not (isinstance(value, float) and value.is_integer()):
            raise ValueError(f"{owner}: {option} must be an integer, got {value!r}")
    value = int(value)
    if value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f">= {low}"
        raise ValueError(f"{owner}: {option} must be an integer {bound}, got {value}")
    return value


def _probabilities(scores):
    """softmax over the last axis, in float64; a -inf score gets probability 0."""
    shifted = numpy.exp(scores - scores.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


# -- processors ------------------------------------------------------------------------------------
class Temperature:
    """Temperature: scores / T.

    On log-probabilities, softmax(log p / T)_v = p_v^(1/T) / sum_u p_u^(1/T): T < 1 sharpens
    the distribution (T -> 0 is greedy search), T > 1 flattens it, T = 1 changes nothing
    (Ackley, Hinton and Sejnowski 1985, the Boltzmann distribution's temperature; used for
    text since at least Graves 2013). Option ``temperature`` (default 1.0): a finite number > 0.
    """

    kind = "processor"

    def __init__(self, temperature=1.0, **options):
        check_options(type(self), options)
        self.temperature = _number("temperature", "temperature", temperature, low=0.0)

    def __call__(self, scores, tokens):
        return scores / self.temperature


class TopK:
    """Top-k truncation (Fan, Lewis and Dauphin 2018, "Hierarchical Neural Story Generation",
    ACL, https://arxiv.org/abs/1805.04833): keep the k highest scores, every other token -inf.

        kept = { v : s_v >= s_(k) },   s_(k) the k-th highest score of the row

    Tokens tied with the k-th are all kept (as in Hugging Face), so a row may keep more than
    k; k >= |V| keeps everything. Option ``k`` (default 50): an integer >= 1.
    """

    kind = "processor"

    def __init__(self, k=50, **options):
        check_options(type(self), options)
        self.k = _integer("top_k", "k", k, 1)

    def __call__(self, scores, tokens):
        V = scores.shape[-1]
        if self.k >= V:
            return scores
        kth = numpy.partition(scores, V - self.k, axis=-1)[..., V - self.k : V - self.k + 1]
        return numpy.where(scores >= kth, scores, -numpy.inf)


class TopP:
    """Nucleus (top-p) truncation (Holtzman, Buys, Du, Forbes and Choi 2020, "The Curious Case
    of Neural Text Degeneration", ICLR, https://arxiv.org/abs/1904.09751): keep the smallest
    set of most likely tokens whose probability reaches p.

    With q = softmax(scores), a token is kept when the tokens strictly more likely than it
    hold less than p between them:

        kept = { v : sum_{u : q_u > q_v} q_u < p }

    which is the sorted prefix that first reaches p, ties with its last token included. The
    most likely token is always kept (nothing is more likely than it); p = 1 keeps every
    token of non-zero probability. Option ``p`` (default 0.9): in (0, 1].
    """

    kind = "processor"

    def __init__(self, p=0.9, **options):
        check_options(type(self), options)
        self.p = _number("top_p", "p", p, low=0.0, high=1.0)

    def __call__(self, scores, tokens):
        probs = _probabilities(scores)
        ranked = -numpy.sort(-probs, axis=-1)  # descending
        cumulative = numpy.cumsum(ranked, axis=-1)
        # the first position whose running sum reaches p; a sum that rounding leaves a hair
        # under p = 1 keeps everything
        first = numpy.minimum((cumulative < self.p).sum(axis=-1), probs.shape[-1] - 1)
        threshold = numpy.take_along_axis(ranked, first[..., None], axis=-1)
        return numpy.where(probs >= threshold, scores, -numpy.inf)


class MinP:
    """Min-p truncation (Nguyen, Baker, Neo, Roush, Kirsch and Shwartz-Ziv 2024, "Turning Up
    the Heat: Min-p Sampling for Creative and Coherent LLM Outputs",
    https://arxiv.org/abs/2407.01082): keep the tokens at least p times as likely as the most
    likely one.

        kept = { v : q_v >= p * max_u q_u },  q = softmax(scores)
             = { v : s_v >= max_u s_u + log p }    (computed so: no underflow)

    The bar scales with the model's confidence: a peaked row keeps few tokens, a flat one
    many. The most likely token is always kept; p = 1 keeps only it (and its ties). Option
    ``p`` (default 0.1; the paper recommends 0.05 to 0.1): in (0, 1].
    """

    kind = "processor"

    def __init__(self, p=0.1, **options):
        check_options(type(self), options)
        self.p = _number("min_p", "p", p, low=0.0, high=1.0)

    def __call__(self, scores, tokens):
        bar = scores.max(axis=-1, keepdims=True) + math.log(self.p)
        return numpy.where(scores >= bar, scores, -numpy.inf)


class RepetitionPenalty:
    """The repetition penalty of CTRL (Keskar, McCann, Varshney, Xiong and Socher 2019,
    https://arxiv.org/abs/1909.05858, section 4.1), as Hugging Face applies it: a token that
    already occurs in the row's tokens (the prompt included) gets

        s_v / theta   if s_v > 0,      s_v * theta   otherwise,

    both of which lower it when theta > 1 (theta < 1 favours repetition; 1 changes nothing).

    Which scores: the rule is applied to the scores the chain hands it, as Hugging Face
    applies it to the logits it holds. First in the chain those are log-probabilities, all
    <= 0, so the rule is always s * theta: p_v -> p_v^theta before renormalising -- a
    repeated token keeps more of its probability the likelier it is (0.9 -> 0.88 at
    theta = 1.2, 0.01 -> 0.004), and the result does not depend on the logits' arbitrary
    offset, as the sign test on raw logits does (softmax ignores adding a constant to every
    logit; the rule does not). CTRL divided positive logits by theta = 1.2; the two agree in
    direction, not in size. -inf stays -inf. Option ``penalty`` (default 1.2, CTRL's): a
    finite number > 0.
    """

    kind = "processor"

    def __init__(self, penalty=1.2, **options):
        check_options(type(self), options)
        self.penalty = _number("repetition_penalty", "penalty", penalty, low=0.0)

    def __call__(self, scores, tokens):
        if tokens is None or tokens.shape[-1] == 0:
            return scores
        seen = numpy.zeros(scores.shape, dtype=bool)
        seen[numpy.arange(scores.shape[0])[:, None], tokens] = True
        penalised = numpy.where(scores > 0, scores / self.penalty, scores * self.penalty)
        return numpy.where(seen, penalised, scores)


# -- searches --------------------------------------------------------------------------------------
def _length_penalty(owner, value):
    return _number(owner, "length_penalty", value, low=0.0, low_open=False)


class Greedy:
    """Greedy search (D2L 10.8.1): the highest processed score at every step,

        y_t = argmax_v s_t(v),

    until <eos> or ``max_len`` tokens; beam search with one beam, the same loop. Option
    ``length_penalty`` (default 0.75): only the alpha of the reported score log P / L^alpha.
    """

    kind = "search"

    def __init__(self, length_penalty=0.75, **options):
        check_options(type(self), options)
        self.length_penalty = _length_penalty("greedy", length_penalty)

    def __call__(self, model, state, start, eos, max_len, processors, rng):
        return run_search(model, state, start, eos, max_len, 1, self.length_penalty, processors)


class Beam:
    """Beam search (D2L 10.8.3): the ``beam_size`` best hypotheses by their summed processed
    scores, the finished ones ranked by sum / L^alpha (the rules: the docstring of
    ``minitensor/inference/decoding.py``). Options ``beam_size`` (default 4, an integer >= 1)
    and ``length_penalty`` (alpha, default 0.75, >= 0).
    """

    kind = "search"

    def __init__(self, beam_size=4, length_penalty=0.75, **options):
        check_options(type(self), options)
        self.beam_size = _integer("beam", "beam_size", beam_size, 1)
        self.length_penalty = _length_penalty("beam", length_penalty)

    def __call__(self, model, state, start, eos, max_len, processors, rng):
        return run_search(model, state, start, eos, max_len, self.beam_size, self.length_penalty, processors)


class Sample:
    """Ancestral sampling: every next token drawn from softmax of the processed scores,

        y_t ~ q_t,   q_t(v) = exp s_t(v) / sum_u exp s_t(u),

    by the Gumbel-max trick: argmax_v s_t(v) + g_v with g_v ~ Gumbel(0, 1) independent is a
    draw from q_t (Gumbel 1954; Maddison, Tarlow and Minka 2014), so the beam loop with one
    beam samples. Draws from the ``rng`` the search is given: a fixed seed repeats the text.
    Option ``length_penalty`` (default 0.75): the alpha of the reported score.
    """

    kind = "search"

    def __init__(self, length_penalty=0.75, **options):
        check_options(type(self), options)
        self.length_penalty = _length_penalty("sample", length_penalty)

    def __call__(self, model, state, start, eos, max_len, processors, rng):
        tiny = numpy.finfo(float).tiny  # u = 0 would give log(0)

        def gumbel(shape):
            return -numpy.log(-numpy.log(rng.uniform(tiny, 1.0, shape)))

        return run_search(model, state, start, eos, max_len, 1, self.length_penalty, processors, noise=gumbel)


class Speculative:
    """Speculative decoding (Leviathan, Kalman and Matias 2023, "Fast Inference from
    Transformers via Speculative Decoding", ICML, https://arxiv.org/abs/2211.17192; Chen,
    Borgeaud, Irving, Lespiau, Sifre and Jumper 2023, "Accelerating Large Language Model
    Decoding with Speculative Sampling", https://arxiv.org/abs/2302.01318).

    A small *draft* model proposes k tokens one at a time; the target scores the last
    accepted token and all k proposals in one call (k + 1 next-token distributions), keeps
    the proposals it agrees with and adds one token of its own:

    - greedy (``sample=False``): accept the longest prefix where each proposal is the
      target's argmax, then the target's own argmax at the first disagreement (or after the
      last proposal, a bonus token): exactly the target's greedy output, in fewer target calls;
    - sampling (``sample=True``): proposal x ~ q is accepted with probability
      min(1, p(x) / q(x)); the first rejected one is replaced by a draw from
      normalise(max(0, p - q)); all accepted, a bonus token ~ p. Each emitted token is then
      distributed exactly as p (p, q: softmax of the target's and the draft's processed scores).

    Options: ``draft`` (required): a model with the decoding API and the same vocabulary,
    normally a smaller language model; ``k`` (default 4): proposals per round, 1 to
    ``MAX_DRAFT_TOKENS`` (64); ``sample`` (default False): True or False; ``length_penalty``
    (default 0.75): the alpha of the reported score. One sequence at a time (batch size 1).

    ``stats`` (a ``SpeculativeStats``) counts, over every call of this object since it was
    built -- so a ``generate`` that decodes in pieces (``window``) is counted whole --
    ``proposed`` and ``accepted`` draft tokens, ``rounds`` (target calls after the prompt),
    ``generated`` tokens and ``acceptance_rate`` = accepted / proposed. Build a new decoder
    to count afresh. (The algorithm itself: ``minitensor/inference/speculative.py``.)
    """

    kind = "search"

    def __init__(self, draft=None, k=4, sample=False, length_penalty=0.75, **options):
        check_options(type(self), options)
        missing = [m for m in ("begin_decoding", "decode_step", "crop_state") if not callable(getattr(draft, m, None))]
        if draft is None or missing:
            what = "none given" if draft is None else f"{type(draft).__name__} has no {', '.join(missing)}"
            raise ValueError(
                f"speculative: draft must be a model with begin_decoding, decode_step and crop_state and the "
                f"target's vocabulary, normally a smaller language model ({what}; on the command line: --draft RUN)"
            )
        if sample not in (True, False):  # a string such as "no" would be truthy
            raise ValueError(f"speculative: sample must be True or False, got {sample!r}")
        self.draft = draft
        self.k = _integer("speculative", "k", k, 1, MAX_DRAFT_TOKENS)
        self.sample = bool(sample)
        self.length_penalty = _length_penalty("speculative", length_penalty)
        self.stats = SpeculativeStats()

    def __call__(self, model, state, start, eos, max_len, processors, rng):
        hyps, stats = speculative_search(
            model,
            self.draft,
            state,
            start,
            eos,
            max_len,
            processors,
            rng,
            k=self.k,
            sample=self.sample,
            length_penalty=self.length_penalty,
        )
        self.stats += stats
        return hyps


@mt.hookimpl
def minitensor_decoders():
    return {
        "temperature": Temperature,
        "top_k": TopK,
        "top_p": TopP,
        "min_p": MinP,
        "repetition_penalty": RepetitionPenalty,
        "greedy": Greedy,
        "beam": Beam,
        "sample": Sample,
        "speculative": Speculative,
    }
