"""CUDA graphs: the kernels of a step captured once and replayed by one call (``mt.cuda.graph``).

Why. On a GPU a small model's step is bound by the host: every CuPy operator, every kernel of
``kernels/cuda`` and every product costs the host 5-20 microseconds of Python and driver time
to launch, whatever the size of its arrays, and a Transformer's training step launches some
four hundred of them (``bench/launches.py``). A CUDA graph (the CUDA Programming Guide's "CUDA
Graphs") records the launches that a stream receives instead of running them ("stream
capture"); launching the graph then runs all of them, in order, for the price of one launch.
PyTorch's ``torch.cuda.graph`` is the same thing; this is CuPy's ``Stream.begin_capture``.

What a replay does and does not do. It runs the captured kernels on the same addresses with
the same arguments, and nothing else: no Python runs, no shape changes, no branch is taken
anew. So

- the inputs are *static*: the capture reads the arrays it was given, and a caller who wants
  the next batch copies it into them before replaying (``loop.GraphedStep`` does);
- the outputs are the capture's own arrays, rewritten by every replay (copy a loss to keep it);
- memory: the capture allocates from a pool of its own (``cupy.cuda.MemoryPool``, PyTorch's
  "private pool"), so the blocks that a replay writes into, freed or not once the capture is
  over, are never handed to other arrays;
- dropout's random numbers: a seed passed to a kernel by value would be replayed with it, and
  every replay would drop the same elements. So inside a capture ``draw_seed`` hands out slots
  of a table on the device (``seeds``), the kernels read their seed there (``read_seed`` in
  ``kernels/cuda/random.cuh``), and before each replay one kernel (``draw_seeds``) writes into
  the table the very draws that as many eager calls would have made: a replayed step drops
  what the same step run eagerly would, and the generator's state (a checkpoint's) moves on by
  as many draws. Other random draws (cuRAND's) cannot be captured and are refused;
- the products: CuPy refuses to call cuBLAS while a stream captures, though cuBLAS supports
  capture, so inside a capture ``Backend.matmul`` calls cuBLAS directly (``cublas_gemm``'s
  ``DirectCublas``, through ctypes, on CuPy's handle): equal to CuPy's products to float32's
  rounding (another call than CuPy's);
- what it reads must outlive it: an array made before the capture and freed after it goes
  back to the eager pool, which hands its memory to the next array. The caller keeps its
  inputs; an op that reads a cache's array (the shared causal mask) hands it to
  ``Backend.keep_for_replay``, which the graph holds;
- the checks on the data that ops make without waiting (``Backend.check``: an embedding's index
  out of range) are made again after each replay, on a copy of their flags;
- nothing may wait for the GPU inside a capture (``.item()``, a print of a tensor, an upload of
  host data): CUDA refuses it there, and so the step must not do it anyway (issue 25's rule, and
  the tests' transfer counter).
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy

from ..errors import DeviceError

#: the most dropout seeds one captured graph draws (its table on the device: 8 KiB); a
#: Transformer's step draws one per dropout layer and attention
MAX_GRAPH_SEEDS = 1024


class Capture:
    """One CUDA graph of a CupyBackend: its capture, then its replays."""

    def __init__(self, backend: Any) -> None:
        xp = backend.xp
        self.backend, self.xp = backend, xp
        # allocated before the capture, from the usual pool: the table outlives any replay
        self.seeds = xp.zeros(MAX_GRAPH_SEEDS, dtype=numpy.uint64)
        self.draws = 0  # seeds the captured kernels read, table[0:draws]
        self.checks: list[Any] = []  # the checks the captured ops made (their flags: the graph's)
        self.kept: list[Any] = []  # arrays made before the capture that it reads (Backend.keep_for_replay)
        self.pool = xp.cuda.MemoryPool()
        self.stream = xp.cuda.Stream(non_blocking=True)  # capture needs a stream other than the legacy default
        self.graph: Any = None
        self._contexts = contextlib.ExitStack()
        self._pending: Any = None
        self._cublas: Any = None  # cuBLAS for the capture's products (or why it is not there)

    def begin(self) -> None:
        """Start recording: from now on every launch on this thread goes into the graph, and every
        allocation comes from the graph's own pool."""
        xp, backend = self.xp, self.backend
        # CuPy refuses to call cuBLAS while a stream captures, so the capture's products call it
        # directly (cublas_gemm.captured_matmul), on CuPy's handle, found here, before the capture
        try:
            self._cublas = backend.direct_cublas()
        except Exception as e:  # (raised at the first product: a step without one needs none)
            self._cublas = e
        # the captured work reads what the current stream has queued before it
        self.stream.wait_event(xp.cuda.get_current_stream().record())
        # checks made by the captured ops are the graph's; earlier ones stay pending
        self._pending = backend.__dict__.pop("_pending_checks", None)
        self._contexts.enter_context(xp.cuda.using_allocator(self.pool.malloc))
        self._contexts.enter_context(self.stream)
        try:
            self.stream.begin_capture()
        except BaseException:
            self._restore()
            raise

    def end(self) -> None:
        """Stop recording and instantiate the graph (nothing has run yet: the first replay runs it)."""
        try:
            self.graph = self.stream.end_capture()
        finally:
            self._restore()

    def abort(self) -> None:
        """Stop recording after an error inside the capture, keeping no graph."""
        with contextlib.suppress(Exception):  # an invalidated capture ends in an error of its own
            self.stream.end_capture()
        self._restore()
        self.graph = None

    def _restore(self) -> None:
        self._contexts.close()
        self.checks = self.backend.__dict__.pop("_pending_checks", [])
        if self._pending is not None:
            self.backend._pending_checks = self._pending

    def cublas(self) -> Any:
        """The ``DirectCublas`` the capture's products call."""
        if isinstance(self._cublas, Exception):
            raise DeviceError(
                f"cuda graph: a matrix product cannot be captured: cuBLAS is not reachable directly "
                f"({type(self._cublas).__name__}: {self._cublas})"
            ) from self._cublas
        return self._cublas

    def draw_seed(self) -> Any:
        """A dropout's seed inside the capture: the next slot of the table, a 0-d uint64 array on
        the device that each replay fills with a fresh draw."""
        if self.draws == MAX_GRAPH_SEEDS:
            raise DeviceError(
                f"cuda graph: a captured step may draw at most {MAX_GRAPH_SEEDS} dropout seeds; this one draws more"
            )
        self.draws += 1
        return self.seeds[self.draws - 1]

    def replay(self) -> None:
        """Run the captured kernels once, on the current stream, after their seeds are drawn."""
        if self.graph is None:
            raise DeviceError("cuda graph: nothing to replay (the capture did not finish)")
        backend, xp = self.backend, self.xp
        if self.draws:
            key, first = backend.seed_key(), backend.skip_draws(self.draws)
            backend.kernels.draw_seeds(self.seeds[: self.draws], key, first)
        self.graph.launch(xp.cuda.get_current_stream())
        for ok, message, error in self.checks:
            backend.check(ok.copy(), message, error)  # the next replay rewrites the graph's flag
