"""CUDA graphs: a step's kernels captured once and replayed by one launch (``mt.cuda.graph``,
``minitensor train --cuda-graph``).

Tested without a GPU on the CuPy stand-in (``fake_cupy.py``), which records the launches of a
capture and runs them again at each replay, as a GPU replays a graph: into the same memory,
with the arguments they were captured with (a seed passed by value stays the same), and
nothing else (Python does not run; a capture's results are spoilt until the first replay).
It refuses, as CUDA does, a read, a synchronisation or an upload inside a capture, and, as
CUDA does not (it replays whatever the memory then holds), a replay that reads memory made
before the capture and freed since.

What must hold: a replayed step computes what the same step run eagerly computes, dropout
included (each replay draws the seeds the eager calls would have drawn), and a run with
``--cuda-graph`` is the run without it. Equal to float32's rounding, not to the bit: as CuPy
does, the stand-in refuses CuPy's products inside a capture, and the capture's products are
cuBLAS calls of minitensor's own (``cublas_gemm.captured_matmul``), here run in NumPy.
"""

import functools

import numpy as np
import pytest
from fake_cupy import fake_cuda_backend, launch_in_numpy
from gpu import GPU
from hypothesis import given, settings
from hypothesis import strategies as st
from minitensor.backends import cublas_gemm
from minitensor.errors import DeviceError
from strict_backend import CaptureError, count_launches, count_syncs
from test_random_programs import INPUT_SHAPES, loss_weights, programs, run_minitensor

import minitensor as mt
from minitensor import backends
from minitensor.train import graphed
from minitensor.train.config import ConfigError, TrainConfig
from minitensor.train.loop import train

pytest.importorskip("safetensors")


@pytest.fixture
def cuda(monkeypatch):
    monkeypatch.setitem(backends._BACKENDS, "cuda", fake_cuda_backend())
    return "cuda"


@pytest.fixture(scope="module")
def stand_in():
    """The device "cuda" on the stand-in for a whole module: hypothesis's examples share one fixture."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(backends._BACKENDS, "cuda", fake_cuda_backend())
        yield "cuda"


def _leaf(shape, seed, device):
    data = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return mt.tensor(data, device=device, requires_grad=True)


def _step(w, x):
    """A small step with every kind of launch: a product, a kernel (softmax), dropout (a seed),
    an in-place write, a reduction; its backward."""
    h = mt.dropout((x @ w).tanh(), 0.5)
    h[:, 0] = 0.0
    loss = (h.softmax(-1) * h).sum()
    loss.backward()
    return loss


def test_a_replay_computes_what_the_eager_step_does_dropout_included(cuda):
    w, x = _leaf((6, 5), 0, cuda), mt.tensor(np.ones((3, 6), np.float32), device=cuda)
    mt.manual_seed(1)
    eager = []
    for _ in range(3):
        w.grad = None
        eager.append((_step(w, x).item(), w.grad.numpy().copy()))
    state = backends.get_backend(cuda).get_rng_state()
    assert len({loss for loss, _ in eager}) == 3  # fresh dropout masks at every step

    mt.manual_seed(1)
    w.grad = None
    g = mt.cuda.CUDAGraph()
    with mt.cuda.graph(g):
        loss = _step(w, x)
    assert np.isnan(loss.numpy())  # a capture runs nothing: its results wait for a replay
    for want_loss, want_grad in eager:
        g.replay()  # (its product is cuBLAS's own call, not CuPy's: equal to float32's rounding)
        assert loss.item() == pytest.approx(want_loss, rel=1e-6)
        np.testing.assert_allclose(w.grad.numpy(), want_grad, rtol=1e-5, atol=1e-7)
    # the generator moved on by the draws the eager steps made: a checkpoint's state is the same
    assert backends.get_backend(cuda).get_rng_state() == state


def test_a_replay_is_one_launch_and_a_seed_table(cuda):
    w, x = _leaf((6, 5), 0, cuda), mt.tensor(np.ones((3, 6), np.float32), device=cuda)
    with count_launches() as eager:
        _step(w, x)
    w.grad = None
    g = mt.cuda.CUDAGraph()
    with mt.cuda.graph(g):
        _step(w, x)
    with count_launches() as replayed:
        g.replay()
    assert len(eager) > 15
    assert [e.what for e in replayed.events] == ["kernel draw_seeds", "graph launch"]


@pytest.mark.parametrize(
    "inside, error, match",
    [
        (lambda t: t.sum().item(), CaptureError, "not permitted when stream is capturing"),
        (lambda t: t + mt.tensor([1.0], device="cuda"), CaptureError, "upload"),
        (lambda t: mt.randn(3, device="cuda"), DeviceError, "cannot be captured"),
    ],
    ids=["a read", "an upload", "a cuRAND draw"],
)
def test_what_cannot_be_captured_is_refused_and_leaves_no_capture(cuda, inside, error, match):
    """A read, an upload of host data or a random draw whose seed would be replayed: refused
    inside the capture (CUDA itself refuses the first two), and the capture ends with nothing
    kept, so that the next one starts afresh."""
    t = mt.ones(3, device=cuda)
    g = mt.cuda.CUDAGraph()
    with pytest.raises(error, match=match):
        with mt.cuda.graph(g):
            inside(t)
    with pytest.raises(RuntimeError, match="nothing captured"):
        g.replay()
    again = mt.cuda.CUDAGraph()
    with mt.cuda.graph(again):
        doubled = t * 2
    again.replay()
    assert doubled.tolist() == [2.0, 2.0, 2.0]


def test_a_step_that_cannot_be_captured_says_so_and_names_the_flag(cuda):
    """A step that reads from the GPU (a model printing a loss, say) cannot be a graph:
    ``--cuda-graph`` fails at its capture in one line that says why and what to do, and leaves
    the device as it was (the next capture works)."""
    w = _leaf((6, 5), 0, cuda)
    x = mt.tensor(np.ones((3, 6), np.float32), device=cuda)

    def loss_fn(batch):
        loss = (batch[0] @ w).sum()
        print(loss.item())  # a read: fine eagerly, refused in a capture
        return loss, None

    step = graphed.GraphedStep(loss_fn, mt.optim.SGD([w], lr=0.1))
    for _ in range(graphed.WARMUP_STEPS):
        assert step((x,)) is None
    with pytest.raises(DeviceError, match=r"--cuda-graph: the step could not be captured .*CaptureError.*without"):
        step((x,))
    g = mt.cuda.CUDAGraph()
    with mt.cuda.graph(g):
        y = x * 2
    g.replay()
    assert float(y.sum().item()) == 36.0


@pytest.mark.parametrize("error", [0.0, 1e-3], ids=["right", "one product off by 1e-3"])
def test_a_graph_that_does_not_compute_the_eager_step_stops_the_run(cuda, monkeypatch, error):
    """Each graph of ``--cuda-graph`` is checked once, when made: its first replay against the
    same minibatch run eagerly with the same dropout seeds. A graph whose products were wrong (a
    cuBLAS call with a wrong argument, on a GPU no test has seen) would train silently wrong:
    it stops the run instead, in one line. A right one passes, dropout and all."""
    import fake_cupy

    run_like_cublas = fake_cupy.run_like_cublas  # the captured products (eager ones are CuPy's)
    monkeypatch.setattr(fake_cupy, "run_like_cublas", lambda *a: run_like_cublas(*a) * np.float32(1 + error))
    w = _leaf((6, 5), 0, cuda)
    x = mt.tensor(np.random.default_rng(2).standard_normal((3, 6)).astype(np.float32), device=cuda)

    def loss_fn(batch):
        return (mt.dropout(batch[0] @ w, 0.5).tanh() ** 2).sum(), None

    step = graphed.GraphedStep(loss_fn, mt.optim.SGD([w], lr=0.1))
    for _ in range(graphed.WARMUP_STEPS):
        assert step((x,)) is None
    if not error:
        with count_syncs() as log:
            loss, _ = step((x,))
        assert len(log.waits) == 1, log  # the check reads its three numbers at once
        assert np.isfinite(loss.item()) and step((x,)) is not None
        return
    with pytest.raises(
        DeviceError, match=r"--cuda-graph: the CUDA graph for minibatches shaped \(3, 6\) does not compute"
    ):
        step((x,))


def test_a_diverged_step_is_left_to_the_loops_check(cuda):
    """A step whose eager loss is already NaN says nothing about the graph: the check of a new
    graph stands aside, and the loop's own check of the losses names the step that diverged."""
    w = mt.tensor(np.full((6, 5), np.nan, np.float32), device=cuda, requires_grad=True)
    x = mt.tensor(np.ones((3, 6), np.float32), device=cuda)
    step = graphed.GraphedStep(lambda batch: ((batch[0] @ w).sum(), None), mt.optim.SGD([w], lr=0.1))
    for _ in range(graphed.WARMUP_STEPS):
        assert step((x,)) is None
    loss, _ = step((x,))
    assert np.isnan(loss.item()) and np.isnan(list(step.first_replays.values())[0][1])


def test_one_capture_at_a_time_and_a_graph_captures_once(cuda):
    g = mt.cuda.CUDAGraph()
    with mt.cuda.graph(g):
        with pytest.raises(DeviceError, match="already under way"):
            mt.cuda.CUDAGraph().capture_begin()
    with pytest.raises(RuntimeError, match="already captured"):
        g.capture_begin()
    assert repr(g) == "CUDAGraph(captured)"


def test_checks_on_the_data_are_made_again_after_each_replay(cuda):
    """An embedding's index out of range is found on the device (``Backend.check``) at the next
    read: after a replay too, for the index the replay was given."""
    emb = mt.nn.Embedding(5, 3).to(cuda)
    index = mt.tensor([[1, 2]], device=cuda)
    g = mt.cuda.CUDAGraph()
    with mt.cuda.graph(g):
        out = emb(index).sum()
    g.replay()
    assert np.isfinite(out.item())
    index.data[...] = mt.tensor([[1, 7]], device=cuda).data
    g.replay()
    with pytest.raises(IndexError, match="7"):
        out.item()


def test_a_replay_of_memory_freed_since_the_capture_is_refused(cuda):
    """On a GPU, memory that a graph reads but that was made before the capture and freed after
    it goes back to the pool, and a replay reads whatever array got it next, silently. The
    stand-in refuses such a replay; while an array (a view, here) is left over it, the replay runs."""
    a = mt.ones(4, device=cuda)
    g = mt.cuda.CUDAGraph()
    with mt.cuda.graph(g):
        doubled = a * 2
    view = a[1:]
    del a
    g.replay()
    assert doubled.tolist() == [2.0] * 4
    del view
    with pytest.raises(CaptureError, match=r"freed since its capture \(a float32 \(4,\) array"):
        g.replay()


def test_a_graph_keeps_the_causal_mask_it_reads(cuda):
    """Causal attention reads a mask made once per shape and kept in a cache of 8
    (``attention._shared_causal_mask``): if the cache dropped it while a graph read it, the next
    replay would read freed memory. The graph keeps it (``Backend.keep_for_replay``)."""
    from minitensor.core.nn import attention

    attn = mt.nn.MultiHeadAttention(8, 2, dropout=0.0, fused=False).to(cuda)
    x = mt.tensor(np.random.default_rng(0).standard_normal((2, 5, 8)).astype(np.float32), device=cuda)

    def step():
        loss = (attn(x, x, x, causal=True) ** 2).sum()
        loss.backward()  # and the autograd graph, which held the mask too, is gone
        return loss.detach()

    expected = step().item()
    attn.zero_grad()  # set to None: the graph's backward makes them
    g = mt.cuda.CUDAGraph()
    with mt.cuda.graph(g):
        loss = step()
    for n in range(10, 19):  # nine other shapes: the cache drops the (5, 5) mask
        attention._causal_masks(n, n, backends.get_backend(cuda))
    assert attention._causal_masks.cache_info().currsize == 8
    g.replay()
    assert loss.item() == pytest.approx(expected, rel=1e-6)


def test_clipping_can_be_captured(cuda):
    """Clipping the gradients is a graph's work (the norm and the factor stay on the device), but
    its multi-tensor kernels read a table of the gradients' addresses, uploaded when new (a
    capture's gradients are) and kept in a cache of ``POINTER_TABLES``: no upload can be
    captured, nor may a graph read a table the cache drops later. Inside a capture, clipping
    takes the gradients one by one (``Backend.fused`` offers no multi-tensor kernel there), and
    later clipping of other arrays, which fills the cache, changes nothing in the replay."""
    from minitensor.core.kernels.cuda import POINTER_TABLES

    model = mt.nn.Linear(4, 3).to(cuda)
    x = mt.tensor(np.random.default_rng(1).standard_normal((5, 4)).astype(np.float32), device=cuda)

    def step():
        (model(x) ** 2).sum().backward()
        return mt.nn.utils.clip_grad_norm_(model.parameters(), 0.5)

    expected = float(step())
    expected_grad = model.weight.grad.numpy().copy()
    model.zero_grad()
    g = mt.cuda.CUDAGraph()
    with mt.cuda.graph(g):
        norm = step()
    for n in range(POINTER_TABLES + 1):  # other gradients' tables fill the cache
        others = [mt.zeros(n + 1, device=cuda, requires_grad=True)]
        others[0].grad = mt.ones(n + 1, device=cuda)
        mt.nn.utils.clip_grad_norm_(others, 1.0)
    g.replay()
    assert float(norm) == pytest.approx(expected, rel=1e-5)  # a sum in another order
    np.testing.assert_allclose(model.weight.grad.numpy(), expected_grad, rtol=1e-5)


def test_an_optimiser_step_is_refused_inside_a_capture(cuda):
    """Its learning rate and step count go to the kernels by value: a replay would repeat the
    captured ones, silently. Refused, in words; the step belongs after the replay."""
    model = mt.nn.Linear(4, 3).to(cuda)
    optimizer = mt.optim.Adam(model.parameters())
    (model(mt.ones(2, 4, device=cuda)) ** 2).sum().backward()
    g = mt.cuda.CUDAGraph()
    with pytest.raises(DeviceError, match=r"Adam.step: .*cannot be captured.*after g.replay\(\)"):
        with mt.cuda.graph(g):
            optimizer.step()


class Constants:
    """The constants of a random program (``run_minitensor``'s ``constant``), made on the first
    run and handed out again, in the same order, to the later ones: a capture may not upload."""

    def __init__(self):
        self.made, self.next = [], None

    def __call__(self, array, dtype, device):
        if self.next is None:
            self.made.append(mt.tensor(array, dtype=dtype, device=device))
            return self.made[-1]
        return next(self.next)

    def again(self):
        self.next = iter(self.made)


@settings(max_examples=40, deadline=None)
@given(case=programs(), seed=st.integers(0, 2**16))
def test_a_random_program_replayed_computes_what_it_computes_eagerly(stand_in, case, seed):
    """``tests/test_random_programs.py``'s programs (fan-out, views, pieces, detached values,
    writes in place and out of place, masked writes) captured once and replayed on two sets of
    inputs: every value and every input's gradient equal to the same program run eagerly."""
    steps, in_loss, hold = case
    cuda = stand_in
    rng = np.random.default_rng(seed)
    arrays = [[rng.standard_normal(s) for s in INPUT_SHAPES] for _ in range(2)]
    weights = [None if w is None else mt.tensor(w, device=cuda) for w in loss_weights(steps, in_loss)]
    constant = Constants()

    def program(inputs):
        values = run_minitensor(steps, inputs, hold, constant)
        loss = sum((v * w).sum() for v, w in zip(values, weights) if w is not None)
        if loss.requires_grad:
            loss.backward()
        return values

    eager = []
    for a in arrays:
        inputs = [mt.tensor(x, device=cuda, requires_grad=True) for x in a]
        values = program(inputs)
        eager.append(([v.numpy() for v in values], [None if x.grad is None else x.grad.numpy() for x in inputs]))
        constant.again()
    static = [mt.tensor(x, device=cuda, requires_grad=True) for x in arrays[0]]
    g = mt.cuda.CUDAGraph()
    with mt.cuda.graph(g):
        values = program(static)
    for a, (want_values, want_grads) in zip(arrays, eager):
        with mt.no_grad():
            for x, new in zip(static, a):
                x.copy_(mt.tensor(new, device=cuda))
        g.replay()
        for k, (v, want) in enumerate(zip(values, want_values)):
            np.testing.assert_allclose(v.numpy(), want, rtol=1e-13, atol=1e-13, err_msg=f"value {k}")
        for n, (x, want) in enumerate(zip(static, want_grads)):
            assert (x.grad is None) == (want is None), f"input {n}"
            if want is not None:
                np.testing.assert_allclose(x.grad.numpy(), want, rtol=1e-13, atol=1e-13, err_msg=f"input {n}")


def test_graphs_need_the_gpu():
    with pytest.raises(DeviceError, match="needs the 'cuda' device"):
        backends.get_backend("cpu").begin_capture()
    with pytest.raises(ConfigError, match="--cuda-graph .* needs --device cuda"):
        TrainConfig(task="reverse", cuda_graph=True).validate()


def _tiny(out, device, **changes):
    settings = dict(
        task="reverse", num_train=96, num_heldout=8, max_len=4, batch_size=4, epochs=2, num_blks=1,
        num_hiddens=8, ffn_num_hiddens=16, num_heads=2, dropout=0.1, progress=False, device=device, out=str(out),
    )  # fmt: skip
    settings.update(changes)
    return TrainConfig(**settings)


@pytest.mark.parametrize(
    "changes",
    [
        {},  # the encoder-decoder: valid lengths, masks, dropout, clipping, Adam
        dict(num_train=98, epochs=3),  # and an epoch's last, shorter minibatch: eager twice, then a graph
        dict(model="bahdanau"),  # D2L's GRU encoder-decoder with additive attention: its products in a loop
        dict(preset="gpt-char-gpu", text=None),  # set below: a character GPT (AdamW, GELU, tied)
        dict(preset="gpt-char-gpu", text=None, fused="on"),  # its attention streamed, dropout inside
        # a learned relative bias (T5's) in the streamed kernels, its table's gradient too
        dict(preset="gpt-char-gpu", text=None, fused="on", positional="t5_relative"),
        dict(preset="gpt-char-gpu", text=None, matmul_precision="medium"),  # bfloat16 products, captured
        dict(preset="gpt-char-gpu", text=None, autocast=True),  # mixed precision: its roundings captured too
        dict(model="bahdanau", autocast=True),  # the GRU's bfloat16 products, its float32 recurrence
    ],
    ids=[
        "seq2seq",
        "seq2seq-two-shapes",
        "bahdanau",
        "gpt",
        "gpt-streamed",
        "gpt-t5-streamed",
        "gpt-bfloat16",
        "gpt-autocast",
        "bahdanau-autocast",
    ],
)
def test_a_run_with_cuda_graphs_is_the_run_without(monkeypatch, tmp_path, request, changes):
    """The same losses at every step and the same weights at the end, the graphs replayed for
    every step after the warm-up; the 96 reversals make 24 minibatches of one shape an epoch."""
    if "preset" in changes:
        text = tmp_path / "text.txt"
        text.write_text("the quick brown fox jumps over the lazy dog. " * 30)
        changes = dict(
            text=str(text), model="lm", lm_num_steps=16, num_hiddens=16, ffn_num_hiddens=32, num_heads=2,
            activation="gelu", tie_embeddings=True, bias=False, optimizer="adamw", epochs=1, steps=12,
            **{k: v for k, v in changes.items() if k in ("fused", "positional", "matmul_precision", "autocast")},
        )  # fmt: skip
    if changes.get("matmul_precision") == "medium" or changes.get("autocast"):  # eager bfloat16 products, in NumPy
        monkeypatch.setattr(cublas_gemm, "launch", launch_in_numpy)
        request.addfinalizer(functools.partial(mt.set_float32_matmul_precision, mt.get_float32_matmul_precision()))
    runs, replays = [], []
    real_call = graphed.GraphedStep.__call__

    def counted(self, batch):
        result = real_call(self, batch)
        replays.append(result is not None)
        return result

    monkeypatch.setattr(graphed.GraphedStep, "__call__", counted)
    for graph in (False, True):
        monkeypatch.setitem(backends._BACKENDS, "cuda", fake_cuda_backend())
        result = train(_tiny(tmp_path / str(graph), "cuda", cuda_graph=graph, **changes), log=lambda *_: None)
        weights = {k: v.numpy() for k, v in result.model.state_dict().items()}
        runs.append((result.history["loss"], weights))
    (eager_losses, eager_weights), (graph_losses, graph_weights) = runs
    # the same masks and steps; the products differ by float32's rounding (module docstring)
    np.testing.assert_allclose(graph_losses, eager_losses, rtol=1e-5)
    for name, value in eager_weights.items():
        np.testing.assert_allclose(graph_weights[name], value, rtol=1e-4, atol=1e-6, err_msg=name)
    assert replays[: graphed.WARMUP_STEPS] == [False] * graphed.WARMUP_STEPS and len(replays) == len(eager_losses)
    if "num_train" in changes:  # 24 full minibatches an epoch and one of 2: its third is captured
        assert replays[24::25] == [False, False, True] and replays.count(False) == graphed.WARMUP_STEPS + 2
    else:
        assert all(replays[graphed.WARMUP_STEPS :])


# -- on a real GPU (pytest -m gpu): what the stand-in can only imitate -----------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs CuPy and a CUDA GPU")
@pytest.mark.parametrize("precision, rtol", [("highest", 1e-5), ("high", 2e-3)])  # TF32: its own rounding
def test_on_the_gpu_a_replay_computes_what_the_eager_step_does(precision, rtol):
    """CuPy's stream capture, the graph's own memory pool, the products through cuBLAS called
    directly, the seed table drawn on the device: three replays against three eager steps."""
    mt.set_float32_matmul_precision(precision)
    try:
        rng = np.random.default_rng(0)
        w = mt.tensor(rng.standard_normal((64, 48)).astype(np.float32), device="cuda", requires_grad=True)
        x = mt.tensor(rng.standard_normal((32, 64)).astype(np.float32), device="cuda")
        mt.manual_seed(3)
        eager = []
        for _ in range(3):
            w.grad = None
            eager.append((_step(w, x).item(), w.grad.numpy().copy()))
        mt.manual_seed(3)
        w.grad = None
        g = mt.cuda.CUDAGraph()
        with mt.cuda.graph(g):
            loss = _step(w, x)
        for want_loss, want_grad in eager:
            g.replay()
            assert loss.item() == pytest.approx(want_loss, rel=rtol)
            np.testing.assert_allclose(w.grad.numpy(), want_grad, rtol=rtol, atol=rtol * np.abs(want_grad).max())
    finally:
        mt.set_float32_matmul_precision("highest")


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs CuPy and a CUDA GPU")
def test_on_the_gpu_a_run_with_cuda_graphs_is_the_run_without(tmp_path):
    """``minitensor train --cuda-graph`` on the GPU: the encoder-decoder's losses and weights."""
    runs = []
    for graph in (False, True):
        result = train(_tiny(tmp_path / str(graph), "cuda", cuda_graph=graph, steps=12), log=lambda *_: None)
        runs.append((result.history["loss"], {k: v.numpy() for k, v in result.model.state_dict().items()}))
    (eager_losses, eager_weights), (graph_losses, graph_weights) = runs
    np.testing.assert_allclose(graph_losses, eager_losses, rtol=1e-4)
    for name, value in eager_weights.items():
        np.testing.assert_allclose(graph_weights[name], value, rtol=1e-3, atol=1e-5, err_msg=name)
