"""Plugins: the plugin manager and the registries of scorers, poolings and positional encodings.

Where plugins come from, in loading order (at the first registry look-up, never at
``import minitensor``):

1. the built-ins, the modules named in ``DEFAULT_PLUGINS``, registered with ``pm.register``
   exactly as a user's plugin is (they ignore the autoload switch: without them nothing works);
2. third-party distributions that declare an entry point in the group ``"minitensor"``,
   loaded one at a time: one that fails to import is reported with a warning naming it, and
   the rest keeps working. ``MINITENSOR_DISABLE_PLUGIN_AUTOLOAD=1`` skips them all;
   ``MINITENSOR_STRICT_PLUGINS=1`` turns a failure into an error (for plugin authors);
3. ``register(obj)`` / ``unregister(obj)`` at run time.

``pm.check_pending()`` then rejects a hook implementation whose name matches no hook
(``minitensor_scorer`` for ``minitensor_scorers``): a typo is an error, not silence.

The registries map names to classes. A name claimed twice is an error naming both sources;
an unknown name lists the available ones and the closest match.
"""

import difflib
import importlib
import os
import warnings

import pluggy

from . import hookspecs

hookimpl = pluggy.HookimplMarker("minitensor")

ENTRY_POINT_GROUP = "minitensor"
DEFAULT_PLUGINS = (
    "minitensor_plugins.scorers",
    "minitensor_plugins.poolings",
    "minitensor_plugins.positional",
)
BUILT_IN = "built-in"
RUN_TIME = "registered at run time"

# kind -> the hook that fills its registry
KINDS = {
    "scorer": "minitensor_scorers",
    "pooling": "minitensor_poolings",
    "positional encoding": "minitensor_positional_encodings",
}


class PluginError(RuntimeError):
    """A plugin could not be loaded, or two plugins claim one name."""


class UnknownPluginError(KeyError):
    """No plugin of that kind has that name."""

    def __str__(self):  # KeyError would print the message in quotes
        return self.args[0]


_pm = None
_sources = {}  # plugin name in the manager -> where it came from
_registries = {}  # kind -> {name: class}, rebuilt after every (un)registration


def get_plugin_manager():
    """The pluggy PluginManager, loading the plugins on first use."""
    global _pm
    if _pm is None:
        pm = pluggy.PluginManager("minitensor")
        pm.add_hookspecs(hookspecs)
        for module_name in DEFAULT_PLUGINS:
            pm.register(importlib.import_module(module_name), name=module_name)
            _sources[module_name] = BUILT_IN
        if not _env_flag("MINITENSOR_DISABLE_PLUGIN_AUTOLOAD"):
            _load_entry_points(pm)
        pm.check_pending()
        _pm = pm
    return _pm


def _env_flag(name):
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no")


def _load_entry_points(pm):
    from importlib.metadata import entry_points

    strict = _env_flag("MINITENSOR_STRICT_PLUGINS")
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        dist = getattr(ep, "dist", None)
        source = f"{dist.metadata['Name']} {dist.version}" if dist is not None else f"entry point {ep.value}"
        name = f"{ep.name} ({source})"
        if pm.has_plugin(name) or pm.is_blocked(name):
            continue
        try:
            pm.register(ep.load(), name=name)
            pm.check_pending()
        except Exception as e:  # a broken plugin must not take minitensor down with it
            if pm.has_plugin(name):
                pm.unregister(name=name)
            message = f"minitensor: plugin {ep.name!r} from {source} failed to load: {type(e).__name__}: {e}"
            if strict:
                raise PluginError(message + " (MINITENSOR_STRICT_PLUGINS is set)") from e
            warnings.warn(message + "; continuing without it", RuntimeWarning, stacklevel=3)
            continue
        _sources[name] = source


def register(plugin, name=None):
    """Register a plugin (a module, class or object with ``@hookimpl`` functions) now.

    Returns the name it is registered under. Its names join the registries at once; a
    misspelled hook or a name another plugin already has is an error, and then nothing is
    registered.
    """
    pm = get_plugin_manager()
    name = pm.register(plugin, name=name)
    _sources[name] = RUN_TIME
    try:
        pm.check_pending()
        _build_registries()
    except Exception:
        pm.unregister(name=name)
        _sources.pop(name, None)
        _build_registries()
        raise
    return name


def unregister(plugin=None, name=None):
    """Remove a plugin registered earlier (by object or by name); returns the plugin."""
    pm = get_plugin_manager()
    if name is None:
        name = pm.get_name(plugin)
    if name is None or not pm.has_plugin(name):
        raise ValueError(f"unregister: no plugin {name or plugin!r} is registered")
    removed = pm.unregister(name=name)
    _sources.pop(name, None)
    _build_registries()
    return removed


def _build_registries():
    """Ask every plugin for its classes, kind by kind, remembering who claimed each name."""
    pm = get_plugin_manager()
    registries = {}
    for kind, hook_name in KINDS.items():
        table, owners = {}, {}
        for impl in getattr(pm.hook, hook_name).get_hookimpls():
            owner = (impl.plugin_name, _describe_source(impl.plugin_name))
            provided = impl.function()
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
    _registries.clear()
    _registries.update(registries)


def _describe_source(plugin_name):
    return _sources.get(plugin_name, RUN_TIME)


def _registry(kind):
    if not _registries:
        _build_registries()
    return _registries[kind][0]


def scorers():
    """Scorer name -> class, from every plugin."""
    return dict(_registry("scorer"))


def poolings():
    """Pooling name -> class, from every plugin."""
    return dict(_registry("pooling"))


def positional_encodings():
    """Positional-encoding name -> class, from every plugin."""
    return dict(_registry("positional encoding"))


def lookup(kind, name):
    """The class registered as ``name`` for ``kind`` ("scorer", "pooling",
    "positional encoding"), or an error listing what there is."""
    table = _registry(kind)
    try:
        return table[name]
    except (KeyError, TypeError):
        pass
    available = sorted(table)
    close = difflib.get_close_matches(str(name), available, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise UnknownPluginError(
        f"unknown {kind} {name!r}{hint} Available: {', '.join(available)}. A plugin adds more "
        f"through the entry-point group {ENTRY_POINT_GROUP!r} or minitensor.plugins.register()"
    )


def describe():
    """Every registered plugin class: a list of dicts with name, kind, source and class."""
    get_plugin_manager()
    if not _registries:
        _build_registries()
    rows = []
    for kind in KINDS:
        table, owners = _registries[kind]
        for name in sorted(table):
            cls = table[name]
            rows.append({"name": name, "kind": kind, "source": owners[name][1],
                         "class": f"{cls.__module__}.{cls.__qualname__}"})
    return rows


def _reset():
    """Forget the manager and the registries (tests use this to reload from scratch)."""
    global _pm
    _pm = None
    _sources.clear()
    _registries.clear()
