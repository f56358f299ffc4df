"""nanoGPT's model and recipe by name: the TransformerConfig options (activation, bias,
tie_embeddings, init="gpt2"), the training options (betas, min_lr, weight-decay groups,
eval_interval, special_tokens) and ``--preset gpt-char``."""

import math
import subprocess
import sys

import numpy as np
import pytest

import minitensor as mt
from minitensor.cli import build_parser, config_from_args
from minitensor.data import Batches
from minitensor.train.config import PRESETS, TrainConfig, build_data, build_optimizer, build_scheduler, model_max_len
from minitensor.train.loop import _arrays


def _lm(**fields):
    config = mt.nn.TransformerConfig(11, 16, 32, 2, 3, 0.0, norm_first=True, positional="learned", max_len=8, **fields)
    return mt.nn.TransformerLM(config)


def test_tied_embeddings_one_parameter_used_by_the_logits():
    lm = _lm(tie_embeddings=True, bias=False)
    E = lm.decoder.embedding.token_embedding.weight
    assert lm.decoder.dense.weight is E
    names = [n for n, _ in lm.named_parameters()]
    assert "decoder.dense.weight" not in names and "decoder.embedding.token_embedding.weight" in names
    untied = _lm(bias=False)
    assert sum(p.numel() for p in untied.parameters()) - sum(p.numel() for p in lm.parameters()) == E.numel()
    # the logits are the final states against the embedding's rows
    X = mt.tensor(np.array([[1, 2, 3]]))
    with mt.no_grad():
        logits = lm(X).numpy()
        lm.decoder.dense.weight.copy_(lm.decoder.dense.weight * 2)  # the same tensor: the embedding doubles too
    assert np.allclose(E.numpy(), lm.decoder.dense.weight.numpy())
    # state_dict lists the weight under both names, and loads back
    sd = lm.state_dict()
    assert "decoder.dense.weight" in sd and "decoder.embedding.token_embedding.weight" in sd
    lm2 = _lm(tie_embeddings=True, bias=False)
    lm2.load_state_dict({k: v.numpy() for k, v in sd.items()})
    assert lm2.decoder.dense.weight is lm2.decoder.embedding.token_embedding.weight
    assert logits.shape == (1, 3, 11)


def test_gelu_ffn_is_the_formula():
    ffn = mt.nn.PositionWiseFFN(4, 8, activation="gelu")
    X = np.random.default_rng(0).normal(size=(2, 3, 4)).astype(np.float32)
    H = X @ ffn.dense1.weight.numpy().T + ffn.dense1.bias.numpy()
    phi = 0.5 * (1 + np.vectorize(math.erf)(H / math.sqrt(2)))
    want = (H * phi) @ ffn.dense2.weight.numpy().T + ffn.dense2.bias.numpy()
    assert np.allclose(ffn(mt.tensor(X)).numpy(), want, atol=1e-5)


def test_bias_off_leaves_no_bias_parameters():
    lm = _lm(bias=False)
    assert not [n for n, _ in lm.named_parameters() if n.endswith("bias")]
    assert [n for n, _ in _lm().named_parameters() if n.endswith("bias")]


def test_gpt2_init_statistics():
    mt.manual_seed(0)
    L = 3
    config = mt.nn.TransformerConfig(50, 64, 256, 4, L, 0.0, norm_first=True, positional="learned", init="gpt2")
    lm = mt.nn.TransformerLM(config)
    for name, p in lm.named_parameters():
        std = float(p.numpy().std())
        if name.endswith(("W_o.weight", "dense2.weight")):
            assert std == pytest.approx(0.02 / math.sqrt(2 * L), rel=0.1), name
        elif p.ndim >= 2:
            assert std == pytest.approx(0.02, rel=0.1), name
        elif name.endswith("bias"):
            assert not p.numpy().any(), name
    assert lm.decoder.embedding.scale == 1.0  # GPT-2 adds the embeddings unscaled


def test_default_init_is_unchanged():
    mt.manual_seed(3)
    a = _lm().state_dict()
    mt.manual_seed(3)
    b = _lm(activation="relu", bias=True, tie_embeddings=False, init="d2l").state_dict()
    assert all(np.array_equal(a[k].numpy(), b[k].numpy()) for k in a)


def _tiny_config(**changes):
    return TrainConfig(model="lm", num_hiddens=16, ffn_num_hiddens=32, num_heads=2, num_blks=2, **changes)


def test_adamw_groups_decay_matrices_and_embeddings_only():
    config = _tiny_config(optimizer="adamw", weight_decay=0.1, positional="learned")
    lm = _lm()
    opt = build_optimizer(config, lm)
    decayed, plain = opt.param_groups
    assert decayed["weight_decay"] == 0.1 and plain["weight_decay"] == 0.0
    assert all(p.ndim >= 2 for p in decayed["params"]) and all(p.ndim == 1 for p in plain["params"])
    assert any(p is lm.decoder.embedding.token_embedding.weight for p in decayed["params"])
    old = build_optimizer(config.replace(decay_all=True), lm)
    assert len(old.param_groups) == 1 and old.param_groups[0]["weight_decay"] == 0.1


def test_betas_reach_the_optimizer_and_min_lr_floors_the_schedule():
    lm = _lm()
    opt = build_optimizer(_tiny_config(optimizer="adamw", betas=[0.9, 0.99]), lm)
    assert tuple(opt.param_groups[0]["betas"]) == (0.9, 0.99)
    config = _tiny_config(lr=1e-3, min_lr=1e-4, warmup_steps=2)
    scheduler = build_scheduler(config, opt, 10)
    assert scheduler.lr_at(10, 1e-3) == pytest.approx(1e-4)
    assert scheduler.lr_at(50, 1e-3) == pytest.approx(1e-4)


def test_old_configs_load_as_the_runs_they_were():
    old = TrainConfig().to_dict()
    for name in ("decay_all", "special_tokens", "lm_context_tables"):
        old.pop(name)
    config = TrainConfig.from_dict(old)
    assert config.decay_all and config.special_tokens and not config.lm_context_tables
    assert model_max_len(config.replace(model="lm")) == 1000
    # a learned table holds the context; one computed from a formula keeps 1000 positions, so
    # the model can be read past its context (length extrapolation, an ONNX window of any length)
    assert model_max_len(TrainConfig(model="lm", lm_num_steps=64, positional="learned")) == 64
    assert model_max_len(TrainConfig(model="lm", lm_num_steps=64, positional="rotary")) == 1000
    assert model_max_len(TrainConfig(model="lm", lm_num_steps=2000, positional="sinusoidal")) == 2000


def test_preset_sets_the_fields_and_flags_override_it():
    args = build_parser().parse_args(["train", "--preset", "gpt-char", "--lr", "3e-3", "--no-tie-embeddings"])
    config = config_from_args(args)
    assert config.text.endswith("tinyshakespeare.txt") and config.model == "lm"
    assert config.lr == 3e-3 and config.tie_embeddings is False
    for name, value in PRESETS["gpt-char"].items():
        if name not in ("lr", "tie_embeddings"):
            assert getattr(config, name) == value, name
    gpu = config_from_args(build_parser().parse_args(["train", "--preset", "gpt-char-gpu"]))
    assert (gpu.num_blks, gpu.num_heads, gpu.num_hiddens, gpu.lm_num_steps, gpu.batch_size) == (6, 6, 384, 256, 64)
    assert (gpu.dropout, gpu.steps, gpu.min_lr, gpu.betas) == (0.2, 5000, 1e-4, [0.9, 0.99])


def test_help_shows_the_preset_defaults():
    argv = ["train", "--preset", "gpt-char", "--help"]
    text = build_parser(argv)._subparsers._group_actions[0].choices["train"].format_help()
    assert "default 0.001 (--preset gpt-char)" in " ".join(text.split())
    plain = build_parser(["train", "--help"])._subparsers._group_actions[0].choices["train"].format_help()
    assert "--preset gpt-char" not in " ".join(plain.split()).replace("--preset {", "")


def test_preset_run_end_to_end(tmp_path):
    """30 steps of --preset gpt-char at a tiny size, through the command line: the nanoGPT-style
    estimates are printed, and the samples (from a vocabulary without special tokens) hold newlines."""
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "minitensor", "train", "--preset", "gpt-char", "--num-hiddens", "16",
           "--ffn-num-hiddens", "64", "--num-blks", "1", "--num-heads", "2", "--lm-num-steps", "32",
           "--steps", "30", "--eval-interval", "15", "--eval-iters", "2", "--max-examples", "30000",
           "--out", str(out), "--no-progress"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "step 15: train loss" in done.stdout and "step 30: train loss" in done.stdout
    assert "ms/step" in done.stdout and "tokens/s" in done.stdout
    samples = [line for line in done.stdout.splitlines() if line.startswith("sample ")]
    assert samples and all("\\n" in line for line in samples)
    gen = subprocess.run(
        [sys.executable, "-m", "minitensor", "generate", "--checkpoint", str(out), "--prompt", "\n", "--max-len", "80"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert gen.returncode == 0, gen.stderr


def test_lm_training_windows_are_views_of_one_token_array(tmp_path):
    """The windows of a text LM's training and held-out arrays are views of the corpus's one
    token array (8 bytes a character), not a copy per window or per array: a minibatch copies
    its rows and nothing else does, so a text costs O(its length) however long the windows."""
    text = "".join(chr(97 + (i * 7) % 26) for i in range(5000))
    (tmp_path / "t.txt").write_text(text)
    config = TrainConfig(model="lm", text=str(tmp_path / "t.txt"), lm_num_steps=16, special_tokens=False)
    data = build_data(config)
    n = config.lm_num_steps
    for which, corpus in (("train", data.train), ("heldout", data.heldout)):
        X, Y = _arrays(config, data, which)
        base = X
        while base.base is not None:
            base = base.base
        assert np.shares_memory(X, Y) and np.shares_memory(base, Y)
        assert base.nbytes <= 8 * len(corpus)  # one token array, whatever the number of windows
        assert X.shape == Y.shape == ((len(corpus) - 1) // n, n)
        assert all(list(X[i]) == corpus[i * n : (i + 1) * n] for i in range(len(X)))
        assert all(list(Y[i]) == corpus[i * n + 1 : (i + 1) * n + 1] for i in range(len(Y)))
    # the minibatches are copies of their rows, and the loader leaves the arrays as they were
    X, Y = _arrays(config, data, "train")
    before = X.copy()
    for xb, yb in Batches(X, Y, batch_size=7, rng=np.random.default_rng(0)):
        assert not np.shares_memory(xb.numpy(), X) and (xb.numpy()[:, 1:] == yb.numpy()[:, :-1]).all()
    assert (X == before).all()


@pytest.mark.parametrize("name", [None, *PRESETS])
def test_text_lms_evaluate_a_minibatch_at_a_time(name):
    """A text LM's held-out loss is computed a training minibatch of windows at a time (as
    nanoGPT's): it never holds the activations of more rows than a training step does (500
    windows of 64 characters took 570 MB, of 128 over 1 GB)."""
    config = TrainConfig.recipe("lm", name)
    assert config.eval_batch_size == config.batch_size < TrainConfig().eval_batch_size
