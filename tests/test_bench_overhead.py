"""``bench/overhead.py``'s whole-step section times real training steps: minitensor's step of the
gpt-char-gpu recipe at the benchmark's size, and nanoGPT's where PyTorch and its ``model.py`` are
at hand, each lower the loss of the batch it repeats (the timing itself is the benchmark's).

The steps run in a fresh interpreter: the script imports ``bench/_common.py`` as ``_common``, and
experiments/ has a module of that name too, which a test there may have imported already."""

import json
import math
import pathlib
import subprocess
import sys

import pytest

BENCH = pathlib.Path(__file__).resolve().parent.parent / "bench"
STEPS = 40
PROGRAM = """
import json, sys
sys.path.insert(0, sys.argv[1])
import overhead

def losses(step):
    return [step().item() for _ in range({steps})]

out = {{"vocab": overhead.GPT_VOCAB, "minitensor": losses(overhead.minitensor_gpt_step())}}
torch = overhead.import_torch()
nanogpt = overhead.load_nanogpt(overhead.NANOGPT) if torch is not None else None
out["nanoGPT"] = None if nanogpt is None else losses(overhead.nanogpt_step(torch, nanogpt))
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def losses():
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM.format(steps=STEPS), str(BENCH)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def _trains(losses, vocab):
    assert math.isclose(losses[0], math.log(vocab), rel_tol=0.1)  # GPT-2's small init: near uniform
    assert sum(losses[-5:]) / 5 < losses[0] - 0.2


def test_minitensor_step_trains_on_its_batch(losses):
    _trains(losses["minitensor"], losses["vocab"])


def test_nanogpt_step_trains_on_its_batch(losses):
    if losses["nanoGPT"] is None:
        pytest.skip("PyTorch or nanoGPT's model.py (beside the project) is not at hand")
    _trains(losses["nanoGPT"], losses["vocab"])
