"""``bench/gelu.py --quick`` runs: every kernel's row and the accuracy table print, and the
vectorised kernel's accuracy (not its speed, judged on the full run) is within its target."""

import pathlib
import subprocess
import sys

SCRIPT = pathlib.Path(__file__).resolve().parent.parent / "bench" / "gelu.py"


def test_the_quick_run_prints_its_tables():
    done = subprocess.run([sys.executable, str(SCRIPT), "--quick"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    for kernel in ("vectorised", "libm", "naive"):
        assert out.count(f"\n{kernel} ") == 3, kernel  # two thread counts and the accuracy table
    assert "PASS  vectorised relative error < 2e-06" in out
