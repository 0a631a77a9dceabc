"""The durable side of committed offsets: the compacted internal topic ``__consumer_offsets``.

Theory of operation
-------------------
**The topic.**  As in Kafka, ``__consumer_offsets`` is created on first use: the first group request
(FindCoordinator, usually) has the supervisor record it, and until it is recorded FindCoordinator answers
COORDINATOR_NOT_AVAILABLE and the other group requests COORDINATOR_LOAD_IN_PROGRESS (both retriable; a
failed creation is tried again by the next request, at most once per :data:`RETRY_S`).  A broker that
starts with the topic there loads it at once.  The topic has ``offsets.topic.num.partitions`` partitions,
``cleanup.policy=compact``, ``segment.bytes`` from ``offsets.topic.segment.bytes``, replication
``offsets.topic.replication.factor`` capped at the replicas that exist (this node and one per
``appliance.replica.dirs``).  It goes through the control protocol's ``create_topic`` with ``internal``
set, the one path allowed a name beginning with ``__``.  A topic that exists keeps its partition count: a
group's partition depends on it.

**Writing.**  An OffsetCommit the coordinator accepts (``GroupCoordinator.plan_commit``) becomes one record
batch of Kafka's records (``appliance.coordinator.offset_records``), one record per partition committed,
to the group's partition of the topic.  It is handed to the broker's own Produce path
(``appliance.broker.produce``: validated, published into the partition writer's ring, acknowledged by the
writer, for ``acks=-1`` also by the in-sync replicas) with this module's :class:`CommitInFlight` as the
owner.  The OffsetCommit's connection is parked meanwhile; when the Produce path finishes the batch, the
broker hands the outcome to :meth:`OffsetsTopic.appended`: on success the commit is applied to the
coordinator's offsets and answered NONE; on failure nothing is applied and the accepted partitions get
Kafka's answer for the append's error (:data:`APPEND_ERRORS`).  So an OffsetCommit answered NONE is in the
log: a restart, or a SIGKILL of every process, keeps it.

**Loading.**  Until a partition of the topic is loaded, every group request for a group of that partition
is answered COORDINATOR_LOAD_IN_PROGRESS (clients retry).  On the broker's timer (:meth:`OffsetsTopic.tick`)
each partition not loaded yet is read from its log start to its log end through the broker's own read
handle (``storage.log_reader``) and its records applied in offset order: the latest record of a key wins,
a tombstone deletes, records of another kind (group metadata) are skipped.  The log end, not the high
watermark: every acknowledged commit is below the high watermark, and a high watermark not yet advanced
by the followers after a restart must not hide one; a commit appended and never acknowledged may be
loaded too (its client retries it, and the same commit again changes nothing).  A partition whose read
handle cannot be opened yet (its writer is starting) is tried again at the next tick.
"""

from __future__ import annotations

import logging
import time
from typing import Any, NamedTuple

from appliance.broker.cluster import ClusterError
from appliance.broker.handlers import BrokerContext
from appliance.broker.produce import ProduceService
from appliance.coordinator import CommittedOffset, GroupCoordinator
from appliance.coordinator.coordinator import CommitPlan
from appliance.coordinator.offset_records import (
    OFFSETS_TOPIC,
    OffsetKey,
    OffsetValue,
    decode_key,
    decode_value,
    encode_key,
    encode_value,
    partition_for,
)
from ipc.kafka import (
    ApiKey,
    ErrorCode,
    OffsetCommitResponse,
    PartitionProduceData,
    ProduceRequest,
    ProduceResponse,
    RequestHeader,
    TopicProduceData,
)
from storage.batch_builder import build_batch
from storage.batch_reader import iter_records
from storage.errors import ApplianceError

__all__ = ["APPEND_ERRORS", "CommitInFlight", "OffsetsTopic"]

log = logging.getLogger("appliance.broker")

RETRY_S = 1.0  # creating the topic again after a failure
LOAD_RETRY_S = 0.1  # opening a partition that could not be read yet
_PRODUCE_HEADER = RequestHeader(ApiKey.PRODUCE, 8, 0, "__group_coordinator")

# Kafka's answer to an OffsetCommit whose append failed (GroupMetadataManager): the append's error -> the
# commit's.  Any other error is UNKNOWN_SERVER_ERROR.
APPEND_ERRORS = {
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_ENOUGH_REPLICAS: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.REQUEST_TIMED_OUT: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_LEADER_OR_FOLLOWER: ErrorCode.NOT_COORDINATOR,
    ErrorCode.KAFKA_STORAGE_ERROR: ErrorCode.NOT_COORDINATOR,
    ErrorCode.MESSAGE_TOO_LARGE: ErrorCode.INVALID_COMMIT_OFFSET_SIZE,
    ErrorCode.RECORD_LIST_TOO_LARGE: ErrorCode.INVALID_COMMIT_OFFSET_SIZE,
}


class CommitInFlight(NamedTuple):
    """The owner of the coordinator's Produce: the parked OffsetCommit's slot and header, and its plan."""

    slot: Any
    header: RequestHeader
    plan: CommitPlan


class LoadedRecords(NamedTuple):
    records: int
    skipped: int


class OffsetsTopic:
    """``__consumer_offsets`` for this broker's coordinator (module docstring)."""

    def __init__(self, ctx: BrokerContext, coordinator: GroupCoordinator, produce: ProduceService) -> None:
        self.ctx = ctx
        self.coordinator = coordinator
        self.produce = produce
        config = ctx.config
        self.partitions = config.offsets_topic_num_partitions
        self.created = False
        self.wanted = False  # a group request came: create the topic (until it is there)
        self.loaded: set[int] = set()
        self._next_try_s = 0.0

    def start(self) -> None:
        """At the broker's start: load the topic if it exists (it is created on first use)."""
        meta = self.ctx.table.topics.get(OFFSETS_TOPIC)
        if meta is not None:
            self.partitions = meta.partitions
            self.created = True
            self.tick()

    def want(self) -> bool:
        """A group request needs the topic: create it if it is not there (now, or at most once per
        :data:`RETRY_S`); whether it is there."""
        self.wanted = True
        if not self.created:
            self.tick()
        return self.created

    # -- the topic ----------------------------------------------------------------------------------------

    def _replication_factor(self) -> int:
        config = self.ctx.config
        exist = 1 + len(config.replica_dirs)
        return max(1, min(config.offsets_topic_replication_factor, exist))

    def _ensure(self) -> None:
        """Find the topic in the broker's picture or have the supervisor record it; ``created`` once found."""
        meta = self.ctx.table.topics.get(OFFSETS_TOPIC)
        if meta is None:
            config = self.ctx.config
            configs: dict[str, Any] = {"cleanup.policy": "compact",
                                       "segment.bytes": config.offsets_topic_segment_bytes}
            try:
                self.ctx.cluster.create_topic(OFFSETS_TOPIC, self.partitions, self._replication_factor(),
                                              configs, timeout_ms=0, internal=True)
                log.info("created %s: %d partitions, cleanup.policy=compact", OFFSETS_TOPIC, self.partitions)
            except ClusterError as e:
                if e.code != ErrorCode.TOPIC_ALREADY_EXISTS:
                    log.warning("cannot create %s yet (retrying in %.0f s): %s", OFFSETS_TOPIC, RETRY_S, e)
                    return
            self.ctx.reload_topics()
            meta = self.ctx.table.topics.get(OFFSETS_TOPIC)
            if meta is None:
                return
        self.partitions = meta.partitions
        self.created = True

    # -- loading ------------------------------------------------------------------------------------------

    def tick(self, now_s: float | None = None) -> None:
        """Create the topic and load the partitions not loaded yet, when due."""
        now_s = time.monotonic() if now_s is None else now_s
        if now_s < self._next_try_s or self.fully_loaded or not (self.created or self.wanted):
            return
        if not self.created:
            self._ensure()
            if not self.created:
                self._next_try_s = now_s + RETRY_S
                return
        for partition in range(self.partitions):
            if partition not in self.loaded:
                self._load(partition)
        self._next_try_s = now_s + LOAD_RETRY_S

    @property
    def fully_loaded(self) -> bool:
        return self.created and len(self.loaded) == self.partitions

    def next_timer_s(self) -> float | None:
        """When :meth:`tick` has work (``time.monotonic`` seconds), None once every partition is loaded."""
        return None if self.fully_loaded or not (self.created or self.wanted) else self._next_try_s

    def _load(self, partition: int) -> None:
        handle, _ = self.ctx.table.lookup(OFFSETS_TOPIC, partition)
        if handle is None:
            return
        name = f"{OFFSETS_TOPIC}-{partition}"
        try:
            found = self._apply_log(handle.reader, handle.log_start_offset, handle.log_end_offset, name)
        except (ApplianceError, OSError) as e:
            log.warning("%s: cannot load committed offsets yet (retrying): %s", name, e)
            return
        self.loaded.add(partition)
        log.info("%s: loaded %d commit records (%d of other kinds skipped)", name, found.records,
                 found.skipped)

    def _apply_log(self, reader: Any, start: int, end: int, name: str) -> LoadedRecords:
        count = skipped = 0
        if start >= end:
            return LoadedRecords(0, 0)
        for batch in reader.batches(start, max_offset=end):
            for record in iter_records(batch, where=name):
                if record.offset >= end:
                    break
                applied = record.key is not None and self._apply_record(record.key, record.value, name,
                                                                         record.offset)
                count += applied
                skipped += not applied
        return LoadedRecords(count, skipped)

    def _apply_record(self, key_bytes: bytes, value_bytes: bytes | None, name: str, offset: int) -> bool:
        try:
            key = decode_key(key_bytes)
            if key is None:
                return False
            value = None if value_bytes is None else decode_value(value_bytes)
        except ValueError as e:  # malformed bytes, invalid UTF-8 included (the primitives check it)
            log.error("%s offset %d: skipping a malformed record: %s", name, offset, e)
            return False
        entry = None if value is None else CommittedOffset(value.offset, value.leader_epoch, value.metadata,
                                                            value.commit_timestamp_ms)
        self.coordinator.offsets.put(key.group, key.topic, key.partition, entry)
        return True

    def loading_error(self, group_id: str) -> ErrorCode | None:
        """COORDINATOR_LOAD_IN_PROGRESS while the group's partition is not loaded, else None."""
        if self.fully_loaded:
            return None
        if not self.created or partition_for(group_id, self.partitions) not in self.loaded:
            return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        return None

    # -- writing ------------------------------------------------------------------------------------------

    def append(self, slot: Any, header: RequestHeader, plan: CommitPlan) -> OffsetCommitResponse | None:
        """Write the accepted part of ``plan``: its answer now (nothing to write, or the Produce path
        refused at once), or None: answered through :meth:`appended` when the Produce path finishes."""
        if not plan.accepted:
            return plan.response
        keys = [encode_key(OffsetKey(plan.group_id, t, p)) for t, p, _ in plan.accepted]
        values: list[bytes | None] = [
            encode_value(OffsetValue(e.offset, e.leader_epoch, e.metadata, e.commit_timestamp_ms))
            for _, _, e in plan.accepted
        ]
        batch = build_batch(values, keys, timestamp_ms=plan.accepted[0][2].commit_timestamp_ms)
        partition = partition_for(plan.group_id, self.partitions)
        data = [TopicProduceData(OFFSETS_TOPIC, [PartitionProduceData(partition, batch)])]
        request = ProduceRequest(transactional_id=None, acks=-1,
                                 timeout_ms=self.ctx.config.offsets_commit_timeout_ms, topic_data=data)
        owner = CommitInFlight(slot, header, plan)
        outcome = self.produce.start(owner, _PRODUCE_HEADER, request, internal=True)
        if outcome.response is not None:
            return self.appended(owner, outcome.response)
        return None

    def appended(self, owner: CommitInFlight, produced: ProduceResponse | None) -> OffsetCommitResponse:
        """The Produce path finished ``owner``'s batch: apply the commit and answer it, or answer the
        accepted partitions with Kafka's error for the failed append (nothing applied)."""
        plan = owner.plan
        code = ErrorCode.UNKNOWN_SERVER_ERROR
        message = "no answer from the Produce path"
        if produced is not None:
            answer = produced.responses[0].partition_responses[0]
            code, message = ErrorCode(answer.error_code), answer.error_message or ""
        if code == ErrorCode.NONE:
            self.coordinator.apply(plan)
            return plan.response
        error = APPEND_ERRORS.get(code, ErrorCode.UNKNOWN_SERVER_ERROR)
        log.warning("OffsetCommit of group %r: the append to %s-%d failed (%s: %s): answered %s, nothing "
                    "stored", plan.group_id, OFFSETS_TOPIC, partition_for(plan.group_id, self.partitions),
                    code.name, message, error.name)
        accepted = {(t, p) for t, p, _ in plan.accepted}
        for topic in plan.response.topics:
            for part in topic.partitions:
                if (topic.name, part.partition_index) in accepted:
                    part.error_code = error
        return plan.response
