"""Group metadata records of ``__consumer_offsets`` in Kafka's schemas: a group's generation and members.

Kafka's group coordinator keeps, next to the committed offsets, one record per group whose latest value
is the group as of its last completed rebalance (and as it emptied), so that a coordinator taking over
(or restarting) knows the generation, the chosen protocol, the leader and every member's subscription and
assignment.  The layouts, in Kafka's classic (non-flexible) encoding:

* key: ``GroupMetadataKey`` with key version 2 -- ``version int16 = 2, group string``;
* value: ``GroupMetadataValue`` version 3 --

  ======================  ==================  ==============================================
  field                   type                versions (what it holds)
  ======================  ==================  ==============================================
  protocol_type           string              0+  ("consumer" for consumers)
  generation              int32               0+
  protocol                nullable string     0+  (the chosen assignor; null when Empty)
  leader                  nullable string     0+  (the leader's member id; null when Empty)
  current_state_timestamp int64               2+  (wall clock ms of the record)
  members                 [MemberMetadata]    0+
    member_id             string              0+
    group_instance_id     nullable string     3+  (static membership)
    client_id             string              0+
    client_host           string              0+
    rebalance_timeout     int32               1+
    session_timeout       int32               0+
    subscription          bytes               0+  (the member's metadata for the chosen protocol)
    assignment            bytes               0+
  ======================  ==================  ==============================================

* a null value (a tombstone) deletes the group (DeleteGroups).

This writer writes version 3; the reader takes versions 0 to 3 (the fields a version lacks get Kafka's
defaults) and refuses others with ValueError (version 4 is flexible: a newer Kafka's records).
"""

from __future__ import annotations

from typing import NamedTuple

from ipc.kafka.primitives import (
    INT64,
    check_available,
    read_array_length,
    read_bytes,
    read_int16,
    read_int32,
    read_nullable_string,
    read_string,
    write_array_length,
    write_bytes,
    write_int16,
    write_int32,
    write_string,
)
from storage.errors import ProtocolError

__all__ = ["GROUP_KEY_VERSION", "GroupMetadata", "GroupMetadataMember", "decode_group_key",
           "decode_group_value", "encode_group_key", "encode_group_value"]

GROUP_KEY_VERSION = 2
GROUP_VALUE_VERSION = 3


class GroupMetadataMember(NamedTuple):
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    subscription: bytes
    assignment: bytes


class GroupMetadata(NamedTuple):
    protocol_type: str
    generation: int
    protocol: str | None
    leader: str | None
    current_state_timestamp_ms: int
    members: list[GroupMetadataMember]


def encode_group_key(group_id: str) -> bytes:
    out = bytearray()
    write_int16(out, GROUP_KEY_VERSION)
    write_string(out, group_id)
    return bytes(out)


def encode_group_value(value: GroupMetadata) -> bytes:
    out = bytearray()
    write_int16(out, GROUP_VALUE_VERSION)
    write_string(out, value.protocol_type)
    write_int32(out, value.generation)
    write_string(out, value.protocol)
    write_string(out, value.leader)
    out += INT64.pack(value.current_state_timestamp_ms)
    write_array_length(out, len(value.members))
    for m in value.members:
        write_string(out, m.member_id)
        write_string(out, m.group_instance_id)
        write_string(out, m.client_id)
        write_string(out, m.client_host)
        write_int32(out, m.rebalance_timeout_ms)
        write_int32(out, m.session_timeout_ms)
        write_bytes(out, m.subscription)
        write_bytes(out, m.assignment)
    return bytes(out)


def decode_group_key(data: bytes) -> str | None:
    """The group id of a group metadata key; None for another record kind.  ValueError if malformed."""
    try:
        mv = memoryview(data)
        version, pos = read_int16(mv, 0)
        if version != GROUP_KEY_VERSION:
            return None
        group, _ = read_string(mv, pos)
    except ProtocolError as e:
        raise ValueError(f"__consumer_offsets group key of {len(data)} bytes: {e}") from None
    return group


def _member(mv: memoryview, pos: int, version: int) -> tuple[GroupMetadataMember, int]:
    member_id, pos = read_string(mv, pos)
    instance_id, pos = read_nullable_string(mv, pos) if version >= 3 else (None, pos)
    client_id, pos = read_string(mv, pos)
    client_host, pos = read_string(mv, pos)
    rebalance_ms, pos = read_int32(mv, pos) if version >= 1 else (-1, pos)
    session_ms, pos = read_int32(mv, pos)
    subscription, pos = read_bytes(mv, pos, nullable=False)
    assignment, pos = read_bytes(mv, pos, nullable=False)
    if rebalance_ms < 0:
        rebalance_ms = session_ms  # version 0: Kafka takes the session timeout
    return GroupMetadataMember(member_id, instance_id, client_id, client_host, rebalance_ms, session_ms,
                               bytes(subscription or b""), bytes(assignment or b"")), pos


def decode_group_value(data: bytes) -> GroupMetadata:
    """A group metadata value, versions 0 to 3.  ValueError for a malformed value or another version."""
    try:
        mv = memoryview(data)
        version, pos = read_int16(mv, 0)
        if not 0 <= version <= GROUP_VALUE_VERSION:
            raise ValueError(f"__consumer_offsets group metadata version {version}: this reader knows 0 to 3")
        protocol_type, pos = read_string(mv, pos)
        generation, pos = read_int32(mv, pos)
        protocol, pos = read_nullable_string(mv, pos)
        leader, pos = read_nullable_string(mv, pos)
        timestamp = -1
        if version >= 2:
            end = check_available(mv, pos, 8, "int64")
            timestamp, pos = INT64.unpack_from(mv, pos)[0], end
        count, pos = read_array_length(mv, pos, 2, nullable=False)
        members = []
        for _ in range(count):
            member, pos = _member(mv, pos, version)
            members.append(member)
    except ProtocolError as e:
        raise ValueError(f"__consumer_offsets group metadata value of {len(data)} bytes: {e}") from None
    return GroupMetadata(protocol_type, generation, protocol, leader, timestamp, members)
