"""Every differentiable op, gradchecked in float64 on every device ("cpu" and "strict").

``mt.gradcheck`` compares backward with central finite differences. Inputs avoid the
points where an op is not differentiable (|x| near 0 for abs/relu, values near clip bounds,
ties for max/min).
"""

import math

import numpy as np
import pytest
from helpers import OPERATOR, check, distinct, rand
from minitensor.autograd import Function

import minitensor as mt

BROADCAST_PAIRS = [
    ((3, 4), (3, 4)),
    ((3, 1), (4,)),
    ((2, 3, 4), (3, 1)),
    ((), (2, 3)),
    ((2, 1, 4), (1, 3, 1)),
    ((4,), (2, 3, 4)),
]


# -- binary arithmetic, with broadcasting -----------------------------------------------------
@pytest.mark.parametrize("sa,sb", BROADCAST_PAIRS)
@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "pow"])
def test_binary_broadcasting(device, op, sa, sb):
    a = rand(device, *sa, low=0.5, high=2.0, seed=1) if op == "pow" else rand(device, *sa, seed=1)
    b = rand(device, *sb, away=0.5, seed=2)
    check(OPERATOR[op], a, b)
    # the functional form is the same op
    check(getattr(mt, op), a, b)


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: x + 2.0,
        lambda x: 2.0 + x,
        lambda x: x - 3,
        lambda x: 3.0 - x,
        lambda x: x * 1.5,
        lambda x: -2 * x,
        lambda x: x / 4.0,
        lambda x: 3.0 / x,
        lambda x: x**2,
        lambda x: x**3.0,
        lambda x: x**0.5,
        lambda x: x**-1.5,
        lambda x: 2.0**x,
        lambda x: -x,
        lambda x: mt.neg(x),
    ],
    ids=[
        "x+2",
        "2+x",
        "x-3",
        "3-x",
        "x*1.5",
        "-2*x",
        "x/4",
        "3/x",
        "x**2",
        "x**3.",
        "x**.5",
        "x**-1.5",
        "2**x",
        "-x",
        "neg",
    ],
)
def test_scalar_constants(device, fn):
    check(fn, rand(device, 3, 4, low=0.5, high=2.0))


def test_pow_tensor_exponent_gets_gradient(device):
    a = rand(device, 2, 3, low=0.5, high=2.0, seed=3)
    p = rand(device, 2, 3, low=-2, high=2, seed=4)
    check(lambda a, p: a**p, a, p)
    check(lambda a, p: mt.pow(a, p), a, p)


def test_pow_tensor_exponent_at_zero_base_is_finite(device):
    a = mt.tensor([0.0, 2.0], dtype=mt.float64, device=device)
    p = mt.tensor([2.0, 3.0], dtype=mt.float64, device=device, requires_grad=True)
    (a**p).sum().backward()
    np.testing.assert_allclose(p.grad.numpy(), [0.0, 8 * np.log(2.0)])


# -- functions of one variable ----------------------------------------------------------------
UNARY = {
    "exp": (lambda x: x.exp(), {}),
    "mt.exp": (lambda x: mt.exp(x), {}),
    "log": (lambda x: x.log(), {"low": 0.2, "high": 3.0}),
    "sqrt": (lambda x: x.sqrt(), {"low": 0.2, "high": 3.0}),
    "tanh": (lambda x: x.tanh(), {}),
    "sigmoid": (lambda x: x.sigmoid(), {"low": -6, "high": 6}),
    "relu": (lambda x: x.relu(), {"away": 0.1}),
    "gelu": (lambda x: x.gelu(), {"low": -4, "high": 4}),
    "abs": (lambda x: x.abs(), {"away": 0.1}),
    "clip both": (lambda x: x.clip(-0.95, 1.05), {"low": -2, "high": 2}),
    "clip min": (lambda x: mt.clip(x, min=0.05), {}),
    "clip max": (lambda x: mt.clamp(x, max=0.55), {}),
}


@pytest.mark.parametrize("name", list(UNARY))
def test_unary(device, name):
    fn, kw = UNARY[name]
    x = rand(device, 3, 5, **kw)
    if name.startswith("clip"):  # keep clear of the kinks
        for bound in (-0.95, 1.05, 0.05, 0.55):
            assert np.abs(x.numpy() - bound).min() > 1e-3
    check(fn, x)


def test_unary_forward_values(device):
    a = np.array([[-3.0, -0.5, 0.25, 2.0]])
    x = mt.tensor(a, device=device)
    np.testing.assert_allclose(x.exp().numpy(), np.exp(a))
    np.testing.assert_allclose(x.tanh().numpy(), np.tanh(a))
    np.testing.assert_allclose(x.sigmoid().numpy(), 1 / (1 + np.exp(-a)))
    np.testing.assert_allclose(x.relu().numpy(), np.maximum(a, 0))
    np.testing.assert_allclose(x.abs().numpy(), np.abs(a))
    np.testing.assert_allclose(x.clip(-1, 1).numpy(), np.clip(a, -1, 1))
    gelu_tanh = 0.5 * a * (1 + np.tanh(np.sqrt(2 / np.pi) * (a + 0.044715 * a**3)))
    np.testing.assert_allclose(x.gelu(approximate="tanh").numpy(), gelu_tanh)
    gelu = np.array([0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in a.ravel()]).reshape(a.shape)
    np.testing.assert_allclose(x.gelu().numpy(), gelu, rtol=1e-12)
    np.testing.assert_allclose(x.abs().sqrt().numpy(), np.sqrt(np.abs(a)))
    np.testing.assert_allclose(x.abs().log().numpy(), np.log(np.abs(a)))


def test_sigmoid_does_not_overflow(device):
    x = mt.tensor([-1000.0, 0.0, 1000.0], device=device, requires_grad=True)
    y = x.sigmoid()
    np.testing.assert_allclose(y.numpy(), [0.0, 0.5, 1.0])
    y.sum().backward()
    assert np.isfinite(x.grad.numpy()).all()


# -- reductions --------------------------------------------------------------------------------
AXES = [None, 0, 1, -1, (0, 2), (-1, -3), (0, 1, 2)]


@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("axis", AXES, ids=str)
@pytest.mark.parametrize("op", ["sum", "mean", "max", "min", "var"])
def test_reductions(device, op, axis, keepdims):
    x = distinct(device, 2, 3, 4) if op in ("max", "min") else rand(device, 2, 3, 4)
    out = getattr(x, op)(axis=axis, keepdims=keepdims)
    reference = getattr(np, op)(x.numpy(), axis=axis, keepdims=keepdims, **({"ddof": 1} if op == "var" else {}))
    assert out.shape == reference.shape
    np.testing.assert_allclose(out.numpy(), reference)
    check(lambda x: getattr(mt, op)(x, axis=axis, keepdims=keepdims), x)


@pytest.mark.parametrize("correction", [0, 1])
def test_var_correction(device, correction):
    x = rand(device, 3, 4)
    np.testing.assert_allclose(x.var(axis=1, correction=correction).numpy(), np.var(x.numpy(), axis=1, ddof=correction))
    check(lambda x: x.var(axis=1, correction=correction), x)


def test_max_ties_share_the_gradient(device):
    x = mt.tensor([[1.0, 3.0, 3.0], [5.0, 0.0, 2.0]], device=device, requires_grad=True)
    x.max(axis=1).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [[0, 0.5, 0.5], [1, 0, 0]])
    assert x.grad.dtype == mt.float32


def test_reduction_of_a_scalar(device):
    x = rand(device)
    check(lambda x: x.sum(), x)
    check(lambda x: x.mean(axis=None, keepdims=True), x)


# -- matmul --------------------------------------------------------------------------------------
MATMUL_SHAPES = [
    ((3, 4), (4, 2)),  # 2-D
    ((2, 3, 4), (2, 4, 5)),  # batched
    ((2, 1, 3, 4), (3, 4, 2)),  # broadcasting batch dims
    ((1, 3, 4), (2, 4, 2)),  # batch of 1 against 2
    ((4,), (4, 3)),  # 1-D @ 2-D
    ((3, 4), (4,)),  # 2-D @ 1-D
    ((4,), (4,)),  # 1-D @ 1-D
    ((2, 3, 4), (4, 5)),  # 3-D @ 2-D (Linear layer)
    ((4, 3), (2, 3, 2)),  # 2-D @ 3-D
    ((4,), (2, 4, 3)),  # 1-D @ 3-D
    ((2, 3, 4), (4,)),  # 3-D @ 1-D
]


@pytest.mark.parametrize("sa,sb", MATMUL_SHAPES, ids=str)
def test_matmul(device, sa, sb):
    a, b = rand(device, *sa, seed=1), rand(device, *sb, seed=2)
    out = a @ b
    np.testing.assert_allclose(out.numpy(), a.numpy() @ b.numpy())
    check(lambda a, b: a @ b, a, b)
    check(lambda a, b: mt.matmul(a, b), a, b)


def test_matmul_gradient_for_one_operand(device):
    a, b = rand(device, 2, 3, 4, seed=1), rand(device, 4, 5, seed=2, requires_grad=False)
    check(lambda a: a @ b, a)
    check(lambda b2: a.detach() @ b2, rand(device, 4, 5, seed=3))


# -- moving elements around ------------------------------------------------------------------------
SHAPE_OPS = {
    "reshape": lambda x: x.reshape(4, 6),
    "reshape -1": lambda x: x.reshape((-1, 2)),
    "view": lambda x: x.view(6, 4),
    "transpose": lambda x: x.transpose(),
    "transpose 0 2": lambda x: x.transpose(0, 2),
    "T": lambda x: x.T,
    "permute": lambda x: x.permute(2, 0, 1),
    "permute tuple": lambda x: mt.permute(x, (1, 2, 0)),
    "swapaxes": lambda x: x.swapaxes(0, -1),
    "broadcast_to": lambda x: x[:, :1].broadcast_to(5, 2, 3, 4),
    "expand": lambda x: x[:1].expand(3, -1, -1),
    "squeeze all": lambda x: x[:, :1, None].squeeze(),
    "squeeze axis": lambda x: x[:, :1].squeeze(1),
    "unsqueeze": lambda x: x.unsqueeze(1),
    "unsqueeze -1": lambda x: x.unsqueeze(-1),
    "flatten": lambda x: x.flatten(),
    "flatten 1": lambda x: x.flatten(1),
    "flatten 0 1": lambda x: mt.flatten(x, 0, 1),
}


@pytest.mark.parametrize("name", list(SHAPE_OPS))
def test_shape_ops(device, name):
    check(SHAPE_OPS[name], rand(device, 2, 3, 4))


def test_shape_ops_forward(device):
    a = np.arange(24.0).reshape(2, 3, 4)
    x = mt.tensor(a, device=device)
    assert x.flatten(1).shape == (2, 12)
    np.testing.assert_array_equal(x.permute(2, 0, 1).numpy(), a.transpose(2, 0, 1))
    np.testing.assert_array_equal(x.transpose(0, 2).numpy(), a.swapaxes(0, 2))
    np.testing.assert_array_equal(x.T.numpy(), a.T)
    assert x.unsqueeze(-1).shape == (2, 3, 4, 1)
    assert x[:1].expand(3, -1, -1).shape == (3, 3, 4)
    assert x[:, :1, None].squeeze().shape == (2, 4)


# -- indexing -----------------------------------------------------------------------------------------
def _index_cases(device):
    return {
        "slice": lambda x: x[1:3],
        "slice step": lambda x: x[::2, ::-1],
        "int": lambda x: x[1],
        "negative int": lambda x: x[-1, 2],
        "None": lambda x: x[:, None, 1],
        "Ellipsis": lambda x: x[..., 2],
        "list repeated": lambda x: x[[0, 0, 2, 0]],
        "tensor repeated": lambda x: x[mt.tensor([3, 1, 3, 3], device=device)],
        "2-D index": lambda x: x[mt.tensor([[0, 1], [1, 0]], device=device)],
        "two arrays": lambda x: x[[0, 1, 0], [2, 2, 2]],
        "slice and array": lambda x: x[:, [1, 1, 0]],
        "bool mask": lambda x: x[x.detach() > 0],
        "bool rows": lambda x: x[mt.tensor([True, False, True, True], device=device)],
    }


@pytest.mark.parametrize("name", list(_index_cases("cpu")))
def test_getitem(device, name):
    fn = _index_cases(device)[name]
    x = rand(device, 4, 3)
    with mt.no_grad():
        expected = _index_cases("cpu")[name](mt.tensor(x.numpy()))  # the same index on the CPU
    np.testing.assert_array_equal(fn(x).numpy(), expected.numpy())
    check(fn, x)


def test_getitem_repeated_indices_accumulate(device):
    x = mt.zeros(3, device=device, requires_grad=True)
    x[[0, 0, 2, 0]].sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [3.0, 0.0, 1.0])


# -- joining and splitting ------------------------------------------------------------------------------
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_concat(device, axis):
    shapes = {0: [(1, 3), (2, 3), (3, 3)], 1: [(2, 1), (2, 3), (2, 2)], -1: [(2, 1), (2, 3), (2, 2)]}[axis]
    xs = [rand(device, *s, seed=i) for i, s in enumerate(shapes)]
    out = mt.concat(xs, axis=axis)
    np.testing.assert_array_equal(out.numpy(), np.concatenate([x.numpy() for x in xs], axis=axis))
    check(lambda *xs: mt.concat(xs, axis=axis), *xs)
    check(lambda *xs: mt.cat(list(xs), axis=axis), *xs)


@pytest.mark.parametrize("axis", [0, 1, 2, -1])
def test_stack(device, axis):
    xs = [rand(device, 2, 3, seed=i) for i in range(3)]
    out = mt.stack(xs, axis=axis)
    np.testing.assert_array_equal(out.numpy(), np.stack([x.numpy() for x in xs], axis=axis))
    check(lambda *xs: mt.stack(xs, axis=axis), *xs)


@pytest.mark.parametrize("sections,axis", [(2, 1), ([1, 3, 1], 1), (1, 0), ([2, 1], 0), (3, -1)])
def test_split(device, sections, axis):
    x = rand(device, 3, 5)
    pieces = x.split(sections, axis=axis)
    expected = np.split(x.numpy(), np.cumsum([p.shape[axis] for p in pieces])[:-1], axis=axis)
    assert [p.shape for p in pieces] == [e.shape for e in expected]
    for p, e in zip(pieces, expected):
        np.testing.assert_array_equal(p.numpy(), e)

    def weighted(x):  # a different weight per piece, so that a mix-up shows
        return sum(((p * (i + 1.0)) ** 2).sum() for i, p in enumerate(mt.split(x, sections, axis=axis)))

    check(weighted, x)


# -- choosing ------------------------------------------------------------------------------------------
def test_where_broadcasting(device):
    cond = mt.tensor(np.random.default_rng(0).random((3, 4)) > 0.5, device=device)
    a, b = rand(device, 3, 1, seed=1), rand(device, 4, seed=2)
    out = mt.where(cond, a, b)
    np.testing.assert_array_equal(out.numpy(), np.where(cond.numpy(), a.numpy(), b.numpy()))
    check(lambda a, b: mt.where(cond, a, b), a, b)
    check(lambda a: mt.where(cond, a, 0.5), a)
    check(lambda b: mt.where(cond, -1.0, b), b)


def test_masked_fill(device):
    mask = mt.tensor([[True], [False], [True]], device=device)
    x = rand(device, 3, 4)
    out = x.masked_fill(mask, -1e9)
    np.testing.assert_array_equal(out.numpy(), np.where(mask.numpy(), -1e9, x.numpy()))
    check(lambda x: mt.masked_fill(x, mask, 0.0), x)
    check(lambda x: x.masked_fill([[False, True, True, False]], 2.0), x)


# -- embedding, dropout, layer_norm -----------------------------------------------------------------------
def test_embedding_repeated_indices(device):
    weight = rand(device, 5, 3)
    idx = mt.tensor([[0, 2, 2], [4, 0, 0]], device=device)
    out = mt.embedding(idx, weight)
    np.testing.assert_array_equal(out.numpy(), weight.numpy()[idx.numpy()])
    check(lambda w: mt.embedding(idx, w), weight)
    weight.grad = None
    mt.embedding(idx, weight).sum().backward()
    np.testing.assert_array_equal(weight.grad.numpy()[:, 0], [3, 0, 2, 0, 1])


@pytest.mark.parametrize("p", [0.3, 0.5])
def test_dropout_gradcheck_with_fixed_seed(device, p):
    def f(x):
        mt.manual_seed(7)  # the same mask at every evaluation
        return mt.dropout(x, p)

    check(f, rand(device, 4, 5))


def test_dropout_gradient_is_mask_over_keep(device):
    p = 0.25
    x = rand(device, 50, 40, away=0.1)
    mt.manual_seed(3)
    y = mt.dropout(x, p)
    y.sum().backward()
    mask = y.numpy() != 0
    np.testing.assert_allclose(y.numpy(), x.numpy() * mask / (1 - p))
    np.testing.assert_allclose(x.grad.numpy(), mask / (1 - p))
    assert 0.65 < mask.mean() < 0.85  # about 1 - p kept


def test_dropout_edge_cases(device):
    x = rand(device, 3, 4)
    assert mt.dropout(x, 0.5, training=False) is x
    assert mt.dropout(x, 0.0) is x
    y = mt.dropout(x, 1.0)
    np.testing.assert_array_equal(y.numpy(), 0)
    y.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), 0)


def _layer_norm_reference(x, k, w, b, eps=1e-5):
    axes = tuple(range(x.ndim - k, x.ndim))
    mu = x.mean(axis=axes, keepdims=True)
    var = x.var(axis=axes, keepdims=True)
    y = (x - mu) / np.sqrt(var + eps)
    return y * (1 if w is None else w) + (0 if b is None else b)


@pytest.mark.parametrize("normalized_shape", [4, (3, 4)], ids=str)
@pytest.mark.parametrize("affine", ["none", "weight", "bias", "both"])
def test_layer_norm(device, normalized_shape, affine):
    x = rand(device, 2, 3, 4, seed=1)
    ns = (normalized_shape,) if isinstance(normalized_shape, int) else normalized_shape
    w = rand(device, *ns, seed=2) if affine in ("weight", "both") else None
    b = rand(device, *ns, seed=3) if affine in ("bias", "both") else None
    out = mt.layer_norm(x, normalized_shape, w, b)
    ref = _layer_norm_reference(x.numpy(), len(ns), None if w is None else w.numpy(), None if b is None else b.numpy())
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-10, atol=1e-12)
    params = [p for p in (w, b) if p is not None]

    def f(x, *ps):
        ws = ps[0] if w is not None else None
        bs = ps[-1] if b is not None else None
        return mt.layer_norm(x, normalized_shape, ws, bs)

    check(f, x, *params)


@pytest.mark.parametrize("shape", [(4, 3), (2, 3, 5), (2, 3, 2, 2)], ids=str)
@pytest.mark.parametrize("affine", [False, True])
@pytest.mark.parametrize("training", [True, False], ids=["batch_statistics", "running_statistics"])
def test_batch_norm(device, shape, affine, training):
    """Per channel (axis 1), the statistics over every other axis: the batch's in training (the
    backward differentiates through them), the running ones otherwise (constants)."""
    x = rand(device, *shape, seed=1)
    C = shape[1]
    w, b = (rand(device, C, seed=2), rand(device, C, seed=3)) if affine else (None, None)
    running_mean, running_var = rand(device, C, seed=4, requires_grad=False), rand(device, C, low=0.5, seed=5)
    running_var.requires_grad = False
    axes = (0, *range(2, len(shape)))
    channel = (1, C) + (1,) * (len(shape) - 2)
    a = x.numpy()
    mu, var = (a.mean(axes), a.var(axes)) if training else (running_mean.numpy(), running_var.numpy())
    ref = (a - mu.reshape(channel)) / np.sqrt(var.reshape(channel) + 1e-5)
    if affine:
        ref = ref * w.numpy().reshape(channel) + b.numpy().reshape(channel)
    out = mt.batch_norm(x, None if training else running_mean, None if training else running_var, w, b, training)
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-10, atol=1e-12)

    def f(x, *ps):
        stats = (None, None) if training else (running_mean, running_var)
        return mt.batch_norm(x, *stats, *(ps if affine else (None, None)), training=training)

    check(f, x, *([w, b] if affine else []))


# -- softmax family ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("axis", [0, 1, -1, -2])
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_softmax(device, op, axis):
    x = rand(device, 2, 3, 4, low=-3, high=3)
    a = x.numpy()
    e = np.exp(a - a.max(axis=axis, keepdims=True))
    sm = e / e.sum(axis=axis, keepdims=True)
    np.testing.assert_allclose(getattr(x, op)(axis=axis).numpy(), sm if op == "softmax" else np.log(sm), rtol=1e-12)
    check(lambda x: getattr(mt, op)(x, axis=axis), x)


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_softmax_float32_large_logits(device, op):
    x = mt.tensor([[1000.0, 1000.0, -1000.0]], device=device, requires_grad=True)
    y = getattr(x, op)()
    assert y.dtype == mt.float32
    assert np.isfinite(y.numpy()[:, :2]).all()
    (y * mt.tensor([[1.0, 2.0, 3.0]], device=device)).sum().backward()
    assert np.isfinite(x.grad.numpy()).all()


VALID_LENS = {
    "1-D": ([2, 4], (2, 3, 4)),
    "2-D": ([[1, 2, 4], [3, 1, 2]], (2, 3, 4)),
    "2-D with zero": ([[1, 0, 4], [3, 1, 0]], (2, 3, 4)),
    "heads 1-D": ([3, 1], (2, 2, 3, 4)),
    "heads 2-D": ([[1, 2, 4], [0, 1, 3]], (2, 2, 3, 4)),
}


@pytest.mark.parametrize("shape, axis", [((3, 0), -1), ((2, 0, 4), 1), ((0, 5), -1)])
def test_the_softmax_family_over_empty_axes(device, shape, axis):
    """Rows of no element (attention over no key, a batch of no rows): empty results and
    gradients, as in PyTorch, not a reshape error."""
    x = mt.zeros(*shape, device=device, requires_grad=True)
    for y in (x.softmax(axis=axis), x.log_softmax(axis=axis), mt.masked_softmax(x)):
        y.sum().backward()
        assert y.shape == x.grad.shape == shape
    if axis == -1:  # the sparse poolings too
        alpha = mt.tensor(1.5, device=device, requires_grad=True)
        for y in (mt.entmax15(x), mt.sparsemax(x), mt.alpha_entmax(x, 1.3), mt.alpha_entmax(x, alpha)):
            y.sum().backward()
            assert y.shape == x.grad.shape == shape


@pytest.mark.parametrize("op", ["max", "min", "argmax", "argmin"])
def test_the_largest_of_nothing_is_refused_by_name(device, op):
    """A sum over no element is 0, but a max has no answer: an error naming the op and the axis
    (NumPy's own "zero-size array to reduction operation" would surface as a broadcasting error)."""
    x = mt.zeros(3, 0, device=device)
    with pytest.raises(mt.ShapeError, match=rf"{op}: axis 1 of shape \(3, 0\) has no element"):
        getattr(mt, op)(x, axis=1)
    with pytest.raises(mt.ShapeError, match=rf"{op}: the tensor of shape \(3, 0\) has no element"):
        getattr(mt, op)(x)
    assert getattr(mt, op)(x, axis=0).shape == (0,)  # over the axis that has elements: fine


def _masked_reference(scores, keep):
    s = np.where(keep, scores, -np.inf)
    m = np.max(s, axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    e = np.where(keep, np.exp(s - m), 0)
    total = e.sum(axis=-1, keepdims=True)
    return e / np.where(total == 0, 1, total)


@pytest.mark.parametrize("name", list(VALID_LENS))
def test_masked_softmax_valid_lens(device, name):
    lens, shape = VALID_LENS[name]
    x = rand(device, *shape)
    valid_lens = mt.tensor(lens, device=device)
    out = mt.masked_softmax(x, valid_lens)
    lens_np = np.array(lens)
    lens_np = lens_np.reshape(lens_np.shape[:1] + (1,) * (len(shape) - 1 - lens_np.ndim) + lens_np.shape[1:])
    keep = np.arange(shape[-1]) < lens_np[..., None]
    np.testing.assert_allclose(out.numpy(), _masked_reference(x.numpy(), keep), rtol=1e-12, atol=1e-15)
    assert (out.numpy()[~np.broadcast_to(keep, shape)] == 0).all()
    check(lambda x: mt.masked_softmax(x, valid_lens), x)
    check(lambda x: mt.masked_softmax(x, lens), x)  # plain lists work too


def test_masked_softmax_bool_mask(device):
    x = rand(device, 2, 3, 4)
    mask = np.array([[[True, False, True, True]], [[False, False, False, False]]])  # (2, 1, 4)
    m = mt.tensor(mask, device=device)
    out = mt.masked_softmax(x, mask=m)
    np.testing.assert_allclose(out.numpy(), _masked_reference(x.numpy(), mask), rtol=1e-12)
    check(lambda x: mt.masked_softmax(x, mask=m), x)


def test_masked_softmax_fully_masked_rows(device):
    x = rand(device, 2, 3, 4)
    y = mt.masked_softmax(x, mt.tensor([0, 2], device=device))
    np.testing.assert_array_equal(y.numpy()[0], 0)  # zeros, not NaN, not uniform
    (y * rand(device, 2, 3, 4, seed=5, requires_grad=False)).sum().backward()
    g = x.grad.numpy()
    assert np.isfinite(g).all()
    np.testing.assert_array_equal(g[0], 0)
    np.testing.assert_array_equal(g[1][:, 2:], 0)
    assert np.abs(g[1][:, :2]).sum() > 0


# -- cross-entropy ---------------------------------------------------------------------------------------
def _ce_reference(logits, target, valid, reduction, smoothing):
    z = logits - logits.max(axis=-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
    c = logits.shape[-1]
    safe = np.where(valid, target, 0)
    nll = -np.take_along_axis(logp, safe[..., None], axis=-1)[..., 0]
    per = (1 - smoothing) * nll - smoothing * logp.sum(axis=-1) / c
    per = np.where(valid, per, 0.0)
    if reduction == "none":
        return per
    if reduction == "sum":
        return per.sum()
    return per.sum() / max(valid.sum(), 1)


CE_TARGET = [[0, 4, -100], [2, -100, 1]]
CE_MASK = [[True, True, True], [True, True, False]]


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("masking", ["ignore_index", "mask", "both", "neither"])
def test_cross_entropy(device, masking, reduction, smoothing):
    logits = rand(device, 2, 3, 5, low=-3, high=3)
    target = np.array(CE_TARGET)
    if masking == "neither":
        target = np.where(target < 0, 3, target)
    kw = {"reduction": reduction, "label_smoothing": smoothing}
    valid = target != -100
    if masking in ("mask", "both"):
        kw["mask"] = mt.tensor(CE_MASK, device=device)
        valid &= np.array(CE_MASK)
    if masking == "mask":
        target = np.where(target < 0, 1, target)
        valid = np.array(CE_MASK)
    t = mt.tensor(target, device=device)
    out = mt.cross_entropy(logits, t, **kw)
    ref = _ce_reference(logits.numpy(), target, valid, reduction, smoothing)
    assert out.shape == np.shape(ref)
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-10, atol=1e-12)
    check(lambda z: mt.cross_entropy(z, t, **kw), logits)


def test_cross_entropy_ignore_index_other_value(device):
    logits = rand(device, 4, 3)
    t = mt.tensor([0, 2, 0, 1], device=device)
    check(lambda z: mt.cross_entropy(z, t, ignore_index=0), logits)
    out = mt.cross_entropy(logits, t, ignore_index=0)
    np.testing.assert_allclose(out.item(), _ce_reference(logits.numpy(), t.numpy(), t.numpy() != 0, "mean", 0.0))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_no_valid_token(device, reduction):
    logits = rand(device, 2, 3, 4)
    t = mt.tensor([[-100, -100, -100], [-100, -100, -100]], device=device)
    loss = mt.cross_entropy(logits, t, reduction=reduction, label_smoothing=0.1)
    np.testing.assert_array_equal(loss.numpy(), 0.0)
    loss.sum().backward()
    assert np.isfinite(logits.grad.numpy()).all()
    np.testing.assert_array_equal(logits.grad.numpy(), 0.0)
    check(lambda z: mt.cross_entropy(z, t, reduction=reduction), logits)


def test_cross_entropy_all_masked_by_mask(device):
    logits = rand(device, 2, 3)
    loss = mt.cross_entropy(logits, mt.tensor([0, 1], device=device), mask=mt.tensor([False, False], device=device))
    assert loss.item() == 0.0
    loss.backward()
    np.testing.assert_array_equal(logits.grad.numpy(), 0.0)


def test_cross_entropy_matches_torch(device):
    torch = pytest.importorskip("torch")
    logits = rand(device, 2, 3, 5, low=-3, high=3)
    target = np.array(CE_TARGET)
    for reduction in ("mean", "sum", "none"):
        for smoothing in (0.0, 0.2):
            zt = torch.tensor(logits.numpy(), requires_grad=True)
            ref = torch.nn.functional.cross_entropy(
                zt.reshape(-1, 5), torch.tensor(target.reshape(-1)), reduction=reduction, label_smoothing=smoothing
            )
            logits.grad = None
            out = mt.cross_entropy(
                logits, mt.tensor(target, device=device), reduction=reduction, label_smoothing=smoothing
            )
            np.testing.assert_allclose(out.numpy().reshape(-1), ref.detach().numpy().reshape(-1), rtol=1e-10)
            out.sum().backward()
            ref.sum().backward()
            np.testing.assert_allclose(logits.grad.numpy(), zt.grad.numpy(), rtol=1e-10, atol=1e-14)


# -- dtype and device conversions ---------------------------------------------------------------------------
def test_astype_is_differentiable(device):
    x = rand(device, 3, 2, dtype=mt.float32)
    y = x.to(mt.float64)
    assert y.dtype == mt.float64
    check(lambda x: x.to(mt.float64).to(mt.float64) * 2, rand(device, 3, 2))
    (y * y).sum().backward()
    assert x.grad.dtype == mt.float32
    np.testing.assert_allclose(x.grad.numpy(), 2 * x.numpy(), rtol=1e-6)


def test_to_device_is_differentiable():
    x = rand("cpu", 2, 3)
    y = x.to("strict")
    assert y.device == "strict"
    check(lambda x: (x.to("strict") * 3).to("cpu"), x)
    x.grad = None
    (y * y).sum().to("cpu").backward()
    assert x.grad.device == "cpu"
    np.testing.assert_allclose(x.grad.numpy(), 2 * x.numpy())


def test_composite_expression(device):
    """A small MLP-with-attention-like expression mixing many ops."""
    x, w1, w2 = rand(device, 2, 3, 4, seed=1), rand(device, 4, 5, seed=2), rand(device, 5, 4, seed=3)

    def f(x, w1, w2):
        h = (x @ w1).tanh()
        scores = h @ h.transpose(-1, -2) / 5**0.5
        att = mt.masked_softmax(scores, mt.tensor([2, 3], device=device))
        return mt.layer_norm(att @ h @ w2 + x, 4).gelu().mean(axis=1)

    check(f, x, w1, w2)


# -- gradients keep the dtype of the data -----------------------------------------------------------
class Spy(Function):
    """The identity, recording the dtype of the gradient that reaches it."""

    seen = []

    @staticmethod
    def forward(ctx, a):
        return a

    @staticmethod
    def backward(ctx, grad):
        Spy.seen.append(grad.dtype)
        return grad


FLOAT32_OPS = {
    "max": lambda y: y.max(axis=1),
    "min": lambda y: y.min(),
    "mean": lambda y: y.mean(axis=0),
    "var": lambda y: y.var(axis=1),
    "pow": lambda y: y**2,
    "rpow": lambda y: 2.0**y,
    "div": lambda y: 1.0 / (y * y + 1),
    "sqrt": lambda y: (y * y + 1).sqrt(),
    "gelu": lambda y: y.gelu(),
    "sigmoid": lambda y: y.sigmoid(),
    "clip": lambda y: y.clip(-0.5, 0.5),
    "abs": lambda y: y.abs(),
    "dropout": lambda y: mt.dropout(y, 0.3),
    "layer_norm": lambda y: mt.layer_norm(y, 4),
    "softmax": lambda y: y.softmax(axis=0),
    "log_softmax": lambda y: y.log_softmax(),
    "masked_softmax": lambda y: mt.masked_softmax(y, [1, 0, 4]),
    "cross_entropy": lambda y: mt.cross_entropy(y, [0, 1, -100], label_smoothing=0.1),
    "getitem": lambda y: y[[0, 0, 2]],
    "matmul": lambda y: y @ y.T,
    "where": lambda y: mt.where(y > 0, y, 0.0),
}


@pytest.mark.parametrize("name", list(FLOAT32_OPS))
def test_backward_keeps_float32(device, name):
    x = mt.randn(3, 4, device=device, requires_grad=True)
    Spy.seen.clear()
    FLOAT32_OPS[name](Spy.apply(x)).sum().backward()
    assert Spy.seen == [mt.float32], f"{name}: the gradient reaching its input is {Spy.seen}"


# -- non-differentiable helpers on both devices ------------------------------------------------------
@pytest.mark.parametrize("axis,keepdims", [(None, False), (0, False), (1, True), (-1, False)])
def test_argmax_argmin(device, axis, keepdims):
    a = np.array([[1.0, 5.0, 2.0], [7.0, 0.0, 3.0]])
    x = mt.tensor(a, device=device, requires_grad=True)
    for name in ("argmax", "argmin"):
        out = getattr(x, name)(axis=axis, keepdims=keepdims)
        ref = getattr(np, name)(a, axis=axis, keepdims=keepdims) if axis is not None else getattr(np, name)(a)
        assert out.dtype == mt.int64 and not out.requires_grad
        np.testing.assert_array_equal(out.numpy(), ref)
