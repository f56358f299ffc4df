"""The CPU backend: NumPy arrays, numba kernels."""

import numpy

from .base import Backend


class NumpyBackend(Backend):
    device = "cpu"
    xp = numpy

    def __init__(self):
        self._rng = numpy.random.default_rng()
        self._kernels = None

    def array(self, data, dtype=None):
        return numpy.array(data, dtype=dtype)

    def to_numpy(self, array):
        return numpy.array(array, copy=True)

    def is_array(self, obj):
        return isinstance(obj, numpy.ndarray)

    def seed(self, seed):
        self._rng = numpy.random.default_rng(seed)

    def normal(self, shape, dtype):
        return self._rng.standard_normal(shape, dtype=dtype)

    def random(self, shape, dtype):
        return self._rng.random(shape, dtype=dtype)

    def integers(self, low, high, shape):
        return self._rng.integers(low, high, shape, dtype=numpy.int64)

    def index_add(self, target, index, values):
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

    def fused(self, name):
        if not self.use_fused_kernels:
            return None
        # numba loads on first use (see ``kernels`` below).
        from ..kernels import fused

        return getattr(fused, name)

    @property
    def kernels(self):
        # Imported on first use: numba is slow to import (bench/import_time.py measures
        # it) and compiles lazily anyway.
        if self._kernels is None:
            from ..kernels import cpu

            self._kernels = cpu
        return self._kernels
