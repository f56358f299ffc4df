"""``bench/row_loop.py --quick`` runs: a table for each loop (reads, writes) prints both lengths,
with PyTorch's column where PyTorch is installed (the gradients are checked equal before any
timing) and, for the writes, minitensor's peak memory."""

import pathlib
import subprocess
import sys

SCRIPT = pathlib.Path(__file__).resolve().parent.parent / "bench" / "row_loop.py"


def test_the_quick_run_prints_its_table():
    done = subprocess.run([sys.executable, str(SCRIPT), "--quick"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    for loop in ("for x in X", "outputs[t] = H"):
        assert f"{loop}: forward + backward, batch 32, 32 features, 1 thread(s)" in out
        assert f"{loop}: minitensor's time grows" in out
    rows = [line.split() for line in out.splitlines() if line[:2] in ("8 ", "32")]
    assert [row[0] for row in rows] == ["8", "32", "8", "32"], out
    assert all(row[-1].endswith("x") for row in rows[2:]), out  # the writing loop's peak / outputs
    assert "--quick" in out


def test_threads_are_bounded():
    done = subprocess.run([sys.executable, str(SCRIPT), "--threads", "1000"], capture_output=True, text=True)
    assert done.returncode == 2 and "1000 threads: give 1 to" in done.stderr
