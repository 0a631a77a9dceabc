"""The follower's fetcher: copy one partition from its leader, byte for byte, at the same offsets.

Theory of operation
-------------------
One :class:`PartitionFetcher` per partition this replica follows, one blocking connection to the leader
(``replicas.leader_connection``), driven by :meth:`PartitionFetcher.step` (one exchange with the leader)
or :meth:`PartitionFetcher.run` (steps until stopped, sleeping the back-offs steps ask for).

Two phases::

    TRUNCATING --(step complete)--> FETCHING --(new leader or epoch, divergence)--> TRUNCATING
         ^  |  OffsetsForLeaderEpoch(my latest epoch), truncate (replicas.leader_epochs)
         +--+  until the truncation is complete (KIP-279 may need several rounds)

* **Truncating** (on start, and whenever the leader or its epoch changes): ask the leader where our latest
  epoch ends in its log and cut ours there (``Log.truncate_to``), so the logs never diverge after a failover.
* **Fetching**: Fetch with ``replica_id`` = our broker id, ``fetch_offset`` = our log end offset and
  ``current_leader_epoch`` = the epoch we believe in (a leader in another epoch fences us).  The leader
  long-polls (``max_wait_ms``) when we are caught up.  The response's records are checked (magic, length,
  CRC) and appended unchanged, the leader's offsets, epochs and bytes, piece by piece as they arrive
  (``replicas.answer_copier``: batch by batch with ``Log.append_as_follower``, or a piece of many small
  batches walked by one kernel call and appended with ``Log.append_walked_as_follower``); a partial batch
  at the end is normal and left for the next fetch.  A bad batch appends nothing of the response from it
  on, and the answer is fetched again after a back-off.  Our high watermark becomes ``max(ours,
  min(leader's, our log end))``: it never goes backwards except when a truncation cuts below it.

**Fetching ahead** (``pipeline_fetches``).  While catching up, the leader would sit idle while we check and
append the tail of each answer, and we would wait for its next answer after that.  So once an answer has
fully arrived, and before its last batches are appended, the next Fetch goes out for the offset after its
last whole batch -- if that offset is below the high watermark the answer carries.  A fetch offset is a
claim ("I hold everything below it"), and the leader acts on it: it moves the high watermark, admits the
follower to the ISR, times its lag.  A claim below the high watermark does none of these: the high watermark
is already past it and never goes back, a follower joins the ISR only at the high watermark or beyond, and a
follower below the leader's log end is not caught up.  So fetching ahead changes nothing the leader decides
while the claim is not yet true; at the tail (offsets at or above the high watermark) a follower fetches
one request at a time, its fetch offset exactly its log end.  The answer to a Fetch sent ahead is used only
if the answer before it was appended to the last batch and the leader, its epoch and our phase are
unchanged; otherwise its connection is dropped (its stream holds that answer) and the next step reconnects.
Kafka's own fetcher keeps one request in flight per leader; the protocol answers a connection's requests in
order, so several may be.

Errors from the leader, as Kafka's follower handles them:

* OFFSET_OUT_OF_RANGE: ListOffsets.  Leader's log end below ours (an unclean leader): truncate to it.
  Leader's log start above our end (retention moved it): empty our log and restart at the leader's start.
* FENCED_LEADER_EPOCH, NOT_LEADER_OR_FOLLOWER, UNKNOWN_TOPIC_OR_PARTITION: ask the leader source again,
  back off (a new leader or epoch then means truncating again).
* UNKNOWN_LEADER_EPOCH (the leader has not learned our epoch yet), anything else, timeouts, closed or
  refused connections: back off and retry (reconnecting as needed).

The leader comes from a *leader source*: a :class:`~replicas.leader_connection.LeaderInfo`, or a callable
returning the current one (or None while there is none) -- the supervisor's view, or
``leader_from_metadata`` asked of a bootstrap broker.

**Sharing the log.**  Every change the fetcher makes to its log (each piece of an answer appended, a
truncation, a log start move) holds the lock of its ``guard`` (``replicas.log_guard``): a replica's
adoption thread swaps the leader's cleaned segments in holding the same lock, and a truncation below the
high watermark first stops that thread's adoption in progress (``LogGuard.cutting``).

**Segment boundaries.**  A follower of a compacted topic adopts its leader's cleaned segments whole
(``appliance.follower.adoption``), so its segments must begin where the leader's do.  Before its first
Fetch in a phase, the fetcher asks the leader where its segments begin (DescribeSegments without
checksums, ``replicas.segment_match.LeaderBases``; the adoption thread refreshes them), and before
appending a piece whose first batch lies in a leader segment that begins after our active segment's base,
it rolls there (``Log.roll(base_offset)``, at or above our log end: the offsets between are a gap, as in
the leader's cleaned segment).  From a common base on, both sides roll by the same rule over the same
bytes, so the boundaries then agree by themselves.

The follower's high watermark is handed to ``on_high_watermark`` when it advances (publish it in a state
page) and written to the partition's replica-state file every ``checkpoint_interval_ms`` and on close.
"""

from __future__ import annotations

import enum
import logging
import struct
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Final, NamedTuple

from ipc.kafka import (
    ErrorCode,
    ListOffsetsPartition,
    ListOffsetsRequest,
    ListOffsetsTopic,
    OffsetForLeaderEpochRequest,
    OffsetForLeaderPartition,
    OffsetForLeaderTopic,
    Struct,
    error_name,
)
from ipc.kafka.appliance_messages import DescribeSegmentsRequest, DescribeSegmentsTopic
from replicas.answer_copier import AnswerCopier, next_offset_after, walk_arrays
from replicas.leader_connection import (
    DEFAULT_REQUEST_TIMEOUT_MS,
    FetchInFlight,
    FollowerFetch,
    LeaderConnection,
    LeaderInfo,
)
from replicas.leader_epochs import TruncationStep, follower_truncation, truncation_without_epochs
from replicas.log_guard import LogGuard
from replicas.replica_state import PersistedReplicaState, read_replica_state, write_replica_state
from replicas.segment_match import LeaderBases, SegmentDigest
from storage.batch_header import LOG_OVERHEAD
from storage.errors import (
    ProtocolError,
    RequestTimeoutError,
    describe_os_error,
    is_disk_full,
)
from storage.log import EARLIEST_TIMESTAMP, LATEST_TIMESTAMP, Log

__all__ = [
    "EMPTY_FETCH_BACKOFF_MS",
    "FetchPhase",
    "FetcherConfig",
    "LeaderSource",
    "PartitionFetcher",
    "StepOutcome",
]

_BATCH_HEAD: Final = struct.Struct(">qi")  # a batch's base offset and length
EMPTY_FETCH_BACKOFF_MS: Final = 5  # an empty answer well before max_wait_ms: the leader does not long-poll
_REFRESH_ERRORS: Final = frozenset({
    ErrorCode.FENCED_LEADER_EPOCH, ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
})

LeaderSource = Callable[[], LeaderInfo | None]

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class FetcherConfig:
    """A follower's settings, Kafka's names with ``.`` as ``_``."""

    broker_id: int  # sent as replica_id: the leader tracks us under it
    replica_fetch_max_bytes: int = 1_048_576  # partition_max_bytes and max_bytes of each Fetch
    replica_fetch_wait_max_ms: int = 500  # the leader's long poll
    replica_fetch_min_bytes: int = 1
    replica_fetch_backoff_ms: int = 1000  # after an error
    request_timeout_ms: int = DEFAULT_REQUEST_TIMEOUT_MS  # on top of the long poll
    checkpoint_interval_ms: int = 5000  # high watermark into the replica-state file
    client_id: str = "appliance-replica"
    sasl_plain: tuple[str, str] | None = None
    pipeline_fetches: bool = True  # not Kafka's: fetch ahead while catching up below the high watermark


class FetchPhase(enum.Enum):
    TRUNCATING = "truncating"
    FETCHING = "fetching"


class StepOutcome(NamedTuple):
    """What one step did; ``backoff_ms`` is how long to wait before the next one."""

    action: str  # "appended", "empty", "truncated", "backoff"
    backoff_ms: int = 0
    detail: str = ""
    records_bytes: int = 0


class PartitionFetcher:
    """Keeps ``log`` (opened by this process as its only writer) a copy of the leader's.  One thread."""

    def __init__(
        self,
        log: Log,
        leader: LeaderSource | LeaderInfo,
        config: FetcherConfig,
        *,
        on_high_watermark: Callable[[int], None] | None = None,
        on_log_end_offset: Callable[[int], None] | None = None,
        clock_ms: Callable[[], int] | None = None,
        guard: LogGuard | None = None,
    ) -> None:
        self.log = log
        self.guard = guard if guard is not None else LogGuard()
        self.topic, self.partition = log.topic_partition
        self.name = log.name
        self.config = config
        self._source: LeaderSource = (lambda: leader) if isinstance(leader, LeaderInfo) else leader
        self._on_high_watermark = on_high_watermark
        self._on_log_end_offset = on_log_end_offset
        self._clock_ms = clock_ms or (lambda: time.monotonic_ns() // 1_000_000)
        self.leader: LeaderInfo | None = None
        self.phase = FetchPhase.TRUNCATING
        self.last_error = ""
        self.last_fetch_ms: int | None = None  # the clock at the last answered fetch (None: none yet)
        self._conn: LeaderConnection | None = None
        self._ahead: _FetchAhead | None = None  # a Fetch sent ahead on _conn, its answer not received yet
        self._lock = threading.Lock()  # guards _conn between the fetching thread and close()
        self._checkpoint_lock = threading.Lock()
        self._closed = False
        persisted = read_replica_state(log.directory)
        known = persisted.high_watermark if persisted is not None else 0
        self._high_watermark = max(log.log_start_offset, min(known, log.log_end_offset))
        self._checkpointed_high_watermark = self._high_watermark
        self._last_checkpoint_ms = self._clock_ms()
        self._fetch_template: FollowerFetch | None = None
        self._fetch_timeout_ms = config.request_timeout_ms + config.replica_fetch_wait_max_ms
        self._walk_arrays = walk_arrays()  # every answer's copier walks batches into these
        self.leader_bases = LeaderBases()  # where the leader's segments begin ("Segment boundaries")
        self._bases_wanted = True  # ask the leader for them before the next Fetch

    # --- what callers read ----------------------------------------------------------------------------------
    @property
    def high_watermark(self) -> int:
        return self._high_watermark

    @property
    def log_end_offset(self) -> int:
        return self.log.log_end_offset

    # --- driving --------------------------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        """Step until ``stop`` is set (or :meth:`close` is called), sleeping the back-offs."""
        while not stop.is_set() and not self._closed:
            outcome = self.step()
            if outcome.backoff_ms:
                stop.wait(outcome.backoff_ms / 1000)

    def step(self) -> StepOutcome:
        """One exchange with the leader (truncation round or fetch).  Network and leader errors become a
        back-off outcome; errors of our own log (disk) propagate."""
        if self._closed:
            return StepOutcome("backoff", self.config.replica_fetch_backoff_ms, "closed")
        try:
            leader = self._current_leader()
            if leader is None:
                return self._backoff("no leader known for the partition", refresh=True)
            conn = self._connection(leader)
            ahead = self._ahead
            if ahead is not None and (ahead.conn is not conn or ahead.leader != leader
                                      or self.phase is not FetchPhase.FETCHING
                                      or ahead.fetch_offset != self.log.log_end_offset):
                self._drop_connection()  # its stream holds an answer we will not use
                conn = self._connection(leader)
            if self.phase is FetchPhase.TRUNCATING:
                outcome = self._truncate(conn, leader)
            else:
                outcome = self._fetch(conn, leader)
        except _LeaderUnreachable as error:
            self._drop_connection()
            if self._closed:  # close() from another thread cut the exchange short
                return StepOutcome("backoff", 0, "closed")
            return self._backoff(str(error), refresh=True)
        self._maybe_checkpoint()
        return outcome

    def close(self) -> None:
        """Stop: wake a blocked request, close the connection, checkpoint the high watermark.  The log stays
        open (its owner closes it)."""
        self._closed = True
        with self._lock:
            conn = self._conn
        if conn is not None:
            conn.shutdown()
        self._drop_connection()
        self._checkpoint()

    # --- leader and connection ------------------------------------------------------------------------------
    def _current_leader(self) -> LeaderInfo | None:
        if self.leader is None:
            self._set_leader(self._source())
        return self.leader

    def _set_leader(self, leader: LeaderInfo | None) -> None:
        if leader == self.leader:
            return
        old = self.leader
        if leader is not None and leader.leader_id == self.config.broker_id:
            _log.warning("partition %s: the leader source names this replica (%d) as leader; not fetching",
                         self.name, self.config.broker_id)
            leader = None
        if old is None or leader is None or (old.host, old.port) != (leader.host, leader.port):
            self._drop_connection()
        if leader is not None and (old is None or old.leader_epoch != leader.leader_epoch
                                   or old.leader_id != leader.leader_id):
            _log.info("partition %s: following %s (was %s): truncating first", self.name, leader, old)
            self.phase = FetchPhase.TRUNCATING
        self.leader = leader

    def _connection(self, leader: LeaderInfo) -> LeaderConnection:
        with self._lock:
            conn = self._conn
        if conn is None or conn.closed:
            try:
                conn = LeaderConnection.connect(
                    leader.host, leader.port, client_id=self.config.client_id,
                    timeout_ms=self.config.request_timeout_ms, sasl_plain=self.config.sasl_plain)
            except (OSError, ProtocolError, RequestTimeoutError) as error:
                why = f"connecting to {leader}: {type(error).__name__}: {error}"
                raise _LeaderUnreachable(why) from error
            with self._lock:
                if self._closed:
                    conn.close()
                    raise _LeaderUnreachable(f"partition {self.name}: the fetcher is closed")
                self._conn = conn
        return conn

    def _drop_connection(self) -> None:
        with self._lock:
            conn, self._conn = self._conn, None
            self._ahead = None
        if conn is not None:
            conn.close()

    def _backoff(self, why: str, *, refresh: bool = False) -> StepOutcome:
        if why != self.last_error:
            _log.warning("partition %s: %s; retrying in %d ms", self.name, why,
                         self.config.replica_fetch_backoff_ms)
        self.last_error = why
        if refresh:
            try:
                self._set_leader(self._source())
            except Exception as error:  # a failing source is retried at the next step
                _log.warning("partition %s: asking for the leader failed: %s", self.name, error)
                self._set_leader(None)
        return StepOutcome("backoff", self.config.replica_fetch_backoff_ms, why)

    # --- truncation -----------------------------------------------------------------------------------------
    def _truncate(self, conn: LeaderConnection, leader: LeaderInfo) -> StepOutcome:
        log = self.log
        latest = log.latest_epoch
        end = log.log_end_offset
        if end == log.log_start_offset:
            step = TruncationStep(end, True, "the log is empty: nothing to truncate")
        elif latest < 0:
            step = truncation_without_epochs(follower_log_end_offset=end,
                                             follower_high_watermark=self._high_watermark)
        else:
            answer = _exchange(conn, OffsetForLeaderEpochRequest(
                replica_id=self.config.broker_id,
                topics=[OffsetForLeaderTopic(topic=self.topic, partitions=[OffsetForLeaderPartition(
                    partition=self.partition, current_leader_epoch=leader.leader_epoch,
                    leader_epoch=latest)])],
            ))
            found = [p for t in answer.topics if t.topic == self.topic for p in t.partitions
                     if p.partition == self.partition]
            if not found:
                raise _LeaderUnreachable(f"leader {conn.address}: OffsetsForLeaderEpoch answer lacks "
                                         f"partition {self.name}")
            result = found[0]
            if result.error_code != ErrorCode.NONE:
                return self._leader_error(result.error_code, "OffsetsForLeaderEpoch")
            step = follower_truncation(leader_epoch=result.leader_epoch, leader_end_offset=result.end_offset,
                                       follower_epochs=log.leader_epoch_cache, follower_log_end_offset=end,
                                       follower_high_watermark=self._high_watermark)
        self._apply_truncation(step, leader)
        if step.complete:
            self.phase = FetchPhase.FETCHING
            self._bases_wanted = True
        return StepOutcome("truncated", 0, step.reason)

    def _apply_truncation(self, step: TruncationStep, leader: LeaderInfo) -> None:
        log = self.log
        before = log.log_end_offset
        if step.offset < before:
            # below the high watermark the cut may reach a closed segment an adoption would replace
            below_hw = step.offset < self._high_watermark
            cut: AbstractContextManager[Any] = self.guard.cutting() if below_hw else self.guard.lock
            with cut:
                log.truncate_to(step.offset)
            _log.info("partition %s: truncated from %d to %d following %s: %s", self.name, before,
                      log.log_end_offset, leader, step.reason)
        # Epochs starting at the cut hold no records; dropping them lets the next round ask an older epoch.
        log.leader_epoch_cache.truncate_from_end(step.offset)
        if self._high_watermark > log.log_end_offset:  # only an unclean history cuts below the HW
            self._high_watermark = log.log_end_offset
            if self._on_high_watermark is not None:
                self._on_high_watermark(self._high_watermark)
        if self._on_log_end_offset is not None and log.log_end_offset != before:
            self._on_log_end_offset(log.log_end_offset)

    # --- fetching -------------------------------------------------------------------------------------------
    def _follower_fetch(self, leader: LeaderInfo) -> FollowerFetch:
        """Our Fetch to ``leader`` but for its offsets (encoded once per value: ``send_follower_fetch``)."""
        fetch = self._fetch_template
        if fetch is None or fetch.current_leader_epoch != leader.leader_epoch:
            config = self.config
            fetch = self._fetch_template = FollowerFetch(
                replica_id=config.broker_id, topic=self.topic, partition=self.partition,
                current_leader_epoch=leader.leader_epoch, max_wait_ms=config.replica_fetch_wait_max_ms,
                min_bytes=config.replica_fetch_min_bytes, max_bytes=config.replica_fetch_max_bytes)
        return fetch

    def _send_fetch(self, conn: LeaderConnection, leader: LeaderInfo, fetch_offset: int) -> FetchInFlight:
        return conn.send_follower_fetch(self._follower_fetch(leader), fetch_offset, self.log.log_start_offset,
                                        timeout_ms=self._fetch_timeout_ms)

    def _fetch(self, conn: LeaderConnection, leader: LeaderInfo) -> StepOutcome:
        config = self.config
        log = self.log
        fetch_offset = log.log_end_offset
        started_ms = self._clock_ms()
        where = f"partition {self.name}: Fetch answer from leader {conn.address} at offset {fetch_offset}"
        copier = AnswerCopier(log, where, fetch_offset, self._walk_arrays, self._on_log_end_offset)
        guard = self.guard

        def consume(records: memoryview, final: bool) -> int:
            with guard.lock:  # an adoption's swap waits for the piece (replicas.log_guard)
                used = 0
                while (split := self._leader_segment_split(records, used)) is not None:
                    if split > used:
                        taken = copier.consume(records[used:split], False)
                        used += taken
                        if used < split or copier.problem is not None:
                            return used
                    self._roll_at_leader_base(records[split:])
                return used + copier.consume(records[used:], final)

        ahead, self._ahead = self._ahead, None  # step() checked it is for this offset on this connection
        if ahead is None and self._bases_wanted:
            self._ask_leader_bases(conn)

        def fetch_ahead(answer: Any, rest: memoryview) -> None:
            next_offset = next_offset_after(rest, copier.fetch_offset)
            data = answer.responses[0].partitions[0]
            if copier.problem is None and fetch_offset < next_offset < data.high_watermark:
                try:
                    sent = self._send_fetch(conn, leader, next_offset)
                except (OSError, ProtocolError, RequestTimeoutError):
                    return  # the connection is closed; this answer is appended all the same
                self._ahead = _FetchAhead(conn, leader, next_offset, sent)

        try:
            sent = ahead.sent if ahead is not None else self._send_fetch(conn, leader, fetch_offset)
            answer, streamed = conn.receive_fetch(
                sent, consume, on_complete=fetch_ahead if config.pipeline_fetches else None)
        except (OSError, ProtocolError, RequestTimeoutError) as error:
            raise _LeaderUnreachable(f"{type(error).__name__}: {error}") from error
        if answer.error_code != ErrorCode.NONE:
            return self._leader_error(answer.error_code, "Fetch")
        found = [p for t in answer.responses if t.topic == self.topic for p in t.partitions
                 if p.partition_index == self.partition]
        if not found:
            raise _LeaderUnreachable(f"leader {conn.address}: Fetch answer lacks partition {self.name}")
        data = found[0]
        if data.error_code == ErrorCode.OFFSET_OUT_OF_RANGE:
            return self._out_of_range(conn, leader, fetch_offset)
        if data.error_code != ErrorCode.NONE:
            return self._leader_error(data.error_code, "Fetch")
        records = data.records
        if not streamed and records is not None and len(records) > 0:
            consume(memoryview(records), True)
        if copier.problem is not None:
            reason, truncate = copier.problem
            if truncate:
                self.phase = FetchPhase.TRUNCATING
            return self._backoff(reason)
        appended = copier.appended_bytes
        if not appended and copier.partial_tail_bytes:
            return self._backoff(f"{where}: only a partial batch of {copier.partial_tail_bytes} bytes "
                                 "arrived; raise replica.fetch.max.bytes above the leader's largest batch")
        if 0 < data.log_start_offset <= log.log_end_offset and data.log_start_offset > log.log_start_offset:
            with guard.lock:  # the leader's retention moved its start
                log.increment_log_start_offset(data.log_start_offset)
        advanced = self._advance_high_watermark(data.high_watermark)
        self.last_error = ""
        now_ms = self._clock_ms()
        self.last_fetch_ms = now_ms
        if appended:
            return StepOutcome("appended", 0, "", appended)
        waited_ms = now_ms - started_ms
        # Answered early with nothing: the leader does not long-poll -- unless it answered to tell us a new
        # high watermark (a leader wakes held follower fetches for that), then ask again at once.
        early = waited_ms * 2 < config.replica_fetch_wait_max_ms and not advanced
        return StepOutcome("empty", EMPTY_FETCH_BACKOFF_MS if early else 0)

    def _ask_leader_bases(self, conn: LeaderConnection) -> None:
        """Learn where the leader's segments begin (DescribeSegments, without checksums); a leader that
        does not answer leaves them as they are (the adoption thread asks again)."""
        self._bases_wanted = False
        try:
            answer = _exchange(conn, DescribeSegmentsRequest(
                replica_id=self.config.broker_id, checksums=False,
                topics=[DescribeSegmentsTopic(name=self.topic, partitions=[self.partition])]), version=0)
        except _LeaderUnreachable as error:
            _log.info("partition %s: the leader's segments are not known (%s)", self.name, error)
            raise
        for topic in answer.topics:
            for p in topic.partitions:
                if topic.name == self.topic and p.partition_index == self.partition and p.error_code == 0:
                    self.leader_bases.update([SegmentDigest(s.base_offset, s.next_offset, s.size_bytes)
                                              for s in p.segments], p.active_base_offset)

    def _leader_segment_split(self, records: memoryview, start: int) -> int | None:
        """The position, at or after ``start``, of the first whole batch of ``records`` that lies in a leader
        segment beginning after our active segment's base (where we roll), or None if there is none."""
        log = self.log
        boundary = self.leader_bases.first_above(max(log.active_segment.base_offset, log.log_end_offset - 1))
        if boundary is None:
            return None
        position, size = start, len(records)
        while position + _BATCH_HEAD.size <= size:
            base_offset, length = _BATCH_HEAD.unpack_from(records, position)
            if base_offset >= boundary:
                return position
            position += length + LOG_OVERHEAD
        return None

    def _roll_at_leader_base(self, records: memoryview) -> None:
        """Start a new segment at each leader segment base between our active segment's base and the first
        batch of ``records`` (the leader's segments there that hold no batch are empty here too), from our
        log end on (see "Segment boundaries")."""
        if len(records) < 8:
            return
        first_offset = int.from_bytes(records[:8], "big", signed=True)
        log = self.log
        for base in self.leader_bases.between(log.active_segment.base_offset, first_offset):
            if base >= log.log_end_offset:
                log.roll(base)

    def _advance_high_watermark(self, leader_high_watermark: int) -> bool:
        candidate = min(leader_high_watermark, self.log.log_end_offset)
        if candidate > self._high_watermark:
            self._high_watermark = candidate
            if self._on_high_watermark is not None:
                self._on_high_watermark(candidate)
            return True
        return False

    def _out_of_range(self, conn: LeaderConnection, leader: LeaderInfo, fetch_offset: int) -> StepOutcome:
        log = self.log
        leader_end = self._list_offset(conn, leader, LATEST_TIMESTAMP)
        if leader_end is None:
            return self._backoff("ListOffsets failed after OFFSET_OUT_OF_RANGE", refresh=True)
        if leader_end < fetch_offset:
            _log.warning("partition %s: the leader's log ends at %d, below ours at %d (an unclean leader?): "
                         "truncating to it", self.name, leader_end, fetch_offset)
            self._apply_truncation(TruncationStep(leader_end, True, "leader's log end"), leader)
            return StepOutcome("truncated", 0, f"truncated to the leader's log end {leader_end}")
        leader_start = self._list_offset(conn, leader, EARLIEST_TIMESTAMP)
        if leader_start is None:
            return self._backoff("ListOffsets failed after OFFSET_OUT_OF_RANGE", refresh=True)
        if leader_start > fetch_offset:
            _log.warning("partition %s: the leader's log starts at %d, past our log end %d: emptying our log "
                         "and starting there", self.name, leader_start, fetch_offset)
            with self.guard.lock:  # files unlinked, none cut: a reader of them reads on
                log.truncate_fully_and_start_at(leader_start)
            self._high_watermark = leader_start  # nothing below the log start is readable here anyway
            if self._on_log_end_offset is not None:
                self._on_log_end_offset(leader_start)
            return StepOutcome("truncated", 0, f"restarted at the leader's log start {leader_start}")
        return StepOutcome("backoff", EMPTY_FETCH_BACKOFF_MS, "offset back in range")

    def _list_offset(self, conn: LeaderConnection, leader: LeaderInfo, timestamp: int) -> int | None:
        answer = _exchange(conn, ListOffsetsRequest(
            replica_id=self.config.broker_id, isolation_level=0,
            topics=[ListOffsetsTopic(name=self.topic, partitions=[ListOffsetsPartition(
                partition_index=self.partition, current_leader_epoch=leader.leader_epoch,
                timestamp=timestamp)])],
        ))
        for topic in answer.topics:
            for p in topic.partitions:
                if topic.name == self.topic and p.partition_index == self.partition:
                    return int(p.offset) if p.error_code == ErrorCode.NONE and p.offset >= 0 else None
        return None

    def _leader_error(self, code: int, api: str) -> StepOutcome:
        why = f"{api} from {self.leader} answered {error_name(code)}"
        return self._backoff(why, refresh=code in _REFRESH_ERRORS)

    # --- the high watermark checkpoint ----------------------------------------------------------------------
    def _maybe_checkpoint(self) -> None:
        if (self._high_watermark != self._checkpointed_high_watermark
                and self._clock_ms() - self._last_checkpoint_ms >= self.config.checkpoint_interval_ms):
            self._checkpoint()

    def _checkpoint(self) -> None:
        with self._checkpoint_lock:  # close() may run while the fetching thread checkpoints
            leader = self.leader
            high_watermark = self._high_watermark
            try:
                write_replica_state(self.log.directory, PersistedReplicaState(
                    self.topic, self.partition, leader.leader_id if leader else -1,
                    leader.leader_epoch if leader else -1, (), high_watermark))
            except OSError as exc:  # a full disk: the high watermark is checkpointed at a later step
                if not is_disk_full(exc):
                    raise
                _log.warning("partition %s: high watermark not checkpointed: %s", self.name,
                             describe_os_error(exc))
                self._last_checkpoint_ms = self._clock_ms()  # tried again an interval later
                return
            self._checkpointed_high_watermark = high_watermark
            self._last_checkpoint_ms = self._clock_ms()


class _FetchAhead(NamedTuple):
    """A Fetch sent before the answer ahead of it was appended (see "Fetching ahead")."""

    conn: LeaderConnection
    leader: LeaderInfo
    fetch_offset: int
    sent: FetchInFlight


class _LeaderUnreachable(Exception):
    """Internal: an exchange with the leader failed (connection, timeout, malformed answer)."""


def _exchange(conn: LeaderConnection, request: Struct, timeout_ms: int | None = None,
              version: int | None = None) -> Any:
    try:
        return conn.request(request, timeout_ms=timeout_ms, version=version)
    except (OSError, ProtocolError, RequestTimeoutError) as error:
        raise _LeaderUnreachable(f"{type(error).__name__}: {error}") from error
