"""How long ``import minitensor`` takes, and proof that the heavy dependencies stay lazy.

What is measured
----------------
The wall time of fresh interpreters running, interleaved round after round:

    python -c "pass"                  the bare interpreter (start-up and shutdown)
    python -c "import numpy"
    python -c "import numpy, numba"   what a framework built on numba cannot go below
    python -c "import minitensor"

and the cost of ``import minitensor`` above the bare interpreter. NumPy is needed at once,
but everything else is imported on first use: numba (and llvmlite) when a softmax kernel
first runs, ml_dtypes when bfloat16 is first asked for (``mt.bfloat16``, ``mt.autocast``),
and matplotlib, tqdm, safetensors, cupy, torch and the plugin machinery (pluggy, entry
points) only by the features that need them. A single
``python -X importtime -c "import minitensor"`` shows where the remaining time goes, and
the script checks which of those heavy modules are in ``sys.modules`` afterwards.

The children run from the repository root (so the checkout's minitensor is the one
imported) with a private bytecode cache (``PYTHONPYCACHEPREFIX``), filled by a warm-up run
of each command: as after a normal installation, no module is compiled from source while
being timed, whatever ``PYTHONDONTWRITEBYTECODE`` says.

Target: ``import minitensor`` <= 0.8 s above the bare interpreter, and none of the lazy
modules imported.

    python bench/import_time.py [--quick]
"""

import json
import os
import tempfile
from functools import partial

from _common import (
    THREAD_COUNTS,
    format_stats,
    format_time,
    interleaved,
    parse_args,
    print_header,
    print_table,
    run_python,
    thread_env,
    timed,
    verdict,
)

TARGET = 0.8  # seconds above the bare interpreter
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMANDS = {
    "interpreter": "pass",
    "numpy": "import numpy",
    "numpy + numba": "import numpy, numba",
    "minitensor": "import minitensor",
}
# Must not be imported by `import minitensor` (each only by the feature that needs it).
LAZY_MODULES = (
    "numba",
    "llvmlite",
    "ml_dtypes",  # bfloat16: about a second to import (0.7), read by mt.autocast and bfloat16 data only
    "matplotlib",
    "tqdm",
    "safetensors",
    "cupy",
    "torch",
    "scipy",
    "pluggy",
    "importlib.metadata",
)
TOP_ENTRIES = 15


# -- running fresh interpreters -------------------------------------------------------------
def child_env(threads, pycache):
    """Environment of the children: ``threads`` threads and a private bytecode cache."""
    env = thread_env(threads)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = pycache
    return env


def make_cases(env):
    """name -> a callable that runs one fresh interpreter and returns its wall time."""
    return {name: timed(partial(run_python, ["-c", code], env=env, cwd=REPO)) for name, code in COMMANDS.items()}


def measure_wall_times(threads, runs, pycache):
    """``Stats`` of each command's wall time, run interleaved ``runs`` times."""
    cases = make_cases(child_env(threads, pycache))
    return interleaved(cases, rounds=runs, warmup=1)  # the warm-up run fills the bytecode cache


# -- what `import minitensor` loads ---------------------------------------------------------
_LIST_MODULES = "import sys, json; {imports}; print(json.dumps(sorted(sys.modules)))"


def loaded_modules(imports, env):
    """The names in ``sys.modules`` of a fresh interpreter after ``imports``."""
    stdout, _ = run_python(["-c", _LIST_MODULES.format(imports=imports)], env=env, cwd=REPO)
    return set(json.loads(stdout))


def importtime_entries(env):
    """``-X importtime`` of ``import minitensor``: (self µs, cumulative µs, indented name)."""
    _, stderr = run_python(["-X", "importtime", "-c", "import minitensor"], env=env, cwd=REPO)
    entries = []
    for line in stderr.splitlines():
        if not line.startswith("import time:") or "imported package" in line:
            continue
        own, cumulative, name = line[len("import time:") :].split("|")
        entries.append((int(own), int(cumulative), name.rstrip()))
    return entries


def minitensor_subtree(entries):
    """The entries of ``import minitensor`` itself, without the interpreter's start-up.

    ``-X importtime`` lists a module after everything it imported (post-order), so the
    subtree is what follows the previous top-level entry, up to ``minitensor`` itself.
    """
    end = next(i for i, e in enumerate(entries) if e[2].strip() == "minitensor" and _depth(e[2]) == 0)
    start = max((i + 1 for i in range(end) if _depth(entries[i][2]) == 0), default=0)
    return entries[start : end + 1]


def report_importtime(entries):
    """Print the slowest imports under ``import minitensor`` and the time by package."""
    subtree = minitensor_subtree(entries)
    top = sorted(subtree, key=lambda e: e[1], reverse=True)[:TOP_ENTRIES]
    rows = [[name.lstrip(), format_time(cum * 1e-6), format_time(own * 1e-6), _depth(name)] for own, cum, name in top]
    print_table(
        ["module", "cumulative", "self", "depth"],
        rows,
        title=f'python -X importtime -c "import minitensor": top {TOP_ENTRIES} by cumulative time',
    )
    by_package = {"minitensor": 0, "numpy": 0, "other": 0}
    for own, _, name in subtree:
        package = name.strip().split(".")[0]
        by_package[package if package in by_package else "other"] += own
    print(
        "self time by package: "
        + ", ".join(f"{k} {format_time(v * 1e-6)}" for k, v in by_package.items())
        + f" (total {format_time(subtree[-1][1] * 1e-6)})"
    )


def _depth(indented_name):
    """Nesting depth of an ``-X importtime`` entry (two spaces of indentation per level)."""
    return (len(indented_name) - len(indented_name.lstrip()) - 1) // 2


def report_lazy_modules(env):
    """Print which lazy modules ``import minitensor`` loads; return True if none."""
    bare = loaded_modules("pass", env)
    after_numpy = loaded_modules("import numpy", env)
    after = loaded_modules("import minitensor", env)
    added = after - bare
    present = [m for m in LAZY_MODULES if m in added or any(a.startswith(m + ".") for a in added)]
    print(
        f"\nimport minitensor adds {len(added)} modules to the bare interpreter's {len(bare)} "
        f"(import numpy alone adds {len(after_numpy - bare)})"
    )
    beyond_numpy = _packages(after - after_numpy, after_numpy)
    print(f"public packages it loads beyond `import numpy`'s: {', '.join(beyond_numpy)}")
    print(f"lazy modules checked: {', '.join(LAZY_MODULES)}")
    print(f"lazy modules present after `import minitensor`: {', '.join(present) if present else 'none'}")
    return not present


def _packages(modules, already_loaded):
    """Top-level public names of ``modules``; subpackages (``numpy.random``) of packages
    that were ``already_loaded``."""
    names = set()
    for module in modules:
        parts = module.split(".")
        name = ".".join(parts[:2]) if parts[0] in already_loaded else parts[0]
        if not name.startswith("_") and parts[0] != "minitensor":
            names.add(name)
    return sorted(names)


# -- report ---------------------------------------------------------------------------------
def wall_time_rows(threads, stats):
    """One row per command: its wall time and its cost above the bare interpreter."""
    base = stats["interpreter"].median
    rows = []
    for name, code in COMMANDS.items():
        above = "-" if name == "interpreter" else format_time(stats[name].median - base)
        rows.append([threads, f'python -c "{code}"', format_stats(stats[name]), above])
    return rows


def main():
    args = parse_args(__doc__)
    runs = 3 if args.quick else 7
    print_header("Import time of minitensor", args.quick)
    print(
        f"{runs} interleaved runs of each command per thread count (after one warm-up run), "
        "median ±IQR/2 of the wall time"
    )
    rows, costs = [], []
    with tempfile.TemporaryDirectory(prefix="mt-pycache-") as pycache:
        for threads in THREAD_COUNTS:
            stats = measure_wall_times(threads, runs, pycache)
            rows += wall_time_rows(threads, stats)
            costs.append(
                (
                    threads,
                    stats["minitensor"].median - stats["interpreter"].median,
                    stats["numpy + numba"].median - stats["interpreter"].median,
                )
            )
        print_table(["threads", "command", "wall time", "above interpreter"], rows)
        env = child_env(1, pycache)
        report_importtime(importtime_entries(env))
        lazy_ok = report_lazy_modules(env)

    print()
    for threads, cost, numba_cost in costs:
        print(
            f"{verdict(cost <= TARGET)}  {threads} thread(s): import minitensor costs "
            f"{format_time(cost)} above the interpreter (target <= {TARGET} s; numpy + numba "
            f"alone: {format_time(numba_cost)})"
        )
    print(f"{verdict(lazy_ok)}  no lazy module is imported by `import minitensor`")


if __name__ == "__main__":
    main()
