"""What a checkpoint records of plugins: which ones a model uses (``model_plugins``, saved in
the "plugins" field) and, on loading, which of them this process lacks, with a hint on how to
get each back. The registry itself is minitensor.plugins; fields.py checks the saved records.
"""

import os
import re
import shlex
import warnings

from .spec import CheckpointError


def _split_source(source):
    """ "minitensor-example-cosine 0.1.0" -> ("minitensor-example-cosine", "0.1.0"); a source that is
    not an installed distribution (built in, a plugin file or module, run time) -> (None, None)."""
    from ... import plugins  # lazily: it imports pluggy, which `minitensor --help` never needs

    local = (getattr(plugins, "FILE_SOURCE", "file "), getattr(plugins, "MODULE_SOURCE", "module "), "entry point ")
    if source in (plugins.BUILT_IN, plugins.RUN_TIME, "unknown") or source.startswith(local):
        return None, None
    name, _, version = source.rpartition(" ")
    return (name, version) if name else (source, None)


def model_plugins(model):
    """The plugins ``model`` uses: a list of dicts (kind, name, source, distribution, version,
    class), sorted by kind and name.

    Names come from the attention layers (``scorer_name``, ``pooling_name``,
    ``positional_name``); any other sub-module whose class is a registered plugin class (the
    "inputs" positional encoding of a TransformerEmbedding, a scorer used on its own) is
    found by its class.
    """
    from ... import plugins  # lazily: it imports pluggy, which `minitensor --help` never needs

    rows = {(r["kind"], r["name"]): r for r in plugins.describe()}
    by_class = {}
    for kind, name in rows:
        by_class.setdefault(plugins.lookup(kind, name), []).append((kind, name))
    used, covered = {}, set()

    def add(kind, name):
        row = rows.get((kind, name))
        source = row["source"] if row else "unknown"
        distribution, version = _split_source(source)
        used[(kind, name)] = {
            "kind": kind,
            "name": name,
            "source": source,
            "distribution": distribution,
            "version": version,
            "class": row["class"] if row else None,
        }

    for module in model.modules():
        for kind, attribute, part in (
            ("scorer", "scorer_name", "scorer"),
            ("pooling", "pooling_name", "pooling"),
            ("positional encoding", "positional_name", "positional"),
        ):
            name = module.__dict__.get(attribute)
            if isinstance(name, str):
                add(kind, name)
                instance = module._modules.get(part)
                if instance is not None:
                    covered.add(id(instance))
    for module in model.modules():
        matches = by_class.get(type(module))
        if matches and id(module) not in covered and not any(key in used for key in matches):
            add(*sorted(matches)[0])  # a class registered under several names: one of them
    order = list(plugins.KINDS)
    return [used[key] for key in sorted(used, key=lambda k: (order.index(k[0]) if k[0] in order else 99, k[1]))]


# What may become part of a command in a hint: a distribution name (PEP 508), a version, a
# module name. Anything else from the checkpoint is shown quoted, as data.
_DISTRIBUTION_NAME = re.compile(r"[A-Z0-9]|[A-Z0-9][A-Z0-9._-]{0,98}[A-Z0-9]", re.IGNORECASE)
_VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9.+!_-]{0,63}")
_MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,99}(\.[A-Za-z_][A-Za-z0-9_]{0,99}){0,20}")
_PLUGIN_OPTION = "--plugin PATH_OR_MODULE (or MINITENSOR_PLUGINS=PATH_OR_MODULE,...)"


def _missing_plugin(entry):
    """One line on a plugin the checkpoint needs and this process lacks, and how to get it back.
    The checkpoint's record of it is data from a file: it goes into a command only when it is a
    valid distribution name or a plausible path or module name (shell-quoted), and is shown
    quoted otherwise."""
    from ... import plugins  # lazily: it imports pluggy, which `minitensor --help` never needs

    file_source, module_source = getattr(plugins, "FILE_SOURCE", "file "), getattr(plugins, "MODULE_SOURCE", "module ")
    source, distribution, version = entry["source"], entry["distribution"], entry["version"]
    what = f"{entry['kind']} {entry['name']!r}"
    if source == plugins.BUILT_IN:
        return (
            f"built-in {what} is not registered (was it unregistered? the checkpoint was written by minitensor "
            "with it built in)"
        )
    if source == plugins.RUN_TIME:
        return (
            f"{what} ({entry['class']!r}) was registered at run time when saved; register it again with "
            "minitensor.plugins.register(...) before loading, or put it in a file and pass --plugin PATH "
            "(or MINITENSOR_PLUGINS=PATH)"
        )
    if source.startswith(file_source):
        path = source[len(file_source) :]
        if os.path.isabs(path) and path.isprintable():
            return (
                f"{what} came from the plugin file {path!r} when saved: pass --plugin {shlex.quote(path)} "
                f"(or set MINITENSOR_PLUGINS={shlex.quote(path)})"
            )
    elif source.startswith(module_source):
        module = source[len(module_source) :]
        if _MODULE_NAME.fullmatch(module):
            return (
                f"{what} came from the plugin module {module!r} when saved: pass --plugin {module} "
                f"(or set MINITENSOR_PLUGINS={module})"
            )
    elif distribution is not None and _DISTRIBUTION_NAME.fullmatch(distribution):
        saved_from = distribution + (f" {version}" if version is not None and _VERSION.fullmatch(version) else "")
        return (
            f"{what} from {saved_from} is not installed: pip install {distribution}; or load its plugin file "
            f"or module with {_PLUGIN_OPTION}"
        )
    return f"{what} from {source!r} ({entry['class']!r}) is not installed; install it, or load it with {_PLUGIN_OPTION}"


def _check_plugins(saved):
    """CheckpointError naming every saved plugin (validated entries) that is not installed now."""
    from ... import plugins  # lazily: it imports pluggy, which `minitensor --help` never needs

    installed = {(r["kind"], r["name"]): r for r in plugins.describe()}
    missing = []
    for entry in saved:
        here = installed.get((entry["kind"], entry["name"]))
        if here is None:
            missing.append(_missing_plugin(entry))
        elif entry["distribution"] and _split_source(here["source"])[0] != entry["distribution"]:
            warnings.warn(
                f"checkpoint: {entry['kind']} {entry['name']!r} was saved from {entry['source']!r}; here "
                f"it comes from {here['source']}",
                RuntimeWarning,
                stacklevel=3,
            )
    if missing:
        raise CheckpointError(
            "the checkpoint needs plugin(s) that are not installed; nothing was changed:\n  " + "\n  ".join(missing)
        )
