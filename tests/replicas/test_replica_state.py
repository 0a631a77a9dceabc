"""Leader-side replica state against an oracle: follower positions, ISR by lag time, the high watermark.

The oracle keeps every follower's fetch history and recomputes from it, the plain way, when each follower
was last caught up (Kafka's rule), who is in sync, and the high watermark (the smallest LEO among the
leader, the ISR and followers caught up within the lag time, never going back).  The clock is a number the
test moves.  The replica-state file is real and re-read after every ISR change.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from ipc.kafka import ErrorCode
from replicas.replica_state import (
    REPLICA_STATE_FILE,
    PartitionReplicaState,
    PersistedReplicaState,
    read_replica_state,
    write_replica_state,
)
from storage.disk_faults import DISK_FAULTS
from storage.errors import CorruptRecordError, NotEnoughReplicasError, NotLeaderError, OffsetOutOfRangeError

LEADER = 0
FOLLOWERS = (1, 2, 3)
LAG_MS = 100
SHM = "/dev/shm" if os.path.isdir("/dev/shm") else None  # fsync is free there; the file is still real


@dataclass
class Fetch:
    time_ms: int
    offset: int
    leader_log_end_offset: int


@dataclass
class OracleFollower:
    fetches: list[Fetch] = field(default_factory=list)
    caught_up_at_start: int | None = None  # ISR members start caught up when the leader takes over

    @property
    def log_end_offset(self) -> int:
        return self.fetches[-1].offset if self.fetches else -1

    def last_caught_up_ms(self) -> int | None:
        times = [] if self.caught_up_at_start is None else [self.caught_up_at_start]
        for i, f in enumerate(self.fetches):
            if f.offset >= f.leader_log_end_offset:
                times.append(f.time_ms)
            elif i > 0 and f.offset >= self.fetches[i - 1].leader_log_end_offset:
                times.append(self.fetches[i - 1].time_ms)
        return max(times) if times else None


class ReplicaStateMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self._dir = tempfile.TemporaryDirectory(dir=SHM)
        self.directory = self._dir.name

    def teardown(self) -> None:
        self._dir.cleanup()

    @initialize(
        start_isr=st.sets(st.sampled_from(FOLLOWERS)),
        leo=st.integers(0, 50),
        min_isr=st.integers(1, 4),
        epoch_start=st.integers(0, 50),
    )
    def start(self, start_isr: set[int], leo: int, min_isr: int, epoch_start: int) -> None:
        self.now = 1000
        self.leader_leo = leo
        self.epoch_start = min(epoch_start, leo)
        self.min_isr = min_isr
        self.isr = {LEADER, *start_isr}
        self.hw = 0
        self.followers = {
            r: OracleFollower(caught_up_at_start=self.now if r in start_isr else None) for r in FOLLOWERS
        }
        self.state = PartitionReplicaState(
            "t",
            0,
            broker_id=LEADER,
            replicas=[LEADER, *FOLLOWERS],
            leader_epoch=4,
            epoch_start_offset=self.epoch_start,
            leader_log_end_offset=leo,
            high_watermark=0,
            isr=sorted(start_isr),
            now_ms=self.now,
            replica_lag_time_max_ms=LAG_MS,
            min_insync_replicas=min_isr,
            directory=self.directory,
        )
        self.published = [self.state.high_watermark]

    # --- the oracle's rules ---------------------------------------------------------------------------------
    def oracle_high_watermark(self) -> int:
        candidates = [self.leader_leo]
        for r, f in self.followers.items():
            caught_up = f.last_caught_up_ms()
            if r in self.isr or (caught_up is not None and self.now - caught_up <= LAG_MS):
                candidates.append(f.log_end_offset)
        return max(self.hw, min(candidates))

    def in_sync(self, r: int) -> bool:
        f = self.followers[r]
        caught_up = f.last_caught_up_ms()
        return f.log_end_offset == self.leader_leo or (
            caught_up is not None and self.now - caught_up <= LAG_MS
        )

    def check(self, update_hw: int, advanced: bool, isr_changed_expected: bool, isr_changed: bool) -> None:
        expected = self.oracle_high_watermark()
        assert update_hw == expected == self.state.high_watermark
        assert advanced == (expected > self.hw)
        assert isr_changed == isr_changed_expected
        self.hw = expected
        self.published.append(update_hw)

    # --- events ---------------------------------------------------------------------------------------------
    @rule(dt=st.integers(0, 3 * LAG_MS))
    def clock(self, dt: int) -> None:
        self.now += dt

    @rule(records=st.integers(1, 20))
    def leader_appends(self, records: int) -> None:
        self.leader_leo += records
        update = self.state.leader_log_end_changed(self.leader_leo, self.now)
        self.check(update.high_watermark, update.high_watermark_advanced, False, update.isr_changed)

    @rule(r=st.sampled_from(FOLLOWERS), data=st.data())
    def follower_fetches(self, r: int, data: st.DataObject) -> None:
        f = self.followers[r]
        low = max(0, f.log_end_offset)
        # Boundaries make the interesting cases likely: exactly at the leader's end now or at its previous
        # fetch (the "caught up as of the previous fetch" rule), at the high watermark, at the epoch start.
        edges = [
            o
            for o in (
                low,
                self.leader_leo,
                self.hw,
                self.epoch_start,
                f.fetches[-1].leader_log_end_offset if f.fetches else low,
            )
            if low <= o <= self.leader_leo
        ]
        offset = data.draw(st.one_of(st.sampled_from(edges), st.integers(low, self.leader_leo)))
        f.fetches.append(Fetch(self.now, offset, self.leader_leo))
        joins = r not in self.isr and offset >= self.hw and offset >= self.epoch_start
        if joins:
            self.isr.add(r)
        update = self.state.follower_fetched(
            r, offset, leader_log_end_offset=self.leader_leo, now_ms=self.now
        )
        self.check(update.high_watermark, update.high_watermark_advanced, joins, update.isr_changed)

    @rule()
    def shrink_check(self) -> None:
        leaving = {r for r in self.isr if r != LEADER and not self.in_sync(r)}
        self.isr -= leaving
        update = self.state.maybe_shrink_isr(self.leader_leo, self.now)
        self.check(update.high_watermark, update.high_watermark_advanced, bool(leaving), update.isr_changed)

    @precondition(lambda self: hasattr(self, "state"))
    @rule(r=st.sampled_from(FOLLOWERS))
    def fetch_past_the_log_end_is_refused(self, r: int) -> None:
        before = (self.state.high_watermark, self.state.isr, self.state.follower(r).log_end_offset)
        with pytest.raises(OffsetOutOfRangeError, match=f"follower {r} fetches from offset"):
            self.state.follower_fetched(
                r, self.leader_leo + 1, leader_log_end_offset=self.leader_leo, now_ms=self.now
            )
        assert (self.state.high_watermark, self.state.isr, self.state.follower(r).log_end_offset) == before

    # --- invariants -----------------------------------------------------------------------------------------
    @invariant()
    def agrees_with_the_oracle(self) -> None:
        if not hasattr(self, "state"):
            return
        assert set(self.state.isr) == self.isr
        assert LEADER in self.state.isr
        assert self.state.high_watermark <= self.leader_leo
        for r in self.isr - {LEADER}:  # everything below the HW is on every ISR member (that told us)
            if self.followers[r].fetches:
                assert self.followers[r].log_end_offset >= self.state.high_watermark
        assert self.published == sorted(self.published)  # never backwards
        enough = len(self.isr) >= self.min_isr
        assert self.state.append_error(-1) == (ErrorCode.NONE if enough else ErrorCode.NOT_ENOUGH_REPLICAS)
        assert self.state.append_error(1) == ErrorCode.NONE
        assert self.state.committed_ack_error() == (
            ErrorCode.NONE if enough else ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND
        )
        persisted = read_replica_state(self.directory)
        assert persisted is not None and set(persisted.isr) == self.isr and persisted.leader_epoch == 4


TestReplicaState = ReplicaStateMachine.TestCase
TestReplicaState.settings = settings(max_examples=120, stateful_step_count=40, deadline=None)


# --- examples a user would recognise ------------------------------------------------------------------------


def leader(tmp_path: Path, **overrides: object) -> PartitionReplicaState:
    args: dict[str, object] = dict(
        broker_id=0,
        replicas=[0, 1, 2],
        leader_epoch=1,
        epoch_start_offset=0,
        leader_log_end_offset=0,
        now_ms=0,
        replica_lag_time_max_ms=1000,
        min_insync_replicas=2,
    )
    args.update(overrides)
    return PartitionReplicaState.become_leader(str(tmp_path), "orders", 3, **args)  # type: ignore[arg-type]


def test_follower_that_stops_fetching_leaves_the_isr_after_the_lag_time(tmp_path: Path) -> None:
    state = leader(tmp_path, isr=[0, 1, 2])
    state.follower_fetched(1, 0, leader_log_end_offset=0, now_ms=10)
    state.follower_fetched(2, 0, leader_log_end_offset=0, now_ms=10)
    assert state.leader_log_end_changed(100, 20).high_watermark == 0  # the followers have nothing yet
    state.follower_fetched(1, 100, leader_log_end_offset=100, now_ms=30)
    assert state.maybe_shrink_isr(100, 1010).isr == (0, 1, 2)  # follower 2 last caught up at 10: 1000 ms ago
    update = state.maybe_shrink_isr(100, 1011)
    assert (update.isr, update.isr_changed, update.high_watermark, update.high_watermark_advanced) == (
        (0, 1),
        True,
        100,
        True,
    )
    assert state.append_error(-1) == ErrorCode.NONE
    assert state.maybe_shrink_isr(100, 5000).isr == (0, 1)  # at the leader's end, idle: still in sync
    update = state.maybe_shrink_isr(150, 5000)  # the leader moved on 4970 ms after follower 1 caught up
    assert (update.isr, update.high_watermark) == ((0,), 150)
    assert state.append_error(-1) == ErrorCode.NOT_ENOUGH_REPLICAS
    with pytest.raises(
        NotEnoughReplicasError, match=r"orders-3: 1 in-sync replicas \[0\], min.insync.replicas is 2"
    ):
        state.ensure_enough_replicas()
    # Follower 2 comes back: below the high watermark it stays out; once there it rejoins.
    assert state.follower_fetched(2, 120, leader_log_end_offset=150, now_ms=6000).isr == (0,)
    update = state.follower_fetched(2, 150, leader_log_end_offset=150, now_ms=6001)
    assert (update.isr, update.isr_changed) == ((0, 2), True)
    assert read_replica_state(str(tmp_path)) == PersistedReplicaState("orders", 3, 0, 1, (0, 2), 150)


def test_idle_partition_keeps_an_idle_follower_in_sync(tmp_path: Path) -> None:
    state = leader(tmp_path, isr=[0, 1])
    state.follower_fetched(1, 0, leader_log_end_offset=0, now_ms=0)
    assert state.maybe_shrink_isr(0, 60_000).isr == (0, 1)  # at the leader's end: nothing to lag behind


def test_follower_behind_the_epoch_start_does_not_join(tmp_path: Path) -> None:
    # The follower holds everything committed (>= HW) but not yet the start of this leader's epoch: it may
    # still hold records of an older leader that this epoch replaced, so it stays out.
    state = leader(tmp_path, isr=[0, 2], epoch_start_offset=50, leader_log_end_offset=60)
    update = state.follower_fetched(1, 40, leader_log_end_offset=60, now_ms=1)
    assert (update.isr, update.high_watermark) == ((0, 2), 0)  # held at 0 by follower 2 (position unknown)
    assert state.follower_fetched(1, 50, leader_log_end_offset=60, now_ms=2).isr == (0, 1, 2)


def test_caught_up_follower_outside_the_isr_holds_the_high_watermark_back(tmp_path: Path) -> None:
    # KAFKA-7128: a follower catching up from behind the high watermark is waited for once it is caught up
    # (within the lag time); otherwise the HW would run ahead with the leader's LEO and it could never join.
    write_replica_state(str(tmp_path), PersistedReplicaState("orders", 3, 0, 1, (0,), 10))
    state = leader(tmp_path, isr=[0], leader_log_end_offset=10)
    assert state.follower_fetched(2, 0, leader_log_end_offset=10, now_ms=0).isr == (0,)  # 0 < HW 10
    assert state.leader_log_end_changed(20, 0).high_watermark == 20  # nobody to wait for
    update = state.follower_fetched(2, 10, leader_log_end_offset=20, now_ms=1)  # caught up as of t=0
    assert (update.isr, state.follower(2).last_caught_up_ms) == ((0,), 0)
    assert state.leader_log_end_changed(30, 2).high_watermark == 20  # waits for follower 2 (at 10)
    update = state.follower_fetched(2, 20, leader_log_end_offset=30, now_ms=3)
    assert (update.isr, update.high_watermark) == ((0, 2), 20)
    assert state.follower_fetched(2, 30, leader_log_end_offset=30, now_ms=4).high_watermark == 30


def test_status_shows_lag_in_records_and_milliseconds(tmp_path: Path) -> None:
    state = leader(tmp_path, isr=[0, 1, 2])
    state.follower_fetched(1, 0, leader_log_end_offset=0, now_ms=100)
    state.follower_fetched(1, 40, leader_log_end_offset=50, now_ms=300)
    status = {s.replica_id: s for s in state.status(50, 700)}
    assert status[1] == status[1]._replace(
        in_isr=True, log_end_offset=40, lag_records=10, lag_ms=600, last_fetch_ms_ago=400
    )
    assert (status[2].log_end_offset, status[2].lag_records, status[2].last_fetch_ms_ago) == (-1, -1, -1)


def test_unknown_replica_is_refused(tmp_path: Path) -> None:
    state = leader(tmp_path)
    with pytest.raises(NotLeaderError, match=r"replica 7 is not one of its assigned followers \[1, 2\]"):
        state.follower_fetched(7, 0, leader_log_end_offset=0, now_ms=0)


def test_new_leader_starts_from_the_persisted_isr_and_high_watermark(tmp_path: Path) -> None:
    state = leader(tmp_path, isr=[0, 1], leader_log_end_offset=30)
    state.follower_fetched(1, 30, leader_log_end_offset=30, now_ms=5)
    assert state.high_watermark == 30
    state.close(6)
    again = leader(tmp_path, leader_epoch=2, leader_log_end_offset=25)  # its log was cut meanwhile
    assert (again.isr, again.high_watermark, again.leader_epoch) == ((0, 1), 25, 2)
    # Until follower 1 fetches from this leader its position is unknown: the HW must not move.
    assert again.leader_log_end_changed(40, 10).high_watermark == 25
    assert again.follower_fetched(1, 40, leader_log_end_offset=40, now_ms=11).high_watermark == 40


def test_promoted_follower_ignores_another_leaders_isr(tmp_path: Path) -> None:
    write_replica_state(str(tmp_path), PersistedReplicaState("orders", 3, 5, 3, (5, 0, 1), 70))
    state = leader(tmp_path, leader_epoch=4, leader_log_end_offset=80)
    assert (state.isr, state.high_watermark) == ((0,), 70)
    promoted = leader(tmp_path, leader_epoch=5, leader_log_end_offset=80, isr=[0, 1])
    assert promoted.isr == (0, 1)


def test_checkpoint_is_periodic(tmp_path: Path) -> None:
    state = leader(tmp_path, isr=[0], checkpoint_interval_ms=1000)
    state.leader_log_end_changed(10, 1)
    assert not state.maybe_checkpoint(500)
    assert read_replica_state(str(tmp_path)).high_watermark == 0  # type: ignore[union-attr]
    assert state.maybe_checkpoint(1000)
    assert read_replica_state(str(tmp_path)).high_watermark == 10  # type: ignore[union-attr]
    assert not state.maybe_checkpoint(5000)  # nothing moved


def test_file_for_another_partition_is_refused(tmp_path: Path) -> None:
    write_replica_state(str(tmp_path), PersistedReplicaState("payments", 3, 0, 1, (0,), 0))
    with pytest.raises(CorruptRecordError, match="it is for partition payments-3, expected orders-3"):
        leader(tmp_path)


GOOD = (
    b'{"version": 1, "topic": "t", "partition": 0, "leader_id": 0, "leader_epoch": 2, "isr": [0, 1], '
    b'"high_watermark": 5}\n'
)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "not a JSON document"),
        (b"\xff\xfe", "not a JSON document"),
        (b"[1, 2]", "expected a JSON object, found list"),
        (GOOD.replace(b'"version": 1', b'"version": 9'), "version 9, expected 1"),
        (GOOD.replace(b'"isr": [0, 1]', b'"isr": [0, 0]'), "field 'isr' is \\[0, 0\\]"),
        (GOOD.replace(b'"isr": [0, 1]', b'"isr": [0, true]'), "field 'isr'"),
        (GOOD.replace(b'"isr": [0, 1]', b'"isr": "0,1"'), "field 'isr' is '0,1', expected a list"),
        (
            GOOD.replace(b'"high_watermark": 5', b'"high_watermark": -5'),
            "'high_watermark' is -5, expected at least 0",
        ),
        (GOOD.replace(b', "leader_epoch": 2', b""), "field 'leader_epoch' is missing"),
        (
            GOOD.replace(b'"partition": 0', b'"partition": "0"'),
            "field 'partition' is '0', expected an integer",
        ),
    ],
)
def test_malformed_replica_state_file(tmp_path: Path, content: bytes, message: str) -> None:
    (tmp_path / REPLICA_STATE_FILE).write_bytes(content)
    with pytest.raises(CorruptRecordError, match=message) as caught:
        read_replica_state(str(tmp_path))
    assert str(tmp_path / REPLICA_STATE_FILE) in str(caught.value)


def test_replica_state_file_truncated_anywhere_is_refused(tmp_path: Path) -> None:
    (tmp_path / REPLICA_STATE_FILE).write_bytes(GOOD)
    assert read_replica_state(str(tmp_path)) == PersistedReplicaState("t", 0, 0, 2, (0, 1), 5)
    for cut in range(len(GOOD.rstrip())):
        (tmp_path / REPLICA_STATE_FILE).write_bytes(GOOD[:cut])
        with pytest.raises(CorruptRecordError):
            read_replica_state(str(tmp_path))
    (tmp_path / REPLICA_STATE_FILE).write_bytes(GOOD.rstrip() + b" {}")
    with pytest.raises(CorruptRecordError, match="not a JSON document"):
        read_replica_state(str(tmp_path))


def test_a_full_disk_puts_off_isr_changes_and_checkpoints_without_raising(tmp_path: Path) -> None:
    """The replica state's file cannot be written (its log dir is full): an ISR change is put off (the ISR
    stays as persisted), a high-watermark checkpoint is skipped; with room again both happen."""
    state = leader(tmp_path, isr=[0, 1, 2])
    state.follower_fetched(1, 0, leader_log_end_offset=0, now_ms=10)
    state.follower_fetched(2, 0, leader_log_end_offset=0, now_ms=10)
    DISK_FAULTS.arm("checkpoint.write", times=-1)
    try:
        assert state.maybe_shrink_isr(100, 2000).isr == (0, 1, 2)  # both out of sync: not persisted, kept
        assert not state.maybe_checkpoint(10_000)
    finally:
        DISK_FAULTS.disarm()
    assert read_replica_state(str(tmp_path)) == PersistedReplicaState("orders", 3, 0, 1, (0, 1, 2), 0)
    assert state.maybe_shrink_isr(100, 2001).isr == (0,)
    assert read_replica_state(str(tmp_path)) == PersistedReplicaState("orders", 3, 0, 1, (0,), 0)
    assert state.maybe_checkpoint(20_000)
    assert read_replica_state(str(tmp_path)) == PersistedReplicaState("orders", 3, 0, 1, (0,), 100)
