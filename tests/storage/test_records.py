"""RecordBatch v2 records: varints, builder and reader against a list oracle, kernels against their twins."""

from __future__ import annotations

import mmap

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from storage import batch_builder, batch_reader, varint
from storage.batch_builder import (
    NO_SPACE,
    ByteColumn,
    HeaderColumns,
    RecordColumns,
    build,
    build_batch,
    build_into,
    encoded_size,
    max_encoded_size,
    records_size,
)
from storage.batch_header import HEADER_SIZE, parse_header, validate_batch
from storage.batch_reader import Record, decode_batch, iter_batches, iter_records
from storage.compression import COMPRESSION_NONE, COMPRESSION_ZSTD, SUPPORTED_CODECS
from storage.errors import CorruptRecordError

INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1

# ---------------------------------------------------------------------------------------------------------
# Varints


def _reference_zigzag_bytes(value: int) -> bytes:
    """Textbook zig-zag + base-128, with unbounded Python ints: the oracle."""
    unsigned = (value << 1) ^ (value >> 63) if value >= 0 else ((-value) << 1) - 1
    out = bytearray()
    while True:
        group = unsigned & 0x7F
        unsigned >>= 7
        if unsigned:
            out.append(group | 0x80)
        else:
            out.append(group)
            return bytes(out)


@pytest.mark.parametrize(
    ("value", "encoded"),
    [
        (0, b"\x00"),
        (-1, b"\x01"),
        (1, b"\x02"),
        (-2, b"\x03"),
        (63, b"\x7e"),
        (-64, b"\x7f"),
        (64, b"\x80\x01"),
        (300, b"\xd8\x04"),
        (INT64_MAX, b"\xfe" + b"\xff" * 8 + b"\x01"),
        (INT64_MIN, b"\xff" * 9 + b"\x01"),
    ],
)
def test_varint_known_encodings(value: int, encoded: bytes) -> None:
    assert varint.encode_varint(value) == encoded
    assert varint.decode_varlong(encoded, 0) == (value, len(encoded))
    assert varint.size_of_varint(value) == len(encoded)


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=INT64_MIN, max_value=INT64_MAX))
def test_varint_encoding_matches_reference_and_twins(value: int) -> None:
    expected = _reference_zigzag_bytes(value)
    assert varint.encode_varint(value) == expected
    for size_of in (varint.size_of_varint, varint.size_of_varint.py_func):
        assert size_of(value) == len(expected)
    out_compiled = np.zeros(12, dtype=np.uint8)
    out_python = np.zeros(12, dtype=np.uint8)
    assert varint.write_varint(out_compiled, 1, value) == 1 + len(expected)
    assert varint.write_varint.py_func(out_python, 1, value) == 1 + len(expected)
    assert (
        out_compiled.tobytes() == out_python.tobytes() == b"\x00" + expected + b"\x00" * (11 - len(expected))
    )
    array = np.frombuffer(expected, dtype=np.uint8)
    assert varint.read_varlong(array, 0, len(expected)) == (value, len(expected))
    assert varint._read_zigzag.py_func(array, 0, len(expected), 10, 1) == (value, len(expected))
    assert varint.parse_varint(expected, 0, len(expected), wide=True) == (value, len(expected))
    if -(1 << 31) <= value < (1 << 31):
        assert varint.read_varint(array, 0, len(expected)) == (value, len(expected))
        assert varint.decode_varint(expected, 0) == (value, len(expected))
    else:
        assert varint.read_varint(array, 0, len(expected))[1] == varint.VARINT_TOO_LONG


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=0, max_size=12), st.booleans())
def test_varint_decoders_agree_on_any_bytes(data: bytes, wide: bool) -> None:
    """Compiled kernel, its Python twin and the cold-path decoder agree on garbage too."""
    array = np.frombuffer(data, dtype=np.uint8)
    limits = (10, 1) if wide else (5, 15)
    compiled = (varint.read_varlong if wide else varint.read_varint)(array, 0, len(data))
    twin = varint._read_zigzag.py_func(array, 0, len(data), *limits)
    plain = varint.parse_varint(data, 0, len(data), wide)
    assert compiled == twin == plain
    if compiled[1] > 0:  # a valid encoding is the canonical one or a padded one; re-reading it is stable
        assert compiled[1] <= limits[0]


@pytest.mark.parametrize(
    ("data", "wide", "code"),
    [
        (b"", False, varint.VARINT_TRUNCATED),
        (b"\x80\x80", False, varint.VARINT_TRUNCATED),
        (b"\xff\xff\xff\xff\x7f", False, varint.VARINT_TOO_LONG),  # 5th byte has bits past 32
        (b"\x80\x80\x80\x80\x80\x00", False, varint.VARINT_TOO_LONG),  # 6 bytes
        (b"\xff" * 9 + b"\x02", True, varint.VARINT_TOO_LONG),  # 10th byte has bits past 64
        (b"\x80" * 10 + b"\x00", True, varint.VARINT_TOO_LONG),  # 11 bytes
    ],
)
def test_absurd_varints_are_errors_with_position(data: bytes, wide: bool, code: int) -> None:
    padded = b"\x00\x00" + data
    assert varint.parse_varint(padded, 2, len(padded), wide) == (0, code)
    decode = varint.decode_varlong if wide else varint.decode_varint
    with pytest.raises(CorruptRecordError, match="at byte 2"):
        decode(padded, 2)


# ---------------------------------------------------------------------------------------------------------
# Builder and reader against a list oracle

values_st = st.one_of(st.none(), st.binary(max_size=200))
headers_st = st.lists(
    st.tuples(st.text(max_size=8), st.one_of(st.none(), st.binary(max_size=16))), max_size=3
)


@st.composite
def batches(draw: st.DrawFn) -> dict[str, object]:
    count = draw(st.integers(min_value=1, max_value=20))
    values = draw(st.lists(values_st, min_size=count, max_size=count))
    keys = draw(st.one_of(st.none(), st.lists(values_st, min_size=count, max_size=count)))
    headers = draw(st.one_of(st.none(), st.lists(headers_st, min_size=count, max_size=count)))
    timestamps = draw(
        st.one_of(
            st.none(),
            st.lists(st.integers(min_value=-(1 << 61), max_value=1 << 61), min_size=count, max_size=count),
            st.lists(
                st.integers(min_value=1_600_000_000_000, max_value=1_800_000_000_000),
                min_size=count,
                max_size=count,
            ),
        )
    )
    return {
        "values": values,
        "keys": keys,
        "headers": headers,
        "timestamps": timestamps,
        "base_offset": draw(st.integers(min_value=0, max_value=1 << 50)),
        "timestamp_ms": draw(st.integers(min_value=0, max_value=1 << 42)),
        "compression": draw(st.sampled_from(SUPPORTED_CODECS)),
        "timestamp_type": draw(st.sampled_from([0, 1])),
        "producer_id": draw(st.sampled_from([-1, 0, 12345678901])),
        "producer_epoch": draw(st.sampled_from([-1, 0, 7])),
        "base_sequence": draw(st.sampled_from([-1, 0, 2**31 - 5])),
        "partition_leader_epoch": draw(st.sampled_from([-1, 0, 3])),
        "is_transactional": draw(st.booleans()),
    }


def _oracle(spec: dict[str, object]) -> list[Record]:
    values = spec["values"]
    assert isinstance(values, list)
    count = len(values)
    keys = spec["keys"] or [None] * count
    headers = spec["headers"] or [[] for _ in range(count)]
    timestamps = spec["timestamps"] or [spec["timestamp_ms"]] * count
    assert isinstance(timestamps, list) and isinstance(keys, list) and isinstance(headers, list)
    if spec["timestamp_type"] == 1:
        timestamps = [max(timestamps)] * count
    base = spec["base_offset"]
    assert isinstance(base, int)
    return [Record(base + i, timestamps[i], keys[i], values[i], tuple(headers[i])) for i in range(count)]


def _build(spec: dict[str, object]) -> bytes:
    return build_batch(**spec)  # type: ignore[arg-type]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches())
def test_build_then_read_round_trips(spec: dict[str, object]) -> None:
    batch = _build(spec)
    expected = _oracle(spec)
    header = validate_batch(batch)
    assert header.size == len(batch)
    assert header.base_offset == spec["base_offset"]
    assert header.records_count == len(expected) == header.last_offset_delta + 1
    assert header.compression == spec["compression"]
    assert header.timestamp_type == spec["timestamp_type"]
    assert header.is_transactional == spec["is_transactional"]
    assert not header.is_control
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (
        spec["producer_id"],
        spec["producer_epoch"],
        spec["base_sequence"],
    )
    assert header.partition_leader_epoch == spec["partition_leader_epoch"]
    timestamps = spec["timestamps"] or [spec["timestamp_ms"]] * len(expected)
    assert isinstance(timestamps, list)
    assert header.base_timestamp == timestamps[0]
    assert header.max_timestamp == max(timestamps)

    assert list(iter_records(batch)) == expected
    decoded = decode_batch(batch)
    assert list(decoded.records()) == expected
    assert decoded.offsets.tolist() == [r.offset for r in expected]
    assert decoded.timestamps.tolist() == [r.timestamp for r in expected]
    assert decoded.key_lengths.tolist() == [-1 if r.key is None else len(r.key) for r in expected]
    assert decoded.value_lengths.tolist() == [-1 if r.value is None else len(r.value) for r in expected]
    assert decoded.header_counts.tolist() == [len(r.headers) for r in expected]
    if spec["compression"] == COMPRESSION_NONE:
        assert len(batch) == encoded_size(_columns(spec))
    assert len(batch) <= max_encoded_size(_columns(spec), spec["compression"])  # type: ignore[arg-type]


def _columns(spec: dict[str, object]) -> RecordColumns:
    return RecordColumns.from_lists(spec["values"], spec["keys"], spec["headers"], spec["timestamps"])  # type: ignore[arg-type]


def _kernel_outputs(kernel: object, data: np.ndarray, header: object, count: int) -> tuple[object, ...]:
    arrays = [np.full(count, -7, dtype=np.int64) for _ in range(8)]
    result = kernel(
        data,
        count,
        header.base_offset,
        header.base_timestamp,  # type: ignore[operator, attr-defined]
        header.timestamp_type == 1,
        header.max_timestamp,
        *arrays,
    )  # type: ignore[attr-defined]
    return (result, *[a.tolist() for a in arrays])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches())
def test_kernels_and_their_python_twins_agree(spec: dict[str, object]) -> None:
    columns = _columns(spec)
    args = batch_builder._kernel_args(columns)
    assert batch_builder._records_size(*args) == batch_builder._records_size.py_func(*args)
    size = records_size(columns)
    compiled = np.zeros(size + 8, dtype=np.uint8)
    twin = np.zeros(size + 8, dtype=np.uint8)
    assert batch_builder._encode_records(compiled, 3, *args) == 3 + size
    assert batch_builder._encode_records.py_func(twin, 3, *args) == 3 + size
    assert compiled.tobytes() == twin.tobytes()

    batch = _build(spec)
    header = parse_header(batch)
    data = batch_reader.records_data(batch, 0, header)
    assert _kernel_outputs(
        batch_reader.decode_records, data, header, header.records_count
    ) == _kernel_outputs(batch_reader.decode_records.py_func, data, header, header.records_count)


# ---------------------------------------------------------------------------------------------------------
# Columns, caller buffers, sizes


def _columns_10(value_size: int = 100) -> RecordColumns:
    count = 10
    data = np.frombuffer(bytes(range(256)) * 4, dtype=np.uint8)[: count * value_size]
    return RecordColumns(ByteColumn(data, np.arange(count + 1, dtype=np.int64) * value_size))


def test_build_into_a_shared_mmap_at_a_position_and_read_back() -> None:
    columns = _columns_10()
    size = encoded_size(columns)
    with mmap.mmap(-1, 4096) as region:
        array = np.frombuffer(region, dtype=np.uint8)
        array[:] = 0xAA
        written = build_into(array, 100, columns, base_offset=42, timestamp_ms=1_700_000_000_000)
        assert written == size
        assert array[:100].tolist() == [0xAA] * 100  # nothing before position touched
        assert array[100 + size :].tolist() == [0xAA] * (4096 - 100 - size)  # nor after the batch
        records = list(iter_records(region, 100))
        del array
    assert [r.offset for r in records] == list(range(42, 52))
    assert all(r.timestamp == 1_700_000_000_000 and r.key is None and r.headers == () for r in records)
    assert records[3].value == (bytes(range(256)) * 4)[300:400]


def test_build_into_memoryview_and_bytearray_equal_build() -> None:
    columns = _columns_10()
    expected = build(columns, timestamp_ms=5)
    for out in (bytearray(len(expected) + 10), memoryview(bytearray(len(expected) + 10))):
        assert build_into(out, 10, columns, timestamp_ms=5) == len(expected)
        assert bytes(out[10:]) == expected
    with mmap.mmap(-1, len(expected) + 10) as region:
        assert build_into(region, 10, columns, timestamp_ms=5) == len(expected)
        assert region[10:] == expected


@pytest.mark.parametrize("compression", [COMPRESSION_NONE, COMPRESSION_ZSTD])
def test_build_into_returns_no_space_and_leaves_buffer_unchanged(compression: int) -> None:
    columns = _columns_10()
    needed = len(build(columns, timestamp_ms=5, compression=compression))
    out = np.full(needed + 19, 0x55, dtype=np.uint8)
    assert build_into(out, 20, columns, timestamp_ms=5, compression=compression) == NO_SPACE
    assert out.tolist() == [0x55] * (needed + 19)
    assert build_into(out, 19, columns, timestamp_ms=5, compression=compression) == needed
    validate_batch(out.tobytes(), 19)


def test_build_into_refuses_read_only_buffers() -> None:
    with pytest.raises(TypeError, match="read-only"):
        build_into(bytes(4096), 0, _columns_10(), timestamp_ms=5)


def test_zstd_compresses_the_records_section_only() -> None:
    columns = _columns_10()
    plain = build(columns, timestamp_ms=5)
    packed = build(columns, timestamp_ms=5, compression=COMPRESSION_ZSTD)
    assert parse_header(packed).compression == COMPRESSION_ZSTD
    assert len(packed) < len(plain)
    assert list(iter_records(packed)) == list(iter_records(plain))
    assert decode_batch(packed).data.tobytes() == plain[HEADER_SIZE:]


def test_sizes_are_exact_and_bounds_hold_for_incompressible_data() -> None:
    rng = np.random.default_rng(7)
    for count, value_size in ((1, 0), (3, 1), (50, 1000), (200, 20000)):
        data = rng.integers(0, 256, count * value_size, dtype=np.uint8)
        columns = RecordColumns(ByteColumn(data, np.arange(count + 1, dtype=np.int64) * value_size))
        assert (
            len(build(columns, timestamp_ms=1))
            == encoded_size(columns)
            == HEADER_SIZE + records_size(columns)
        )
        for codec in SUPPORTED_CODECS:
            assert len(build(columns, timestamp_ms=1, compression=codec)) <= max_encoded_size(columns, codec)


def test_log_append_time_reads_max_timestamp_and_flags_are_kept() -> None:
    batch = build_batch(
        [b"a", b"b"],
        timestamps=[10, 30],
        timestamp_type=1,
        is_transactional=True,
        producer_id=9,
        producer_epoch=1,
        base_sequence=0,
    )
    header = validate_batch(batch)
    assert (header.timestamp_type, header.is_transactional, header.is_control) == (1, True, False)
    assert [r.timestamp for r in iter_records(batch)] == [30, 30]
    assert decode_batch(batch).timestamps.tolist() == [30, 30]
    control = build_batch([b"\x00\x00\x00\x01"], keys=[b"\x00\x00\x00\x01"], is_control=True, timestamp_ms=1)
    assert validate_batch(control).is_control


def test_array_columns_with_nulls_and_headers() -> None:
    values = ByteColumn(
        np.frombuffer(b"onetwothree", dtype=np.uint8),
        np.array([0, 3, 6, 6, 11]),
        np.array([False, False, True, False]),
    )
    keys = ByteColumn(
        np.frombuffer(b"k", dtype=np.uint8), np.array([0, 1, 1, 1, 1]), np.array([False, True, True, False])
    )
    headers = HeaderColumns(
        np.array([0, 2, 2, 2, 3]),
        ByteColumn(np.frombuffer(b"abc", dtype=np.uint8), np.array([0, 1, 2, 3])),
        ByteColumn(
            np.frombuffer(b"xy", dtype=np.uint8), np.array([0, 1, 1, 2]), np.array([False, True, False])
        ),
    )
    timestamps = np.array([5, 3, 9, 4])
    batch = build(RecordColumns(values, keys, headers, timestamps))
    assert list(iter_records(batch)) == [
        Record(0, 5, b"k", b"one", (("a", b"x"), ("b", None))),
        Record(1, 3, None, b"two", ()),
        Record(2, 9, None, None, ()),
        Record(3, 4, b"", b"three", (("c", b"y"),)),
    ]


@pytest.mark.parametrize(
    ("columns", "message"),
    [
        (RecordColumns(ByteColumn(np.zeros(0, np.uint8), np.array([0]))), "at least one record"),
        (RecordColumns(ByteColumn(np.zeros(4, np.uint8), np.array([0, 3, 2]))), "values: offsets entry 2"),
        (RecordColumns(ByteColumn(np.zeros(4, np.uint8), np.array([0, 2, 5]))), "values: offsets entry 2"),
        (
            RecordColumns(ByteColumn(np.zeros(4, np.uint8), np.array([0, 2])), timestamps=np.array([1, 2])),
            "timestamps: 2 entries, expected 1",
        ),
        (
            RecordColumns(
                ByteColumn(np.zeros(4, np.uint8), np.array([0, 2])), timestamps=np.array([1 << 62])
            ),
            "timestamps: entry 0",
        ),
        (
            RecordColumns(
                ByteColumn(np.zeros(4, np.uint8), np.array([0, 2])),
                ByteColumn(np.zeros(4, np.uint8), np.array([0, 1, 2])),
            ),
            "keys offsets: 3 entries",
        ),
        (
            RecordColumns(
                ByteColumn(np.zeros(4, np.uint8), np.array([0, 2])),
                headers=HeaderColumns(
                    np.array([0, 2]),
                    ByteColumn(np.zeros(1, np.uint8), np.array([0, 1])),
                    ByteColumn(np.zeros(1, np.uint8), np.array([0, 1])),
                ),
            ),
            "header offsets: entry 1",
        ),
    ],
)
def test_inconsistent_columns_are_refused(columns: RecordColumns, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build(columns, timestamp_ms=0)


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="unsupported compression codec 5"):
        build_batch([b"x"], compression=5)
    with pytest.raises(ValueError, match="timestamp_type"):
        build_batch([b"x"], timestamp_type=2)
    with pytest.raises(ValueError, match="keys: 2 entries for 1 values"):
        build_batch([b"x"], keys=[b"a", b"b"])


def test_iter_batches_walks_consecutive_batches() -> None:
    first = build_batch([b"a", b"b"], base_offset=0, timestamp_ms=1)
    second = build_batch([b"c"], base_offset=2, timestamp_ms=2, compression=COMPRESSION_ZSTD)
    buf = first + second
    walked = list(iter_batches(buf))
    assert [(position, header.base_offset, header.records_count) for position, header in walked] == [
        (0, 0, 2),
        (len(first), 2, 1),
    ]
    iterator = iter_batches(buf, position=len(first))
    assert [position for position, _ in iterator] == [len(first)]
    assert iterator.position == len(buf) and iterator.truncated_tail_bytes == 0
    assert [r.value for at, _ in iter_batches(buf) for r in decode_batch(buf, at).records()] == [
        b"a",
        b"b",
        b"c",
    ]


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=0, max_size=12), st.binary(min_size=0, max_size=9), st.integers(0, 12))
def test_quick_varint_reader_agrees_with_read_varint(data: bytes, after: bytes, end: int) -> None:
    """``read_varint_quick`` (one 8-byte load where eight bytes lie inside the array, else ``read_varint``)
    reads what ``read_varint`` reads, whatever the bytes past ``end``; ``short_varint`` of a word is the
    varint it starts with when that takes one or two bytes."""
    array = np.frombuffer(data + after, dtype=np.uint8)
    end = min(end, len(data))
    assert varint.read_varint_quick(array, 0, end) == varint.read_varint(array, 0, end)
    value, size = varint.short_varint(np.uint64(int.from_bytes((data + after + bytes(8))[:8], "little")))
    if 0 < size <= len(array):
        assert varint.read_varint(array, 0, len(array)) == (value, size)
