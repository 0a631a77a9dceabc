"""The broker's side of consumer groups: group requests into the coordinator, its answers out to the slots.

Theory of operation
-------------------
The group state machine (``appliance.coordinator``) has no sockets and no clock.  This module gives it both:
each request is handed over with ``now_ms`` (``time.monotonic``) and a *token*, the request's
:class:`~appliance.broker.connection.ResponseSlot` with its header; every answer comes back as a
:class:`~appliance.coordinator.Completion` and is written into its slot by the broker loop.

**Held requests.**  A JoinGroup waits for the other members' joins, a SyncGroup for the leader's.  Such a
request takes a slot and *parks* its connection, as a Fetch long poll does (nothing behind it on that
connection is handled until it is answered; every other connection is served).  Its answer comes from a
later request of another member or from the coordinator's timer: the broker loop sleeps at most until
:meth:`GroupRequests.next_deadline_ms` and then calls :meth:`GroupRequests.tick` (rebalance deadlines, the
initial rebalance delay, session expiry).  A member whose connection closes while its JoinGroup is held is
answered into a closed slot (dropped); it stays a member until its session times out, as in Kafka.

**Committed offsets are durable.**  An OffsetCommit takes a slot and parks its connection too: the commit
is checked by the coordinator, written to the group's partition of ``__consumer_offsets`` through the
broker's Produce path and answered (and applied) only once that append is acknowledged
(``appliance.broker.offsets_topic``).  The first group request creates that topic (FindCoordinator
answers COORDINATOR_NOT_AVAILABLE until it is recorded); until the group's partition of it is loaded,
every other request naming the group is answered COORDINATOR_LOAD_IN_PROGRESS, ListGroups too until every
partition is loaded.  DeleteGroups and OffsetDelete are written the same way, as tombstones, and answered
once they are in the log (a DeleteGroups answers each group not loaded yet COORDINATOR_LOAD_IN_PROGRESS).

**This broker is every group's coordinator.**  A single broker leads every partition of a single-host
appliance, so FindCoordinator (key type 0, a group) names this broker, at the address of the listener the
request came through.  Key type 1 (transactions) is COORDINATOR_NOT_AVAILABLE: there is no transaction
coordinator.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from appliance.broker.handlers import BrokerContext
from appliance.broker.offsets_topic import GroupWrite, OffsetsTopic
from appliance.broker.produce import ProduceService
from appliance.coordinator import Completion, GroupCoordinator, GroupSettings, JoinArgs
from appliance.coordinator.coordinator import valid_group_id
from appliance.coordinator.offset_records import OFFSETS_TOPIC
from ipc.kafka import (
    ApiKey,
    DescribedGroup,
    DescribeGroupsRequest,
    DescribeGroupsResponse,
    ErrorCode,
    FindCoordinatorRequest,
    FindCoordinatorResponse,
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    ListGroupsResponse,
    OffsetCommitResponse,
    OffsetCommitResponsePartition,
    OffsetCommitResponseTopic,
    OffsetDeleteResponse,
    OffsetFetchResponse,
    OffsetFetchResponsePartition,
    OffsetFetchResponseTopic,
    ProduceResponse,
    RequestHeader,
    SyncGroupResponse,
)

__all__ = ["GROUP_APIS", "HELD_GROUP_APIS", "WRITING_GROUP_APIS", "Answer", "GroupRequests"]

HELD_GROUP_APIS = frozenset({ApiKey.JOIN_GROUP, ApiKey.SYNC_GROUP})  # may wait for other members
# answered once their records are in __consumer_offsets
WRITING_GROUP_APIS = frozenset({ApiKey.OFFSET_COMMIT, ApiKey.OFFSET_DELETE, ApiKey.DELETE_GROUPS})
GROUP_APIS = frozenset({
    ApiKey.FIND_COORDINATOR, ApiKey.JOIN_GROUP, ApiKey.SYNC_GROUP, ApiKey.HEARTBEAT, ApiKey.LEAVE_GROUP,
    ApiKey.OFFSET_COMMIT, ApiKey.OFFSET_FETCH, ApiKey.LIST_GROUPS, ApiKey.DESCRIBE_GROUPS,
    ApiKey.DELETE_GROUPS, ApiKey.OFFSET_DELETE,
})

Answer = tuple[Any, RequestHeader, Any]  # (the slot, the request's header, the response body)


def _now_ms() -> int:
    return int(time.monotonic() * 1000)


class GroupRequests:
    """The coordinator of this broker and the requests it holds (module docstring)."""

    def __init__(self, ctx: BrokerContext, produce: ProduceService,
                 clock_ms: Callable[[], int] = _now_ms) -> None:
        config = ctx.config
        self.ctx = ctx
        self.coordinator = GroupCoordinator(GroupSettings(
            min_session_timeout_ms=config.group_min_session_timeout_ms,
            max_session_timeout_ms=config.group_max_session_timeout_ms,
            initial_rebalance_delay_ms=config.group_initial_rebalance_delay_ms,
            max_size=config.group_max_size,
        ))
        self._clock_ms = clock_ms
        self.offsets_topic = OffsetsTopic(ctx, self.coordinator, produce, clock_ms)
        self._retention_ms = config.offsets_retention_minutes * 60_000
        self._check_interval_ms = config.offsets_retention_check_interval_ms
        self._next_check_ms = clock_ms() + self._check_interval_ms

    def start(self) -> None:
        """Load ``__consumer_offsets`` if it exists (what is not loaded now is loaded by :meth:`tick`)."""
        self.offsets_topic.start()

    def _loading(self, header: RequestHeader, body: Any) -> Any:
        """The COORDINATOR_LOAD_IN_PROGRESS answer while the group's offsets are being loaded, else None."""
        api_key = header.api_key
        topic = self.offsets_topic
        if api_key == ApiKey.LIST_GROUPS:  # no topic yet: no group either
            if topic.fully_loaded or not topic.created:
                return None
            return ListGroupsResponse(error_code=ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, groups=[])
        if api_key == ApiKey.FIND_COORDINATOR and (body.key_type != 0 or not valid_group_id(body.key)):
            return None  # a transaction coordinator, or INVALID_GROUP_ID: not this topic's business
        if not topic.want() and api_key == ApiKey.FIND_COORDINATOR:
            return FindCoordinatorResponse(error_code=ErrorCode.COORDINATOR_NOT_AVAILABLE,
                                           error_message=f"{OFFSETS_TOPIC} is being created", node_id=-1,
                                           host="", port=-1)
        if api_key in (ApiKey.FIND_COORDINATOR, ApiKey.DESCRIBE_GROUPS, ApiKey.DELETE_GROUPS):
            return None  # answered per group
        code = self.offsets_topic.loading_error(body.group_id)
        return None if code is None else _refusal(header, body, code)

    # -- held: JoinGroup and SyncGroup -------------------------------------------------------------------

    def start_held(self, slot: Any, header: RequestHeader, body: Any, peer: str) -> list[Answer]:
        """A JoinGroup or SyncGroup: the answers given now (this request's among them, or it is held)."""
        token = (slot, header)
        now_ms = self._clock_ms()
        refused = self._loading(header, body)
        if refused is not None:
            return [(slot, header, refused)]
        if header.api_key == ApiKey.JOIN_GROUP:
            done = self.coordinator.join(body.group_id, _join_args(header, body, peer), token, now_ms)
        else:
            plan = [(a.member_id, bytes(a.assignment)) for a in body.assignments]
            done = self.coordinator.sync(body.group_id, body.member_id, body.generation_id, plan, token,
                                         now_ms, body.group_instance_id)
        return self._stored(_answers(done))

    def tick(self) -> list[Answer]:
        self.offsets_topic.tick()
        now_ms = self._clock_ms()
        if now_ms >= self._next_check_ms and self.offsets_topic.fully_loaded:
            self._next_check_ms = now_ms + self._check_interval_ms
            expired = self.coordinator.plan_expiry(int(time.time() * 1000), self._retention_ms)
            self.offsets_topic.expire(expired)
        return self._stored(_answers(self.coordinator.tick(now_ms)))

    def _stored(self, answers: list[Answer]) -> list[Answer]:
        """Write the group metadata records the last call made due; ``answers`` (that call's) are held
        until they are in ``__consumer_offsets``: the answers to give now."""
        records = self.coordinator.take_metadata(int(time.time() * 1000))
        unconfirmed = self.coordinator.take_unconfirmed()
        return self.offsets_topic.write_metadata(records, answers, unconfirmed) if records else answers

    def next_deadline_ms(self) -> int | None:
        """When :meth:`tick` is next due, on the ``time.monotonic`` clock in ms (None: nothing timed)."""
        due = self.coordinator.next_deadline_ms()
        if self.offsets_topic.fully_loaded:  # offsets.retention.check.interval.ms
            due = self._next_check_ms if due is None else min(due, self._next_check_ms)
        load_s = self.offsets_topic.next_timer_s()
        if load_s is not None:
            load_ms = int(load_s * 1000)
            due = load_ms if due is None else min(due, load_ms)
        return due

    # -- OffsetCommit, OffsetDelete, DeleteGroups: answered once in __consumer_offsets ---------------------

    def start_write(self, slot: Any, header: RequestHeader, body: Any) -> Any:
        """A request that writes to ``__consumer_offsets``: its answer now (refused, or nothing to write),
        or None: answered by :meth:`appended` once its records are in the log."""
        refused = self._loading(header, body)
        if refused is not None:
            return refused
        c = self.coordinator
        if header.api_key == ApiKey.DELETE_GROUPS:
            loading = {g: code for g in body.groups_names
                       if valid_group_id(g) and (code := self.offsets_topic.loading_error(g)) is not None}
            plan = c.plan_delete_groups([g for g in body.groups_names if g not in loading])
            plan.results.update(loading)
            return self.offsets_topic.delete_groups(slot, header, plan)
        if header.api_key == ApiKey.OFFSET_DELETE:
            return self.offsets_topic.delete_offsets(slot, header, c.plan_offset_delete(body, self._known))
        now_ms = self._clock_ms()
        if any(t.name not in self.ctx.table.topics for t in body.topics):
            self.ctx.refresh_topics(soon=True)  # a topic created since the broker last asked
        commit = c.plan_commit(body, header.api_version, now_ms, int(time.time() * 1000), self._known)
        return self.offsets_topic.append(slot, header, commit)

    def _known(self, topic: str, partition: int) -> bool:
        meta = self.ctx.table.topics.get(topic)
        return meta is not None and 0 <= partition < meta.partitions

    def appended(self, owner: GroupWrite, produced: ProduceResponse | None) -> list[Answer]:
        """The Produce path finished one of the coordinator's appends: the answers it releases."""
        return self.offsets_topic.appended(owner, produced)

    def close(self) -> list[Answer]:
        return _answers(self.coordinator.close())

    # -- answered at once ---------------------------------------------------------------------------------

    def answer(self, header: RequestHeader, body: Any, listener: str) -> tuple[Any, list[Answer]]:
        """Every other group request: its response, and the held requests it released (a LeaveGroup)."""
        now_ms = self._clock_ms()
        api_key = header.api_key
        c = self.coordinator
        refused = self._loading(header, body)
        if refused is not None:
            return refused, []
        if api_key == ApiKey.FIND_COORDINATOR:
            return self._find_coordinator(body, listener), []
        if api_key == ApiKey.HEARTBEAT:
            return c.heartbeat(body.group_id, body.member_id, body.generation_id, now_ms,
                               body.group_instance_id), []
        if api_key == ApiKey.LEAVE_GROUP:
            return self._leave(header, body, now_ms)
        if api_key == ApiKey.OFFSET_FETCH:
            return c.fetch(body), []
        if api_key == ApiKey.LIST_GROUPS:
            return ListGroupsResponse(error_code=ErrorCode.NONE, groups=c.list_groups()), []
        if api_key == ApiKey.DESCRIBE_GROUPS:
            return self._describe(body), []
        raise ValueError(f"{ApiKey(api_key).name} is not a group request")

    def _find_coordinator(self, body: FindCoordinatorRequest, listener: str) -> FindCoordinatorResponse:
        if body.key_type != 0:
            return FindCoordinatorResponse(error_code=ErrorCode.COORDINATOR_NOT_AVAILABLE,
                                           error_message="transactions are not implemented: no transaction "
                                           "coordinator", node_id=-1, host="", port=-1)
        if not valid_group_id(body.key):
            return FindCoordinatorResponse(error_code=ErrorCode.INVALID_GROUP_ID,
                                           error_message=f"invalid group id {body.key[:64]!r}",
                                           node_id=-1, host="", port=-1)
        ctx = self.ctx
        host, port = ctx.advertised.get(listener) or next(iter(ctx.advertised.values()), ("127.0.0.1", 9092))
        return FindCoordinatorResponse(error_code=ErrorCode.NONE, error_message=None, node_id=ctx.node_id,
                                       host=host, port=port)

    def _leave(self, header: RequestHeader, body: LeaveGroupRequest, now_ms: int) -> tuple[Any, list[Answer]]:
        members: list[tuple[str, str | None]] = [(body.member_id, None)] if header.api_version < 3 else [
            (m.member_id, m.group_instance_id) for m in body.members]
        response, released = self.coordinator.leave(body.group_id, members, now_ms,
                                                     batch=header.api_version >= 3)
        return response, self._stored(_answers(released))

    def _describe(self, body: DescribeGroupsRequest) -> DescribeGroupsResponse:
        groups = []
        for group_id in body.groups:
            code = self.offsets_topic.loading_error(group_id) if valid_group_id(group_id) else None
            groups.append(self.coordinator.describe(group_id) if code is None
                          else DescribedGroup(code, group_id, "", "", "", []))
        return DescribeGroupsResponse(groups=groups)


def _client_host(peer: str) -> str:
    """A member's host as Kafka shows it (Java's ``InetAddress.toString()``: ``/127.0.0.1``, no port)."""
    if peer.startswith("unix:"):
        return peer
    return "/" + peer.rsplit(":", 1)[0].strip("[]")


def _join_args(header: RequestHeader, body: JoinGroupRequest, peer: str) -> JoinArgs:
    return JoinArgs(
        member_id=body.member_id,
        session_timeout_ms=body.session_timeout_ms,
        # v0 has no rebalance timeout: Kafka uses the session timeout
        rebalance_timeout_ms=(body.rebalance_timeout_ms if header.api_version >= 1
                              else body.session_timeout_ms),
        protocol_type=body.protocol_type,
        protocols=[(p.name, bytes(p.metadata)) for p in body.protocols],
        client_id=header.client_id or "",
        client_host=_client_host(peer),
        group_instance_id=body.group_instance_id,
        require_known_member_id=header.api_version >= 4,
    )


def _refusal(header: RequestHeader, body: Any, code: ErrorCode) -> Any:
    """A group request answered ``code`` as a whole, nothing changed."""
    api_key = header.api_key
    if api_key == ApiKey.JOIN_GROUP:
        return JoinGroupResponse(error_code=code, generation_id=-1, protocol_name="", leader="",
                                 member_id=body.member_id, members=[])
    if api_key == ApiKey.SYNC_GROUP:
        return SyncGroupResponse(error_code=code, assignment=b"")
    if api_key == ApiKey.HEARTBEAT:
        return HeartbeatResponse(error_code=code)
    if api_key == ApiKey.LEAVE_GROUP:
        return LeaveGroupResponse(error_code=code, members=[])
    if api_key == ApiKey.OFFSET_COMMIT:
        return OffsetCommitResponse(topics=[
            OffsetCommitResponseTopic(t.name, [OffsetCommitResponsePartition(p.partition_index, code)
                                               for p in t.partitions])
            for t in body.topics])  # fmt: skip
    if api_key == ApiKey.OFFSET_DELETE:
        return OffsetDeleteResponse(error_code=code, topics=[])
    if api_key == ApiKey.OFFSET_FETCH:  # v0-1 carry the error per partition only
        topics = [OffsetFetchResponseTopic(t.name, [
            OffsetFetchResponsePartition(partition_index=i, committed_offset=-1, committed_leader_epoch=-1,
                                         metadata="", error_code=code) for i in t.partition_indexes])
            for t in body.topics or []]  # fmt: skip
        return OffsetFetchResponse(topics=topics, error_code=code)
    raise ValueError(f"{ApiKey(api_key).name} names no group")


def _answers(done: list[Completion]) -> list[Answer]:
    return [(c.token[0], c.token[1], c.response) for c in done]

