"""The autograd engine's per-op bookkeeping stays where it was last measured.

On tiny tensors the arithmetic is almost free and an op's cost is the Python the engine runs
around it (``bench/overhead.py`` times it against PyTorch). That cost crept up unseen once:
helpers added for one feature (autocast's rounding of products, the write log) ran on every
float32 op too, and the per-op cost went from 0.74x PyTorch's to 0.95x before a benchmark run
showed it. Time is not a test's business, but the number of the package's own Python functions
an op calls is exact and is most of that cost. So here is ``bench/overhead.py``'s chain (add,
mul, tanh, matmul on (4, 4) float32, 25 times, then sum and backward) with its calls counted,
forward and backward: a change that adds calls to the path of every op fails here with the
calls listed, and one that removes some lowers the budget.
"""

import collections
import pathlib
import sys

import numpy as np
import pytest

import minitensor as mt

PACKAGE = str(pathlib.Path(mt.__file__).resolve().parent)
REPEATS = 25  # blocks of 4 ops, as in bench/overhead.py
# Calls of the package's Python functions for the whole chain (100 ops, then sum). 2026-12-07:
# 861 and 716 before the float32 path shed autocast's helpers, 660 and 391 after.
BUDGET = {"forward": 660, "backward": 391}


def _chain(x, a, w):
    for _ in range(REPEATS):
        x = x + a
        x = x * a
        x = x.tanh()
        x = x @ w
    return x.sum()


def _counted(fn):
    """Run ``fn``; return {function: calls} for the package's own Python functions."""
    calls = collections.Counter()

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(PACKAGE):
            code = frame.f_code
            name = getattr(code, "co_qualname", code.co_name)  # (co_qualname: Python 3.11 and later)
            calls[f"{pathlib.Path(code.co_filename).name}:{name}"] += 1

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return calls


@pytest.fixture
def leaves():
    rng = np.random.default_rng(0)
    x, a, w = (rng.standard_normal((4, 4)).astype(np.float32) for _ in range(3))
    return [mt.tensor(v, requires_grad=True) for v in (x, 1 + 0.1 * a, 0.5 * np.eye(4, dtype=np.float32) + 0.1 * w)]


def _describe(calls):
    per_op = ", ".join(f"{name} {n / (4 * REPEATS):.2f}" for name, n in calls.most_common())
    return f"{sum(calls.values())} calls ({sum(calls.values()) / (4 * REPEATS):.2f} per op): {per_op}"


@pytest.mark.parametrize("phase", ["forward", "backward"])
def test_the_chain_calls_no_more_than_its_budget(leaves, phase):
    for _ in range(2):  # first calls import and compile: not the steady state
        _chain(*leaves).backward()
    if phase == "forward":
        calls = _counted(lambda: _chain(*leaves))
    else:
        loss = _chain(*leaves)
        calls = _counted(loss.backward)
    total = sum(calls.values())
    assert total <= BUDGET[phase], (
        f"the chain's {phase} makes more calls than its budget of {BUDGET[phase]}: {_describe(calls)}. "
        "Keep helpers off the float32 path, or raise the budget after timing bench/overhead.py"
    )
    assert total == BUDGET[phase], f"fewer calls than budgeted: lower BUDGET[{phase!r}] to {total} ({_describe(calls)})"


def test_the_counter_sees_the_package_calls(leaves):
    calls = _counted(lambda: leaves[0] + leaves[1])
    assert sum(calls.values()) == 5, calls  # __add__, _binary, Function.apply, Add.forward, Tensor._make
    assert any(name.endswith("__add__") for name in calls) and any(name.endswith("apply") for name in calls)
