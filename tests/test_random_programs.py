"""Random programs against a NumPy interpreter of the same steps: the engine's bookkeeping under
fan-out, views, detached values and writes in the graph.

Each op has its own gradient test (test_gradients.py); what those cannot reach is how the
engine joins them: a value used by many later ops, a slice's gradient added into one array
(``autograd.GradAt``), pieces of one op (``for row in x``, ``chunk``, ``split``), views
(reshaped, or expanded with zero strides), ops that save their inputs, a leaf taking a gradient
without a copy, ``x[index] = v`` and D2L's ``X[~mask] = -1e6`` rebinding x -- in place where
nothing else can reach x's array, out of place where something can -- while the ops that used
x before the write still reach the value they used. Those paths decide by who holds an array
(reference counts), so a program written by hypothesis, mixing them in any order, is run on
minitensor and, step by step, on plain NumPy arrays with the semantics of
``docs/pytorch_differences.md`` (a write in the graph makes a new value; a detached value is a
constant). The loss is a weighted sum of some of the values' final bindings; its gradient with
respect to each input must equal central differences of the NumPy program.
"""

import numpy as np
import pytest
from conftest import DEVICES
from hypothesis import given, settings
from hypothesis import strategies as st

import minitensor as mt

INPUT_SHAPES = [(3, 4), (4,), (3, 1)]

# The shapes a program's values take: any two broadcast together.
# index -> (the shape read or written there, from each shape it applies to)
INDICES = {
    (3, 4): [0, -1, (slice(None), slice(1, 2)), (slice(None, None, -1),), (1, slice(2, 3)), (slice(1, None),)],
    (4,): [(slice(None, None, -1),), (slice(1, 2),), 2, (slice(None, None, 2),)],
    (3, 1): [(slice(None, None, -1),), 0, (1, 0), (slice(0, 2),)],
    (1,): [0, (slice(None),)],
    (): [],
}
# (axis, keepdims) of a sum that keeps a value's shape among INDICES' keys
REDUCTIONS = {
    (3, 4): [(0, False), (1, True), (None, False)],
    (4,): [(0, True), (None, False)],
    (3, 1): [(0, False), (None, False)],
    (1,): [(0, False)],
    (): [],
}
BINARY = {
    "add": (lambda a, b: a + b, lambda a, b: a + b),
    "sub": (lambda a, b: a - b, lambda a, b: a - b),
    "mul": (lambda a, b: a * b, lambda a, b: a * b),
    "div": (lambda a, b: a / (b * b + 2.0), lambda a, b: a / (b * b + 2.0)),
}
UNARY = {
    "tanh": (lambda a: a.tanh(), np.tanh),
    "sin": (lambda a: a.sin(), np.sin),
    "exp_tanh": (lambda a: a.tanh().exp(), lambda a: np.exp(np.tanh(a))),
}


# a value's shape -> the shapes it may be expanded to (a view with zero strides)
EXPANDS = {(4,): [(3, 4)], (3, 1): [(3, 4)], (1,): [(4,), (3, 4), (3, 1)], (): [(1,), (4,)]}
# a value's shape -> the ways to cut it into pieces (``for row in x``, chunk, split) and their shapes
PIECES = {(3, 4): {"rows": [(4,)] * 3, "columns": [(3, 1)] * 4}, (3, 1): {"rows": [(1,)] * 3, "split": [(1,)] * 3}}
KINDS = ["binary", "unary", "matmul", "reduce", "read", "view", "clone", "expand", "pieces", "detach", "fill"] + [
    "write"
] * 3


MATRIX = np.random.default_rng(7).standard_normal((4, 4)) / 2


def _shape(index, shape):
    return np.zeros(shape)[index].shape


@st.composite
def programs(draw):
    """A list of steps over values 0, 1, 2 (the inputs) and each step's result after them."""
    shapes = list(INPUT_SHAPES)
    writable = [False] * len(shapes)  # the inputs are leaves that require grad: writes refused
    grad = [True] * len(shapes)  # does the value require grad (is a write to it in the graph)?
    steps = []
    for _ in range(draw(st.integers(1, 12))):
        n = len(shapes)
        kind = draw(st.sampled_from(KINDS))
        i = draw(st.integers(0, n - 1))
        if kind == "binary":
            j = draw(st.integers(0, n - 1))
            steps.append(("binary", draw(st.sampled_from(sorted(BINARY))), i, j))
            shapes.append(np.broadcast_shapes(shapes[i], shapes[j]))
            grad.append(grad[i] or grad[j])
            writable.append(True)
            continue
        elif kind == "unary":
            steps.append(("unary", draw(st.sampled_from(sorted(UNARY))), i))
            shapes.append(shapes[i])
        elif kind == "matmul" and shapes[i] in ((3, 4), (4,)):  # x @ W, W a constant (4, 4): saves x
            steps.append(("matmul", i))
            shapes.append(shapes[i])
        elif kind == "reduce" and REDUCTIONS[shapes[i]]:
            axis, keepdims = draw(st.sampled_from(REDUCTIONS[shapes[i]]))
            steps.append(("reduce", i, axis, keepdims))
            shapes.append(np.zeros(shapes[i]).sum(axis=axis, keepdims=keepdims).shape)
        elif kind == "read" and INDICES[shapes[i]]:
            index = draw(st.sampled_from(INDICES[shapes[i]]))
            target = _shape(index, shapes[i])
            if target not in INDICES:
                continue
            steps.append(("read", i, index))
            shapes.append(target)
        elif kind in ("view", "clone"):
            steps.append((kind, i))
            shapes.append(shapes[i])
        elif kind == "pieces" and PIECES.get(shapes[i]):
            how = draw(st.sampled_from(sorted(PIECES[shapes[i]])))
            steps.append(("pieces", i, how))  # several results of one op: slices of one gradient
            for shape in PIECES[shapes[i]][how]:
                shapes.append(shape)
                grad.append(grad[i])
                writable.append(True)
            continue
        elif kind == "expand" and EXPANDS.get(shapes[i]):
            shape = draw(st.sampled_from(EXPANDS[shapes[i]]))
            steps.append(("expand", i, shape))  # a read-only view: a write to it must copy
            shapes.append(shape)
        elif kind == "detach":
            steps.append(("detach", i))
            shapes.append(shapes[i])
            grad.append(False)  # a constant, sharing i's array; a write in the graph makes it a node
            writable.append(True)
            continue
        elif kind == "write" and any(w and INDICES[s] for w, s in zip(writable, shapes)):
            i = draw(st.sampled_from([k for k in range(n) if writable[k] and INDICES[shapes[k]]]))
            index = draw(st.sampled_from(INDICES[shapes[i]]))
            target = _shape(index, shapes[i])
            # in the graph only (outside it a write is in place, as NumPy's, and reaches views)
            fits = [
                j
                for j in range(n)
                if (grad[i] or grad[j]) and len(shapes[j]) <= len(target) and _broadcasts(shapes[j], target)
            ]
            if fits:
                j = draw(st.sampled_from(fits))
                steps.append(("write", i, index, j))
                grad[i] = True
            continue
        elif kind == "fill" and grad[i] and writable[i]:  # x[index] = a number, or D2L's X[~mask] = -1e6
            mask = draw(st.lists(st.booleans(), min_size=int(np.prod(shapes[i])), max_size=int(np.prod(shapes[i]))))
            index = draw(st.sampled_from([*INDICES[shapes[i]], np.array(mask, bool).reshape(shapes[i])]))
            steps.append(
                ("fill", i, index, draw(st.sampled_from([0.0, -7.0, 2.5])))
            )  # (-1e6 would swamp the differences)
            continue
        else:
            continue
        grad.append(grad[i])
        writable.append(True)
    # the values in the loss: the last, and any others (a value left out passes on the gradient
    # it gets as the op made it -- Add's one array for both inputs, say -- not a sum)
    in_loss = [draw(st.booleans()) for _ in shapes[:-1]] + [True]
    return steps, in_loss, draw(st.booleans())


def _broadcasts(shape, target):
    try:
        return np.broadcast_shapes(shape, target) == target
    except ValueError:
        return False


def run_minitensor(steps, inputs, hold, constant=None):
    """The program on tensors; with ``hold``, a detached copy of every value is kept alive, so
    that no write can go in place. Returns every value's final binding. ``constant(array, dtype,
    device)`` makes the tensors of the constants it uses (a matrix, a mask): ``mt.tensor``."""
    constant = constant or (lambda array, dtype, device: mt.tensor(array, dtype=dtype, device=device))
    values = list(inputs)
    held = []
    for step in steps:
        kind = step[0]
        if kind == "binary":
            values.append(BINARY[step[1]][0](values[step[2]], values[step[3]]))
        elif kind == "unary":
            values.append(UNARY[step[1]][0](values[step[2]]))
        elif kind == "matmul":
            x = values[step[1]]
            values.append(x @ constant(MATRIX, x.dtype, x.device))
        elif kind == "reduce":
            _, i, axis, keepdims = step
            values.append(values[i].sum(axis=axis, keepdims=keepdims))
        elif kind == "read":
            values.append(values[step[1]][step[2]])
        elif kind == "view":
            x = values[step[1]]
            values.append(x.reshape(-1).reshape(x.shape))
        elif kind == "clone":
            values.append(values[step[1]].clone())
        elif kind == "pieces":
            x, how = values[step[1]], step[2]
            if how == "split":  # (3, 1) -> three (1, 1), reversed, each reshaped to (1,)
                values.extend(p.reshape(1) for p in x.split(1)[::-1])
            else:
                values.extend(list(x) if how == "rows" else x.chunk(4, axis=1))
        elif kind == "expand":
            values.append(values[step[1]].expand(*step[2]))
        elif kind == "detach":
            values.append(values[step[1]].detach())
        elif kind == "fill":
            _, i, index, number = step
            values[i][constant(index, None, values[i].device) if isinstance(index, np.ndarray) else index] = number
        else:  # x[index] = v: the tensor object is rebound, every later use sees the new value
            _, i, index, j = step
            values[i][index] = values[j]
        if hold:
            held.extend(v.detach() for v in values)
    return values


def run_numpy(steps, inputs, constants=None):
    """The same program on arrays, with minitensor's semantics: a write makes a new value (the
    old one stays as earlier steps used it); a detached value is the constant recorded in
    ``constants`` (by step) if given, else its value now (and recorded there)."""
    values = [np.array(a, dtype=np.float64) for a in inputs]
    recorded = {} if constants is None else constants
    for k, step in enumerate(steps):
        kind = step[0]
        if kind == "binary":
            values.append(BINARY[step[1]][1](values[step[2]], values[step[3]]))
        elif kind == "unary":
            values.append(UNARY[step[1]][1](values[step[2]]))
        elif kind == "matmul":
            values.append(values[step[1]] @ MATRIX)
        elif kind == "reduce":
            _, i, axis, keepdims = step
            values.append(np.asarray(values[i].sum(axis=axis, keepdims=keepdims)))
        elif kind == "read":
            values.append(np.array(values[step[1]][step[2]]))
        elif kind in ("view", "clone"):
            values.append(values[step[1]].copy())
        elif kind == "expand":
            values.append(np.broadcast_to(values[step[1]], step[2]).copy())
        elif kind == "pieces":
            x, how = values[step[1]], step[2]
            if how == "split":  # (3, 1) -> three (1, 1), reversed: seen as (1,) each
                pieces = [p.reshape(1) for p in np.split(x, 3)[::-1]]
            else:
                pieces = list(x) if how == "rows" else np.split(x, 4, axis=1)
            values.extend(np.array(p) for p in pieces)
        elif kind == "fill":
            _, i, index, number = step
            new = np.array(values[i])  # (a copy, an array even where NumPy made a scalar)
            new[index] = number
            values[i] = new
        elif kind == "detach":
            if constants is None:
                recorded[k] = values[step[1]].copy()
            values.append(recorded[k].copy())
        else:
            _, i, index, j = step
            new = np.array(values[i])  # (a copy, an array even where NumPy made a scalar)
            new[index] = values[j]
            values[i] = new
    return values, recorded


def loss_weights(steps, in_loss, seed=1):
    """A fixed weight array per value in the loss, sum_k sum(value_k * weight_k), else None."""
    values, _ = run_numpy(steps, [np.zeros(s) for s in INPUT_SHAPES])
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(v.shape) if used else None for v, used in zip(values, in_loss)]


def numeric_gradients(steps, inputs, weights, eps=1e-6):
    """Central differences of the NumPy program's loss, with the detached values held fixed."""
    _, constants = run_numpy(steps, inputs)

    def loss(arrays):
        values, _ = run_numpy(steps, arrays, constants)
        return sum(float((v * w).sum()) for v, w in zip(values, weights) if w is not None)

    grads = []
    for n, a in enumerate(inputs):
        g = np.zeros(a.shape)
        for position in np.ndindex(a.shape):
            plus = [x.copy() for x in inputs]
            minus = [x.copy() for x in inputs]
            plus[n][position] += eps
            minus[n][position] -= eps
            g[position] = (loss(plus) - loss(minus)) / (2 * eps)
        grads.append(g)
    return grads


@pytest.mark.parametrize("device", DEVICES)  # (and "cuda" where CuPy finds a GPU: pytest -m gpu)
@settings(max_examples=80, deadline=None)
@given(case=programs(), seed=st.integers(0, 2**16))
def test_a_random_program_has_numpys_values_and_its_gradients(device, case, seed):
    steps, in_loss, hold = case
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal(s) for s in INPUT_SHAPES]
    weights = loss_weights(steps, in_loss)
    inputs = [mt.tensor(a, dtype=mt.float64, device=device, requires_grad=True) for a in arrays]
    values = run_minitensor(steps, inputs, hold)
    expected, _ = run_numpy(steps, arrays)
    for k, (v, e) in enumerate(zip(values, expected)):
        np.testing.assert_allclose(v.numpy(), e, rtol=1e-12, atol=1e-12, err_msg=f"value {k}")
    loss = None
    for v, w in zip(values, weights):
        if w is None:
            continue
        part = (v * mt.tensor(w, dtype=mt.float64, device=device)).sum()
        loss = part if loss is None else loss + part
    if not loss.requires_grad:  # (every value detached: nothing to differentiate)
        return
    loss.backward()
    for n, (x, g) in enumerate(zip(inputs, numeric_gradients(steps, arrays, weights))):
        got = np.zeros(x.shape) if x.grad is None else x.grad.numpy()
        np.testing.assert_allclose(got, g, rtol=1e-5, atol=1e-6, err_msg=f"input {n}")


def test_in_place_and_out_of_place_writes_give_the_same_gradients_bit_for_bit():
    """One program, its writes once in place and once (a copy of every value held) out of place."""
    steps = [
        ("binary", "mul", 0, 1),  # 3: (3, 4)
        ("read", 3, 0),  # 4: a view of 3's row 0
        ("unary", "tanh", 3),  # 5
        ("write", 5, 0, 1),  # 5[0] = input 1
        ("write", 5, (slice(None), slice(1, 2)), 2),  # 5[:, 1:2] = input 2
        ("binary", "add", 5, 4),  # 6
        ("write", 3, -1, 4),  # 3[-1] = its own row 0, read before
    ]
    grads = []
    for hold in (False, True):
        inputs = [mt.tensor(np.random.default_rng(0).standard_normal(s), requires_grad=True) for s in INPUT_SHAPES]
        values = run_minitensor(steps, inputs, hold)
        sum((v * (k + 1.0)).sum() for k, v in enumerate(values)).backward()
        grads.append([x.grad.numpy() for x in inputs])
    for a, b in zip(*grads):
        np.testing.assert_array_equal(a, b)
