"""Positional encodings: sinusoidal (the seeds' formula and its rotation property), learned,
rotary (scores depend only on relative positions), none; the plugin contract and errors."""

import math

import numpy as np
import pytest
from helpers import array_type, check

import minitensor as mt


def build(name, *args, **kwargs):
    return mt.plugins.lookup("positional encoding", name)(*args, **kwargs)


def sinusoid_reference(max_len, d, base=10000.0):
    """The seeds' formula, element by element: P[i, 2j] = sin(i / base^(2j/d)),
    P[i, 2j+1] = cos(i / base^(2j/d))."""
    P = np.zeros((max_len, d))
    for i in range(max_len):
        for col in range(d):
            j = col // 2
            angle = i / base ** (2 * j / d)
            P[i, col] = math.sin(angle) if col % 2 == 0 else math.cos(angle)
    return P


def table(enc, T, offset=0, device="cpu"):
    """What an "inputs" encoding adds to positions offset .. offset + T - 1."""
    zeros = mt.zeros(1, T, enc.num_hiddens, dtype=enc.P.dtype, device=device)
    return enc(zeros, offset=offset).numpy()[0]


# -- the registry and the contract ------------------------------------------------------------
def test_built_in_encodings_are_registered_with_applies_to():
    registry = mt.plugins.positional_encodings()
    assert {name: registry[name].applies_to for name in ("none", "sinusoidal", "learned", "rotary")} == {
        "none": "inputs",
        "sinusoidal": "inputs",
        "learned": "inputs",
        "rotary": "qk",
    }


@pytest.mark.parametrize("name", ["none", "sinusoidal", "learned"])
def test_inputs_encodings_follow_the_contract(name):
    enc = build(name, 6, max_len=20, dropout=0.0)
    X = mt.randn(2, 5, 6)
    out = enc(X, offset=3)
    assert out.shape == X.shape


def test_unknown_option_is_an_error():
    with pytest.raises(TypeError, match="bse"):
        build("sinusoidal", 8, bse=100)
    with pytest.raises(TypeError, match="bse"):
        build("rotary", 8, bse=100)


# -- sinusoidal ---------------------------------------------------------------------------------
@pytest.mark.parametrize("d", [8, 7])
def test_sinusoidal_equals_the_formula(device, d):
    enc = build("sinusoidal", d, max_len=60, device=device)
    np.testing.assert_allclose(table(enc, 60, device=device), sinusoid_reference(60, d), atol=1e-6)
    assert isinstance(enc.P.data, array_type(device))


def test_sinusoidal_base_option():
    enc = build("sinusoidal", 6, max_len=10, base=100.0)
    np.testing.assert_allclose(table(enc, 10), sinusoid_reference(10, 6, base=100.0), atol=1e-6)


@pytest.mark.parametrize("name", ["sinusoidal", "rotary"])
@pytest.mark.parametrize("base", [0, -10.0, math.inf, math.nan, "1e4"])
def test_a_base_that_is_not_a_finite_number_above_zero_is_refused(name, base):
    """base^(2j/d) of 0 or of a negative base makes the frequencies inf or NaN: every position's
    vector was NaN (with NumPy's warnings only)."""
    owner = {"sinusoidal": "SinusoidalEncoding", "rotary": "RotaryEncoding"}[name]
    with pytest.raises(ValueError, match=f"{owner}: base must be a finite number > 0"):
        build(name, 8, max_len=10, base=base)
    tables = build(name, 8, max_len=10, base=np.float32(500.0)).buffers()  # (a NumPy number is a number)
    assert all(np.isfinite(t.numpy()).all() for t in tables)


def test_a_language_model_reads_an_empty_sequence_as_pytorch_does():
    """(batch, 0) tokens give (batch, 0, vocab_size) logits, whatever the encoding (the cached
    self-attention read the first position of an empty array)."""
    for positional in ("sinusoidal", "learned", "rotary", "alibi", "t5_relative"):
        lm = mt.nn.TransformerLM(10, 8, 16, 2, 1, 0.0, positional=positional)
        logits = lm(mt.zeros(2, 0, dtype=mt.int64))
        assert logits.shape == (2, 0, 10), positional
        logits.sum().backward()


def test_sinusoidal_adds_the_rows_at_the_offset(device):
    enc = build("sinusoidal", 8, max_len=30, device=device)
    X = mt.randn(3, 4, 8, device=device)
    out = enc(X, offset=5)
    np.testing.assert_allclose(out.numpy(), X.numpy() + sinusoid_reference(30, 8)[5:9], atol=1e-6)


@pytest.mark.parametrize("delta", [1, 7, 40])
def test_sinusoidal_relative_position_is_a_fixed_rotation(delta):
    """The seeds' property: for every frequency w_j = 1 / 10000^(2j/d),
    [P[i+delta, 2j], P[i+delta, 2j+1]] = [[cos dw, sin dw], [-sin dw, cos dw]] [P[i, 2j], P[i, 2j+1]],
    with one matrix per (delta, j) for *every* position i."""
    d, max_len = 16, 200
    P = table(build("sinusoidal", d, max_len=max_len), max_len).astype(np.float64)
    i = np.arange(max_len - delta)
    for j in range(d // 2):
        w = 1 / 10000 ** (2 * j / d)
        c, s = math.cos(delta * w), math.sin(delta * w)
        rotation = np.array([[c, s], [-s, c]])
        now = np.stack([P[i, 2 * j], P[i, 2 * j + 1]])  # (2, positions)
        later = np.stack([P[i + delta, 2 * j], P[i + delta, 2 * j + 1]])
        np.testing.assert_allclose(rotation @ now, later, atol=1e-5, err_msg=f"frequency pair j={j}")


def test_sinusoidal_offset_past_max_len_names_both():
    enc = build("sinusoidal", 4, max_len=10)
    enc(mt.zeros(1, 4, 4), offset=6)  # positions 6..9: fits exactly
    with pytest.raises(ValueError, match=r"offset 7 \+ length 4 = 11.*max_len=10"):
        enc(mt.zeros(1, 4, 4), offset=7)
    with pytest.raises(ValueError, match="max_len=10"):
        enc(mt.zeros(1, 11, 4))
    with pytest.raises(ValueError, match=">= 0"):
        enc(mt.zeros(1, 2, 4), offset=-1)


def test_sinusoidal_table_is_a_non_persistent_buffer_that_moves():
    enc = build("sinusoidal", 4, max_len=10)
    assert "P" in dict(enc.named_buffers()) and enc.state_dict() == {}
    assert not any(True for _ in enc.parameters())
    enc.to("strict")
    assert enc.P.device == "strict"
    out = enc(mt.zeros(2, 3, 4, device="strict"), offset=1)
    np.testing.assert_allclose(out.numpy()[0], sinusoid_reference(10, 4)[1:4], atol=1e-6)
    assert enc.double().P.dtype == mt.float64


def test_sinusoidal_dropout_only_in_training():
    enc = build("sinusoidal", 8, max_len=10, dropout=0.5)
    X = mt.ones(4, 10, 8)
    expected = X.numpy() + sinusoid_reference(10, 8)
    mt.manual_seed(0)
    trained = enc(X).numpy()
    assert (trained == 0).mean() > 0.3  # about half dropped
    kept = trained != 0
    np.testing.assert_allclose(trained[kept], 2 * expected[kept], rtol=1e-5)  # survivors scaled by 1/(1-p)
    np.testing.assert_allclose(enc.eval()(X).numpy(), expected, atol=1e-6)


# -- learned ------------------------------------------------------------------------------------
def test_learned_table_is_trainable(device):
    mt.manual_seed(0)
    enc = build("learned", 5, max_len=12, device=device)
    assert [name for name, _ in enc.named_parameters()] == ["P"]
    assert "P" in enc.state_dict()
    X = mt.randn(3, 4, 5, device=device)
    G = mt.randn(3, 4, 5, device=device)
    out = enc(X, offset=2)
    np.testing.assert_allclose(out.numpy(), X.numpy() + enc.P.numpy()[2:6], atol=1e-6)
    (out * G).sum().backward()
    grad = enc.P.grad.numpy()
    np.testing.assert_allclose(grad[2:6], G.numpy().sum(axis=0), atol=1e-5)
    assert not grad[:2].any() and not grad[6:].any()
    # one optimiser step moves exactly the rows that were used
    before = enc.P.numpy()
    mt.optim.SGD(enc.parameters(), lr=0.1).step()
    changed = (enc.P.numpy() != before).any(axis=1)
    assert changed.tolist() == [False, False, True, True, True, True] + [False] * 6


def test_learned_initial_scale():
    mt.manual_seed(0)
    enc = build("learned", 64, max_len=500)
    assert 0.018 < enc.P.numpy().std() < 0.022
    with pytest.raises(ValueError, match="max_len=500"):
        enc(mt.zeros(1, 3, 64), offset=498)


# -- rotary -------------------------------------------------------------------------------------
def rotary_reference(x, offset, base=10000.0):
    """RoPE as complex numbers: pair (x[2j], x[2j+1]) is z_j = x[2j] + i x[2j+1], and position
    p multiplies it by exp(i p theta_j), theta_j = base^(-2j/d)."""
    T, d = x.shape[-2:]
    theta = base ** (-2 * np.arange(d // 2) / d)
    z = x[..., 0::2] + 1j * x[..., 1::2]
    z = z * np.exp(1j * np.outer(offset + np.arange(T), theta))
    out = np.empty_like(x)
    out[..., 0::2], out[..., 1::2] = z.real, z.imag
    return out


def test_rotary_equals_the_rotation(device):
    enc = build("rotary", 8, max_len=40, dtype=mt.float64, device=device)
    rng = np.random.default_rng(0)
    q, k = rng.standard_normal((2, 3, 5, 8)), rng.standard_normal((2, 3, 6, 8))
    q_rot, k_rot = enc(mt.tensor(q, device=device), mt.tensor(k, device=device), q_offset=4, k_offset=9)
    np.testing.assert_allclose(q_rot.numpy(), rotary_reference(q, 4), atol=1e-12)
    np.testing.assert_allclose(k_rot.numpy(), rotary_reference(k, 9), atol=1e-12)
    assert isinstance(q_rot.data, array_type(device))


def test_rotary_scores_depend_only_on_relative_position():
    """<R(m theta) q, R(n theta) k> = q^T R((n - m) theta) k: shifting both offsets by the same
    amount changes no score; shifting one of them does."""
    enc = build("rotary", 16, max_len=300, dtype=mt.float64)
    rng = np.random.default_rng(1)
    q, k = mt.tensor(rng.standard_normal((4, 16))), mt.tensor(rng.standard_normal((6, 16)))

    def scores(q_offset, k_offset):
        q_rot, k_rot = enc(q, k, q_offset=q_offset, k_offset=k_offset)
        return (q_rot @ k_rot.T).numpy()

    base = scores(0, 3)
    for shift in (1, 17, 250):
        np.testing.assert_allclose(scores(shift, 3 + shift), base, atol=1e-10)
    assert np.abs(scores(1, 3) - base).max() > 1e-3  # a different relative position: other scores


def test_rotary_preserves_norms_and_position_zero_is_identity():
    enc = build("rotary", 6, max_len=50, dtype=mt.float64)
    x = mt.tensor(np.random.default_rng(2).standard_normal((2, 7, 6)))
    rotated, _ = enc(x, x, q_offset=30)
    pair_norms = lambda a: np.hypot(a[..., 0::2], a[..., 1::2])  # noqa: E731
    np.testing.assert_allclose(pair_norms(rotated.numpy()), pair_norms(x.numpy()), atol=1e-12)
    at_zero, _ = enc(x[:, :1], x[:, :1])
    np.testing.assert_allclose(at_zero.numpy(), x.numpy()[:, :1], atol=1e-15)


def test_rotary_gradcheck(device):
    enc = build("rotary", 4, max_len=10, device=device).double()
    q = mt.tensor(np.random.default_rng(3).standard_normal((2, 3, 4)), device=device, requires_grad=True)
    k = mt.tensor(np.random.default_rng(4).standard_normal((2, 5, 4)), device=device, requires_grad=True)

    def scores(q, k):
        q_rot, k_rot = enc(q, k, q_offset=2, k_offset=1)
        return q_rot @ k_rot.swapaxes(-1, -2)

    check(scores, q, k)


def test_rotary_errors():
    with pytest.raises(ValueError, match="even"):
        build("rotary", 5)
    with pytest.raises(ValueError, match="dropout"):
        build("rotary", 4, dropout=0.1)
    enc = build("rotary", 4, max_len=8)
    with pytest.raises(mt.ShapeError, match="size 4"):
        enc(mt.zeros(2, 3, 6), mt.zeros(2, 3, 6))
    with pytest.raises(ValueError, match="max_len=8"):
        enc(mt.zeros(1, 3, 4), mt.zeros(1, 3, 4), k_offset=6)
    assert enc.state_dict() == {}
