"""minitensor: a deep-learning framework whose core (``tensor.py``, ``autograd.py``, ``ops/``) is
small enough to read in an afternoon.

    import minitensor as mt
    x = mt.randn(3, 4, requires_grad=True)
    loss = (x @ x.T).tanh().sum()
    loss.backward()          # x.grad now holds d loss / d x

Where to read: ``tensor.py`` (what a tensor is), ``autograd.py`` (Function and the backward
pass), ``ops/`` (each operation with its derivative), ``kernels/`` (the numba loops: softmax,
the fused pieces of a training step, GELU), ``nn/`` and ``optim/`` (layers and optimisers
built on top).
"""

# First: tensor.py loads autograd and the ops at its end (see there), which only works when
# it is the first of them to load.
from .tensor import Tensor, tensor  # isort: skip

import importlib

from . import backends, cuda, nn, ops, optim
from ._printing import get_printoptions, set_printoptions
from .autograd import Function
from .backends import available_backends, get_backend
from .creation import arange, from_dlpack, full, ones, ones_like, rand, randint, randn, zeros, zeros_like
from .dtypes import bool, bool_, float16, float32, float64, int32, int64, long  # mt.bool, as torch.bool
from .errors import AxisError, DeviceError, DTypeError, GradcheckError, GraphError, ShapeError
from .grad_mode import enable_grad, is_grad_enabled, no_grad, set_grad_enabled
from .gradcheck import gradcheck
from .ops import *  # noqa: F403  (mt.exp, mt.softmax...: every op, listed in ops.__all__)
from .random import manual_seed

# The public API, as ``from minitensor import *`` and the API reference see it: the names
# imported above for users, every op (``ops.__all__``, not copied here) and the four names
# ``__getattr__`` loads on first use. Listing those is only strings: nothing is imported until
# one is used (a star import would import them, pluggy included; nothing in minitensor does one).
__all__ = [
    "AxisError",
    "DTypeError",
    "DeviceError",
    "Function",
    "GradcheckError",
    "GraphError",
    "ShapeError",
    "Tensor",
    "arange",
    "available_backends",
    "backends",
    "bool",
    "bool_",
    "cuda",
    "enable_grad",
    "float16",
    "float32",
    "float64",
    "from_dlpack",
    "full",
    "get_backend",
    "get_printoptions",
    "gradcheck",
    "int32",
    "int64",
    "is_grad_enabled",
    "long",
    "manual_seed",
    "nn",
    "no_grad",
    "ones",
    "ones_like",
    "ops",
    "optim",
    "rand",
    "randint",
    "randn",
    "set_grad_enabled",
    "set_printoptions",
    "tensor",
    "zeros",
    "zeros_like",
]
__all__ += ops.__all__
__all__ += ["hookimpl", "plugins", "testing", "viz", "onnx"]  # noqa: F405 -- not imported here: see __getattr__

__version__ = "0.1.0"


def __getattr__(name):
    # The plugin machinery (pluggy, entry points) and the plugin conformance kit load on
    # first use, not at import.
    if name in ("hookimpl", "plugins"):
        plugins = importlib.import_module("minitensor.plugins")  # sets mt.plugins too
        return plugins if name == "plugins" else plugins.hookimpl
    if name in ("testing", "viz", "onnx"):  # the conformance kit, the drawings, the export: on first use too
        return importlib.import_module(f"minitensor.{name}")
    raise AttributeError(f"module 'minitensor' has no attribute {name!r}")
