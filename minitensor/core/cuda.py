"""``mt.cuda.is_available()``, as in PyTorch: can tensors live on ``device="cuda"`` here?

Nothing GPU-related is imported until one of these is called (``cupy_backend`` imports CuPy
only inside ``cuda_unavailable_reason``).
"""

from .backends import _BACKENDS
from .backends.cupy_backend import cuda_unavailable_reason


def unavailable_reason() -> str | None:
    """None where ``device="cuda"`` works, else what is missing (CuPy, the driver, a GPU)."""
    if "cuda" in _BACKENDS:  # already built: it works
        return None
    return cuda_unavailable_reason()


def is_available() -> bool:
    """True where CuPy is installed and finds a usable NVIDIA GPU."""
    return unavailable_reason() is None
