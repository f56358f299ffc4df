"""The Backend interface: the one place that knows which array library holds the data.

A Tensor stores a backend *array* (``numpy.ndarray`` on the CPU, ``cupy.ndarray`` on a GPU)
and a reference to its Backend. Operations never call ``numpy`` on tensor data; they ask the
tensor's backend for its array module ``xp`` (NumPy and CuPy share one API), so the same op
code runs on every device. What the two libraries do *not* share lives here, as methods:
moving data to and from the host, random numbers, scatter-add and the fused kernels.
"""


class Backend:
    """One array library on one device.

    Subclasses set ``device`` (the name users pass: ``"cpu"``, ``"cuda"``) and ``xp`` (the
    array module) and implement the methods below.
    """

    device = None
    xp = None

    def __repr__(self):
        return f"<{type(self).__name__} device={self.device!r}>"

    def __reduce__(self):
        # One backend object per device: copy.deepcopy and pickle of a tensor must find
        # the registered backend again, not clone it (ops compare backends by identity).
        from . import get_backend  # cycle: backends/__init__.py imports this module first

        return (get_backend, (self.device,))

    # -- data in and out ------------------------------------------------------------
    def array(self, data, dtype=None):
        """A new device array from ``data`` (nested lists, a NumPy array, a scalar)."""
        raise NotImplementedError

    def to_numpy(self, array):
        """A host ``numpy.ndarray`` copy of a device array (never a view: the copy is yours)."""
        raise NotImplementedError

    def is_array(self, obj):
        """True if ``obj`` is an array of this backend."""
        raise NotImplementedError

    # -- random numbers (generated on the device) ---------------------------------------
    def seed(self, seed):
        raise NotImplementedError

    def normal(self, shape, dtype):
        """Standard normal samples."""
        raise NotImplementedError

    def random(self, shape, dtype):
        """Uniform samples in [0, 1)."""
        raise NotImplementedError

    def uniform(self, shape, dtype, low=0.0, high=1.0):
        """Uniform samples in [low, high): ``random`` stretched and shifted."""
        u = self.random(shape, dtype)
        if low != 0.0 or high != 1.0:
            u = u * (high - low) + low
        return u.astype(dtype, copy=False)

    def integers(self, low, high, shape):
        """Random int64 in [low, high)."""
        raise NotImplementedError

    # -- what array libraries spell differently -----------------------------------------
    def index_add(self, target, index, values):
        """``target[index] += values`` in place, *accumulating* over repeated indices.

        Plain ``target[index] += values`` is wrong when ``index`` repeats a position (the
        last write wins); backward of integer-array indexing and of embedding needs the
        unbuffered sum.
        """
        raise NotImplementedError

    def fused(self, name, dtype):
        """The fused kernel ``name`` of ``minitensor/kernels/fused.py`` for arrays of
        ``dtype`` on this device, or None.

        None tells the op to run its own array-library code (the definition the kernel is
        tested against). The CPU backend has these kernels for float32 and float64, and the
        CuPy backend CUDA C++ kernels of the same names and signatures (``kernels/cuda``).
        """
        return None

    @property
    def kernels(self):
        """The fused softmax kernels for this device: an object with ``softmax_forward``,
        ``softmax_backward``, ``log_softmax_forward`` and ``log_softmax_backward`` taking
        C-contiguous 2-D arrays (see ``minitensor/kernels``)."""
        raise NotImplementedError
