"""The GPU's kernels: CUDA C++ sources compiled by CuPy, launched on CuPy's current stream.

``softmax.cu``
    Row-wise softmax and log-softmax, forward and backward: the contract and the numerics of
    :mod:`minitensor.kernels.cpu` (C-contiguous 2-D ``(rows, n)`` float32/float64 arrays, an
    optional ``lens`` of valid lengths, never NaN for a fully masked row), one warp per row.
``elementwise.cu``
    The exact GELU and its derivative (:mod:`minitensor.kernels.gelu`'s definition), dropout
    with the CPU's counter-based random numbers (:mod:`minitensor.kernels.fused`), so a mask
    drawn with the same seed is the same on both devices, ReLU, Adam's update, and float32 to
    and from bfloat16 (:mod:`minitensor.kernels.bfloat16`'s three, bit for bit).
``layer_norm.cu``
    Layer norm forward and backward: ``kernels/fused.py``'s two, a warp per row.
``multi_tensor.cu``
    One launch over a whole list of tensors (PyTorch's ``multi_tensor_apply``): Adam's update of
    every parameter of a group, and gradient clipping's sum of squares and rescaling, where a
    kernel per parameter would cost a step hundreds of launches (see ``PointerTables``).
``attention.cu``
    Streamed attention (``ops/flash_attention.py``'s algorithm) forward and backward, with
    causal and valid-length masks and grouped heads: two or four threads per query (or key) row
    (``attention_split``), tiles in shared memory.

The ones that stand for a CPU fused kernel take its signature, so an op calls either through
``backend.fused(name, dtype)`` without knowing which device it runs on.

Each file says how its kernels map onto the GPU. This module compiles a file the first time one
of its kernels is needed, attention.cu one row size and dtype at a time (``source``), with
``cupy.RawModule``: NVRTC, the CUDA runtime compiler that CuPy itself uses for its operators,
with CuPy's on-disk cache, so a later process loads it in milliseconds. It launches kernels with
explicit argument types.

Why CUDA C++ through CuPy, and not numba.cuda
---------------------------------------------
The first GPU kernels were numba CUDA kernels. Measured on an H200 (``bench/gpu_check.py``,
figures in bench/README.md) they were slower than the naive five-operator CuPy softmax and many
times ``torch.softmax``: each numba launch spends tens of microseconds in Python (typing the
arguments, wrapping each CuPy array, bridging to CuPy's stream) on a kernel that runs for a
few. A ``cupy.RawKernel`` launch is a C call that packs the arguments and joins CuPy's current
stream itself. And numba-cuda, now in maintenance mode, stopped importing under NumPy 2.5 (it
registers ``np.row_stack``, which 2.5 removed): a GPU path resting on it broke for every user
who upgraded NumPy. CuPy is needed for ``device="cuda"`` anyway, so the GPU path now rests on
CuPy alone. The CPU kernels stay numba.

Everything runs on CuPy's current stream, in order with the CuPy operators around it: a kernel
reads finished inputs and the code after it reads a finished output, and the host never waits.

Testing without a GPU
---------------------
``tests/cuda_emulator`` compiles these same sources with the host's C++ compiler against a
small header in which every CUDA thread is a fiber of its own (a ``std::thread`` under the race
check) and ``__syncthreads`` and the warp shuffles are real barriers;
``CudaKernels(numpy, load_module=EmulatedModule)`` then runs the kernels a GPU runs, on NumPy
arrays, and ``tests/test_cuda_kernels.py`` compares them with ``reference.py`` and with the CPU
kernels.
"""

import math
import pathlib
import re

import numpy as np

from ... import dtypes
from ...errors import DeviceError

SOURCE_DIR = pathlib.Path(__file__).parent
#: threads per block of the row kernels: 4 warps, so 4 rows per block
ROW_THREADS = 128
#: threads per block of the elementwise kernels
ELEMENTWISE_THREADS = 256
#: the largest grid launched; more work than that and the kernels' loops stride over it
MAX_BLOCKS = 65535
#: the most blocks a CUDA grid's x dimension takes
MAX_GRID_X = 2**31 - 1
#: elements per chunk of the multi-tensor kernels: a block's share of the concatenated tensors at a
#: time (64 per thread of a 256-thread block), small enough that a 10M-parameter model gives the
#: GPU hundreds of blocks, large enough that each block's search for its first tensor is paid once
#: per 16K elements
MULTI_TENSOR_CHUNK = 16384
#: the most blocks (partial sums) of the multi-tensor sum of squares' first launch: few enough for
#: one block to add them up in the second
SUM_BLOCKS = 512
#: the seed argument that tells a kernel to read its seed at the address that follows it
#: (random.cuh's SEED_ON_DEVICE: a captured graph's seeds, which change at every replay)
SEED_ON_DEVICE = 2**64 - 1
#: device tables of pointers that the multi-tensor kernels keep (see ``PointerTables``)
POINTER_TABLES = 16
#: rows per block of the attention kernels (attention.cu's QUERY_ROWS), ``attention_split`` threads each,
#: when each row's keys are not split (``QUERY_ROWS / splits`` rows when they are)
ATTENTION_ROWS = 64
#: keys per shared tile of the attention kernels' forward and dQ (attention.cu's KEY_TILE)
ATTENTION_KEY_TILE = 32
#: the most walkers among which the attention kernels split a row's keys (1, 2 or 4; attention.cu)
ATTENTION_MAX_SPLITS = 4
#: threads per multiprocessor that the attention kernels' grid should reach before they split the
#: keys of a row: 8 warps (the dQ and dK/dV kernels' registers let 8 stay on a multiprocessor at
#: once, the forward's 16), enough for one warp to compute while others wait on memory
ATTENTION_THREADS_PER_MULTIPROCESSOR = 256


_DTYPES = ("float32", "float64")
_C_TYPES = {"float32": "float", "float64": "double"}
#: the head sizes D of the attention kernels, per dtype: a head of size d takes the smallest D >= d
#: (float64 stops at 64: two 64-wide tiles of doubles fill the 32 KiB of shared memory it uses)
ATTENTION_ROW_SIZES = {"float32": (32, 64, 128), "float64": (32, 64)}
#: every kernel of each source file, by its C name
KERNELS = {
    "softmax": [
        f"{name}_{dtype}"
        for name in (
            "softmax_forward",
            "masked_softmax_forward",
            "log_softmax_forward",
            "masked_log_softmax_forward",
            "softmax_backward",
            "log_softmax_backward",
        )
        for dtype in _DTYPES
    ],
    "elementwise": [
        f"{name}_{dtype}"
        for name in ("gelu_forward", "gelu_backward", "dropout", "relu_forward", "relu_backward", "adam_update")
        for dtype in _DTYPES
    ]
    + ["draw_seeds", "bfloat16_narrow", "bfloat16_round", "bfloat16_widen"],
    "multi_tensor": [
        f"{name}_{dtype}"
        for name in ("adam_update_multi", "sum_of_squares_partial", "sum_of_squares_finish", "scale_multi")
        for dtype in _DTYPES
    ],
    "layer_norm": [
        f"{name}_{dtype}"
        for name in (
            "layer_norm_forward",
            "layer_norm_backward_rows",
            "layer_norm_backward_columns",
            "layer_norm_backward_finish",
        )
        for dtype in _DTYPES
    ],
    "attention": [
        f"attention_{part}_d{size}_{dtype}"
        for part in ("forward", "backward_dq", "backward_dkv")
        for dtype, sizes in ATTENTION_ROW_SIZES.items()
        for size in sizes
    ]
    + [f"attention_bias_grad_{dtype}" for dtype in _DTYPES],
}


def attention_split(dtype, size):
    """Threads per query (or key) row of the attention kernels for rows of ``size`` numbers of
    ``dtype`` (attention.cu's ``Split``): each thread holds at most 128 bytes of a row, so two
    threads a row, four for 128 floats or 64 doubles."""
    return 4 if size * np.dtype(dtype).itemsize > 256 else 2


def source(name, variant=None):
    """The CUDA C++ text of the source ``name`` (a key of ``KERNELS``: ``"softmax"``, ...), with
    each ``#include "file"`` of this folder pasted in: NVRTC (and the tests' emulator) compile
    one text, and has no path to look for the file in (nvcc, given the file, finds it beside).

    ``variant``, for ``"attention"``: ``(D, dtype)``, the text with only the kernels of row size D
    and that dtype instantiated (``ATTENTION_KERNELS(...)`` lines; D None: none of them, the bias
    gradient's kernels alone). NVRTC takes some 4 s over all five sizes and dtypes and about 1 s
    over one, and a call needs one: the launcher compiles each the first time it is needed."""
    text = (SOURCE_DIR / f"{name}.cu").read_text()
    text = re.sub(r'^#include "([\w.]+)"$', lambda m: (SOURCE_DIR / m.group(1)).read_text(), text, flags=re.M)
    if variant is not None:
        size, dtype = variant
        wanted = f"ATTENTION_KERNELS({_C_TYPES[dtype]}, {size}, {dtype})"
        text = re.sub(r"^ATTENTION_KERNELS\(.*\)$", lambda m: m[0] if m[0] == wanted else "", text, flags=re.M)
    return text


def _module_of(module, kernel):
    """(source, variant) that holds ``kernel``: an attention kernel's own size and dtype (its name
    ends in _d<D>_<dtype>, or _<dtype> for the bias gradient's), the whole file otherwise."""
    if module != "attention":
        return module, None
    sized = re.search(r"_d(\d+)_(float\d+)$", kernel)
    return module, (int(sized[1]), sized[2]) if sized else (None, kernel.rsplit("_", 1)[1])


def _attention_grid(heads, rows, splits=1):
    """Blocks of the attention kernels: one per (batch, head, tile of ``ATTENTION_ROWS // splits``
    rows), which a grid's x dimension must hold (the kernels do not stride)."""
    blocks = heads * -(-rows // (ATTENTION_ROWS // splits))
    if blocks > MAX_GRID_X:
        raise ValueError(
            f"attention: {heads} batch x heads x {rows} rows need {blocks} blocks, more than a CUDA grid holds "
            f"({MAX_GRID_X}); split the batch"
        )
    return blocks


def device_address(array):
    """The address of ``array``'s first element in its memory: ``data.ptr`` for a CuPy array,
    ``ctypes.data`` for a NumPy one (the emulator's "device" is host memory)."""
    ptr = getattr(array.data, "ptr", None)
    return int(array.ctypes.data if ptr is None else ptr)


class PointerTables:
    """The tables through which a multi-tensor kernel finds its tensors (``multi_tensor.cu``):
    ``(addresses, offsets)``, device arrays of the tensors' addresses (uint64, the lists one after
    another) and of their running sizes (int64, 0 first, so ``offsets[t]`` is where tensor t starts
    in the concatenation of the first list).

    A table is built on the host from the tensors' addresses and uploaded, both parts in one
    array: an upload, not a read,
    so the host does not wait (CuPy stages a host array in pinned memory and copies it
    asynchronously on the current stream, in order with the kernel that reads it). Each upload
    still costs a call, so the tables are kept, keyed by the addresses and sizes themselves: a
    table says nothing but those, so a kept table with the same key is right even if the tensors
    it was made for are gone and others took their memory. The parameters and their moments
    never move; the gradients are new arrays at every backward pass, but CuPy's memory pool hands
    a loop that allocates the same sizes in the same order the same blocks, so after the first
    steps the gradients' table is found here too and a step uploads nothing. (A persistent flat
    gradient buffer, apex's way, would guarantee it, at the price of the autograd engine writing
    every gradient into it.) ``size`` tables are kept, the least recently used dropped first.

    ``xp``: the array module (``cupy``; ``numpy`` under the emulator); ``address``: array -> int.
    """

    def __init__(self, xp, address=device_address, size=POINTER_TABLES):
        self.xp, self.address, self.size = xp, address, int(size)
        self._tables = {}

    def table(self, *lists):
        addresses = tuple(self.address(a) for arrays in lists for a in arrays)
        sizes = tuple(int(a.size) for a in lists[0])
        key = (addresses, sizes)
        table = self._tables.pop(key, None)
        if table is None:
            offsets = np.concatenate(([0], np.cumsum(sizes, dtype=np.int64)))
            # one upload: the offsets follow the addresses, and the kernel gets two views of it
            both = self.xp.asarray(np.concatenate((np.array(addresses, np.uint64), offsets.astype(np.uint64))))
            table = (both[: len(addresses)], both[len(addresses) :].view(np.int64))
            if len(self._tables) >= self.size:
                self._tables.pop(next(iter(self._tables)))
        self._tables[key] = table  # last: the most recently used
        return table


#: the options this package passes to NVRTC through ``cupy.RawModule`` (CuPy adds its own and the
#: GPU's ``-arch``); ``tests/test_cuda_kernels.py`` compiles every source with NVRTC and these
NVRTC_OPTIONS = ("--std=c++17",)


def _cupy_module(xp):
    def load(code):
        return xp.RawModule(code=code, options=NVRTC_OPTIONS)

    return load


class CudaKernels:
    """The kernels of this package on one array library.

    ``xp``: the array module that allocates outputs (``cupy``; ``numpy`` under the emulator).
    ``load_module``: ``code -> module`` whose ``get_function(name)`` returns a kernel called as
    ``kernel(grid, block, args)`` (default: ``cupy.RawModule``). ``row_threads``: threads per
    block of the row kernels, a multiple of 32 up to 1024 (each warp takes a row);
    ``elementwise_threads``: of the elementwise ones. ``max_blocks``: the largest grid.
    ``chunk``: elements per chunk of the multi-tensor kernels. ``attention_splits``: the walkers
    among which the attention kernels split each row's keys, 1, 2 or 4, or None to let the size
    of the grid and of the GPU decide (:meth:`attention_splits`); ``multiprocessors``: the GPU's,
    or None to ask the current device (one where the array library has no ``cuda``: the emulator
    runs one block at a time).
    """

    def __init__(
        self,
        xp,
        load_module=None,
        row_threads=ROW_THREADS,
        elementwise_threads=ELEMENTWISE_THREADS,
        max_blocks=MAX_BLOCKS,
        chunk=MULTI_TENSOR_CHUNK,
        attention_splits=None,
        multiprocessors=None,
    ):
        if not (32 <= row_threads <= 1024 and row_threads % 32 == 0):
            raise ValueError(f"row_threads must be a multiple of 32 in [32, 1024], got {row_threads}")
        if not 1 <= elementwise_threads <= 1024:
            raise ValueError(f"elementwise_threads must be in [1, 1024], got {elementwise_threads}")
        if max_blocks < 1:
            raise ValueError(f"max_blocks must be at least 1, got {max_blocks}")
        if chunk < 1:
            raise ValueError(f"chunk must be at least 1, got {chunk}")
        if attention_splits not in (None, 1, 2, 4):
            raise ValueError(f"attention_splits must be None, 1, 2 or 4, got {attention_splits!r}")
        if multiprocessors is not None and multiprocessors < 1:
            raise ValueError(f"multiprocessors must be at least 1, got {multiprocessors}")
        self.xp = xp
        self.load_module = load_module or _cupy_module(xp)
        self.row_threads, self.elementwise_threads = int(row_threads), int(elementwise_threads)
        self.max_blocks, self.chunk = int(max_blocks), int(chunk)
        self.fixed_splits, self.multiprocessors = attention_splits, multiprocessors
        self.pointer_tables = PointerTables(xp)
        self._modules, self._functions = {}, {}
        self._no_lens = self._no_seed = None

    def __repr__(self):
        return f"CudaKernels({self.xp.__name__}, row_threads={self.row_threads})"

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

    # -- elementwise ------------------------------------------------------------------------
    def gelu_forward(self, x):
        """``x * Phi(x)`` elementwise (float32 or float64, any shape)."""
        return self._map("gelu_forward", x)

    def gelu_backward(self, x, g):
        """``g * (Phi(x) + x phi(x))`` elementwise."""
        return self._map("gelu_backward", x, g)

    def bfloat16_narrow(self, x):
        """float32 ``x`` rounded to bfloat16 (``kernels/bfloat16.py``, bit for bit)."""
        return self._bits("bfloat16_narrow", x, np.float32, np.uint32, np.uint16, dtypes.bfloat16)

    def bfloat16_widen(self, x):
        """bfloat16 ``x`` as float32, exactly."""
        return self._bits("bfloat16_widen", x, dtypes.bfloat16, np.uint16, np.uint32, np.float32)

    def bfloat16_round(self, x):
        """float32 ``x``'s values rounded to bfloat16, kept in float32: one pass."""
        return self._bits("bfloat16_round", x, np.float32, np.uint32, np.uint32, np.float32)

    def dropout(self, x, seed, threshold, scale):
        """``x_i * scale`` where ``bits(seed, i) >= threshold``, else 0: ``fused.dropout_forward``
        on the GPU, element for element the same mask. ``seed``: a number, or a 0-d uint64 array
        on the device that holds it (a captured graph's, rewritten before each replay)."""
        x = self._floats(x, "dropout")
        y = self.xp.empty_like(x)
        self._elementwise(
            "dropout", x.size, x, y, np.int64(x.size), *self._seed(seed), np.uint64(threshold), x.dtype.type(scale)
        )
        return y

    def draw_seeds(self, seeds, key, first):
        """``seeds[i] = splitmix64(key ^ (first + i)) >> 2`` for each i, in place (``seeds``: a
        uint64 array on the device): with ``key = splitmix64(seed)`` these are draws ``first``,
        ``first + 1``, ... of the CuPy backend's ``draw_seed``, made where a captured graph reads
        them, without an upload."""
        if seeds.size:
            blocks = min(-(-seeds.size // self.elementwise_threads), self.max_blocks)
            self._function("elementwise", "draw_seeds")(
                (blocks,), (self.elementwise_threads,), (seeds, np.int64(seeds.size), np.uint64(key), np.uint64(first))
            )

    def _seed(self, seed):
        """The (seed, seed_at) arguments of a kernel with dropout: a seed drawn on the host by
        value (and a word the kernel never reads), a seed on the device (a 0-d uint64 array) by
        address, with ``SEED_ON_DEVICE`` in its place."""
        if isinstance(seed, (int, np.integer)):
            if self._no_seed is None:
                self._no_seed = self.xp.zeros(1, np.uint64)
            return np.uint64(seed), self._no_seed
        if seed.dtype != np.uint64 or seed.size != 1:
            raise TypeError(f"a seed on the device must be one uint64, got {seed.dtype} of shape {seed.shape}")
        return np.uint64(SEED_ON_DEVICE), seed

    # -- the fused kernels of kernels/fused.py, with their signatures ------------------------------
    def relu_forward(self, x):
        """max(x, 0) in one pass."""
        return self._map("relu_forward", x)

    def relu_backward(self, y, grad):
        """grad * (y > 0) in one pass."""
        return self._map("relu_backward", y, grad)

    def adam_update(self, param, grad, exp_avg, exp_avg_sq, step_size, beta1, beta2, eps, weight_decay, bias_sqrt2):
        """Adam's update of ``param`` (and its moments ``exp_avg``, ``exp_avg_sq``) in place, one
        pass: ``fused.adam_update``'s rule and arguments (betas as (beta, 1 - beta) pairs)."""
        if not all(a.flags.c_contiguous for a in (param, exp_avg, exp_avg_sq)):
            raise ValueError("adam_update: the parameter and its moments must be C-contiguous (updated in place)")
        param = self._floats(param, "adam_update")
        f = param.dtype.type
        grad = self.xp.ascontiguousarray(grad, dtype=param.dtype)
        scalars = (step_size, *beta1, *beta2, eps, weight_decay, bias_sqrt2)
        args = (param, grad, exp_avg, exp_avg_sq, np.int64(param.size), *(f(x) for x in scalars))
        self._elementwise("adam_update", param.size, *args)

    # -- multi-tensor kernels (multi_tensor.cu): one launch for a whole list -----------------------
    def adam_update_multi(
        self, params, grads, exp_avgs, exp_avg_sqs, step_size, beta1, beta2, eps, weight_decay, bias_sqrt2, decay=1.0
    ):
        """:meth:`adam_update` of every parameter in ``params`` (with its gradient and moments from
        the other lists) in one launch, element for element the same bits, after AdamW's decoupled
        decay ``w <- decay * w`` (1: none, Adam). The parameters share the scalars, so one step
        count t; all lists one dtype (float32 or float64), the parameters and moments C-contiguous.
        A step of a 51-parameter model launches 1 kernel here, 51 through :meth:`adam_update`.
        """
        lists = [list(a) for a in (params, grads, exp_avgs, exp_avg_sqs)]
        if len({len(a) for a in lists}) != 1:
            raise ValueError(
                "adam_update_multi: params, grads, exp_avgs and exp_avg_sqs must be lists of one length, got "
                + ", ".join(str(len(a)) for a in lists)
            )
        params, grads, exp_avgs, exp_avg_sqs = lists
        if not params:
            return
        dtype = self._multi_dtype(params, "adam_update_multi")
        for what, arrays in (("exp_avgs", exp_avgs), ("exp_avg_sqs", exp_avg_sqs)):
            if any(a.dtype != dtype or a.size != p.size for a, p in zip(arrays, params)):
                raise ValueError(f"adam_update_multi: each of {what} must have its parameter's dtype and size")
        if not all(a.flags.c_contiguous for a in params + exp_avgs + exp_avg_sqs):
            raise ValueError(
                "adam_update_multi: the parameters and their moments must be C-contiguous (updated in place)"
            )
        grads = [self.xp.ascontiguousarray(g, dtype=dtype) for g in grads]
        if any(g.size != p.size for g, p in zip(grads, params)):
            raise ValueError("adam_update_multi: each gradient must have its parameter's size")
        total = sum(int(p.size) for p in params)
        if total:
            addresses, offsets = self.pointer_tables.table(params, grads, exp_avgs, exp_avg_sqs)
            f = dtype.type
            scalars = (step_size, *beta1, *beta2, eps, weight_decay, bias_sqrt2, decay)
            args = (addresses, offsets, np.int64(len(params)), np.int64(self.chunk), *(f(x) for x in scalars))
            self._function("multi_tensor", f"adam_update_multi_{dtype.name}")(
                (self._chunk_blocks(total),), (self.elementwise_threads,), args
            )

    def l2_norm_multi(self, arrays, max_norm=math.inf):
        """The 2-norm of all ``arrays`` as one vector, ``sqrt(sum of x^2)`` (summed in float64),
        and clipping's factor ``min(1, max_norm / (norm + 1e-6))`` (1 for a non-finite norm):
        ``(norm, factor)``, 0-d arrays of the arrays' dtype, on the device (nothing is read). Two
        launches whatever the number of arrays (a partial sum per block, then one block adds them
        up in a fixed order: the same bits at every run), where a norm per array costs three.
        """
        arrays = [self.xp.ascontiguousarray(a) for a in arrays]
        if not arrays:
            raise ValueError("l2_norm_multi: needs at least one array")
        dtype = self._multi_dtype(arrays, "l2_norm_multi")
        total = sum(int(a.size) for a in arrays)
        blocks = min(self._chunk_blocks(total), SUM_BLOCKS) if total else 0
        partial = self.xp.empty(max(blocks, 1), np.float64)
        norm, factor = self.xp.empty((), dtype), self.xp.empty((), dtype)
        if blocks:
            addresses, offsets = self.pointer_tables.table(arrays)
            self._function("multi_tensor", f"sum_of_squares_partial_{dtype.name}")(
                (blocks,),
                (self.elementwise_threads,),
                (addresses, offsets, np.int64(len(arrays)), np.int64(self.chunk), partial),
            )
        self._function("multi_tensor", f"sum_of_squares_finish_{dtype.name}")(
            (1,), (self.elementwise_threads,), (partial, np.int64(blocks), norm, factor, np.float64(max_norm))
        )
        return norm, factor

    def scale_multi(self, arrays, factor):
        """Every element of every array (C-contiguous, of one dtype) times ``factor``, a one-element
        device array of that dtype (``l2_norm_multi``'s), in place: one launch."""
        arrays = list(arrays)
        if not arrays:
            return
        dtype = self._multi_dtype(arrays, "scale_multi")
        if not all(a.flags.c_contiguous for a in arrays):
            raise ValueError("scale_multi: the arrays must be C-contiguous (scaled in place)")
        if factor.size != 1 or factor.dtype != dtype:
            raise ValueError(
                f"scale_multi: factor must be a one-element {dtype} array, got {factor.dtype} of size {factor.size}"
            )
        total = sum(int(a.size) for a in arrays)
        if total:
            addresses, offsets = self.pointer_tables.table(arrays)
            self._function("multi_tensor", f"scale_multi_{dtype.name}")(
                (self._chunk_blocks(total),),
                (self.elementwise_threads,),
                (
                    addresses,
                    offsets,
                    np.int64(len(arrays)),
                    np.int64(self.chunk),
                    self.xp.ascontiguousarray(factor.reshape(1)),
                ),
            )

    def _multi_dtype(self, arrays, what):
        dtype = arrays[0].dtype
        if dtype not in (np.float32, np.float64) or any(a.dtype != dtype for a in arrays):
            raise TypeError(
                f"the CUDA {what} kernel takes arrays of one dtype, float32 or float64, got "
                + ", ".join(sorted({str(a.dtype) for a in arrays}))
                + " (group the arrays by dtype)"
            )
        return np.dtype(dtype)

    def _chunk_blocks(self, total):
        """Blocks of a multi-tensor launch over ``total`` elements: a chunk each, up to max_blocks."""
        return min(-(-total // self.chunk), self.max_blocks)

    def layer_norm_forward(self, x, weight, bias, eps):
        """Rows of ``x`` (N, D) normalised, scaled and shifted: ``(y, xhat, rstd)``, rstd (N, 1),
        as ``fused.layer_norm_forward`` returns them."""
        x = self._matrix(x, "x", "layer_norm")
        weight, bias = (self.xp.ascontiguousarray(a, dtype=x.dtype) for a in (weight, bias))
        N, D = x.shape
        y, xhat, rstd = self.xp.empty_like(x), self.xp.empty_like(x), self.xp.empty((N, 1), x.dtype)
        if x.size:
            sizes = (np.int64(N), np.int64(D), x.dtype.type(eps))
            self._rows("layer_norm_forward", N, x, weight, bias, y, xhat, rstd, *sizes)
        return y, xhat, rstd

    def layer_norm_backward(self, grad, xhat, rstd, weight):
        """``(dx, dweight, dbias)`` of :meth:`layer_norm_forward` (``fused.layer_norm_backward``)."""
        xhat = self._matrix(xhat, "xhat", "layer_norm")
        grad = self.xp.ascontiguousarray(grad, dtype=xhat.dtype)
        rstd, weight = (self.xp.ascontiguousarray(a, dtype=xhat.dtype) for a in (rstd, weight))
        N, D = xhat.shape
        dx = self.xp.empty_like(xhat)
        chunks = max(1, min(N, 64))  # partial column sums: 64 chunks of rows at most
        # the column kernel writes every partial sum (0 for a chunk without rows): no zeroing launches
        new = self.xp.empty if xhat.size else self.xp.zeros
        partial_w, partial_b = new((chunks, D), xhat.dtype), new((chunks, D), xhat.dtype)
        dweight, dbias = new(D, xhat.dtype), new(D, xhat.dtype)
        if xhat.size:
            self._rows("layer_norm_backward_rows", N, grad, xhat, rstd, weight, dx, np.int64(N), np.int64(D))
            column_blocks = -(-D // self.elementwise_threads)
            dtype = xhat.dtype.name
            self._function("layer_norm", f"layer_norm_backward_columns_{dtype}")(
                (column_blocks * chunks,),
                (self.elementwise_threads,),
                (grad, xhat, partial_w, partial_b, np.int64(N), np.int64(D), np.int64(chunks)),
            )
            self._function("layer_norm", f"layer_norm_backward_finish_{dtype}")(
                (min(column_blocks, self.max_blocks),),
                (self.elementwise_threads,),
                (partial_w, partial_b, dweight, dbias, np.int64(D), np.int64(chunks)),
            )
        return dx, dweight, dbias

    # -- streamed attention (attention.cu) -------------------------------------------------------
    def attention_row_size(self, dtype, d):
        """The kernels' row size D for heads of size ``d`` (the smallest D >= d), or None where
        there is none (d above the largest, or a dtype other than float32/float64)."""
        sizes = ATTENTION_ROW_SIZES.get(np.dtype(dtype).name, ())
        return next((size for size in sizes if size >= d), None)

    def attention_forward(self, q, k, v, lens, causal, scale, table=None, shift=0, window=None, dropout=None):
        """Streamed ``softmax(scale q k^T + bias, masked) v``. q (B, H, Q, d); k, v (B, G, K, d)
        with G dividing H; ``lens`` None or int64 (B, Q) valid lengths; ``causal``: key j visible
        to query i when j <= i + K - Q. ``table``: None or a relative bias (H, Q + K - 1), column
        j - i + Q - 1 the bias of query i and key j (``flash_attention``'s ``relative_bias``);
        ``window``: None, or keys at a distance j - i + ``shift`` (the keys' position offset less
        the queries') beyond it are -inf in ``table``, and skipped. ``dropout``: None, or (seed,
        threshold, scale) for dropout on the weights, weight (b, h, i, j) kept, times scale, where
        bits(seed, ((b H + h) Q + i) K + j) >= threshold (the mask :meth:`dropout` makes of the
        whole weights). Returns the output (B, H, Q, d) and the log-sum-exp of each row (B, H, Q),
        +inf for a row that sees no key (the softmax's, whatever the dropout)."""
        q, k, v = (self.xp.ascontiguousarray(a) for a in (q, k, v))
        B, H, Q, d = q.shape
        size = self._attention_size(q, k, v)
        bias = self._attention_bias(q, k, table, shift, window)
        out, lse = self.xp.empty_like(q), self.xp.empty(q.shape[:-1], q.dtype)
        if q.size and k.shape[2]:
            split = attention_split(q.dtype, size)
            splits = self.attention_splits(B * H * Q, split)
            lens_arg, has_lens = self._attention_lens(lens, B, Q)
            self._function("attention", f"attention_forward_d{size}_{q.dtype.name}")(
                (_attention_grid(B * H, Q, splits),),
                (split * ATTENTION_ROWS,),
                (q, k, v, lens_arg, bias[0], out, lse, *self._attention_shapes(q, k), q.dtype.type(scale))
                + (np.int32(bool(causal)), has_lens, *bias[1:], *self._attention_dropout(dropout, q.dtype))
                + (np.int32(splits),),
            )
        elif q.size:  # no keys at all: every row is empty
            out.fill(0)
            lse.fill(np.inf)
        return out, lse

    def attention_backward(
        self,
        q,
        k,
        v,
        lens,
        causal,
        scale,
        out,
        lse,
        grad,
        table=None,
        shift=0,
        window=None,
        table_grad=False,
        dropout=None,
    ):
        """The gradients (dq, dk, dv) of :meth:`attention_forward` for the output's gradient
        ``grad`` (``dropout``: the forward's, whose mask is made again); ``table_grad``: and the
        bias table's, (dq, dk, dv, dtable), for a learned bias (T5's): each column sums dL/ds
        over its (i, j), the batch included."""
        q, k, v, out, lse, grad = (self.xp.ascontiguousarray(a) for a in (q, k, v, out, lse, grad))
        B, H, Q, d = q.shape
        G, K = k.shape[1], k.shape[2]
        size = self._attention_size(q, k, v)
        bias = self._attention_bias(q, k, table, shift, window)
        # the kernels write every row (zeros where nothing is seen): no zeroing launches
        new = self.xp.empty_like if q.size and K else self.xp.zeros_like
        dq, dk, dv = new(q), new(k), new(v)
        if table_grad and table is None:
            raise ValueError("attention: table_grad=True needs the bias table")
        dtable = (self.xp.empty if q.size and K else self.xp.zeros)(bias[0].shape, q.dtype) if table_grad else None
        if q.size and K:
            delta = self.xp.empty(q.shape[:-1], q.dtype)  # D_i = dO_i . O_i: the dQ kernel writes it, dK/dV reads it
            lens_arg, has_lens = self._attention_lens(lens, B, Q)
            common = (q, k, v, lens_arg, bias[0], lse, grad)
            tail = (*self._attention_shapes(q, k), q.dtype.type(scale), np.int32(bool(causal)), has_lens, *bias[1:])
            tail += self._attention_dropout(dropout, q.dtype)
            dtype, split = q.dtype.name, attention_split(q.dtype, size)
            # each kernel splits the keys (the queries) of its own rows: dK/dV has fewer where G < H
            splits, kv_splits = self.attention_splits(B * H * Q, split), self.attention_splits(B * G * K, split)
            blocks, rows = _attention_grid(B * H, Q, splits), ATTENTION_ROWS // splits
            # the learned bias's gradient: each dQ block's tiles of ds and its partial sums per
            # diagonal (attention.cu's BiasGrad), added up by attention_bias_grad
            scratch = partial = q  # (pointers that table_grad = 0 leaves unread)
            if table_grad:
                scratch = self.xp.empty((blocks, rows * ATTENTION_KEY_TILE), q.dtype)
                partial = self.xp.empty((blocks, K + rows - 1), q.dtype)
            self._function("attention", f"attention_backward_dq_d{size}_{dtype}")(
                (blocks,),
                (split * ATTENTION_ROWS,),
                (*common, out, delta, dq, scratch, partial, *tail, np.int32(bool(table_grad)), np.int32(splits)),
            )
            self._function("attention", f"attention_backward_dkv_d{size}_{dtype}")(
                (_attention_grid(B * G, K, kv_splits),),
                (split * ATTENTION_ROWS,),
                (*common, delta, dk, dv, *tail, np.int32(kv_splits)),
            )
            if table_grad:
                self._function("attention", f"attention_bias_grad_{dtype}")(
                    (min(-(-dtable.size // self.elementwise_threads), self.max_blocks),),
                    (self.elementwise_threads,),
                    (partial, dtable, np.int64(B), np.int64(H), np.int64(Q), np.int64(K), np.int64(rows)),
                )
        return (dq, dk, dv, dtable) if table_grad else (dq, dk, dv)

    def attention_splits(self, rows, split):
        """Walkers per row (1, 2 or 4) for a kernel over ``rows`` rows of ``split`` threads each:
        the fewest that give each of the GPU's multiprocessors
        ``ATTENTION_THREADS_PER_MULTIPROCESSOR`` threads (one sequence of 1,024 tokens and 8
        heads, 16,384 threads, on a GPU of 132 multiprocessors: 4), unless the constructor
        fixed them."""
        if self.fixed_splits is not None:
            return self.fixed_splits
        wanted = self._multiprocessor_count() * ATTENTION_THREADS_PER_MULTIPROCESSOR
        splits = 1
        while splits < ATTENTION_MAX_SPLITS and rows * split * splits < wanted:
            splits *= 2
        return splits

    def _multiprocessor_count(self):
        if self.multiprocessors is None:
            cuda = getattr(self.xp, "cuda", None)
            if cuda is None:  # the emulator: one block at a time
                self.multiprocessors = 1
            else:  # a host query (no wait for the GPU), made once
                properties = cuda.runtime.getDeviceProperties(cuda.runtime.getDevice())
                self.multiprocessors = int(properties["multiProcessorCount"])
        return self.multiprocessors

    def _attention_size(self, q, k, v):
        B, H, Q, d = q.shape
        if k.ndim != 4 or k.shape[0] != B or k.shape[3] != d or v.shape != k.shape or H % max(k.shape[1], 1):
            raise ValueError(
                f"attention: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} do not fit (B, H, Q, d), "
                "(B, G, K, d), (B, G, K, d) with G dividing H"
            )
        size = self.attention_row_size(q.dtype, d)
        if size is None:
            raise ValueError(f"attention: no kernel for heads of size {d} in {q.dtype} (sizes {ATTENTION_ROW_SIZES})")
        return size

    def _attention_bias(self, q, k, table, shift, window):
        """The kernels' (table, has_table, shift, window) arguments: a pointer either way (the
        queries when there is no table: has_table 0 ignores it), -1 for no window."""
        if window is not None and (table is None or window < 0):
            raise ValueError(f"attention: window={window} needs a relative bias table that is -inf beyond it")
        if table is None:
            return q, np.int32(0), np.int64(0), np.int64(-1)
        H, Q, K = q.shape[1], q.shape[2], k.shape[2]
        if tuple(table.shape) != (H, Q + K - 1):
            raise ValueError(
                f"attention: relative bias table of shape {tuple(table.shape)}; expected (H, Q + K - 1) = "
                f"{(H, Q + K - 1)}"
            )
        table = self.xp.ascontiguousarray(table, dtype=q.dtype)
        return table, np.int32(1), np.int64(shift), np.int64(-1 if window is None else window)

    def _attention_dropout(self, dropout, dtype):
        """The kernels' (seed, seed_at, threshold, scale) arguments: threshold 0 keeps every weight."""
        seed, threshold, scale = (0, 0, 1.0) if dropout is None else dropout
        if not 0 <= threshold <= 2**32:
            raise ValueError(f"attention: dropout threshold {threshold} is not in [0, 2^32] (round(p * 2^32))")
        return *self._seed(seed), np.uint64(threshold), np.dtype(dtype).type(scale)

    def _attention_shapes(self, q, k):
        B, H, Q, d = q.shape
        return tuple(np.int64(n) for n in (B, H, k.shape[1], Q, k.shape[2], d))

    def _attention_lens(self, lens, B, Q):
        if lens is None:
            if self._no_lens is None:  # the kernel takes a pointer either way; has_lens = 0 ignores it
                self._no_lens = self.xp.zeros(1, np.int64)
            return self._no_lens, np.int32(0)
        lens = self.xp.broadcast_to(self.xp.asarray(lens).reshape(B, -1), (B, Q))
        return self.xp.ascontiguousarray(lens.astype(np.int64, copy=False)), np.int32(1)

    def compile_all(self):
        """Compile (or load from CuPy's cache) every kernel of every source, for both dtypes:
        what ``minitensor info`` checks and a benchmark's warm-up does. Returns their names."""
        for module, names in KERNELS.items():
            for name in names:
                self._function(module, name)
        return [name for names in KERNELS.values() for name in names]

    # -- launching ----------------------------------------------------------------------
    def _function(self, module, kernel):
        """The kernel named ``kernel`` (its C name) of ``module``.cu, compiled on first use."""
        function = self._functions.get(kernel)
        if function is None:
            key = _module_of(module, kernel)
            if key not in self._modules:
                self._modules[key] = self.load_module(source(*key))
            try:
                function = self._modules[key].get_function(kernel)
            except Exception as e:  # NVRTC missing or failing: say what to do, in one line
                first = str(e).strip().splitlines()[0] if str(e).strip() else ""
                raise DeviceError(
                    f"the CUDA kernel {kernel} ({module}.cu) could not be compiled: {type(e).__name__}: {first}. "
                    "CuPy compiles kernels with NVRTC; install the CuPy wheel for your driver's CUDA major "
                    "with its toolkit libraries (pip install 'cupy-cuda12x[ctk]' or 'cupy-cuda13x[ctk]'), "
                    "see `minitensor info`"
                ) from e
            self._functions[kernel] = function
        return function

    def _floats(self, x, what):
        if x.dtype not in (np.float32, np.float64):
            raise TypeError(f"the CUDA {what} kernel takes float32 or float64 arrays, got {x.dtype}")
        return self.xp.ascontiguousarray(x).reshape(x.shape)  # (ascontiguousarray makes a 0-d array 1-d)

    def _map(self, name, x, grad=None):
        """The elementwise kernel ``name`` on ``x`` (and the gradient ``grad`` of x's shape, for a
        backward): a new array of x's shape. ``name_float32(x, [grad,] out, size)`` in C."""
        x = self._floats(x, name.split("_")[0])
        inputs = (x,) if grad is None else (x, self.xp.ascontiguousarray(grad, dtype=x.dtype))
        out = self.xp.empty_like(x)
        self._elementwise(name, x.size, *inputs, out, np.int64(x.size))
        return out

    def _bits(self, name, x, dtype, in_bits, out_bits, out_dtype):
        """The conversion kernel ``name`` over ``x`` (of ``dtype``) seen as ``in_bits`` integers,
        into a new array of x's shape: ``name(x, out, size)`` in C."""
        if x.dtype != dtype:
            raise TypeError(f"the CUDA {name} kernel takes {np.dtype(dtype)} arrays, got {x.dtype}")
        x = self.xp.ascontiguousarray(x).reshape(x.shape)
        out = self.xp.empty(x.shape, dtype=out_bits)
        if x.size:
            blocks = min(-(-x.size // self.elementwise_threads), self.max_blocks)
            kernel = self._function("elementwise", name)
            kernel((blocks,), (self.elementwise_threads,), (x.view(in_bits), out, np.int64(x.size)))
        return out.view(out_dtype)

    def _elementwise(self, name, size, *args):
        if size:
            blocks = min(-(-size // self.elementwise_threads), self.max_blocks)
            kernel = self._function("elementwise", f"{name}_{args[0].dtype.name}")
            kernel((blocks,), (self.elementwise_threads,), args)

    def _rows(self, name, rows, *args):
        """A warp-per-row kernel of softmax.cu or layer_norm.cu on ``rows`` rows."""
        if rows:
            warps = self.row_threads // 32
            blocks = min(-(-rows // warps), self.max_blocks)
            module = "layer_norm" if name.startswith("layer_norm") else "softmax"
            self._function(module, f"{name}_{args[0].dtype.name}")((blocks,), (self.row_threads,), args)

    def _forward(self, name, x, lens):
        x = self._matrix(x, "x")
        y = self.xp.empty_like(x)
        rows, n = np.int64(x.shape[0]), np.int64(x.shape[1])
        if x.size:
            if lens is None:
                self._rows(name, x.shape[0], x, y, rows, n)
            else:
                self._rows("masked_" + name, x.shape[0], x, self._lens(lens, x), y, rows, n)
        return y

    def _backward(self, name, y, g):
        y = self._matrix(y, "y")
        if y.shape != g.shape:
            raise ValueError(f"{name}: y and g must have the same shape, got {tuple(y.shape)} and {tuple(g.shape)}")
        g = self.xp.ascontiguousarray(g, dtype=y.dtype)
        dx = self.xp.empty_like(y)
        if y.size:
            self._rows(name, y.shape[0], y, g, dx, np.int64(y.shape[0]), np.int64(y.shape[1]))
        return dx

    def _matrix(self, x, what, kernels="softmax"):
        if x.ndim != 2:
            raise ValueError(f"{what} must be a 2-D (rows, n) array, got shape {tuple(x.shape)}")
        if x.dtype not in (np.float32, np.float64):
            raise TypeError(f"the CUDA {kernels} kernels take float32 or float64 arrays, got {x.dtype}")
        return self.xp.ascontiguousarray(x)

    def _lens(self, lens, x):
        lens = self.xp.asarray(lens)
        if lens.ndim != 1 or lens.shape[0] != x.shape[0]:
            raise ValueError(f"lens must have one entry per row: shape {tuple(lens.shape)} for {x.shape[0]} rows")
        if lens.dtype.kind not in "iu":
            raise TypeError(f"lens must hold integers, got {lens.dtype}")
        if lens.dtype.kind == "u":  # clipped to n first: a huge unsigned length must not wrap negative
            lens = self.xp.minimum(lens, x.shape[1])
        return self.xp.ascontiguousarray(lens.astype(np.int64, copy=False))  # the kernel reads int64
