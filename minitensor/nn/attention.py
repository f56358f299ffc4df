"""Attention layers: ``Attention`` (one head) and ``MultiHeadAttention`` (D2L 11.3 - 11.5).

An attention layer pools values (v_1, ..., v_n) according to how well their keys
(k_1, ..., k_n) match each query q:

    f(q) = sum_i alpha(q, k_i) v_i,     alpha(q, k_i) = pooling(score(q, k_1), ..., score(q, k_n))_i

The two pieces are plugins, looked up by name in ``minitensor.plugins``:

- a *scorer* turns every (query, key) pair into a number: ``dot`` q.k, ``scaled_dot``
  q.k / sqrt(d), ``additive`` w_v^T tanh(W_q q + W_k k), ... (queries (..., Q, dq) and keys
  (..., K, dk) -> scores (..., Q, K));
- a *pooling* turns each row of scores into weights: ``softmax`` (weights >= 0 adding up
  to 1 over the keys a query may see), ``average``, ``sparsemax``, ...

The layer owns the rest: masking (``valid_lens``, ``mask``, ``causal``), dropout on the
weights and the weighted sum ``weights @ values``. A user's plugin registered under a new
name is then usable here, and in every model built on these layers, without other changes.
"""

import inspect

import numpy

from .. import ops
from ..creation import arange
from ..errors import ShapeError
from ..tensor import Tensor, tensor
from .dropout import Dropout
from .linear import Linear
from .module import Module


def causal_mask(num_queries, num_keys, device="cpu"):
    """The (Q, K) bool mask of causal attention: query i may attend key j when j <= i + (K - Q).

    With Q == K that is the usual lower triangle (a token sees itself and the past). With
    K > Q the queries are the *last* Q positions of the sequence: the first K - Q keys are
    a cache of earlier tokens, all in every query's past.
    """
    i = arange(num_queries, device=device).reshape(num_queries, 1)
    j = arange(num_keys, device=device)
    return j <= i + (num_keys - num_queries)


def _describe(name, plugin):
    cls = type(plugin)
    return f"{name!r} ({cls.__module__}.{cls.__qualname__})"


def _build_plugin(kind, name, args, options, dtype, device):
    """Look ``name`` up in the registry of ``kind`` and instantiate it as its contract says,
    ``cls(*args, **options)``, in the layer's dtype and on its device.

    The contract has no dtype or device: a plugin whose constructor accepts ``dtype=`` and
    ``device=`` anyway (as minitensor's layers and built-in encodings do) gets them and builds
    its tables directly in them (a float64 rotary table computed in float64, not a float32
    one converted); any other is built in float32 on the CPU and moved, like a model."""
    from .. import plugins  # on first use: the plugin machinery loads lazily

    if not isinstance(name, str):
        raise TypeError(f"the {kind} is given by its registered name (a str), got {type(name).__name__} {name!r}")
    cls = plugins.lookup(kind, name)
    options = dict(options or {})
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
        where = f"while building the {kind} {name!r} ({cls.__module__}.{cls.__qualname__}) with options {options}"
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


def _as_tensor(value, like, dtype=None):
    """valid_lens or a mask given as a list or array -> a Tensor on ``like``'s device."""
    if value is None or isinstance(value, Tensor):
        return value
    return tensor(value, dtype=dtype, device=like.device)


class Attention(Module):
    """One attention head with a scorer and a pooling chosen by name:

        scores  = scorer(queries, keys)                      (..., Q, K)
        weights = pooling(scores, valid_lens, mask)          (..., Q, K), rows sum to 1 (softmax)
        output  = dropout(weights) @ values                  (..., Q, dv)

    With ``scorer="scaled_dot"`` and ``pooling="softmax"`` this is the seeds' and D2L's
    scaled dot-product attention, softmax(Q K^T / sqrt(d)) V.

    Arguments: ``scorer``, ``pooling``: registered names (``mt.plugins.scorers()`` and
    ``mt.plugins.poolings()`` list them); ``dropout``: probability of dropping an attention
    weight in training; ``query_size``, ``key_size``: feature sizes, which scorers with
    parameters (additive) need; ``scorer_options``, ``pooling_options``: dicts passed to the
    plugins' constructors.

    ``attn(queries, keys, values, valid_lens=None, mask=None, causal=False)``:

    - queries (..., Q, dq), keys (..., K, dk), values (..., K, dv): key i pairs with value i;
    - ``valid_lens`` (integers, Tensor / array / list): (batch,) -- every query of example b
      sees the first valid_lens[b] keys -- or (batch, Q), one length per query (D2L);
    - ``mask``: bool, broadcastable to (..., Q, K), True = may attend;
    - ``causal=True``: query i may attend key j only when j <= i + (K - Q) (see
      ``causal_mask``), combined with ``mask`` by AND.

    A query with no key left gets all-zero weights (and a zero output), never NaN.
    ``attn.attention_weights`` keeps the last weights (before dropout), detached.
    """

    def __init__(self, scorer="scaled_dot", pooling="softmax", dropout=0.0, query_size=None, key_size=None,
                 scorer_options=None, pooling_options=None, dtype=None, device=None):
        super().__init__()
        self.scorer_name, self.pooling_name = scorer, pooling
        self.scorer = _build_plugin("scorer", scorer, (query_size, key_size), scorer_options, dtype, device)
        self.pooling = _build_plugin("pooling", pooling, (), pooling_options, dtype, device)
        self.dropout = Dropout(dropout)
        self.attention_weights = None

    def forward(self, queries, keys, values, valid_lens=None, mask=None, causal=False):
        Q, K = queries.shape[-2], keys.shape[-2]
        if values.shape[-2] != K:
            raise ShapeError(
                f"Attention: keys {tuple(keys.shape)} and values {tuple(values.shape)} must pair up: "
                f"{K} keys but {values.shape[-2]} values"
            )
        scores = self.scorer(queries, keys)
        # (shapes are tuples of ints: NumPy's broadcasting rule on them, not on tensor data)
        expected = numpy.broadcast_shapes(queries.shape[:-2], keys.shape[:-2]) + (Q, K)
        self._check("scorer", self.scorer_name, self.scorer, "scores", scores, expected,
                    f"(..., Q, K) for queries {tuple(queries.shape)} and keys {tuple(keys.shape)}")

        valid_lens = _as_tensor(valid_lens, scores)
        mask = _as_tensor(mask, scores, dtype="bool")
        if causal:
            allowed = causal_mask(Q, K, device=scores.device)
            mask = allowed if mask is None else mask & allowed
        weights = self.pooling(scores, valid_lens=valid_lens, mask=mask)
        self._check("pooling", self.pooling_name, self.pooling, "weights", weights, scores.shape,
                    "the shape of the scores")

        self.attention_weights = weights.detach()
        return self.dropout(weights) @ values

    @staticmethod
    def _check(kind, name, plugin, what, result, expected, explanation):
        """A plugin's output must have the contract's shape: name the plugin if it does not
        (broadcasting would otherwise turn a wrong shape into a wrong answer, silently)."""
        if not isinstance(result, Tensor):
            raise TypeError(f"{kind} {_describe(name, plugin)} returned a {type(result).__name__}, not a Tensor")
        if tuple(result.shape) != tuple(expected):
            raise ShapeError(
                f"{kind} {_describe(name, plugin)} returned {what} of shape {tuple(result.shape)}; "
                f"expected {tuple(expected)}, {explanation}"
            )

    def extra_repr(self):
        return f"scorer={self.scorer_name!r}, pooling={self.pooling_name!r}"


class MultiHeadAttention(Module):
    """Multi-head attention (Vaswani et al. 2017; D2L 11.5): h heads attend in parallel, each
    in its own learned projection of the queries, keys and values, and a last linear layer
    mixes what they found:

        head_i = attention(Q W_q^(i), K W_k^(i), V W_v^(i))      i = 1 .. h, each of size d_head
        output = concat(head_1, ..., head_h) W_o                 d_head = num_hiddens / h

    Splitting W_o into h blocks of rows W_o^(i) gives output = sum_i head_i W_o^(i): the
    seeds' "weighted sum of the heads", with a matrix for each weight.

    W_q, W_k, W_v (query_size / key_size / value_size -> num_hiddens) hold the projections of
    all heads side by side, as in D2L and PyTorch: one matrix product projects for every head,
    and a reshape (batch, T, num_hiddens) -> (batch, num_heads, T, d_head) separates them.
    The heads are then one batch of independent attentions -- the scorer and pooling plugins
    see (batch, num_heads, Q, d_head) tensors -- with no Python loop over heads.

    Arguments: ``num_hiddens``, ``num_heads`` (num_hiddens % num_heads == 0); ``dropout`` on
    the attention weights; ``scorer``, ``pooling`` (registered names, with ``scorer_options``,
    ``pooling_options``); ``bias`` of the four Linear layers; ``query_size``, ``key_size``,
    ``value_size`` (default num_hiddens; keys and values of another size make
    cross-attention to, e.g., an encoder of another width); ``positional``: the name of a
    "qk" positional encoding such as ``"rotary"``, built with d_head, ``max_len`` and
    ``positional_options`` and applied to the projected queries and keys of every head.

    ``mha(queries, keys, values, valid_lens=None, mask=None, causal=False, q_offset=None,
    k_offset=0)``: queries (batch, Q, query_size), keys (batch, K, key_size), values
    (batch, K, value_size) -> (batch, Q, num_hiddens). ``valid_lens`` (batch,) or (batch, Q)
    is shared by all heads; ``mask`` may be (Q, K), (batch, Q, K) (shared by the heads) or
    (batch, num_heads, Q, K). ``q_offset`` / ``k_offset``: positions of the first query and
    key for the positional encoding; q_offset defaults to k_offset + K - Q (0 if negative),
    the rule ``causal`` uses: the queries are the last Q of the K positions (a decoder
    holding a cache of K - Q keys); with Q == K both start at 0.
    ``mha.attention_weights``: (batch, num_heads, Q, K), detached.
    """

    def __init__(self, num_hiddens, num_heads, dropout=0.0, scorer="scaled_dot", pooling="softmax", bias=False,
                 query_size=None, key_size=None, value_size=None, positional=None, scorer_options=None,
                 pooling_options=None, positional_options=None, max_len=1000, dtype=None, device=None):
        super().__init__()
        if num_heads <= 0 or num_hiddens % num_heads:
            raise ValueError(
                f"MultiHeadAttention: num_hiddens={num_hiddens} must split evenly into num_heads={num_heads} "
                f"heads (num_hiddens % num_heads == {num_hiddens % num_heads if num_heads > 0 else 'undefined'})"
            )
        self.num_hiddens, self.num_heads = num_hiddens, num_heads
        self.head_size = num_hiddens // num_heads
        self.query_size = query_size or num_hiddens
        self.key_size = key_size or num_hiddens
        self.value_size = value_size or num_hiddens
        self.W_q = Linear(self.query_size, num_hiddens, bias=bias, dtype=dtype, device=device)
        self.W_k = Linear(self.key_size, num_hiddens, bias=bias, dtype=dtype, device=device)
        self.W_v = Linear(self.value_size, num_hiddens, bias=bias, dtype=dtype, device=device)
        self.W_o = Linear(num_hiddens, num_hiddens, bias=bias, dtype=dtype, device=device)
        self.attention = Attention(scorer, pooling, dropout, self.head_size, self.head_size,
                                   scorer_options, pooling_options, dtype=dtype, device=device)
        self.positional_name = positional
        if positional is None or positional == "none":
            self.positional = None
        else:
            self.positional = self._build_positional(positional, positional_options, max_len, dtype, device)

    def _build_positional(self, name, options, max_len, dtype, device):
        from .. import plugins

        if not isinstance(name, str):
            raise TypeError(f"positional is given by its registered name (a str), got {type(name).__name__} {name!r}")
        cls = plugins.lookup("positional encoding", name)
        if getattr(cls, "applies_to", None) != "qk":
            raise ValueError(
                f"MultiHeadAttention: positional={name!r} ({cls.__module__}.{cls.__qualname__}) has "
                f"applies_to={getattr(cls, 'applies_to', None)!r}; attention layers take \"qk\" encodings, "
                "which act on queries and keys (such as 'rotary'). Add an \"inputs\" encoding to the "
                "embeddings, before the first layer, instead"
            )
        return _build_plugin("positional encoding", name, (self.head_size,), {"max_len": max_len, **(options or {})},
                             dtype, device)

    @property
    def attention_weights(self):
        """The last attention weights, (batch, num_heads, Q, K), detached (None before a call)."""
        return self.attention.attention_weights

    def _check_input(self, name, X, size):
        if X.ndim != 3 or X.shape[-1] != size:
            raise ShapeError(
                f"MultiHeadAttention: {name} of shape {tuple(X.shape)}; expected (batch, steps, {size})"
            )

    def project_and_split(self, W, X):
        """X (batch, T, size) -> W(X) split into heads: (batch, num_heads, T, d_head).

        Head i owns features i*d_head .. (i+1)*d_head - 1 of every projected position (D2L's
        ``transpose_qkv``, without folding the heads into the batch axis). The projection runs
        on X seen as one (batch * T, size) matrix: a single large BLAS product, where a
        (batch, T, size) operand would make NumPy loop over the examples (~1.5x slower here).
        """
        batch, steps, size = X.shape
        Y = W(X.reshape(batch * steps, size))
        return Y.reshape(batch, steps, self.num_heads, self.head_size).permute(0, 2, 1, 3)

    def merge_and_project(self, heads):
        """heads (batch, num_heads, T, d_head) -> concat(head_1, ..., head_h) W_o, (batch, T, num_hiddens)."""
        batch, _, steps, _ = heads.shape
        concat = heads.permute(0, 2, 1, 3).reshape(batch * steps, self.num_hiddens)
        return self.W_o(concat).reshape(batch, steps, self.num_hiddens)

    def forward(self, queries, keys, values, valid_lens=None, mask=None, causal=False, q_offset=None, k_offset=0):
        self._check_input("queries", queries, self.query_size)
        self._check_input("keys", keys, self.key_size)
        self._check_input("values", values, self.value_size)
        q = self.project_and_split(self.W_q, queries)  # (batch, num_heads, Q, d_head)
        k = self.project_and_split(self.W_k, keys)  # (batch, num_heads, K, d_head)
        v = self.project_and_split(self.W_v, values)
        if self.positional is not None:
            if q_offset is None:  # the queries are the last Q of the K positions
                q_offset = max(k_offset + keys.shape[1] - queries.shape[1], 0)
            q, k = self.positional(q, k, q_offset=q_offset, k_offset=k_offset)
        if mask is not None:
            mask = _as_tensor(mask, queries, dtype="bool")
            if mask.ndim == 3:  # (batch, Q, K): the same for every head
                mask = ops.unsqueeze(mask, 1)
        heads = self.attention(q, k, v, valid_lens=valid_lens, mask=mask, causal=causal)
        return self.merge_and_project(heads)

    def extra_repr(self):
        s = f"num_hiddens={self.num_hiddens}, num_heads={self.num_heads}"
        if self.positional_name is not None:
            s += f", positional={self.positional_name!r}"
        return s
