"""Seeing the machinery work: ``mt.viz.graph(tensor)`` draws the autograd graph that made a
tensor (``graph.py``), one node per operation, in the order backward visits them."""

from .graph import Graph, Node, graph

__all__ = ["Graph", "Node", "graph"]
