"""Layer normalisation (Ba et al., 2016), fused into one Function.

Over the last axes (``normalized_shape``) of each example:

    mu = mean(x),  var = mean((x - mu)^2),  xhat = (x - mu) / sqrt(var + eps)
    y = xhat * weight + bias

Written as separate ops the graph would hold ~8 nodes and their saved arrays; the fused
backward needs only xhat and 1/sigma. With gxhat = g * weight and means over the normalised
axes:

    dL/dx = (gxhat - mean(gxhat) - xhat * mean(gxhat * xhat)) / sigma
    dL/dweight = sum(g * xhat),  dL/dbias = sum(g)   (over the other axes)
"""

from __future__ import annotations

import weakref
from typing import Any

from .. import amp
from ..autograd import Function, Grads
from ..dtypes import is_low_precision
from ..errors import ShapeError
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
