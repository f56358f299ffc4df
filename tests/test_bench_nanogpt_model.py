"""``bench/nanogpt_model.py --quick`` runs: nanoGPT's own model.py, executed with minitensor in
torch's place, gives PyTorch's loss and gradients in float64 and trains beside it. Without
PyTorch (``.ci/run`` does not install it) or without nanoGPT's checkout the script says which
is missing and stops cleanly."""

import importlib.util
import pathlib
import re
import subprocess
import sys

BENCH = pathlib.Path(__file__).resolve().parent.parent / "bench"
SCRIPT = BENCH / "nanogpt_model.py"
NANOGPT = BENCH.parent.parent / "shared" / "refbench" / "nanogpt"  # the script's default (gpt_char.NANOGPT)


def run(*args):
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--threads", "1", *args], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_the_quick_run_compares_or_says_what_is_missing(tmp_path):
    if importlib.util.find_spec("torch") is None:
        assert "PyTorch is not installed: there is nothing to compare with" in run()
        return
    assert f"nanoGPT's model.py is not at {tmp_path}" in run("--nanogpt", str(tmp_path))
    if not (NANOGPT / "model.py").is_file():
        return
    out = run()
    match = re.search(r"largest relative differences: loss (\S+), gradients (\S+) ", out)
    assert match and all(float(x.rstrip(",")) <= 1e-9 for x in match.groups()), out
    losses = re.findall(r"mean loss of the last 10 steps (\d\.\d{4})", out)
    assert len(losses) == 2 and abs(float(losses[0]) - float(losses[1])) < 2e-3, out  # the same training
    assert "minitensor writes: " in out and "PyTorch writes: " in out
    assert re.search(r"(PASS|MISS)  nanoGPT's model.py takes \d\.\d\dx its PyTorch step on minitensor", out)
