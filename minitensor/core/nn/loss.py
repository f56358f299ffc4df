"""Loss functions as modules, PyTorch's ``nn.MSELoss(reduction="none")`` and
``nn.CrossEntropyLoss``: the functions of ``ops/loss.py`` with their settings kept."""

from __future__ import annotations

from typing import Any

from ..tensor import Tensor
from . import functional as F
from .module import Module


class MSELoss(Module):
    """The squared error (y_hat - y)^2 of D2L 3.1, averaged (``reduction="mean"``), summed
    ("sum") or one per element ("none", D2L 11.2's Nadaraya-Watson regression)."""

    def __init__(self, reduction: str = "mean") -> None:
        super().__init__()
        if reduction not in ("mean", "sum", "none"):
            raise ValueError(f"MSELoss: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
        self.reduction = reduction

    def forward(self, input: Tensor, target: Any) -> Tensor:  # noqa: A002  (PyTorch's name)
        """(input - target)^2, reduced as the layer was built; the shapes broadcast."""
        return F.mse_loss(input, target, reduction=self.reduction)

    def extra_repr(self) -> str:
        """The setting shown in the repr."""
        return f"reduction={self.reduction!r}"


class CrossEntropyLoss(Module):
    """Cross-entropy of logits (..., C) against integer classes (...) (D2L 4.1), with
    ``F.cross_entropy``'s settings: ``ignore_index``, ``reduction``, ``label_smoothing``."""

    def __init__(self, ignore_index: int = -100, reduction: str = "mean", label_smoothing: float = 0.0) -> None:
        super().__init__()
        if reduction not in ("mean", "sum", "none"):
            raise ValueError(f"CrossEntropyLoss: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
        if not 0.0 <= label_smoothing < 1.0:
            raise ValueError(f"CrossEntropyLoss: label_smoothing must be in [0, 1), got {label_smoothing}")
        self.ignore_index, self.reduction, self.label_smoothing = ignore_index, reduction, label_smoothing

    def forward(self, input: Tensor, target: Any) -> Tensor:  # noqa: A002  (PyTorch's name)
        """The cross-entropy of each position, reduced as the layer was built."""
        return F.cross_entropy(
            input,
            target,
            ignore_index=self.ignore_index,
            reduction=self.reduction,
            label_smoothing=self.label_smoothing,
        )

    def extra_repr(self) -> str:
        """The settings shown in the repr."""
        return f"reduction={self.reduction!r}, label_smoothing={self.label_smoothing}"
