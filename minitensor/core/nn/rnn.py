"""Gated recurrent units: ``GRU`` (a whole sequence, several layers) and ``GRUCell`` (one step).

A GRU (Cho et al. 2014; D2L 10.2) reads a sequence one step at a time and keeps a hidden
state H that two gates control. With X_t (batch, input_size), H_{t-1} (batch, num_hiddens):

    R_t  = sigmoid(X_t W_ir^T + b_ir + H_{t-1} W_hr^T + b_hr)             reset gate
    Z_t  = sigmoid(X_t W_iz^T + b_iz + H_{t-1} W_hz^T + b_hz)             update gate
    N_t  = tanh(X_t W_in^T + b_in + R_t * (H_{t-1} W_hn^T + b_hn))        candidate state
    H_t  = Z_t * H_{t-1} + (1 - Z_t) * N_t

(* is the elementwise product.) Z_t near 1 keeps the old state -- information can cross
many steps untouched, which is what a plain RNN cannot do; R_t near 0 lets the candidate
ignore the past.

**Which GRU.** These are PyTorch's (and cuDNN's) equations. D2L writes the candidate as
tanh(X_t W_xh + (R_t * H_{t-1}) W_hh + b_h): the reset gate there acts *before* the matrix
product, here after it (on H_{t-1} W_hn^T + b_hn). Both are GRUs and learn equally well; this
one is chosen because H_{t-1} then meets all three gates' weights in one product per step,
H_{t-1} W_hh^T with W_hh = [W_hr; W_hz; W_hn] (3 num_hiddens, num_hiddens), and because
its parameters are PyTorch's, name for name (``weight_ih_l0``, ``weight_hh_l0``, ``bias_ih_l0``,
``bias_hh_l0``; gates stacked in the order r, z, n): ``gru.load_state_dict`` accepts a
``torch.nn.GRU``'s weights converted to NumPy.

**Speed.** The inputs' share of the gates, X_t W_ih^T + b_ih, does not depend on H, so it is
computed for all time steps in one matrix product before the loop. The loop itself -- T
dependent steps, the O(n) sequential path that D2L's CNN / RNN / self-attention
comparison (10.6 / 11.6) is about -- runs inside one Function, ``GRUSequence`` (``ops/rnn.py``), with
backpropagation through time written out beside it: a few array operations per step instead
of a graph node per operation and a gradient per node.
"""

from __future__ import annotations

import math

from .. import amp
from ..creation import zeros
from ..dtypes import is_floating
from ..errors import ShapeError
from ..ops import stack
from ..ops.dropout import check_probability
from ..ops.promote import promote
from ..ops.rnn import GRUSequence
from ..tensor import Device, DType, Tensor
from . import functional as F
from . import init
from .module import Module, Parameter


def _check_state(name: str, H: Tensor, expected: tuple[int, ...]) -> None:
    if tuple(H.shape) != expected:
        raise ShapeError(f"{name}: hidden state of shape {tuple(H.shape)}; expected {expected}")


def _as_weight_dtype(X: Tensor, weight: Tensor) -> Tensor:
    """Integer (or bool) ``X`` as a copy in ``weight``'s float dtype, as ``Linear`` promotes its
    input: the zero initial state is made in the input's dtype, and an integer state would run
    the whole recurrence in integers, truncating every step to zero."""
    return X if is_floating(X.dtype) else promote(X, weight)[0]


class GRUCell(Module):
    """One GRU step (the equations in this module's docstring):
    ``cell(X, H=None)``: X (batch, input_size), H (batch, num_hiddens), zeros if None ->
    H_new (batch, num_hiddens).

    Parameters as in ``torch.nn.GRUCell``: ``weight_ih`` (3 num_hiddens, input_size),
    ``weight_hh`` (3 num_hiddens, num_hiddens), ``bias_ih``, ``bias_hh`` (3 num_hiddens,),
    gates stacked r, z, n; all ~ U(-1/sqrt(num_hiddens), 1/sqrt(num_hiddens)).
    """

    def __init__(
        self, input_size: int, num_hiddens: int, bias: bool = True, dtype: DType = None, device: Device = None
    ) -> None:
        super().__init__()
        self.input_size, self.num_hiddens = input_size, num_hiddens
        _make_weights(self, "", input_size, num_hiddens, bias, dtype, device)

    def forward(self, X: Tensor, H: Tensor | None = None) -> Tensor:
        """One GRU step: X (batch_size, input_size) and H (batch_size, num_hiddens), zeros if None ->
        H_new (batch_size, num_hiddens), by the equations of ``GRU`` (D2L 9.1 / 10.2). A
        ``ShapeError`` if X or H has another shape. Integer X or H is promoted to the weights'
        dtype, as ``Linear`` promotes its input."""
        if X.ndim != 2 or X.shape[-1] != self.input_size:
            raise ShapeError(f"GRUCell: input of shape {tuple(X.shape)}; expected (batch, {self.input_size})")
        batch = X.shape[0]
        X = _as_weight_dtype(X, self.weight_ih)
        if H is None:
            H = zeros(batch, self.num_hiddens, dtype=X.dtype, device=X.device)
        _check_state("GRUCell", H, (batch, self.num_hiddens))
        H = _as_weight_dtype(H, self.weight_hh)
        gates_x = F.linear(X, self.weight_ih, self.bias_ih).unsqueeze(0)  # a sequence of one step
        gates_x, H = amp.in_float32(gates_x), amp.in_float32(H)  # the recurrence in float32 (GRU.forward)
        return GRUSequence.apply(gates_x, H, self.weight_hh, self.bias_hh).reshape(batch, self.num_hiddens)

    def extra_repr(self) -> str:
        """The settings shown in the repr: ``input_size, num_hiddens, bias=...``."""
        return f"{self.input_size}, {self.num_hiddens}, bias={self.bias_ih is not None}"


class GRU(Module):
    """A multi-layer GRU over whole sequences (``torch.nn.GRU``; D2L's ``GRU``).

    ``GRU(input_size, num_hiddens, num_layers=1, dropout=0.0, bias=True, batch_first=False)``.
    Layer l > 0 reads the outputs of layer l - 1; in training, ``dropout`` is applied to
    those outputs (not after the last layer), as in PyTorch.

    ``gru(inputs, H=None) -> (outputs, state)``:

    - inputs (num_steps, batch, input_size): *time-major*, as in D2L and PyTorch's default
      (``batch_first=True``: (batch, num_steps, input_size), and outputs likewise);
    - H (num_layers, batch, num_hiddens), the initial state of every layer; zeros if None;
    - outputs (num_steps, batch, num_hiddens): the last layer's H_t at every step;
    - state (num_layers, batch, num_hiddens): every layer's H_T, ready to pass as H to
      continue the sequence (step-by-step decoding feeds one step at a time).

    Parameters per layer l, named as in PyTorch: ``weight_ih_l{l}`` (3 num_hiddens, in),
    ``weight_hh_l{l}`` (3 num_hiddens, num_hiddens), ``bias_ih_l{l}``, ``bias_hh_l{l}``.
    """

    def __init__(
        self,
        input_size: int,
        num_hiddens: int,
        num_layers: int = 1,
        dropout: float = 0.0,
        bias: bool = True,
        batch_first: bool = False,
        dtype: DType = None,
        device: Device = None,
    ) -> None:
        super().__init__()
        if num_layers < 1:
            raise ValueError(f"GRU: num_layers must be >= 1, got {num_layers}")
        check_probability("GRU", "dropout", dropout)
        self.input_size, self.num_hiddens, self.num_layers = input_size, num_hiddens, num_layers
        self.dropout, self.bias, self.batch_first = dropout, bias, batch_first
        for layer in range(num_layers):
            in_size = input_size if layer == 0 else num_hiddens
            _make_weights(self, f"_l{layer}", in_size, num_hiddens, bias, dtype, device)

    def layer_parameters(self, layer: int) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
        """(W_ih, W_hh, b_ih, b_hh) of one layer (the biases None with bias=False)."""
        return tuple(getattr(self, f"{name}_l{layer}") for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"))

    def forward(self, inputs: Tensor, H: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Run every layer over the whole sequence: inputs (num_steps, batch_size, input_size)
        (batch-major with ``batch_first=True``) and H (num_layers, batch_size, num_hiddens), zeros if
        None -> (outputs (num_steps, batch_size, num_hiddens), the last layer's H_t at every step;
        state (num_layers, batch_size, num_hiddens), every layer's last H_t).

        Per step and layer (PyTorch's equations; D2L 9.1 / 10.2 writes the reset gate before the
        product with W_hn):

            R_t = sigmoid(X_t W_ir^T + b_ir + H_{t-1} W_hr^T + b_hr)
            Z_t = sigmoid(X_t W_iz^T + b_iz + H_{t-1} W_hz^T + b_hz)
            N_t = tanh(X_t W_in^T + b_in + R_t * (H_{t-1} W_hn^T + b_hn))
            H_t = Z_t * H_{t-1} + (1 - Z_t) * N_t

        Integer inputs or H are promoted to the weights' dtype, as ``Linear`` promotes its input.
        """
        if self.batch_first:
            inputs = inputs.swapaxes(0, 1)
        if inputs.ndim != 3 or inputs.shape[-1] != self.input_size:
            layout = "(batch, num_steps, {})" if self.batch_first else "(num_steps, batch, {})"
            raise ShapeError(f"GRU: inputs of shape {tuple(inputs.shape)}; expected {layout.format(self.input_size)}")
        steps, batch, _ = inputs.shape
        if steps == 0:
            raise ShapeError(
                f"GRU: inputs of shape {tuple(inputs.shape)} have no time steps (PyTorch's GRU refuses them too)"
            )
        inputs = _as_weight_dtype(inputs, self.weight_ih_l0)
        if H is None:
            H = zeros(self.num_layers, batch, self.num_hiddens, dtype=inputs.dtype, device=inputs.device)
        _check_state("GRU", H, (self.num_layers, batch, self.num_hiddens))
        H = _as_weight_dtype(H, self.weight_hh_l0)
        X, last_states = inputs, []
        for layer in range(self.num_layers):
            W_ih, W_hh, b_ih, b_hh = self.layer_parameters(layer)
            if layer > 0:
                X = F.dropout(X, self.dropout, self.training)
            # The inputs' share of the gates for every step at once: one (T*batch, in) product.
            gates_x = F.linear(X.reshape(steps * batch, X.shape[-1]), W_ih, b_ih).reshape(steps, batch, -1)
            # inside mt.autocast that product is bfloat16, but the recurrence runs in float32: its state
            # carries every step's rounding to the next
            gates_x, H_0 = amp.in_float32(gates_x), amp.in_float32(H[layer])
            X = GRUSequence.apply(gates_x, H_0, W_hh, b_hh)  # (T, batch, num_hiddens)
            last_states.append(X[-1])
        outputs = X.swapaxes(0, 1) if self.batch_first else X
        return outputs, stack(last_states)

    def extra_repr(self) -> str:
        """The settings shown in the repr: ``input_size, num_hiddens``, plus ``num_layers``,
        ``dropout``, ``bias`` and ``batch_first`` where they differ from the defaults."""
        s = f"{self.input_size}, {self.num_hiddens}"
        if self.num_layers != 1:
            s += f", num_layers={self.num_layers}"
        if self.dropout:
            s += f", dropout={self.dropout}"
        if not self.bias:
            s += ", bias=False"
        if self.batch_first:
            s += ", batch_first=True"
        return s


def _make_weights(
    module: Module, suffix: str, input_size: int, num_hiddens: int, bias: bool, dtype: DType, device: Device
) -> None:
    """Register weight_ih, weight_hh (and bias_ih, bias_hh) + suffix on ``module``, in
    PyTorch's order, initialised as PyTorch does: U(-k, k), k = 1 / sqrt(num_hiddens)."""
    bound = 1.0 / math.sqrt(num_hiddens) if num_hiddens > 0 else 0.0
    shapes: dict[str, tuple[int, ...]] = {
        "weight_ih": (3 * num_hiddens, input_size),
        "weight_hh": (3 * num_hiddens, num_hiddens),
    }
    if bias:
        shapes.update(bias_ih=(3 * num_hiddens,), bias_hh=(3 * num_hiddens,))
    for name, shape in shapes.items():
        param = Parameter(zeros(shape, dtype=dtype, device=device))
        init.uniform_(param, -bound, bound)
        module.register_parameter(name + suffix, param)
    if not bias:
        module.register_parameter("bias_ih" + suffix, None)
        module.register_parameter("bias_hh" + suffix, None)
