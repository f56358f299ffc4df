"""Ruff (lint and format, configured in pyproject.toml) runs as part of the suite, so the
README's one test command also keeps the code clean. Ruff is pinned in the ``test`` extra:
a new ruff release may add rules, and CI should not fail on a day nobody changed the code."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("command", [["check"], ["format", "--check"]], ids=["lint", "format"])
def test_ruff(command):
    result = subprocess.run(
        [sys.executable, "-m", "ruff", *command, "--no-cache", "."], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, f"ruff {' '.join(command)} found problems:\n{result.stdout}{result.stderr}"


def test_pre_commit_runs_the_ruff_that_ci_runs():
    """.pre-commit-config.yaml pins the ruff release that the test extra pins: what a commit
    checks is what CI checks."""
    import re

    pinned = re.search(r'"ruff==([0-9.]+)"', (ROOT / "pyproject.toml").read_text()).group(1)
    hook = re.search(r"ruff-pre-commit\s+rev:\s*v([0-9.]+)", (ROOT / ".pre-commit-config.yaml").read_text())
    assert hook and hook.group(1) == pinned, f"pre-commit's ruff {hook and hook.group(1)} != the test extra's {pinned}"
