"""log.preallocate: the active segment's blocks are reserved ahead (fallocate KEEP_SIZE) and the unused
reservation is given back on roll and close; sizes, bytes, readers and recovery see nothing of it."""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from storage.batch_builder import build_batch
from storage.errors import ConfigError
from storage.log import Log
from storage.log_config import LogConfig
from storage.log_dir import RECOVERY_POINT_CHECKPOINT_FILE
from storage.log_reader import LogReader
from storage.preallocate import (
    PREALLOCATE_MAX_AHEAD_BYTES,
    PREALLOCATE_MIN_AHEAD_BYTES,
    preallocation_helps,
    reservation_end,
    reserve_blocks,
)

BLOCK = 4096
MIB = 1024 * 1024


def _batch(value_bytes: int, timestamp_ms: int = 1_700_000_000_000) -> bytearray:
    return bytearray(build_batch([b"v" * value_bytes], timestamps=[timestamp_ms]))


def _allocated(path: Path) -> int:
    return os.stat(path).st_blocks * 512


def _rounded(size: int) -> int:
    return -(-size // BLOCK) * BLOCK


def _logs(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.log"))


@pytest.fixture
def disk_dir(tmp_path: Path) -> Path:
    """A directory on a file system where reserving blocks ahead works and helps (not tmpfs)."""
    probe = tmp_path / "probe"
    fd = os.open(probe, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        if not preallocation_helps(fd) or reserve_blocks(fd, 0, BLOCK) != 0:
            pytest.skip(f"{tmp_path}: fallocate(KEEP_SIZE) unsupported or pointless here")
    finally:
        os.close(fd)
        probe.unlink()
    return tmp_path


@pytest.fixture
def shm_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="la-test-prealloc-", dir="/dev/shm"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_reservation_schedule_grows_with_the_segment_and_stops_at_segment_bytes() -> None:
    segment_bytes = 1 << 30
    assert reservation_end(0, 100, segment_bytes) == PREALLOCATE_MIN_AHEAD_BYTES
    assert reservation_end(3 * MIB, 3 * MIB + 100, segment_bytes) == 6 * MIB  # as far again as it holds
    assert reservation_end(200 * MIB, 200 * MIB + 1, segment_bytes) == 200 * MIB + PREALLOCATE_MAX_AHEAD_BYTES
    assert reservation_end(5 * MIB, 5 * MIB + 100, 6 * MIB) == 6 * MIB  # never past segment.bytes...
    assert reservation_end(0, 9 * MIB, 6 * MIB) == 9 * MIB  # ...unless one batch is larger


def test_active_segment_is_reserved_ahead_without_changing_its_size(disk_dir: Path) -> None:
    log = Log.open(disk_dir / "t-0", LogConfig(preallocate=True))
    for _ in range(20):
        log.append(_batch(10_000), leader_epoch=0)
    (segment,) = _logs(disk_dir / "t-0")
    size = log.size_bytes
    assert os.stat(segment).st_size == size  # readers see exactly the data
    assert _allocated(segment) >= max(PREALLOCATE_MIN_AHEAD_BYTES, _rounded(size) + BLOCK)
    with LogReader(str(disk_dir / "t-0")) as reader:
        assert reader.log_end_offset == 20
        assert list(reader.batches()) == list(log.batches())
    log.close()


def test_roll_and_close_give_the_unused_reservation_back(disk_dir: Path) -> None:
    config = LogConfig(preallocate=True, segment_bytes=8 * MIB)
    log = Log.open(disk_dir / "t-0", config)
    for _ in range(3):
        log.append(_batch(50_000), leader_epoch=0)
    old = _logs(disk_dir / "t-0")[0]
    mtime_ns = os.stat(old).st_mtime_ns
    log.roll()
    log.append(_batch(50_000), leader_epoch=0)
    assert _allocated(old) <= _rounded(os.stat(old).st_size)
    assert os.stat(old).st_mtime_ns == mtime_ns  # retention of segments without timestamps reads it
    active = _logs(disk_dir / "t-0")[-1]
    assert _allocated(active) > _rounded(os.stat(active).st_size)
    log.close()
    assert _allocated(active) <= _rounded(os.stat(active).st_size)


def test_unclean_close_gives_the_reservation_back_and_recovery_sees_only_data(disk_dir: Path) -> None:
    log = Log.open(disk_dir / "t-0", LogConfig(preallocate=True))
    for _ in range(5):
        log.append(_batch(1000), leader_epoch=0)
    expected = list(log.batches())
    log.close(clean=False)
    (segment,) = _logs(disk_dir / "t-0")
    assert _allocated(segment) <= _rounded(os.stat(segment).st_size)
    (disk_dir / "t-0" / RECOVERY_POINT_CHECKPOINT_FILE).unlink()  # recovery scans the whole segment
    log = Log.open(disk_dir / "t-0", LogConfig(preallocate=True))
    assert list(log.batches()) == expected
    log.append(_batch(1000), leader_epoch=0)  # active again: reserves again
    assert _allocated(segment) > _rounded(os.stat(segment).st_size)
    log.close()


def test_a_crash_leaves_a_reservation_that_the_next_roll_gives_back(disk_dir: Path) -> None:
    log = Log.open(disk_dir / "t-0", LogConfig(preallocate=True))
    log.append(_batch(1000), leader_epoch=0)
    (segment,) = _logs(disk_dir / "t-0")
    log.close(clean=False)
    fd = os.open(segment, os.O_WRONLY)  # what a SIGKILL leaves: blocks reserved past the data
    assert reserve_blocks(fd, 0, 4 * MIB) == 0
    os.close(fd)
    assert _allocated(segment) >= 4 * MIB
    log = Log.open(disk_dir / "t-0", LogConfig(preallocate=True))
    assert list(log.batches()) and os.stat(segment).st_size == log.size_bytes
    log.roll()  # nothing appended since the restart: the reservation is the crash's
    assert _allocated(segment) <= _rounded(os.stat(segment).st_size)
    log.close()


def test_truncation_frees_the_reservation_past_it_and_appends_reserve_again(disk_dir: Path) -> None:
    log = Log.open(disk_dir / "t-0", LogConfig(preallocate=True))
    for _ in range(10):
        log.append(_batch(1000), leader_epoch=0)
    assert log.truncate_to(4) == 4
    (segment,) = _logs(disk_dir / "t-0")
    assert os.stat(segment).st_size == log.size_bytes
    assert _allocated(segment) <= _rounded(log.size_bytes)
    info = log.append(_batch(1000), leader_epoch=0)
    assert info.first_offset == 4
    assert _allocated(segment) > _rounded(os.stat(segment).st_size)
    log.close()


def test_files_are_byte_identical_with_and_without_preallocation(disk_dir: Path) -> None:
    config = LogConfig(segment_bytes=3 * MIB, index_interval_bytes=5000)
    for name, preallocate in (("on", True), ("off", False)):
        log = Log.open(disk_dir / name / "t-0", config.replace(preallocate=preallocate))
        for i in range(120):
            log.append(_batch(40_000 + 97 * i, timestamp_ms=1_700_000_000_000 + i), leader_epoch=i // 50)
        log.close()
    on = {p.name: p.read_bytes() for p in (disk_dir / "on" / "t-0").iterdir() if p.name != ".lock"}
    off = {p.name: p.read_bytes() for p in (disk_dir / "off" / "t-0").iterdir() if p.name != ".lock"}
    assert on == off
    assert len([n for n in on if n.endswith(".log")]) >= 2
    for path in _logs(disk_dir / "on" / "t-0"):
        assert _allocated(path) <= _rounded(os.stat(path).st_size)


def test_preallocate_false_reserves_nothing(disk_dir: Path) -> None:
    log = Log.open(disk_dir / "t-0", LogConfig(preallocate=False))
    for _ in range(10):
        log.append(_batch(10_000), leader_epoch=0)
    (segment,) = _logs(disk_dir / "t-0")
    assert _allocated(segment) <= _rounded(os.stat(segment).st_size)
    log.close()


def test_nothing_is_reserved_on_tmpfs(shm_dir: Path) -> None:
    log = Log.open(shm_dir / "t-0", LogConfig(preallocate=True))
    for _ in range(10):
        log.append(_batch(10_000), leader_epoch=0)
    (segment,) = _logs(shm_dir / "t-0")
    assert _allocated(segment) <= _rounded(os.stat(segment).st_size)
    assert len(list(log.batches())) == 10
    log.close()


def test_reserve_blocks_returns_the_errno_and_changes_nothing(tmp_path: Path) -> None:
    read, write = os.pipe()
    try:
        assert reserve_blocks(write, 0, BLOCK) == errno.ESPIPE
    finally:
        os.close(read)
        os.close(write)
    path = tmp_path / "f"
    path.write_bytes(b"x" * 100)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert reserve_blocks(fd, 0, BLOCK) == errno.EBADF  # not open for writing
    finally:
        os.close(fd)
    fd = os.open(path, os.O_WRONLY)
    try:
        assert reserve_blocks(fd, 0, 1 << 62) in (errno.EFBIG, errno.ENOSPC, errno.EOPNOTSUPP)
    finally:
        os.close(fd)
    assert path.read_bytes() == b"x" * 100


def test_preallocate_setting_kafka_name_and_checks() -> None:
    assert LogConfig().preallocate is True
    assert LogConfig.from_properties({"preallocate": "false"}).preallocate is False
    assert LogConfig.from_properties({"preallocate": "TRUE"}).preallocate is True
    assert LogConfig.from_properties({"preallocate": False}).preallocate is False
    assert LogConfig(preallocate=False).to_properties()["preallocate"] is False
    with pytest.raises(ConfigError, match="preallocate: 'yes' is not true or false"):
        LogConfig.from_properties({"preallocate": "yes"})
    with pytest.raises(ConfigError, match="preallocate: 1 is not true or false"):
        LogConfig(preallocate=1)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"known: .*preallocate"):
        LogConfig.from_properties({"log.preallocate": "true"})  # the broker-level name is the appliance's
