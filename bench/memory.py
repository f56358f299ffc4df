"""Memory of a Transformer training loop: minitensor vs PyTorch, each in its own process.

What is measured
----------------
The training step of ``bench/train_step.py`` (the same models, batches and Adam; see there)
repeated in a fresh interpreter per framework and configuration, so that neither library's
allocations, caches or thread pools are charged to the other:

- *baseline*: the resident set size (VmRSS) once the library is imported and the model,
  optimiser and batches are built -- what the process costs before training;
- *peak above baseline*: the high-water mark of the RSS (VmHWM, reset to the current RSS
  just after the baseline through ``/proc/self/clear_refs``) during the steps, minus the
  baseline: activations and the saved tensors of the graph, gradients, Adam's two moments,
  allocator slack. Where VmHWM cannot be reset, ``ru_maxrss`` (the peak since the process
  started) stands in and the table says so;
- *growth*: at D2L's configuration, the RSS after step 100 and after the last step (500):
  a leak -- a graph kept alive, a cache that never stops growing -- shows as an RSS that
  keeps rising; a healthy loop levels off after its first steps.

Targets: peak above baseline <= 1.5x PyTorch's at both configurations; minitensor's RSS
growth from step 100 to step 500 within ``GROWTH_TOLERANCE`` (malloc keeps some freed memory
and PyTorch's RSS wanders by a few MiB too, shown for scale; a leak of even one small
activation per step, 160 kB at D2L's size, would add ~64 MB over 400 steps).

Both run with 1 thread (OMP/OpenBLAS/MKL/NUMBA_NUM_THREADS=1, ``--threads`` to change):
thread pools have per-thread buffers, and the same count for both keeps them comparable.
Linux only (``/proc``). ``--quick``: D2L's configuration only, 200 steps (growth from step 50).

    python bench/memory.py [--quick] [--threads N]
"""

import argparse
import json
import os
import resource
import sys
import time

from _common import format_mib, format_ratio, print_header, print_table, run_python, thread_count, thread_env, verdict

TARGET = 1.5  # minitensor's peak above baseline / PyTorch's
GROWTH_TOLERANCE = 4 * 2**20  # bytes of RSS growth allowed between the first and the last checkpoint

FULL = {"d2l": (500, 100), "large": (3, None)}  # config -> (steps, step of the first growth checkpoint)
QUICK = {"d2l": (200, 50)}
FRAMEWORKS = ("minitensor", "torch")


# -- the worker: one framework, one configuration, in its own process ---------------------------
def read_status(field):
    """A ``/proc/self/status`` field (VmRSS, VmHWM) in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def reset_peak():
    """Make VmHWM start again from the current RSS; False where the kernel does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return read_status("VmHWM") <= read_status("VmRSS") * 1.01 + 2**20
    except OSError:
        return False


def make_step(ts, framework, cfg):
    """Build the model, Adam and batches of ``cfg``; return ``step(i)``, one training step."""
    batches = ts.make_batches(cfg)
    if framework == "minitensor":
        model, opt = ts.build_minitensor(cfg)
        data = ts.minitensor_batches(batches)
        return lambda i: ts.minitensor_step(model, opt, data[i % len(data)])
    import torch

    model, opt = ts.build_torch(torch, cfg)
    data = ts.torch_batches(torch, batches)
    return lambda i: ts.torch_step(torch, model, opt, data[i % len(data)])


def warm_up(ts, framework):
    """Two steps of each of two small throwaway models (``train_step.WARM_UP_CONFIGS``): what
    a library loads or builds on first use (minitensor: numba, its serial and parallel
    kernels, the OpenMP pool; PyTorch: its kernels and autograd engine) belongs to the
    baseline, not to training."""
    for cfg in ts.WARM_UP_CONFIGS:
        step = make_step(ts, framework, cfg)
        step(0)
        step(1)


def worker(framework, config, steps, checkpoint):
    """Train for ``steps`` steps; print a JSON line with the RSS figures (bytes)."""
    import importlib

    import train_step as ts

    importlib.import_module(framework)
    imported = read_status("VmRSS")
    warm_up(ts, framework)
    warmed = read_status("VmRSS")
    step = make_step(ts, framework, ts.CONFIGS[config])
    baseline = read_status("VmRSS")
    peak_is_reset = reset_peak()
    rss = {}
    start = time.perf_counter()
    for i in range(1, steps + 1):
        step(i)
        if i == 1 or i % 50 == 0 or i == steps or i == checkpoint:
            rss[i] = read_status("VmRSS")
    elapsed = time.perf_counter() - start
    if peak_is_reset:
        peak = read_status("VmHWM")
    else:  # the peak since the process started (ru_maxrss is in kB on Linux)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    # The kernel updates VmHWM lazily (it can lag the RSS by a few pages): never below a sample.
    peak = max(peak, *rss.values())
    print(
        json.dumps(
            {
                "imported": imported,
                "warmed": warmed,
                "baseline": baseline,
                "peak": peak,
                "peak_is_reset": peak_is_reset,
                "rss": rss,
                "seconds_per_step": elapsed / steps,
            }
        )
    )


# -- the driver -------------------------------------------------------------------------------------
def measure(framework, config, steps, checkpoint, threads):
    args = [os.path.abspath(__file__), "--worker", framework, "--config", config, "--steps", str(steps)]
    if checkpoint:
        args += ["--checkpoint", str(checkpoint)]
    stdout, _ = run_python(args, env=thread_env(threads))
    result = json.loads(stdout.strip().splitlines()[-1])
    result["rss"] = {int(k): v for k, v in result["rss"].items()}
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="D2L's configuration only, 200 steps (for CI)")
    parser.add_argument("--threads", type=thread_count, default=1, help="threads for every library (default 1)")
    parser.add_argument("--worker", choices=FRAMEWORKS, help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--checkpoint", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker, args.config, args.steps, args.checkpoint)

    import importlib.util

    have_torch = importlib.util.find_spec("torch") is not None
    print_header("Transformer training loop, resident memory: minitensor vs PyTorch, one process each", args.quick)
    print(f"{args.threads} thread(s) per library; sizes in MiB (2^20 bytes)")
    plan = QUICK if args.quick else FULL
    frameworks = FRAMEWORKS if have_torch else FRAMEWORKS[:1]
    if not have_torch:
        print("PyTorch is not installed: its columns are left out")

    results = {}
    for config, (steps, checkpoint) in plan.items():
        for framework in frameworks:
            results[config, framework] = measure(framework, config, steps, checkpoint, args.threads)

    rows, verdicts = [], []
    for config, (steps, _) in plan.items():
        for framework in frameworks:
            r = results[config, framework]
            above = r["peak"] - r["baseline"]
            ratio = None
            if have_torch:
                t = results[config, "torch"]
                ratio = above / (t["peak"] - t["baseline"])
            rows.append(
                [
                    config,
                    framework,
                    steps,
                    format_mib(r["imported"]),
                    format_mib(r["warmed"] - r["imported"]),
                    format_mib(r["baseline"]),
                    format_mib(r["peak"]) + ("" if r["peak_is_reset"] else " *"),
                    format_mib(above),
                    format_ratio(ratio) if framework == "minitensor" else "",
                    f"{r['seconds_per_step'] * 1e3:.0f} ms",
                ]
            )
        if have_torch:
            m, t = results[config, "minitensor"], results[config, "torch"]
            ratio = (m["peak"] - m["baseline"]) / (t["peak"] - t["baseline"])
            verdicts.append(
                f"{verdict(ratio <= TARGET)}  {config}: peak above baseline is {ratio:.2f}x torch's "
                f"(target <= {TARGET}x)"
            )
    print_table(
        [
            "config",
            "framework",
            "steps",
            "imported",
            "first use",
            "baseline",
            "peak",
            "peak - baseline",
            "mt/torch",
            "per step",
        ],
        rows,
        title="Resident memory: after import, + first use (a tiny model's steps), baseline (+ this model "
        "built), peak during training",
    )
    if any(not r["peak_is_reset"] for r in results.values()):
        print("* VmHWM could not be reset: peak since the process started (ru_maxrss)")

    growth_rows = []
    for config, (steps, checkpoint) in plan.items():
        if not checkpoint:
            continue
        for framework in frameworks:
            rss = results[config, framework]["rss"]
            trail = sorted(k for k in rss if k >= checkpoint)
            growth = rss[steps] - rss[checkpoint]
            growth_rows.append(
                [
                    config,
                    framework,
                    format_mib(rss[1]),
                    format_mib(rss[checkpoint]),
                    format_mib(rss[steps]),
                    f"{growth / 2**20:+.2f} MiB",
                    " ".join(f"{(rss[k] - rss[checkpoint]) / 2**20:+.1f}" for k in trail),
                ]
            )
            if framework == "minitensor":  # PyTorch's row is there for scale: its allocator wanders too
                verdicts.append(
                    f"{verdict(growth <= GROWTH_TOLERANCE)}  {config}, {framework}: RSS grows "
                    f"{growth / 2**20:+.2f} MiB from step {checkpoint} to step {steps} "
                    f"(target <= {GROWTH_TOLERANCE / 2**20:.0f} MiB)"
                )
    if growth_rows:
        print_table(
            [
                "config",
                "framework",
                "RSS step 1",
                "RSS first ckpt",
                "RSS last",
                "growth",
                "RSS - first ckpt, every 50 steps (MiB)",
            ],
            growth_rows,
            title="RSS over a long run (a leak keeps rising)",
        )
    for line in verdicts:
        print(line)


if __name__ == "__main__":
    sys.exit(main())
