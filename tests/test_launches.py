"""A training step launches no more GPU kernels than it did when last measured.

On a GPU a small model's step is bound by the host: every CuPy operator is one kernel launch
costing 5-20 microseconds of Python and driver time, whatever the size of its arrays. So the
number of launches per step is a cost, and one that can be counted without a GPU: the CuPy
stand-in (``fake_cupy.py``) records every operation CuPy would launch
(``strict_backend.count_launches``). First, that the counter counts what it should (views
are free, an operator is one launch, a kernel is one); then the budgets, per training step of
the models of ``test_sync_free.py``: a change that adds launches to a step fails here, and one
that removes some lowers the budget.
"""

import numpy as np
import pytest
from cuda_emulator import RecordingModule
from fake_cupy import attention_kernels_that_record, fake_cuda_backend
from minitensor.kernels.cuda import CudaKernels
from strict_backend import StrictArray, StrictKernels, count_launches, count_syncs
from test_sync_free import SIZES, quiet, tiny  # the same small runs as the waits are counted on

import minitensor as mt
from minitensor import backends
from minitensor.train import loop
from minitensor.train.config import PRESETS
from minitensor.train.loop import READ_EVERY
from minitensor.train.run import RunFolder

pytest.importorskip("safetensors")


@pytest.fixture
def cuda(monkeypatch):
    """ "cuda" served by the CuPy backend on the stand-in, whose launches count_launches() sees;
    the float32 matmul precision put back after (a run of the GPU preset sets "high" for the
    whole process). cuBLAS's bfloat16 products (autocast's) run in NumPy, a launch each."""
    from fake_cupy import launch_in_numpy
    from minitensor.backends import cublas_gemm

    monkeypatch.setitem(backends._BACKENDS, "cuda", fake_cuda_backend())
    monkeypatch.setattr(cublas_gemm, "launch", launch_in_numpy)
    yield "cuda"
    mt.set_float32_matmul_precision("highest")


def launches(fn):
    with count_launches() as log:
        fn()
    return [e.what for e in log.events]


# -- the counter -----------------------------------------------------------------------------------
@pytest.fixture
def xp(cuda):
    return mt.get_backend(cuda).xp


@pytest.fixture
def a(xp):
    return xp.asarray(np.arange(12.0).reshape(3, 4))


def test_views_and_allocations_launch_nothing(xp, a):
    assert launches(lambda: (a.reshape(4, 3), a.T, a[1:], a[0], a[0, 1], a[:, None], a.transpose(1, 0))) == []
    assert launches(lambda: (xp.broadcast_to(a, (2, 3, 4)), xp.swapaxes(a, 0, 1), xp.expand_dims(a, 0))) == []
    assert launches(lambda: (xp.ascontiguousarray(a), a.astype(a.dtype, copy=False), xp.asarray(a))) == []
    assert launches(lambda: (xp.empty((3, 4)), xp.empty_like(a), a.shape, a.dtype, xp.result_type(a, 1.0))) == []


def test_each_operation_that_computes_is_one_launch(xp, a):
    b = a + 1.0
    assert launches(lambda: a + b) == ["__add__"]
    assert launches(lambda: 2.0 * a) == ["__rmul__"]
    assert launches(lambda: (-a, a < b)) == ["__neg__", "__lt__"]

    def in_place():
        c = a.copy()
        c += 1.0
        c[0] = 0.0

    assert launches(in_place) == [".copy", "__iadd__", "setitem"]
    assert launches(lambda: (xp.exp(a), xp.zeros((2,)), xp.where(a > 1, a, 0.0))) == [
        "xp.exp",
        "xp.zeros",
        "__gt__",
        "xp.where",
    ]
    assert launches(lambda: (a.sum(), a.sum(axis=0), a.astype(np.float32))) == [".sum", ".sum", ".astype"]
    # a reshape that must copy (a transposed view flattened), and ascontiguousarray of one
    assert launches(lambda: (a.T.reshape(-1), xp.ascontiguousarray(a.T))) == [".reshape", "xp.ascontiguousarray"]
    # an advanced index gathers; a ufunc's scatter-add
    rows = xp.asarray(np.array([0, 2]))
    assert launches(lambda: (a[rows], xp.add.at(a, rows, 1.0))) == ["getitem", "xp.add.at"]


def test_a_kernel_is_one_launch_and_a_strided_input_one_more(a):
    kernels = StrictKernels()
    assert launches(lambda: kernels.softmax_forward(a)) == ["kernel softmax_forward"]
    assert launches(lambda: kernels.relu_forward(a)) == ["kernel relu_forward"]
    # CudaKernels copies an input that is not C-contiguous before its kernel reads it
    assert launches(lambda: kernels.relu_forward(a.T)) == ["xp.ascontiguousarray for kernel relu_forward"] + [
        "kernel relu_forward"
    ]


def test_a_product_counts_the_copies_cupy_makes_first(xp):
    """cupy.matmul copies a stacked operand that is not C-contiguous (its batched GEMM reads only
    those), and only a matrix that is neither C- nor F-contiguous (cuBLAS takes a transpose as a flag)."""
    m = xp.asarray(np.ones((4, 4)))
    assert launches(lambda: (m @ m.T, xp.matmul(m.T, m))) == ["__matmul__", "xp.matmul"]
    assert launches(lambda: m[:, ::2].T @ m) == ["copy in cupy.matmul", "__matmul__"]
    s = xp.asarray(np.ones((2, 3, 4, 4)))
    assert launches(lambda: s @ s) == ["__matmul__"]
    assert launches(lambda: s @ xp.swapaxes(s, -1, -2)) == ["copy in cupy.matmul", "__matmul__"]
    heads, w = xp.swapaxes(s, 1, 2), xp.asarray(np.ones((2, 4, 4, 5)))  # heads: a head-split view
    assert launches(lambda: heads @ w) == ["copy in cupy.matmul", "__matmul__"]
    # a batch axis of 1 against 3: tables of matrix pointers for a, b and the output, per batch axis
    assert launches(lambda: s @ s[:, :1]).count("pointer table in cupy.matmul") == 3 * 2


def test_layer_norms_backward_counts_what_the_cuda_kernels_launch(a, recorded):
    """CudaKernels.layer_norm_backward: the row and the column kernels (which write every partial
    column sum: no zeroing), and the one that adds the partial sums up; the stand-in counts as many."""
    kernels = StrictKernels()
    y, xhat, rstd = kernels.layer_norm_forward(a, a[0], a[0], 1e-5)
    assert len(launches(lambda: kernels.layer_norm_backward(a, xhat, rstd, a[0]))) == 3
    host = [x.get() for x in (a, xhat, rstd, a[0])]
    CudaKernels(np, load_module=RecordingModule).layer_norm_backward(*host)
    assert [name for name, *_ in recorded] == [
        f"layer_norm_backward_{part}_{host[0].dtype.name}" for part in ("rows", "columns", "finish")
    ]


def test_base_says_whether_the_memory_is_the_arrays_own(xp, a):
    """StrictArray.base as CuPy's: None for an array that views nothing (here: whose NumPy array
    no other StrictArray wraps either), else the array it views."""
    fresh = a + 1.0
    assert fresh.base is None and a[1:].base is not None and a.T.base is not None
    again = xp.asarray(fresh)  # CuPy returns fresh itself; here a second wrapper of its memory
    assert fresh.base is not None and again.base is not None


def test_the_gpu_backend_computes_gelu_with_one_kernel_each_way(cuda):
    """As on a GPU (``kernels/gelu.py``'s CUDA kernels), not with the reference's ~300 operators."""
    x, g = mt.randn(4, 8, device=cuda, requires_grad=True), mt.ones(4, 8, device=cuda)
    with count_launches() as forward:
        y = mt.gelu(x)
    with count_launches() as backward:
        y.backward(g)
    assert [e.what for e in forward.events] == ["kernel gelu_forward"]
    assert [e.what for e in backward.events] == ["kernel gelu_backward"]  # x.grad takes the kernel's array
    np.testing.assert_allclose(y.numpy(), mt.gelu(mt.tensor(x.numpy())).numpy(), rtol=1e-6)


def test_a_leaf_takes_a_fresh_gradient_as_it_is_and_copies_a_shared_one(cuda):
    """autograd._accumulate (with _unshared) on CuPy's arrays: a gradient that views nothing and that nothing else
    holds becomes ``.grad`` without a copy (a launch per parameter per step); one that is shared
    (Add hands the caller's gradient to both inputs) is copied, so each ``.grad`` is its own."""
    a, b = (mt.randn(4, device=cuda, requires_grad=True) for _ in range(2))
    g = mt.ones(4, device=cuda)
    with count_launches() as log:
        (a * b).backward(g)
    assert [e.what for e in log.events] == ["__mul__"] * 3  # the product, a gradient for each: no copy
    a.grad = b.grad = None
    with count_launches() as log:
        (a + b).backward(g)
    assert [e.what for e in log.events] == ["__add__", ".astype", ".astype"]
    with mt.no_grad():
        a.grad.add_(1.0)
    np.testing.assert_array_equal(b.grad.numpy(), 1.0)
    np.testing.assert_array_equal(g.numpy(), 1.0)


def test_each_launch_names_the_line_of_minitensor_that_asked(cuda):
    x = mt.ones(3, device=cuda)
    with count_launches() as log:
        x.exp()
    (launch,) = log.events
    assert launch.what == "xp.exp" and launch.where.startswith("minitensor/core/ops/elementwise.py:")
    assert "in forward" in launch.where and log.by("file") == {"minitensor/core/ops/elementwise.py": 1}


def test_the_launch_and_sync_counters_are_independent(xp, a):
    with count_syncs() as syncs, count_launches() as log:
        (a + 1.0).sum().item()
    assert [e.what for e in log.events] == ["__add__", ".sum"] and [e.what for e in syncs.waits] == ["item()"]
    with count_launches() as log:
        pass
    assert isinstance(a, StrictArray) and len(log) == 0


# -- the budgets -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def text(tmp_path_factory):
    path = tmp_path_factory.mktemp("text") / "text.txt"
    path.write_text("the quick brown fox jumps over the lazy dog. " * 20)
    return str(path)


def launches_per_step(config, warm_up=2):
    """The launches of the training step after ``warm_up`` steps (one that does not read the losses),
    the minibatch's upload included: a LaunchLog."""
    with RunFolder(config.out) as run:
        state = loop.set_up(config, run, quiet, resume=False)
        state.model.train()
        batches = iter(state.loader)
        for _ in range(warm_up):
            loop.train_step(state, next(batches))
        with count_launches() as log:
            loop.train_step(state, next(batches))
    assert state.step % READ_EVERY
    return log


# Launches per step: the measured count is the budget. Lower it when a change removes launches.
BUDGETS = {
    # the encoder-decoder Transformer: valid_lens masks, dropout, clipping, Adam (measured: 254)
    "transformer": (dict(), 254),
    # nanoGPT's recipe (GELU, tied embeddings, no biases, AdamW with decay groups, cosine, clipping)
    "lm, nanoGPT's recipe": (
        {
            **{k: v for k, v in PRESETS["gpt-char-gpu"].items() if k not in SIZES},
            "lm_num_steps": 8,
            "warmup_steps": 3,
            "eval_interval": 1000,
        },
        116,  # measured: 116
    ),
    # the same in mt.autocast (--autocast): each product rounds its operands (a kernel each) and its
    # result (one more), on bfloat16 tensor cores (measured: 211; 322 when the roundings were
    # CuPy's astype, two an operand, and bfloat16 dropout ran its hash as array code)
    "lm, nanoGPT's recipe, autocast": (
        {
            **{k: v for k, v in PRESETS["gpt-char-gpu"].items() if k not in SIZES},
            "lm_num_steps": 8,
            "warmup_steps": 3,
            "eval_interval": 1000,
            "autocast": True,
        },
        211,
    ),
}


@pytest.mark.parametrize("changes, budget", BUDGETS.values(), ids=BUDGETS.keys())
def test_a_training_step_stays_within_its_launch_budget(cuda, tmp_path, text, changes, budget):
    if changes.get("model") == "lm":
        changes = dict(changes, text=text)
    log = launches_per_step(tiny(tmp_path / "run", cuda, **changes))
    assert len(log) <= budget, f"{len(log)} launches per step, over the budget of {budget}:\n{log!r}"


def test_with_its_attention_streamed_the_gpt_step_launches_the_kernels_and_fewer(cuda, tmp_path, text):
    """``--fused on``: each attention of nanoGPT's recipe is three CUDA kernels (forward, dQ,
    dK/dV) with the weights' dropout inside them, where the plain path runs the scores' products,
    mask, softmax and dropout as CuPy operators: the step launches 11 fewer a block, and no tile
    of CuPy operators runs. (The kernels here record their launches and compute nothing: a count
    needs no values.)"""
    changes = dict(BUDGETS["lm, nanoGPT's recipe"][0], text=text)
    with attention_kernels_that_record(mt.get_backend(cuda)) as made:
        plain = len(launches_per_step(tiny(tmp_path / "plain", cuda, **changes)))
        assert not made  # the plain path at this length: no attention kernel
        with np.errstate(all="ignore"):  # the outputs the recording kernels leave unwritten hold any bits
            streamed = len(launches_per_step(tiny(tmp_path / "streamed", cuda, **changes, fused="on")))
    steps, blocks = 3, tiny(tmp_path / "x", cuda, **changes).num_blks
    assert sorted(set(made)) == [
        "attention_backward_dkv_d32_float32", "attention_backward_dq_d32_float32", "attention_forward_d32_float32"
    ]  # fmt: skip
    assert len(made) == steps * blocks * 3  # one of each per block and step: the tiles never ran
    assert streamed + 3 * blocks <= plain - 10 * blocks, (streamed, plain)  # measured: 102 + 3 against 116
