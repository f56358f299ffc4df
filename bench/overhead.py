"""Per-operation overhead of the autograd engine: minitensor vs PyTorch on tiny tensors.

What is measured
----------------
A chain of 100 small operations on (4, 4) float32 tensors that require grad, 25 times

    x = x + a;  x = x * a;  x = tanh(x);  x = x @ w

followed by ``loss = x.sum()`` and ``loss.backward()``. The same function builds the chain
for every library. On arrays this small the arithmetic is almost free (NumPy's own add is
~0.5 µs), so the time is the framework's bookkeeping: wrapping arrays, recording the graph,
walking it backward. The time per iteration divided by 100 is the *per-op cost*.

Each round times one minitensor iteration, one PyTorch iteration and one iteration of the
*NumPy floor*, in alternating order, after a warm-up. The floor is the same chain on plain
arrays, with its backward pass written out by hand (``numpy_backward``): the arithmetic that
any engine must do, so "minitensor - floor" is the engine's own overhead. Forward and
backward are timed separately within each iteration, so the table shows where that overhead
is. The per-op cost includes the final ``sum`` and its backward, spread over the 100 ops.

Measurement care: all three compute the same gradients (checked before timing). The garbage
collector runs before each sample, outside the timed region, and is off during it (see
``_common.interleaved``), so neither library pays for the other's garbage. Interleaving
spreads slow spells of the machine (frequency changes, other processes) over all of them;
the spread is shown as the IQR. Each thread count limits NumPy's BLAS and PyTorch alike
(numba plays no part here).

Target: minitensor's forward+backward per-op cost <= 0.74x PyTorch's. (The first edition
aimed at 0.5x and reached 0.74x; bench/README.md says what the rest of the cost is and why
the Function design keeps it.)

A whole training step at the same scale
---------------------------------------
Second, a step of nanoGPT's GPU recipe (``--preset gpt-char-gpu``: 6 pre-LN blocks, GELU, tied
embeddings, dropout 0.2, AdamW with its decay groups, clipping at 1.0, the cosine schedule) at a
size where the arithmetic is again almost free (12 hiddens, 2 heads, 8 tokens, batch 1), against
nanoGPT's own ``model.py`` on PyTorch with the optimiser it configures and the same clipping
(``../shared/refbench/nanogpt``, loaded from its file as ``bench/gpt_char.py`` does; without it the
section is skipped), one thread, interleaved step by step. Its time is the host's share of a step
on a GPU, the part that bounds a small model there whatever the kernels: minitensor's must not
exceed PyTorch eager's. Target: <= 1.0x nanoGPT's step.

    python bench/overhead.py [--quick]
"""

import pathlib
import time

import numpy as np
from _common import (
    THREAD_COUNTS,
    format_ratio,
    format_stats,
    format_time,
    import_torch,
    interleaved,
    limit_threads,
    parse_args,
    print_header,
    print_table,
    timed,
    verdict,
)
from gpt_char import load_nanogpt, minitensor_recipe_model, nanogpt_recipe_model

import minitensor as mt

REPEATS = 25  # repetitions of the 4-op block
N_OPS = 4 * REPEATS  # the 100 ops of the chain (the final sum is counted in, not as an op)
TARGET = 0.74  # minitensor / torch, forward + backward
PHASES = ("forward", "backward", "total")
NANOGPT = pathlib.Path(__file__).resolve().parent.parent.parent / "shared" / "refbench" / "nanogpt"
GPT_SIZES = dict(num_hiddens=12, ffn_num_hiddens=48, num_heads=2, num_blks=6, lm_num_steps=8, batch_size=1)
GPT_VOCAB = 65  # tinyshakespeare's characters
GPT_TARGET = 1.0  # minitensor's step / nanoGPT's, at most


# -- the workload ---------------------------------------------------------------------------
def make_inputs(seed=0):
    """x, a, w as float32 arrays, scaled so that tanh neither saturates nor vanishes.

    a is close to 1 and w close to 0.5 I: the chain settles near a fixed point where the
    inputs of tanh stay around 1, so every op does real, well-conditioned work.
    """
    rng = np.random.default_rng(seed)
    x = 0.5 * rng.standard_normal((4, 4))
    a = 1.0 + 0.1 * rng.standard_normal((4, 4))
    w = 0.5 * np.eye(4) + 0.1 * rng.standard_normal((4, 4))
    return [v.astype(np.float32) for v in (x, a, w)]


def chain(x, a, w, tanh):
    """The benchmarked chain, written once for every library (``tanh`` is the library's)."""
    for _ in range(REPEATS):
        x = x + a
        x = x * a
        x = tanh(x)
        x = x @ w
    return x.sum()


def numpy_forward(x, a, w):
    """The chain on plain arrays, keeping what the backward pass needs (as a tape would)."""
    saved = []
    for _ in range(REPEATS):
        u = x + a
        z = np.tanh(u * a)
        saved.append((u, z))
        x = z @ w
    return x.sum(), saved


def numpy_backward(saved, a, w):
    """The chain rule written out by hand: the arithmetic an autograd engine cannot avoid.

    Per block, in reverse: x = z @ w, z = tanh(v), v = u * a, u = x + a.
    """
    g = np.ones((4, 4), dtype=a.dtype)  # d sum / dx
    grad_a = grad_w = None
    for u, z in reversed(saved):
        gw = z.T @ g
        grad_w = gw if grad_w is None else grad_w + gw
        gv = (g @ w.T) * (1 - z * z)
        ga = gv * u
        grad_a = ga if grad_a is None else grad_a + ga
        g = gv * a  # = dL/du = dL/dx (before the block) = dL/da through the add
        grad_a = grad_a + g
    return g, grad_a, grad_w


def tanh_input_range(x, a, w):
    """The largest |input| tanh sees in the chain (a check that it does not saturate)."""
    largest = 0.0

    def recording_tanh(v):
        nonlocal largest
        largest = max(largest, float(np.abs(v).max()))
        return np.tanh(v)

    chain(x, a, w, recording_tanh)
    return largest


def autograd_sample(leaves, tanh):
    """One forward + backward iteration; returns its forward and backward times."""
    for t in leaves:
        t.grad = None
    start = time.perf_counter()
    loss = chain(*leaves, tanh)
    middle = time.perf_counter()
    loss.backward()
    end = time.perf_counter()
    return {"forward": middle - start, "backward": end - middle, "total": end - start}


def numpy_sample(arrays):
    """The NumPy floor: the same forward and a hand-written backward, timed alike."""
    start = time.perf_counter()
    _, saved = numpy_forward(*arrays)
    middle = time.perf_counter()
    numpy_backward(saved, *arrays[1:])
    end = time.perf_counter()
    return {"forward": middle - start, "backward": end - middle, "total": end - start}


# -- the libraries --------------------------------------------------------------------------
def make_cases(arrays, torch):
    """name -> a callable taking one sample, for each library compared."""
    mt_leaves = [mt.tensor(v, requires_grad=True) for v in arrays]
    cases = {
        "minitensor": lambda: autograd_sample(mt_leaves, mt.tanh),
        "numpy": lambda: numpy_sample(arrays),
    }
    if torch is not None:
        torch_leaves = [torch.tensor(v, requires_grad=True) for v in arrays]
        cases["torch"] = lambda: autograd_sample(torch_leaves, torch.tanh)
    return cases


def check_agreement(arrays, torch):
    """All three must compute the same gradients: the same work is timed for each."""
    print(f"tanh inputs stay within ±{tanh_input_range(*arrays):.2f} (no saturation)")
    mt_leaves = [mt.tensor(v, requires_grad=True) for v in arrays]
    chain(*mt_leaves, mt.tanh).backward()
    ours = [t.grad.numpy() for t in mt_leaves]
    peers = {"the NumPy floor": numpy_backward(numpy_forward(*arrays)[1], *arrays[1:])}
    if torch is not None:
        torch_leaves = [torch.tensor(v, requires_grad=True) for v in arrays]
        chain(*torch_leaves, torch.tanh).backward()
        peers["PyTorch"] = [t.grad.numpy() for t in torch_leaves]
    for name, grads in peers.items():
        worst = max(_relative_difference(m, p) for m, p in zip(ours, grads))
        print(f"gradients agree with {name}: max relative difference {worst:.1e}")
        if worst > 1e-3:
            raise SystemExit(f"minitensor and {name} disagree: they do different work")


def _relative_difference(ours, theirs):
    return float(np.max(np.abs(ours - theirs)) / (np.max(np.abs(theirs)) + 1e-30))


# -- a whole training step -------------------------------------------------------------------
def minitensor_gpt_step():
    """One step of the gpt-char-gpu recipe at ``GPT_SIZES`` on the CPU, as ``train_step`` takes it
    (the loss, zero_grad, backward, clipping, AdamW, the schedule), on one fixed batch."""
    from minitensor.nn.utils import clip_grad_norm_

    config, model, optimizer, scheduler = minitensor_recipe_model(GPT_SIZES, GPT_VOCAB, "cpu", 10_000)
    rng = np.random.default_rng(0)
    X, Y = (mt.tensor(rng.integers(0, GPT_VOCAB, (1, GPT_SIZES["lm_num_steps"]))) for _ in range(2))

    def step():
        loss = mt.cross_entropy(model(X), Y)
        optimizer.zero_grad()
        loss.backward()
        clip_grad_norm_(model.parameters(), config.clip_grad_norm)
        optimizer.step()
        scheduler.step()
        return loss

    return step


def nanogpt_step(torch, nanogpt):
    """The same step with nanoGPT's ``GPT`` and the loop of its ``train.py`` (AdamW as it configures
    it on the CPU, ``clip_grad_norm_`` at 1.0, ``zero_grad(set_to_none=True)``)."""
    model, optimizer = nanogpt_recipe_model(torch, nanogpt, GPT_SIZES, GPT_VOCAB, "cpu")
    X, Y = (torch.randint(0, GPT_VOCAB, (1, GPT_SIZES["lm_num_steps"])) for _ in range(2))

    def step():
        loss = model(X, Y)[1]
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    return step


def gpt_step_section(torch, rounds, warmup):
    """Time the two steps interleaved at one thread; print them and the verdict."""
    nanogpt = load_nanogpt(NANOGPT) if torch is not None else None
    title = "A GPT training step at a size where the arithmetic is almost free (the host's share on a GPU)"
    if nanogpt is None:
        missing = "PyTorch" if torch is None else "nanoGPT's model.py"
        print(f"\n{title}: skipped ({missing} not found)")
        return
    cases = {"minitensor": timed(minitensor_gpt_step()), "nanoGPT": timed(nanogpt_step(torch, nanogpt))}
    with limit_threads(1, torch):
        stats = interleaved(cases, rounds, warmup)
    ours, theirs = stats["minitensor"], stats["nanoGPT"]
    ratio = ours.median / theirs.median
    sizes = ", ".join(f"{k} {v}" for k, v in GPT_SIZES.items())
    print_table(
        ["threads", "minitensor", "nanoGPT (PyTorch eager)", "mt/nanoGPT"],
        [[1, format_stats(ours), format_stats(theirs), format_ratio(ratio)]],
        title=f"{title}: {sizes}; {rounds} interleaved steps after {warmup}, median ±IQR/2",
    )
    print(f"{verdict(ratio <= GPT_TARGET)}  a step is {ratio:.2f}x nanoGPT's (target <= {GPT_TARGET}x)")


# -- report ---------------------------------------------------------------------------------
def per_op(stats):
    return {key: s.scaled(1.0 / N_OPS) for key, s in stats.items()}


def table_rows(threads, stats, has_torch):
    """One row per phase: per-op cost of each library, the ratio minitensor / torch, and
    minitensor's overhead above the NumPy floor."""
    rows = []
    for phase in PHASES:
        ours, floor = stats[f"minitensor/{phase}"], stats[f"numpy/{phase}"]
        row = [threads, "forward+backward" if phase == "total" else phase, format_stats(ours)]
        if has_torch:
            theirs = stats[f"torch/{phase}"]
            row += [format_stats(theirs), format_ratio(ours.median / theirs.median)]
        row += [format_stats(floor), format_time(ours.median - floor.median)]
        rows.append(row)
    return rows


def main():
    args = parse_args(__doc__)
    rounds, warmup = (100, 20) if args.quick else (2000, 100)
    torch = import_torch()
    print_header("Autograd overhead: per-op cost of a chain of 100 ops on (4, 4) float32", args.quick)
    print(
        f"{rounds} interleaved rounds after {warmup} warm-up rounds, per thread count; "
        f"times are per op (iteration / {N_OPS}), median ±IQR/2"
    )
    if torch is None:
        print("PyTorch is not installed: its columns are left out")
    arrays = make_inputs()
    check_agreement(arrays, torch)

    rows, verdicts = [], []
    for threads in THREAD_COUNTS:
        with limit_threads(threads, torch):
            stats = per_op(interleaved(make_cases(arrays, torch), rounds, warmup))
        rows += table_rows(threads, stats, torch is not None)
        if torch is not None:
            ratio = stats["minitensor/total"].median / stats["torch/total"].median
            verdicts.append((threads, ratio))

    headers = ["threads", "phase", "minitensor"]
    headers += ["torch", "mt/torch"] if torch is not None else []
    headers += ["NumPy floor", "mt - floor"]
    print_table(headers, rows)
    for threads, ratio in verdicts:
        print(
            f"{verdict(ratio <= TARGET)}  {threads} thread(s): forward+backward per op is "
            f"{ratio:.2f}x torch's (target <= {TARGET}x)"
        )
    gpt_step_section(torch, *((30, 5) if args.quick else (300, 20)))


if __name__ == "__main__":
    main()
