"""Optimisers: ``Optimizer`` (the base class), ``SGD``, ``Adam`` and ``AdamW``; learning-rate
schedules in ``lr_scheduler``; gradient clipping (``clip_grad_norm_``, from ``mt.nn.utils``)."""

from ..nn.utils import clip_grad_norm_, grad_norm
from . import lr_scheduler
from .adam import Adam
from .adamw import AdamW
from .lr_scheduler import LambdaLR, LRScheduler, NoamLR, WarmupCosineLR
from .optimizer import Optimizer
from .sgd import SGD

__all__ = [
    "Adam",
    "AdamW",
    "LRScheduler",
    "LambdaLR",
    "NoamLR",
    "Optimizer",
    "SGD",
    "WarmupCosineLR",
    "clip_grad_norm_",
    "grad_norm",
    "lr_scheduler",
]
