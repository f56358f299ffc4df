"""The vector norm ``norm`` (D2L 2.3.11), at the end, and layer normalisation (Ba et al., 2016),
fused into one Function.

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

import math
import weakref
from typing import Any

from ..autograd import Function, Grads
from ..errors import ShapeError
from ..tensor import Array, Axes, Shape, Tensor
from .axes import torch_names
from .promote import as_float, float_only
from .reduce import _expand, _keepdims_shape, reduced_axes


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
    return LayerNorm.apply(float_only("layer_norm", x), weight, bias, k, eps)


class Norm(Function):
    """z = (sum_i |a_i|^p)^(1/p) over the axes;  dz/da_i = sign(a_i) |a_i|^(p-1) / z^(p-1).

    For p = 2 that is a_i / z, the vector divided by its length; for p = 1, sign(a_i); for
    p = inf, z = max_i |a_i| and the gradient goes to the largest |a_i| (ties share it, as
    ``max``'s). Where z = 0 (all zeros) the gradient is 0, not 0/0: PyTorch's subgradient.
    """

    @staticmethod
    def forward(ctx: Function, a: Array, p: float, axis: Axes | None = None, keepdims: bool = False) -> Array:
        xp = ctx.xp
        axes = reduced_axes(axis, a.ndim, "norm")
        size = abs(a)
        if p == math.inf:
            z = size.max(axis=axes, keepdims=True) if a.size else xp.zeros(_keepdims_shape(a.shape, axes), a.dtype)
        elif p == 2:
            z = xp.sqrt((a * a).sum(axis=axes, keepdims=True))
        elif p == 1:
            z = size.sum(axis=axes, keepdims=True)
        else:
            z = (size**p).sum(axis=axes, keepdims=True) ** (1 / p)
        ctx.save_for_backward(a, z)
        ctx.p, ctx.shape, ctx.axes = p, a.shape, axes
        return z if keepdims else z.reshape(tuple(n for i, n in enumerate(a.shape) if i not in axes))

    @staticmethod
    def backward(ctx: Function, grad: Array) -> Grads:
        a, z = ctx.saved
        xp, p = ctx.xp, ctx.p
        safe = xp.where(z == 0, 1, z)  # all zeros: any finite z, the share below is 0 anyway
        if p == math.inf:
            top = (abs(a) == z).astype(a.dtype)
            share = xp.sign(a) * top / top.sum(axis=ctx.axes, keepdims=True)
        elif p == 2:
            share = a / safe
        elif p == 1:
            share = xp.sign(a)
        else:
            share = xp.sign(a) * (abs(a) / safe) ** (p - 1)
        share = xp.where(z == 0, 0, share).astype(grad.dtype, copy=False)
        return _expand(xp, grad, ctx.shape, ctx.axes) * share


@torch_names
def norm(a: Tensor, p: float | str = "fro", axis: Axes | None = None, keepdims: bool = False) -> Tensor:
    """The p-norm (sum_i |a_i|^p)^(1/p) over ``axis`` (None: every element, as one long vector);
    by default p = 2 ("fro", the Frobenius norm of a matrix: the length of the vector of its
    elements), PyTorch's ``torch.norm(x)`` (D2L 2.3.11). ``p`` is any number > 0 or
    ``math.inf`` (the largest |a_i|). dz/da_i = sign(a_i) |a_i|^(p-1) / z^(p-1), which is a / z
    for p = 2 and 0 where z = 0. ``keepdims`` as for ``sum``. Integers give float32."""
    if p == "fro":
        p = 2.0
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not p > 0:
        raise ValueError(f"norm: p must be 'fro' or a number > 0 (math.inf for the largest |a_i|), got {p!r}")
    return Norm.apply(as_float(a), float(p), axis=axis, keepdims=keepdims)
