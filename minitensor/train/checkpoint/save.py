"""``save_checkpoint``, top to bottom: 1. everything built and checked in memory, 2. written
into a temporary folder beside the target, 3. swapped in by renames, 4. the leftovers cleared.
__init__.py tells why each instant is safe; disk.py holds the file operations, fields.py the
checks. Each named instant of a save (``SAVE_STEPS``) calls ``reached``, which does nothing: the
seam where the tests stop a save at every instant (``tests/kill_at.py``).
"""

import datetime
import json
import os
import shutil
import tempfile
import uuid

import numpy

from .content import _canonical, _jsonable, _minitensor_version, _qualname, _sha256
from .disk import _backup, _check_target, _fsync_dir, _remove_leftovers, _rename, _write_file
from .fields import _check_depth, _check_fields
from .plugins import model_plugins
from .rng import get_rng_state
from .spec import (
    _TENSOR,
    CHECKPOINT_JSON,
    FORMAT,
    FORMAT_VERSION,
    MAX_JSON_BYTES,
    MODEL_FILE,
    OPTIMIZER_FILE,
    CheckpointError,
    _FieldError,
)

# -- the named instants of a save ------------------------------------------------------------------
# In order; at each, save_checkpoint calls ``reached(step)``.
SAVE_STEPS = (
    "after-tmp-files",  # every file written and fsync'ed in the temporary directory
    "after-fsync",  # ... and the temporary directory's entries made durable
    "after-first-rename",  # the old checkpoint renamed to its backup (only when there was one)
    "after-second-rename",  # the new checkpoint renamed into place
    "before-cleanup",  # ... made durable; the backup and older leftovers not yet deleted
)


def save_checkpoint(
    directory, model, optimizer=None, scheduler=None, config=None, vocabs=None, extra=None, *, step=None, epoch=None
):
    """Save ``model`` (and optionally the training state) as the checkpoint ``directory``.

    ``config``: a dict of JSON data describing how the model was built (enough to build it
    again); ``vocabs``: a Vocab or {name: Vocab}; ``extra``: a dict of any JSON data (e.g. the
    data loader's ``Batches.state_dict()``); ``step``/``epoch``: where training is
    (non-negative integers). The random generators' states are saved too, so training resumes
    exactly. What is saved is checked as a load would check it, so every checkpoint written
    loads. The write is atomic (see __init__.py): an existing checkpoint there is
    replaced only once the new one is complete, and the leftovers of earlier interrupted saves
    are deleted. Returns the checkpoint's absolute path.
    """
    directory = os.path.abspath(os.fspath(directory))
    parent, name = os.path.split(directory)
    if not name:
        raise CheckpointError(f"cannot save a checkpoint as {directory!r}: give a directory name")

    # 1. Everything in memory first: an unsavable value must fail before a file is touched.
    files = _contents(directory, model, optimizer, scheduler, config, vocabs, extra, step, epoch)

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
        reached("after-tmp-files")
        _fsync_dir(tmp)
        reached("after-fsync")
        # 3. Swap it in: each rename is atomic; see __init__.py.
        if os.path.lexists(directory):
            backup = os.path.join(parent, f".{name}.old-{uuid.uuid4().hex[:12]}")
            _rename(directory, backup)
            reached("after-first-rename")
        _rename(tmp, directory)
        reached("after-second-rename")
        _fsync_dir(parent)
    except BaseException as e:
        if backup is not None and not os.path.lexists(directory):
            _rename(backup, directory)
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, OSError) and e.filename is None:  # a full disk names no file: say which save failed
            raise OSError(e.errno, e.strerror, directory) from e
        raise
    # 4. The new checkpoint is in place: delete the old one and any older leftovers.
    reached("before-cleanup")
    _remove_leftovers(directory)
    return directory


def _contents(directory, model, optimizer, scheduler, config, vocabs, extra, step, epoch):
    """The checkpoint's files, {file name: bytes}, built in memory from what save_checkpoint was
    given and checked as load_checkpoint checks them."""
    from safetensors.numpy import save as safetensors_save  # lazily: `import minitensor.train` stays light

    state = model.state_dict()
    weights = {key: numpy.ascontiguousarray(t.numpy()) for key, t in state.items()}
    files = {MODEL_FILE: safetensors_save(weights, metadata={"format": FORMAT})}
    params = list(model.parameters())
    body = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "minitensor_version": _minitensor_version(),
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "model": {
            "class": _qualname(model),
            "device": params[0].device if params else "cpu",
            "num_parameters": model.num_parameters(),
            "keys": list(weights),
        },
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
        files[OPTIMIZER_FILE], body["optimizer"] = _optimizer_record(optimizer)
    if scheduler is not None:
        body["scheduler"] = {
            "class": _qualname(scheduler),
            "state": _jsonable(scheduler.state_dict(), "scheduler state"),
        }
    body["files"] = {fname: {"sha256": _sha256(data), "bytes": len(data)} for fname, data in files.items()}
    try:  # what load_checkpoint would refuse is refused now, while the previous checkpoint is intact
        _check_depth(body)
        _check_fields(body)
    except _FieldError as e:
        raise CheckpointError(f"cannot save a checkpoint to {directory}: {e}") from None
    body["content_sha256"] = _sha256(_canonical(body))
    files[CHECKPOINT_JSON] = (json.dumps(body, indent=1) + "\n").encode()
    if len(files[CHECKPOINT_JSON]) > MAX_JSON_BYTES:
        raise CheckpointError(
            f"cannot save a checkpoint to {directory}: its {CHECKPOINT_JSON} would be "
            f"{len(files[CHECKPOINT_JSON]):,} bytes, more than the {MAX_JSON_BYTES:,} a loader "
            "accepts (MAX_JSON_BYTES); keep large data out of config and extra"
        )
    return files


def _optimizer_record(optimizer):
    """optimizer.safetensors (the optimiser's arrays, as bytes) and the optimiser's record in
    checkpoint.json, where each array is {"__tensor__": "<its key in that file>"}."""
    from safetensors.numpy import save as safetensors_save  # lazily: `import minitensor.train` stays light

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
    data = safetensors_save(arrays, metadata={"format": FORMAT})
    return data, {
        "class": _qualname(optimizer),
        "file": OPTIMIZER_FILE,
        "param_groups": _jsonable(saved["param_groups"], "optimizer param_groups"),
        "state": index,
    }


def _vocab_dicts(vocabs):
    if vocabs is None:
        return {}
    if hasattr(vocabs, "to_dict"):
        vocabs = {"vocab": vocabs}
    if not isinstance(vocabs, dict):
        raise CheckpointError(f"vocabs must be a Vocab or a dict {{name: Vocab}}, got {type(vocabs).__name__}")
    return {str(k): _jsonable(v.to_dict(), f"vocab {k!r}") for k, v in vocabs.items()}


def reached(step):
    """``save_checkpoint`` has reached ``step``, one of ``SAVE_STEPS``: nothing happens.

    A seam, not a feature: the checkpoint tests replace this function to kill their process
    at each instant of a save, as abruptly as a power cut (``tests/kill_at.py``), and show
    that every instant leaves a run that loads."""
