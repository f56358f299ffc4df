"""Every tutorial runs, in smoke mode, and asserts its own claims on the way."""

import os
import pathlib
import subprocess
import sys

import pytest

TUTORIALS = sorted(pathlib.Path(__file__).resolve().parent.parent.joinpath("tutorials").glob("[0-9][0-9]_*.py"))

pytest.importorskip("matplotlib")


@pytest.mark.parametrize("path", TUTORIALS, ids=[p.stem for p in TUTORIALS])
def test_tutorial_runs_in_smoke_mode_and_draws_its_figures(path, tmp_path):
    env = dict(os.environ, MINITENSOR_TUTORIAL_SMOKE="1", MINITENSOR_TUTORIAL_OUT=str(tmp_path), MPLBACKEND="Agg")
    done = subprocess.run([sys.executable, str(path)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, f"{path.name} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    figures = list((tmp_path / path.stem).glob("*.png"))
    assert figures, f"{path.name} wrote no figure"
    assert all(f.stat().st_size > 1000 for f in figures)


def test_tutorials_are_jupytext_percent_scripts():
    """Prose in markdown cells, code in code cells: the file opens as a notebook."""
    assert len(TUTORIALS) == 8
    for path in TUTORIALS:
        text = path.read_text(encoding="utf-8")
        assert text.count("# %% [markdown]") >= 3, path.name
        assert "Exercises" in text, path.name
    jupytext = pytest.importorskip("jupytext")
    for path in TUTORIALS:
        notebook = jupytext.read(path)
        kinds = {cell.cell_type for cell in notebook.cells}
        assert kinds == {"markdown", "code"}, path.name
