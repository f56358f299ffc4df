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
to float32's rounding. Each graph is checked once, when it is made: the first minibatch of its
shape runs eagerly too, with the same dropout seeds, and the graph's first replay must give
the same loss and gradients (to the rounding of the matmul precision) or the run stops with an
error, since a graph that computes something else would train silently wrong.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from ..core import cuda
from ..core.errors import DeviceError
from ..core.tensor import Tensor
from ..ops.join import stack
from ..precision import get_float32_matmul_precision

#: eager steps of a minibatch shape before its graph is captured: the first compiles the kernels
#: and fills the caches (a causal mask, the optimiser's state), none of which may happen in a capture
WARMUP_STEPS = 2
#: graphs kept, one per minibatch shape (an epoch's full minibatches and its last, shorter one);
#: other shapes run eagerly. Each graph holds the memory of a whole step's activations.
MAX_GRAPHS = 2


def replay_tolerance(mixed_precision: bool = False) -> tuple[float, float]:
    """How far (relative) a replayed step's loss and gradients may be from the eager step's: the
    capture's products are another cuBLAS call (CuPy's refuse to be captured), equal in float32
    to its rounding, and at TF32 or bfloat16 to theirs (another call may take another algorithm).
    ``mixed_precision``: the step runs in ``mt.autocast``, whose products are rounded to bfloat16,
    where a last-bit difference of two calls can move a result by one bfloat16 step (2^-8)."""
    exact = get_float32_matmul_precision() == "highest" and not mixed_precision
    return (1e-5, 1e-4) if exact else (2e-3, 2e-2)


class GraphedStep:
    """``step(batch)`` -> (loss, number of target tokens) of ``batch`` after its backward, the
    parameters' ``.grad`` set, as ``loss_fn(batch)`` then ``loss.backward()`` would leave them;
    None where this shape runs eagerly (its warm-up steps, or more shapes than ``MAX_GRAPHS``)."""

    def __init__(self, loss_fn: Any, optimizer: Any, mixed_precision: bool = False) -> None:
        self.loss_fn, self.optimizer, self.mixed_precision = loss_fn, optimizer, mixed_precision
        self.params = [p for group in optimizer.param_groups for p in group["params"]]
        self.graphs: dict[Any, Any] = {}
        self.seen: Counter[Any] = Counter()
        #: per graph, its first replay against the eager step: (loss, eager loss, largest relative
        #: gradient difference)
        self.first_replays: dict[Any, tuple[float, float, float]] = {}

    def __call__(self, batch: tuple[Tensor, ...]) -> tuple[Any, Any] | None:
        key = tuple((tuple(t.shape), str(t.dtype)) for t in batch)
        entry = self.graphs.get(key)
        expected = None
        if entry is None:
            if len(self.graphs) >= MAX_GRAPHS:  # (and no more shapes counted: a count each would grow)
                return None
            self.seen[key] += 1
            if self.seen[key] <= WARMUP_STEPS:
                return None
            expected = self._eager(batch)
            entry = self.graphs[key] = self._capture(batch)
        inputs, (loss, num_tokens), grads, graph = entry
        for static, new in zip(inputs, batch):
            static.copy_(new)  # the graph reads its own input arrays
        graph.replay()
        for p, grad in zip(self.params, grads):  # an eager step of another shape may have replaced them
            p.grad = grad
        if expected is not None:
            self._check(expected, loss, key)
        # the next replay rewrites the graph's outputs: the loop keeps copies
        return loss.detach().clone(), num_tokens.detach().clone() if isinstance(num_tokens, Tensor) else num_tokens

    def _eager(self, batch: tuple[Tensor, ...]) -> tuple[Tensor, list[Any]]:
        """The step run eagerly on ``batch``: its loss and gradients, for the graph's first replay to
        match. The generator is put back after it, so the replay draws the same dropout seeds
        (and the run goes on as it would have without this check)."""
        backend = self.params[0]._backend
        state = backend.get_rng_state()
        self.optimizer.zero_grad()
        loss, _ = self.loss_fn(batch)
        loss.backward()
        backend.set_rng_state(state)
        return loss.detach(), [None if p.grad is None else p.grad.detach() for p in self.params]

    def _check(self, expected: tuple[Tensor, list[Any]], loss: Tensor, key: Any) -> None:
        """Stop the run if the graph's first replay is not the eager step (one read of the device)."""
        eager_loss, eager_grads = expected
        worst_grad = [
            (p.grad - g).abs().max() / g.abs().max().clamp(min=1e-30)
            for p, g in zip(self.params, eager_grads)
            if g is not None and p.grad is not None
        ]
        worst = stack(worst_grad).max() if worst_grad else loss * 0
        got, want, grad_error = stack([loss.reshape(()), eager_loss.reshape(()), worst.astype(loss.dtype)]).tolist()
        self.first_replays[key] = (got, want, grad_error)
        if not math.isfinite(want):  # the eager step diverged: the loop's own check says so
            return
        loss_tol, grad_tol = replay_tolerance(self.mixed_precision)
        if not (abs(got - want) <= loss_tol * abs(want) and grad_error <= grad_tol):
            shapes = ", ".join(str(shape) for shape, _ in key)
            raise DeviceError(
                f"--cuda-graph: the CUDA graph for minibatches shaped {shapes} does not compute the eager step: "
                f"loss {got!r} vs {want!r}, gradients up to {grad_error:.1e} apart (relative, at most {grad_tol:g} "
                f"expected); train without --cuda-graph (and please report it)"
            )

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
