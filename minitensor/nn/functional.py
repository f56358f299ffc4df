"""The functional forms of the layers, PyTorch's ``F``: ``import minitensor.nn.functional as F``.

Most are the ops themselves (``F.relu is mt.relu``); a Module is such a function plus the
parameters it owns. ``linear`` is the one written here.
"""

from ..ops import (  # noqa: F401  (re-exported)
    cross_entropy,
    dropout,
    embedding,
    gelu,
    layer_norm,
    log_softmax,
    masked_softmax,
    relu,
    sigmoid,
    softmax,
    tanh,
)


def linear(x, weight, bias=None):
    """y = x W^T + b, with W of shape (out_features, in_features) as in PyTorch.

    x may have any number of leading axes (batch, time, ...): (..., in) -> (..., out).
    """
    y = x @ weight.T
    return y if bias is None else y + bias


__all__ = [
    "cross_entropy",
    "dropout",
    "embedding",
    "gelu",
    "layer_norm",
    "linear",
    "log_softmax",
    "masked_softmax",
    "relu",
    "sigmoid",
    "softmax",
    "tanh",
]
