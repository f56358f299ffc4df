"""The page of `minitensor explain` in a real browser: headless Chromium driven by Selenium,
with its network turned off (the page is one self-contained file). Every check waits for the
page's script to have done what it checks (tests/browser.py says why and how).

Needs Debian's ``chromium`` and ``chromium-driver`` and the Python package ``selenium``
(``.ci/run`` installs them). Elsewhere the tests skip, except under ``CI=true``, where a
missing browser is a failure: CI must really run them.
"""

import os
import subprocess
import sys

import numpy as np
import pytest
from browser import chrome, load, reload, reload_until, requests, text_of, wait_for, wait_for_text

import minitensor as mt

INPUT = "a b c d"


@pytest.fixture(scope="module")
def page(trained_run):
    """The page of the trained run on INPUT, written by ``minitensor explain``."""
    out = trained_run / "explain.html"
    done = subprocess.run(
        [sys.executable, "-m", "minitensor", "explain", "--checkpoint", str(trained_run), INPUT, "--out", str(out)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    return out


@pytest.fixture(scope="module")
def browser():
    with chrome(offline=True) as driver:
        yield driver


@pytest.fixture(scope="module")
def model_view(trained_run):
    """What the model computes on INPUT, in this process: its capture and graph."""
    from minitensor.cli import _load_for_inference
    from minitensor.train.config import tokenize_text

    model, config, src_vocab, tgt_vocab, _, tgt_num_steps = _load_for_inference(str(trained_run))
    tokens = tokenize_text(config, INPUT)  # as the command line reads it
    return mt.viz.attention_page(model, tokens, src_vocab, tgt_vocab, max_len=tgt_num_steps)


def open_page(browser, page):
    """The page as a first-time reader sees it: nothing remembered, its script done."""
    load(browser, page.as_uri())
    browser.execute_script("localStorage.clear()")
    reload_until(browser, lambda d: text_of(d, "h1") == "Attention, step by step", "the page in English")
    requests(browser)  # what the loads asked for is checked by the first test; start afresh


def choose(browser, select_id, value):
    """Pick ``value`` in the page's <select id=select_id>, as a reader's choice does (a change event)."""
    browser.execute_script(
        "const s = document.getElementById(arguments[0]); s.value = arguments[1];s.dispatchEvent(new Event('change'));",
        select_id,
        str(value),
    )


def heatmap(browser):
    """The weights the heatmap shows, cell by cell."""
    return [float(c.get_attribute("data-weight")) for c in browser.find_elements("css selector", "#heatmap rect")]


def same(shown, expected):
    return len(shown) == len(expected) and np.allclose(shown, expected, atol=1e-6)


def test_the_page_loads_offline_with_no_error_and_no_request(browser, page):
    load(browser, page.as_uri())
    wait_for(browser, lambda d: d.find_elements("css selector", "#heatmap rect"), "the heatmap to be drawn")
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == []
    assert [url for url in requests(browser) if url != page.as_uri()] == []  # nothing but the file itself
    assert browser.execute_script("return performance.getEntriesByType('resource').length") == 0
    timing = browser.execute_script(
        "const t = performance.getEntriesByType('navigation')[0]; return t.loadEventEnd - t.startTime"
    )
    print(f"the page rendered in {timing:.0f} ms (Navigation Timing)")


def test_block_2_head_3_of_cross_attention_shows_that_heads_weights(browser, page, model_view):
    open_page(browser, page)
    layers = [(layer["kind"], layer["block"]) for layer in model_view.layers]
    choose(browser, "layer", layers.index(("cross", 2)))
    choose(browser, "head", 2)  # heads count from 1 on the page: head 3
    expected = np.array(model_view.layers[layers.index(("cross", 2))]["weights"][2]).reshape(-1)
    wait_for(
        browser,
        lambda d: "head 3" in text_of(d, "#head option:checked") and same(heatmap(d), expected),
        "the heatmap of block 2's cross-attention, head 3",
    )
    np.testing.assert_allclose(heatmap(browser), expected, atol=1e-6)
    assert browser.find_element("id", "head").get_attribute("value") == "2"


def test_hovering_a_cell_shows_its_score(browser, page, model_view):
    from selenium.webdriver import ActionChains

    open_page(browser, page)
    cell = wait_for(browser, lambda d: d.find_elements("css selector", "#heatmap rect")[1:], "the heatmap")[0]
    ActionChains(browser).move_to_element(cell).perform()
    score = model_view.layers[0]["scores"][0][0][1]
    wait_for(browser, lambda d: "query 1" in text_of(d, "#tooltip"), "the tooltip of the hovered cell")
    tooltip = text_of(browser, "#tooltip")
    assert f"score {score:.4f}" in tooltip and "query 1" in tooltip and "key 2" in tooltip


def test_the_language_switch_changes_the_labels_and_is_remembered(browser, page, tmp_path):
    open_page(browser, page)
    choose(browser, "lang", "zh")
    wait_for_text(browser, "h1", "逐步看注意力")
    assert "编码器自注意力" in text_of(browser, "#layer option")
    # a reload keeps the choice, every time: it is in the page's address (localStorage alone,
    # which Chromium hands a file:// page a reload in ten without it under load, is not enough)
    assert browser.execute_script("return location.hash") == "#lang=zh"
    for _ in range(3):
        reload(browser)
        assert text_of(browser, "h1") == "逐步看注意力"
    assert "编码器自注意力" in text_of(browser, "#layer option")
    shot = os.environ.get("MINITENSOR_SCREENSHOT") or str(tmp_path / "explain_zh.png")
    browser.save_screenshot(shot)
    assert os.path.getsize(shot) > 10_000


def test_the_graph_has_one_node_per_function_of_the_call(browser, page, model_view):
    open_page(browser, page)
    nodes = wait_for(browser, lambda d: d.find_elements("css selector", ".graph g.node.op"), "the graph's nodes")
    assert len(nodes) == len(model_view.graph.ops) > 10


@pytest.fixture(scope="module")
def cache_page(tmp_path_factory):
    """A language model's page with the 'sinks' cache (2 sinks, a window of 3), and its data."""
    from test_viz_page import POLICIES, PROMPT, chatty_lm

    model, vocab = chatty_lm()
    page = mt.viz.attention_page(model, PROMPT, vocab, max_len=8, cache="sinks", cache_options=POLICIES["sinks"])
    path = tmp_path_factory.mktemp("cache") / "sinks.html"
    page.save(path)
    return path, page


def cache_heatmap(browser):
    """The weights the cache's heatmap shows, head by head, kept token by kept token."""
    return [float(c.get_attribute("data-weight")) for c in browser.find_elements("css selector", "#cache-heatmap rect")]


def test_the_cache_section_shows_the_chosen_steps_tokens_and_weights(browser, cache_page):
    path, page = cache_page
    load(browser, path.as_uri())
    browser.execute_script("localStorage.clear()")
    reload_until(browser, lambda d: d.find_elements("css selector", "#cache-tokens span"), "the cache's tokens")
    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []

    def strip(d):
        return [(s.text, s.get_attribute("class")) for s in d.find_elements("css selector", "#cache-tokens span")]

    last = page.cache["steps"][-1]["blocks"][0]  # the page opens at the last step, block 1
    shown = strip(browser)
    assert [text for text, _ in shown] == page.cache["tokens"][: page.cache["steps"][-1]["query"] + 1]
    dropped = [p for p, (_, kind) in enumerate(shown) if kind == "dropped"]
    assert dropped == [p for p in range(len(shown)) if p not in last["kept"]] and len(dropped) == 9
    assert [p for p, (_, kind) in enumerate(shown) if "sink" in kind] == last["sinks"] == [0, 1]
    token = browser.find_element("css selector", "#cache-tokens span.dropped")
    assert "line-through" in token.value_of_css_property("text-decoration")
    np.testing.assert_allclose(cache_heatmap(browser), np.array(last["weights"]).reshape(-1), atol=1e-6)
    assert "KiB" in text_of(browser, "#cache-memory") or " B " in text_of(browser, "#cache-memory")

    choose(browser, "cache-step", 0)  # the prompt's step: held whole, the query masked to the sinks and its window
    choose(browser, "cache-block", 1)
    first = page.cache["steps"][0]["blocks"][1]
    wait_for(browser, lambda d: len(strip(d)) == page.cache["prompt"], "the prompt's step")
    assert [kind for _, kind in strip(browser)].count("not_seen") == first["attended"].count(False) == 2
    np.testing.assert_allclose(cache_heatmap(browser), np.array(first["weights"]).reshape(-1), atol=1e-6)

    choose(browser, "lang", "zh")
    wait_for_text(browser, "h1", "逐步看注意力")
    assert "键值缓存" in text_of(browser, "#cache-memory") and "块 2" in text_of(browser, "#cache-block option:checked")
