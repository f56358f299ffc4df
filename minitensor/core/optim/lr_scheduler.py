"""Learning-rate schedules (PyTorch's ``torch.optim.lr_scheduler``): ``LRScheduler``,
``LambdaLR``, ``NoamLR`` and ``WarmupCosineLR``, and PyTorch's ``StepLR``, ``MultiStepLR``,
``ExponentialLR`` and ``CosineAnnealingLR`` (D2L 12.11, "Learning Rate Scheduling").

A scheduler sets ``group["lr"]`` of every parameter group of an optimiser; call
``scheduler.step()`` once after each ``optimizer.step()``::

    opt = mt.optim.Adam(model.parameters(), lr=1.0)
    sched = mt.optim.NoamLR(opt, d_model=32, warmup_steps=4000)
    for batch in data:
        ...; loss.backward(); opt.step(); opt.zero_grad(); sched.step()

Why warm up: at the start Adam's second-moment estimates v rest on a handful of gradients
and the model is far from anything sensible, so large steps are erratic (Transformers in
particular diverge); a learning rate that grows over the first ``warmup_steps`` steps and
decays afterwards trains them reliably.

Counting: ``last_epoch`` (PyTorch's name) is how many times ``step()`` has been called, 0
right after construction. ``NoamLR`` and ``WarmupCosineLR`` number training steps from 1,
as the Transformer paper does: the learning rate in force for optimiser step t = last_epoch
+ 1 is lr(t). Construction sets lr(1) at once, so the first step is never wasted at 0.

Chaining: PyTorch's four schedules (``StepLR``, ``MultiStepLR``, ``ExponentialLR``,
``CosineAnnealingLR``) update the group's *current* rate step by step, as PyTorch's do
("multiply by gamma now"), rather than setting it from ``base_lrs``: so two of them on one
optimiser compose (ExponentialLR then StepLR: both factors apply), and a rate changed by hand
mid-run is carried on from. A closed form would overwrite the other schedule's (or the user's)
change at every step. Each also has PyTorch's ``_get_closed_form_lr()``, the rate from
``base_lrs`` and ``last_epoch`` alone: it is what a scheduler made with ``last_epoch >= 0``
(resuming) sets, since the rate in the group then need not be the schedule's.
``LambdaLR``, ``NoamLR`` and ``WarmupCosineLR`` set their rate from ``base_lrs`` (as
PyTorch's ``LambdaLR`` does): they overwrite, they do not compose.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterable
from typing import Any

from .optimizer import Optimizer

__all__ = [
    "CosineAnnealingLR",
    "ExponentialLR",
    "LRScheduler",
    "LambdaLR",
    "MultiStepLR",
    "NoamLR",
    "StepLR",
    "WarmupCosineLR",
]


class LRScheduler:
    """Base class: a subclass writes ``get_lr()``, the learning rate of every parameter group
    for the current ``last_epoch``. ``base_lrs`` are the groups' learning rates when the
    scheduler was made (kept in ``group["initial_lr"]``, as in PyTorch)."""

    def __init__(self, optimizer: Optimizer, last_epoch: int = -1) -> None:
        if not isinstance(optimizer, Optimizer):
            raise TypeError(
                f"{type(self).__name__}: schedules an optimiser (mt.optim.Adam(...) and the like), "
                f"got {type(optimizer).__name__}"
            )
        self.optimizer = optimizer
        for group in optimizer.param_groups:
            if last_epoch == -1:
                group.setdefault("initial_lr", group["lr"])
            elif "initial_lr" not in group:
                raise KeyError(
                    f"{type(self).__name__}: resuming at last_epoch={last_epoch} needs 'initial_lr' in every "
                    "parameter group (load the optimiser's state_dict first, or start with last_epoch=-1)"
                )
        self.base_lrs = [group["initial_lr"] for group in optimizer.param_groups]
        self.last_epoch = last_epoch + 1  # construction is step 0 (or, resuming, the next step)
        # Resuming, the group's rate need not be where the schedule is (a fresh optimiser, or
        # one whose state was loaded after): the closed form, where the schedule has one, puts it there.
        closed_form = getattr(self, "_get_closed_form_lr", None)
        self._apply(closed_form() if last_epoch != -1 and closed_form is not None else self.get_lr())

    def get_lr(self) -> list[float]:
        """The learning rate of every parameter group for the current ``last_epoch``, a list; written
        by each subclass (the base class raises ``NotImplementedError``). ``step()`` applies it. A
        recursive schedule computes it from the groups' current ``lr``, so call it once per step."""
        raise NotImplementedError(f"{type(self).__name__} must define get_lr()")

    def step(self) -> None:
        """Advance one step and set the new learning rates (a rate that is refused changes nothing)."""
        self.last_epoch += 1
        try:
            self._apply(self.get_lr())
        except ValueError:
            self.last_epoch -= 1
            raise

    def _apply(self, lrs: list[float]) -> None:
        for i, lr in enumerate(lrs):  # all checked before any is set
            if not 0 <= lr < math.inf:  # (NaN fails both: the optimiser would make every weight NaN)
                raise ValueError(
                    f"{type(self).__name__}: the learning rate of parameter group {i} at step {self.last_epoch} "
                    f"would be {lr}; it must be a finite number >= 0"
                )
        for group, lr in zip(self.optimizer.param_groups, lrs, strict=True):
            group["lr"] = lr
        self._last_lr = self._current_lrs()

    def _current_lrs(self) -> list[float]:
        """The groups' learning rates now: what a recursive schedule multiplies."""
        return [group["lr"] for group in self.optimizer.param_groups]

    def get_last_lr(self) -> list[float]:
        """The learning rates the last ``step()`` (or the construction) set, one per group."""
        return list(self._last_lr)

    def state_dict(self) -> dict[str, Any]:
        """Everything but the optimiser: plain numbers and lists (JSON-safe, no pickle)."""
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items() if k != "optimizer"}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore ``state_dict()``'s values and set the optimiser's learning rates to match,
        so resuming works even if the optimiser's own state was not restored."""
        self.__dict__.update({k: v for k, v in state_dict.items() if k != "optimizer"})
        self._apply(self._last_lr)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(last_epoch={self.last_epoch}, lr={self._last_lr})"


class LambdaLR(LRScheduler):
    """lr = base_lr * lr_lambda(last_epoch), ``last_epoch`` = 0, 1, 2, ... (exactly PyTorch's
    ``LambdaLR``, so code written for it, like the Annotated Transformer's, ports as is).
    ``lr_lambda``: one function, or a list of one per parameter group. It is not saved by
    ``state_dict()`` (functions are code, not state): build the scheduler with it again."""

    def __init__(
        self,
        optimizer: Optimizer,
        lr_lambda: Callable[[int], float] | list[Callable[[int], float]],
        last_epoch: int = -1,
    ) -> None:
        n = len(optimizer.param_groups)
        self.lr_lambdas = list(lr_lambda) if isinstance(lr_lambda, (list, tuple)) else [lr_lambda] * n
        if len(self.lr_lambdas) != n:
            raise ValueError(f"LambdaLR: {len(self.lr_lambdas)} lr_lambdas for {n} parameter groups")
        for fn in self.lr_lambdas:
            if not callable(fn):
                raise TypeError(f"LambdaLR: lr_lambda must be a function of the step (or a list of them), got {fn!r}")
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        """lr = base_lr * lr_lambda(last_epoch) for every parameter group, a list."""
        return [base * fn(self.last_epoch) for base, fn in zip(self.base_lrs, self.lr_lambdas)]

    def state_dict(self) -> dict[str, Any]:
        """The base class's state without ``lr_lambdas`` (functions are code, not state): pass them to
        the constructor again when resuming."""
        state = super().state_dict()
        state.pop("lr_lambdas", None)
        return state


class NoamLR(LRScheduler):
    """The Transformer paper's schedule (Vaswani et al. 2017, section 5.3), for step t = 1, 2, ...:

        lr(t) = factor * d_model^(-1/2) * min(t^(-1/2), t * warmup_steps^(-3/2))

    It rises linearly for ``warmup_steps`` steps, peaks at factor / sqrt(d_model * warmup_steps)
    at t = warmup_steps, and then decays as 1 / sqrt(t) ("inverse square root"). The paper
    used d_model = 512, warmup_steps = 4000, Adam with betas (0.9, 0.98), eps 1e-9.

    The learning rate is absolute: the optimiser's own ``lr`` is overwritten (use ``factor``
    to scale), and every parameter group gets the same.
    """

    def __init__(
        self, optimizer: Optimizer, d_model: int, warmup_steps: int, factor: float = 1.0, last_epoch: int = -1
    ) -> None:
        if d_model <= 0 or warmup_steps <= 0:
            raise ValueError(f"NoamLR: d_model and warmup_steps must be positive, got {d_model}, {warmup_steps}")
        self.d_model, self.warmup_steps, self.factor = d_model, warmup_steps, factor
        super().__init__(optimizer, last_epoch)

    def lr_at(self, t: int) -> float:
        """The learning rate for training step t = 1, 2, ...:
        lr(t) = factor * d_model^(-1/2) * min(t^(-1/2), t * warmup_steps^(-3/2))."""
        return self.factor * self.d_model**-0.5 * min(t**-0.5, t * self.warmup_steps**-1.5)

    def get_lr(self) -> list[float]:
        """``lr_at(last_epoch + 1)`` for every parameter group (the same rate for all), a list."""
        return [self.lr_at(self.last_epoch + 1)] * len(self.base_lrs)


class WarmupCosineLR(LRScheduler):
    """Linear warm-up to each group's base lr, then a cosine decay down to ``min_lr``; for
    step t = 1, 2, ... (W = warmup_steps, S = total_steps):

        t <= W:      lr(t) = base_lr * t / W
        W < t <= S:  lr(t) = min_lr + (base_lr - min_lr) * (1 + cos(pi * (t - W) / (S - W))) / 2
        t > S:       lr(t) = min_lr

    The cosine (Loshchilov and Hutter's SGDR, without restarts) spends more steps near the
    peak and near the end than a linear decay does. ``warmup_steps=0``: no warm-up.
    """

    def __init__(
        self, optimizer: Optimizer, warmup_steps: int, total_steps: int, min_lr: float = 0.0, last_epoch: int = -1
    ) -> None:
        if not 0 <= warmup_steps < total_steps:
            raise ValueError(f"WarmupCosineLR: need 0 <= warmup_steps < total_steps, got {warmup_steps}, {total_steps}")
        self.warmup_steps, self.total_steps, self.min_lr = warmup_steps, total_steps, min_lr
        super().__init__(optimizer, last_epoch)

    def lr_at(self, t: int, base_lr: float) -> float:
        """The learning rate for training step t = 1, 2, ... and a group's ``base_lr``: base_lr * t / W
        while t <= W, then min_lr + (base_lr - min_lr) (1 + cos(pi (t - W) / (S - W))) / 2, held at
        min_lr after S (W = warmup_steps, S = total_steps)."""
        W, S = self.warmup_steps, self.total_steps
        if t <= W:
            return base_lr * t / W
        progress = min(t - W, S - W) / (S - W)  # 0 .. 1, then held at 1
        return self.min_lr + (base_lr - self.min_lr) * 0.5 * (1 + math.cos(math.pi * progress))

    def get_lr(self) -> list[float]:
        """``lr_at(last_epoch + 1, base_lr)`` for every parameter group, a list."""
        return [self.lr_at(self.last_epoch + 1, base) for base in self.base_lrs]


def _positive_int(name: str, value: Any, scheduler: str) -> int:
    if not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        raise ValueError(f"{scheduler}: {name} must be an integer >= 1, got {value!r}")
    return value


def _factor(gamma: Any, scheduler: str) -> float:
    if not (isinstance(gamma, (int, float)) and not isinstance(gamma, bool) and 0 < gamma):
        raise ValueError(f"{scheduler}: gamma must be a number > 0, got {gamma!r}")
    return float(gamma)


class StepLR(LRScheduler):
    """The rate multiplied by ``gamma`` every ``step_size`` steps (or epochs, if ``step()`` is
    called once an epoch), PyTorch's ``StepLR``. Recursively, at step last_epoch:

        lr <- lr * gamma   if last_epoch > 0 and last_epoch % step_size == 0,   else lr unchanged

    alone, that is lr = base_lr * gamma^(last_epoch // step_size) (``_get_closed_form_lr``)."""

    def __init__(self, optimizer: Optimizer, step_size: int, gamma: float = 0.1, last_epoch: int = -1) -> None:
        self.step_size = _positive_int("step_size", step_size, "StepLR")
        self.gamma = _factor(gamma, "StepLR")
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        """Every group's current lr, times gamma at a non-zero multiple of step_size, a list."""
        if self.last_epoch == 0 or self.last_epoch % self.step_size != 0:
            return self._current_lrs()
        return [lr * self.gamma for lr in self._current_lrs()]

    def _get_closed_form_lr(self) -> list[float]:
        """base_lr * gamma^(last_epoch // step_size) for every parameter group, a list."""
        return [base * self.gamma ** (self.last_epoch // self.step_size) for base in self.base_lrs]


class MultiStepLR(LRScheduler):
    """The rate multiplied by ``gamma`` at each of the ``milestones``, PyTorch's ``MultiStepLR``
    (D2L 12.11's factor schedule at epochs 15 and 30: ``MultiStepLR(trainer, milestones=[15,
    30], gamma=0.5)``). Recursively, at step last_epoch:

        lr <- lr * gamma^k,   k = how many times last_epoch is listed in ``milestones`` (often 0)

    alone, lr = base_lr * gamma^(milestones reached, milestone <= last_epoch) (the closed form).
    A milestone listed twice multiplies by gamma^2 there, as in PyTorch."""

    def __init__(
        self, optimizer: Optimizer, milestones: Iterable[int], gamma: float = 0.1, last_epoch: int = -1
    ) -> None:
        # a sorted list (JSON-safe in state_dict), not PyTorch's Counter: list.count and bisect serve
        self.milestones = sorted(_positive_int("a milestone", m, "MultiStepLR") for m in milestones)
        self.gamma = _factor(gamma, "MultiStepLR")
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        """Every group's current lr, times gamma^(times last_epoch is a milestone), a list."""
        hits = self.milestones.count(self.last_epoch)
        if not hits:
            return self._current_lrs()
        return [lr * self.gamma**hits for lr in self._current_lrs()]

    def _get_closed_form_lr(self) -> list[float]:
        """base_lr * gamma^(milestones reached) for every parameter group, a list."""
        reached = bisect.bisect_right(self.milestones, self.last_epoch)
        return [base * self.gamma**reached for base in self.base_lrs]


class ExponentialLR(LRScheduler):
    """The rate multiplied by ``gamma`` at every step, PyTorch's ``ExponentialLR``:
    lr <- lr * gamma at each step after construction; alone, lr = base_lr * gamma^last_epoch
    (the closed form)."""

    def __init__(self, optimizer: Optimizer, gamma: float, last_epoch: int = -1) -> None:
        self.gamma = _factor(gamma, "ExponentialLR")
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        """Every group's current lr times gamma (unchanged at construction, last_epoch 0), a list."""
        if self.last_epoch == 0:
            return self._current_lrs()
        return [lr * self.gamma for lr in self._current_lrs()]

    def _get_closed_form_lr(self) -> list[float]:
        """base_lr * gamma^last_epoch for every parameter group, a list."""
        return [base * self.gamma**self.last_epoch for base in self.base_lrs]


class CosineAnnealingLR(LRScheduler):
    """Half a cosine from each group's base rate down to ``eta_min`` over ``T_max`` steps
    (Loshchilov and Hutter's SGDR without restarts), PyTorch's ``CosineAnnealingLR``. Alone:

        lr = eta_min + (base_lr - eta_min) * (1 + cos(pi * last_epoch / T_max)) / 2

    (``_get_closed_form_lr``). Like PyTorch's, each step computes it recursively from the
    current rate, so that it composes with other schedules (e = last_epoch):

        lr <- eta_min + (lr - eta_min) * (1 + cos(pi e / T_max)) / (1 + cos(pi (e - 1) / T_max))

    except where the ratio's denominator is 0: at e = T_max + 1 (mod 2 T_max), coming back up
    from the bottom of the cosine (there lr - eta_min = 0 and cos((e - 1) pi / T_max) = -1), the
    step adds the closed form's increment instead, lr <- lr + (base_lr - eta_min) (1 - cos(pi /
    T_max)) / 2. (PyTorch's other special case, the first step after resuming, is the closed form
    that construction with ``last_epoch >= 0`` sets here.)
    Past ``T_max`` the cosine goes on, back up, as PyTorch's does; ``WarmupCosineLR`` holds
    ``min_lr`` instead and warms up first."""

    def __init__(self, optimizer: Optimizer, T_max: int, eta_min: float = 0.0, last_epoch: int = -1) -> None:  # noqa: N803
        self.T_max = _positive_int("T_max", T_max, "CosineAnnealingLR")
        self.eta_min = eta_min
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        """Every group's next lr by the recursion above (unchanged at last_epoch 0), a list."""
        e, T, eta_min = self.last_epoch, self.T_max, self.eta_min
        if e == 0:
            return self._current_lrs()
        if (e - 1 - T) % (2 * T) == 0:
            rise = (1 - math.cos(math.pi / T)) / 2
            return [lr + (base - eta_min) * rise for lr, base in zip(self._current_lrs(), self.base_lrs, strict=True)]
        ratio = (1 + math.cos(math.pi * e / T)) / (1 + math.cos(math.pi * (e - 1) / T))
        return [eta_min + (lr - eta_min) * ratio for lr in self._current_lrs()]

    def _get_closed_form_lr(self) -> list[float]:
        """eta_min + (base_lr - eta_min) (1 + cos(pi last_epoch / T_max)) / 2 for every group, a list."""
        cosine = (1 + math.cos(math.pi * self.last_epoch / self.T_max)) / 2
        return [self.eta_min + (base - self.eta_min) * cosine for base in self.base_lrs]
