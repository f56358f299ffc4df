"""Making new tensors: zeros, ones, full, arange, randn, rand, randint, ``*_like``, ``from_dlpack``."""

from typing import Any

from .autograd import Function
from .backends import Backend, get_backend
from .dtypes import as_dtype, float32
from .tensor import Device, DType, Shape, Tensor, tensor  # noqa: F401  (tensor is re-exported)


def _shape(shape: tuple[Any, ...]) -> tuple[Any, ...]:
    # Any, not int: under mt.onnx.export a length may be a traced dimension
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        return tuple(shape[0])
    return tuple(shape)


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


def _full(shape: tuple[Any, ...], fill: Any, dtype: DType, device: Device, requires_grad: bool) -> Tensor:
    t = Full.apply(shape, fill, dtype=as_dtype(dtype) or float32, device=device)
    return t.requires_grad_(True) if requires_grad else t


def _leaf(data: Any, backend: Backend, requires_grad: bool) -> Tensor:
    t = Tensor._make(data, backend, None)
    return t.requires_grad_(True) if requires_grad else t


def zeros(*shape: Shape, dtype: DType = None, device: Device = "cpu", requires_grad: bool = False) -> Tensor:
    """A new leaf tensor of the given shape filled with 0: ``zeros(2, 3)`` or ``zeros((2, 3))``.

    ``dtype`` defaults to float32; ``device`` is ``"cpu"`` or ``"cuda"``; ``requires_grad=True``
    makes it a leaf that collects gradients (floating-point dtypes only).
    """
    return _full(_shape(shape), 0, dtype, device, requires_grad)


def ones(*shape: Shape, dtype: DType = None, device: Device = "cpu", requires_grad: bool = False) -> Tensor:
    """A new leaf tensor of the given shape filled with 1: ``ones(2, 3)`` or ``ones((2, 3))``;
    ``dtype`` (default float32), ``device`` and ``requires_grad`` as for ``zeros``."""
    return _full(_shape(shape), 1, dtype, device, requires_grad)


def full(
    shape: Shape, fill_value: float, dtype: DType = None, device: Device = "cpu", requires_grad: bool = False
) -> Tensor:
    """A new leaf tensor of shape ``shape`` (an int or a tuple) filled with ``fill_value``;
    ``dtype`` (default float32), ``device`` and ``requires_grad`` as for ``zeros``."""
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    return _full(shape, fill_value, dtype, device, requires_grad)


def arange(
    start: float, stop: float | None = None, step: float = 1, dtype: DType = None, device: Device = "cpu"
) -> Tensor:
    """``arange(stop)`` or ``arange(start, stop, step=1)``: the numbers start, start + step, ...
    below ``stop``, as a 1-D tensor, like ``range``. Integers give int64, any float argument
    gives float32 (unless ``dtype`` says otherwise)."""
    if stop is None:
        start, stop = 0, start
    if dtype is None:
        dtype = "float32" if any(isinstance(v, float) for v in (start, stop, step)) else "int64"
    return Arange.apply(start, stop, step, dtype=as_dtype(dtype), device=device)


def randn(*shape: Shape, dtype: DType = None, device: Device = "cpu", requires_grad: bool = False) -> Tensor:
    """Standard normal samples from the device's seeded generator (``mt.manual_seed``)."""
    b = get_backend(device)
    return _leaf(b.normal(_shape(shape), as_dtype(dtype) or float32), b, requires_grad)


def rand(*shape: Shape, dtype: DType = None, device: Device = "cpu", requires_grad: bool = False) -> Tensor:
    """A new tensor of the given shape with samples of U(0, 1), uniform in [0, 1): ``rand(2, 3)``
    or ``rand((2, 3))``; ``dtype`` (default float32), ``device`` and ``requires_grad`` as for
    ``zeros``."""
    b = get_backend(device)
    return _leaf(b.uniform(_shape(shape), as_dtype(dtype) or float32), b, requires_grad)


def randint(low: int, high: int, shape: Shape, device: Device = "cpu") -> Tensor:
    """A tensor of shape ``shape`` (an int or a tuple) of random int64 drawn uniformly from
    [low, high), on ``device``."""
    b = get_backend(device)
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    return Tensor._make(b.integers(low, high, shape), b, None)


def zeros_like(t: Tensor, dtype: DType = None, requires_grad: bool = False) -> Tensor:
    """Zeros of ``t``'s shape on ``t``'s device, with ``t``'s dtype unless ``dtype`` is given (a new
    leaf; ``requires_grad`` as for ``zeros``)."""
    return zeros(t.shape, dtype=dtype or t.dtype, device=t.device, requires_grad=requires_grad)


def ones_like(t: Tensor, dtype: DType = None, requires_grad: bool = False) -> Tensor:
    """Ones of ``t``'s shape on ``t``'s device, with ``t``'s dtype unless ``dtype`` is given (a new
    leaf; ``requires_grad`` as for ``zeros``)."""
    return ones(t.shape, dtype=dtype or t.dtype, device=t.device, requires_grad=requires_grad)


# DLPack device types (dlpack.h: kDLCPU, kDLCUDA) and the minitensor device that holds each
_DLPACK_DEVICES = {1: "cpu", 2: "cuda"}


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
