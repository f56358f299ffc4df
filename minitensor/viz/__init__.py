"""Seeing the machinery work.

- ``mt.viz.graph(tensor)`` draws the autograd graph that made a tensor (``graph.py``), one
  node per operation, in the order backward visits them;
- ``with mt.viz.capture(model) as cap:`` records what every attention layer computed --
  scores, bias, allowed keys, weights -- at each call (``capture.py``).
"""

from .capture import AttentionRecord, Capture, capture
from .graph import Graph, Node, graph

__all__ = ["AttentionRecord", "Capture", "Graph", "Node", "capture", "graph"]
