"""A full disk at each step of an append (``storage.disk_faults``' named fault points): the append raises
:class:`KafkaStorageError`, the log is exactly as before it (files, offsets, what reads return, the
leader epochs), a later append succeeds, and a reopened log holds every appended batch once."""

from __future__ import annotations

import errno
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

from storage.batch_builder import build_batch
from storage.batch_header import check_batch
from storage.disk_faults import DISK_FAULTS
from storage.errors import KafkaStorageError
from storage.log import Log
from storage.log_config import LogConfig

_TIMESTAMP = 1_700_000_000_000
_CONFIG = LogConfig(segment_bytes=4096, index_interval_bytes=1, preallocate=True)


class LogState(NamedTuple):
    log_end_offset: int
    segments: list[tuple[int, int, int]]  # base offset, size, next offset
    files: dict[str, str]  # .log file name -> digest of its bytes
    names: list[str]  # the segments' files (the checkpoints are written by a background flush meanwhile)
    batches: list[bytes]  # what reads return, from the log start
    epochs: list[tuple[int, int]]
    read_positions: list[int]  # Log.read(offset) through the indexes, for every offset


def _state(log: Log) -> LogState:
    directory = Path(log.directory)
    files = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in directory.glob("*.log")}
    end = log.log_end_offset
    return LogState(
        end,
        [(s.base_offset, s.size_bytes, s.next_offset) for s in log.segments],
        files,
        sorted(p.name for p in directory.iterdir() if p.suffix in (".log", ".index", ".timeindex")),
        list(log.batches()),
        [tuple(e) for e in log.leader_epoch_cache.entries],
        [log.read(offset, 1).position for offset in range(log.log_start_offset, end)],
    )


def _frame(i: int, size: int = 100) -> memoryview:
    return memoryview(bytearray(build_batch([b"%06d" % i + b"x" * size], timestamps=[_TIMESTAMP + i])))


@pytest.fixture(autouse=True)
def _disarm() -> Iterator[None]:
    DISK_FAULTS.disarm()
    try:
        yield
    finally:
        DISK_FAULTS.disarm()


def _append_one(log: Log, i: int, *, path: str, epoch: int = 0) -> None:
    """One batch on the hot path (``append_batches``), or two in one buffer on the general path."""
    if path == "hot":
        frame = _frame(i)
        header = check_batch(frame)
        assert not isinstance(header, int)
        log.append_batches([frame], [header], leader_epoch=epoch)
    else:
        log.append(bytes(_frame(i)) + bytes(_frame(i + 1)), leader_epoch=epoch)


def _fail_once_within(log: Log, path: str, start: int, limit: int = 400) -> tuple[LogState, int]:
    """Append until the armed point fails (it must, within ``limit`` appends); return the state before the
    failed append and the number of the batch that failed."""
    for i in range(start, start + limit, 2):
        before = _state(log)
        try:
            _append_one(log, i, path=path)
        except KafkaStorageError as exc:
            assert exc.partition == "t-0" and "No space left on device" in exc.cause
            assert "free space" in str(exc).lower() and exc.directory in str(exc)
            return before, i
    raise AssertionError(f"no append failed in {limit} tries")


def _check_after(log: Log, before: LogState, failed: int, path: str) -> None:
    assert _state(log) == before, "the failed append changed the log"
    _append_one(log, failed, path=path)  # the same batch again, now with room
    appended = _state(log)
    assert appended.log_end_offset == before.log_end_offset + (1 if path == "hot" else 2)
    directory = log.directory
    log.close()
    with Log.open(directory, _CONFIG) as reopened:
        assert _state(reopened).batches == appended.batches
    for name in os.listdir(directory):
        assert not name.endswith(".tmp"), name


@pytest.mark.parametrize("path", ["hot", "general"])
@pytest.mark.parametrize("point", ["segment.write", "segment.write.torn", "index.allocate", "segment.create",
                                   "index.trim"])
def test_a_full_disk_at_each_step_leaves_the_log_as_it_was(tmp_path: Path, point: str, path: str) -> None:
    """Some batches in, then the point fails from its next call on (index space runs out only after a
    chunk, a roll only comes after 4 KiB: the appends go on until one meets it)."""
    log = Log.open(tmp_path / "t-0", _CONFIG)
    for i in range(0, 20, 2):
        _append_one(log, i, path=path)
    DISK_FAULTS.arm(point, times=-1)
    before, failed = _fail_once_within(log, path, 20)
    assert DISK_FAULTS.hits[point] >= 1
    before_again, _ = _fail_once_within(log, path, failed)  # still full: refused again, still unchanged
    assert before_again == before
    DISK_FAULTS.disarm()
    _check_after(log, before, failed, path)


def test_a_quota_is_a_full_disk_too(tmp_path: Path) -> None:
    log = Log.open(tmp_path / "t-0", _CONFIG)
    _append_one(log, 0, path="hot")
    DISK_FAULTS.arm("segment.write", error=errno.EDQUOT)
    with pytest.raises(KafkaStorageError, match="EDQUOT"):
        _append_one(log, 1, path="hot")
    _append_one(log, 1, path="hot")
    assert log.log_end_offset == 2
    log.close()


def test_a_failed_preallocation_is_no_error(tmp_path: Path) -> None:
    """``log.preallocate`` is an optimisation: when reserving blocks ahead fails, the write goes on."""
    log = Log.open(tmp_path / "t-0", _CONFIG)
    DISK_FAULTS.arm("segment.preallocate", times=-1)
    for i in range(50):
        _append_one(log, i, path="hot")
    assert log.log_end_offset == 50
    log.close()


def test_a_new_epochs_checkpoint_failing_appends_nothing(tmp_path: Path) -> None:
    """The first append of a new leader epoch records it (a checkpoint write) before its bytes: a full
    disk there refuses the append and the epoch is not recorded."""
    log = Log.open(tmp_path / "t-0", _CONFIG)
    _append_one(log, 0, path="general", epoch=0)
    before = _state(log)
    DISK_FAULTS.arm("checkpoint.write")
    with pytest.raises(KafkaStorageError):
        _append_one(log, 2, path="general", epoch=1)
    assert _state(log) == before and log.latest_epoch == 0
    _append_one(log, 2, path="general", epoch=1)
    assert log.latest_epoch == 1 and log.log_end_offset == 4
    log.close()


def test_a_clean_close_on_a_full_disk_leaves_a_log_the_next_open_recovers(tmp_path: Path) -> None:
    log = Log.open(tmp_path / "t-0", _CONFIG)
    for i in range(0, 10, 2):
        _append_one(log, i, path="general")
    expected = _state(log).batches
    DISK_FAULTS.arm("index.trim", times=-1)
    log.close()
    DISK_FAULTS.disarm()
    assert not (tmp_path / "t-0" / ".clean-shutdown").exists()
    with Log.open(tmp_path / "t-0", _CONFIG) as reopened:
        assert _state(reopened).batches == expected


def test_index_files_are_never_sparse_and_grow_only_as_entries_need(tmp_path: Path) -> None:
    """What a reader maps is allocated (no hole to fault on a full disk), and an active index holds at most
    one growth chunk (256 KiB) beyond its entries, not ``segment.index.bytes`` (10 MiB) up front."""
    config = LogConfig(index_interval_bytes=1)
    log = Log.open(tmp_path / "t-0", config)
    for i in range(0, 6000, 2):
        _append_one(log, i, path="hot" if i % 4 else "general")
        if i % 1000 == 0:
            for index in (*tmp_path.glob("t-0/*.index"), *tmp_path.glob("t-0/*.timeindex")):
                st = index.stat()
                assert st.st_blocks * 512 >= st.st_size, f"{index.name} is sparse"
                assert st.st_size <= 12 * log.log_end_offset + 256 * 1024 + 4096, index.name  # + a chunk
    log.close()
