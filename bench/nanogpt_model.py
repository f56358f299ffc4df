"""nanoGPT's own ``model.py``, unchanged, on minitensor and on PyTorch.

What it measures
----------------
nanoGPT's ``model.py`` (``../shared/refbench/nanogpt``, or ``--nanogpt DIR``; MIT-licensed, read
from its file by ``gpt_char.load_nanogpt``, nothing of it copied here) is executed twice: once as
written, on PyTorch, and once with minitensor in ``torch``'s place (while the file executes,
``sys.modules`` answers ``import torch``, ``torch.nn`` and ``torch.nn.functional`` with
minitensor, ``minitensor.nn`` and ``minitensor.nn.functional``). The second is a PyTorch program
running on minitensor with no line changed: its ``GPT``, its ``configure_optimizers`` (AdamW with
weight decay on the 2-D parameters), its ``generate`` (top-k, ``multinomial``).

- *equality first*: in float64 the GPT on minitensor, given the weights of the GPT on PyTorch
  (the same names: both are nanoGPT's), gives the same loss and gradients on one batch, to
  1e-9 relative, or the script stops;
- *training*: the recipe of ``--preset gpt-char`` in nanoGPT's terms (4 blocks of 128, 4 heads,
  context 64, batch 12 on the shipped Shakespeare; no dropout, whose random draws differ between
  the frameworks; nanoGPT's own optimiser at lr 1e-3, betas (0.9, 0.99), weight decay 0.1;
  clipping at 1), float32, from the same weights on the same batches, interleaved in blocks of
  25 steps at ``--threads`` threads each: the median step and the losses at the end;
- *generation*: 200 characters of each with nanoGPT's ``generate`` (temperature 0.8, top-k 10),
  printed, not judged (the two frameworks draw different random numbers).

Target: nanoGPT's model.py trains on minitensor in at most 1.0x its step time on PyTorch.
Without PyTorch or without nanoGPT's checkout the script says what is missing and stops.

    python bench/nanogpt_model.py [--quick] [--steps N] [--threads N] [--nanogpt DIR]
"""

import argparse
import contextlib
import gc
import io
import time

import numpy as np
from _common import count_between, format_ratio, import_torch, limit_threads, print_header, thread_count, verdict
from gpt_char import NANOGPT, batch_offsets, cut, load_nanogpt, load_text, recipe

TARGET = 1.0  # minitensor's step / PyTorch's, nanoGPT's model.py on each
TOLERANCE = 1e-9  # relative, float64
BLOCK = 25  # training steps per turn
LR, BETAS, WEIGHT_DECAY, CLIP = 1e-3, (0.9, 0.99), 0.1, 1.0


def build(module, config, vocab_size):
    """nanoGPT's GPT of the recipe's sizes (quietly: it prints its parameter count)."""
    c = config
    conf = module.GPTConfig(
        block_size=c.lm_num_steps, vocab_size=vocab_size, n_layer=c.num_blks, n_head=c.num_heads,
        n_embd=c.num_hiddens, dropout=0.0, bias=c.bias,
    )  # fmt: skip
    with contextlib.redirect_stdout(io.StringIO()):
        return module.GPT(conf)


def optimiser(model):
    with contextlib.redirect_stdout(io.StringIO()):  # it prints its parameter groups
        return model.configure_optimizers(WEIGHT_DECAY, LR, BETAS, "cpu")


def copy_weights(mt, theirs, ours, dtype):
    """Load the PyTorch GPT's weights into the minitensor GPT, as ``dtype``."""
    state = {name: mt.tensor(value.detach().numpy()).to(dtype) for name, value in theirs.state_dict().items()}
    ours.load_state_dict(state)


def check_equal(mt, torch, on_mt, on_torch, config, vocab_size, train):
    """Loss and gradients of one batch in float64, from the same weights, or stop."""
    torch.manual_seed(99)
    theirs = build(on_torch, config, vocab_size).double()
    ours = build(on_mt, config, vocab_size).to(mt.float64)
    copy_weights(mt, theirs, ours, mt.float64)
    X, Y = cut(train, batch_offsets(len(train), config.lm_num_steps, 1, config.batch_size, 99)[0], config.lm_num_steps)
    _, loss_t = theirs(torch.from_numpy(X), torch.from_numpy(Y))
    loss_t.backward()
    _, loss = ours(mt.tensor(X), mt.tensor(Y))
    loss.backward()
    grads = dict(theirs.named_parameters())
    d_loss = abs(loss.item() - loss_t.item()) / abs(loss_t.item())
    d_grad = max(
        float(np.abs(p.grad.numpy() - grads[n].grad.numpy()).max() / (np.abs(grads[n].grad.numpy()).max() + 1e-300))
        for n, p in ours.named_parameters()
    )
    print(
        f"float64, one batch: loss on minitensor {loss.item():.12f}, on PyTorch {loss_t.item():.12f}; largest "
        f"relative differences: loss {d_loss:.1e}, gradients {d_grad:.1e} ({len(grads)} parameter tensors)"
    )
    if max(d_loss, d_grad) > TOLERANCE:
        raise SystemExit(f"nanoGPT's model.py computes differently on minitensor (tolerance {TOLERANCE:g})")


def train_both(mt, torch, on_mt, on_torch, config, vocab_size, train, steps):
    """Both GPTs from the same float32 weights on the same batches, interleaved in blocks;
    {name: (step times, losses, model)}."""
    torch.manual_seed(0)
    theirs = build(on_torch, config, vocab_size)
    ours = build(on_mt, config, vocab_size)
    copy_weights(mt, theirs, ours, mt.float32)
    T = config.lm_num_steps
    offsets = batch_offsets(len(train), T, steps, config.batch_size, 0)
    runs = {}
    for name, lib, model, wrap in (
        ("minitensor", mt, ours, mt.tensor),
        ("PyTorch", torch, theirs, torch.from_numpy),
    ):
        runs[name] = {"times": [], "losses": [], "model": model, "opt": optimiser(model), "lib": lib, "wrap": wrap}

    def block(name, start, stop):
        r = runs[name]
        lib, model, opt, wrap = r["lib"], r["model"], r["opt"], r["wrap"]
        for t in range(start, stop):
            X, Y = (wrap(a) for a in cut(train, offsets[t], T))
            began = time.perf_counter()
            _, loss = model(X, Y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            lib.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
            opt.step()
            r["times"].append(time.perf_counter() - began)
            r["losses"].append(loss.item())

    names = list(runs)
    for k, start in enumerate(range(0, steps, BLOCK)):
        for name in names if k % 2 == 0 else reversed(names):
            gc.collect()
            block(name, start, min(start + BLOCK, steps))
    return runs


def generate(lib, model, vocab, n, seed):
    lib.manual_seed(seed)
    model.eval()
    start = lib.zeros((1, 1), dtype=lib.long)  # nanoGPT's sample.py starts from token 0 as well
    out = model.generate(start, n, temperature=0.8, top_k=10)
    return "".join(vocab.idx_to_token[int(i)] for i in np.asarray(out.numpy())[0, 1:])


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tiny model, 50 steps, 40 characters")
    parser.add_argument("--threads", type=thread_count, default=None, help="threads of each framework (default 2)")
    parser.add_argument("--steps", type=count_between(1, 100_000), default=None, help="steps (default 300; 50 quick)")
    parser.add_argument("--nanogpt", default=str(NANOGPT), help="the folder of nanoGPT's model.py (a reference)")
    args = parser.parse_args()
    args.threads = args.threads or 2
    args.steps = args.steps or (50 if args.quick else 300)
    return args


def main():
    args = parse_args()
    print_header("nanoGPT's own model.py, unchanged, on minitensor and on PyTorch", args.quick)
    torch = import_torch()
    if torch is None:
        print("PyTorch is not installed: there is nothing to compare with (pip install torch, the CPU build)")
        return
    import minitensor as mt

    on_torch = load_nanogpt(args.nanogpt)
    if on_torch is None:
        print(f"nanoGPT's model.py is not at {args.nanogpt}: give its folder with --nanogpt DIR")
        return
    on_mt = load_nanogpt(args.nanogpt, mt)
    config = recipe(args.quick, args.steps)
    train, _, vocab = load_text(config)
    c = config
    print(
        f"{c.num_blks} blocks of {c.num_hiddens}, {c.num_heads} heads, context {c.lm_num_steps}, batch {c.batch_size}, "
        f"{args.steps} steps, {args.threads} thread(s); nanoGPT's model.py from {args.nanogpt}"
    )
    with limit_threads(args.threads, torch):
        check_equal(mt, torch, on_mt, on_torch, config, len(vocab), train)
        runs = train_both(mt, torch, on_mt, on_torch, config, len(vocab), train, args.steps)
    steps = {name: float(np.median(r["times"][min(5, len(r["times"]) - 1) :])) for name, r in runs.items()}
    for name, r in runs.items():
        last = np.mean(r["losses"][-10:])
        print(f"{name:<10}  {1000 * steps[name]:6.1f} ms per step (median)   mean loss of the last 10 steps {last:.4f}")
    ratio = steps["minitensor"] / steps["PyTorch"]
    print(f"minitensor / PyTorch: {format_ratio(ratio)}")
    n = 40 if args.quick else 200
    for name, r in runs.items():
        print(f"{name} writes: {generate(r['lib'], r['model'], vocab, n, 1337)!r}")
    if args.quick:
        print("--quick: a tiny model; the target is judged on the full run")
    print(f"{verdict(ratio <= TARGET)}  nanoGPT's model.py takes {format_ratio(ratio)} its PyTorch step on minitensor")


if __name__ == "__main__":
    main()
