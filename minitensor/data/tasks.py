"""Toy sequence-to-sequence tasks, generated on the fly (nothing to download).

Each task returns a list of ``(source tokens, target tokens)`` pairs, the shape
``batching.seq2seq_arrays`` and a translation corpus share. Every random choice draws from
``rng``, which defaults to ``mt.random.host_rng()`` so that ``mt.manual_seed(n)`` fixes the data.

- ``date_task``: "Monday, May 3, 2021" -> "2021-05-03", one character per token. A task where
  attention visibly aligns output digits with input words, small enough to learn on a CPU.
- ``reverse_task``, ``copy_task``, ``sort_task``: classic probes of what a model can route
  from input to output (reversal needs long-range alignment; copy is the identity; sort
  needs the whole input before the first output).
- ``char_lm_corpus``: any text as one long list of character indices, for a language model;
  ``EXAMPLE_TEXT`` is one to start with, and ``unigram_baseline`` the loss to beat.
"""

import datetime
import os

import numpy

from ..random import host_rng
from .files import check_limit, read_text
from .vocab import Vocab

# -- date normalisation ---------------------------------------------------------------------

FIRST_DATE = datetime.date(1950, 1, 1)
LAST_DATE = datetime.date(2049, 12, 31)

# English names are spelled out here rather than taken from ``strftime``, which follows the
# machine's locale: the data must not change from one computer to the next.
MONTHS = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)
WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")


def _ordinal(n):
    """1 -> "1st", 2 -> "2nd", 3 -> "3rd", 11 -> "11th", 22 -> "22nd"."""
    if 11 <= n % 100 <= 13:
        return f"{n}th"
    suffix = {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _yy(d):
    # Two-digit years are unambiguous only because all dates lie in 1950-2049:
    # 50-99 read as 19xx, 00-49 as 20xx.
    return f"{d.year % 100:02d}"


# One convention per separator, so that no string is ambiguous:
#   "/" is month first (US):  05/03/2021, 5/3/21
#   "." is day first (Europe): 3.5.2021, 03.05.21
#   "-" and digits only are year first (ISO 8601): 2021-05-03, 20210503
DATE_FORMATS = {
    "d_month_yyyy": lambda d: f"{d.day} {MONTHS[d.month - 1]} {d.year}",  # 3 May 2021
    "month_d_yyyy": lambda d: f"{MONTHS[d.month - 1]} {d.day}, {d.year}",  # May 3, 2021
    "weekday_month_d_yyyy": lambda d: f"{WEEKDAYS[d.weekday()]}, {MONTHS[d.month - 1]} {d.day}, {d.year}",
    "ordinal_of_month_yyyy": lambda d: f"{_ordinal(d.day)} of {MONTHS[d.month - 1]} {d.year}",  # 3rd of May 2021
    "mon_d_yyyy": lambda d: f"{MONTHS[d.month - 1][:3]} {d.day}, {d.year}",  # Sep 3, 2021
    "lower_d_month_yy": lambda d: f"{d.day} {MONTHS[d.month - 1].lower()} {_yy(d)}",  # 3 may 21
    "upper_month_d_yyyy": lambda d: f"{MONTHS[d.month - 1].upper()} {d.day} {d.year}",  # MAY 3 2021
    "mm/dd/yyyy": lambda d: f"{d.month:02d}/{d.day:02d}/{d.year}",  # 05/03/2021
    "m/d/yy": lambda d: f"{d.month}/{d.day}/{_yy(d)}",  # 5/3/21
    "d.m.yyyy": lambda d: f"{d.day}.{d.month}.{d.year}",  # 3.5.2021
    "dd.mm.yy": lambda d: f"{d.day:02d}.{d.month:02d}.{_yy(d)}",  # 03.05.21
    "iso": lambda d: d.isoformat(),  # 2021-05-03
    "yyyymmdd": lambda d: f"{d.year}{d.month:02d}{d.day:02d}",  # 20210503
}


def format_date(date, fmt):
    """``date`` (a ``datetime.date``) written in the format named ``fmt`` (a DATE_FORMATS key)."""
    if fmt not in DATE_FORMATS:
        raise ValueError(f"unknown date format {fmt!r}; known formats: {list(DATE_FORMATS)}")
    return DATE_FORMATS[fmt](date)


def all_dates():
    """Every calendar date from 1950-01-01 to 2049-12-31 (36,525 of them), in order."""
    n = (LAST_DATE - FIRST_DATE).days + 1
    return [FIRST_DATE + datetime.timedelta(days=i) for i in range(n)]


def date_pairs(dates, rng=None, formats=None):
    """One (source characters, target characters) pair per date, each in a random format."""
    rng = host_rng() if rng is None else rng
    names = list(DATE_FORMATS) if formats is None else list(formats)
    choice = rng.integers(0, len(names), size=len(dates))
    return [(list(format_date(d, names[f])), list(d.isoformat())) for d, f in zip(dates, choice)]


def date_task(num_train, num_heldout=1000, rng=None, formats=None):
    """A training set and a held-out set for date normalisation, ``(train, heldout)``.

    The *calendar dates* are split, not the strings: ``num_heldout`` dates are set aside and
    never appear in training in any format, so held-out accuracy measures whether the model
    learnt to read dates rather than remembered them. The held-out set has one example per
    held-out date; the ``num_train`` training examples draw dates (with replacement, so any
    size works) from the remaining ones.
    """
    rng = host_rng() if rng is None else rng
    dates = all_dates()
    if not 0 <= num_heldout < len(dates):
        raise ValueError(f"date_task: num_heldout must be in [0, {len(dates)}), got {num_heldout}")
    order = rng.permutation(len(dates))
    heldout_dates = [dates[i] for i in order[:num_heldout]]
    train_pool = order[num_heldout:]
    train_dates = [dates[i] for i in rng.choice(train_pool, size=num_train)]
    return date_pairs(train_dates, rng, formats), date_pairs(heldout_dates, rng, formats)


# -- reverse, copy, sort ------------------------------------------------------------------------

DEFAULT_ALPHABET = tuple("abcdefghij")


def _random_sequences(num_examples, min_len, max_len, alphabet, rng):
    if not 1 <= min_len <= max_len:
        raise ValueError(f"need 1 <= min_len <= max_len, got min_len={min_len}, max_len={max_len}")
    rng = host_rng() if rng is None else rng
    lengths = rng.integers(min_len, max_len + 1, size=num_examples)
    return [[alphabet[i] for i in rng.integers(0, len(alphabet), size=n)] for n in lengths]


def reverse_task(num_examples, min_len=1, max_len=10, alphabet=DEFAULT_ALPHABET, rng=None):
    """a b c -> c b a. Lengths uniform in [min_len, max_len]."""
    return [(s, s[::-1]) for s in _random_sequences(num_examples, min_len, max_len, alphabet, rng)]


def copy_task(num_examples, min_len=1, max_len=10, alphabet=DEFAULT_ALPHABET, rng=None):
    """a b c -> a b c."""
    return [(s, list(s)) for s in _random_sequences(num_examples, min_len, max_len, alphabet, rng)]


def sort_task(num_examples, min_len=1, max_len=10, alphabet=DEFAULT_ALPHABET, rng=None):
    """c a b -> a b c, in the order of ``alphabet`` (so "10" may follow "9" if listed so)."""
    rank = {token: i for i, token in enumerate(alphabet)}
    seqs = _random_sequences(num_examples, min_len, max_len, alphabet, rng)
    return [(s, sorted(s, key=rank.__getitem__)) for s in seqs]


# -- character language model --------------------------------------------------------------------

# The example text: H. G. Wells' "The Time Machine", the novel D2L's language models read
# (D2L 9.2; zh 8.2), public domain; texts/README.md gives its source.
_TEXTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "texts")
TEXTS = {
    "time_machine": os.path.join(_TEXTS_DIR, "time_machine.txt"),
    # nanoGPT's shakespeare_char: what `minitensor train --preset gpt-char` trains on
    "tinyshakespeare": os.path.join(_TEXTS_DIR, "tinyshakespeare.txt"),
}
EXAMPLE_TEXT = TEXTS["time_machine"]


def char_lm_corpus(path=None, vocab=None, max_chars=None, encoding="utf-8", *, text=None, special_tokens=True):
    """``(corpus, vocab)`` for a character-level language model, as D2L's ``build`` returns.

        corpus, vocab = char_lm_corpus("notes.txt")          # a file
        corpus, vocab = char_lm_corpus(text="To be, or not")  # a string

    ``path`` (a str or ``os.PathLike``) must name an existing file, read as ``files.read_text``
    reads it (a missing file or an undecodable byte is an error naming the file); a string is
    never taken for the text itself: that is what ``text=`` is for. ``max_chars`` keeps the
    first that many characters. Every character is a token, spaces and newlines included;
    nothing is lower-cased or removed, so any text works. ``corpus`` is a list of indices into
    ``vocab`` (built from the text unless given). ``batching.lm_arrays`` cuts it into (input,
    next-character) windows.

    ``special_tokens=False``: the vocabulary is the text's characters alone, in sorted order (as
    nanoGPT's ``sorted(set(text))``), without <pad>, <bos>, <eos> and <unk>: a text LM reads no
    padding and needs no start or end token when it continues a prompt.
    """
    if (path is None) == (text is None):
        raise TypeError(
            "char_lm_corpus: give the path of a text file, or the text itself as text=... "
            f"(got {'both' if text is not None else 'neither'})"
        )
    check_limit(max_chars, "char_lm_corpus: max_chars")
    if path is not None:
        text, source = read_text(path, encoding, max_chars, what="text file"), f"{os.fspath(path)}:"
    elif isinstance(text, str):
        text, source = text[:max_chars], "char_lm_corpus: text= has"
    else:
        raise TypeError(f"char_lm_corpus: text must be a str, got {type(text).__name__}")
    # one character to read and the next to predict: the smallest corpus with one example
    if len(text) < 2:
        raise ValueError(
            f"{source} {len(text)} character{'' if len(text) == 1 else 's'}; a language model "
            "needs at least 2 (one to read, the next to predict)"
        )
    tokens = list(text)
    if vocab is None and not special_tokens:
        vocab = Vocab.from_dict({"idx_to_token": sorted(set(tokens)), "reserved_tokens": []})
    elif vocab is None:
        vocab = Vocab(tokens)
    return vocab[tokens], vocab


def unigram_baseline(train, heldout, vocab_size):
    """The held-out loss of a model that ignores context: the cross-entropy of the held-out
    tokens under the training set's token frequencies, add-one smoothed, in nats per token
    (the units of ``cross_entropy``, hence of a language model's loss).

        p(c) = (count of c in train + 1) / (len(train) + V)
        baseline = -(1 / len(heldout)) * sum over t of ln p(heldout[t])

    ``train``, ``heldout``: token indices (lists or arrays), e.g. the two parts of a
    ``char_lm_corpus``; ``vocab_size`` V: the number of outcomes the model chooses among,
    ``len(vocab)`` with the reserved tokens, so that both spread probability over the same
    outcomes. Adding one to every count gives a character never seen in training a small
    probability instead of 0, and the baseline stays finite. Only a model that uses the
    context beats this number: on ``EXAMPLE_TEXT`` split 90/10 it is 3.08 nats per character,
    against ln 74 = 4.30 for a uniform guess over its 74 tokens.
    """
    if not isinstance(vocab_size, (int, numpy.integer)) or vocab_size < 1:
        raise ValueError(f"unigram_baseline: vocab_size must be a positive integer, got {vocab_size!r}")
    train = numpy.asarray(train, dtype=numpy.int64).ravel()
    heldout = numpy.asarray(heldout, dtype=numpy.int64).ravel()
    if len(heldout) == 0:
        raise ValueError("unigram_baseline: the held-out set is empty")
    for name, ids in (("train", train), ("heldout", heldout)):
        outside = ids[(ids < 0) | (ids >= vocab_size)]
        if len(outside):
            raise ValueError(
                f"unigram_baseline: {name} holds index {int(outside[0])}, outside a vocabulary "
                f"of {vocab_size} (indices 0 to {vocab_size - 1})"
            )
    counts = numpy.bincount(train, minlength=vocab_size)
    log_p = numpy.log(counts + 1.0) - numpy.log(len(train) + vocab_size)
    return float(-log_p[heldout].mean())


def max_lengths(pairs):
    """(longest source, longest target) in tokens: a guide for choosing ``num_steps``."""
    return max(len(s) for s, _ in pairs), max(len(t) for _, t in pairs)


__all__ = [
    "DATE_FORMATS",
    "EXAMPLE_TEXT",
    "MONTHS",
    "TEXTS",
    "WEEKDAYS",
    "all_dates",
    "char_lm_corpus",
    "copy_task",
    "date_pairs",
    "date_task",
    "format_date",
    "max_lengths",
    "reverse_task",
    "sort_task",
    "unigram_baseline",
]
