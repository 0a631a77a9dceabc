"""Retention: whole closed segments go by age, size or log start offset; the active one never does."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from batchgen import batch_of_size, build_batch

from storage.errors import OffsetOutOfRangeError
from storage.log import Log
from storage.log_config import LogConfig
from storage.log_reader import LogReader
from storage.retention import RetentionCandidate, segments_to_delete

DAY_MS = 86_400_000


def _candidates(*specs: tuple[int, int]) -> list[RetentionCandidate]:
    """(size, timestamp) per segment; each segment spans 10 offsets."""
    return [RetentionCandidate(10 * i, 10 * i + 10, size, ts) for i, (size, ts) in enumerate(specs)]


def test_plan_time_size_start_and_high_watermark() -> None:
    segs = _candidates((100, 1000), (100, 2000), (100, 9000), (100, 1500))
    plan = dict(now_ms=10_000, retention_ms=-1, retention_bytes=-1, log_start_offset=0)
    assert segments_to_delete(segs, **plan) == 0
    # time: a prefix of expired segments (the third is fresh, so the fourth stays too); never the active
    assert segments_to_delete(segs, **{**plan, "retention_ms": 5000}) == 2
    assert segments_to_delete(segs, **{**plan, "retention_ms": 0}) == 3
    # size: delete while what remains without the segment is still >= retention.bytes
    assert segments_to_delete(segs, **{**plan, "retention_bytes": 250}) == 1
    assert segments_to_delete(segs, **{**plan, "retention_bytes": 200}) == 2
    assert segments_to_delete(segs, **{**plan, "retention_bytes": 0}) == 3
    # log start offset: segments wholly below it
    assert segments_to_delete(segs, **{**plan, "log_start_offset": 20}) == 2
    assert segments_to_delete(segs, **{**plan, "log_start_offset": 19}) == 1
    # the high watermark bounds everything
    assert segments_to_delete(segs, **{**plan, "retention_ms": 0}, high_watermark=19) == 1
    assert segments_to_delete(segs[:1], **{**plan, "retention_ms": 0}) == 0


def _log_with_days(directory: Path, days: list[int], **config: int) -> Log:
    """One segment per entry of ``days``: a batch stamped that many days ago... relative to day 100."""
    log = Log.open(directory, LogConfig(**config))
    for day in days:
        log.append(build_batch([b"x"] * 2, timestamp_ms=day * DAY_MS), leader_epoch=0)
        log.roll()
    return log


def test_time_retention_deletes_old_closed_segments_and_moves_the_log_start(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    log = _log_with_days(directory, [90, 91, 95, 99], retention_ms=7 * DAY_MS)
    log.append(build_batch([b"active"], timestamp_ms=1), leader_epoch=0)  # ancient, but active
    assert [s.base_offset for s in log.segments] == [0, 2, 4, 6, 8]
    assert log.delete_retained_segments(now_ms=100 * DAY_MS) == 2  # days 90 and 91 are > 7 days old
    assert log.log_start_offset == 4
    assert [s.base_offset for s in log.segments] == [4, 6, 8]
    assert not (directory / "00000000000000000000.log").exists()
    assert (directory / "log-start-offset-checkpoint").read_text() == "0\n1\nt 0 4\n"
    with pytest.raises(OffsetOutOfRangeError, match=r"offset 3 is out of range.*\[4, 9\)"):
        log.read(3, 100)
    assert log.read(4, 100).first_offset == 4
    assert log.offset_for_timestamp(0) == (4, 95 * DAY_MS)
    assert log.delete_retained_segments(now_ms=1000 * DAY_MS) == 2  # all closed ones; the active stays
    assert [s.base_offset for s in log.segments] == [8] and log.log_start_offset == 8
    log.close()
    log = Log.open(directory, LogConfig(retention_ms=7 * DAY_MS))
    assert (log.log_start_offset, log.log_end_offset) == (8, 9)
    log.close()


def test_retention_forever_and_size_retention(tmp_path: Path) -> None:
    log = Log.open(tmp_path / "t-0", LogConfig(retention_ms=-1, retention_bytes=2500))
    for _ in range(5):
        log.append(batch_of_size(1000), leader_epoch=0)
        log.roll()
    log.append(batch_of_size(1000), leader_epoch=0)
    assert log.delete_retained_segments(now_ms=10**15) == 3  # 6000 bytes: drop while >= 2500 remain
    assert log.size_bytes == 3000 and log.log_start_offset == 3
    assert log.delete_retained_segments(now_ms=10**15) == 0
    log.close()


def test_segments_without_timestamps_age_by_file_time(tmp_path: Path) -> None:
    log = Log.open(tmp_path / "t-0", LogConfig(retention_ms=DAY_MS))
    log.append(build_batch([b"a"], timestamp_ms=-1), leader_epoch=0)
    log.roll()
    log.append(build_batch([b"b"], timestamp_ms=-1), leader_epoch=0)
    now_ms = 1_000 * DAY_MS
    first = log.segments[0].path
    os.utime(first, (now_ms / 1000 - 2 * 86400, now_ms / 1000 - 2 * 86400))
    assert log.delete_retained_segments(now_ms=now_ms) == 1
    log.close()


def test_retention_respects_the_high_watermark(tmp_path: Path) -> None:
    log = _log_with_days(tmp_path / "t-0", [1, 2, 3], retention_ms=0)
    log.append(build_batch([b"a"]), leader_epoch=0)
    assert log.delete_retained_segments(now_ms=10**15, high_watermark=3) == 1  # segment 2..3 not replicated
    assert log.log_start_offset == 2
    log.close()


def test_increment_log_start_offset_mid_segment(tmp_path: Path) -> None:
    log = _log_with_days(tmp_path / "t-0", [1, 2, 3])
    log.increment_log_start_offset(3)
    assert [s.base_offset for s in log.segments] == [2, 4, 6]
    with pytest.raises(OffsetOutOfRangeError):
        log.read(2, 100)
    piece = log.read(3, 100)
    assert piece.first_offset == 2  # the batch holding 3 still starts at 2: Kafka sends it whole
    assert log.offset_for_timestamp(0) == (3, 2 * DAY_MS)
    with pytest.raises(OffsetOutOfRangeError, match="past the log end offset 6"):
        log.increment_log_start_offset(7)
    log.close()
    log = Log.open(tmp_path / "t-0", LogConfig())
    assert log.log_start_offset == 3
    log.close()


def test_crash_between_start_checkpoint_and_unlink_is_finished_at_open(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    log = _log_with_days(directory, [1, 2, 3])
    log.close()
    (directory / "log-start-offset-checkpoint").write_text("0\n1\nt 0 4\n")
    log = Log.open(directory, LogConfig())
    assert [s.base_offset for s in log.segments] == [4, 6] and log.log_start_offset == 4
    assert not (directory / "00000000000000000002.log").exists()
    log.close()


def test_a_reader_sees_retention(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    log = _log_with_days(directory, [1, 2, 3], retention_ms=0)
    reader = LogReader(str(directory))
    assert reader.log_start_offset == 0 and reader.read(0, 100).first_offset == 0
    log.delete_retained_segments(now_ms=10**15)  # the reader notices the deleted files by itself
    with pytest.raises(OffsetOutOfRangeError, match=r"offset 0 is out of range.*\[6, 6\)"):
        reader.read(0, 100)
    assert reader.log_start_offset == 6
    reader.close()
    log.close()
