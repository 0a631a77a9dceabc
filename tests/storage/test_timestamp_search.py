"""ListOffsets by timestamp against a list oracle: the writer's log and a reader's view give the same record.

Each example appends batches of several records with increasing, equal and out-of-order timestamps, some
compressed, some LogAppendTime, over several segments, optionally moves the log start offset into the middle
of a batch, and asks for every interesting timestamp and for the max-timestamp spec.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from storage.batch_builder import build_batch
from storage.compression import COMPRESSION_GZIP, COMPRESSION_NONE, COMPRESSION_ZSTD
from storage.log import EARLIEST_TIMESTAMP, LATEST_TIMESTAMP, Log
from storage.log_config import LogConfig
from storage.log_reader import open_read_only
from storage.segment import OffsetAndTimestamp
from storage.timestamp_search import MAX_TIMESTAMP

SMALL = LogConfig(segment_bytes=700, index_interval_bytes=100, segment_index_bytes=4096)
BASE_MS = 1_700_000_000_000

_batch = st.tuples(
    st.lists(st.integers(0, 40), min_size=1, max_size=12),  # timestamps, as steps above BASE_MS
    st.sampled_from([COMPRESSION_NONE, COMPRESSION_GZIP, COMPRESSION_ZSTD]),
    st.booleans(),  # LogAppendTime
)


def _oracle(records: list[tuple[int, int]], target: int, start: int) -> OffsetAndTimestamp | None:
    return next((OffsetAndTimestamp(o, t) for o, t in records if o >= start and t >= target), None)


def _max_oracle(records: list[tuple[int, int]], start: int) -> OffsetAndTimestamp | None:
    visible = [(o, t) for o, t in records if o >= start]
    if not visible:
        return None
    top = max(t for _, t in visible)
    return next(OffsetAndTimestamp(o, t) for o, t in visible if t == top)


def _append(log: Log, batches: list[tuple[list[int], int, bool]]) -> list[tuple[int, int]]:
    """Append the batches; returns the (offset, timestamp) of every record as a reader sees it."""
    records: list[tuple[int, int]] = []
    for steps, compression, append_time in batches:
        stamps = [BASE_MS + s for s in steps]
        values = [b"v" * 30] * len(stamps)
        if append_time:
            batch = build_batch(values, timestamps=stamps, timestamp_type=1, timestamp_ms=max(stamps),
                                compression=compression)
            stamps = [max(stamps)] * len(stamps)
        else:
            batch = build_batch(values, timestamps=stamps, compression=compression)
        first = log.append(batch, leader_epoch=0).first_offset
        records.extend((first + i, ts) for i, ts in enumerate(stamps))
    return records


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches=st.lists(_batch, min_size=1, max_size=25), start_pick=st.integers(0, 10_000))
def test_offset_for_timestamp_is_the_first_record_reaching_it(
    batches: list[tuple[list[int], int, bool]], start_pick: int
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp) / "t-0"
        log = Log.open(directory, SMALL)
        try:
            records = _append(log, batches)
            start = start_pick % (len(records) + 1)
            if start:
                log.increment_log_start_offset(start)
            reader = open_read_only(directory, SMALL)
            try:
                for target in range(BASE_MS - 1, BASE_MS + 42):
                    expected = _oracle(records, target, start)
                    assert log.offset_for_timestamp(target) == expected, target
                    assert reader.offset_for_timestamp(target) == expected, target
                expected_max = _max_oracle(records, start)
                assert log.offset_for_timestamp(MAX_TIMESTAMP) == expected_max
                assert reader.offset_for_timestamp(MAX_TIMESTAMP) == expected_max
                assert log.offset_for_timestamp(EARLIEST_TIMESTAMP) == (start, -1)
                assert reader.offset_for_timestamp(LATEST_TIMESTAMP) == (len(records), -1)
            finally:
                reader.close()
        finally:
            log.close()


def test_a_timestamp_inside_a_batch_names_its_record(tmp_path: Path) -> None:
    """The issue's example: two records in one batch, the second much later, asked for the second's time."""
    log = Log.open(tmp_path / "t-0", SMALL)
    try:
        log.append(build_batch([b"a", b"b"], timestamps=[1, 999_999_999_999]), leader_epoch=0)
        assert log.offset_for_timestamp(999_999_999_999) == (1, 999_999_999_999)
        assert log.offset_for_timestamp(MAX_TIMESTAMP) == (1, 999_999_999_999)
        assert log.offset_for_timestamp(1_000_000_000_000) is None
    finally:
        log.close()


def test_max_timestamp_of_an_empty_log_is_none(tmp_path: Path) -> None:
    log = Log.open(tmp_path / "t-0", SMALL)
    try:
        assert log.offset_for_timestamp(MAX_TIMESTAMP) is None
        assert log.offset_for_timestamp(0) is None
    finally:
        log.close()
