"""Convolution, ``conv1d`` and ``conv2d`` (PyTorch's ``F.conv1d`` / ``F.conv2d``), with their
derivatives. The one-dimensional case first:

With X (N, C, L) "channels first", W (O, C, k) and X_pad = X with ``padding`` zeros on both ends:

    Y[b, o, i] = bias[o] + sum_{c, j} W[o, c, j] * X_pad[b, c, i * stride + j * dilation]

Output length L_out = floor((L + 2 padding - dilation (k - 1) - 1) / stride) + 1. Like
PyTorch, this is cross-correlation: the filter is not flipped. The Function here, ``Conv1d``,
computes the sum; the layer of the same name that owns W and the bias is ``nn.Conv1d``.

**How it is computed (im2col).** Tap j of the filter multiplies the inputs at positions
j * dilation, j * dilation + stride, ..., a strided slice of X_pad. Stacking the k slices
gives every window as one row, cols (N * L_out, C * k), and the whole convolution becomes one
matrix product with the filters flattened to (O, C * k): the work lands in BLAS. Backward
reverses it ("col2im"): the gradient of each tap's slice is added back where the slice came
from. Slices of different taps overlap when the window is wider than the stride, so the k
contributions are *added* (+=), one strided slice per tap; within one tap no position
repeats, so no scatter-add is needed.

``conv2d`` is the same with two spatial axes: X (N, C, H, W), W (O, C, kh, kw), a tap for each
of the kh * kw filter positions (i, j), each a slice strided in both axes, and
cols (N * H_out * W_out, C * kh * kw). D2L 11.8's vision Transformer cuts an image into
patches with one whose kernel equals its stride, so that the windows do not overlap.

**With many channels, tap by tap.** Where windows overlap, cols holds each input k (or
kh * kw) times, and building it costs more than the product. ``Conv2d`` then sums one product
per tap instead (its docstring), and ``conv1d`` with that many channels (``TAP_BY_TAP_CHANNELS``)
goes through it as an image of height 1.
"""

from __future__ import annotations

from .. import amp
from ..autograd import Function, Grads
from ..dtypes import is_low_precision
from ..errors import ShapeError
from ..tensor import Array, Tensor

#: the fewest input channels with which ``Conv2d`` sums tap by tap where windows overlap (and
#: ``conv1d`` goes through it): with fewer, the products are too thin for BLAS (bench/conv.py)
TAP_BY_TAP_CHANNELS = 8


def conv1d_output_length(length: int, kernel_size: int, stride: int = 1, padding: int = 0, dilation: int = 1) -> int:
    """L_out = floor((L + 2 padding - dilation (kernel_size - 1) - 1) / stride) + 1."""
    return (length + 2 * padding - dilation * (kernel_size - 1) - 1) // stride + 1


class Conv1d(Function):
    """Y = conv1d(X, W) without bias: X (N, C, L), W (O, C, k) -> Y (N, O, L_out).

    Forward: cols = im2col(X_pad) (N L_out, C k);  Y = cols W^T, back to (N, O, L_out).
    Backward, with G = dL/dY as (N L_out, O):
        dL/dW    = G^T cols                      (O, C k), then (O, C, k)
        dL/dcols = G W                           (N L_out, C k)
        dL/dX    = col2im(dL/dcols), the padding cut off again.
    """

    @staticmethod
    def forward(ctx: Function, x: Array, weight: Array, stride: int, padding: int, dilation: int) -> Array:
        xp = ctx.xp
        N, C, L = x.shape
        O, _, k = weight.shape
        L_out = conv1d_output_length(L, k, stride, padding, dilation)
        if padding:
            x = xp.pad(x, ((0, 0), (0, 0), (padding, padding)))
        span = stride * (L_out - 1) + 1  # from a tap's first input to its last
        taps = [x[:, :, j * dilation : j * dilation + span : stride] for j in range(k)]  # k x (N, C, L_out)
        cols = xp.stack(taps, axis=-1).transpose(0, 2, 1, 3).reshape(N * L_out, C * k)
        ctx.save_for_backward(cols, weight)
        ctx.geometry = (N, C, L, L_out, stride, padding, dilation)
        out = ctx.backend.matmul(cols, weight.reshape(O, C * k).T)  # (N L_out, O)
        return out.reshape(N, L_out, O).transpose(0, 2, 1)

    @staticmethod
    def backward(ctx: Function, grad: Array) -> Grads:
        xp = ctx.xp
        cols, weight = ctx.saved
        N, C, L, L_out, stride, padding, dilation = ctx.geometry
        O, _, k = weight.shape
        need_x, need_w = ctx.needs_input_grad[:2]
        G = grad.transpose(0, 2, 1).reshape(N * L_out, O)
        d_weight = ctx.backend.matmul(G.T, cols).reshape(weight.shape) if need_w else None
        d_x = None
        if need_x:
            d_cols = ctx.backend.matmul(G, weight.reshape(O, C * k)).reshape(N, L_out, C, k)
            d_cols = d_cols.transpose(0, 2, 1, 3)  # (N, C, L_out, k)
            d_x = xp.zeros((N, C, L + 2 * padding), dtype=grad.dtype)
            span = stride * (L_out - 1) + 1
            for j in range(k):  # col2im: each tap's gradient goes back to the slice it read
                d_x[:, :, j * dilation : j * dilation + span : stride] += d_cols[..., j]
            d_x = d_x[:, :, padding : padding + L]
        return d_x, d_weight, None, None, None


def conv1d(
    x: Tensor, weight: Tensor, bias: Tensor | None = None, stride: int = 1, padding: int = 0, dilation: int = 1
) -> Tensor:
    """The functional form (PyTorch's ``F.conv1d``, without ``groups``): x (N, C, L),
    weight (O, C, k), bias (O,) or None -> (N, O, L_out). With ``TAP_BY_TAP_CHANNELS`` channels
    or more, ``Conv2d`` computes it on x as an image of height 1 (the module docstring)."""
    if x.ndim != 3:
        raise ShapeError(f"conv1d: input of shape {tuple(x.shape)}; expected (batch, channels, length)")
    if weight.ndim != 3 or weight.shape[1] != x.shape[1] or weight.shape[2] < 1:
        raise ShapeError(
            f"conv1d: weight of shape {tuple(weight.shape)} for an input with {x.shape[1]} channels; "
            f"expected (out_channels, {x.shape[1]}, kernel_size), kernel_size at least 1"
        )
    if stride < 1 or dilation < 1 or padding < 0:
        raise ValueError(f"conv1d: need stride >= 1, dilation >= 1, padding >= 0; got {stride}, {dilation}, {padding}")
    if conv1d_output_length(x.shape[2], weight.shape[2], stride, padding, dilation) < 1:
        raise ShapeError(
            f"conv1d: an input of length {x.shape[2]} (padding {padding}) is shorter than the kernel's "
            f"reach, dilation * (kernel_size - 1) + 1 = {dilation * (weight.shape[2] - 1) + 1}"
        )
    x, weight, bias = amp.lower(x, weight, bias)  # a product: bfloat16 inside mt.autocast
    if x.shape[1] >= TAP_BY_TAP_CHANNELS:  # an image of height 1, so that Conv2d may sum tap by tap (see there)
        y = Conv2d.apply(x.unsqueeze(2), weight.unsqueeze(2), (1, stride), (0, padding), (1, dilation)).squeeze(2)
    else:
        y = Conv1d.apply(x, weight, stride, padding, dilation)
    return y if bias is None else y + bias.reshape(-1, 1)  # bias (O,) -> (O, 1): one per channel


def conv2d_output_size(
    size: tuple[int, int],
    kernel_size: tuple[int, int],
    stride: tuple[int, int],
    padding: tuple[int, int],
    dilation: tuple[int, int],
) -> tuple[int, int]:
    """(H_out, W_out): ``conv1d_output_length`` along each spatial axis."""
    return tuple(conv1d_output_length(*axis) for axis in zip(size, kernel_size, stride, padding, dilation))  # type: ignore[return-value]


class Conv2d(Function):
    """Y = conv2d(X, W) without bias: X (N, C, H, W), W (O, C, kh, kw) -> Y (N, O, H_out, W_out).

    As ``Conv1d``, with a tap for each filter position (i, j):
        cols = im2col(X_pad) (N H_out W_out, C kh kw);  Y = cols W^T, back to (N, O, H_out, W_out)
        dL/dW = G^T cols,  dL/dcols = G W,  dL/dX = col2im(dL/dcols), the padding cut off again.

    Where windows overlap, cols holds every input kh kw times (9 for 3 x 3), and with many
    channels building it costs more than the product. Then the sum is taken tap by tap instead
    ("shift and add"), X_t being tap t's slice of X_pad laid out (C, N H_out W_out):
        Y = sum_t W_t X_t  (W_t = W[:, :, i, j], O x C);  dL/dW_t = G X_t^T;  dL/dX_t += W_t^T G
    kh kw products with C as their inner length, and no matrix larger than the input. With
    few channels those products are too thin for BLAS, so im2col stays (as for D2L 11.8's
    patches, kernel = stride: no overlap, cols is the input once).
    """

    @staticmethod
    def forward(
        ctx: Function,
        x: Array,
        weight: Array,
        stride: tuple[int, int],
        padding: tuple[int, int],
        dilation: tuple[int, int],
    ) -> Array:
        xp = ctx.xp
        N, C, H, W = x.shape
        O, _, kh, kw = weight.shape
        H_out, W_out = conv2d_output_size((H, W), (kh, kw), stride, padding, dilation)
        ctx.geometry = (N, C, H, W, H_out, W_out, stride, padding, dilation)
        overlap = stride[0] < dilation[0] * (kh - 1) + 1 or stride[1] < dilation[1] * (kw - 1) + 1
        ctx.tap_by_tap = overlap and C >= TAP_BY_TAP_CHANNELS and not is_low_precision(x.dtype)  # (the docstring)
        if ctx.tap_by_tap:
            xt = xp.pad(x.transpose(1, 0, 2, 3), ((0, 0), (0, 0), (padding[0], padding[0]), (padding[1], padding[1])))
            ctx.save_for_backward(xt, weight)  # (C, N, H_pad, W_pad)
            out = xp.zeros((O, N * H_out * W_out), dtype=x.dtype)
            for i in range(kh):
                for j in range(kw):
                    x_t = xt[_tap_slices(i, j, H_out, W_out, stride, dilation)].reshape(C, -1)
                    out += ctx.backend.matmul(weight[:, :, i, j], x_t)
            return out.reshape(O, N, H_out, W_out).transpose(1, 0, 2, 3)
        if any(padding):
            x = xp.pad(x, ((0, 0), (0, 0), (padding[0], padding[0]), (padding[1], padding[1])))
        taps = [x[_tap_slices(i, j, H_out, W_out, stride, dilation)] for i in range(kh) for j in range(kw)]
        cols = xp.stack(taps, axis=-1)  # (N, C, H_out, W_out, kh kw)
        cols = cols.transpose(0, 2, 3, 1, 4).reshape(N * H_out * W_out, C * kh * kw)
        ctx.save_for_backward(cols, weight)
        out = ctx.backend.matmul(cols, weight.reshape(O, C * kh * kw).T)  # (N H_out W_out, O)
        return out.reshape(N, H_out, W_out, O).transpose(0, 3, 1, 2)

    @staticmethod
    def backward(ctx: Function, grad: Array) -> Grads:
        xp = ctx.xp
        N, C, H, W, H_out, W_out, stride, padding, dilation = ctx.geometry
        if ctx.tap_by_tap:
            return Conv2d._backward_tap_by_tap(ctx, grad)
        cols, weight = ctx.saved
        O, _, kh, kw = weight.shape
        need_x, need_w = ctx.needs_input_grad[:2]
        G = grad.transpose(0, 2, 3, 1).reshape(N * H_out * W_out, O)
        d_weight = ctx.backend.matmul(G.T, cols).reshape(weight.shape) if need_w else None
        d_x = None
        if need_x:
            d_cols = ctx.backend.matmul(G, weight.reshape(O, C * kh * kw)).reshape(N, H_out, W_out, C, kh * kw)
            d_cols = d_cols.transpose(0, 3, 1, 2, 4)  # (N, C, H_out, W_out, kh kw)
            d_x = xp.zeros((N, C, H + 2 * padding[0], W + 2 * padding[1]), dtype=grad.dtype)
            for i in range(kh):  # col2im: each tap's gradient goes back to the slice it read
                for j in range(kw):
                    d_x[_tap_slices(i, j, H_out, W_out, stride, dilation)] += d_cols[..., i * kw + j]
            d_x = d_x[:, :, padding[0] : padding[0] + H, padding[1] : padding[1] + W]
        return d_x, d_weight, None, None, None

    @staticmethod
    def _backward_tap_by_tap(ctx: Function, grad: Array) -> Grads:
        """dL/dW_t = G X_t^T and dL/dX_t += W_t^T G, tap by tap, G = dL/dY as (O, N H_out W_out)."""
        xt, weight = ctx.saved
        N, C, H, W, H_out, W_out, stride, padding, dilation = ctx.geometry
        O, _, kh, kw = weight.shape
        need_x, need_w = ctx.needs_input_grad[:2]
        G = grad.transpose(1, 0, 2, 3).reshape(O, N * H_out * W_out)
        d_weight = ctx.xp.empty_like(weight) if need_w else None
        d_xt = ctx.xp.zeros_like(xt) if need_x else None  # (C, N, H_pad, W_pad)
        for i in range(kh):
            for j in range(kw):
                where = _tap_slices(i, j, H_out, W_out, stride, dilation)
                if d_weight is not None:
                    d_weight[:, :, i, j] = ctx.backend.matmul(G, xt[where].reshape(C, -1).T)
                if d_xt is not None:
                    d_xt[where] += ctx.backend.matmul(weight[:, :, i, j].T, G).reshape(C, N, H_out, W_out)
        d_x = None
        if d_xt is not None:  # the padding cut off, back to (N, C, H, W)
            d_x = d_xt[:, :, padding[0] : padding[0] + H, padding[1] : padding[1] + W].transpose(1, 0, 2, 3)
        return d_x, d_weight, None, None, None


def _tap_slices(
    i: int, j: int, H_out: int, W_out: int, stride: tuple[int, int], dilation: tuple[int, int]
) -> tuple[slice, ...]:
    """Where tap (i, j) of the filter reads the padded input: every stride-th row from i * dilation
    and column from j * dilation, H_out rows and W_out columns of them."""
    rows = slice(i * dilation[0], i * dilation[0] + stride[0] * (H_out - 1) + 1, stride[0])
    columns = slice(j * dilation[1], j * dilation[1] + stride[1] * (W_out - 1) + 1, stride[1])
    return slice(None), slice(None), rows, columns


def pair(name: str, value: int | tuple[int, int], owner: str = "conv2d") -> tuple[int, int]:
    """``value`` for both spatial axes: an int for both, or a pair of ints (PyTorch's habit)."""
    both = (value, value) if isinstance(value, int) else tuple(value) if isinstance(value, (tuple, list)) else ()
    if len(both) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) for v in both):
        raise TypeError(f"{owner}: {name} must be an int or a pair of ints, got {value!r}")
    return both  # type: ignore[return-value]


def conv2d(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    stride: int | tuple[int, int] = 1,
    padding: int | tuple[int, int] = 0,
    dilation: int | tuple[int, int] = 1,
) -> Tensor:
    """The functional form (PyTorch's ``F.conv2d``, without ``groups``): x (N, C, H, W), weight
    (O, C, kh, kw), bias (O,) or None -> (N, O, H_out, W_out); ``stride``, ``padding`` and
    ``dilation`` an int or an (along H, along W) pair. With X_pad = X padded by zeros:

        Y[b, o, r, s] = bias[o] + sum_{c, i, j} W[o, c, i, j] X_pad[b, c, r sh + i dh, s sw + j dw]
    """
    stride, padding, dilation = pair("stride", stride), pair("padding", padding), pair("dilation", dilation)
    if x.ndim != 4:
        raise ShapeError(f"conv2d: input of shape {tuple(x.shape)}; expected (batch, channels, height, width)")
    if weight.ndim != 4 or weight.shape[1] != x.shape[1] or min(weight.shape[2:]) < 1:
        raise ShapeError(
            f"conv2d: weight of shape {tuple(weight.shape)} for an input with {x.shape[1]} channels; "
            f"expected (out_channels, {x.shape[1]}, kernel_height, kernel_width), a kernel of at least 1 x 1"
        )
    if min(stride) < 1 or min(dilation) < 1 or min(padding) < 0:
        raise ValueError(f"conv2d: need stride >= 1, dilation >= 1, padding >= 0; got {stride}, {dilation}, {padding}")
    size = conv2d_output_size((x.shape[2], x.shape[3]), (weight.shape[2], weight.shape[3]), stride, padding, dilation)
    if min(size) < 1:
        reach = tuple(d * (k - 1) + 1 for d, k in zip(dilation, weight.shape[2:]))
        raise ShapeError(
            f"conv2d: an input of height and width {tuple(x.shape[2:])} (padding {padding}) is smaller than "
            f"the kernel's reach, dilation * (kernel_size - 1) + 1 = {reach}"
        )
    x, weight, bias = amp.lower(x, weight, bias)  # a product: bfloat16 inside mt.autocast
    y = Conv2d.apply(x, weight, stride, padding, dilation)
    return y if bias is None else y + bias.reshape(-1, 1, 1)  # bias (O,) -> (O, 1, 1): one per channel
