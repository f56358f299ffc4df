"""What every tutorial shares: the smoke switch, the figure folder and deliberate mistakes.

A tutorial runs in two sizes:

- full (the default): the sizes and epochs the prose talks about, minutes on a laptop CPU;
- smoke (``MINITENSOR_TUTORIAL_SMOKE=1``): everything shrunk so that the test suite can run
  every tutorial in seconds. The claims a tutorial asserts must hold at both sizes.

Figures go to ``MINITENSOR_TUTORIAL_OUT`` (default ``tutorial_figures/`` in the current
folder), one subfolder per tutorial.

Every tutorial exists in two languages: English here, Chinese in ``zh/`` (same file names, the
same code, translated prose and comments). ``LANG`` says which one is running, and figure
titles and labels go through ``text``, which looks the Chinese ones up in ``LABELS``. Chinese
labels need a font with CJK glyphs, which matplotlib does not ship: ``cjk_font`` finds one on
the system (Noto Sans CJK, WenQuanYi, Source Han Sans, ...), else in the ``mplfonts`` package
(``pip install "minitensor[zh]"``), else the figures keep English labels and one warning says so.

Some cells make a mistake on purpose, to show the error minitensor gives for it; they run
under ``expect_error``, which labels the mistake and its error in the printed output so that
a reader never takes them for the tutorial breaking.
"""

import os
import pathlib
import shutil
import subprocess
import warnings

SMOKE = os.environ.get("MINITENSOR_TUTORIAL_SMOKE", "") not in ("", "0")

# ``zh/_tutorial.py`` runs this file's code with its own ``__file__``: the folder names the language.
LANG = "zh" if pathlib.Path(__file__).resolve().parent.name == "zh" else "en"


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


# Figure titles, axis labels and legends in Chinese, keyed by the English text the code passes to
# ``text``. Terms as in tutorials/GLOSSARY.md. A label with fields keeps them: "w = {w:.2f}".
LABELS = {"zh": {}}
LABELS["zh"].update(
    {  # 01_attention_cues
    }
)
LABELS["zh"].update(
    {  # 02_attention_pooling
    }
)
LABELS["zh"].update(
    {  # 03_scoring_functions
    }
)
LABELS["zh"].update(
    {  # 04_write_a_scorer_plugin
    }
)
LABELS["zh"].update(
    {  # 05_multi_head_attention
    }
)
LABELS["zh"].update(
    {  # 06_self_attention_and_positional_encoding
    }
)
LABELS["zh"].update(
    {  # 07_transformer
    }
)
LABELS["zh"].update(
    {  # 08_inside_the_engine
    }
)
LABELS["zh"].update(
    {  # 09_positions_as_score_biases
    }
)
LABELS["zh"].update(
    {  # 10_flash_attention
    }
)

# Families with the simplified-Chinese glyphs, in order of preference: Noto/Source Han (the same
# design under two names), WenQuanYi (Debian's small one), then the usual Windows/macOS ones.
CJK_FAMILIES = (
    "Noto Sans CJK SC",
    "Source Han Sans SC",
    "Noto Sans SC",
    "WenQuanYi Micro Hei",
    "WenQuanYi Zen Hei",
    "Microsoft YaHei",
    "PingFang SC",
    "Heiti SC",
    "SimHei",
)


def cjk_font():
    """The family name of a font with Chinese glyphs that matplotlib can use, or None.

    Looks in matplotlib's font list; then asks fontconfig (``fc-list``), because matplotlib
    caches its list the first time it runs and misses fonts installed after that; then in the
    ``mplfonts`` package (the ``zh`` extra), which ships Noto Sans CJK SC as a file.
    """
    from matplotlib import font_manager

    def known():
        names = {font.name for font in font_manager.fontManager.ttflist}
        return next((family for family in CJK_FAMILIES if family in names), None)

    if known():
        return known()
    if shutil.which("fc-list"):
        listed = subprocess.run(["fc-list", ":lang=zh", "file"], capture_output=True, text=True).stdout
        for file in sorted({line.split(":")[0].strip() for line in listed.splitlines() if line.strip()}):
            try:
                font_manager.fontManager.addfont(file)
            except (OSError, RuntimeError):  # a format FreeType reads and matplotlib does not
                continue
        if known():
            return known()
    try:
        import mplfonts
    except ImportError:
        return None
    for file in sorted((pathlib.Path(mplfonts.__file__).parent / "fonts").glob("NotoSansCJK*")):
        font_manager.fontManager.addfont(str(file))
    return known()


def _use_cjk_font():
    """Put a CJK font first for every figure of a Chinese tutorial; None (and one warning) if none."""
    family = cjk_font()
    if family is None:
        warnings.warn(
            "no font with Chinese glyphs found, so the figures keep their English labels: install one "
            '(Debian: apt-get install fonts-noto-cjk) or pip install "minitensor[zh]"',
            stacklevel=2,
        )
        return None
    import matplotlib

    matplotlib.rcParams["font.family"] = "sans-serif"
    matplotlib.rcParams["font.sans-serif"] = [family, *matplotlib.rcParams["font.sans-serif"]]
    matplotlib.rcParams["axes.unicode_minus"] = False  # "-" on the axes: CJK fonts may lack U+2212
    return family


FONT = _use_cjk_font() if LANG != "en" else None


def text(english, **fields):
    """A figure title or label in the tutorial's language: ``ax.set_title(text("attention weight"))``.

    English returns ``english`` itself; Chinese looks it up in ``LABELS["zh"]`` (a label missing
    there is a KeyError, so no figure is half translated). ``fields`` fill the label's
    ``{placeholders}`` after the look-up: ``text("learned w = {w:.2f}", w=w)``. Without a CJK
    font, Chinese tutorials keep the English labels (see ``cjk_font``).
    """
    words = english
    if LANG != "en" and FONT is not None:
        try:
            words = LABELS[LANG][english]
        except KeyError:
            raise KeyError(f"text({english!r}): no {LANG!r} label in tutorials/_tutorial.py's LABELS") from None
    return words.format(**fields) if fields else words
