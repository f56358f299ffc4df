"""Built-in attention poolings: scores (..., Q, K) -> weights (..., Q, K).

Contract (see ``minitensor/hookspecs.py``): ``cls(**options)``;
``forward(scores, valid_lens=None, mask=None) -> weights``.
"""

import minitensor as mt
from minitensor import hookimpl, nn


class SoftmaxPooling(nn.Module):
    """weights = masked_softmax(scores): exp(s_j) / sum_{valid k} exp(s_k), 0 for masked keys."""

    def __init__(self, **options):
        super().__init__()

    def forward(self, scores, valid_lens=None, mask=None):
        return mt.masked_softmax(scores, valid_lens, mask)


@hookimpl
def minitensor_poolings():
    return {"softmax": SoftmaxPooling}
