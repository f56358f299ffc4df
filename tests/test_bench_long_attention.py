"""``bench/long_attention.py --quick`` runs: the four attentions agree with a float64 reference,
and the script prints its per-T tables, the summary and the memory of a fresh process per
implementation (with or without PyTorch)."""

import importlib.util
import os
import pathlib
import subprocess
import sys

import pytest
from helpers import load_module

SCRIPT = pathlib.Path(__file__).resolve().parent.parent / "bench" / "long_attention.py"


def test_the_quick_run_prints_its_tables():
    # One thread: on a machine whose cores other processes keep busy, 2-thread pools wait for
    # each other; this checks that the script works, not its figures.
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--threads", "1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "Agreement with a float64 NumPy reference (tolerance 1e-4): all pass" in out
    for T in (256, 512):
        assert f"T = {T}: time (median" in out
    assert "Summary: forward + backward time and peak memory above baseline" in out
    assert "minitensor fused" in out and "minitensor plain" in out and "MiB" in out
    assert "--quick: the targets are judged on the full run" in out
    if importlib.util.find_spec("torch") is not None:
        assert "torch SDPA" in out and "torch eager" in out and "mem fused/SDPA" in out
    else:
        assert "PyTorch is not installed" in out


def test_a_threads_option_is_bounded_by_the_cpus_this_process_may_use(monkeypatch):
    """Every benchmark's ``--threads`` (bench/_common.thread_count): 1 to the CPUs of the
    process's affinity mask; a typo is an argparse error, not thousands of threads."""
    import argparse

    # loaded under a name of its own: experiments/ has a _common module too, and a bare
    # ``import _common`` here would stand in for it in sys.modules for the rest of the session
    thread_count = load_module(SCRIPT.parent / "_common.py", "bench_common").thread_count
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)
    assert [thread_count(n) for n in ("1", "3")] == [1, 3]
    for wrong, message in [("4", "give 1 to 3"), ("0", "give 1 to 3"), ("1000", "1000 threads"), ("two", "'two'")]:
        with pytest.raises(argparse.ArgumentTypeError, match=message):
            thread_count(wrong)


def test_the_dropout_run_prints_what_dropout_costs_each_path():
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--dropout", "0.1", "--quick", "--threads", "1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "fused: dropout/none" in done.stdout and "with dropout: fused/plain" in done.stdout
    for wrong in ("1.5", "none"):
        refused = subprocess.run([sys.executable, str(SCRIPT), "--dropout", wrong], capture_output=True, text=True)
        assert refused.returncode == 2 and "--dropout" in refused.stderr
