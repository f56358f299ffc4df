"""Layer normalisation (Ba et al., 2016) and batch normalisation (Ioffe & Szegedy, 2015), each
fused into one Function.

Layer norm, over the last axes (``normalized_shape``) of each example:

    mu = mean(x),  var = mean((x - mu)^2),  xhat = (x - mu) / sqrt(var + eps)
    y = xhat * weight + bias

Written as separate ops the graph would hold ~8 nodes and their saved arrays; the fused
backward needs only xhat and 1/sigma. With gxhat = g * weight and means over the normalised
axes:

    dL/dx = (gxhat - mean(gxhat) - xhat * mean(gxhat * xhat)) / sigma
    dL/dweight = sum(g * xhat),  dL/dbias = sum(g)   (over the other axes)

Batch norm is the same normalisation taken the other way: per channel (axis 1), over the
examples of the batch (and the positions of each, for (batch, channels, length) inputs), so
the same formulas hold with the means taken over those axes. D2L 8.5 and 11.7.2 compare them.
"""

from __future__ import annotations

import weakref
from typing import Any

from .. import amp, autograd
from ..autograd import Function, Grads
from ..dtypes import is_low_precision
from ..errors import DeviceError, DTypeError, ShapeError
from ..tensor import Array, Shape, Tensor
from .promote import full_precision


class LayerNorm(Function):
    """The normalised axes are flattened into one of size D, so x is a matrix (N, D).

    On the CPU forward and backward are numba loops over rows (``kernels/fused.py``), one
    pass each, and on a GPU CUDA kernels (``kernels/cuda/layer_norm.cu``). The NumPy form
    below is their definition (and the path on other devices);
    it computes row means as a matrix-vector product with the constant vector 1/D: the
    same numbers, but BLAS does it faster than NumPy's reduction over a short last axis.
    """

    @staticmethod
    def forward(ctx: Function, x: Array, weight: Array, bias: Array | None, num_axes: int, eps: float) -> Array:
        xp = ctx.xp
        D = 1
        for n in x.shape[x.ndim - num_axes :]:
            D *= n
        ctx.normalized_shape = x.shape[x.ndim - num_axes :]
        x2 = x.reshape(-1, D)
        kernel = ctx.backend.fused("layer_norm_forward", x.dtype)
        if kernel is not None:
            ctx.kernel_weight = _constant(ctx.backend, D, x.dtype, 1) if weight is None else weight.reshape(D)
            y, xhat, rstd = kernel(
                xp.ascontiguousarray(x2),
                ctx.kernel_weight,
                _constant(ctx.backend, D, x.dtype, 0) if bias is None else bias.reshape(D),
                x.dtype.type(eps),
            )
            ctx.save_for_backward(xhat, rstd)
            return y.reshape(x.shape)
        mean_weights = xp.full((D, 1), 1.0 / D, dtype=x.dtype)  # row @ mean_weights = row mean
        mm = ctx.backend.matmul
        centered = x2 - mm(x2, mean_weights)
        rstd = 1.0 / xp.sqrt(mm(centered * centered, mean_weights) + eps)
        xhat = centered * rstd  # (N, D)
        ctx.save_for_backward(xhat, rstd, weight, mean_weights)
        y = xhat.reshape(x.shape)
        if weight is not None:
            y = y * weight
        if bias is not None:
            y = y + bias
        return y

    @staticmethod
    def backward(ctx: Function, grad: Array) -> Grads:
        need_w, need_b = ctx.needs_input_grad[1:3]
        if len(ctx.saved) == 2:  # the forward kernel ran: so does the backward one
            xhat, rstd = ctx.saved
            kernel = ctx.backend.fused("layer_norm_backward", xhat.dtype)
            assert kernel is not None  # the backend that ran the forward kernel has this one
            gx, gw, gb = kernel(ctx.xp.ascontiguousarray(grad.reshape(xhat.shape)), xhat, rstd, ctx.kernel_weight)
            shape = ctx.normalized_shape
            return gx.reshape(grad.shape), gw.reshape(shape) if need_w else None, gb.reshape(shape) if need_b else None
        xhat, rstd, weight, mean_weights = ctx.saved
        g = grad.reshape(xhat.shape)
        gw = (g * xhat).sum(axis=0).reshape(ctx.normalized_shape) if need_w else None
        gb = g.sum(axis=0).reshape(ctx.normalized_shape) if need_b else None
        gxhat = g * weight.reshape(-1) if weight is not None else g
        mm = ctx.backend.matmul
        gx = rstd * (gxhat - mm(gxhat, mean_weights) - xhat * mm(gxhat * xhat, mean_weights))
        return gx.reshape(grad.shape), gw, gb


# The kernels take a weight and a bias; a layer without them (GPT's have no bias) hands them ones
# and zeros. Those are made once per device, size and dtype and only ever read: on a GPU a new
# array of zeros is a kernel launch (it is filled), in every layer of every step.
_CONSTANTS: weakref.WeakKeyDictionary[Any, dict[tuple[int, str, int], Array]] = weakref.WeakKeyDictionary()


def _constant(backend: Any, D: int, dtype: Any, value: int) -> Array:
    """D copies of ``value`` on ``backend``, made on first use (the kernels only read them)."""
    arrays = _CONSTANTS.setdefault(backend, {})
    key = (D, dtype.str, value)
    if key not in arrays:
        arrays[key] = backend.xp.full(D, value, dtype=dtype)
    return arrays[key]


def layer_norm(
    x: Tensor, normalized_shape: Shape, weight: Tensor | None = None, bias: Tensor | None = None, eps: float = 1e-5
) -> Tensor:
    """Layer normalisation (Ba et al. 2016; D2L 10.7 / 11.7) over the last
    ``len(normalized_shape)`` axes of ``x``, per position, with PyTorch's signature:

        mu = mean(x),  var = mean((x - mu)^2),  y = (x - mu) / sqrt(var + eps) * weight + bias

    ``normalized_shape`` (an int or a tuple) must equal those last axes, e.g. num_hiddens for
    X (batch_size, num_steps, num_hiddens); ``weight`` (gamma) and ``bias`` (beta), of that
    shape, are optional. Output of x's shape; a ``ShapeError`` if the shapes do not fit.
    """
    if isinstance(normalized_shape, int):
        normalized_shape = (normalized_shape,)
    normalized_shape = tuple(normalized_shape)
    k = len(normalized_shape)
    if tuple(x.shape[x.ndim - k :]) != normalized_shape:
        raise ShapeError(
            f"layer_norm: normalized_shape {normalized_shape} does not match the last axes of input shape {x.shape}"
        )
    for name, p in (("weight", weight), ("bias", bias)):
        if p is not None and tuple(p.shape) != normalized_shape:
            raise ShapeError(f"layer_norm: {name} has shape {p.shape}, expected {normalized_shape}")
    x = full_precision("layer_norm", x)
    weight, bias = amp.in_float32(weight), amp.in_float32(bias)  # (a bfloat16 model's, in mt.autocast)
    if is_low_precision(x.data.dtype):  # float16 or bfloat16: the mean and variance summed in float32
        w32, b32 = (None if t is None else t.float() for t in (weight, bias))
        return layer_norm(x.float(), normalized_shape, w32, b32, eps).to(x.dtype)
    return LayerNorm.apply(x, weight, bias, k, eps)


class BatchNorm(Function):
    """xhat = (x - mean) / sqrt(var + eps) per channel (axis 1), y = xhat * weight + bias, with
    ``mean`` and ``var`` the batch's (over every axis but 1), which ``batch_norm`` computes once
    for this and for the running averages and hands in. They are functions of x all the same,
    and the backward differentiates through them, as layer norm's does:

        dL/dx = (gxhat - mean(gxhat) - xhat * mean(gxhat * xhat)) / sigma,  gxhat = g * weight
        dL/dweight = sum(g * xhat),  dL/dbias = sum(g)   (means and sums over every axis but 1)
    """

    @staticmethod
    def forward(
        ctx: Function, x: Array, weight: Array | None, bias: Array | None, mean: Array, var: Array, eps: float
    ) -> Array:
        channel = (1, -1) + (1,) * (x.ndim - 2)  # a (C,) vector as (1, C, 1, ...): it broadcasts along axis 1
        rstd = (1.0 / ctx.xp.sqrt(var + eps)).reshape(channel)
        xhat = (x - mean.reshape(channel)) * rstd
        ctx.save_for_backward(xhat, rstd, weight)
        y = xhat
        if weight is not None:
            y = y * weight.reshape(channel)
        if bias is not None:
            y = y + bias.reshape(channel)
        return y

    @staticmethod
    def backward(ctx: Function, grad: Array) -> Grads:
        xhat, rstd, weight = ctx.saved
        axes = (0, *range(2, grad.ndim))
        need_w, need_b = ctx.needs_input_grad[1:3]
        gw = (grad * xhat).sum(axis=axes) if need_w else None
        gb = grad.sum(axis=axes) if need_b else None
        gxhat = grad * weight.reshape(rstd.shape) if weight is not None else grad
        gx = rstd * (
            gxhat - gxhat.mean(axis=axes, keepdims=True) - xhat * (gxhat * xhat).mean(axis=axes, keepdims=True)
        )
        return gx, gw, gb


def batch_norm(
    x: Tensor,
    running_mean: Tensor | None,
    running_var: Tensor | None,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    training: bool = False,
    momentum: float = 0.1,
    eps: float = 1e-5,
) -> Tensor:
    """Batch normalisation (Ioffe & Szegedy 2015; D2L 8.5) of x (batch_size, C) or (batch_size,
    C, L...), per channel C, with PyTorch's signature:

        training:  mu, var = the batch's mean and variance over every axis but 1
                   running_mean <- (1 - momentum) running_mean + momentum mu
                   running_var  <- (1 - momentum) running_var + momentum var * n / (n - 1)
        otherwise: mu, var = running_mean, running_var
        y = (x - mu) / sqrt(var + eps) * weight + bias

    n is the number of values per channel; the running variance takes the unbiased estimate, the
    normalisation the batch's own (PyTorch's choice too). The running statistics (C,) are
    updated in place when given (either may be None in training); ``weight`` (gamma) and
    ``bias`` (beta), of shape (C,), are optional. Output of x's shape.
    """
    x = full_precision("batch_norm", x)
    if x.ndim < 2:
        raise ShapeError(f"batch_norm: input of shape {x.shape}; expected (batch_size, C) or (batch_size, C, L...)")
    C = x.shape[1]
    named = (("running_mean", running_mean), ("running_var", running_var), ("weight", weight), ("bias", bias))
    for name, t in named:
        if t is not None and tuple(t.shape) != (C,):
            raise ShapeError(f"batch_norm: {name} has shape {t.shape}, expected ({C},) for input of shape {x.shape}")
        if t is not None and t._backend is not x._backend:
            raise DeviceError(f"batch_norm: {name} is on {t.device!r}, the input on {x.device!r}; move one with .to()")
    if not training and (running_mean is None or running_var is None):
        raise ValueError(
            "batch_norm: outside training it normalises with running_mean and running_var; both are needed"
        )
    weight, bias = amp.in_float32(weight), amp.in_float32(bias)
    if is_low_precision(x.data.dtype):  # float16 or bfloat16: the statistics summed in float32
        w32, b32 = (None if t is None else t.float() for t in (weight, bias))
        return batch_norm(x.float(), running_mean, running_var, w32, b32, training, momentum, eps).to(x.dtype)
    for name, t in (("weight", weight), ("bias", bias)):  # (the running statistics are read in x's dtype)
        if t is not None and t.dtype != x.dtype:
            raise DTypeError(
                f"batch_norm: {name} is {t.dtype}, the input {x.dtype}; convert one, "
                f"e.g. the layer with .to(mt.{x.dtype})"
            )
    channel = (1, C) + (1,) * (x.ndim - 2)  # a (C,) vector as (1, C, 1, ...): it broadcasts along axis 1
    if not training:  # fixed statistics: plain ops, so gradients reach x, weight and bias as usual
        assert running_mean is not None and running_var is not None  # (checked above)
        scale = (running_var.to(x.dtype).reshape(channel) + eps) ** -0.5
        y = (x - running_mean.to(x.dtype).reshape(channel)) * scale
        if weight is not None:
            y = y * weight.reshape(channel)
        return y + bias.reshape(channel) if bias is not None else y
    n = x.numel() // C if C else 0
    if n <= 1:  # (one value per channel has no variance: every output would be 0)
        raise ValueError(
            f"batch_norm: the batch's own statistics (training mode, or no running statistics) need more than 1 "
            f"value per channel, got input of shape {x.shape}"
        )
    axes = (0, *range(2, x.ndim))
    mean, var = x.data.mean(axis=axes), x.data.var(axis=axes)
    for stat, value in ((running_mean, mean), (running_var, var * (n / (n - 1)))):
        if stat is not None:
            stat.data *= 1 - momentum
            stat.data += (momentum * value).astype(stat.data.dtype, copy=False)
            autograd.writes.note(stat)  # (a graph that read the old value must not use the new one)
    return BatchNorm.apply(x, weight, bias, mean, var, eps)
