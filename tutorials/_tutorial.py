"""What every tutorial shares: the smoke switch, the figure folder and deliberate mistakes.

A tutorial runs in two sizes:

- full (the default): the sizes and epochs the prose talks about, minutes on a laptop CPU;
- smoke (``MINITENSOR_TUTORIAL_SMOKE=1``): everything shrunk so that the test suite can run
  every tutorial in seconds. The claims a tutorial asserts must hold at both sizes.

Figures go to ``MINITENSOR_TUTORIAL_OUT`` (default ``tutorial_figures/`` in the current
folder), one subfolder per tutorial.

Some cells make a mistake on purpose, to show the error minitensor gives for it; they run
under ``expect_error``, which labels the mistake and its error in the printed output so that
a reader never takes them for the tutorial breaking.
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


class expect_error:
    """Run a deliberate mistake: label it, require the error it must raise, show that error.

    ::

        with expect_error("a misspelt hook name", PluginError) as caught:
            mt.plugins.register(Misspelt())
        assert "did you mean" in str(caught.error)

    prints ``(deliberate mistake: a misspelt hook name — the error below is expected)`` before
    the block and ``expected error: PluginError: ...`` (the message's first line) after it,
    and keeps the exception in ``caught.error`` for further checks. If the block raises none
    of ``errors`` the mistake went unnoticed, which is a real failure: an AssertionError says
    so, and any other exception propagates unchanged.
    """

    def __init__(self, mistake, *errors):
        if not errors:
            raise TypeError("expect_error needs at least one exception class")
        self.mistake = mistake
        self.errors = errors
        self.error = None

    def __enter__(self):
        print(f"(deliberate mistake: {self.mistake} — the error below is expected)")
        return self

    def __exit__(self, exc_type, exc, tb):
        names = " or ".join(e.__name__ for e in self.errors)
        if exc_type is None:
            raise AssertionError(f"deliberate mistake not caught: {self.mistake} raised no {names}")
        if not issubclass(exc_type, self.errors):
            return False  # an error nobody expected: let it stop the tutorial
        self.error = exc
        lines = str(exc).strip().splitlines() or [""]
        more = f" [... {len(lines) - 1} more lines]" if len(lines) > 1 else ""
        print(f"expected error: {exc_type.__name__}: {lines[0]}{more}")
        return True
