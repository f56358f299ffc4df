"""Two-dimensional convolution: minitensor's im2col ``conv2d`` vs PyTorch's, forward + backward.

What is measured
----------------
``mt.conv2d`` (``minitensor/core/ops/conv.py``) stacks one strided slice of the input per
filter tap into a matrix of windows (im2col) and makes the convolution one matrix product; its
backward adds each tap's gradient back (col2im). PyTorch (oneDNN on the CPU) convolves
directly. One sample is a forward and a backward (gradients of the input and the weights, no
bias) in float32, each library in turn, medians, at three shapes:

* ``vit patches``: D2L 11.8's patch embedding, kernel = stride = 4 on a batch of 64 images of
  16 x 16 (tutorial 13): the windows do not overlap, so im2col copies each input once;
* ``3x3 same``: a 3 x 3 convolution with padding 1 on 32 x 32 maps of 16 channels, batch 32,
  a convolutional network's common layer: every input lands in 9 windows;
* ``5x5 stride 2``: 5 x 5, stride 2, padding 2, 3 channels of 64 x 64, batch 16.

Targets: the patch embedding <= 1.0x PyTorch (what tutorial 13 runs); the overlapping kernels
<= 2x PyTorch, which im2col in NumPy misses (bench/README.md says why and what would close it).

    python bench/conv.py [--quick]
"""

import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from _common import (  # noqa: E402
    THREAD_COUNTS,
    format_ratio,
    format_stats,
    import_torch,
    interleaved,
    limit_threads,
    parse_args,
    print_header,
    print_table,
    timed,
    verdict,
)

import minitensor as mt  # noqa: E402

# name: (batch, channels, size, out_channels, kernel, stride, padding), and its target vs PyTorch
SHAPES = {
    "vit patches": ((64, 1, 16, 32, 4, 4, 0), 1.0),
    "3x3 same": ((32, 16, 32, 32, 3, 1, 1), 2.0),
    "5x5 stride 2": ((16, 3, 64, 16, 5, 2, 2), 2.0),
}


def cases(shape, torch):
    """name -> a callable running one forward + backward, on the same float32 data."""
    N, C, size, O, k, stride, padding = shape
    rng = np.random.default_rng(0)
    x = rng.standard_normal((N, C, size, size), dtype=np.float32)
    w = rng.standard_normal((O, C, k, k), dtype=np.float32) * 0.1
    X, W = mt.tensor(x, requires_grad=True), mt.tensor(w, requires_grad=True)

    def minitensor():
        mt.conv2d(X, W, None, stride, padding).sum().backward()
        X.grad = W.grad = None

    runs = {"minitensor": minitensor}
    if torch is not None:
        tX, tW = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)

        def pytorch():
            torch.nn.functional.conv2d(tX, tW, None, stride, padding).sum().backward()
            tX.grad = tW.grad = None

        runs["torch"] = pytorch
        # the same numbers first: a benchmark of a wrong convolution would mean nothing
        minitensor_out = mt.conv2d(X, W, None, stride, padding).numpy()
        torch_out = torch.nn.functional.conv2d(tX, tW, None, stride, padding).detach().numpy()
        np.testing.assert_allclose(minitensor_out, torch_out, rtol=1e-4, atol=1e-4)
    return runs


def main():
    args = parse_args(__doc__)
    print_header("bench/conv.py: conv2d forward + backward, float32, minitensor (im2col) vs PyTorch", args.quick)
    torch = import_torch()
    rounds = 5 if args.quick else 30
    verdicts = []
    for threads in THREAD_COUNTS:
        rows = []
        for name, (shape, target) in SHAPES.items():
            runs = cases(shape, torch)
            with limit_threads(threads, torch):
                stats = interleaved({key: timed(run) for key, run in runs.items()}, rounds, warmup=2)
            ratio = stats["minitensor"].median / stats["torch"].median if torch is not None else None
            rows.append(
                [name, str(shape), format_stats(stats["minitensor"]), format_stats(stats["torch"]) if torch else "-"]
                + [format_ratio(ratio)]
            )
            if ratio is not None:
                verdicts.append((f"{name}, {threads} thread(s): {ratio:.2f}x <= {target}x", ratio <= target))
        heads = ["shape", "(N, C, size, O, k, stride, padding)", "minitensor", "torch", "mt / torch"]
        print_table(heads, rows, title=f"{threads} thread(s), medians of {rounds}")
    if torch is None:
        print("\nPyTorch is not installed: no ratios, no targets (pip install torch==2.13.0)")
        return
    print("\nTargets (minitensor / torch, forward + backward):")
    for text, ok in verdicts:
        print(f"  {verdict(ok)}  {text}")


if __name__ == "__main__":
    main()
