"""The Backend interface: the one place that knows which array library holds the data.

A Tensor stores a backend *array* (``numpy.ndarray`` on the CPU, ``cupy.ndarray`` on a GPU)
and a reference to its Backend. Operations never call ``numpy`` on tensor data; they ask the
tensor's backend for its array module ``xp`` (NumPy and CuPy share one API), so the same op
code runs on every device. What the two libraries do *not* share lives here, as methods:
moving data to and from the host, random numbers, scatter-add and the fused kernels.

And one thing the two *devices* do differently: checks on the data. Reading a value on the
host is free on the CPU, but on a GPU it makes the host wait until the device has finished
everything queued before it -- a training step that reads one number waits for its own
forward pass. So an op that must check its data (an embedding index in range) states the
check with ``backend.check(ok, message)``: the CPU backend raises at once, a device backend
keeps the flag on the device and makes all pending checks together at the next read the
user asks for (``Tensor.item()``, ``.numpy()``, ``float()``: ``raise_failed_checks``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy

from .. import dtypes
from ..dtypes import float32, is_bfloat16, is_low_precision
from ..errors import DeviceError

if TYPE_CHECKING:
    from ..tensor import Array, DType, Shape


class Backend:
    """One array library on one device.

    Subclasses set ``device`` (the name users pass: ``"cpu"``, ``"cuda"``) and ``xp`` (the
    array module) and implement the methods below.
    """

    device: str = ""  # set by each subclass (register_backend refuses a backend without one)
    xp: Any = None  # the array module: numpy, cupy

    def __repr__(self) -> str:
        return f"<{type(self).__name__} device={self.device!r}>"

    def __reduce__(self) -> tuple[Callable[[str], Backend], tuple[str]]:
        # One backend object per device: copy.deepcopy and pickle of a tensor must find
        # the registered backend again, not clone it (ops compare backends by identity).
        from . import get_backend  # cycle: backends/__init__.py imports this module first

        return (get_backend, (self.device,))

    # -- data in and out ------------------------------------------------------------
    def array(self, data: Any, dtype: DType = None) -> Array:
        """A new device array from ``data`` (nested lists, a NumPy array, a scalar)."""
        raise NotImplementedError

    def to_numpy(self, array: Array) -> numpy.ndarray:
        """A host ``numpy.ndarray`` copy of a device array (never a view: the copy is yours)."""
        raise NotImplementedError

    def is_array(self, obj: object) -> bool:
        """True if ``obj`` is an array of this backend."""
        raise NotImplementedError

    def memory_owner(self, array: Array) -> Any:
        """The object that owns ``array``'s memory: ``array`` itself, or the array it is a view
        of (NumPy's and CuPy's ``base``, which points at the owner, never at another view). What
        ``autograd.WriteLog`` stamps, so that a write through a view counts for every view."""
        base = array.base
        return array if base is None or not hasattr(base, "shape") else base

    def memory_size(self) -> int | None:
        """The bytes of memory this device holds (a GPU's own, the machine's RAM for the CPU), or
        None where the system does not say: what a run's size is checked against *before* it
        allocates, so that a mistyped ``--num-hiddens`` is refused instead of filling the memory."""
        return None

    def check_fits(self, op: str, shape: tuple[int, ...], itemsize: int) -> None:
        """Refuse, before allocating it, a result of ``shape`` larger than the device's memory:
        where a size comes from the caller's numbers (``repeat``'s counts, ``eye``'s n), a
        mistyped one would otherwise fill the memory and meet the system's killer."""
        size, memory = math.prod(shape) * itemsize, self.memory_size()
        if memory is not None and size > memory:
            raise ValueError(
                f"{op}: the result would have shape {tuple(shape)}, {size / 2**30:,.1f} GiB, more than "
                f"the {memory / 2**30:,.1f} GiB of the device ({self.device})"
            )

    # -- random numbers (generated on the device) ---------------------------------------
    def seed(self, seed: int) -> None:
        raise NotImplementedError

    def normal(self, shape: Shape, dtype: DType) -> Array:
        """Standard normal samples."""
        raise NotImplementedError

    def random(self, shape: Shape, dtype: DType) -> Array:
        """Uniform samples in [0, 1)."""
        raise NotImplementedError

    def uniform(self, shape: Shape, dtype: DType, low: float = 0.0, high: float = 1.0) -> Array:
        """Uniform samples in [low, high): ``random`` stretched and shifted."""
        u = self.random(shape, dtype)
        if is_low_precision(numpy.dtype(dtype)):  # float32 draws near 1 round up to 1 in 8 or 11 bits
            u = self.xp.minimum(u, 1 - float(numpy.finfo(dtype).epsneg))  # the largest number below 1
        if low != 0.0 or high != 1.0:
            u = u * (high - low) + low
        return u.astype(dtype, copy=False)

    def integers(self, low: int, high: int, shape: Shape) -> Array:
        """Random int64 in [low, high)."""
        raise NotImplementedError

    # -- what array libraries spell differently -----------------------------------------
    def draw_seed(self) -> int:
        """A seed in [0, 2^62) for counter-based random numbers (the fused dropout, dropout inside
        the streamed attention) drawn from this backend's generator, so that ``mt.manual_seed``
        reproduces it. This default reads a drawn integer back to the host, which on a GPU waits
        for it: a device backend draws on the host instead (the NumPy and CuPy backends do)."""
        return int(self.to_numpy(self.integers(0, 2**62, ())))

    def index_add(self, target: Array, index: Any, values: Array) -> None:  # index: whatever x[index] takes
        """``target[index] += values`` in place, *accumulating* over repeated indices.

        Plain ``target[index] += values`` is wrong when ``index`` repeats a position (the
        last write wins); backward of integer-array indexing and of embedding needs the
        unbuffered sum.
        """
        raise NotImplementedError

    def begin_capture(self) -> Any:
        """Start capturing a CUDA graph (``mt.cuda.graph``): the CuPy backend's, ``cuda_graph.py``.
        Elsewhere there is nothing to capture: a CPU step launches no kernels."""
        raise DeviceError(f"cuda graph: capturing needs the 'cuda' device, not {self.device!r}")

    @property
    def capturing(self) -> bool:
        """Is a CUDA graph being captured here (between ``begin_capture`` and its end)?"""
        return False

    def keep_for_replay(self, array: Any) -> None:
        """While a CUDA graph is being captured, keep ``array`` alive as long as the graph: an
        array made before the capture (a cache's) that the captured kernels read must not be
        freed while the graph may replay them, or the memory pool hands its memory to another
        array and the replay reads that one. Nothing to keep where nothing is captured."""

    def fused(self, name: str, dtype: DType) -> Callable[..., Any] | None:
        """The fused kernel ``name`` of ``minitensor/core/kernels/fused.py`` for arrays of
        ``dtype`` on this device, or None.

        None tells the op to run its own array-library code (the definition the kernel is
        tested against). The CPU backend has these kernels for float32 and float64, and the
        CuPy backend CUDA C++ kernels of the same names and signatures (``kernels/cuda``).

        The CuPy backend also has multi-tensor kernels, one launch for a whole list of arrays of
        one dtype (``kernels/cuda/multi_tensor.cu``): ``adam_update_multi`` (Adam's update of every
        parameter of a group), ``l2_norm_multi`` and ``scale_multi`` (gradient clipping). They
        save launches, which bound a small model's step on a GPU; the CPU answers None for them,
        and the optimiser and clipping then go parameter by parameter.
        """
        return None

    def set_float32_matmul_precision(self, precision: str) -> None:
        """Compute float32 matrix products at ``precision`` ("highest"; "high": TF32 tensor
        cores; "medium": bfloat16 ones; see ``minitensor/core/precision.py``). Only a GPU has the
        lower ones, so by default this does nothing: NumPy multiplies float32 in float32."""

    def matmul(self, a: Array, b: Array) -> Array:
        """``a @ b`` on this device's arrays: every matrix product of the ops (matmul, Linear, the
        streamed attention's tiles, the GRU, the convolution; forward and backward) comes here, so
        that a backend may compute them its own way (the CuPy backend's float32 products on
        bfloat16 tensor cores at precision "medium", and by a direct cuBLAS call inside a CUDA
        graph's capture, where CuPy's own products are refused).

        bfloat16 operands are multiplied as float32 and the result rounded to bfloat16 once
        (``bfloat16_matmul``)."""
        if a.dtype.kind == "V" and is_bfloat16(a.dtype) or b.dtype.kind == "V" and is_bfloat16(b.dtype):
            return self.bfloat16_matmul(a, b)  # (the kind, a field, asked first: every product asks this)
        return a @ b

    def bfloat16_matmul(self, a: Array, b: Array) -> Array:
        """``a @ b`` for bfloat16 operands, as a tensor core computes it: the products of the
        (exactly representable) bfloat16 numbers summed in float32, the result rounded to
        bfloat16 once. Done here as a float32 product of the operands made float32, exact
        since every bfloat16 number is a float32 one: NumPy's BLAS has no bfloat16 GEMM (its
        ``@`` on ml_dtypes' bfloat16 does the same and returns float32), and CuPy's bfloat16
        support is young. On a GPU that is the float32 path, so at precision "medium" the
        bfloat16 tensor cores; a direct bfloat16 GEMM, half the bytes read, is for measuring
        there."""
        return self.astype(self.rounded_matmul(self.astype(a, float32), self.astype(b, float32)), dtypes.bfloat16)

    def rounded_matmul(self, a: Array, b: Array) -> Array:
        """``a @ b`` for float32 ``a`` and ``b`` that hold bfloat16 values (``mt.autocast``'s
        rounded operands, ``round_to_bfloat16``). Every product of two bfloat16 numbers is exact
        in float32, so a GPU may take its bfloat16 tensor cores whatever the float32 precision
        and get the float32 path's result, as PyTorch's autocast takes its bfloat16 GEMM. NumPy
        has no such cores: the float32 product."""
        return self.matmul(a, b)

    # -- bfloat16 and float32 (mt.autocast) ------------------------------------------------------
    @property
    def bfloat16_kernels(self) -> Any:
        """The kernels that convert between float32 and bfloat16 on this device, on the bits
        (``kernels/bfloat16.py``: ``bfloat16_narrow``, ``bfloat16_widen``, ``bfloat16_round``), or
        None for the array library's own ``astype`` (ml_dtypes' casts, one element at a time)."""
        return None

    def astype(self, x: Array, dtype: Any, copy: bool = True) -> Array:
        """``x.astype(dtype, copy=copy)``, float32 to and from bfloat16 through this device's
        ``bfloat16_kernels``: ``mt.autocast`` converts at every product, so those casts are
        fast paths (the same results, bit for bit)."""
        narrow = x.dtype == float32 and is_bfloat16(numpy.dtype(dtype))
        if narrow or (is_bfloat16(x.dtype) and dtype == float32):
            kernels = self.bfloat16_kernels
            if kernels is not None:
                return kernels.bfloat16_narrow(x) if narrow else kernels.bfloat16_widen(x)
        return x.astype(dtype, copy=copy)

    def round_to_bfloat16(self, x: Array) -> Array:
        """float32 (or bfloat16) ``x``'s values rounded to bfloat16, as a new float32 array: a
        product's operands in ``mt.autocast``. Every product of two bfloat16 numbers is exact in
        float32, so a float32 matrix product of such operands is what a bfloat16 tensor core
        computes, the sums in float32; one pass over x where a cast to bfloat16 and back is two."""
        if is_bfloat16(x.dtype):
            return self.astype(x, float32)
        kernels = self.bfloat16_kernels if x.dtype == float32 else None
        return x.astype(dtypes.bfloat16).astype(float32) if kernels is None else kernels.bfloat16_round(x)

    @property
    def kernels(self) -> Any:
        """The fused softmax kernels for this device: an object with ``softmax_forward``,
        ``softmax_backward``, ``log_softmax_forward`` and ``log_softmax_backward`` taking
        C-contiguous 2-D arrays (see ``minitensor/core/kernels``)."""
        raise NotImplementedError

    # -- checks on the data, made without waiting for the device ------------------------------
    #: True when the arrays live in host memory (NumPy), where reading one costs nothing: a
    #: check is then made at once and training reads its loss at every step.
    on_host = False

    #: at most this many checks wait for a read; one more makes them all (a loop that never
    #: reads a number would otherwise keep every step's flags, and the arrays its messages need)
    max_pending_checks = 256

    def check(self, ok: Array | bool, message: str | Callable[[], str], error: type[Exception] = IndexError) -> None:
        """Require ``ok``, a 0-d bool array on this device (True: the data is fine), or raise
        ``error(message)``; ``message`` is a string or a function that makes it, called only
        on failure (so it may read the offending value from the device).

        Here, on a device, nothing is read now: ``(ok, message)`` waits on the device and the
        next explicit read (``raise_failed_checks``) makes every pending check with one
        transfer, raising the first that failed. Until then the op must compute something
        harmless (an index out of range reads row 0, say). The CPU backend raises at once.
        """
        if not self.is_array(ok):  # a flag computed on the host (from host data): free to read
            if not ok:
                raise error(message() if callable(message) else message)
            return
        pending = self.__dict__.setdefault("_pending_checks", [])
        pending.append((ok, message, error))
        if len(pending) > self.max_pending_checks:
            self.raise_failed_checks()

    def raise_failed_checks(self) -> None:
        """Make the pending checks of ``check`` and forget them; raise the first that failed.

        Called where a value is read on the host anyway (``Tensor.item()``, ``.numpy()``,
        ``bool()``, ``.to("cpu")``): the host waits for the device there in any case, and all
        the flags come over in one transfer. The error says it was found late: the traceback
        points at the read, not at the op that failed.
        """
        pending = self.__dict__.pop("_pending_checks", None)
        if not pending or bool(self.xp.stack([ok for ok, _, _ in pending]).all()):
            return
        for ok, message, error in pending:  # something failed: read them one by one to say what
            if not bool(ok):
                text = message() if callable(message) else message
                raise error(f"{text} (checked on the {self.device!r} device, raised at the next read from it)")
