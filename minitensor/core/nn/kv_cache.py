"""The key/value cache of a self-attention layer while a model decodes, as a policy object.

Decoding one token at a time, a self-attention layer needs the keys and values of every
earlier position (D2L 11.7.5 keeps the block inputs, this layer their projections: see
``transformer.py``). *What* it keeps is a choice -- everything, the last W positions,
the first few plus the last W (StreamingLLM), everything at 8 bits -- and the choice is a
plugin (the contract: "Key/value caches" in ``minitensor/core/hookspecs.py``; the built-ins:
``plugins/minitensor_plugins/kv_caches.py``). The layer, ``MultiHeadAttention.
cached_self_attention``, only calls the policy:

    cache.append(k, v, positions)          # the new tokens' keys and values, before any rotation
    k, v = cache.keys(), cache.values()    # what the new queries attend (the new tokens last)
    p = cache.positions()                  # where the attention places those keys

``KVCache`` is the base class a policy may start from: it holds the count of tokens seen and
gives the optional methods their defaults.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import numpy

from ..tensor import Tensor

__all__ = ["KVCache", "check_positions"]


class KVCache:
    """A cache policy's base class: subclass it and write ``append``, ``keys``, ``values`` and
    ``positions`` (see the contract). What it gives:

    - ``seen_tokens``: tokens appended so far (the layer counts them), the position of the next;
    - ``bytes()``: the bytes of every Tensor attribute (right for a policy that keeps its data in
      Tensor attributes);
    - ``kept()``: ``positions()`` (the text positions of the kept tokens, for a policy that does
      not re-index);
    - ``mask(num_new)``: None (the new queries see every kept key in their past);
    - ``select(indices)``: a copy holding the batch rows ``indices`` of every Tensor attribute
      (beam search);
    - ``copy()``: a shallow copy -- a snapshot, as long as ``append`` replaces its Tensor
      attributes rather than writing into them;
    - ``crop(num_tokens)``: a ``NotImplementedError`` (a policy that drops tokens cannot bring
      them back; ``full`` and ``int8`` override it).
    """

    seen_tokens: int = 0

    def append(self, keys: Tensor, values: Tensor, positions: numpy.ndarray) -> None:
        """Take the keys and values (batch, num_kv_heads, T, d_head) of T new tokens at ``positions``."""
        raise NotImplementedError(f"{type(self).__name__}.append")

    def keys(self) -> Tensor:
        """The kept keys, (batch, num_kv_heads, K, d_head)."""
        raise NotImplementedError(f"{type(self).__name__}.keys")

    def values(self) -> Tensor:
        """The kept values, (batch, num_kv_heads, K, d_head)."""
        raise NotImplementedError(f"{type(self).__name__}.values")

    def positions(self) -> numpy.ndarray:
        """The positions the attention gives the kept keys: int64 (K,), consecutive."""
        raise NotImplementedError(f"{type(self).__name__}.positions")

    def bytes(self) -> int:
        """The memory held: the bytes of every Tensor attribute."""
        return sum(v.data.nbytes for v in vars(self).values() if isinstance(v, Tensor))

    def kept(self) -> numpy.ndarray:
        """The text positions of the kept tokens, int64 (K,): ``positions()``, right for a policy
        that does not re-index (a figure reads it to show which tokens the cache holds)."""
        return numpy.asarray(self.positions(), dtype=numpy.int64)

    def mask(self, num_new: int) -> Any:
        """Which kept keys each of the ``num_new`` new queries may see besides causality: None (all)."""
        return None

    def select(self, indices: Tensor) -> KVCache:
        """A copy holding the batch rows ``indices`` (rows may repeat) of every Tensor attribute."""
        new = copy.copy(self)
        for name, value in vars(self).items():
            if isinstance(value, Tensor):
                setattr(new, name, value[indices])
        return new

    def copy(self) -> KVCache:
        """A snapshot: a shallow copy (``append`` replaces the tensors it holds, never writes into them)."""
        return copy.copy(self)

    def crop(self, num_tokens: int) -> None:
        """Forget the tokens from position ``num_tokens`` on; this policy cannot."""
        raise NotImplementedError(
            f"{type(self).__name__} cannot roll back to {num_tokens} tokens (it may have dropped tokens it would "
            "need); speculative decoding needs a cache that can, such as 'full' or 'int8'"
        )

    def __repr__(self) -> str:
        kept = "empty" if self.seen_tokens == 0 else f"{len(self.positions())} of {self.seen_tokens} tokens"
        return f"{type(self).__name__}({kept}, {self.bytes()} bytes)"


def check_positions(
    cache: Any, positions: numpy.ndarray, keys: Tensor, values: Tensor, num_new: int, dtypes: Any = None
) -> None:
    """The layer's check of what a policy returned: keys and values in the ``dtypes`` appended
    (the keys' and the values', which differ where ``mt.autocast`` made the values bfloat16 and a
    positional encoding the keys float32), one position per kept key, consecutive (the encodings
    take an offset), and room for the new queries -- a ``ValueError`` naming the policy."""
    name = type(cache).__name__
    K = keys.shape[-2]
    problem = None
    if dtypes is not None and (keys.dtype, values.dtype) != tuple(dtypes):
        appended = dtypes[0] if dtypes[0] == dtypes[1] else f"{dtypes[0]} and {dtypes[1]}"
        problem = f"keys() and values() are {keys.dtype} and {values.dtype}; what was appended is {appended}"
    elif positions.ndim != 1 or len(positions) != K:
        problem = f"positions() has shape {positions.shape} for {K} keys"
    elif values.shape[-2] != K:
        problem = f"keys() holds {K} positions and values() {values.shape[-2]}"
    elif K < num_new:
        problem = f"it keeps {K} positions after appending {num_new} new tokens, which must all be kept"
    elif K and int(positions[-1]) - int(positions[0]) != K - 1:
        problem = f"positions() are not consecutive: {_few(positions)}"
    if problem:
        raise ValueError(f"key/value cache {name}: {problem} (see 'Key/value caches' in the plugin contract)")


def _few(positions: Sequence[int]) -> str:
    shown = ", ".join(str(int(p)) for p in positions[:8])
    return f"[{shown}{', ...' if len(positions) > 8 else ''}]"
