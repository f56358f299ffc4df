"""Length extrapolation on the reverse task: which positional encoding still works on
sequences longer than any it was trained on?

What is measured
----------------
For each positional encoding -- sinusoidal and learned (added to the embeddings), rotary
(rotates the queries and keys), ALiBi, T5's relative bias and a sliding window (biases on
the attention scores; the window here is ``WINDOW`` = 4 positions each side) -- and each
seed, a Transformer is trained with the default settings of ``TrainConfig`` on the reverse
task ("a b c" -> "c b a") with sequences of lengths 1-10; the run's own held-out set
has lengths 11-20 (``heldout_min_len`` / ``heldout_max_len``). Then the *final* model (not
``best/``, which was chosen by the held-out loss, i.e. by looking at the long lengths) is
scored by greedy decoding on two freshly generated sets of ``NUM_EVAL`` = 500 examples each,
drawn from a fixed NumPy seed (``EVAL_SEED``) that does not depend on the training seed:

- lengths 1-10, the lengths seen in training (with 20,000 training examples the short
  sequences surely also occur in training: this column asks "did it learn the task?");
- lengths 11-20, none of which it has seen: "does what it learnt carry over?".

The score is exact match (``minitensor.metrics.exact_match``: the whole output sequence
right, token for token), in percent. The table gives the median over the seeds and each
seed's pair of values.

Why: Press, Smith and Lewis (2022), "Train Short, Test Long: Attention with Linear Biases
Enables Input Length Extrapolation" (ICLR), found that sinusoidal, rotary and T5-style
encodings degrade on inputs longer than the training ones while ALiBi keeps working; they
measured language-model perplexity, this script asks the same question of a small
encoder-decoder on a task where every output token depends on a precise position.

Every run is reproducible: the training seeds everything with ``mt.manual_seed(seed)``
(initialisation, data, minibatch order), greedy decoding is deterministic, and the two
evaluation sets come from ``numpy.random.default_rng(EVAL_SEED)``. Each run trains in a
temporary folder, removed afterwards (without drawing the run's figures, which nobody would
see).

    python experiments/length_extrapolation.py                 # 6 encodings x 3 seeds, ~15-20 min on 2 CPU cores
    python experiments/length_extrapolation.py --encodings alibi,rotary --seeds 1
    python experiments/length_extrapolation.py --quick         # a smoke test: tiny sizes, seconds
"""

import argparse
import os
import statistics
import sys
import time

import numpy

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # _common, beside this script
from _common import (
    add_training_arguments,
    finish_training_arguments,
    footer,
    run_grid,  # noqa: E402
    train_throwaway,
)

ENCODINGS = ("sinusoidal", "learned", "rotary", "alibi", "t5_relative", "sliding_window")
WINDOW = 4  # sliding_window: each query sees the keys at most 4 positions away (5 back in the decoder, itself included)
ENCODING_OPTIONS = {"sliding_window": {"window": WINDOW}}
TRAIN_LENGTHS = (1, 10)  # TrainConfig's min_len, max_len
LONG_LENGTHS = (11, 20)  # the held-out lengths
NUM_EVAL = 500
EVAL_SEED = 20220101  # the evaluation sets, the same for every encoding and training seed
QUICK = dict(num_train=200, epochs=1, seeds=1, num_eval=20, num_heldout=20)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_training_arguments(parser, QUICK, "encoding")
    parser.add_argument(
        "--encodings",
        default=",".join(ENCODINGS),
        help=f"comma-separated positional encodings (default: {','.join(ENCODINGS)})",
    )
    parser.add_argument("--num-eval", type=int, default=None, help=f"examples per evaluation set (default {NUM_EVAL})")
    args = parser.parse_args(argv)
    args.encodings = [e.strip() for e in args.encodings.split(",") if e.strip()]
    if not args.encodings:
        parser.error("--encodings: give at least one encoding")
    return finish_training_arguments(parser, args, QUICK, extra=[("num_eval", NUM_EVAL)])


def evaluation_sets(num_examples, seed=EVAL_SEED):
    """{"1-10": pairs, "11-20": pairs}: reverse-task examples from their own generator."""
    from minitensor.data import reverse_task

    rng = numpy.random.default_rng(seed)
    return {f"{lo}-{hi}": reverse_task(num_examples, lo, hi, rng=rng) for lo, hi in (TRAIN_LENGTHS, LONG_LENGTHS)}


def exact_match_percent(model, pairs, src_vocab, tgt_vocab, batch_size=500):
    """Greedy-decoding exact match (percent) of ``model`` on ``pairs``, as the training loop's
    ``decode_heldout`` decodes, with room for the longest source and target (+ <eos>)."""
    from minitensor.inference import translate
    from minitensor.metrics import exact_match

    num_steps = max(len(src) for src, _ in pairs) + 1  # no source loses its tail or its <eos>
    max_len = max(len(tgt) for _, tgt in pairs) + 1  # the longest target and its <eos>
    preds = []
    for i in range(0, len(pairs), batch_size):
        hyps = translate(
            model, [src for src, _ in pairs[i : i + batch_size]], src_vocab, tgt_vocab, num_steps, max_len=max_len
        )
        preds.extend(h.tokens for h in hyps)
    return 100.0 * exact_match(preds, [tgt for _, tgt in pairs])


def run_one(encoding, seed, args, eval_sets):
    """Train one model (in a temporary folder) and score its final weights on each set."""
    result = train_throwaway(
        "length_extrapolation_",
        task="reverse",
        positional=encoding,
        positional_options=ENCODING_OPTIONS.get(encoding, {}),
        min_len=TRAIN_LENGTHS[0],
        max_len=TRAIN_LENGTHS[1],
        heldout_min_len=LONG_LENGTHS[0],
        heldout_max_len=LONG_LENGTHS[1],
        num_train=args.num_train,
        num_heldout=args.num_heldout,
        epochs=args.epochs,
        seed=seed,
    )
    model = result.model  # the final weights
    return {
        name: exact_match_percent(model, pairs, result.src_vocab, result.tgt_vocab, result.config.eval_batch_size)
        for name, pairs in eval_sets.items()
    }


def table(scores, seeds):
    names = list(next(iter(scores.values()))[0])  # "1-10", "11-20"
    lines = [
        f"| encoding | exact match, lengths {names[0]} (median of {len(seeds)} seed{'s' * (len(seeds) > 1)}) "
        f"| lengths {names[1]} (median) | per seed ({names[0]} / {names[1]}) |",
        "|---|---:|---:|---|",
    ]
    for encoding, runs in scores.items():
        medians = [statistics.median(run[name] for run in runs) for name in names]
        per_seed = ", ".join(f"seed {s}: {run[names[0]]:.1f} / {run[names[1]]:.1f}" for s, run in zip(seeds, runs))
        label = f"{encoding} (window {WINDOW})" if encoding == "sliding_window" else encoding
        lines.append(f"| {label} | {medians[0]:.1f}% | {medians[1]:.1f}% | {per_seed} |")
    return "\n".join(lines)


def main(argv=None):
    """Run the experiment and print its markdown report (also returned)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    from minitensor import plugins

    for encoding in args.encodings:
        plugins.lookup("positional encoding", encoding)  # an unknown name fails now, listing the known ones
    start = time.perf_counter()
    eval_sets = evaluation_sets(args.num_eval)
    seeds = list(range(args.seeds))
    scores = run_grid(args.encodings, seeds, lambda name, seed: run_one(name, seed, args, eval_sets))
    wall = time.perf_counter() - start
    report = "\n".join(
        [
            "## Length extrapolation on the reverse task",
            "",
            f"Trained on lengths {TRAIN_LENGTHS[0]}-{TRAIN_LENGTHS[1]} ({args.num_train:,} examples, {args.epochs} "
            f"epoch{'s' * (args.epochs > 1)}, TrainConfig's other defaults); greedy-decoding exact match of the final "
            f"model on {args.num_eval:,} fresh examples per length range (evaluation seed {EVAL_SEED}).",
            "",
            table(scores, seeds),
            "",
            *footer("length_extrapolation.py", argv, wall),
        ]
    )
    print(report, flush=True)
    return report


if __name__ == "__main__":
    main()
