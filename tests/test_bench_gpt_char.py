"""``bench/gpt_char.py --quick`` runs: minitensor's gpt-char model equals the PyTorch twin of
nanoGPT's model in float64 (where torch is installed), both train side by side, the memory of a
fresh process per framework prints, and generating with the KV cache writes the same text as
recomputing the context. Without PyTorch (``.ci/run`` does not install it) the script runs
minitensor alone and says so."""

import importlib.util
import pathlib
import re
import subprocess
import sys

SCRIPT = pathlib.Path(__file__).resolve().parent.parent / "bench" / "gpt_char.py"


def test_the_quick_run_prints_its_tables():
    # One thread: this checks that the script works, not its figures.
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--threads", "1"], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "Training, 30 steps per seed; held-out loss in nats per character" in out
    assert "Peak memory, each framework alone in a fresh process" in out
    assert "Generating 100 characters" in out
    assert "the KV cache and the recomputed contexts wrote the same text" in out
    assert "--quick: a tiny model; the targets are judged on the full run" in out
    assert re.search(r"(PASS|MISS)  held-out loss \d\.\d{4}", out)
    if importlib.util.find_spec("torch") is not None:
        match = re.search(r"logits (\S+), loss (\S+), gradients (\S+) ", out)
        assert match and all(float(x.rstrip(",;")) <= 1e-5 for x in match.groups()), out[:2000]
        assert "minitensor / torch" in out and "a step takes" in out and "peak memory above baseline" in out
        assert "The same matrix products alone" in out and "FFN in: G^T X" in out
        assert re.search(r"per step\s+\d+\.\d ms\s+\d+\.\d ms\s+\d", out), out[-3000:]
    else:
        assert "PyTorch is not installed" in out
