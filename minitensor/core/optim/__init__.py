"""Optimisers: ``Optimizer`` (the base class), ``SGD``, ``Adam`` and ``AdamW``; learning-rate
schedules in ``lr_scheduler`` (each also here, ``mt.optim.StepLR``); gradient clipping
(``clip_grad_norm_``, from ``mt.nn.utils``)."""

from ..nn.utils import clip_grad_norm_, grad_norm
from . import lr_scheduler
from .adam import Adam
from .adamw import AdamW
from .lr_scheduler import (
    CosineAnnealingLR,
    ExponentialLR,
    LambdaLR,
    LRScheduler,
    MultiStepLR,
    NoamLR,
    StepLR,
    WarmupCosineLR,
)
from .optimizer import Optimizer
from .sgd import SGD

__all__ = [
    "Adam",
    "AdamW",
    "CosineAnnealingLR",
    "ExponentialLR",
    "LRScheduler",
    "LambdaLR",
    "MultiStepLR",
    "NoamLR",
    "Optimizer",
    "SGD",
    "StepLR",
    "WarmupCosineLR",
    "clip_grad_norm_",
    "grad_norm",
    "lr_scheduler",
]
