"""Property-based tests: random shapes, broadcasting and axes, checked against NumPy.

For each generated case the forward pass must equal NumPy's, every gradient must have its
input's shape, and the gradient must equal the analytic one computed here independently
(with NumPy, summing over broadcast axes by hand) or pass ``mt.gradcheck``.
"""

import numpy as np
import pytest
from conftest import DEVICES
from helpers import OPERATOR
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import array_shapes, mutually_broadcastable_shapes

import minitensor as mt

SETTINGS = settings(max_examples=30, deadline=None)


def leaf(device, array):
    return mt.tensor(array, dtype=mt.float64, device=device, requires_grad=True)


def reduce_to(grad, shape):
    """Sum ``grad`` down to ``shape`` (the inverse of broadcasting), written axis by axis."""
    while grad.ndim > len(shape):
        grad = grad.sum(axis=0)
    for axis, n in enumerate(shape):
        if n == 1 and grad.shape[axis] != 1:
            grad = grad.sum(axis=axis, keepdims=True)
    return grad


# (forward, d/da, d/db) in NumPy
BINARY = {
    "add": (np.add, lambda a, b: np.ones_like(a * b), lambda a, b: np.ones_like(a * b)),
    "sub": (np.subtract, lambda a, b: np.ones_like(a * b), lambda a, b: -np.ones_like(a * b)),
    "mul": (np.multiply, lambda a, b: b + 0 * a, lambda a, b: a + 0 * b),
    "div": (np.divide, lambda a, b: 1 / b + 0 * a, lambda a, b: -a / b**2),
    "pow": (np.power, lambda a, b: b * a ** (b - 1), lambda a, b: a**b * np.log(a)),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", list(BINARY))
@SETTINGS
@given(
    shapes=mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=4, max_side=4), seed=st.integers(0, 2**16)
)
def test_binary_broadcasting(device, op, shapes, seed):
    (sa, sb), out_shape = shapes.input_shapes, shapes.result_shape
    rng = np.random.default_rng(seed)
    a = rng.uniform(0.5, 2.0, sa)  # positive: pow and log are defined
    b = rng.uniform(0.5, 2.0, sb) * rng.choice([-1.0, 1.0], sb)
    ta, tb = leaf(device, a), leaf(device, b)
    z = OPERATOR[op](ta, tb)
    forward, da, db = BINARY[op]
    assert z.shape == out_shape
    np.testing.assert_allclose(z.numpy(), forward(a, b), rtol=1e-12)

    w = rng.standard_normal(out_shape)
    (z * mt.tensor(w, dtype=mt.float64, device=device)).sum().backward()
    assert ta.grad.shape == sa and tb.grad.shape == sb
    np.testing.assert_allclose(ta.grad.numpy(), reduce_to(w * da(a, b), sa), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(tb.grad.numpy(), reduce_to(w * db(a, b), sb), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("device", DEVICES)
@SETTINGS
@given(
    shapes=mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=3, max_side=3),
    dtype=st.sampled_from([mt.float32, mt.float64]),
    scalar=st.floats(0.5, 3.0),
)
def test_binary_keeps_dtype_and_scalars_are_weak(device, shapes, dtype, scalar):
    (sa, sb) = shapes.input_shapes
    a = mt.ones(sa, dtype=dtype, device=device, requires_grad=True)
    b = mt.full(sb, 2.0, dtype=dtype, device=device, requires_grad=True)
    z = (a * b + scalar) / scalar - a**scalar
    assert z.dtype == dtype and z.shape == shapes.result_shape
    z.sum().backward()
    assert a.grad.dtype == dtype and b.grad.dtype == dtype
    assert a.grad.shape == sa and b.grad.shape == sb


@st.composite
def shape_and_axis(draw, max_dims=4):
    shape = draw(array_shapes(min_dims=1, max_dims=max_dims, min_side=1, max_side=4))
    ndim = len(shape)
    kind = draw(st.sampled_from(["none", "int", "tuple"]))
    if kind == "none":
        axis = None
    elif kind == "int":
        axis = draw(st.integers(-ndim, ndim - 1))
    else:
        axes = draw(st.lists(st.integers(0, ndim - 1), min_size=1, max_size=ndim, unique=True))
        axis = tuple(a - ndim if draw(st.booleans()) else a for a in axes)  # some negative
    return shape, axis, draw(st.booleans())


def _axes(axis, ndim):
    if axis is None:
        return tuple(range(ndim))
    return tuple(a % ndim for a in ((axis,) if isinstance(axis, int) else axis))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", ["sum", "mean", "max", "min", "var"])
@SETTINGS
@given(case=shape_and_axis(), seed=st.integers(0, 2**16))
def test_reductions(device, op, case, seed):
    shape, axis, keepdims = case
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))
    a = (rng.permutation(n).reshape(shape) - n / 2) * 0.25  # distinct values: no ties for max
    x = leaf(device, a)
    axes = _axes(axis, a.ndim)
    count = int(np.prod([shape[i] for i in axes]))
    kw = {"correction": 0} if op == "var" and count == 1 else {}
    out = getattr(x, op)(axis=axis, keepdims=keepdims, **kw)
    ddof = {"ddof": kw.get("correction", 1)} if op == "var" else {}
    ref = getattr(np, op)(a, axis=axis, keepdims=keepdims, **ddof)
    assert out.shape == ref.shape
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-12, atol=1e-12)

    w = rng.standard_normal(ref.shape)
    (out * mt.tensor(w, dtype=mt.float64, device=device)).sum().backward()
    wk = np.broadcast_to(w.reshape(np.sum(a, axis=axis, keepdims=True).shape), shape)
    if op == "sum":
        expected = wk
    elif op == "mean":
        expected = wk / count
    elif op in ("max", "min"):
        extreme = getattr(np, op)(a, axis=axis, keepdims=True)
        expected = wk * (a == extreme)
    else:
        denom = count - ddof["ddof"]
        expected = wk * 2 * (a - a.mean(axis=axis, keepdims=True)) / denom
    assert x.grad.shape == shape
    np.testing.assert_allclose(x.grad.numpy(), expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=15, deadline=None)
@given(case=shape_and_axis(max_dims=3), op=st.sampled_from(["sum", "mean", "max", "var"]))
def test_reductions_gradcheck(device, case, op):
    shape, axis, keepdims = case
    n = int(np.prod(shape))
    a = (np.random.default_rng(n).permutation(n).reshape(shape) - n / 2) * 0.25
    count = int(np.prod([shape[i] for i in _axes(axis, len(shape))]))
    kw = {"correction": 0} if op == "var" else {}
    if op == "var" and count == 1:
        return  # the variance of one value is a constant: nothing to check
    assert mt.gradcheck(lambda x: getattr(x, op)(axis=axis, keepdims=keepdims, **kw), [leaf(device, a)])


@st.composite
def matmul_shapes(draw):
    batch = draw(mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=3, max_side=3))
    n, k, m = draw(st.integers(1, 4)), draw(st.integers(1, 4)), draw(st.integers(1, 4))
    sa, sb = batch.input_shapes[0] + (n, k), batch.input_shapes[1] + (k, m)
    if draw(st.integers(0, 4)) == 0:
        sa = (k,)  # a vector on the left
    if draw(st.integers(0, 4)) == 0:
        sb = (k,)  # a vector on the right
    return sa, sb


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=30, deadline=None)
@given(shapes=matmul_shapes(), seed=st.integers(0, 2**16))
def test_matmul(device, shapes, seed):
    sa, sb = shapes
    rng = np.random.default_rng(seed)
    a, b = rng.standard_normal(sa), rng.standard_normal(sb)
    ta, tb = leaf(device, a), leaf(device, b)
    z = ta @ tb
    ref = a @ b
    assert z.shape == np.shape(ref)
    np.testing.assert_allclose(z.numpy(), ref, rtol=1e-10, atol=1e-12)

    w = rng.standard_normal(np.shape(ref))
    (z * mt.tensor(w, dtype=mt.float64, device=device)).sum().backward()
    assert ta.grad.shape == sa and tb.grad.shape == sb
    if a.ndim == 1 and b.ndim == 1:  # dot product
        ga, gb = w * b, w * a
    else:
        ga, gb = _matmul_grads(a, b, w)
    np.testing.assert_allclose(ta.grad.numpy(), ga, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(tb.grad.numpy(), gb, rtol=1e-10, atol=1e-12)
    if np.prod(sa) + np.prod(sb) <= 24:
        assert mt.gradcheck(lambda x, y: x @ y, [ta, tb])


def _matmul_grads(a, b, w):
    """Analytic: promote vectors to matrices, then dA = W B^T, dB = A^T W summed to shape."""
    a2 = a[None, :] if a.ndim == 1 else a
    b2 = b[:, None] if b.ndim == 1 else b
    w2 = w
    if a.ndim == 1:
        w2 = np.expand_dims(w2, -2)
    if b.ndim == 1:
        w2 = np.expand_dims(w2, -1)
    ga = reduce_to(w2 @ np.swapaxes(b2, -1, -2), a2.shape).reshape(a.shape)
    gb = reduce_to(np.swapaxes(a2, -1, -2) @ w2, b2.shape).reshape(b.shape)
    return ga, gb
