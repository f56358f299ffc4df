"""The built-in key/value cache policies: what a self-attention layer keeps of the past while a
model decodes (contract: "Key/value caches" in ``minitensor/core/hookspecs.py``; the layer
that calls them: ``MultiHeadAttention.cached_self_attention``).

Registered exactly as a user's policy would be. The layer hands them keys already rotated
(with a rotary encoding) at their positions in the text, except to ``sinks``, which declares
``reindexes = True``: it keeps keys unrotated, and the layer rotates them at every step at the
positions it reports. All of them keep their data in Tensor attributes that ``append``
replaces, so ``KVCache``'s ``copy``, ``select`` and ``bytes`` serve them.

===========  ===============================================  ====================================
policy       keeps                                            memory after t tokens (per layer)
===========  ===============================================  ====================================
``full``     every position                                   2 t g d numbers
``window``   the last W positions                             2 W g d (at most W - 1 + the new)
``sinks``    the first S positions and the last W             2 (S + W) g d
``int8``     every position, 8 bits + a scale and a zero      2 t g (d + 4) bytes
             point (float16) per head and token
===========  ===============================================  ====================================

(g key/value heads of size d.) The kit (``minitensor.testing.check_kv_cache``) checks each
against the attention it stands for.
"""

from __future__ import annotations

import numpy
from minitensor.nn import KVCache

import minitensor as mt


def _check_size(policy: str, option: str, value: object, smallest: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, numpy.integer)) or value < smallest:
        raise ValueError(f"key/value cache {policy!r}: {option} must be an integer >= {smallest}, got {value!r}")
    return int(value)


def _join(old: mt.Tensor | None, new: mt.Tensor) -> mt.Tensor:
    """The kept positions followed by the new ones, along the positions axis (2)."""
    return new if old is None else mt.concat([old, new], axis=2)


class _AsAppended(KVCache):
    """What full, window and sinks share: the kept keys and values as they were appended, the
    new ones joined after the kept (window and sinks evict first, then append)."""

    def __init__(self) -> None:
        self.k: mt.Tensor | None = None
        self.v: mt.Tensor | None = None

    def append(self, keys: mt.Tensor, values: mt.Tensor, positions: numpy.ndarray) -> None:
        self.k, self.v = _join(self.k, keys), _join(self.v, values)

    def keys(self) -> mt.Tensor:
        return self.k

    def values(self) -> mt.Tensor:
        return self.v


class FullCache(_AsAppended):
    """Every position, as it was appended: the cache of ``transformer.py``'s docstring. Decoding
    with it equals recomputing the whole sequence at every step (the kit checks it to 1e-5 in
    float64 for every registered plugin), at 2 t g d numbers per layer after t tokens."""

    def __init__(self, **options: object) -> None:
        mt.plugins.check_options(type(self), options)
        super().__init__()

    def positions(self) -> numpy.ndarray:
        return numpy.arange(self.k.shape[2], dtype=numpy.int64)

    def crop(self, num_tokens: int) -> None:
        """Keep the first ``num_tokens`` positions (speculative decoding drops rejected drafts)."""
        if self.k is not None:
            self.k, self.v = self.k[:, :, :num_tokens], self.v[:, :, :num_tokens]
        self.seen_tokens = min(self.seen_tokens, num_tokens)


class WindowCache(_AsAppended):
    """The last ``window`` positions (sliding-window attention, as Mistral decodes; Beltagy et
    al. 2020): the token at position t attends positions t - W + 1 .. t, at their own positions.

    Memory stays at W positions however long the text. The price, for a model that parks its
    spare attention on the first tokens (the large language models StreamingLLM studied): once
    they leave the window, that mass lands on tokens that carry meaning and the predictions
    collapse, which ``sinks`` repairs. A model that learned no such sink loses nothing
    (bench/generate.py's character model: see bench/README.md). Before the new tokens are appended the
    cache drops all but the last W - 1 positions; a chunk of T new tokens is then held with
    them (W - 1 + T positions) and ``mask`` gives each its own window.
    """

    def __init__(self, window: int = 256, **options: object) -> None:
        mt.plugins.check_options(type(self), options)
        self.window = _check_size("window", "window", window, 1)
        super().__init__()
        self.first = 0  # the position of the first kept key

    def append(self, keys: mt.Tensor, values: mt.Tensor, positions: numpy.ndarray) -> None:
        if self.k is not None:
            drop = max(self.k.shape[2] - (self.window - 1), 0)
            self.k, self.v = self.k[:, :, drop:], self.v[:, :, drop:]
            self.first += drop
        else:
            self.first = int(positions[0])
        super().append(keys, values, positions)

    def positions(self) -> numpy.ndarray:
        return numpy.arange(self.first, self.first + self.k.shape[2], dtype=numpy.int64)

    def mask(self, num_new: int) -> numpy.ndarray | None:
        """Query i (position p_i) sees keys at positions p_i - W < p <= p_i (causality is the layer's)."""
        K = self.k.shape[2]
        if K <= self.window:
            return None
        p = self.positions()
        return p[None, :] > p[-num_new:, None] - self.window


class SinksCache(_AsAppended):
    """Attention sinks (StreamingLLM, Xiao et al. 2023, "Efficient Streaming Language Models
    with Attention Sinks"): the first ``sinks`` positions and the last ``window``, with
    positions *re-indexed* inside the cache.

    Large language models park the attention a query does not need on the first tokens,
    whatever they say (softmax must put its mass somewhere); evicting them, as ``window`` does,
    moves that mass onto tokens that carry meaning and the text falls apart (Xiao et al. 2023,
    Figure 3). Keeping S = 4 of them next to the recent window lets such a model decode past its
    trained length at constant memory.
    The kept keys get consecutive positions 0 .. S + W - 1 and the new token the last one, so
    a rotary or ALiBi model never sees a distance longer than the cache (the paper's
    re-indexing: "positions within the cache rather than those in the original text").

    Token by token, the token at text position t attends the keys of text positions
    {0 .. S-1} and {t - W + 1 .. t}, placed at positions 0, 1, 2, ... in that order, itself at
    the last. A chunk of several new tokens sits at consecutive positions after what was kept,
    each seeing the sinks and its own window (``mask``).
    """

    reindexes = True  # the layer hands over keys before the "qk" encoding and encodes them at positions()

    def __init__(self, sinks: int = 4, window: int = 256, **options: object) -> None:
        mt.plugins.check_options(type(self), options)
        self.sinks = _check_size("sinks", "sinks", sinks, 0)
        self.window = _check_size("sinks", "window", window, 1)
        super().__init__()
        self.text_positions = numpy.zeros(0, dtype=numpy.int64)  # where each kept key stood in the text

    def append(self, keys: mt.Tensor, values: mt.Tensor, positions: numpy.ndarray) -> None:
        if self.k is not None:
            K, S = self.k.shape[2], min(self.sinks, self.k.shape[2])
            recent = min(K - S, self.window - 1)  # the room the new tokens' windows need
            if S + recent < K:  # evict between the sinks and the recent tokens
                keep = numpy.r_[0:S, K - recent : K]
                self.k, self.v = _take(self.k, S, recent), _take(self.v, S, recent)
                self.text_positions = self.text_positions[keep]
        super().append(keys, values, positions)
        self.text_positions = numpy.concatenate([self.text_positions, positions])

    def positions(self) -> numpy.ndarray:
        return numpy.arange(self.k.shape[2], dtype=numpy.int64)  # re-indexed: positions within the cache

    def kept(self) -> numpy.ndarray:
        return self.text_positions

    def mask(self, num_new: int) -> numpy.ndarray | None:
        """Query i sees the sinks and the keys of its own window (text positions t_i - W < t)."""
        t = self.text_positions
        if len(t) <= self.sinks + self.window:
            return None
        sink = t[None, :] < self.sinks
        recent = t[None, :] > t[-num_new:, None] - self.window
        return sink | recent


def _take(x: mt.Tensor, sinks: int, recent: int) -> mt.Tensor:
    """The first ``sinks`` and the last ``recent`` positions of x (batch, heads, K, d)."""
    K = x.shape[2]
    return mt.concat([x[:, :, :sinks], x[:, :, K - recent :]], axis=2)


class Int8Cache(KVCache):
    """Every position, stored as 8-bit integers (asymmetric per-token quantisation, as in KIVI,
    Liu et al. 2024, and Hugging Face's ``QuantizedCache``): for each head and token, the d
    numbers x of a key (or value) are kept as

        zero = min(x),   scale = (max(x) - min(x)) / 255,   code = round((x - zero) / scale)  in 0 .. 255

    and read back as code * scale + zero. The scale and the zero point are stored in float16,
    rounded so that zero <= min(x) and zero + 255 scale >= max(x) still hold: every number is
    then read back within scale / 2 of what was appended. (Rounding the zero point costs up to
    |min(x)| / 1024 of range: little for keys and values, which sit around 0.) Memory per head and token: d bytes
    plus 4, against 4 d in float32 -- 0.28x of ``full`` for d = 32, 0.27x for d = 64. (Values
    beyond float16's range, 65504, are refused.)

    What that does to attention (``minitensor.testing.attention_error_bound`` computes it, and
    ``check_kv_cache(..., tolerance="bound")`` checks it): a key error of norm e_k moves every
    score s = c q.k by at most eps = |c| |q|_2 e_k, so every weight by a factor within
    exp(+-2 eps), the weights by at most exp(2 eps) - 1 in total; the weighted sum of values
    then moves by at most e_v + (exp(2 eps) - 1) * R / 2 per number, R the range of the values
    (max - min of that feature over the keys), e_v the values' largest error.
    """

    LEVELS = 255  # 8 bits: codes 0 .. 255
    SLACK = 2.0**-10  # twice float16's rounding error: moves zero down and scale up before rounding
    SMALLEST = 2.0**-14  # float16's smallest normal number: a step never finer (a spread below 0.004)

    def __init__(self, **options: object) -> None:
        mt.plugins.check_options(type(self), options)
        self.codes_k: mt.Tensor | None = None
        self.codes_v: mt.Tensor | None = None
        self.scale_k: mt.Tensor | None = None
        self.scale_v: mt.Tensor | None = None
        self.zero_k: mt.Tensor | None = None
        self.zero_v: mt.Tensor | None = None

    @classmethod
    def quantize(cls, x: mt.Tensor) -> tuple[mt.Tensor, mt.Tensor, mt.Tensor]:
        """x (..., d) -> (codes uint8 (..., d), scale (..., 1), zero (..., 1)), the last two float16."""
        if x.dtype not in (mt.float32, mt.float64):  # float16, bfloat16 in float32: 255 + 0.5 is 256 in bfloat16
            x = x.float()
        low, high = x.min(axis=-1, keepdims=True), x.max(axis=-1, keepdims=True)
        if not bool((low.abs().max() < 65504) & (high.abs().max() < 65504)):
            raise ValueError(
                f"key/value cache 'int8': values beyond float16's range (min {low.min().item():.4g}, "
                f"max {high.max().item():.4g}) cannot be stored with a float16 scale and zero point"
            )
        # rounded to nearest; where that went up, round from a little lower (2^-24: float16's finest step)
        zero = low.astype("float16")
        zero = mt.where(zero.astype(x.dtype) > low, (low - low.abs() * cls.SLACK - 2.0**-24).astype("float16"), zero)
        spread = high - zero.astype(x.dtype)
        # a constant row (spread 0) keeps scale 1: its codes are all 0 and it reads back exactly
        # float16's smallest normal number at least (a smaller scale would lose its precision
        # or vanish); a constant row (spread 0) keeps scale 1: codes 0, read back exactly
        scale = (spread * (1 + cls.SLACK) / cls.LEVELS).clip(min=cls.SMALLEST)
        scale = mt.where(spread > 0, scale, mt.ones_like(spread)).astype("float16")
        codes = ((x - zero.astype(x.dtype)) / scale.astype(x.dtype)).clip(0, cls.LEVELS) + 0.5
        return codes.astype("uint8"), scale, zero  # + 0.5, then truncation: rounding

    @staticmethod
    def dequantize(codes: mt.Tensor, scale: mt.Tensor, zero: mt.Tensor, dtype: object = "float32") -> mt.Tensor:
        return codes.astype(dtype) * scale.astype(dtype) + zero.astype(dtype)

    def append(self, keys: mt.Tensor, values: mt.Tensor, positions: numpy.ndarray) -> None:
        # what keys() and values() give back: each its own (mt.autocast's values may be bfloat16
        # where a positional encoding made the keys float32)
        self.key_dtype, self.value_dtype = keys.dtype, values.dtype
        with mt.no_grad():
            ck, sk, zk = self.quantize(keys)
            cv, sv, zv = self.quantize(values)
        self.codes_k, self.codes_v = _join(self.codes_k, ck), _join(self.codes_v, cv)
        self.scale_k, self.scale_v = _join(self.scale_k, sk), _join(self.scale_v, sv)
        self.zero_k, self.zero_v = _join(self.zero_k, zk), _join(self.zero_v, zv)

    def keys(self) -> mt.Tensor:
        return self.dequantize(self.codes_k, self.scale_k, self.zero_k, self.key_dtype)

    def values(self) -> mt.Tensor:
        return self.dequantize(self.codes_v, self.scale_v, self.zero_v, self.value_dtype)

    def positions(self) -> numpy.ndarray:
        return numpy.arange(self.codes_k.shape[2], dtype=numpy.int64)

    def crop(self, num_tokens: int) -> None:
        """Keep the first ``num_tokens`` positions (speculative decoding drops rejected drafts)."""
        if self.codes_k is None:  # nothing appended yet
            return
        for name in ("codes_k", "codes_v", "scale_k", "scale_v", "zero_k", "zero_v"):
            setattr(self, name, getattr(self, name)[:, :, :num_tokens])
        self.seen_tokens = min(self.seen_tokens, num_tokens)


@mt.hookimpl
def minitensor_kv_caches():
    return {"full": FullCache, "window": WindowCache, "sinks": SinksCache, "int8": Int8Cache}
