"""Indexing ``x[...]`` and embedding lookup: reading some elements, possibly repeatedly.

Backward writes the gradient back into a zero tensor of the input's shape. With basic
indexing (ints, slices, ``None``, ``...``) every input element is read at most once, so a
plain assignment does; with integer-array indexing one element can be read many times
(``x[[0, 0, 1]]``) and its gradients must be *added* (a scatter-add, ``index_add``).
"""

from ..autograd import Function
from ..errors import DeviceError, ShapeError
from ..tensor import Tensor


def normalize_index(index, like=None):
    """Replace Tensors inside an index by their arrays (which must be on ``like``'s device)."""

    def unwrap(i):
        if not isinstance(i, Tensor):
            return i
        if like is not None and i._backend is not like._backend:
            raise DeviceError(
                f"indexing a tensor on {like.device!r} with an index tensor on {i.device!r}; "
                f"move the index with .to({like.device!r})"
            )
        return i.data

    if isinstance(index, tuple):
        return tuple(unwrap(i) for i in index)
    return unwrap(index)


def _is_basic(index):
    parts = index if isinstance(index, tuple) else (index,)
    return all(p is None or p is Ellipsis or isinstance(p, (int, slice)) for p in parts)


def _check_array_parts(shape, index):
    """IndexError for an integer-array part of ``index`` that points outside its axis.

    NumPy checks this itself; CuPy does not (an out-of-range array index wraps around, so
    ``x[[0, 7]]`` of a 3-row array silently reads row 1), so on any other array library the
    check is made here, at the price of one device-to-host sync per array part.
    """
    parts = index if isinstance(index, tuple) else (index,)

    def width(p):  # how many axes of ``a`` the part consumes
        if p is None or p is Ellipsis:
            return 0
        if hasattr(p, "dtype") and p.dtype.kind == "b":
            return p.ndim
        return 1

    axis = 0
    for p in parts:
        if p is Ellipsis:
            axis = len(shape) - sum(width(q) for q in parts[parts.index(Ellipsis) + 1 :])
            continue
        if hasattr(p, "dtype") and p.dtype.kind in "iu" and p.size and axis < len(shape):
            n = shape[axis]
            low, high = int(p.min()), int(p.max())
            if low < -n or high >= n:
                bad = high if high >= n else low
                raise IndexError(f"getitem: index {bad} is out of bounds for axis {axis} with size {n}")
        axis += width(p)


class GetItem(Function):
    """z = a[index];  dL/da = zeros with dL/dz added at the positions read."""

    @staticmethod
    def forward(ctx, a, index):
        index = normalize_index(index)  # index tensors come inside ``index``, seen by mt.onnx's tracer
        if type(index) is tuple and len(index) == 1 and not _is_basic(index):
            index = index[0]  # x[(i,)] is x[i]: one array, for the backends' fast scatter-add
        ctx.shape, ctx.dtype, ctx.index = a.shape, a.dtype, index
        if ctx.backend.device != "cpu" and not _is_basic(index):
            _check_array_parts(a.shape, index)
        try:
            return a[index]
        except IndexError as e:
            raise IndexError(f"getitem: index {index!r} does not fit shape {tuple(a.shape)}: {e}") from None

    @staticmethod
    def backward(ctx, grad):
        out = ctx.xp.zeros(ctx.shape, dtype=ctx.dtype)
        if _is_basic(ctx.index):
            out[ctx.index] = grad
        else:
            ctx.backend.index_add(out, ctx.index, grad)
        return out


def getitem(a, index):
    """``a[index]`` (what indexing a tensor calls): ints, slices, ``None``, ``...``, integer and
    bool arrays or tensors (on a's device), as in NumPy.

    Backward writes the gradient into zeros of a's shape at the positions read, adding it up
    where integer-array indexing read one element several times (``x[[0, 0, 1]]``).
    """
    normalize_index(index, a)  # index tensors on another device: a clear error now
    if isinstance(index, Tensor):  # kept inside the index (not a second input of the op)
        index = (index,)
    return GetItem.apply(a, index)


class Embedding(Function):
    """z[..., :] = W[i, :] for each index i;  dL/dW[i] = sum of dL/dz over the places i was used.

    An embedding layer is a table look-up: the same as ``one_hot(indices) @ W`` without
    building the one-hot matrix, and its gradient is the matching scatter-add.
    """

    @staticmethod
    def forward(ctx, weight, indices):
        if indices.dtype.kind not in "iu":
            raise TypeError(f"embedding: indices must be an integer tensor, got {indices.dtype}")
        n = weight.shape[0]
        if indices.size and (int(indices.min()) < 0 or int(indices.max()) >= n):
            bad = int(indices.max()) if int(indices.max()) >= n else int(indices.min())
            raise IndexError(
                f"embedding: index {bad} is out of range for a table of {n} embeddings (valid: 0..{n - 1})"
            )
        ctx.shape, ctx.indices = weight.shape, indices
        return weight[indices]

    @staticmethod
    def backward(ctx, grad):
        out = ctx.xp.zeros(ctx.shape, dtype=grad.dtype)
        ctx.backend.index_add(out, ctx.indices.reshape(-1), grad.reshape(-1, ctx.shape[1]))
        return out, None


def embedding(indices, weight):
    """Rows of ``weight`` (num_embeddings, embedding_dim) picked by integer ``indices`` of any
    shape: (*indices.shape, embedding_dim), the same as one_hot(indices) @ weight without
    building the one-hot vectors. The gradient adds up into the rows that were used."""
    if weight.ndim != 2:
        raise ShapeError(f"embedding: weight must be 2-D (num_embeddings, embedding_dim), got shape {weight.shape}")
    if not isinstance(indices, Tensor):
        indices = Tensor._make(weight._backend.array(indices), weight._backend, None)
    return Embedding.apply(weight, indices)
