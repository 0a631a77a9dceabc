"""Consumer-group and SASL messages, declared once from Apache Kafka's JSON message definitions.

Same conventions as :mod:`ipc.kafka.messages`: Kafka's field names in snake_case, Kafka's version ranges,
only the fields that exist in the versions we speak (see :mod:`ipc.kafka.apis`).  ``bytes`` fields
(member metadata, assignments, SASL tokens) decode as ``bytes``.
"""

# ruff: noqa: RUF009 -- ``wire()`` returns a dataclasses.field(); a field specifier, not a shared default.

from __future__ import annotations

from dataclasses import dataclass

from ipc.kafka.schema import ARRAY, BOOL, BYTES, INT8, INT16, INT32, INT64, STRING, Struct, wire

__all__ = [
    "DeletableGroupResult",
    "DeleteGroupsRequest",
    "DeleteGroupsResponse",
    "DescribeGroupsRequest",
    "DescribeGroupsResponse",
    "DescribedGroup",
    "DescribedGroupMember",
    "FindCoordinatorRequest",
    "FindCoordinatorResponse",
    "HeartbeatRequest",
    "HeartbeatResponse",
    "JoinGroupRequest",
    "JoinGroupRequestProtocol",
    "JoinGroupResponse",
    "JoinGroupResponseMember",
    "LeaveGroupRequest",
    "LeaveGroupResponse",
    "ListGroupsRequest",
    "ListGroupsResponse",
    "ListedGroup",
    "MemberIdentity",
    "MemberResponse",
    "OffsetCommitRequest",
    "OffsetCommitRequestPartition",
    "OffsetCommitRequestTopic",
    "OffsetCommitResponse",
    "OffsetCommitResponsePartition",
    "OffsetCommitResponseTopic",
    "OffsetDeleteRequest",
    "OffsetDeleteRequestPartition",
    "OffsetDeleteRequestTopic",
    "OffsetDeleteResponse",
    "OffsetDeleteResponsePartition",
    "OffsetDeleteResponseTopic",
    "OffsetFetchRequest",
    "OffsetFetchRequestTopic",
    "OffsetFetchResponse",
    "OffsetFetchResponsePartition",
    "OffsetFetchResponseTopic",
    "SaslAuthenticateRequest",
    "SaslAuthenticateResponse",
    "SaslHandshakeRequest",
    "SaslHandshakeResponse",
    "SyncGroupRequest",
    "SyncGroupRequestAssignment",
    "SyncGroupResponse",
]


# -- FindCoordinator (key 10) ----------------------------------------------------------------------------


@dataclass(slots=True)
class FindCoordinatorRequest(Struct):
    key: str = wire(STRING, "0-3")
    key_type: int = wire(INT8, "1+")  # 0 group, 1 transaction


@dataclass(slots=True)
class FindCoordinatorResponse(Struct):
    throttle_time_ms: int = wire(INT32, "1+")
    error_code: int = wire(INT16, "0-3")
    error_message: str | None = wire(STRING, "1-3", nullable="1-3", default=None)
    node_id: int = wire(INT32, "0-3")
    host: str = wire(STRING, "0-3")
    port: int = wire(INT32, "0-3")


# -- OffsetCommit (key 8) --------------------------------------------------------------------------------


@dataclass(slots=True)
class OffsetCommitRequestPartition(Struct):
    partition_index: int = wire(INT32)
    committed_offset: int = wire(INT64)
    committed_leader_epoch: int = wire(INT32, "6+", default=-1)
    commit_timestamp: int = wire(INT64, "1", default=-1)  # v1 only; -1 = the broker's time
    committed_metadata: str | None = wire(STRING, nullable="0+")


@dataclass(slots=True)
class OffsetCommitRequestTopic(Struct):
    name: str = wire(STRING)
    partitions: list[OffsetCommitRequestPartition] = wire(ARRAY(OffsetCommitRequestPartition))


@dataclass(slots=True)
class OffsetCommitRequest(Struct):
    group_id: str = wire(STRING)
    generation_id_or_member_epoch: int = wire(INT32, "1+", default=-1)
    member_id: str = wire(STRING, "1+")
    group_instance_id: str | None = wire(STRING, "7+", nullable="7+", default=None)
    retention_time_ms: int = wire(INT64, "2-4", default=-1)
    topics: list[OffsetCommitRequestTopic] = wire(ARRAY(OffsetCommitRequestTopic))


@dataclass(slots=True)
class OffsetCommitResponsePartition(Struct):
    partition_index: int = wire(INT32)
    error_code: int = wire(INT16)


@dataclass(slots=True)
class OffsetCommitResponseTopic(Struct):
    name: str = wire(STRING)
    partitions: list[OffsetCommitResponsePartition] = wire(ARRAY(OffsetCommitResponsePartition))


@dataclass(slots=True)
class OffsetCommitResponse(Struct):
    throttle_time_ms: int = wire(INT32, "3+")
    topics: list[OffsetCommitResponseTopic] = wire(ARRAY(OffsetCommitResponseTopic))


# -- OffsetFetch (key 9) ---------------------------------------------------------------------------------


@dataclass(slots=True)
class OffsetFetchRequestTopic(Struct):
    name: str = wire(STRING, "0-7")
    partition_indexes: list[int] = wire(ARRAY(INT32), "0-7")


@dataclass(slots=True)
class OffsetFetchRequest(Struct):
    group_id: str = wire(STRING, "0-7")
    # None (null, v2+) asks for every topic the group committed.
    topics: list[OffsetFetchRequestTopic] | None = wire(ARRAY(OffsetFetchRequestTopic), "0-7", nullable="2-7")


@dataclass(slots=True)
class OffsetFetchResponsePartition(Struct):
    partition_index: int = wire(INT32, "0-7")
    committed_offset: int = wire(INT64, "0-7")
    committed_leader_epoch: int = wire(INT32, "5-7", default=-1)
    metadata: str | None = wire(STRING, "0-7", nullable="0-7")
    error_code: int = wire(INT16, "0-7")


@dataclass(slots=True)
class OffsetFetchResponseTopic(Struct):
    name: str = wire(STRING, "0-7")
    partitions: list[OffsetFetchResponsePartition] = wire(ARRAY(OffsetFetchResponsePartition), "0-7")


@dataclass(slots=True)
class OffsetFetchResponse(Struct):
    throttle_time_ms: int = wire(INT32, "3+")
    topics: list[OffsetFetchResponseTopic] = wire(ARRAY(OffsetFetchResponseTopic), "0-7")
    error_code: int = wire(INT16, "2-7")


# -- JoinGroup (key 11) ----------------------------------------------------------------------------------


@dataclass(slots=True)
class JoinGroupRequestProtocol(Struct):
    name: str = wire(STRING)
    metadata: bytes = wire(BYTES)


@dataclass(slots=True)
class JoinGroupRequest(Struct):
    group_id: str = wire(STRING)
    session_timeout_ms: int = wire(INT32)
    rebalance_timeout_ms: int = wire(INT32, "1+", default=-1)
    member_id: str = wire(STRING)
    group_instance_id: str | None = wire(STRING, "5+", nullable="5+", default=None)
    protocol_type: str = wire(STRING)
    protocols: list[JoinGroupRequestProtocol] = wire(ARRAY(JoinGroupRequestProtocol))


@dataclass(slots=True)
class JoinGroupResponseMember(Struct):
    member_id: str = wire(STRING)
    group_instance_id: str | None = wire(STRING, "5+", nullable="5+", default=None)
    metadata: bytes = wire(BYTES)


@dataclass(slots=True)
class JoinGroupResponse(Struct):
    throttle_time_ms: int = wire(INT32, "2+")
    error_code: int = wire(INT16)
    generation_id: int = wire(INT32, default=-1)
    protocol_name: str = wire(STRING)
    leader: str = wire(STRING)
    member_id: str = wire(STRING)
    members: list[JoinGroupResponseMember] = wire(ARRAY(JoinGroupResponseMember))


# -- Heartbeat (key 12) ----------------------------------------------------------------------------------


@dataclass(slots=True)
class HeartbeatRequest(Struct):
    group_id: str = wire(STRING)
    generation_id: int = wire(INT32)
    member_id: str = wire(STRING)
    group_instance_id: str | None = wire(STRING, "3+", nullable="3+", default=None)


@dataclass(slots=True)
class HeartbeatResponse(Struct):
    throttle_time_ms: int = wire(INT32, "1+")
    error_code: int = wire(INT16)


# -- LeaveGroup (key 13) ---------------------------------------------------------------------------------


@dataclass(slots=True)
class MemberIdentity(Struct):
    member_id: str = wire(STRING, "3+")
    group_instance_id: str | None = wire(STRING, "3+", nullable="3+", default=None)


@dataclass(slots=True)
class LeaveGroupRequest(Struct):
    group_id: str = wire(STRING)
    member_id: str = wire(STRING, "0-2")
    members: list[MemberIdentity] = wire(ARRAY(MemberIdentity), "3+")


@dataclass(slots=True)
class MemberResponse(Struct):
    member_id: str = wire(STRING, "3+")
    group_instance_id: str | None = wire(STRING, "3+", nullable="3+", default=None)
    error_code: int = wire(INT16, "3+")


@dataclass(slots=True)
class LeaveGroupResponse(Struct):
    throttle_time_ms: int = wire(INT32, "1+")
    error_code: int = wire(INT16)
    members: list[MemberResponse] = wire(ARRAY(MemberResponse), "3+")


# -- SyncGroup (key 14) ----------------------------------------------------------------------------------


@dataclass(slots=True)
class SyncGroupRequestAssignment(Struct):
    member_id: str = wire(STRING)
    assignment: bytes = wire(BYTES)


@dataclass(slots=True)
class SyncGroupRequest(Struct):
    group_id: str = wire(STRING)
    generation_id: int = wire(INT32)
    member_id: str = wire(STRING)
    group_instance_id: str | None = wire(STRING, "3+", nullable="3+", default=None)
    assignments: list[SyncGroupRequestAssignment] = wire(ARRAY(SyncGroupRequestAssignment))


@dataclass(slots=True)
class SyncGroupResponse(Struct):
    throttle_time_ms: int = wire(INT32, "1+")
    error_code: int = wire(INT16)
    assignment: bytes = wire(BYTES)


# -- DescribeGroups (key 15) ----------------------------------------------------------------------------


@dataclass(slots=True)
class DescribeGroupsRequest(Struct):
    groups: list[str] = wire(ARRAY(STRING))
    include_authorized_operations: bool = wire(BOOL, "3+", default=False)


@dataclass(slots=True)
class DescribedGroupMember(Struct):
    member_id: str = wire(STRING)
    group_instance_id: str | None = wire(STRING, "4+", nullable="4+", default=None)
    client_id: str = wire(STRING)
    client_host: str = wire(STRING)
    member_metadata: bytes = wire(BYTES)
    member_assignment: bytes = wire(BYTES)


@dataclass(slots=True)
class DescribedGroup(Struct):
    error_code: int = wire(INT16)
    group_id: str = wire(STRING)
    group_state: str = wire(STRING)
    protocol_type: str = wire(STRING)
    protocol_data: str = wire(STRING)  # the chosen protocol (assignor) name
    members: list[DescribedGroupMember] = wire(ARRAY(DescribedGroupMember))
    authorized_operations: int = wire(INT32, "3+", default=-(1 << 31))  # INT32_MIN: not requested


@dataclass(slots=True)
class DescribeGroupsResponse(Struct):
    throttle_time_ms: int = wire(INT32, "1+")
    groups: list[DescribedGroup] = wire(ARRAY(DescribedGroup))


# -- ListGroups (key 16) ---------------------------------------------------------------------------------


@dataclass(slots=True)
class ListGroupsRequest(Struct):
    """Empty below v4 (the states filter is flexible-only)."""


@dataclass(slots=True)
class ListedGroup(Struct):
    group_id: str = wire(STRING)
    protocol_type: str = wire(STRING)


@dataclass(slots=True)
class ListGroupsResponse(Struct):
    throttle_time_ms: int = wire(INT32, "1+")
    error_code: int = wire(INT16)
    groups: list[ListedGroup] = wire(ARRAY(ListedGroup))


# -- DeleteGroups (key 42) ------------------------------------------------------------------------------


@dataclass(slots=True)
class DeleteGroupsRequest(Struct):
    groups_names: list[str] = wire(ARRAY(STRING))


@dataclass(slots=True)
class DeletableGroupResult(Struct):
    group_id: str = wire(STRING)
    error_code: int = wire(INT16)


@dataclass(slots=True)
class DeleteGroupsResponse(Struct):
    throttle_time_ms: int = wire(INT32)
    results: list[DeletableGroupResult] = wire(ARRAY(DeletableGroupResult))


# -- OffsetDelete (key 47) -------------------------------------------------------------------------------


@dataclass(slots=True)
class OffsetDeleteRequestPartition(Struct):
    partition_index: int = wire(INT32)


@dataclass(slots=True)
class OffsetDeleteRequestTopic(Struct):
    name: str = wire(STRING)
    partitions: list[OffsetDeleteRequestPartition] = wire(ARRAY(OffsetDeleteRequestPartition))


@dataclass(slots=True)
class OffsetDeleteRequest(Struct):
    group_id: str = wire(STRING)
    topics: list[OffsetDeleteRequestTopic] = wire(ARRAY(OffsetDeleteRequestTopic))


@dataclass(slots=True)
class OffsetDeleteResponsePartition(Struct):
    partition_index: int = wire(INT32)
    error_code: int = wire(INT16)


@dataclass(slots=True)
class OffsetDeleteResponseTopic(Struct):
    name: str = wire(STRING)
    partitions: list[OffsetDeleteResponsePartition] = wire(ARRAY(OffsetDeleteResponsePartition))


@dataclass(slots=True)
class OffsetDeleteResponse(Struct):
    """The error code comes before the throttle time in this response, as in Kafka's JSON."""

    error_code: int = wire(INT16)
    throttle_time_ms: int = wire(INT32, default=0)
    topics: list[OffsetDeleteResponseTopic] = wire(ARRAY(OffsetDeleteResponseTopic))


# -- SaslHandshake (key 17) and SaslAuthenticate (key 36) ------------------------------------------------


@dataclass(slots=True)
class SaslHandshakeRequest(Struct):
    mechanism: str = wire(STRING)


@dataclass(slots=True)
class SaslHandshakeResponse(Struct):
    error_code: int = wire(INT16)
    mechanisms: list[str] = wire(ARRAY(STRING))


@dataclass(slots=True)
class SaslAuthenticateRequest(Struct):
    auth_bytes: bytes = wire(BYTES)


@dataclass(slots=True)
class SaslAuthenticateResponse(Struct):
    error_code: int = wire(INT16)
    error_message: str | None = wire(STRING, nullable="0+", default=None)
    auth_bytes: bytes = wire(BYTES)
    session_lifetime_ms: int = wire(INT64, "1+")
