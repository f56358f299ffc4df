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

Every named instant of a save (``SAVE_STEPS``) calls ``save.reached(step)``, which does
nothing; the tests replace it to kill their process there (``tests/kill_at.py``) and check
that every instant of a save is recoverable.

The package, one job a file (each file's docstring says more):

    save.py      save_checkpoint, top to bottom: build in memory, write beside, swap in, clean up
    load.py      find_checkpoint and load_checkpoint: verify everything, then load
    spec.py      the format's names and version, the caps (MAX_*), CheckpointError
    values.py    one check per kind of value (an integer, a string, an object with these fields...)
    fields.py    checkpoint.json field by field, with those checks: its closed schema
    content.py   values as JSON data, the canonical form and its SHA-256, class names
    rng.py       the random generators' states: get_rng_state, set_rng_state
    plugins.py   which plugins a model uses; how to get back one that is missing
    disk.py      writing durably (fsync), renames, the .tmp-/.old- folders a save leaves beside
    reading.py   reading a checkpoint's files safely: regular files, sizes, the index, safetensors
    fit.py       whether a checkpoint fits the model, optimiser and scheduler it is loaded into

A test that replaces a helper (monkeypatch) replaces it in the file that calls it: the names
below are re-exported here to be read and called, and a change to one of them here reaches no
function (``ckpt.save._rename``, not ``ckpt._rename``; a cap in ``ckpt.fields``).
"""

from .content import _canonical, _sha256  # noqa: F401
from .fields import _BODY_FIELDS  # noqa: F401
from .load import find_checkpoint, load_checkpoint  # noqa: F401
from .plugins import _split_source, model_plugins  # noqa: F401
from .rng import get_rng_state, set_rng_state  # noqa: F401
from .save import SAVE_STEPS, save_checkpoint  # noqa: F401
from .spec import (
    CHECKPOINT_JSON,
    FORMAT,
    FORMAT_VERSION,
    MAX_DEPTH,
    MAX_ENTRIES,
    MAX_INT,  # noqa: F401
    MAX_JSON_BYTES,
    MAX_TENSOR_FILE_BYTES,
    MAX_TENSORS,
    MAX_TEXT_CHARS,
    MAX_TOKEN_CHARS,
    MAX_VOCAB_SIZE,
    MODEL_FILE,
    OPTIMIZER_FILE,
    CheckpointError,
)
