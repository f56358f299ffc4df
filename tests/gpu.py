"""Is there a real GPU for the tests? Decided once, before numba is imported.

``GPU`` is True where CuPy is installed and finds a usable device (``cupy.is_available()``;
on a machine without one ``import cupy`` works and only the first allocation fails). Set
``MINITENSOR_TEST_GPU=0`` to test as if there were none.

Without a GPU, numba's CUDA simulator is switched on (``NUMBA_ENABLE_CUDASIM=1``) so the CUDA
kernels still run, thread by thread in Python, on any machine. numba reads the variable
when it is first imported, which is why this module must be imported before anything that
imports numba (``conftest.py`` imports it first).
"""

import os

import pytest


def _usable_gpu():
    if os.environ.get("MINITENSOR_TEST_GPU") == "0":
        return False
    try:
        import cupy
    except ImportError:
        return False
    try:
        return bool(cupy.is_available())
    except Exception:  # a broken CUDA install counts as none
        return False


# A GPU with the simulator forced on (NUMBA_ENABLE_CUDASIM=1 set by the user) is treated as
# no GPU: the simulator cannot run kernels on CuPy's device arrays.
GPU = os.environ.get("NUMBA_ENABLE_CUDASIM") != "1" and _usable_gpu()
if not GPU:
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

SIMULATED = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"

# numba's on-disk kernel cache is not safe for processes compiling the same kernels at once
# (its index names a data file without a lock): pytest-xdist workers get one cache each.
if os.environ.get("PYTEST_XDIST_WORKER"):
    import tempfile

    os.environ["NUMBA_CACHE_DIR"] = os.path.join(
        os.environ.get("NUMBA_CACHE_DIR") or tempfile.gettempdir(), "minitensor-" + os.environ["PYTEST_XDIST_WORKER"]
    )

#: for tests that need a real GPU; never the only test of a feature
requires_gpu = pytest.mark.skipif(not GPU, reason="needs CuPy and a CUDA GPU (cupy.is_available() is False)")
