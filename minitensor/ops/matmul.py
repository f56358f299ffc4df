"""Matrix product with NumPy's rules: batched, broadcasting over leading axes, 1-D operands
treated as a row (left) or column (right) vector and squeezed away again."""

from ..autograd import Function, sum_to_shape
from ..errors import ShapeError
from .promote import promote


class MatMul(Function):
    """Z = A @ B;  dL/dA = dL/dZ @ B^T,  dL/dB = A^T @ dL/dZ (summed over broadcast batches)."""

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        try:
            return a @ b
        except ValueError:
            pass  # explain NumPy's terse message in the user's terms
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
    def backward(ctx, grad):
        a, b = ctx.saved
        need_a, need_b = ctx.needs_input_grad
        if a.ndim == 2 and b.ndim == 2:  # the common case, without the general machinery
            return (grad @ b.T if need_a else None), (a.T @ grad if need_b else None)
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
        ga = gb = None
        if need_a:
            ga = sum_to_shape(g @ xp.swapaxes(b2, -1, -2), a2.shape).reshape(a.shape)
        if need_b:
            if b2.ndim == 2 and a2.ndim > 2:
                # X (..., n) @ W (n, m), as in a Linear layer: fold the batch axes into one
                # matrix product instead of a batch of products summed afterwards.
                n, m = b2.shape
                gb = a2.reshape(-1, n).T @ g.reshape(-1, m)
            else:
                gb = sum_to_shape(xp.swapaxes(a2, -1, -2) @ g, b2.shape)
            gb = gb.reshape(b.shape)
        return ga, gb


def matmul(a, b):
    return MatMul.apply(*promote(a, b))
