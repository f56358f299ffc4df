"""The autograd engine's per-op bookkeeping stays where it was last measured.

On tiny tensors the arithmetic is almost free and an op's cost is the Python the engine runs
around it (``bench/overhead.py`` times it against PyTorch). That cost crept up unseen once:
helpers added for new features (autocast's rounding of products, the write log) ran on every
float32 op too, and the per-op cost went from 0.74x PyTorch's to 0.95x before a benchmark run
showed it. Time is not a test's business, but the number of the package's own Python functions
an op calls is exact, and those calls are most of that cost. So here is ``bench/overhead.py``'s chain (add,
mul, tanh, matmul on (4, 4) float32, 25 times, then sum and backward) with its calls counted,
forward and backward: a change that adds calls to the path of every op fails here with the
calls listed, and one that removes some lowers the budget.

The same for the forward and backward of a whole model, nanoGPT's GPU recipe at a tiny size:
on a GPU these calls are the host's share of a step, besides the launches ``test_launches.py``
budgets.
"""

import collections
import gc
import inspect
import pathlib
import sys

import numpy as np
import pytest

import minitensor as mt

PACKAGE = str(pathlib.Path(mt.__file__).resolve().parent)
REPEATS = 25  # blocks of 4 ops, as in bench/overhead.py
# Calls of the package's Python functions for the whole chain (100 ops, then sum), counted as
# ``_counted`` counts them: 583 and 294 at the 2026-12-06 code (40c0f63), 861 and 641 with
# autocast's helpers on every op (d955f6a), 660 and 341 once the float32 path shed them (2026-12-07).
BUDGET = {"forward": 660, "backward": 341}
# Calls of one forward (with the loss) and backward of the GPT below, at the same three points:
# 3,198, 4,340, 3,518.
GPT_BUDGET = 3518
GPT_SIZES = dict(num_hiddens=12, ffn_num_hiddens=48, num_heads=2, num_blks=6, lm_num_steps=8, batch_size=1)


def _chain(x, a, w):
    for _ in range(REPEATS):
        x = x + a
        x = x * a
        x = x.tanh()
        x = x @ w
    return x.sum()


# So that every Python version counts the same calls, two kinds are left out. A list, dict or set
# comprehension is a function call of its own up to Python 3.11 and inlined from 3.12 (PEP 709);
# a generator expression is a frame in every version, and counted. And numba's dispatcher reports
# each call of a compiled kernel to a profiler up to 3.11, with a code object of its own making; the
# kernel runs no Python.
COMPREHENSIONS = {"<listcomp>", "<dictcomp>", "<setcomp>"}
# Python 3.10's profiler holds references to a call's arguments, which turns the reference count by
# which backward decides that a leaf may take its gradient as it is (``autograd._unshared``) from
# yes to no while counting: fewer calls there, so 3.10 is held to the budgets as upper bounds.
EXACT = sys.version_info >= (3, 11)


def _counted(fn):
    """Run ``fn``; return {function: calls} for the package's own Python functions. The collector
    is off meanwhile: nothing it might free runs code of the package's in the middle."""
    calls = collections.Counter()

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(PACKAGE):
            code = frame.f_code
            if code.co_name in COMPREHENSIONS or not code.co_flags & inspect.CO_OPTIMIZED:
                return  # (not optimized: a code object numba made to report a compiled kernel's call)
            name = getattr(code, "co_qualname", code.co_name)  # (co_qualname: Python 3.11 and later)
            calls[f"{pathlib.Path(code.co_filename).name}:{name}"] += 1

    collecting = gc.isenabled()
    gc.disable()
    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
        if collecting:
            gc.enable()
    return calls


@pytest.fixture
def leaves():
    rng = np.random.default_rng(0)
    x, a, w = (rng.standard_normal((4, 4)).astype(np.float32) for _ in range(3))
    return [mt.tensor(v, requires_grad=True) for v in (x, 1 + 0.1 * a, 0.5 * np.eye(4, dtype=np.float32) + 0.1 * w)]


def _describe(calls, count=4 * REPEATS, unit="op"):
    """The calls by function, per ``unit`` (``count`` of them ran), most first."""
    each = ", ".join(f"{name} {n / count:.2f}" for name, n in calls.most_common())
    return f"{sum(calls.values())} calls ({sum(calls.values()) / count:.2f} per {unit}): {each}"


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
    if EXACT:
        lower = f"lower BUDGET[{phase!r}] to {total}"
        assert total == BUDGET[phase], f"fewer calls than budgeted: {lower} ({_describe(calls)})"


def test_the_counter_sees_the_package_calls(leaves):
    calls = _counted(lambda: leaves[0] + leaves[1])
    assert sum(calls.values()) == 5, calls  # __add__, _binary, Function.apply, Add.forward, Tensor._make
    assert any(name.endswith("__add__") for name in calls) and any(name.endswith("apply") for name in calls)


def test_a_gpt_step_calls_no_more_than_its_budget():
    from minitensor.data import TEXTS
    from minitensor.train.config import TrainConfig, build_model

    config = TrainConfig.recipe(preset="gpt-char-gpu", text=TEXTS["tinyshakespeare"], device="cpu", **GPT_SIZES)
    vocab = list(range(65))
    mt.manual_seed(0)
    model = build_model(config, vocab, vocab)
    model.train()  # (dropout on, as in training)
    rng = np.random.default_rng(0)
    X, Y = (mt.tensor(rng.integers(0, 65, (1, GPT_SIZES["lm_num_steps"]))) for _ in range(2))

    def step():
        mt.cross_entropy(model(X), Y).backward()

    for _ in range(2):  # first calls import and compile: not the steady state
        step()
    model.zero_grad()  # (not counted: the optimiser's part of a step)
    calls = _counted(step)
    total, described = sum(calls.values()), _describe(calls, 1, "step")
    assert total <= GPT_BUDGET, (
        f"a GPT step's forward and backward make {total} calls, over the budget of {GPT_BUDGET}: "
        f"{described}. Keep helpers off the float32 path, or raise the budget after timing "
        "bench/overhead.py (its whole-step part)"
    )
    if EXACT:
        assert total == GPT_BUDGET, f"fewer calls than budgeted: lower GPT_BUDGET to {total} ({described})"
