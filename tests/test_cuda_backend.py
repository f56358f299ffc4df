"""device="cuda": the CuPy backend, its errors, its random numbers, DLPack, and a whole
training run on it -- without a GPU.

``fake_cupy.FakeCupy`` stands in for the ``cupy`` module: the CuPy backend's own code runs
unchanged on arrays that refuse to turn into NumPy arrays implicitly, so a hidden host
round trip anywhere (ops, layers, optimisers, the training loop, checkpoints) fails here as
it would on a GPU. The CUDA kernels themselves run in the tests' CUDA emulator
(``test_cuda_kernels.py``); the tests marked ``gpu`` repeat the essentials on a real GPU.
"""

import sys
from functools import partial

import numpy as np
import pytest
from fake_cupy import FakeCupy, fake_cuda_backend
from gpu import GPU, requires_gpu
from minitensor.backends.cupy_backend import CupyBackend, cuda_unavailable_reason

import minitensor as mt
from minitensor import backends
from minitensor.cli import main
from minitensor.train.checkpoint import load_checkpoint, save_checkpoint
from minitensor.train.config import TrainConfig
from minitensor.train.loop import train

NO_DEVICE = "cudaErrorNoDevice: no CUDA-capable device is detected"
OLD_DRIVER = "cudaErrorInsufficientDriver: CUDA driver version is insufficient for CUDA runtime version"


@pytest.fixture
def cuda(monkeypatch):
    """ "cuda" served by the CuPy backend on FakeCupy (on a real GPU: the real one)."""
    if GPU:
        yield "cuda"
        return
    monkeypatch.setitem(backends._BACKENDS, "cuda", fake_cuda_backend())
    yield "cuda"


@pytest.fixture
def no_cuda():
    """A machine where "cuda" has not been used yet (and the registry as it was, afterwards)."""
    saved = dict(backends._BACKENDS)
    backends._BACKENDS.pop("cuda", None)
    yield
    backends._BACKENDS.clear()
    backends._BACKENDS.update(saved)


# -- is there a GPU? one clear error that says what is missing ------------------------------------
def test_missing_cupy_is_named_with_the_install_command(monkeypatch, no_cuda):
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy -> ImportError
    reason = cuda_unavailable_reason()
    assert "CuPy is not installed" in reason and "minitensor[gpu]" in reason
    with pytest.raises(mt.DeviceError, match="device 'cuda' is not available: CuPy is not installed"):
        mt.zeros(2, device="cuda")
    assert not mt.cuda.is_available() and mt.cuda.unavailable_reason() == reason
    assert "cuda" not in mt.available_backends()


@pytest.mark.parametrize("error, says", [(NO_DEVICE, "no CUDA GPU"), (OLD_DRIVER, "driver is missing or too old")])
def test_cupy_without_a_usable_gpu_says_what_is_missing(monkeypatch, no_cuda, error, says):
    """``import cupy`` works on such a machine; only is_available() / the runtime tell."""
    monkeypatch.setitem(sys.modules, "cupy", FakeCupy(error=error))
    with pytest.raises(mt.DeviceError) as caught:
        mt.tensor([1.0, 2.0], device="cuda")
    assert says in str(caught.value) and error in str(caught.value)
    with pytest.raises(mt.DeviceError, match=says):
        mt.nn.Linear(2, 2).to("cuda")
    assert "cuda" not in backends._BACKENDS


def test_a_cupy_that_cannot_be_imported_is_told_apart_from_a_missing_one(monkeypatch, no_cuda):
    """A CuPy wheel built for another NumPy fails inside its own import: say so, and what to do."""
    import builtins

    real_import = builtins.__import__

    def broken_cupy(name, *args, **kwargs):
        if name == "cupy":
            raise ImportError("numpy.core.multiarray failed to import")
        return real_import(name, *args, **kwargs)

    monkeypatch.delitem(sys.modules, "cupy", raising=False)
    monkeypatch.setattr(builtins, "__import__", broken_cupy)
    reason = cuda_unavailable_reason()
    assert reason.startswith("CuPy is installed but cannot be imported with NumPy") and "failed to import" in reason
    assert "minitensor[gpu]" in reason


def test_a_gpu_that_cannot_run_a_kernel_fails_at_the_first_call_in_one_line(monkeypatch, no_cuda):
    """CuPy finds the device but cannot compile (no NVRTC) or load a kernel: the first use of
    "cuda" says so with what to install, not a CompileException from inside an op."""

    class NoCompiler(FakeCupy):
        def arange(self, *args, **kwargs):
            raise RuntimeError("CompileException: nvrtc: error: failed to open libnvrtc-builtins.so.13.0\n(details)")

    monkeypatch.setitem(sys.modules, "cupy", NoCompiler())
    with pytest.raises(mt.DeviceError) as caught:
        mt.zeros(2, device="cuda")
    message = str(caught.value)
    assert "CuPy sees a GPU but cannot run a kernel on it" in message and "libnvrtc-builtins" in message
    assert "minitensor[gpu]" in message and "(details)" not in message
    assert "cuda" not in backends._BACKENDS


def test_a_cupy_without_its_cuda_libraries_fails_at_the_first_call_in_one_line(monkeypatch, no_cuda, capsys):
    """``cupy-cuda13x`` without ``[ctk]`` on a machine with no CUDA toolkit: CuPy's kernels may
    compile, but cuBLAS loads only at the first product. The first use of "cuda" says so."""
    missing = 'Failure finding "libcublasLt.so.13 or libcublasLt.so.12": No such file: libcublasLt.so.13\n(search log)'

    class NoCublas(FakeCupy):
        def __init__(self):
            super().__init__()
            cuda = self.cuda

            class Cuda(type(cuda)):
                @property
                def cublas(self):
                    raise ImportError(missing)

            self.cuda = Cuda(**{k: v for k, v in vars(cuda).items() if k != "cublas"})

    monkeypatch.setitem(sys.modules, "cupy", NoCublas())
    with pytest.raises(mt.DeviceError) as caught:
        mt.ones(2, device="cuda")
    message = str(caught.value)
    assert "CuPy sees a GPU but cannot load cuBLAS (ImportError: Failure finding" in message
    assert "minitensor[gpu]" in message and "(search log)" not in message
    assert "cuda" not in backends._BACKENDS
    assert main(["info"]) == 1  # `minitensor info` says the same, in its cuda line
    assert (
        "cuda: FAILED: device 'cuda' is not available: CuPy sees a GPU but cannot load cuBLAS"
        in capsys.readouterr().out
    )


def test_a_broken_cuda_installation_is_reported_not_raised():
    class Broken(FakeCupy):
        def is_available(self):
            raise OSError("libcudart.so: cannot open shared object file")

    assert "libcudart" in cuda_unavailable_reason(Broken())


def test_the_backend_is_built_on_first_use_and_then_reused(monkeypatch, no_cuda):
    fake = FakeCupy()
    monkeypatch.setitem(sys.modules, "cupy", fake)
    backend = mt.get_backend("cuda")
    assert isinstance(backend, CupyBackend) and backend.xp is fake
    assert mt.get_backend("cuda") is backend and "cuda" in mt.available_backends()
    assert mt.cuda.is_available()


def test_import_minitensor_does_not_import_cupy():
    import subprocess

    code = "import sys, minitensor as mt; mt.zeros(2); print('cupy' in sys.modules, 'numba' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


# -- tensors on the device --------------------------------------------------------------------------
def test_tensors_move_to_the_device_and_back(cuda):
    x = mt.tensor([[1.0, 2.0], [3.0, 4.0]], device=cuda)
    assert x.device == cuda and isinstance(x.data, mt.get_backend(cuda).xp.ndarray)
    host = x.numpy()
    assert isinstance(host, np.ndarray) and host.tolist() == [[1.0, 2.0], [3.0, 4.0]]
    host[0, 0] = 9.0  # a copy: the device data is unchanged
    assert x.numpy()[0, 0] == 1.0
    assert mt.tensor(np.ones(3), device=cuda).device == cuda
    y = x.to("cpu").to(cuda)
    assert y.device == cuda and y.numpy().tolist() == x.numpy().tolist()
    with pytest.raises(TypeError, match="call .numpy()"):
        np.asarray(x)


def test_gradients_flow_back_across_devices(cuda):
    a = mt.tensor([1.0, -2.0, 3.0], requires_grad=True)
    b = a.to(cuda)
    (b * b).sum().backward()
    assert a.grad.device == "cpu" and a.grad.numpy().tolist() == [2.0, -4.0, 6.0]


def test_mixing_devices_in_one_op_names_both(cuda):
    with pytest.raises(mt.DeviceError, match=r"cpu.*cuda|cuda.*cpu"):
        mt.ones(2) + mt.ones(2, device=cuda)


def test_embedding_backward_accumulates_repeated_tokens_on_the_device(cuda):
    emb = mt.nn.Embedding(5, 3).to(cuda)
    emb(mt.tensor([[1, 1, 4, 1]], device=cuda)).sum().backward()
    grad = emb.weight.grad.numpy()
    assert grad[1].tolist() == [3.0, 3.0, 3.0] and grad[4].tolist() == [1.0, 1.0, 1.0] and grad[0].sum() == 0


# -- random numbers: on the device, seeded, restorable ------------------------------------------------
def test_random_numbers_are_drawn_on_the_device_and_follow_the_seed(cuda):
    mt.manual_seed(7)
    a = mt.randn(4, 5, device=cuda)
    mask = mt.dropout(mt.ones(1000, device=cuda), 0.5, training=True)
    assert a.device == cuda and mask.device == cuda
    kept = mask.numpy()
    assert set(np.unique(kept)) == {0.0, 2.0} and 0.4 < (kept > 0).mean() < 0.6
    mt.manual_seed(7)
    assert mt.randn(4, 5, device=cuda).numpy().tolist() == a.numpy().tolist()
    assert mt.randn(4, 5, device=cuda).numpy().tolist() != a.numpy().tolist()  # the stream moves on
    ints = mt.randint(0, 3, (200,), device=cuda).numpy()
    assert ints.dtype == np.int64 and set(np.unique(ints)) == {0, 1, 2}
    # cuRAND draws float32 and float64: float16 is drawn in float32 and converted, as on the CPU
    half = [mt.randn(1000, dtype="float16", device=cuda), mt.rand(1000, dtype="float16", device=cuda)]
    assert all(x.dtype == mt.float16 for x in half) and 0.9 < half[0].numpy().std() < 1.1


def test_the_generator_state_round_trips_exactly(cuda):
    backend = mt.get_backend(cuda)
    mt.manual_seed(1)
    mt.randn(3, device=cuda)
    state = backend.get_rng_state()
    expected = mt.rand(6, device=cuda).numpy()
    mt.randn(10, device=cuda)
    backend.set_rng_state(state)
    assert mt.rand(6, device=cuda).numpy().tolist() == expected.tolist()


def test_philox_generators_are_used():
    fake = FakeCupy()
    backend = CupyBackend(fake)
    backend.uniform((3,), "float32")
    assert [g.method for g in fake.created_generators] == [fake.cuda.curand.CURAND_RNG_PSEUDO_PHILOX4_32_10]


def test_a_backend_registered_after_manual_seed_is_seeded(monkeypatch):
    mt.manual_seed(11)
    first = fake_cuda_backend()
    monkeypatch.setitem(backends._BACKENDS, "cuda", first)
    backends.register_backend(first)
    a = mt.rand(5, device="cuda").numpy()
    second = fake_cuda_backend()
    backends.register_backend(second)  # e.g. "cuda" first used after the seed was set
    assert mt.rand(5, device="cuda").numpy().tolist() == a.tolist()


# -- DLPack -------------------------------------------------------------------------------------------
def test_dlpack_shares_memory_with_numpy():
    host = np.arange(6.0).reshape(2, 3)
    t = mt.from_dlpack(host)
    assert t.device == "cpu" and t.shape == (2, 3)
    host[0, 0] = 42.0
    assert t.numpy()[0, 0] == 42.0  # no copy
    back = np.from_dlpack(t)
    back[1, 1] = -1.0
    assert t.numpy()[1, 1] == -1.0
    assert t.__dlpack_device__() == (1, 0)


def test_dlpack_refuses_what_it_cannot_take():
    with pytest.raises(RuntimeError, match="requires grad.*detach"):
        np.from_dlpack(mt.ones(2, requires_grad=True))
    with pytest.raises(TypeError, match="from_dlpack: a list has no __dlpack__"):
        mt.from_dlpack([1, 2])

    class OnAnFPGA:
        def __dlpack__(self, **kwargs):
            raise AssertionError("never called")

        def __dlpack_device__(self):
            return (14, 0)

    with pytest.raises(ValueError, match="DLPack device type 14"):
        mt.from_dlpack(OnAnFPGA())


def test_dlpack_with_torch():
    torch = pytest.importorskip("torch")
    t = mt.tensor([1.0, 2.0, 3.0])
    shared = torch.from_dlpack(t)
    shared[0] = 10.0
    assert t.numpy().tolist() == [10.0, 2.0, 3.0]
    back = mt.from_dlpack(torch.arange(4, dtype=torch.float64))
    assert back.dtype == mt.float64 and back.numpy().tolist() == [0.0, 1.0, 2.0, 3.0]


@requires_gpu
@pytest.mark.gpu
def test_dlpack_keeps_cuda_memory_on_the_gpu():
    import cupy

    t = mt.from_dlpack(cupy.arange(3, dtype=cupy.float32))
    assert t.device == "cuda" and isinstance(t.data, cupy.ndarray)
    assert cupy.from_dlpack(t).__cuda_array_interface__["data"][0] == t.data.data.ptr


# -- a whole training run on the device -----------------------------------------------------------------
def _reverse(tmp_path, device, **changes):
    settings = dict(
        task="reverse",
        num_train=256,
        num_heldout=32,
        max_len=4,
        epochs=2,
        batch_size=32,
        num_blks=1,
        num_hiddens=16,
        ffn_num_hiddens=32,
        num_heads=2,
        dropout=0.1,
        progress=False,
        device=device,
        out=str(tmp_path),
    )
    settings.update(changes)
    return TrainConfig(**settings)


def _quiet(message):
    pass


def test_training_on_the_device_learns_checkpoints_and_resumes_exactly(cuda, tmp_path):
    whole = train(_reverse(tmp_path / "whole", cuda), log=_quiet)
    params = list(whole.model.parameters())
    assert all(p.device == cuda for p in params)
    assert whole.history["loss"][-1] < whole.history["loss"][0]
    # resume from a checkpoint written on the device: the same losses, bit for bit (RNG included)
    config = _reverse(tmp_path / "parts", cuda)
    train(config, log=_quiet, stop_after_epochs=1)
    resumed = train(config, log=_quiet, resume=True)
    if GPU:  # cuBLAS and CuPy's atomic scatter-add need not sum in the same order twice
        np.testing.assert_allclose(resumed.history["loss"], whole.history["loss"], rtol=1e-5)
    else:
        assert resumed.history["loss"] == whole.history["loss"]


def test_a_checkpoint_saved_on_the_device_loads_on_the_cpu_and_back(cuda, tmp_path):
    mt.manual_seed(0)
    model = mt.nn.Sequential(mt.nn.Linear(4, 8), mt.nn.ReLU(), mt.nn.Linear(8, 2)).to(cuda)
    optimizer = mt.optim.Adam(model.parameters(), lr=1e-2)
    x = mt.randn(5, 4, device=cuda)
    model(x).sum().backward()
    optimizer.step()
    moments = optimizer.state[next(iter(model.parameters()))]
    assert all(isinstance(v, mt.get_backend(cuda).xp.ndarray) for v in moments.values() if hasattr(v, "shape"))
    save_checkpoint(tmp_path / "ckpt", model, optimizer)

    on_cpu = mt.nn.Sequential(mt.nn.Linear(4, 8), mt.nn.ReLU(), mt.nn.Linear(8, 2))
    cpu_optimizer = mt.optim.Adam(on_cpu.parameters(), lr=1e-2)
    info = load_checkpoint(tmp_path / "ckpt", on_cpu, cpu_optimizer, map_device="cpu")
    assert info["saved_device"] == cuda
    same = np.testing.assert_array_equal if not GPU else partial(np.testing.assert_allclose, rtol=1e-5, atol=1e-6)
    same(on_cpu(x.to("cpu")).numpy(), model(x).numpy())
    # the optimiser goes on from the same moments on either device
    optimizer.zero_grad()
    for m in (model, on_cpu):
        m(x.to(next(iter(m.parameters())).device)).sum().backward()
    optimizer.step()
    cpu_optimizer.step()
    for a, b in zip(model.parameters(), on_cpu.parameters()):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5 if GPU else 1e-6, atol=1e-7)

    again = mt.nn.Sequential(mt.nn.Linear(4, 8), mt.nn.ReLU(), mt.nn.Linear(8, 2)).to(cuda)
    save_checkpoint(tmp_path / "from_cpu", on_cpu, cpu_optimizer)
    load_checkpoint(tmp_path / "from_cpu", again, map_device=cuda)
    assert all(p.device == cuda for p in again.parameters())
    same(again(x).numpy(), on_cpu(x.to("cpu")).numpy())


def test_cli_train_on_cuda(cuda, tmp_path, capsys):
    from minitensor import cli

    out = str(tmp_path / "run")
    assert (
        cli.main(
            [
                "train",
                "--task",
                "reverse",
                "--num-train",
                "128",
                "--num-heldout",
                "16",
                "--max-len",
                "3",
                "--epochs",
                "1",
                "--batch-size",
                "32",
                "--num-blks",
                "1",
                "--device",
                cuda,
                "--out",
                out,
                "--no-progress",
            ]
        )
        == 0
    )
    assert "device cuda" in capsys.readouterr().out
    assert cli.main(["translate", "--checkpoint", out, "--device", cuda, "abc"]) == 0


def test_cli_train_without_a_gpu_fails_with_the_reason(monkeypatch, no_cuda, tmp_path, capsys):
    from minitensor import cli

    monkeypatch.setitem(sys.modules, "cupy", FakeCupy(error=NO_DEVICE))
    assert (
        cli.main(
            [
                "train",
                "--task",
                "reverse",
                "--num-train",
                "64",
                "--epochs",
                "1",
                "--device",
                "cuda",
                "--out",
                str(tmp_path),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "device 'cuda' is not available" in err and "no CUDA GPU" in err and "Traceback" not in err


def test_every_model_and_decoder_runs_on_the_device(cuda):
    """GRU, Conv1d, the Bahdanau model, the LM and beam search keep their data on the device."""
    from minitensor.nn.conv import Conv1d
    from minitensor.nn.rnn import GRU

    from minitensor.inference.decoding import beam_search, generate

    xp_array = mt.get_backend(cuda).xp.ndarray
    mt.manual_seed(0)
    x = mt.randn(2, 5, 3, device=cuda, requires_grad=True)
    out, state = GRU(3, 4, num_layers=2).to(cuda)(x.swapaxes(0, 1))
    conv = Conv1d(3, 4, kernel_size=3, padding=1).to(cuda)(x.swapaxes(1, 2))
    (out.sum() + state.sum() + conv.sum()).backward()
    assert isinstance(x.grad.data, xp_array) and isinstance(conv.data, xp_array)

    from minitensor.data import build_vocabs

    src_vocab, tgt_vocab = build_vocabs([(list("abcd"), list("dcba"))])
    for model_name in ("bahdanau", "transformer"):
        config = TrainConfig(
            task="reverse", model=model_name, num_hiddens=8, ffn_num_hiddens=16, num_heads=2, num_blks=1, device=cuda
        )
        from minitensor.train.config import build_model

        model = build_model(config, src_vocab, tgt_vocab)
        model.eval()
        enc_X = mt.tensor([[2, 3, 4, 0]], device=cuda)
        state = model.begin_decoding(enc_X, mt.tensor([3], device=cuda))
        hyps = beam_search(model, state, tgt_vocab.bos, tgt_vocab.eos, 5, beam_size=3)
        assert len(hyps) == 1 and len(hyps[0].tokens) <= 5
    lm_config = TrainConfig(
        model="lm", text="x", num_hiddens=8, ffn_num_hiddens=16, num_heads=2, num_blks=1, device=cuda
    )
    lm = build_model(lm_config, tgt_vocab, tgt_vocab)
    lm.eval()
    logits = lm(mt.tensor([[2, 3, 4]], device=cuda))
    assert isinstance(logits.data, xp_array)
    text = generate(lm, ["a", "b"], tgt_vocab, 4, beam_size=2)
    assert len(text) <= 6


def test_minitensor_info_names_the_gpu_stack_and_compiles_the_kernels(monkeypatch, capsys):
    """`minitensor info` where "cuda" works: CuPy, the runtime, the driver, the GPU in one line,
    then every CUDA kernel compiled (here by the tests' emulator, NVRTC's stand-in)."""
    cuda_emulator = pytest.importorskip("cuda_emulator")
    if not cuda_emulator.available():
        pytest.skip("the CUDA emulator needs a C++ compiler")
    from minitensor.kernels.cuda import KERNELS, CudaKernels

    from minitensor import cli

    backend = fake_cuda_backend()
    backend._kernels = CudaKernels(np, load_module=cuda_emulator.EmulatedModule)
    monkeypatch.setitem(backends._BACKENDS, "cuda", backend)
    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    assert "cuda: available (CuPy 14.2.0, CUDA runtime 13.0, driver 13.0, NVIDIA H200 (compute capability 9.0))" in out
    assert f"cuda kernels: {sum(len(names) for names in KERNELS.values())} compiled" in out
    assert "cuda graphs: ready (cuBLAS reached directly: cuBLAS run in NumPy" in out

    def no_cublas():
        raise OSError("libcublas.so.13: cannot open shared object file")

    monkeypatch.setattr(backend, "direct_cublas", no_cublas)  # optional: info still succeeds
    assert cli.main(["info"]) == 0
    assert "cuda graphs: not available (OSError: libcublas.so.13: cannot open" in capsys.readouterr().out

    class NoNvrtc:
        def __init__(self, code):
            pass

        def get_function(self, name):
            raise RuntimeError("CompileException: nvrtc: error: libnvrtc.so.13 not found")

    backend._kernels = CudaKernels(np, load_module=NoNvrtc)
    assert cli.main(["info"]) == 1
    out = capsys.readouterr().out
    assert "cuda kernels: FAILED: the CUDA kernel" in out and "libnvrtc" in out and "cupy-cuda13x[ctk]" in out


def test_dropout_on_the_gpu_backend_is_the_cpus_mask_with_a_seed_made_on_the_host():
    """The GPU's dropout hashes (seed, index) like the CPU's: no generator, no device read."""
    fake = FakeCupy()
    backend = fake_cuda_backend(fake)
    assert backend.fused("dropout_forward", np.float32) is not None
    assert backend.fused("dropout_forward", np.float16) is None and backend.fused("no_such_kernel", np.float32) is None
    backend.seed(5)
    first = backend.draw_seed()
    assert 0 <= first < 2**62 and backend.draw_seed() != first
    backend.seed(5)
    assert backend.draw_seed() == first  # (seed, draws) on the host: restorable by set_rng_state
    assert fake.created_generators == []
