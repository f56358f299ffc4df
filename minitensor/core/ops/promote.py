"""Type promotion for arithmetic: which dtype ``a + b`` gets, PyTorch's way.

- Python numbers are "weak": ``x * 2.0`` keeps x's dtype (float32 stays float32).
- NumPy scalars (``np.float64(2)``, ``np.sqrt(d)``) are turned into Python numbers first:
  NumPy 2 treats them as strong and would turn a float32 tensor into float64.
- Integer (or bool) data meeting float data becomes that float dtype (NumPy would make
  int64 + float32 a float64).
- Two floats of different precision are refused by ``Function.apply``: a model drifting to
  float64 unnoticed is slow, and an error saying which conversion to make is kinder.
- Anything else (lists, NumPy arrays) becomes a tensor on the other operand's device.
"""

from __future__ import annotations

from typing import Any

import numpy

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


def _as_float(t: Tensor, dtype: DType) -> Tensor:
    """A float copy of integer data (outside the graph: integers carry no gradient)."""
    return AsType.apply(t, dtype or "float32")
