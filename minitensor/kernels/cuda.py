"""Numba CUDA kernels for row-wise softmax and log-softmax, on CuPy arrays.

The same four functions as :mod:`minitensor.kernels.cpu`, with the same contract and the
same numerics: C-contiguous 2-D ``(rows, n)`` float32/float64 arrays, an optional ``lens``
(one valid length per row, clipped to ``[0, n]``), the row max subtracted before ``exp``,
and a fully masked (or all ``-inf``) row giving zeros, or ``-inf`` for log-softmax, never
NaN. The algorithm and the backward formulas are derived in ``cpu.py``; this docstring is
about how they map onto a GPU.

One block per row
-----------------
A row is a handful of loops (max; exp and sum; scale), and rows are independent, so block
``b`` of the grid takes row ``b`` and its ``threads_per_block`` threads stride over the
row's columns: thread ``t`` handles columns ``t, t + T, t + 2T, ...``. Each loop that
*produces* one number per row (the max, the sum of exponentials, the backward's dot
product) becomes a block reduction:

1. every thread reduces its own columns to one partial value (``-inf`` or 0 if it has
   none, the identities of max and sum);
2. the partials go into a shared-memory array with one slot per thread;
3. a tree: in step ``k`` the first ``T / 2**k`` threads combine slot ``t`` with slot
   ``t + T / 2**k``, a ``cuda.syncthreads()`` between steps, until slot 0 holds the result
   (``log2 T`` steps, which is why ``T`` must be a power of two);
4. every thread reads slot 0, and one more barrier keeps the next reduction from
   overwriting it before everyone has.

Everything else is elementwise: a thread rescales the very entries it wrote, so no barrier
is needed between writing and scaling. The test "is this row empty?" (max == -inf) has the
same answer in every thread of a block, so the barriers inside the branch are met by all
of them. With more rows than ``max_blocks`` the grid strides: block ``b`` also takes rows
``b + grid, b + 2 grid, ...``. A grid of one block per row is small for few rows -- numba
warns about every launch under 128 blocks, and that warning is silenced -- but the GPU
never idles on a large batch of attention rows.

Shared arrays need their size and dtype when the kernel is compiled, so
:func:`_compile` builds the kernels per ``(dtype, threads_per_block)`` and caches them;
``cache=True`` also keeps the machine code on disk for the next process. Sums accumulate
in the input's dtype, as on the CPU; fastmath stays off, since it would let the compiler
assume away the ``-inf`` tests that implement masking.

Which stream, and no host in between
------------------------------------
CuPy queues its work on its *current stream*; a kernel on another stream could start
before the CuPy operation that computes its input has finished. The CuPy backend passes
``stream=lambda: numba.cuda.external_stream(cupy.cuda.get_current_stream().ptr)``, so
each launch joins CuPy's queue and the stream's order alone guarantees that the kernel
reads finished inputs and that the CuPy code after it reads a finished output. The arrays
go to the kernel as they are, through the CUDA array interface: no copy, no trip through
the host. By default numba *synchronizes* the stream of every array it imports (the host
waits for the GPU, on every launch); with a stream given, the caller promises that the
arrays were produced on it, so they are imported with ``sync=False`` and the launch stays
asynchronous.

Testing without a GPU
---------------------
With ``NUMBA_ENABLE_CUDASIM=1`` (set by ``tests/gpu.py`` where there is no GPU),
``numba.cuda`` is numba's CUDA simulator: it runs every CUDA thread of a block as a Python
thread, with real shared arrays and barriers, on NumPy arrays. ``CudaKernels(numpy)`` then
runs these very kernels (``tests/test_cuda_kernels.py``). The simulator is slow -- a block
of 128 threads is 128 Python threads -- so the default block there is 32 threads, and the
tests use small arrays. It has no ``external_stream``; pass no stream, or a simulated
``numba.cuda.stream()``. The simulator finds ``cuda`` among a kernel's globals to swap in
its fake module, which is why ``cuda`` here is a module global, imported on first use so
that ``import minitensor`` never imports numba.
"""

import functools
import math
import warnings

import numpy as np

#: numba.cuda, imported by :func:`_import_numba_cuda` on first use (see the docstring)
cuda = None

#: threads per block on a GPU: 4 warps, enough to stride over rows of a few hundred keys
THREADS_PER_BLOCK = 128
#: threads per block under the simulator, where every thread is a Python thread
SIMULATOR_THREADS_PER_BLOCK = 32
#: more blocks than this and the grid strides over the rows
MAX_BLOCKS = 65535


def _import_numba_cuda():
    global cuda
    if cuda is None:
        from numba import cuda as numba_cuda  # lazy: numba.cuda loads the CUDA toolkit

        cuda = numba_cuda
    return cuda


@functools.cache
def _compile(dtype, threads):
    """The six kernels for arrays of ``dtype`` launched with ``threads`` threads per block.

    Returns a dict: ``softmax_forward(x, y)``, ``masked_softmax_forward(x, lens, y)``, the
    same two for ``log_softmax``, ``softmax_backward(y, g, dx)`` and
    ``log_softmax_backward(y, g, dx)``. Each writes its last argument.
    """
    import numba  # lazy: import minitensor must not import numba

    scalar = numba.from_dtype(dtype)
    # Constants of the input's own type, as in cpu.py: a bare 0.0 would be float64.
    zero, one, ninf = dtype.type(0), dtype.type(1), dtype.type(-np.inf)

    @cuda.jit(device=True)
    def block_max(shared, value):
        """The max of ``value`` over the threads of the block (NaN wins, as in cpu.py)."""
        tid = cuda.threadIdx.x
        shared[tid] = value
        cuda.syncthreads()
        half = threads // 2
        while half > 0:
            if tid < half:
                other = shared[tid + half]
                if other > shared[tid] or other != other:
                    shared[tid] = other
            cuda.syncthreads()
            half //= 2
        result = shared[0]
        cuda.syncthreads()  # all have read slot 0 before the next reduction writes it
        return result

    @cuda.jit(device=True)
    def block_sum(shared, value):
        """The sum of ``value`` over the threads of the block."""
        tid = cuda.threadIdx.x
        shared[tid] = value
        cuda.syncthreads()
        half = threads // 2
        while half > 0:
            if tid < half:
                shared[tid] += shared[tid + half]
            cuda.syncthreads()
            half //= 2
        result = shared[0]
        cuda.syncthreads()
        return result

    @cuda.jit(device=True)
    def row_max(x, row, length, shared):
        """``max(x[row, :length])``: ``-inf`` for an empty prefix, NaN if any is NaN."""
        m = ninf
        for j in range(cuda.threadIdx.x, length, threads):
            v = x[row, j]
            if v > m or v != v:
                m = v
        return block_max(shared, m)

    @cuda.jit(device=True)
    def fill(out, row, start, value):
        """``out[row, start:] = value``."""
        for j in range(start + cuda.threadIdx.x, out.shape[1], threads):
            out[row, j] = value

    @cuda.jit(device=True)
    def softmax_row(x, y, row, length, shared):
        m = row_max(x, row, length, shared)
        if m == ninf:  # empty distribution; the same branch in every thread of the block
            fill(y, row, 0, zero)
            return
        partial = zero
        for j in range(cuda.threadIdx.x, length, threads):
            e = math.exp(x[row, j] - m)
            y[row, j] = e
            partial += e
        scale = one / block_sum(shared, partial)  # the sum is >= 1: the max gives e^0
        for j in range(cuda.threadIdx.x, length, threads):
            y[row, j] *= scale
        fill(y, row, length, zero)

    @cuda.jit(device=True)
    def log_softmax_row(x, y, row, length, shared):
        m = row_max(x, row, length, shared)
        if m == ninf:  # empty distribution: log 0
            fill(y, row, 0, ninf)
            return
        partial = zero
        for j in range(cuda.threadIdx.x, length, threads):
            partial += math.exp(x[row, j] - m)
        log_total = math.log(block_sum(shared, partial))
        for j in range(cuda.threadIdx.x, length, threads):
            y[row, j] = (x[row, j] - m) - log_total  # in this order, see cpu._subtract_twice
        fill(y, row, length, ninf)

    # The kernels: pick the rows of this block and their valid lengths.

    @cuda.jit(cache=True)
    def softmax_forward(x, y):
        shared = cuda.shared.array(threads, scalar)
        for row in range(cuda.blockIdx.x, x.shape[0], cuda.gridDim.x):
            softmax_row(x, y, row, x.shape[1], shared)

    @cuda.jit(cache=True)
    def masked_softmax_forward(x, lens, y):
        shared = cuda.shared.array(threads, scalar)
        for row in range(cuda.blockIdx.x, x.shape[0], cuda.gridDim.x):
            softmax_row(x, y, row, min(max(lens[row], 0), x.shape[1]), shared)

    @cuda.jit(cache=True)
    def log_softmax_forward(x, y):
        shared = cuda.shared.array(threads, scalar)
        for row in range(cuda.blockIdx.x, x.shape[0], cuda.gridDim.x):
            log_softmax_row(x, y, row, x.shape[1], shared)

    @cuda.jit(cache=True)
    def masked_log_softmax_forward(x, lens, y):
        shared = cuda.shared.array(threads, scalar)
        for row in range(cuda.blockIdx.x, x.shape[0], cuda.gridDim.x):
            log_softmax_row(x, y, row, min(max(lens[row], 0), x.shape[1]), shared)

    @cuda.jit(cache=True)
    def softmax_backward(y, g, dx):
        """``dx = y * (g - sum_j g_j y_j)`` per row; masked entries have y = 0."""
        shared = cuda.shared.array(threads, scalar)
        for row in range(cuda.blockIdx.x, y.shape[0], cuda.gridDim.x):
            partial = zero
            for j in range(cuda.threadIdx.x, y.shape[1], threads):
                partial += g[row, j] * y[row, j]
            weighted = block_sum(shared, partial)
            for j in range(cuda.threadIdx.x, y.shape[1], threads):
                dx[row, j] = y[row, j] * (g[row, j] - weighted)

    @cuda.jit(cache=True)
    def log_softmax_backward(y, g, dx):
        """``dx_j = g_j - exp(y_j) * sum_{k: y_k finite} g_k``; 0 where ``y_j = -inf``."""
        shared = cuda.shared.array(threads, scalar)
        for row in range(cuda.blockIdx.x, y.shape[0], cuda.gridDim.x):
            partial = zero
            for j in range(cuda.threadIdx.x, y.shape[1], threads):
                if y[row, j] != ninf:
                    partial += g[row, j]
            total = block_sum(shared, partial)
            for j in range(cuda.threadIdx.x, y.shape[1], threads):
                if y[row, j] != ninf:
                    dx[row, j] = g[row, j] - math.exp(y[row, j]) * total
                else:
                    dx[row, j] = zero

    return dict(
        softmax_forward=softmax_forward,
        masked_softmax_forward=masked_softmax_forward,
        log_softmax_forward=log_softmax_forward,
        masked_log_softmax_forward=masked_log_softmax_forward,
        softmax_backward=softmax_backward,
        log_softmax_backward=log_softmax_backward,
    )


def _check_rows(x, what="x"):
    if x.ndim != 2:
        raise ValueError(f"{what} must be a 2-D (rows, n) array, got shape {tuple(x.shape)}")


class CudaKernels:
    """The four kernels of one array library on the GPU.

    ``xp``: the array module that allocates the outputs (``cupy``; ``numpy`` under the
    simulator). ``stream``: a zero-argument callable returning the numba stream to launch
    on (called at every launch, so it follows CuPy's current stream), or None for the
    default stream. ``threads_per_block``: a power of two up to 1024; None means 128 on a
    GPU and 32 under the simulator. ``max_blocks``: the largest grid; more rows than this
    and each block handles several.
    """

    def __init__(self, xp, stream=None, threads_per_block=None, max_blocks=MAX_BLOCKS):
        if threads_per_block is not None:
            threads = int(threads_per_block)
            if not 1 <= threads <= 1024 or threads & (threads - 1):  # the tree halves T each step
                raise ValueError(f"threads_per_block must be a power of two in [1, 1024], got {threads_per_block}")
        if max_blocks < 1:
            raise ValueError(f"max_blocks must be at least 1, got {max_blocks}")
        self.xp = xp
        self.stream = stream
        self.threads_per_block = threads_per_block
        self.max_blocks = int(max_blocks)

    def __repr__(self):
        return f"CudaKernels({self.xp.__name__}, threads_per_block={self.threads_per_block})"

    # -- the contract of kernels/cpu.py ---------------------------------------------------
    def softmax_forward(self, x, lens=None):
        """Row-wise softmax of ``x[:, :L]`` with ``L = clip(lens[r], 0, n)``; 0 after it.

        A row with ``L == 0`` or only ``-inf`` valid entries gives all zeros.
        """
        return self._forward("softmax_forward", x, lens)

    def softmax_backward(self, y, g):
        """Gradient of softmax: ``dx = y * (g - sum_j g_j y_j)`` per row."""
        return self._backward("softmax_backward", y, g)

    def log_softmax_forward(self, x, lens=None):
        """Row-wise log-softmax of ``x[:, :L]``; ``-inf`` after it and for empty rows."""
        return self._forward("log_softmax_forward", x, lens)

    def log_softmax_backward(self, y, g):
        """Gradient of log-softmax: ``dx_j = g_j - exp(y_j) * sum_k g_k`` over finite ``y``."""
        return self._backward("log_softmax_backward", y, g)

    # -- launching ----------------------------------------------------------------------
    def _forward(self, name, x, lens):
        _check_rows(x)
        if lens is not None:
            lens = self.xp.asarray(lens)
            if lens.ndim != 1 or lens.shape[0] != x.shape[0]:
                raise ValueError("lens must have one entry per row")
            if lens.dtype.kind not in "iu":
                raise TypeError(f"lens must hold integers, got {lens.dtype}")
            if lens.dtype.kind == "u":  # max(lens, 0) of an unsigned and a signed is a float
                lens = lens.astype(np.int64)
        y = self.xp.empty_like(x)
        if x.size:
            kernels = self._kernels(x.dtype)
            if lens is None:
                self._launch(kernels[name], x.shape[0], x, y)
            else:
                self._launch(kernels["masked_" + name], x.shape[0], x, lens, y)
        return y

    def _backward(self, name, y, g):
        _check_rows(y, "y")
        if y.shape != g.shape:
            raise ValueError("y and g must have the same shape")
        dx = self.xp.empty_like(y)
        if y.size:
            self._launch(self._kernels(y.dtype)[name], y.shape[0], y, g, dx)
        return dx

    def _threads(self):
        if self.threads_per_block is not None:
            return int(self.threads_per_block)
        from numba import config  # lazy: numba loads on first use

        return SIMULATOR_THREADS_PER_BLOCK if config.ENABLE_CUDASIM else THREADS_PER_BLOCK

    def _kernels(self, dtype):
        dtype = np.dtype(dtype)
        if dtype not in (np.float32, np.float64):
            raise TypeError(f"the CUDA softmax kernels take float32 or float64 arrays, got {dtype}")
        _import_numba_cuda()
        return _compile(dtype, self._threads())

    def _launch(self, kernel, rows, *arrays):
        if self.stream is None:
            stream = 0
        else:
            stream = self.stream()
            # Same stream as the arrays' producer: stream order suffices, skip numba's sync.
            arrays = [
                cuda.as_cuda_array(a, sync=False) if hasattr(a, "__cuda_array_interface__") else a for a in arrays
            ]
        with warnings.catch_warnings():
            # "Grid size N will likely result in GPU under-utilization": few rows, few blocks.
            # Matched by its text: numba and numba-cuda each raise it with their own class.
            warnings.filterwarnings("ignore", message=r"Grid size \d+ will likely result in GPU under-utilization")
            configured = kernel[min(rows, self.max_blocks), self._threads(), stream]
        configured(*arrays)
