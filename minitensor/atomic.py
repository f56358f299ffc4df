"""Files written whole or not at all.

``write_atomic(path, data)`` writes to a temporary file beside ``path`` and then renames it over
``path`` (``os.replace``: atomic on POSIX and Windows). A reader sees the old file or the new
one, never half of one, and an error or Ctrl-C midway leaves ``path`` as it was. The graphs and
vocabularies of an export, a BPE tokenizer, an explain page, a graph's SVG, ``mt.save``'s
tensors and the training figures are all written this way; checkpoints, which are folders,
have their own scheme (train/checkpoint/).
"""

import errno
import os
import secrets


def write_atomic(path, data):
    """Write ``data`` to ``path`` atomically and return ``path``. ``data``: bytes, a str (written
    as UTF-8), or a function that writes into the binary file it is given (a figure's savefig).

    A ``path`` that names a folder, or a file in a folder that does not exist, is an ``OSError``
    that names ``path``, raised before anything is written: the temporary file goes beside the
    target, so without this check ``"runs/"`` would write it into ``runs``' parent and the error
    would name the temporary file instead of the path the caller gave."""
    path = os.fspath(path)
    folder, name = os.path.split(os.path.abspath(path))
    if not path:
        raise FileNotFoundError(errno.ENOENT, "an empty path names no file", path)
    if os.path.basename(path) in ("", ".", "..") or os.path.isdir(path):  # "runs/", "a/..", "runs"
        raise IsADirectoryError(errno.EISDIR, "that is a folder; give the name of a file in it", path)
    if not os.path.isdir(folder):
        why = "it is a file, not a folder" if os.path.exists(folder) else "no such folder"
        raise FileNotFoundError(errno.ENOENT, f"cannot write {name} in {folder}: {why}", path)
    tmp = os.path.join(folder, f".{name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    # O_EXCL: never someone else's file; mode 0o666 less the umask, as a plain open() gives
    # (tempfile.mkstemp would make it 0o600, private to its owner)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            if callable(data):
                data(f)
            else:
                f.write(data.encode("utf-8") if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path
