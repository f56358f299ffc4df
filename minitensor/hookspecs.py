"""The hooks a minitensor plugin can implement (pluggy hook specifications).

A plugin is any module or object with functions marked ``@minitensor.hookimpl`` whose names
are the hooks below. Each hook takes no arguments and returns a dict ``{name: class}``; the
registries (``minitensor.plugins.scorers()`` ...) merge the dicts of every plugin, and layers
look classes up by name, so a user's plugin works everywhere a built-in does.

How minitensor finds a plugin (the details and the order are in ``minitensor/plugins.py``):
an entry point in the group ``"minitensor"`` of an installed distribution; a ``.py`` file or
module named by ``--plugin`` (any subcommand) or ``MINITENSOR_PLUGINS=a.py,my_pkg.mod``;
or ``minitensor.plugins.load_plugin(...)`` / ``register(...)`` from Python.

Two pluggy habits to keep in mind: hooks are always *called* with keyword arguments, and a
hook implementation must not give its parameters default values (pluggy would not pass them).
These three hooks have no parameters: an implementation that declares one is refused at
registration, and so is one that gives a parameter a default (pluggy alone would accept it and
silently never pass the value; ``minitensor.plugins`` checks for it).

Rules shared by the three kinds:

- Options come from the user (``scorer_options={...}``, ``--scorer-opt key=value``); a plugin
  should refuse one it does not know (``minitensor.plugins.check_options``), so a typo is
  an error rather than a silently ignored setting. The built-ins do.
- If the constructor also accepts ``dtype=`` and ``device=`` keyword arguments, the layers
  pass theirs (so tables and parameters are created directly in them); otherwise the
  plugin is built in float32 on the CPU and moved with ``.to()``, as a model would be.
- ``minitensor.testing.check_scorer`` / ``check_pooling`` / ``check_positional_encoding``
  check a class against its contract (shapes, gradients, masking, batch independence).
"""

import pluggy

hookspec = pluggy.HookspecMarker("minitensor")


@hookspec
def minitensor_scorers():
    """Attention scoring functions: ``{name: class}``.

    Contract: ``cls(query_size, key_size, **options)`` is an ``mt.nn.Module`` whose
    ``forward(queries, keys)`` maps queries (..., Q, dq) and keys (..., K, dk) to scores
    (..., Q, K). A score of -inf means "this key is impossible" and gets weight 0.

    Example::

        class Cosine(mt.nn.Module):
            def __init__(self, query_size, key_size, **options):
                super().__init__()
            def forward(self, queries, keys):
                q = queries / (queries * queries).sum(axis=-1, keepdims=True).sqrt()
                k = keys / (keys * keys).sum(axis=-1, keepdims=True).sqrt()
                return q @ k.swapaxes(-1, -2)

        @minitensor.hookimpl
        def minitensor_scorers():
            return {"my_cosine": Cosine}  # not "cosine": that is a built-in's name
    """


@hookspec
def minitensor_poolings():
    """Attention poolings, which turn scores into weights: ``{name: class}``.

    Contract: ``cls(**options)`` is an ``mt.nn.Module`` whose ``forward(scores,
    valid_lens=None, mask=None)`` maps scores (..., Q, K) to weights (..., Q, K). Keys beyond
    ``valid_lens`` or where ``mask`` is False get weight 0, and so do keys scored -inf; a row
    with no allowed key gets all-zero weights (never NaN, never uniform). The attention
    layer applies dropout and the weighted sum of values itself.

    - ``valid_lens``: integers, (batch,) or (batch, Q) as in D2L. The scores may have axes
      between batch and Q (multi-head attention passes (batch, num_heads, Q, K)): the first
      axis of ``valid_lens`` is the batch, its last the queries, and the axes in between
      share the lengths (``minitensor.ops.softmax.lens_per_row`` does exactly this).
    - ``mask``: bool, True = may attend, broadcastable to the scores as given to the
      pooling. ``MultiHeadAttention`` accepts (Q, K), (batch, Q, K) or (batch, num_heads,
      Q, K) masks and inserts the heads axis before calling the pooling.

    Two optional class attributes declare properties that ``check_pooling`` then tests:

    - ``sums_to_one`` (default True): every row with at least one allowed key sums to 1,
      as attention weights do (all the built-ins); set it to False for a pooling that is
      not meant to (e.g. gated weights that may leave some mass unused).
    - ``sparse`` (default False): the pooling gives keys weight exactly 0 when others score
      clearly higher (sparsemax, entmax15, alpha_entmax say True; softmax and average False).

    Example::

        @minitensor.hookimpl
        def minitensor_poolings():
            return {"softmax": SoftmaxPooling}
    """


@hookspec
def minitensor_positional_encodings():
    """Positional encodings: ``{name: class}``.

    Contract: ``cls(num_hiddens, max_len=..., dropout=0.0, **options)`` (for "scores":
    ``cls(num_heads, ...)``, below) is an ``mt.nn.Module`` with a class attribute
    ``applies_to``:

    - ``"inputs"``: ``forward(X, offset=0)`` returns X (batch, T, num_hiddens) plus the
      encodings of positions offset .. offset + T - 1 (added to the embeddings);
    - ``"qk"``: ``forward(q, k, q_offset=0, k_offset=0)`` returns the encoded (q, k), each
      (..., T, d); built with the per-head size and applied inside self-attention (rotary).
      ``dropout`` has no meaning there (the built-in ``rotary`` refuses anything but 0);
    - ``"scores"``: an additive bias on the attention scores, built as
      ``cls(num_heads, max_len=..., **options)`` (no ``dropout``; ``dtype=None, device=None``
      keyword arguments as for the built-ins). ``forward(num_queries, num_keys, q_offset=0,
      k_offset=0)`` returns a dense bias Tensor broadcastable to (batch, num_heads, Q, K),
      normally (num_heads, Q, K), for queries at positions q_offset + i and keys at
      k_offset + j; ``-inf`` means "may not attend". With a KV cache, K - Q earlier keys sit
      in the cache, as for ``causal``. Its dtype and device are the module's (``module.to()``
      converts them). Class attributes: ``relative = True`` when the bias depends only on the
      distance j - i (key position - query position), and then a method
      ``relative_bias(min_distance, max_distance)`` returns a Tensor
      (num_heads, max_distance - min_distance + 1) whose column c is the bias at distance
      min_distance + c (the same numbers as ``forward``, O(T) memory: what a streaming
      kernel uses); ``window = None`` or an int w (keys with |j - i| > w are -inf);
      ``cross = False`` unless it applies to cross-attention. A constructor may accept
      ``bidirectional``: the Transformer models pass ``bidirectional=True`` for encoder
      self-attention and ``False`` for decoder / LM self-attention to every "scores"
      encoding whose constructor accepts it (as a named parameter; setting it as an option
      of a model is an error). The models build one such encoding per stack and share it
      among the blocks (T5's one table for the encoder, one for the decoder). Built-ins:
      ``alibi``, ``t5_relative``, ``sliding_window``.

    Where the bias goes: ``mt.nn.Attention.forward(queries, keys, values, valid_lens=None,
    mask=None, causal=False, bias=None)`` adds ``bias`` (broadcastable to the scores
    (..., Q, K), the scores' dtype) to the scores before the pooling, so it composes with
    every scorer and pooling; ``MultiHeadAttention`` computes it from its "scores" encoding
    for the queries' and keys' positions, in training and in cached decoding alike.

    ``minitensor.testing.check_positional_encoding`` checks all three kinds, and
    ``minitensor.testing.check_incremental_decoding(positional=name)`` that decoding token by
    token with a key/value cache gives the full causal pass.

    Example::

        @minitensor.hookimpl
        def minitensor_positional_encodings():
            return {"sinusoidal": SinusoidalEncoding}
    """
