"""Layer and batch normalisation as modules."""

from __future__ import annotations

import numbers

from ..creation import ones, zeros
from ..errors import ShapeError
from ..tensor import Device, DType, Shape, Tensor, tensor
from . import functional as F
from .module import _LAZY, Module, Parameter, UninitializedBuffer, UninitializedParameter


def _check_eps(owner: str, eps: float) -> None:
    """``eps`` must be a finite number >= 0 (var + eps < 0 would take the square root of a
    negative number: NaN)."""
    if not (isinstance(eps, numbers.Real) and not isinstance(eps, bool) and 0 <= eps < float("inf")):
        raise ValueError(f"{owner}: eps must be a finite number >= 0, got {eps!r}")


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
        _check_eps("LayerNorm", eps)
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


class _BatchNorm(Module):
    """Batch normalisation (Ioffe & Szegedy 2015; D2L 8.5): y = (x - mean) / sqrt(var + eps) *
    gamma + beta per channel (axis 1), the statistics taken over the batch (and the positions).

    In training mode it normalises with the batch's own mean and variance and keeps running
    averages of them (``running_mean``, ``running_var``, buffers saved in the ``state_dict``):
    running = (1 - momentum) running + momentum batch, or with ``momentum=None`` the plain
    average of every batch so far (``num_batches_tracked`` of them). In eval mode (``model.eval()``)
    it normalises with those averages, so an example's output no longer depends on the others
    of its batch. ``track_running_stats=False``: no averages, the batch's statistics in both
    modes. gamma (``weight``) starts at 1 and beta (``bias``) at 0; ``affine=False``: neither,
    ``bias=False``: no beta.

    Layer norm (``LayerNorm``) takes its statistics per example instead, which is why a
    Transformer uses it: D2L 11.7.2 shows the two side by side.
    """

    ranks: tuple[int, ...] = ()  # the input ranks the layer takes
    expected = ""  # those shapes, in words
    least_features = 1  # (a lazy layer has 0 until its first input)
    weight: Parameter | None
    bias: Parameter | None
    running_mean: Tensor | None
    running_var: Tensor | None
    num_batches_tracked: Tensor | None

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        bias: bool = True,
        dtype: DType = None,
        device: Device = None,
    ) -> None:
        super().__init__()
        name = type(self).__name__
        if not isinstance(num_features, (int, numbers.Integral)) or isinstance(num_features, bool):
            raise TypeError(f"{name}: num_features must be a whole number, got {num_features!r}")
        if num_features < self.least_features:
            raise ValueError(f"{name}: num_features must be at least {self.least_features}, got {num_features}")
        _check_eps(name, eps)
        if momentum is not None and not (
            isinstance(momentum, numbers.Real) and not isinstance(momentum, bool) and 0 <= momentum <= 1
        ):
            raise ValueError(f"{name}: momentum must be a number in [0, 1] or None (a plain average), got {momentum!r}")
        self.eps, self.momentum = eps, momentum
        self.affine, self.track_running_stats = bool(affine), bool(track_running_stats)
        C = int(num_features)
        if affine:
            self.weight = Parameter(ones(C, dtype=dtype, device=device))
        else:
            self.register_parameter("weight", None)
        if affine and bias:
            self.bias = Parameter(zeros(C, dtype=dtype, device=device))
        else:
            self.register_parameter("bias", None)
        if track_running_stats:
            self.register_buffer("running_mean", zeros(C, dtype=dtype, device=device))
            self.register_buffer("running_var", ones(C, dtype=dtype, device=device))
            self.register_buffer("num_batches_tracked", tensor(0, dtype="int64", device=device))
        else:
            for buffer in ("running_mean", "running_var", "num_batches_tracked"):
                self.register_buffer(buffer, None)
        self._num_features = C

    @property
    def num_features(self) -> int | None:
        """C, the channels (axis 1) of the inputs."""
        return self._num_features

    def forward(self, X: Tensor) -> Tensor:
        """Y = (X - mean) / sqrt(var + eps) * weight + bias per channel: the batch's statistics in
        training (updating the running ones), the running ones in eval mode. Output of X's shape."""
        name = type(self).__name__
        if not isinstance(X, Tensor):
            raise TypeError(f"{name}: expected a Tensor, got {type(X).__name__}")
        if X.ndim not in self.ranks:
            raise ShapeError(f"{name}: expected {self.expected} input, got shape {X.shape}")
        if X.shape[1] != self.num_features:
            raise ShapeError(
                f"{name}: input of shape {X.shape} has {X.shape[1]} channels (axis 1); "
                f"the layer has num_features={self.num_features}"
            )
        count = self.num_batches_tracked if self.training else None  # (None too without running statistics)
        factor = self.momentum
        if count is not None and self.momentum is None:  # a plain average: batch n weighs 1/n (reads the count)
            factor = 1.0 / (int(count.item()) + 1)
        use_batch = self.training or not self.track_running_stats
        Y = F.batch_norm(
            X, self.running_mean, self.running_var, self.weight, self.bias, use_batch, factor or 0.0, self.eps
        )
        if count is not None:  # (after the batch was taken: a refused one counts for nothing)
            count.data += 1  # (on the device: no wait for it)
        return Y

    def extra_repr(self) -> str:
        """PyTorch's: ``3, eps=1e-05, momentum=0.1, affine=True, track_running_stats=True``."""
        return (
            f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}, "
            f"track_running_stats={self.track_running_stats}"
        )


class BatchNorm1d(_BatchNorm):
    """Batch norm of (batch_size, C) features or (batch_size, C, L) sequences (see ``_BatchNorm``)."""

    ranks, expected = (2, 3), "(batch_size, num_features) or (batch_size, num_features, length)"


class BatchNorm2d(_BatchNorm):
    """Batch norm of (batch_size, C, H, W) images, per channel (see ``_BatchNorm``)."""

    ranks, expected = (4,), "(batch_size, num_features, height, width)"


class _LazyBatchNorm(_BatchNorm):
    """A batch norm whose num_features is axis 1 of its first input (PyTorch's ``LazyBatchNorm1d``;
    D2L 11.7.2 compares ``nn.LazyBatchNorm1d()`` with ``nn.LayerNorm``). Until then its weight
    and bias are ``UninitializedParameter``s and its running statistics ``UninitializedBuffer``s;
    ``load_state_dict`` gives them the saved shape instead, as for ``LazyLinear``."""

    least_features = 0

    def __init__(
        self,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        bias: bool = True,
        dtype: DType = None,
        device: Device = None,
    ) -> None:
        super().__init__(0, eps, momentum, affine, track_running_stats, bias, dtype, device)
        if affine:
            self.weight = UninitializedParameter(self.weight)
        if affine and bias:
            self.bias = UninitializedParameter(self.bias)
        if self.running_mean is not None and self.running_var is not None:  # (track_running_stats)
            self.running_mean = UninitializedBuffer(self.running_mean)
            self.running_var = UninitializedBuffer(self.running_var)

    @property
    def num_features(self) -> int | None:
        """C: None until the first input (or a loaded state_dict) sets it."""
        for t in (self.weight, self.running_mean):
            if t is not None:
                return None if isinstance(t, _LAZY) else t.shape[0]
        return self._num_features or None  # (neither: affine=False and no running statistics)

    def forward(self, X: Tensor) -> Tensor:
        """The first call sets num_features = X.shape[1] (X of a rank the layer takes)."""
        if self.num_features is None and isinstance(X, Tensor) and X.ndim in self.ranks:
            C = X.shape[1]
            for t, value in ((self.weight, 1), (self.bias, 0), (self.running_mean, 0), (self.running_var, 1)):
                if isinstance(t, _LAZY):
                    t.materialize(t._backend.xp.full(C, value, dtype=t.data.dtype))
            self._num_features = C
        return super().forward(X)


class LazyBatchNorm1d(_LazyBatchNorm, BatchNorm1d):
    """``BatchNorm1d`` whose num_features is axis 1 of its first input."""


class LazyBatchNorm2d(_LazyBatchNorm, BatchNorm2d):
    """``BatchNorm2d`` whose num_features is axis 1 of its first input."""
