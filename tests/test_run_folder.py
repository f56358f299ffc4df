"""A run folder has one owner: refused when occupied, locked while training, resumable from
anywhere, and what is saved in it is checked before it is used (config and the loop's extras)."""

import dataclasses
import json
import math
import os
import shutil
import signal

import pytest
from helpers import file_hashes

from minitensor.train import checkpoint as ckpt
from minitensor.train import loop
from minitensor.train.config import ConfigError, TrainConfig
from minitensor.train.loop import (
    TrainingError,
    TrainingInterrupted,
    _complete_before_interrupt,
    _interrupt_between_steps,
    train,
)
from minitensor.train.run import (
    BEST_DIR,
    CHECKPOINT_DIR,
    LOCK_FILE,
    RunBusyError,
    RunExistsError,
    RunFolder,
    RunFolderError,
    load_run_checkpoint,
)

pytest.importorskip("safetensors")


def quiet(message):
    pass


def tiny(out, **changes):
    """A run of a few steps: two epochs planned, so ``stop_after_epochs=1`` skips the figures."""
    settings = dict(
        task="reverse",
        num_train=64,
        num_heldout=8,
        max_len=3,
        epochs=2,
        batch_size=32,
        num_blks=1,
        num_hiddens=8,
        ffn_num_hiddens=16,
        num_heads=2,
        progress=False,
        out=str(out),
    )
    settings.update(changes)
    return TrainConfig(**settings)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A run folder after one epoch: checkpoint/ and best/."""
    out = tmp_path_factory.mktemp("runs") / "run"
    train(tiny(out), log=quiet, stop_after_epochs=1)
    return out


def copy_of(run, tmp_path, name="copy"):
    target = tmp_path / name
    shutil.copytree(run, target, symlinks=True)
    return target


# -- one owner ------------------------------------------------------------------------------------
def test_a_second_run_in_the_same_folder_is_refused_and_changes_nothing(finished_run, tmp_path):
    run = copy_of(finished_run, tmp_path)
    before = file_hashes(run)
    with pytest.raises(RunExistsError) as info:
        train(tiny(run, scorer="dot"), log=quiet, stop_after_epochs=1)
    message = str(info.value)
    assert "\n" not in message and "already holds a run" in message and "step 2 (epoch 1)" in message
    for offer in ("--resume", "--overwrite", "another --out"):
        assert offer in message
    assert file_hashes(run) == before


def test_overwrite_deletes_the_runs_files_and_nothing_else(finished_run, tmp_path):
    run = copy_of(finished_run, tmp_path)
    (run / "notes.txt").write_text("mine")
    (run / "loss.png").write_bytes(b"old figure")
    os.makedirs(run / f".{CHECKPOINT_DIR}.old-123")
    with RunFolder(run, overwrite=True):
        assert sorted(os.listdir(run)) == [LOCK_FILE, "notes.txt"]
    assert sorted(os.listdir(run)) == ["notes.txt"]  # the lock goes with its owner


def test_resume_needs_a_run(tmp_path):
    with pytest.raises(RunFolderError, match="holds no run to resume"):
        with RunFolder(tmp_path / "no-such-run-here", resume=True):
            pass
    assert not (tmp_path / "no-such-run-here").exists()  # refused: no empty folder left behind


def test_a_full_disk_names_the_checkpoint_and_the_run_left_without_one_is_not_offered_to_resume(
    finished_run, tmp_path, monkeypatch, capsys
):
    """[Errno 28] names no file: the failed save is named. A run whose first checkpoint/ was never
    written (best/ alone) has nothing to resume: a new run and --resume both say so, one way."""
    from minitensor import cli
    from minitensor.train.checkpoint import save

    def full(path, data):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(save, "_write_file", full)
    with pytest.raises(OSError) as info:
        train(tiny(tmp_path / "full"), log=quiet, stop_after_epochs=1)
    assert info.value.errno == 28 and info.value.filename == str(tmp_path / "full" / BEST_DIR)
    monkeypatch.undo()

    run = copy_of(finished_run, tmp_path)
    shutil.rmtree(run / CHECKPOINT_DIR)  # best/ alone, as a full disk leaves it after best/ was saved
    before = file_hashes(run)
    for resume in (False, True):
        with pytest.raises(RunExistsError) as info:
            train(tiny(run), log=quiet, resume=resume, stop_after_epochs=1)
        message = str(info.value)
        assert "holds an unfinished run with no checkpoint/ (best)" in message and "--overwrite" in message
        assert "--resume" not in message
    assert cli.main(["train", "--out", str(run), "--resume", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "unfinished run with no checkpoint/" in err and err.count("\n") == 1, err
    assert file_hashes(run) == before
    with RunFolder(run, overwrite=True):  # what the message offers
        assert os.listdir(run) == [LOCK_FILE]


def test_a_folder_in_use_is_refused_at_once(tmp_path):
    with RunFolder(tmp_path / "run"):
        owner = (tmp_path / "run" / LOCK_FILE).read_text()
        assert f"process {os.getpid()}" in owner
        with pytest.raises(RunBusyError) as info:
            with RunFolder(tmp_path / "run"):
                pass
        assert "in use by another training run" in str(info.value) and f"process {os.getpid()}" in str(info.value)
    with RunFolder(tmp_path / "run"):  # released: usable again
        pass


def test_a_lock_left_by_a_killed_run_is_taken_over_with_a_warning(tmp_path):
    os.makedirs(tmp_path / "run")
    (tmp_path / "run" / LOCK_FILE).write_text("process 999999 on elsewhere, started 2026-01-01T00:00:00\n")
    with pytest.warns(RuntimeWarning, match="took over the lock left by process 999999"):
        with RunFolder(tmp_path / "run"):
            pass
    assert not (tmp_path / "run" / LOCK_FILE).exists()


def test_an_unusable_out_is_refused_before_training(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("x")
    with pytest.raises(RunFolderError, match="is a file, not a folder"):
        train(tiny(tmp_path / "file"), log=quiet)
    with pytest.raises(RunFolderError, match="cannot create the run folder"):
        train(tiny(tmp_path / "file" / "run"), log=quiet)

    def read_only(path, flags, mode=0o777):
        raise PermissionError(13, "Permission denied", path)

    # (the tests may run as root, for whom no folder is read-only: refuse the lock file instead)
    monkeypatch.setattr(os, "open", read_only)
    with pytest.raises(RunFolderError, match="cannot write to the run folder .*Permission denied"):
        train(tiny(tmp_path / "ro"), log=quiet)


# -- resume ---------------------------------------------------------------------------------------
def test_resume_writes_to_the_copy_from_any_directory(finished_run, tmp_path, monkeypatch):
    original = file_hashes(finished_run)
    run = copy_of(finished_run, tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    # the saved config says out=<the original folder>: the copy is where the run is now
    result = train(tiny(run), log=quiet, resume=True)
    assert result.step == 4 and result.checkpoint == str(run / CHECKPOINT_DIR)
    assert load_run_checkpoint(str(run / CHECKPOINT_DIR))[1]["step"] == 4
    assert file_hashes(finished_run) == original
    assert os.listdir(elsewhere) == []


def test_which_fields_may_change_on_resume_is_marked_on_the_fields():
    assert TrainConfig.resumable_fields() == (
        "fused", "epochs", "steps", "device", "matmul_precision", "autocast", "cuda_graph", "workers", "progress",
        "eval_interval", "eval_iters",
    )  # fmt: skip
    marked = {f.name for f in dataclasses.fields(TrainConfig) if f.metadata["resumable"]}
    assert marked == set(TrainConfig.resumable_fields())


def test_resume_refuses_other_settings_naming_each(finished_run, tmp_path):
    run = copy_of(finished_run, tmp_path)
    with pytest.raises(TrainingError) as info:
        train(tiny(run, lr=0.5, num_heads=4), log=quiet, resume=True)
    assert "lr: 0.01 -> 0.5" in str(info.value) and "num_heads: 2 -> 4" in str(info.value)


def test_best_holds_the_lowest_heldout_loss(tmp_path):
    result = train(tiny(tmp_path / "run", epochs=3, lr=3e-2), log=quiet)
    losses = [e["loss"] for e in result.history["eval"]]
    _, best = load_run_checkpoint(str(tmp_path / "run" / BEST_DIR))
    assert best["extra"]["heldout_loss"] == min(losses)
    assert best["step"] == result.history["eval"][losses.index(min(losses))]["step"]
    assert best["optimizer"] is None  # weights for translate/generate, not a training state


# -- what a checkpoint says about the run is checked --------------------------------------------------
def rewrite(folder, change):
    """Edit checkpoint.json with ``change(body)`` and re-sign it, as a crafted file would be."""
    path = os.path.join(folder, ckpt.CHECKPOINT_JSON)
    with open(path) as f:
        body = json.load(f)
    change(body)
    body.pop("content_sha256", None)
    body["content_sha256"] = ckpt._sha256(ckpt._canonical(body))
    with open(path, "w") as f:
        json.dump(body, f)


# a huge value of these is a bad idea (training diverges, and says so) but no danger to load
HARMLESS_WHEN_HUGE = {"lr", "min_lr", "weight_decay", "clip_grad_norm"}


def config_mutations():
    """(field, bad value) for every TrainConfig field: wrong type, huge, negative."""
    cases = []
    for f in dataclasses.fields(TrainConfig):
        wrong = [[1]] if f.type in (dict, bool) else [1.5] if "str" in str(f.type) else ["x"]
        huge = [] if f.name in HARMLESS_WHEN_HUGE else [10**30]
        cases += [(f.name, v) for v in wrong + huge + [-1]]
    return cases


@pytest.mark.parametrize("field", sorted(HARMLESS_WHEN_HUGE))
def test_a_huge_learning_rate_or_clip_loads(finished_run, tmp_path, field):
    run = copy_of(finished_run, tmp_path)
    rewrite(run / CHECKPOINT_DIR, lambda body: body["config"].__setitem__(field, 1e30))
    assert getattr(load_run_checkpoint(str(run / CHECKPOINT_DIR))[0], field) == 1e30


@pytest.mark.parametrize("field,value", config_mutations())
def test_every_config_field_is_checked_before_use(finished_run, tmp_path, field, value):
    run = copy_of(finished_run, tmp_path)
    rewrite(run / CHECKPOINT_DIR, lambda body: body["config"].__setitem__(field, value))
    before = file_hashes(run)
    with pytest.raises((ConfigError, ckpt.CheckpointError)) as info:
        load_run_checkpoint(str(run / CHECKPOINT_DIR))
    message = str(info.value)
    assert "\n" not in message and repr(field) in message, message
    assert file_hashes(run) == before


def test_a_missing_config_field_takes_its_default(finished_run, tmp_path):
    run = copy_of(finished_run, tmp_path)
    rewrite(run / CHECKPOINT_DIR, lambda body: body["config"].pop("eval_batch_size"))
    config, _ = load_run_checkpoint(str(run / CHECKPOINT_DIR))
    assert config.eval_batch_size == TrainConfig().eval_batch_size


def test_a_config_too_big_for_its_weights_is_refused_before_building_the_model(finished_run, tmp_path):
    run = copy_of(finished_run, tmp_path)
    # in range for a field, but a model of 4 * 2**40 parameters: refused without allocating it
    rewrite(run / CHECKPOINT_DIR, lambda body: body["config"].update(num_hiddens=2**20, num_heads=1))
    with pytest.raises(
        ckpt.CheckpointError,
        match=r"describes a model of at least [\d,]+ parameters, but the saved "
        r"weights hold [\d,]+",
    ):
        load_run_checkpoint(str(run / CHECKPOINT_DIR))


EXTRA_MUTATIONS = [
    ("num_steps", None),
    ("num_steps", "9"),
    ("num_steps", 10**9),
    ("num_steps", -3),
    ("num_steps", 0),
    ("tgt_num_steps", 2.5),
    ("tgt_num_steps", 10**30),
    ("batches", []),
    ("batches.seed", -1),
    ("batches.seed", "0"),
    ("batches.epoch", 10**30),
    ("batches.position", None),
    ("history", None),
    ("history.loss", {"a": 1}),
    ("history.loss", [1.0, "x"]),
    ("history.eval", [{"loss": "low"}]),
    ("history.eval", [3]),
    ("history.steps_per_epoch", 0),
    ("history.steps_per_epoch", -2),
]


def _set_path(body, dotted, value):
    target = body["extra"]
    *parents, last = dotted.split(".")
    for key in parents:
        target = target[key]
    target[last] = value


@pytest.mark.parametrize("field,value", EXTRA_MUTATIONS)
def test_every_extra_field_of_the_loop_is_checked_before_use(finished_run, tmp_path, field, value):
    run = copy_of(finished_run, tmp_path)
    rewrite(run / CHECKPOINT_DIR, lambda body: _set_path(body, field, value))
    before = file_hashes(run)
    with pytest.raises(ckpt.CheckpointError) as info:
        load_run_checkpoint(str(run / CHECKPOINT_DIR))
    assert "\n" not in str(info.value) and f'"extra.{field}"' in str(info.value)
    assert file_hashes(run) == before


@pytest.mark.parametrize("field", ["num_steps", "tgt_num_steps", "batches", "history"])
def test_a_missing_extra_field_is_named(finished_run, tmp_path, field):
    run = copy_of(finished_run, tmp_path)
    rewrite(run / CHECKPOINT_DIR, lambda body: body["extra"].pop(field))
    with pytest.raises(ckpt.CheckpointError, match=f'"extra.{field}'):
        load_run_checkpoint(str(run / CHECKPOINT_DIR))


# -- Ctrl-C ---------------------------------------------------------------------------------------
def test_ctrl_c_waits_for_the_checkpoint_being_written():
    finished = []
    with pytest.raises(KeyboardInterrupt):
        with _complete_before_interrupt():
            os.kill(os.getpid(), signal.SIGINT)  # arrives "during the save"
            finished.append(True)  # ... which still completes
    assert finished == [True]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_ctrl_c_takes_effect_between_steps_and_a_second_one_at_once():
    with _interrupt_between_steps() as interrupted:
        os.kill(os.getpid(), signal.SIGINT)  # the first: noted, the step goes on
        with pytest.raises(KeyboardInterrupt):
            interrupted()  # ... until the loop asks
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)  # the second: at once
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_ctrl_c_inside_a_step_ends_the_run_after_that_step(tmp_path, monkeypatch):
    """A Ctrl-C that lands inside the second step (in numba's compiler, llvmlite's callbacks
    would swallow it) stops the run once that step is done: at step 2, not in the middle."""
    real, steps = loop.train_step, []

    def step_pressing_ctrl_c(state, batch):
        real(state, batch)
        steps.append(state.step)
        if len(steps) == 2:
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(loop, "train_step", step_pressing_ctrl_c)
    with pytest.raises(TrainingInterrupted, match="interrupted at step 2, before the first checkpoint"):
        train(tiny(tmp_path / "run", epochs=5), log=quiet)
    assert steps == [1, 2] and signal.getsignal(signal.SIGINT) is signal.default_int_handler


# -- the values a run is given --------------------------------------------------------------------
@pytest.mark.parametrize(
    "changes,flag",
    [
        (dict(clip_grad_norm=-1.0), "--clip-grad-norm"),
        (dict(clip_grad_norm=math.nan), "--clip-grad-norm"),
        (dict(lr=0.0), "--lr"),
        (dict(lr=math.inf), "--lr"),
        (dict(num_hiddens=0), "--num-hiddens"),
        (dict(num_heldout=0), "--num-heldout"),
        (dict(dropout=1.0), "--dropout"),
        (dict(batch_size=-4), "--batch-size"),
        (dict(epochs=0), "--epochs"),
        (dict(seed=-1), "--seed"),
        (dict(num_heads=3), "--num-heads"),
        (dict(min_len=5, max_len=2), "--min-len"),
        (dict(heldout_fraction=0.0), "--heldout-fraction"),
        (dict(warmup_steps=-1), "--warmup-steps"),
        (dict(label_smoothing=1.0), "--label-smoothing"),
    ],
)
def test_bad_settings_are_refused_up_front_naming_the_flag(tmp_path, changes, flag):
    with pytest.raises(ConfigError) as info:
        train(tiny(tmp_path / "run", **changes), log=quiet)
    assert str(info.value).startswith(flag) and "\n" not in str(info.value)
    assert not (tmp_path / "run").exists()  # refused before the folder was made


def test_a_text_path_must_be_a_file(tmp_path):
    with pytest.raises(ConfigError, match="--text .*missing.txt: the file does not exist"):
        train(tiny(tmp_path / "run", model="lm", text=str(tmp_path / "missing.txt")), log=quiet)
    with pytest.raises(ConfigError, match="either --data .* or --text"):
        train(tiny(tmp_path / "run", model="lm", text=__file__, data=__file__), log=quiet)


def test_a_corpus_too_small_for_a_heldout_set_is_refused_before_training(tmp_path):
    corpus = tmp_path / "two.txt"
    corpus.write_text("Go.\tVa !\nHi.\tSalut !\n")
    logged = []
    with pytest.raises(ConfigError, match=r"2 tab-separated sentence pairs leave 2 for training and 0 held out"):
        train(tiny(tmp_path / "run", data=str(corpus)), log=logged.append)
    assert logged == []  # not one step was trained
    assert not (tmp_path / "run").exists()  # and the folder made for the run is gone again


def test_an_unknown_plugin_is_refused_before_the_folder_is_made(tmp_path):
    from minitensor.plugins import UnknownPluginError

    with pytest.raises(UnknownPluginError, match="unknown scorer 'dott'; did you mean 'dot'"):
        train(tiny(tmp_path / "run", scorer="dott"), log=quiet)
    assert not (tmp_path / "run").exists()
