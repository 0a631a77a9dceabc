"""Byte compatibility with an implementation nobody here wrote: kafka-python's ``kafka.record``."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

with warnings.catch_warnings():
    # kafka/__init__ imports its protocol package: importlib.resources.read_text, deprecated on 3.11
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
    from kafka.record.memory_records import MemoryRecords

from storage.batch_builder import ByteColumn, RecordColumns, build, build_batch
from storage.batch_header import stamp, validate_batch
from storage.batch_reader import Record, decode_batch, iter_batches, iter_records
from storage.compression import (
    COMPRESSION_GZIP,
    COMPRESSION_LZ4,
    COMPRESSION_NONE,
    COMPRESSION_SNAPPY,
    COMPRESSION_ZSTD,
)

EVERY_CODEC = [COMPRESSION_NONE, COMPRESSION_GZIP, COMPRESSION_SNAPPY, COMPRESSION_LZ4, COMPRESSION_ZSTD]

VALUES = [b"first value", None, b"", b"\x00\xff binary \x80", b"v" * 1000, b"last"]
KEYS = [b"key-0", b"key-1", None, b"", None, b"\xfe"]
HEADERS = [
    [("trace-id", b"abc123")],
    [],
    [("null-valued", None), ("empty", b"")],
    [("unicodé ключ", b"\x01\x02")],
    [("a", b"1"), ("b", b"2"), ("c", b"3")],
    [],
]
TIMESTAMPS = [
    1_700_000_000_000,
    1_700_000_000_005,
    1_699_999_999_990,
    1_700_000_001_000,
    0,
    1_700_000_000_000,
]


def _kafka_records(batch: bytes) -> list[Record]:
    parsed = DefaultRecordBatch(batch)
    assert parsed.validate_crc()
    return [Record(r.offset, r.timestamp, r.key, r.value, tuple(r.headers)) for r in parsed]


def _expected(base_offset: int, timestamps: list[int]) -> list[Record]:
    return [
        Record(base_offset + i, timestamps[i], KEYS[i], VALUES[i], tuple(HEADERS[i]))
        for i in range(len(VALUES))
    ]


@pytest.mark.parametrize("compression", EVERY_CODEC)
def test_our_batches_decode_with_kafka_python(compression: int) -> None:
    batch = build_batch(
        VALUES,
        KEYS,
        HEADERS,
        TIMESTAMPS,
        base_offset=1234,
        compression=compression,
        producer_id=77,
        producer_epoch=3,
        base_sequence=10,
    )
    parsed = DefaultRecordBatch(batch)
    assert parsed.validate_crc()
    assert parsed.magic == 2
    assert parsed.base_offset == 1234
    assert parsed.last_offset == 1234 + len(VALUES) - 1
    assert parsed.records_count == len(VALUES)
    assert parsed.compression_type == compression
    assert (parsed.first_timestamp, parsed.max_timestamp) == (TIMESTAMPS[0], max(TIMESTAMPS))
    assert (parsed.producer_id, parsed.producer_epoch, parsed.base_sequence) == (77, 3, 10)
    assert parsed.size_in_bytes == len(batch)
    assert _kafka_records(batch) == _expected(1234, TIMESTAMPS)


def test_log_append_time_and_transactional_bits_as_kafka_reads_them() -> None:
    batch = build_batch(
        VALUES,
        KEYS,
        HEADERS,
        TIMESTAMPS,
        timestamp_type=1,
        is_transactional=True,
        producer_id=5,
        producer_epoch=0,
        base_sequence=0,
    )
    parsed = DefaultRecordBatch(batch)
    assert parsed.timestamp_type == 1 and parsed.is_transactional and not parsed.is_control_batch
    assert {r.timestamp for r in DefaultRecordBatch(batch)} == {max(TIMESTAMPS)}


def test_stamped_batches_in_a_segment_read_with_memory_records() -> None:
    """Stamping baseOffset/partitionLeaderEpoch after the CRC leaves it valid, as the log will do."""
    segment = bytearray()
    expected: list[tuple[int, bytes | None]] = []
    next_offset = 0
    for n, compression in enumerate([COMPRESSION_NONE, COMPRESSION_ZSTD, COMPRESSION_NONE]):
        batch = bytearray(build_batch(VALUES[: n + 2], timestamp_ms=1000 + n, compression=compression))
        stamp(batch, 0, next_offset, partition_leader_epoch=7)
        segment += batch
        expected += [(next_offset + i, v) for i, v in enumerate(VALUES[: n + 2])]
        next_offset += n + 2
    records = MemoryRecords(bytes(segment))
    seen = []
    while records.has_next():
        parsed = records.next_batch()
        assert parsed.validate_crc() and parsed.leader_epoch == 7
        seen += [(r.offset, r.value) for r in parsed]
    assert seen == expected
    assert [h.base_offset for _, h in iter_batches(bytes(segment))] == [0, 2, 5]


def test_uncompressed_batch_is_byte_identical_to_kafka_pythons() -> None:
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=False,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 20,
    )
    for i, value in enumerate(VALUES):
        builder.append(i, timestamp=TIMESTAMPS[i], key=KEYS[i], value=value, headers=HEADERS[i])
    theirs = bytes(builder.build())
    ours = build_batch(VALUES, KEYS, HEADERS, TIMESTAMPS, partition_leader_epoch=0)
    assert ours == theirs


def _kafka_build(
    compression: int,
    values: list[bytes | None],
    keys: list[bytes | None],
    headers: list[list[tuple[str, bytes | None]]],
    timestamps: list[int],
) -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=compression,
        is_transactional=False,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 24,
    )
    for i, value in enumerate(values):
        assert (
            builder.append(i, timestamp=timestamps[i], key=keys[i], value=value, headers=headers[i])
            is not None
        )
    return bytes(builder.build())


@pytest.mark.parametrize("compression", EVERY_CODEC)
def test_kafka_python_batches_decode_with_ours(compression: int) -> None:
    values = [v if v is None else v * 20 for v in VALUES]  # compressible, so kafka-python keeps the codec
    batch = _kafka_build(compression, values, KEYS, HEADERS, TIMESTAMPS)
    header = validate_batch(batch)
    assert header.compression == compression
    expected = [Record(i, TIMESTAMPS[i], KEYS[i], values[i], tuple(HEADERS[i])) for i in range(len(values))]
    assert list(iter_records(batch)) == expected
    decoded = decode_batch(batch)
    assert list(decoded.records()) == expected
    assert decoded.offsets.tolist() == list(range(len(values)))
    assert decoded.timestamps.tolist() == TIMESTAMPS


def test_array_built_batch_of_many_records_decodes_with_kafka_python() -> None:
    count = 2000
    rng = np.random.default_rng(3)
    lengths = rng.integers(0, 300, count)
    offsets = np.zeros(count + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    data = rng.integers(0, 256, int(offsets[-1]), dtype=np.uint8)
    nulls = rng.random(count) < 0.1
    timestamps = 1_700_000_000_000 + rng.integers(-5000, 5000, count)
    columns = RecordColumns(ByteColumn(data, offsets, nulls), timestamps=timestamps)
    for compression in EVERY_CODEC:
        batch = build(columns, base_offset=10**12, compression=compression)
        got = _kafka_records(batch)
        assert [r.offset for r in got] == list(range(10**12, 10**12 + count))
        assert [r.timestamp for r in got] == timestamps.tolist()
        raw = data.tobytes()
        assert [r.value for r in got] == [
            None if nulls[i] else raw[offsets[i] : offsets[i + 1]] for i in range(count)
        ]


records_st = st.lists(
    st.tuples(
        st.one_of(st.none(), st.binary(max_size=64)),
        st.one_of(st.none(), st.binary(max_size=64)),
        st.lists(st.tuples(st.text(max_size=6), st.one_of(st.none(), st.binary(max_size=8))), max_size=2),
        st.integers(min_value=0, max_value=1 << 45),
    ),
    min_size=1,
    max_size=12,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records_st, st.sampled_from(EVERY_CODEC))
def test_round_trips_through_kafka_python_both_ways(records: list[Any], compression: int) -> None:
    values = [r[0] for r in records]
    keys = [r[1] for r in records]
    headers = [r[2] for r in records]
    timestamps = [r[3] for r in records]
    expected = [Record(i, timestamps[i], keys[i], values[i], tuple(headers[i])) for i in range(len(records))]
    ours = build_batch(values, keys, headers, timestamps, compression=compression)
    assert _kafka_records(ours) == expected
    theirs = _kafka_build(compression, values, keys, headers, timestamps)
    assert list(iter_records(theirs)) == expected
    assert list(decode_batch(theirs).records()) == expected
