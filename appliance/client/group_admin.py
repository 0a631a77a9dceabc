"""Consumer groups over the Kafka protocol: list, describe, committed offsets, reset -- what
``kafka-consumer-groups.sh`` asks a cluster, for ``appliance consumer-groups`` and any program that only
knows a broker's address.

Theory of operation
-------------------
:class:`GroupAdmin` talks through a :class:`~appliance.client.kafka_cluster.KafkaCluster`.  A group lives
on its *coordinator*, the broker FindCoordinator (key type 0) names; every request about one group goes
there, on one connection per coordinator.  Nothing runs in the background; each call is a few blocking
round trips.  Not thread-safe.

============================  ===============================================================================
call                          requests
============================  ===============================================================================
:meth:`list_groups`           ListGroups to every broker Metadata names (a group is listed by its coordinator)
:meth:`describe_group`        DescribeGroups; each member's assignment decoded from the consumer protocol
:meth:`committed_offsets`     OffsetFetch with null topics (v2+): every partition the group committed
:meth:`log_offsets`           ListOffsets to each partition's leader (earliest, latest or a timestamp)
:meth:`alter_offsets`         OffsetCommit with generation -1 and an empty member id: Kafka's "simple" commit,
                              which the coordinator accepts only while the group has no members
:meth:`delete_groups`         DeleteGroups to each group's coordinator (an empty group only: NON_EMPTY_GROUP)
:meth:`delete_offsets`        OffsetDelete (refused for a topic a live member subscribes to:
                              GROUP_SUBSCRIBED_TO_TOPIC)
============================  ===============================================================================

While a coordinator loads its groups (COORDINATOR_LOAD_IN_PROGRESS), moves (NOT_COORDINATOR) or is not
ready (COORDINATOR_NOT_AVAILABLE), a call asks FindCoordinator again and retries, for up to
``request_timeout_ms``; then it raises :class:`GroupAdminError` with Kafka's error name.

Assignments are the consumer protocol's bytes (Kafka's ``ConsumerProtocolAssignment``: a version, then per
topic its partitions, then user data), opaque to the broker; :func:`decode_assignment` reads them for any
version, as Kafka's clients do (a newer version is read as the newest known one: fields are only ever added
at the end).  Bytes that are not a consumer assignment (another protocol type, garbage) decode to no
partitions rather than failing the description.
"""



from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from appliance.client.kafka_cluster import DEFAULT_BOOTSTRAP_SERVER, KafkaCluster
from ipc.kafka import (
    DeleteGroupsRequest,
    DeleteGroupsResponse,
    DescribeGroupsRequest,
    DescribeGroupsResponse,
    ErrorCode,
    FindCoordinatorRequest,
    FindCoordinatorResponse,
    ListGroupsRequest,
    ListGroupsResponse,
    ListOffsetsPartition,
    ListOffsetsRequest,
    ListOffsetsResponse,
    ListOffsetsTopic,
    OffsetCommitRequest,
    OffsetCommitRequestPartition,
    OffsetCommitRequestTopic,
    OffsetCommitResponse,
    OffsetDeleteRequest,
    OffsetDeleteRequestPartition,
    OffsetDeleteRequestTopic,
    OffsetDeleteResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
    consumer_protocol,
    error_name,
)
from ipc.kafka_client import KafkaConnection
from storage.errors import ApplianceError, ProtocolError

__all__ = [
    "EARLIEST",
    "LATEST",
    "GroupAdmin",
    "GroupAdminError",
    "GroupDescription",
    "GroupListing",
    "MemberDescription",
    "decode_assignment",
]

EARLIEST = -2  # ListOffsets: the log start offset
LATEST = -1  # ListOffsets: the high watermark
_CONSUMER_REPLICA_ID = -1
_RETRIABLE = (ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, ErrorCode.COORDINATOR_NOT_AVAILABLE,
              ErrorCode.NOT_COORDINATOR)
_RETRY_BACKOFF_S = 0.1

TopicPartition = tuple[str, int]


class GroupAdminError(ApplianceError):
    """A group request the coordinator refused; ``error_code`` is Kafka's code."""

    def __init__(self, message: str, error_code: int) -> None:
        super().__init__(message)
        self.error_code = error_code


# -- the consumer protocol's assignment bytes ------------------------------------------------------------


def decode_assignment(data: bytes) -> tuple[TopicPartition, ...]:
    """The (topic, partition) pairs a consumer-protocol assignment names, sorted; () for empty or
    undecodable bytes (module docstring)."""
    try:
        return tuple(sorted(consumer_protocol.decode_assignment(data).partitions))
    except ProtocolError:
        return ()


# -- results ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GroupListing:
    group_id: str
    protocol_type: str  # "consumer" for consumer groups


@dataclass(frozen=True, slots=True)
class MemberDescription:
    member_id: str
    group_instance_id: str | None
    client_id: str
    host: str
    assignment: tuple[TopicPartition, ...]  # decoded; () while the group rebalances


@dataclass(frozen=True, slots=True)
class GroupDescription:
    group_id: str
    state: str  # Empty, PreparingRebalance, CompletingRebalance, Stable, Dead
    protocol_type: str
    assignor: str  # the chosen protocol: range, roundrobin, cooperative-sticky ...
    coordinator: tuple[int, str, int]  # node id, host, port
    members: tuple[MemberDescription, ...]


# -- the client ------------------------------------------------------------------------------------------


class GroupAdmin:
    """Consumer-group administration through a broker's Kafka protocol (see the module docstring)."""

    def __init__(
        self,
        bootstrap_servers: str = DEFAULT_BOOTSTRAP_SERVER,
        *,
        client_id: str = "appliance-consumer-groups",
        connect_timeout_ms: int = 10_000,
        request_timeout_ms: int = 30_000,
    ) -> None:
        self.request_timeout_ms = request_timeout_ms
        self.cluster = KafkaCluster.reached(bootstrap_servers, client_id=client_id,
                                            connect_timeout_ms=connect_timeout_ms,
                                            request_timeout_ms=request_timeout_ms)
        self._coordinators: dict[str, tuple[int, str, int]] = {}  # group id -> its coordinator
        self._coordinator_connections: dict[tuple[str, int], KafkaConnection] = {}

    # -- coordinators ----------------------------------------------------------------------------------------

    def _deadline(self) -> float:
        return time.monotonic() + self.request_timeout_ms / 1000

    def coordinator(self, group_id: str) -> tuple[int, str, int]:
        """(node id, host, port) of the group's coordinator, asked again after a retriable error."""
        known = self._coordinators.get(group_id)
        if known is not None:
            return known
        deadline = self._deadline()
        while True:
            found: FindCoordinatorResponse = self.cluster.any_connection().request(
                FindCoordinatorRequest(key=group_id, key_type=0)
            )
            if found.error_code == ErrorCode.NONE:
                host = found.host or self.cluster.any_connection().host
                self._coordinators[group_id] = (found.node_id, host, found.port)
                return self._coordinators[group_id]
            self._retry_or_raise(group_id, found.error_code, found.error_message, deadline)

    def _connection(self, group_id: str) -> KafkaConnection:
        """The connection to the group's coordinator (one per coordinator address, made on first use)."""
        _, host, port = self.coordinator(group_id)
        conn = self._coordinator_connections.get((host, port))
        if conn is None or conn.closed:
            conn = self._coordinator_connections[(host, port)] = self.cluster.connect(host, port)
        return conn

    def _retry_or_raise(self, group_id: str, code: int, message: str | None, deadline: float) -> None:
        """Sleep and return if ``code`` is retriable and time is left; else raise it for ``group_id``."""
        if code in _RETRIABLE and time.monotonic() < deadline:
            self._coordinators.pop(group_id, None)
            time.sleep(_RETRY_BACKOFF_S)
            return
        raise group_error(group_id, code, message)

    # -- listing and describing ------------------------------------------------------------------------------

    def list_groups(self) -> list[GroupListing]:
        """Every group of every broker, sorted by id."""
        self.cluster.metadata([])
        found: dict[str, GroupListing] = {}
        for node_id in sorted(self.cluster.brokers):
            deadline = self._deadline()
            while True:
                answer: ListGroupsResponse = self.cluster.connection_to(node_id).request(ListGroupsRequest())
                if answer.error_code == ErrorCode.NONE:
                    break
                self._retry_or_raise("(every group)", answer.error_code, None, deadline)
            for g in answer.groups:
                found[g.group_id] = GroupListing(g.group_id, g.protocol_type)
        return [found[name] for name in sorted(found)]

    def describe_group(self, group_id: str) -> GroupDescription:
        """The group's state and members; state ``Dead`` for a group the coordinator does not know."""
        deadline = self._deadline()
        while True:
            conn = self._connection(group_id)
            answer: DescribeGroupsResponse = conn.request(DescribeGroupsRequest(groups=[group_id]))
            (group,) = answer.groups
            if group.error_code == ErrorCode.NONE:
                break
            self._retry_or_raise(group_id, group.error_code, None, deadline)
        members = tuple(
            MemberDescription(
                member_id=m.member_id,
                group_instance_id=m.group_instance_id,
                client_id=m.client_id,
                host=m.client_host,
                assignment=decode_assignment(bytes(m.member_assignment))
                if group.protocol_type in ("consumer", "") else (),
            )
            for m in group.members
        )
        return GroupDescription(group_id, group.group_state, group.protocol_type, group.protocol_data,
                                self.coordinator(group_id), members)

    def committed_offsets(self, group_id: str) -> dict[TopicPartition, int]:
        """Every partition the group committed, with its committed offset."""
        deadline = self._deadline()
        while True:
            answer: OffsetFetchResponse = self._connection(group_id).request(
                OffsetFetchRequest(group_id=group_id, topics=None)
            )
            if answer.error_code == ErrorCode.NONE:
                break
            self._retry_or_raise(group_id, answer.error_code, None, deadline)
        committed = {}
        for topic in answer.topics:
            for p in topic.partitions:
                if p.error_code == ErrorCode.NONE and p.committed_offset >= 0:
                    committed[(topic.name, p.partition_index)] = p.committed_offset
        return committed

    # -- partitions ------------------------------------------------------------------------------------------

    def partitions_of(self, topic: str) -> list[int]:
        """The topic's partition numbers; GroupAdminError UNKNOWN_TOPIC_OR_PARTITION if it does not exist."""
        (found,) = self.cluster.metadata([topic]).topics
        if found.error_code != ErrorCode.NONE:
            raise GroupAdminError(f"topic {topic!r}: {error_name(found.error_code)}; `appliance topics list` "
                                  "shows the topics", found.error_code)
        return sorted(p.partition_index for p in found.partitions)

    def log_offsets(self, partitions: Iterable[TopicPartition], timestamp: int, *,
                    missing_ok: bool = False) -> dict[TopicPartition, int]:
        """ListOffsets of each partition at its leader: :data:`EARLIEST`, :data:`LATEST` or a timestamp in
        ms (-1 for a partition with no record at or after it).  GroupAdminError for a partition that does
        not exist, has no leader or that its leader refused; with ``missing_ok`` such a partition is left
        out of the answer instead (a group's committed offsets of a deleted topic)."""
        wanted = sorted(set(partitions))
        self.cluster.metadata(sorted({t for t, _ in wanted}))
        by_leader: dict[int, dict[str, list[int]]] = {}
        for topic, partition in wanted:
            leader = self.cluster.leaders.get((topic, partition), -1)
            if leader < 0 and missing_ok:
                continue
            if leader < 0:
                raise GroupAdminError(f"partition {topic}-{partition}: no such partition or no leader now "
                                      "(`appliance topics describe` shows it)",
                                      ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
            by_leader.setdefault(leader, {}).setdefault(topic, []).append(partition)
        offsets: dict[TopicPartition, int] = {}
        for leader, topics in by_leader.items():
            request = ListOffsetsRequest(replica_id=_CONSUMER_REPLICA_ID, topics=[
                ListOffsetsTopic(t, [ListOffsetsPartition(p, timestamp=timestamp) for p in ps])
                for t, ps in topics.items()])
            answer: ListOffsetsResponse = self.cluster.connection_to(leader).request(request)
            for t in answer.topics:
                for p in t.partitions:
                    if p.error_code != ErrorCode.NONE and missing_ok:
                        continue
                    if p.error_code != ErrorCode.NONE:
                        raise GroupAdminError(f"partition {t.name}-{p.partition_index}: ListOffsets refused "
                                              f"with {error_name(p.error_code)}", p.error_code)
                    offsets[(t.name, p.partition_index)] = p.offset
        return offsets

    # -- changing offsets ------------------------------------------------------------------------------------

    def alter_offsets(self, group_id: str, offsets: Mapping[TopicPartition, int]) -> None:
        """Commit ``offsets`` for the group as an admin (generation -1, no member): accepted only while the
        group has no members.  GroupAdminError with the first partition's error otherwise."""
        by_topic: dict[str, list[OffsetCommitRequestPartition]] = {}
        for (topic, partition), offset in sorted(offsets.items()):
            by_topic.setdefault(topic, []).append(
                OffsetCommitRequestPartition(partition_index=partition, committed_offset=offset,
                                             committed_metadata=""))
        request = OffsetCommitRequest(group_id=group_id, generation_id_or_member_epoch=-1, member_id="",
                                      topics=[OffsetCommitRequestTopic(t, ps) for t, ps in by_topic.items()])
        deadline = self._deadline()
        while True:
            answer: OffsetCommitResponse = self._connection(group_id).request(request)
            errors = [(t.name, p.partition_index, p.error_code) for t in answer.topics for p in t.partitions
                      if p.error_code != ErrorCode.NONE]
            if not errors:
                return
            topic, partition, code = errors[0]
            if code not in _RETRIABLE or time.monotonic() >= deadline:
                raise group_error(group_id, code, f"committing offsets of {topic}-{partition} refused")
            self._retry_or_raise(group_id, code, None, deadline)

    # -- deleting ------------------------------------------------------------------------------------------

    def delete_groups(self, group_ids: Iterable[str]) -> dict[str, int]:
        """Delete each group (its committed offsets with it); Kafka's error code per group (0: deleted)."""
        results: dict[str, int] = {}
        for group_id in dict.fromkeys(group_ids):
            deadline = self._deadline()
            while True:
                answer: DeleteGroupsResponse = self._connection(group_id).request(
                    DeleteGroupsRequest(groups_names=[group_id]))
                code = next((r.error_code for r in answer.results if r.group_id == group_id),
                            ErrorCode.UNKNOWN_SERVER_ERROR)
                if code not in _RETRIABLE or time.monotonic() >= deadline:
                    break
                self._retry_or_raise(group_id, code, None, deadline)
            results[group_id] = code
        return results

    def delete_offsets(self, group_id: str,
                       partitions: Iterable[TopicPartition]) -> tuple[int, dict[TopicPartition, int]]:
        """Delete the group's committed offsets of ``partitions``: the top-level error code and Kafka's
        error code per partition (0: deleted, or there was none)."""
        by_topic: dict[str, list[OffsetDeleteRequestPartition]] = {}
        for topic, partition in sorted(set(partitions)):
            by_topic.setdefault(topic, []).append(OffsetDeleteRequestPartition(partition))
        request = OffsetDeleteRequest(group_id=group_id,
                                      topics=[OffsetDeleteRequestTopic(t, ps) for t, ps in by_topic.items()])
        deadline = self._deadline()
        while True:
            answer: OffsetDeleteResponse = self._connection(group_id).request(request)
            if answer.error_code not in _RETRIABLE or time.monotonic() >= deadline:
                break
            self._retry_or_raise(group_id, answer.error_code, None, deadline)
        per_partition = {(t.name, p.partition_index): p.error_code
                         for t in answer.topics for p in t.partitions}
        return answer.error_code, per_partition

    # -- lifetime --------------------------------------------------------------------------------------------

    def close(self) -> None:
        for conn in self._coordinator_connections.values():
            conn.close()
        self._coordinator_connections.clear()
        self.cluster.close()

    def __enter__(self) -> GroupAdmin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_ADVICE: dict[int, str] = {
    ErrorCode.INVALID_GROUP_ID: "a group id is 1 to 255 characters",
    ErrorCode.UNKNOWN_MEMBER_ID: "the group has active members: stop its consumers first "
                                 "(`appliance consumer-groups --describe --group G --members` lists them)",
    ErrorCode.NON_EMPTY_GROUP: "the group has active members: stop its consumers first "
                               "(`appliance consumer-groups --describe --group G --members` lists them)",
    ErrorCode.GROUP_ID_NOT_FOUND: "no such group (`appliance consumer-groups --list` lists them)",
    ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC: "a member of the group consumes this topic: stop it, or unsubscribe "
                                         "it from the topic, first",
    ErrorCode.COORDINATOR_LOAD_IN_PROGRESS: "the coordinator is still loading its groups: try again shortly",
    ErrorCode.COORDINATOR_NOT_AVAILABLE: "the coordinator is not available yet: try again shortly",
    ErrorCode.NOT_COORDINATOR: "the group's coordinator moved: try again",
}


def group_error(group_id: str, code: int, message: str | None) -> GroupAdminError:
    """A GroupAdminError naming the group, Kafka's error and what to do."""
    advice = _ADVICE.get(code, "").replace("--group G", f"--group {group_id}")
    text = f"group {group_id!r}: {message + ': ' if message else ''}{error_name(code)}"
    return GroupAdminError(f"{text}; {advice}" if advice else text, code)
