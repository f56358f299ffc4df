"""Checkpoints: save a model and its training state, load them back, safely and atomically.

    save_checkpoint("runs/date/ckpt", model, optimizer, scheduler, config=config,
                    vocabs={"src": src_vocab, "tgt": tgt_vocab}, extra={"batches": loader.state_dict()},
                    step=step, epoch=epoch)
    ...
    info = load_checkpoint("runs/date/ckpt", model, optimizer, scheduler)   # resume exactly
    loader.load_state_dict(info["extra"]["batches"]); step = info["step"]

A checkpoint is a directory of three files, none of which is a pickle (loading a pickle runs
whatever code it names; these formats hold only numbers and text):

    model.safetensors       the model's state_dict: name -> array, in each tensor's own dtype
    optimizer.safetensors   the optimiser's per-parameter arrays (Adam's m and v ...), named
                            "state.<parameter index>.<name>"; only when an optimiser is saved
    checkpoint.json         everything else, as JSON:
        format, format_version   "minitensor-checkpoint", 1
        minitensor_version       the version that wrote it; created (UTC, ISO 8601)
        model                    class (module.qualname), device, num_parameters, keys (in order)
        config                   the caller's config dict (what built the model), or null
        plugins                  every plugin the model uses: kind, name, source ("built-in",
                                 "<distribution> <version>", "registered at run time"),
                                 distribution, version, class
        vocabs                   {name: Vocab.to_dict()}
        rng                      {"host": state, "backends": {device: state or null}}: the
                                 bit_generator.state dicts of mt.random.host_rng() and of each
                                 backend's generator (big integers stay exact JSON integers)
        optimizer                null, or class, param_groups and state, where an array is
                                 {"__tensor__": "<key in optimizer.safetensors>"}
        scheduler                null, or class and state (scheduler.state_dict())
        step, epoch, extra       the caller's training position and any JSON-safe extras
        files                    {file name: {"sha256": hex digest, "bytes": size}}
        content_sha256           SHA-256 of this JSON itself (canonical form, without this field)

Loading checks everything before it changes anything: files present, sizes and hashes right,
the JSON intact and of a known format version, the plugins installed, the state_dict keys
and shapes those of the model, the optimiser and scheduler of the saved classes. Any problem
is a ``CheckpointError`` naming it, and then the model, optimiser, scheduler and random
generators are exactly as they were.

Why a save cannot leave a half-written checkpoint: every file is written into a temporary
directory beside the target (same file system), flushed and fsync'ed; only then is the
complete directory renamed into place. A rename is atomic, so ``directory`` is at every
instant either the complete old checkpoint or the complete new one. Replacing an existing
checkpoint takes two renames (old -> ".<name>.old-*", new -> <name>) because no file system
call swaps two directories portably; if the process dies between them, ``directory`` is
absent for a moment but the complete old checkpoint sits beside it, and ``load_checkpoint``
reads it from there (the next ``save_checkpoint`` renames it back first). An exception during
a save (disk full, Ctrl-C) removes the temporary directory and restores the old one.
Two processes must not save to the same directory at the same time.
"""

import copy
import datetime
import hashlib
import json
import os
import shutil
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


class CheckpointError(RuntimeError):
    """A checkpoint cannot be saved or loaded: missing or damaged files, another model's
    weights, a plugin that is not installed... Loading that fails changes nothing."""


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
    NumPy's) is asked for its own; one with neither is recorded as None (not restorable).
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


# -- plugins ------------------------------------------------------------------------------------
def _split_source(source):
    """"minitensor-example-cosine 0.1.0" -> ("minitensor-example-cosine", "0.1.0")."""
    from .. import plugins

    if source in (plugins.BUILT_IN, plugins.RUN_TIME, "unknown") or source.startswith("entry point "):
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


def _check_plugins(saved):
    """CheckpointError naming every saved plugin that is not installed now."""
    from .. import plugins

    installed = {(r["kind"], r["name"]): r for r in plugins.describe()}
    missing = []
    for entry in saved:
        kind, name, source = entry.get("kind"), entry.get("name"), entry.get("source", "unknown")
        here = installed.get((kind, name))
        if here is not None:
            if entry.get("distribution") and _split_source(here["source"])[0] != entry["distribution"]:
                warnings.warn(f"checkpoint: {kind} {name!r} was saved from {source}; here it comes from "
                              f"{here['source']}", RuntimeWarning, stacklevel=3)
            continue
        if entry.get("distribution"):
            missing.append(f"{kind} {name!r} from {source} is not installed: pip install {entry['distribution']}")
        elif source == plugins.BUILT_IN:
            missing.append(f"built-in {kind} {name!r} is not registered (was it unregistered? the checkpoint was "
                           "written by minitensor with it built in)")
        elif source == plugins.RUN_TIME:
            missing.append(f"{kind} {name!r} ({entry.get('class')}) was registered at run time when saved; "
                           "register it again with minitensor.plugins.register(...) before loading")
        else:
            missing.append(f"{kind} {name!r} from {source} ({entry.get('class')}) is not installed")
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


def _backup(directory):
    """The complete previous checkpoint left beside ``directory`` by a save that died between
    its two renames, or None."""
    for path in _siblings(directory, "old"):
        if os.path.isfile(os.path.join(path, CHECKPOINT_JSON)):
            return path
    return None


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

    ``config``: JSON data describing how the model was built (enough to build it again);
    ``vocabs``: a Vocab or {name: Vocab}; ``extra``: any JSON data (e.g. the data loader's
    ``Batches.state_dict()``); ``step``/``epoch``: where training is. The random generators'
    states are saved too, so training resumes exactly. The write is atomic (see the module
    docstring): an existing checkpoint there is replaced only once the new one is complete.
    Returns the checkpoint's absolute path.
    """
    from safetensors.numpy import save as safetensors_save  # lazily: `import minitensor` stays light

    directory = os.path.abspath(os.fspath(directory))
    parent, name = os.path.split(directory)
    if not name:
        raise CheckpointError(f"cannot save a checkpoint as {directory!r}: give a directory name")

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
    body["content_sha256"] = _sha256(_canonical(body))
    files[CHECKPOINT_JSON] = (json.dumps(body, indent=1) + "\n").encode()

    # 2. A complete copy in a temporary directory beside the target, on disk.
    os.makedirs(parent, exist_ok=True)
    if not os.path.lexists(directory) and _backup(directory):
        _rename(_backup(directory), directory)  # an earlier save died between its renames
    _check_target(directory)
    for stale in _siblings(directory, "tmp"):  # left by a save that died while writing
        shutil.rmtree(stale, ignore_errors=True)
    tmp = tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=parent)
    backup = None
    try:
        for fname in (MODEL_FILE, OPTIMIZER_FILE, CHECKPOINT_JSON):  # the index last
            if fname in files:
                _write_file(os.path.join(tmp, fname), files[fname])
        _fsync_dir(tmp)
        # 3. Swap it in: each rename is atomic; see the module docstring.
        if os.path.lexists(directory):
            backup = os.path.join(parent, f".{name}.old-{uuid.uuid4().hex[:12]}")
            _rename(directory, backup)
        _rename(tmp, directory)
        _fsync_dir(parent)
    except BaseException:
        if backup is not None and not os.path.lexists(directory):
            _rename(backup, directory)
            backup = None
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if backup is not None:
        shutil.rmtree(backup, ignore_errors=True)
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
def _read(directory, fname):
    path = os.path.join(directory, fname)
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {directory} is incomplete: {fname} is missing") from None
    except OSError as e:
        raise CheckpointError(f"cannot read {path}: {e}") from e


def _read_index(directory):
    """checkpoint.json, parsed and verified (format, version, its own hash)."""
    raw = _read(directory, CHECKPOINT_JSON)
    try:
        body = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{os.path.join(directory, CHECKPOINT_JSON)} is corrupted (not valid JSON: {e})") from e
    if not isinstance(body, dict) or body.get("format") != FORMAT:
        raise CheckpointError(f"{directory} is not a minitensor checkpoint ({CHECKPOINT_JSON} has no "
                              f"\"format\": \"{FORMAT}\")")
    version = body.get("format_version")
    if not isinstance(version, int) or not 1 <= version <= FORMAT_VERSION:
        newer = isinstance(version, int) and version > FORMAT_VERSION
        raise CheckpointError(
            f"checkpoint {directory} has format version {version!r}; this minitensor "
            f"({_minitensor_version()}) reads version(s) 1..{FORMAT_VERSION}"
            + (f" (it was written by minitensor {body.get('minitensor_version')}: upgrade)" if newer else "")
        )
    claimed = body.pop("content_sha256", None)
    if claimed != _sha256(_canonical(body)):
        raise CheckpointError(f"{os.path.join(directory, CHECKPOINT_JSON)} is corrupted or was edited "
                              "(its content hash does not match)")
    return body


def _read_tensors(directory, fname, expected):
    """The arrays of one safetensors file, after checking its size and SHA-256."""
    from safetensors.numpy import load as safetensors_load

    if not isinstance(expected, dict):
        raise CheckpointError(f"checkpoint {directory}: {CHECKPOINT_JSON} does not list {fname} in \"files\"")
    data = _read(directory, fname)
    if len(data) != expected.get("bytes"):
        what = "truncated" if len(data) < expected.get("bytes", 0) else "damaged"
        raise CheckpointError(f"{os.path.join(directory, fname)} is {what}: {len(data)} bytes, "
                              f"{expected.get('bytes')} were written")
    if _sha256(data) != expected.get("sha256"):
        raise CheckpointError(f"{os.path.join(directory, fname)} is corrupted: its SHA-256 does not match the one "
                              "recorded when it was saved")
    try:
        return safetensors_load(data)
    except Exception as e:
        raise CheckpointError(f"{os.path.join(directory, fname)} cannot be parsed as safetensors: {e}") from e


def _check_model(model, weights, body):
    """CheckpointError listing every key and shape that differs between checkpoint and model."""
    own = model.state_dict(keep_vars=True)
    problems = []
    only_model = [k for k in own if k not in weights]
    only_ckpt = [k for k in weights if k not in own]
    if only_model:
        problems.append("in the model, not in the checkpoint: " + ", ".join(map(repr, only_model)))
    if only_ckpt:
        problems.append("in the checkpoint, not in the model: " + ", ".join(map(repr, only_ckpt)))
    for key, target in own.items():
        if key in weights:
            value = weights[key]
            if tuple(value.shape) != tuple(target.shape):
                problems.append(f"{key!r}: checkpoint shape {tuple(value.shape)}, model shape {tuple(target.shape)}")
            elif value.dtype.kind not in "fiub" or (value.dtype.kind == "f") != (target.dtype.kind == "f"):
                problems.append(f"{key!r}: checkpoint dtype {value.dtype}, model dtype {target.dtype}")
    if problems:
        saved = body["model"].get("class")
        raise CheckpointError(
            f"the checkpoint does not fit this {type(model).__name__} (saved from a {saved} built with another "
            f"config? saved config: {json.dumps(body.get('config'))}); nothing was changed:\n  " + "\n  ".join(problems)
        )


def _optimizer_state(body, arrays):
    saved = body["optimizer"]
    state = {}
    for i, values in saved["state"].items():
        entry = {}
        for key, value in values.items():
            if isinstance(value, dict) and _TENSOR in value:
                if value[_TENSOR] not in arrays:
                    raise CheckpointError(f"{OPTIMIZER_FILE} has no array {value[_TENSOR]!r}")
                entry[key] = arrays[value[_TENSOR]]
            else:
                entry[key] = value
        state[int(i)] = entry
    return {"state": state, "param_groups": saved["param_groups"]}


def _check_optimizer(optimizer, state_dict, body):
    if body.get("optimizer") is None:
        raise CheckpointError("the checkpoint has no optimizer state (saved without an optimizer); nothing was changed")
    if body["optimizer"].get("class") != _qualname(optimizer):
        raise CheckpointError(f"the checkpoint's optimizer is a {body['optimizer'].get('class')}, not a "
                              f"{_qualname(optimizer)}; nothing was changed")
    # A dry run on a shallow clone: the optimiser's own checks, with nothing of it changed.
    clone = copy.copy(optimizer)
    clone.param_groups = [dict(group) for group in optimizer.param_groups]
    clone.state = dict(optimizer.state)
    try:
        clone.load_state_dict(state_dict)
    except Exception as e:
        raise CheckpointError(f"the checkpoint's optimizer state does not fit this optimizer: {e}; "
                              "nothing was changed") from e


def _check_scheduler(scheduler, body):
    saved = body.get("scheduler")
    if saved is None:
        raise CheckpointError("the checkpoint has no scheduler state (saved without a scheduler); nothing was changed")
    if saved.get("class") != _qualname(scheduler):
        raise CheckpointError(f"the checkpoint's scheduler is a {saved.get('class')}, not a {_qualname(scheduler)}; "
                              "nothing was changed")
    unknown = set(saved["state"]) - set(scheduler.state_dict())
    if unknown:
        raise CheckpointError(f"the checkpoint's scheduler state has unknown field(s) {sorted(unknown)}; "
                              "nothing was changed")
    return saved["state"]


def load_checkpoint(directory, model=None, optimizer=None, scheduler=None, map_device="cpu", *, restore_rng=True):
    """Load the checkpoint ``directory``: into ``model``, ``optimizer`` and ``scheduler`` when
    given, and restore the random generators (``restore_rng``) so training resumes exactly.

    Everything is verified before any value is loaded; a problem raises ``CheckpointError``
    and changes nothing. Returns a dict: ``config``, ``step``, ``epoch``, ``extra``,
    ``vocabs`` ({name: Vocab}), ``plugins``, ``model_class``, ``saved_device``,
    ``state_dict`` (name -> Tensor on ``map_device``), ``optimizer`` (class and
    param_groups, or None), ``scheduler`` (its state, or None), ``rng_state``,
    ``rng_skipped`` (devices whose generator was not restored), ``format_version``,
    ``minitensor_version``, ``created``, ``directory`` and ``recovered_from`` (the backup
    read when a save died between its renames, else None).
    """
    from ..backends import get_backend
    from ..data.vocab import Vocab
    from ..tensor import tensor

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

    # 1. Verify: files, hashes, JSON, format, plugins, and the fit to what we load into.
    body = _read_index(source)
    try:
        get_backend(map_device)
    except Exception as e:
        raise CheckpointError(f"load_checkpoint: map_device={map_device!r}: {e}") from e
    try:
        files = body["files"]
        weights = _read_tensors(source, MODEL_FILE, files.get(MODEL_FILE))
        keys = [k for k in body["model"].get("keys", []) if k in weights]
        weights = OrderedDict((k, weights[k]) for k in keys + sorted(set(weights) - set(keys)))
        opt_arrays = None
        if body.get("optimizer") is not None:
            opt_arrays = _read_tensors(source, OPTIMIZER_FILE, files.get(OPTIMIZER_FILE))
    except (KeyError, TypeError, AttributeError) as e:
        raise CheckpointError(f"checkpoint {source}: {CHECKPOINT_JSON} lacks a field ({e!r})") from e
    _check_plugins(body.get("plugins", []))
    if model is not None:
        _check_model(model, weights, body)
    opt_state = None
    if optimizer is not None:
        opt_state = _optimizer_state(body, opt_arrays) if body.get("optimizer") is not None else None
        _check_optimizer(optimizer, opt_state, body)
    sched_state = _check_scheduler(scheduler, body) if scheduler is not None else None
    rng_state = body.get("rng")
    if restore_rng:
        try:
            _check_rng_state(rng_state)
        except ValueError as e:
            raise CheckpointError(f"checkpoint {source}: {e}; nothing was changed") from e
    try:
        vocabs = {k: Vocab.from_dict(v) for k, v in body.get("vocabs", {}).items()}
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"checkpoint {source}: a vocabulary cannot be rebuilt: {e}") from e

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
        "minitensor_version": body.get("minitensor_version"),
        "created": body.get("created"),
        "model_class": body["model"].get("class"),
        "saved_device": body["model"].get("device"),
        "config": body.get("config"),
        "plugins": body.get("plugins", []),
        "vocabs": vocabs,
        "step": body.get("step"),
        "epoch": body.get("epoch"),
        "extra": body.get("extra"),
        "optimizer": None if body.get("optimizer") is None else
        {"class": body["optimizer"]["class"], "param_groups": body["optimizer"]["param_groups"]},
        "scheduler": body.get("scheduler") and body["scheduler"]["state"],
        "rng_state": rng_state,
        "rng_skipped": skipped,
        "state_dict": OrderedDict((k, tensor(v, device=map_device)) for k, v in weights.items()),
    }
