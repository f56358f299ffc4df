"""The training loop, its checkpoints and resume, and the train / translate / generate commands."""

import os

import numpy
import pytest

from minitensor import cli
from minitensor.train import loop
from minitensor.train.config import TrainConfig, build_model, parse_options
from minitensor.train.loop import TrainingError, train

pytest.importorskip("safetensors")


def quiet(message):
    pass


def reverse_config(tmp_path, **changes):
    """Small enough for seconds on a CPU, big enough that reversal is learnt."""
    settings = dict(
        task="reverse",
        num_train=2400,
        num_heldout=100,
        max_len=5,
        epochs=5,
        batch_size=32,
        num_blks=1,
        dropout=0.0,
        lr=5e-3,
        progress=False,
        out=str(tmp_path / "run"),
    )
    settings.update(changes)
    return TrainConfig(**settings)


def test_reversal_is_learnt_with_positions_and_not_without(tmp_path):
    with_positions = train(reverse_config(tmp_path / "a"), log=quiet)
    assert with_positions.accuracy >= 0.95
    # Without positions self-attention sees the source as a bag of tokens: no way to reverse it.
    without = train(reverse_config(tmp_path / "b", positional="none"), log=quiet)
    assert without.accuracy <= 0.6
    assert with_positions.history["loss"][-1] < without.history["loss"][-1]
    for name in ("loss.png", "attention_cross.png", "attention_encoder_self.png", "attention_decoder_self.png"):
        assert os.path.getsize(tmp_path / "a" / "run" / name) > 0


def _weights(model):
    return {k: v.numpy().copy() for k, v in model.state_dict().items()}


def test_resume_continues_exactly_as_an_uninterrupted_run(tmp_path):
    # dropout on: the resumed run must also restore the random generators
    settings = dict(num_train=300, epochs=2, dropout=0.1, num_blks=1, label_smoothing=0.1)
    whole = train(reverse_config(tmp_path / "whole", **settings), log=quiet)
    config = reverse_config(tmp_path / "parts", **settings)
    first = train(config, log=quiet, stop_after_epochs=1)
    assert not first.finished and first.epoch == 1
    assert len(first.history["loss"]) < len(whole.history["loss"])
    resumed = train(config, log=quiet, resume=True)
    assert resumed.finished and resumed.step == whole.step
    assert resumed.history["loss"] == whole.history["loss"]  # bit for bit, every step
    assert resumed.history["eval"] == whole.history["eval"]
    a, b = _weights(whole.model), _weights(resumed.model)
    assert a.keys() == b.keys()
    for key in a:
        numpy.testing.assert_array_equal(a[key], b[key], err_msg=key)


def test_resume_refuses_a_different_model(tmp_path):
    config = reverse_config(tmp_path, num_train=100, epochs=1)
    train(config, log=quiet)
    with pytest.raises(TrainingError, match="num_hiddens"):
        train(config.replace(num_hiddens=16, ffn_num_hiddens=32), log=quiet, resume=True)


def test_the_same_seed_gives_the_same_run(tmp_path):
    a = train(reverse_config(tmp_path / "a", num_train=200, epochs=1), log=quiet)
    b = train(reverse_config(tmp_path / "b", num_train=200, epochs=1), log=quiet)
    assert a.history["loss"] == b.history["loss"]
    c = train(reverse_config(tmp_path / "c", num_train=200, epochs=1, seed=1), log=quiet)
    assert c.history["loss"] != a.history["loss"]


def test_a_nan_loss_stops_training_with_a_clear_message(tmp_path, monkeypatch):
    real = loop._loss
    calls = []

    def poisoned(*args):
        loss, n = real(*args)
        calls.append(1)
        return (loss * float("nan") if len(calls) == 3 else loss), n

    monkeypatch.setattr(loop, "_loss", poisoned)
    with pytest.raises(TrainingError, match=r"loss became nan at step 3 .*lower learning rate, e\.g\. --lr"):
        train(reverse_config(tmp_path, num_train=200, epochs=1), log=quiet)
    assert not os.path.exists(tmp_path / "run" / "checkpoint")  # no checkpoint of a diverged model


@pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning", "ignore:invalid value:RuntimeWarning")
def test_a_huge_learning_rate_is_caught(tmp_path):
    with pytest.raises(TrainingError, match="diverged"):
        train(reverse_config(tmp_path, num_train=200, epochs=1, lr=1e30, clip_grad_norm=None), log=quiet)


def test_the_bahdanau_model_trains_through_the_loop(tmp_path):
    config = reverse_config(tmp_path, model="bahdanau", task="copy", num_train=640, epochs=3, num_hiddens=16)
    lines = []
    result = train(config, log=lines.append)
    assert "scorer additive, pooling softmax)" in lines[0]  # a GRU has no positional encoding to name
    assert type(result.model).__name__ == "Seq2Seq"
    assert result.model.decoder.attention.scorer_name == "additive"
    losses = result.history["loss"]
    assert numpy.mean(losses[-5:]) < 0.8 * numpy.mean(losses[:5])
    assert 0.0 <= result.accuracy <= 1.0
    assert os.path.getsize(tmp_path / "run" / "attention.png") > 0


def test_scorer_options_are_parsed_by_type():
    assert parse_options(["a=3", "b=0.5", "c=true", "d=hello", "e=none", "f=1e-3"]) == {
        "a": 3,
        "b": 0.5,
        "c": True,
        "d": "hello",
        "e": None,
        "f": 1e-3,
    }
    with pytest.raises(ValueError, match="key=value"):
        parse_options(["oops"])
    parser = cli.build_parser()
    config = cli.config_from_args(
        parser.parse_args(
            [
                "train",
                "--scorer",
                "additive",
                "--scorer-opt",
                "num_hiddens=8",
                "--pooling-opt",
                "temperature=0.5",
                "--task",
                "sort",
                "--norm-first",
            ]
        )
    )
    assert config.scorer_options == {"num_hiddens": 8} and config.pooling_options == {"temperature": 0.5}
    assert config.task == "sort" and config.norm_first and config.out == "runs/sort"
    model = build_model(config.replace(num_blks=1, pooling_options={}), *_vocabs())
    from minitensor.train.checkpoint import model_plugins

    assert {"scorer": "additive", "pooling": "softmax"}.items() <= {
        p["kind"]: p["name"] for p in model_plugins(model)
    }.items()


def _vocabs():
    from minitensor.data import build_vocabs

    return build_vocabs([(list("abc"), list("cba"))])


def test_cli_train_then_translate(tmp_path, capsys):
    out = str(tmp_path / "run")
    assert (
        cli.main(
            [
                "train",
                "--task",
                "reverse",
                "--num-train",
                "800",
                "--num-heldout",
                "20",
                "--max-len",
                "4",
                "--epochs",
                "2",
                "--batch-size",
                "32",
                "--num-blks",
                "1",
                "--out",
                out,
                "--no-progress",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "held-out exact match" in printed and "checkpoint/ (the latest" in printed and "wall time" in printed
    assert f"`minitensor translate --checkpoint {out}` loads" in printed  # what to run next, as it is spelt
    assert cli.main(["translate", "--checkpoint", out, "abc", "--show-attention"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] and set(lines[0]) <= set("abcdefghij")
    assert lines[1].startswith("attention: ") and os.path.getsize(lines[1].split(": ", 1)[1]) > 0
    assert cli.main(["translate", "--checkpoint", os.path.join(out, "checkpoint"), "--beam", "3", "ab", "cd"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2
    # continue the run for one more epoch
    assert cli.main(["train", "--out", out, "--resume", "--epochs", "3", "--no-progress"]) == 0
    assert f"resuming {out} at step" in capsys.readouterr().out


def test_cli_reports_errors_without_a_traceback(tmp_path, capsys):
    assert (
        cli.main(
            [
                "train",
                "--task",
                "reverse",
                "--num-train",
                "50",
                "--epochs",
                "1",
                "--out",
                str(tmp_path),
                "--scorer",
                "no_such_scorer",
            ]
        )
        == 2
    )
    assert "unknown scorer 'no_such_scorer'" in capsys.readouterr().err
    assert cli.main(["translate", "--checkpoint", str(tmp_path / "nothing"), "abc"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("minitensor translate: error: no checkpoint at ") and err.count("\n") == 1


def test_cli_char_lm_train_and_generate(tmp_path, capsys):
    text = tmp_path / "text.txt"
    text.write_text("the time machine by h g wells " * 40)
    out = str(tmp_path / "lm")
    assert (
        cli.main(
            [
                "train",
                "--text",
                str(text),
                "--lm-num-steps",
                "16",
                "--steps",
                "30",
                "--batch-size",
                "16",
                "--num-blks",
                "1",
                "--out",
                out,
                "--no-progress",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "perplexity" in printed and "a unigram model (character frequencies alone) scores" in printed
    assert f"`minitensor generate --checkpoint {out}` loads" in printed
    assert printed.count("held-out prompt") == 2 and os.path.isdir(os.path.join(out, "best"))
    assert cli.main(["generate", "--checkpoint", out, "--prompt", "the ", "--max-len", "12"]) == 0
    generated = capsys.readouterr().out.rstrip("\n")
    assert generated.startswith("the ") and len(generated) == 16
    # longer than the 16-character windows it was trained on: generated piece by piece
    assert cli.main(["generate", "--checkpoint", out, "--prompt", "the ", "--max-len", "40", "--greedy"]) == 0
    assert len(capsys.readouterr().out.rstrip("\n")) == 44


def test_norm_first_flag_selects_either_layer_norm_placement():
    """Pre-LN is the default; --no-norm-first keeps the book's post-LN form reachable."""
    from minitensor import cli

    def config(*flags):
        return cli.config_from_args(cli.build_parser().parse_args(["train", *flags]))

    assert config().norm_first is True
    assert config("--no-norm-first").norm_first is False
    assert config("--norm-first").norm_first is True


SAMPLE = os.path.join(os.path.dirname(__file__), "data", "fra_eng_sample.txt")


def test_a_parallel_corpus_trains_on_word_tokens_and_translates(tmp_path, capsys):
    """``--data FILE``: D2L's fra-eng format, D2L's preprocessing, a held-out split."""
    from minitensor.inference.decoding import translate

    config = TrainConfig(
        data=SAMPLE,
        heldout_fraction=0.2,
        epochs=60,
        batch_size=8,
        num_blks=1,
        lr=1e-2,
        progress=False,
        out=str(tmp_path / "fra"),
    )
    result = train(config, log=quiet)
    # word tokens, lower-cased, punctuation split off (D2L 10.5)
    assert {"apples", ",", "tom", "!"} <= set(result.src_vocab.idx_to_token)
    assert "Tom" not in result.src_vocab.token_to_idx
    data = loop.build_data(config, (result.src_vocab, result.tgt_vocab))
    assert len(data.train) + len(data.heldout) == 16 and len(data.heldout) == 3
    assert not {" ".join(s) for s, _ in data.train} & {" ".join(s) for s, _ in data.heldout}
    # a model this size memorises its training pairs
    hypotheses = translate(result.model, [s for s, _ in data.train], result.src_vocab, result.tgt_vocab, data.num_steps)
    correct = sum(h.tokens == t for h, (_, t) in zip(hypotheses, data.train))
    assert correct >= 0.9 * len(data.train)
    # the command line reads the same file, and translate applies the same preprocessing
    out = str(tmp_path / "cli")
    assert (
        cli.main(
            [
                "train",
                "--data",
                SAMPLE,
                "--epochs",
                "60",
                "--batch-size",
                "8",
                "--num-blks",
                "1",
                "--lr",
                "1e-2",
                "--out",
                out,
                "--no-progress",
            ]
        )
        == 0
    )
    assert "tab-separated" not in capsys.readouterr().err
    assert cli.main(["translate", "--checkpoint", out, "Hi."]) == 0
    assert capsys.readouterr().out.strip() in {"salut !", "qui ?", "va !", "cours !", "courez !"}


def test_the_progress_bar_shows_loss_and_tokens_per_second_on_a_terminal(tmp_path, monkeypatch):
    import io

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    tqdm_auto = pytest.importorskip("tqdm.auto")

    class Eager(tqdm_auto.tqdm):  # redraw at every step, not every 0.1 s: the run is short
        def __init__(self, *args, **kwargs):
            super().__init__(*args, mininterval=0, miniters=1, **kwargs)

    monkeypatch.setattr(tqdm_auto, "tqdm", Eager)
    terminal = Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    train(reverse_config(tmp_path, num_train=320, epochs=1, progress=True), log=quiet)
    shown = terminal.getvalue()
    assert "10/10" in shown and "loss=" in shown and "tok_s=" in shown
    # not a terminal (a log file, CI): no bar, no carriage returns
    plain = io.StringIO()
    monkeypatch.setattr("sys.stderr", plain)
    train(reverse_config(tmp_path / "again", num_train=320, epochs=1, progress=True), log=quiet)
    assert plain.getvalue() == ""


def test_a_run_of_one_step_trains_at_the_peak_lr(tmp_path):
    """--steps 1: the warm-up has no room, and the cosine's last step is at min_lr (0): the one
    step must still train, at --lr, so that two lrs give two models, and a resume stretches the decay."""
    from minitensor import nn, optim
    from minitensor.train.config import build_scheduler

    for warmup in (None, 0, 5):
        opt = optim.Adam(nn.Linear(2, 2).parameters(), lr=0.5)
        build_scheduler(TrainConfig(lr=0.5, warmup_steps=warmup), opt, 1)
        assert opt.param_groups[0]["lr"] == 0.5  # the only step's
    tiny = dict(num_train=64, num_heldout=8, max_len=3, num_hiddens=8, ffn_num_hiddens=16, num_heads=2, steps=1)
    weights = [
        _weights(train(reverse_config(tmp_path / str(lr), lr=lr, **tiny), log=quiet, figures=False).model)
        for lr in (1e-3, 1e-2)
    ]
    # at min_lr (0) both runs' one step left the weights as the seed made them: equal
    assert any(not numpy.array_equal(weights[0][k], weights[1][k]) for k in weights[0])
    lines = []
    resumed = train(reverse_config(tmp_path / "0.01", lr=1e-2, **{**tiny, "steps": 3}), log=lines.append, resume=True)
    assert resumed.step == 3 and "note: the cosine schedule now ends at step 3 instead of 2" in lines


def test_the_loss_estimates_are_gathered_in_chunks_with_the_same_result(tmp_path, monkeypatch):
    """--eval-iters K draws K x batch_size rows: gathered all at once, 1,000,000 iterations asked
    for 27 GiB. In chunks of whole evaluation batches, the same rows give the same estimate."""
    tiny = dict(num_train=64, num_heldout=8, max_len=3, num_hiddens=8, ffn_num_hiddens=16, num_heads=2, steps=2)
    tiny.update(eval_interval=2, eval_iters=5, batch_size=16, eval_batch_size=8)
    whole = train(reverse_config(tmp_path / "whole", **tiny), log=quiet, figures=False).history["estimates"]
    monkeypatch.setattr(loop, "ESTIMATE_CHUNK_ROWS", 12)  # chunks of 8 rows, the last of them shorter
    gathered = []
    real = loop.summed_loss
    monkeypatch.setattr(
        loop, "summed_loss", lambda model, arrays, *a: gathered.append(len(arrays[0])) or real(model, arrays, *a)
    )
    chunked = train(reverse_config(tmp_path / "chunked", **tiny), log=quiet, figures=False).history["estimates"]
    assert max(gathered[:20]) == 8 and sum(gathered[:20]) == 2 * 5 * 16  # train, then val: 80 rows each
    assert chunked[0]["step"] == whole[0]["step"] == 2
    for name in ("train", "val"):
        assert abs(chunked[0][name] - whole[0][name]) < 1e-9


def test_train_names_a_config_that_is_not_a_train_config():
    with pytest.raises(TypeError, match=r"train: config must be a TrainConfig, got dict \(TrainConfig\(\*\*settings\)"):
        train({"epochs": 1})
    with pytest.raises(TypeError, match="train: config must be a TrainConfig, got str$"):
        train("reverse")
