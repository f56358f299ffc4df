"""Model configurations: a model's architecture as one value.

A Transformer is described by a score of settings: its sizes (D2L's ``vocab_size``,
``num_hiddens``, ``ffn_num_hiddens``, ``num_heads``, ``num_blks``, ``dropout``), where word
order enters, the attention plugins, and a few switches. ``TransformerConfig`` holds them,
with their defaults and their checks, in one place; the encoder, the decoder, the language
model and their blocks all read the same config::

    config = mt.nn.TransformerConfig(vocab_size=28, num_hiddens=32, ffn_num_hiddens=64,
                                     num_heads=4, num_blks=2, dropout=0.1, norm_first=True)
    lm = mt.nn.TransformerLM(config)
    lm.config                           # the config it was built from
    encoder = mt.nn.TransformerEncoder(config.replace(vocab_size=40))   # another vocabulary

The models still take the settings themselves, D2L's way, and build the config from them:
``mt.nn.TransformerLM(28, 32, 64, 4, 2, 0.1, norm_first=True)`` is the model above (the six
sizes by position, the rest by name). ``Seq2SeqConfig`` does the same for the GRU decoder
with Bahdanau attention.

A config is frozen: ``config.replace(field=value)`` makes a changed copy, checked again.
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Collection, Iterable, Sequence
from dataclasses import KW_ONLY, dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from .attention import check_fused, check_heads
from .module import Module

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self, from Python 3.11 on


class _ModelConfig:
    """What the model configs share: ``replace``, and building one from a model's arguments."""

    # every config is a dataclass: what dataclasses.replace needs to know (an annotation only)
    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]

    def replace(self, **changes: Any) -> Self:
        """A copy with ``changes`` (``dataclasses.replace``), checked as a new config is; an unknown
        field is a ``TypeError`` naming the closest field."""
        _check_known(type(self), changes, f"{type(self).__name__}.replace")
        return dataclasses.replace(self, **changes)

    def require(self, owner: str, names: Iterable[str], given: bool = True) -> None:
        """Check that the fields ``names``, which ``owner`` (a class name, for the message) builds
        with, are set: the sizes have no default, since no size suits every model. ``given``:
        the caller passed this config (else it was built from ``owner``'s arguments, in the
        order ``names``, which the message then gives)."""
        names = list(names)
        for i, name in enumerate(names):
            if getattr(self, name) is None:
                how = f"set it with config.replace({name}=...)" if given else f"give it as argument {i + 1} of "
                how += "" if given else f"({', '.join(names)}) or as {name}=..."
                raise TypeError(f"{owner} needs {name}: {type(self).__name__}.{name} is None ({how})")

    @classmethod
    def from_arguments(
        cls, owner: str, config: Any, args: Sequence[Any], fields: dict[str, Any], positional: Sequence[str]
    ) -> Self:
        """The config a model was called with, in either form:

        - ``Model(config)`` (or ``Model(config=config)``): ``config`` itself;
        - ``Model(*args, **fields)``, the settings themselves: a config built from them, the
          first ones by position in the order ``positional`` (the model's old signature, e.g.
          D2L's ``vocab_size, num_hiddens, ffn_num_hiddens, num_heads, num_blks, dropout``), the
          rest by name. A model's ``config`` parameter then holds the first positional argument.

        Either way the sizes in ``positional`` must be set (``require``): they are what the
        model builds with. ``owner`` names the model in messages: an unknown name is a
        ``TypeError`` naming the closest field (``num_hidden`` -> did you mean ``num_hiddens``?)."""
        if isinstance(config, cls):
            if args or fields:
                extra = ", ".join([*map(repr, args), *fields])
                raise TypeError(f"{owner}: give a {cls.__name__} or its fields, not both (also given: {extra})")
            config.require(owner, positional)
            return config
        if config is not None or args:
            args = (config, *args)
        if len(args) > len(positional):
            raise TypeError(
                f"{owner} takes at most {len(positional)} settings by position ({', '.join(positional)}), "
                f"got {len(args)}; give the others by name, or a {cls.__name__}"
            )
        named = dict(zip(positional, args))
        twice = sorted(named.keys() & fields.keys())
        if twice:
            raise TypeError(f"{owner} got {twice[0]!r} both by position and by name")
        _check_known(cls, fields, owner)
        made = cls(**named, **fields)
        made.require(owner, positional, given=False)
        return made

    def _check(self, name: str, ok: bool, what: str, error: type[Exception] = ValueError) -> None:
        if not ok:
            raise error(f"{type(self).__name__}: {name}={getattr(self, name)!r:.80} {what}")

    def _check_sizes(self, names: Iterable[str], smallest: int = 1) -> None:
        for name in names:
            value = getattr(self, name)
            self._check(
                name, value is None or _is_integer(value) and value >= smallest, f"must be an integer >= {smallest}"
            )

    def _check_options(self, names: Iterable[str]) -> None:
        for name in names:
            value = getattr(self, name)
            self._check(name, value is None or isinstance(value, dict), "must be a dict of options or None", TypeError)

    def _check_plugin_names(self, names: Iterable[str], optional: Collection[str] = ()) -> None:
        """Plugin names: a registered name, a str (or None for those in ``optional``)."""
        for name in names:
            value = getattr(self, name)
            ok = isinstance(value, str) or value is None and name in optional
            self._check(name, ok, "must be a registered name (a str)", TypeError)


def _is_integer(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _check_known(cls: type, names: Iterable[str], owner: str) -> None:
    known = [f.name for f in dataclasses.fields(cls) if f.init]
    for name in names:
        if name not in known:
            import difflib  # on a mistake only: import minitensor stays lean

            close = difflib.get_close_matches(name, known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f" ({cls.__name__} has: {', '.join(known)})"
            raise TypeError(f"{owner} got an unexpected argument {name!r}{hint}")


@dataclass(frozen=True)
class TransformerConfig(_ModelConfig):
    """The architecture of a Transformer (D2L 11.7): what ``TransformerEncoder``,
    ``TransformerDecoder``, ``TransformerLM``, their blocks and ``TransformerEmbedding`` are
    built from. The six sizes come first and may be given by position, in D2L's order; every
    other field is given by name.

    The sizes have no default (None: not set); each model checks for those it uses -- a block
    needs no ``vocab_size`` or ``num_blks``, an embedding no ``ffn_num_hiddens``. Every other
    default is what the models have always used. The values are checked when the config is
    made: a ``ValueError`` (or ``TypeError``, for a value of the wrong kind) names the field
    and the value.
    """

    vocab_size: int | None = None
    """Tokens in the vocabulary: the rows of the embedding, the logits of the output layer."""
    num_hiddens: int | None = None
    """The width d of the model: every position is a vector of num_hiddens numbers between blocks."""
    ffn_num_hiddens: int | None = None
    """The hidden size of the position-wise FFN in every block (D2L: 2 to 4 times num_hiddens)."""
    num_heads: int | None = None
    """Attention heads in every attention layer; num_hiddens % num_heads == 0 (each head gets d / h)."""
    num_blks: int | None = None
    """Blocks in the encoder or decoder stack."""
    dropout: float | None = None
    """Dropout probability on the embeddings, the attention weights and every sublayer's output."""
    _: KW_ONLY
    max_len: int = 1000
    """The longest sequence the positional tables cover (the learned table's rows)."""
    positional: str | Module | None = "sinusoidal"
    """Where word order enters, a registered name: an "inputs" encoding (``"sinusoidal"``, D2L's;
    ``"learned"``, ``"none"``) added to the embeddings, a "qk" one (``"rotary"``) or a "scores"
    one (``"alibi"``, ``"t5_relative"``, ``"sliding_window"``) inside every self-attention. A
    block also takes one already built (a stack's, shared by its blocks), or None."""
    positional_options: dict[str, Any] | None = None
    """Options for the ``positional`` encoding's constructor (e.g. ``{"window": 4}``)."""
    input_positional: str | None = None
    """An "inputs" encoding added to the embeddings beside a "qk" or "scores" ``positional``
    (None: nothing added)."""
    use_bias: bool = False
    """Bias terms in the attention projections W_q, W_k, W_v, W_o (D2L: False)."""
    norm_first: bool = False
    """Pre-LN blocks (LayerNorm before each sublayer, and after the stack) instead of the
    book's post-LN (see ``AddNorm``)."""
    num_kv_heads: int | None = None
    """Key/value heads of grouped-query attention, a divisor of num_heads (None: num_heads,
    plain multi-head attention; 1: multi-query)."""
    scorer: str = "scaled_dot"
    """The attention scorer, a registered name (``mt.plugins.scorers()``)."""
    pooling: str = "softmax"
    """The attention pooling, a registered name (``mt.plugins.poolings()``)."""
    scorer_options: dict[str, Any] | None = None
    """Options for the scorer's constructor."""
    pooling_options: dict[str, Any] | None = None
    """Options for the pooling's constructor."""
    fused: str | bool = "auto"
    """Streamed (FlashAttention) attention: "auto", True or False (see ``MultiHeadAttention``)."""
    activation: str = "relu"
    """The FFN's nonlinearity: ``"relu"`` (D2L, the original Transformer) or ``"gelu"`` (GPT,
    BERT: x Phi(x), the exact form with the Gaussian CDF Phi)."""
    bias: bool = True
    """Bias terms in the FFN's linear layers, the LayerNorms and the output layer (False: none
    there, as nanoGPT's ``bias=False``; the attention projections follow ``use_bias``)."""
    tie_embeddings: bool = False
    """A language model's output layer reuses the token embedding's weight, logits = h E^T
    (Press and Wolf 2017; GPT-2): one (vocab_size, num_hiddens) parameter, listed once."""
    init: str = "d2l"
    """How the weights start: ``"d2l"`` (each layer's own default, PyTorch's; embeddings N(0, 1/d)
    scaled by sqrt(d)) or ``"gpt2"`` (every linear and embedding weight N(0, 0.02^2), biases 0,
    the residual projections W_o and the FFN's dense2 N(0, (0.02 / sqrt(2 num_blks))^2), and
    token embeddings added unscaled, as GPT-2 and nanoGPT do)."""

    def __post_init__(self) -> None:
        """Check every field (see the class docstring)."""
        self._check_sizes(("vocab_size", "num_hiddens", "ffn_num_hiddens", "num_heads", "max_len"))
        self._check_sizes(("num_blks",), smallest=0)
        d = self.dropout
        self._check("dropout", d is None or _is_number(d) and 0 <= d <= 1, "must be a probability in [0, 1]")
        if self.num_hiddens is not None and self.num_heads is not None:
            check_heads(self.num_hiddens, self.num_heads, self.num_kv_heads, where=type(self).__name__)
        elif self.num_kv_heads is not None:
            self._check_sizes(("num_kv_heads",))
        check_fused(self.fused, where=type(self).__name__)
        positional = self.positional
        ok = positional is None or isinstance(positional, (str, Module))
        self._check("positional", ok, "must be a registered name (a str), an encoding or None", TypeError)
        self._check_plugin_names(("scorer", "pooling", "input_positional"), optional=("input_positional",))
        self._check_options(("positional_options", "scorer_options", "pooling_options"))
        for name in ("use_bias", "norm_first"):
            self._check(name, isinstance(getattr(self, name), bool), "must be True or False", TypeError)
        for name in ("bias", "tie_embeddings"):
            self._check(name, isinstance(getattr(self, name), bool), "must be True or False", TypeError)
        self._check("activation", self.activation in ACTIVATIONS, f"must be one of {', '.join(ACTIVATIONS)}")
        self._check("init", self.init in INITS, f"must be one of {', '.join(INITS)}")


#: The FFN nonlinearities and the weight initialisations a TransformerConfig may name.
ACTIVATIONS = ("relu", "gelu")
INITS = ("d2l", "gpt2")

#: The sizes a Transformer model takes by position, in D2L's order.
TRANSFORMER_SIZES = ("vocab_size", "num_hiddens", "ffn_num_hiddens", "num_heads", "num_blks", "dropout")


@dataclass(frozen=True)
class Seq2SeqConfig(_ModelConfig):
    """The architecture of D2L's GRU decoder with attention (11.4), ``Seq2SeqAttentionDecoder``:
    D2L's five settings, by position or by name, and the attention plugins, by name. The sizes
    have no default (None: not set); the rest have the decoder's defaults: Bahdanau's additive
    attention. Values are checked when the config is made."""

    vocab_size: int | None = None
    """Tokens in the target vocabulary: the embedding's rows, the output layer's logits."""
    embed_size: int | None = None
    """The width of a token's embedding."""
    num_hiddens: int | None = None
    """The GRU's hidden size, the encoder's (the decoder starts from the encoder's state)."""
    num_layers: int | None = None
    """GRU layers, the encoder's."""
    dropout: float = 0.0
    """Dropout between GRU layers and on the attention weights."""
    _: KW_ONLY
    scorer: str = "additive"
    """The attention scorer: Bahdanau's additive w_v^T tanh(W_q q + W_k k), or any registered one."""
    pooling: str = "softmax"
    """The attention pooling, a registered name."""
    scorer_options: dict[str, Any] | None = None
    """Options for the scorer's constructor."""
    pooling_options: dict[str, Any] | None = None
    """Options for the pooling's constructor."""

    def __post_init__(self) -> None:
        """Check every field (see the class docstring)."""
        self._check_sizes(("vocab_size", "embed_size", "num_hiddens", "num_layers"))
        d = self.dropout
        self._check("dropout", _is_number(d) and 0 <= d <= 1, "must be a probability in [0, 1]")
        self._check_plugin_names(("scorer", "pooling"))
        self._check_options(("scorer_options", "pooling_options"))


#: The settings Seq2SeqAttentionDecoder takes by position, in D2L's order.
SEQ2SEQ_SIZES = ("vocab_size", "embed_size", "num_hiddens", "num_layers", "dropout")


def _is_number(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)
