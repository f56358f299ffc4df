"""``mt.save`` / ``mt.load`` (minitensor/serialization.py): what ``torch.save`` / ``torch.load`` do
in D2L's "File I/O" section, through safetensors: what is saved comes back equal, on its device,
in its order; anything but tensors is refused before a byte is written; a damaged or foreign
file is an error naming it, and nothing in a file is ever run."""

import io
import json
import pickle
import subprocess
import sys

import numpy as np
import pytest
from helpers import host
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import minitensor as mt


def assert_same(loaded, saved):
    assert type(loaded) is type(saved)
    assert loaded.device == saved.device and loaded.dtype == saved.dtype
    assert loaded.requires_grad == saved.requires_grad and loaded.is_leaf
    np.testing.assert_array_equal(host(loaded), host(saved))


def test_d2l_file_io_round_trips(device, tmp_path):
    """D2L's examples: a tensor, a list of tensors, a dict of them, and a model's parameters
    loaded into a clone that then computes what the model computes."""
    x = mt.arange(4, device=device)
    mt.save(x, tmp_path / "x-file")
    assert_same(mt.load(tmp_path / "x-file"), x)
    y = mt.zeros(4, device=device)
    mt.save([x, y], tmp_path / "x-files")
    x2, y2 = mt.load(tmp_path / "x-files")
    assert_same(x2, x) and assert_same(y2, y)
    mydict = {"x": x, "y": y}
    mt.save(mydict, tmp_path / "mydict")
    loaded = mt.load(tmp_path / "mydict")
    assert list(loaded) == ["x", "y"]
    for key in mydict:
        assert_same(loaded[key], mydict[key])

    def mlp():
        return mt.nn.Sequential(mt.nn.Linear(20, 256), mt.nn.ReLU(), mt.nn.Linear(256, 10)).to(device)

    net, clone = mlp(), mlp()
    X = mt.randn(2, 20, device=device)
    mt.save(net.state_dict(), tmp_path / "mlp.params")
    state = mt.load(tmp_path / "mlp.params")
    assert list(state) == list(net.state_dict())  # the order saved, not the header's sorted one
    clone.load_state_dict(state)
    np.testing.assert_array_equal(host(clone(X)), host(net(X)))


def test_dtypes_structures_and_grad_flags_come_back(device):
    w = mt.randn(3, 2, device=device, requires_grad=True)
    values = (
        w,
        mt.tensor([[True, False]], device=device),
        mt.ones(2, dtype=mt.float16, device=device),
        mt.ones(1, dtype=mt.float64, device=device),
        mt.tensor([-(2**40)], device=device),
        mt.ones(2, 3, device=device).T,  # not contiguous
        mt.zeros(0, 4, device=device),
    )
    buffer = io.BytesIO()
    mt.save(values, buffer)
    buffer.seek(0)
    loaded = mt.load(buffer)
    assert type(loaded) is tuple and len(loaded) == len(values)
    for a, b in zip(loaded, values, strict=True):
        assert_same(a, b)
    loaded[0].data[0, 0] = 5.0  # writable, and not the saved tensor's memory
    assert host(w)[0, 0] != 5.0
    buffer = io.BytesIO()
    mt.save([], buffer)
    assert mt.load(io.BytesIO(buffer.getvalue())) == []


@given(
    hnp.arrays(
        st.sampled_from(["float32", "float64", "int64", "int32", "bool"]),
        hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5),
    )
)
def test_any_array_round_trips(array):
    buffer = io.BytesIO()
    mt.save({"a": mt.tensor(array)}, buffer)
    loaded = mt.load(io.BytesIO(buffer.getvalue()))["a"]
    assert loaded.dtype == array.dtype and loaded.shape == array.shape
    np.testing.assert_array_equal(loaded.numpy(), array)  # NaN equals NaN here


def test_map_location(device, tmp_path):
    mt.save({"w": mt.ones(2, device=device)}, tmp_path / "w")
    assert mt.load(tmp_path / "w")["w"].device == device
    assert mt.load(tmp_path / "w", map_location="cpu")["w"].device == "cpu"
    with pytest.raises(mt.DeviceError, match="load: map_location: unknown device 'tpu'"):
        mt.load(tmp_path / "w", map_location="tpu")


def test_a_device_this_machine_lacks_says_map_location(tmp_path):
    mt.save({"w": mt.ones(2)}, tmp_path / "w")
    data = (tmp_path / "w").read_bytes()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + n])
    header["__metadata__"]["devices"] = json.dumps({"w": "tpu"})  # as if saved on a device not here
    raw = json.dumps(header, separators=(",", ":")).encode().ljust(n)  # the same length: the offsets stay right
    assert len(raw) == n
    (tmp_path / "w").write_bytes(data[:8] + raw + data[8 + n :])
    with pytest.raises(mt.DeviceError, match=r"holds a tensor saved from 'tpu'.*pass map_location='cpu'$"):
        mt.load(tmp_path / "w")
    assert mt.load(tmp_path / "w", map_location="cpu")["w"].device == "cpu"


@pytest.mark.parametrize(
    "obj, message",
    [
        (3, "got int. It writes safetensors, never a pickle"),
        ({"lr": 0.1}, "the value of key 'lr' is not a Tensor but of type float"),
        ([mt.ones(1), np.ones(1)], "item 1 of the list is not a Tensor but of type ndarray"),
        ({1: mt.ones(1)}, "keys must be strings"),
        ({"__metadata__": mt.ones(1)}, "other than '__metadata__'"),
        (mt.optim.SGD([mt.nn.Parameter(mt.ones(1))], lr=0.1).state_dict(), "is not a Tensor"),
    ],
)
def test_what_is_not_tensors_is_refused_before_writing(tmp_path, obj, message):
    path = tmp_path / "out"
    path.write_bytes(b"the old file")
    with pytest.raises(TypeError, match=message):
        mt.save(obj, path)
    assert path.read_bytes() == b"the old file"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no temporary file left either


def saved_bytes(obj):
    buffer = io.BytesIO()
    mt.save(obj, buffer)
    return buffer.getvalue()


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda data: b"", "is not a safetensors file (0 bytes"),
        (lambda data: data[:5], "is not a safetensors file (5 bytes"),
        (lambda data: (10**9).to_bytes(8, "little") + data[8:], "no header of that form"),
        (lambda data: data[:-3], "cannot be read as safetensors (damaged?)"),
        (lambda data: data + b"\0", "cannot be read as safetensors (damaged?)"),
        (lambda data: data[:8] + b"[" + data[9:], "its header is not a JSON object"),
        (lambda data: pickle.dumps({"w": np.ones(2)}), "is not a safetensors file"),
    ],
)
def test_a_damaged_or_foreign_file_is_an_error_naming_it(tmp_path, damage, message):
    path = tmp_path / "model.params"
    path.write_bytes(damage(saved_bytes({"w": mt.ones(3), "b": mt.zeros(2)})))
    with pytest.raises(ValueError) as error:
        mt.load(path)
    assert str(error.value).startswith(f"load: {path} ") and message in str(error.value)


def test_damaged_metadata_is_an_error(tmp_path):
    from safetensors.numpy import save

    arrays = {"0": np.ones(2, np.float32)}
    meta = {"format": "minitensor.save/1", "structure": "list", "devices": "{}", "requires_grad": "[]"}
    for metadata, message in [
        ({**meta, "keys": "not json"}, "metadata is damaged"),
        (meta, "metadata is damaged"),  # no "keys"
        ({**meta, "keys": '["0", "1"]'}, "a 'list' of 2 tensors, where the file holds 1"),
        ({**meta, "keys": '["0"]', "structure": "set"}, "a 'set' of 1 tensors"),
        ({**meta, "keys": "5"}, "a 'list' of keys '5', where the file holds 1 tensors"),  # crafted: never a TypeError
        ({**meta, "keys": '["0"]', "devices": '{"0": 5}'}, "metadata is damaged"),
        ({**meta, "keys": '["0"]', "requires_grad": "7"}, "metadata is damaged"),
    ]:
        (tmp_path / "f").write_bytes(save(arrays, metadata=metadata))
        with pytest.raises(ValueError, match=message):
            mt.load(tmp_path / "f")
    two = {"tensor": np.ones(1, np.float32), "other": np.ones(1, np.float32)}
    tensor_of_two = {**meta, "structure": "tensor", "keys": '["tensor", "other"]'}
    (tmp_path / "f").write_bytes(save(two, metadata=tensor_of_two))
    with pytest.raises(ValueError, match="a 'tensor' of 2 tensors"):
        mt.load(tmp_path / "f")


def test_a_safetensors_file_from_elsewhere_loads_as_a_dict(tmp_path):
    from safetensors.numpy import save

    (tmp_path / "model.safetensors").write_bytes(save({"b": np.arange(3), "a": np.ones((2, 2), np.float32)}))
    loaded = mt.load(tmp_path / "model.safetensors")
    assert sorted(loaded) == ["a", "b"] and loaded["a"].dtype == mt.float32
    np.testing.assert_array_equal(loaded["b"].numpy(), np.arange(3))


def test_import_minitensor_leaves_safetensors_unloaded_until_save():
    code = (
        "import sys, io, minitensor as mt\n"
        "before = 'safetensors' in sys.modules\n"
        "mt.save(mt.ones(1), io.BytesIO())\n"
        "print(before, 'safetensors' in sys.modules, 'pickle' in dir(sys.modules['minitensor.serialization']))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True", "False"]
