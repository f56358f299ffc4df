"""Optimisers: ``Optimizer`` (the base class), ``SGD`` and ``Adam``."""

from .adam import Adam
from .optimizer import Optimizer
from .sgd import SGD

__all__ = ["Adam", "Optimizer", "SGD"]
