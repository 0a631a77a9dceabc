"""Primitive types: varints against kafka-python's codecs as the oracle, and every reader against malformed
input (truncation, negative and absurd lengths, bad UTF-8, over-long varints, disordered tags)."""

from __future__ import annotations

import warnings

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ipc.kafka import primitives as p
from storage.errors import ProtocolError

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)  # kafka-python imports use a deprecated read_text
    from kafka.protocol.schemas.fields.codecs.types import UnsignedVarInt32, VarInt32, VarInt64

INT32 = st.integers(-(1 << 31), (1 << 31) - 1)
INT64 = st.integers(-(1 << 63), (1 << 63) - 1)


def mv(data: bytes) -> memoryview:
    return memoryview(data)


@given(INT32)
def test_varint_matches_kafka_python_and_round_trips(value: int) -> None:
    out = bytearray()
    p.write_varint(out, value)
    assert bytes(out) == VarInt32.encode(value)
    assert p.read_varint(mv(bytes(out) + b"tail"), 0) == (value, len(out))


@given(INT64)
def test_varlong_matches_kafka_python_and_round_trips(value: int) -> None:
    out = bytearray()
    p.write_varint(out, value)
    assert bytes(out) == VarInt64.encode(value)
    assert p.read_varlong(mv(bytes(out)), 0) == (value, len(out))


@given(st.integers(0, (1 << 32) - 1))
def test_unsigned_varint_matches_kafka_python_and_round_trips(value: int) -> None:
    out = bytearray()
    p.write_uvarint(out, value)
    assert bytes(out) == UnsignedVarInt32.encode(value)
    assert p.read_uvarint(mv(bytes(out)), 0) == (value, len(out))


def test_known_varint_vectors() -> None:
    assert p.read_uvarint(mv(b"\xac\x02"), 0) == (300, 2)
    assert p.read_varint(mv(b"\x01"), 0) == (-1, 1)
    assert p.read_varint(mv(b"\x02"), 0) == (1, 1)
    assert p.read_varlong(mv(b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01"), 0) == (-(1 << 63), 10)


@pytest.mark.parametrize(
    ("data", "reader", "message"),
    [
        (b"\x80\x80\x80\x80\x80\x01", p.read_uvarint, "longer than 5"),
        (b"\xff\xff\xff\xff\x1f", p.read_uvarint, "overflows 32"),
        (b"\x80\x80", p.read_uvarint, "truncated"),
        (b"", p.read_varint, "truncated"),
        (b"\xff" * 10 + b"\x01", p.read_varlong, "longer than 10"),
        (b"\xff" * 9 + b"\x02", p.read_varlong, "overflows 64"),
    ],
)
def test_bad_varints_are_refused(data: bytes, reader: object, message: str) -> None:
    with pytest.raises(ProtocolError, match=message):
        reader(mv(data), 0)  # type: ignore[operator]


def test_strings() -> None:
    out = bytearray()
    p.write_string(out, "日本")
    p.write_string(out, None)
    p.write_string(out, "")
    data = mv(bytes(out))
    s, pos = p.read_string(data, 0)
    assert s == "日本"
    assert p.read_nullable_string(data, pos) == (None, pos + 2)
    with pytest.raises(ProtocolError, match="null"):
        p.read_string(data, pos)
    assert p.read_string(data, pos + 2) == ("", len(data))


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\xff\xfe", "length -2"),
        (b"\x00\x05abc", "truncated string"),
        (b"\x00", "truncated string length"),
        (b"\x00\x02\xc3\x28", "not valid UTF-8"),
    ],
)
def test_malformed_strings_are_refused(data: bytes, message: str) -> None:
    with pytest.raises(ProtocolError, match=message):
        p.read_nullable_string(mv(data), 0)


def test_a_string_longer_than_int16_cannot_be_encoded() -> None:
    with pytest.raises(ValueError, match="32767"):
        p.write_string(bytearray(), "x" * 40000)


def test_bytes_are_zero_copy_views() -> None:
    data = b"\x00\x00\x00\x03abc\xff\xff\xff\xff"
    view, pos = p.read_bytes(mv(data), 0, nullable=True)
    assert view is not None and view.obj is data and view == b"abc"
    assert p.read_bytes(mv(data), pos, nullable=True) == (None, len(data))
    with pytest.raises(ProtocolError, match="length -1"):
        p.read_bytes(mv(data), pos, nullable=False)
    with pytest.raises(ProtocolError, match="truncated bytes"):
        p.read_bytes(mv(b"\x7f\xff\xff\xffabc"), 0, nullable=True)


def test_absurd_array_counts_are_refused_before_any_allocation() -> None:
    with pytest.raises(ProtocolError, match="cannot fit"):
        p.read_array_length(mv(b"\x7f\xff\xff\xff" + bytes(100)), 0, 4, nullable=False)
    assert p.read_array_length(mv(b"\x00\x00\x00\x19" + bytes(100)), 0, 4, nullable=False) == (25, 4)
    assert p.read_array_length(mv(b"\xff\xff\xff\xff"), 0, 4, nullable=True) == (-1, 4)
    with pytest.raises(ProtocolError, match="length -1"):
        p.read_array_length(mv(b"\xff\xff\xff\xff"), 0, 4, nullable=False)
    with pytest.raises(ProtocolError, match="length -5"):
        p.read_array_length(mv(b"\xff\xff\xff\xfb"), 0, 4, nullable=True)


def test_compact_forms() -> None:
    out = bytearray()
    p.write_compact_string(out, "ab")
    p.write_compact_string(out, None)
    p.write_compact_bytes(out, b"xyz")
    p.write_compact_array_length(out, 2)
    assert bytes(out) == b"\x03ab\x00\x04xyz\x03"
    data = mv(bytes(out))
    assert p.read_compact_string(data, 0, nullable=False) == ("ab", 3)
    assert p.read_compact_string(data, 3, nullable=True) == (None, 4)
    with pytest.raises(ProtocolError, match="null"):
        p.read_compact_string(data, 3, nullable=False)
    view, pos = p.read_compact_bytes(data, 4, nullable=False)
    assert view == b"xyz"
    assert p.read_compact_array_length(mv(bytes(out) + b"\x00\x00"), pos, 1, nullable=False) == (2, pos + 1)


def test_tagged_fields_round_trip_and_must_ascend() -> None:
    out = bytearray()
    p.write_tagged_fields(out, {5: b"\x01\x02", 0: b"", 300: b"z"})
    fields, end = p.read_tagged_fields(mv(bytes(out)), 0)
    assert {tag: bytes(v) for tag, v in fields.items()} == {0: b"", 5: b"\x01\x02", 300: b"z"}
    assert end == len(out)
    with pytest.raises(ProtocolError, match="ascend"):
        p.read_tagged_fields(mv(b"\x02\x05\x00\x01\x00"), 0)
    with pytest.raises(ProtocolError, match="truncated tagged field"):
        p.read_tagged_fields(mv(b"\x01\x00\x09ab"), 0)
    with pytest.raises(ProtocolError, match="cannot fit"):
        p.read_tagged_fields(mv(b"\xff\xff\x03"), 0)
