"""The GPU check script (``bench/gpu_check.py``), checked where there is no GPU: its
benchmarks run on the CPU with the same code, and asking for "cuda" without one fails with
the reason."""

import json
import pathlib
import subprocess
import sys

import pytest
from gpu import GPU

SCRIPT = pathlib.Path(__file__).resolve().parent.parent / "bench" / "gpu_check.py"


def run(*args):
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--no-install", *args], capture_output=True, text=True, timeout=600
    )


def test_the_benchmarks_run_on_the_cpu_and_check_their_results(tmp_path):
    report = tmp_path / "targets.json"
    done = run("--device", "cpu", "--no-tests", "--quick", "--json", str(report))
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    # the targets judged at the end, and as JSON for the README's table
    assert "Targets on cpu" in out and "a GPU's" in out and f"[targets] written to {report}" in out
    targets = json.loads(report.read_text())
    assert targets["device"] == "cpu" and targets["failures"] == []
    judged = {t["key"]: t for t in targets["targets"]}
    assert judged["softmax/naive"]["measured"] > 0 and judged["softmax/naive"]["ok"] in (True, False)
    assert judged["step 64, graph/torch"]["measured"] is None  # a CUDA graph needs the GPU
    for kernel in ("softmax forward", "masked softmax forward", "softmax backward", "log_softmax forward"):
        assert kernel in out
    assert "naive/mt" in out and "Training step (forward + loss + backward + Adam) on cpu" in out
    assert "Dropout (mask and product) on cpu" in out and "everything passed" in out
    assert "nanoGPT's shakespeare_char GPU recipe" in out and "minitensor, TF32" in out
    assert "minitensor, bfloat16 products (medium)" in out and "minitensor, bfloat16 autocast" in out
    assert judged["recipe autocast/nanoGPT bfloat16"]["measured"] is None  # nanoGPT's bfloat16: a GPU's
    assert "Streamed causal attention with a relative bias" in out and "learned/no bias" in out
    assert "relative bias: gradients agree with the plain path" in out
    if "torch not installed" not in out:
        assert "same weights, no dropout" in out and "mt/torch" in out
        assert "vs nanoGPT" in out and "nanoGPT, float32 (TF32)" in out


@pytest.mark.skipif(GPU, reason="there is a GPU here")
def test_without_a_gpu_it_says_what_is_missing():
    done = run("--no-tests")
    assert done.returncode == 1
    assert "device 'cuda' is not available" in done.stderr and "Traceback" not in done.stderr


def test_the_recipe_benchmark_draws_batches_past_an_epoch():
    """An epoch of the real recipe is 62 minibatches, fewer than its samples take. (In a process
    of its own: the bench folder's modules would shadow others of the same name here.)"""
    code = "import gpu_check; d = gpu_check.endless([1, 2]); print([next(d) for _ in range(5)])"
    done = subprocess.run([sys.executable, "-c", code], cwd=SCRIPT.parent, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "[1, 2, 1, 2, 1]"


def test_long_attention_times_one_walker_beside_the_walkers_the_launcher_picks():
    """On a GPU, section 6 times the streamed kernels with one walker a row beside the walkers
    the launcher picks for the grid (attention.cu): here the emulated kernels as a GPU backend's,
    on a "GPU" of 32 multiprocessors, where T = 128 and 8 heads (2,048 threads) take four."""
    code = f"""
import sys
sys.path.insert(0, {str(SCRIPT.parent.parent / "tests")!r})
import numpy as np
import gpu_check
from cuda_emulator import EmulatedModule
from minitensor.backends import _BACKENDS, NumpyBackend
from minitensor.kernels.cuda import CudaKernels

class EmulatedGPU(NumpyBackend):
    device = "emulated-cuda"
    attention_kernels = CudaKernels(np, load_module=EmulatedModule, multiprocessors=32)

_BACKENDS["emulated-cuda"] = EmulatedGPU()
device = gpu_check.Device("emulated-cuda", None)
device.sync = lambda: None  # (no stream to wait for)
gpu_check.peak_bytes = lambda *args, **kwargs: None
(row,) = gpu_check.long_attention_benchmark(device, quick=True)
print("walkers", row[4], "kept", EmulatedGPU.attention_kernels.fixed_splits)
"""
    done = subprocess.run([sys.executable, "-c", code], cwd=SCRIPT.parent, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "fused, 1 walker" in done.stdout and "outputs and gradients agree" in done.stdout
    assert done.stdout.strip().endswith("walkers 4 kept None")


def test_the_training_sections_time_a_cuda_graph_beside_the_eager_step(tmp_path):
    """On a GPU, sections 5 and 7 capture the step as a CUDA graph (``--cuda-graph``), check that
    a replay gives the eager step's loss and gradients, and time it beside the eager step: here on
    the CuPy stand-in, which replays captured launches as a GPU replays a graph. The recipe's
    section writes the flags for the full recipe's run (``--recipe-flags``)."""
    flags = tmp_path / "flags"
    code = f"""
import sys
sys.path.insert(0, {str(SCRIPT.parent.parent / "tests")!r})
import gpu_check
from fake_cupy import fake_cuda_backend, launch_in_numpy
from minitensor.backends import _BACKENDS, cublas_gemm

_BACKENDS["cuda"] = fake_cuda_backend()
cublas_gemm.launch = launch_in_numpy  # the bfloat16 products of precision "medium", in NumPy
device = gpu_check.Device("cuda", None)
(row,) = gpu_check.training_benchmark(device, quick=True)
print("graph column", row[5] != "-")
gpu_check.nanogpt_benchmark(device, quick=True, nanogpt_dir="/nonexistent", flags_file={str(flags)!r})
"""
    done = subprocess.run([sys.executable, "-c", code], cwd=SCRIPT.parent, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]
    out = done.stdout
    assert "FAILED" not in out, out[-3000:]
    assert out.count("[cuda graph, ") == 2 and out.count("of eager's (relative to each one's largest)") == 2
    assert "graph column True" in out and "minitensor, TF32, CUDA graph" in out
    assert "minitensor, bfloat16 autocast" in out  # --autocast on the CuPy backend (its bfloat16 arrays)
    assert flags.read_text() in ("--cuda-graph\n", "\n") and f"written to {flags}" in out  # (timings decide)


def test_the_recipe_run_adds_cuda_graph_where_the_check_found_it_faster():
    code = """
from _common import Stats
from gpu_check import recipe_flags

def timed(eager, graph=None):
    stats = {"minitensor, TF32": Stats.of([eager])}
    if graph is not None:
        stats["minitensor, TF32, CUDA graph"] = Stats.of([graph])
    return recipe_flags(stats)

print(timed(100.0, 60.0), timed(100.0, 97.0), timed(100.0))
"""
    done = subprocess.run([sys.executable, "-c", code], cwd=SCRIPT.parent, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    # within 5% a capture's risks are not worth it; no graph row: the capture or its check failed
    assert done.stdout.split("\n")[-2] == "['--cuda-graph'] [] []"
