"""Batched products copy a strided stack only where a copy pays (``ops/matmul.py``'s
``_stacked``): a transposed view (K^T) is copied before NumPy's matmul, a head-split view
(contiguous rows, further apart) is handed to BLAS in place, and so is an operand read by a
single row (one decoding query). Every case gives ``a @ b``."""

import numpy as np
import pytest
from minitensor.backends import get_backend

from minitensor.core.ops.matmul import _stacked

CPU = get_backend("cpu")


class CountingCopies:
    """Counts the copies ``_stacked`` asks NumPy for."""

    def __init__(self, monkeypatch):
        self.copies = []
        copy = np.ascontiguousarray
        monkeypatch.setattr(np, "ascontiguousarray", lambda a: self.copies.append(a.shape) or copy(a))


rng = np.random.default_rng(0)
X = rng.standard_normal((2, 16, 4 * 8), dtype=np.float32)
HEADS = X.reshape(2, 16, 4, 8).transpose(0, 2, 1, 3)  # (2, 4, 16, 8): rows contiguous
K = rng.standard_normal((2, 4, 16, 8), dtype=np.float32)
K_T = K.swapaxes(-1, -2)  # (2, 4, 8, 16): rows strided


@pytest.mark.parametrize(
    "a, b, copied",
    [
        (HEADS, K_T, [K_T.shape]),  # Q K^T: the transposed keys are copied, the head view is not
        (rng.standard_normal((2, 4, 16, 16), dtype=np.float32), HEADS, []),  # P V with V a head view
        (HEADS[:, :, :1], K_T, []),  # one query row: the copy would cost what the product reads
        (HEADS[:, :, ::-1], K_T, [(2, 4, 16, 8), K_T.shape]),  # reversed rows: not BLAS's layout
        (np.broadcast_to(X[:1, :1, None, :8], (2, 1, 16, 8)), K_T[:, :1], [(2, 1, 16, 8), (2, 1, 8, 16)]),
    ],
)
def test_only_strided_rows_are_copied(a, b, copied, monkeypatch):
    spy = CountingCopies(monkeypatch)
    # Against the float64 product, at float32's accuracy: NumPy 2.2 (the last for Python 3.10)
    # multiplies a stack that BLAS cannot take (reversed rows, a broadcast view) with a loop of its
    # own, which rounds differently from BLAS (2.4's result matched BLAS's to 1e-6 here), so
    # float32's ``a @ b`` is not the one right answer.
    expected = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(_stacked(CPU, a, b), expected, rtol=1e-5, atol=1e-5)
    assert spy.copies == copied


def test_other_array_libraries_keep_the_copy():
    # measured for NumPy only: another library (CuPy) gets every strided stack contiguous
    class OtherLibrary:
        copies = []

        def ascontiguousarray(self, a):
            self.copies.append(a.shape)
            return np.ascontiguousarray(a)

    xp = OtherLibrary()

    class OtherBackend:  # the Backend's parts that _stacked uses
        def matmul(self, a, b):
            return a @ b

    backend = OtherBackend()
    backend.xp = xp
    a = rng.standard_normal((2, 4, 16, 16), dtype=np.float32)
    np.testing.assert_allclose(_stacked(backend, a, HEADS), a @ HEADS, rtol=1e-6)
    assert xp.copies == [a.shape, HEADS.shape]
