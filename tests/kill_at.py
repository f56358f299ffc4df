"""Fault injection for the checkpoint tests: a process killed at a named instant of a save.

``save_checkpoint`` calls ``minitensor.train.checkpoint.save.reached(step)`` at each instant of
``SAVE_STEPS`` (a seam that does nothing). ``install(step)`` replaces it, in this process, by
one that kills the process at ``step`` as abruptly as a power cut or the OOM killer (SIGKILL:
no ``finally``, no atexit). Production code holds no switch for it.

In a child process: ``python -c kill_at.SAVE_IN_CHILD ...`` or ``kill_at.cli_command(step, args)``.
"""

import os
import pathlib
import signal
import sys

from minitensor.train.checkpoint import save

TESTS = str(pathlib.Path(__file__).resolve().parent)


def install(step):
    """Kill this process when a save reaches ``step`` (one of ``save.SAVE_STEPS``)."""
    if step not in save.SAVE_STEPS:
        raise ValueError(f"{step!r} is not a save step; it must be one of {', '.join(save.SAVE_STEPS)}")

    def reached(name):
        if name == step:
            os.kill(os.getpid(), getattr(signal, "SIGKILL", signal.SIGTERM))  # no SIGKILL on Windows

    save.reached = reached


def cli_command(step, *args):
    """The argv of ``minitensor ARGS`` in a child process killed when a save reaches ``step``."""
    code = (
        f"import runpy, sys; sys.path.insert(0, {TESTS!r}); import kill_at; kill_at.install({step!r}); "
        "sys.argv[0] = 'minitensor'; runpy.run_module('minitensor', run_name='__main__', alter_sys=True)"
    )
    return [sys.executable, "-c", code, *args]
