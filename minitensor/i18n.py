"""The words minitensor draws in its own figures, in English and Chinese, and a font for the Chinese.

The plotting functions (``minitensor.train.plots``: ``plot_loss``, ``show_heatmaps``, the
attention maps), the autograd graph (``mt.viz.graph``) and a training run's own figures
(``train(config, lang="zh")``, ``minitensor train --lang zh``) take ``lang="en"`` (the default)
or ``lang="zh"``, and a ``labels`` mapping that overrides any label in either language. Each label
they draw goes through ``label``: its English text is the key, ``LABELS["zh"]`` has the Chinese
one, a label with ``{fields}`` keeps them (``"head {h}"`` -> ``"头 {h}"``). The terms are D2L's
Chinese ones, as in ``tutorials/GLOSSARY.md``: 注意力权重, 查询, 键, 损失, 迭代周期 (epoch), 步 (step),
注意力评分 (what a scoring function returns).

Not labels: the data a figure shows -- the tokens on a heatmap's axes, an op's class name and a
tensor's shape in the graph -- are drawn as they are in both languages.

Chinese labels need a font with CJK glyphs, which matplotlib does not ship: ``cjk_font`` finds
one on the system (Noto Sans CJK, Source Han Sans, WenQuanYi, ...), else in the ``mplfonts``
package (``pip install "minitensor[zh]"``). Without one a Chinese figure keeps its English
labels (characters drawn as boxes help nobody), and one warning says so. The tutorials
(``tutorials/_tutorial.py``) use the same font search and warning for their own figures, and
their ``text()`` falls back to these labels (the kernels' names of tutorial 2).
"""

import functools
import pathlib
import shutil
import subprocess
import warnings

LANGS = ("en", "zh")

# Keyed by the English text; every label the library draws has its Chinese here.
LABELS = {
    "zh": {
        # plot_loss
        "step": "步",
        "epoch": "迭代周期",
        "loss": "损失",
        "training loss": "训练损失",
        "training loss (EMA {weight:g})": "训练损失（EMA {weight:g}）",
        "eval {name}": "{name}（留出集）",
        "metric": "评估指标",
        "{model} on the {source}": "{model} 的训练（{source}）",  # the title of a training run's loss curve
        "{task} task": "{task} 任务",
        # the metrics of minitensor.train's evaluations (names as in its history)
        "accuracy": "准确率",
        "exact_match": "精确匹配",
        "bleu": "BLEU 分数",
        "perplexity": "困惑度",
        "loss_per_char": "每字符损失",
        "metric {name}": "指标 {name}",
        # heatmaps of attention weights (show_heatmaps and the maps of a model)
        "attention weights": "注意力权重",
        "attention scores": "注意力评分",
        "Keys": "键",
        "Queries": "查询",
        "keys": "键",
        "queries": "查询",
        "keys (source)": "键（源序列）",
        "keys (target)": "键（目标序列）",
        "queries (source)": "查询（源序列）",
        "queries (target)": "查询（目标序列）",
        "head {h}": "头 {h}",
        "block {b}": "块 {b}",
        "encoder self-attention": "编码器自注意力",
        "decoder self-attention": "解码器自注意力",
        "encoder-decoder attention": "编码器－解码器注意力",
        "Bahdanau attention": "Bahdanau 注意力",
        # the autograd graph (mt.viz.graph)
        "leaf": "叶子节点",
        "saved {size}": "保存 {size}",
        "|grad| {norm}": "|梯度| {norm}",
        # the kernels of Nadaraya-Watson regression (minitensor.nadaraya_watson.KERNELS)
        "gaussian": "高斯核",
        "boxcar": "boxcar 核",  # no D2L term: the name the code (and the prose) uses
        "epanechnikov": "epanechnikov 核",
        "constant": "常数核",
    }
}


def check_lang(lang):
    """``lang`` itself if minitensor draws in it ("en" or "zh"), else a ValueError."""
    if lang not in LANGS:
        raise ValueError(f"lang must be one of {LANGS}, got {lang!r}")
    return lang


def label(english, lang="en", labels=None, **fields):
    """One label in ``lang``: ``label("head {h}", "zh", h=1)`` is ``"头 1"``.

    ``labels``: the caller's own {English text: label}, used first in any language. Otherwise
    English returns ``english`` and Chinese its entry in ``LABELS["zh"]``; a text with no entry
    (a caller's own title, already in the right language) is returned unchanged. ``fields`` fill
    the ``{placeholders}`` after the look-up."""
    check_lang(lang)
    if labels is not None and english in labels:
        words = labels[english]
    else:
        words = LABELS.get(lang, {}).get(english, english)
    return words.format(**fields) if fields else words


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


@functools.cache  # once per process: without a font, every Chinese figure would run fc-list again
def cjk_font():
    """The family name of a font with Chinese glyphs that matplotlib can use, or None.

    Looks in matplotlib's font list; then asks fontconfig (``fc-list``), because matplotlib
    caches its list the first time it runs and misses fonts installed after that; then in the
    ``mplfonts`` package (the ``zh`` extra), which ships Noto Sans CJK SC as a file. The answer
    is kept for the rest of the process (``cjk_font.cache_clear()`` looks again).
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


NO_FONT = (
    "no font with Chinese glyphs found, so the figures keep their English labels: install one "
    '(Debian: apt-get install fonts-noto-cjk) or pip install "minitensor[zh]"'
)
_warned = False  # the warning above is given once per process


def font_for(lang):
    """The font family a figure in ``lang`` needs: None for English; for Chinese the one
    ``cjk_font`` finds, or None -- and, the first time, a warning that the figures keep their
    English labels."""
    global _warned
    if check_lang(lang) == "en":
        return None
    family = cjk_font()
    if family is None and not _warned:
        _warned = True
        warnings.warn(NO_FONT, stacklevel=3)
    return family


def drawn_lang(lang):
    """(the language a figure's labels are drawn in, the CJK family or None): ``lang`` with its
    font, or English when no font can draw it (see ``font_for``)."""
    family = font_for(lang)
    return ("en", None) if family is None else (lang, family)
