"""minitensor: a deep-learning framework whose core (``tensor.py``, ``autograd.py``, ``ops/``) is
small enough to read in an afternoon.

    import minitensor as mt
    x = mt.randn(3, 4, requires_grad=True)
    loss = (x @ x.T).tanh().sum()
    loss.backward()          # x.grad now holds d loss / d x

Two layers. ``core/`` is the engine, what a learner reads (its reading order is in
``core/__init__.py``): tensors, autograd, the ops, backends and kernels, ``nn``, ``optim`` and the
plugin host; it imports nothing from the rest. Beside it are the applications built on the
engine's public names: ``data/``, ``train/``, ``inference/``, ``viz/``, ``onnx/``, ``cli.py``.
"""

import importlib
import importlib.util
import sys
import types
from typing import TYPE_CHECKING

# First: tensor.py loads autograd and the ops at its end (see there), which only works when
# it is the first of them to load.
from .core.tensor import Tensor, tensor  # isort: skip

from .core import backends, cuda, nn, ops, optim
from .core._printing import get_printoptions, set_printoptions
from .core.amp import autocast, get_autocast_dtype, is_autocast_enabled
from .core.autograd import Function
from .core.backends import available_backends, get_backend
from .core.creation import (
    arange,
    empty,
    empty_like,
    eye,
    from_dlpack,
    from_numpy,
    full,
    full_like,
    linspace,
    multinomial,
    normal,
    ones,
    ones_like,
    rand,
    rand_like,
    randint,
    randn,
    randn_like,
    randperm,
    zeros,
    zeros_like,
)
from .core.dtypes import (  # mt.bool, as torch.bool
    bool,
    bool_,
    finfo,
    float16,
    float32,
    float64,
    int32,
    int64,
    is_floating_point,
    long,
)
from .core.errors import AxisError, DeviceError, DTypeError, GradcheckError, GraphError, ShapeError
from .core.grad_mode import enable_grad, is_grad_enabled, no_grad, set_grad_enabled
from .core.gradcheck import gradcheck
from .core.ops import *  # noqa: F403  (mt.exp, mt.softmax...: every op, listed in ops.__all__)
from .core.ops.reduce import norm  # (ops.norm is the module of layer_norm)
from .core.precision import get_float32_matmul_precision, set_float32_matmul_precision
from .core.random import manual_seed

if TYPE_CHECKING:  # (for type checkers and the API reference: at run time __getattr__ imports it on first use)
    from .core.dtypes import bfloat16


class _EnginePaths:  # a meta path finder and its loader (importlib.abc's protocol)
    """``minitensor.nn`` *is* ``minitensor.core.nn`` (the same module object), and so for every
    engine module: ``import minitensor.nn.functional as F``, ``from minitensor.plugins import
    hookimpl`` and every plugin written before the engine moved under ``core/`` keep working,
    with one copy of each class and registry (a second copy would make ``isinstance`` fail)."""

    def find_spec(self, fullname, path=None, target=None):
        parent, _, child = fullname.rpartition(".")
        if not fullname.startswith("minitensor.") or fullname.startswith("minitensor.core"):
            return None
        if not isinstance(vars(sys.modules[parent]).get(child, sys), types.ModuleType):
            return None  # the name is a function there (mt.tensor, mt.ops.softmax), not this module
        head = fullname.split(".")[1]
        if importlib.util.find_spec(f"minitensor.core.{head}") is None:
            return None  # not an engine name: an application (minitensor.train) or a typo
        if importlib.util.find_spec("minitensor.core." + fullname.removeprefix("minitensor.")) is None:
            return None  # minitensor.nn.no_such_module
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        module = importlib.import_module("minitensor.core." + spec.name.removeprefix("minitensor."))
        spec.loader_state = module.__spec__  # the import system sets module.__spec__ = spec next
        return module

    def exec_module(self, module):
        # Already executed under its own name: only give it back its own spec.
        module.__spec__ = module.__spec__.loader_state


# The engine modules loaded so far are registered under their public names at once: a first
# import through the finder would set the parent's attribute to the module, and some of those
# names are functions (mt.tensor, mt.gradcheck, mt.ops.softmax). The finder answers for the
# modules that load later (plugins, kernels), ahead of the import system's own finders, which
# would load a second copy from the same file (minitensor.nn's __path__ is core/nn).
for _name, _module in list(sys.modules.items()):
    if _name.startswith("minitensor.core."):
        _name = _name.removeprefix("minitensor.core.")
        sys.modules.setdefault(f"minitensor.{_name}", _module)
        if "." not in _name:
            globals().setdefault(_name, _module)  # mt.random, mt.autograd: as a package's submodules are
sys.meta_path.insert(0, _EnginePaths())
del _name, _module

# The public API, as ``from minitensor import *`` and the API reference see it: the names
# imported above for users, every op (``ops.__all__``, not copied here) and the names
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
    "autocast",
    "bool",
    "bool_",
    "cuda",
    "empty",
    "empty_like",
    "enable_grad",
    "eye",
    "finfo",
    "float16",
    "float32",
    "float64",
    "from_dlpack",
    "from_numpy",
    "full",
    "full_like",
    "get_autocast_dtype",
    "get_backend",
    "get_float32_matmul_precision",
    "get_printoptions",
    "gradcheck",
    "int32",
    "int64",
    "is_autocast_enabled",
    "is_floating_point",
    "is_grad_enabled",
    "linspace",
    "long",
    "manual_seed",
    "multinomial",
    "nn",
    "no_grad",
    "norm",
    "normal",
    "ones",
    "ones_like",
    "ops",
    "optim",
    "rand",
    "rand_like",
    "randint",
    "randn",
    "randn_like",
    "randperm",
    "set_float32_matmul_precision",
    "set_grad_enabled",
    "set_printoptions",
    "tensor",
    "zeros",
    "zeros_like",
]
__all__ += ops.__all__
__all__ += ["bfloat16", "hookimpl", "plugins", "testing", "viz", "onnx", "utils", "save", "load"]  # noqa: F405 -- not imported here: see __getattr__

__version__ = "0.1.0"


def __getattr__(name):
    # The plugin machinery (pluggy, entry points) and the plugin conformance kit load on
    # first use, not at import.
    if name in ("hookimpl", "plugins"):
        plugins = importlib.import_module("minitensor.core.plugins")
        globals()["plugins"] = plugins
        return plugins if name == "plugins" else plugins.hookimpl
    if name in ("testing", "viz", "onnx", "utils"):  # the conformance kit, the drawings, the export, data loading
        return importlib.import_module(f"minitensor.{name}")
    if name in ("save", "load"):  # torch.save / torch.load's counterparts (serialization.py), safetensors inside
        return getattr(importlib.import_module("minitensor.serialization"), name)
    if name == "bfloat16":  # ml_dtypes is imported on first use (core/dtypes.py says why)
        from .core.dtypes import bfloat16

        globals()["bfloat16"] = bfloat16
        return bfloat16
    raise AttributeError(f"module 'minitensor' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))  # the names __getattr__ loads too: dir(), tab completion
