"""checkpoint.json's closed schema: every field checked by type and range (with the checks of
values.py) before any is used, and by save_checkpoint before it writes. A ``_FieldError`` names
the first bad field by its path. The caps come from spec.py.
"""

import re

import numpy

from ...backends import available_backends, get_backend
from .rng import _backend_generator, _encode_state
from .spec import (
    _NDARRAY,
    _TENSOR,
    FORMAT,
    FORMAT_VERSION,
    MAX_DEPTH,
    MAX_ENTRIES,
    MAX_TENSOR_FILE_BYTES,
    MAX_TENSORS,
    MAX_TOKEN_CHARS,
    MAX_VOCAB_SIZE,
    MODEL_FILE,
    OPTIMIZER_FILE,
    _FieldError,
)
from .values import _at, _bad, _digest, _int, _list, _missing, _number, _object, _setting, _show, _text, _unique

_STATE_INDEX = re.compile(r"0|[1-9][0-9]{0,8}")


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


_BODY_FIELDS = (
    "format",
    "format_version",
    "minitensor_version",
    "created",
    "model",
    "config",
    "plugins",
    "vocabs",
    "rng",
    "optimizer",
    "scheduler",
    "step",
    "epoch",
    "extra",
    "files",
)


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


def _check_plugin_fields(saved):
    from ... import plugins  # lazily: it imports pluggy, which `minitensor --help` never needs

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
        if tokens[: len(reserved)] != reserved:
            raise _FieldError(
                f'field "{path}.reserved_tokens" must be the first entries of "{path}.idx_to_token" '
                f"(a Vocab numbers them first), got {_show(reserved)}"
            )
        if reserved and "<unk>" not in reserved:  # none at all: a text LM's characters alone (special_tokens=False)
            raise _FieldError(
                f'field "{path}.reserved_tokens" must include "<unk>" (a Vocab with reserved tokens has it), '
                f"got {reserved[:8]!r:.200}"
            )


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
    _object(rng, "rng", ("host", "backends"))
    _check_generator_state(rng["host"], "rng.host")
    for device, state in _object(rng["backends"], "rng.backends", max_items=64).items():
        path = _at("rng.backends", device)
        _text(device, path, 100)
        backend = get_backend(device) if device in available_backends() else None
        if state is None:
            continue  # recorded as not restorable
        if backend is not None and hasattr(backend, "get_rng_state"):  # that backend's own kind of state
            _like(state, _encode_state(backend.get_rng_state()), path, of=f"a {device!r} backend's generator state")
        elif (backend is not None and _backend_generator(backend) is not None) or (
            isinstance(state, dict) and "bit_generator" in state
        ):
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
                raise _FieldError(
                    f'field "{path}.params[{j}]" repeats parameter {index}; each parameter is in one place'
                )
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
