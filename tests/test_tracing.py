"""The engine's one hook for a tracer (minitensor/core/tracing.py): ``Function.apply`` reports
every op to the installed tracer, the ops outside the graph (comparisons, ``argmax``,
``arange``, ``zeros``) included, and nothing else in the engine knows that tracers exist:
``Tensor.shape`` is plain code, and outside a trace every length is an int."""

import ast
import inspect
import io
import pathlib
import textwrap
import tokenize

import pytest
from minitensor.autograd import Function
from minitensor.creation import Arange, Full
from minitensor.ops import compare, convert, elementwise, reduce

import minitensor as mt

CORE = pathlib.Path(__file__).resolve().parents[1] / "minitensor" / "core"
TRACER_NAMES = {"tracing", "tracer", "_traced", "SymDim", "TracedTensor"}


def names_in_code(path):
    """(line, name) of every Python name in ``path``'s code (not in its comments or strings)."""
    tokens = tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
    return [(t.start[0], t.string) for t in tokens if t.type == tokenize.NAME]


class Recorder:
    """A tracer: keeps what the hook reports."""

    def __init__(self):
        self.calls = []

    def function(self, cls, args, kwargs, out):
        self.calls.append((cls, args, kwargs, out))


def test_the_engine_consults_the_tracer_in_function_apply_only():
    """No engine module but autograd.py (and tracing.py, the hook itself) names the tracer, and
    autograd.py only inside ``Function.apply``."""
    for path in sorted(CORE.rglob("*.py")):
        if path.name in ("autograd.py", "tracing.py") and path.parent == CORE:
            continue
        mentions = [(line, name) for line, name in names_in_code(path) if name in TRACER_NAMES]
        assert not mentions, f"minitensor/core/{path.relative_to(CORE)} knows about tracing: {mentions}"

    source = (CORE / "autograd.py").read_text()
    tree = ast.parse(source)
    function = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Function")
    apply = next(n for n in function.body if isinstance(n, ast.FunctionDef) and n.name == "apply")
    imports = {n.lineno for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))}
    lines = {line for line, name in names_in_code(CORE / "autograd.py") if name in TRACER_NAMES} - imports
    assert lines and all(apply.lineno <= line <= apply.end_lineno for line in lines), sorted(lines)


def test_tensor_shape_is_plain_code_and_gives_ints():
    body = ast.parse(textwrap.dedent(inspect.getsource(mt.Tensor.shape.fget))).body[0].body
    code = [node for node in body if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant))]
    assert [ast.unparse(node) for node in code] == ["return tuple(self.data.shape)"]
    x = mt.randn(2, 3)
    assert x.shape == (2, 3) and all(type(n) is int for n in x.shape)
    assert all(type(n) is int for n in (x * 2).reshape(3, 2).shape)


def test_a_comparison_reaches_the_tracer_through_function_apply():
    x = mt.randn(4, requires_grad=True)
    recorder = Recorder()
    with mt.tracing.install(recorder):
        mask = x > 0
        scaled = (x * 2).sum()
    assert [call[0] for call in recorder.calls] == [compare.Greater, elementwise.Mul, reduce.Sum]
    cls, args, kwargs, out = recorder.calls[0]
    assert args[0] is x and args[1] == 0 and kwargs == {} and out is mask
    assert mask.dtype == mt.bool and not mask.requires_grad and mask.grad_fn is None  # outside the graph
    assert scaled.requires_grad  # the differentiable ops still build it
    assert mt.tracing.tracer is None  # uninstalled on leaving the block


def test_every_op_outside_the_graph_is_a_function_the_tracer_sees():
    x, i = mt.randn(2, 3), mt.tensor([1, 2, 3])
    recorder = Recorder()
    with mt.tracing.install(recorder):
        made = [
            x == 0,
            x != 0,
            x < 0,
            x <= 0,
            x >= 0,
            (x > 0) & (x < 1),
            (x > 0) | (x < 1),
            (x > 0) ^ (x < 1),
            ~(x > 0),
            (x > 0).any(),
            (x > 0).all(axis=1),
            x.argmax(axis=1),
            x.argmin(),
            mt.arange(3),
            mt.zeros(2, 2),
            mt.ones(2),
            mt.full((2,), 7.0),
            i + 0.5,  # an integer tensor meets a float: cast by AsType
        ]
    seen = {cls for cls, _, _, _ in recorder.calls}
    expected = {
        compare.Equal,
        compare.NotEqual,
        compare.Less,
        compare.LessEqual,
        compare.Greater,
        compare.GreaterEqual,
        compare.And,
        compare.Or,
        compare.Xor,
        compare.Invert,
        compare.AnyTrue,
        compare.AllTrue,
        reduce.ArgMax,
        reduce.ArgMin,
        Arange,
        Full,
        convert.AsType,
    }
    assert expected <= seen, expected - seen
    outputs = {id(out) for _, _, _, out in recorder.calls}
    assert all(id(t) in outputs for t in made)
    assert all(not cls.differentiable for cls in expected - {convert.AsType})


def test_an_op_outside_the_graph_never_requires_grad():
    w = mt.randn(3, requires_grad=True)
    for out in (w > 0, w == w, w.argmax(), (w > 0).any()):
        assert not out.requires_grad and out.grad_fn is None
    (w * (w > 0)).sum().backward()  # the mask stops nothing it should not: the product carries the gradient
    assert w.grad is not None


def test_values_and_devices_of_ops_outside_the_graph():
    x = mt.tensor([[1.0, -2.0, 3.0], [0.0, 5.0, -1.0]])
    assert (x > 0).tolist() == [[True, False, True], [False, True, False]]
    assert x.argmax(axis=1, keepdims=True).tolist() == [[2], [1]] and x.argmin().item() == 1
    assert mt.zeros(2, 3, dtype=mt.int64).tolist() == [[0] * 3] * 2 and mt.full(2, 7.0).tolist() == [7.0, 7.0]
    assert mt.arange(1, 7, 2).tolist() == [1, 3, 5] and mt.arange(3.0).dtype == mt.float32
    # float32 against float64: bools, no precision to lose (arithmetic refuses the pair)
    assert (x == x.to(mt.float64)).all().item()
    with pytest.raises(mt.DTypeError):
        x + x.to(mt.float64)
    with pytest.raises(TypeError, match="needs at least one Tensor argument"):
        compare.Less.apply(1, 2)
    # a maker's own error (NumPy's words) stays what it is: no shapes of tensors met
    with pytest.raises(ValueError, match="negative dimensions") as error:
        Full.apply((-1,), 0, dtype=mt.float32, device="cpu")
    assert not isinstance(error.value, mt.ShapeError)
    with pytest.raises(ValueError, match="zeros: a shape is whole numbers >= 0"):  # checked before it
        mt.zeros(-1)


def test_tracers_do_not_nest():
    with mt.tracing.install(Recorder()):
        with pytest.raises(RuntimeError, match="do not nest"):
            with mt.tracing.install(Recorder()):
                pass
    assert mt.tracing.tracer is None


def test_a_function_of_ones_own_reaches_the_tracer_too():
    class Double(Function):
        @staticmethod
        def forward(ctx, a):
            return a * 2

        @staticmethod
        def backward(ctx, grad):
            return grad * 2

    recorder = Recorder()
    x = mt.randn(2)
    with mt.tracing.install(recorder):
        y = Double.apply(x)
    assert [(c[0], c[3]) for c in recorder.calls] == [(Double, y)]
