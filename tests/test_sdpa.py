"""``F.scaled_dot_product_attention``: PyTorch's call and rules on both of minitensor's paths.

The reference is PyTorch's own documented formula written out in NumPy (``reference``), so the
tests run without PyTorch; where PyTorch is installed they also compare with it, gradients too.
Both paths are held to it: the stream (FlashAttention; one tile, or many tiles with small
blocks) and the plain path (the scores, D2L's ``masked_softmax``, dropout, a product).
"""

import importlib

import minitensor.nn.functional as F
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minitensor as mt

sdpa = importlib.import_module("minitensor.nn.sdpa")
fa = importlib.import_module("minitensor.ops.flash_attention")
attend = F.scaled_dot_product_attention


@pytest.fixture(params=["auto", "plain", "tiles"])
def path(request, monkeypatch):
    """How the call runs: as the function picks (short sequences: the stream's one tile), the
    plain path always, or the stream always, in tiles of 4 queries x 8 keys."""
    if request.param == "plain":
        monkeypatch.setattr(sdpa, "_streamable", lambda *args: False)
    if request.param == "tiles":
        monkeypatch.setattr(fa, "BLOCK_Q", 4)
        monkeypatch.setattr(fa, "BLOCK_K", 8)
        monkeypatch.setattr(fa, "FUSED_MIN_LENGTH", 1)
    return request.param


def reference(q, k, v, attn_mask=None, is_causal=False, scale=None, enable_gqa=False):
    """PyTorch's documented formula in NumPy: scores, the mask (bool: -inf where False; float:
    added), softmax with a row of no key giving zeros, weights @ values."""
    L, S = q.shape[-2], k.shape[-2]
    if enable_gqa and k.shape[-3] != q.shape[-3]:
        r = q.shape[-3] // k.shape[-3]
        k, v = np.repeat(k, r, axis=-3), np.repeat(v, r, axis=-3)
    scores = q @ np.swapaxes(k, -1, -2) * (1 / np.sqrt(q.shape[-1]) if scale is None else scale)
    if is_causal:
        scores = np.where(np.tril(np.ones((L, S), bool)), scores, -np.inf)
    if attn_mask is not None:
        scores = np.where(attn_mask, scores, -np.inf) if attn_mask.dtype == bool else scores + attn_mask
    top = scores.max(axis=-1, keepdims=True)
    e = np.exp(scores - np.where(np.isfinite(top), top, 0))
    total = e.sum(axis=-1, keepdims=True)
    return (e / np.where(total > 0, total, 1)) @ v


def leaves(rng, *shapes, dtype="float64"):
    return [mt.tensor(rng.standard_normal(s), dtype=dtype, requires_grad=True) for s in shapes]


# (query, key, value shapes, keyword arguments): every rule of the module's docstring
CASES = {
    "4-D": ((2, 3, 5, 8), (2, 3, 5, 8), (2, 3, 5, 8), {}),
    "causal L < S": ((2, 3, 5, 8), (2, 3, 7, 8), (2, 3, 7, 6), {"is_causal": True}),
    "causal L > S": ((2, 3, 7, 8), (2, 3, 5, 8), (2, 3, 5, 8), {"is_causal": True}),
    "causal L = S": ((2, 3, 6, 8), (2, 3, 6, 8), (2, 3, 6, 8), {"is_causal": True}),
    "bool mask, a row empty": ((2, 3, 5, 8), (2, 3, 7, 8), (2, 3, 7, 8), {"attn_mask": "bool (2, 1, 5, 7)"}),
    "float mask with -inf": ((2, 3, 5, 8), (2, 3, 7, 8), (2, 3, 7, 8), {"attn_mask": "float (5, 7)"}),
    "grouped heads": ((2, 4, 5, 8), (2, 2, 7, 8), (2, 2, 7, 8), {"enable_gqa": True}),
    "grouped, causal": ((2, 4, 5, 8), (2, 2, 7, 8), (2, 2, 7, 8), {"enable_gqa": True, "is_causal": True}),
    "grouped, mask": ((2, 4, 5, 8), (2, 2, 7, 8), (2, 2, 7, 8), {"enable_gqa": True, "attn_mask": "bool (4, 5, 7)"}),
    "one key/value head": ((2, 4, 5, 8), (2, 1, 7, 8), (2, 1, 7, 8), {}),
    "3-D": ((3, 5, 8), (3, 7, 8), (3, 7, 4), {"is_causal": True}),
    "2-D": ((5, 8), (7, 8), (7, 4), {}),
    "5-D, mask": ((2, 3, 4, 5, 8), (2, 3, 4, 7, 8), (2, 3, 4, 7, 8), {"attn_mask": "bool (3, 1, 5, 7)"}),
    "batch broadcast": ((2, 3, 5, 8), (1, 3, 7, 8), (1, 3, 7, 8), {}),
    "queries broadcast": ((5, 8), (3, 7, 8), (3, 7, 8), {}),
    "scale": ((2, 3, 5, 8), (2, 3, 7, 8), (2, 3, 7, 8), {"scale": 0.3}),
}  # fmt: skip


def make_mask(spec, rng):
    kind, shape = spec.split(" ", 1)
    shape = tuple(int(n) for n in shape.strip("()").split(","))
    if kind == "bool":
        mask = rng.random(shape) > 0.4
        mask[(0,) * (len(shape) - 2) + (1,)] = False  # a query that sees no key: zeros, not NaN
        return mask
    mask = rng.standard_normal(shape)
    mask[2] = -np.inf  # a row of -inf: zeros too
    mask[3, :2] = -np.inf
    return mask


def arguments(case, rng):
    q_shape, k_shape, v_shape, options = CASES[case]
    q, k, v = (rng.standard_normal(s) for s in (q_shape, k_shape, v_shape))
    options = dict(options)
    if "attn_mask" in options:
        options["attn_mask"] = make_mask(options["attn_mask"], rng)
    return q, k, v, options


def as_tensors(options, **tensor_options):
    mask = options.get("attn_mask")
    if mask is None:
        return options
    return {**options, "attn_mask": mt.tensor(mask, **tensor_options)}


@pytest.mark.parametrize("case", CASES)
def test_the_output_is_pytorchs_formula(case, path):
    rng = np.random.default_rng(0)
    q, k, v, options = arguments(case, rng)
    got = F.scaled_dot_product_attention(*(mt.tensor(x) for x in (q, k, v)), **as_tensors(options))
    np.testing.assert_allclose(got.numpy(), reference(q, k, v, **options), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("case", ["causal L < S", "causal L > S", "float mask with -inf", "grouped, mask", "3-D"])
def test_gradcheck(case, path):
    rng = np.random.default_rng(1)
    q, k, v, options = arguments(case, rng)
    mask = options.get("attn_mask")
    inputs = [mt.tensor(x, requires_grad=True) for x in (q, k, v)]
    if mask is not None and mask.dtype != bool:
        mask = np.where(np.isfinite(mask), mask, -5.0)  # finite differences cannot step -inf
        inputs.append(mt.tensor(mask, requires_grad=True))  # a float mask gets a gradient too

        def fn(q, k, v, m):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=m)
    else:

        def fn(q, k, v):
            return F.scaled_dot_product_attention(q, k, v, **as_tensors(options))

    assert mt.gradcheck(fn, inputs)


@pytest.mark.parametrize("case", CASES)
def test_outputs_and_gradients_equal_pytorchs(case, path):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(2)
    q, k, v, options = arguments(case, rng)
    float_mask = "attn_mask" in options and options["attn_mask"].dtype != bool
    theirs = [torch.tensor(x, requires_grad=True) for x in (q, k, v)]
    ours = [mt.tensor(x, requires_grad=True) for x in (q, k, v)]
    their_options, our_options = dict(options), dict(options)
    if "attn_mask" in options:
        their_options["attn_mask"] = torch.tensor(options["attn_mask"], requires_grad=float_mask)
        our_options["attn_mask"] = mt.tensor(options["attn_mask"], requires_grad=float_mask)
    expected = torch.nn.functional.scaled_dot_product_attention(*theirs, **their_options)
    got = F.scaled_dot_product_attention(*ours, **our_options)
    G = rng.standard_normal(expected.shape)
    expected.backward(torch.tensor(G))
    (got * mt.tensor(G)).sum().backward()
    np.testing.assert_allclose(got.numpy(), expected.detach().numpy(), rtol=1e-10, atol=1e-12)
    pairs = list(zip(ours, theirs, strict=True))
    if float_mask:
        pairs.append((our_options["attn_mask"], their_options["attn_mask"]))
    for a, b in pairs:
        np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=1e-9, atol=1e-11)


@settings(max_examples=40, deadline=None)
@given(
    lead=st.sampled_from([(), (2,), (1, 3), (2, 2)]),
    L=st.integers(1, 12),
    S=st.integers(1, 12),
    E=st.integers(1, 5),
    group=st.sampled_from([1, 2]),
    is_causal=st.booleans(),
    mask=st.sampled_from([None, "bool", "float"]),
    seed=st.integers(0, 2**16),
)
def test_any_shape_gives_the_formula_on_every_path(lead, L, S, E, group, is_causal, mask, seed):
    rng = np.random.default_rng(seed)
    grouped = group > 1 and len(lead) > 0
    k_lead = lead[:-1] + (lead[-1] // group,) if grouped and lead[-1] % group == 0 else lead
    q, k, v = (rng.standard_normal(shape) for shape in (lead + (L, E), k_lead + (S, E), k_lead + (S, E)))
    options = {"is_causal": is_causal, "enable_gqa": k_lead != lead}
    if mask == "bool" and not is_causal:
        options["attn_mask"] = rng.random((L, S)) > 0.3
    if mask == "float" and not is_causal:
        options["attn_mask"] = rng.standard_normal((L, S))
    want = reference(q, k, v, **options)
    for streamable in (sdpa._streamable, lambda *args: False):  # as picked; the plain path
        try:
            sdpa._streamable, picked = streamable, sdpa._streamable
            got = F.scaled_dot_product_attention(*(mt.tensor(x) for x in (q, k, v)), **as_tensors(options))
        finally:
            sdpa._streamable = picked
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("case", ["causal L < S", "causal L > S", "grouped, causal", "bool mask, a row empty"])
def test_every_device_streams_to_the_formula(case, device, monkeypatch):
    """On every backend (on a GPU: the CUDA kernels, upper-left causal as one length per query),
    streamed: the output and the gradients of the plain path on the CPU."""
    monkeypatch.setattr(fa, "FUSED_MIN_LENGTH", 1)  # stream whatever the length
    rng = np.random.default_rng(5)
    q, k, v, options = arguments(case, rng)
    G = rng.standard_normal(reference(q, k, v, **options).shape)
    results = []
    for where, streamable in ((device, sdpa._streamable), ("cpu", lambda *args: False)):
        monkeypatch.setattr(sdpa, "_streamable", streamable)
        leaves = [mt.tensor(x, device=where, requires_grad=True) for x in (q, k, v)]
        out = F.scaled_dot_product_attention(*leaves, **as_tensors(options, device=where))
        (out * mt.tensor(G, device=where)).sum().backward()
        results.append([out.numpy()] + [x.grad.numpy() for x in leaves])
    for a, b in zip(*results, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


@pytest.fixture
def paths_taken(monkeypatch):
    """The paths the calls take, in order ("stream" or "plain"), each returning its queries."""
    ran = []
    monkeypatch.setattr(sdpa, "_streamed", lambda *args: ran.append("stream") or args[0])
    monkeypatch.setattr(sdpa, "_plain", lambda *args: ran.append("plain") or args[0])
    return ran


@pytest.mark.parametrize(
    "L, S, options, streams",
    [
        (16, 16, {"is_causal": True}, True),  # one tile on the CPU
        (300, 300, {"is_causal": True}, False),  # two tiles, shorter than FUSED_MIN_LENGTH
        (400, 450, {"is_causal": True}, True),
        (16, 16, {"attn_mask": "float"}, False),  # a dense additive mask
    ],
)
def test_the_stream_runs_where_it_pays_and_can(paths_taken, L, S, options, streams):
    ran = paths_taken
    q, k = mt.randn(1, 2, L, 4), mt.randn(1, 2, S, 4)
    if options.get("attn_mask") == "float":
        options = {"attn_mask": mt.zeros(L, S)}
    F.scaled_dot_product_attention(q, k, k, **options)
    assert ran == ["stream" if streams else "plain"]


@pytest.mark.parametrize("L, S", [(5, 0), (0, 5), (0, 0)])
def test_no_keys_or_no_queries(path, L, S):
    """No key: every query sees none, zeros (PyTorch's too); no query: an empty output."""
    q, k, v = leaves(np.random.default_rng(6), (2, 3, L, 4), (2, 3, S, 4), (2, 3, S, 6))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    out.sum().backward()
    assert out.shape == (2, 3, L, 6) and not out.numpy().any()
    assert q.grad.shape == q.shape and k.grad.shape == k.shape and not q.grad.numpy().any()


def test_on_a_gpu_a_bool_mask_takes_the_plain_path(monkeypatch, paths_taken):
    """The GPU's attention kernels take no dense mask, and the stream's loop over tiles of CuPy
    operators would launch thousands of kernels: the plain path runs (on the CPU the stream)."""
    from fake_cupy import fake_cuda_backend

    from minitensor import backends

    monkeypatch.setitem(backends._BACKENDS, "cuda", fake_cuda_backend())
    ran = paths_taken
    for device in ("cuda", "cpu"):
        q, mask = mt.zeros(1, 2, 400, 4, device=device), mt.ones(400, 400, dtype=mt.bool, device=device)
        F.scaled_dot_product_attention(q, q, q, attn_mask=mask)
        F.scaled_dot_product_attention(q, q, q, is_causal=True)
    assert ran == ["plain", "stream", "stream", "stream"]


def test_broadcast_batch_axes_take_the_plain_path(monkeypatch):
    monkeypatch.setattr(sdpa, "_streamed", lambda *args: pytest.fail("streamed"))
    q, k = mt.randn(2, 3, 5, 4), mt.randn(1, 3, 5, 4)
    assert F.scaled_dot_product_attention(q, k, k).shape == (2, 3, 5, 4)


@pytest.mark.parametrize("L, S", [(5, 5), (5, 7), (400, 400)])
def test_dropout_drops_the_same_weights_on_both_paths(monkeypatch, L, S):
    """With one seed the stream (one tile at 5, tiles at 400) drops what the plain path drops:
    the same outputs and gradients."""
    shapes = (2, 3, L, 4), (2, 3, S, 4), (2, 3, S, 4)
    picked = sdpa._streamable
    results = []
    for streamable in (picked, lambda *args: False):
        monkeypatch.setattr(sdpa, "_streamable", streamable)
        q, k, v = leaves(np.random.default_rng(3), *shapes)
        mt.manual_seed(11)
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=0.3, is_causal=True)
        out.sum().backward()
        results.append([out.numpy(), q.grad.numpy(), k.grad.numpy(), v.grad.numpy()])
    for a, b in zip(*results, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
    undropped = F.scaled_dot_product_attention(q, k, v, is_causal=True).numpy()
    assert not np.allclose(results[0][0], undropped)


def test_dropout_keeps_1_minus_p_of_the_weights_whatever_the_mode(path):
    """The function has no training mode: dropout_p > 0 drops (nanoGPT passes 0 in evaluation).
    With V the identity the output is the dropped weights themselves."""
    S = 64
    q, k = mt.zeros(1, 4, S, 8), mt.zeros(1, 4, S, 8)  # uniform weights 1 / S
    v = mt.tensor(np.broadcast_to(np.eye(S), (1, 4, S, S)).copy(), dtype=mt.float32)
    mt.manual_seed(0)
    weights = F.scaled_dot_product_attention(q, k, v, dropout_p=0.25).numpy()
    kept = weights != 0
    assert 0.7 < kept.mean() < 0.8
    np.testing.assert_allclose(weights[kept], 1 / S / 0.75, rtol=1e-6)
    assert not F.scaled_dot_product_attention(q, k, v, dropout_p=1.0).numpy().any()


def test_a_training_step_on_the_device_never_waits(monkeypatch):
    """On the CuPy stand-in (which counts every read from the device): upper-left causal with
    L != S on the stream, the float-masked plain path, forward and backward, read nothing."""
    from fake_cupy import fake_cuda_backend
    from strict_backend import count_syncs

    from minitensor import backends

    monkeypatch.setitem(backends._BACKENDS, "cuda", fake_cuda_backend())
    rng = np.random.default_rng(4)
    for L, S, options in ((384, 400, {"is_causal": True, "dropout_p": 0.1}), (6, 9, {"attn_mask": "float"})):
        q, k, v = (
            mt.tensor(rng.standard_normal(s), device="cuda", requires_grad=True)
            for s in [(1, 2, L, 8), (1, 2, S, 8), (1, 2, S, 8)]
        )
        if options.get("attn_mask") == "float":
            options = {"attn_mask": mt.tensor(rng.standard_normal((L, S)), device="cuda")}
        with count_syncs() as log:
            F.scaled_dot_product_attention(q, k, v, **options).sum().backward()
        assert not log.waits, "\n".join(map(str, log.waits))
        want = reference(
            *(x.numpy() for x in (q, k, v)),
            is_causal=options.get("is_causal", False),
            attn_mask=None if "attn_mask" not in options else options["attn_mask"].numpy(),
        )
        if "dropout_p" not in options:
            np.testing.assert_allclose(F.scaled_dot_product_attention(q, k, v, **options).numpy(), want, rtol=1e-10)


@pytest.mark.parametrize(
    "call, error, words",
    [
        (lambda q: attend(q.numpy(), q, q), TypeError, "query must be a Tensor"),
        (lambda q: attend(q[0, 0, 0], q, q), mt.ShapeError, "at least 2 axes"),
        (lambda q: attend(q, q.to(mt.float32), q), mt.DTypeError, "one dtype"),
        (lambda q: attend(q, q[..., :3], q), mt.ShapeError, "the same E"),
        (lambda q: attend(q, q, q[..., :4, :]), mt.ShapeError, "the same S"),
        (lambda q: attend(q, q[:, :2], q[:, :2]), mt.ShapeError, "enable_gqa=True"),
        (lambda q: attend(q[:, :3], q[:, :2], q[:, :2], enable_gqa=True), mt.ShapeError, "must divide"),
        (lambda q: attend(q, q, q[:, :2]), mt.ShapeError, "same number of heads"),
        (lambda q: attend(q, q, q, attn_mask=mt.ones(5, 5, dtype=mt.int64)), mt.DTypeError, "bool"),
        (lambda q: attend(q, q, q, attn_mask=mt.zeros(5, 5, dtype=mt.float32)), mt.DTypeError, "float64"),
        (lambda q: attend(q, q, q, attn_mask=mt.ones(4, 5, dtype=mt.bool)), mt.ShapeError, "(4, 5)"),
        (lambda q: attend(q, q, q, attn_mask=[[True]]), TypeError, "attn_mask must be a Tensor"),
        (lambda q: attend(q, q, q, attn_mask=mt.ones(5, 5, dtype=mt.bool), is_causal=True), ValueError, "together"),
        (lambda q: attend(q, q, q, dropout_p=1.5), ValueError, "1.5"),
        (lambda q: attend(q, q, q, dropout_p="0.1"), TypeError, "dropout_p"),
        (lambda q: attend(q, q, q, is_causal="yes"), TypeError, "is_causal"),
        (lambda q: attend(q, q, q, scale="1"), TypeError, "scale"),
        (lambda q: attend(q, q, q, scale=float("nan")), ValueError, "scale must be a finite number"),  # all NaN
    ],
)  # fmt: skip
def test_wrong_inputs_are_named(call, error, words):
    q = mt.randn(2, 4, 5, 6, dtype=mt.float64)
    with pytest.raises(error, match="scaled_dot_product_attention") as raised:
        call(q)
    assert words in str(raised.value)


def test_mixed_devices_are_named(monkeypatch):
    from fake_cupy import fake_cuda_backend

    from minitensor import backends

    monkeypatch.setitem(backends._BACKENDS, "cuda", fake_cuda_backend())
    q = mt.randn(1, 2, 3, 4)
    with pytest.raises(mt.DeviceError, match="scaled_dot_product_attention: query is on 'cpu' but key on 'cuda'"):
        F.scaled_dot_product_attention(q, q.to("cuda"), q)
