"""One check of minitensor on an NVIDIA GPU: install, GPU tests, kernel and training-step benchmarks.

For a machine with a GPU and the packages already installed (CuPy with NVRTC, numba, pluggy,
safetensors, pytest; PyTorch optional) and no network:

    python bench/gpu_check.py

1. installs this checkout with ``pip install --no-deps --no-build-isolation -e .`` (nothing
   is downloaded; the checks run from this checkout even if that fails), then proves in
   seconds that CuPy and cuRAND work and compiles every CUDA kernel of
   ``minitensor/core/kernels/cuda`` (NVRTC; the time is what a first GPU run pays);
2. runs the tests marked ``gpu`` (``pytest -m gpu``): every op test on ``device="cuda"``, the
   CUDA kernels on CuPy arrays, DLPack, checkpoints across devices;
3. times the softmax kernels (CUDA C++, float32) against naive CuPy (the plain-array
   version in ``minitensor/core/kernels/reference.py``) and ``torch.softmax`` on the same GPU;
4. times dropout (minitensor's one-pass kernel: a counter-based hash per element, the mask
   and the product together) against one long-lived generator plus the product, and torch;
5. times a training step of the larger Transformer of ``bench/train_step.py`` (num_hiddens
   256, 8 heads, ffn 1024, 4 + 4 blocks, 64 tokens) at batch 64 and 1024 against its PyTorch
   twin on the same GPU, after checking that both compute the same loss from the same weights,
   and the host's share of a step (the time until the step's last launch returns: a step that
   waits for the GPU inside itself shows a host time equal to its full time), then where that
   host time goes (cProfile of 5 steps at batch 64, by each function's own time);
6. times causal attention at long T (``bench/long_attention.py``'s cases on the GPU: batch
   1, 8 heads, d_head 64, float32, T = 512 to 4096, forward + backward): minitensor's
   streamed ``flash_attention`` (on a GPU the kernels of ``kernels/cuda/attention.cu``)
   against its plain ``Attention`` (the (T, T) scores and weights) and
   ``torch.nn.functional.scaled_dot_product_attention``, after checking that they agree, and
   the peak device memory of each; then the streamed call with ALiBi's relative bias and with a
   learned table (its gradient too) against the same call without a bias;
7. times an iteration of nanoGPT's shakespeare_char GPU recipe (6 blocks of 384, context 256,
   batch 64, dropout 0.2) as ``minitensor train --preset gpt-char-gpu`` runs it, at TF32 (the
   preset's ``--matmul-precision high``) and in float32, against nanoGPT's own model and
   training loop on the same GPU in float32 (TF32, as its train.py sets) and bfloat16 autocast,
   from the same weights after checking that they compute the same loss. nanoGPT's ``model.py``
   is read from ``../shared/refbench/nanogpt`` beside the checkout, or ``--nanogpt DIR``.

The full recipe, 5,000 iterations with an estimate of the held-out loss every 250 (nanoGPT's
published figure: 1.47 nats per character), is a run of its own, at most 10 minutes:
``timeout 600 minitensor train --preset gpt-char-gpu --device cuda --no-progress --out DIR``.
``--recipe-flags FILE`` writes there the flags that run should add, from step 7's timings
(``--cuda-graph`` where its graph agreed with the eager step and was faster), for a command
that runs both on one lease of a GPU: ``... --out DIR $(cat FILE)``.

It prints medians and ratios, then the GPU targets with PASS / MISS (``--json FILE``: also as
JSON), and is meant to finish well within 5 minutes. GPU work is asynchronous, so every sample
ends with a synchronisation of the device and of PyTorch.

``--device cpu`` runs steps 3 to 7 on the CPU instead (numba CPU kernels, naive NumPy,
PyTorch CPU), which is how the test suite checks this script on machines without a GPU;
``--no-install`` and ``--no-tests`` skip steps 1 and 2; ``--quick`` shrinks the sizes.
"""

import argparse
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import replace

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# This checkout first, whether or not the install below works: a fresh editable install only
# takes effect in processes started after it (its .pth hook is read at start-up).
SOURCE_PATHS = [ROOT, os.path.join(ROOT, "plugins")]
sys.path[:0] = [HERE, *SOURCE_PATHS]

from _common import (  # noqa: E402
    Stats,
    format_ratio,
    format_stats,
    format_time,
    import_torch,
    print_table,
    verdict,
)
from train_step import CONFIGS, PAD, build_minitensor, build_torch, make_batches, minitensor_state  # noqa: E402

KERNEL_SHAPES = [(4096, 512), (32768, 64)]
TEST_BUDGET_S = 150  # of the 5 minutes the whole check may take
QUICK_KERNEL_SHAPES = [(256, 64)]
# 1024 and 4096 hold the targets; 512 and 2048 show where streaming starts to pay on a GPU
# (``MultiHeadAttention(fused="auto")`` streams from FUSED_MIN_LENGTH = 384, the CPU's crossover)
LONG_ATTENTION_T = (512, 1024, 2048, 4096)
QUICK_LONG_ATTENTION_T = (128,)


# -- the GPU targets (bench/README.md), judged from what the sections measure ------------------------
#: (key, what, the largest ratio allowed, the stretch's or None): each ratio is minitensor's time
#: (or memory) over its peer's, the worst where a section measures several. The full recipe's
#: held-out loss within 10 minutes is the recipe run's own (see the module docstring).
TARGETS = [
    ("softmax/torch", "softmax family / torch, each kernel at both shapes (worst)", 2.0, None),
    ("softmax/naive", "softmax family / naive CuPy (worst): never slower", 1.0, None),
    ("dropout/generator", "dropout, mask and product / one long-lived generator", 2.0, None),
    ("step 64/torch", "training step, batch 64 / PyTorch", 1.5, 1.2),
    ("step 64, graph/torch", "the same, forward and backward as a CUDA graph", 1.5, 1.2),
    ("step 1024/torch", "training step, batch 1024 / PyTorch", 1.2, None),
    ("step 1024, graph/torch", "the same, forward and backward as a CUDA graph", 1.2, None),
    ("fused/SDPA, T 4096", "flash_attention fwd+bwd at T = 4096 / SDPA", 2.0, None),
    ("fused/plain, T >= 1024", "flash_attention / the plain path, T >= 1024 (worst): faster", 1.0, None),
    ("peak fused/SDPA, T 4096", "flash_attention's peak memory at T = 4096 / SDPA's", 1.5, None),
    ("recipe/nanoGPT", "nanoGPT recipe iteration, TF32 / nanoGPT float32 (TF32)", 1.5, 1.0),
    ("recipe, graph/nanoGPT", "the same with --cuda-graph", 1.5, 1.0),
    ("recipe bfloat16/nanoGPT bfloat16", "stretch: bfloat16 products / nanoGPT's bfloat16 autocast", 1.5, None),
    ("recipe autocast/nanoGPT bfloat16", "stretch: --autocast (mt.autocast) / nanoGPT's bfloat16 autocast", 1.5, None),
]
MEASURED = {}  # key -> ratio, filled by the sections


def note_ratio(key, ratio):
    """Note a ratio for ``key``; where a section measures several, the worst counts."""
    MEASURED[key] = max(MEASURED.get(key, ratio), float(ratio))


def print_targets(device, json_file=None, failures=()):
    """The targets with what this run measured and PASS / MISS (``-``: not measured here, a
    section that failed or a peer that is missing), and, with ``json_file``, all of it as JSON
    for the README's table."""
    rows, judged = [], []
    for key, what, limit, stretch in TARGETS:
        value = MEASURED.get(key)
        ok = None if value is None else value <= limit
        stretched = None if value is None or stretch is None else value <= stretch
        shown = "-" if value is None else format_ratio(value)
        stretch_shown = (
            "" if stretch is None else f"<= {stretch:g}x " + ("-" if stretched is None else verdict(stretched))
        )
        rows.append([what, shown, f"<= {limit:g}x", "-" if ok is None else verdict(ok), stretch_shown])
        judged.append(
            dict(key=key, what=what, limit=limit, stretch=stretch, measured=value, ok=ok, stretch_ok=stretched)
        )
    print_table(
        ["target", "measured", "limit", "verdict", "stretch"],
        rows,
        title=f"Targets on {device.name} ({describe(device)})"
        + ("" if device.name == "cuda" else ": for information, the targets are a GPU's"),
    )
    if json_file:
        import datetime
        import json

        from minitensor.atomic import write_atomic

        report = dict(
            date=datetime.date.today().isoformat(), device=device.name, describe=describe(device),
            targets=judged, measured=MEASURED, failures=list(failures),
        )  # fmt: skip
        write_atomic(json_file, json.dumps(report, indent=1) + "\n")
        print(f"[targets] written to {json_file}")


# -- the device, for both libraries ------------------------------------------------------------------
class Device:
    """What the benchmarks need to know about the device: array module, kernels, how to wait."""

    def __init__(self, name, torch):
        import minitensor as mt

        self.name = name
        self.backend = mt.get_backend(name)  # raises a DeviceError naming what is missing
        self.xp = self.backend.xp
        self.torch = torch
        self.torch_device = None
        if torch is not None and (name == "cpu" or torch.cuda.is_available()):
            self.torch_device = "cpu" if name == "cpu" else "cuda"

    def sync(self):
        """Wait until everything queued on the device is done (a no-op on the CPU)."""
        if self.name != "cpu":
            self.xp.cuda.get_current_stream().synchronize()
            if self.torch_device == "cuda":
                self.torch.cuda.synchronize()

    def timed(self, fn, repeat):
        """A sample: the time per call of ``repeat`` back-to-back calls, the device drained after."""

        def run():
            self.sync()
            start = time.perf_counter()
            for _ in range(repeat):
                fn()
            self.sync()
            return (time.perf_counter() - start) / repeat

        return run

    def host_time(self, fn):
        """A sample of the host's share of ``fn()``: the time until its last launch returns, the
        device drained before and after (a step that waits for the GPU inside itself shows its
        full time here)."""

        def run():
            self.sync()
            start = time.perf_counter()
            fn()
            elapsed = time.perf_counter() - start
            self.sync()
            return elapsed

        return run


def peak_bytes(device, fn, torch_side=False):
    """The most device memory ``fn()`` holds at once beyond what was held before, in bytes:
    CuPy's pool watched at every allocation for minitensor, PyTorch's own counter for torch.
    None on the CPU."""
    if device.name == "cpu":
        return None
    device.sync()
    if torch_side:
        torch = device.torch
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - before
    cupy = device.xp
    pool = cupy.get_default_memory_pool()
    before = pool.used_bytes()
    peak = [before]

    def malloc(size):
        memory = pool.malloc(size)
        peak[0] = max(peak[0], pool.used_bytes())
        return memory

    cupy.cuda.set_allocator(malloc)
    try:
        fn()
        device.sync()
    finally:
        cupy.cuda.set_allocator(pool.malloc)
    return peak[0] - before


def interleaved_stats(cases, rounds, warmup):
    """Median over ``rounds`` samples of each case, alternating their order round by round."""
    names = list(cases)
    for _ in range(warmup):
        for name in names:
            cases[name]()
    samples = {name: [] for name in names}
    for i in range(rounds):
        for name in names if i % 2 == 0 else reversed(names):
            samples[name].append(cases[name]())
    return {name: Stats.of(values) for name, values in samples.items()}


def describe(device):
    lines = [f"Python {platform.python_version()}, numpy {np.__version__}"]
    try:
        import numba

        lines.append(f"numba {numba.__version__}")
    except Exception as e:  # the CPU kernels' compiler: the GPU path does not need it
        lines.append(f"numba unusable ({type(e).__name__}: {e})")
    if device.name != "cpu":
        cupy = device.xp
        props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
        name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
        lines.append(
            f"cupy {cupy.__version__}, GPU {name}, {props['totalGlobalMem'] / 2**30:.0f} GiB, "
            f"CUDA runtime {cupy.cuda.runtime.runtimeGetVersion()}"
        )
    if device.torch is not None:
        lines.append(f"torch {device.torch.__version__} on {device.torch_device or 'the CPU only (no CUDA build)'}")
    else:
        lines.append("torch not installed: its columns are left out")
    return "; ".join(lines)


# -- 1 and 2: install, GPU tests ---------------------------------------------------------------------
def install():
    """Best effort: the checks below run from this checkout either way (see SOURCE_PATHS)."""
    print("$ pip install --no-deps --no-build-isolation -e .", flush=True)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "-e", "."], cwd=ROOT
    )
    if done.returncode:
        print(f"gpu_check: pip install failed (exit code {done.returncode}); going on from the source tree", flush=True)


def preflight(device):
    """Seconds-long proof that each GPU piece works, before minutes of tests depend on them:
    a CuPy elementwise op and matrix product, device random numbers (cuRAND), and every
    CUDA kernel compiled (on a fresh machine NVRTC compiles them: the time is printed)."""
    ok = True
    if device.name != "cpu":
        start = time.perf_counter()
        try:
            names = device.backend.kernels.compile_all()
            print(f"preflight: {len(names)} CUDA kernels compiled or loaded in {time.perf_counter() - start:.2f} s")
        except Exception:  # the tests and benchmarks still run: one failing kernel must not cost them all
            ok = False
            print(f"preflight: compiling the CUDA kernels: FAILED\n{traceback.format_exc()}", flush=True)
    import minitensor as mt

    checks = [
        (
            "elementwise op + matrix product (CuPy on a GPU)",
            lambda: float(((device.xp.ones((64, 64)) * 2) @ device.xp.ones((64, 1))).sum()),
        ),
        ("random numbers on the device (cuRAND on a GPU)", lambda: mt.randn(4, device=device.name).numpy()),
        (
            "softmax kernel on a device array (CUDA C++ on a GPU)",
            lambda: device.backend.kernels.softmax_forward(device.xp.zeros((3, 5), "f4")),
        ),
    ]
    for name, check in checks:
        try:
            check()
            print(f"preflight: {name}: ok", flush=True)
        except Exception:
            ok = False
            print(f"preflight: {name}: FAILED\n{traceback.format_exc()}", flush=True)
    return ok


def run_gpu_tests(device):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(SOURCE_PATHS + [p for p in [env.get("PYTHONPATH")] if p])
    # -rfE --tb=line: each failure in one line as the run goes, so that a run stopped by the budget
    # below still shows which tests failed (-q alone prints them only at the end)
    args = [sys.executable, "-m", "pytest", "-q", "-rfE", "--tb=line", "-m", "gpu", "-p", "no:cacheprovider"]
    if parallel_ok(device):
        # test by test (worksteal), not the suite's whole files (tests/conftest.py): the gpu-marked
        # tests are the "cuda" cases of some thirty files, unevenly (test_gradients.py has the
        # most), and none takes a shared session fixture
        args += ["-n", str(min(8, os.cpu_count() or 1)), "--dist", "worksteal"]
    print("$ " + " ".join(["python"] + args[1:]), flush=True)
    start = time.perf_counter()
    # Its own process group, so that the budget below also ends pytest-xdist's workers.
    tests = subprocess.Popen(args, cwd=ROOT, env=env, start_new_session=True)
    try:
        # the benchmarks must still run inside the 5 minutes if CuPy's and numba's first-use
        # compilation makes the tests slow on a fresh machine
        returncode = tests.wait(timeout=TEST_BUDGET_S)
    except subprocess.TimeoutExpired:
        os.killpg(tests.pid, signal.SIGKILL)
        tests.wait()
        print(f"GPU tests: stopped after {TEST_BUDGET_S} s (not finished)", flush=True)
        return "timeout"
    print(f"GPU tests: exit code {returncode} in {time.perf_counter() - start:.0f} s", flush=True)
    return returncode


def parallel_ok(device):
    """pytest-xdist is there and the GPU takes several processes (compute mode 0: default,
    not exclusive-process)."""
    try:
        import xdist  # noqa: F401  (pytest-xdist: run the tests in parallel)
    except ImportError:
        return False
    if device.name == "cpu":
        return True
    props = device.xp.cuda.runtime.getDeviceProperties(device.xp.cuda.Device().id)
    return props.get("computeMode", 0) == 0


# -- 3: the softmax kernels -------------------------------------------------------------------------------
def kernel_cases(device, shape, kind, rng):
    """{name: callable} for one kernel on one shape: minitensor's fused kernel, the naive
    plain-array version, torch (when there)."""
    from minitensor.kernels import reference

    xp, kernels = device.xp, device.backend.kernels
    x = xp.asarray(rng.standard_normal(shape, dtype=np.float32) * 3)
    lens = xp.asarray(rng.integers(0, shape[1] + 1, shape[0]))
    y = kernels.softmax_forward(x)
    g = xp.asarray(rng.standard_normal(shape, dtype=np.float32))
    cases = {
        "softmax forward": {
            "minitensor": lambda: kernels.softmax_forward(x),
            "naive": lambda: reference.softmax_forward(xp, x),
        },
        "masked softmax forward": {
            "minitensor": lambda: kernels.softmax_forward(x, lens),
            "naive": lambda: reference.softmax_forward(xp, x, lens),
        },
        "softmax backward": {
            "minitensor": lambda: kernels.softmax_backward(y, g),
            "naive": lambda: reference.softmax_backward(xp, y, g),
        },
        "log_softmax forward": {
            "minitensor": lambda: kernels.log_softmax_forward(x),
            "naive": lambda: reference.log_softmax_forward(xp, x),
        },
    }[kind]
    torch = device.torch
    if device.torch_device is not None:
        tx = torch.from_dlpack(x)
        ty, tg = torch.from_dlpack(y), torch.from_dlpack(g)
        tmask = torch.arange(shape[1], device=tx.device)[None, :] >= torch.from_dlpack(lens)[:, None]
        cases["torch"] = {
            "softmax forward": lambda: torch.softmax(tx, -1),
            "masked softmax forward": lambda: torch.softmax(tx.masked_fill(tmask, float("-inf")), -1),
            # what autograd computes for softmax's backward, as one fused call
            "softmax backward": lambda: torch._softmax_backward_data(tg, ty, -1, torch.float32),
            "log_softmax forward": lambda: torch.log_softmax(tx, -1),
        }[kind]
    # agreement first: a fast wrong kernel is no result
    ours, naive = device.backend.to_numpy(cases["minitensor"]()), device.backend.to_numpy(cases["naive"]())
    np.testing.assert_allclose(ours, naive, rtol=1e-4, atol=1e-5, err_msg=f"{kind} {shape}: kernel vs naive")
    return cases


def kernel_benchmark(device, quick):
    rng = np.random.default_rng(0)
    rows = []
    repeat, rounds = (3, 5) if quick else (20, 15)
    for shape in QUICK_KERNEL_SHAPES if quick else KERNEL_SHAPES:
        for kind in ("softmax forward", "masked softmax forward", "softmax backward", "log_softmax forward"):
            cases = kernel_cases(device, shape, kind, rng)
            stats = interleaved_stats({k: device.timed(f, repeat) for k, f in cases.items()}, rounds, warmup=2)
            ours = stats["minitensor"]
            vs_naive = ours.median / stats["naive"].median
            note_ratio("softmax/naive", vs_naive)
            row = [kind, f"{shape}", format_stats(ours), format_stats(stats["naive"]), format_ratio(1 / vs_naive)]
            if "torch" in stats:
                vs_torch = ours.median / stats["torch"].median
                note_ratio("softmax/torch", vs_torch)
                row += [format_stats(stats["torch"]), format_ratio(vs_torch)]
            rows.append(row)
    headers = ["kernel", "shape", "minitensor", "naive", "naive/mt"]
    if device.torch_device is not None:
        headers += ["torch", "mt/torch"]
    print_table(headers, rows, title=f"Softmax kernels on {device.name}, float32: median time per call (±IQR/2)")
    return rows


def dropout_benchmark(device, quick):
    """Dropout's forward on attention weights: minitensor's one-pass kernel (element i kept
    where hash(seed, i) >= p 2^32, the product in the same pass) against one long-lived
    generator's uniform numbers, the comparison and the product, and torch's dropout."""
    import minitensor as mt

    shape, p = ((8, 64, 256) if quick else (64, 8, 64, 64)), 0.1  # the large config's attention weights
    x = mt.rand(*shape, device=device.name)
    xp, data = device.xp, x.data
    if device.name == "cpu":
        generator = np.random.default_rng(0)
        draw = lambda: generator.random(shape, dtype=np.float32)  # noqa: E731
    else:
        generator = xp.random.RandomState(0)
        draw = lambda: generator.random_sample(shape, dtype=np.float32)  # noqa: E731
    scale = np.float32(1 / (1 - p))
    cases = {
        "minitensor": lambda: mt.dropout(x, p, training=True),
        "one generator": lambda: data * ((draw() >= p) * scale),
    }
    if device.torch_device is not None:
        tx = device.torch.from_dlpack(data)
        cases["torch"] = lambda: device.torch.nn.functional.dropout(tx, p, training=True)
    kept = float((mt.dropout(x, p, training=True).data != 0).mean())
    if abs(kept - (1 - p)) > 0.01:
        raise SystemExit(f"dropout kept {kept:.3f} of the elements, expected {1 - p}")
    stats = interleaved_stats({k: device.timed(f, 10) for k, f in cases.items()}, 5 if quick else 15, warmup=2)
    headers = ["dropout p=0.1", *stats, "mt/one generator"]
    ratio = stats["minitensor"].median / stats["one generator"].median
    note_ratio("dropout/generator", ratio)
    row = [f"{shape}", *(format_stats(v) for v in stats.values()), format_ratio(ratio)]
    print_table(headers, [row], title=f"Dropout (mask and product) on {device.name}: median per call")
    return stats


# -- 4: a training step of the larger Transformer ---------------------------------------------------------
TRAINING_BATCH_SIZES = (64, 1024)


def training_benchmark(device, quick):
    rows = []
    for batch_size in (8,) if quick else TRAINING_BATCH_SIZES:
        cfg = replace(CONFIGS["large"], batch_size=batch_size)
        if quick:
            cfg = replace(cfg, name="quick", num_hiddens=32, ffn_num_hiddens=64, num_heads=4, num_blks=1, num_steps=8)
        rows.append(training_case(device, cfg))
    headers = ["config", "batch", "device", "minitensor", "mt host", "mt graph"]
    if len(rows[0]) > len(headers):
        headers += ["torch", "mt/torch", "graph/torch"]
    print_table(
        headers,
        rows,
        title=f"Training step (forward + loss + backward + Adam) on {device.name}: median; mt host = the time "
        "until the step returns, before the device is drained; mt graph = forward and backward replayed as a CUDA "
        "graph (--cuda-graph; GPU only)",
    )
    return rows


def training_case(device, cfg):
    import minitensor as mt

    batches = make_batches(cfg, n=4)
    mt_model, mt_opt = build_minitensor(cfg)
    state = minitensor_state(mt_model)
    mt_model.to(device.name)  # the same Parameter objects: the optimiser (no state yet) follows
    mt_data = [{k: mt.tensor(v, device=device.name) for k, v in b.items()} for b in batches]

    def mt_step(batch):
        mt_opt.zero_grad()
        logits = mt_model(batch["enc_X"], batch["dec_X"], batch["enc_valid_lens"])
        loss = mt.cross_entropy(logits, batch["Y"], mask=batch["mask"])
        loss.backward()
        mt_opt.step()
        return loss

    counter = {"minitensor": 0, "torch": 0}

    def next_batch(name, data):
        counter[name] += 1
        return data[counter[name] % len(data)]

    cases = {"minitensor": lambda: mt_step(next_batch("minitensor", mt_data))}
    if device.name == "cuda":  # the same step with its forward and backward replayed as a CUDA graph
        order = ("enc_X", "dec_X", "enc_valid_lens", "Y", "mask")
        graph_data = [tuple(b[k] for k in order) for b in mt_data]

        def graph_loss(b):
            enc_X, dec_X, enc_valid_lens, Y, mask = b
            return mt.cross_entropy(mt_model(enc_X, dec_X, enc_valid_lens), Y, mask=mask), None

        graphed = graphed_step(device, graph_loss, mt_opt, graph_data[0], f"{cfg.name}, batch {cfg.batch_size}")
        if graphed is not None:

            def graphed_train_step():
                counter["graph"] = counter.get("graph", 0) + 1
                loss, _ = graphed(graph_data[counter["graph"] % len(graph_data)])
                mt_opt.step()
                return loss

            cases["minitensor, CUDA graph"] = graphed_train_step
    torch = device.torch
    agreement = ""
    if device.torch_device is not None:
        t_model, _ = build_torch(torch, cfg, state=state)
        t_model.to(device.torch_device)
        t_opt = torch.optim.Adam(t_model.parameters(), lr=mt_opt.param_groups[0]["lr"])
        t_data = [
            {k: torch.from_numpy(np.ascontiguousarray(v)).to(device.torch_device) for k, v in b.items()}
            for b in batches
        ]

        def t_step(batch):
            t_opt.zero_grad()
            logits = t_model(batch["enc_X"], batch["dec_X"], batch["enc_valid_lens"])
            loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), batch["Y"].reshape(-1), ignore_index=PAD
            )
            loss.backward()
            t_opt.step()
            return loss

        # the same weights, dropout off: the same loss (TF32 matmuls on the GPU allow ~1e-3)
        mt_model.eval()
        t_model.eval()
        with mt.no_grad(), torch.no_grad():
            b = mt_data[0]
            ours = mt.cross_entropy(mt_model(b["enc_X"], b["dec_X"], b["enc_valid_lens"]), b["Y"], mask=b["mask"])
            tb = t_data[0]
            logits = t_model(tb["enc_X"], tb["dec_X"], tb["enc_valid_lens"])
            theirs = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), tb["Y"].reshape(-1), ignore_index=PAD
            )
        rel = abs(ours.item() - theirs.item()) / abs(theirs.item())
        agreement = (
            f"same weights, no dropout: loss {ours.item():.5f} vs torch {theirs.item():.5f} (rel. diff {rel:.1e})"
        )
        if rel > 1e-2:
            raise SystemExit(f"minitensor and the PyTorch twin disagree on {device.name}: {agreement}")
        mt_model.train()
        t_model.train()
        cases["torch"] = lambda: t_step(next_batch("torch", t_data))

    rounds, warmup = (3, 1) if cfg.name == "quick" else (10, 3)
    timed = {k: device.timed(f, 1) for k, f in cases.items()}
    stats = interleaved_stats({**timed, "host": device.host_time(cases["minitensor"])}, rounds, warmup)
    row = [cfg.name, cfg.batch_size, device.name, format_stats(stats["minitensor"]), format_stats(stats["host"])]
    graph = stats.get("minitensor, CUDA graph")
    row += [format_stats(graph) if graph else "-"]
    if "torch" in stats:
        vs_torch = stats["minitensor"].median / stats["torch"].median
        note_ratio(f"step {cfg.batch_size}/torch", vs_torch)
        row += [format_stats(stats["torch"]), format_ratio(vs_torch), "-"]
        if graph:
            graph_vs_torch = graph.median / stats["torch"].median
            note_ratio(f"step {cfg.batch_size}, graph/torch", graph_vs_torch)
            row[-1] = format_ratio(graph_vs_torch)
    print(f"\n[{cfg.name}] {cfg.describe()}; {sum(int(p.numel()) for p in mt_model.parameters()):,} parameters")
    if agreement:
        print(f"[{cfg.name}, batch {cfg.batch_size}] {agreement}")
    if cfg.batch_size == TRAINING_BATCH_SIZES[0] or cfg.name == "quick":
        profile_host(device, cases["minitensor"], f"{cfg.name}, batch {cfg.batch_size}")
    return row


def graphed_step(device, loss_fn, optimizer, batch, what):
    """A ``GraphedStep`` (``minitensor train --cuda-graph``: forward, loss and backward captured as a
    CUDA graph, replayed by one launch) of ``loss_fn`` (batch -> (loss, tokens)), captured on
    ``batch`` after its warm-up steps. It checks its first replay itself, as in every run: the
    loss and the gradients of the same step run eagerly, dropout included (the same seeds; the
    products to float32's or TF32's rounding: a capture's are cuBLAS calls of its own); printed
    here. None, with the error printed, where the capture or the check fails: this may be the
    first run of a capture on a GPU."""
    from minitensor.train.graphed import WARMUP_STEPS, GraphedStep

    graphed = GraphedStep(loss_fn, optimizer)
    try:
        for _ in range(WARMUP_STEPS):
            if graphed(batch) is not None:
                raise RuntimeError("the graph was captured before its warm-up steps")
            optimizer.zero_grad()
            loss_fn(batch)[0].backward()
        start = time.perf_counter()
        graphed(batch)
        made = time.perf_counter() - start
        ((got_loss, want_loss, worst),) = graphed.first_replays.values()
        print(
            f"[cuda graph, {what}] captured, checked and replayed in {format_time(made)}: loss {got_loss:.6f} vs "
            f"eager {want_loss:.6f}; gradients within {worst:.1e} of eager's (relative to each one's largest)"
        )
    except Exception:
        print(f"[cuda graph, {what}] FAILED\n{traceback.format_exc()}", flush=True)
        return None
    return graphed


def profile_host(device, step, what, steps=5, top=20, per_call=1):
    """Where the host's time in a step goes (cProfile over ``steps`` calls of ``step``, each
    ``per_call`` training steps; the functions with the most time of their own): on a GPU, what
    to fuse or cut next."""
    import cProfile
    import pstats

    device.sync()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(steps):
        step()
    profiler.disable()
    device.sync()
    print(f"\n[{what}] host profile of {steps * per_call} training steps on {device.name}, by own time (top {top}):")
    pstats.Stats(profiler).sort_stats("tottime").print_stats(top)


# -- 6: causal attention at long T: streamed vs plain vs SDPA -----------------------------------------------
def long_attention_benchmark(device, quick):
    """Forward + backward of causal self-attention, batch 1, 8 heads, d_head 64, float32 (the
    cases of ``bench/long_attention.py``, time only): ``flash_attention`` (streamed over
    tiles) against the plain ``Attention`` and torch's ``scaled_dot_product_attention``. On a
    GPU, also the streamed kernels with one walker a row, where the launcher splits each row's
    keys among several on a grid too small to fill the GPU (``attention.cu``): what splitting
    gains, measured."""
    from minitensor.backends import get_backend
    from minitensor.kernels.cuda import attention_split
    from minitensor.ops.flash_attention import flash_attention

    import minitensor as mt

    kernels = getattr(get_backend(device.name), "attention_kernels", None)
    kernels = kernels if hasattr(kernels, "attention_splits") else None  # the CUDA kernels, not the CPU's tiles

    rng = np.random.default_rng(0)
    attn = mt.nn.Attention("scaled_dot", "softmax")
    torch = device.torch
    rows, agreement = [], []
    for T in QUICK_LONG_ATTENTION_T if quick else LONG_ATTENTION_T:
        q, k, v, g = (rng.standard_normal((1, 8, T, 64), dtype=np.float32) for _ in range(4))
        leaves = [mt.tensor(x, requires_grad=True, device=device.name) for x in (q, k, v)]
        grad = mt.tensor(g, device=device.name)

        def mt_step(fused, leaves=leaves, grad=grad):
            for leaf in leaves:
                leaf.grad = None
            out = flash_attention(*leaves, causal=True) if fused else attn(*leaves, causal=True)
            out.backward(grad)
            return [out] + [leaf.grad for leaf in leaves]

        cases = {"fused": lambda step=mt_step: step(True), "plain": lambda step=mt_step: step(False)}
        to_numpy = {"fused": mt.Tensor.numpy, "plain": mt.Tensor.numpy}
        if kernels is not None:

            def one_walker(step=mt_step):
                kept, kernels.fixed_splits = kernels.fixed_splits, 1
                try:
                    return step(True)
                finally:
                    kernels.fixed_splits = kept

            cases["fused, 1 walker"] = one_walker
            to_numpy["fused, 1 walker"] = mt.Tensor.numpy
        if device.torch_device is not None:
            t_leaves = [torch.from_numpy(x).to(device.torch_device).requires_grad_() for x in (q, k, v)]
            t_grad = torch.from_numpy(g).to(device.torch_device)

            def sdpa_step(leaves=t_leaves, grad=t_grad):
                for leaf in leaves:
                    leaf.grad = None
                out = torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=True)
                out.backward(grad)
                return [out] + [leaf.grad for leaf in leaves]

            cases["SDPA"] = sdpa_step
            to_numpy["SDPA"] = lambda x: x.detach().cpu().numpy()
        # agreement first: output and the gradients of q, k, v, against the plain path
        results = {name: [to_numpy[name](x) for x in fn()] for name, fn in cases.items()}
        worst = 0.0
        for name in cases:
            for what, got, want in zip(("output", "dq", "dk", "dv"), results[name], results["plain"]):
                np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3, err_msg=f"T={T} {name} vs plain: {what}")
                worst = max(worst, float(np.abs(got - want).max()))
        agreement.append(f"T={T}: {worst:.1e}")
        rounds, warmup = (2, 0) if quick else (10, 2)  # (the agreement check warmed them up)
        stats = interleaved_stats({name: device.timed(fn, 1) for name, fn in cases.items()}, rounds, warmup)
        vs_plain = stats["fused"].median / stats["plain"].median
        row = [T, format_stats(stats["fused"]), format_stats(stats["plain"]), format_ratio(vs_plain)]
        if T >= 1024:
            note_ratio("fused/plain, T >= 1024", vs_plain)
        if kernels is not None:  # the walkers the launcher picked (forward) and the time with one
            split = attention_split(np.float32, kernels.attention_row_size(np.float32, 64))  # threads a row
            row += [kernels.attention_splits(8 * T, split), format_stats(stats["fused, 1 walker"])]
        if "SDPA" in stats:
            vs_sdpa = stats["fused"].median / stats["SDPA"].median
            if T == 4096:
                note_ratio("fused/SDPA, T 4096", vs_sdpa)
            row += [format_stats(stats["SDPA"]), format_ratio(vs_sdpa)]
        measured = [name for name in cases if name != "fused, 1 walker"]
        peaks = {name: peak_bytes(device, cases[name], torch_side=name == "SDPA") for name in measured}
        if peaks["fused"] is not None:
            row += [f"{peaks[name] / 2**20:.0f} MiB" for name in measured]
            if "SDPA" in peaks:
                peak_ratio = peaks["fused"] / max(peaks["SDPA"], 1)
                if T == 4096:
                    note_ratio("peak fused/SDPA, T 4096", peak_ratio)
                row.append(format_ratio(peak_ratio))
        rows.append(row)
    headers = ["T", "fused", "plain", "fused/plain"]
    if kernels is not None:
        headers += ["walkers", "fused, 1 walker"]
    if device.torch_device is not None:
        headers += ["SDPA", "fused/SDPA"]
    if peaks["fused"] is not None:  # (the CPU has no pool to watch)
        headers += [f"peak {name}" for name in measured]
        if device.torch_device is not None:
            headers.append("peak fused/SDPA")
    print(
        "\nlong attention: outputs and gradients agree with the plain path, largest |difference| "
        + ", ".join(agreement)
    )
    print_table(
        headers,
        rows,
        title=f"Causal attention, batch 1, 8 heads, d_head 64, float32, forward + backward on {device.name}: "
        "median per call (±IQR/2)",
    )
    return rows


def relative_bias_benchmark(device, quick):
    """Streamed causal attention with ALiBi's relative bias and with a learned table (T5's kind:
    the table's gradient too) against the same call without a bias, at the cases of section 6:
    what the bias costs the kernels, after checking them against the plain path with the dense
    (heads, T, T) bias."""
    from minitensor.ops.flash_attention import flash_attention

    import minitensor as mt

    rng = np.random.default_rng(1)
    attn = mt.nn.Attention("scaled_dot", "softmax")
    encoding = mt.plugins.lookup("positional encoding", "alibi")(8, device=device.name)  # ALiBi, 8 heads
    rows, agreement = [], []
    for T in QUICK_LONG_ATTENTION_T if quick else LONG_ATTENTION_T:
        q, k, v, g = (rng.standard_normal((1, 8, T, 64), dtype=np.float32) for _ in range(4))
        leaves = [mt.tensor(x, requires_grad=True, device=device.name) for x in (q, k, v)]
        grad = mt.tensor(g, device=device.name)
        alibi = encoding.relative_bias(-(T - 1), T - 1)  # (8, 2 T - 1), as a streamed layer reads it
        learned = alibi.detach().requires_grad_()  # the same numbers, as a table that learns

        def step(table, leaves=leaves, grad=grad):
            for leaf in leaves + ([table] if table is not None else []):
                leaf.grad = None
            flash_attention(*leaves, causal=True, relative_bias=table).backward(grad)
            return [leaf.grad for leaf in leaves]

        cases = {
            "no bias": lambda step=step: step(None),
            "ALiBi": lambda step=step, table=alibi: step(table),
            "learned": lambda step=step, table=learned: step(table),
        }
        # agreement: the learned table's call against the plain path with its dense bias
        for leaf in leaves:
            leaf.grad = None
        attn(*leaves, causal=True, bias=encoding(T, T)).backward(grad)
        want = [leaf.grad.numpy() for leaf in leaves]
        got = [x.numpy() for x in cases["learned"]()]
        worst = max(float(np.abs(a - b).max()) for a, b in zip(got, want))
        np.testing.assert_allclose(np.concatenate([a.ravel() for a in got]), np.concatenate([b.ravel() for b in want]),
                                   rtol=1e-3, atol=1e-3, err_msg=f"T={T}: streamed with a bias vs plain")  # fmt: skip
        agreement.append(f"T={T}: {worst:.1e}")
        rounds, warmup = (2, 0) if quick else (10, 2)
        stats = interleaved_stats({name: device.timed(fn, 1) for name, fn in cases.items()}, rounds, warmup)
        base = stats["no bias"].median
        rows.append([T] + [format_stats(stats[name]) for name in cases]
                    + [format_ratio(stats[name].median / base) for name in ("ALiBi", "learned")])  # fmt: skip
    print("\nrelative bias: gradients agree with the plain path and its dense bias, largest |difference| "
          + ", ".join(agreement))  # fmt: skip
    print_table(
        ["T", "no bias", "ALiBi", "learned table", "ALiBi/no bias", "learned/no bias"],
        rows,
        title=f"Streamed causal attention with a relative bias, batch 1, 8 heads, d_head 64, float32, forward + "
        f"backward on {device.name}: median per call (±IQR/2)",
    )
    return rows


# -- 7: nanoGPT's shakespeare_char GPU recipe, an iteration side by side ------------------------------
# nanoGPT's code (MIT), never part of the project: beside the checkout, or copied into the ignored
# .refbench/ of a checkout that travels to a machine without the folder beside it
NANOGPT_DIRS = (
    os.path.join(os.path.dirname(ROOT), "shared", "refbench", "nanogpt"),
    os.path.join(ROOT, ".refbench", "nanogpt"),
)
NANOGPT_DIR = next((d for d in NANOGPT_DIRS if os.path.isfile(os.path.join(d, "model.py"))), NANOGPT_DIRS[0])
NANOGPT_ITERATIONS = 10  # back to back per sample: one of them reads the loss, as both training loops do
QUICK_GPT = dict(num_hiddens=32, ffn_num_hiddens=128, num_heads=4, num_blks=2, lm_num_steps=16, batch_size=4)


def endless(loader):
    """The loader's minibatches epoch after epoch (each pass over it is the next epoch)."""
    while True:
        yield from loader


def nanogpt_benchmark(device, quick, nanogpt_dir=NANOGPT_DIR, flags_file=None):
    """An iteration of nanoGPT's ``config/train_shakespeare_char.py`` (6 blocks of 384, 6 heads,
    context 256, batch 64, dropout 0.2; 10.7 M parameters) as ``minitensor train --preset
    gpt-char-gpu`` runs it (``loop.train_step``: the batch drawn and uploaded, forward, loss,
    backward, clipping, AdamW, schedule; the losses read every 10 steps) against nanoGPT's own
    ``GPT`` as its ``train.py`` runs it (fused AdamW, TF32 matrix products, ``get_batch``'s
    pinned upload, ``loss.item()`` every 10 iterations) in float32 and in bfloat16 autocast
    (its default on a GPU that has bfloat16), from the same weights after checking that both
    compute the same loss. minitensor runs at the preset's ``--matmul-precision high`` (TF32,
    as nanoGPT), at ``highest``, at ``medium`` (its products on bfloat16 tensor cores, beside
    nanoGPT's bfloat16 autocast), with ``--autocast`` (``mt.autocast``: bfloat16 activations
    between the products too, as nanoGPT's autocast, the products on bfloat16 tensor cores at the
    preset's precision), and once more at TF32 with its attention streamed
    (``--fused on``: the CUDA attention kernels with the weights' dropout inside, three launches
    an attention each way where the plain path at context 256, which ``--fused auto`` takes,
    runs some 30 CuPy operators with cuBLAS's products; nanoGPT runs SDPA's fused kernel).
    nanoGPT's ``model.py`` is read from ``nanogpt_dir`` (``--nanogpt``); without it, from
    ``_gpt_twin.py`` (the same model without dropout). ``flags_file``: where to write the flags
    that the full recipe's run should add (``recipe_flags``)."""
    import contextlib
    import io

    from gpt_char import cut, load_nanogpt

    import minitensor as mt
    from minitensor.data import TEXTS
    from minitensor.train import loop
    from minitensor.train.config import TrainConfig
    from minitensor.train.run import RunFolder

    folder = tempfile.TemporaryDirectory(prefix="gpu-check-")  # the run folder set_up wants, deleted after
    config = TrainConfig.recipe(
        preset="gpt-char-gpu", text=TEXTS["tinyshakespeare"], device=device.name, progress=False,
        out=os.path.join(folder.name, "run"), **(QUICK_GPT if quick else {}),
    )  # fmt: skip
    cases, torch, agreement = {}, device.torch, ""
    with folder, RunFolder(config.out) as run:
        state = loop.set_up(config, run, lambda message: None, resume=False)
        state.model.train()
        batches = endless(state.loader)  # an epoch of the real recipe is 62 batches, fewer than the samples take

        attention_layers = [m for m in state.model.modules() if isinstance(m, mt.nn.MultiHeadAttention)]

        def mt_iterations(precision, fused="auto", graphed=None, autocast=False):
            def run_them():
                mt.set_float32_matmul_precision(precision)
                for layer in attention_layers:
                    layer.fused = fused
                state.graphed = graphed  # None: eager
                state.config = replace(config, autocast=autocast)  # --autocast
                for _ in range(NANOGPT_ITERATIONS):
                    loop.train_step(state, next(batches))
                state.graphed, state.config = None, config

            return run_them

        cases["minitensor, TF32"] = mt_iterations("high")
        cases["minitensor, float32"] = mt_iterations("highest")
        cases["minitensor, TF32, attention streamed"] = mt_iterations("high", fused=True)
        if device.name == "cuda":  # --cuda-graph: forward and backward replayed as one CUDA graph
            mt.set_float32_matmul_precision("high")  # captured with the products it will replay
            pad = loop._pad(state.data.tgt_vocab)
            graphed = graphed_step(
                device,
                lambda b: loop._loss(state.model, b, config, pad),
                state.optimizer,
                next(batches),
                "recipe, TF32",
            )
            if graphed is not None:
                cases["minitensor, TF32, CUDA graph"] = mt_iterations("high", graphed=graphed)
        # bfloat16 tensor cores for minitensor's products (backends/cublas_gemm.py): the stretch's
        # counterpart of nanoGPT's bfloat16 autocast (whose activations are bfloat16 too). Its cuBLAS
        # call runs here for the first time on a GPU: if it fails, the rest of the table still comes
        medium_failure = probe_medium(device)
        if medium_failure is None:
            cases["minitensor, bfloat16 products (medium)"] = mt_iterations("medium")
            # --autocast (mt.autocast): bfloat16 activations between the products too, as nanoGPT's, at
            # the preset's precision: its products' operands hold bfloat16 values, which the bfloat16
            # tensor cores multiply exactly, so it takes them whatever the precision (rounded_matmul)
            cases["minitensor, bfloat16 autocast"] = mt_iterations("high", autocast=True)
        n_params = sum(int(p.numel()) for p in state.model.parameters())
        if device.torch_device is not None:
            from _gpt_twin import twin_state  # imports torch

            nanogpt = load_nanogpt(nanogpt_dir)
            source = f"nanoGPT's model.py ({nanogpt_dir})"
            if nanogpt is None:
                import _gpt_twin as nanogpt

                source = "bench/_gpt_twin.py (nanoGPT's model.py not found: --nanogpt DIR; the twin has no dropout)"
            c, vocab_size = config, len(state.data.tgt_vocab)
            options = dict(block_size=c.lm_num_steps, vocab_size=vocab_size, n_layer=c.num_blks, n_head=c.num_heads,
                           n_embd=c.num_hiddens, bias=c.bias)  # fmt: skip
            if "dropout" in nanogpt.GPTConfig.__dataclass_fields__:
                options["dropout"] = c.dropout
            with contextlib.redirect_stdout(io.StringIO()):  # it prints its parameter count and fused AdamW
                model = nanogpt.GPT(nanogpt.GPTConfig(**options))
                mt_weights = {n: p.numpy() for n, p in state.model.named_parameters()}
                weights = twin_state(mt_weights, c.num_blks)
                weights.pop("lm_head.weight", None)  # tied: the one Parameter is transformer.wte.weight
                model.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in weights.items()}, strict=False)
                model.to(device.torch_device)
                if hasattr(model, "configure_optimizers"):
                    optimizer = model.configure_optimizers(c.weight_decay, c.lr, tuple(c.betas), device.torch_device)
                else:
                    optimizer = nanogpt.configure_optimizer(model, c.lr, tuple(c.betas), c.weight_decay)
            if device.torch_device == "cuda":  # train.py's
                torch.backends.cuda.matmul.allow_tf32 = True
                torch.backends.cudnn.allow_tf32 = True
            train_ids = np.asarray(state.data.train, dtype=np.int64)
            rng = np.random.default_rng(0)

            def get_batch():  # nanoGPT's: random windows, pinned and sent without waiting
                X, Y = cut(train_ids, rng.integers(0, len(train_ids) - c.lm_num_steps, c.batch_size), c.lm_num_steps)
                X, Y = torch.from_numpy(X), torch.from_numpy(Y)
                if device.torch_device == "cuda":
                    return X.pin_memory().to("cuda", non_blocking=True), Y.pin_memory().to("cuda", non_blocking=True)
                return X, Y

            def torch_iterations(dtype):
                autocast = torch.amp.autocast(device_type=device.torch_device, dtype=dtype) if dtype else None

                def run_them():
                    X, Y = get_batch()
                    for i in range(NANOGPT_ITERATIONS):
                        with autocast or contextlib.nullcontext():
                            _, loss = model(X, Y)
                        X, Y = get_batch()  # train.py prefetches the next batch while the GPU works
                        loss.backward()
                        torch.nn.utils.clip_grad_norm_(model.parameters(), c.clip_grad_norm)
                        optimizer.step()
                        optimizer.zero_grad(set_to_none=True)
                        if i == 0:
                            loss.item()  # train.py's log line, every 10 iterations

                return run_them

            # the same weights, no dropout: the same loss (TF32 products on both sides)
            mt.set_float32_matmul_precision("high")
            state.model.eval()
            model.eval()
            X, Y = get_batch()
            with mt.no_grad(), torch.no_grad():
                ours = mt.cross_entropy(state.model(mt.tensor(X.cpu().numpy(), device=device.name)),
                                        mt.tensor(Y.cpu().numpy(), device=device.name)).item()  # fmt: skip
                theirs = model(X, Y)[1].item()
            state.model.train()
            model.train()
            rel = abs(ours - theirs) / abs(theirs)
            agreement = f"same weights, no dropout: loss {ours:.5f} vs nanoGPT {theirs:.5f} (rel. diff {rel:.1e})"
            print(f"\n[nanoGPT recipe] {source}; {n_params:,} parameters; {agreement}")
            if rel > 1e-2:
                raise SystemExit(f"minitensor and nanoGPT disagree on {device.name}: {agreement}")
            cases["nanoGPT, float32 (TF32)"] = torch_iterations(None)
            if device.torch_device == "cuda" and torch.cuda.is_bf16_supported():
                cases["nanoGPT, bfloat16 autocast"] = torch_iterations(torch.bfloat16)
        rounds, warmup = (2, 1) if quick else (5, 1)
        tf32 = cases["minitensor, TF32"]
        timed = {k: device.timed(f, 1) for k, f in cases.items()}
        stats = interleaved_stats({**timed, "minitensor, TF32, host's share": device.host_time(tf32)}, rounds, warmup)
        # where the host's time goes, to cut next: the functions with the most time of their own
        profile_host(device, tf32, "nanoGPT recipe, TF32", steps=1, top=15, per_call=NANOGPT_ITERATIONS)
        mt.set_float32_matmul_precision("highest")
        for layer in attention_layers:
            layer.fused = "auto"
    references = {
        f"/ {name}": stats[name] for name in ("nanoGPT, float32 (TF32)", "nanoGPT, bfloat16 autocast") if name in stats
    }
    for key, ours, theirs in (
        ("recipe/nanoGPT", "minitensor, TF32", "nanoGPT, float32 (TF32)"),
        ("recipe, graph/nanoGPT", "minitensor, TF32, CUDA graph", "nanoGPT, float32 (TF32)"),
        ("recipe bfloat16/nanoGPT bfloat16", "minitensor, bfloat16 products (medium)", "nanoGPT, bfloat16 autocast"),
        ("recipe autocast/nanoGPT bfloat16", "minitensor, bfloat16 autocast", "nanoGPT, bfloat16 autocast"),
    ):
        if ours in stats and theirs in stats:
            note_ratio(key, stats[ours].median / stats[theirs].median)
    rows = []
    for name, st in stats.items():
        rows.append([name, format_time(st.median / NANOGPT_ITERATIONS)])
        rows[-1] += [format_ratio(st.median / ref.median) for ref in references.values()]
    print_table(
        ["what", "per iteration", *references],
        rows,
        title=f"nanoGPT's shakespeare_char GPU recipe ({config.num_blks} x {config.num_hiddens}, "
        f"{config.num_heads} heads, context {config.lm_num_steps}, batch {config.batch_size}, dropout "
        f"{config.dropout:g}) on {device.name}: median time per training iteration "
        f"({NANOGPT_ITERATIONS} back to back per sample); target minitensor TF32 <= 1.5x nanoGPT float32, "
        "stretch bfloat16 <= 1.5x nanoGPT bfloat16",
    )
    if flags_file:
        from minitensor.atomic import write_atomic

        flags = recipe_flags(stats)
        write_atomic(flags_file, " ".join(flags) + "\n")
        print(f"[recipe flags] {' '.join(flags) or '(none)'} written to {flags_file}: for the full recipe's run")
    if medium_failure is not None:
        raise RuntimeError(f"the recipe at matmul precision medium did not run: {medium_failure}")
    return rows


def recipe_flags(stats):
    """The flags the full recipe's run (``minitensor train --preset gpt-char-gpu``) should add,
    from the recipe's timings (name -> stats with a ``median``): ``--cuda-graph`` where the
    graph was captured, its replay agreed with the eager step (``graphed_step``; else it has no
    row) and it made an iteration at least 5% faster than the eager one. A check and a full run
    may share one short lease of a GPU: the run then takes what the check measured."""
    eager, graph = stats.get("minitensor, TF32"), stats.get("minitensor, TF32, CUDA graph")
    return ["--cuda-graph"] if eager and graph and graph.median < 0.95 * eager.median else []


def probe_medium(device):
    """None if a float32 product at precision "medium" (cuBLAS's bfloat16 path) runs on ``device``
    and is within bfloat16's error of the float32 one, else what went wrong (printed)."""
    import minitensor as mt

    rng = np.random.default_rng(0)
    a, b = (mt.tensor(rng.standard_normal((256, 512)), dtype=mt.float32, device=device.name) for _ in range(2))
    try:
        mt.set_float32_matmul_precision("highest")
        exact = (a @ b.T).numpy()
        mt.set_float32_matmul_precision("medium")
        error = float(np.abs((a @ b.T).numpy() - exact).max() / np.abs(exact).max())
    except Exception as e:  # (a cuBLAS error, say)
        failure = f"{type(e).__name__}: {e}"
    else:
        failure = None if error < 3e-2 else f"relative error {error:.1e}, more than bfloat16's"
        print(f"[matmul precision medium] a (256, 512) x (512, 256) product: relative error {error:.1e}")
    finally:
        mt.set_float32_matmul_precision("highest")
    if failure:
        print(f"[matmul precision medium] FAILED: {failure}")
    return failure


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu (for machines without a GPU)")
    parser.add_argument("--no-install", action="store_true", help="skip pip install -e .")
    parser.add_argument("--no-tests", action="store_true", help="skip the GPU-marked tests")
    parser.add_argument("--quick", action="store_true", help="small sizes, few rounds")
    parser.add_argument("--nanogpt", default=NANOGPT_DIR, help="the folder of nanoGPT's model.py (a reference)")
    parser.add_argument(
        "--recipe-flags",
        metavar="FILE",
        help="write there the flags the full recipe's run should add (--cuda-graph where it paid); empty if unsure",
    )
    parser.add_argument("--json", metavar="FILE", help="write there the targets and what this run measured, as JSON")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    if args.recipe_flags:  # none until the recipe's section says otherwise, even if it fails
        from minitensor.atomic import write_atomic

        write_atomic(args.recipe_flags, "\n")
    if not args.no_install:
        install()
    import minitensor as mt

    try:
        device = Device(args.device, import_torch())
    except mt.DeviceError as e:
        print(f"gpu_check: {e}", file=sys.stderr)
        return 1
    print(
        f"minitensor {mt.__version__} from {os.path.dirname(mt.__file__)} on {args.device}: {describe(device)}",
        flush=True,
    )
    failures = []
    if not preflight(device):
        failures.append("preflight")
    if not args.no_tests:
        result = run_gpu_tests(device)
        if result:
            failures.append(f"GPU tests ({result})")
    # one failing section must not cost the others: this may be the only run on a GPU
    for name, section in (
        ("kernel benchmark", kernel_benchmark),
        ("dropout benchmark", dropout_benchmark),
        ("training benchmark", training_benchmark),
        ("long attention benchmark", long_attention_benchmark),
        ("relative bias benchmark", relative_bias_benchmark),
        (
            "nanoGPT recipe benchmark",
            lambda device, quick: nanogpt_benchmark(device, quick, args.nanogpt, args.recipe_flags),
        ),
    ):
        try:
            section(device, args.quick)
        except (Exception, SystemExit):
            failures.append(name)
            print(f"{name}: FAILED\n{traceback.format_exc()}", flush=True)
    print_targets(device, args.json, failures)
    print(
        f"\ngpu_check finished in {format_time(time.perf_counter() - start)}"
        + (f"; FAILED: {', '.join(failures)}" if failures else "; everything passed")
    )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
