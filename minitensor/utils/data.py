"""``Dataset``, ``TensorDataset`` and ``DataLoader``: minibatches the way D2L's ``load_array``
(3.3, "Concise Implementation of Linear Regression") makes them with ``torch.utils.data``::

    dataset = mt.utils.data.TensorDataset(features, labels)
    for X, y in mt.utils.data.DataLoader(dataset, batch_size=10, shuffle=True):
        ...

A ``DataLoader`` walks its dataset in minibatches of ``batch_size`` examples, each epoch (each
``for``) in the same order or, with ``shuffle=True``, in a new random order drawn from the
generator ``mt.manual_seed`` seeds, so that a seeded program sees the same minibatches every
run. Over a ``TensorDataset`` a minibatch is one gather per tensor (``X[idx]``, on the tensors'
device), not ``batch_size`` calls of ``__getitem__``; any other dataset is read example by
example and the examples are stacked (``default_collate``).

Everything happens in the calling process: ``num_workers`` is accepted for PyTorch's code and
warned about, never used to start processes. The training loop of ``minitensor train`` uses
``minitensor.data.Batches`` instead, which also saves its place in the data for ``--resume``.
"""

import numbers
import warnings

import numpy

from .. import Tensor, stack, tensor
from ..random import host_rng

__all__ = ["DataLoader", "Dataset", "TensorDataset", "default_collate"]


class Dataset:
    """A map from indices 0, 1, ..., len - 1 to examples: a subclass defines ``__getitem__(i)``
    and ``__len__()``, as for PyTorch's ``torch.utils.data.Dataset``."""

    def __getitem__(self, index):
        raise NotImplementedError(f"{type(self).__name__} must define __getitem__(index)")

    def __len__(self):
        raise NotImplementedError(f"{type(self).__name__} must define __len__()")


class TensorDataset(Dataset):
    """Example i is ``(t[i] for t in tensors)``: tensors of equal length along their first axis,
    such as features and labels."""

    def __init__(self, *tensors):
        if not tensors:
            raise ValueError("TensorDataset: give at least one tensor")
        for i, t in enumerate(tensors):
            if not isinstance(t, Tensor) or t.ndim == 0:
                got = "a 0-d tensor" if isinstance(t, Tensor) else f"an object of type {type(t).__name__}"
                raise TypeError(f"TensorDataset: argument {i} must be a tensor with a first axis, got {got}")
        lengths = [t.shape[0] for t in tensors]
        if len(set(lengths)) > 1:
            raise ValueError(f"TensorDataset: the tensors differ in length along their first axis: {lengths}")
        self.tensors = tensors

    def __getitem__(self, index):
        return tuple(t[index] for t in self.tensors)

    def __len__(self):
        return self.tensors[0].shape[0]


def default_collate(examples):
    """Stack a list of examples into one minibatch, as PyTorch's ``default_collate``: tensors
    (and NumPy arrays) are stacked along a new first axis, Python numbers become a tensor
    (int64 or float32), and tuples, lists and dicts are collated field by field."""
    first = examples[0]
    if isinstance(first, Tensor):
        return stack(examples)
    if isinstance(first, numpy.ndarray):
        return tensor(numpy.stack(examples))
    if isinstance(first, (bool, numbers.Number)):
        return tensor(examples)
    if isinstance(first, dict):
        return {key: default_collate([e[key] for e in examples]) for key in first}
    if isinstance(first, (tuple, list)):
        if any(len(e) != len(first) for e in examples):
            raise ValueError(f"default_collate: examples of different lengths: {sorted({len(e) for e in examples})}")
        collated = [default_collate(list(field)) for field in zip(*examples, strict=True)]
        return collated if isinstance(first, list) else tuple(collated)
    raise TypeError(
        f"default_collate: cannot make a minibatch of {type(first).__name__} examples (tensors, NumPy arrays, "
        "numbers, and tuples, lists or dicts of them); pass collate_fn"
    )


class DataLoader:
    """Minibatches of ``dataset``, PyTorch's ``torch.utils.data.DataLoader`` for the common case:
    ``batch_size`` examples each (the last one smaller, or dropped with ``drop_last=True``), in
    index order or, with ``shuffle=True``, in a new order each epoch, drawn from
    ``mt.random.host_rng()`` (seeded by ``mt.manual_seed``). ``collate_fn`` turns a list of
    examples into a minibatch (``default_collate``); ``len(loader)`` is the minibatches per epoch."""

    def __init__(self, dataset, batch_size=1, shuffle=False, drop_last=False, collate_fn=None, num_workers=0):
        if not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
            raise TypeError(f"DataLoader: the dataset must have __getitem__ and __len__, got {type(dataset).__name__}")
        if not (isinstance(batch_size, numbers.Integral) and not isinstance(batch_size, bool) and batch_size >= 1):
            raise ValueError(f"DataLoader: batch_size must be an integer >= 1, got {batch_size!r}")
        if not (isinstance(num_workers, numbers.Integral) and num_workers >= 0):
            raise ValueError(f"DataLoader: num_workers must be an integer >= 0, got {num_workers!r}")
        if num_workers:
            warnings.warn(
                f"DataLoader: num_workers={num_workers} ignored: minitensor reads the data in this process",
                stacklevel=2,
            )
        self.dataset, self.batch_size, self.shuffle, self.drop_last = dataset, int(batch_size), shuffle, drop_last
        self.collate_fn = collate_fn

    def __len__(self):
        n = len(self.dataset)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)  # (integer ceiling)

    def __iter__(self):
        n = len(self.dataset)
        order = host_rng().permutation(n) if self.shuffle else numpy.arange(n)
        fast = isinstance(self.dataset, TensorDataset) and self.collate_fn is None
        for b in range(len(self)):
            idx = order[b * self.batch_size : (b + 1) * self.batch_size]
            if fast:  # one gather per tensor, on its device
                yield tuple(t[tensor(idx, device=t.device)] for t in self.dataset.tensors)
            else:
                examples = [self.dataset[int(i)] for i in idx]
                yield (self.collate_fn or default_collate)(examples)
