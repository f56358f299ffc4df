"""``bench/data_parallel.py --quick`` runs: two MPI processes compute what one does, and the
script prints its table of the three settings (with PyTorch DDP's rows where torch is
installed). It needs mpi4py and mpiexec (the dist extra): elsewhere it skips, except under
``CI=true``, where they are installed (``.ci/run``) and a missing one is a failure."""

import importlib.util
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parent.parent / "bench" / "data_parallel.py"


def require_mpi():
    """mpiexec as ``minitensor train --workers`` finds it (beside Python, or on PATH), or a skip."""
    search = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    missing = [
        what
        for what, found in (
            ("mpi4py", importlib.util.find_spec("mpi4py") is not None),
            ("mpiexec", shutil.which("mpiexec", path=search) is not None),
            ("threadpoolctl", importlib.util.find_spec("threadpoolctl") is not None),
        )
        if not found
    ]
    if missing:
        message = f"{', '.join(missing)} not installed (pip install -e '.[dist,test]')"
        if os.environ.get("CI") == "true":
            pytest.fail("under CI=true the data-parallel benchmark must run: " + message)
        pytest.skip(message)


def test_the_quick_run_prints_its_table():
    require_mpi()
    done = subprocess.run([sys.executable, str(SCRIPT), "--quick"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "[check] minitensor, 2 processes' all-reduced gradient vs 1 process's" in out
    assert "Median time per training step" in out
    for setting in ("1 x 1", "1 x 2", "2 x 1"):
        assert re.search(rf"^minitensor +{setting} ", out, flags=re.M), f"no minitensor {setting} row"
    assert "all-reduce in step" in out and "efficiency" in out
    assert "--quick: the targets are judged on the full run" in out
    assert "DISAGREE" not in out
    if importlib.util.find_spec("torch") is not None:
        assert "[check] PyTorch DDP (2 processes) vs minitensor (1 process)" in out
        assert re.search(r"^torch +2 x 1 ", out, flags=re.M), "no PyTorch DDP row"
    else:
        assert "PyTorch is not installed" in out
