"""The experiment scripts (experiments/) run end to end: their --quick mode, in-process.

Each prints a markdown table with a row per positional encoding / pooling and percentages
in [0, 100]; the numbers themselves (tiny models, one epoch) mean nothing here.
"""

import re
from pathlib import Path

import pytest
from helpers import load_module

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"


def load(name):
    return load_module(EXPERIMENTS / f"{name}.py", f"experiments_{name}")


def table_rows(report):
    """{first cell: [the other cells]} of the markdown table's body rows."""
    lines = [line for line in report.splitlines() if line.startswith("|")]
    assert len(lines) >= 3, report
    assert set(lines[1].replace("|", "").replace(":", "")) == {"-"}, lines[1]  # the separator row
    rows = {}
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = cells[1:]
    return rows


def percentages(cells):
    """Every number in the cells that is a score (not a seed number)."""
    values = []
    for cell in cells:
        cell = re.sub(r"seed \d+:", "", cell)
        values.extend(float(x) for x in re.findall(r"-?\d+(?:\.\d+)?", cell))
    return values


def check_scores(values):
    assert values, "no numbers in the table"
    for value in values:
        assert 0.0 <= value <= 100.0, value


def test_length_extrapolation_quick(capsys):
    module = load("length_extrapolation")
    report = module.main(["--quick"])
    assert report in capsys.readouterr().out
    rows = table_rows(report)
    assert [name.split(" ")[0] for name in rows] == list(module.ENCODINGS)
    assert f"window {module.WINDOW}" in next(name for name in rows if name.startswith("sliding_window"))
    for cells in rows.values():
        assert len(cells) == 3 and all(c.endswith("%") for c in cells[:2]) and cells[2].startswith("seed 0:")
        check_scores(percentages(cells))
    assert "command: `python experiments/length_extrapolation.py --quick`" in report
    assert "wall time:" in report


def test_length_extrapolation_options(capsys):
    module = load("length_extrapolation")
    report = module.main(["--quick", "--encodings", "alibi", "--num-eval", "5"])
    assert list(table_rows(report)) == ["alibi"]
    with pytest.raises(SystemExit):
        module.parse_args(["--seeds", "0"])


def test_entmax_date_quick(capsys):
    module = load("entmax_date")
    report = module.main(["--quick"])
    assert report in capsys.readouterr().out
    rows = table_rows(report)
    assert list(rows) == list(module.POOLINGS)
    for cells in rows.values():
        assert len(cells) == 1 + len(module.KINDS) + 1
        check_scores(percentages(cells))
    # softmax is positive on every allowed key (no underflow after two steps): a zero counted
    # here would be a masked-out key counted as allowed
    assert rows["softmax"][1:5] == ["0.0%"] * 4
    assert "command: `python experiments/entmax_date.py --quick`" in report
