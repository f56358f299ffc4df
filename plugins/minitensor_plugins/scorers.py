"""Built-in attention scoring functions: score(q, k) for every query-key pair.

Contract (see ``minitensor/hookspecs.py``): ``cls(query_size, key_size, **options)``;
``forward(queries (..., Q, dq), keys (..., K, dk)) -> scores (..., Q, K)``.
"""

import math

from minitensor import hookimpl, nn


class DotProduct(nn.Module):
    """score(q, k) = q . k  (queries and keys of one length d)."""

    def __init__(self, query_size, key_size, **options):
        super().__init__()

    def forward(self, queries, keys):
        return queries @ keys.swapaxes(-1, -2)


class ScaledDotProduct(nn.Module):
    """score(q, k) = q . k / sqrt(d): the dot product scaled so that, for q and k with
    independent unit-variance entries, the scores keep unit variance whatever d is."""

    def __init__(self, query_size, key_size, **options):
        super().__init__()

    def forward(self, queries, keys):
        return (queries @ keys.swapaxes(-1, -2)) * (1.0 / math.sqrt(queries.shape[-1]))


@hookimpl
def minitensor_scorers():
    return {"dot": DotProduct, "scaled_dot": ScaledDotProduct}
