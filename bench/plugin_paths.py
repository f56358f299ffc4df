"""A user's plugin on the fast path: the same time as the built-in it equals, declared capabilities.

What is measured
----------------
Causal self-attention through ``mt.nn.MultiHeadAttention`` (num_hiddens 512, 8 heads of 64,
batch 1, float32), forward and backward (``(Y * G).sum().backward()`` with a fixed G), at
T = 1,024 and 2,048, with three scorers that compute the same numbers:

- ``scaled_dot``, the built-in;
- ``user_scaled_dot``: a learner's own class, ``queries @ keys^T / sqrt(d)``, registered at
  run time under a new name, declaring the capabilities ``row_wise`` and ``dot_scale``
  (``minitensor/core/hookspecs.py``);
- ``undeclared``: the same class declaring nothing.

With ``fused="auto"`` the layer streams (``ops.flash_attention``) whenever the scorer and
pooling declare what the stream needs: the built-in and the declared plugin take the
streamed path, the undeclared one the plain path that builds the (T, T) scores. Before the
fast paths were chosen by capability they were chosen by name, and the user's plugin took
the plain path at 2.2x the time (T = 1,024) and 3.1x (T = 2,048). The outputs and gradients
of the three are checked to agree first.

Method: the three run interleaved after a warm-up, medians with half the IQR, at 2 threads
(``--threads``).

Target: the declared user plugin within 1.10x of the built-in at both lengths.

    python bench/plugin_paths.py [--quick] [--threads N]
"""

import argparse
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import (  # noqa: E402
    format_ratio,
    format_stats,
    interleaved,
    limit_threads,
    print_header,
    print_table,
    thread_count,
    timed,
    verdict,
)

TARGET = 1.10
SIZES = (1024, 2048)
QUICK_SIZES = (256,)


def plugin():
    """The learner's plugin: the scaled dot product, declared and undeclared."""
    from minitensor import hookimpl, nn

    class UserScaledDot(nn.Module):
        row_wise = True

        def __init__(self, query_size, key_size, **options):
            super().__init__()

        def forward(self, queries, keys):
            return queries @ keys.swapaxes(-1, -2) / math.sqrt(queries.shape[-1])

        def dot_scale(self, d_head):
            return 1.0 / math.sqrt(d_head)

    class Undeclared(UserScaledDot):
        row_wise = False
        dot_scale = None

    class Plugin:
        @hookimpl
        def minitensor_scorers(self):
            return {"user_scaled_dot": UserScaledDot, "undeclared": Undeclared}

    return Plugin()


def cases(T, num_hiddens=512, num_heads=8):
    import minitensor as mt

    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, T, num_hiddens), dtype=np.float32)
    g = mt.tensor(rng.standard_normal((1, T, num_hiddens), dtype=np.float32))
    steps, results = {}, {}
    for scorer in ("scaled_dot", "user_scaled_dot", "undeclared"):
        mt.manual_seed(0)
        layer = mt.nn.MultiHeadAttention(num_hiddens, num_heads, scorer=scorer)

        def step(layer=layer, name=scorer):
            X = mt.tensor(x, requires_grad=True)
            Y = layer(X, X, X, causal=True)
            (Y * g).sum().backward()
            results[name] = (Y.numpy(), X.grad.numpy())

        steps[scorer] = step
        # fused="auto": which path at this T (one tile: the stream's short-sequence form)?
        streams = layer._streams(T, T)
        results[scorer + " path"] = ("one tile" if layer._one_tile(T, T) else "streamed") if streams else "plain"
    return steps, results


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="T = 256, few rounds (a smoke run)")
    parser.add_argument("--threads", type=thread_count, default=min(2, os.cpu_count() or 1))
    args = parser.parse_args()
    import minitensor as mt

    print_header(__doc__.splitlines()[0], args.quick)
    mt.plugins.register(plugin(), name="bench-user-plugin")
    with limit_threads(args.threads):
        rows, ok = measure(args)
    print_table(
        ["T", "built-in", "user, declared", "user, undeclared", "declared/built-in", "undeclared/built-in", "paths"],
        rows,
        title=f"Causal MultiHeadAttention, 8 heads of 64, forward + backward, {args.threads} threads: median (±IQR/2)",
    )
    if args.quick:  # at T = 256 the declared layers are one tile, the undeclared one plain: not judged
        print("\n--quick: the target is judged on the full run (T = 1,024 and 2,048)")
    else:
        print(f"\ntarget: the declared user plugin <= {TARGET:.2f}x the built-in: {verdict(ok)}")


def measure(args):
    rows, ok = [], True
    for T in QUICK_SIZES if args.quick else SIZES:
        steps, results = cases(T)
        for step in steps.values():
            step()  # the agreement check below, and a warm-up
        for name in ("user_scaled_dot", "undeclared"):
            for got, want in zip(results[name], results["scaled_dot"]):
                np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=f"T={T}: {name} vs scaled_dot")
        stats = interleaved({k: timed(f) for k, f in steps.items()}, 3 if args.quick else 9, warmup=1)
        ratio = stats["user_scaled_dot"].median / stats["scaled_dot"].median
        ok &= ratio <= TARGET
        rows.append(
            [
                T,
                format_stats(stats["scaled_dot"]),
                format_stats(stats["user_scaled_dot"]),
                format_stats(stats["undeclared"]),
                format_ratio(ratio),
                format_ratio(stats["undeclared"].median / stats["scaled_dot"].median),
                " / ".join(results[name + " path"] for name in ("scaled_dot", "user_scaled_dot", "undeclared")),
            ]
        )
    return rows, ok


if __name__ == "__main__":
    main()
