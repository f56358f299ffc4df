"""Export to ONNX: ``mt.onnx.export(module, example_inputs, path, dynamic_axes=...)``.

The model leaves minitensor as an ONNX graph (opset 17) that ONNX Runtime, or any other
ONNX engine, runs without minitensor. How: ``trace.py`` records the forward pass (every op,
the masks, the shape arithmetic), ``ops.py`` writes each op as ONNX operators (``recurrent.py``
the GRU), ``graph.py`` holds the names and constants, ``export.py`` puts it together. A Function of your own
exports once it has a ``to_onnx(g, node)`` static method (see ``graph.py``'s docstring).
Needs the ``onnx`` extra: ``pip install -e ".[onnx]"`` (onnx, onnxruntime).
"""

from . import recurrent  # noqa: F401  (registers the mappings of the recurrent ops)
from .export import export
from .graph import ExportError, GraphBuilder
from .ops import MAPPINGS, mapping_of, maps
from .trace import Node, SymDim, Trace, TracedTensor, tracing

__all__ = [
    "ExportError",
    "GraphBuilder",
    "MAPPINGS",
    "Node",
    "SymDim",
    "Trace",
    "TracedTensor",
    "export",
    "mapping_of",
    "maps",
    "tracing",
]
