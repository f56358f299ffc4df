"""Dropout as a module: active in training mode, the identity in evaluation mode."""

from __future__ import annotations

from ..ops.dropout import check_probability
from ..tensor import Tensor
from . import functional as F
from .module import Module


class Dropout(Module):
    """In training, zero each element with probability p and scale the rest by 1/(1 - p).

    The scaling keeps E[output] = input, so ``model.eval()`` simply switches dropout off.
    """

    def __init__(self, p: float = 0.5) -> None:
        super().__init__()
        check_probability("Dropout", "p", p)
        self.p = p

    def forward(self, X: Tensor) -> Tensor:
        """``mt.dropout(X, p, training)``: in training mode each element is zeroed with probability p
        and the rest scaled by 1/(1 - p); in evaluation mode (``model.eval()``) X is returned as it
        is (D2L 4.6 / 5.6)."""
        return F.dropout(X, self.p, self.training)

    def extra_repr(self) -> str:
        """The setting shown in the repr: ``p=0.5``, the probability of dropping an element."""
        return f"p={self.p}"
