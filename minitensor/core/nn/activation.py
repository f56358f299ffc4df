"""Activation functions as modules, for use inside ``Sequential``, and the other layers without
parameters: ``Identity``, ``Flatten``."""

from __future__ import annotations

from ..ops.axes import torch_names
from ..tensor import Tensor
from . import functional as F
from .module import Module


class ReLU(Module):
    """relu(x) = max(x, 0)."""

    def forward(self, X: Tensor) -> Tensor:
        """relu(X) = max(X, 0) elementwise (``mt.relu``); X of any shape."""
        return F.relu(X)


class GELU(Module):
    """gelu(x) = x Phi(x) = x/2 (1 + erf(x / sqrt 2)), Phi the standard normal CDF.

    ``approximate="tanh"``: x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), the approximation
    of BERT and GPT-2. The same argument and default as PyTorch's ``nn.GELU``.
    """

    def __init__(self, approximate: str = "none") -> None:
        super().__init__()
        if approximate not in ("none", "tanh"):  # say so now, not at the first forward
            raise ValueError(f"GELU: approximate must be 'none' or 'tanh', got {approximate!r}")
        self.approximate = approximate

    def forward(self, X: Tensor) -> Tensor:
        """gelu(X) elementwise (``mt.gelu``), exact or tanh-approximated as the layer was built; any shape."""
        return F.gelu(X, approximate=self.approximate)

    def extra_repr(self) -> str:
        """The setting shown in the repr: ``approximate='none'`` or ``approximate='tanh'``."""
        return f"approximate={self.approximate!r}"


class Tanh(Module):
    """tanh(x) = (1 - exp(-2x)) / (1 + exp(-2x))."""

    def forward(self, X: Tensor) -> Tensor:
        """tanh(X) elementwise (``mt.tanh``), values in (-1, 1); X of any shape."""
        return F.tanh(X)


class Sigmoid(Module):
    """sigmoid(x) = 1 / (1 + exp(-x))."""

    def forward(self, X: Tensor) -> Tensor:
        """sigmoid(X) = 1 / (1 + exp(-X)) elementwise (``mt.sigmoid``), values in (0, 1); any shape."""
        return F.sigmoid(X)


class Softmax(Module):
    """softmax(x)_j = exp(x_j) / sum_k exp(x_k) along ``axis`` (PyTorch's ``dim``)."""

    @torch_names
    def __init__(self, axis: int = -1) -> None:
        super().__init__()
        self.axis = axis

    def forward(self, X: Tensor) -> Tensor:
        """softmax(X) along the layer's ``axis`` (``mt.softmax``): every slice along it sums to 1."""
        return F.softmax(X, axis=self.axis)

    def extra_repr(self) -> str:
        """The setting shown in the repr: ``axis=-1``, the axis the softmax normalises."""
        return f"axis={self.axis}"


class LogSoftmax(Softmax):
    """log_softmax(x)_j = x_j - log sum_k exp(x_k) along ``axis``."""

    def forward(self, X: Tensor) -> Tensor:
        """log_softmax(X) along the layer's ``axis`` (``mt.log_softmax``): log-probabilities."""
        return F.log_softmax(X, axis=self.axis)


class Flatten(Module):
    """Merge axes ``start_axis``..``end_axis`` (PyTorch's ``start_dim``, ``end_dim``) into one, by
    default every axis but the batch's: the first layer of D2L's MLPs and CNNs,
    ``nn.Sequential(nn.Flatten(), nn.LazyLinear(10))``, turning (batch_size, 1, 28, 28) images
    into (batch_size, 784) rows."""

    @torch_names
    def __init__(self, start_axis: int = 1, end_axis: int = -1) -> None:
        super().__init__()
        self.start_axis, self.end_axis = start_axis, end_axis

    def forward(self, X: Tensor) -> Tensor:
        """``X.flatten(start_axis, end_axis)``: the same elements, those axes merged (row by row)."""
        return X.flatten(self.start_axis, self.end_axis)

    def extra_repr(self) -> str:
        """``start_axis=1, end_axis=-1``: what ``print(model)`` shows inside ``Flatten(...)``."""
        return f"start_axis={self.start_axis}, end_axis={self.end_axis}"


class Identity(Module):
    """Returns its input: a placeholder where a layer is optional."""

    def forward(self, X: Tensor) -> Tensor:
        """Return ``X`` unchanged (the same tensor object, no operation recorded)."""
        return X
