"""Leader-side replica state of one partition: follower positions, the ISR, the high watermark.

Theory of operation
-------------------
The leader learns where each follower is from the follower's own Fetch requests: a follower always fetches
from its log end offset, so ``fetch_offset`` *is* the follower's LEO (everything below it is in the
follower's log).  Nothing else tells the leader about followers; there are no heartbeats.

**Caught up** (Kafka's ``Replica.updateFetchState``).  At a fetch at time ``t`` with offset ``f`` while the
leader's LEO is ``L``, the follower was caught up at ``t`` if ``f >= L``; and if ``f`` reaches the leader's
LEO as of the follower's *previous* fetch, it was caught up at the time of that previous fetch.
``last_caught_up_ms`` keeps the latest such time.  A follower is *in sync* while
``now - last_caught_up_ms <= replica.lag.time.max.ms``, or while its LEO equals the leader's (an idle
partition keeps an idle follower in sync).

**ISR.**  The in-sync replica set always holds the leader.  :meth:`PartitionReplicaState.maybe_shrink_isr`
(the caller runs it about every ``replica.lag.time.max.ms / 2``) removes followers that are no longer in
sync.  A follower outside the ISR joins it at a fetch when its LEO has reached both the high watermark and
the start offset of the current leader epoch (it holds everything committed, and nothing from an older
leader that this epoch may have replaced).  Every ISR change is written to the partition's replica-state
file (atomically, fsynced) *before* it takes effect.

**High watermark** (Kafka's ``maybeIncrementLeaderHW``).  The smallest LEO among the leader, the ISR, and
followers caught up within the lag time even if not yet in the ISR (so a follower about to join is not
overtaken, KAFKA-7128); it never goes backwards.  A follower in the ISR whose position is not yet known
(no fetch since this replica became leader) holds the high watermark where it is.  Every offset below the
high watermark is in every ISR member's log: that is what acks=all waits for and what consumers may read.

**Who calls what.**  The object is sans-IO: no sockets, no threads, no clock of its own; every method takes
``now_ms`` (any monotonic millisecond clock, the same for all calls) and the leader's current LEO (from the
state page).  Methods that may move the high watermark return a :class:`ReplicaUpdate`; when
``high_watermark_advanced`` the caller publishes the new value in the state page and completes acks=all
waiters (``replicas.acks.PendingAcks.complete``).  One thread owns an instance.

Replica-state file (``replica-state.json`` in the partition directory)::

    {"version": 1, "topic": "orders", "partition": 3, "leader_id": 0, "leader_epoch": 7,
     "isr": [0, 2], "high_watermark": 120034}

Written atomically (temp file, fsync, rename, fsync the directory) on every ISR or epoch change, and with the
latest high watermark every ``checkpoint_interval_ms`` (Kafka's replication-offset checkpoint).  A follower
writes the same file with its own high watermark.  A malformed file raises ``CorruptRecordError`` naming the
file and the field.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final, NamedTuple

from ipc.kafka import ErrorCode
from storage.atomic_file import write_atomically
from storage.disk_faults import DISK_FAULTS
from storage.errors import (
    CorruptRecordError,
    NotEnoughReplicasError,
    NotLeaderError,
    OffsetOutOfRangeError,
    describe_os_error,
    is_disk_full,
)

__all__ = [
    "ACKS_ALL",
    "DEFAULT_CHECKPOINT_INTERVAL_MS",
    "REPLICA_STATE_FILE",
    "UNKNOWN_OFFSET",
    "FollowerState",
    "FollowerStatus",
    "PartitionReplicaState",
    "PersistedReplicaState",
    "ReplicaUpdate",
    "read_replica_state",
    "write_replica_state",
]

REPLICA_STATE_FILE: Final = "replica-state.json"
REPLICA_STATE_VERSION: Final = 1
_WRITING_SUFFIX: Final = ".new"  # not ".tmp": the log's writer deletes *.tmp files of its directory on open
UNKNOWN_OFFSET: Final = -1
ACKS_ALL: Final = -1
DEFAULT_CHECKPOINT_INTERVAL_MS: Final = 5000  # Kafka's replica.high.watermark.checkpoint.interval.ms

_log = logging.getLogger(__name__)


# --- the persisted part -------------------------------------------------------------------------------------


class PersistedReplicaState(NamedTuple):
    topic: str
    partition: int
    leader_id: int  # the replica that led in leader_epoch (-1 unknown)
    leader_epoch: int  # -1 before the first election
    isr: tuple[int, ...]
    high_watermark: int


def write_replica_state(directory: str, state: PersistedReplicaState) -> None:
    """Replace ``<directory>/replica-state.json`` whole and durably (``storage.atomic_file``)."""
    path = os.path.join(directory, REPLICA_STATE_FILE)
    document = {
        "version": REPLICA_STATE_VERSION,
        "topic": state.topic,
        "partition": state.partition,
        "leader_id": state.leader_id,
        "leader_epoch": state.leader_epoch,
        "isr": list(state.isr),
        "high_watermark": state.high_watermark,
    }
    data = (json.dumps(document, separators=(", ", ": ")) + "\n").encode()
    if DISK_FAULTS.armed:
        DISK_FAULTS.check("checkpoint.write", path)
    write_atomically(path, data, tmp_suffix=_WRITING_SUFFIX)


def read_replica_state(directory: str) -> PersistedReplicaState | None:
    """The replica-state file of ``directory``; None if there is none.  Malformed: CorruptRecordError."""
    path = os.path.join(directory, REPLICA_STATE_FILE)
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return None
    try:
        document = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CorruptRecordError(
            f"replica-state file {path}: not a JSON document ({e}); {len(raw)} bytes"
        ) from None
    if not isinstance(document, dict):
        raise CorruptRecordError(f"replica-state file {path}: expected a JSON object, found "
                                 f"{type(document).__name__}")

    def field(name: str, kind: type, minimum: int | None = None) -> object:
        if name not in document:
            raise CorruptRecordError(f"replica-state file {path}: field {name!r} is missing")
        value = document[name]
        if not isinstance(value, kind) or isinstance(value, bool):
            raise CorruptRecordError(f"replica-state file {path}: field {name!r} is {value!r}, expected "
                                     f"{'an integer' if kind is int else 'a ' + kind.__name__}")
        if minimum is not None and isinstance(value, int) and value < minimum:
            raise CorruptRecordError(f"replica-state file {path}: field {name!r} is {value}, expected at "
                                     f"least {minimum}")
        return value

    version = field("version", int)
    if version != REPLICA_STATE_VERSION:
        raise CorruptRecordError(
            f"replica-state file {path}: version {version}, expected {REPLICA_STATE_VERSION}"
        )
    isr = field("isr", list)
    assert isinstance(isr, list)
    valid = all(isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in isr)
    if not valid or len(set(isr)) != len(isr):
        raise CorruptRecordError(f"replica-state file {path}: field 'isr' is {isr!r}, expected distinct "
                                 "replica ids >= 0")
    topic = field("topic", str)
    partition = field("partition", int, 0)
    leader_id = field("leader_id", int, -1)
    leader_epoch = field("leader_epoch", int, -1)
    high_watermark = field("high_watermark", int, 0)
    assert isinstance(topic, str) and isinstance(partition, int) and isinstance(leader_id, int)
    assert isinstance(leader_epoch, int) and isinstance(high_watermark, int)
    return PersistedReplicaState(topic, partition, leader_id, leader_epoch, tuple(isr), high_watermark)


# --- followers ----------------------------------------------------------------------------------------------


@dataclass(slots=True)
class FollowerState:
    """What the leader knows of one follower, all from its fetches."""

    replica_id: int
    log_end_offset: int = UNKNOWN_OFFSET  # its last fetch offset (unknown until it fetches from this leader)
    log_start_offset: int = UNKNOWN_OFFSET
    last_caught_up_ms: int | None = None  # None: never caught up with this leader
    last_fetch_ms: int | None = None
    last_fetch_leader_log_end_offset: int = UNKNOWN_OFFSET

    def record_fetch(self, fetch_offset: int, leader_log_end_offset: int, now_ms: int,
                     log_start_offset: int = UNKNOWN_OFFSET) -> None:
        """Kafka's rule: caught up now if at the leader's LEO; caught up at the previous fetch if it has
        reached the leader's LEO as of that fetch."""
        caught_up_at: int | None = None
        if fetch_offset >= leader_log_end_offset:
            caught_up_at = now_ms
        elif self.last_fetch_ms is not None and fetch_offset >= self.last_fetch_leader_log_end_offset:
            caught_up_at = self.last_fetch_ms
        if caught_up_at is not None and (self.last_caught_up_ms is None
                                         or caught_up_at > self.last_caught_up_ms):
            self.last_caught_up_ms = caught_up_at
        self.log_end_offset = fetch_offset
        self.log_start_offset = log_start_offset
        self.last_fetch_leader_log_end_offset = leader_log_end_offset
        self.last_fetch_ms = now_ms

    def caught_up_within(self, now_ms: int, lag_ms: int) -> bool:
        return self.last_caught_up_ms is not None and now_ms - self.last_caught_up_ms <= lag_ms

    def in_sync(self, leader_log_end_offset: int, now_ms: int, lag_ms: int) -> bool:
        """Kafka's ``isCaughtUp``: at the leader's LEO, or caught up within the lag time."""
        return self.log_end_offset == leader_log_end_offset or self.caught_up_within(now_ms, lag_ms)


class FollowerStatus(NamedTuple):
    """One follower as ``appliance replicas status`` shows it."""

    replica_id: int
    in_isr: bool
    log_end_offset: int  # -1: not fetched from this leader yet
    lag_records: int  # leader LEO - follower LEO (-1 unknown)
    lag_ms: int  # how long since it was last caught up (0 caught up now; -1 never)
    last_fetch_ms_ago: int  # -1 never


class ReplicaUpdate(NamedTuple):
    """What a call changed.  Publish ``high_watermark`` when it advanced; persisting is already done."""

    high_watermark: int
    high_watermark_advanced: bool
    isr: tuple[int, ...]
    isr_changed: bool


# --- the partition ------------------------------------------------------------------------------------------


class PartitionReplicaState:
    """Replica state of one partition this replica leads.  See the module docstring.

    ``replicas`` is the partition's assignment (every replica id, the leader's included).  ``directory`` is
    the partition's log directory (the replica-state file goes there); None keeps nothing on disk (tests).
    """

    def __init__(
        self,
        topic: str,
        partition: int,
        *,
        broker_id: int,
        replicas: Iterable[int],
        leader_epoch: int,
        epoch_start_offset: int,
        leader_log_end_offset: int,
        high_watermark: int,
        isr: Iterable[int] | None,
        now_ms: int,
        replica_lag_time_max_ms: int = 30_000,
        min_insync_replicas: int = 1,
        directory: str | None = None,
        checkpoint_interval_ms: int = DEFAULT_CHECKPOINT_INTERVAL_MS,
    ) -> None:
        if replica_lag_time_max_ms < 1:
            raise ValueError(f"replica.lag.time.max.ms must be >= 1, got {replica_lag_time_max_ms}")
        if min_insync_replicas < 1:
            raise ValueError(f"min.insync.replicas must be >= 1, got {min_insync_replicas}")
        self.topic = topic
        self.partition = partition
        self.name = f"{topic}-{partition}"
        self.broker_id = broker_id
        assigned = list(dict.fromkeys([broker_id, *replicas]))
        self.replica_lag_time_max_ms = replica_lag_time_max_ms
        self.min_insync_replicas = min_insync_replicas
        self.directory = directory
        self.checkpoint_interval_ms = checkpoint_interval_ms
        self.leader_epoch = leader_epoch
        self.epoch_start_offset = epoch_start_offset
        self._high_watermark = max(0, min(high_watermark, leader_log_end_offset))
        self._followers: dict[int, FollowerState] = {r: FollowerState(r) for r in assigned if r != broker_id}
        wanted = [broker_id] if isr is None else [broker_id, *isr]
        unknown = [r for r in wanted if r != broker_id and r not in self._followers]
        if unknown:
            _log.warning("partition %s: ISR members %s are not assigned replicas %s; dropped", self.name,
                         unknown, assigned)
        members = {r for r in wanted if r == broker_id or r in self._followers}
        self._isr: tuple[int, ...] = tuple(sorted(members))
        for replica_id in self._isr:  # Kafka: ISR members start caught up, the others never were
            if replica_id != broker_id:
                self._followers[replica_id].last_caught_up_ms = now_ms
        self._checkpointed_high_watermark = -1
        self._last_checkpoint_ms = now_ms
        self._persist(now_ms)

    @classmethod
    def become_leader(
        cls,
        directory: str,
        topic: str,
        partition: int,
        *,
        broker_id: int,
        replicas: Sequence[int],
        leader_epoch: int,
        epoch_start_offset: int,
        leader_log_end_offset: int,
        now_ms: int,
        isr: Iterable[int] | None = None,
        replica_lag_time_max_ms: int = 30_000,
        min_insync_replicas: int = 1,
        checkpoint_interval_ms: int = DEFAULT_CHECKPOINT_INTERVAL_MS,
    ) -> PartitionReplicaState:
        """This replica leads the partition in ``leader_epoch``: start from the replica-state file.

        The high watermark starts at the persisted one (clamped to the log end offset); the ISR is ``isr``
        if given (the promotion decided it), else the persisted ISR when it was persisted for this epoch or
        the one before, else just this replica.  The new state is written before this returns.
        """
        persisted = read_replica_state(directory)
        if persisted is not None and (persisted.topic, persisted.partition) != (topic, partition):
            raise CorruptRecordError(
                f"replica-state file {os.path.join(directory, REPLICA_STATE_FILE)}: it is for partition "
                f"{persisted.topic}-{persisted.partition}, expected {topic}-{partition}"
            )
        high_watermark = persisted.high_watermark if persisted is not None else 0
        if isr is None and persisted is not None and persisted.leader_id == broker_id:
            isr = persisted.isr
        return cls(topic, partition, broker_id=broker_id, replicas=replicas, leader_epoch=leader_epoch,
                   epoch_start_offset=epoch_start_offset, leader_log_end_offset=leader_log_end_offset,
                   high_watermark=high_watermark, isr=isr, now_ms=now_ms,
                   replica_lag_time_max_ms=replica_lag_time_max_ms, min_insync_replicas=min_insync_replicas,
                   directory=directory, checkpoint_interval_ms=checkpoint_interval_ms)

    # --- what callers read ----------------------------------------------------------------------------------
    @property
    def high_watermark(self) -> int:
        return self._high_watermark

    @property
    def isr(self) -> tuple[int, ...]:
        """In-sync replica ids, sorted, the leader's included."""
        return self._isr

    @property
    def replicas(self) -> tuple[int, ...]:
        return (self.broker_id, *self._followers)

    def follower(self, replica_id: int) -> FollowerState:
        """The follower's state (``NotLeaderError`` if ``replica_id`` is not an assigned follower)."""
        state = self._followers.get(replica_id)
        if state is None:
            raise NotLeaderError(
                f"partition {self.name}: replica {replica_id} is not one of its assigned followers "
                f"{sorted(self._followers)} (leader {self.broker_id}, epoch {self.leader_epoch})"
            )
        return state

    def status(self, leader_log_end_offset: int, now_ms: int) -> list[FollowerStatus]:
        out = []
        for f in self._followers.values():
            known = f.log_end_offset != UNKNOWN_OFFSET
            if known and f.log_end_offset >= leader_log_end_offset:
                lag_ms = 0
            else:
                lag_ms = -1 if f.last_caught_up_ms is None else now_ms - f.last_caught_up_ms
            out.append(FollowerStatus(
                f.replica_id, f.replica_id in self._isr, f.log_end_offset,
                leader_log_end_offset - f.log_end_offset if known else -1, lag_ms,
                -1 if f.last_fetch_ms is None else now_ms - f.last_fetch_ms,
            ))
        return out

    # --- produce checks -------------------------------------------------------------------------------------
    def append_error(self, acks: int) -> ErrorCode:
        """Before appending: NOT_ENOUGH_REPLICAS for acks=all while the ISR is smaller than
        ``min.insync.replicas`` (nothing may be appended then), else NONE.  The hot-path twin of
        :meth:`ensure_enough_replicas`."""
        if acks == ACKS_ALL and len(self._isr) < self.min_insync_replicas:
            return ErrorCode.NOT_ENOUGH_REPLICAS
        return ErrorCode.NONE

    def ensure_enough_replicas(self) -> None:
        """Raise :class:`NotEnoughReplicasError` if an acks=all write must be refused now."""
        if len(self._isr) < self.min_insync_replicas:
            raise NotEnoughReplicasError(
                f"partition {self.name}: {len(self._isr)} in-sync replicas {list(self._isr)}, "
                f"min.insync.replicas is {self.min_insync_replicas}; acks=all writes are refused"
            )

    def committed_ack_error(self) -> ErrorCode:
        """The code for an acks=all write the high watermark has passed: NONE, or
        NOT_ENOUGH_REPLICAS_AFTER_APPEND when the ISR shrank below ``min.insync.replicas`` meanwhile."""
        if len(self._isr) < self.min_insync_replicas:
            return ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND
        return ErrorCode.NONE

    # --- events ---------------------------------------------------------------------------------------------
    def follower_fetched(self, replica_id: int, fetch_offset: int, *, leader_log_end_offset: int, now_ms: int,
                         follower_log_start_offset: int = UNKNOWN_OFFSET) -> ReplicaUpdate:
        """A follower Fetch arrived (call it before reading, so the response carries the new high watermark).

        Raises :class:`NotLeaderError` for a replica that is not an assigned follower and
        :class:`OffsetOutOfRangeError` for a fetch offset past the leader's log end (answer the fetch with
        that error); then nothing changed.
        """
        follower = self.follower(replica_id)
        if fetch_offset > leader_log_end_offset or fetch_offset < 0:
            raise OffsetOutOfRangeError(
                f"partition {self.name}: follower {replica_id} fetches from offset {fetch_offset}, outside "
                f"[0, {leader_log_end_offset}] (the leader's log end offset)"
            )
        follower.record_fetch(fetch_offset, leader_log_end_offset, now_ms, follower_log_start_offset)
        isr_changed = False
        if (replica_id not in self._isr and fetch_offset >= self._high_watermark
                and fetch_offset >= self.epoch_start_offset):
            self._change_isr((*self._isr, replica_id), now_ms,
                             f"follower {replica_id} caught up to offset {fetch_offset} (high watermark "
                             f"{self._high_watermark}, epoch {self.leader_epoch} starts at "
                             f"{self.epoch_start_offset})")
            isr_changed = True
        return self._update(leader_log_end_offset, now_ms, isr_changed)

    def leader_log_end_changed(self, leader_log_end_offset: int, now_ms: int) -> ReplicaUpdate:
        """The leader appended (its LEO moved): with an ISR of one, or followers already there, the high
        watermark follows."""
        return self._update(leader_log_end_offset, now_ms, False)

    def maybe_shrink_isr(self, leader_log_end_offset: int, now_ms: int) -> ReplicaUpdate:
        """Remove followers not in sync for ``replica.lag.time.max.ms`` (run it every lag/2 or so)."""
        lag = self.replica_lag_time_max_ms
        out = [r for r in self._isr if r != self.broker_id
               and not self._followers[r].in_sync(leader_log_end_offset, now_ms, lag)]
        if not out:
            return self._update(leader_log_end_offset, now_ms, False)
        details = ", ".join(
            f"{r} (log end {self._followers[r].log_end_offset}, last caught up "
            + ("never" if self._followers[r].last_caught_up_ms is None
               else f"{now_ms - (self._followers[r].last_caught_up_ms or 0)} ms ago") + ")"
            for r in out
        )
        self._change_isr(tuple(r for r in self._isr if r not in out), now_ms,
                         f"out of sync for more than replica.lag.time.max.ms={lag}: {details}; leader "
                         f"log end {leader_log_end_offset}")
        return self._update(leader_log_end_offset, now_ms, True)

    def maybe_checkpoint(self, now_ms: int) -> bool:
        """Persist the high watermark if it moved and ``checkpoint_interval_ms`` has passed."""
        if (self._high_watermark != self._checkpointed_high_watermark
                and now_ms - self._last_checkpoint_ms >= self.checkpoint_interval_ms):
            return self._persist(now_ms)
        return False

    def close(self, now_ms: int) -> None:
        """Leadership ends (or the process stops): persist the latest high watermark."""
        if self._high_watermark != self._checkpointed_high_watermark:
            self._persist(now_ms)

    # --- inside ---------------------------------------------------------------------------------------------
    def _update(self, leader_log_end_offset: int, now_ms: int, isr_changed: bool) -> ReplicaUpdate:
        candidate = leader_log_end_offset
        lag = self.replica_lag_time_max_ms
        for replica_id, follower in self._followers.items():
            if replica_id in self._isr or follower.caught_up_within(now_ms, lag):
                candidate = min(candidate, follower.log_end_offset)
        advanced = candidate > self._high_watermark
        if advanced:
            self._high_watermark = candidate
        return ReplicaUpdate(self._high_watermark, advanced, self._isr, isr_changed)

    def _change_isr(self, isr: Iterable[int], now_ms: int, why: str) -> None:
        before = self._isr
        after = tuple(sorted(set(isr)))
        if not self._persist(now_ms, after):  # on disk first: a crash right after must not forget the change
            _log.warning("partition %s: ISR change from %s to %s put off: %s", self.name, list(before),
                         list(after), why)
            return
        self._isr = after
        verb = "expanded" if len(self._isr) > len(before) else "shrunk"
        _log.info("partition %s: ISR %s from %s to %s: %s", self.name, verb, list(before), list(self._isr),
                  why)

    def _persist(self, now_ms: int, isr: tuple[int, ...] | None = None) -> bool:
        """Write the replica state; False, with nothing changed, where the log dir is full (a later call
        tries again)."""
        if self.directory is not None:
            try:
                write_replica_state(self.directory, PersistedReplicaState(
                    self.topic, self.partition, self.broker_id, self.leader_epoch,
                    self._isr if isr is None else isr, self._high_watermark))
            except OSError as exc:
                if not is_disk_full(exc):
                    raise
                _log.warning("partition %s: cannot persist the replica state in %s: %s", self.name,
                             self.directory, describe_os_error(exc))
                self._last_checkpoint_ms = now_ms  # a checkpoint is tried again an interval later
                return False
        self._checkpointed_high_watermark = self._high_watermark
        self._last_checkpoint_ms = now_ms
        return True
