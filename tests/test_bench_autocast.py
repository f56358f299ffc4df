"""``bench/autocast.py --quick`` runs: both rows of the step table and the loss table print, and
the two targets are judged (the memory one on its real figures: the quick run's sizes are the
full run's)."""

import pathlib
import subprocess
import sys

SCRIPT = pathlib.Path(__file__).resolve().parent.parent / "bench" / "autocast.py"


def test_the_quick_run_prints_its_tables_and_targets():
    done = subprocess.run([sys.executable, str(SCRIPT), "--quick"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "\nfloat32 " in out and "\nautocast (bfloat16) " in out
    assert "12 steps from the same weights on the same batches" in out
    assert "PASS  held memory in autocast <= 1.0x float32's" in out
    assert "the last 20 losses within 2% of float32's" in out
