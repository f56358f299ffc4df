"""A minitensor plugin that adds the ``cosine_temperature`` attention scorer.

    score(q, k) = scale * <q, k> / (|q| |k|)

Cosine similarity is the dot product of the *directions* of q and k: it ignores their lengths,
so a score lies in [-scale, scale]. With scale = 1 the softmax over such scores is close to
uniform (the weights differ at most by a factor e^2 ~ 7.4), which is why the option ``scale``
exists (a fixed inverse temperature, as in cosine-similarity attention). minitensor's built-in
``cosine`` scorer is the same with a learned scale; this plugin keeps it fixed, and registers
under its own name because two plugins may not share one.

Use it by name, like a built-in, once this distribution is installed::

    attn = mt.nn.Attention("cosine_temperature", "softmax", 0.0, query_size=8, key_size=8,
                           scorer_options={"scale": 10.0})

or, without installing it, for one run: ``minitensor train --plugin minitensor_cosine.py
--scorer cosine_temperature``.
"""

import minitensor as mt
from minitensor import hookimpl


class CosineScorer(mt.nn.Module):
    """score(q, k) = scale * <q, k> / (max(|q|, eps) max(|k|, eps)).

    queries (..., Q, d), keys (..., K, d) -> scores (..., Q, K). Queries and keys must have
    the same length d (a dot product needs it); a zero vector scores 0 against everything
    instead of dividing by zero, which is what ``eps`` is for.
    """

    def __init__(self, query_size, key_size, scale=1.0, eps=1e-8, **options):
        super().__init__()
        # An option this scorer does not know is a typo (scorer_options={"sclae": 10}) or meant
        # for another scorer: refuse it by name rather than train with the default scale.
        mt.plugins.check_options(type(self), options, ("scale", "eps"))
        if query_size != key_size:
            raise ValueError(
                f"cosine scorer: queries and keys need one length, got query_size={query_size}, "
                f"key_size={key_size} (use the 'additive' scorer for different lengths)"
            )
        self.scale = float(scale)
        self.eps = float(eps)

    def forward(self, queries, keys):
        q = queries / _norm(queries, self.eps)  # unit vectors: only the direction is left
        k = keys / _norm(keys, self.eps)
        return (q @ k.swapaxes(-1, -2)) * self.scale

    def extra_repr(self):
        return f"scale={self.scale}"


def _norm(x, eps):
    """|x| over the last axis, kept as (..., 1) so it broadcasts, and at least eps."""
    return (x * x).sum(axis=-1, keepdims=True).sqrt().clip(eps, None)


# The hook: pluggy finds it by its name, which must be exactly one of the hooks in
# minitensor/core/hookspecs.py (a typo such as ``minitensor_scorer`` is reported as an error).
# It takes no parameters and returns {name: class}.
@hookimpl
def minitensor_scorers():
    return {"cosine_temperature": CosineScorer}
