"""One segment: file names, the index rule shared by append and rebuild, lookups, reader views."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from batchgen import build_batch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from storage.batch_header import parse_header
from storage.batch_scan import scan_segment
from storage.errors import CorruptRecordError
from storage.log_config import LogConfig
from storage.offset_index import encode as encode_offsets
from storage.segment import (
    INDEX_SUFFIX,
    LOG_SUFFIX,
    TIME_INDEX_SUFFIX,
    LogSegment,
    parse_segment_name,
    segment_path,
)
from storage.segment_file import FetchSlice
from storage.time_index import encode as encode_times


def test_file_names_are_twenty_digit_base_offsets() -> None:
    assert segment_path("/d", 42, LOG_SUFFIX) == "/d/00000000000000000042.log"
    assert segment_path("/d", 2**63 - 1, INDEX_SUFFIX) == "/d/09223372036854775807.index"
    assert parse_segment_name("00000000000000000042.log") == 42
    assert parse_segment_name("00000000000000000042.timeindex", TIME_INDEX_SUFFIX) == 42
    bad_names = ("42.log", "0000000000000000004x.log", "00000000000000000042.log.tmp",
                 "00000000000000000042.index")
    for bad in bad_names:
        assert parse_segment_name(bad) is None


def _segment(tmp_path: Path, batches: list[tuple[int, int]], config: LogConfig, base: int = 100
             ) -> tuple[LogSegment, list[bytes]]:
    """An active segment holding batches of (records, max timestamp); returns it and the stored bytes."""
    segment = LogSegment.create(str(tmp_path), base, config)
    stored, offset = [], base
    for records, ts in batches:
        stamps = [ts - 1] * (records - 1) + [ts]
        batch = build_batch([b"r" * 30] * records, base_offset=offset, timestamps_ms=stamps)
        segment.append(memoryview(batch), [(offset, offset + records - 1, len(batch), ts)])
        stored.append(bytes(batch))
        offset += records
    return segment, stored


batch_lists = st.lists(st.tuples(st.integers(1, 5), st.integers(0, 10_000)), min_size=1, max_size=60)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=batch_lists, interval=st.sampled_from([0, 100, 300, 5000]))
def test_live_indexes_equal_the_rebuild_and_lookups_are_right(tmp_path: Path, batches: list[tuple[int, int]],
                                                              interval: int) -> None:
    for name in os.listdir(tmp_path):
        os.unlink(tmp_path / name)
    config = LogConfig(index_interval_bytes=interval, segment_index_bytes=100_000)
    segment, stored = _segment(tmp_path, batches, config)
    try:
        segment.seal()
        scan = scan_segment(segment.log_path, 100, index_interval_bytes=interval)
        assert scan.error is None and scan.valid_bytes == segment.size_bytes
        assert Path(segment.index_path).read_bytes() == encode_offsets(scan.index_relative_offsets,
                                                                       scan.index_positions)
        times = encode_times(scan.time_timestamps, scan.time_relative_offsets)
        final = Path(segment.time_index_path).read_bytes()
        assert final.startswith(times) and len(final) - len(times) in (0, 12)  # + the entry written at roll
        headers = [parse_header(b) for b in stored]
        for offset in range(100, segment.next_offset):
            position, header = segment.find_batch(offset, verify=False) or (None, None)
            k = next(i for i, h in enumerate(headers) if h.last_offset >= offset)
            assert header == headers[k] and position == sum(len(b) for b in stored[:k])
        # lookups by timestamp go to the record: tests/storage/test_timestamp_search.py
        assert segment.largest_timestamp() == max(ts for _, ts in batches)
    finally:
        segment.close()


def _without_fd(piece: FetchSlice | None) -> tuple[object, ...] | None:
    if piece is None:
        return None
    return piece.path, piece.position, piece.size_bytes, piece.first_offset, piece.next_offset


def test_reader_view_answers_like_the_writer(tmp_path: Path) -> None:
    config = LogConfig(index_interval_bytes=100)
    segment, _ = _segment(tmp_path, [(2, 10), (1, 30), (3, 20), (1, 40)] * 10, config)
    view = LogSegment.open_view(str(tmp_path), 100, config)
    try:
        for offset in range(100, segment.next_offset + 1):
            for max_bytes in (0, 200, 1000):
                mine = view.read(offset, max_bytes, max_offset=None, verify=True)
                theirs = segment.read(offset, max_bytes, max_offset=None, verify=False)
                assert _without_fd(mine) == _without_fd(theirs)
        assert view.end_of_data(verify=True) == (segment.size_bytes, segment.next_offset)
        # the writer truncates and rewrites: the view's old index hints are checked, never trusted
        segment.truncate_to(120)
        batch = build_batch([b"new"] * 7, base_offset=segment.next_offset)
        segment.append(memoryview(batch), [(segment.next_offset, segment.next_offset + 6, len(batch), 99)])
        for offset in range(100, segment.next_offset):
            assert _without_fd(view.read(offset, 1, max_offset=None, verify=True)) == _without_fd(
                segment.read(offset, 1, max_offset=None, verify=False))
    finally:
        view.close()
        segment.close()


def test_fetch_slice_read_bytes_names_a_short_file(tmp_path: Path) -> None:
    path = tmp_path / "00000000000000000000.log"
    path.write_bytes(b"x" * 10)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert FetchSlice(str(path), fd, 2, 5, 0, 1).read_bytes() == b"xxxxx"
        with pytest.raises(CorruptRecordError, match="file ends at position 10, slice needs 20"):
            FetchSlice(str(path), fd, 5, 15, 0, 1).read_bytes()
    finally:
        os.close(fd)


def test_create_refuses_to_overwrite_data(tmp_path: Path) -> None:
    (tmp_path / "00000000000000000007.log").write_bytes(b"data")
    with pytest.raises(CorruptRecordError, match="non-empty file is already there"):
        LogSegment.create(str(tmp_path), 7, LogConfig())
