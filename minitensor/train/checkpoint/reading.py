"""Reading a checkpoint's files safely: regular files only, each one's size checked before it is
read and no more read than that, checkpoint.json parsed and its own hash verified, a safetensors
header parsed and checked (by the caller: fit.py's checks) before the arrays it describes.
"""

import json
import math
import os
import stat

import numpy

from .content import _canonical, _minitensor_version, _sha256
from .fields import _check_depth
from .spec import CHECKPOINT_JSON, FORMAT, FORMAT_VERSION, MAX_INT, MAX_JSON_BYTES, CheckpointError, _FieldError
from .values import _bad, _digest, _missing, _show


def _file_kind(mode):
    for test, kind in (
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISCHR, "a device"),
        (stat.S_ISBLK, "a device"),
        (stat.S_ISSOCK, "a socket"),
    ):
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
            raise CheckpointError(
                f"{path} is {info.st_size:,} bytes, more than the {limit:,} a checkpoint's "
                f"{fname} may have; it is not one minitensor wrote"
            )
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
        raise CheckpointError(
            f"{directory} is not a minitensor checkpoint ({CHECKPOINT_JSON} holds {_show(body)}, not a JSON object)"
        )
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
        raise _FieldError(
            f'field "format_version" is {_show(version)}: this minitensor ({_minitensor_version()}) '
            f"reads format version(s) 1..{FORMAT_VERSION}" + (writer if version > FORMAT_VERSION else "")
        )
    if "content_sha256" not in body:
        _missing("content_sha256")
    claimed = _digest(body.pop("content_sha256"), "content_sha256")
    if claimed != _sha256(_canonical(body)):
        raise CheckpointError(f"{path} is corrupted or was edited (its content hash does not match)")
    return body


# safetensors dtype -> NumPy dtype, for those safetensors.numpy reads
_SAFETENSORS_DTYPES = {
    "BOOL": "bool",
    "U8": "uint8",
    "I8": "int8",
    "U16": "uint16",
    "I16": "int16",
    "F16": "float16",
    "U32": "uint32",
    "I32": "int32",
    "F32": "float32",
    "U64": "uint64",
    "I64": "int64",
    "F64": "float64",
}


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
        if not (
            isinstance(info, dict)
            and set(info) == {"dtype", "shape", "data_offsets"}
            and info["dtype"] in _SAFETENSORS_DTYPES
            and isinstance(info["shape"], list)
            and all(type(n) is int and 0 <= n <= MAX_INT for n in info["shape"])
            and isinstance(info["data_offsets"], list)
            and len(info["data_offsets"]) == 2
            and all(type(n) is int for n in info["data_offsets"])
        ):
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
    from safetensors.numpy import load as safetensors_load  # lazily: `import minitensor.train` stays light

    path = os.path.join(directory, fname)
    size = record["bytes"]
    f, _ = _open_regular(directory, fname, size=size)
    with f:
        if size < 8:
            raise CheckpointError(f"{path} cannot be parsed as safetensors (damaged?): it has {size} bytes")
        header_bytes = int.from_bytes(_read_exactly(f, 8, path), "little")
        if header_bytes > min(size - 8, MAX_JSON_BYTES):
            raise CheckpointError(
                f"{path} cannot be parsed as safetensors (damaged?): a header of "
                f"{header_bytes:,} bytes in a file of {size:,}"
            )
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
