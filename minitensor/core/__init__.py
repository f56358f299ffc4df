"""The engine: what a learner reads, in this order.

1. ``tensor.py``: what a tensor is (data on a backend, ``grad``, operators).
2. ``autograd.py``: ``Function`` (forward and backward side by side) and the backward pass.
3. ``ops/``: each operation with its derivative (elementwise, reduce, matmul, shape, softmax,
   loss, ...); axis arguments checked once in ``ops/axes.py``, broadcasting undone once in
   ``autograd.py`` (``sum_to_shape``).
4. ``gradcheck.py``: analytic gradients against finite differences, the test of every op.
5. ``backends/`` and ``kernels/``: NumPy or CuPy behind one interface; the numba loops for the
   softmax family and the fused pieces of a training step, and their CUDA C++ twins.
6. ``nn/`` and ``optim/``: ``Module`` (parameters, hooks, ``state_dict``), layers, attention and
   the Transformers; SGD, Adam, AdamW and the schedules.
7. ``hookspecs.py`` and ``plugins.py``: the plugin contract and the pluggy host.

Nothing here imports from the applications beside it (``minitensor.train``, ``data``,
``inference``, ``viz``, ``onnx``, the CLI); ``tests/test_layers.py`` checks every import. Every
module here is also importable without ``core``: ``minitensor.nn`` is ``minitensor.core.nn``.
"""
