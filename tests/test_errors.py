"""Every user error gets the right exception type and a message that names the operation,
the values involved, and what to do."""

import operator
import re

import numpy as np
import pytest
from minitensor.autograd import Function

import minitensor as mt


def raises(exc, fn, *fragments):
    """Call ``fn``, expect ``exc``, and return its message after checking it contains every
    fragment (plain substrings)."""
    with pytest.raises(exc) as info:
        fn()
    message = str(info.value)
    for f in fragments:
        assert f in message, f"{f!r} missing from the message: {message}"
    return message


# -- shapes ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("op", ["+", "*", "-", "/"])
def test_broadcast_mismatch_names_both_shapes(device, op):
    a, b = mt.ones(2, 3, device=device), mt.ones(4, 3, device=device)
    name = {"+": "add", "*": "mul", "-": "sub", "/": "truediv"}[op]
    raises(mt.ShapeError, lambda: getattr(operator, name)(a, b), name[-3:], "(2, 3)", "(4, 3)")
    name = name[-3:]
    raises(mt.ShapeError, lambda: getattr(mt, name)(a, b), name, "(2, 3)", "(4, 3)")


def test_an_output_too_large_for_memory_names_the_op():
    """NumPy's MemoryError says what it could not allocate; the op is named before it (terabytes:
    no machine holds them, so the allocation fails before anything is written)."""
    with pytest.raises(MemoryError, match=r"^add: Unable to allocate .* \(1000000, 10000000\)"):
        mt.ones(10**6, 1) + mt.ones(1, 10**7)
    with pytest.raises(MemoryError, match=r"^matmul: "):
        mt.ones(10**6, 1) @ mt.ones(1, 10**7)


def test_shape_error_is_a_value_error(device):
    with pytest.raises(ValueError):
        mt.ones(2, device=device) + mt.ones(3, device=device)


@pytest.mark.parametrize(
    "sa,sb,k1,k2",
    [((2, 3), (4, 5), 3, 4), ((5, 2, 3), (3, 2), 3, 3), ((3,), (4,), 3, 4), ((2, 3), (2,), 3, 2)],
)
def test_matmul_inner_dimension_mismatch(device, sa, sb, k1, k2):
    a, b = mt.ones(*sa, device=device), mt.ones(*sb, device=device)
    if k1 == k2:  # the batch axes are the problem here
        raises(
            mt.ShapeError, lambda: a @ mt.ones(4, 3, 2, device=device), "matmul", "(5, 2, 3)", "(4, 3, 2)", "broadcast"
        )
        return
    msg = raises(mt.ShapeError, lambda: a @ b, "matmul", str(sa), str(sb), f"{k1} != {k2}")
    assert "transpose" in msg  # what to do


def test_reshape_to_an_impossible_shape(device):
    x = mt.ones(2, 3, device=device)
    msg = raises(mt.ShapeError, lambda: x.reshape(4, 2), "reshape", "(2, 3)", "(4, 2)", "6")
    assert "same number of elements" in msg
    raises(mt.ShapeError, lambda: x.view(-1, 4), "reshape", "(-1, 4)")


def test_other_shape_errors(device):
    x = mt.ones(2, 3, device=device)
    raises(mt.ShapeError, lambda: x.broadcast_to(3, 3), "broadcast_to", "(2, 3)", "(3, 3)")
    raises(mt.ShapeError, lambda: x.permute(0, 0), "permute", "(0, 0)", "(2, 3)")
    raises(mt.ShapeError, lambda: x.squeeze(0), "squeeze", "(2, 3)")
    raises(mt.ShapeError, lambda: mt.concat([x, mt.ones(3, 4, device=device)]), "concat", "(2, 3)", "(3, 4)")
    raises(mt.ShapeError, lambda: mt.stack([x, mt.ones(2, 4, device=device)]), "stack", "(2, 3)", "(2, 4)")
    raises(mt.ShapeError, lambda: x.split([1, 3], axis=1), "split", "[1, 3]", "3")
    raises(mt.ShapeError, lambda: mt.layer_norm(x, 4), "layer_norm", "(4,)", "(2, 3)")
    raises(mt.ShapeError, lambda: mt.layer_norm(x, 3, weight=mt.ones(2, device=device)), "layer_norm", "weight", "(2,)")
    raises(mt.ShapeError, lambda: mt.where(x > 0, x, mt.ones(4, device=device)), "where", "(2, 3)", "(4,)")
    raises(IndexError, lambda: x.sum(axis=2), "sum", "axis 2", "2 dimensions")
    raises(IndexError, lambda: x.min(axis=-3), "min", "axis -3")
    raises(IndexError, lambda: x[5], "getitem", "5", "(2, 3)")


# -- devices and dtypes ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "fn",
    [
        lambda a, b: a + b,
        lambda a, b: b * a,
        lambda a, b: a @ b,
        lambda a, b: mt.where(a > 0, a, b),
        lambda a, b: mt.concat([a, b]),
        lambda a, b: mt.stack([b, a]),
    ],
)
def test_mixed_devices_name_both(fn):
    a, b = mt.ones(2, 2), mt.ones(2, 2, device="strict")
    msg = raises(mt.DeviceError, lambda: fn(a, b), "'cpu'", "'strict'")
    assert ".to(" in msg  # what to do


def test_mixed_devices_in_index_arguments():
    w = mt.ones(4, 2, device="strict")
    raises(mt.DeviceError, lambda: mt.embedding(mt.tensor([0, 1]), w), "embedding", "'cpu'", "'strict'")
    z = mt.ones(2, 3, device="strict")
    raises(mt.DeviceError, lambda: mt.cross_entropy(z, mt.tensor([0, 1])), "cross", "'cpu'", "'strict'")
    raises(mt.DeviceError, lambda: mt.masked_softmax(z, mt.tensor([1, 2])), "softmax", "'cpu'", "'strict'")


@pytest.mark.parametrize("data_device,index_device", [("cpu", "strict"), ("strict", "cpu")])
def test_index_tensor_on_another_device(data_device, index_device):
    x = mt.ones(3, device=data_device)
    idx = mt.tensor([0, 2], device=index_device)
    raises(mt.DeviceError, lambda: x[idx], repr(data_device), repr(index_device), ".to(")
    raises(mt.DeviceError, lambda: x[idx, None], repr(data_device), repr(index_device))
    raises(mt.DeviceError, lambda: x[x.to(index_device) > 0], repr(index_device))


def test_unknown_device():
    raises(mt.DeviceError, lambda: mt.zeros(2, device="tpu"), "'tpu'", "'cpu'")
    if not mt.cuda.is_available():
        raises(mt.DeviceError, lambda: mt.ones(2).to("cuda"), "'cuda'", "CuPy")


@pytest.mark.parametrize("op", ["+", "*", "@"])
def test_float32_with_float64(device, op):
    a, b = mt.ones(2, 2, device=device), mt.ones(2, 2, dtype=mt.float64, device=device)
    fn = {"+": operator.add, "*": operator.mul, "@": operator.matmul}[op]
    msg = raises(mt.DTypeError, lambda: fn(a, b), "float32", "float64")
    assert ".to(mt.float32)" in msg or ".to(mt.float64)" in msg
    with pytest.raises(TypeError):  # DTypeError is a TypeError
        fn(b, a)


FLOAT_ONLY = {
    "softmax": lambda x: mt.softmax(x, dim=-1),
    "log_softmax": lambda x: x.log_softmax(dim=-1),
    "masked_softmax": lambda x: mt.masked_softmax(x, mt.tensor([1, 2], device=x.device)),
    "cross_entropy": lambda x: mt.cross_entropy(x, mt.tensor([0, 1], device=x.device)),
    "layer_norm": lambda x: mt.nn.LayerNorm(3, device=x.device)(x),
    "gelu": lambda x: mt.nn.functional.gelu(x, approximate="tanh"),
}


@pytest.mark.parametrize("op", sorted(FLOAT_ONLY))
@pytest.mark.parametrize("dtype", ["int64", "bool"])
def test_ops_of_real_numbers_refuse_integers(device, op, dtype):
    """As in PyTorch. Before, the softmax family failed with numba's typing error from inside
    its kernel, and layer norm of [1, 2, 3] gave [316, 632, 949]."""
    x = mt.tensor([[1, 2, 3], [4, 5, 6]], device=device).to(dtype)
    raises(mt.DTypeError, lambda: FLOAT_ONLY[op](x), f"{op}: ", dtype, ".float()")
    FLOAT_ONLY[op](x.float())


def test_integer_tensor_cannot_require_grad(device):
    raises(TypeError, lambda: mt.tensor([1, 2], requires_grad=True, device=device), "int64", ".float()")
    raises(TypeError, lambda: mt.zeros(2, dtype=mt.int64, requires_grad=True, device=device), "int64")
    raises(TypeError, lambda: mt.tensor([True], device=device).requires_grad_(), "bool")


def test_non_tensor_arguments():
    raises(TypeError, lambda: mt.ops.elementwise.Add.apply(1.0, 2.0), "add", "Tensor")
    raises(TypeError, lambda: mt.where(mt.ones(2), mt.ones(2), 0.0), "bool", "float32")


# -- autograd misuse -------------------------------------------------------------------------------
def test_backward_on_a_non_scalar(device):
    y = mt.ones(2, 3, device=device, requires_grad=True) * 2
    msg = raises(mt.GraphError, y.backward, "backward", "(2, 3)")
    assert "sum()" in msg or "gradient" in msg


def test_backward_through_a_freed_graph(device):
    x = mt.ones(2, device=device, requires_grad=True)
    y = (x * x).sum()
    y.backward()
    msg = raises(mt.GraphError, y.backward, "freed", "retain_graph=True")
    assert re.search(r"Sum|sum", msg)


def test_backward_without_a_graph(device):
    raises(mt.GraphError, mt.ones(1, device=device).backward, "requires_grad=True", "no_grad")


def test_backward_with_a_wrong_gradient_shape(device):
    y = mt.ones(2, device=device, requires_grad=True) * 2
    raises(mt.ShapeError, lambda: y.backward(mt.ones(3, device=device)), "(3,)", "(2,)")


def test_inplace_message_says_what_to_do(device):
    w = mt.ones(2, device=device, requires_grad=True)
    raises(mt.GraphError, lambda: w.add_(1.0), "add_", "no_grad")


# -- op arguments ------------------------------------------------------------------------------------
# Checks on the data are made at once on the CPU and, on a device, at the next read (``.item()``,
# ``.numpy()``: Backend.check): the tests below read the result, and on the CPU the op raises first
# (test_sync_free.py checks both ways apart).
def test_cross_entropy_target_out_of_range(device):
    z = mt.zeros(2, 3, device=device)
    raises(
        IndexError, lambda: mt.cross_entropy(z, mt.tensor([0, 3], device=device)).item(), "cross_entropy", "3", "0..2"
    )
    raises(
        IndexError,
        lambda: mt.cross_entropy(z, mt.tensor([-1, 0], device=device)).item(),
        "cross_entropy",
        "-1",
        "ignore_index",
    )
    # an ignored position may hold anything
    assert mt.cross_entropy(z, mt.tensor([7, 0], device=device), ignore_index=7).item() == pytest.approx(np.log(3))


def test_cross_entropy_bad_arguments(device):
    z = mt.zeros(2, 3, device=device)
    raises(
        mt.ShapeError,
        lambda: mt.cross_entropy(z, mt.tensor([0, 1, 2], device=device)),
        "cross_entropy",
        "(2, 3)",
        "(3,)",
    )
    raises(TypeError, lambda: mt.cross_entropy(z, mt.tensor([0.0, 1.0], device=device)), "integer", "float32")
    raises(ValueError, lambda: mt.cross_entropy(z, mt.tensor([0, 1], device=device), reduction="avg"), "'avg'", "mean")
    raises(
        ValueError,
        lambda: mt.cross_entropy(z, mt.tensor([0, 1], device=device), label_smoothing=1.0),
        "label_smoothing",
    )


def test_embedding_index_out_of_range(device):
    w = mt.ones(5, 2, device=device)
    raises(IndexError, lambda: mt.embedding(mt.tensor([0, 5], device=device), w).numpy(), "embedding", "5", "0..4")
    raises(IndexError, lambda: mt.embedding(mt.tensor([-1], device=device), w).numpy(), "embedding", "-1")
    raises(TypeError, lambda: mt.embedding(mt.tensor([0.0], device=device), w), "embedding", "float32")
    raises(
        mt.ShapeError,
        lambda: mt.embedding(mt.tensor([0], device=device), mt.ones(5, device=device)),
        "embedding",
        "2-D",
    )


def test_integer_array_index_out_of_range(device):
    """CuPy would wrap an out-of-range array index around silently; minitensor refuses it everywhere."""
    x = mt.arange(12.0, device=device).reshape(3, 4)
    raises(IndexError, lambda: x[mt.tensor([0, 3], device=device)].numpy(), "getitem", "3", "size 3")
    raises(IndexError, lambda: x[:, mt.tensor([-5], device=device)].numpy(), "getitem", "-5", "axis 1", "size 4")
    raises(IndexError, lambda: x[..., mt.tensor([4], device=device)].numpy(), "getitem", "4", "size 4")
    raises(IndexError, lambda: x[None, 1, mt.tensor([0, 9], device=device)].numpy(), "getitem", "9", "axis 1")
    rows = x[mt.tensor([-1, 0, 2], device=device), mt.tensor([3, 0, 1], device=device)]
    assert rows.numpy().tolist() == [11.0, 0.0, 9.0]  # negative indices in range are fine
    assert x[x > 5.0][mt.tensor([0, 5], device=device)].numpy().tolist() == [6.0, 11.0]


def test_the_array_index_check_made_for_gpu_arrays():
    """The check itself (NumPy raises on its own, so the test above cannot tell who raised)."""
    from minitensor.ops.indexing import _check_array_parts

    shape = (3, 4, 5)
    for index in [
        np.array([0, 3]),
        (slice(None), np.array([-5])),
        (Ellipsis, np.array([5])),
        (None, 0, np.array([1, 4])),
        (np.ones((3, 4), bool), np.array([5])),
    ]:
        with pytest.raises(IndexError, match="out of bounds for axis"):
            _check_array_parts(shape, index)
    for index in [
        np.array([0, -3]),
        (slice(None), np.array([3, -4])),
        (Ellipsis, np.array([4])),
        (None, 0, np.array([1, 3]), np.array([4])),
        (np.ones((3, 4), bool), np.array([4])),
        np.array([], int),
    ]:
        _check_array_parts(shape, index)


def test_masked_softmax_valid_lens_of_a_wrong_shape(device):
    x = mt.zeros(2, 3, 4, device=device)
    raises(
        mt.ShapeError,
        lambda: mt.masked_softmax(x, mt.tensor([1, 2, 3], device=device)),
        "masked_softmax",
        "(3,)",
        "(2, 3, 4)",
        "(2,)",
    )
    raises(
        mt.ShapeError,
        lambda: mt.masked_softmax(x, mt.tensor([[1, 2], [3, 4]], device=device)),
        "masked_softmax",
        "(2, 2)",
    )
    raises(TypeError, lambda: mt.masked_softmax(x, mt.tensor([1.0, 2.0], device=device)), "valid_lens", "integers")
    raises(
        mt.ShapeError, lambda: mt.masked_softmax(x, mask=mt.ones(3, 3, dtype=mt.bool, device=device)), "mask", "(3, 3)"
    )
    raises(TypeError, lambda: mt.masked_softmax(x, mask=mt.ones(2, 3, 4, device=device)), "mask", "bool")


def test_other_argument_errors(device):
    x = mt.ones(3, device=device)
    raises(ValueError, lambda: mt.dropout(x, 1.5), "dropout", "1.5")
    raises(ValueError, lambda: mt.clip(x), "clip")
    raises(ValueError, lambda: x.split(0), "split", "0")
    raises(ValueError, lambda: mt.concat([]), "concat")
    raises(ValueError, lambda: x.item(), "item", "3 elements")


MAKERS = {
    "zeros": lambda *shape, **kw: mt.zeros(*shape, **kw),
    "ones": lambda *shape, **kw: mt.ones(*shape, **kw),
    "randn": lambda *shape, **kw: mt.randn(*shape, **kw),
    "rand": lambda *shape, **kw: mt.rand(*shape, **kw),
    "full": lambda *shape, **kw: mt.full(shape, 7.0, **kw),
    "normal": lambda *shape, **kw: mt.normal(0.0, 1.0, shape, **kw),
    "randint": lambda *shape, **kw: mt.randint(0, 10, shape, **kw),
}


@pytest.mark.parametrize("maker", sorted(MAKERS))
def test_a_new_tensors_shape_is_checked_before_allocating(device, maker):
    """Whole numbers >= 0, and a size the device holds: a mistyped size is refused in words
    (NumPy said "negative dimensions are not allowed", and a size beyond the memory would have
    been drawn until the system killed the process)."""
    make = MAKERS[maker]
    raises(ValueError, lambda: make(-1, 3, device=device), f"{maker}: a shape is whole numbers >= 0, got (-1, 3)")
    raises(TypeError, lambda: make(2.5, device=device), f"{maker}: a shape is whole numbers >= 0, got (2.5,)")
    raises(TypeError, lambda: make(True, 2, device=device), f"{maker}: ")
    if mt.get_backend(device).memory_size() is not None:
        raises(ValueError, lambda: make(10**6, 10**7, device=device), f"{maker}: the result would have shape", "GiB")
    assert make(0, 3, device=device).shape == (0, 3) and make(np.int64(2), device=device).shape == (2,)


def test_randint_bounds_and_full_fill_values_are_checked(device):
    """NumPy's words were "low >= high" and "could not convert string to float", and None filled
    NaN, a list broadcast along the last axis, a complex number lost its imaginary part."""
    raises(ValueError, lambda: mt.randint(5, 2, (3,), device=device), "randint: draws from [low, high)",
           "low=5, high=2")  # fmt: skip
    raises(TypeError, lambda: mt.randint(0.5, 2, (3,), device=device), "randint: low must be an integer, got 0.5")
    raises(ValueError, lambda: mt.randint(0, 2**70, (3,), device=device), "randint: high=", "outside int64's range")
    for wrong in ("a", None, [1.0, 2.0], 1 + 2j):
        raises(TypeError, lambda w=wrong: mt.full((2,), w, device=device), "full: fill_value must be a number, got")
    raises(ValueError, lambda: mt.full((2,), 2**70, device=device), "full: fill_value", "outside int64's range")
    assert mt.full((2,), mt.tensor(3.0, device=device), device=device).tolist() == [3.0, 3.0]  # as PyTorch's 0-d
    assert mt.full((2,), np.int32(3), device=device).dtype == mt.int64


def test_a_loss_target_that_would_broadcast_the_predictions_is_refused(device):
    """(n, 1) predictions against (n,) targets would compare each prediction with every target,
    a loss that still decreases (PyTorch warns)."""
    pred = mt.ones(4, 1, device=device)
    raises(mt.ShapeError, lambda: mt.nn.functional.mse_loss(pred, mt.zeros(4, device=device)), "mse_loss: ",
           "(4, 1)", "(4,)", "broadcast to (4, 4)", "target.reshape(4, 1)")  # fmt: skip
    raises(mt.ShapeError, lambda: mt.nn.MSELoss()(mt.ones(4, device=device), [[0.0]] * 3), "(3, 1)")
    # shapes that do not broadcast: named by the loss, not by the subtraction inside it
    raises(mt.ShapeError, lambda: mt.nn.MSELoss()(mt.ones(4, device=device), mt.zeros(3, device=device)),
           "mse_loss: ", "(4,)", "(3,) do not fit")  # fmt: skip
    assert mt.nn.functional.mse_loss(pred, 0.0).item() == 1.0  # a target that broadcasts to the input's shape
    assert mt.nn.functional.mse_loss(pred, mt.zeros(1, device=device), reduction="none").shape == (4, 1)


def test_containers_and_dropout_name_themselves():
    net = mt.nn.Sequential(mt.nn.Linear(2, 2), mt.nn.ReLU())
    raises(IndexError, lambda: net[2], "Sequential: index 2 is out of range for 2 modules")
    raises(IndexError, lambda: mt.nn.ModuleList([net])[-2], "ModuleList: index -2 is out of range for 1 modules")
    assert net[-1] is net[1]
    raises(TypeError, lambda: mt.nn.Dropout("0.5"), "Dropout: p must be a number in [0, 1], got '0.5'")
    raises(TypeError, lambda: mt.dropout(mt.ones(2), True), "dropout: p must be a number in [0, 1], got True")
    raises(ValueError, lambda: mt.nn.Dropout(1.5), "Dropout: p must be a probability in [0, 1], got 1.5")
    raises(ValueError, lambda: mt.nn.GRU(2, 3, dropout=-0.1), "GRU: dropout must be a probability in [0, 1], got -0.1")


def test_ragged_data_and_seeds_are_refused_by_name():
    raises(ValueError, lambda: mt.tensor([[1, 2], [3]]), "tensor: the data do not form a rectangular array")
    raises(TypeError, lambda: mt.tensor(["a"]), "tensor: unsupported data of dtype <U1 (numbers or booleans expected)")
    # NumPy keeps integers beyond 64 bits as Python objects: "unsupported data of dtype object" said nothing
    raises(OverflowError, lambda: mt.tensor([[1, -(2**70)]]), f"tensor: the integer {-(2**70)} does not fit int64")
    # and those in 2**63 .. 2**64 - 1 as uint64, which no op of the engine expects
    raises(OverflowError, lambda: mt.tensor([2**63]), f"tensor: the integer {2**63} does not fit int64")
    raises(OverflowError, lambda: mt.tensor([[3], [2**64 - 1]]), f"tensor: the integer {2**64 - 1} does not fit")
    # and with smaller ones NumPy makes them float64: rounded, silently
    raises(OverflowError, lambda: mt.tensor([3, -(2**63) - 1]), f"tensor: the integer {-(2**63) - 1} does not fit")
    assert mt.tensor([3, 1e19]).dtype == mt.float32  # a float that large is a float
    assert mt.tensor(2**63 - 1).dtype == mt.int64
    assert mt.tensor(np.array([2**63], dtype=np.uint64)).dtype == np.uint64  # an array keeps its dtype
    raises(TypeError, lambda: mt.manual_seed("7"), "manual_seed: ", "'7'")
    raises(ValueError, lambda: mt.manual_seed(-1), "manual_seed: ", "-1")
    mt.manual_seed(np.int64(0))


# -- gradcheck ----------------------------------------------------------------------------------------
def test_gradcheck_needs_float64(device):
    x = mt.ones(2, device=device, requires_grad=True)
    raises(TypeError, lambda: mt.gradcheck(lambda x: x * 2, [x]), "gradcheck", "input 0", "float32", "float64")
    raises(ValueError, lambda: mt.gradcheck(lambda x: x * 2, [mt.ones(2, dtype=mt.float64)]), "requires_grad=True")
    y = mt.ones(2, dtype=mt.float64, requires_grad=True, device=device)
    raises(TypeError, lambda: mt.gradcheck(lambda x: 2.0, [y]), "Tensor")


class WrongSquare(Function):
    """z = a^2 with a deliberately wrong backward (forgets the factor 2 for one element)."""

    @staticmethod
    def forward(ctx, a):
        ctx.save_for_backward(a)
        return a * a

    @staticmethod
    def backward(ctx, grad):
        (a,) = ctx.saved
        g = 2 * grad * a
        g[1, 2] = grad[1, 2] * a[1, 2]  # the bug
        return g


def test_gradcheck_failure_names_the_input_and_the_element(device):
    x = mt.tensor(np.arange(1.0, 7.0).reshape(2, 3), dtype=mt.float64, device=device, requires_grad=True)
    c = mt.tensor([1.0], dtype=mt.float64, device=device, requires_grad=True)
    msg = raises(
        mt.GradcheckError, lambda: mt.gradcheck(lambda c, x: WrongSquare.apply(x) * c, [c, x]), "input 1", "(1, 2)"
    )
    assert "(2, 3)" in msg  # the input's shape
    assert isinstance(mt.GradcheckError("x"), AssertionError)


def test_gradcheck_passes_the_right_function(device):
    x = mt.tensor(np.arange(1.0, 7.0).reshape(2, 3), dtype=mt.float64, device=device, requires_grad=True)
    assert mt.gradcheck(lambda x: x * x, [x])
    assert mt.gradcheck(lambda x: x * x, x)  # a single tensor is fine too


def test_backward_gradient_on_another_device_names_both():
    x = mt.ones(3, requires_grad=True)
    y = x * 2
    with pytest.raises(mt.DeviceError, match="'strict'.*'cpu'"):
        y.backward(mt.ones(3, device="strict"))


def test_backward_gradient_of_another_dtype_keeps_the_graph_dtype():
    x = mt.ones(3, requires_grad=True)
    (x * 2).backward(mt.ones(3, dtype=mt.float64))
    assert x.grad.dtype == mt.float32


def test_integer_tensor_requiring_grad_is_a_dtype_error():
    with pytest.raises(mt.DTypeError, match="int64.*float"):
        mt.tensor([1, 2]).requires_grad_()


def test_a_transformer_names_tokens_that_are_not_one_row_per_sequence():
    """The error came from the first attention layer, about X's shape, a tensor the user never made."""
    lm = mt.nn.TransformerLM(10, 8, 16, 2, 1, 0.0)
    for shape in ((2, 3, 4), (3,)):
        said = f"TransformerEmbedding: tokens of shape {shape}; expected (batch_size, num_steps) token ids"
        raises(mt.ShapeError, lambda s=shape: lm(mt.zeros(*s, dtype=mt.int64)), said)
    assert lm(mt.zeros(1, 3, dtype=mt.int64)).shape == (1, 3, 10)
    # the GRU models too: their GRU named the shape of the embeddings
    model = mt.nn.Seq2Seq(mt.nn.Seq2SeqEncoder(10, 4, 8, 1), mt.nn.Seq2SeqAttentionDecoder(10, 4, 8, 1))
    tokens = mt.zeros(2, 5, dtype=mt.int64)
    raises(mt.ShapeError, lambda: model(mt.zeros(5, dtype=mt.int64), tokens), "Seq2SeqEncoder: tokens of shape (5,)")
    raises(mt.ShapeError, lambda: model(tokens, mt.zeros(5, dtype=mt.int64)), "Seq2SeqAttentionDecoder: tokens of")
    plain = mt.nn.Seq2Seq(mt.nn.Seq2SeqEncoder(10, 4, 8, 1), mt.nn.Seq2SeqDecoder(10, 4, 8, 1))
    raises(mt.ShapeError, lambda: plain(tokens, mt.zeros(2, 5, 1, dtype=mt.int64)), "Seq2SeqDecoder: tokens of shape")


def test_reshape_names_a_length_that_is_no_number():
    raises(TypeError, lambda: mt.randn(3, 4).reshape("a"), "reshape: lengths are integers, got ('a',)")
    raises(TypeError, lambda: mt.randn(3, 4).view(3, None), "reshape: lengths are integers, got (3, None)")
