"""The library's own figures in Chinese (minitensor/i18n.py): plot_loss, show_heatmaps and the
attention maps with lang="zh" draw every label -- axis labels, titles, the suptitle, legend
texts -- in Chinese, with a CJK font, and with no "Glyph missing" warning; mt.viz.graph's SVG
boxes too. Tested like the Chinese tutorials' figures (tests/test_tutorials_zh.py).

Exempt, because they are data and not labels: the tokens on a heatmap's axes, the numbers on
any axis, an op's class name, a leaf's own name and a tensor's shape and dtype in the graph."""

import io
import os
import re
import string
import warnings
import xml.etree.ElementTree as ET

import numpy as np
import pytest

import minitensor as mt
import minitensor.i18n as i18n
from minitensor.nadaraya_watson import KERNELS
from minitensor.train import plots

CJK = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]")


@pytest.fixture
def font():
    """The CJK family the figures use; skipped without one (a failure under CI=true, where
    .ci/run installs fonts-wqy-microhei)."""
    pytest.importorskip("matplotlib")
    family = i18n.cjk_font()
    if family is None:
        message = "no CJK font on this machine (.ci/run installs fonts-wqy-microhei; or pip install '.[zh]')"
        if os.environ.get("CI") == "true":
            pytest.fail("under CI=true the Chinese figures must be tested: " + message)
        pytest.skip(message)
    return family


def labels_of(fig):
    """Every label of a figure: axis labels, titles, the suptitle, legend texts (not the ticks)."""
    found = []
    for ax in fig.axes:
        found += [ax.get_xlabel(), ax.get_ylabel(), ax.get_title()]
        legend = ax.get_legend()
        if legend is not None:
            found += [t.get_text() for t in legend.get_texts()]
    if fig._suptitle is not None:
        found.append(fig._suptitle.get_text())
    return [text for text in found if text]


def check_chinese(fig, family):
    """Chinese labels only, drawn in ``family``, and no glyph missing when the figure renders."""
    from matplotlib import font_manager
    from matplotlib.text import Text

    found = labels_of(fig)
    assert found, "a figure with no label at all"
    english = [text for text in found if not CJK.search(text)]
    assert not english, f"labels without a Chinese character in a Chinese figure: {english}"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fig.savefig(io.BytesIO(), format="png")  # outside any rc_context: the texts carry their font
    missing = [str(w.message) for w in caught if "missing from" in str(w.message)]
    assert not missing, missing
    for text in fig.findobj(Text):
        if CJK.search(text.get_text()):
            used = font_manager.findfont(text.get_fontproperties(), fallback_to_default=False)
            assert font_manager.FontProperties(fname=used).get_name() == family
    return found


def history():
    losses = list(np.linspace(3.0, 1.0, 20))
    evals = [
        {"epoch": 1, "loss": 2.0, "exact_match": 0.3, "bleu": 0.4},
        {"epoch": 2, "loss": 1.5, "exact_match": 0.6, "bleu": 0.7},
    ]
    return {"loss": losses, "eval": evals}


def test_every_chinese_label_is_chinese_and_keeps_its_fields():
    fields = string.Formatter()
    for english, chinese in i18n.LABELS["zh"].items():
        assert CJK.search(chinese), f"LABELS['zh'][{english!r}] = {chinese!r} has no Chinese character"
        assert [f[1:3] for f in fields.parse(english) if f[1]] == [f[1:3] for f in fields.parse(chinese) if f[1]]
    assert i18n.label("head {h}", "zh", h=2) == "头 2" and i18n.label("head {h}", h=2) == "head 2"
    assert i18n.label("a title of mine", "zh") == "a title of mine"  # unknown: drawn as given
    assert i18n.label("step", "zh", {"step": "迭代"}) == "迭代" and i18n.label("step", labels={"step": "it"}) == "it"
    assert {i18n.label(k, "zh") for k in KERNELS} == {"高斯核", "boxcar 核", "epanechnikov 核", "常数核"}
    with pytest.raises(ValueError, match="lang must be one of"):
        i18n.label("step", "fr")


def test_plot_loss_in_chinese(font, tmp_path):
    fig = plots.plot_loss(history(), tmp_path / "loss.png", smooth=0.9, lang="zh")
    found = check_chinese(fig, font)
    assert {"步", "损失", "训练损失（EMA 0.9）", "损失（留出集）", "精确匹配（留出集）", "评估指标"} <= set(found)
    assert (tmp_path / "loss.png").stat().st_size > 0
    # one metric on the right axis: its name; an unknown metric: "指标 name"; epochs alone: 迭代周期
    fig = plots.plot_loss({"eval": [{"epoch": 1, "f1": 0.5}, {"epoch": 2, "f1": 0.6}]}, lang="zh")
    found = check_chinese(fig, font)
    assert {"迭代周期", "指标 f1", "指标 f1（留出集）"} <= set(found)


def test_plot_loss_in_english_is_unchanged():
    fig = plots.plot_loss(history(), smooth=0.9)
    assert labels_of(fig) == [
        "step",
        "loss",
        "training loss (EMA 0.9)",
        "eval loss",
        "eval exact_match",
        "eval bleu",
        "metric",
    ]
    fig = plots.plot_loss(history(), labels={"step": "iteration", "eval {name}": "held-out {name}"})
    assert labels_of(fig)[0] == "iteration" and "held-out bleu" in labels_of(fig)


def attention(shape, seed=0):
    weights = np.random.default_rng(seed).random(shape)
    return weights / weights.sum(-1, keepdims=True)


def test_heatmaps_in_chinese(font):
    weights = attention((2, 2, 4, 5))  # (blocks, heads, Q, K) of one example
    figures = {
        "show_heatmaps": plots.show_heatmaps(weights[0], "Keys", "Queries", titles=["样本 1", "样本 2"], lang="zh"),
        "encoder": plots.plot_encoder_attention(weights[:, :, :4, :4], "abcd", lang="zh"),
        "decoder": plots.plot_decoder_self_attention(weights[:, :, :4, :4], ["<bos>", "x", "y", "z"], lang="zh"),
        "cross": plots.plot_cross_attention(weights, "abcde", "wxyz", lang="zh"),
        "seq2seq": plots.plot_seq2seq_attention(weights[0, 0], "abcde", "wxyz", lang="zh"),
    }
    found = {name: check_chinese(fig, font) for name, fig in figures.items()}
    assert set(found["show_heatmaps"]) == {"键", "查询", "样本 1", "样本 2"}  # known labels and the caller's own
    assert {"编码器自注意力", "头 1", "头 2", "键（源序列）", "块 2\n查询（源序列）"} <= set(found["encoder"])
    assert {"解码器自注意力", "键（目标序列）", "块 1\n查询（目标序列）"} <= set(found["decoder"])
    assert {"编码器－解码器注意力", "键（源序列）", "块 1\n查询（目标序列）"} <= set(found["cross"])
    assert set(found["seq2seq"]) == {"Bahdanau 注意力", "键（源序列）", "查询（目标序列）"}
    # the tokens are data: drawn as given
    ticks = [t.get_text() for t in figures["decoder"].axes[0].get_yticklabels()]
    assert ticks == ["<bos>", "x", "y", "z"]


def test_transformer_attention_in_chinese(font, tmp_path):
    mt.manual_seed(0)
    args = (13, 8, 16, 2, 2, 0.0)  # vocabulary, hiddens, FFN, heads, blocks, dropout
    model = mt.nn.EncoderDecoder(mt.nn.TransformerEncoder(*args), mt.nn.TransformerDecoder(*args)).eval()
    rng = np.random.default_rng(0)
    model(mt.tensor(rng.integers(0, 13, (1, 4))), mt.tensor(rng.integers(0, 13, (1, 3))), mt.tensor([4]))
    src, tgt = ["a", "b", "c", "d"], ["<bos>", "x", "y"]
    figs = plots.plot_transformer_attention(model, src, tgt, folder=tmp_path, prefix="zh", lang="zh")
    assert sorted(figs) == ["cross", "decoder_self", "encoder_self"]
    for fig in figs.values():
        assert "头 1" in check_chinese(fig, font)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["zh_cross.png", "zh_decoder_self.png", "zh_encoder_self.png"]


def test_heatmaps_in_english_are_unchanged():
    weights = attention((2, 2, 4, 5))
    fig = plots.plot_cross_attention(weights, "abcde", "wxyz")
    found = labels_of(fig)
    assert set(found) == {
        "head 1",
        "head 2",
        "keys (source)",
        "block 1\nqueries (target)",
        "block 2\nqueries (target)",
        "encoder-decoder attention",
    }
    fig = plots.plot_seq2seq_attention(weights[0, 0], labels={"Bahdanau attention": "additive attention"})
    assert labels_of(fig)[-1] == "additive attention"


def test_no_font_keeps_english_labels_and_warns_once(monkeypatch):
    pytest.importorskip("matplotlib")
    monkeypatch.setattr(i18n, "cjk_font", lambda: None)
    monkeypatch.setattr(i18n, "_warned", False)
    with pytest.warns(UserWarning, match="keep their English labels") as caught:
        fig = plots.plot_loss([3.0, 2.0], lang="zh")
        heat = plots.plot_cross_attention(attention((1, 2, 3, 4)), lang="zh")
    assert len([w for w in caught if "English labels" in str(w.message)]) == 1
    assert labels_of(fig) == ["step", "loss", "training loss"]  # English, not boxes
    assert "head 1" in labels_of(heat)


def svg_lines(drawing):
    """{node index: the text lines of its box} of a graph's SVG."""
    root = ET.fromstring(drawing.svg)
    ns = {"svg": "http://www.w3.org/2000/svg"}
    return {
        int(g.get("data-index")): [t.text for t in g.findall("svg:text", ns)] for g in root.findall("svg:g", ns)
    }, root


def test_graph_boxes_in_chinese():
    x = mt.tensor([[1.0, -2.0], [3.0, 4.0]], requires_grad=True)
    w = mt.tensor([[0.5], [-1.0]], requires_grad=True)
    y = (x @ w).relu().sum()
    drawing = mt.viz.graph(y, names={"x": x}, lang="zh").backward()
    lines, root = svg_lines(drawing)
    assert any(family in root.get("font-family") for family in i18n.CJK_FAMILIES)
    assert [n.label for n in drawing.leaves] == ["x", "叶子节点"]  # a named leaf keeps its name (data)
    for node in drawing.ops:  # "1. MatMul" and "(2, 1) float32" are data; the third line is a label
        assert len(lines[node.index]) == 3 and node.dtype in lines[node.index][1]
        assert CJK.search(lines[node.index][2]), f"an English label in the Chinese graph: {lines[node.index]}"
    for node in drawing.leaves:  # the leaf's name (or 叶子节点), then its shape, dtype and |梯度|
        assert len(lines[node.index]) == 2 and "|梯度| " in lines[node.index][1]
    assert lines[drawing.ops[0].index][2].startswith("保存 24 B · |梯度| ")
    assert lines[drawing.leaves[1].index][0] == "叶子节点"
    english = mt.viz.graph((x @ w).relu().sum())
    assert 'font-family="sans-serif"' in english.svg and "saved 24 B" in english.svg and "leaf" in english.svg
    assert "叶子节点" not in english.svg


@pytest.mark.parametrize("model", ["transformer", "bahdanau"])
def test_a_training_runs_own_figures_in_chinese(font, tmp_path, monkeypatch, model):
    """train(config, lang="zh"): the run folder's loss curve and attention maps in Chinese."""
    from matplotlib.image import imread

    from minitensor.train import TrainConfig, train

    config = TrainConfig(
        task="reverse",
        model=model,
        out=str(tmp_path / "run"),
        progress=False,
        num_train=32,
        num_heldout=4,
        max_len=4,
        batch_size=16,
        epochs=1,
        num_blks=1,
        num_hiddens=8,
        ffn_num_hiddens=16,
        num_heads=2,
    )
    import minitensor.train.loop as loop

    drawn = []  # every figure the run draws, kept to read its labels

    def keep(draw):
        def drawing(*args, **kwargs):
            drawn.append(draw(*args, **kwargs))
            return drawn[-1]

        return drawing

    monkeypatch.setattr(plots, "show_heatmaps", keep(plots.show_heatmaps))
    monkeypatch.setattr(loop, "plot_loss", keep(loop.plot_loss))
    result = train(config, log=lambda message: None, lang="zh")
    assert len(drawn) == (4 if model == "transformer" else 2) and len(result.figures) == len(drawn)
    for path in result.figures:
        assert imread(path).size
    found = [label for fig in drawn for label in check_chinese(fig, font)]
    assert "transformer 的训练（reverse 任务）" in found or "bahdanau 的训练（reverse 任务）" in found


def test_the_explain_pages_graph_opens_in_the_pages_language():
    from minitensor.data import Vocab
    from minitensor.train import TrainConfig
    from minitensor.train.config import build_model

    vocab = Vocab(list("abcdef"))
    mt.manual_seed(0)
    config = TrainConfig(num_hiddens=8, ffn_num_hiddens=8, num_heads=2, num_blks=1)
    model = build_model(config, vocab, vocab)
    zh = mt.viz.attention_page(model, list("abc"), vocab, vocab, max_len=3, lang="zh")
    en = mt.viz.attention_page(model, list("abc"), vocab, vocab, max_len=3)
    assert "保存 " in zh.graph.svg and "|梯度| " in zh.graph.svg and "saved " not in zh.graph.svg
    assert "saved " in en.graph.svg and "保存" not in en.graph.svg


def test_minitensor_train_takes_the_figures_language(monkeypatch):
    """`minitensor train --lang zh` hands the language to train(); English by default."""
    from minitensor import cli

    given = {}
    monkeypatch.setattr(cli, "train", lambda config, **kwargs: given.update(kwargs))
    parser = cli.build_parser()
    for words, lang in ((["train", "--lang", "zh"], "zh"), (["train"], "en")):
        args = parser.parse_args(words)
        assert args.func(args) == 0 and given["lang"] == lang
    with pytest.raises(SystemExit):
        parser.parse_args(["train", "--lang", "fr"])
