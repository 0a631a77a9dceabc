"""The records of ``__consumer_offsets``: Kafka's key/value schemas and Kafka's group -> partition mapping."""

from __future__ import annotations

import struct

import pytest

from appliance.coordinator.offset_records import (
    OffsetKey,
    OffsetValue,
    decode_key,
    decode_value,
    encode_key,
    encode_value,
    java_string_hash,
    partition_for,
)


@pytest.mark.parametrize(("text", "expected"), [
    ("", 0), ("hello", 99162322), ("Aa", 2112), ("BB", 2112),
    ("polygenelubricants", -(1 << 31)),  # Java's String whose hashCode is Integer.MIN_VALUE
])  # fmt: skip
def test_the_hash_is_javas_string_hashcode(text: str, expected: int) -> None:
    assert java_string_hash(text) == expected


def test_a_group_maps_to_kafkas_partition() -> None:
    assert partition_for("hello", 50) == 99162322 % 50
    assert partition_for("polygenelubricants", 7) == 0  # Utils.abs(Integer.MIN_VALUE) is 0
    assert partition_for("\U0001d11e", 50) == abs(java_string_hash("\U0001d11e")) % 50  # two UTF-16 units
    assert java_string_hash("\U0001d11e") == 0xD834 * 31 + 0xDD1E


def test_key_and_value_bytes_follow_kafkas_schemas() -> None:
    key = encode_key(OffsetKey("g", "t", 3))
    assert key == struct.pack(">hh1sh1si", 1, 1, b"g", 1, b"t", 3)
    value = encode_value(OffsetValue(42, 5, "m", 1_700_000_000_000))
    assert value == struct.pack(">hqih1sq", 3, 42, 5, 1, b"m", 1_700_000_000_000)
    assert decode_key(key) == OffsetKey("g", "t", 3)
    assert decode_value(value) == OffsetValue(42, 5, "m", 1_700_000_000_000)


def test_a_commit_with_an_expire_timestamp_is_written_as_kafkas_value_version_1() -> None:
    """As Kafka's ``offsetCommitValue``: the only version with ``expire_timestamp``, without a leader
    epoch (OffsetCommit v2-v4, whose ``retention_time_ms`` sets it, carry none)."""
    value = encode_value(OffsetValue(42, -1, "m", 1_700_000_000_000, 1_700_000_060_000))
    assert value == struct.pack(">hqh1sqq", 1, 42, 1, b"m", 1_700_000_000_000, 1_700_000_060_000)
    assert decode_value(value) == OffsetValue(42, -1, "m", 1_700_000_000_000, 1_700_000_060_000)


def test_other_record_kinds_are_skipped_and_bad_bytes_refused() -> None:
    assert decode_key(struct.pack(">hh1s", 2, 1, b"g")) is None  # group metadata (key version 2)
    v1 = struct.pack(">hqh1sqq", 1, 7, 1, b"m", 11, 12)  # value v1 carries an expire timestamp
    assert decode_value(v1) == OffsetValue(7, -1, "m", 11, 12)
    assert decode_value(struct.pack(">hqh1sqq", 1, 7, 1, b"m", 11, -1)).expire_timestamp_ms == -1
    with pytest.raises(ValueError, match="truncated"):
        decode_key(struct.pack(">h", 1))
    with pytest.raises(ValueError, match="truncated string"):  # a string that overruns the key
        decode_key(struct.pack(">hh1s", 1, 9, b"g"))
    with pytest.raises(ValueError, match="version 9"):
        decode_value(struct.pack(">hq", 9, 1))
