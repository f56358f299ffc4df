"""A loop over a tensor's time steps, forward and backward: minitensor vs PyTorch as T grows.

What is measured
----------------
D2L writes its recurrent decoders as Python loops over the steps of a tensor that requires
grad: 11.4's Bahdanau decoder runs ``for x in X`` over its embedded inputs, and PyTorch users
write ``q, k, v = qkv.split(n, dim=2)`` (nanoGPT's attention). Each ``x`` is a read of one slice,
``X[t]``; its gradient is zero but on that slice. Made dense, it is an array of X's full size
per step, and adding T of them costs T^2 steps of memory traffic: the loop's backward grows as
the square of its length. minitensor's backward adds each slice's gradient into one array
(``autograd.GradAt``), as PyTorch's ``unbind`` does, so the loop stays linear.

The loop here is a plain recurrent cell over embedded inputs X (T, batch 32, 256 features):

    for x in X:  H = tanh(x W_x + H W_h + b)

then the sum of the last state, backward to X and the weights; at T = 50, 100, 200, 400, each
library with the same weights and inputs (the gradients checked equal first), interleaved,
medians, at ``--threads`` threads (default 1: the cell's products are small).

Targets: minitensor's forward + backward <= 1.5x PyTorch's at every T, and linear in T: the
time at T = 400 at most 1.25 x 8 times the time at T = 50 (PyTorch's own growth is about 8x).

    python bench/row_loop.py [--quick] [--threads N]
"""

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from _common import (  # noqa: E402
    format_ratio,
    format_stats,
    import_torch,
    interleaved,
    limit_threads,
    print_header,
    print_table,
    thread_count,
    timed,
    verdict,
)

import minitensor as mt  # noqa: E402

LENGTHS = (50, 100, 200, 400)
QUICK_LENGTHS = (8, 32)
BATCH, FEATURES = 32, 256
VS_TORCH = 1.5
LINEAR_SLACK = 1.25  # time(T_max) / time(T_min) at most this many times T_max / T_min


def inputs(T, features, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((T, BATCH, features)).astype(np.float32)
    W_x, W_h = ((rng.standard_normal((features, features)) / np.sqrt(features)).astype(np.float32) for _ in range(2))
    b = np.zeros(features, np.float32)
    return X, W_x, W_h, b


def step(lib, tensors):
    """Forward and backward of the loop; the gradients (X, W_x, W_h, b)."""
    X, W_x, W_h, b = tensors
    for t in tensors:
        t.grad = None
    H = None
    for x in X:
        Z = x @ W_x + b if H is None else x @ W_x + H @ W_h + b
        H = lib.tanh(Z)
    H.sum().backward()
    return [t.grad for t in tensors]


def on(lib, arrays):
    """The arrays as ``lib``'s leaf tensors (minitensor and PyTorch spell it alike)."""
    return [lib.tensor(a, requires_grad=True) for a in arrays]


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="T = 8 and 32, 32 features: seconds, for the tests")
    parser.add_argument("--threads", type=thread_count, default=1, help="threads of each library (default 1)")
    return parser.parse_args()


def main():
    args = parse_args()
    print_header("A loop over a tensor's time steps (for x in X), forward + backward", args.quick)
    torch = import_torch()
    lengths = QUICK_LENGTHS if args.quick else LENGTHS
    features = 32 if args.quick else FEATURES
    rounds = 3 if args.quick else 15
    rows, medians = [], {}
    with limit_threads(args.threads, torch):
        for T in lengths:
            arrays = inputs(T, features)
            ours = on(mt, arrays)
            cases = {"minitensor": timed(lambda ours=ours: step(mt, ours))}
            if torch is not None:
                theirs = on(torch, arrays)
                for a, b in zip(step(mt, ours), step(torch, theirs)):
                    np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=2e-3, atol=2e-5)
                cases["torch"] = timed(lambda theirs=theirs: step(torch, theirs))
            stats = interleaved(cases, rounds, warmup=1)
            medians[T] = {name: s.median for name, s in stats.items()}
            row = [T, format_stats(stats["minitensor"])]
            if torch is not None:
                row += [format_stats(stats["torch"]), format_ratio(stats["minitensor"].median / stats["torch"].median)]
            rows.append(row)
    headers = ["T", "minitensor"] + (["torch", "minitensor / torch"] if torch is not None else [])
    print_table(
        headers, rows, title=f"forward + backward, batch {BATCH}, {features} features, {args.threads} thread(s)"
    )
    first, last = lengths[0], lengths[-1]
    growth = medians[last]["minitensor"] / medians[first]["minitensor"]
    bound = LINEAR_SLACK * last / first
    line = f"minitensor's time grows {growth:.1f}x from T = {first} to T = {last}"
    if torch is not None:
        line += f" (torch's {medians[last]['torch'] / medians[first]['torch']:.1f}x)"
    print(line)
    if args.quick:
        print("--quick: small sizes; the targets are judged on the full run")
        return
    steps = last // first
    print(f"{verdict(growth <= bound)}  linear in T: {growth:.1f}x for {steps}x the steps (target <= {bound:.1f}x)")
    if torch is not None:
        worst = max(m["minitensor"] / m["torch"] for m in medians.values())
        print(f"{verdict(worst <= VS_TORCH)}  at most {format_ratio(worst)} PyTorch's time (target <= {VS_TORCH}x)")


if __name__ == "__main__":
    main()
