"""The conformance kit for plugin authors: does my scorer / pooling / encoding keep the contract?

    from minitensor.testing import (check_incremental_decoding, check_pooling, check_positional_encoding,
                                    check_scorer)

    def test_my_scorer():
        assert check_scorer(Cosine)                    # options go to the class:
        assert check_scorer(MyAdditive, query_size=3, key_size=5, num_hiddens=8)

Each check builds the plugin, feeds it small random inputs and checks the properties every
attention layer relies on (``minitensor/core/hookspecs.py`` states the contracts):

- shapes under extra leading batch axes: (Q, d), (batch, Q, d), (batch, num_heads, Q, d);
- the output dtype follows the input (float32 and float64) and stays on the input's device;
- batch independence: changing example b changes no other example's output, and one slice
  of a batch gives what it gives alone;
- gradients to the inputs and to the plugin's parameters, by ``mt.gradcheck`` in float64;
- poolings: keys masked by ``valid_lens`` ((batch,) and (batch, Q)), by a bool ``mask`` or by
  a -inf score get weight exactly 0 and their scores change nothing; a row with no allowed
  key gets all-zero weights (not NaN, not uniform); the weights of a row sum to 1 (unless
  the class says ``sums_to_one = False``); a class that says ``sparse = True`` gives exact
  zeros, and one that says ``softmax_like = True`` gives ``mt.masked_softmax``'s weights;
- scorers' declared capabilities: ``row_wise`` (reordering the queries, or stacking two heads'
  queries against shared keys, gives the same rows) and ``dot_scale(d)`` (the scores are
  scale * q . k);
- positional encodings: ``applies_to``; with "inputs", ``forward(X, offset)`` keeps X's shape
  and encoding X[:, s:] with offset=s gives the tail of encoding X; with "qk",
  ``forward(q, k, q_offset, k_offset)`` returns two tensors of the inputs' shapes, with
  the same offset consistency; with "scores", ``forward(Q, K, q_offset, k_offset)`` is a
  bias broadcastable to (batch, num_heads, Q, K) whose offsets shift it as a key/value
  cache needs, that depends only on j - i and agrees with ``relative_bias`` when the class
  says ``relative = True``, that is -inf beyond its ``window``, and that works (or refuses
  clearly) beyond ``max_len``;
- ``check_incremental_decoding(scorer=..., pooling=..., positional=...)``: a
  MultiHeadAttention built from those names decodes token by token (with its key/value
  cache) exactly as it computes the whole causal pass;
- key/value cache policies: ``check_kv_cache(policy, options, keeps=...)`` against the
  policy's definition, ``check_cached_generation(lm)`` over a long generation
  (``minitensor/testing_caches.py``).

A check returns True, or raises AssertionError naming the broken property, the plugin class
and the shapes or values involved. Each runs in well under a second (tiny sizes).
Keyword arguments other than a check's own (``query_size``, ``key_size``, ``num_hiddens``,
``max_len``, ``device``: the sizes to build with and the device to run on) go to the plugin
class as its options.
"""

import numpy

from . import Tensor, gradcheck, ops, tensor
from .dtypes import is_floating
from .errors import GradcheckError
from .grad_mode import no_grad
from .nn import Module, MultiHeadAttention

__all__ = [
    "KEEPS",
    "attention_error_bound",
    "check_cached_generation",
    "check_incremental_decoding",
    "check_kv_cache",
    "check_pooling",
    "check_positional_encoding",
    "check_scorer",
]

Q, K = 3, 5  # queries and keys per example: different, so a transposed result shows
LEADS = ((), (2,), (2, 3))  # no batch axis, (batch,), (batch, num_heads)


class _Check:
    """What one check call knows: who is checked (for the messages) and a seeded RNG."""

    def __init__(self, check, cls, device):
        self.prefix = f"{check}({getattr(cls, '__name__', repr(cls))})"
        self.cls, self.device = cls, device
        self.rng = numpy.random.default_rng(0)

    def fail(self, prop, detail):
        raise AssertionError(f"{self.prefix}: {prop}: {detail}")

    def build(self, make):
        try:
            module = make()
        except Exception as e:
            self.fail("construction", f"building the plugin raised {type(e).__name__}: {e}")
        if not isinstance(module, Module):
            self.fail("construction", f"the plugin must be an mt.nn.Module, got {type(module).__name__}")
        module.to(self.device)
        module.eval()  # dropout off: the checks compare outputs
        return module

    def call(self, prop, what, fn, *args, **kwargs):
        """Run the plugin; an exception becomes a failure of ``prop``, naming the inputs."""
        try:
            return fn(*args, **kwargs)
        except AssertionError:
            raise
        except Exception as e:
            self.fail(prop, f"{what} raised {type(e).__name__}: {e}")

    def randn(self, shape, dtype, scale=1.0, requires_grad=False):
        data = self.rng.standard_normal(shape) * scale
        return tensor(data, dtype=dtype, device=self.device, requires_grad=requires_grad)

    def ints(self, values):
        return tensor(numpy.asarray(values, dtype=numpy.int64), device=self.device)

    def bools(self, values):
        return tensor(numpy.asarray(values, dtype=bool), device=self.device)

    def output(self, prop, what, out, shape=None, dtype=None):
        """An output must be a Tensor (of ``shape`` and ``dtype``) on the inputs' device."""
        if not isinstance(out, Tensor):
            self.fail(prop, f"{what} returned a {type(out).__name__}, not a Tensor")
        if shape is not None and out.shape != tuple(shape):
            self.fail("output shape", f"{what} gave shape {out.shape}, expected {tuple(shape)}")
        if dtype is not None and out.dtype != dtype:
            self.fail("output dtype", f"{what} gave dtype {out.dtype}; it must follow the input's, {dtype}")
        if out.device != self.device:
            self.fail("output device", f"{what} gave a tensor on {out.device!r}, the inputs are on {self.device!r}")
        return out

    def close(self, prop, what, actual, expected, rtol=1e-7, atol=1e-10):
        """Host arrays equal up to rounding (same non-finite entries in the same places)."""
        a, b = numpy.asarray(actual, dtype=float), numpy.asarray(expected, dtype=float)
        if a.shape != b.shape:
            self.fail(prop, f"{what}: shapes {a.shape} and {b.shape} differ")
        same_special = (numpy.isnan(a) == numpy.isnan(b)).all() and (
            a[numpy.isinf(a) | numpy.isinf(b)] == b[numpy.isinf(a) | numpy.isinf(b)]
        ).all()
        finite = numpy.isfinite(a) & numpy.isfinite(b)
        diff = numpy.abs(a[finite] - b[finite])
        bad = diff > atol + rtol * numpy.abs(b[finite])
        if not same_special or bad.any():
            worst = float(diff.max()) if diff.size else float("nan")
            self.fail(prop, f"{what} (max difference {worst:.3g};\n got      {_short(a)}\n expected {_short(b)})")

    def gradients(self, fn, inputs, names):
        """gradcheck ``fn`` w.r.t. ``inputs`` (float64); failures name the input.

        An output with no autograd graph claims it does not depend on the inputs: then
        perturbing them must change nothing (average pooling is like that).
        """
        out = self.call("gradient", "the forward pass for gradcheck", fn, *inputs)
        self.output("gradient", "the forward pass for gradcheck", out)
        if not out.requires_grad:
            for x, name in zip(inputs, names):
                original = x.data
                x.data = original + 1e-3 * x._backend.array(self.rng.standard_normal(x.shape)).astype(x.dtype)
                with no_grad():
                    moved = fn(*inputs)
                x.data = original
                if not numpy.array_equal(moved.numpy(), out.numpy(), equal_nan=True):
                    self.fail(
                        "gradient",
                        f"the output has no autograd graph (no gradient reaches {name}, shape {x.shape}), "
                        "yet it changes when that input changes",
                    )
            return
        try:
            gradcheck(fn, inputs)
        except GradcheckError as e:
            message = str(e)
            for i, name in enumerate(names):  # gradcheck counts inputs; say which one it is
                message = message.replace(f"input {i} (", f"{name} (", 1)
            self.fail("gradient", f"backward disagrees with finite differences: {message}")
        except Exception as e:
            self.fail("gradient", f"the backward pass raised {type(e).__name__}: {e}")


def _short(a):
    return numpy.array2string(numpy.asarray(a), precision=4, threshold=12, edgeitems=2).replace("\n", " ")


def _host(t):
    return None if t is None else t.numpy() if isinstance(t, Tensor) else numpy.asarray(t)


def _trainable(module):
    return [(name, p) for name, p in module.named_parameters() if p.requires_grad]


def _names(params):
    return [f"parameter {name!r}" for name, _ in params]


def _check_independence(c, what_in, run, inputs, batched):
    """Change example 1 of every batched input: examples 0 and 2 must not notice.

    ``run(*inputs)`` returns a host array with the batch axis first, or a tuple of them;
    ``batched`` says which inputs carry the batch axis (the others pass unchanged).
    """
    before = run(*inputs)
    changed = []
    for x, b in zip(inputs, batched):
        if b and x is not None and is_floating(x.dtype):
            host = x.numpy()
            host[1] = c.rng.standard_normal(host[1].shape)
            x = tensor(host, dtype=x.dtype, device=c.device)
        changed.append(x)
    after = run(*changed)
    for out_before, out_after in zip(*(o if isinstance(o, tuple) else (o,) for o in (before, after))):
        for b in (0, 2):
            c.close(
                "batch independence",
                f"changing example 1 of the {what_in} changed the output for example {b}",
                out_after[b],
                out_before[b],
            )


# -- scorers ------------------------------------------------------------------------------------
def check_scorer(cls, *, query_size=4, key_size=None, device="cpu", **options):
    """Check a scorer class against the contract ``cls(query_size, key_size, **options)``,
    ``forward(queries (..., Q, dq), keys (..., K, dk)) -> scores (..., Q, K)``.

    ``key_size`` defaults to ``query_size``. Returns True or raises AssertionError.
    """
    c = _Check("check_scorer", cls, device)
    dq, dk = query_size, query_size if key_size is None else key_size
    scorer = c.build(lambda: cls(dq, dk, **options))

    def run(q, k, prop="output shape"):
        what = f"forward(queries {q.shape}, keys {k.shape})"
        return c.output(prop, what, c.call(prop, what, scorer, q, k))

    # Shapes and dtypes, under 0, 1 and 2 leading batch axes.
    for dtype in ("float32", "float64"):
        scorer.to(dtype=dtype)
        for lead in LEADS:
            q, k = c.randn(lead + (Q, dq), dtype), c.randn(lead + (K, dk), dtype)
            what = f"forward(queries {q.shape}, keys {k.shape})"
            scores = c.output("output shape", what, run(q, k), lead + (Q, K), numpy.dtype(dtype))
            if numpy.isnan(scores.numpy()).any():
                c.fail("no NaN", f"{what} gave NaN scores: {_short(scores.numpy())}")

    # Batch independence (float64 from here on): examples and heads do not mix.
    q, k = c.randn((3, 2, Q, dq), "float64"), c.randn((3, 2, K, dk), "float64")
    _check_independence(
        c, "queries and keys", lambda q, k: run(q, k, "batch independence").numpy(), [q, k], [True, True]
    )
    whole = run(q, k, "batch independence").numpy()
    for b, h in ((0, 0), (2, 1)):
        alone = run(q[b, h], k[b, h], "batch independence").numpy()
        c.close(
            "batch independence",
            f"scores[{b}, {h}] of queries {q.shape} and keys {k.shape} differ from the scores of "
            f"queries[{b}, {h}] and keys[{b}, {h}] alone",
            whole[b, h],
            alone,
        )

    # Gradients to queries, keys and parameters. Scores of -inf (outside a kernel's
    # support) stay -inf under tiny changes: they are set to 0 so the sums stay finite.
    q = c.randn((2, 2, 2, dq), "float64", requires_grad=True)
    k = c.randn((2, 2, 3, dk), "float64", requires_grad=True)
    with no_grad():
        finite = tensor(numpy.isfinite(run(q, k, "gradient").numpy()), device=device)
    params = _trainable(scorer)

    def scores_fn(q, k, *unused_params):  # the parameters are perturbed in place by gradcheck
        return ops.where(finite, scorer(q, k), 0.0)

    c.gradients(scores_fn, [q, k] + [p for _, p in params], ["queries", "keys"] + _names(params))
    _check_scorer_capabilities(c, scorer, run, dq, dk)
    return True


def _check_scorer_capabilities(c, scorer, run, dq, dk):
    """What the class declares for the fast paths holds (the capabilities of
    minitensor/core/hookspecs.py): ``row_wise`` -- a query's scores come from that query alone, so
    reordering or stacking the queries of two heads against shared keys (what grouped heads
    do) gives the same rows; ``dot_scale(d)`` -- the scores are exactly scale * q . k."""
    q, k = c.randn((2, 2, 6, dq), "float64"), c.randn((2, 2, K, dk), "float64")
    whole = run(q, k, "row_wise").numpy()
    if getattr(scorer, "row_wise", False):
        order = [4, 1, 5, 0, 3, 2]
        reordered = run(tensor(q.numpy()[:, :, order], device=c.device), k, "row_wise").numpy()
        c.close(
            "row_wise",
            f"the class says row_wise = True, yet reordering the 6 queries of {q.shape} changed their scores",
            reordered,
            whole[:, :, order],
        )
        shared = tensor(numpy.repeat(k.numpy()[:, :1], 2, axis=1), device=c.device)  # both heads: head 0's keys
        per_head = run(q, shared, "row_wise").numpy()
        stacked = run(q.reshape(2, 1, 12, dq), shared[:, :1], "row_wise").numpy()
        c.close(
            "row_wise",
            f"the class says row_wise = True, yet the queries of two heads stacked as one, (2, 1, 12, {dq}), "
            "against the keys they share did not score as each head did alone (what grouped heads rely on)",
            stacked.reshape(per_head.shape),
            per_head,
        )
    declared = getattr(scorer, "dot_scale", None)
    if declared is not None:
        if dq != dk:
            c.fail("dot_scale", f"the class declares dot_scale, but queries ({dq}) and keys ({dk}) differ in size")
        scale = declared(dq)
        if scale is not None:
            expected = float(scale) * (q.numpy() @ k.numpy().swapaxes(-1, -2))
            c.close(
                "dot_scale",
                f"the class says dot_scale({dq}) = {scale}, yet its scores are not {scale} * q . k",
                whole,
                expected,
            )


# -- poolings -----------------------------------------------------------------------------------
def _allowed(shape, valid_lens=None, mask=None, scores=None):
    """The reference: which keys may be attended, as a NumPy bool array of ``shape``."""
    allowed = numpy.ones(shape, dtype=bool)
    if scores is not None:
        allowed &= scores > -numpy.inf
    if valid_lens is not None:
        lens = numpy.asarray(valid_lens)
        if lens.ndim == 1:
            lens = lens.reshape(lens.shape + (1,) * (len(shape) - 1))
        else:
            lens = lens.reshape(lens.shape[:1] + (1,) * (len(shape) - 3) + lens.shape[1:] + (1,))
        allowed &= numpy.arange(shape[-1]) < lens
    if mask is not None:
        allowed &= numpy.asarray(mask)
    return allowed


def check_pooling(cls, *, device="cpu", **options):
    """Check a pooling class against the contract ``cls(**options)``,
    ``forward(scores (..., Q, K), valid_lens=None, mask=None) -> weights (..., Q, K)``.

    Besides shapes, dtypes, masking and gradients, two properties that the class declares:

    - ``sums_to_one`` (default True; say ``sums_to_one = False`` on the class to opt out):
      every row with at least one allowed key sums to 1 ("weights sum to 1"; to 1e-6
      relative in float64, 1e-4 in float32);
    - ``sparse = True`` (default False): with one key per row scoring 100 above the others
      (standard normal scores otherwise, float64), every row gives some allowed keys weight
      exactly 0.0 ("sparse poolings give exact zeros"). softmax gives exp(-100) ~ 1e-44
      there, not 0; alpha-entmax needs a margin of 1 / (alpha - 1), so alpha >= 1.01 passes.

    Returns True or raises AssertionError.
    """
    c = _Check("check_pooling", cls, device)
    pooling = c.build(lambda: cls(**options))

    def describe(scores, valid_lens, mask):
        parts = [f"scores {scores.shape}"]
        if valid_lens is not None:
            parts.append(f"valid_lens={_short(valid_lens.numpy())}")
        if mask is not None:
            parts.append(f"mask of shape {mask.shape}")
        return "forward(" + ", ".join(parts) + ")"

    def run(scores, valid_lens=None, mask=None, prop="output shape"):
        what = describe(scores, valid_lens, mask)
        out = c.call(prop, what, pooling, scores, valid_lens=valid_lens, mask=mask)
        return c.output(prop, what, out, scores.shape, scores.dtype)

    # Shapes and dtypes, under 0, 1 and 2 leading batch axes.
    for dtype in ("float32", "float64"):
        pooling.to(dtype=dtype)
        for lead in LEADS:
            scores = c.randn(lead + (Q, K), dtype)
            weights = run(scores).numpy()
            if numpy.isnan(weights).any():
                c.fail("no NaN", f"{describe(scores, None, None)} gave NaN weights: {_short(weights)}")
            _check_sums_to_one(c, describe(scores, None, None), weights, True, dtype)

    B = 3
    lens_1d = c.ints([2, K, 1])
    lens_2d = c.ints([[1, 2, K], [3, 3, 3], [K, 4, 1]])

    # Batch independence: examples and heads do not mix.
    scores = c.randn((B, 2, Q, K), "float64")
    _check_independence(
        c,
        "scores",
        lambda s, lens: run(s, lens, None, "batch independence").numpy(),
        [scores, lens_1d],
        [True, False],
    )
    whole = run(scores, lens_2d, None, "batch independence").numpy()
    for b, h in ((0, 1), (2, 0)):
        alone = run(scores[b : b + 1, h], lens_2d[b : b + 1], None, "batch independence").numpy()
        c.close(
            "batch independence",
            f"weights[{b}, {h}] of scores {scores.shape} differ from the weights of scores[{b}:{b + 1}, {h}] alone",
            whole[b, h],
            alone[0],
        )

    # Masked keys: zero weight, and their scores must not matter. Every row keeps a key here.
    mask = c.bools(numpy.tril(numpy.ones((Q, K), dtype=bool), k=1))  # query i sees keys <= i+1
    heads_host = c.rng.random((B, 1, Q, K)) < 0.5
    heads_host[..., 0] = True
    mask_heads = c.bools(heads_host)  # (batch, 1, Q, K): broadcast over the heads
    cases = [
        ((B, Q, K), lens_1d, None),
        ((B, 2, Q, K), lens_1d, None),
        ((B, Q, K), lens_2d, None),
        ((B, 2, Q, K), lens_2d, None),
        ((B, Q, K), None, mask),
        ((B, 2, Q, K), None, mask_heads),
        ((B, 2, Q, K), lens_2d, mask),
    ]
    for shape, valid_lens, m in cases:
        scores = c.randn(shape, "float64")
        what = describe(scores, valid_lens, m)
        weights = run(scores, valid_lens, m, "masked keys").numpy()
        allowed = _allowed(shape, _host(valid_lens), _host(m))
        _zero_where_masked(c, what, weights, allowed)
        # New values for the masked scores only: the weights must stay the same.
        host = scores.numpy()
        host = numpy.where(allowed, host, 10.0 * c.rng.standard_normal(shape))
        again = run(tensor(host, device=device), valid_lens, m, "masked keys").numpy()
        c.close(
            "masked keys are ignored",
            f"{what}: changing only the scores of masked keys changed the weights",
            again,
            weights,
        )
        _check_sums_to_one(c, what, weights, allowed)
    # valid_lens = K everywhere masks nothing.
    scores = c.randn((B, Q, K), "float64")
    c.close(
        "masked keys",
        "valid_lens equal to K (nothing masked) changed the weights",
        run(scores, c.ints([K] * B), None, "masked keys").numpy(),
        run(scores).numpy(),
    )
    # Scores of -inf are not allowed either.
    host = c.rng.standard_normal((B, Q, K))
    host[0, :, 1:3] = -numpy.inf
    host[2, 1, 0] = -numpy.inf
    scores = tensor(host, device=device)
    weights = run(scores, prop="masked keys").numpy()
    _zero_where_masked(c, "forward(scores with some -inf entries)", weights, host > -numpy.inf)
    _check_sums_to_one(c, "forward(scores with some -inf entries)", weights, host > -numpy.inf)

    # Rows with no allowed key at all: zeros, never NaN, never uniform.
    host = c.rng.standard_normal((B, Q, K))
    host[1, 2, :] = -numpy.inf
    empty_mask = numpy.ones((Q, K), dtype=bool)
    empty_mask[1] = False
    for shape, valid_lens, m, scores_host in (
        ((B, Q, K), c.ints([0, 2, K]), None, None),
        ((B, 2, Q, K), c.ints([0, 2, K]), None, None),
        ((B, Q, K), c.ints([[0, 1, 2], [K, 0, K], [3, 3, 0]]), None, None),
        ((B, Q, K), None, c.bools(empty_mask), None),
        ((B, Q, K), None, None, host),
    ):
        scores = tensor(scores_host, device=device) if scores_host is not None else c.randn(shape, "float64")
        what = describe(scores, valid_lens, m) + (" with a row of -inf scores" if scores_host is not None else "")
        weights = run(scores, valid_lens, m, "fully masked rows").numpy()
        allowed = _allowed(shape, _host(valid_lens), _host(m), scores_host)
        empty = ~allowed.any(axis=-1)
        rows = weights[empty]
        if not (numpy.isfinite(rows).all() and (rows == 0).all()):
            where = [tuple(int(i) for i in idx) for idx in numpy.argwhere(empty)[:3]]
            c.fail(
                "fully masked rows give zeros",
                f"{what}: the rows with no allowed key {where} got weights {_short(rows)} "
                "(expected all zeros: not NaN, not uniform)",
            )
        _check_sums_to_one(c, what, weights, allowed)

    _check_sparse(c, run)
    _check_softmax_like(c, run, cases)

    # Gradients to the scores (with masking) and to any parameters.
    scores = c.randn((2, 2, 2, 4), "float64", requires_grad=True)
    lens = c.ints([3, 4])
    params = _trainable(pooling)

    def weights_fn(s, *unused_params):
        return pooling(s, valid_lens=lens)

    c.gradients(weights_fn, [scores] + [p for _, p in params], ["scores"] + _names(params))
    return True


def _check_softmax_like(c, run, cases):
    """A class saying ``softmax_like = True`` gives ``mt.masked_softmax``'s weights, masks,
    -inf scores and empty rows included: what streamed attention computes in its place."""
    if not getattr(c.cls, "softmax_like", False):
        return
    host = c.rng.standard_normal((3, Q, K))
    host[0, :, 1:3] = -numpy.inf
    host[1, 2, :] = -numpy.inf
    for shape, valid_lens, m in cases + [((3, Q, K), c.ints([0, 2, K]), None), ((3, Q, K), None, None)]:
        scores = tensor(host, device=c.device) if valid_lens is None and m is None else c.randn(shape, "float64")
        weights = run(scores, valid_lens, m, "softmax_like").numpy()
        c.close(
            "softmax_like",
            f"the class says softmax_like = True, yet forward(scores {scores.shape}, "
            f"valid_lens={None if valid_lens is None else _short(valid_lens.numpy())}, "
            f"mask={'None' if m is None else m.shape}) is not mt.masked_softmax of the same",
            weights,
            ops.masked_softmax(scores, valid_lens, m).numpy(),
        )


def _check_sums_to_one(c, what, weights, allowed, dtype="float64"):
    """Each row with an allowed key sums to 1, unless the class says ``sums_to_one = False``."""
    if not getattr(c.cls, "sums_to_one", True):
        return
    rtol = 1e-6 if numpy.dtype(dtype) == numpy.float64 else 1e-4
    has_key = numpy.broadcast_to(allowed, weights.shape).any(axis=-1)
    sums = weights.astype(numpy.float64).sum(axis=-1)
    bad = has_key & ~(numpy.abs(sums - 1) <= rtol)  # NaN sums are bad too
    if bad.any():
        first = tuple(int(i) for i in numpy.argwhere(bad)[0])
        c.fail(
            "weights sum to 1",
            f"{what}: row {first} (which has an allowed key) has weights {_short(weights[first])} "
            f"summing to {float(sums[first])!r}, not 1 (set sums_to_one = False on the class "
            "if it is not meant to)",
        )


def _check_sparse(c, run):
    """A class saying ``sparse = True`` gives exact zeros when one key per row dominates."""
    if getattr(c.cls, "sparse", False) is not True:
        return
    margin = 100.0
    host = c.rng.standard_normal((2, Q, K))
    top = c.rng.integers(K, size=(2, Q))
    numpy.put_along_axis(host, top[..., None], host.max(axis=-1, keepdims=True) + margin, axis=-1)
    scores = tensor(host, device=c.device)
    weights = run(scores, prop="sparse poolings give exact zeros").numpy()
    no_zero = ~(weights == 0.0).any(axis=-1)
    if no_zero.any():
        first = tuple(int(i) for i in numpy.argwhere(no_zero)[0])
        c.fail(
            "sparse poolings give exact zeros",
            f"the class says sparse = True, but with one key per row scoring {margin:g} above the "
            f"others, row {first} got no weight exactly 0.0: {_short(weights[first])} "
            f"for scores {_short(host[first])}",
        )


def _zero_where_masked(c, what, weights, allowed):
    allowed = numpy.broadcast_to(allowed, weights.shape)
    leaked = ~allowed & (weights != 0)  # NaN != 0 counts as a leak too
    if leaked.any():
        where = [tuple(int(i) for i in idx) for idx in numpy.argwhere(leaked)[:3]]
        c.fail(
            "masked keys get zero weight",
            f"{what}: masked keys got weights {_short(weights[leaked])} (first at {where})",
        )


# -- positional encodings -------------------------------------------------------------------------
def check_positional_encoding(cls, *, num_hiddens=8, num_heads=4, max_len=16, device="cpu", **options):
    """Check a positional-encoding class against its contract, by its ``applies_to``:

    - "inputs": ``cls(num_hiddens, max_len=..., dropout=0.0, **options)``,
      ``forward(X, offset=0)``;
    - "qk": the same construction, ``forward(q, k, q_offset=0, k_offset=0) -> (q, k)``;
    - "scores": ``cls(num_heads, max_len=..., **options)``,
      ``forward(num_queries, num_keys, q_offset=0, k_offset=0)`` -> an additive bias on the
      scores, broadcastable to (batch, num_heads, Q, K) (normally (num_heads, Q, K)), for
      queries at positions q_offset + i and keys at k_offset + j; -inf means "may not
      attend". Checked: the shape for several (Q, K), Q != K included; the dtype follows
      ``module.to(float32 / float64)`` (a bias without parameters keeps its dtype in a
      buffer); no NaN; the attributes ``relative`` (bool), ``window`` (None or an int >= 0)
      and ``cross`` (bool) are well-formed (missing ones mean False, None, False);
      "offsets shift the bias consistently": ``forward(Q, K, q_offset, k_offset)`` is the
      [q_offset:, k_offset:] block of ``forward(q_offset + Q, k_offset + K)`` (one new query
      against a long cache included); with ``relative = True``, "the bias depends only on
      j - i" (equal along every diagonal, and at other offsets) and "relative_bias agrees
      with forward" (``relative_bias(min_distance, max_distance)``, (num_heads, D), column c
      the bias at distance min_distance + c, rebuilds forward's matrix); with a ``window``
      w, "window is honoured" (-inf wherever |j - i| > w, finite at j = i); "lengths
      beyond max_len": ``forward(2 max_len, 2 max_len)`` works or raises a ValueError that
      mentions max_len; gradients to the parameters, by gradcheck in float64.

    ``num_hiddens`` builds the "inputs" and "qk" kinds, ``num_heads`` the "scores" kind.
    Returns True or raises AssertionError.
    """
    c = _Check("check_positional_encoding", cls, device)
    applies_to = getattr(cls, "applies_to", None)
    if applies_to not in ("inputs", "qk", "scores"):
        c.fail(
            "applies_to",
            f"the class attribute applies_to is {applies_to!r}; it must be 'inputs', 'qk' or 'scores'",
        )
    if applies_to == "scores":
        encoding = c.build(lambda: cls(num_heads, max_len=max_len, **options))
        _check_scores_encoding(c, encoding, num_heads, max_len)
        return True
    encoding = c.build(lambda: cls(num_hiddens, max_len=max_len, dropout=0.0, **options))
    d, T = num_hiddens, 5
    if applies_to == "inputs":
        _check_inputs_encoding(c, encoding, d, T)
    else:
        _check_qk_encoding(c, encoding, d, T)
    return True


def _distance_grid(Q, K, q_offset, k_offset):
    """(Q, K) host grid of j - i: key position k_offset + j minus query position q_offset + i."""
    return (k_offset + numpy.arange(K))[None, :] - (q_offset + numpy.arange(Q))[:, None]


def _beyond_max_len(c, prop, what, error):
    """Past max_len an encoding may refuse, with a ValueError that says so; nothing else."""
    if isinstance(error, ValueError) and "max_len" in str(error):
        return
    c.fail(
        prop,
        f"{what} raised {type(error).__name__}: {error} (an encoding that cannot go past max_len "
        "must raise ValueError naming max_len)",
    )


def _check_scores_encoding(c, encoding, H, max_len):
    T = max_len  # positions 0 .. T - 1 are within reach of every encoding

    def run(Q, K, q_offset=0, k_offset=0, prop="output shape", dtype=None):
        """forward(...) as a host float64 array (H, Q, K), after the contract's checks."""
        what = f"forward({Q}, {K}, q_offset={q_offset}, k_offset={k_offset})"
        out = c.output(prop, what, c.call(prop, what, encoding, Q, K, q_offset=q_offset, k_offset=k_offset))
        full = (2, H, Q, K)  # (batch, num_heads, Q, K)
        if out.ndim > 4 or any(s not in (1, f) for s, f in zip(reversed(out.shape), reversed(full))):
            c.fail(
                prop,
                f"{what} gave shape {out.shape}, which does not broadcast to (batch, num_heads, Q, K) = "
                f"(batch, {H}, {Q}, {K}); return (num_heads, Q, K)",
            )
        if dtype is not None and out.dtype != dtype:
            c.fail(
                "output dtype",
                f"{what} gave {out.dtype} after module.to({dtype}): the bias must take the "
                "module's dtype (keep it in a parameter or buffer, a non-persistent one for a "
                "constant, so that module.to() converts it)",
            )
        host = numpy.broadcast_to(out.numpy().astype(numpy.float64), (1, H, Q, K))[0]
        if numpy.isnan(host).any():
            where = tuple(int(i) for i in numpy.argwhere(numpy.isnan(host))[0])
            c.fail("no NaN" if prop == "output shape" else f"{prop}: no NaN", f"{what} has NaN at {where}")
        return host

    # -- the attributes ---------------------------------------------------------------------------
    relative, window, cross = (
        getattr(encoding, a, d) for a, d in (("relative", False), ("window", None), ("cross", False))
    )
    for name, value in (("relative", relative), ("cross", cross)):
        if not isinstance(value, bool):
            c.fail("attributes", f"{name} is {value!r}; it must be True or False")
    if window is not None and (isinstance(window, bool) or not isinstance(window, (int, numpy.integer)) or window < 0):
        c.fail("attributes", f"window is {window!r}; it must be None or an int >= 0")
    if relative and not callable(getattr(encoding, "relative_bias", None)):
        c.fail("attributes", "relative is True but there is no method relative_bias(min_distance, max_distance)")

    # -- shape, dtype, no NaN -----------------------------------------------------------------------
    def fits(Q, K, q_offset, k_offset):
        return min(Q, K, q_offset, k_offset) >= 0 and Q >= 1 and K >= 1 and q_offset + Q <= T and k_offset + K <= T

    for dtype in ("float32", "float64"):
        encoding.to(dtype=dtype)
        for Q, K, q_offset, k_offset in (
            (1, 1, 0, 0),
            (3, 5, 0, 0),
            (5, 3, 0, 0),
            (4, 4, 0, 0),
            (1, 9, 8, 0),
            (2, 3, 1, 4),
        ):
            if fits(Q, K, q_offset, k_offset):
                run(Q, K, q_offset, k_offset, dtype=dtype)

    # -- offsets: (Q, K, q_offset, k_offset); the first two are a KV cache (one new query, or a
    # chunk of new queries, against every key so far) -------------------------------------------------
    cases = [
        case
        for case in (
            (1, T, T - 1, 0),
            (3, T, T - 3, 0),
            (2, 3, 1, 4),
            (3, 2, 4, 1),
            (4, 4, T - 4, T - 4),
            (1, 1, T - 1, T - 1),
        )
        if fits(*case)
    ]
    dense = {}
    for Q, K, q_offset, k_offset in cases:
        prop = "offsets shift the bias consistently"
        block = run(q_offset + Q, k_offset + K, prop=prop)[:, q_offset:, k_offset:]
        dense[Q, K, q_offset, k_offset] = out = run(Q, K, q_offset, k_offset, prop=prop)
        c.close(
            prop,
            f"forward({Q}, {K}, q_offset={q_offset}, k_offset={k_offset}) is not the "
            f"[{q_offset}:, {k_offset}:] block of forward({q_offset + Q}, {k_offset + K})",
            out,
            block,
        )
    dense[T, T, 0, 0] = run(T, T)

    # -- relative: one value per distance, and relative_bias gives them --------------------------------
    if relative:
        prop = "the bias depends only on j - i"
        full = dense[T, T, 0, 0]
        for d in range(-(T - 1), T):
            diagonal = numpy.diagonal(full, offset=d, axis1=1, axis2=2)  # (H, cells at distance d)
            c.close(
                prop,
                f"relative = True, yet forward({T}, {T}) changes along the diagonal j - i = {d}",
                diagonal,
                numpy.repeat(diagonal[:, :1], diagonal.shape[1], axis=1),
            )
        per_distance = numpy.stack([numpy.diagonal(full, d, 1, 2)[:, 0] for d in range(-(T - 1), T)], axis=1)
        # the same distances at other offsets, near and far (past max_len: allowed to refuse)
        far = [(Q, K, q_offset + 3 * T, k_offset + 3 * T) for Q, K, q_offset, k_offset in cases[:3]]
        for Q, K, q_offset, k_offset in cases + far:
            what = f"forward({Q}, {K}, q_offset={q_offset}, k_offset={k_offset})"
            try:
                out = run(Q, K, q_offset, k_offset, prop=prop)
            except AssertionError as e:
                if q_offset < T or "raised ValueError" not in str(e) or "max_len" not in str(e):
                    raise
                continue
            expected = per_distance[:, _distance_grid(Q, K, q_offset, k_offset) + (T - 1)]
            c.close(
                prop,
                f"relative = True, yet {what} differs from forward({T}, {T}) at the same distances j - i",
                out,
                expected,
            )

        prop = "relative_bias agrees with forward"
        for (Q, K, q_offset, k_offset), out in dense.items():
            grid = _distance_grid(Q, K, q_offset, k_offset)
            low, high = int(grid.min()), int(grid.max())
            what = f"relative_bias({low}, {high})"
            table = c.output(prop, what, c.call(prop, what, encoding.relative_bias, low, high))
            if table.shape != (H, high - low + 1):
                c.fail(
                    prop,
                    f"{what} gave shape {table.shape}, expected (num_heads, max_distance - min_distance + 1)"
                    f" = {(H, high - low + 1)}",
                )
            c.close(
                prop,
                f"the bias rebuilt from {what} differs from forward({Q}, {K}, q_offset={q_offset}, "
                f"k_offset={k_offset})",
                table.numpy()[:, grid - low],
                out,
            )

    # -- window ---------------------------------------------------------------------------------------
    if window is not None:
        prop = "window is honoured"
        checked = dict(dense)
        if window + 2 > T:  # the cases above reach no key beyond the window: one more that does
            try:
                checked[1, window + 2, window + 1, 0] = run(1, window + 2, window + 1, 0, prop=prop)
            except AssertionError as e:
                if "raised ValueError" not in str(e) or "max_len" not in str(e):
                    raise
        for (Q, K, q_offset, k_offset), out in checked.items():
            what = f"forward({Q}, {K}, q_offset={q_offset}, k_offset={k_offset})"
            distance = numpy.broadcast_to(_distance_grid(Q, K, q_offset, k_offset), out.shape)
            leaks = (numpy.abs(distance) > window) & (out != -numpy.inf)
            if leaks.any():
                h, i, j = (int(x) for x in numpy.argwhere(leaks)[0])
                c.fail(
                    prop,
                    f"window = {window}, yet {what}[{h}, {i}, {j}] (distance j - i = {distance[h, i, j]}) "
                    f"is {float(out[h, i, j])!r}, not -inf",
                )
            blocked = (distance == 0) & ~numpy.isfinite(out)
            if blocked.any():
                h, i, j = (int(x) for x in numpy.argwhere(blocked)[0])
                c.fail(
                    prop,
                    f"{what}[{h}, {i}, {j}] is {float(out[h, i, j])!r} at distance 0: a query must see "
                    "the key at its own position",
                )

    # -- lengths beyond max_len -----------------------------------------------------------------------
    prop, L = "lengths beyond max_len", 2 * max_len
    try:
        result = encoding(L, L)
    except Exception as e:
        _beyond_max_len(c, prop, f"forward({L}, {L}) with max_len={max_len}", e)
    else:
        if not isinstance(result, Tensor):
            c.fail(prop, f"forward({L}, {L}) returned a {type(result).__name__}, not a Tensor")
        run(L, L, prop=prop)

    # -- gradients to the parameters (float64; -inf cells, which carry no gradient, are set to 0) -------
    params = _trainable(encoding)
    if params:
        Q, K, q_offset, k_offset = (3, 5, 2, 1) if fits(3, 5, 2, 1) else (1, 1, 0, 0)

        def finite(t):
            return ops.where(tensor(numpy.isfinite(t.numpy()), device=c.device), t, 0.0).reshape(-1)

        def bias(*unused):
            out = finite(encoding(Q, K, q_offset=q_offset, k_offset=k_offset))
            if relative:
                grid = _distance_grid(Q, K, q_offset, k_offset)
                out = ops.concat([out, finite(encoding.relative_bias(int(grid.min()), int(grid.max())))])
            return out

        c.gradients(bias, [p for _, p in params], _names(params))


def _check_inputs_encoding(c, encoding, d, T):
    def run(X, offset=0, prop="output shape"):
        what = f"forward(X {X.shape}, offset={offset})"
        out = c.call(prop, what, encoding, X, offset=offset)
        return c.output(prop, what, out, X.shape, X.dtype)

    for dtype in ("float32", "float64"):
        encoding.to(dtype=dtype)
        for shape in ((2, T, d), (1, 1, d)):
            run(c.randn(shape, dtype))
    X = c.randn((2, T, d), "float64")
    full = run(X, prop="offset").numpy()
    for s in (1, 3):
        tail = run(X[:, s:], offset=s, prop="offset").numpy()
        what = f"encoding X[:, {s}:] with offset={s} is not the tail of encoding X {X.shape}"
        c.close("offset", what, tail, full[:, s:])
    X = c.randn((3, T, d), "float64")
    _check_independence(c, "inputs X", lambda X: run(X, prop="batch independence").numpy(), [X], [True])
    X = c.randn((2, 3, d), "float64", requires_grad=True)
    params = _trainable(encoding)
    c.gradients(lambda X, *unused: encoding(X, offset=1), [X] + [p for _, p in params], ["X"] + _names(params))


def _check_qk_encoding(c, encoding, d, T):
    def run(q, k, q_offset=0, k_offset=0, prop="output shape"):
        what = f"forward(q {q.shape}, k {k.shape}, q_offset={q_offset}, k_offset={k_offset})"
        out = c.call(prop, what, encoding, q, k, q_offset=q_offset, k_offset=k_offset)
        if not (isinstance(out, (tuple, list)) and len(out) == 2):
            c.fail(prop, f"{what} returned {type(out).__name__}; it must return the pair (q, k)")
        return (
            c.output(prop, what + " [q]", out[0], q.shape, q.dtype),
            c.output(prop, what + " [k]", out[1], k.shape, k.dtype),
        )

    for dtype in ("float32", "float64"):
        encoding.to(dtype=dtype)
        for q_shape, k_shape in (((2, T, d), (2, T, d)), ((2, 3, T, d), (2, 3, T, d)), ((2, 3, 1, d), (2, 3, T, d))):
            run(c.randn(q_shape, dtype), c.randn(k_shape, dtype))
    q, k = c.randn((2, 3, T, d), "float64"), c.randn((2, 3, T, d), "float64")
    full_q, full_k = (t.numpy() for t in run(q, k, prop="offset"))
    for sq, sk in ((1, 2), (T - 1, 0)):  # (T - 1, 0): one new query against all keys (a KV cache)
        tail_q, tail_k = (t.numpy() for t in run(q[..., sq:, :], k[..., sk:, :], sq, sk, prop="offset"))
        for name, s, tail, full in (("q", sq, tail_q, full_q), ("k", sk, tail_k, full_k)):
            c.close(
                "offset",
                f"encoding {name}[..., {s}:, :] with {name}_offset={s} is not the tail of encoding {name} {q.shape}",
                tail,
                full[..., s:, :],
            )
    q, k = c.randn((3, 2, T, d), "float64"), c.randn((3, 2, T, d), "float64")
    _check_independence(
        c,
        "queries and keys",
        lambda q, k: tuple(t.numpy() for t in run(q, k, prop="batch independence")),
        [q, k],
        [True, True],
    )
    q = c.randn((2, 3, d), "float64", requires_grad=True)
    k = c.randn((2, 4, d), "float64", requires_grad=True)
    params = _trainable(encoding)

    def both(q, k, *unused):
        q_out, k_out = encoding(q, k, q_offset=1, k_offset=0)
        return ops.concat([q_out.reshape(-1), k_out.reshape(-1)])

    c.gradients(both, [q, k] + [p for _, p in params], ["q", "k"] + _names(params))


def decoding_layer(
    scorer, pooling, positional, num_hiddens, num_heads, num_kv_heads, steps, device="cpu", **plugin_options
):
    """The layer the decoding checks run: a float64 ``MultiHeadAttention`` of the plugins named,
    without dropout, in eval mode, whose positional tables reach past ``steps`` tokens.
    ``plugin_options``: ``scorer_options``, ``pooling_options``, ``positional_options``."""
    mha = MultiHeadAttention(
        num_hiddens,
        num_heads,
        0.0,
        scorer=scorer,
        pooling=pooling,
        positional=positional,
        max_len=max(2 * steps, 16),
        num_kv_heads=num_kv_heads,
        dtype="float64",
        device=device,
        **plugin_options,
    )
    return mha.eval()


def check_incremental_decoding(
    *,
    scorer="scaled_dot",
    pooling="softmax",
    positional=None,
    num_heads=4,
    num_kv_heads=None,
    num_hiddens=16,
    steps=7,
    batch=2,
    device="cpu",
    scorer_options=None,
    pooling_options=None,
    positional_options=None,
):
    """Check that decoding token by token through ``MultiHeadAttention`` gives the full pass.

    A decoder trains on a whole sequence at once, ``mha(X, X, X, causal=True)``, and decodes
    one token at a time with ``mha.cached_self_attention(x_t, cache)``, which keeps the keys
    and values of the past. The two must give the same outputs at every position, whatever
    the scorer, pooling and positional encoding: a bias computed with the wrong offsets, a
    rotation applied twice to cached keys, or a plugin that looks at the number of keys it
    is given would break it. The layer is built (float64, no dropout) from the plugin names
    and options given, then fed ``steps`` random tokens in three ways: whole, one at a time,
    and a prompt of several tokens followed by single ones. ``num_kv_heads`` checks grouped
    heads too (the cache then holds num_kv_heads heads).

    Returns True, or raises AssertionError naming the plugins and the first position where
    the outputs differ.
    """
    what = (
        f"check_incremental_decoding(scorer={scorer!r}, pooling={pooling!r}, positional={positional!r}, "
        f"num_heads={num_heads}, num_kv_heads={num_kv_heads})"
    )
    mha = decoding_layer(
        scorer,
        pooling,
        positional,
        num_hiddens,
        num_heads,
        num_kv_heads,
        steps,
        device=device,
        scorer_options=scorer_options,
        pooling_options=pooling_options,
        positional_options=positional_options,
    )
    rng = numpy.random.default_rng(0)
    X = tensor(rng.standard_normal((batch, steps, num_hiddens)), device=device)
    with no_grad():
        full = _host(mha(X, X, X, causal=True))
        for pieces in ([1] * steps, [min(3, steps)] + [1] * (steps - min(3, steps))):
            outputs, cache, start = [], None, 0
            for size in pieces:
                out, cache = mha.cached_self_attention(X[:, start : start + size], cache)
                outputs.append(_host(out))
                start += size
            stepwise = numpy.concatenate(outputs, axis=1)
            d_head, g = num_hiddens // num_heads, num_kv_heads or num_heads
            if tuple(cache.keys().shape) != (batch, g, steps, d_head):
                raise AssertionError(
                    f"{what}: the key cache after {steps} tokens has shape {tuple(cache.keys().shape)}, "
                    f"expected (batch, num_kv_heads, steps, d_head) = {(batch, g, steps, d_head)}"
                )
            bad = ~numpy.isclose(stepwise, full, rtol=1e-9, atol=1e-12)
            if bad.any():
                position = int(numpy.argwhere(bad)[0][1])
                raise AssertionError(
                    f"{what}: decoding in pieces {pieces} differs from the full causal pass from position "
                    f"{position} on (max difference {numpy.abs(stepwise - full).max():.3g}): the cached path and the "
                    "full pass disagree about positions (an offset?) or the plugin depends on how many keys it sees"
                )
    return True


# the cache policies' checks live in their own file; the kit is one import
from .testing_caches import KEEPS, attention_error_bound, check_cached_generation, check_kv_cache  # noqa: E402
