"""nanoGPT's character-level Shakespeare, side by side: ``--preset gpt-char`` in minitensor vs a PyTorch twin.

What is measured
----------------
The recipe of ``minitensor train --preset gpt-char`` (nanoGPT's README CPU line: a GPT of 4
pre-LN blocks of 128 hiddens and 4 heads, context 64, batch 12, 2,000 steps; GELU, learned
positions, tied embeddings, no biases, GPT-2's init; AdamW betas (0.9, 0.99), weight decay 0.1
on matrices and embeddings only, lr 1e-3 warmed up over 100 steps then cosine to 1e-4,
gradients clipped at 1) trained on the shipped tinyshakespeare.txt by minitensor and by a
PyTorch twin of nanoGPT's ``model.py`` (``_gpt_twin.py``), from the same initial weights
(minitensor's, copied) on the same batches:

1. *Equality first, every run*: in float64, minitensor's model and the twin (its weights
   copied: W_q, W_k, W_v stacked into c_attn) give the same logits, loss and gradients on one
   batch, to 1e-5 relative; the script stops otherwise. When nanoGPT's own code is at hand
   (``../shared/refbench/nanogpt/model.py`` beside the repository, or ``--nanogpt DIR``), its
   ``GPT`` takes the twin's state dict and must give the same loss and gradients too.
2. *Training*: ``--steps`` steps (2,000) for each of ``--seeds`` seeds (3). A seed fixes the
   initial weights (``mt.manual_seed``) and the batches: random windows of the training text
   (nanoGPT's ``get_batch``), drawn once with NumPy and fed to both. The two train interleaved
   in blocks of ``BLOCK`` steps (A B, B A, ...), at ``--threads`` threads (2) each (NumPy's BLAS
   through threadpoolctl, numba, ``torch.set_num_threads``). The garbage collector runs
   between blocks and as usual within them: a step costs what it costs in a training run.
   Reported: the held-out loss after training on the *whole* held-out split (the last 10% of
   the text in non-overlapping windows of the context, mean nats per character) per seed and
   its mean; the median time per step (forward, loss, backward, clipping, AdamW, schedule;
   the batch is cut from the text outside it) and tokens per second.
3. *Peak memory*: each framework alone in a fresh process (``--memory-worker``), training
   ``MEMORY_STEPS`` steps: the resident set's high-water mark (``ru_maxrss``), absolute and
   above the process's resident set after its imports and the token data (the baseline). The
   PyTorch process does not import minitensor (the parent hands it the data and the weights).
4. *Generation* (``minitensor generate``'s path): 1,000 characters sampled at temperature 0.8
   (nanoGPT's ``sample.py``) from the trained model of the first seed, after a "\\n" prompt,
   with ``mt.inference.generate`` -- the key/value cache, a piece at a time inside the context
   (``window``) -- against the same model recomputing the whole context for every new character,
   cropped as ``generate`` crops it: the same contexts and the same Gumbel draws (one NumPy
   generator, the same seed), so the two texts must be identical (the script asserts it). A
   third row times nanoGPT's own cropping, a sliding window of the last 64 characters (the
   longest context at every step, so a different text: timed only).

Targets: held-out loss mean <= 1.88 (nanoGPT's README for this run: ~1.88); minitensor's step
<= 0.9x the twin's; minitensor's peak memory above baseline <= 1.3x PyTorch's. ``--quick``: a
tiny model (2 blocks of 32, context 16), 30 steps, 1 seed, 100 characters: a smoke run, whose
figures are not judged against the targets.

    python bench/gpt_char.py [--quick] [--threads N] [--steps N] [--seeds N] [--chars N]
"""

import argparse
import contextlib
import gc
import importlib.util
import io
import json
import math
import os
import pathlib
import resource
import sys
import tempfile
import time

import numpy as np
from _common import (
    Stats,
    count_between,
    format_mib,
    format_ratio,
    format_stats,
    import_torch,
    interleaved,
    limit_threads,
    print_header,
    print_table,
    run_python,
    thread_count,
    thread_env,
    timed,
    verdict,
)
from memory import read_status, reset_peak  # the bench folder's: VmRSS, VmHWM

HERE = pathlib.Path(__file__).resolve().parent
NANOGPT = HERE.parent.parent / "shared" / "refbench" / "nanogpt"  # nanoGPT's code, where it is checked out

TARGET_LOSS = 1.88  # nats per character, mean over seeds
TARGET_TIME = 0.9  # minitensor / twin, median step
TARGET_MEMORY = 1.3  # minitensor / PyTorch, peak above baseline
TOLERANCE = 1e-5  # relative, float64 agreement
BLOCK = 25  # training steps per turn
MEMORY_STEPS = 50
EVAL_WINDOWS = 256  # held-out windows per forward
PROMPT = "\n"
TEMPERATURE = 0.8  # nanoGPT's sample.py
GEN_SEED = 1337
GEN_ROUNDS = 3
GEMM_ROUNDS = 25  # calls in a row of each matrix product, per turn
QUICK = dict(num_hiddens=32, ffn_num_hiddens=4 * 32, num_heads=4, num_blks=2, lm_num_steps=16)


# -- the recipe and its data ------------------------------------------------------------------------
def recipe(quick, steps):
    """The TrainConfig of ``--preset gpt-char`` on the shipped text (tiny with ``quick``)."""
    from minitensor.data import TEXTS
    from minitensor.train.config import TrainConfig

    sizes = QUICK if quick else {}
    return TrainConfig.recipe(preset="gpt-char", text=TEXTS["tinyshakespeare"], steps=steps, **sizes)


def load_text(config):
    """(training ids, held-out ids, vocab) from minitensor's data pipeline (the last 10% held out)."""
    from minitensor.train.config import build_data

    data = build_data(config)
    return np.asarray(data.train, dtype=np.int64), np.asarray(data.heldout, dtype=np.int64), data.tgt_vocab


def batch_offsets(n_train, T, steps, batch_size, seed):
    """nanoGPT's ``get_batch``, drawn once: the start of every window, (steps, batch_size)."""
    return np.random.default_rng(seed).integers(0, n_train - T, size=(steps, batch_size))


def cut(ids, starts, T):
    """Inputs and next-token targets (len(starts), T) of the windows starting at ``starts``."""
    w = ids[starts[:, None] + np.arange(T + 1)]
    return np.ascontiguousarray(w[:, :-1]), np.ascontiguousarray(w[:, 1:])


def heldout_windows(ids, T):
    """The whole held-out text as non-overlapping windows of T: inputs and targets (n, T)."""
    n = (len(ids) - 1) // T
    return ids[: n * T].reshape(n, T), ids[1 : n * T + 1].reshape(n, T)


def cosine_lr(t, config, total_steps):
    """The learning rate of step t = 1, 2, ...: minitensor's ``WarmupCosineLR`` as
    ``build_scheduler`` makes it (checked against it in ``check_schedule``)."""
    W, S = min(config.warmup_steps, total_steps - 1), total_steps
    if t <= W:
        return config.lr * t / W
    progress = min(t - W, S - W) / (S - W)
    return config.min_lr + (config.lr - config.min_lr) * 0.5 * (1 + math.cos(math.pi * progress))


# -- minitensor ----------------------------------------------------------------------------------------
def build_minitensor(config, vocab, seed):
    import minitensor as mt
    from minitensor.train.config import build_model, build_optimizer, build_scheduler

    mt.manual_seed(seed)
    model = build_model(config, vocab, vocab)
    optimizer = build_optimizer(config, model)
    return model, optimizer, build_scheduler(config, optimizer, config.steps)


def minitensor_state(model):
    return {name: p.numpy().copy() for name, p in model.named_parameters()}


def minitensor_step(model, optimizer, scheduler, X, Y, clip):
    """One step of the recipe (``train/loop.py``'s ``train_step`` on the CPU); (seconds, loss)."""
    from minitensor.nn.utils import clip_grad_norm_

    import minitensor as mt

    X, Y = mt.tensor(X), mt.tensor(Y)
    start = time.perf_counter()
    loss = mt.cross_entropy(model(X), Y)
    optimizer.zero_grad()
    loss.backward()
    clip_grad_norm_(model.parameters(), clip)
    optimizer.step()
    scheduler.step()
    return time.perf_counter() - start, loss


def minitensor_heldout(model, X, Y):
    import minitensor as mt

    model.eval()
    total = 0.0
    with mt.no_grad():
        for i in range(0, len(X), EVAL_WINDOWS):
            logits = model(mt.tensor(X[i : i + EVAL_WINDOWS]))
            total += mt.cross_entropy(logits, mt.tensor(Y[i : i + EVAL_WINDOWS]), reduction="sum").item()
    model.train()
    return total / Y.size


# -- the matrix products alone ---------------------------------------------------------------------------
def gemm_shapes(config, vocab_size):
    """The Linear layers' products of one step, as (name, A's shape, B's shape, transposes,
    how many a step): forward X W^T, backward G W (dX) and G^T X (dW); the tied output layer
    included. What either framework's step cannot go below on its BLAS."""
    c, n = config, config.batch_size * config.lm_num_steps
    layers = [("W_q, W_k, W_v, W_o", c.num_hiddens, c.num_hiddens, 4 * c.num_blks)]
    layers += [
        ("FFN in", c.num_hiddens, c.ffn_num_hiddens, c.num_blks),
        ("FFN out", c.ffn_num_hiddens, c.num_hiddens, c.num_blks),
    ]
    layers += [("output (tied)", c.num_hiddens, vocab_size, 1)]
    shapes = []
    for name, d_in, d_out, count in layers:
        shapes += [
            (f"{name}: X W^T", (n, d_in), (d_out, d_in), "NT", count),
            (f"{name}: G W", (n, d_out), (d_out, d_in), "NN", count),
            (f"{name}: G^T X", (n, d_out), (n, d_in), "TN", count),
        ]
    return shapes


def in_blocks(cases, rounds, turns=4):
    """``interleaved`` for thread pools that must not alternate call by call: each case runs
    ``rounds`` calls in a row (after a few to wake its threads), the cases taking turns
    (A B, B A, ...) ``turns`` times; the Stats of every call. Alternating single calls would
    time OpenBLAS's threads waking while PyTorch's still spin, and the other way round."""
    samples = {name: [] for name in cases}
    names = list(cases)
    for turn in range(turns):
        for name in names if turn % 2 == 0 else names[::-1]:
            for _ in range(3):
                cases[name]()
            samples[name] += [cases[name]() for _ in range(rounds)]
    return {name: Stats.of(times) for name, times in samples.items()}


def gemm_floor(torch, config, vocab_size, rounds):
    """Time each of ``gemm_shapes`` with NumPy (its OpenBLAS) and PyTorch (``in_blocks``), float32;
    (rows for the table, NumPy's and PyTorch's total per step in seconds)."""
    rng = np.random.default_rng(0)
    rows, total = [], {"numpy": 0.0, "torch": 0.0}
    for name, a_shape, b_shape, layout, count in gemm_shapes(config, vocab_size):
        a, b = (rng.standard_normal(shape, dtype=np.float32) for shape in (a_shape, b_shape))
        ta, tb = torch.from_numpy(a), torch.from_numpy(b)
        if layout == "NT":
            cases = {"numpy": timed(lambda a=a, b=b: a @ b.T), "torch": timed(lambda a=ta, b=tb: a @ b.T)}
        elif layout == "NN":
            cases = {"numpy": timed(lambda a=a, b=b: a @ b), "torch": timed(lambda a=ta, b=tb: a @ b)}
        else:
            cases = {"numpy": timed(lambda a=a, b=b: a.T @ b), "torch": timed(lambda a=ta, b=tb: a.T @ b)}
        stats = in_blocks(cases, rounds)
        for key in total:
            total[key] += count * stats[key].median
        ratio = stats["numpy"].median / stats["torch"].median
        rows.append([name, count, format_stats(stats["numpy"]), format_stats(stats["torch"]), format_ratio(ratio)])
    return rows, total


# -- the twin ------------------------------------------------------------------------------------------
def build_twin(config, vocab_size, mt_state, dtype=None):
    from _gpt_twin import GPT, GPTConfig, configure_optimizer, load_twin

    c = config
    model = GPT(GPTConfig(c.lm_num_steps, vocab_size, c.num_blks, c.num_heads, c.num_hiddens, bias=c.bias))
    if dtype is not None:
        model.to(dtype)
    load_twin(model, mt_state)
    return model, configure_optimizer(model, c.lr, tuple(c.betas), c.weight_decay)


def twin_step(torch, model, optimizer, X, Y, lr, clip):
    """One step of nanoGPT's train.py loop (lr set, forward, backward, clip, step, zero_grad)."""
    X, Y = torch.from_numpy(X), torch.from_numpy(Y)
    start = time.perf_counter()
    for group in optimizer.param_groups:
        group["lr"] = lr
    _, loss = model(X, Y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - start, loss


def twin_heldout(torch, model, X, Y):
    import torch.nn.functional as F

    model.eval()
    total = 0.0
    with torch.no_grad():
        for i in range(0, len(X), EVAL_WINDOWS):
            logits, _ = model(torch.from_numpy(X[i : i + EVAL_WINDOWS]))
            target = torch.from_numpy(Y[i : i + EVAL_WINDOWS]).reshape(-1)
            total += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target, reduction="sum").item()
    model.train()
    return total / Y.size


# -- checks ---------------------------------------------------------------------------------------------
def check_schedule(config):
    """``cosine_lr`` is the learning rate minitensor's scheduler sets at every step."""
    import minitensor as mt
    from minitensor.train.config import build_optimizer, build_scheduler

    dummy = mt.nn.Linear(2, 2, bias=False)
    optimizer = build_optimizer(config, dummy)
    scheduler = build_scheduler(config, optimizer, config.steps)
    for t in range(1, config.steps + 1):
        ours = optimizer.param_groups[0]["lr"]
        if not math.isclose(ours, cosine_lr(t, config, config.steps), rel_tol=1e-12, abs_tol=1e-15):
            raise SystemExit(f"the twin's schedule differs from minitensor's at step {t}")
        scheduler.step()


def relative(a, b):
    """max |a - b| / max |b|: the largest difference on the scale of the reference."""
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-300))


def check_equal(config, vocab_size, train, torch):
    """In float64, on one batch: the same logits, loss and gradients (minitensor vs the twin, and
    the twin vs nanoGPT's own GPT when its code is at hand). Stops the script if they differ."""
    import minitensor as mt

    model, _, _ = build_minitensor(config, range(vocab_size), seed=0)
    model.double()
    T, n_layer = config.lm_num_steps, config.num_blks
    X, Y = cut(train, batch_offsets(len(train), T, 1, config.batch_size, seed=12345)[0], T)
    logits = model(mt.tensor(X))
    loss = mt.cross_entropy(logits, mt.tensor(Y))
    loss.backward()
    from _gpt_twin import twin_state

    ours = twin_state({n: p.grad.numpy() for n, p in model.named_parameters()}, n_layer)
    twin, _ = build_twin(config, vocab_size, minitensor_state(model), dtype=torch.float64)
    t_logits, t_loss = twin(torch.from_numpy(X), torch.from_numpy(Y))
    t_loss.backward()
    theirs = {n: p.grad.numpy() for n, p in twin.named_parameters()}
    ours.pop("lm_head.weight")  # tied: the twin lists the one Parameter once, as transformer.wte.weight
    if ours.keys() != theirs.keys():
        raise SystemExit(f"the twin's parameters differ from minitensor's: {sorted(ours.keys() ^ theirs.keys())}")
    d_logits = relative(logits.numpy(), t_logits.detach().numpy())
    d_loss = abs(loss.item() - t_loss.item()) / abs(t_loss.item())
    worst, d_grad = max(((n, relative(ours[n], theirs[n])) for n in ours), key=lambda pair: pair[1])
    print(
        f"float64, one batch: loss minitensor {loss.item():.10f}, twin {t_loss.item():.10f}; largest relative "
        f"differences: logits {d_logits:.1e}, loss {d_loss:.1e}, gradients {d_grad:.1e} ({worst}); "
        f"{len(theirs)} parameter tensors, {sum(p.numel() for p in twin.parameters()):,} parameters"
    )
    if max(d_logits, d_loss, d_grad) > TOLERANCE:
        raise SystemExit(
            f"minitensor and the PyTorch twin disagree (tolerance {TOLERANCE:g} relative): they do different work"
        )
    check_nanogpt(config, vocab_size, twin, X, Y, t_loss.item(), theirs, torch)


def load_nanogpt(folder, torch_like=None):
    """nanoGPT's ``model.py`` as a module (loaded from its file: nothing joins sys.path), or None.

    With ``torch_like`` (a module with ``nn`` and ``nn.functional``: minitensor) its ``import
    torch`` lines get that module instead: ``sys.modules`` answers them with it while the file
    executes, and is put back after (the module's globals keep what it imported)."""
    path = pathlib.Path(folder) / "model.py"
    if not path.is_file():
        return None
    name = "nanogpt_model" if torch_like is None else f"nanogpt_model_on_{torch_like.__name__}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    if torch_like is None:
        spec.loader.exec_module(module)
        return module
    names = ("torch", "torch.nn", "torch.nn.functional")
    saved = {n: sys.modules.get(n) for n in names}
    sys.modules.update(zip(names, (torch_like, torch_like.nn, torch_like.nn.functional), strict=True))
    try:
        spec.loader.exec_module(module)
    finally:
        for n, old in saved.items():
            if old is None:
                sys.modules.pop(n, None)
            else:
                sys.modules[n] = old
    return module


def minitensor_recipe_model(sizes, vocab_size, device, total_steps):
    """(config, model, optimizer, scheduler): minitensor's ``--preset gpt-char-gpu`` at ``sizes``
    (overriding the preset's) on ``device``, in training mode, seeded with 0, its schedule over
    ``total_steps``: ``nanogpt_recipe_model``'s counterpart."""
    import minitensor as mt
    from minitensor.data import TEXTS
    from minitensor.train.config import TrainConfig, build_model, build_optimizer, build_scheduler

    config = TrainConfig.recipe(preset="gpt-char-gpu", text=TEXTS["tinyshakespeare"], device=device, **sizes)
    vocab = list(range(vocab_size))
    mt.manual_seed(0)
    model = build_model(config, vocab, vocab)
    optimizer = build_optimizer(config, model)
    scheduler = build_scheduler(config, optimizer, total_steps)
    model.to(device)
    model.train()
    return config, model, optimizer, scheduler


def nanogpt_recipe_model(torch, nanogpt, sizes, vocab_size, device_type):
    """(model, optimizer): nanoGPT's ``GPT`` at ``sizes`` (minitensor's names: num_hiddens,
    num_heads, num_blks, lm_num_steps) with its shakespeare_char recipe's dropout 0.2 and no
    biases, in training mode, and the AdamW its ``configure_optimizers`` makes for ``device_type``
    ("cuda": fused; decay 0.1 on the matrices only, betas (0.9, 0.99)), seeded with 0."""
    s = sizes
    conf = nanogpt.GPTConfig(
        block_size=s["lm_num_steps"], vocab_size=vocab_size, n_layer=s["num_blks"], n_head=s["num_heads"],
        n_embd=s["num_hiddens"], dropout=0.2, bias=False,
    )  # fmt: skip
    torch.manual_seed(0)
    with contextlib.redirect_stdout(io.StringIO()):  # it prints its parameter count and its choices
        model = nanogpt.GPT(conf)
        optimizer = model.configure_optimizers(0.1, 1e-3, (0.9, 0.99), device_type)
    model.train()
    return model, optimizer


def check_nanogpt(config, vocab_size, twin, X, Y, twin_loss, twin_grads, torch):
    nanogpt = load_nanogpt(ARGS_NANOGPT)
    if nanogpt is None:
        print(f"nanoGPT's model.py is not at {ARGS_NANOGPT}: the twin is not compared with it (--nanogpt DIR)")
        return
    if config.ffn_num_hiddens != 4 * config.num_hiddens:
        print("nanoGPT's MLP is 4 x n_embd wide, this model's is not: the twin is not compared with it")
        return
    c = config
    conf = nanogpt.GPTConfig(
        block_size=c.lm_num_steps, vocab_size=vocab_size, n_layer=c.num_blks, n_head=c.num_heads,
        n_embd=c.num_hiddens, dropout=0.0, bias=c.bias,
    )  # fmt: skip
    with contextlib.redirect_stdout(io.StringIO()):  # it prints its parameter count
        reference = nanogpt.GPT(conf)
    reference.to(torch.float64)
    reference.load_state_dict(twin.state_dict(), strict=True)
    _, loss = reference(torch.from_numpy(X), torch.from_numpy(Y))
    loss.backward()
    grads = {n: p.grad.numpy() for n, p in reference.named_parameters()}
    d_loss = abs(loss.item() - twin_loss) / abs(twin_loss)
    d_grad = max(relative(twin_grads[n], grads[n]) for n in grads) if grads.keys() == twin_grads.keys() else math.inf
    print(
        f"nanoGPT's own GPT ({ARGS_NANOGPT}) with the twin's state dict: loss {loss.item():.10f}, relative "
        f"difference {d_loss:.1e}; gradients {d_grad:.1e}"
    )
    if max(d_loss, d_grad) > TOLERANCE:
        raise SystemExit("the twin and nanoGPT's GPT disagree: the twin is no twin")


ARGS_NANOGPT = NANOGPT


# -- training side by side ---------------------------------------------------------------------------
def train_both(config, vocab, train, heldout, seed, torch):
    """Train minitensor and the twin from the same weights on the same batches, interleaved in
    blocks; {name: {"times": [...], "losses": [...], "heldout": float, "model": ...}}."""
    T, steps, clip = config.lm_num_steps, config.steps, config.clip_grad_norm
    offsets = batch_offsets(len(train), T, steps, config.batch_size, seed)
    model, optimizer, scheduler = build_minitensor(config, vocab, seed)
    runs = {"minitensor": {"times": [], "losses": [], "model": model}}

    def mt_block(start, stop):
        for t in range(start, stop):
            seconds, loss = minitensor_step(model, optimizer, scheduler, *cut(train, offsets[t], T), clip)
            runs["minitensor"]["times"].append(seconds)
            runs["minitensor"]["losses"].append(loss.item())

    blocks = {"minitensor": mt_block}
    if torch is not None:
        twin, t_opt = build_twin(config, len(vocab), minitensor_state(model))
        runs["torch"] = {"times": [], "losses": [], "model": twin}

        def torch_block(start, stop):
            for t in range(start, stop):
                lr = cosine_lr(t + 1, config, steps)
                seconds, loss = twin_step(torch, twin, t_opt, *cut(train, offsets[t], T), lr, clip)
                runs["torch"]["times"].append(seconds)
                runs["torch"]["losses"].append(loss.item())

        blocks["torch"] = torch_block
    names = list(blocks)
    for k, start in enumerate(range(0, steps, BLOCK)):
        for name in names if k % 2 == 0 else reversed(names):
            gc.collect()
            blocks[name](start, min(start + BLOCK, steps))
    X, Y = heldout_windows(heldout, T)
    runs["minitensor"]["heldout"] = minitensor_heldout(model, X, Y)
    if torch is not None:
        runs["torch"]["heldout"] = twin_heldout(torch, runs["torch"]["model"], X, Y)
    done = ", ".join(f"{n} {r['heldout']:.4f} ({1000 * np.median(r['times']):.1f} ms/step)" for n, r in runs.items())
    print(f"seed {seed}: held-out loss {done}", flush=True)  # a full run takes minutes: show each seed
    return runs


# -- generation ------------------------------------------------------------------------------------------
def generate_cached(model, vocab, n, window):
    """``minitensor generate``: the key/value cache, a piece at a time inside ``window``."""
    from minitensor.inference import generate

    rng = np.random.default_rng(GEN_SEED)
    hyp = generate(model, list(PROMPT), vocab, n, temperature=TEMPERATURE, rng=rng, window=window)
    return "".join(hyp.tokens[len(PROMPT) :])


def _draw(model, context, score, rng):
    """The next token after ``context`` (ids) by a forward over all of it, drawn as ``sample``
    draws it (Gumbel-max on the running log-probability): (token, new score)."""
    import minitensor as mt

    logits = model(mt.tensor(np.array([context], dtype=np.int64)))
    logp = mt.log_softmax(logits[:, -1], axis=-1).numpy().astype(np.float64)
    total = (score + logp).reshape(1, 1, -1)
    rank = total - TEMPERATURE * np.log(-np.log(rng.uniform(np.finfo(float).tiny, 1.0, total.shape)))
    token = int(rank.reshape(-1).argmax())
    return token, total.reshape(-1)[token]


def generate_recomputed(model, vocab, n, window):
    """The same text without a cache: every character recomputes its whole context, which is
    cropped as ``generate`` crops it (pieces restarting from the last window // 2 characters)."""
    import minitensor as mt

    rng, keep, prompt = np.random.default_rng(GEN_SEED), window // 2, vocab[list(PROMPT)]
    text = list(prompt)
    model.eval()
    with mt.no_grad():
        while len(text) - len(prompt) < n:
            context = text[-keep:] if len(text) > window - 1 or len(text) > len(prompt) else text
            piece, score = list(context), 0.0
            for _ in range(min(window - len(context), n - (len(text) - len(prompt)))):
                token, score = _draw(model, piece, score, rng)
                piece.append(token)
            text += piece[len(context) :]
    return "".join(vocab.to_tokens(text[len(prompt) :]))


def generate_sliding(model, vocab, n, window):
    """nanoGPT's sample.py: every character recomputes the last ``window`` characters."""
    import minitensor as mt

    rng, text = np.random.default_rng(GEN_SEED), vocab[list(PROMPT)]
    model.eval()
    with mt.no_grad():
        for _ in range(n):
            token, _ = _draw(model, text[-window:], 0.0, rng)
            text.append(token)
    return "".join(vocab.to_tokens(text[len(PROMPT) :]))


def time_generation(model, vocab, n, window, rounds):
    texts = {}

    def case(name, fn):
        def run():
            start = time.perf_counter()
            text = fn(model, vocab, n, window)
            seconds = time.perf_counter() - start
            texts.setdefault(name, set()).add(text)
            return seconds

        return run

    cases = {
        "KV cache (generate)": case("cached", generate_cached),
        "recompute, same crops": case("recomputed", generate_recomputed),
        "recompute, sliding (nanoGPT)": case("sliding", generate_sliding),
    }
    stats = interleaved(cases, rounds)
    if len(texts["cached"]) != 1 or texts["cached"] != texts["recomputed"]:
        raise SystemExit("generation: the KV cache and recomputing the context gave different texts")
    return stats, texts["cached"].pop()


# -- peak memory, one framework per fresh process ------------------------------------------------------
def memory_worker(name, folder, steps, threads):
    """Train ``steps`` steps of one framework alone; print JSON (bytes): the resident set after
    the imports, the baseline (after two steps of a tiny throwaway model -- what a library loads
    or compiles on first use, numba's kernels, PyTorch's -- and with the model, optimiser and
    token data built, as ``bench/memory.py`` counts it), the high-water mark of the training
    steps and that of the whole process (``absolute``)."""
    is_reset = reset_peak()  # first: the high-water mark inherited from the parent goes
    folder = pathlib.Path(folder)
    spec = json.loads((folder / "spec.json").read_text())
    T, clip, V, seed = spec["T"], spec["clip"], spec["vocab_size"], spec["seed"]
    torch = None
    if name == "minitensor":
        import minitensor  # noqa: F401  (the imports belong to the baseline)
        from minitensor.train.config import TrainConfig
    else:
        import _gpt_twin
        import torch
    imported = read_status("VmRSS")
    train, offsets = np.load(folder / "train.npy"), np.load(folder / "offsets.npy")
    tiny_offsets = batch_offsets(len(train), QUICK["lm_num_steps"], 2, 2, seed=0)
    with limit_threads(threads, torch):
        if name == "minitensor":
            tiny = TrainConfig.from_dict(spec["config"]).replace(**QUICK)
            warm = build_minitensor(tiny, range(V), seed)
            for t in range(2):
                minitensor_step(*warm, *cut(train, tiny_offsets[t], tiny.lm_num_steps), clip)
            config = TrainConfig.from_dict(spec["config"])
            model, optimizer, scheduler = build_minitensor(config, range(V), seed)

            def step(t):
                minitensor_step(model, optimizer, scheduler, *cut(train, offsets[t], T), clip)
        else:
            q = QUICK
            tiny = _gpt_twin.GPT(_gpt_twin.GPTConfig(q["lm_num_steps"], V, q["num_blks"], 4, q["num_hiddens"]))
            warm = (tiny, _gpt_twin.configure_optimizer(tiny, 1e-3, (0.9, 0.99), 0.1))
            for t in range(2):
                twin_step(torch, *warm, *cut(train, tiny_offsets[t], q["lm_num_steps"]), 1e-3, clip)
            config = TrainConfig_like(spec["config"])
            model, optimizer = build_twin(config, V, dict(np.load(folder / "weights.npz")))

            def step(t):
                lr = cosine_lr(t + 1, config, spec["total"])
                twin_step(torch, model, optimizer, *cut(train, offsets[t], T), lr, clip)

        del warm, tiny
        gc.collect()
        before = read_status("VmHWM") if is_reset else 0
        baseline = read_status("VmRSS")
        is_reset = is_reset and reset_peak()
        for t in range(steps):
            step(t)
        after = read_status("VmRSS")
    if is_reset:
        peak = max(read_status("VmHWM"), after)
    else:  # the high-water mark since the process started, perhaps its parent's (ru_maxrss: kB on Linux)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    record = dict(imported=imported, baseline=baseline, peak=peak, absolute=max(peak, before), is_reset=is_reset)
    print(json.dumps(record))


class TrainConfig_like:
    """The fields of a TrainConfig's dict the twin needs, without importing minitensor."""

    def __init__(self, d):
        self.__dict__.update(d)


def measure_memory(config, vocab, train, torch, steps, threads):
    """{name: {"baseline", "peak"}} of each framework in a fresh process, one after the other."""
    names = ["minitensor"] + (["torch"] if torch is not None else [])
    model, _, _ = build_minitensor(config, vocab, seed=0)
    results = {}
    with tempfile.TemporaryDirectory() as folder:
        path = pathlib.Path(folder)
        T = config.lm_num_steps
        spec = dict(config=config.to_dict(), T=T, clip=config.clip_grad_norm, vocab_size=len(vocab), seed=0)
        spec["total"] = config.steps
        (path / "spec.json").write_text(json.dumps(spec))
        np.save(path / "train.npy", train)
        np.save(path / "offsets.npy", batch_offsets(len(train), T, steps, config.batch_size, seed=0))
        np.savez(path / "weights.npz", **minitensor_state(model))
        for name in names:
            args = [str(HERE / "gpt_char.py"), "--memory-worker", name, "--folder", folder]
            args += ["--memory-steps", str(steps), "--worker-threads", str(threads)]
            stdout, _ = run_python(args, env=thread_env(threads))
            results[name] = json.loads(stdout.strip().splitlines()[-1])
    return results


# -- main ----------------------------------------------------------------------------------------------
def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tiny model, 30 steps, 1 seed, 100 characters")
    parser.add_argument("--threads", type=thread_count, default=None, help="threads of each framework (default 2)")
    steps, seeds, chars = count_between(1, 100_000), count_between(1, 100), count_between(1, 100_000)
    parser.add_argument("--steps", type=steps, default=None, help="training steps per seed (default 2000; 30 quick)")
    parser.add_argument("--seeds", type=seeds, default=None, help="seeds 0 .. N-1 (default 3; 1 quick)")
    parser.add_argument("--chars", type=chars, default=None, help="characters generated (default 1000; 100 quick)")
    parser.add_argument("--nanogpt", default=str(NANOGPT), help="the folder of nanoGPT's model.py (a reference)")
    parser.add_argument("--memory-worker", choices=("minitensor", "torch"), help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    parser.add_argument("--memory-steps", type=int, default=MEMORY_STEPS, help=argparse.SUPPRESS)
    # not --threads, whose check imports minitensor: the PyTorch worker must not
    parser.add_argument("--worker-threads", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    quick = args.quick
    args.threads = args.threads or 2
    args.steps = args.steps or (30 if quick else 2000)
    args.seeds = args.seeds or (1 if quick else 3)
    args.chars = args.chars or (100 if quick else 1000)
    return args


def main():
    global ARGS_NANOGPT
    args = parse_args()
    if args.memory_worker:
        memory_worker(args.memory_worker, args.folder, args.memory_steps, args.worker_threads)
        return
    ARGS_NANOGPT = pathlib.Path(args.nanogpt)
    torch = import_torch()
    print_header("nanoGPT's character-level Shakespeare (--preset gpt-char), minitensor vs a PyTorch twin", args.quick)
    if torch is None:
        print("PyTorch is not installed: its columns, the equality check and the targets against it are left out")
    if os.getloadavg()[0] >= 0.5:
        print("note: other processes are running (load average >= 0.5): the 2-thread times suffer from it")
    config = recipe(args.quick, args.steps)
    train, heldout, vocab = load_text(config)
    c = config
    print(
        f"{c.num_blks} blocks of {c.num_hiddens} hiddens, {c.num_heads} heads, context {c.lm_num_steps}, batch "
        f"{c.batch_size}, {c.steps} steps per seed, {args.seeds} seed(s), {args.threads} thread(s); "
        f"{len(train):,} training and {len(heldout):,} held-out characters, {len(vocab)} in the vocabulary"
    )
    check_schedule(config)
    with limit_threads(args.threads, torch):
        if torch is not None:
            check_equal(config, len(vocab), train, torch)
        per_seed = [train_both(config, vocab, train, heldout, seed, torch) for seed in range(args.seeds)]
        gen_stats, text = time_generation(
            per_seed[0]["minitensor"]["model"], vocab, args.chars, c.lm_num_steps, 1 if args.quick else GEN_ROUNDS
        )
        gemms = None if torch is None else gemm_floor(torch, config, len(vocab), 5 if args.quick else GEMM_ROUNDS)
    memory = measure_memory(config, vocab, train, torch, min(args.memory_steps, c.steps), args.threads)
    report(args, config, per_seed, gen_stats, text, memory, torch, gemms)


def report(args, config, per_seed, gen_stats, text, memory, torch, gemms=None):
    names = ["minitensor"] + (["torch"] if torch is not None else [])
    tokens = config.batch_size * config.lm_num_steps
    rows = []
    for seed, runs in enumerate(per_seed):
        row = [seed]
        for name in names:
            r = runs[name]
            row += [f"{r['losses'][-1]:.4f}", f"{r['heldout']:.4f}", format_stats(Stats.of(r["times"]))]
        rows.append(row)
    mean = {name: float(np.mean([runs[name]["heldout"] for runs in per_seed])) for name in names}
    step = {name: Stats.of([t for runs in per_seed for t in runs[name]["times"]]) for name in names}
    rows.append(["all"] + sum([["", f"{mean[n]:.4f}", format_stats(step[n])] for n in names], []))
    headers = ["seed"] + sum(
        [[f"{n} last train loss", f"{n} held-out", f"{n} step (median ±IQR/2)"] for n in names], []
    )
    print_table(headers, rows, title=f"Training, {config.steps} steps per seed; held-out loss in nats per character")
    rows = [[n, format_stats(step[n]), f"{tokens / step[n].median:,.0f}"] for n in names]
    if torch is not None:
        rows.append(["minitensor / torch", format_ratio(step["minitensor"].median / step["torch"].median), ""])
    print_table(["", "ms per step", "tokens per second"], rows, title="Speed (all seeds' steps)")
    rows = [
        [n, format_mib(memory[n]["imported"]), format_mib(memory[n]["baseline"]),
         format_mib(memory[n]["peak"] - memory[n]["baseline"]), format_mib(memory[n]["absolute"])]
        for n in names
    ]  # fmt: skip
    print_table(
        ["", "after imports", "baseline", "peak above baseline", "peak (absolute)"],
        rows,
        title=f"Peak memory, each framework alone in a fresh process ({min(args.memory_steps, config.steps)} steps)",
    )
    if not all(memory[n]["is_reset"] for n in names):
        print("* the high-water mark could not be reset: ru_maxrss, which a process inherits from its parent")
    cached = gen_stats["KV cache (generate)"]
    rows = [[name, format_stats(s), format_ratio(s.median / cached.median)] for name, s in gen_stats.items()]
    print_table(
        ["", "time", "/ KV cache"], rows, title=f"Generating {args.chars} characters (seed 0's model), median time"
    )
    print(f"the KV cache and the recomputed contexts wrote the same text; its start: {text[:120]!r}")
    if gemms is not None:
        rows, total = gemms
        rows.append(["per step", "", f"{total['numpy'] * 1e3:.1f} ms", f"{total['torch'] * 1e3:.1f} ms",
                     format_ratio(total["numpy"] / total["torch"])])  # fmt: skip
        print_table(
            ["Linear layers' products, float32", "a step", "NumPy (OpenBLAS)", "PyTorch", "NumPy / PyTorch"],
            rows,
            title="The same matrix products alone, each BLAS on its own (median ±IQR/2): the floor under either step",
        )

    verdicts = [
        (mean["minitensor"] <= TARGET_LOSS, f"held-out loss {mean['minitensor']:.4f} (target <= {TARGET_LOSS})")
    ]
    if torch is not None:
        ratio = step["minitensor"].median / step["torch"].median
        verdicts.append((ratio <= TARGET_TIME, f"a step takes {ratio:.2f}x the twin's (target <= {TARGET_TIME}x)"))
        above = {n: memory[n]["peak"] - memory[n]["baseline"] for n in names}
        ratio = above["minitensor"] / max(above["torch"], 1)
        verdicts.append(
            (ratio <= TARGET_MEMORY, f"peak memory above baseline {ratio:.2f}x PyTorch's (target <= {TARGET_MEMORY}x)")
        )
    for ok, message in verdicts:
        print(f"{verdict(ok)}  {message}")
    if args.quick:
        print("--quick: a tiny model; the targets are judged on the full run")
    speedup = gen_stats["recompute, same crops"].median / cached.median
    print(f"generation: the KV cache is {speedup:.2f}x as fast as recomputing the same contexts")


if __name__ == "__main__":
    sys.exit(main())
