"""Reading the learner's own text files, with errors that say which file and where.

    text = read_text("notes.txt")                  # the whole file as a str
    with open_text("fra.txt") as f:                # or line by line
        for line in f: ...

A path is always a path: it must name an existing regular file, and a missing one is an
error naming it (never, say, the path string read as if it were the text). A byte that the
encoding cannot decode is an error naming the file, the line and the byte offset, where
Python's own message gives only a position in an internal buffer:

    TextDecodeError: notes.txt, line 3: byte 0xe9 at byte offset 57 is not valid utf-8 (...)

Files are read as ``open`` reads them in text mode: "\\r\\n" and "\\r" line ends become "\\n".
A UTF-8 byte-order mark, which some editors write at the start of a file, is dropped.
"""

import codecs
import contextlib
import os


class TextDecodeError(ValueError):
    """A text file holds bytes that its encoding cannot decode. ``path``, ``line`` (from 1)
    and ``offset`` (bytes from the start of the file) say where; line and offset are None
    when the place could not be found."""

    def __init__(self, message, path, line=None, offset=None):
        super().__init__(message)
        self.path, self.line, self.offset = path, line, offset


def check_file(path, what="file"):
    """``path`` as a str, once it is known to name an existing regular file.

    ``what`` names the file in the messages ("text file", "corpus file"). Raises TypeError for
    something that is not a path (str or ``os.PathLike``), FileNotFoundError for a missing
    file, IsADirectoryError for a folder and ValueError for anything else that is not a
    regular file (a device, a pipe), which could block or never end when read.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"the {what} must be a path (str or os.PathLike), got {type(path).__name__}")
    path = os.fspath(path)
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    if not path:
        raise FileNotFoundError(f"the {what} path is empty")
    if os.path.isdir(path):
        raise IsADirectoryError(f"{path}: is a folder; give the path of a {what}")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such {what}")
    if not os.path.isfile(path):  # follows symlinks: a link to a regular file is fine
        raise ValueError(f"{path}: not a regular file (a device, a pipe or a socket); give the path of a {what}")
    return path


def _decoder_encoding(encoding):
    """The codec to read with: UTF-8 as "utf-8-sig", which reads files without a byte-order
    mark exactly as "utf-8" does and drops the mark where there is one."""
    return "utf-8-sig" if codecs.lookup(encoding).name == "utf-8" else encoding


def _locate_decode_error(path, encoding):
    """(line, byte offset, byte) of the first byte ``encoding`` cannot decode, or Nones.

    Reads the file again, one line of bytes at a time: a decoding error inside ``open``'s
    reader only knows its position in an internal buffer. (Exact for the encodings in which
    a newline is the byte 0x0a, UTF-8 and every ASCII-compatible one.)
    """
    offset = 0
    with open(path, "rb") as f:
        for line, raw in enumerate(f, start=1):
            try:
                raw.decode(encoding)
            except UnicodeDecodeError as e:
                return line, offset + e.start, raw[e.start]
            offset += len(raw)
    return None, None, None


@contextlib.contextmanager
def open_text(path, encoding="utf-8", what="file"):
    """``open(path, encoding=encoding)`` for reading, for a path that ``check_file`` accepts;
    a byte the encoding cannot decode, met while the file is read inside the ``with``,
    becomes a ``TextDecodeError`` naming the file, the line and the byte offset."""
    path = check_file(path, what)
    with open(path, encoding=_decoder_encoding(encoding)) as f:
        try:
            yield f
        except UnicodeDecodeError:
            line, offset, byte = _locate_decode_error(path, _decoder_encoding(encoding))
            if line is None:
                raise TextDecodeError(f"{path}: not valid {encoding} text", path) from None
            raise TextDecodeError(
                f"{path}, line {line}: byte 0x{byte:02x} at byte offset {offset} is not valid {encoding} "
                f"(was the file saved in another encoding? save it again as {encoding})",
                path,
                line,
                offset,
            ) from None


def check_limit(value, name):
    """``value`` unless it is neither None nor a positive int (a ``max_chars``, ``max_examples``):
    ValueError naming ``name`` ("char_lm_corpus: max_chars")."""
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise ValueError(f"{name} must be a positive integer or None, got {value!r}")
    return value


def read_text(path, encoding="utf-8", max_chars=None, what="file"):
    """The text of a file (its first ``max_chars`` characters if given), read as
    ``open_text`` reads it."""
    check_limit(max_chars, "max_chars")
    with open_text(path, encoding, what) as f:
        return f.read() if max_chars is None else f.read(max_chars)


__all__ = ["TextDecodeError", "check_file", "check_limit", "open_text", "read_text"]
