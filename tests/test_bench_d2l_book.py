"""``bench/d2l_book.py --quick`` runs: the chapter's two translation models, the book's PyTorch
code on minitensor and on PyTorch, the same logits first, then a step of each side by side.
Without PyTorch (``.ci/run`` does not install it) the script says so and stops cleanly."""

import importlib.util
import pathlib
import re
import subprocess
import sys

SCRIPT = pathlib.Path(__file__).resolve().parent.parent / "bench" / "d2l_book.py"


def test_the_quick_run_compares_or_says_what_is_missing():
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--threads", "1"], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    if importlib.util.find_spec("torch") is None:
        assert "PyTorch is not installed: there is nothing to compare with" in out
        return
    match = re.search(r"largest relative logit differences bahdanau (\S+), transformer (\S+)", out)
    assert match and all(float(x.rstrip(",")) <= 1e-4 for x in match.groups()), out
    for name in ("bahdanau", "transformer"):
        assert re.search(rf"(PASS|MISS)  the book's {name} takes \d+\.\d\dx its PyTorch step on minitensor", out), out


def test_a_thread_count_past_the_machine_is_refused():
    done = subprocess.run([sys.executable, str(SCRIPT), "--threads", "100000"], capture_output=True, text=True)
    assert done.returncode == 2 and "100000 threads: give 1 to" in done.stderr
