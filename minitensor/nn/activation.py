"""Activation functions as modules, for use inside ``Sequential``."""

from . import functional as F
from .module import Module


class ReLU(Module):
    """relu(x) = max(x, 0)."""

    def forward(self, X):
        return F.relu(X)


class GELU(Module):
    """gelu(x) ~ x Phi(x), in the tanh approximation (PyTorch's approximate="tanh"):
    x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""

    def forward(self, X):
        return F.gelu(X)


class Tanh(Module):
    """tanh(x) = (1 - exp(-2x)) / (1 + exp(-2x))."""

    def forward(self, X):
        return F.tanh(X)


class Sigmoid(Module):
    """sigmoid(x) = 1 / (1 + exp(-x))."""

    def forward(self, X):
        return F.sigmoid(X)


class Softmax(Module):
    """softmax(x)_j = exp(x_j) / sum_k exp(x_k) along ``axis``."""

    def __init__(self, axis=-1):
        super().__init__()
        self.axis = axis

    def forward(self, X):
        return F.softmax(X, axis=self.axis)

    def extra_repr(self):
        return f"axis={self.axis}"


class LogSoftmax(Softmax):
    """log_softmax(x)_j = x_j - log sum_k exp(x_k) along ``axis``."""

    def forward(self, X):
        return F.log_softmax(X, axis=self.axis)


class Identity(Module):
    """Returns its input: a placeholder where a layer is optional."""

    def forward(self, X):
        return X
