"""Backends by device name.

``get_backend("cpu")`` returns the NumPy backend; ``get_backend("cuda")`` builds the CuPy
backend on first use (``cupy_backend.py``) or raises one ``DeviceError`` that says what is
missing. Other backends register themselves with ``register_backend`` (the tests add a
"strict" one); nothing outside this package needs to change to add one.
"""

from ..errors import DeviceError
from .base import Backend
from .cupy_backend import CupyBackend, cuda_unavailable_reason
from .numpy_backend import NumpyBackend

_BACKENDS: dict[str, Backend] = {}
# the seed of the last ``mt.manual_seed``: a backend registered later starts from it too
_SEED: list[int | None] = [None]
# what ``mt.set_float32_matmul_precision`` last set (``core/precision.py``), for later backends likewise
_MATMUL_PRECISION: list[str] = ["highest"]


def register_backend(backend: Backend) -> Backend:
    """Make ``backend`` available under ``backend.device``. Returns it."""
    if not isinstance(backend.device, str) or not backend.device:
        raise ValueError(f"register_backend: {type(backend).__name__} needs a device name (its class's `device`)")
    if _SEED[0] is not None:
        backend.seed(_SEED[0])
    if _MATMUL_PRECISION[0] != "highest":
        backend.set_float32_matmul_precision(_MATMUL_PRECISION[0])
    _BACKENDS[backend.device] = backend
    return backend


def _load_cuda() -> Backend:
    reason = cuda_unavailable_reason()
    if reason is not None:
        raise DeviceError(f"device 'cuda' is not available: {reason}")
    backend = CupyBackend()
    backend.check_it_runs()  # a broken CUDA install fails here, in one line, not deep inside the first op
    return register_backend(backend)


def get_backend(device: "str | Backend | None") -> Backend:
    """The Backend for a device name (``"cpu"``, ``"cuda"``; None means ``"cpu"``) or a Backend itself."""
    if device is None:
        device = "cpu"
    if isinstance(device, Backend):
        return device
    try:
        return _BACKENDS[device]
    except (KeyError, TypeError):
        pass
    if device == "cuda":
        return _load_cuda()
    raise DeviceError(f"unknown device {device!r}: available devices are {available_backends()}{_hint(device)}")


def _hint(device: object) -> str:
    """What a PyTorch user may have meant: its "cuda:0", a "gpu", an upper-case "CPU"."""
    name = str(device).strip().lower()
    if name.startswith("cuda:") or name in ("gpu", "cuda"):
        return (
            "; minitensor's GPU is device 'cuda', one GPU, the current one (CUDA_VISIBLE_DEVICES=N before "
            "the program starts picks GPU N)"
        )
    if name in ("cpu", "cpu:0"):
        return "; the CPU is device 'cpu'"
    return ""


def available_backends() -> list[str]:
    """Device names with a registered backend ("cuda" is listed once it has been used)."""
    return sorted(_BACKENDS)


register_backend(NumpyBackend())

__all__ = ["Backend", "NumpyBackend", "register_backend", "get_backend", "available_backends"]
