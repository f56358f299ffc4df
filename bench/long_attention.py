"""Long-sequence causal attention, forward + backward: streamed (fused) vs plain, minitensor vs PyTorch.

What is measured
----------------
One causal self-attention of batch 1, 8 heads, d_head 64, float32, at T = 512 ... 8192
tokens, forward and backward, by four implementations on the same Q, K, V (batch, heads, T, d):

- *fused*: ``minitensor.ops.flash_attention(q, k, v, causal=True)`` -- FlashAttention's
  online softmax over (256 x 256) tiles of queries and keys, which never builds a (T, T)
  array and skips the tiles above the diagonal;
- *plain*: ``mt.nn.Attention("scaled_dot", "softmax")(q, k, v, causal=True)`` -- scores,
  mask and weights as (batch, heads, T, T) arrays, kept for backward;
- *eager*: PyTorch written out, ``softmax(Q K^T / sqrt(d) with -inf above the diagonal) V``
  (the same (T, T) arrays as plain);
- *SDPA*: ``torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)``,
  PyTorch's fused kernel (on the CPU a FlashAttention-style one, forward and backward).

One sample is ``out = attention(q, k, v); out.backward(G)`` with a fixed random G (the
gradient of ``(out * G).sum()``), on leaves that require grad; forward and backward are
timed separately within it. Before anything is timed, all four are checked against a float64
NumPy reference at T = 320 (two tiles, the second partial): outputs and the gradients of q, k
and v to 1e-4.

Method
------
Time: the four run interleaved (``_common.interleaved``) with the same thread count for
NumPy's BLAS, numba and PyTorch -- 2 threads by default (``--threads``), the machine's two
cores; medians with half the IQR. The plain paths take seconds per sample at large T, so the
samples shrink with T: 9 up to 2048 (where the target against SDPA is read, and where this
2-core machine's noise moved that ratio between 0.85x and 2.0x over runs of 5 samples), 3 at
4096 and 8192 (for all four alike, so that they stay interleaved), after one warm-up round up
to 2048.

Memory: the peak of each implementation at each T, in a fresh process (this script with a
hidden ``--memory-worker``, the same thread count): it imports its library, runs a sample at
a small T (numba, BLAS and PyTorch load their code and thread pools), builds the inputs, the
leaves and G, collects garbage, hands the heap's free memory back to the system (glibc's
``malloc_trim``: freed blocks kept in the heap would be reused unseen), then resets the
kernel's high-water mark (``/proc/self/clear_refs``), reads the RSS as the baseline, runs one
forward + backward and reads the high-water mark: peak = VmHWM - baseline (the activations, saved tensors, output
and the three gradients). Where VmHWM cannot be reset, ``ru_maxrss`` stands in (the peak
since the process started, so it includes the warm-up) and the table marks it with *.
Linux only (``/proc``).

A case whose peak, extrapolated quadratically from the previous T's, would exceed
``MEMORY_LIMIT`` (12 GiB) or 80% of the memory available at that moment is skipped, for time
and memory alike, with the estimate printed ("skipped (needs N GiB)"): at T = 8192 the plain
path needs about 10 GiB and eager PyTorch about 6 GiB.

The fused path makes many small BLAS calls (a few per tile and head): at 2 threads each waits
for both threads, so a core kept busy by another process slows it far more than the plain
path's few large calls. Read its times only from an idle machine (their IQR shows it).

Targets
-------
- fused peak memory at T = 4096 <= 1.5x SDPA's;
- fused peak memory grows <= 2.3x from T = 4096 to 8192 (linear in T, not quadratic);
- fused time <= 0.8x plain at every T >= 2048 where plain ran;
- fused time <= 2.0x SDPA at T = 2048 (stretch 1.0x, printed for information).

Without PyTorch its two columns and the targets against SDPA are left out.
``--blocks``: instead, the fused path alone at T = 2048 (``--seq`` to change) with tiles of
64 ... 512 queries x keys (``block_q``, ``block_k``), interleaved: what chose
``flash_attention``'s default of 256 x 256.

``--crossover``: instead, fused vs plain minitensor at T = 256 ... 768 for this shape and
the character LM's (batch 16, 4 heads of 32): where streaming starts to pay, what
``FUSED_MIN_LENGTH`` (the length from which ``fused="auto"`` streams) is set from.

``--dropout P``: instead, fused vs plain minitensor at T = 512 ... 2048 for this shape, each
without and with dropout P on the weights (the plain path's ``Attention(..., dropout=P)`` in
training; ``flash_attention(..., dropout_p=P)``, which drops inside the tiles and makes each
tile's mask again in backward): what dropout costs each path. Target: the fused path with
dropout faster than the plain path with dropout at every T >= 1024.

``--quick``: T = 256 and 512, 3 samples, memory at 512 only with the four processes at once
(a smoke test; the targets need the full run).

    python bench/long_attention.py [--quick] [--threads N] [--blocks [--seq T]] [--crossover] [--dropout P]
"""

import argparse
import gc
import json
import math
import os
import resource
import subprocess
import sys
import time

import numpy as np
from _common import (
    format_mib,
    format_ratio,
    format_stats,
    import_torch,
    interleaved,
    limit_threads,
    print_header,
    print_table,
    run_python,
    thread_count,
    thread_env,
    verdict,
)
from memory import read_status, reset_peak

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

BATCH, HEADS, D_HEAD = 1, 8, 64
SIZES = {512: 9, 1024: 9, 2048: 9, 4096: 3, 8192: 3}  # T -> samples
QUICK_SIZES = {256: 3, 512: 3}
WARMUP_UP_TO = 2048  # one warm-up round at T <= this
CHECK_T = 320  # the agreement check: two tiles of 256, the second partial
WARM_T = 128  # a memory worker's warm-up sample
MEMORY_LIMIT = 12 * 2**30  # bytes: a larger estimated peak is skipped
IMPLEMENTATIONS = ("fused", "plain", "eager", "sdpa")
LABELS = {"fused": "minitensor fused", "plain": "minitensor plain", "eager": "torch eager", "sdpa": "torch SDPA"}

MEMORY_VS_SDPA = 1.5  # fused peak / SDPA peak at T = 4096
MEMORY_GROWTH = 2.3  # fused peak at 8192 / at 4096
TIME_VS_PLAIN = 0.8  # fused time / plain time at T >= 2048
TIME_VS_SDPA, TIME_VS_SDPA_STRETCH = 2.0, 1.0  # fused time / SDPA time at T = 2048


# -- the four implementations ---------------------------------------------------------------------
def make_inputs(T, seed=0):
    """q, k, v and the output's gradient G, (batch, heads, T, d) float32."""
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((BATCH, HEADS, T, D_HEAD), dtype=np.float32) for _ in range(4)]


def make_case(name, arrays, torch=None):
    """``(step, result)``: ``step()`` runs one forward + backward on leaves built here (their
    gradients cleared first) and returns its {"forward", "backward", "total"} seconds;
    ``result()`` gives the last output and the gradients of q, k, v as NumPy arrays."""
    q, k, v, g = arrays
    if name in ("fused", "plain"):
        from minitensor.ops.flash_attention import flash_attention

        import minitensor as mt

        attn = mt.nn.Attention("scaled_dot", "softmax")
        leaves = [mt.tensor(x, requires_grad=True) for x in (q, k, v)]
        grad = mt.tensor(g)

        def forward(Q, K, V):
            return flash_attention(Q, K, V, causal=True) if name == "fused" else attn(Q, K, V, causal=True)

        def to_numpy(t):
            return t.numpy()

    else:
        F = torch.nn.functional
        leaves = [torch.from_numpy(x.copy()).requires_grad_() for x in (q, k, v)]
        grad = torch.from_numpy(g)

        def forward(Q, K, V):
            if name == "sdpa":
                return F.scaled_dot_product_attention(Q, K, V, is_causal=True)
            T = Q.shape[-2]
            scores = Q @ K.transpose(-1, -2) / math.sqrt(Q.shape[-1])
            above = torch.ones(T, T, dtype=torch.bool).triu(1)
            return torch.softmax(scores.masked_fill(above, float("-inf")), -1) @ V

        def to_numpy(t):
            return t.detach().numpy()

    last = {}

    def step():
        for leaf in leaves:
            leaf.grad = None
        start = time.perf_counter()
        out = forward(*leaves)
        middle = time.perf_counter()
        out.backward(grad)
        end = time.perf_counter()
        last["out"] = out
        return {"forward": middle - start, "backward": end - middle, "total": end - start}

    def result():
        return [to_numpy(last["out"])] + [to_numpy(leaf.grad) for leaf in leaves]

    return step, result


def reference(arrays):
    """Output and gradients of causal softmax attention in float64 NumPy."""
    q, k, v, g = (x.astype(np.float64) for x in arrays)
    T, scale = q.shape[-2], 1 / math.sqrt(q.shape[-1])
    S = q @ k.swapaxes(-1, -2) * scale
    S[..., np.triu(np.ones((T, T), dtype=bool), 1)] = -np.inf
    P = np.exp(S - S.max(-1, keepdims=True))
    P /= P.sum(-1, keepdims=True)
    dP = g @ v.swapaxes(-1, -2)
    dS = P * (dP - (dP * P).sum(-1, keepdims=True))
    return [P @ v, dS @ k * scale, dS.swapaxes(-1, -2) @ q * scale, P.swapaxes(-1, -2) @ g]


def check_agreement(names, torch):
    """Every implementation against the float64 reference at T = CHECK_T; the largest errors."""
    arrays = make_inputs(CHECK_T, seed=1)
    want = reference(arrays)
    row = []
    for name in names:
        step, result = make_case(name, arrays, torch)
        step()
        errors = []
        for what, got, ref in zip(("output", "dq", "dk", "dv"), result(), want):
            np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4, err_msg=f"{LABELS[name]}: {what} at T={CHECK_T}")
            errors.append(float(np.abs(got - ref).max()))
        row.append(f"{max(errors):.1e}")
    print_table(
        [f"T = {CHECK_T}", *(LABELS[n] for n in names)],
        [["largest |error| (output, dq, dk, dv)", *row]],
        title="Agreement with a float64 NumPy reference (tolerance 1e-4): all pass",
    )


# -- memory: one implementation at one T, in its own process ----------------------------------------
def memory_worker(name, T):
    """Print a JSON line: the RSS baseline and the peak of one forward + backward (bytes)."""
    torch = import_torch() if name in ("eager", "sdpa") else None
    warm_step, _ = make_case(name, make_inputs(WARM_T), torch)
    warm_step()
    warm_step()
    step, _ = make_case(name, make_inputs(T), torch)
    del warm_step
    gc.collect()
    trimmed = release_free_memory()
    baseline = read_status("VmRSS")
    is_reset = reset_peak()
    step()
    after = read_status("VmRSS")
    if is_reset:
        peak = read_status("VmHWM")
    else:  # the peak since the process started (ru_maxrss is in kB on Linux)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"baseline": baseline, "peak": max(peak, after), "is_reset": is_reset, "trimmed": trimmed}))


def release_free_memory():
    """Hand the heap's free memory back to the system (glibc's ``malloc_trim``); False elsewhere.

    minitensor asks glibc to keep freed blocks of up to 32 MiB in the heap
    (``numpy_backend.keep_freed_memory``), and the inputs' temporary copies leave such blocks
    behind: still resident, they would count in the baseline and the step would reuse them
    without raising the high-water mark, hiding part of its peak."""
    import ctypes

    try:
        ctypes.CDLL(None).malloc_trim(0)
        return True
    except (OSError, AttributeError):
        return False


def measure_memory(names, T, threads, together=False):
    """{name: {"above": bytes, "is_reset": bool}}, one fresh process per implementation: one
    after the other, or all at once (``together``, for ``--quick``: at small T the processes
    are small, and each reads only its own memory)."""
    commands = [[sys.executable, os.path.abspath(__file__), "--memory-worker", name, "--seq", str(T)] for name in names]
    env = thread_env(threads)
    if together:
        pipe = subprocess.PIPE
        procs = [subprocess.Popen(c, env=env, stdout=pipe, stderr=pipe, text=True) for c in commands]
        outputs = [p.communicate() + (p.returncode,) for p in procs]
    else:
        outputs = [(*run_python(c[1:], env=env), 0) for c in commands]
    results = {}
    for name, (stdout, stderr, returncode) in zip(names, outputs):
        if returncode:
            raise RuntimeError(f"memory worker {name} at T={T} failed ({returncode}):\n{stderr}")
        result = json.loads(stdout.strip().splitlines()[-1])
        results[name] = {"above": result["peak"] - result["baseline"], "is_reset": result["is_reset"]}
    return results


def memory_available():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return MEMORY_LIMIT


def estimate(memory, name, T):
    """Peak bytes of ``name`` at T, extrapolated quadratically from the largest smaller T measured."""
    smaller = [t for (n, t) in memory if n == name and t < T and memory[n, t]]
    if not smaller:
        return None
    t = max(smaller)
    return memory[name, t]["above"] * (T / t) ** 2


# -- the driver --------------------------------------------------------------------------------------
def main():
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="T = 256 and 512, 3 samples (a smoke test)")
    parser.add_argument("--threads", type=thread_count, default=2, help="threads for every library (default 2)")
    parser.add_argument("--blocks", action="store_true", help="time the fused path's tile sizes instead")
    parser.add_argument("--seq", type=int, help="T for --blocks (default 2048)")
    parser.add_argument(
        "--crossover", action="store_true", help="time fused vs plain at short T instead (fused='auto''s threshold)"
    )
    parser.add_argument(
        "--dropout", type=probability, metavar="P", help="time fused vs plain with dropout P on the weights instead"
    )
    parser.add_argument("--memory-worker", choices=IMPLEMENTATIONS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_worker:
        return memory_worker(args.memory_worker, args.seq)
    if args.blocks:
        return block_sizes(args.seq or 2048, args.threads, rounds=3 if args.quick else 7)
    if args.crossover:
        return crossover(args.threads, rounds=3 if args.quick else 7)
    if args.dropout is not None:
        sizes = (256, 512) if args.quick else DROPOUT_SIZES
        return dropout_cost(args.dropout, sizes, args.threads, rounds=3 if args.quick else 7)

    torch = import_torch()
    names = IMPLEMENTATIONS if torch is not None else IMPLEMENTATIONS[:2]
    sizes = QUICK_SIZES if args.quick else SIZES
    memory_sizes = [max(sizes)] if args.quick else list(sizes)
    print_header("Causal attention at long T, forward + backward: streamed vs plain, minitensor vs PyTorch", args.quick)
    print(
        f"batch {BATCH}, {HEADS} heads, d_head {D_HEAD}, float32, causal; {args.threads} thread(s) for every library; "
        "time: median ±IQR/2 of interleaved samples; memory: peak above baseline in a fresh process"
    )
    if torch is None:
        print("PyTorch is not installed: its columns and targets are left out")
    check_agreement(names, torch)

    times, memory, skipped = {}, {}, {}
    for T, rounds in sizes.items():
        limit = min(MEMORY_LIMIT, 0.8 * memory_available())
        running = []
        for name in names:
            need = estimate(memory, name, T)
            if need is not None and need > limit:
                skipped[name, T] = need
                memory[name, T] = None
                continue
            running.append(name)
            memory[name, T] = None
        if T in memory_sizes:
            memory.update(
                ((name, T), m) for name, m in measure_memory(running, T, args.threads, together=args.quick).items()
            )
        arrays = make_inputs(T)
        cases = {name: make_case(name, arrays, torch)[0] for name in running}
        with limit_threads(args.threads, torch):
            stats = interleaved(cases, rounds, warmup=1 if T <= WARMUP_UP_TO else 0)
        del cases, arrays
        for name in running:
            times[name, T] = {part: stats[f"{name}/{part}"] for part in ("total", "forward", "backward")}
        print_per_T(T, names, times, memory, skipped)

    print_summary(sizes, names, times, memory)
    if any(m is not None and not m["is_reset"] for m in memory.values()):
        print("* VmHWM could not be reset: peak since the process started (ru_maxrss), warm-up included")
    print_verdicts(sizes, names, times, memory, args.quick)


def block_sizes(T, threads, rounds, sizes=(64, 128, 256, 512)):
    """The fused path at one T with square tiles of each size in ``sizes``, interleaved."""
    from minitensor.ops.flash_attention import flash_attention

    import minitensor as mt

    print_header(f"flash_attention's tile size at T = {T}, causal, forward + backward")
    q, k, v, g = make_inputs(T)
    leaves = [mt.tensor(x, requires_grad=True) for x in (q, k, v)]
    grad = mt.tensor(g)

    def case(size):
        def step():
            for leaf in leaves:
                leaf.grad = None
            start = time.perf_counter()
            flash_attention(*leaves, causal=True, block_q=size, block_k=size).backward(grad)
            return time.perf_counter() - start

        return step

    with limit_threads(threads):
        stats = interleaved({f"{size} x {size}": case(size) for size in sizes}, rounds, warmup=1)
    best = min(s.median for s in stats.values())
    rows = [[name, format_stats(s), format_ratio(s.median / best)] for name, s in stats.items()]
    print_table(
        ["tile (queries x keys)", "forward + backward", "/ fastest"],
        rows,
        title=f"batch {BATCH}, {HEADS} heads, d_head {D_HEAD}, float32, {threads} thread(s), {rounds} samples",
    )


# (batch, heads, d_head): this script's shape, and the character LM's training batches
CROSSOVER_SHAPES = ((BATCH, HEADS, D_HEAD), (16, 4, 32))
CROSSOVER_SIZES = (256, 384, 512, 768)


def crossover(threads, rounds):
    """Fused vs plain minitensor at short T, for two shapes: where streaming starts to pay,
    which ``MultiHeadAttention``'s ``FUSED_MIN_LENGTH`` (fused="auto") is set from."""
    from minitensor.nn.attention import FUSED_MIN_LENGTH
    from minitensor.ops.flash_attention import flash_attention

    import minitensor as mt

    print_header("Where streaming pays: fused vs plain minitensor at short T, causal, forward + backward")
    attn = mt.nn.Attention("scaled_dot", "softmax")
    rows = []
    for batch, heads, d in CROSSOVER_SHAPES:
        for T in CROSSOVER_SIZES:
            rng = np.random.default_rng(T)
            q, k, v, g = (mt.tensor(rng.standard_normal((batch, heads, T, d), dtype=np.float32)) for _ in range(4))

            def case(fn, q=q, k=k, v=v, g=g):
                def step():
                    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
                    start = time.perf_counter()
                    fn(*leaves, causal=True).backward(g)
                    return time.perf_counter() - start

                return step

            with limit_threads(threads):
                stats = interleaved({"fused": case(flash_attention), "plain": case(attn)}, rounds, warmup=1)
            ratio = stats["fused"].median / stats["plain"].median
            rows.append(
                [
                    f"{batch} x {heads} x {d}",
                    T,
                    format_stats(stats["fused"]),
                    format_stats(stats["plain"]),
                    format_ratio(ratio),
                    "streams" if T >= FUSED_MIN_LENGTH else "plain",
                ]
            )
    print_table(
        ["batch x heads x d_head", "T", "fused", "plain", "fused/plain", 'fused="auto"'],
        rows,
        title=f"float32, {threads} thread(s), {rounds} samples; FUSED_MIN_LENGTH = {FUSED_MIN_LENGTH}",
    )


DROPOUT_SIZES = (512, 1024, 2048)


def probability(text):
    """``--dropout``'s argument: a number in (0, 1)."""
    try:
        p = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < p < 1:
        raise argparse.ArgumentTypeError(f"a dropout probability is in (0, 1), got {text}")
    return p


def dropout_cost(p, sizes, threads, rounds):
    """Fused vs plain minitensor at this script's shape, each without and with dropout ``p`` on
    the weights, interleaved: what dropout costs each path, and the fused path against the plain
    one with it."""
    from minitensor.ops.flash_attention import flash_attention

    import minitensor as mt

    print_header(f"Dropout {p:g} on the attention weights: fused vs plain minitensor, causal, forward + backward")
    attention = {rate: mt.nn.Attention("scaled_dot", "softmax", dropout=rate) for rate in (0.0, p)}  # training mode
    rows, verdicts = [], []
    for T in sizes:
        q, k, v, g = (mt.tensor(a) for a in make_inputs(T))

        def case(fn, q=q, k=k, v=v, g=g):
            def step():
                leaves = [x.detach().requires_grad_() for x in (q, k, v)]
                start = time.perf_counter()
                fn(*leaves).backward(g)
                return time.perf_counter() - start

            return step

        cases = {
            "fused": case(lambda *x: flash_attention(*x, causal=True)),
            "fused, dropout": case(lambda *x: flash_attention(*x, causal=True, dropout_p=p)),
            "plain": case(lambda *x: attention[0.0](*x, causal=True)),
            "plain, dropout": case(lambda *x: attention[p](*x, causal=True)),
        }
        with limit_threads(threads):
            stats = interleaved(cases, rounds, warmup=1)
        median = {name: st.median for name, st in stats.items()}
        rows.append(
            [T]
            + [format_stats(stats[name]) for name in cases]
            + [
                format_ratio(median["fused, dropout"] / median["fused"]),
                format_ratio(median["plain, dropout"] / median["plain"]),
                format_ratio(median["fused, dropout"] / median["plain, dropout"]),
            ]
        )
        if T >= 1024:
            verdicts.append((T, median["fused, dropout"] / median["plain, dropout"]))
    print_table(
        ["T", *cases, "fused: dropout/none", "plain: dropout/none", "with dropout: fused/plain"],
        rows,
        title=f"batch {BATCH}, {HEADS} heads, d_head {D_HEAD}, float32, {threads} thread(s), {rounds} samples",
    )
    for T, ratio in verdicts:
        verdict = "PASS" if ratio < 1 else "FAIL"
        print(f"{verdict}  T = {T}: with dropout, fused takes {ratio:.2f}x the plain path's time (target < 1)")


def print_per_T(T, names, times, memory, skipped):
    fused_t = times.get(("fused", T))
    fused_m = memory.get(("fused", T))
    rows = []
    for name in names:
        if (name, T) in skipped:
            rows.append([LABELS[name], f"skipped (needs {skipped[name, T] / 2**30:.1f} GiB)", "", "", "", "", ""])
            continue
        t, m = times[name, T], memory[name, T]
        rows.append(
            [
                LABELS[name],
                format_stats(t["total"]),
                format_stats(t["forward"]),
                format_stats(t["backward"]),
                format_ratio(fused_t["total"].median / t["total"].median),
                "-" if m is None else format_mib(m["above"]) + ("" if m["is_reset"] else " *"),
                "-" if m is None or fused_m is None else format_ratio(fused_m["above"] / m["above"]),
            ]
        )
    print_table(
        ["implementation", "forward + backward", "forward", "backward", "fused/this", "peak memory", "fused/this"],
        rows,
        title=f"T = {T}: time (median ±IQR/2, {fused_t['total'].n} samples) and peak memory above baseline",
    )
    sys.stdout.flush()


def print_summary(sizes, names, times, memory):
    def cell_t(name, T):
        return format_stats(times[name, T]["total"]) if (name, T) in times else "skipped"

    def cell_m(name, T):
        m = memory.get((name, T))
        return format_mib(m["above"]) if m else ("skipped" if (name, T) not in times else "-")

    def ratio(table, a, b, T):
        x, y = table.get((a, T)), table.get((b, T))
        if not x or not y:
            return "-"
        if table is times:
            return format_ratio(x["total"].median / y["total"].median)
        return format_ratio(x["above"] / y["above"])

    rows = []
    for T in sizes:
        row = [T, *(cell_t(n, T) for n in names), ratio(times, "fused", "plain", T)]
        if "sdpa" in names:
            row.append(ratio(times, "fused", "sdpa", T))
        row += [cell_m(n, T) for n in names]
        if "sdpa" in names:
            row.append(ratio(memory, "fused", "sdpa", T))
        rows.append(row)
    short = {"fused": "fused", "plain": "plain", "eager": "eager", "sdpa": "SDPA"}
    headers = ["T", *(short[n] for n in names), "fused/plain"]
    if "sdpa" in names:
        headers.append("fused/SDPA")
    headers += [f"mem {short[n]}" for n in names]
    if "sdpa" in names:
        headers.append("mem fused/SDPA")
    print_table(headers, rows, title="Summary: forward + backward time and peak memory above baseline")


def print_verdicts(sizes, names, times, memory, quick):
    if quick:
        print("--quick: the targets are judged on the full run (T = 2048 ... 8192)")
        return
    have_sdpa = "sdpa" in names
    fused4, fused8 = memory.get(("fused", 4096)), memory.get(("fused", 8192))
    if have_sdpa and fused4 and memory.get(("sdpa", 4096)):
        ratio = fused4["above"] / memory["sdpa", 4096]["above"]
        print(
            f"{verdict(ratio <= MEMORY_VS_SDPA)}  fused peak memory at T=4096 is {ratio:.2f}x SDPA's "
            f"(target <= {MEMORY_VS_SDPA}x)"
        )
    if fused4 and fused8:
        growth = fused8["above"] / fused4["above"]
        print(
            f"{verdict(growth <= MEMORY_GROWTH)}  fused peak memory grows {growth:.2f}x from T=4096 to T=8192 "
            f"(target <= {MEMORY_GROWTH}x)"
        )
    for T in sizes:
        if T >= 2048 and ("plain", T) in times:
            ratio = times["fused", T]["total"].median / times["plain", T]["total"].median
            print(
                f"{verdict(ratio <= TIME_VS_PLAIN)}  T={T}: fused time is {ratio:.2f}x minitensor plain "
                f"(target <= {TIME_VS_PLAIN}x)"
            )
        elif T >= 2048:
            print(f"  --  T={T}: minitensor plain skipped (memory), no comparison")
    if have_sdpa and ("sdpa", 2048) in times:
        ratio = times["fused", 2048]["total"].median / times["sdpa", 2048]["total"].median
        print(
            f"{verdict(ratio <= TIME_VS_SDPA)}  T=2048: fused time is {ratio:.2f}x SDPA "
            f"(target <= {TIME_VS_SDPA}x; stretch <= {TIME_VS_SDPA_STRETCH}x: "
            f"{'met' if ratio <= TIME_VS_SDPA_STRETCH else 'not met'})"
        )


if __name__ == "__main__":
    sys.exit(main())
