"""``mt.save`` and ``mt.load``: tensors to a file and back, as ``torch.save`` and ``torch.load``
write and read them in D2L's "File I/O" section (5.5 in the PyTorch edition): a tensor, a list
of tensors, or a dict of them, such as a model's ``state_dict``::

    mt.save(net.state_dict(), "mlp.params")
    clone.load_state_dict(mt.load("mlp.params"))

The file is safetensors (Hugging Face's format: eight bytes giving the length of a JSON header
that names each array's dtype, shape and byte range, then the arrays' raw bytes), never a
pickle. Loading a pickle runs whatever code its writer put in it; loading this file only reads
numbers, whoever wrote it, so ``mt.load`` needs no ``weights_only`` switch. The price is that
only tensors can be saved, not arbitrary Python objects: a training run's optimizer state, step
and vocabularies go into a checkpoint folder (``minitensor.train.checkpoint``).

The header's ``__metadata__`` records what was saved (a tensor, a list, a tuple or a dict) and
each tensor's device and ``requires_grad``, so that ``load`` gives back what ``save`` was given.
A safetensors file from elsewhere (a model's weights from the Hugging Face Hub) loads as a dict.
A path is written atomically (``atomic.write_atomic``): an interrupted save leaves the old file.
"""

import json
import os

import numpy

from . import DeviceError, Tensor, get_backend, tensor
from .atomic import write_atomic
from .core.dtypes import as_dtype

FORMAT = "minitensor.save/1"  # the header's "format", so that load knows the file is save's
STRUCTURES = ("tensor", "list", "tuple", "dict")


def save(obj, f):
    """Write ``obj`` -- a Tensor, a list or tuple of Tensors, or a dict of str to Tensor (a
    ``state_dict``) -- to ``f``, a path or a binary file object, as safetensors (see the module
    docstring). Tensors on a GPU are copied to the host first; their device is recorded."""
    structure, tensors = _flatten(obj)
    from safetensors.numpy import save as safetensors_save  # lazily: `import minitensor` stays light

    metadata = {
        "format": FORMAT,
        "structure": structure,
        "devices": json.dumps({name: t.device for name, t in tensors.items()}),
        "requires_grad": json.dumps(sorted(name for name, t in tensors.items() if t.requires_grad)),
        "keys": json.dumps(list(tensors)),  # the header sorts its names; a state_dict keeps its order
    }
    # host copies in C order (numpy.require keeps a 0-d tensor 0-d, where ascontiguousarray would not)
    arrays = {name: numpy.require(t.numpy(), requirements="C") for name, t in tensors.items()}
    data = safetensors_save(arrays, metadata=metadata)
    if hasattr(f, "write"):
        f.write(data)
    else:
        write_atomic(f, data)


def _flatten(obj):
    """(structure, {name: Tensor}) for what ``save`` may write; a TypeError names anything else."""
    if isinstance(obj, Tensor):
        return "tensor", {"tensor": obj}
    if isinstance(obj, (list, tuple)):
        for i, t in enumerate(obj):
            _check_tensor(t, f"item {i} of the {type(obj).__name__}")
        return type(obj).__name__, {str(i): t for i, t in enumerate(obj)}
    if isinstance(obj, dict):
        for key, t in obj.items():
            if not isinstance(key, str) or key == "__metadata__":
                raise TypeError(f"save: a dict's keys must be strings other than '__metadata__', got {key!r}")
            _check_tensor(t, f"the value of key {key!r}")
        return "dict", dict(obj)
    raise TypeError(
        f"save: can write a Tensor, a list or tuple of Tensors, or a dict of str to Tensor (a state_dict), "
        f"got {type(obj).__name__}. It writes safetensors, never a pickle: to keep an optimizer's state "
        "or other data, use a checkpoint (minitensor.train.checkpoint.save_checkpoint) or JSON"
    )


def _check_tensor(t, where):
    if not isinstance(t, Tensor):
        raise TypeError(f"save: {where} is not a Tensor but of type {type(t).__name__} (mt.tensor(...) makes one)")


# safetensors' dtype names, as safetensors.numpy reads them, and bfloat16 ("BF16"), which it does not
# (NumPy has none: ml_dtypes' is mt.bfloat16, which safetensors.numpy writes as "BF16")
_DTYPES = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64", "U64": "uint64",
    "I32": "int32", "U32": "uint32", "I16": "int16", "U16": "uint16", "I8": "int8", "U8": "uint8", "BOOL": "bool",
}  # fmt: skip


def _array(view, key, name):
    """A read-only NumPy view of tensor ``key`` of the deserialized safetensors file ``name``."""
    if view["dtype"] not in _DTYPES:
        raise ValueError(
            f"load: {name} holds {key!r} as {view['dtype']}, a dtype minitensor has no tensors of "
            f"(it reads {', '.join(_DTYPES)})"
        )
    return numpy.frombuffer(view["data"], dtype=as_dtype(_DTYPES[view["dtype"]])).reshape(view["shape"])


def load(f, map_location=None):
    """What ``save`` wrote to ``f`` (a path or a binary file object): a Tensor, a list, a tuple or
    a dict of Tensors; a safetensors file that ``save`` did not write loads as a dict.

    ``map_location``: the device to put every tensor on ("cpu", "cuda"); by default each goes
    back to the device it was saved from, as in PyTorch, and a device this machine lacks is an
    error that says to pass ``map_location="cpu"``. A file that is not safetensors, or is
    damaged, is a ValueError naming it; nothing in the file is ever executed."""
    if hasattr(f, "read"):
        name, data = getattr(f, "name", "the file object"), f.read()
    else:
        name = os.fspath(f)
        with open(name, "rb") as file:
            data = file.read()
    metadata = _metadata(data, name)
    from safetensors import deserialize

    try:  # safetensors' own checks: offsets, lengths, dtypes
        views = deserialize(data)
    except Exception as e:
        raise ValueError(f"load: {name} cannot be read as safetensors (damaged?): {e}") from e
    arrays = {key: _array(view, key, name) for key, view in views}
    ours = metadata.get("format") == FORMAT
    structure = metadata.get("structure") if ours else "dict"
    try:
        devices = json.loads(metadata["devices"]) if ours else {}
        requires_grad = set(json.loads(metadata["requires_grad"])) if ours else set()
        keys = json.loads(metadata["keys"]) if ours else sorted(arrays)
    except (KeyError, ValueError, TypeError) as e:
        raise ValueError(f"load: {name} was written by mt.save but its metadata is damaged ({e!r})") from e
    names = isinstance(keys, list) and all(isinstance(k, str) for k in keys) and sorted(keys) == sorted(arrays)
    if (
        structure not in STRUCTURES
        or not names
        or (structure == "tensor" and len(keys) != 1)
        or not (isinstance(devices, dict) and all(isinstance(d, str) for d in devices.values()))
    ):
        held = f"{len(keys)} tensors" if isinstance(keys, list) else f"keys {str(keys)[:40]!r}"
        raise ValueError(
            f"load: {name} was written by mt.save but its metadata is damaged: a {structure!r} "
            f"of {held}, where the file holds {len(arrays)} tensors"
        )

    def to_tensor(key):
        device = map_location or devices.get(key, "cpu")
        try:
            get_backend(device)
        except DeviceError as e:
            if map_location:
                raise DeviceError(f"load: map_location: {e}") from None
            saved = f"load: {name} holds a tensor saved from {device!r}"
            raise DeviceError(f"{saved}: {e}; pass map_location='cpu'") from None
        # a copy: the arrays safetensors gives are read-only views of the bytes read
        return tensor(arrays[key], device=device, requires_grad=key in requires_grad)

    if structure == "dict":
        return {key: to_tensor(key) for key in keys}
    if structure == "tensor":
        return to_tensor(keys[0])
    items = [to_tensor(key) for key in keys]
    return items if structure == "list" else tuple(items)


def _metadata(data, name):
    """The ``__metadata__`` of a safetensors file's header ({} if it has none)."""
    size = int.from_bytes(data[:8], "little") if len(data) >= 8 else -1
    if not 0 < size <= len(data) - 8:
        raise ValueError(f"load: {name} is not a safetensors file ({len(data):,} bytes, no header of that form)")
    try:
        header = json.loads(data[8 : 8 + size].decode("utf-8"))
        metadata = header.get("__metadata__") or {}
    except (UnicodeDecodeError, ValueError, AttributeError, RecursionError) as e:
        raise ValueError(f"load: {name} is not a safetensors file (its header is not a JSON object: {e})") from e
    if not isinstance(metadata, dict):
        raise ValueError(f"load: {name} is not a safetensors file (its __metadata__ is not an object)")
    return metadata
