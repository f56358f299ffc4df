"""``import minitensor`` leaves the process as it was: no glibc allocator setting, no numba.

The two process-wide settings minitensor makes (glibc keeps freed blocks for reuse; numba's
threading layer) come with the first kernel a program runs, never with the import or with
plain array work (``minitensor/core/backends/numpy_backend.py``). Each check runs in a fresh
interpreter, where nothing has been imported yet.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]

# Watches glibc's mallopt through ctypes (how minitensor reaches it) and reports, as JSON, what
# was set after each stage, and whether numba is loaded and with which threading layer.
WATCH = """
import ctypes, json, sys
calls = []
real_cdll = ctypes.CDLL


class Watched:
    def __init__(self, *args, **kwargs):
        self._library = real_cdll(*args, **kwargs)

    def __getattr__(self, name):
        attribute = getattr(self._library, name)
        if name != "mallopt":
            return attribute
        return lambda *args: calls.append(args) or attribute(*args)


ctypes.CDLL = Watched


def state():
    numba = sys.modules.get("numba")
    return {"mallopt": list(calls), "numba": numba is not None,
            "layer": numba and numba.config.THREADING_LAYER}


report = {}
import minitensor as mt
report["import"] = state()
x = mt.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
((x * 2 + 1) @ x).sum().backward()
report["array work"] = state()
mt.softmax(x, axis=-1)
report["first kernel"] = state()
print(json.dumps(report))
"""


def run_watched(env_extra=None):
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "NUMBA_THREADING"))}
    env.update(env_extra or {})
    done = subprocess.run(
        [sys.executable, "-c", WATCH], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_import_and_array_work_change_nothing_process_wide():
    report = run_watched()
    for stage in ("import", "array work"):
        assert report[stage] == {"mallopt": [], "numba": False, "layer": None}, stage


def test_the_first_kernel_makes_the_two_documented_settings():
    import ctypes

    try:
        ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        pytest.skip("not glibc: minitensor sets nothing there")
    first = run_watched()["first kernel"]
    assert first["mallopt"] == [[-3, 32 * 2**20], [-1, 2**30]]  # M_MMAP_THRESHOLD, M_TRIM_THRESHOLD
    assert first["numba"] and first["layer"] == "workqueue"


def test_the_users_own_settings_win():
    first = run_watched({"MALLOC_TRIM_THRESHOLD_": "0", "NUMBA_THREADING_LAYER": "omp"})["first kernel"]
    assert first["mallopt"] == [] and first["layer"] == "omp"
