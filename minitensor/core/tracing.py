"""The one hook a tracer installs: ``Function.apply`` reports every op to it.

Every tensor an operation makes comes out of ``Function.apply``: the differentiable ops, and
the ones outside the graph too (comparisons, ``argmax``, ``arange``, ``zeros``: Functions
declared ``differentiable = False``). So a tool that watches a forward pass -- ``mt.onnx.export``
records one to write it as an ONNX graph -- needs this one hook and no other::

    class Printer:
        def function(self, cls, args, kwargs, out):   # after every op, in the order they run
            print(cls.__name__, tuple(out.shape))

    with mt.tracing.install(Printer()):
        model(X)

``cls`` is the Function class, ``args`` and ``kwargs`` what ``apply`` got (Tensors, numbers,
tuples...), ``out`` the Tensor it made. Outside ``install``, ``tracer`` is None and the hook
costs ``apply`` one lookup.
"""

import contextlib

tracer = None
"""The installed tracer (an object with a ``function`` method), or None: only ``Function.apply`` reads it."""


@contextlib.contextmanager
def install(new_tracer):
    """Report every op run inside the block to ``new_tracer``; one tracer at a time (traces do not nest)."""
    global tracer
    if tracer is not None:
        raise RuntimeError("a tracer is already installed: traces do not nest")
    tracer = new_tracer
    try:
        yield new_tracer
    finally:
        tracer = None
