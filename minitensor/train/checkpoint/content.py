"""What checkpoint.json holds, as data: the caller's values made plain JSON data, the
canonical form that ``content_sha256`` hashes, SHA-256 digests, class names and the version
that writes. save.py builds checkpoint.json with these; reading.py and fit.py check with them.
"""

import hashlib
import json

import numpy

from ... import __version__
from .spec import CheckpointError


def _jsonable(value, where):
    """``value`` as plain JSON data (tuples -> lists, NumPy scalars -> Python numbers), or a
    CheckpointError naming the path of the first value JSON cannot hold."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, numpy.generic):
        return value.item()
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise CheckpointError(f"cannot save {where}: key {k!r} is a {type(k).__name__}; JSON keys are strings")
            out[k] = _jsonable(v, f"{where}[{k!r}]")
        return out
    if isinstance(value, (list, tuple)):
        return [_jsonable(v, f"{where}[{i}]") for i, v in enumerate(value)]
    raise CheckpointError(
        f"cannot save {where}: a {type(value).__name__} is not JSON data (numbers, strings, lists, dicts); "
        "convert it (arrays: .tolist()) or leave it out"
    )


def _canonical(body):
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def _sha256(data):
    return hashlib.sha256(data).hexdigest()


def _qualname(obj):
    """The class's public path: minitensor.optim.adam.Adam, as checkpoints have always recorded
    it, for a class that lives in minitensor.core.optim.adam (the same module, see minitensor/__init__)."""
    cls = obj if isinstance(obj, type) else type(obj)
    module = cls.__module__
    if module.startswith("minitensor.core."):
        module = "minitensor." + module.removeprefix("minitensor.core.")
    return f"{module}.{cls.__qualname__}"


def _minitensor_version():
    return __version__
