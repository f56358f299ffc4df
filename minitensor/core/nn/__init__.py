"""Layers and models: ``Module`` and ``Parameter`` (module.py), then one small file per kind
of layer. ``functional`` holds the same computations as plain functions (PyTorch's ``F``)."""

from . import functional, init, utils
from .activation import GELU, Flatten, Identity, LogSoftmax, ReLU, Sigmoid, Softmax, Tanh
from .attention import Attention, MultiHeadAttention
from .config import Seq2SeqConfig, TransformerConfig
from .container import ModuleDict, ModuleList, Sequential
from .conv import Conv1d, Conv2d, LazyConv2d
from .dropout import Dropout
from .kv_cache import KVCache
from .linear import Embedding, LazyLinear, Linear
from .loss import CrossEntropyLoss, MSELoss
from .module import Module, Parameter, UninitializedBuffer, UninitializedParameter
from .normalization import BatchNorm1d, BatchNorm2d, LayerNorm, LazyBatchNorm1d, LazyBatchNorm2d
from .rnn import GRU, GRUCell
from .seq2seq import Seq2Seq, Seq2SeqAttentionDecoder, Seq2SeqDecoder, Seq2SeqEncoder
from .transformer import (
    AddNorm,
    EncoderDecoder,
    PositionWiseFFN,
    TransformerDecoder,
    TransformerDecoderBlock,
    TransformerEmbedding,
    TransformerEncoder,
    TransformerEncoderBlock,
    TransformerLM,
)

__all__ = [
    "Attention",
    "BatchNorm1d",
    "BatchNorm2d",
    "Dropout",
    "Embedding",
    "Flatten",
    "GELU",
    "Identity",
    "KVCache",
    "LayerNorm",
    "LazyBatchNorm1d",
    "LazyBatchNorm2d",
    "LazyConv2d",
    "LazyLinear",
    "Linear",
    "LogSoftmax",
    "Module",
    "ModuleDict",
    "ModuleList",
    "MultiHeadAttention",
    "Parameter",
    "ReLU",
    "Sequential",
    "Sigmoid",
    "Softmax",
    "Tanh",
    "UninitializedBuffer",
    "UninitializedParameter",
    "functional",
    "init",
]
__all__ += [
    "AddNorm",
    "EncoderDecoder",
    "PositionWiseFFN",
    "TransformerDecoder",
    "TransformerDecoderBlock",
    "TransformerEmbedding",
    "TransformerEncoder",
    "TransformerEncoderBlock",
    "TransformerConfig",
    "TransformerLM",
]
__all__ += [
    "Conv1d",
    "Conv2d",
    "CrossEntropyLoss",
    "GRU",
    "GRUCell",
    "MSELoss",
    "Seq2Seq",
    "Seq2SeqAttentionDecoder",
    "Seq2SeqConfig",
    "Seq2SeqDecoder",
    "Seq2SeqEncoder",
    "utils",
]
