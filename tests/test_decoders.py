"""Decoders as plugins (contract v3, "Decoders" in minitensor/core/hookspecs.py): the processors'
formulas by hand, their sets as properties, the routing of options and every error, the
built-in searches through the registry against the public functions, speculative decoding
against the target alone (greedy: token for token; sampling: a chi-square test on the
distribution), a user's processor from the docs, and the command line."""

import math
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import minitensor as mt
from minitensor import nn
from minitensor import plugins as mtp
from minitensor.data import Vocab
from minitensor.inference import Decoder, beam_search, decoder, generate, greedy, run_search, sample
from minitensor.inference.speculative import speculative_search

VOCAB = Vocab(list("abcdefgh"))  # <pad> <bos> <eos> <unk> a .. h: 12 tokens


def processor(name, **options):
    return mtp.lookup("decoder", name)(**options)


def lm(seed, num_hiddens=16, num_blks=2, sharpen=4.0):
    """A tiny random LM in float64 (so that a k-token verification pass and k one-token steps
    give the same argmax), its output layer scaled so that its distributions are peaked."""
    mt.manual_seed(seed)
    model = nn.TransformerLM(len(VOCAB), num_hiddens, 2 * num_hiddens, 2, num_blks, 0.0, dtype=mt.float64, max_len=64)
    model.decoder.dense.weight.data = model.decoder.dense.weight.data * sharpen
    return model.eval()


def perturbed(model, seed, scale):
    """A draft that agrees with ``model`` often but not always: its weights plus noise."""
    draft = lm(seed)
    draft.load_state_dict(model.state_dict())
    rng = np.random.default_rng(seed)
    w = draft.decoder.dense.weight
    w.data = w.data + mt.tensor(rng.normal(0, scale, w.shape), dtype=mt.float64)
    return draft


def probs_of(scores):
    e = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


# -- every processor's formula, by hand ----------------------------------------------------------------
def test_temperature_divides_the_scores():
    s = np.log(np.array([[0.5, 0.3, 0.2]]))
    out = processor("temperature", temperature=2.0)(s, np.zeros((1, 0), np.int64))
    np.testing.assert_allclose(out, s / 2)
    # softmax(log p / T) = p^(1/T) / sum p^(1/T)
    np.testing.assert_allclose(probs_of(out)[0], np.sqrt([0.5, 0.3, 0.2]) / np.sqrt([0.5, 0.3, 0.2]).sum())


def test_top_k_keeps_the_k_highest_and_their_ties():
    s = np.array([[1.0, 3.0, 2.0, 3.0, -1.0]])
    inf = -np.inf
    np.testing.assert_array_equal(processor("top_k", k=2)(s, None), [[inf, 3.0, inf, 3.0, inf]])
    np.testing.assert_array_equal(processor("top_k", k=3)(s, None), [[inf, 3.0, 2.0, 3.0, inf]])
    np.testing.assert_array_equal(processor("top_k", k=1)(s, None), [[inf, 3.0, inf, 3.0, inf]])  # a tie: both
    np.testing.assert_array_equal(processor("top_k", k=9)(s, None), s)


def test_top_p_keeps_the_smallest_set_reaching_p():
    s = np.log(np.array([[0.2, 0.5, 0.3]]))
    inf = -np.inf
    # sorted 0.5, 0.3, 0.2: cumulative 0.5, 0.8, 1.0
    np.testing.assert_array_equal(processor("top_p", p=0.5)(s, None), [[inf, s[0, 1], inf]])
    np.testing.assert_array_equal(processor("top_p", p=0.6)(s, None), [[inf, s[0, 1], s[0, 2]]])
    np.testing.assert_array_equal(processor("top_p", p=0.8)(s, None), [[inf, s[0, 1], s[0, 2]]])
    np.testing.assert_array_equal(processor("top_p", p=0.81)(s, None), s)
    np.testing.assert_array_equal(processor("top_p", p=1.0)(s, None), s)
    np.testing.assert_array_equal(processor("top_p", p=0.01)(s, None), [[inf, s[0, 1], inf]])  # the best, always


def test_min_p_keeps_what_is_p_times_as_likely_as_the_best():
    s = np.log(np.array([[0.5, 0.3, 0.2]]))
    inf = -np.inf
    np.testing.assert_array_equal(processor("min_p", p=0.5)(s, None), [[s[0, 0], s[0, 1], inf]])  # 0.3 >= 0.25
    np.testing.assert_array_equal(processor("min_p", p=0.7)(s, None), [[s[0, 0], inf, inf]])  # 0.3 < 0.35
    np.testing.assert_array_equal(processor("min_p", p=0.4)(s, None), s)  # 0.2 >= 0.2
    np.testing.assert_array_equal(processor("min_p", p=1.0)(s, None), [[s[0, 0], inf, inf]])


def test_repetition_penalty_is_ctrls_rule_on_the_tokens_of_each_row():
    s = np.array([[2.0, -1.0, 0.5, -3.0], [2.0, -1.0, 0.5, -np.inf]])
    tokens = np.array([[0, 1], [3, 3]])
    out = processor("repetition_penalty", penalty=2.0)(s, tokens)
    # row 0: tokens 0 (2 > 0: divided) and 1 (-1: multiplied); row 1: token 3, -inf stays -inf
    np.testing.assert_array_equal(out, [[1.0, -2.0, 0.5, -3.0], [2.0, -1.0, 0.5, -np.inf]])
    # on log-probabilities every score is <= 0: p -> p^theta
    logp = np.log(np.array([[0.9, 0.1]]))
    np.testing.assert_allclose(
        np.exp(processor("repetition_penalty", penalty=1.2)(logp, np.array([[0]]))[0, 0]), 0.9**1.2
    )


# -- the sets as properties -------------------------------------------------------------------------
finite = st.floats(-30, 30, allow_nan=False)
score_arrays = hnp.arrays(np.float64, st.tuples(st.integers(1, 3), st.integers(1, 12)), elements=finite)


def with_holes(scores, holes):
    """Some scores -inf (as an earlier processor leaves them), never a whole row."""
    scores = scores.copy()
    mask = np.resize(np.array(holes, dtype=bool), scores.shape)
    mask[np.arange(len(scores)), scores.argmax(axis=1)] = False
    scores[mask] = -np.inf
    return scores


def check_truncation(out, scores):
    """What every truncating processor does: kept scores unchanged, the rest -inf, the best kept."""
    kept = np.isfinite(out)
    np.testing.assert_array_equal(out[kept], scores[kept])
    assert kept[np.arange(len(scores)), scores.argmax(axis=1)].all()
    return kept


@settings(max_examples=150)
@given(score_arrays, st.integers(1, 14), st.lists(st.booleans(), min_size=1, max_size=7))
def test_top_k_never_keeps_a_token_outside_its_set(scores, k, holes):
    scores = with_holes(scores, holes)
    kept = check_truncation(processor("top_k", k=k)(scores, None), scores)
    for row, keep in zip(scores, kept):
        kth = np.sort(row)[::-1][min(k, len(row)) - 1]
        np.testing.assert_array_equal(keep, (row >= kth) & np.isfinite(row))
        assert keep.sum() >= min(k, np.isfinite(row).sum())


@settings(max_examples=150)
@given(score_arrays, st.floats(0.001, 1.0), st.lists(st.booleans(), min_size=1, max_size=7))
def test_top_p_keeps_the_smallest_set_whose_probability_reaches_p(scores, p, holes):
    scores = with_holes(scores, holes)
    kept = check_truncation(processor("top_p", p=p)(scores, None), scores)
    for row, keep in zip(probs_of(scores), kept):
        assert row[keep].sum() >= p - 1e-9 or keep[row > 0].all()  # it reaches p (or keeps everything)
        # and it is the smallest such set: without its least likely tokens (with their ties) it falls short
        least = row[keep].min()
        assert row[keep & (row > least)].sum() < p + 1e-9
        # a token outside is never likelier than one inside
        assert not (~keep).any() or row[~keep].max() <= least


@settings(max_examples=150)
@given(score_arrays, st.floats(0.001, 1.0), st.lists(st.booleans(), min_size=1, max_size=7))
def test_min_p_keeps_exactly_the_tokens_p_times_as_likely_as_the_best(scores, p, holes):
    scores = with_holes(scores, holes)
    kept = check_truncation(processor("min_p", p=p)(scores, None), scores)
    q = probs_of(scores)
    ratio = q / q.max(axis=1, keepdims=True)
    clear = np.abs(ratio - p) > 1e-9 * p  # away from the bar, where rounding cannot decide
    np.testing.assert_array_equal(kept[clear], (ratio >= p)[clear])


class Spy:
    """A processor that records the scores the next one receives."""

    kind = "processor"

    def __init__(self):
        self.seen = []

    def __call__(self, scores, tokens):
        self.seen.append(scores.copy())
        return scores


def reference_set(name, value, scores):
    """The set each truncation keeps, written from its definition (one row)."""
    q = probs_of(scores)
    if name == "top_k":
        return scores >= np.sort(scores)[::-1][min(value, len(scores)) - 1]
    if name == "top_p":  # the tokens strictly more likely than v hold less than p
        return np.array([q[q > q_v].sum() < value for q_v in q])
    return q >= value * q.max()  # min_p


@settings(max_examples=12)
@given(
    st.sampled_from([("top_k", [1, 2, 3]), ("top_p", [0.3, 0.6, 0.9]), ("min_p", [0.05, 0.2, 0.5])]),
    st.integers(0, 2),
    st.integers(0, 2**16),
)
def test_generation_never_emits_a_token_outside_the_set(piece, which, seed):
    """In generation with a tiny random LM: every token sampled lies in the set its processor's
    definition gives for the scores it received."""
    name, values = piece
    option = "k" if name == "top_k" else "p"
    model = lm(3, sharpen=1.5)
    # a temperature first flattens the rows, so that the sets hold several tokens
    chain = decoder(["temperature", name], **{option: values[which]}, temperature=3.0)
    spy = Spy()
    chain.processors.insert(1, spy)
    out = generate(model, list("abc"), VOCAB, 8, decoder=chain, rng=np.random.default_rng(seed))
    ids = VOCAB[out.tokens[3:]] + ([VOCAB.eos] if out.ended else [])
    assert len(ids) == len(spy.seen)
    sizes = []
    for token, scores in zip(ids, spy.seen):
        kept = reference_set(name, values[which], scores[0])
        assert kept[token], (name, values[which], token, probs_of(scores[0]))
        sizes.append(kept.sum())
    assert name == "top_k" and values[which] == 1 or max(sizes) > 1  # a choice was made


def test_sampling_at_a_fixed_seed_is_reproducible():
    model = lm(0, sharpen=1.0)
    runs = [
        generate(model, list("ab"), VOCAB, 12, decoder=decoder("top_k", k=4), rng=np.random.default_rng(7))
        for _ in range(2)
    ]
    assert runs[0] == runs[1]
    mt.manual_seed(5)
    first = generate(model, list("ab"), VOCAB, 12, decoder="top_p")
    mt.manual_seed(5)
    assert generate(model, list("ab"), VOCAB, 12, decoder="top_p") == first
    other = generate(model, list("ab"), VOCAB, 12, decoder=decoder("top_k", k=4), rng=np.random.default_rng(8))
    assert other.tokens != runs[0].tokens  # and the seed matters


# -- building a decoder: names, options, errors ---------------------------------------------------------
def test_a_decoder_routes_each_option_to_the_piece_that_takes_it():
    d = decoder("temperature,top_p", p=0.8, temperature=0.7)
    assert isinstance(d, Decoder) and d.names == ["temperature", "top_p", "sample"]
    assert d.processors[0].temperature == 0.7 and d.processors[1].p == 0.8
    assert decoder(["top_k"], k=3).names == ["top_k", "sample"]  # a processor alone samples
    assert decoder("greedy").names == ["greedy"]
    assert decoder("top_k, beam", k=2, beam_size=3).search.beam_size == 3  # the search may come anywhere
    both = decoder("top_p,min_p", **{"top_p.p": 0.9, "min_p.p": 0.05})
    assert (both.processors[0].p, both.processors[1].p) == (0.9, 0.05)
    assert repr(decoder("top_p", p=0.5)) == "Decoder(top_p(p=0.5), sample(length_penalty=0.75))"


@pytest.mark.parametrize(
    "names, options, error, message",
    [
        ("top_p,min_p", {"p": 0.5}, TypeError, r"'p' is taken by top_p and min_p; say which: top_p\.p=\.\.\. or min_p"),
        ("top_k", {"q": 1}, TypeError, r"no piece takes the option 'q' \(top_k takes k; sample takes length_penalty\)"),
        ("top_k", {"top_k.q": 1}, TypeError, r"'top_k\.q': top_k takes k"),
        ("top_k", {"top_p.p": 1}, TypeError, r"'top_p' is not in the decoder 'top_k,sample'"),
        ("greedy,beam", {}, ValueError, r"two searches \(greedy, beam\)"),
        ("top_k,top_k", {}, ValueError, r"top_k named twice"),
        ("top_k,,beam", {}, ValueError, r"expected names separated by commas"),
        ("", {}, ValueError, r"expected names separated by commas"),
        ("top_q", {}, KeyError, r"unknown decoder 'top_q'; did you mean 'top_p'\?"),
        ("top_p", {"p": 0}, ValueError, r"top_p: p must be a finite number > 0 and <= 1, got 0"),
        ("top_p", {"p": 1.5}, ValueError, r"top_p: p must be a finite number > 0 and <= 1, got 1\.5"),
        ("min_p", {"p": -0.1}, ValueError, r"min_p: p must be a finite number > 0 and <= 1, got -0\.1"),
        ("top_k", {"k": 0}, ValueError, r"top_k: k must be an integer >= 1, got 0"),
        ("top_k", {"k": 2.5}, ValueError, r"top_k: k must be an integer, got 2\.5"),
        ("temperature", {"temperature": 0}, ValueError, r"temperature: temperature must be a finite number > 0, got 0"),
        ("temperature", {"temperature": float("nan")}, ValueError, r"temperature must be a finite number > 0, got nan"),
        ("temperature", {"temperature": "hot"}, ValueError, r"temperature: temperature must be a number, got 'hot'"),
        ("repetition_penalty", {"penalty": 0}, ValueError, r"repetition_penalty: penalty must be .* > 0, got 0"),
        ("beam", {"beam_size": 0}, ValueError, r"beam: beam_size must be an integer >= 1, got 0"),
        ("beam", {"length_penalty": -1}, ValueError, r"beam: length_penalty must be a finite number >= 0, got -1"),
        ("speculative", {}, ValueError, r"speculative: draft must be a model .*none given.*--draft RUN"),
        ("speculative", {"draft": "small"}, ValueError, r"speculative: draft must be .*str has no begin_decoding"),
    ],
)
def test_every_error_names_the_piece_and_the_value(names, options, error, message):
    with pytest.raises(error, match=message):
        decoder(names, **options)


def test_speculative_options_are_checked():
    draft = lm(1)
    for k in (0, 65):
        with pytest.raises(ValueError, match=rf"speculative: k must be an integer between 1 and 64, got {k}"):
            decoder("speculative", draft=draft, k=k)
    with pytest.raises(ValueError, match=r"speculative: sample must be True or False, got 'yes'"):
        decoder("speculative", draft=draft, sample="yes")
    assert decoder("speculative", draft=draft, k=64).search.k == 64


def test_a_piece_refuses_an_unknown_option_itself():
    with pytest.raises(TypeError, match=r"TopP: unknown option\(s\) 'pp' \(did you mean 'p'\?\); it takes p"):
        mtp.lookup("decoder", "top_p")(pp=0.5)


def test_generate_refuses_a_decoder_and_its_shorthands_together():
    model = lm(0)
    with pytest.raises(ValueError, match=r"give the decoder's options to it .* not as temperature=0\.5"):
        generate(model, list("ab"), VOCAB, 3, temperature=0.5, decoder="top_p")
    with pytest.raises(ValueError, match=r"not as beam_size=3"):
        generate(model, list("ab"), VOCAB, 3, beam_size=3, decoder="greedy")
    with pytest.raises(TypeError, match=r"decoder must be a name or a minitensor\.inference\.decoder"):
        generate(model, list("ab"), VOCAB, 3, decoder=42)


def test_a_processor_that_breaks_the_contract_is_named():
    class Wrong:
        kind = "processor"

        def __call__(self, scores, tokens):
            return scores[:, :-1]

    class Everything:
        kind = "processor"

        def __call__(self, scores, tokens):
            return np.full_like(scores, -np.inf)

    model = lm(0)
    start = np.array([[VOCAB.bos]])
    for piece, message in (
        (Wrong(), r"decoder processor Wrong: returned shape \(1, 11\) for scores of shape \(1, 12\)"),
        (Everything(), r"the processors Everything left no possible token in row 0"),
    ):
        with pytest.raises(ValueError, match=message):
            decoder("greedy")(model, model.begin_decoding(), start, VOCAB.eos, 3, before=[piece])


def test_a_class_without_a_kind_is_refused(monkeypatch):
    class Kindless:
        def __call__(self, scores, tokens):
            return scores

    class Plugin:
        @mtp.hookimpl
        def minitensor_decoders(self):
            return {"kindless": Kindless}

    plugin = Plugin()
    mtp.register(plugin)
    try:
        with pytest.raises(TypeError, match=r"decoder 'kindless' .*kind must be 'processor' or 'search', got None"):
            decoder("kindless")
    finally:
        mtp.unregister(plugin)


def test_the_plugins_command_lists_the_decoders_with_their_kind(capsys):
    from minitensor import cli

    assert cli.main(["plugins"]) == 0
    lines = capsys.readouterr().out.splitlines()
    for name, kind in (("top_p", "processor"), ("min_p", "processor"), ("beam", "search"), ("speculative", "search")):
        row = next(line.split() for line in lines if line.split()[:1] == [name])
        assert row[1:4] == ["decoder", f"({kind})", "built-in"], row


# -- the searches through the registry equal the public functions ---------------------------------------
def test_beam_greedy_and_sample_through_the_registry_are_todays_functions():
    model = lm(4, sharpen=2.0)
    start = np.array([[VOCAB.bos, 4, 5], [VOCAB.bos, 6, 6]])
    for beam_size in (1, 3):
        via = decoder("beam", beam_size=beam_size, length_penalty=0.5)(
            model, model.begin_decoding(), start, VOCAB.eos, 8
        )
        direct = beam_search(model, model.begin_decoding(), VOCAB.bos, VOCAB.eos, 8, beam_size, 0.5, start[:, 1:])
        assert via == direct
    assert decoder("greedy")(model, model.begin_decoding(), start, VOCAB.eos, 8) == greedy(
        model, model.begin_decoding(), None, VOCAB.eos, 8, start
    )
    # generate's shorthands are these decoders
    assert generate(model, list("ab"), VOCAB, 6, beam_size=4) == generate(model, list("ab"), VOCAB, 6, decoder="beam")
    assert generate(model, list("ab"), VOCAB, 6) == generate(model, list("ab"), VOCAB, 6, decoder="greedy")
    drawn = [
        generate(model, list("ab"), VOCAB, 6, rng=np.random.default_rng(3), **kwargs)
        for kwargs in ({"temperature": 0.7}, {"decoder": decoder("temperature", temperature=0.7)})
    ]
    assert drawn[0] == drawn[1]


def test_the_temperature_chain_is_todays_sample_and_reports_the_models_log_probability():
    """temperature,sample through the registry draws what the public sample() draws from the same
    generator (the same Gumbel noise, scaled), and its log_prob is the model's, not the processed sum."""
    model = lm(4, sharpen=1.0)
    start = np.array([[VOCAB.bos, 4, 5]])
    for temperature in (0.5, 0.7, 1.5):
        via = decoder("temperature", temperature=temperature)(
            model, model.begin_decoding(), start, VOCAB.eos, 10, np.random.default_rng(2)
        )
        direct = sample(
            model, model.begin_decoding(), None, VOCAB.eos, 10, temperature, start, rng=np.random.default_rng(2)
        )
        assert via[0].tokens == direct[0].tokens
        np.testing.assert_allclose([via[0].log_prob, via[0].score], [direct[0].log_prob, direct[0].score], rtol=1e-12)
    # the model's log P of those tokens, recomputed from the full prefix
    ids = list(start[0]) + via[0].tokens + ([VOCAB.eos] if via[0].ended else [])
    logp = mt.log_softmax(model(mt.tensor([ids[:-1]])), axis=-1).numpy()[0]
    expected = sum(logp[i - 1, t] for i, t in enumerate(ids) if i >= len(start[0]))
    assert math.isclose(via[0].log_prob, expected, rel_tol=1e-9)


def test_processors_see_each_rows_own_tokens_under_a_beam():
    """A repetition penalty of 1e6 rules out every token of the row's own prefix: beam search
    must hand each hypothesis its own tokens (followed through the back-pointers), prompt included."""
    model = lm(0, sharpen=1.0)
    start = np.array([[VOCAB.bos, 4, 5], [VOCAB.bos, 6, 6]])
    chain = [processor("repetition_penalty", penalty=1e6)]
    found = run_search(model, model.begin_decoding(), start, VOCAB.eos, 6, 3, 0.75, chain, n_best=3)
    for row, hyps in zip(start, found):
        assert len(hyps) == 3
        for h in hyps:
            written = list(row) + h.tokens
            assert len(set(written[1:])) == len(written[1:]) - (row[1] == row[2]), written
    plain = run_search(model, model.begin_decoding(), start, VOCAB.eos, 6, 3, 0.75, n_best=3)
    assert any(len(set(h.tokens)) < len(h.tokens) for hyps in plain for h in hyps)  # it repeats without


def test_a_wide_beam_under_top_k_keeps_only_real_hypotheses():
    """top_k = 2 under a beam of 5: the beam cannot fill at the first step; no -inf hypothesis comes back."""
    model = lm(4, sharpen=2.0)
    found = run_search(
        model,
        model.begin_decoding(),
        np.array([[VOCAB.bos]]),
        VOCAB.eos,
        5,
        5,
        0.75,
        [processor("top_k", k=2)],
        n_best=5,
    )[0]
    assert found and all(np.isfinite(h.score) for h in found)


# -- speculative decoding ---------------------------------------------------------------------------
@pytest.mark.parametrize("draft_kind", ["perturbed", "independent"])
def test_speculative_greedy_is_the_targets_greedy_output_token_for_token(draft_kind):
    target = lm(0)
    draft = perturbed(target, 11, 0.1) if draft_kind == "perturbed" else lm(12, num_hiddens=8, num_blks=1)
    proposed = accepted = 0
    for prompt in (list("abc"), list("h"), [], list("gfedcbahh")):
        plain = generate(target, prompt, VOCAB, 25)
        for k in (1, 2, 3, 5):
            chain = decoder("speculative", draft=draft, k=k)
            fast = generate(target, prompt, VOCAB, 25, decoder=chain)
            assert fast.tokens == plain.tokens and fast.ended == plain.ended, (prompt, k)
            assert math.isclose(fast.log_prob, plain.log_prob, rel_tol=1e-9)
            stats = chain.search.stats
            assert stats.generated == len(fast.tokens) - len(prompt) + fast.ended
            # a round emits its accepted proposals and one token of the target's
            assert stats.rounds == stats.generated - stats.accepted or fast.ended
            assert 0 <= stats.accepted <= stats.proposed
            proposed, accepted = proposed + stats.proposed, accepted + stats.accepted
    counted = chain.search.stats.generated
    generate(target, list("abc"), VOCAB, 25, decoder=chain)  # a search object counts all its calls
    assert chain.search.stats.generated > counted
    if draft_kind == "perturbed":  # both branches of the rule ran: acceptances and rejections
        assert 0.3 < accepted / proposed < 0.95, (accepted, proposed)
    else:
        assert accepted < proposed


def test_speculative_decoding_rolls_back_through_the_cache_policy():
    """crop_state is the cache policy's crop: int8 can (and gives int8's own greedy output),
    window cannot, and says so."""
    target = lm(0)
    draft = perturbed(target, 11, 0.1)
    for cache in ("full", "int8"):
        plain = generate(target, list("abc"), VOCAB, 20, cache=cache)
        fast = generate(target, list("abc"), VOCAB, 20, decoder=decoder("speculative", draft=draft, k=3), cache=cache)
        assert fast.tokens == plain.tokens, cache
    with pytest.raises(ValueError, match=r"speculative decoding: the target's cache: .*cannot roll back"):
        generate(
            target,
            list("abc"),
            VOCAB,
            20,
            decoder=decoder("speculative", draft=draft, k=3),
            cache="window",
            cache_options={"window": 4},
        )
    # refused before the first token, even where every proposal would be accepted (the draft is the target)
    for prompt in (list("abc"), []):
        with pytest.raises(ValueError, match=r"speculative decoding: the target's cache: .*cannot roll back"):
            generate(target, prompt, VOCAB, 5, decoder=decoder("speculative", draft=target), cache="window")


def test_speculative_decoding_takes_one_sequence_and_one_vocabulary():
    target, draft = lm(0), lm(1)
    with pytest.raises(ValueError, match=r"one sequence at a time \(batch size 1\), got 2"):
        generate(target, [list("ab"), list("ba")], VOCAB, 4, decoder=decoder("speculative", draft=draft))
    mt.manual_seed(0)
    other = nn.TransformerLM(7, 8, 16, 2, 1, 0.0, dtype=mt.float64).eval()
    with pytest.raises(ValueError, match=r"the draft has 7 tokens, the target 12"):
        generate(target, list("ab"), VOCAB, 4, decoder=decoder("speculative", draft=other))
    args = (len(VOCAB), 8, 16, 2, 1, 0.0)
    seq2seq = nn.EncoderDecoder(nn.TransformerEncoder(*args), nn.TransformerDecoder(*args)).eval()
    with pytest.raises(TypeError, match=r"the draft must be a language model \(TransformerLM\)"):
        generate(target, list("ab"), VOCAB, 4, decoder=decoder("speculative", draft=seq2seq))


class Bigram:
    """A language model whose next-token logits depend on the last token alone: ``table[last]``.
    Its state is the list of tokens fed; ``crop_state`` keeps the first n. Exact and fast: the
    chi-square test below draws thousands of sequences."""

    def __init__(self, table):
        self.table = np.asarray(table, dtype=np.float64)

    def begin_decoding(self):
        return []

    def decode_step(self, tokens, state):
        fed = tokens.numpy()[0].tolist()
        return mt.tensor(self.table[fed][None]), state + fed

    def crop_state(self, state, num_tokens):
        return state[:num_tokens]


def chi_square(counts, expected):
    """Pearson's statistic over the cells, those expected fewer than 5 times pooled into one; and its
    degrees of freedom."""
    small = expected < 5
    observed = np.append(counts[~small], counts[small].sum())
    wanted = np.append(expected[~small], expected[small].sum())
    keep = wanted > 0
    return float(((observed[keep] - wanted[keep]) ** 2 / wanted[keep]).sum()), int(keep.sum()) - 1


def critical_value(dof, alpha=1e-3):
    try:
        from scipy.stats import chi2
    except ImportError:  # Wilson-Hilferty: within 1% of the exact quantile for dof >= 10
        z = 3.090232  # the standard normal's 1 - 1e-3 quantile
        return dof * (1 - 2 / (9 * dof) + z * math.sqrt(2 / (9 * dof))) ** 3
    return float(chi2.ppf(1 - alpha, dof))


SPEC_V, SPEC_LEN, SPEC_N = 4, 3, 3000


def sequence_distribution(table, temperature, first):
    """The exact probability of every sequence of SPEC_LEN tokens the Bigram model samples after ``first``."""
    p = probs_of(np.asarray(table) / temperature)
    out = np.zeros((SPEC_V,) * SPEC_LEN)
    for seq in np.ndindex(out.shape):
        prev, prob = first, 1.0
        for t in seq:
            prob, prev = prob * p[prev, t], t
        out[seq] = prob
    return out.ravel()


def speculative_counts(target, draft, k, temperature, seed):
    rng = np.random.default_rng(seed)
    counts = np.zeros(SPEC_V**SPEC_LEN)
    processors = [processor("temperature", temperature=temperature)]
    proposed = accepted = 0
    for _ in range(SPEC_N):
        (hyp,), stats = speculative_search(
            target, draft, [], np.array([[0]]), None, SPEC_LEN, processors, rng, k=k, sample=True
        )
        counts[np.ravel_multi_index(hyp.tokens, (SPEC_V,) * SPEC_LEN)] += 1
        proposed, accepted = proposed + stats.proposed, accepted + stats.accepted
    return counts, accepted / proposed


def test_speculative_sampling_draws_from_the_targets_distribution():
    """Sequences of 3 tokens from 4, drawn 3,000 times with a draft unlike the target: the counts of
    the 64 sequences against the target's exact probabilities (chi-square, alpha = 0.001). k = 2
    makes the first round propose two tokens and the second none, so accepting, rejecting (the
    residual max(0, p - q)) and the bonus token all shape the counts."""
    rng = np.random.default_rng(0)
    target_table, draft_table = rng.normal(0, 1.5, (2, SPEC_V, SPEC_V))
    target, draft = Bigram(target_table), Bigram(draft_table)
    temperature = 0.8
    counts, rate = speculative_counts(target, draft, 2, temperature, seed=1)
    expected = SPEC_N * sequence_distribution(target_table, temperature, 0)
    statistic, dof = chi_square(counts, expected)
    assert statistic < critical_value(dof), (statistic, dof, critical_value(dof))
    assert 0.2 < rate < 0.9  # the draft is wrong often enough for the residual to matter
    # the draft's own distribution is far from the target's: this test could tell them apart
    wrong = SPEC_N * sequence_distribution(draft_table, temperature, 0)
    assert chi_square(counts, wrong)[0] > 5 * critical_value(dof)


# -- a user's decoder, as a learner writes one from the docs ---------------------------------------------
class NoImmediateRepeat:
    """Never the token just written: s_v = -inf for v = the row's last token."""

    kind = "processor"

    def __init__(self, **options):
        mt.plugins.check_options(type(self), options)

    def __call__(self, scores, tokens):
        scores = scores.copy()
        scores[np.arange(len(scores)), tokens[:, -1]] = -np.inf
        return scores


@mt.hookimpl
def minitensor_decoders():
    return {"no_repeat": NoImmediateRepeat}


def test_a_users_processor_works_by_name_everywhere():
    model = lm(0, sharpen=1.0)
    plain = generate(model, list("a"), VOCAB, 30, decoder="greedy").tokens
    assert any(a == b for a, b in zip(plain, plain[1:]))  # this model repeats itself greedily
    mt.plugins.register(sys.modules[__name__])
    try:
        assert mt.plugins.decoders()["no_repeat"] is NoImmediateRepeat
        for chain in ("no_repeat,greedy", decoder("no_repeat,top_k", k=3)):
            out = generate(model, list("a"), VOCAB, 30, decoder=chain, rng=np.random.default_rng(0)).tokens
            assert all(a != b for a, b in zip(out, out[1:])), out
        with pytest.raises(TypeError, match=r"no piece takes the option 'x' \(no_repeat takes no options"):
            decoder("no_repeat", x=1)
    finally:
        mt.plugins.unregister(sys.modules[__name__])
    assert "no_repeat" not in mt.plugins.decoders()


# -- the command line -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two tiny language models of one text (a target and a draft) and one of another text."""
    from minitensor import cli

    folder = tmp_path_factory.mktemp("decoder_runs")
    texts = {"text": "to be or not to be, that is the question\n" * 40, "other": "hello world, goodbye moon\n" * 40}
    for name, text in texts.items():
        (folder / f"{name}.txt").write_text(text, encoding="utf-8")
    small = ["--lm-num-steps", "8", "--steps", "2", "--batch-size", "4", "--num-blks", "1", "--eval-iters", "1"]
    small += ["--no-progress", "--ffn-num-hiddens", "16"]
    for out, text, hiddens, seed in (("target", "text", 16, 0), ("draft", "text", 8, 1), ("other", "other", 8, 0)):
        argv = ["train", "--text", str(folder / f"{text}.txt"), "--out", str(folder / out), "--seed", str(seed)]
        assert cli.main([*argv, "--num-hiddens", str(hiddens), *small]) == 0
    return folder


def run_generate(capsys, *argv):
    from minitensor import cli

    capsys.readouterr()
    code = cli.main(["generate", "--prompt", "to be", "--max-len", "12", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_the_generate_command_takes_a_decoder_and_its_options(runs, capsys):
    target = ["--checkpoint", str(runs / "target")]
    code, out, err = run_generate(capsys, *target, "--decoder", "top_k,top_p", "--decoder-opt", "k=3,p=0.9")
    assert code == 0 and out.startswith("to be"), err
    again = run_generate(capsys, *target, "--decoder", "top_k,top_p", "--decoder-opt", "k=3", "--decoder-opt", "p=0.9")
    assert again[1] == out  # repeated or comma-separated: one decoder; the same seed, the same text
    greedy_out = run_generate(capsys, *target, "--greedy")[1]
    assert run_generate(capsys, *target, "--decoder", "greedy")[1] == greedy_out
    for argv, message in (
        (["--decoder-opt", "p=0.9"], "--decoder-opt sets an option of a decoder: name it with --decoder NAMES"),
        (["--decoder", "top_p", "--decoder-opt", "q=1"], "no piece takes the option 'q' (top_p takes p"),
        (["--decoder", "top_p", "--decoder-opt", "p=2"], "top_p: p must be a finite number > 0 and <= 1, got 2"),
        (["--decoder", "nucleus"], "unknown decoder 'nucleus'"),
        (["--cache-opt", "window=4"], "--cache-opt sets an option of the cache policy: name it with --cache NAME"),
        (["--draft", str(runs / "other"), "--greedy"], "its vocabulary differs from the checkpoint's"),
        (
            ["--draft", str(runs / "draft"), "--beam", "2"],
            "--draft decodes speculatively: it replaces greedy or sample",
        ),
    ):
        code, _, err = run_generate(capsys, *target, *argv)
        assert code == 2 and message in err and "Traceback" not in err, (argv, err)


def test_the_generate_command_decodes_speculatively_with_a_draft(runs, capsys):
    target = ["--checkpoint", str(runs / "target")]
    plain = run_generate(capsys, *target, "--greedy")[1]
    code, out, err = run_generate(capsys, *target, "--greedy", "--draft", str(runs / "draft"))
    assert code == 0 and out == plain, err  # the target's greedy text, token for token
    assert "speculative decoding accepted" in err and "draft tokens" in err
    code, out, err = run_generate(
        capsys, *target, "--draft", str(runs / "draft"), "--decoder", "speculative", "--decoder-opt", "k=2"
    )
    assert code == 0 and out == plain, err
    code, out, err = run_generate(capsys, *target, "--temperature", "0.8", "--draft", str(runs / "draft"))
    assert code == 0 and out.startswith("to be"), err  # sampling speculative decoding
    code, out, err = run_generate(capsys, *target, "--greedy", "--draft", str(runs / "draft"), "--cache", "int8")
    assert code == 0 and out.startswith("to be"), err
    window = ["--cache", "window", "--cache-opt", "window=4"]
    code, out, err = run_generate(capsys, *target, "--greedy", "--draft", str(runs / "draft"), *window)
    assert code == 2 and "speculative decoding: the target's cache" in err and "Traceback" not in err, err


def test_the_generate_command_passes_the_cache_policy_on(runs, capsys):
    target = ["--checkpoint", str(runs / "target")]
    plain = run_generate(capsys, *target, "--greedy")[1]
    assert run_generate(capsys, *target, "--greedy", "--cache", "full")[1] == plain
    code, out, err = run_generate(capsys, *target, "--greedy", "--cache", "sinks", "--cache-opt", "sinks=1,window=3")
    assert code == 0 and out.startswith("to be"), err
    code, _, err = run_generate(capsys, *target, "--cache", "window", "--cache-opt", "widow=3")
    assert code == 2 and "widow" in err, err


def test_a_cache_policy_streams_a_relative_model_past_its_context(runs, capsys, monkeypatch):
    """With --cache, a rotary model reads the text in one piece (what sinks are for); a model
    with absolute positions, and any model without --cache, restarts in pieces of its context."""
    from minitensor import cli

    rotary = runs / "rotary"
    if not rotary.exists():
        argv = ["train", "--text", str(runs / "text.txt"), "--out", str(rotary), "--positional", "rotary"]
        argv += ["--lm-num-steps", "8", "--steps", "2", "--batch-size", "4", "--num-blks", "1", "--no-progress"]
        assert cli.main([*argv, "--num-hiddens", "16", "--ffn-num-hiddens", "16", "--eval-iters", "1"]) == 0
    windows = []
    real = cli.generate

    def recorded(*args, **kwargs):
        windows.append(kwargs.get("window"))
        return real(*args, **kwargs)

    monkeypatch.setattr(cli, "generate", recorded)
    sinks = ["--cache", "sinks", "--cache-opt", "sinks=1,window=3", "--greedy"]
    for folder, argv, window in (
        (rotary, sinks, None),
        (rotary, ["--greedy"], 8),
        (runs / "target", sinks, 8),  # learned or sinusoidal positions end at the context
    ):
        code, out, err = run_generate(capsys, "--checkpoint", str(folder), *argv)
        assert code == 0 and out.startswith("to be"), err
        assert windows[-1] == window, (folder.name, argv)
