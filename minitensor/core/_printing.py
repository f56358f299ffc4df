"""How tensors print: PyTorch's layout and its options, ``mt.set_printoptions``.

    >>> mt.arange(5.0) / 3
    tensor([0.0000, 0.3333, 0.6667, 1.0000, 1.3333])

The rules are PyTorch's (``torch/_tensor_str.py``), so a tensor prints here as it does there:

- A tensor of more than ``threshold`` elements is abbreviated: along each axis, only the first
  and last ``edgeitems`` entries show, around ``...``.
- Every number shown gets one format and one width, so that columns line up. Floats print
  as ``2.`` when all are whole numbers, else with ``precision`` digits after the point,
  ``0.3333``; in scientific notation, ``1.0000e-05``, when they span more than three orders
  of magnitude (max/min > 1000), or one is above 1e8 or below 1e-4. Only the nonzero finite
  values on show decide; ``sci_mode=True``/``False`` forces the choice.
- Rows break into lines of at most ``linewidth`` characters, and the extras after the
  numbers (``dtype=...``) move to a line of their own rather than pass it.

Integers and booleans print as Python prints them, right-aligned to the widest.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Sequence
from typing import Any

import numpy

from .dtypes import is_floating


@dataclasses.dataclass
class PrintOptions:
    """The options ``set_printoptions`` sets and ``get_printoptions`` returns (as a dict)."""

    precision: int = 4  # digits after the decimal point
    threshold: float = 1000  # more elements than this: abbreviate
    edgeitems: int = 3  # entries shown at each end of an abbreviated axis
    linewidth: int = 80  # characters per line before a row breaks
    sci_mode: bool | None = None  # None: automatic (see above)


OPTIONS = PrintOptions()

_PROFILES: dict[str, dict[str, float]] = {
    "default": dict(precision=4, threshold=1000, edgeitems=3, linewidth=80),
    "short": dict(precision=2, threshold=1000, edgeitems=2, linewidth=80),
    "full": dict(precision=4, threshold=math.inf, edgeitems=3, linewidth=80),
}


def set_printoptions(
    precision: int | None = None,
    threshold: float | None = None,
    edgeitems: int | None = None,
    linewidth: int | None = None,
    profile: str | None = None,
    sci_mode: bool | None = None,
) -> None:
    """Set how tensors print (PyTorch's ``torch.set_printoptions``, same names and meanings).

    - ``precision``: digits after the decimal point (default 4);
    - ``threshold``: a tensor with more elements than this is abbreviated (default 1000;
      ``math.inf`` never abbreviates);
    - ``edgeitems``: entries shown at each end of every abbreviated axis (default 3);
    - ``linewidth``: characters per line before rows break (default 80);
    - ``profile``: ``"default"``, ``"short"`` (precision 2, edgeitems 2) or ``"full"`` (no
      abbreviation) sets all four at once; the other arguments given override it;
    - ``sci_mode``: True or False forces scientific notation on or off; None (the default)
      chooses for each tensor. As in PyTorch, every call sets it: leaving it out means None.

    Options left out (None) keep their value. ``mt.set_printoptions(profile="default")``
    restores the defaults; ``mt.set_printoptions(**saved)`` restores ``saved = mt.get_printoptions()``.
    """
    # check everything before changing anything: a bad call leaves the options as they were
    if profile is not None and profile not in _PROFILES:
        raise ValueError(f"set_printoptions: profile must be one of {', '.join(map(repr, _PROFILES))}, got {profile!r}")
    _check_int("precision", precision, minimum=0)
    _check_int("edgeitems", edgeitems, minimum=0)
    _check_int("linewidth", linewidth, minimum=1)
    if threshold is not None and not (_is_real(threshold) and threshold >= 0):  # NaN fails >= 0 too
        raise ValueError(
            f"set_printoptions: threshold must be a number >= 0 (math.inf: never abbreviate), got {threshold!r}"
        )
    if sci_mode is not None and not isinstance(sci_mode, bool):
        raise ValueError(f"set_printoptions: sci_mode must be True, False or None (automatic), got {sci_mode!r}")

    if profile is not None:
        for name, value in _PROFILES[profile].items():
            setattr(OPTIONS, name, value)
    given = dict(precision=precision, threshold=threshold, edgeitems=edgeitems, linewidth=linewidth)
    for name, number in given.items():
        if number is not None:
            setattr(OPTIONS, name, number)
    OPTIONS.sci_mode = sci_mode


def get_printoptions() -> dict[str, Any]:
    """The current print options, as a dict that ``set_printoptions(**options)`` takes back."""
    return dataclasses.asdict(OPTIONS)


def _is_real(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _check_int(name: str, value: int | None, minimum: int) -> None:
    if value is not None and not (_is_real(value) and isinstance(value, numbers.Integral) and value >= minimum):
        raise ValueError(f"set_printoptions: {name} must be an integer >= {minimum}, got {value!r}")


# -- from an array to text ------------------------------------------------------------------------
def tensor_repr(prefix: str, data: numpy.ndarray, extras: Sequence[str]) -> str:
    """``prefix`` (``"tensor("``), the values of the NumPy array ``data``, then ``extras``
    (``"dtype=float64"``...) and ``")"``; the lines after the first are indented under the ``[``."""
    indent = len(prefix)
    return _add_extras(prefix + array_str(data, indent), extras, indent)


def array_str(data: numpy.ndarray, indent: int) -> str:
    """The values of ``data`` as nested ``[...]``, for text that starts ``indent`` columns in."""
    if data.size == 0:
        return "[]"
    abbreviate = data.size > OPTIONS.threshold
    formatter = _Formatter(_shown(data) if abbreviate else data.reshape(-1))
    return _nested_str(data, indent, abbreviate, formatter)


class _Formatter:
    """One format and one width for every number shown, chosen from those numbers."""

    def __init__(self, shown: numpy.ndarray) -> None:
        """``shown``: the values on show, flat (all of them, or those an abbreviation keeps)."""
        self.floating = is_floating(shown.dtype)
        self.whole = True  # all the (finite, nonzero) values are whole numbers: print "2."
        self.sci = False
        self.width = 1
        if not self.floating:  # integers and booleans: as Python prints them
            self.width = max([1] + [len(str(value)) for value in shown.tolist()])
            return
        values = shown[numpy.isfinite(shown) & (shown != 0)]
        if values.size == 0:  # zeros, infinities and NaNs only: "0.", "inf", "nan"
            return
        magnitudes = numpy.abs(values.astype(numpy.float64))
        low, high = magnitudes.min(), magnitudes.max()
        self.whole = bool((values == numpy.ceil(values)).all())
        if OPTIONS.sci_mode is None:
            self.sci = bool(high / low > 1000.0 or high > 1.0e8 or low < 1.0e-4)
        else:
            self.sci = OPTIONS.sci_mode
        self.width = max(len(self._text(value)) for value in values.tolist())

    def _text(self, value: float) -> str:
        """``value`` (a Python number) in the chosen format, without padding."""
        if not self.floating:
            return str(value)
        if self.sci:
            return f"{value:.{OPTIONS.precision}e}"
        if self.whole:  # the point says "float"; inf and nan stay as they are
            return f"{value:.0f}" + ("" if math.isinf(value) or math.isnan(value) else ".")
        return f"{value:.{OPTIONS.precision}f}"  # precision=0: "2", no point, as in PyTorch

    def format(self, value: float) -> str:
        return self._text(value).rjust(self.width)


def _shown(data: numpy.ndarray) -> numpy.ndarray:
    """The values an abbreviated print shows, flat: they alone choose the format
    (PyTorch's ``get_summarized_data``)."""
    edge = OPTIONS.edgeitems
    if data.ndim == 0 or (data.ndim == 1 and len(data) <= 2 * edge):
        return data.reshape(-1)
    if data.ndim == 1:
        # with edgeitems=0, data[-0:] is all of data: every value sets the width, as in PyTorch
        return numpy.concatenate([data[:edge], data[-edge:]])
    if edge == 0:
        return data.reshape(-1)[:0]
    rows = range(len(data)) if len(data) <= 2 * edge else [*range(edge), *range(len(data) - edge, len(data))]
    return numpy.concatenate([_shown(data[i]) for i in rows])


def _nested_str(data: numpy.ndarray, indent: int, abbreviate: bool, formatter: _Formatter) -> str:
    """``data`` as nested brackets: rows of numbers, then blocks of rows separated by blank lines."""
    if data.ndim == 0:
        return formatter.format(data.item())
    if data.ndim == 1:
        return _row_str(data, indent, abbreviate, formatter)
    edge = OPTIONS.edgeitems
    rows: Sequence[int | None]
    if abbreviate and len(data) > 2 * edge:
        rows = [*range(edge), None, *range(len(data) - edge, len(data))]
    else:
        rows = range(len(data))
    parts = ["..." if i is None else _nested_str(data[i], indent + 1, abbreviate, formatter) for i in rows]
    # one blank line between matrices, two between blocks of matrices...
    return "[" + ("," + "\n" * (data.ndim - 1) + " " * (indent + 1)).join(parts) + "]"


def _row_str(row: numpy.ndarray, indent: int, abbreviate: bool, formatter: _Formatter) -> str:
    """A 1-D row: as many numbers per line as fit in ``linewidth``."""
    edge = OPTIONS.edgeitems
    if abbreviate and edge == 0:
        items = ["..."]
    elif abbreviate and len(row) > 2 * edge:
        items = [formatter.format(v) for v in row[:edge].tolist()]
        items += [" ..."] + [formatter.format(v) for v in row[-edge:].tolist()]
    else:
        items = [formatter.format(v) for v in row.tolist()]
    per_line = max(1, (OPTIONS.linewidth - indent) // (formatter.width + 2))  # ", " after each
    lines = [", ".join(items[i : i + per_line]) for i in range(0, len(items), per_line)]
    return "[" + (",\n" + " " * (indent + 1)).join(lines) + "]"


def _add_extras(text: str, extras: Sequence[str], indent: int) -> str:
    """``text, extra1, extra2)``, starting a new line (``indent`` in) before an extra that
    would pass ``linewidth``. PyTorch counts the current line's length this way, +2 included."""
    parts = [text]
    line = len(text) - text.rfind("\n") + 1
    for extra in extras:
        if line + len(extra) + 2 > OPTIONS.linewidth:
            parts.append(",\n" + " " * indent + extra)
            line = indent + len(extra)
        else:
            parts.append(", " + extra)
            line += len(extra) + 2
    return "".join(parts) + ")"
