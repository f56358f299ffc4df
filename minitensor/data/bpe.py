"""ByteBPE: a byte-level byte-pair-encoding tokenizer (Sennrich et al. 2016; GPT-2, Radford et al. 2019).

    bpe = ByteBPE.train(text, vocab_size=1024)   # 256 bytes + 768 merges
    ids = bpe.encode("To be, or not to be")      # [..., 263, ...]: ints below vocab_size
    bpe.decode(ids)                              # "To be, or not to be"
    bpe.save("tokenizer.json"); ByteBPE.load("tokenizer.json")

**Tokens.** Text is UTF-8 bytes; tokens 0..255 are the single bytes, so every string (any
language, any emoji) is encodable and nothing is ever <unk>. Token 256 + i is merge i: the
concatenation of the two tokens of ``merges[i]``.

**Training** (Sennrich et al.'s algorithm): start from bytes; count every adjacent pair of
tokens in the text; merge the most frequent pair everywhere into a new token; repeat until the
vocabulary has ``vocab_size`` tokens (or no pair occurs ``min_frequency`` times).

**Chunks** (GPT-2's pre-tokenisation). The text is first cut into chunks by ``PATTERN``: a word
with the space before it (" the"), a run of digits, a run of punctuation, a run of spaces, and
English contractions ("'s", "'ll"). Pairs are counted inside chunks only, so no merge crosses a
chunk boundary: " the" becomes one token, "the." never does, and the vocabulary is spent on
words rather than on word-punctuation combinations.

**Why it is fast.** The naive loop re-counts the whole text after each merge: merges x text
length. Two observations make it cheap:

1. *Word counts.* Identical chunks tokenize identically, so the text is reduced to its distinct
   chunks with their counts (tinyshakespeare: 1.1 MB, ~298,000 chunks, ~15,000 distinct). A
   pair's count is the sum, over the chunks holding it, of the chunk's count times how often
   it occurs in it.
2. *Incremental counts.* A merge of (a, b) changes only the chunks that hold a next to b. For
   those alone, their pairs' counts are taken out, the merge is applied, and the new pairs'
   counts are put in; an index ``pair -> chunks that hold it`` finds them. The most frequent
   pair comes from a heap whose stale entries (a count that has since changed) are skipped
   when popped, so each merge costs about the size of the chunks it touches. (tinyshakespeare at
   1,024 tokens: about 0.6 s on one core, where the naive loop re-counts 1.1 million bytes 768 times.)

**Ties** (pairs of equal count) go to the pair whose first token, then second, comes first in
the order the ``tokenizers`` library numbers tokens: the 256 bytes ordered by their printable
GPT-2 symbol (``byte_to_symbol``: "!" .. "~", then the Latin-1 letters, then the control bytes
and space as "Ā" .. "Ń"), then the merged tokens in the order they were made. With it, this
trainer makes the same merges as ``tokenizers``' ``BpeTrainer`` (tests/test_bpe.py checks).

**Encoding** a chunk applies the learned merges in the order they were learned: repeatedly,
the adjacent pair with the earliest merge is merged, until no pair has a merge. **Decoding**
concatenates the tokens' bytes and decodes UTF-8 once at the end (``errors="replace"``): a
multi-byte character split across tokens is whole again, and ``decode(encode(s)) == s`` for
every string. Only a sequence of ids that does not form UTF-8 (a model's sample may stop mid-
character) shows U+FFFD; ``decode_bytes`` gives the exact bytes.

**The pattern, and the one difference from GPT-2's.** GPT-2's regex uses ``\\p{L}`` (letters) and
``\\p{N}`` (numbers), which Python's ``re`` lacks. Here letters are ``[^\\W\\d_]`` and numbers
``\\d``: the same on ASCII and on the letters and decimal digits of every script; they differ on
the rare numeric characters that are not decimal digits ("²", "½", "Ⅻ": a "number" to GPT-2, a
"letter" here), and on the control characters U+001C..U+001F, which Python's ``\\s`` counts as
space and GPT-2's does not. No dependency (the ``regex`` module) is needed for that.
"""

import functools
import heapq
import json
import os
import re
from collections import Counter, defaultdict

from ..atomic import write_atomic

NUM_BYTES = 256

# GPT-2's pre-tokenisation regex, spelled for Python's re (see the module docstring).
PATTERN = re.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?[^\W\d_]+| ?\d+| ?(?:[^\s\w]|_)+|\s+(?!\S)|\s+""")

FORMAT = "minitensor.ByteBPE"
VERSION = 1


def byte_to_symbol():
    """GPT-2's table ``{byte: printable character}``: bytes that are printable Latin-1 stand for
    themselves; the others (controls, space, soft hyphen) get U+0100 onwards, in byte order.
    Only used to show tokens ("Ġthe" is " the") and to number bytes as ``tokenizers`` does."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(NUM_BYTES):
        if b not in table:
            table[b] = chr(NUM_BYTES + extra)
            extra += 1
    return table


def chunks(data):
    """The pieces ``PATTERN`` cuts ``data`` (bytes) into; they concatenate back to ``data``.
    Bytes that are not UTF-8 are kept (as surrogate escapes while matching) and form chunks of
    punctuation, so any byte string can be cut."""
    text = data.decode("utf-8", errors="surrogateescape")
    return [m.group().encode("utf-8", errors="surrogateescape") for m in PATTERN.finditer(text)]


def _merge(word, pair, new):
    """``word`` (a list of token ids) with each occurrence of ``pair``, left to right, replaced
    by ``new``: [a, a, a] with (a, a) -> [aa, a]."""
    out, i = [], 0
    while i < len(word):
        if i + 1 < len(word) and word[i] == pair[0] and word[i + 1] == pair[1]:
            out.append(new)
            i += 2
        else:
            out.append(word[i])
            i += 1
    return out


@functools.cache
def _symbol_to_byte():
    """``byte_to_symbol``'s inverse, built once: decoding reads it for every token."""
    return {s: b for b, s in byte_to_symbol().items()}


def symbols_to_text(symbols):
    """The text of tokens written as ``ByteBPE.token_symbols`` writes them ("Ġthe" -> " the"),
    decoded from UTF-8 once at the end; characters outside the table (a Vocab's "<eos>" is all
    printable, so it never happens for a model's tokens) are taken as their UTF-8 bytes."""
    to_byte = _symbol_to_byte()
    data = b"".join(bytes([to_byte[c]]) if c in to_byte else c.encode() for token in symbols for c in token)
    return data.decode("utf-8", errors="replace")


def symbol_text(symbol):
    """One token's text, for a label ("Ġthe" -> " the"); a token holding part of a multi-byte
    character has no text of its own and keeps its symbols."""
    to_byte = _symbol_to_byte()
    try:
        return bytes(to_byte[c] for c in symbol).decode("utf-8")
    except (KeyError, UnicodeDecodeError):
        return symbol


class ByteBPE:
    """A byte-level BPE tokenizer: ``merges[i] = (a, b)`` made token ``256 + i``.

    Build one with ``ByteBPE.train(text, vocab_size)`` or ``ByteBPE.load(path)``;
    ``ByteBPE(merges)`` takes a list of pairs (each token defined before it is used)."""

    def __init__(self, merges=()):
        self.merges = [tuple(pair) for pair in merges]
        self.vocab = [bytes([b]) for b in range(NUM_BYTES)]  # token id -> its bytes
        for i, (a, b) in enumerate(self.merges):
            if not (0 <= a < len(self.vocab) and 0 <= b < len(self.vocab)):
                raise ValueError(f"ByteBPE: merges[{i}] = {(a, b)} uses a token not defined before it")
            self.vocab.append(self.vocab[a] + self.vocab[b])
        self.ranks = {pair: i for i, pair in enumerate(self.merges)}  # pair -> when it was learned
        self._cache = {}  # chunk -> ids: text repeats its words

    def __len__(self):
        """The vocabulary size: 256 bytes plus one token per merge."""
        return len(self.vocab)

    def __repr__(self):
        return f"ByteBPE(vocab_size={len(self)}, merges={len(self.merges)})"

    # -- training -------------------------------------------------------------------------------
    @classmethod
    def train(cls, text, vocab_size, min_frequency=2):
        """Learn ``vocab_size - 256`` merges from ``text`` (a str, or bytes). Fewer when no pair
        occurs ``min_frequency`` times any more (a merge seen once compresses nothing it will
        see again; the ``tokenizers`` library's default, 0, merges to the end)."""
        if not isinstance(vocab_size, int) or vocab_size < NUM_BYTES:
            raise ValueError(f"ByteBPE.train: vocab_size must be an int of at least {NUM_BYTES}, got {vocab_size!r}")
        data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        # 1. word counts: the distinct chunks, each a list of byte ids, and how often each occurs
        counted = Counter(chunks(data))
        words = [list(chunk) for chunk in counted]
        freqs = list(counted.values())
        # 2. pair counts over all chunks, and which chunks hold each pair
        pair_counts = Counter()
        where = defaultdict(set)
        for w, word in enumerate(words):
            for pair in zip(word, word[1:]):
                pair_counts[pair] += freqs[w]
                where[pair].add(w)
        # the tie-break: the order tokenizers numbers tokens (bytes by symbol, then merges)
        symbol = byte_to_symbol()
        order = {b: ord(symbol[b]) for b in range(NUM_BYTES)}  # below 512: before any merge

        def entry(pair):  # the heap's smallest entry is the most frequent pair, ties as documented
            return (-pair_counts[pair], order[pair[0]], order[pair[1]], pair)

        heap = [entry(pair) for pair in pair_counts]
        heapq.heapify(heap)
        merges = []
        while NUM_BYTES + len(merges) < vocab_size and heap:
            neg_count, _, _, pair = heapq.heappop(heap)
            if -neg_count != pair_counts.get(pair, 0):
                continue  # stale: this pair's count changed after the entry was pushed
            if -neg_count < max(min_frequency, 1):
                break
            new = NUM_BYTES + len(merges)
            merges.append(pair)
            order[new] = 1000 + len(merges)
            # 3. the chunks holding the pair: take their pairs out, merge, put the new pairs in
            changed = set()
            for w in where.pop(pair):
                word, freq = words[w], freqs[w]
                merged = _merge(word, pair, new)
                if len(merged) == len(word):
                    continue  # the pair was merged away inside this chunk by an earlier merge
                for p in zip(word, word[1:]):
                    pair_counts[p] -= freq
                    changed.add(p)
                for p in zip(merged, merged[1:]):
                    pair_counts[p] += freq
                    where[p].add(w)
                    changed.add(p)
                words[w] = merged
            pair_counts.pop(pair, None)
            for p in changed:
                if pair_counts.get(p, 0) > 0:
                    heapq.heappush(heap, entry(p))
                else:
                    pair_counts.pop(p, None)
        return cls(merges)

    # -- encoding and decoding --------------------------------------------------------------------
    def _encode_chunk(self, chunk):
        word = list(chunk)
        while len(word) > 1:
            # the adjacent pair learned first (the lowest rank) is merged first
            pair = min(zip(word, word[1:]), key=lambda p: self.ranks.get(p, len(self.ranks)))
            if pair not in self.ranks:
                break
            word = _merge(word, pair, NUM_BYTES + self.ranks[pair])
        return word

    def encode_bytes(self, data):
        """Token ids of a byte string (any bytes, UTF-8 or not)."""
        ids = []
        for chunk in chunks(bytes(data)):
            if chunk not in self._cache:
                self._cache[chunk] = self._encode_chunk(chunk)
            ids.extend(self._cache[chunk])
        return ids

    def encode(self, text):
        """Token ids of ``text`` (a str, encoded as UTF-8)."""
        if not isinstance(text, str):
            raise TypeError(f"ByteBPE.encode: text must be a str, got {type(text).__name__} (encode_bytes takes bytes)")
        return self.encode_bytes(text.encode("utf-8"))

    def decode_bytes(self, ids):
        """The bytes of a sequence of token ids: ``decode_bytes(encode_bytes(b)) == b``."""
        ids = [int(i) for i in ids]
        bad = next((i for i in ids if not 0 <= i < len(self.vocab)), None)  # (a negative one would wrap around)
        if bad is not None:
            raise ValueError(
                f"ByteBPE.decode: token {bad} is outside the vocabulary of {len(self)} (0..{len(self) - 1})"
            )
        return b"".join(self.vocab[i] for i in ids)

    def decode(self, ids):
        """The text of a sequence of token ids, decoded from UTF-8 once at the end (bytes that do
        not form UTF-8, such as half a character at the end of a sample, become U+FFFD)."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def token_symbols(self):
        """Every token as GPT-2 shows it, one printable character a byte ("Ġthe" for " the"):
        distinct strings, usable as a ``Vocab``'s tokens."""
        symbol = byte_to_symbol()
        return ["".join(symbol[b] for b in token) for token in self.vocab]

    # -- files ------------------------------------------------------------------------------------
    def to_dict(self):
        return {"format": FORMAT, "version": VERSION, "vocab_size": len(self), "merges": [list(p) for p in self.merges]}

    @classmethod
    def from_dict(cls, d, where="tokenizer"):
        """The tokenizer ``to_dict`` described; a field that is missing or wrong is a ValueError
        naming it (and ``where``, e.g. the file)."""

        def bad(field, what, value):
            raise ValueError(f'{where}: field "{field}" must be {what}, got {value!r:.80}')

        if not isinstance(d, dict):
            bad("", "a JSON object", d)
        if d.get("format") != FORMAT:
            bad("format", repr(FORMAT), d.get("format"))
        if d.get("version") != VERSION:
            bad("version", str(VERSION), d.get("version"))
        merges = d.get("merges")
        if not isinstance(merges, list):
            bad("merges", "a list of [a, b] token pairs", merges)
        for i, pair in enumerate(merges):
            ok = isinstance(pair, list) and len(pair) == 2 and all(type(t) is int for t in pair)
            if not ok or not all(0 <= t < NUM_BYTES + i for t in pair):
                bad(f"merges[{i}]", f"a pair of token ids below {NUM_BYTES + i} (the tokens made before it)", pair)
        if d.get("vocab_size") != NUM_BYTES + len(merges):
            bad("vocab_size", f"{NUM_BYTES} + len(merges) = {NUM_BYTES + len(merges)}", d.get("vocab_size"))
        return cls(merges)

    def save(self, path):
        """Write the tokenizer as JSON (the merges; the vocabulary follows from them), whole or
        not at all; returns ``path``."""
        return write_atomic(path, json.dumps(self.to_dict()) + "\n")

    @classmethod
    def load(cls, path):
        """The tokenizer ``save`` wrote; a file that is not one is a ValueError naming the file
        and the field."""
        where = os.fspath(path)
        try:
            with open(path, encoding="utf-8") as f:
                d = json.load(f)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"{where}: not a tokenizer file (not JSON: {e})") from None
        return cls.from_dict(d, where)
