"""Backends by device name.

``get_backend("cpu")`` returns the NumPy backend. Further backends (CuPy for ``"cuda"``)
register themselves here with ``register_backend``; nothing outside this package needs to
change to add one.
"""

from ..errors import DeviceError
from .base import Backend
from .numpy_backend import NumpyBackend

_BACKENDS = {}


def register_backend(backend):
    """Make ``backend`` available under ``backend.device``. Returns it."""
    _BACKENDS[backend.device] = backend
    return backend


def get_backend(device):
    """The Backend for a device name (``"cpu"``, ``"cuda"``; None means ``"cpu"``) or a Backend itself."""
    if device is None:
        device = "cpu"
    if isinstance(device, Backend):
        return device
    try:
        return _BACKENDS[device]
    except (KeyError, TypeError):
        pass
    raise DeviceError(
        f"unknown device {device!r}: available devices are {sorted(_BACKENDS)}"
        + (" (GPU support arrives with the CuPy backend)" if device == "cuda" else "")
    )


def available_backends():
    """Device names with a registered backend."""
    return sorted(_BACKENDS)


register_backend(NumpyBackend())

__all__ = ["Backend", "NumpyBackend", "register_backend", "get_backend", "available_backends"]
