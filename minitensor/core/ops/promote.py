"""Type promotion for arithmetic: which dtype ``a + b`` gets, PyTorch's way.

- Python numbers are "weak": ``x * 2.0`` keeps x's dtype (float32 stays float32).
- NumPy scalars (``np.float64(2)``, ``np.sqrt(d)``) are turned into Python numbers first:
  NumPy 2 treats them as strong and would turn a float32 tensor into float64.
- Integer (or bool) data meeting float data becomes that float dtype (NumPy would make
  int64 + float32 a float64).
- Two floats of different precision are refused by ``Function.apply``: a model drifting to
  float64 unnoticed is slow, and an error saying which conversion to make is kinder.
- Anything else (lists, NumPy arrays) becomes a tensor on the other operand's device.

Ops defined on real numbers alone: ``exp``, ``log``, ``sqrt``, ``tanh``, ``sigmoid``, ``sin``,
``cos`` and true division (as PyTorch's), and ``mean`` and ``var`` (which PyTorch refuses) turn
integer data into float32 (``as_float``), never NumPy's float64. The softmax family,
cross-entropy's logits, layer norm and GELU refuse it in words (``float_only``), where NumPy's
integer arithmetic would give a wrong answer or numba a typing error from inside a kernel.
"""

from __future__ import annotations

from typing import Any

import numpy

from ..errors import DTypeError
from ..tensor import DType, Tensor, tensor
from .convert import AsType

_NUMBER = (int, float, bool)


def promote(a: Any, b: Any) -> tuple[Tensor, Any]:
    """The operands ``a``, ``b`` (at least one a Tensor) made fit for one arithmetic op."""
    if not isinstance(a, Tensor):
        b, a = promote(b, a)
        return a, b
    if isinstance(b, numpy.generic):
        b = b.item()
    if isinstance(b, _NUMBER):
        if isinstance(b, float) and a.data.dtype.kind != "f":
            a = _as_float(a, None)
        return a, b
    if not isinstance(b, Tensor):
        b = tensor(b, device=a.device, dtype=a.dtype if a.dtype.kind == "f" else None)
    ka, kb = a.data.dtype.kind, b.data.dtype.kind
    if ka == "f" and kb != "f":
        b = _as_float(b, a.dtype)
    elif kb == "f" and ka != "f":
        a = _as_float(a, b.dtype)
    return a, b


def promote_all(tensors: list[Tensor]) -> list[Tensor]:
    """The tensors of one ``cat`` or ``stack`` made fit to join: integers or booleans among floats
    become that float dtype (NumPy would make int64 and float32 a float64); floats of different
    precision are left for ``Function.apply`` to refuse."""
    floats = [t.data.dtype for t in tensors if isinstance(t, Tensor) and t.data.dtype.kind == "f"]
    if not floats or len(floats) == len(tensors):
        return tensors
    return [_as_float(t, floats[0]) if isinstance(t, Tensor) and t.data.dtype.kind != "f" else t for t in tensors]


def as_float(t: Tensor) -> Tensor:
    """``t``, or a float32 copy of it if it holds integers or booleans (PyTorch's default dtype)."""
    return t if t.data.dtype.kind == "f" else _as_float(t, None)


def float_only(op: str, t: Tensor) -> Tensor:
    """``t`` for an op that PyTorch, too, takes on floating-point data only; integers or booleans
    are refused, naming ``op`` and the conversion to make."""
    if t.data.dtype.kind != "f":
        raise DTypeError(
            f"{op}: needs floating-point input, got {t.dtype}; convert it first with .float() (float32) or .double()"
        )
    return t


def _as_float(t: Tensor, dtype: DType) -> Tensor:
    """A float copy of integer data (outside the graph: integers carry no gradient)."""
    return AsType.apply(t, dtype or "float32")
