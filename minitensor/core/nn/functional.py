"""The functional forms of the layers, PyTorch's ``F``: ``import minitensor.nn.functional as F``.

Most are the ops themselves (``F.relu is mt.relu``); a Module is such a function plus the
parameters it owns.
"""

from ..ops import (  # noqa: F401  (re-exported)
    batch_norm,
    conv1d,
    conv2d,
    cross_entropy,
    dropout,
    embedding,
    gelu,
    layer_norm,
    linear,
    log_softmax,
    masked_softmax,
    mse_loss,
    one_hot,
    relu,
    sigmoid,
    softmax,
    tanh,
)
from .sdpa import scaled_dot_product_attention

__all__ = [
    "batch_norm",
    "conv1d",
    "conv2d",
    "cross_entropy",
    "dropout",
    "embedding",
    "gelu",
    "layer_norm",
    "linear",
    "log_softmax",
    "masked_softmax",
    "mse_loss",
    "one_hot",
    "relu",
    "scaled_dot_product_attention",
    "sigmoid",
    "softmax",
    "tanh",
]
