"""The plugin manager: built-ins, real entry points, run-time registration, and its errors.

Third-party plugins are made for real here: a module file and a ``<name>-1.0.dist-info``
folder (METADATA + entry_points.txt) in a temporary directory put on ``sys.path``, which is
all ``importlib.metadata`` needs to report an installed distribution. ``mt.plugins._reset()``
then makes the manager load everything again, through the same code a user's install takes.
"""

import json
import os
import subprocess
import sys
import textwrap
import types
import uuid
import warnings
from pathlib import Path

import numpy as np
import pytest

import minitensor as mt
from minitensor import cli
from minitensor import plugins as mtp

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "plugins" / "example-cosine"

# A scorer plugin module: score(q, k) = -|q - k|_1 would do, but a dot product keeps the
# module short; what matters is that it is found, listed and usable by name.
SCORER_MODULE = '''
import minitensor as mt
from minitensor import hookimpl

class {cls}(mt.nn.Module):
    """score(q, k) = <q, k> / (|q| |k|)"""
    def __init__(self, query_size, key_size, **options):
        super().__init__()
        self.options = options
    def forward(self, queries, keys):
        q = queries / (queries * queries).sum(axis=-1, keepdims=True).sqrt()
        k = keys / (keys * keys).sum(axis=-1, keepdims=True).sqrt()
        return q @ k.swapaxes(-1, -2)

@hookimpl
def minitensor_scorers():
    return {{{name!r}: {cls}}}
'''


@pytest.fixture(autouse=True)
def fresh_plugins(monkeypatch):
    """Every test starts and ends with an empty, not yet loaded, plugin manager and no
    plugin switches set, so no test sees another's plugins."""
    for switch in (
        "MINITENSOR_STRICT_PLUGINS",
        "MINITENSOR_DISABLE_PLUGIN_AUTOLOAD",
        "MINITENSOR_PLUGINS",
        "MINITENSOR_DISABLE_PLUGINS",
    ):
        monkeypatch.delenv(switch, raising=False)
    before = set(sys.modules)
    mtp._reset()
    yield
    mtp._reset()
    for name in set(sys.modules) - before:  # the temporary plugin modules
        if name.startswith("mt_test_"):
            del sys.modules[name]


def make_distribution(directory, dist_name, entry_points, modules, version="1.0"):
    """Write an "installed" distribution into ``directory``: module files plus the
    ``.dist-info`` folder that importlib.metadata reads. Returns the directory."""
    directory.mkdir(parents=True, exist_ok=True)
    for module_name, source in modules.items():
        (directory / f"{module_name}.py").write_text(textwrap.dedent(source))
    info = directory / f"{dist_name.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist_name}\nVersion: {version}\n")
    lines = "".join(f"{ep_name} = {target}\n" for ep_name, target in entry_points.items())
    (info / "entry_points.txt").write_text(f"[minitensor]\n{lines}")
    return directory


def unique(prefix):
    """A module name no other test (or earlier import) has used."""
    return f"mt_test_{prefix}_{uuid.uuid4().hex[:8]}"


@pytest.fixture
def cosine_dist(tmp_path, monkeypatch):
    """A third-party distribution "minitensor-cosine-test 1.0" providing scorer "cosine_test"."""
    module = unique("cosine")
    make_distribution(
        tmp_path / "site",
        "minitensor-cosine-test",
        {"cosine_test": module},
        {module: SCORER_MODULE.format(cls="CosineTest", name="cosine_test")},
    )
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    mtp._reset()
    return types.SimpleNamespace(module=module, path=tmp_path / "site")


def run_python(code, extra_path=(), env=None, cwd=None):
    """Run ``python *code`` in a fresh interpreter with ``extra_path`` in front of PYTHONPATH."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("MINITENSOR_")}
    environment.update(env or {})
    environment["PYTHONPATH"] = os.pathsep.join([*map(str, extra_path), environment.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, *code], capture_output=True, text=True, env=environment, cwd=cwd, timeout=120
    )


def scorer_module(hooks_source):
    """A plugin built in memory, for run-time registration."""
    module = types.ModuleType(unique("runtime"))
    exec(textwrap.dedent(hooks_source), module.__dict__)
    return module


# ---------------------------------------------------------------------------------------
# built-ins, the marker and lazy loading


def test_hookimpl_is_one_marker():
    assert mt.hookimpl is mtp.hookimpl
    assert mtp.hookimpl.project_name == "minitensor"


def test_builtins_are_plugins_listed_as_built_in():
    pm = mtp.get_plugin_manager()
    for module_name in mtp.DEFAULT_PLUGINS:
        assert pm.has_plugin(module_name)
        assert pm.get_plugin(module_name) is sys.modules[module_name]
    assert {"dot", "scaled_dot"} <= set(mtp.scorers())
    assert "softmax" in mtp.poolings()
    assert "none" in mtp.positional_encodings()
    rows = mtp.describe()
    assert all(row["source"] == "built-in" for row in rows if row["plugin"] in mtp.DEFAULT_PLUGINS)
    assert {"name": "dot", "kind": "scorer", "source": "built-in"}.items() <= next(
        row for row in rows if row["name"] == "dot"
    ).items()


def test_builtins_are_importable_as_minitensor_plugins_not_plugins():
    import minitensor_plugins

    assert Path(minitensor_plugins.__file__).parent.name == "minitensor_plugins"
    assert all(name.startswith("minitensor_plugins.") for name in mtp.DEFAULT_PLUGINS)
    assert "plugins" not in sys.modules  # never a bare top-level "plugins"


def test_import_minitensor_loads_no_plugin_machinery():
    out = run_python(
        [
            "-c",
            "import minitensor, sys; "
            "assert 'pluggy' not in sys.modules, 'pluggy imported'; "
            "assert 'minitensor_plugins' not in sys.modules, 'plugins imported'; "
            "assert 'minitensor.plugins' not in sys.modules, 'manager imported'",
        ]
    )
    assert out.returncode == 0, out.stderr


def test_plugins_load_at_the_first_registry_lookup_not_before():
    code = textwrap.dedent("""
        import sys
        import minitensor as mt
        mt.hookimpl, mt.plugins               # the marker and the module: no loading yet
        assert mt.plugins._pm is None
        assert 'minitensor_plugins' not in sys.modules
        assert 'dot' in mt.plugins.scorers()  # the first look-up loads everything
        assert mt.plugins._pm is not None
        assert 'minitensor_plugins.scorers' in sys.modules
        print('ok')
    """)
    out = run_python(["-c", code])
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_reset_forgets_the_manager():
    first = mtp.get_plugin_manager()
    assert mtp.get_plugin_manager() is first  # loaded once
    mtp._reset()
    assert mtp._pm is None
    assert mtp.get_plugin_manager() is not first


# ---------------------------------------------------------------------------------------
# a third-party plugin found through a real entry point


def test_entry_point_plugin_is_loaded_listed_and_usable(cosine_dist):
    assert cosine_dist.module not in sys.modules  # nothing imported it yet ...
    cls = mtp.lookup("scorer", "cosine_test")  # ... the first look-up loads the entry point
    module = sys.modules[cosine_dist.module]
    assert cls is module.CosineTest

    pm = mtp.get_plugin_manager()
    assert pm.get_plugin("cosine_test (minitensor-cosine-test 1.0)") is module
    assert "cosine_test" in mtp.scorers() and "dot" in mtp.scorers()  # the built-ins stay

    row = next(row for row in mtp.describe() if row["name"] == "cosine_test")
    assert row["kind"] == "scorer"
    assert row["source"] == "minitensor-cosine-test 1.0"
    assert row["class"] == f"{cosine_dist.module}.CosineTest"

    # usable by name: the class follows the scorer contract
    q, k = np.random.default_rng(0).normal(size=(2, 3, 4)), np.random.default_rng(1).normal(size=(2, 5, 4))
    scores = cls(4, 4)(mt.tensor(q), mt.tensor(k)).numpy()
    cos = np.einsum("bqd,bkd->bqk", q, k) / np.linalg.norm(q, axis=-1)[..., None] / np.linalg.norm(k, axis=-1)[:, None]
    np.testing.assert_allclose(scores, cos, rtol=1e-5, atol=1e-6)


def test_entry_point_plugin_is_listed_by_the_cli(cosine_dist, capsys):
    assert cli.main(["plugins"]) == 0
    lines = capsys.readouterr().out.splitlines()
    line = next(line for line in lines if line.split()[0] == "cosine_test")
    assert line.split() == ["cosine_test", "scorer", "minitensor-cosine-test", "1.0"]

    assert cli.main(["plugins", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {"name": "cosine_test", "kind": "scorer", "source": "minitensor-cosine-test 1.0"}.items() <= next(
        row for row in rows if row["name"] == "cosine_test"
    ).items()


def test_entry_point_plugin_is_listed_by_a_fresh_process(cosine_dist, tmp_path):
    # a new interpreter, as a user would run it: `python -m minitensor plugins`
    out = run_python(["-m", "minitensor", "plugins"], extra_path=[cosine_dist.path], cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert any(
        line.split() == ["cosine_test", "scorer", "minitensor-cosine-test", "1.0"] for line in out.stdout.splitlines()
    ), out.stdout


def test_entry_point_plugin_in_attention_layers(cosine_dist):
    """A third-party scorer works in the layers by name, like a built-in (once they exist)."""
    if not hasattr(mt.nn, "Attention") and not hasattr(mt.nn, "MultiHeadAttention"):
        pytest.skip("mt.nn.Attention / MultiHeadAttention are not written yet")
    mt.manual_seed(0)
    if hasattr(mt.nn, "Attention"):
        attn = mt.nn.Attention("cosine_test", "softmax", 0.0, query_size=4, key_size=4)
        q, k, v = mt.randn(2, 3, 4), mt.randn(2, 5, 4), mt.randn(2, 5, 6)
        assert attn(q, k, v).shape == (2, 3, 6)
        scorer_cls = sys.modules[cosine_dist.module].CosineTest
        assert any(isinstance(m, scorer_cls) for m in attn.modules())
    if hasattr(mt.nn, "MultiHeadAttention"):
        mha = mt.nn.MultiHeadAttention(8, 2, 0.0, scorer="cosine_test")
        x = mt.randn(2, 3, 8)
        assert mha(x, x, x).shape == (2, 3, 8)
        assert mha.attention_weights.shape == (2, 2, 3, 3)
        np.testing.assert_allclose(mha.attention_weights.numpy().sum(-1), 1.0, rtol=1e-5)


# ---------------------------------------------------------------------------------------
# failures while loading entry points


@pytest.fixture
def broken_and_good(tmp_path, monkeypatch):
    """Two distributions: "broken-plugin" raises on import, "good-plugin" is fine."""
    bad, good = unique("broken"), unique("good")
    make_distribution(
        tmp_path / "site",
        "broken-plugin",
        {"broken_ep": bad},
        {bad: "raise ImportError('this plugin needs a package that is missing')"},
    )
    make_distribution(
        tmp_path / "site",
        "good-plugin",
        {"good_ep": good},
        {good: SCORER_MODULE.format(cls="GoodScorer", name="good_scorer")},
    )
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    mtp._reset()
    return types.SimpleNamespace(bad=bad, good=good)


def test_a_plugin_that_fails_to_import_warns_and_the_rest_keeps_working(broken_and_good):
    with pytest.warns(RuntimeWarning, match=r"plugin 'broken_ep' .*broken-plugin 1\.0.*missing") as record:
        names = mtp.scorers()
    assert len(record) == 1 and "continuing without it" in str(record[0].message)
    assert "good_scorer" in names and "dot" in names
    assert not any(row["source"].startswith("broken-plugin") for row in mtp.describe())


def test_strict_mode_makes_a_failing_plugin_an_error(broken_and_good, monkeypatch):
    monkeypatch.setenv("MINITENSOR_STRICT_PLUGINS", "1")
    with pytest.raises(mtp.PluginError, match=r"'broken_ep'.*broken-plugin 1\.0.*MINITENSOR_STRICT_PLUGINS") as info:
        mtp.scorers()
    assert isinstance(info.value.__cause__, ImportError)
    assert mtp._pm is None  # no half-loaded manager is kept
    monkeypatch.delenv("MINITENSOR_STRICT_PLUGINS")
    with pytest.warns(RuntimeWarning, match="broken_ep"):
        assert "good_scorer" in mtp.scorers()  # without the switch: the lenient behaviour again


def test_cli_reports_a_strict_failure_without_a_traceback(broken_and_good, monkeypatch, capsys):
    monkeypatch.setenv("MINITENSOR_STRICT_PLUGINS", "1")
    assert cli.main(["plugins"]) == 2  # a plugin that fails to load is for the user to fix: exit 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("minitensor plugins: error: ") and "broken_ep" in captured.err


def test_disabling_autoload_skips_third_party_plugins_but_not_builtins(broken_and_good, monkeypatch):
    monkeypatch.setenv("MINITENSOR_DISABLE_PLUGIN_AUTOLOAD", "1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the broken plugin is not even imported
        names = mtp.scorers()
    assert "good_scorer" not in names
    assert {"dot", "scaled_dot"} <= set(names) and "softmax" in mtp.poolings()
    assert broken_and_good.good not in sys.modules and broken_and_good.bad not in sys.modules
    for off in ("0", "", "false"):  # only a true value switches autoload off
        monkeypatch.setenv("MINITENSOR_DISABLE_PLUGIN_AUTOLOAD", off)
        mtp._reset()
        with pytest.warns(RuntimeWarning, match="broken_ep"):
            assert "good_scorer" in mtp.scorers()


def test_an_entry_point_plugin_with_a_misspelled_hook_is_skipped_with_a_warning(tmp_path, monkeypatch):
    module = unique("typo")
    source = "from minitensor import hookimpl\n@hookimpl\ndef minitensor_scorer():\n    return {}\n"
    make_distribution(tmp_path, "typo-plugin", {"typo_ep": module}, {module: source})
    monkeypatch.syspath_prepend(str(tmp_path))
    mtp._reset()
    with pytest.warns(
        RuntimeWarning, match=r"typo_ep.*unknown hook 'minitensor_scorer'.*did you mean 'minitensor_scorers'"
    ):
        assert "dot" in mtp.scorers()
    assert not any(name.startswith("typo_ep") for name, _ in mtp.get_plugin_manager().list_name_plugin())


def test_an_entry_point_plugin_claiming_a_taken_name_is_skipped_naming_both(tmp_path, monkeypatch):
    module = unique("clash")
    make_distribution(
        tmp_path,
        "clash-plugin",
        {"clash_ep": module},
        {module: SCORER_MODULE.format(cls="MyDot", name="dot")},
        version="2.3",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    mtp._reset()
    with pytest.warns(RuntimeWarning, match=r"'dot'.*minitensor_plugins\.scorers.*built-in.*clash-plugin 2\.3"):
        cls = mtp.lookup("scorer", "dot")
    assert cls.__module__ == "minitensor_plugins.scorers"  # the built-in is untouched
    monkeypatch.setenv("MINITENSOR_STRICT_PLUGINS", "1")
    mtp._reset()
    with pytest.raises(mtp.PluginError, match=r"two plugins claim the scorer name 'dot'"):
        mtp.scorers()


# ---------------------------------------------------------------------------------------
# run-time registration


def test_a_misspelled_hook_is_an_error_at_registration():
    plugin = scorer_module("""
        from minitensor import hookimpl
        @hookimpl
        def minitensor_scorer():          # missing "s": matches no hook
            return {}
    """)
    with pytest.raises(mtp.PluginError, match=r"unknown hook 'minitensor_scorer'.*did you mean 'minitensor_scorers'"):
        mtp.register(plugin)
    assert not mtp.get_plugin_manager().is_registered(plugin)
    mtp.get_plugin_manager().check_pending()  # and the manager is clean again


def test_a_hook_with_parameters_is_an_error_at_registration():
    plugin = scorer_module("""
        from minitensor import hookimpl
        @hookimpl
        def minitensor_scorers(config):   # the hook has no parameters
            return {}
    """)
    with pytest.raises(mtp.PluginError, match=r"config"):
        mtp.register(plugin)
    assert not mtp.get_plugin_manager().is_registered(plugin)


def test_a_hook_parameter_with_a_default_is_an_error_at_registration():
    """pluggy would accept it and never pass the parameter (the default would win forever)."""

    class Defaulted:
        @mtp.hookimpl
        def minitensor_scorers(self, temperature=0.1):
            return {"defaulted": object}

    with pytest.raises(
        mtp.PluginError,
        match=r"'Defaulted': minitensor_scorers\(\) gives its parameter\(s\) "
        r"temperature a default value",
    ):
        mtp.register(Defaulted())
    assert "defaulted" not in mtp.scorers()
    assert not mtp.get_plugin_manager().has_plugin("Defaulted")


def test_an_object_plugin_is_named_after_its_class():
    class Named:
        @mtp.hookimpl
        def minitensor_scorers(self):
            return {}

    plugin = Named()
    assert mtp.register(plugin) == "Named"
    mtp.unregister(plugin)


def test_a_duplicate_name_names_both_sources_and_registers_nothing():
    plugin = scorer_module("""
        from minitensor import hookimpl
        class MyDot: pass
        class Fresh: pass
        @hookimpl
        def minitensor_scorers():
            return {"fresh": Fresh, "dot": MyDot}
    """)
    with pytest.raises(mtp.PluginError) as info:
        mtp.register(plugin, name="my-dots")
    message = str(info.value)
    assert "'dot'" in message
    assert "'minitensor_plugins.scorers' (built-in)" in message
    assert "'my-dots' (registered at run time)" in message
    assert not mtp.get_plugin_manager().has_plugin("my-dots")
    assert "fresh" not in mtp.scorers()  # nothing of it stays, not even its other names
    assert mtp.lookup("scorer", "dot").__module__ == "minitensor_plugins.scorers"


def test_registering_one_plugin_twice_is_an_error():
    plugin = scorer_module(SCORER_MODULE.format(cls="Twice", name="twice"))
    mtp.register(plugin)
    with pytest.raises(mtp.PluginError, match="already registered"):
        mtp.register(plugin)
    assert "twice" in mtp.scorers()


def test_a_hook_returning_no_dict_or_raising_is_named():
    plugin = scorer_module("""
        from minitensor import hookimpl
        @hookimpl
        def minitensor_poolings():
            return ["softmax2"]
    """)
    with pytest.raises(mtp.PluginError, match=r"minitensor_poolings\(\) of plugin 'listy'.*returned list"):
        mtp.register(plugin, name="listy")
    plugin = scorer_module("""
        from minitensor import hookimpl
        @hookimpl
        def minitensor_poolings():
            raise ZeroDivisionError("oops")
    """)
    with pytest.raises(mtp.PluginError, match=r"plugin 'raising'.*ZeroDivisionError: oops"):
        mtp.register(plugin, name="raising")
    assert set(mtp.poolings()) >= {"softmax"}


def test_register_and_unregister_invalidate_the_registry_cache():
    assert "runtime_scorer" not in mtp.scorers()  # the registry is built (and cached) now
    plugin = scorer_module(SCORER_MODULE.format(cls="RunTime", name="runtime_scorer"))
    name = mtp.register(plugin)
    assert name == plugin.__name__
    assert mtp.lookup("scorer", "runtime_scorer") is plugin.RunTime
    assert next(r for r in mtp.describe() if r["name"] == "runtime_scorer")["source"] == "registered at run time"
    assert mtp.unregister(plugin) is plugin
    assert "runtime_scorer" not in mtp.scorers()
    with pytest.raises(mtp.UnknownPluginError):
        mtp.lookup("scorer", "runtime_scorer")
    mtp.register(plugin, name="again")  # and by name
    assert "runtime_scorer" in mtp.scorers()
    mtp.unregister(name="again")
    assert "runtime_scorer" not in mtp.scorers()
    with pytest.raises(ValueError, match="no plugin"):
        mtp.unregister(plugin)


def test_a_builtin_can_be_replaced():
    builtin = sys.modules["minitensor_plugins.scorers"]
    mtp.unregister(builtin)
    assert "dot" not in mtp.scorers()
    plugin = scorer_module(SCORER_MODULE.format(cls="MyDot", name="dot"))
    mtp.register(plugin)
    assert mtp.lookup("scorer", "dot") is plugin.MyDot
    mtp._reset()
    assert mtp.lookup("scorer", "dot") is builtin.DotProduct


# ---------------------------------------------------------------------------------------
# look-up errors


def test_an_unknown_name_lists_the_available_names_and_a_close_match():
    with pytest.raises(mtp.UnknownPluginError) as info:
        mtp.lookup("scorer", "scaled_dott")
    message = str(info.value)
    assert "unknown scorer 'scaled_dott'" in message
    assert "did you mean 'scaled_dot'?" in message
    assert all(name in message for name in mtp.scorers())
    assert isinstance(info.value, KeyError)  # a registry miss, like dict[name]

    with pytest.raises(mtp.UnknownPluginError, match=r"did you mean 'softmax'"):
        mtp.lookup("pooling", "softmx")
    with pytest.raises(mtp.UnknownPluginError) as info:
        mtp.lookup("pooling", "qqqqqq")
    assert "did you mean" not in str(info.value) and "softmax" in str(info.value)


def test_an_unknown_kind_is_a_clear_error_and_aliases_work():
    with pytest.raises(ValueError, match=r"unknown plugin kind 'scorrer'.*'scorer'.*'pooling'.*'positional encoding'"):
        mtp.lookup("scorrer", "dot")
    assert mtp.lookup("scorers", "dot") is mtp.lookup("scorer", "dot")
    assert mtp.lookup("positional", "none") is mtp.lookup("positional encoding", "none")


# ---------------------------------------------------------------------------------------
# the example third-party plugin (plugins/example-cosine), registered at run time


def test_the_example_cosine_plugin(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLE))
    import minitensor_cosine

    mtp.register(minitensor_cosine)
    try:
        cls = mtp.lookup("scorer", "cosine_temperature")
        assert cls is minitensor_cosine.CosineScorer
        rng = np.random.default_rng(0)
        q, k = rng.normal(size=(3, 4)), rng.normal(size=(5, 4))
        q[0] = 0.0  # a zero query scores 0, not NaN
        scores = cls(4, 4, scale=3.0)(mt.tensor(q), mt.tensor(k)).numpy()
        norms = np.maximum(np.linalg.norm(q, axis=-1, keepdims=True), 1e-8) * np.linalg.norm(k, axis=-1)
        np.testing.assert_allclose(scores, 3.0 * (q @ k.T) / norms, rtol=1e-5, atol=1e-6)
        with pytest.raises(ValueError, match="one length"):
            cls(4, 5)
        x = mt.randn(2, 3, 4, dtype=mt.float64, requires_grad=True)
        y = mt.randn(2, 5, 4, dtype=mt.float64, requires_grad=True)
        assert mt.gradcheck(lambda a, b: cls(4, 4)(a, b), [x, y])
    finally:
        mtp.unregister(minitensor_cosine)


# ---------------------------------------------------------------------------------------
# the command line


def test_cli_plugins_prints_an_aligned_table(capsys):
    assert cli.main(["plugins"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header, rows = lines[0], lines[1:]
    assert header.split() == ["NAME", "KIND", "SOURCE"]
    kind_at, source_at = header.index("KIND"), header.index("SOURCE")
    described = mtp.describe()
    assert len(rows) == len(described)
    for line, row in zip(rows, described):  # every cell starts under its title
        assert line[:kind_at].rstrip() == row["name"]
        kind = row["kind"] + (f" ({row['applies_to']})" if "applies_to" in row else "")
        if row["kind"] == "decoder":  # a processor of scores or a search: "decoder (search)"
            kind += f" ({mtp.decoders()[row['name']].kind})"
        assert line[kind_at:source_at].rstrip() == kind
        assert line[source_at:] == row["source"]
    # every kind has built-ins
    assert {"scorer", "pooling", "positional encoding", "kv cache", "decoder"} <= {row["kind"] for row in described}
    # where each positional encoding acts is shown with its kind
    assert {row.get("applies_to") for row in described if row["kind"] == "positional encoding"} == {
        "inputs",
        "qk",
        "scores",
    }
    assert any("positional encoding (scores)" in line for line in rows)


def test_cli_plugins_json_and_verbose(capsys):
    assert cli.main(["plugins", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == mtp.describe()
    assert cli.main(["plugins", "--verbose"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["NAME", "KIND", "SOURCE", "CLASS"]
    assert "minitensor_plugins.scorers.DotProduct" in out


def test_python_dash_m_minitensor_plugins(tmp_path):
    out = run_python(["-m", "minitensor", "plugins", "--json"], cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert {"dot", "scaled_dot", "softmax", "none"} <= {row["name"] for row in rows}
    assert {row["source"] for row in rows if row["plugin"] in mtp.DEFAULT_PLUGINS} == {"built-in"}
