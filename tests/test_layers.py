"""Two layers: the engine imports nothing from the applications built on it.

The engine, minitensor/core/, is what a learner reads first (tensor, autograd, ops, backends,
kernels, nn, optim and the plugin host); the applications beside it (training, data, decoding,
the CLI, the explain page, ONNX export, the conformance kit) use it through its public names.
This test reads every import statement of every module (at module level and inside functions)
and fails on any arrow from the engine to an application, and on an application importing a
private engine name.
"""

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "minitensor"
CORE = PACKAGE / "core"

# every name directly under minitensor/core/ (tensor, ops, nn, ...): what minitensor.<name> is
ENGINE = {p.name.removesuffix(".py") for p in CORE.iterdir() if p.name not in ("__init__.py", "__pycache__")}
# every other name directly under minitensor/: the applications
APPLICATIONS = {
    p.name.removesuffix(".py") for p in PACKAGE.iterdir() if p.name not in ("__init__.py", "__pycache__", "core")
}


def imported(path):
    """(line, dotted module, names) for every import in ``path``, relative imports resolved
    against the file's package: ``from ..ops import softmax`` in core/nn/attention.py is
    (line, "minitensor.core.ops", ["softmax"])."""
    package = ["minitensor", *path.relative_to(PACKAGE).parent.parts]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - (node.level - 1)] if node.level else []
            module = ".".join(base + (node.module.split(".") if node.module else []))
            yield node.lineno, module, [alias.name for alias in node.names]
        elif isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name, []) for alias in node.names)


def reached(module, names):
    """The minitensor names an import reaches, one dotted path each: ``from minitensor import
    train`` reaches minitensor.train; the engine's public paths (minitensor.nn) are the engine."""
    parts = module.split(".")
    if parts[0] != "minitensor":
        return []
    paths = [parts] if len(parts) > 1 else [["minitensor", name] for name in names]
    return [["minitensor", "core", *p[1:]] if p[1] in ENGINE else p for p in paths]


def modules(root=PACKAGE):
    return sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


def test_the_tree_shows_two_layers():
    """The engine is one folder, core/; an application never shares a name with an engine
    module (minitensor.<name> is the engine's module of that name: see minitensor/__init__)."""
    assert {"tensor", "autograd", "ops", "backends", "kernels", "nn", "optim", "plugins", "hookspecs"} <= ENGINE
    assert {"train", "data", "inference", "viz", "onnx", "cli"} <= APPLICATIONS
    assert not ENGINE & APPLICATIONS, f"an application named like an engine module: {ENGINE & APPLICATIONS}"


@pytest.mark.parametrize("path", modules(CORE), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_the_engine_imports_no_application(path):
    arrows = [
        (line, ".".join(target))
        for line, module, names in imported(path)
        for target in reached(module, names)
        if target[1] != "core"
    ]
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


@pytest.mark.parametrize(
    "path",
    [p for p in modules() if CORE not in p.parents and p != PACKAGE / "__init__.py"],
    ids=lambda p: str(p.relative_to(PACKAGE)),
)
def test_applications_use_public_engine_names(path):
    """An application imports no engine module or name that starts with an underscore (the
    package's __init__, which makes the engine's public names, is the engine's face, not an
    application)."""
    private = [
        (line, module, name)
        for line, module, names in imported(path)
        for name in [*names, *module.split(".")]
        if name.startswith("_") and name != "__future__" and any(t[1] == "core" for t in reached(module, names))
    ]
    assert not private, f"minitensor/{path.relative_to(PACKAGE)} uses private engine names: {private}"


def test_the_reader_finds_arrows():
    """The reader itself: relative and absolute forms, at any depth, inside functions too."""
    targets = {".".join(t) for _, m, n in imported(CORE / "nn" / "attention.py") for t in reached(m, n)}
    assert any(t.startswith("minitensor.core.ops") for t in targets) and "minitensor.core.tensor" in targets
    assert all(t.startswith("minitensor.core") for t in targets)
    # an application's arrows into the engine are seen as such, through relative and public paths
    loop = {".".join(t) for _, m, n in imported(PACKAGE / "train" / "loop.py") for t in reached(m, n)}
    assert any(t.startswith("minitensor.core.nn") for t in loop)
    assert reached("minitensor", ["train", "nn"]) == [["minitensor", "train"], ["minitensor", "core", "nn"]]


def test_public_paths_are_the_engine_modules():
    """minitensor.nn.functional is minitensor.core.nn.functional: one module object, with its
    own name and spec, for every way of importing it (a copy would break isinstance)."""
    import importlib
    import sys

    import minitensor.nn.functional as functional
    from minitensor.plugins import hookimpl

    import minitensor as mt
    import minitensor.core.nn.functional as core_functional

    assert functional is core_functional and mt.nn is sys.modules["minitensor.core.nn"]
    assert functional.__name__ == functional.__spec__.name == "minitensor.core.nn.functional"
    assert hookimpl is mt.hookimpl and mt.plugins is sys.modules["minitensor.core.plugins"]
    rnn = importlib.import_module("minitensor.nn.rnn")  # a submodule not imported before by this path
    assert rnn is sys.modules["minitensor.core.nn.rnn"] and rnn.GRU is mt.nn.GRU
    with pytest.raises(ModuleNotFoundError, match="minitensor.no_such_module"):
        importlib.import_module("minitensor.no_such_module")


def lines(paths):
    return sum(len(p.read_text().splitlines()) for p in paths)


def test_the_readme_states_the_sizes_it_claims():
    """The README's afternoon is the core (tensor, autograd, ops) with its line count, and it
    gives the engine's; both within 10% of what the files hold, so the claim cannot drift."""
    import re

    readme = (PACKAGE.parent / "README.md").read_text()
    core = lines([CORE / "tensor.py", CORE / "autograd.py", *sorted((CORE / "ops").glob("*.py"))])
    engine = lines(p for p in CORE.rglob("*") if p.suffix in (".py", ".cu") and "__pycache__" not in p.parts)
    stated_core = re.search(r"([\d,]+) lines in `tensor.py`, `autograd.py` and `ops/`", readme)
    stated_engine = re.search(r"is about ([\d,]+) lines", readme)
    assert stated_core and stated_engine, "the README's opening names the core's and the engine's sizes"
    for stated, actual, what in ((stated_core, core, "core"), (stated_engine, engine, "engine")):
        number = int(stated.group(1).replace(",", ""))
        assert abs(number - actual) <= 0.1 * actual, f"the README says the {what} is {number} lines; it is {actual}"


def test_the_public_paths_finder_answers_for_engine_names_alone():
    """What ``import minitensor`` adds to the import system answers for minitensor.<engine
    module> and declines everything else: other packages, the applications, typos."""
    import sys

    import minitensor as mt

    finders = [f for f in sys.meta_path if type(f).__module__ == "minitensor"]
    assert len(finders) == 1
    finder = finders[0]
    for name in ("numpy", "json", "minitensor", "minitensor.core.nn", "minitensor.train", "minitensor.nope"):
        assert finder.find_spec(name) is None, name
    assert finder.find_spec("minitensor.optim") is not None
    assert finder.find_spec("minitensor.tensor") is None  # mt.tensor is the function; its module is core.tensor
    assert callable(mt.tensor) and callable(mt.gradcheck)
