"""mt.nn.TransformerConfig and Seq2SeqConfig: a model's architecture as one value.

The models take a config, or the settings themselves (their signature before the configs),
from which they build one; both calls must make the same model. The config's defaults are
the ones the models always had, its checks name the field and the value, and a checkpoint
(whose TrainConfig JSON did not change) loads as before.
"""

import dataclasses
import inspect
import json
import os
import shutil

import numpy as np
import pytest

import minitensor as mt
from minitensor import nn

TransformerConfig, Seq2SeqConfig = nn.TransformerConfig, nn.Seq2SeqConfig

HERE = os.path.dirname(__file__)
V = 11
SIZES = dict(vocab_size=V, num_hiddens=8, ffn_num_hiddens=16, num_heads=2, num_blks=2, dropout=0.0)
rng = np.random.default_rng(0)
X = mt.tensor(rng.integers(0, V, (2, 6)))


# -- defaults --------------------------------------------------------------------------------------
# What the models' keyword arguments defaulted to before they took a config.
OLD_DEFAULTS = dict(
    max_len=1000,
    positional="sinusoidal",
    use_bias=False,
    scorer="scaled_dot",
    pooling="softmax",
    scorer_options=None,
    pooling_options=None,
    positional_options=None,
    norm_first=False,
    input_positional=None,
    num_kv_heads=None,
    fused="auto",
    # added with nanoGPT's recipe (issue 27): their defaults build the model as it was
    activation="relu",
    bias=True,
    tie_embeddings=False,
    init="d2l",
)


def test_the_config_defaults_are_the_models_old_defaults():
    defaults = {f.name: f.default for f in dataclasses.fields(TransformerConfig)}
    assert defaults == {**dict.fromkeys(SIZES), **OLD_DEFAULTS}  # the six sizes: no default (None)
    assert list(defaults)[:6] == list(SIZES)  # by position in D2L's order
    seq2seq = {f.name: f.default for f in dataclasses.fields(Seq2SeqConfig)}
    assert seq2seq == dict(
        vocab_size=None,
        embed_size=None,
        num_hiddens=None,
        num_layers=None,
        dropout=0.0,
        scorer="additive",
        pooling="softmax",
        scorer_options=None,
        pooling_options=None,
    )


def test_the_config_agrees_with_the_attention_layers_defaults():
    """The settings the config passes on to MultiHeadAttention default to the layer's own values."""
    layer = inspect.signature(nn.MultiHeadAttention).parameters
    for name in ("scorer", "pooling", "max_len", "num_kv_heads", "fused", "scorer_options", "pooling_options"):
        assert layer[name].default == getattr(TransformerConfig, name), name
    assert layer["bias"].default == TransformerConfig.use_bias
    assert inspect.signature(nn.Attention).parameters["pooling"].default == Seq2SeqConfig.pooling


def test_model_signatures_are_small():
    for cls in (
        nn.TransformerEncoder,
        nn.TransformerDecoder,
        nn.TransformerLM,
        nn.TransformerEncoderBlock,
        nn.TransformerDecoderBlock,
        nn.TransformerEmbedding,
        nn.Seq2SeqAttentionDecoder,
    ):
        params = inspect.signature(cls).parameters
        assert next(iter(params)) == "config" and len(params) <= 7, (cls.__name__, list(params))


# -- the two calls make the same model --------------------------------------------------------------
def build(make, seed=0):
    mt.manual_seed(seed)
    return make()


def assert_same_model(a, b, *inputs):
    assert [(n, p.shape) for n, p in a.named_parameters()] == [(n, p.shape) for n, p in b.named_parameters()]
    for (_, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
        np.testing.assert_array_equal(p.numpy(), q.numpy())
    assert repr(a) == repr(b)
    a.eval(), b.eval()
    with mt.no_grad():
        same_outputs(a(*inputs), b(*inputs))


def same_outputs(x, y):
    """Equal up to the last bit or two: BLAS may sum a product in another order for arrays at
    other addresses (its vector kernels depend on alignment), so equal weights and inputs can
    give float64 outputs one ulp apart; a model built differently would differ far more."""
    np.testing.assert_allclose(x.numpy(), y.numpy(), rtol=1e-13, atol=1e-15)


OPTIONS = [
    {},
    dict(positional="rotary", input_positional="learned", num_kv_heads=1, norm_first=True),
    dict(positional="t5_relative", use_bias=True, max_len=64),
    dict(positional="alibi", input_positional="sinusoidal", scorer="additive", pooling="sparsemax"),
    dict(positional="sliding_window", positional_options={"window": 2}, fused=False),
]


@pytest.mark.parametrize("options", OPTIONS)
def test_lm_from_settings_and_from_config_are_the_same(options):
    config = TransformerConfig(**SIZES, **options)
    old = build(lambda: nn.TransformerLM(*SIZES.values(), dtype=mt.float64, **options))
    new = build(lambda: nn.TransformerLM(config, dtype=mt.float64))
    by_name = build(lambda: nn.TransformerLM(config=config, dtype=mt.float64))
    assert_same_model(old, new, X)
    assert_same_model(new, by_name, X)
    assert old.config == new.config == config and new.config is config and new.decoder.config is config


@pytest.mark.parametrize("options", OPTIONS)
def test_encoder_decoder_from_settings_and_from_config_are_the_same(options):
    config = TransformerConfig(**SIZES, **options)

    def old():
        enc = nn.TransformerEncoder(**SIZES, dtype=mt.float64, **options)
        return nn.EncoderDecoder(enc, nn.TransformerDecoder(*SIZES.values(), dtype=mt.float64, **options))

    def new():
        enc = nn.TransformerEncoder(config, dtype=mt.float64)
        return nn.EncoderDecoder(enc, nn.TransformerDecoder(config, dtype=mt.float64))

    a, b = build(old), build(new)
    assert_same_model(a, b, X, X[:, :4], mt.tensor([6, 3]))
    assert a.encoder.config == b.encoder.config == config


def test_blocks_and_embedding_from_settings_and_from_config_are_the_same():
    H = mt.tensor(rng.normal(size=(2, 5, 8)))
    config = TransformerConfig(num_hiddens=8, ffn_num_hiddens=16, num_heads=2, dropout=0.0, positional="alibi")
    old = build(lambda: nn.TransformerEncoderBlock(8, 16, 2, 0.0, positional="alibi", dtype=mt.float64))
    assert_same_model(old, build(lambda: nn.TransformerEncoderBlock(config, dtype=mt.float64)), H)

    def decoder_block(*args, **kw):
        blk = nn.TransformerDecoderBlock(*args, dtype=mt.float64, **kw)
        return lambda X: blk(X, [H, None, [None, None]])[0], blk

    old_run, old_blk = build(lambda: decoder_block(8, 16, 2, 0.0, 1, positional="alibi"))
    new_run, new_blk = build(lambda: decoder_block(config, 1))
    assert old_blk.i == new_blk.i == 1
    assert [n for n, _ in old_blk.named_parameters()] == [n for n, _ in new_blk.named_parameters()]
    same_outputs(old_run(H), new_run(H))

    options = dict(max_len=20, positional="learned")
    old = build(lambda: nn.TransformerEmbedding(V, 8, 0.0, dtype=mt.float64, **options))
    new = build(lambda: nn.TransformerEmbedding(TransformerConfig(**SIZES, **options), dtype=mt.float64))
    assert_same_model(old, new, X)


def test_a_model_configs_blocks():
    """A block built from a whole model's config ignores its vocabulary and depth, and takes the
    attention part of its positional setting (nothing for an "inputs" encoding)."""
    blk = nn.TransformerEncoderBlock(TransformerConfig(**SIZES))  # positional="sinusoidal": not the block's
    assert blk.attention.positional is None
    blk = nn.TransformerEncoderBlock(TransformerConfig(**SIZES, positional="rotary", input_positional="learned"))
    assert type(blk.attention.positional).__name__ == "RotaryEncoding"


def test_the_bahdanau_decoder_from_settings_and_from_config_is_the_same():
    enc = nn.Seq2SeqEncoder(V, 4, 8, 2, dtype=mt.float64)
    config = Seq2SeqConfig(V, 4, 8, 2, scorer="scaled_dot")

    def run(decoder):
        return lambda X: decoder(X, decoder.init_state(enc(X), [6, 3]))[0]

    old = build(lambda: nn.Seq2SeqAttentionDecoder(V, 4, 8, 2, scorer="scaled_dot", dtype=mt.float64))
    new = build(lambda: nn.Seq2SeqAttentionDecoder(config, dtype=mt.float64))
    assert [n for n, _ in old.named_parameters()] == [n for n, _ in new.named_parameters()]
    same_outputs(run(old)(X), run(new)(X))
    assert old.config == new.config == config


# -- errors ----------------------------------------------------------------------------------------
def test_an_unknown_setting_names_the_closest_field():
    with pytest.raises(
        TypeError, match=r"TransformerLM got an unexpected argument 'norm_frist'; did you mean 'norm_first'"
    ):
        nn.TransformerLM(**SIZES, norm_frist=True)
    with pytest.raises(TypeError, match=r"'num_head'; did you mean 'num_heads'"):
        nn.TransformerEncoderBlock(8, 16, 2, 0.0, num_head=2)
    with pytest.raises(TypeError, match=r"'embedsize'; did you mean 'embed_size'"):
        nn.Seq2SeqAttentionDecoder(vocab_size=V, embedsize=4, num_hiddens=8, num_layers=1)
    with pytest.raises(TypeError, match=r"replace got an unexpected argument 'vocab'; did you mean 'vocab_size'"):
        TransformerConfig(**SIZES).replace(vocab=3)
    with pytest.raises(TypeError, match=r"'zzz' \(TransformerConfig has: vocab_size, num_hiddens"):
        nn.TransformerLM(**SIZES, zzz=1)


@pytest.mark.parametrize(
    "changes, error, message",
    [
        (
            dict(num_hiddens=30, num_heads=4),
            ValueError,
            r"TransformerConfig: num_hiddens=30 must split evenly into num_heads=4",
        ),
        (
            dict(num_kv_heads=3, num_heads=4),
            ValueError,
            r"TransformerConfig: num_kv_heads=3 must divide num_heads=4.*\[1, 2, 4\]",
        ),
        (dict(dropout=1.5), ValueError, r"TransformerConfig: dropout=1.5 must be a probability in \[0, 1\]"),
        (dict(vocab_size=0), ValueError, r"TransformerConfig: vocab_size=0 must be an integer >= 1"),
        (dict(num_blks=2.0), ValueError, r"num_blks=2.0 must be an integer >= 0"),
        (dict(max_len=-1), ValueError, r"max_len=-1 must be an integer >= 1"),
        (dict(fused="on"), ValueError, r"TransformerConfig: fused must be 'auto', True or False, got 'on'"),
        (dict(norm_first="yes"), TypeError, r"norm_first='yes' must be True or False"),
        (dict(scorer_options=[1]), TypeError, r"scorer_options=\[1\] must be a dict of options or None"),
        (dict(positional=nn.Linear), TypeError, r"positional=.* must be a registered name"),
        (dict(scorer=None), TypeError, r"scorer=None must be a registered name"),
    ],
)
def test_an_invalid_value_is_named(changes, error, message):
    with pytest.raises(error, match=message):
        TransformerConfig(**{**SIZES, "num_hiddens": 16, "num_heads": 4, **changes})
    with pytest.raises(error, match=message.replace("TransformerConfig", "")):
        nn.TransformerLM(**{**SIZES, "num_hiddens": 16, "num_heads": 4, **changes})


def test_the_seq2seq_config_checks_its_values():
    with pytest.raises(ValueError, match=r"Seq2SeqConfig: num_layers=0 must be an integer >= 1"):
        Seq2SeqConfig(V, 4, 8, 0)
    with pytest.raises(ValueError, match=r"Seq2SeqConfig: dropout=-0.1 must be a probability"):
        nn.Seq2SeqAttentionDecoder(V, 4, 8, 1, -0.1)


def test_a_size_the_model_needs_must_be_set():
    with pytest.raises(TypeError, match=r"TransformerLM needs vocab_size: TransformerConfig.vocab_size is None "
                       r"\(set it with config.replace\(vocab_size=...\)\)"):  # fmt: skip
        nn.TransformerLM(TransformerConfig(num_hiddens=8, ffn_num_hiddens=16, num_heads=2, num_blks=1, dropout=0.0))
    with pytest.raises(TypeError, match=r"TransformerEncoderBlock needs dropout: TransformerConfig.dropout is None "
                       r"\(give it as argument 4 of \(num_hiddens, ffn_num_hiddens, num_heads, dropout\) or as "
                       r"dropout=...\)"):  # fmt: skip
        nn.TransformerEncoderBlock(8, 16, 2)
    with pytest.raises(TypeError, match=r"TransformerDecoderBlock needs i"):
        nn.TransformerDecoderBlock(TransformerConfig(**SIZES))
    with pytest.raises(ValueError, match="TransformerDecoder: num_blks must be at least 1, got 0"):
        nn.TransformerDecoder(**{**SIZES, "num_blks": 0})


def test_a_config_and_settings_together_are_refused():
    config = TransformerConfig(**SIZES)
    with pytest.raises(
        TypeError, match=r"TransformerLM: give a TransformerConfig or its fields, not both \(also given: dropout"
    ):
        nn.TransformerLM(config, dropout=0.1)
    with pytest.raises(TypeError, match=r"TransformerLM takes at most 6 settings by position .*got 7"):
        nn.TransformerLM(*SIZES.values(), 1000)
    with pytest.raises(TypeError, match=r"TransformerEncoder got 'dropout' both by position and by name"):
        nn.TransformerEncoder(*SIZES.values(), dropout=0.1)


def test_a_config_is_a_frozen_value():
    config = TransformerConfig(**SIZES)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.dropout = 0.5
    wider = config.replace(num_hiddens=16, num_heads=4)
    assert (config.num_hiddens, wider.num_hiddens, wider.vocab_size) == (8, 16, V)
    with pytest.raises(ValueError, match="num_hiddens=16 must split evenly into num_heads=3"):
        wider.replace(num_heads=3)
    assert TransformerConfig(*SIZES.values()) == TransformerConfig(**SIZES)
    with pytest.raises(TypeError):
        TransformerConfig(*SIZES.values(), 1000)  # max_len and the rest only by name


# -- checkpoints -----------------------------------------------------------------------------------
def test_a_checkpoint_from_before_the_configs_loads_into_config_built_models(tmp_path):
    """tests/data/first_edition_run was saved by a model built from positional sizes; its
    TrainConfig JSON builds a TransformerConfig now, and the weights load into that model."""
    from minitensor.cli import _load_for_inference
    from minitensor.train.config import model_config

    run = tmp_path / "run"
    shutil.copytree(os.path.join(HERE, "data", "first_edition_run"), run)
    model, config, src_vocab, tgt_vocab, *_ = _load_for_inference(str(run))
    assert model.encoder.config == model_config(config, len(src_vocab))
    assert model.decoder.config == model_config(config, len(tgt_vocab))
    assert model.decoder.config.positional == config.positional == "rotary"
    expected = json.loads((run / "expected_logits.json").read_text())
    with mt.no_grad():
        logits = model(mt.tensor(expected["enc_X"]), mt.tensor(expected["dec_X"]), expected["enc_valid_lens"])
    np.testing.assert_allclose(logits.numpy().ravel(), expected["logits"], rtol=1e-5, atol=1e-6)


def test_a_run_trained_now_loads_and_its_config_json_holds_no_engine_config(tmp_path):
    from minitensor.cli import _load_for_inference
    from minitensor.train import TrainConfig, train

    config = TrainConfig(
        task="reverse",
        num_train=64,
        num_heldout=8,
        max_len=4,
        steps=2,
        batch_size=16,
        num_blks=1,
        positional="alibi",
        input_positional="learned",
        progress=False,
        out=str(tmp_path / "run"),
    )
    result = train(config, log=lambda *a: None, figures=False)
    saved = json.loads((tmp_path / "run" / "checkpoint" / "checkpoint.json").read_text())
    assert saved["config"] == config.to_dict()  # the same JSON as ever: TrainConfig's fields
    model, loaded, *_ = _load_for_inference(str(tmp_path / "run"))
    assert loaded == config and model.encoder.config == result.model.encoder.config
    for (name, p), (_, q) in zip(model.named_parameters(), result.model.named_parameters()):
        np.testing.assert_array_equal(p.numpy(), q.numpy(), err_msg=name)
