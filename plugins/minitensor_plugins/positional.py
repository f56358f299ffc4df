"""Built-in positional encodings: telling an order-blind attention layer where tokens are.

Self-attention treats its inputs as a *set*: permute the tokens and the outputs are permuted
the same way. Word order has to be put in by hand; this module puts it in two places:

- ``applies_to = "inputs"``: add a vector P[i] to the embedding of the token at position i,
  before the first layer (``sinusoidal``, ``learned``, ``none``): X + P[offset : offset + T];
- ``applies_to = "qk"``: rotate the queries and keys inside every attention layer, so that
  the scores see relative positions directly (``rotary``).

The third place, a bias on the scores, is ``score_biases.py``. What each kind is built and
called with, and what the offsets mean: the contract, ``minitensor/core/hookspecs.py``.

The fixed tables (sinusoidal, rotary) are computed once on the host in float64 with NumPy
-- they are constants of the positions, not tensor data in any graph, like data loaded from
a file -- copied to the device in the layer's dtype, and kept as non-persistent buffers:
they move with ``module.to(...)`` but are not saved in checkpoints (a formula, not learned
state). Build the layer with ``dtype=mt.float64`` for float64-accurate tables:
``.double()`` afterwards converts the float32 ones.
"""

import numbers
import operator

import numpy
from minitensor.plugins import check_options

import minitensor as mt
from minitensor import hookimpl, nn


def _check_window(name, offset, length, max_len):
    """Positions offset .. offset + length - 1 must exist in a table of max_len rows;
    returns offset as a Python int."""
    try:
        # ints (kept as they are: a length mt.onnx traces is an int subclass), NumPy integers; not floats
        offset = offset if isinstance(offset, int) else operator.index(offset)
    except TypeError:
        raise TypeError(f"{name}: offset must be an int, got {offset!r}") from None
    if offset < 0:
        raise ValueError(f"{name}: offset must be >= 0, got {offset}")
    if offset + length > max_len:
        raise ValueError(
            f"{name}: positions {offset}..{offset + length - 1} (offset {offset} + length {length} = "
            f"{offset + length}) exceed max_len={max_len}; build the encoding with a larger max_len"
        )
    return offset


def _frequencies(num_pairs, size, base, owner):
    """w_j = 1 / base^(2j / size) for j = 0 .. num_pairs - 1 (float64, on the host):
    from one turn per 2 pi positions (j = 0) down to one per ~2 pi base positions. ``owner``
    names the encoding in the error for a ``base`` that is not a finite number > 0 (0 or a
    negative one makes the frequencies inf or NaN, and every position's vector NaN)."""
    if isinstance(base, bool) or not isinstance(base, numbers.Real) or not 0 < base < float("inf"):
        raise ValueError(f"{owner}: base must be a finite number > 0 (10000 in the paper), got {base!r}")
    return 1.0 / base ** (numpy.arange(num_pairs, dtype=numpy.float64) * 2.0 / size)


class NoEncoding(nn.Module):
    """No positional information at all: X -> X (attention is then order-blind)."""

    applies_to = "inputs"

    def __init__(self, num_hiddens, max_len=1000, dropout=0.0, **options):
        super().__init__()
        check_options(type(self), options)

    def forward(self, X, offset=0):
        return X


class SinusoidalEncoding(nn.Module):
    """The Transformer's fixed encoding (Vaswani et al. 2017; D2L 11.6), added to the inputs:

        P[i, 2j]   = sin(i / base^(2j/d))
        P[i, 2j+1] = cos(i / base^(2j/d))        i = position, d = num_hiddens, base = 10000

    forward(X, offset=0) = dropout(X + P[offset : offset + T]) for X of shape (batch, T, d).

    Each pair of columns (2j, 2j+1) is a point on a circle turning with frequency
    w_j = 1 / base^(2j/d): fast in the first columns, slow in the last ones, like the bits of
    a binary counter but continuous. Moving delta positions turns every circle by a fixed
    angle delta * w_j, whatever i is, so P[i + delta] is a linear function of P[i] (the
    relative-position property of D2L 10.6 / 11.6):

        [P[i+delta, 2j]  ]   [ cos(delta w_j)  sin(delta w_j)] [P[i, 2j]  ]
        [P[i+delta, 2j+1]] = [-sin(delta w_j)  cos(delta w_j)] [P[i, 2j+1]]

    With odd d the last column is a sine without its cosine partner.
    """

    applies_to = "inputs"

    def __init__(self, num_hiddens, max_len=1000, dropout=0.0, base=10000.0, dtype=None, device=None, **options):
        super().__init__()
        check_options(type(self), options)
        self.num_hiddens, self.max_len, self.base = num_hiddens, max_len, base
        self.dropout = nn.Dropout(dropout)
        # Column c belongs to the pair j = c // 2: even columns hold sines, odd ones cosines.
        positions = numpy.arange(max_len, dtype=numpy.float64)[:, None]
        angles = positions * _frequencies(
            (num_hiddens + 1) // 2, num_hiddens, base, type(self).__name__
        )  # (max_len, ceil(d/2))
        P = numpy.empty((max_len, num_hiddens))
        P[:, 0::2] = numpy.sin(angles)
        P[:, 1::2] = numpy.cos(angles[:, : num_hiddens // 2])
        self.register_buffer("P", mt.tensor(P, dtype=dtype or mt.float32, device=device), persistent=False)

    def forward(self, X, offset=0):
        T = X.shape[-2]
        offset = _check_window("SinusoidalEncoding", offset, T, self.max_len)
        return self.dropout(X + self.P[offset : offset + T])

    def extra_repr(self):
        return f"num_hiddens={self.num_hiddens}, max_len={self.max_len}, base={self.base:g}"


class LearnedEncoding(nn.Module):
    """A learned table of position vectors (BERT, GPT-2): P is a Parameter (max_len, d).

    forward(X, offset=0) = dropout(X + P[offset : offset + T]), as for the sinusoidal one,
    but every position's vector is trained with the model; positions beyond max_len (or
    never seen in training) mean nothing. P starts as N(0, 0.02^2), BERT's and GPT-2's
    choice: small next to the token embeddings, so at first the positions only nudge the
    tokens instead of drowning them, and training grows them as far as they help.
    """

    applies_to = "inputs"

    def __init__(self, num_hiddens, max_len=1000, dropout=0.0, std=0.02, dtype=None, device=None, **options):
        super().__init__()
        check_options(type(self), options)
        self.num_hiddens, self.max_len = num_hiddens, max_len
        self.dropout = nn.Dropout(dropout)
        self.P = nn.Parameter(mt.zeros(max_len, num_hiddens, dtype=dtype, device=device))
        nn.init.normal_(self.P, 0.0, std)

    def forward(self, X, offset=0):
        T = X.shape[-2]
        offset = _check_window("LearnedEncoding", offset, T, self.max_len)
        # Slicing is differentiable: the gradient lands on rows offset .. offset + T - 1.
        return self.dropout(X + self.P[offset : offset + T])

    def extra_repr(self):
        return f"num_hiddens={self.num_hiddens}, max_len={self.max_len}"


class RotaryEncoding(nn.Module):
    """Rotary position embedding, RoPE (Su et al. 2021, RoFormer), applied to queries and keys.

    Built with the per-head size d (even). Feature pairs (2j, 2j+1) of a query or key at
    position p are rotated by the angle p * theta_j, theta_j = base^(-2j/d) (the sinusoidal
    encoding's frequencies):

        q'[2j]   = q[2j] cos(p theta_j) - q[2j+1] sin(p theta_j)
        q'[2j+1] = q[2j] sin(p theta_j) + q[2j+1] cos(p theta_j)

    i.e. q' = R(p theta) q with R(a) = [[cos a, -sin a], [sin a, cos a]] in every pair.
    Rotations keep lengths, and R(a)^T R(b) = R(b - a), so the score of a query at position
    m with a key at position n,

        <R(m theta) q, R(n theta) k> = q^T R((n - m) theta) k,

    depends on the positions only through n - m: attention sees *relative* positions, and
    nothing is added to the inputs. ``forward(q, k, q_offset=0, k_offset=0)`` takes
    (..., Tq, d) and (..., Tk, d) tensors whose first rows are at positions q_offset and
    k_offset, and returns the rotated (q, k). Built from slicing and products only (the 90
    degree turn of every pair is a product with a fixed (d, d) matrix), so gradients flow
    through it like through any op.
    """

    applies_to = "qk"

    def __init__(self, num_hiddens, max_len=1000, dropout=0.0, base=10000.0, dtype=None, device=None, **options):
        super().__init__()
        check_options(type(self), options)
        if num_hiddens % 2:
            raise ValueError(
                f"RotaryEncoding: the per-head size must be even (features are rotated in pairs), got {num_hiddens}"
            )
        if dropout:
            raise ValueError(
                f"RotaryEncoding: dropout={dropout} has nothing to act on (rotary encoding adds no vector "
                "to the inputs; it rotates queries and keys); use dropout=0.0"
            )
        self.num_hiddens, self.max_len, self.base = num_hiddens, max_len, base
        angles = numpy.arange(max_len, dtype=numpy.float64)[:, None] * _frequencies(
            num_hiddens // 2, num_hiddens, base, type(self).__name__
        )
        angles = numpy.repeat(angles, 2, axis=1)  # (max_len, d): pair j's angle at features 2j and 2j+1
        # P turns each pair (a, b) into (-b, a): x @ P is x rotated by 90 degrees in every pair
        P = numpy.zeros((num_hiddens, num_hiddens))
        P[numpy.arange(1, num_hiddens, 2), numpy.arange(0, num_hiddens, 2)] = -1.0
        P[numpy.arange(0, num_hiddens, 2), numpy.arange(1, num_hiddens, 2)] = 1.0
        dtype = dtype or mt.float32
        self.register_buffer("cos", mt.tensor(numpy.cos(angles), dtype=dtype, device=device), persistent=False)
        self.register_buffer("sin", mt.tensor(numpy.sin(angles), dtype=dtype, device=device), persistent=False)
        self.register_buffer("quarter_turn", mt.tensor(P, dtype=dtype, device=device), persistent=False)

    def rotate(self, x, offset=0):
        """x (..., T, d) with its first row at position ``offset`` -> R(p theta) x, row by row."""
        *lead, T, d = x.shape
        if d != self.num_hiddens:
            raise mt.ShapeError(
                f"RotaryEncoding: built for vectors of size {self.num_hiddens}, got shape {tuple(x.shape)} "
                "(build it with the per-head size, num_hiddens // num_heads)"
            )
        offset = _check_window("RotaryEncoding", offset, T, self.max_len)
        # R(a) (x_2j, x_2j+1) = cos a (x_2j, x_2j+1) + sin a (-x_2j+1, x_2j): six ops for any
        # shape (pairs split and stacked again took thirteen, too many for a one-token decoding step)
        cos = self.cos[offset : offset + T]  # (T, d): broadcasts over the leading axes
        sin = self.sin[offset : offset + T]
        return x * cos + (x @ self.quarter_turn) * sin

    def forward(self, q, k, q_offset=0, k_offset=0):
        return self.rotate(q, q_offset), self.rotate(k, k_offset)

    def extra_repr(self):
        return f"num_hiddens={self.num_hiddens}, max_len={self.max_len}, base={self.base:g}"


@hookimpl
def minitensor_positional_encodings():
    return {
        "none": NoEncoding,
        "sinusoidal": SinusoidalEncoding,
        "learned": LearnedEncoding,
        "rotary": RotaryEncoding,
    }
