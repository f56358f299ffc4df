"""Streaming attention (FlashAttention): softmax(S) V without ever holding the (Q, K) scores.

Plain attention computes the scores S = scale Q K^T + B for every query and key, turns each
row into weights with the masked softmax, and multiplies by V: two (batch, heads, Q, K)
arrays, both kept for backward. FlashAttention (Dao, Fu, Ermon, Rudra and Re 2022) computes
the same output one *tile* (a block of queries against a block of keys) at a time, with the
online softmax (Milakov and Gimelshein 2018, "Online normalizer calculation for softmax"):
for each query row it keeps the largest score seen so far m, the sum of exponentials
l = sum_j exp(s_j - m) and the unnormalised output o = sum_j exp(s_j - m) v_j. A new block of
scores s_j (j in the block) updates them as

    m' = max(m, max_j s_j)
    l' = l exp(m - m') + sum_j exp(s_j - m')                       (rescale, then add)
    o' = o exp(m - m') + sum_j exp(s_j - m') v_j

and after the last block softmax(s) V = o / l exactly (every term carries the same factor
exp(-m), which cancels). Only the output and one number per row, the log-sum-exp
lse = m + log l, are kept for backward.

The forward pass loops over blocks of queries outside and blocks of keys inside, and saves
only the log-sum-exp (FlashAttention-2's order, Dao 2023). Backward loops the other way, key
blocks outside and query blocks inside, so that dK and dV of a key block accumulate in
place (both papers do); it recomputes each tile's weights from the saved lse,
P = exp(S - lse), and with dO the output's gradient and D_i = sum_c dO_ic O_ic
(= sum_j P_ij dP_ij, one number per row):

    dV = P^T dO        dP = dO V^T        dS = P * (dP - D)
    dQ = scale dS K    dK = scale dS^T Q  dB[h, j - i] += dS[h, i, j]   (summed per distance)

Dropout on the weights (``dropout_p``, in training) multiplies them by the scaled mask
M_ij = m_ij / (1 - p) after the softmax, out = (M * P) V: the running sum l still adds every
exp(s_j - m) (the softmax's denominator is not dropped), the running output only the kept
ones, o' = o exp(m - m') + sum_j M_ij exp(s_j - m') v_j. In backward dV = (M * P)^T dO and
dP = M * (dO V^T), and D_i = dO_i . O_i still equals sum_j P_ij dP_ij, so dS = P * (dP - D) is
unchanged. The mask is never stored: it is a counter-based hash of (seed, the weight's index in
(batch, H, Q, K)), made again tile by tile in backward (FlashAttention does the same with
Philox), and the same mask ``mt.dropout`` draws for the whole weights with that seed.

Masks and biases act on each tile as they act on the whole matrix: a key that may not be
attended gets the score -inf. ``valid_lens``, ``causal`` and a bool ``mask`` are read one
tile at a time, and a tile that they (or a sliding ``window``) leave entirely empty is
skipped, not computed (by ``valid_lens`` on the CPU only: on a GPU, deciding would mean
reading the lengths on the host, which waits for the device). A bias that depends only on the distance j - i (a "scores"
positional encoding with ``relative = True``) enters as its ``relative_bias`` table,
(num_heads, Q + K - 1): O(T) numbers instead of a dense (Q, K) bias. A row with no key
left gets zeros, never NaN. Its log-sum-exp would be log 0 = -inf; it is stored as +inf
instead, so that backward's exp(s - lse) is exp(-inf) = 0 for every key of the row,
where -inf would give exp(-inf - (-inf)) = NaN.

Grouped heads: with keys and values of g heads and queries of H = g r heads, query head
h reads key/value head h // r. The r query heads of a group are stacked into one block of
r * n queries, (batch, g, r * n, d), so each tile is a single matrix product with the
group's keys: K and V are never repeated.

One tile: a sequence short enough for a single tile has nothing to stream, and there the
recomputation in backward costs more than it saves. ``MultiHeadAttention`` then asks for
``keep_weights`` (CPU only): the tile's weights P are kept, backward reads them instead of
recomputing them, and ``causal`` and ``valid_lens`` reach the softmax kernel as one length per
row rather than as -inf written into the scores (``FlashAttention.one_tile``).

Why the tiles are BLAS products, not a numba kernel: a tile's two products (Q_b K_b^T and
P V_b) are where the arithmetic is, and BLAS (NumPy) or cuBLAS (CuPy) runs them at close
to the machine's peak, where a hand-written numba loop would be several times slower. The
same code then runs on both backends. What is left between the products is a few
elementwise passes over the tile (max, subtract, exp, sum), which NumPy and CuPy vectorise.
Numba kernels doing each row of those passes in one go were tried and measured against
these lines (bench/README.md, ``long_attention.py``): no steady gain on the CPU, and slower
when their threads and BLAS's took turns on the same cores, so the passes stay plain array
code, the same on both backends.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy

from .. import amp
from ..autograd import Function, Grads
from ..backends import Backend
from ..errors import ShapeError
from ..tensor import Array, Tensor
from .dropout import apply_counter_mask, check_probability, counter_mask
from .softmax import as_mask_tensors, as_rows

# Tile sizes (queries x keys): large enough that a tile's matrix products run at BLAS speed
# and the Python loop is short, small enough that a tile of batch * heads * 256 * 256 floats
# stays a few MiB whatever the sequence length. Measured in bench/long_attention.py.
BLOCK_Q = 256
BLOCK_K = 256

# Where streaming pays (``MultiHeadAttention(fused="auto")`` and
# ``F.scaled_dot_product_attention`` both ask ``stream_pays``): from this length on, for both Q
# and K, the shortest at which streaming measured faster than the plain path's few large array
# operations, for one long sequence and for a batch of them (``python bench/long_attention.py
# --crossover``); and, on the CPU, a call short enough for one tile, whose weights the stream
# keeps (``StreamPlan.keep_weights``): the plain path's arithmetic in one node, measured faster
# than the plain path's separate ones.
FUSED_MIN_LENGTH = 384


def fits_one_tile(Q: int, K: int, backend: Backend) -> bool:
    """Is a call of Q queries and K keys one tile of the stream on the CPU (where the stream
    keeps its weights, ``StreamPlan.keep_weights``)?"""
    return Q <= BLOCK_Q and K <= BLOCK_K and backend.on_host


def stream_pays(Q: int, K: int, backend: Backend, mask: bool = False, one_tile: bool = True) -> bool:
    """Is streaming Q queries against K keys faster than the plain path? From FUSED_MIN_LENGTH on,
    and, where ``one_tile`` allows it, for a call that is one tile on the CPU.

    ``mask``: the call has a dense bool mask. The stream pays for one on the CPU, where its tiles
    are a few BLAS products each, but not on a GPU: there it pays through its CUDA kernels
    (attention.cu), which take causal and valid_lens but no dense mask, and its loop over tiles
    of array operations would launch some twenty kernels a tile, thousands a call where the
    plain path launches a few."""
    if mask and not backend.on_host:
        return False
    return (Q >= FUSED_MIN_LENGTH and K >= FUSED_MIN_LENGTH) or (one_tile and fits_one_tile(Q, K, backend))


def _blocks(n: int, size: int) -> list[tuple[int, int]]:
    return [(start, min(start + size, n)) for start in range(0, n, size)]


class StreamPlan:
    """One streamed attention call, apart from Q, K and V themselves: the shapes, the tiles
    that run, and how a tile's scores are scaled, biased and masked.

    Shapes: queries (batch, H, Q, d), keys and values (batch, g, K, d) with H = g * r.
    ``lens``: valid_lens, (batch,) or (batch, Q); ``mask``: bool, broadcastable to
    (batch, H, Q, K), True = may attend; ``table``: the (H, Q + K - 1) relative bias (column
    c is the bias at distance (key position - query position) = min_distance + c), or None;
    ``window``: keys farther than this from the query are -inf in ``table`` (so tiles that
    lie entirely beyond it are skipped); ``q_offset``, ``k_offset``: positions of the first
    query and key. ``causal``: query i may attend key j when j <= i + (K - Q).
    """

    # The arrays that may be None (Array is Any, so the annotations do not say it):
    lens: Array  # valid_lens shaped for a tile, or None
    mask: Array  # the bool mask shaped for a tile, or None
    table: Array  # the relative bias, or None
    _lens_host: Any  # valid_lens as a NumPy array on the host (the CPU's only), or None
    lse: Array  # set by the forward pass, None until then (as q, k and unscaled_q)
    q: Array
    k: Array
    unscaled_q: Array
    masks: tuple[Tensor | None, Tensor | None]  # set by stream_plan: the (valid_lens, mask) Tensors

    def __init__(
        self,
        backend: Backend,
        q_shape: tuple[int, ...],
        k_shape: tuple[int, ...],
        scale: float,
        causal: bool = False,
        lens: Array | None = None,
        mask: Array | None = None,
        table: Array | None = None,
        window: int | None = None,
        q_offset: int = 0,
        k_offset: int = 0,
        block_q: int | None = None,
        block_k: int | None = None,
        keep_weights: bool = False,
        dropout_p: float = 0.0,
    ) -> None:
        self.backend = backend
        self.xp = backend.xp
        self.batch, self.num_heads, self.Q, self.d = q_shape
        _, self.g, self.K, _ = k_shape
        self.r = self.num_heads // self.g
        self.scale, self.causal, self.window = scale, causal, window
        self.q_offset, self.k_offset = q_offset, k_offset
        self.block_q, self.block_k = block_q or BLOCK_Q, block_k or BLOCK_K
        self.table = table
        self.lens = self._lens(lens)
        self.mask = self._mask(mask)
        self.lse = self.q = self.k = self.unscaled_q = None  # set by the forward pass, for ``weights``
        # One tile, weights kept (see ``one_tile``): asked for by the caller, and only where
        # the whole (Q, K) matrix is one tile, on the host (a GPU has its own kernels)
        self.keep_weights = keep_weights and self.Q <= self.block_q and self.K <= self.block_k and backend.on_host
        self.P: Array | None = None  # the weights of a one-tile call (batch, g, r * Q, K)
        # Dropout on the weights: the seed drawn here, from the backend's generator, as
        # ``ops.Dropout`` draws its own, and weight (b, h, i, j) numbered as in the whole
        # (batch, H, Q, K) weights, so the stream drops exactly what the plain path would
        self.dropout_p = dropout_p
        # (seed, threshold, scale): ops.dropout.counter_mask
        self.dropout_mask = counter_mask(backend, dropout_p) if dropout_p > 0 else None

    # Index arrays over a tile, made on first use (a one-tile call without a bias or a mask
    # needs neither, and a decoding step's plan would spend more time making them than attending)
    @functools.cached_property
    def _diagonals(self) -> Array:
        """j - i + (Q - 1) over a full tile: the table's column of each cell, less (j0 - i0)."""
        bq, bk = min(self.block_q, self.Q), min(self.block_k, self.K)
        return self.xp.arange(bk)[None, :] - self.xp.arange(bq)[:, None] + (self.Q - 1)

    @functools.cached_property
    def _cell(self) -> tuple[Array, Array]:
        """The query (rows) and key (columns) index of each cell of a full tile."""
        bq, bk = min(self.block_q, self.Q), min(self.block_k, self.K)
        return self.xp.arange(bq)[:, None], self.xp.arange(bk)[None, :]

    # -- the masks, shaped to broadcast over a tile (batch, g, r, n_q, n_k) ------------------
    def _lens(self, lens: Array | None) -> Array | None:
        self._lens_host = None
        if lens is None:
            return None
        B, Q = self.batch, self.Q
        if lens.dtype.kind not in "iu":
            raise TypeError(f"flash_attention: valid_lens must be integers, got {lens.dtype}")
        if lens.shape not in ((B,), (B, Q)):
            raise ShapeError(
                f"flash_attention: valid_lens of shape {tuple(lens.shape)} does not fit queries of shape "
                f"{(B, self.num_heads, Q, self.d)}; expected (batch,) = ({B},) or (batch, Q) = ({B}, {Q})"
            )
        # Which key blocks can be skipped is decided in Python, from the lengths on the host. On
        # the CPU they are there already; on a device, reading them would make the host wait for
        # the GPU at every attention call, so there every tile runs and the lengths mask it.
        self._lens_host = self.backend.to_numpy(lens).reshape(B, -1) if self.backend.on_host else None
        return lens.reshape(B, 1, 1, -1, 1)

    def _mask(self, mask: Array | None) -> Array | None:
        if mask is None:
            return None
        if mask.dtype.kind != "b":
            raise TypeError(f"flash_attention: mask must be a bool tensor (True = may attend), got {mask.dtype}")
        full = (self.batch, self.num_heads, self.Q, self.K)
        try:
            fits = numpy.broadcast_shapes(mask.shape, full) == full
        except ValueError:
            fits = False
        if not fits or mask.ndim > 4:
            raise ShapeError(
                f"flash_attention: mask of shape {tuple(mask.shape)} does not broadcast to "
                f"(batch, heads, Q, K) = {full}"
            )
        mask = mask.reshape((1,) * (4 - mask.ndim) + mask.shape)
        B, H, Qm, Km = mask.shape
        # (batch, g, r, Q, K): the heads axis split into groups like the queries'
        return mask.reshape(B, self.g, self.r, Qm, Km) if H > 1 else mask.reshape(B, 1, 1, Qm, Km)

    # -- which tiles run ---------------------------------------------------------------------
    def query_blocks(self) -> list[tuple[int, int]]:
        return _blocks(self.Q, self.block_q)

    def key_blocks(self) -> list[tuple[int, int]]:
        return _blocks(self.K, self.block_k)

    def visits(self, i0: int, i1: int, j0: int, j1: int) -> bool:
        """Does the tile (queries i0..i1-1, keys j0..j1-1) hold any key a query may attend?"""
        if self.causal and j0 > (i1 - 1) + (self.K - self.Q):  # every key in the future
            return False
        if self.window is not None:
            nearest = self.k_offset + j0 - (self.q_offset + i1 - 1)  # the smallest distance j - i
            farthest = self.k_offset + j1 - 1 - (self.q_offset + i0)  # the largest
            if nearest > self.window or farthest < -self.window:
                return False
        if self._lens_host is not None and j0 >= self._lens_of(i0, i1).max():
            return False
        return True

    def _lens_of(self, i0: int, i1: int) -> numpy.ndarray:
        """The valid lengths of queries i0..i1-1, on the host (the CPU's only)."""
        return self._lens_host if self._lens_host.shape[1] == 1 else self._lens_host[:, i0:i1]

    def _allowed(self, i0: int, i1: int, j0: int, j1: int, prefixes: bool = True) -> Array | None:
        """The tile's bool mask (True = may attend), or None when it allows every cell.
        ``prefixes=False`` leaves out ``causal`` and ``valid_lens`` (see ``row_lens``)."""
        allowed = None
        if prefixes and self.causal and j1 - 1 > i0 + (self.K - self.Q):  # the tile crosses the diagonal
            i, j = self._cell[0][: i1 - i0] + i0, self._cell[1][:, : j1 - j0] + j0
            allowed = j - i <= self.K - self.Q
        if prefixes and self.lens is not None and (self._lens_host is None or j1 > self._lens_of(i0, i1).min()):
            rows = self.lens[..., i0:i1, :] if self.lens.shape[3] > 1 else self.lens
            inside = self._cell[1][:, : j1 - j0] + j0 < rows
            allowed = inside if allowed is None else allowed & inside
        if self.mask is not None:
            m = self.mask
            m = m[..., i0:i1, :] if m.shape[3] > 1 else m
            m = m[..., j0:j1] if m.shape[4] > 1 else m
            allowed = m if allowed is None else allowed & m
        return allowed

    def bias(self, i0: int, i1: int, j0: int, j1: int) -> Array:
        """The relative bias on the tile, (g, r, n_q, n_k): table[h, (j - i) + (Q - 1)]."""
        columns = self._diagonals[: i1 - i0, : j1 - j0] + (j0 - i0)
        return self.table[:, columns].reshape(self.g, self.r, i1 - i0, j1 - j0)

    def scores(
        self, q_block: Array, k: Array, i0: int, i1: int, j0: int, j1: int, prefixes: bool = True, k_t: Array = None
    ) -> Array:
        """The tile's scores, (batch, g, r * n_q, n_k): scale q k^T + bias, -inf where masked
        (``prefixes=False``: not where only ``causal`` or ``valid_lens`` mask, see ``row_lens``).
        ``q_block`` holds the queries already multiplied by ``scale``; ``k_t``, if given, the
        tile's keys transposed, (batch, g, d, n_k)."""
        S = self.backend.matmul(q_block, k[:, :, j0:j1].swapaxes(-1, -2) if k_t is None else k_t)
        S5 = S.reshape(self.batch, self.g, self.r, i1 - i0, j1 - j0)  # a view: heads of a group apart
        if self.table is not None:
            S5 += self.bias(i0, i1, j0, j1)
        allowed = self._allowed(i0, i1, j0, j1, prefixes)
        if allowed is not None:
            self.xp.copyto(S5, -self.xp.inf, where=~allowed)
        return S

    def query_block(self, q5: Array, i0: int, i1: int) -> Array:
        """Queries i0..i1-1 of every head as (batch, g, r * n, d): the r heads of a group stacked
        (a copy when r > 1; a view otherwise)."""
        return q5[:, :, :, i0:i1].reshape(self.batch, self.g, self.r * (i1 - i0), q5.shape[-1])

    # -- dropout on the weights -----------------------------------------------------------------
    def drop(self, x: Array, i0: int, i1: int, j0: int) -> Array:
        """Dropout on a tile x (batch, g, r * n, n_k) of the weights of queries i0..i1-1 and keys
        j0.. (or of the gradient of the dropped weights, which goes through the same mask): each
        element times 1 / (1 - p) where it is kept, else 0, kept as element
        ((b H + h) Q + i) K + j of the whole weights is kept by ``ops.Dropout`` with this seed.
        x itself without dropout."""
        if self.dropout_mask is None:
            return x
        if (i0, i1, j0, x.shape[-1]) == (0, self.Q, 0, self.K):  # one tile is the whole, numbered as it lies
            return apply_counter_mask(self.backend, x, *self.dropout_mask)
        xp = self.xp
        batch = xp.arange(self.batch, dtype=numpy.int64).reshape(-1, 1, 1, 1)
        heads = xp.arange(self.num_heads, dtype=numpy.int64).reshape(1, self.g, self.r, 1)
        rows = (batch * self.num_heads + heads) * self.Q + xp.arange(i0, i1, dtype=numpy.int64)
        row_start = (rows * self.K + j0).reshape(-1)  # each tile row's first element, in the whole
        tile = apply_counter_mask(self.backend, x.reshape(-1, x.shape[-1]), *self.dropout_mask, row_start=row_start)
        return tile.reshape(x.shape)

    # -- the GPU's kernels ----------------------------------------------------------------------
    def device_kernels(self, v: Array) -> Any:
        """The backend's streamed-attention kernels (``kernels/cuda/attention.cu`` on a GPU), or
        None where the backend has none or this call needs what they lack: a bool mask, values of
        another size than the queries, a head size or dtype without a kernel. Masks by ``causal``
        and ``valid_lens``, and a relative bias with its window (and its gradient, for a learned
        one), they apply themselves."""
        kernels = getattr(self.backend, "attention_kernels", None)
        if kernels is None or self.mask is not None or v.shape[-1] != self.d:
            return None
        return kernels if kernels.attention_row_size(v.dtype, self.d) is not None else None

    def kernel_bias(self) -> dict[str, Any]:
        """The relative bias as the kernels take it: the table, the distance of query i and key
        j being j - i + ``shift``, and the window."""
        return dict(table=self.table, shift=self.k_offset - self.q_offset, window=self.window)

    def lens_by_row(self) -> Array | None:
        """valid_lens as (batch, 1) or (batch, Q), or None: what the kernels take."""
        return None if self.lens is None else self.lens.reshape(self.batch, -1)

    def row_lens(self) -> Array | None:
        """The keys that ``causal`` and ``valid_lens`` leave each row, as one length per row of
        the one tile, (batch * g * r * Q,) int64, or None when every row keeps all K keys:
        both allow a prefix of the keys (causal: j <= i + K - Q), and their AND is the shorter
        prefix. The softmax kernel takes the lengths as they are, with no -inf written first."""
        xp, B, Q, K = self.xp, self.batch, self.Q, self.K
        if not self.causal and self.lens is None:
            return None
        prefix = xp.clip(xp.arange(Q, dtype="int64") + (K - Q + 1), 0, K) if self.causal else xp.full(Q, K, "int64")
        if self.lens is None:  # the same rows for every example and head
            return xp.tile(prefix, B * self.g * self.r)
        lens = xp.minimum(prefix, self.lens.reshape(B, -1).astype("int64"))  # (B, Q) or (B, 1) -> (B, Q)
        shape = (B, self.g, self.r, Q)
        return xp.ascontiguousarray(xp.broadcast_to(lens.reshape(B, 1, 1, Q), shape)).reshape(-1)

    # -- weights on demand -------------------------------------------------------------------
    def weights(self, heads: int | Sequence[int] | None = None, rows: int | Sequence[int] | None = None) -> Array:
        """The attention weights of the last call, recomputed from its saved log-sum-exp for
        the query ``heads`` and ``rows`` asked for (all by default):
        (batch, len(heads), len(rows), K), exp(S - lse) tile by tile. The work is that of
        the forward pass over the query blocks that hold those rows (only those blocks run),
        and the memory one tile and the result."""
        xp = self.xp
        if self.P is not None:  # a one-tile call kept them
            heads = pick_indices("heads", heads, self.num_heads)
            rows = pick_indices("rows", rows, self.Q)
            P = self.P.reshape(self.batch, self.num_heads, self.Q, self.K)
            return P[:, heads][:, :, rows]
        if self.lse is None:
            raise RuntimeError("attention weights: the streamed attention has not run yet")
        if self.q is None:  # the kernels ran: scale the queries as the tiles want them, now
            q = self.unscaled_q
            self.q = (q * q.dtype.type(self.scale)).reshape(self.batch, self.g, self.r, self.Q, self.d)
        heads = pick_indices("heads", heads, self.num_heads)
        rows = pick_indices("rows", rows, self.Q)
        out = xp.zeros((self.batch, len(heads), len(rows), self.K), dtype=self.lse.dtype)
        lse = self.lse.reshape(self.batch, self.num_heads, self.Q)
        for i0, i1 in self.query_blocks():
            wanted = [n for n, i in enumerate(rows) if i0 <= i < i1]
            if not wanted:
                continue
            q_block = self.query_block(self.q, i0, i1)
            for j0, j1 in self.key_blocks():
                if not self.visits(i0, i1, j0, j1):
                    continue
                S = self.scores(q_block, self.k, i0, i1, j0, j1).reshape(self.batch, self.num_heads, i1 - i0, j1 - j0)
                picked = [rows[n] - i0 for n in wanted]
                S = S[:, heads][:, :, picked] - lse[:, heads][:, :, [rows[n] for n in wanted], None]
                out[:, :, wanted, j0:j1] = xp.exp(S)
        return out


def pick_indices(what: str, chosen: int | Sequence[int] | None, n: int) -> list[int]:
    """``heads`` / ``rows`` as a list of ints in 0..n-1 (None = all)."""
    if chosen is None:
        return list(range(n))
    if isinstance(chosen, (int, numpy.integer)):
        chosen = [chosen]
    chosen = [int(c) for c in chosen]
    bad = [c for c in chosen if not -n <= c < n]
    if bad:
        raise IndexError(f"attention_weights_for: {what} {bad} out of range for {n} {what}")
    return [c % n for c in chosen]


class FlashAttention(Function):
    """out = softmax(scale Q K^T + B, masked) V, streamed over tiles (see the module docstring).

    Inputs: q (batch, H, Q, d), k and v (batch, g, K, d), ``table`` the relative bias
    (H, Q + K - 1) or None; everything else is in ``plan`` (a ``StreamPlan``). ``masks``: the
    plan's ``masks``, the valid_lens and mask Tensors its arrays came from, unused here but
    given so that ``mt.onnx``'s tracer records them. Saves q, k, v, the output and the
    log-sum-exp per row: nothing of size Q x K.
    """

    @staticmethod
    def forward(
        ctx: Function, q: Array, k: Array, v: Array, table: Array | None, plan: StreamPlan, masks: Any = None
    ) -> Array:
        # ``table`` is an input so that autograd gives it a gradient; the tiles read it as
        # plan.table (the same array), where ``plan.scores`` adds it
        xp = ctx.xp
        B, g, r, Q = plan.batch, plan.g, plan.r, plan.Q
        ctx.plan = plan
        ctx.kernels = plan.device_kernels(v)
        if ctx.kernels is not None:  # a GPU: the whole stream is one kernel (attention.cu)
            out, lse = ctx.kernels.attention_forward(
                q, k, v, plan.lens_by_row(), plan.causal, plan.scale, **plan.kernel_bias(), dropout=plan.dropout_mask
            )
            plan.q, plan.unscaled_q, plan.k, plan.lse = None, q, k, lse.reshape(B, g, r, Q)
            ctx.save_for_backward(q, k, v, out, lse)
            return out
        if plan.keep_weights:
            return FlashAttention.one_tile(ctx, q, k, v, plan)
        dv = v.shape[-1]
        q5 = (q * q.dtype.type(plan.scale)).reshape(B, g, r, Q, q.shape[-1])
        out = xp.zeros((B, g, r, Q, dv), dtype=q.dtype)
        lse = xp.full((B, g, r, Q), xp.inf, dtype=q.dtype)
        for i0, i1 in plan.query_blocks():
            n = i1 - i0
            q_block = plan.query_block(q5, i0, i1)
            m = xp.full((B, g, r * n), -xp.inf, dtype=q.dtype)  # running max
            l = xp.zeros((B, g, r * n), dtype=q.dtype)  # running sum of exp(s - m)
            o = xp.zeros((B, g, r * n, dv), dtype=q.dtype)  # running sum of exp(s - m) v
            for j0, j1 in plan.key_blocks():
                if not plan.visits(i0, i1, j0, j1):
                    continue
                S = plan.scores(q_block, k, i0, i1, j0, j1)
                m_new = xp.maximum(m, S.max(axis=-1))
                # a row that has seen no allowed key yet (max -inf) shifts by 0: exp(-inf) = 0, not NaN
                shift = xp.where(m_new == -xp.inf, 0, m_new)
                S -= shift[..., None]
                P = xp.exp(S, out=S)  # exp(s - m'), in the scores' memory
                rescale = xp.exp(m - shift)  # exp(m - m'): 0 for the first block a row sees
                l = l * rescale + P.sum(axis=-1)  # (dropout acts after the softmax: l sums every weight)
                o *= rescale[..., None]
                o += ctx.backend.matmul(plan.drop(P, i0, i1, j0), v[:, :, j0:j1])
                m = m_new
            seen = l > 0
            o /= xp.where(seen, l, 1)[..., None]  # rows with no key keep o = 0
            out[:, :, :, i0:i1] = o.reshape(B, g, r, n, dv)
            # lse = m + log l; +inf marks a row with no key (exp(s - inf) = 0 in backward)
            row_lse = xp.where(seen, xp.where(m == -xp.inf, 0, m) + xp.log(xp.where(seen, l, 1)), xp.inf)
            lse[:, :, :, i0:i1] = row_lse.reshape(B, g, r, n)
        plan.q, plan.k, plan.lse = q5, k, lse
        ctx.save_for_backward(q5, k, v, out, lse)
        return out.reshape(q.shape[:-1] + (dv,))

    @staticmethod
    def backward(ctx: Function, grad: Array) -> Grads:
        xp = ctx.xp
        plan = ctx.plan
        if ctx.kernels is not None:
            q, k, v, out, lse = ctx.saved
            table_grad = plan.table is not None and ctx.needs_input_grad[3]
            grads = ctx.kernels.attention_backward(
                q, k, v, plan.lens_by_row(), plan.causal, plan.scale, out, lse, grad, **plan.kernel_bias(),
                table_grad=table_grad, dropout=plan.dropout_mask,
            )  # fmt: skip
            return grads if table_grad else (*grads, None)
        if plan.keep_weights:
            return FlashAttention.one_tile_backward(ctx, grad)
        q5, k, v, out, lse = ctx.saved
        B, g, r, Q, d = q5.shape
        dv = v.shape[-1]
        mm = ctx.backend.matmul  # every product through the backend's (a GPU's: cuBLAS, capturable)
        table = plan.table
        want_table = table is not None and ctx.needs_input_grad[3]
        dO = grad.reshape(B, g, r, Q, dv)
        D = (dO * out).sum(axis=-1)  # (B, g, r, Q): sum_j P_ij dP_ij for each row
        rows = [
            (
                i0,
                i1,
                plan.query_block(q5, i0, i1),
                plan.query_block(dO, i0, i1),
                lse[:, :, :, i0:i1].reshape(B, g, r * (i1 - i0), 1),
                D[:, :, :, i0:i1].reshape(B, g, r * (i1 - i0), 1),
            )
            for i0, i1 in plan.query_blocks()
        ]
        dq = [xp.zeros_like(block[2]) for block in rows]
        dk, dvalues = xp.zeros_like(k), xp.zeros_like(v)
        dtable: Array = xp.zeros(table.shape, dtype=numpy.float64).reshape(-1) if want_table else None
        for j0, j1 in plan.key_blocks():
            k_block, v_block = k[:, :, j0:j1], v[:, :, j0:j1]
            for n, (i0, i1, q_block, dO_block, lse_block, D_block) in enumerate(rows):
                if not plan.visits(i0, i1, j0, j1):
                    continue
                S = plan.scores(q_block, k, i0, i1, j0, j1)
                S -= lse_block
                P = xp.exp(S, out=S)  # the tile's weights, as the forward pass had them
                Z = plan.drop(P, i0, i1, j0)  # what multiplied V
                dvalues[:, :, j0:j1] += mm(Z.swapaxes(-1, -2), dO_block)
                dS = plan.drop(mm(dO_block, v_block.swapaxes(-1, -2)), i0, i1, j0)  # dP: dZ through the mask
                dS -= D_block
                dS *= P
                dq[n] += mm(dS, k_block)
                dk[:, :, j0:j1] += mm(dS.swapaxes(-1, -2), q_block)  # q_block already holds scale q
                if want_table:
                    per_head = dS.reshape(B, plan.num_heads, i1 - i0, j1 - j0).sum(axis=0)
                    columns = plan._diagonals[: i1 - i0, : j1 - j0] + (j0 - i0)
                    cells = columns[None] + (xp.arange(plan.num_heads) * table.shape[1])[:, None, None]
                    dtable += xp.bincount(cells.reshape(-1), weights=per_head.reshape(-1), minlength=dtable.size)
        dq5 = xp.empty_like(q5)
        for (i0, i1, *_), block in zip(rows, dq):
            dq5[:, :, :, i0:i1] = block.reshape(B, g, r, i1 - i0, d)
        dq5 *= q5.dtype.type(plan.scale)
        grad_table = dtable.reshape(table.shape).astype(table.dtype) if want_table else None
        return dq5.reshape(B, g * r, Q, d), dk, dvalues, grad_table

    # -- one tile ------------------------------------------------------------------------------
    # A sequence short enough to be one tile has nothing to stream, and recomputing its weights
    # in backward (one more product and exp per score) costs more than keeping them: for it the
    # plan's ``keep_weights`` does the plain path's arithmetic in one node. Forward: the scores,
    # the masked softmax kernel (causal and valid_lens as row lengths, ``row_lens``), P V.
    # Backward, with P kept:
    #     dV = P^T dO     dP = dO V^T     dS = P * (dP - sum_j P_ij dP_ij)  (softmax_backward)
    #     dQ = scale dS K                 dK = dS^T (scale Q)
    # (bench/README.md, bench/gpt_char.py: what it saved on the gpt-char step).
    @staticmethod
    def one_tile(ctx: Function, q: Array, k: Array, v: Array, plan: StreamPlan) -> Array:
        """The forward pass of a call that is one tile, keeping its weights (``keep_weights``)."""
        B, g, r, Q, K = plan.batch, plan.g, plan.r, plan.Q, plan.K
        q_block = plan.query_block((q * q.dtype.type(plan.scale)).reshape(B, g, r, Q, q.shape[-1]), 0, Q)
        # K^T copied first: the keys are a head-split view, and BLAS reads their transpose slower
        # than the copy costs (as ``ops.matmul._stacked`` measured for the plain path)
        k_t = ctx.xp.ascontiguousarray(k.swapaxes(-1, -2))
        S = plan.scores(q_block, k, 0, Q, 0, K, prefixes=False, k_t=k_t)  # causal and valid_lens: row_lens
        P = ctx.backend.kernels.softmax_forward(as_rows(S), plan.row_lens()).reshape(S.shape)
        plan.P = P  # the weights before dropout, as the plain path keeps them
        Z = plan.drop(P, 0, Q, 0)
        ctx.save_for_backward(q_block, k, v, P, Z)
        return ctx.backend.matmul(Z, v).reshape(q.shape[:-1] + (v.shape[-1],))

    @staticmethod
    def one_tile_backward(ctx: Function, grad: Array) -> Grads:
        xp, plan = ctx.xp, ctx.plan
        q_block, k, v, P, Z = ctx.saved
        B, g, r, Q, K = plan.batch, plan.g, plan.r, plan.Q, plan.K
        dO = grad.reshape(B, g, r * Q, v.shape[-1])
        mm = ctx.backend.matmul  # every product through the backend's (a GPU's: cuBLAS, capturable)
        dvalues = mm(Z.swapaxes(-1, -2), dO)
        dP = mm(dO, xp.ascontiguousarray(v.swapaxes(-1, -2)))  # (V^T copied: as K^T in forward)
        dP = plan.drop(dP, 0, Q, 0)  # the gradient of the dropped weights, through the mask
        dS = ctx.backend.kernels.softmax_backward(as_rows(P), as_rows(dP)).reshape(P.shape)
        dk = mm(dS.swapaxes(-1, -2), q_block)  # q_block holds scale q
        dq = mm(dS, k)
        dq *= dq.dtype.type(plan.scale)
        grad_table = None
        if plan.table is not None and ctx.needs_input_grad[3]:
            table = plan.table
            per_head = dS.reshape(B, plan.num_heads, Q, K).sum(axis=0)
            columns = plan._diagonals[:Q, :K]
            cells = columns[None] + (xp.arange(plan.num_heads) * table.shape[1])[:, None, None]
            dtable = xp.bincount(cells.reshape(-1), weights=per_head.reshape(-1), minlength=table.size)
            grad_table = dtable.reshape(table.shape).astype(table.dtype)
        return dq.reshape(B, g * r, Q, k.shape[-1]), dk, dvalues, grad_table


def flash_attention(
    queries: Tensor,
    keys: Tensor,
    values: Tensor,
    valid_lens: Tensor | None = None,
    mask: Tensor | None = None,
    causal: bool = False,
    scale: float | None = None,
    relative_bias: Tensor | None = None,
    window: int | None = None,
    q_offset: int = 0,
    k_offset: int = 0,
    block_q: int | None = None,
    block_k: int | None = None,
    return_lse: bool = False,
    dropout_p: float = 0.0,
) -> Any:  # the output Tensor; with return_lse=True, (output, lse)
    """softmax(scale Q K^T + B) V with the masked softmax's rules, streamed over tiles (no
    (Q, K) array is ever built; see this module's docstring).

    queries (batch, H, Q, d); keys, values (batch, g, K, d) with g dividing H (query head h
    reads key/value head h // (H / g)); ``scale`` defaults to 1 / sqrt(d). Masks as in
    ``mt.nn.Attention``: ``valid_lens`` (batch,) or (batch, Q); ``mask`` bool broadcastable to
    (batch, H, Q, K); ``causal``: j <= i + (K - Q). ``relative_bias``: a Tensor
    (H, Q + K - 1) whose column c is the bias at distance (key position - query position)
    = k_offset - (q_offset + Q - 1) + c, as a "scores" encoding's ``relative_bias`` returns
    it (it gets a gradient if it requires one); ``window``: that bias is -inf beyond this
    distance (tiles entirely beyond it are skipped). ``dropout_p``: dropout on the weights, as
    ``mt.dropout(weights, p)`` would drop them before they multiply V, with the same mask for the
    same seed (PyTorch's ``scaled_dot_product_attention`` takes it so too: pass 0 outside
    training). Returns the output (batch, H, Q, d) and,
    with ``return_lse=True``, also the log-sum-exp of each row's scores (batch, H, Q),
    detached (+inf for a row with no key).

    Inside ``mt.autocast`` it runs in float32, as the softmax does: its running maxima and sums
    would lose the weights' small terms in bfloat16.
    """
    queries, keys, values = (amp.in_float32(x) for x in (queries, keys, values))
    plan = stream_plan(
        queries,
        keys,
        values,
        valid_lens,
        mask,
        causal,
        scale,
        relative_bias,
        window,
        q_offset=q_offset,
        k_offset=k_offset,
        block_q=block_q,
        block_k=block_k,
        dropout_p=dropout_p,
    )
    out = FlashAttention.apply(queries, keys, values, relative_bias, plan=plan, masks=plan.masks)
    if return_lse:
        lse = Tensor._make(plan.lse.reshape(queries.shape[:-1]), queries._backend, None)
        return out, lse
    return out


def stream_plan(
    queries: Tensor,
    keys: Tensor,
    values: Tensor,
    valid_lens: Tensor | None = None,
    mask: Tensor | None = None,
    causal: bool = False,
    scale: float | None = None,
    relative_bias: Tensor | None = None,
    window: int | None = None,
    q_offset: int = 0,
    k_offset: int = 0,
    block_q: int | None = None,
    block_k: int | None = None,
    keep_weights: bool = False,
    dropout_p: float = 0.0,
) -> StreamPlan:
    """Check the arguments of ``flash_attention`` and build its ``StreamPlan`` (``keep_weights``:
    see ``StreamPlan``)."""
    check_probability("flash_attention", "dropout_p", dropout_p)
    for name, x in (("queries", queries), ("keys", keys), ("values", values)):
        if not isinstance(x, Tensor) or x.ndim != 4:
            shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
            raise ShapeError(f"flash_attention: {name} must be a 4-D Tensor (batch, heads, steps, d), got {shape}")
    B, H, Q, d = queries.shape
    Bk, g, K, dk = keys.shape
    if Bk != B or dk != d or g == 0 or H % g or values.shape[:3] != keys.shape[:3]:
        raise ShapeError(
            f"flash_attention: queries {tuple(queries.shape)}, keys {tuple(keys.shape)} and values "
            f"{tuple(values.shape)} do not fit: expected (batch, H, Q, d), (batch, g, K, d) and (batch, g, K, d_v) "
            "with g dividing H"
        )
    if window is not None and relative_bias is None:
        raise ValueError(
            f"flash_attention: window={window} comes with the relative_bias table that is -inf beyond it (the "
            "window only lets the stream skip key blocks; the table masks within a block)"
        )
    if relative_bias is not None:
        want = (H, Q + K - 1)
        if not isinstance(relative_bias, Tensor) or tuple(relative_bias.shape) != want:
            got = tuple(relative_bias.shape) if isinstance(relative_bias, Tensor) else type(relative_bias).__name__
            raise ShapeError(
                f"flash_attention: relative_bias of shape {got}; expected (num_heads, Q + K - 1) = {want}, one "
                "column per distance"
            )
    masks = as_mask_tensors(queries, valid_lens, mask)
    data = [None if x is None else x.data for x in masks]
    plan = StreamPlan(
        queries._backend,
        queries.shape,
        keys.shape,
        1.0 / numpy.sqrt(d) if scale is None else float(scale),
        bool(causal),
        data[0],
        data[1],
        None if relative_bias is None else relative_bias.data,
        window,
        q_offset,
        k_offset,
        block_q,
        block_k,
        # (the softmax kernels of the one tile take float32 and float64; float16 streams its tiles)
        keep_weights and queries.dtype in (numpy.float32, numpy.float64),
        float(dropout_p),
    )
    plan.masks = masks  # the Tensors (valid_lens, mask), for FlashAttention.apply
    return plan
