"""Tab-separated parallel corpora in D2L's English-French format (D2L 10.5).

One example per line: ``source<TAB>target``, optionally followed by more tab-separated
fields (the Tatoeba/ManyThings files add an attribution), which are ignored:

    Go.<TAB>Va !
    I lost.<TAB>J'ai perdu.

Preprocessing follows D2L exactly, so token counts and BLEU scores compare with the book:
non-breaking spaces become spaces, text is lower-cased, a space is inserted before ``, . ! ?``
when the character before is not a space, and tokens are what lies between single spaces.
"""

import os

from ..random import host_rng
from .files import check_limit, open_text

PUNCTUATION = ",.!?"


def preprocess(text):
    """D2L's ``_preprocess``: "Go." -> "go .", "J'ai perdu." -> "j'ai perdu ."."""
    # U+202F (narrow no-break space) is what French typography puts before "!" and "?".
    text = text.replace("\u202f", " ").replace("\xa0", " ")
    # The test looks at the original character before, exactly as D2L's does.
    out = [
        " " + char if i > 0 and char in PUNCTUATION and text[i - 1] != " " else char
        for i, char in enumerate(text.lower())
    ]
    return "".join(out)


def tokenize(text):
    """Split on single spaces, dropping the empty tokens that repeated spaces leave."""
    return [token for token in text.split(" ") if token]


def parse_parallel_lines(lines, max_examples=None):
    """(source tokens, target tokens) pairs from lines of a tab-separated corpus.

    Lines with fewer than two fields (blank lines, a header) are skipped. ``max_examples``
    keeps the first that many pairs. (D2L's loop stops one line late, at ``i > max_examples``;
    here the count is exact.)
    """
    pairs = []
    for line in lines:
        if max_examples is not None and len(pairs) >= max_examples:
            break
        parts = line.rstrip("\r\n").split("\t")
        if len(parts) < 2:
            continue
        src, tgt = tokenize(preprocess(parts[0])), tokenize(preprocess(parts[1]))
        if src and tgt:
            pairs.append((src, tgt))
    return pairs


def read_parallel_corpus(path, max_examples=None, encoding="utf-8"):
    """All (or the first ``max_examples``) (source tokens, target tokens) pairs in a file.

    The file is read as ``files.open_text`` reads it: a missing file, or a byte that is not
    valid ``encoding``, is an error naming the file (and the line). A file without a single
    pair (empty, or not in this format) is an error naming it and its number of lines.
    <eos> is not appended here: ``batching.build_array`` adds it when it builds the arrays.
    """
    check_limit(max_examples, "read_parallel_corpus: max_examples")
    with open_text(path, encoding, what="corpus file") as f:
        pairs = parse_parallel_lines(f, max_examples)
        if not pairs:
            f.seek(0)
            num_lines = sum(1 for _ in f)
            raise ValueError(
                f"{os.fspath(path)}: no sentence pairs in its {num_lines:,} line"
                f"{'' if num_lines == 1 else 's'}; a corpus has one pair a line, "
                "source<TAB>target (the format of D2L's fra-eng file)"
            )
    return pairs


def train_heldout_split(pairs, heldout=0.1, rng=None):
    """``(train, heldout)``: a seeded split of ``pairs`` in which no source sentence is on both
    sides.

    Tatoeba lists one English sentence with several translations; splitting lines at random
    would put "go ." -> "va !" in training and "go ." -> "marche ." in the held-out set, and
    held-out BLEU would partly measure memory. So the distinct *source sentences* are
    shuffled and whole groups go to the held-out set until it holds at least ``heldout``
    examples (a fraction of all pairs when a float, a count when an int). The original order
    is kept within each side.
    """
    rng = host_rng() if rng is None else rng
    target = round(heldout * len(pairs)) if isinstance(heldout, float) else int(heldout)
    if not 0 <= target <= len(pairs):
        raise ValueError(f"train_heldout_split: heldout={heldout!r} does not fit {len(pairs)} pairs")
    groups = {}
    for i, (src, _) in enumerate(pairs):
        groups.setdefault(tuple(src), []).append(i)
    keys = list(groups)  # first-seen order: deterministic before the shuffle
    chosen = set()
    for k in rng.permutation(len(keys)):
        if len(chosen) >= target:
            break
        chosen.update(groups[keys[k]])
    train = [p for i, p in enumerate(pairs) if i not in chosen]
    held = [p for i, p in enumerate(pairs) if i in chosen]
    return train, held
