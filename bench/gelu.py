"""The exact GELU's CPU kernels: float32 arithmetic vs the C library's erfc vs NumPy vs PyTorch.

What is measured
----------------
``minitensor/core/kernels/gelu.py`` computes gelu(x) = x Phi(x) and its derivative
Phi(x) + x phi(x). For float32 arrays -- what a model trains in -- it has two numba kernels:

* ``vectorised``: the float32 loops, erfc from Numerical Recipes' fitted polynomial and exp
  from ``cpu.exp_f32``, plain arithmetic that LLVM turns into SIMD instructions (what
  ``CpuGelu`` runs for float32 now);
* ``libm``: the float64 loops, one call of the C library's ``erfc`` (and ``exp``) per element
  (what ``CpuGelu`` runs for float64, and ran for float32 before the vectorised loops);

against ``naive`` (``reference_forward`` / ``reference_backward``: erfc from NumPy array
operations, what any other backend runs; at the first shape only, as it takes seconds a
call) and ``torch`` (``torch.nn.functional.gelu`` and its autograd backward, when PyTorch is
installed).

Shapes: GPT's feed-forward activations at ``--preset gpt-char`` (batch 12, context 64,
4 x 128 wide) and at the GPU preset's size (batch 64, context 256, 4 x 384 wide). Each kernel
runs with the thread count of the row (numba and PyTorch alike), interleaved, medians.

Accuracy: each kernel's float32 result against ``math.erfc`` in float64, on a dense grid of
[-12, 12]: the largest absolute error, and the largest relative error where |gelu(x)| > 1e-6.

Target: the vectorised forward and backward >= 4x faster than the libm kernels and <= 2x
PyTorch's at the gpt-char shape (2 threads), relative error < 2e-6.

    python bench/gelu.py [--quick]
"""

import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from _common import (  # noqa: E402
    THREAD_COUNTS,
    format_ratio,
    format_stats,
    import_torch,
    interleaved,
    limit_threads,
    parse_args,
    print_header,
    print_table,
    timed,
    verdict,
)
from minitensor.kernels import gelu  # noqa: E402

SHAPES = {"gpt-char (12, 64, 512)": (12, 64, 512), "gpt-char-gpu (64, 256, 1536)": (64, 256, 1536)}
SPEEDUP_VS_LIBM = 4.0
VS_TORCH = 2.0
MAX_RELATIVE_ERROR = 2e-6
NAIVE_MAX_SIZE = 2**20


def kernels(x, g):
    """name -> (forward, backward) callables on the float32 arrays ``x`` and ``g``; each
    returns its result (a NumPy array or a PyTorch tensor)."""
    flat, gflat = x.reshape(-1), g.reshape(-1)
    out = np.empty_like(flat)

    def run(loop, *args):  # the numba loops write into their last argument
        return lambda: loop(*args) or args[-1]

    cases = {
        "vectorised": (run(gelu._gelu_loop_f32, flat, out), run(gelu._gelu_backward_loop_f32, flat, gflat, out)),
        "libm": (run(gelu._gelu_loop, flat, out), run(gelu._gelu_backward_loop, flat, gflat, out)),
    }
    if x.size <= NAIVE_MAX_SIZE:  # 13 s a call at the GPU preset's size
        cases["naive"] = (lambda: gelu.reference_forward(np, x), lambda: gelu.reference_backward(np, x, g))
    torch = import_torch()
    if torch is not None:
        xt, gt = torch.from_numpy(x), torch.from_numpy(g)
        leaf = xt.clone().requires_grad_(True)
        yt = torch.nn.functional.gelu(leaf)

        def backward():
            return torch.autograd.grad(yt, leaf, gt, retain_graph=True)[0]

        cases["torch"] = (lambda: torch.nn.functional.gelu(xt), backward)
    return cases


def accuracy():
    """(name, max absolute error, max relative error where |gelu| > 1e-6) of each kernel's float32 forward."""
    x = np.linspace(-12, 12, 200_001).astype(np.float32)
    ref = np.array([v * 0.5 * math.erfc(-v / math.sqrt(2.0)) for v in x.astype(np.float64)])
    big = np.abs(ref) > 1e-6
    rows = []
    for name, (forward, _) in kernels(x, x).items():
        err = np.abs(np.asarray(forward(), dtype=np.float64) - ref)
        rows.append((name, err.max(), (err[big] / np.abs(ref[big])).max()))
    return rows


def main():
    args = parse_args(__doc__)
    print_header("bench/gelu.py: the exact GELU on float32, forward and backward", args.quick)
    torch = import_torch()
    rng = np.random.default_rng(0)
    rounds = 5 if args.quick else 40
    shapes = dict(list(SHAPES.items())[:1]) if args.quick else SHAPES
    verdicts = []
    for label, shape in shapes.items():
        x = rng.standard_normal(shape, dtype=np.float32)
        g = rng.standard_normal(shape, dtype=np.float32)
        cases = kernels(x, g)
        for threads in THREAD_COUNTS:
            with limit_threads(threads, torch):
                timings = {}
                for name, (forward, backward) in cases.items():
                    timings[f"{name}/forward"], timings[f"{name}/backward"] = timed(forward), timed(backward)
                stats = interleaved(timings, rounds, warmup=2)
            rows = []
            for name in cases:
                row = [name]
                for step in ("forward", "backward"):
                    s = stats[f"{name}/{step}"].median
                    row += [
                        format_stats(stats[f"{name}/{step}"]),
                        format_ratio(stats[f"libm/{step}"].median / s),
                        format_ratio(s / stats[f"torch/{step}"].median) if torch is not None else "-",
                    ]
                rows.append(row)
            heads = ["kernel", "forward", "libm / it", "it / torch", "backward", "libm / it", "it / torch"]
            print_table(heads, rows, title=f"{label}, {threads} thread(s), float32, medians of {rounds}")
            if shape == SHAPES["gpt-char (12, 64, 512)"] and threads == 2:
                for step in ("forward", "backward"):
                    mine = stats[f"vectorised/{step}"].median
                    verdicts.append(
                        (
                            f"{step}: libm / vectorised >= {SPEEDUP_VS_LIBM}",
                            stats[f"libm/{step}"].median / mine >= SPEEDUP_VS_LIBM,
                        )
                    )
                    if torch is not None:
                        verdicts.append(
                            (
                                f"{step}: vectorised / torch <= {VS_TORCH}",
                                mine / stats[f"torch/{step}"].median <= VS_TORCH,
                            )
                        )
    errors = accuracy()
    rows = [(name, f"{a:.2e}", f"{r:.2e}") for name, a, r in errors]
    print_table(
        ["kernel", "max |error|", "max relative error, |gelu| > 1e-6"],
        rows,
        title="float32 forward against math.erfc in float64, 200,001 points on [-12, 12]",
    )
    vectorised = next(r for name, _, r in errors if name == "vectorised")
    verdicts.append((f"vectorised relative error < {MAX_RELATIVE_ERROR}", vectorised < MAX_RELATIVE_ERROR))
    print("\nTargets (gpt-char shape, 2 threads):")
    for text, ok in verdicts:
        print(f"  {verdict(ok)}  {text}")


if __name__ == "__main__":
    main()
