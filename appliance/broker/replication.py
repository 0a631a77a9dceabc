"""The leader's replica-state owner: the broker keeps the ISR and the high watermark of replicated partitions.

Theory of operation
-------------------
Followers reach the leader only through the Kafka protocol, so the process that answers their fetches owns
what their fetches teach: :class:`LeaderReplication` keeps one :class:`~replicas.replica_state.
PartitionReplicaState` and one :class:`~replicas.acks.PendingAcks` per partition this broker leads whose
topic has a replication factor above 1 (a :class:`ReplicatedPartition`).  Partitions of factor 1 are not
here: their writer publishes HW = LEO itself (``WriterSpec.publish_high_watermark``).

**What the broker calls** (one thread, the broker loop; ``now_ms`` is :func:`ipc.state_page.monotonic_ms`):

* :meth:`LeaderReplication.sync` after every metadata reload: states for new replicated partitions, none
  for partitions gone, and each kept one's ``min.insync.replicas`` as the topic now has it (AlterConfigs);
* :meth:`FollowerLink.fetched` for each partition of a follower Fetch, before reading: KIP-320 fencing
  (``check_current_leader_epoch``), then ``follower_fetched`` (the follower's LEO, the ISR, the HW);
  errors are answered per partition (NOT_LEADER_OR_FOLLOWER, OFFSET_OUT_OF_RANGE, FENCED_LEADER_EPOCH...);
* :meth:`FollowerLink.answered` once a follower's partition was read: which HW that answer carries;
* :meth:`LeaderReplication.tick` every turn of the broker loop: the LEO in the state page moved (with an
  ISR of one the HW follows it only here), the ISR shrinks on a timer (every :data:`SHRINK_CHECKS_PER_LAG`
  -th of ``replica.lag.time.max.ms``), acks=all waiters expire, the HW is checkpointed.  The loop turns when
  a writer's round wakes it (a new LEO), when a follower fetches, and by :meth:`next_timer_ms` (the next ISR
  check); acks=all waiters hold a Produce request, which keeps the loop polling until they are answered;
* :meth:`LeaderReplication.append_error` before an acks=all Produce is handed to the writer, and
  :meth:`LeaderReplication.await_commit` once the writer acknowledged it; :meth:`take_completed` returns
  the waiters released since (NONE, NOT_ENOUGH_REPLICAS_AFTER_APPEND, REQUEST_TIMED_OUT).

**Two high watermarks.**  The *committed* HW is Kafka's: the smallest LEO of the ISR; acks=all Produce
requests complete on it, and followers are told it in every Fetch answer.  Consumers see a second one, the
*published* HW in the state page's ``high_watermark``: the committed HW that every other ISR member has
*been told*.  A follower has been told the HW of an answer once it sends its next fetch on the same
connection (the fetcher has one request in flight per connection, so a new request means the previous
answer arrived whole).  So any in-sync replica promoted after the leader dies knows a HW at least as high
as anything a consumer read, and the HW a consumer sees never goes backwards across a failover
(KAFKA-2334).  The price is one follower round trip of visibility, kept short: a follower fetch whose answer
carries a HW its follower was not told yet is answered at once (no long poll), and a held follower fetch is
answered when the committed HW moves (``appliance.broker.broker``, ``appliance.broker.fetch_session``).

**State page.**  Line 2 of the page (``ipc.state_page``) is written here for replicated partitions: in
this order ``isr_size`` (so a local producer refusing acks=all below ``min.insync.replicas`` sees the ISR
before the HW that an ISR shrink released), ``committed_high_watermark``, ``high_watermark``; and the
replica table (one row per follower: in ISR, LEO, last caught up, last fetch) that ``appliance replicas
status`` and ``appliance topics describe`` show.

**Restarts.**  A broker that restarts builds the state again from the partition's ``replica-state.json``
(the ISR, if this node led in it; the HW checkpoint) and the state page: the committed HW starts at the
larger of the checkpoint and the published HW (everything published was committed).  Followers' positions
are unknown until they fetch again, which holds the HW where it is meanwhile.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final

from appliance.broker.partitions import PartitionHandle, PartitionTable, TopicMeta
from ipc.kafka import ErrorCode, FetchPartition
from ipc.state_page import ReplicaRow, monotonic_ms
from replicas.acks import PendingAcks
from replicas.leader_epochs import check_current_leader_epoch
from replicas.replica_state import PartitionReplicaState, ReplicaUpdate, read_replica_state
from storage.errors import ApplianceError, NotLeaderError, OffsetOutOfRangeError

__all__ = [
    "SHRINK_CHECKS_PER_LAG",
    "FollowerLink",
    "LeaderReplication",
    "ReplicatedPartition",
]

log = logging.getLogger("appliance.broker")

SHRINK_CHECKS_PER_LAG: Final = 8  # the ISR is checked every replica.lag.time.max.ms / 8 (10 ms .. 1 s)
STATUS_INTERVAL_MS: Final = 100  # the replica table in the state page is rewritten at most this often


@dataclass(slots=True)
class _Link:
    """What one follower has been told: per connection, the HW of the last answer and the HW confirmed."""

    connection: object | None = None  # the broker connection of its latest fetch
    sent: int = 0  # the HW carried by the last answer on that connection
    confirmed: int = 0  # a HW the follower is known to have received


@dataclass(eq=False, slots=True)
class ReplicatedPartition:
    """A partition this broker leads with followers: its replica state, its acks=all waiters."""

    handle: PartitionHandle
    state: PartitionReplicaState
    acks: PendingAcks[Any]
    published: int  # the HW in the state page (what consumers see)
    last_log_end_offset: int
    next_shrink_ms: int
    links: dict[int, _Link] = field(default_factory=dict)
    next_status_ms: int = 0

    @property
    def name(self) -> str:
        return self.handle.name


class LeaderReplication:
    """The replica-state owner of every replicated partition this broker leads.  See the module docstring."""

    def __init__(self, table: PartitionTable, node_id: int, *, replica_lag_time_max_ms: int,
                 min_insync_replicas: Callable[[TopicMeta], int],
                 clock_ms: Callable[[], int] = monotonic_ms) -> None:
        self.table = table
        self.node_id = node_id
        self.replica_lag_time_max_ms = replica_lag_time_max_ms
        self._min_insync = min_insync_replicas
        self._clock_ms = clock_ms
        self._shrink_every_ms = max(10, min(1000, replica_lag_time_max_ms // SHRINK_CHECKS_PER_LAG))
        self._partitions: dict[tuple[str, int], ReplicatedPartition] = {}
        self._completed: list[tuple[Any, ErrorCode]] = []

    def __len__(self) -> int:
        return len(self._partitions)

    def __iter__(self) -> Iterator[ReplicatedPartition]:
        return iter(list(self._partitions.values()))

    # -- which partitions -----------------------------------------------------------------------------------

    def sync(self) -> None:
        """Follow the partition table: a state for every replicated partition led here, none for the rest."""
        wanted: set[tuple[str, int]] = set()
        for meta in self.table.topics.values():
            if meta.replication_factor <= 1:
                continue
            for index in range(meta.partitions):
                if self.table.leader(meta, index) == self.node_id:
                    wanted.add((meta.name, index))
        for key in [k for k in self._partitions if k not in wanted]:
            self._drop(key, ErrorCode.NOT_LEADER_OR_FOLLOWER)
        for key, rp in list(self._partitions.items()):
            if rp.handle.closed:  # the topic was deleted (and maybe created again): start over
                self._drop(key, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
            else:
                self._follow_min_insync(rp, self.table.topics[key[0]])
        for key in wanted - set(self._partitions):
            self._start(*key)

    def _follow_min_insync(self, rp: ReplicatedPartition, meta: TopicMeta) -> None:
        """Take the topic's ``min.insync.replicas`` as it is now (an AlterConfigs changes it): the next
        acks=all append, and the acknowledgements waiting, are judged by it."""
        wanted = self._min_insync(meta)
        if wanted == rp.state.min_insync_replicas:
            return
        log.info("partition %s: min.insync.replicas %d (was %d)", rp.name, wanted,
                 rp.state.min_insync_replicas)
        rp.state.min_insync_replicas = wanted
        rp.handle.page.min_insync_replicas = wanted

    def get(self, handle: PartitionHandle) -> ReplicatedPartition | None:
        """The replicated partition behind ``handle`` (None: not replicated, or not ready yet)."""
        rp = self._partitions.get((handle.topic, handle.partition))
        if rp is None or rp.handle is not handle:
            if rp is None and self._replicated(handle.topic):
                rp = self._start(handle.topic, handle.partition)
            if rp is None or rp.handle is not handle:
                return None
        return rp

    def _replicated(self, topic: str) -> bool:
        meta = self.table.topics.get(topic)
        return meta is not None and meta.replication_factor > 1

    def _start(self, topic: str, partition: int) -> ReplicatedPartition | None:
        handle, _ = self.table.lookup(topic, partition)
        meta = self.table.topics.get(topic)
        if handle is None or meta is None:
            return None  # not ready here yet (the next sync tries again)
        page = handle.page
        now = self._clock_ms()
        try:
            epoch, epoch_start = page.leader_epoch()
            persisted = read_replica_state(handle.directory)
        except ApplianceError as e:
            log.error("partition %s: cannot lead it: %s", handle.name, e)
            return None
        isr = persisted.isr if persisted is not None and persisted.leader_id == self.node_id else None
        high_watermark = max(persisted.high_watermark if persisted is not None else 0, page.high_watermark)
        leo = page.log_end_offset
        replicas = self.table.replicas(meta, partition)
        state = PartitionReplicaState(
            topic, partition, broker_id=self.node_id, replicas=replicas, leader_epoch=max(epoch, 0),
            epoch_start_offset=epoch_start, leader_log_end_offset=leo, high_watermark=high_watermark,
            isr=isr, now_ms=now, replica_lag_time_max_ms=self.replica_lag_time_max_ms,
            min_insync_replicas=self._min_insync(meta), directory=handle.directory,
        )
        rp = ReplicatedPartition(handle, state, PendingAcks(handle.name), published=page.high_watermark,
                                 last_log_end_offset=leo, next_shrink_ms=now + self._shrink_every_ms)
        self._partitions[(topic, partition)] = rp
        page.min_insync_replicas = state.min_insync_replicas
        page.isr_size = len(state.isr)
        page.committed_high_watermark = state.high_watermark
        self._publish(rp, now, force_status=True)
        log.info("partition %s: leading in epoch %d (from offset %d), replicas %s, ISR %s, high watermark "
                 "%d, min.insync.replicas %d", handle.name, state.leader_epoch, epoch_start, list(replicas),
                 list(state.isr), state.high_watermark, state.min_insync_replicas)
        return rp

    def _drop(self, key: tuple[str, int], error: ErrorCode) -> None:
        rp = self._partitions.pop(key)
        self._completed += rp.acks.fail_all(error)
        try:
            rp.state.close(self._clock_ms())
        except OSError as e:
            log.warning("partition %s: cannot checkpoint the high watermark: %s", rp.name, e)

    # -- followers ------------------------------------------------------------------------------------------

    def link(self, connection: object) -> FollowerLink:
        """The follower hook for fetches arriving on ``connection`` (``appliance.broker.fetch_session``)."""
        return FollowerLink(self, connection)

    def follower_fetched(self, connection: object, replica_id: int, handle: PartitionHandle,
                         fp: FetchPartition) -> ErrorCode:
        rp = self.get(handle)
        if rp is None:
            return ErrorCode.NONE  # not replicated: served like a consumer up to the log end offset
        state = rp.state
        code = check_current_leader_epoch(fp.current_leader_epoch, state.leader_epoch)
        if code != ErrorCode.NONE:
            return code
        now = self._clock_ms()
        leo = handle.page.log_end_offset
        try:
            update = state.follower_fetched(replica_id, fp.fetch_offset, leader_log_end_offset=leo,
                                            now_ms=now, follower_log_start_offset=fp.log_start_offset)
        except NotLeaderError as e:
            log.warning("%s", e)
            return ErrorCode.NOT_LEADER_OR_FOLLOWER
        except OffsetOutOfRangeError:
            return ErrorCode.OFFSET_OUT_OF_RANGE
        link = rp.links.setdefault(replica_id, _Link())
        if link.connection is connection:
            link.confirmed = max(link.confirmed, link.sent)  # it asks again: it read our previous answer
        else:
            link.connection = connection
            link.sent = link.confirmed
        rp.last_log_end_offset = leo
        self._apply(rp, update, now)
        return ErrorCode.NONE

    def follower_high_watermark(self, handle: PartitionHandle) -> int | None:
        """The HW a follower's answer carries: the committed one (None: the page's, not replicated)."""
        rp = self.get(handle)
        return None if rp is None else rp.state.high_watermark

    def follower_answered(self, connection: object, replica_id: int, handle: PartitionHandle,
                          high_watermark: int) -> bool:
        """Record the HW an answer carries; True if the follower has not been told it yet (news: answer
        now rather than after the long poll, so the published HW does not wait for it)."""
        rp = self._partitions.get((handle.topic, handle.partition))
        if rp is None or rp.handle is not handle:
            return False
        link = rp.links.get(replica_id)
        if link is None or link.connection is not connection:
            return False
        link.sent = max(link.sent, high_watermark)
        return high_watermark > link.confirmed

    # -- produce --------------------------------------------------------------------------------------------

    def append_error(self, handle: PartitionHandle, acks: int) -> ErrorCode | None:
        """NOT_ENOUGH_REPLICAS for acks=all below min.insync.replicas, NONE, or None if not replicated."""
        rp = self.get(handle)
        return None if rp is None else rp.state.append_error(acks)

    def await_commit(self, handle: PartitionHandle, token: Any, *, last_offset: int,
                     deadline_ms: float) -> bool:
        """Hold ``token`` until the committed HW passes ``last_offset`` (False: not replicated here).
        Deadlines are on :func:`~ipc.state_page.monotonic_ms`."""
        rp = self.get(handle)
        if rp is None:
            return False
        state = rp.state
        if state.high_watermark > last_offset:
            self._completed.append((token, state.committed_ack_error()))
        else:
            rp.acks.add(token, last_offset=last_offset, deadline_ms=int(deadline_ms))
        return True

    def take_completed(self) -> list[tuple[Any, ErrorCode]]:
        """acks=all waiters released since the last call, with their answer."""
        done, self._completed = self._completed, []
        return done

    @property
    def has_completed(self) -> bool:
        return bool(self._completed)

    # -- metadata -------------------------------------------------------------------------------------------

    def isr(self, topic: str, partition: int) -> tuple[int, ...] | None:
        rp = self._partitions.get((topic, partition))
        return None if rp is None else rp.state.isr

    # -- the timer ------------------------------------------------------------------------------------------

    def next_timer_ms(self) -> int | None:
        """When :meth:`tick` next has timed work (an ISR check), on :func:`~ipc.state_page.monotonic_ms`;
        None if no replicated partition is led here."""
        return min((rp.next_shrink_ms for rp in self._partitions.values()), default=None)

    def tick(self) -> None:
        """LEO moves, ISR shrinks, expired acks=all waiters, HW checkpoints (every turn of the loop)."""
        if not self._partitions:
            return
        now = self._clock_ms()
        for rp in list(self._partitions.values()):
            if rp.handle.closed:
                continue
            page = rp.handle.page
            leo = page.log_end_offset
            if leo != rp.last_log_end_offset or now >= rp.next_shrink_ms:
                rp.last_log_end_offset = leo
                if now >= rp.next_shrink_ms:
                    rp.next_shrink_ms = now + self._shrink_every_ms
                    update = rp.state.maybe_shrink_isr(leo, now)
                else:
                    update = rp.state.leader_log_end_changed(leo, now)
                self._apply(rp, update, now)
            elif now >= rp.next_status_ms:
                self._publish(rp, now)
            if len(rp.acks):
                self._completed += rp.acks.expire(now)
            try:
                rp.state.maybe_checkpoint(now)
            except OSError as e:
                log.warning("partition %s: cannot checkpoint the high watermark: %s", rp.name, e)

    def _apply(self, rp: ReplicatedPartition, update: ReplicaUpdate, now: int) -> None:
        page = rp.handle.page
        state = rp.state
        if update.isr_changed:
            page.isr_size = len(update.isr)  # before the HW an ISR shrink may release
        if update.high_watermark_advanced:
            page.committed_high_watermark = update.high_watermark
            if len(rp.acks):
                self._completed += rp.acks.complete(update.high_watermark, isr_size=len(update.isr),
                                                    min_insync_replicas=state.min_insync_replicas)
        self._publish(rp, now, force_status=update.isr_changed)

    def _publish(self, rp: ReplicatedPartition, now: int, *, force_status: bool = False) -> None:
        """The HW consumers see: the committed HW every other ISR member has been told (never lower)."""
        state = rp.state
        visible = state.high_watermark
        for replica_id in state.isr:
            if replica_id != self.node_id:
                link = rp.links.get(replica_id)
                visible = min(visible, link.confirmed if link is not None else 0)
        page = rp.handle.page
        if visible > rp.published:
            rp.published = visible
            page.high_watermark = visible
        if force_status or now >= rp.next_status_ms:
            rp.next_status_ms = now + STATUS_INTERVAL_MS
            rows = []
            for replica_id in state.replicas:
                if replica_id == self.node_id:
                    continue
                f = state.follower(replica_id)
                rows.append(ReplicaRow(
                    replica_id, replica_id in state.isr, f.log_end_offset,
                    -1 if f.last_caught_up_ms is None else f.last_caught_up_ms,
                    -1 if f.last_fetch_ms is None else f.last_fetch_ms,
                ))  # fmt: skip
            page.publish_replicas(rows)

    def close(self) -> None:
        """The broker stops: release every waiter (NOT_LEADER_OR_FOLLOWER), checkpoint every HW."""
        for key in list(self._partitions):
            self._drop(key, ErrorCode.NOT_LEADER_OR_FOLLOWER)


class FollowerLink:
    """The follower hook of one broker connection (``appliance.broker.fetch_session.FollowerHook``)."""

    __slots__ = ("connection", "news", "replication")

    def __init__(self, replication: LeaderReplication, connection: object) -> None:
        self.replication = replication
        self.connection = connection
        self.news = False  # an answer read through this hook carries a HW its follower was not told yet

    def fetched(self, replica_id: int, handle: PartitionHandle, fp: FetchPartition) -> ErrorCode:
        return self.replication.follower_fetched(self.connection, replica_id, handle, fp)

    def high_watermark(self, handle: PartitionHandle) -> int | None:
        return self.replication.follower_high_watermark(handle)

    def answered(self, replica_id: int, handle: PartitionHandle, high_watermark: int) -> None:
        if self.replication.follower_answered(self.connection, replica_id, handle, high_watermark):
            self.news = True

