"""One seed for everything random: ``mt.manual_seed(n)``.

Initialisation, dropout masks and (later) data order all draw from generators seeded here,
so two runs with the same seed compute the same numbers.
"""

import numpy

from .backends import _BACKENDS, _SEED

_host = numpy.random.default_rng()


def manual_seed(seed: int) -> None:
    """Seed every backend's generator and the host generator used for data order."""
    global _host
    if not isinstance(seed, (int, numpy.integer)) or isinstance(seed, bool) or seed < 0:
        raise (ValueError if isinstance(seed, (int, numpy.integer)) else TypeError)(
            f"manual_seed: the seed must be a whole number >= 0, got {seed!r}"
        )
    seed = int(seed)
    _SEED[0] = seed
    _host = numpy.random.default_rng(seed)
    for backend in _BACKENDS.values():
        backend.seed(seed)


def host_rng() -> numpy.random.Generator:
    """The seeded NumPy generator for host-side randomness (shuffling, data generation)."""
    return _host
