"""minitensor.atomic.write_atomic: a file is written whole or not at all."""

import os
import stat

import pytest

from minitensor.atomic import write_atomic


@pytest.mark.parametrize(
    "data, expected",
    [
        (b"\x00bytes\xff", b"\x00bytes\xff"),
        ("text, é", "text, é".encode()),
        (lambda f: f.write(b"from a function"), b"from a function"),
    ],
)
def test_writes_bytes_text_or_a_writer(tmp_path, data, expected):
    path = tmp_path / "f"
    assert write_atomic(path, b"an older file") == str(path)
    assert write_atomic(path, data) == str(path)
    assert path.read_bytes() == expected
    assert os.listdir(tmp_path) == ["f"]


def test_a_failure_midway_keeps_the_old_file_and_leaves_nothing(tmp_path):
    path = tmp_path / "f"
    write_atomic(path, b"old")

    def broken(f):
        f.write(b"half of the new")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_atomic(path, broken)
    assert path.read_bytes() == b"old" and os.listdir(tmp_path) == ["f"]


def test_permissions_are_those_of_a_plain_open(tmp_path):
    umask = os.umask(0o022)
    try:
        write_atomic(tmp_path / "f", b"x")
        with open(tmp_path / "g", "wb") as f:
            f.write(b"x")
    finally:
        os.umask(umask)
    mode = stat.S_IMODE
    assert mode(os.stat(tmp_path / "f").st_mode) == mode(os.stat(tmp_path / "g").st_mode)
