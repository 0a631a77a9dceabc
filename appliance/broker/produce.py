"""Produce over the socket: validate each batch, hand it to the partition's writer through a ring, answer.

Theory of operation
-------------------
There is one path into a log: a partition writer draining rings.  A Produce request therefore does not write
anything itself.  For each partition in the request the broker

1. checks what Kafka checks before an append: the partition exists and is served here; the batch is one
   valid RecordBatch v2 within ``max.message.bytes``, not transactional, every record keyed on a compacted
   topic (``appliance.broker.produce_checks``); for ``acks=-1`` the partition has at least
   ``min.insync.replicas`` in-sync replicas (the topic's current value, an AlterConfigs included);
2. publishes the batch bytes, unchanged, into its ring to that partition's writer
   (:class:`ipc.ring_publisher.RingPublisher`, the same code local producers use), which dedups
   idempotent batches, stamps offsets, appends and acknowledges with the base offset or an error code;
3. holds the request until every partition is acknowledged, then answers in request order.

A client's Produce to an internal topic (``__consumer_offsets``) is refused with INVALID_TOPIC_EXCEPTION,
as Kafka refuses it to every client but its own admin; the group coordinator writes there through
:meth:`Produce.start` with ``internal=True`` (``appliance.broker.offsets_topic``).

``acks=-1`` additionally waits until the high watermark passes the batch.  With replication factor 1 the
writer publishes HW = LEO before it acknowledges, so this costs nothing.  A replicated partition is refused
before anything is handed to the writer while its ISR is below ``min.insync.replicas``
(NOT_ENOUGH_REPLICAS), and once acknowledged waits in the replication layer's ``PendingAcks``
(``appliance.broker.replication``) until the committed high watermark passes it: then NONE, or
NOT_ENOUGH_REPLICAS_AFTER_APPEND if the ISR shrank below ``min.insync.replicas`` meanwhile.
``acks=0`` gets no response; as in Kafka, a partition error then
closes the connection so that the client notices and refreshes its metadata.  A partition not answered
within the request's ``timeout_ms`` gets REQUEST_TIMED_OUT (the batch may still be appended: the outcome is
unknown, as Kafka says; idempotent producers retry safely).

**Attaching.**  The broker attaches one ring per partition it produces to, lazily, through its control
connection (so the rings die with the broker process).  A Produce that needs rings asks, in one
``attach_many`` request sent without waiting (``Cluster.attach_later``), for those of its partitions and of
more partitions of the topic, the ones that follow: clients spread records over all partitions and often
send one partition per request, so a topic's first records pay one round trip per :data:`ATTACH_AHEAD`
partitions, not one per partition.  Meanwhile the request is held and its batches wait for the attach
(``_Batch.attaching``; a later request to the same partition waits for the same one); the broker's loop
serves everything else.  When the answer comes (:meth:`Produce.poll`, first thing) the rings are opened and
the waiting batches published in the order their requests came.  A batch whose ring does not come within its
request's ``timeout_ms`` gets REQUEST_TIMED_OUT (nothing was appended); an attach with no answer within the
control timeout (``REQUEST_TIMEOUT_S``) is given up, and a later batch asks again.  A ring that comes when
no batch waits for it any more (they timed out, or the attach was given up) is detached at once, so that no
ring stays attached and unused; a refused attach answers its batches with the refusal.

At most :data:`MAX_UNUSED_AHEAD` rings attached ahead and not used yet are held at any time; they start no
writer until a batch is published into them (``ipc.control``, "Lifetime of a ring").  A ring starts at
``appliance.ring.initial.bytes`` and grows with the traffic (``ipc.ring_publisher``, "Growing").

**Memory follows the data in flight.**  The broker holds a partition's ring only while the partition has
had produce traffic within ``appliance.ring.idle.ms``: on a timer of the broker's loop (:meth:`Produce.tick`,
due at :meth:`Produce.next_timer_ms`; no timer while no ring is held), a ring with nothing in flight and no
batch published for that long, or of a partition that was deleted, is unmapped and detached, all those of
one tick in one round trip (ticks are up to :data:`IDLE_CHECK_SLACK_MS` late to gather them; the supervisor
unlinks each once the writer drained it).  The rings of a deleted topic go at the next tick (the broker's
own DeleteTopics, or a metadata refresh, closes their partitions) or, at the latest, when they turn idle.
When the control connection was lost and re-established (a new ``cluster.session``), the rings of the old
one are gone: they are dropped, their unanswered batches get NOT_LEADER_OR_FOLLOWER (retriable; an
idempotent producer's retry is deduplicated), and new ones attached.  A full ring is back-pressure: the
batch waits in the held request and is published by a later poll; the connection stays parked meanwhile,
so it reads no further requests.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from appliance.broker.append_time import AppendTimeTopics, stamped_append_time
from appliance.broker.cluster import ClusterError
from appliance.broker.control_cluster import REQUEST_TIMEOUT_S
from appliance.broker.handlers import BrokerContext
from appliance.broker.partitions import INTERNAL_TOPICS, PartitionHandle
from appliance.broker.produce_checks import check_batch
from ipc.kafka import (
    ErrorCode,
    PartitionProduceResponse,
    ProduceRequest,
    ProduceResponse,
    RequestHeader,
    TopicProduceResponse,
)
from ipc.ring import RingFailedError
from ipc.ring_publisher import RingGrowth, RingPublisher
from ipc.state_page import monotonic_ms
from storage.errors import ApplianceError, BackPressureError, CorruptRecordError

if TYPE_CHECKING:
    from ipc.control import Attachment

__all__ = ["Produce", "ProduceOutcome", "ProduceService"]

log = logging.getLogger("appliance.broker")

# a Produce that needs a ring also attaches up to this many more partitions of its topic
ATTACH_AHEAD = 32
# the most rings attached ahead and not used yet that the broker holds (each is appliance.ring.initial.bytes
# of /dev/shm, populated when created; they go after appliance.ring.idle.ms)
MAX_UNUSED_AHEAD = 4 * ATTACH_AHEAD
IDLE_CHECK_SLACK_MS = 250  # rings idle within this of each other are let go together (one round trip)
RING_ACK_TIMEOUT_FLOOR_MS = 1000  # a request's timeout_ms below this still waits this long for the writer
_COMMIT_ERRORS = {
    ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND: "appended, but the ISR fell below min.insync.replicas before "
    "it was committed",
    ErrorCode.REQUEST_TIMED_OUT: "appended, not committed by the in-sync replicas in time",
    ErrorCode.NOT_LEADER_OR_FOLLOWER: "this broker stopped leading the partition before it was committed",
}

# Answers of the partition's writer that deserve a word in the Produce response's error_message.
_WRITER_ERRORS: dict[int, str] = {
    ErrorCode.KAFKA_STORAGE_ERROR: "the partition's log directory cannot take writes (its file system is "
    "full, or below log.dir.min.free.bytes); nothing was appended; retry: writes resume once there is room",
}


class ProduceOutcome(NamedTuple):
    """What the broker does with a Produce request right after :meth:`ProduceService.start`."""

    response: ProduceResponse | None = None  # answer now
    held: bool = False  # answered later by ProduceService.poll (the connection is parked meanwhile)
    close_reason: str | None = None  # acks=0 with an error: close the connection


class ProduceService(Protocol):
    @property
    def pending(self) -> int: ...

    def start(self, owner: object, header: RequestHeader, request: ProduceRequest, *,
              internal: bool = False) -> ProduceOutcome: ...

    def poll(self, now_ms: float) -> list[tuple[object, RequestHeader, ProduceResponse | None]]: ...

    def next_timer_ms(self) -> float | None: ...

    def tick(self, now_ms: float) -> None: ...

    def close(self) -> None: ...


@dataclass(eq=False, slots=True)
class _Batch:
    """One partition's batch of a held request: published (or waiting for ring space), then answered."""

    held: _Held
    topic: str
    handle: PartitionHandle
    records: memoryview
    last_offset_delta: int
    answer: PartitionProduceResponse
    log_append_time: bool = False  # a LogAppendTime topic: the answer carries the stamped time
    published: bool = False
    acked: bool = False  # the writer answered
    committing: bool = False  # acks=-1 on a replicated partition: waiting for the committed high watermark
    done: bool = False  # the answer is final (acked, and for acks=-1 the high watermark passed it)
    attaching: _Attaching | None = None  # the attach its partition's ring waits for (module docstring)

    @property
    def key(self) -> tuple[str, int]:
        return self.topic, self.handle.partition


@dataclass(eq=False, slots=True)
class _Attaching:
    """One ``attach_many`` sent to the supervisor and not used yet: the partitions batches wait for
    (``own``) and those attached ahead; its answer, per partition, once it came."""

    handles: dict[tuple[str, int], PartitionHandle]
    own: set[tuple[str, int]]
    deadline_ms: float  # given up after this (the control timeout): its late answer's rings are detached
    results: list[Attachment | ClusterError] | None = None  # the answer, in the order of ``handles``
    errors: dict[tuple[str, int], tuple[int, str]] = field(default_factory=dict)  # per partition refused
    answered: bool = False  # the answer was used: rings opened (or detached), errors known
    abandoned: bool = False  # no answer by ``deadline_ms``


@dataclass(eq=False, slots=True)
class _Held:
    owner: object
    header: RequestHeader
    acks: int
    deadline_ms: float
    answers: list[tuple[str, list[PartitionProduceResponse]]]
    batches: list[_Batch] = field(default_factory=list)


class Produce:
    """The broker's :class:`ProduceService`: rings per partition, held requests, acks."""

    def __init__(self, ctx: BrokerContext) -> None:
        self.ctx = ctx
        self._publishers: dict[tuple[str, int], RingPublisher[_Batch]] = {}
        self._served_by: dict[tuple[str, int], PartitionHandle] = {}  # the topic incarnation of each ring
        self._held: list[_Held] = []
        self._session = ctx.cluster.session  # the control session the rings belong to
        self._idle_ms = float(getattr(ctx.config, "ring_idle_ms", 30_000))
        self._last_used_ms: dict[tuple[str, int], float] = {}  # when a batch last went into each ring
        self._unused: set[tuple[str, int]] = set()  # rings attached ahead that no batch used yet
        self._next_check_ms: float | None = None  # when tick() next looks for idle rings
        self._append_time_topics = AppendTimeTopics(ctx.config)
        self._attaching: dict[tuple[str, int], _Attaching] = {}  # partitions whose ring is being attached
        self._answered: list[_Attaching] = []  # attaches whose answer came, to be used by poll

    @property
    def pending(self) -> int:
        """Requests held, and attach answers not used yet."""
        return len(self._held) + len(self._answered)

    # -- a new request ------------------------------------------------------------------------------------

    def start(self, owner: object, header: RequestHeader, request: ProduceRequest, *,
              internal: bool = False) -> ProduceOutcome:
        """``internal``: the broker's own write to an internal topic (the group coordinator's commits);
        a client's Produce to one is refused with INVALID_TOPIC_EXCEPTION, as Kafka refuses it."""
        acks = request.acks
        now_ms = time.monotonic() * 1000
        held = _Held(owner, header, acks, now_ms + max(request.timeout_ms, RING_ACK_TIMEOUT_FLOOR_MS), [])
        errors = []
        for topic in request.topic_data:
            answers = []
            for part in topic.partition_data:
                answer = PartitionProduceResponse(index=part.index, error_code=ErrorCode.NONE, base_offset=-1)
                answers.append(answer)
                code: ErrorCode
                message: str | None
                if topic.name in INTERNAL_TOPICS and not internal:
                    code, message = ErrorCode.INVALID_TOPIC_EXCEPTION, (
                        f"cannot append to internal topic {topic.name}: its records are written by the "
                        "group coordinator (commit offsets with OffsetCommit)")
                else:
                    code, message = self._check(request, topic.name, part.index, part.records, held, answer)
                if code != ErrorCode.NONE:
                    answer.error_code = code
                    answer.error_message = message
                    errors.append(f"{topic.name}-{part.index}: {ErrorCode(code).name} {message or ''}")
            held.answers.append((topic.name, answers))
        self._attach_missing(held.batches)
        for batch in held.batches:
            self._publish(batch)
        if acks == 0 and errors:  # what was valid is still appended, as Kafka does
            held.batches = [b for b in held.batches if not b.published and not b.done]
            if held.batches:
                self._held.append(held)  # nobody reads the answer: its connection is closed
            return ProduceOutcome(close_reason=f"acks=0 produce failed: {'; '.join(errors)}")
        if acks == 0:
            held.batches = [b for b in held.batches if not b.published]
            if not held.batches:
                return ProduceOutcome()
        elif all(b.done for b in held.batches):
            return ProduceOutcome(response=self._response(held))
        self._held.append(held)
        return ProduceOutcome(held=True)

    def _check(
        self,
        request: ProduceRequest,
        topic: str,
        index: int,
        records: Any,
        held: _Held,
        answer: PartitionProduceResponse,
    ) -> tuple[ErrorCode, str | None]:
        if request.acks not in (0, 1, -1):
            return ErrorCode.INVALID_REQUIRED_ACKS, f"acks={request.acks}: expected 0, 1 or -1 (all)"
        if request.transactional_id is not None:
            return ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, "transactions are not supported"
        handle, code = self.ctx.lookup(topic, index)
        if handle is None:
            return code, self.ctx.table.offline_reason(topic, index)
        answer.log_start_offset = handle.page.log_start_offset
        if records is None or len(records) == 0:
            return ErrorCode.INVALID_RECORD, "no records"
        records = memoryview(records)
        meta = self.ctx.table.topics.get(topic)
        limit = meta.max_message_bytes if meta is not None else self.ctx.config.max_message_bytes
        checked = check_batch(records, topic, index, max_message_bytes=limit,
                              cleanup_policy=meta.cleanup_policy if meta is not None else ("delete",))
        if checked.header is None:
            if checked.record_errors is not None:
                answer.record_errors = checked.record_errors
            return checked.code, checked.message
        where = f"produce to {topic}-{index}"
        replicated = self.ctx.replication.get(handle) if self.ctx.replication is not None else None
        if request.acks == -1 and replicated is not None:
            if replicated.state.append_error(-1) != ErrorCode.NONE:
                isr = replicated.state.isr
                return (
                    ErrorCode.NOT_ENOUGH_REPLICAS,
                    f"{where}: {len(isr)} in-sync replicas {list(isr)}, min.insync.replicas "
                    f"{replicated.state.min_insync_replicas}",
                )
        elif request.acks == -1 and meta is not None:
            isr_count = len(self.ctx.table.isr(meta, index))
            needed = meta.min_insync_replicas  # the supervisor's current value (an AlterConfigs included)
            if isr_count < needed:
                return (
                    ErrorCode.NOT_ENOUGH_REPLICAS,
                    f"{where}: {isr_count} in-sync replicas, min.insync.replicas {needed}",
                )
        held.batches.append(_Batch(held, topic, handle, records, checked.header.last_offset_delta, answer,
                                   self._append_time_topics.stamped(topic, meta)))
        return ErrorCode.NONE, None

    # -- rings --------------------------------------------------------------------------------------------

    def _check_session(self) -> None:
        """Drop every ring if the control connection was re-established since they were attached."""
        session = self.ctx.cluster.session
        if session == self._session:
            return
        self._session = session
        for topic, partition in list(self._publishers):
            self._drop_publisher(topic, partition, RuntimeError("the control connection was re-established"),
                                 detach=False)  # fmt: skip

    def _attach_missing(self, batches: list[_Batch]) -> None:
        """Ask the supervisor, without waiting, for a ring to each partition of ``batches`` that has none and
        is not being attached already, and to up to :data:`ATTACH_AHEAD` more partitions of their topics,
        those that follow the requested ones: one ``attach_many`` (module docstring, "Attaching").

        A producer spreads its records over a topic's partitions and many clients (librdkafka among them)
        send one partition per Produce request: attaching ahead lets the next requests find their rings.
        Each batch without a ring waits for the attach of its partition (``_Batch.attaching``)."""
        self._check_session()
        own: dict[tuple[str, int], PartitionHandle] = {}
        for batch in batches:
            key = (batch.topic, batch.handle.partition)
            if batch.done or key in own or self._attached(key, batch.handle):
                continue
            pending = self._attaching.get(key)
            if pending is not None and time.monotonic() * 1000 >= pending.deadline_ms:
                self._abandon(pending)
                pending = None
            if pending is not None and pending.handles[key] is batch.handle:
                batch.attaching = pending  # joins the attach on its way
            else:
                own[key] = batch.handle
        if not own:
            return
        now_ms = time.monotonic() * 1000
        wanted = dict(own)
        for topic in {key[0] for key in own}:
            self._ahead(topic, max(p for t, p in own if t == topic) + 1, wanted)
        for key in wanted:
            if key in self._publishers:  # the topic was deleted (and maybe created again)
                self._drop_publisher(key[0], key[1], RuntimeError("the topic was deleted"))
        attaching = _Attaching(wanted, set(own), now_ms + REQUEST_TIMEOUT_S * 1000)
        for key in wanted:
            self._attaching[key] = attaching
        for batch in batches:
            if batch.key in own and not batch.done:
                batch.attaching = attaching

        def answered(results: list[Attachment | ClusterError]) -> None:
            attaching.results = results
            self._answered.append(attaching)  # used by poll(), never in the middle of other work

        ahead = [k for k in wanted if k not in own]
        self.ctx.cluster.attach_later(list(wanted), ahead=ahead, on_reply=answered)

    def _abandon(self, attaching: _Attaching) -> None:
        """Stop waiting for an attach (no answer within the control timeout): its batches time out, new
        batches attach again, and its rings, when the answer comes, are detached."""
        attaching.abandoned = True
        for key in attaching.handles:
            if self._attaching.get(key) is attaching:
                del self._attaching[key]

    def _settle(self) -> None:
        """Use the attach answers that came: open the rings batches wait for (or attached ahead), note the
        refusals; detach the rings nobody waits for any more (their batches timed out, or the attach was
        abandoned), so that no ring stays attached and unused."""
        answered, self._answered = self._answered, []
        for attaching in answered:
            for key in attaching.handles:
                if self._attaching.get(key) is attaching:
                    del self._attaching[key]
            waiting = {b.key for held in self._held for b in held.batches
                       if b.attaching is attaching and not b.done}  # fmt: skip
            unwanted: list[str] = []
            results = attaching.results or []
            for (key, handle), result in zip(attaching.handles.items(), results, strict=True):
                if isinstance(result, ClusterError):
                    attaching.errors[key] = (result.code, str(result))
                elif attaching.abandoned or handle.closed or (key in attaching.own and key not in waiting) \
                        or self._attached(key, handle):
                    unwanted.append(result.names.ring)
                else:
                    error = self._open_ring(key, handle, result)
                    if error is not None:
                        attaching.errors[key] = error
                        unwanted.append(result.names.ring)
                    elif key not in waiting:
                        self._unused.add(key)
            attaching.answered = True
            if unwanted:
                log.info("produce: %d ring(s) attached after their requests gave up; detaching them: %s",
                         len(unwanted), ", ".join(unwanted))  # fmt: skip
                self.ctx.cluster.detach_later(unwanted)

    def _ahead(self, topic: str, first: int, wanted: dict[tuple[str, int], PartitionHandle]) -> None:
        """Add to ``wanted`` up to :data:`ATTACH_AHEAD` partitions of ``topic`` led here without a ring,
        from ``first`` on (around the end), while fewer than :data:`MAX_UNUSED_AHEAD` rings attached ahead
        are unused."""
        meta = self.ctx.table.topics.get(topic)
        count = meta.partitions if meta is not None else 0
        ahead = max(0, ATTACH_AHEAD + len(self._unused) - MAX_UNUSED_AHEAD)
        for i in range(count):
            if ahead >= ATTACH_AHEAD:
                return
            key = (topic, (first + i) % count)
            if key in wanted or key in self._attaching:
                continue
            handle, _ = self.ctx.table.lookup(*key)
            if handle is not None and not handle.closed and not self._attached(key, handle):
                wanted[key] = handle
                ahead += 1

    def _attached(self, key: tuple[str, int], handle: PartitionHandle) -> bool:
        return key in self._publishers and self._served_by.get(key) is handle

    def _open_ring(
        self, key: tuple[str, int], handle: PartitionHandle, result: Attachment | ClusterError
    ) -> tuple[int, str] | None:
        """Open the ring of one ``attach_many`` result; the error code and message if there is none."""
        if isinstance(result, ClusterError):
            return result.code, str(result)
        try:
            publisher: RingPublisher[_Batch] = RingPublisher.attach(
                result.names, topic=key[0], partition=key[1], max_block_ms=0, growth=self._growth(key, result)
            )
        except (ApplianceError, OSError, ValueError) as e:
            log.error("produce to %s-%d: cannot open ring %s: %s", key[0], key[1], result.names.ring, e)
            return ErrorCode.NOT_LEADER_OR_FOLLOWER, "the partition's writer is unreachable"
        self._hold(key, handle, publisher)
        return None

    def _growth(self, key: tuple[str, int], attachment: Attachment) -> RingGrowth:
        """How the ring of ``key`` grows: a larger ring attached, the old one detached, through the
        control connection."""
        topic, partition = key
        cluster = self.ctx.cluster
        return RingGrowth(lambda capacity: cluster.attach(topic, partition, ring_bytes=capacity).names,
                          cluster.detach, attachment.ring_bytes_max or attachment.ring_bytes)

    def _hold(self, key: tuple[str, int], handle: PartitionHandle, publisher: RingPublisher[_Batch]) -> None:
        """Keep ``publisher`` as the ring of ``key``; its idle clock starts now."""
        now_ms = time.monotonic() * 1000
        self._publishers[key] = publisher
        self._served_by[key] = handle
        self._last_used_ms[key] = now_ms
        if self._next_check_ms is None:
            self._next_check_ms = now_ms + self._idle_ms

    def _publisher(self, batch: _Batch) -> RingPublisher[_Batch] | None:
        """The ring of the batch's partition; None while it is being attached (or the attach was refused:
        the batch is answered with the refusal)."""
        key = (batch.topic, batch.handle.partition)
        publisher = self._publishers.get(key)
        if publisher is not None:
            if self._served_by.get(key) is batch.handle:
                return publisher
            # the topic was deleted (and maybe created again): that ring's writer is gone
            self._drop_publisher(key[0], key[1], RuntimeError("the topic was deleted"))
        attaching = batch.attaching
        if attaching is not None and not attaching.answered:
            return None  # its attach is on its way
        batch.attaching = None
        if attaching is not None and key in attaching.errors:
            self._answer(batch, *attaching.errors[key])
            return None
        self._attach_missing([batch])  # none yet, or dropped since (a failed ring, a new session)
        return None

    def _publish(self, batch: _Batch) -> None:
        """Publish into the ring now if there is room; else leave it for a later poll."""
        if batch.published or batch.done:
            return
        publisher = self._publisher(batch)
        if publisher is None:
            return
        if len(batch.records) > publisher.max_body_bytes:
            self._answer(
                batch,
                ErrorCode.MESSAGE_TOO_LARGE,
                f"batch of {len(batch.records)} bytes, a ring frame holds {publisher.max_body_bytes}",
            )
            return
        key = (batch.topic, batch.handle.partition)
        self._last_used_ms[key] = time.monotonic() * 1000
        self._unused.discard(key)
        try:
            publisher.publish(batch.records, batch, timeout_ms=0)
        except BackPressureError:
            return  # the ring is full (or moving to a larger one): a later poll tries again
        except RingFailedError as e:
            self._drop_publisher(batch.topic, batch.handle.partition, e)
            self._answer(batch, ErrorCode.NOT_LEADER_OR_FOLLOWER, str(e))
            return
        batch.published = True

    def _drop_publisher(self, topic: str, partition: int, why: Exception | str, *,
                        detach: bool = True) -> None:
        """Unmap the ring of ``topic``-``partition`` and (``detach``) have the supervisor unlink it; its
        unanswered batches get NOT_LEADER_OR_FOLLOWER.  ``why`` as a string: a routine release (idle,
        deleted), logged at debug level."""
        key = (topic, partition)
        publisher = self._publishers.pop(key, None)
        self._served_by.pop(key, None)
        self._last_used_ms.pop(key, None)
        self._unused.discard(key)
        if publisher is None:
            return
        if isinstance(why, str):
            log.debug("produce to %s-%d: letting go of ring %s: %s", topic, partition, publisher.name, why)
        else:
            log.warning("produce to %s-%d: dropping ring %s: %s", topic, partition, publisher.name, why)
        for batch in publisher.abandon_in_flight():
            self._answer(batch, ErrorCode.NOT_LEADER_OR_FOLLOWER, "the partition's writer failed the ring")
        name = publisher.name
        publisher.close()
        if detach:
            self.ctx.cluster.detach_later([name])

    @staticmethod
    def _answer(batch: _Batch, code: int, message: str | None = None) -> None:
        batch.answer.error_code = code
        batch.answer.error_message = message
        batch.answer.base_offset = -1
        batch.acked = batch.done = True

    # -- progress -----------------------------------------------------------------------------------------

    def poll(self, now_ms: float) -> list[tuple[object, RequestHeader, ProduceResponse | None]]:
        """Use the attach answers that came, read acks, publish batches that waited for their ring or for
        ring space, and return the requests now answered."""
        self._check_session()
        if self._answered:
            self._settle()
        if self._attaching:
            for attaching in {id(a): a for a in self._attaching.values()}.values():
                if now_ms >= attaching.deadline_ms:
                    self._abandon(attaching)
        if self.ctx.replication is not None:
            for token, code in self.ctx.replication.take_completed():
                batch = token
                if not isinstance(batch, _Batch) or batch.done:
                    continue  # answered meanwhile (its request timed out)
                if code != ErrorCode.NONE:
                    self._answer(batch, code, _COMMIT_ERRORS.get(code))
                batch.done = True
        for key, publisher in list(self._publishers.items()):
            if not publisher.in_flight and not publisher.completed:
                continue
            try:
                publisher.poll()
            except (RingFailedError, CorruptRecordError) as e:
                self._drop_publisher(key[0], key[1], e)
                continue
            for batch, result in publisher.take_completed():
                batch.acked = True
                if result < 0:
                    self._answer(batch, -result, _WRITER_ERRORS.get(-result))
                else:
                    batch.answer.base_offset = result
                    if batch.log_append_time:  # Kafka answers the time it stamped (append_time.py)
                        batch.answer.log_append_time_ms = stamped_append_time(batch.handle, result)
        finished = []
        still = []
        for held in self._held:
            if self._progress(held, now_ms):
                finished.append((held.owner, held.header, None if held.acks == 0 else self._response(held)))
            else:
                still.append(held)
        self._held = still
        return finished

    def _progress(self, held: _Held, now_ms: float) -> bool:
        """Advance one held request; True once every batch has its final answer."""
        complete = True
        for batch in held.batches:
            if batch.done:
                continue
            if batch.handle.closed and not batch.acked:  # the topic was deleted meanwhile
                self._answer(batch, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "the topic was deleted")
                continue
            if not batch.published:
                self._publish(batch)
                attaching = batch.attaching
                if not batch.done and attaching is not None and not attaching.answered:
                    if attaching.abandoned or now_ms >= held.deadline_ms:
                        self._answer(batch, ErrorCode.REQUEST_TIMED_OUT, (
                            f"produce to {batch.topic}-{batch.handle.partition}: the supervisor did not hand "
                            "over the partition's ring in time; nothing was appended: retry"))
                        continue
                    complete = False
                    continue
            if batch.acked and not batch.done and not batch.committing:
                last_offset = batch.answer.base_offset + batch.last_offset_delta
                if held.acks != -1 or batch.handle.closed:
                    batch.done = True
                    continue
                replication = self.ctx.replication
                if replication is not None and replication.await_commit(
                    batch.handle, batch, last_offset=last_offset,
                    deadline_ms=held.deadline_ms - time.monotonic() * 1000 + monotonic_ms(),
                ):
                    batch.committing = True  # answered through take_completed
                elif batch.handle.high_watermark > last_offset:
                    batch.done = True
                    continue
            if held.acks == 0 and batch.published:
                batch.done = True  # nobody waits for its ack
                continue
            if now_ms >= held.deadline_ms:
                self._answer(
                    batch,
                    ErrorCode.REQUEST_TIMED_OUT,
                    "no acknowledgement in time; the batch may still be appended",
                )
                continue
            complete = False
        return complete

    # -- letting go of idle rings ----------------------------------------------------------------------------

    def next_timer_ms(self) -> float | None:
        """When :meth:`tick` next has work (monotonic ms, as ``time.monotonic() * 1000``); None: no ring
        is held, no timer."""
        return self._next_check_ms

    def tick(self, now_ms: float) -> None:
        """Let go of the rings of deleted partitions and of those idle for ``appliance.ring.idle.ms``
        (nothing in flight, no batch published meanwhile); plan the next look.  Cheap when not due."""
        if self._next_check_ms is None or now_ms < self._next_check_ms:
            return
        self._check_session()
        busy = {b.handle for held in self._held for b in held.batches if not b.done}
        next_ms: float | None = None
        idle: list[str] = []
        for key, publisher in list(self._publishers.items()):
            handle = self._served_by.get(key)
            if handle is None or handle.closed:
                self._drop_publisher(*key, "its partition was deleted", detach=False)
                continue
            due_ms = self._last_used_ms.get(key, now_ms) + self._idle_ms
            if now_ms >= due_ms and not publisher.in_flight and not publisher.completed \
                    and not publisher.growing and handle not in busy:
                idle.append(publisher.name)
                self._drop_publisher(*key, f"no produce traffic for {self._idle_ms:.0f} ms", detach=False)
                continue
            due_ms = max(due_ms, now_ms + 1)
            next_ms = due_ms if next_ms is None else min(next_ms, due_ms)
        # a little late, so that rings falling idle one after another go in one detach_many
        slack_ms = min(IDLE_CHECK_SLACK_MS, self._idle_ms / 4)
        self._next_check_ms = None if next_ms is None else next_ms + slack_ms
        if idle:  # one request for all of them, not waited for
            self.ctx.cluster.detach_later(idle)

    def _response(self, held: _Held) -> ProduceResponse:
        return ProduceResponse(
            responses=[
                TopicProduceResponse(name=name, partition_responses=answers) for name, answers in held.answers
            ]
        )

    def close(self) -> None:
        for publisher in self._publishers.values():
            publisher.close()
        self._publishers.clear()
        self._served_by.clear()
        self._last_used_ms.clear()
        self._unused.clear()
        self._next_check_ms = None
        self._attaching.clear()
        self._answered.clear()
