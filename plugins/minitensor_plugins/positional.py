"""Built-in positional encodings.

Contract (see ``minitensor/hookspecs.py``): ``cls(num_hiddens, max_len=..., dropout=0.0,
**options)`` with ``applies_to`` = "inputs" (``forward(X, offset=0)``) or "qk"
(``forward(q, k, q_offset=0, k_offset=0)``).
"""

from minitensor import hookimpl, nn


class NoEncoding(nn.Module):
    """No positional information at all: X -> X (attention is then order-blind)."""

    applies_to = "inputs"

    def __init__(self, num_hiddens, max_len=1000, dropout=0.0, **options):
        super().__init__()

    def forward(self, X, offset=0):
        return X


@hookimpl
def minitensor_positional_encodings():
    return {"none": NoEncoding}
