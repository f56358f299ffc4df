"""``find_checkpoint`` (which folder holds a run's checkpoint) and ``load_checkpoint``, top to
bottom: 1. verify everything -- reading.py reads the files safely, fields.py checks every field,
plugins.py the plugins, fit.py the fit to the model, optimiser and scheduler -- and only then
2. load, which nothing in the checkpoint can make fail.
"""

import copy
import os
import warnings
from collections import OrderedDict

from ... import tensor
from ...backends import get_backend
from ...data.vocab import Vocab
from .disk import _backup, _siblings
from .fields import _check_fields
from .fit import (
    _check_keys,
    _check_model,
    _check_optimizer,
    _check_optimizer_header,
    _check_scheduler,
    _dry_run_optimizer,
    _optimizer_state,
)
from .plugins import _check_plugins
from .reading import _read_index, _read_tensors
from .rng import _check_rng_state, set_rng_state
from .spec import CHECKPOINT_JSON, MODEL_FILE, OPTIMIZER_FILE, CheckpointError, _FieldError
from .values import _at


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
            "checkpoint)"
            + (f"; only {os.path.basename(unfinished[0])}, a save that never completed" if unfinished else "")
        )
    if not os.path.lexists(path) and _backup(path) is not None:
        return path  # the checkpoint itself, renamed away by a save that was killed
    if os.path.lexists(path):
        raise CheckpointError(f"{path} is not a directory: give a run folder or a checkpoint directory")
    raise CheckpointError(f"no checkpoint at {path}: it does not exist")


def load_checkpoint(
    directory, model=None, optimizer=None, scheduler=None, map_device="cpu", *, restore_rng=True, read_arrays=True
):
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
    if not read_arrays and (model is not None or optimizer is not None):
        raise ValueError("load_checkpoint: read_arrays=False reads no arrays to load into a model or optimizer")
    directory = os.path.abspath(os.fspath(directory))
    source, recovered_from = _where_to_read(directory)
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
            _, opt_arrays = _read_tensors(
                source,
                OPTIMIZER_FILE,
                files[OPTIMIZER_FILE],
                lambda entries: _check_optimizer_header(entries, body, by_index),
            )
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
        "optimizer": None
        if body["optimizer"] is None
        else {"class": body["optimizer"]["class"], "param_groups": body["optimizer"]["param_groups"]},
        "scheduler": body["scheduler"] and body["scheduler"]["state"],
        "rng_state": rng_state,
        "rng_skipped": skipped,
        "shapes": shapes,
        "state_dict": None
        if weights is None
        else OrderedDict((k, tensor(v, device=map_device)) for k, v in weights.items()),
    }


def _where_to_read(directory):
    """Where the checkpoint ``directory`` is read from, and the backup that is when a save died
    between its two renames: (directory, None), or (backup, backup) with a warning."""
    if not os.path.exists(directory):
        backup = _backup(directory)
        if backup is None:
            raise CheckpointError(f"no checkpoint at {directory}: the directory does not exist")
        warnings.warn(
            f"checkpoint {directory} is missing: a save was interrupted; reading the previous checkpoint "
            f"from {backup} (the next save_checkpoint there renames it back)",
            RuntimeWarning,
            stacklevel=3,
        )
        return backup, backup
    if not os.path.isdir(directory):
        raise CheckpointError(f"{directory} is not a checkpoint directory")
    return directory, None


def _rebuild_vocabs(body):
    vocabs = {}
    for name, saved in body["vocabs"].items():
        try:
            vocabs[name] = Vocab.from_dict(saved)
        except (KeyError, TypeError, ValueError) as e:
            raise _FieldError(f'field "{_at("vocabs", name)}" cannot be rebuilt as a Vocab: {e}') from None
    return vocabs
