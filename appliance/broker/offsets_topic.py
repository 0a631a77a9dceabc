"""The durable side of committed offsets: the compacted internal topic ``__consumer_offsets``.

Theory of operation
-------------------
**The topic.** As in Kafka, ``__consumer_offsets`` is created on first use: the first group request
(FindCoordinator, usually) has the supervisor record it, and until it is recorded FindCoordinator answers
COORDINATOR_NOT_AVAILABLE and the other group requests COORDINATOR_LOAD_IN_PROGRESS (both retriable; a failed
creation is tried again by the next request, at most once per :data:`RETRY_S`). A broker that starts with the
topic there loads it at once. The topic has ``offsets.topic.num.partitions`` partitions,
``cleanup.policy=compact``, ``segment.bytes`` from ``offsets.topic.segment.bytes``, replication
``offsets.topic.replication.factor`` capped at the replicas that exist (this node and one per
``appliance.replica.dirs``). It goes through the control protocol's ``create_topic`` with ``internal`` set,
the one path allowed a name beginning with ``__``. The creation is sent over the control connection that never
waits (``appliance.broker.control_channel``) and its answer, which describes the topic, is taken by
:meth:`OffsetsTopic.tick`: the broker serves its other clients while the supervisor records it. A topic that
exists keeps its partition count: a group's partition depends on it.

**Writing.**  An OffsetCommit the coordinator accepts (``GroupCoordinator.plan_commit``) becomes one record
batch of Kafka's records (``appliance.coordinator.offset_records``), one record per partition committed,
to the group's partition of the topic.  It is handed to the broker's own Produce path
(``appliance.broker.produce``: validated, published into the partition writer's ring, acknowledged by the
writer, for ``acks=-1`` also by the in-sync replicas) with this module's :class:`GroupWrite` as the
owner.  The OffsetCommit's connection is parked meanwhile; when the Produce path finishes the batch, the
broker hands the outcome to :meth:`OffsetsTopic.appended`: on success the commit is applied to the
coordinator's offsets and answered NONE; on failure nothing is applied and the accepted partitions get
Kafka's answer for the append's error (:data:`APPEND_ERRORS`).  So an OffsetCommit answered NONE is in the
log: a restart, or a SIGKILL of every process, keeps it.

**Group metadata.** After each coordinator call that completed a rebalance, emptied a group or replaced a
static member, the group's record (``appliance.coordinator.group_records``) is written the same way, and the
answers that call released are held until it is acknowledged (:class:`MetadataInFlight`). A completed
rebalance's SyncGroups are held by the group itself, which stays CompletingRebalance until then, as Kafka's
does: an acknowledged record makes it Stable and answers them (``GroupCoordinator.confirm``); a failed append
answers them with its error (the members join again: the group starts another rebalance, its assignments
dropped, as Kafka's SyncGroup store callback does) and undoes a static member's replacement, whose JoinGroup
gets that error (``GroupCoordinator.undo``). A group metadata append's error becomes Kafka's answer for it
(``storeGroup``'s, :data:`STORE_GROUP_ERRORS`), not the OffsetCommit's. The test fault point ``group.store``
(``appliance.server.faults``) refuses the next group metadata append(s) as the Produce path refuses one
without enough in-sync replicas (NOT_ENOUGH_REPLICAS).

**Retention.** ``offsets.retention.minutes`` expiry, or a commit's own expire timestamp (an OffsetCommit v2-v4
``retention_time_ms``, kept in the record as Kafka keeps it: value version 1), checked every
``offsets.retention.check.interval.ms`` (``GroupCoordinator.plan_expiry``) writes offset tombstones (and the
group's, when an Empty group goes with them) and applies them once acknowledged; no request waits for it. A
partition whose commit is being written is left to the next check.

**Deleting.**  DeleteGroups and OffsetDelete are written the same way, as tombstones (a key with a null
value) of the offsets they delete, and answered once acknowledged; at load a tombstone deletes, so a
deletion survives a restart.  A DeleteGroups whose groups live in several partitions of the topic writes
one batch to each and is answered when the last is finished; a group whose batch failed gets Kafka's error
for the append and stays as it was (``GroupCoordinator.finish_delete``).

**Loading.**  Until a partition of the topic is loaded, every group request for a group of that partition
is answered COORDINATOR_LOAD_IN_PROGRESS (clients retry).  On the broker's timer (:meth:`OffsetsTopic.tick`)
each partition not loaded yet is read from its log start to its log end through the broker's own read
handle (``storage.log_reader``) and its records applied in offset order: the latest record of a key wins,
a tombstone deletes; a group metadata record restores the group (``GroupCoordinator.load_group``: its
generation and members, their sessions starting again), records of another kind are skipped.  The log
end, not the high watermark: every acknowledged commit is below the high watermark, and a high watermark
not yet advanced by the followers after a restart must not hide one; a commit appended and never
acknowledged may be loaded too (its client retries it, and the same commit again changes nothing).  A
partition whose read handle cannot be opened yet (its writer is starting) is tried again at the next tick.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from appliance.broker.cluster import TopicChange
from appliance.broker.handlers import BrokerContext
from appliance.broker.partitions import TopicMeta
from appliance.broker.produce import ProduceService
from appliance.coordinator import CommittedOffset, GroupCoordinator
from appliance.coordinator.coordinator import CommitPlan, GroupDeletion, OffsetDeletion, OffsetExpiry
from appliance.coordinator.group import Unconfirmed
from appliance.coordinator.group_records import (
    GroupMetadata,
    decode_group_key,
    decode_group_value,
    encode_group_key,
    encode_group_value,
)
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
from appliance.server.faults import ControlFaults
from ipc.kafka import (
    ApiKey,
    DeletableGroupResult,
    DeleteGroupsResponse,
    ErrorCode,
    OffsetCommitResponse,
    PartitionProduceData,
    PartitionProduceResponse,
    ProduceRequest,
    ProduceResponse,
    RequestHeader,
    TopicProduceData,
    TopicProduceResponse,
)
from storage.batch_builder import build_batch
from storage.batch_reader import iter_records
from storage.errors import ApplianceError

__all__ = ["APPEND_ERRORS", "STORE_GROUP_ERRORS", "Answer", "DeletionInFlight", "GroupWrite",
           "MetadataInFlight", "OffsetsTopic"]

Answer = tuple[Any, Any, Any]  # (the slot, the request's RequestHeader, the response body)

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

# Kafka's answer to a request whose group metadata append failed (GroupMetadataManager.storeGroup): the
# append's error -> the answer's.  Any other error is answered as it is.
STORE_GROUP_ERRORS = {
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_ENOUGH_REPLICAS: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_LEADER_OR_FOLLOWER: ErrorCode.NOT_COORDINATOR,
    ErrorCode.KAFKA_STORAGE_ERROR: ErrorCode.NOT_COORDINATOR,
    ErrorCode.REQUEST_TIMED_OUT: ErrorCode.REBALANCE_IN_PROGRESS,
    ErrorCode.MESSAGE_TOO_LARGE: ErrorCode.UNKNOWN_SERVER_ERROR,
    ErrorCode.RECORD_LIST_TOO_LARGE: ErrorCode.UNKNOWN_SERVER_ERROR,
    ErrorCode.INVALID_FETCH_SIZE: ErrorCode.UNKNOWN_SERVER_ERROR,
}


class GroupWrite(NamedTuple):
    """The owner of one of the coordinator's Produce requests: the parked request's slot and header, what
    it writes for (a CommitPlan, an OffsetDeletion, or a DeletionInFlight) and the partition written."""

    slot: Any  # None for group metadata: its job holds the answers
    header: RequestHeader | None
    plan: Any
    partition: int


class LoadedRecords(NamedTuple):
    records: int
    skipped: int


class OffsetsTopic:
    """``__consumer_offsets`` for this broker's coordinator (module docstring)."""

    def __init__(self, ctx: BrokerContext, coordinator: GroupCoordinator, produce: ProduceService,
                 clock_ms: Callable[[], int]) -> None:
        self.ctx = ctx
        self._clock_ms = clock_ms  # the coordinator's clock: loaded members' sessions start again
        self.coordinator = coordinator
        self.produce = produce
        config = ctx.config
        self.partitions = config.offsets_topic_num_partitions
        self.created = False
        self.wanted = False  # a group request came: create the topic (until it is there)
        self.loaded: set[int] = set()
        self._next_try_s = 0.0
        self._creating: TopicChange | None = None  # the creation submitted, until its answer is taken
        self._faults = ControlFaults(point for point in config.test_faults
                                     if point.partition(":")[0] == "group.store")

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
        """Find the topic in the broker's picture, or have the supervisor record it: ``created`` once found.

        The creation goes over the control connection that never waits (``Cluster.submit``); its answer,
        read by the broker's loop, describes the topic, which the broker takes into its picture.  The loop
        serves every other client meanwhile (a supervisor busy starting writers may take seconds)."""
        meta = self.ctx.table.topics.get(OFFSETS_TOPIC)
        if meta is None:
            meta = self._created()
            if meta is None:
                return
        self.partitions = meta.partitions
        self.created = True

    def _created(self) -> TopicMeta | None:
        """Submit the creation if none is in flight, else take its answer: the topic once recorded."""
        change = self._creating
        if change is None:
            config = self.ctx.config
            configs: dict[str, Any] = {"cleanup.policy": "compact",
                                       "segment.bytes": config.offsets_topic_segment_bytes}
            change = self._creating = TopicChange(
                "create", OFFSETS_TOPIC, 0, partitions=self.partitions,
                replication_factor=self._replication_factor(), configs=configs, internal=True)
            self.ctx.cluster.submit(change)
        if not change.done:
            return None
        self._creating = None
        if change.error is not None and change.error.code != ErrorCode.TOPIC_ALREADY_EXISTS:
            log.warning("cannot create %s yet (retrying in %.0f s): %s", OFFSETS_TOPIC, RETRY_S, change.error)
            return None
        if change.error is None and change.topic is not None:
            log.info("created %s: %d partitions, cleanup.policy=compact", OFFSETS_TOPIC,
                     change.topic.partitions)
            self.ctx.add_topic(change.topic)
        else:  # there already (created by an earlier broker process), or an answer without the topic
            self.ctx.reload_topics()
        return self.ctx.table.topics.get(OFFSETS_TOPIC)

    # -- loading ------------------------------------------------------------------------------------------

    def tick(self, now_s: float | None = None) -> None:
        """Create the topic and load the partitions not loaded yet, when due."""
        now_s = time.monotonic() if now_s is None else now_s
        if now_s < self._next_try_s or self.fully_loaded or not (self.created or self.wanted):
            return
        if not self.created:
            self._ensure()
            if not self.created:  # a creation in flight is looked at again soon; a failed one retried later
                self._next_try_s = now_s + (LOAD_RETRY_S if self._creating is not None else RETRY_S)
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
        log.info("%s: loaded %d records (commits and group metadata; %d of other kinds skipped)", name,
                 found.records, found.skipped)

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
                group_id = decode_group_key(key_bytes)
                if group_id is None:
                    return False
                record = None if value_bytes is None else decode_group_value(value_bytes)
                self.coordinator.load_group(group_id, record, self._clock_ms())
                return True
            value = None if value_bytes is None else decode_value(value_bytes)
        except ValueError as e:  # malformed bytes, invalid UTF-8 included (the primitives check it)
            log.error("%s offset %d: skipping a malformed record: %s", name, offset, e)
            return False
        entry = None if value is None else CommittedOffset(value.offset, value.leader_epoch, value.metadata,
                                                            value.commit_timestamp_ms,
                                                            value.expire_timestamp_ms)
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

    def _write(self, owner: GroupWrite, records: list[tuple[bytes, bytes | None]],
               timestamp_ms: int) -> ProduceResponse | None:
        """Hand one batch of ``records`` (key, value or None) for ``owner.partition`` to the Produce path:
        its answer now (refused at once), or None (:meth:`appended` gets it later)."""
        keys = [k for k, _ in records]
        values = [v for _, v in records]
        batch = build_batch(values, keys, timestamp_ms=timestamp_ms)
        data = [TopicProduceData(OFFSETS_TOPIC, [PartitionProduceData(owner.partition, batch)])]
        request = ProduceRequest(transactional_id=None, acks=-1,
                                 timeout_ms=self.ctx.config.offsets_commit_timeout_ms, topic_data=data)
        return self.produce.start(owner, _PRODUCE_HEADER, request, internal=True).response

    def _start(self, owner: GroupWrite, records: list[tuple[bytes, bytes | None]], timestamp_ms: int) -> Any:
        produced = self._write(owner, records, timestamp_ms)
        return None if produced is None else self._finish(owner, produced)

    def append(self, slot: Any, header: RequestHeader, plan: CommitPlan) -> OffsetCommitResponse | None:
        """Write the accepted part of an OffsetCommit: its answer now (nothing to write, or the Produce path
        refused at once), or None: answered through :meth:`appended` when the Produce path finishes."""
        if not plan.accepted:
            return plan.response
        records: list[tuple[bytes, bytes | None]] = [
            (encode_key(OffsetKey(plan.group_id, t, p)),
             encode_value(OffsetValue(e.offset, e.leader_epoch, e.metadata, e.commit_timestamp_ms,
                                      e.expire_timestamp_ms)))
            for t, p, e in plan.accepted
        ]
        owner = GroupWrite(slot, header, plan, partition_for(plan.group_id, self.partitions))
        # the batch's time is the broker's, as Kafka's: a v1 commit's own timestamp may be any time
        answer: OffsetCommitResponse | None = self._start(owner, records, int(time.time() * 1000))
        return answer

    def delete_offsets(self, slot: Any, header: RequestHeader, plan: OffsetDeletion) -> Any:
        """Write an OffsetDelete's tombstones: its answer now, or None (answered through :meth:`appended`)."""
        if not plan.tombstones:
            return plan.response
        records: list[tuple[bytes, bytes | None]] = [
            (encode_key(OffsetKey(plan.group_id, t, p)), None) for t, p in plan.tombstones]
        owner = GroupWrite(slot, header, plan, partition_for(plan.group_id, self.partitions))
        return self._start(owner, records, int(time.time() * 1000))

    def delete_groups(self, slot: Any, header: RequestHeader, plan: GroupDeletion) -> Any:
        """Write the tombstones of every group a DeleteGroups deletes (its offsets and its group metadata),
        one batch per partition of the topic: its answer now (every append refused at once, or no group to
        delete), or None (answered through :meth:`appended` when the last append finishes)."""
        if not plan.deleting:
            return _deleted(plan)
        job = DeletionInFlight(plan, {})
        for group_id in plan.deleting:
            job.groups.setdefault(partition_for(group_id, self.partitions), []).append(group_id)
        answer = None
        for partition, group_ids in list(job.groups.items()):
            records: list[tuple[bytes, bytes | None]] = [
                (encode_key(OffsetKey(g, t, p)), None) for g in group_ids for t, p in plan.deleting[g]]
            records += [(encode_group_key(g), None) for g in group_ids]
            produced = self._write(GroupWrite(slot, header, job, partition), records, int(time.time() * 1000))
            if produced is not None:
                answer = self._finish(GroupWrite(slot, header, job, partition), produced)
        return answer  # the response once the last batch is finished here, else None

    def write_metadata(self, records: list[tuple[str, GroupMetadata]], answers: list[Answer],
                       unconfirmed: list[Unconfirmed] | None = None) -> list[Answer]:
        """Write group metadata records, one batch per partition, and hold ``answers`` (those of the call
        that made them due) until all are written: the answers to give now (None left to write, or every
        append refused at once).  ``unconfirmed``: what these records record, confirmed once written
        (``GroupCoordinator.confirm``: a completed rebalance's SyncGroups are answered, as Kafka answers
        them once the group is stored) or undone if not (``GroupCoordinator.undo``)."""
        if not records:
            return answers
        job = MetadataInFlight(answers, {}, list(unconfirmed or []))
        for group_id, record in records:
            job.groups.setdefault(partition_for(group_id, self.partitions), []).append((group_id, record))
        done: list[Answer] = []
        wall_ms = int(time.time() * 1000)
        for partition, group_records in list(job.groups.items()):
            batch: list[tuple[bytes, bytes | None]] = [
                (encode_group_key(g), encode_group_value(r)) for g, r in group_records]
            owner = GroupWrite(None, None, job, partition)
            if self._faults.fires("group.store"):
                log.warning("test fault point group.store fired: %s-%d refused", OFFSETS_TOPIC,
                            partition)
                produced: ProduceResponse | None = _refused(partition, ErrorCode.NOT_ENOUGH_REPLICAS)
            else:
                produced = self._write(owner, batch, wall_ms)
            if produced is not None:
                done = self._finish(owner, produced)
        return [] if job.groups else done

    def expire(self, plans: list[OffsetExpiry]) -> None:
        """Write the tombstones of expired offsets (and of the groups that go with them), one batch per
        group; applied by :meth:`appended` once acknowledged."""
        wall_ms = int(time.time() * 1000)
        for plan in plans:
            records: list[tuple[bytes, bytes | None]] = [
                (encode_key(OffsetKey(plan.group_id, t, p)), None) for t, p in plan.tombstones]
            if plan.remove_group:
                records.append((encode_group_key(plan.group_id), None))
            log.info("group %r: %d committed offsets expired (offsets.retention.minutes)%s", plan.group_id,
                     len(plan.tombstones), "; the empty group goes too" if plan.remove_group else "")
            owner = GroupWrite(None, None, plan, partition_for(plan.group_id, self.partitions))
            produced = self._write(owner, records, wall_ms)
            if produced is not None:
                self._finish(owner, produced)

    def appended(self, owner: GroupWrite, produced: ProduceResponse | None) -> list[Answer]:
        """The Produce path finished ``owner``'s batch: the answers it releases (none while other batches
        of the same request are out, nor for the coordinator's own expiry).  A failed append changes
        nothing and is answered with Kafka's error for it."""
        finished = self._finish(owner, produced)
        if isinstance(owner.plan, MetadataInFlight):
            return list(finished)
        return [] if finished is None or owner.slot is None else [(owner.slot, owner.header, finished)]

    def _finish(self, owner: GroupWrite, produced: ProduceResponse | None) -> Any:
        code = ErrorCode.UNKNOWN_SERVER_ERROR
        message = "no answer from the Produce path"
        if produced is not None:
            answer = produced.responses[0].partition_responses[0]
            code, message = ErrorCode(answer.error_code), answer.error_message or ""
        error = ErrorCode.NONE
        if code != ErrorCode.NONE:
            error = APPEND_ERRORS.get(code, ErrorCode.UNKNOWN_SERVER_ERROR)
            if isinstance(owner.plan, MetadataInFlight):
                error = STORE_GROUP_ERRORS.get(code, code)
            log.warning("%s: the append to %s-%d failed (%s: %s): answered %s, nothing stored",
                        _what(owner.plan), OFFSETS_TOPIC, owner.partition, code.name, message, error.name)
        plan = owner.plan
        if isinstance(plan, CommitPlan):
            return self._finish_commit(plan, error)
        if isinstance(plan, OffsetDeletion):
            if error == ErrorCode.NONE:
                self.coordinator.apply_offset_delete(plan)
                return plan.response
            deleting = set(plan.tombstones)
            for topic in plan.response.topics:
                for part in topic.partitions:
                    if (topic.name, part.partition_index) in deleting:
                        part.error_code = error
            return plan.response
        if isinstance(plan, MetadataInFlight):
            self._settle(plan, owner.partition, error)
            return _metadata_written(plan, owner.partition)
        if isinstance(plan, OffsetExpiry):
            self.coordinator.finish_expiry(plan, written=error == ErrorCode.NONE)
            return None
        return self._finish_deletion(owner, error)

    def _settle(self, job: MetadataInFlight, partition: int, error: ErrorCode) -> None:
        """A group metadata batch is finished: confirm what its groups' records recorded
        (``GroupCoordinator.confirm``: a completed rebalance's SyncGroups are answered), or, if it failed,
        undo it (``GroupCoordinator.undo``: those SyncGroups are answered ``error``, a replaced static
        member's held JoinGroup answer becomes ``error``); the answers that gives go with the job's."""
        settled = {group_id for group_id, _ in job.groups.get(partition, [])}
        items = [u for u in job.unconfirmed if u.group_id in settled]
        if not items:
            return
        if error == ErrorCode.NONE:
            confirmed = self.coordinator.confirm(items, self._clock_ms())
            job.answers.extend((c.token[0], c.token[1], c.response) for c in confirmed)
            return
        changed = {id(c.token[0]): c for c in self.coordinator.undo(items, error, self._clock_ms())}
        held = {id(slot) for slot, _, _ in job.answers}
        job.answers[:] = [(slot, header, changed[id(slot)].response if id(slot) in changed else response)
                          for slot, header, response in job.answers]
        job.answers.extend((c.token[0], c.token[1], c.response)
                           for key, c in changed.items() if key not in held)

    def _finish_commit(self, plan: CommitPlan, error: ErrorCode) -> OffsetCommitResponse:
        if error == ErrorCode.NONE:
            self.coordinator.apply(plan)
            return plan.response
        self.coordinator.discard(plan)
        accepted = {(t, p) for t, p, _ in plan.accepted}
        for topic in plan.response.topics:
            for part in topic.partitions:
                if (topic.name, part.partition_index) in accepted:
                    part.error_code = error
        return plan.response

    def _finish_deletion(self, owner: GroupWrite, error: ErrorCode) -> DeleteGroupsResponse | None:
        job: DeletionInFlight = owner.plan
        for group_id in job.groups.pop(owner.partition, []):
            self.coordinator.finish_delete(group_id, written=error == ErrorCode.NONE)
            job.plan.results[group_id] = error
        return None if job.groups else _deleted(job.plan)


class MetadataInFlight(NamedTuple):
    """Group metadata records being written: the answers held until they are, the groups of each
    partition still being written, and what they record that a written record confirms and a failed
    write undoes."""

    answers: list[Answer]
    groups: dict[int, list[tuple[str, GroupMetadata]]]
    unconfirmed: list[Unconfirmed]


def _metadata_written(job: MetadataInFlight, partition: int) -> list[Answer]:
    """One partition's group metadata batch is finished (and settled): the held answers once every batch
    is."""
    job.groups.pop(partition, None)
    return [] if job.groups else job.answers


class DeletionInFlight(NamedTuple):
    """A DeleteGroups whose tombstones are being written: its plan and the groups of each partition still
    being written (its answer is given when none is left)."""

    plan: GroupDeletion
    groups: dict[int, list[str]]


def _refused(partition: int, code: ErrorCode) -> ProduceResponse:
    """The Produce path's answer to an append it refused with ``code``."""
    return ProduceResponse(responses=[TopicProduceResponse(OFFSETS_TOPIC, [PartitionProduceResponse(
        index=partition, error_code=code, base_offset=-1, error_message="test fault point")])])


def _deleted(plan: GroupDeletion) -> DeleteGroupsResponse:
    return DeleteGroupsResponse(results=[DeletableGroupResult(g, code) for g, code in plan.results.items()])


def _what(plan: Any) -> str:
    if isinstance(plan, MetadataInFlight):
        return f"group metadata of {sorted(g for gs in plan.groups.values() for g, _ in gs)}"
    if isinstance(plan, CommitPlan):
        return f"OffsetCommit of group {plan.group_id!r}"
    if isinstance(plan, OffsetDeletion):
        return f"OffsetDelete of group {plan.group_id!r}"
    if isinstance(plan, OffsetExpiry):
        return f"expiry of group {plan.group_id!r}'s offsets"
    return f"DeleteGroups of {sorted(plan.plan.deleting)}"
