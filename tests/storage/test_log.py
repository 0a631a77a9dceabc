"""The partition log as its users see it: append, read, roll, followers, epochs, truncation, the lock."""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest
from batchgen import DEFAULT_TIMESTAMP_MS, batch_of_size, build_batch

from storage.batch_header import (
    BATCH_HEADER,
    BATCH_LENGTH_OFFSET,
    CRC_OFFSET,
    MAGIC_OFFSET,
    parse_header,
    validate_batch,
)
from storage.batch_scan import BatchArrays, walk_batches
from storage.errors import (
    ConfigError,
    CorruptRecordError,
    InvalidRecordError,
    LogLockedError,
    NotLeaderError,
    OffsetOutOfRangeError,
)
from storage.log import Log
from storage.log_config import LogConfig

with warnings.catch_warnings():  # kafka-python's package import uses deprecated importlib APIs
    warnings.simplefilter("ignore", DeprecationWarning)
    import kafka.record

SMALL = LogConfig(segment_bytes=4096, index_interval_bytes=256, segment_index_bytes=4096)


def _dir_bytes(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir()) if p.name != ".lock"}


def _records(data: bytes) -> list[tuple[int, bytes | None]]:
    records = kafka.record.MemoryRecords(data)
    out = []
    while (batch := records.next_batch()) is not None:
        out.extend((r.offset, r.value) for r in batch)
    return out


def test_append_assigns_offsets_and_stamps_the_callers_buffer(tmp_path: Path) -> None:
    log = Log.open(tmp_path / "t-0", SMALL)
    buf = build_batch([b"a", b"b"], base_offset=777) + build_batch([b"c"]) + build_batch([b"d", b"e", b"f"])
    info = log.append(buf, leader_epoch=5)
    assert (info.first_offset, info.last_offset, info.batch_count, info.record_count) == (0, 5, 3, 6)
    assert (info.position, info.segment_base_offset, info.size_bytes) == (0, 0, len(buf))
    assert info.max_timestamp == DEFAULT_TIMESTAMP_MS
    # stamped in place, CRC untouched and still valid
    first = parse_header(buf, 0)
    assert (first.base_offset, first.partition_leader_epoch) == (0, 5)
    second = parse_header(buf, first.size)
    assert (second.base_offset, second.partition_leader_epoch) == (2, 5)
    validate_batch(buf, 0)
    assert log.log_end_offset == 6
    piece = log.read(0, 1 << 20)
    assert piece.read_bytes() == bytes(buf)
    assert _records(piece.read_bytes()) == [(0, b"a"), (1, b"b"), (2, b"c"), (3, b"d"), (4, b"e"), (5, b"f")]
    info2 = log.append(build_batch([b"g"]), leader_epoch=5)
    assert (info2.first_offset, info2.position) == (6, len(buf))
    log.close()


def test_read_only_input_is_copied_not_mutated(tmp_path: Path) -> None:
    log = Log.open(tmp_path / "t-0", SMALL)
    log.append(build_batch([b"x"]), leader_epoch=0)
    raw = bytes(build_batch([b"y"], base_offset=99))
    log.append(raw, leader_epoch=0)
    assert parse_header(raw).base_offset == 99
    assert parse_header(log.read(1, 100).read_bytes()).base_offset == 1
    log.close()


def _corruptions() -> list[tuple[str, bytes]]:
    good = bytes(build_batch([b"hello", b"world"]))
    bad_magic = bytearray(good)
    bad_magic[MAGIC_OFFSET] = 1
    bad_crc = bytearray(good)
    bad_crc[-1] ^= 0xFF
    short_length = bytearray(good)
    struct.pack_into(">i", short_length, BATCH_LENGTH_OFFSET, 10)
    long_length = bytearray(good)
    struct.pack_into(">i", long_length, BATCH_LENGTH_OFFSET, len(good))
    stored_crc = bytearray(good)
    struct.pack_into(">I", stored_crc, CRC_OFFSET, 12345)
    cases = [
        ("wrong magic", bytes(bad_magic)),
        ("wrong CRC (data)", bytes(bad_crc)),
        ("wrong CRC (stored)", bytes(stored_crc)),
        ("length below header", bytes(short_length)),
        ("length past the end", bytes(long_length)),
        ("trailing garbage", good + b"\x00\x01\x02"),
        ("empty", b""),
    ]
    cases += [(f"truncated to {n} bytes", good[:n]) for n in (1, 11, 12, 60, 61, len(good) - 1)]
    return cases


@pytest.mark.parametrize(("name", "bad"), _corruptions(), ids=[n for n, _ in _corruptions()])
def test_bad_input_is_rejected_and_changes_nothing(tmp_path: Path, name: str, bad: bytes) -> None:
    directory = tmp_path / "orders-3"
    log = Log.open(directory, SMALL)
    log.append(build_batch([b"before"]), leader_epoch=1)
    before = (log.log_end_offset, log.size_bytes, _dir_bytes(directory))
    good = build_batch([b"ok"])
    with pytest.raises(CorruptRecordError) as caught:
        log.append(bytearray(good + bad if bad else bad), leader_epoch=1)
    message = str(caught.value)
    assert "orders-3" in message
    if bad:
        assert f"position {len(good)}" in message or "truncated" in message or "position" in message
    with pytest.raises(CorruptRecordError):
        log.append_as_follower(bytearray(bad) if bad else bytearray())
    assert (log.log_end_offset, log.size_bytes, _dir_bytes(directory)) == before
    log.close()


def test_byte_by_byte_truncation_never_appends(tmp_path: Path) -> None:
    log = Log.open(tmp_path / "t-0", SMALL)
    good = bytes(build_batch([b"k" * 40, b"v" * 3]))
    for n in range(len(good)):
        with pytest.raises(CorruptRecordError):
            log.append(good[:n], leader_epoch=0)
    assert (log.log_end_offset, log.size_bytes) == (0, 0)
    log.append(good, leader_epoch=0)
    assert log.log_end_offset == 2
    log.close()


def test_batch_larger_than_max_message_bytes_is_refused(tmp_path: Path) -> None:
    log = Log.open(tmp_path / "t-0", LogConfig(max_message_bytes=1000))
    with pytest.raises(InvalidRecordError, match=r"max\.message\.bytes 1000"):
        log.append(batch_of_size(1001), leader_epoch=0)
    log.append(batch_of_size(1000), leader_epoch=0)
    assert log.log_end_offset == 1
    log.close()


def test_read_returns_whole_batches_within_limits(tmp_path: Path) -> None:
    log = Log.open(tmp_path / "t-0", LogConfig(index_interval_bytes=100))
    sizes = [300, 200, 200, 1000, 100, 100]
    batches = [bytes(batch_of_size(s, records=2)) for s in sizes]  # 2 offsets each
    for b in batches:
        log.append(b, leader_epoch=0)
    stored = log.read(0, 1 << 20).read_bytes()
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    chunks = [stored[s : s + n] for s, n in zip(starts, sizes, strict=True)]
    # the whole batch holding the offset, even when max_bytes is smaller than it
    one = log.read(7, 10)
    assert (one.first_offset, one.size_bytes, one.next_offset, one.position) == (6, 1000, 8, starts[3])
    # as many whole batches as fit
    piece = log.read(1, 750)
    assert piece.read_bytes() == b"".join(chunks[0:3]) and piece.next_offset == 6
    piece = log.read(2, 399)
    assert piece.read_bytes() == chunks[1] and piece.next_offset == 4
    # never past max_offset (the high watermark): only batches whose last offset < max_offset
    assert log.read(0, 1 << 20, max_offset=7).read_bytes() == b"".join(chunks[:3])
    assert log.read(0, 1 << 20, max_offset=8).read_bytes() == b"".join(chunks[:4])
    empty = log.read(6, 1 << 20, max_offset=7)
    assert empty.size_bytes == 0
    # at the log end: empty; past it or below the start: out of range, naming the range
    assert log.read(12, 100).size_bytes == 0
    with pytest.raises(OffsetOutOfRangeError, match=r"t-0: offset 13 is out of range.*\[0, 12\)"):
        log.read(13, 100)
    with pytest.raises(OffsetOutOfRangeError, match="offset -1"):
        log.read(-1, 100)
    log.close()


def test_sendfile_from_the_slice(tmp_path: Path) -> None:
    log = Log.open(tmp_path / "t-0", SMALL)
    for i in range(20):
        log.append(build_batch([b"m%d" % i] * 3), leader_epoch=0)
    piece = log.read(10, 500)
    left, right = socket.socketpair()
    with left, right:
        sent = 0
        while sent < piece.size_bytes:
            sent += os.sendfile(left.fileno(), piece.fd, piece.position + sent, piece.size_bytes - sent)
        received = b""
        while len(received) < sent:
            received += right.recv(65536)
    assert received == piece.read_bytes()
    assert _records(received)[0][0] == 9  # the batch holding offset 10 starts at 9
    log.close()


def test_rolls_on_segment_bytes_and_reads_across_segments(tmp_path: Path) -> None:
    log = Log.open(tmp_path / "t-0", LogConfig(segment_bytes=1000, index_interval_bytes=100))
    payloads = [bytes(batch_of_size(300)) for _ in range(10)]
    for p in payloads:
        log.append(p, leader_epoch=0)
    assert [s.base_offset for s in log.segments] == [0, 3, 6, 9]
    assert all(s.size_bytes <= 1000 for s in log.segments)
    assert [s.is_active for s in log.segments] == [False, False, False, True]
    piece = log.read(2, 1 << 20)  # a slice never spans two segments
    assert (piece.first_offset, piece.next_offset) == (2, 3)
    assert list(log.batches()) == [bytes(log.read(i, 1).read_bytes()) for i in range(10)]
    # one append crossing a boundary: one write per segment, offsets continue
    info = log.append(b"".join(payloads[:4]), leader_epoch=0)
    assert (info.first_offset, info.last_offset, info.segment_base_offset) == (10, 13, 9)
    assert [s.base_offset for s in log.segments][-2:] == [9, 12]
    # a batch larger than segment.bytes still goes into an (empty) segment
    log.append(batch_of_size(2500), leader_epoch=0)
    assert log.segments[-1].size_bytes == 2500
    log.close()


def test_rolls_on_segment_ms_measured_from_first_batch_timestamp(tmp_path: Path) -> None:
    log = Log.open(tmp_path / "t-0", LogConfig(segment_ms=1000))
    log.append(build_batch([b"a"], timestamp_ms=10_000), leader_epoch=0)
    log.append(build_batch([b"b"], timestamp_ms=10_900), leader_epoch=0)
    log.append(build_batch([b"c"], timestamp_ms=11_000), leader_epoch=0)  # exactly 1000: no roll
    assert len(log.segments) == 1
    log.append(build_batch([b"d"], timestamp_ms=11_001), leader_epoch=0)
    assert [s.base_offset for s in log.segments] == [0, 3]
    log.close()


def test_rolls_when_an_index_is_full(tmp_path: Path) -> None:
    # 24 bytes: 3 offset-index entries, 2 time-index entries (one reserved for the roll)
    log = Log.open(tmp_path / "t-0", LogConfig(segment_index_bytes=24, index_interval_bytes=0))
    for i in range(10):
        log.append(build_batch([b"x"], timestamp_ms=1000 + i), leader_epoch=0)
    bases = [s.base_offset for s in log.segments]
    assert len(bases) > 2
    for i in range(10):
        assert log.read(i, 1).first_offset == i
    log.close()


def test_rolls_before_relative_offsets_overflow(tmp_path: Path) -> None:
    log = Log.open(tmp_path / "t-0", SMALL)
    far = 2**31 + 5
    buf = build_batch([b"a"], base_offset=0) + build_batch([b"b"], base_offset=far)
    log.append_as_follower(buf)
    assert [s.base_offset for s in log.segments] == [0, far]
    assert log.log_end_offset == far + 1
    assert log.read(1, 100).first_offset == far  # offsets 1..far-1 are a gap (compaction on the leader)
    log.close()
    log = Log.open(tmp_path / "t-0", SMALL)
    assert log.log_end_offset == far + 1
    log.close()


def test_follower_append_keeps_offsets_and_records_epochs(tmp_path: Path) -> None:
    log = Log.open(tmp_path / "t-0", SMALL)
    leader = build_batch([b"a", b"b"], base_offset=0, leader_epoch=3) + build_batch(
        [b"c"], base_offset=2, leader_epoch=3) + build_batch([b"d"], base_offset=3, leader_epoch=7)
    original = bytes(leader)
    info = log.append_as_follower(leader)
    assert (info.first_offset, info.last_offset) == (0, 3)
    assert bytes(leader) == original and log.read(0, 1 << 20).read_bytes() == original
    assert [tuple(e) for e in log.leader_epoch_cache.entries] == [(3, 0), (7, 3)]
    assert log.end_offset_for_epoch(3) == (3, 3)
    assert log.end_offset_for_epoch(7) == (7, 4)
    with pytest.raises(InvalidRecordError, match="base offset 3, below the log end offset 4"):
        log.append_as_follower(build_batch([b"e"], base_offset=3))
    with pytest.raises(InvalidRecordError, match="offsets must move forward"):
        log.append_as_follower(build_batch([b"e"], base_offset=4) + build_batch([b"f"], base_offset=4))
    assert log.log_end_offset == 4
    log.close()


def test_follower_copies_a_compacted_leaders_gaps_byte_for_byte(tmp_path: Path) -> None:
    """A leader's log with offset gaps (compaction dropped 4, 6..9 and 12..): the follower appends the
    same bytes at the same offsets, through both append paths, and reads and recovers them the same."""
    leader = (build_batch([b"e"], base_offset=5, leader_epoch=1)
              + build_batch([b"k", b"l"], base_offset=10, leader_epoch=1)
              + build_batch([b"z"], base_offset=20, leader_epoch=2))
    log = Log.open(tmp_path / "t-0", SMALL)
    log.append_as_follower(build_batch([b"a", b"b", b"c", b"d"], base_offset=0, leader_epoch=1))
    info = log.append_as_follower(leader)
    assert (info.first_offset, info.last_offset, log.log_end_offset) == (5, 20, 21)
    assert log.read(4, 1 << 20).read_bytes() == bytes(leader)  # offset 4 is in the gap: from 5 on
    assert log.read(12, 1 << 20).first_offset == 20
    assert [tuple(e) for e in log.leader_epoch_cache.entries] == [(1, 0), (2, 20)]
    with pytest.raises(InvalidRecordError, match="base offset 20, below the log end offset 21"):
        log.append_as_follower(build_batch([b"y"], base_offset=20, leader_epoch=2))
    walked = Log.open(tmp_path / "w-0", SMALL)
    walked.append_as_follower(build_batch([b"a", b"b", b"c", b"d"], base_offset=0, leader_epoch=1))
    view = memoryview(bytes(leader))
    arrays = tuple(np.empty(8, np.int64) for _ in range(7))
    count, _, _ = walk_batches(np.frombuffer(view, np.uint8), 0, len(view), 0, 4, *arrays)
    walked.append_walked_as_follower(view, BatchArrays(*(a[:count] for a in arrays)))
    assert walked.read(0, 1 << 20).read_bytes() == log.read(0, 1 << 20).read_bytes()
    walked.close(clean=False)
    log.close(clean=False)
    for name in ("t-0", "w-0"):
        with Log.open(tmp_path / name, SMALL) as again:  # recovery keeps the gaps
            assert again.log_end_offset == 21
            assert again.read(0, 1 << 20).read_bytes()[-len(leader):] == bytes(leader)


def test_leader_epochs_fencing_and_checkpoint(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    log = Log.open(directory, SMALL)
    log.append(build_batch([b"a"]), leader_epoch=0)
    log.append(build_batch([b"b"]), leader_epoch=2)
    log.append(build_batch([b"c"]), leader_epoch=2)
    with pytest.raises(NotLeaderError, match=r"epoch 1.*epoch 2"):
        log.append(build_batch([b"stale"]), leader_epoch=1)
    assert log.log_end_offset == 3
    assert (directory / "leader-epoch-checkpoint").read_text() == "0\n2\n0 0\n2 1\n"
    assert log.end_offset_for_epoch(0) == (0, 1)
    assert log.end_offset_for_epoch(1) == (0, 1)
    assert log.end_offset_for_epoch(2) == (2, 3)
    assert log.end_offset_for_epoch(9) == (-1, -1)
    assert log.end_offset_for_epoch(-1) == (-1, -1)
    log.close()


def test_truncate_to_drops_later_batches_segments_and_epochs(tmp_path: Path) -> None:
    log = Log.open(tmp_path / "t-0", LogConfig(segment_bytes=600, index_interval_bytes=50))
    for i in range(12):
        log.append(batch_of_size(200, records=2), leader_epoch=i // 4)
    assert log.log_end_offset == 24 and len(log.segments) == 4
    before = list(log.batches())
    assert log.truncate_to(13) == 12  # offset 13 is inside the batch 12..13: the whole batch goes
    assert log.log_end_offset == 12
    assert list(log.batches()) == before[:6]
    assert log.segments[-1].is_active and [s.base_offset for s in log.segments] == [0, 6, 12]
    assert [tuple(e) for e in log.leader_epoch_cache.entries] == [(0, 0), (1, 8)]
    info = log.append(batch_of_size(200, records=2), leader_epoch=5)
    assert info.first_offset == 12
    assert log.truncate_to(100) == 14  # at or past the end: nothing
    assert log.truncate_to(7) == 6
    assert [s.base_offset for s in log.segments] == [0, 6] and log.segments[-1].size_bytes == 0
    log.close()
    log = Log.open(tmp_path / "t-0", LogConfig(segment_bytes=600, index_interval_bytes=50))
    assert log.log_end_offset == 6 and list(log.batches()) == before[:3]
    log.close()


def test_truncate_fully_and_start_at(tmp_path: Path) -> None:
    log = Log.open(tmp_path / "t-0", SMALL)
    for _ in range(5):
        log.append(build_batch([b"a"]), leader_epoch=1)
    log.truncate_fully_and_start_at(1000)
    assert (log.log_start_offset, log.log_end_offset, log.latest_epoch) == (1000, 1000, -1)
    assert [s.base_offset for s in log.segments] == [1000]
    assert log.append(build_batch([b"b"]), leader_epoch=2).first_offset == 1000
    with pytest.raises(OffsetOutOfRangeError):
        log.read(999, 100)
    log.close()
    log = Log.open(tmp_path / "t-0", SMALL)
    assert (log.log_start_offset, log.log_end_offset) == (1000, 1001)
    log.close()


def test_offset_for_timestamp_is_the_first_record_reaching_it(tmp_path: Path) -> None:
    log = Log.open(tmp_path / "t-0", LogConfig(segment_bytes=500, index_interval_bytes=60))
    stamps = [100, 300, 200, 300, 500, 400, 700, 600]
    for ts in stamps:
        log.append(build_batch([b"x" * 50, b"y"], timestamps_ms=[ts - 5, ts]), leader_epoch=0)
    assert len(log.segments) > 2
    records = [(2 * i + j, ts - 5 + 5 * j) for i, ts in enumerate(stamps) for j in (0, 1)]
    for target in range(0, 800, 5):
        expected = next(((offset, ts) for offset, ts in records if ts >= target), None)
        assert log.offset_for_timestamp(target) == expected
    assert log.offset_for_timestamp(-2) == (0, -1)
    assert log.offset_for_timestamp(-1) == (16, -1)
    log.close()


def test_clean_close_and_reopen_keeps_everything(tmp_path: Path) -> None:
    directory = tmp_path / "orders-12"
    log = Log.open(directory, LogConfig(segment_bytes=800, index_interval_bytes=100))
    for i in range(30):
        log.append(build_batch([b"r%d" % i] * (1 + i % 3), timestamp_ms=1000 + i), leader_epoch=i // 10)
    content, segments, end = list(log.batches()), log.segments, log.log_end_offset
    log.close()
    names = sorted(p.name for p in directory.iterdir())
    assert ".clean-shutdown" in names and "leader-epoch-checkpoint" in names
    assert "00000000000000000000.log" in names and "00000000000000000000.timeindex" in names
    assert (directory / "recovery-point-offset-checkpoint").read_text() == f"0\n1\norders 12 {end}\n"
    assert (directory / "log-start-offset-checkpoint").read_text() == "0\n1\norders 12 0\n"
    for s in segments:  # closed and cleanly closed indexes are trimmed to whole entries
        assert os.path.getsize(s.path[:-4] + ".index") % 8 == 0
        assert os.path.getsize(s.path[:-4] + ".timeindex") % 12 == 0
    log = Log.open(directory, LogConfig(segment_bytes=800, index_interval_bytes=100))
    assert not (directory / ".clean-shutdown").exists()
    assert list(log.batches()) == content and log.log_end_offset == end
    assert [(s.base_offset, s.size_bytes, s.next_offset, s.max_timestamp) for s in log.segments] == [
        (s.base_offset, s.size_bytes, s.next_offset, s.max_timestamp) for s in segments
    ]
    assert log.append(build_batch([b"more"]), leader_epoch=3).first_offset == end
    log.close()


def test_flush_messages_advances_the_recovery_point(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    log = Log.open(directory, LogConfig(flush_messages=3))
    log.append(build_batch([b"a", b"b"]), leader_epoch=0)
    assert log.recovery_point == 0
    log.append(build_batch([b"c"]), leader_epoch=0)
    assert log.recovery_point == 3
    assert (directory / "recovery-point-offset-checkpoint").read_text() == "0\n1\nt 0 3\n"
    log.close()
    log = Log.open(directory, LogConfig())  # default: never on a count; a roll fsyncs in the background
    log.append(build_batch([b"d"]), leader_epoch=0)
    assert log.recovery_point == 3
    log.roll()
    log.append(build_batch([b"e"]), leader_epoch=0)
    log.flush()
    assert log.recovery_point == 5
    log.close()


def test_log_config_checks_and_kafka_names() -> None:
    config = LogConfig.from_properties({"segment.bytes": "4096", "retention.ms": -1, "flush.messages": 10})
    assert (config.segment_bytes, config.retention_ms, config.flush_messages) == (4096, -1, 10)
    assert config.to_properties()["segment.bytes"] == 4096
    with pytest.raises(ConfigError, match=r"segment\.bytes: 5 is out of range"):
        LogConfig(segment_bytes=5)
    with pytest.raises(ConfigError, match=r"unknown log setting 'segment\.size'"):
        LogConfig.from_properties({"segment.size": 1})
    with pytest.raises(ConfigError, match=r"retention\.bytes: 'lots' is not an integer"):
        LogConfig.from_properties({"retention.bytes": "lots"})


def test_second_writer_in_this_process_is_refused(tmp_path: Path) -> None:
    log = Log.open(tmp_path / "t-0", SMALL)
    with pytest.raises(LogLockedError, match=f"t-0.*process {os.getpid()}.*exactly one writer"):
        Log.open(tmp_path / "t-0", SMALL)
    log.close()
    Log.open(tmp_path / "t-0", SMALL).close()


_HOLDER = textwrap.dedent(
    """
    import sys
    from storage.log import Log
    log = Log.open(sys.argv[1])
    print("ready", flush=True)
    sys.stdin.readline()
    log.close()
    """
)


def test_second_writer_in_another_process_is_refused(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    with subprocess.Popen([sys.executable, "-c", _HOLDER, str(directory)], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, text=True) as child:
        try:
            assert child.stdout is not None and child.stdin is not None
            assert child.stdout.readline().strip() == "ready"
            with pytest.raises(LogLockedError, match=f"by process {child.pid}"):
                Log.open(directory)
            child.stdin.write("\n")
            child.stdin.flush()
            assert child.wait(timeout=30) == 0
        finally:
            if child.poll() is None:
                child.kill()
    Log.open(directory).close()  # released when the holder exits


def test_closed_log_refuses_appends(tmp_path: Path) -> None:
    log = Log.open(tmp_path / "t-0", SMALL)
    log.close()
    with pytest.raises(LogLockedError, match="closed"):
        log.append(build_batch([b"a"]), leader_epoch=0)


def test_header_layout_is_only_imported() -> None:
    # the log never re-declares batch offsets: the descriptor's struct is the one in use
    assert BATCH_HEADER.size == 61
