"""The Tensor object: construction, dtypes, creation functions, seeding, conversions, repr."""

import inspect

import numpy as np
import pytest
from strict_backend import StrictArray

import minitensor as mt


# -- mt.tensor: dtype inference --------------------------------------------------------------------
@pytest.mark.parametrize(
    "data,dtype",
    [
        (1.5, mt.float32),
        ([1.0, 2.0], mt.float32),
        ([[1, 2.5]], mt.float32),
        (3, mt.int64),
        ([1, 2, 3], mt.int64),
        (True, mt.bool),
        ([True, False], mt.bool),
        (np.array([1.0, 2.0]), mt.float64),  # a NumPy array keeps its dtype
        (np.array([1.0], dtype=np.float32), mt.float32),
        (np.array([1, 2], dtype=np.int32), mt.int32),
        (np.array([[True]]), mt.bool),
    ],
)
def test_dtype_inference(device, data, dtype):
    t = mt.tensor(data, device=device)
    assert t.dtype == dtype
    assert t.device == device
    np.testing.assert_array_equal(t.numpy(), np.asarray(data))


@pytest.mark.parametrize("dtype", [mt.float64, mt.float16, mt.int32, "float64", np.float64, float])
def test_dtype_override(device, dtype):
    t = mt.tensor([1, 2], dtype=dtype, device=device)
    assert t.dtype == (mt.float32 if dtype is float else np.dtype(dtype))


def test_tensor_copies_its_data(device):
    a = np.array([1.0, 2.0])
    t = mt.tensor(a, device=device)
    a[0] = 100
    assert t.numpy()[0] == 1.0
    u = mt.tensor(t)  # from a Tensor: a new leaf with a copy
    with mt.no_grad():
        u.fill_(0)
    assert t.numpy()[0] == 1.0


def test_tensor_from_another_device():
    t = mt.tensor([1.0, 2.0], device="strict")
    c = mt.tensor(t, device="cpu")
    assert c.device == "cpu" and isinstance(c.data, np.ndarray)
    s = mt.tensor(c, device="strict")
    assert isinstance(s.data, StrictArray)
    np.testing.assert_array_equal(s.numpy(), [1.0, 2.0])


def test_tensor_class_constructor(device):
    t = mt.Tensor([1.0, 2.0], requires_grad=True, device=device)
    assert t.requires_grad and t.is_leaf and t.dtype == mt.float32 and t.device == device


def test_unsupported_data():
    with pytest.raises(TypeError, match="unsupported"):
        mt.tensor(["a", "b"])
    with pytest.raises(TypeError, match="dtype"):
        mt.tensor([1.0], dtype="not a dtype")


# -- creation functions ----------------------------------------------------------------------------
def test_creation_shapes_and_dtypes(device):
    cases = [
        (mt.zeros(2, 3, device=device), (2, 3), mt.float32, 0),
        (mt.zeros((2, 3), device=device), (2, 3), mt.float32, 0),
        (mt.ones(4, device=device, dtype=mt.float64), (4,), mt.float64, 1),
        (mt.full((2, 2), 7.0, device=device), (2, 2), mt.float32, 7),
        (mt.full(3, 2, dtype=mt.int64, device=device), (3,), mt.int64, 2),
        (mt.zeros_like(mt.ones(3, 1, device=device)), (3, 1), mt.float32, 0),
        (mt.ones_like(mt.zeros(2, dtype=mt.int64, device=device)), (2,), mt.int64, 1),
        (mt.ones_like(mt.zeros(2, device=device), dtype=mt.float64), (2,), mt.float64, 1),
    ]
    for t, shape, dtype, value in cases:
        assert t.shape == shape and t.dtype == dtype and t.device == device
        np.testing.assert_array_equal(t.numpy(), value)
        assert not t.requires_grad
    assert mt.zeros(2, device=device, requires_grad=True).requires_grad
    assert mt.zeros_like(mt.ones(2, device=device), requires_grad=True).requires_grad


def test_arange(device):
    t = mt.arange(5, device=device)
    assert t.dtype == mt.int64
    np.testing.assert_array_equal(t.numpy(), np.arange(5))
    np.testing.assert_array_equal(mt.arange(2, 10, 3, device=device).numpy(), [2, 5, 8])
    f = mt.arange(0, 1, 0.25, device=device)
    assert f.dtype == mt.float32
    np.testing.assert_allclose(f.numpy(), [0, 0.25, 0.5, 0.75])
    assert mt.arange(3, dtype=mt.float64, device=device).dtype == mt.float64


def test_random_creation(device):
    r = mt.randn(3, 4, device=device)
    assert r.shape == (3, 4) and r.dtype == mt.float32 and r.device == device
    assert mt.randn((2, 2), dtype=mt.float64, device=device).dtype == mt.float64
    half = mt.randn(2000, dtype=mt.float16, device=device)  # NumPy draws float32 and float64: converted
    assert half.dtype == mt.float16 and 0.9 < half.numpy().astype(np.float64).std() < 1.1
    assert mt.randn(2, device=device, requires_grad=True).requires_grad
    u = mt.rand(1000, device=device).numpy()
    assert u.dtype == np.float32 and u.min() >= 0 and u.max() < 1 and 0.4 < u.mean() < 0.6
    n = mt.randn(10_000, device=device).numpy()
    assert abs(n.mean()) < 0.05 and 0.95 < n.std() < 1.05
    i = mt.randint(3, 7, (50,), device=device)
    assert i.dtype == mt.int64 and i.shape == (50,)
    assert set(np.unique(i.numpy())) <= {3, 4, 5, 6}
    assert mt.randint(0, 2, 5, device=device).shape == (5,)


# -- seeding -------------------------------------------------------------------------------------------
def test_manual_seed_reproducible(device):
    mt.manual_seed(123)
    a = mt.randn(5, device=device).numpy()
    b = mt.rand(5, device=device).numpy()
    mt.manual_seed(123)
    np.testing.assert_array_equal(mt.randn(5, device=device).numpy(), a)
    np.testing.assert_array_equal(mt.rand(5, device=device).numpy(), b)
    mt.manual_seed(124)
    assert not np.array_equal(mt.randn(5, device=device).numpy(), a)


def test_manual_seed_makes_dropout_reproducible(device):
    x = mt.ones(200, device=device)
    mt.manual_seed(5)
    m1 = mt.dropout(x, 0.5).numpy()
    mt.manual_seed(5)
    m2 = mt.dropout(x, 0.5).numpy()
    np.testing.assert_array_equal(m1, m2)
    m3 = mt.dropout(x, 0.5).numpy()  # the generator moved on
    assert not np.array_equal(m1, m3)


def test_manual_seed_seeds_the_host_generator():
    from minitensor.random import host_rng

    mt.manual_seed(9)
    a = host_rng().random(3)
    mt.manual_seed(9)
    np.testing.assert_array_equal(host_rng().random(3), a)


# -- leaving the tensor ------------------------------------------------------------------------------------
def test_numpy_returns_a_copy(device):
    t = mt.tensor([1.0, 2.0], device=device)
    a = t.numpy()
    assert isinstance(a, np.ndarray)
    a[0] = 100
    assert t.numpy()[0] == 1.0
    assert t.numpy() is not t.numpy()


def test_item_and_tolist(device):
    assert mt.tensor(2.5, device=device).item() == 2.5
    assert isinstance(mt.tensor([[3]], device=device).item(), int)
    assert mt.tensor([[1.5, 2.0]], device=device).tolist() == [[1.5, 2.0]]
    assert mt.tensor([1, 2], device=device).tolist() == [1, 2]
    with pytest.raises(ValueError, match="2 elements"):
        mt.tensor([1.0, 2.0], device=device).item()


def test_python_conversions(device):
    assert float(mt.tensor([2.5], device=device)) == 2.5
    assert int(mt.tensor(3, device=device)) == 3
    assert bool(mt.tensor([True], device=device))
    with pytest.raises(ValueError, match="ambiguous"):
        bool(mt.tensor([1.0, 2.0], device=device))


def test_numpy_asarray():
    np.testing.assert_array_equal(np.asarray(mt.tensor([1.0, 2.0])), [1.0, 2.0])
    with pytest.raises(TypeError, match="numpy"):
        np.asarray(mt.tensor([1.0, 2.0], device="strict"))


def test_to_and_conversions(device):
    t = mt.tensor([1.5, 2.5], device=device)
    assert t.to(mt.float32) is t  # nothing changes
    assert t.to(device) is t
    assert t.double().dtype == mt.float64 and t.float().dtype == mt.float32
    assert t.long().dtype == mt.int64 and t.long().tolist() == [1, 2]
    assert t.astype("float64").dtype == mt.float64
    assert t.to(dtype=mt.float64, device="cpu").device == "cpu"
    c = t.cpu()
    assert c.device == "cpu" and isinstance(c.data, np.ndarray)
    s = t.to("strict")
    assert s.device == "strict" and isinstance(s.data, StrictArray)


def test_to_float64_is_differentiable(device):
    x = mt.tensor([1.0, 2.0], device=device, requires_grad=True)
    y = x.to(mt.float64)
    assert y.requires_grad and y.dtype == mt.float64
    (y * y).sum().backward()
    assert x.grad.dtype == mt.float32
    np.testing.assert_allclose(x.grad.numpy(), [2.0, 4.0])


# -- repr --------------------------------------------------------------------------------------------------
def test_repr_small(device):
    r = repr(mt.tensor([1.5, 2.0], device=device))
    assert r.startswith("tensor(") and "1.5" in r and "2." in r
    assert ("device" in r) == (device != "cpu")
    if device != "cpu":
        assert repr(device) in r
    assert "float32" not in r  # the default dtype is not shown
    assert "dtype=float64" in repr(mt.tensor([1.0], dtype=mt.float64, device=device))
    assert "requires_grad=True" in repr(mt.tensor([1.0], requires_grad=True, device=device))
    y = mt.tensor([1.0], requires_grad=True, device=device) * 2
    assert "grad_fn=Mul" in repr(y)
    assert len(r) < 80


def test_repr_large_is_summarised(device):
    r = repr(mt.zeros(100, 100, device=device))
    assert "shape=(100, 100)" in r
    assert "..." in r
    assert len(r) < 400
    r = repr(mt.zeros(40, 25, device=device))  # 1,000 elements: all shown, as in PyTorch
    assert "..." not in r and "shape=" not in r and r.count("0.") == 1000


# -- operators --------------------------------------------------------------------------------------------
def test_comparisons_give_bool_tensors_without_grad(device):
    x = mt.tensor([1.0, 2.0, 3.0], device=device, requires_grad=True)
    y = mt.tensor([3.0, 2.0, 1.0], device=device)
    for out, expected in [
        (x == 2, [False, True, False]),
        (x != 2, [True, False, True]),
        (x < y, [True, False, False]),
        (x <= y, [True, True, False]),
        (x > 1.5, [False, True, True]),
        (x >= y, [False, True, True]),
    ]:
        assert out.dtype == mt.bool and not out.requires_grad and out.grad_fn is None
        np.testing.assert_array_equal(out.numpy(), expected)
    m = (x > 1.5) & (x < 2.5) | ~(x > 0)
    np.testing.assert_array_equal(m.numpy(), [False, True, False])
    assert (x > 1.5).any().item() and not (x > 5).all().item()


def test_int_meets_float(device):
    i = mt.tensor([1, 2], device=device)
    f = mt.tensor([0.5, 0.5], device=device)
    for out in (i + f, f + i, i * f, f - i, i / f):
        assert out.dtype == mt.float32
    assert (i + 1.5).dtype == mt.float32
    assert (1.5 + i).dtype == mt.float32
    assert (i * 2).dtype == mt.int64
    assert (i + mt.tensor([1.0], dtype=mt.float64, device=device)).dtype == mt.float64


@pytest.mark.parametrize(
    "fn",
    [
        lambda t: t * 2,
        lambda t: t + 1.5,
        lambda t: t / 3,
        lambda t: 2**t,
        lambda t: t**2,
        lambda t: 1 - t,
        lambda t: -t,
    ],
)
def test_python_scalars_keep_float32(device, fn):
    t = mt.tensor([1.0, 2.0], device=device, requires_grad=True)
    out = fn(t)
    assert out.dtype == mt.float32
    out.sum().backward()
    assert t.grad.dtype == mt.float32


def test_numpy_operands_give_tensors():
    t = mt.tensor([1.0, 2.0])
    for out in (np.float32(2) * t, t * np.float32(2), np.ones(2) + t, t + np.ones(2), np.ones(2) * t):
        assert isinstance(out, mt.Tensor)
        assert out.dtype == mt.float32
    np.testing.assert_allclose((np.array([1.0, 2.0]) - t).numpy(), [0, 0])


def test_numpy_float64_scalar_keeps_float32(device):
    t = mt.tensor([1.0, 4.0], device=device)
    assert (t / np.sqrt(4.0)).dtype == mt.float32
    assert (np.float64(2) * t).dtype == mt.float32


def test_numpy_array_operand_is_uploaded_explicitly():
    t = mt.tensor([1.0, 2.0], device="strict")
    out = t + np.ones(2)  # a host array operand is uploaded by mt.tensor, explicitly
    assert out.device == "strict"
    np.testing.assert_allclose(out.numpy(), [2.0, 3.0])


def test_size_numel_len_T_view(device):
    t = mt.zeros(2, 3, 4, device=device)
    assert t.size() == (2, 3, 4) and t.size(1) == 3 and t.size(-1) == 4
    assert t.numel() == 24 and len(t) == 2 and t.ndim == 3
    assert t.T.shape == (4, 3, 2)
    assert t.view(6, 4).shape == (6, 4) and t.view((4, -1)).shape == (4, 6)
    with pytest.raises(TypeError):
        len(mt.tensor(1.0, device=device))


# -- the operators and methods are written in the class, each calling its op -------------------------------
OP_METHODS = [
    "neg", "exp", "log", "sqrt", "tanh", "sigmoid", "relu", "gelu", "abs", "clip", "clamp",
    "sum", "mean", "max", "min", "var", "argmax", "argmin",
    "reshape", "flatten", "permute", "transpose", "swapaxes", "broadcast_to", "expand", "squeeze", "unsqueeze",
    "softmax", "log_softmax", "masked_fill", "split",
]  # fmt: skip
OPERATORS = [
    "__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__", "__rtruediv__",
    "__pow__", "__rpow__", "__matmul__", "__rmatmul__", "__neg__", "__getitem__",
    "__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__and__", "__or__", "__xor__", "__invert__",
    "add", "sub", "mul", "div", "pow", "matmul", "any", "all", "view",
]  # fmt: skip


@pytest.mark.parametrize("name", OP_METHODS + OPERATORS)
def test_methods_are_defined_in_the_class_body(name):
    """Go-to-definition on ``x.sum`` or ``x * y`` lands in the class, not on a setattr loop."""
    assert mt.Tensor.__dict__[name].__qualname__ == f"Tensor.{name}"
    assert isinstance(mt.Tensor.__dict__["T"], property)


@pytest.mark.parametrize("name", OP_METHODS)
def test_method_has_the_parameters_of_its_op(name):
    """``x.sum(axis=0)`` takes what ``mt.sum(x, axis=0)`` takes, as help() and IDEs show."""
    method = list(inspect.signature(getattr(mt.Tensor, name)).parameters.values())
    op = list(inspect.signature(getattr(mt.ops, name)).parameters.values())
    assert method[0].name == "self" and method[1:] == op[1:]


def test_named_arithmetic_methods_match_the_operators(device):
    x, y = mt.tensor([1.0, 2.0], device=device), mt.tensor([3.0, 4.0], device=device)
    for method, result in [
        (x.add(y), x + y),
        (x.sub(y), x - y),
        (x.mul(y), x * y),
        (x.div(y), x / y),
        (x.pow(y), x**y),
        (x.matmul(y), x @ y),
        (x.view(2, 1), x.reshape(2, 1)),
    ]:
        np.testing.assert_array_equal(method.numpy(), result.numpy())
        assert method.grad_fn is None and type(method) is mt.Tensor


def test_tensors_hash_by_identity(device):
    a, b = mt.zeros(2, device=device), mt.zeros(2, device=device)
    assert len({a, b}) == 2
    assert {a: 1}[a] == 1


def test_requires_grad_flags(device):
    t = mt.zeros(2, device=device)
    assert not t.requires_grad and t.is_leaf and t.grad is None and t.grad_fn is None
    assert t.requires_grad_() is t and t.requires_grad
    y = t * 2
    assert not y.is_leaf and y.requires_grad
    with pytest.raises(mt.GraphError, match="detach"):
        y.requires_grad_(False)


def test_functional_api_promotes_like_the_operators(device):
    f = mt.ones(3, device=device)
    i = mt.tensor([1, 2, 3], device=device)
    for out in (mt.add(f, i), mt.mul(i, f), mt.where(mt.tensor([True, False, True], device=device), f, i)):
        assert out.dtype == mt.float32
    assert mt.matmul(f, i).dtype == mt.float32
    assert mt.nn.functional.linear(i.reshape(1, 3), mt.ones(2, 3, device=device)).dtype == mt.float32


@pytest.mark.parametrize("name", ["exp", "log", "sqrt", "tanh", "sigmoid", "sin", "cos"])
def test_real_functions_of_integers_are_float32(device, name):
    """PyTorch's rule: an integer tensor through a function of real numbers gives the default
    float dtype, float32 (NumPy's would be float64, and a model would drift to it)."""
    i = mt.tensor([[1, 2, 3], [4, 5, 6]], device=device)
    expected = getattr(mt, name)(i.float())
    for out in (getattr(mt, name)(i), getattr(i, name)()):
        assert out.dtype == mt.float32
        np.testing.assert_array_equal(out.numpy(), expected.numpy())


def test_means_of_integers_and_booleans_are_float32(device):
    i, b = mt.tensor([1, 2, 4], device=device), mt.tensor([True, False, True, True], device=device)
    for out, value in ((i.mean(), 7 / 3), (mt.var(i), 7 / 3), (b.mean(), 0.75), (i.mean(dim=0, keepdim=True), 7 / 3)):
        assert out.dtype == mt.float32
        np.testing.assert_allclose(out.numpy(), value, rtol=1e-6)


def test_true_division_of_integers_is_float32(device):
    i, j = mt.tensor([1, 2, 3], device=device), mt.tensor([2, 4, 4], device=device)
    for out in (i / j, i / 2, 6 / j, mt.div(i, j), i.div(j), i / mt.ones(3, device=device)):
        assert out.dtype == mt.float32
    np.testing.assert_array_equal((i / j).numpy(), np.array([0.5, 0.5, 0.75], np.float32))
    np.testing.assert_array_equal((6 / j).numpy(), np.array([3, 1.5, 1.5], np.float32))
    assert (i / mt.ones(3, dtype=mt.float64, device=device)).dtype == mt.float64  # the float's dtype
    assert (mt.tensor([1, 2], dtype=mt.int32, device=device) / 2).dtype == mt.float32


def test_to_accepts_dtype_names_and_device_names():
    x = mt.ones(2)
    assert x.to("float64").dtype == mt.float64
    assert x.to("cpu") is x
    assert x.to("strict").device == "strict"
    with pytest.raises(mt.DeviceError, match="unknown device 'tpu'.*cpu") as unknown:
        x.to("tpu")
    assert str(unknown.value).endswith("]")  # no hint for a name PyTorch does not use either
    # PyTorch's spellings are named with minitensor's
    for name in ("cuda:0", "cuda:1", "GPU"):
        with pytest.raises(mt.DeviceError, match=f"unknown device '{name}'.*minitensor's GPU is device 'cuda'"):
            mt.zeros(2, device=name)
    with pytest.raises(mt.DeviceError, match="unknown device 'CPU'.*; the CPU is device 'cpu'$"):
        x.to("CPU")


# -- what a user comparing with PyTorch found (each a silent difference or a library's error) ------
def test_integer_and_boolean_conversions_leave_the_graph():
    a = mt.tensor([1.5, 2.5], requires_grad=True)
    assert not a.long().requires_grad and not a.to(mt.bool).requires_grad
    (a.long().float() * a).sum().backward()  # the integer copy is a constant, as in PyTorch
    assert a.grad.tolist() == [1.0, 2.0]


def test_pow_gradients_at_zero_are_pytorchs():
    """Where the exponent is 0, z = 1 and dz/da = 0; where the base is 0 and the exponent >= 0,
    dz/dp = 0 (not nan and -inf from 0 * 0^-1 and log 0)."""
    x = mt.tensor([0.0, 1.0], requires_grad=True)
    (x**0).sum().backward()
    assert x.grad.tolist() == [0.0, 0.0]
    a, p = mt.tensor([0.0, 0.0, 2.0], requires_grad=True), mt.tensor([0.0, 2.0, 0.0], requires_grad=True)
    (a**p).sum().backward()
    assert a.grad.tolist() == [0.0, 0.0, 0.0]
    np.testing.assert_allclose(p.grad.numpy(), [0.0, 0.0, np.log(2.0)], rtol=1e-6)
    b = mt.tensor([0.0, 2.0], requires_grad=True)
    (0**b).sum().backward()
    assert b.grad.tolist() == [0.0, 0.0]


def test_mixed_dtypes_take_pytorchs_result_type():
    i, f = mt.tensor([1, 2]), mt.tensor([1.5])
    assert mt.cat([i, f]).dtype == mt.float32 and mt.cat([i, f]).tolist() == [1.0, 2.0, 1.5]
    assert mt.stack([mt.tensor([1]), f]).dtype == mt.float32
    assert mt.tensor([1, 2, 3]).clamp(1.5, 2.5).tolist() == [1.5, 2.0, 2.5]
    assert mt.tensor([1, 2, 3]).clamp(0, 2).dtype == mt.int64
    filled = mt.tensor([1, 2, 3]).masked_fill(mt.tensor([True, False, False]), 2.7)
    assert filled.dtype == mt.int64 and filled.tolist() == [2, 2, 3]  # a's dtype kept, as in PyTorch
    cond = mt.tensor([True, False])
    assert mt.where(cond, 1.0, 0.0).tolist() == [1.0, 0.0] and mt.where(cond, 1.0, 0.0).dtype == mt.float32
    assert mt.where(cond, 1, 0).dtype == mt.int64
    assert mt.tensor([mt.tensor(1.5, dtype=mt.float64)]).dtype == mt.float64
    assert mt.tensor([0.1]).dtype == mt.float32 and mt.tensor([mt.tensor(1.0), 2.0]).dtype == mt.float32
    assert mt.tensor([np.float32(1.0), 2.0]).dtype == mt.float32
    # a NumPy scalar is a number, as in arithmetic (promote): it combines with float32 tensors
    assert mt.tensor(np.float64(0.1)).dtype == mt.float32 and (mt.ones(3) * mt.tensor(np.sqrt(2.0))).dtype == mt.float32
    assert mt.full((2,), 3).dtype == mt.int64 and mt.full((2,), True).dtype == mt.bool
    assert mt.full((2,), 3.0).dtype == mt.float32 and mt.full((2,), 3, dtype=mt.float64).dtype == mt.float64


@pytest.mark.parametrize(
    "make, error, words",
    [
        (lambda: mt.arange(0, 2.5, 0.5, dtype=mt.int64), ValueError, "arange: dtype int64 needs a whole-number step"),
        (lambda: mt.arange(0, 5, 0), ValueError, "arange: step must not be zero"),
        (lambda: mt.arange(float("nan")), ValueError, "arange: stop must be a finite number"),
        (lambda: mt.arange(1e13), ValueError, "arange: the result would have shape"),
        (lambda: mt.rand(3, dtype=mt.int64), mt.DTypeError, "rand: draws real numbers"),
        (lambda: mt.randn(3, dtype=mt.bool), mt.DTypeError, "randn: draws real numbers"),
        (lambda: mt.ones(2, 6).reshape(-2, 12), mt.ShapeError, r"reshape: lengths are >= 0, or -1"),
        (lambda: list(mt.tensor(3.0)), TypeError, "iteration over a 0-d tensor"),
        (lambda: mt.tensor([1, 2]) ** -1, ValueError, "pow: Integers to negative integer powers"),
        (lambda: mt.ones(4)[::0], ValueError, "getitem: slice step cannot be zero"),
    ],
)
def test_wrong_arguments_are_named(make, error, words):
    with pytest.raises(error, match=words) as info:
        make()
    assert error is not ValueError or not isinstance(info.value, mt.ShapeError)  # not about shapes


def test_arange_takes_what_pytorchs_takes():
    assert mt.arange(mt.tensor(3)).tolist() == [0, 1, 2]
    assert mt.arange(5, 0, -2).tolist() == [5, 3, 1] and mt.arange(2, 1).tolist() == []
    assert mt.arange(0, 1, 0.25).tolist() == [0.0, 0.25, 0.5, 0.75]
    assert mt.arange(0, 3, 1.0, dtype=mt.int64).tolist() == [0, 1, 2]


def test_cross_entropy_names_pytorchs_class_axis():
    """(N, C, d) logits with an (N, d) target, PyTorch's layout: the error says where the classes
    go here (the last axis), so D2L's older ``pred.permute(0, 2, 1)`` reads as what to undo."""
    with pytest.raises(mt.ShapeError, match=r"classes are the last axis .* logits.permute\(0, 2, 1\)"):
        mt.cross_entropy(mt.randn(2, 5, 3), mt.zeros(2, 3, dtype=mt.int64))


@pytest.mark.parametrize("decorate", [mt.no_grad, mt.no_grad()], ids=["bare", "called"])
def test_no_grad_decorates_with_or_without_parentheses(decorate):
    @decorate
    def double(x):
        return x * 2

    x = mt.ones(2, requires_grad=True)
    assert not double(x).requires_grad and double.__name__ == "double"
    assert (x * 2).requires_grad  # the mode is back after the call
    assert mt.enable_grad(lambda: mt.is_grad_enabled())() is True


def test_python_number_protocols():
    assert f"{mt.tensor(3.14159):.2f}" == "3.14" and f"{mt.tensor(7)}" == "tensor(7)"
    with pytest.raises(TypeError, match="unsupported format string"):
        f"{mt.tensor([1.0, 2.0]):.2f}"
    x = mt.tensor([-1.0, 2.0], requires_grad=True)
    assert abs(x).tolist() == [1.0, 2.0] and +x is x
    abs(x).sum().backward()
    assert x.grad.tolist() == [-1.0, 1.0]
