"""The records of ``__consumer_offsets`` in Kafka's key/value schemas, and which partition holds a group.

Kafka's group coordinator writes each committed offset as one record of its internal topic, keyed so
that compaction keeps the latest commit of every (group, topic, partition):

* key: ``OffsetCommitKey`` with key version 1 -- ``version int16 = 1, group string, topic string,
  partition int32`` (strings as int16 length + UTF-8);
* value: ``OffsetCommitValue`` version 3 -- ``version int16 = 3, offset int64, leader_epoch int32,
  metadata string, commit_timestamp int64``; or, for a commit that asked for its own retention
  (OffsetCommit v2-v4 ``retention_time_ms``), version 1 -- ``version int16 = 1, offset int64, metadata
  string, commit_timestamp int64, expire_timestamp int64``, the only version with that field, as Kafka
  writes it (those requests carry no leader epoch, which version 1 has no room for);
* a null value (a tombstone) deletes the commit.

Group metadata records (key version 2: the group's generation, protocol and members) are not written
here; a reader of the topic skips every key version it does not know, as Kafka's loader skips them.

A group lives in partition ``Utils.abs(groupId.hashCode()) % offsets.topic.num.partitions``: Java's
``String.hashCode`` over the UTF-16 code units, as a signed 32-bit integer, so a group maps to the
partition Kafka would choose for the same partition count.
"""

from __future__ import annotations

from typing import NamedTuple

from ipc.kafka.primitives import (
    INT64,
    check_available,
    read_int16,
    read_int32,
    read_string,
    write_int16,
    write_int32,
    write_string,
)
from storage.errors import ProtocolError

__all__ = ["OFFSETS_TOPIC", "OffsetKey", "OffsetValue", "decode_key", "decode_value", "encode_key",
           "encode_value", "java_string_hash", "partition_for"]

OFFSETS_TOPIC = "__consumer_offsets"
OFFSET_KEY_VERSION = 1
OFFSET_VALUE_VERSION = 3
EXPIRING_VALUE_VERSION = 1  # the only OffsetCommitValue version with an expire_timestamp


class OffsetKey(NamedTuple):
    group: str
    topic: str
    partition: int


class OffsetValue(NamedTuple):
    offset: int
    leader_epoch: int
    metadata: str
    commit_timestamp_ms: int
    expire_timestamp_ms: int = -1  # -1: none (written as version 3); else written as version 1


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode``: ``s[0]*31^(n-1) + ... + s[n-1]`` over UTF-16 code units, signed 32-bit."""
    h = 0
    units = text.encode("utf-16-be")
    for i in range(0, len(units), 2):
        h = (31 * h + (units[i] << 8 | units[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for(group_id: str, partitions: int) -> int:
    """The ``__consumer_offsets`` partition of ``group_id``: Kafka's ``Utils.abs(hashCode) % partitions``
    (``Utils.abs`` maps Integer.MIN_VALUE to 0)."""
    h = java_string_hash(group_id)
    return (0 if h == -(1 << 31) else abs(h)) % partitions


def encode_key(key: OffsetKey) -> bytes:
    out = bytearray()
    write_int16(out, OFFSET_KEY_VERSION)
    write_string(out, key.group)
    write_string(out, key.topic)
    write_int32(out, key.partition)
    return bytes(out)


def encode_value(value: OffsetValue) -> bytes:
    """Version 3, or version 1 when the commit has an expire timestamp (module docstring)."""
    out = bytearray()
    expires = value.expire_timestamp_ms >= 0
    write_int16(out, EXPIRING_VALUE_VERSION if expires else OFFSET_VALUE_VERSION)
    out += INT64.pack(value.offset)
    if not expires:
        write_int32(out, value.leader_epoch)
    write_string(out, value.metadata)
    out += INT64.pack(value.commit_timestamp_ms)
    if expires:
        out += INT64.pack(value.expire_timestamp_ms)
    return bytes(out)


def _read_int64(mv: memoryview, pos: int) -> tuple[int, int]:
    end = check_available(mv, pos, 8, "int64")
    return INT64.unpack_from(mv, pos)[0], end


def decode_key(data: bytes) -> OffsetKey | None:
    """An offset commit's key; None for another record kind (group metadata, a newer version).
    ValueError for a malformed key."""
    try:
        mv = memoryview(data)
        version, pos = read_int16(mv, 0)
        if version not in (0, 1):
            return None
        group, pos = read_string(mv, pos)
        topic, pos = read_string(mv, pos)
        partition, _ = read_int32(mv, pos)
    except ProtocolError as e:
        raise ValueError(f"__consumer_offsets key of {len(data)} bytes: {e}") from None
    return OffsetKey(group, topic, partition)


def decode_value(data: bytes) -> OffsetValue:
    """An offset commit's value, versions 0 to 3 (v1 carries an expire timestamp, -1 for none; v3 a leader
    epoch).  ValueError for a malformed value or a version this reader does not know."""
    try:
        mv = memoryview(data)
        version, pos = read_int16(mv, 0)
        if not 0 <= version <= 3:
            raise ValueError(f"__consumer_offsets value version {version}: this reader knows 0 to 3")
        offset, pos = _read_int64(mv, pos)
        epoch, pos = read_int32(mv, pos) if version >= 3 else (-1, pos)
        metadata, pos = read_string(mv, pos)
        timestamp, pos = _read_int64(mv, pos)
        expire, _ = _read_int64(mv, pos) if version == EXPIRING_VALUE_VERSION else (-1, pos)
    except ProtocolError as e:
        raise ValueError(f"__consumer_offsets value of {len(data)} bytes: {e}") from None
    return OffsetValue(offset, epoch, metadata, timestamp, max(expire, -1))
