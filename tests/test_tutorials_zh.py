"""The Chinese tutorials (tutorials/zh/) are translations that cannot drift: the same cells, the
same code token for token (only comments are translated), prose that is Chinese, the glossary's
terms; and their figures draw Chinese labels with a font that has the glyphs."""

import io
import pathlib
import re
import sys
import tokenize
import warnings

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
ENGLISH = sorted(ROOT.joinpath("tutorials").glob("[0-9][0-9]_*.py"))
CHINESE = ROOT / "tutorials" / "zh"

jupytext = pytest.importorskip("jupytext")


def code_tokens(source):
    """A code cell as its tokens, without comments and line breaks: what runs, not how it reads."""
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER}
    return [(t.type, t.string) for t in tokenize.generate_tokens(io.StringIO(source).readline) if t.type not in skip]


def cells(path):
    return jupytext.read(path).cells


def test_every_tutorial_has_a_chinese_edition_and_no_other():
    assert sorted(p.name for p in CHINESE.glob("[0-9][0-9]_*.py")) == [p.name for p in ENGLISH]


@pytest.mark.parametrize("english", ENGLISH, ids=[p.stem for p in ENGLISH])
def test_chinese_code_is_the_english_code(english):
    """Cell by cell: the same kinds in the same order, and every code cell the same once comments go."""
    chinese = CHINESE / english.name
    en, zh = cells(english), cells(chinese)
    assert [c.cell_type for c in zh] == [c.cell_type for c in en], f"{chinese.name}: cells differ from the English"
    for number, (a, b) in enumerate(zip(en, zh), 1):
        if a.cell_type != "code":
            continue
        if code_tokens(a.source) != code_tokens(b.source):
            first = next(
                (i for i, (x, y) in enumerate(zip(a.source.splitlines(), b.source.splitlines())) if x != y), None
            )
            raise AssertionError(
                f"{chinese.name}, cell {number}: the code differs from the English (first differing line "
                f"{first}):\n--- en\n{a.source}\n--- zh\n{b.source}"
            )


CJK = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]")
LATIN = re.compile(r"[A-Za-z]")
NOT_PROSE = [
    re.compile(r"\$\$.*?\$\$", re.DOTALL),  # display maths
    re.compile(r"\$[^$\n]+\$"),  # inline maths
    re.compile(r"`[^`\n]+`"),  # code
    re.compile(r"\]\([^)]*\)"),  # link targets
    re.compile(r"https?://\S+"),
    re.compile(r"<[^>]+>"),  # html
]


def prose_share(markdown):
    """CJK characters / (CJK characters + Latin letters) in prose, maths and code left out."""
    for pattern in NOT_PROSE:
        markdown = pattern.sub(" ", markdown)
    cjk, latin = len(CJK.findall(markdown)), len(LATIN.findall(markdown))
    return cjk / max(cjk + latin, 1), cjk + latin


@pytest.mark.parametrize("english", ENGLISH, ids=[p.stem for p in ENGLISH])
def test_chinese_prose_is_chinese(english):
    """Mostly CJK characters: a translation, not English with the Chinese terms in brackets."""
    chinese = CHINESE / english.name
    markdown = [c.source for c in cells(chinese) if c.cell_type == "markdown"]
    share, _ = prose_share("\n".join(markdown))
    assert share >= 0.6, f"{chinese.name}: only {share:.0%} of the prose's letters are Chinese characters"
    for source in markdown:
        share, letters = prose_share(source)
        if letters >= 40:
            assert share >= 0.3, f"{chinese.name}: a markdown cell is {share:.0%} Chinese:\n{source[:400]}"
    # The English edition's own language check fails on the English files: it measures something.
    english_share, _ = prose_share("\n".join(c.source for c in cells(english) if c.cell_type == "markdown"))
    assert english_share < 0.1
