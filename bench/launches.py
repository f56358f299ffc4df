"""Kernel launches per training step: minitensor on the GPU backend vs PyTorch's dispatched ops.

Why count launches
------------------
On a GPU the training step of a small model is bound by the host, not the device: every CuPy
operator is one kernel launch that costs 5-20 microseconds of Python and driver time, while
the kernel itself, on a few thousand elements, runs for a few. The step takes about (number
of launches) x (cost of one), so the number of launches is what to cut, and it can be counted
without a GPU.

minitensor's count: the step runs on the CuPy backend (``CupyBackend``, the code a GPU runs)
built on the tests' CuPy stand-in (``tests/fake_cupy.py``: NumPy behind CuPy's manners, the
CUDA kernels replaced by CPU kernels that compute the same), and the stand-in records every
operation CuPy would launch (``tests/strict_backend.py``'s ``count_launches``: each operator,
each ``xp`` function that computes an array, each kernel with the launches its CUDA method adds,
the copies ``cupy.matmul`` makes of its operands; views and bare allocations are free). The
stand-in is test code, not part of the package, so this script puts ``tests/`` on ``sys.path``
beside its own folder.

PyTorch's count: the ATen operators dispatched in one step (a ``TorchDispatchMode`` sees each
operator below autograd, after PyTorch's own decompositions, about one kernel each on a GPU),
views, bare allocations (``empty``) and the few operators that launch nothing (``NO_KERNEL``)
left out, as for minitensor. It runs on the CPU with the optimisers a GPU step would use (fused
AdamW, foreach Adam), so it dispatches the operators of a GPU step.

The models
----------
- ``gpt``: nanoGPT's GPU recipe (``--preset gpt-char-gpu``: GELU, tied embeddings, no biases,
  dropout 0.2, AdamW with decay groups, cosine schedule, clipping at 1.0) at a small size
  (num_hiddens 48, 6 heads, 6 blocks, 32 tokens, batch 4), against nanoGPT's own ``model.py``
  (``../shared/refbench/nanogpt``, loaded from its file as ``bench/gpt_char.py`` does; without it
  the PyTorch column is skipped) with the optimiser it configures for a GPU (fused AdamW) and
  ``clip_grad_norm_``.
- ``transformer``: the encoder-decoder of ``bench/train_step.py`` (D2L's configuration, Adam,
  no clipping) against its PyTorch twin from that script, with foreach Adam.

Each step is counted by phase (forward with the loss, backward, clipping, optimiser with the
schedule and zero_grad) after two warm-up steps; ``--by-file`` adds where minitensor's launches
come from. Target: minitensor's launches per step <= 1.2x PyTorch's dispatched ops.
``--quick`` counts the GPT with 2 blocks instead of 6 (the transformer is the same).

Last, one streamed causal ``flash_attention`` call, forward + backward at T = 1,024 (8 heads,
d_head 64), without a bias, with ALiBi's relative bias and with a learned table (T5's kind, its
gradient too): on the tiles of CuPy operators (a backend without the CUDA kernels: what every
biased call ran before the kernels took a bias) and on the kernels of ``kernels/cuda/attention.cu``
(``CudaKernels`` with the emulator's ``RecordingModule``, which records each launch and runs none).

    python bench/launches.py [--quick] [--by-file]
"""

import argparse
import collections
import contextlib
import pathlib
import sys

import numpy as np
from _common import format_ratio, import_torch, print_header, print_table, verdict
from gpt_char import load_nanogpt, minitensor_recipe_model, nanogpt_recipe_model

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(1, str(HERE.parent / "tests"))  # the CuPy stand-in and its counter (test code)
NANOGPT = HERE.parent.parent / "shared" / "refbench" / "nanogpt"  # nanoGPT's code, where it is checked out

TARGET = 1.2  # minitensor's launches / PyTorch's ops, at most
PHASES = ("forward", "backward", "clipping", "optimiser")
GPT_SIZES = dict(num_hiddens=48, ffn_num_hiddens=192, num_heads=6, num_blks=6, lm_num_steps=32, batch_size=4)
VOCAB = 65  # tinyshakespeare's characters
WARM_UP = 2


# -- minitensor on the CuPy stand-in -------------------------------------------------------------
def use_stand_in():
    """Serve device "cuda" with the CuPy backend on the stand-in, whatever this machine has."""
    from fake_cupy import fake_cuda_backend

    from minitensor import backends

    backends._BACKENDS["cuda"] = fake_cuda_backend()


def counted_phases(phases):
    """Run the step ``phases`` ({name: function}) in order, each inside ``count_launches()``:
    {name: LaunchLog}."""
    from strict_backend import count_launches

    logs = {}
    for name, run in phases.items():
        with count_launches() as log:
            run()
        logs[name] = log
    return logs


def step_of_minitensor(model, optimizer, scheduler, clip, compute_loss):
    """The phases of one step as ``minitensor.train.loop.train_step`` takes it."""
    from minitensor.nn.utils import clip_grad_norm_

    state = {}

    def forward():
        state["loss"] = compute_loss()

    def backward():
        optimizer.zero_grad()
        state.pop("loss").backward()

    def optimiser():
        optimizer.step()
        if scheduler is not None:
            scheduler.step()

    phases = {"forward": forward, "backward": backward}
    if clip:
        phases["clipping"] = lambda: clip_grad_norm_(model.parameters(), clip)
    phases["optimiser"] = optimiser
    return phases


def minitensor_gpt(sizes):
    import minitensor as mt

    config, model, optimizer, scheduler, batch = gpt_parts(sizes)

    def compute_loss():
        X, Y = batch()
        return mt.cross_entropy(model(X), Y)

    return step_of_minitensor(model, optimizer, scheduler, config.clip_grad_norm, compute_loss)


def gpt_parts(sizes):
    """(config, model, optimizer, scheduler, batch) of the gpt-char-gpu recipe at ``sizes`` on the
    stand-in's "cuda"; ``batch()`` uploads a random minibatch (X, Y)."""
    import minitensor as mt

    config, model, optimizer, scheduler = minitensor_recipe_model(sizes, VOCAB, "cuda", 100)
    rng = np.random.default_rng(0)
    B, T = config.batch_size, config.lm_num_steps

    def batch():
        return tuple(mt.tensor(rng.integers(0, VOCAB, (B, T)), device="cuda") for _ in range(2))

    return config, model, optimizer, scheduler, batch


def graphed_gpt_launches(sizes):
    """Launches of a step of the GPT of ``minitensor_gpt(sizes)`` with ``--cuda-graph``
    (``train/graphed.py``): the batch uploaded and copied into the graph's inputs, the replay (its
    dropout seeds drawn, then one launch for the whole forward and backward), the loss kept, the
    clipping and the optimiser."""
    from minitensor.nn.utils import clip_grad_norm_
    from strict_backend import count_launches

    import minitensor as mt
    from minitensor.train.graphed import WARMUP_STEPS, GraphedStep

    config, model, optimizer, scheduler, batch = gpt_parts(sizes)

    def loss_of(b):
        return mt.cross_entropy(model(b[0]), b[1]), None

    graphed = GraphedStep(loss_of, optimizer)

    def step():
        b = batch()
        if graphed(b) is None:  # the warm-up steps, eager
            loss, _ = loss_of(b)
            optimizer.zero_grad()
            loss.backward()
        clip_grad_norm_(model.parameters(), config.clip_grad_norm)
        optimizer.step()
        scheduler.step()

    for _ in range(WARMUP_STEPS + 2):  # the warm-up steps, the capture, a replay
        step()
    with count_launches() as log:
        step()
    return len(log)


def minitensor_transformer(cfg):
    import train_step

    import minitensor as mt

    model, optimizer = train_step.build_minitensor(cfg)
    model.to("cuda")
    batches = train_step.make_batches(cfg)
    turn = iter(range(10**9))

    def compute_loss():
        batch = {k: mt.tensor(v, device="cuda") for k, v in batches[next(turn) % len(batches)].items()}
        logits = model(batch["enc_X"], batch["dec_X"], batch["enc_valid_lens"])
        return mt.cross_entropy(logits, batch["Y"], mask=batch["mask"])

    return step_of_minitensor(model, optimizer, None, None, compute_loss)


def count_minitensor(phases):
    for _ in range(WARM_UP):
        for run in phases.values():
            run()
    return counted_phases(phases)


# -- PyTorch ------------------------------------------------------------------------------------
def torch_counter(torch):
    """A TorchDispatchMode that counts the operators that compute (views and ``empty`` left out)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = collections.Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            schema = func._schema
            view = not schema.is_mutable and any(r.alias_info is not None for r in schema.returns)
            name = func.overloadpacket.__name__
            if not view and name not in NO_KERNEL:
                self.ops[name] += 1
            return func(*args, **(kwargs or {}))

    return Count


# ATen operators that launch no kernel and that the schema rule does not tell from one
NO_KERNEL = {
    "empty", "empty_like", "empty_strided",  # allocations only, as xp.empty
    "_unsafe_view",  # a view whose schema does not say so
    "_local_scalar_dense",  # a number read to the host (Adam's step count, kept on the host)
    "_record_function_enter_new", "_record_function_exit",  # the profiler's annotations
}  # fmt: skip


def count_torch(torch, phases):
    Count = torch_counter(torch)
    for _ in range(WARM_UP):
        for run in phases.values():
            run()
    counts = {}
    for name, run in phases.items():
        with Count() as mode:
            run()
        counts[name] = mode.ops
    return counts


def torch_gpt(torch, nanogpt, sizes):
    s = sizes
    model, optimizer = nanogpt_recipe_model(torch, nanogpt, s, VOCAB, "cuda")  # its GPU configuration: fused AdamW
    generator = torch.Generator().manual_seed(0)
    B, T = s["batch_size"], s["lm_num_steps"]
    state = {}

    def forward():
        X = torch.randint(0, VOCAB, (B, T), generator=generator)
        Y = torch.randint(0, VOCAB, (B, T), generator=generator)
        state["loss"] = model(X, Y)[1]

    def backward():
        state.pop("loss").backward()

    def optimiser():
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    clipping = lambda: torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # noqa: E731
    return {"forward": forward, "backward": backward, "clipping": clipping, "optimiser": optimiser}


def torch_transformer(torch, cfg):
    import train_step

    model, _ = train_step.build_torch(torch, cfg)
    # Adam as PyTorch runs it on a GPU, where foreach (a few multi-tensor operators per step, not
    # a dozen per parameter) is its default; on the CPU the default is a loop over the parameters
    optimizer = torch.optim.Adam(model.parameters(), lr=train_step.LR, foreach=True)
    batches = train_step.torch_batches(torch, train_step.make_batches(cfg))
    turn = iter(range(10**9))
    state = {}

    def forward():
        batch = batches[next(turn) % len(batches)]
        logits = model(batch["enc_X"], batch["dec_X"], batch["enc_valid_lens"])
        state["loss"] = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), batch["Y"].reshape(-1), ignore_index=train_step.PAD
        )

    def backward():
        optimizer.zero_grad()
        state.pop("loss").backward()

    def optimiser():
        optimizer.step()

    return {"forward": forward, "backward": backward, "optimiser": optimiser}


# -- one streamed attention call: the tiles vs the CUDA kernels -----------------------------------
def streamed_attention_launches(T=1024, heads=8):
    """{bias: (launches on the tiles, launches on the kernels)} of a causal ``flash_attention``
    forward + backward, bias None, ALiBi's table or a learned one."""
    from fake_cupy import attention_kernels_that_record
    from minitensor.ops.flash_attention import flash_attention
    from strict_backend import count_launches

    import minitensor as mt

    rng = np.random.default_rng(0)
    alibi = mt.plugins.lookup("positional encoding", "alibi")(heads, device="cuda").relative_bias(-(T - 1), T - 1)
    arrays = [rng.standard_normal((1, heads, T, 64)).astype(np.float32) for _ in range(4)]
    counts = {}
    for kernels in (False, True):
        recording = attention_kernels_that_record(mt.get_backend("cuda")) if kernels else contextlib.nullcontext([])
        with recording as made:
            for name, table in (("none", None), ("ALiBi", False), ("learned table", True)):
                for _ in range(2):  # count the second call: the first makes what later ones reuse
                    q, k, v = (mt.tensor(a, device="cuda", requires_grad=True) for a in arrays[:3])
                    grad = mt.tensor(arrays[3], device="cuda")
                    bias = None if table is None else alibi.detach().requires_grad_(table)
                    made.clear()
                    with count_launches() as log:
                        flash_attention(q, k, v, causal=True, relative_bias=bias).backward(grad)
                counts.setdefault(name, []).append(len(log) + len(made))
    return counts


def streamed_gpt_launches(sizes):
    """Launches of a step of the GPT of ``minitensor_gpt(sizes)`` with ``--fused on``: its
    attention on the CUDA kernels, the weights' dropout inside them."""
    from fake_cupy import attention_kernels_that_record

    from minitensor import backends

    # (numpy's warnings off: the outputs the recording kernels leave unwritten hold any bits)
    with attention_kernels_that_record(backends._BACKENDS["cuda"]) as made, np.errstate(all="ignore"):
        phases = minitensor_gpt(dict(sizes, fused="on"))
        for _ in range(WARM_UP):
            for run in phases.values():
                run()
        made.clear()
        logs = counted_phases(phases)
    return sum(len(log) for log in logs.values()) + len(made)


# -- report ---------------------------------------------------------------------------------------
def report(name, describe, ours, theirs, by_file):
    """The table of one model: launches by phase, PyTorch's ops beside them, the ratio."""
    rows, total_ours, total_theirs = [], 0, 0
    for phase in PHASES:
        if phase not in ours:
            continue
        n = len(ours[phase])
        total_ours += n
        row = [phase, n]
        if theirs is not None:
            m = sum(theirs.get(phase, {}).values())
            total_theirs += m
            row += [m, format_ratio(n / m) if m else "-"]
        rows.append(row)
    total = ["total", total_ours]
    if theirs is not None:
        total += [total_theirs, format_ratio(total_ours / total_theirs)]
    headers = ["phase", "minitensor launches"] + (["PyTorch ops", "ratio"] if theirs is not None else [])
    print_table(headers, rows + [total], title=f"{name}: {describe}")
    if theirs is not None:
        ratio = total_ours / total_theirs
        line = f"{name}: {total_ours} launches per step <= {TARGET}x PyTorch's {total_theirs} ops"
        print(f"{verdict(ratio <= TARGET)}  {line}")
    if by_file:
        files = collections.Counter()
        for log in ours.values():
            files.update(log.by("file"))
        rows = [[f, n] for f, n in files.most_common()]
        print_table(["minitensor file", "launches"], rows, title=f"{name}: where minitensor's launches come from")
        whats = collections.Counter()
        for log in ours.values():
            whats.update(log.by("where"))
        rows = [[w, n] for w, n in whats.most_common(25)]
        print_table(["line", "launches"], rows, title=f"{name}: the 25 lines that launch most")
    return total_ours, (total_theirs if theirs is not None else None)


def main():
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the GPT with 2 blocks instead of 6 (for CI)")
    parser.add_argument("--by-file", action="store_true", help="where minitensor's launches come from")
    args = parser.parse_args()
    print_header("Kernel launches per training step (minitensor on the CuPy stand-in, PyTorch's ATen ops)", args.quick)
    use_stand_in()
    torch = import_torch()
    nanogpt = load_nanogpt(NANOGPT) if torch is not None else None
    if torch is None:
        print("PyTorch is not installed: only minitensor's launches are counted")
    elif nanogpt is None:
        print(f"nanoGPT's model.py is not at {NANOGPT}: the GPT's PyTorch column is skipped")
    if torch is not None:
        torch.set_num_threads(1)

    import train_step

    sizes = dict(GPT_SIZES, num_blks=2) if args.quick else GPT_SIZES
    describe = ", ".join(f"{k} {v}" for k, v in sizes.items())
    ours = count_minitensor(minitensor_gpt(sizes))
    theirs = count_torch(torch, torch_gpt(torch, nanogpt, sizes)) if nanogpt is not None else None
    report("gpt", f"the gpt-char-gpu recipe, {describe}", ours, theirs, args.by_file)
    streamed = streamed_gpt_launches(sizes)
    versus = f" ({streamed / sum(sum(ops.values()) for ops in theirs.values()):.2f}x PyTorch's)" if theirs else ""
    print(f"the same step with --fused on (attention on the CUDA kernels, dropout inside): {streamed} launches{versus}")
    graphed = graphed_gpt_launches(sizes)
    versus = f" ({graphed / sum(sum(ops.values()) for ops in theirs.values()):.2f}x PyTorch's)" if theirs else ""
    print(
        f"the same step with --cuda-graph (forward and backward replayed as one CUDA graph): {graphed} launches{versus}"
    )

    cfg = train_step.CONFIGS["d2l"]
    ours = count_minitensor(minitensor_transformer(cfg))
    theirs = count_torch(torch, torch_transformer(torch, cfg)) if torch is not None else None
    report("transformer", f"bench/train_step.py's encoder-decoder, {cfg.describe()}", ours, theirs, args.by_file)

    counts = streamed_attention_launches()
    rows = [[name, tiles, kernels] for name, (tiles, kernels) in counts.items()]
    title = "streamed attention: one causal flash_attention call, forward + backward, T = 1024, 8 heads, d_head 64"
    print_table(["bias", "on the tiles", "on the CUDA kernels"], rows, title=title)


if __name__ == "__main__":
    main()
