"""Streamed (fused) attention threaded through the models and the command line: the
Transformer classes pass ``fused`` to every MultiHeadAttention they build, ``TrainConfig.fused``
("auto", "on", "off") maps to it, ``minitensor train --fused`` sets it, and a resumed run may
change it. Streamed and plain models with the same weights give the same loss and gradients."""

import numpy as np
import pytest
from minitensor.nn.attention import MultiHeadAttention
from minitensor.ops.loss import cross_entropy

import minitensor as mt
from minitensor import cli, nn
from minitensor.train.config import ConfigError, TrainConfig, build_model, model_fused
from minitensor.train.loop import train

V = 11  # vocabulary size of the small models
T = 12  # tokens per sequence: short, but fused=True streams at any length
VALID = [12, 7, 3]  # the batch's real lengths: the rest is padding


def attentions(model):
    return [m for m in model.modules() if isinstance(m, MultiHeadAttention)]


def tokens(seed, steps=T):
    return mt.tensor(np.random.default_rng(seed).integers(0, V, (len(VALID), steps)))


def padding_mask(steps=T):
    return mt.tensor(np.arange(steps)[None, :] < np.array(VALID)[:, None])


def loss_and_grads(model, loss_fn):
    model.zero_grad()
    loss = loss_fn(model)
    loss.backward()
    return loss.item(), {name: p.grad.numpy() for name, p in model.named_parameters()}


def assert_same_loss_and_grads(make, loss_fn):
    """make(fused) -> a model; the streamed one gets the plain one's weights."""
    plain, streamed = make(False), make(True)
    streamed.load_state_dict(plain.state_dict())
    loss0, grads0 = loss_and_grads(plain, loss_fn)
    loss1, grads1 = loss_and_grads(streamed, loss_fn)
    assert all(m._stream is not None for m in attentions(streamed))  # every layer really streamed
    assert all(m._stream is None for m in attentions(plain))
    np.testing.assert_allclose(loss1, loss0, rtol=0, atol=1e-10)
    assert grads1.keys() == grads0.keys()
    for name in grads0:
        np.testing.assert_allclose(grads1[name], grads0[name], rtol=0, atol=1e-10, err_msg=name)


# -- the models -----------------------------------------------------------------------------------
@pytest.mark.parametrize("options", [{}, {"positional": "rotary", "num_kv_heads": 1}])
def test_streamed_lm_gives_the_plain_loss_and_gradients(options):
    def make(fused):
        mt.manual_seed(0)
        return nn.TransformerLM(V, 8, 16, 2, 2, 0.0, max_len=32, fused=fused, dtype=mt.float64, **options)

    X, Y, mask = tokens(1), tokens(2), padding_mask()
    assert_same_loss_and_grads(make, lambda lm: cross_entropy(lm(X), Y, mask=mask))


def test_streamed_encoder_decoder_gives_the_plain_loss_and_gradients():
    def make(fused):
        mt.manual_seed(0)
        args = (V, 8, 16, 2, 2, 0.0)
        options = dict(max_len=32, fused=fused, dtype=mt.float64)
        return nn.EncoderDecoder(nn.TransformerEncoder(*args, **options), nn.TransformerDecoder(*args, **options))

    src, dec_X, Y = tokens(3), tokens(4, T - 2), tokens(5, T - 2)
    valid_lens = mt.tensor(VALID)
    mask = padding_mask(T - 2)

    def loss_fn(model):
        return cross_entropy(model(src, dec_X, valid_lens), Y, mask=mask)

    assert_same_loss_and_grads(make, loss_fn)


@pytest.mark.parametrize("fused", ["auto", True, False])
def test_every_attention_of_every_model_gets_fused(fused):
    models = [
        nn.TransformerEncoder(V, 8, 16, 2, 2, 0.0, fused=fused),
        nn.TransformerDecoder(V, 8, 16, 2, 2, 0.0, fused=fused),  # self- and cross-attention
        nn.TransformerLM(V, 8, 16, 2, 1, 0.0, fused=fused),
        nn.TransformerEncoderBlock(8, 16, 2, 0.0, fused=fused),
        nn.TransformerDecoderBlock(8, 16, 2, 0.0, 0, fused=fused),
    ]
    found = [m.fused for model in models for m in attentions(model)]
    assert len(found) == 2 + 4 + 1 + 1 + 2
    assert all(f == fused and type(f) is type(fused) for f in found)
    assert attentions(nn.TransformerDecoderBlock(8, 16, 2, 0.0, 0))[0].fused == "auto"  # the default


def test_fused_true_refuses_an_attention_that_cannot_stream():
    with pytest.raises(ValueError, match="fused=True.*additive"):
        nn.TransformerLM(V, 8, 16, 2, 1, 0.0, scorer="additive", fused=True)
    nn.TransformerLM(V, 8, 16, 2, 1, 0.0, scorer="additive", fused="auto")  # auto: the plain path


# -- the config and the command line --------------------------------------------------------------
@pytest.mark.parametrize("value, fused", [("auto", "auto"), ("on", True), ("off", False)])
def test_the_flag_sets_the_config_and_the_models_argument(value, fused):
    args = cli.build_parser().parse_args(["train", "--fused", value])
    config = cli.config_from_args(args)
    assert config.fused == value and model_fused(config) == fused
    model = build_model(config.replace(num_blks=1, num_hiddens=8, ffn_num_hiddens=16), range(V), range(V))
    found = attentions(model)
    assert len(found) == 3 and all(m.fused == fused and type(m.fused) is type(fused) for m in found)
    assert TrainConfig().fused == "auto"


def test_another_value_is_refused_naming_the_flag(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["train", "--fused", "maybe"])
    assert info.value.code == 2
    assert "--fused" in capsys.readouterr().err
    for value in ("maybe", True, None):
        with pytest.raises(ConfigError, match="--fused must be one of auto, on, off") as info:
            TrainConfig(fused=value).check_fields()
        assert info.value.field == "fused"
    with pytest.raises(ConfigError, match="field 'fused'"):
        TrainConfig.from_dict({"fused": "yes"})


def test_fused_on_is_a_config_error_where_attention_cannot_stream(tmp_path, capsys):
    for value in ("auto", "off"):
        TrainConfig(model="bahdanau", fused=value).validate()
    with pytest.raises(ConfigError, match="--fused on.*Bahdanau") as info:
        TrainConfig(model="bahdanau", fused="on").validate()
    assert info.value.field == "fused"
    code = cli.main(["train", "--model", "bahdanau", "--fused", "on", "--out", str(tmp_path / "run")])
    assert code == 2 and "Bahdanau" in capsys.readouterr().err
    TrainConfig(fused="on", dropout=0.1).validate()  # the stream drops the weights itself
    with pytest.raises(ConfigError, match="--fused on: the scorer 'additive'") as info:
        build_model(TrainConfig(fused="on", scorer="additive", num_blks=1, num_hiddens=8), range(V), range(V))
    assert info.value.field == "fused"


# -- resuming -------------------------------------------------------------------------------------
def test_a_resumed_run_may_change_fused(tmp_path):
    pytest.importorskip("safetensors")
    assert "fused" in TrainConfig.resumable_fields()
    out = str(tmp_path / "run")
    tiny = ["--task", "reverse", "--num-train", "64", "--num-heldout", "8", "--max-len", "3", "--epochs", "1"]
    tiny += ["--batch-size", "32", "--num-blks", "1", "--num-hiddens", "8", "--ffn-num-hiddens", "16"]
    tiny += ["--num-heads", "2", "--no-progress", "--out", out, "--fused", "off"]
    config = cli.config_from_args(cli.build_parser().parse_args(["train", *tiny]))
    train(config, log=lambda message: None, figures=False)
    # the command line takes --fused with --resume, and the run continues streamed
    args = cli.build_parser().parse_args(["train", "--resume", "--out", out, "--fused", "on", "--epochs", "2"])
    resumed = cli._resumed_config(args)
    assert resumed.fused == "on" and resumed.epochs == 2 and resumed.num_hiddens == 8
    result = train(resumed, log=lambda message: None, resume=True, figures=False)
    assert result.step == 4 and all(m.fused is True for m in attentions(result.model))


@pytest.mark.parametrize("positional", ["sinusoidal", "learned", "rotary"])
def test_an_lm_window_longer_than_1000_gets_position_tables_that_long(positional):
    """--lm-num-steps 2048 (what streaming makes affordable) must not stop at max_len=1000."""
    from minitensor.data import Vocab

    config = TrainConfig.recipe("lm", text="unused.txt", lm_num_steps=1200, positional=positional)
    config = config.replace(num_hiddens=8, ffn_num_hiddens=8, num_heads=2, num_blks=1)
    vocab = Vocab(list("abc"))
    model = build_model(config, vocab, vocab)
    with mt.no_grad():
        out = model(mt.tensor(np.zeros((1, 1200), dtype=np.int64)))
    assert out.shape == (1, 1200, len(vocab))
