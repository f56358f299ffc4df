"""Gradient clipping: ``clip_grad_norm_`` (PyTorch's ``torch.nn.utils.clip_grad_norm_``) and
``grad_norm``.

Recurrent networks multiply by the same weights at every step, so one unlucky batch can
produce a gradient many orders of magnitude larger than the rest and throw the parameters
far away (D2L 9.5, "gradient clipping"). Clipping rescales the whole gradient g, all
parameters seen as one long vector, when its norm is too large:

    g <- g * min(1, max_norm / (||g|| + 1e-6))

The direction is kept; only the step length is capped. (The 1e-6 is PyTorch's, and keeps a
zero gradient from being divided by zero.)

The norm and the factor are computed on the gradients' device and never read on the host:
on a GPU a read would make the training step wait there for its own backward pass.

On a GPU the 2-norm and the rescaling take three kernel launches in all, whatever the number of
parameters (``backend.fused("l2_norm_multi" / "scale_multi", dtype)``: the multi-tensor kernels
of ``kernels/cuda/multi_tensor.cu``), where a norm and a scale per gradient cost five launches
each (a small model's step there is bound by launches: each costs the host more time than its
kernel takes to run; bench/launches.py counts them). The CPU, where a launch costs nothing,
computes them gradient by gradient.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable
from typing import Any

from ..errors import DeviceError
from ..grad_mode import no_grad
from ..tensor import Array, Tensor


def _grads(parameters: Tensor | Iterable[Tensor]) -> list[Tensor]:
    parameters = [parameters] if isinstance(parameters, Tensor) else list(parameters)
    grads = [p.grad for p in parameters if p.grad is not None]
    for g in grads[1:]:
        if g._backend is not grads[0]._backend:
            raise DeviceError(
                f"clip_grad_norm_: gradients on different devices, {grads[0].device!r} and {g.device!r}; "
                "clip the parameters of each device separately"
            )
    return grads


def _check_norm_type(norm_type: float) -> float:
    norm_type = float(norm_type)
    if not (norm_type > 0):
        raise ValueError(f"grad_norm: norm_type must be > 0 (or inf), got {norm_type}")
    return norm_type


def _multi_tensor(grads: list[Tensor], norm_type: float) -> tuple[Any, Any] | None:
    """The backend's multi-tensor (l2_norm_multi, scale_multi) for these gradients, or None: only
    for the 2-norm of C-contiguous gradients of one dtype (a mixed list goes gradient by gradient)."""
    dtype, backend = grads[0].dtype, grads[0]._backend
    if norm_type != 2.0 or any(g.dtype != dtype or not g.data.flags.c_contiguous for g in grads):
        return None
    norm, scale = backend.fused("l2_norm_multi", dtype), backend.fused("scale_multi", dtype)
    return None if norm is None or scale is None else (norm, scale)


def _total_norm(grads: list[Tensor], norm_type: float) -> Array:
    """||g||_p of all gradients together, as a 0-d backend array (no copy to the host).

    ||g||_p = (sum_i |g_i|^p)^(1/p) over every element of every gradient; computed as the
    p-norm of the per-parameter p-norms, which is the same number. p = inf: max_i |g_i|.
    """
    xp = grads[0]._backend.xp
    if math.isinf(norm_type):
        norms = [xp.abs(g.data).max() for g in grads]
        return xp.stack(norms).max()
    if norm_type == 2.0:  # the common case, without a power per element
        norms = [xp.sqrt((g.data * g.data).sum()) for g in grads]
        return xp.sqrt((xp.stack(norms) ** 2).sum())
    norms = [(xp.abs(g.data) ** norm_type).sum() ** (1.0 / norm_type) for g in grads]
    return ((xp.stack(norms) ** norm_type).sum()) ** (1.0 / norm_type)


def grad_norm(parameters: Tensor | Iterable[Tensor], norm_type: float = 2.0) -> Tensor:
    """The norm of all gradients of ``parameters`` as one vector (parameters without a gradient
    are skipped), as a 0-d Tensor; 0 if none has a gradient. Useful to log next to the loss."""
    norm_type = _check_norm_type(norm_type)
    grads = _grads(parameters)
    if not grads:
        return Tensor(0.0)
    with no_grad():
        multi = _multi_tensor(grads, norm_type)
        total = multi[0]([g.data for g in grads])[0] if multi else _total_norm(grads, norm_type)
        return Tensor._make(total, grads[0]._backend, None)


def clip_grad_norm_(
    parameters: Tensor | Iterable[Tensor], max_norm: float, norm_type: float = 2.0, error_if_nonfinite: bool = False
) -> Tensor:
    """Rescale the gradients of ``parameters`` in place so that their total norm is at most
    ``max_norm`` (see the module docstring). Returns the total norm *before* clipping, a 0-d
    Tensor, as PyTorch does: log it to see how often and how hard clipping acts.

    ``parameters``: a Tensor or an iterable of them (``model.parameters()``); those without a
    gradient are skipped. ``norm_type``: p of the p-norm, ``float("inf")`` for the max norm.

    A non-finite total norm (inf or NaN: some gradient overflowed) is returned and the
    gradients are left as they are -- scaling by max_norm / inf would silently turn them into
    zeros or NaN. The caller decides: typically skip this optimiser step when
    ``not math.isfinite(norm)``. With ``error_if_nonfinite=True`` it raises RuntimeError instead
    (that reads the norm on the host: on a GPU, the host waits for backward there).
    (PyTorch, by default, scales anyway.)

    The factor is computed on the device and every gradient multiplied by it, 1 when no
    clipping is needed (as PyTorch does): deciding on the host whether to clip would mean
    reading the norm, and waiting for the device, at every step.
    """
    norm_type = _check_norm_type(norm_type)
    if isinstance(max_norm, bool) or not (isinstance(max_norm, numbers.Real) and max_norm >= 0):
        # (a negative one would flip the gradients, NaN would make them NaN: PyTorch takes both;
        # inf is PyTorch's idiom for "only measure the norm")
        raise ValueError(f"clip_grad_norm_: max_norm must be a number >= 0 (inf: no clipping), got {max_norm!r}")
    grads = _grads(parameters)
    if not grads:
        return Tensor(0.0)
    with no_grad():
        multi = _multi_tensor(grads, norm_type)
        if multi:  # the norm and the factor below in two launches, the scaling in one
            total, factor = multi[0]([g.data for g in grads], max_norm)
        else:
            total = _total_norm(grads, norm_type)
        xp = grads[0]._backend.xp
        if error_if_nonfinite and not math.isfinite(value := float(total)):  # the caller asked: read it
            raise RuntimeError(
                f"clip_grad_norm_: the total {norm_type}-norm of the gradients is {value}; some gradient "
                "overflowed or is NaN (skip this step, lower the learning rate, or check the loss)"
            )
        if multi:
            multi[1]([g.data for g in grads], factor)
            return Tensor._make(total, grads[0]._backend, None)
        # min(1, max_norm / (norm + 1e-6)), and 1 for a non-finite norm; in float64 as a Python
        # number would be, then rounded to each gradient's dtype
        norm = xp.asarray(total).astype("float64")
        scale = max_norm / (norm + 1e-6)
        scale = xp.where(xp.isfinite(norm) & (scale < 1.0), scale, 1.0)
        for g in grads:
            g.mul_(scale.astype(g.dtype))  # in place is safe: backward gives every .grad an array of its own
        return Tensor._make(total, grads[0]._backend, None)
