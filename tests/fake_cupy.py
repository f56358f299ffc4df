"""A stand-in for the ``cupy`` module, so the CuPy backend's own code runs without a GPU.

``FakeCupy`` is the strict test namespace (NumPy behind CuPy's manners: arrays that refuse
implicit host conversion, see ``strict_backend.py``) plus the few CuPy names that
``minitensor/core/backends/cupy_backend.py`` uses beyond NumPy's API: ``asnumpy``,
``random.RandomState(seed, method=...)``, ``add.at``, ``from_dlpack``, ``is_available`` and
``cuda.runtime.getDeviceCount`` / ``cuda.curand``. Its ``is_available`` and
``getDeviceCount`` answer as a machine without a driver or without a GPU would, on request.
``asnumpy`` and the ways CuPy code waits for the GPU (``cuda.get_current_stream().synchronize()``,
``cuda.Device().synchronize()``, ``cuda.Stream.null.synchronize()``,
``cuda.runtime.deviceSynchronize()``) are there too, counted by ``strict_backend.count_syncs``.

The kernels are not faked: ``tests/test_cuda_kernels.py`` runs the real CUDA C++ kernels in
the tests' CUDA emulator. A backend built on FakeCupy gets the strict kernels (numba CPU
kernels behind device-array checks) in their place, and ``FakeCudaKernels`` adds the GPU's
multi-tensor kernels to them (one call, one launch), so the optimiser's and clipping's GPU paths
run here too.
"""

import contextlib
import math
import types
from unittest import mock

import numpy
import strict_backend
from minitensor.backends import cublas_gemm
from minitensor.kernels.cuda import PointerTables
from strict_backend import StrictArray, StrictKernels, StrictNamespace, note, strict_xp


class CUDARuntimeError(RuntimeError):
    """What cupy.cuda.runtime raises."""


class _RandomState:
    """cupy.random.RandomState's interface on NumPy's legacy generator."""

    def __init__(self, seed=None, method=None):
        self.method = method
        self._rs = numpy.random.RandomState(None if seed is None else seed % 2**32)

    def standard_normal(self, size, dtype=float):
        return StrictArray(self._rs.standard_normal(size).astype(dtype))

    def random_sample(self, size, dtype=float):
        return StrictArray(self._rs.random_sample(size).astype(dtype))

    def randint(self, low, high, size, dtype="l"):
        return StrictArray(self._rs.randint(low, high, size).astype(dtype))


class _Stream:
    """cupy.cuda.Stream: a queue of GPU work; ``synchronize()`` waits until it has run. A stream
    other than the null one can capture a CUDA graph (``begin_capture``): the launches made
    until ``end_capture`` are kept by ``strict_backend`` and run again by the graph's ``launch``."""

    _current = []  # the streams made current by `with stream:`, innermost last

    def __init__(self, null=False, non_blocking=False, ptr=None):
        self.ptr = 0 if null else id(self)
        self.capturing = False

    def synchronize(self):
        note("sync", "Stream.synchronize()")

    def record(self, event=None):
        return event or _Event()

    def wait_event(self, event):
        assert isinstance(event, _Event)

    def __enter__(self):
        _Stream._current.append(self)
        return self

    def __exit__(self, *exc):
        _Stream._current.pop()

    def begin_capture(self, mode=None):
        if self.ptr == 0:
            raise RuntimeError("cannot capture on the default (legacy) stream")
        if _Stream._current[-1:] != [self]:
            raise AssertionError("the stand-in captures the current stream only: use `with stream:` first")
        strict_backend.begin_capture()
        self.capturing = True

    def end_capture(self):
        if not self.capturing:
            raise CUDARuntimeError("cudaErrorIllegalState: the stream is not capturing")
        self.capturing = False
        return _Graph(strict_backend.end_capture())

    def is_capturing(self):
        return self.capturing


class _Event:
    """cupy.cuda.Event: a point in a stream's queue."""


class _Graph:
    """cupy.cuda.Graph: ``launch(stream)`` runs the captured launches again, as one launch."""

    def __init__(self, recording):
        self.recording = recording  # strict_backend.Recording

    def launch(self, stream=None):
        _launched("graph launch")
        strict_backend.replay(self.recording)


class _MemoryPool:
    """cupy.cuda.MemoryPool: here NumPy allocates; ``malloc`` is what ``using_allocator`` takes."""

    def malloc(self, size):
        raise AssertionError("the stand-in allocates with NumPy")


@contextlib.contextmanager
def _using_allocator(allocator=None):
    yield


class _Device:
    """cupy.cuda.Device(id): ``synchronize()`` waits for all its work."""

    def __init__(self, device=0):
        self.id = device

    def synchronize(self):
        note("sync", "Device.synchronize()")


def _device_synchronize():
    note("sync", "runtime.deviceSynchronize()")


class _ComputeTypes:
    """cupy._core._routines_linalg's compute types (CuPy's values) and their setter: ``set``
    records what each dtype was given."""

    COMPUTE_TYPE_DEFAULT, COMPUTE_TYPE_BF16, COMPUTE_TYPE_TF32 = 1, 6, 7

    def __init__(self):
        self.set = {}

    def set_compute_type(self, dtype, compute_type):
        self.set[numpy.dtype(dtype)] = compute_type


class FakeCupy(StrictNamespace):
    """``import cupy`` as a test sees it. ``error``: the CUDARuntimeError text that
    ``getDeviceCount`` raises (None: one usable GPU)."""

    __version__ = "14.2.0"

    def __init__(self, error=None):
        super().__init__(numpy)
        self.error = error
        self.created_generators = []

        def get_device_count():
            if self.error:
                raise CUDARuntimeError(self.error)
            return 1

        def random_state(seed=None, method=None):
            rs = _RandomState(seed, method)
            self.created_generators.append(rs)
            return rs

        stream = _Stream(null=True)
        self.cuda = types.SimpleNamespace(
            runtime=types.SimpleNamespace(
                getDeviceCount=get_device_count,
                CUDARuntimeError=CUDARuntimeError,
                deviceSynchronize=_device_synchronize,
                # what `minitensor info` reports: an H200 on a CUDA 13 driver (and what the attention
                # kernels ask, to size their grid)
                getDeviceProperties=lambda device: {
                    "name": b"NVIDIA H200",
                    "major": 9,
                    "minor": 0,
                    "multiProcessorCount": 132,
                    "totalGlobalMem": 150_000_000_000,  # an H200's 139.7 GiB
                },
                getDevice=lambda: 0,
                runtimeGetVersion=lambda: 13000,
                driverGetVersion=lambda: 13000,
            ),
            curand=types.SimpleNamespace(CURAND_RNG_PSEUDO_PHILOX4_32_10=161),
            Stream=_stream_class(stream),
            get_current_stream=lambda: (_Stream._current or [stream])[-1],
            MemoryPool=_MemoryPool,
            using_allocator=_using_allocator,
            Device=_Device,
        )
        self.random = types.SimpleNamespace(RandomState=random_state)
        # cuBLAS's compute type per dtype and its handle's math mode (mt.set_float32_matmul_precision),
        # recorded, not applied
        self._core = types.SimpleNamespace(_routines_linalg=_ComputeTypes())
        self.math_modes = {}
        self.cuda.cublas = types.SimpleNamespace(setMathMode=self.math_modes.__setitem__)
        self.cuda.get_cublas_handle = lambda: 1  # CuPy's handle for this thread and device

    def is_available(self):
        return self.error is None

    @staticmethod
    def asnumpy(a):
        note("read", "cupy.asnumpy")
        return a._a.copy()

    @staticmethod
    def from_dlpack(obj):
        return StrictArray(numpy.from_dlpack(obj))


def _stream_class(null):
    """``cupy.cuda.Stream``: the class, with its ``null`` stream."""
    return type("Stream", (_Stream,), {"null": null})


def _launched(what):
    """One launch, for strict_backend's launch counter where it has one."""
    launched = getattr(strict_backend, "launched", None)
    if launched is not None:
        launched(what)


def _device(a, what):
    if not isinstance(a, StrictArray):
        raise TypeError(f"stand-in kernel {what}: expected a device array, got {type(a).__name__}")
    return a._a


class FakeCudaKernels(StrictKernels):
    """The strict kernels plus ``kernels/cuda``'s multi-tensor ones (``multi_tensor.cu``): each call
    is one launch, computed by the CPU's numba kernel tensor by tensor (the per-parameter kernels
    that the CUDA ones equal bit for bit, tests/test_multi_tensor.py), with the real launcher's
    checks and its device tables of pointers (``PointerTables``: uploaded, counted by
    ``count_syncs``, when a list of addresses is new)."""

    def __init__(self):
        self.pointer_tables = PointerTables(strict_xp, address=lambda a: _device(a, "pointer table").ctypes.data)

    def adam_update_multi(
        self, params, grads, exp_avgs, exp_avg_sqs, step_size, beta1, beta2, eps, weight_decay, bias_sqrt2, decay=1.0
    ):
        lists = [list(a) for a in (params, grads, exp_avgs, exp_avg_sqs)]
        if len({len(a) for a in lists}) != 1:
            raise ValueError("adam_update_multi: params, grads, exp_avgs and exp_avg_sqs must be lists of one length")
        params, grads, exp_avgs, exp_avg_sqs = ([_device(a, "adam_update_multi") for a in arrays] for arrays in lists)
        if not all(a.flags.c_contiguous for a in params + exp_avgs + exp_avg_sqs):
            raise ValueError(
                "adam_update_multi: the parameters and their moments must be C-contiguous (updated in place)"
            )
        if sum(a.size for a in params):
            self.pointer_tables.table(*lists)
            _launched("kernel adam_update_multi")
        from minitensor.kernels import fused  # numba, loaded on first use as StrictKernels does

        def update():
            for w, g, m, v in zip(params, grads, exp_avgs, exp_avg_sqs):
                if decay != 1:
                    w *= decay  # AdamW's decay, w's dtype times w's dtype as the kernel does
                g = numpy.ascontiguousarray(g, dtype=w.dtype)
                fused.adam_update(w, g, m, v, step_size, beta1, beta2, eps, weight_decay, bias_sqrt2)

        strict_backend._recorded(update, in_place=True)

    def draw_seeds(self, seeds, key, first):
        """elementwise.cu's ``draw_seeds``: the host's draws ``first``, ``first + 1``, ... in place."""
        from minitensor.backends.cupy_backend import _splitmix64

        table = _device(seeds, "draw_seeds")
        if table.size:
            _launched("kernel draw_seeds")

        def draw():
            table[...] = [_splitmix64(key ^ (first + i)) >> 2 for i in range(table.size)]

        strict_backend._recorded(draw, in_place=True)

    def l2_norm_multi(self, arrays, max_norm=math.inf):
        arrays = list(arrays)
        if not arrays:
            raise ValueError("l2_norm_multi: needs at least one array")
        data = [_device(a, "l2_norm_multi") for a in arrays]
        dtype = data[0].dtype
        if sum(a.size for a in data):
            self.pointer_tables.table(arrays)
            _launched("kernel sum_of_squares_partial")
        _launched("kernel sum_of_squares_finish")

        def norm_and_scale():
            total = math.fsum(float(numpy.dot(a.reshape(-1).astype(numpy.float64), a.reshape(-1))) for a in data)
            norm = dtype.type(math.sqrt(total))
            value = float(norm)
            scale = max_norm / (value + 1e-6)  # the kernel's factor: in float64 from the rounded norm
            scale = scale if math.isfinite(value) and scale < 1.0 else 1.0
            return numpy.array(norm), numpy.array(scale, dtype)

        return strict_backend._recorded(norm_and_scale)

    def scale_multi(self, arrays, factor):
        arrays = list(arrays)
        data = [_device(a, "scale_multi") for a in arrays]
        if not all(a.flags.c_contiguous for a in data):
            raise ValueError("scale_multi: the arrays must be C-contiguous (scaled in place)")
        if sum(a.size for a in data):
            self.pointer_tables.table(arrays)
            _launched("kernel scale_multi")
        f = _device(factor, "scale_multi").reshape(())

        def scale():
            for a in data:
                a *= f

        strict_backend._recorded(scale, in_place=True)


def fake_cuda_backend(cupy=None):
    """A CupyBackend on FakeCupy, with the strict kernels and the multi-tensor stand-ins in place
    of the CUDA ones."""
    from minitensor.backends.cupy_backend import CupyBackend

    backend = CupyBackend(cupy or FakeCupy())
    backend._kernels = FakeCudaKernels()
    backend.direct_cublas = FakeDirectCublas  # a capture's products: cuBLAS called directly, here in NumPy
    return backend


@contextlib.contextmanager
def attention_kernels_that_record(backend):
    """``backend`` (the stand-in's CupyBackend) with streamed-attention kernels that record each
    launch a GPU would make and run none (the stand-in's CPU kernels cannot run CUDA C++; the
    outputs are left unwritten, which a count does not mind): yields the list of their names."""
    from cuda_emulator import RecordingModule
    from minitensor.kernels.cuda import CudaKernels

    made = []

    class NamesOnly(RecordingModule):
        # the kernel's name alone: holding its arguments would keep the gradients it writes
        # referenced, and autograd would copy them as arrays something else still holds
        def get_function(self, name):
            return lambda grid, block, args: made.append(name)

    kernels = CudaKernels(backend.xp, load_module=NamesOnly)  # one, as a backend keeps one
    with mock.patch.object(type(backend), "attention_kernels", property(lambda _: kernels)):
        yield made


# -- cuBLAS's bfloat16 products (minitensor/core/backends/cublas_gemm.py), in NumPy ----------------
def to_bfloat16(x):
    """float32 rounded to bfloat16's 8 bits of mantissa (to nearest, ties to even), as float32."""
    bits = numpy.ascontiguousarray(x, numpy.float32).view(numpy.uint32).astype(numpy.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return rounded.astype(numpy.uint32).view(numpy.float32).reshape(numpy.shape(x))


def read_matrices(operand, rows, columns, count):
    """The ``count`` column-major (rows, columns) matrices cuBLAS reads from the operand's memory,
    as a (count, rows, columns) array."""
    x = getattr(operand.array, "_a", operand.array)  # (a StrictArray's NumPy array)
    size = x.itemsize
    return numpy.lib.stride_tricks.as_strided(
        x, shape=(count, rows, columns), strides=(operand.stride * size, size, operand.ld * size), writeable=False
    )


def run_like_cublas(call, bfloat16=True, dtype=numpy.float32):
    """``cublasGemmStridedBatchedEx`` with the arguments of ``call``, in NumPy: C_p = op(A_p) op(B_p)
    for each p, column-major, C written with ``ldc`` and ``stride_c``; returns the row-major output
    (of ``dtype``: float32, or float64 for a product of doubles)."""
    m, n, k, count = call.m, call.n, call.k, call.batch_count
    a_rows, a_cols = (m, k) if call.first.trans == cublas_gemm.CUBLAS_OP_N else (k, m)
    b_rows, b_cols = (k, n) if call.second.trans == cublas_gemm.CUBLAS_OP_N else (n, k)
    A = read_matrices(call.first, a_rows, a_cols, count)
    B = read_matrices(call.second, b_rows, b_cols, count)
    if call.first.trans != cublas_gemm.CUBLAS_OP_N:
        A = A.swapaxes(-1, -2)
    if call.second.trans != cublas_gemm.CUBLAS_OP_N:
        B = B.swapaxes(-1, -2)
    if bfloat16:
        A, B = to_bfloat16(A), to_bfloat16(B)
    C = numpy.matmul(A.astype(numpy.float64), B.astype(numpy.float64)).astype(dtype)  # (count, m, n)
    out = numpy.zeros(count * call.stride_c + call.ldc * n, dtype)
    size = out.itemsize
    view = numpy.lib.stride_tricks.as_strided(
        out, shape=(count, m, n), strides=(call.stride_c * size, size, call.ldc * size)
    )
    view[...] = C
    return out[: count * call.stride_c].reshape(call.shape) if count else out[:0].reshape(call.shape)


def launch_in_numpy(xp, call, out):
    """``cublas_gemm.launch`` on the stand-in: the call run by ``run_like_cublas``, into ``out``
    (one launch for ``count_launches``, as on a GPU)."""
    _launched("cublasGemmStridedBatchedEx")
    out._a[...] = run_like_cublas(call)


class FakeDirectCublas:
    """``cublas_gemm.DirectCublas`` on the stand-in: the call run by ``run_like_cublas`` (bfloat16
    inputs at the bfloat16 compute type), kept by a capture as a launch that writes ``out``."""

    name = "cuBLAS run in NumPy (the tests' stand-in)"

    def gemm(self, call, out, data_type, compute_type):
        _launched("cublasGemmStridedBatchedEx")
        bfloat16 = compute_type == cublas_gemm.CUBLAS_COMPUTE_32F_FAST_16BF

        def run():
            out._a[...] = run_like_cublas(call, bfloat16, out.dtype)

        strict_backend._recorded(run, in_place=True)
