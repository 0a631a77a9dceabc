"""A consumer's membership of a group: Kafka's classic group protocol, spoken to the group's coordinator.

Theory of operation
-------------------
:class:`GroupMember` is the member's side of ``appliance.coordinator.group``'s state machine, over the
broker's socket (TCP, or the broker's Unix socket on the local path; the records themselves are read
elsewhere).  It knows member ids, generations and error codes; what the partitions mean to the consumer
(callbacks, positions) is ``appliance.client.group_rebalance``'s business.

1. **Find the coordinator**: FindCoordinator (key type 0) to any broker; COORDINATOR_NOT_AVAILABLE (the
   offsets topic is being created) and COORDINATOR_LOAD_IN_PROGRESS are retried every ``retry.backoff.ms``
   until ``request.timeout.ms`` has passed.
2. **Join** (:meth:`GroupMember.join`): JoinGroup with the member's assignors and their subscription bytes.
   v4+ with an empty member id is answered MEMBER_ID_REQUIRED and a member id: join again with it.  The
   coordinator holds the answer until the rebalance ends (at most ``max.poll.interval.ms``, the rebalance
   timeout), so that request waits that long plus ``request.timeout.ms``.
3. **Assign** (the leader only): decode every member's subscription, ask Metadata for the partition counts,
   run the assignor the coordinator chose.  A member whose bytes do not decode is given nothing.
4. **Sync**: SyncGroup (the leader's carries everyone's assignment); the answer is this member's partitions.
   REBALANCE_IN_PROGRESS, ILLEGAL_GENERATION and UNKNOWN_MEMBER_ID on the way mean "join again" (the last
   with a fresh member id).
5. **Heartbeat**, on a thread of its own with its own connection, every ``heartbeat.interval.ms`` while the
   member is stable.  REBALANCE_IN_PROGRESS sets :attr:`rejoin_needed`; ILLEGAL_GENERATION,
   UNKNOWN_MEMBER_ID (the session expired) and FENCED_INSTANCE_ID set :attr:`lost` too: the partitions are
   someone else's now.  The same thread enforces ``max.poll.interval.ms``: when the consumer has not polled
   for that long it sends LeaveGroup, forgets its member id and marks the partitions lost, as Kafka's
   consumer does.
6. **Leave** (:meth:`GroupMember.leave`): LeaveGroup, so the others rebalance at once instead of after
   the session timeout.  A static member (``group.instance.id``) does not leave on close: it comes back
   under the same instance id.

Offsets (:meth:`commit`, :meth:`commit_async`, :meth:`committed`) go to the same coordinator with the
member's generation and member id, or generation -1 and no member id outside a group (a consumer using
``assign()``).  The group's fatal refusals (a session timeout out of the broker's range, no assignor in
common, an invalid group id, a fenced instance id) raise :class:`GroupError` naming the setting to change.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from appliance.client.assignors import Assignor
from ipc.kafka import (
    ErrorCode,
    FindCoordinatorRequest,
    HeartbeatRequest,
    JoinGroupRequest,
    JoinGroupRequestProtocol,
    LeaveGroupRequest,
    MemberIdentity,
    MetadataRequest,
    MetadataRequestTopic,
    OffsetCommitRequest,
    OffsetCommitRequestPartition,
    OffsetCommitRequestTopic,
    OffsetFetchRequest,
    OffsetFetchRequestTopic,
    SyncGroupRequest,
    SyncGroupRequestAssignment,
    error_name,
)
from ipc.kafka.consumer_protocol import (
    Assignment,
    Subscription,
    decode_assignment,
    decode_subscription,
    encode_assignment,
    encode_subscription,
)
from ipc.kafka_client import KafkaConnection
from storage.errors import ApplianceError, BrokerConnectionError, ProtocolError, RequestTimeoutError

__all__ = ["CommitResult", "GroupConfig", "GroupError", "GroupMember", "JoinResult"]

log = logging.getLogger(__name__)

TopicPartitionKey = tuple[str, int]
Dial = Callable[[str | None, int | None], KafkaConnection]  # (host, port) or (None, None): any broker

_RETRIABLE: Final = frozenset({
    ErrorCode.COORDINATOR_NOT_AVAILABLE, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, ErrorCode.NOT_COORDINATOR,
})
_REJOIN: Final = frozenset({ErrorCode.REBALANCE_IN_PROGRESS, ErrorCode.ILLEGAL_GENERATION})
_FORGET_ID: Final = frozenset({ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.FENCED_INSTANCE_ID})
_CONNECTION_ERRORS: Final = (BrokerConnectionError, RequestTimeoutError, ProtocolError)


class GroupError(ApplianceError):
    """The group coordinator refused this member for good (``code`` is Kafka's error code): fix the
    setting the message names.  Also raised by a commit the group refused (a rebalance gave the partitions
    to another member: poll again, and the consumer rejoins)."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class GroupConfig:
    group_id: str
    group_instance_id: str | None
    session_timeout_ms: int
    rebalance_timeout_ms: int  # max.poll.interval.ms
    heartbeat_interval_ms: int
    assignors: tuple[Assignor, ...]
    request_timeout_ms: int
    retry_backoff_ms: int


@dataclass(frozen=True)
class JoinResult:
    generation_id: int
    member_id: str
    protocol_name: str
    partitions: tuple[TopicPartitionKey, ...]


@dataclass
class CommitResult:
    """Per partition, the commit's error code (0: stored)."""

    errors: dict[TopicPartitionKey, int] = field(default_factory=dict)


class GroupMember:
    """One member of ``config.group_id``; see the module docstring.  The main thread calls everything but
    the heartbeat, which runs on the member's own thread."""

    def __init__(self, config: GroupConfig, dial: Dial) -> None:
        self.config = config
        self._dial = dial
        self._coordinator: tuple[str, int] | None = None
        self._conn: KafkaConnection | None = None
        self._lock = threading.Lock()
        self.member_id = ""
        self.generation_id = -1
        self.rejoin_needed = True
        self.lost = False
        self.subscribed = False  # joined since the last leave(): commits need a generation then
        self.fatal: GroupError | None = None
        self._stable = False
        self._last_poll = time.monotonic()
        self._async: list[tuple[dict[TopicPartitionKey, int], Callable[[CommitResult], None] | None]] = []
        self._stop = threading.Event()
        self._heartbeat = threading.Thread(target=self._heartbeat_loop, name="group-heartbeat", daemon=True)
        self._heartbeat.start()

    # -- the coordinator -------------------------------------------------------------------------------------
    def _find_coordinator(self) -> tuple[str, int]:
        cfg = self.config
        deadline = time.monotonic() + cfg.request_timeout_ms / 1000
        while True:
            any_conn = self._dial(None, None)
            try:
                found = any_conn.request(FindCoordinatorRequest(key=cfg.group_id, key_type=0))
            finally:
                any_conn.close()
            if found.error_code == ErrorCode.NONE:
                return found.host, found.port
            if found.error_code not in _RETRIABLE or time.monotonic() >= deadline:
                raise self._refused("FindCoordinator", found.error_code)
            time.sleep(cfg.retry_backoff_ms / 1000)

    def connection(self) -> KafkaConnection:
        """The main thread's connection to the coordinator (found first if unknown)."""
        if self._conn is None or self._conn.closed:
            if self._coordinator is None:
                self._coordinator = self._find_coordinator()
            self._conn = self._dial(*self._coordinator)
        return self._conn

    def _request(self, body: Any, timeout_ms: int | None = None) -> Any:
        """One request to the coordinator, after any asynchronous commits' answers; a broken connection or a
        moved coordinator is found again, and the request retried, until ``request.timeout.ms``."""
        self.drain_async(block=True)
        deadline = time.monotonic() + self.config.request_timeout_ms / 1000
        while True:
            try:
                return self.connection().request(body, timeout_ms=timeout_ms)
            except _CONNECTION_ERRORS:
                self._forget_coordinator()
                if time.monotonic() >= deadline:
                    raise
                time.sleep(self.config.retry_backoff_ms / 1000)

    def _forget_coordinator(self) -> None:
        if self._conn is not None:
            self._conn.close()
        self._conn = None
        self._coordinator = None

    def _refused(self, what: str, code: int) -> GroupError:
        cfg, name = self.config, f"{error_name(code)} ({code})"
        group = f"group {cfg.group_id!r}: {what} refused with {name}"
        hints: dict[int, str] = {
            ErrorCode.INVALID_SESSION_TIMEOUT: f"session.timeout.ms={cfg.session_timeout_ms} is outside the "
            "broker's group.min.session.timeout.ms .. group.max.session.timeout.ms: choose one inside it",
            ErrorCode.INCONSISTENT_GROUP_PROTOCOL: "the group's members have no assignor in common with "
            f"partition.assignment.strategy={','.join(a.name for a in cfg.assignors)} (or the group is not "
            "a consumer group): give every member an assignor they all list",
            ErrorCode.INVALID_GROUP_ID: "group.id must be 1 to 255 characters",
            ErrorCode.FENCED_INSTANCE_ID: f"another consumer joined with group.instance.id="
            f"{cfg.group_instance_id!r}: give each member its own instance id",
            ErrorCode.GROUP_MAX_SIZE_REACHED: "the group has the broker's group.max.size members already",
        }
        hint = hints.get(code, "retry later" if code in _RETRIABLE else "see the broker's log")
        return GroupError(f"{group}: {hint}", code)

    # -- join and sync ---------------------------------------------------------------------------------------
    def poll_called(self) -> None:
        self._last_poll = time.monotonic()

    def join(self, subscription: Subscription) -> JoinResult:
        """Join (or rejoin) the group with ``subscription`` and return this member's partitions; blocks
        until the rebalance ends.  Raises GroupError for a refusal that joining again cannot fix."""
        cfg = self.config
        with self._lock:
            self._stable = False
        self.subscribed = True
        metadata = encode_subscription(subscription)
        protocols = [JoinGroupRequestProtocol(a.name, metadata) for a in cfg.assignors]
        while True:
            if self.fatal is not None:
                raise self.fatal
            joined = self._request(JoinGroupRequest(
                group_id=cfg.group_id, session_timeout_ms=cfg.session_timeout_ms,
                rebalance_timeout_ms=cfg.rebalance_timeout_ms, member_id=self.member_id,
                group_instance_id=cfg.group_instance_id, protocol_type="consumer", protocols=protocols,
            ), timeout_ms=cfg.rebalance_timeout_ms + cfg.request_timeout_ms)
            code = joined.error_code
            if code == ErrorCode.MEMBER_ID_REQUIRED:
                self.member_id = joined.member_id
                continue
            if code in _FORGET_ID and code != ErrorCode.FENCED_INSTANCE_ID:
                self.member_id = ""
                continue
            if code in _RETRIABLE or code == ErrorCode.REBALANCE_IN_PROGRESS:
                if code != ErrorCode.REBALANCE_IN_PROGRESS:
                    self._forget_coordinator()
                time.sleep(cfg.retry_backoff_ms / 1000)
                continue
            if code != ErrorCode.NONE:
                raise self._refused("JoinGroup", code)
            self.member_id = joined.member_id
            assignments = self._assign(joined) if joined.leader == joined.member_id else {}
            result = self._sync(joined.generation_id, joined.protocol_name, assignments)
            if result is not None:
                return result

    def _assign(self, joined: Any) -> dict[str, bytes]:
        assignor = next((a for a in self.config.assignors if a.name == joined.protocol_name), None)
        if assignor is None:  # the coordinator chose a protocol only from what every member listed
            raise self._refused("JoinGroup", ErrorCode.INCONSISTENT_GROUP_PROTOCOL)
        members: dict[str, Subscription] = {}
        for member in joined.members:
            try:
                members[member.member_id] = decode_subscription(member.metadata)
            except ProtocolError as exc:
                log.warning("group %r: member %s sent subscription bytes that do not decode (%s): it gets "
                            "no partitions", self.config.group_id, member.member_id, exc)
                members[member.member_id] = Subscription(())
        counts = self.partition_counts(sorted({t for s in members.values() for t in s.topics}))
        plan = assignor.assign(members, counts)
        return {m: encode_assignment(Assignment(tuple(plan.get(m, ())))) for m in members}

    def partition_counts(self, topics: Sequence[str] | None) -> dict[str, int]:
        """Topic -> partition count from Metadata (``None``: every topic but the internal ones)."""
        wanted = None if topics is None else [MetadataRequestTopic(t) for t in topics]
        if wanted == []:
            return {}
        answer = self._request(MetadataRequest(topics=wanted, allow_auto_topic_creation=False))
        return {t.name: len(t.partitions) for t in answer.topics
                if t.error_code == ErrorCode.NONE and not t.is_internal}

    def _sync(self, generation_id: int, protocol_name: str, assignments: Mapping[str, bytes],
              ) -> JoinResult | None:
        cfg = self.config
        synced = self._request(SyncGroupRequest(
            group_id=cfg.group_id, generation_id=generation_id, member_id=self.member_id,
            group_instance_id=cfg.group_instance_id,
            assignments=[SyncGroupRequestAssignment(m, a) for m, a in assignments.items()],
        ), timeout_ms=cfg.rebalance_timeout_ms + cfg.request_timeout_ms)
        code = synced.error_code
        if code in _REJOIN or code in _RETRIABLE:
            return None
        if code == ErrorCode.UNKNOWN_MEMBER_ID:
            self.member_id = ""
            return None
        if code != ErrorCode.NONE:
            raise self._refused("SyncGroup", code)
        try:
            partitions = decode_assignment(synced.assignment).partitions
        except ProtocolError as exc:
            log.warning("group %r: the leader's assignment for %s does not decode (%s): no partitions",
                        cfg.group_id, self.member_id, exc)
            partitions = ()
        with self._lock:
            self.generation_id = generation_id
            self.rejoin_needed = False
            self.lost = False
            self._stable = True
        self._last_poll = time.monotonic()
        return JoinResult(generation_id, self.member_id, protocol_name, partitions)

    def request_rejoin(self) -> None:
        with self._lock:
            self.rejoin_needed = True

    # -- heartbeats ------------------------------------------------------------------------------------------
    def _heartbeat_loop(self) -> None:
        cfg = self.config
        conn: KafkaConnection | None = None
        interval_s = cfg.heartbeat_interval_ms / 1000
        while not self._stop.wait(min(interval_s, 0.1) if not self._stable else interval_s):
            with self._lock:
                stable, member_id, generation = self._stable, self.member_id, self.generation_id
            coordinator = self._coordinator
            if not stable or coordinator is None:
                continue
            if time.monotonic() - self._last_poll > cfg.rebalance_timeout_ms / 1000:
                conn = self._leave_on(conn, coordinator, "poll() was not called within max.poll.interval.ms="
                                                         f"{cfg.rebalance_timeout_ms}")
                continue
            try:
                if conn is None or conn.closed:
                    conn = self._dial(*coordinator)
                answer = conn.request(HeartbeatRequest(group_id=cfg.group_id, generation_id=generation,
                                                       member_id=member_id,
                                                       group_instance_id=cfg.group_instance_id))
            except _CONNECTION_ERRORS:
                if conn is not None:
                    conn.close()
                conn = None
                continue
            self._heard(answer.error_code, generation)
        if conn is not None:
            conn.close()

    def _heard(self, code: int, generation: int) -> None:
        with self._lock:
            if generation != self.generation_id or not self._stable:
                return  # the main thread moved on meanwhile
            if code == ErrorCode.NONE:
                return
            self._stable = False
            self.rejoin_needed = True
            if code in (ErrorCode.ILLEGAL_GENERATION, *_FORGET_ID):
                self.lost = True
                self.generation_id = -1
                if code == ErrorCode.UNKNOWN_MEMBER_ID:
                    self.member_id = ""
                if code == ErrorCode.FENCED_INSTANCE_ID:
                    self.fatal = self._refused("Heartbeat", code)
            elif code in _RETRIABLE:
                self._coordinator = None

    def _leave_on(self, conn: KafkaConnection | None, coordinator: tuple[str, int], why: str,
                  ) -> KafkaConnection | None:
        """Leave the group from the heartbeat thread: the membership is lost at once, whether or not the
        LeaveGroup gets through (the session timeout removes the member otherwise)."""
        cfg = self.config
        log.warning("group %r: member %s leaves the group: %s; its partitions are lost and it joins again at "
                    "the next poll() (raise max.poll.interval.ms or process fewer records per poll)",
                    cfg.group_id, self.member_id, why)
        with self._lock:
            member_id = self.member_id
            self._stable = False
            self.rejoin_needed = True
            self.lost = True
            self.generation_id = -1
            self.member_id = ""
        if cfg.group_instance_id is not None:
            return conn  # a static member is removed by its session timeout, as in Kafka
        try:
            if conn is None or conn.closed:
                conn = self._dial(*coordinator)
            conn.request(LeaveGroupRequest(group_id=cfg.group_id, member_id=member_id,
                                           members=[MemberIdentity(member_id, None)]))
        except _CONNECTION_ERRORS:
            if conn is not None:
                conn.close()
            return None
        return conn

    def _send_leave(self, conn: KafkaConnection) -> None:
        cfg = self.config
        conn.request(LeaveGroupRequest(
            group_id=cfg.group_id, member_id=self.member_id,
            members=[MemberIdentity(self.member_id, cfg.group_instance_id)],
        ))

    # -- offsets ---------------------------------------------------------------------------------------------
    def _commit_request(self, offsets: Mapping[TopicPartitionKey, int]) -> OffsetCommitRequest:
        cfg = self.config
        by_topic: dict[str, list[OffsetCommitRequestPartition]] = {}
        for (topic, partition), offset in sorted(offsets.items()):
            by_topic.setdefault(topic, []).append(
                OffsetCommitRequestPartition(partition_index=partition, committed_offset=offset,
                                             committed_metadata=""))
        in_group = self._stable or self.generation_id >= 0
        return OffsetCommitRequest(
            group_id=cfg.group_id, generation_id_or_member_epoch=self.generation_id if in_group else -1,
            member_id=self.member_id if in_group else "",
            group_instance_id=cfg.group_instance_id if in_group else None,
            topics=[OffsetCommitRequestTopic(t, ps) for t, ps in by_topic.items()],
        )

    @staticmethod
    def _commit_result(answer: Any) -> CommitResult:
        return CommitResult({(t.name, p.partition_index): p.error_code for t in answer.topics
                             for p in t.partitions})

    def _not_a_member(self, offsets: Mapping[TopicPartitionKey, int]) -> CommitResult | None:
        """A subscribed member whose membership was lost has no generation to commit with: refused here, as
        Kafka's consumer refuses it (a commit outside the group would be accepted once the group is empty,
        and could overwrite what the partitions' new owner committed)."""
        if self.subscribed and self.generation_id < 0:
            return CommitResult(dict.fromkeys(offsets, int(ErrorCode.UNKNOWN_MEMBER_ID)))
        return None

    def commit(self, offsets: Mapping[TopicPartitionKey, int]) -> CommitResult:
        """Commit and wait for the answer (retrying the coordinator's retriable refusals)."""
        refused = self._not_a_member(offsets)
        if refused is not None:
            return refused
        deadline = time.monotonic() + self.config.request_timeout_ms / 1000
        while True:
            result = self._commit_result(self._request(self._commit_request(offsets)))
            if not any(c in _RETRIABLE for c in result.errors.values()) or time.monotonic() >= deadline:
                return result
            self._forget_coordinator()
            time.sleep(self.config.retry_backoff_ms / 1000)

    def commit_async(self, offsets: Mapping[TopicPartitionKey, int],
                     callback: Callable[[CommitResult], None] | None) -> None:
        """Send a commit now; its answer is read (and ``callback`` called) at the next request, poll or
        close.  The commits' answers come in the order they were sent."""
        if not offsets:
            return
        refused = self._not_a_member(offsets)
        if refused is not None:
            if callback is not None:
                callback(refused)
            return
        self.drain_async(block=False)
        try:
            self.connection().send(self._commit_request(offsets))
        except _CONNECTION_ERRORS:
            self._forget_coordinator()
            if callback is not None:
                callback(CommitResult({tp: ErrorCode.COORDINATOR_NOT_AVAILABLE for tp in offsets}))
            return
        self._async.append((dict(offsets), callback))

    def drain_async(self, *, block: bool) -> None:
        """Read the answers of asynchronous commits that have arrived (all of them with ``block``)."""
        while self._async and self._conn is not None:
            offsets, callback = self._async[0]
            try:
                answer = self._conn.receive(wait_ms=None if block else 0)
            except _CONNECTION_ERRORS:
                self._forget_coordinator()
                answer = None
                result = CommitResult({tp: ErrorCode.COORDINATOR_NOT_AVAILABLE for tp in offsets})
            else:
                if answer is None:
                    return
                result = self._commit_result(answer)
            self._async.pop(0)
            if callback is not None:
                callback(result)
        for offsets, callback in self._async:  # the connection is gone: their outcome is unknown
            if callback is not None:
                callback(CommitResult({tp: ErrorCode.COORDINATOR_NOT_AVAILABLE for tp in offsets}))
        self._async.clear()

    def committed(self, partitions: Sequence[TopicPartitionKey]) -> dict[TopicPartitionKey, int | None]:
        """The group's committed offset of each partition (None: nothing committed)."""
        by_topic: dict[str, list[int]] = {}
        for topic, partition in partitions:
            by_topic.setdefault(topic, []).append(partition)
        deadline = time.monotonic() + self.config.request_timeout_ms / 1000
        while True:
            answer = self._request(OffsetFetchRequest(group_id=self.config.group_id, topics=[
                OffsetFetchRequestTopic(t, ps) for t, ps in by_topic.items()]))
            codes = [answer.error_code] + [p.error_code for t in answer.topics for p in t.partitions]
            retry = next((c for c in codes if c in _RETRIABLE), None)
            if retry is None:
                failed = next((c for c in codes if c != ErrorCode.NONE), None)
                if failed is not None:
                    raise self._refused("OffsetFetch", failed)
                break
            if time.monotonic() >= deadline:
                raise self._refused("OffsetFetch", retry)
            self._forget_coordinator()
            time.sleep(self.config.retry_backoff_ms / 1000)
        found = {(t.name, p.partition_index): p.committed_offset for t in answer.topics for p in t.partitions}
        return {tp: (None if found.get(tp, -1) < 0 else found[tp]) for tp in partitions}

    # -- leaving ---------------------------------------------------------------------------------------------
    def leave(self) -> None:
        """Leave the group now (not for a static member: it returns under its instance id)."""
        with self._lock:
            was_member = bool(self.member_id) and self.config.group_instance_id is None
            self._stable = False
            self.generation_id = -1
        if was_member:
            try:
                self.drain_async(block=True)
                self._send_leave(self.connection())
            except (*_CONNECTION_ERRORS, GroupError) as exc:
                log.warning("group %r: LeaveGroup for %s failed (%s): the coordinator removes the member "
                            "after session.timeout.ms", self.config.group_id, self.member_id, exc)
        self.member_id = ""
        self.rejoin_needed = True
        self.subscribed = False

    def close(self) -> None:
        self._stop.set()
        if self._heartbeat.is_alive() and self._heartbeat is not threading.current_thread():
            self._heartbeat.join(5)
        try:
            self.drain_async(block=True)
        except ApplianceError:
            pass
        self._forget_coordinator()
