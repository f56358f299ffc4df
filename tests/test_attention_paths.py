"""One attention path (the plugin contract, second edition): score biases, grouped heads,
cached decoding, and the models and commands that take them by name."""

import json
import os
import shutil

import numpy
import pytest
from minitensor.errors import ShapeError

import minitensor as mt
from minitensor import hookimpl, nn
from minitensor import plugins as mtp
from minitensor.testing import check_incremental_decoding, check_positional_encoding
from minitensor.train.config import ConfigError, TrainConfig

HERE = os.path.dirname(__file__)
rng = numpy.random.default_rng(0)


def randn(*shape):
    return mt.tensor(rng.standard_normal(shape))


# -- Attention(bias=) -----------------------------------------------------------------------------
def test_a_bias_is_added_to_the_scores_before_the_pooling():
    attn = nn.Attention("scaled_dot", "softmax", dtype="float64")
    q, k, v = randn(2, 3, 4), randn(2, 5, 4), randn(2, 5, 6)
    bias = rng.standard_normal((3, 5))
    bias[0, 4] = -numpy.inf
    out = attn(q, k, v, valid_lens=[5, 4], bias=bias).numpy()
    scores = q.numpy() @ k.numpy().swapaxes(-1, -2) / 2.0 + bias
    scores[1, :, 4:] = -numpy.inf
    weights = numpy.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    numpy.testing.assert_allclose(attn.attention_weights.numpy(), weights, rtol=1e-12)
    assert attn.attention_weights.numpy()[0, 0, 4] == 0.0  # -inf: may not attend
    numpy.testing.assert_allclose(out, weights @ v.numpy(), rtol=1e-12)


def test_a_bias_gets_its_gradient_and_composes_with_any_pooling():
    attn = nn.Attention("dot", "sparsemax", dtype="float64")
    q, k, v = randn(3, 4), randn(5, 4), randn(5, 2)
    bias = mt.tensor(rng.standard_normal((3, 5)), requires_grad=True)
    assert mt.gradcheck(lambda b: attn(q, k, v, causal=True, bias=b), [bias])


def test_a_bias_of_the_wrong_shape_or_dtype_is_named():
    attn = nn.Attention("dot", "softmax", dtype="float64")
    q, k, v = randn(3, 4), randn(5, 4), randn(5, 2)
    with pytest.raises(ShapeError, match=r"bias of shape \(5, 3\) does not broadcast to the scores \(3, 5\)"):
        attn(q, k, v, bias=numpy.zeros((5, 3)))
    with pytest.raises(TypeError, match="bias is float32 but the scores are float64"):
        attn(q, k, v, bias=mt.zeros(3, 5))


# -- grouped-query attention ----------------------------------------------------------------------
def test_num_kv_heads_equal_to_num_heads_is_the_first_edition_layer():
    plain = nn.MultiHeadAttention(16, 4, dtype="float64")
    grouped = nn.MultiHeadAttention(16, 4, num_kv_heads=4, dtype="float64")
    assert {k: tuple(v.shape) for k, v in plain.state_dict().items()} == {
        k: tuple(v.shape) for k, v in grouped.state_dict().items()
    }
    grouped.load_state_dict(plain.state_dict())
    X = randn(2, 5, 16)
    numpy.testing.assert_array_equal(
        grouped(X, X, X, valid_lens=[5, 3]).numpy(), plain(X, X, X, valid_lens=[5, 3]).numpy()
    )


@pytest.mark.parametrize("scorer", ["scaled_dot", "additive"])  # the grouped fast path, and repeated keys
@pytest.mark.parametrize("g", [1, 2])
def test_grouped_heads_share_keys_and_values_within_a_group(scorer, g):
    """Head i reads key/value head i // (num_heads / g): the same as the first-edition layer
    whose W_k, W_v repeat each group's rows for every head of the group."""
    H, d = 4, 4
    grouped = nn.MultiHeadAttention(16, H, scorer=scorer, num_kv_heads=g, dtype="float64")
    assert tuple(grouped.W_k.weight.shape) == (g * d, 16) and tuple(grouped.W_v.weight.shape) == (g * d, 16)
    plain = nn.MultiHeadAttention(16, H, scorer=scorer, dtype="float64")
    state = {k: v.numpy() for k, v in grouped.state_dict().items()}
    heads = numpy.arange(H) // (H // g)
    for name in ("W_k.weight", "W_v.weight"):
        rows = state[name].reshape(g, d, 16)
        state[name] = rows[heads].reshape(H * d, 16)
    plain.load_state_dict(state)
    Xq, Xkv = randn(2, 3, 16), randn(2, 6, 16)
    mask = rng.random((2, 3, 6)) < 0.8
    numpy.testing.assert_allclose(
        grouped(Xq, Xkv, Xkv, mask=mask).numpy(), plain(Xq, Xkv, Xkv, mask=mask).numpy(), rtol=1e-12, atol=1e-12
    )
    assert grouped.attention_weights.shape == (2, H, 3, 6)
    X = mt.tensor(rng.standard_normal((2, 3, 16)), requires_grad=True)
    assert mt.gradcheck(lambda x: grouped(x, x, x, causal=True), [X])


def test_the_cache_of_grouped_heads_shrinks():
    mha = nn.MultiHeadAttention(16, 4, num_kv_heads=1)
    _, cache = mha.cached_self_attention(randn(2, 7, 16).float())
    assert cache.keys().shape == cache.values().shape == (2, 1, 7, 4)


@pytest.mark.parametrize("g", [0, 3, 2.0, -1])
def test_num_kv_heads_must_divide_num_heads(g):
    with pytest.raises(ValueError, match=rf"num_kv_heads={g!r} must divide num_heads=4.*\[1, 2, 4\]"):
        nn.MultiHeadAttention(16, 4, num_kv_heads=g)


# -- cached decoding equals the full pass ----------------------------------------------------------
SCORERS = ["dot", "scaled_dot", "additive", "gaussian", "cosine", "l2"]
POSITIONALS = [None, "rotary", "alibi", "t5_relative", "sliding_window"]


@pytest.mark.parametrize("positional", POSITIONALS)
@pytest.mark.parametrize("scorer", SCORERS)
def test_every_scorer_and_encoding_decodes_incrementally(scorer, positional):
    assert check_incremental_decoding(scorer=scorer, positional=positional, num_kv_heads=2)


@pytest.mark.parametrize("pooling", ["softmax", "sparsemax", "entmax15", "alpha_entmax", "average"])
@pytest.mark.parametrize("g", [1, 4])
def test_every_pooling_decodes_incrementally(pooling, g):
    assert check_incremental_decoding(pooling=pooling, positional="alibi", num_kv_heads=g)


def test_window_options_decode_incrementally():
    for window in (0, 1, 3):
        assert check_incremental_decoding(positional="sliding_window", positional_options={"window": window})


class _OffByOne(nn.Module):
    """ALiBi-like, but with a cache (q_offset > 0) the query positions are read one off."""

    applies_to, relative, window, cross = "scores", True, None, False

    def __init__(self, num_heads, max_len=1000, dtype=None, device=None, **options):
        super().__init__()
        self.register_buffer("unit", mt.ones((), dtype=dtype), persistent=False)  # follows .to(dtype)

    def bias(self, distances):
        return mt.tensor(-0.5 * numpy.abs(distances), dtype=self.unit.dtype)

    def forward(self, num_queries, num_keys, q_offset=0, k_offset=0):
        first = q_offset - 1 if q_offset else 0  # (+ 1 would shift a causal row by a constant: harmless)
        i = numpy.arange(first, first + num_queries)[:, None]
        j = numpy.arange(k_offset, k_offset + num_keys)[None, :]
        return self.bias(j - i)

    def relative_bias(self, min_distance, max_distance):
        return self.bias(numpy.arange(min_distance, max_distance + 1)[None])


class _IgnoresQueryOffset(_OffByOne):
    """Always puts the queries at position 0: right for a whole sequence, wrong with a cache."""

    def forward(self, num_queries, num_keys, q_offset=0, k_offset=0):
        i = numpy.arange(num_queries)[:, None]
        j = numpy.arange(k_offset, k_offset + num_keys)[None, :]
        return self.bias(j - i)


class _RotatesFromZero(nn.Module):
    """A "qk" encoding that forgets its offsets: every call rotates from position 0."""

    applies_to = "qk"

    def __init__(self, num_hiddens, max_len=1000, dropout=0.0, dtype=None, device=None):
        super().__init__()
        self.rotary = mtp.lookup("positional encoding", "rotary")(num_hiddens, max_len, dtype=dtype, device=device)

    def forward(self, q, k, q_offset=0, k_offset=0):
        return self.rotary(q, k)


@pytest.fixture
def broken_encodings():
    class Plugin:
        @hookimpl
        def minitensor_positional_encodings(self):
            return {
                "off_by_one": _OffByOne,
                "query_at_zero": _IgnoresQueryOffset,
                "rotates_from_zero": _RotatesFromZero,
            }

    plugin = Plugin()
    mtp.register(plugin, name="broken-encodings")
    yield
    mtp.unregister(plugin)


@pytest.mark.parametrize("name", ["query_at_zero", "rotates_from_zero"])
def test_an_encoding_that_mishandles_the_cache_is_rejected(broken_encodings, name):
    with pytest.raises(
        AssertionError, match=rf"positional='{name}'.*differs from the full causal pass from position 1"
    ):
        check_incremental_decoding(positional=name)


def test_an_off_by_one_cache_offset_is_rejected_by_the_kit(broken_encodings):
    with pytest.raises(AssertionError, match="offsets shift the bias consistently"):
        check_positional_encoding(_OffByOne)
    with pytest.raises(AssertionError, match="differs from the full causal pass"):
        check_incremental_decoding(positional="off_by_one")


# -- the models ----------------------------------------------------------------------------------
def _seq2seq(positional, **kw):
    enc = nn.TransformerEncoder(11, 16, 32, 4, 2, 0.0, positional=positional, dtype="float64", **kw)
    dec = nn.TransformerDecoder(11, 16, 32, 4, 2, 0.0, positional=positional, dtype="float64", **kw)
    return nn.EncoderDecoder(enc, dec)


@pytest.mark.parametrize("positional", ["alibi", "t5_relative", "sliding_window", "rotary"])
@pytest.mark.parametrize("g", [1, 4])
def test_encoder_decoder_decodes_step_by_step_as_in_training(positional, g):
    _decodes_as_trained(_seq2seq(positional, num_kv_heads=g, input_positional="learned"))


def _decodes_as_trained(model):
    """Token-by-token decoding (with the caches) gives the logits of the whole-target pass."""
    X, Y = mt.tensor(rng.integers(0, 11, (2, 6))), mt.tensor(rng.integers(0, 11, (2, 5)))
    full = model(X, Y, [6, 4]).numpy()
    state, steps = model.begin_decoding(X, [6, 4]), []
    for t in range(5):
        logits, state = model.decode_step(Y[:, t : t + 1], state)
        steps.append(logits.numpy())
    numpy.testing.assert_allclose(numpy.concatenate(steps, axis=1), full, rtol=1e-10, atol=1e-12)


def test_t5_tables_are_shared_within_a_stack_and_directed_as_t5_does():
    model = _seq2seq("t5_relative")
    encoder_biases = {id(b.attention.positional) for b in model.encoder.blks}
    decoder_biases = {id(b.attention1.positional) for b in model.decoder.blks}
    assert len(encoder_biases) == 1 and len(decoder_biases) == 1 and encoder_biases != decoder_biases
    assert model.encoder.blks[0].attention.positional.bidirectional is True
    assert model.decoder.blks[0].attention1.positional.bidirectional is False
    assert all(b.attention2.positional is None for b in model.decoder.blks)  # cross = False
    tables = [p for name, p in model.named_parameters() if "positional" in name]
    assert len(tables) == 2  # one per stack, trained once
    # nothing is added to the embeddings unless asked
    assert model.encoder.embedding.pos_encoding is None
    lm = nn.TransformerLM(11, 16, 32, 4, 2, 0.0, positional="alibi", input_positional="sinusoidal")
    assert type(lm.decoder.embedding.pos_encoding).__name__ == "SinusoidalEncoding"


def test_bidirectional_is_the_models_to_set():
    with pytest.raises(ValueError, match="bidirectional is set by the model"):
        _seq2seq("t5_relative", positional_options={"bidirectional": False})


def test_a_cross_encoding_reaches_the_encoder_decoder_attention():
    class CrossAlibi(mtp.lookup("positional encoding", "alibi")):
        cross = True

    class Plugin:
        @hookimpl
        def minitensor_positional_encodings(self):
            return {"cross_alibi": CrossAlibi}

    plugin = Plugin()
    mtp.register(plugin, name="cross-alibi")
    try:
        model = _seq2seq("cross_alibi")
        assert all(isinstance(b.attention2.positional, CrossAlibi) for b in model.decoder.blks)
        assert model.decoder.blks[0].attention2.positional is not model.decoder.blks[0].attention1.positional
        _decodes_as_trained(model)
    finally:
        mtp.unregister(plugin)


@pytest.mark.parametrize(
    "positional, input_positional, message",
    [
        ("sinusoidal", "learned", 'is an "inputs" encoding already'),
        ("alibi", "rotary", 'names an "inputs" encoding'),
    ],
)
def test_input_positional_goes_beside_a_qk_or_scores_encoding(positional, input_positional, message):
    with pytest.raises(ValueError, match=message):
        _seq2seq(positional, input_positional=input_positional)


def test_an_inputs_encoding_is_refused_inside_attention():
    with pytest.raises(ValueError, match='attention layers take "qk" encodings.*"scores" encodings'):
        nn.MultiHeadAttention(16, 4, positional="sinusoidal")


# -- checkpoints ---------------------------------------------------------------------------------
def test_a_first_edition_checkpoint_loads_unchanged(tmp_path):
    """A run saved before score biases and grouped heads existed (tests/data/first_edition_run:
    rotary encoding, 2 heads) loads and gives the logits it gave then."""
    from minitensor.cli import _load_for_inference

    run = tmp_path / "run"
    shutil.copytree(os.path.join(HERE, "data", "first_edition_run"), run)
    model, config, *_ = _load_for_inference(str(run))
    assert (config.num_kv_heads, config.input_positional, config.positional_options) == (None, None, {})
    expected = json.loads((run / "expected_logits.json").read_text())
    with mt.no_grad():
        logits = model(mt.tensor(expected["enc_X"]), mt.tensor(expected["dec_X"]), expected["enc_valid_lens"])
    numpy.testing.assert_allclose(logits.numpy().ravel(), expected["logits"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("num_kv_heads", "2", "field 'num_kv_heads' must be an integer"),
        ("num_kv_heads", 0, "field 'num_kv_heads' must be"),
        ("positional_options", {"window": [1]}, "field 'positional_options'"),
        ("input_positional", "", "field 'input_positional' must be a non-empty name"),
        ("heldout_max_len", -3, "field 'heldout_max_len'"),
    ],
)
def test_a_checkpoint_config_with_bad_new_settings_is_refused(field, value, message):
    saved = TrainConfig().to_dict()
    saved[field] = value
    with pytest.raises(ConfigError, match=message):
        TrainConfig.from_dict(saved, "checkpoint config")


@pytest.mark.parametrize(
    "changes, field, message",
    [
        (dict(num_kv_heads=3), "num_kv_heads", "--num-kv-heads 3 must divide --num-heads 4"),
        (dict(heldout_max_len=20), "heldout_min_len", "reverse, copy and sort tasks"),
        (dict(task="reverse", heldout_min_len=12, heldout_max_len=11), "heldout_min_len", "are empty"),
        (dict(input_positional="learned"), "input_positional", "--positional 'sinusoidal' is an \"inputs\" encoding"),
        (dict(model="bahdanau", positional_options={"window": 2}), "input_positional", "has no positional encoding"),
    ],
)
def test_config_validation_of_the_new_settings(changes, field, message):
    with pytest.raises(ConfigError, match=message) as e:
        TrainConfig(**changes).validate()
    assert e.value.field == field


def test_held_out_lengths_come_from_their_own_range():
    from minitensor.train.config import build_data

    mt.manual_seed(0)
    data = build_data(TrainConfig(task="reverse", num_train=50, num_heldout=30, heldout_min_len=11, heldout_max_len=14))
    assert {len(s) for s, _ in data.train} <= set(range(1, 11))
    assert {len(s) for s, _ in data.heldout} <= set(range(11, 15))
    assert data.num_steps == max(len(s) for s, _ in data.heldout) + 1


# -- the command line ----------------------------------------------------------------------------
TINY = [
    "--task",
    "reverse",
    "--num-train",
    "64",
    "--num-heldout",
    "8",
    "--max-len",
    "3",
    "--batch-size",
    "32",
    "--num-blks",
    "1",
    "--num-hiddens",
    "8",
    "--ffn-num-hiddens",
    "16",
    "--num-heads",
    "2",
    "--no-progress",
]


def test_train_takes_the_new_settings_records_them_and_resumes_with_them(tmp_path, capsys):
    from minitensor import cli
    from minitensor.train.run import load_run_checkpoint

    out = str(tmp_path / "run")
    new = [
        "--positional",
        "sliding_window",
        "--positional-opt",
        "window=2",
        "--input-positional",
        "learned",
        "--num-kv-heads",
        "1",
        "--heldout-min-len",
        "4",
        "--heldout-max-len",
        "5",
    ]
    assert cli.main(["train", *TINY, *new, "--epochs", "1", "--out", out]) == 0
    assert "positional sliding_window" in capsys.readouterr().out
    config, _ = load_run_checkpoint(os.path.join(out, "checkpoint"))
    assert (
        config.positional,
        config.positional_options,
        config.input_positional,
        config.num_kv_heads,
        config.heldout_min_len,
        config.heldout_max_len,
    ) == ("sliding_window", {"window": 2}, "learned", 1, 4, 5)
    assert cli.main(["translate", "--checkpoint", out, "abc"]) == 0
    assert cli.main(["train", "--out", out, "--resume", "--epochs", "2"]) == 0
    capsys.readouterr()
    assert cli.main(["train", "--out", out, "--resume", "--epochs", "3", "--num-kv-heads", "2"]) == 2
    assert "refused: --num-kv-heads 2 (the run has 1)" in capsys.readouterr().err


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--num-kv-heads", "3"], "--num-kv-heads 3 must divide --num-heads 2"),
        (["--positional", "alibbi"], "did you mean 'alibi'?"),
        (
            ["--positional", "sliding_window", "--positional-opt", "windo=2"],
            "unknown option(s) 'windo' (did you mean 'window'?); it takes window",
        ),
        (["--positional", "sliding_window", "--positional-opt", "window=-1"], "window must be >= 0, got -1"),
        (["--positional", "alibi", "--input-positional", "rotary"], "--input-positional 'rotary' has applies_to='qk'"),
        (["--input-positional", "learned"], "--positional 'sinusoidal' is an \"inputs\" encoding already"),
        (["--heldout-min-len", "9", "--heldout-max-len", "8"], "the held-out lengths 9..8 are empty"),
        (["--task", "date", "--heldout-max-len", "8"], "set the held-out lengths of the reverse, copy and sort tasks"),
    ],
)
def test_wrong_new_settings_are_one_line_errors(tmp_path, capsys, flags, message):
    from minitensor import cli

    assert cli.main(["train", *TINY, *flags, "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
    assert not (tmp_path / "run").exists()
