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

Two more tables, minitensor against itself (interleaved the same way):

- Score biases: the same step with a "scores" positional encoding, ``alibi`` (a fixed bias
  -m_h |i - j|) and ``t5_relative`` (a learned bias per head and distance bucket, so its
  table gets a gradient too), against the plain layer. The bias is (num_heads, T, T),
  built from (num_heads, 2T - 1) numbers and added to the (batch, num_heads, T, T) scores.
  Target: <= 1.1x the plain layer's forward + backward.
- Grouped-query decoding: one decoding step (``cached_self_attention``, one new token per
  sequence) with 512 cached tokens, batch 16, for num_kv_heads g = 1 (multi-query) and
  g = num_heads (the plain layer). The step reads and extends the key/value cache,
  (batch, g, T, d_head) twice, so g = 1 moves num_heads times fewer bytes.
  Targets: g = 1 takes <= 0.6x the time of g = num_heads; its cache is g / num_heads of
  the bytes.

And one more against PyTorch, the function a PyTorch model attends with:
``F.scaled_dot_product_attention(q, k, v, is_causal=True)`` (``minitensor.nn.functional``'s, which
runs the stream or the plain path) against ``torch.nn.functional.scaled_dot_product_attention``,
forward + backward on the same q, k, v, at the heads of nanoGPT's GPU recipe (6 heads of 64,
context 256, a batch of 8) and at a longer context (8 heads of 64, 1,024 tokens, a batch of 2),
after checking that both give the same outputs and gradients. Target: <= 2.0x PyTorch's, the
stream's own target against SDPA in ``long_attention.py`` (PyTorch's CPU SDPA is one fused C++
kernel, where the stream is a loop over BLAS-sized tiles).

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
    timed,
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


# -- score biases and grouped heads: minitensor against its plain layer --------------------------
BIAS_TARGET = 1.1  # with a score bias / plain, forward + backward
DECODE_BATCH, CACHED_TOKENS = 16, 512
DECODE_TARGET = 0.6  # g = 1 / g = num_heads, one decoding step


def bias_cases(X, G, W):
    """The plain layer and the layer with each score bias, same weights: forward + backward."""
    cases = {}
    for positional in (None, "alibi", "t5_relative"):
        mha = mt.nn.MultiHeadAttention(NUM_HIDDENS, NUM_HEADS, dropout=0.0, positional=positional)
        mha.load_state_dict({f"W_{n}.weight": W[n] for n in "qkvo"}, strict=positional is None)
        mt_X, mt_G = mt.tensor(X, requires_grad=True), mt.tensor(G)
        cases[positional or "plain"] = lambda m=mha, x=mt_X, g=mt_G: minitensor_step(m, x, g)[1]
    return cases


def decode_cases(seed=0):
    """One decoding step after CACHED_TOKENS tokens, for g = 1 and g = num_heads."""
    rng = np.random.default_rng(seed)
    cases, cache_bytes = {}, {}
    for g in (1, NUM_HEADS):
        mha = mt.nn.MultiHeadAttention(NUM_HIDDENS, NUM_HEADS, dropout=0.0, num_kv_heads=g)
        with mt.no_grad():
            prompt = mt.tensor(rng.standard_normal((DECODE_BATCH, CACHED_TOKENS, NUM_HIDDENS)).astype(np.float32))
            _, cache = mha.cached_self_attention(prompt)
        x = mt.tensor(rng.standard_normal((DECODE_BATCH, 1, NUM_HIDDENS)).astype(np.float32))
        cache_bytes[g] = cache.bytes()

        def step(m=mha, c=cache, x=x):
            with mt.no_grad():
                start = time.perf_counter()
                m.cached_self_attention(x, c.copy())  # a copy: every call decodes the same step
                return time.perf_counter() - start

        cases[f"g={g}"] = step
    return cases, cache_bytes


def bias_and_decode_tables(X, G, W, rounds, warmup):
    rows, verdicts = [], []
    for threads in THREAD_COUNTS:
        with limit_threads(threads):
            stats = interleaved(bias_cases(X, G, W), rounds, warmup)
        plain = stats["plain/total"].median
        for name in ("plain", "alibi", "t5_relative"):
            ratio = stats[f"{name}/total"].median / plain
            rows.append(
                [
                    threads,
                    name,
                    format_stats(stats[f"{name}/forward"]),
                    format_stats(stats[f"{name}/backward"]),
                    format_stats(stats[f"{name}/total"]),
                    format_ratio(ratio),
                ]
            )
            if name != "plain":
                verdicts.append(
                    f"{verdict(ratio <= BIAS_TARGET)}  {threads} thread(s): {name} forward+backward is "
                    f"{ratio:.2f}x the plain layer's (target <= {BIAS_TARGET}x)"
                )
    print_table(
        ["threads", "positional", "forward", "backward", "forward+backward", "vs plain"],
        rows,
        title='Score biases: the step above with a "scores" positional encoding, vs the plain layer',
    )
    print("\n".join(verdicts))

    rows, verdicts = [], []
    for threads in THREAD_COUNTS:
        cases, cache_bytes = decode_cases()
        with limit_threads(threads):
            stats = interleaved(cases, rounds * 5, warmup)
        full = stats[f"g={NUM_HEADS}"].median
        for g in (NUM_HEADS, 1):
            ratio = stats[f"g={g}"].median / full
            rows.append(
                [
                    threads,
                    g,
                    format_stats(stats[f"g={g}"]),
                    format_ratio(ratio),
                    f"{cache_bytes[g] / 2**20:.1f} MiB",
                    f"{cache_bytes[g] / cache_bytes[NUM_HEADS]:.3f}",
                ]
            )
        ratio = stats["g=1"].median / full
        bytes_ratio = cache_bytes[1] / cache_bytes[NUM_HEADS]
        verdicts.append(
            f"{verdict(ratio <= DECODE_TARGET)}  {threads} thread(s): a decoding step with g = 1 takes "
            f"{ratio:.2f}x the time of g = {NUM_HEADS} (target <= {DECODE_TARGET}x); its cache is "
            f"{bytes_ratio:.3f} of the bytes (g / num_heads = {1 / NUM_HEADS:.3f})"
        )
    print_table(
        ["threads", "num_kv_heads", "decoding step", "vs g=num_heads", "cache", "cache ratio"],
        rows,
        title=f"Grouped-query decoding: one new token after {CACHED_TOKENS} cached, batch {DECODE_BATCH}, "
        f"{NUM_HEADS} query heads",
    )
    print("\n".join(verdicts))


SDPA_SHAPES = {"nanoGPT's heads, T 256": (8, 6, 256, 64), "T 1024": (2, 8, 1024, 64)}  # (batch, heads, T, d)
SDPA_TARGET = 2.0  # minitensor / torch, forward + backward (long_attention.py's target for the stream)


def sdpa_cases(torch, shape, seed=0):
    """Forward + backward of one causal F.scaled_dot_product_attention call in each library."""
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal(shape).astype(np.float32) for _ in range(3)]
    G = rng.standard_normal(shape).astype(np.float32)

    def ours():
        q, k, v = (mt.tensor(a, requires_grad=True) for a in arrays)
        out = mt.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        (out * mt.tensor(G)).sum().backward()
        return [out.numpy(), q.grad.numpy(), k.grad.numpy(), v.grad.numpy()]

    def theirs():
        q, k, v = (torch.tensor(a, requires_grad=True) for a in arrays)
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        (out * torch.tensor(G)).sum().backward()
        return [out.detach().numpy(), q.grad.numpy(), k.grad.numpy(), v.grad.numpy()]

    for a, b in zip(ours(), theirs(), strict=True):  # the same work: the same numbers
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-4)
    return {"minitensor": timed(ours), "torch": timed(theirs)}


def sdpa_table(torch, rounds, warmup):
    rows, verdicts = [], []
    for threads in THREAD_COUNTS:
        for name, shape in SDPA_SHAPES.items():
            with limit_threads(threads, torch):
                stats = interleaved(sdpa_cases(torch, shape), rounds, warmup)
            ratio = stats["minitensor"].median / stats["torch"].median
            rows.append([threads, name, format_stats(stats["minitensor"]), format_stats(stats["torch"]),
                         format_ratio(ratio)])  # fmt: skip
            verdicts.append(
                f"{verdict(ratio <= SDPA_TARGET)}  {threads} thread(s), {name}: F.scaled_dot_product_attention "
                f"forward+backward is {ratio:.2f}x torch's (target <= {SDPA_TARGET}x)"
            )
    print_table(
        ["threads", "shape", "minitensor", "torch", "mt/torch"],
        rows,
        title="F.scaled_dot_product_attention(q, k, v, is_causal=True), forward + backward, float32: "
        + ", ".join(f"{name} = (batch, heads, T, d) {shape}" for name, shape in SDPA_SHAPES.items()),
    )
    print("\n".join(verdicts))


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
        f"{NUM_HIDDENS}, {NUM_HEADS} heads, scaled_dot + softmax, float32",
        args.quick,
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
        print(
            f"{verdict(ratio <= TARGET)}  {threads} thread(s): forward+backward is {ratio:.2f}x "
            f"torch's (target <= {TARGET}x)"
        )
    bias_and_decode_tables(X, G, W, rounds, warmup)
    if torch is not None:
        sdpa_table(torch, max(rounds // 4, 4), warmup)
    if args.profile:
        for threads in THREAD_COUNTS:
            profile(X, G, W, threads)


if __name__ == "__main__":
    main()
