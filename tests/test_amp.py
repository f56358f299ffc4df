"""``mt.autocast``: mixed precision in bfloat16 (``minitensor/core/amp.py``).

The products round to bfloat16 exactly as a tensor core does (checked bit for bit against the
operands rounded by ml_dtypes and multiplied in float32); the ops autocast keeps in float32
return float32; bfloat16 meeting float32 promotes; parameters and their gradients stay float32;
and a model trained in the block follows the float32 model's losses.
"""

import subprocess
import sys
import warnings

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from minitensor.nn import functional as F

import minitensor as mt
from minitensor import hookimpl

BF16 = np.dtype(ml_dtypes.bfloat16)


def rounded(a):
    """float32 values rounded to bfloat16 (to nearest, ties to even), as float32."""
    return np.asarray(a, np.float32).astype(BF16).astype(np.float32)


def data(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


# -- the dtype --------------------------------------------------------------------------------------
def test_bfloat16_is_ml_dtypes_and_converts_both_ways_differentiably():
    assert mt.bfloat16 == BF16
    x = mt.tensor([1.0, 1.0 + 2**-9, 3.14159], requires_grad=True)
    y = x.bfloat16()
    assert y.dtype == mt.bfloat16 and x.to(mt.bfloat16).dtype == mt.bfloat16 and x.to("bfloat16").dtype == BF16
    np.testing.assert_array_equal(y.float().numpy(), [1.0, 1.0, 3.140625])  # 8 bits of mantissa
    (y.float() * mt.tensor([1.0, 2.0, 3.0])).sum().backward()
    assert x.grad.dtype == mt.float32  # the gradient goes back in the leaf's dtype
    np.testing.assert_array_equal(x.grad.numpy(), [1.0, 2.0, 3.0])
    assert "dtype=bfloat16" in repr(y)
    assert mt.tensor(np.ones(2, BF16), requires_grad=True).requires_grad  # a float dtype: may require grad


def test_ml_dtypes_is_imported_by_the_first_use_of_bfloat16_not_by_float32_work(tmp_path):
    """``import ml_dtypes`` costs about a second (0.7): a float32 program never pays it. A
    float32 training step, a checkpoint saved and loaded, a float64 cast: no ml_dtypes. Then
    ``mt.bfloat16`` imports it; and a bfloat16 array made with the user's own ml_dtypes, before
    minitensor ever read ``mt.bfloat16``, is a bfloat16 tensor all the same."""
    code = "import minitensor as mt; print('bfloat16' in dir(mt), mt.ones(2).to('bfloat16').dtype)"
    first_use = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert first_use.stdout.split() == ["True", "bfloat16"], first_use.stderr[-2000:]  # before ml_dtypes is imported
    code = f"""
import sys
import minitensor as mt
from minitensor import nn

model = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.GELU(), nn.Dropout(0.1), nn.Linear(8, 3))
optimizer = mt.optim.AdamW(model.parameters(), lr=1e-3)
x, y = mt.randn(5, 4), mt.tensor([0, 1, 2, 0, 1])
loss = mt.cross_entropy(model(x), y)
loss.backward()
mt.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
optimizer.step()
mt.save(model.state_dict(), {str(tmp_path / "model.safetensors")!r})
model.load_state_dict(mt.load({str(tmp_path / "model.safetensors")!r}))
x.double().float().half().to("cpu")  # ("cpu" is asked whether it names a dtype: no import for that)
model.to("cpu")
with mt.autocast("cpu", enabled=False):  # (as minitensor train writes it for a float32 run)
    model(x)
assert "ml_dtypes" not in sys.modules, "float32 work imported ml_dtypes"

import ml_dtypes, numpy as np
t = mt.tensor(np.array([1.5, -2.0], ml_dtypes.bfloat16))
assert t.is_floating_point() and t.float().tolist() == [1.5, -2.0], t
assert t.dtype == mt.bfloat16 and mt.zeros(2).bfloat16().dtype == t.dtype
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_a_dtype_name_means_the_same_whatever_ran_before_and_a_wrong_one_names_the_function():
    """ml_dtypes' other names (float8_e4m3fn) are known in a fresh process too, where NumPy learns
    them only once ml_dtypes is imported; a name that is no dtype is refused by the function
    given it."""
    code = "import minitensor as mt; print(mt.zeros(2, dtype='float8_e4m3fn').dtype)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "float8_e4m3fn", done.stderr[-2000:]
    assert mt.nn.Linear(2, 2).to("float64").weight.dtype == mt.float64  # a dtype's name, as x.to takes it
    assert mt.nn.Linear(2, 2).to("bfloat16").weight.dtype == mt.bfloat16
    for call, op in [
        (lambda: mt.zeros(2, dtype="bf16"), "zeros"),
        (lambda: mt.tensor([1.0], dtype="bf16"), "tensor"),
        (lambda: mt.ones(2).to(dtype="bf16"), "to"),
        (lambda: mt.autocast("cpu", dtype="bfloat17"), "autocast"),
        (lambda: mt.arange(3, dtype="bf16"), "arange"),
    ]:
        with pytest.raises(TypeError, match=rf"^{op}: not a dtype: 'bf(16|loat17)' \(use e.g. .*mt.bfloat16"):
            call()


@pytest.mark.parametrize(
    "dtype, eps, largest, tiny",
    [(None, 2**-23, 3.4028234663852886e38, 2**-126), (mt.float64, 2**-52, 1.7976931348623157e308, 2**-1022),
     (mt.float16, 2**-10, 65504.0, 2**-14), ("bfloat16", 2**-7, 3.3895313892515355e38, 2**-126)],
)  # fmt: skip
def test_finfo_gives_a_float_dtypes_limits_and_is_floating_point_its_kind(dtype, eps, largest, tiny):
    info = mt.finfo(dtype)
    assert float(info.eps) == eps and float(info.max) == largest and float(info.min) == -largest
    assert float(info.tiny) == tiny
    x = mt.zeros(2, dtype=dtype or mt.float32)
    assert mt.is_floating_point(x) and x.is_floating_point()
    assert not mt.is_floating_point(mt.zeros(2, dtype=mt.int64))
    with pytest.raises(TypeError, match="^finfo: int64 is not a floating-point dtype"):
        mt.finfo(mt.int64)


def test_finfo_min_masks_a_row_without_nan():
    scores = mt.tensor([[0.5, -1.0, 2.0], [0.1, 0.2, 0.3]])
    allowed = mt.tensor([[True, False, True], [False, False, False]])
    weights = mt.softmax(scores.masked_fill(~allowed, mt.finfo(scores.dtype).min), dim=-1).numpy()
    assert weights[0, 1] == 0 and np.allclose(weights[1], 1 / 3)  # an all-masked row: uniform, not NaN


def test_finfo_is_pytorchs():
    torch = pytest.importorskip("torch")
    for dtype, theirs in ((mt.float32, torch.float32), (mt.bfloat16, torch.bfloat16), (mt.float16, torch.float16)):
        ours, theirs = mt.finfo(dtype), torch.finfo(theirs)
        for field in ("eps", "max", "min", "tiny", "smallest_normal"):
            assert float(getattr(ours, field)) == getattr(theirs, field), (dtype, field)
        assert ours.bits == theirs.bits and float(ours.resolution) == pytest.approx(theirs.resolution, rel=1e-3)


def test_arange_takes_a_fractional_step_in_bfloat16_as_in_float16():
    np.testing.assert_array_equal(mt.arange(0, 1, 0.25, dtype=mt.bfloat16).float().numpy(), [0, 0.25, 0.5, 0.75])
    assert mt.arange(0, 1, 0.25, dtype="bfloat16").dtype == mt.bfloat16


def test_outside_autocast_bfloat16_and_float32_do_not_mix_silently():
    a, b = mt.ones(3).bfloat16(), mt.ones(3)
    with pytest.raises(mt.DTypeError, match=r"bfloat16 and float32|float32 and bfloat16"):
        a + b
    with pytest.raises(mt.DTypeError, match="bfloat16"):
        mt.nn.Linear(3, 2)(a)


def test_low_precision_sums_are_taken_in_float32():
    """A bfloat16 running sum stops at 256 (256 + 1 rounds back to 256); sums, means and the
    gradient of a broadcast are taken in float32 and rounded once."""
    ones = mt.ones(4096).bfloat16()
    assert ones.sum().dtype == mt.bfloat16 and float(ones.sum()) == 4096.0
    assert float(ones.mean()) == 1.0
    a = mt.tensor([0.5], requires_grad=True)
    b = mt.zeros(4096)
    (a.bfloat16() + b.bfloat16()).float().sum().backward()  # dL/da sums 4096 ones over the broadcast
    assert float(a.grad[0]) == 4096.0


# -- the rules ------------------------------------------------------------------------------------
def test_matmul_rounds_operands_and_result_as_a_tensor_core():
    a, b = data(5, 7), data(7, 3, seed=1)
    with mt.autocast("cpu"):
        z = mt.tensor(a) @ mt.tensor(b)
    assert z.dtype == mt.bfloat16
    expected = (rounded(a) @ rounded(b)).astype(BF16)
    np.testing.assert_array_equal(z.numpy(), expected)
    assert not np.array_equal(z.float().numpy(), a @ b)  # it did round


def test_linear_in_autocast_and_its_float32_gradients():
    """y = round(round(x) round(W)^T + round(b)), one rounding after the bias as in PyTorch's
    autocast (its CPU linear gives these very bits); backward in bfloat16 products, and the
    float32 parameters get float32 gradients (the rounding's backward turns them back)."""
    x_, W_, b_ = data(4, 6), data(3, 6, seed=1), data(3, seed=2)
    layer = mt.nn.Linear(6, 3)
    layer.weight.data[...] = W_
    layer.bias.data[...] = b_
    x = mt.tensor(x_, requires_grad=True)
    with mt.autocast("cpu"):
        y = layer(x)
        loss = (y * mt.tensor(np.arange(12, dtype=np.float32).reshape(4, 3))).sum()
    assert y.dtype == mt.bfloat16 and loss.dtype == mt.float32
    xb, Wb, bb = (rounded(v) for v in (x_, W_, b_))
    np.testing.assert_array_equal(y.float().numpy(), rounded(xb @ Wb.T + bb))
    loss.backward()
    for p in (x, layer.weight, layer.bias):
        assert p.grad.dtype == mt.float32
    g = rounded(np.arange(12, dtype=np.float32).reshape(4, 3))  # dL/dy, rounded to y's dtype
    np.testing.assert_array_equal(layer.weight.grad.numpy(), rounded(g.T @ xb))
    np.testing.assert_array_equal(x.grad.numpy(), rounded(g @ Wb))
    np.testing.assert_array_equal(layer.bias.grad.numpy(), rounded(g.sum(axis=0)))


def test_products_give_pytorchs_autocast_results():
    """Against ``torch.autocast("cpu", dtype=torch.bfloat16)`` where PyTorch is installed: a Linear
    with its bias, a matmul and a batched one give PyTorch's bfloat16 numbers (its float32 sums,
    taken in another order, may round a rare element to the neighbouring bfloat16)."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    x, W = rng.standard_normal((64, 96), np.float32), rng.standard_normal((48, 96), np.float32)
    b = 3 * rng.standard_normal(48).astype(np.float32)
    q, k = rng.standard_normal((2, 4, 16, 32), np.float32), rng.standard_normal((2, 4, 24, 32), np.float32)
    Wt = np.ascontiguousarray(W.T)
    with mt.autocast("cpu"):
        ours = [
            mt.linear(*map(mt.tensor, (x, W, b))),
            mt.tensor(x) @ mt.tensor(Wt),
            mt.tensor(q) @ mt.tensor(k).swapaxes(-1, -2),
        ]
    t = torch.from_numpy
    with torch.autocast("cpu", dtype=torch.bfloat16):
        theirs = [torch.nn.functional.linear(t(x), t(W), t(b)), t(x) @ t(Wt), t(q) @ t(k).transpose(-1, -2)]
    for mine, torchs in zip(ours, theirs, strict=True):
        assert mine.dtype == mt.bfloat16 and torchs.dtype == torch.bfloat16
        mine, torchs = mine.float().numpy(), torchs.float().numpy()
        assert np.mean(mine == torchs) > 0.99
        np.testing.assert_allclose(mine, torchs, rtol=2**-7)


def _scores(x):
    return x.reshape(2, 3, 4)


FLOAT32_OPS = {
    "softmax": lambda x: F.softmax(x, -1),
    "log_softmax": lambda x: F.log_softmax(x, -1),
    "masked_softmax": lambda x: mt.masked_softmax(_scores(x), mt.tensor([2, 4])),
    "layer_norm": lambda x: F.layer_norm(x, (4,)),
    "cross_entropy": lambda x: F.cross_entropy(x, mt.tensor([0, 1, 2, 3, 0, 1])),
    "mse_loss": lambda x: F.mse_loss(x, mt.zeros(6, 4)),
    "sum": lambda x: x.sum(),
    "mean": lambda x: x.mean(axis=0),
    "var": lambda x: x.var(),
    "std": lambda x: x.std(axis=1),
    "norm": lambda x: mt.norm(x),
    "logsumexp": lambda x: x.logsumexp(axis=1),
    "cumsum": lambda x: x.cumsum(axis=1),
    "prod": lambda x: x.prod(axis=1),
    "exp": lambda x: x.exp(),
    "log": lambda x: x.abs().log(),
    "flash_attention": lambda x: mt.flash_attention(*(x.reshape(1, 2, 3, 4) for _ in range(3)), causal=True),
    "scaled_dot_product_attention": lambda x: F.scaled_dot_product_attention(*(_scores(x),) * 3, is_causal=True),
}


@pytest.mark.parametrize("op", FLOAT32_OPS.values(), ids=FLOAT32_OPS.keys())
def test_ops_autocast_keeps_in_float32_take_bfloat16_and_return_float32(op):
    x = mt.tensor(data(6, 4), requires_grad=True)
    with mt.autocast("cpu"):
        out = op(x.bfloat16())
    assert out.dtype == mt.float32
    reference = op(mt.tensor(rounded(x.numpy())))  # the same op in float32 on the rounded input
    np.testing.assert_allclose(out.numpy(), reference.numpy(), rtol=1e-6, atol=1e-6)
    out.sum().backward()
    assert x.grad.dtype == mt.float32 and np.isfinite(x.grad.numpy()).all()


OTHER_OPS = {
    "gelu": F.gelu,
    "relu": F.relu,
    "tanh": mt.tanh,
    "dropout": lambda x: F.dropout(x, 0.5, training=True),
    "transpose": lambda x: x.transpose(0, 1),
    "times a number": lambda x: x * 0.5,
}


@pytest.mark.parametrize("op", OTHER_OPS.values(), ids=OTHER_OPS.keys())
def test_other_ops_run_in_the_dtype_they_are_given(op):
    x = mt.tensor(data(6, 4)).bfloat16()
    with mt.autocast("cpu"):
        assert op(x).dtype == mt.bfloat16
        assert op(x.float()).dtype == mt.float32


def test_gelu_in_bfloat16_is_the_float32_gelu_rounded_once():
    x = mt.tensor(data(64, 8) * 3)
    expected = F.gelu(mt.tensor(rounded(x.numpy()))).numpy().astype(BF16)
    np.testing.assert_array_equal(F.gelu(x.bfloat16()).numpy(), expected)


@pytest.mark.parametrize("p", [0.1, 0.2])
def test_dropout_in_bfloat16_is_the_float32_dropout_rounded_once(p, device):
    """The same mask as float32's for the same seed, the survivors scaled in float32 (1/0.9 not
    rounded to 8 bits first) and rounded once, forward and backward (its upstream gradient exact
    in bfloat16), on every device."""
    x_ = rounded(data(64, 33))
    results = {}
    for dtype in (mt.bfloat16, mt.float32):
        x = mt.tensor(x_, device=device).to(dtype).requires_grad_()
        mt.manual_seed(5)
        y = F.dropout(x, p)
        (
            y.float() * mt.tensor(np.arange(64 * 33.0).reshape(64, 33) % 17, dtype=mt.float32, device=device)
        ).sum().backward()
        assert y.dtype == x.grad.dtype == dtype
        results[dtype] = y.float().numpy(), x.grad.float().numpy()
    for low, full in zip(results[mt.bfloat16], results[mt.float32], strict=True):
        np.testing.assert_array_equal(low, rounded(full))


@pytest.mark.parametrize("name", ["sigmoid", "gelu_tanh", "tanh"])
def test_functions_of_several_steps_take_bfloat16_through_float32(name):
    """Sigmoid, the tanh GELU and tanh's derivative are computed in float32 and rounded once, as
    PyTorch's kernels do: step by step in bfloat16, 1 + tanh(a/2) cancels to 0 and sigmoid(-8)
    came out 0 (3.4e-4), its gradient 0 with it. Backward reads the saved output, rounded, as
    PyTorch's does (sigmoid's z (1 - z), tanh's 1 - z^2)."""
    op = {"sigmoid": mt.sigmoid, "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"), "tanh": mt.tanh}[name]
    a_ = rounded(np.concatenate([[-8.0, -5.0, -3.0625], data(200) * 3]))
    g_ = rounded(data(a_.size, seed=1))
    a = mt.tensor(a_).bfloat16().requires_grad_()
    y = op(a)
    y.backward(mt.tensor(g_).bfloat16())
    assert y.dtype == a.grad.dtype == mt.bfloat16
    full = mt.tensor(a_, requires_grad=True)
    op(full).backward(mt.tensor(g_))
    z = y.float().numpy()
    np.testing.assert_array_equal(z, rounded(op(mt.tensor(a_)).numpy()))
    want = {"sigmoid": g_ * z * (1 - z), "tanh": g_ * (1 - z * z), "gelu_tanh": full.grad.numpy()}[name]
    np.testing.assert_array_equal(a.grad.float().numpy(), rounded(want))
    if name == "sigmoid":
        assert z[0] > 3e-4 and a.grad.float().numpy()[0] != 0


def test_a_bfloat16_linear_adds_its_bias_before_the_one_rounding():
    """Outside a block too (``model.bfloat16()``), as PyTorch's addmm: round(x W^T + b), where
    rounding the product first lost b = 2^-8 against 1."""
    x, w, b = (mt.tensor(v).bfloat16() for v in ([[1.0, 1.0]], [[1.0, 2**-8]], [2**-8]))
    assert mt.linear(x, w, b).item() == 1 + 2**-7
    layer = mt.nn.Linear(6, 3).bfloat16()
    x = mt.tensor(data(4, 6)).bfloat16()
    want = rounded(x.float().numpy() @ layer.weight.float().numpy().T + layer.bias.float().numpy())
    np.testing.assert_array_equal(layer(x).float().numpy(), want)


def test_a_float64_bias_is_refused_inside_the_block_as_outside():
    x, w, b = mt.randn(2, 4), mt.randn(3, 4), mt.randn(3, dtype=mt.float64)
    for enabled in (True, False):
        with mt.autocast("cpu", enabled=enabled), pytest.raises(mt.DTypeError, match="float32 and float64"):
            mt.linear(x, w, b)


def test_bfloat16_meeting_float32_promotes_inside_autocast():
    a = mt.tensor(data(3, 4), requires_grad=True)
    b = mt.tensor(data(4, seed=1), requires_grad=True)
    with mt.autocast("cpu"):
        for z in (a.bfloat16() + b, b * a.bfloat16(), mt.cat([a.bfloat16(), b[None]]), mt.stack([b, b.bfloat16()])):
            assert z.dtype == mt.float32
        z = a.bfloat16() + b
    z.sum().backward()
    assert a.grad.dtype == b.grad.dtype == mt.float32
    np.testing.assert_array_equal(b.grad.numpy(), np.full(4, 3.0))


# -- the block ------------------------------------------------------------------------------------
def test_the_block_covers_its_device_type_only_and_nests():
    x, layer = mt.randn(2, 3), mt.nn.Linear(3, 4)
    with mt.autocast("cuda"):  # CPU tensors are left alone, as in PyTorch
        assert layer(x).dtype == mt.float32
        assert mt.is_autocast_enabled("cuda") and not mt.is_autocast_enabled("cpu")
    with mt.autocast("cpu"):
        assert layer(x).dtype == mt.bfloat16
        with mt.autocast("cpu", enabled=False):
            assert layer(x).dtype == mt.float32 and not mt.is_autocast_enabled("cpu")
        assert layer(x).dtype == mt.bfloat16 and mt.get_autocast_dtype("cpu") == mt.bfloat16
    assert layer(x).dtype == mt.float32 and not mt.is_autocast_enabled("cpu")


def test_the_block_is_restored_after_an_exception_and_works_as_a_decorator():
    layer = mt.nn.Linear(3, 4)

    @mt.autocast("cpu")
    def forward(x):
        return layer(x)

    assert forward(mt.randn(2, 3)).dtype == mt.bfloat16
    with pytest.raises(ZeroDivisionError), mt.autocast("cpu"):
        1 / 0
    assert layer(mt.randn(2, 3)).dtype == mt.float32


def test_wrong_arguments_name_what_is_taken():
    with pytest.raises(ValueError, match=r"device_type must be one of 'cpu', 'cuda', got 'tpu'"):
        mt.autocast("tpu")
    with pytest.raises(ValueError, match=r"mt.bfloat16, got float16.*GradScaler"):
        mt.autocast("cuda", dtype=mt.float16)
    with pytest.raises(TypeError, match="enabled must be True or False, got 'yes'"):
        mt.autocast("cpu", enabled="yes")
    with pytest.raises(TypeError):
        mt.autocast()  # device_type is required, as in PyTorch


@settings(max_examples=25, deadline=None)
@given(
    batch=st.lists(st.integers(1, 3), max_size=2),
    n=st.integers(1, 5),
    k=st.integers(1, 9),
    m=st.integers(1, 5),
    broadcast=st.booleans(),
)
def test_batched_products_round_as_the_reference(batch, n, k, m, broadcast):
    rng = np.random.default_rng(len(batch) * 100 + n * 10 + k)
    a_ = rng.standard_normal((*batch, n, k)).astype(np.float32)
    b_ = rng.standard_normal((k, m) if broadcast else (*batch, k, m)).astype(np.float32)
    a, b = mt.tensor(a_, requires_grad=True), mt.tensor(b_, requires_grad=True)
    with mt.autocast("cpu"):
        z = a @ b
    assert z.dtype == mt.bfloat16
    np.testing.assert_array_equal(z.numpy(), (rounded(a_) @ rounded(b_)).astype(BF16))
    z.float().sum().backward()
    assert a.grad.dtype == b.grad.dtype == mt.float32 and a.grad.shape == a.shape and b.grad.shape == b.shape


# -- plugins and models ---------------------------------------------------------------------------
class RecordingPooling(mt.nn.Module):
    """A learner's pooling: a softmax written with ops, noting the dtype of the scores it gets."""

    seen = []

    def __init__(self, **options):
        super().__init__()

    def forward(self, scores, valid_lens=None, mask=None):
        RecordingPooling.seen.append(scores.dtype)
        if mask is not None:
            scores = scores.masked_fill(~mask, -1e9)
        e = (scores - scores.max(axis=-1, keepdims=True).detach()).exp()
        return e / e.sum(axis=-1, keepdims=True)


class UserPlugins:
    @hookimpl
    def minitensor_poolings(self):
        return {"recording_softmax": RecordingPooling}


def test_a_users_pooling_gets_float32_scores_from_bfloat16_products():
    plugin = UserPlugins()
    mt.plugins.register(plugin)
    try:
        mha = mt.nn.MultiHeadAttention(8, 2, pooling="recording_softmax")
        X = mt.randn(2, 5, 8)
        RecordingPooling.seen.clear()
        with mt.autocast("cpu"):
            out = mha(X, X, X, causal=True)
        assert RecordingPooling.seen == [mt.float32]
        assert out.dtype == mt.bfloat16  # W_o's product
    finally:
        mt.plugins.unregister(plugin)


def _lm(**options):
    mt.manual_seed(0)
    return mt.nn.TransformerLM(
        vocab_size=16, num_hiddens=32, ffn_num_hiddens=64, num_heads=4, num_blks=2, dropout=0.0, max_len=16,
        norm_first=True, activation="gelu", bias=False, tie_embeddings=True, **options,
    )  # fmt: skip


LM_OPTIONS = {
    "streamed": {"fused": True},
    "plain attention": {"fused": False},  # bfloat16 scores, float32 softmax, bfloat16 weights @ values
    "rotary, grouped heads": {"positional": "rotary", "num_kv_heads": 2},  # float32 keys, bfloat16 values
    "alibi": {"positional": "alibi", "fused": False},  # a float32 bias on bfloat16 scores
}


@pytest.mark.parametrize("options", LM_OPTIONS.values(), ids=LM_OPTIONS.keys())
def test_a_language_model_trained_in_autocast_follows_the_float32_losses(options):
    """The same model from the same weights on the same batches: in autocast its losses follow
    the float32 run's within bfloat16's error, and both learn (a sequence that counts mod 16)."""
    rng = np.random.default_rng(0)
    starts = rng.integers(0, 16, (40, 8, 1))
    counts = [mt.tensor((s + np.arange(12)) % 16) for s in starts]
    batches = [(c[:, :-1], c[:, 1:]) for c in counts]
    losses = {}
    for mixed in (False, True):
        model = _lm(**options)
        optimizer = mt.optim.AdamW(model.parameters(), lr=3e-3)
        losses[mixed] = []
        for X, Y in batches:
            optimizer.zero_grad()
            with mt.autocast("cpu", enabled=mixed):
                loss = F.cross_entropy(model(X), Y)
            loss.backward()
            optimizer.step()
            losses[mixed].append(loss.item())
        assert all(p.dtype == mt.float32 for p in model.parameters())
    full, mixed = np.array(losses[False]), np.array(losses[True])
    assert full[-5:].mean() < 0.5 * full[:5].mean() and mixed[-5:].mean() < 0.5 * mixed[:5].mean()
    np.testing.assert_allclose(mixed[:3], full[:3], rtol=2e-3)  # bfloat16's 2^-8, shared by many products
    assert abs(mixed[-5:].mean() - full[-5:].mean()) < 0.02


# -- the command line -----------------------------------------------------------------------------
def test_train_autocast_trains_resumes_and_says_so(tmp_path, capsys):
    """``minitensor train --autocast``: the header says so, the run learns as the float32 run does
    (the same data and initial weights), the checkpoint's weights are float32, and a resumed run
    may turn it off (a setting of how to compute, not of what is learned)."""
    from minitensor import cli
    from minitensor.train.checkpoint import load_checkpoint

    args = ["train", "--task", "reverse", "--num-train", "512", "--num-heldout", "32", "--max-len", "5"]
    args += ["--batch-size", "32", "--num-blks", "1", "--num-hiddens", "32", "--ffn-num-hiddens", "64"]
    args += ["--epochs", "6", "--lr", "0.005", "--no-progress"]
    held_out = {}
    for mixed in (False, True):
        out = tmp_path / f"run{mixed}"
        assert cli.main([*args, "--out", str(out), *(["--autocast"] if mixed else [])]) == 0
        text = capsys.readouterr().out
        assert ("(bfloat16 autocast)" in text) == mixed
        held_out[mixed] = float(text.split(", loss ")[-1].split()[0])  # the final report's
    # from 2.7 at the start (about ln 14, a guess among the task's tokens) to 0.6 in 96 steps
    assert held_out[True] < 1.0 and abs(held_out[True] - held_out[False]) < 0.05, held_out
    weights = load_checkpoint(str(tmp_path / "runTrue" / "checkpoint"))["state_dict"]
    assert {t.dtype for t in weights.values()} == {mt.float32}
    assert cli.main(["train", "--resume", "--no-autocast", "--epochs", "7", "--out", str(tmp_path / "runTrue")]) == 0
    assert "at step 96 (epoch 6)\n" in capsys.readouterr().out  # nothing said of autocast
    assert cli.main(["train", "--resume", "--autocast", "--epochs", "8", "--out", str(tmp_path / "runTrue")]) == 0
    assert "at step 112 (epoch 7), in bfloat16 autocast" in capsys.readouterr().out


def test_each_device_type_has_its_own_block():
    """As in PyTorch: turning "cuda" off inside a "cpu" block leaves the CPU's on."""
    layer = mt.nn.Linear(3, 4)
    with mt.autocast("cpu"), mt.autocast("cuda", enabled=False):
        assert mt.is_autocast_enabled("cpu") and not mt.is_autocast_enabled("cuda")
        assert layer(mt.randn(2, 3)).dtype == mt.bfloat16
    x = mt.randn(2, 3, dtype=mt.float64)
    with mt.autocast("cpu"):
        assert (x @ x.T).dtype == mt.float64  # float64 is left alone, as PyTorch leaves it


# -- what a PyTorch user's code meets (a probe of the first version found each of these) ---------
def test_the_gru_runs_its_recurrence_in_float32_inside_the_block():
    """The inputs' share of the gates is a product (bfloat16); the recurrence carries its state
    from step to step and runs in float32, so D2L's GRU encoder-decoders train in the block."""
    mt.manual_seed(0)
    gru, cell = mt.nn.GRU(8, 16, num_layers=2), mt.nn.GRUCell(8, 16)
    X = mt.randn(5, 3, 8)
    full, _ = gru(X)
    with mt.autocast("cpu"):
        out, H = gru(X)
        h = cell(X[0])
    assert out.dtype == H.dtype == h.dtype == mt.float32
    np.testing.assert_allclose(out.numpy(), full.numpy(), atol=2e-2)
    out.sum().backward()
    assert {p.grad.dtype for p in gru.parameters()} == {mt.float32}


@pytest.mark.parametrize("conv, shape", [(mt.nn.Conv1d(4, 6, 3), (2, 4, 10)), (mt.nn.Conv2d(4, 6, 3), (2, 4, 5, 6))])
def test_convolutions_are_products(conv, shape):
    with mt.autocast("cpu"):
        assert conv(mt.randn(*shape)).dtype == mt.bfloat16
        assert conv(mt.randn(*shape).bfloat16()).dtype == mt.bfloat16
        y = conv(mt.randn(*shape))
    y.float().sum().backward()
    assert conv.weight.grad.dtype == conv.bias.grad.dtype == mt.float32


def test_scaled_dot_product_attention_takes_the_dtypes_autocast_makes():
    """RoPE makes queries and keys float32 where the values stay bfloat16: the call rounds all
    three (and a float mask) to bfloat16, as PyTorch's autocast does."""
    v = mt.nn.Linear(8, 8)(mt.randn(1, 2, 4, 8))
    q = k = mt.randn(1, 2, 4, 8)
    with mt.autocast("cpu"):
        v = mt.nn.Linear(8, 8)(mt.randn(1, 2, 4, 8))
        for options in ({"is_causal": True}, {"attn_mask": mt.randn(4, 4)}, {"attn_mask": mt.ones(4, 4) > 0}):
            out = F.scaled_dot_product_attention(q, k, v, **options)
            assert out.dtype in (mt.bfloat16, mt.float32) and out.shape == (1, 2, 4, 8)


def test_an_int8_cache_keeps_float32_keys_beside_bfloat16_values():
    """(Quantised in float32: in bfloat16 a code of 255 rounded up would be 256, past uint8.)"""
    lm = _lm(positional="rotary")
    logits = {}
    with mt.no_grad(), mt.autocast("cpu"), warnings.catch_warnings():
        warnings.simplefilter("error")  # no invalid cast
        for cache in ("full", "int8"):
            _, state = lm.decode_step(mt.tensor([[1, 2, 3]]), lm.begin_decoding(cache=cache))
            logits[cache], state = lm.decode_step(mt.tensor([[4]]), state)
    assert logits["int8"].dtype == mt.bfloat16
    np.testing.assert_allclose(logits["int8"].float().numpy(), logits["full"].float().numpy(), atol=0.1)


def test_reductions_of_bfloat16_tensors_sum_in_float32_outside_the_block():
    """Each result is the float32 reduction of the same numbers rounded once (a bfloat16 running
    sum of 4,096 numbers near 30 would stop near 8,192 and give a variance of 64 for 1)."""
    x = mt.tensor(np.random.default_rng(0).standard_normal(4096).astype(np.float32) + 30).bfloat16()
    for op in (mt.var, mt.std, mt.norm, lambda t: mt.logsumexp(t, 0), lambda t: mt.cumsum(t, 0), mt.sum, mt.mean):
        got, want = op(x), op(x.float())
        assert got.dtype == mt.bfloat16
        np.testing.assert_array_equal(got.numpy(), want.numpy().astype(BF16))
    ln = mt.nn.LayerNorm(64).bfloat16()
    z = mt.randn(8, 64).bfloat16()
    np.testing.assert_array_equal(ln(z).numpy(), F.layer_norm(z.float(), (64,)).numpy().astype(BF16))


def test_numbers_written_into_bfloat16_keep_it_bfloat16():
    q = mt.randn(1, 2, 4, 8).bfloat16()
    scores = (q @ q.transpose(-2, -1)).masked_fill(mt.tril(mt.ones(4, 4)) == 0, float("-inf"))  # nanoGPT's
    assert scores.dtype == mt.bfloat16 and (F.softmax(scores, -1).bfloat16() @ q).dtype == mt.bfloat16
    x = mt.tensor([-2.0, 0.5, 3.0]).bfloat16()
    for y in (mt.where(x > 0, 0.0, x), mt.where(x > 0, x, 0.0), x.clamp(-1, 1), x.masked_fill(x > 0, -1e9)):
        assert y.dtype == mt.bfloat16
    assert float(x.masked_fill(x > 0, -1e9)[1]) == float(np.float32(-1e9).astype(BF16))  # rounded as stored
    assert str(mt.relu(x)[0].item()) == "0.0"  # not -0.0


def test_topk_sort_save_load_and_random_numbers_in_bfloat16(tmp_path):
    x = mt.tensor([3.0, -1.0, 2.0, 2.5]).bfloat16()
    assert mt.topk(x, 2).indices.tolist() == [0, 3] and mt.sort(x).values.dtype == mt.bfloat16
    with pytest.raises(TypeError, match="sort: needs a tensor of numbers, got bool"):
        mt.sort(mt.tensor([True, False]))
    mt.save({"w": x, "i": mt.tensor([1, 2])}, tmp_path / "w.safetensors")
    back = mt.load(tmp_path / "w.safetensors")
    assert back["w"].dtype == mt.bfloat16 and back["w"].tolist() == x.tolist() and back["i"].dtype == mt.int64
    mt.manual_seed(0)
    for t in (mt.randn(3, dtype=mt.bfloat16), mt.rand(3, dtype=mt.bfloat16), mt.randn_like(x), mt.rand_like(x)):
        assert t.dtype == mt.bfloat16
    assert mt.normal(0.0, 1.0, size=(3,), dtype=mt.bfloat16).dtype == mt.bfloat16
    assert float(mt.rand(100_000, dtype=mt.bfloat16).max()) < 1.0  # float32 draws near 1 would round up to 1
    assert mt.from_numpy(np.ones(2, BF16)).dtype == mt.bfloat16


def test_a_bfloat16_model_runs_in_the_block_too():
    """``model.bfloat16()`` (weights bfloat16, as ``half()`` makes them float16): inside the block
    its layer norm runs in float32 on float32 copies of its weights, as in PyTorch."""
    model = _lm().bfloat16()
    assert {p.dtype for p in model.parameters()} == {mt.bfloat16}
    X = mt.tensor([[1, 2, 3, 4]])
    with mt.autocast("cpu"):
        loss = F.cross_entropy(model(X), mt.tensor([[2, 3, 4, 5]]))
    loss.backward()
    assert loss.dtype == mt.float32 and {p.grad.dtype for p in model.parameters()} == {mt.bfloat16}


def test_an_onnx_export_inside_the_block_is_refused():
    pytest.importorskip("onnx")
    from minitensor.onnx import ExportError

    with mt.autocast("cpu"), pytest.raises(ExportError, match="inside mt.autocast.*export outside the block"):
        mt.onnx.export(mt.nn.Linear(2, 2), mt.randn(1, 2), "never-written.onnx")
    with pytest.raises(ValueError, match="got float32; the products' lower precision is the point"):
        mt.autocast("cpu", dtype=mt.float32)
