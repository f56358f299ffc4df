"""The conformance kit (``minitensor.testing``): it passes every built-in plugin, and it
rejects broken plugins, naming the property that broke."""

import math

import pytest

import minitensor as mt
from minitensor import nn
from minitensor.testing import check_pooling, check_positional_encoding, check_scorer

# Options that give each built-in scorer a meaningful workout (kernels with a support need a
# width at which some keys fall inside and some outside).
SCORER_OPTIONS = {
    "additive": [{}, {"query_size": 3, "key_size": 5, "num_hiddens": 6}],
    "parametric_gaussian": [{"w_init": 0.7}],
    "kernel": [
        {"kernel": "gaussian", "width": 1.5},
        {"kernel": "boxcar", "width": 2.5},
        {"kernel": "epanechnikov", "width": 3.0},
        {"kernel": "triangular", "width": 3.0},
        {"kernel": "constant"},
    ],
}


def _scorer_cases():
    for name in sorted(mt.plugins.scorers()):
        for options in SCORER_OPTIONS.get(name, [{}]):
            yield pytest.param(name, options, id=f"{name}-{'-'.join(f'{k}={v}' for k, v in options.items())}")


@pytest.mark.parametrize("name,options", list(_scorer_cases()))
def test_every_scorer_conforms(name, options, device):
    assert check_scorer(mt.plugins.scorers()[name], device=device, **options) is True


@pytest.mark.parametrize("name", sorted(mt.plugins.poolings()))
def test_every_pooling_conforms(name, device):
    assert check_pooling(mt.plugins.poolings()[name], device=device) is True


@pytest.mark.parametrize("name", sorted(mt.plugins.positional_encodings()))
def test_every_positional_encoding_conforms(name, device):
    assert check_positional_encoding(mt.plugins.positional_encodings()[name], device=device) is True


def test_the_registries_hold_the_built_ins():
    assert {"dot", "scaled_dot", "additive", "gaussian", "parametric_gaussian", "kernel"} <= set(mt.plugins.scorers())
    assert {"softmax", "average", "sparsemax"} <= set(mt.plugins.poolings())


# -- broken plugins ------------------------------------------------------------------------------
def _rejects(check, cls, *words, **kwargs):
    """``check(cls)`` fails with a message naming the class and every one of ``words``."""
    with pytest.raises(AssertionError) as info:
        check(cls, **kwargs)
    message = str(info.value)
    assert cls.__name__ in message, message
    for word in words:
        assert word in message, message
    return message


class TransposedScorer(nn.Module):
    """Bug: scores (..., K, Q) instead of (..., Q, K)."""

    def __init__(self, query_size, key_size, **options):
        super().__init__()

    def forward(self, queries, keys):
        return keys @ queries.swapaxes(-1, -2)


class MatrixOnlyScorer(nn.Module):
    """Bug: ``.T`` reverses *all* axes, so only 2-D queries work."""

    def __init__(self, query_size, key_size, **options):
        super().__init__()

    def forward(self, queries, keys):
        return queries @ keys.T


class BatchMeanScorer(nn.Module):
    """Bug: normalises by a mean over the whole batch, so examples see each other."""

    def __init__(self, query_size, key_size, **options):
        super().__init__()

    def forward(self, queries, keys):
        scores = queries @ keys.swapaxes(-1, -2)
        return scores - scores.mean()


class Float64Scorer(nn.Module):
    """Bug: always answers in float64."""

    def __init__(self, query_size, key_size, **options):
        super().__init__()

    def forward(self, queries, keys):
        return (queries @ keys.swapaxes(-1, -2)).double()


class _DotWrongGrad(mt.Function):
    """q . k with a backward that forgets half of the product rule (no gradient to keys)."""

    @staticmethod
    def forward(ctx, q, k):
        ctx.save_for_backward(q, k)
        return q @ ctx.xp.swapaxes(k, -1, -2)

    @staticmethod
    def backward(ctx, grad):
        q, k = ctx.saved
        return grad @ k, None


class WrongGradScorer(nn.Module):
    def __init__(self, query_size, key_size, **options):
        super().__init__()

    def forward(self, queries, keys):
        return _DotWrongGrad.apply(queries, keys)


class WrongParamGradScorer(nn.Module):
    """Bug: a learned scale whose gradient is cut by a detach."""

    def __init__(self, query_size, key_size, **options):
        super().__init__()
        self.scale = nn.Parameter(mt.tensor([0.5]))

    def forward(self, queries, keys):
        return (queries @ keys.swapaxes(-1, -2)) * self.scale.detach() + 0.0 * self.scale


def test_rejects_a_scorer_with_the_wrong_shape():
    message = _rejects(check_scorer, TransposedScorer, "output shape")
    assert "(5, 3)" in message and "(3, 5)" in message  # both shapes


def test_rejects_a_scorer_that_only_handles_matrices():
    _rejects(check_scorer, MatrixOnlyScorer, "output shape", "(2, 3, 4)")


def test_rejects_a_scorer_mixing_batch_examples():
    _rejects(check_scorer, BatchMeanScorer, "batch independence")


def test_rejects_a_scorer_ignoring_the_input_dtype():
    _rejects(check_scorer, Float64Scorer, "output dtype", "float32")


def test_rejects_a_scorer_with_a_wrong_backward():
    _rejects(check_scorer, WrongGradScorer, "gradient", "keys")


def test_rejects_a_scorer_with_a_wrong_parameter_gradient():
    _rejects(check_scorer, WrongParamGradScorer, "gradient", "parameter 'scale'")


def test_rejects_a_scorer_that_is_not_a_module():
    class NotAModule:
        def __init__(self, query_size, key_size):
            pass

    _rejects(check_scorer, NotAModule, "construction", "Module")


def test_rejects_a_scorer_that_cannot_be_built_with_the_options():
    _rejects(check_scorer, mt.plugins.scorers()["kernel"], "construction", "unknown kernel", kernel="cosine")


def _key_mask(scores, valid_lens, mask):
    from minitensor_plugins.poolings import allowed_keys

    return allowed_keys(scores, valid_lens, mask)


class IgnoresMaskPooling(nn.Module):
    """Bug: plain softmax, valid_lens and mask ignored: weight leaks onto padding."""

    def __init__(self, **options):
        super().__init__()

    def forward(self, scores, valid_lens=None, mask=None):
        return mt.softmax(scores)


class ZeroAfterSoftmaxPooling(nn.Module):
    """Bug: softmax over all keys, masked weights zeroed afterwards (no renormalisation),
    so the masked keys' scores still change the weights of the others."""

    def __init__(self, **options):
        super().__init__()

    def forward(self, scores, valid_lens=None, mask=None):
        return mt.softmax(scores) * _key_mask(scores, valid_lens, mask).to(scores.dtype)


class NaNPooling(nn.Module):
    """Bug: exp(s) / sum exp(s) with masked scores at -inf: 0 / 0 = NaN on an empty row."""

    def __init__(self, **options):
        super().__init__()

    def forward(self, scores, valid_lens=None, mask=None):
        e = scores.masked_fill(~_key_mask(scores, valid_lens, mask), -math.inf).exp()
        return e / e.sum(axis=-1, keepdims=True)


class D2LTrickPooling(nn.Module):
    """Bug (D2L's -1e6 trick): masked scores set to -1e6, so an empty row is uniform."""

    def __init__(self, **options):
        super().__init__()

    def forward(self, scores, valid_lens=None, mask=None):
        return mt.softmax(scores.masked_fill(~_key_mask(scores, valid_lens, mask), -1e6))


class _SoftmaxWrongGrad(mt.Function):
    """softmax with the backward of exp (forgets the normalisation's derivative)."""

    @staticmethod
    def forward(ctx, x):
        e = ctx.xp.exp(x - x.max(axis=-1, keepdims=True))
        y = e / e.sum(axis=-1, keepdims=True)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved
        return grad * y


class WrongGradPooling(nn.Module):
    def __init__(self, **options):
        super().__init__()

    def forward(self, scores, valid_lens=None, mask=None):
        return _SoftmaxWrongGrad.apply(scores.masked_fill(~_key_mask(scores, valid_lens, mask), -1e30)) * _key_mask(
            scores, valid_lens, mask
        ).to(scores.dtype)


class BatchMixingPooling(nn.Module):
    """Bug: subtracts the mean over the batch axis before the softmax."""

    def __init__(self, **options):
        super().__init__()

    def forward(self, scores, valid_lens=None, mask=None):
        return mt.masked_softmax(scores - scores.mean(axis=0, keepdims=True), valid_lens, mask)


class OneDimLensPooling(nn.Module):
    """Bug: reads valid_lens as one length per example only, so (batch, Q) lengths break."""

    def __init__(self, **options):
        super().__init__()

    def forward(self, scores, valid_lens=None, mask=None):
        if valid_lens is not None and valid_lens.ndim == 2:
            valid_lens = valid_lens[:, 0]
        return mt.masked_softmax(scores, valid_lens, mask)


def test_rejects_a_pooling_that_leaves_weight_on_masked_keys():
    _rejects(check_pooling, IgnoresMaskPooling, "masked keys get zero weight", "valid_lens")


def test_rejects_a_pooling_whose_weights_depend_on_masked_scores():
    _rejects(check_pooling, ZeroAfterSoftmaxPooling, "masked keys are ignored")


def test_rejects_a_pooling_with_per_example_lengths_only():
    _rejects(check_pooling, OneDimLensPooling, "masked keys get zero weight")


def test_rejects_a_pooling_giving_nan_on_fully_masked_rows():
    with pytest.warns(RuntimeWarning):  # NumPy's own "invalid value" for 0 / 0
        _rejects(check_pooling, NaNPooling, "fully masked rows give zeros", "nan")


def test_rejects_a_pooling_giving_uniform_weights_on_fully_masked_rows():
    _rejects(check_pooling, D2LTrickPooling, "fully masked rows give zeros", "0.2")


def test_rejects_a_pooling_with_a_wrong_backward():
    _rejects(check_pooling, WrongGradPooling, "gradient", "scores")


def test_rejects_a_pooling_mixing_batch_examples():
    _rejects(check_pooling, BatchMixingPooling, "batch independence")


class LeakyMassPooling(nn.Module):
    """Bug: masked softmax times 0.9, so the weights of a row sum to 0.9, not 1."""

    def __init__(self, **options):
        super().__init__()

    def forward(self, scores, valid_lens=None, mask=None):
        return mt.masked_softmax(scores, valid_lens, mask) * 0.9


class NotReallySparsePooling(nn.Module):
    """Bug: declares sparse = True but is plain (masked) softmax: no weight is ever exactly 0."""

    sparse = True

    def __init__(self, **options):
        super().__init__()

    def forward(self, scores, valid_lens=None, mask=None):
        return mt.masked_softmax(scores, valid_lens, mask)


def test_rejects_a_pooling_whose_weights_do_not_sum_to_one():
    _rejects(check_pooling, LeakyMassPooling, "weights sum to 1", "0.9")


def test_a_pooling_may_say_its_weights_need_not_sum_to_one():
    class Gated(LeakyMassPooling):
        sums_to_one = False

    assert check_pooling(Gated) is True


def test_rejects_a_pooling_that_says_sparse_but_has_no_exact_zeros():
    _rejects(check_pooling, NotReallySparsePooling, "sparse poolings give exact zeros")


def test_the_built_in_poolings_declare_sparse_and_sums_to_one():
    poolings = mt.plugins.poolings()
    assert {
        name for name in ("softmax", "average", "sparsemax", "entmax15", "alpha_entmax") if poolings[name].sparse
    } == {"sparsemax", "entmax15", "alpha_entmax"}
    assert all(poolings[name].sums_to_one for name in ("softmax", "average", "sparsemax", "entmax15", "alpha_entmax"))


class IgnoresOffsetEncoding(nn.Module):
    """Bug: always encodes positions 0 .. T-1, whatever the offset (a KV cache breaks)."""

    applies_to = "inputs"

    def __init__(self, num_hiddens, max_len=100, dropout=0.0, **options):
        super().__init__()
        self.P = nn.Parameter(mt.randn(max_len, num_hiddens))

    def forward(self, X, offset=0):
        return X + self.P[: X.shape[1]]


class WrongShapeEncoding(nn.Module):
    applies_to = "inputs"

    def __init__(self, num_hiddens, max_len=100, dropout=0.0, **options):
        super().__init__()

    def forward(self, X, offset=0):
        return X[:, :1]


class NoAppliesTo(nn.Module):
    def __init__(self, num_hiddens, max_len=100, dropout=0.0, **options):
        super().__init__()

    def forward(self, X, offset=0):
        return X


class QKReturnsOne(nn.Module):
    applies_to = "qk"

    def __init__(self, num_hiddens, max_len=100, dropout=0.0, **options):
        super().__init__()

    def forward(self, q, k, q_offset=0, k_offset=0):
        return q


class QKIgnoresOffset(nn.Module):
    """Bug: multiplies by a position-dependent factor but forgets the offsets."""

    applies_to = "qk"

    def __init__(self, num_hiddens, max_len=100, dropout=0.0, **options):
        super().__init__()
        self.scale = mt.arange(1, max_len + 1, dtype=mt.float32).reshape(max_len, 1)

    def forward(self, q, k, q_offset=0, k_offset=0):
        s = self.scale.to(q.dtype).to(q.device)
        return q * s[: q.shape[-2]], k * s[: k.shape[-2]]


def test_rejects_an_encoding_that_ignores_the_offset():
    _rejects(check_positional_encoding, IgnoresOffsetEncoding, "offset", "offset=1")


def test_rejects_an_encoding_with_the_wrong_shape():
    _rejects(check_positional_encoding, WrongShapeEncoding, "output shape")


def test_rejects_an_encoding_without_applies_to():
    _rejects(check_positional_encoding, NoAppliesTo, "applies_to")


def test_rejects_a_qk_encoding_returning_one_tensor():
    _rejects(check_positional_encoding, QKReturnsOne, "output shape", "pair")


def test_rejects_a_qk_encoding_that_ignores_the_offsets():
    _rejects(check_positional_encoding, QKIgnoresOffset, "offset", "q_offset")
