"""Type promotion for arithmetic: which dtype ``a + b`` gets, PyTorch's way.

- Python numbers are "weak": ``x * 2.0`` keeps x's dtype (float32 stays float32).
- NumPy scalars (``np.float64(2)``, ``np.sqrt(d)``) are turned into Python numbers first:
  NumPy 2 treats them as strong and would turn a float32 tensor into float64.
- Integer (or bool) data meeting float data becomes that float dtype (NumPy would make
  int64 + float32 a float64).
- Two floats of different precision are refused by ``Function.apply``: a model drifting to
  float64 unnoticed is slow, and an error saying which conversion to make is kinder. The one
  exception is bfloat16 meeting float32 inside ``mt.autocast`` (``amp.py``): float32 wins.
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

from .. import amp
from ..dtypes import is_floating
from ..errors import DTypeError
from ..tensor import DType, Tensor, tensor
from .convert import AsType

_NUMBER = (int, float, bool)


def promote(a: Any, b: Any, product: bool = False) -> tuple[Tensor, Any]:
    """The operands ``a``, ``b`` (at least one a Tensor) made fit for one arithmetic op.
    ``product``: a product inside ``mt.autocast``, which rounds bfloat16 and float32 operands
    itself: they are left as they are."""
    if not isinstance(a, Tensor):
        b, a = promote(b, a, product)
        return a, b
    if isinstance(b, numpy.generic):
        b = b.item()
    if isinstance(b, _NUMBER):
        if isinstance(b, float) and not is_floating(a.data.dtype):
            a = _as_float(a, None)
        return a, b
    if not isinstance(b, Tensor):
        b = tensor(b, device=a.device, dtype=a.dtype if is_floating(a.dtype) else None)
    fa, fb = is_floating(a.data.dtype), is_floating(b.data.dtype)
    if fa and not fb:
        b = _as_float(b, a.dtype)
    elif fb and not fa:
        a = _as_float(a, b.dtype)
    elif fa and a.data.dtype != b.data.dtype and not product and amp.promotes(a, b):  # bfloat16 meets float32
        a, b = a.float(), b.float()
    return a, b


def promote_all(tensors: list[Tensor]) -> list[Tensor]:
    """The tensors of one ``cat`` or ``stack`` made fit to join: integers or booleans among floats
    become that float dtype (NumPy would make int64 and float32 a float64); floats of different
    precision are left for ``Function.apply`` to refuse (but bfloat16 among float32 inside
    ``mt.autocast`` becomes float32)."""
    floated = [t for t in tensors if isinstance(t, Tensor) and is_floating(t.data.dtype)]
    if any(amp.promotes(floated[0], t) for t in floated):
        tensors = [t.float() if isinstance(t, Tensor) and is_floating(t.data.dtype) else t for t in tensors]
        floated = [t for t in tensors if isinstance(t, Tensor) and is_floating(t.data.dtype)]
    floats = [t.data.dtype for t in floated]
    if not floats or len(floats) == len(tensors):
        return tensors
    return [_as_float(t, floats[0]) if isinstance(t, Tensor) and not is_floating(t.data.dtype) else t for t in tensors]


def as_float(t: Tensor) -> Tensor:
    """``t``, or a float32 copy of it if it holds integers or booleans (PyTorch's default dtype)."""
    dtype = t.data.dtype
    return t if dtype.kind == "f" or is_floating(dtype) else _as_float(t, None)  # (on every unary op's path)


def float_only(op: str, t: Tensor) -> Tensor:
    """``t`` for an op that PyTorch, too, takes on floating-point data only; integers or booleans
    are refused, naming ``op`` and the conversion to make."""
    if not is_floating(t.data.dtype):
        raise DTypeError(
            f"{op}: needs floating-point input, got {t.dtype}; convert it first with .float() (float32) or .double()"
        )
    return t


def full_precision(op: str, t: Tensor) -> Tensor:
    """``float_only(op, t)``, in float32 inside ``mt.autocast`` for an op that autocast keeps out
    of bfloat16 (the softmax family, layer norm, the losses: ``amp.py``)."""
    return amp.in_float32(float_only(op, t))


def _as_float(t: Tensor, dtype: DType) -> Tensor:
    """A float copy of integer data (outside the graph: integers carry no gradient)."""
    return AsType.apply(t, dtype or "float32")
