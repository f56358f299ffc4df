"""Headless Chromium for the tests that look at a page as a reader does (the ``explain`` page,
the documentation site), driven by Selenium.

Two rules keep these tests honest on a loaded machine:

- **Wait for what you check.** After anything that runs page script (a load, a reload, a
  click, a ``select``), a test waits, with a bound of a few seconds, for the condition it
  asserts (``wait_for``) instead of reading the DOM at once; never a ``sleep``.
- **No request leaves the machine.** ``chrome(offline=True)`` turns the browser's network off
  (DevTools ``Network.emulateNetworkConditions``: what a reader without a connection has) for
  pages read from files; ``chrome(proxy=...)`` sends every request that is not to this machine
  (loopback) to a closed port, for pages served on 127.0.0.1. Either way ``requests(driver)``
  lists every URL the page asked for, from DevTools' own log, so a test can show that none of
  them went elsewhere.

Needs Debian's ``chromium`` and ``chromium-driver`` and the Python package ``selenium``
(``.ci/run`` installs them). Elsewhere the tests skip, except under ``CI=true``, where a
missing browser is a failure: CI must really run them.
"""

import json
import os
import shutil
import socket
from contextlib import contextmanager

import pytest

# a page's script runs in milliseconds; the bound only ends a test that would otherwise hang,
# and is generous because a loaded CI machine may take seconds to schedule the browser
WAIT_SECONDS = 20


def chromium():
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


def closed_port():
    """A loopback port nothing listens on (a proxy there refuses every connection)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the socket is


@contextmanager
def chrome(offline=False, proxy=None, window="1200,1400"):
    """A headless Chromium that logs every request it makes (``requests``).

    ``offline``: the network is off (file:// pages still load). ``proxy``: "host:port" every
    request not to loopback goes through (Chromium never proxies loopback itself).
    """
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    binary, driver_path = chromium()
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    flags = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", f"--window-size={window}"]
    if proxy:
        flags.append(f"--proxy-server=http://{proxy}")
    for flag in flags:
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    try:
        driver.execute_cdp_cmd("Network.enable", {})
        if offline:
            driver.execute_cdp_cmd(
                "Network.emulateNetworkConditions",
                {"offline": True, "latency": 0, "downloadThroughput": -1, "uploadThroughput": -1},
            )
        yield driver
    finally:
        driver.quit()


def requests(driver):
    """Every URL the browser asked for since the last call (DevTools' Network.requestWillBeSent)."""
    urls = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    return urls


def wait_for(driver, condition, what):
    """``condition(driver)``'s first truthy value, polled until WAIT_SECONDS; else a failure
    that says ``what`` was awaited (a string, or a function that says it at that moment)."""
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        return WebDriverWait(driver, WAIT_SECONDS, poll_frequency=0.05).until(condition)
    except TimeoutException:
        pytest.fail(f"waited {WAIT_SECONDS} s for {what() if callable(what) else what}")


def text_of(driver, css):
    """The text of the first element matching ``css`` ('' while there is none)."""
    found = driver.find_elements("css selector", css)
    return found[0].text if found else ""


def wait_for_text(driver, css, expected):
    """Wait until the first ``css`` element reads ``expected`` (the page's script has run)."""
    wait_for(
        driver,
        lambda d: text_of(d, css) == expected,
        lambda: f"{css} to read {expected!r} (it reads {text_of(driver, css)!r})",
    )


def _loaded(driver):
    """The current document has loaded: its load event (and so every inline script) is done."""
    return driver.execute_script(
        "const t = performance.getEntriesByType('navigation')[0];"
        "return document.readyState === 'complete' && location.href !== 'about:blank' && !!t && t.loadEventEnd > 0"
    )


def load(driver, url):
    """Open ``url`` and wait until its document has loaded (a new document, not the old one)."""
    driver.get("about:blank")  # the old document goes first, so a same-URL load is a real one
    driver.get(url)
    wait_for(driver, _loaded, f"{url} to load")


def reload(driver):
    """Reload the page, as a reader's F5 does, and wait until the new document has loaded."""
    from selenium.webdriver.support import expected_conditions

    old = driver.find_element("tag name", "html")
    driver.refresh()
    wait_for(driver, lambda d: expected_conditions.staleness_of(old)(d) and _loaded(d), "the page to reload")


def reload_until(driver, condition, what):
    """Reload until ``condition(driver)`` holds on the new document. For what a page keeps
    between documents in localStorage: on a loaded machine Chromium's localStorage of a file://
    page reads as empty (or as before a write) in about one new document in ten."""
    return wait_for(driver, lambda d: reload(d) or condition(d), what)
