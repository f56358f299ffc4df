"""The differentiable operations, one Function class per op, grouped by kind.

The vector norm is ``reduce.norm``, exported as ``mt.norm`` but not as ``ops.norm``, which names
the module of layer normalisation (``ops/norm.py``).

Read ``elementwise.py`` first: each op is a few lines of forward and a line of backward.
"""

from __future__ import annotations

from .compare import isfinite, isinf, isnan
from .conv import conv1d, conv2d
from .convert import astype, to_device
from .dropout import dropout
from .elementwise import (
    abs,
    add,
    clamp,
    clip,
    cos,
    div,
    exp,
    floor_divide,
    gelu,
    log,
    maximum,
    minimum,
    mul,
    neg,
    pow,
    relu,
    remainder,
    sigmoid,
    sin,
    sqrt,
    sub,
    tanh,
)
from .entmax import alpha_entmax, entmax15
from .flash_attention import flash_attention
from .indexing import embedding, gather, getitem, one_hot
from .join import cat, chunk, concat, repeat, repeat_interleave, split, stack
from .loss import cross_entropy, mse_loss
from .matmul import bmm, dot, linear, matmul, mm, mv
from .norm import batch_norm, layer_norm
from .reduce import argmax, argmin, cumsum, logsumexp, max, mean, min, prod, sort, std, sum, topk, var
from .select import masked_fill, tril, triu, where
from .shape import broadcast_to, expand, flatten, flip, permute, reshape, squeeze, swapaxes, transpose, unsqueeze
from .softmax import log_softmax, masked_softmax, softmax
from .sparsemax import sparsemax

__all__ = [
    "abs",
    "add",
    "alpha_entmax",
    "argmax",
    "argmin",
    "astype",
    "batch_norm",
    "bmm",
    "broadcast_to",
    "cat",
    "chunk",
    "clamp",
    "clip",
    "concat",
    "conv1d",
    "conv2d",
    "cos",
    "cross_entropy",
    "cumsum",
    "div",
    "dot",
    "dropout",
    "embedding",
    "one_hot",
    "entmax15",
    "exp",
    "expand",
    "flash_attention",
    "flatten",
    "flip",
    "floor_divide",
    "gather",
    "gelu",
    "getitem",
    "isfinite",
    "isinf",
    "isnan",
    "layer_norm",
    "linear",
    "log",
    "log_softmax",
    "logsumexp",
    "masked_fill",
    "masked_softmax",
    "matmul",
    "max",
    "maximum",
    "mean",
    "min",
    "minimum",
    "mm",
    "mse_loss",
    "mul",
    "mv",
    "neg",
    "permute",
    "pow",
    "prod",
    "relu",
    "remainder",
    "repeat",
    "repeat_interleave",
    "reshape",
    "sigmoid",
    "sin",
    "softmax",
    "sort",
    "sparsemax",
    "split",
    "sqrt",
    "squeeze",
    "stack",
    "std",
    "sub",
    "sum",
    "swapaxes",
    "tanh",
    "to_device",
    "topk",
    "transpose",
    "tril",
    "triu",
    "unsqueeze",
    "var",
    "where",
]
