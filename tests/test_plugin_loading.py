"""Loading a plugin for one run: ``load_plugin`` (a ``.py`` file or a module name, what
``--plugin`` calls), ``MINITENSOR_PLUGINS`` and ``MINITENSOR_DISABLE_PLUGINS``.

Plugin files are written into ``tmp_path`` under names no other test uses (``mt_test_...``,
removed from ``sys.modules`` afterwards by the ``fresh_plugins`` fixture, which also starts
every test with an empty plugin manager and no plugin switches set). Every error is checked
as the one line a user reads.
"""

import re
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
from test_plugins import SCORER_MODULE, fresh_plugins, make_distribution, run_python, unique  # noqa: F401

import minitensor as mt
from minitensor import plugins as mtp

REPO = Path(__file__).resolve().parents[1]
HOOKS = (
    "minitensor_decoders, minitensor_kv_caches, minitensor_poolings, minitensor_positional_encodings, "
    "minitensor_scorers"
)


def write_scorer(directory, scorer, stem=None, extra=""):
    """A plugin file ``<stem>.py`` in ``directory`` providing the scorer ``scorer``: its path."""
    stem = stem or unique("file")
    path = Path(directory) / f"{stem}.py"
    path.write_text(SCORER_MODULE.format(cls="FileScorer", name=scorer) + textwrap.dedent(extra))
    return path


def load_error(spec):
    """The message of the PluginError that load_plugin(spec) raises; it must be one line."""
    with pytest.raises(mtp.PluginError) as info:
        mtp.load_plugin(spec)
    message = str(info.value)
    assert "\n" not in message, message
    return message


def registered_names():
    return [name for name, _ in mtp.get_plugin_manager().list_name_plugin()]


# ---------------------------------------------------------------------------------------
# a file, a module, their sources, loading twice


def test_a_file_is_imported_as_the_module_named_after_it(tmp_path, monkeypatch):
    path = write_scorer(tmp_path, "file_scorer")
    monkeypatch.chdir(tmp_path)  # a relative path is relative to the current directory
    name = mtp.load_plugin(path.name)
    assert name == path.stem
    module = sys.modules[path.stem]  # importable again by its name: its classes can be found
    assert mtp.lookup("scorer", "file_scorer") is module.FileScorer
    row = next(row for row in mtp.describe() if row["name"] == "file_scorer")
    assert row["source"] == mtp.FILE_SOURCE + str(path) == f"file {path}"
    assert row["plugin"] == path.stem and row["class"] == f"{path.stem}.FileScorer"


def test_a_module_is_imported_by_name(tmp_path, monkeypatch):
    package = unique("pkg")
    (tmp_path / package).mkdir()
    (tmp_path / package / "__init__.py").write_text("")
    write_scorer(tmp_path / package, "module_scorer", stem="scorers")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert mtp.load_plugin(f"{package}.scorers") == f"{package}.scorers"
    row = next(row for row in mtp.describe() if row["name"] == "module_scorer")
    assert row["source"] == mtp.MODULE_SOURCE + f"{package}.scorers" == f"module {package}.scorers"


def test_loading_one_plugin_twice_registers_it_once_and_runs_it_once(tmp_path, monkeypatch):
    runs = tmp_path / "runs.txt"  # the file appends a line each time its code runs
    path = write_scorer(tmp_path, "twice", extra=f"open({str(runs)!r}, 'a').write('ran\\n')\n")
    monkeypatch.chdir(tmp_path)
    first = mtp.load_plugin(path.name)
    assert mtp.load_plugin(str(path)) == mtp.load_plugin(f"./{path.name}") == first
    monkeypatch.syspath_prepend(str(tmp_path))
    assert mtp.load_plugin(path.stem) == first  # by module name: the same module, still once
    assert registered_names().count(first) == 1
    assert next(r for r in mtp.describe() if r["name"] == "twice")["source"] == f"file {path}"  # the first wins
    mtp._reset()  # a new manager (a new run in the same process): registered again, not re-run
    assert mtp.load_plugin(path.name) == first and "twice" in mtp.scorers()
    assert runs.read_text() == "ran\n"


def test_the_documented_example_registers_itself_and_is_not_registered_twice(tmp_path, monkeypatch):
    """The in-process example of docs/attention.md (the README's plugin section links there), saved
    as a file, works with --plugin unchanged."""
    readme = (REPO / "docs" / "attention.md").read_text(encoding="utf-8")
    example = next(
        block
        for block in re.findall(r"```python\n(.*?)```", readme, re.S)
        if "mt.plugins.register(sys.modules[__name__])" in block
    )
    path = tmp_path / f"{unique('readme')}.py"
    path.write_text(example)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        name = mtp.load_plugin(str(path))
        assert mtp.load_plugin(str(path)) == name == path.stem
    assert registered_names().count(name) == 1
    row = next(row for row in mtp.describe() if row["name"] == "my_cosine")
    assert row["source"] == f"file {path}"  # not "registered at run time": it says where it came from
    assert mtp.lookup("scorer", "my_cosine") is sys.modules[path.stem].Cosine


def test_the_example_plugin_loads_from_its_file_and_refuses_unknown_options():
    path = REPO / "plugins" / "example-cosine" / "minitensor_cosine.py"
    mtp.load_plugin(str(path))
    assert next(r for r in mtp.describe() if r["name"] == "cosine_temperature")["source"] == f"file {path}"
    with pytest.raises(
        TypeError, match=r"CosineScorer: unknown option\(s\) 'sclae' \(did you mean 'scale'\?\); it takes scale, eps"
    ):
        mt.nn.Attention("cosine_temperature", "softmax", 0.0, query_size=4, key_size=4, scorer_options={"sclae": 10.0})


# ---------------------------------------------------------------------------------------
# every error, as the one line it prints


def test_a_missing_file_or_something_else_than_a_py_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert load_error("my_scorer.py") == f"plugin file 'my_scorer.py' not found (looked for {tmp_path}/my_scorer.py)"
    assert load_error(str(tmp_path / "gone.py")) == f"plugin file '{tmp_path}/gone.py' not found"
    (tmp_path / "notes.txt").write_text("")
    assert load_error("./notes.txt") == "plugin './notes.txt' is not a .py file"
    (tmp_path / "folder").mkdir()
    assert load_error("folder/") == (
        "plugin 'folder/' is not a .py file (it is a folder; a package is given by its module name)"
    )
    assert load_error("  ") == "load_plugin: no plugin given; give the path of a .py file or a module name"


def test_an_error_while_importing_a_file_names_the_file_and_the_line(tmp_path):
    path = tmp_path / f"{unique('raises')}.py"
    path.write_text("import minitensor\n\nratio = 1 / 0\n")
    assert load_error(str(path)) == f"plugin file {path}: line 3: ZeroDivisionError: division by zero"
    assert path.stem not in sys.modules  # as after a failed import
    # raised inside minitensor, called from the file: the file's line is the one to show
    path.write_text("import minitensor as mt\nmt.plugins.check_options(int, {'widht': 1})\n")
    assert load_error(str(path)) == (
        f"plugin file {path}: line 2: TypeError: int: unknown option(s) 'widht'; it takes no options"
    )
    path.write_text("x = 1\ndef broken(:\n    pass\n")
    assert re.fullmatch(rf"plugin file {re.escape(str(path))}: line 2: SyntaxError: \S.*", load_error(str(path)))


def test_a_file_that_registers_itself_and_then_fails_leaves_nothing_behind(tmp_path):
    path = write_scorer(
        tmp_path,
        "half",
        extra="""
        import sys
        mt.plugins.register(sys.modules[__name__])
        raise RuntimeError("a\\nmessage on two lines")
    """,
    )
    line = path.read_text().splitlines().index('raise RuntimeError("a\\nmessage on two lines")') + 1
    assert load_error(str(path)) == f"plugin file {path}: line {line}: RuntimeError: a; message on two lines"
    assert path.stem not in sys.modules and path.stem not in registered_names()
    assert "half" not in mtp.scorers()


def test_a_module_that_is_not_importable_or_fails_to_import(tmp_path, monkeypatch):
    missing = unique("missing")
    assert load_error(missing) == (
        f"plugin module {missing!r} is not importable (No module named {missing!r}): "
        "is it installed? is the current directory on sys.path?"
    )
    write_scorer(tmp_path, "here", stem=missing)  # a file of that name here, the folder not on sys.path
    monkeypatch.chdir(tmp_path)
    assert load_error(missing).endswith(f"on sys.path?; to load the file {missing}.py, give its path: ./{missing}.py")

    monkeypatch.syspath_prepend(str(tmp_path))
    broken, needs = unique("broken"), unique("needs")
    (tmp_path / f"{broken}.py").write_text("import minitensor\nraise ValueError('boom')\n")
    (tmp_path / f"{needs}.py").write_text("import mt_test_no_such_dependency\n")
    assert load_error(broken) == (
        f"plugin module {broken} failed to import: {tmp_path}/{broken}.py, line 2: ValueError: boom"
    )
    # a dependency the module imports is missing: that is not "the module is not importable"
    assert load_error(needs) == (
        f"plugin module {needs} failed to import: {tmp_path}/{needs}.py, line 1: "
        "ModuleNotFoundError: No module named 'mt_test_no_such_dependency'"
    )


def test_a_module_without_hooks(tmp_path):
    path = tmp_path / f"{unique('nohooks')}.py"
    path.write_text("def minitensor_scorers():\n    return {}\n")
    assert load_error(str(path)) == (
        f"plugin file {path} defines no @hookimpl function; the hooks are {HOOKS}; "
        "minitensor_scorers is there but not decorated with @minitensor.hookimpl"
    )
    path = tmp_path / f"{unique('empty')}.py"
    path.write_text("")
    assert load_error(str(path)) == (
        f"plugin file {path} defines no @hookimpl function; the hooks are {HOOKS} "
        "(decorate them with @minitensor.hookimpl)"
    )


def test_what_register_refuses_is_refused_in_one_line_and_nothing_stays(tmp_path):
    path = write_scorer(tmp_path, "dot")  # a name the built-ins have
    assert load_error(str(path)) == (
        f"two plugins claim the scorer name 'dot': 'minitensor_plugins.scorers' "
        f"(built-in) and {path.stem!r} (file {path}); unregister or rename one"
    )
    assert path.stem not in registered_names()
    assert mtp.lookup("scorer", "dot").__module__ == "minitensor_plugins.scorers"

    path = tmp_path / f"{unique('typo')}.py"
    path.write_text("from minitensor import hookimpl\n@hookimpl\ndef minitensor_scorer():\n    return {}\n")
    assert "did you mean 'minitensor_scorers'?" in load_error(str(path))

    path = tmp_path / f"{unique('params')}.py"
    path.write_text("from minitensor import hookimpl\n@hookimpl\ndef minitensor_scorers(config):\n    return {}\n")
    message = load_error(str(path))  # pluggy's own message spans lines: joined into one
    assert "config" in message and message.endswith("(their parameters, if any, are in minitensor/core/hookspecs.py)")


def test_a_file_whose_module_name_is_taken_by_another_module(tmp_path):
    (tmp_path / "json.py").write_text("")
    import json

    assert load_error(str(tmp_path / "json.py")) == (
        f"plugin file {tmp_path}/json.py: its module name 'json' is already taken by {json.__file__}; rename the file"
    )
    assert sys.modules["json"] is json


# ---------------------------------------------------------------------------------------
# MINITENSOR_PLUGINS


def test_minitensor_plugins_loads_files_and_modules_at_the_first_look_up(tmp_path, monkeypatch):
    first, second = write_scorer(tmp_path, "env_file"), write_scorer(tmp_path, "env_module")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("MINITENSOR_PLUGINS", f" {first}, ,{second.stem},")  # empty items are ignored
    sources = {row["name"]: row["source"] for row in mtp.describe()}
    assert sources["env_file"] == f"file {first}" and sources["env_module"] == f"module {second.stem}"
    assert sources["dot"] == "built-in"
    assert mtp.load_plugin(str(first)) == first.stem  # named again (--plugin): registered once
    assert registered_names().count(first.stem) == 1


def test_a_failure_in_minitensor_plugins_is_an_error_naming_the_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("MINITENSOR_PLUGINS", f"{tmp_path}/typo.py")
    with pytest.raises(mtp.PluginError) as info:
        mtp.scorers()
    assert str(info.value) == f"MINITENSOR_PLUGINS: plugin file '{tmp_path}/typo.py' not found"
    assert mtp._pm is None  # no half-loaded manager: fixing the variable is enough
    monkeypatch.setenv("MINITENSOR_PLUGINS", "")
    assert "dot" in mtp.scorers()


def test_minitensor_plugins_in_a_fresh_python_and_in_the_cli(tmp_path):
    path = write_scorer(tmp_path, "subprocess_scorer")
    env = {"MINITENSOR_PLUGINS": str(path)}
    code = "import minitensor as mt; print(mt.plugins.lookup('scorer', 'subprocess_scorer').__module__)"
    out = run_python(["-c", code], env=env, cwd=REPO)
    assert out.returncode == 0 and out.stdout.strip() == path.stem, out.stderr
    out = run_python(["-m", "minitensor", "plugins"], env=env, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert any(line.split() == ["subprocess_scorer", "scorer", "file", str(path)] for line in out.stdout.splitlines())


# ---------------------------------------------------------------------------------------
# MINITENSOR_DISABLE_PLUGINS


@pytest.fixture
def loud_and_good(tmp_path, monkeypatch):
    """Entry points "loud" (its import writes a marker file, then raises) and "good"."""
    loud, good = unique("loud"), unique("good")
    marker = tmp_path / "imported"
    make_distribution(
        tmp_path / "site",
        "loud-plugin",
        {"loud": loud},
        {loud: f"open({str(marker)!r}, 'w').close()\nraise ImportError('loud plugin imported')\n"},
    )
    make_distribution(
        tmp_path / "site",
        "good-plugin",
        {"good": good},
        {good: SCORER_MODULE.format(cls="GoodScorer", name="good_scorer")},
    )
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    mtp._reset()
    return marker


def test_a_disabled_entry_point_is_never_imported(loud_and_good, monkeypatch):
    monkeypatch.setenv("MINITENSOR_DISABLE_PLUGINS", "loud,")
    monkeypatch.setenv("MINITENSOR_STRICT_PLUGINS", "1")  # a loaded "loud" would be an error now
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert "good_scorer" in mtp.scorers()
    assert not loud_and_good.exists()
    assert not any(name.startswith("loud ") for name in registered_names())


def test_disabling_a_name_that_matches_no_entry_point_warns_listing_them(loud_and_good, monkeypatch):
    monkeypatch.setenv("MINITENSOR_DISABLE_PLUGINS", "loud, goood")
    with pytest.warns(RuntimeWarning) as record:
        assert "good_scorer" in mtp.scorers()  # the typo disables nothing
    assert len(record) == 1
    message = str(record[0].message)
    assert message.startswith(
        "minitensor: MINITENSOR_DISABLE_PLUGINS names no entry point 'goood'; the entry "
        "points in the group 'minitensor' are: "
    )
    assert "good (good-plugin 1.0)" in message and "loud (loud-plugin 1.0)" in message  # among any installed
    assert not loud_and_good.exists()


def test_a_distribution_declaring_the_group_minitensor_plugins_is_named_not_skipped_silently(tmp_path, monkeypatch):
    """The contract page once said "a minitensor.plugins entry point"; the loader reads the group
    "minitensor". A distribution that followed the page is warned about (strict: refused)."""
    module = unique("misgrouped")
    make_distribution(tmp_path / "site", "misgrouped-plugin", {}, {module: SCORER_MODULE.format(cls="M", name="m")})
    info = tmp_path / "site" / "misgrouped_plugin-1.0.dist-info"
    (info / "entry_points.txt").write_text(f"[minitensor.plugins]\nmisgrouped = {module}\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    mtp._reset()
    with pytest.warns(RuntimeWarning) as record:
        assert "m" not in mtp.scorers()
    message = next(str(r.message) for r in record if "misgrouped" in str(r.message))
    assert "misgrouped-plugin 1.0 declares the entry point 'misgrouped' in the group 'minitensor.plugins'" in message
    assert "[project.entry-points.minitensor]" in message and "\n" not in message
    monkeypatch.setenv("MINITENSOR_STRICT_PLUGINS", "1")
    mtp._reset()
    with pytest.raises(mtp.PluginError, match="in the group 'minitensor.plugins'"):
        mtp.scorers()
