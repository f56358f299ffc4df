"""The conformance kit for key/value cache policies (the contract: "Key/value caches" in
``minitensor/core/hookspecs.py``); ``minitensor.testing`` re-exports it.

    from minitensor.testing import check_kv_cache

    def test_my_cache():
        assert check_kv_cache(MyCache, {"budget": 8}, keeps=my_keeps)

A policy is checked against what it stands for, its *definition*: ``keeps(t)`` says which
earlier tokens the token at text position t attends and at which positions the attention
places them -- ``(text_positions, positions)``, two int arrays, t itself last. The kit decodes
random inputs token by token through ``MultiHeadAttention.cached_self_attention`` with the
policy, and computes every token's output again *without a cache*: the layer's own forward
pass with that token as the query and the tokens of ``text_positions`` as keys and values,
at ``positions``. The built-ins' definitions are ``KEEPS``:

- ``full``: every token 0 .. t, where they are (decoding equals recomputing the sequence);
- ``window`` (W): tokens t - W + 1 .. t, where they are (the full pass with a sliding-window
  mask, which the kit also checks directly);
- ``sinks`` (S, W): tokens 0 .. S - 1 and t - W + 1 .. t, at positions 0, 1, 2, ... (re-indexed).

A lossy policy (``int8``) is checked against ``full`` within a bound instead
(``tolerance="bound"``: ``attention_error_bound``, derived in ``Int8Cache``'s docstring).
Besides, every policy must keep the contract's rules: shapes, dtype, consecutive positions,
the new tokens last, ``bytes()``, ``copy()`` as a snapshot, ``select(indices)`` and ``crop``
(where it does not raise ``NotImplementedError``).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import Any

import numpy

from . import plugins, tensor
from .grad_mode import no_grad
from .nn import MultiHeadAttention

__all__ = ["KEEPS", "attention_error_bound", "check_cached_generation", "check_kv_cache"]


def _keeps_full(options: dict[str, Any]) -> Callable[[int], tuple[numpy.ndarray, numpy.ndarray]]:
    def keeps(t: int) -> tuple[numpy.ndarray, numpy.ndarray]:
        return numpy.arange(t + 1), numpy.arange(t + 1)

    return keeps


def _keeps_window(options: dict[str, Any]) -> Callable[[int], tuple[numpy.ndarray, numpy.ndarray]]:
    W = options.get("window", 256)

    def keeps(t: int) -> tuple[numpy.ndarray, numpy.ndarray]:
        kept = numpy.arange(max(0, t - W + 1), t + 1)
        return kept, kept

    return keeps


def _keeps_sinks(options: dict[str, Any]) -> Callable[[int], tuple[numpy.ndarray, numpy.ndarray]]:
    S, W = options.get("sinks", 4), options.get("window", 256)

    def keeps(t: int) -> tuple[numpy.ndarray, numpy.ndarray]:
        kept = numpy.union1d(numpy.arange(min(S, t + 1)), numpy.arange(max(0, t - W + 1), t + 1))
        return kept, numpy.arange(len(kept))  # re-indexed: positions within the cache

    return keeps


KEEPS = {"full": _keeps_full, "window": _keeps_window, "sinks": _keeps_sinks}
"""The built-in policies' definitions: ``KEEPS[name](options)`` is ``keeps(t)``, which gives the
text positions the token at t attends and the positions the attention places them at."""


class _Fail:
    def __init__(self, what: str) -> None:
        self.what = what

    def __call__(self, prop: str, detail: str) -> None:
        raise AssertionError(f"{self.what}: {prop}: {detail}")


def check_kv_cache(
    cache: str | type,
    options: dict[str, Any] | None = None,
    *,
    keeps: Callable[[int], tuple[Any, Any]] | None = None,
    tolerance: float | str = 1e-9,
    scorer: str = "scaled_dot",
    pooling: str = "softmax",
    positional: Any = None,
    num_hiddens: int = 8,
    num_heads: int = 2,
    num_kv_heads: int | None = None,
    batch: int = 2,
    steps: int = 24,
    prompt: int = 3,
) -> bool:
    """Check the cache policy ``cache`` (a registered name or a class) built with ``options``
    against its definition, in a float64 ``MultiHeadAttention`` of the plugins named.

    ``keeps``: the definition (see the module docstring); default: ``KEEPS[name]`` for a
    built-in's name, else "every token" (a policy that keeps everything). ``tolerance``: the
    largest difference allowed from the definition's outputs; "bound" for a lossy policy,
    checked against ``full`` with ``attention_error_bound`` (dot-product scorers and a
    softmax pooling only, where the bound holds). Decodes ``steps`` random tokens twice: one at
    a time, and a prompt of ``prompt`` tokens followed by single ones.

    Returns True, or raises AssertionError naming the policy, the plugins and the property.
    """
    options = dict(options or {})
    name = cache if isinstance(cache, str) else getattr(cache, "__name__", repr(cache))
    cls = plugins.lookup("kv cache", cache) if isinstance(cache, str) else cache
    fail = _Fail(
        f"check_kv_cache({name!r}, {options}, scorer={scorer!r}, pooling={pooling!r}, positional={positional!r})"
    )
    if keeps is None:
        keeps = (KEEPS.get(cache) or _keeps_full)(options) if isinstance(cache, str) else _keeps_full(options)
    from .testing import decoding_layer  # the layer check_incremental_decoding checks, built alike

    mha = decoding_layer(scorer, pooling, positional, num_hiddens, num_heads, num_kv_heads, steps)
    rng = numpy.random.default_rng(0)
    X = tensor(rng.standard_normal((batch, steps, num_hiddens)))
    with no_grad():
        reference = _without_cache(mha, X, keeps) if tolerance != "bound" else None
        for pieces in ([1] * steps, [prompt] + [1] * (steps - prompt)):
            _check_decoding(fail, mha, X, cls, options, pieces, reference, tolerance)
        _check_snapshots(fail, mha, X, cls, options)
    if name == "window" or cls is plugins.kv_caches().get("window"):
        _check_sliding_window_mask(fail, mha, X, reference, options.get("window", 256))
    return True


def _without_cache(mha: MultiHeadAttention, X: Any, keeps: Callable[[int], tuple[Any, Any]]) -> numpy.ndarray:
    """Every token's output by the definition: the layer's forward pass, the token as the only
    query, the kept tokens as keys and values, at the definition's positions."""
    outputs = []
    for t in range(X.shape[1]):
        text, positions = (numpy.asarray(a, dtype=numpy.int64) for a in keeps(t))
        kept = X[:, text.tolist()]
        out = mha(X[:, t : t + 1], kept, kept, q_offset=int(positions[-1]), k_offset=int(positions[0]))
        outputs.append(out.numpy())
    return numpy.concatenate(outputs, axis=1)


def _check_decoding(fail: _Fail, mha, X, cls, options, pieces, reference, tolerance) -> None:
    policy, exact = cls(**options), plugins.lookup("kv cache", "full")()
    g, d = mha.num_kv_heads, mha.head_size
    outputs, bounds, start = [], [], 0
    for size in pieces:
        x = X[:, start : start + size]
        try:
            out, policy = mha.cached_self_attention(x, policy)
        except Exception as e:
            fail("decoding", f"pieces {pieces[:4]}...: at position {start}: {type(e).__name__}: {e}")
        start += size
        keys, positions = policy.keys(), policy.positions()
        if keys.shape[:2] != (X.shape[0], g) or keys.shape[-1] != d or keys.dtype != X.dtype:
            fail("keys()", f"shape {tuple(keys.shape)} dtype {keys.dtype}; expected (batch, {g}, K, {d}) in {X.dtype}")
        if policy.seen_tokens != start:
            fail("seen_tokens", f"{policy.seen_tokens} after {start} tokens")
        if not isinstance(policy.bytes(), (int, numpy.integer)) or policy.bytes() <= 0:
            fail("bytes()", f"returned {policy.bytes()!r}; expected a positive int")
        if len(positions) < size or positions.dtype.kind not in "iu":
            fail("positions()", f"{positions!r} after {size} new tokens")
        if tolerance == "bound":
            exact_out, exact = mha.cached_self_attention(x, exact)
            bounds.append(_layer_bound(mha, x, exact, policy, size))
            outputs.append((out.numpy(), exact_out.numpy()))
        else:
            outputs.append(out.numpy())
    if tolerance == "bound":
        for i, ((out, exact_out), bound) in enumerate(zip(outputs, bounds)):
            over = numpy.abs(out - exact_out) - bound
            if (over > 1e-12).any():
                fail(
                    "the error bound",
                    f"piece {i}: the outputs differ from the full cache's by {numpy.abs(out - exact_out).max():.3g}, "
                    f"over attention_error_bound's {bound.max():.3g}",
                )
        return
    stepwise = numpy.concatenate(outputs, axis=1)
    diff = numpy.abs(stepwise - reference)
    if not (diff <= tolerance).all():
        position = int(numpy.argwhere(diff > tolerance)[0][1])
        fail(
            "the definition",
            f"decoding in pieces {pieces[:4]}... differs from the definition computed without a cache from position "
            f"{position} on (max difference {diff.max():.3g}, tolerance {tolerance}): the policy keeps other tokens, "
            "or reports other positions, than its definition says",
        )


def _check_snapshots(fail: _Fail, mha, X, cls, options) -> None:
    """copy() is a snapshot, select() picks batch rows, crop() rolls back (each where it exists;
    without copy(), the shallow copy the models then take must be a snapshot)."""
    policy = cls(**options)
    _, policy = mha.cached_self_attention(X[:, :5], policy)
    before = policy.copy() if hasattr(policy, "copy") else copy.copy(policy)
    keys = before.keys().numpy().copy()
    mha.cached_self_attention(X[:, 5:7], policy)
    if before.keys().shape != keys.shape or not numpy.array_equal(before.keys().numpy(), keys):
        fail("copy()", "a copy changed when the original was appended to; copy() must be a snapshot")
    rows = [1, 0, 1] if X.shape[0] > 1 else [0, 0]
    if hasattr(policy, "select"):
        chosen = policy.select(tensor(rows, dtype="int64"))
        if not numpy.array_equal(chosen.keys().numpy(), policy.keys().numpy()[rows]):
            fail("select()", f"select({rows}) did not give those batch rows of keys()")
    crop = getattr(policy, "crop", None)  # optional: a policy that cannot roll back has none, or raises
    try:
        if crop is None:
            return
        crop(5)
    except NotImplementedError:
        return
    if policy.seen_tokens != 5 or not numpy.array_equal(policy.keys().numpy(), keys):
        fail("crop()", "crop(5) after 7 tokens does not give back the cache of the first 5")


def _check_sliding_window_mask(fail: _Fail, mha, X, reference, W: int) -> None:
    """``window``'s definition is the full causal pass with a sliding-window mask."""
    T = X.shape[1]
    i, j = numpy.arange(T)[:, None], numpy.arange(T)[None, :]
    masked = mha(X, X, X, mask=tensor((j <= i) & (j > i - W)), causal=True).numpy()
    if not numpy.allclose(masked, reference, rtol=0, atol=1e-9):
        fail("sliding window", f"the definition differs from the full pass with a sliding-window mask of {W}")


def attention_error_bound(q, keys, approx_keys, values, approx_values, scale: float, allowed=None) -> numpy.ndarray:
    """How far attention with approximate keys and values can be from the exact one, for
    scores ``scale * q . k`` and softmax weights (NumPy arrays: q (..., Q, d), keys and values
    (..., K, d), ``allowed`` a bool (..., Q, K) or None). The derivation (``Int8Cache``):

        eps = |scale| * |q|_2 * max_j |k_j - k^_j|_2            every score moves by at most eps
        |w - w^|_1 <= exp(2 eps) - 1                             each weight by a factor in exp(+-2 eps)
        |out - out^| <= max_j |v_j - v^_j| + (exp(2 eps) - 1) * R / 2    per feature

    R: the range (max - min over the allowed keys) of each feature of the exact values. The
    norms of key errors are rotation-invariant, so the bound holds with rotary keys. Returns
    the bound, (..., Q, d)."""
    key_error = numpy.linalg.norm(keys - approx_keys, axis=-1)  # (..., K)
    value_error = numpy.abs(values - approx_values)  # (..., K, d)
    if allowed is None:
        allowed = numpy.ones(q.shape[:-1] + (keys.shape[-2],), dtype=bool)
    eps = abs(scale) * numpy.linalg.norm(q, axis=-1) * numpy.where(allowed, key_error[..., None, :], 0).max(-1)
    v = values[..., None, :, :]  # (..., 1, K, d) against allowed (..., Q, K, 1)
    a = allowed[..., None]
    spread = numpy.where(a, v, -numpy.inf).max(-2) - numpy.where(a, v, numpy.inf).min(-2)
    spread = numpy.where(numpy.isfinite(spread), spread, 0.0)
    worst_value = numpy.where(a, value_error[..., None, :, :], 0).max(-2)
    return worst_value + numpy.expm1(2 * eps)[..., None] * spread / 2


def _layer_bound(mha: MultiHeadAttention, x, exact, policy, T: int) -> numpy.ndarray:
    """``attention_error_bound`` for the heads of the last T tokens, carried through W_o:
    |dout_i| <= sum_j |W_o[i, j]| |dhead_j|."""
    scale = mha.attention.scorer.dot_scale(mha.head_size)
    if scale is None or not getattr(mha.attention.pooling, "softmax_like", False):
        raise AssertionError("tolerance='bound' holds for dot-product scorers with a softmax pooling only")
    # the bound reads only |q| and the norms of key errors, which a rotary encoding leaves as they are
    q = mha.project_and_split(mha.W_q, x)
    rotated, rotated_approx = exact.keys(), policy.keys()
    K = rotated.shape[-2]
    r = mha.num_heads // mha.num_kv_heads  # a query head reads key/value head i // r
    expand = lambda a: numpy.repeat(a.numpy(), r, axis=1)  # noqa: E731
    allowed = numpy.arange(K)[None, :] <= numpy.arange(K - T, K)[:, None]
    heads = attention_error_bound(
        q.numpy(),
        expand(rotated),
        expand(rotated_approx),
        expand(exact.values()),
        expand(policy.values()),
        scale,
        numpy.broadcast_to(allowed, q.shape[:-1] + (K,)),
    )  # (batch, num_heads, T, d)
    batch = heads.shape[0]
    concat = heads.transpose(0, 2, 1, 3).reshape(batch, T, mha.num_hiddens)
    return concat @ numpy.abs(mha.W_o.weight.numpy()).T


def check_cached_generation(lm, steps: int = 1000, cache: str = "full", cache_options=None, seed: int = 0, atol=1e-5):
    """Generate ``steps`` tokens greedily with ``lm`` (a ``TransformerLM``) through its
    key/value cache and check every step's logits against recomputing the whole sequence
    (the causal pass over all of it, whose row t is what recomputing at step t gives).
    Returns the maximum difference; raises AssertionError above ``atol``."""
    rng = numpy.random.default_rng(seed)
    tokens = [int(rng.integers(lm.config.vocab_size))]
    with no_grad():
        lm.eval()
        state = lm.begin_decoding(cache, cache_options)
        cached = []
        for _ in range(steps):
            logits, state = lm.decode_step(tensor([[tokens[-1]]]), state)
            row = logits.numpy()[0, -1]
            cached.append(row)
            tokens.append(int(row.argmax()))
        full = lm(tensor([tokens[:-1]])).numpy()[0]
    diff = numpy.abs(numpy.stack(cached) - full)
    worst = float(diff.max())
    if not worst <= atol or math.isnan(worst):
        t = int(numpy.argwhere(~(diff <= atol))[0][0])
        raise AssertionError(
            f"check_cached_generation(cache={cache!r}): step {t} of {steps} differs from recomputing the sequence by "
            f"{diff[t].max():.3g} (largest {worst:.3g}, allowed {atol})"
        )
    return worst
