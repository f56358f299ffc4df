"""Matrix product with NumPy's rules: batched, broadcasting over leading axes, 1-D operands
treated as a row (left) or column (right) vector and squeezed away again.

D2L 2.3's products by rank, ``dot`` (vector . vector), ``mv`` (matrix @ vector) and ``mm``
(matrix @ matrix), and ``bmm`` (a batch of matrices) are ``matmul`` with the ranks checked
first: a tensor of the wrong rank is an error naming the op rather than a broadcast product."""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import amp, dtypes
from ..autograd import Function, Grads, sum_to_shape
from ..backends import Backend
from ..dtypes import float32, is_bfloat16, is_floating
from ..errors import ShapeError
from ..tensor import Array, Tensor
from .promote import promote
from .softmax import as_rows


def _stacked(backend: Backend, a: Array, b: Array, rounded: bool = False) -> Array:
    """``a @ b`` for stacks of matrices, copying a strided stack first where that pays.

    NumPy's batched matmul hands a matrix to BLAS only when its rows are contiguous in
    memory; a transposed view (K^T in attention) goes through a plain loop, several times
    slower than a copy (bench/README.md). A head-split view (heads as a strided axis) has
    contiguous rows, only further apart, and BLAS reads it in place faster than it is
    copied. A copy pays when each element of the operand is used many times, that is when
    the other operand has many rows (columns): not for one decoding query against a long
    cache, where the copy would move as many bytes as the product reads. 2-D products pass
    transposes to BLAS as a flag and need none of this (the callers test ``ndim`` first).
    ``rounded``: the operands hold bfloat16 values (``Backend.rounded_matmul``).
    """
    xp = backend.xp
    if a.ndim > 2 and not _blas_reads_in_place(xp, a) and (b.shape[-1] if b.ndim > 1 else 1) >= _REUSE:
        a = xp.ascontiguousarray(a)
    if b.ndim > 2 and not _blas_reads_in_place(xp, b) and (a.shape[-2] if a.ndim > 1 else 1) >= _REUSE:
        b = xp.ascontiguousarray(b)
    return backend.rounded_matmul(a, b) if rounded else backend.matmul(a, b)


def _blas_reads_in_place(xp: Any, a: Array) -> bool:
    """Whether NumPy hands each matrix of the stack ``a`` to BLAS as it is: its rows are
    contiguous (unit stride along the last axis) and do not overlap (BLAS's leading
    dimension: a row stride of at least a row, so neither broadcast nor reversed). Measured
    for NumPy only; other array libraries (CuPy's batched GEMM wants evenly spaced matrices)
    get the copy."""
    if xp is not np:
        return False
    rows, cols = a.shape[-2:]
    row_stride, col_stride = a.strides[-2:]
    return (cols <= 1 or col_stride == a.itemsize) and (rows <= 1 or row_stride >= cols * a.itemsize)


_REUSE = 8  # uses of each element below which a strided stack is not copied


def _copied_twice(xp: Any, g: Array, b_rows: int, a_cols: int) -> bool:
    """Would ``_stacked`` copy the stack ``g`` in both products of MatMul's backward, g @ B^T
    (B^T has ``b_rows`` columns) and A^T @ g (A^T has ``a_cols`` rows)? Then one copy first
    serves both: attention's dL/d(weights @ V), whose gradient arrives as a head-split view."""
    return g.ndim > 2 and not _blas_reads_in_place(xp, g) and min(b_rows, a_cols) >= _REUSE


# A product inside ``mt.autocast`` (``ctx.autocast``: the block's dtype, bfloat16) is computed as a
# bfloat16 tensor core computes it: the operands rounded to bfloat16, each product of two of them
# (exact in float32) summed in float32, the result rounded once. Here the rounded operands stay
# float32 arrays (``Backend.round_to_bfloat16``: one pass each), so every product is a float32
# one (``Backend.rounded_matmul``: a GPU takes its bfloat16 tensor cores for it), and only the
# result is a bfloat16 array. Outside a block the helpers pass arrays on.


def _rounded(ctx: Function, *arrays: Array) -> list[Array]:
    """A product's operands, rounded to bfloat16 in float32 arrays inside a block. Forward rounds
    them and backward again, from what forward saved: the operands as they came (float32 arrays
    the graph holds anyway), never a rounded copy kept from forward to backward."""
    if ctx.autocast is None:
        return list(arrays)
    return [x if x is None else ctx.backend.round_to_bfloat16(x) for x in arrays]


def _result(ctx: Function, y: Array) -> Array:
    """A product's float32 result in the block's dtype, rounded once."""
    return y if ctx.autocast is None else ctx.backend.astype(y, ctx.autocast)


def _widened(ctx: Function, grad: Array) -> Array:
    """The gradient a product's backward gets (in the result's dtype) as float32, exactly."""
    return grad if ctx.autocast is None else ctx.backend.astype(grad, float32, copy=False)


def _unrounded(ctx: Function, grads: Grads, dtypes: tuple[Any, ...]) -> Grads:
    """The gradients of a product's operands, float32 sums inside a block, rounded as a bfloat16
    product's are, in the operands' own dtypes (the rounding's backward passes them on)."""
    if ctx.autocast is None:
        return grads
    backend = ctx.backend
    return tuple(
        None if g is None else backend.round_to_bfloat16(g) if d == float32 else backend.astype(g, d)  # type: ignore[union-attr]
        for g, d in zip(grads, dtypes)
    )


class MatMul(Function):
    """Z = A @ B;  dL/dA = dL/dZ @ B^T,  dL/dB = A^T @ dL/dZ (summed over broadcast batches).

    ``autocast``: the dtype (bfloat16) that ``mt.autocast`` has the operands rounded to first."""

    @staticmethod
    def forward(ctx: Function, a: Array, b: Array, autocast: Any = None) -> Array:
        ctx.save_for_backward(a, b)
        ctx.autocast = autocast
        if autocast is not None:  # (outside a block the helpers pass arrays on: not called, calls cost)
            ctx.dtypes = (a.dtype, b.dtype)
            a, b = _rounded(ctx, a, b)
        try:
            if a.ndim <= 2 and b.ndim <= 2:
                y = ctx.backend.matmul(a, b) if autocast is None else ctx.backend.rounded_matmul(a, b)
            else:
                y = _stacked(ctx.backend, a, b, autocast is not None)
        except ValueError:
            pass  # explain NumPy's terse message in the user's terms
        else:
            return y if autocast is None else _result(ctx, y)
        if a.ndim == 0 or b.ndim == 0:
            raise ShapeError(f"matmul: operands must have at least 1 dimension, got shapes {a.shape} and {b.shape}")
        k = b.shape[-2 if b.ndim > 1 else 0]
        if a.shape[-1] != k:
            raise ShapeError(
                f"matmul: inner dimensions differ, {tuple(a.shape)} @ {tuple(b.shape)}: "
                f"{a.shape[-1]} != {k} (A's last axis must equal B's second-to-last; "
                "transpose one operand?)"
            )
        raise ShapeError(
            f"matmul: batch dimensions {tuple(a.shape[:-2])} of {tuple(a.shape)} and {tuple(b.shape[:-2])} of "
            f"{tuple(b.shape)} do not broadcast (aligned from the right, each pair must be equal or 1)"
        )

    @staticmethod
    def backward(ctx: Function, grad: Array) -> Grads:
        a, b = ctx.saved
        if ctx.autocast is not None:
            return _unrounded(ctx, MatMul._backward(ctx, _widened(ctx, grad), *_rounded(ctx, a, b)), ctx.dtypes)
        if a.ndim == 2 and b.ndim == 2:  # the common case first, without the general machinery
            need_a, need_b = ctx.needs_input_grad
            mm = ctx.backend.matmul
            return (mm(grad, b.T) if need_a else None), (mm(a.T, grad) if need_b else None)
        return MatMul._backward(ctx, grad, a, b)

    @staticmethod
    def _backward(ctx: Function, grad: Array, a: Array, b: Array) -> Grads:
        need_a, need_b = ctx.needs_input_grad[:2]
        rounded = ctx.autocast is not None  # (the gradient too holds bfloat16 values: _widened)
        mm = ctx.backend.rounded_matmul if rounded else ctx.backend.matmul
        if a.ndim == 2 and b.ndim == 2:  # (here only in autocast: ``backward`` takes float32's itself)
            return (mm(grad, b.T) if need_a else None), (mm(a.T, grad) if need_b else None)
        xp = ctx.xp
        if a.ndim == 1 and b.ndim == 1:  # dot product: grad is a scalar
            return (grad * b if need_a else None), (grad * a if need_b else None)
        # Promote vectors to matrices, as forward did implicitly.
        a2 = a[None, :] if a.ndim == 1 else a
        b2 = b[:, None] if b.ndim == 1 else b
        g = grad
        if a.ndim == 1:
            g = xp.expand_dims(g, -2)
        if b.ndim == 1:
            g = xp.expand_dims(g, -1)
        if need_a and need_b and _copied_twice(xp, g, b2.shape[-2], a2.shape[-1]):
            g = xp.ascontiguousarray(g)  # one copy for both products (a GPU launch saved too)
        ga = gb = None
        if need_a:
            ga = sum_to_shape(_stacked(ctx.backend, g, xp.swapaxes(b2, -1, -2), rounded), a2.shape).reshape(a.shape)
        if need_b:
            if b2.ndim == 2 and a2.ndim > 2:
                # X (..., n) @ W (n, m), as in a Linear layer: fold the batch axes into one
                # matrix product instead of a batch of products summed afterwards.
                n, m = b2.shape
                gb = mm(a2.reshape(-1, n).T, g.reshape(-1, m))
            else:
                gb = sum_to_shape(_stacked(ctx.backend, xp.swapaxes(a2, -1, -2), g, rounded), b2.shape)
            gb = gb.reshape(b.shape)
        return ga, gb


def matmul(a: Tensor, b: Tensor) -> Tensor:
    """The matrix product Z = A @ B with NumPy's rules (``a @ b`` on tensors): (..., n, k) @
    (..., k, m) -> (..., n, m), the leading (batch) axes broadcast; a 1-D operand is a row
    (left) or column (right) vector whose axis is dropped again.

    dL/dA = dL/dZ @ B^T, dL/dB = A^T @ dL/dZ, summed over broadcast batch axes. Attention's
    scores Q K^T are one such batched product (D2L 10.3 / 11.3). A ``ShapeError`` names the
    axes that do not fit. Inside ``mt.autocast``, in bfloat16 (``MatMul``'s ``autocast``).
    """
    autocast = amp.product_dtype(a, b)
    if autocast is not None:
        return MatMul.apply(*promote(a, b, product=True), autocast=autocast)
    if isinstance(a, Tensor) and isinstance(b, Tensor) and a.data.dtype == b.data.dtype:  # (nothing to promote)
        return MatMul.apply(a, b)
    return MatMul.apply(*promote(a, b))


def bmm(a: Tensor, b: Tensor) -> Tensor:
    """Batched matrix product of two 3-D tensors: a (n, r, k) @ b (n, k, c) -> (n, r, c), the
    i-th matrix of one times the i-th of the other (PyTorch's ``bmm``, D2L 11.2 / 11.3's
    attention pooling ``torch.bmm(weights, values)``). ``matmul`` restricted to three axes and
    no broadcasting, so a batch that does not match is an error instead of a broadcast."""
    shapes = tuple(getattr(t, "shape", None) for t in (a, b))
    if not all(isinstance(s, tuple) and len(s) == 3 for s in shapes) or (a.shape[0], a.shape[2]) != b.shape[:2]:
        raise ShapeError(
            f"bmm: needs two 3-D tensors (batch, n, m) and (batch, m, p) with the same batch, got shapes "
            f"{' and '.join(str(s) for s in shapes)}; matmul broadcasts and takes other ranks"
        )
    return matmul(a, b)


def _ranks(op: str, a: Tensor, b: Tensor, want: tuple[int, int], what: str) -> None:
    shapes = tuple(getattr(t, "shape", None) for t in (a, b))
    if not all(isinstance(s, tuple) for s in shapes) or (len(shapes[0]), len(shapes[1])) != want:  # type: ignore[arg-type]
        raise ShapeError(f"{op}: needs {what}, got shapes {shapes[0]} and {shapes[1]}; matmul takes other ranks")


def dot(a: Tensor, b: Tensor) -> Tensor:
    """The dot product of two vectors of one length, sum_i a_i b_i, a 0-d tensor (D2L 2.3.6);
    dL/da = dL/dz b, dL/db = dL/dz a. Both must be 1-D (``ShapeError`` otherwise)."""
    _ranks("dot", a, b, (1, 1), "two 1-D tensors (vectors)")
    if a.shape != b.shape:
        raise ShapeError(f"dot: the vectors differ in length, {a.shape[0]} and {b.shape[0]}")
    return matmul(a, b)


def mv(a: Tensor, b: Tensor) -> Tensor:
    """The matrix-vector product A x (D2L 2.3.7): A (n, m) and x (m,) give (n,), each element
    the dot product of a row of A with x; the gradients are matmul's."""
    _ranks("mv", a, b, (2, 1), "a 2-D tensor (matrix) and a 1-D tensor (vector)")
    if a.shape[1] != b.shape[0]:
        raise ShapeError(
            f"mv: a matrix of shape {a.shape} times a vector of length {b.shape[0]}: {a.shape[1]} != {b.shape[0]}"
        )
    return matmul(a, b)


def mm(a: Tensor, b: Tensor) -> Tensor:
    """The matrix-matrix product A B (D2L 2.3.8): A (n, k) and B (k, m) give (n, m); dL/dA =
    dL/dZ B^T, dL/dB = A^T dL/dZ. Both must be 2-D: ``matmul`` (``@``) batches and broadcasts."""
    _ranks("mm", a, b, (2, 2), "two 2-D tensors (matrices)")
    if a.shape[1] != b.shape[0]:
        raise ShapeError(f"mm: shapes {a.shape} and {b.shape} do not fit: {a.shape[1]} != {b.shape[0]}")
    return matmul(a, b)


class Linear(Function):
    """Y = X W^T + b for X (..., in), W (out, in), b (out,): a Linear layer in one node.

    With X and dL/dY = G seen as matrices (one row per position, all leading axes
    flattened):

        dL/dX = G W,   dL/dW = G^T X,   dL/db = sum of G's rows

    each a single BLAS call. Written as ``x @ weight.T + bias`` the same layer is three
    nodes (a transpose, a batched product, a broadcast add), the bias's gradient a
    reduction over several axes, and W's gradient arrives transposed, a layout that slows
    every elementwise pass over it afterwards (clipping, the optimiser).

    ``autocast``: the dtype (bfloat16) that ``mt.autocast`` has X, W and b rounded to first; a
    bfloat16 layer outside a block passes it too, so that its bias is added before the one
    rounding, as PyTorch's ``addmm`` does.
    """

    @staticmethod
    def forward(ctx: Function, x: Array, weight: Array, bias: Array | None, autocast: Any = None) -> Array:
        x2 = x.reshape(-1, x.shape[-1]) if x.shape[-1] else as_rows(x)  # (-1 cannot say how many rows of 0)
        ctx.save_for_backward(x2, weight)
        ctx.autocast = autocast
        if autocast is None:  # (as in MatMul: no helper called outside a block)
            y = ctx.backend.matmul(x2, weight.T)  # BLAS reads W^T in place: no copy
        else:
            ctx.dtypes = (x.dtype, weight.dtype, None if bias is None else bias.dtype)
            x2, weight, bias = _rounded(ctx, x2, weight, bias)
            y = ctx.backend.rounded_matmul(x2, weight.T)
        if bias is not None:
            y += bias  # y is fresh: add in place instead of allocating another (N, out)
        if autocast is not None:
            y = _result(ctx, y)  # (the bias added, then rounded once)
        return y.reshape(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx: Function, grad: Array) -> Grads:
        x2, weight = ctx.saved
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        if ctx.autocast is None:
            mm, g2 = ctx.backend.matmul, grad.reshape(-1, grad.shape[-1]) if grad.shape[-1] else as_rows(grad)
        else:
            mm, g2 = ctx.backend.rounded_matmul, as_rows(_widened(ctx, grad))
            x2, weight = _rounded(ctx, x2, weight)
        gx = mm(g2, weight).reshape(*grad.shape[:-1], weight.shape[1]) if need_x else None
        gw = mm(g2.T, x2) if need_w else None
        gb = sum_to_shape(g2, weight.shape[:1]) if need_b else None  # (bfloat16's summed in float32)
        return (gx, gw, gb) if ctx.autocast is None else _unrounded(ctx, (gx, gw, gb), ctx.dtypes)


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """y = x W^T + b, with W of shape (out_features, in_features) as in PyTorch.

    x may have any number of leading axes (batch, time, ...): (..., in) -> (..., out).
    """
    if weight.ndim != 2 or x.ndim == 0 or x.shape[-1] != weight.shape[1]:
        raise ShapeError(
            f"linear: input of shape {tuple(x.shape)} and weight of shape {tuple(weight.shape)} do not fit: "
            f"the weight must be (out_features, in_features) with in_features = the input's last axis"
        )
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise ShapeError(f"linear: bias of shape {tuple(bias.shape)}, expected ({weight.shape[0]},)")
    if x.data.dtype.kind != "f" and not is_floating(x.data.dtype):  # integers meeting float weights, as in a + b
        x, weight = promote(x, weight)
    autocast = amp.product_dtype(x, weight, bias)
    if autocast is None and is_bfloat16(x.data.dtype) and is_bfloat16(weight.data.dtype):
        if bias is None or is_bfloat16(bias.dtype):  # a bfloat16 layer (model.bfloat16()):
            autocast = dtypes.bfloat16  # the bias too added in float32, rounded once
    if autocast is None:
        return Linear.apply(x, weight, bias)
    return Linear.apply(x, weight, bias, autocast=autocast)
