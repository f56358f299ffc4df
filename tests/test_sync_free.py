"""A training step never waits for the GPU.

A read from the device (``loss.item()``, ``int(indices.max())``, ``bool(mask.any())``, a
boolean-mask index) makes the host wait until the GPU has finished everything queued before
it: a step that reads inside itself runs at the pace of its own forward pass, with the GPU
idle while the host prepares the next. So forward, backward, clipping and the optimiser's
update read nothing; the loop reads the steps' numbers together every ``READ_EVERY`` steps,
and checks on the data wait on the device until the next read (``Backend.check``).

Tested without a GPU: the CuPy stand-in (``fake_cupy.py``) counts every read, explicit
synchronisation and upload (``strict_backend.count_syncs``), and each training step of
every model is counted.
"""

import numpy as np
import pytest
from fake_cupy import fake_cuda_backend
from strict_backend import count_syncs

import minitensor as mt
from minitensor import backends
from minitensor.train import loop
from minitensor.train.config import PRESETS, TrainConfig, build_model
from minitensor.train.loop import READ_EVERY, TrainingError, _pad, train
from minitensor.train.run import RunFolder

pytest.importorskip("safetensors")


def listed(events):
    return "\n".join(str(e) for e in events) or "(none)"


@pytest.fixture
def cuda(monkeypatch):
    """ "cuda" served by the CuPy backend on the stand-in, whose transfers count_syncs() sees
    (on a machine with a GPU too: the real CuPy's cannot be counted); cuBLAS's bfloat16
    products (matmul precision "medium") run in NumPy there."""
    from fake_cupy import launch_in_numpy
    from minitensor.backends import cublas_gemm

    monkeypatch.setitem(backends._BACKENDS, "cuda", fake_cuda_backend())
    monkeypatch.setattr(cublas_gemm, "launch", launch_in_numpy)
    yield "cuda"
    mt.set_float32_matmul_precision("highest")  # a run sets its config's, for the whole process


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    path = tmp_path_factory.mktemp("text") / "text.txt"
    path.write_text("the quick brown fox jumps over the lazy dog. " * 20)
    return str(path)


def tiny(out, device, **changes):
    """Seconds for 30 steps: 96 reversals (or a short text) in batches of 4, one small block."""
    settings = dict(
        task="reverse",
        num_train=96,
        num_heldout=8,
        max_len=4,
        batch_size=4,
        epochs=2,
        num_blks=1,
        num_hiddens=8,
        ffn_num_hiddens=16,
        num_heads=2,
        dropout=0.1,
        progress=False,
        device=device,
        out=str(out),
    )
    settings.update(changes)
    return TrainConfig(**settings)


def quiet(message):
    pass


def counted_steps(config, warm_up=2, last=2 * READ_EVERY):
    """Set up the run of ``config`` and take ``warm_up`` steps, then the steps up to ``last``, each
    (the minibatch's upload included) inside count_syncs(): [(step, log, number of arrays in the batch)]."""
    with RunFolder(config.out) as run:
        state = loop.set_up(config, run, quiet, resume=False)
        state.model.train()
        batches = iter(state.loader)
        counted = []
        for _ in range(last):
            with count_syncs() as log:
                batch = next(batches)
                loop.train_step(state, batch)
            counted.append((state.step, log, len(batch)))
    assert state.step < state.total_steps  # no end of the run among them: only the interval reads
    return state, counted[warm_up:]


# the preset's sizes are a GPU's; the counted runs keep tiny()'s
SIZES = ("num_hiddens", "ffn_num_hiddens", "num_heads", "num_blks", "lm_num_steps", "batch_size", "steps")
SIZES += ("eval_iters", "eval_batch_size")

MODELS = {
    # the encoder-decoder Transformer: valid_lens masks in the encoder and the loss, dropout, clipping, Adam
    "transformer": dict(),
    "transformer, AdamW, no clipping, Noam, label smoothing": dict(
        optimizer="adamw", clip_grad_norm=None, schedule="noam", label_smoothing=0.1
    ),
    # streamed attention (valid_lens on the device) with a relative bias table (integer-array indexing),
    # the weights' dropout inside the stream (its seed drawn on the host)
    "transformer, streamed, T5 biases": dict(fused="on", positional="t5_relative"),
    "transformer, ALiBi, post-LN, grouped heads": dict(positional="alibi", norm_first=False, num_kv_heads=1),
    "bahdanau": dict(model="bahdanau"),
    "lm": dict(model="lm", lm_num_steps=8),  # causal
    "lm, streamed, sliding window, learned positions": dict(
        model="lm", lm_num_steps=8, fused="on", positional="sliding_window", input_positional="learned"
    ),
    # nanoGPT's recipe (GELU, tied embeddings, no biases, GPT-2's init, AdamW with its decay groups, warm-up
    # then cosine, clipping, random windows) at a learner's size, with dropout as its GPU recipe has
    "lm, nanoGPT's recipe": {
        **{k: v for k, v in PRESETS["gpt-char-gpu"].items() if k not in SIZES},
        "lm_num_steps": 8,
        "warmup_steps": 3,
        "eval_interval": 1000,
    },
    "lm, rotary positions, grouped heads": dict(model="lm", lm_num_steps=8, positional="rotary", num_kv_heads=1),
    # float32 products on bfloat16 tensor cores: minitensor's own cuBLAS calls (backends/cublas_gemm.py)
    "lm, bfloat16 products": dict(model="lm", lm_num_steps=8, matmul_precision="medium"),
    # mixed precision (mt.autocast): bfloat16 activations between the products, float32 elsewhere
    "lm, nanoGPT's recipe, autocast": {
        **{k: v for k, v in PRESETS["gpt-char-gpu"].items() if k not in SIZES},
        "lm_num_steps": 8,
        "warmup_steps": 3,
        "eval_interval": 1000,
        "autocast": True,
    },
    "transformer, streamed, autocast": dict(fused="on", autocast=True),
    "bahdanau, autocast": dict(model="bahdanau", autocast=True),  # the GRU's recurrence in float32
}


@pytest.mark.parametrize("changes", MODELS.values(), ids=MODELS.keys())
def test_training_steps_never_wait_for_the_device(cuda, tmp_path, text, changes):
    """Zero reads and synchronisations per step, except the loop's one read of the losses every
    READ_EVERY steps (two transfers: the pending data checks' flags, then the numbers)."""
    if changes.get("model") == "lm":
        changes = dict(changes, text=text)
    state, counted = counted_steps(tiny(tmp_path / "run", cuda, **changes))
    for step, log, arrays in counted:
        found = log.waits
        if step % READ_EVERY:
            assert not found, f"step {step} waited for the device:\n{listed(found)}"
        else:
            assert len(found) == 2 and all(any("in read_losses" in f for f in e.stack) for e in found), (
                f"step {step}: expected the loop's read of its losses, found:\n{listed(found)}"
            )
        # the minibatch goes up, one array each, and nothing else does (no mask rebuilt on the host)...
        tables = [e for e in log.uploads if e.where.startswith("minitensor/core/kernels/cuda/__init__.py:")]
        batch = [e for e in log.uploads if e not in tables]
        assert [e.what for e in batch] == ["xp.array"] * arrays, listed(log.uploads)
        # ... but the multi-tensor kernels' tables of addresses (kernels/cuda PointerTables), when the
        # gradients' addresses are new: an upload the host does not wait for, one per launch at
        # most (Adam's group(s), clipping's norm; its scale finds the norm's table). On a GPU,
        # CuPy's memory pool gives a steady loop its blocks back and the kept tables are found;
        # NumPy's allocator here gives no such promise.
        callers = {e.stack[1].rsplit(" in ", 1)[1] for e in tables}
        assert callers <= {"update_group", "clip_grad_norm_"}, listed(tables)
        assert len(tables) <= len(state.optimizer.param_groups) + 1, listed(tables)
    total = sum(len(log.waits) for _, log, _ in counted)
    reads = [step for step, _, _ in counted if step % READ_EVERY == 0]
    assert reads == [READ_EVERY, 2 * READ_EVERY] and total == 2 * len(reads)  # amortised: 2 per READ_EVERY steps
    assert len(state.history["loss"]) == 2 * READ_EVERY  # every step read, in order


def test_a_hand_written_step_with_sgd_and_clipping_never_waits(cuda):
    """The model, loss, clipping and SGD with momentum and weight decay, outside the loop."""
    from minitensor.data import build_vocabs

    src_vocab, tgt_vocab = build_vocabs([(list("abcd"), list("dcba"))])
    mt.manual_seed(0)
    config = TrainConfig(num_hiddens=8, ffn_num_hiddens=16, num_heads=2, num_blks=1, dropout=0.1, device=cuda)
    model = build_model(config, src_vocab, tgt_vocab)
    optimizer = mt.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    X = mt.tensor([[2, 3, 4, 0], [3, 2, 0, 0]], device=cuda)
    X_lens = mt.tensor([3, 2], device=cuda)
    for step in range(4):
        with count_syncs() as log:
            loss = mt.cross_entropy(model(X, X, X_lens), X, ignore_index=tgt_vocab.pad, label_smoothing=0.1)
            optimizer.zero_grad()
            loss.backward()
            norm = mt.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            optimizer.step()
        if step:  # after the first, which creates the momentum buffers
            assert not log.waits, listed(log.waits)
            # nothing goes up but clipping's table of the gradients' addresses when they are new
            # (see test_training_steps_never_wait_for_the_device)
            assert all(e.stack[1].endswith("in clip_grad_norm_") for e in log.uploads), listed(log.uploads)
            assert len(log.uploads) <= 1, listed(log.uploads)
    assert np.isfinite(loss.item()) and np.isfinite(norm.item())


def test_the_numbers_read_together_are_those_read_one_by_one(cuda, tmp_path):
    """history["loss"] and the token count are the same, bit for bit, whether the device's
    numbers are read every step or every READ_EVERY steps."""
    results = []
    for read_every in (1, READ_EVERY):
        config = tiny(tmp_path / f"every{read_every}", cuda)
        with RunFolder(config.out) as run:
            state = loop.set_up(config, run, quiet, resume=False)
            state.read_every = read_every
            state.model.train()
            for batch in state.loader:
                loop.train_step(state, batch)
            loop.read_losses(state)
        results.append((state.history["loss"], state.tokens_seen))
    assert results[0] == results[1]
    assert len(results[0][0]) == 24 and results[0][1] == sum(len(t) + 1 for _, t in state.data.train)


@pytest.mark.parametrize("model", ["transformer", "lm"])
def test_an_estimate_of_the_loss_reads_the_device_once(cuda, tmp_path, text, model):
    """nanoGPT's estimate (eval_iters minibatches of each split) and the held-out evaluation keep
    the batches' losses on the device and read their sum once: a read per batch would stop the
    host until each forward had run. The same numbers as the same model's on the CPU, which
    reads every batch."""
    changes = dict(model="lm", text=text, lm_num_steps=8) if model == "lm" else {}
    config = tiny(tmp_path / "run", cuda, eval_iters=5, eval_batch_size=4, **changes)
    with RunFolder(config.out) as run:
        state = loop.set_up(config, run, quiet, resume=False)
        state.step, pad = 1, _pad(state.data.tgt_vocab)
        with count_syncs() as log:
            loop.estimate_losses(state)
            on_device = loop.heldout_loss(state.model, state.heldout_arrays, config, pad)
        # one read per split and one for the held-out set, each with the pending checks'
        assert [e.what for e in log.waits] == ["bool()", "item()"] * 3, listed(log.waits)
        state.model.to("cpu")
        state.config = config.replace(device="cpu")
        loop.estimate_losses(state)  # the same minibatches: drawn from (seed, step)
        on_cpu = loop.heldout_loss(state.model, state.heldout_arrays, state.config, pad)
    gpu, cpu = state.history["estimates"]
    assert all(np.isclose(gpu[k], cpu[k], rtol=1e-6) for k in ("train", "val")), (gpu, cpu)
    assert np.isclose(on_device, on_cpu, rtol=1e-6)


def test_a_diverged_step_on_the_device_is_named_at_the_next_read(cuda, tmp_path, monkeypatch):
    """On a device the NaN of step 3 is found when the loop reads (step READ_EVERY), named, and
    stops the run before any checkpoint is written. (On the CPU it stops at step 3 itself,
    before any weight changes: test_train.py.)"""
    real, calls = loop._loss, []

    def poisoned(*args):
        loss, n = real(*args)
        calls.append(1)
        return (loss * float("nan") if len(calls) == 3 else loss), n

    monkeypatch.setattr(loop, "_loss", poisoned)
    with pytest.raises(TrainingError, match=r"loss became nan at step 3 \(epoch 1\).*lower learning rate"):
        train(tiny(tmp_path / "run", cuda), log=quiet)
    assert len(calls) == READ_EVERY
    assert not (tmp_path / "run" / "checkpoint").exists()


# -- checks on the data: at once on the CPU, at the next read on a device ----------------------------
def test_an_embedding_index_out_of_range_fails_at_the_next_read(cuda):
    emb = mt.nn.Embedding(5, 3).to(cuda)
    indices = mt.tensor([[1, 7, 2]], device=cuda)
    with count_syncs() as log:
        out = emb(indices)
        out.sum().backward()
    assert not log.waits, listed(log.waits)  # the check waits on the device...
    with pytest.raises(IndexError, match=r"^embedding: index 7 is out of range for a table of 5 embeddings "):
        out.sum().item()  # ... until the next read
    assert out.sum().item() == pytest.approx(float(emb.weight.numpy()[[1, 0, 2]].sum()))  # raised once
    # the message says why it comes late
    emb(mt.tensor([-1], device=cuda))
    with pytest.raises(IndexError, match=r"index -1 .*checked on the 'cuda' device, raised at the next read"):
        mt.zeros(1, device=cuda).numpy()


def test_a_target_out_of_range_fails_at_the_next_read(cuda):
    logits = mt.zeros(2, 3, device=cuda, requires_grad=True)
    with count_syncs() as log:
        loss = mt.cross_entropy(logits, mt.tensor([0, 9], device=cuda))
        loss.backward()
    assert not log.waits, listed(log.waits)
    with pytest.raises(IndexError, match=r"^cross_entropy: target 9 is out of range for 3 classes \(valid: 0\.\.2"):
        float(loss)
    # an integer-array index, likewise (CuPy would wrap it around silently)
    x = mt.arange(6.0, device=cuda).reshape(2, 3)
    rows = x[mt.tensor([0, 2], device=cuda)]
    with pytest.raises(IndexError, match=r"^getitem: index 2 is out of bounds for axis 0 with size 2"):
        rows.tolist()


def test_on_the_cpu_the_op_itself_raises():
    w = mt.ones(5, 2)
    with pytest.raises(
        IndexError, match=r"^embedding: index 5 is out of range for a table of 5 embeddings \(valid: 0\.\.4\)$"
    ):
        mt.embedding(mt.tensor([0, 5]), w)
    with pytest.raises(IndexError, match=r"^cross_entropy: target 3 is out of range for 3 classes"):
        mt.cross_entropy(mt.zeros(2, 3), mt.tensor([0, 3]))


def test_pending_checks_are_made_when_too_many_wait(cuda):
    """A loop that never reads: the flags (and the arrays their messages need) do not pile up."""
    backend = mt.get_backend(cuda)
    w = mt.ones(5, 2, device=cuda)
    indices = mt.tensor([1, 2], device=cuda)
    with count_syncs() as log:
        for _ in range(2 * backend.max_pending_checks + 2):
            mt.embedding(indices, w)
    assert len(log.waits) == 2 and all("raise_failed_checks" in e.where for e in log.waits)


def test_the_counter_sees_every_kind_of_read(cuda):
    """The stand-in itself: each way CuPy code can wait for the device is counted, with the place."""
    xp = mt.get_backend(cuda).xp
    a = xp.asarray(np.arange(6.0))
    with count_syncs() as log:
        a[0].item(), float(a[0]), int(a[1]), bool(a[2] > 1), a.tolist(), a.get(), xp.asnumpy(a)
        a[a > 2], xp.nonzero(a), a.nonzero(), xp.argwhere(a), xp.flatnonzero(a), xp.unique(a), xp.where(a > 1)
        xp.where(a > 1, a, 0.0)  # three arguments: elementwise, no read
        xp.cuda.get_current_stream().synchronize(), xp.cuda.Device().synchronize()
        xp.cuda.Stream.null.synchronize(), xp.cuda.runtime.deviceSynchronize()
        xp.asarray(np.ones(2)), xp.asarray(a)  # one upload; a device array is no upload
    kinds = [e.kind for e in log.events]
    assert kinds.count("read") == 14 and kinds.count("sync") == 4 and kinds.count("upload") == 1
    assert len(log.waits) == 18 and len(log.uploads) == 1
    with count_syncs() as log:
        mt.tensor([1.0, 2.0], device=cuda).sum().item()
    (upload,), (read,) = log.uploads, log.waits
    assert upload.what == "xp.array" and "in array" in upload.where  # CupyBackend.array
    assert read.stack[0].startswith("minitensor/core/tensor.py:") and "in item" in read.where
