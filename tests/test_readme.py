"""The README and bench/README.md stay true (documentation that cannot rot): the README's
Python examples run as written, every link to a local file resolves, the README's benchmark
section is one summary table that defers to bench/README.md, which documents every script in
bench/, and timings stay out of the package's docstrings and comments."""

import importlib.util
import os
import re
import sys
from pathlib import Path

import pytest

import minitensor as mt

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
README_ZH = ROOT / "README.zh-CN.md"  # the first screen of the README, in Chinese
BENCH_README = ROOT / "bench" / "README.md"
BLOCKS = [
    block
    for readme in (README, README_ZH)
    for block in re.findall(r"```python\n(.*?)```", readme.read_text(encoding="utf-8"), flags=re.S)
]
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


# -- links ----------------------------------------------------------------------------------
def local_links(text):
    """The local targets of markdown links and <img src=...> in ``text``, fragments dropped
    (web addresses, mail and in-page anchors are not local files)."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)  # code blocks hold no links
    targets = re.findall(r"\]\(([^)\s]+)\)", text) + re.findall(r"<img[^>]*\ssrc=\"([^\"]+)\"", text)
    return [t.split("#")[0] for t in targets if not re.match(r"[a-z]+:|#", t)]


@pytest.mark.parametrize(
    "path", [README, README_ZH, BENCH_README], ids=["README.md", "README.zh-CN.md", "bench/README.md"]
)
def test_every_local_link_resolves(path):
    links = local_links(path.read_text(encoding="utf-8"))
    assert links, f"{path.name}: no local links found (is the link pattern still right?)"
    missing = [link for link in links if not (path.parent / link).exists()]
    assert not missing, f"{path.relative_to(ROOT)} links to files that do not exist: {missing}"


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


def test_the_readme_benchmarks_are_one_summary_table_that_links_bench_readme():
    text = section(README.read_text(encoding="utf-8"), "Benchmarks")
    assert "](bench/README.md)" in text, "the benchmark section must link to bench/README.md for the details"
    table_lines = [line for line in text.splitlines() if line.startswith("|")]
    assert "\n".join(table_lines) in text, "the benchmark section holds one table, not several"
    rows = table_lines[2:]  # after the header and the |---| line
    scripts = [m.group(1) for row in rows for m in [re.search(r"`bench/(\w+\.py)`", row)] if m]
    assert len(scripts) == len(rows), f"a row without its script: {rows}"
    assert sorted(scripts) == BENCHMARKS, "one row per benchmark script in bench/ (the details go to bench/README.md)"
    for row in rows:
        assert len(row.strip("|").split("|")) == 4, f"columns: script | what | headline | target; got {row!r}"


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
