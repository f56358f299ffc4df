"""``bench/overhead.py``'s whole-step section times real training steps: minitensor's step of the
gpt-char-gpu recipe at the benchmark's size, and nanoGPT's where PyTorch and its ``model.py`` are
at hand, each lower the loss of the batch it repeats (the timing itself is the benchmark's)."""

import math
import pathlib
import sys

import pytest

BENCH = pathlib.Path(__file__).resolve().parent.parent / "bench"


@pytest.fixture(scope="module")
def overhead():
    sys.path.insert(0, str(BENCH))
    try:
        import overhead

        yield overhead
    finally:
        sys.path.remove(str(BENCH))


def _losses(step, n=40):
    return [step().item() for _ in range(n)]


def test_minitensor_step_trains_on_its_batch(overhead):
    losses = _losses(overhead.minitensor_gpt_step())
    assert math.isclose(losses[0], math.log(overhead.GPT_VOCAB), rel_tol=0.1)  # GPT-2's small init: near uniform
    assert sum(losses[-5:]) / 5 < losses[0] - 0.2


def test_nanogpt_step_trains_on_its_batch(overhead):
    torch = pytest.importorskip("torch")
    nanogpt = overhead.load_nanogpt(overhead.NANOGPT)
    if nanogpt is None:
        pytest.skip("nanoGPT's model.py is not checked out beside the project")
    losses = _losses(overhead.nanogpt_step(torch, nanogpt))
    assert math.isclose(losses[0], math.log(overhead.GPT_VOCAB), rel_tol=0.1)
    assert sum(losses[-5:]) / 5 < losses[0] - 0.2
