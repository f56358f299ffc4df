"""Fully connected layers and embedding tables."""

from __future__ import annotations

import math
from typing import Any

import numpy

from ..creation import zeros
from ..dtypes import is_floating
from ..errors import ShapeError
from ..grad_mode import no_grad
from ..ops import where
from ..tensor import Device, DType, Tensor, tensor
from . import functional as F
from . import init
from .module import Module, Parameter, UninitializedParameter


def as_input(layer: str, X: Any, like: Tensor) -> Tensor:
    """A layer's input as a Tensor: a Tensor as it is; a list, tuple, number or NumPy array becomes
    one on ``like``'s device, in its dtype when that is floating-point (as ``x + [1, 2]`` takes
    x's dtype in ``ops/promote.py``), so ``Linear(4, 3)([[1, 2, 3, 4]])`` is float like its
    weight. Anything else is a TypeError naming ``layer``, not an AttributeError from inside it."""
    if isinstance(X, Tensor):
        return X
    if not isinstance(X, (list, tuple, int, float, numpy.ndarray, numpy.generic)):
        raise TypeError(f"{layer}: expected a Tensor (or a list or NumPy array of numbers), got {type(X).__name__}")
    return tensor(X, dtype=like.dtype if is_floating(like.dtype) else None, device=like.device)


class Linear(Module):
    """y = x W^T + b, W of shape (out_features, in_features), b of shape (out_features,).

    Works on (..., in_features) inputs, so (batch, num_steps, num_hiddens) tensors pass
    through position by position. Initialised as in PyTorch: W and b ~ U(-k, k) with
    k = 1 / sqrt(in_features), which keeps Var(y) about Var(x) / 3 whatever the width.
    """

    def __init__(
        self, in_features: int, out_features: int, bias: bool = True, dtype: DType = None, device: Device = None
    ) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = Parameter(zeros(out_features, in_features, dtype=dtype, device=device))
        if bias:
            self.bias = Parameter(zeros(out_features, dtype=dtype, device=device))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Draw new weights and biases from U(-k, k), k = 1 / sqrt(in_features), PyTorch's
        initialisation (its ``kaiming_uniform_(W, a=sqrt(5))`` comes to this bound)."""
        # = init.kaiming_uniform_(W, a=sqrt(5)), PyTorch's spelling of the same bound.
        bound = 1.0 / math.sqrt(self.in_features) if self.in_features > 0 else 0.0
        init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
            init.uniform_(self.bias, -bound, bound)

    def forward(self, X: Tensor) -> Tensor:
        """Y = X W^T + b (``mt.linear``): X (..., in_features) -> Y (..., out_features), any number
        of leading axes, e.g. (batch_size, num_steps, num_hiddens) position by position. X may be a
        list or NumPy array (it becomes a tensor in the weight's dtype); integer X is promoted to it."""
        weight = self.weight  # (read once: a registered parameter is looked up by Module.__getattr__)
        if not isinstance(X, Tensor):
            X = as_input(type(self).__name__, X, weight)
        return F.linear(X, weight, self.bias)

    def extra_repr(self) -> str:
        """The settings shown in the repr: ``in_features=..., out_features=..., bias=True``."""
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class LazyLinear(Linear):
    """A ``Linear`` whose in_features is the last axis of its first input (PyTorch's
    ``LazyLinear``; D2L's models are written with it, ``nn.LazyLinear(num_hiddens)``).

    Until that first call the weight is an ``UninitializedParameter`` of shape (out_features, 0);
    the call gives it its shape and draws it as ``Linear`` does, in the weight's dtype and on its
    device (so ``.to()`` before the first call is kept). ``load_state_dict`` gives it the saved
    shape instead (D2L 5.6 loads a saved model into a fresh one). The Parameter object stays the
    same either way, so an optimiser made before the first call holds it (its state is made at
    the first step, which has no gradient to take before that call).
    """

    def __init__(self, out_features: int, bias: bool = True, dtype: DType = None, device: Device = None) -> None:
        super().__init__(0, out_features, bias=bias, dtype=dtype, device=device)
        self.weight = UninitializedParameter(self.weight)

    @property  # type: ignore[override]
    def in_features(self) -> int | None:
        """The input width: None until the first input (or a loaded state_dict) sets it."""
        return None if isinstance(self.weight, UninitializedParameter) else self.weight.shape[1]

    @in_features.setter
    def in_features(self, value: int | None) -> None:
        pass  # (Linear.__init__ sets it; here the weight's shape is the truth)

    def forward(self, X: Tensor) -> Tensor:
        """Y = X W^T + b; the first call sets in_features = X.shape[-1] and draws W and b."""
        X = as_input(type(self).__name__, X, self.weight)
        weight = self.weight
        if isinstance(weight, UninitializedParameter):
            if X.ndim == 0:
                raise ValueError("LazyLinear: its first input must have a last axis to take in_features from")
            weight.materialize(zeros(self.out_features, X.shape[-1], dtype=weight.dtype, device=weight.device).data)
            self.reset_parameters()
        return super().forward(X)

    def reset_parameters(self) -> None:
        """Draw W and b as ``Linear`` does, once in_features is known (nothing before the first call)."""
        if self.in_features:  # (None, and 0 while Linear.__init__ runs: no width to draw for yet)
            super().reset_parameters()


def check_token_batch(owner: Module, tokens: Any) -> None:
    """Refuse tokens that are not (batch_size, num_steps) ids, naming ``owner``: a sequence model's
    first layer after the embedding (an attention layer, a GRU) would otherwise name the shape of
    the embeddings, a tensor the user never made. (The Transformer's embedding tests the condition
    inline before calling this, so that its every step makes no extra call: tests/test_call_budget.py.)"""
    if isinstance(tokens, Tensor) and tokens.data.ndim != 2:
        raise ShapeError(
            f"{type(owner).__name__}: tokens of shape {tuple(tokens.data.shape)}; expected (batch_size, "
            "num_steps) token ids (one sequence: tokens.unsqueeze(0))"
        )


class Embedding(Module):
    """A table of num_embeddings vectors: token index i -> row i of W (num_embeddings, embedding_dim).

    The same as one_hot(i) @ W, without building the one-hot vectors. W ~ N(0, 1) as in
    PyTorch. With ``padding_idx``, as in PyTorch, that row starts at zero and gets no
    gradient, so training leaves it where it is; a look-up returns whatever it holds (zeros
    unless it was set, e.g. by ``from_pretrained`` or ``load_state_dict``). The gradient is
    cut at the output -- where(index == padding_idx, Y.detach(), Y) -- which costs the size of
    the output, not of the table, and nothing for a frozen table.
    """

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        padding_idx: int | None = None,
        dtype: DType = None,
        device: Device = None,
    ) -> None:
        super().__init__()
        if padding_idx is not None:
            if not -num_embeddings <= padding_idx < num_embeddings:
                raise ValueError(
                    f"Embedding: padding_idx {padding_idx} is out of range for {num_embeddings} embeddings"
                )
            padding_idx %= num_embeddings
        self.num_embeddings, self.embedding_dim, self.padding_idx = num_embeddings, embedding_dim, padding_idx
        self.weight = Parameter(zeros(num_embeddings, embedding_dim, dtype=dtype, device=device))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Draw a new table from N(0, 1), as PyTorch does; the ``padding_idx`` row, if any, is set back
        to zero."""
        init.normal_(self.weight)
        if self.padding_idx is not None:
            with no_grad():
                self.weight[self.padding_idx] = 0

    @classmethod
    def from_pretrained(cls, embeddings: Any, freeze: bool = True, padding_idx: int | None = None) -> Embedding:
        """An Embedding holding a copy of ``embeddings`` (e.g. GloVe vectors); frozen by default.
        The ``padding_idx`` row keeps its pretrained values (as in PyTorch); it gets no gradient."""
        embeddings = embeddings if isinstance(embeddings, Tensor) else tensor(embeddings)
        if embeddings.ndim != 2:
            raise ValueError(f"Embedding.from_pretrained: expected a 2-D table, got shape {embeddings.shape}")
        num, dim = embeddings.shape
        layer = cls(num, dim, padding_idx=padding_idx, dtype=embeddings.dtype, device=embeddings.device)
        with no_grad():
            layer.weight.copy_(embeddings)
        layer.weight.requires_grad = not freeze
        return layer

    def forward(self, indices: Any) -> Tensor:
        """Look up rows of the table: integer ``indices`` of any shape, e.g. (batch_size, num_steps)
        token ids, -> (*indices.shape, embedding_dim). ``indices`` may be a list or array; it
        becomes a tensor on the table's device. Positions holding ``padding_idx`` give that row
        (zeros unless it was set) and send no gradient back to it."""
        if not isinstance(indices, Tensor):
            indices = tensor(indices, device=self.weight.device)
        Y = F.embedding(indices, self.weight)
        if self.padding_idx is not None and Y.requires_grad:
            # The padding row's only gradient comes from the positions that looked it up; cutting
            # the graph there (the value stays) leaves it exactly zero, PyTorch's behaviour.
            # Multiplying Y by (index != padding_idx) would give the same gradient but also make
            # the row look up as zero, whatever it holds.
            Y = where((indices == self.padding_idx).unsqueeze(-1), Y.detach(), Y)
        return Y

    def extra_repr(self) -> str:
        """The settings shown in the repr: ``num_embeddings, embedding_dim`` and ``padding_idx``."""
        s = f"{self.num_embeddings}, {self.embedding_dim}"
        return s if self.padding_idx is None else s + f", padding_idx={self.padding_idx}"
