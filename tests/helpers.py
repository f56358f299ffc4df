"""Small helpers shared by the engine tests."""

import hashlib
import importlib.util
import os

import numpy as np

import minitensor as mt

# Which keys may be attended, in NumPy (D2L's valid_lens, masks, -inf scores): the conformance
# kit's reference, which the pooling tests check against too.
from minitensor.testing import _allowed as allowed_keys_np  # noqa: F401


def rand(device, *shape, low=-2.0, high=2.0, away=0.0, seed=0, requires_grad=True, dtype=mt.float64):
    """A float64 leaf on ``device``, values in [low, high); with ``away``, |value| >= away."""
    rng = np.random.default_rng([seed, *shape])
    a = rng.uniform(low, high, shape)
    if away:
        a = np.where(a < 0, -1.0, 1.0) * (away + np.abs(a))
    return mt.tensor(a, dtype=dtype, device=device, requires_grad=requires_grad)


def distinct(device, *shape, seed=0, requires_grad=True):
    """Values that are pairwise at least 0.1 apart (for max/min: no ties)."""
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))
    a = (rng.permutation(n) - n / 2) * 0.1 + 0.05
    return mt.tensor(a.reshape(shape), dtype=mt.float64, device=device, requires_grad=requires_grad)


def array_type(device):
    """The class of a tensor's ``data`` on ``device``."""
    from strict_backend import StrictArray

    if device == "cuda":
        import cupy

        return cupy.ndarray
    return {"cpu": np.ndarray, "strict": StrictArray}[device]


def check(fn, *inputs, **kwargs):
    """gradcheck ``fn`` at ``inputs`` (fails with gradcheck's message), and check that the
    output and the gradients live on the inputs' device (no host array slipped in)."""
    device = inputs[0].device
    out = fn(*inputs)
    assert isinstance(out.data, array_type(device)), f"output data is a {type(out.data).__name__} on {device!r}"
    assert mt.gradcheck(fn, list(inputs), **kwargs)
    for i, x in enumerate(inputs):
        if isinstance(x, mt.Tensor) and x.grad is not None:
            assert isinstance(x.grad.data, array_type(device)), f"grad of input {i} is a {type(x.grad.data).__name__}"
            assert x.grad.dtype == x.dtype and x.grad.shape == x.shape


def host(t):
    return t.numpy() if isinstance(t, mt.Tensor) else np.asarray(t)


# The Python operator behind each binary op's name (x + y, x / y, ...).
OPERATOR = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b,
    "pow": lambda a, b: a**b,
}


def special_rows(dtype):
    """Rows exercising every masking corner case of the softmax kernels, plus the lengths to use."""
    ninf = -np.inf
    x = np.array(
        [
            [ninf, ninf, ninf, ninf, ninf],  # all -inf: empty
            [ninf, 1.0, ninf, 2.0, ninf],  # -inf mixed with finite
            [3.0, ninf, ninf, ninf, ninf],  # a single finite entry
            [0.5, 0.5, 0.5, 0.5, 0.5],  # length 0: empty
            [1.0, 2.0, 3.0, 4.0, 5.0],  # length beyond n: clipped
            [ninf, ninf, 7.0, 8.0, 9.0],  # finite entries only masked
            [1.0, 2.0, 3.0, 4.0, 5.0],  # negative length: empty
        ],
        dtype=dtype,
    )
    lens = np.array([5, 5, 5, 0, 99, 2, -4], dtype=np.int64)
    return x, lens


def load_module(path, name):
    """The Python file at ``path`` run as a fresh module called ``name`` (a script, a benchmark's
    helpers, a tutorial's), without putting it on sys.path or in sys.modules, where it could
    stand in for another module of the same name."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def file_hashes(folder):
    """{path relative to ``folder``: SHA-256} of every file below ``folder``: equal before and
    after means that nothing on disk changed."""
    found = {}
    for root, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                found[os.path.relpath(path, folder)] = hashlib.sha256(f.read()).hexdigest()
    return found


def ints(values, device):
    """An int64 tensor on ``device`` (valid lengths)."""
    return mt.tensor(np.asarray(values, dtype=np.int64), device=device)
