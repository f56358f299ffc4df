"""Every tutorial runs, in smoke mode, and asserts its own claims on the way; the tutorials cite
sources a reader can open."""

import pathlib
import re
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
TUTORIALS = sorted(ROOT.joinpath("tutorials").glob("[0-9][0-9]_*.py"))
# Both editions: English (tutorials/) and Chinese (tutorials/zh/, held to the English code by
# tests/test_tutorials_zh.py).
EDITIONS = TUTORIALS + sorted(ROOT.joinpath("tutorials", "zh").glob("[0-9][0-9]_*.py"))
EDITION_IDS = [("zh/" if p.parent.name == "zh" else "") + p.stem for p in EDITIONS]
GLOSSARY = ROOT / "tutorials" / "GLOSSARY.md"
README = ROOT / "README.md"

# D2L's attention chapter, section by section: the Chinese edition (zh.d2l.ai, chapter 10) and
# the English one (d2l.ai, chapter 11). A citation gives the number with its title.
D2L_ZH = {
    "10.1": "注意力提示",
    "10.2": "注意力汇聚：Nadaraya-Watson 核回归",
    "10.3": "注意力评分函数",
    "10.4": "Bahdanau 注意力",
    "10.5": "多头注意力",
    "10.6": "自注意力和位置编码",
    "10.7": "Transformer",
}
D2L_EN = {
    "11.1": "Queries, Keys, and Values",
    "11.2": "Attention Pooling by Similarity",
    "11.3": "Attention Scoring Functions",
    "11.4": "The Bahdanau Attention Mechanism",
    "11.5": "Multi-Head Attention",
    "11.6": "Self-Attention and Positional Encoding",
    "11.7": "The Transformer Architecture",
}

# The tutorials were first written from two texts outside the repository, which no reader can
# open. Nothing may point at them any more. (A *random* seed is fine: seed=0, manual_seed, "one
# seed", "seeds 0, 1, 2".)
PRIVATE_SOURCES = {
    "a path to the unpublished texts": r"shared/seeds|\.\./shared",
    "'seed text'": r"\bseed texts?\b",
    "a seed text by number": r"\bseeds? 00\d\b",
    "'the seeds' or 'the seed's'": r"\bthe seeds\b|\bthe seed's\b",
    "a citation such as [000]": r"\[00\d\]",
    "'the two / both / source texts'": r"\b(?:two|both|source) texts\b|\b(?:first|second) text\b",
}

pytest.importorskip("matplotlib")


def prose(path):
    """A file's text with comment markers dropped and lines joined: a citation may wrap."""
    lines = path.read_text(encoding="utf-8").splitlines()
    return " ".join(re.sub(r"^\s*#\s?(?:>\s?)?", "", line).strip() for line in lines)


def private_source_mentions(path):
    text = path.read_text(encoding="utf-8")
    return [
        f"{path.name}:{text.count(chr(10), 0, m.start()) + 1}: {what} ({m.group(0)!r})"
        for what, pattern in PRIVATE_SOURCES.items()
        for m in re.finditer(pattern, text, re.IGNORECASE)
    ]


@pytest.mark.parametrize("path", EDITIONS, ids=EDITION_IDS)
def test_tutorial_runs_in_smoke_mode_and_draws_its_figures(path, tutorial_runs):
    done = tutorial_runs.run(path)
    assert done.returncode == 0, f"{path.name} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    lang = "zh" if path.parent.name == "zh" else "en"
    figures = list((tutorial_runs.folder / lang / path.stem).glob("*.png"))
    assert figures, f"{path.name} wrote no figure"
    assert all(f.stat().st_size > 1000 for f in figures)
    # Chinese labels are drawn with a font that has the glyphs: no box in place of a character.
    assert "missing from font" not in done.stderr, f"{path.name}: {done.stderr[-2000:]}"
    # Every error a tutorial provokes on purpose is announced before it and labelled after it.
    lines = done.stdout.splitlines()
    announced = [i for i, line in enumerate(lines) if line.startswith("(deliberate mistake: ")]
    shown = [i for i, line in enumerate(lines) if line.startswith("expected error: ")]
    assert len(announced) == len(shown) and all(a < s for a, s in zip(announced, shown)), (
        f"{path.name}: {len(announced)} deliberate mistakes announced, {len(shown)} expected errors shown"
    )
    if path.stem == "04_write_a_scorer_plugin":
        assert len(shown) >= 8, f"tutorial 4 provokes 8 errors on purpose, its output labels {len(shown)}"
    # The run is also the tutorial's page: prose, code and what it printed.
    page = (tutorial_runs.folder / lang / f"{path.stem}.md").read_text(encoding="utf-8")
    assert "```python" in page and all(f"]({path.stem}/{f.name})" in page for f in figures)


def test_tutorials_are_jupytext_percent_scripts():
    """Prose in markdown cells, code in code cells: the file opens as a notebook."""
    assert len(TUTORIALS) == 13
    for path in EDITIONS:
        text = path.read_text(encoding="utf-8")
        assert text.count("# %% [markdown]") >= 3, path.name
        assert ("练习" if path.parent.name == "zh" else "Exercises") in text, path.name
    jupytext = pytest.importorskip("jupytext")
    for path in EDITIONS:
        notebook = jupytext.read(path)
        kinds = {cell.cell_type for cell in notebook.cells}
        assert kinds == {"markdown", "code"}, path.name


@pytest.mark.parametrize("path", EDITIONS, ids=EDITION_IDS)
def test_tutorial_cites_d2l_in_both_editions(path):
    """Sources a reader can open: a section of the Chinese and one of the English edition,
    each by number and title, not a file outside the repository."""
    text = prose(path)
    assert "《动手学深度学习》" in text and "Dive into Deep Learning" in text, f"{path.name} names no D2L edition"
    zh = [n for n, title in D2L_ZH.items() if f"{n} {title}" in text]
    en = [n for n, title in D2L_EN.items() if f'{n} "{title}"' in text]
    assert zh, f"{path.name} cites no section of the Chinese edition as '10.N <title>' (titles: {D2L_ZH})"
    assert en, f"{path.name} cites no section of the English edition as '11.N \"<title>\"' (titles: {D2L_EN})"
    assert not private_source_mentions(path), private_source_mentions(path)


def test_deliberate_errors_are_caught_only_under_expect_error():
    """A tutorial that catches an error only to print it would show an unlabelled error."""
    for path in EDITIONS:
        text = path.read_text(encoding="utf-8")
        bare = re.search(r"^[ \t]*except\b[^\n]*:[ \t]*\n[ \t]*print\(", text, re.MULTILINE)
        assert bare is None, f"{path.name}:{text.count(chr(10), 0, bare.start()) + 1}: use expect_error"


def test_glossary_cites_d2l_sections_not_unpublished_texts():
    text = GLOSSARY.read_text(encoding="utf-8")
    assert not private_source_mentions(GLOSSARY), private_source_mentions(GLOSSARY)
    for (zh, zh_title), (en, en_title) in zip(D2L_ZH.items(), D2L_EN.items()):
        assert f"| {zh} {zh_title} | {en} {en_title} |" in text, f"GLOSSARY.md's section table lacks {zh} / {en}"
    rows = [
        line
        for line in text.splitlines()
        if line.startswith("| ")
        and not line.startswith("| English")
        and not line.startswith("| Chinese edition")
        and not line.startswith("|---")
    ]
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        if len(cells) == 5:  # English | Chinese | D2L (zh / en) | Tutorial | Code
            assert cells[2] == "—" or "/" in cells[2], f"GLOSSARY.md: no 'zh / en' section in {row!r}"


def test_readme_cites_no_unpublished_texts():
    assert not private_source_mentions(README), private_source_mentions(README)


def test_expect_error_labels_the_mistake_and_insists_on_the_error(capsys):
    sys.path.insert(0, str(ROOT / "tutorials"))
    try:
        from _tutorial import expect_error
    finally:
        sys.path.remove(str(ROOT / "tutorials"))
    with expect_error("dividing by zero", ZeroDivisionError) as caught:
        1 / 0
    assert isinstance(caught.error, ZeroDivisionError)
    assert capsys.readouterr().out.splitlines() == [
        "(deliberate mistake: dividing by zero — the error below is expected)",
        "expected error: ZeroDivisionError: division by zero",
    ]
    with pytest.raises(AssertionError, match="deliberate mistake not caught: adding raised no ZeroDivisionError"):
        with expect_error("adding", ZeroDivisionError):
            1 + 1
    with pytest.raises(KeyError):  # an error nobody expected is not swallowed
        with expect_error("dividing by zero", ZeroDivisionError):
            {}["missing"]
