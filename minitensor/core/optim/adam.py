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

    state_keys = frozenset({"step", "exp_avg", "exp_avg_sq"})  # t, m, v: all three from the first step

    def __init__(
        self,
        params: Params,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        fused: bool | None = None,
    ) -> None:
        # a list of two becomes a tuple (as state_dict's JSON form does); anything else goes to the check
        betas = tuple(betas) if isinstance(betas, list) else betas
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        if fused not in (None, True, False):
            raise ValueError(f"{type(self).__name__}: fused must be None, True or False, got {fused!r}")
        # As PyTorch's ``fused=``: the whole update of a parameter in one kernel (a numba loop
        # on the CPU, kernels/fused.py; CUDA C++ on a GPU, kernels/cuda/elementwise.cu, and there
        # one kernel for all the parameters of a group, multi_tensor.cu). None:
        # wherever there is one; False: the textbook lines below everywhere (they are what the
        # kernel is tested against).
        self.fused = fused

    def check_hyperparameters(self, group: Group) -> None:
        """The base checks (lr, weight_decay >= 0), plus ``betas``: two numbers in [0, 1), and
        eps >= 0. Raises ``TypeError`` for a setting that is not a number (or betas not a pair),
        ``ValueError`` for one out of range."""
        super().check_hyperparameters(group)
        betas = group["betas"]
        if not (isinstance(betas, tuple) and len(betas) == 2):
            raise TypeError(f"Adam: betas must be a pair of numbers in [0, 1), got {betas!r}")
        if not all(0.0 <= self.check_number("betas", b) < 1.0 for b in betas):
            raise ValueError(f"Adam: betas must be two numbers in [0, 1), got {betas}")
        if self.check_number("eps", group["eps"]) < 0:
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
        self._start(param, state)
        state["step"] += 1
        t, m, v = state["step"], state["exp_avg"], state["exp_avg_sq"]
        kernel = self._kernel(param)
        if kernel is not None and all(a.flags.c_contiguous for a in (param.data, m, v)):
            # The same rule in one pass over memory; the scalars in the parameter's dtype.
            kernel(param.data, param._backend.xp.ascontiguousarray(grad), m, v, *self._scalars(param.dtype, group, t))
            return
        if group["weight_decay"]:
            grad = grad + group["weight_decay"] * param.data
        m *= beta1
        m += (1 - beta1) * grad
        v *= beta2
        v += (1 - beta2) * (grad * grad)
        denom = param._backend.xp.sqrt(v) / math.sqrt(1 - beta2**t) + group["eps"]
        param.add_(m / denom, alpha=-group["lr"] / (1 - beta1**t))

    def update_group(self, group: Group) -> None:
        """Update the group's parameters, on a GPU in one launch: where the backend has the
        multi-tensor kernel (``backend.fused("adam_update_multi", dtype)``, multi_tensor.cu), the
        parameters that share a device, a dtype and a step count t (all of them, in a plain run)
        are updated by one kernel instead of one kernel each. The rule and the bits are
        :meth:`update`'s, AdamW's decay included. On a GPU a small model's step is bound by
        launches (each costs the host more time than its kernel runs; bench/launches.py counts
        them): 51 parameters were 51 launches, and up to as many again for AdamW's decay, now
        one. The CPU has no such kernel and needs none (a call costs nothing there): every
        parameter goes through :meth:`update`, as does every parameter with ``fused=False`` and
        any whose arrays are not C-contiguous.
        """
        batches: dict[tuple[Any, ...], list[tuple[Tensor, Array, dict[str, Any]]]] = {}
        multi = self.fused is not False and self._rule_in_kernel()
        for p in group["params"]:
            if p.grad is None:
                continue
            state = self.state.setdefault(p, {})
            kernel = p._backend.fused("adam_update_multi", p.data.dtype) if multi else None
            if kernel is not None:
                self._start(p, state)
                if all(a.flags.c_contiguous for a in (p.data, state["exp_avg"], state["exp_avg_sq"])):
                    key = (kernel, p.data.dtype, state["step"] + 1)
                    batches.setdefault(key, []).append((p, p.grad.data, state))
                    continue
            self.update(p, p.grad.data, state, group)
        decay, weight_decay = self._decays(group)
        for (kernel, dtype, t), batch in batches.items():
            for _, _, state in batch:
                state["step"] = t
            kernel(
                [p.data for p, _, _ in batch],
                [grad for _, grad, _ in batch],
                [state["exp_avg"] for _, _, state in batch],
                [state["exp_avg_sq"] for _, _, state in batch],
                *self._scalars(dtype, {**group, "weight_decay": weight_decay}, t),
                dtype.type(decay),
            )

    def _rule_in_kernel(self) -> bool:
        """Does the multi-tensor kernel compute this optimiser's rule? Yes when the class that
        defines ``update`` also says how its rule goes into the kernel (``_decays``): Adam and
        AdamW. A subclass with an ``update`` of its own keeps it, parameter by parameter."""
        owner = next(cls for cls in type(self).__mro__ if "update" in vars(cls))
        return "_decays" in vars(owner)

    def _decays(self, group: Group) -> tuple[float, float]:
        """(decay, weight_decay): the factor applied to w before the update (AdamW's decoupled
        decay; 1 here) and the L2 penalty added to the gradient (Adam's weight_decay)."""
        return 1.0, group["weight_decay"]

    @staticmethod
    def _start(param: Tensor, state: dict[str, Any]) -> None:
        """A parameter's first state: step 0, both moments zero."""
        if not state:
            xp = param._backend.xp
            state["step"] = 0
            state["exp_avg"] = xp.zeros_like(param.data)  # m
            state["exp_avg_sq"] = xp.zeros_like(param.data)  # v

    @staticmethod
    def _scalars(dtype: Any, group: Group, t: int) -> tuple[Any, ...]:
        """The fused kernels' scalars at step t, in the parameters' dtype: step_size = lr / (1 - beta1^t),
        the betas as (beta, 1 - beta) pairs computed in float64 (as the textbook lines are), eps,
        weight_decay, bias_sqrt2 = sqrt(1 - beta2^t)."""
        f = dtype.type
        beta1, beta2 = group["betas"]
        return (
            f(group["lr"] / (1 - beta1**t)),
            (f(beta1), f(1 - beta1)),
            (f(beta2), f(1 - beta2)),
            f(group["eps"]),
            f(group["weight_decay"]),
            f(math.sqrt(1 - beta2**t)),
        )

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
