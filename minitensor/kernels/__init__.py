"""Softmax and log-softmax kernels.

``cpu.py``
    Numba kernels for C-contiguous 2-D NumPy arrays, parallel over rows and
    vectorised within a row (including a float32 ``exp`` written so that it
    can be vectorised).  They are compiled on first use, so importing this
    package does not import numba.

``reference.py``
    The same four functions written with plain array-library calls on any
    NumPy-compatible module (NumPy, CuPy).  They define the semantics, serve
    as the test oracle and are the "naive NumPy" baseline of
    ``bench/softmax.py``.

Import the submodule you need: ``from minitensor.kernels import cpu``.
"""
