"""D2L's attention chapter, the book's own PyTorch code, on minitensor and on PyTorch.

What it measures
----------------
The chapter's two translation models as the book writes them in PyTorch -- 11.4's Bahdanau
decoder on 10.7's GRU encoder, and 11.7's Transformer (``LazyLinear`` layers, ``masked_softmax``
with ``sequence_mask``'s ``X[~mask] = value``, ``bmm``, ``repeat_interleave``) -- are written once,
in ``tests/d2l_chapter.py``'s ``chapter_of(torch, nn, F)``, and built twice: on PyTorch, and with
minitensor in ``torch``'s place. No line differs between the two. At the sizes of the book's
English-French runs (11.4.3 and 11.7.6: 256 hidden units, embeddings of 256; the GRUs of 2
layers; the Transformer of 2 + 2 blocks of 4 heads with a feed-forward width of 64; dropout 0.2;
batches of 128 sentence pairs of 9 tokens; vocabularies of 200 here):

- *equality first*: with dropout 0 and float32, from the same weights (minitensor's, loaded into
  the PyTorch model by name), the same logits on one batch to 1e-4, or the script stops;
- *training step*: forward, the book's masked cross-entropy (``reduction='none'``, padding
  masked out, averaged over the real tokens), backward, Adam (lr 0.005 and 0.0015, the book's),
  in rounds that alternate the two frameworks, at ``--threads`` threads each; the median step.

Target: the book's code trains on minitensor in at most 1.0x its step time on PyTorch. Without
PyTorch the script says so and stops.

    python bench/d2l_book.py [--quick] [--threads N]
"""

import argparse
import pathlib
import sys

import numpy as np
from _common import (
    format_ratio,
    format_stats,
    import_torch,
    interleaved,
    limit_threads,
    print_header,
    print_table,
    thread_count,
    timed,
    verdict,
)

sys.path.insert(1, str(pathlib.Path(__file__).resolve().parent.parent / "tests"))  # the chapter's code
from d2l_chapter import chapter_of, translate  # noqa: E402

import minitensor as mt  # noqa: E402

TARGET = 1.0  # minitensor's step / PyTorch's, the same code
TOLERANCE = 1e-4  # logits, float32
VOCAB, PAD = 200, 0
# the book's English-French settings (11.4.3, 11.7.6); --quick: a smoke run
SIZES = {
    "full": dict(batch=128, steps=9, hiddens=256, embed=256, layers=2, ffn=64, heads=4, blocks=2, rounds=30),
    "quick": dict(batch=8, steps=5, hiddens=16, embed=16, layers=2, ffn=8, heads=4, blocks=1, rounds=3),
}
LR = {"bahdanau": 0.005, "transformer": 0.0015}


def models(lib, size, dropout):
    """{name: (encoder, decoder)} of the chapter's two translation models on ``lib``."""
    ch = chapter_of(lib, lib.nn, lib.nn.functional)
    s = size
    return {
        "bahdanau": (
            ch["Seq2SeqEncoder"](VOCAB, s["embed"], s["hiddens"], s["layers"], dropout),
            ch["Seq2SeqAttentionDecoder"](VOCAB, s["embed"], s["hiddens"], s["layers"], dropout),
        ),
        "transformer": (
            ch["TransformerEncoder"](VOCAB, s["hiddens"], s["ffn"], s["heads"], s["blocks"], dropout),
            ch["TransformerDecoder"](VOCAB, s["hiddens"], s["ffn"], s["heads"], s["blocks"], dropout),
        ),
    }


def batch(size, seed=0):
    """Sentence pairs of random tokens padded after a random length (at least 2), as arrays."""
    rng = np.random.default_rng(seed)
    n, steps = size["batch"], size["steps"]
    src, tgt = (rng.integers(1, VOCAB, (n, steps)) for _ in range(2))
    src_lens, tgt_lens = (rng.integers(2, steps + 1, n) for _ in range(2))
    src[np.arange(steps)[None, :] >= src_lens[:, None]] = PAD
    tgt[np.arange(steps)[None, :] >= tgt_lens[:, None]] = PAD
    return src, tgt, src_lens


def loss_of(lib, logits, data):
    """The book's ``Seq2Seq.loss``: cross-entropy per token, padding masked out, averaged."""
    Y = lib.tensor(data[1]).reshape(-1)
    per_token = lib.nn.CrossEntropyLoss(reduction="none")(logits.reshape(-1, VOCAB), Y)
    mask = (Y != PAD).type(lib.float32)
    return (per_token * mask).sum() / mask.sum()


def check_equal(torch, size):
    """The same logits from the same weights with dropout 0, for both models, or stop."""
    data = batch(size, seed=1)
    ours, theirs = models(mt, size, 0.0), models(torch, size, 0.0)
    worst = {}
    for name in ours:
        translate(mt, *ours[name], *data)  # the lazy layers take their widths
        translate(torch, *theirs[name], *data)
        for model, model_t in zip(ours[name], theirs[name], strict=True):
            model_t.load_state_dict({k: torch.tensor(v.numpy()) for k, v in model.state_dict().items()})
        got = translate(mt, *ours[name], *data).numpy()
        want = translate(torch, *theirs[name], *data).detach().numpy()
        worst[name] = float(np.abs(got - want).max() / np.abs(want).max())
        if worst[name] > TOLERANCE:
            sys.exit(f"{name}: minitensor's logits differ from PyTorch's by {worst[name]:.2e} (relative); stopping")
    print("equality first (dropout 0, float32, the same weights): largest relative logit differences "
          + ", ".join(f"{name} {d:.1e}" for name, d in worst.items()))  # fmt: skip


def step_of(lib, encoder, decoder, name, data):
    """One training step of the book's loop on ``lib``, as a function of nothing."""
    translate(lib, encoder, decoder, *data)  # the lazy layers take their widths
    params = list(encoder.parameters()) + list(decoder.parameters())
    optimizer = lib.optim.Adam(params, lr=LR[name])

    def step():
        loss = loss_of(lib, translate(lib, encoder, decoder, *data), data)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    return step


def main():
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, a few rounds (a smoke run)")
    parser.add_argument("--threads", type=thread_count, default=2, help="threads for each framework (default 2)")
    args = parser.parse_args()
    print_header("D2L's attention chapter, the book's PyTorch code, on minitensor and on PyTorch", args.quick)
    torch = import_torch()
    if torch is None:
        print("PyTorch is not installed: there is nothing to compare with (pip install -e '.[bench]')")
        return
    size = SIZES["quick" if args.quick else "full"]
    print(f"sizes: {size} (vocabularies of {VOCAB}); {args.threads} thread(s) each")
    with limit_threads(args.threads, torch):
        torch.manual_seed(0)
        mt.manual_seed(0)
        check_equal(torch, size)
        data = batch(size)
        ours, theirs = models(mt, size, 0.2), models(torch, size, 0.2)
        rows, ratios = [], {}
        for name in ours:
            cases = {
                "minitensor": timed(step_of(mt, *ours[name], name, data)),
                "PyTorch": timed(step_of(torch, *theirs[name], name, data)),
            }
            stats = interleaved(cases, rounds=size["rounds"], warmup=2)
            ratios[name] = stats["minitensor"].median / stats["PyTorch"].median
            rows.append(
                [name, format_stats(stats["minitensor"]), format_stats(stats["PyTorch"]), format_ratio(ratios[name])]
            )
    print_table(["model", "minitensor step", "PyTorch step", "ratio"], rows, title="training step (median ±IQR/2)")
    for name, ratio in ratios.items():
        line = f"the book's {name} takes {ratio:.2f}x its PyTorch step on minitensor (target <= {TARGET:.1f}x)"
        print(f"{verdict(ratio <= TARGET)}  {line}")


if __name__ == "__main__":
    main()
