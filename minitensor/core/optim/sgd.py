"""Stochastic gradient descent, with momentum and weight decay (PyTorch's update rule)."""

from __future__ import annotations

from typing import Any

from ..tensor import Array, Tensor
from .optimizer import Group, Optimizer, Params


class SGD(Optimizer):
    """Minibatch SGD: w <- w - lr * d, where d is the gradient g, adjusted:

        g <- g + weight_decay * w                      (L2 penalty weight_decay/2 |w|^2)
        momentum:  b <- g at the first step,  b <- momentum * b + (1 - dampening) * g after
                   d = b,  or with nesterov  d = g + momentum * b
        no momentum:  d = g

    Momentum averages recent gradients, so steps along a consistent direction grow and
    oscillating components cancel; Nesterov's variant looks one step ahead.
    """

    state_keys = frozenset({"momentum_buffer"})  # b, once momentum has made it

    def __init__(
        self,
        params: Params,
        lr: float,
        momentum: float = 0.0,
        dampening: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
    ) -> None:
        defaults = dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay, nesterov=nesterov)
        super().__init__(params, defaults)

    def check_hyperparameters(self, group: Group) -> None:
        """The base checks (lr, weight_decay >= 0), plus momentum >= 0 and dampening numbers;
        ``nesterov=True`` needs momentum > 0 and dampening = 0. Raises ``TypeError`` for a setting
        that is not a number, ``ValueError`` for one out of range."""
        super().check_hyperparameters(group)
        self.check_number("dampening", group["dampening"])
        if self.check_number("momentum", group["momentum"]) < 0:
            raise ValueError(f"SGD: momentum must be >= 0, got {group['momentum']}")
        if group["nesterov"] and (group["momentum"] <= 0 or group["dampening"] != 0):
            raise ValueError("SGD: nesterov momentum needs momentum > 0 and dampening = 0")

    def update(self, param: Tensor, grad: Array, state: dict[str, Any], group: Group) -> None:
        """One SGD step for one parameter, in place (D2L 11.4 / 12.4, with momentum 11.6 / 12.6):
        g += weight_decay * w; with momentum, b <- momentum b + (1 - dampening) g (b = g at the
        first step) and d = b, or g + momentum b with Nesterov; w <- w - lr d."""
        lr, momentum, weight_decay = group["lr"], group["momentum"], group["weight_decay"]
        if weight_decay:
            grad = grad + weight_decay * param.data
        if momentum:
            buf = state.get("momentum_buffer")
            if buf is None:
                buf = state["momentum_buffer"] = grad.copy()
            else:
                buf *= momentum
                buf += (1 - group["dampening"]) * grad
            grad = grad + momentum * buf if group["nesterov"] else buf
        param.add_(grad, alpha=-lr)
