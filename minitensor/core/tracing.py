"""The one hook through which ``mt.onnx`` watches a forward pass.

``active`` is None, except while ``mt.onnx.export`` traces a model: then it is the Trace being
recorded, and the places that make tensors (``Function.apply``, ``Tensor.shape``, comparisons,
``arange``...) report to it. Everywhere else this costs one global lookup.
"""

active = None
