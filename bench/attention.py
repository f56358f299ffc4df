"""Multi-head self-attention, forward + backward: minitensor vs ``torch.nn.MultiheadAttention``.

What is measured
----------------
One training step's worth of attention on a batch of 64 sequences of 64 tokens,
num_hiddens 256, 8 heads (d_head 32), scaled dot-product scores and softmax pooling,
no dropout, no biases, self-attention (queries = keys = values = X):

    Y = MultiHeadAttention(X, X, X);  loss = (Y * G).sum();  loss.backward()

with a fixed random G, so that every output element gets its own gradient. The peer is
``torch.nn.MultiheadAttention(256, 8, bias=False, batch_first=True)`` called with
``need_weights=False`` (PyTorch's fast path: a packed Q/K/V projection and its fused
scaled-dot-product attention kernel). Both start from the same weights and X, and their
outputs and gradients are checked to agree before anything is timed.

Where the time can go: the four projections are (4096 x 256) @ (256 x 256) matrix products,
2.1 GFLOP forward and twice that backward; the heads' Q K^T and weights @ V add 0.27 GFLOP
forward; softmax touches 2.1 M scores. So this is mostly BLAS, and the question is how much
the framework adds around it (copies for reshapes and transposes, the elementwise scaling,
Python per op).

Method: the two run interleaved after a warm-up (numba compiles, BLAS spins up), with the
same thread count for NumPy's BLAS, numba and PyTorch, at 1 and 2 threads; medians with
half the IQR. Forward and backward are timed separately within each sample.

Target: minitensor's forward + backward median <= 1.3x PyTorch's.

    python bench/attention.py [--quick] [--profile]
"""

import time

import numpy as np
from _common import (
    THREAD_COUNTS,
    format_ratio,
    format_stats,
    import_torch,
    interleaved,
    limit_threads,
    print_header,
    print_table,
    verdict,
)

import minitensor as mt

BATCH, STEPS, NUM_HIDDENS, NUM_HEADS = 64, 64, 256, 8
TARGET = 1.3  # minitensor / torch, forward + backward
PHASES = ("forward", "backward", "total")


def make_data(seed=0):
    """X (batch, steps, num_hiddens), the output gradient G, and the four weight matrices."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((BATCH, STEPS, NUM_HIDDENS)).astype(np.float32)
    G = rng.standard_normal((BATCH, STEPS, NUM_HIDDENS)).astype(np.float32)
    bound = 1 / np.sqrt(NUM_HIDDENS)
    W = {name: rng.uniform(-bound, bound, (NUM_HIDDENS, NUM_HIDDENS)).astype(np.float32) for name in "qkvo"}
    return X, G, W


# -- the two libraries ------------------------------------------------------------------------
def build_minitensor(W):
    mha = mt.nn.MultiHeadAttention(NUM_HIDDENS, NUM_HEADS, dropout=0.0, scorer="scaled_dot", pooling="softmax")
    mha.load_state_dict({f"W_{n}.weight": W[n] for n in "qkvo"})
    return mha


def build_torch(torch, W):
    mha = torch.nn.MultiheadAttention(NUM_HIDDENS, NUM_HEADS, bias=False, batch_first=True)
    with torch.no_grad():
        mha.in_proj_weight.copy_(torch.from_numpy(np.concatenate([W["q"], W["k"], W["v"]])))
        mha.out_proj.weight.copy_(torch.from_numpy(W["o"]))
    return mha


def minitensor_step(mha, X, G):
    """One forward + backward; returns (output, the parameters' gradients)."""
    mha.zero_grad()
    X.grad = None
    start = time.perf_counter()
    Y = mha(X, X, X)
    loss = (Y * G).sum()
    middle = time.perf_counter()
    loss.backward()
    end = time.perf_counter()
    return Y, {"forward": middle - start, "backward": end - middle, "total": end - start}


def torch_step(mha, X, G):
    mha.zero_grad(set_to_none=True)
    X.grad = None
    start = time.perf_counter()
    Y, _ = mha(X, X, X, need_weights=False)
    loss = (Y * G).sum()
    middle = time.perf_counter()
    loss.backward()
    end = time.perf_counter()
    return Y, {"forward": middle - start, "backward": end - middle, "total": end - start}


def make_cases(X, G, W, torch):
    mt_mha = build_minitensor(W)
    mt_X, mt_G = mt.tensor(X, requires_grad=True), mt.tensor(G)
    cases = {"minitensor": lambda: minitensor_step(mt_mha, mt_X, mt_G)[1]}
    if torch is not None:
        t_mha = build_torch(torch, W)
        t_X, t_G = torch.tensor(X, requires_grad=True), torch.tensor(G)
        cases["torch"] = lambda: torch_step(t_mha, t_X, t_G)[1]
    return cases


def check_agreement(X, G, W, torch):
    """Same outputs and gradients (input and weights): both do the same work."""
    mt_mha = build_minitensor(W)
    mt_X = mt.tensor(X, requires_grad=True)
    Y, _ = minitensor_step(mt_mha, mt_X, mt.tensor(G))
    if torch is None:
        return
    t_mha = build_torch(torch, W)
    t_X = torch.tensor(X, requires_grad=True)
    tY, _ = torch_step(t_mha, t_X, torch.tensor(G))
    t_in = t_mha.in_proj_weight.grad.numpy()
    pairs = {
        "output": (Y.numpy(), tY.detach().numpy()),
        "dX": (mt_X.grad.numpy(), t_X.grad.numpy()),
        "dW_q": (mt_mha.W_q.weight.grad.numpy(), t_in[:NUM_HIDDENS]),
        "dW_k": (mt_mha.W_k.weight.grad.numpy(), t_in[NUM_HIDDENS : 2 * NUM_HIDDENS]),
        "dW_v": (mt_mha.W_v.weight.grad.numpy(), t_in[2 * NUM_HIDDENS :]),
        "dW_o": (mt_mha.W_o.weight.grad.numpy(), t_mha.out_proj.weight.grad.numpy()),
    }
    worst = max(float(np.max(np.abs(a - b)) / (np.max(np.abs(b)) + 1e-30)) for a, b in pairs.values())
    print(f"output and gradients agree with PyTorch: max relative difference {worst:.1e}")
    if worst > 1e-4:
        raise SystemExit("minitensor and PyTorch disagree: they do different work")


def profile(X, G, W, threads):
    """cProfile of a few minitensor steps: where the time goes, by function."""
    import cProfile
    import pstats

    mha = build_minitensor(W)
    mt_X, mt_G = mt.tensor(X, requires_grad=True), mt.tensor(G)
    with limit_threads(threads):
        for _ in range(3):
            minitensor_step(mha, mt_X, mt_G)
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(10):
            minitensor_step(mha, mt_X, mt_G)
        profiler.disable()
    print(f"\ncProfile of 10 minitensor steps at {threads} thread(s), by own time:")
    pstats.Stats(profiler).sort_stats("tottime").print_stats(15)


def main():
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short smoke run with fewer samples (for CI)")
    parser.add_argument("--profile", action="store_true", help="also print a cProfile of minitensor's step")
    args = parser.parse_args()
    rounds, warmup = (6, 2) if args.quick else (40, 5)
    torch = import_torch()
    print_header(
        f"Multi-head self-attention, forward + backward: batch {BATCH}, {STEPS} tokens, num_hiddens "
        f"{NUM_HIDDENS}, {NUM_HEADS} heads, scaled_dot + softmax, float32", args.quick
    )
    print(f"{rounds} interleaved rounds after {warmup} warm-up rounds per thread count; median ±IQR/2")
    if torch is None:
        print("PyTorch is not installed: its columns are left out")
    X, G, W = make_data()
    check_agreement(X, G, W, torch)

    rows, verdicts = [], []
    for threads in THREAD_COUNTS:
        with limit_threads(threads, torch):
            stats = interleaved(make_cases(X, G, W, torch), rounds, warmup)
        for phase in PHASES:
            ours = stats[f"minitensor/{phase}"]
            row = [threads, "forward+backward" if phase == "total" else phase, format_stats(ours)]
            if torch is not None:
                theirs = stats[f"torch/{phase}"]
                row += [format_stats(theirs), format_ratio(ours.median / theirs.median)]
            rows.append(row)
        if torch is not None:
            verdicts.append((threads, stats["minitensor/total"].median / stats["torch/total"].median))

    headers = ["threads", "phase", "minitensor"] + (["torch", "mt/torch"] if torch is not None else [])
    print_table(headers, rows)
    for threads, ratio in verdicts:
        print(f"{verdict(ratio <= TARGET)}  {threads} thread(s): forward+backward is {ratio:.2f}x "
              f"torch's (target <= {TARGET}x)")
    if args.profile:
        for threads in THREAD_COUNTS:
            profile(X, G, W, threads)


if __name__ == "__main__":
    main()
