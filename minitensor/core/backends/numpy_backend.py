"""The CPU backend: NumPy arrays, numba kernels.

``import minitensor`` changes nothing in the process around it. Two process-wide settings are
made at the first kernel a program runs (the first softmax, layer norm or dropout, say), the
point where minitensor starts to train rather than to be imported:

- glibc keeps freed blocks for reuse (``keep_freed_memory`` below, unless the user set
  ``MALLOC_MMAP_THRESHOLD_`` or ``MALLOC_TRIM_THRESHOLD_``);
- numba's ``prange`` runs on its own "workqueue" threads (``kernels/cpu.py``, unless the user
  set ``NUMBA_THREADING_LAYER``).

``tests/test_import_side_effects.py`` holds both to this.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy

from .base import Backend

if TYPE_CHECKING:
    from ..tensor import Array, DType, Shape


def keep_freed_memory() -> bool:
    """Ask glibc's malloc to keep freed blocks of up to 32 MiB for reuse.

    A training step allocates and frees the same large arrays (activations, gradients,
    megabytes each) at every step. By default glibc hands blocks above 128 KiB back to the
    operating system when they are freed, so the next step gets fresh pages, and the first
    write to each 4 KiB page is a page fault -- on a virtual machine as slow as the
    arithmetic that fills the array (a softmax through autograd on 8 MB took 7x its
    kernels' time; bench/README.md). Kept in the heap, a freed block is reused at once.
    (PyTorch users get the same by preloading jemalloc or tcmalloc.) 32 MiB is glibc's
    largest allowed threshold. A MALLOC_MMAP_THRESHOLD_ or MALLOC_TRIM_THRESHOLD_ the user
    set is kept; other C libraries (macOS, musl) are left alone.
    """
    if "MALLOC_MMAP_THRESHOLD_" in os.environ or "MALLOC_TRIM_THRESHOLD_" in os.environ:
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h
    # keep up to 1 GiB free at the top of the heap instead of trimming it after each free
    return bool(mallopt(M_MMAP_THRESHOLD, 32 * 2**20)) and bool(mallopt(M_TRIM_THRESHOLD, 2**30))


_TUNED: list[bool] = []


def _first_kernel() -> None:
    """What the first kernel of a program sets up once (see the module docstring): importing
    ``kernels.cpu`` has chosen numba's threading layer; here glibc keeps freed blocks."""
    if not _TUNED:
        _TUNED.append(keep_freed_memory())


# the dtypes the fused kernels are compiled for (and NumPy's generator draws); float16 and
# anything else runs NumPy's code
_KERNEL_DTYPES = (numpy.dtype(numpy.float32), numpy.dtype(numpy.float64))


def _machine_ram() -> int | None:
    try:  # Linux, macOS; Windows has no sysconf
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


# read once: every new tensor's size is checked against it (creation.py), and it does not change
_RAM = _machine_ram()


class NumpyBackend(Backend):
    device = "cpu"
    xp = numpy
    on_host = True

    def check(self, ok: Array | bool, message: str | Callable[[], str], error: type[Exception] = IndexError) -> None:
        # the data is in host memory: reading ``ok`` costs nothing, so fail now, where the
        # traceback points at the op
        if not ok:
            raise error(message() if callable(message) else message)

    def __init__(self) -> None:
        self._rng = numpy.random.default_rng()
        self._kernels: ModuleType | None = None
        self._fused: ModuleType | None = None
        self._bfloat16: ModuleType | None = None

    def array(self, data: Any, dtype: DType = None) -> numpy.ndarray:
        return numpy.array(data, dtype=dtype)

    def to_numpy(self, array: Array) -> numpy.ndarray:
        return numpy.array(array, copy=True)

    def is_array(self, obj: object) -> bool:
        return isinstance(obj, numpy.ndarray)

    def memory_size(self) -> int | None:
        return _RAM  # the machine's RAM

    def seed(self, seed: int) -> None:
        self._rng = numpy.random.default_rng(seed)

    def normal(self, shape: Shape, dtype: DType) -> numpy.ndarray:
        if numpy.dtype(dtype) in _KERNEL_DTYPES:
            return self._rng.standard_normal(shape, dtype=dtype)
        return self._rng.standard_normal(shape, dtype=numpy.float32).astype(dtype)  # float16: as random

    def random(self, shape: Shape, dtype: DType) -> numpy.ndarray:
        if numpy.dtype(dtype) in _KERNEL_DTYPES:
            return self._rng.random(shape, dtype=dtype)
        # NumPy's generator draws only float32 and float64 (float16 dropout masks, say)
        return self._rng.random(shape, dtype=numpy.float32).astype(dtype)

    def integers(self, low: int, high: int, shape: Shape) -> numpy.ndarray:
        return self._rng.integers(low, high, shape, dtype=numpy.int64)

    def draw_seed(self) -> int:
        """A seed in [0, 2^62) for a counter-based kernel (dropout), from this generator."""
        # (no size: NumPy's scalar path draws the same number as size=() from the same state,
        # a third of the time; this runs at every dropout of every step)
        return int(self._rng.integers(0, 2**62, dtype=numpy.int64))

    def index_add(self, target: numpy.ndarray, index: Any, values: numpy.ndarray) -> None:
        if isinstance(index, numpy.ndarray) and index.ndim == 1 and index.dtype.kind in "iu" and index.size:
            # Rows picked by one integer array (embedding backward): sort the indices and
            # add each run of equal ones with one reduceat -- the same sums as add.at,
            # several times faster, because add.at is unbuffered, element by element
            # (figure: bench/README.md).
            index = numpy.where(index < 0, index + target.shape[0], index)  # -1 and n-1 are one row
            order = numpy.argsort(index, kind="stable")
            unique, starts = numpy.unique(index[order], return_index=True)
            target[unique] += numpy.add.reduceat(values[order], starts, axis=0)
        else:
            numpy.add.at(target, index, values)

    # Tests set this to False to run the ops' plain NumPy code instead of the fused kernels.
    use_fused_kernels = True

    #: kernels a GPU has and the CPU has not: one launch for a list of tensors saves the launches
    #: a kernel per tensor costs there; here a call costs nothing and the numba kernel per tensor
    #: is as fast, so the optimiser and clipping take their per-parameter paths
    MULTI_TENSOR = frozenset({"adam_update_multi", "l2_norm_multi", "scale_multi"})

    def fused(self, name: str, dtype: DType) -> Callable[..., Any] | None:
        if not self.use_fused_kernels or dtype not in _KERNEL_DTYPES or name in self.MULTI_TENSOR:
            return None
        if self._fused is None:
            # numba loads on first use (see ``kernels`` below)
            from ..kernels import fused

            _first_kernel()
            self._fused = fused
        return getattr(self._fused, name)

    @property
    def bfloat16_kernels(self) -> ModuleType | None:
        if not self.use_fused_kernels:
            return None
        if self._bfloat16 is None:
            from ..kernels import bfloat16

            _first_kernel()
            self._bfloat16 = bfloat16
        return self._bfloat16

    @property
    def kernels(self) -> ModuleType:
        # Imported on first use: numba is slow to import (bench/import_time.py measures
        # it) and compiles lazily anyway.
        if self._kernels is None:
            from ..kernels import cpu

            _first_kernel()
            self._kernels = cpu
        return self._kernels
