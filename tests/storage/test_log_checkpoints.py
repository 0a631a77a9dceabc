"""Checkpoint files in Kafka's text formats, and the leader-epoch cache's rules."""

from __future__ import annotations

from pathlib import Path

import pytest

from storage.checkpoints import (
    EpochEntry,
    LeaderEpochCache,
    read_offset_checkpoint,
    write_offset_checkpoint,
)
from storage.errors import CorruptRecordError


def test_offset_checkpoint_round_trip_and_format(tmp_path: Path) -> None:
    path = str(tmp_path / "recovery-point-offset-checkpoint")
    assert read_offset_checkpoint(path) is None
    write_offset_checkpoint(path, {("orders", 0): 1200, ("orders", 3): 5})
    assert Path(path).read_text() == "0\n2\norders 0 1200\norders 3 5\n"
    assert read_offset_checkpoint(path) == {("orders", 0): 1200, ("orders", 3): 5}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["recovery-point-offset-checkpoint"]  # no .tmp left


@pytest.mark.parametrize(
    ("content", "line", "why"),
    [
        ("", 1, "expected version 0"),
        ("1\n0\n", 1, "expected version 0"),
        ("0\nx\n", 2, "expected the entry count"),
        ("0\n2\norders 0 1\n", 4, "expected 2 entries, found 1"),
        ("0\n1\norders 0 1\nextra 0 2\n", 4, "expected 1 entries, found 2"),
        ("0\n1\norders 0\n", 3, "expected 3 space-separated fields"),
        ("0\n1\norders  0 1\n", 3, "expected 3 space-separated fields"),
    ],
)
def test_malformed_checkpoints_name_file_and_line(tmp_path: Path, content: str, line: int, why: str) -> None:
    path = tmp_path / "log-start-offset-checkpoint"
    path.write_text(content)
    with pytest.raises(CorruptRecordError, match=f"{path}: line {line} .*{why}"):
        read_offset_checkpoint(str(path))


def test_non_numeric_offset(tmp_path: Path) -> None:
    path = tmp_path / "c"
    path.write_text("0\n1\norders 0 ten\n")
    with pytest.raises(CorruptRecordError, match="offset 'ten' is not an integer"):
        read_offset_checkpoint(str(path))


def test_leader_epoch_cache_assign_rules(tmp_path: Path) -> None:
    path = str(tmp_path / "leader-epoch-checkpoint")
    cache = LeaderEpochCache(path)
    assert cache.latest_epoch == -1
    assert not cache.assign(-1, 0)  # undefined epochs are ignored
    assert cache.assign(1, 0) and cache.assign(3, 10)
    assert not cache.assign(3, 12)  # same epoch, later start: nothing new
    assert Path(path).read_text() == "0\n2\n1 0\n3 10\n"
    assert cache.assign(3, 8)  # same epoch, earlier start: replaces it
    assert cache.entries == [EpochEntry(1, 0), EpochEntry(3, 8)]
    assert cache.assign(2, 20)  # older epoch at a later offset: conflicting later entries go
    assert cache.entries == [EpochEntry(1, 0), EpochEntry(2, 20)]
    assert cache.epoch_for_offset(19) == 1 and cache.epoch_for_offset(20) == 2
    assert LeaderEpochCache.load(path).entries == cache.entries


def test_end_offset_for_epoch_follows_kafka() -> None:
    cache = LeaderEpochCache("/nonexistent/unused", [EpochEntry(2, 10), EpochEntry(4, 30), EpochEntry(7, 55)])
    log_end = 80
    assert cache.end_offset_for(-1, log_end) == (-1, -1)  # undefined
    assert cache.end_offset_for(7, log_end) == (7, 80)  # the latest: the log end
    assert cache.end_offset_for(4, log_end) == (4, 55)  # known: ends where the next starts
    assert cache.end_offset_for(5, log_end) == (4, 55)  # unknown between: the floor epoch
    assert cache.end_offset_for(1, log_end) == (1, 10)  # older than all known
    assert cache.end_offset_for(9, log_end) == (-1, -1)  # newer than all known
    assert LeaderEpochCache("/nonexistent/unused").end_offset_for(3, 9) == (-1, -1)


def test_truncation_from_both_ends(tmp_path: Path) -> None:
    cache = LeaderEpochCache(str(tmp_path / "e"), [EpochEntry(2, 10), EpochEntry(4, 30), EpochEntry(7, 55)])
    cache.truncate_from_start(35)
    assert cache.entries == [EpochEntry(4, 35), EpochEntry(7, 55)]
    cache.truncate_from_start(55)
    assert cache.entries == [EpochEntry(7, 55)]
    cache.truncate_from_end(55)
    assert cache.entries == []


def test_non_monotonic_epoch_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "leader-epoch-checkpoint"
    path.write_text("0\n2\n5 100\n4 200\n")
    with pytest.raises(CorruptRecordError, match="does not follow"):
        LeaderEpochCache.load(str(path))
