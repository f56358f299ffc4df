"""``minitensor train --cuda-graph``: the forward and backward of a step as a CUDA graph.

On a GPU a small model's step is bound by the host, which spends 5-20 microseconds launching
each of a step's few hundred kernels while the GPU runs each for a few (``bench/launches.py``).
``GraphedStep`` captures the step's forward, loss and backward once per shape of the minibatch
(``mt.cuda.graph``, ``core/backends/cuda_graph.py``) and then replays it: one launch for all of
them. The clipping and the optimiser's update stay outside the graph (a handful of multi-tensor
launches, and their learning rate and step count change at every step), as does everything the
loop reads.

The replayed step computes what the eager one would, dropout included (a replay draws the
seeds the eager calls would have drawn), its products by a cuBLAS call of its own (CuPy's refuse
to run in a capture): a run with ``--cuda-graph`` gives the losses of the same run without it,
to float32's rounding.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from ..core import cuda
from ..core.errors import DeviceError
from ..core.tensor import Tensor

#: eager steps of a minibatch shape before its graph is captured: the first compiles the kernels
#: and fills the caches (a causal mask, the optimiser's state), none of which may happen in a capture
WARMUP_STEPS = 2
#: graphs kept, one per minibatch shape (an epoch's full minibatches and its last, shorter one);
#: other shapes run eagerly. Each graph holds the memory of a whole step's activations.
MAX_GRAPHS = 2


class GraphedStep:
    """``step(batch)`` -> (loss, number of target tokens) of ``batch`` after its backward, the
    parameters' ``.grad`` set, as ``loss_fn(batch)`` then ``loss.backward()`` would leave them;
    None where this shape runs eagerly (its warm-up steps, or more shapes than ``MAX_GRAPHS``)."""

    def __init__(self, loss_fn: Any, optimizer: Any) -> None:
        self.loss_fn, self.optimizer = loss_fn, optimizer
        self.params = [p for group in optimizer.param_groups for p in group["params"]]
        self.graphs: dict[Any, Any] = {}
        self.seen: Counter[Any] = Counter()

    def __call__(self, batch: tuple[Tensor, ...]) -> tuple[Any, Any] | None:
        key = tuple((tuple(t.shape), str(t.dtype)) for t in batch)
        entry = self.graphs.get(key)
        if entry is None:
            if len(self.graphs) >= MAX_GRAPHS:  # (and no more shapes counted: a count each would grow)
                return None
            self.seen[key] += 1
            if self.seen[key] <= WARMUP_STEPS:
                return None
            entry = self.graphs[key] = self._capture(batch)
        inputs, (loss, num_tokens), grads, graph = entry
        for static, new in zip(inputs, batch):
            static.copy_(new)  # the graph reads its own input arrays
        graph.replay()
        for p, grad in zip(self.params, grads):  # an eager step of another shape may have replaced them
            p.grad = grad
        # the next replay rewrites the graph's outputs: the loop keeps copies
        return loss.detach().clone(), num_tokens.detach().clone() if isinstance(num_tokens, Tensor) else num_tokens

    def _capture(self, batch: tuple[Tensor, ...]) -> tuple[Any, ...]:
        inputs = tuple(t.detach().clone() for t in batch)  # made before the capture: the graph's static inputs
        self.optimizer.zero_grad()  # no gradients: backward in the capture makes the graph's own
        graph = cuda.CUDAGraph()
        try:
            with cuda.graph(graph):
                loss, num_tokens = self.loss_fn(inputs)
                loss.backward()
        except Exception as e:  # a step that reads from the GPU, a draw that cannot be replayed...
            cause = " ".join(f"{type(e).__name__}: {e}".split())
            raise DeviceError(
                f"--cuda-graph: the step could not be captured as a CUDA graph ({cause}); train without --cuda-graph"
            ) from e
        return inputs, (loss, num_tokens), [p.grad for p in self.params], graph
