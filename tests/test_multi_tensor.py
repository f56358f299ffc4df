"""The multi-tensor kernels (``kernels/cuda/multi_tensor.cu``) and the GPU paths that use them.

On a GPU a small model's step is bound by kernel launches: Adam's update of every parameter of a
group is one launch, and clipping's norm and rescaling three, instead of one or more per
parameter. Tested here without a GPU:

- the CUDA C++ kernels in the tests' CUDA emulator: Adam's multi-tensor update bit for bit the
  per-parameter kernel's (AdamW's decay included), the norm against NumPy, the scale bit for bit
  a product, over lists of any sizes (empty tensors, tensors across and larger than a chunk);
- how they are launched: one launch each (two for the norm), the tables of addresses kept;
- the optimiser and ``clip_grad_norm_`` on the CuPy backend's stand-in (``fake_cupy.py``, whose
  multi-tensor kernels are the CPU's per-parameter ones, one call one launch) against the CPU:
  the same training, bit for bit for Adam and AdamW, the same checkpointed state.
"""

import math
import os
import zlib

import cuda_emulator
import numpy as np
import pytest
from cuda_emulator import EmulatedModule, RecordingModule
from fake_cupy import fake_cuda_backend
from gpu import requires_gpu
from hypothesis import given, settings
from hypothesis import strategies as st
from minitensor.kernels.cuda import CudaKernels, PointerTables

import minitensor as mt
from minitensor import backends

if not cuda_emulator.available() and os.environ.get("CI") != "true":
    pytest.skip(f"the CUDA emulator needs a C++ compiler ({cuda_emulator.COMPILER})", allow_module_level=True)

DTYPES = [np.float32, np.float64]
CHUNK = 16  # small chunks, so that small lists cross chunk boundaries in every way


def emulated(threads=8, chunk=CHUNK, max_blocks=65535):
    return CudaKernels(np, load_module=EmulatedModule, elementwise_threads=threads, max_blocks=max_blocks, chunk=chunk)


@pytest.fixture(scope="module")
def kernels():
    return emulated()


def rng_for(*key):
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def adam_scalars(dtype, t=3, lr=1e-2, weight_decay=0.01):
    f = dtype
    return (
        f(lr / (1 - 0.9**t)),
        (f(0.9), f(1 - 0.9)),
        (f(0.999), f(1 - 0.999)),
        f(1e-8),
        f(weight_decay),
        f(math.sqrt(1 - 0.999**t)),
    )


def tensors(sizes, dtype, seed, positive=False):
    rng = rng_for(tuple(sizes), np.dtype(dtype).name, seed)
    shapes = [(n,) if n % 3 else (n // 3, 3) for n in sizes]  # 2-D ones too: the kernels see elements
    arrays = [rng.standard_normal(s).astype(dtype) for s in shapes]
    return [np.abs(a) for a in arrays] if positive else arrays


def adam_lists(sizes, dtype):
    return [tensors(sizes, dtype, i, positive=i == 3) for i in range(4)]  # w, g, m, v (v >= 0)


# sizes of the tensors of a list: empty ones, ones shorter than, across and longer than a chunk
SIZES = [
    [0],
    [5],
    [CHUNK],
    [0, 7, 0, 3 * CHUNK + 5, 1, CHUNK - 1, 0],
    [CHUNK + 1, CHUNK + 1, 2],
    [1] * 40,  # many tensors in one chunk
]


# ---------------------------------------------------------------------------
# The kernels in the emulator
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("sizes", SIZES, ids=str)
@pytest.mark.parametrize("decay", [1.0, 1 - 1e-2 * 0.1])
def test_adam_update_multi_is_the_per_parameter_kernel_bit_for_bit(kernels, dtype, sizes, decay):
    """One launch for the list = adam_update for each (after w *= decay, AdamW's decay), bit for bit."""
    multi = adam_lists(sizes, dtype)
    single = [[a.copy() for a in arrays] for arrays in multi]
    scalars = adam_scalars(dtype)
    kernels.adam_update_multi(*multi, *scalars, dtype(decay))
    for w, g, m, v in zip(*single):
        w *= dtype(decay)
        kernels.adam_update(w, g, m, v, *scalars)
    for name, got, want in zip("wgmv", multi, single):
        for i, (a, b) in enumerate(zip(got, want)):
            np.testing.assert_array_equal(a, b, err_msg=f"{name}[{i}]")


def textbook_adam(w, g, m, v, lr, t, weight_decay, decay, beta1=0.9, beta2=0.999, eps=1e-8):
    """optim/adam.py's textbook lines in float64."""
    w, g, m, v = (a.astype(np.float64) for a in (w, g, m, v))
    w = w * decay
    g = g + weight_decay * w
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    w = w - lr / (1 - beta1**t) * m / (np.sqrt(v) / math.sqrt(1 - beta2**t) + eps)
    return w, m, v


@settings(max_examples=25, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 3 * CHUNK + 3), min_size=1, max_size=6),
    dtype=st.sampled_from(DTYPES),
    threads=st.sampled_from([1, 5, 8, 32]),
    chunk=st.sampled_from([1, 7, CHUNK, 64]),
    max_blocks=st.sampled_from([1, 2, 65535]),
    decay=st.sampled_from([1.0, 0.999]),
)
def test_hypothesis_lists_against_numpy(sizes, dtype, threads, chunk, max_blocks, decay):
    """Any list, chunk, block and grid size: Adam's update as the textbook's, the norm as NumPy's,
    the scale a product (grids smaller than the chunks stride over them)."""
    kernels = emulated(threads=threads, chunk=chunk, max_blocks=max_blocks)
    w, g, m, v = adam_lists(sizes, dtype)
    want = [textbook_adam(*arrays, 1e-2, 3, 0.01, decay) for arrays in zip(w, g, m, v)]
    kernels.adam_update_multi(w, g, m, v, *adam_scalars(dtype), dtype(decay))
    tol = dict(rtol=2e-5, atol=1e-6) if dtype == np.float32 else dict(rtol=1e-12, atol=1e-14)
    for i, (wi, mi, vi) in enumerate(want):
        for got, expected in ((w[i], wi), (m[i], mi), (v[i], vi)):
            np.testing.assert_allclose(got, expected, **tol)
    norm, factor = kernels.l2_norm_multi(g, max_norm=1.0)
    expected = math.sqrt(sum(float((a.astype(np.float64) ** 2).sum()) for a in g))
    assert norm.dtype == factor.dtype == dtype and norm.shape == factor.shape == ()
    np.testing.assert_allclose(norm, expected, rtol=1e-6 if dtype == np.float32 else 1e-13)
    assert factor == dtype(min(1.0, 1.0 / (float(norm) + 1e-6)))  # clip_grad_norm_'s factor, from the norm
    scaled = [a * factor for a in g]
    kernels.scale_multi(g, factor)
    for got, want_scaled in zip(g, scaled):
        np.testing.assert_array_equal(got, want_scaled)


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_norm_is_the_same_bits_at_every_run_and_factor_one_below_max_norm(kernels, dtype):
    g = tensors([100, 3, 0, 41], dtype, 0)
    first = kernels.l2_norm_multi(g, max_norm=1e6)
    again = kernels.l2_norm_multi(g, max_norm=1e6)
    assert first[0].tobytes() == again[0].tobytes() and first[1] == again[1] == 1  # no clipping needed
    assert kernels.l2_norm_multi([np.zeros(0, dtype)])[0] == 0  # nothing: a norm of 0


@pytest.mark.parametrize("bad", [np.inf, np.nan])
def test_a_non_finite_norm_gives_a_factor_of_one(kernels, bad):
    g = tensors([20, 5], np.float32, 1)
    g[1][2] = bad
    norm, factor = kernels.l2_norm_multi(g, max_norm=0.5)
    assert not np.isfinite(norm) and factor == 1  # clip_grad_norm_ leaves the gradients as they are


# ---------------------------------------------------------------------------
# Launches, tables of addresses, bad input
# ---------------------------------------------------------------------------


def test_one_launch_for_a_list_and_a_table_kept_for_the_same_addresses(recorded):
    kernels = CudaKernels(np, load_module=RecordingModule, chunk=CHUNK, max_blocks=4)
    w, g, m, v = adam_lists([10, 0, 40], np.float32)
    scalars = adam_scalars(np.float32)
    kernels.adam_update_multi(w, g, m, v, *scalars)
    kernels.adam_update_multi(w, g, m, v, *scalars)
    kernels.l2_norm_multi(g)
    kernels.scale_multi(g, np.ones((), np.float32))
    names = [name for name, *_ in recorded]
    assert names[:3] == ["adam_update_multi_float32"] * 2 + ["sum_of_squares_partial_float32"]
    assert names[3:] == ["sum_of_squares_finish_float32", "scale_multi_float32"]
    (_, grid, block, args), again = recorded[0], recorded[1]
    assert grid == (4,) and block == (256,)  # 50 elements in 4 chunks of 16, up to max_blocks
    addresses, offsets = args[:2]
    assert addresses.dtype == np.uint64 and addresses.size == 12 and list(offsets) == [0, 10, 10, 50]
    assert addresses[0] == w[0].ctypes.data and addresses[3 + 2] == g[2].ctypes.data
    assert [type(a) for a in args[2:]] == [np.int64, np.int64] + [np.float32] * 9
    assert again[3][0] is addresses  # the same addresses: the kept table, nothing uploaded
    assert recorded[3][3][1] == 4  # the finish adds up the first launch's 4 partial sums


def test_empty_lists_launch_nothing_but_the_norms_finish(recorded):
    kernels = CudaKernels(np, load_module=RecordingModule)
    empty = [np.zeros(0, np.float32)]
    kernels.adam_update_multi([], [], [], [], *adam_scalars(np.float32))
    kernels.adam_update_multi(empty, empty, empty, empty, *adam_scalars(np.float32))
    kernels.scale_multi(empty, np.ones((), np.float32))
    kernels.l2_norm_multi(empty)
    assert [name for name, *_ in recorded] == ["sum_of_squares_finish_float32"]


def test_bad_lists_are_refused_before_launching(recorded):
    kernels = CudaKernels(np, load_module=RecordingModule)
    w, g, m, v = adam_lists([4, 6], np.float32)
    scalars = adam_scalars(np.float32)
    with pytest.raises(ValueError, match="lists of one length, got 2, 1, 2, 2"):
        kernels.adam_update_multi(w, g[:1], m, v, *scalars)
    with pytest.raises(TypeError, match="of one dtype, float32 or float64, got float32, float64.*group the arrays"):
        kernels.adam_update_multi([w[0], w[1].astype(np.float64)], g, m, v, *scalars)
    with pytest.raises(TypeError, match="got int64"):
        kernels.l2_norm_multi([np.arange(3)])
    with pytest.raises(ValueError, match="C-contiguous"):
        kernels.adam_update_multi([w[0], np.zeros((3, 2), np.float32).T], g, m, v, *scalars)
    with pytest.raises(ValueError, match="each gradient must have its parameter's size"):
        kernels.adam_update_multi(w, [g[1], g[0]], m, v, *scalars)
    with pytest.raises(ValueError, match="exp_avgs must have its parameter's dtype and size"):
        kernels.adam_update_multi(w, g, [m[1], m[0]], v, *scalars)
    with pytest.raises(ValueError, match="scaled in place"):
        kernels.scale_multi([np.zeros((3, 2), np.float32).T], np.ones((), np.float32))
    with pytest.raises(ValueError, match="factor must be a one-element float32 array"):
        kernels.scale_multi(g, np.ones(2, np.float32))
    with pytest.raises(ValueError, match="at least one array"):
        kernels.l2_norm_multi([])
    with pytest.raises(ValueError, match="chunk must be at least 1"):
        CudaKernels(np, chunk=0)
    assert recorded == []


def test_the_tables_keep_the_most_recently_used():
    uploads = []

    class Counting:
        @staticmethod
        def asarray(a):
            uploads.append(a)
            return a

    tables = PointerTables(Counting, size=2)
    a, b, c = (np.zeros(n, np.float32) for n in (1, 2, 3))
    first = tables.table([a, b])
    assert tables.table([a, b]) is first and len(uploads) == 1
    tables.table([c])
    tables.table([a, b])  # used again: kept over [c] ...
    tables.table([b])  # ... which goes when a third list comes
    assert len(uploads) == 3
    assert tables.table([a, b]) is first and len(uploads) == 3
    assert tables.table([c]) is not None and len(uploads) == 4
    addresses, offsets = first
    assert list(addresses) == [a.ctypes.data, b.ctypes.data] and list(offsets) == [0, 1, 3]


# ---------------------------------------------------------------------------
# The optimiser and clipping on the CuPy backend's stand-in, against the CPU
# ---------------------------------------------------------------------------


@pytest.fixture
def cuda(monkeypatch):
    backend = fake_cuda_backend()
    monkeypatch.setitem(backends._BACKENDS, "cuda", backend)
    return backend


class Counted:
    """Counts calls of a kernels object's methods (one call, one launch)."""

    def __init__(self, kernels, monkeypatch, names):
        self.calls = {name: 0 for name in names}
        for name in names:
            real = getattr(kernels, name)

            def counted(*args, _real=real, _name=name, **kwargs):
                self.calls[_name] += 1
                return _real(*args, **kwargs)

            monkeypatch.setattr(kernels, name, counted)


def model_and_data(device, dtype="float32"):
    mt.manual_seed(0)
    model = mt.nn.Sequential(
        mt.nn.Linear(5, 8), mt.nn.ReLU(), mt.nn.Linear(8, 8), mt.nn.LayerNorm(8), mt.nn.Linear(8, 3)
    )
    model = model.to(dtype=dtype) if dtype != "float32" else model
    rng = np.random.default_rng(1)
    X, y = rng.standard_normal((16, 5)).astype(dtype), rng.integers(0, 3, 16)
    return model.to(device), mt.tensor(X, device=device), mt.tensor(y, device=device)


def groups(model, optimizer_class, **settings):
    """Two groups, decay on the matrices only (nanoGPT's), and the first layer's bias frozen: a
    parameter without a gradient."""
    params = dict(model.named_parameters())
    params["0.bias"].requires_grad = False
    matrices = [p for name, p in params.items() if p.ndim == 2]
    others = [p for name, p in params.items() if p.ndim < 2 and p.requires_grad]
    return optimizer_class(
        [{"params": matrices, "weight_decay": 0.1}, {"params": others, "weight_decay": 0.0}], lr=1e-2, **settings
    )


def train(device, optimizer_class, steps=4, clip=None, dtype="float32", state=None):
    model, X, y = model_and_data(device, dtype)
    optimizer = groups(model, optimizer_class)
    if state is not None:
        optimizer.load_state_dict(state)
    norms = []
    for _ in range(steps):
        optimizer.zero_grad()
        mt.cross_entropy(model(X), y).backward()
        if clip is not None:
            norms.append(mt.nn.utils.clip_grad_norm_(model.parameters(), clip).item())
        optimizer.step()
    return [p.numpy() for p in model.parameters()], optimizer, norms


@pytest.mark.parametrize("optimizer_class", [mt.optim.Adam, mt.optim.AdamW])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_adam_on_the_gpu_path_trains_as_on_the_cpu_bit_for_bit(cuda, monkeypatch, optimizer_class, dtype):
    """One multi-tensor launch per group and step (two groups), no per-parameter kernel and no
    decay of its own, and every weight the same bits as the CPU's per-parameter kernels give."""
    calls = Counted(cuda.kernels, monkeypatch, ["adam_update", "adam_update_multi"]).calls
    on_cpu, cpu_optimizer, _ = train("cpu", optimizer_class, dtype=dtype)
    on_gpu, gpu_optimizer, _ = train("cuda", optimizer_class, dtype=dtype)
    assert calls == {"adam_update": 0, "adam_update_multi": 4 * 2}
    for a, b in zip(on_cpu, on_gpu):
        np.testing.assert_array_equal(a, b)
    # the same checkpointed state, in the same format
    cpu_state, gpu_state = cpu_optimizer.state_dict(), gpu_optimizer.state_dict()
    assert cpu_state["param_groups"] == gpu_state["param_groups"]
    assert cpu_state["state"].keys() == gpu_state["state"].keys()
    for key, saved in cpu_state["state"].items():
        assert saved.keys() == gpu_state["state"][key].keys() == {"step", "exp_avg", "exp_avg_sq"}
        assert saved["step"] == gpu_state["state"][key]["step"] == 4
        for name in ("exp_avg", "exp_avg_sq"):
            assert isinstance(gpu_state["state"][key][name], np.ndarray)
            np.testing.assert_array_equal(saved[name], gpu_state["state"][key][name])


@pytest.mark.parametrize("optimizer_class", [mt.optim.Adam, mt.optim.AdamW])
def test_a_checkpointed_state_resumes_on_either_path(cuda, optimizer_class):
    """4 steps in one go = 2 steps, state_dict, a new optimiser loads it, 2 more (both devices)."""
    whole, _, _ = train("cuda", optimizer_class, steps=4)
    model, X, y = model_and_data("cuda")
    optimizer = groups(model, optimizer_class)
    for _ in range(2):
        optimizer.zero_grad()
        mt.cross_entropy(model(X), y).backward()
        optimizer.step()
    saved = optimizer.state_dict()
    for device in ("cuda", "cpu"):
        resumed = groups(model_copy := model_and_data(device)[0], optimizer_class)
        for p, q in zip(model_copy.parameters(), model.parameters()):
            p.data[...] = p._backend.array(q.numpy())
        resumed.load_state_dict(saved)
        X_d, y_d = (mt.tensor(t.numpy(), device=device) for t in (X, y))
        for _ in range(2):
            resumed.zero_grad()
            mt.cross_entropy(model_copy(X_d), y_d).backward()
            resumed.step()
        for a, b in zip(whole, model_copy.parameters()):
            np.testing.assert_array_equal(a, b.numpy())


def test_params_at_different_steps_and_fused_false(cuda, monkeypatch):
    """A parameter that missed steps has its own t: its own launch. fused=False: the textbook
    lines, no kernel at all."""
    calls = Counted(cuda.kernels, monkeypatch, ["adam_update", "adam_update_multi"]).calls
    a, b = mt.ones(3, device="cuda", requires_grad=True), mt.ones(4, device="cuda", requires_grad=True)
    optimizer = mt.optim.Adam([a, b], lr=0.1)
    a.grad = mt.ones(3, device="cuda")
    optimizer.step()
    b.grad = mt.ones(4, device="cuda")
    optimizer.step()
    assert calls["adam_update_multi"] == 3 and optimizer.state[a]["step"] == 2 and optimizer.state[b]["step"] == 1
    # the same numbers as the CPU's
    a_cpu, b_cpu = mt.ones(3, requires_grad=True), mt.ones(4, requires_grad=True)
    cpu = mt.optim.Adam([a_cpu, b_cpu], lr=0.1)
    a_cpu.grad = mt.ones(3)
    cpu.step()
    b_cpu.grad = mt.ones(4)
    cpu.step()
    np.testing.assert_array_equal(a.numpy(), a_cpu.numpy())
    np.testing.assert_array_equal(b.numpy(), b_cpu.numpy())
    textbook = mt.optim.AdamW([a, b], lr=0.1, fused=False)
    textbook.step()
    assert calls["adam_update_multi"] == 3 and calls["adam_update"] == 0


def test_a_subclass_with_its_own_update_keeps_it(cuda, monkeypatch):
    calls = Counted(cuda.kernels, monkeypatch, ["adam_update", "adam_update_multi"]).calls

    class Halved(mt.optim.AdamW):
        def update(self, param, grad, state, group):
            super().update(param, grad / 2, state, group)

    w = mt.ones(3, device="cuda", requires_grad=True)
    w.grad = mt.ones(3, device="cuda")
    Halved([w], lr=0.1).step()
    assert calls == {"adam_update": 1, "adam_update_multi": 0}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("max_norm", [1e-3, 1e3])
def test_clipping_on_the_gpu_path_is_the_cpus(cuda, monkeypatch, dtype, max_norm):
    """clip_grad_norm_ and grad_norm: three launches (two for grad_norm) whatever the number of
    gradients, and the CPU's norm and clipped gradients (to rounding: the sums are made in
    another order)."""
    calls = Counted(cuda.kernels, monkeypatch, ["l2_norm_multi", "scale_multi"]).calls
    results = {}
    for device in ("cpu", "cuda"):
        model, X, y = model_and_data(device, dtype)
        mt.cross_entropy(model(X), y).backward()
        before = mt.nn.utils.grad_norm(model.parameters()).item()
        norm = mt.nn.utils.clip_grad_norm_(model.parameters(), max_norm).item()
        after = mt.nn.utils.grad_norm(model.parameters()).item()
        results[device] = (before, norm, after, [p.grad.numpy() for p in model.parameters()])
    assert calls == {"l2_norm_multi": 3, "scale_multi": 1}
    rtol = 1e-6 if dtype == "float32" else 1e-13
    (cpu_before, cpu_norm, cpu_after, cpu_grads), (before, norm, after, grads) = results["cpu"], results["cuda"]
    np.testing.assert_allclose([before, norm, after], [cpu_before, cpu_norm, cpu_after], rtol=rtol)
    assert before == norm and after <= max(max_norm, norm) * (1 + rtol)
    for a, b in zip(cpu_grads, grads):
        np.testing.assert_allclose(b, a, rtol=rtol, atol=1e-30)


def test_clipping_falls_back_gradient_by_gradient(cuda, monkeypatch):
    """Other norms, and gradients of mixed dtypes, go the per-gradient way (the multi-tensor
    kernels take one dtype and the 2-norm); the results are the CPU's."""
    calls = Counted(cuda.kernels, monkeypatch, ["l2_norm_multi", "scale_multi"]).calls
    for device in ("cpu", "cuda"):
        a = mt.tensor([3.0, 4.0], device=device, requires_grad=True)
        b = mt.tensor([1.0, 2.0], dtype="float64", device=device, requires_grad=True)
        a.grad, b.grad = mt.tensor([3.0, 4.0], device=device), mt.tensor([0.0, 12.0], dtype="float64", device=device)
        assert mt.nn.utils.clip_grad_norm_([a, b], 1.0).item() == pytest.approx(13.0)
        assert mt.nn.utils.grad_norm([a], norm_type=float("inf")).item() == pytest.approx(4 / 13.0 * 1.0, rel=1e-5)
        np.testing.assert_allclose(b.grad.numpy(), [0.0, 12 / 13.0], rtol=1e-6)
    assert calls == {"l2_norm_multi": 0, "scale_multi": 0}


def test_the_cpu_has_no_multi_tensor_kernels():
    cpu = mt.get_backend("cpu")
    assert cpu.fused("adam_update_multi", np.float32) is None and cpu.fused("l2_norm_multi", np.float64) is None
    assert cpu.fused("adam_update", np.float32) is not None


# ---------------------------------------------------------------------------
# On a real GPU
# ---------------------------------------------------------------------------


@requires_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_on_cupy_arrays_bit_for_bit_the_per_parameter_kernel(dtype):
    import cupy

    kernels = CudaKernels(cupy)
    sizes = [0, 1, 1000, 16384, 16385, 3 * 16384 + 7, 5]
    multi = [[cupy.asarray(a) for a in arrays] for arrays in adam_lists(sizes, dtype)]
    single = [[a.copy() for a in arrays] for arrays in multi]
    scalars, decay = adam_scalars(dtype), dtype(0.999)
    kernels.adam_update_multi(*multi, *scalars, decay)
    for w, g, m, v in zip(*single):
        w *= decay
        kernels.adam_update(w, g, m, v, *scalars)
    for got, want in zip(multi, single):
        for a, b in zip(got, want):
            assert cupy.array_equal(a, b)
    norm, factor = kernels.l2_norm_multi(multi[1], 1.0)
    expected = math.sqrt(sum(float((cupy.asnumpy(a).astype(np.float64) ** 2).sum()) for a in multi[1]))
    np.testing.assert_allclose(float(norm), expected, rtol=1e-6)
    scaled = [a * factor for a in multi[1]]
    kernels.scale_multi(multi[1], factor)
    assert all(cupy.array_equal(a, b) for a, b in zip(multi[1], scaled))
