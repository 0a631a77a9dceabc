"""The records of ``__consumer_offsets`` in Kafka's key/value schemas, and which partition holds a group.

Kafka's group coordinator writes each committed offset as one record of its internal topic, keyed so
that compaction keeps the latest commit of every (group, topic, partition):

* key: ``OffsetCommitKey`` with key version 1 -- ``version int16 = 1, group string, topic string,
  partition int32`` (strings as int16 length + UTF-8);
* value: ``OffsetCommitValue`` version 3 -- ``version int16 = 3, offset int64, leader_epoch int32,
  metadata string, commit_timestamp int64``;
* a null value (a tombstone) deletes the commit.

Group metadata records (key version 2: the group's generation, protocol and members) are not written
here; a reader of the topic skips every key version it does not know, as Kafka's loader skips them.

A group lives in partition ``Utils.abs(groupId.hashCode()) % offsets.topic.num.partitions``: Java's
``String.hashCode`` over the UTF-16 code units, as a signed 32-bit integer, so a group maps to the
partition Kafka would choose for the same partition count.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

__all__ = ["OFFSETS_TOPIC", "OffsetKey", "OffsetValue", "decode_key", "decode_value", "encode_key",
           "encode_value", "java_string_hash", "partition_for"]

OFFSETS_TOPIC = "__consumer_offsets"
OFFSET_KEY_VERSION = 1
OFFSET_VALUE_VERSION = 3
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_INT64 = struct.Struct(">q")


class OffsetKey(NamedTuple):
    group: str
    topic: str
    partition: int


class OffsetValue(NamedTuple):
    offset: int
    leader_epoch: int
    metadata: str
    commit_timestamp_ms: int


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


def _string(text: str) -> bytes:
    data = text.encode()
    return _INT16.pack(len(data)) + data


def encode_key(key: OffsetKey) -> bytes:
    return (_INT16.pack(OFFSET_KEY_VERSION) + _string(key.group) + _string(key.topic)
            + _INT32.pack(key.partition))


def encode_value(value: OffsetValue) -> bytes:
    return (_INT16.pack(OFFSET_VALUE_VERSION) + _INT64.pack(value.offset) + _INT32.pack(value.leader_epoch)
            + _string(value.metadata) + _INT64.pack(value.commit_timestamp_ms))


class _Reader:
    def __init__(self, data: bytes, what: str) -> None:
        self.data, self.pos, self.what = data, 0, what

    def take(self, fmt: struct.Struct) -> int:
        if self.pos + fmt.size > len(self.data):
            raise ValueError(f"{self.what}: {len(self.data)} bytes, truncated at byte {self.pos}")
        (value,) = fmt.unpack_from(self.data, self.pos)
        self.pos += fmt.size
        return int(value)

    def string(self) -> str:
        size = self.take(_INT16)
        if size < 0 or self.pos + size > len(self.data):
            raise ValueError(f"{self.what}: a string of {size} bytes at byte {self.pos - 2} overruns it")
        text = self.data[self.pos:self.pos + size].decode()
        self.pos += size
        return text


def decode_key(data: bytes) -> OffsetKey | None:
    """An offset commit's key; None for another record kind (group metadata, a newer version).
    ValueError for a malformed key."""
    reader = _Reader(data, "__consumer_offsets key")
    version = reader.take(_INT16)
    if version not in (0, 1):
        return None
    return OffsetKey(reader.string(), reader.string(), reader.take(_INT32))


def decode_value(data: bytes) -> OffsetValue:
    """An offset commit's value, versions 0 to 3 (v1 carries an expire timestamp, ignored; v3 a leader
    epoch).  ValueError for a malformed value or a version this reader does not know."""
    reader = _Reader(data, "__consumer_offsets value")
    version = reader.take(_INT16)
    if not 0 <= version <= 3:
        raise ValueError(f"__consumer_offsets value version {version}: this reader knows 0 to 3")
    offset = reader.take(_INT64)
    epoch = reader.take(_INT32) if version >= 3 else -1
    metadata = reader.string()
    timestamp = reader.take(_INT64)
    return OffsetValue(offset, epoch, metadata, timestamp)
