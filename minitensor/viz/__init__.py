"""Seeing the machinery work.

- ``mt.viz.graph(tensor)`` draws the autograd graph that made a tensor (``graph.py``), one
  node per operation, in the order backward visits them;
- ``with mt.viz.capture(model) as cap:`` records what every attention layer computed --
  scores, bias, allowed keys, weights -- at each call (``capture.py``);
- ``mt.viz.attention_page(model, source, ...)`` decodes an input, captures the attention of
  the pass that produced the output and writes it all into one offline HTML page
  (``explain.py``, ``page.py``): what ``minitensor explain`` saves.
"""

from .capture import AttentionRecord, Capture, capture
from .explain import attention_page
from .graph import Graph, Node, graph
from .page import AttentionPage

__all__ = ["AttentionPage", "AttentionRecord", "Capture", "Graph", "Node", "attention_page", "capture", "graph"]
