"""``mt.autocast``: mixed precision in bfloat16, PyTorch's automatic mixed precision (AMP).

A float32 number carries 24 bits of mantissa; bfloat16 keeps float32's 8 exponent bits (so its
range: no loss scaling is needed, unlike float16) and 8 bits of mantissa, about two decimal
digits, in half the bytes. Training tolerates that rounding in the matrix products, where a
GPU's bfloat16 tensor cores run several times faster than float32 and the ops between them
move half the bytes, but not in sums over many terms or in exponentials. So, inside::

    with mt.autocast("cuda"):          # or "cpu"; dtype=mt.bfloat16 is the default
        loss = loss_fn(model(X), Y)
    loss.backward()                    # outside, as in PyTorch
    optimizer.step()

each op follows one of three rules (PyTorch's, ``torch.amp``'s "autocast op reference"):

- **Products in bfloat16**: ``matmul`` (``@``, ``bmm``, ``mm``, ``mv``, ``dot``) and ``linear``
  (every ``nn.Linear``, so every scorer and projection, a plugin's too) round their float32
  operands to bfloat16, sum the products in float32 and round the result to bfloat16 (a
  Linear's bias added before that one rounding, as in PyTorch). A GPU takes its bfloat16 tensor
  cores for them whatever ``set_float32_matmul_precision`` says (``Backend.rounded_matmul``).
- **Float32 where precision matters**: the softmax family and every attention pooling (through
  ``MultiHeadAttention``, a user's pooling plugin too), layer norm, the losses, ``sum``,
  ``mean``, ``var``, ``std``, ``norm``, ``logsumexp``, ``cumsum``, ``prod``, ``exp`` and
  ``log`` take bfloat16 input as float32 and return float32.
- **Everything else runs in the dtype it is given** (GELU, dropout, reshapes), and an op that
  meets bfloat16 and float32 promotes to float32: a Transformer's residual stream stays float32.

The parameters stay float32 (the "master weights"): a product rounds them inside its own node,
and its backward gives each operand a gradient in the operand's dtype, so ``.grad`` and the
optimisers see float32 only. Call ``backward`` outside the block, as PyTorch advises; the
backward of each op runs in the dtype its forward ran in, whatever the block says then.

Only bfloat16 is offered: float16's range (6e-5 to 65504) makes gradients underflow without
PyTorch's ``GradScaler``. ``device_type`` says whose tensors it applies to, as in PyTorch:
``autocast("cpu")`` leaves a GPU's tensors alone. On the CPU a bfloat16 product is a float32
product of the rounded operands (NumPy's BLAS has no bfloat16), so there autocast shows the
numerics, not a speed-up; the roundings run on the bits (``kernels/bfloat16.py``, one pass an
operand). The memory a step holds drops a little (the GPT preset's forward: 35.8 MiB against
38.0): a node keeps its input tensors for backward's walk, so a float32 copy
made where bfloat16 meets float32 lives beside the bfloat16 tensor; the products round their
operands inside their own node (``product_dtype``) so that no rounded copy is kept. See
Kalamkar et al., "A Study of BFLOAT16 for Deep Learning Training" (2019), and Micikevicius et
al., "Mixed Precision Training" (ICLR 2018).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import numpy

from . import dtypes
from .dtypes import as_dtype, float32, is_bfloat16, is_floating
from .tensor import Tensor

F = TypeVar("F", bound=Callable[..., Any])

DEVICE_TYPES = ("cpu", "cuda")

# device type -> dtype, for the device types inside an enabled block; empty outside any: one
# module-level read per op, as grad_mode's flag (minitensor runs its graph on one thread)
_active: dict[str, numpy.dtype] = {}


def is_autocast_enabled(device_type: str = "cuda") -> bool:
    """True inside an enabled ``autocast`` block for ``device_type`` ("cpu" or "cuda")."""
    return device_type in _active


def get_autocast_dtype(device_type: str = "cuda") -> numpy.dtype:
    """The dtype products take inside an ``autocast`` block for ``device_type``: bfloat16."""
    dtype = _active.get(device_type)
    return dtypes.bfloat16 if dtype is None else dtype  # (read only here: ml_dtypes is imported on first use)


class autocast:
    """Run the ops inside the block in mixed precision (module docstring): products in bfloat16,
    softmaxes, norms, sums and losses in float32, master weights float32. A context manager and
    a decorator, ``torch.autocast``'s signature::

        with mt.autocast("cuda", dtype=mt.bfloat16, enabled=True): ...

    ``enabled=False`` turns it off for ``device_type`` inside an enclosing block; blocks nest and
    restore what was there, each device type on its own, as in PyTorch. ``device_type`` is "cpu"
    or "cuda" (PyTorch's words; a tensor on "cuda:1" is "cuda").
    ``cache_enabled`` is accepted for PyTorch's code and ignored: each product rounds its
    weights again (PyTorch keeps the rounded copy for the block).
    """

    def __init__(
        self,
        device_type: str,
        dtype: Any = None,
        enabled: bool = True,
        cache_enabled: bool | None = None,
    ) -> None:
        if device_type not in DEVICE_TYPES:
            raise ValueError(
                f"autocast: device_type must be one of {', '.join(map(repr, DEVICE_TYPES))}, got {device_type!r}"
            )
        dtype = as_dtype(dtype, "autocast")  # None: bfloat16, read on entering an enabled block (and ml_dtypes
        # imported then: `autocast(device, enabled=False)`, as a float32 run writes it, imports nothing)
        if dtype is not None and not is_bfloat16(dtype):
            why = (
                "float16's range makes gradients underflow without a loss scaler (PyTorch's GradScaler), which "
                "minitensor does not have"
                if dtype == numpy.float16
                else "the products' lower precision is the point of the block (enabled=False turns it off)"
            )
            raise ValueError(f"autocast: dtype must be mt.bfloat16, got {dtype}; {why}")
        if not isinstance(enabled, bool):
            raise TypeError(f"autocast: enabled must be True or False, got {enabled!r}")
        self.device_type, self.dtype, self.enabled = device_type, dtype, enabled

    def __enter__(self) -> autocast:
        global _active
        self._prev = _active
        _active = {k: v for k, v in _active.items() if k != self.device_type}  # a new dict: _prev stays
        if self.enabled:
            _active[self.device_type] = dtypes.bfloat16 if self.dtype is None else self.dtype
        return self

    def __exit__(self, *exc: object) -> None:
        global _active
        _active = self._prev  # an exception goes on: returning None never swallows it

    def __call__(self, fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with autocast(self.device_type, self.dtype, self.enabled):
                return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]  # functools.wraps keeps fn's signature


def _block_dtype(t: Any) -> numpy.dtype | None:
    """The dtype of the block that covers tensor ``t``'s device ("cuda:1" is "cuda"), if any."""
    return _active.get(t.device.split(":")[0]) if isinstance(t, Tensor) else None


def product_dtype(*tensors: Any) -> numpy.dtype | None:
    """The dtype a product of ``tensors`` rounds its operands to: the block's, inside a block for
    their device where the float operands are float32 or already that dtype; else None (no
    rounding: float64 is left alone, as in PyTorch, and meeting float32 stays an error). The
    product ops (``MatMul``, ``Linear``) round inside their own node, given ``autocast=dtype``,
    and round again in backward from the operands they saved: the graph then holds no bfloat16
    copy of a float32 weight or input, only the float32 tensors it holds anyway."""
    if not _active:
        return None
    dtype = next((d for d in map(_block_dtype, tensors) if d is not None), None)
    floats = [t.dtype for t in tensors if isinstance(t, Tensor) and is_floating(t.dtype)]
    if dtype is None or not floats or any(d not in (float32, dtype) for d in floats):
        return None
    return dtype


def lower(*tensors: Any) -> tuple[Any, ...]:
    """The operands of a product, float32 ones rounded to the block's dtype (differentiably: the
    gradient is turned back into float32). Outside a block, or for another device, as given;
    float64 stays float64, as in PyTorch."""
    if not _active:
        return tensors
    return tuple(t.to(dtype=_block_dtype(t)) if _covers_float32(t) else t for t in tensors)


def in_float32(t: Any) -> Any:
    """The input of an op that autocast runs in float32: a bfloat16 tensor becomes float32
    (differentiably) inside a block for its device; anything else is returned as given."""
    if not _active or not isinstance(t, Tensor) or t.dtype != _block_dtype(t):
        return t
    return t.to(dtype=float32)


def promotes(a: Any, b: Any) -> bool:
    """Whether two float tensors of different dtypes may meet in one op: bfloat16 and float32
    inside a block for their device (the wider wins, as PyTorch's elementwise ops promote)."""
    if not _active:
        return False
    dtype = _block_dtype(a)
    return dtype is not None and {a.dtype, b.dtype} == {dtype, float32}


def _covers_float32(t: Any) -> bool:
    return isinstance(t, Tensor) and t.dtype == float32 and _block_dtype(t) is not None
