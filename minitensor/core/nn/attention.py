"""Attention layers: ``Attention`` (one head) and ``MultiHeadAttention`` (D2L 11.3 - 11.5).

An attention layer pools values (v_1, ..., v_n) according to how well their keys
(k_1, ..., k_n) match each query q:

    f(q) = sum_i alpha(q, k_i) v_i,     alpha(q, k_i) = pooling(score(q, k_1), ..., score(q, k_n))_i

The two pieces are plugins, looked up by name in ``minitensor.plugins``:

- a *scorer* turns every (query, key) pair into a number: ``dot`` q.k, ``scaled_dot``
  q.k / sqrt(d), ``additive`` w_v^T tanh(W_q q + W_k k), ...;
- a *pooling* turns each row of scores into weights: ``softmax`` (weights >= 0 adding up
  to 1 over the keys a query may see), ``average``, ``sparsemax``, ...

The layer owns the rest: masking (``valid_lens``, ``mask``, ``causal``), an additive
``bias`` on the scores (where a "scores" positional encoding such as ALiBi enters), dropout
on the weights and the weighted sum ``weights @ values``. A user's plugin registered under a
new name is then usable here, and in every model built on these layers, without other
changes: ``MultiHeadAttention.attend`` is the one path that training, cached decoding and
grouped-query heads all take.

What a plugin is built with, receives and must return (shapes, masks, -inf, the three kinds
of positional encoding) is the contract in ``minitensor/core/hookspecs.py``; this module builds
plugins as it says and checks the shapes of what they return.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Iterator, Sequence
from typing import Any

import numpy

from .. import amp, ops
from ..creation import arange
from ..errors import ShapeError
from ..ops.flash_attention import (  # noqa: F401  (FUSED_MIN_LENGTH re-exported: the layers' rule)
    FUSED_MIN_LENGTH,
    FlashAttention,
    StreamPlan,
    fits_one_tile,
    pick_indices,
    stream_pays,
    stream_plan,
)
from ..tensor import Device, DType, Tensor, tensor
from .dropout import Dropout
from .kv_cache import check_positions
from .linear import Linear
from .module import Module


def causal_mask(num_queries: int, num_keys: int, device: Device = "cpu") -> Tensor:
    """The (Q, K) bool mask of causal attention: query i may attend key j when j <= i + (K - Q).

    With Q == K that is the usual lower triangle (a token sees itself and the past). With
    K > Q the queries are the *last* Q positions of the sequence: the first K - Q keys are
    a cache of earlier tokens, all in every query's past.
    """
    i = arange(num_queries, device=device).reshape(num_queries, 1)
    j = arange(num_keys, device=device)
    return j <= i + (num_keys - num_queries)


def _shared_causal_mask(num_queries: int, num_keys: int, backend: Any) -> Tensor:
    """``causal_mask``, made once per shape and device and shared by every layer that asks: a
    GPT's blocks all mask the same (T, T), and building it is four launches on a GPU. Only read
    here (``weigh`` combines it into a new mask); the public ``causal_mask`` stays a fresh tensor.
    A CUDA graph being captured keeps it: the cache may drop it while the graph still reads it."""
    mask = _causal_masks(num_queries, num_keys, backend)
    backend.keep_for_replay(mask.data)
    return mask


@functools.lru_cache(maxsize=8)
def _causal_masks(num_queries: int, num_keys: int, backend: Any) -> Tensor:
    return causal_mask(num_queries, num_keys, device=backend)


# Where a positional encoding acts (its class attribute ``applies_to``): added to the inputs,
# rotating queries and keys, or biasing the scores (the plugin contract, second edition).
POSITIONAL_KINDS = ("inputs", "qk", "scores")


def _describe(name: str, plugin: Any) -> str:
    cls = type(plugin)
    return f"{name!r} ({cls.__module__}.{cls.__qualname__})"


def _build_plugin(
    kind: str, name: str, args: tuple[Any, ...], options: dict[str, Any] | None, dtype: DType, device: Device
) -> Module:
    """Look ``name`` up in the registry of ``kind`` and instantiate it as its contract says,
    ``cls(*args, **options)``, in the layer's dtype and on its device.

    The rule (``minitensor/core/hookspecs.py``): a plugin whose constructor accepts ``dtype=`` and
    ``device=`` gets the layer's and builds its tables directly in them (a float64 rotary
    table computed in float64, not a float32 one converted); any other is built with its own
    defaults and moved, like a model."""
    from .. import plugins  # on first use: the plugin machinery loads lazily

    if not isinstance(name, str):
        raise TypeError(f"the {kind} is given by its registered name (a str), got {type(name).__name__} {name!r}")
    cls = plugins.lookup(kind, name)
    options = dict(options or {})
    given = dict(options)  # for a message: what the caller chose, not the layer's dtype and device
    factory = {"dtype": dtype, "device": device}
    accepted = inspect.signature(cls).parameters
    if all(key in accepted for key in factory) and not (factory.keys() & options.keys()):
        options.update(factory)
        dtype = device = None  # nothing left to move
    try:
        plugin = cls(*args, **options)
    except Exception as e:
        # Say which plugin failed, keeping the original exception type (TypeError for an
        # unknown option, ValueError for a bad value...) so callers can still catch it.
        where = f"while building the {kind} {name!r} ({cls.__module__}.{cls.__qualname__}) with options {given}"
        try:
            wrapped = type(e)(f"{e} ({where})")
        except Exception:  # an exception type that cannot be rebuilt from one message
            raise e from None
        raise wrapped from e
    if not isinstance(plugin, Module):
        raise TypeError(f"the {kind} {name!r} ({cls.__module__}.{cls.__qualname__}) is not an mt.nn.Module")
    if dtype is not None or device is not None:
        plugin.to(dtype=dtype, device=device)
    return plugin


def new_cache(name: str = "full", options: dict[str, Any] | None = None) -> Any:
    """A new key/value cache of the policy registered as ``name``, built with ``options``."""
    from .. import plugins  # on first use: the plugin machinery loads lazily

    cls = plugins.lookup("kv cache", name)
    try:
        return cls(**(options or {}))
    except TypeError as e:  # an option the policy does not take: name the policy
        raise TypeError(f"key/value cache {name!r}: {e}") from e


def as_tensor(value: Any, like: Tensor, dtype: DType = None) -> Any:  # a Tensor; None stays None
    """valid_lens or a mask given as a list or array -> a Tensor on ``like``'s device."""
    if value is None or isinstance(value, Tensor):
        return value
    return tensor(value, dtype=dtype, device=like.device)


def positional_class(positional: str | Module) -> type:
    """The class of the positional encoding ``positional``: a registered name, or an
    encoding already built."""
    from .. import plugins  # on first use: the plugin machinery loads lazily

    if isinstance(positional, Module):
        return type(positional)
    if isinstance(positional, str):
        return plugins.lookup("positional encoding", positional)
    raise TypeError(
        f"positional is given by its registered name (a str), got {type(positional).__name__} {positional!r}"
    )


def positional_kind(positional: str | Module) -> str:
    """Where the positional encoding ``positional`` (a name or an encoding) acts, its class
    attribute ``applies_to``: "inputs" (added to the embeddings), "qk" (rotates queries and
    keys) or "scores" (a bias on the scores)."""
    cls = positional_class(positional)
    kind = getattr(cls, "applies_to", None)
    if kind not in POSITIONAL_KINDS:
        raise ValueError(
            f"positional encoding {positional!r} ({cls.__module__}.{cls.__qualname__}) has applies_to={kind!r}; "
            f"expected one of {', '.join(map(repr, POSITIONAL_KINDS))}"
        )
    return kind


def check_fused(fused: Any, where: str = "MultiHeadAttention") -> None:
    """``fused`` must be "auto", True or False (a ``ValueError`` naming ``where`` otherwise)."""
    if fused not in ("auto", True, False) or isinstance(fused, (int, float)) and not isinstance(fused, bool):
        hint = " (the command line's --fused on / off are True / False here)" if fused in ("on", "off") else ""
        raise ValueError(f"{where}: fused must be 'auto', True or False, got {fused!r}{hint}")


def check_heads(
    num_hiddens: int, num_heads: int, num_kv_heads: int | None = None, where: str = "MultiHeadAttention"
) -> int:
    """The number of key/value heads, after checking that the heads fit: num_hiddens splits
    evenly into num_heads heads, and num_kv_heads (None: num_heads) divides num_heads. A
    ``ValueError`` naming ``where`` and the values otherwise."""
    if num_heads <= 0 or num_hiddens % num_heads:
        raise ValueError(
            f"{where}: num_hiddens={num_hiddens} must split evenly into num_heads={num_heads} "
            f"heads (num_hiddens % num_heads == {num_hiddens % num_heads if num_heads > 0 else 'undefined'})"
        )
    num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
    if not isinstance(num_kv_heads, int) or num_kv_heads <= 0 or num_heads % num_kv_heads:
        raise ValueError(
            f"{where}: num_kv_heads={num_kv_heads!r} must divide num_heads={num_heads} (each group "
            f"of num_heads / num_kv_heads query heads shares one key/value head); try one of "
            f"{[g for g in range(1, num_heads + 1) if num_heads % g == 0]}"
        )
    return num_kv_heads


def score_bias_options(name: str, options: dict[str, Any] | None, bidirectional: bool) -> dict[str, Any]:
    """The options a model builds the "scores" encoding ``name`` with: the user's, plus
    ``bidirectional`` (True for an encoder's self-attention, False for a decoder's) when the
    encoding's constructor takes it, as T5's relative bias does."""
    options = dict(options or {})
    if "bidirectional" in inspect.signature(positional_class(name)).parameters:
        if "bidirectional" in options:
            raise ValueError(
                f"positional encoding {name!r}: bidirectional is set by the model (True in the encoder's "
                "self-attention, False in the decoder's), not by an option"
            )
        options["bidirectional"] = bidirectional
    return options


class Attention(Module):
    """One attention head with a scorer and a pooling chosen by name:

        scores  = scorer(queries, keys) + bias                (..., Q, K)
        weights = pooling(scores, valid_lens, mask)          (..., Q, K), rows sum to 1 (softmax)
        output  = dropout(weights) @ values                  (..., Q, dv)

    With ``scorer="scaled_dot"`` and ``pooling="softmax"`` this is D2L's (10.3 / 11.3)
    scaled dot-product attention, softmax(Q K^T / sqrt(d)) V.

    Arguments: ``scorer``, ``pooling``: registered names (``mt.plugins.scorers()`` and
    ``mt.plugins.poolings()`` list them); ``dropout``: probability of dropping an attention
    weight in training; ``query_size``, ``key_size``: feature sizes, which scorers with
    parameters (additive) need; ``scorer_options``, ``pooling_options``: dicts passed to the
    plugins' constructors.

    ``attn(queries, keys, values, valid_lens=None, mask=None, causal=False, bias=None)``:

    - queries (..., Q, dq), keys (..., K, dk), values (..., K, dv): key i pairs with value i;
    - ``valid_lens`` (integers, Tensor / array / list): (batch,) -- every query of example b
      sees the first valid_lens[b] keys -- or (batch, Q), one length per query (D2L);
    - ``mask``: bool, broadcastable to (..., Q, K), True = may attend;
    - ``causal=True``: query i may attend key j only when j <= i + (K - Q) (see
      ``causal_mask``), combined with ``mask`` by AND;
    - ``bias``: added to the scores before the pooling, broadcastable to (..., Q, K); -inf
      = may not attend. This is where a "scores" positional encoding (ALiBi, T5's relative
      bias, a sliding window) enters, so it composes with every scorer and pooling.

    A query with no key left gets all-zero weights (and a zero output), never NaN.
    ``attn.attention_weights`` keeps the last weights (before dropout), detached. What the
    scorer and the pooling receive and must return: ``minitensor/core/hookspecs.py``.
    """

    def __init__(
        self,
        scorer: str = "scaled_dot",
        pooling: str = "softmax",
        dropout: float = 0.0,
        query_size: int | None = None,
        key_size: int | None = None,
        scorer_options: dict[str, Any] | None = None,
        pooling_options: dict[str, Any] | None = None,
        dtype: DType = None,
        device: Device = None,
    ) -> None:
        super().__init__()
        self.scorer_name, self.pooling_name = scorer, pooling
        self.scorer = _build_plugin("scorer", scorer, (query_size, key_size), scorer_options, dtype, device)
        self.pooling = _build_plugin("pooling", pooling, (), pooling_options, dtype, device)
        self.dropout = Dropout(dropout)
        self.attention_weights: Tensor | None = None

    def forward(
        self,
        queries: Tensor,
        keys: Tensor,
        values: Tensor,
        valid_lens: Tensor | None = None,
        mask: Tensor | None = None,
        causal: bool = False,
        bias: Tensor | None = None,
    ) -> Tensor:
        """Attention pooling (D2L 10.3 / 11.3): f(q) = sum_i alpha(q, k_i) v_i for every query.

            scores  = scorer(queries, keys) + bias             (..., Q, K)
            weights = pooling(scores, valid_lens, mask)         (..., Q, K)
            output  = dropout(weights) @ values                 (..., Q, dv)

        queries (..., Q, dq), keys (..., K, dk), values (..., K, dv), e.g. (batch_size, num_steps,
        d); ``valid_lens``, ``mask``, ``causal`` and ``bias`` as in the class docstring. Returns the
        output (..., Q, dv) and keeps the weights (detached) in ``attention_weights``. A
        ``ShapeError`` if keys and values do not pair up, or if a plugin returns the wrong shape.
        """
        if values.shape[-2] != keys.shape[-2]:
            raise ShapeError(
                f"Attention: keys {tuple(keys.shape)} and values {tuple(values.shape)} must pair up: "
                f"{keys.shape[-2]} keys but {values.shape[-2]} values"
            )
        weights = self.weigh(self.score(queries, keys), valid_lens, mask, causal, bias)
        return self.dropout(weights) @ values

    def score(self, queries: Tensor, keys: Tensor) -> Tensor:
        """The scorer's scores (..., Q, K), checked against the contract's shape."""
        scores = self.scorer(queries, keys)
        # (shapes are tuples of ints: NumPy's broadcasting rule on them, not on tensor data)
        expected = numpy.broadcast_shapes(queries.shape[:-2], keys.shape[:-2]) + (queries.shape[-2], keys.shape[-2])
        self._check(
            "scorer",
            self.scorer_name,
            self.scorer,
            "scores",
            scores,
            expected,
            f"(..., Q, K) for queries {tuple(queries.shape)} and keys {tuple(keys.shape)}",
        )
        return scores

    def weigh(
        self,
        scores: Tensor,
        valid_lens: Tensor | None = None,
        mask: Tensor | None = None,
        causal: bool = False,
        bias: Tensor | None = None,
    ) -> Tensor:
        """Scores (..., Q, K) -> the pooling's weights, after the bias and the masks; kept
        (detached) in ``attention_weights``. Inside ``mt.autocast`` the pooling, built-in or a
        plugin, gets its scores in float32, as the softmax would take them."""
        scores = amp.in_float32(scores)
        if bias is not None:
            scores = scores + self._check_bias(bias, scores)
        valid_lens = as_tensor(valid_lens, scores)
        mask = as_tensor(mask, scores, dtype="bool")
        if causal:
            Q, K = scores.shape[-2], scores.shape[-1]
            if type(Q) is int and type(K) is int:
                allowed = _shared_causal_mask(Q, K, scores._backend)
            else:  # lengths that remember how they were computed (a tracer's): the mask must be made from them
                allowed = causal_mask(Q, K, device=scores.device)
            mask = allowed if mask is None else mask & allowed
        weights = self.pooling(scores, valid_lens=valid_lens, mask=mask)
        self._check(
            "pooling", self.pooling_name, self.pooling, "weights", weights, scores.shape, "the shape of the scores"
        )
        self.attention_weights = weights.detach()
        return weights

    @staticmethod
    def _check_bias(bias: Any, scores: Tensor) -> Tensor:
        bias = as_tensor(bias, scores, dtype=scores.dtype)
        try:
            fits = numpy.broadcast_shapes(tuple(bias.shape), tuple(scores.shape)) == tuple(scores.shape)
        except ValueError:
            fits = False
        if not fits:
            raise ShapeError(
                f"Attention: a bias of shape {tuple(bias.shape)} does not broadcast to the scores {tuple(scores.shape)}"
            )
        if bias.dtype != scores.dtype:
            raise TypeError(
                f"Attention: the bias is {bias.dtype} but the scores are {scores.dtype}; build the "
                "bias (its positional encoding) in the layer's dtype"
            )
        return bias

    @staticmethod
    def _check(
        kind: str, name: str, plugin: Module, what: str, result: Any, expected: tuple[int, ...], explanation: str
    ) -> None:
        """A plugin's output must have the contract's shape: name the plugin if it does not
        (broadcasting would otherwise turn a wrong shape into a wrong answer, silently)."""
        if not isinstance(result, Tensor):
            raise TypeError(f"{kind} {_describe(name, plugin)} returned a {type(result).__name__}, not a Tensor")
        if tuple(result.shape) != tuple(expected):
            raise ShapeError(
                f"{kind} {_describe(name, plugin)} returned {what} of shape {tuple(result.shape)}; "
                f"expected {tuple(expected)}, {explanation}"
            )

    def extra_repr(self) -> str:
        """The settings shown in the repr: the names of the scorer and the pooling."""
        return f"scorer={self.scorer_name!r}, pooling={self.pooling_name!r}"


def dot_scale(scorer: Module, d_head: int) -> float | None:
    """The scale a scorer declares for heads of size ``d_head`` (its scores are exactly
    ``scale * q . k``: capability ``dot_scale`` in minitensor/core/hookspecs.py), or None."""
    declared = getattr(scorer, "dot_scale", None)
    return None if declared is None else declared(d_head)


@contextlib.contextmanager
def plain_attention(model: Module) -> Iterator[Module]:
    """Within the ``with`` block every ``MultiHeadAttention`` in ``model`` takes the plain
    path (``fused=False``), so that each keeps its full ``attention_weights``: for drawing
    heatmaps after a pass that would otherwise stream. Grouped heads then call their
    ``Attention`` module too, with the shared keys and values repeated for every head, so that
    forward hooks on it (``mt.viz.capture``) see every layer's call. The layers' settings come
    back after."""
    layers = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
    settings = [(layer.fused, layer.heads_through_attention) for layer in layers]
    try:
        for layer in layers:
            layer.fused, layer.heads_through_attention = False, True
        yield model
    finally:
        for layer, (fused, through) in zip(layers, settings, strict=True):
            layer.fused, layer.heads_through_attention = fused, through


class MultiHeadAttention(Module):
    """Multi-head attention (Vaswani et al. 2017; D2L 11.5): h heads attend in parallel, each
    in its own learned projection of the queries, keys and values, and a last linear layer
    mixes what they found:

        head_i = attention(Q W_q^(i), K W_k^(i), V W_v^(i))      i = 1 .. h, each of size d_head
        output = concat(head_1, ..., head_h) W_o                 d_head = num_hiddens / h

    Splitting W_o into h blocks of rows W_o^(i) gives output = sum_i head_i W_o^(i): the
    "weighted sum of the heads" some summaries describe is this same map, with a matrix (not a
    number) for each weight.

    W_q, W_k, W_v (query_size / key_size / value_size -> num_hiddens) hold the projections of
    all heads side by side, as in D2L and PyTorch: one matrix product projects for every head,
    and a reshape (batch, T, num_hiddens) -> (batch, num_heads, T, d_head) separates them.
    The heads are then one batch of independent attentions -- the scorer and pooling plugins
    see (batch, num_heads, Q, d_head) tensors -- with no Python loop over heads.

    Grouped-query attention (Ainslie et al. 2023): with ``num_kv_heads=g`` only g heads of
    keys and values are projected (W_k, W_v: size -> g * d_head), and each is shared by the
    num_heads / g query heads of its group -- head i reads key/value head i // (num_heads / g).
    g = 1 is multi-query attention (Shazeer 2019); g = num_heads (the default) is the layer
    above, with the same parameters. Decoding keeps g heads in its key/value cache, so the
    cache, and the memory read at every step, shrink by num_heads / g. Plugins still see
    keys (batch, num_heads, K, d_head).

    Arguments: ``num_hiddens``, ``num_heads`` (num_hiddens % num_heads == 0); ``dropout`` on
    the attention weights; ``scorer``, ``pooling`` (registered names, with ``scorer_options``,
    ``pooling_options``); ``bias`` of the four Linear layers; ``query_size``, ``key_size``,
    ``value_size`` (default num_hiddens; keys and values of another size make
    cross-attention to, e.g., an encoder of another width); ``num_kv_heads`` (see above);
    ``positional``: a "qk" or "scores" positional encoding, by name (built with
    ``max_len`` and ``positional_options``) or already built (layers may share one, as T5's
    blocks share their bias table). A "qk" encoding (``"rotary"``), built with d_head,
    transforms the projected queries and keys of every head; a "scores" encoding
    (``"alibi"``, ``"t5_relative"``, ``"sliding_window"``), built with num_heads, adds its
    bias (num_heads, Q, K) to the scores.

    ``mha(queries, keys, values, valid_lens=None, mask=None, causal=False, q_offset=None,
    k_offset=0)``: queries (batch, Q, query_size), keys (batch, K, key_size), values
    (batch, K, value_size) -> (batch, Q, num_hiddens). ``valid_lens`` (batch,) or (batch, Q)
    is shared by all heads; ``mask`` may be (Q, K), (batch, Q, K) (shared by the heads) or
    (batch, num_heads, Q, K). ``q_offset`` / ``k_offset``: positions of the first query and
    key for the positional encoding; q_offset defaults to k_offset + K - Q (0 if negative),
    the rule ``causal`` uses: the queries are the last Q of the K positions (a decoder
    holding a cache of K - Q keys); with Q == K both start at 0.
    ``mha.cached_self_attention(X, cache)``: the same layer decoding token by token.
    ``mha.attention_weights``: (batch, num_heads, Q, K), detached (None after a streamed call).

    Streamed (fused) attention, ``fused="auto" | True | False``: with the scorer ``dot`` or
    ``scaled_dot`` and the pooling ``softmax``, the layer can compute its heads with
    ``ops.flash_attention`` (FlashAttention: the online softmax over blocks of keys), which
    never builds the (batch, num_heads, Q, K) scores and weights, so memory grows linearly
    with the sequence instead of quadratically; the result is the same to rounding, masks,
    grouped heads and "scores" encodings with ``relative = True`` (through their
    ``relative_bias`` and ``window``) included. ``True`` always streams (and says why when
    it cannot), ``False`` never does, and ``"auto"`` (the default) streams where it is
    exact and faster: Q and K both at least ``FUSED_MIN_LENGTH``, and on a GPU no dense bool
    ``mask`` (its kernels take ``valid_lens`` and ``causal``, not a mask). Dropout on the weights in
    training happens inside the stream, with the mask the plain path's ``Dropout`` would draw
    (the same seed gives the same numbers either way). A call within one tile on the CPU (Q
    and K at most ``BLOCK_Q`` and ``BLOCK_K``, no "scores" encoding) is the stream's one tile,
    which keeps its weights (``StreamPlan.keep_weights``): "auto" takes it too, and
    ``attention_weights`` holds them.
    The weights of a longer streamed call are not kept:
    ``mha.attention_weights_for(heads, rows)`` recomputes those asked for.
    """

    positional: Any  # the positional encoding (a plugin Module), or None
    _stream: StreamPlan | None  # the last streamed call's plan

    def __init__(
        self,
        num_hiddens: int,
        num_heads: int,
        dropout: float = 0.0,
        scorer: str = "scaled_dot",
        pooling: str = "softmax",
        bias: bool = False,
        query_size: int | None = None,
        key_size: int | None = None,
        value_size: int | None = None,
        positional: str | Module | None = None,
        scorer_options: dict[str, Any] | None = None,
        pooling_options: dict[str, Any] | None = None,
        positional_options: dict[str, Any] | None = None,
        max_len: int = 1000,
        num_kv_heads: int | None = None,
        fused: bool | str = "auto",
        dtype: DType = None,
        device: Device = None,
    ) -> None:
        super().__init__()
        check_fused(fused)
        num_kv_heads = check_heads(num_hiddens, num_heads, num_kv_heads)
        self.num_hiddens, self.num_heads, self.num_kv_heads = num_hiddens, num_heads, num_kv_heads
        self.head_size = num_hiddens // num_heads
        self.query_size = query_size or num_hiddens
        self.key_size = key_size or num_hiddens
        self.value_size = value_size or num_hiddens
        kv_size = num_kv_heads * self.head_size
        self.W_q = Linear(self.query_size, num_hiddens, bias=bias, dtype=dtype, device=device)
        self.W_k = Linear(self.key_size, kv_size, bias=bias, dtype=dtype, device=device)
        self.W_v = Linear(self.value_size, kv_size, bias=bias, dtype=dtype, device=device)
        self.W_o = Linear(num_hiddens, num_hiddens, bias=bias, dtype=dtype, device=device)
        self.attention = Attention(
            scorer,
            pooling,
            dropout,
            self.head_size,
            self.head_size,
            scorer_options,
            pooling_options,
            dtype=dtype,
            device=device,
        )
        self.positional_name = positional if isinstance(positional, str) else None
        if positional is None or positional == "none":
            self.positional, self.positional_kind = None, None
        else:
            self.positional_kind = self._positional_kind(positional)
            if isinstance(positional, Module):
                self.positional = positional
            else:
                size = self.num_heads if self.positional_kind == "scores" else self.head_size
                self.positional = _build_plugin(
                    "positional encoding",
                    positional,
                    (size,),
                    {"max_len": max_len, **(positional_options or {})},
                    dtype,
                    device,
                )
        self.fused = fused
        # grouped heads call self.attention with repeated keys instead of scoring per group
        # (plain_attention sets it, for the hooks of mt.viz.capture)
        self.heads_through_attention = False
        self._stream = None  # the last streamed call's plan (for attention_weights_for)
        if fused is True and self.why_not_fused():
            raise ValueError(f"MultiHeadAttention(fused=True): {self.why_not_fused()}")

    def why_not_fused(self) -> str | None:
        """Why this layer cannot stream its attention (a sentence), or None when it can (in
        training and in evaluation alike: the stream applies weight dropout itself)."""
        attention = self.attention
        if dot_scale(attention.scorer, self.head_size) is None:
            return (
                f"the scorer {attention.scorer_name!r} does not declare dot_scale (scores = scale * q . k), "
                "which the stream computes itself"
            )
        if not getattr(attention.pooling, "softmax_like", False):
            return (
                f"the pooling {attention.pooling_name!r} does not declare softmax_like = True (the masked "
                "softmax over the keys), which the online softmax computes"
            )
        if self.positional_kind == "scores" and not getattr(self.positional, "relative", False):
            name = self.positional_name or type(self.positional).__name__
            return (
                f"the score bias {name!r} is not relative (relative = True with a relative_bias table), so it "
                "exists only as a dense (Q, K) matrix"
            )
        return None

    def _streams(self, Q: int, K: int, mask: bool = False) -> bool:
        """Take the streamed path for Q queries and K keys (``mask``: with a dense bool mask)?"""
        if self.fused is False:
            return False
        if self.fused is True:
            reason = self.why_not_fused()
            if reason:
                raise ValueError(f"MultiHeadAttention(fused=True): {reason}")
            return True
        if self.why_not_fused() is not None:
            return False
        # (a "scores" encoding keeps the plain path for one tile: see _one_tile)
        return stream_pays(Q, K, self.W_q.weight._backend, mask, one_tile=self.positional_kind != "scores")

    def _one_tile(self, Q: int, K: int) -> bool:
        """Is a call of Q queries and K keys one tile of the stream on the CPU, whose weights
        the stream keeps (``StreamPlan.keep_weights``)? Then "auto" takes it: the plain path's
        arithmetic in one node, measured faster than the plain path's separate ones. A "scores"
        encoding keeps the plain path there: short sequences read its dense bias (its
        ``forward``), which ``check_incremental_decoding`` checks, not its ``relative_bias``."""
        return self.positional_kind != "scores" and fits_one_tile(Q, K, self.W_q.weight._backend)

    @staticmethod
    def _positional_kind(positional: str | Module) -> str:
        kind = positional_kind(positional)
        if kind == "inputs":
            cls = type(positional) if isinstance(positional, Module) else None
            what = f"{cls.__module__}.{cls.__qualname__}" if cls else repr(positional)
            raise ValueError(
                f"MultiHeadAttention: positional={what} has applies_to='inputs'; attention layers take \"qk\" "
                "encodings, which act on queries and keys (such as 'rotary'), and \"scores\" encodings, which "
                "bias the scores (such as 'alibi'). Add an \"inputs\" encoding to the embeddings, before the "
                "first layer, instead"
            )
        return kind

    @property
    def attention_weights(self) -> Tensor | None:
        """The last attention weights, (batch, num_heads, Q, K), detached (None before a call
        and after a streamed one: see ``attention_weights_for``)."""
        return self.attention.attention_weights

    def attention_weights_for(
        self, heads: int | Sequence[int] | None = None, rows: int | Sequence[int] | None = None
    ) -> Tensor:
        """The last call's attention weights of the query ``heads`` and ``rows`` asked for (an
        int or a list of ints each; None = all): (batch, len(heads), len(rows), K), detached.

        After a streamed call they are recomputed from what it saved, the queries, the keys
        and one log-sum-exp per row (weights = exp(score - lse)), tile by tile over the blocks
        of queries that hold the rows asked for: a heatmap of a few heads and rows of a long
        sequence needs no (Q, K) array per head. (So the layer keeps that call's queries,
        keys and log-sum-exp until its next call: O(T) memory.) After a plain call they are
        read from ``attention_weights``."""
        if self._stream is not None:
            plan = self._stream
            return Tensor._make(plan.weights(heads, rows), self.W_q.weight._backend, None)
        weights = self.attention.attention_weights
        if weights is None:
            raise RuntimeError("MultiHeadAttention.attention_weights_for: the layer has not been called yet")
        heads = pick_indices("heads", heads, weights.shape[1])
        rows = pick_indices("rows", rows, weights.shape[2])
        return weights[:, heads][:, :, rows]

    def _check_input(self, name: str, X: Tensor, size: int) -> None:
        if X.ndim != 3 or X.shape[-1] != size:
            raise ShapeError(f"MultiHeadAttention: {name} of shape {tuple(X.shape)}; expected (batch, steps, {size})")

    def project_and_split(self, W: Module, X: Tensor, num_heads: int | None = None) -> Tensor:
        """X (batch, T, size) -> W(X) split into heads: (batch, num_heads, T, d_head)
        (``num_heads`` defaults to the layer's; keys and values have num_kv_heads).

        Head i owns features i*d_head .. (i+1)*d_head - 1 of every projected position (D2L's
        ``transpose_qkv``, without folding the heads into the batch axis). The projection runs
        on X seen as one (batch * T, size) matrix: a single large BLAS product, where a
        (batch, T, size) operand would make NumPy loop over the examples, one smaller product
        each (slower; the measurement is in bench/README.md).
        """
        batch, steps, size = X.shape
        Y = W(X.reshape(batch * steps, size))
        return Y.reshape(batch, steps, num_heads or self.num_heads, self.head_size).permute(0, 2, 1, 3)

    def merge_and_project(self, heads: Tensor) -> Tensor:
        """heads (batch, num_heads, T, d_head) -> concat(head_1, ..., head_h) W_o, (batch, T, num_hiddens)."""
        batch, _, steps, _ = heads.shape
        concat = heads.permute(0, 2, 1, 3).reshape(batch * steps, self.num_hiddens)
        return self.W_o(concat).reshape(batch, steps, self.num_hiddens)

    def project(self, queries: Tensor, keys: Tensor, values: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The projected heads: q (batch, num_heads, Q, d_head); k, v (batch, num_kv_heads, K, d_head)."""
        return (
            self.project_and_split(self.W_q, queries),
            self.project_and_split(self.W_k, keys, self.num_kv_heads),
            self.project_and_split(self.W_v, values, self.num_kv_heads),
        )

    def forward(
        self,
        queries: Tensor,
        keys: Tensor,
        values: Tensor,
        valid_lens: Tensor | None = None,
        mask: Tensor | None = None,
        causal: bool = False,
        q_offset: int | None = None,
        k_offset: int = 0,
    ) -> Tensor:
        """Multi-head attention (D2L 10.5 / 11.5): h heads of attention on learned projections,
        concatenated and projected again,

            head_i = Attention(q W_q^(i), k W_k^(i), v W_v^(i)),    MultiHead(q, k, v) = [head_1; ...; head_h] W_o

        queries (batch_size, Q, query_size), keys (batch_size, K, key_size), values (batch_size, K,
        value_size) -> (batch_size, Q, num_hiddens). ``valid_lens``, ``mask``, ``causal``,
        ``q_offset`` and ``k_offset`` as in the class docstring; a ``ShapeError`` for inputs of
        another shape. The heads run as one batch (batch_size, num_heads, Q, d_head), through
        ``attend``.
        """
        self._check_input("queries", queries, self.query_size)
        self._check_input("keys", keys, self.key_size)
        self._check_input("values", values, self.value_size)
        if q_offset is None:  # the queries are the last Q of the K positions
            q_offset = max(k_offset + keys.shape[1] - queries.shape[1], 0)
        q, k, v = self.project(queries, keys, values)
        q, k = self._encode_qk(q, k, q_offset, k_offset)
        return self.attend(q, k, v, valid_lens, mask, causal, q_offset, k_offset)

    def cached_self_attention(self, X: Tensor, cache: Any = None) -> tuple[Tensor, Any]:
        """Causal self-attention for new tokens X (batch, T, num_hiddens) that follow the
        tokens held in ``cache``: what a decoder calls once per step.

        ``cache``: a key/value cache policy (the contract's "Key/value caches"; None: a new
        ``full`` cache, the policy that keeps everything). Only X is projected, at positions
        past .. past + T - 1 (past = ``cache.seen_tokens``); its keys and values go into the
        cache, and its queries attend what the cache keeps: the kept keys up to their own
        (``causal=True``: the cache is the past; the new tokens are its last T), where the
        policy's ``mask(T)`` allows. Keys enter the cache position-encoded (rotated, with a
        "qk" encoding), unless the policy declares ``reindexes = True`` (StreamingLLM's
        sinks): then they enter as projected, and the layer encodes queries and kept keys at
        the positions the policy reports, at every step. Returns (output (batch, T,
        num_hiddens), the cache, appended to).

        With the ``full`` policy this is ``self(X_all, X_all, X_all, causal=True)``'s last T
        rows with the projections of the past kept instead of recomputed: both run ``attend``,
        so a positional encoding, grouped heads and any plugin act identically in training and
        in decoding (``minitensor.testing.check_incremental_decoding`` checks it, and
        ``check_kv_cache`` checks every policy against what it stands for).
        """
        self._check_input("X", X, self.query_size)
        if cache is None:
            cache = new_cache()
        T, past = X.shape[1], cache.seen_tokens
        reindexes = getattr(cache, "reindexes", False)
        q, k, v = self.project(X, X, X)
        if not reindexes:  # the new tokens encoded where they are, once
            q, k = self._encode_qk(q, k, past, past)
        cache.append(k, v, numpy.arange(past, past + T, dtype=numpy.int64))
        cache.seen_tokens = past + T
        keys, values, positions = cache.keys(), cache.values(), cache.positions()
        check_positions(cache, positions, keys, values, T, dtypes=(k.dtype, v.dtype))
        # the new queries are the last T of the K consecutive positions (read from the keys' shape,
        # which the ONNX tracer follows, rather than from the positions array, which it cannot)
        k_offset = int(positions[0]) if len(positions) else past  # (no key at all: nothing seen, no new token)
        q_offset = k_offset + keys.shape[-2] - T
        if reindexes:
            q, keys = self._encode_qk(q, keys, q_offset, k_offset)
        elif q_offset != past:
            raise ValueError(
                f"key/value cache {type(cache).__name__}: positions() place the new tokens at {q_offset}, not at "
                f"their positions {past}..; a policy that re-indexes declares reindexes = True (see 'Key/value "
                "caches' in the plugin contract)"
            )
        mask = cache.mask(T) if hasattr(cache, "mask") else None
        return self.attend(q, keys, values, mask=mask, causal=True, q_offset=q_offset, k_offset=k_offset), cache

    def _encode_qk(self, q: Tensor, k: Tensor, q_offset: int, k_offset: int) -> tuple[Tensor, Tensor]:
        if self.positional_kind == "qk":
            return self.positional(q, k, q_offset=q_offset, k_offset=k_offset)
        return q, k

    def attend(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        valid_lens: Tensor | None = None,
        mask: Tensor | None = None,
        causal: bool = False,
        q_offset: int = 0,
        k_offset: int = 0,
    ) -> Tensor:
        """The path every call takes, training or decoding: q (batch, num_heads, Q, d_head)
        and k, v (batch, num_kv_heads, K, d_head), projected (and rotated) -> the layer's
        output (batch, Q, num_hiddens). A "scores" encoding's bias for queries at positions
        q_offset.. and keys at k_offset.. is added to the scores here."""
        Q, K = q.shape[-2], k.shape[-2]
        if mask is not None:
            mask = as_tensor(mask, q, dtype="bool")
            if mask.ndim == 3:  # (batch, Q, K): the same for every head
                mask = ops.unsqueeze(mask, 1)
        self._stream = None
        if self._streams(Q, K, mask is not None):
            return self.merge_and_project(self._attend_streamed(q, k, v, valid_lens, mask, causal, q_offset, k_offset))
        bias = None
        if self.positional_kind == "scores":
            bias = self.positional(Q, K, q_offset=q_offset, k_offset=k_offset)
        if self.num_kv_heads != self.num_heads and self.heads_through_attention:
            k, v = self._repeat_heads(k), self._repeat_heads(v)
        if k.shape[1] == self.num_heads:
            heads = self.attention(q, k, v, valid_lens=valid_lens, mask=mask, causal=causal, bias=bias)
        else:
            heads = self._attend_grouped(q, k, v, valid_lens, mask, causal, bias)
        return self.merge_and_project(heads)

    def _attend_streamed(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        valid_lens: Tensor | None,
        mask: Tensor | None,
        causal: bool,
        q_offset: int,
        k_offset: int,
    ) -> Tensor:
        """The heads by ``ops.flash_attention``: a "scores" encoding enters as its
        ``relative_bias`` table over the Q + K - 1 distances of these positions (and its
        ``window``, which lets the stream skip key blocks); grouped heads stream as they are."""
        Q, K = q.shape[-2], k.shape[-2]
        table, window = None, None
        if self.positional_kind == "scores":
            smallest = k_offset - (q_offset + Q - 1)  # the last query against the first key
            table = self.positional.relative_bias(smallest, k_offset + K - 1 - q_offset)
            window = getattr(self.positional, "window", None)
        scale = dot_scale(self.attention.scorer, self.head_size)
        keep = self._one_tile(Q, K)
        q, k, v = (amp.in_float32(x) for x in (q, k, v))  # the stream's softmax, in float32 (flash_attention)
        dropout = self.attention.dropout  # on the weights, inside the stream, as the plain path drops them
        plan = stream_plan(
            q, k, v, valid_lens, mask, causal, scale, table, window, q_offset, k_offset, keep_weights=keep,
            dropout_p=dropout.p if dropout.training else 0.0,
        )  # fmt: skip
        heads = FlashAttention.apply(q, k, v, table, plan=plan, masks=plan.masks)
        self._stream, self.attention.attention_weights = plan, None
        if plan.P is not None:  # one tile: the weights exist, kept as the plain path keeps them
            self.attention.attention_weights = Tensor._make(plan.P.reshape(q.shape[:-1] + (K,)), q._backend, None)
        return heads

    def _attend_grouped(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        valid_lens: Tensor | None,
        mask: Tensor | None,
        causal: bool,
        bias: Tensor | None,
    ) -> Tensor:
        """Grouped heads: query head i reads key/value head i // r, r = num_heads / num_kv_heads.

        Seen per group, the r query heads of a group are just r * Q queries against the same
        keys: q (batch, g, r * Q, d) is a reshape of q (batch, num_heads, Q, d), as a group's
        heads are adjacent. The weighted sum of the values is computed that way, reading each
        key/value head once instead of r copies of it; so are the scores of a scorer that
        declares ``row_wise``. Any other scorer sees keys repeated to (batch, num_heads, K, d),
        as the contract promises.
        """
        batch, H, Q, d = q.shape
        g, K = k.shape[1], k.shape[2]
        r = H // g
        attention = self.attention
        if getattr(attention.scorer, "row_wise", False):
            scores = attention.score(q.reshape(batch, g, r * Q, d), k).reshape(batch, H, Q, K)
        else:
            scores = attention.score(q, self._repeat_heads(k))
        weights = attention.weigh(scores, valid_lens, mask, causal, bias)
        heads = attention.dropout(weights).reshape(batch, g, r * Q, K) @ v
        return heads.reshape(batch, H, Q, v.shape[-1])

    def _repeat_heads(self, x: Tensor) -> Tensor:
        """Keys or values of the g key/value heads, (batch, g, K, d), as (batch, num_heads, K, d):
        each repeated for the num_heads / g query heads of its group."""
        batch, g, K, d = x.shape
        r = self.num_heads // g
        return x.unsqueeze(2).expand(batch, g, r, K, d).reshape(batch, self.num_heads, K, d)

    def extra_repr(self) -> str:
        """The settings shown in the repr: ``num_hiddens``, ``num_heads``, plus ``num_kv_heads``,
        ``positional`` and ``fused`` where they differ from the defaults."""
        s = f"num_hiddens={self.num_hiddens}, num_heads={self.num_heads}"
        if self.num_kv_heads != self.num_heads:
            s += f", num_kv_heads={self.num_kv_heads}"
        if self.positional is not None:
            s += f", positional={self.positional_name or type(self.positional).__name__!r}"
        if self.fused != "auto":
            s += f", fused={self.fused}"
        return s
