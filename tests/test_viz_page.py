"""The attention page (mt.viz.attention_page, minitensor explain) as data: one offline HTML
file with a Content-Security-Policy, whose embedded numbers are the model's, for every kind
of model the CLI trains. (What a browser makes of it: tests/test_viz_browser.py.)"""

import json
import re
import subprocess
import sys

import numpy as np
import pytest

import minitensor as mt
from minitensor.data import Vocab
from minitensor.train.config import TrainConfig, build_model

TINY = ["--task", "reverse", "--num-train", "64", "--num-heldout", "8", "--max-len", "4", "--batch-size", "32"]
TINY += ["--num-blks", "2", "--num-hiddens", "8", "--ffn-num-hiddens", "16", "--num-heads", "2", "--no-progress"]


def page_data(html):
    """The JSON the page carries, and the page with it cut out."""
    found = re.search(r'<script type="application/json" id="page-data">(.*?)</script>', html, flags=re.S)
    return json.loads(found.group(1).replace("<\\/", "</")), html.replace(found.group(0), "")


def tiny_model(model="transformer", **options):
    vocab = Vocab(list("abcdef"))
    mt.manual_seed(0)
    config = TrainConfig(model=model, num_hiddens=8, ffn_num_hiddens=8, num_heads=2, num_blks=2, **options)
    return build_model(config, vocab, vocab), vocab


def test_the_page_carries_the_models_weights_and_nothing_from_outside():
    model, vocab = tiny_model(positional="alibi")
    page = mt.viz.attention_page(model, list("abca"), vocab, vocab, max_len=5)
    data, rest = page_data(page.html)
    assert "default-src 'none'" in rest and 'http-equiv="Content-Security-Policy"' in rest
    assert not re.search(r"(src|href)=", rest)  # nothing to fetch
    assert set(re.findall(r"https?://[^\s\"'<>]+", page.html)) <= {"http://www.w3.org/2000/svg"}
    kinds = [(layer["kind"], layer["block"]) for layer in data["layers"]]
    assert kinds == [
        ("encoder_self", 1),
        ("encoder_self", 2),
        ("decoder_self", 1),
        ("cross", 1),
        ("decoder_self", 2),
        ("cross", 2),
    ]
    cross = data["layers"][5]
    assert cross["queries"] == ["<bos>"] + page.output and cross["keys"] == list("abca") + ["<eos>"]
    # the numbers are those of the model's own pass
    enc_X = mt.tensor([[vocab[c] for c in "abca"] + [vocab.eos]])
    dec_X = mt.tensor([[vocab.bos] + vocab[page.output]])
    model.eval()
    with mt.no_grad(), mt.nn.attention.plain_attention(model):
        model(enc_X, dec_X, mt.tensor([5]))
    np.testing.assert_allclose(cross["weights"], model.decoder.attention_weights[1][1].numpy()[0], atol=1e-6)
    assert cross["bias"] is None and data["layers"][0]["bias"] is not None  # alibi: self-attention only
    assert data["labels"]["zh"]["weights"] == "注意力权重" and data["lang"] == "en"
    assert page.graph is not None and len(page.graph.ops) > 10
    assert all(n.grad_norm is not None for n in page.graph.ops)  # the page's backward ran


def test_masked_keys_are_marked_and_scores_keep_minus_infinity_as_null():
    model, vocab = tiny_model()
    page = mt.viz.attention_page(model, list("ab"), vocab, vocab, max_len=3, num_steps=5)
    data, _ = page_data(page.html)
    encoder = data["layers"][0]
    assert encoder["keys"] == ["a", "b", "<eos>", "<pad>", "<pad>"]
    assert all(row[3:] == [False, False] for row in encoder["allowed"][0])  # padding: valid_lens 3
    decoder = data["layers"][2]
    assert decoder["allowed"][0][0][1:] == [False] * (len(decoder["keys"]) - 1)  # causal
    assert all(w == 0 for w in decoder["weights"][0][0][1:])


def test_a_plugin_scorer_and_pooling_show_as_the_built_ins_do():
    model, vocab = tiny_model(scorer="additive", pooling="sparsemax")
    page = mt.viz.attention_page(model, list("abc"), vocab, vocab, max_len=3)
    data, _ = page_data(page.html)
    weights = np.array(data["layers"][0]["weights"])
    assert weights.shape == (2, 4, 4) and np.allclose(weights.sum(-1), 1, atol=1e-6)


@pytest.mark.parametrize("kind", ["bahdanau", "lm"])
def test_every_model_the_cli_trains_has_a_page(kind):
    model, vocab = tiny_model(kind, **({"text": "x.txt"} if kind == "lm" else {}))
    if kind == "lm":
        page = mt.viz.attention_page(model, list("abc"), vocab, max_len=4)
        data, _ = page_data(page.html)
        assert [layer["kind"] for layer in data["layers"]] == ["decoder_self", "decoder_self"]
        assert data["layers"][0]["queries"] == list("abc") + page.output[:-1]
    else:
        page = mt.viz.attention_page(model, list("abc"), vocab, vocab, max_len=4)
        data, _ = page_data(page.html)
        (layer,) = data["layers"]  # one additive attention, a query per decoded token
        assert layer["kind"] == "cross" and len(layer["weights"]) == 1
        assert len(layer["queries"]) == len(layer["weights"][0]) == len(page.output) + 1


def test_the_page_speaks_chinese_saves_itself_and_refuses_an_unknown_language(tmp_path):
    model, vocab = tiny_model()
    page = mt.viz.attention_page(model, list("abc"), vocab, vocab, max_len=3, lang="zh")
    assert '<html lang="zh-CN" data-minitensor-page>' in page.html and "逐步看注意力" in page.html
    path = page.save(tmp_path / "page.html")
    assert open(path, encoding="utf-8").read() == page.html == page._repr_html_()
    with pytest.raises(ValueError, match="lang must be one of"):
        mt.viz.attention_page(model, list("abc"), vocab, vocab, lang="fr")


def test_minitensor_explain_writes_the_page_of_a_trained_run(tmp_path):
    def run(*args):
        return subprocess.run([sys.executable, "-m", "minitensor", *args], capture_output=True, text=True, cwd=tmp_path)

    trained = run("train", *TINY, "--epochs", "1", "--out", "run")
    assert trained.returncode == 0, trained.stderr
    done = run("explain", "--checkpoint", "run", "a b c", "--beam", "2")
    assert done.returncode == 0, done.stderr
    assert "page: " in done.stdout and (tmp_path / "run" / "explain.html").stat().st_size < 2 * 2**20
    data, _ = page_data((tmp_path / "run" / "explain.html").read_text(encoding="utf-8"))
    assert len(data["layers"]) == 6
    empty = run("explain", "--checkpoint", "run", " ")
    assert empty.returncode == 2 and "the input is empty" in empty.stderr


def test_the_chinese_labels_use_the_glossarys_terms():
    from pathlib import Path

    from minitensor.viz.page import LABELS

    glossary = (Path(__file__).resolve().parents[1] / "tutorials" / "GLOSSARY.md").read_text(encoding="utf-8")
    terms = {"weights": "注意力权重", "head": "头", "cross": "编码器－解码器注意力", "bias": "注意力偏置"}
    terms |= {"masked": "掩蔽", "graph": "计算图", "output": "词元", "alternatives": "束搜索"}
    for key, term in terms.items():
        assert term in LABELS["zh"][key] and term in glossary, key
    assert LABELS["en"].keys() == LABELS["zh"].keys()
