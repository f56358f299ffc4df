"""What every tutorial shares: the smoke switch and the figure folder.

A tutorial runs in two sizes:

- full (the default): the sizes and epochs the prose talks about, minutes on a laptop CPU;
- smoke (``MINITENSOR_TUTORIAL_SMOKE=1``): everything shrunk so that the test suite can run
  every tutorial in seconds. The claims a tutorial asserts must hold at both sizes.

Figures go to ``MINITENSOR_TUTORIAL_OUT`` (default ``tutorial_figures/`` in the current
folder), one subfolder per tutorial.
"""

import os
import pathlib

SMOKE = os.environ.get("MINITENSOR_TUTORIAL_SMOKE", "") not in ("", "0")


def pick(full, smoke):
    """``full`` normally, ``smoke`` in smoke mode: ``epochs = pick(200, 5)``."""
    return smoke if SMOKE else full


def figure_path(tutorial, name):
    """Where a tutorial's figure goes: ``<out>/<tutorial>/<name>`` (folders created)."""
    folder = pathlib.Path(os.environ.get("MINITENSOR_TUTORIAL_OUT", "tutorial_figures")) / tutorial
    folder.mkdir(parents=True, exist_ok=True)
    return folder / name
