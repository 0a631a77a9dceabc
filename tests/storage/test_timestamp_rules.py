"""A leader's timestamp rules: LogAppendTime stamped on every leader append path (not by a follower), the
time index and timestamp search by the append time, CreateTime limits as Kafka 3.6 folds them, and a
producer's batch marked LogAppendTime treated as Kafka's LogValidator treats it."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from batchgen import DEFAULT_TIMESTAMP_MS, build_batch
from hypothesis import given, settings
from hypothesis import strategies as st

from storage.batch_builder import build_batch as build_any_batch
from storage.batch_header import (
    BASE_TIMESTAMP_OFFSET,
    HEADER_SIZE,
    MAX_TIMESTAMP_OFFSET,
    RECORDS_COUNT_OFFSET,
    check_batch,
    parse_header,
    validate_batch,
    write_crc,
)
from storage.batch_reader import iter_records
from storage.compression import COMPRESSION_GZIP, COMPRESSION_NONE
from storage.log import Log
from storage.log_config import LONG_MAX, LogConfig
from storage.timestamp_rules import (
    NOT_WALKED,
    TimestampLimits,
    apply_timestamp_rules,
    effective_limits,
    limits_of,
    records_max_timestamp,
    records_max_timestamps,
    stamp_log_append_time,
    timestamp_out_of_range,
)

APPEND_TIME = LogConfig(message_timestamp_type="LogAppendTime")


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _ring_views(batches: list[bytearray]) -> list[memoryview]:
    return [memoryview(np.frombuffer(bytearray(b), dtype=np.uint8)) for b in batches]


def _stored(log: Log) -> list[tuple[int, int, int, int]]:
    """(offset, timestamp, timestamp type, base timestamp) of every stored record, CRCs checked."""
    out = []
    for segment in log.segments:
        data = Path(segment.path).read_bytes()
        for header, position in ((validate_batch(data, p), p) for p in _positions(data)):
            out += [(r.offset, r.timestamp, header.timestamp_type, header.base_timestamp)
                    for r in iter_records(data, position)]
    return out


def _positions(data: bytes) -> list[int]:
    positions, at = [], 0
    while at < len(data):
        positions.append(at)
        at += parse_header(data, at).size
    return positions


def test_stamping_sets_the_bit_and_max_timestamp_and_keeps_the_crc_valid() -> None:
    batch = build_batch([b"a", b"b"], timestamps_ms=[5, 9])
    stamp_log_append_time(memoryview(batch), 0, parse_header(batch), 1234)
    stamped = validate_batch(batch)  # the CRC was recomputed
    assert (stamped.timestamp_type, stamped.max_timestamp, stamped.base_timestamp) == (1, 1234, 5)
    assert [r.timestamp for r in iter_records(bytes(batch))] == [1234, 1234]


@pytest.mark.parametrize("path", ["append", "append_batches_one", "append_batches_many"])
def test_every_leader_path_stamps_the_append_time(tmp_path: Path, path: str) -> None:
    batches = [build_batch([b"x", b"y"]), build_batch([b"z"])]
    before = _now_ms()
    with Log.open(tmp_path / "t-0", APPEND_TIME) as log:
        if path == "append":
            info = log.append(b"".join(batches), leader_epoch=0)
        elif path == "append_batches_one":
            for view in _ring_views(batches):
                info = log.append_batches([view], [parse_header(view)], leader_epoch=0)
        else:
            views = _ring_views(batches)
            info = log.append_batches(views, [parse_header(v) for v in views], leader_epoch=0)
        after = _now_ms()
        stored = _stored(log)
        assert [offset for offset, *_ in stored] == [0, 1, 2]
        for _, timestamp, timestamp_type, base_timestamp in stored:
            assert before <= timestamp <= after and timestamp_type == 1
            assert base_timestamp == DEFAULT_TIMESTAMP_MS  # the producer's, as Kafka keeps it
        assert before <= info.max_timestamp <= after
        found = log.offset_for_timestamp(before)  # the time index and search see the append time
        assert found is not None and found.offset == 0 and before <= found.timestamp <= after
        assert log.offset_for_timestamp(DEFAULT_TIMESTAMP_MS + 1) is not None  # producer times are gone
        assert log.offset_for_timestamp(after + 1) is None


def test_a_createtime_log_and_a_follower_keep_the_bytes(tmp_path: Path) -> None:
    batch = build_batch([b"x"])
    with Log.open(tmp_path / "t-0") as log:
        log.append(bytes(batch), leader_epoch=0)
        assert [(t, k) for _, t, k, _ in _stored(log)] == [(DEFAULT_TIMESTAMP_MS, 0)]
    stamped = build_batch([b"x"])
    stamp_log_append_time(memoryview(stamped), 0, parse_header(stamped), 777)
    with Log.open(tmp_path / "f-0", APPEND_TIME) as follower:
        follower.append_as_follower(bytes(stamped))
        stored = Path(follower.segments[0].path).read_bytes()
        assert stored[12:] == bytes(stamped)[12:]  # as the leader stamped it (the length may be reframed)
        assert parse_header(stored).max_timestamp == 777


def test_limits_fold_the_difference_as_kafka_3_6() -> None:
    assert effective_limits(LONG_MAX, LONG_MAX, LONG_MAX).unlimited
    assert effective_limits(1000, LONG_MAX, LONG_MAX) == TimestampLimits(1000, 1000)
    assert effective_limits(1000, 50, LONG_MAX) == TimestampLimits(50, 1000)
    assert limits_of(LogConfig(message_timestamp_after_max_ms=10)) == TimestampLimits(LONG_MAX, 10)
    assert limits_of(APPEND_TIME.replace(message_timestamp_after_max_ms=10)) is None
    assert limits_of(LogConfig()) is None


@pytest.mark.parametrize(
    ("stamps", "refused_because"),
    [
        ([1_000_000], None),
        ([1_000_000 - 60, 1_000_000 + 40], None),
        ([1_000_000 + 41], "max timestamp"),
        ([1_000_000 - 61], "first record"),
        ([1_000_000, 1_000_000 - 61, 1_000_000], "record 1"),  # only a record tells
        ([-1, -1], None),  # no timestamp: Kafka's LogValidator checks none
        ([1_000_000, -1], None),
        ([-1, 1_000_000 - 61], "record 1"),
    ],
)
def test_createtime_limits_name_the_record(stamps: list[int], refused_because: str | None) -> None:
    batch = build_batch([b"v"] * len(stamps), timestamps_ms=stamps)
    limits = TimestampLimits(60, 40)
    reason = timestamp_out_of_range(memoryview(batch), parse_header(batch), 1_000_000, limits)
    if refused_because is None:
        assert reason is None
    else:
        assert reason is not None and refused_because in reason.reason and not reason.corrupt
        assert "message.timestamp.before.max.ms 60" in reason.reason and "[999940, 1000040]" in reason.reason


def test_unreadable_records_under_a_good_crc_are_corrupt_not_late() -> None:
    batch = build_batch([b"v", b"w"], timestamps_ms=[1_000_000, 1_000_000])
    batch[-3] = 0x7E  # the last record's value length (zigzag 63): past the end of its record
    write_crc(batch, 0, len(batch))
    limits = TimestampLimits(60, 40)
    refusal = timestamp_out_of_range(memoryview(batch), parse_header(batch), 1_000_000, limits)
    assert refusal is not None and refusal.corrupt and "cannot be read" in refusal.reason


def _producer_stamped(compression: int, max_timestamp: int) -> bytearray:
    """A producer's batch with the LogAppendTime bit set and ``max_timestamp``, records stamped 5 and 9."""
    batch = bytearray(build_any_batch([b"a" * 50, b"b" * 50], timestamps=[5, 9], compression=compression))
    stamp_log_append_time(memoryview(batch), 0, parse_header(batch), max_timestamp)
    return batch


@pytest.mark.parametrize("compression", [COMPRESSION_NONE, COMPRESSION_GZIP], ids=["plain", "gzip"])
def test_a_producer_log_append_time_batch_is_stored_as_createtime(compression: int) -> None:
    batch = _producer_stamped(compression, 777)
    before = bytes(batch)
    verdict = apply_timestamp_rules(memoryview(batch), parse_header(batch), _now_ms(), None,
                                    log_append_time=False)
    assert verdict.refusal is None
    stored = validate_batch(batch)  # the CRC was recomputed
    assert verdict.header == stored
    assert (stored.timestamp_type, stored.max_timestamp, stored.base_timestamp) == (0, 777, 5)
    assert stored.attributes == parse_header(before).attributes & ~0x08  # compression bits kept
    assert [r.timestamp for r in iter_records(bytes(batch))] == [5, 9]
    changed = [i for i, (a, b) in enumerate(zip(before, batch, strict=True)) if a != b]
    assert all(17 <= i < 23 for i in changed), changed  # only the CRC and the attributes


def test_a_producer_log_append_time_batch_is_refused_where_kafka_refuses_it() -> None:
    for batch, log_append_time in ((_producer_stamped(COMPRESSION_NONE, 777), True),  # a LogAppendTime topic
                                   (_producer_stamped(COMPRESSION_NONE, -1), False)):  # no timestamp
        before = bytes(batch)
        verdict = apply_timestamp_rules(memoryview(batch), parse_header(batch), _now_ms(), None,
                                        log_append_time=log_append_time)
        assert verdict.refusal is not None and not verdict.refusal.corrupt
        assert "must not set the LogAppendTime type" in verdict.refusal.reason
        assert bytes(batch) == before


def test_a_producer_log_append_time_batch_is_checked_by_its_max_timestamp() -> None:
    now = _now_ms()
    limits = TimestampLimits(60_000, 60_000)
    within = _producer_stamped(COMPRESSION_NONE, now)  # its records' own stamps (5, 9) are far older
    assert apply_timestamp_rules(memoryview(within), parse_header(within), now, limits,
                                 log_append_time=False).refusal is None
    late = _producer_stamped(COMPRESSION_NONE, now - 3_600_000)
    verdict = apply_timestamp_rules(memoryview(late), parse_header(late), now, limits, log_append_time=False)
    assert verdict.refusal is not None and f"timestamp {now - 3_600_000}" in verdict.refusal.reason
    assert parse_header(late).timestamp_type == 1  # left as it came


def _claiming(batch: bytearray, max_timestamp: int) -> bytearray:
    """``batch`` with its header's maxTimestamp set to ``max_timestamp`` (records unchanged), CRC valid."""
    batch[MAX_TIMESTAMP_OFFSET : MAX_TIMESTAMP_OFFSET + 8] = max_timestamp.to_bytes(8, "big", signed=True)
    write_crc(batch, 0, len(batch))
    return batch


@pytest.mark.parametrize("compression", [COMPRESSION_NONE, COMPRESSION_GZIP], ids=["plain", "gzip"])
@pytest.mark.parametrize("claimed", [1 << 50, 0, -1, 9])
def test_a_createtime_batch_gets_its_records_max_timestamp_as_kafkas_log_validator_sets_it(
        compression: int, claimed: int) -> None:
    """Kafka's LogValidator: setMaxTimestamp(CREATE_TIME, the largest record timestamp), whatever the
    producer's header said; nothing else of the batch changes and it is appended."""
    batch = _claiming(bytearray(build_any_batch([b"a" * 50, b"b" * 50, b"c"], timestamps=[5, 9, 7],
                                                compression=compression)), claimed)
    before = bytes(batch)
    verdict = apply_timestamp_rules(memoryview(batch), parse_header(batch), _now_ms(), None,
                                    log_append_time=False)
    assert verdict.refusal is None
    stored = validate_batch(batch)  # the CRC was recomputed
    assert verdict.header == stored and (stored.timestamp_type, stored.max_timestamp) == (0, 9)
    assert [r.timestamp for r in iter_records(bytes(batch))] == [5, 9, 7]
    changed = [i for i, (a, b) in enumerate(zip(before, batch, strict=True)) if a != b]
    assert all(17 <= i < 21 or MAX_TIMESTAMP_OFFSET <= i < MAX_TIMESTAMP_OFFSET + 8 for i in changed), changed
    if claimed == 9:
        assert changed == []  # already right: left as it is


def test_records_without_timestamps_make_a_max_timestamp_of_minus_one() -> None:
    batch = _claiming(build_batch([b"v", b"w"], timestamps_ms=[-1, -1]), 12345)
    assert records_max_timestamp(memoryview(batch), parse_header(batch)) == -1
    verdict = apply_timestamp_rules(memoryview(batch), parse_header(batch), _now_ms(), None,
                                    log_append_time=False)
    assert verdict.refusal is None and validate_batch(batch).max_timestamp == -1


def test_the_limits_judge_the_records_not_the_header() -> None:
    """A header claiming a far future max timestamp over records within the limits is appended (with the
    records' max); a header claiming a time within them over a late record is refused for that record."""
    now = _now_ms()
    limits = TimestampLimits(60_000, 60_000)
    lying_high = _claiming(build_batch([b"v", b"w"], timestamps_ms=[now - 10, now]), now + 10**9)
    verdict = apply_timestamp_rules(memoryview(lying_high), parse_header(lying_high), now, limits,
                                    log_append_time=False)
    assert verdict.refusal is None and verdict.header.max_timestamp == now
    lying_low = _claiming(build_batch([b"v", b"w"], timestamps_ms=[now, now + 3_600_000]), now)
    verdict = apply_timestamp_rules(memoryview(lying_low), parse_header(lying_low), now, limits,
                                    log_append_time=False)
    assert verdict.refusal is not None and f"timestamp {now + 3_600_000}" in verdict.refusal.reason


def test_unreadable_records_are_refused_corrupt_without_limits_too() -> None:
    batch = build_batch([b"v", b"w"], timestamps_ms=[1_000_000, 1_000_000])
    batch[-3] = 0x7E  # the last record's value length (zigzag 63): past the end of its record
    write_crc(batch, 0, len(batch))
    before = bytes(batch)
    verdict = apply_timestamp_rules(memoryview(batch), parse_header(batch), _now_ms(), None,
                                    log_append_time=False)
    refusal = verdict.refusal
    assert refusal is not None and refusal.corrupt and "cannot be read" in refusal.reason
    assert bytes(batch) == before


_stamps = st.one_of(st.just(-1), st.integers(0, 1 << 45))


@st.composite
def _frame(draw: st.DrawFn) -> bytes:
    """A producer's frame: a batch (plain or gzip, maybe marked LogAppendTime, maybe claiming a wrong
    maxTimestamp), its records section or count maybe spoiled under a good CRC, or plain garbage."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.binary(max_size=90))
    count = draw(st.integers(1, 6))
    base = draw(_stamps)
    batch = bytearray(build_any_batch(
        [draw(st.binary(max_size=20)) for _ in range(count)],
        keys=[draw(st.one_of(st.none(), st.binary(max_size=5))) for _ in range(count)],
        headers=[[("h", draw(st.one_of(st.none(), st.binary(max_size=3))))] * draw(st.integers(0, 2))
                 for _ in range(count)],
        timestamps=[-1 if base == -1 else base + draw(st.integers(-1000, 1000)) for _ in range(count)],
        compression=draw(st.sampled_from([COMPRESSION_NONE, COMPRESSION_NONE, COMPRESSION_GZIP]))))
    if draw(st.booleans()):
        _claiming(batch, draw(_stamps))
    spoil = draw(st.integers(0, 3))
    if spoil == 1 and len(batch) > HEADER_SIZE:  # a records byte
        batch[draw(st.integers(HEADER_SIZE, len(batch) - 1))] = draw(st.integers(0, 255))
    elif spoil == 2:  # the records count
        batch[RECORDS_COUNT_OFFSET : RECORDS_COUNT_OFFSET + 4] = draw(st.integers(0, 8)).to_bytes(4, "big")
    if spoil:
        write_crc(batch, 0, len(batch))
    if draw(st.integers(0, 5)) == 0:
        stamp_log_append_time(memoryview(batch), 0, parse_header(batch), draw(_stamps))
    return bytes(batch)


@settings(max_examples=60, deadline=None)
@given(st.lists(_frame(), min_size=1, max_size=8), st.integers(0, 7))
def test_the_chunk_walk_answers_as_the_per_batch_walk(frames: list[bytes], gap: int) -> None:
    """records_max_timestamps over a chunk of frames: for every frame the writer accepts, the rules given
    its answer do exactly what they do walking that batch alone (the same verdict, the same bytes)."""
    ring = bytearray(gap)
    starts, lengths = [], []
    for frame in frames:
        starts.append(len(ring))
        lengths.append(len(frame))
        ring += frame + bytes(gap)
    view = np.frombuffer(ring, np.uint8)
    walked = np.empty(len(frames), np.int64)
    records_max_timestamps(view, np.array(starts, np.int64), np.array(lengths, np.int64), walked)
    now = _now_ms()
    for frame, answer in zip(frames, walked.tolist(), strict=True):
        header = check_batch(memoryview(frame))
        if isinstance(header, int):
            continue  # refused before the rules
        if header.compression or header.timestamp_type:
            assert answer == NOT_WALKED
        else:
            alone = records_max_timestamp(memoryview(frame), header)
            if isinstance(alone, int):
                assert answer == alone
            elif answer == NOT_WALKED:  # left to the per-batch path: a timestamp past the int64 range
                assert "past the int64 range" in str(alone)
            else:
                assert str(alone).endswith(f"at byte {-2 - answer}")
        for limits in (None, TimestampLimits(3_600_000, 3_600_000)):
            by_chunk, by_batch = bytearray(frame), bytearray(frame)
            expected = apply_timestamp_rules(memoryview(by_batch), header, now, limits, log_append_time=False)
            assert apply_timestamp_rules(memoryview(by_chunk), header, now, limits, log_append_time=False,
                                         walked=answer) == expected
            assert by_chunk == by_batch


def test_a_record_timestamp_past_int64_is_refused_corrupt() -> None:
    """baseTimestamp + timestampDelta past the int64 range (a CRC-valid producer's bug): refused
    CORRUPT_MESSAGE, the batch left as it came, by the chunk walk as by the per-batch walk."""
    batch = build_batch([b"v", b"w"], timestamps_ms=[0, 100])
    batch[BASE_TIMESTAMP_OFFSET : BASE_TIMESTAMP_OFFSET + 8] = ((1 << 63) - 50).to_bytes(8, "big")
    write_crc(batch, 0, len(batch))
    walked = np.empty(1, np.int64)
    view = np.frombuffer(bytearray(batch), np.uint8)
    records_max_timestamps(view, np.zeros(1, np.int64), np.array([len(batch)], np.int64), walked)
    before = bytes(batch)
    for answer in (NOT_WALKED, int(walked[0])):
        verdict = apply_timestamp_rules(memoryview(batch), parse_header(batch), _now_ms(), None,
                                        log_append_time=False, walked=answer)
        assert verdict.refusal is not None and verdict.refusal.corrupt
        assert "past the int64 range" in verdict.refusal.reason
        assert bytes(batch) == before
