"""Every shell command of the two READMEs runs as written, or is checked as far as it can be
without installing packages or training at full size (documentation that cannot rot).

The commands are the lines of the ```bash blocks and the inline code spans that start with a
program (``pip``, ``python``, ``minitensor``, ``jupytext``, ...), each line cut at ``&&``.

- Every command is checked (quick tier): ``minitensor`` lines parse with the real command-line
  parser, ``pip install -e ".[x]"`` names extras that pyproject.toml declares, ``pytest -m``
  names registered markers, scripts and files exist, the font package is the one the Chinese
  tutorials' warning names, and every environment variable named alone is read by the code;
  ``minitensor info`` and ``minitensor plugins`` run.
- The commands that take seconds run verbatim (slow tier), each line once though both READMEs
  hold it, in a folder holding a copy of
  ``tutorials/`` and tiny runs at the paths the READMEs use (``runs/date``, ``runs/lm``):
  translate, explain, generate, resume, the tutorials (in smoke mode), jupytext, the virtual
  environment; a path the line's comment names (``runs/date/explain.html``,
  ``tutorial_figures/02_attention_pooling/``) must then exist. ``RUN_ELSEWHERE`` says why each
  of the others is not run here (full-size training, installing packages, the test suite
  itself), and where it is.
- The Chinese README is an edition of the English one: its two opening commands are the English
  README's, character for character, and every command of the English README is in it.
"""

import contextlib
import importlib.util
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from minitensor import cli

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
README_ZH = ROOT / "README.zh-CN.md"
READMES = (README, README_ZH)
PROGRAMS = {"pip", "python", "python3", "minitensor", "mkdocs", "jupytext", "sudo", "apt-get", "nvidia-smi", "."}
ASSIGNMENT = re.compile(r"[A-Z][A-Z0-9_]*=\S*")


def read(path):
    return path.read_text(encoding="utf-8")


def bash_blocks(text):
    return re.findall(r"^```bash\n(.*?)^```", text, flags=re.S | re.M)


def split_line(line):
    """A shell line -> its commands (token lists, cut at ``&&``) and its comment."""
    tokens = shlex.split(line, comments=True)
    commands, current = [], []
    for token in tokens:
        if token == "&&":
            commands.append(current)
            current = []
        else:
            current.append(token)
    commands.append(current)
    comment = line.split(" #", 1)[1].strip() if " #" in line else ""
    return [tuple(c) for c in commands if c], comment


def program(command):
    """The program a command runs (after its ``NAME=value`` assignments), or None."""
    words = [t for t in command if not ASSIGNMENT.fullmatch(t)]
    return words[0] if words else None


def lines(path):
    """The README's command lines, each once: (commands, comment, where), blocks first, then
    inline spans."""
    text = read(path)
    found = []
    for block in bash_blocks(text):
        for line in block.splitlines():
            commands, comment = split_line(line)
            if commands:
                found.append((commands, comment, "block"))
    prose = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    for span in re.findall(r"(?<!`)`([^`]+)`(?!`)", prose):
        span = " ".join(span.split())  # a span broken over two lines of the Markdown
        try:
            commands, _ = split_line(span)
        except ValueError:  # an unbalanced quote: not a command
            continue
        if len(span.split()) > 1 and all(program(c) in PROGRAMS for c in commands):  # one word: a name
            found.append((commands, "", "inline"))
    merged = {}  # a line written twice (in a block and in the prose) is one line, with both comments
    for commands, comment, where in found:
        if tuple(commands) in merged:
            before = merged[tuple(commands)]
            merged[tuple(commands)] = (commands, " ".join(filter(None, (before[1], comment))), before[2])
        else:
            merged[tuple(commands)] = (commands, comment, where)
    return list(merged.values())


def settings(path):
    """The environment variables a README names on their own (``MINITENSOR_TUTORIAL_SMOKE=1``)."""
    prose = re.sub(r"^```.*?^```", "", read(path), flags=re.S | re.M)
    return sorted({span.split("=")[0] for span in re.findall(r"`([A-Z][A-Z0-9_]*=[^`\s]*)`", prose)})


LINES = [(path, *line) for path in READMES for line in lines(path)]
IDS = [f"{path.name}:{' && '.join(shlex.join(c) for c in commands)}" for path, commands, _, _ in LINES]


def pyproject_list(section, key=None):
    """Extras (the keys of [project.optional-dependencies]) or the pytest markers, from pyproject.toml
    by pattern (tomllib is Python 3.11+)."""
    text = read(ROOT / "pyproject.toml")
    if section == "extras":
        body = re.search(r"^\[project\.optional-dependencies\]\n(.*?)^\[", text, flags=re.S | re.M).group(1)
        return set(re.findall(r"^([\w-]+) = \[", body, flags=re.M))
    body = re.search(r"^markers = \[\n(.*?)^\]", text, flags=re.S | re.M).group(1)
    return set(re.findall(r'^\s*"(\w+):', body, flags=re.M))


# Commands not run by tests/test_readme_commands.py, and where what they do is checked instead.
RUN_ELSEWHERE = {
    ("pip",): "installs packages: CI runs the README's pip lines (.ci/run)",
    ("python", "-m", "pytest"): "the test suite itself",
    ("python", "bench"): "a benchmark of minutes: bench/README.md's figures, tests/test_bench_*.py its smoke runs",
    ("minitensor", "train"): "trains at full size: tests/test_cli*.py train small runs, bench/README.md times these",
    ("minitensor", "demo"): "tests/test_cli.py runs the demo",
    ("mkdocs",): "tests/test_docs.py builds the site",
    ("apt-get",): "installs a system package: .ci/run installs a CJK font the same way",
}


def _after_sudo(command):
    return command[1:] if command[0] == "sudo" else command


def elsewhere(command):
    """Why ``command`` is not run here, or None if it is."""
    command = _after_sudo([t for t in command if not ASSIGNMENT.fullmatch(t)])
    if command[:2] == ["minitensor", "train"] and ("--resume" in command or "--help" in command):
        return None  # continues a tiny run, or prints the help: seconds
    if command[0] in ("python", "python3") and len(command) > 1 and command[1].startswith("bench/"):
        return RUN_ELSEWHERE["python", "bench"]
    for key, why in RUN_ELSEWHERE.items():
        if tuple(command[: len(key)]) == key:
            return why
    return None


def check(command, earlier):
    """The static checks of one command (see the module docstring); ``earlier``: the line's
    commands before it."""
    env = [t for t in command if ASSIGNMENT.fullmatch(t)]
    for assignment in env:
        assert_read_by_the_code(assignment.split("=")[0])
    words = _after_sudo([t for t in command if not ASSIGNMENT.fullmatch(t)])
    name, args = words[0], words[1:]
    if name == "pip":
        assert args[:2] == ["install", "-e"] and len(args) == 3, f"only `pip install -e .[extras]` expected: {words}"
        match = re.fullmatch(r"\.(?:\[([\w,-]+)\])?", args[2])
        assert match, f"pip installs this checkout (.), not {args[2]}"
        extras = set(match[1].split(",")) if match[1] else set()
        unknown = extras - pyproject_list("extras")
        assert not unknown, f"extras that pyproject.toml does not declare: {unknown}"
    elif name in ("python", "python3"):
        if args[:2] == ["-m", "pytest"]:
            if "-m" in args[2:]:
                expression = args[2:][args[2:].index("-m") + 1]
                markers = set(re.findall(r"\w+", expression)) - {"and", "or", "not"}
                assert markers <= pyproject_list("markers"), f"unregistered markers: {markers}"
        elif args[:2] == ["-m", "venv"]:
            assert len(args) == 3
        else:
            assert (ROOT / args[0]).is_file(), f"no script {args[0]}"
    elif name == ".":
        venvs = [c[-1] for c in earlier if list(c[1:3]) == ["-m", "venv"]]
        made = venvs and args[0] == f"{venvs[-1]}/bin/activate"
        assert made, f"`. {args[0]}` activates no environment made before it on its line"
    elif name == "minitensor":
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                cli.build_parser().parse_args(args)
        except SystemExit as exit:  # --help exits with 0 after printing
            assert exit.code == 0, f"`minitensor {shlex.join(args)}` does not parse (exit {exit.code})"
        for flag, value in zip(args, args[1:]):
            if flag in ("--text", "--plugin", "--data"):  # a file the command reads: the repository's
                assert (ROOT / value).exists(), f"{flag} {value}: no such file in the repository"
    elif name == "mkdocs":
        assert args[0] in ("serve", "build") and set(args[1:]) <= {"--strict"}, words
        assert (ROOT / "mkdocs.yml").is_file()
    elif name == "jupytext":
        assert args[:2] == ["--to", "notebook"] and len(args) == 3, words
        assert (ROOT / args[2]).is_file(), f"no tutorial {args[2]}"
    elif name == "apt-get":
        assert args[0] == "install", words
        code = "".join(read(f) for f in CODE)
        for package in args[1:]:
            assert f"apt-get install {package}" in code, f"{package}: not the package the no-font warning names"
    elif name == "nvidia-smi":
        assert not args
    else:
        raise AssertionError(f"a command this test does not know how to check: {words}; teach check()")


# where the code reads an environment variable or names the package of the no-font warning
CODE = [ROOT / "tutorials" / "_tutorial.py", *(ROOT / "minitensor").rglob("*.py"), *(ROOT / "docs/_hooks").glob("*.py")]


def assert_read_by_the_code(variable):
    assert any(variable in read(f) for f in CODE), f"{variable}: no code reads it"


_RAN = {}  # command -> its run, for the commands both READMEs hold


@pytest.mark.parametrize(("path", "commands", "comment", "where"), LINES, ids=IDS)
def test_every_readme_command_is_well_formed(path, commands, comment, where):
    for i, command in enumerate(commands):
        check(command, commands[:i])
        if command in (("minitensor", "info"), ("minitensor", "plugins")):
            if command not in _RAN:
                _RAN[command] = subprocess.run(
                    [sys.executable, "-m", *command], capture_output=True, text=True, timeout=120
                )
            done = _RAN[command]
            assert done.returncode == 0 and done.stdout.strip(), done.stderr


@pytest.mark.parametrize("path", READMES, ids=[p.name for p in READMES])
def test_every_setting_named_is_read_by_the_code(path):
    for variable in settings(path):
        assert_read_by_the_code(variable)


def test_the_commands_are_found():
    """The extraction still finds what the READMEs hold (a changed pattern would test nothing)."""
    for path in READMES:
        found = {program(c) for p, commands, _, _ in LINES if p == path for c in commands}
        assert {"pip", "python", "minitensor", "."} <= found, (path.name, found)
    zh = {program(c) for p, commands, _, _ in LINES if p == README_ZH for c in commands}
    assert {"jupytext", "sudo", "mkdocs"} <= zh, zh
    assert {"MINITENSOR_TUTORIAL_SMOKE", "MINITENSOR_TUTORIAL_OUT"} <= set(settings(README_ZH))


# -- the Chinese README is an edition of the English one ------------------------------------------
def test_the_two_opening_commands_are_the_english_readmes():
    english, chinese = bash_blocks(read(README))[:2], bash_blocks(read(README_ZH))[:2]
    assert english == [
        "pip install -e . && minitensor train\n",
        'pip install -e ".[test]" && python -m pytest -q -n auto\n',
    ]
    assert chinese == english


def test_every_english_command_is_in_the_chinese_readme():
    chinese = {c for p, commands, _, _ in LINES if p == README_ZH for c in commands}
    missing = [shlex.join(c) for p, commands, _, _ in LINES if p == README for c in commands if c not in chinese]
    assert not missing, f"README.zh-CN.md lacks these commands of README.md (or writes them otherwise): {missing}"


def test_every_english_bash_block_has_its_twin_in_the_chinese_readme():
    """The same commands, line by line (the comments are translated)."""

    def commands(block):
        return [split_line(line)[0] for line in block.splitlines() if split_line(line)[0]]

    chinese = [commands(b) for b in bash_blocks(read(README_ZH))]
    for block in bash_blocks(read(README)):
        assert commands(block) in chinese, f"README.zh-CN.md has no block with these commands:\n{block}"


# -- the ones that take seconds run, verbatim ------------------------------------------------------
TINY = ["--num-blks", "1", "--num-hiddens", "8", "--ffn-num-hiddens", "16", "--num-heads", "2", "--no-progress"]


def minitensor(*args, cwd):
    return subprocess.run(
        [sys.executable, "-m", "minitensor", *args], capture_output=True, text=True, cwd=cwd, timeout=300
    )


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    """A folder like a checkout where the READMEs' first runs have been made, tiny: runs/date (the
    date task) and runs/lm (a character LM on The Time Machine), and a copy of tutorials/."""
    home = tmp_path_factory.mktemp("readme_home")
    shutil.copytree(
        ROOT / "tutorials", home / "tutorials", ignore=shutil.ignore_patterns("figures", "__pycache__", "*.ipynb")
    )
    date = minitensor(
        "train", "--num-train", "64", "--num-heldout", "8", "--batch-size", "32", *TINY, "--epochs", "1", cwd=home
    )
    assert date.returncode == 0 and (home / "runs" / "date").is_dir(), date.stderr
    text = str(ROOT / "minitensor" / "data" / "texts" / "time_machine.txt")
    lm = minitensor("train", "--text", text, "--steps", "2", "--batch-size", "4", *TINY, "--out", "runs/lm", cwd=home)
    assert lm.returncode == 0, lm.stderr
    return home


def runnable():
    """The lines with a command that runs here, each once: the Chinese README holds every line of
    the English one (``test_every_english_command_is_in_the_chinese_readme``), and running it
    twice would test nothing more. A line's comments in both READMEs name the paths it writes."""
    merged = {}
    for path, commands, comment, _ in LINES:
        if any(elsewhere(c) is None for c in commands):
            paths, _, comments = merged.get(tuple(commands), ((), None, ""))
            merged[tuple(commands)] = (paths + (path.name,), commands, " ".join(filter(None, (comments, comment))))
    return list(merged.values())


RUNNABLE = runnable()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("paths", "commands", "comment"),
    RUNNABLE,
    ids=[f"{'+'.join(paths)}:{' && '.join(shlex.join(c) for c in commands)}" for paths, commands, _ in RUNNABLE],
)
def test_readme_command_runs(paths, commands, comment, home):
    for command in commands:
        if elsewhere(command) is not None:
            continue  # checked by test_every_readme_command_is_well_formed; run where RUN_ELSEWHERE says
        env = {**os.environ, "MPLBACKEND": "Agg", "MINITENSOR_TUTORIAL_SMOKE": "1"}  # tutorials: seconds
        env.pop("MINITENSOR_TUTORIAL_OUT", None)
        words = []
        for token in command:
            if ASSIGNMENT.fullmatch(token) and not words:
                name, value = token.split("=", 1)
                env[name] = value if name != "MINITENSOR_TUTORIAL_SMOKE" else "1"
            else:
                words.append(token)
        name = words[0]
        if name == "nvidia-smi" and shutil.which(name) is None:
            pytest.skip("no NVIDIA driver on this machine")
        if name == ".":
            assert (home / words[1]).is_file(), f"{words[1]} not made"
            continue
        if words[:2] == ["minitensor", "export"] and importlib.util.find_spec("onnx") is None:
            if os.environ.get("CI") == "true":  # .ci/run installs the onnx extra: the command must run
                pytest.fail('under CI=true every README command must run: pip install -e ".[onnx]"')
            pytest.skip('the onnx extra is not installed: pip install -e ".[onnx]"')
        if name == "jupytext":
            pytest.importorskip("jupytext")
            argv = [sys.executable, "-m", "jupytext", *words[1:]]
        elif name in ("python", "python3", "minitensor"):
            argv = [sys.executable, *(["-m", "minitensor"] if name == "minitensor" else []), *words[1:]]
        else:
            argv = words
        done = subprocess.run(argv, capture_output=True, text=True, cwd=home, env=env, timeout=300)
        assert done.returncode == 0, f"{shlex.join(command)} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
        if name == "jupytext":
            assert (home / words[-1]).with_suffix(".ipynb").is_file()
    for named in re.findall(r"(?:runs|tutorial_figures)/[\w./-]+", comment):
        target = home / named
        assert target.exists(), f"the comment names {named}, which the command did not write"
        if target.is_dir():
            assert any(target.rglob("*.png")), f"{named}: no figure in it"


@pytest.mark.parametrize("path", READMES, ids=[p.name for p in READMES])
def test_in_page_links_resolve_on_github_and_on_the_site(path):
    """tests/test_readme.py checks the links to files (and to their headings); this, the links to a
    heading of the README itself. A Chinese heading's anchor is its characters on GitHub but
    dropped by MkDocs's toc, so an in-page link must go to a heading written in ASCII."""
    text = re.sub(r"^```.*?^```", "", read(path), flags=re.S | re.M)
    headings = {
        re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-"): heading
        for heading in re.findall(r"^#{1,6} (.+)$", text, flags=re.M)
    }
    for anchor in re.findall(r"\]\(#([^)\s]+)\)", text):
        assert anchor in headings, f"{path.name}: #{anchor} is no heading of the file"
        assert headings[anchor].isascii(), f"{path.name}: #{anchor} goes to a non-ASCII heading (no anchor on the site)"
