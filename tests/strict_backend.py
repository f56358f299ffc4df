"""A test backend that behaves like a GPU array library where it matters.

The engine promises that adding CuPy touches only ``backends/`` and ``kernels/``: no op may
call ``numpy`` on tensor data or turn device data into a NumPy array behind the user's back.
CuPy enforces that at run time, so a hidden host conversion would only show up on a GPU.
This backend enforces it on any machine: its arrays (``StrictArray``) hold a NumPy array
privately and, like ``cupy.ndarray``,

- refuse implicit conversion (``numpy.asarray(a)`` raises TypeError, as in CuPy: "Implicit
  conversion to a NumPy array is not allowed. Please use `.get()`");
- refuse every NumPy function and ufunc (``__array_ufunc__ = None``, ``__array_function__``
  returns NotImplemented), so ``numpy.exp(a)`` and ``numpy.moveaxis(a, ...)`` fail loudly;
- refuse host arrays as operands (``a + numpy_array`` raises, as in CuPy), while Python and
  NumPy scalars are fine;
- return 0-d arrays, not NumPy scalars, from reductions and element access (as CuPy does);
- allow ``item()``, ``bool()``, ``float()``, ``int()`` on one-element arrays (explicit syncs,
  allowed by CuPy too) and ``get()`` for an explicit host copy;
- have only CuPy's names and keywords: ``xp.errstate`` is an AttributeError, ``a.max(initial=0)``
  and ``xp.zeros(3, like=a)`` are TypeErrors, as they are on a GPU (NumPy has them, CuPy does
  not). What CuPy has is read off a real CuPy into ``cupy_api.json`` by ``scripts/cupy_api.py``;
- hand out garbage from ``xp.empty`` and ``xp.empty_like`` (NaN, or every bit set), as CuPy's
  memory pool hands out a block an earlier array used, where NumPy's fresh pages are zeros.

``xp`` is a stand-in for the ``cupy`` module: every function is NumPy's, wrapped so that
StrictArray arguments are unwrapped and array results wrapped again. The kernels unwrap
explicitly and call the numba CPU kernels: the analogue of a CUDA kernel receiving device
arrays.

Used by ``conftest.py``: ``register_backend(StrictBackend())`` makes ``device="strict"``
available, and the op tests run on both "cpu" and "strict".

It also counts what crosses the bus, which on a GPU is what makes the host wait: inside
``with count_syncs() as log:`` every device->host read (``item()``, ``bool()``, ``float()``,
``int()``, ``get()``, ``tolist()``, ``asnumpy``, and the operations whose *output size* depends
on the data, so that CuPy must read it first: ``nonzero``, boolean-mask indexing, ``argwhere``,
``flatnonzero``, ``unique``, one-argument ``where``...), every explicit synchronisation of the
fake ``cupy.cuda`` (``fake_cupy.py``) and, apart, every host->device upload (``xp.array`` of
host data) is recorded with the innermost ``minitensor/`` frame that caused it.

And it counts what a GPU would launch. A small model's training step on a GPU is bound by the
host, not the device: each CuPy operator is one kernel launch costing 5-20 microseconds of
Python and driver time, while the kernel itself runs for a few. Inside ``with count_launches()
as log:`` every operation that CuPy would run as a kernel is recorded (``Launch``): each ``xp``
function whose result is a new array, each operator (``a + b``, ``-a``, ``a < b``, ``a += b``),
each method that makes a new array (``.sum()``, ``.astype()``, ``.copy()``, a ``.reshape()``
that must copy), ``__setitem__``, an advanced-index ``__getitem__``, a ufunc's ``.at``, an
upload (``xp.array`` of host data: a copy queued like a kernel), each call of a stand-in kernel
(as many launches as the CUDA kernel's method makes) and the copies ``cupy.matmul`` makes of
operands its GEMM cannot read. Views cost no launch (a reshape of contiguous data, a transpose,
a basic slice, ``broadcast_to``), nor does an allocation alone (``xp.empty``).
"""

import contextlib
import functools
import gc
import importlib
import json
import numbers
import operator
import os
import sys
import types
import weakref
from dataclasses import dataclass
from pathlib import Path

import numpy
from minitensor.backends import Backend

import minitensor

_IMPLICIT = (
    "Implicit conversion to a NumPy array is not allowed. Please use `.get()` to construct a NumPy array explicitly."
)


# -- CuPy's API: the names the stand-in has, and what its functions take ------------------------
#: {"names": {dotted name: spec or None}, "ndarray": {method: spec}, "ufunc": {method: spec}}, a spec
#: {positional: [names], keyword: [names], varargs, varkw} or None where CuPy does not say
CUPY_API = json.loads(Path(__file__).with_name("cupy_api.json").read_text())


def check_cupy_call(what, spec, args, kwargs):
    """Refuse, as CuPy's ``what`` would, a keyword it does not take or more positional arguments
    than it has (NumPy's function, which runs the call here, may take both)."""
    if spec is None:
        return
    takes = spec["positional"] + spec["keyword"]
    unknown = [] if spec["varkw"] else [k for k in kwargs if k not in takes]
    if unknown:
        raise TypeError(
            f"{what}() got the keyword {unknown[0]!r}, which CuPy {CUPY_API['cupy']}'s {what} does not take "
            f"(it takes {', '.join(takes) or 'none'}; NumPy's does: tests/cupy_api.json)"
        )
    if len(args) > len(spec["positional"]) and not spec["varargs"]:
        raise TypeError(
            f"{what}() takes at most {len(spec['positional'])} positional arguments in CuPy {CUPY_API['cupy']} "
            f"({', '.join(spec['positional'])}), {len(args)} given"
        )


# -- counting host <-> device traffic ---------------------------------------------------------------
_PACKAGE = os.path.dirname(os.path.abspath(minitensor.__file__))
_ROOT = os.path.dirname(_PACKAGE)


@dataclass(frozen=True)
class Transfer:
    """One crossing: ``kind`` "read" (device -> host: the host waits for the device), "sync"
    (an explicit synchronisation: the host waits) or "upload" (host -> device); ``what`` the
    call ("item()", "bool-mask getitem"...); ``where`` the innermost ``minitensor/`` frame,
    "minitensor/core/ops/loss.py:33 in forward"; ``stack`` every ``minitensor/`` frame, innermost first."""

    kind: str
    what: str
    where: str
    stack: tuple

    def __str__(self):
        # the frame that asked too when the innermost one is a sync point (Tensor.item)
        return f"{self.kind} {self.what} at " + " <- ".join(self.stack[:2] or (self.where,))


class TransferLog:
    """What crossed between host and device while ``count_syncs()`` was recording."""

    def __init__(self):
        self.events = []

    @property
    def waits(self):
        """The reads and synchronisations: every moment the host waited for the device."""
        return [e for e in self.events if e.kind in ("read", "sync")]

    @property
    def uploads(self):
        return [e for e in self.events if e.kind == "upload"]

    def __repr__(self):
        lines = [f"TransferLog: {len(self.waits)} waits, {len(self.uploads)} uploads"]
        return "\n  ".join(lines + [str(e) for e in self.events])


_recording = []  # the TransferLogs of the count_syncs() blocks open now


@contextlib.contextmanager
def _open(logs, log):
    """``log`` among the open ``logs`` for the length of a ``with`` block."""
    logs.append(log)
    try:
        yield log
    finally:
        logs.remove(log)


def count_syncs():
    """``with count_syncs() as log:`` records every transfer of a StrictArray (device "strict"
    and the fake CuPy alike) into ``log`` (a ``TransferLog``)."""
    return _open(_recording, TransferLog())


def _owns_memory(a):
    """Does the NumPy array ``a`` own its memory, alone? (autograd's rule for NumPy arrays)"""
    from minitensor.core.autograd import _owns_memory

    return _owns_memory(a)


def _refcount_of_a_wrapped_array():
    """``sys.getrefcount(a)`` in ``StrictArray.base`` for an array that one StrictArray holds."""

    class Probe:
        __slots__ = ("_a",)

        def count(self):
            a = self._a
            return sys.getrefcount(a)

    probe = Probe()
    probe._a = numpy.empty(2)
    return probe.count()


_WRAPPED_ALONE = _refcount_of_a_wrapped_array()


def _minitensor_frames():
    frame, found = sys._getframe(2), []
    while frame is not None:
        path = os.path.abspath(frame.f_code.co_filename)
        if path.startswith(_PACKAGE + os.sep):
            rel = os.path.relpath(path, _ROOT).replace(os.sep, "/")
            found.append(f"{rel}:{frame.f_lineno} in {frame.f_code.co_name}")
        frame = frame.f_back
    return tuple(found)


def note(kind, what):
    """Record a transfer in every open ``count_syncs()`` log (nothing when none is open). Inside a
    CUDA graph's capture a transfer is an error, as CUDA makes it one."""
    if _captures:
        raise CaptureError(
            f"cudaErrorStreamCaptureUnsupported: operation not permitted when stream is capturing ({kind} {what})"
        )
    if _recording:
        stack = _minitensor_frames()
        event = Transfer(kind, what, stack[0] if stack else "(outside minitensor)", stack)
        for log in _recording:
            log.events.append(event)


# -- counting kernel launches -----------------------------------------------------------------------
@dataclass(frozen=True)
class Launch:
    """One kernel a GPU would run: ``what`` the operation ("xp.zeros", "__add__", ".astype",
    "kernel softmax_forward"...), ``where`` the innermost ``minitensor/`` frame that asked for it."""

    what: str
    where: str

    def __str__(self):
        return f"{self.what} at {self.where}"


class LaunchLog:
    """The launches recorded while ``count_launches()`` was open: ``len(log)`` of them, in order."""

    def __init__(self):
        self.events = []

    def __len__(self):
        return len(self.events)

    def by(self, key="where"):
        """{where (or what, or file): number of launches}, the most first."""
        counts = {}
        for e in self.events:
            k = e.where.split(":")[0] if key == "file" else getattr(e, key)
            counts[k] = counts.get(k, 0) + 1
        return dict(sorted(counts.items(), key=lambda kv: -kv[1]))

    def __repr__(self):
        lines = [f"LaunchLog: {len(self)} launches"]
        return "\n  ".join(lines + [f"{n:5d}  {k}" for k, n in self.by("where").items()])


_launch_logs = []  # the LaunchLogs of the count_launches() blocks open now


def count_launches():
    """``with count_launches() as log:`` records every kernel launch of a StrictArray operation
    (device "strict" and the fake CuPy alike) into ``log`` (a ``LaunchLog``)."""
    return _open(_launch_logs, LaunchLog())


def launched(what):
    """Record one launch in every open ``count_launches()`` log (nothing when none is open)."""
    if _launch_logs:
        stack = _minitensor_frames()
        event = Launch(what, stack[0] if stack else "(outside minitensor)")
        for log in _launch_logs:
            log.events.append(event)


# -- CUDA graphs: what the fake CuPy's Stream.begin_capture records ---------------------------------
class CaptureError(RuntimeError):
    """What CUDA raises for a transfer or a synchronisation inside a stream capture."""


_captures = []  # the captures under way (one at most): each a list of (compute, result)


class Recording:
    """What a capture kept: its launches (``steps``: (compute, result)) and the allocations made
    before the capture that they read or write (``earlier``: (``_Allocation``, what))."""

    def __init__(self, steps, earlier):
        self.steps, self.earlier = steps, earlier


_recordings = weakref.WeakSet()  # the Recordings alive: while there is one, allocations are tracked


def begin_capture():
    """From now on every launch is also kept, as ``compute`` (which runs it again on the same
    arrays) and its result, so that a replay (``replay``) runs it again into the same memory."""
    if _captures:
        raise CaptureError("cudaErrorIllegalState: a capture is already under way")
    if not _recordings:  # no graph alive: nothing tracked since the last one; take stock
        _allocations.clear()
        for obj in gc.get_objects():
            if type(obj) is StrictArray:
                _track(obj)
    _captures.append([])


def end_capture():
    """The launches kept since ``begin_capture``. A GPU runs nothing while it captures, so what
    the capture computed here is spoilt (NaN, or the lowest integer) until the first replay
    writes it: code that reads a captured result without replaying fails the tests."""
    steps = _captures.pop()
    for _, result in steps:
        for a in _arrays_in(result):
            if a.base is None and a.dtype.kind in "fc":
                a.fill(numpy.nan)
            elif a.base is None and a.dtype.kind in "iu":
                a.fill(numpy.iinfo(a.dtype).min)
    earlier = {}
    for compute, _ in steps:
        for a in _numpy_arrays_held(compute):
            owner = _owner(a)
            entry = _allocations.get(id(owner))
            if entry is not None and entry[0]() is owner and not entry[1].in_capture:  # (untracked: host data)
                earlier.setdefault(id(entry[1]), (entry[1], f"{a.dtype} {a.shape}"))
    recording = Recording(steps, list(earlier.values()))
    _recordings.add(recording)
    return recording


def replay(recording):
    """Run the kept launches again, in order, each into the memory of its captured result
    (without NumPy's floating-point warnings, as the captured operators ran: CuPy has none).

    First, as a GPU would not: refuse to run if memory allocated before the capture, which the
    launches read or write, has been freed since (no array over it is left). On a GPU its pool
    hands freed memory to the next array that asks, so the replay would read that array's data,
    or overwrite it, silently; PyTorch's ``torch.cuda.graph`` documents the same rule."""
    for allocation, what in recording.earlier:
        if not allocation.arrays:
            raise CaptureError(
                f"the graph reads memory freed since its capture (a {what} array, allocated before the "
                "capture, has no array left over it): on a GPU its pool may have handed it to another array"
            )
    with numpy.errstate(all="ignore"):
        for compute, result in recording.steps:
            out = compute()
            if result is not None:
                for into, value in zip(_arrays_in(result), _arrays_in_raw(out)):
                    numpy.copyto(into, value, casting="unsafe")


def _arrays_in_raw(obj):
    """The NumPy arrays (and scalars) a compute returned, in ``_arrays_in``'s order."""
    if isinstance(obj, (tuple, list)):
        for o in obj:
            yield from _arrays_in_raw(o)
    elif obj is not None:
        yield obj


def _recorded(compute, in_place=False):
    """Run ``compute`` (a launch) and wrap its result; inside a capture keep it for the replays.
    ``in_place``: it writes into arrays it was given, and its result is not its own memory."""
    out = compute()
    wrapped = _wrap(out)
    if _captures:
        _captures[-1].append((compute, None if in_place or out is None else wrapped))
    return wrapped


def _scalars_read(args):
    """Kernel arguments with 0-d arrays read as numbers: a seed a captured graph keeps on the
    device, which the kernel reads when it runs (at each replay)."""
    return [a[()] if isinstance(a, numpy.ndarray) and a.ndim == 0 else a for a in args]


def _arrays_in(obj):
    """The NumPy arrays inside StrictArrays in ``obj`` (arguments: tuples, lists, dicts)."""
    if isinstance(obj, StrictArray):
        yield obj._a
    elif isinstance(obj, (tuple, list)):
        for o in obj:
            yield from _arrays_in(o)
    elif isinstance(obj, dict):
        for o in obj.values():
            yield from _arrays_in(o)


def _is_new(result, inputs):
    """Did an operation compute ``result`` (a NumPy result, before wrapping) rather than view its
    inputs? A view shares memory with one of them; a NumPy scalar is a 0-d array on CuPy, computed
    (a reduction's). None and non-arrays (a dtype, a shape) are no launch."""
    if isinstance(result, (tuple, list)):  # xp.meshgrid, xp.divmod: one launch if any part is new
        return any(_is_new(r, inputs) for r in result)
    if isinstance(result, numpy.generic):
        return True
    if not isinstance(result, numpy.ndarray):
        return False
    return not any(numpy.may_share_memory(result, a) for a in _arrays_in(inputs))


def _refuse_cublas_in_a_capture():
    """CuPy's products call cuBLAS through wrappers that refuse to run while a stream captures."""
    if _captures:
        raise NotImplementedError("calling cuBLAS API during stream capture is currently unsupported")


def _cupy_matmul_copies(a, b):
    """Record the launches that ``cupy.matmul`` (``cupy/_core/_routines_linalg.pyx``) makes
    before its GEMM on the NumPy arrays ``a`` and ``b``, the operands as CuPy would get them.

    - Matrices (neither operand above 2-D): cuBLAS takes a transpose as a flag, so a copy only
      of an operand that is neither C- nor F-contiguous.
    - Stacks: ``ascontiguousarray`` of both operands, then one strided-batched GEMM. So every
      operand that is not C-contiguous is copied: a head-split view (whose matrices are not
      evenly spaced over batch and heads), and a transposed K too, though cuBLAS could read that
      one with a transpose flag. Where a batch axis broadcasts (1 against n), CuPy builds a table
      of matrix pointers for each of a, b and the output instead: one kernel per batch axis each.
    """
    if not (isinstance(a, numpy.ndarray) and isinstance(b, numpy.ndarray)) or not _launch_logs:
        return
    ndim = max(a.ndim, b.ndim)
    if ndim <= 2:
        for x in (a, b):
            if x.ndim == 2 and not (x.flags.c_contiguous or x.flags.f_contiguous):
                launched("copy in cupy.matmul")
        return
    dtype = numpy.promote_types(a.dtype, b.dtype)
    for x in (a, b):
        if x.ndim > 1 and (not x.flags.c_contiguous or x.dtype != dtype):
            launched("copy in cupy.matmul")
    batch_a = (1,) * (ndim - a.ndim) + a.shape[:-2]
    batch_b = (1,) * (ndim - b.ndim) + b.shape[:-2]
    if any(m != n and 1 in (m, n) for m, n in zip(batch_a, batch_b)):
        for _ in range(3 * (ndim - 2)):
            launched("pointer table in cupy.matmul")


def _has_host_data(obj):
    """Does ``obj`` (an argument of xp.array, an index) hold data that lives on the host?"""
    if isinstance(obj, StrictArray):
        return False
    if isinstance(obj, (tuple, list)):
        return any(_has_host_data(o) for o in obj) if isinstance(obj, tuple) else True
    return isinstance(obj, (numpy.ndarray, numbers.Number, numpy.generic))


def _is_bool_mask(index):
    """Boolean-mask indexing (``a[a > 0]``): the result's size is the number of True elements,
    which CuPy must read from the device before it can allocate the result."""
    parts = index if isinstance(index, tuple) else (index,)
    for p in parts:
        a = p._a if isinstance(p, StrictArray) else p
        if isinstance(a, numpy.ndarray) and a.dtype == bool and a.ndim > 0:
            return True
    return False


def _index_uploads(index):
    """Lists and host arrays inside an index: CuPy copies them to the device."""
    parts = index if isinstance(index, tuple) else (index,)
    return any(isinstance(p, (list, numpy.ndarray)) for p in parts)


def _unwrap(obj, host_ok=False, where="operation"):
    """StrictArrays -> their private NumPy arrays, recursively in tuples, lists and dicts.

    A NumPy array found here came from the host: CuPy refuses it, so do we (unless
    ``host_ok``, for the functions that create device arrays from host data).
    """
    if isinstance(obj, StrictArray):
        return obj._a
    if isinstance(obj, numpy.ndarray):
        if host_ok:
            return obj
        raise TypeError(
            f"strict backend: {where} got a host numpy.ndarray {obj.shape} among device arrays "
            "(CuPy: Unsupported type <class 'numpy.ndarray'>); move it with backend.array() first"
        )
    if isinstance(obj, tuple):
        return tuple(_unwrap(o, host_ok, where) for o in obj)
    if isinstance(obj, list):
        return [_unwrap(o, host_ok, where) for o in obj]
    if isinstance(obj, dict):
        return {k: _unwrap(v, host_ok, where) for k, v in obj.items()}
    return obj


def _wrap(obj):
    """NumPy arrays and scalars -> StrictArrays (CuPy returns 0-d arrays, not scalars)."""
    if isinstance(obj, numpy.ndarray):
        return StrictArray(obj)
    if isinstance(obj, numpy.generic):
        return StrictArray(numpy.asarray(obj))
    if isinstance(obj, tuple):
        return tuple(_wrap(o) for o in obj)
    if isinstance(obj, list):
        return [_wrap(o) for o in obj]
    return obj


def _index(index):
    """Unwrap an index: device arrays inside; lists and host arrays are allowed (CuPy
    converts them) as are ints, slices, None and Ellipsis."""
    return _unwrap(index, host_ok=True)


def _operand(other, op):
    if isinstance(other, StrictArray):
        return other._a
    if isinstance(other, numpy.ndarray):
        raise TypeError(
            f"strict backend: {op} between a device array and a host numpy.ndarray {other.shape} "
            "(CuPy refuses it: Unsupported type <class 'numpy.ndarray'>)"
        )
    if isinstance(other, (numbers.Number, numpy.generic)):
        return other
    return NotImplemented


def _quiet(compute):
    """``compute`` without NumPy's floating-point warnings: CuPy has none (1 / 0 is inf and 0 / 0
    NaN, silently; it has no ``errstate`` either), so code tested here must not count on them."""

    @functools.wraps(compute)
    def quiet(*args, **kwargs):
        with numpy.errstate(all="ignore"):
            return compute(*args, **kwargs)

    return quiet


def _binary(op, name):
    # every operator is one elementwise kernel (in place too: it writes into self); a matrix
    # product is a GEMM, after the copies CuPy makes of operands its GEMM cannot read
    @_quiet
    def forward(self, other):
        b = _operand(other, name)
        if b is NotImplemented:
            return NotImplemented
        if name == "matmul":
            _refuse_cublas_in_a_capture()
            _cupy_matmul_copies(self._a, b)
        launched(f"__{name}__")
        a = self._a
        return _recorded(lambda: op(a, b))

    @_quiet
    def reflected(self, other):
        b = _operand(other, name)
        if b is NotImplemented:
            return NotImplemented
        if name == "matmul":
            _refuse_cublas_in_a_capture()
            _cupy_matmul_copies(b, self._a)
        launched(f"__r{name}__")
        a = self._a
        return _recorded(lambda: op(b, a))

    @_quiet
    def inplace(self, other):
        b = _operand(other, name)
        if b is NotImplemented:
            return NotImplemented
        if name == "matmul":
            _refuse_cublas_in_a_capture()
            _cupy_matmul_copies(self._a, b)
        launched(f"__i{name}__")
        a, iop = self._a, getattr(operator, f"__i{name}__")
        self._a = _recorded(lambda: iop(a, b), in_place=True)._a
        return self

    return forward, reflected, inplace


# -- memory as a GPU frees it: an allocation lives while an array over it does ----------------------
class _Allocation:
    """One allocation (the NumPy array that owns the memory) and the StrictArrays over it: on a
    GPU, CuPy frees the memory once the last of them (views included) is gone."""

    __slots__ = ("arrays", "in_capture")

    def __init__(self):
        # id -> weak reference, each removed as its array goes (StrictArrays have no hash)
        self.arrays, self.in_capture = {}, bool(_captures)

    def add(self, array):
        ref = weakref.ref(array, lambda ref, arrays=self.arrays: arrays.pop(id(ref), None))
        self.arrays[id(ref)] = ref


_allocations = {}  # id(owner) -> (weakref to owner, _Allocation), while a graph is alive


def _owner(a):
    """The NumPy array that owns ``a``'s memory (``a`` itself, or the array it views)."""
    while isinstance(a.base, numpy.ndarray):
        a = a.base
    return a


def _track(array):
    """Count ``array`` (a StrictArray) among the arrays over its allocation."""
    owner = _owner(array._a)
    key = id(owner)
    entry = _allocations.get(key)
    if entry is None or entry[0]() is not owner:

        def forget(ref, key=key):
            if _allocations.get(key, (None,))[0] is ref:
                del _allocations[key]

        entry = _allocations[key] = (weakref.ref(owner, forget), _Allocation())
    entry[1].add(array)


def _numpy_arrays_held(obj, depth=0):
    """The NumPy arrays a kept launch (a closure) holds: in its cells, their tuples, lists, dicts
    (a NamedTuple of cuBLAS arguments too), StrictArrays and the closures they hold."""
    if depth > 8:
        return
    if isinstance(obj, numpy.ndarray):
        yield obj
    elif isinstance(obj, StrictArray):
        yield obj._a
    elif isinstance(obj, (tuple, list)):
        for o in obj:
            yield from _numpy_arrays_held(o, depth + 1)
    elif isinstance(obj, dict):
        for o in obj.values():
            yield from _numpy_arrays_held(o, depth + 1)
    elif isinstance(obj, types.FunctionType) and obj.__closure__:
        for cell in obj.__closure__:
            with contextlib.suppress(ValueError):  # an empty cell
                yield from _numpy_arrays_held(cell.cell_contents, depth + 1)


class StrictArray:
    """A NumPy array that behaves like a ``cupy.ndarray``: see the module docstring."""

    __slots__ = ("_a", "__weakref__")
    __array_ufunc__ = None  # numpy.exp(a), a_numpy + a: refused
    __hash__ = None  # like ndarray: == is elementwise

    def __init__(self, a):
        assert isinstance(a, numpy.ndarray), type(a)
        self._a = a
        if _captures or _recordings:  # a graph may read this memory: track whether it is freed
            _track(self)

    # -- refusing the host ----------------------------------------------------------
    def __array__(self, dtype=None, copy=None):
        raise TypeError(_IMPLICIT)

    def __array_function__(self, func, types, args, kwargs):
        return NotImplemented  # numpy.moveaxis(a, ...) etc.: TypeError from NumPy

    def get(self):
        """An explicit host copy (``cupy.ndarray.get()``)."""
        note("read", "get()")
        return self._a.copy()

    # -- metadata ---------------------------------------------------------------------
    shape = property(lambda self: self._a.shape)
    ndim = property(lambda self: self._a.ndim)
    dtype = property(lambda self: self._a.dtype)
    size = property(lambda self: self._a.size)
    itemsize = property(lambda self: self._a.itemsize)
    nbytes = property(lambda self: self._a.nbytes)
    strides = property(lambda self: self._a.strides)
    flags = property(lambda self: self._a.flags)
    T = property(lambda self: _wrap(self._a.T))

    @property
    def base(self):
        """CuPy's ``base``: None when this array's memory is its own, else the array it views.
        Here the memory is a NumPy array's, its own when it is no view (or one of the numba
        MemInfo that a kernel allocated it with, held by it alone) and no other StrictArray
        wraps it: where NumPy hands back its argument (``asarray``, ``ascontiguousarray`` of
        contiguous data) CuPy returns the same array object, and here two wrappers share one."""
        a = self._a
        if sys.getrefcount(a) == _WRAPPED_ALONE and _owns_memory(a):
            return None
        return StrictArray(a.base if isinstance(a.base, numpy.ndarray) else a)

    def __len__(self):
        return len(self._a)

    def __iter__(self):
        if self._a.ndim == 0:
            raise TypeError("iteration over a 0-d array")
        return (StrictArray(self._a[i]) for i in range(len(self._a)))

    def __repr__(self):
        return f"StrictArray({self._a!r})"

    # -- explicit synchronisation points CuPy allows on one-element arrays -------------
    def _scalar(self, what):
        if self._a.size != 1:
            raise TypeError(f"{what}: only one-element arrays can be converted, this one has shape {self._a.shape}")
        return self._a.reshape(()).item()

    def item(self):
        if self._a.size != 1:
            raise ValueError("can only convert an array of size 1 to a Python scalar")
        note("read", "item()")
        return self._a.item()

    def __bool__(self):
        if self._a.size != 1:
            raise ValueError("The truth value of an array with more than one element is ambiguous.")
        note("read", "bool()")
        return bool(self._a.reshape(()).item())

    def __float__(self):
        value = float(self._scalar("float()"))
        note("read", "float()")
        return value

    def __int__(self):
        value = int(self._scalar("int()"))
        note("read", "int()")
        return value

    def __index__(self):
        # range(a), list[a], a as a shape: an integer read from the device
        if self._a.dtype.kind not in "iu" or self._a.ndim:
            raise TypeError("only integer scalar arrays can be converted to a scalar index")
        note("read", "__index__")
        return int(self._a)

    def tolist(self):
        note("read", "tolist()")
        return self._a.tolist()

    def nonzero(self):
        note("read", "nonzero()")
        return _wrap(self._a.nonzero())

    # -- indexing ------------------------------------------------------------------------
    def __getitem__(self, index):
        if _is_bool_mask(index):
            note("read", "bool-mask getitem")
        if _index_uploads(index):
            note("upload", "host index")
        a, i = self._a, _index(index)
        out = a[i]
        if isinstance(out, numpy.generic):  # an element: on CuPy a 0-d view of it, here too
            out = a[(*(i if isinstance(i, tuple) else (i,)), Ellipsis)]
        # a basic index is a view (a[0] too: a 0-d view on CuPy, where NumPy gives a scalar);
        # an advanced one gathers into a new array
        if isinstance(out, numpy.ndarray) and not numpy.may_share_memory(out, a):
            launched("getitem")
            if _captures:
                _captures[-1].append((lambda: a[i], _wrap(out)))
                return _captures[-1][-1][1]
        return _wrap(out)

    def __setitem__(self, index, value):
        if _is_bool_mask(index):  # CuPy counts the True elements on the host here too
            note("read", "bool-mask setitem")
        if _index_uploads(index):
            note("upload", "host index")
        launched("setitem")
        a, i, v = self._a, _index(index), _unwrap(value, where="__setitem__")
        _recorded(lambda: a.__setitem__(i, v), in_place=True)

    # -- unary operators -------------------------------------------------------------------
    def __neg__(self):
        launched("__neg__")
        a = self._a
        return _recorded(lambda: -a)

    def __pos__(self):
        launched("__pos__")
        a = self._a
        return _recorded(lambda: +a)

    def __abs__(self):
        launched("__abs__")
        a = self._a
        return _recorded(lambda: abs(a))

    def __invert__(self):
        launched("__invert__")
        a = self._a
        return _recorded(lambda: ~a)


def _method(name):
    spec = CUPY_API["ndarray"][name]  # (a KeyError here: a method cupy.ndarray does not have)

    @_quiet
    def method(self, *args, **kwargs):
        check_cupy_call(f"ndarray.{name}", spec, args, kwargs)
        args, kwargs = _unwrap(args, where=name), _unwrap(kwargs, where=name)
        a = self._a
        out = getattr(a, name)(*args, **kwargs)
        # a new array was computed (.sum, .astype, a copying .reshape), or self changed in place
        # (.fill, .sort return None); .T, .transpose, .view, a .reshape of contiguous data: views
        if out is None or _is_new(out, self):
            launched(f".{name}")
            if _captures:
                wrapped = _wrap(out)
                _captures[-1].append((lambda: getattr(a, name)(*args, **kwargs), None if out is None else wrapped))
                return wrapped
        return _wrap(out)

    method.__name__ = name
    return method


# Methods (cupy.ndarray has them all): arguments unwrapped, array results wrapped.
for _name in (
    "reshape",
    "astype",
    "sum",
    "mean",
    "max",
    "min",
    "argmax",
    "argmin",
    "any",
    "all",
    "copy",
    "transpose",
    "swapaxes",
    "squeeze",
    "ravel",
    "flatten",
    "clip",
    "prod",
    "var",
    "std",
    "cumsum",
    "fill",
    "repeat",
    "take",
    "dot",
    "round",
    "sort",
    "argsort",
    "view",
):
    setattr(StrictArray, _name, _method(_name))

# Arithmetic, comparison and logical operators, forward / reflected / in place.
for _name, _op in (
    ("add", operator.add),
    ("sub", operator.sub),
    ("mul", operator.mul),
    ("truediv", operator.truediv),
    ("floordiv", operator.floordiv),
    ("mod", operator.mod),
    ("pow", operator.pow),
    ("matmul", operator.matmul),
    ("and", operator.and_),
    ("or", operator.or_),
    ("xor", operator.xor),
    ("lshift", operator.lshift),
    ("rshift", operator.rshift),
):
    _f, _r, _i = _binary(_op, _name)
    setattr(StrictArray, f"__{_name}__", _f)
    setattr(StrictArray, f"__r{_name}__", _r)
    setattr(StrictArray, f"__i{_name}__", _i)
for _name in ("eq", "ne", "lt", "le", "gt", "ge"):
    setattr(StrictArray, f"__{_name}__", _binary(getattr(operator, _name), _name)[0])
del _name, _op, _f, _r, _i


# -- the "cupy" module ----------------------------------------------------------------------
_FROM_HOST = {"array", "asarray", "asanyarray"}  # cupy.array(host) is the explicit upload


# functions that allocate and compute nothing: no kernel (cupy.zeros fills: a launch)
_ALLOCATE_ONLY = {"empty", "empty_like"}


def _garbage(array):
    """What ``cupy.empty`` hands out: a block of CuPy's memory pool that an earlier array used, not
    zeros (which NumPy's fresh pages are). NaN in a float array, every bit set in an integer one,
    True in a bool one: an op that reads memory it got from ``xp.empty`` before writing it fails
    its test here, as it would compute with garbage on a GPU."""
    if array.dtype.kind in "fc":
        array.fill(numpy.nan)
    elif array.dtype.kind == "b":
        array.fill(True)
    elif array.dtype.kind in "iu":  # every bit set: -1, or the largest unsigned value
        array.fill(numpy.iinfo(array.dtype).max if array.dtype.kind == "u" else -1)


# functions that write into an array they are given and return None: a kernel each
_WRITE_IN_PLACE = {"copyto", "put", "place", "putmask", "fill_diagonal"}

# functions whose output size depends on the data: CuPy reads it from the device first
_DATA_SIZED = {"nonzero", "argwhere", "flatnonzero", "unique", "extract", "compress"}


class _Function:
    """A NumPy function that takes and returns StrictArrays."""

    def __init__(self, fn, name):
        self._fn, self._name = fn, name
        self._host_ok = name in _FROM_HOST

    @_quiet
    def __call__(self, *args, **kwargs):
        where = f"xp.{self._name}"
        check_cupy_call(where, self._spec(), args, kwargs)
        if self._name in _DATA_SIZED or (self._name == "where" and len(args) + len(kwargs) == 1):
            note("read", where)
        elif self._host_ok and _has_host_data(args[:1]):
            note("upload", where)
        if self._name in ("matmul", "dot", "tensordot", "einsum", "inner", "vdot"):
            _refuse_cublas_in_a_capture()
        if self._name == "matmul" and len(args) >= 2:
            _cupy_matmul_copies(*_unwrap(args[:2], where=where))
        fn, uargs, ukwargs = self._fn, _unwrap(args, self._host_ok, where), _unwrap(kwargs, self._host_ok, where)
        out = fn(*uargs, **ukwargs)
        if self._name in _ALLOCATE_ONLY:
            _garbage(out)
        if self._launches(out, args, kwargs):
            launched(where)
            if _captures:  # into out= (or .at's target): in place; else a result of its own
                wrapped = _wrap(out)
                in_place = out is None or "out" in kwargs
                _captures[-1].append((lambda: fn(*uargs, **ukwargs), None if in_place else wrapped))
                return wrapped
        return _wrap(out)

    def _spec(self):
        return CUPY_API["names"].get(self._name)

    def _launches(self, out, args, kwargs):
        """Would CuPy run a kernel for this call? For one that computes a new array or writes
        into ``out=`` (or into its first argument: ``copyto``); not for a view (``xp.reshape``,
        ``xp.broadcast_to``, ``ascontiguousarray`` of contiguous data) nor for ``xp.empty``,
        which only allocates."""
        if self._name in _ALLOCATE_ONLY:
            return False
        return "out" in kwargs or self._name in _WRITE_IN_PLACE or _is_new(out, (args, kwargs))

    def __repr__(self):
        return f"<strict xp.{self._name}>"


class _Ufunc(_Function):
    """A ufunc: callable, plus ``at``, ``reduce``, ``accumulate``, ``outer``, ``reduceat``."""

    def __getattr__(self, name):
        attr = getattr(self._fn, name)
        if callable(attr):
            if name not in CUPY_API["ufunc"]:
                raise AttributeError(f"CuPy's ufunc has no method {name!r} (tests/cupy_api.json)")
            return _Ufunc(attr, f"{self._name}.{name}")
        return attr

    def _spec(self):
        ufunc, _, method = self._name.rpartition(".")
        return CUPY_API["ufunc"][method] if ufunc else CUPY_API["names"].get(self._name)

    def _launches(self, out, args, kwargs):
        # a ufunc always computes: a new array, into out= (positional too), or in place (.at)
        return True


class StrictNamespace:
    """``xp``: NumPy's namespace seen through StrictArrays, like the ``cupy`` module."""

    def __init__(self, module, prefix=""):
        self._module, self._prefix = module, prefix

    def __getattr__(self, name):
        if name == "ndarray":
            return StrictArray
        attr = getattr(self._module, name)  # AttributeError for names NumPy lacks
        full = self._prefix + name
        if full not in CUPY_API["names"] and not name.startswith("__"):
            raise AttributeError(
                f"module 'cupy' has no attribute {full!r} (NumPy has it; CuPy {CUPY_API['cupy']} does not: "
                "tests/cupy_api.json)"
            )
        if isinstance(attr, numpy.ufunc):
            out = _Ufunc(attr, full)
        elif isinstance(attr, type):  # dtypes (xp.float32), xp.dtype
            out = attr
        elif type(attr).__name__ == "module":
            out = StrictNamespace(attr, full + ".")
        elif callable(attr):
            out = _Function(attr, full)
        else:  # constants: xp.inf, xp.pi, xp.newaxis
            out = attr
        setattr(self, name, out)  # cache
        return out

    @property
    def __name__(self):
        """The name of the module this namespace plays: NumPy's (its submodule's) for the "strict"
        device's ``xp``, "cupy" for one with CuPy's ``cuda`` submodule (``fake_cupy.FakeCupy``).
        Code that picks kernels by library asks it: ``kernels/gelu.py``'s ``for_backend``."""
        return "cupy" if "cuda" in vars(self) else self._module.__name__

    def __repr__(self):
        return "<strict xp (NumPy behind CuPy's manners)>"


strict_xp = StrictNamespace(numpy)


# -- the kernels: explicit unwrapping, as a CUDA kernel receives device pointers --------------
def _device_rows(x, what):
    if not isinstance(x, StrictArray):
        raise TypeError(f"strict kernel {what}: expected a device array, got {type(x).__name__}")
    a = x._a
    if a.ndim != 2 or not a.flags.c_contiguous:
        raise ValueError(f"strict kernel {what}: needs a C-contiguous 2-D array, got shape {a.shape}")
    return a


def _device_lens(lens, rows):
    if lens is None:
        return None
    if not isinstance(lens, StrictArray):
        raise TypeError(f"strict kernel: lens must be a device array, got {type(lens).__name__}")
    a = lens._a
    if a.shape != (rows,) or a.dtype.kind not in "iu":
        raise ValueError(f"strict kernel: lens must be integers of shape ({rows},), got {a.dtype} {a.shape}")
    return a


class StrictKernels:
    """The four softmax kernels of ``minitensor.kernels`` on StrictArrays; below the class, the
    fused kernels the GPU backend has too (dropout, ReLU, layer norm, Adam, GELU: the CPU's, which
    its CUDA kernels equal). Each call is one launch for ``count_launches``."""

    #: the array library of the reference GELU, for dtypes the GELU kernels do not take (float16):
    #: ``kernels/gelu.py``'s ``CudaGelu`` reads ``kernels.xp`` as it reads ``CudaKernels.xp``
    xp = strict_xp

    def attention_row_size(self, dtype, d):
        """No streamed-attention kernel here: ``flash_attention`` runs its tiles of CuPy operators."""
        return None

    @staticmethod
    def _impl():
        from minitensor.kernels import cpu

        return cpu

    def softmax_forward(self, x, lens=None):
        a = _device_rows(x, "softmax_forward")
        launched("kernel softmax_forward")
        impl, lens = self._impl(), _device_lens(lens, a.shape[0])
        return _recorded(lambda: impl.softmax_forward(a, lens))

    def softmax_backward(self, y, g):
        launched("kernel softmax_backward")
        impl, y, g = self._impl(), _device_rows(y, "softmax_backward"), _device_rows(g, "softmax_backward")
        return _recorded(lambda: impl.softmax_backward(y, g))

    def log_softmax_forward(self, x, lens=None):
        a = _device_rows(x, "log_softmax_forward")
        launched("kernel log_softmax_forward")
        impl, lens = self._impl(), _device_lens(lens, a.shape[0])
        return _recorded(lambda: impl.log_softmax_forward(a, lens))

    def log_softmax_backward(self, y, g):
        launched("kernel log_softmax_backward")
        impl, y, g = self._impl(), _device_rows(y, "log_softmax_backward"), _device_rows(g, "log_softmax_backward")
        return _recorded(lambda: impl.log_softmax_backward(y, g))

    # The exact GELU: CUDA's gelu_forward / gelu_backward (``CudaKernels``), here the numba CPU
    # kernels of kernels/gelu.py, which compute the same function. A backend on the fake CuPy
    # gets them through ``kernels/gelu.py``'s ``for_backend`` (its xp is named "cupy"); the
    # "strict" device, whose xp is named "numpy", keeps the reference of array operations.
    def gelu_forward(self, x):
        from minitensor.kernels.gelu import CpuGelu

        x = _kernel_input(x, "gelu_forward")
        launched("kernel gelu_forward")
        return _recorded(lambda: CpuGelu.forward(x))

    def gelu_backward(self, x, g):
        from minitensor.kernels.gelu import CpuGelu

        x = _kernel_input(x, "gelu_backward")
        g = _kernel_input(g, "gelu_backward", x.dtype)
        launched("kernel gelu_backward")
        return _recorded(lambda: CpuGelu.backward(x, g))


def _kernel_input(a, name, dtype=None):
    """A StrictArray argument of the kernel ``name``, unwrapped and C-contiguous, as a CUDA kernel
    reads it. Like ``CudaKernels`` (``xp.ascontiguousarray``), an array that is not, or not of
    ``dtype``, is copied first: one more launch."""
    if isinstance(a, StrictArray):
        a = _unwrap(a, where=name)
        if not a.flags.c_contiguous or (dtype is not None and a.dtype != dtype):
            launched(f"xp.ascontiguousarray for kernel {name}")
            source = a
            a = _recorded(lambda: numpy.ascontiguousarray(source, dtype=dtype))._a
    return a


def _on_device_arrays(name, module="fused"):
    """The CPU's kernel ``name`` of ``minitensor.kernels.<module>`` (fused.py, bfloat16.py) on
    StrictArrays: what the GPU backend's own kernel of that name computes (in place where the
    CPU's is: the unwrapped arrays are the device arrays)."""

    def run(self, *args):
        arrays = [_kernel_input(a, name) for a in args]
        launched(f"kernel {name}")
        for what in _MORE_LAUNCHES.get(name, ()):
            launched(what)
        kernel = getattr(importlib.import_module(f"minitensor.kernels.{module}"), name)
        return _recorded(lambda: kernel(*_scalars_read(arrays)))

    run.__name__ = name
    return run


# What CudaKernels (kernels/cuda) launches beyond the one kernel: layer norm's backward sums
# the weight's and the bias's gradients over rows in partial sums, then adds those up.
_MORE_LAUNCHES = {
    "layer_norm_backward": ("kernel layer_norm_backward_columns", "kernel layer_norm_backward_finish"),
}

# the GPU backend's names for them: its dropout is fused.dropout_forward (the same mask)
for _attribute, _name in (
    ("dropout", "dropout_forward"),
    ("relu_forward", "relu_forward"),
    ("relu_backward", "relu_backward"),
    ("layer_norm_forward", "layer_norm_forward"),
    ("layer_norm_backward", "layer_norm_backward"),
    ("adam_update", "adam_update"),
):
    setattr(StrictKernels, _attribute, _on_device_arrays(_name))
# mt.autocast's conversions between float32 and bfloat16 (elementwise.cu's, kernels/bfloat16.py's)
for _name in ("bfloat16_narrow", "bfloat16_widen", "bfloat16_round"):
    setattr(StrictKernels, _name, _on_device_arrays(_name, "bfloat16"))


class StrictBackend(Backend):
    """device "strict": NumPy underneath, CuPy's manners on top."""

    device = "strict"
    xp = strict_xp

    def __init__(self):
        self._rng = numpy.random.default_rng()
        self._kernels = StrictKernels()

    def array(self, data, dtype=None):
        if isinstance(data, StrictArray):
            return StrictArray(numpy.array(data._a, dtype=dtype))
        note("upload", "backend.array")
        return StrictArray(numpy.array(data, dtype=dtype))

    def to_numpy(self, array):
        return array.get()

    def is_array(self, obj):
        return isinstance(obj, StrictArray)

    def memory_owner(self, array):
        # The NumPy array underneath: a StrictArray's ``base`` is a new wrapper at every call
        # (it answers CuPy's question by reference counts), never the same object twice.
        return _owner(array._a)

    def seed(self, seed):
        self._rng = numpy.random.default_rng(seed)

    def normal(self, shape, dtype):  # float32 or float64 drawn, as cuRAND (float16 converted)
        drawn = dtype if numpy.dtype(dtype) in (numpy.float32, numpy.float64) else numpy.float32
        return StrictArray(self._rng.standard_normal(shape, dtype=drawn).astype(dtype))

    def random(self, shape, dtype):
        drawn = dtype if numpy.dtype(dtype) in (numpy.float32, numpy.float64) else numpy.float32
        return StrictArray(self._rng.random(shape, dtype=drawn).astype(dtype))

    def integers(self, low, high, shape):
        return StrictArray(self._rng.integers(low, high, shape, dtype=numpy.int64))

    def draw_seed(self):  # on the host, as the CuPy backend draws it: no wait for the device
        return int(self._rng.integers(0, 2**62, dtype=numpy.int64))

    def index_add(self, target, index, values):
        # cupyx.scatter_add(target, index, values) on a GPU
        numpy.add.at(_unwrap(target, where="index_add"), _index(index), _unwrap(values, where="index_add"))

    @property
    def kernels(self):
        return self._kernels
