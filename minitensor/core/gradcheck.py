"""``gradcheck``: is an op's backward right? Compare it with finite differences.

For a scalar function L(x), the central difference

    dL/dx_i ~ (L(x + eps e_i) - L(x - eps e_i)) / (2 eps)

has error O(eps^2). A function with a tensor output is reduced to a scalar first with fixed
random weights, L = sum(fn(x) * v): if backward is right for every v it is right, and one
random v catches a wrong formula with probability 1. Float64 is required: in float32 the
rounding error of L, ~1e-7 |L| / eps, swamps the difference.
"""

from collections.abc import Callable, Sequence

import numpy

from .errors import GradcheckError
from .grad_mode import no_grad
from .tensor import Tensor


def gradcheck(
    fn: Callable[..., Tensor],
    inputs: Sequence[Tensor],
    eps: float = 1e-6,
    atol: float = 1e-5,
    rtol: float = 1e-3,
    seed: int = 0,
) -> bool:
    """Check the gradients of ``fn(*inputs)`` w.r.t. every input that requires grad.

    ``fn``: a function of the tensors in ``inputs`` returning a Tensor (any shape).
    ``inputs``: a Tensor or a sequence of Tensors (and other arguments, passed through).
    Passes when |analytic - numeric| <= atol + rtol * |numeric| for every element.
    Returns True, or raises ``GradcheckError`` naming the input and the worst element.

    Example::

        x = mt.randn(3, 4, dtype=mt.float64, requires_grad=True)
        mt.gradcheck(lambda x: (x * x).tanh(), [x])
    """
    inputs = [inputs] if isinstance(inputs, Tensor) else list(inputs)
    checked = [i for i, x in enumerate(inputs) if isinstance(x, Tensor) and x.requires_grad]
    if not checked:
        raise ValueError("gradcheck: no input requires grad; create them with requires_grad=True")
    for i in checked:
        if inputs[i].dtype != numpy.float64:
            raise TypeError(
                f"gradcheck: input {i} is {inputs[i].dtype}; finite differences need float64 "
                "(create it with dtype=mt.float64 or call .double())"
            )

    out = fn(*inputs)
    if not isinstance(out, Tensor):
        raise TypeError(f"gradcheck: fn must return a Tensor, got {type(out).__name__}")
    weights = numpy.random.default_rng(seed).standard_normal(out.shape)
    v = Tensor._make(out._backend.array(weights.astype(out.dtype)), out._backend, None)

    def scalar(*args: Tensor) -> float:
        return float((fn(*args) * v).sum().item())

    for i in checked:
        inputs[i].grad = None
    (out * v).sum().backward()

    for i in checked:
        x = inputs[i]
        analytic = numpy.zeros(x.shape) if x.grad is None else x.grad.numpy()
        numeric = numpy.zeros(x.shape)
        host = x.numpy()
        original = x.data
        flat = host.reshape(-1)
        with no_grad():
            for j in range(flat.size):
                old = flat[j]
                flat[j] = old + eps
                x.data = x._backend.array(host)
                plus = scalar(*inputs)
                flat[j] = old - eps
                x.data = x._backend.array(host)
                minus = scalar(*inputs)
                flat[j] = old
                numeric.reshape(-1)[j] = (plus - minus) / (2 * eps)
        x.data = original
        err = numpy.abs(analytic - numeric) - (atol + rtol * numpy.abs(numeric))
        if err.size and (err.max() > 0 or not numpy.isfinite(analytic).all()):
            worst = numpy.unravel_index(numpy.nanargmax(numpy.where(numpy.isfinite(err), err, numpy.inf)), x.shape)
            raise GradcheckError(
                f"gradcheck: input {i} (shape {x.shape}): the gradient at index {tuple(int(k) for k in worst)} is "
                f"{analytic[worst]:.6g} by backward but {numeric[worst]:.6g} by finite differences "
                f"(|difference| {abs(analytic[worst] - numeric[worst]):.3g} > atol {atol} + rtol {rtol} * |numeric|)"
            )
    return True
