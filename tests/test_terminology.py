"""One Chinese term per concept: the forbidden variants of tutorials/GLOSSARY.md, section "One
Chinese term per concept", must not appear in any Chinese text of the project.

The table gives, for each concept, the chosen term and its variants as regular expressions (in
backticks, ``\\|`` for a ``|`` inside the table). The texts scanned: the Chinese tutorials (every
``tutorials/zh/*.py``, new ones included), ``README.zh-CN.md``, the docs site's pages and the
Chinese strings of its hooks, the explain page (``minitensor/viz/``), and the Chinese figure labels
(``minitensor/i18n.py``, ``tutorials/_tutorial.py``). A failure names every variant by file and line.
"""

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
GLOSSARY = ROOT / "tutorials" / "GLOSSARY.md"
SECTION = "## One Chinese term per concept"


def scanned_files():
    """The Chinese texts, by glob, so that a new tutorial or page is scanned without a change here."""
    globs = (
        "tutorials/zh/*.py",
        "README.zh-CN.md",
        "docs/**/*.md",
        "docs/_hooks/*.py",
        "minitensor/viz/*.py",
        "minitensor/viz/*.js",
        "minitensor/viz/*.html",
        "minitensor/i18n.py",
        "tutorials/_tutorial.py",
    )
    return sorted({path for pattern in globs for path in ROOT.glob(pattern) if path.is_file() and not generated(path)})


# Pages that docs/_hooks/pages.py writes before a build (.gitignore lists them) are copies of texts
# scanned at their source; the glossary's copy holds the forbidden variants themselves.
GENERATED = ("docs/index.md", "docs/index.zh.md", "docs/glossary.md", "docs/benchmarks.md", "docs/tutorials/")


def generated(path):
    relative = path.relative_to(ROOT).as_posix()
    return any(relative == g or (g.endswith("/") and relative.startswith(g)) for g in GENERATED)


def split_row(line):
    """The cells of a markdown table row; ``\\|`` is a ``|`` inside a cell."""
    cells = re.split(r"(?<!\\)\|", line.strip().strip("|"))
    return [cell.strip().replace("\\|", "|") for cell in cells]


def terminology():
    """[(concept, chosen term, [compiled variant patterns])] from the glossary's section."""
    text = GLOSSARY.read_text(encoding="utf-8")
    assert SECTION in text, f"GLOSSARY.md has no section {SECTION!r}"
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        if not line.startswith("| ") or line.startswith("| Concept"):
            continue
        concept, chosen, variants, _may_stay = split_row(line)
        patterns = [re.compile(p) for p in re.findall(r"`([^`]+)`", variants)]
        rows.append((concept, chosen, patterns))
    return rows


def find_variants(text, rows):
    """[(line number, matched text, concept, chosen term)] for every variant in ``text``; of
    overlapping matches (注意力分数 and its 分数) only the first and longest is reported."""
    matches = sorted(
        (
            (m.start(), -m.end(), m.group(), concept, chosen)
            for concept, chosen, patterns in rows
            for pattern in patterns
            for m in pattern.finditer(text)
        ),
    )
    found, end = [], -1
    for start, minus_end, matched, concept, chosen in matches:
        if start >= end:
            found.append((text.count("\n", 0, start) + 1, matched, concept, chosen))
            end = -minus_end
    return found


def test_the_table_is_there_and_complete():
    rows = terminology()
    chosen = " ".join(term for _, term, _ in rows)
    for term in ("注意力评分", "迭代周期", "精确匹配", "契约", "教程 N", "计算内核"):
        assert term in chosen, f"GLOSSARY.md's terminology table has no row choosing {term}"
    assert all(patterns for _, _, patterns in rows), "every concept lists its forbidden variants"


# Each variant the table forbids, in a sentence, and the same characters in legitimate use.
VARIANTS = [
    "把这些注意力分数变成权重",
    "被掩蔽的分数设为负无穷",
    "在日期任务上 4 轮就达到 100%",
    "每轮结束后，它报告留出集上的损失",
    "我们在第一轮之后停下",
    "训练了一半的模型（第 1 轮之后）",
    "留出集上的完全匹配率",
    "用约定检查工具包对照约定检查它",
    "每个评分函数都要遵守的约定",
    "以及评分函数、汇聚和位置编码的约定。",
    "NaN——第 3 章会解释原因",
    "此后每一章都会画这样的图",
    "及其 numba 核函数",
    "融合的 softmax 核",
    "融合核分别在全部线程上运行",
    "预热：numba 的内核在首次使用时加载",
    "minitensor 的 GPU 内核是 CUDA C++",
]
LEGITIMATE = [
    "注意力评分函数的输出就是注意力评分",
    "评分与权重",
    "BLEU 分数",
    "束搜索的其他假设（分数）",
    "4 个迭代周期，3 个随机种子",
    "轮廓线与轮流计算",
    "精确匹配率",
    "n 元语法的计数在整个语料库上累加，即 sacrebleu 的约定",
    "对照契约检查：契约检查工具包",
    "教程 3 会解释原因",
    "D2L 第 10 章 注意力机制",
    "Nadaraya-Watson 核回归的核函数；高斯核；卷积核大小 3",
    "在 2 个 CPU 核上大约半分钟",
    "融合的 numba 计算内核；GPU 核心",
]


@pytest.mark.parametrize("sentence", VARIANTS)
def test_a_variant_is_caught(sentence):
    assert find_variants(sentence, terminology()), f"no variant found in {sentence!r}"


@pytest.mark.parametrize("sentence", LEGITIMATE)
def test_a_legitimate_use_is_spared(sentence):
    assert not find_variants(sentence, terminology()), f"a legitimate use flagged: {sentence!r}"


def test_chinese_texts_use_one_term_per_concept():
    files = scanned_files()
    names = {path.relative_to(ROOT).as_posix() for path in files}
    assert "README.zh-CN.md" in names and "minitensor/viz/page.py" in names
    assert sum(bool(re.match(r"tutorials/zh/\d\d_", name)) for name in names) >= 10
    rows = terminology()
    problems = [
        f"{path.relative_to(ROOT).as_posix()}:{line}: {matched!r} — {concept}: write {chosen}"
        for path in files
        for line, matched, concept, chosen in find_variants(path.read_text(encoding="utf-8"), rows)
    ]
    assert not problems, "variants of the chosen Chinese terms (tutorials/GLOSSARY.md):\n" + "\n".join(problems)
