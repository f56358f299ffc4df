"""PyTorch's ``torch.utils`` where a learner's code reaches for it: ``mt.utils.data``, the
``Dataset``, ``TensorDataset`` and ``DataLoader`` of D2L's ``load_array`` (data.py)."""

from . import data

__all__ = ["data"]
