"""Changing dtype or device, differentiably: the gradient goes back the same way."""

from __future__ import annotations

from .. import grad_mode
from ..autograd import Function, Grads
from ..backends import Backend
from ..dtypes import as_dtype, is_floating
from ..tensor import Array, DType, Tensor


class AsType(Function):
    """z = a converted to ``dtype``;  dL/da = dL/dz converted back (by the backend's ``astype``:
    float32 to and from bfloat16, ``mt.autocast``'s casts, by its kernels)."""

    @staticmethod
    def forward(ctx: Function, a: Array, dtype: DType) -> Array:
        ctx.dtype = a.dtype
        return ctx.backend.astype(a, dtype)

    @staticmethod
    def backward(ctx: Function, grad: Array) -> Grads:
        return ctx.backend.astype(grad, ctx.dtype)


def astype(a: Tensor, dtype: DType) -> Tensor:
    """``a`` converted to ``dtype`` (a dtype, or its name such as ``"float64"``); the gradient is
    converted back to a's dtype. ``x.to(dtype)`` and ``x.astype(dtype)`` call it.

    Integers and booleans carry no gradient: converted to one of those, the result leaves the
    graph (``x.long()`` does not require grad), as in PyTorch."""
    dtype = as_dtype(dtype, "astype")
    if not is_floating(dtype) and dtype.kind != "c" and a.requires_grad:
        with grad_mode.no_grad():
            return AsType.apply(a, dtype)
    return AsType.apply(a, dtype)


class ToDevice(Function):
    """z = a copied to another device;  dL/da = dL/dz copied back to a's device.

    ``Function.apply`` builds its output on the *input's* backend, so this one op is wired
    by hand in ``to_device``: forward is the explicit host round trip, the only place where
    device data legitimately passes through NumPy.
    """

    @staticmethod
    def backward(ctx: Function, grad: Array) -> Grads:
        return ctx.source.array(ctx.backend.to_numpy(grad))


def to_device(a: Tensor, target: Backend) -> Tensor:
    """``a`` copied to the backend ``target`` (a ``Backend``, e.g. ``mt.get_backend("cuda")``),
    through host memory; the gradient is copied back to a's device. ``x.to(device)`` calls it.

    The result is recorded in the graph only when ``a`` requires grad and grad mode is on.
    """
    a._backend.raise_failed_checks()  # a read from a's device, as Tensor.numpy() is
    data = target.array(a._backend.to_numpy(a.data))
    if not (a.requires_grad and grad_mode.is_grad_enabled()):
        return Tensor._make(data, target, None)
    ctx = ToDevice.__new__(ToDevice)
    ctx.xp, ctx.backend, ctx.source, ctx.inputs = target.xp, target, a._backend, (a,)
    return Tensor._make(data, target, ctx)
