"""Segments a clean replaced or retention deleted: unlinked at once, held open for ``file.delete.delay.ms``
(a read in flight keeps its bytes), then closed by the log's deleter thread, or at once by ``Log.close``;
no descriptor outlives them.  What a user sees: the directory listing, ``/proc/self/fd``, the bytes read."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from storage.batch_builder import build_batch
from storage.cleaner import clean_log
from storage.errors import ConfigError
from storage.log import Log
from storage.log_config import LogConfig
from storage.segment_deleter import SegmentDeleter, hold_files

_KEYS = [f"k{i}".encode() for i in range(4)]


def _fill(log: Log, batches: int, value: bytes) -> None:
    """Batches that each rewrite the same few keys (a clean drops all but the last), then a roll."""
    for _ in range(batches):
        log.append(build_batch([value] * len(_KEYS), _KEYS, timestamp_ms=1_000), leader_epoch=0)
    log.roll()


def _clean(log: Log) -> None:
    assert clean_log(log, upper_bound=log.log_end_offset, now_ms=2_000).done


def _unlinked_open(directory: Path) -> list[str]:
    """The files of ``directory`` this process holds open after they were unlinked."""
    held = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # the listing's own descriptor, gone already
            continue
        if target.startswith(str(directory)) and target.endswith(" (deleted)"):
            held.append(target)
    return held


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _wait_until_none_held(directory: Path) -> None:
    deadline = time.monotonic() + 10
    while _unlinked_open(directory) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _unlinked_open(directory) == []


def test_a_read_in_flight_keeps_its_bytes_until_the_log_closes(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    log = Log.open(directory, LogConfig(segment_bytes=2_000, file_delete_delay_ms=60_000))
    try:
        _fill(log, 20, b"old" * 20)
        in_flight = log.read(0, 1 << 20)
        before = in_flight.read_bytes()
        _clean(log)
        names = sorted(os.listdir(directory))
        assert not any(name.endswith((".deleted", ".swap", ".cleaned")) for name in names)
        assert in_flight.read_bytes() == before  # the replaced segment, unlinked, still reads
        assert in_flight.path + ".deleted (deleted)" in _unlinked_open(directory)  # renamed, then unlinked
        assert log.read(0, 1 << 20).read_bytes() != before  # the next read sees the cleaned segment
    finally:
        log.close()
    assert _unlinked_open(directory) == []  # closing the log closed what it retired, at once


def test_retention_unlinks_at_once_and_closes_after_the_delay(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    config = LogConfig(segment_bytes=2_000, retention_bytes=0)  # file.delete.delay.ms at its default, 1 s
    with Log.open(directory, config) as log:
        _fill(log, 20, b"v" * 60)
        first = log.segments[0].path
        assert log.delete_retained_segments() > 0
        assert not os.path.exists(first)  # gone from the directory at once
        assert first + " (deleted)" in _unlinked_open(directory)  # held open for the delay
        _wait_until_none_held(directory)  # then closed by the deleter, the log still open
        assert log.log_start_offset == log.log_end_offset


def test_many_passes_leave_no_descriptor_behind(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    fds_before = _fds()
    with Log.open(directory, LogConfig(segment_bytes=2_000, file_delete_delay_ms=0)) as log:
        for round_ in range(15):
            _fill(log, 8, b"%d" % round_ * 40)
            _clean(log)
        _wait_until_none_held(directory)
        held_while_open = _fds() - fds_before
        assert held_while_open <= 2 * len(log.segments) + 2  # each segment's .log (and a spare), the lock
    assert _fds() == fds_before


def test_a_negative_delay_is_refused_naming_the_setting() -> None:
    with pytest.raises(ConfigError, match=r"file\.delete\.delay\.ms: -1 is out of range"):
        LogConfig.from_properties({"file.delete.delay.ms": "-1"})


def test_a_forked_child_closes_its_copies_of_held_files(tmp_path: Path) -> None:
    path = tmp_path / "00000000000000000000.log"
    path.write_bytes(b"x" * 100)
    deleter = SegmentDeleter("delete-test")
    deleter.retire(hold_files([str(path)]), 60_000)  # as the supervisor's swap holds the replaced files
    path.unlink()
    pid = os.fork()
    if pid == 0:  # the child: its copy of the descriptor is closed at the fork
        os._exit(1 if _unlinked_open(tmp_path) else 0)
    assert os.waitpid(pid, 0)[1] == 0
    assert _unlinked_open(tmp_path) == [f"{path} (deleted)"]  # the parent's is held for the delay
    deleter.close()
    assert _unlinked_open(tmp_path) == []
