"""``bench/generate.py --quick`` runs: every cache policy generates and streams, speculative
greedy decoding gives the target's text (the script asserts both), and the tables print."""

import pathlib
import subprocess
import sys

SCRIPT = pathlib.Path(__file__).resolve().parent.parent / "bench" / "generate.py"


def test_the_quick_run_prints_its_tables(tmp_path):
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--threads", "1", "--models", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    for policy in ("full", "window", "sinks", "int8", "recompute (no cache)", "sliding window, recomputed"):
        assert f"\n{policy} " in out, policy
    assert "identical greedy text" in out and "acceptance rate" in out
    assert "--quick: a smoke run; the targets are judged on the full run" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["draft-distilled-30-1.npz", "target-30-2.npz"]
