"""``mt.cuda.is_available()``, as in PyTorch: can tensors live on ``device="cuda"`` here? And
``mt.cuda.CUDAGraph`` / ``mt.cuda.graph``: a step's kernels captured once, replayed by one launch.

Nothing GPU-related is imported until one of these is called (``cupy_backend`` imports CuPy
only inside ``cuda_unavailable_reason``).
"""

import contextlib
from collections.abc import Iterator
from typing import Any

from .backends import _BACKENDS
from .backends.cupy_backend import cuda_unavailable_reason


def unavailable_reason() -> str | None:
    """None where ``device="cuda"`` works, else what is missing (CuPy, the driver, a GPU)."""
    if "cuda" in _BACKENDS:  # already built: it works
        return None
    return cuda_unavailable_reason()


def is_available() -> bool:
    """True where CuPy is installed and finds a usable NVIDIA GPU."""
    return unavailable_reason() is None


class CUDAGraph:
    """The kernels of some code on ``device="cuda"`` captured once and replayed by one launch:
    ``torch.cuda.CUDAGraph``'s role, on CuPy's stream capture (``backends/cuda_graph.py`` says
    what a replay does and does not do).

        g = mt.cuda.CUDAGraph()
        with mt.cuda.graph(g):           # records the kernels; runs nothing yet
            loss = step(static_x, static_y)
        for x, y in batches:
            static_x.copy_(x); static_y.copy_(y)
            g.replay()                   # loss now holds this batch's loss

    Run the code once or twice before capturing it (kernels compile and caches fill there, not
    in the graph), then set the gradients to None (``zero_grad()``): a replay reads the memory
    the capture read, so what was made before the capture (inputs, parameters, a gradient to
    accumulate onto) must outlive the graph. A step with dropout replays fresh masks: the same
    ones as the same step run eagerly, draw for draw; its products are cuBLAS calls of the
    graph's own (CuPy refuses to make its own in a capture), equal to eager ones to float32's
    rounding.
    """

    def __init__(self) -> None:
        self._capture: Any = None  # the backend's Capture, once captured
        self._backend: Any = None  # the backend capturing or captured on

    def capture_begin(self) -> None:
        """Start recording what this thread launches on the GPU (``graph`` calls it)."""
        from .backends import get_backend

        if self._capture is not None or self._backend is not None:
            raise RuntimeError("CUDAGraph: this graph is already captured or capturing; make a new one")
        backend = get_backend("cuda")
        backend.begin_capture()
        self._backend = backend

    def capture_end(self, failed: bool = False) -> None:
        """Stop recording (``failed``: after an error inside the capture, keeping nothing)."""
        if self._backend is None:
            raise RuntimeError("CUDAGraph: capture_end without capture_begin")
        try:
            capture = self._backend.end_capture(failed)
        except BaseException:  # CUDA refused the capture (it had waited for the GPU, say)
            self._backend = None
            raise
        self._capture = None if failed else capture
        if failed:
            self._backend = None

    def replay(self) -> None:
        """Run the captured kernels again, on the current stream (nothing is waited for)."""
        if self._capture is None:
            raise RuntimeError("CUDAGraph: nothing captured to replay (use `with mt.cuda.graph(g):` first)")
        self._capture.replay()

    def __repr__(self) -> str:
        state = "captured" if self._capture is not None else "capturing" if self._backend is not None else "empty"
        return f"CUDAGraph({state})"


@contextlib.contextmanager
def graph(cuda_graph: CUDAGraph) -> Iterator[CUDAGraph]:
    """``with mt.cuda.graph(g):`` captures the block's GPU work into ``g`` (``torch.cuda.graph``);
    an error inside it ends the capture and keeps nothing."""
    cuda_graph.capture_begin()
    try:
        yield cuda_graph
    except BaseException:
        cuda_graph.capture_end(failed=True)
        raise
    cuda_graph.capture_end()
