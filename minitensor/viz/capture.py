"""``with mt.viz.capture(model) as cap:`` -- what every attention layer computed, step by step.

An attention layer keeps only its weights (``attention_weights``), after the pooling. To
show a learner how scores become weights, a picture needs more: the scorer's scores before
anything is added, the positional bias, which keys were masked out, and the weights. Inside
the ``with`` block every ``mt.nn.Attention`` of ``model`` records those at each call, and
every ``MultiHeadAttention`` takes the plain path (a streamed layer builds no scores to
record):

    with mt.viz.capture(model) as cap:
        model(enc_X, dec_X, enc_valid_lens)
    for record in cap.records:       # in call order
        record.name, record.scores, record.bias, record.allowed, record.weights

Arrays are host NumPy copies: ``scores`` and ``weights`` (..., Q, K) as the scorer and the
pooling returned them ((batch, num_heads, Q, K) inside multi-head attention); ``bias`` the
score bias as given to the layer (None without one); ``allowed`` the bool mask of the keys
each query may attend (valid_lens, mask, causal and -inf biases combined), of the scores'
shape. Nothing changes in what the model computes: the records come from forward hooks on
each attention layer and its scorer (``Module.register_forward_hook``).
"""

import contextlib
import inspect
from dataclasses import dataclass

import numpy

from ..nn import Module
from ..nn.attention import Attention, MultiHeadAttention, as_tensor, causal_mask, plain_attention
from ..ops.softmax import lens_per_row


@dataclass
class AttentionRecord:
    """One call of one attention layer, as ``mt.viz.capture`` records it (host NumPy arrays):

    - ``name``: the layer's dotted name in the model, e.g. ``"encoder.blks.0.attention.attention"``;
    - ``scores``: the scorer's output (..., Q, K), before the bias and the masks
      ((batch_size, num_heads, Q, K) inside multi-head attention);
    - ``bias``: the score bias given to the layer (a "scores" positional encoding), or None;
    - ``allowed``: bool, of the scores' shape, the keys each query may attend (``valid_lens``,
      ``mask``, ``causal`` and -inf biases combined);
    - ``weights``: the pooling's output, of the scores' shape.
    """

    name: str  # the layer's dotted name in the model, e.g. "encoder.blks.0.attention.attention"
    scores: numpy.ndarray
    bias: numpy.ndarray | None
    allowed: numpy.ndarray
    weights: numpy.ndarray


class Capture:
    """What ``capture`` hands out: ``records``, one ``AttentionRecord`` per attention call,
    in call order; ``for_layer(name)`` the records of one layer; ``outputs``: {layer name:
    the output Tensor of its last call}, for every ``Attention`` and ``MultiHeadAttention``,
    with its graph when the pass was differentiable (``mt.viz.graph(cap.outputs[name])``)."""

    def __init__(self):
        self.records = []
        self.outputs = {}

    def for_layer(self, name):
        """The records of the layer named ``name`` (its dotted name in the model, as in
        ``AttentionRecord.name``), in call order: one per call, e.g. per decoding step."""
        return [r for r in self.records if r.name == name]

    def __repr__(self):
        return f"Capture({len(self.records)} attention calls)"


def _allowed(backend, scores, valid_lens, mask, causal, bias):
    """The keys each query may attend, as the pooling sees them: a bool host array."""
    shape = scores.shape
    allowed = numpy.ones(shape, dtype=bool)
    if valid_lens is not None:
        lens = backend.to_numpy(lens_per_row(backend.xp, valid_lens.data, shape)).reshape(shape[:-1] + (1,))
        allowed &= numpy.arange(shape[-1]) < lens
    if mask is not None:
        allowed &= backend.to_numpy(mask.data).astype(bool)
    if causal:
        allowed &= backend.to_numpy(causal_mask(shape[-2], shape[-1], device=scores.device).data)
    if bias is not None:
        allowed &= numpy.isfinite(backend.to_numpy(bias.data))
    return allowed


_FORWARD = inspect.signature(Attention.forward)


def _recorder(name, cap, scores_of):
    """A forward hook for the ``Attention`` named ``name``: record the call (its scorer's
    scores, kept by the scorer's own hook in ``scores_of``; its bias, masks and weights)."""

    def record(layer, args, kwargs, output):
        call = _FORWARD.bind(layer, *args, **kwargs)
        call.apply_defaults()
        scores, weights = scores_of.pop(layer, None), layer.attention_weights
        if scores is None:  # a subclass whose forward did not call its scorer: score here
            scores = layer.score(*call.args[1:3])
        backend = scores._backend
        # the layer converts lists and arrays into tensors inside weigh: do the same here
        valid_lens = as_tensor(call.arguments["valid_lens"], scores)
        mask = as_tensor(call.arguments["mask"], scores, "bool")
        bias = as_tensor(call.arguments["bias"], scores, scores.dtype)
        causal = call.arguments["causal"]
        cap.records.append(
            AttentionRecord(
                name,
                backend.to_numpy(scores.data).copy(),
                None if bias is None else backend.to_numpy(bias.data).copy(),
                _allowed(backend, scores, valid_lens, mask, causal, bias),
                backend.to_numpy(weights.data).copy(),
            )
        )
        cap.outputs[name] = output

    return record


def _scores_keeper(layer, scores_of):
    """A forward hook for ``layer``'s scorer: keep its scores for ``layer``'s own hook."""

    def keep(scorer, args, output):
        scores_of[layer] = output

    return keep


def _keeper(name, cap):
    """A forward hook that keeps a layer's output in ``cap.outputs[name]``."""

    def keep(layer, args, output):
        cap.outputs[name] = output

    return keep


@contextlib.contextmanager
def capture(model):
    """``with mt.viz.capture(model) as cap:``: record what every attention layer of ``model``
    computes inside the block; ``cap`` is a ``Capture``.

    Built on forward hooks (``Module.register_forward_hook``, removed on leaving the block):
    every call of an ``mt.nn.Attention`` adds one ``AttentionRecord`` (its scorer's scores,
    the bias, the allowed keys, the weights) to ``cap.records``, and ``cap.outputs`` keeps the
    last output of every ``Attention`` and of every ``MultiHeadAttention``'s forward. Inside
    the block every ``MultiHeadAttention`` takes the plain path (``plain_attention``: a
    streamed layer builds no scores, and grouped heads call their ``Attention`` with the
    shared keys repeated); what the model computes does not change.
    """
    if not isinstance(model, Module):  # (its layers are found by walking its modules)
        raise TypeError(f"mt.viz.capture: model must be an mt.nn.Module, got {type(model).__name__}")
    cap = Capture()
    named = [(name or type(model).__name__, m) for name, m in model.named_modules()]
    handles, scores_of = [], {}
    with plain_attention(model):  # not streamed, and every head through its Attention module
        try:
            for name, layer in named:
                if isinstance(layer, Attention):
                    handles.append(layer.scorer.register_forward_hook(_scores_keeper(layer, scores_of)))
                    handles.append(layer.register_forward_hook(_recorder(name, cap, scores_of), with_kwargs=True))
                elif isinstance(layer, MultiHeadAttention):
                    handles.append(layer.register_forward_hook(_keeper(name, cap)))
            yield cap
        finally:
            for handle in handles:
                handle.remove()
