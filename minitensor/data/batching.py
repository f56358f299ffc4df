"""From token lists to padded index arrays to minibatches of Tensors (D2L 10.5).

A minibatch holds sequences of equal length ``num_steps``: longer ones are truncated,
shorter ones padded with <pad>, and ``valid_lens`` remembers how many positions are real, so
that attention and the loss can ignore the padding.

Arrays are built once on the host (NumPy, int64); ``Batches`` turns slices of them into
Tensors on the training device one minibatch at a time.
"""

import numpy

from .. import tensor
from ..random import host_rng


def truncate_pad(line, num_steps, padding_token):
    """Truncate or pad a sequence to exactly ``num_steps`` (D2L's ``truncate_pad``)."""
    if num_steps < 0:  # (line[:-1] would drop one token and pad nothing)
        raise ValueError(f"truncate_pad: num_steps must be >= 0, got {num_steps}")
    if len(line) > num_steps:
        return line[:num_steps]
    return line + [padding_token] * (num_steps - len(line))


def build_array(lines, vocab, num_steps):
    """``(array, valid_lens)``: token lists -> (n, num_steps) int64 indices with <eos>
    appended, truncated or padded; ``valid_lens`` (n,) counts the non-padding positions.

    As in D2L, a sequence longer than ``num_steps - 1`` tokens loses its tail *and* its
    <eos>: choose ``num_steps`` from the data (``tasks.max_lengths``) + 1 to keep every <eos>.
    """
    rows = [truncate_pad(vocab[list(line)] + [vocab.eos], num_steps, vocab.pad) for line in lines]
    array = numpy.array(rows, dtype=numpy.int64).reshape(len(rows), num_steps)
    valid_lens = numpy.array([min(len(line) + 1, num_steps) for line in lines], dtype=numpy.int64)
    return array, valid_lens


def seq2seq_arrays(pairs, src_vocab, tgt_vocab, num_steps, tgt_num_steps=None):
    """``(enc_X, enc_valid_lens, dec_X, dec_valid_lens, Y)`` for teacher forcing.

    The decoder reads the target shifted right by one, starting from <bos>, and is trained
    to predict the target itself, ending in <eos> (D2L's ``_build_arrays``):

        Y      =  il   est  calme  .    <eos>  <pad>
        dec_X  = <bos> il   est   calme  .     <eos>

    (the <eos> under a <pad> in ``dec_X`` is never a valid position). ``dec_valid_lens``
    counts the positions of ``Y`` that are not padding, which is also the number of real
    decoder inputs: it is the mask for the loss. ``tgt_num_steps`` defaults to ``num_steps``.
    """
    tgt_num_steps = num_steps if tgt_num_steps is None else tgt_num_steps
    enc_X, enc_valid_lens = build_array([s for s, _ in pairs], src_vocab, num_steps)
    Y, dec_valid_lens = build_array([t for _, t in pairs], tgt_vocab, tgt_num_steps)
    bos = numpy.full((len(pairs), 1), tgt_vocab.bos, dtype=numpy.int64)
    dec_X = numpy.concatenate([bos, Y[:, :-1]], axis=1)
    return enc_X, enc_valid_lens, dec_X, dec_valid_lens, Y


def lm_arrays(corpus, num_steps):
    """``(X, Y)`` for a language model: every window of ``num_steps`` tokens and the same
    window shifted by one (D2L 9.3). Both are read-only views of one array, so a long text
    costs no extra memory until a minibatch copies its rows."""
    corpus = numpy.asarray(corpus, dtype=numpy.int64)
    if len(corpus) < num_steps + 1:
        raise ValueError(f"lm_arrays: a corpus of {len(corpus)} tokens has no window of {num_steps} + 1")
    windows = numpy.lib.stride_tricks.sliding_window_view(corpus, num_steps + 1)
    return windows[:, :-1], windows[:, 1:]


class Batches:
    """Minibatches of Tensors from equally long arrays, in a seeded order, resumable.

        loader = Batches(enc_X, enc_valid_lens, dec_X, dec_valid_lens, Y, batch_size=64)
        for epoch in range(num_epochs):
            for X, X_len, dec_in, Y_len, Y in loader:   # one epoch per `for`
                ...

    Epoch ``e`` visits the examples in the order of a permutation drawn from a generator
    seeded with ``(seed, e)``; ``seed`` itself is drawn once from ``rng`` (default
    ``mt.random.host_rng()``), so ``mt.manual_seed`` fixes every epoch's order. Because an
    epoch's order depends only on ``(seed, epoch)``, the position in the data is three
    integers: ``state_dict()`` saves them (JSON-safe) and ``load_state_dict`` resumes with the
    very next minibatch, even in a new process.

    A ``for`` loop continues the current epoch where it stopped: after a ``break`` (or a
    resume) the next loop finishes that epoch first.

    ``epoch_size=N``: an epoch is N examples drawn at random *with replacement* (each from a
    generator seeded with ``(seed, e)`` as well) instead of a permutation of all of them: what
    nanoGPT's ``get_batch`` does with the windows of a text, which start anywhere, so that N
    (the text's length over the window's) sets how many minibatches make an epoch.

    ``shard=(rank, size)``: data parallelism (``train/distributed.py``). Every process draws the
    same global minibatches, and this one yields only its rows of each: contiguous, the
    ``rank``-th of ``size`` parts whose lengths differ by at most one (``shard_bounds``). The
    position in the data is the global one, so a checkpoint resumes with any number of processes.
    """

    def __init__(
        self, *arrays, batch_size, shuffle=True, drop_last=False, device="cpu", rng=None, shard=None, epoch_size=None
    ):
        if not arrays:
            raise ValueError("Batches: give at least one array")
        self.arrays = [a if isinstance(a, numpy.ndarray) else numpy.asarray(a) for a in arrays]
        n = len(self.arrays[0])
        if any(len(a) != n for a in self.arrays):
            raise ValueError(f"Batches: arrays differ in length: {[len(a) for a in self.arrays]}")
        if batch_size < 1:
            raise ValueError(f"Batches: batch_size must be >= 1, got {batch_size}")
        if epoch_size is not None and (not shuffle or epoch_size < 1):
            raise ValueError(f"Batches: epoch_size draws at random: needs shuffle=True and >= 1, got {epoch_size}")
        # the examples an epoch visits: all (a permutation), or epoch_size drawn with replacement
        self.num_examples, self.batch_size = n if epoch_size is None else int(epoch_size), batch_size
        self.num_rows, self.epoch_size = n, epoch_size
        self.shuffle, self.drop_last, self.device = shuffle, drop_last, device
        self.shard = (0, 1) if shard is None else (int(shard[0]), int(shard[1]))
        if not 0 <= self.shard[0] < self.shard[1]:
            raise ValueError(f"Batches: shard must be (rank, size) with 0 <= rank < size, got {shard}")
        rng = host_rng() if rng is None else rng
        self.seed = int(rng.integers(0, 2**63 - 1))
        # The epoch under way and how many of its minibatches were handed out.
        self.epoch, self.position = 0, 0

    def __len__(self):
        """Minibatches per epoch."""
        full, rest = divmod(self.num_examples, self.batch_size)
        return full + (1 if rest and not self.drop_last else 0)

    def order(self, epoch):
        """The example indices of epoch ``epoch``, in the order they are visited."""
        if not self.shuffle:
            return numpy.arange(self.num_examples)
        rng = numpy.random.default_rng([self.seed, epoch])
        if self.epoch_size is not None:
            return rng.integers(0, self.num_rows, self.epoch_size)
        return rng.permutation(self.num_examples)

    def __iter__(self):
        # Roll over to the next epoch here, at the start, rather than after the last batch:
        # code after the final ``yield`` runs only if the caller asks for one batch more,
        # which ``zip`` or ``islice`` never do.
        if self.position and self.position >= len(self):
            self.epoch, self.position = self.epoch + 1, 0
        order = self.order(self.epoch)
        while self.position < len(self):
            idx = order[self.position * self.batch_size : (self.position + 1) * self.batch_size]
            if self.shard[1] > 1:
                start, stop = shard_bounds(len(idx), *self.shard)
                idx = idx[start:stop]
            # Count the batch as handed out before yielding it: a state saved while the
            # caller works on it resumes with the next one.
            self.position += 1
            yield tuple(tensor(a[idx], device=self.device) for a in self.arrays)

    def state_dict(self):
        return {"seed": self.seed, "epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state):
        self.seed, self.epoch, self.position = int(state["seed"]), int(state["epoch"]), int(state["position"])


def shard_bounds(n, rank, size):
    """(start, stop) of part ``rank`` of ``n`` rows cut into ``size`` contiguous parts whose
    lengths differ by at most one (the first ``n % size`` parts are one row longer)."""
    base, extra = divmod(n, size)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def batches(*arrays, batch_size, shuffle=True, drop_last=False, device="cpu", rng=None):
    """One epoch of minibatches: tuples of Tensors, one per array, in a seeded order."""
    return iter(Batches(*arrays, batch_size=batch_size, shuffle=shuffle, drop_last=drop_last, device=device, rng=rng))
