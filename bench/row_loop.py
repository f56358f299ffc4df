"""Loops over a tensor's time steps, forward and backward: minitensor vs PyTorch as T grows.

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

The second loop writes each state into a tensor of outputs, as PyTorch's seq2seq tutorials
fill their decoders' outputs, then takes the sum of squares of all of them:

    outputs = zeros(T, 32, 256);  for t, x in enumerate(X):  H = ...;  outputs[t] = H

A write in the graph used to copy ``outputs`` whole (out of place, so that what earlier ops
saved keeps its values) and keep every copy until backward: T^2 in time and memory. Where
nothing else holds the array it now writes in place (``autograd.sole_holder``), and backward
zeroes each written slice in the one gradient array. PyTorch writes in place too, but its
backward copies the gradient at every write (``CopySlices``): quadratic in time. minitensor's
peak memory of this loop (NumPy's allocations, ``tracemalloc``) is printed as a multiple of the
outputs' size: a constant where the memory is linear in T (out of place it was T + 10).

Targets: minitensor's forward + backward <= 1.5x PyTorch's at every T, and linear in T: the
time at T = 400 at most 1.25 x 8 times the time at T = 50 (PyTorch's own growth is about 8x
for the reads); the writing loop's peak memory linear in T: in sizes of its outputs, the largest
over T at most 1.25x the smallest.

    python bench/row_loop.py [--quick] [--threads N]
"""

import argparse
import os
import sys
import tracemalloc

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
PEAK_SLACK = 1.25  # the writing loop's peak memory in sizes of its outputs: largest / smallest over T
LOOPS = {"reads": "for x in X", "writes": "outputs[t] = H"}


def inputs(T, features, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((T, BATCH, features)).astype(np.float32)
    W_x, W_h = ((rng.standard_normal((features, features)) / np.sqrt(features)).astype(np.float32) for _ in range(2))
    b = np.zeros(features, np.float32)
    return X, W_x, W_h, b


def step(lib, tensors, loop="reads"):
    """Forward and backward of the loop; the gradients (X, W_x, W_h, b)."""
    X, W_x, W_h, b = tensors
    for t in tensors:
        t.grad = None
    H = None
    outputs = lib.zeros(tuple(X.shape)) if loop == "writes" else None
    for t, x in enumerate(X):
        Z = x @ W_x + b if H is None else x @ W_x + H @ W_h + b
        H = lib.tanh(Z)
        if outputs is not None:
            outputs[t] = H
    loss = H.sum() if outputs is None else (outputs * outputs).sum()
    loss.backward()
    return [t.grad for t in tensors]


def peak_memory(tensors):
    """The peak of NumPy's allocations during minitensor's writing loop, in bytes."""
    tracemalloc.start()
    try:
        step(mt, tensors, "writes")
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


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
    print_header("Loops over a tensor's time steps (for x in X; outputs[t] = H), forward + backward", args.quick)
    torch = import_torch()
    lengths = QUICK_LENGTHS if args.quick else LENGTHS
    features = 32 if args.quick else FEATURES
    rounds = 3 if args.quick else 15
    medians = {loop: {} for loop in LOOPS}
    peaks = {}
    with limit_threads(args.threads, torch):
        for loop, code in LOOPS.items():
            rows = []
            for T in lengths:
                arrays = inputs(T, features)
                ours = on(mt, arrays)
                cases = {"minitensor": timed(lambda ours=ours, loop=loop: step(mt, ours, loop))}
                if torch is not None:
                    theirs = on(torch, arrays)
                    for a, b in zip(step(mt, ours, loop), step(torch, theirs, loop)):
                        b = b.numpy()  # (float32 sums over T steps: an absolute slack at the gradient's scale)
                        np.testing.assert_allclose(a.numpy(), b, rtol=2e-3, atol=2e-5 * max(1.0, np.abs(b).max()))
                    cases["torch"] = timed(lambda theirs=theirs, loop=loop: step(torch, theirs, loop))
                stats = interleaved(cases, rounds, warmup=1)
                medians[loop][T] = {name: s.median for name, s in stats.items()}
                row = [T, format_stats(stats["minitensor"])]
                if torch is not None:
                    ratio = stats["minitensor"].median / stats["torch"].median
                    row += [format_stats(stats["torch"]), format_ratio(ratio)]
                if loop == "writes":
                    peaks[T] = peak_memory(ours) / arrays[0].nbytes
                    row.append(f"{peaks[T]:.1f}x")
                rows.append(row)
            headers = ["T", "minitensor"] + (["torch", "minitensor / torch"] if torch is not None else [])
            if loop == "writes":
                headers.append("minitensor's peak / outputs")
            title = f"{code}: forward + backward, batch {BATCH}, {features} features, {args.threads} thread(s)"
            print_table(headers, rows, title=title)
    first, last = lengths[0], lengths[-1]
    bound = LINEAR_SLACK * last / first
    growths = {}
    for loop, code in LOOPS.items():
        growths[loop] = medians[loop][last]["minitensor"] / medians[loop][first]["minitensor"]
        line = f"{code}: minitensor's time grows {growths[loop]:.1f}x from T = {first} to T = {last}"
        if torch is not None:
            line += f" (torch's {medians[loop][last]['torch'] / medians[loop][first]['torch']:.1f}x)"
        print(line)
    if args.quick:
        print("--quick: small sizes; the targets are judged on the full run")
        return
    steps = last // first
    for loop, code in LOOPS.items():
        growth = growths[loop]
        target = f"target <= {bound:.1f}x"
        print(f"{verdict(growth <= bound)}  {code}: linear in T, {growth:.1f}x for {steps}x the steps ({target})")
        if torch is not None:
            worst = max(m["minitensor"] / m["torch"] for m in medians[loop].values())
            target = f"target <= {VS_TORCH}x"
            print(f"{verdict(worst <= VS_TORCH)}  {code}: at most {format_ratio(worst)} PyTorch's time ({target})")
    spread = max(peaks.values()) / min(peaks.values())
    line = f"linear in T, {min(peaks.values()):.1f}x-{max(peaks.values()):.1f}x the outputs' size"
    print(f"{verdict(spread <= PEAK_SLACK)}  outputs[t] = H: peak memory {line} (target: within {PEAK_SLACK}x)")


if __name__ == "__main__":
    main()
