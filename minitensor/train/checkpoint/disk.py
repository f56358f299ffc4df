"""The file-system side of an atomic save: writing a file durably (fsync), renames, and the
folders a save leaves beside its target (".<name>.tmp-*" copies, ".<name>.old-*" backups),
which save.py clears and load.py and find_checkpoint read from. __init__.py says why.
"""

import os
import shutil
import stat
import uuid

from .spec import _OWN_FILES, CHECKPOINT_JSON, CheckpointError


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
