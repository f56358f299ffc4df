"""Elementwise operations: each output element depends on one element of each input.

Their derivatives are elementwise too, so every backward is one line: the chain rule
dL/dx = dL/dz * dz/dx. When the inputs were broadcast, the engine sums the gradient back to
each input's shape (``autograd.sum_to_shape``). Python numbers are constants: they get no
gradient and keep the tensor's dtype (``x * 2`` stays float32).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from .. import amp
from ..autograd import Function, Grads
from ..backends import Backend
from ..dtypes import float32, is_low_precision
from ..tensor import Array, Number, Tensor
from .promote import as_float, float_only, promote


# -- arithmetic --------------------------------------------------------------------------
class Add(Function):
    """z = a + b;  dz/da = 1, dz/db = 1."""

    reads_inputs = False  # (its backward needs only shapes: see Function.reads_inputs)

    @staticmethod
    def forward(ctx: Function, a: Array, b: Array) -> Array:
        return a + b

    @staticmethod
    def backward(ctx: Function, grad: Array) -> Grads:
        return grad, grad


class Sub(Function):
    """z = a - b;  dz/da = 1, dz/db = -1."""

    reads_inputs = False  # (its backward needs only shapes: see Function.reads_inputs)

    @staticmethod
    def forward(ctx: Function, a: Array, b: Array) -> Array:
        return a - b

    @staticmethod
    def backward(ctx: Function, grad: Array) -> Grads:
        return grad, -grad


class Mul(Function):
    """z = a * b;  dz/da = b, dz/db = a."""

    @staticmethod
    def forward(ctx: Function, a: Array, b: Array) -> Array:
        ctx.save_for_backward(a, b)
        return a * b

    @staticmethod
    def backward(ctx: Function, grad: Array) -> Grads:
        a, b = ctx.saved
        need_a, need_b = ctx.needs_input_grad
        return (grad * b if need_a else None), (grad * a if need_b else None)


class Div(Function):
    """z = a / b;  dz/da = 1/b, dz/db = -a/b^2 = -z/b."""

    @staticmethod
    def forward(ctx: Function, a: Array, b: Array) -> Array:
        z = a / b
        ctx.save_for_backward(b, z)
        return z

    @staticmethod
    def backward(ctx: Function, grad: Array) -> Grads:
        b, z = ctx.saved
        need_a, need_b = ctx.needs_input_grad
        ga = grad / b if need_a else None
        gb = -grad * z / b if need_b else None
        return ga, gb


def _integer_by_zero(op: str, a: Array, b: Array | Number) -> None:
    """Raise ZeroDivisionError for integers divided by the number 0, as Python and PyTorch do;
    NumPy gives 0 and a warning. (A tensor of divisors is not looked into: on a GPU that would
    wait for the device. Its zeros give NumPy's and CuPy's 0.)"""
    if type(b) is int and b == 0 and getattr(a, "dtype", None) is not None and a.dtype.kind in "iub":
        raise ZeroDivisionError(f"{op}: integer division by zero")


class FloorDivide(Function):
    """z = floor(a / b), Python's ``a // b`` (PyTorch's ``floor_divide``): integers stay integers.
    A staircase, flat between its jumps, so there is no useful derivative: it stays outside the
    graph, as comparisons do (PyTorch's has no derivative either)."""

    differentiable = False

    @staticmethod
    def forward(ctx: Any, a: Array, b: Array) -> Array:
        _integer_by_zero("floor_divide", a, b)
        return ctx.xp.floor_divide(a, b)


class Remainder(Function):
    """z = a - b floor(a / b), Python's ``a % b`` (PyTorch's ``remainder``): the result has the
    sign of the divisor b (C's ``fmod`` has that of a). Between the jumps of floor(a / b),
    dz/da = 1 and dz/db = -floor(a / b)."""

    @staticmethod
    def forward(ctx: Function, a: Array, b: Array) -> Array:
        _integer_by_zero("remainder", a, b)
        ctx.save_for_backward(a, b)
        return ctx.xp.remainder(a, b)

    @staticmethod
    def backward(ctx: Function, grad: Array) -> Grads:
        a, b = ctx.saved
        need_a, need_b = ctx.needs_input_grad
        gb = -grad * ctx.xp.floor_divide(a, b) if need_b else None
        return (grad if need_a else None), gb


class Pow(Function):
    """z = a ** p;  dz/da = p a^(p-1),  dz/dp = a^p log(a) (when the exponent is a tensor).

    Where p = 0, z = 1 whatever a is, and dz/da = 0 (not 0 * 0^-1 = nan at a = 0); where a = 0
    and p >= 0, dz/dp = 0 (not 1 * log 0 = -inf at p = 0): PyTorch's values at those points."""

    @staticmethod
    def forward(ctx: Function, a: Array, p: Array) -> Array:
        z = a**p
        ctx.save_for_backward(a, p, z)
        return z

    @staticmethod
    def backward(ctx: Function, grad: Array) -> Grads:
        a, p, z = ctx.saved
        need_a, need_p = ctx.needs_input_grad
        xp = ctx.xp
        ga = gp = None
        if need_a:
            if not isinstance(p, xp.ndarray):  # a number: x ** 2, x ** 0.5
                ga = grad * p * a ** (p - 1) if p != 0 else grad * 0
            else:
                with _quiet(xp):
                    ga = xp.where(p == 0, 0, grad * p * a ** (p - 1))
        if need_p:
            # For a number a (``2 ** x``), log a is a float64 0-d array: cast back to z's dtype.
            with _quiet(xp):
                gp = grad * xp.where((a == 0) & (p >= 0), 0, z * xp.log(a)).astype(z.dtype, copy=False)
        return ga, gp


class Neg(Function):
    """z = -a;  dz/da = -1."""

    reads_inputs = False  # (its backward needs only shapes: see Function.reads_inputs)

    @staticmethod
    def forward(ctx: Function, a: Array) -> Array:
        return -a

    @staticmethod
    def backward(ctx: Function, grad: Array) -> Grads:
        return -grad


# -- functions of one variable -------------------------------------------------------------
# A function of several steps (sigmoid, the tanh GELU, tanh's derivative) takes bfloat16 and
# float16 through float32 and rounds once, as PyTorch's kernels do ("opmath"): rounded at each
# step, 1 + tanh(a/2) cancels to 0 for a < -4 in bfloat16, and sigmoid(-8) would come out 0.
# (Both are on the per-op path of every tanh and sigmoid: float32 and float64 pass straight on,
# and a backward asks is_low_precision before calling _work, which costs more than the question.)
def _work(ctx: Function, *arrays: Array) -> Sequence[Array]:
    """``arrays`` in the dtype an op computes in: float32 for bfloat16 and float16, else theirs."""
    for x in arrays:
        if is_low_precision(x.dtype):
            return [ctx.backend.astype(x, float32) if is_low_precision(x.dtype) else x for x in arrays]
    return arrays  # (as given, no list built: the common case, on the per-op path)


def _stored(ctx: Function, y: Array, dtype: Any) -> Array:
    """A result computed in the working dtype, rounded once to ``dtype`` (the input's)."""
    return y if y.dtype == dtype else ctx.backend.astype(y, dtype)


class Exp(Function):
    """z = e^a;  dz/da = e^a = z."""

    @staticmethod
    def forward(ctx: Function, a: Array) -> Array:
        z = ctx.xp.exp(a)
        ctx.save_for_backward(z)
        return z

    @staticmethod
    def backward(ctx: Function, grad: Array) -> Grads:
        (z,) = ctx.saved
        return grad * z


class Log(Function):
    """z = ln a;  dz/da = 1/a."""

    @staticmethod
    def forward(ctx: Function, a: Array) -> Array:
        ctx.save_for_backward(a)
        return ctx.xp.log(a)

    @staticmethod
    def backward(ctx: Function, grad: Array) -> Grads:
        (a,) = ctx.saved
        return grad / a


class Sqrt(Function):
    """z = sqrt(a);  dz/da = 1 / (2 sqrt(a)) = 1 / (2 z)."""

    @staticmethod
    def forward(ctx: Function, a: Array) -> Array:
        z = ctx.xp.sqrt(a)
        ctx.save_for_backward(z)
        return z

    @staticmethod
    def backward(ctx: Function, grad: Array) -> Grads:
        (z,) = ctx.saved
        return grad / (2 * z)


class Tanh(Function):
    """z = tanh(a);  dz/da = 1 - tanh(a)^2 = 1 - z^2."""

    @staticmethod
    def forward(ctx: Function, a: Array) -> Array:
        z = ctx.xp.tanh(a)
        ctx.save_for_backward(z)
        return z

    @staticmethod
    def backward(ctx: Function, grad: Array) -> Grads:
        (z,) = ctx.saved
        g, z = _work(ctx, grad, z) if is_low_precision(z.dtype) else (grad, z)
        return _stored(ctx, g * (1 - z * z), grad.dtype)


class Sin(Function):
    """z = sin a;  dz/da = cos a."""

    @staticmethod
    def forward(ctx: Function, a: Array) -> Array:
        ctx.save_for_backward(a)
        return ctx.xp.sin(a)

    @staticmethod
    def backward(ctx: Function, grad: Array) -> Grads:
        (a,) = ctx.saved
        return grad * ctx.xp.cos(a)


class Cos(Function):
    """z = cos a;  dz/da = -sin a."""

    @staticmethod
    def forward(ctx: Function, a: Array) -> Array:
        ctx.save_for_backward(a)
        return ctx.xp.cos(a)

    @staticmethod
    def backward(ctx: Function, grad: Array) -> Grads:
        (a,) = ctx.saved
        return -grad * ctx.xp.sin(a)


class Sigmoid(Function):
    """z = 1 / (1 + e^-a);  dz/da = z (1 - z).

    Computed as (1 + tanh(a/2)) / 2, the same function, which never overflows e^-a.
    """

    @staticmethod
    def forward(ctx: Function, a: Array) -> Array:
        (w,) = _work(ctx, a)
        z = _stored(ctx, 0.5 * (1 + ctx.xp.tanh(0.5 * w)), a.dtype)
        ctx.save_for_backward(z)
        return z

    @staticmethod
    def backward(ctx: Function, grad: Array) -> Grads:
        (z,) = ctx.saved
        g, z = _work(ctx, grad, z) if is_low_precision(z.dtype) else (grad, z)
        return _stored(ctx, g * z * (1 - z), grad.dtype)


class ReLU(Function):
    """z = max(a, 0);  dz/da = 1 where a > 0, else 0.

    z > 0 exactly where a > 0, so backward needs only the output. On the CPU both
    directions are one-pass numba loops (``kernels/fused.py``).
    """

    @staticmethod
    def forward(ctx: Function, a: Array) -> Array:
        kernel = ctx.backend.fused("relu_forward", a.dtype)
        # (maximum, not a * (a > 0), whose negative inputs give -0.0; NaN stays NaN, as in PyTorch)
        if kernel is None:
            z = ctx.xp.maximum(a, a.dtype.type(0))
        else:  # (reshaped: ascontiguousarray makes a 0-d array 1-d)
            z = kernel(ctx.xp.ascontiguousarray(a).reshape(a.shape))
        ctx.save_for_backward(z)
        return z

    @staticmethod
    def backward(ctx: Function, grad: Array) -> Grads:
        (z,) = ctx.saved
        kernel = ctx.backend.fused("relu_backward", z.dtype)
        return kernel(z, ctx.xp.ascontiguousarray(grad).reshape(z.shape)) if kernel is not None else grad * (z > 0)


class GELU(Function):
    """z = a Phi(a) = a/2 (1 + erf(a / sqrt 2));  dz/da = Phi(a) + a phi(a).

    The Gaussian Error Linear Unit, exactly: the input scaled by the probability that a
    standard normal variable is below it. Phi is the standard normal CDF and
    phi(a) = exp(-a^2/2) / sqrt(2 pi) its density (Phi' = phi, then the product rule).
    NumPy has no erf, so the arithmetic lives in ``kernels/gelu.py``: numba on the CPU, CUDA
    on a GPU, plain array operations on any other backend. The kernels take float32 and float64;
    float16 and bfloat16 (``mt.autocast``) go through float32, rounded once at the end.
    """

    @staticmethod
    def forward(ctx: Function, a: Array) -> Array:
        ctx.kernels = _gelu_kernels(ctx.backend)
        ctx.save_for_backward(a)
        (w,) = _work(ctx, a)
        return _stored(ctx, ctx.kernels.forward(w), a.dtype)

    @staticmethod
    def backward(ctx: Function, grad: Array) -> Grads:
        (a,) = ctx.saved
        w, g = _work(ctx, a, grad) if is_low_precision(a.dtype) else (a, grad)
        return _stored(ctx, ctx.kernels.backward(w, g), grad.dtype)


def _gelu_kernels(backend: Backend) -> Any:
    # Imported on the first exact GELU: kernels/gelu.py imports numba, which is slow to
    # import (bench/import_time.py measures it) and which ``import minitensor`` does not.
    from ..kernels.gelu import for_backend

    return for_backend(backend)


_GELU_C = math.sqrt(2.0 / math.pi)


class GELUTanh(Function):
    """z = a/2 (1 + tanh(c (a + 0.044715 a^3))),  c = sqrt(2/pi).

    The tanh approximation of a Phi(a) used by BERT and GPT-2 (``gelu(approximate="tanh")``,
    as in PyTorch): cheaper than erf and within 5e-4 of it. With u = c (a + 0.044715 a^3),
    t = tanh u:  dz/da = (1 + t)/2 + a/2 (1 - t^2) c (1 + 3 * 0.044715 a^2).
    """

    @staticmethod
    def forward(ctx: Function, a: Array) -> Array:
        (w,) = _work(ctx, a)
        t = ctx.xp.tanh(_GELU_C * (w + 0.044715 * w * w * w))
        ctx.save_for_backward(a, t)  # (t in the working dtype: backward needs it unrounded)
        return _stored(ctx, 0.5 * w * (1 + t), a.dtype)

    @staticmethod
    def backward(ctx: Function, grad: Array) -> Grads:
        a, t = ctx.saved
        g, a = _work(ctx, grad, a) if is_low_precision(a.dtype) else (grad, a)
        du = _GELU_C * (1 + 3 * 0.044715 * a * a)
        return _stored(ctx, g * (0.5 * (1 + t) + 0.5 * a * (1 - t * t) * du), grad.dtype)


class Abs(Function):
    """z = |a|;  dz/da = sign(a) (0 at a = 0, as in PyTorch)."""

    @staticmethod
    def forward(ctx: Function, a: Array) -> Array:
        ctx.save_for_backward(a)
        return ctx.xp.abs(a)

    @staticmethod
    def backward(ctx: Function, grad: Array) -> Grads:
        (a,) = ctx.saved
        return grad * ctx.xp.sign(a)


class Clip(Function):
    """z = min(max(a, low), high);  dz/da = 1 where low <= a <= high, else 0."""

    @staticmethod
    def forward(ctx: Function, a: Array, low: Number | None = None, high: Number | None = None) -> Array:
        xp = ctx.xp
        inside = xp.ones(a.shape, dtype=bool)
        if low is not None:
            inside &= a >= low
        if high is not None:
            inside &= a <= high
        ctx.save_for_backward(inside)
        return xp.clip(a, low, high).astype(a.dtype, copy=False)  # (NumPy makes bfloat16 float32)

    @staticmethod
    def backward(ctx: Function, grad: Array) -> Grads:
        (inside,) = ctx.saved
        return grad * inside


class Maximum(Function):
    """z = max(a, b) elementwise;  dz/da = 1 where a > b, 0 where a < b, 1/2 where a = b
    (dz/db the rest: 1 - dz/da).

    At a tie max is not differentiable; each input gets half the gradient, PyTorch's choice,
    which keeps it a subgradient (the two halves still add up to dL/dz).
    """

    @staticmethod
    def forward(ctx: Function, a: Array, b: Array) -> Array:
        ctx.save_for_backward(a, b)
        return ctx.xp.maximum(a, b)

    @staticmethod
    def backward(ctx: Function, grad: Array) -> Grads:
        a, b = ctx.saved
        return _split_at_ties(ctx, grad, a > b, a == b)


class Minimum(Function):
    """z = min(a, b) elementwise;  dz/da = 1 where a < b, 0 where a > b, 1/2 where a = b, as
    ``Maximum``."""

    @staticmethod
    def forward(ctx: Function, a: Array, b: Array) -> Array:
        ctx.save_for_backward(a, b)
        return ctx.xp.minimum(a, b)

    @staticmethod
    def backward(ctx: Function, grad: Array) -> Grads:
        a, b = ctx.saved
        return _split_at_ties(ctx, grad, a < b, a == b)


def _split_at_ties(ctx: Function, grad: Array, a_wins: Array, tie: Array) -> Grads:
    """dL/da = dL/dz where a was chosen, half of it at a tie; dL/db what is left."""
    need_a, need_b = ctx.needs_input_grad
    share = ctx.xp.where(a_wins, 1.0, ctx.xp.where(tie, 0.5, 0.0)).astype(grad.dtype, copy=False)
    return (grad * share if need_a else None), (grad * (1 - share) if need_b else None)


class _quiet:
    """``with _quiet(xp):`` silences floating-point warnings where inf/nan are handled."""

    def __init__(self, xp: Any) -> None:
        self.errstate = getattr(xp, "errstate", None)

    def __enter__(self) -> None:
        self.ctx = self.errstate(all="ignore") if self.errstate else None
        if self.ctx is not None:
            self.ctx.__enter__()

    def __exit__(self, *exc: object) -> None:
        if self.ctx is not None:
            self.ctx.__exit__(*exc)


# -- the functional API ------------------------------------------------------------------
def add(a: Tensor | Number, b: Tensor | Number) -> Tensor:
    """z = a + b elementwise, broadcasting (``a + b`` on tensors); dz/da = dz/db = 1.

    At least one operand is a Tensor; a Python number is a constant in the tensor's dtype, an
    integer tensor meeting a float one becomes float (``promote``).
    """
    return Add.apply(*promote(a, b))


def sub(a: Tensor | Number, b: Tensor | Number) -> Tensor:
    """z = a - b elementwise, broadcasting (``a - b`` on tensors); dz/da = 1, dz/db = -1."""
    return Sub.apply(*promote(a, b))


def mul(a: Tensor | Number, b: Tensor | Number) -> Tensor:
    """z = a * b elementwise, broadcasting (``a * b`` on tensors); dz/da = b, dz/db = a."""
    return Mul.apply(*promote(a, b))


def div(a: Tensor | Number, b: Tensor | Number) -> Tensor:
    """z = a / b elementwise, broadcasting (``a / b`` on tensors); dz/da = 1/b, dz/db = -a/b^2.
    True division: integers divided give float32, as in PyTorch."""
    a, b = (as_float(x) if isinstance(x, Tensor) else x for x in promote(a, b))
    return Div.apply(a, b)


def floor_divide(a: Tensor | Number, b: Tensor | Number) -> Tensor:
    """z = floor(a / b) elementwise, broadcasting (``a // b`` on tensors): rounded toward minus
    infinity, so ``-7 // 2`` is -4; integers stay integers. Outside the graph (no derivative)."""
    return FloorDivide.apply(*promote(a, b))


def remainder(a: Tensor | Number, b: Tensor | Number) -> Tensor:
    """z = a - b floor(a / b) elementwise, broadcasting (``a % b`` on tensors): with the sign of
    b, as Python's ``%`` (``-7 % 2`` is 1); dz/da = 1, dz/db = -floor(a / b)."""
    return Remainder.apply(*promote(a, b))


def pow(a: Tensor | Number, p: Tensor | Number) -> Tensor:  # noqa: A001
    """z = a ** p elementwise (``a ** p`` on tensors), the exponent a number or a tensor;
    dz/da = p a^(p-1), and dz/dp = a^p ln a when the exponent is a tensor (0 where a^p = 0)."""
    return Pow.apply(*promote(a, p))


def neg(a: Tensor) -> Tensor:
    """z = -a elementwise (``-a`` on a tensor); dz/da = -1."""
    return Neg.apply(a)


def exp(a: Tensor) -> Tensor:
    """z = e^a elementwise; dz/da = e^a = z."""
    return Exp.apply(amp.in_float32(as_float(a)))


def log(a: Tensor) -> Tensor:
    """z = ln a, the natural logarithm, elementwise; dz/da = 1/a (-inf at 0, nan below, as in NumPy)."""
    return Log.apply(amp.in_float32(as_float(a)))


def sqrt(a: Tensor) -> Tensor:
    """z = sqrt(a) elementwise; dz/da = 1 / (2 sqrt(a))."""
    return Sqrt.apply(as_float(a))


def tanh(a: Tensor) -> Tensor:
    """z = tanh(a) = (1 - e^(-2a)) / (1 + e^(-2a)) elementwise, in (-1, 1); dz/da = 1 - z^2."""
    return Tanh.apply(as_float(a))


def sin(a: Tensor) -> Tensor:
    """z = sin a elementwise (radians); dz/da = cos a. The even columns of the sinusoidal
    positional encoding (D2L 11.6.3, Vaswani et al. 2017): sin(i / 10000^(2j/d))."""
    return Sin.apply(as_float(a))


def cos(a: Tensor) -> Tensor:
    """z = cos a elementwise (radians); dz/da = -sin a. The odd columns of the sinusoidal
    positional encoding (D2L 11.6.3): cos(i / 10000^(2j/d))."""
    return Cos.apply(as_float(a))


def sigmoid(a: Tensor) -> Tensor:
    """z = sigmoid(a) = 1 / (1 + e^(-a)) elementwise, in (0, 1); dz/da = z (1 - z).

    Computed as (1 + tanh(a/2)) / 2, the same function, which never overflows e^(-a).
    An activation function of D2L 4.1 / 5.1 (multilayer perceptrons) and the gates of a GRU.
    """
    return Sigmoid.apply(as_float(a))


def relu(a: Tensor) -> Tensor:
    """z = max(a, 0) elementwise, the rectified linear unit of D2L 4.1 / 5.1 (multilayer
    perceptrons); dz/da = 1 where a > 0, else 0."""
    return ReLU.apply(a)


_GELU_FORMS = {"none": GELU, "tanh": GELUTanh}


def gelu(a: Tensor, approximate: str = "none") -> Tensor:
    """a Phi(a), exactly (``approximate="none"``) or in the tanh approximation ("tanh"):
    PyTorch's ``gelu``, with its argument and default."""
    try:
        op = _GELU_FORMS[approximate]
    except (KeyError, TypeError):
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}") from None
    return op.apply(float_only("gelu", a))


def abs(a: Tensor) -> Tensor:  # noqa: A001
    """z = |a| elementwise; dz/da = sign(a), 0 at a = 0 (as in PyTorch)."""
    return Abs.apply(a)


def clip(a: Tensor, min: Number | None = None, max: Number | None = None) -> Tensor:  # noqa: A002
    """Clamp to [min, max] (either may be None); PyTorch calls it ``clamp``."""
    if min is None and max is None:
        raise ValueError("clip: give min, max or both")
    if isinstance(min, float) or isinstance(max, float):  # integers clamped to 1.5: float32, as in PyTorch
        a = as_float(a)
    return Clip.apply(a, min, max)


clamp = clip
"""PyTorch's name for ``clip``, the same function: every element clamped to [min, max]."""


def maximum(a: Tensor | Number, b: Tensor | Number) -> Tensor:
    """z = max(a, b) elementwise, broadcasting (PyTorch's ``maximum``, and ``max(a, b)`` with two
    tensors); dz/da = 1 where a > b, 0 where a < b, and 1/2 each at a tie. D2L 5.1's ReLU from
    scratch is ``mt.max(X, mt.zeros_like(X))``. NaN in either input gives NaN, as in PyTorch."""
    return Maximum.apply(*promote(a, b))


def minimum(a: Tensor | Number, b: Tensor | Number) -> Tensor:
    """z = min(a, b) elementwise, broadcasting (PyTorch's ``minimum``, and ``min(a, b)`` with two
    tensors); dz/da = 1 where a < b, 0 where a > b, and 1/2 each at a tie."""
    return Minimum.apply(*promote(a, b))
