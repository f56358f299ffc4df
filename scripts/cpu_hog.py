"""Keep every CPU busy while a command runs: how the test suite is shown to pass on a loaded machine.

    python scripts/cpu_hog.py -- bash .ci/run          # the suite, with both cores of CI's machine busy
    python scripts/cpu_hog.py --seconds 60             # only the load, for a minute

starts one busy-looping Python process per CPU this process may use (``--processes`` for
another count, at most 4 per CPU), at the same priority as the command, runs the command,
stops the load and exits with the command's status. A test that reads the DOM before the
page's script has run, a file before its writer has finished, or a clock against a bound, fails
here far more often than on a quiet machine. The load ends with the command, on Ctrl-C, or
after ``--seconds``; the busy processes also end by themselves if this script is killed (each
watches its parent).
"""

import argparse
import os
import signal
import subprocess
import sys
import time

MAX_PER_CPU = 4

# The busy loop: spins until its parent (this script) is gone, checked every ~10^6 iterations.
SPIN = """
import os
parent = os.getppid()
while os.getppid() == parent:
    for _ in range(1_000_000):
        pass
"""


def usable_cpus():
    # minitensor.train.distributed.usable_cpus counts the same way; this script runs before
    # .ci/run has installed anything on a fresh machine, so it imports nothing of the project
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--processes", type=int, help="busy processes (default: one per usable CPU)")
    parser.add_argument("--seconds", type=float, help="stop the load after this long (default: with the command)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command to run under load, after --")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    cpus = usable_cpus()
    processes = cpus if args.processes is None else args.processes
    if not 1 <= processes <= MAX_PER_CPU * cpus:
        parser.error(f"--processes {processes}: give 1 to {MAX_PER_CPU * cpus} ({MAX_PER_CPU} per usable CPU)")
    if not command and args.seconds is None:
        parser.error("give a command to run under load (after --), or --seconds for the load alone")
    if args.seconds is not None and not 0 < args.seconds <= 24 * 3600:
        parser.error(f"--seconds {args.seconds:g}: give more than 0 and at most a day")

    hogs = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(processes)]
    print(f"cpu_hog: {processes} busy processes on {cpus} CPUs", file=sys.stderr, flush=True)
    signal.signal(signal.SIGTERM, _interrupt)  # as Ctrl-C: the busy processes are stopped below
    code, job = 0, None
    try:
        if command:
            job = subprocess.Popen(command)
            try:
                code = job.wait(timeout=args.seconds)
            except subprocess.TimeoutExpired:
                print(f"cpu_hog: the load ended after {args.seconds:g} s; the command goes on", file=sys.stderr)
                for hog in hogs:
                    hog.kill()
                code = job.wait()
        else:
            time.sleep(args.seconds)
    except KeyboardInterrupt:
        code = 130
        if job is not None and job.poll() is None:
            job.terminate()
            job.wait()
    finally:
        for hog in hogs:
            hog.kill()
        for hog in hogs:
            hog.wait()
    return code


if __name__ == "__main__":
    sys.exit(main())
