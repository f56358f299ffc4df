"""D2L's Bahdanau-attention seq2seq (nn.Seq2SeqEncoder, nn.Seq2SeqAttentionDecoder, nn.Seq2Seq):
shapes and layouts, attention weights per step (zero on padded source positions), step-by-step
decoding equal to teacher forcing, states left unchanged, beam-search reordering, plugins by
name, gradients end to end, the strict device, and learning to reverse sequences. The same for
the decoder without attention (nn.Seq2SeqDecoder, D2L's baseline), which learns to copy."""

import numpy as np
import pytest
from helpers import array_type

import minitensor as mt
from minitensor import nn

PAD, BOS, EOS = 0, 1, 2  # the reversal task's special tokens; real tokens are 3 .. VOCAB - 1
VOCAB = 13


def make_model(vocab=VOCAB, embed=6, hiddens=8, layers=2, dtype=mt.float64, device="cpu", **decoder_options):
    encoder = nn.Seq2SeqEncoder(vocab, embed, hiddens, layers, dtype=dtype, device=device)
    decoder = nn.Seq2SeqAttentionDecoder(vocab, embed, hiddens, layers, dtype=dtype, device=device, **decoder_options)
    return nn.Seq2Seq(encoder, decoder)


def tokens(batch, steps, seed=0, device="cpu"):
    return mt.tensor(np.random.default_rng(seed).integers(3, VOCAB, (batch, steps)), device=device)


def test_shapes_and_layouts():
    mt.manual_seed(0)
    model = make_model()
    enc_X, dec_X = tokens(3, 5), tokens(3, 4, seed=1)
    outputs, state = model.encoder(enc_X)
    assert outputs.shape == (5, 3, 8) and state.shape == (2, 3, 8)  # time-major, as the GRU gives them
    dec_state = model.decoder.init_state((outputs, state), [5, 2, 3])
    assert dec_state.enc_outputs.shape == (3, 5, 8)  # batch-major keys and values
    assert dec_state.hidden_state is state and dec_state.enc_valid_lens.tolist() == [5, 2, 3]
    logits, new_state = model.decoder(dec_X, dec_state)
    assert logits.shape == (3, 4, VOCAB) and new_state.hidden_state.shape == (2, 3, 8)
    assert model(enc_X, dec_X, mt.tensor([5, 2, 3])).shape == (3, 4, VOCAB)


def test_attention_weights_per_step_ignore_padding():
    mt.manual_seed(1)
    model = make_model()
    valid_lens = [5, 2, 3]
    model(tokens(3, 5), tokens(3, 4, seed=1), mt.tensor(valid_lens))
    weights = model.decoder.attention_weights
    assert len(weights) == 4  # one per decoder step
    for w in weights:
        assert w.shape == (3, 1, 5) and not w.requires_grad
        w = w.numpy()
        np.testing.assert_allclose(w.sum(axis=-1), 1.0, rtol=1e-12)
        for b, n in enumerate(valid_lens):
            assert (w[b, 0, n:] == 0).all() and (w[b, 0, :n] > 0).all()


def test_one_decoder_step_is_bahdanaus_formula():
    """c = attention(query = the last layer's state, keys = values = encoder outputs);
    s' = GRU([c; embed(y)], s); logits = dense(s'): composed here from the decoder's parts."""
    mt.manual_seed(8)
    model = make_model().eval()
    enc_X, dec_X, valid_lens = tokens(3, 5), tokens(3, 1, seed=1), mt.tensor([5, 2, 3])
    enc_outputs, enc_state = model.encoder(enc_X)
    logits, state = model.decoder(dec_X, model.decoder.init_state((enc_outputs, enc_state), valid_lens))
    dec = model.decoder
    keys = enc_outputs.swapaxes(0, 1)
    context = dec.attention(enc_state[-1].unsqueeze(1), keys, keys, valid_lens)  # (batch, 1, num_hiddens)
    np.testing.assert_array_equal(dec.attention_weights[0].numpy(), dec.attention.attention_weights.numpy())
    x = mt.concat([context, dec.embedding(dec_X)], axis=-1).swapaxes(0, 1)  # (1, batch, num_hiddens + embed)
    out, H = dec.rnn(x, enc_state)
    np.testing.assert_allclose(logits.numpy(), dec.dense(out).swapaxes(0, 1).numpy(), rtol=1e-12)
    np.testing.assert_allclose(state.hidden_state.numpy(), H.numpy(), rtol=1e-12)


def test_stepwise_decoding_equals_teacher_forcing():
    mt.manual_seed(2)
    model = make_model(dropout=0.3).eval()  # dropout off: the two must give the same numbers
    enc_X, dec_X, valid_lens = tokens(3, 5), tokens(3, 4, seed=1), mt.tensor([5, 2, 3])
    full = model(enc_X, dec_X, valid_lens)
    full_weights = [w.numpy() for w in model.decoder.attention_weights]
    state = model.begin_decoding(enc_X, valid_lens)
    steps, weights = [], []
    for t in range(4):
        logits, state = model.decode_step(dec_X[:, t : t + 1], state)
        assert logits.shape == (3, 1, VOCAB) and len(model.decoder.attention_weights) == 1
        steps.append(logits.numpy())
        weights.append(model.decoder.attention_weights[0].numpy())
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(np.stack(weights), np.stack(full_weights), rtol=1e-10, atol=1e-12)


def test_decoding_leaves_the_state_it_was_given_unchanged():
    mt.manual_seed(3)
    model = make_model().eval()
    state = model.begin_decoding(tokens(2, 4), [4, 3])
    before = [t.numpy() for t in state]
    first, after = model.decode_step(tokens(2, 1, seed=5), state)
    assert [t.numpy().tolist() for t in state] == [b.tolist() for b in before]
    assert not np.allclose(after.hidden_state.numpy(), state.hidden_state.numpy())
    again, _ = model.decode_step(tokens(2, 1, seed=5), state)  # the old state is still usable
    np.testing.assert_array_equal(again.numpy(), first.numpy())


def test_reorder_state_selects_batch_rows():
    mt.manual_seed(4)
    model = make_model().eval()
    enc_X, valid_lens = tokens(3, 5), [5, 2, 3]
    state = model.begin_decoding(enc_X, valid_lens)
    picked = model.reorder_state(state, [2, 0, 0])  # rows may repeat (beam search)
    assert picked.hidden_state.shape == (2, 3, 8) and picked.enc_valid_lens.tolist() == [3, 5, 5]
    dec_X = tokens(3, 1, seed=1)
    logits, _ = model.decode_step(dec_X, picked)
    direct_state = model.begin_decoding(enc_X[mt.tensor([2, 0, 0])], [3, 5, 5])
    direct, _ = model.decode_step(dec_X, direct_state)
    np.testing.assert_allclose(logits.numpy(), direct.numpy(), rtol=1e-12)


def test_scorer_and_pooling_are_plugins_by_name():
    mt.manual_seed(5)
    model = make_model(scorer="scaled_dot", pooling="sparsemax")
    assert model.decoder.attention.scorer_name == "scaled_dot"
    model(tokens(2, 5), tokens(2, 3, seed=1), mt.tensor([5, 1]))
    w = model.decoder.attention_weights[0].numpy()
    np.testing.assert_allclose(w.sum(axis=-1), 1.0, rtol=1e-12)
    assert (w[1, 0, 1:] == 0).all()
    additive = make_model(scorer_options={"num_hiddens": 5})
    assert additive.decoder.attention.scorer.num_hiddens == 5
    with pytest.raises(Exception, match="did you mean 'additive'"):
        make_model(scorer="addtive")


def test_gradients_end_to_end():
    mt.manual_seed(6)
    model = make_model(vocab=6, embed=2, hiddens=3, layers=1)
    enc_X = mt.tensor(np.random.default_rng(0).integers(0, 6, (2, 4)))
    dec_X = mt.tensor(np.random.default_rng(1).integers(0, 6, (2, 3)))
    valid_lens = mt.tensor([4, 2])
    params = list(model.parameters())
    assert mt.gradcheck(lambda *ps: model(enc_X, dec_X, valid_lens), params)
    names = [n for n, p in model.named_parameters() if p.grad is None or not np.abs(p.grad.numpy()).any()]
    assert names == []  # every parameter, attention's included, takes part


def test_runs_on_the_strict_device():
    mt.manual_seed(7)
    model = make_model(device="strict", dtype=mt.float32)
    enc_X, dec_X = tokens(2, 5, device="strict"), tokens(2, 3, seed=1, device="strict")
    logits = model(enc_X, dec_X, mt.tensor([5, 3], device="strict"))
    assert isinstance(logits.data, array_type("strict"))
    mt.cross_entropy(logits, tokens(2, 3, seed=2, device="strict")).backward()
    for p in model.parameters():
        assert isinstance(p.grad.data, array_type("strict")) and p.grad.dtype == mt.float32
    # lengths given as a list are moved to the model's device
    state = model.begin_decoding(tokens(2, 5, device="strict"), [5, 3])
    assert state.enc_valid_lens.device == "strict"


# -- learning: reverse a sequence -----------------------------------------------------------------
def reversal_batch(rng, batch, max_len=6):
    """Sources of 3..max_len random tokens + <eos>, padded; targets reversed + <eos>;
    decoder inputs <bos> + reversed (teacher forcing)."""
    lens = rng.integers(3, max_len + 1, batch)
    src, dec_in, tgt = (np.full((batch, max_len + 1), PAD) for _ in range(3))
    for i, n in enumerate(lens):
        seq = rng.integers(3, VOCAB, n)
        src[i, :n], src[i, n] = seq, EOS
        tgt[i, :n], tgt[i, n] = seq[::-1], EOS
        dec_in[i, 0], dec_in[i, 1 : n + 1] = BOS, seq[::-1]
    return mt.tensor(src), mt.tensor(dec_in), mt.tensor(tgt), mt.tensor(lens + 1)


def greedy(model, src, valid_lens, steps):
    with mt.no_grad():
        state = model.begin_decoding(src, valid_lens)
        token, out = mt.tensor(np.full((src.shape[0], 1), BOS)), []
        for _ in range(steps):
            logits, state = model.decode_step(token, state)
            token = logits.argmax(axis=-1)
            out.append(token.numpy()[:, 0])
    return np.stack(out, axis=1)


def fit(model, next_batch, steps):
    """Adam at 0.02 with warm-up and cosine decay, gradients clipped at 1: ``steps`` batches."""
    opt = mt.optim.Adam(model.parameters(), lr=0.02)
    schedule = mt.optim.WarmupCosineLR(opt, warmup_steps=10, total_steps=steps)
    for _ in range(steps):
        src, dec_in, tgt, valid_lens = next_batch()
        loss = mt.cross_entropy(model(src, dec_in, valid_lens), tgt, ignore_index=PAD)
        opt.zero_grad()
        loss.backward()
        mt.optim.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        schedule.step()


def test_learns_to_reverse_sequences():
    mt.manual_seed(0)
    rng = np.random.default_rng(0)
    model = make_model(embed=16, hiddens=32, layers=1, dtype=mt.float32)
    fit(model, lambda: reversal_batch(rng, 64), steps=150)

    model.eval()
    src, dec_in, tgt, valid_lens = reversal_batch(np.random.default_rng(1), 200)
    target, real = tgt.numpy(), tgt.numpy() != PAD
    with mt.no_grad():
        teacher_forced = model(src, dec_in, valid_lens).argmax(axis=-1).numpy()
    assert (teacher_forced == target)[real].mean() >= 0.9
    decoded = greedy(model, src, valid_lens, target.shape[1])
    exact = np.mean([(decoded[i] == target[i])[real[i]].all() for i in range(len(target))])
    assert exact >= 0.9


# -- without attention: D2L's Seq2SeqDecoder (the baseline) ---------------------------------------
def make_plain_model(vocab=VOCAB, embed=6, hiddens=8, layers=2, dropout=0.0, dtype=mt.float64):
    encoder = nn.Seq2SeqEncoder(vocab, embed, hiddens, layers, dropout, dtype=dtype)
    return nn.Seq2Seq(encoder, nn.Seq2SeqDecoder(vocab, embed, hiddens, layers, dropout, dtype=dtype))


def test_plain_decoder_shapes_and_its_context_is_the_encoders_last_state():
    mt.manual_seed(10)
    model = make_plain_model()
    enc_X, dec_X = tokens(3, 5), tokens(3, 4, seed=1)
    outputs, enc_state = model.encoder(enc_X)
    state = model.decoder.init_state((outputs, enc_state), [5, 2, 3])
    assert state.context.shape == (3, 8) and state.hidden_state is enc_state
    np.testing.assert_array_equal(state.context.numpy(), outputs.numpy()[-1])  # D2L's enc_output[-1]
    logits, new_state = model.decoder(dec_X, state)
    assert logits.shape == (3, 4, VOCAB) and new_state.hidden_state.shape == (2, 3, 8)
    assert new_state.context is state.context  # the same context at every step
    assert model(enc_X, dec_X, mt.tensor([5, 2, 3])).shape == (3, 4, VOCAB)
    assert not hasattr(model.decoder, "attention")


def test_plain_decoder_step_is_d2ls_formula():
    """s' = GRU([embed(y); c], s) with c the encoder's last-layer state; logits = dense(s')."""
    mt.manual_seed(11)
    model = make_plain_model().eval()
    enc_X, dec_X = tokens(3, 5), tokens(3, 1, seed=1)
    enc_outputs, enc_state = model.encoder(enc_X)
    dec = model.decoder
    logits, state = dec(dec_X, dec.init_state((enc_outputs, enc_state)))
    x = mt.concat([dec.embedding(dec_X), enc_state[-1].unsqueeze(1)], axis=-1).swapaxes(0, 1)
    out, H = dec.rnn(x, enc_state)
    np.testing.assert_allclose(logits.numpy(), dec.dense(out).swapaxes(0, 1).numpy(), rtol=1e-12)
    np.testing.assert_allclose(state.hidden_state.numpy(), H.numpy(), rtol=1e-12)


def test_plain_decoder_stepwise_decoding_equals_teacher_forcing_and_keeps_the_state():
    mt.manual_seed(12)
    model = make_plain_model(dropout=0.3).eval()
    enc_X, dec_X, valid_lens = tokens(3, 5), tokens(3, 4, seed=1), mt.tensor([5, 2, 3])
    full = model(enc_X, dec_X, valid_lens).numpy()
    state = model.begin_decoding(enc_X, valid_lens)
    first = state
    before = [t.numpy().copy() for t in state]
    steps = []
    for t in range(4):
        logits, state = model.decode_step(dec_X[:, t : t + 1], state)
        steps.append(logits.numpy())
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, rtol=1e-10, atol=1e-12)
    assert all((t.numpy() == b).all() for t, b in zip(first, before))  # the state passed in is unchanged
    again, _ = model.decode_step(dec_X[:, :1], first)  # and still usable
    np.testing.assert_array_equal(again.numpy(), steps[0])


def test_plain_decoder_reorder_state_selects_batch_rows():
    mt.manual_seed(13)
    model = make_plain_model().eval()
    enc_X = tokens(3, 5)
    picked = model.reorder_state(model.begin_decoding(enc_X), [2, 0, 0])
    direct = model.begin_decoding(enc_X[mt.tensor([2, 0, 0])])
    dec_X = tokens(3, 1, seed=1)
    np.testing.assert_allclose(model.decode_step(dec_X, picked)[0].numpy(), model.decode_step(dec_X, direct)[0].numpy())


def test_plain_decoder_gradients_reach_the_encoder():
    mt.manual_seed(14)
    model = make_plain_model(vocab=6, embed=2, hiddens=3, layers=1)
    enc_X = mt.tensor(np.random.default_rng(0).integers(0, 6, (2, 4)))
    dec_X = mt.tensor(np.random.default_rng(1).integers(0, 6, (2, 3)))
    assert mt.gradcheck(lambda *ps: model(enc_X, dec_X), list(model.parameters()))
    names = [n for n, p in model.named_parameters() if p.grad is None or not np.abs(p.grad.numpy()).any()]
    assert names == []
    assert any(n.startswith("encoder.") for n, _ in model.named_parameters())


def test_plain_decoder_learns_to_copy_and_decodes_with_greedy_and_beam_search():
    mt.manual_seed(0)
    rng = np.random.default_rng(0)
    model = make_plain_model(embed=16, hiddens=32, layers=1, dtype=mt.float32)

    def copy_batch(rng, batch, max_len=4):
        src, dec_in, tgt, valid_lens = reversal_batch(rng, batch, max_len)
        lens = valid_lens.numpy() - 1
        src = src.numpy().copy()
        for i, n in enumerate(lens):
            src[i, :n] = src[i, :n][::-1]  # the source reversed: the target copies it
        return mt.tensor(src), dec_in, tgt, valid_lens

    fit(model, lambda: copy_batch(rng, 64), steps=250)
    model.eval()
    src, dec_in, tgt, valid_lens = copy_batch(np.random.default_rng(1), 200)
    target, real = tgt.numpy(), tgt.numpy() != PAD
    decoded = greedy(model, src, valid_lens, target.shape[1])
    exact = np.mean([(decoded[i] == target[i])[real[i]].all() for i in range(len(target))])
    assert exact >= 0.9
    # the search loops drive it as they drive the attention decoder: beam search finds the copies too
    from minitensor.inference.decoding import beam_search

    state = model.begin_decoding(src[:20], valid_lens[:20])
    hyps = beam_search(model, state, BOS, EOS, max_len=target.shape[1], beam_size=3)
    found = [h.tokens == [t for t in target[i] if t not in (PAD, EOS)] for i, h in enumerate(hyps)]
    assert len(hyps) == 20 and np.mean(found) >= 0.9 and all(h.attention is None for h in hyps)


@pytest.mark.parametrize("decoder_class", [nn.Seq2SeqDecoder, nn.Seq2SeqAttentionDecoder])
@pytest.mark.parametrize("hiddens, layers", [(16, 2), (8, 1)])
def test_a_decoder_that_does_not_fit_the_encoder_says_so_by_name(decoder_class, hiddens, layers):
    """The decoder's GRU starts from the encoder's state: a different width or depth is named at
    init_state, with both shapes, not left to a broadcast or GRU error steps later."""
    encoder = nn.Seq2SeqEncoder(VOCAB, 6, 8, 2)
    decoder = decoder_class(VOCAB, 6, hiddens, layers)
    with pytest.raises(
        mt.ShapeError,
        match=rf"{decoder_class.__name__}\.init_state: .*\(2, 3, 8\).*num_layers={layers}.*num_hiddens={hiddens}",
    ):
        decoder.init_state(encoder(tokens(3, 4)))
