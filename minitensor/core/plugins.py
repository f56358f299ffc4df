"""Plugins: the plugin manager and the registries of scorers, poolings and positional encodings.

An attention layer is three exchangeable parts (D2L's attention pooling, split up):

    scores  = scorer(queries, keys)                  a(q, k_i), any real number
    weights = pooling(scores, valid_lens, mask)      alpha(q, k_i) >= 0, summing to 1
    output  = dropout(weights) @ values              sum_i alpha(q, k_i) v_i

Scorers, poolings and positional encodings are looked up *by name* in registries filled by
plugins, so a class a user registers works everywhere a built-in does. A plugin is a module
(or object) with ``@hookimpl`` functions named after the hooks in ``minitensor/core/hookspecs.py``.

Where plugins come from, in loading order (at the first registry look-up, never at
``import minitensor``, so that importing the engine stays fast and a broken plugin cannot
stop it from importing):

1. the built-ins, the modules named in ``DEFAULT_PLUGINS``, registered with ``pm.register``
   exactly as a user's plugin is (they ignore the switches below: without them nothing works);
2. third-party distributions that declare an entry point in the group ``"minitensor"``,
   loaded one at a time: one that fails to import, misspells a hook or claims a name another
   plugin already has is reported with a warning naming it, and the rest keeps working.
   ``MINITENSOR_DISABLE_PLUGIN_AUTOLOAD=1`` skips them all; ``MINITENSOR_DISABLE_PLUGINS=name,...``
   skips the entry points with those names (the name left of ``=`` in the distribution's
   ``[project.entry-points.minitensor]`` table) without importing them, and warns about a name
   that matches none; ``MINITENSOR_STRICT_PLUGINS=1`` turns a failure into a ``PluginError``
   (for plugin authors, who want to see it fail);
3. ``MINITENSOR_PLUGINS=path_or_module,...``: plugin files and modules for every process
   started with it set (``minitensor train``, ``python``, a notebook kernel), loaded with
   ``load_plugin()`` in the order given. These are explicit requests, so one that fails is a
   ``PluginError`` naming the variable, never a warning;
4. at run time: ``load_plugin("my_scorer.py")`` / ``load_plugin("my_pkg.scorers")`` (which
   the command line's ``--plugin PATH_OR_MODULE`` calls, before anything else), and
   ``register(obj)`` / ``unregister(obj)``; each rebuilds the registries.

``load_plugin`` is for a plugin that is not packaged yet: a ``.py`` file is imported as a
module named after the file (``my_scorer.py`` -> ``my_scorer``, put in ``sys.modules`` so its
classes can be found again, e.g. by a checkpoint) and registered with the source
``"file /absolute/path/my_scorer.py"``; a module name is imported as ``import`` would and
registered with the source ``"module my_pkg.scorers"``. Loading one file or module twice
registers it once, and a file that registers itself while it is imported (the example of
docs/attention.md ends with ``mt.plugins.register(sys.modules[__name__])``) is not registered again.

``pm.check_pending()`` runs after loading: it rejects a hook implementation whose name matches
no hook (``minitensor_scorer`` for ``minitensor_scorers``), so a typo is an error, not silence.

The registries map names to classes. A name claimed twice is an error naming both sources;
an unknown name lists the available ones and the closest match.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import inspect
import os
import re
import sys
import traceback
import warnings
from collections.abc import Sequence
from importlib.metadata import entry_points
from types import ModuleType
from typing import Any

import pluggy

from . import hookspecs

__all__ = [
    "BUILT_IN",
    "DEFAULT_PLUGINS",
    "ENTRY_POINT_GROUP",
    "FILE_SOURCE",
    "KINDS",
    "MODULE_SOURCE",
    "PluginError",
    "RUN_TIME",
    "UnknownPluginError",
    "check_options",
    "decoders",
    "describe",
    "get_plugin_manager",
    "hookimpl",
    "kv_caches",
    "load_plugin",
    "lookup",
    "poolings",
    "positional_encodings",
    "register",
    "scorers",
    "unregister",
]

hookimpl = pluggy.HookimplMarker("minitensor")
"""The decorator that marks a plugin's hook implementations (also ``minitensor.hookimpl``).

A function decorated with ``@hookimpl`` and named after a hook in ``minitensor/core/hookspecs.py``
(``minitensor_scorers``, ``minitensor_poolings``, ``minitensor_positional_encodings``)
answers that hook; its plugin returns ``{name: class}``::

    @minitensor.hookimpl
    def minitensor_scorers():
        return {"my_cosine": Cosine}
"""

ENTRY_POINT_GROUP = "minitensor"
"""The entry-point group a distribution declares its plugins in:
``[project.entry-points.minitensor]`` in its ``pyproject.toml``."""

DEFAULT_PLUGINS = (
    "minitensor_plugins.scorers",
    "minitensor_plugins.poolings",
    "minitensor_plugins.positional",
    "minitensor_plugins.score_biases",
    "minitensor_plugins.kv_caches",
    "minitensor_plugins.decoders",
)
"""The modules of the built-in plugins, registered first, in this order, exactly as a user's
plugin is (the autoload switches do not apply to them)."""

BUILT_IN = "built-in"
"""The source ``describe()`` gives a built-in plugin (one of ``DEFAULT_PLUGINS``)."""

RUN_TIME = "registered at run time"
"""The source ``describe()`` gives a plugin passed to ``register()``."""

FILE_SOURCE = "file "
"""Prefix of the source of a plugin ``load_plugin()`` imported from a ``.py`` file:
``FILE_SOURCE + "/absolute/path/my_scorer.py"``."""

MODULE_SOURCE = "module "
"""Prefix of the source of a plugin ``load_plugin()`` imported by module name:
``MODULE_SOURCE + "my_pkg.scorers"``."""

KINDS = {
    "scorer": "minitensor_scorers",
    "pooling": "minitensor_poolings",
    "positional encoding": "minitensor_positional_encodings",
    "kv cache": "minitensor_kv_caches",
    "decoder": "minitensor_decoders",
}
"""The plugin kinds, each with the hook that fills its registry: ``{kind: hook name}``.
``lookup()`` also accepts the hook names, the plurals and underscores for a kind."""
# other spellings lookup() accepts for a kind (the hook names, plurals, underscores)
_KIND_ALIASES = {
    "scorers": "scorer",
    "minitensor_scorers": "scorer",
    "poolings": "pooling",
    "minitensor_poolings": "pooling",
    "positional": "positional encoding",
    "positional_encoding": "positional encoding",
    "positional encodings": "positional encoding",
    "positional_encodings": "positional encoding",
    "minitensor_positional_encodings": "positional encoding",
    "kv caches": "kv cache",
    "kv_cache": "kv cache",
    "kv_caches": "kv cache",
    "cache": "kv cache",
    "minitensor_kv_caches": "kv cache",
    "decoders": "decoder",
    "minitensor_decoders": "decoder",
}


class PluginError(RuntimeError):
    """A plugin could not be loaded or registered, or two plugins claim one name."""


class UnknownPluginError(KeyError):
    """No plugin of that kind has that name: raised by ``lookup`` (and so by every layer built
    with an unknown scorer, pooling or positional encoding). A ``KeyError`` whose message lists
    the available names and the closest match."""

    def __str__(self) -> str:  # KeyError would print the message in quotes
        return self.args[0]


_pm: pluggy.PluginManager | None = None
_sources: dict[str, str] = {}  # plugin name in the manager -> where it came from ("built-in", "dist 1.0", ...)
# kind -> ({name: class}, {name: (plugin name, source)}); empty = rebuild
_registries: dict[str, tuple[dict[str, type], dict[str, tuple[str, str]]]] = {}


def get_plugin_manager() -> pluggy.PluginManager:
    """The pluggy PluginManager, loading the plugins on first use."""
    global _pm
    if _pm is None:
        pm = pluggy.PluginManager("minitensor")
        pm.add_hookspecs(hookspecs)
        for module_name in DEFAULT_PLUGINS:
            # A built-in that fails to import is a broken installation: let the error through.
            pm.register(importlib.import_module(module_name), name=module_name)
            _sources[module_name] = BUILT_IN
        _check(pm)  # the built-ins must be clean before anyone else is measured against them
        if not _env_flag("MINITENSOR_DISABLE_PLUGIN_AUTOLOAD"):
            _load_entry_points(pm)
        pm.check_pending()
        # Published before step 3, because a plugin file may call register() while it is
        # imported (docs/attention.md's example does) and must find this manager, not start another.
        _pm = pm
        try:
            for spec in _env_list("MINITENSOR_PLUGINS"):
                try:
                    load_plugin(spec)
                except PluginError as e:
                    raise PluginError(f"MINITENSOR_PLUGINS: {e}") from e
        except BaseException:
            _reset()  # no half-loaded manager is kept: the next look-up tries again
            raise
    return _pm


def check_options(cls: type, options: dict[str, Any], accepted: Sequence[str] = ()) -> None:
    """For plugin authors: refuse options the plugin does not know, by name.

    ``Attention(..., scorer_options={"widht": 0.5})`` must not silently train with the
    default width. Call it in ``__init__`` with the leftover ``**options``::

        def __init__(self, query_size, key_size, **options):
            minitensor.plugins.check_options(type(self), options)
    """
    if options:
        accepted = list(accepted) or _named_options(cls)
        takes = ", ".join(accepted) if accepted else "no options"
        close = [m for key in sorted(options) for m in difflib.get_close_matches(str(key), accepted, n=1)]
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise TypeError(
            f"{cls.__name__}: unknown option(s) {', '.join(map(repr, sorted(options)))}{hint}; it takes {takes}"
        )


# Constructor parameters every plugin of a kind has (the contract's, and what the layers pass):
# not options a user chooses.
_CONTRACT_PARAMETERS = {
    "self",
    "query_size",
    "key_size",
    "num_hiddens",
    "num_heads",
    "max_len",
    "dropout",
    "dtype",
    "device",
}


def _named_options(cls: type[Any]) -> list[str]:  # type[Any]: mypy then reads cls.__init__
    """The options ``cls.__init__`` names, besides the contract's parameters."""
    try:
        parameters = inspect.signature(cls.__init__).parameters.values()
    except (TypeError, ValueError):
        return []
    return [
        p.name
        for p in parameters
        if p.name not in _CONTRACT_PARAMETERS and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    ]


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no", "off")


def _env_list(name: str) -> list[str]:
    """The comma-separated items of an environment variable, stripped; empty items are ignored."""
    return [item.strip() for item in os.environ.get(name, "").split(",") if item.strip()]


def _load_entry_points(pm: pluggy.PluginManager) -> None:
    """Register the entry points of group "minitensor" one at a time (see the module doc)."""
    strict = _env_flag("MINITENSOR_STRICT_PLUGINS")
    disabled = set(_env_list("MINITENSOR_DISABLE_PLUGINS"))
    found = {}  # entry-point name -> its source, for the warning about a disabled name that matches none
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        dist = getattr(ep, "dist", None)
        source = f"{dist.metadata['Name']} {dist.version}" if dist is not None else f"entry point {ep.value}"
        found[ep.name] = source
        name = f"{ep.name} ({source})"
        # checked before ep.load(): a disabled plugin is never imported, so a broken one cannot hurt
        if ep.name in disabled or pm.has_plugin(name) or pm.is_blocked(name):
            continue
        _sources[name] = source
        try:
            pm.register(ep.load(), name=name)
            _check(pm)  # a typo or a clash is this plugin's fault: drop it, keep the others
        except Exception as e:  # a broken plugin must not take minitensor down with it
            if pm.has_plugin(name):
                pm.unregister(name=name)
            _sources.pop(name, None)
            message = (
                f"minitensor: plugin {ep.name!r} ({ep.value}) from {source} failed to load: {type(e).__name__}: {e}"
            )
            if strict:
                raise PluginError(message + " (MINITENSOR_STRICT_PLUGINS is set)") from e
            warnings.warn(message + "; continuing without it", RuntimeWarning, stacklevel=2)
    _warn_of_misnamed_groups()
    unknown = sorted(disabled - found.keys())
    if unknown:  # a typo must not leave the plugin it meant quietly enabled
        there = ", ".join(f"{ep_name} ({source})" for ep_name, source in sorted(found.items())) or "(none)"
        warnings.warn(
            f"minitensor: MINITENSOR_DISABLE_PLUGINS names no entry point {', '.join(map(repr, unknown))}; "
            f"the entry points in the group {ENTRY_POINT_GROUP!r} are: {there}",
            RuntimeWarning,
            stacklevel=2,
        )


# Groups a plugin's author may write for ENTRY_POINT_GROUP (the contract page once said
# "minitensor.plugins"): their entry points are never loaded, so they are named, not skipped silently.
MISNAMED_GROUPS = ("minitensor.plugins", "minitensor_plugins")


def _warn_of_misnamed_groups() -> None:
    """Warn about (or, strict, refuse) entry points declared in a group minitensor does not read."""
    for group in MISNAMED_GROUPS:
        for ep in entry_points(group=group):
            dist = getattr(ep, "dist", None)
            source = f"{dist.metadata['Name']} {dist.version}" if dist is not None else f"entry point {ep.value}"
            message = (
                f"minitensor: {source} declares the entry point {ep.name!r} in the group {group!r}, which "
                f"minitensor does not read: declare it in [project.entry-points.{ENTRY_POINT_GROUP}]"
            )
            if _env_flag("MINITENSOR_STRICT_PLUGINS"):
                raise PluginError(message + " (MINITENSOR_STRICT_PLUGINS is set)")
            warnings.warn(message + "; it is not loaded", RuntimeWarning, stacklevel=3)


def _check(pm: pluggy.PluginManager) -> None:
    """Raise PluginError unless every hook is known, no hook implementation gives its
    parameters defaults, and every name is claimed once."""
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as e:
        raise PluginError(_explain_validation_error(e)) from e
    _check_no_defaults(pm)
    _collect(pm)


def _hook_names() -> list[str]:
    return sorted(name for name in vars(hookspecs) if name.startswith("minitensor_"))


def _one_line(message: object) -> str:
    """A message on one line (pluggy's and some exceptions' span several)."""
    return "; ".join(line.strip() for line in str(message).splitlines() if line.strip())


def _check_no_defaults(pm: pluggy.PluginManager) -> None:
    """pluggy passes an implementation only the parameters without defaults; one with a
    default is silently never given the caller's value. Refuse it instead."""
    for hook_name in _hook_names():
        for impl in getattr(pm.hook, hook_name).get_hookimpls():
            if impl.kwargnames:
                raise PluginError(
                    f"plugin {impl.plugin_name!r}: {hook_name}() gives its parameter(s) "
                    f"{', '.join(impl.kwargnames)} a default value; pluggy would never pass them (hooks are "
                    f"called with keyword arguments, and only the parameters without defaults are filled). "
                    f"Remove the defaults; the hook's parameters are in minitensor/core/hookspecs.py"
                )


def _explain_validation_error(error: Exception) -> str:
    """pluggy's message, plus the hook the author probably meant."""
    message = _one_line(error)
    hooks = _hook_names()
    unknown = re.search(r"unknown hook '([^']+)'", message)
    close = difflib.get_close_matches(unknown.group(1), hooks, n=1) if unknown else []
    if close:
        return f"{message}; did you mean {close[0]!r}? The hooks are: {', '.join(hooks)}"
    return (
        f"{message}; the hooks are: {', '.join(hooks)} (their parameters, if any, are in minitensor/core/hookspecs.py)"
    )


def register(plugin: object, name: str | None = None) -> str:
    """Register a plugin (a module, class or object with ``@hookimpl`` functions) now.

    Returns the name it is registered under. Its names join the registries at once; a
    misspelled hook or a name another plugin already has is a ``PluginError``, and then
    nothing stays registered. (``load_plugin`` imports a file or module and registers it.)
    """
    pm = get_plugin_manager()
    # a readable default: the module's or class's name, or the class of an object (pluggy's
    # own default for an object is its id(), which error messages would then show)
    name = name or getattr(plugin, "__name__", None) or type(plugin).__name__
    return _register(pm, plugin, name, RUN_TIME, "register")


def _register(pm: pluggy.PluginManager, plugin: object, name: str, source: str, what: str) -> str:
    """Register ``plugin`` as ``name`` from ``source``; ``what`` starts the error messages."""
    other = pm.get_name(plugin)  # not None: registered already, under that name
    if other is not None:
        raise PluginError(f"{what}: plugin {other!r} ({_describe_source(other)}) is already registered")
    if pm.has_plugin(name):
        raise PluginError(
            f"{what}: the plugin name {name!r} is already registered, for another plugin ({_describe_source(name)})"
        )
    _sources[name] = source
    try:
        # pluggy checks the hook signatures while registering and can fail half-way through,
        # so the clean-up below runs for errors from register() as well as from _check().
        if pm.register(plugin, name=name) is None:
            raise PluginError(f"{what}: the plugin name {name!r} is blocked")
        _check(pm)
    except Exception as e:
        if pm.has_plugin(name):
            pm.unregister(name=name)
        _sources.pop(name, None)
        _registries.clear()
        if isinstance(e, pluggy.PluginValidationError):
            raise PluginError(_explain_validation_error(e)) from e
        raise
    _registries.clear()  # rebuilt at the next look-up, with this plugin's names
    return name


def load_plugin(spec: str | os.PathLike[str]) -> str:
    """Import a plugin file or module and register it; returns its name in the plugin manager.

    ``spec`` is the path of a ``.py`` file (absolute, or relative to the current directory;
    anything that contains a path separator, ends in ``.py`` or is no valid module name is a
    path) or the name of an importable module (``"my_pkg.scorers"``). This is what ``--plugin`` and
    ``MINITENSOR_PLUGINS`` do, so a plugin can be tried before it is packaged::

        minitensor train --plugin my_scorer.py --scorer my_cosine

    A file is imported as the module named after it (``my_scorer``) and registered with the
    source ``FILE_SOURCE + absolute path``; a module with ``MODULE_SOURCE + its name``. The
    same file or module loaded again (or one that registered itself while being imported)
    is registered once. Every failure is a one-line ``PluginError``: no such file, not a
    ``.py`` file, an error while importing (with its file and line), a module that cannot be
    imported, a module without any ``@hookimpl`` function, and what ``register`` refuses.
    """
    pm = get_plugin_manager()  # first: MINITENSOR_PLUGINS may load this very file already
    spec = os.fspath(spec).strip()
    if not spec:
        raise PluginError("load_plugin: no plugin given; give the path of a .py file or a module name")
    is_path = (
        spec.endswith(".py")
        or "/" in spec
        or os.sep in spec
        or (os.altsep and os.altsep in spec)
        or not all(part.isidentifier() for part in spec.split("."))
    )
    module, source = _import_file(pm, spec) if is_path else _import_module(pm, spec)
    name = pm.get_name(module)
    if name is not None:  # loaded before, or it registered itself while it was imported
        if _sources.get(name) == RUN_TIME:
            _sources[name] = source  # say where it came from (a checkpoint records it)
            _registries.clear()
        return name
    if not any(pm.parse_hookimpl_opts(module, attribute) is not None for attribute in dir(module)):
        undecorated = [hook for hook in _hook_names() if callable(getattr(module, hook, None))]
        hint = (
            f"; {', '.join(undecorated)} is there but not decorated with @minitensor.hookimpl"
            if undecorated
            else " (decorate them with @minitensor.hookimpl)"
        )
        raise PluginError(
            f"plugin {source} defines no @hookimpl function; the hooks are {', '.join(_hook_names())}{hint}"
        )
    return _register(pm, module, module.__name__, source, f"plugin {source}")


def _import_file(pm: pluggy.PluginManager, spec: str) -> tuple[ModuleType, str]:
    """Import the plugin file ``spec`` as a module named after it: (module, source)."""
    path = os.path.abspath(os.path.expanduser(spec))
    if not os.path.exists(path):
        looked = f" (looked for {path})" if path != spec else ""
        raise PluginError(f"plugin file {spec!r} not found{looked}")
    if os.path.isdir(path) or not path.endswith(".py"):
        kind = " (it is a folder; a package is given by its module name)" if os.path.isdir(path) else ""
        raise PluginError(f"plugin {spec!r} is not a .py file{kind}")
    source = FILE_SOURCE + path
    # my-scorer.py -> my_scorer: a module name its classes can carry (cls.__module__)
    name = re.sub(r"\W", "_", os.path.basename(path)[:-3])
    name = "_" + name if not name or name[0].isdigit() else name
    existing = sys.modules.get(name)
    if existing is not None:
        other = getattr(existing, "__file__", None)
        if other and os.path.exists(other) and os.path.samefile(other, path):
            return existing, source  # imported before (by load_plugin or by an import): not run twice
        raise PluginError(
            f"plugin {source}: its module name {name!r} is already taken by "
            f"{other or 'a built-in module'}; rename the file"
        )
    module_spec = importlib.util.spec_from_file_location(name, path)
    assert module_spec is not None and module_spec.loader is not None  # a .py file always has a loader
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module  # before it runs: a file that registers itself looks itself up here
    try:
        module_spec.loader.exec_module(module)
    except Exception as e:
        _forget(pm, name, module)
        raise PluginError(f"plugin {source}: {_raised_at(e, path)}: {type(e).__name__}: {_message(e)}") from e
    return module, source


def _import_module(pm: pluggy.PluginManager, spec: str) -> tuple[ModuleType, str]:
    """Import the plugin module named ``spec``: (module, source)."""
    source = MODULE_SOURCE + spec
    error: Exception
    try:
        return importlib.import_module(spec), source
    except ModuleNotFoundError as e:
        if e.name is not None and (spec == e.name or spec.startswith(e.name + ".")):  # not a missing dependency
            candidate = spec.replace(".", "/") + ".py"
            there = f"; to load the file {candidate}, give its path: ./{candidate}" if os.path.isfile(candidate) else ""
            raise PluginError(
                f"plugin module {spec!r} is not importable ({e}): is it installed? is the current "
                f"directory on sys.path?{there}"
            ) from e
        error = e
    except Exception as e:
        error = e
    _forget(pm, spec, sys.modules.get(spec))
    raise PluginError(
        f"plugin {source} failed to import: {_raised_at(error, None)}: {type(error).__name__}: {_message(error)}"
    ) from error


def _forget(pm: pluggy.PluginManager, name: str, module: ModuleType | None) -> None:
    """Undo a failed import: the module leaves sys.modules (as with ``import``) and the
    manager, if it registered itself before it failed."""
    if module is not None and sys.modules.get(name) is module:
        del sys.modules[name]
    registered = pm.get_name(module) if module is not None else None
    if registered is None and pm.has_plugin(name) and _sources.get(name) == RUN_TIME:
        registered = name  # a module that failed is gone from sys.modules: found by its name
    if registered is not None:
        unregister(name=registered)


def _raised_at(error: BaseException, path: str | None) -> str:
    """Where ``error`` happened: "line N" in the plugin file ``path``; otherwise "FILE, line N"
    of the innermost module being imported (the line of its code that called what failed)."""
    if isinstance(error, SyntaxError) and error.filename:  # raised by the compiler: no frame of its own
        filename, lineno = error.filename, error.lineno
    else:
        frames = [f for f in traceback.extract_tb(error.__traceback__) if not f.filename.startswith("<frozen")]
        own = [f for f in frames if f.filename == path] or [f for f in frames if f.name == "<module>"] or frames
        if not own:
            return path or "?"
        filename, lineno = own[-1].filename, own[-1].lineno
    return f"line {lineno}" if filename == path else f"{filename}, line {lineno}"


def _message(error: BaseException) -> str:
    """An exception's message on one line (a SyntaxError's without its "(file, line)" tail)."""
    return _one_line(error.msg if isinstance(error, SyntaxError) and error.msg else error)


def unregister(plugin: object | None = None, name: str | None = None) -> object:
    """Remove a plugin registered earlier (by object or by name); returns the plugin.

    Built-ins can be unregistered too (to replace one with a class of your own);
    ``_reset()`` brings them back.
    """
    pm = get_plugin_manager()
    if name is None:
        name = pm.get_name(plugin)
    if name is None or not pm.has_plugin(name):
        registered = ", ".join(repr(n) for n, _ in pm.list_name_plugin())
        raise ValueError(f"unregister: no plugin {name or plugin!r} is registered (registered: {registered})")
    removed = pm.unregister(name=name)
    _sources.pop(name, None)
    _registries.clear()  # its names leave the registries at the next look-up
    return removed


def _collect(pm: pluggy.PluginManager) -> dict[str, tuple[dict[str, type], dict[str, tuple[str, str]]]]:
    """Ask every plugin for its classes, kind by kind, remembering who claimed each name.

    Returns {kind: ({name: class}, {name: (plugin name, source)})}; a hook that raises or
    returns something other than a dict, or a name claimed twice, is a PluginError.
    """
    registries = {}
    for kind, hook_name in KINDS.items():
        table: dict[str, type] = {}
        owners: dict[str, tuple[str, str]] = {}
        # get_hookimpls() lists the implementations in registration order, so the plugin
        # that claimed a name first (a built-in before the rest) is named first in a clash.
        for impl in getattr(pm.hook, hook_name).get_hookimpls():
            owner = (impl.plugin_name, _describe_source(impl.plugin_name))
            try:
                provided = impl.function()
            except Exception as e:
                raise PluginError(
                    f"{hook_name}() of plugin {owner[0]!r} ({owner[1]}) raised {type(e).__name__}: {e}"
                ) from e
            if not isinstance(provided, dict):
                raise PluginError(
                    f"{hook_name}() of plugin {owner[0]!r} ({owner[1]}) returned "
                    f"{type(provided).__name__}; it must return a dict {{name: class}}"
                )
            for name, cls in provided.items():
                if name in table:
                    first = owners[name]
                    raise PluginError(
                        f"two plugins claim the {kind} name {name!r}: {first[0]!r} ({first[1]}) "
                        f"and {owner[0]!r} ({owner[1]}); unregister or rename one"
                    )
                table[name] = cls
                owners[name] = owner
        registries[kind] = (table, owners)
    return registries


def _build_registries() -> None:
    registries = _collect(get_plugin_manager())
    _registries.clear()
    _registries.update(registries)


def _describe_source(plugin_name: str) -> str:
    return _sources.get(plugin_name, RUN_TIME)


def _kind(kind: str) -> str:
    key = str(kind).strip().lower()
    key = _KIND_ALIASES.get(key, key)
    if key not in KINDS:
        raise ValueError(f"unknown plugin kind {kind!r}; the kinds are: {', '.join(map(repr, KINDS))}")
    return key


def _registry(kind: str) -> dict[str, type]:
    if not _registries:
        _build_registries()
    return _registries[kind][0]


def scorers() -> dict[str, type]:
    """Scorer name -> class, from every plugin: a new dict, the registry as it is now (the plugins
    load at the first look-up). A scorer turns queries and keys into scores a(q, k_i)."""
    return dict(_registry("scorer"))


def poolings() -> dict[str, type]:
    """Pooling name -> class, from every plugin: a new dict, the registry as it is now. A pooling
    turns each row of scores into attention weights alpha(q, k_i)."""
    return dict(_registry("pooling"))


def positional_encodings() -> dict[str, type]:
    """Positional-encoding name -> class, from every plugin: a new dict, the registry as it is now.
    An encoding's ``applies_to`` says where it acts: "inputs", "qk" or "scores"."""
    return dict(_registry("positional encoding"))


def kv_caches() -> dict[str, type]:
    """Key/value cache policy name -> class, from every plugin: a new dict, the registry as it is
    now. A policy decides what a layer keeps of the past while a model decodes."""
    return dict(_registry("kv cache"))


def decoders() -> dict[str, type]:
    """Decoder name -> class, from every plugin: a new dict, the registry as it is now. Each class's
    ``kind`` says whether it is a "processor" of next-token scores or a "search"."""
    return dict(_registry("decoder"))


def lookup(kind: str, name: str) -> type:
    """The class registered as ``name`` for ``kind`` ("scorer", "pooling",
    "positional encoding"), or an UnknownPluginError listing what there is."""
    kind = _kind(kind)
    table = _registry(kind)
    try:
        return table[name]
    except (KeyError, TypeError):  # TypeError: an unhashable "name"
        pass
    available = sorted(table)
    close = difflib.get_close_matches(str(name), available, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else "."
    raise UnknownPluginError(
        f"unknown {kind} {name!r}{hint} Available: {', '.join(available) or '(none)'}. A plugin adds "
        f"more: a file or module given to --plugin (or MINITENSOR_PLUGINS), an entry point in the group "
        f"{ENTRY_POINT_GROUP!r}, or minitensor.plugins.register()"
    )


def describe() -> list[dict[str, str]]:
    """Every registered plugin class, kind by kind and sorted by name: a list of dicts with
    ``name``, ``kind``, ``source`` ("built-in", "<distribution> <version>", "file <absolute
    path>", "module <name>" or "registered at run time"), ``plugin`` (its name in the plugin
    manager) and ``class`` (module.qualname); a positional encoding's row also has
    ``applies_to`` ("inputs", "qk" or "scores": where it acts)."""
    if not _registries:
        _build_registries()
    rows = []
    for kind in KINDS:
        table, owners = _registries[kind]
        for name in sorted(table):
            cls = table[name]
            rows.append(
                {
                    "name": name,
                    "kind": kind,
                    "source": owners[name][1],
                    "plugin": owners[name][0],
                    "class": f"{getattr(cls, '__module__', '?')}.{getattr(cls, '__qualname__', repr(cls))}",
                }
            )
            if kind == "positional encoding":
                rows[-1]["applies_to"] = str(getattr(cls, "applies_to", "?"))
    return rows


def _reset() -> None:
    """Forget the manager and the registries (tests use this to reload from scratch)."""
    global _pm
    _pm = None
    _sources.clear()
    _registries.clear()
