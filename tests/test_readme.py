"""The README's Python examples run as written (documentation that cannot rot)."""

import re
from pathlib import Path

import pytest

import minitensor as mt

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_the_readme_has_python_examples():
    assert len(BLOCKS) >= 3


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_example_runs(index, tmp_path):
    module_name = f"readme_example_{index}"
    path = tmp_path / f"{module_name}.py"
    path.write_text(BLOCKS[index])
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        sys.modules.pop(module_name, None)
        mt.plugins._reset()  # forget plugins an example registered
