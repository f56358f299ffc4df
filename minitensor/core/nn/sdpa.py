"""PyTorch's ``F.scaled_dot_product_attention``, over minitensor's two ways of attending.

A PyTorch model attends with one call (nanoGPT's ``CausalSelfAttention`` does):

    y = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False,
                                       scale=None, enable_gqa=False)

that is, D2L's scaled dot-product attention (11.3.2; Vaswani et al. 2017, eq. 1)

    softmax(scale Q K^T + mask) V,   scale = 1 / sqrt(d) by default,

and PyTorch picks the kernel. The same call runs here, with PyTorch's rules, on whichever of
minitensor's two paths is faster for it, as ``MultiHeadAttention(fused="auto")`` picks:

- the stream (``ops.flash_attention``: FlashAttention's online softmax, tutorial 10), where it
  pays (``stream_pays``: long sequences, or one tile on the CPU) and can take the call: no float
  mask (an additive (L, S) mask is a dense bias the stream does not read), keys and values with
  the queries' batch axes;
- else the plain path: the scores, D2L's ``masked_softmax``, ``dropout`` and a matrix product.

Both give the same result to rounding and, with the same seed, drop the same weights (the
stream's dropout is ``mt.dropout``'s mask, see ``ops/dropout.py``); the tests hold both to
PyTorch's. PyTorch's rules, as PyTorch 2.13 applies them:

- shapes: query (..., L, E), key (..., S, E), value (..., S, Ev) -> (..., L, Ev); the batch axes
  broadcast. ``enable_gqa=True``: the heads axis (-3) of key and value may divide the queries'
  (grouped-query attention: query head h reads key/value head h // (Hq / Hk)).
- ``attn_mask``: bool (True = may attend) or a float mask of the queries' dtype added to the
  scores (it gets a gradient if it requires one), broadcastable to (..., L, S).
- ``is_causal``: query i sees keys j <= i, the mask's *upper-left* corner, also when L != S
  (minitensor's own ``causal=`` aligns the lower-right corner instead, as a decoder with a cache
  needs: query i sees j <= i + S - L). Not together with ``attn_mask`` (PyTorch's reference code
  refuses the pair, and its kernels disagree on what it means): put the causal mask into it.
- a query that may see no key gets zeros, not NaN; ``dropout_p`` drops weights whenever it is
  above 0 (the function knows no training mode: pass 0 in evaluation, as nanoGPT does).
"""

from __future__ import annotations

import math
from typing import Any

import numpy

from .. import amp
from ..dtypes import is_floating
from ..errors import DeviceError, DTypeError, ShapeError
from ..ops import add, dropout, expand, masked_softmax, matmul, reshape, swapaxes, unsqueeze
from ..ops.dropout import check_probability
from ..ops.flash_attention import FlashAttention, stream_pays, stream_plan
from ..tensor import Tensor

_OP = "scaled_dot_product_attention"


def scaled_dot_product_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    *,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> Tensor:
    """softmax(scale Q K^T + mask) V with PyTorch's arguments and rules (this module's
    docstring): query (..., L, E), key (..., S, E), value (..., S, Ev) -> (..., L, Ev).
    ``attn_mask``: bool (True = may attend) or float (added to the scores), broadcastable to
    (..., L, S); ``is_causal``: query i sees keys j <= i; ``scale``: 1 / sqrt(E) by default;
    ``dropout_p``: dropout on the weights; ``enable_gqa``: key/value heads (axis -3) may divide
    the query heads. Streams (FlashAttention) where that is faster and possible. Inside
    ``mt.autocast`` a product: query, key, value and a float mask in bfloat16, as in PyTorch
    (the stream then runs in float32, the plain path's softmax too)."""
    query, key, value = amp.lower(query, key, value)
    if isinstance(attn_mask, Tensor) and is_floating(attn_mask.dtype):
        (attn_mask,) = amp.lower(attn_mask)
    _check(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else float(scale)
    attend = _streamed if _streamable(query, key, value, attn_mask) else _plain
    return attend(query, key, value, attn_mask, float(dropout_p), bool(is_causal), scale)


def _plain(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | None,
    dropout_p: float,
    is_causal: bool,
    scale: float,
) -> Tensor:
    """The whole (..., L, S) scores and weights: D2L's scaled dot-product attention (11.3.2)."""
    Hq, Hk = _heads(query), _heads(key)
    if 1 < Hk < Hq:  # grouped heads: each key/value head repeated for its query heads
        key, value = _repeat_heads(key, Hq), _repeat_heads(value, Hq)
    scores = matmul(query, swapaxes(key, -1, -2)) * scale
    mask = _upper_left(query, key.shape[-2]) if is_causal else None
    if attn_mask is not None and is_floating(attn_mask.dtype):
        # -inf where a key is masked out; a row left with only -inf gets zeros from the softmax
        scores = add(scores, attn_mask)
    elif attn_mask is not None:
        mask = attn_mask
    weights = masked_softmax(scores, mask=mask)
    if dropout_p > 0:
        weights = dropout(weights, dropout_p)
    return matmul(weights, value)


def _streamed(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | None,
    dropout_p: float,
    is_causal: bool,
    scale: float,
) -> Tensor:
    """``ops.flash_attention`` on the call seen as (batch, heads, steps, d): the batch axes
    before the heads flattened into one (the weights keep their order, so dropout numbers them as
    the plain path does), upper-left causal as one length per query where L != S."""
    L, S = query.shape[-2], key.shape[-2]
    q, k, v = (amp.in_float32(_as_4d(x)) for x in (query, key, value))  # float32 in autocast (flash_attention)
    B, H = q.shape[:2]
    causal, lens = False, None
    if is_causal and L == S:
        causal = True  # the two corners are the same diagonal
    elif is_causal:  # query i sees keys 0..i: valid_lens = min(i + 1, S), one per query
        xp = query._backend.xp
        row = xp.minimum(xp.arange(1, L + 1, dtype=numpy.int64), S)
        lens = Tensor._make(xp.ascontiguousarray(xp.broadcast_to(row, (B, L))), query._backend, None)
    mask = None
    if attn_mask is not None:
        mask = attn_mask if attn_mask.ndim <= 2 else _mask_4d(attn_mask, query.shape[:-2] + (L, S), (B, H, L, S))
    plan = stream_plan(q, k, v, lens, mask, causal, scale, keep_weights=True, dropout_p=dropout_p)
    out = FlashAttention.apply(q, k, v, None, plan=plan, masks=plan.masks)
    return reshape(out, query.shape[:-1] + (value.shape[-1],))


def _streamable(query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None) -> bool:
    """Does the stream take this call, and is it faster there?"""
    if attn_mask is not None and is_floating(attn_mask.dtype):
        return False  # a dense additive bias
    if key.shape[:-3] != query.shape[:-3] or (key.ndim < 3 and key.shape[:-2] != query.shape[:-2]):
        return False  # batch axes that broadcast: the plain path's matrix products do that
    if key.ndim >= 3 and key.ndim != query.ndim or value.shape[:-2] != key.shape[:-2]:
        return False
    if _heads(query) % _heads(key):
        return False  # query heads broadcast over several key heads
    return stream_pays(query.shape[-2], key.shape[-2], query._backend, mask=attn_mask is not None)


def _check(
    query: Any,
    key: Any,
    value: Any,
    attn_mask: Any,
    dropout_p: Any,
    is_causal: Any,
    scale: Any,
    enable_gqa: Any,
) -> None:
    """PyTorch's checks, with messages that name the call and the values."""
    for name, x in (("query", query), ("key", key), ("value", value)):
        if not isinstance(x, Tensor):
            raise TypeError(f"{_OP}: {name} must be a Tensor, got {type(x).__name__}")
        if x.ndim < 2:
            raise ShapeError(f"{_OP}: {name} must have at least 2 axes (..., steps, features), got {tuple(x.shape)}")
        if not is_floating(x.dtype):
            raise DTypeError(f"{_OP}: {name} must be a float tensor, got {x.dtype}")
        if x._backend is not query._backend:
            raise DeviceError(
                f"{_OP}: query is on {query.device!r} but {name} on {x.device!r}; move it with .to({query.device!r})"
            )
    if not (query.dtype == key.dtype == value.dtype):
        raise DTypeError(
            f"{_OP}: query, key and value must have one dtype, got {query.dtype}, {key.dtype} and {value.dtype}"
        )
    shapes = f"query {tuple(query.shape)}, key {tuple(key.shape)}, value {tuple(value.shape)}"
    if key.shape[-1] != query.shape[-1] or value.shape[-2] != key.shape[-2]:
        raise ShapeError(
            f"{_OP}: {shapes} do not fit: expected (..., L, E), (..., S, E) and (..., S, Ev), the same E for query "
            "and key and the same S for key and value"
        )
    if enable_gqa and min(query.ndim, key.ndim, value.ndim) < 3:
        raise ShapeError(f"{_OP}: enable_gqa=True needs a heads axis (..., heads, steps, features); {shapes}")
    Hq, Hk, Hv = _heads(query), _heads(key), _heads(value)
    if Hk != Hv:
        raise ShapeError(f"{_OP}: key and value must have the same number of heads (axis -3); {shapes}")
    if enable_gqa and Hq % Hk:
        raise ShapeError(
            f"{_OP}: with enable_gqa=True the key/value heads ({Hk}) must divide the query heads ({Hq}); {shapes}"
        )
    grouped = enable_gqa and Hk != Hq
    batch = [x.shape[:-3] if grouped else x.shape[:-2] for x in (query, key, value)]
    try:
        lead = numpy.broadcast_shapes(*batch)
    except ValueError:
        hint = " (grouped heads need enable_gqa=True)" if Hk != Hq and Hq % Hk == 0 and not enable_gqa else ""
        raise ShapeError(f"{_OP}: the batch axes of {shapes} do not broadcast{hint}") from None
    if attn_mask is not None:
        if not isinstance(attn_mask, Tensor):
            raise TypeError(
                f"{_OP}: attn_mask must be a Tensor (bool or float) or None, got {type(attn_mask).__name__}"
            )
        if attn_mask._backend is not query._backend:
            raise DeviceError(
                f"{_OP}: query is on {query.device!r} but attn_mask on {attn_mask.device!r}; move it with "
                f".to({query.device!r})"
            )
        if attn_mask.dtype.kind != "b" and attn_mask.dtype != query.dtype:
            raise DTypeError(
                f"{_OP}: attn_mask must be bool (True = may attend) or a float mask of the query's dtype "
                f"{query.dtype} (added to the scores), got {attn_mask.dtype}"
            )
        full = (*lead, Hq, query.shape[-2], key.shape[-2]) if grouped else (*lead, query.shape[-2], key.shape[-2])
        try:
            fits = numpy.broadcast_shapes(attn_mask.shape, full) == full
        except ValueError:
            fits = False
        if not fits:
            raise ShapeError(
                f"{_OP}: attn_mask of shape {tuple(attn_mask.shape)} does not broadcast to the scores "
                f"(..., L, S) = {full}"
            )
    check_probability(_OP, "dropout_p", dropout_p)
    if not isinstance(is_causal, (bool, numpy.bool_)):
        raise TypeError(f"{_OP}: is_causal must be True or False, got {is_causal!r}")
    if is_causal and attn_mask is not None:
        raise ValueError(
            f"{_OP}: attn_mask and is_causal=True together; as in PyTorch, give one: the causal rule (key j "
            "visible to query i when j <= i) combined into attn_mask, or is_causal alone"
        )
    if scale is not None and (not isinstance(scale, (int, float, numpy.floating)) or isinstance(scale, bool)):
        raise TypeError(f"{_OP}: scale must be a number or None (1 / sqrt(E)), got {scale!r}")
    if scale is not None and not math.isfinite(scale):  # (every score, and so every output, NaN)
        raise ValueError(f"{_OP}: scale must be a finite number (None: 1 / sqrt(E)), got {scale!r}")


def _heads(x: Tensor) -> int:
    """The size of the heads axis (-3), 1 where there is none."""
    return x.shape[-3] if x.ndim >= 3 else 1


def _repeat_heads(x: Tensor, num_heads: int) -> Tensor:
    """(..., g, S, d) -> (..., num_heads, S, d): each key/value head once for each query head of
    its group, as PyTorch's ``repeat_interleave`` in its reference code."""
    *lead, g, S, d = x.shape
    r = num_heads // g
    return reshape(expand(unsqueeze(x, -3), *lead, g, r, S, d), (*lead, num_heads, S, d))


def _upper_left(query: Tensor, S: int) -> Tensor:
    """The bool (L, S) mask of ``is_causal``: key j visible to query i when j <= i."""
    xp, L = query._backend.xp, query.shape[-2]
    return Tensor._make(xp.arange(S)[None, :] <= xp.arange(L)[:, None], query._backend, None)


def _as_4d(x: Tensor) -> Tensor:
    """(..., heads, steps, d) as (batch, heads, steps, d), the batch axes flattened into one;
    (steps, d) as (1, 1, steps, d)."""
    if x.ndim == 4:
        return x
    if x.ndim == 2:
        return reshape(x, (1, 1) + x.shape)
    return reshape(x, (math.prod(x.shape[:-3]),) + x.shape[-3:])  # (-1 cannot say it when a size is 0)


def _mask_4d(mask: Tensor, full: tuple[int, ...], shape4: tuple[int, ...]) -> Tensor:
    """A bool mask with batch or head axes as (batch, heads, L, S) for the stream: as it is for
    a 4-D call (it broadcasts there already), else broadcast to the whole and flattened."""
    if len(full) == 4:
        return mask
    xp = mask._backend.xp
    return Tensor._make(xp.ascontiguousarray(xp.broadcast_to(mask.data, full)).reshape(shape4), mask._backend, None)
