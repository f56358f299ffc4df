"""What a user comparing with PyTorch hands to the layers: Embedding's padding row, integer
inputs to GRU / GRUCell, lists and arrays to Linear, and a state_dict that is not a mapping.

Values are checked against PyTorch where it is installed (skipped cleanly where not); the
errors by their messages.
"""

import io

import numpy as np
import pytest

import minitensor as mt
from minitensor import nn

# -- Embedding(padding_idx): the row looks up as it is, and gets no gradient ----------------------


def test_embedding_padding_row_looks_up_as_it_is_and_gets_no_gradient():
    table = np.arange(8, dtype=np.float32).reshape(4, 2)
    frozen = nn.Embedding.from_pretrained(mt.tensor(table), padding_idx=1)
    np.testing.assert_array_equal(frozen(mt.tensor([1, 2])).numpy(), table[[1, 2]])  # not zeros

    emb = nn.Embedding.from_pretrained(table, freeze=False, padding_idx=1)
    tokens = mt.tensor([[1, 2, 1], [0, 1, 3]])
    out = emb(tokens)
    np.testing.assert_array_equal(out.numpy(), table[tokens.numpy()])
    (out * out).sum().backward()  # dL/dY = 2 Y, added up per row; none reaches row 1
    expected = np.zeros_like(table)
    for i in tokens.numpy().reshape(-1):
        if i != 1:
            expected[i] += 2 * table[i]
    np.testing.assert_array_equal(emb.weight.grad.numpy(), expected)


def test_embedding_padding_row_still_starts_at_zero_and_stays_there():
    mt.manual_seed(0)
    emb = nn.Embedding(5, 3, padding_idx=0)
    assert np.all(emb.weight.numpy()[0] == 0)
    before = emb.weight.numpy().copy()
    opt = mt.optim.SGD(emb.parameters(), lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        ((emb([[0, 2], [3, 0]]) - 1) ** 2).sum().backward()
        opt.step()
    after = emb.weight.numpy()
    assert np.all(after[0] == 0) and np.all(after[[2, 3]] != before[[2, 3]])
    with mt.no_grad():  # nothing to cut without a graph: the plain look-up
        assert not emb([0, 1]).requires_grad


def test_embedding_padding_matches_torch_in_lookup_and_training():
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    ref = torch.nn.Embedding(6, 3, padding_idx=2)
    with torch.no_grad():
        ref.weight[2] = torch.tensor([0.5, -1.0, 2.0])  # a padding row that is not zero
    emb = nn.Embedding(6, 3, padding_idx=2)
    emb.load_state_dict({k: v.detach().numpy() for k, v in ref.state_dict().items()})
    tokens = np.array([[2, 0, 5, 2], [1, 2, 5, 4]])
    target = np.random.default_rng(0).standard_normal((2, 4, 3)).astype(np.float32)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    opt = mt.optim.SGD(emb.parameters(), lr=0.1)
    for _ in range(3):
        ref_out = ref(torch.tensor(tokens))
        out = emb(mt.tensor(tokens))
        np.testing.assert_allclose(out.numpy(), ref_out.detach().numpy(), rtol=1e-6, atol=1e-6)
        ref_opt.zero_grad()
        ((ref_out - torch.tensor(target)) ** 2).sum().backward()
        opt.zero_grad()
        ((out - mt.tensor(target)) ** 2).sum().backward()
        np.testing.assert_allclose(emb.weight.grad.numpy(), ref.weight.grad.numpy(), rtol=1e-5, atol=1e-6)
        ref_opt.step()
        opt.step()
    np.testing.assert_allclose(emb.weight.numpy(), ref.weight.detach().numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(emb.weight.numpy()[2], [0.5, -1.0, 2.0])  # untouched by training

    table = torch.randn(4, 2)
    np.testing.assert_array_equal(
        nn.Embedding.from_pretrained(table.numpy(), padding_idx=1)(mt.tensor([1, 3])).numpy(),
        torch.nn.Embedding.from_pretrained(table, padding_idx=1)(torch.tensor([1, 3])).numpy(),
    )


# -- GRU / GRUCell: integer inputs are promoted to the weights' dtype ------------------------------


def test_gru_promotes_integer_inputs_and_states_to_the_weights_dtype():
    mt.manual_seed(0)
    X = [[[1, 2]], [[3, -1]]]  # (num_steps, batch, input_size), integers
    gru = nn.GRU(2, 3, num_layers=2)
    outputs, state = gru(mt.tensor(X))
    assert outputs.dtype == mt.float32 and state.dtype == mt.float32
    float_outputs, float_state = gru(mt.tensor(X, dtype=mt.float32))
    np.testing.assert_array_equal(outputs.numpy(), float_outputs.numpy())
    assert np.any(outputs.numpy() != 0)
    H = [[[1, 0, -1]], [[0, 2, 0]]]  # an integer initial state, too
    as_floats = gru(mt.tensor(X, dtype=mt.float32), mt.tensor(H, dtype=mt.float32))[0]
    np.testing.assert_array_equal(gru(mt.tensor(X), mt.tensor(H))[0].numpy(), as_floats.numpy())
    assert nn.GRU(2, 3).double()(mt.tensor(X))[0].dtype == mt.float64

    cell = nn.GRUCell(2, 3)
    h = cell(mt.tensor([[1, 2]]), mt.tensor([[1, 0, 0]]))
    assert h.dtype == mt.float32
    np.testing.assert_array_equal(h.numpy(), cell(mt.tensor([[1.0, 2.0]]), mt.tensor([[1.0, 0.0, 0.0]])).numpy())
    assert cell(mt.tensor([[1, 2]])).dtype == mt.float32


def test_gru_on_integer_inputs_matches_torch_on_their_float_values():
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    X = np.array([[[1, 2], [0, -3]], [[3, -1], [2, 2]], [[0, 1], [1, 1]]])  # (3 steps, batch 2, 2)
    ref = torch.nn.GRU(2, 4, num_layers=2)
    gru = nn.GRU(2, 4, num_layers=2)
    gru.load_state_dict({k: v.detach().numpy() for k, v in ref.state_dict().items()})
    outputs, state = gru(mt.tensor(X))
    ref_outputs, ref_state = ref(torch.tensor(X, dtype=torch.float32))  # torch takes float input only
    np.testing.assert_allclose(outputs.numpy(), ref_outputs.detach().numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(state.numpy(), ref_state.detach().numpy(), rtol=1e-5, atol=1e-6)

    ref_cell = torch.nn.GRUCell(2, 4)
    cell = nn.GRUCell(2, 4)
    cell.load_state_dict({k: v.detach().numpy() for k, v in ref_cell.state_dict().items()})
    H = np.array([[1, 0, -1, 2], [0, 0, 1, 1]])
    np.testing.assert_allclose(
        cell(mt.tensor(X[0]), mt.tensor(H)).numpy(),
        ref_cell(torch.tensor(X[0], dtype=torch.float32), torch.tensor(H, dtype=torch.float32)).detach().numpy(),
        rtol=1e-5,
        atol=1e-6,
    )


# -- Linear: lists and NumPy arrays, as Embedding takes them; anything else in words ---------------


def test_linear_takes_lists_and_numpy_arrays_in_the_weights_dtype():
    mt.manual_seed(0)
    lin = nn.Linear(4, 3)
    x = [[1.0, 2.0, 3.0, 4.0], [0.0, -1.0, 0.5, 2.0]]
    expected = lin(mt.tensor(x)).numpy()
    for given in (x, np.array(x), np.array(x, dtype=np.float32), tuple(map(tuple, x))):
        y = lin(given)
        assert y.dtype == mt.float32 and y.requires_grad
        np.testing.assert_allclose(y.numpy(), expected, rtol=1e-6)
    assert lin([[1, 2, 3, 4]]).dtype == mt.float32  # integers, too
    assert lin.double()(np.array(x, dtype=np.float32)).dtype == mt.float64
    assert nn.LazyLinear(2)([[1.0, 2.0, 3.0]]).shape == (1, 2)


def test_linear_and_lazylinear_refuse_other_inputs_by_name():
    for layer, name in ((nn.Linear(4, 3), "Linear"), (nn.LazyLinear(3), "LazyLinear")):
        words = r"expected a Tensor \(or a list or NumPy array of numbers\), got NoneType"
        with pytest.raises(TypeError, match=f"{name}: {words}"):
            layer(None)
        with pytest.raises(TypeError, match=f"{name}: .* got dict"):
            layer({"x": [1.0, 2.0, 3.0, 4.0]})


def test_linear_on_lists_matches_torch_on_tensors():
    torch = pytest.importorskip("torch")
    ref = torch.nn.Linear(4, 3)
    lin = nn.Linear(4, 3)
    lin.load_state_dict({k: v.detach().numpy() for k, v in ref.state_dict().items()})
    x = [[1.0, 2.0, 3.0, 4.0], [0.0, -1.0, 0.5, 2.0]]
    np.testing.assert_allclose(lin(x).numpy(), ref(torch.tensor(x)).detach().numpy(), rtol=1e-6, atol=1e-6)


# -- load_state_dict: a mapping, or a TypeError ---------------------------------------------------


def test_load_state_dict_refuses_what_is_not_a_mapping():
    net = nn.Linear(2, 2)
    before = net.weight.numpy().copy()
    with pytest.raises(TypeError, match="load_state_dict: expected a dict-like state_dict .*, got NoneType"):
        net.load_state_dict(None)
    with pytest.raises(TypeError, match="load_state_dict: .* got list"):
        net.load_state_dict([1, 2])  # not read as two unexpected keys
    with pytest.raises(TypeError, match="load_state_dict: .* got list"):
        net.load_state_dict(list(net.state_dict().items()))
    np.testing.assert_array_equal(net.weight.numpy(), before)

    buffer = io.BytesIO()  # NumPy's .npz file is a mapping, and loads
    np.savez(buffer, weight=np.ones((2, 2), np.float32), bias=np.zeros(2, np.float32))
    buffer.seek(0)
    assert net.load_state_dict(np.load(buffer)) == ([], [])
    assert np.all(net.weight.numpy() == 1)
