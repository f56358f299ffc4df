"""minitensor.metrics: D2L's BLEU, corpus BLEU (against sacrebleu when installed), exact match."""

import math

import numpy as np
import pytest

from minitensor.metrics import bleu, corpus_bleu, exact_match

# -- D2L's bleu(pred_seq, label_seq, k) ---------------------------------------------------------------


@pytest.mark.parametrize(
    "pred, label",
    [
        # Translations D2L's Transformer chapter prints with "bleu 1.000".
        ("va !", "va !"),
        ("j'ai perdu .", "j'ai perdu ."),
        ("il est calme .", "il est calme ."),
        ("je suis chez moi .", "je suis chez moi ."),
    ],
)
def test_d2l_book_exact_translations_score_one(pred, label):
    assert f"{bleu(pred, label, k=2):.3f}" == "1.000"


def test_d2l_book_partial_translation():
    # "he's calm . => il est paresseux ., bleu 0.658": 3 of 4 words match (p1 = 3/4) and of
    # the bigrams "il est", "est paresseux", "paresseux ." only "il est" does (p2 = 1/3).
    # Equal lengths: no brevity penalty. 0.75**0.5 * (1/3)**0.25 = 0.658.
    score = bleu("il est paresseux .", "il est calme .", k=2)
    assert score == pytest.approx(0.75**0.5 * (1 / 3) ** 0.25)
    assert f"{score:.3f}" == "0.658"


def test_d2l_book_translation_without_a_matching_bigram_scores_zero():
    # D2L's RNN chapter: "he's calm . => il court ., bleu 0.000" (no bigram matches).
    assert bleu("il court .", "il est calme .", k=2) == 0.0


def test_brevity_penalty_for_short_predictions():
    # pred 2 tokens, label 4: exp(1 - 4/2) = e^-1; every n-gram of the prediction matches.
    assert bleu("il est", "il est calme .", k=2) == pytest.approx(math.exp(-1))
    # a longer prediction is not penalised for length, only through its precisions
    assert bleu("a b c d", "a b", k=2) == pytest.approx((2 / 4) ** 0.5 * (1 / 3) ** 0.25)


def test_clipped_counts():
    # "le" occurs once in the label, so only one of the four "le" counts: p1 = 1/4.
    assert bleu("le le le le", "le chat", k=1) == pytest.approx(0.25**0.5)
    # Twice in the label: two of four count (and the prediction is the longer: no penalty).
    assert bleu("le le le le", "le le chat", k=1) == pytest.approx(0.5**0.5)


def test_hand_computed_three_gram_case():
    # label "the cat sat on the mat" (6), pred "the cat on the mat" (5), k=3:
    # BP = exp(1 - 6/5); p1 = 5/5; bigrams: the cat, cat on, on the, the mat -> 3/4 match
    # ("cat on" does not); trigrams: the cat on, cat on the, on the mat -> 1/3.
    expected = math.exp(1 - 6 / 5) * 1.0**0.5 * (3 / 4) ** 0.25 * (1 / 3) ** 0.125
    assert bleu("the cat on the mat", "the cat sat on the mat", k=3) == pytest.approx(expected)


def test_bleu_edge_cases_and_token_lists():
    assert bleu("va !", "va !", k=4) == 1.0  # orders longer than the prediction are skipped
    assert bleu("", "va !", k=2) == 0.0 and bleu([], ["va", "!"], k=2) == 0.0
    assert bleu(["il", "est", "paresseux", "."], ["il", "est", "calme", "."], 2) == bleu(
        "il est paresseux .", "il est calme .", 2
    )


# -- corpus BLEU ------------------------------------------------------------------------------------------


def test_corpus_bleu_hand_computed():
    assert corpus_bleu(["a b c d e"], ["a b c d e"]) == pytest.approx(1.0)
    # every n-gram matches; only the brevity penalty, on the corpus totals c=5, r=6
    assert corpus_bleu(["a b c d e"], ["a b c d e f"]) == pytest.approx(math.exp(1 - 6 / 5))
    # counts are summed over sentences before dividing, not averaged per sentence:
    # sentence 1 (perfect, 5 tokens) + sentence 2 "x y z w" vs "x y z q":
    # p1 = (5+3)/(5+4), p2 = (4+2)/(4+3), p3 = (3+1)/(3+2), p4 = (2+0)/(2+1); c = r = 9
    preds, labels = ["a b c d e", "x y z w"], ["a b c d e", "x y z q"]
    expected = (8 / 9 * 6 / 7 * 4 / 5 * 2 / 3) ** 0.25
    assert corpus_bleu(preds, labels) == pytest.approx(expected)
    assert corpus_bleu([s.split() for s in preds], [s.split() for s in labels]) == pytest.approx(expected)


def test_corpus_bleu_smoothing_and_zero_cases():
    # no 4-gram matches: plain BLEU is 0; sacrebleu's "exp" smoothing counts 1/(2 * total)
    preds, labels = ["a b c x e"], ["a b c d e"]
    assert corpus_bleu(preds, labels, smooth="none") == 0.0
    # p1 = 4/5, p2 = 2/4, p3 = 1/3, p4 -> 1 / (2 * 2)
    assert corpus_bleu(preds, labels) == pytest.approx((4 / 5 * 2 / 4 * 1 / 3 * 1 / 4) ** 0.25)
    assert corpus_bleu(["x y z"], ["a b c"]) == 0.0  # nothing matches
    assert corpus_bleu(["a b"], ["a b"]) == 0.0  # too short to have 3-grams or 4-grams
    with pytest.raises(ValueError, match="2 predictions but 1 labels"):
        corpus_bleu(["a", "b"], ["a"])


def random_corpus(rng, n, vocab_size, max_len):
    words = [f"w{i}" for i in range(vocab_size)]
    return [" ".join(rng.choice(words, size=rng.integers(1, max_len + 1))) for _ in range(n)]


@pytest.mark.parametrize("smooth", ["exp", "none"])
def test_corpus_bleu_equals_sacrebleu(smooth):
    sacrebleu = pytest.importorskip("sacrebleu")
    rng = np.random.default_rng(0)
    cases = [(["il est paresseux .", "le chat dort sur le tapis"], ["il est calme .", "le chat est sur le tapis"])]
    for _ in range(60):
        n, vocab_size, max_len = rng.integers(1, 8), rng.integers(2, 8), rng.integers(1, 12)
        labels = random_corpus(rng, n, vocab_size, max_len)
        # predictions: partly copied from the labels, so that long n-grams match sometimes
        preds = [lab if rng.random() < 0.3 else p for lab, p in zip(labels, random_corpus(rng, n, vocab_size, max_len))]
        cases.append((preds, labels))
    for preds, labels in cases:
        ours = corpus_bleu(preds, labels, smooth=smooth)
        theirs = sacrebleu.corpus_bleu(preds, [labels], tokenize="none", smooth_method=smooth).score / 100
        assert ours == pytest.approx(theirs, rel=1e-9, abs=1e-12), (preds, labels)
    # sacrebleu's defaults are our defaults
    preds, labels = cases[0]
    assert corpus_bleu(preds, labels) == pytest.approx(
        sacrebleu.corpus_bleu(preds, [labels], tokenize="none").score / 100
    )


# -- exact match ----------------------------------------------------------------------------------------


def test_exact_match():
    assert exact_match(["2021-05-03", "1999-12-31"], ["2021-05-03", "1999-12-30"]) == 0.5
    assert exact_match([["a", "b"]], [["a", "b"]]) == 1.0
    assert exact_match([["a", "b"]], [["a", "b", "c"]]) == 0.0
    assert exact_match(["va !"], [["va", "!"]]) == 1.0  # a string is its space-separated tokens
    with pytest.raises(ValueError):
        exact_match(["a"], [])
    with pytest.raises(ValueError):
        exact_match([], [])
