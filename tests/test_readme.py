"""The README and bench/README.md stay true (documentation that cannot rot): the READMEs stay
short (at most 15,000 bytes each: the details live on the docs site's guide pages and the figures
in bench/README.md), their Python examples and those of the guide pages run as written, every
link to a local file (and every anchor into a Markdown file) resolves, the line counts of the
README's tour hold, the README's "How fast" is one small table whose figures are
bench/README.md's, which documents every script in bench/, and timings stay out of the
package's docstrings and comments."""

import importlib.util
import os
import re
import sys
from pathlib import Path

import pytest

import minitensor as mt

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
README_ZH = ROOT / "README.zh-CN.md"  # the README, in Chinese
BENCH_README = ROOT / "bench" / "README.md"
# the docs site's pages written by hand, which hold what the README leaves out (how-tos, examples)
GUIDES = [ROOT / "docs" / name for name in ("guide.md", "attention.md", "gpu.md", "engine.md", "tutorials_overview.md")]
BLOCKS = [
    block
    for readme in (README, README_ZH, *GUIDES)
    for block in re.findall(r"```python\n(.*?)```", readme.read_text(encoding="utf-8"), flags=re.S)
]
README_LIMIT = 15_000  # bytes, UTF-8
BENCH_SCRIPTS = sorted(path.name for path in (ROOT / "bench").glob("*.py"))
BENCHMARKS = [name for name in BENCH_SCRIPTS if not name.startswith("_")]  # _common.py is a helper


def test_the_readme_has_python_examples():
    assert len(BLOCKS) >= 3


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_example_runs(index, tmp_path, monkeypatch):
    if "mt.onnx." in BLOCKS[index] and importlib.util.find_spec("onnx") is None:
        message = 'the example exports to ONNX: pip install -e ".[onnx]"'
        if os.environ.get("CI") == "true":
            pytest.fail("under CI=true every README example must run: " + message)
        pytest.skip(message)
    monkeypatch.chdir(tmp_path)  # what an example writes lands here
    module_name = f"readme_example_{index}"
    path = tmp_path / f"{module_name}.py"
    path.write_text(BLOCKS[index])

    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        sys.modules.pop(module_name, None)
        mt.plugins._reset()  # forget plugins an example registered


# -- size and links -------------------------------------------------------------------------
@pytest.mark.parametrize("path", [README, README_ZH], ids=["README.md", "README.zh-CN.md"])
def test_the_readme_is_short(path):
    size = len(path.read_bytes())
    assert size <= README_LIMIT, (
        f"{path.name} is {size:,} bytes, over {README_LIMIT:,}: move how-tos to the docs site's pages "
        "(docs/guide.md and its siblings) and figures to bench/README.md, and link to them"
    )


def local_links(text, keep_anchor=False):
    """The local targets of markdown links and <img src=...> in ``text`` (web addresses, mail and
    in-page anchors are not local files); the ``#anchor`` is dropped unless ``keep_anchor``."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)  # code blocks hold no links
    targets = re.findall(r"\]\(([^)\s]+)\)", text) + re.findall(r"<img[^>]*\ssrc=\"([^\"]+)\"", text)
    local = [t for t in targets if not re.match(r"[a-z]+:|#", t)]
    return local if keep_anchor else [t.split("#")[0] for t in local]


def anchors(markdown_path):
    """The anchors of a Markdown file's headings, as GitHub and MkDocs's toc both make them
    (lower case, punctuation but ``-`` and ``_`` dropped, spaces to ``-``)."""
    text = re.sub(r"```.*?```", "", markdown_path.read_text(encoding="utf-8"), flags=re.S)
    return {
        re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        for heading in re.findall(r"^#{1,6} (.+)$", text, flags=re.M)
    }


LINKED = [README, README_ZH, BENCH_README, *GUIDES]


@pytest.mark.parametrize("path", LINKED, ids=[str(p.relative_to(ROOT)) for p in LINKED])
def test_every_local_link_resolves(path):
    links = local_links(path.read_text(encoding="utf-8"), keep_anchor=True)
    assert links, f"{path.name}: no local links found (is the link pattern still right?)"
    missing, bad_anchors = [], []
    for link in links:
        file, _, anchor = link.partition("#")
        target = path.parent / file
        if not target.exists():
            missing.append(link)
        elif anchor and target.suffix == ".md" and anchor not in anchors(target):
            bad_anchors.append(link)
    assert not missing, f"{path.relative_to(ROOT)} links to files that do not exist: {missing}"
    assert not bad_anchors, f"{path.relative_to(ROOT)} links to headings that do not exist: {bad_anchors}"


def test_the_two_readmes_link_each_other_at_the_top():
    assert "[中文](README.zh-CN.md)" in README.read_text(encoding="utf-8").split("## ")[0]
    assert "[English](README.md)" in README_ZH.read_text(encoding="utf-8").split("## ")[0]


def test_the_readme_points_to_the_plugin_contract():
    """The contract lives in one place, minitensor/core/hookspecs.py; the README links to it."""
    assert "](minitensor/core/hookspecs.py)" in README.read_text(encoding="utf-8")


# -- benchmarks -----------------------------------------------------------------------------
def section(text, heading):
    """The text under the level-2 ``heading``, up to the next level-2 heading."""
    match = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", text, flags=re.S | re.M)
    assert match, f"no section '## {heading}'"
    return match.group(1)


def test_the_readmes_how_fast_is_one_small_table_of_bench_readmes_figures():
    """The README's speed is one headline table (the training step against PyTorch); every other
    figure is in bench/README.md, which it links, and each figure of the table is one of
    bench/README.md's for train_step.py, so the two cannot disagree."""
    bench = section(BENCH_README.read_text(encoding="utf-8"), "bench/train_step.py")
    for readme, heading in ((README, "How fast"), (README_ZH, "有多快")):
        text = section(readme.read_text(encoding="utf-8"), heading)
        assert "](bench/README.md)" in text, f"{readme.name}: '{heading}' must link to bench/README.md"
        table = [line for line in text.splitlines() if line.startswith("|")]
        assert "\n".join(table) in text, f"{readme.name}: '{heading}' holds one table, not several"
        assert 3 <= len(table) <= 7, f"{readme.name}: one small headline table, not {len(table) - 2} rows"
        figures = re.findall(r"\d+(?:\.\d+)?(?: ms| s|x)", "\n".join(table[2:]))
        assert figures, f"{readme.name}: no figures in the headline table"
        missing = [figure for figure in figures if figure not in bench]
        assert not missing, f"{readme.name}: {missing} are not bench/README.md's train_step.py figures"


def sizes_in(path):
    """The README's tour: each linked engine or application path with the line count it states."""
    text = path.read_text(encoding="utf-8")
    return re.findall(r"\[`[\w/.]+`\]\((minitensor/[\w/.]+)\)\s*[(（]([\d,]+)(?: lines|\s*行)", text)


@pytest.mark.parametrize("path", [README, README_ZH], ids=["README.md", "README.zh-CN.md"])
def test_the_tours_line_counts_hold(path):
    stated = sizes_in(path)
    assert len(stated) >= 10, f"{path.name}: the tour's line counts not found (is the pattern still right?)"
    for target, number in stated:
        files = [ROOT / target] if (ROOT / target).is_file() else sorted((ROOT / target).rglob("*"))
        actual = sum(
            len(f.read_text(encoding="utf-8").splitlines())
            for f in files
            if f.suffix in (".py", ".cu") and "__pycache__" not in f.parts
        )
        number = int(number.replace(",", ""))
        assert abs(number - actual) <= 0.1 * actual, f"{path.name}: {target} is {number} lines, it says; it is {actual}"


@pytest.mark.parametrize("script", BENCH_SCRIPTS)
def test_bench_readme_documents_every_script(script):
    text = BENCH_README.read_text(encoding="utf-8")
    assert f"]({script})" in text, f"bench/README.md's table of scripts lacks a link to {script}"
    body = section(text, f"bench/{script}")
    if script in BENCHMARKS:
        assert f"python bench/{script}" in body, f"bench/{script}: say how to run it"
        assert "**Target" in body, f"bench/{script}: state its targets (or that it has none)"
        figures = re.search(r"\*\*Latest figures\.?\*\*(.*)", body, flags=re.S)
        assert figures, f"bench/{script}: a 'Latest figures' paragraph (or 'None', with why)"
        dated = re.search(r"\b20\d\d-\d\d-\d\d\b", figures.group(1))
        assert dated or figures.group(1).lstrip(" .*").startswith("None"), (
            f"bench/{script}: figures without the date they were measured on"
        )


# Timings go stale; they belong in bench/README.md, with the command and the date. A docstring
# or comment gives the reason for a choice in words and points there.
TIMING = re.compile(
    r"\b\d+(?:\.\d+)?\s?(?:ms|µs|us|ns)\b"  # 32 us, 5.4 ms
    r"|\b\d+(?:\.\d+)?x\s+(?:faster|slower)\b"  # 5x faster
    r"|~\d+(?:\.\d+)?x\b"  # ~1.5x
)


def test_no_timings_in_the_code():
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for folder in ("minitensor", "plugins")
        for path in sorted((ROOT / folder).rglob("*.py"))
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if TIMING.search(line)
    ]
    assert not found, "timings in the code (move them to bench/README.md):\n" + "\n".join(found)
