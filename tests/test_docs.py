"""The documentation site (mkdocs.yml) builds with ``mkdocs build --strict``: home pages in both
languages, every tutorial in both languages from the runs tests/test_tutorials.py makes anyway
(each tutorial runs once per session, see ``tutorial_runs`` in conftest.py), the API reference,
the plugin contract, the glossary and the benchmarks; every link inside the site resolves."""

import functools
import http.server
import json
import os
import pathlib
import re
import subprocess
import sys
import threading
import time
import urllib.parse

import pytest
from browser import chrome, closed_port, load, requests, wait_for

ROOT = pathlib.Path(__file__).resolve().parent.parent
EDITIONS = sorted(ROOT.joinpath("tutorials").glob("[0-9][0-9]_*.py"))
EDITIONS += sorted(ROOT.joinpath("tutorials", "zh").glob("[0-9][0-9]_*.py"))


def _need(module):
    try:
        __import__(module)
    except ImportError:
        message = f'{module} is not installed: pip install -e ".[docs]"'
        if os.environ.get("CI") == "true":
            pytest.fail("under CI=true the site must be built (.ci/run installs the docs extra): " + message)
        pytest.skip(message)


@pytest.fixture(scope="module")
def site(tutorial_runs, tmp_path_factory):
    for module in ("mkdocs", "material", "mkdocstrings_handlers.python", "mkdocs_static_i18n", "jieba"):
        _need(module)
    for path in EDITIONS:
        done = tutorial_runs.run(path)
        assert done.returncode == 0, f"{path.name} failed, so its page cannot be built:\n{done.stderr[-2000:]}"
    out = tmp_path_factory.mktemp("site") / "site"
    env = dict(os.environ, MINITENSOR_DOCS_TUTORIALS=str(tutorial_runs.folder))
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    print(f"mkdocs build --strict: {time.perf_counter() - start:.1f} s")
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stderr[-6000:]}"
    return out


def html(site, page):
    return (site / page / "index.html").read_text(encoding="utf-8")


def test_home_pages_in_both_languages_link_each_other(site):
    en, zh = html(site, ""), html(site, "zh")
    assert "Quickstart" in en and 'href="zh/"' in en
    assert "快速上手" in zh and 'href="../"' in zh
    assert 'hreflang="zh"' in en  # the language switch


@pytest.mark.parametrize("path", EDITIONS, ids=[("zh/" if p.parent.name == "zh" else "") + p.stem for p in EDITIONS])
def test_every_tutorial_has_its_page_with_code_outputs_and_figures(site, path):
    zh = path.parent.name == "zh"
    page = html(site, f"{'zh/' if zh else ''}tutorials/{path.stem}")
    assert 'class="language-python' in page or "highlight" in page
    assert "冒烟模式" in page if zh else "smoke mode" in page
    figures = re.findall(r'<img[^>]+src="([^"]+\.(?:png|svg))"', page)
    assert figures, f"{path.name}: its page shows no figure"
    assert all(f"/{'zh' if zh else 'en'}/{path.stem}/" in src for src in figures)


def test_api_reference_and_contract_come_from_the_docstrings(site):
    nn = html(site, "api/nn")
    assert "MultiHeadAttention" in nn and "num_heads" in nn
    assert "Adam" in html(site, "api/optim")
    contract = html(site, "plugin_contract")
    for hook in ("minitensor_scorers", "minitensor_poolings", "minitensor_positional_encodings"):
        assert hook in contract
    assert "long_attention.py" in html(site, "benchmarks")
    assert "注意力汇聚" in html(site, "glossary")


def test_the_readmes_long_sections_are_pages_of_the_site(site):
    """What the README leaves out is on the site's guide pages, their links to repository files
    rewritten to the site's pages (bench/README.md -> the benchmarks page)."""
    guide = html(site, "guide")
    assert "Runs, resuming, and mistakes" in guide and "../benchmarks/#training-runs-from-the-command-line" in guide
    assert "sliding_window" in html(site, "attention") and "CuPy" in html(site, "gpu")
    assert "gradcheck.py" in html(site, "engine")
    assert "figures/01_attention_cues.png" in html(site, "tutorials_overview")
    assert "注意力汇聚" in html(site, "zh/tutorials_overview")


def test_search_finds_chinese_words(site):
    """Material's search splits Chinese into words (jieba) at build time; the index holds both languages."""
    index = json.loads((site / "search" / "search_index.json").read_text(encoding="utf-8"))
    separator = re.compile(index["config"]["separator"])
    words = {w for doc in index["docs"] for w in separator.split(re.sub(r"<[^>]+>", " ", doc["text"]))}
    assert "注意力" in words and "attention" in words
    assert any(doc["location"].startswith("zh/tutorials/") for doc in index["docs"])


def test_every_link_inside_the_site_resolves(site):
    """Beyond what --strict checks in the Markdown: every relative href/src in every built page,
    and nothing is fetched from a web font service."""
    broken = []
    for page in site.rglob("*.html"):
        text = page.read_text(encoding="utf-8")
        assert "fonts.googleapis" not in text, page
        for target in re.findall(r'(?:href|src)="([^"#?]+)', text):
            if re.match(r"[a-z]+:|//", target):
                continue
            base = site if target.startswith("/") else page.parent  # 404.html links from the root
            resolved = (base / urllib.parse.unquote(target).lstrip("/")).resolve()
            if resolved.is_dir():
                resolved = resolved / "index.html"
            if not resolved.exists():
                broken.append(f"{page.relative_to(site)} -> {target}")
    assert not broken, broken[:20]


def test_every_public_name_has_its_docstring_in_the_api_reference(site):
    """Every name of the ``__all__`` of the six documented modules is on that module's API page
    with its docstring: as a heading mkdocstrings made (``id`` = the public path, e.g.
    ``minitensor.abs``, or the path where it is defined, e.g. ``minitensor.ops.softmax.softmax``,
    for the functions whose module has the same name and that griffe hides), or as a link to
    such a heading on another API page (``mt.nn``, ``mt.hookimpl``)."""
    import importlib
    import inspect

    pages = {
        "minitensor": "minitensor",
        "minitensor.nn": "nn",
        "minitensor.optim": "optim",
        "minitensor.plugins": "plugins",
        "minitensor.testing": "testing",
        "minitensor.viz": "viz",
        "minitensor.onnx": "onnx",
    }
    modules = {name: importlib.import_module(name) for name in pages}

    def documented(text, anchor):
        """The docstring under the heading ``id=anchor``: the text of its contents before any
        child block, without the 'Bases:' line of a class."""
        heading = re.search(
            rf'<h[1-6] id="{re.escape(anchor)}" class="doc doc-heading">.*?</h[1-6]>\s*'
            rf'<div class="doc doc-contents[^"]*">(.*?)<(?:/?div\b)',
            text,
            re.S,
        )
        if heading is None:
            return False
        body = re.sub(r'<p class="doc doc-class-bases">.*?</p>', "", heading.group(1), flags=re.S)
        return bool(re.sub(r"<[^>]+>", "", body).strip())

    missing = []
    for module_name, page in pages.items():
        module = modules[module_name]
        text = html(site, f"api/{page}")
        for name in module.__all__:
            obj = getattr(module, name)
            # the public paths of the object (mt.hookimpl is minitensor.plugins.hookimpl too)...
            # (and the module's own name: minitensor.nn is minitensor.core.nn, documented as such)
            anchors = {
                f"{path}.{name}"
                for m, mod in modules.items()
                if name in mod.__all__ and getattr(mod, name) is obj
                for path in (m, mod.__name__)
            }
            # ...and the path where it is defined
            if inspect.ismodule(obj):
                anchors.add(obj.__name__)
            elif inspect.isclass(obj) or inspect.isroutine(obj):
                anchors.add(f"{obj.__module__}.{obj.__qualname__}")
            if any(documented(text, anchor) for anchor in anchors):
                continue
            # a link to another API page: <a href="../plugins/#minitensor.plugins.hookimpl">
            links = re.findall(r'<a href="\.\./(\w+)/#([^"]+)"', text)
            if not any(
                documented(html(site, f"api/{other}"), anchor)
                for other, anchor in links
                if other in pages.values() and anchor in anchors
            ):
                missing.append(f"{module_name}.{name} (api/{page}: none of {sorted(anchors)})")
    assert not missing, "names of __all__ missing from the API reference:\n" + "\n".join(missing)


# -- read offline: MathJax is served with the site, and no request leaves the machine ----------
@pytest.fixture(scope="module")
def served(site):
    """The built site on a loopback port, as ``mkdocs serve`` shows it to a reader (one server
    thread, shut down after the module)."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


# The text of the page a reader sees that still holds TeX's delimiters: a formula MathJax has
# not typeset (code, and MathJax's own output, left out)
RAW_TEX = r"""
const raw = [];
const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
for (let node = walker.nextNode(); node; node = walker.nextNode()) {
  if (node.parentElement.closest("pre, code, script, style, mjx-container")) continue;
  const text = node.textContent;
  if (["\\(", "\\)", "\\[", "\\]"].some((d) => text.includes(d))) raw.push(text.trim().slice(0, 80));
}
return raw;
"""

TYPESET = """
const formulas = document.querySelectorAll("article .arithmatex");
const done = [...formulas].filter((f) => f.querySelector("mjx-container")).length;
// and the fonts MathJax asked for have arrived (the browser fetches them after the typesetting)
const fonts = performance.getEntriesByType("resource").some((r) => r.name.endsWith(".woff"));
return formulas.length > 0 && done === formulas.length && fonts && document.fonts.status === "loaded" ? done : 0;
"""


def test_the_site_loads_no_script_or_style_from_the_web():
    """mkdocs.yml and the theme's overrides name no http(s):// script or stylesheet."""
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    web = re.findall(r"^\s*-\s*(https?://\S+)", config, re.M)
    assert web == [], f"mkdocs.yml loads {web} from the web"
    for path in [ROOT / "docs" / "javascripts" / "mathjax.js", *ROOT.joinpath("docs").glob("overrides/**/*")]:
        if path.is_file():
            assert not re.search(r"(src|href)=[\"']https?://|import .*https?://", path.read_text(encoding="utf-8")), (
                path
            )


@pytest.mark.parametrize(
    "page",
    ["tutorials/03_scoring_functions/", "zh/tutorials/06_self_attention_and_positional_encoding/", "glossary/"],
)
def test_formulas_are_typeset_with_the_network_off_and_no_request_leaves_the_machine(served, page):
    """A reader without a network: Chromium reaches this machine's loopback alone (everything
    else goes to a proxy on a closed port). Every formula is typeset by the MathJax the site
    serves, none is left as raw TeX (the table of contents included), MathJax's fonts come from
    the site, and every request the page made went to the site itself."""
    with chrome(proxy=f"127.0.0.1:{closed_port()}") as browser:
        load(browser, served + page)
        count = wait_for(
            browser,
            lambda d: d.execute_script(TYPESET),
            f"MathJax to typeset every formula of {page} and its fonts to load",
        )
        raw = browser.execute_script(RAW_TEX)
        urls = requests(browser)
        failed = [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    print(f"{page}: {count} formulas typeset, {len(urls)} requests")
    assert raw == [], f"raw TeX left on {page}: {raw}"
    assert [u for u in urls if not u.startswith((served, "data:", "blob:"))] == []
    assert any(u.startswith(served + "javascripts/mathjax/") and u.endswith(".woff") for u in urls)
    # Material's language selector looks for a sitemap.xml beside each alternate page, which
    # mkdocs-static-i18n's pages never have (a 404 from this machine, with or without a network)
    assert [m for m in failed if "/sitemap.xml " not in m] == []
