"""Layer normalisation as a module."""

from __future__ import annotations

import numbers

from ..creation import ones, zeros
from ..tensor import Device, DType, Shape, Tensor
from . import functional as F
from .module import Module, Parameter


class LayerNorm(Module):
    """y = (x - mean(x)) / sqrt(var(x) + eps) * gamma + beta, over the last axes.

    The statistics are taken per example over ``normalized_shape`` (usually the feature
    axis, num_hiddens), so unlike batch norm nothing depends on the other examples of the
    batch or on train/eval mode: what a Transformer's AddNorm needs. gamma (``weight``)
    starts at 1 and beta (``bias``) at 0, so a fresh layer only normalises.
    """

    def __init__(
        self,
        normalized_shape: Shape,
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = True,
        dtype: DType = None,
        device: Device = None,
    ) -> None:
        super().__init__()
        if isinstance(normalized_shape, int):
            normalized_shape = (normalized_shape,)
        finite = isinstance(eps, numbers.Real) and not isinstance(eps, bool) and 0 <= eps < float("inf")
        if not finite:  # (var + eps < 0 would take the square root of a negative number: NaN)
            raise ValueError(f"LayerNorm: eps must be a finite number >= 0, got {eps!r}")
        self.normalized_shape, self.eps = tuple(normalized_shape), eps
        self.elementwise_affine = elementwise_affine
        if elementwise_affine:
            self.weight = Parameter(ones(self.normalized_shape, dtype=dtype, device=device))
        else:
            self.register_parameter("weight", None)
        if elementwise_affine and bias:
            self.bias = Parameter(zeros(self.normalized_shape, dtype=dtype, device=device))
        else:
            self.register_parameter("bias", None)

    def forward(self, X: Tensor) -> Tensor:
        """y = (X - mean) / sqrt(var + eps) * weight + bias (``mt.layer_norm``), the statistics over
        the last ``len(normalized_shape)`` axes of each position, e.g. (batch_size, num_steps,
        num_hiddens) with ``normalized_shape=num_hiddens``. Output of X's shape."""
        return F.layer_norm(X, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        """The settings shown in the repr: ``normalized_shape``, ``eps`` and ``elementwise_affine``."""
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"
