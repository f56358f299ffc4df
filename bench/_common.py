"""Helpers shared by the benchmark scripts in ``bench/``.

Every script follows the same rules, and these helpers implement them once:

- the libraries compared run *interleaved* (A B, B A, A B, ...), so that a slow spell of
  the machine (another process, a frequency change) hits all of them alike instead of
  whichever happened to run at that moment;
- every library gets the same number of threads (``limit_threads``), and each script
  measures at 1 and at 2 threads (``THREAD_COUNTS``);
- results are medians with the interquartile range (IQR, the middle half of the
  samples), which ignore the occasional outlier that would drag a mean;
- PyTorch is the peer when it is importable (``import_torch`` returns None otherwise, and
  the scripts leave out its columns);
- a plain-text table (``print_table``) with PASS/MISS against each target (``verdict``).

Nothing here imports minitensor, numba or torch at import time: ``bench/import_time.py``
must not pay for them, and each script decides what it loads.
"""

import argparse
import contextlib
import gc
import importlib
import importlib.util
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

THREAD_COUNTS = (1, 2)

# Every script times at fixed thread counts through threadpoolctl (``limit_threads``): say so at
# the start, not with an ImportError once a run is under way.
if importlib.util.find_spec("threadpoolctl") is None:
    raise SystemExit(
        f"{os.path.basename(sys.argv[0])}: the benchmarks need threadpoolctl: install their extra, "
        'pip install -e ".[bench]" (it adds PyTorch, the peer they time minitensor against)'
    )

# Environment variables that fix a *new* process's thread pools (OpenMP, OpenBLAS, MKL,
# numba) before it starts: the subprocess counterpart of ``limit_threads``.
_THREAD_ENV_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS")


# -- command line ---------------------------------------------------------------------------
def parse_args(description, quick_help="a short smoke run with fewer samples (for CI)"):
    """The common command line: ``--quick`` for a fast smoke run."""
    parser = argparse.ArgumentParser(description=description.strip().splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=quick_help)
    return parser.parse_args()


def thread_count(text):
    """The argparse type of a ``--threads`` option: an integer from 1 to the CPUs this process
    may use (its affinity mask). More threads than cores measure waiting, not work, and a typo
    must not start thousands of threads."""
    from minitensor.train.distributed import usable_cpus  # the count --workers is bounded by

    cpus = usable_cpus()
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of threads") from None
    if not 1 <= n <= cpus:
        raise argparse.ArgumentTypeError(f"{n} threads: give 1 to {cpus}, the CPUs this process may use")
    return n


def count_between(low, high):
    """The argparse type of a count a script allocates by (steps, tokens): an integer from
    ``low`` to ``high``, so that a typo cannot ask for a billion of them."""

    def convert(text):
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if not low <= n <= high:
            raise argparse.ArgumentTypeError(f"{n}: give {low} to {high:,}")
        return n

    return convert


# -- optional peers -------------------------------------------------------------------------
def import_torch():
    """The ``torch`` module, or None when PyTorch is not installed (its columns are skipped)."""
    try:
        return importlib.import_module("torch")
    except ImportError:
        return None


# -- threads --------------------------------------------------------------------------------
@contextlib.contextmanager
def limit_threads(n, torch=None):
    """Run the block with ``n`` threads for NumPy's BLAS, numba and (if given) PyTorch.

    BLAS goes through threadpoolctl, numba through ``numba.set_num_threads`` (only if numba
    is already imported: importing it here would distort what a script measures), PyTorch
    through ``torch.set_num_threads``. The previous settings are restored afterwards.
    """
    from threadpoolctl import threadpool_limits

    numba = sys.modules.get("numba")
    if numba is not None and n > numba.config.NUMBA_NUM_THREADS:
        raise SystemExit(
            f"{os.path.basename(sys.argv[0])}: measuring at {n} threads needs numba to allow {n}; it allows "
            f"{numba.config.NUMBA_NUM_THREADS} here (NUMBA_NUM_THREADS, or the cores this process may use)"
        )
    old_numba = numba.get_num_threads() if numba is not None else None
    old_torch = torch.get_num_threads() if torch is not None else None
    try:
        with threadpool_limits(limits=n):
            if numba is not None:
                numba.set_num_threads(n)
            if torch is not None:
                torch.set_num_threads(n)
            yield
    finally:
        if numba is not None:
            numba.set_num_threads(old_numba)
        if torch is not None:
            torch.set_num_threads(old_torch)


def thread_env(n, base=None):
    """A copy of the environment (or ``base``) that gives a new process ``n`` threads."""
    env = dict(os.environ if base is None else base)
    env.update({name: str(n) for name in _THREAD_ENV_VARS})
    return env


# -- timing ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Stats:
    """Summary of repeated measurements (seconds): median and quartiles."""

    median: float
    q1: float
    q3: float
    n: int

    @classmethod
    def of(cls, samples):
        samples = list(samples)
        if len(samples) < 2:
            (only,) = samples
            return cls(only, only, only, 1)
        q1, _, q3 = statistics.quantiles(samples, n=4, method="inclusive")
        return cls(statistics.median(samples), q1, q3, len(samples))

    @property
    def iqr(self):
        return self.q3 - self.q1

    def scaled(self, factor):
        """The same statistics for a quantity ``factor`` times as large (e.g. per op)."""
        return Stats(self.median * factor, self.q1 * factor, self.q3 * factor, self.n)


def timed(fn):
    """Wrap ``fn`` so that calling it returns its wall time in seconds."""

    def run():
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start

    run.__name__ = getattr(fn, "__name__", "timed")
    return run


def interleaved(cases, rounds, warmup=0):
    """Run ``cases`` in alternating order ``rounds`` times; return their ``Stats``.

    ``cases`` maps a name to a callable that takes one sample and returns its duration in
    seconds: a float (see ``timed``) or a dict of named durations (e.g. forward and
    backward), which are reported as ``"name/key"``.

    Rounds alternate the order (A B, then B A) so that neither case always runs right after
    the other. The garbage collector runs before every sample, outside the timed region,
    and is disabled during it, so no case pays for another's garbage; ``gc.freeze`` first
    moves everything allocated so far out of the collector's sight, which keeps those
    collections short.
    """
    names = list(cases)
    for _ in range(warmup):
        for name in names:
            cases[name]()
    samples = {}
    was_enabled = gc.isenabled()
    gc.collect()
    gc.freeze()
    try:
        for i in range(rounds):
            for name in names if i % 2 == 0 else reversed(names):
                gc.collect()
                gc.disable()
                try:
                    result = cases[name]()
                finally:
                    if was_enabled:
                        gc.enable()
                _record(samples, name, result)
    finally:
        gc.unfreeze()
    return {key: Stats.of(values) for key, values in samples.items()}


def _record(samples, name, result):
    if isinstance(result, dict):
        for key, seconds in result.items():
            samples.setdefault(f"{name}/{key}", []).append(seconds)
    else:
        samples.setdefault(name, []).append(result)


# -- subprocesses ---------------------------------------------------------------------------
def run_python(args, env=None, cwd=None):
    """Run ``python ARGS`` in a fresh interpreter; return (stdout, stderr), raise if it fails."""
    proc = subprocess.run([sys.executable, *args], env=env, cwd=cwd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"python {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}")
    return proc.stdout, proc.stderr


# -- output ---------------------------------------------------------------------------------
def format_time(seconds):
    """A duration with a readable unit: ``1.23 µs``, ``45.6 ms``, ``1.20 s``."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if abs(seconds) >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


def format_mib(n):
    """Bytes as MiB with one decimal: ``format_mib(3 * 2**20)`` -> "3.0 MiB"."""
    return f"{n / 2**20:.1f} MiB"


def format_stats(stats):
    """``median ±IQR/2``: the median with half the interquartile range (alone for 1 sample)."""
    if stats.n == 1:
        return format_time(stats.median)
    return f"{format_time(stats.median)} ±{format_time(stats.iqr / 2)}"


def format_ratio(ratio):
    return "-" if ratio is None else f"{ratio:.2f}x"


def verdict(ok):
    return "PASS" if ok else "MISS"


def print_table(headers, rows, title=None):
    """Print rows (sequences of values, turned into strings) as aligned text columns."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    if title:
        print(f"\n{title}")
    line = "  ".join("-" * w for w in widths)
    print(line)
    for k, row in enumerate(cells):
        print("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))))
        if k == 0:
            print(line)
    print(line)


def print_header(title, quick=False):
    """The name of the benchmark and the machine it runs on."""
    import platform

    print(f"{title}{'  (--quick)' if quick else ''}")
    print(
        f"Python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.2f}{_cpu_governor()}"
    )


def _cpu_governor():
    """The CPU frequency governor, where Linux exposes it (``performance`` is steadiest)."""
    try:
        with open("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor") as f:
            return f", governor {f.read().strip()}"
    except OSError:
        return ""
