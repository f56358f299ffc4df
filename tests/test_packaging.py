"""Packaging: the built-in plugins install as ``minitensor_plugins`` in every kind of install.

The built-in plugin code lives in ``plugins/minitensor_plugins/`` and must be importable as
the top-level package ``minitensor_plugins`` (never as a bare ``plugins``) from a wheel, from
an offline ``pip install --no-deps --no-build-isolation``, and from the editable install the
tests run in. The example third-party plugin (``plugins/example-cosine``) must install the
same way and be found through its entry point.

The pip runs (marked ``slow``; ``-m "not slow"`` skips them) build from a copy of the
repository, so the working tree gets no ``build/`` or ``*.egg-info`` litter, and use no
network (``PIP_NO_INDEX``): everything comes from the current environment.
"""

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
JUNK = shutil.ignore_patterns(
    ".git",
    "build",
    "dist",
    "*.egg-info",
    "__pycache__",
    ".pytest_cache",
    ".hypothesis",
    ".numba_cache",
    ".venv",
    "runs",
    "*.pyc",
)
PIP_ENV = {"PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"}


def clean_env(**extra):
    """The environment for a child process: no plugin switches, no stray PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MINITENSOR_", "PIP_")) and k != "PYTHONPATH"}
    env.update(extra)
    return env


def run(args, cwd, **env):
    result = subprocess.run(args, cwd=cwd, env=clean_env(**env), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"{' '.join(map(str, args))} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def pip(*args, cwd):
    return run([sys.executable, "-m", "pip", *args, "--no-deps", "--no-build-isolation", "-q"], cwd, **PIP_ENV)


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A copy of the repository (without build products) to build from."""
    copy = tmp_path_factory.mktemp("packaging") / "src"
    shutil.copytree(REPO, copy, ignore=JUNK)
    return copy


@pytest.fixture(scope="module")
def wheel(source):
    out = source.parent / "wheelhouse"
    pip("wheel", "-w", str(out), str(source), cwd=source.parent)
    (built,) = out.glob("minitensor-*.whl")
    with zipfile.ZipFile(built) as archive:
        return set(archive.namelist()), {
            name: archive.read(name).decode()
            for name in archive.namelist()
            if name.endswith((".dist-info/entry_points.txt", ".dist-info/METADATA"))
        }


@pytest.fixture(scope="module")
def target_install(source):
    """``pip install --no-deps --no-build-isolation --target TMP .``, as offline users do."""
    target = source.parent / "target"
    pip("install", "--target", str(target), ".", cwd=source)
    return target


@pytest.fixture(scope="module")
def example_install(source):
    target = source.parent / "example-target"
    pip("install", "--target", str(target), "plugins/example-cosine", cwd=source)
    return target


# ---------------------------------------------------------------------------------------
# the wheel


@pytest.mark.slow
def test_wheel_holds_minitensor_and_minitensor_plugins(wheel, source):
    names, _ = wheel
    for required in (
        "minitensor/__init__.py",
        "minitensor/core/plugins.py",
        "minitensor/core/hookspecs.py",
        "minitensor/cli.py",
        "minitensor_plugins/__init__.py",
        "minitensor_plugins/scorers.py",
        "minitensor_plugins/poolings.py",
        "minitensor_plugins/positional.py",
    ):
        assert required in names, f"{required} is missing from the wheel"
    # every module of the two packages, subpackages included, is in it
    expected = {p.relative_to(source).as_posix() for p in (source / "minitensor").rglob("*.py")}
    expected |= {
        "minitensor_plugins/" + p.relative_to(source / "plugins" / "minitensor_plugins").as_posix()
        for p in (source / "plugins" / "minitensor_plugins").rglob("*.py")
    }
    assert expected - names == set()
    # and the character LM's example text with its README (package data, not modules)
    assert {"minitensor/data/texts/time_machine.txt", "minitensor/data/texts/README.md"} <= names
    assert {"minitensor/viz/page.js", "minitensor/viz/page.css"} <= names  # what every explain page inlines
    # the GPU's kernels, compiled by CuPy from these sources on first use
    cuda = "minitensor/core/kernels/cuda/"
    assert {cuda + "softmax.cu", cuda + "elementwise.cu", cuda + "random.cuh"} <= names  # (.cuh: pasted in)


@pytest.mark.slow
def test_wheel_has_no_bare_plugins_package_and_nothing_else(wheel):
    names, _ = wheel
    tops = {name.split("/")[0] for name in names}
    assert "plugins" not in tops  # the folder is mapped, never installed under its own name
    assert tops == {"minitensor", "minitensor_plugins", "minitensor-0.1.0.dist-info"}, tops
    assert not any("example" in name or name.startswith("tests/") for name in names)


@pytest.mark.slow
def test_wheel_metadata(wheel):
    _, texts = wheel
    entry_points = texts["minitensor-0.1.0.dist-info/entry_points.txt"]
    assert "[console_scripts]" in entry_points and "minitensor = minitensor.cli:main" in entry_points
    metadata = texts["minitensor-0.1.0.dist-info/METADATA"]
    for requirement in ("numpy", "numba", "pluggy", "matplotlib"):
        assert f"Requires-Dist: {requirement}" in metadata


# ---------------------------------------------------------------------------------------
# pip install --target (offline, no build isolation)


@pytest.mark.slow
def test_target_install_imports_and_loads_the_builtins(target_install, tmp_path):
    code = (
        "import minitensor_plugins, minitensor; "
        "print(minitensor.__file__); print(minitensor_plugins.__file__); "
        "print(sorted(minitensor.plugins.scorers()))"
    )
    out = run([sys.executable, "-c", code], cwd=tmp_path, PYTHONPATH=str(target_install)).splitlines()
    # the installed copies, not the editable checkout
    assert Path(out[0]).resolve() == (target_install / "minitensor" / "__init__.py").resolve()
    assert Path(out[1]).resolve() == (target_install / "minitensor_plugins" / "__init__.py").resolve()
    assert {"dot", "scaled_dot"} <= set(eval(out[2]))
    assert not (target_install / "plugins").exists()


@pytest.mark.slow
def test_target_install_cli_lists_the_builtins(target_install, tmp_path):
    out = run([sys.executable, "-m", "minitensor", "plugins", "--json"], cwd=tmp_path, PYTHONPATH=str(target_install))
    rows = json.loads(out)
    assert {"dot", "softmax"} <= {row["name"] for row in rows}
    assert all(row["class"].startswith("minitensor_plugins.") for row in rows if row["source"] == "built-in")


# ---------------------------------------------------------------------------------------
# the editable install (the environment the tests run in)


def test_editable_install_imports_minitensor_plugins_from_the_repository(tmp_path):
    # The checkout itself may hold a minitensor.egg-info (left by the build) that shadows
    # the installed dist-info on sys.path: look at every distribution of that name.
    installs = [d.read_text("direct_url.json") for d in importlib.metadata.distributions(name="minitensor")]
    installs = [json.loads(text) for text in installs if text]
    if not installs:
        pytest.skip("minitensor is not installed with pip (pip install -e .)")
    direct_url = installs[0]
    if (
        not direct_url.get("dir_info", {}).get("editable")
        or Path(direct_url["url"].removeprefix("file://")).resolve() != REPO
    ):
        pytest.skip(f"minitensor is not installed editable from {REPO}")
    # from another directory, so that the checkout is reached through the install, not the cwd
    code = "import minitensor_plugins, minitensor; print(minitensor_plugins.__file__); print(minitensor.__file__)"
    out = run([sys.executable, "-c", code], cwd=tmp_path).splitlines()
    assert Path(out[0]).resolve() == REPO / "plugins" / "minitensor_plugins" / "__init__.py"
    assert Path(out[1]).resolve() == REPO / "minitensor" / "__init__.py"
    result = subprocess.run(
        [sys.executable, "-c", "import plugins"], cwd=tmp_path, env=clean_env(), capture_output=True, text=True
    )
    assert result.returncode != 0, "a bare top-level 'plugins' package is importable"


# ---------------------------------------------------------------------------------------
# the example third-party plugin distribution


@pytest.mark.slow
def test_example_plugin_installs_with_its_entry_point(example_install, tmp_path):
    (info,) = example_install.glob("minitensor_example_cosine-*.dist-info")
    assert "[minitensor]\ncosine = minitensor_cosine" in (info / "entry_points.txt").read_text()
    code = (
        "from importlib.metadata import entry_points; "
        "print([(ep.name, ep.value, ep.dist.metadata['Name']) for ep in entry_points(group='minitensor')])"
    )
    out = run([sys.executable, "-c", code], cwd=tmp_path, PYTHONPATH=str(example_install))
    assert ("cosine", "minitensor_cosine", "minitensor-example-cosine") in eval(out)


@pytest.mark.slow
def test_example_plugin_is_listed_by_the_cli(example_install, tmp_path):
    out = run(
        [sys.executable, "-m", "minitensor", "plugins"],
        cwd=tmp_path,
        PYTHONPATH=str(example_install),
        MINITENSOR_STRICT_PLUGINS="1",
    )
    assert any(
        line.split() == ["cosine_temperature", "scorer", "minitensor-example-cosine", "0.1.0"]
        for line in out.splitlines()
    ), out
    out = run(
        [sys.executable, "-m", "minitensor", "plugins"],
        cwd=tmp_path,
        PYTHONPATH=str(example_install),
        MINITENSOR_DISABLE_PLUGIN_AUTOLOAD="1",
    )
    assert "cosine_temperature" not in out.split() and "dot" in out.split()


@pytest.mark.slow
def test_example_plugin_passes_its_own_tests(example_install, source):
    out = run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "plugins/example-cosine/tests"],
        cwd=source,
        PYTHONPATH=str(example_install),
        MINITENSOR_STRICT_PLUGINS="1",
    )
    assert "4 passed" in out, out
