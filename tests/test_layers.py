"""Two layers: the engine imports nothing from the applications built on it.

The engine is what a learner reads first (tensor, autograd, ops, backends, kernels, nn, optim
and the plugin host); the applications (training, data, decoding, the CLI, the explain page,
ONNX export, the conformance kit) use it through its public names. This test reads every
import statement of every engine module (at module level and inside functions) and fails on
any arrow from the engine to an application. A new top-level module must be placed in one of
the two lists, or the test fails until it is.
"""

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "minitensor"

ENGINE = {
    "tensor", "autograd", "ops", "backends", "kernels", "nn", "optim", "plugins", "hookspecs", "creation",
    "dtypes", "errors", "grad_mode", "random", "gradcheck", "_printing", "_trace", "cuda",
}  # fmt: skip
APPLICATIONS = {
    "train", "data", "inference", "onnx", "viz", "cli", "demo", "testing", "metrics", "nadaraya_watson", "__main__",
}  # fmt: skip


def top_level(path):
    """The top-level name under minitensor/ that ``path`` belongs to ("nn" for nn/attention.py)."""
    parts = path.relative_to(PACKAGE).parts
    return parts[0].removesuffix(".py")


def imported(path):
    """(line, target) for every import in ``path``: the top-level minitensor name it reaches,
    relative imports resolved against the file's package."""
    package = list(path.relative_to(PACKAGE).parent.parts)
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)] if node.level > 1 else package
                names = base + (node.module.split(".") if node.module else [])
                if names:
                    yield node.lineno, names[0]
                else:  # from . import x (at the package root): each x is a top-level name
                    yield from ((node.lineno, alias.name) for alias in node.names)
            elif node.module and node.module.split(".")[0] == "minitensor":
                parts = node.module.split(".")
                yield from (
                    [(node.lineno, parts[1])] if len(parts) > 1 else ((node.lineno, a.name) for a in node.names)
                )
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "minitensor" and len(parts) > 1:
                    yield node.lineno, parts[1]


def modules():
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def test_every_top_level_module_is_engine_or_application():
    names = {top_level(p) for p in modules()} - {"__init__"}
    assert not names - ENGINE - APPLICATIONS, f"place these in ENGINE or APPLICATIONS: {names - ENGINE - APPLICATIONS}"
    assert not ENGINE & APPLICATIONS


@pytest.mark.parametrize(
    "path", [p for p in modules() if top_level(p) in ENGINE], ids=lambda p: str(p.relative_to(PACKAGE))
)
def test_the_engine_imports_no_application(path):
    arrows = [(line, target) for line, target in imported(path) if target in APPLICATIONS]
    assert not arrows, f"minitensor/{path.relative_to(PACKAGE)} imports applications: {arrows}"
    # and reaches none through the package's lazy names in code (mt.onnx, mt.viz, ...)
    lazy = [
        (node.lineno, node.attr)
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id in ("mt", "minitensor")
        and node.attr in APPLICATIONS
    ]
    assert not lazy, f"minitensor/{path.relative_to(PACKAGE)} reaches applications through mt.: {lazy}"


def test_the_reader_finds_arrows():
    """The reader itself: relative and absolute forms, at any depth, inside functions too."""
    sample = PACKAGE / "nn" / "attention.py"
    targets = {target for _, target in imported(sample)}
    assert {"ops", "tensor"} <= targets and not targets & APPLICATIONS
    # what the applications import from the engine is found as well (the test would see a reversal)
    assert "nn" in {target for _, target in imported(PACKAGE / "train" / "loop.py")}


def lines(paths):
    return sum(len(p.read_text().splitlines()) for p in paths)


def test_the_readme_states_the_sizes_it_claims():
    """The README's afternoon is the core (tensor, autograd, ops) with its line count, and it
    gives the engine's; both within 10% of what the files hold, so the claim cannot drift."""
    import re

    readme = (PACKAGE.parent / "README.md").read_text()
    core = lines([PACKAGE / "tensor.py", PACKAGE / "autograd.py", *sorted((PACKAGE / "ops").glob("*.py"))])
    engine = lines(p for p in PACKAGE.rglob("*") if p.suffix in (".py", ".cu") and top_level(p) in ENGINE)
    stated_core = re.search(r"([\d,]+) lines in `tensor.py`, `autograd.py` and `ops/`", readme)
    stated_engine = re.search(r"is about ([\d,]+) lines", readme)
    assert stated_core and stated_engine, "the README's opening names the core's and the engine's sizes"
    for stated, actual, what in ((stated_core, core, "core"), (stated_engine, engine, "engine")):
        number = int(stated.group(1).replace(",", ""))
        assert abs(number - actual) <= 0.1 * actual, f"the README says the {what} is {number} lines; it is {actual}"
