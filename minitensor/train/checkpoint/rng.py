"""The random generators' states: ``get_rng_state`` and ``set_rng_state``, which a checkpoint
saves in its "rng" field so that training resumes exactly. fields.py checks a saved state's
structure; load.py checks its values with ``_check_rng_state`` before anything is set.
"""

import numpy

from ... import random as mt_random
from ...backends import available_backends, get_backend
from .spec import _NDARRAY


def _encode_state(value):
    """A bit_generator.state as JSON-safe values (arrays tagged so they come back as arrays)."""
    if isinstance(value, dict):
        return {str(k): _encode_state(v) for k, v in value.items()}
    if isinstance(value, numpy.ndarray):
        return {_NDARRAY: value.tolist(), "dtype": str(value.dtype)}
    if isinstance(value, numpy.generic):
        return value.item()
    return value


def _decode_state(value):
    if isinstance(value, dict):
        if _NDARRAY in value:
            return numpy.array(value[_NDARRAY], dtype=value["dtype"])
        return {k: _decode_state(v) for k, v in value.items()}
    return value


def _generator_state(generator):
    return _encode_state(generator.bit_generator.state)


def _prepared_generator(state, where):
    """A fresh numpy Generator in ``state``, or ValueError: the check before anything is set."""
    if not isinstance(state, dict) or not isinstance(state.get("bit_generator"), str):
        raise ValueError(f"{where}: not a bit_generator state (a dict with 'bit_generator'): {state!r:.80}")
    cls = getattr(numpy.random, state["bit_generator"], None)
    if not (isinstance(cls, type) and issubclass(cls, numpy.random.BitGenerator)):
        raise ValueError(f"{where}: unknown bit generator {state['bit_generator']!r}")
    bit_generator = cls()
    try:
        bit_generator.state = _decode_state(state)
    except Exception as e:
        raise ValueError(f"{where}: invalid {state['bit_generator']} state ({type(e).__name__}: {e})") from e
    return numpy.random.Generator(bit_generator)


def _backend_generator(backend):
    rng = getattr(backend, "_rng", None)
    return rng if isinstance(rng, numpy.random.Generator) else None


def get_rng_state():
    """Every random generator minitensor draws from, as JSON-safe data::

        {"host": <state of mt.random.host_rng()>, "backends": {"cpu": <state>, ...}}

    A state is a NumPy ``bit_generator.state`` dict. A backend exposing
    ``get_rng_state()`` / ``set_rng_state(state)`` (a GPU backend whose generator is not
    NumPy's) is asked for its own: a flat dict of numbers (a checkpoint's copy must have the
    same fields when loaded); one with neither is recorded as None (not restorable).
    """
    backends = {}
    for device in available_backends():
        backend = get_backend(device)
        if hasattr(backend, "get_rng_state"):
            backends[device] = _encode_state(backend.get_rng_state())
        else:
            rng = _backend_generator(backend)
            backends[device] = None if rng is None else _generator_state(rng)
    return {"host": _generator_state(mt_random.host_rng()), "backends": backends}


def _check_rng_state(state):
    """Validate ``state`` (from ``get_rng_state``) completely; ValueError if it cannot be set.
    Returns (host generator, {device: generator or raw state}, skipped devices)."""
    if not isinstance(state, dict) or "host" not in state or not isinstance(state.get("backends", {}), dict):
        raise ValueError("an RNG state must be a dict {'host': ..., 'backends': {...}} as get_rng_state() returns")
    host = _prepared_generator(state["host"], "RNG state 'host'")
    prepared, skipped = {}, []
    for device, saved in state.get("backends", {}).items():
        backend = get_backend(device) if device in available_backends() else None
        if saved is None or backend is None:
            skipped.append(device)  # not restorable, or that device is not here
        elif hasattr(backend, "set_rng_state"):
            prepared[device] = _decode_state(saved)
        elif _backend_generator(backend) is not None:
            prepared[device] = _prepared_generator(saved, f"RNG state of backend {device!r}")
        else:
            skipped.append(device)
    return host, prepared, skipped


def _adopt(current, prepared):
    """Give ``current`` (a numpy Generator) ``prepared``'s state in place, so whoever holds a
    reference to it sees the restored stream; a different bit generator needs a new object."""
    if type(current.bit_generator) is type(prepared.bit_generator):
        current.bit_generator.state = prepared.bit_generator.state
        return current
    return prepared


def set_rng_state(state):
    """Restore what ``get_rng_state()`` returned (also after a JSON round trip). Everything is
    checked first; an invalid state raises ValueError and changes nothing. Backends that are
    not registered here (a checkpoint from a GPU machine loaded on a laptop) are skipped;
    returns the list of skipped device names."""
    host, prepared, skipped = _check_rng_state(state)
    mt_random._host = _adopt(mt_random.host_rng(), host)
    for device, value in prepared.items():
        backend = get_backend(device)
        if hasattr(backend, "set_rng_state"):
            backend.set_rng_state(value)
        else:
            backend._rng = _adopt(backend._rng, value)
    return skipped
