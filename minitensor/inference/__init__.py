"""Inference: what a trained model is used for once training is over.

``decoding.py``
    Greedy search, beam search and sampling through one loop (``translate`` for an
    encoder-decoder, ``generate`` for a language model), on the models' key/value caches.

An application of the engine, beside training (``minitensor.train``), the explain page
(``minitensor.viz``) and export (``minitensor.onnx``), all of which decode through it.
"""

from .decoding import (  # noqa: F401
    SAMPLE_TEMPERATURE,
    Hypothesis,
    beam_search,
    generate,
    greedy,
    model_device,
    sample,
    step_attention,
    translate,
)
