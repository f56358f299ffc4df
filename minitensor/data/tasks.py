"""Toy sequence-to-sequence tasks, generated on the fly (nothing to download).

Each task returns a list of ``(source tokens, target tokens)`` pairs, the shape
``batching.seq2seq_arrays`` and a translation corpus share. Every random choice draws from
``rng``, which defaults to ``mt.random.host_rng()`` so that ``mt.manual_seed(n)`` fixes the data.

- ``date_task``: "Monday, May 3, 2021" -> "2021-05-03", one character per token. A task where
  attention visibly aligns output digits with input words, small enough to learn on a CPU.
- ``reverse_task``, ``copy_task``, ``sort_task``: classic probes of what a model can route
  from input to output (reversal needs long-range alignment; copy is the identity; sort
  needs the whole input before the first output).
- ``char_lm_corpus``: any text as one long list of character indices, for a language model.
"""

import datetime
import os

from ..random import host_rng
from .vocab import Vocab

# -- date normalisation ---------------------------------------------------------------------

FIRST_DATE = datetime.date(1950, 1, 1)
LAST_DATE = datetime.date(2049, 12, 31)

# English names are spelled out here rather than taken from ``strftime``, which follows the
# machine's locale: the data must not change from one computer to the next.
MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August",
          "September", "October", "November", "December")
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
    "d_month_yyyy": lambda d: f"{d.day} {MONTHS[d.month - 1]} {d.year}",                 # 3 May 2021
    "month_d_yyyy": lambda d: f"{MONTHS[d.month - 1]} {d.day}, {d.year}",                # May 3, 2021
    "weekday_month_d_yyyy": lambda d: f"{WEEKDAYS[d.weekday()]}, {MONTHS[d.month - 1]} {d.day}, {d.year}",
    "ordinal_of_month_yyyy": lambda d: f"{_ordinal(d.day)} of {MONTHS[d.month - 1]} {d.year}",  # 3rd of May 2021
    "mon_d_yyyy": lambda d: f"{MONTHS[d.month - 1][:3]} {d.day}, {d.year}",              # Sep 3, 2021
    "lower_d_month_yy": lambda d: f"{d.day} {MONTHS[d.month - 1].lower()} {_yy(d)}",     # 3 may 21
    "upper_month_d_yyyy": lambda d: f"{MONTHS[d.month - 1].upper()} {d.day} {d.year}",   # MAY 3 2021
    "mm/dd/yyyy": lambda d: f"{d.month:02d}/{d.day:02d}/{d.year}",                      # 05/03/2021
    "m/d/yy": lambda d: f"{d.month}/{d.day}/{_yy(d)}",                                  # 5/3/21
    "d.m.yyyy": lambda d: f"{d.day}.{d.month}.{d.year}",                                # 3.5.2021
    "dd.mm.yy": lambda d: f"{d.day:02d}.{d.month:02d}.{_yy(d)}",                        # 03.05.21
    "iso": lambda d: d.isoformat(),                                                     # 2021-05-03
    "yyyymmdd": lambda d: f"{d.year}{d.month:02d}{d.day:02d}",                          # 20210503
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

def char_lm_corpus(text_or_path, vocab=None, max_chars=None, encoding="utf-8"):
    """``(corpus, vocab)`` for a character-level language model, as D2L's ``build`` returns.

    ``text_or_path``: a ``pathlib.Path`` (always read as a file), or a string, read as a file
    when it names an existing one and as the text itself otherwise. Every character is a
    token, spaces and newlines included; nothing is lower-cased or removed, so any text works.
    ``corpus`` is a list of indices into ``vocab`` (built from the text unless given).
    ``batching.lm_arrays`` cuts it into (input, next-character) windows.
    """
    if isinstance(text_or_path, os.PathLike) or (
        "\n" not in text_or_path and os.path.isfile(text_or_path)
    ):
        with open(text_or_path, encoding=encoding) as f:
            text = f.read() if max_chars is None else f.read(max_chars)
    else:
        text = text_or_path
    if max_chars is not None:
        text = text[:max_chars]
    tokens = list(text)
    if vocab is None:
        vocab = Vocab(tokens)
    return vocab[tokens], vocab


def max_lengths(pairs):
    """(longest source, longest target) in tokens: a guide for choosing ``num_steps``."""
    return max(len(s) for s, _ in pairs), max(len(t) for _, t in pairs)


__all__ = [
    "DATE_FORMATS", "MONTHS", "WEEKDAYS", "all_dates", "char_lm_corpus", "copy_task", "date_pairs",
    "date_task", "format_date", "max_lengths", "reverse_task", "sort_task",
]
