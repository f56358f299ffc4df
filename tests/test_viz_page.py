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
    terms |= {"cache": "键值缓存", "step": "解码时间步", "tokens_held": "词元"}
    for key, term in terms.items():
        assert term in LABELS["zh"][key] and term in glossary, key
    assert LABELS["en"].keys() == LABELS["zh"].keys()


# -- the key/value cache, step by step (attention_page(..., cache=NAME), explain --cache) ------------
PROMPT = list("abcabcd")  # longer than the windows below: the prompt's step holds more than its query sees
POLICIES = {"window": {"window": 3}, "sinks": {"sinks": 2, "window": 3}}


def chatty_lm():
    """The tiny LM, never emitting <eos>: its continuation runs the whole max_len, past the windows."""
    model, vocab = tiny_model("lm", text="x.txt")
    bias = model.decoder.dense.bias
    bias.data[...] = np.where(np.arange(len(vocab)) == vocab.eos, -1e3, bias.numpy())
    return model, vocab


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_each_step_the_cache_holds_what_the_policy_keeps(name):
    from minitensor.testing import KEEPS

    model, vocab = chatty_lm()
    options = POLICIES[name]
    page = mt.viz.attention_page(model, PROMPT, vocab, max_len=8, cache=name, cache_options=options)
    cache = page.cache
    assert (cache["policy"], cache["options"], cache["prompt"]) == (name, options, len(PROMPT))
    assert cache["tokens"] == PROMPT + page.output and len(page.output) == 8
    assert [step["query"] for step in cache["steps"]] == list(range(len(PROMPT) - 1, len(PROMPT) + 7))
    keeps = KEEPS[name](options)
    for i, step in enumerate(cache["steps"]):
        kept_text, kept_positions = keeps(step["query"])
        assert len(step["blocks"]) == 2
        for block in step["blocks"]:
            kept, attended = np.array(block["kept"]), np.array(block["attended"])
            np.testing.assert_array_equal(kept[attended], kept_text)  # what the step's query sees
            if i == 0:  # the prompt in one step: held whole, each query masked to its own window
                np.testing.assert_array_equal(kept, np.arange(len(PROMPT)))
                continue
            np.testing.assert_array_equal(kept, kept_text)  # one token a step: the cache holds just that
            np.testing.assert_array_equal(block["positions"], kept_positions)  # sinks: re-indexed
            per_token = block["full_bytes"] / (step["query"] + 1)
            assert block["bytes"] == per_token * len(kept) < block["full_bytes"]
        sinks = step["blocks"][0]["sinks"]
        assert sinks == ([0, 1] if name == "sinks" else [])  # kept apart from the recent tokens


@pytest.mark.parametrize("name", ["sinks", "window", "int8"])
def test_a_steps_weights_are_those_of_decoding_with_the_cache(name):
    model, vocab = chatty_lm()
    options = POLICIES.get(name, {})
    page = mt.viz.attention_page(model, PROMPT, vocab, max_len=6, cache=name, cache_options=options)
    generated = mt.inference.generate(model, PROMPT, vocab, 6, cache=name, cache_options=options)
    assert page.output == generated.tokens[len(PROMPT) :]
    ids = vocab[PROMPT + page.output]
    model.eval()
    with mt.no_grad(), mt.nn.attention.plain_attention(model):
        state = model.begin_decoding(cache=name, cache_options=options)
        feed = [ids[: len(PROMPT)]] + [[i] for i in ids[len(PROMPT) : -1]]
        for step, tokens in zip(page.cache["steps"], feed, strict=True):
            logits, state = model.decode_step(mt.tensor([tokens]), state)
            scores = logits.numpy()[0, -1]
            scores[[vocab.pad, vocab.bos]] = -np.inf  # never generated
            assert int(scores.argmax()) == ids[step["query"] + 1]  # greedy, as generated
            for block, weights, held in zip(step["blocks"], model.attention_weights, state[2], strict=True):
                np.testing.assert_allclose(block["weights"], weights.numpy()[0, :, -1], atol=1e-6)
                assert block["bytes"] == held.bytes() and block["kept"] == held.kept().tolist()
    int8 = page.cache["steps"][-1]["blocks"][0]
    if name == "int8":  # every token kept, in half the bytes here (d_head 4: 4 + 4 bytes against 16)
        assert len(int8["kept"]) == len(ids) - 1 and int8["bytes"] * 2 == int8["full_bytes"]


def test_the_page_shows_the_caches_tokens_kept_dropped_and_its_memory():
    model, vocab = chatty_lm()
    page = mt.viz.attention_page(model, PROMPT, vocab, max_len=8, cache="sinks", cache_options=POLICIES["sinks"])
    data, rest = page_data(page.html)
    assert data["cache"] == page.cache and data["cache"]["steps"][-1]["blocks"][0]["kept"] == [0, 1, 11, 12, 13]
    for element in ('id="cache-step"', 'id="cache-block"', 'id="cache-tokens"', 'id="cache-heatmap-box"'):
        assert element in rest
    assert '<code id="cache-policy">sinks (sinks=2, window=3)</code>' in rest
    for key in ("cache", "cache_note", "policy", "step", "in_cache", "dropped", "sink", "not_seen"):
        assert f'data-label="{key}"' in rest
    assert "dropped" in page_js() and "line-through" in rest  # the dropped tokens, struck through
    zh = mt.viz.attention_page(model, PROMPT, vocab, max_len=8, cache="sinks", cache_options={"window": 3}, lang="zh")
    assert "键值缓存" in zh.html and zh.cache["options"] == {"window": 3}


def page_js():
    from importlib import resources

    return resources.files("minitensor.viz").joinpath("page.js").read_text(encoding="utf-8")


def test_an_unknown_cache_policy_is_named_and_a_cache_needs_a_language_model():
    from minitensor.core.plugins import UnknownPluginError

    model, vocab = chatty_lm()
    with pytest.raises(UnknownPluginError, match="'windw'.*did you mean 'window'"):
        mt.viz.attention_page(model, PROMPT, vocab, cache="windw")
    with pytest.raises(TypeError, match="key/value cache 'window'.*unknown option"):
        mt.viz.attention_page(model, PROMPT, vocab, cache="window", cache_options={"size": 3})
    with pytest.raises(ValueError, match="name it with cache="):
        mt.viz.attention_page(model, PROMPT, vocab, cache_options={"window": 3})
    seq2seq, vocab = tiny_model()
    with pytest.raises(ValueError, match="cache='window': an encoder-decoder's page translates with the full cache"):
        mt.viz.attention_page(seq2seq, list("abc"), vocab, vocab, cache="window", cache_options={"window": 2})


@pytest.mark.parametrize("kind", ["lm", "transformer"])
def test_the_full_cache_gives_the_page_as_before(kind):
    def page(**cache):  # a model of its own: the page's backward leaves gradients in the parameters
        model, vocab = chatty_lm() if kind == "lm" else tiny_model()
        vocabs = (vocab,) if kind == "lm" else (vocab, vocab)
        return mt.viz.attention_page(model, list("abc"), *vocabs, max_len=4, **cache)

    before, full = page(), page(cache="full")
    assert full.html == before.html and full.cache is None and 'id="cache-step"' not in full.html
    assert "cache" not in page_data(full.html)[0]


def test_minitensor_explain_shows_a_language_models_cache(tmp_path):
    def run(*args):
        return subprocess.run([sys.executable, "-m", "minitensor", *args], capture_output=True, text=True, cwd=tmp_path)

    (tmp_path / "text.txt").write_text("the cat sat on the mat. " * 40, encoding="utf-8")
    small = ["--lm-num-steps", "16", "--steps", "4", "--batch-size", "8", "--num-hiddens", "16"]
    small += ["--ffn-num-hiddens", "32", "--num-blks", "1", "--no-progress"]
    trained = run("train", "--text", "text.txt", *small, "--out", "lm")
    assert trained.returncode == 0, trained.stderr
    done = run("explain", "--checkpoint", "lm", "the cat", "--cache", "sinks", "--cache-opt", "sinks=2,window=4")
    assert done.returncode == 0, done.stderr
    data, _ = page_data((tmp_path / "lm" / "explain.html").read_text(encoding="utf-8"))
    assert data["cache"]["policy"] == "sinks" and data["cache"]["options"] == {"sinks": 2, "window": 4}
    assert len(data["cache"]["steps"]) == len(data["cache"]["tokens"]) - len("the cat")
    assert all(len(step["blocks"][0]["kept"]) <= 6 for step in data["cache"]["steps"][1:])  # after the prompt
    wrong = run("explain", "--checkpoint", "lm", "the cat", "--cache", "windw")
    assert wrong.returncode == 2 and "'windw'" in wrong.stderr and "did you mean 'window'" in wrong.stderr
    lonely = run("explain", "--checkpoint", "lm", "the cat", "--cache-opt", "window=4")
    assert lonely.returncode == 2 and "name it with --cache NAME" in lonely.stderr


class LastTwo(mt.nn.KVCache):
    """A user's policy from the contract alone: the last two positions (no kept(), no mask())."""

    def __init__(self, **options):
        mt.plugins.check_options(type(self), options)
        self.k = self.v = None
        self.first = 0

    def append(self, keys, values, positions):
        if self.k is not None:
            drop = max(self.k.shape[2] - 1, 0)
            self.k, self.v, self.first = self.k[:, :, drop:], self.v[:, :, drop:], self.first + drop
        self.k = keys if self.k is None else mt.concat([self.k, keys], axis=2)
        self.v = values if self.v is None else mt.concat([self.v, values], axis=2)

    def keys(self):
        return self.k

    def values(self):
        return self.v

    def positions(self):
        return np.arange(self.first, self.first + self.k.shape[2])


class UserCaches:
    @mt.hookimpl
    def minitensor_kv_caches(self):
        return {"last_two": LastTwo}


def test_a_users_cache_policy_shows_as_the_built_ins_do():
    registered = mt.plugins.register(UserCaches())
    try:
        model, vocab = chatty_lm()
        page = mt.viz.attention_page(model, PROMPT, vocab, max_len=4, cache="last_two")
    finally:
        mt.plugins.unregister(name=registered)
    first, *rest = page.cache["steps"]
    assert first["blocks"][0]["kept"] == list(range(len(PROMPT))) and all(first["blocks"][0]["attended"])
    for step in rest:
        t = step["query"]
        assert step["blocks"][1]["kept"] == step["blocks"][1]["positions"] == [t - 1, t]
        assert np.allclose(np.sum(step["blocks"][1]["weights"], axis=-1), 1, atol=1e-5)
