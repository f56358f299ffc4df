"""``bench/launches.py --quick`` runs: both models' tables print, with PyTorch's column where
PyTorch (and, for the GPT, nanoGPT's model.py) is there, and minitensor's launches by phase; and
the streamed attention call's, on the tiles and on the CUDA kernels."""

import pathlib
import subprocess
import sys

SCRIPT = pathlib.Path(__file__).resolve().parent.parent / "bench" / "launches.py"


def test_the_quick_run_prints_its_tables():
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--by-file"], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    for model in ("gpt", "transformer"):
        assert f"\n{model}: " in out and f"{model}: where minitensor's launches come from" in out, model
    for phase in ("forward", "backward", "clipping", "optimiser", "total"):
        assert f"\n{phase} " in out, phase
    has_torch = "PyTorch is not installed" not in out
    assert ("PyTorch ops" in out) == has_torch
    if has_torch and "nanoGPT's model.py is not at" not in out:
        assert out.count("launches per step <=") == 2  # a verdict for each model
    # the GPT's step with its attention on the CUDA kernels (dropout inside): fewer than the plain path's
    plain = int(out.split("\ntotal", 1)[1].split()[0])
    streamed = int(out.split("with --fused on (attention on the CUDA kernels, dropout inside): ", 1)[1].split()[0])
    assert streamed < plain, (streamed, plain)
    # one streamed attention call: a few launches on the kernels, hundreds on the tiles
    table = out[out.index("streamed attention: one causal flash_attention call") :]
    names = ("none", "ALiBi", "learned table")
    rows = {
        line.split("  ")[0]: [int(n) for n in line.split()[-2:]]
        for line in table.splitlines()
        if line.startswith(names)
    }
    assert set(rows) == {"none", "ALiBi", "learned table"}, table
    assert all(kernels <= 4 and tiles > 100 for tiles, kernels in rows.values()), rows
