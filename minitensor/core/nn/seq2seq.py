"""Sequence to sequence with GRUs and Bahdanau attention (D2L 10.7 and 11.4), where additive
attention was born (Bahdanau, Cho and Bengio 2014).

- ``Seq2SeqEncoder``: embedding + GRU over the source tokens;
- ``Seq2SeqDecoder``: D2L's decoder without attention (10.7), the baseline: the encoder's
  last state, one fixed context vector, joins every input token's embedding;
- ``Seq2SeqAttentionDecoder``: at every step, the decoder's state (the query) attends the
  encoder's outputs (keys = values), and the context it gets joins the token's embedding as
  the GRU's input;
- ``Seq2Seq``: the two as one model (D2L's name for an ``EncoderDecoder`` of RNNs).

Without attention (D2L 10.7) the decoder sees the source only through the encoder's last
state: one vector for a whole sentence. With it, every output step picks the source
positions it needs, and ``decoder.attention_weights`` shows which ones it picked.

The decoder works as the Transformer decoder does, so the same training loop, greedy and
beam search drive both:

    state = decoder.init_state(encoder(enc_X, enc_valid_lens), enc_valid_lens)
    logits, state = decoder(dec_X, state)      # dec_X (batch, T): the whole target (teacher
                                               # forcing) or the next token, (batch, 1)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from ..errors import ShapeError
from ..ops import concat
from ..tensor import Device, DType, Tensor, tensor
from . import init
from .attention import Attention
from .config import SEQ2SEQ_SIZES, Seq2SeqConfig
from .linear import Embedding, Linear, check_token_batch
from .module import Module
from .rnn import GRU
from .transformer import EncoderDecoder


def init_seq2seq(module: Module) -> None:
    """D2L's ``init_seq2seq``: Xavier-uniform weights for Linear and GRU layers, so the
    signal keeps its scale through the recurrence from the first step
    (``module.apply(init_seq2seq)`` for a whole model)."""
    if isinstance(module, Linear):
        init.xavier_uniform_(module.weight)
    if isinstance(module, GRU):
        for name, param in module.named_parameters(recurse=False):
            if name.startswith("weight"):
                init.xavier_uniform_(param)


class Seq2SeqEncoder(Module):
    """D2L's RNN encoder: tokens -> embeddings -> a multi-layer GRU.

    ``encoder(X, valid_lens=None) -> (outputs, state)``: X (batch, num_steps) token ids;
    outputs (num_steps, batch, num_hiddens), the last layer's state at every step (time-major,
    as the GRU gives them); state (num_layers, batch, num_hiddens), every layer's last state.
    ``valid_lens`` is accepted for the common encoder signature and not used, as in D2L: the
    GRU also reads the padding at the end of short sequences; the attention decoder ignores
    those positions through ``enc_valid_lens``.
    """

    def __init__(
        self,
        vocab_size: int,
        embed_size: int,
        num_hiddens: int,
        num_layers: int,
        dropout: float = 0.0,
        dtype: DType = None,
        device: Device = None,
    ) -> None:
        super().__init__()
        self.embedding = Embedding(vocab_size, embed_size, dtype=dtype, device=device)
        self.rnn = GRU(embed_size, num_hiddens, num_layers, dropout, dtype=dtype, device=device)
        self.apply(init_seq2seq)

    def forward(self, X: Tensor, valid_lens: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """tokens X (batch_size, num_steps) -> (outputs (num_steps, batch_size, num_hiddens), state
        (num_layers, batch_size, num_hiddens)): the embeddings run through the GRU, time-major.
        ``valid_lens`` is accepted and ignored (D2L's encoder signature)."""
        check_token_batch(self, X)
        embs = self.embedding(X).swapaxes(0, 1)  # (num_steps, batch, embed_size)
        return self.rnn(embs)


def _check_encoder_state(decoder: Module, hidden_state: Tensor) -> None:
    """The decoder's GRU starts from the encoder's state, so their layers and widths must agree:
    say so by name here rather than as a broadcast or GRU shape error steps later."""
    expected = (decoder.num_layers, decoder.num_hiddens)
    if hidden_state.ndim != 3 or (hidden_state.shape[0], hidden_state.shape[2]) != expected:
        raise ShapeError(
            f"{type(decoder).__name__}.init_state: the encoder's state has shape {tuple(hidden_state.shape)}, "
            f"expected (num_layers={decoder.num_layers}, batch_size, num_hiddens={decoder.num_hiddens}): "
            "build the encoder and the decoder with the same num_layers and num_hiddens"
        )


class DecoderState(NamedTuple):
    """The attention-free decoder's state: context (batch, num_hiddens), the encoder's last-layer
    final state, the same at every step; hidden_state (num_layers, batch, num_hiddens), the GRU's."""

    context: Tensor
    hidden_state: Tensor


class Seq2SeqDecoder(Module):
    """D2L's ``Seq2SeqDecoder`` (10.7; zh 9.7): the RNN decoder *without* attention, the
    baseline that Bahdanau attention improves on. With h_T^{(L)} the encoder's last layer's
    final state -- the context c, one vector for the whole source -- and s_0 the encoder's
    final state (every layer's):

        c       = h_T^{(L)}                            fixed: the same at every step
        s_t     = GRU([embed(y_{t-1}); c], s_{t-1})    the context joins every input token
        logit_t = dense(s_t^{(L)})                     (vocab_size,)

    Everything the decoder ever learns about the source has passed through c and s_0, vectors
    of ``num_hiddens`` numbers, however long the source is: the bottleneck of the
    encoder-decoder (Cho et al. 2014; Bahdanau, Cho and Bengio 2014).

    ``Seq2SeqDecoder(vocab_size, embed_size, num_hiddens, num_layers, dropout=0.0)``, D2L's
    settings; num_layers and num_hiddens must match the encoder's. Same protocol as
    ``Seq2SeqAttentionDecoder``, so the same training loop, greedy and beam search drive it:
    ``init_state((enc_outputs, enc_state), enc_valid_lens=None) -> DecoderState``
    (``enc_valid_lens`` is accepted and not used: D2L's encoder also reads the padding);
    ``decoder(X, state) -> (logits (batch, T, vocab_size), new_state)`` for X (batch, T), the
    whole shifted target (teacher forcing, one GRU call) or one token per call when decoding;
    the state passed in is not changed.
    """

    def __init__(
        self,
        vocab_size: int,
        embed_size: int,
        num_hiddens: int,
        num_layers: int,
        dropout: float = 0.0,
        dtype: DType = None,
        device: Device = None,
    ) -> None:
        super().__init__()
        self.num_hiddens, self.num_layers = num_hiddens, num_layers
        self.embedding = Embedding(vocab_size, embed_size, dtype=dtype, device=device)
        self.rnn = GRU(embed_size + num_hiddens, num_hiddens, num_layers, dropout, dtype=dtype, device=device)
        self.dense = Linear(num_hiddens, vocab_size, dtype=dtype, device=device)
        self.apply(init_seq2seq)

    def init_state(self, enc_outputs: tuple[Tensor, Tensor], enc_valid_lens: Any = None) -> DecoderState:
        """From the encoder's ``(outputs, state)``: the context, the last layer's final state
        ``state[-1]`` (D2L's ``enc_output[-1]``, the same numbers), and the whole ``state`` as the
        GRU's first. ``enc_valid_lens`` is not used."""
        _, hidden_state = enc_outputs
        _check_encoder_state(self, hidden_state)
        return DecoderState(hidden_state[-1], hidden_state)

    def forward(self, X: Tensor, state: DecoderState) -> tuple[Tensor, DecoderState]:
        """Decode the tokens X (batch_size, T): every embedding gets the context appended, the
        GRU runs over all T steps in one call (the context needs no step's output), dense gives
        the logits. Returns (logits (batch_size, T, vocab_size), new state); the state passed in
        is not changed."""
        context, H = state
        check_token_batch(self, X)
        embs = self.embedding(X).swapaxes(0, 1)  # (T, batch, embed_size)
        steps, batch = embs.shape[:2]
        contexts = context.unsqueeze(0).broadcast_to(steps, batch, self.num_hiddens)  # c at every step
        outputs, H = self.rnn(concat([embs, contexts], axis=-1), H)
        logits = self.dense(outputs)  # (T, batch, vocab_size)
        return logits.swapaxes(0, 1), DecoderState(context, H)

    def reorder_state(self, state: DecoderState, indices: Tensor | Sequence[int]) -> DecoderState:
        """The state of the batch made of rows ``indices`` of this one (beam search)."""
        context, H = state
        if not isinstance(indices, Tensor):
            indices = tensor(indices, dtype="int64", device=context.device)
        return DecoderState(context[indices], H[:, indices])


class AttentionDecoderState(NamedTuple):
    """The Bahdanau decoder's state (D2L's list, with names):
    enc_outputs (batch, num_enc_steps, num_hiddens), the keys and values of attention;
    hidden_state (num_layers, batch, num_hiddens), the GRU's state; enc_valid_lens (batch,) or None."""

    enc_outputs: Tensor
    hidden_state: Tensor
    enc_valid_lens: Tensor | None


class Seq2SeqAttentionDecoder(Module):
    """D2L's ``Seq2SeqAttentionDecoder`` (11.4). For every target step t, with s_{t-1} the last
    GRU layer's state and h_1 .. h_K the encoder's outputs:

        c_t     = sum_j alpha(s_{t-1}, h_j) h_j        attention: query s_{t-1}, keys = values = h
        s_t     = GRU([c_t; embed(y_{t-1})], s_{t-1})  the context joins the input token
        logit_t = dense(s_t)                           (vocab_size,)

    alpha is ``Attention(scorer, pooling)`` with plugins by name: ``"additive"`` + ``"softmax"``
    is Bahdanau's w_v^T tanh(W_q s + W_k h) normalised by a softmax; any registered scorer
    or pooling (``"scaled_dot"``, ``"sparsemax"``, a user's plugin) fits in its place.
    Padded source positions (j > enc_valid_lens) get weight 0.

    ``init_state(enc_outputs, enc_valid_lens=None)``: from the encoder's (outputs, state), an
    ``AttentionDecoderState``; the GRU starts from the encoder's last state (so num_layers
    and num_hiddens must match the encoder's).
    ``decoder(X, state) -> (logits (batch, T, vocab_size), new_state)``: X (batch, T) token
    ids -- the whole shifted target in training, one token per call when decoding. The steps
    run one after another either way (s_t needs s_{t-1}), and the state passed in is not
    changed. ``decoder.attention_weights``: one (batch, 1, num_enc_steps) tensor per step of
    the last call, detached.

    ``Seq2SeqAttentionDecoder(config)`` with a ``Seq2SeqConfig`` (kept as ``decoder.config``),
    or the settings themselves, D2L's way: ``Seq2SeqAttentionDecoder(vocab_size, embed_size,
    num_hiddens, num_layers, dropout=0.0, scorer="additive", pooling="softmax",
    scorer_options=None, pooling_options=None)``, the plugins by name, which builds the config.
    """

    def __init__(
        self,
        config: Seq2SeqConfig | int | None = None,
        *sizes: float,
        dtype: DType = None,
        device: Device = None,
        **fields: Any,
    ) -> None:
        super().__init__()
        c = Seq2SeqConfig.from_arguments("Seq2SeqAttentionDecoder", config, sizes, fields, SEQ2SEQ_SIZES)
        # the sizes are set (from_arguments required them): this line says so to mypy
        assert c.vocab_size and c.embed_size and c.num_hiddens and c.num_layers
        self.config, self.num_hiddens, self.num_layers = c, c.num_hiddens, c.num_layers
        self.attention = Attention(
            c.scorer,
            c.pooling,
            c.dropout,
            c.num_hiddens,
            c.num_hiddens,
            c.scorer_options,
            c.pooling_options,
            dtype=dtype,
            device=device,
        )
        self.embedding = Embedding(c.vocab_size, c.embed_size, dtype=dtype, device=device)
        self.rnn = GRU(c.num_hiddens + c.embed_size, c.num_hiddens, c.num_layers, c.dropout, dtype=dtype, device=device)
        self.dense = Linear(c.num_hiddens, c.vocab_size, dtype=dtype, device=device)
        for layer in (self.rnn, self.dense):  # not the scorer's layers: a plugin initialises its own
            init_seq2seq(layer)
        self._attention_weights: list[Tensor | None] = []

    def init_state(self, enc_outputs: tuple[Tensor, Tensor], enc_valid_lens: Any = None) -> AttentionDecoderState:
        """From the encoder's ``(outputs, state)``: an ``AttentionDecoderState`` holding the outputs
        batch-major (batch_size, num_enc_steps, num_hiddens) as keys and values, the encoder's last
        state as the GRU's first, and ``enc_valid_lens`` (a list or array becomes a tensor)."""
        outputs, hidden_state = enc_outputs
        _check_encoder_state(self, hidden_state)
        if enc_valid_lens is not None and not isinstance(enc_valid_lens, Tensor):
            enc_valid_lens = tensor(enc_valid_lens, device=outputs.device)
        # batch-major keys and values, as attention layers take them
        return AttentionDecoderState(outputs.swapaxes(0, 1), hidden_state, enc_valid_lens)

    def forward(self, X: Tensor, state: AttentionDecoderState) -> tuple[Tensor, AttentionDecoderState]:
        """Decode the tokens X (batch_size, T), one GRU step per token: at step t the last layer's
        state s_{t-1} attends the encoder's outputs, the context c_t joins the token's embedding as
        the GRU's input, and dense(s_t) gives the logits. Returns (logits (batch_size, T,
        vocab_size), new state); the state passed in is not changed."""
        enc_outputs, H, enc_valid_lens = state
        check_token_batch(self, X)
        embs = self.embedding(X).swapaxes(0, 1)  # (T, batch, embed_size): one row per step
        steps, batch = embs.shape[:2]
        if steps == 0:  # (there would be no step to concatenate)
            raise ShapeError(f"{type(self).__name__}: tokens of shape {tuple(X.shape)} have no time steps")
        outputs, self._attention_weights = [], []
        for t in range(steps):
            query = H[-1].unsqueeze(1)  # (batch, 1, num_hiddens): the last layer's state
            context = self.attention(query, enc_outputs, enc_outputs, enc_valid_lens)  # (batch, 1, num_hiddens)
            x = concat([context.reshape(batch, self.num_hiddens), embs[t]], axis=-1).unsqueeze(0)  # one GRU step
            out, H = self.rnn(x, H)
            outputs.append(out)
            self._attention_weights.append(self.attention.attention_weights)
        logits = self.dense(concat(outputs, axis=0))  # (T, batch, vocab_size)
        return logits.swapaxes(0, 1), AttentionDecoderState(enc_outputs, H, enc_valid_lens)

    def reorder_state(self, state: AttentionDecoderState, indices: Tensor | Sequence[int]) -> AttentionDecoderState:
        """The state of the batch made of rows ``indices`` of this one (beam search); the
        GRU state's batch axis is its second."""
        enc_outputs, H, enc_valid_lens = state
        if not isinstance(indices, Tensor):
            indices = tensor(indices, dtype="int64", device=enc_outputs.device)
        lens = None if enc_valid_lens is None else enc_valid_lens[indices]
        return AttentionDecoderState(enc_outputs[indices], H[:, indices], lens)

    @property
    def attention_weights(self) -> list[Tensor | None]:
        """The attention weights of the last call, one (batch_size, 1, num_enc_steps) tensor per
        decoded step, detached: which source positions each output step looked at."""
        return self._attention_weights


class Seq2Seq(EncoderDecoder):
    """D2L's ``Seq2Seq``: an encoder and a decoder trained as one model, e.g.
    ``Seq2Seq(Seq2SeqEncoder(...), Seq2SeqAttentionDecoder(...))`` or, without attention,
    ``Seq2Seq(Seq2SeqEncoder(...), Seq2SeqDecoder(...))``.
    ``model(enc_X, dec_X, enc_valid_lens) -> logits (batch, T, vocab_size)``; decoding one
    step at a time with ``begin_decoding`` / ``decode_step`` / ``reorder_state`` (see
    ``EncoderDecoder``)."""
