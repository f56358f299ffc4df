"""minitensor.atomic.write_atomic: a file is written whole or not at all."""

import os
import re
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


@pytest.mark.parametrize("name", ["folder", "folder/", "folder/x/..", "folder/."])
def test_a_folder_is_refused_by_its_name_before_anything_is_written(tmp_path, name):
    """The temporary file goes beside the target: for "folder/" that would be folder's parent.
    The error names the path the caller gave, not the temporary file."""
    (tmp_path / "folder").mkdir()
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    path = f"{tmp_path}/{name}"
    with pytest.raises(IsADirectoryError, match="that is a folder; give the name of a file in it") as caught:
        write_atomic(path, b"x")
    assert caught.value.filename == path
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def test_an_empty_path_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # "" would otherwise write into the working folder's parent
    with pytest.raises(FileNotFoundError, match="an empty path names no file"):
        write_atomic("", b"x")
    assert not any(tmp_path.parent.glob("..*.tmp")) and os.listdir(tmp_path) == []


def test_a_missing_folder_or_a_file_in_its_place_is_named(tmp_path):
    (tmp_path / "a_file").write_bytes(b"")
    missing, under_a_file = tmp_path / "no" / "f", tmp_path / "a_file" / "f"
    message = re.escape(f"cannot write f in {tmp_path / 'no'}: no such folder")
    with pytest.raises(FileNotFoundError, match=message) as caught:
        write_atomic(missing, b"x")
    assert caught.value.filename == str(missing)
    with pytest.raises(FileNotFoundError, match="it is a file, not a folder"):
        write_atomic(under_a_file, b"x")
    assert os.listdir(tmp_path) == ["a_file"]
