"""The Chinese tutorials (tutorials/zh/) are translations that cannot drift: the same cells, the
same code token for token (only comments are translated), prose that is Chinese, the glossary's
terms; and their figures draw Chinese labels with a font that has the glyphs."""

import io
import os
import pathlib
import re
import tokenize
import warnings

import pytest
from helpers import load_module

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


GLOSSARY = ROOT / "tutorials" / "GLOSSARY.md"


def glossary_terms():
    """Every Chinese term of GLOSSARY.md's tables: the Chinese column split at ';' and ',', with
    the English in brackets, the ‡ mark and quotes dropped; only pieces with CJK characters."""
    terms = set()
    for line in GLOSSARY.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("| ") or len(cells) != 5 or cells[0] == "English":
            continue
        chinese = re.sub(r"\([^)]*\)|（[^）]*）|`[^`]*`|‡", "", cells[1])
        for piece in re.split(r"[;,，；]|:", chinese):
            piece = piece.strip(" 「」“”\"'")
            if CJK.search(piece) and len(piece) >= 2:
                terms.add(piece)
    return terms


def test_glossary_has_terms():
    terms = glossary_terms()
    assert len(terms) > 100 and {"注意力汇聚", "注意力评分函数", "多头注意力", "位置编码"} <= terms
    assert not [t for t in terms if re.search(r"[()（）‡`]", t)], "brackets, marks and code are not terms"


@pytest.mark.parametrize("english", ENGLISH, ids=[p.stem for p in ENGLISH])
def test_chinese_tutorial_uses_the_glossary_terms_of_its_english_twin(english):
    """The English tutorials give the Chinese term of each concept in brackets, from GLOSSARY.md;
    the Chinese edition must use those same terms, not synonyms of its own."""

    def plain(text):  # spacing between Chinese and Latin, emphasis and line breaks are style
        return re.sub(r"[\s*#]", "", text)

    en = plain(english.read_text(encoding="utf-8"))
    zh = plain((CHINESE / english.name).read_text(encoding="utf-8"))
    missing = sorted(term for term in glossary_terms() if plain(term) in en and plain(term) not in zh)
    assert not missing, f"zh/{english.name} does not use these GLOSSARY terms its English twin uses: {missing}"


def load_tutorial_helpers(folder, name):
    """``_tutorial.py`` as a tutorial in ``folder`` imports it, as a fresh module named ``name``."""
    return load_module(folder / "_tutorial.py", name)


def test_chinese_figures_draw_with_a_cjk_font():
    """A Chinese tutorial's figure takes its labels from LABELS and draws them with a font that has
    the glyphs (the one cjk_font found), with no "Glyph missing" warning: characters, not boxes."""
    pytest.importorskip("matplotlib")
    from matplotlib import font_manager
    from matplotlib.figure import Figure

    zh = load_tutorial_helpers(CHINESE, "_tutorial_zh_test")
    assert zh.LANG == "zh"
    if zh.FONT is None:
        message = "no CJK font on this machine (.ci/run installs fonts-wqy-microhei; or pip install '.[zh]')"
        if os.environ.get("CI") == "true":
            pytest.fail("under CI=true the Chinese figures must be tested: " + message)
        pytest.skip(message)
    label = next(iter(zh.LABELS["zh"]))
    title = zh.text(label)
    assert CJK.search(title), f"LABELS['zh'][{label!r}] = {title!r} has no Chinese character"
    figure = Figure()
    ax = figure.subplots()
    artist = ax.set_title(title)
    ax.set_xlabel(zh.text(label))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        figure.savefig(io.BytesIO(), format="png")
    missing = [str(w.message) for w in caught if "missing from" in str(w.message)]
    assert not missing, missing
    used = font_manager.findfont(artist.get_fontproperties(), fallback_to_default=False)
    assert font_manager.FontProperties(fname=used).get_name() == zh.FONT or zh.FONT in used.replace("-", " ")
    with pytest.raises(KeyError, match="no 'zh' label"):
        zh.text("a label nobody translated")


def test_english_figures_keep_english_and_no_font_means_one_warning(monkeypatch):
    en = load_tutorial_helpers(ROOT / "tutorials", "_tutorial_en_test")
    assert en.LANG == "en" and en.FONT is None
    assert en.text("learned w = {w:.2f}", w=0.5) == "learned w = 0.50"
    zh = load_tutorial_helpers(CHINESE, "_tutorial_zh_nofont_test")
    import minitensor.i18n

    monkeypatch.setattr(minitensor.i18n, "cjk_font", lambda: None)  # the font search is the library's
    monkeypatch.setattr(minitensor.i18n, "_warned", False)  # (which warns once per process)
    with pytest.warns(UserWarning, match="keep their English labels") as caught:
        zh.FONT = zh._use_cjk_font()
    assert len(caught) == 1 and zh.FONT is None
    label = next(iter(zh.LABELS["zh"]), "attention weight")
    assert zh.text(label) == label  # English, not boxes
