"""Vocab: the two-way map between tokens and the integer indices a model sees (D2L 9.2).

    vocab = Vocab([["g", "o"], ["h", "i"]])
    vocab["g"]                 # an index
    vocab[["g", "o", "?"]]     # a list of indices; "?" was never seen -> vocab.unk
    vocab.to_tokens([5, 6])    # back to tokens

Index order is fixed so that two runs (and a checkpoint) agree on it: the reserved tokens first,
in the order given (by default <pad>=0, <bos>=1, <eos>=2, <unk>=3), then the other tokens by
decreasing frequency, ties broken alphabetically. D2L sorts its list alphabetically; putting
<pad> at 0 and frequent tokens first changes no result and reads better in a printed batch.
"""

import collections

RESERVED_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")


def _flatten(tokens):
    """A flat list from a list of tokens or a list of token lists (sentences)."""
    tokens = list(tokens)
    if tokens and isinstance(tokens[0], (list, tuple)):
        return [token for line in tokens for token in line]
    return tokens


class Vocab:
    """Vocabulary for text.

    ``tokens``: a list of tokens, or a list of token lists. Tokens seen fewer than ``min_freq``
    times are left out (they will map to <unk>); ``reserved_tokens`` always get the first
    indices, in the order given. <unk> is always present (it is added if not reserved), since
    every look-up of an unseen token needs somewhere to go.
    """

    def __init__(self, tokens=(), min_freq=0, reserved_tokens=RESERVED_TOKENS):
        reserved = list(reserved_tokens)
        if len(set(reserved)) != len(reserved):
            raise ValueError(f"Vocab: reserved_tokens has duplicates: {reserved}")
        if "<unk>" not in reserved:
            reserved.append("<unk>")
        counter = collections.Counter(_flatten(tokens))
        # Most frequent first; the alphabetical tie-break makes the order independent of
        # the order the tokens happened to arrive in.
        self.token_freqs = sorted(counter.items(), key=lambda kv: (-kv[1], kv[0]))
        self.reserved_tokens = tuple(reserved)
        self.idx_to_token = reserved + [
            token for token, freq in self.token_freqs if freq >= min_freq and token not in reserved
        ]
        self.token_to_idx = {token: idx for idx, token in enumerate(self.idx_to_token)}

    def __len__(self):
        return len(self.idx_to_token)

    def __contains__(self, token):
        return token in self.token_to_idx

    def __getitem__(self, tokens):
        """Index of a token (unknown -> ``self.unk``), or a list of indices for a list/tuple."""
        if isinstance(tokens, (list, tuple)):
            return [self.__getitem__(token) for token in tokens]
        index = self.token_to_idx.get(tokens)
        return self.unk if index is None else index  # looked up only when needed: a Vocab may have no <unk>

    def to_tokens(self, indices):
        """Token of one index, or a list of tokens for a sequence (list, array, Tensor)."""
        if hasattr(indices, "tolist"):  # NumPy arrays and Tensors
            indices = indices.tolist()
        if isinstance(indices, (list, tuple)):
            return [self.to_tokens(index) for index in indices]
        index = int(indices)
        if not 0 <= index < len(self.idx_to_token):  # (a negative index would wrap around to a token)
            raise IndexError(
                f"Vocab.to_tokens: index {index} is outside the vocabulary of {len(self)} (0..{len(self) - 1})"
            )
        return self.idx_to_token[index]

    def decode(self, indices):
        """Tokens of a predicted sequence: stop at the first <eos>, drop <pad> and <bos>.

        This is how an output sequence is read before it is scored (BLEU, exact match).
        """
        out = []
        skip = {self.token_to_idx.get(t) for t in ("<pad>", "<bos>")}
        eos = self.token_to_idx.get("<eos>")
        for index in indices.tolist() if hasattr(indices, "tolist") else indices:
            index = int(index)
            if index == eos:
                break
            if index not in skip:
                out.append(self.idx_to_token[index])
        return out

    # The special tokens by name, as in D2L's ``vocab.unk``. A vocabulary built without one
    # of them says so instead of returning <unk>'s index by accident.
    def _special(self, token):
        try:
            return self.token_to_idx[token]
        except KeyError:
            raise KeyError(f"this Vocab has no {token} token (reserved_tokens={list(self.reserved_tokens)})") from None

    @property
    def pad(self):
        return self._special("<pad>")

    @property
    def bos(self):
        return self._special("<bos>")

    @property
    def eos(self):
        return self._special("<eos>")

    @property
    def unk(self):
        return self._special("<unk>")

    # -- checkpoints ----------------------------------------------------------------------
    def to_dict(self):
        """A JSON-safe description: enough to rebuild the same index map (``from_dict``)."""
        return {"idx_to_token": list(self.idx_to_token), "reserved_tokens": list(self.reserved_tokens)}

    @classmethod
    def from_dict(cls, d):
        """The Vocab that ``to_dict`` described (frequencies are not kept)."""
        vocab = cls.__new__(cls)
        vocab.idx_to_token = list(d["idx_to_token"])
        vocab.reserved_tokens = tuple(d["reserved_tokens"])
        vocab.token_to_idx = {token: idx for idx, token in enumerate(vocab.idx_to_token)}
        if len(vocab.token_to_idx) != len(vocab.idx_to_token):
            raise ValueError("Vocab.from_dict: idx_to_token has duplicates")
        vocab.token_freqs = []
        return vocab

    def __eq__(self, other):
        return isinstance(other, Vocab) and self.idx_to_token == other.idx_to_token

    __hash__ = None  # mutable-looking and compared by content: not a dict key

    def __repr__(self):
        head = ", ".join(repr(t) for t in self.idx_to_token[:8])
        return f"Vocab(size={len(self)}, [{head}{', ...' if len(self) > 8 else ''}])"


def build_vocabs(pairs, min_freq=0, reserved_tokens=RESERVED_TOKENS):
    """A source and a target Vocab from (source tokens, target tokens) pairs, as D2L builds
    one vocabulary per language."""
    src = Vocab([s for s, _ in pairs], min_freq, reserved_tokens)
    tgt = Vocab([t for _, t in pairs], min_freq, reserved_tokens)
    return src, tgt
