"""``bench/row_loop.py --quick`` runs: the table prints for both lengths, with PyTorch's column
where PyTorch is installed (the gradients are checked equal before any timing)."""

import pathlib
import subprocess
import sys

SCRIPT = pathlib.Path(__file__).resolve().parent.parent / "bench" / "row_loop.py"


def test_the_quick_run_prints_its_table():
    done = subprocess.run([sys.executable, str(SCRIPT), "--quick"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "forward + backward, batch 32, 32 features, 1 thread(s)" in out
    rows = [line.split()[0] for line in out.splitlines() if line[:2] in ("8 ", "32")]
    assert rows == ["8", "32"], out
    assert "minitensor's time grows" in out and "--quick" in out


def test_threads_are_bounded():
    done = subprocess.run([sys.executable, str(SCRIPT), "--threads", "1000"], capture_output=True, text=True)
    assert done.returncode == 2 and "1000 threads: give 1 to" in done.stderr
