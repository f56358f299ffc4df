"""Checkpoints: save a model and its training state, load them back, safely and atomically.

    save_checkpoint("runs/date/checkpoint", model, optimizer, scheduler, config=config,
                    vocabs={"src": src_vocab, "tgt": tgt_vocab}, extra={"batches": loader.state_dict()},
                    step=step, epoch=epoch)
    ...
    info = load_checkpoint(find_checkpoint("runs/date"), model, optimizer, scheduler)   # resume exactly
    loader.load_state_dict(info["extra"]["batches"]); step = info["step"]

A checkpoint is a directory of three files, none of which is a pickle (loading a pickle runs
whatever code it names; these formats hold only numbers and text, so loading a checkpoint
never runs code from it -- and no checkpoint, of any library, should ever be loaded as code):

    model.safetensors       the model's state_dict: name -> array, in each tensor's own dtype
    optimizer.safetensors   the optimiser's per-parameter arrays (Adam's m and v ...), named
                            "state.<parameter index>.<name>"; only when an optimiser is saved
    checkpoint.json         everything else, as JSON:
        format, format_version   "minitensor-checkpoint", 1
        minitensor_version       the version that wrote it; created (UTC, ISO 8601)
        model                    class (module.qualname), device, num_parameters, keys (in order)
        config                   the caller's config dict (what built the model), or null
        plugins                  every plugin the model uses: kind, name, source ("built-in",
                                 "<distribution> <version>", "file <path>", "module <name>",
                                 "registered at run time"), distribution, version, class
        vocabs                   {name: Vocab.to_dict()}
        rng                      {"host": state, "backends": {device: state or null}}: the
                                 bit_generator.state dicts of mt.random.host_rng() and of each
                                 backend's generator (big integers stay exact JSON integers)
        optimizer                null, or class, file, param_groups and state, where an array is
                                 {"__tensor__": "<key in optimizer.safetensors>"}
        scheduler                null, or class and state (scheduler.state_dict())
        step, epoch              the caller's training position: a non-negative integer or null
        extra                    the caller's JSON-safe extras (a dict), or null
        files                    {file name: {"sha256": hex digest, "bytes": size}}
        content_sha256           SHA-256 of this JSON itself (canonical form, without this field)

What the SHA-256s are for: they detect accidental damage -- a truncated copy, a flipped bit, a
file changed by hand. They are not a signature: whoever edits a file can recompute its hash
and the JSON's, so they say nothing about who wrote a checkpoint. What makes a crafted
checkpoint harmless is the loader itself: it reads only regular files (no symbolic links,
devices or FIFOs), checks each file's size against the record before reading it and reads no
more than that, validates a safetensors file's header (names, dtypes, shapes) against the
record and the model before its arrays, and checks every field of checkpoint.json by type and
range before using it. The caps below (MAX_JSON_BYTES, MAX_TENSOR_FILE_BYTES, ...) bound what
a checkpoint can make a loader read and build.

Loading checks everything before it changes anything: files present, sizes and hashes right,
the JSON intact and of a known format version, every field valid, the plugins installed, the
state_dict keys and shapes those of the model, the optimiser and scheduler of the saved
classes. Any problem is a ``CheckpointError`` naming it (a bad field by its path, e.g.
``field "files.model.safetensors.bytes" must be a non-negative integer, got -5``), and then
the model, optimiser, scheduler and random generators are exactly as they were, and nothing
on disk has changed.

Why a save cannot leave a half-written checkpoint: every file is written into a temporary
directory beside the target (same file system), flushed and fsync'ed; only then is the
complete directory renamed into place. A rename is atomic, so ``directory`` is at every
instant either the complete old checkpoint or the complete new one. Replacing an existing
checkpoint takes two renames (old -> ".<name>.old-*", new -> <name>) because no file system
call swaps two directories portably; if the process dies between them, ``directory`` is
absent for a moment but the complete old checkpoint sits beside it: ``load_checkpoint`` reads
it from there, ``find_checkpoint`` finds it through the run folder, and the next
``save_checkpoint`` renames it back first. A save that completes deletes what interrupted
saves left (".<name>.tmp-*" copies, superseded ".<name>.old-*" backups); a backup is renamed
to a ".tmp-" name before it is deleted, so a half-deleted folder is never taken for one. An
exception during a save (disk full, Ctrl-C) removes the temporary directory and restores the
old one. Two processes must not save to the same directory at the same time.

For tests only: ``MINITENSOR_TEST_KILL_AT=<step>`` makes ``save_checkpoint`` SIGKILL its own
process at that step (one of ``SAVE_STEPS``), so a test can check that every instant of a save
is recoverable. It does nothing else.
"""

import copy
import datetime
import hashlib
import json
import math
import os
import re
import shlex
import shutil
import signal
import stat
import tempfile
import uuid
import warnings
from collections import OrderedDict

import numpy

FORMAT = "minitensor-checkpoint"
FORMAT_VERSION = 1
CHECKPOINT_JSON = "checkpoint.json"
MODEL_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.safetensors"
_OWN_FILES = (CHECKPOINT_JSON, MODEL_FILE, OPTIMIZER_FILE)
_TENSOR = "__tensor__"  # marks an array in the optimiser's JSON index
_NDARRAY = "__ndarray__"  # marks an array inside a generator state (MT19937's key, Philox's counter)

# What a checkpoint may make a loader read and build. checkpoint.json holds the vocabularies
# and the training history: a 1,000,000-word vocabulary is about 12 MB of JSON. Parsing JSON
# builds at most ~25 bytes of Python objects per byte of text (a list of empty lists), so
# 16 MiB bounds that at about 400 MB. A safetensors header is capped the same way.
MAX_JSON_BYTES = 16 * 2**20
# A safetensors file: 4 GiB, a billion float32 numbers, far beyond what a NumPy model trains.
# With a model (or optimiser) given, its arrays must also have the model's shapes, which bounds
# the file by the model's own size before anything but the header is read.
MAX_TENSOR_FILE_BYTES = 2**32
MAX_TENSORS = 100_000  # arrays in a state_dict, parameters in an optimiser
MAX_VOCAB_SIZE = 2**20  # tokens in one vocabulary
MAX_TOKEN_CHARS = 1000
MAX_TEXT_CHARS = 1000  # class names, keys, plugin names and sources, file paths
MAX_ENTRIES = 1000  # plugins, vocabularies, devices, parameter groups, settings, list lengths
MAX_DEPTH = 64  # levels of nesting in any field (config and extra included)
MAX_INT = 2**63 - 1  # step, epoch, counters, parameter indices

# -- fault injection, for tests only ---------------------------------------------------------------
KILL_AT_ENV = "MINITENSOR_TEST_KILL_AT"
# The instants of a save at which MINITENSOR_TEST_KILL_AT can kill it, in order.
SAVE_STEPS = (
    "after-tmp-files",  # every file written and fsync'ed in the temporary directory
    "after-fsync",  # ... and the temporary directory's entries made durable
    "after-first-rename",  # the old checkpoint renamed to its backup (only when there was one)
    "after-second-rename",  # the new checkpoint renamed into place
    "before-cleanup",  # ... made durable; the backup and older leftovers not yet deleted
)


def _kill_step():
    """The save step named by MINITENSOR_TEST_KILL_AT, or None (it is unset in normal use)."""
    step = os.environ.get(KILL_AT_ENV)
    if step and step not in SAVE_STEPS:
        raise CheckpointError(f"{KILL_AT_ENV}={step!r} is not a save step; it must be one of {', '.join(SAVE_STEPS)} "
                              "(it is meant for tests only)")
    return step or None


def _kill_point(step, chosen):
    """Die here, as abruptly as a power cut or the OOM killer, if the tests asked for it."""
    if step == chosen:
        os.kill(os.getpid(), getattr(signal, "SIGKILL", signal.SIGTERM))  # no SIGKILL on Windows


class CheckpointError(RuntimeError):
    """A checkpoint cannot be saved or loaded: missing or damaged files, another model's
    weights, a plugin that is not installed... Loading that fails changes nothing."""


class _FieldError(CheckpointError):
    """A field of checkpoint.json that is missing, of the wrong type or out of range. The
    message names the field by its path; the caller adds which checkpoint it is in."""


# -- random generators --------------------------------------------------------------------------
def _encode_state(value):
    """A bit_generator.state as JSON-safe values (arrays tagged so they come back as arrays)."""
    if isinstance(value, dict):
        return {str(k): _encode_state(v) for k, v in value.items()}
    if isinstance(value, numpy.ndarray):
        return {_NDARRAY: value.tolist(), "dtype": str(value.dtype)}
    if isinstance(value, numpy.generic):
        return value.item()
    return value


def _decode_state(value):
    if isinstance(value, dict):
        if _NDARRAY in value:
            return numpy.array(value[_NDARRAY], dtype=value["dtype"])
        return {k: _decode_state(v) for k, v in value.items()}
    return value


def _generator_state(generator):
    return _encode_state(generator.bit_generator.state)


def _prepared_generator(state, where):
    """A fresh numpy Generator in ``state``, or ValueError: the check before anything is set."""
    if not isinstance(state, dict) or not isinstance(state.get("bit_generator"), str):
        raise ValueError(f"{where}: not a bit_generator state (a dict with 'bit_generator'): {state!r:.80}")
    cls = getattr(numpy.random, state["bit_generator"], None)
    if not (isinstance(cls, type) and issubclass(cls, numpy.random.BitGenerator)):
        raise ValueError(f"{where}: unknown bit generator {state['bit_generator']!r}")
    bit_generator = cls()
    try:
        bit_generator.state = _decode_state(state)
    except Exception as e:
        raise ValueError(f"{where}: invalid {state['bit_generator']} state ({type(e).__name__}: {e})") from e
    return numpy.random.Generator(bit_generator)


def _backend_generator(backend):
    rng = getattr(backend, "_rng", None)
    return rng if isinstance(rng, numpy.random.Generator) else None


def get_rng_state():
    """Every random generator minitensor draws from, as JSON-safe data::

        {"host": <state of mt.random.host_rng()>, "backends": {"cpu": <state>, ...}}

    A state is a NumPy ``bit_generator.state`` dict. A backend exposing
    ``get_rng_state()`` / ``set_rng_state(state)`` (a GPU backend whose generator is not
    NumPy's) is asked for its own: a flat dict of numbers (a checkpoint's copy must have the
    same fields when loaded); one with neither is recorded as None (not restorable).
    """
    from .. import random as mt_random
    from ..backends import _BACKENDS

    backends = {}
    for device, backend in _BACKENDS.items():
        if hasattr(backend, "get_rng_state"):
            backends[device] = _encode_state(backend.get_rng_state())
        else:
            rng = _backend_generator(backend)
            backends[device] = None if rng is None else _generator_state(rng)
    return {"host": _generator_state(mt_random.host_rng()), "backends": backends}


def _check_rng_state(state):
    """Validate ``state`` (from ``get_rng_state``) completely; ValueError if it cannot be set.
    Returns (host generator, {device: generator or raw state}, skipped devices)."""
    from ..backends import _BACKENDS

    if not isinstance(state, dict) or "host" not in state or not isinstance(state.get("backends", {}), dict):
        raise ValueError("an RNG state must be a dict {'host': ..., 'backends': {...}} as get_rng_state() returns")
    host = _prepared_generator(state["host"], "RNG state 'host'")
    prepared, skipped = {}, []
    for device, saved in state.get("backends", {}).items():
        backend = _BACKENDS.get(device)
        if saved is None or backend is None:
            skipped.append(device)  # not restorable, or that device is not here
        elif hasattr(backend, "set_rng_state"):
            prepared[device] = _decode_state(saved)
        elif _backend_generator(backend) is not None:
            prepared[device] = _prepared_generator(saved, f"RNG state of backend {device!r}")
        else:
            skipped.append(device)
    return host, prepared, skipped


def _adopt(current, prepared):
    """Give ``current`` (a numpy Generator) ``prepared``'s state in place, so whoever holds a
    reference to it sees the restored stream; a different bit generator needs a new object."""
    if type(current.bit_generator) is type(prepared.bit_generator):
        current.bit_generator.state = prepared.bit_generator.state
        return current
    return prepared


def set_rng_state(state):
    """Restore what ``get_rng_state()`` returned (also after a JSON round trip). Everything is
    checked first; an invalid state raises ValueError and changes nothing. Backends that are
    not registered here (a checkpoint from a GPU machine loaded on a laptop) are skipped;
    returns the list of skipped device names."""
    from .. import random as mt_random
    from ..backends import _BACKENDS

    host, prepared, skipped = _check_rng_state(state)
    mt_random._host = _adopt(mt_random.host_rng(), host)
    for device, value in prepared.items():
        backend = _BACKENDS[device]
        if hasattr(backend, "set_rng_state"):
            backend.set_rng_state(value)
        else:
            backend._rng = _adopt(backend._rng, value)
    return skipped


# -- JSON ---------------------------------------------------------------------------------------
def _jsonable(value, where):
    """``value`` as plain JSON data (tuples -> lists, NumPy scalars -> Python numbers), or a
    CheckpointError naming the path of the first value JSON cannot hold."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, numpy.generic):
        return value.item()
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise CheckpointError(f"cannot save {where}: key {k!r} is a {type(k).__name__}; JSON keys are strings")
            out[k] = _jsonable(v, f"{where}[{k!r}]")
        return out
    if isinstance(value, (list, tuple)):
        return [_jsonable(v, f"{where}[{i}]") for i, v in enumerate(value)]
    raise CheckpointError(
        f"cannot save {where}: a {type(value).__name__} is not JSON data (numbers, strings, lists, dicts); "
        "convert it (arrays: .tolist()) or leave it out"
    )


def _canonical(body):
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def _sha256(data):
    return hashlib.sha256(data).hexdigest()


def _qualname(obj):
    cls = obj if isinstance(obj, type) else type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


# -- checking the fields of checkpoint.json ---------------------------------------------------------
# One function per kind of value. Each takes the value and its path ("optimizer.param_groups[0].lr")
# and raises _FieldError naming that path, in one line whatever the value is.
_PLAIN_KEY = re.compile(r"[\w.\-]{1,80}", re.ASCII)
_HEX_DIGEST = re.compile(r"[0-9a-f]{64}")
_STATE_INDEX = re.compile(r"0|[1-9][0-9]{0,8}")


def _at(path, key):
    """The path of ``key`` inside ``path``: "model" + "keys" -> "model.keys", + 3 -> "model.keys[3]".
    A key that is not plain (it comes from the file) is shown quoted, so the message stays one line."""
    if isinstance(key, int):
        return f"{path}[{key}]"
    part = key if _PLAIN_KEY.fullmatch(key) else f"[{key[:40]!r}]"
    return f"{path}.{part}" if path and not part.startswith("[") else f"{path}{part}"


def _show(value):
    """``value`` for an error message: short and on one line, however large it is."""
    if isinstance(value, str):
        return repr(value[:60]) + (f"... ({len(value):,} characters)" if len(value) > 60 else "")
    if isinstance(value, list):
        return f"a list of {len(value):,} item(s)"
    if isinstance(value, dict):
        return f"a JSON object of {len(value):,} field(s)"
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:20]}... ({len(text)} digits)"


def _bad(path, what, value):
    raise _FieldError(f'field "{path}" must be {what}, got {_show(value)}')


def _missing(path):
    raise _FieldError(f'field "{path}" is missing')


def _object(value, path, fields=None, max_items=MAX_ENTRIES, of=None):
    """A JSON object: with exactly ``fields`` when given (the format is closed: a field that is
    not part of it -- of the checkpoint format, or of ``of`` -- is refused, as one that is
    missing), else with at most ``max_items``."""
    if not isinstance(value, dict):
        _bad(path, "a JSON object", value)
    if fields is None:
        if len(value) > max_items:
            raise _FieldError(f'field "{path}" must have at most {max_items:,} entries, got {len(value):,}')
        return value
    for key in fields:
        if key not in value:
            _missing(_at(path, key))
    for key in value:
        if key not in fields:
            raise _FieldError(f'field "{_at(path, key)}" is not part of '
                              + (of or f"the checkpoint format (version {FORMAT_VERSION})"))
    return value


def _list(value, path, max_items):
    if not isinstance(value, list):
        _bad(path, "a list", value)
    if len(value) > max_items:
        raise _FieldError(f'field "{path}" must have at most {max_items:,} items, got {len(value):,}')
    return value


def _int(value, path, high=MAX_INT, null=False):
    """A non-negative integer <= ``high`` (JSON true/false are not integers here)."""
    if null and value is None:
        return value
    if type(value) is not int or value < 0:
        _bad(path, "a non-negative integer" + (" or null" if null else ""), value)
    if value > high:
        _bad(path, f"at most {high:,}", value)
    return value


def _number(value, path):
    """A finite number >= 0: every learning rate, beta, epsilon, decay and count is one."""
    if type(value) is int:
        return _int(value, path)
    if type(value) is not float or not math.isfinite(value) or value < 0:
        _bad(path, "a finite number >= 0", value)
    return value


def _text(value, path, max_chars=MAX_TEXT_CHARS, null=False, one_line=True):
    """A string of at most ``max_chars`` characters; ``one_line``: printable (no newline or
    control character), as anything shown in a message must be."""
    if null and value is None:
        return value
    if not isinstance(value, str):
        _bad(path, "a string" + (" or null" if null else ""), value)
    if len(value) > max_chars:
        _bad(path, f"a string of at most {max_chars:,} characters", value)
    if one_line and not value.isprintable():
        _bad(path, "printable text on one line", value)
    return value


def _digest(value, path):
    if not (isinstance(value, str) and _HEX_DIGEST.fullmatch(value)):
        _bad(path, "a SHA-256 digest (64 lowercase hex digits)", value)
    return value


def _setting(value, path):
    """A hyper-parameter of an optimiser or scheduler: null, true/false, a finite number >= 0,
    or a list of such numbers (Adam's betas, a scheduler's base_lrs)."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, list):
        for i, item in enumerate(_list(value, path, MAX_ENTRIES)):
            _number(item, f"{path}[{i}]")
        return value
    if type(value) in (int, float):
        return _number(value, path)
    _bad(path, "a number >= 0, a list of numbers, true, false or null", value)


def _same_kind(value, current, path, owner):
    """``value`` (saved) is the kind of value ``current`` (the live object's own) is: a number for
    a number, true/false for true/false, a list of as many numbers for a list or tuple."""
    if isinstance(current, bool):
        ok, what = isinstance(value, bool), "true or false"
    elif isinstance(current, (int, float)):
        ok, what = type(value) in (int, float), "a number"
    elif isinstance(current, (list, tuple)):
        ok, what = isinstance(value, list) and len(value) == len(current), f"a list of {len(current)} number(s)"
    else:
        return value  # None, or something this check knows nothing about: _setting was enough
    if not ok:
        _bad(path, f"{what}, as in this {owner}", value)
    return value


def _check_depth(body):
    """No field nests deeper than MAX_DEPTH levels. JSON parses deep nesting, but whatever walks
    it recursively afterwards (json.dumps, copy.deepcopy, repr) would fail with RecursionError."""
    for top, value in body.items():
        stack = [(value, 1)]
        while stack:
            value, depth = stack.pop()
            if depth > MAX_DEPTH:
                raise _FieldError(f'field "{_at("", top)}" nests more than {MAX_DEPTH} levels deep')
            children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
            stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))


_BODY_FIELDS = ("format", "format_version", "minitensor_version", "created", "model", "config", "plugins", "vocabs",
                "rng", "optimizer", "scheduler", "step", "epoch", "extra", "files")


def _check_fields(body):
    """Every field of checkpoint.json (without content_sha256) by type and range, before any is
    used; a _FieldError names the first bad one. ``config`` and ``extra`` belong to the caller
    (TrainConfig, the training loop), which checks their contents: here they are only a JSON
    object or null, bounded by MAX_JSON_BYTES and MAX_DEPTH."""
    _object(body, "", _BODY_FIELDS)
    if body["format"] != FORMAT:
        _bad("format", f'"{FORMAT}"', body["format"])
    _int(body["format_version"], "format_version", FORMAT_VERSION)
    _text(body["minitensor_version"], "minitensor_version", 100)
    _text(body["created"], "created", 100)
    model = _object(body["model"], "model", ("class", "device", "num_parameters", "keys"))
    _text(model["class"], "model.class")
    _text(model["device"], "model.device", 100)
    _int(model["num_parameters"], "model.num_parameters")
    keys = _list(model["keys"], "model.keys", MAX_TENSORS)
    for i, key in enumerate(keys):
        _text(key, f"model.keys[{i}]")
    _unique(keys, "model.keys")
    for name in ("config", "extra"):
        if not (body[name] is None or isinstance(body[name], dict)):
            _bad(name, "a JSON object or null", body[name])
    _check_plugin_fields(body["plugins"])
    _check_vocab_fields(body["vocabs"])
    _check_rng_fields(body["rng"])
    _check_optimizer_fields(body["optimizer"])
    _check_scheduler_fields(body["scheduler"])
    _int(body["step"], "step", null=True)
    _int(body["epoch"], "epoch", null=True)
    _check_file_fields(body["files"], body["optimizer"] is not None)


def _unique(items, path):
    if len(set(items)) != len(items):
        seen = set()
        for i, item in enumerate(items):
            if item in seen:
                raise _FieldError(f'field "{path}[{i}]" repeats {_show(item)}; the entries must be distinct')
            seen.add(item)


def _check_plugin_fields(saved):
    from .. import plugins

    for i, entry in enumerate(_list(saved, "plugins", MAX_ENTRIES)):
        path = f"plugins[{i}]"
        _object(entry, path, ("kind", "name", "source", "distribution", "version", "class"))
        kind = _text(entry["kind"], f"{path}.kind", 100)
        if kind not in plugins.KINDS:
            _bad(f"{path}.kind", "one of " + ", ".join(map(repr, plugins.KINDS)), kind)
        _text(entry["name"], f"{path}.name", 200)
        _text(entry["source"], f"{path}.source")
        _text(entry["distribution"], f"{path}.distribution", 200, null=True)
        _text(entry["version"], f"{path}.version", 100, null=True)
        _text(entry["class"], f"{path}.class", null=True)


def _check_vocab_fields(vocabs):
    """{name: Vocab.to_dict()}: idx_to_token (distinct strings) begins with reserved_tokens,
    which include <unk>, as every Vocab's do; other fields are left to Vocab.from_dict."""
    for name, saved in _object(vocabs, "vocabs", max_items=MAX_ENTRIES).items():
        path = _at("vocabs", name)
        _text(name, path, 100)
        _object(saved, path, max_items=16)
        for key in ("idx_to_token", "reserved_tokens"):
            if key not in saved:
                _missing(_at(path, key))
        tokens = _list(saved["idx_to_token"], f"{path}.idx_to_token", MAX_VOCAB_SIZE)
        if not all(type(token) is str and len(token) <= MAX_TOKEN_CHARS for token in tokens):
            for i, token in enumerate(tokens):  # which one (tokens may hold any character: "\n" is one)
                _text(token, f"{path}.idx_to_token[{i}]", MAX_TOKEN_CHARS, one_line=False)
        try:
            "".join(tokens).encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate ("\ud800"): not text, and printing it fails
            i = next(i for i, token in enumerate(tokens) if not _encodable(token))
            _bad(f"{path}.idx_to_token[{i}]", "text (it holds a lone surrogate)", tokens[i])
        _unique(tokens, f"{path}.idx_to_token")
        reserved = _list(saved["reserved_tokens"], f"{path}.reserved_tokens", MAX_ENTRIES)
        for i, token in enumerate(reserved):
            _text(token, f"{path}.reserved_tokens[{i}]", MAX_TOKEN_CHARS, one_line=False)
        if tokens[:len(reserved)] != reserved:
            raise _FieldError(f'field "{path}.reserved_tokens" must be the first entries of "{path}.idx_to_token" '
                              f"(a Vocab numbers them first), got {_show(reserved)}")
        if "<unk>" not in reserved:
            raise _FieldError(f'field "{path}.reserved_tokens" must include "<unk>" (every Vocab has it), got '
                              f"{reserved[:8]!r:.200}")


def _encodable(text):
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# The bit generators a state may name, and the bounds of their integers that are not 128-bit.
_BIT_GENERATORS = ("PCG64", "PCG64DXSM", "MT19937", "Philox", "SFC64")
_RNG_INT_LIMITS = {"has_uint32": 1, "uinteger": 2**32 - 1, "pos": 624, "buffer_pos": 4}


def _check_rng_fields(rng):
    from ..backends import _BACKENDS

    _object(rng, "rng", ("host", "backends"))
    _check_generator_state(rng["host"], "rng.host")
    for device, state in _object(rng["backends"], "rng.backends", max_items=64).items():
        path = _at("rng.backends", device)
        _text(device, path, 100)
        backend = _BACKENDS.get(device)
        if state is None:
            continue  # recorded as not restorable
        if backend is not None and hasattr(backend, "get_rng_state"):  # that backend's own kind of state
            _like(state, _encode_state(backend.get_rng_state()), path, of=f"a {device!r} backend's generator state")
        elif (backend is not None and _backend_generator(backend) is not None) or (
                isinstance(state, dict) and "bit_generator" in state):
            _check_generator_state(state, path)
        else:  # the state of a backend that is not here (a GPU's): kept, not used
            for key, value in _object(state, path, max_items=16).items():
                if not (value is None or isinstance(value, (bool, float)) or type(value) is int):
                    _bad(_at(path, key), "a number, true, false or null", value)
                if type(value) is int:
                    _int(value, _at(path, key), 2**128 - 1)


def _check_generator_state(state, path):
    """A NumPy bit_generator.state (as _encode_state wrote it) with the structure of a fresh
    generator of the kind it names; NumPy checks the values themselves when it is set."""
    _object(state, path, max_items=16)
    if "bit_generator" not in state:
        _missing(f"{path}.bit_generator")
    name = state["bit_generator"]
    if name not in _BIT_GENERATORS:
        _bad(f"{path}.bit_generator", "one of " + ", ".join(_BIT_GENERATORS), name)
    _like(state, _encode_state(getattr(numpy.random, name)().state), path, of=f"a {name} state")


def _like(value, template, path, key=None, of=None):
    """``value`` has ``template``'s structure (``of``: what that is, for messages): the same
    fields, the same kinds of values, integers in range (arrays: the same dtype and length)."""
    if isinstance(template, dict) and _NDARRAY in template:
        _object(value, path, (_NDARRAY, "dtype"), of=of)
        if value["dtype"] != template["dtype"]:
            _bad(f"{path}.dtype", repr(template["dtype"]), value["dtype"])
        items, n = _list(value[_NDARRAY], f"{path}.{_NDARRAY}", len(template[_NDARRAY])), len(template[_NDARRAY])
        if len(items) != n:
            _bad(f"{path}.{_NDARRAY}", f"a list of {n} integers", items)
        high = int(numpy.iinfo(template["dtype"]).max)
        for i, item in enumerate(items):
            _int(item, f"{path}.{_NDARRAY}[{i}]", high)
    elif isinstance(template, dict):
        _object(value, path, tuple(template), of=of)
        for k, v in template.items():
            _like(value[k], v, _at(path, k), k, of)
    elif isinstance(template, str):
        if value != template:
            _bad(path, repr(template), value)
    elif type(template) is int:
        _int(value, path, _RNG_INT_LIMITS.get(key, 2**128 - 1))
    elif isinstance(template, (bool, float)) or template is None:
        _setting(value, path)


def _check_optimizer_fields(saved):
    """The optimiser's JSON, whatever optimiser it is: groups of settings over distinct
    parameter indices, and per-parameter state (numbers, or references to its arrays)."""
    if saved is None:
        return
    _object(saved, "optimizer", ("class", "file", "param_groups", "state"))
    _text(saved["class"], "optimizer.class")
    if saved["file"] != OPTIMIZER_FILE:
        _bad("optimizer.file", f'"{OPTIMIZER_FILE}"', saved["file"])
    listed = set()
    for i, group in enumerate(_list(saved["param_groups"], "optimizer.param_groups", MAX_ENTRIES)):
        path = f"optimizer.param_groups[{i}]"
        _object(group, path, max_items=100)
        if "params" not in group:
            _missing(f"{path}.params")
        for j, index in enumerate(_list(group["params"], f"{path}.params", MAX_TENSORS)):
            if _int(index, f"{path}.params[{j}]", MAX_TENSORS - 1) in listed:
                raise _FieldError(f'field "{path}.params[{j}]" repeats parameter {index}; each parameter is in one '
                                  "place")
            listed.add(index)
        for key, value in group.items():
            if key != "params":
                _text(key, _at(path, key), 100)
                _setting(value, _at(path, key))
    state = _object(saved["state"], "optimizer.state", max_items=MAX_TENSORS)
    names = set()  # every parameter's state has the same entries (Adam: step, exp_avg, exp_avg_sq)
    for key, values in state.items():
        path = _at("optimizer.state", key)
        if not _STATE_INDEX.fullmatch(key) or int(key) not in listed:
            raise _FieldError(f'field "{path}" must be the index of a parameter that "optimizer.param_groups" lists')
        names.update(_object(values, path, max_items=100))
    for key, values in state.items():
        path = _at("optimizer.state", key)
        for name in sorted(names - set(values)):
            raise _FieldError(f'field "{_at(path, name)}" is missing (the state of other parameters has it)')
        for name, value in values.items():
            where = _at(path, name)
            _text(name, where, 100)
            if isinstance(value, dict):  # an array: in optimizer.safetensors, under the name the save gave it
                ref = f"state.{key}.{name}"
                if _object(value, where, (_TENSOR,))[_TENSOR] != ref:
                    _bad(f"{where}.{_TENSOR}", f'"{ref}"', value[_TENSOR])
            else:
                _number(value, where)


def _check_scheduler_fields(saved):
    if saved is None:
        return
    _object(saved, "scheduler", ("class", "state"))
    _text(saved["class"], "scheduler.class")
    for key, value in _object(saved["state"], "scheduler.state", max_items=100).items():
        _text(key, _at("scheduler.state", key), 100)
        _setting(value, _at("scheduler.state", key))


def _check_file_fields(files, has_optimizer):
    names = (MODEL_FILE, OPTIMIZER_FILE) if has_optimizer else (MODEL_FILE,)
    _object(files, "files", names)
    for name in names:
        path = _at("files", name)
        entry = _object(files[name], path, ("sha256", "bytes"))
        _digest(entry["sha256"], f"{path}.sha256")
        _int(entry["bytes"], f"{path}.bytes", MAX_TENSOR_FILE_BYTES)


# -- plugins ------------------------------------------------------------------------------------
def _split_source(source):
    """"minitensor-example-cosine 0.1.0" -> ("minitensor-example-cosine", "0.1.0"); a source that is
    not an installed distribution (built in, a plugin file or module, run time) -> (None, None)."""
    from .. import plugins

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
    from .. import plugins

    rows = {(r["kind"], r["name"]): r for r in plugins.describe()}
    by_class = {}
    for kind, name in rows:
        by_class.setdefault(plugins.lookup(kind, name), []).append((kind, name))
    used, covered = {}, set()

    def add(kind, name):
        row = rows.get((kind, name))
        source = row["source"] if row else "unknown"
        distribution, version = _split_source(source)
        used[(kind, name)] = {"kind": kind, "name": name, "source": source, "distribution": distribution,
                              "version": version, "class": row["class"] if row else None}

    for module in model.modules():
        for kind, attribute, part in (("scorer", "scorer_name", "scorer"), ("pooling", "pooling_name", "pooling"),
                                      ("positional encoding", "positional_name", "positional")):
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
    from .. import plugins

    file_source, module_source = getattr(plugins, "FILE_SOURCE", "file "), getattr(plugins, "MODULE_SOURCE", "module ")
    source, distribution, version = entry["source"], entry["distribution"], entry["version"]
    what = f"{entry['kind']} {entry['name']!r}"
    if source == plugins.BUILT_IN:
        return (f"built-in {what} is not registered (was it unregistered? the checkpoint was written by minitensor "
                "with it built in)")
    if source == plugins.RUN_TIME:
        return (f"{what} ({entry['class']!r}) was registered at run time when saved; register it again with "
                "minitensor.plugins.register(...) before loading, or put it in a file and pass --plugin PATH "
                "(or MINITENSOR_PLUGINS=PATH)")
    if source.startswith(file_source):
        path = source[len(file_source):]
        if os.path.isabs(path) and path.isprintable():
            return (f"{what} came from the plugin file {path!r} when saved: pass --plugin {shlex.quote(path)} "
                    f"(or set MINITENSOR_PLUGINS={shlex.quote(path)})")
    elif source.startswith(module_source):
        module = source[len(module_source):]
        if _MODULE_NAME.fullmatch(module):
            return (f"{what} came from the plugin module {module!r} when saved: pass --plugin {module} "
                    f"(or set MINITENSOR_PLUGINS={module})")
    elif distribution is not None and _DISTRIBUTION_NAME.fullmatch(distribution):
        saved_from = distribution + (f" {version}" if version is not None and _VERSION.fullmatch(version) else "")
        return (f"{what} from {saved_from} is not installed: pip install {distribution}; or load its plugin file "
                f"or module with {_PLUGIN_OPTION}")
    return (f"{what} from {source!r} ({entry['class']!r}) is not installed; install it, or load it with "
            f"{_PLUGIN_OPTION}")


def _check_plugins(saved):
    """CheckpointError naming every saved plugin (validated entries) that is not installed now."""
    from .. import plugins

    installed = {(r["kind"], r["name"]): r for r in plugins.describe()}
    missing = []
    for entry in saved:
        here = installed.get((entry["kind"], entry["name"]))
        if here is None:
            missing.append(_missing_plugin(entry))
        elif entry["distribution"] and _split_source(here["source"])[0] != entry["distribution"]:
            warnings.warn(f"checkpoint: {entry['kind']} {entry['name']!r} was saved from {entry['source']!r}; here "
                          f"it comes from {here['source']}", RuntimeWarning, stacklevel=3)
    if missing:
        raise CheckpointError("the checkpoint needs plugin(s) that are not installed; nothing was changed:\n  "
                              + "\n  ".join(missing))


# -- writing ------------------------------------------------------------------------------------
def _write_file(path, data):
    """Write ``data`` to a new file and force it to disk before returning."""
    with open(path, "xb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path):
    """Make a directory's entries (new files, renames) durable. Not possible on Windows,
    where the rename itself is durable enough; skip quietly there."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _rename(src, dst):
    os.rename(src, dst)


def _siblings(directory, tag):
    parent, name = os.path.split(directory)
    prefix = f".{name}.{tag}-"
    try:
        entries = os.listdir(parent)
    except OSError:
        return []
    found = [os.path.join(parent, e) for e in entries if e.startswith(prefix)]
    return sorted(found, key=lambda p: os.path.getmtime(p) if os.path.exists(p) else 0, reverse=True)


def _is_regular(path):
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def _backup(directory):
    """The complete previous checkpoint left beside ``directory`` by a save that died between
    its two renames, or None. (A save deletes superseded backups, so there is at most one.)"""
    for path in _siblings(directory, "old"):
        if _is_regular(os.path.join(path, CHECKPOINT_JSON)):
            return path
    return None


def _remove_leftovers(directory):
    """Delete what interrupted saves left beside ``directory``: unfinished copies (.<name>.tmp-*)
    and, once ``directory`` holds the checkpoint, the backups (.<name>.old-*) it supersedes. A
    backup is renamed to a .tmp- name first (atomically), so that a deletion cut short never
    leaves a half-deleted folder that looks like a backup."""
    parent, name = os.path.split(directory)
    if os.path.isdir(directory):
        for old in _siblings(directory, "old"):
            try:
                _rename(old, os.path.join(parent, f".{name}.tmp-{uuid.uuid4().hex[:12]}"))
            except OSError:
                pass  # gone already, or not ours to move: a later save tries again
    for stale in _siblings(directory, "tmp"):
        shutil.rmtree(stale, ignore_errors=True)


def _check_target(directory):
    """Refuse to replace anything but a checkpoint: the swap deletes the old directory."""
    if not os.path.lexists(directory):
        return
    if not os.path.isdir(directory) or os.path.islink(directory):
        raise CheckpointError(f"cannot save a checkpoint to {directory}: it exists and is not a directory")
    entries = os.listdir(directory)
    foreign = sorted(e for e in entries if e not in _OWN_FILES)
    if foreign or (entries and CHECKPOINT_JSON not in entries):
        raise CheckpointError(
            f"cannot save a checkpoint to {directory}: it holds other files ({', '.join(foreign or entries)}), which "
            "replacing the checkpoint would delete; save into a directory of its own (e.g. "
            f"{os.path.join(directory, 'checkpoint')})"
        )


def save_checkpoint(directory, model, optimizer=None, scheduler=None, config=None, vocabs=None, extra=None, *,
                    step=None, epoch=None):
    """Save ``model`` (and optionally the training state) as the checkpoint ``directory``.

    ``config``: a dict of JSON data describing how the model was built (enough to build it
    again); ``vocabs``: a Vocab or {name: Vocab}; ``extra``: a dict of any JSON data (e.g. the
    data loader's ``Batches.state_dict()``); ``step``/``epoch``: where training is
    (non-negative integers). The random generators' states are saved too, so training resumes
    exactly. What is saved is checked as a load would check it, so every checkpoint written
    loads. The write is atomic (see the module docstring): an existing checkpoint there is
    replaced only once the new one is complete, and the leftovers of earlier interrupted saves
    are deleted. Returns the checkpoint's absolute path.
    """
    from safetensors.numpy import save as safetensors_save  # lazily: `import minitensor` stays light

    directory = os.path.abspath(os.fspath(directory))
    parent, name = os.path.split(directory)
    if not name:
        raise CheckpointError(f"cannot save a checkpoint as {directory!r}: give a directory name")
    kill_at = _kill_step()

    # 1. Everything in memory first: an unsavable value must fail before a file is touched.
    state = model.state_dict()
    weights = {key: numpy.ascontiguousarray(t.numpy()) for key, t in state.items()}
    files = {MODEL_FILE: safetensors_save(weights, metadata={"format": FORMAT})}
    params = list(model.parameters())
    body = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "minitensor_version": _minitensor_version(),
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "model": {"class": _qualname(model), "device": params[0].device if params else "cpu",
                  "num_parameters": model.num_parameters(), "keys": list(weights)},
        "config": _jsonable(config, "config"),
        "plugins": model_plugins(model),
        "vocabs": _vocab_dicts(vocabs),
        "rng": get_rng_state(),
        "optimizer": None,
        "scheduler": None,
        "step": _jsonable(step, "step"),
        "epoch": _jsonable(epoch, "epoch"),
        "extra": _jsonable(extra, "extra"),
    }
    if optimizer is not None:
        saved = optimizer.state_dict()
        arrays, index = {}, {}
        for i, values in saved["state"].items():
            entry = {}
            for key, value in values.items():
                if isinstance(value, numpy.ndarray):
                    tensor_key = f"state.{i}.{key}"
                    arrays[tensor_key] = numpy.ascontiguousarray(value)
                    entry[key] = {_TENSOR: tensor_key}
                else:
                    entry[key] = _jsonable(value, f"optimizer state[{i}][{key!r}]")
            index[str(i)] = entry
        files[OPTIMIZER_FILE] = safetensors_save(arrays, metadata={"format": FORMAT})
        body["optimizer"] = {"class": _qualname(optimizer), "file": OPTIMIZER_FILE,
                             "param_groups": _jsonable(saved["param_groups"], "optimizer param_groups"),
                             "state": index}
    if scheduler is not None:
        body["scheduler"] = {"class": _qualname(scheduler),
                             "state": _jsonable(scheduler.state_dict(), "scheduler state")}
    body["files"] = {fname: {"sha256": _sha256(data), "bytes": len(data)} for fname, data in files.items()}
    try:  # what load_checkpoint would refuse is refused now, while the previous checkpoint is intact
        _check_depth(body)
        _check_fields(body)
    except _FieldError as e:
        raise CheckpointError(f"cannot save a checkpoint to {directory}: {e}") from None
    body["content_sha256"] = _sha256(_canonical(body))
    files[CHECKPOINT_JSON] = (json.dumps(body, indent=1) + "\n").encode()
    if len(files[CHECKPOINT_JSON]) > MAX_JSON_BYTES:
        raise CheckpointError(f"cannot save a checkpoint to {directory}: its {CHECKPOINT_JSON} would be "
                              f"{len(files[CHECKPOINT_JSON]):,} bytes, more than the {MAX_JSON_BYTES:,} a loader "
                              "accepts (MAX_JSON_BYTES); keep large data out of config and extra")

    # 2. Put right what an interrupted save left; write a complete copy beside the target.
    os.makedirs(parent, exist_ok=True)
    if not os.path.lexists(directory) and _backup(directory):
        _rename(_backup(directory), directory)  # an earlier save died between its renames
    _check_target(directory)
    _remove_leftovers(directory)
    tmp = tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=parent)
    backup = None
    try:
        for fname in (MODEL_FILE, OPTIMIZER_FILE, CHECKPOINT_JSON):  # the index last
            if fname in files:
                _write_file(os.path.join(tmp, fname), files[fname])
        _kill_point("after-tmp-files", kill_at)
        _fsync_dir(tmp)
        _kill_point("after-fsync", kill_at)
        # 3. Swap it in: each rename is atomic; see the module docstring.
        if os.path.lexists(directory):
            backup = os.path.join(parent, f".{name}.old-{uuid.uuid4().hex[:12]}")
            _rename(directory, backup)
            _kill_point("after-first-rename", kill_at)
        _rename(tmp, directory)
        _kill_point("after-second-rename", kill_at)
        _fsync_dir(parent)
    except BaseException:
        if backup is not None and not os.path.lexists(directory):
            _rename(backup, directory)
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    # 4. The new checkpoint is in place: delete the old one and any older leftovers.
    _kill_point("before-cleanup", kill_at)
    _remove_leftovers(directory)
    return directory


def _minitensor_version():
    import minitensor

    return minitensor.__version__


def _vocab_dicts(vocabs):
    if vocabs is None:
        return {}
    if hasattr(vocabs, "to_dict"):
        vocabs = {"vocab": vocabs}
    if not isinstance(vocabs, dict):
        raise CheckpointError(f"vocabs must be a Vocab or a dict {{name: Vocab}}, got {type(vocabs).__name__}")
    return {str(k): _jsonable(v.to_dict(), f"vocab {k!r}") for k, v in vocabs.items()}


# -- reading ------------------------------------------------------------------------------------
def _file_kind(mode):
    for test, kind in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a directory"),
                       (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return "not a regular file"


def _open_regular(directory, fname, size=None, limit=None):
    """``directory/fname`` opened for reading, and its size, after checking that it is a regular
    file (not a symbolic link, device, FIFO or directory: /dev/zero would never end) whose size
    is the recorded ``size``, or at most ``limit``. The size is that of the opened file (fstat),
    so the file checked is the file read."""
    path = os.path.join(directory, fname)
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {directory} is incomplete: {fname} is missing") from None
    except OSError as e:
        raise CheckpointError(f"cannot read {path}: {e}") from e
    if not stat.S_ISREG(mode):
        raise CheckpointError(f"{path} is {_file_kind(mode)}; a checkpoint holds only regular files")
    # O_NOFOLLOW and O_NONBLOCK: if the file is swapped for a link or a FIFO after the check,
    # opening fails or returns at once (and fstat below refuses it), instead of following or hanging.
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        raise CheckpointError(f"cannot read {path}: {e}") from e
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise CheckpointError(f"{path} is {_file_kind(info.st_mode)}; a checkpoint holds only regular files")
        if size is not None and info.st_size != size:
            what = "truncated" if info.st_size < size else "damaged"
            raise CheckpointError(f"{path} is {what}: {info.st_size:,} bytes, {size:,} were written")
        if limit is not None and info.st_size > limit:
            raise CheckpointError(f"{path} is {info.st_size:,} bytes, more than the {limit:,} a checkpoint's "
                                  f"{fname} may have; it is not one minitensor wrote")
        return os.fdopen(fd, "rb"), info.st_size
    except BaseException:
        os.close(fd)
        raise


def _read_exactly(f, n, path):
    data = f.read(n)
    if len(data) != n:
        raise CheckpointError(f"{path} changed while it was being read (it is shorter than when opened)")
    return data


def _read_index(directory):
    """checkpoint.json, parsed and verified: at most MAX_JSON_BYTES, nested at most MAX_DEPTH
    levels, of a known format and version, its own hash right. Its fields are checked next."""
    path = os.path.join(directory, CHECKPOINT_JSON)
    f, size = _open_regular(directory, CHECKPOINT_JSON, limit=MAX_JSON_BYTES)
    with f:
        raw = f.read(size + 1)  # not more: read(n) allocates n bytes before it reads
    if len(raw) != size:
        raise CheckpointError(f"{path} changed while it was being read")
    try:
        body = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:  # ValueError: JSON, or an int of 4,300+ digits
        raise CheckpointError(f"{path} is corrupted (not valid JSON: {e})") from e
    if not isinstance(body, dict):
        raise CheckpointError(f"{directory} is not a minitensor checkpoint ({CHECKPOINT_JSON} holds {_show(body)}, "
                              "not a JSON object)")
    _check_depth(body)
    if body.get("format") != FORMAT:
        if "format" not in body:
            raise _FieldError(f'field "format" is missing: {directory} is not a minitensor checkpoint')
        _bad("format", f'"{FORMAT}" (is this a minitensor checkpoint?)', body["format"])
    if "format_version" not in body:
        _missing("format_version")
    version = body["format_version"]
    if type(version) is not int:
        _bad("format_version", "an integer", version)
    if not 1 <= version <= FORMAT_VERSION:
        writer = f" (it was written by minitensor {_show(body.get('minitensor_version'))}: upgrade)"
        raise _FieldError(f'field "format_version" is {_show(version)}: this minitensor ({_minitensor_version()}) '
                          f"reads format version(s) 1..{FORMAT_VERSION}" + (writer if version > FORMAT_VERSION else ""))
    if "content_sha256" not in body:
        _missing("content_sha256")
    claimed = _digest(body.pop("content_sha256"), "content_sha256")
    if claimed != _sha256(_canonical(body)):
        raise CheckpointError(f"{path} is corrupted or was edited (its content hash does not match)")
    return body


# safetensors dtype -> NumPy dtype, for those safetensors.numpy reads
_SAFETENSORS_DTYPES = {"BOOL": "bool", "U8": "uint8", "I8": "int8", "U16": "uint16", "I16": "int16", "F16": "float16",
                       "U32": "uint32", "I32": "int32", "F32": "float32", "U64": "uint64", "I64": "int64",
                       "F64": "float64"}


def _parse_header(raw, data_bytes, path):
    """A safetensors header (JSON: name -> dtype, shape, data_offsets) as {name: (shape, dtype)},
    after checking that the arrays exactly tile the ``data_bytes`` that follow it."""
    def bad(reason):
        raise CheckpointError(f"{path} cannot be parsed as safetensors (damaged?): {reason}")

    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        bad(f"its header is not valid JSON ({e})")
    if not isinstance(header, dict):
        bad("its header is not a JSON object")
    entries, spans = {}, []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if not (isinstance(info, dict) and set(info) == {"dtype", "shape", "data_offsets"}
                and info["dtype"] in _SAFETENSORS_DTYPES and isinstance(info["shape"], list)
                and all(type(n) is int and 0 <= n <= MAX_INT for n in info["shape"])
                and isinstance(info["data_offsets"], list) and len(info["data_offsets"]) == 2
                and all(type(n) is int for n in info["data_offsets"])):
            bad(f"array {name[:80]!r} is not described by a dtype NumPy reads, a shape and two data offsets")
        dtype = numpy.dtype(_SAFETENSORS_DTYPES[info["dtype"]])
        begin, end = info["data_offsets"]
        needed = math.prod(info["shape"]) * dtype.itemsize
        if end - begin != needed:
            bad(f"array {name[:80]!r}: its shape and dtype need {needed:,} bytes, its offsets give {end - begin:,}")
        spans.append((begin, end))
        entries[name] = (tuple(info["shape"]), dtype)
    position = 0
    for begin, end in sorted(spans):
        if begin != position:
            bad(f"its arrays do not tile the data (a gap or an overlap at byte {position:,})")
        position = end
    if position != data_bytes:
        bad(f"its arrays cover {position:,} bytes of data, the file holds {data_bytes:,}")
    return entries


def _read_tensors(directory, fname, record, check_header, read_arrays=True):
    """One safetensors file: ({name: (shape, dtype)} from its header, {name: array} or None).
    Its size is checked against ``record`` before anything is read; its header (names, dtypes,
    shapes) by ``check_header(entries)`` before the arrays are read (``read_arrays=False``: not
    at all); its SHA-256 before they are built."""
    from safetensors.numpy import load as safetensors_load

    path = os.path.join(directory, fname)
    size = record["bytes"]
    f, _ = _open_regular(directory, fname, size=size)
    with f:
        if size < 8:
            raise CheckpointError(f"{path} cannot be parsed as safetensors (damaged?): it has {size} bytes")
        header_bytes = int.from_bytes(_read_exactly(f, 8, path), "little")
        if header_bytes > min(size - 8, MAX_JSON_BYTES):
            raise CheckpointError(f"{path} cannot be parsed as safetensors (damaged?): a header of "
                                  f"{header_bytes:,} bytes in a file of {size:,}")
        entries = _parse_header(_read_exactly(f, header_bytes, path), size - 8 - header_bytes, path)
        check_header(entries)
        if not read_arrays:
            return entries, None
        f.seek(0)
        data = _read_exactly(f, size, path)  # the whole file in one piece, as safetensors reads it
        if f.read(1):
            raise CheckpointError(f"{path} grew while it was being read")
    if _sha256(data) != record["sha256"]:
        raise CheckpointError(f"{path} is corrupted: its SHA-256 does not match the one recorded when it was saved")
    try:
        return entries, safetensors_load(data)
    except Exception as e:
        raise CheckpointError(f"{path} cannot be parsed as safetensors: {e}") from e


def _key_difference(wanted, found):
    """"'a', 'b' and 3 more": a few names, however many differ."""
    names = sorted(wanted - found)
    shown = ", ".join(repr(n[:80]) for n in names[:3])
    return shown + (f" and {len(names) - 3:,} more" if len(names) > 3 else "")


def _check_keys(entries, keys, field, fname):
    """The arrays of ``fname`` (its header) are those the field ``field`` lists."""
    if set(entries) != set(keys):
        parts = [f"{fname} lacks {_key_difference(set(keys), set(entries))}" if set(keys) - set(entries) else "",
                 f"it does not list {_key_difference(set(entries), set(keys))}" if set(entries) - set(keys) else ""]
        raise _FieldError(f'field "{field}" does not match the arrays in {fname}: ' + "; ".join(p for p in parts if p))


def _check_model(model, arrays, body):
    """CheckpointError listing every key and shape that differs between the checkpoint's arrays
    (``arrays``: key -> (shape, dtype), from model.safetensors' header) and the model."""
    own = model.state_dict(keep_vars=True)
    problems = []
    only_model = [k for k in own if k not in arrays]
    only_ckpt = [k for k in body["model"]["keys"] if k not in own]
    if only_model:
        problems.append("in the model, not in the checkpoint: " + ", ".join(map(repr, only_model)))
    if only_ckpt:
        problems.append("in the checkpoint, not in the model: " + ", ".join(map(repr, only_ckpt)))
    for key, target in own.items():
        if key in arrays:
            shape, dtype = arrays[key]
            if shape != tuple(target.shape):
                problems.append(f"{key!r}: checkpoint shape {shape}, model shape {tuple(target.shape)}")
            elif dtype.kind not in "fiub" or (dtype.kind == "f") != (target.dtype.kind == "f"):
                problems.append(f"{key!r}: checkpoint dtype {dtype}, model dtype {target.dtype}")
    if problems:
        config = json.dumps(body["config"])
        raise CheckpointError(
            f"the checkpoint does not fit this {type(model).__name__} (saved from a {body['model']['class']} built "
            f"with another config? saved config: {config[:300]}{'...' if len(config) > 300 else ''}); nothing was "
            "changed:\n  " + "\n  ".join(problems)
        )
    if body["model"]["num_parameters"] != model.num_parameters():
        raise _FieldError(f'field "model.num_parameters" is {body["model"]["num_parameters"]:,}, but this '
                          f"{type(model).__name__}, with the same arrays, has {model.num_parameters():,} parameters")


def _check_optimizer(optimizer, body):
    """The saved optimiser is of ``optimizer``'s class, with as many groups of as many parameters,
    and settings it accepts. Returns {saved parameter index: parameter}."""
    saved = body["optimizer"]
    name = type(optimizer).__name__
    if saved is None:
        raise CheckpointError("the checkpoint has no optimizer state (saved without an optimizer); nothing was changed")
    if saved["class"] != _qualname(optimizer):
        raise CheckpointError(f"the checkpoint's optimizer is a {saved['class']}, not a {_qualname(optimizer)}; "
                              "nothing was changed")
    groups = saved["param_groups"]
    if len(groups) != len(optimizer.param_groups):
        raise _FieldError(f'field "optimizer.param_groups" has {len(groups)} group(s), this {name} '
                          f"{len(optimizer.param_groups)}")
    by_index = {}
    for i, (group, live) in enumerate(zip(groups, optimizer.param_groups)):
        path = f"optimizer.param_groups[{i}]"
        if len(group["params"]) != len(live["params"]):
            raise _FieldError(f'field "{path}.params" lists {len(group["params"])} parameter(s), this {name}\'s group '
                              f"{i} has {len(live['params'])}")
        by_index.update(zip(group["params"], live["params"]))
        for key in optimizer.defaults:
            if key not in group:
                _missing(_at(path, key))
        for key, value in group.items():
            if key != "params" and key in live:
                _same_kind(value, live[key], _at(path, key), name)
        settings = {k: tuple(v) if isinstance(optimizer.defaults.get(k), tuple) else v for k, v in group.items()}
        try:
            optimizer.check_hyperparameters({**live, **settings, "params": live["params"]})
        except (ValueError, TypeError, KeyError) as e:
            raise _FieldError(f'field "{path}" does not suit this {name}: {e}') from None
    return by_index


def _check_optimizer_header(entries, body, by_index):
    """The arrays of optimizer.safetensors are those the state refers to, each of its parameter's
    shape (or a scalar), floating point."""
    refs = {value[_TENSOR]: by_index[int(i)] for i, values in body["optimizer"]["state"].items()
            for value in values.values() if isinstance(value, dict)}
    _check_keys(entries, refs, "optimizer.state", OPTIMIZER_FILE)
    for key, (shape, dtype) in entries.items():
        param = refs[key]
        if shape not in (tuple(param.shape), ()) or dtype.kind != "f":
            raise CheckpointError(f"the checkpoint's optimizer state does not fit this optimizer: {OPTIMIZER_FILE} "
                                  f"holds {key!r} as {dtype} of shape {shape}, for a parameter of shape "
                                  f"{tuple(param.shape)}; nothing was changed")


def _optimizer_state(body, arrays):
    saved = body["optimizer"]
    state = {}
    for i, values in saved["state"].items():
        state[int(i)] = {key: arrays[value[_TENSOR]] if isinstance(value, dict) else value
                         for key, value in values.items()}
    return {"state": state, "param_groups": saved["param_groups"]}


def _dry_run_optimizer(optimizer, state_dict):
    """The optimiser's own checks, on a shallow clone: nothing of ``optimizer`` changes."""
    clone = copy.copy(optimizer)
    clone.param_groups = [dict(group) for group in optimizer.param_groups]
    clone.state = dict(optimizer.state)
    try:
        clone.load_state_dict(state_dict)
    except Exception as e:
        raise CheckpointError(f"the checkpoint's optimizer state does not fit this optimizer: {e}; "
                              "nothing was changed") from e


def _check_scheduler(scheduler, body):
    """The saved scheduler is of ``scheduler``'s class, its state has the same fields with the
    same kinds of values. Returns that state."""
    saved = body["scheduler"]
    name = type(scheduler).__name__
    if saved is None:
        raise CheckpointError("the checkpoint has no scheduler state (saved without a scheduler); nothing was changed")
    if saved["class"] != _qualname(scheduler):
        raise CheckpointError(f"the checkpoint's scheduler is a {saved['class']}, not a {_qualname(scheduler)}; "
                              "nothing was changed")
    own, state = scheduler.state_dict(), saved["state"]
    for key in state:
        if key not in own:
            raise _FieldError(f'field "{_at("scheduler.state", key)}" is not part of a {name}\'s state')
    for key, current in own.items():
        if key not in state:
            _missing(_at("scheduler.state", key))
        _same_kind(state[key], current, _at("scheduler.state", key), name)
    return state


def _rebuild_vocabs(body):
    from ..data.vocab import Vocab

    vocabs = {}
    for name, saved in body["vocabs"].items():
        try:
            vocabs[name] = Vocab.from_dict(saved)
        except (KeyError, TypeError, ValueError) as e:
            raise _FieldError(f'field "{_at("vocabs", name)}" cannot be rebuilt as a Vocab: {e}') from None
    return vocabs


def find_checkpoint(path, name="checkpoint"):
    """The checkpoint directory to pass to ``load_checkpoint`` for ``path``: ``path`` itself if it
    is a checkpoint (it holds checkpoint.json), or ``path/name`` if ``path`` is a run folder.
    A run folder whose ``name/`` is missing because a save was killed between its two renames
    (only the backup ".name.old-*" is there) gives ``path/name`` too: ``load_checkpoint`` then
    reads the backup. Anything else is a CheckpointError saying what is there and what is not.
    Only directory entries are looked at; ``load_checkpoint`` verifies the files."""
    path = os.path.abspath(os.fspath(path))
    if os.path.isdir(path):
        if os.path.lexists(os.path.join(path, CHECKPOINT_JSON)):
            return path
        target = os.path.join(path, name)
        if os.path.isdir(target) or (not os.path.lexists(target) and _backup(target) is not None):
            return target
        if os.path.lexists(target):
            raise CheckpointError(f"no checkpoint in {path}: {name} there is not a directory")
        unfinished = _siblings(target, "tmp")
        raise CheckpointError(
            f"no checkpoint in {path}: it holds neither {CHECKPOINT_JSON} (a checkpoint) nor {name}/ (a run's "
            "checkpoint)" + (f"; only {os.path.basename(unfinished[0])}, a save that never completed" if unfinished
                             else "")
        )
    if not os.path.lexists(path) and _backup(path) is not None:
        return path  # the checkpoint itself, renamed away by a save that was killed
    if os.path.lexists(path):
        raise CheckpointError(f"{path} is not a directory: give a run folder or a checkpoint directory")
    raise CheckpointError(f"no checkpoint at {path}: it does not exist")


def load_checkpoint(directory, model=None, optimizer=None, scheduler=None, map_device="cpu", *, restore_rng=True,
                    read_arrays=True):
    """Load the checkpoint ``directory``: into ``model``, ``optimizer`` and ``scheduler`` when
    given, and restore the random generators (``restore_rng``) so training resumes exactly.

    Everything is verified before any value is loaded; a problem raises ``CheckpointError``
    and changes nothing. optimizer.safetensors is read only when an ``optimizer`` is given.
    ``read_arrays=False`` reads checkpoint.json and model.safetensors' header only
    (``state_dict`` is then None; the file's hash is checked by the load that reads it): what a
    program needs to build the model before loading into it (config, vocabs, shapes), without
    reading arrays that no model's shapes bound yet (MAX_TENSOR_FILE_BYTES is the only bound
    then). Returns a dict: ``config``, ``step``, ``epoch``, ``extra``, ``vocabs`` ({name:
    Vocab}), ``plugins``, ``model_class``, ``saved_device``, ``shapes`` (name -> shape, from
    the header), ``state_dict`` (name -> Tensor on ``map_device``), ``optimizer`` (class and
    param_groups, or None), ``scheduler`` (its
    state, or None), ``rng_state``, ``rng_skipped`` (devices whose generator was not
    restored), ``format_version``, ``minitensor_version``, ``created``, ``directory`` and
    ``recovered_from`` (the backup read when a save died between its renames, else None).
    A run folder is turned into its checkpoint directory by ``find_checkpoint``.
    """
    from ..backends import get_backend
    from ..tensor import tensor

    if not read_arrays and (model is not None or optimizer is not None):
        raise ValueError("load_checkpoint: read_arrays=False reads no arrays to load into a model or optimizer")
    directory = os.path.abspath(os.fspath(directory))
    source, recovered_from = directory, None
    if not os.path.exists(directory):
        backup = _backup(directory)
        if backup is None:
            raise CheckpointError(f"no checkpoint at {directory}: the directory does not exist")
        warnings.warn(f"checkpoint {directory} is missing: a save was interrupted; reading the previous checkpoint "
                      f"from {backup} (the next save_checkpoint there renames it back)", RuntimeWarning, stacklevel=2)
        source = recovered_from = backup
    elif not os.path.isdir(directory):
        raise CheckpointError(f"{directory} is not a checkpoint directory")
    try:
        get_backend(map_device)
    except Exception as e:
        raise CheckpointError(f"load_checkpoint: map_device={map_device!r}: {e}") from e

    # 1. Verify: files, sizes, JSON, every field, hashes, plugins, and the fit to what we load into.
    try:
        body = _read_index(source)
        _check_fields(body)
        files = body["files"]

        def check_model_header(entries):
            _check_keys(entries, body["model"]["keys"], "model.keys", MODEL_FILE)
            if model is not None:
                _check_model(model, entries, body)

        entries, arrays = _read_tensors(source, MODEL_FILE, files[MODEL_FILE], check_model_header, read_arrays)
        shapes = OrderedDict((k, entries[k][0]) for k in body["model"]["keys"])
        weights = None if arrays is None else OrderedDict((k, arrays[k]) for k in body["model"]["keys"])
        _check_plugins(body["plugins"])
        opt_state = None
        if optimizer is not None:
            by_index = _check_optimizer(optimizer, body)
            _, opt_arrays = _read_tensors(source, OPTIMIZER_FILE, files[OPTIMIZER_FILE],
                                          lambda entries: _check_optimizer_header(entries, body, by_index))
            opt_state = _optimizer_state(body, opt_arrays)
            _dry_run_optimizer(optimizer, opt_state)
        sched_state = _check_scheduler(scheduler, body) if scheduler is not None else None
        rng_state = body["rng"]
        if restore_rng:
            try:
                _check_rng_state(rng_state)  # NumPy's own checks of the values
            except ValueError as e:
                raise _FieldError(f'field "rng": {e}') from None
        vocabs = _rebuild_vocabs(body)
    except _FieldError as e:
        raise CheckpointError(f"checkpoint {source}: {e}") from None

    # 2. Load: nothing below can fail on account of the checkpoint.
    if model is not None:
        model.load_state_dict(weights)
    if optimizer is not None:
        optimizer.load_state_dict(opt_state)
    if scheduler is not None:
        scheduler.load_state_dict(copy.deepcopy(sched_state))
    skipped = set_rng_state(rng_state) if restore_rng else None
    return {
        "directory": directory,
        "recovered_from": recovered_from,
        "format_version": body["format_version"],
        "minitensor_version": body["minitensor_version"],
        "created": body["created"],
        "model_class": body["model"]["class"],
        "saved_device": body["model"]["device"],
        "config": body["config"],
        "plugins": body["plugins"],
        "vocabs": vocabs,
        "step": body["step"],
        "epoch": body["epoch"],
        "extra": body["extra"],
        "optimizer": None if body["optimizer"] is None else
        {"class": body["optimizer"]["class"], "param_groups": body["optimizer"]["param_groups"]},
        "scheduler": body["scheduler"] and body["scheduler"]["state"],
        "rng_state": rng_state,
        "rng_skipped": skipped,
        "shapes": shapes,
        "state_dict": None if weights is None else
        OrderedDict((k, tensor(v, device=map_device)) for k, v in weights.items()),
    }
