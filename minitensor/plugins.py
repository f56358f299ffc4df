"""Plugins: the plugin manager and the registries of scorers, poolings and positional encodings.

An attention layer is three exchangeable parts (D2L's attention pooling, split up):

    scores  = scorer(queries, keys)                  a(q, k_i), any real number
    weights = pooling(scores, valid_lens, mask)      alpha(q, k_i) >= 0, summing to 1
    output  = dropout(weights) @ values              sum_i alpha(q, k_i) v_i

Scorers, poolings and positional encodings are looked up *by name* in registries filled by
plugins, so a class a user registers works everywhere a built-in does.

Where plugins come from, in loading order (at the first registry look-up, never at
``import minitensor``, so that importing the engine stays fast and a broken plugin cannot
stop it from importing):

1. the built-ins, the modules named in ``DEFAULT_PLUGINS``, registered with ``pm.register``
   exactly as a user's plugin is (they ignore the autoload switch: without them nothing works);
2. third-party distributions that declare an entry point in the group ``"minitensor"``,
   loaded one at a time: one that fails to import, misspells a hook or claims a name another
   plugin already has is reported with a warning naming it, and the rest keeps working.
   ``MINITENSOR_DISABLE_PLUGIN_AUTOLOAD=1`` skips them all; ``MINITENSOR_STRICT_PLUGINS=1``
   turns a failure into a ``PluginError`` (for plugin authors, who want to see it fail);
3. ``register(obj)`` / ``unregister(obj)`` at run time, which rebuild the registries.

``pm.check_pending()`` runs after loading: it rejects a hook implementation whose name matches
no hook (``minitensor_scorer`` for ``minitensor_scorers``), so a typo is an error, not silence.

The registries map names to classes. A name claimed twice is an error naming both sources;
an unknown name lists the available ones and the closest match.
"""

import difflib
import importlib
import os
import re
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
# other spellings lookup() accepts for a kind (the hook names, plurals, underscores)
_KIND_ALIASES = {
    "scorers": "scorer", "minitensor_scorers": "scorer",
    "poolings": "pooling", "minitensor_poolings": "pooling",
    "positional": "positional encoding", "positional_encoding": "positional encoding",
    "positional encodings": "positional encoding", "positional_encodings": "positional encoding",
    "minitensor_positional_encodings": "positional encoding",
}


class PluginError(RuntimeError):
    """A plugin could not be loaded or registered, or two plugins claim one name."""


class UnknownPluginError(KeyError):
    """No plugin of that kind has that name."""

    def __str__(self):  # KeyError would print the message in quotes
        return self.args[0]


_pm = None
_sources = {}  # plugin name in the manager -> where it came from ("built-in", "dist 1.0", ...)
_registries = {}  # kind -> ({name: class}, {name: (plugin name, source)}); empty = rebuild


def get_plugin_manager():
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
        _pm = pm
    return _pm


def check_options(cls, options, accepted=()):
    """For plugin authors: refuse options the plugin does not know, by name.

    ``Attention(..., scorer_options={"widht": 0.5})`` must not silently train with the
    default width. Call it in ``__init__`` with the leftover ``**options``::

        def __init__(self, query_size, key_size, **options):
            minitensor.plugins.check_options(type(self), options)
    """
    if options:
        takes = ", ".join(accepted) if accepted else "no options"
        raise TypeError(
            f"{cls.__name__}: unknown option(s) {', '.join(map(repr, sorted(options)))}; it takes {takes}"
        )


def _env_flag(name):
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no", "off")


def _load_entry_points(pm):
    """Register the entry points of group "minitensor" one at a time (see the module doc)."""
    from importlib.metadata import entry_points

    strict = _env_flag("MINITENSOR_STRICT_PLUGINS")
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        dist = getattr(ep, "dist", None)
        source = f"{dist.metadata['Name']} {dist.version}" if dist is not None else f"entry point {ep.value}"
        name = f"{ep.name} ({source})"
        if pm.has_plugin(name) or pm.is_blocked(name):
            continue
        _sources[name] = source
        try:
            pm.register(ep.load(), name=name)
            _check(pm)  # a typo or a clash is this plugin's fault: drop it, keep the others
        except Exception as e:  # a broken plugin must not take minitensor down with it
            if pm.has_plugin(name):
                pm.unregister(name=name)
            _sources.pop(name, None)
            message = f"minitensor: plugin {ep.name!r} ({ep.value}) from {source} failed to load: {type(e).__name__}: {e}"
            if strict:
                raise PluginError(message + " (MINITENSOR_STRICT_PLUGINS is set)") from e
            warnings.warn(message + "; continuing without it", RuntimeWarning, stacklevel=2)


def _check(pm):
    """Raise PluginError unless every hook is known, no hook implementation gives its
    parameters defaults, and every name is claimed once."""
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as e:
        raise PluginError(_explain_validation_error(e)) from e
    _check_no_defaults(pm)
    _collect(pm)


def _check_no_defaults(pm):
    """pluggy passes an implementation only the parameters without defaults; one with a
    default is silently never given the caller's value. Refuse it instead."""
    for hook_name in sorted(name for name in vars(hookspecs) if name.startswith("minitensor_")):
        for impl in getattr(pm.hook, hook_name).get_hookimpls():
            if impl.kwargnames:
                raise PluginError(
                    f"plugin {impl.plugin_name!r}: {hook_name}() gives its parameter(s) "
                    f"{', '.join(impl.kwargnames)} a default value; pluggy would never pass them (hooks are "
                    f"called with keyword arguments, and only the parameters without defaults are filled). "
                    f"Remove the defaults; the hook's parameters are in minitensor/hookspecs.py"
                )


def _explain_validation_error(error):
    """pluggy's message, plus the hook the author probably meant."""
    message = str(error)
    hooks = sorted(name for name in vars(hookspecs) if name.startswith("minitensor_"))
    unknown = re.search(r"unknown hook '([^']+)'", message)
    close = difflib.get_close_matches(unknown.group(1), hooks, n=1) if unknown else []
    if close:
        return f"{message}; did you mean {close[0]!r}? The hooks are: {', '.join(hooks)}"
    return f"{message}\nThe hooks are: {', '.join(hooks)} (their parameters, if any, are in minitensor/hookspecs.py)"


def register(plugin, name=None):
    """Register a plugin (a module, class or object with ``@hookimpl`` functions) now.

    Returns the name it is registered under. Its names join the registries at once; a
    misspelled hook or a name another plugin already has is a ``PluginError``, and then
    nothing stays registered.
    """
    pm = get_plugin_manager()
    # a readable default: the module's or class's name, or the class of an object (pluggy's
    # own default for an object is its id(), which error messages would then show)
    name = name or getattr(plugin, "__name__", None) or type(plugin).__name__
    if pm.has_plugin(name) or plugin in pm.get_plugins():
        other = pm.get_name(plugin) or name
        raise PluginError(f"register: plugin {other!r} ({_describe_source(other)}) is already registered")
    _sources[name] = RUN_TIME
    try:
        # pluggy checks the hook signatures while registering and can fail half-way through,
        # so the clean-up below runs for errors from register() as well as from _check().
        if pm.register(plugin, name=name) is None:
            raise PluginError(f"register: the plugin name {name!r} is blocked")
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


def unregister(plugin=None, name=None):
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


def _collect(pm):
    """Ask every plugin for its classes, kind by kind, remembering who claimed each name.

    Returns {kind: ({name: class}, {name: (plugin name, source)})}; a hook that raises or
    returns something other than a dict, or a name claimed twice, is a PluginError.
    """
    registries = {}
    for kind, hook_name in KINDS.items():
        table, owners = {}, {}
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


def _build_registries():
    registries = _collect(get_plugin_manager())
    _registries.clear()
    _registries.update(registries)


def _describe_source(plugin_name):
    return _sources.get(plugin_name, RUN_TIME)


def _kind(kind):
    key = str(kind).strip().lower()
    key = _KIND_ALIASES.get(key, key)
    if key not in KINDS:
        raise ValueError(f"unknown plugin kind {kind!r}; the kinds are: {', '.join(map(repr, KINDS))}")
    return key


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
        f"unknown {kind} {name!r}{hint} Available: {', '.join(available) or '(none)'}. A plugin "
        f"adds more through the entry-point group {ENTRY_POINT_GROUP!r} or minitensor.plugins.register()"
    )


def describe():
    """Every registered plugin class, kind by kind and sorted by name: a list of dicts with
    ``name``, ``kind``, ``source`` ("built-in", "<distribution> <version>" or "registered at
    run time"), ``plugin`` (its name in the plugin manager) and ``class`` (module.qualname)."""
    if not _registries:
        _build_registries()
    rows = []
    for kind in KINDS:
        table, owners = _registries[kind]
        for name in sorted(table):
            cls = table[name]
            rows.append({"name": name, "kind": kind, "source": owners[name][1], "plugin": owners[name][0],
                         "class": f"{getattr(cls, '__module__', '?')}.{getattr(cls, '__qualname__', repr(cls))}"})
    return rows


def _reset():
    """Forget the manager and the registries (tests use this to reload from scratch)."""
    global _pm
    _pm = None
    _sources.clear()
    _registries.clear()
