"""The README's test command runs the suite on pytest-xdist's workers (``-n auto --dist
loadgroup``, tests/conftest.py): CI runs that very command, the number of workers is bounded,
and a test file's fixtures, or a session fixture several files share, are made on one worker,
once."""

import importlib.util
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
CONFTEST = ROOT / "tests" / "conftest.py"


def readme_test_command():
    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(encoding="utf-8"), re.S)
    return blocks[1].strip()


def test_ci_runs_the_readmes_test_command():
    command = readme_test_command()
    assert "-n auto --dist loadgroup" in command
    lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()]
    assert lines[-1] == command, f".ci/run ends with {lines[-1]!r}, not the README's {command!r}"


def load_conftest():
    spec = importlib.util.spec_from_file_location("suite_conftest", CONFTEST)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_auto_starts_a_worker_a_core_and_at_most_four(monkeypatch):
    conftest = load_conftest()
    cores = conftest.usable_cores()
    monkeypatch.delenv("PYTEST_XDIST_AUTO_NUM_WORKERS", raising=False)
    assert conftest.pytest_xdist_auto_num_workers(None) == min(cores, conftest.MAX_WORKERS)
    monkeypatch.setenv("PYTEST_XDIST_AUTO_NUM_WORKERS", "1000")  # never more than the cores
    assert conftest.pytest_xdist_auto_num_workers(None) == cores
    monkeypatch.setenv("PYTEST_XDIST_AUTO_NUM_WORKERS", "1")
    assert conftest.pytest_xdist_auto_num_workers(None) == 1


def test_a_session_fixture_two_files_share_is_made_once_on_one_worker(tmp_path):
    """Two workers, three files: two take the shared ``tutorial_runs`` (here a stand-in that
    records the process that made it), the third keeps the other worker busy. Without the
    groups, or with pytest-xdist reading them before the suite's hook has set them, the two
    files may run on both workers, and the fixture is made twice."""
    pytest.importorskip("xdist")
    made = tmp_path / "made"
    (tmp_path / "conftest.py").write_text(
        textwrap.dedent(f"""
        import importlib.util, os, pytest

        spec = importlib.util.spec_from_file_location("suite_conftest", {str(CONFTEST)!r})
        suite = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(suite)
        pytest_collection_modifyitems = suite.pytest_collection_modifyitems

        @pytest.fixture(scope="session")
        def tutorial_runs():
            with open({str(made)!r}, "a") as f:
                f.write(f"{{os.getpid()}}\\n")
        """)
    )
    test = "import pytest\n@pytest.mark.parametrize('i', range(6))\ndef test_{}(i{}):\n    pass\n"
    (tmp_path / "test_docs.py").write_text(test.format("docs", ", tutorial_runs"))
    (tmp_path / "test_tutorials.py").write_text(test.format("tutorials", ", tutorial_runs"))
    (tmp_path / "test_other.py").write_text(test.format("other", ""))
    args = ["-q", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup"]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", *args], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "18 passed" in done.stdout
    assert len(made.read_text().split()) == 1, f"tutorial_runs was made by {made.read_text().split()}"
