"""Tensors print as in PyTorch, and ``mt.set_printoptions`` changes them as ``torch.set_printoptions`` does.

Most tests spell out the expected text; those at the end compare with PyTorch itself where
``import torch`` works (skipped elsewhere).
"""

import math
import re

import numpy as np
import pytest

import minitensor as mt

DEFAULTS = dict(precision=4, threshold=1000, edgeitems=3, linewidth=80, sci_mode=None)


@pytest.fixture(autouse=True)
def default_printoptions():
    """Every test starts from the defaults and leaves them as it found them."""
    saved = mt.get_printoptions()
    mt.set_printoptions(profile="default")
    yield
    mt.set_printoptions(**saved)


# -- abbreviation: more than 1,000 elements ------------------------------------------------------------
def test_1000_elements_print_in_full():
    r = repr(mt.arange(1000))
    assert "..." not in r and "shape=" not in r
    assert [int(n) for n in re.findall(r"\d+", r)] == list(range(1000))


def test_1001_elements_are_abbreviated_with_their_shape():
    r = repr(mt.arange(1001))
    assert r == "tensor([   0,    1,    2,  ...,  998,  999, 1000], shape=(1001,))"
    r = repr(mt.zeros(7, 143))
    assert r.count("...") == 7 and r.endswith("shape=(7, 143))")  # in each of the 6 rows shown, and between them
    assert "..." not in repr(mt.zeros(10, 100))


def test_abbreviation_keeps_edgeitems_rows_and_columns():
    r = repr(mt.arange(10000).reshape(100, 100))
    assert r == (
        "tensor([[   0,    1,    2,  ...,   97,   98,   99],\n"
        "        [ 100,  101,  102,  ...,  197,  198,  199],\n"
        "        [ 200,  201,  202,  ...,  297,  298,  299],\n"
        "        ...,\n"
        "        [9700, 9701, 9702,  ..., 9797, 9798, 9799],\n"
        "        [9800, 9801, 9802,  ..., 9897, 9898, 9899],\n"
        "        [9900, 9901, 9902,  ..., 9997, 9998, 9999]], shape=(100, 100))"
    )


# -- the format of the numbers ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "values, text",
    [
        ([1.0, 2.0, -3.0], "tensor([ 1.,  2., -3.])"),  # whole numbers: "1."
        ([0.1, 0.25], "tensor([0.1000, 0.2500])"),  # 4 digits after the point, all of them
        ([1e-5, 1.0], "tensor([1.0000e-05, 1.0000e+00])"),  # one below 1e-4: scientific
        ([1.0, 1001.0], "tensor([1.0000e+00, 1.0010e+03])"),  # max/min > 1000: scientific
        ([1.0, 999.0], "tensor([  1., 999.])"),
        ([2e8, 1.0], "tensor([2.0000e+08, 1.0000e+00])"),  # above 1e8
        ([float("nan"), float("inf"), 0.0, 1.5], "tensor([   nan,    inf, 0.0000, 1.5000])"),
        ([float("nan"), 1.0], "tensor([nan, 1.])"),  # NaN, inf and zeros do not choose the format
        ([[1.0, -20.0], [300.0, 4.0]], "tensor([[  1., -20.],\n        [300.,   4.]])"),
    ],
)
def test_number_format(values, text):
    assert repr(mt.tensor(values)) == text


def test_integers_booleans_and_scalars():
    assert repr(mt.tensor([5, -12, 300])) == "tensor([  5, -12, 300])"
    assert repr(mt.tensor([True, False])) == "tensor([ True, False])"
    assert repr(mt.tensor(2.5)) == "tensor(2.5000)"
    assert repr(mt.tensor(7)) == "tensor(7)"


def test_extras_dtype_shape_grad():
    assert repr(mt.tensor([1.0], dtype=mt.float64)) == "tensor([1.], dtype=float64)"
    assert repr(mt.tensor([1, 2], dtype=mt.int32)) == "tensor([1, 2], dtype=int32)"  # not int64: say so
    assert repr(mt.tensor([1.0], requires_grad=True)) == "tensor([1.], requires_grad=True)"
    assert repr(mt.tensor([1.0], requires_grad=True) * 2) == "tensor([2.], grad_fn=Mul)"
    assert repr(mt.zeros(0)) == "tensor([])"
    assert repr(mt.zeros(0, 3)) == "tensor([], shape=(0, 3))"
    assert repr(mt.tensor([], dtype=mt.int64)) == "tensor([], dtype=int64)"  # no element shows it


def test_extras_move_to_a_new_line_past_linewidth():
    r = repr(mt.arange(10.0, dtype=mt.float64) / 3)
    assert r == (
        "tensor([0.0000, 0.3333, 0.6667, 1.0000, 1.3333, 1.6667, 2.0000, 2.3333, 2.6667,\n"
        "        3.0000], dtype=float64)"
    )
    r = repr(mt.arange(9.0, dtype=mt.float64) / 3)
    assert r.endswith("2.6667],\n       dtype=float64)")


# -- the options --------------------------------------------------------------------------------------------
def test_defaults_and_get_printoptions():
    assert mt.get_printoptions() == DEFAULTS


def test_precision():
    mt.set_printoptions(precision=2)
    assert repr(mt.tensor([1.12345])) == "tensor([1.12])"
    mt.set_printoptions(precision=0)
    assert repr(mt.tensor([1.5, 0.25])) == "tensor([2, 0])"  # no point: PyTorch's f"{x:.0f}"
    mt.set_printoptions(profile="default")
    assert repr(mt.tensor([1.12345])) == "tensor([1.1235])"


def test_threshold():
    mt.set_printoptions(threshold=5)
    assert repr(mt.arange(10)) == "tensor([0, 1, 2,  ..., 7, 8, 9], shape=(10,))"
    assert repr(mt.arange(5)) == "tensor([0, 1, 2, 3, 4])"
    mt.set_printoptions(threshold=math.inf)
    assert "..." not in repr(mt.zeros(5000))


def test_edgeitems():
    mt.set_printoptions(threshold=5, edgeitems=1)
    assert repr(mt.arange(10)) == "tensor([0,  ..., 9], shape=(10,))"
    mt.set_printoptions(threshold=5, edgeitems=0)
    assert repr(mt.arange(10)) == "tensor([...], shape=(10,))"
    assert repr(mt.zeros(4, 4)) == "tensor([...], shape=(4, 4))"


def test_linewidth():
    r = repr(mt.arange(30))
    assert r.count("\n") == 1 and all(len(line) <= 80 for line in r.split("\n"))
    mt.set_printoptions(linewidth=40)
    r = repr(mt.arange(30))
    assert r == (
        "tensor([ 0,  1,  2,  3,  4,  5,  6,  7,\n"
        "         8,  9, 10, 11, 12, 13, 14, 15,\n"
        "        16, 17, 18, 19, 20, 21, 22, 23,\n"
        "        24, 25, 26, 27, 28, 29])"
    )
    mt.set_printoptions(linewidth=1000)
    assert "\n" not in repr(mt.arange(100))


def test_sci_mode():
    mt.set_printoptions(sci_mode=True)
    assert repr(mt.tensor([1.5, 2.0])) == "tensor([1.5000e+00, 2.0000e+00])"
    mt.set_printoptions(sci_mode=False)
    assert repr(mt.tensor([1e-5, 1.0])) == "tensor([0.0000, 1.0000])"
    assert repr(mt.tensor([5, 6])) == "tensor([5, 6])"  # integers never use it
    mt.set_printoptions(sci_mode=None)
    assert repr(mt.tensor([1e-5, 1.0])) == "tensor([1.0000e-05, 1.0000e+00])"


def test_every_call_sets_sci_mode_as_in_pytorch():
    mt.set_printoptions(sci_mode=True)
    mt.set_printoptions(precision=3)  # sci_mode left out: back to automatic
    assert mt.get_printoptions()["sci_mode"] is None


@pytest.mark.parametrize(
    "profile, expected",
    [
        ("default", DEFAULTS),
        ("short", dict(DEFAULTS, precision=2, edgeitems=2)),
        ("full", dict(DEFAULTS, threshold=math.inf)),
    ],
)
def test_profiles(profile, expected):
    mt.set_printoptions(precision=7, linewidth=33, edgeitems=9, threshold=2)
    mt.set_printoptions(profile=profile)
    assert mt.get_printoptions() == expected


def test_profile_short_and_full_change_the_output():
    mt.set_printoptions(profile="short")
    assert repr(mt.tensor([1.12345])) == "tensor([1.12])"
    assert repr(mt.arange(1001)) == "tensor([   0,    1,  ...,  999, 1000], shape=(1001,))"
    mt.set_printoptions(profile="full")
    assert "..." not in repr(mt.arange(1001))


def test_options_given_with_a_profile_override_it():
    mt.set_printoptions(profile="short", precision=3)
    assert mt.get_printoptions() == dict(DEFAULTS, precision=3, edgeitems=2)


def test_profile_round_trip():
    saved = mt.get_printoptions()
    before = repr(mt.arange(2000.0) / 7)
    mt.set_printoptions(profile="short", linewidth=50, sci_mode=True)
    assert repr(mt.arange(2000.0) / 7) != before
    mt.set_printoptions(**saved)
    assert mt.get_printoptions() == saved and repr(mt.arange(2000.0) / 7) == before
    mt.set_printoptions(profile="full")
    mt.set_printoptions(profile="default")
    assert mt.get_printoptions() == DEFAULTS


@pytest.mark.parametrize(
    "option, value",
    [
        ("precision", -1),
        ("precision", 1.5),
        ("precision", True),
        ("precision", "4"),
        ("threshold", -1),
        ("threshold", float("nan")),
        ("threshold", "1000"),
        ("edgeitems", -2),
        ("edgeitems", 2.0),
        ("linewidth", 0),
        ("profile", "long"),
        ("sci_mode", "yes"),
        ("sci_mode", 1),
    ],
)
def test_bad_values_are_refused_and_change_nothing(option, value):
    with pytest.raises(ValueError, match=f"{option}.*{re.escape(repr(value))}"):
        mt.set_printoptions(**{option: value, "precision": 7} if option != "precision" else {option: value})
    assert mt.get_printoptions() == DEFAULTS


def test_non_cpu_devices_print_the_same_numbers(device):
    r = repr(mt.arange(2000.0, device=device) / 3)
    assert r.startswith("tensor([0.0000e+00, 3.3333e-01, 6.6667e-01,  ..., 6.6567e+02, 6.6600e+02,\n")
    assert ("device=" in r) == (device != "cpu")


# -- against PyTorch ---------------------------------------------------------------------------------------
def _arrays():
    """Arrays of every kind the format rules tell apart, small and abbreviated."""
    rng = np.random.default_rng(0)
    normal = lambda *shape: rng.standard_normal(shape).astype(np.float32)  # noqa: E731
    return [
        normal(),
        normal(5),
        normal(3, 4),
        normal(2, 3, 4),
        normal(1000),
        normal(1001),
        normal(40, 40),
        normal(2, 3, 600),
        normal(4, 5) * 1e-5,
        normal(3, 3) * 1e9,
        normal(3, 30) * 100,
        np.array([1e-3, 1e3, -2.5], np.float32),
        rng.integers(-50, 50, (4, 6)).astype(np.float32),
        rng.integers(-5, 5, 2000).astype(np.float32),
        np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.5], np.float32),
        np.zeros((3, 3), np.float32),
        rng.integers(-(10**6), 10**6, (5, 7)),
        rng.integers(0, 10, (30, 100)),
        rng.random((4, 9)) > 0.5,
        rng.random(1200) > 0.5,
        rng.standard_normal((6, 7)),
        rng.standard_normal(12).astype(np.float16),
        np.zeros((0, 3), np.int64),
    ]


OPTIONS = [
    {},
    dict(precision=2),
    dict(precision=0),
    dict(threshold=5),
    dict(threshold=10, edgeitems=1),
    dict(threshold=10, edgeitems=0),
    dict(linewidth=40),
    dict(linewidth=200),
    dict(sci_mode=True),
    dict(sci_mode=False),
    dict(profile="short"),
    dict(profile="full"),
    dict(precision=6, linewidth=10),
]


@pytest.fixture
def torch():
    """PyTorch, its print options restored afterwards; the test is skipped where it does not import."""
    try:
        import torch
    except Exception as e:  # not installed, or a build that does not load here
        pytest.skip(f"import torch failed: {type(e).__name__}: {e}")
    yield torch
    torch.set_printoptions(profile="default")


def _numbers(text):
    """A repr up to its extras (``shape=``, ``dtype=``...): the part that shows the numbers."""
    return re.sub(r",\s*(shape|dtype)=.*\)$", ")", text, flags=re.S)


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "default")
def test_same_text_as_pytorch(torch, options):
    mt.set_printoptions(**options)
    torch.set_printoptions(profile="default")
    torch.set_printoptions(**options)
    for a in _arrays():
        ours = repr(mt.tensor(a))
        theirs = repr(torch.from_numpy(a)).replace("torch.", "").replace("size=", "shape=")
        assert _numbers(ours) == _numbers(theirs), f"{a.dtype} {a.shape} with {options}"
        # neither abbreviated nor empty (no shape=, spelt size= by torch), a dtype neither shows:
        # the extras and where they break the line are the same too
        shown_whole = 0 < a.size <= mt.get_printoptions()["threshold"] and options.get("edgeitems") != 0
        if shown_whole and a.dtype in (np.float32, np.int64, np.bool_):
            assert ours == theirs


def test_same_extras_layout_as_pytorch(torch):
    for n in range(1, 30):
        a = np.arange(n, dtype=np.float32) / 3
        ours = repr(mt.tensor(a, requires_grad=True))
        assert ours == repr(torch.tensor(a, requires_grad=True)), n
