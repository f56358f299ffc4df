"""MkDocs hook: the pages of the site that are made from files kept elsewhere in the repository.

Before each build it writes them into ``docs/`` (those paths are in .gitignore: edit the
originals, never the copies), so that MkDocs and mkdocs-static-i18n see them as ordinary pages:

- the home page is README.md (English) and README.zh-CN.md (Chinese);
- the glossary is tutorials/GLOSSARY.md, the benchmarks page is bench/README.md;
- every tutorial, in both languages, is the page ``docs/_hooks/render_tutorial.py`` writes
  when it runs the tutorial: prose, code, printed output and figures.

Links between repository files are rewritten to the pages that show them (a tutorial's ``.py``
becomes its page, ``bench/README.md`` the benchmarks page); a link to a file the site does not
show (a source file, a script) becomes its path in code type, so ``mkdocs build --strict``
finds no broken link. The pages written by hand in ``docs/`` (the guide, attention's parts, the
GPU, the engine, the tutorials' overview) link the same way, by repository path (so that their
links also work where the repository is read as files); ``on_page_markdown`` rewrites them.

The formulas are typeset by MathJax 3 served with the site, never fetched from the web: after
each build, ``on_post_build`` copies it from the ``django-static-mathjax`` package (the docs
extra; MathJax's own files, no Django needed) into ``javascripts/mathjax/``, so the site reads
the same without a network and sends no reader's request elsewhere.

Where the rendered tutorials come from: ``MINITENSOR_DOCS_TUTORIALS`` names a folder holding
``en/`` and ``zh/`` as the test suite's smoke runs leave them (tests/test_docs.py), so the site
costs no second run; without it, each tutorial runs once, in smoke mode unless
``MINITENSOR_TUTORIAL_SMOKE=0``, and the result is kept in ``.cache/docs/`` until the tutorial
changes.
"""

import hashlib
import importlib.util
import logging
import os
import pathlib
import posixpath
import re
import shutil

from mkdocs.exceptions import PluginError

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
RENDER = pathlib.Path(__file__).with_name("render_tutorial.py")
# MkDocs loads a hook from its path, not as a package: its sibling is loaded the same way
_spec = importlib.util.spec_from_file_location("render_tutorial", RENDER)
_render = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_render)
LANGS = ("en", "zh")
log = logging.getLogger("mkdocs.hooks.minitensor")

# Repository path -> site path, for the files the site shows as pages.
PAGES = {
    "README.md": "index.md",
    "README.zh-CN.md": "index.zh.md",
    "tutorials/GLOSSARY.md": "glossary.md",
    "bench/README.md": "benchmarks.md",
    "minitensor/core/hookspecs.py": "plugin_contract.md",
    "docs/pytorch_differences.md": "pytorch_differences.md",
}

SMOKE_NOTE = {
    "en": (
        '!!! note "Run for this page"\n    The outputs and figures below come from one run of '
        "`{source}` in smoke mode (`MINITENSOR_TUTORIAL_SMOKE=1`): smaller data "
        "and fewer epochs than the prose describes, so numbers differ from a full run."
    ),
    "zh": (
        '!!! note "本页的运行"\n    下面的输出和图来自 `{source}` 在冒烟模式'
        "（`MINITENSOR_TUTORIAL_SMOKE=1`）下的一次运行：数据更小、迭代周期更少，所以数字与完整运行不同。"
    ),
}
FULL_NOTE = {
    "en": '!!! note "Run for this page"\n    The outputs and figures below come from one full run of `{source}`.',
    "zh": '!!! note "本页的运行"\n    下面的输出和图来自 `{source}` 的一次完整运行。',
}


def smoke_mode():
    """The site's tutorials run in smoke mode unless ``MINITENSOR_TUTORIAL_SMOKE=0`` (the test
    suite's runs, ``MINITENSOR_DOCS_TUTORIALS``, are smoke runs)."""
    if os.environ.get("MINITENSOR_DOCS_TUTORIALS"):
        return True
    return os.environ.get("MINITENSOR_TUTORIAL_SMOKE", "1") not in ("", "0")


def tutorials(lang):
    folder = ROOT / "tutorials" / ("zh" if lang == "zh" else "")
    return sorted(folder.glob("[0-9][0-9]_*.py"))


def tutorial_page(stem, lang):
    return f"tutorials/{stem}.zh.md" if lang == "zh" else f"tutorials/{stem}.md"


def site_path(repo_path):
    """The site path that shows a repository file, or None if the site does not show it."""
    if repo_path in PAGES:
        return PAGES[repo_path]
    match = re.fullmatch(r"tutorials/(zh/)?(\d\d_\w+)\.py", repo_path)
    if match:
        return tutorial_page(match[2], "zh" if match[1] else "en")
    if repo_path.startswith("docs/"):
        return repo_path[len("docs/") :]
    if repo_path.startswith("tutorials/figures/"):  # the tutorials overview's thumbnails, copied as they are
        return repo_path
    return None


LINK = re.compile(r"(?P<bang>!?)\[(?P<text>[^\]]*)\]\((?P<target>[^)\s]+)(?P<title>\s+\"[^\"]*\")?\)")
IMG_SRC = re.compile(r'(<img\s[^>]*src=")([^"]+)(")')


def rewrite_links(markdown, repo_path, page_path, keep=None):
    """Point the relative links of ``repo_path``'s text, shown at ``page_path``, at site pages
    (links starting with ``keep``, files written beside the page, stay as they are)."""
    here = posixpath.dirname(repo_path)

    def resolve(target):
        if re.match(r"[a-z]+:|#|/", target) or (keep and target.startswith(keep)):
            return None, target  # a URL, an anchor on this page, or already absolute
        path, _, anchor = target.partition("#")
        repo_target = posixpath.normpath(posixpath.join(here, path))
        site = site_path(repo_target)
        if site is None:
            return repo_target, None
        link = posixpath.relpath(site, posixpath.dirname(page_path) or ".")
        return repo_target, link + (f"#{anchor}" if anchor else "")

    def link(match):
        repo_target, new = resolve(match["target"])
        if {repo_path, repo_target} == {"README.md", "README.zh-CN.md"}:
            # The other language's home: the site's language switch goes there, and MkDocs
            # checks no link between the two builds, so it is plain HTML.
            return f'<a href="{"zh/" if repo_target.endswith("zh-CN.md") else "../"}">{match["text"]}</a>'

        if new is not None:
            return f"{match['bang']}[{match['text']}]({new}{match['title'] or ''})"
        text = match["text"]  # a file the site does not show: its path, in code type
        return text if text.startswith("`") else f"{text} (`{repo_target}`)"

    def img(match):
        _, new = resolve(match[2])
        return f"{match[1]}{new or match[2]}{match[3]}"

    return IMG_SRC.sub(img, LINK.sub(link, markdown))


CJK = "\u3000-\u303f\u3400-\u9fff\uff00-\uffef"  # CJK punctuation, ideographs, full-width forms
CJK_BREAK = re.compile(rf"(?<=[{CJK}])\n(?=[{CJK}])")
FENCE = re.compile(r"^(```|````).*?^\1[ \t]*$", re.MULTILINE | re.DOTALL)


def join_cjk_lines(markdown):
    """Join prose lines broken between two Chinese characters: a browser shows such a line break
    as a space, which Chinese does not have. Code blocks are left as they are."""
    out, last = [], 0
    for block in FENCE.finditer(markdown):
        out += [CJK_BREAK.sub("", markdown[last : block.start()]), block.group(0)]
        last = block.end()
    return "".join(out) + CJK_BREAK.sub("", markdown[last:])


def write(relative, data):
    """Write a generated file into docs/, only if it changed (``mkdocs serve`` watches docs/)."""
    target = DOCS / relative
    if target.exists() and target.read_bytes() == data:
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    partial.write_bytes(data)
    partial.replace(target)


def rendered_tutorials(lang):
    """{stem: folder holding ``<stem>.md`` and ``<stem>/`` figures} for every tutorial of ``lang``."""
    given = os.environ.get("MINITENSOR_DOCS_TUTORIALS")
    if given:
        folder = pathlib.Path(given) / lang
        missing = [p.stem for p in tutorials(lang) if not (folder / f"{p.stem}.md").exists()]
        if missing:
            raise PluginError(f"MINITENSOR_DOCS_TUTORIALS={given}: no rendered {lang} page for {missing}")
        return {p.stem: folder for p in tutorials(lang)}
    smoke = smoke_mode()
    found = {}
    for path in tutorials(lang):
        key = hashlib.sha256()
        for part in (path, ROOT / "tutorials" / "_tutorial.py", RENDER):
            key.update(part.read_bytes())
        key.update(b"smoke" if smoke else b"full")
        folder = ROOT / ".cache" / "docs" / lang / f"{path.stem}-{key.hexdigest()[:12]}"
        if not (folder / f"{path.stem}.md").exists():
            for old in folder.parent.glob(f"{path.stem}-*"):  # an earlier version's run
                shutil.rmtree(old)
            log.info(f"running {path.relative_to(ROOT)} for its page ({'smoke' if smoke else 'full'} mode)")
            done = _render.run_in_subprocess(path, folder, smoke=smoke)
            if done.returncode != 0:
                raise PluginError(f"{path.relative_to(ROOT)} failed while rendering its page:\n{done.stderr[-3000:]}")
        found[path.stem] = folder
    return found


# MathJax, as the package lays it out: the combined component the pages load
# (mkdocs.yml's extra_javascript) and what it loads at run time from beside itself (fonts, TeX
# extensions on first use, the menu's accessibility and renderer options, the speech rules)
MATHJAX_PACKAGE = "mathjax"  # the import name of django-static-mathjax
MATHJAX_FILES = ("tex-mml-chtml.js", "input", "output", "a11y", "ui", "adaptors", "sre", "../LICENSE")
MATHJAX_DEST = "javascripts/mathjax"


def mathjax_folder():
    """MathJax's ``es5`` folder, as the docs extra installs it; else a one-line error saying so."""
    spec = importlib.util.find_spec(MATHJAX_PACKAGE)
    for location in spec.submodule_search_locations if spec else ():
        es5 = pathlib.Path(location, "static", "mathjax", "es5")
        if (es5 / MATHJAX_FILES[0]).is_file():
            return es5
    raise PluginError(
        'MathJax is not installed: pip install -e ".[docs]" (the django-static-mathjax package brings MathJax 3\'s '
        "files, which the site serves itself so that formulas need no network)"
    )


def on_config(config):
    """Before anything is built: MathJax is there (else the one-line error, not a site whose
    formulas would show as TeX)."""
    mathjax_folder()


def on_post_build(config):
    """Serve MathJax from the site itself (see the module docstring)."""
    es5, dest = mathjax_folder(), pathlib.Path(config["site_dir"], MATHJAX_DEST)
    for name in MATHJAX_FILES:
        source = (es5 / name).resolve()
        target = dest / source.name
        if source.is_dir():
            shutil.copytree(source, target, dirs_exist_ok=True)
        else:
            dest.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)


def on_page_markdown(markdown, page, config, files):
    """A page written by hand in ``docs/`` links to repository files by their path from
    ``docs/`` (``../bench/README.md``): point those links at the site's pages, as for the
    generated pages (which ``on_pre_build`` has already rewritten)."""
    source = page.file.src_uri
    if source in PAGES.values() or source.startswith(("tutorials/", "api/")):
        return markdown
    return rewrite_links(markdown, f"docs/{source}", source)


def on_pre_build(config):
    """Generate the pages before MkDocs looks for files, so they are pages like any other (and
    mkdocs-static-i18n sees each page's ``.zh.md`` twin)."""
    for repo_path, page in PAGES.items():
        if repo_path.endswith(".md") and not repo_path.startswith("docs/"):
            text = rewrite_links((ROOT / repo_path).read_text(encoding="utf-8"), repo_path, page)
            write(page, (join_cjk_lines(text) if page.endswith(".zh.md") else text).encode("utf-8"))
    smoke, written = smoke_mode(), set()
    for figure in sorted((ROOT / "tutorials" / "figures").glob("*.png")):  # the tutorials overview's thumbnails
        write(f"tutorials/figures/{figure.name}", figure.read_bytes())
        written.add(DOCS / "tutorials" / "figures" / figure.name)
    for lang in LANGS:
        for stem, folder in rendered_tutorials(lang).items():
            source = f"tutorials/{'zh/' if lang == 'zh' else ''}{stem}.py"
            page = tutorial_page(stem, lang)
            markdown = rewrite_links((folder / f"{stem}.md").read_text(encoding="utf-8"), source, page, keep=f"{stem}/")
            # Figures: <stem>/x.png beside the rendered page -> tutorials/<lang>/<stem>/x.png on the site.
            markdown = re.sub(rf"(!?\[[^\]]*\]\()({re.escape(stem)}/)", rf"\g<1>{lang}/\g<2>", markdown)
            for shown in sorted(set(re.findall(rf"\]\({lang}/({re.escape(stem)}/[^)\s]+)\)", markdown))):
                write(f"tutorials/{lang}/{shown}", (folder / shown).read_bytes())  # what the page shows
                written.add(DOCS / "tutorials" / lang / shown)
            note = (SMOKE_NOTE if smoke else FULL_NOTE)[lang].format(source=source)
            if lang == "zh":
                markdown = join_cjk_lines(markdown)
            title, _, body = markdown.partition("\n")  # the note goes under the tutorial's title
            write(page, (f"{title}\n\n{note}\n{body}" if title.startswith("# ") else f"{note}\n\n{markdown}").encode())
            written.add(DOCS / page)
    for stale in (DOCS / "tutorials").rglob("*"):  # pages and figures of an earlier build
        if stale.is_file() and stale not in written:
            stale.unlink()
