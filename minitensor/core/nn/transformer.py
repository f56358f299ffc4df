"""The Transformer (Vaswani et al. 2017; D2L 11.7): encoder, decoder, and a decoder-only LM.

Read it bottom-up, as the book builds it:

- ``PositionWiseFFN``: the same two-layer MLP applied at every position;
- ``AddNorm``: the residual connection and layer normalisation around each sublayer;
- ``TransformerEncoderBlock`` / ``TransformerEncoder``: self-attention + FFN, stacked;
- ``TransformerDecoderBlock`` / ``TransformerDecoder``: causal self-attention, attention
  to the encoder's outputs, FFN, stacked; with a key/value cache for decoding;
- ``EncoderDecoder``: an encoder and a decoder made into one model (D2L 10.6);
- ``TransformerLM``: decoder blocks without the encoder (GPT-style language model).

Every model and block here is built from one ``TransformerConfig`` (config.py), the
architecture as a value -- ``TransformerLM(config)`` -- or from the settings themselves, D2L's
way -- ``TransformerLM(vocab_size, num_hiddens, ffn_num_hiddens, num_heads, num_blks, dropout,
norm_first=True)`` -- which build the config. The models keep it as ``model.config``.

Three places for word order, each chosen by name (see ``minitensor_plugins/positional.py``
and ``score_biases.py``): an ``"inputs"`` encoding (``sinusoidal``, ``learned``) is added to
the embeddings; a ``"qk"`` encoding (``rotary``) is handed to every self-attention layer
instead; a ``"scores"`` encoding (``alibi``, ``t5_relative``, ``sliding_window``) is built once
per stack and biases the scores of every self-attention layer (``input_positional`` may add an
"inputs" encoding beside either of the last two).

Decoding one token at a time. In training the decoder sees the whole target sequence at
once and a causal mask hides the future. At prediction time tokens come one by one, and
recomputing every earlier position at every step would cost O(T^2) per step. Each decoder
block therefore keeps a *key/value cache*: the projected (and rotated) keys W_k x and values
W_v x of every position it has seen. A new token only needs its own projections; its query
attends the cached keys plus its own (``causal=True`` with K > Q: the cache is the past).
D2L caches the block inputs x instead (``state[2][i]``) and projects them again at every
step; a Linear layer acts position by position, so W_k [x_1; ...; x_t] = [W_k x_1; ...;
W_k x_t] and both give the same numbers -- caching the projections saves the recomputation.
The same code path runs in training (an empty cache, the whole sequence as "new tokens"),
so decoding token by token reproduces the full forward pass exactly.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from typing import Any

from ..tensor import Device, DType, Shape, Tensor, tensor
from . import init
from .attention import (
    MultiHeadAttention,
    _build_plugin,
    new_cache,
    positional_class,
    positional_kind,
    score_bias_options,
)
from .config import TRANSFORMER_SIZES, TransformerConfig
from .container import ModuleList
from .dropout import Dropout
from .linear import Embedding, Linear, check_token_batch
from .module import Module
from .normalization import LayerNorm

#: A Transformer decoder's state, D2L's list ``[enc_outputs, enc_valid_lens, caches]``: the
#: encoder's outputs (None for a language model), their valid lengths (or None) and one
#: key/value cache per block (None until the block has seen a token).
DecoderState = list[Any]


class PositionWiseFFN(Module):
    """The position-wise feed-forward network (D2L 11.7.2):

        FFN(x) = dense2(relu(dense1(x))) = max(0, x W_1 + b_1) W_2 + b_2

    applied to every position of a (batch, T, ffn_num_input) tensor with the *same* weights:
    it transforms each token's representation on its own, mixing nothing across positions.

    ``PositionWiseFFN(ffn_num_input, ffn_num_hiddens, ffn_num_outputs=None)``: D2L's
    PyTorch code uses lazy layers and writes ``PositionWiseFFN(ffn_num_hiddens,
    ffn_num_outputs)``; minitensor has no lazy layers, so the input size comes first (the
    name D2L used before lazy layers, ``ffn_num_input``). ``ffn_num_outputs`` defaults to
    ``ffn_num_input``, what a residual connection around the FFN needs.

    ``activation="gelu"``: GPT's FFN, dense2(gelu(dense1(x))), gelu(x) = x Phi(x) with Phi the
    standard normal CDF (the exact form, PyTorch's ``nn.GELU()``). ``bias=False``: no b_1, b_2.
    """

    def __init__(
        self,
        ffn_num_input: int,
        ffn_num_hiddens: int,
        ffn_num_outputs: int | None = None,
        dtype: DType = None,
        device: Device = None,
        activation: str = "relu",
        bias: bool = True,
    ) -> None:
        super().__init__()
        ffn_num_outputs = ffn_num_outputs or ffn_num_input
        self.activation = activation
        self.dense1 = Linear(ffn_num_input, ffn_num_hiddens, bias=bias, dtype=dtype, device=device)
        self.dense2 = Linear(ffn_num_hiddens, ffn_num_outputs, bias=bias, dtype=dtype, device=device)

    def forward(self, X: Tensor) -> Tensor:
        """FFN(X) = dense2(relu(dense1(X))) (or gelu): X (batch_size, num_steps, ffn_num_input) ->
        (batch_size, num_steps, ffn_num_outputs), every position on its own."""
        H = self.dense1(X)
        return self.dense2(H.gelu() if self.activation == "gelu" else H.relu())


class AddNorm(Module):
    """The residual connection followed by layer normalisation (D2L 11.7.2):

        AddNorm(X, Y) = LayerNorm(X + dropout(Y))          Y = sublayer(X)

    the "post-LN" of the original Transformer and the book (``norm_first=False``). The
    residual path lets gradients skip the sublayer; the normalisation keeps every position's
    representation at a fixed scale.

    With ``norm_first=True`` the same parameters make the "pre-LN" form (Xiong et al. 2020;
    GPT-2, PyTorch's ``norm_first``): normalise what goes *into* the sublayer and leave the
    residual path untouched,

        AddNorm(X, Y) = X + dropout(Y)                     Y = sublayer(LayerNorm(X))

    which trains deep stacks stably without a learning-rate warm-up. A block is written the
    same way for both forms: ``Y = sublayer(addnorm.sublayer_input(X)); X = addnorm(X, Y)``.
    """

    def __init__(
        self,
        norm_shape: Shape,
        dropout: float,
        norm_first: bool = False,
        dtype: DType = None,
        device: Device = None,
        bias: bool = True,
    ) -> None:
        super().__init__()
        self.norm_first = norm_first
        self.dropout = Dropout(dropout)
        self.ln = LayerNorm(norm_shape, bias=bias, dtype=dtype, device=device)

    def sublayer_input(self, X: Tensor) -> Tensor:
        """What the sublayer sees: LayerNorm(X) in pre-LN, X itself in post-LN."""
        return self.ln(X) if self.norm_first else X

    def forward(self, X: Tensor, Y: Tensor) -> Tensor:
        """The residual connection around a sublayer with output ``Y``: LayerNorm(X + dropout(Y))
        (post-LN), or X + dropout(Y) with ``norm_first=True`` (pre-LN, where the sublayer was given
        ``sublayer_input(X)``). X and Y (batch_size, num_steps, num_hiddens); output likewise."""
        if self.norm_first:
            return X + self.dropout(Y)
        return self.ln(self.dropout(Y) + X)

    def extra_repr(self) -> str:
        """The setting shown in the repr: ``norm_first=False`` (post-LN) or ``True`` (pre-LN)."""
        return f"norm_first={self.norm_first}"


def split_positional(
    positional: str | Module | None,
    input_positional: str | None = None,
    names: tuple[str, str] = ("positional=", "input_positional="),
) -> tuple[str | Module | None, str | Module | None]:
    """Where a model's positions go: (the "inputs" encoding added to the embeddings, the "qk"
    or "scores" encoding of the self-attention layers or None).

    ``positional`` may be of any kind; ``input_positional`` adds an "inputs" encoding beside
    a "qk" or "scores" one (rotary or ALiBi plus, say, learned absolute positions). ``names``:
    how the messages name the two (the command line says "--positional ")."""
    kind = None if positional is None else positional_kind(positional)
    given, extra = f"{names[0]}{positional!r}", f"{names[1]}{input_positional!r}"
    if input_positional is not None and positional_kind(input_positional) != "inputs":
        raise ValueError(
            f'{extra} has applies_to={positional_kind(input_positional)!r}; it names an "inputs" encoding '
            "added to the embeddings (such as 'sinusoidal' or 'learned')"
        )
    if positional is None:  # no encoding: a block or an embedding alone
        return input_positional, None
    if kind == "inputs":
        if input_positional not in (None, "none"):
            raise ValueError(
                f'{extra} adds an "inputs" encoding beside a "qk" or "scores" one, but {given} is an '
                '"inputs" encoding already; give one of them'
            )
        return positional, None
    return input_positional, positional


def attention_positional(
    positional: str | Module | None,
    options: dict[str, Any] | None,
    num_heads: int,
    max_len: int,
    bidirectional: bool,
    dtype: DType = None,
    device: Device = None,
) -> str | Module | None:
    """What the attention layers get for ``positional`` (a "qk" or "scores" name, a built
    encoding, or None): a "qk" name as it is (each layer builds its own rotation, a fixed
    table), a "scores" one built here, once, to be shared by the layers of a stack -- as T5
    shares one relative-bias table among the blocks of its encoder and one among those of its
    decoder. ``bidirectional``: True for an encoder, False for a decoder (see
    ``score_bias_options``)."""
    if not isinstance(positional, str) or positional_kind(positional) != "scores":
        return positional
    options = {"max_len": max_len, **score_bias_options(positional, options, bidirectional)}
    return _build_plugin("positional encoding", positional, (num_heads,), options, dtype, device)


def attention_args(config: TransformerConfig) -> dict[str, Any]:
    """What every attention layer of a Transformer takes from its config (beside its sizes and
    its positional encoding): the plugins, the projections' bias, grouped heads, streaming."""
    return dict(
        scorer=config.scorer,
        pooling=config.pooling,
        bias=config.use_bias,
        scorer_options=config.scorer_options,
        pooling_options=config.pooling_options,
        num_kv_heads=config.num_kv_heads,
        fused=config.fused,
    )


def ffn_args(config: TransformerConfig) -> dict[str, Any]:
    """What every block's FFN takes from its config beside its sizes: the nonlinearity and the bias."""
    return dict(activation=config.activation, bias=config.bias)


def gpt2_init_(model: Module, num_blks: int) -> None:
    """GPT-2's initialisation (Radford et al. 2019; nanoGPT's ``_init_weights``), in place:
    every Linear weight and Embedding table ~ N(0, 0.02^2), every Linear bias 0, and the
    projections that write into the residual stream -- attention's W_o and the FFN's dense2
    -- ~ N(0, (0.02 / sqrt(2 num_blks))^2): each block adds two of them to the stream, so the
    stream's variance grows by about 2 num_blks times that in all, not 0.02^2 per addition.
    LayerNorms keep gamma 1, beta 0; a learned positional table keeps its own N(0, 0.02^2).
    A tied weight is drawn as many times as it is reached, the last draw kept (all N(0, 0.02^2))."""
    std = 0.02
    for module in model.modules():
        if isinstance(module, (Linear, Embedding)):
            init.normal_(module.weight, 0.0, std)
            if getattr(module, "bias", None) is not None:
                init.zeros_(module.bias)
    for name, p in model.named_parameters():
        if name.endswith(("W_o.weight", "ffn.dense2.weight")):
            init.normal_(p, 0.0, std / math.sqrt(2 * num_blks))


# What the parts of a Transformer take by position in the older form (their settings, D2L's
# way, instead of a config): the sizes each one uses, which it requires.
EMBEDDING_SIZES = ("vocab_size", "num_hiddens", "dropout")
BLOCK_SIZES = ("num_hiddens", "ffn_num_hiddens", "num_heads", "dropout")


class TransformerEmbedding(Module):
    """The input layer of a Transformer (D2L 11.7.4): token embeddings scaled by sqrt(d),
    positions added, dropout:

        X = dropout(embedding(tokens) * sqrt(d) + P[offset : offset + T])     d = num_hiddens

    ``offset`` is the position of the first token: 0, or the number of tokens already
    decoded. ``positional`` names the encoding: an "inputs" one supplies P (built with
    dropout 0, since the dropout here acts with any encoding, ``"none"`` included); with a
    "qk" (rotary) or "scores" (ALiBi) one nothing is added here, as positions enter inside
    attention.

    The table starts as N(0, 1/d), so that after the sqrt(d) scaling the embeddings have
    unit scale, like the positional encodings they are added to (D2L's N(0, 1) table times
    sqrt(d) would drown the sinusoidal positions, whose values lie in [-1, 1]).

    ``TransformerEmbedding(config)`` reads ``vocab_size``, ``num_hiddens``, ``dropout``,
    ``max_len`` and the "inputs" encoding (``positional``, or ``input_positional`` beside a
    "qk" or "scores" one) from a ``TransformerConfig``. The older form
    ``TransformerEmbedding(vocab_size, num_hiddens, dropout, max_len=1000,
    positional="sinusoidal", positional_options=None)`` builds the config from its arguments.
    """

    def __init__(
        self,
        config: TransformerConfig | int | None = None,
        *sizes: float,
        dtype: DType = None,
        device: Device = None,
        **fields: Any,
    ) -> None:
        super().__init__()
        config = TransformerConfig.from_arguments("TransformerEmbedding", config, sizes, fields, EMBEDDING_SIZES)
        # the sizes are set (from_arguments required them): this line says so to mypy
        assert config.vocab_size and config.num_hiddens and config.dropout is not None
        self.num_hiddens = num_hiddens = config.num_hiddens
        self.token_embedding = Embedding(config.vocab_size, num_hiddens, dtype=dtype, device=device)
        init.normal_(self.token_embedding.weight, 0.0, num_hiddens**-0.5)
        # GPT-2's scheme adds its N(0, 0.02^2) embeddings unscaled (gpt2_init_ draws them)
        self.scale = 1.0 if config.init == "gpt2" else math.sqrt(num_hiddens)
        inputs, _ = split_positional(config.positional, config.input_positional)
        self.pos_encoding: Module | None
        if inputs is not None:
            # the options are the positional encoding's: not input_positional's
            own = config.positional_options if inputs == config.positional else None
            options = {"max_len": config.max_len, "dropout": 0.0, **(own or {})}
            self.pos_encoding = _build_plugin(
                "positional encoding",
                inputs,  # type: ignore[arg-type]  # an encoding already built (a Module) is refused there, with a message
                (num_hiddens,),
                options,
                dtype,
                device,
            )
        else:
            self.pos_encoding = None
        self.dropout = Dropout(config.dropout)

    def forward(self, tokens: Tensor, offset: int = 0) -> Tensor:
        """tokens (batch_size, num_steps) -> dropout(embedding(tokens) * sqrt(num_hiddens) + P), with
        the "inputs" encoding's positions ``offset``, ``offset + 1``, ... (nothing added for a "qk"
        or "scores" one): (batch_size, num_steps, num_hiddens)."""
        if isinstance(tokens, Tensor) and tokens.data.ndim != 2:  # (checked inline: a call per step costs)
            check_token_batch(self, tokens)
        X = self.token_embedding(tokens)
        if self.scale != 1.0:
            X = X * self.scale
        if self.pos_encoding is not None:
            X = self.pos_encoding(X, offset=offset)
        return self.dropout(X)


# -- the encoder --------------------------------------------------------------------------------
class TransformerEncoderBlock(Module):
    """One encoder block (D2L 11.7.4): multi-head self-attention, then the FFN, each wrapped
    in AddNorm:

        Y = AddNorm(X, MultiHeadAttention(X, X, X, valid_lens))
        Z = AddNorm(Y, FFN(Y))

    Every position attends every valid position of the same sequence (``valid_lens``
    (batch,) hides the padding). Input and output are (batch, T, num_hiddens).

    ``TransformerEncoderBlock(config)``: a block of the ``TransformerConfig``'s architecture
    (``vocab_size`` and ``num_blks`` are not used). Its self-attention gets the "qk"
    (``"rotary"``) or "scores" (``"alibi"``) encoding of ``config.positional``, if any, by
    name or built (the encoder builds a "scores" one once, shared by its blocks); a "scores"
    one is bidirectional here (see ``attention_positional``). The older form
    ``TransformerEncoderBlock(num_hiddens, ffn_num_hiddens, num_heads, dropout, **fields)``
    builds the config from its arguments (``positional`` then defaults to none).
    """

    def __init__(
        self,
        config: TransformerConfig | int | None = None,
        *sizes: float,
        dtype: DType = None,
        device: Device = None,
        **fields: Any,
    ) -> None:
        super().__init__()
        c = TransformerConfig.from_arguments("TransformerEncoderBlock", config, sizes, fields, BLOCK_SIZES)
        # the sizes are set (from_arguments required them): this line says so to mypy
        assert c.num_hiddens and c.ffn_num_hiddens and c.num_heads and c.dropout is not None
        _, positional = split_positional(c.positional, c.input_positional)
        positional = attention_positional(positional, c.positional_options, c.num_heads, c.max_len, True, dtype, device)
        self.attention = MultiHeadAttention(
            c.num_hiddens,
            c.num_heads,
            c.dropout,
            positional=positional,
            positional_options=c.positional_options,
            max_len=c.max_len,
            **attention_args(c),
            dtype=dtype,
            device=device,
        )
        self.addnorm1 = AddNorm(c.num_hiddens, c.dropout, c.norm_first, dtype=dtype, device=device, bias=c.bias)
        self.ffn = PositionWiseFFN(
            c.num_hiddens, c.ffn_num_hiddens, c.num_hiddens, dtype=dtype, device=device, **ffn_args(c)
        )
        self.addnorm2 = AddNorm(c.num_hiddens, c.dropout, c.norm_first, dtype=dtype, device=device, bias=c.bias)

    def forward(self, X: Tensor, valid_lens: Tensor | None = None) -> Tensor:
        """Y = AddNorm(X, MultiHeadAttention(X, X, X, valid_lens)), then AddNorm(Y, FFN(Y)) (pre-LN:
        each sublayer reads the normalised input): X (batch_size, num_steps, num_hiddens) ->
        the same shape. ``valid_lens`` (batch_size,) hides the padding keys of each sequence."""
        Z = self.addnorm1.sublayer_input(X)
        Y = self.addnorm1(X, self.attention(Z, Z, Z, valid_lens))
        return self.addnorm2(Y, self.ffn(self.addnorm2.sublayer_input(Y)))


class TransformerEncoder(Module):
    """The Transformer encoder (D2L 11.7.4): embeddings with positions, then ``num_blks``
    encoder blocks:

        X = dropout(embedding(tokens) * sqrt(num_hiddens) + P)
        X = block_n(... block_1(X, valid_lens) ..., valid_lens)      (+ LayerNorm in pre-LN)

    ``encoder(X, valid_lens=None)``: tokens (batch, T) -> (batch, T, num_hiddens).

    ``positional``: a registered name. An "inputs" encoding (``"sinusoidal"``, the book's,
    ``"learned"``, ``"none"``) is added to the embeddings; a "qk" encoding (``"rotary"``) or
    a "scores" one (``"alibi"``, ``"t5_relative"``, ``"sliding_window"``) acts in every
    block's self-attention instead -- a "scores" one built once, shared by the blocks -- and
    ``input_positional`` may then name an "inputs" encoding for the embeddings as well
    (default: none). ``num_kv_heads``: grouped-query attention in every block; ``fused``:
    streamed attention in every block, see ``MultiHeadAttention``.
    ``norm_first=True`` (pre-LN) ends with a LayerNorm, since its blocks leave the residual
    stream unnormalised. ``encoder.attention_weights``: one (batch, num_heads, T, T) tensor
    per block from the last call (D2L's list).

    ``TransformerEncoder(config)`` with a ``TransformerConfig`` (kept as ``encoder.config``),
    or the settings themselves, D2L's way: ``TransformerEncoder(vocab_size, num_hiddens,
    ffn_num_hiddens, num_heads, num_blks, dropout, **fields)``, which builds the config.
    """

    def __init__(
        self,
        config: TransformerConfig | int | None = None,
        *sizes: float,
        dtype: DType = None,
        device: Device = None,
        **fields: Any,
    ) -> None:
        super().__init__()
        c = TransformerConfig.from_arguments("TransformerEncoder", config, sizes, fields, TRANSFORMER_SIZES)
        # the sizes are set (from_arguments required them): this line says so to mypy
        assert c.num_hiddens and c.num_heads and c.num_blks is not None
        self.config, self.num_hiddens = c, c.num_hiddens
        self.embedding = TransformerEmbedding(c, dtype=dtype, device=device)
        _, in_attention = split_positional(c.positional, c.input_positional)
        # a "scores" encoding is built here, once, and every block gets the same module
        shared = attention_positional(in_attention, c.positional_options, c.num_heads, c.max_len, True, dtype, device)
        blk_config = c.replace(positional=shared)
        self.blks = ModuleList(
            TransformerEncoderBlock(blk_config, dtype=dtype, device=device) for _ in range(c.num_blks)
        )
        self.ln = LayerNorm(c.num_hiddens, bias=c.bias, dtype=dtype, device=device) if c.norm_first else None
        if c.init == "gpt2":
            gpt2_init_(self, c.num_blks)

    def forward(self, X: Tensor, valid_lens: Tensor | None = None) -> Tensor:
        """Encode the source: tokens X (batch_size, num_steps) -> (batch_size, num_steps, num_hiddens),
        embeddings with positions through every block (and a final LayerNorm in pre-LN).
        ``valid_lens`` (batch_size,): the number of real tokens of each sequence; the padding after
        them is never attended."""
        X = self.embedding(X)
        for blk in self.blks:
            X = blk(X, valid_lens)
        return X if self.ln is None else self.ln(X)

    @property
    def attention_weights(self) -> list[Tensor | None]:
        """Self-attention weights of every block from the last call, (batch, num_heads, T, T) each."""
        return [blk.attention.attention_weights for blk in self.blks]


# -- the decoder --------------------------------------------------------------------------------
class TransformerDecoderBlock(Module):
    """The ``i``-th decoder block (D2L 11.7.5): three sublayers, each wrapped in AddNorm:

        Y = AddNorm(X, causal self-attention over the past and X)       (keys from the cache)
        Z = AddNorm(Y, MultiHeadAttention(Y, enc_outputs, enc_outputs, enc_valid_lens))
        out = AddNorm(Z, FFN(Z))

    ``block(X, state) -> (out, state)`` with D2L's state ``[enc_outputs, enc_valid_lens,
    caches]``: block i reads its key/value cache ``caches[i]`` (None at first, see
    ``MultiHeadAttention.cached_self_attention``) and stores the extended one there, in place as in D2L
    (``TransformerDecoder`` hands each call a fresh list, so its callers' states stay
    valid). A query never sees a later position, so training on a whole target sequence at
    once (empty cache) and decoding it token by token give the same outputs.

    ``TransformerDecoderBlock(config, i)``: block ``i`` of the ``TransformerConfig``'s
    architecture, as for ``TransformerEncoderBlock``; ``config.positional`` ("rotary",
    "alibi") acts on the self-attention, where a "scores" encoding is unidirectional (the
    decoder never looks ahead). ``cross_attention=False`` drops the middle sublayer (and
    ignores the encoder entries of the state): the block of a decoder-only language model.
    The encoder-decoder attention gets ``cross_positional`` only: a "scores" encoding built
    for it, which ``TransformerDecoder`` supplies when the encoding's class says ``cross =
    True`` (none of the built-ins does: distances between a target and a source position
    mean little). The older form ``TransformerDecoderBlock(num_hiddens, ffn_num_hiddens,
    num_heads, dropout, i, **fields)`` builds the config from its arguments.
    """

    def __init__(
        self,
        config: TransformerConfig | int | None = None,
        *args: float,
        cross_attention: bool = True,
        cross_positional: str | Module | None = None,
        dtype: DType = None,
        device: Device = None,
        **fields: Any,
    ) -> None:
        super().__init__()
        # i follows the config, or D2L's four sizes in the older form (or comes by name)
        i = fields.pop("i", None)
        if i is None and args and (isinstance(config, TransformerConfig) or len(args) == len(BLOCK_SIZES)):
            args, i = args[:-1], args[-1]
        if i is None:
            raise TypeError("TransformerDecoderBlock needs i, the block's index (its slot in the decoder's caches)")
        c = TransformerConfig.from_arguments("TransformerDecoderBlock", config, args, fields, BLOCK_SIZES)
        # the sizes are set (from_arguments required them): this line says so to mypy
        assert c.num_hiddens and c.ffn_num_hiddens and c.num_heads and c.dropout is not None
        self.i = i
        _, positional = split_positional(c.positional, c.input_positional)
        positional = attention_positional(
            positional, c.positional_options, c.num_heads, c.max_len, False, dtype, device
        )
        attention = dict(**attention_args(c), dtype=dtype, device=device)
        self.attention1 = MultiHeadAttention(
            c.num_hiddens,
            c.num_heads,
            c.dropout,
            positional=positional,
            positional_options=c.positional_options,
            max_len=c.max_len,
            **attention,
        )
        self.addnorm1 = AddNorm(c.num_hiddens, c.dropout, c.norm_first, dtype=dtype, device=device, bias=c.bias)
        self.attention2: MultiHeadAttention | None  # the encoder-decoder attention (None: a decoder-only block)
        self.addnorm2: AddNorm | None
        if cross_attention:
            self.attention2 = MultiHeadAttention(
                c.num_hiddens, c.num_heads, c.dropout, positional=cross_positional, **attention
            )
            self.addnorm2 = AddNorm(c.num_hiddens, c.dropout, c.norm_first, dtype=dtype, device=device, bias=c.bias)
        else:
            self.attention2 = self.addnorm2 = None
        self.ffn = PositionWiseFFN(
            c.num_hiddens, c.ffn_num_hiddens, c.num_hiddens, dtype=dtype, device=device, **ffn_args(c)
        )
        self.addnorm3 = AddNorm(c.num_hiddens, c.dropout, c.norm_first, dtype=dtype, device=device, bias=c.bias)

    def forward(self, X: Tensor, state: DecoderState) -> tuple[Tensor, DecoderState]:
        """The block over X (batch_size, num_steps, num_hiddens), the positions that follow the
        cached ones: causal self-attention over the cache and X, then (unless
        ``cross_attention=False``) attention to the encoder's outputs, then the FFN, each in
        AddNorm. ``state`` is ``[enc_outputs, enc_valid_lens, caches]``; ``caches[i]`` is replaced
        by the extended key/value cache. Returns (output of X's shape, state)."""
        enc_outputs, enc_valid_lens, caches = state
        past = 0 if caches[self.i] is None else caches[self.i].seen_tokens
        X2, caches[self.i] = self.attention1.cached_self_attention(self.addnorm1.sublayer_input(X), caches[self.i])
        Y = self.addnorm1(X, X2)
        if self.attention2 is not None and self.addnorm2 is not None:
            # target positions past.. against source positions 0..: for a "scores" encoding with cross = True
            Y2 = self.attention2(
                self.addnorm2.sublayer_input(Y), enc_outputs, enc_outputs, enc_valid_lens, q_offset=past, k_offset=0
            )
            Y = self.addnorm2(Y, Y2)
        return self.addnorm3(Y, self.ffn(self.addnorm3.sublayer_input(Y))), state


def _snapshot(cache: Any) -> Any:
    """A cache policy's ``copy()`` (optional in the contract), else a shallow copy."""
    return cache.copy() if hasattr(cache, "copy") else copy.copy(cache)


def _select_rows(obj: Any, indices: Tensor) -> Any:
    """Every tensor inside ``obj`` (nested lists / tuples, None) indexed by ``indices`` along
    its first axis, the batch axis of every tensor in a Transformer decoder's state."""
    if obj is None:
        return None
    if isinstance(obj, Tensor):
        return obj[indices]
    if hasattr(obj, "select"):  # a key/value cache policy
        return obj.select(indices)
    if isinstance(obj, (list, tuple)):
        return type(obj)(_select_rows(o, indices) for o in obj)
    raise TypeError(f"reorder_state: cannot select batch rows of a {type(obj).__name__} in the state")


class TransformerDecoder(Module):
    """The Transformer decoder (D2L 11.7.5): embeddings with positions, ``num_blks``
    decoder blocks and a linear layer to vocabulary logits.

    ``state = decoder.init_state(enc_outputs, enc_valid_lens)`` is D2L's
    ``[enc_outputs, enc_valid_lens, [None] * num_blks]``, the last list holding each block's
    key/value cache. ``decoder(X, state) -> (logits (batch, T, vocab_size), new_state)``:
    X (batch, T) are the tokens that follow the cached ones -- the whole target sequence in
    training (causal masking), one token (or a few) per step when decoding. The positions
    continue from the cache: an "inputs" encoding gets ``offset`` = the number of cached
    tokens, a rotary one the same offsets inside attention. The state passed in is not
    changed (a new list is returned), so a caller may keep old states, as beam search does.

    ``decoder.reorder_state(state, indices)`` keeps (or repeats) the batch rows ``indices``.
    ``decoder.attention_weights``: [self-attention weights per block, encoder-decoder
    attention weights per block] from the last call (D2L's two lists; the second holds None
    without cross-attention).

    ``TransformerDecoder(config, cross_attention=True)`` with a ``TransformerConfig`` (kept as
    ``decoder.config``), or the settings themselves as for ``TransformerEncoder``. A "scores"
    encoding is built once for the self-attention of all blocks, unidirectional, and once more
    for their encoder-decoder attention if its class says ``cross = True``;
    ``cross_attention`` as for ``TransformerDecoderBlock``.
    """

    def __init__(
        self,
        config: TransformerConfig | int | None = None,
        *sizes: float,
        cross_attention: bool = True,
        dtype: DType = None,
        device: Device = None,
        **fields: Any,
    ) -> None:
        super().__init__()
        c = TransformerConfig.from_arguments("TransformerDecoder", config, sizes, fields, TRANSFORMER_SIZES)
        # the sizes are set (from_arguments required them): this line says so to mypy
        assert c.vocab_size and c.num_hiddens and c.num_heads and c.num_blks is not None
        if c.num_blks < 1:
            raise ValueError(f"TransformerDecoder: num_blks must be at least 1, got {c.num_blks}")
        self.config, self.num_hiddens, self.num_blks = c, c.num_hiddens, c.num_blks
        self.embedding = TransformerEmbedding(c, dtype=dtype, device=device)
        _, in_attention = split_positional(c.positional, c.input_positional)
        cross = None
        if cross_attention and in_attention is not None and getattr(positional_class(in_attention), "cross", False):
            cross = attention_positional(
                in_attention, c.positional_options, c.num_heads, c.max_len, True, dtype, device
            )
        # a "scores" encoding is built here, once, and every block gets the same module
        shared = attention_positional(in_attention, c.positional_options, c.num_heads, c.max_len, False, dtype, device)
        blk_config = c.replace(positional=shared)
        self.blks = ModuleList(
            TransformerDecoderBlock(
                blk_config, i, cross_attention=cross_attention, cross_positional=cross, dtype=dtype, device=device
            )
            for i in range(c.num_blks)
        )
        self.ln = LayerNorm(c.num_hiddens, bias=c.bias, dtype=dtype, device=device) if c.norm_first else None
        self.dense = Linear(c.num_hiddens, c.vocab_size, bias=c.bias, dtype=dtype, device=device)
        if c.tie_embeddings:  # logits = h E^T: the output layer holds the embedding's own Parameter
            self.dense.weight = self.embedding.token_embedding.weight
        if c.init == "gpt2":
            gpt2_init_(self, c.num_blks)

    def init_state(
        self,
        enc_outputs: Tensor | None,
        enc_valid_lens: Any = None,
        cache: str = "full",
        cache_options: dict[str, Any] | None = None,
    ) -> DecoderState:
        """D2L's decoder state for a new batch: ``[enc_outputs, enc_valid_lens, caches]``,
        enc_outputs (batch_size, num_steps, num_hiddens) from the encoder (None for a language
        model), enc_valid_lens (batch_size,) or None (a list or array becomes a tensor on the
        decoder's device), and an empty key/value cache per block, of the policy registered as
        ``cache`` built with ``cache_options`` ("full" keeps every position; see "Key/value
        caches" in the plugin contract)."""
        if enc_valid_lens is not None and not isinstance(enc_valid_lens, Tensor):
            # a Tensor on the encoder's device, so that reorder_state can index it
            enc_valid_lens = tensor(enc_valid_lens, device=self.dense.weight.device)
        return [enc_outputs, enc_valid_lens, [new_cache(cache, cache_options) for _ in range(self.num_blks)]]

    @staticmethod
    def num_cached_steps(state: DecoderState) -> int:
        """How many tokens the state's caches have seen: the position of the next token in the text."""
        cache = state[2][0]
        return 0 if cache is None else cache.seen_tokens

    def crop_state(self, state: DecoderState, num_tokens: int) -> DecoderState:
        """The state as it was after the first ``num_tokens`` tokens (a new one; ``state`` stays
        valid): speculative decoding takes back the draft tokens the target rejected. The cache
        policy must be able to (``full`` and ``int8`` can; ``window`` and ``sinks`` cannot)."""
        seen = self.num_cached_steps(state)
        if not 0 <= num_tokens <= seen:
            raise ValueError(f"crop_state: num_tokens must be between 0 and the {seen} tokens seen, got {num_tokens}")
        caches = [_snapshot(cache) for cache in state[2]]
        for cache in caches:
            crop = getattr(cache, "crop", None)
            if crop is None:  # optional in the contract: a policy without it cannot roll back
                raise NotImplementedError(f"{type(cache).__name__} has no crop(num_tokens): it cannot roll back")
            crop(num_tokens)
        return [state[0], state[1], caches]

    def forward(self, X: Tensor, state: DecoderState) -> tuple[Tensor, DecoderState]:
        """Decode the tokens X (batch_size, num_steps) that follow the cached ones -> (logits
        (batch_size, num_steps, vocab_size), new state): the whole shifted target in training, one
        token (or a few) per step when decoding. Positions continue from the cache; the state
        passed in is left as it was (a new list is returned)."""
        # copies of the caches, which the blocks append to: the caller's state stays valid
        state = [state[0], state[1], [None if c is None else _snapshot(c) for c in state[2]]]
        X = self.embedding(X, offset=self.num_cached_steps(state))
        for blk in self.blks:
            X, state = blk(X, state)
        if self.ln is not None:
            X = self.ln(X)
        return self.dense(X), state

    def reorder_state(self, state: DecoderState, indices: Tensor | Sequence[int]) -> DecoderState:
        """The state of the batch made of rows ``indices`` (ints, (new_batch,)) of this one;
        rows may repeat (beam search copies a source once per beam)."""
        device = self.dense.weight.device
        if isinstance(indices, Tensor):
            indices = indices.to(device=device)
        else:
            indices = tensor(indices, dtype="int64", device=device)
        return _select_rows(state, indices)

    @property
    def attention_weights(self) -> list[list[Tensor | None]]:
        """The weights of the last call: [self-attention weights per block, encoder-decoder attention
        weights per block], each (batch_size, num_heads, Q, K), detached (D2L's two lists; the
        second holds None without cross-attention)."""
        return [
            [blk.attention1.attention_weights for blk in self.blks],
            [None if blk.attention2 is None else blk.attention2.attention_weights for blk in self.blks],
        ]


# -- whole models -------------------------------------------------------------------------------
class EncoderDecoder(Module):
    """An encoder and a decoder trained as one model (D2L 10.6): the encoder reads the source,
    the decoder predicts the target one token ahead, attending the encoder's outputs.

    Training (teacher forcing: the decoder's input is the target shifted right by ``<bos>``)::

        logits = model(enc_X, dec_X, enc_valid_lens)      # (batch, T, vocab_size)

    Decoding, one step at a time (what greedy and beam search call)::

        state = model.begin_decoding(enc_X, enc_valid_lens)   # runs the encoder once
        logits, state = model.decode_step(tokens, state)      # tokens (batch, t) -> logits (batch, t, vocab)
        state = model.reorder_state(state, indices)           # keep / repeat batch rows

    ``decode_step`` feeds the tokens that follow those already decoded (first ``<bos>``,
    then each chosen token) and returns logits for each of them; the next token's
    distribution is ``logits[:, -1]``. States are values: ``decode_step`` and
    ``reorder_state`` return new ones and leave their argument usable.

    Any D2L-style pair works: ``encoder(enc_X, enc_valid_lens)`` returns what
    ``decoder.init_state(enc_outputs, enc_valid_lens)`` takes, and ``decoder(X, state)``
    returns ``(outputs, state)``. ``reorder_state`` needs ``decoder.reorder_state``, since
    only the decoder knows where the batch axis of its state is.
    """

    def __init__(self, encoder: Module, decoder: Module) -> None:
        super().__init__()
        self.encoder, self.decoder = encoder, decoder

    def forward(self, enc_X: Tensor, dec_X: Tensor, enc_valid_lens: Tensor | None = None) -> Tensor:
        """Training with teacher forcing: encode ``enc_X`` (batch_size, num_steps) once, then decode
        ``dec_X`` (batch_size, T), the target shifted right by ``<bos>``, in one call -> logits
        (batch_size, T, vocab_size) for the next token at every position."""
        state = self.begin_decoding(enc_X, enc_valid_lens)
        return self.decoder(dec_X, state)[0]

    def begin_decoding(
        self,
        enc_X: Tensor,
        enc_valid_lens: Tensor | None = None,
        cache: str | None = None,
        cache_options: dict[str, Any] | None = None,
    ) -> Any:
        """Run the encoder on ``enc_X`` (batch_size, num_steps) and return the decoder's initial
        state, ``decoder.init_state(encoder(enc_X, enc_valid_lens), enc_valid_lens)``; ``cache``
        and ``cache_options`` name the key/value cache policy, for a decoder that has caches
        (``TransformerDecoder``)."""
        enc_outputs = self.encoder(enc_X, enc_valid_lens)
        if cache is None and cache_options is None:  # any D2L-style decoder
            return self.decoder.init_state(enc_outputs, enc_valid_lens)
        return self.decoder.init_state(enc_outputs, enc_valid_lens, cache or "full", cache_options)

    def crop_state(self, state: Any, num_tokens: int) -> Any:
        """The decoder's state after the first ``num_tokens`` target tokens only
        (``TransformerDecoder.crop_state``); a ``TypeError`` if the decoder has none."""
        crop = getattr(self.decoder, "crop_state", None)
        if crop is None:
            raise TypeError(f"{type(self.decoder).__name__} has no crop_state(state, num_tokens)")
        return crop(state, num_tokens)

    def decode_step(self, tokens: Tensor, state: Any) -> tuple[Tensor, Any]:
        """Feed ``tokens`` (batch_size, t), those that follow the ones already decoded -> (logits
        (batch_size, t, vocab_size), new state); the next token's distribution is ``logits[:, -1]``."""
        return self.decoder(tokens, state)

    def reorder_state(self, state: Any, indices: Tensor | Sequence[int]) -> Any:
        """The state of the batch made of rows ``indices`` of this one (rows may repeat: beam search
        keeps one row per hypothesis), by ``decoder.reorder_state``; a ``TypeError`` if the decoder
        has none."""
        reorder = getattr(self.decoder, "reorder_state", None)
        if reorder is None:
            raise TypeError(
                f"{type(self.decoder).__name__} has no reorder_state(state, indices); define one that selects "
                "the batch rows `indices` of every tensor in its state"
            )
        return reorder(state, indices)


class TransformerLM(Module):
    """A decoder-only Transformer language model (GPT, Radford et al. 2018): decoder blocks
    without encoder-decoder attention, each token predicting the next one.

        logits = lm(X)                  # X (batch, T) -> (batch, T, vocab_size), causal

    Generation, with the same API as ``EncoderDecoder``::

        state = lm.begin_decoding()                    # an empty cache, any batch size
        logits, state = lm.decode_step(prompt, state)  # the prompt (batch, t) in one step
        logits, state = lm.decode_step(next_tokens, state)   # then (batch, 1) per step
        state = lm.reorder_state(state, indices)

    ``TransformerLM(config)`` with a ``TransformerConfig`` (kept as ``lm.config``), or the
    settings themselves as for ``TransformerDecoder``, which it is, with
    ``cross_attention=False``. ``lm.attention_weights``: the self-attention weights of every
    block from the last call.
    """

    def __init__(
        self,
        config: TransformerConfig | int | None = None,
        *sizes: float,
        dtype: DType = None,
        device: Device = None,
        **fields: Any,
    ) -> None:
        super().__init__()
        self.config = TransformerConfig.from_arguments("TransformerLM", config, sizes, fields, TRANSFORMER_SIZES)
        self.decoder = TransformerDecoder(self.config, cross_attention=False, dtype=dtype, device=device)

    def forward(self, X: Tensor) -> Tensor:
        """Next-token logits for every position: tokens X (batch_size, num_steps) -> (batch_size,
        num_steps, vocab_size), each position seeing only itself and the past (causal)."""
        return self.decoder(X, self.begin_decoding())[0]

    def begin_decoding(self, cache: str = "full", cache_options: dict[str, Any] | None = None) -> DecoderState:
        """An empty state for generation (no encoder, an empty key/value cache per block, of the
        policy ``cache`` with ``cache_options``), for any batch size: the first ``decode_step``
        fixes it."""
        return self.decoder.init_state(None, None, cache, cache_options)

    def crop_state(self, state: DecoderState, num_tokens: int) -> DecoderState:
        """The state after the first ``num_tokens`` tokens only (``TransformerDecoder.crop_state``)."""
        return self.decoder.crop_state(state, num_tokens)

    def decode_step(self, tokens: Tensor, state: DecoderState) -> tuple[Tensor, DecoderState]:
        """Feed ``tokens`` (batch_size, t) that follow the cached ones -- the prompt at once, then one
        token per step -> (logits (batch_size, t, vocab_size), new state)."""
        return self.decoder(tokens, state)

    def reorder_state(self, state: DecoderState, indices: Tensor | Sequence[int]) -> DecoderState:
        """The state of the batch made of rows ``indices`` of this one (rows may repeat), as beam
        search or sampling several continuations needs."""
        return self.decoder.reorder_state(state, indices)

    @property
    def attention_weights(self) -> list[Tensor | None]:
        """The self-attention weights of every block from the last call, (batch_size, num_heads, Q, K)
        each, detached."""
        return self.decoder.attention_weights[0]
