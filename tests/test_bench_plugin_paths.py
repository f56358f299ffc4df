"""``bench/plugin_paths.py --quick`` runs: a user's scaled-dot plugin, declared and undeclared,
agrees with the built-in and the table prints (the target is judged on the full run)."""

import pathlib
import subprocess
import sys

SCRIPT = pathlib.Path(__file__).resolve().parent.parent / "bench" / "plugin_paths.py"


def test_the_quick_run_prints_its_table():
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--threads", "1"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "declared/built-in" in out and "undeclared/built-in" in out
    # T = 256, one tile of the stream: the user's declared plugin takes that path as the built-in does
    assert "one tile / one tile / plain" in out
    assert "--quick: the target is judged on the full run" in out
