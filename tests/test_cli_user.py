"""The command line as a learner types it, in real processes: one line for every mistake, the
right exit code, and the previous run's files byte for byte as they were."""

import os
import shutil
import signal
import subprocess
import sys
import time

import kill_at
import pytest
from helpers import file_hashes

pytest.importorskip("safetensors")

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


def minitensor(*args, cwd=None, env=None, timeout=120):
    """Run ``minitensor ARGS`` as a user would; the CompletedProcess (text)."""
    return subprocess.run(
        [sys.executable, "-m", "minitensor", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, **(env or {})},
        timeout=timeout,
    )


def one_line(result, code, *fragments):
    """The command failed with ``code`` and said so in one line containing ``fragments``."""
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr
    for fragment in fragments:
        assert fragment in result.stderr, (fragment, result.stderr)
    return result.stderr


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A finished one-epoch run in ``<tmp>/runs/reverse`` (the default --out of the task)."""
    home = tmp_path_factory.mktemp("home")
    result = minitensor("train", *TINY, "--epochs", "1", cwd=home)
    assert result.returncode == 0, result.stderr
    return home / "runs" / "reverse"


def test_a_second_train_does_not_replace_the_first(run):
    before = file_hashes(run)
    again = minitensor("train", *TINY, "--epochs", "1", "--scorer", "dot", cwd=run.parent.parent)
    one_line(
        again,
        2,
        "runs/reverse already holds a run (a checkpoint at step 2 (epoch 1))",
        "--resume",
        "--overwrite",
        "another --out",
    )
    assert file_hashes(run) == before


def test_resume_refuses_other_settings_by_name(run):
    before = file_hashes(run)
    refused = minitensor("train", "--out", str(run), "--resume", "--num-heads", "4", "--lr", "0.5", "--scorer", "dot")
    one_line(
        refused,
        2,
        "--num-heads 4 (the run has 2)",
        "--lr 0.5 (the run has 0.01)",
        "--scorer 'dot' (the run has 'scaled_dot')",
        "may change only --fused, --epochs, --steps, --device, --matmul-precision, --autocast, --cuda-graph, "
        "--workers, --no-progress",
    )
    assert file_hashes(run) == before


def test_resume_refuses_a_preset_that_differs_from_the_run(run):
    before = file_hashes(run)
    refused = minitensor("train", "--out", str(run), "--resume", "--preset", "gpt-char")
    one_line(refused, 2, "refused: --preset gpt-char (it sets", "--model 'lm', the run has 'transformer'")
    assert file_hashes(run) == before


def test_a_copied_run_resumes_into_the_copy_from_another_directory(run, tmp_path):
    before = file_hashes(run)
    shutil.copytree(run, tmp_path / "copy", symlinks=True)
    (tmp_path / "elsewhere").mkdir()
    resumed = minitensor("train", "--out", "../copy", "--resume", "--epochs", "2", cwd=tmp_path / "elsewhere")
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming ../copy at step 2" in resumed.stdout
    assert os.listdir(tmp_path / "elsewhere") == [] and file_hashes(run) == before
    translated = minitensor("translate", "--checkpoint", str(tmp_path / "copy"), "abc")
    assert translated.returncode == 0 and "<pad>" not in translated.stdout and "<bos>" not in translated.stdout


def wait_for_path(path, process, what, seconds=60):
    """Poll (every 20 ms, at most ``seconds``) until ``path`` exists, while ``process`` runs."""
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert process.poll() is None, f"{what}: the process ended first ({process.returncode})"
        assert time.monotonic() < deadline, f"{what}: not within {seconds} s"
        time.sleep(0.02)


def test_two_trainers_on_one_folder(tmp_path):
    # the first trainer has far more epochs than the test needs, and is stopped once the second
    # has been refused: on a loaded machine it must still hold the folder when the second starts
    first = subprocess.Popen(
        [sys.executable, "-m", "minitensor", "train", *TINY, "--epochs", "500", "--out", "run"],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for_path(tmp_path / "run" / ".lock", first, "the first trainer takes the lock")
        second = minitensor("train", *TINY, "--epochs", "3", "--out", "run", cwd=tmp_path)
        one_line(second, 2, "run is in use by another training run (process", "choose another --out")
        assert first.poll() is None, "the first trainer ended before the second was refused"
        first.send_signal(signal.SIGINT)
        _, err = first.communicate(timeout=120)
        assert first.returncode == 130, err
    finally:
        first.kill()
        first.wait()
    assert not (tmp_path / "run" / ".lock").exists()


def test_a_save_killed_between_its_renames_is_recovered_through_the_run_folder(run, tmp_path):
    shutil.copytree(run, tmp_path / "run", symlinks=True)
    killed = subprocess.run(
        kill_at.cli_command("after-first-rename", "train", "--out", str(tmp_path / "run"), "--resume", "--epochs", "2"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert killed.returncode == -signal.SIGKILL
    left = os.listdir(tmp_path / "run")
    assert any(name.startswith((".best.old-", ".checkpoint.old-")) for name in left), left
    # best/ or checkpoint/ (whichever save was replacing a folder) is now only its backup
    translated = minitensor("translate", "--checkpoint", str(tmp_path / "run"), "abc")
    assert translated.returncode == 0 and translated.stdout.strip(), translated.stderr
    resumed = minitensor("train", "--out", str(tmp_path / "run"), "--resume", "--epochs", "2")
    assert resumed.returncode == 0, resumed.stderr
    assert "a save was interrupted" in translated.stderr + resumed.stderr
    assert "step 4" in resumed.stdout
    assert not [name for name in os.listdir(tmp_path / "run") if ".old-" in name or ".tmp-" in name]


def test_ctrl_c_keeps_the_last_checkpoint_and_says_how_to_go_on(tmp_path):
    trainer = subprocess.Popen(
        [sys.executable, "-m", "minitensor", "train", *TINY, "--epochs", "500", "--out", "run"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for_path(tmp_path / "run" / "checkpoint", trainer, "the first checkpoint is written")
        trainer.send_signal(signal.SIGINT)
        _, err = trainer.communicate(timeout=60)
    finally:
        trainer.kill()
    assert trainer.returncode == 130, err
    assert "Traceback" not in err and "is safe in run: continue with minitensor train --out run --resume" in err
    info = minitensor("translate", "--checkpoint", str(tmp_path / "run"), "ab")
    assert info.returncode == 0, info.stderr


@pytest.mark.parametrize(
    "args,fragments",
    [
        (["translate", "--checkpoint", "runs/reverse", "--beam", "0", "abc"], ["argument --beam: must be at least 1"]),
        (
            ["translate", "--checkpoint", "runs/reverse", "--max-len", "-3", "abc"],
            ["argument --max-len: must be at least 1"],
        ),
        (
            ["generate", "--checkpoint", "runs/reverse", "--prompt", "a", "--temperature", "-1"],
            ["argument --temperature: must be a finite number > 0"],
        ),
        (["train", "--text", "missing.txt"], ["--text", "missing.txt: the file does not exist"]),
        (["train", *TINY, "--clip-grad-norm", "-1"], ["--clip-grad-norm must be a finite number >= 0, got -1.0"]),
        (["train", *TINY, "--num-hiddens", "0"], ["--num-hiddens must be an integer from 1"]),
        (["train", *TINY, "--num-heldout", "0"], ["--num-heldout must be an integer from 1"]),
        (["demo", "--device", "cuda"], ["device 'cuda' is not available"]),
        (["translate", "--checkpoint", "runs/reverse", "   "], ["input 1 is empty"]),
        # a beam so wide that its scores and caches fill the memory: refused before anything is allocated
        (["translate", "--checkpoint", "runs/reverse", "--beam", "100000000", "abc"], ["argument --beam: must be at"]),
        (["generate", "--checkpoint", "runs/reverse", "--prompt", "a", "--beam", "100000000"], ["--beam: must be at"]),
        (["explain", "--checkpoint", "runs/reverse", "--beam", "257", "abc"], ["argument --beam: must be at most 256"]),
        # so many new tokens that the text (and a cache without a window) would fill the memory
        (["generate", "--checkpoint", "runs/reverse", "--prompt", "a", "--max-len", "100000000"], ["at most 1000000"]),
        (["translate", "--checkpoint", "runs/reverse", "--max-len", "1000001", "abc"], ["--max-len: must be at most"]),
        # an unset shell variable (--out "$RUN") must not become the default folder
        (["train", *TINY, "--out", ""], ["argument --out: the path is empty"]),
        (["translate", "--checkpoint", "", "abc"], ["argument --checkpoint: the path is empty"]),
        (["generate", "--checkpoint", "runs/reverse", "--draft", "", "--prompt", "a"], ["argument --draft: the path"]),
        # a stray word points at the subcommand's help, and a flag given a value says it takes none
        (
            ["train", *TINY, "--autocast", "yes"],
            ["minitensor train: error: unrecognized arguments: yes", "train --help"],
        ),
        (["train", *TINY, "--autocast=yes"], ["argument --autocast/--no-autocast: takes no value, got 'yes'"]),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(run, args, fragments):
    result = minitensor(*args, cwd=run.parent.parent)
    one_line(result, 2, *fragments)


@pytest.mark.parametrize(
    "flags,fragments",
    [
        # a Transformer's settings on the Bahdanau model (a GRU), as --num-kv-heads already was
        (["--model", "bahdanau", "--positional", "rotary"], ["--positional rotary is a setting of the Transformer"]),
        (["--model", "bahdanau", "--num-heads", "2"], ["--num-heads 2 is a setting of the Transformer", "Bahdanau"]),
        # a generated task's settings on a text
        (
            ["--text", "text.txt", "--task", "reverse", "--num-train", "5", "--max-len", "3"],
            ["--task reverse, --num-train 5, --max-len 3 are settings of a generated task, which --text FILE"],
        ),
        # a language model's settings on a task
        (["--lm-sampling", "random"], ["--lm-sampling random is a setting of a language model"]),
        (["--no-special-tokens"], ["--no-special-tokens is a setting of a language model"]),
        (["--lm-num-steps", "8"], ["--lm-num-steps 8 is a setting of a language model"]),
        (["--max-examples", "9"], ["--max-examples 9 is a setting of a corpus (--data FILE) or a text"]),
        (["--max-len", "3"], ["--max-len 3 is a setting of the reverse, copy and sort tasks, not the date task"]),
        # settings that would train wrongly or leave a checkpoint nothing can use
        (["--lr", "0.01", "--min-lr", "0.1"], ["--min-lr 0.1 is above --lr 0.01"]),
        (["--text", "text.txt", "--lm-num-steps", "1"], ["--lm-num-steps 1: a language model's window must hold"]),
        pytest.param(
            ["--text", "/dev/zero"],
            ["--text /dev/zero: not a regular file"],
            marks=pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="no /dev/zero here"),
        ),
    ],
)
def test_flags_a_run_would_ignore_or_misuse_are_refused_by_name(tmp_path, monkeypatch, capsys, flags, fragments):
    from minitensor import cli

    (tmp_path / "text.txt").write_text("to be or not to be, that is the question\n" * 40, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    assert cli.main(["train", *flags, "--steps", "1", "--no-progress", "--out", "run"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and all(f in err for f in fragments), err
    assert not (tmp_path / "run").exists()


def test_defaults_of_another_kind_of_run_are_not_refused(tmp_path, capsys):
    """Only flags the user typed are refused: --text's LM and the Bahdanau model take the rest as it is."""
    from minitensor.cli import _refuse_unused_flags, build_parser, config_from_args, explicit_settings

    for argv in (["--model", "bahdanau"], ["--text", "text.txt"], ["--task", "reverse", "--max-len", "4"]):
        args = build_parser().parse_args(["train", *argv])
        _refuse_unused_flags(config_from_args(args), explicit_settings(args))  # nothing raised


def test_the_python_searches_refuse_a_beam_whose_scores_cannot_fit_before_it_grows(run):
    """The command line caps --beam; translate / beam_search take any width whose scores fit the
    memory (a small vocabulary searched exhaustively), and refuse at the first step one that cannot."""
    from minitensor import cli
    from minitensor.inference import translate

    model, _, src_vocab, tgt_vocab, num_steps, _ = cli._load_for_inference(str(run))
    with pytest.raises(ValueError, match=r"beam_size 1000000000000: a decoding step's scores: .* GiB, more than"):
        translate(model, list("abc"), src_vocab, tgt_vocab, num_steps, beam_size=10**12, max_len=30)


def test_unknown_characters_are_named_and_debug_shows_the_traceback(run):
    translated = minitensor("translate", "--checkpoint", "runs/reverse", "abé", cwd=run.parent.parent)
    assert translated.returncode == 0
    assert "warning: input 1 has characters the model never saw in training: 'é' (each is read as <unk>)" in (
        translated.stderr
    )
    debug = minitensor("train", "--text", "missing.txt", "--debug")
    assert debug.returncode != 0 and "Traceback" in debug.stderr and "ConfigError" in debug.stderr


def test_a_closed_stdout_ends_quietly():
    with subprocess.Popen(
        [sys.executable, "-m", "minitensor", "plugins"], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    ) as listing:
        listing.stdout.close()  # `minitensor plugins | head -0`: the reader is gone before the first line
        err = listing.stderr.read()
    assert listing.returncode == 141 and err == b""  # quietly, with SIGPIPE's status as `seq 9 | head -1`


def test_a_plugin_file_for_one_run(tmp_path):
    (tmp_path / "my_scorer.py").write_text(
        "import minitensor as mt\n"
        "from minitensor import hookimpl\n\n"
        "class Cosine(mt.nn.Module):\n"
        "    def __init__(self, query_size, key_size, **options):\n"
        "        super().__init__()\n"
        "        mt.plugins.check_options(type(self), options)\n"
        "    def forward(self, queries, keys):\n"
        "        q = queries / (queries * queries).sum(axis=-1, keepdims=True).sqrt()\n"
        "        k = keys / (keys * keys).sum(axis=-1, keepdims=True).sqrt()\n"
        "        return q @ k.swapaxes(-1, -2)\n\n"
        "@hookimpl\n"
        "def minitensor_scorers():\n"
        "    return {'my_cosine': Cosine}\n"
    )
    trained = minitensor(
        "train",
        *TINY,
        "--epochs",
        "1",
        "--plugin",
        "my_scorer.py",
        "--scorer",
        "my_cosine",
        "--out",
        "run",
        cwd=tmp_path,
    )
    assert trained.returncode == 0, trained.stderr
    assert "scorer my_cosine" in trained.stdout
    missing = minitensor("translate", "--checkpoint", "run", "abc", cwd=tmp_path)
    one_line(missing, 2, "my_cosine", "--plugin")
    loaded = minitensor("translate", "--checkpoint", "run", "--plugin", "my_scorer.py", "abc", cwd=tmp_path)
    assert loaded.returncode == 0, loaded.stderr


def test_a_plugin_that_gives_nan_before_any_update_is_blamed_not_the_lr(tmp_path):
    (tmp_path / "nan_scorer.py").write_text(
        "import minitensor as mt\n"
        "from minitensor import hookimpl\n\n"
        "class NaNScorer(mt.nn.Module):\n"
        "    def __init__(self, query_size, key_size, **options):\n"
        "        super().__init__()\n"
        "    def forward(self, queries, keys):\n"
        "        return (queries @ keys.swapaxes(-1, -2)) * float('nan')\n\n"
        "@hookimpl\n"
        "def minitensor_scorers():\n"
        "    return {'nan_scorer': NaNScorer}\n"
    )
    failed = minitensor(
        "train",
        *TINY,
        "--steps",
        "2",
        "--plugin",
        "nan_scorer.py",
        "--scorer",
        "nan_scorer",
        "--out",
        "run",
        cwd=tmp_path,
    )
    message = one_line(failed, 1, "is nan at step 1, before any update", "scorer nan_scorer, pooling softmax")
    assert "learning rate is not the cause" in message and "--lr" not in message


def test_a_file_that_is_not_utf8_is_named_with_its_line(tmp_path, capsys):
    from minitensor import cli

    text = tmp_path / "latin1.txt"
    text.write_bytes("a first line\nthe second line is w\xf6rse\n".encode("latin-1") * 20)
    assert cli.main(["train", "--text", str(text), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(text) in err and "line 2" in err, err
    corpus = tmp_path / "pairs.txt"
    corpus.write_bytes(b"go .\tva !\n" * 30 + b"caf\xe9 .\tcaf\xe9 !\n")
    assert cli.main(["train", "--data", str(corpus), "--out", str(tmp_path / "run2")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(corpus) in err and "line 31" in err, err
    assert not (tmp_path / "run").exists() or not os.listdir(tmp_path / "run")


def test_a_prompt_with_unseen_characters_and_no_unk_is_refused(tmp_path, capsys):
    """nanoGPT's vocabulary (--no-special-tokens): the text's characters alone, no <unk> to read
    an unseen character as, so the prompt is refused with the characters named."""
    from minitensor import cli

    text = tmp_path / "text.txt"
    text.write_text("to be or not to be, that is the question\n" * 40, encoding="utf-8")
    out = str(tmp_path / "lm")
    small = ["--lm-num-steps", "8", "--steps", "2", "--batch-size", "4", "--num-hiddens", "8", "--num-blks", "1"]
    argv = ["train", "--text", str(text), "--no-special-tokens", "--out", out, "--no-progress", *small]
    assert cli.main([*argv, "--ffn-num-hiddens", "16"]) == 0
    capsys.readouterr()
    assert cli.main(["generate", "--checkpoint", out, "--prompt", "to bé", "--max-len", "3"]) == 2
    err = capsys.readouterr().err
    assert "never saw in training: 'é'; its vocabulary has no <unk>" in err and "Traceback" not in err
    assert cli.main(["generate", "--checkpoint", out, "--prompt", "to be", "--max-len", "3"]) == 0
    assert capsys.readouterr().out.startswith("to be")
