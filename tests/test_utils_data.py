"""``mt.utils.data`` (minitensor/utils/data.py): D2L's ``load_array`` written with minitensor in
PyTorch's place. Every example once per epoch, PyTorch's batch sizes and lengths, a seeded
order, minibatches on the data's device, and errors that name the loader."""

import warnings

import numpy as np
import pytest
from helpers import host
from hypothesis import given
from hypothesis import strategies as st

import minitensor as mt
from minitensor.utils.data import DataLoader, Dataset, TensorDataset, default_collate


def load_array(data_arrays, batch_size, is_train=True):
    """D2L 3.3's ``load_array``, word for word but for the module's name."""
    dataset = mt.utils.data.TensorDataset(*data_arrays)
    return mt.utils.data.DataLoader(dataset, batch_size, shuffle=is_train)


def test_d2l_load_array_trains_a_linear_regression(device):
    """D2L 3.3 on minitensor: the minibatches reach the true weights."""
    mt.manual_seed(0)
    true_w, true_b = mt.tensor([2.0, -3.4], device=device), 4.2
    features = mt.randn(1000, 2, device=device)
    labels = (features @ true_w + true_b).reshape(-1, 1) + 0.01 * mt.randn(1000, 1, device=device)
    net = mt.nn.Linear(2, 1).to(device)
    trainer = mt.optim.SGD(net.parameters(), lr=0.03)
    for _ in range(3):
        for X, y in load_array((features, labels), 10):
            assert X.device == device and X.shape == (10, 2) and y.shape == (10, 1)
            loss = mt.nn.MSELoss()(net(X), y)
            trainer.zero_grad()
            loss.backward()
            trainer.step()
    np.testing.assert_allclose(host(net.weight).reshape(-1), [2.0, -3.4], atol=0.01)
    assert abs(net.bias.item() - 4.2) < 0.01


@given(n=st.integers(0, 40), batch_size=st.integers(1, 12), shuffle=st.booleans(), drop_last=st.booleans())
def test_every_example_once_per_epoch_in_pytorchs_batches(n, batch_size, shuffle, drop_last):
    loader = DataLoader(TensorDataset(mt.arange(n)), batch_size, shuffle=shuffle, drop_last=drop_last)
    expected_len = n // batch_size if drop_last else -(-n // batch_size)  # PyTorch's
    for _ in range(2):  # each epoch afresh
        seen = [b[0].tolist() for b in loader]
        assert len(seen) == len(loader) == expected_len
        assert all(len(b) == batch_size for b in seen[: n // batch_size])
        flat = sorted(i for b in seen for i in b)
        if drop_last:
            assert len(flat) == len(seen) * batch_size and len(set(flat)) == len(flat)
        else:
            assert flat == list(range(n))
        if not shuffle:
            assert [i for b in seen for i in b] == flat


def test_shuffled_orders_follow_the_seed_and_change_each_epoch():
    loader = DataLoader(TensorDataset(mt.arange(50)), batch_size=50, shuffle=True)
    mt.manual_seed(3)
    first, second = next(iter(loader))[0].tolist(), next(iter(loader))[0].tolist()
    mt.manual_seed(3)
    assert next(iter(loader))[0].tolist() == first and first != second != list(range(50))


def test_a_dataset_of_ones_own_is_collated_field_by_field():
    class Pairs(Dataset):
        def __len__(self):
            return 5

        def __getitem__(self, i):
            return {"x": mt.ones(2) * i, "label": i, "weight": 0.5, "raw": np.full(3, i)}, [i, -i]

    batches = list(DataLoader(Pairs(), batch_size=2))
    assert len(batches) == 3
    fields, pair = batches[1]
    np.testing.assert_array_equal(fields["x"].numpy(), [[2, 2], [3, 3]])
    assert fields["label"].tolist() == [2, 3] and fields["label"].dtype == mt.int64
    assert fields["weight"].dtype == mt.float32 and fields["raw"].shape == (2, 3)
    assert [t.tolist() for t in pair] == [[2, 3], [-2, -3]] and isinstance(pair, list)
    assert batches[2][0]["x"].shape == (1, 2)
    # a collate_fn of one's own gets the list of examples
    sizes = list(DataLoader(Pairs(), batch_size=2, collate_fn=len))
    assert sizes == [2, 2, 1]
    # TensorDataset with a collate_fn goes example by example too
    assert list(DataLoader(TensorDataset(mt.arange(3)), 2, collate_fn=lambda e: [x[0].item() for x in e])) == [
        [0, 1],
        [2],
    ]


def test_same_batches_as_pytorch():
    torch = pytest.importorskip("torch")
    X = np.arange(22, dtype=np.float32).reshape(11, 2)
    y = np.arange(11)
    for drop_last in (False, True):
        ours = DataLoader(TensorDataset(mt.tensor(X), mt.tensor(y)), 4, drop_last=drop_last)
        theirs = torch.utils.data.DataLoader(
            torch.utils.data.TensorDataset(torch.tensor(X), torch.tensor(y)), 4, drop_last=drop_last
        )
        assert len(ours) == len(theirs)
        for (a, b), (c, d) in zip(ours, theirs, strict=True):
            np.testing.assert_array_equal(a.numpy(), c.numpy())
            np.testing.assert_array_equal(b.numpy(), d.numpy())


def test_wrong_arguments_name_the_loader():
    with pytest.raises(
        ValueError, match=r"TensorDataset: the tensors differ in length along their first axis: \[3, 2\]"
    ):
        TensorDataset(mt.ones(3), mt.ones(2))
    with pytest.raises(TypeError, match="TensorDataset: argument 1 must be a tensor with a first axis, got an object"):
        TensorDataset(mt.ones(3), np.ones(3))
    with pytest.raises(TypeError, match="got a 0-d tensor"):
        TensorDataset(mt.tensor(1.0))
    with pytest.raises(ValueError, match="TensorDataset: give at least one tensor"):
        TensorDataset()
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match=f"DataLoader: batch_size must be an integer >= 1, got {bad!r}"):
            DataLoader(TensorDataset(mt.ones(3)), batch_size=bad)
    with pytest.raises(TypeError, match="DataLoader: the dataset must have __getitem__ and __len__, got int"):
        DataLoader(5)
    with pytest.raises(NotImplementedError, match="Empty must define __len__"):
        len(DataLoader(type("Empty", (Dataset,), {})()))
    with pytest.raises(TypeError, match="default_collate: cannot make a minibatch of str examples"):
        default_collate(["a", "b"])
    with pytest.raises(ValueError, match="default_collate: examples of different lengths"):
        default_collate([(1, 2), (3,)])


def test_workers_are_never_started():
    """D2L passes num_workers=4: accepted, warned about, and the data are read in this process
    (a thousand would start nothing either)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = DataLoader(TensorDataset(mt.arange(4)), 2, num_workers=1000)
    assert [str(w.message) for w in caught] == [
        "DataLoader: num_workers=1000 ignored: minitensor reads the data in this process"
    ]
    assert caught[0].filename == __file__  # the warning points at the caller's line
    assert [b[0].tolist() for b in loader] == [[0, 1], [2, 3]]
    with pytest.raises(ValueError, match="num_workers must be an integer >= 0, got -1"):
        DataLoader(TensorDataset(mt.arange(4)), 2, num_workers=-1)
