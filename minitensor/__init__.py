"""minitensor: a deep-learning framework small enough to read in an afternoon.

    import minitensor as mt
    x = mt.randn(3, 4, requires_grad=True)
    loss = (x @ x.T).tanh().sum()
    loss.backward()          # x.grad now holds d loss / d x

Where to read: ``tensor.py`` (what a tensor is), ``autograd.py`` (Function and the backward
pass), ``ops/`` (each operation with its derivative), ``kernels/`` (the numba softmax
kernels), ``nn/`` and ``optim/`` (layers and optimisers built on top).
"""

__version__ = "0.1.0"

from . import (  # noqa: E402  # noqa: E402
    _tensor_methods,  # noqa: E402,F401  (attaches operators and methods to Tensor)
    backends,
    cuda,
    nn,
    ops,
    optim,
)
from .autograd import Function  # noqa: E402
from .backends import available_backends, get_backend  # noqa: E402
from .creation import (
    arange,
    from_dlpack,
    full,
    ones,
    ones_like,
    rand,
    randint,
    randn,
    zeros,  # noqa: E402
    zeros_like,
)
from .dtypes import (  # noqa: E402
    bool,  # noqa: E402,A004
    bool_,
    float16,
    float32,
    float64,
    int32,
    int64,
    long,
)
from .errors import AxisError, DeviceError, DTypeError, GradcheckError, GraphError, ShapeError  # noqa: E402
from .grad_mode import enable_grad, is_grad_enabled, no_grad, set_grad_enabled  # noqa: E402
from .gradcheck import gradcheck  # noqa: E402
from .ops import *  # noqa: E402,F401,F403
from .random import manual_seed  # noqa: E402
from .tensor import Tensor, tensor  # noqa: E402


def __getattr__(name):
    # The plugin machinery (pluggy, entry points) and the plugin conformance kit load on
    # first use, not at import.
    import importlib

    if name in ("hookimpl", "plugins"):
        plugins = importlib.import_module("minitensor.plugins")  # sets mt.plugins too
        return plugins if name == "plugins" else plugins.hookimpl
    if name == "testing":
        return importlib.import_module("minitensor.testing")
    raise AttributeError(f"module 'minitensor' has no attribute {name!r}")
