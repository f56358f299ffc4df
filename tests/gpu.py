"""Is there a real GPU for the tests? Decided once, when the tests start.

``GPU`` is True where CuPy is installed and finds a usable device (``cupy.is_available()``;
on a machine without one ``import cupy`` works and only the first allocation fails). Set
``MINITENSOR_TEST_GPU=0`` to test as if there were none.

Without a GPU the GPU's code is still tested: the CUDA C++ kernels run in the tests' CUDA
emulator (``tests/cuda_emulator``) and the CuPy backend on a stand-in for CuPy
(``tests/fake_cupy.py``).
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


GPU = _usable_gpu()

# numba's on-disk kernel cache is not safe for processes compiling the same kernels at once
# (its index names a data file without a lock): pytest-xdist workers get one cache each.
if os.environ.get("PYTEST_XDIST_WORKER"):
    import tempfile

    os.environ["NUMBA_CACHE_DIR"] = os.path.join(
        os.environ.get("NUMBA_CACHE_DIR") or tempfile.gettempdir(), "minitensor-" + os.environ["PYTEST_XDIST_WORKER"]
    )

#: for tests that need a real GPU; never the only test of a feature
requires_gpu = pytest.mark.skipif(not GPU, reason="needs CuPy and a CUDA GPU (cupy.is_available() is False)")
