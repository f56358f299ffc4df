"""Convolution layers: ``Conv1d`` over sequences (functional form ``ops.conv1d``), and ``Conv2d``
and ``LazyConv2d`` over images (``ops.conv2d``), with which D2L 11.8's vision Transformer cuts
an image into patches.

A Conv1d layer slides ``out_channels`` filters of width k along a sequence:

    Y[b, o, i] = bias[o] + sum_{c, j} W[o, c, j] * X_pad[b, c, i * stride + j * dilation]

X (batch, in_channels, L) is "channels first", as in PyTorch; X_pad is X with ``padding``
zeros on both ends. Output length L_out = floor((L + 2 padding - dilation (k - 1) - 1) / stride) + 1.
(Like PyTorch, this is cross-correlation: the filter is not flipped.)

In D2L's comparison (10.6 / 11.6) of CNNs, RNNs and self-attention on a sequence of n tokens with d
channels, a convolution of width k costs O(k n d^2), its n outputs are computed in parallel,
and two tokens n apart are linked only after O(n / k) stacked layers.

The computation -- ``conv1d``, im2col forward and col2im backward -- is in ``ops/conv.py``;
this file holds the layer that owns the weights.
"""

from __future__ import annotations

import math

from ..creation import zeros
from ..errors import ShapeError
from ..ops.conv import conv1d, conv2d, pair
from ..tensor import Device, DType, Tensor
from . import init
from .module import Module, Parameter, UninitializedParameter


def _check_sizes(layer: Module, in_channels: int, out_channels: int, **sizes: int | tuple[int, int]) -> None:
    """Refuse, naming ``layer``'s class, sizes that make no convolution: channels and kernel sizes
    below 1 (in_channels below the layer's ``least_in_channels``), a stride or dilation below 1, a
    negative padding (each an int, or a pair for ``Conv2d``)."""
    owner = type(layer).__name__
    least = {"in_channels": layer.least_in_channels, "out_channels": 1, "padding": 0}
    for name, value in (("in_channels", in_channels), ("out_channels", out_channels), *sizes.items()):
        for v in value if isinstance(value, tuple) else (value,):
            if not isinstance(v, int) or isinstance(v, bool):
                raise TypeError(f"{owner}: {name} must be a whole number, got {value!r}")
            if v < least.get(name, 1):
                raise ValueError(f"{owner}: {name} must be at least {least.get(name, 1)}, got {value!r}")


class Conv1d(Module):
    """``Conv1d(in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, bias=True)``,
    as ``torch.nn.Conv1d``: X (batch, in_channels, L) -> (batch, out_channels, L_out), see
    the module docstring for the formula and L_out. ``padding=(kernel_size - 1) // 2`` with
    stride 1 and an odd kernel keeps the length.

    ``weight`` (out_channels, in_channels, kernel_size) and ``bias`` (out_channels,) are
    initialised as in PyTorch: U(-b, b), b = 1 / sqrt(in_channels * kernel_size).
    A (batch, num_steps, d) sequence, as attention layers take it, is
    ``X.swapaxes(1, 2)`` before and after.
    """

    least_in_channels = 1  # (a lazy layer has 0 until its first input)

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        stride: int = 1,
        padding: int = 0,
        dilation: int = 1,
        bias: bool = True,
        dtype: DType = None,
        device: Device = None,
    ) -> None:
        super().__init__()
        _check_sizes(
            self, in_channels, out_channels,
            kernel_size=kernel_size, stride=stride, padding=padding, dilation=dilation,
        )  # fmt: skip
        self.in_channels, self.out_channels, self.kernel_size = in_channels, out_channels, kernel_size
        self.stride, self.padding, self.dilation = stride, padding, dilation
        self.weight = Parameter(zeros(out_channels, in_channels, kernel_size, dtype=dtype, device=device))
        if bias:
            self.bias = Parameter(zeros(out_channels, dtype=dtype, device=device))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Draw new weights and biases from U(-b, b), b = 1 / sqrt(in_channels * kernel_size), as
        PyTorch initialises ``nn.Conv1d``."""
        fan_in = self.in_channels * self.kernel_size
        bound = 1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0
        init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
            init.uniform_(self.bias, -bound, bound)

    def forward(self, X: Tensor) -> Tensor:
        """The convolution (``mt.conv1d``, a cross-correlation: the filter is not flipped), with
        X_pad = X with ``padding`` zeros at both ends and k = kernel_size:

            Y[b, o, i] = bias[o] + sum_{c, j} W[o, c, j] * X_pad[b, c, i * stride + j * dilation]

        X (batch_size, in_channels, L) -> Y (batch_size, out_channels, L_out), with
        L_out = floor((L + 2 padding - dilation (k - 1) - 1) / stride) + 1.
        """
        return conv1d(X, self.weight, self.bias, self.stride, self.padding, self.dilation)

    def extra_repr(self) -> str:
        """The settings shown in the repr: the channels and ``kernel_size``, plus ``stride``,
        ``padding``, ``dilation`` and ``bias`` where they differ from the defaults."""
        s = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}"
        for name, default in (("stride", 1), ("padding", 0), ("dilation", 1)):
            if getattr(self, name) != default:
                s += f", {name}={getattr(self, name)}"
        return s + ("" if self.bias is not None else ", bias=False")


class Conv2d(Module):
    """``Conv2d(in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, bias=True)``,
    as ``torch.nn.Conv2d`` (no ``groups``): X (batch, in_channels, H, W) -> (batch, out_channels,
    H_out, W_out). ``kernel_size``, ``stride``, ``padding`` and ``dilation`` are an int or an
    (along H, along W) pair; each spatial axis follows ``Conv1d``'s formula:

        Y[b, o, r, s] = bias[o] + sum_{c, i, j} W[o, c, i, j] X_pad[b, c, r sh + i dh, s sw + j dw]

    ``weight`` (out_channels, in_channels, kh, kw) and ``bias`` (out_channels,) are drawn as in
    PyTorch: U(-b, b), b = 1 / sqrt(in_channels * kh * kw).
    """

    least_in_channels = 1  # (a lazy layer has 0 until its first input)

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | tuple[int, int],
        stride: int | tuple[int, int] = 1,
        padding: int | tuple[int, int] = 0,
        dilation: int | tuple[int, int] = 1,
        bias: bool = True,
        dtype: DType = None,
        device: Device = None,
    ) -> None:
        super().__init__()
        self.in_channels, self.out_channels = in_channels, out_channels
        name = type(self).__name__
        self.kernel_size, self.stride = pair("kernel_size", kernel_size, name), pair("stride", stride, name)
        self.padding, self.dilation = pair("padding", padding, name), pair("dilation", dilation, name)
        _check_sizes(
            self, in_channels, out_channels,
            kernel_size=self.kernel_size, stride=self.stride, padding=self.padding, dilation=self.dilation,
        )  # fmt: skip
        kh, kw = self.kernel_size
        self.weight = Parameter(zeros(out_channels, in_channels, kh, kw, dtype=dtype, device=device))
        if bias:
            self.bias = Parameter(zeros(out_channels, dtype=dtype, device=device))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Draw new weights and biases from U(-b, b), b = 1 / sqrt(in_channels * kh * kw), as
        PyTorch initialises ``nn.Conv2d``."""
        fan_in = self.weight.shape[1] * self.kernel_size[0] * self.kernel_size[1]
        bound = 1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0
        init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
            init.uniform_(self.bias, -bound, bound)

    def forward(self, X: Tensor) -> Tensor:
        """The convolution (``mt.conv2d``): X (batch_size, in_channels, H, W) -> Y (batch_size,
        out_channels, H_out, W_out), H_out = floor((H + 2 ph - dh (kh - 1) - 1) / sh) + 1 (W_out
        alike)."""
        return conv2d(X, self.weight, self.bias, self.stride, self.padding, self.dilation)

    def extra_repr(self) -> str:
        """The settings shown in the repr, as PyTorch's: ``3, 8, kernel_size=(4, 4), stride=(4, 4)``."""
        s = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}"
        for name, default in (("stride", (1, 1)), ("padding", (0, 0)), ("dilation", (1, 1))):
            if getattr(self, name) != default:
                s += f", {name}={getattr(self, name)}"
        return s + ("" if self.bias is not None else ", bias=False")


class LazyConv2d(Conv2d):
    """A ``Conv2d`` whose in_channels is axis 1 of its first input (PyTorch's ``LazyConv2d``; D2L
    writes ``nn.LazyConv2d(num_hiddens, kernel_size=patch_size, stride=patch_size)`` in 11.8).
    Until then the weight is an ``UninitializedParameter``, as ``LazyLinear``'s is."""

    least_in_channels = 0

    def __init__(
        self,
        out_channels: int,
        kernel_size: int | tuple[int, int],
        stride: int | tuple[int, int] = 1,
        padding: int | tuple[int, int] = 0,
        dilation: int | tuple[int, int] = 1,
        bias: bool = True,
        dtype: DType = None,
        device: Device = None,
    ) -> None:
        super().__init__(0, out_channels, kernel_size, stride, padding, dilation, bias, dtype, device)
        self.weight = UninitializedParameter(self.weight)

    @property  # type: ignore[override]
    def in_channels(self) -> int | None:
        """The input's channels: None until the first input (or a loaded state_dict) sets them."""
        return None if isinstance(self.weight, UninitializedParameter) else self.weight.shape[1]

    @in_channels.setter
    def in_channels(self, value: int | None) -> None:
        pass  # (Conv2d.__init__ sets it; here the weight's shape is the truth)

    def forward(self, X: Tensor) -> Tensor:
        """The first call sets in_channels = X.shape[1] and draws W and b."""
        weight = self.weight
        if isinstance(weight, UninitializedParameter) and isinstance(X, Tensor):
            if X.ndim != 4:
                raise ShapeError(
                    f"LazyConv2d: input of shape {tuple(X.shape)}; expected (batch, channels, height, width)"
                )
            kh, kw = self.kernel_size
            weight.materialize(
                zeros(self.out_channels, X.shape[1], kh, kw, dtype=weight.dtype, device=weight.device).data
            )
            self.reset_parameters()
        return super().forward(X)

    def reset_parameters(self) -> None:
        """Draw W and b as ``Conv2d`` does, once in_channels is known (nothing before the first call)."""
        if self.in_channels:
            super().reset_parameters()
