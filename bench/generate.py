"""Inference: key/value cache policies and speculative decoding on the GPT preset's model.

What is measured
----------------
The model is ``--preset gpt-char``'s GPT (4 pre-LN blocks of 128 hiddens, 4 heads, context 64)
with rotary positions instead of learned ones -- StreamingLLM needs positions that exist past
the trained context, and re-indexes them -- trained ``--steps`` steps (2,000) on the shipped
tinyshakespeare.txt with the preset's recipe, every window begun by <bos> as every document
an LLM reads begins with its start token (the token a model turns into its attention sink),
next to a *draft* a quarter its size (1 block), distilled from it for ``DRAFT_STEPS`` (6,000)
steps (the cross-entropy with the target's next-token distribution: DistillSpec, Zhou et al.
2023), for speculative decoding. ``--models DIR`` keeps the trained weights for the next run. Then:

1. *Speed and memory of each cache policy*: ``--tokens`` (1,000 and 4,000) tokens generated
   greedily after <bos>, one ``decode_step`` per token, with ``full``, ``window``
   (the last 64 positions), ``sinks`` (4 sinks + the last 60: the same 64 positions) and
   ``int8``; against *recomputing*, the whole sequence through the model at every step (no
   cache: what ``minitensor generate`` would cost without one), at 1,000 tokens only (it grows
   as the square: 4,000 would take 16 times as long). Tokens per second over the whole run
   (the median of ``ROUNDS`` runs for the 1,000-token cached rows, one run otherwise), and the
   cache's memory at the end (``bytes()`` summed over the blocks).
2. *Past the trained context*: the held-out text (the last 10% of the file) streamed through
   the model token by token with each policy, the mean next-token loss (nats per character)
   over positions 0-63 (inside the context), 64-999 and 1,000-3,999; and the reference that
   costs most, a sliding window with recomputation (every token predicted from the 64 before
   it, recomputed at positions 0-63: what the model was trained on). ``window`` drops the first
   tokens, which the model uses as attention sinks; ``sinks`` keeps 4 of them. Also printed: the
   attention weight the model puts on the first position of a 64-character window (mean over
   heads and the queries at positions 32-63), the reason sinks are needed.
3. *Memory of int8*: int8's cache against full's at 1,000 tokens, and the loss it costs on the
   held-out stream.
4. *Speculative decoding*: greedy generation of ``--spec-tokens`` (400) tokens with the target
   alone and with the draft proposing k = 2, 3, 4, 6 tokens per round (``--decoder speculative``),
   inside the trained context as ``minitensor generate`` decodes (``window``: in pieces):
   identical texts (the script asserts it), the time of each (median of ``ROUNDS``,
   interleaved), the speed-up and the acceptance rate; and what decides them, the time of one
   target step, one draft step and the target's step over k + 1 tokens.

Targets: the full cache >= 10x the tokens per second of recomputation at 1,000 tokens; int8
<= 0.3x the memory of full; speculative greedy >= 1.5x faster than the target alone, with
identical output (at the best k). ``--quick``: a tiny model (2 blocks of 32, context 16), 30 steps, 200 and 400
tokens; a smoke run, whose figures are not judged against the targets.

    python bench/generate.py [--quick] [--steps N] [--threads N]
"""

import argparse
import pathlib
import time

import numpy as np
from _common import (
    count_between,
    format_mib,
    format_ratio,
    limit_threads,
    print_header,
    print_table,
    thread_count,
    verdict,
)
from gpt_char import QUICK, batch_offsets, build_minitensor, cut, load_text, minitensor_step
from minitensor.nn.utils import clip_grad_norm_

import minitensor as mt

TARGET_SPEEDUP = 10.0  # full cache / recomputation, tokens per second at 1,000 tokens
TARGET_INT8 = 0.3  # int8 / full, cache memory
TARGET_SPECULATIVE = 1.5  # target alone / speculative, time for the same greedy text
ROUNDS = 3
SPEC_KS = (2, 3, 4, 6)  # draft tokens per round
DRAFT_STEPS = 6000  # distillation steps of the draft (3x the target's: a quarter the size, it trains fast)
SINKS = 4
BUCKETS = ((0, 64), (64, 1000), (1000, 4000))
QUICK_BUCKETS = ((0, 16), (16, 200), (200, 400))


# -- the models ------------------------------------------------------------------------------------------
def recipe(quick, steps, **changes):
    """``--preset gpt-char`` with rotary positions (a table of 8,192) and a <bos> token, tiny
    with ``quick``."""
    from minitensor.data import TEXTS
    from minitensor.train.config import TrainConfig

    sizes = QUICK if quick else {}
    fields = dict(sizes, positional="rotary", positional_options={"max_len": 8192}, special_tokens=True, **changes)
    return TrainConfig.recipe(preset="gpt-char", text=TEXTS["tinyshakespeare"], steps=steps, **fields)


def with_bos(bos, starts, ids, T):
    """nanoGPT's windows with <bos> first, as a text starts: inputs <bos> + T - 1 characters,
    targets those T characters. Every window the model trains on begins with the same token,
    as every document an LLM reads begins with <s>: the token that becomes its attention sink."""
    X, Y = cut(ids, starts, T - 1)
    X = np.concatenate([np.full((len(starts), 1), bos, dtype=np.int64), X], axis=1)
    return X, np.concatenate([X[:, 1:2], Y], axis=1)


def train(config, vocab, train_ids, folder=None, name="target", seed=0, teacher=None):
    """The recipe's training loop (bench/gpt_char.py's step) on nanoGPT's random windows, each
    begun by <bos>; with ``teacher``, distilled (Hinton et al. 2015): the loss is the cross-entropy
    with the teacher's next-token distribution instead of the next character, so that the model
    learns to agree with the teacher (what a speculative draft is for: DistillSpec, Zhou et al.
    2023). With ``folder``, the weights are kept there and read back on the next run (NumPy's
    .npz, no pickle) -- the measurements below need a trained model, not a new one."""
    model, optimizer, scheduler = build_minitensor(config, vocab, seed)
    path = None if folder is None else pathlib.Path(folder) / f"{name}-{config.steps}-{config.num_blks}.npz"
    if path is not None and path.exists():
        with np.load(path, allow_pickle=False) as saved:
            model.load_state_dict({k: mt.tensor(saved[k]) for k in saved.files})
        return model.eval()
    offsets = batch_offsets(len(train_ids), config.lm_num_steps, config.steps, config.batch_size, seed)
    for t in range(config.steps):
        X, Y = with_bos(vocab.bos, offsets[t], train_ids, config.lm_num_steps)
        if teacher is None:
            minitensor_step(model, optimizer, scheduler, X, Y, 1.0)
            continue
        X = mt.tensor(X)
        with mt.no_grad():
            p = mt.softmax(teacher(X), axis=-1)
        loss = -(p * mt.log_softmax(model(X), axis=-1)).sum(axis=-1).mean()
        optimizer.zero_grad()
        loss.backward()
        clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez(path, **{k: v.numpy() for k, v in model.state_dict().items()})
    return model.eval()


def heldout_loss(model, bos, heldout, context, batch=256):
    """Mean next-token loss over the held-out text cut into windows of <bos> + context - 1 characters."""
    starts = np.arange(0, len(heldout) - context, context - 1)
    total, count = 0.0, 0
    with mt.no_grad():
        for i in range(0, len(starts), batch):
            X, Y = with_bos(bos, starts[i : i + batch], heldout, context)
            total += mt.cross_entropy(model(mt.tensor(X)), mt.tensor(Y), reduction="sum").item()
            count += Y.size
    return total / count


def parameters(model):
    return sum(p.numpy().size for p in model.parameters())


# -- 1. speed and memory ------------------------------------------------------------------------------
def greedy_cached(lm, first, n, cache, options):
    """n tokens, one decode_step each, argmax: (seconds, tokens, cache bytes at the end)."""
    tokens = [first]
    with mt.no_grad():
        state = lm.begin_decoding(cache, options)
        start = time.perf_counter()
        for _ in range(n):
            logits, state = lm.decode_step(mt.tensor([[tokens[-1]]]), state)
            tokens.append(int(logits.numpy()[0, -1].argmax()))
        seconds = time.perf_counter() - start
    return seconds, tokens[1:], sum(c.bytes() for c in state[2])


def greedy_recomputed(lm, first, n):
    """n tokens, the whole sequence through the model at every step: (seconds, tokens)."""
    tokens = [first]
    with mt.no_grad():
        start = time.perf_counter()
        for _ in range(n):
            logits = lm(mt.tensor([tokens]))
            tokens.append(int(logits.numpy()[0, -1].argmax()))
        seconds = time.perf_counter() - start
    return seconds, tokens[1:]


def policies(context):
    """The policies compared, each holding `context` positions where it is bounded."""
    return {
        "full": {},
        "window": {"window": context},
        "sinks": {"sinks": SINKS, "window": context - SINKS},
        "int8": {},
    }


def speed(lm, first, lengths, context, rounds):
    rows, results = [], {}
    for name, options in policies(context).items():
        row = [name]
        for n in lengths:
            runs = [greedy_cached(lm, first, n, name, options) for _ in range(rounds if n == lengths[0] else 1)]
            seconds = float(np.median([r[0] for r in runs]))
            results[name, n] = (n / seconds, runs[0][2], runs[0][1])
            row += [f"{n / seconds:,.0f}", format_mib(runs[0][2])]
        rows.append(row)
    n = lengths[0]
    seconds, tokens = greedy_recomputed(lm, first, n)
    results["recompute", n] = (n / seconds, 0, tokens)
    rows.append(["recompute (no cache)", f"{n / seconds:,.0f}", "-"] + ["-", "-"] * (len(lengths) - 1))
    if tokens != results["full", n][2]:
        raise SystemExit("generation: the full cache and recomputation chose different tokens")
    headers = ["policy"] + [h for n in lengths for h in (f"tokens/s at {n:,}", f"cache at {n:,}")]
    print_table(headers, rows, title=f"1. Greedy generation, tokens per second and cache memory (window = {context})")
    return results


# -- 2. past the trained context ---------------------------------------------------------------------
def streamed_losses(lm, ids, cache, options):
    """The next-token loss of every position of ids, fed one token at a time through the cache."""
    losses = []
    with mt.no_grad():
        state = lm.begin_decoding(cache, options)
        for t in range(len(ids) - 1):
            logits, state = lm.decode_step(mt.tensor([[int(ids[t])]]), state)
            logp = mt.log_softmax(logits[0, -1], axis=-1).numpy()
            losses.append(-float(logp[ids[t + 1]]))
    return np.array(losses)


def sliding_losses(lm, ids, context, batch=256):
    """The reference: every position predicted from <bos> (ids[0]) and the `context` - 1 tokens
    before it, recomputed from position 0 -- what the model trained on (windows batched; the
    first ones are shorter)."""
    losses = []
    with mt.no_grad():
        for t in range(min(context - 1, len(ids) - 1)):  # the growing first windows
            logp = mt.log_softmax(lm(mt.tensor([ids[: t + 1]]))[0, -1], axis=-1).numpy()
            losses.append(-float(logp[ids[t + 1]]))
        ends = np.arange(context - 1, len(ids) - 1)
        for i in range(0, len(ends), batch):
            chunk = ends[i : i + batch]
            windows = np.stack([np.r_[ids[0], ids[e - context + 2 : e + 1]] for e in chunk])
            logp = mt.log_softmax(lm(mt.tensor(windows))[:, -1], axis=-1).numpy()
            losses += list(-logp[np.arange(len(chunk)), ids[chunk + 1]])
    return np.array(losses)


def first_token_attention(lm, bos, ids, context):
    """Mean attention weight on key 0 (<bos>) per block, queries at positions context/2 .. context-1."""
    windows = np.stack([np.r_[bos, ids[s : s + context - 1]] for s in range(0, 32 * context, context)])
    with mt.no_grad(), mt.nn.attention.plain_attention(lm):
        lm(mt.tensor(windows))
    return [float(w.numpy()[:, :, context // 2 :, 0].mean()) for w in lm.attention_weights]


def past_context(lm, bos, heldout, context, length, buckets):
    ids = np.r_[bos, heldout[:length]]  # the text begins with <bos>, as the training windows did
    curves = {name: streamed_losses(lm, ids, name, options) for name, options in policies(context).items()}
    curves["sliding window, recomputed"] = sliding_losses(lm, ids, context)
    rows = [[name] + [f"{c[a:b].mean():.3f}" for a, b in buckets] for name, c in curves.items()]
    print_table(
        ["policy"] + [f"positions {a}-{b - 1}" for a, b in buckets],
        rows,
        title=f"2. Held-out loss (nats/char) streaming {length:,} characters, context {context}",
    )
    sink = first_token_attention(lm, bos, heldout, context)
    print("attention on the first position of a window, per block: " + ", ".join(f"{w:.2f}" for w in sink))
    print(f"(uniform attention would give it 1/{context // 2}..1/{context}: {2 / context:.3f} to {1 / context:.3f})")
    return curves


# -- 4. speculative decoding ------------------------------------------------------------------------------
def step_time(model, tokens, rounds=50):
    """The median time of one decode_step feeding ``tokens`` new tokens after a 100-token cache."""
    with mt.no_grad():
        context = [5 + i % (model.config.vocab_size - 5) for i in range(100)]
        _, state = model.decode_step(mt.tensor([context]), model.begin_decoding())
        feed = mt.tensor([[7] * tokens])
        times = []
        for _ in range(rounds):
            start = time.perf_counter()
            model.decode_step(feed, state)
            times.append(time.perf_counter() - start)
    return float(np.median(times))


def speculative(lm, draft, vocab, n, rounds, context):
    """Greedy generation by the target alone and with the draft proposing k = SPEC_KS tokens a
    round, interleaved; the texts must be identical. Also the costs that decide the speed-up:
    a round costs k draft steps and one target step over k + 1 tokens, and yields 1 + (accepted
    proposals) tokens, so with acceptance rate a and c = draft step / target step the speed-up
    is about (1 + k a) / (k c + verify / target step)."""
    from minitensor.inference import decoder, generate

    def run(dec):
        start = time.perf_counter()
        # from <bos>, inside the trained context as `minitensor generate` decodes (pieces of
        # the context, each continuing from the last half of the one before): past it, the
        # full cache reads positions never trained, and the two models' garbage disagrees
        hyp = generate(lm, [], vocab, n, decoder=dec, window=context)
        return time.perf_counter() - start, hyp.tokens

    times = {"alone": []} | {k: [] for k in SPEC_KS}
    texts, rates = set(), {}
    for _ in range(rounds):  # interleaved, so that a slow moment of the machine hits all
        seconds, tokens = run(decoder("greedy"))
        times["alone"].append(seconds)
        texts.add("".join(tokens))
        for k in SPEC_KS:
            dec = decoder("speculative", draft=draft, k=k)
            seconds, tokens = run(dec)
            times[k].append(seconds)
            texts.add("".join(tokens))
            rates[k] = dec.search.stats.acceptance_rate
    if len(texts) != 1:
        raise SystemExit("speculative decoding: greedy speculative output differs from the target's greedy output")
    alone = float(np.median(times["alone"]))
    rows = [["target alone, greedy", f"{alone:.2f}", f"{n / alone:,.0f}", "-", "-"]]
    speedups = {}
    for k in SPEC_KS:
        s = float(np.median(times[k]))
        speedups[k] = alone / s
        rows.append([f"speculative, k = {k}", f"{s:.2f}", f"{n / s:,.0f}", f"{rates[k]:.2f}", format_ratio(alone / s)])
    print_table(
        ["decoding", "seconds", "tokens/s", "acceptance rate", "speed-up"],
        rows,
        title=f"4. Speculative decoding, {n} tokens from <bos> in pieces of the context, identical greedy text",
    )
    one, draft_one = step_time(lm, 1), step_time(draft, 1)
    verify = {k: step_time(lm, k + 1) for k in SPEC_KS}
    print(
        f"one decode_step: target {1000 * one:.2f} ms, draft {1000 * draft_one:.2f} ms (c = {draft_one / one:.2f}); "
        "the target over k + 1 tokens: " + ", ".join(f"k = {k}: {1000 * v:.2f} ms" for k, v in verify.items())
    )
    best = max(speedups, key=speedups.get)
    return best, speedups[best], rates[best]


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tiny model, 30 steps, 200 and 400 tokens")
    parser.add_argument("--threads", type=thread_count, default=None, help="threads (default 2)")
    parser.add_argument(
        "--steps", type=count_between(1, 100_000), default=None, help="training steps (default 2000; 30 quick)"
    )
    parser.add_argument("--models", help="a folder to keep the trained weights in and read them back from")
    parser.add_argument(
        "--spec-tokens",
        type=count_between(1, 100_000),
        default=None,
        help="tokens of the speculative run (default 400)",
    )
    args = parser.parse_args()
    args.threads = args.threads or 2
    args.steps = args.steps or (30 if args.quick else 2000)
    args.spec_tokens = args.spec_tokens or (60 if args.quick else 400)
    return args


def main():
    args = parse_args()
    print_header("Inference: key/value cache policies and speculative decoding (--preset gpt-char, rotary)", args.quick)
    config = recipe(args.quick, args.steps)
    draft_config = recipe(args.quick, args.steps if args.quick else DRAFT_STEPS, num_blks=1)
    train_ids, heldout, vocab = load_text(config)
    lengths, buckets = ((200, 400), QUICK_BUCKETS) if args.quick else ((1000, 4000), BUCKETS)
    context = config.lm_num_steps
    with limit_threads(args.threads):
        start = time.perf_counter()
        lm = train(config, vocab, train_ids, args.models, "target")
        draft = train(draft_config, vocab, train_ids, args.models, "draft-distilled", teacher=lm)
        print(
            f"trained the target ({parameters(lm):,} parameters) and the draft ({parameters(draft):,}), "
            f"{config.steps} and {draft_config.steps} steps (the draft distilled), "
            f"in {time.perf_counter() - start:.0f} s (or read from --models); held-out loss "
            + " and ".join(f"{heldout_loss(m, vocab.bos, heldout, context):.3f}" for m in (lm, draft))
        )
        first = vocab.bos
        results = speed(lm, first, lengths, context, 1 if args.quick else ROUNDS)
        curves = past_context(lm, vocab.bos, heldout, context, lengths[-1], buckets)
        best_k, speedup, rate = speculative(lm, draft, vocab, args.spec_tokens, 1 if args.quick else ROUNDS, context)
    n = lengths[0]
    cache_speedup = results["full", n][0] / results["recompute", n][0]
    int8_memory = results["int8", n][1] / results["full", n][1]
    int8_cost = curves["int8"][:n].mean() - curves["full"][:n].mean()
    print(f"\n3. int8: {format_ratio(int8_memory)} of full's cache memory; held-out loss {int8_cost:+.4f} nats/char")
    print("\nTargets" + ("  (--quick: a smoke run; the targets are judged on the full run)" if args.quick else ""))
    for what, ok in (
        (
            f"full cache / recomputation at {n:,} tokens: {format_ratio(cache_speedup)}  (>= {TARGET_SPEEDUP:g}x)",
            cache_speedup >= TARGET_SPEEDUP,
        ),
        (f"int8 / full cache memory: {format_ratio(int8_memory)}  (<= {TARGET_INT8}x)", int8_memory <= TARGET_INT8),
        (
            f"speculative greedy speed-up (best k, {best_k}): {format_ratio(speedup)}, acceptance rate {rate:.2f}  "
            f"(>= {TARGET_SPECULATIVE}x)",
            speedup >= TARGET_SPECULATIVE,
        ),
    ):
        print(f"  {what}" + ("" if args.quick else f"  {verdict(ok)}"))


if __name__ == "__main__":
    main()
