"""Whether a checkpoint fits what it is loaded into: the model's keys, shapes and dtypes (from
model.safetensors' header, before its arrays are read), the optimiser's class, groups, settings
and arrays, the scheduler's class and state. load.py calls these before it changes anything.
"""

import copy
import json

from .content import _qualname
from .spec import _TENSOR, OPTIMIZER_FILE, CheckpointError, _FieldError
from .values import _at, _missing, _same_kind


def _key_difference(wanted, found):
    """ "'a', 'b' and 3 more": a few names, however many differ."""
    names = sorted(wanted - found)
    shown = ", ".join(repr(n[:80]) for n in names[:3])
    return shown + (f" and {len(names) - 3:,} more" if len(names) > 3 else "")


def _check_keys(entries, keys, field, fname):
    """The arrays of ``fname`` (its header) are those the field ``field`` lists."""
    if set(entries) != set(keys):
        parts = [
            f"{fname} lacks {_key_difference(set(keys), set(entries))}" if set(keys) - set(entries) else "",
            f"it does not list {_key_difference(set(entries), set(keys))}" if set(entries) - set(keys) else "",
        ]
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
        raise _FieldError(
            f'field "model.num_parameters" is {body["model"]["num_parameters"]:,}, but this '
            f"{type(model).__name__}, with the same arrays, has {model.num_parameters():,} parameters"
        )


def _saved_record(body, kind, a_kind, live):
    """``body[kind]`` (the saved optimiser or scheduler), refused unless it is there and of
    ``live``'s class: the object being loaded into."""
    saved = body[kind]
    if saved is None:
        raise CheckpointError(f"the checkpoint has no {kind} state (saved without {a_kind}); nothing was changed")
    if saved["class"] != _qualname(live):
        raise CheckpointError(
            f"the checkpoint's {kind} is a {saved['class']}, not a {_qualname(live)}; nothing was changed"
        )
    return saved


def _check_optimizer(optimizer, body):
    """The saved optimiser is of ``optimizer``'s class, with as many groups of as many parameters,
    and settings it accepts. Returns {saved parameter index: parameter}."""
    saved = _saved_record(body, "optimizer", "an optimizer", optimizer)
    name = type(optimizer).__name__
    groups = saved["param_groups"]
    if len(groups) != len(optimizer.param_groups):
        raise _FieldError(
            f'field "optimizer.param_groups" has {len(groups)} group(s), this {name} {len(optimizer.param_groups)}'
        )
    by_index = {}
    for i, (group, live) in enumerate(zip(groups, optimizer.param_groups)):
        path = f"optimizer.param_groups[{i}]"
        if len(group["params"]) != len(live["params"]):
            raise _FieldError(
                f'field "{path}.params" lists {len(group["params"])} parameter(s), this {name}\'s group '
                f"{i} has {len(live['params'])}"
            )
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
    refs = {
        value[_TENSOR]: by_index[int(i)]
        for i, values in body["optimizer"]["state"].items()
        for value in values.values()
        if isinstance(value, dict)
    }
    _check_keys(entries, refs, "optimizer.state", OPTIMIZER_FILE)
    for key, (shape, dtype) in entries.items():
        param = refs[key]
        if shape not in (tuple(param.shape), ()) or dtype.kind != "f":
            raise CheckpointError(
                f"the checkpoint's optimizer state does not fit this optimizer: {OPTIMIZER_FILE} "
                f"holds {key!r} as {dtype} of shape {shape}, for a parameter of shape "
                f"{tuple(param.shape)}; nothing was changed"
            )


def _optimizer_state(body, arrays):
    saved = body["optimizer"]
    state = {}
    for i, values in saved["state"].items():
        state[int(i)] = {
            key: arrays[value[_TENSOR]] if isinstance(value, dict) else value for key, value in values.items()
        }
    return {"state": state, "param_groups": saved["param_groups"]}


def _dry_run_optimizer(optimizer, state_dict):
    """The optimiser's own checks, on a shallow clone: nothing of ``optimizer`` changes."""
    clone = copy.copy(optimizer)
    clone.param_groups = [dict(group) for group in optimizer.param_groups]
    clone.state = dict(optimizer.state)
    try:
        clone.load_state_dict(state_dict)
    except Exception as e:
        raise CheckpointError(
            f"the checkpoint's optimizer state does not fit this optimizer: {e}; nothing was changed"
        ) from e


def _check_scheduler(scheduler, body):
    """The saved scheduler is of ``scheduler``'s class, its state has the same fields with the
    same kinds of values. Returns that state."""
    saved = _saved_record(body, "scheduler", "a scheduler", scheduler)
    name = type(scheduler).__name__
    own, state = scheduler.state_dict(), saved["state"]
    for key in state:
        if key not in own:
            raise _FieldError(f'field "{_at("scheduler.state", key)}" is not part of a {name}\'s state')
    for key, current in own.items():
        if key not in state:
            _missing(_at("scheduler.state", key))
        _same_kind(state[key], current, _at("scheduler.state", key), name)
    return state
