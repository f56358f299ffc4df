"""Initialising parameters in place (PyTorch's ``torch.nn.init``).

Why the scale matters: a layer y = W x with fan_in inputs of variance 1 gives outputs of
variance fan_in * Var(W). Keeping that near 1 through many layers needs Var(W) ~ 1/fan_in;
Xavier/Glorot balances the forward and backward passes with Var(W) = 2/(fan_in + fan_out),
Kaiming/He corrects for ReLU zeroing half the signal with Var(W) = 2/fan_in. A uniform
U(-b, b) has variance b^2/3, which turns each rule into a bound b.

Random numbers come from the tensor's own backend (on its device), seeded by
``mt.manual_seed``. Every function works under ``no_grad`` and returns the tensor.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

from ..creation import _finite_numbers
from ..dtypes import is_floating
from ..grad_mode import no_grad
from ..tensor import Tensor


def _fill(tensor: Tensor, data: Any) -> Tensor:
    with no_grad():
        return tensor.copy_(data)


def _random_dtype(tensor: Tensor) -> Any:
    if not is_floating(tensor.dtype):
        raise TypeError(f"init: random initialisation needs a floating-point tensor, got {tensor.dtype}")
    # The generators draw float32 or float64; other floats (float16) are drawn in float32.
    return tensor.dtype if tensor.dtype.itemsize >= 4 else "float32"


# A bound, mean or std that is not a finite number would make every weight NaN (or inf), and
# training would go on from there without a word: refused by ``creation._finite_numbers``, the
# check ``arange`` and ``linspace`` make of their bounds.
def uniform_(tensor: Tensor, a: float = 0.0, b: float = 1.0) -> Tensor:
    """Fill with samples of U(a, b), a <= b (as PyTorch requires)."""
    a, b = _finite_numbers("uniform_", a=a, b=b)
    if a > b:
        raise ValueError(f"uniform_: the range [a, b) is empty, a={a} > b={b}")
    return _fill(tensor, tensor._backend.uniform(tensor.shape, _random_dtype(tensor), a, b))


def normal_(tensor: Tensor, mean: float = 0.0, std: float = 1.0) -> Tensor:
    """Fill with samples of N(mean, std^2), std >= 0 (as PyTorch requires)."""
    mean, std = _finite_numbers("normal_", mean=mean, std=std)
    if std < 0:
        raise ValueError(f"normal_: std must be >= 0, got {std}")
    return _fill(tensor, tensor._backend.normal(tensor.shape, _random_dtype(tensor)) * std + mean)


def constant_(tensor: Tensor, value: Any) -> Tensor:
    """Fill with ``value``, a number (``inf`` and ``-inf`` are allowed: a mask's fill)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or math.isnan(value):
        raise ValueError(f"constant_: value must be a number, got {value!r}")
    return _fill(tensor, value)


def zeros_(tensor: Tensor) -> Tensor:
    return _fill(tensor, 0)


def ones_(tensor: Tensor) -> Tensor:
    return _fill(tensor, 1)


def fan_in_and_fan_out(tensor: Tensor) -> tuple[int, int]:
    """(fan_in, fan_out) of a weight of shape (out, in, *kernel), as PyTorch counts them."""
    if tensor.ndim < 2:
        raise ValueError(f"init: fan in and fan out need a weight with at least 2 axes, got shape {tensor.shape}")
    receptive_field = math.prod(tensor.shape[2:])
    return tensor.shape[1] * receptive_field, tensor.shape[0] * receptive_field


def calculate_gain(nonlinearity: str, param: float | None = None) -> float:
    """The factor by which ``nonlinearity`` shrinks the standard deviation, to undo it."""
    if nonlinearity in ("linear", "identity", "sigmoid"):
        return 1.0
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        slope = 0.01 if param is None else param
        return math.sqrt(2.0 / (1 + slope**2))
    raise ValueError(f"calculate_gain: unknown nonlinearity {nonlinearity!r}")


def xavier_uniform_(tensor: Tensor, gain: float = 1.0) -> Tensor:
    """Glorot: U(-b, b) with b = gain * sqrt(6 / (fan_in + fan_out))."""
    fan_in, fan_out = fan_in_and_fan_out(tensor)
    bound = gain * math.sqrt(6.0 / (fan_in + fan_out))
    return uniform_(tensor, -bound, bound)


def kaiming_uniform_(tensor: Tensor, a: float = 0.0, mode: str = "fan_in", nonlinearity: str = "leaky_relu") -> Tensor:
    """He: U(-b, b) with b = gain * sqrt(3 / fan), gain = calculate_gain(nonlinearity, a).

    PyTorch's Linear uses a = sqrt(5), which gives b = 1 / sqrt(fan_in).
    """
    if mode not in ("fan_in", "fan_out"):
        raise ValueError(f"kaiming_uniform_: mode must be 'fan_in' or 'fan_out', got {mode!r}")
    fan_in, fan_out = fan_in_and_fan_out(tensor)
    fan = fan_in if mode == "fan_in" else fan_out
    bound = calculate_gain(nonlinearity, a) * math.sqrt(3.0 / fan)
    return uniform_(tensor, -bound, bound)
