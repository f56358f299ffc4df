"""Run one tutorial, cell by cell, and write it as a Markdown page with its outputs and figures.

    python docs/_hooks/render_tutorial.py tutorials/zh/01_attention_cues.py OUT

runs the tutorial the way ``python tutorials/zh/01_attention_cues.py`` would (same folder on
``sys.path``, same ``__name__``, its figures under ``OUT`` through ``MINITENSOR_TUTORIAL_OUT``)
and prints what it prints. On the way it notes, for every code cell, what the cell printed and
which figures it wrote, and at the end it writes ``OUT/<name>.md``: the markdown cells as they
are, each code cell as a Python block followed by its output and its figures. So one run of a
tutorial is both the test (tests/test_tutorials.py) and the page of the documentation site
(docs/_hooks/pages.py), and no tutorial runs twice to be documented.

A tutorial is a jupytext "percent" script: ``# %% [markdown]`` opens a prose cell (every line a
comment), ``# %%`` a code cell. The cells run in one namespace, as the script would; a cell's
code is compiled at its own line numbers, so a traceback points into the tutorial file.
"""

import contextlib
import io
import os
import pathlib
import re
import subprocess
import sys
import traceback
import types

MARKER = re.compile(r"^# %%(?P<markdown>\s*\[markdown\])?")
FIGURES = (".png", ".svg", ".jpg")


def cells(path):
    """[(kind, first_line, source)]: ``kind`` is "markdown" or "code", lines counted from 1."""
    found, kind, start, lines = [], None, 0, []
    for number, line in enumerate(pathlib.Path(path).read_text(encoding="utf-8").splitlines(), 1):
        match = MARKER.match(line)
        if match:
            if kind:
                found.append((kind, start, lines))
            kind, start, lines = ("markdown" if match["markdown"] else "code"), number + 1, []
        elif kind:
            lines.append(line)
    if kind:
        found.append((kind, start, lines))
    out = []
    for kind, start, lines in found:
        if kind == "markdown":  # "# text" -> "text", "#" -> ""
            lines = [re.sub(r"^#( |$)", "", line) for line in lines]
        out.append((kind, start, "\n".join(lines).strip("\n")))
    return out


class Tee(io.TextIOBase):
    """Writes to the real stdout and keeps a copy: the reader of the test log sees everything."""

    def __init__(self, stream):
        self.stream, self.copy = stream, io.StringIO()

    def write(self, text):
        self.copy.write(text)
        return self.stream.write(text)

    def flush(self):
        self.stream.flush()


def snapshot(folder):
    return {p: p.stat().st_mtime_ns for p in folder.rglob("*") if p.is_file()} if folder.exists() else {}


def run(path, out):
    """Execute the tutorial at ``path`` with figures under ``out``; return [(kind, source, printed, files)]."""
    path, out = pathlib.Path(path).resolve(), pathlib.Path(out).resolve()
    os.environ["MINITENSOR_TUTORIAL_OUT"] = str(out)
    sys.path[0] = str(path.parent)  # as `python tutorial.py` sets it (not this script's folder)
    sys.argv = [str(path)]
    # The cells run in a module that *is* __main__ and whose file is the tutorial, so that
    # inspect.getsource, pickle and dataclasses find what the tutorial defines.
    main = types.ModuleType("__main__")
    main.__file__ = str(path)
    sys.modules["__main__"] = main
    namespace = main.__dict__
    figures = out / path.stem
    done = []
    for kind, start, source in cells(path):
        if kind == "markdown":
            done.append((kind, source, "", []))
            continue
        before = snapshot(figures)
        tee = Tee(sys.stdout)
        with contextlib.redirect_stdout(tee):
            code = compile("\n" * (start - 1) + source + "\n", str(path), "exec")
            exec(code, namespace)
        after = snapshot(figures)
        written = sorted(p for p, stamp in after.items() if before.get(p) != stamp)
        done.append((kind, source, tee.copy.getvalue(), written))
    return done


def page(done, out):
    """The Markdown page of a run: prose, code, ``text`` output blocks and figures (paths relative to ``out``)."""
    parts = []
    for kind, source, printed, written in done:
        if kind == "markdown":
            parts.append(source)
            continue
        if source.strip():
            parts.append(f"```python\n{source}\n```")
        if printed.strip():
            fence = "````" if "```" in printed else "```"
            parts.append(f"{fence}text\n{printed.rstrip()}\n{fence}")
        for file in written:
            relative = file.relative_to(out).as_posix()
            if file.suffix in FIGURES:
                parts.append(f"![{file.stem.replace('_', ' ')}]({relative})")
            elif file.suffix == ".html":  # a page the tutorial wrote (mt.viz): a link to open it
                parts.append(f"[{file.name}]({relative})")
            # anything else it wrote (a checkpoint, a run's JSON) is no part of the page
    return "\n\n".join(parts) + "\n"


def run_in_subprocess(path, out, smoke=True, timeout=None):
    """Run the tutorial at ``path`` as this script, in a fresh Python (so that no tutorial sees
    another's state), writing its page and figures into ``out``; smoke mode unless
    ``smoke=False``. Returns the ``subprocess.CompletedProcess`` (its stdout is the tutorial's).
    What the test suite and the documentation site both call."""
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, MINITENSOR_TUTORIAL_SMOKE="1" if smoke else "0", MPLBACKEND="Agg")
    return subprocess.run(
        [sys.executable, str(pathlib.Path(__file__).resolve()), str(path), str(out)],
        cwd=out,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: render_tutorial.py TUTORIAL.py OUT_FOLDER", file=sys.stderr)
        return 2
    path, out = pathlib.Path(argv[0]).resolve(), pathlib.Path(argv[1]).resolve()
    out.mkdir(parents=True, exist_ok=True)
    try:
        done = run(path, out)
    except Exception:
        traceback.print_exc()
        return 1
    target = out / f"{path.stem}.md"
    partial = target.with_suffix(".md.partial")  # no half-written page if this process dies
    partial.write_text(page(done, out), encoding="utf-8")
    partial.replace(target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
