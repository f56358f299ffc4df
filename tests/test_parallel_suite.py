"""The README's test command runs the suite on pytest-xdist's workers (``-n auto``,
tests/conftest.py): CI runs that very command, the number of workers is bounded, and a test
file's fixtures, or a session fixture several files share, are made on one worker, once."""

import pathlib
import re
import subprocess
import sys

import pytest
from helpers import load_module

ROOT = pathlib.Path(__file__).resolve().parent.parent
CONFTEST = ROOT / "tests" / "conftest.py"


def readme_test_command():
    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(encoding="utf-8"), re.S)
    return blocks[1].strip()


def test_ci_runs_the_readmes_test_command():
    command = readme_test_command()
    assert command.endswith("python -m pytest -q -n auto")
    lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()]
    assert lines[-1] == command, f".ci/run ends with {lines[-1]!r}, not the README's {command!r}"


def test_auto_starts_a_worker_a_core_and_at_most_four(monkeypatch):
    conftest = load_module(CONFTEST, "suite_conftest")
    cores = conftest.usable_cores()
    monkeypatch.delenv("PYTEST_XDIST_AUTO_NUM_WORKERS", raising=False)
    assert conftest.pytest_xdist_auto_num_workers(None) == min(cores, conftest.MAX_WORKERS)
    monkeypatch.setenv("PYTEST_XDIST_AUTO_NUM_WORKERS", "1000")  # never more than the cores
    assert conftest.pytest_xdist_auto_num_workers(None) == cores
    monkeypatch.setenv("PYTEST_XDIST_AUTO_NUM_WORKERS", "1")
    assert conftest.pytest_xdist_auto_num_workers(None) == 1


STAND_IN = """
import importlib.util, os, pytest

spec = importlib.util.spec_from_file_location("suite_conftest", {conftest!r})
suite = importlib.util.module_from_spec(spec)
spec.loader.exec_module(suite)
pytest_collection_modifyitems = suite.pytest_collection_modifyitems
pytest_xdist_make_scheduler = suite.pytest_xdist_make_scheduler

@pytest.fixture(scope="session")
def tutorial_runs():
    with open({made!r}, "a") as f:
        f.write(f"{{os.getpid()}}\\n")
"""
TEST = "import pytest\n@pytest.mark.parametrize('i', range(6))\ndef test_{}(i{}):\n    pass\n"


def run_pytest(folder, *args):
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=300,
    )


def suite_stand_in(folder, *other_files):
    """A folder with the suite's scheduler and a stand-in ``tutorial_runs`` that records the
    process that made it; test_docs.py and test_tutorials.py take it, ``other_files`` do not."""
    made = folder / "made"
    (folder / "conftest.py").write_text(STAND_IN.format(conftest=str(CONFTEST), made=str(made)))
    (folder / "test_docs.py").write_text(TEST.format("docs", ", tutorial_runs"))
    (folder / "test_tutorials.py").write_text(TEST.format("tutorials", ", tutorial_runs"))
    for name in other_files:
        (folder / name).write_text(TEST.format(name[5:-3], ""))
    return made


def test_a_session_fixture_two_files_share_is_made_once_on_one_worker(tmp_path):
    """Two workers, three files: two take the shared ``tutorial_runs``, the third keeps the other
    worker busy. Handed out test by test (pytest-xdist's ``load``), or by file, the two files
    may run on both workers, and the fixture is made twice. The test ids stay pytest's own, so
    that one copied from the report reruns that test."""
    pytest.importorskip("xdist")
    made = suite_stand_in(tmp_path, "test_other.py")
    done = run_pytest(tmp_path, "-v", "-n", "2")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "18 passed" in done.stdout
    assert len(made.read_text().split()) == 1, f"tutorial_runs was made by {made.read_text().split()}"
    assert re.search(r"PASSED test_docs\.py::test_docs\[0\]\s*$", done.stdout, re.M), done.stdout[-3000:]


def test_a_file_that_takes_a_shared_fixture_must_be_listed(tmp_path):
    """A new file taking ``tutorial_runs`` that SHARED_SESSION_FIXTURES does not list could run on
    another worker and make the fixture again: collection stops and says what to add."""
    suite_stand_in(tmp_path)
    (tmp_path / "test_new_page.py").write_text(TEST.format("new_page", ", tutorial_runs"))
    done = run_pytest(tmp_path, "-q")
    assert done.returncode != 0
    assert "add test_new_page.py to SHARED_SESSION_FIXTURES['tutorial_runs']" in done.stdout + done.stderr
