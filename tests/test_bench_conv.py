"""``bench/conv.py --quick`` runs: each shape's row prints at both thread counts, and, where
PyTorch is installed, a verdict per shape and thread count (their speed is judged on the full run)."""

import importlib.util
import pathlib
import subprocess
import sys

SCRIPT = pathlib.Path(__file__).resolve().parent.parent / "bench" / "conv.py"


def test_the_quick_run_prints_its_tables():
    done = subprocess.run([sys.executable, str(SCRIPT), "--quick"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    for shape in ("vit patches", "3x3 same", "5x5 stride 2"):
        assert out.count(f"\n{shape} ") == 2, shape  # one row per thread count
        if importlib.util.find_spec("torch") is not None:
            assert out.count(f"  {shape}, ") == 2, shape  # a verdict per thread count
    if importlib.util.find_spec("torch") is None:
        assert "PyTorch is not installed" in out
