"""The builder's value-list path (``storage.value_lists``: a list of bytes read where CPython keeps them),
which every ``Producer.send`` batch goes through: the same bytes as the column path, against a decoded
list oracle; the kernels against their pure-Python twins; bad items and changed lists refused without a
byte written past the frame."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from storage import value_lists as kernels
from storage.batch_builder import (
    NO_SPACE,
    ByteColumn,
    RecordColumns,
    build,
    build_into,
    records_size,
)
from storage.batch_header import HEADER_SIZE, parse_header, validate_batch
from storage.batch_reader import iter_records
from storage.compression import COMPRESSION_GZIP, COMPRESSION_NONE, COMPRESSION_ZSTD
from storage.value_lists import VALUE_LISTS_IN_PLACE

value_lists = st.lists(st.one_of(st.none(), st.binary(max_size=300)), min_size=1, max_size=60)
HEADER_FIELDS: dict[str, Any] = {"producer_id": 7, "producer_epoch": 2, "base_sequence": 40,
                                 "timestamp_ms": 1_700_000_000_123}


def _columns(values: list[bytes | None]) -> RecordColumns:
    return RecordColumns(ByteColumn.from_list(values))


def test_this_interpreter_reads_value_lists_in_place() -> None:
    assert VALUE_LISTS_IN_PLACE, "CPython 64-bit: the declared object layout was checked at import"


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value_lists, st.sampled_from([COMPRESSION_NONE, COMPRESSION_ZSTD, COMPRESSION_GZIP]))
def test_a_value_list_builds_the_same_batch_as_its_columns(values: list[bytes | None], codec: int) -> None:
    batch = build(values, compression=codec, **HEADER_FIELDS)
    assert batch == build(_columns(values), compression=codec, **HEADER_FIELDS)
    validate_batch(batch)
    header = parse_header(batch)
    assert (header.records_count, header.producer_id, header.base_sequence) == (len(values), 7, 40)
    records = list(iter_records(batch))
    assert [r.value for r in records] == values
    assert all(r.key is None and r.headers == () and r.timestamp == HEADER_FIELDS["timestamp_ms"]
               for r in records)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value_lists, st.integers(0, 9))
def test_build_into_writes_exactly_the_batch_or_nothing(values: list[bytes | None], position: int) -> None:
    expected = build(values, **HEADER_FIELDS)
    out = np.full(position + len(expected) + 5, 0xEE, np.uint8)
    assert build_into(out, position, values, **HEADER_FIELDS) == len(expected)
    assert out[position : position + len(expected)].tobytes() == expected
    assert (out[:position] == 0xEE).all() and (out[position + len(expected) :] == 0xEE).all()
    short = np.full(position + len(expected) - 1, 0xEE, np.uint8)
    assert build_into(short, position, values, **HEADER_FIELDS) == NO_SPACE
    assert (short == 0xEE).all(), "NO_SPACE writes nothing"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value_lists)
def test_the_list_kernels_and_their_python_twins_agree(values: list[bytes | None]) -> None:
    args = (id(values), len(values), id(bytes), id(None))
    size, code = kernels._list_records_size(*args)
    assert (size, code) == kernels._list_records_size.py_func(*args)
    assert code == 0 and size == records_size(_columns(values))
    compiled = np.zeros(size + 8, np.uint8)
    twin = np.zeros(size + 8, np.uint8)
    assert kernels._encode_list(compiled, 3, 3 + size, *args) == 3 + size
    assert kernels._encode_list.py_func(twin, 3, 3 + size, *args) == 3 + size
    assert compiled.tobytes() == twin.tobytes()
    assert compiled[3 : 3 + size].tobytes() == build(values, timestamp_ms=0)[HEADER_SIZE:]


@pytest.mark.parametrize("kernel", ["compiled", "python twin"])
def test_the_encoder_never_writes_at_or_past_its_limit(kernel: str) -> None:
    """A list that changed after it was sized (longer values, fewer items, an item no longer bytes) makes
    the encoder stop with -1 instead of writing past the room it was given."""
    encode = kernels._encode_list if kernel == "compiled" else kernels._encode_list.py_func
    values: list[object] = [b"a" * 50, b"b" * 50, b"c" * 50]
    size = records_size(_columns(values[:2]))  # type: ignore[arg-type]
    out = np.full(size + 100, 0xEE, np.uint8)
    assert encode(out, 0, size, id(values), 3, id(bytes), id(None)) == -1  # three items in room for two
    assert (out[size:] == 0xEE).all()
    assert encode(out, 0, size + 100, id(values), 4, id(bytes), id(None)) == -1  # more items than the list
    values[1] = "no longer bytes"
    assert encode(out, 0, size + 100, id(values), 3, id(bytes), id(None)) == -1


@pytest.mark.parametrize("bad", ["text", bytearray(b"x"), memoryview(b"x"), 42, [b"x"]])
def test_an_item_that_is_not_bytes_is_refused_by_index(bad: object) -> None:
    values = [b"fine", None, bad]
    out = np.full(4096, 0xEE, np.uint8)
    with pytest.raises(TypeError, match=rf"values\[2\]: expected bytes or None, got {type(bad).__name__}"):
        build_into(out, 0, values)
    assert (out == 0xEE).all()
    with pytest.raises(TypeError, match=r"values\[2\]"):
        build(values)


def test_an_empty_list_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one record"):
        build([])


def test_large_values_are_copied_once_and_whole() -> None:
    values = [bytes([i]) * (10 * 1024) for i in range(40)] + [None, b""]
    batch = build(values, **HEADER_FIELDS)
    assert batch == build(_columns(values), **HEADER_FIELDS)
    assert [r.value for r in iter_records(batch)] == values
