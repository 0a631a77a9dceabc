"""LogReader: a lock-free view that follows a writer appending, rolling, truncating and deleting."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from batchgen import build_batch

from storage.batch_header import parse_header, validate_batch
from storage.errors import OffsetOutOfRangeError, UnknownTopicOrPartitionError
from storage.log import Log
from storage.log_config import LogConfig
from storage.log_reader import LogReader, open_read_only

CONFIG = LogConfig(segment_bytes=1500, index_interval_bytes=100, segment_index_bytes=4096)


def test_reader_needs_no_lock_and_follows_appends_and_rolls(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    log = Log.open(directory, CONFIG)
    reader = open_read_only(directory, CONFIG)
    assert (reader.log_start_offset, reader.log_end_offset) == (0, 0)
    assert reader.read(0, 100).size_bytes == 0
    written = []
    for i in range(50):
        batch = build_batch([b"m%d" % i] * (1 + i % 3), timestamp_ms=500 + i)
        log.append(batch, leader_epoch=i // 20)
        written.append(bytes(batch))
        if i % 7 == 0:
            assert list(reader.batches()) == written  # picks up new segments as they appear
    assert len(reader.segment_base_offsets) == len(log.segments) > 2
    assert reader.log_end_offset == log.log_end_offset
    for offset in range(log.log_end_offset):
        mine, theirs = reader.read(offset, 300, max_offset=60), log.read(offset, 300, max_offset=60)
        assert (mine.path, mine.position, mine.size_bytes, mine.first_offset, mine.next_offset) == (
            theirs.path, theirs.position, theirs.size_bytes, theirs.first_offset, theirs.next_offset)
    for ts in (0, 510, 549, 550):
        assert reader.offset_for_timestamp(ts) == log.offset_for_timestamp(ts)
    assert reader.end_offset_for_epoch(1) == log.end_offset_for_epoch(1)
    assert reader.end_offset_for_epoch(2) == log.end_offset_for_epoch(2)
    with pytest.raises(OffsetOutOfRangeError, match=f"offset 1000 is out of range.*{log.log_end_offset}"):
        reader.read(1000, 10)
    reader.close()
    log.close()


def test_reader_lists_again_while_the_directory_mtime_is_within_its_tick(tmp_path: Path) -> None:
    """A second change in one tick of the kernel's clock leaves the directory's mtime as the first set it:
    a reader that listed at an mtime not yet over (here one in the future) lists again at every call, so a
    segment rolled meanwhile is seen though the mtime is set back to what the reader listed at."""
    directory = tmp_path / "t-0"
    log = Log.open(directory, CONFIG)
    log.append(build_batch([b"first"]), leader_epoch=0)
    tick = time.time_ns() + 60 * 10**9
    os.utime(directory, ns=(tick, tick))
    reader = open_read_only(directory, CONFIG)
    assert reader.log_end_offset == 1
    while len(log.segments) < 2:
        log.append(build_batch([b"x" * 200]), leader_epoch=0)
    os.utime(directory, ns=(tick, tick))  # as a change in the same tick leaves it
    assert reader.segment_base_offsets == [s.base_offset for s in log.segments]
    assert reader.log_end_offset == log.log_end_offset
    reader.close()
    log.close()


def test_reader_follows_truncation_and_full_truncation(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    log = Log.open(directory, CONFIG)
    batches = []
    for i in range(40):
        batch = build_batch([b"x%d" % i], timestamp_ms=i)
        log.append(batch, leader_epoch=0)
        batches.append(bytes(batch))
    reader = LogReader(str(directory), CONFIG)
    assert list(reader.batches()) == batches
    log.truncate_to(25)
    replacement = [build_batch([b"new%d" % i], timestamp_ms=i) for i in range(3)]
    for b in replacement:
        log.append(b, leader_epoch=1)
    assert list(reader.batches()) == batches[:25] + [bytes(b) for b in replacement]
    log.truncate_fully_and_start_at(500)
    log.append(build_batch([b"late"]), leader_epoch=2)
    assert [parse_header(b).base_offset for b in reader.batches()] == [500]
    with pytest.raises(OffsetOutOfRangeError):
        reader.read(10, 100)
    reader.close()
    log.close()


def test_reader_verifies_index_hints(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    log = Log.open(directory, CONFIG)
    batches = []
    for i in range(30):
        batch = build_batch([b"y" * 40], timestamp_ms=i)
        log.append(batch, leader_epoch=0)
        batches.append(bytes(batch))
    log.close()
    for index in directory.glob("*.index"):  # lying entries: offsets that do not match their positions
        entries = index.read_bytes()
        index.write_bytes(b"".join(struct.pack(">ii", 1, p) for (_, p) in struct.iter_unpack(">ii", entries)))
    reader = LogReader(str(directory), CONFIG)
    for offset in range(30):
        assert reader.read(offset, 1).read_bytes() == batches[offset]
    reader.close()


_WRITER = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, sys.argv[2])
    from batchgen import build_batch
    from storage.log import Log
    from storage.log_config import LogConfig
    config = LogConfig(segment_bytes=3000, index_interval_bytes=200, retention_bytes=20000)
    log = Log.open(sys.argv[1], config)
    for i in range(3000):
        log.append(build_batch([b"%d:" % i + b"z" * (i % 50)] * (1 + i % 3), timestamp_ms=i), leader_epoch=0)
        if i % 100 == 99:
            log.delete_retained_segments()
    print(log.log_end_offset, flush=True)
    log.close()
    """
)


@pytest.mark.slow
def test_reader_in_this_process_follows_a_writer_process(tmp_path: Path) -> None:
    directory = tmp_path / "live-0"
    here = os.path.dirname(__file__)
    os.makedirs(directory)
    with subprocess.Popen([sys.executable, "-c", _WRITER, str(directory), here], stdout=subprocess.PIPE,
                          text=True) as child:
        reader = LogReader(str(directory))
        offset, seen = 0, 0
        while True:
            try:
                piece = reader.read(offset, 4096)
            except OffsetOutOfRangeError:
                offset = reader.log_start_offset  # retention overtook us: skip ahead, as a consumer would
                continue
            if piece.size_bytes == 0:
                if child.poll() is not None:
                    break
                continue
            data = piece.read_bytes()
            position, expected = 0, piece.first_offset
            assert piece.first_offset <= offset
            while position < len(data):
                header = validate_batch(data, position)  # whole, valid batches only, offsets dense
                assert header.base_offset == expected
                expected = header.last_offset + 1
                position += header.size
                seen += 1
            assert piece.next_offset == expected > offset
            offset = piece.next_offset
        assert child.stdout is not None
        end = int(child.stdout.read())
        assert child.wait() == 0
        reader.refresh()
        assert offset == end == reader.log_end_offset
        assert seen > 100
        reader.close()


def test_reader_of_a_missing_partition(tmp_path: Path) -> None:
    with pytest.raises(UnknownTopicOrPartitionError, match="nope-1: no log directory"):
        LogReader(str(tmp_path / "nope-1"))
