"""docs/pytorch_differences.md: what ``scripts/pytorch_api.py`` writes, with a reason in every row.

Without PyTorch (as in CI) the committed page is checked on its own: it parses, every name
appears once and every row says "same", "aligned" or why it differs. With PyTorch, the page
is regenerated and must equal the committed one, so a change to the public API that is not
written up (a new name, a new argument) fails here until the page is regenerated.
"""

import re
from pathlib import Path

import pytest
from helpers import load_module

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "pytorch_differences.md"
SCRIPT = ROOT / "scripts" / "pytorch_api.py"


def load_script():
    return load_module(SCRIPT, "pytorch_api")


def table_rows(text):
    """The cells of every table row that names a minitensor object, by section."""
    sections, current = {}, None
    for line in text.splitlines():
        if line.startswith("## "):
            current = sections.setdefault(line[3:], [])
        elif line.startswith("| `"):
            cells = [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line)[1:-1]]
            current.append(cells)
    return sections


def test_the_page_parses_and_every_row_has_a_reason():
    text = PAGE.read_text(encoding="utf-8")
    title, intro = text.split("\n\n")[:2]
    assert title.startswith("# ") and "python scripts/pytorch_api.py" in intro
    sections = table_rows(text)
    assert set(sections) == {"Modules", "Tensor methods and attributes"}
    rows = [row for section in sections.values() for row in section]
    assert len(rows) > 150
    names = [row[0] for row in rows]
    assert len(names) == len(set(names)), "a name appears twice"
    for name, torch_name, differences, reason in rows:  # four cells, or this unpacking fails
        assert reason and reason != "MISSING", f"{name}: no reason (add one to REASONS in scripts/pytorch_api.py)"
        if torch_name == "—":
            assert reason.startswith("extra"), f"{name} is not in PyTorch: its reason should say what it adds"
        elif differences != "—":
            assert reason != "same", f"{name} differs ({differences}) but says 'same'"
    assert {"`mt.gelu`", "`mt.nn.GELU`", "`mt.nn.functional.gelu`", "`Tensor.data`"} <= set(names)


def test_the_page_is_what_the_script_writes():
    torch = pytest.importorskip("torch")
    script = load_script()
    committed = PAGE.read_text(encoding="utf-8")
    recorded = re.search(r"Generated with torch (\S+)\.", committed).group(1)
    if recorded != torch.__version__.split("+")[0]:
        pytest.skip(f"the page was generated with torch {recorded}, this is {torch.__version__}")
    rows = script.module_rows(), script.tensor_rows()
    assert script.page(rows) == committed, "docs/pytorch_differences.md is stale: run python scripts/pytorch_api.py"
    assert script.stale_entries(rows) == [], "REASONS/ALIGNED/ELSEWHERE name things that no longer exist"


def test_signature_comparison_rules():
    """The comparison itself, on made-up signatures (no PyTorch needed)."""
    script = load_script()
    P, R, K = script.Param, script.REQUIRED, script.inspect.Parameter.KEYWORD_ONLY
    pos = script.inspect.Parameter.POSITIONAL_OR_KEYWORD
    mine = [P("x", pos, R), P("axis", pos, "-1"), P("mask", pos, "None")]
    theirs = [P("input", pos, R), P("dim", pos, R), P("out", K, "None"), P("dtype", K, "None")]
    # x ~ input by position, axis ~ dim by name, `out` ignored, the rest one-sided
    assert script.compare(mine, theirs) == [
        "`axis=-1` (torch: `dim`)",
        "only here: `mask=None`",
        "only torch: `dtype=None`",
    ]
    assert script.compare([P("alpha", K, "1.0")], [P("alpha", K, "1")]) == []  # 1.0 == 1
    documented = script._parse_documented(r"start=0, end, step=1, \*, out=None, dtype=None")
    assert [repr(p) for p in documented] == ["start=0", "end", "step=1", "out=None", "dtype=None"]
