"""Kernels: the few loops that NumPy's operators cannot write fast enough.

``cpu.py``
    Softmax and log-softmax: numba kernels for C-contiguous 2-D NumPy arrays,
    parallel over rows and vectorised within a row (including a float32 ``exp``
    written so that it can be vectorised).

``cuda/``
    The GPU's kernels, CUDA C++ (``softmax.cu``: the same four; ``elementwise.cu``: GELU,
    dropout, ReLU and Adam; ``layer_norm.cu``; ``attention.cu``: streamed attention;
    ``multi_tensor.cu``: Adam and clipping over every parameter in one launch), compiled by
    CuPy with NVRTC and launched on CuPy's current stream.

``reference.py``
    The same four written with plain array-library calls on any NumPy-compatible
    module (NumPy, CuPy).  They define the semantics, serve as the test oracle
    and are the "naive NumPy" baseline of ``bench/softmax.py``.

``fused.py``
    The elementwise work of a training step fused into one pass each on the
    CPU: dropout (with counter-based random numbers), ReLU, layer norm and
    Adam's update. Their definitions are the ops' own NumPy code (and the
    textbook update in ``optim/adam.py``); ``backend.fused(name, dtype)`` picks them.

``bfloat16.py``
    float32 to bfloat16 and back on the bits (narrow, widen, and round in place of a float32):
    ``mt.autocast``'s roundings, vectorised, bit for bit ml_dtypes' casts.

``gelu.py``
    The exact GELU without SciPy: in numba on the CPU (float64 through ``math.erfc``,
    float32 through a fitted erfc polynomial and ``exp_f32``, vectorised), CUDA's ``erfc``
    on a GPU, and an array-arithmetic erfc everywhere else.

All are compiled on first use, so ``import minitensor`` imports neither numba nor CuPy.
Import the submodule you need: ``from minitensor.kernels import cpu``.
"""
