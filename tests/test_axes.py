"""Every op that takes an axis refuses an out-of-range one, as NumPy does, with one message.

``mt.softmax(x, axis=2)`` on a 2-D x used to compute along axis 0 (the axis wrapped modulo
ndim): a wrong answer without a word. The ops are found by walking the public API (``mt``,
``mt.nn.functional``, the layers of ``mt.nn``, Tensor's methods) for parameters named like
an axis, so a new op cannot be missed: one the walk finds but ``CASES`` does not know fails
``test_every_op_with_an_axis_is_in_the_table``. Each is then called at axis = ndim and
-ndim-1 (one further for ops that insert an axis), and at every valid axis against NumPy.
"""

import inspect
import math
import pickle
import re

import minitensor.nn.functional as F
import numpy as np
import pytest
from minitensor.errors import AxisError
from minitensor.ops.axes import TORCH_NAMES

import minitensor as mt

AXIS_NAME = re.compile(r"(\w+_)?(axis|axes|dim|dims)\d?")  # axis, axes, start_axis, axis0, dim...
NOT_AXES = {"embedding_dim"}  # sizes that PyTorch habit names *_dim
NAMESPACES = (("mt", mt), ("F", F), ("Tensor", mt.Tensor), ("nn", mt.nn))


def public_ops_with_an_axis():
    """{(namespace, name): (callable, [its axis parameters])} over the public API."""
    found = {}
    for label, namespace in NAMESPACES:
        for name in dir(namespace):
            obj = getattr(namespace, name)
            if name.startswith("_") or not callable(obj) or (inspect.isclass(obj) and label != "nn"):
                continue
            try:
                params = inspect.signature(obj).parameters
            except (TypeError, ValueError):  # builtins without a signature
                continue
            axes = [p for p in params if AXIS_NAME.fullmatch(p) and p not in NOT_AXES]
            if axes:
                found[label, name] = (obj, axes)
    return found


def _key(label, name):
    return f"nn.{name}" if label == "nn" else name


# -- how to call each op, and what NumPy says it should give -------------------------------------
def _softmax(a, axis):
    e = np.exp(a - a.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _log_softmax(a, axis):
    shifted = a - a.max(axis=axis, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))


def _flatten(a, start_axis=0, end_axis=-1):
    s, e = start_axis % a.ndim, end_axis % a.ndim  # in range here: the tests pick valid axes
    return a.reshape(a.shape[:s] + (math.prod(a.shape[s : e + 1]),) + a.shape[e + 1 :])


def _permutation(ndim, axis):
    """The axes in order with ``axis`` (as given, maybe negative or out of range) moved last."""
    if -ndim <= axis < ndim:
        return tuple(i for i in range(ndim) if i != axis % ndim) + (axis,)
    return tuple(range(ndim - 1)) + (axis,)


def _case(op, call=None, ref=None, new=False, shape=(2, 3, 4), valid=None):
    """``op``: the name its error message gives; ``call(fn, x, **{param: axis})`` runs it;
    ``ref(a, **{param: axis})`` is NumPy's answer; ``new``: it inserts an axis; ``valid``:
    the in-range axes to compare (default all)."""
    return dict(op=op, call=call or (lambda f, x, **kw: f(x, **kw)), ref=ref, new=new, shape=shape, valid=valid)


_JOIN = lambda f, x, **kw: f([x, x + 1], **kw)  # noqa: E731
_LAYER = lambda f, x, **kw: f(**kw)(x)  # noqa: E731
_SWAP = lambda a, axis0=-2, axis1=-1: np.swapaxes(a, axis0, axis1)  # noqa: E731

CASES = {
    "softmax": _case("softmax", ref=_softmax),
    "log_softmax": _case("log_softmax", ref=_log_softmax),
    "nn.Softmax": _case("softmax", call=_LAYER, ref=_softmax),
    "nn.LogSoftmax": _case("log_softmax", call=_LAYER, ref=_log_softmax),
    "concat": _case("concat", call=_JOIN, ref=lambda a, axis: np.concatenate([a, a + 1], axis)),
    "cat": _case("concat", call=_JOIN, ref=lambda a, axis: np.concatenate([a, a + 1], axis)),
    "stack": _case("stack", call=_JOIN, ref=lambda a, axis: np.stack([a, a + 1], axis), new=True),
    "split": _case(
        "split", call=lambda f, x, axis: f(x, 1, axis=axis), ref=lambda a, axis: np.split(a, a.shape[axis], axis)
    ),
    "chunk": _case(
        "chunk",
        call=lambda f, x, axis: f(x, 2, axis=axis),
        ref=lambda a, axis: np.split(a, [-(-a.shape[axis] // 2)], axis),  # two pieces of ceil(n / 2) at most
    ),
    "sum": _case("sum", ref=np.sum),
    "mean": _case("mean", ref=np.mean),
    "max": _case("max", ref=np.max),
    "min": _case("min", ref=np.min),
    "var": _case("var", ref=lambda a, axis: np.var(a, axis=axis, ddof=1)),
    "std": _case("std", ref=lambda a, axis: np.std(a, axis=axis, ddof=1)),
    "prod": _case("prod", ref=np.prod),
    "logsumexp": _case("logsumexp", ref=lambda a, axis: np.log(np.exp(a).sum(axis=axis))),
    "norm": _case("norm", ref=lambda a, axis: np.sqrt((a * a).sum(axis=axis))),
    "cumsum": _case("cumsum", ref=np.cumsum),
    "flip": _case("flip", ref=np.flip),
    "gather": _case(
        "gather",
        call=lambda f, x, axis: f(x, axis=axis, index=mt.zeros_like(x, dtype=mt.int64)),
        ref=lambda a, axis: np.take_along_axis(a, np.zeros(a.shape, dtype=np.int64), axis),
    ),
    "argmax": _case("argmax", ref=np.argmax),
    "argmin": _case("argmin", ref=np.argmin),
    "topk": _case(
        "topk",
        call=lambda f, x, axis: f(x, 2, axis=axis).values,
        ref=lambda a, axis: np.take(-np.sort(-a, axis=axis), [0, 1], axis=axis),
    ),
    "sort": _case("sort", call=lambda f, x, axis: f(x, axis=axis).values, ref=lambda a, axis: np.sort(a, axis=axis)),
    "repeat_interleave": _case(
        "repeat_interleave", call=lambda f, x, axis: f(x, 2, axis=axis), ref=lambda a, axis: np.repeat(a, 2, axis)
    ),
    "any": _case("any", call=lambda f, x, axis: f(x > 0, axis=axis), ref=lambda a, axis: np.any(a > 0, axis=axis)),
    "all": _case("all", call=lambda f, x, axis: f(x > 0, axis=axis), ref=lambda a, axis: np.all(a > 0, axis=axis)),
    "size": _case("size", ref=lambda a, axis: a.shape[axis]),
    "unsqueeze": _case("unsqueeze", ref=np.expand_dims, new=True),
    "squeeze": _case("squeeze", ref=lambda a, axis: np.squeeze(a, axis), shape=(1, 3, 1), valid=(0, 2, -1, -3)),
    "flatten": _case("flatten", ref=_flatten),
    "nn.Flatten": _case(
        "flatten", call=_LAYER, ref=lambda a, **kw: _flatten(a, **{"start_axis": 1, **kw}), valid=(1, 2, -1, -2)
    ),
    "transpose": _case("transpose", ref=_SWAP),
    "swapaxes": _case("transpose", ref=_SWAP),
    "permute": _case(
        "permute",
        call=lambda f, x, axes: f(x, *_permutation(x.ndim, axes)),
        ref=lambda a, axes: np.transpose(a, _permutation(a.ndim, axes)),
    ),
}

FOUND = public_ops_with_an_axis()
PARAMS = sorted(
    (label, name, p) for (label, name), (_, axes) in FOUND.items() for p in axes if _key(label, name) in CASES
)


def test_every_op_with_an_axis_is_in_the_table():
    keys = {_key(label, name) for label, name in FOUND}
    missing = sorted(f"{label}.{name}" for label, name in FOUND if _key(label, name) not in CASES)
    assert not missing, f"new op with an axis parameter: add it to the table CASES in tests/test_axes.py: {missing}"
    stale = sorted(set(CASES) - keys)
    assert not stale, f"CASES names ops the public API no longer has (or whose axis parameter was renamed): {stale}"
    # the walk does see what it must: functions, methods, layers, two axis parameters
    for expected in [("mt", "softmax"), ("Tensor", "sum"), ("F", "log_softmax"), ("nn", "Softmax")]:
        assert expected in FOUND
    assert FOUND["mt", "flatten"][1] == ["start_axis", "end_axis"]


def _tensor(shape, device):
    a = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    return a, mt.tensor(a, device=device)


def _as_numpy(out):
    if isinstance(out, (list, tuple)):
        return [_as_numpy(o) for o in out]
    return out.numpy() if isinstance(out, mt.Tensor) else out


@pytest.mark.parametrize("label,name,param", PARAMS, ids=[f"{lb}.{n}-{p}" for lb, n, p in PARAMS])
def test_out_of_range_axis_is_refused(device, label, name, param):
    fn, case = FOUND[label, name][0], CASES[_key(label, name)]
    _, x = _tensor(case["shape"], device)
    n = x.ndim + 1 if case["new"] else x.ndim
    for bad in (n, -n - 1):
        with pytest.raises(AxisError) as info:
            case["call"](fn, x, **{param: bad})
        valid = f"{-n}..{n - 1}" + (", counting the new axis" if case["new"] else "")
        expected = f"{case['op']}: axis {bad} is out of bounds for a tensor of {x.ndim} dimensions (valid: {valid})"
        assert str(info.value) == expected
        assert (info.value.axis, info.value.ndim) == (bad, x.ndim)


@pytest.mark.parametrize("label,name,param", PARAMS, ids=[f"{lb}.{n}-{p}" for lb, n, p in PARAMS])
def test_in_range_axes_match_numpy(device, label, name, param):
    fn, case = FOUND[label, name][0], CASES[_key(label, name)]
    a, x = _tensor(case["shape"], device)
    n = x.ndim + 1 if case["new"] else x.ndim
    for axis in case["valid"] or range(-n, n):
        got = _as_numpy(case["call"](fn, x, **{param: axis}))
        want = case["ref"](a, **{param: axis})
        if isinstance(want, list):
            assert len(got) == len(want), (name, axis)
        for g, w in zip(got, want) if isinstance(want, list) else [(got, want)]:
            assert np.shape(g) == np.shape(w), (name, param, axis)
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6, err_msg=f"{name} {param}={axis}")


# -- PyTorch's words: dim, keepdim, dim0, start_dim ... -------------------------------------------
FROM_NUMPY = {numpy: torch for torch, numpy in TORCH_NAMES.items()}
TORCH_PARAMS = [(label, name, p) for label, name, p in PARAMS if p in FROM_NUMPY]


def test_every_axis_parameter_but_permutes_has_a_pytorch_word():
    assert {p for _, _, p in PARAMS} - set(FROM_NUMPY) == {"axes"}  # permute(*axes): never a keyword
    assert len(TORCH_PARAMS) > 40


@pytest.mark.parametrize("label,name,param", TORCH_PARAMS, ids=[f"{lb}.{n}-{p}" for lb, n, p in TORCH_PARAMS])
def test_pytorchs_word_for_an_axis_gives_what_numpys_gives(label, name, param):
    """``x.sum(dim=1)`` is ``x.sum(axis=1)``, for every op, method and layer of the walk."""
    fn, case = FOUND[label, name][0], CASES[_key(label, name)]

    def in_pytorchs_words(*args, **kwargs):
        return fn(*args, **{FROM_NUMPY.get(k, k): v for k, v in kwargs.items()})

    a, x = _tensor(case["shape"], "cpu")
    n = x.ndim + 1 if case["new"] else x.ndim
    for axis in case["valid"] or range(-n, n):
        got = _as_numpy(case["call"](in_pytorchs_words, x, **{param: axis}))
        want = _as_numpy(case["call"](fn, x, **{param: axis}))
        for g, w in zip(got, want) if isinstance(want, list) else [(got, want)]:
            np.testing.assert_array_equal(g, w, err_msg=f"{name} {FROM_NUMPY[param]}={axis}")
    with pytest.raises(AxisError, match=rf"{case['op']}: axis {n} is out of bounds"):  # the same checks
        case["call"](in_pytorchs_words, x, **{param: n})


@pytest.mark.parametrize("name", ["sum", "mean", "max", "min", "var", "argmax", "argmin"])
def test_keepdim_is_keepdims(name):
    x = mt.randn(2, 3, 4)
    for fn in (getattr(mt, name), getattr(mt.Tensor, name)):
        got = fn(x, dim=1, keepdim=True)
        assert got.shape == (2, 1, 4)
        np.testing.assert_array_equal(got.numpy(), fn(x, axis=1, keepdims=True).numpy())


def test_both_words_for_one_parameter_are_refused_and_unknown_words_stay_unknown():
    x = mt.randn(2, 3)
    for call in (
        lambda: x.sum(axis=0, dim=1),
        lambda: mt.softmax(x, axis=0, dim=0),
        lambda: mt.nn.Softmax(axis=0, dim=1),
    ):
        with pytest.raises(TypeError, match=r"got both axis= and dim=, NumPy's and PyTorch's name of one parameter"):
            call()
    with pytest.raises(TypeError, match="keepdims= and keepdim="):
        mt.mean(x, 0, keepdims=True, keepdim=True)
    with pytest.raises(TypeError, match="unexpected keyword argument 'dims'"):
        x.sum(dims=0)
    with pytest.raises(TypeError, match="multiple values for argument 'axis'"):  # by position and by word
        x.sum(0, dim=0)
    # the signature a reader sees is NumPy's, the function's own
    assert list(inspect.signature(mt.Tensor.sum).parameters) == ["self", "axis", "keepdims"]
    assert mt.nn.Softmax(dim=0).axis == 0


def test_pytorchs_words_agree_with_pytorch():
    torch = pytest.importorskip("torch")
    a = np.random.default_rng(1).standard_normal((2, 3, 4)).astype(np.float32)
    x, t = mt.tensor(a), torch.tensor(a)
    for call in (
        lambda m: m.softmax(dim=1),
        lambda m: m.sum(dim=(0, 2), keepdim=True),
        lambda m: m.var(dim=-1, keepdim=True),
        lambda m: m.transpose(dim0=0, dim1=2),
        lambda m: m.flatten(start_dim=1),
        lambda m: m.argmax(dim=2, keepdim=True),
    ):
        np.testing.assert_allclose(call(x).numpy(), call(t).numpy(), rtol=1e-6, atol=1e-6)


# -- several axes at once, permutations, the odd cases --------------------------------------------
SEVERAL = ["sum", "mean", "max", "min", "var", "any", "all", "squeeze"]


@pytest.mark.parametrize("name", SEVERAL)
def test_tuples_of_axes_are_checked_one_by_one_and_repeats_refused(device, name):
    _, x = _tensor((1, 3, 1) if name == "squeeze" else (2, 3, 4), device)
    method = getattr(x > 0 if name in ("any", "all") else x, name)
    out_of_range = rf"^{name}: axis 3 is out of bounds for a tensor of 3 dimensions \(valid: -3\.\.2\)$"
    with pytest.raises(AxisError, match=out_of_range):
        method(axis=(0, 3))
    with pytest.raises(AxisError, match=rf"^{name}: axis 0 is repeated in \(0, -3\) \(a tensor of 3 dimensions\)$"):
        method(axis=(0, -3))
    with pytest.raises(TypeError, match=rf"^{name}: axis must be an integer"):
        method(axis=1.0)


def test_several_axes_still_give_numpy_results(device):
    a, x = _tensor((2, 3, 4), device)
    np.testing.assert_allclose(x.sum(axis=(-1, 0)).numpy(), a.sum(axis=(0, 2)), rtol=1e-5)
    np.testing.assert_allclose(x.var(axis=[2, 1]).numpy(), a.var(axis=(1, 2), ddof=1), rtol=1e-5)
    np.testing.assert_array_equal((x > 0).any(axis=(0, -1)).numpy(), (a > 0).any(axis=(0, 2)))
    assert x.sum(axis=()).shape == (2, 3, 4)
    assert mt.ones(1, 3, 1, device=device).squeeze((-1, 0)).shape == (3,)


def test_numpy_integers_are_axes_too(device):
    a, x = _tensor((2, 3), device)
    np.testing.assert_allclose(mt.softmax(x, axis=np.int64(0)).numpy(), _softmax(a, 0), rtol=1e-5)
    assert x.sum(axis=np.int32(-1)).shape == (2,)
    assert mt.stack([x, x], axis=np.int64(2)).shape == (2, 3, 2)
    with pytest.raises(AxisError, match="softmax: axis 2 is out"):
        mt.softmax(x, axis=np.int64(2))


def test_permute_needs_every_axis_once(device):
    x = mt.ones(2, 3, 4, device=device)
    for axes in [(0, 1), (0, 1, 2, 0), (0, 0, 1), (0, 1, -3)]:
        message = f"permute: {axes} is not a permutation of the 3 axes of shape (2, 3, 4): it must name every axis once"
        with pytest.raises(AxisError, match=re.escape(message)):
            x.permute(*axes)
    assert x.permute(-1, 0, -2).shape == (4, 2, 3)
    assert x.T.shape == (4, 3, 2)


def test_flatten_start_after_end_is_refused(device):
    x = mt.ones(2, 3, 4, device=device)
    with pytest.raises(AxisError, match=r"^flatten: start_axis 2 comes after end_axis 1 \(axes 2 and 1 of a tensor"):
        x.flatten(2, 1)
    with pytest.raises(AxisError, match=r"flatten: start_axis -1 comes after end_axis 0"):
        x.flatten(-1, 0)
    assert x.flatten(1, 1).shape == (2, 3, 4)
    assert mt.ones(0, 3, device=device).flatten(1).shape == (0, 3)


def test_zero_d_tensors_have_no_axes(device):
    s = mt.tensor(2.0, device=device)
    calls = {
        "sum": lambda: s.sum(axis=0),
        "softmax": lambda: mt.softmax(s),
        "unsqueeze": lambda: s.unsqueeze(2),
        "masked_softmax": lambda: mt.masked_softmax(s),
    }
    for op, call in calls.items():
        with pytest.raises(AxisError, match=f"^{op}: axis -?[0-9] is out of bounds for a tensor of 0 dimensions"):
            call()
    with pytest.raises(AxisError, match=r"\(valid: none, a 0-d tensor has no axes\)"):
        s.sum(axis=-1)
    assert s.sum().item() == 2.0 and s.sum(axis=()).item() == 2.0
    assert s.unsqueeze(-1).shape == (1,) and mt.stack([s, s], axis=-1).shape == (2,)
    # flatten keeps PyTorch's rule: a 0-d tensor flattens to (1,), and 0 / -1 name its one "axis"
    assert s.flatten().shape == (1,) and s.flatten(-1, 0).shape == (1,)
    zero_d = r"^flatten: axis 1 is out of bounds for a tensor of 0 dimensions \(valid: 0 or -1, as in PyTorch\)$"
    with pytest.raises(AxisError, match=zero_d):
        s.flatten(1)


def test_one_dimension_is_singular(device):
    one_d = r"^softmax: axis 1 is out of bounds for a tensor of 1 dimension \(valid: -1\.\.0\)$"
    with pytest.raises(AxisError, match=one_d):
        mt.ones(3, device=device).softmax(axis=1)


def test_the_error_is_numpys_axis_error_and_a_value_and_index_error():
    with pytest.raises(np.exceptions.AxisError):
        mt.ones(2, 3).sum(axis=2)
    for base in (ValueError, IndexError, mt.ShapeError):
        with pytest.raises(base):
            mt.softmax(mt.ones(2, 3), axis=-3)
    with pytest.raises(AxisError) as info:
        mt.concat([mt.ones(2, 3)], axis=5)
    copy = pickle.loads(pickle.dumps(info.value))
    assert str(copy) == str(info.value) and (copy.axis, copy.ndim) == (5, 2)


def test_gradients_flow_along_the_axis_asked_for():
    a = np.random.default_rng(1).standard_normal((2, 3)).astype(np.float64)
    for axis in (0, 1, -1, -2):
        x = mt.tensor(a, requires_grad=True)
        (mt.softmax(x, axis=axis) * mt.tensor(np.arange(6.0).reshape(2, 3))).sum().backward()
        y, g = _softmax(a, axis), np.arange(6.0).reshape(2, 3)
        np.testing.assert_allclose(x.grad.numpy(), y * (g - (g * y).sum(axis=axis, keepdims=True)), rtol=1e-10)


def test_expand_and_split_refuse_what_would_be_silently_wrong(device):
    x = mt.ones(3, device=device)
    with pytest.raises(mt.ShapeError, match=r"^expand: -1 \(keep the size\) in \(-1, 3\) at a new leading axis"):
        x.expand(-1, 3)
    assert x.expand(2, -1).shape == (2, 3)
    with pytest.raises(ValueError, match=r"^split: piece sizes must not be negative, got \[4, -1\]"):
        x.split([4, -1])
