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

from ..autograd import Function
from ..errors import ShapeError


class LayerNorm(Function):
    @staticmethod
    def forward(ctx, x, weight, bias, num_axes, eps):
        xp = ctx.xp
        axes = tuple(range(x.ndim - num_axes, x.ndim))
        mu = x.mean(axis=axes, keepdims=True)
        centered = x - mu
        var = (centered * centered).mean(axis=axes, keepdims=True)
        rstd = 1.0 / xp.sqrt(var + eps)
        xhat = centered * rstd
        ctx.save_for_backward(xhat, rstd, weight)
        ctx.axes = axes
        y = xhat
        if weight is not None:
            y = y * weight
        if bias is not None:
            y = y + bias
        return y

    @staticmethod
    def backward(ctx, grad):
        xhat, rstd, weight = ctx.saved
        axes = ctx.axes
        need_w, need_b = ctx.needs_input_grad[1:3]
        outer = tuple(range(grad.ndim - len(axes)))
        gw = (grad * xhat).sum(axis=outer) if need_w else None
        gb = grad.sum(axis=outer) if need_b else None
        gxhat = grad * weight if weight is not None else grad
        gx = rstd * (
            gxhat - gxhat.mean(axis=axes, keepdims=True) - xhat * (gxhat * xhat).mean(axis=axes, keepdims=True)
        )
        return gx, gw, gb


def layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    """Normalise the last ``len(normalized_shape)`` axes of ``x`` (PyTorch's signature)."""
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
    return LayerNorm.apply(x, weight, bias, k, eps)
