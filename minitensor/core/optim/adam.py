"""Adam (Kingma and Ba, 2015): momentum plus a per-coordinate step size."""

from __future__ import annotations

import math
from typing import Any

from ..tensor import Array, Tensor
from .optimizer import Group, Optimizer, Params


class Adam(Optimizer):
    """At step t, with gradient g (plus weight_decay * w, an L2 penalty, if set):

        m <- beta1 m + (1 - beta1) g           running mean of the gradient
        v <- beta2 v + (1 - beta2) g^2         running mean of its square
        m_hat = m / (1 - beta1^t),  v_hat = v / (1 - beta2^t)
        w <- w - lr * m_hat / (sqrt(v_hat) + eps)

    m and v start at zero, so early averages are too small; dividing by 1 - beta^t removes
    that bias. Dividing by sqrt(v_hat) gives each coordinate a step of about lr whatever the
    scale of its gradient. (As in PyTorch, eps is added to sqrt(v) / sqrt(1 - beta2^t).)
    """

    def __init__(
        self,
        params: Params,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        fused: bool | None = None,
    ) -> None:
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay))
        if fused not in (None, True, False):
            raise ValueError(f"{type(self).__name__}: fused must be None, True or False, got {fused!r}")
        # As PyTorch's ``fused=``: the whole update of a parameter in one kernel (a numba loop
        # on the CPU, kernels/fused.py; CUDA C++ on a GPU, kernels/cuda/elementwise.cu). None:
        # wherever there is one; False: the textbook lines below everywhere (they are what the
        # kernel is tested against).
        self.fused = fused

    def check_hyperparameters(self, group: Group) -> None:
        """The base checks (lr, weight_decay >= 0), plus ``betas``: two numbers in [0, 1), and
        eps >= 0. Raises ``ValueError``."""
        super().check_hyperparameters(group)
        if len(group["betas"]) != 2 or not all(0.0 <= b < 1.0 for b in group["betas"]):
            raise ValueError(f"Adam: betas must be two numbers in [0, 1), got {group['betas']}")
        if group["eps"] < 0:
            raise ValueError(f"Adam: eps must be >= 0, got {group['eps']}")

    def update(self, param: Tensor, grad: Array, state: dict[str, Any], group: Group) -> None:
        """One Adam step for one parameter, in place (D2L 11.10 / 12.10; Kingma and Ba 2015), t the
        parameter's step count and g its gradient (+ weight_decay * w if set):

            m <- beta1 m + (1 - beta1) g,    v <- beta2 v + (1 - beta2) g^2
            w <- w - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)

        The state holds ``step``, ``exp_avg`` (m) and ``exp_avg_sq`` (v). On the CPU and the GPU
        the same rule runs as one fused kernel unless the optimiser was built with ``fused=False``.
        """
        beta1, beta2 = group["betas"]
        if not state:
            xp = param._backend.xp
            state["step"] = 0
            state["exp_avg"] = xp.zeros_like(param.data)  # m
            state["exp_avg_sq"] = xp.zeros_like(param.data)  # v
        state["step"] += 1
        t, m, v = state["step"], state["exp_avg"], state["exp_avg_sq"]
        kernel = self._kernel(param)
        if kernel is not None and all(a.flags.c_contiguous for a in (param.data, m, v)):
            # The same rule in one pass over memory; the scalars in the parameter's dtype.
            f = param.data.dtype.type
            kernel(
                param.data,
                param._backend.xp.ascontiguousarray(grad),
                m,
                v,
                f(group["lr"] / (1 - beta1**t)),
                (f(beta1), f(1 - beta1)),
                (f(beta2), f(1 - beta2)),
                f(group["eps"]),
                f(group["weight_decay"]),
                f(math.sqrt(1 - beta2**t)),
            )
            return
        if group["weight_decay"]:
            grad = grad + group["weight_decay"] * param.data
        m *= beta1
        m += (1 - beta1) * grad
        v *= beta2
        v += (1 - beta2) * (grad * grad)
        denom = param._backend.xp.sqrt(v) / math.sqrt(1 - beta2**t) + group["eps"]
        param.add_(m / denom, alpha=-group["lr"] / (1 - beta1**t))

    def _kernel(self, param: Tensor) -> Any:
        """The fused update for ``param``, or None for the textbook lines."""
        if self.fused is False:
            return None
        kernel = param._backend.fused("adam_update", param.data.dtype)
        if kernel is None and self.fused:
            raise ValueError(
                f"{type(self).__name__}(fused=True): no fused update on {param.device!r} (the CPU and "
                "the GPU have one); use fused=None to fall back to the textbook update there"
            )
        return kernel
