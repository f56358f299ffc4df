"""First-call cost of the softmax kernels, with and without numba's on-disk cache.

What is measured
----------------
minitensor's softmax kernels (``minitensor/core/kernels/cpu.py``) are numba functions with
``cache=True``: the first process compiles them (seconds) and stores the machine code on
disk; a later process only loads it. This script checks that the second process really
reuses that code and shows what the user waits for on a first call.

Each measurement is a fresh interpreter with ``NUMBA_CACHE_DIR`` pointing at a temporary
directory. It times, in this order:

    import minitensor
    import numba + the kernels module  (what the first kernel call triggers)
    first softmax forward + backward on a float32 (64, 128) tensor
    first log_softmax forward + backward
    first masked_softmax (valid_lens) forward + backward
    a later softmax forward + backward (the steady state, for scale)

*Cold*: the cache directory is new and empty (it is compiled and written there).
*Warm*: a new process on a directory a cold run has filled. Runs alternate: cold (into a
fresh directory), warm, cold, warm, ...; further warm runs follow until there are enough.
Thread counts are set through the environment (``NUMBA_NUM_THREADS`` and the BLAS/OpenMP
variables), the subprocess counterpart of ``numba.set_num_threads``.

Target: a warm process reuses the compiled kernels: it leaves the cache directory exactly
as the cold run wrote it (no file added or rewritten, i.e. nothing was compiled again), and
its first use is much faster (the speedup is reported).

Even with a warm cache the first softmax is not free: numba sets up its CPU target on the
first dispatch in a process, importing numba's own NumPy support (and, through it,
``scipy.linalg`` when SciPy is installed). The later first calls (log_softmax,
masked_softmax) show what loading a cached kernel itself costs.

    python bench/kernel_cache.py [--quick]
"""

import json
import os
import tempfile

from _common import (
    THREAD_COUNTS,
    Stats,
    format_stats,
    format_time,
    parse_args,
    print_header,
    print_table,
    run_python,
    thread_env,
    verdict,
)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The measuring child: prints one JSON object, the durations in seconds of each step and
# whether the first kernel call imported scipy (see the module docstring).
CHILD = """
import json, sys, time
clock = time.perf_counter
times = {}

start = clock()
import minitensor as mt
times["import minitensor"] = clock() - start

start = clock()
import minitensor.kernels.cpu
times["import numba + kernels"] = clock() - start

mt.manual_seed(0)
x = mt.randn(64, 128, requires_grad=True)
g = mt.randn(64, 128)
lens = mt.randint(1, 129, (64,))

def first(name, fn):
    x.grad = None
    start = clock()
    fn(x).backward(g)
    times[name] = clock() - start

first("first softmax", mt.softmax)
first("first log_softmax", mt.log_softmax)
first("first masked_softmax", lambda t: mt.masked_softmax(t, valid_lens=lens))
first("later softmax", mt.softmax)
print(json.dumps({"times": times, "scipy imported": "scipy" in sys.modules}))
"""
FIRST_USE = ("import numba + kernels", "first softmax", "first log_softmax", "first masked_softmax")
ROWS = ("import minitensor", *FIRST_USE, "later softmax")


# -- measuring ------------------------------------------------------------------------------
def run_child(cache_dir, threads):
    """One fresh process with ``cache_dir`` as numba's cache; its report (see CHILD)."""
    env = thread_env(threads)
    env["NUMBA_CACHE_DIR"] = cache_dir
    stdout, _ = run_python(["-c", CHILD], env=env, cwd=REPO)
    report = json.loads(stdout.strip().splitlines()[-1])
    times = report["times"]
    times["first use"] = sum(times[k] for k in FIRST_USE)
    return report


def measure(threads, cold_runs, warm_runs, workdir):
    """Cold and warm runs, interleaved. Returns the cold and warm reports, the files of the
    cache the warm runs used, and whether the warm runs left those files untouched."""
    cold, warm = [], []
    warm_dir = written = None
    for i in range(max(cold_runs, warm_runs)):
        if i < cold_runs:
            cache_dir = tempfile.mkdtemp(prefix="cold-", dir=workdir)
            cold.append(run_child(cache_dir, threads))
            if warm_dir is None:
                warm_dir, written = cache_dir, cache_snapshot(cache_dir)
        if i < warm_runs:
            warm.append(run_child(warm_dir, threads))
    return cold, warm, written, cache_snapshot(warm_dir) == written


def cache_snapshot(cache_dir):
    """{path: (size, modification time)} of every file numba wrote to ``cache_dir``."""
    snapshot = {}
    for root, _, files in os.walk(cache_dir):
        for name in files:
            info = os.stat(os.path.join(root, name))
            snapshot[os.path.join(root, name)] = (info.st_size, info.st_mtime_ns)
    return snapshot


def summarize(reports):
    times = [r["times"] for r in reports]
    return {key: Stats.of(t[key] for t in times) for key in times[0]}


# -- report ---------------------------------------------------------------------------------
def table_rows(threads, cold, warm):
    rows = []
    for name in (*ROWS, "first use"):
        label = "first use (sum of the 4 above)" if name == "first use" else name
        speedup = cold[name].median / warm[name].median
        rows.append([threads, label, format_stats(cold[name]), format_stats(warm[name]), f"{speedup:.3g}x"])
    return rows


def kernels_available():
    """Whether the kernels module exists yet (it may still be being written)."""
    import importlib.util

    try:
        return importlib.util.find_spec("minitensor.kernels.cpu") is not None
    except ImportError:
        return False


def main():
    args = parse_args(__doc__)
    cold_runs, warm_runs = (1, 2) if args.quick else (2, 5)
    print_header("Numba kernel cache: first-call time in a cold and a warm process", args.quick)
    if not kernels_available():
        raise SystemExit("minitensor.kernels.cpu does not exist yet: nothing to measure")
    print(f"per thread count: {cold_runs} cold and {warm_runs} warm processes, interleaved; median ±IQR/2")

    rows, verdicts, scipy_seen = [], [], False
    with tempfile.TemporaryDirectory(prefix="mt-numba-cache-") as workdir:
        for threads in THREAD_COUNTS:
            cold, warm, files, reused = measure(threads, cold_runs, warm_runs, workdir)
            scipy_seen |= any(r["scipy imported"] for r in cold + warm)
            cold, warm = summarize(cold), summarize(warm)
            rows += table_rows(threads, cold, warm)
            verdicts.append((threads, files, reused, cold["first use"].median, warm["first use"].median))
    print_table(["threads", "step", "cold cache", "warm cache", "speedup"], rows)
    if scipy_seen:
        print(
            "note: the first kernel call imported scipy (numba's CPU target set-up loads "
            "scipy.linalg when SciPy is installed): part of the warm first softmax"
        )
    for threads, files, reused, cold_s, warm_s in verdicts:
        size = sum(size for size, _ in files.values())
        print(
            f"{verdict(reused)}  {threads} thread(s): the warm processes compiled nothing "
            f"({'reused' if reused else 'CHANGED'}: {len(files)} cache files, {size / 1024:.0f} KiB); "
            f"first use {format_time(warm_s)} with the cache vs {format_time(cold_s)} without "
            f"({cold_s / warm_s:.1f}x faster)"
        )


if __name__ == "__main__":
    main()
