"""AdamW (Loshchilov and Hutter, 2019): Adam with *decoupled* weight decay."""

from __future__ import annotations

from typing import Any

from ..tensor import Array, Tensor
from .adam import Adam
from .optimizer import Group, Params


class AdamW(Adam):
    """At step t, before Adam's update (see ``Adam``), with the raw gradient g:

        w <- w - lr * weight_decay * w          decay, apart from the gradient
        w <- Adam step with g                    m, v and the bias corrections see only g

    Adam's ``weight_decay`` adds weight_decay * w to g, so the decay goes through m and v
    and gets divided by sqrt(v_hat): weights with large gradients are barely decayed. AdamW
    shrinks every weight by the same factor (1 - lr * weight_decay) instead, which is what
    "weight decay" meant for SGD, and regularises better (the default for Transformers).
    This is PyTorch's rule (``torch.optim.AdamW``), default weight_decay = 0.01.
    """

    def __init__(
        self,
        params: Params,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        fused: bool | None = None,
    ) -> None:
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, fused=fused)

    def _decays(self, group: Group) -> tuple[float, float]:
        # the multi-tensor update (Adam.update_group) folds the decay into its one launch: the
        # same w * (1 - lr weight_decay), rounded to w's dtype, as update's mul_ below
        return 1 - group["lr"] * group["weight_decay"] if group["weight_decay"] else 1.0, 0.0

    def update(self, param: Tensor, grad: Array, state: dict[str, Any], group: Group) -> None:
        """One AdamW step for one parameter, in place: first the decoupled decay
        w <- w (1 - lr * weight_decay), then Adam's update (see ``Adam.update``) with the raw
        gradient, m and v never seeing the decay (Loshchilov and Hutter 2019)."""
        if group["weight_decay"]:
            param.mul_(1 - group["lr"] * group["weight_decay"])
        # Adam's rule, told there is no (coupled) weight decay: a copy of the group, so the
        # real one keeps its setting.
        super().update(param, grad, state, {**group, "weight_decay": 0.0})
