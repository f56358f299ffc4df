"""The page of `minitensor explain` in a real browser: headless Chromium driven by Selenium.

Needs Debian's ``chromium`` and ``chromium-driver`` and the Python package ``selenium``
(``.ci/run`` installs them). Elsewhere the tests skip, except under ``CI=true``, where a
missing browser is a failure: CI must really run them.
"""

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import minitensor as mt

INPUT = "a b c d"


def _chromium():
    """(chromium, chromedriver) paths, or a skip (a failure under CI=true)."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    driver = shutil.which("chromedriver")
    try:
        import selenium  # noqa: F401
    except ImportError:
        browser = None
    if browser and driver:
        return browser, driver
    message = (
        "needs chromium, chromedriver and selenium (apt-get install chromium chromium-driver; pip install selenium)"
    )
    if os.environ.get("CI") == "true":
        pytest.fail("under CI=true the browser tests must run: " + message)
    pytest.skip(message)


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
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    binary, driver_path = _chromium()
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1200,1400",
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def model_view(trained_run):
    """What the model computes on INPUT, in this process: its capture and graph."""
    from minitensor.cli import _load_for_inference
    from minitensor.train.config import tokenize_text

    model, config, src_vocab, tgt_vocab, _, tgt_num_steps = _load_for_inference(str(trained_run))
    tokens = tokenize_text(config, INPUT)  # as the command line reads it
    return mt.viz.attention_page(model, tokens, src_vocab, tgt_vocab, max_len=tgt_num_steps)


def open_page(browser, page):
    browser.get(page.as_uri())
    browser.execute_script("localStorage.clear()")
    browser.get(page.as_uri())


def choose(browser, select_id, value):
    browser.execute_script(
        "const s = document.getElementById(arguments[0]); s.value = arguments[1];s.dispatchEvent(new Event('change'));",
        select_id,
        str(value),
    )


def test_the_page_loads_offline_with_no_error_and_no_request(browser, page):
    open_page(browser, page)
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == []
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
    cells = browser.find_elements("css selector", "#heatmap rect")
    shown = np.array([float(c.get_attribute("data-weight")) for c in cells])
    expected = np.array(model_view.layers[layers.index(("cross", 2))]["weights"][2]).reshape(-1)
    np.testing.assert_allclose(shown, expected, atol=1e-6)
    assert browser.find_element("id", "head").get_attribute("value") == "2"
    assert "head 3" in browser.find_element("css selector", "#head option:checked").text


def test_hovering_a_cell_shows_its_score(browser, page, model_view):
    from selenium.webdriver import ActionChains

    open_page(browser, page)
    cell = browser.find_elements("css selector", "#heatmap rect")[1]
    ActionChains(browser).move_to_element(cell).perform()
    tooltip = browser.find_element("id", "tooltip").text
    score = model_view.layers[0]["scores"][0][0][1]
    assert f"score {score:.4f}" in tooltip and "query 1" in tooltip and "key 2" in tooltip


def test_the_language_switch_changes_the_labels_and_is_remembered(browser, page, tmp_path):
    open_page(browser, page)
    assert browser.find_element("tag name", "h1").text == "Attention, step by step"
    choose(browser, "lang", "zh")
    assert browser.find_element("tag name", "h1").text == "逐步看注意力"
    assert "编码器自注意力" in browser.find_element("css selector", "#layer option").text
    browser.get(page.as_uri())  # a reload keeps the choice
    assert browser.find_element("tag name", "h1").text == "逐步看注意力"
    shot = os.environ.get("MINITENSOR_SCREENSHOT") or str(tmp_path / "explain_zh.png")
    browser.save_screenshot(shot)
    assert os.path.getsize(shot) > 10_000


def test_the_graph_has_one_node_per_function_of_the_call(browser, page, model_view):
    open_page(browser, page)
    nodes = browser.find_elements("css selector", ".graph g.node.op")
    assert len(nodes) == len(model_view.graph.ops) > 10
