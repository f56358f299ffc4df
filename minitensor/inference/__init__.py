"""Inference: what a trained model is used for once training is over.

``decoding.py``
    Greedy search, beam search and sampling through one loop (``translate`` for an
    encoder-decoder, ``generate`` for a language model), on the models' key/value caches.
``decoders.py``
    Decoders as chains: processors of the next-token scores (temperature, top-k, top-p,
    min-p, repetition penalty) and one search, all plugins (``decoder(names, **options)``).
``speculative.py``
    Speculative decoding: a draft model proposes, the target verifies in one pass.

An application of the engine, beside training (``minitensor.train``), the explain page
(``minitensor.viz``) and export (``minitensor.onnx``), all of which decode through it.
"""

from .decoders import Decoder, Forbid, apply_processors, decoder  # noqa: F401
from .decoding import (  # noqa: F401
    SAMPLE_TEMPERATURE,
    Hypothesis,
    beam_search,
    generate,
    greedy,
    model_device,
    run_search,
    sample,
    step_attention,
    translate,
)
