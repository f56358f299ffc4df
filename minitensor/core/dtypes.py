"""The dtypes minitensor uses, PyTorch names for NumPy's dtype objects.

NumPy and CuPy share NumPy's dtype objects, so a dtype is host metadata that every backend
understands. ``float32`` is the default for floating-point data (it is what the numba
kernels and BLAS are fastest at); ``float64`` is for gradient checks; integer tensors hold
indices and class labels.
"""

from __future__ import annotations

import builtins  # ``bool`` below is the dtype (PyTorch's name): the annotations say builtins.bool
import re
from typing import TYPE_CHECKING, Any

import numpy

if TYPE_CHECKING:
    from .tensor import DType

__all__ = [  # (a star import reads bfloat16 too, which imports ml_dtypes: see bfloat16 below)
    "float16", "bfloat16", "float32", "float64", "int32", "int64", "bool_", "bool", "long", "double", "default_float",
    "as_dtype", "is_dtype_name", "is_floating", "is_bfloat16", "is_low_precision", "compute_dtype",
    "is_floating_point", "finfo",
]  # fmt: skip

float16 = numpy.dtype("float16")
"""Half precision (16-bit) floating point. The numba kernels are compiled for float32 and float64 only,
so float16 data takes NumPy's plain array code."""

bfloat16: numpy.dtype  # made on first use, by __getattr__ below
"""Brain floating point (16-bit): float32's 8 exponent bits (its range) with 7 stored bits of
mantissa, 8 with the implicit leading one (about two decimal digits). NumPy has no such dtype;
the ``ml_dtypes`` package adds it, and CuPy takes the same one. It is the storage dtype of
``mt.autocast`` (``core/amp.py``): products rounded to it, sums and softmaxes kept in float32.

``ml_dtypes`` is imported the first time ``bfloat16`` is read, not with minitensor: its import
registers loops for a dozen dtypes with NumPy (about a second with ml_dtypes 0.7), which a
float32 program would pay for nothing. Code that only asks whether a dtype is bfloat16 calls
``is_bfloat16``, which imports nothing."""


def __getattr__(name: str) -> numpy.dtype:
    # PEP 562: called for a name the module does not have, so only for the first read of bfloat16
    if name == "bfloat16":
        return _bfloat16()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | {"bfloat16"})  # (dir() and tab completion list it before its first read)


def _bfloat16() -> numpy.dtype:
    """``bfloat16``, made (and ``ml_dtypes`` imported) by the first call."""
    if "bfloat16" not in globals():
        import ml_dtypes

        globals()["bfloat16"] = numpy.dtype(ml_dtypes.bfloat16)
    return globals()["bfloat16"]


float32 = numpy.dtype("float32")
"""Single precision (32-bit) floating point, the default for floating-point data and parameters."""

float64 = numpy.dtype("float64")
"""Double precision (64-bit) floating point: for gradient checks (``mt.gradcheck``) and reference values."""

int32 = numpy.dtype("int32")
"""32-bit signed integers."""

int64 = numpy.dtype("int64")
"""64-bit signed integers, the default integer dtype: token indices, class labels, lengths (``valid_lens``)."""

bool_ = numpy.dtype("bool")
"""Booleans, NumPy's name (``numpy.bool_``): the dtype of masks and comparisons."""

bool = bool_  # noqa: A001 -- PyTorch spells it torch.bool
"""Booleans, PyTorch's name (``torch.bool``): the same dtype as ``bool_``, that of masks (True = may attend)."""

long = int64
"""PyTorch's name for ``int64`` (``x.long()`` converts to it)."""

double = float64
"""PyTorch's name for ``float64`` (``x.double()`` converts to it)."""

default_float = float32
"""The dtype of floating-point data given without one (``mt.tensor([0.5])``, ``mt.randn(3)``)."""


def as_dtype(dtype: DType, op: str = "") -> numpy.dtype | None:
    """A NumPy dtype from ``"float32"``, ``mt.float32``, ``numpy.float32`` or ``float``; a
    TypeError naming ``op`` (the function asked) for anything else."""
    if dtype is None:
        return None
    if dtype is float:
        return float32  # a Python float means "floating point", not float64
    if isinstance(dtype, str) and dtype == "bfloat16":
        return _bfloat16()  # (NumPy knows the name only once ml_dtypes is imported)
    try:
        return numpy.dtype(dtype)
    except TypeError:
        pass
    if isinstance(dtype, str) and "bfloat16" not in globals() and _ML_DTYPES_NAMES.fullmatch(dtype):
        _bfloat16()  # NumPy knows ml_dtypes' names once it is imported: a name means the same whatever ran before
        return as_dtype(dtype, op)
    where = f"{op}: " if op else ""
    raise TypeError(f"{where}not a dtype: {dtype!r} (use e.g. mt.float32, mt.float64, mt.bfloat16, mt.int64)")


# The names of ml_dtypes' other dtypes (float8_e4m3fn, int4, ...): only these make as_dtype import
# it, not any unknown name, so that x.to("cuda") asks whether "cuda" is a dtype without the import
_ML_DTYPES_NAMES = re.compile(r"float\d+_e\d+m\d+\w*|u?int[124]|b?complex32")


def is_dtype_name(name: str) -> builtins.bool:
    """Whether the string ``name`` names a dtype ("float64", "bfloat16"): ``x.to(name)`` and
    ``model.to(name)`` take a dtype's name as a dtype, and any other string as a device."""
    try:
        as_dtype(name)
        return True
    except TypeError:
        return False


def is_floating(dtype: numpy.dtype) -> builtins.bool:
    """True for a floating-point dtype (float16, bfloat16, float32, float64). bfloat16 is not
    NumPy's own, so its ``kind`` is ``"V"``, not ``"f"``: ask this, not ``dtype.kind``."""
    return dtype.kind == "f" or is_bfloat16(dtype)


def is_bfloat16(dtype: numpy.dtype) -> builtins.bool:
    """True for bfloat16, without importing ``ml_dtypes``: an array can only hold bfloat16 once
    something has imported it (minitensor's ``bfloat16``, or the user), and its scalar type is
    then ``ml_dtypes.bfloat16``, of kind "V" (not one of NumPy's own). (Its type's name, not the
    dtype's ``name``, which NumPy builds anew at each read: several times slower, and the ops ask
    this at every call.)"""
    return dtype.kind == "V" and dtype.type.__name__ == "bfloat16"


def is_low_precision(dtype: numpy.dtype) -> builtins.bool:
    """True for float16 and bfloat16: the kernels are compiled for float32 and float64 only, and
    sums of many such numbers must be taken in float32 (a bfloat16 sum of 10,000 ones is 256)."""
    return dtype.itemsize == 2 and (dtype.kind == "f" or is_bfloat16(dtype))  # (size first: ops ask at every call)


def compute_dtype(dtype: numpy.dtype) -> numpy.dtype:
    """The dtype an op computes in for data of ``dtype``: float32 for float16 and bfloat16 (the
    result is rounded once at the end, as PyTorch does), the dtype itself otherwise."""
    return float32 if is_low_precision(dtype) else dtype


def is_floating_point(input: Any) -> builtins.bool:
    """PyTorch's ``torch.is_floating_point(x)``: True if tensor ``x`` holds float16, bfloat16,
    float32 or float64 numbers (``x.is_floating_point()``)."""
    return is_floating(input.dtype)


def finfo(dtype: DType = None) -> Any:
    """PyTorch's ``torch.finfo``: the limits of a floating-point dtype (float32 if none is
    given). ``eps`` is the gap between 1 and the next number, ``max`` the largest, ``min`` its
    negative, ``tiny`` the smallest normal number; ``bits`` and ``resolution`` too. It is NumPy's
    ``finfo``, and ml_dtypes' for bfloat16, which NumPy's does not know. A mask often writes
    ``mt.finfo(scores.dtype).min`` where ``-inf`` would make a row with every key masked NaN."""
    dtype = as_dtype(dtype, "finfo") or default_float
    if is_bfloat16(dtype):
        import ml_dtypes

        return ml_dtypes.finfo(dtype)
    if dtype.kind != "f":
        raise TypeError(f"finfo: {dtype} is not a floating-point dtype (numpy.iinfo gives an integer's limits)")
    return numpy.finfo(dtype)
