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
kernels behind device-array checks) in their place.
"""

import types

import numpy
from strict_backend import StrictArray, StrictKernels, StrictNamespace, note


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
    """cupy.cuda.Stream: a queue of GPU work; ``synchronize()`` waits until it has run."""

    ptr = 0

    def synchronize(self):
        note("sync", "Stream.synchronize()")


class _Device:
    """cupy.cuda.Device(id): ``synchronize()`` waits for all its work."""

    def __init__(self, device=0):
        self.id = device

    def synchronize(self):
        note("sync", "Device.synchronize()")


def _device_synchronize():
    note("sync", "runtime.deviceSynchronize()")


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

        stream = _Stream()
        self.cuda = types.SimpleNamespace(
            runtime=types.SimpleNamespace(
                getDeviceCount=get_device_count,
                CUDARuntimeError=CUDARuntimeError,
                deviceSynchronize=_device_synchronize,
                # what `minitensor info` reports: an H200 on a CUDA 13 driver
                getDeviceProperties=lambda device: {"name": b"NVIDIA H200", "major": 9, "minor": 0},
                runtimeGetVersion=lambda: 13000,
                driverGetVersion=lambda: 13000,
            ),
            curand=types.SimpleNamespace(CURAND_RNG_PSEUDO_PHILOX4_32_10=161),
            Stream=types.SimpleNamespace(null=stream),
            get_current_stream=lambda: stream,
            Device=_Device,
        )
        self.random = types.SimpleNamespace(RandomState=random_state)

    def is_available(self):
        return self.error is None

    @staticmethod
    def asnumpy(a):
        note("read", "cupy.asnumpy")
        return a._a.copy()

    @staticmethod
    def from_dlpack(obj):
        return StrictArray(numpy.from_dlpack(obj))


def fake_cuda_backend(cupy=None):
    """A CupyBackend on FakeCupy, with the strict kernels standing in for the CUDA ones."""
    from minitensor.backends.cupy_backend import CupyBackend

    backend = CupyBackend(cupy or FakeCupy())
    backend._kernels = StrictKernels()
    return backend
