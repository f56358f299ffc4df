"""nn.GRU, nn.GRUCell and nn.Conv1d, and the Functions under them (ops/rnn.py: GRUSequence,
ops/conv.py: conv1d): against NumPy references written step by step from the formulas
(never with the code under test), gradient checks in float64 on "cpu" and "strict", state
hand-over between calls, dropout between layers, shape errors, and (optionally) PyTorch's
GRU, GRUCell and conv1d with the same weights."""

import numpy as np
import pytest
from helpers import array_type, check
from minitensor.ops.conv import conv1d, conv1d_output_length
from minitensor.ops.rnn import GRUSequence

import minitensor as mt
from minitensor import nn


# -- GRU: the NumPy reference ---------------------------------------------------------------
def np_sigmoid(a):
    return 1.0 / (1.0 + np.exp(-a))


def np_gru_layer(X, H, W_ih, W_hh, b_ih, b_hh):
    """One layer, one step at a time, gate by gate (r, z, n stacked in the weights):
    r = s(x W_ir^T + b_ir + h W_hr^T + b_hr), z likewise, n = tanh(x W_in^T + b_in + r (h W_hn^T + b_hn)),
    h' = (1 - z) n + z h."""
    W_ir, W_iz, W_in = np.split(W_ih, 3)
    W_hr, W_hz, W_hn = np.split(W_hh, 3)
    b_ir, b_iz, b_in = np.split(b_ih, 3)
    b_hr, b_hz, b_hn = np.split(b_hh, 3)
    outputs = []
    for x in X:
        r = np_sigmoid(x @ W_ir.T + b_ir + H @ W_hr.T + b_hr)
        z = np_sigmoid(x @ W_iz.T + b_iz + H @ W_hz.T + b_hz)
        n = np.tanh(x @ W_in.T + b_in + r * (H @ W_hn.T + b_hn))
        H = (1 - z) * n + z * H
        outputs.append(H)
    return np.stack(outputs)


def np_gru(gru, X, H0):
    """The whole stack from the module's weights, read out as NumPy arrays."""
    for layer in range(gru.num_layers):
        W_ih, W_hh, b_ih, b_hh = (None if p is None else p.numpy() for p in gru.layer_parameters(layer))
        if b_ih is None:
            b_ih = b_hh = np.zeros(W_ih.shape[0])
        X = np_gru_layer(X, H0[layer], W_ih, W_hh, b_ih, b_hh)
        yield X


def data(*shape, seed=0):
    return np.random.default_rng([seed, *shape]).standard_normal(shape)


# -- GRU --------------------------------------------------------------------------------------
@pytest.mark.parametrize("num_layers,bias", [(1, True), (3, True), (2, False)])
def test_gru_matches_the_step_by_step_reference(device, num_layers, bias):
    mt.manual_seed(0)
    gru = nn.GRU(3, 5, num_layers=num_layers, bias=bias, dtype=mt.float64, device=device)
    X, H0 = data(6, 4, 3), data(num_layers, 4, 5, seed=1)
    outputs, state = gru(mt.tensor(X, device=device), mt.tensor(H0, device=device))
    layers = list(np_gru(gru, X, H0))
    assert outputs.shape == (6, 4, 5) and state.shape == (num_layers, 4, 5)
    assert isinstance(outputs.data, array_type(device)) and isinstance(state.data, array_type(device))
    np.testing.assert_allclose(outputs.numpy(), layers[-1], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(state.numpy(), np.stack([out[-1] for out in layers]), rtol=1e-10, atol=1e-12)


def test_gru_starts_from_zeros_and_state_continues_the_sequence():
    mt.manual_seed(1)
    gru = nn.GRU(2, 4, num_layers=2, dtype=mt.float64)
    X = mt.tensor(data(7, 3, 2))
    outputs, state = gru(X)
    zero_start, _ = gru(X, mt.zeros(2, 3, 4, dtype=mt.float64))
    np.testing.assert_array_equal(outputs.numpy(), zero_start.numpy())
    # Step-by-step decoding feeds the returned state back: the same numbers as one call.
    first, H = gru(X[:3])
    rest, H = gru(X[3:], H)
    np.testing.assert_allclose(np.concatenate([first.numpy(), rest.numpy()]), outputs.numpy(), rtol=1e-12)
    np.testing.assert_allclose(H.numpy(), state.numpy(), rtol=1e-12)


def test_gru_batch_first_is_the_same_gru_transposed():
    mt.manual_seed(2)
    gru = nn.GRU(3, 4, num_layers=2, dtype=mt.float64)
    gru_bf = nn.GRU(3, 4, num_layers=2, batch_first=True, dtype=mt.float64)
    gru_bf.load_state_dict(gru.state_dict())
    X = data(5, 2, 3)
    out, state = gru(mt.tensor(X))
    out_bf, state_bf = gru_bf(mt.tensor(X.swapaxes(0, 1)))
    np.testing.assert_allclose(out_bf.numpy(), out.numpy().swapaxes(0, 1), rtol=1e-12)
    np.testing.assert_allclose(state_bf.numpy(), state.numpy(), rtol=1e-12)  # the state stays layer-major


def test_gru_parameters_are_named_and_shaped_as_in_pytorch():
    gru = nn.GRU(3, 5, num_layers=2)
    assert [(n, p.shape) for n, p in gru.named_parameters()] == [
        ("weight_ih_l0", (15, 3)),
        ("weight_hh_l0", (15, 5)),
        ("bias_ih_l0", (15,)),
        ("bias_hh_l0", (15,)),
        ("weight_ih_l1", (15, 5)),
        ("weight_hh_l1", (15, 5)),
        ("bias_ih_l1", (15,)),
        ("bias_hh_l1", (15,)),
    ]
    bound = 1 / np.sqrt(5)
    assert all(np.abs(p.numpy()).max() <= bound for p in gru.parameters())
    assert all(p.dtype == mt.float32 for p in gru.parameters())
    assert [n for n, _ in nn.GRU(3, 5, bias=False).named_parameters()] == ["weight_ih_l0", "weight_hh_l0"]


@pytest.mark.parametrize("bias", [True, False])
def test_gru_gradients(device, bias):
    mt.manual_seed(3)
    gru = nn.GRU(3, 4, num_layers=2, bias=bias, dtype=mt.float64, device=device)
    X = mt.tensor(data(3, 2, 3), device=device, requires_grad=True)
    H0 = mt.tensor(data(2, 2, 4, seed=1) * 0.5, device=device, requires_grad=True)

    def fn(X, H0, *params):  # both results count: the outputs and the final state
        outputs, state = gru(X, H0)
        return mt.concat([outputs.reshape(-1), state.reshape(-1)])

    check(fn, X, H0, *gru.parameters())


@pytest.mark.parametrize("bias", [True, False])
def test_gru_sequence_function_matches_the_reference_and_its_gradients(device, bias):
    """The Function alone, fed the inputs' share of the gates directly: its outputs are the
    reference's with W_ih = I (so gates_x = X + b_ih), and every input's gradient, the initial
    state's included, passes gradcheck."""
    h, steps, batch = 3, 4, 2
    gates_x = data(steps, batch, 3 * h)
    H0, W_hh, b_hh = data(batch, h, seed=1) * 0.5, data(3 * h, h, seed=2) * 0.5, data(3 * h, seed=3) * 0.5
    out = GRUSequence.apply(
        *(mt.tensor(a, device=device) for a in (gates_x, H0, W_hh)), mt.tensor(b_hh, device=device) if bias else None
    )
    zeros = np.zeros(3 * h)
    expected = np_gru_layer(gates_x, H0, np.eye(3 * h), W_hh, zeros, b_hh if bias else zeros)
    assert out.shape == (steps, batch, h)
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-10, atol=1e-12)

    inputs = [mt.tensor(a, device=device, requires_grad=True) for a in (gates_x, H0, W_hh, b_hh)]
    if bias:
        check(GRUSequence.apply, *inputs)
    else:
        check(lambda g, H, W: GRUSequence.apply(g, H, W, None), *inputs[:3])


def test_gru_dropout_acts_between_layers_in_training_only():
    mt.manual_seed(4)
    X = mt.tensor(data(4, 3, 2))
    deep = nn.GRU(2, 6, num_layers=2, dropout=0.5, dtype=mt.float64)
    plain = nn.GRU(2, 6, num_layers=2, dtype=mt.float64)
    plain.load_state_dict(deep.state_dict())
    assert not np.allclose(deep(X)[0].numpy(), plain(X)[0].numpy())  # training: dropped
    deep.eval()
    np.testing.assert_array_equal(deep(X)[0].numpy(), plain(X)[0].numpy())
    # One layer: nothing lies between layers, so nothing is dropped (as in PyTorch).
    single, single_plain = nn.GRU(2, 6, dropout=0.5, dtype=mt.float64), nn.GRU(2, 6, dtype=mt.float64)
    single_plain.load_state_dict(single.state_dict())
    np.testing.assert_array_equal(single(X)[0].numpy(), single_plain(X)[0].numpy())


def test_gru_shape_errors():
    gru = nn.GRU(3, 4, num_layers=2)
    with pytest.raises(mt.ShapeError, match=r"expected \(num_steps, batch, 3\)"):
        gru(mt.randn(5, 2, 4))
    with pytest.raises(mt.ShapeError, match=r"expected \(2, 2, 4\)"):
        gru(mt.randn(5, 2, 3), mt.randn(1, 2, 4))
    with pytest.raises(mt.ShapeError, match=r"GRU: inputs of shape \(0, 2, 3\) have no time steps"):
        gru(mt.randn(0, 2, 3))
    # the attention decoder names itself (it loops over the steps, and had nothing to concatenate)
    decoder = nn.Seq2SeqAttentionDecoder(10, 4, 8, 1)
    encoder = nn.Seq2SeqEncoder(10, 4, 8, 1)
    state = decoder.init_state(encoder(mt.randint(0, 10, (2, 5)), None), None)
    with pytest.raises(mt.ShapeError, match=r"Seq2SeqAttentionDecoder: tokens of shape \(2, 0\) have no time steps"):
        decoder(mt.zeros(2, 0, dtype=mt.int64), state)
    with pytest.raises(ValueError, match="num_layers"):
        nn.GRU(3, 4, num_layers=0)


def test_grucell_is_one_gru_step(device):
    mt.manual_seed(5)
    cell = nn.GRUCell(3, 4, dtype=mt.float64, device=device)
    X, H = data(2, 3), data(2, 4, seed=1)
    W_ih, W_hh, b_ih, b_hh = (p.numpy() for p in cell.parameters())
    expected = np_gru_layer(X[None], H, W_ih, W_hh, b_ih, b_hh)[0]
    out = cell(mt.tensor(X, device=device), mt.tensor(H, device=device))
    assert out.shape == (2, 4) and isinstance(out.data, array_type(device))
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(
        cell(mt.tensor(X, device=device)).numpy(),
        np_gru_layer(X[None], np.zeros((2, 4)), W_ih, W_hh, b_ih, b_hh)[0],
        rtol=1e-10,
    )
    X_t = mt.tensor(X, device=device, requires_grad=True)
    H_t = mt.tensor(H, device=device, requires_grad=True)
    check(lambda X, H, *params: cell(X, H), X_t, H_t, *cell.parameters())


def test_gru_and_grucell_match_pytorch():
    torch = pytest.importorskip("torch")
    mt.manual_seed(6)
    gru = nn.GRU(3, 5, num_layers=2, dtype=mt.float64)
    reference = torch.nn.GRU(3, 5, num_layers=2).double()
    # Same parameter names and layouts: PyTorch's weights load as they are.
    gru.load_state_dict({k: v.detach().numpy() for k, v in reference.state_dict().items()})
    X, H0 = data(6, 4, 3), data(2, 4, 5, seed=1)
    outputs, state = gru(mt.tensor(X), mt.tensor(H0))
    expected_outputs, expected_state = reference(torch.from_numpy(X), torch.from_numpy(H0))
    np.testing.assert_allclose(outputs.numpy(), expected_outputs.detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(state.numpy(), expected_state.detach().numpy(), rtol=1e-10, atol=1e-12)

    cell, reference_cell = nn.GRUCell(3, 5, dtype=mt.float64), torch.nn.GRUCell(3, 5).double()
    cell.load_state_dict({k: v.detach().numpy() for k, v in reference_cell.state_dict().items()})
    out = cell(mt.tensor(X[0]), mt.tensor(H0[0]))
    expected = reference_cell(torch.from_numpy(X[0]), torch.from_numpy(H0[0]))
    np.testing.assert_allclose(out.numpy(), expected.detach().numpy(), rtol=1e-10, atol=1e-12)


# -- Conv1d ------------------------------------------------------------------------------------
def np_conv1d(x, w, b, stride, padding, dilation):
    """Y[n, o, i] = b[o] + sum_{c, j} w[o, c, j] x_pad[n, c, i stride + j dilation], by loops."""
    N, C, L = x.shape
    O, _, k = w.shape
    x_pad = np.zeros((N, C, L + 2 * padding))
    x_pad[:, :, padding : padding + L] = x
    L_out = (L + 2 * padding - dilation * (k - 1) - 1) // stride + 1
    y = np.zeros((N, O, L_out))
    for n in range(N):
        for o in range(O):
            for i in range(L_out):
                y[n, o, i] = b[o] + sum(
                    w[o, c, j] * x_pad[n, c, i * stride + j * dilation] for c in range(C) for j in range(k)
                )
    return y


CONV_SETTINGS = [  # (kernel_size, stride, padding, dilation)
    (3, 1, 0, 1),
    (3, 2, 1, 1),  # stride and padding
    (2, 3, 2, 1),  # stride wider than the kernel: inputs skipped
    (3, 1, 2, 2),  # dilation
    (1, 1, 0, 1),  # a pointwise (1 x 1) convolution
    (4, 2, 3, 1),  # padding wider than the stride
]
IDS = [f"k{k}-s{s}-p{p}-d{d}" for k, s, p, d in CONV_SETTINGS]


# 3 channels: Conv1d's matrix of windows; 8: through Conv2d, which sums tap by tap where windows overlap
@pytest.mark.parametrize("channels", [3, 8])
@pytest.mark.parametrize("k,stride,padding,dilation", CONV_SETTINGS, ids=IDS)
def test_conv1d_matches_the_direct_convolution(device, k, stride, padding, dilation, channels):
    x, w, b = data(2, channels, 9), data(4, channels, k, seed=1), data(4, seed=2)
    y = conv1d(
        mt.tensor(x, device=device), mt.tensor(w, device=device), mt.tensor(b, device=device), stride, padding, dilation
    )
    expected = np_conv1d(x, w, b, stride, padding, dilation)
    assert y.shape == expected.shape == (2, 4, conv1d_output_length(9, k, stride, padding, dilation))
    assert isinstance(y.data, array_type(device))
    np.testing.assert_allclose(y.numpy(), expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("channels", [2, 8])
@pytest.mark.parametrize("k,stride,padding,dilation", CONV_SETTINGS, ids=IDS)
def test_conv1d_gradients(device, k, stride, padding, dilation, channels):
    x = mt.tensor(data(2, channels, 7), device=device, requires_grad=True)
    w = mt.tensor(data(3, channels, k, seed=1), device=device, requires_grad=True)
    b = mt.tensor(data(3, seed=2), device=device, requires_grad=True)
    check(lambda x, w, b: conv1d(x, w, b, stride, padding, dilation), x, w, b)


def test_conv1d_module(device):
    mt.manual_seed(7)
    conv = nn.Conv1d(3, 5, kernel_size=3, padding=1, dtype=mt.float64, device=device)
    assert conv.weight.shape == (5, 3, 3) and conv.bias.shape == (5,)
    bound = 1 / np.sqrt(3 * 3)  # PyTorch's U(-1/sqrt(fan_in), 1/sqrt(fan_in))
    assert np.abs(conv.weight.numpy()).max() <= bound and np.abs(conv.bias.numpy()).max() <= bound
    x = data(2, 3, 8)
    y = conv(mt.tensor(x, device=device))
    assert y.shape == (2, 5, 8)  # odd kernel, padding (k - 1) / 2: the length is kept
    np.testing.assert_allclose(y.numpy(), np_conv1d(x, conv.weight.numpy(), conv.bias.numpy(), 1, 1, 1), rtol=1e-10)
    no_bias = nn.Conv1d(3, 5, 3, bias=False)
    assert no_bias.bias is None and [n for n, _ in no_bias.named_parameters()] == ["weight"]
    assert "stride" not in repr(no_bias) and "stride=2" in repr(nn.Conv1d(3, 5, 3, stride=2))


def test_conv1d_functional_form_is_exported_as_in_pytorch():
    """``mt.conv1d`` and ``nn.functional.conv1d`` (torch.conv1d, torch.nn.functional.conv1d) are
    the op in ops/conv.py, with PyTorch's keyword arguments."""
    assert mt.conv1d is mt.ops.conv1d is nn.functional.conv1d is conv1d
    x, w = mt.tensor(data(1, 2, 5)), mt.tensor(data(3, 2, 3, seed=1))
    np.testing.assert_allclose(
        mt.conv1d(x, w, stride=2, padding=1).numpy(),
        np_conv1d(data(1, 2, 5), data(3, 2, 3, seed=1), np.zeros(3), 2, 1, 1),
        rtol=1e-12,
    )


def test_conv1d_errors():
    with pytest.raises(mt.ShapeError, match="4 channels"):
        conv1d(mt.randn(2, 4, 9), mt.randn(5, 3, 3))
    with pytest.raises(mt.ShapeError, match="shorter than the kernel"):
        conv1d(mt.randn(2, 3, 4), mt.randn(5, 3, 3), dilation=2)
    with pytest.raises(mt.ShapeError, match=r"\(batch, channels, length\)"):
        conv1d(mt.randn(3, 9), mt.randn(5, 3, 3))


@pytest.mark.parametrize("channels", [3, 8])
@pytest.mark.parametrize("k,stride,padding,dilation", CONV_SETTINGS, ids=IDS)
def test_conv1d_matches_pytorch(k, stride, padding, dilation, channels):
    torch = pytest.importorskip("torch")
    x, w, b = data(2, channels, 9), data(4, channels, k, seed=1), data(4, seed=2)
    agrees_with_pytorch(conv1d, torch.nn.functional.conv1d, (x, w, b), stride, padding, dilation)


def agrees_with_pytorch(ours, theirs, arrays, *settings):
    """``ours`` and PyTorch's ``theirs`` on the same float64 (x, w, b): the same output, and the
    same gradients of all three for the same dL/dY."""
    torch = pytest.importorskip("torch")
    mine = [mt.tensor(a, requires_grad=True) for a in arrays]
    pytorchs = [torch.tensor(a, requires_grad=True) for a in arrays]
    y, ty = ours(*mine, *settings), theirs(*pytorchs, *settings)
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), rtol=1e-10, atol=1e-12)
    g = data(*y.shape, seed=3)
    y.backward(mt.tensor(g))
    ty.backward(torch.from_numpy(g))
    for a, b in zip(mine, pytorchs, strict=True):
        np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=1e-10, atol=1e-12)


# -- Conv2d ------------------------------------------------------------------------------------
def np_conv2d(x, w, b, stride, padding, dilation):
    """Y[n, o, r, s] = b[o] + sum_{c, i, j} w[o, c, i, j] x_pad[n, c, r sh + i dh, s sw + j dw], by
    loops over the outputs (stride, padding and dilation as (along H, along W) pairs)."""
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    N, C, H, W = x.shape
    O, _, kh, kw = w.shape
    x_pad = np.zeros((N, C, H + 2 * ph, W + 2 * pw))
    x_pad[:, :, ph : ph + H, pw : pw + W] = x
    H_out, W_out = (H + 2 * ph - dh * (kh - 1) - 1) // sh + 1, (W + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    y = np.zeros((N, O, H_out, W_out))
    for r in range(H_out):
        for s in range(W_out):
            window = x_pad[:, :, r * sh : r * sh + dh * (kh - 1) + 1 : dh, s * sw : s * sw + dw * (kw - 1) + 1 : dw]
            y[:, :, r, s] = np.einsum("ncij,ocij->no", window, w) + b
    return y


CONV2D_SETTINGS = [  # (kernel_size, stride, padding, dilation), pairs along (H, W)
    ((3, 3), (1, 1), (0, 0), (1, 1)),
    ((3, 2), (2, 1), (1, 0), (1, 1)),  # unequal kernel, stride and padding
    ((2, 2), (3, 3), (2, 1), (1, 1)),  # stride wider than the kernel: inputs skipped
    ((3, 3), (1, 2), (2, 2), (2, 1)),  # dilation
    ((4, 4), (4, 4), (0, 0), (1, 1)),  # D2L 11.8's patches: kernel = stride, windows that do not overlap
]
IDS2D = ["k{}x{}-s{}x{}-p{}x{}-d{}x{}".format(*k, *s, *p, *d) for k, s, p, d in CONV2D_SETTINGS]


# 3 channels: one matrix of windows (im2col); 8: tap by tap where windows overlap (Conv2d's docstring)
@pytest.mark.parametrize("channels", [3, 8])
@pytest.mark.parametrize("k,stride,padding,dilation", CONV2D_SETTINGS, ids=IDS2D)
def test_conv2d_matches_the_direct_convolution(device, k, stride, padding, dilation, channels):
    x, w, b = data(2, channels, 8, 9), data(4, channels, *k, seed=1), data(4, seed=2)
    y = mt.conv2d(*(mt.tensor(a, device=device) for a in (x, w, b)), stride, padding, dilation)
    expected = np_conv2d(x, w, b, stride, padding, dilation)
    assert y.shape == expected.shape and isinstance(y.data, array_type(device))
    np.testing.assert_allclose(y.numpy(), expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("channels", [2, 8])
@pytest.mark.parametrize("k,stride,padding,dilation", CONV2D_SETTINGS, ids=IDS2D)
def test_conv2d_gradients(device, k, stride, padding, dilation, channels):
    x = mt.tensor(data(2, channels, 8, 7), device=device, requires_grad=True)
    w = mt.tensor(data(3, channels, *k, seed=1), device=device, requires_grad=True)
    b = mt.tensor(data(3, seed=2), device=device, requires_grad=True)
    check(lambda x, w, b: mt.conv2d(x, w, b, stride, padding, dilation), x, w, b)


@pytest.mark.parametrize("channels", [3, 8])
@pytest.mark.parametrize("k,stride,padding,dilation", CONV2D_SETTINGS, ids=IDS2D)
def test_conv2d_matches_pytorch(k, stride, padding, dilation, channels):
    torch = pytest.importorskip("torch")
    x, w, b = data(2, channels, 8, 9), data(4, channels, *k, seed=1), data(4, seed=2)
    agrees_with_pytorch(mt.conv2d, torch.nn.functional.conv2d, (x, w, b), stride, padding, dilation)


def test_conv2d_modules_and_the_lazy_one():
    mt.manual_seed(7)
    conv = nn.Conv2d(3, 5, kernel_size=3, padding=1, dtype=mt.float64)
    assert conv.weight.shape == (5, 3, 3, 3) and conv.kernel_size == (3, 3) and conv.padding == (1, 1)
    bound = 1 / np.sqrt(3 * 3 * 3)  # PyTorch's U(-1/sqrt(fan_in), 1/sqrt(fan_in))
    assert np.abs(conv.weight.numpy()).max() <= bound and np.abs(conv.bias.numpy()).max() <= bound
    x = data(2, 3, 6, 5)
    np.testing.assert_allclose(
        conv(mt.tensor(x)).numpy(), np_conv2d(x, conv.weight.numpy(), conv.bias.numpy(), (1, 1), (1, 1), (1, 1))
    )
    assert repr(conv) == "Conv2d(3, 5, kernel_size=(3, 3), padding=(1, 1))"
    lazy = nn.LazyConv2d(8, kernel_size=4, stride=4)  # D2L 11.8's patch embedding
    opt = mt.optim.SGD(lazy.parameters(), lr=0.1)  # made before the first call: still holds the weight
    assert lazy.in_channels is None
    y = lazy(mt.randn(2, 3, 16, 12))
    assert y.shape == (2, 8, 4, 3) and lazy.in_channels == 3 and lazy.weight.shape == (8, 3, 4, 4)
    assert np.abs(lazy.weight.numpy()).max() <= 1 / np.sqrt(3 * 16) and lazy.weight.numpy().std() > 0
    y.sum().backward()
    before = lazy.weight.numpy().copy()
    opt.step()
    assert not np.allclose(lazy.weight.numpy(), before)
    fresh = nn.LazyConv2d(8, kernel_size=4, stride=4)
    fresh.load_state_dict(lazy.state_dict())  # a lazy layer takes the saved shape
    x = mt.randn(1, 3, 8, 8)
    np.testing.assert_array_equal(fresh(x).numpy(), lazy(x).numpy())


def test_conv2d_errors():
    with pytest.raises(mt.ShapeError, match="4 channels"):
        mt.conv2d(mt.randn(2, 4, 9, 9), mt.randn(5, 3, 3, 3))
    with pytest.raises(mt.ShapeError, match=r"conv2d: an input of height and width \(4, 9\) .* smaller"):
        mt.conv2d(mt.randn(2, 3, 4, 9), mt.randn(5, 3, 3, 3), dilation=2)
    with pytest.raises(mt.ShapeError, match=r"\(batch, channels, height, width\)"):
        mt.conv2d(mt.randn(3, 9, 9), mt.randn(5, 3, 3, 3))
    with pytest.raises(TypeError, match=r"Conv2d: stride must be an int or a pair of ints, got \(1, 2, 3\)"):
        nn.Conv2d(3, 5, 3, stride=(1, 2, 3))
    with pytest.raises(ValueError, match=r"need stride >= 1, dilation >= 1, padding >= 0; got \(0, 1\)"):
        mt.conv2d(mt.randn(1, 3, 5, 5), mt.randn(2, 3, 3, 3), stride=(0, 1))
    with pytest.raises(mt.ShapeError, match=r"LazyConv2d: input of shape \(3, 16, 16\)"):
        nn.LazyConv2d(8, 4)(mt.randn(3, 16, 16))
    with pytest.raises(mt.ShapeError, match=r"a kernel of at least 1 x 1"):
        mt.conv2d(mt.randn(1, 3, 5, 5), mt.randn(2, 3, 0, 2))


@pytest.mark.parametrize(
    "make, error, words",
    [
        (lambda: nn.Conv2d(3, 5, 0), ValueError, "Conv2d: kernel_size must be at least 1, got (0, 0)"),
        (lambda: nn.Conv2d(3, 5, (2, 0)), ValueError, "Conv2d: kernel_size must be at least 1, got (2, 0)"),
        (lambda: nn.Conv1d(3, 5, 0), ValueError, "Conv1d: kernel_size must be at least 1, got 0"),
        (lambda: nn.Conv2d(3, 0, 2), ValueError, "Conv2d: out_channels must be at least 1, got 0"),
        (lambda: nn.Conv2d(-1, 5, 2), ValueError, "Conv2d: in_channels must be at least 1, got -1"),
        (lambda: nn.Conv2d(3, 5, 2, stride=0), ValueError, "Conv2d: stride must be at least 1, got (0, 0)"),
        (lambda: nn.Conv1d(3, 5, 2, dilation=0), ValueError, "Conv1d: dilation must be at least 1, got 0"),
        (lambda: nn.Conv1d(3, 5, 3, padding=-1), ValueError, "Conv1d: padding must be at least 0, got -1"),
        (lambda: nn.Conv2d(3, 5, 2.5), TypeError, "Conv2d: kernel_size must be an int or a pair of ints, got 2.5"),
        (lambda: nn.Conv1d(3, 5, 2.5), TypeError, "Conv1d: kernel_size must be a whole number, got 2.5"),
        (lambda: nn.LazyConv2d(0, 2), ValueError, "LazyConv2d: out_channels must be at least 1, got 0"),
    ],
)
def test_convolution_layers_refuse_sizes_that_make_no_convolution(make, error, words):
    """At construction, naming the layer (they failed at the first call, or inside NumPy's stack)."""
    with pytest.raises(error) as raised:
        make()
    assert words in str(raised.value)
