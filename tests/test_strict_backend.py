"""The "strict" test backend really behaves like CuPy where it matters: if it silently
accepted NumPy calls, the op tests running on it would prove nothing."""

from pathlib import Path

import numpy as np
import pytest
from helpers import load_module
from minitensor.autograd import Function
from strict_backend import StrictArray
from strict_backend import strict_xp as xp

import minitensor as mt


def sa(values):
    return StrictArray(np.asarray(values, dtype=np.float64))


@pytest.mark.parametrize(
    "host_call",
    [
        np.asarray,
        np.array,
        np.exp,
        np.sum,
        lambda a: np.moveaxis(a, 0, -1),
        lambda a: np.where(a > 0, a, 0),
        lambda a: np.concatenate([a, a]),
        lambda a: np.add.at(a, [0], 1.0),
        lambda a: a + np.ones(2),
        lambda a: np.ones(2) * a,
        lambda a: xp.where(a > 0, np.ones(2), a),  # a host array in a device function
        lambda a: a.__setitem__(slice(None), np.ones(2)),
    ],
)
def test_refuses_the_host(host_call):
    with pytest.raises(TypeError):
        host_call(sa([1.0, 2.0]))


def test_the_implicit_conversion_message_is_cupys():
    with pytest.raises(TypeError, match="Implicit conversion to a NumPy array is not allowed"):
        np.asarray(sa([1.0]))


def test_works_like_an_array():
    a = sa([[1.0, -2.0], [3.0, 4.0]])
    assert a.shape == (2, 2) and a.ndim == 2 and a.size == 4 and a.dtype == np.float64 and len(a) == 2
    np.testing.assert_array_equal((a + 1).get(), [[2, -1], [4, 5]])
    np.testing.assert_array_equal((2.0**a * np.float32(1)).get(), 2.0 ** np.array([[1, -2], [3, 4]]))
    np.testing.assert_array_equal((a @ a.T).get(), a.get() @ a.get().T)
    np.testing.assert_array_equal((-a).get(), -a.get())
    np.testing.assert_array_equal(((a > 0) & ~(a > 3)).get(), [[True, False], [True, False]])
    s = a.sum()
    assert isinstance(s, StrictArray) and s.shape == ()  # CuPy returns 0-d arrays, not scalars
    assert isinstance(a[0, 0], StrictArray)
    assert float(s) == 6.0 and int(a[1, 1]) == 4 and bool(a[0, 0] > 0) and s.item() == 6.0
    b = a.copy()
    b += 1
    b[0] = 0.0
    b[a > 3] = sa(-1.0)
    np.testing.assert_array_equal(b.get(), [[0, 0], [4, -1]])
    np.testing.assert_array_equal(a.get(), [[1, -2], [3, 4]])  # the copy was independent
    assert [r.shape for r in a] == [(2,), (2,)]
    with pytest.raises(ValueError):
        bool(a)
    with pytest.raises(TypeError):
        float(a)


def test_get_is_a_copy():
    a = sa([1.0])
    h = a.get()
    h[0] = 5
    assert a.item() == 1.0


def test_namespace_is_like_cupy():
    assert xp.float32 is np.float32 and xp.inf == np.inf and xp.newaxis is None
    assert xp.ndarray is StrictArray
    a = xp.zeros((3,))
    assert isinstance(a, StrictArray)
    xp.add.at(a, sa([0, 0, 2]).astype("int64"), sa([1.0, 1.0, 1.0]))  # in place, through the wrapper
    np.testing.assert_array_equal(a.get(), [2, 0, 1])
    parts = xp.split(xp.arange(6), 3)
    assert all(isinstance(p, StrictArray) for p in parts)
    assert isinstance(xp.asarray(np.ones(2)), StrictArray)  # the explicit upload
    assert isinstance(xp.log(2.0), StrictArray)  # scalars in, 0-d array out (as CuPy)


def test_namespace_has_only_what_cupy_has():
    """NumPy's names and keywords that CuPy lacks fail here as on a GPU (tests/cupy_api.json, read
    off CuPy by scripts/cupy_api.py), with what CuPy takes instead."""
    assert getattr(xp, "errstate", None) is None  # kernels/reference.py asks so, and gets a no-op
    with pytest.raises(AttributeError, match="'cupy' has no attribute 'errstate'"):
        xp.errstate(all="ignore")
    with pytest.raises(AttributeError, match="has no attribute 'random.bit_generator'"):
        xp.random.bit_generator  # a name in NumPy's random that CuPy's does not have
    a = xp.ones((2, 3))
    with pytest.raises(
        TypeError, match=r"'initial', which CuPy .*ndarray.max does not take \(it takes axis, out, keepdims"
    ):
        a.max(initial=0.0)
    with pytest.raises(TypeError, match="'like'"):
        xp.zeros(3, like=a)
    with pytest.raises(TypeError, match="'where'"):
        xp.exp(a, where=a > 0)  # a ufunc: out, casting and dtype only
    with pytest.raises(TypeError, match="at most 3 positional"):
        xp.argsort(a, -1, "stable", None)
    with pytest.raises(AttributeError, match="ufunc has no method 'resolve_dtypes'"):
        xp.add.resolve_dtypes
    # what CuPy does take passes: keywords by name, positional out of a ufunc, stable sorts
    np.testing.assert_array_equal(xp.argsort(a, axis=1, kind="stable").get(), [[0, 1, 2]] * 2)
    out = xp.empty((2, 3))
    xp.exp(a, out)
    assert a.max(axis=0, keepdims=True).shape == (1, 3)


def test_kernels_take_device_arrays_only():
    k = mt.get_backend("strict").kernels
    x = sa(np.arange(6.0).reshape(2, 3))
    y = k.softmax_forward(x)
    assert isinstance(y, StrictArray)
    np.testing.assert_allclose(y.get().sum(axis=1), 1)
    with pytest.raises(TypeError, match="device array"):
        k.softmax_forward(np.zeros((2, 3)))
    with pytest.raises(ValueError, match="contiguous"):
        k.log_softmax_forward(x.T)
    with pytest.raises(ValueError, match="lens"):
        k.softmax_forward(x, sa([1.0, 2.0]))


class HostExp(Function):
    """An op that (wrongly) calls numpy directly on tensor data."""

    @staticmethod
    def forward(ctx, a):
        return np.exp(a)

    @staticmethod
    def backward(ctx, grad):
        return grad


def test_a_hidden_numpy_call_passes_on_cpu_and_fails_on_strict():
    assert HostExp.apply(mt.ones(2)).shape == (2,)
    with pytest.raises(TypeError):
        HostExp.apply(mt.ones(2, device="strict"))


class AddIntoEmpty(Function):
    """An op that (wrongly) adds into memory fresh from ``xp.empty`` as if it held zeros."""

    @staticmethod
    def forward(ctx, a):
        out = ctx.xp.empty(a.shape, a.dtype)
        out += a
        return out


def test_empty_hands_out_garbage_as_cupys_memory_pool_does():
    """``cupy.empty`` gives a block an earlier array used; NumPy's fresh pages are zeros, which
    would let an op that reads before it writes pass here and fail on a GPU."""
    assert np.isnan(xp.empty((2, 3), np.float32).get()).all()
    assert (xp.empty_like(xp.zeros(4, np.int64)).get() == -1).all()
    assert (xp.empty(3, np.uint8).get() == 255).all() and xp.empty(2, bool).get().all()
    assert np.isnan(AddIntoEmpty.apply(mt.ones(3, device="strict")).numpy()).all()


def test_strict_tensors_hold_strict_arrays():
    t = mt.randn(2, 3, device="strict", requires_grad=True)
    assert isinstance(t.data, StrictArray)
    y = (t.softmax() * 2).sum()
    assert isinstance(y.data, StrictArray)
    y.backward()
    assert isinstance(t.grad.data, StrictArray)


def _cupy_api_script():
    return load_module(Path(__file__).parent.parent / "scripts" / "cupy_api.py", "cupy_api")


def test_cupy_signatures_are_read_as_cython_writes_them():
    """scripts/cupy_api.py reads a Cython function's parameters off its docstring's first line."""
    read = _cupy_api_script().from_doc_line
    assert read("_ndarray_base.max(self, axis=None, out=None, keepdims=False) -> _ndarray_base") == {
        "positional": ["axis", "out", "keepdims"], "keyword": [], "varargs": False, "varkw": False,
    }  # fmt: skip
    assert read("add(x1, x2, /, out=None, \\*, casting='same_kind', dtype=None)") == {
        "positional": ["x1", "x2", "out"], "keyword": ["casting", "dtype"], "varargs": False, "varkw": False,
    }  # fmt: skip
    assert read("_ndarray_base.sort(self, int axis=-1, kind=None)")["positional"] == ["axis", "kind"]
    assert read("_ndarray_base.reshape(self, *shape, order='C', copy=None)") == {
        "positional": [], "keyword": ["order", "copy"], "varargs": True, "varkw": False,
    }  # fmt: skip
    assert read("f(a, axes=(0, 1), s=',', **kwargs)") == {
        "positional": ["a", "axes", "s"], "keyword": [], "varargs": False, "varkw": True,
    }  # fmt: skip
    assert read("Portable container of a pseudo-random number generator.") is None


def test_cupy_api_file_is_this_cupys():
    """Where CuPy is installed (no GPU needed), tests/cupy_api.json is what it has."""
    pytest.importorskip("cupy")
    assert _cupy_api_script().main(["--check"]) == 0, "run python scripts/cupy_api.py and commit the file"
