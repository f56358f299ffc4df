"""Scoring predicted sequences: BLEU (D2L's and the standard corpus BLEU) and exact match.

Sequences are token lists, or strings split on spaces. Read a model's output with
``Vocab.decode`` (stop at <eos>, drop <pad>/<bos>) before scoring it.

Two BLEUs, because they answer different questions:

- ``bleu(pred_seq, label_seq, k)`` is D2L's sentence score (D2L 10.7.6), the number the book
  prints next to each translation ("go . => va !, bleu 1.000"):

      exp(min(0, 1 - len_label / len_pred)) * prod_{n=1..k} p_n ** (1 / 2**n)

  where p_n is the fraction of the prediction's n-grams found in the label, each label n-gram
  matched at most as often as it occurs there ("clipped"). Longer n-grams weigh more
  (1/2**n shrinks p_n's penalty), and the first factor penalises predictions shorter than
  the label, which could otherwise score high precision by saying little.

- ``corpus_bleu(preds, labels)`` is the BLEU of papers (Papineni et al., 2002) in sacrebleu's
  convention: n-gram matches and counts up to 4-grams are summed over the whole corpus
  before dividing, the precisions are combined by a geometric mean, and the brevity penalty
  exp(1 - r / c) (when c < r) uses the total prediction length c and total reference length
  r. It equals ``sacrebleu.corpus_bleu(preds, [labels], tokenize="none").score / 100`` on
  space-separated text (one reference per sentence), and is on a 0-1 scale.
"""

import collections
import math


def _tokens(seq):
    # D2L splits on single spaces; a list of tokens is used as it is.
    return seq.split(" ") if isinstance(seq, str) else list(seq)


def _words(seq):
    # Corpus BLEU splits on any run of whitespace, as sacrebleu does.
    return seq.split() if isinstance(seq, str) else list(seq)


def _ngrams(tokens, n):
    return collections.Counter(tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1))


def bleu(pred_seq, label_seq, k):
    """D2L's BLEU of one predicted sequence against one label, n-grams up to ``k``.

    An empty prediction scores 0 (D2L's formula would divide by zero). n-gram orders longer
    than the prediction are skipped, as in D2L, so a one-token exact answer scores 1.
    """
    pred_tokens, label_tokens = _tokens(pred_seq), _tokens(label_seq)
    len_pred, len_label = len(pred_tokens), len(label_tokens)
    if len_pred == 0:
        return 0.0
    score = math.exp(min(0, 1 - len_label / len_pred))
    for n in range(1, min(k, len_pred) + 1):
        label_counts = _ngrams(label_tokens, n)
        # Each label n-gram can be matched as many times as it occurs in the label: the clip.
        num_matches = sum(min(c, label_counts[g]) for g, c in _ngrams(pred_tokens, n).items())
        score *= math.pow(num_matches / (len_pred - n + 1), math.pow(0.5, n))
    return score


def corpus_bleu(preds, labels, max_n=4, smooth="exp"):
    """Corpus BLEU on a 0-1 scale, as sacrebleu computes it (one reference per prediction).

    ``smooth``: "exp" (sacrebleu's default) replaces a zero count of matching n-grams by
    1 / (2**j * total), j counting the orders with no match so far, so that one missing
    order does not zero the whole score; "none" is Papineni's plain formula (0 then).
    """
    if len(preds) != len(labels):
        raise ValueError(f"corpus_bleu: {len(preds)} predictions but {len(labels)} labels")
    if smooth not in ("exp", "none"):
        raise ValueError(f"corpus_bleu: smooth must be 'exp' or 'none', got {smooth!r}")
    matches, totals = [0] * max_n, [0] * max_n
    pred_len = ref_len = 0
    for pred, label in zip(preds, labels):
        p, r = _words(pred), _words(label)
        pred_len, ref_len = pred_len + len(p), ref_len + len(r)
        for n in range(1, max_n + 1):
            ref_counts = _ngrams(r, n)
            pred_counts = _ngrams(p, n)
            matches[n - 1] += sum(min(c, ref_counts[g]) for g, c in pred_counts.items())
            totals[n - 1] += max(len(p) - n + 1, 0)
    if not any(matches) or any(t == 0 for t in totals):
        # Nothing matches at all, or the predictions are too short to have n-grams of some
        # order: BLEU is 0, smoothing or not (sacrebleu does the same).
        return 0.0
    log_precision, halvings = 0.0, 1
    for m, t in zip(matches, totals):
        if m == 0:
            if smooth == "none":
                return 0.0
            halvings *= 2
            log_precision += math.log(1 / (halvings * t))
        else:
            log_precision += math.log(m / t)
    brevity = 1.0 if pred_len >= ref_len else math.exp(1 - ref_len / pred_len)
    return brevity * math.exp(log_precision / max_n)


def exact_match(preds, labels):
    """The fraction of predictions equal to their label, token for token (0-1 scale)."""
    if len(preds) != len(labels):
        raise ValueError(f"exact_match: {len(preds)} predictions but {len(labels)} labels")
    if not preds:
        raise ValueError("exact_match: no predictions to score")
    return sum(_tokens(p) == _tokens(l) for p, l in zip(preds, labels)) / len(preds)
