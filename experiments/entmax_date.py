"""Sparse attention on the date task: entmax15 against softmax pooling.

What is measured
----------------
For each pooling (``softmax``, ``entmax15``) and each seed, a Transformer is trained with
the default settings of ``TrainConfig`` (date normalisation, "Monday, May 3, 2021" ->
"2021-05-03": 20,000 examples, 4 epochs), changing only the pooling. Then, for the *final*
model:

- the held-out exact match: the run's own score after its last epoch (greedy decoding of
  the 1,000 held-out examples, whose calendar dates never occur in training);
- the fraction of attention weights that are exactly 0, among the keys the masks allow.
  The model runs once, teacher-forced and without dropout, on a batch of ``BATCH`` = 500
  held-out examples with their valid lengths, and every layer's ``attention_weights``
  (batch, heads, queries, keys) is read:

  * encoder self-attention: queries and keys at valid source positions;
  * decoder self-attention: queries at valid target positions, keys j <= i (causal);
  * cross-attention: queries at valid target positions, keys at valid source positions;

  and "overall" pools the three. A query with a single allowed key (the decoder's first
  position) always gives weight 1 to it, so no pooling reaches 100%.

Softmax gives every allowed key a positive weight (a zero only by floating-point underflow),
so its fractions should sit near 0; entmax15 (Peters, Niculae and Martins 2019, "Sparse
Sequence-to-Sequence Models", ACL) is the alpha = 1.5 member of the alpha-entmax family
between softmax (alpha = 1) and sparsemax (alpha = 2), whose weights are exactly zero on
keys whose scores fall below a threshold. The question is whether it learns the task as
well, and how sparse its attention becomes when it does. The table gives the median over
the seeds, and each seed's values.

Every run is reproducible: the training seeds everything with ``mt.manual_seed(seed)``, and
the held-out batch is the run's own held-out set, rebuilt from the same seed. Each run
trains in a temporary folder, removed afterwards (without drawing its figures).

    python experiments/entmax_date.py              # 2 poolings x 3 seeds, ~6 min on 2 CPU cores
    python experiments/entmax_date.py --seeds 1
    python experiments/entmax_date.py --quick      # a smoke test: tiny sizes, seconds
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

POOLINGS = ("softmax", "entmax15")
KINDS = ("encoder self", "decoder self", "cross", "overall")
BATCH = 500
QUICK = dict(num_train=200, epochs=1, seeds=1, num_heldout=20)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_training_arguments(parser, QUICK, "pooling")
    parser.add_argument(
        "--poolings", default=",".join(POOLINGS), help=f"comma-separated poolings (default: {','.join(POOLINGS)})"
    )
    args = parser.parse_args(argv)
    args.poolings = [p.strip() for p in args.poolings.split(",") if p.strip()]
    if not args.poolings:
        parser.error("--poolings: give at least one pooling")
    return finish_training_arguments(parser, args, QUICK)


def allowed_masks(enc_valid_lens, dec_valid_lens, num_enc_steps, num_dec_steps):
    """{kind: bool (batch, 1, Q, K)}: the (query, key) cells the masks allow, queries only
    at valid positions (True = counted)."""
    enc_ok = numpy.arange(num_enc_steps)[None, :] < enc_valid_lens[:, None]  # (batch, T_enc)
    dec_ok = numpy.arange(num_dec_steps)[None, :] < dec_valid_lens[:, None]  # (batch, T_dec)
    causal = numpy.tril(numpy.ones((num_dec_steps, num_dec_steps), dtype=bool))  # key j <= query i
    return {
        "encoder self": (enc_ok[:, :, None] & enc_ok[:, None, :])[:, None],
        "decoder self": (dec_ok[:, :, None] & causal[None])[:, None],
        "cross": (dec_ok[:, :, None] & enc_ok[:, None, :])[:, None],
    }


def zero_fractions(model, pairs, src_vocab, tgt_vocab, num_steps, tgt_num_steps):
    """{kind: percent of the allowed attention weights that are exactly 0}, over every block
    and head, from one teacher-forced forward pass on ``pairs``."""
    import minitensor as mt
    from minitensor.data import seq2seq_arrays

    enc_X, enc_valid_lens, dec_X, dec_valid_lens, _ = seq2seq_arrays(
        pairs, src_vocab, tgt_vocab, num_steps, tgt_num_steps
    )
    device = model.decoder.dense.weight.device
    was_training = model.training
    model.eval()
    try:
        with mt.no_grad():
            model(
                mt.tensor(enc_X, device=device),
                mt.tensor(dec_X, device=device),
                mt.tensor(enc_valid_lens, device=device),
            )
    finally:
        model.train(was_training)
    self_weights, cross_weights = model.decoder.attention_weights
    layers = {"encoder self": model.encoder.attention_weights, "decoder self": self_weights, "cross": cross_weights}
    masks = allowed_masks(enc_valid_lens, dec_valid_lens, enc_X.shape[1], dec_X.shape[1])
    counts = {}
    for kind, weights in layers.items():
        zeros = allowed = 0
        for w in weights:
            w = w.numpy()  # (batch, heads, Q, K)
            mask = numpy.broadcast_to(masks[kind], w.shape)
            zeros += int(numpy.count_nonzero((w == 0) & mask))
            allowed += int(numpy.count_nonzero(mask))
        counts[kind] = (zeros, allowed)
    counts["overall"] = tuple(sum(c[i] for c in counts.values()) for i in (0, 1))
    return {kind: 100.0 * zeros / allowed for kind, (zeros, allowed) in counts.items()}


def run_one(pooling, seed, args):
    """Train one model (in a temporary folder); its held-out exact match and zero fractions."""
    import minitensor as mt
    from minitensor.train import build_data

    result = train_throwaway(
        "entmax_date_",
        task="date",
        pooling=pooling,
        num_train=args.num_train,
        num_heldout=args.num_heldout,
        epochs=args.epochs,
        seed=seed,
    )
    mt.manual_seed(seed)  # the run's data again: the same held-out examples
    data = build_data(result.config, vocabs=(result.src_vocab, result.tgt_vocab))
    zeros = zero_fractions(
        result.model, data.heldout[:BATCH], data.src_vocab, data.tgt_vocab, data.num_steps, data.tgt_num_steps
    )
    return {"exact match": 100.0 * result.accuracy, **zeros}


def table(scores, seeds):
    columns = ("exact match",) + KINDS
    n = len(seeds)
    lines = [
        f"| pooling | held-out exact match (median of {n} seed{'s' * (n > 1)}) | "
        + " | ".join(f"zero weights: {kind}" for kind in KINDS)
        + " | per seed (exact match / zero weights overall) |",
        "|---|" + "---:|" * len(columns) + "---|",
    ]
    for pooling, runs in scores.items():
        medians = [statistics.median(run[c] for run in runs) for c in columns]
        per_seed = ", ".join(
            f"seed {s}: {run['exact match']:.1f} / {run['overall']:.1f}" for s, run in zip(seeds, runs)
        )
        lines.append(f"| {pooling} | " + " | ".join(f"{m:.1f}%" for m in medians) + f" | {per_seed} |")
    return "\n".join(lines)


def main(argv=None):
    """Run the experiment and print its markdown report (also returned)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    from minitensor import plugins

    for pooling in args.poolings:
        plugins.lookup("pooling", pooling)  # an unknown name fails now, listing the known ones
    start = time.perf_counter()
    seeds = list(range(args.seeds))
    scores = run_grid(args.poolings, seeds, lambda name, seed: run_one(name, seed, args))
    wall = time.perf_counter() - start
    report = "\n".join(
        [
            "## entmax15 against softmax pooling on the date task",
            "",
            f"{args.num_train:,} training examples, {args.epochs} epoch{'s' * (args.epochs > 1)}, TrainConfig's other "
            f"defaults; exact match: greedy decoding of the final model on the {args.num_heldout:,} held-out examples; "
            f"zero weights: percent of the attention weights over allowed keys that are exactly 0, on "
            f"{min(BATCH, args.num_heldout):,} held-out examples (all blocks and heads).",
            "",
            table(scores, seeds),
            "",
            *footer("entmax_date.py", argv, wall),
        ]
    )
    print(report, flush=True)
    return report


if __name__ == "__main__":
    main()
