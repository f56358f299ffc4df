"""Dropout as a module: active in training mode, the identity in evaluation mode."""

from . import functional as F
from .module import Module


class Dropout(Module):
    """In training, zero each element with probability p and scale the rest by 1/(1 - p).

    The scaling keeps E[output] = input, so ``model.eval()`` simply switches dropout off.
    """

    def __init__(self, p=0.5):
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"Dropout: p must be a probability in [0, 1], got {p}")
        self.p = p

    def forward(self, X):
        return F.dropout(X, self.p, self.training)

    def extra_repr(self):
        return f"p={self.p}"
