"""Reference softmax / log-softmax written with plain array-library calls.

Each function takes the array module ``xp`` (``numpy``, ``cupy``, ...) first
and uses only ``xp.`` functions and array methods, so the same code runs on
any NumPy-compatible library.  Semantics are identical to the numba kernels
in :mod:`minitensor.kernels.cpu`:

* ``softmax_forward(xp, x, lens)``: row-wise softmax over the last axis of a
  2-D array.  If ``lens`` is given, row ``r`` uses only columns
  ``[0, lens[r])`` (clipped to ``[0, n]``); the other columns get weight 0.
* ``log_softmax_forward(xp, x, lens)``: the log of that; masked columns give
  ``-inf``.
* A row with no valid entry (length 0) or whose valid entries are all
  ``-inf`` is an empty distribution: softmax gives all zeros and log-softmax
  all ``-inf`` -- never NaN, never uniform weights.

How the masking avoids NaN without branches: masked logits are replaced by
``-inf`` (``exp(-inf) = 0``), and for an empty row the max is replaced by 0
and the sum by 1 before they are used, because ``-inf - (-inf)`` and
``0 / 0`` are NaN.  Floating-point warnings are silenced where the library
supports ``errstate`` (only NaN/``+inf`` inputs could raise one).
"""

import contextlib


def _quiet(xp):
    """``xp.errstate(all="ignore")`` if the library has it, else a no-op."""
    errstate = getattr(xp, "errstate", None)
    return errstate(all="ignore") if errstate is not None else contextlib.nullcontext()


def _masked_logits(xp, x, lens):
    """``x`` with the columns ``j >= lens[r]`` of each row set to ``-inf``."""
    if lens is None:
        return x
    n = x.shape[-1]
    lens = xp.clip(xp.asarray(lens), 0, n)
    valid = xp.arange(n)[None, :] < lens[:, None]
    return xp.where(valid, x, -xp.inf).astype(x.dtype, copy=False)


def _shifted(xp, logits):
    """``logits - rowmax`` and a mask of the empty rows (max == -inf).

    For an empty row the max is replaced by 0, so its entries stay ``-inf``
    instead of becoming ``-inf - (-inf) = NaN``.
    """
    m = xp.max(logits, axis=-1, keepdims=True)
    empty = m == -xp.inf
    m = xp.where(empty, 0, m).astype(logits.dtype, copy=False)
    return logits - m, empty


def softmax_forward(xp, x, lens=None):
    """``y_j = exp(x_j - max) / sum_k exp(x_k - max)`` over the valid columns.

    Masked columns and empty rows give 0.
    """
    if x.shape[-1] == 0:
        return xp.empty_like(x)
    with _quiet(xp):
        shifted, empty = _shifted(xp, _masked_logits(xp, x, lens))
        e = xp.exp(shifted)
        total = e.sum(axis=-1, keepdims=True)
        total = xp.where(empty, 1, total).astype(x.dtype, copy=False)
        return e / total


def softmax_backward(xp, y, g):
    """``dx = y * (g - sum_j g_j y_j)`` per row."""
    with _quiet(xp):
        return y * (g - (g * y).sum(axis=-1, keepdims=True))


def log_softmax_forward(xp, x, lens=None):
    """``y_j = (x_j - max) - log(sum_k exp(x_k - max))`` over the valid columns.

    Masked columns and empty rows give ``-inf``.
    """
    if x.shape[-1] == 0:
        return xp.empty_like(x)
    with _quiet(xp):
        shifted, empty = _shifted(xp, _masked_logits(xp, x, lens))
        total = xp.exp(shifted).sum(axis=-1, keepdims=True)
        total = xp.where(empty, 1, total).astype(x.dtype, copy=False)
        return shifted - xp.log(total)


def log_softmax_backward(xp, y, g):
    """``dx_j = g_j - exp(y_j) * sum_{k: y_k finite} g_k``; 0 where ``y_j = -inf``."""
    with _quiet(xp):
        finite = y != -xp.inf
        total = xp.where(finite, g, 0).sum(axis=-1, keepdims=True)
        dx = g - xp.exp(y) * total
        return xp.where(finite, dx, 0).astype(y.dtype, copy=False)
