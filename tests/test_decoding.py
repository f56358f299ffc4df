"""Decoding (minitensor/inference/decoding.py): greedy search, beam search and sampling through one
loop, for the encoder-decoder Transformer, the Bahdanau model and the Transformer LM.

The references are independent of the decoding code: exhaustive search over every sequence,
each scored by one full forward pass (no key/value cache, no incremental state), and
step-by-step argmax recomputing the whole prefix at every step. A scripted "model" with
hand-written next-token distributions checks the beam-search rules by hand: which hypotheses
finish, that finished ones are never extended, that done examples leave the batch.
"""

import itertools

import numpy as np
import pytest

import minitensor as mt
from minitensor import nn
from minitensor.data import Vocab
from minitensor.inference.decoding import step_attention
from minitensor.train import Hypothesis, beam_search, generate, greedy, sample, translate

PAD, BOS, EOS, A, B = 0, 1, 2, 3, 4
V = 5  # <pad> <bos> <eos> and two real tokens
NON_EOS = [t for t in range(V) if t != EOS]
KINDS = ["transformer", "seq2seq", "lm"]


# -- tiny models with random weights ---------------------------------------------------------------
def sharpen(dense, factor=2.0):
    """Scale the output layer: random weights give nearly uniform next-token distributions,
    on which every search finds about the same thing; sharper ones make the searches differ."""
    dense.weight.data = dense.weight.data * factor
    dense.bias.data = dense.bias.data * factor


def make_model(kind, seed=0, dropout=0.0, device="cpu"):
    mt.manual_seed(seed)
    options = dict(dtype=mt.float64, max_len=30)
    if kind == "transformer":
        args = (V, 8, 16, 2, 2, dropout)
        model = nn.EncoderDecoder(nn.TransformerEncoder(*args, **options), nn.TransformerDecoder(*args, **options))
    elif kind == "seq2seq":
        model = nn.Seq2Seq(
            nn.Seq2SeqEncoder(V, 4, 8, 2, dropout, dtype=mt.float64),
            nn.Seq2SeqAttentionDecoder(V, 4, 8, 2, dropout, dtype=mt.float64),
        )
    else:
        model = nn.TransformerLM(V, 8, 16, 2, 2, dropout, **options)
    sharpen(model.decoder.dense)
    return model.eval().to(device)


SRC = np.array([[3, 4, 4, 3, 2], [4, 3, 2, 0, 0], [3, 2, 0, 0, 0]])  # tokens + <eos>, padded
SRC_LENS = np.array([5, 3, 2])
PROMPTS = np.array([[BOS, A], [BOS, B], [A, A]])  # an LM continues these


def begin(model, kind, rows=slice(None), device="cpu"):
    """A fresh state for the examples ``rows``, and the bos / prompt that go with it."""
    if kind == "lm":
        return model.begin_decoding(), None, PROMPTS[rows]
    state = model.begin_decoding(mt.tensor(SRC[rows], device=device), mt.tensor(SRC_LENS[rows], device=device))
    return state, BOS, None


def full_forward_log_probs(model, kind, b, sequences, start=None):
    """log P of the next token at every position, for ``sequences`` (lists of ids) following
    example ``b``'s ``start`` (default <bos>, or the LM's prompt), from ONE full forward pass
    each, no cache. Returns (N, T, V) with T = the longest sequence (positions past a
    sequence are junk)."""
    T = max(len(s) for s in sequences)
    if start is None:
        start = [BOS] if kind != "lm" else list(PROMPTS[b])
    inputs = np.array([start + s[:-1] + [PAD] * (T - len(s)) if s else start + [PAD] * (T - 1) for s in sequences])
    N = len(sequences)
    if kind == "lm":
        logits = model(mt.tensor(inputs))
    else:
        logits = model(
            mt.tensor(np.repeat(SRC[b : b + 1], N, 0)), mt.tensor(inputs), mt.tensor(np.repeat(SRC_LENS[b : b + 1], N))
        )
    return mt.log_softmax(logits[:, len(start) - 1 :], axis=-1).numpy()  # the start itself is not scored


def sequence_log_prob(model, kind, b, sequences):
    """Total log-probability of each sequence (its tokens, <eos> included if present)."""
    logp = full_forward_log_probs(model, kind, b, sequences)
    return np.array([sum(logp[i, t, tok] for t, tok in enumerate(s)) for i, s in enumerate(sequences)])


def all_sequences(max_len):
    """Every output beam search may return: up to max_len - 1 tokens and <eos>, or max_len
    tokens cut without one (the tokens never <eos>)."""
    seqs = [list(s) + [EOS] for n in range(max_len) for s in itertools.product(NON_EOS, repeat=n)]
    return seqs + [list(s) for s in itertools.product(NON_EOS, repeat=max_len)]


def exhaustive_ranking(model, kind, b, max_len, alpha):
    """(tokens without <eos>, ended, score) of every sequence, best first."""
    seqs = all_sequences(max_len)
    log_probs = sequence_log_prob(model, kind, b, seqs)
    scores = log_probs / np.array([len(s) for s in seqs]) ** alpha
    order = np.argsort(-scores, kind="stable")
    return [(seqs[i][:-1] if seqs[i][-1:] == [EOS] else seqs[i], seqs[i][-1:] == [EOS], scores[i]) for i in order]


# -- against exhaustive search and full recomputation -----------------------------------------------
@pytest.mark.parametrize("alpha", [0.0, 0.75])
@pytest.mark.parametrize("kind", KINDS)
def test_a_beam_wide_enough_for_every_hypothesis_is_exhaustive_search(kind, alpha):
    max_len, n = 4, 12
    model = make_model(kind, seed=1)
    state, bos, prompt = begin(model, kind)
    # |V|^max_len slots: nothing is ever pruned, so beam search sees every sequence
    found = beam_search(model, state, bos, EOS, max_len, V**max_len, alpha, prompt, n_best=n)
    greedy_found = greedy(model, state, bos, EOS, max_len, prompt, length_penalty=alpha)
    differs = 0
    for b, (hyps, g) in enumerate(zip(found, greedy_found)):
        expected = exhaustive_ranking(model, kind, b, max_len, alpha)[:n]
        assert [(h.tokens, h.ended) for h in hyps] == [(t, e) for t, e, _ in expected]
        np.testing.assert_allclose([h.score for h in hyps], [s for _, _, s in expected], rtol=1e-10)
        assert g.score <= hyps[0].score + 1e-12
        differs += g.tokens != hyps[0].tokens
    assert differs, "greedy search finds the best sequence everywhere: this test could not tell them apart"


@pytest.mark.parametrize("kind", KINDS)
def test_greedy_is_argmax_recomputed_from_the_full_prefix(kind):
    max_len = 6
    model = make_model(kind, seed=2)
    state, bos, lm_prompt = begin(model, kind)
    # an encoder-decoder also continues a forced target prefix, after <bos>
    for prompt in [lm_prompt] if kind == "lm" else [None, [A, B]]:
        found = greedy(model, state, bos, EOS, max_len, prompt, length_penalty=0.0)
        for b, hyp in enumerate(found):
            start = None if prompt is None or kind == "lm" else [BOS] + prompt
            seq, log_prob = [], 0.0
            for _ in range(max_len):  # the whole prefix again at every step: no cache, no state
                logp = full_forward_log_probs(model, kind, b, [seq + [PAD]], start)[0, len(seq)]
                token = int(np.argmax(logp))
                seq, log_prob = seq + [token], log_prob + logp[token]
                if token == EOS:
                    break
            ended = seq[-1] == EOS
            assert (hyp.tokens, hyp.ended) == (seq[:-1] if ended else seq, ended)
            np.testing.assert_allclose([hyp.log_prob, hyp.score], [log_prob, log_prob], rtol=1e-10)
        # beam search with one hypothesis is the same search
        assert beam_search(model, state, bos, EOS, max_len, 1, 0.0, prompt) == found


def test_ended_and_cut_hypotheses_are_scored_with_and_without_eos():
    model = make_model("transformer", seed=3)
    state, bos, _ = begin(model, "transformer")
    for hyp_list in beam_search(model, state, bos, EOS, 5, beam_size=3, length_penalty=0.75, n_best=3):
        for hyp in hyp_list:
            assert EOS not in hyp.tokens and len(hyp.tokens) + hyp.ended <= 5
            assert hyp.ended or len(hyp.tokens) == 5
            length = len(hyp.tokens) + hyp.ended
            np.testing.assert_allclose(hyp.score, hyp.log_prob / length**0.75, rtol=1e-12)
        assert [h.score for h in hyp_list] == sorted((h.score for h in hyp_list), reverse=True)
    found = beam_search(model, state, bos, EOS, 5, beam_size=3, n_best=3)
    for b, hyp_list in enumerate(found):
        seqs = [h.tokens + [EOS] * h.ended for h in hyp_list]
        np.testing.assert_allclose(
            [h.log_prob for h in hyp_list], sequence_log_prob(model, "transformer", b, seqs), rtol=1e-10
        )


# -- the rules, by hand -----------------------------------------------------------------------------
class Scripted(nn.Module):
    """A stand-in model whose next-token distribution is a table look-up on the example and
    the tokens so far. Its state is a tensor of rows [example id, <bos>, tokens ...]; it
    records every row it is fed, so a test can see what the search asked for."""

    def __init__(self, table, default=(0.05, 0.05, 0.5, 0.2, 0.2)):
        super().__init__()
        self.table, self.default, self.fed, self.examples = table, default, [], []

    def begin_decoding(self, batch=1):
        return mt.tensor(np.arange(batch)[:, None])

    def decode_step(self, tokens, state):
        state = mt.concat([state, tokens], axis=1)
        rows = state.numpy()
        self.fed.append([tuple(int(t) for t in r[1:]) for r in rows])
        self.examples.append([int(r[0]) for r in rows])
        probs = [self.table.get((int(r[0]), tuple(int(t) for t in r[2:])), self.default) for r in rows]
        return mt.tensor(np.log(np.array(probs, dtype=np.float64))[:, None, :]), state

    def reorder_state(self, state, indices):
        return state[mt.tensor(indices)]


#            pad   bos   eos   A     B
CLASSIC = {
    (0, ()): (0.025, 0.025, 0.05, 0.5, 0.4),
    (0, (A,)): (0.05, 0.05, 0.30, 0.32, 0.28),
    (0, (B,)): (0.01, 0.01, 0.90, 0.04, 0.04),
}


def test_beam_search_finds_what_greedy_search_misses():
    """Greedy takes A (0.5), then A (0.32), then <eos> (0.5): P = 0.08. With k = 2 the beam
    keeps B (0.4) as well, whose <eos> (0.9) gives P = 0.36."""
    model = Scripted(CLASSIC)
    (g,) = greedy(model, model.begin_decoding(), BOS, EOS, 10, length_penalty=0.0)
    assert (g.tokens, g.ended) == ([A, A], True)
    np.testing.assert_allclose(g.log_prob, np.log(0.5 * 0.32 * 0.5))
    model.fed.clear()
    (best,) = beam_search(model, model.begin_decoding(), BOS, EOS, 10, beam_size=2, length_penalty=0.0, n_best=3)
    assert [h.tokens for h in best] == [[B], [A, A], [A, B]]
    np.testing.assert_allclose([h.log_prob for h in best], np.log([0.4 * 0.9, 0.5 * 0.32 * 0.5, 0.5 * 0.28 * 0.5]))
    # <eos> at step 1 (0.05) was not among the 2 best extensions: no hypothesis [] (rule 2).
    # Step 2 finished B <eos>; step 3 finished A A <eos> and A B <eos>: 3 >= k, done -- and
    # a finished hypothesis was never fed again.
    assert model.fed == [[(BOS,)], [(BOS, A), (BOS, B)], [(BOS, A, A), (BOS, A, B)]]
    # the length penalty decides between candidates, not what the beam explores
    (normalised,) = beam_search(model, model.begin_decoding(), BOS, EOS, 10, beam_size=2, length_penalty=0.75)
    np.testing.assert_allclose(normalised.score, np.log(0.36) / 2**0.75)


def test_max_len_cuts_the_hypotheses_still_alive():
    model = Scripted(CLASSIC)
    (g,) = greedy(model, model.begin_decoding(), BOS, EOS, 2, length_penalty=0.0)
    assert (g.tokens, g.ended) == ([A, A], False)
    np.testing.assert_allclose(g.log_prob, np.log(0.5 * 0.32))  # no <eos> term: it was never chosen
    assert len(model.fed) == 2
    (best,) = beam_search(model, model.begin_decoding(), BOS, EOS, 2, beam_size=2, length_penalty=0.0, n_best=3)
    assert [(h.tokens, h.ended) for h in best] == [([B], True), ([A, A], False), ([A, B], False)]
    never = Scripted({}, default=(0.3, 0.1, 0.0001, 0.3, 0.2999))  # almost never <eos>
    for k in (1, 3):
        for hyp in beam_search(never, never.begin_decoding(2), BOS, EOS, 7, beam_size=k):
            assert len(hyp.tokens) == 7 and not hyp.ended
        # 7 calls, the last feeding <bos> and 6 tokens: the 7th token is chosen, never fed
        assert len(never.fed) == 7 and all(len(row) == 7 for row in never.fed[-1])
        never.fed.clear()


def test_eos_none_runs_every_sequence_to_max_len():
    model = Scripted(CLASSIC)
    (hyp,) = beam_search(model, model.begin_decoding(), BOS, None, 3, beam_size=2, length_penalty=0.0)
    assert len(hyp.tokens) == 3 and not hyp.ended
    # no token ends a sequence, id 2 included: a wide beam keeps all |V|^2 pairs
    (hyps,) = beam_search(model, model.begin_decoding(), BOS, None, 2, beam_size=V**2, n_best=V**2)
    assert sorted(h.tokens for h in hyps) == [[a, b] for a in range(V) for b in range(V)]


def test_done_examples_leave_the_batch():
    """Example 0 ends at once; examples 1 and 2 go on: the later steps feed only their rows."""
    table = {
        (0, ()): (0.01, 0.01, 0.9, 0.04, 0.04),
        (0, (A,)): (0.01, 0.01, 0.9, 0.04, 0.04),
        (0, (B,)): (0.01, 0.01, 0.9, 0.04, 0.04),
    }
    for e in (1, 2):
        table[(e, ())] = (0.01, 0.01, 0.08, 0.5, 0.4)
    model = Scripted(table, default=(0.05, 0.05, 0.02, 0.5, 0.38))
    found = greedy(model, model.begin_decoding(3), BOS, EOS, 4)
    assert [len(rows) for rows in model.fed] == [3, 2, 2, 2]
    assert model.examples[1:] == [[1, 2]] * 3
    assert found[0].tokens == [] and found[0].ended
    assert found[1].tokens == found[2].tokens == [A, A, A, A]
    model.fed.clear(), model.examples.clear()
    beams = beam_search(model, model.begin_decoding(3), BOS, EOS, 4, beam_size=2)
    # k = 2: example 0 has 1 finished hypothesis after step 1 and 3 after step 2, then leaves
    assert model.examples == [[0, 1, 2], [0, 0, 1, 1, 2, 2], [1, 1, 2, 2], [1, 1, 2, 2]]
    assert beams[0].tokens == [] and beams[0].ended
    for e in (0, 1, 2):  # and each equals the example decoded alone
        alone = Scripted({(0, k[1]): v for k, v in table.items() if k[0] == e}, default=model.default)
        assert beam_search(alone, alone.begin_decoding(), BOS, EOS, 4, beam_size=2)[0] == beams[e]


def test_sampling_draws_from_softmax_of_logits_over_temperature():
    probs = np.array([0.1, 0.05, 0.15, 0.4, 0.3])
    model = Scripted({}, default=tuple(probs))
    n = 20000
    for temperature in (1.0, 0.5):
        mt.manual_seed(0)
        found = sample(model, model.begin_decoding(n), BOS, EOS, 1, temperature)
        tokens = np.array([EOS if h.ended else h.tokens[0] for h in found])
        expected = probs ** (1 / temperature) / (probs ** (1 / temperature)).sum()
        np.testing.assert_allclose(np.bincount(tokens, minlength=V) / n, expected, atol=0.015)
        # the reported score is the model's log-probability, not the perturbed ranking key
        np.testing.assert_allclose([h.log_prob for h in found[:50]], np.log(probs[tokens[:50]]))
    # no temperature: greedy search
    assert sample(model, model.begin_decoding(3), BOS, EOS, 4, 0.0) == greedy(
        model, model.begin_decoding(3), BOS, EOS, 4
    )


# -- batches, attention, the convenience functions ------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_batched_decoding_equals_each_example_alone(kind):
    model = make_model(kind, seed=4)
    for k in (1, 3):
        state, bos, prompt = begin(model, kind)
        together = beam_search(model, state, bos, EOS, 6, beam_size=k, prompt=prompt, n_best=k)
        for b in range(len(SRC)):
            state, bos, prompt = begin(model, kind, slice(b, b + 1))
            (alone,) = beam_search(model, state, bos, EOS, 6, beam_size=k, prompt=prompt, n_best=k)
            assert [(h.tokens, h.ended) for h in alone] == [(h.tokens, h.ended) for h in together[b]]
            np.testing.assert_allclose([h.score for h in alone], [h.score for h in together[b]], rtol=1e-10)


def expected_attention(model, kind, b, hyp):
    """The attention of a full forward pass over the hypothesis, (..., L, K) as documented."""
    fed = hyp.tokens if hyp.ended else hyp.tokens[:-1]  # the last scored token is never fed
    if kind == "lm":
        start = list(PROMPTS[b])
        model(mt.tensor([start + fed]))
        weights = np.stack([w.numpy()[0] for w in model.attention_weights])  # (blks, heads, T, T)
        return weights[:, :, len(start) - 1 :, :]
    model(mt.tensor(SRC[b : b + 1]), mt.tensor([[BOS] + fed]), mt.tensor(SRC_LENS[b : b + 1]))
    if kind == "seq2seq":
        return np.concatenate([w.numpy()[0] for w in model.decoder.attention_weights])  # (L, K)
    return np.stack([w.numpy()[0] for w in model.decoder.attention_weights[1]])  # cross: (blks, heads, L, K)


@pytest.mark.parametrize("kind", KINDS)
def test_attention_weights_of_the_returned_hypotheses(kind):
    model = make_model(kind, seed=6)
    state, bos, prompt = begin(model, kind)
    checked = set()
    for max_len in (6, 2):
        found = beam_search(model, state, bos, EOS, max_len, beam_size=3, prompt=prompt, n_best=3, attention=True)
        for b, hyps in enumerate(found):
            for hyp in hyps:  # not just the best: every hypothesis reads its own back-pointers
                expected = expected_attention(model, kind, b, hyp)
                assert hyp.attention.shape == expected.shape
                assert hyp.attention.shape[-2] == len(hyp.tokens) + hyp.ended  # one row per scored token
                np.testing.assert_allclose(hyp.attention, expected, atol=1e-12)
                checked.add((len(hyp.tokens), hyp.ended))
    # hypotheses of several lengths, ended and cut, were checked
    assert len({n for n, _ in checked}) >= 2 and {e for _, e in checked} == {True, False}
    if kind != "lm":
        assert (found[2][0].attention[..., SRC_LENS[2] :] == 0).all()  # the padding is never attended
    assert beam_search(model, state, bos, EOS, 6, beam_size=3, prompt=prompt)[0].attention is None


def test_step_attention_reads_each_models_layout():
    for kind, shape in [("transformer", (3, 2, 2, 5)), ("seq2seq", (3, 5)), ("lm", (3, 2, 2, 3))]:
        model = make_model(kind)
        state, bos, prompt = begin(model, kind)
        model.decode_step(mt.tensor([[BOS]] * 3 if prompt is None else PROMPTS[:, :1]), state)
        if kind == "lm":
            model.decode_step(mt.tensor(PROMPTS), state)
            shape = (3, 2, 2, 2)
        assert step_attention(model).shape == shape
    assert step_attention(Scripted({})) is None


def vocabs():
    src = Vocab([["a", "b", "c"]])
    tgt = Vocab([["x", "y", "z"]])
    return src, tgt


def test_translate_encodes_the_source_as_the_training_data_do():
    src_vocab, tgt_vocab = vocabs()  # 7 tokens each: <pad> <bos> <eos> <unk> a b c
    mt.manual_seed(6)
    args = (len(src_vocab), 8, 16, 2, 2, 0.3)
    model = nn.EncoderDecoder(
        nn.TransformerEncoder(*args, dtype=mt.float64), nn.TransformerDecoder(*args, dtype=mt.float64)
    )
    sharpen(model.decoder.dense)
    sentences = [["a", "b", "c", "c"], ["b"], ["c", "a"]]
    assert model.training  # dropout 0.3 on: translate must switch it off, and back on after
    found = translate(model, sentences, src_vocab, tgt_vocab, num_steps=6, beam_size=3, max_len=5)
    assert model.training and all(m.training for m in model.modules())
    # by hand: ids + <eos>, <pad> to num_steps, valid_lens = len + 1
    enc_X = [[src_vocab[t] for t in s] + [src_vocab.eos] + [src_vocab.pad] * (5 - len(s)) for s in sentences]
    with mt.no_grad():
        model.eval()
        state = model.begin_decoding(mt.tensor(enc_X), mt.tensor([5, 2, 3]))
        expected = beam_search(model, state, tgt_vocab.bos, tgt_vocab.eos, 5, beam_size=3)
    for got, want in zip(found, expected, strict=True):
        assert got.tokens == tgt_vocab.to_tokens(want.tokens) and got.score == pytest.approx(want.score, rel=1e-12)
    one = translate(model, sentences[1], src_vocab, tgt_vocab, num_steps=6, beam_size=3, max_len=5)
    assert isinstance(one, Hypothesis) and one.tokens == found[1].tokens
    # and the result does not depend on which other sentences share the batch (to the last bits
    # of the scores, which BLAS may round differently for a row in another place of the batch)
    reversed_batch = translate(model, sentences[::-1], src_vocab, tgt_vocab, 6, 3, max_len=5)[::-1]
    for got, want in zip(reversed_batch, found, strict=True):
        assert got.tokens == want.tokens and got.score == pytest.approx(want.score, rel=1e-12)
    with pytest.raises(TypeError, match="list"):
        translate(model, "a b", src_vocab, tgt_vocab, 6)


def test_translate_with_the_bahdanau_model():
    src_vocab, tgt_vocab = vocabs()
    mt.manual_seed(7)
    model = nn.Seq2Seq(
        nn.Seq2SeqEncoder(len(src_vocab), 4, 8, 2, dtype=mt.float64),
        nn.Seq2SeqAttentionDecoder(len(tgt_vocab), 4, 8, 2, dtype=mt.float64),
    )
    sharpen(model.decoder.dense)
    found = translate(model, ["a", "b"], src_vocab, tgt_vocab, num_steps=5, beam_size=2, attention=True)
    state = model.begin_decoding(mt.tensor([[4, 5, 2, 0, 0]]), mt.tensor([3]))
    (expected,) = beam_search(model, state, tgt_vocab.bos, tgt_vocab.eos, 5, beam_size=2, attention=True)
    assert found.tokens == tgt_vocab.to_tokens(expected.tokens)
    np.testing.assert_allclose(found.attention, expected.attention)
    assert found.attention.shape == (len(found.tokens) + found.ended, 5)


def test_generate_continues_a_prompt():
    vocab = Vocab(list("ab"))  # <pad> <bos> <eos> <unk> a b: 6 tokens
    mt.manual_seed(8)
    lm = nn.TransformerLM(len(vocab), 8, 16, 2, 2, 0.0, dtype=mt.float64, max_len=30).eval()
    sharpen(lm.decoder.dense)
    out = generate(lm, list("abba"), vocab, 6)
    assert out.tokens[:4] == list("abba") and 4 < len(out.tokens) <= 10
    # the continuation is greedy search from the prompt, recomputed from scratch
    seq = vocab[list("abba")]
    for _ in range(6):
        token = int(np.argmax(lm(mt.tensor([seq])).numpy()[0, -1]))
        if token == vocab.eos:
            break
        seq.append(token)
    assert out.tokens == vocab.to_tokens(seq)
    # a batch of prompts, beam search, sampling (seeded), an empty prompt (starts at <bos>)
    batch = generate(lm, [list("ab"), list("ba")], vocab, 5, beam_size=3)
    assert [b.tokens[:2] for b in batch] == [list("ab"), list("ba")]
    assert batch[0] == generate(lm, list("ab"), vocab, 5, beam_size=3)
    mt.manual_seed(9)
    first = generate(lm, list("ab"), vocab, 8, temperature=1.5)
    mt.manual_seed(9)
    assert generate(lm, list("ab"), vocab, 8, temperature=1.5) == first
    assert generate(lm, [], vocab, 3).tokens[:0] == [] and len(generate(lm, [], vocab, 3).tokens) <= 3
    with pytest.raises(ValueError, match="different lengths"):
        generate(lm, [list("ab"), list("a")], vocab, 3)
    with pytest.raises(ValueError, match="beam_size must be 1"):
        generate(lm, list("ab"), vocab, 3, beam_size=2, temperature=1.0)


def test_a_model_that_cannot_decode_or_a_larger_vocabulary_is_named_before_the_model_runs():
    vocab = Vocab(list("ab"))  # 6 tokens
    with pytest.raises(TypeError, match="generate: a Linear cannot decode, it has no begin_decoding, decode_step"):
        generate(nn.Linear(2, 2), list("ab"), vocab, 3)
    small = nn.TransformerLM(5, 8, 16, 2, 1, 0.0)
    with pytest.raises(
        ValueError, match="generate: the vocabulary has 6 tokens, more than the 5 that the model embeds"
    ):
        generate(small, list("ab"), vocab, 3)
    src_vocab, tgt_vocab = vocabs()  # 7 tokens each
    args = (len(src_vocab) - 1, 8, 16, 2, 1, 0.0)
    model = nn.EncoderDecoder(nn.TransformerEncoder(*args), nn.TransformerDecoder(len(tgt_vocab), *args[1:]))
    with pytest.raises(ValueError, match="translate: the source vocabulary has 7 tokens, more than the 6"):
        translate(model, ["a"], src_vocab, tgt_vocab, 4)
    with pytest.raises(TypeError, match="translate: a TransformerEncoder cannot decode"):
        translate(model.encoder, ["a"], src_vocab, tgt_vocab, 4)
    # ids in place of tokens: each would have been read as <unk>
    with pytest.raises(TypeError, match=r"generate: 4 is not a token of the vocabulary; give tokens, not their ids"):
        generate(nn.TransformerLM(len(vocab), 8, 16, 2, 1, 0.0), [4, 5], vocab, 3)
    fits = nn.EncoderDecoder(nn.TransformerEncoder(len(src_vocab), *args[1:]), model.decoder)
    with pytest.raises(TypeError, match=r"translate: 5 is not a token of the vocabulary"):
        translate(fits, [["a"], [5]], src_vocab, tgt_vocab, 4)


def test_the_model_runs_on_its_own_device():
    """On the "strict" device (arrays that refuse silent conversion to NumPy, as CuPy's do)
    decoding feeds tokens to the device and reads log-probabilities back explicitly."""
    cpu, strict = make_model("transformer", seed=10), make_model("transformer", seed=10, device="strict")
    found = {}
    for name, model, device in [("cpu", cpu, "cpu"), ("strict", strict, "strict")]:
        state, bos, _ = begin(model, "transformer", device=device)
        found[name] = beam_search(model, state, bos, EOS, 5, beam_size=3, attention=True)
    for a, b in zip(found["cpu"], found["strict"]):
        assert (a.tokens, a.ended) == (b.tokens, b.ended) and a.score == pytest.approx(b.score, rel=1e-12)
        np.testing.assert_allclose(a.attention, b.attention, atol=1e-12)


def test_clear_errors():
    model = make_model("lm")
    state = model.begin_decoding()
    with pytest.raises(ValueError, match="beam_size"):
        beam_search(model, state, BOS, EOS, 3, beam_size=0)
    with pytest.raises(ValueError, match="max_len"):
        greedy(model, state, BOS, EOS, 0)
    with pytest.raises(ValueError, match="different lengths"):
        greedy(model, state, None, EOS, 3, prompt=[[A, B], [A]])
    with pytest.raises(ValueError, match="nothing to start"):
        greedy(model, state, None, EOS, 3)
    with pytest.raises(ValueError, match="rows"):
        greedy(model, state, BOS, EOS, 3, prompt=[[A], [B]], batch_size=3)


def test_a_confident_beam_does_not_stop_on_unlikely_early_endings():
    """The likely answer is A A A <eos>; at every step the k - 1 spare slots of the beam end
    early ("<eos>", "A <eos>"). k finished hypotheses alone do not stop the search while the
    likeliest extension is still going (rule 4), so beam search finds what greedy finds."""
    #            pad     bos     eos   A     B
    sure = (0.0025, 0.0025, 0.02, 0.97, 0.005)
    table = {(0, ()): sure, (0, (A,)): sure, (0, (A, A)): sure, (0, (A, A, A)): (0.0025, 0.0025, 0.99, 0.0025, 0.0025)}
    model = Scripted(table, default=(0.04, 0.04, 0.9, 0.01, 0.01))
    (g,) = greedy(model, model.begin_decoding(), BOS, EOS, 8)
    assert (g.tokens, g.ended) == ([A, A, A], True)
    for k in (2, 3):
        found = beam_search(model, model.begin_decoding(), BOS, EOS, 8, beam_size=k, n_best=k + 2)[0]
        assert found[0].tokens == [A, A, A] and found[0].ended
        assert len(found) > k  # the early endings were kept, just not allowed to stop the search
        assert found[0].score > max(h.score for h in found[1:])


def test_pad_and_bos_are_never_generated():
    """<pad> and <bos> are no text: a model that gives them probability must not print them."""
    model = Scripted({}, default=(0.5, 0.3, 0.05, 0.1, 0.05))  # prefers <pad>, then <bos>
    (plain,) = greedy(model, model.begin_decoding(), BOS, EOS, 3)
    assert plain.tokens == [PAD, PAD, PAD]
    for k in (1, 2, 4):
        for hyp in beam_search(model, model.begin_decoding(), BOS, EOS, 3, beam_size=k, n_best=k, forbid=(PAD, BOS))[0]:
            assert not {PAD, BOS} & set(hyp.tokens) and np.isfinite(hyp.score)
    mt.manual_seed(0)
    (drawn,) = sample(model, model.begin_decoding(), BOS, EOS, 20, temperature=2.0, forbid=(PAD, BOS))
    assert not {PAD, BOS} & set(drawn.tokens)
    # generate and translate forbid them by themselves
    vocab = Vocab(list("ab"))
    mt.manual_seed(8)
    lm = nn.TransformerLM(len(vocab), 8, 16, 2, 1, 0.0, max_len=30).eval()
    lm.decoder.dense.bias.data = lm.decoder.dense.bias.data + np.array([9.0, 8.0, 0, 0, 0, 0], dtype=np.float32)
    for temperature in (None, 1.0):
        out = generate(lm, list("ab"), vocab, 6, temperature=temperature).tokens[2:]
        assert out and "<pad>" not in out and "<bos>" not in out
    mt.manual_seed(3)
    seq2seq = make_model("transformer")
    seq2seq.decoder.dense.bias.data = seq2seq.decoder.dense.bias.data + np.array([9.0, 8.0, 0, 0, 0])
    src_vocab, tgt_vocab = Vocab(["x"]), Vocab(["a"])  # V = 5 tokens each, as the model
    hyp = translate(seq2seq, ["x", "x"], src_vocab, tgt_vocab, 5, beam_size=2)
    assert "<pad>" not in hyp.tokens and "<bos>" not in hyp.tokens


class Positions:
    """Wraps a language model and records how many positions each decoding reaches."""

    def __init__(self, lm):
        self.lm, self.reached, self.fed = lm, [], 0

    def __getattr__(self, name):
        return getattr(self.lm, name)

    def begin_decoding(self):
        self.reached.append(0)
        return self.lm.begin_decoding()

    def decode_step(self, tokens, state):
        self.reached[-1] += tokens.shape[1]
        return self.lm.decode_step(tokens, state)


def test_generate_stays_inside_the_window_the_model_was_trained_on():
    vocab = Vocab(list("abc"))
    mt.manual_seed(2)
    lm = Positions(nn.TransformerLM(len(vocab), 8, 16, 2, 1, 0.0, max_len=64).eval())
    out = generate(lm, list("abcab"), vocab, 30, window=8)
    assert out.tokens[:5] == list("abcab") and (len(out.tokens) == 5 + 30 or out.ended)
    assert max(lm.reached) <= 8 and len(lm.reached) > 1
    # inside the window: one piece, the same text as without a window
    lm.reached.clear()
    assert generate(lm, list("ab"), vocab, 6, window=8) == generate(lm, list("ab"), vocab, 6)
    # a prompt longer than the window: only its end is read
    lm.reached.clear()
    long = generate(lm, list("abc" * 10), vocab, 5, window=8)
    assert long.tokens[:30] == list("abc" * 10) and max(lm.reached) <= 8
    mt.manual_seed(0)
    drawn = generate(lm, list("ab"), vocab, 20, temperature=0.7, window=6)
    assert drawn.tokens[:2] == list("ab") and (len(drawn.tokens) == 22 or drawn.ended)
