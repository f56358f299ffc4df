"""Benchmark the numba softmax kernels against naive NumPy and PyTorch.

Usage::

    python bench/softmax.py                 # 1 and 2 threads, default repeats
    python bench/softmax.py --threads 2 --repeat 100
    python bench/softmax.py --quick         # fewer repeats, softmax only

For float32 inputs of shapes (4096, 512) and (32768, 64) it times

* ``numba``: :mod:`minitensor.kernels.cpu`,
* ``naive``: :mod:`minitensor.kernels.reference` run with NumPy,
* ``torch``: ``torch.softmax`` / ``torch._softmax_backward_data`` (and the
  log-softmax equivalents), if torch is importable.

and then the same softmax through each library's autograd, as a model meets it
("autograd" rows): a leaf x that requires grad, ``y = softmax(x)``,
``y.backward(g)``, ``x.grad`` read. Besides the two kernels that includes the
engine's work: building the node, walking the graph, and handing the gradient
to the leaf (which minitensor takes without a copy when nothing else holds it,
as PyTorch does).

Method: every library gets the same thread count (``numba.set_num_threads``,
``torch.set_num_threads`` and ``threadpoolctl`` for NumPy's thread pools);
each function is warmed up first (so numba compiles outside the timing) and
then the candidates run interleaved -- A B C A B C ... -- so that slow drifts
of the machine (frequency, other processes) hit all of them alike.  We report
the median.

Bandwidth: softmax streams its input once and writes its output once (the
row being worked on stays in L1), so "effective GB/s" counts bytes read +
written.  The physical limit is the machine's copy bandwidth, measured with
``np.copyto`` on a 64 MB array and also reported as read + write.
"""

import argparse
import contextlib
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import numba  # noqa: E402
from _common import thread_count  # noqa: E402
from minitensor.kernels import cpu, reference  # noqa: E402

import minitensor as mt  # noqa: E402

try:
    import torch
except ImportError:  # torch columns are skipped
    torch = None

try:
    from threadpoolctl import threadpool_limits
except ImportError:
    threadpool_limits = None

SHAPES = [(4096, 512), (32768, 64)]
DTYPE = np.float32

# Targets, specified for softmax at TARGET_THREADS threads (the other rows
# are judged against the same numbers for information).
TARGET_THREADS = 2
FORWARD_VS_TORCH = 1.5  # numba time / torch time; stretch goal 1.0
BACKWARD_VS_TORCH = 1.2
BACKWARD_COPY_FRACTION = 0.5  # of the machine's copy bandwidth
AUTOGRAD_VS_TORCH = 1.0  # forward + backward through autograd on a leaf, at every thread count
SPEEDUP_VS_NAIVE = 3.0


# ---------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------


# Candidates take turns in blocks of BLOCK calls, and the first SKIP calls of each block are
# not timed. After its work a library's idle threads keep spinning for a while (PyTorch's
# OpenMP threads for milliseconds, OpenBLAS's too), holding a core: a call right after the
# other library's finds one of its 2 threads' cores busy. Within a block each library runs in
# its own steady state, as it does inside a model, and the turns still spread slow spells of
# the machine over all of them.
BLOCK, SKIP = 5, 2


def interleaved_medians(candidates, repeat, warmup=8):
    """Median seconds per call of each ``{name: fn}``, timed round-robin in blocks.

    The warm-up rounds are interleaved too: besides compiling, they let
    malloc settle.  Three libraries allocating 8 MB outputs of slightly
    different sizes fragment the heap for the first few rounds, and until it
    reaches a steady state some calls get fresh memory from the OS and pay
    ~2000 page faults (several ms) for it.
    """
    for _ in range(warmup):
        for fn in candidates.values():
            fn()
    times = {name: [] for name in candidates}
    for _ in range(max(repeat // (BLOCK - SKIP), 1)):
        for name, fn in candidates.items():
            for call in range(BLOCK):
                start = time.perf_counter()
                fn()
                if call >= SKIP:
                    times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def copy_bandwidth(repeat, megabytes=64):
    """Read + write GB/s of ``np.copyto`` on a large array (the memory limit)."""
    src = np.ones(megabytes * 2**20 // 4, dtype=np.float32)
    dst = np.empty_like(src)
    seconds = interleaved_medians({"copy": lambda: np.copyto(dst, src)}, repeat)["copy"]
    return 2 * src.nbytes / seconds / 1e9


class OtherLoad:
    """Share of the machine's CPU time used by *other* processes meanwhile.

    Timings on a shared machine are only trustworthy if nobody else was
    running; Linux's ``/proc/stat`` gives the total busy time, ``os.times``
    our own.  Returns None where ``/proc/stat`` does not exist.
    """

    @staticmethod
    def _busy_seconds():
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
        idle = fields[3] + fields[4]  # idle + iowait
        return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")

    def __enter__(self):
        try:
            self._busy = self._busy_seconds()
        except (OSError, ValueError):
            self._busy = None
        times = os.times()
        self._own = times.user + times.system
        self._wall = time.perf_counter()
        self.fraction = None
        return self

    def __exit__(self, *exc):
        if self._busy is None:
            return
        times = os.times()
        own = times.user + times.system - self._own
        busy = self._busy_seconds() - self._busy
        wall = time.perf_counter() - self._wall
        self.fraction = max(busy - own, 0.0) / (wall * (os.cpu_count() or 1))


def set_threads(n):
    numba.set_num_threads(n)
    if torch is not None:
        torch.set_num_threads(n)


# ---------------------------------------------------------------------------
# The candidates
# ---------------------------------------------------------------------------


def torch_candidates(tx, tg, kind):
    """torch forward and backward-only callables.

    The backward uses the private ``torch._softmax_backward_data`` (what
    autograd calls) where it exists; otherwise autograd on a retained graph,
    which still times the backward alone.
    """
    fwd = torch.softmax if kind == "softmax" else torch.log_softmax
    raw = getattr(torch, f"_{kind}_backward_data", None)
    ty = fwd(tx, -1)
    if raw is not None:
        return (lambda: fwd(tx, -1)), (lambda: raw(tg, ty, -1, tx.dtype))
    leaf = tx.clone().requires_grad_()
    out = fwd(leaf, -1)
    return (lambda: fwd(tx, -1)), (lambda: torch.autograd.grad(out, leaf, tg, retain_graph=True))


def softmax_candidates(x, g, kind):
    """``{pass: {library: fn}}`` for softmax or log-softmax on x, g."""
    if kind == "softmax":
        fwd_numba, bwd_numba = cpu.softmax_forward, cpu.softmax_backward
        fwd_naive, bwd_naive = reference.softmax_forward, reference.softmax_backward
    else:
        fwd_numba, bwd_numba = cpu.log_softmax_forward, cpu.log_softmax_backward
        fwd_naive, bwd_naive = reference.log_softmax_forward, reference.log_softmax_backward
    y = fwd_numba(x)

    forward = {"numba": lambda: fwd_numba(x), "naive": lambda: fwd_naive(np, x)}
    backward = {"numba": lambda: bwd_numba(y, g), "naive": lambda: bwd_naive(np, y, g)}
    if torch is not None:
        tx, tg = torch.from_numpy(x), torch.from_numpy(g)
        forward["torch"], backward["torch"] = torch_candidates(tx, tg, kind)
    return {"forward": forward, "backward": backward}


def autograd_candidates(x, g):
    """Forward + backward through each library's autograd on a leaf: {library: fn}."""
    leaf, grad = mt.tensor(x, requires_grad=True), mt.tensor(g)

    def minitensor_step():
        leaf.grad = None
        leaf.softmax(-1).backward(grad)
        return leaf.grad

    candidates = {"minitensor": minitensor_step}
    if torch is not None:
        t_leaf, t_grad = torch.from_numpy(x.copy()).requires_grad_(), torch.from_numpy(g)

        def torch_step():
            t_leaf.grad = None
            torch.softmax(t_leaf, -1).backward(t_grad)
            return t_leaf.grad

        candidates["torch"] = torch_step
    return candidates


def measure_autograd(threads, data, repeat):
    """One row per shape: softmax forward + backward through autograd, minitensor vs torch."""
    set_threads(threads)
    limits = threadpool_limits(limits=threads) if threadpool_limits else contextlib.nullcontext()
    rows = []
    with limits:
        for shape, (x, g) in data.items():
            t = interleaved_medians(autograd_candidates(x, g), repeat)
            torch_us = f"{t['torch'] * 1e6:9.0f}" if "torch" in t else f"{'-':>9}"
            ratio = t["minitensor"] / t["torch"] if "torch" in t else None
            verdict = (
                ""
                if ratio is None
                else f"torch<={AUTOGRAD_VS_TORCH}x:{'PASS' if ratio <= AUTOGRAD_VS_TORCH else 'MISS'}"
            )
            rows.append(
                f"{threads:>3} {'autograd':<12} {str(shape):<11} {'fwd+bwd':<8} {t['minitensor'] * 1e6:9.0f} "
                f"{'-':>9} {torch_us} {'-':>10} {'-':>10} {f'{ratio:6.2f}x' if ratio else '-':>7} {'-':>7}  {verdict}"
            )
            print(rows[-1], flush=True)
    return rows


# ---------------------------------------------------------------------------
# Reporting
# ---------------------------------------------------------------------------


def verdicts(pass_name, t, gbps, copy_gbps):
    """PASS/MISS strings for one row of the table."""
    out = []
    if "torch" in t:
        limit = FORWARD_VS_TORCH if pass_name == "forward" else BACKWARD_VS_TORCH
        ratio = t["numba"] / t["torch"]
        out.append(f"torch<={limit}x:{'PASS' if ratio <= limit else 'MISS'}")
    speedup = t["naive"] / t["numba"]
    out.append(f"naive>={SPEEDUP_VS_NAIVE:g}x:{'PASS' if speedup >= SPEEDUP_VS_NAIVE else 'MISS'}")
    if pass_name == "backward":
        frac = gbps / copy_gbps
        out.append(f"bw>={BACKWARD_COPY_FRACTION:.0%}:{'PASS' if frac >= BACKWARD_COPY_FRACTION else 'MISS'}")
    return out


HEADER = (
    f"{'thr':>3} {'kernel':<12} {'shape':<11} {'pass':<8} "
    f"{'numba µs':>9} {'naive µs':>9} {'torch µs':>9} "
    f"{'numba GB/s':>10} {'torch GB/s':>10} {'/torch':>7} {'naive/':>7}  targets"
)


def format_row(threads, kind, shape, pass_name, t, nbytes, copy_gbps):
    us = {k: v * 1e6 for k, v in t.items()}
    gbps = nbytes / t["numba"] / 1e9
    torch_us = f"{us['torch']:9.0f}" if "torch" in t else f"{'-':>9}"
    torch_gbps = f"{nbytes / t['torch'] / 1e9:10.1f}" if "torch" in t else f"{'-':>10}"
    vs_torch = f"{t['numba'] / t['torch']:6.2f}x" if "torch" in t else f"{'-':>7}"
    vs_naive = f"{t['naive'] / t['numba']:6.1f}x"
    checks = "  ".join(verdicts(pass_name, t, gbps, copy_gbps))
    return (
        f"{threads:>3} {kind:<12} {str(shape):<11} {pass_name:<8} "
        f"{us['numba']:9.0f} {us['naive']:9.0f} {torch_us} "
        f"{gbps:10.1f} {torch_gbps} {vs_torch} {vs_naive}  {checks}"
    )


def measure(threads, kinds, data, repeat, copy_gbps):
    """Print (and return) one table row per kernel, shape and pass."""
    set_threads(threads)
    limits = threadpool_limits(limits=threads) if threadpool_limits else contextlib.nullcontext()
    rows = []
    with limits:
        for kind in kinds:
            for shape, (x, g) in data.items():
                for pass_name, cands in softmax_candidates(x, g, kind).items():
                    t = interleaved_medians(cands, repeat)
                    arrays = 2 if pass_name == "forward" else 3
                    rows.append(format_row(threads, kind, shape, pass_name, t, arrays * x.nbytes, copy_gbps))
                    print(rows[-1], flush=True)
    return rows


def print_summary(rows, kinds, array_bytes, load):
    print(
        f"\narrays are {array_bytes / 2**20:.0f} MB each: they fit in a large L3 "
        "cache, so effective GB/s may exceed the copy bandwidth."
    )
    print(
        f"targets (softmax, {TARGET_THREADS} threads): forward <= "
        f"{FORWARD_VS_TORCH}x torch (stretch 1.0x); backward <= {BACKWARD_VS_TORCH}x "
        f"torch and >= {BACKWARD_COPY_FRACTION:.0%} of copy bandwidth; both >= "
        f"{SPEEDUP_VS_NAIVE:g}x faster than naive NumPy."
    )
    print(
        f"autograd rows: minitensor <= {AUTOGRAD_VS_TORCH}x torch at every thread count "
        "(the numba column is minitensor)"
    )
    autograd = [r for r in rows if " autograd " in r]
    if autograd:
        print(f"  autograd: {sum(r.count('MISS') for r in autograd)} miss(es) in {len(autograd)} rows")
    official = [r for r in rows if r.startswith(f"{TARGET_THREADS:>3} softmax ")]
    others = [r for r in rows if r not in official and r not in autograd]
    misses = sum(r.count("MISS") for r in official)
    if official:
        print(
            f"  softmax at {TARGET_THREADS} threads: "
            + ("all targets met" if misses == 0 else f"{misses} target(s) missed")
        )
    if others:
        print(f"  other rows (informational, same targets): {sum(r.count('MISS') for r in others)} miss(es)")
    if load.fraction is not None:
        note = "  -- timings unreliable, rerun on a quiet machine" if load.fraction > 0.05 else ""
        print(f"other processes used {load.fraction:.0%} of the CPUs during the run{note}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=thread_count, nargs="+", default=[1, 2])
    parser.add_argument("--repeat", type=int, default=40, help="timed calls per candidate (default 40)")
    parser.add_argument("--quick", action="store_true", help="10 repeats and softmax only")
    args = parser.parse_args(argv)
    repeat = 10 if args.quick else args.repeat
    kinds = ["softmax"] if args.quick else ["softmax", "log_softmax"]

    print(
        f"numpy {np.__version__}, numba {numba.__version__}, "
        f"torch {torch.__version__ if torch is not None else 'not installed'}; "
        f"{os.cpu_count()} CPUs, dtype float32, {repeat} repeats, median times"
    )
    if threadpool_limits is None:
        print("threadpoolctl not installed: NumPy's thread pools are not limited")

    rng = np.random.default_rng(0)
    data = {
        shape: (rng.standard_normal(shape, dtype=DTYPE), rng.standard_normal(shape, dtype=DTYPE)) for shape in SHAPES
    }
    rows = []
    with OtherLoad() as load:
        copy_gbps = copy_bandwidth(max(repeat // 2, 5))
        print(f"copy bandwidth (np.copyto, 64 MB, read+write): {copy_gbps:.1f} GB/s\n")
        print(HEADER)
        for threads in args.threads:
            if threads > numba.config.NUMBA_NUM_THREADS:
                print(f"skipping {threads} threads: numba was started with {numba.config.NUMBA_NUM_THREADS}")
                continue
            rows += measure(threads, kinds, data, repeat, copy_gbps)
            rows += measure_autograd(threads, data, repeat)
    print_summary(rows, kinds, data[SHAPES[0]][0].nbytes, load)


if __name__ == "__main__":
    main()
