"""Making new tensors: zeros, ones, full, empty, arange, linspace, eye, randn, rand, normal, randint,
randperm, multinomial, ``*_like``, ``from_numpy``, ``from_dlpack``."""

import math
from typing import Any

import numpy

from .autograd import Function
from .backends import Backend, get_backend
from .dtypes import as_dtype, float32, is_floating
from .errors import DeviceError, DTypeError, ShapeError
from .ops.join import is_count
from .tensor import Device, DType, Shape, Tensor, tensor  # noqa: F401  (tensor is re-exported)


def _shape(op: str, shape: tuple[Any, ...], dtype: DType, backend: Backend) -> tuple[Any, ...]:
    """The shape of a new tensor, given as ``zeros(2, 3)`` or ``zeros((2, 3))``, checked before
    anything is allocated: whole numbers >= 0, and a result the device's memory can hold (a
    mistyped size is refused in words instead of filling the memory)."""
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    shape = tuple(shape)  # Any, not int: under mt.onnx.export a length may be a traced dimension (an int)
    for n in shape:
        if (type(n) is not int or n < 0) and not is_count(n):  # (the first test passes most lengths)
            whole = all(isinstance(n, (int, numpy.integer)) and not isinstance(n, bool) for n in shape)
            raise (ValueError if whole else TypeError)(f"{op}: a shape is whole numbers >= 0, got {shape}")
    backend.check_fits(op, shape, numpy.dtype(dtype).itemsize)
    return shape


class Full(Function):
    """A new array of ``shape`` filled with ``fill``: what ``zeros``, ``ones`` and ``full`` make.

    A Function with no Tensor input (``apply`` takes its device from ``device=``), outside the
    graph: it goes through ``apply`` so that a tracer sees it (``mt.onnx`` keeps a length of the
    traced input in ``shape`` computed, ``zeros(batch_size, num_hiddens)``)."""

    differentiable = False

    @staticmethod
    def forward(ctx: Any, shape: tuple[Any, ...], fill: Any, dtype: DType, device: Device) -> Any:
        if fill == 0:  # zeros: calloc'd memory, which costs nothing until it is written
            return ctx.xp.zeros(shape, dtype=dtype)
        return ctx.xp.full(shape, fill, dtype=dtype)


class Arange(Function):
    """start, start + step, ... below stop, a 1-D array (``arange``); a maker as ``Full`` is."""

    differentiable = False

    @staticmethod
    def forward(ctx: Any, start: float, stop: float, step: float, dtype: DType, device: Device) -> Any:
        return ctx.xp.arange(start, stop, step, dtype=dtype)


class Linspace(Function):
    """``steps`` evenly spaced numbers from start to end, both included (``linspace``); a maker
    as ``Full`` is."""

    differentiable = False

    @staticmethod
    def forward(ctx: Any, start: float, end: float, steps: int, dtype: DType, device: Device) -> Any:
        return ctx.xp.linspace(start, end, steps).astype(dtype, copy=False)  # (computed in float64)


class Eye(Function):
    """The identity matrix, n x m: ones on the diagonal (``eye``); a maker as ``Full`` is."""

    differentiable = False

    @staticmethod
    def forward(ctx: Any, n: int, m: int, dtype: DType, device: Device) -> Any:
        return ctx.xp.eye(n, m, dtype=dtype)


_REAL = (int, float, numpy.integer, numpy.floating)


def _finite_numbers(op: str, **values: Any) -> list[Any]:
    """The bounds of ``arange`` or ``linspace`` as numbers (a one-element Tensor read), each
    checked finite and named in the error where it is not."""
    numbers = []
    for name, v in values.items():
        v = v.item() if isinstance(v, Tensor) else v
        if isinstance(v, bool) or not isinstance(v, _REAL) or not math.isfinite(v):
            raise ValueError(f"{op}: {name} must be a finite number, got {v!r}")
        numbers.append(v)
    return numbers


def _float_dtype(op: str, dtype: DType) -> numpy.dtype:
    """``dtype`` (float32 if None) for a maker of real-valued samples, which integers cannot hold."""
    dtype = as_dtype(dtype, op) or float32
    if not is_floating(dtype):
        raise DTypeError(f"{op}: draws real numbers, which dtype {dtype} cannot hold; use randint for integers")
    return dtype


def _full(op: str, shape: tuple[Any, ...], fill: Any, dtype: DType, device: Device, requires_grad: bool) -> Tensor:
    dtype = as_dtype(dtype, op) or float32
    t = Full.apply(_shape(op, shape, dtype, get_backend(device)), fill, dtype=dtype, device=device)
    return t.requires_grad_(True) if requires_grad else t


def _leaf(data: Any, backend: Backend, requires_grad: bool) -> Tensor:
    t = Tensor._make(data, backend, None)
    return t.requires_grad_(True) if requires_grad else t


def zeros(*shape: Shape, dtype: DType = None, device: Device = "cpu", requires_grad: bool = False) -> Tensor:
    """A new leaf tensor of the given shape filled with 0: ``zeros(2, 3)`` or ``zeros((2, 3))``.

    ``dtype`` defaults to float32; ``device`` is ``"cpu"`` or ``"cuda"``; ``requires_grad=True``
    makes it a leaf that collects gradients (floating-point dtypes only).
    """
    return _full("zeros", shape, 0, dtype, device, requires_grad)


def ones(*shape: Shape, dtype: DType = None, device: Device = "cpu", requires_grad: bool = False) -> Tensor:
    """A new leaf tensor of the given shape filled with 1: ``ones(2, 3)`` or ``ones((2, 3))``;
    ``dtype`` (default float32), ``device`` and ``requires_grad`` as for ``zeros``."""
    return _full("ones", shape, 1, dtype, device, requires_grad)


def full(
    shape: Shape, fill_value: float, dtype: DType = None, device: Device = "cpu", requires_grad: bool = False
) -> Tensor:
    """A new leaf tensor of shape ``shape`` (an int or a tuple) filled with ``fill_value``;
    ``device`` and ``requires_grad`` as for ``zeros``. Without ``dtype``, the fill value's kind
    decides, as in PyTorch: ``full((2,), 7.0)`` is float32, ``full((2,), 7)`` int64,
    ``full((2,), True)`` bool."""
    shape = (shape,) if isinstance(shape, (int, numpy.integer)) else shape
    if isinstance(fill_value, Tensor):  # a one-element tensor, as PyTorch takes a 0-d one
        fill_value = fill_value.item()
    if not isinstance(fill_value, (*_REAL, numpy.bool_)):  # (None would fill NaN, a list broadcast)
        raise TypeError(f"full: fill_value must be a number, got {type(fill_value).__name__} {fill_value!r:.40}")
    if isinstance(fill_value, int) and not -(2**63) <= fill_value < 2**63:
        raise ValueError(f"full: fill_value {fill_value} is outside int64's range")
    if dtype is None and isinstance(fill_value, (bool, numpy.bool_)):
        dtype = "bool"
    elif dtype is None and isinstance(fill_value, (int, numpy.integer)):
        dtype = "int64"
    return _full("full", (shape,), fill_value, dtype, device, requires_grad)


def arange(
    start: float, stop: float | None = None, step: float = 1, dtype: DType = None, device: Device = "cpu"
) -> Tensor:
    """``arange(stop)`` or ``arange(start, stop, step=1)``: the numbers start, start + step, ...
    below ``stop``, as a 1-D tensor, like ``range``. Integers give int64, any float argument
    gives float32 (unless ``dtype`` says otherwise)."""
    if stop is None:
        start, stop = 0, start
    start, stop, step = _finite_numbers("arange", start=start, stop=stop, step=step)
    if step == 0:
        raise ValueError(f"arange: step must not be zero (start={start!r}, stop={stop!r})")
    if dtype is None:
        dtype = "float32" if any(isinstance(v, float) for v in (start, stop, step)) else "int64"
    dtype = as_dtype(dtype, "arange")
    if not is_floating(dtype) and step != int(step):
        raise ValueError(f"arange: dtype {dtype} needs a whole-number step, got {step!r}")
    backend = get_backend(device)
    backend.check_fits("arange", (max(0, math.ceil((stop - start) / step)),), dtype.itemsize)
    return Arange.apply(start, stop, step, dtype=dtype, device=device)


def linspace(
    start: float,
    end: float,
    steps: int,
    dtype: DType = None,
    device: Device = "cpu",
    requires_grad: bool = False,
) -> Tensor:
    """``steps`` evenly spaced numbers from ``start`` to ``end``, both included: start + i (end -
    start) / (steps - 1) for i = 0..steps-1, a 1-D tensor, float32 unless ``dtype`` says otherwise
    (``linspace(-4, 4, 9)``: the x axis of D2L 5.1's activation plots). ``steps`` is required,
    as in PyTorch; ``device`` and ``requires_grad`` as for ``zeros``."""
    start, end = _finite_numbers("linspace", start=start, end=end)
    if not is_count(steps):
        raise ValueError(f"linspace: steps must be an integer >= 0, got {steps!r}")
    dtype = as_dtype(dtype, "linspace") or float32
    get_backend(device).check_fits("linspace", (int(steps),), max(numpy.dtype(dtype).itemsize, 8))
    t = Linspace.apply(float(start), float(end), int(steps), dtype=dtype, device=device)
    return t.requires_grad_(True) if requires_grad else t


def eye(
    n: int, m: int | None = None, dtype: DType = None, device: Device = "cpu", requires_grad: bool = False
) -> Tensor:
    """The n x m (default n x n) identity matrix: ones where row = column, zeros elsewhere.
    D2L 11.1 shows it as the attention weights of queries that attend only to their own key."""
    m = n if m is None else m
    if not (is_count(n) and is_count(m)):
        raise ValueError(f"eye: n and m must be integers >= 0, got n={n!r}, m={m!r}")
    dtype = as_dtype(dtype, "eye") or float32
    backend = get_backend(device)
    backend.check_fits("eye", (int(n), int(m)), numpy.dtype(dtype).itemsize)
    t = Eye.apply(int(n), int(m), dtype=dtype, device=device)
    return t.requires_grad_(True) if requires_grad else t


def randn(*shape: Shape, dtype: DType = None, device: Device = "cpu", requires_grad: bool = False) -> Tensor:
    """Standard normal samples from the device's seeded generator (``mt.manual_seed``)."""
    b, dtype = get_backend(device), _float_dtype("randn", dtype)
    return _leaf(b.normal(_shape("randn", shape, dtype, b), dtype), b, requires_grad)


def rand(*shape: Shape, dtype: DType = None, device: Device = "cpu", requires_grad: bool = False) -> Tensor:
    """A new tensor of the given shape with samples of U(0, 1), uniform in [0, 1): ``rand(2, 3)``
    or ``rand((2, 3))``; ``dtype`` (default float32), ``device`` and ``requires_grad`` as for
    ``zeros``."""
    b, dtype = get_backend(device), _float_dtype("rand", dtype)
    return _leaf(b.uniform(_shape("rand", shape, dtype, b), dtype), b, requires_grad)


def normal(
    mean: float | Tensor = 0.0,
    std: float | Tensor = 1.0,
    size: Shape | None = None,
    dtype: DType = None,
    device: Device = None,
    requires_grad: bool = False,
) -> Tensor:
    """Samples of the normal distribution N(mean, std^2), as PyTorch's ``normal``: numbers and a
    ``size`` (``normal(0.0, 0.5, (50,))``, D2L 11.2's noise), or tensors of means and/or standard
    deviations, broadcast, one sample each. mean + std * randn(...), from the device's seeded
    generator; the samples are a new leaf (no gradient flows back to a tensor ``mean`` or ``std``)."""
    tensors = [t for t in (mean, std) if isinstance(t, Tensor)]
    if not tensors and size is None:
        raise ValueError("normal: give size with numbers for mean and std, e.g. normal(0.0, 1.0, (2, 3))")
    if tensors and size is not None:
        raise ValueError("normal: size goes with numbers for mean and std; with tensors, the shape is theirs")
    if len(tensors) == 2 and tensors[0]._backend is not tensors[1]._backend:
        raise DeviceError(f"normal: mean and std on different devices, {tensors[0].device!r} and {tensors[1].device!r}")
    means, stds = (t.data if isinstance(t, Tensor) else t for t in (mean, std))
    positive = stds >= 0  # (NaN is not)
    if not bool(positive.all() if hasattr(positive, "all") else positive):
        raise ValueError(f"normal: std must be >= 0, got {std!r}")
    if tensors:
        backend = tensors[0]._backend
        shape = tuple(numpy.broadcast_shapes(*(tuple(t.shape) for t in tensors)))
        dtype = dtype or tensors[0].dtype
    else:
        backend = get_backend(device or "cpu")
    dtype = as_dtype(dtype, "normal") or float32
    if not tensors:
        shape = _shape("normal", (size,), dtype, backend)
    if not is_floating(numpy.dtype(dtype)):
        raise TypeError(f"normal: the samples are floating-point numbers, not {numpy.dtype(dtype)}; pass float means")
    data = (backend.normal(shape, dtype) * stds + means).astype(dtype, copy=False)
    return _leaf(data, backend, requires_grad)


def randint(low: int, high: int | Shape, shape: Shape | None = None, device: Device = "cpu") -> Tensor:
    """A tensor of shape ``shape`` (an int or a tuple) of random int64 drawn uniformly from
    [low, high), on ``device``. PyTorch's short form draws from [0, high): ``randint(high,
    shape)``, as in ``torch.randint(len(data) - block_size, (batch_size,))``."""
    if shape is None:  # randint(high, shape)
        return randint(0, low, high, device)
    for name, bound in (("low", low), ("high", high)):
        if not (isinstance(bound, (int, numpy.integer)) and not isinstance(bound, bool)):
            raise TypeError(f"randint: {name} must be an integer, got {bound!r}")
        if not -(2**63) <= bound <= 2**63:
            raise ValueError(f"randint: {name}={bound} is outside int64's range")
    low, high = int(low), int(high)  # type: ignore[arg-type]  # (high is an integer: checked above)
    if not low < high:
        raise ValueError(f"randint: draws from [low, high), which is empty for low={low}, high={high}")
    b = get_backend(device)
    shape = _shape("randint", (shape,) if isinstance(shape, (int, numpy.integer)) else (shape,), "int64", b)
    return Tensor._make(b.integers(low, high, shape), b, None)


def randperm(n: int, dtype: DType = "int64", device: Device = "cpu") -> Tensor:
    """A random order of 0, 1, ..., n-1 (each of the n! equally likely), int64, from the device's
    seeded generator (``mt.manual_seed``): ``X[mt.randperm(len(X))]`` shuffles examples, as D2L
    3.2's ``data_iter`` does with ``random.shuffle``. Drawn as the order that sorts n uniform
    numbers (ties, with 2^-53 chance each, are kept in position order)."""
    if not is_count(n):
        raise ValueError(f"randperm: n must be an integer >= 0, got {n!r}")
    dtype = as_dtype(dtype, "randperm")
    if dtype is None or dtype.kind not in "iuf":
        raise DTypeError(f"randperm: draws positions, which dtype {dtype} cannot hold; use int64")
    b = get_backend(device)
    b.check_fits("randperm", (int(n),), 8)
    order = b.xp.argsort(b.random((int(n),), numpy.float64), kind="stable")
    return Tensor._make(order.astype(dtype), b, None)


MAX_SAMPLES = 1 << 24  # multinomial's num_samples, at most: it sizes what a call allocates


def multinomial(probs: Tensor, num_samples: int, replacement: bool = False) -> Tensor:
    """``num_samples`` categories drawn from ``probs``, category j with probability
    probs[j] / sum(probs): int64 indices of shape (num_samples,) for a 1-D ``probs`` of n
    categories, (rows, num_samples) for a 2-D one (a distribution per row), from the device's
    seeded generator (``mt.manual_seed``). The weights need not sum to 1; they must be finite,
    >= 0 and not all 0.

    With ``replacement`` every draw is independent: the first category whose cumulative share
    passes a uniform number u. Without (PyTorch's default) no category comes twice in a row: the
    Gumbel-top-k trick, the ``num_samples`` largest of log p_j + g_j with g_j = -log(-log u_j),
    which is drawing categories one at a time, each in proportion to the weight of those left
    (Kool, van Hoof & Welling 2019). Not differentiable.
    """
    if not isinstance(probs, Tensor):
        raise TypeError(f"multinomial: probs must be a Tensor, got {type(probs).__name__}")
    if probs.ndim not in (1, 2) or probs.shape[-1] == 0:
        raise ShapeError(f"multinomial: probs must be 1-D (n,) or 2-D (rows, n) with n >= 1, got shape {probs.shape}")
    if not is_floating(probs.dtype):
        raise TypeError(f"multinomial: probs must be floating point (weights), got {probs.dtype}")
    n = probs.shape[-1]
    if not isinstance(num_samples, int) or isinstance(num_samples, bool) or not 1 <= num_samples <= MAX_SAMPLES:
        raise ValueError(f"multinomial: num_samples must be an integer from 1 to {MAX_SAMPLES:,}, got {num_samples!r}")
    if not replacement and num_samples > n:
        raise ValueError(
            f"multinomial: {num_samples} different categories cannot be drawn from {n} without replacement "
            f"(replacement=True draws each independently)"
        )
    b, xp = probs._backend, probs._backend.xp
    p = probs.data.reshape(-1, n).astype(numpy.float64)  # the cumulative sums in float64
    rows = p.shape[0]
    nonzero = (p > 0).sum(axis=1)
    # one flag for every row's weights (on a GPU, checked at the next read: see Backend.check)
    ok = xp.isfinite(p).all() & (p >= 0).all() & (nonzero >= (1 if replacement else num_samples)).all()
    b.check(ok, lambda: _bad_weights(b.to_numpy(p), num_samples, replacement), ValueError)
    if replacement:
        cdf = xp.cumsum(xp.maximum(p, 0), axis=1)
        cdf = cdf / xp.where(cdf[:, -1:] > 0, cdf[:, -1:], 1)  # each row rises to exactly 1
        # one search for all rows: row r's cumulative shares, shifted to [r, r + 1], follow row r - 1's
        offset = xp.arange(rows)[:, None]
        u = b.random((rows, num_samples), numpy.float64)
        at = xp.searchsorted((cdf + offset).ravel(), (u + offset).ravel(), side="right")
        samples = at.reshape(rows, num_samples) - offset * n
    else:
        log_p = xp.where(p > 0, xp.log(xp.where(p > 0, p, 1)), -xp.inf)  # a weight of 0 is never drawn
        gumbel = -xp.log(-xp.log(b.random((rows, n), numpy.float64)))
        samples = xp.argsort(-(log_p + gumbel), axis=1, kind="stable")[:, :num_samples]
    samples = samples.clip(0, n - 1).astype(numpy.int64)  # in range even before a failed check is read
    return Tensor._make(samples.reshape(probs.shape[:-1] + (num_samples,)), b, None)


def _bad_weights(host: numpy.ndarray, num_samples: int, replacement: bool) -> str:
    """What is wrong with the first bad row of ``multinomial``'s weights (read only on failure)."""
    for r, row in enumerate(host):
        where = f"row {r}" if host.shape[0] > 1 else "probs"
        if not numpy.isfinite(row).all():
            return f"multinomial: {where} holds {row[~numpy.isfinite(row)][0]}; weights must be finite"
        if (row < 0).any():
            return f"multinomial: {where} holds {row[row < 0][0]:g}; weights must be >= 0"
        needed = 1 if replacement else num_samples
        if (row > 0).sum() < needed:
            return (
                f"multinomial: {where} has {(row > 0).sum()} categories of nonzero weight, "
                f"fewer than the {needed} {'draw needs' if needed == 1 else 'different draws need'}"
            )
    return "multinomial: invalid weights"


def zeros_like(t: Tensor, dtype: DType = None, requires_grad: bool = False) -> Tensor:
    """Zeros of ``t``'s shape on ``t``'s device, with ``t``'s dtype unless ``dtype`` is given (a new
    leaf; ``requires_grad`` as for ``zeros``)."""
    return zeros(t.shape, dtype=dtype or t.dtype, device=t.device, requires_grad=requires_grad)


def ones_like(t: Tensor, dtype: DType = None, requires_grad: bool = False) -> Tensor:
    """Ones of ``t``'s shape on ``t``'s device, with ``t``'s dtype unless ``dtype`` is given (a new
    leaf; ``requires_grad`` as for ``zeros``)."""
    return ones(t.shape, dtype=dtype or t.dtype, device=t.device, requires_grad=requires_grad)


def full_like(t: Tensor, fill_value: float, dtype: DType = None, requires_grad: bool = False) -> Tensor:
    """``fill_value`` in ``t``'s shape on ``t``'s device, with ``t``'s dtype unless ``dtype`` is given
    (a new leaf; ``requires_grad`` as for ``zeros``)."""
    return full(t.shape, fill_value, dtype=dtype or t.dtype, device=t.device, requires_grad=requires_grad)


def empty(*shape: Shape, dtype: DType = None, device: Device = "cpu", requires_grad: bool = False) -> Tensor:
    """A new tensor of the given shape whose values are not to be read before they are written
    (PyTorch's ``empty``): here they are zeros, which the device gives as cheaply as no values,
    so an ``empty`` read by mistake is at least the same each time. Arguments as for ``zeros``."""
    return _full("empty", shape, 0, dtype, device, requires_grad)


def empty_like(t: Tensor, dtype: DType = None, requires_grad: bool = False) -> Tensor:
    """``empty`` in ``t``'s shape on ``t``'s device, with ``t``'s dtype unless ``dtype`` is given:
    zeros here, as ``empty``'s."""
    return empty(t.shape, dtype=dtype or t.dtype, device=t.device, requires_grad=requires_grad)


def rand_like(t: Tensor, dtype: DType = None, requires_grad: bool = False) -> Tensor:
    """``rand`` in ``t``'s shape on ``t``'s device: samples of U(0, 1), with ``t``'s dtype unless
    ``dtype`` is given (a float dtype: an integer ``t`` needs one)."""
    return rand(t.shape, dtype=dtype or t.dtype, device=t.device, requires_grad=requires_grad)


def randn_like(t: Tensor, dtype: DType = None, requires_grad: bool = False) -> Tensor:
    """``randn`` in ``t``'s shape on ``t``'s device: standard normal samples, with ``t``'s dtype
    unless ``dtype`` is given (a float dtype: an integer ``t`` needs one)."""
    return randn(t.shape, dtype=dtype or t.dtype, device=t.device, requires_grad=requires_grad)


# DLPack device types (dlpack.h: kDLCPU, kDLCUDA) and the minitensor device that holds each
_DLPACK_DEVICES = {1: "cpu", 2: "cuda"}


def from_numpy(array: numpy.ndarray) -> Tensor:
    """A CPU tensor sharing memory with the NumPy ``array`` (no copy, as ``torch.from_numpy``):
    writing to one changes the other. ``mt.tensor(array)`` copies instead."""
    if not isinstance(array, numpy.ndarray):
        raise TypeError(f"from_numpy: expected a numpy.ndarray, got {type(array).__name__}")
    if array.dtype.kind not in "fiub" and not is_floating(array.dtype):
        raise TypeError(f"from_numpy: unsupported dtype {array.dtype} (numbers or booleans expected)")
    if not array.dtype.isnative:  # (shared memory cannot change its byte order; PyTorch refuses too)
        raise TypeError(
            f"from_numpy: the array's byte order ({array.dtype.str}) is not this machine's; "
            "mt.tensor(array) copies it into this machine's order"
        )
    return Tensor._make(array, get_backend("cpu"), None)


def from_dlpack(obj: Any) -> Tensor:
    """A tensor sharing memory with ``obj`` (a NumPy/CuPy array, a torch tensor, ... anything
    with ``__dlpack__``): no copy, as ``torch.from_dlpack``. Writing to one changes the other.

    The device follows the producer's ``__dlpack_device__()``: CPU memory becomes a "cpu"
    tensor (NumPy), CUDA memory a "cuda" tensor (CuPy).
    """
    if not hasattr(obj, "__dlpack__"):
        raise TypeError(f"from_dlpack: a {type(obj).__name__} has no __dlpack__ (not a DLPack producer)")
    device_type, device_id = obj.__dlpack_device__()
    name = _DLPACK_DEVICES.get(int(device_type))
    if name is None:
        raise ValueError(
            f"from_dlpack: DLPack device type {int(device_type)} (device {device_id}) is not supported; "
            f"minitensor holds CPU (1) and CUDA (2) memory"
        )
    backend = get_backend(name)
    return Tensor._make(backend.xp.from_dlpack(obj), backend, None)
