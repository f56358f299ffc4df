"""What the experiment scripts share: their command line, training one run in a folder that
is thrown away afterwards, and the lines that end every report (command, time, machine)."""

import datetime
import os
import platform
import shlex
import sys
import tempfile
import time

import numpy


def add_training_arguments(parser, quick, what):
    """``--seeds``, ``--num-train``, ``--epochs`` and ``--quick`` (the ``quick`` settings):
    left None here, filled in by ``finish_training_arguments``."""
    from minitensor.train import TrainConfig

    defaults = TrainConfig()
    parser.add_argument("--seeds", type=int, default=None, help=f"training seeds 0 .. N-1 per {what} (default 3)")
    parser.add_argument(
        "--num-train",
        type=int,
        default=None,
        help=f"training examples (default: TrainConfig's, {defaults.num_train:,})",
    )
    parser.add_argument("--epochs", type=int, default=None, help=f"epochs (default: TrainConfig's, {defaults.epochs})")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a smoke test: " + ", ".join(f"{key.replace('_', ' ')} {value}" for key, value in quick.items()),
    )


def finish_training_arguments(parser, args, quick, extra=()):
    """Fill in what was not given (``--quick``'s settings, else the defaults) and refuse
    counts below 1. ``extra``: (name, default) pairs of the script's own counts."""
    from minitensor.train import TrainConfig

    defaults = TrainConfig()
    chosen = quick if args.quick else {}
    for name, default in (("seeds", 3), ("num_train", defaults.num_train), ("epochs", defaults.epochs), *extra):
        if getattr(args, name, None) is None:
            setattr(args, name, chosen.get(name, default))
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    args.num_heldout = chosen.get("num_heldout", defaults.num_heldout)
    return args


def train_throwaway(prefix, **settings):
    """Train ``TrainConfig(**settings)`` quietly in a temporary folder, removed afterwards
    (without drawing the figures nobody would see); the ``TrainResult``. The run's messages
    are shown only if it fails."""
    from minitensor.train import TrainConfig, train

    with tempfile.TemporaryDirectory(prefix=prefix) as folder:
        config = TrainConfig(progress=False, out=os.path.join(folder, "run"), **settings)
        messages = []
        try:
            return train(config, log=messages.append, figures=False)
        except Exception:
            print("\n".join(messages), file=sys.stderr)
            raise


def run_grid(names, seeds, run_one):
    """{name: [run_one(name, seed) for each seed]}, one progress line per run on stderr;
    each run returns {what: percent}."""
    scores = {}
    for name in names:
        for seed in seeds:
            start = time.perf_counter()
            run = run_one(name, seed)
            scores.setdefault(name, []).append(run)
            print(
                f"{name} seed {seed}: "
                + ", ".join(f"{k} {v:.1f}%" for k, v in run.items())
                + f" ({time.perf_counter() - start:.0f} s)",
                file=sys.stderr,
                flush=True,
            )
    return scores


def machine():
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (
        f"{cores} CPU cores ({platform.system()} {platform.machine()}), Python {platform.python_version()}, "
        f"NumPy {numpy.__version__}"
    )


def footer(script, argv, wall):
    """The report's last lines: the command that made it, its wall time, the date, the machine."""
    return [
        f"command: `python experiments/{script}{' ' + shlex.join(argv) if argv else ''}`",
        f"wall time: {wall:.0f} s" + (f" ({wall / 60:.1f} min)" if wall >= 60 else ""),
        f"date: {datetime.date.today().isoformat()}; machine: {machine()}",
    ]
