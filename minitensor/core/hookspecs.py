"""The plugin contract: the hooks a minitensor plugin implements, and what each kind of plugin
class must accept and return.

This docstring is the one place the contract is written down (plugin authors depend on it).
The built-ins (``plugins/minitensor_plugins/``), the attention layers
(``minitensor/core/nn/attention.py``), the conformance kit (``minitensor/testing.py``) and the
README point here; how plugins are found and loaded is ``minitensor/core/plugins.py``'s part.

Where plugins act
-----------------
An attention layer is three exchangeable parts (D2L's attention pooling, split up)::

    scores  = scorer(queries, keys) + bias         (..., Q, K)
    weights = pooling(scores, valid_lens, mask)    (..., Q, K)
    output  = dropout(weights) @ values            (..., Q, dv)

A *scorer* turns every query-key pair into a number, a *pooling* turns each row of scores
into weights, and a *positional encoding* tells the order-blind layer where the tokens are:
added to the inputs, rotating queries and keys, or as the ``bias`` above. The layer owns
the rest: the causal mask, adding the bias, dropout on the weights and the weighted sum of
the values. (Nadaraya-Watson kernel regression, for one, is the ``kernel`` scorer followed
by the ``softmax`` pooling.)

The hooks
---------
- ``minitensor_scorers()``, ``minitensor_poolings()``, ``minitensor_positional_encodings()``:
  no parameters, each returns a dict ``{name: class}``. These three names are fixed; more
  hooks may come. Inference adds two (see "Key/value caches" and "Decoders" below):
  ``minitensor_kv_caches()`` and ``minitensor_decoders()``, the same way.
- An implementation is a function marked ``@minitensor.hookimpl`` (the same marker as
  ``minitensor.plugins.hookimpl``) and named exactly like its hook. Registration refuses a
  name that matches no hook (``minitensor_scorer``: the error names the closest hook), an
  implementation that declares a parameter, and one that gives a parameter a default value
  (pluggy alone would accept that and silently never pass the value: pluggy calls hooks with
  keyword arguments and fills only the parameters without defaults). A hook that raises, or
  returns anything but a dict, is a ``PluginError`` naming the plugin.
- The registries (``minitensor.plugins.scorers()``, ``poolings()``,
  ``positional_encodings()``, ``kv_caches()``, ``decoders()``) merge the dicts of every
  plugin. A name claimed by two plugins is an error naming both (a plugin cannot replace a
  built-in: pick a name of your own); an unknown name lists the available ones and the
  closest match. Layers, models, the command
  line and checkpoints take plugins by *name*, so a registered class works everywhere a
  built-in does; ``minitensor plugins`` lists every name with its kind and source.
- A plugin is any module or object carrying hook implementations: an entry point in the group
  ``"minitensor"`` of an installed distribution, a ``.py`` file or module named by
  ``--plugin`` (any subcommand) or ``MINITENSOR_PLUGINS=a.py,my_pkg.mod``, or
  ``minitensor.plugins.load_plugin(...)`` / ``register(...)`` from Python (the loading order,
  the switches and what happens to a broken plugin: ``minitensor/core/plugins.py``).

Rules for every plugin class
----------------------------
- It is an ``mt.nn.Module`` (a layer refuses anything else with a TypeError), built with the
  positional arguments of its kind (below) and the user's options as keyword arguments.
- Options come from the user (``scorer_options={...}``, ``pooling_options``,
  ``positional_options``; ``--scorer-opt key=value`` and the like on the command line). A
  plugin refuses an option it does not know by passing its leftover ``**options`` to
  ``minitensor.plugins.check_options(type(self), options)``, so a typo is an error rather
  than a silently ignored setting. The built-ins do.
- dtype and device: if the constructor also accepts both ``dtype=`` and ``device=`` keyword
  arguments, the layers pass theirs, so parameters and tables are created directly in them;
  otherwise the plugin is built with its own defaults (normally float32, on the CPU) and
  moved with ``.to()``, as a model is. Either way, keep every tensor the output depends on
  in a parameter or a buffer, so that ``module.to()`` converts it; a constant (a fixed
  table) belongs in a non-persistent buffer (``register_buffer(name, t,
  persistent=False)``), which moves with the module but is not saved in checkpoints.
- Outputs are Tensors in the dtype of the inputs (of the module, for the "scores" kind) and
  on their device, without NaN, and differentiable with respect to the inputs and the
  plugin's parameters: the layers train through them.
- "..." in the shapes below is any number of leading batch axes -- none, (batch,), or
  (batch, num_heads) inside ``MultiHeadAttention`` -- and examples and heads must not mix:
  changing one changes no other's output.
- ``minitensor.testing.check_scorer`` / ``check_pooling`` / ``check_positional_encoding``
  check a class against the rules of its kind (shapes, dtypes, gradients, masking, batch
  independence and the declared properties below), and ``check_incremental_decoding(
  scorer=..., pooling=..., positional=...)`` that decoding token by token with a key/value
  cache gives the full causal pass.

Scorers (``minitensor_scorers``)
--------------------------------
- Built as ``cls(query_size, key_size, **options)``, the feature sizes dq and dk.
  ``MultiHeadAttention`` passes d_head for both; ``Attention`` passes what it was given,
  which may be None (a scorer that needs the sizes, such as ``additive`` with its learned
  W_q and W_k, says so).
- ``forward(queries, keys)``: queries (..., Q, dq) and keys (..., K, dk), whose leading axes
  broadcast, -> scores (..., Q, K). ``Attention`` checks that shape and names the plugin and
  both shapes if it is wrong (broadcasting would otherwise turn a wrong shape into a wrong
  answer, silently).
- A score is any real number, an unnormalised log weight; -inf means "this key is
  impossible": every pooling gives it weight 0.
- The score of a pair (q_i, k_j) depends on that query, that key and the parameters only,
  not on the other queries and keys nor on how many there are: cached decoding scores a new
  query against the cached keys and must get what the full pass got.
- Inside ``MultiHeadAttention`` a scorer sees queries (batch, num_heads, Q, d_head) and keys
  (batch, num_heads, K, d_head), with grouped heads (``num_kv_heads``) too: the shared keys
  are repeated for it -- unless it declares ``row_wise`` (below).
- Capabilities, declared, never inferred from a name: what a fast path needs a scorer to be
  (``check_scorer`` tests that each declaration is true; the built-ins declare theirs the
  same way, and no code path tests a plugin's registered name):

  - ``row_wise = True`` (default False): score[..., i, j] depends on query row i and key
    row j alone (and the scorer's parameters), not on the other rows or on how many there
    are. With grouped heads such a scorer is called once per group, queries (batch,
    num_kv_heads, r * Q, d_head) against the group's keys (r = num_heads / num_kv_heads),
    instead of against repeated keys: the same scores, less memory. All built-in scorers
    declare it.
  - ``dot_scale(d_head) -> float or None`` (a method; absent means None): the scores are
    exactly ``scale * q . k`` for heads of size ``d_head``. Streamed attention then computes
    them itself, block by block, and never calls the scorer. ``dot`` declares 1.0 and
    ``scaled_dot`` 1 / sqrt(d_head).

Streamed attention
------------------
``MultiHeadAttention(..., fused="auto" | True | False)`` may compute its heads with
``minitensor.ops.flash_attention`` (FlashAttention: the online softmax over blocks of keys),
which never builds the (batch, num_heads, Q, K) scores. It does so only with a scorer that
declares ``dot_scale`` and a pooling that declares ``softmax_like``, whose arithmetic it does
itself (no plugin is called), and with a "scores" encoding only when it is ``relative`` (its
``relative_bias`` table, and its ``window``, replace the dense bias); any other plugin takes
the plain path, so a plugin needs nothing to work with streamed layers, and a plugin of yours
that declares these takes the streamed path exactly as a built-in does. The weights of a
streamed call are not kept (``attention_weights`` is None);
``attention_weights_for(heads, rows)`` recomputes those asked for. A short sequence (queries
and keys within one tile, on the CPU) is the stream's one tile, whose weights are kept, for
backward and as ``attention_weights``: the same declarations take it there, except with a
"scores" encoding, whose short sequences stay on the plain path and read its dense bias.

Poolings (``minitensor_poolings``)
----------------------------------
- Built as ``cls(**options)``.
- ``forward(scores, valid_lens=None, mask=None)``: scores (..., Q, K) -> weights of exactly
  that shape (checked and named, as for scorers).
- A key is *allowed* when its position is below its row's valid length, ``mask`` is True
  there and its score is not -inf. Every other key gets weight exactly 0, and its score
  must not change the other weights. A row with no allowed key gets all-zero weights: never
  NaN, never uniform. (``minitensor_plugins.poolings.allowed_keys`` implements this rule
  for a pooling to reuse; ``minitensor.ops.softmax.lens_per_row`` spreads ``valid_lens``
  over the rows as described next.)
- ``valid_lens``: None, or an integer Tensor on the scores' device (the layer converts lists
  and arrays), (batch,) -- every query of example b sees the first valid_lens[b] keys -- or
  (batch, Q), one length per query, as in D2L. The scores may have axes between batch and Q
  (multi-head attention passes (batch, num_heads, Q, K)): the first axis of ``valid_lens``
  is the batch, its last the queries, and the axes in between share the lengths.
- ``mask``: None, or a bool Tensor broadcastable to the scores as given to the pooling, True
  = may attend (the built-ins refuse another dtype with a TypeError). The layer combines
  ``causal=True`` with it by AND: query i may attend key j when j <= i + (K - Q), so the
  K - Q keys of a cache are all in the past. ``MultiHeadAttention`` accepts (Q, K),
  (batch, Q, K) or (batch, num_heads, Q, K) masks and inserts the heads axis into a
  (batch, Q, K) one before calling the pooling.
- A pooling only weighs: the layer applies dropout and takes the weighted sum of the
  values, and keeps the pooling's output (before dropout, detached) as
  ``attention_weights``.
- Inside ``mt.autocast`` (mixed precision, ``minitensor/core/amp.py``) the layer hands the
  pooling its scores in float32, whatever dtype the scorer's products gave them, as the
  softmax takes them: a pooling computes in float32 and need not know about bfloat16.
- Two optional class attributes declare properties that ``check_pooling`` then tests:
  ``sums_to_one`` (default True): every row with at least one allowed key sums to 1, as
  attention weights do (all the built-ins); False for a pooling not meant to (gated weights
  that may leave some mass unused). ``sparse`` (default False): True for a pooling that
  gives keys weight exactly 0 when others score clearly higher (``sparsemax``,
  ``entmax15`` and ``alpha_entmax`` say True; ``softmax`` and ``average`` False).
- A capability, declared like a scorer's: ``softmax_like = True`` (default False) says the
  weights are the masked softmax of the scores over the keys (``mt.masked_softmax``'s rule:
  exp(s - max) / sum over the allowed keys, 0 elsewhere, an empty row all 0), which the
  online softmax of streamed attention computes. ``check_pooling`` tests it; ``softmax``
  declares it.

Positional encodings (``minitensor_positional_encodings``)
----------------------------------------------------------
A class attribute ``applies_to`` says where the encoding acts; the layers refuse any value
but these three (a ValueError):

- ``"inputs"``: built as ``cls(num_hiddens, max_len=..., dropout=0.0, **options)``;
  ``forward(X, offset=0)`` returns X (batch, T, num_hiddens) plus the encodings of positions
  offset .. offset + T - 1 (then the encoding's own dropout). ``offset`` is the position of
  the first of the T tokens: 0 for a whole sequence, the number of tokens already decoded
  when a decoder feeds new ones. The models add it to the embeddings and build it with
  ``dropout=0.0`` (their embedding layer applies dropout itself, whatever the encoding).
  The built-in ``none`` adds nothing.
- ``"qk"``: transforms the queries and keys of every self-attention layer (``rotary``).
  ``MultiHeadAttention`` builds it with the per-head size, ``cls(d_head, max_len=...,
  **options)``; the kit also passes ``dropout=0.0``, so accept it, although dropout has no
  meaning here (the built-in ``rotary`` refuses anything but 0).
  ``forward(q, k, q_offset=0, k_offset=0)`` takes q (..., Tq, d) and k (..., Tk, d) whose
  first rows sit at positions q_offset and k_offset and returns the encoded (q, k), of the
  same shapes. It runs after the projections and before the key/value cache, which
  therefore holds encoded keys.
- ``"scores"``: an additive bias on the attention scores (``alibi``, ``t5_relative``,
  ``sliding_window``). Built as ``cls(num_heads, max_len=..., **options)`` (no
  ``dropout``). ``forward(num_queries, num_keys, q_offset=0, k_offset=0)`` returns a dense
  bias Tensor broadcastable to (batch, num_heads, Q, K), normally (num_heads, Q, K), for
  queries at positions q_offset + i and keys at k_offset + j; -inf means "may not attend".
  With a key/value cache the K - Q earlier keys sit in the cache, as for ``causal``
  (``MultiHeadAttention``'s q_offset defaults to k_offset + K - Q). The offsets shift the
  bias consistently: ``forward(Q, K, qo, ko)`` is the [:, qo:, ko:] block of
  ``forward(qo + Q, ko + K)``. The bias has the module's dtype and device (``module.to()``
  converts them). Optional class attributes:

  - ``relative`` (default False): True when the bias depends only on the distance j - i
    (key position minus query position). Such a class has a method
    ``relative_bias(min_distance, max_distance)`` returning a Tensor
    (num_heads, max_distance - min_distance + 1) whose column c is the bias at distance
    min_distance + c: the same numbers as ``forward`` in O(T) memory instead of O(T^2),
    what streamed attention reads (``MultiHeadAttention`` calls it instead of ``forward``
    when it streams, see "Streamed attention" below; the kit checks that the two agree);
  - ``window`` (default None): an int w >= 0 when keys with |j - i| > w always get -inf
    (and j = i never does); streamed attention then skips the blocks of keys beyond it;
  - ``cross`` (default False): True when the bias applies to cross-attention too; then
    ``TransformerDecoder`` builds a second instance for its encoder-decoder attention (with
    ``bidirectional=True`` where accepted) and calls it with the target positions as
    queries and the source positions, from 0, as keys.

  A constructor may accept ``bidirectional`` (as a named parameter): the Transformer models
  pass True for encoder self-attention and False for decoder and LM self-attention (setting
  it as an option of a model is an error). The models build one "scores" encoding per stack
  and share it among the blocks (T5's one table for the encoder, one for the decoder).

An encoding of any kind that cannot go past ``max_len`` raises a ValueError naming
``max_len``; the built-in score biases have no limit.

Where the pieces meet: ``mt.nn.Attention.forward(queries, keys, values, valid_lens=None,
mask=None, causal=False, bias=None)`` adds ``bias`` (broadcastable to the scores and in
their dtype, or an error) to the scores before the pooling, so a bias composes with every
scorer and pooling. ``MultiHeadAttention.attend`` -- the one path of training and cached
decoding -- computes that bias from the layer's "scores" encoding for the positions of the
queries and keys. ``positional=`` (``--positional``) names an encoding of any kind;
``input_positional=`` (``--input-positional``) adds an "inputs" one beside a "qk" or
"scores" one; ``MultiHeadAttention(positional=...)`` takes "qk" and "scores" encodings
only, by name or already built (so that layers can share one).

Key/value caches (``minitensor_kv_caches``)
-------------------------------------------
A cache *policy* decides what a self-attention layer remembers of the tokens it has seen
while a model decodes one token (or a few) at a time; the layer only calls it. Built-ins:
``full`` (every position: decoding equals recomputing the whole sequence), ``window`` (the
last ``window`` positions), ``sinks`` (StreamingLLM, Xiao et al. 2023: the first ``sinks``
positions and the last ``window``, re-indexed) and ``int8`` (every position, stored as
8-bit integers with a scale and a zero point per head and token).

- A policy is a plain class (not a Module: it holds no parameters), built as
  ``cls(**options)`` once per layer and per decoding (``model.begin_decoding(cache=name,
  cache_options={...})``, ``--cache NAME --cache-opt key=value``); it refuses an option it
  does not know with ``check_options``. Subclassing ``minitensor.nn.KVCache`` gives the
  defaults below.
- ``append(keys, values, positions)``: keys and values (batch, num_kv_heads, T, d_head) of the
  T new tokens, and ``positions``, an int64 NumPy array (T,), their positions in the text. The
  keys come position-encoded there (rotated, with a "qk" encoding such as ``rotary``). The
  policy may drop or compress what it held before, never the new tokens: the T new queries
  attend what the policy keeps after ``append``, and they are its last T entries.
- ``keys()``, ``values()``: Tensors (batch, num_kv_heads, K, d_head) in the dtype and on the
  device of what was appended (de-quantised, for a compressing policy), each its own: inside
  ``mt.autocast`` the values may be bfloat16 where a "qk" encoding made the keys float32;
  ``positions()``: int64
  NumPy array (K,), the positions the attention uses for them (a "scores" encoding's bias
  reads them), *consecutive*, the new tokens at their own: the last T.
- ``reindexes = True`` (a class attribute; default False) declares a policy that gives kept
  tokens other positions than their own (StreamingLLM's sinks close the gap they leave):
  then ``append`` receives the keys *before* the "qk" encoding, and the layer encodes the
  queries and every kept key at the positions the policy reports, at every step (the cost of
  re-indexing). ``positions()`` are then any consecutive numbers, the new queries at the last T.
- ``bytes()``: the memory the cache holds, in bytes.
- ``seen_tokens`` (an int attribute the layer keeps): how many tokens have been appended, the
  position of the next one in the text (the input encodings' offset).
- Optional: ``kept()`` -> int64 array (K,), the text positions of the kept tokens (figures
  show the cache's contents with it; ``KVCache``'s returns ``positions()``, which a
  re-indexing policy overrides); ``mask(num_new)`` -> None or a bool array (num_new, K), True = may attend: which
  kept keys each new query may see besides causality (``window`` and ``sinks`` restrict a
  chunk of several new tokens to each token's own window); ``select(indices)`` -> a new
  cache of the batch rows ``indices`` (beam search; ``KVCache`` indexes every Tensor
  attribute on its first axis); ``crop(num_tokens)``: forget every token from position
  ``num_tokens`` on (speculative decoding rolls back rejected draft tokens; ``KVCache``'s
  raises, and ``full`` and ``int8`` implement it); ``copy()`` (``KVCache``: a shallow copy,
  enough when ``append`` replaces its tensors rather than writing into them).
- ``minitensor.testing.check_kv_cache(policy, options, keeps=..., tolerance=...)`` checks a
  policy against its *definition*, ``keeps(t) -> (text positions, positions)``: which earlier
  tokens the token at t attends and where the attention places them, computed without a
  cache by the layer's forward pass (``testing.KEEPS`` holds the built-ins'; the tests run it
  for every registered scorer, pooling and positional encoding): ``full`` equals the whole
  causal pass, ``window`` the pass with a sliding-window mask, ``sinks`` its own definition,
  and a lossy policy (``int8``) stays within ``attention_error_bound`` with
  ``tolerance="bound"``; with the contract's rules (shapes, positions, ``copy``, ``select``,
  ``crop``) besides.

Decoders (``minitensor_decoders``)
----------------------------------
How the next token is chosen from the model's next-token scores: *processors* reshape the
scores, a *search* chooses. Both are plain classes built as ``cls(**options)``, each with a
class attribute ``kind``, ``"processor"`` or ``"search"``. A decoder is a chain of processors
and at most one search, named together: ``minitensor.inference.decoder("top_p", p=0.9)``,
``--decoder top_p --decoder-opt p=0.9`` (an option goes to the one piece that takes it;
``name.option=value`` when two do). Without a search the chain samples when it has a
processor and is greedy when it has none.

- A processor: ``__call__(scores, tokens) -> scores``: scores a float64 NumPy array
  (rows, vocab_size), log-probabilities or what earlier processors made of them; tokens an
  int64 array (rows, t), each row's tokens so far (the prompt included). Returns the new
  (rows, vocab_size) scores; -inf means "never this token". Another shape, NaN or +inf, or a
  row left without a finite score is a ValueError naming the processor. Built-ins:
  ``temperature``, ``top_k``, ``top_p``, ``min_p``, ``repetition_penalty``.
- A search: ``__call__(model, state, start, eos, max_len, processors, rng)`` -> one
  ``minitensor.inference.Hypothesis`` per row of ``start`` (int64 (batch, t), the first
  tokens to feed), ``model`` with the decoding API (``begin_decoding``, ``decode_step``,
  ``reorder_state``), ``processors`` the chain to apply to every step's log-probabilities,
  ``rng`` a NumPy Generator. A hypothesis's ``log_prob`` is the model's own log P, whatever
  the processors did. ``minitensor.inference.run_search`` is the loop ``greedy``, ``beam``
  and ``sample`` share, for a search to reuse. Built-ins: ``greedy``, ``beam``
  (``beam_size``, ``length_penalty``), ``sample``, ``speculative`` (``draft``: a smaller
  model with the same vocabulary; ``k``: draft tokens per round; ``sample``: the acceptance
  rule of Leviathan et al. 2023 / Chen et al. 2023 instead of greedy agreement); each also
  takes ``length_penalty``, the alpha of the reported score. Greedy speculative decoding gives
  the target's greedy output token for token; sampling speculative decoding the target's
  distribution. It decodes one sequence at a time, rolls the rejected tokens back with
  ``model.crop_state(state, num_tokens)`` (a cache policy that cannot crop is an error) and
  counts ``proposed`` and ``accepted`` draft tokens in its ``stats``.

A scorer plugin in full
-----------------------
::

    import minitensor as mt

    class Cosine(mt.nn.Module):
        "score(q, k) = <q, k> / (|q| |k|)"

        def __init__(self, query_size, key_size, **options):
            super().__init__()
            mt.plugins.check_options(type(self), options)

        def forward(self, queries, keys):  # (..., Q, d), (..., K, d) -> (..., Q, K)
            q = queries / (queries * queries).sum(axis=-1, keepdims=True).sqrt()
            k = keys / (keys * keys).sum(axis=-1, keepdims=True).sqrt()
            return q @ k.swapaxes(-1, -2)

    @mt.hookimpl
    def minitensor_scorers():
        return {"my_cosine": Cosine}  # not "cosine": that is a built-in's name
"""

from __future__ import annotations

import pluggy

hookspec = pluggy.HookspecMarker("minitensor")


@hookspec
def minitensor_scorers() -> dict[str, type]:
    """Attention scoring functions, ``{name: class}``: queries and keys -> scores (see "Scorers")."""


@hookspec
def minitensor_poolings() -> dict[str, type]:
    """Attention poolings, ``{name: class}``: scores -> weights, masks honoured (see "Poolings")."""


@hookspec
def minitensor_positional_encodings() -> dict[str, type]:
    """Positional encodings, ``{name: class}``: added to inputs, on queries and keys, or on scores."""


@hookspec
def minitensor_kv_caches() -> dict[str, type]:
    """Key/value cache policies, ``{name: class}``: what decoding keeps of the past (see "Key/value caches")."""


@hookspec
def minitensor_decoders() -> dict[str, type]:
    """Decoders, ``{name: class}``: processors of next-token scores and searches (see "Decoders")."""
