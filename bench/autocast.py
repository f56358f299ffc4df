"""Mixed precision on the CPU: a GPT training step in float32 against the same in ``mt.autocast``.

What is measured
----------------
The model of ``minitensor train --preset gpt-char`` (nanoGPT's CPU line: 4 blocks of 128, 4
heads, context 64, batch 12, GELU, tied embeddings, no dropout) on Shakespeare's characters,
built twice from the same weights and trained on the same batches, once in float32 and once in
bfloat16 autocast (products in bfloat16, softmaxes, norms and the loss in float32, float32
weights):

1. the memory the graph holds after a forward (what NumPy has allocated and not freed, by
   ``tracemalloc``): what backward will read, plus what minitensor's graph keeps alive;
2. the time of a step (forward, loss, backward, AdamW), the two interleaved, medians;
3. the losses of ``STEPS`` steps of each, side by side: the largest relative difference of a
   step's loss, and the mean of the last 20;
4. the roundings themselves, float32 to bfloat16 and back (``kernels/bfloat16.py``: numba loops
   on the bits, what the CPU backend runs) against ml_dtypes' ``astype`` (the definition), at the
   sizes of the model's activations: the kernels' share of the step's cost.

Targets: autocast holds at most 1.0x float32's memory, and its last 20 losses are within 2% of
float32's. The step time is shown, not judged: NumPy has no bfloat16 matrix product, so on the
CPU autocast multiplies the rounded numbers in float32 and pays for the roundings; its speed is
a GPU's (``bench/gpu_check.py`` times the GPU recipe with ``--autocast``).

    python bench/autocast.py [--quick]
"""

import os
import sys
import tracemalloc

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from _common import (  # noqa: E402
    format_mib,
    format_ratio,
    format_stats,
    format_time,
    interleaved,
    parse_args,
    print_header,
    print_table,
    timed,
    verdict,
)
from minitensor.kernels import bfloat16 as kernels  # noqa: E402

import minitensor as mt  # noqa: E402
from minitensor.data import TEXTS  # noqa: E402

SIZES = dict(num_hiddens=128, ffn_num_hiddens=512, num_heads=4, num_blks=4, max_len=64)
BATCH, CONTEXT = 12, 64
STEPS, QUICK_STEPS = 200, 12
MEMORY_RATIO = 1.0
LOSS_TOLERANCE = 0.02


def batches(n, seed=0):
    """``n`` minibatches (X, Y) of random windows of the text's characters, the same each call."""
    with open(TEXTS["tinyshakespeare"], encoding="utf-8") as f:
        text = f.read()
    vocab = {c: i for i, c in enumerate(sorted(set(text)))}
    ids = np.array([vocab[c] for c in text], dtype=np.int64)
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        starts = rng.integers(0, len(ids) - CONTEXT - 1, BATCH)
        window = np.stack([ids[s : s + CONTEXT + 1] for s in starts])
        out.append((mt.tensor(window[:, :-1]), mt.tensor(window[:, 1:])))
    return out, len(vocab)


def model_and_optimizer(vocab_size):
    mt.manual_seed(0)
    model = mt.nn.TransformerLM(
        vocab_size=vocab_size, dropout=0.0, norm_first=True, activation="gelu", bias=False,
        tie_embeddings=True, positional="learned", init="gpt2", **SIZES,
    )  # fmt: skip
    return model, mt.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1)


def loss_of(model, batch, mixed):
    X, Y = batch
    with mt.autocast("cpu", enabled=mixed):
        return mt.cross_entropy(model(X), Y)


def step(model, optimizer, batch, mixed):
    optimizer.zero_grad()
    loss = loss_of(model, batch, mixed)
    loss.backward()
    optimizer.step()
    return loss


def held_memory(model, batch, mixed):
    """Bytes allocated by the forward and still held when it returns (the graph's)."""
    loss_of(model, batch, mixed)  # a warm-up: caches and kernels
    tracemalloc.start()
    loss = loss_of(model, batch, mixed)
    held, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del loss
    return held


def main():
    args = parse_args(__doc__)
    print_header("bench/autocast.py: a GPT step in float32 and in bfloat16 autocast, on the CPU", args.quick)
    steps = QUICK_STEPS if args.quick else STEPS
    data, vocab_size = batches(steps)
    runs = {mixed: model_and_optimizer(vocab_size) for mixed in (False, True)}
    names = {False: "float32", True: "autocast (bfloat16)"}

    memory = {mixed: held_memory(runs[mixed][0], data[0], mixed) for mixed in runs}
    cases = {names[m]: timed(lambda m=m: step(*runs[m], data[0], m)) for m in runs}
    stats = interleaved(cases, rounds=3 if args.quick else 15, warmup=1)
    rows = [
        [names[m], format_mib(memory[m]), format_ratio(memory[m] / memory[False]), format_stats(stats[names[m]])]
        for m in runs
    ]
    rows[1].append(format_ratio(stats[names[True]].median / stats[names[False]].median))
    rows[0].append("1.00x")
    print_table(
        ["run", "held after forward", "/ float32", "step (fwd+bwd+AdamW)", "/ float32"],
        rows,
        title=f"--preset gpt-char's model, batch {BATCH}, context {CONTEXT}: memory and time of a step",
    )

    losses = {}
    for mixed in runs:
        model, optimizer = model_and_optimizer(vocab_size)  # afresh: the timing took steps
        losses[mixed] = np.array([step(model, optimizer, b, mixed).item() for b in data])
    full, mixed = losses[False], losses[True]
    worst = np.abs(mixed / full - 1).max()
    last = slice(-min(20, steps), None)
    end = abs(mixed[last].mean() / full[last].mean() - 1)
    picks = sorted({0, steps // 4, steps // 2, 3 * steps // 4, steps - 1})
    print_table(
        ["step", "float32 loss", "autocast loss", "relative difference"],
        [[i + 1, f"{full[i]:.4f}", f"{mixed[i]:.4f}", f"{mixed[i] / full[i] - 1:+.2e}"] for i in picks],
        title=f"{steps} steps from the same weights on the same batches",
    )
    print(f"largest relative difference of a step's loss: {worst:.2e}; of the last 20 losses' mean: {end:.2e}")

    print()
    conversions(rounds=3 if args.quick else 15)

    print("\nTargets:")
    held = memory[True] / memory[False]
    print(f"  {verdict(held <= MEMORY_RATIO)}  held memory in autocast <= {MEMORY_RATIO}x float32's")
    print(f"  {verdict(end <= LOSS_TOLERANCE)}  the last 20 losses within {LOSS_TOLERANCE:.0%} of float32's")


def _conversion_pairs(x):
    """name -> (the kernel's call, ml_dtypes' astype) on float32 ``x`` (and x in bfloat16)."""
    h = x.astype(mt.bfloat16)
    return {
        "narrow (float32 -> bfloat16)": (lambda: kernels.bfloat16_narrow(x), lambda: x.astype(mt.bfloat16)),
        "round (in float32)": (lambda: kernels.bfloat16_round(x), lambda: x.astype(mt.bfloat16).astype(np.float32)),
        "widen (bfloat16 -> float32)": (lambda: kernels.bfloat16_widen(h), lambda: h.astype(np.float32)),
    }


def _twenty(fn):
    """A sample of 20 calls of ``fn``: one call is too short for the clock."""
    return timed(lambda: [fn() for _ in range(20)])


def conversions(rounds):
    """The bit kernels against ml_dtypes' casts, one table row per conversion and size."""
    rng = np.random.default_rng(0)
    rows = []
    for shape in [(BATCH * CONTEXT, SIZES["num_hiddens"]), (BATCH * CONTEXT, SIZES["ffn_num_hiddens"])]:
        for name, (kernel, plain) in _conversion_pairs(rng.standard_normal(shape, dtype=np.float32)).items():
            stats = interleaved({"kernel": _twenty(kernel), "astype": _twenty(plain)}, rounds=rounds, warmup=1)
            k, a = stats["kernel"].median / 20, stats["astype"].median / 20
            rows.append([name, f"{shape[0]}x{shape[1]}", format_time(k), format_time(a), format_ratio(a / k)])
    print_table(
        ["conversion", "shape", "numba on the bits", "ml_dtypes astype", "speed-up"],
        rows,
        title="the roundings of autocast's products, medians of one call",
    )


if __name__ == "__main__":
    main()
