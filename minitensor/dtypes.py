"""The dtypes minitensor uses, PyTorch names for NumPy's dtype objects.

NumPy and CuPy share NumPy's dtype objects, so a dtype is host metadata that every backend
understands. ``float32`` is the default for floating-point data (it is what the numba
kernels and BLAS are fastest at); ``float64`` is for gradient checks; integer tensors hold
indices and class labels.
"""

import numpy

float16 = numpy.dtype("float16")
float32 = numpy.dtype("float32")
float64 = numpy.dtype("float64")
int32 = numpy.dtype("int32")
int64 = numpy.dtype("int64")
bool_ = numpy.dtype("bool")
bool = bool_  # noqa: A001 -- PyTorch spells it torch.bool
long = int64
double = float64
default_float = float32


def as_dtype(dtype):
    """A NumPy dtype from ``"float32"``, ``mt.float32``, ``numpy.float32`` or ``float``."""
    if dtype is None:
        return None
    if dtype is float:
        return float32  # a Python float means "floating point", not float64
    try:
        return numpy.dtype(dtype)
    except TypeError:
        raise TypeError(f"not a dtype: {dtype!r} (use e.g. mt.float32, mt.float64, mt.int64)") from None


def is_floating(dtype):
    return dtype.kind == "f"
