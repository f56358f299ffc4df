"""Tests for the softmax kernels in ``minitensor.kernels``.

Three implementations are compared:

* ``cpu``       -- the numba kernels (the thing under test),
* ``reference`` -- the plain array-library versions (also under test), and
* an *oracle* defined here: a per-row float64 loop written as directly as
  possible from the definitions, sharing no code with the other two.
"""

import math
import subprocess
import sys
import warnings
import zlib
from pathlib import Path

import numpy as np
import pytest
from helpers import special_rows
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from minitensor.kernels import cpu, reference

REPO_ROOT = Path(__file__).resolve().parents[1]
DTYPES = [np.float32, np.float64]
LENS_MODES = ["none", "random", "zeros", "beyond"]

# (rtol, atol) for comparing against the float64 oracle.
TOLERANCE = {np.float32: (2e-5, 1e-6), np.float64: (1e-11, 1e-13)}


# ---------------------------------------------------------------------------
# The oracle: float64, one row at a time, straight from the definitions
# ---------------------------------------------------------------------------


def _valid_lengths(rows, n, lens):
    if lens is None:
        return [n] * rows
    return [int(min(max(length, 0), n)) for length in lens]


def oracle_softmax(x, lens=None):
    x = x.astype(np.float64)
    y = np.zeros_like(x)
    for r, length in enumerate(_valid_lengths(*x.shape, lens)):
        v = x[r, :length]
        if length == 0 or np.all(v == -np.inf):
            continue  # empty row: all zeros
        e = np.exp(v - v.max())
        y[r, :length] = e / e.sum()
    return y


def oracle_log_softmax(x, lens=None):
    x = x.astype(np.float64)
    y = np.full_like(x, -np.inf)
    for r, length in enumerate(_valid_lengths(*x.shape, lens)):
        v = x[r, :length]
        if length == 0 or np.all(v == -np.inf):
            continue  # empty row: all -inf
        m = v.max()
        with np.errstate(divide="ignore"):
            y[r, :length] = (v - m) - np.log(np.exp(v - m).sum())
    return y


def oracle_softmax_backward(y, g):
    """``dx = J^T g`` with the explicit Jacobian ``J = diag(y) - y y^T``."""
    y = y.astype(np.float64)
    g = g.astype(np.float64)
    dx = np.empty_like(y)
    for r in range(y.shape[0]):
        jac = np.diag(y[r]) - np.outer(y[r], y[r])
        dx[r] = jac.T @ g[r]
    return dx


def oracle_log_softmax_backward(y, g):
    """``dx = J^T g`` with ``J_ij = delta_ij - p_j`` on the finite entries."""
    y = y.astype(np.float64)
    g = g.astype(np.float64)
    dx = np.zeros_like(y)
    for r in range(y.shape[0]):
        idx = np.flatnonzero(y[r] != -np.inf)
        p = np.exp(y[r, idx])
        jac = np.eye(idx.size) - np.outer(np.ones(idx.size), p)
        dx[r, idx] = jac.T @ g[r, idx]
    return dx


# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------


def make_logits(rng, rows, n, dtype, scale=1.0):
    return (rng.standard_normal((rows, n)) * scale).astype(dtype)


def make_lens(rng, rows, n, mode):
    if mode == "none":
        return None
    if mode == "random":
        return rng.integers(0, n + 1, size=rows).astype(np.int64)
    if mode == "zeros":
        return np.zeros(rows, dtype=np.int64)
    if mode == "beyond":  # outside [0, n]: must be clipped
        return rng.choice([-3, n + 1, 10 * n + 7], size=rows).astype(np.int64)
    raise ValueError(mode)


def assert_matches(got, want, dtype, scale=1.0):
    """Same -inf pattern, no NaN, finite values close to the float64 oracle."""
    assert got.dtype == dtype
    assert got.shape == want.shape
    assert not np.isnan(got).any()
    np.testing.assert_array_equal(got == -np.inf, want == -np.inf)
    rtol, atol = TOLERANCE[dtype]
    finite = want != -np.inf
    np.testing.assert_allclose(got[finite], want[finite], rtol=rtol, atol=atol * scale)


def cpu_forward(kind, x, lens):
    fn = cpu.softmax_forward if kind == "softmax" else cpu.log_softmax_forward
    return fn(x) if lens is None else fn(x, lens)


def reference_forward(kind, x, lens):
    fn = reference.softmax_forward if kind == "softmax" else reference.log_softmax_forward
    return fn(np, x, lens)


ORACLE_FORWARD = {"softmax": oracle_softmax, "log_softmax": oracle_log_softmax}
ORACLE_BACKWARD = {"softmax": oracle_softmax_backward, "log_softmax": oracle_log_softmax_backward}
CPU_BACKWARD = {"softmax": cpu.softmax_backward, "log_softmax": cpu.log_softmax_backward}
REFERENCE_BACKWARD = {
    "softmax": lambda y, g: reference.softmax_backward(np, y, g),
    "log_softmax": lambda y, g: reference.log_softmax_backward(np, y, g),
}


def check_all(kind, x, lens, g, scale=1.0):
    """Forward and backward of cpu and reference against the oracle."""
    dtype = x.dtype.type
    want = ORACLE_FORWARD[kind](x, lens)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning may leak
        y_ref = reference_forward(kind, x, lens)
    y_cpu = cpu_forward(kind, x, lens)
    assert_matches(y_cpu, want, dtype, scale)
    assert_matches(y_ref, want, dtype, scale)

    # Backward: feed every implementation the same y so that only the
    # backward formula is compared.
    want_dx = ORACLE_BACKWARD[kind](y_cpu, g)
    dx_cpu = CPU_BACKWARD[kind](y_cpu, g)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dx_ref = REFERENCE_BACKWARD[kind](y_cpu, g)
    rtol, atol = TOLERANCE[dtype]
    for dx in (dx_cpu, dx_ref):
        assert dx.dtype == dtype and not np.isnan(dx).any()
        np.testing.assert_allclose(dx, want_dx, rtol=10 * rtol, atol=10 * atol)


# ---------------------------------------------------------------------------
# Forward and backward on random inputs
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["softmax", "log_softmax"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lens_mode", LENS_MODES)
@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (17, 64), (64, 513), (5, 1000)])
def test_random_inputs(kind, dtype, lens_mode, shape):
    rng = np.random.default_rng(zlib.crc32(repr((kind, dtype, lens_mode, shape)).encode()))
    x = make_logits(rng, *shape, dtype)
    g = make_logits(rng, *shape, dtype)
    check_all(kind, x, make_lens(rng, *shape, lens_mode), g)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kind=st.sampled_from(["softmax", "log_softmax"]),
    dtype=st.sampled_from(DTYPES),
    rows=st.integers(1, 50),
    n=st.integers(1, 300),
    lens_mode=st.sampled_from(LENS_MODES),
    scale=st.sampled_from([1.0, 30.0, 1e4]),
    seed=st.integers(0, 2**32 - 1),
)
def test_hypothesis_shapes(kind, dtype, rows, n, lens_mode, scale, seed):
    rng = np.random.default_rng(seed)
    x = make_logits(rng, rows, n, dtype, scale)
    g = make_logits(rng, rows, n, dtype)
    check_all(kind, x, make_lens(rng, rows, n, lens_mode), g, scale)


@pytest.mark.parametrize("kind", ["softmax", "log_softmax"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_huge_logits_are_stable(kind, dtype):
    rng = np.random.default_rng(0)
    x = make_logits(rng, 32, 100, dtype, scale=1e4)
    x[0, :] = 1e4  # ties at a huge value
    x[1, :] = -1e4
    g = make_logits(rng, 32, 100, dtype)
    check_all(kind, x, None, g, scale=1e4)
    y = cpu.softmax_forward(x)
    np.testing.assert_allclose(y[0], 1 / 100, rtol=1e-6)
    np.testing.assert_allclose(y.sum(axis=1), 1, rtol=1e-5)


def test_log_softmax_keeps_precision_next_to_a_large_max():
    # (x - m) - log(s) must not be re-associated into x - (m + log(s)): in
    # float32 m + log(s) rounds to a multiple of 1e-3 when m ~ 1e4.
    rng = np.random.default_rng(5)
    x = (1e4 + rng.standard_normal((16, 300))).astype(np.float32)
    want = oracle_log_softmax(x)
    np.testing.assert_allclose(cpu.log_softmax_forward(x), want, rtol=1e-6, atol=1e-5)
    np.testing.assert_allclose(reference.log_softmax_forward(np, x), want, rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("shape", [(0, 5), (4, 0), (0, 0)])
def test_empty_arrays(shape):
    x = np.zeros(shape, np.float32)
    for fn in (cpu.softmax_forward, cpu.log_softmax_forward):
        assert fn(x).shape == shape
        assert fn(x, np.zeros(shape[0], np.int64)).shape == shape
    for fn in (reference.softmax_forward, reference.log_softmax_forward):
        assert fn(np, x).shape == shape
    assert cpu.softmax_backward(x, x).shape == shape
    assert cpu.log_softmax_backward(x, x).shape == shape


@pytest.mark.parametrize("lens", [None, np.array([3, 1], np.int32), np.array([3, 1], np.int64)])
def test_lens_argument_forms(lens):
    x = np.arange(10, dtype=np.float64).reshape(2, 5)
    want = oracle_softmax(x, lens)
    np.testing.assert_allclose(cpu.softmax_forward(x, lens), want, rtol=1e-12)
    np.testing.assert_allclose(np.exp(cpu.log_softmax_forward(x, lens)), want, rtol=1e-12)


# ---------------------------------------------------------------------------
# -inf, empty rows and lengths
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["softmax", "log_softmax"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_special_rows(kind, dtype):
    x, lens = special_rows(dtype)
    g = make_logits(np.random.default_rng(1), *x.shape, dtype)
    check_all(kind, x, lens, g)
    check_all(kind, x, None, g)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("impl", ["cpu", "reference"])
def test_empty_rows_give_zeros_and_minus_inf(dtype, impl):
    x, lens = special_rows(dtype)
    if impl == "cpu":
        y, logy = cpu.softmax_forward(x, lens), cpu.log_softmax_forward(x, lens)
    else:
        y = reference.softmax_forward(np, x, lens)
        logy = reference.log_softmax_forward(np, x, lens)
    empty = [0, 3, 5, 6]
    assert np.all(y[empty] == 0)  # never uniform weights
    assert np.all(logy[empty] == -np.inf)
    assert not np.isnan(y).any() and not np.isnan(logy).any()
    # the masked -inf entries of a non-empty row
    np.testing.assert_array_equal(y[1, [0, 2, 4]], 0)
    np.testing.assert_array_equal(logy[1, [0, 2, 4]], -np.inf)
    np.testing.assert_allclose(y[2], [1, 0, 0, 0, 0])
    np.testing.assert_allclose(logy[2, 0], 0, atol=1e-7)


@pytest.mark.parametrize("dtype", DTYPES)
def test_masked_entries_get_zero_gradient(dtype):
    x, lens = special_rows(dtype)
    g = np.ones_like(x) * 3
    y = cpu.softmax_forward(x, lens)
    logy = cpu.log_softmax_forward(x, lens)
    dx = cpu.softmax_backward(y, g)
    dlog = cpu.log_softmax_backward(logy, g)
    masked = y == 0
    assert np.all(dx[masked] == 0)
    assert np.all(dlog[logy == -np.inf] == 0)
    assert not np.isnan(dx).any() and not np.isnan(dlog).any()


def test_bad_lengths_and_shapes_are_rejected():
    x = np.zeros((3, 4), np.float32)
    for fn in (cpu.softmax_forward, cpu.log_softmax_forward):
        with pytest.raises(ValueError):
            fn(x, np.zeros(2, np.int64))
    for fn in (cpu.softmax_backward, cpu.log_softmax_backward):
        with pytest.raises(ValueError):
            fn(x, np.zeros((3, 5), np.float32))


def test_nan_stays_in_its_row():
    x = np.zeros((3, 8), dtype=np.float32)
    x[1, 2] = np.nan
    for fn in (cpu.softmax_forward, cpu.log_softmax_forward):
        y = fn(x)
        assert not np.isnan(y[[0, 2]]).any()
        np.testing.assert_allclose(y[[0, 2]], fn(np.zeros((2, 8), np.float32)))


def test_inputs_are_not_modified_and_outputs_are_new():
    rng = np.random.default_rng(2)
    x = make_logits(rng, 8, 33, np.float32)
    g = make_logits(rng, 8, 33, np.float32)
    x0, g0 = x.copy(), g.copy()
    y = cpu.softmax_forward(x)
    dx = cpu.softmax_backward(y, g)
    logy = cpu.log_softmax_forward(x, np.full(8, 20, np.int64))
    cpu.log_softmax_backward(logy, g)
    np.testing.assert_array_equal(x, x0)
    np.testing.assert_array_equal(g, g0)
    assert not np.shares_memory(y, x) and not np.shares_memory(dx, g)


# ---------------------------------------------------------------------------
# Gradients by finite differences (float64)
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["softmax", "log_softmax"])
@pytest.mark.parametrize("lens_mode", ["none", "random"])
def test_backward_matches_finite_differences(kind, lens_mode):
    rng = np.random.default_rng(3)
    rows, n = 4, 9
    x = make_logits(rng, rows, n, np.float64)
    g = make_logits(rng, rows, n, np.float64)
    lens = make_lens(rng, rows, n, lens_mode)
    if lens is not None:
        lens[0] = 0  # include an empty row

    def loss(x):
        """``sum(g * y)`` over the entries that are not masked to -inf."""
        y = cpu_forward(kind, x, lens)
        return np.sum(np.where(y == -np.inf, 0, g * y))

    y = cpu_forward(kind, x, lens)
    g_used = np.where(y == -np.inf, 0, g)
    analytic = CPU_BACKWARD[kind](y, g_used)
    numeric = np.zeros_like(x)
    eps = 1e-6
    for idx in np.ndindex(x.shape):
        xp_, xm_ = x.copy(), x.copy()
        xp_[idx] += eps
        xm_[idx] -= eps
        numeric[idx] = (loss(xp_) - loss(xm_)) / (2 * eps)
    np.testing.assert_allclose(analytic, numeric, rtol=1e-6, atol=1e-8)


# ---------------------------------------------------------------------------
# The vectorisable float32 exp
# ---------------------------------------------------------------------------


def _vector_exp(values):
    import numba

    @numba.njit
    def apply(a):
        out = np.empty_like(a)
        for i in range(a.size):
            out[i] = cpu.exp_f32(a[i])
        return out

    return apply(values)


def test_exp_f32_accuracy():
    rng = np.random.default_rng(4)
    x = np.concatenate(
        [
            np.linspace(-100, 90, 1_000_001, dtype=np.float32),
            rng.uniform(-100, 90, 1_000_000).astype(np.float32),
            np.float32([0.0, -0.0, 1e-30, -1e-30, 88.72, 88.7228, -87.33, -87.3365]),
        ]
    )
    got = _vector_exp(x)
    assert got.dtype == np.float32
    want = np.exp(x.astype(np.float64))
    tiny = np.finfo(np.float32).tiny
    normal = (want >= tiny) & (want <= np.finfo(np.float32).max)
    rel = np.abs(got[normal] - want[normal]) / want[normal]
    assert rel.max() <= 2.5e-7  # ~2 ulp of float32
    # Results below the normal range are flushed to 0 (or left tiny).
    assert np.all(got[want < tiny] <= tiny)
    assert np.all(got[x < -88] == 0)
    # Overflow to inf, and the special values.
    assert np.all(np.isinf(got[x > 88.73]))
    special = _vector_exp(np.float32([-np.inf, np.inf, np.nan, 0.0]))
    assert special[0] == 0 and special[1] == np.inf and np.isnan(special[2])
    assert special[3] == 1


def test_exp_f32_is_monotone_near_zero():
    # Softmax only ever evaluates exp on x - max <= 0.
    x = np.linspace(-20, 0, 200_001, dtype=np.float32)
    got = _vector_exp(x)
    assert np.all(np.diff(got) >= 0)
    assert got[-1] == 1


# ---------------------------------------------------------------------------
# Import hygiene
# ---------------------------------------------------------------------------


def test_importing_kernels_does_not_import_numba():
    code = "import minitensor.kernels, sys; assert 'numba' not in sys.modules"
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_kernels_compile_lazily():
    """Importing cpu.py must not compile anything: compilation is per call."""
    code = (
        "import minitensor.kernels.cpu as cpu\n"
        "for k in (cpu.softmax_forward, cpu.log_softmax_backward):\n"
        "    assert not k.parallel.signatures and not k.serial.signatures\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_reference_uses_only_xp():
    source = (REPO_ROOT / "minitensor" / "core" / "kernels" / "reference.py").read_text()
    assert "import numpy" not in source and "np." not in source
    assert math.isfinite(float(reference.softmax_forward(np, np.zeros((1, 1)))[0, 0]))


@pytest.mark.parametrize("rows, n", [(3, 5), (400, 100)])
def test_small_and_large_inputs_take_the_serial_and_parallel_paths(rows, n):
    """Both compiled versions of a kernel compute the same thing; size picks one."""
    x = np.random.default_rng(0).standard_normal((rows, n)).astype(np.float32)
    expected = cpu.softmax_forward.parallel(x)
    np.testing.assert_allclose(cpu.softmax_forward.serial(x), expected, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(cpu.softmax_forward(x), expected, rtol=1e-6, atol=1e-7)


def test_the_size_threshold_picks_the_version(monkeypatch):
    calls = []
    monkeypatch.setattr(cpu.softmax_forward, "serial", lambda x, *a: calls.append("serial"))
    monkeypatch.setattr(cpu.softmax_forward, "parallel", lambda x, *a: calls.append("parallel"))
    cpu.softmax_forward(np.zeros((1, cpu.PARALLEL_MIN_SIZE - 1), np.float32))
    cpu.softmax_forward(np.zeros((1, cpu.PARALLEL_MIN_SIZE), np.float32))
    assert calls == ["serial", "parallel"]
