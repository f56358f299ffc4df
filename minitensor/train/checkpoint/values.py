"""The checks that checkpoint.json's schema (fields.py) is made of, one per kind of value: a
JSON object with exactly these fields, a list, an integer in a range, one line of text, a
setting... reading.py and fit.py use them too, so that every message names a field alike.
"""

import math
import re

from .spec import FORMAT_VERSION, MAX_ENTRIES, MAX_INT, MAX_TEXT_CHARS, _FieldError

# One function per kind of value. Each takes the value and its path ("optimizer.param_groups[0].lr")
# and raises _FieldError naming that path, in one line whatever the value is.
_PLAIN_KEY = re.compile(r"[\w.\-]{1,80}", re.ASCII)
_HEX_DIGEST = re.compile(r"[0-9a-f]{64}")


def _at(path, key):
    """The path of ``key`` inside ``path``: "model" + "keys" -> "model.keys", + 3 -> "model.keys[3]".
    A key that is not plain (it comes from the file) is shown quoted, so the message stays one line."""
    if isinstance(key, int):
        return f"{path}[{key}]"
    part = key if _PLAIN_KEY.fullmatch(key) else f"[{key[:40]!r}]"
    return f"{path}.{part}" if path and not part.startswith("[") else f"{path}{part}"


def _show(value):
    """``value`` for an error message: short and on one line, however large it is."""
    if isinstance(value, str):
        return repr(value[:60]) + (f"... ({len(value):,} characters)" if len(value) > 60 else "")
    if isinstance(value, list):
        return f"a list of {len(value):,} item(s)"
    if isinstance(value, dict):
        return f"a JSON object of {len(value):,} field(s)"
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:20]}... ({len(text)} digits)"


def _bad(path, what, value):
    raise _FieldError(f'field "{path}" must be {what}, got {_show(value)}')


def _missing(path):
    raise _FieldError(f'field "{path}" is missing')


def _object(value, path, fields=None, max_items=MAX_ENTRIES, of=None):
    """A JSON object: with exactly ``fields`` when given (the format is closed: a field that is
    not part of it -- of the checkpoint format, or of ``of`` -- is refused, as one that is
    missing), else with at most ``max_items``."""
    if not isinstance(value, dict):
        _bad(path, "a JSON object", value)
    if fields is None:
        if len(value) > max_items:
            raise _FieldError(f'field "{path}" must have at most {max_items:,} entries, got {len(value):,}')
        return value
    for key in fields:
        if key not in value:
            _missing(_at(path, key))
    for key in value:
        if key not in fields:
            raise _FieldError(
                f'field "{_at(path, key)}" is not part of '
                + (of or f"the checkpoint format (version {FORMAT_VERSION})")
            )
    return value


def _list(value, path, max_items):
    if not isinstance(value, list):
        _bad(path, "a list", value)
    if len(value) > max_items:
        raise _FieldError(f'field "{path}" must have at most {max_items:,} items, got {len(value):,}')
    return value


def _int(value, path, high=MAX_INT, null=False):
    """A non-negative integer <= ``high`` (JSON true/false are not integers here)."""
    if null and value is None:
        return value
    if type(value) is not int or value < 0:
        _bad(path, "a non-negative integer" + (" or null" if null else ""), value)
    if value > high:
        _bad(path, f"at most {high:,}", value)
    return value


def _number(value, path):
    """A finite number >= 0: every learning rate, beta, epsilon, decay and count is one."""
    if type(value) is int:
        return _int(value, path)
    if type(value) is not float or not math.isfinite(value) or value < 0:
        _bad(path, "a finite number >= 0", value)
    return value


def _text(value, path, max_chars=MAX_TEXT_CHARS, null=False, one_line=True):
    """A string of at most ``max_chars`` characters; ``one_line``: printable (no newline or
    control character), as anything shown in a message must be."""
    if null and value is None:
        return value
    if not isinstance(value, str):
        _bad(path, "a string" + (" or null" if null else ""), value)
    if len(value) > max_chars:
        _bad(path, f"a string of at most {max_chars:,} characters", value)
    if one_line and not value.isprintable():
        _bad(path, "printable text on one line", value)
    return value


def _digest(value, path):
    if not (isinstance(value, str) and _HEX_DIGEST.fullmatch(value)):
        _bad(path, "a SHA-256 digest (64 lowercase hex digits)", value)
    return value


def _setting(value, path):
    """A hyper-parameter of an optimiser or scheduler: null, true/false, a finite number >= 0,
    or a list of such numbers (Adam's betas, a scheduler's base_lrs)."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, list):
        for i, item in enumerate(_list(value, path, MAX_ENTRIES)):
            _number(item, f"{path}[{i}]")
        return value
    if type(value) in (int, float):
        return _number(value, path)
    _bad(path, "a number >= 0, a list of numbers, true, false or null", value)


def _same_kind(value, current, path, owner):
    """``value`` (saved) is the kind of value ``current`` (the live object's own) is: a number for
    a number, true/false for true/false, a list of as many numbers for a list or tuple."""
    if isinstance(current, bool):
        ok, what = isinstance(value, bool), "true or false"
    elif isinstance(current, (int, float)):
        ok, what = type(value) in (int, float), "a number"
    elif isinstance(current, (list, tuple)):
        ok, what = isinstance(value, list) and len(value) == len(current), f"a list of {len(current)} number(s)"
    else:
        return value  # None, or something this check knows nothing about: _setting was enough
    if not ok:
        _bad(path, f"{what}, as in this {owner}", value)
    return value


def _unique(items, path):
    if len(set(items)) != len(items):
        seen = set()
        for i, item in enumerate(items):
            if item in seen:
                raise _FieldError(f'field "{path}[{i}]" repeats {_show(item)}; the entries must be distinct')
            seen.add(item)
