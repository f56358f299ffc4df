"""The Transformer (minitensor/core/nn/transformer.py): shapes, causality, the key/value cache
(token-by-token decoding equals the full forward pass), padding, training in post-LN and
pre-LN, gradients, plugins by name in every block, the strict device, reorder_state, and
(optionally) PyTorch's TransformerEncoderLayer / TransformerDecoderLayer."""

import numpy as np
import pytest
from helpers import array_type

import minitensor as mt
from minitensor import hookimpl, nn

V = 13  # vocabulary size of the small models


def tokens(batch, steps, seed=0, device="cpu", low=0):
    a = np.random.default_rng([seed, batch, steps]).integers(low, V, (batch, steps))
    return mt.tensor(a, device=device)


def seq2seq(
    positional="sinusoidal",
    norm_first=False,
    dtype=mt.float64,
    device="cpu",
    seed=0,
    num_hiddens=8,
    num_heads=2,
    num_blks=2,
    dropout=0.0,
    **kwargs,
):
    """A small float64 encoder-decoder Transformer (in eval mode: no dropout)."""
    mt.manual_seed(seed)
    args = (V, num_hiddens, 2 * num_hiddens, num_heads, num_blks, dropout)
    options = dict(positional=positional, norm_first=norm_first, dtype=dtype, device=device, max_len=50, **kwargs)
    encoder = nn.TransformerEncoder(*args, **options)
    decoder = nn.TransformerDecoder(*args, **options)
    return nn.EncoderDecoder(encoder, decoder).eval()


def lm(
    positional="sinusoidal",
    norm_first=False,
    dtype=mt.float64,
    device="cpu",
    seed=0,
    num_hiddens=8,
    num_heads=2,
    num_blks=2,
    dropout=0.0,
    **kwargs,
):
    mt.manual_seed(seed)
    return nn.TransformerLM(
        V,
        num_hiddens,
        2 * num_hiddens,
        num_heads,
        num_blks,
        dropout,
        positional=positional,
        norm_first=norm_first,
        dtype=dtype,
        device=device,
        max_len=50,
        **kwargs,
    ).eval()


def all_mha(model):
    return [m for m in model.modules() if isinstance(m, nn.MultiHeadAttention)]


# -- the pieces ---------------------------------------------------------------------------------
def test_position_wise_ffn_is_dense_relu_dense_at_every_position():
    ffn = nn.PositionWiseFFN(4, 6, 8, dtype=mt.float64)
    X = mt.tensor(np.random.default_rng(0).standard_normal((2, 3, 4)))
    W1, b1 = ffn.dense1.weight.numpy(), ffn.dense1.bias.numpy()
    W2, b2 = ffn.dense2.weight.numpy(), ffn.dense2.bias.numpy()
    expected = np.maximum(X.numpy() @ W1.T + b1, 0) @ W2.T + b2
    out = ffn(X)
    assert out.shape == (2, 3, 8)  # D2L's example: ffn(ones(2, 3, 4)) -> (2, 3, 8)
    np.testing.assert_allclose(out.numpy(), expected, atol=1e-12)
    assert nn.PositionWiseFFN(4, 6)(X.float()).shape == (2, 3, 4)  # outputs default to the input size


@pytest.mark.parametrize("norm_first", [False, True])
def test_add_norm_post_ln_and_pre_ln(norm_first):
    addnorm = nn.AddNorm(4, 0.0, norm_first=norm_first, dtype=mt.float64)
    with mt.no_grad():
        addnorm.ln.weight.copy_(mt.tensor([1.0, 2.0, 3.0, 4.0]))
        addnorm.ln.bias.copy_(mt.tensor([0.5, 0.0, -0.5, 1.0]))
    rng = np.random.default_rng(1)
    X, Y = (mt.tensor(rng.standard_normal((2, 3, 4))) for _ in range(2))

    def ln(a):
        a = (a - a.mean(-1, keepdims=True)) / np.sqrt(a.var(-1, keepdims=True) + 1e-5)
        return a * np.array([1.0, 2.0, 3.0, 4.0]) + np.array([0.5, 0.0, -0.5, 1.0])

    if norm_first:  # X + dropout(Y), the sublayer reading LN(X)
        np.testing.assert_allclose(addnorm.sublayer_input(X).numpy(), ln(X.numpy()), atol=1e-12)
        np.testing.assert_allclose(addnorm(X, Y).numpy(), X.numpy() + Y.numpy(), atol=1e-12)
    else:  # LN(X + dropout(Y)), the sublayer reading X
        assert addnorm.sublayer_input(X) is X
        np.testing.assert_allclose(addnorm(X, Y).numpy(), ln(X.numpy() + Y.numpy()), atol=1e-12)


def test_add_norm_applies_dropout_to_the_sublayer_output_only():
    mt.manual_seed(0)
    addnorm = nn.AddNorm(6, 0.5, norm_first=True)
    X, Y = mt.zeros(2, 3, 6), mt.ones(2, 3, 6)
    out = addnorm(X, Y).numpy()
    assert set(np.unique(out)) == {0.0, 2.0}  # Y's elements dropped or scaled by 1 / (1 - p)
    np.testing.assert_array_equal(addnorm.eval()(X, Y).numpy(), np.ones((2, 3, 6)))


# -- shapes -------------------------------------------------------------------------------------
@pytest.mark.parametrize("norm_first", [False, True])
def test_shapes_and_attention_weights(norm_first):
    blk = nn.TransformerEncoderBlock(24, 48, 8, 0.5, norm_first=norm_first)
    assert blk(mt.ones(2, 100, 24), mt.tensor([3, 2])).shape == (2, 100, 24)  # D2L's example

    model = seq2seq(norm_first=norm_first, num_blks=3)
    enc_X, dec_X = tokens(2, 5), tokens(2, 7, seed=1)
    logits = model(enc_X, dec_X, [5, 3])
    assert logits.shape == (2, 7, V)
    assert model.encoder(enc_X, [5, 3]).shape == (2, 5, 8)
    enc_weights = model.encoder.attention_weights
    assert len(enc_weights) == 3 and all(w.shape == (2, 2, 5, 5) for w in enc_weights)
    self_weights, cross_weights = model.decoder.attention_weights
    assert len(self_weights) == len(cross_weights) == 3
    assert all(w.shape == (2, 2, 7, 7) for w in self_weights)
    assert all(w.shape == (2, 2, 7, 5) for w in cross_weights)
    # padding: the second source's last two keys get no weight
    assert np.all(cross_weights[0].numpy()[1, :, :, 3:] == 0)
    assert np.all(enc_weights[0].numpy()[1, :, :, 3:] == 0)
    # pre-LN ends with a LayerNorm; post-LN's last block already normalised
    assert (model.encoder.ln is not None) == norm_first and (model.decoder.ln is not None) == norm_first

    model_lm = lm(norm_first=norm_first)
    assert model_lm(dec_X).shape == (2, 7, V)
    assert [w.shape for w in model_lm.attention_weights] == [(2, 2, 7, 7)] * 2
    assert not any(blk.attention2 for blk in model_lm.decoder.blks)  # no encoder-decoder attention


# -- causality and the cache --------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["seq2seq", "lm"])
@pytest.mark.parametrize("positional", ["sinusoidal", "rotary"])
def test_the_causal_mask_hides_the_future(kind, positional):
    """Changing the tokens after position t leaves every output at positions <= t unchanged."""
    t = 2
    X = tokens(2, 6, seed=3)
    changed = X.numpy()
    changed[:, t + 1 :] = (changed[:, t + 1 :] + 1) % V
    changed = mt.tensor(changed)
    if kind == "seq2seq":
        model, enc_X = seq2seq(positional), tokens(2, 4)
        before, after = model(enc_X, X, [4, 2]), model(enc_X, changed, [4, 2])
    else:
        model = lm(positional)
        before, after = model(X), model(changed)
    np.testing.assert_allclose(after.numpy()[:, : t + 1], before.numpy()[:, : t + 1], atol=1e-12)
    assert not np.allclose(after.numpy()[:, t + 1 :], before.numpy()[:, t + 1 :])  # the future did change


def decode_in_pieces(model, X, pieces, state):
    """Feed X (batch, T) in consecutive chunks of the given sizes; return all logits, the state."""
    outputs, start = [], 0
    for size in pieces:
        logits, state = model.decode_step(X[:, start : start + size], state)
        assert logits.shape == (X.shape[0], size, V)
        outputs.append(logits.numpy())
        start += size
    assert start == X.shape[1]
    return np.concatenate(outputs, axis=1), state


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("positional", ["sinusoidal", "learned", "rotary"])
@pytest.mark.parametrize("kind", ["seq2seq", "lm"])
def test_cached_decoding_equals_the_full_forward_pass(kind, positional, norm_first):
    """Token by token (after a 2-token prefix) with the key/value cache gives, at every step,
    the logits the full forward pass gives at that position."""
    X = tokens(3, 7, seed=4)
    if kind == "seq2seq":
        model, enc_X, enc_valid_lens = seq2seq(positional, norm_first), tokens(3, 5, seed=5), [5, 2, 4]
        full = model(enc_X, X, enc_valid_lens).numpy()
        state = model.begin_decoding(enc_X, enc_valid_lens)
    else:
        model = lm(positional, norm_first)
        full = model(X).numpy()
        state = model.begin_decoding()
    with mt.no_grad():
        steps, state = decode_in_pieces(model, X, [2, 1, 1, 1, 1, 1], state)
    np.testing.assert_allclose(steps, full, atol=1e-5, rtol=0)
    # the cache holds the projected keys and values of all 7 positions, block by block
    for cache in state[2]:
        assert cache.keys().shape == cache.values().shape == (3, 2, 7, 4)
    assert model.decoder.num_cached_steps(state) == 7


def test_cached_decoding_in_float32():
    model = seq2seq("rotary", dtype=mt.float32, num_hiddens=16, num_heads=4)
    enc_X, X = tokens(2, 6), tokens(2, 8, seed=1)
    full = model(enc_X, X, [6, 3]).numpy()
    with mt.no_grad():
        steps, _ = decode_in_pieces(model, X, [1] * 8, model.begin_decoding(enc_X, [6, 3]))
    np.testing.assert_allclose(steps, full, atol=1e-4, rtol=0)


def test_decoding_beyond_max_len_is_a_clear_error():
    model = lm("sinusoidal")
    state = model.begin_decoding()
    _, state = model.decode_step(tokens(1, 50), state)
    with pytest.raises(ValueError, match="max_len=50"):
        model.decode_step(tokens(1, 1), state)


def test_decode_step_leaves_the_state_it_was_given_usable():
    model = lm("rotary")
    prompt, a, b = tokens(2, 3), tokens(2, 1, seed=1), tokens(2, 1, seed=2)
    _, state = model.decode_step(prompt, model.begin_decoding())
    logits_a, _ = model.decode_step(a, state)
    model.decode_step(b, state)  # a second continuation of the same state ...
    again, _ = model.decode_step(a, state)  # ... does not disturb the first
    # equal to the last bit or two: BLAS may round a product differently when its operands
    # sit at other addresses (alignment), which varies from call to call; a disturbed state
    # would differ in the first digits
    np.testing.assert_allclose(again.numpy(), logits_a.numpy(), rtol=0, atol=1e-13)
    full = model(mt.tensor(np.concatenate([prompt.numpy(), a.numpy()], axis=1)))
    np.testing.assert_allclose(logits_a.numpy()[:, 0], full.numpy()[:, -1], atol=1e-12)


@pytest.mark.parametrize("kind", ["seq2seq", "lm"])
def test_reorder_state_selects_and_repeats_batch_rows(kind):
    """After reorder_state(state, [2, 0, 0]) decoding continues exactly as for the batch made
    of rows 2, 0, 0 from the start (what beam search needs); the old state is unchanged."""
    X = tokens(3, 4, seed=6)
    rows = [2, 0, 0]
    if kind == "seq2seq":
        model, enc_X, lens = seq2seq("learned"), tokens(3, 5, seed=7), np.array([5, 2, 3])
        state = model.begin_decoding(enc_X, lens)
        fresh = model.begin_decoding(enc_X[rows], lens[rows])
    else:
        model = lm("rotary")
        state = fresh = model.begin_decoding()
    with mt.no_grad():
        _, state = model.decode_step(X[:, :3], state)
        _, fresh = model.decode_step(X[rows][:, :3], fresh)
        reordered = model.reorder_state(state, mt.tensor(rows))
        expected, _ = model.decode_step(X[rows][:, 3:], fresh)
        got, _ = model.decode_step(X[rows][:, 3:], reordered)
        np.testing.assert_allclose(got.numpy(), expected.numpy(), atol=1e-12)
        # a list of indices works too, and the original state still decodes the original batch
        got_list, _ = model.decode_step(X[rows][:, 3:], model.reorder_state(state, rows))
        np.testing.assert_allclose(got_list.numpy(), expected.numpy(), atol=1e-12)
        original, _ = model.decode_step(X[:, 3:], state)
    np.testing.assert_allclose(original.numpy()[rows], expected.numpy(), atol=1e-12)
    for cache, cache2 in zip(state[2], reordered[2]):
        k, v, k2, v2 = cache.keys(), cache.values(), cache2.keys(), cache2.values()
        assert k.shape[0] == 3 and k2.shape[0] == 3
        np.testing.assert_array_equal(k2.numpy(), k.numpy()[rows])
        np.testing.assert_array_equal(v2.numpy(), v.numpy()[rows])


def test_reorder_state_needs_the_decoder_to_know_its_state():
    class PlainEncoder(nn.Module):
        def forward(self, X, valid_lens=None):
            return X

    class PlainDecoder(nn.Module):
        def init_state(self, enc_outputs, enc_valid_lens=None):
            return enc_outputs

        def forward(self, X, state):
            return state, state

    model = nn.EncoderDecoder(PlainEncoder(), PlainDecoder())
    with pytest.raises(TypeError, match="PlainDecoder has no reorder_state"):
        model.reorder_state(model.begin_decoding(mt.ones(2, 3)), [0])


# -- padding ------------------------------------------------------------------------------------
@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_padding_does_not_change_valid_positions(norm_first):
    model = seq2seq("sinusoidal", norm_first)
    enc_X, dec_X, lens = tokens(2, 6), tokens(2, 4, seed=1), [4, 2]
    padded = enc_X.numpy()
    padded[0, 4:] = (padded[0, 4:] + 3) % V
    padded[1, 2:] = (padded[1, 2:] + 5) % V
    padded = mt.tensor(padded)
    enc_a, enc_b = model.encoder(enc_X, lens).numpy(), model.encoder(padded, lens).numpy()
    np.testing.assert_allclose(enc_b[0, :4], enc_a[0, :4], atol=1e-12)
    np.testing.assert_allclose(enc_b[1, :2], enc_a[1, :2], atol=1e-12)
    # and the decoder, which attends only the valid encoder positions, sees no difference
    np.testing.assert_allclose(model(padded, dec_X, lens).numpy(), model(enc_X, dec_X, lens).numpy(), atol=1e-12)
    # without valid_lens the padding is attended, and the outputs change
    assert not np.allclose(model.encoder(padded).numpy()[0, :4], model.encoder(enc_X).numpy()[0, :4])


# -- training -----------------------------------------------------------------------------------
@pytest.mark.parametrize("norm_first", [False, True])
def test_post_ln_and_pre_ln_both_learn_a_copy_task(norm_first):
    """A few Adam steps on copying random sequences (teacher forcing) cut the loss."""
    bos = 1
    model = seq2seq(
        "sinusoidal", norm_first, dtype=mt.float32, num_hiddens=16, num_heads=2, dropout=0.1, seed=1
    ).train()
    optimizer = mt.optim.Adam(model.parameters(), lr=0.01)
    src = tokens(16, 5, seed=8, low=2)
    dec_X = mt.tensor(np.concatenate([np.full((16, 1), bos), src.numpy()[:, :-1]], axis=1))
    losses = []
    for _ in range(25):
        loss = mt.cross_entropy(model(src, dec_X), src)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert np.isfinite(losses).all()
    assert np.mean(losses[-3:]) < 0.5 * losses[0], losses


# -- gradients ----------------------------------------------------------------------------------
@pytest.mark.parametrize("norm_first", [False, True])
def test_gradcheck_encoder_block(norm_first):
    mt.manual_seed(0)
    blk = nn.TransformerEncoderBlock(4, 6, 2, 0.0, use_bias=True, norm_first=norm_first, dtype=mt.float64)
    X = mt.tensor(np.random.default_rng(0).standard_normal((2, 3, 4)), requires_grad=True)
    params = list(blk.parameters())
    assert mt.gradcheck(lambda X, *_: blk(X, mt.tensor([3, 2])), [X, *params])


@pytest.mark.parametrize("norm_first, positional", [(False, None), (True, "rotary")])
def test_gradcheck_decoder_block_through_the_cache(norm_first, positional):
    """Two new tokens after two cached ones: gradients reach the inputs of both calls, the
    encoder outputs and every parameter."""
    mt.manual_seed(0)
    blk = nn.TransformerDecoderBlock(4, 6, 2, 0.0, 0, norm_first=norm_first, positional=positional, dtype=mt.float64)
    rng = np.random.default_rng(1)
    past, new, enc = (
        mt.tensor(rng.standard_normal(shape), requires_grad=True) for shape in ((2, 2, 4), (2, 2, 4), (2, 3, 4))
    )

    def fn(past, new, enc, *_):
        state = [enc, mt.tensor([3, 1]), [None]]
        out_past, state = blk(past, state)
        out_new, state = blk(new, state)
        return mt.concat([out_past, out_new], axis=1)

    assert mt.gradcheck(fn, [past, new, enc, *blk.parameters()])


# -- plugins, devices ---------------------------------------------------------------------------
def test_scorer_pooling_and_positional_by_name_reach_every_block():
    sparsemax = mt.plugins.lookup("pooling", "sparsemax")
    dot = mt.plugins.lookup("scorer", "dot")
    rotary = mt.plugins.lookup("positional encoding", "rotary")
    model = seq2seq("rotary", num_blks=3, scorer="dot", pooling="sparsemax")
    attentions = all_mha(model)
    assert len(attentions) == 3 + 2 * 3  # encoder self, decoder self and cross
    for mha in attentions:
        assert isinstance(mha.attention.pooling, sparsemax) and isinstance(mha.attention.scorer, dot)
    self_attentions = [b.attention for b in model.encoder.blks] + [b.attention1 for b in model.decoder.blks]
    assert all(isinstance(mha.positional, rotary) for mha in self_attentions)
    assert all(b.attention2.positional is None for b in model.decoder.blks)  # not across sequences
    assert model.encoder.embedding.pos_encoding is None and model.decoder.embedding.pos_encoding is None

    model(tokens(2, 6), tokens(2, 5, seed=1), [6, 4])
    weights = model.encoder.attention_weights + sum(model.decoder.attention_weights, [])
    assert len(weights) == 9
    for w in weights:  # sparsemax: rows sum to one, with exact zeros
        np.testing.assert_allclose(w.numpy().sum(-1), 1.0, atol=1e-12)
    assert all((w.numpy() == 0).any() for w in weights)

    inputs_encoded = lm("learned")
    learned = mt.plugins.lookup("positional encoding", "learned")
    assert isinstance(inputs_encoded.decoder.embedding.pos_encoding, learned)
    assert all(mha.positional is None for mha in all_mha(inputs_encoded))


def test_a_user_pooling_registered_at_run_time_is_used_by_every_block():
    calls = []

    class CountingSoftmax(nn.Module):
        def __init__(self, **options):
            super().__init__()

        def forward(self, scores, valid_lens=None, mask=None):
            calls.append(tuple(scores.shape))
            return mt.masked_softmax(scores, valid_lens, mask)

    class Plugin:
        @hookimpl
        def minitensor_poolings(self):
            return {"counting_softmax_test": CountingSoftmax}

    plugin = Plugin()
    mt.plugins.register(plugin)
    try:
        model = lm(num_blks=3, pooling="counting_softmax_test")
        model(tokens(2, 4))
    finally:
        mt.plugins.unregister(plugin)
    assert calls == [(2, 2, 4, 4)] * 3


def test_bad_positional_names():
    with pytest.raises(KeyError, match="rotary"):
        lm("rotray")
    with pytest.raises(TypeError, match="registered name"):
        lm(positional=mt.plugins.lookup("positional encoding", "rotary"))


def test_the_model_runs_on_the_strict_device():
    cpu, strict = seq2seq("rotary", norm_first=True), seq2seq("rotary", norm_first=True).to("strict")
    enc_X, dec_X, lens = tokens(2, 5), tokens(2, 4, seed=1), [5, 3]
    out = cpu(enc_X, dec_X, lens)
    out_strict = strict(enc_X.to("strict"), dec_X.to("strict"), mt.tensor(lens, device="strict"))
    assert isinstance(out_strict.data, array_type("strict"))
    np.testing.assert_allclose(out_strict.numpy(), out.numpy(), atol=1e-12)
    loss, loss_strict = mt.cross_entropy(out, dec_X), mt.cross_entropy(out_strict, dec_X.to("strict"))
    loss.backward()
    loss_strict.backward()
    for (name, p), p_strict in zip(cpu.named_parameters(), strict.parameters()):
        assert isinstance(p_strict.grad.data, array_type("strict")), name
        np.testing.assert_allclose(p_strict.grad.numpy(), p.grad.numpy(), atol=1e-10, err_msg=name)
    # incremental decoding and reorder_state on the device
    with mt.no_grad():
        state = strict.begin_decoding(enc_X.to("strict"), lens)
        steps, state = decode_in_pieces(strict, dec_X.to("strict"), [1, 1, 2], state)
        np.testing.assert_allclose(steps, out.numpy(), atol=1e-10)
        state = strict.reorder_state(state, mt.tensor([1, 1]))  # indices on the CPU are moved
        logits, _ = strict.decode_step(mt.tensor([[3], [4]], device="strict"), state)
        assert isinstance(logits.data, array_type("strict"))
    model_lm = lm("learned").to("strict")
    assert isinstance(model_lm(tokens(2, 3, device="strict")).data, array_type("strict"))


# -- PyTorch ------------------------------------------------------------------------------------
def copy_mha(torch, ours, theirs):
    with torch.no_grad():
        W = [ours.W_q, ours.W_k, ours.W_v]
        theirs.in_proj_weight.copy_(torch.from_numpy(np.concatenate([m.weight.numpy() for m in W])))
        theirs.in_proj_bias.copy_(torch.from_numpy(np.concatenate([m.bias.numpy() for m in W])))
        theirs.out_proj.weight.copy_(torch.from_numpy(ours.W_o.weight.numpy()))
        theirs.out_proj.bias.copy_(torch.from_numpy(ours.W_o.bias.numpy()))


def copy_rest(torch, ours, theirs, addnorms):
    with torch.no_grad():
        for name, layer in (("linear1", ours.ffn.dense1), ("linear2", ours.ffn.dense2)):
            getattr(theirs, name).weight.copy_(torch.from_numpy(layer.weight.numpy()))
            getattr(theirs, name).bias.copy_(torch.from_numpy(layer.bias.numpy()))
        for i, addnorm in enumerate(addnorms, start=1):
            getattr(theirs, f"norm{i}").weight.copy_(torch.from_numpy(addnorm.ln.weight.numpy()))
            getattr(theirs, f"norm{i}").bias.copy_(torch.from_numpy(addnorm.ln.bias.numpy()))


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_block_equals_torch_transformer_encoder_layer(norm_first):
    torch = pytest.importorskip("torch")
    mt.manual_seed(0)
    ours = nn.TransformerEncoderBlock(12, 20, 3, 0.0, use_bias=True, norm_first=norm_first, dtype=mt.float64)
    # train mode with dropout 0: PyTorch's inference fast path (which zeroes padded rows) stays off
    theirs = torch.nn.TransformerEncoderLayer(
        12, 3, 20, dropout=0.0, batch_first=True, norm_first=norm_first, dtype=torch.float64
    )
    copy_mha(torch, ours.attention, theirs.self_attn)
    copy_rest(torch, ours, theirs, [ours.addnorm1, ours.addnorm2])
    X = np.random.default_rng(0).standard_normal((2, 5, 12))
    lens = np.array([5, 3])
    padding = torch.from_numpy(np.arange(5)[None, :] >= lens[:, None])  # PyTorch: True = ignore
    expected = theirs(torch.from_numpy(X), src_key_padding_mask=padding).detach().numpy()
    np.testing.assert_allclose(ours(mt.tensor(X), mt.tensor(lens)).numpy(), expected, atol=1e-10)


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_block_equals_torch_transformer_decoder_layer(norm_first):
    torch = pytest.importorskip("torch")
    mt.manual_seed(0)
    ours = nn.TransformerDecoderBlock(12, 20, 3, 0.0, 0, use_bias=True, norm_first=norm_first, dtype=mt.float64)
    theirs = torch.nn.TransformerDecoderLayer(
        12, 3, 20, dropout=0.0, batch_first=True, norm_first=norm_first, dtype=torch.float64
    )
    copy_mha(torch, ours.attention1, theirs.self_attn)
    copy_mha(torch, ours.attention2, theirs.multihead_attn)
    copy_rest(torch, ours, theirs, [ours.addnorm1, ours.addnorm2, ours.addnorm3])
    rng = np.random.default_rng(0)
    X, enc = rng.standard_normal((2, 4, 12)), rng.standard_normal((2, 6, 12))
    lens = np.array([6, 2])
    future = torch.from_numpy(~np.tril(np.ones((4, 4), dtype=bool)))  # True = may not attend
    padding = torch.from_numpy(np.arange(6)[None, :] >= lens[:, None])
    expected = (
        theirs(torch.from_numpy(X), torch.from_numpy(enc), tgt_mask=future, memory_key_padding_mask=padding)
        .detach()
        .numpy()
    )
    out, _ = ours(mt.tensor(X), [mt.tensor(enc), mt.tensor(lens), [None]])
    np.testing.assert_allclose(out.numpy(), expected, atol=1e-10)


def test_embeddings_are_scaled_to_the_size_of_the_positional_encoding():
    """embedding * sqrt(d) has unit scale (the table starts as N(0, 1/d)); then P is added."""
    mt.manual_seed(0)
    layer = nn.TransformerEmbedding(1000, 64, 0.0, max_len=20, positional="sinusoidal", dtype=mt.float64)
    X = mt.tensor(np.arange(1000).reshape(50, 20))
    P = layer.pos_encoding.P.numpy()[:20]
    scaled = layer(X).numpy() - P
    np.testing.assert_allclose(scaled, layer.token_embedding.weight.numpy()[X.numpy()] * 8.0, atol=1e-12)
    assert 0.9 < scaled.std() < 1.1
    np.testing.assert_allclose(layer(X[:, 5:7], offset=5).numpy() - P[5:7], scaled[:, 5:7], atol=1e-12)
