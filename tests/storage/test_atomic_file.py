"""Replacing a file whole (``storage.atomic_file``): the new bytes under the name, the old ones still readable
through a descriptor opened before, no temporary file left, a crash's leftover temporary file overwritten."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from storage.atomic_file import TMP_SUFFIX, fsync_directory, write_atomically


@pytest.mark.parametrize("durable", [True, False])
def test_the_name_holds_the_new_bytes_and_an_open_reader_keeps_the_old(tmp_path: Path, durable: bool) -> None:
    path = tmp_path / "state"
    write_atomically(path, b"old contents", durable=durable)
    fd = os.open(path, os.O_RDONLY)
    try:
        write_atomically(path, b"new", durable=durable)
        assert path.read_bytes() == b"new"
        assert os.pread(fd, 100, 0) == b"old contents"  # the reader's inode was replaced, not rewritten
    finally:
        os.close(fd)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state"]


def test_a_leftover_temporary_file_is_overwritten(tmp_path: Path) -> None:
    path = tmp_path / "state"
    (tmp_path / f"state{TMP_SUFFIX}").write_bytes(b"a torn write, longer than the new contents")
    write_atomically(str(path), bytearray(b"whole"))
    assert path.read_bytes() == b"whole"
    assert not (tmp_path / f"state{TMP_SUFFIX}").exists()


def test_mode_suffix_and_any_byte_buffer(tmp_path: Path) -> None:
    path = tmp_path / "secret.json"
    old_umask = os.umask(0o022)
    try:
        write_atomically(path, memoryview(b"\x00\x01" * 3000), mode=0o600, tmp_suffix=".new")
    finally:
        os.umask(old_umask)
    assert path.read_bytes() == b"\x00\x01" * 3000
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["secret.json"]


def test_an_empty_file_and_a_directory_fsync(tmp_path: Path) -> None:
    path = tmp_path / ".clean-shutdown"
    write_atomically(path, b"")
    assert path.exists() and path.stat().st_size == 0
    fsync_directory(tmp_path)
    with pytest.raises(NotADirectoryError):
        fsync_directory(path)
