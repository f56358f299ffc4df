"""Where a ``minitensor train`` run's memory goes: its resident set size, phase by phase.

Runs ``minitensor train ARGS`` in this process and samples the RSS (``/proc/self/status``)
every 2 ms from a thread, charging each sample to the phase the run is in: importing
minitensor, building the data and the model, the training steps (the first, 2-10, the rest),
nanoGPT's loss estimates, the end-of-epoch evaluation, the checkpoints, the final report
(the best weights loaded again, samples generated) and the figures. A phase is marked by
wrapping the function of ``minitensor.train.loop`` that does it; nothing else is changed.

Prints, per phase, the RSS when it began and the highest RSS seen during it, then the
process's peak (``ru_maxrss``): the figure ``/usr/bin/time -v`` reports. Linux only.

    python bench/gpt_memory.py train --preset gpt-char --steps 200 --out /tmp/gpt-mem

The findings are in bench/README.md ("Where a character GPT's memory goes").
"""

import resource
import sys
import threading
import time

from memory import read_status  # the bench folder's: a /proc/self/status field in bytes


def rss_mib():
    return read_status("VmRSS") / 2**20


class Phases:
    """The current phase's name, and per phase [RSS at its start, highest RSS seen]."""

    def __init__(self):
        self.name, self.peaks = "python", {"python": [rss_mib()] * 2}
        threading.Thread(target=self._sample, daemon=True).start()

    def enter(self, name):
        self.name = name
        self.peaks.setdefault(name, [rss_mib()] * 2)

    def _sample(self):
        while True:
            name, r = self.name, rss_mib()
            peak = self.peaks.setdefault(name, [r, r])
            peak[1] = max(peak[1], r)
            time.sleep(0.002)


def main(argv):
    phases = Phases()
    phases.enter("import minitensor")
    from minitensor.cli import main as cli_main
    from minitensor.train import loop

    def wrap(name, label):
        function = getattr(loop, name)

        def wrapped(*args, **kwargs):
            phases.enter(label(*args) if callable(label) else label)
            try:
                return function(*args, **kwargs)
            finally:
                phases.enter("after " + (label(*args) if callable(label) else label))

        setattr(loop, name, wrapped)

    steps = [0]

    def step_label(*_):
        return "training step 1" if steps[0] == 1 else "training steps 2-10" if steps[0] <= 10 else "training steps 11+"

    def count_step(state, batch, _step=loop.train_step):
        steps[0] += 1
        phases.enter(step_label())
        return _step(state, batch)

    loop.train_step = count_step
    wrap("build_data", "build the data")
    wrap("build_model", lambda *_: "build the model" if steps[0] == 0 else "final report: the best model")
    wrap("estimate_losses", "estimate_losses (every eval_interval)")
    wrap("evaluate", "end-of-epoch evaluation")
    wrap("save_checkpoints", "save the checkpoints")
    wrap("_report_lm", "final report: samples")
    wrap("save_figures", "figures (matplotlib)")
    try:
        cli_main(argv)
    except SystemExit as e:
        if e.code:
            raise
    phases.enter("end")
    time.sleep(0.01)
    print(f"\n{'phase':42s} {'RSS at start':>12s} {'peak RSS':>9s}  (MiB)", file=sys.stderr)
    for name, (start, peak) in phases.peaks.items():
        print(f"{name:42s} {start:12.0f} {peak:9.0f}", file=sys.stderr)
    print(
        f"process peak (ru_maxrss): {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main(sys.argv[1:])
