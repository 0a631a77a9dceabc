"""The follower fetcher against a real leader over loopback TCP: logs end byte-identical.

The leader is ``tiny_leader.TinyLeader``: the Kafka protocol through ``ipc.kafka``, records sent with
``sendfile`` from a real log directory, followers tracked by the real ``replicas.replica_state``.  The
follower is the real ``PartitionFetcher`` writing a real ``storage`` log, in a thread, or in a child
process that the test SIGKILLs.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from tiny_leader import TinyLeader

from ipc.kafka import ErrorCode
from replicas.fetcher import FetcherConfig, FetchPhase, PartitionFetcher, StepOutcome
from replicas.leader_connection import LeaderConnection, LeaderInfo, leader_from_metadata
from replicas.leader_epochs import begin_leader_epoch
from replicas.replica_state import read_replica_state
from storage.batch_builder import build_batch
from storage.disk_faults import DISK_FAULTS
from storage.log import Log
from storage.log_config import LogConfig
from storage.log_reader import LogReader

SMALL = LogConfig(segment_bytes=16 * 1024, index_interval_bytes=512, segment_index_bytes=4096)
TOPIC = "orders"
REPO = Path(__file__).resolve().parents[2]


def fast(**overrides: object) -> FetcherConfig:
    values: dict[str, object] = dict(
        broker_id=1,
        replica_fetch_max_bytes=4096,
        replica_fetch_wait_max_ms=50,
        replica_fetch_backoff_ms=10,
        request_timeout_ms=5000,
    )
    values.update(overrides)
    return FetcherConfig(**values)  # type: ignore[arg-type]


def append_batches(
    log: Log, count: int, *, epoch: int, seed: int, max_records: int = 4, max_value_bytes: int = 120
) -> None:
    rng = random.Random(seed)
    for i in range(count):
        values = [rng.randbytes(rng.randint(0, max_value_bytes)) for _ in range(rng.randint(1, max_records))]
        log.append(build_batch(values, timestamp_ms=1_700_000_000_000 + i), leader_epoch=epoch)


def segment_files(directory: Path) -> dict[str, bytes]:
    """Every .log file and the leader-epoch checkpoint, by name."""
    return {
        p.name: p.read_bytes()
        for p in sorted(directory.iterdir())
        if p.suffix == ".log" or p.name == "leader-epoch-checkpoint"
    }


def batches_from(directory: Path, start: int | None = None) -> list[bytes]:
    with LogReader(str(directory), SMALL, topic_partition=(TOPIC, 0)) as reader:
        return list(reader.batches(start))


def wait_until(condition: Callable[[], bool], timeout_s: float = 20.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


@contextlib.contextmanager
def running(fetcher: PartitionFetcher) -> Iterator[PartitionFetcher]:
    stop = threading.Event()
    thread = threading.Thread(target=fetcher.run, args=(stop,), daemon=True)
    thread.start()
    try:
        yield fetcher
    finally:
        stop.set()
        fetcher.close()
        thread.join(timeout=10)
        assert not thread.is_alive()


def step_until(fetcher: PartitionFetcher, done: Callable[[], bool], limit: int = 2000) -> list[StepOutcome]:
    outcomes = []
    for _ in range(limit):
        if done():
            return outcomes
        outcome = fetcher.step()
        outcomes.append(outcome)
        if outcome.backoff_ms:
            time.sleep(outcome.backoff_ms / 1000)
    raise AssertionError(f"not done after {limit} steps: {outcomes[-5:]}")


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    return tmp_path / "leader" / f"{TOPIC}-0", tmp_path / "follower" / f"{TOPIC}-0"


def test_follower_catches_up_byte_identical(dirs: tuple[Path, Path]) -> None:
    leader_dir, follower_dir = dirs
    with Log.open(leader_dir, SMALL) as leader_log:
        append_batches(leader_log, 400, epoch=0, seed=1)
        end = leader_log.log_end_offset
    assert len(list(leader_dir.glob("*.log"))) > 3  # several segments to roll through
    follower_hws: list[int] = []
    with TinyLeader(leader_epoch=0) as leader, Log.open(follower_dir, SMALL) as follower_log:
        entry = leader.lead(TOPIC, 0, str(leader_dir), replicas=[0, 1], isr=[0])
        leader.cut_at_max_bytes = True  # every answer ends in a partial batch, as Kafka's may
        fetcher = PartitionFetcher(follower_log, leader.info(), fast(), on_high_watermark=follower_hws.append)
        with running(fetcher):
            wait_until(lambda: fetcher.high_watermark == end, what="the follower's high watermark")
            wait_until(lambda: entry.state.isr == (0, 1), what="the follower to join the ISR")
        assert follower_log.log_end_offset == end
        assert entry.state.isr == (0, 1)
        assert entry.state.high_watermark == end
        assert entry.published_high_watermarks == sorted(entry.published_high_watermarks)
    assert follower_hws == sorted(set(follower_hws)) and follower_hws[-1] == end
    assert read_replica_state(str(follower_dir)).high_watermark == end  # type: ignore[union-attr]
    assert segment_files(follower_dir) == segment_files(leader_dir)
    assert batches_from(follower_dir) == batches_from(leader_dir)


def test_follower_keeps_up_with_live_appends_and_acks_all_complete(dirs: tuple[Path, Path]) -> None:
    leader_dir, follower_dir = dirs
    leader_log = Log.open(leader_dir, SMALL)
    with TinyLeader(leader_epoch=0) as leader, Log.open(follower_dir, SMALL) as follower_log:
        entry = leader.lead(TOPIC, 0, str(leader_dir), replicas=[0, 1], isr=[0, 1], min_insync_replicas=2)
        fetcher = PartitionFetcher(follower_log, leader.info(), fast(replica_fetch_max_bytes=1 << 20))
        with running(fetcher):
            rng = random.Random(7)
            for i in range(150):
                info = leader_log.append(build_batch([rng.randbytes(60)] * rng.randint(1, 5)), leader_epoch=0)
                with leader.lock:
                    assert entry.state.append_error(-1) == ErrorCode.NONE
                    entry.acks.add(
                        info.last_offset, last_offset=info.last_offset, deadline_ms=leader.clock_ms() + 20_000
                    )
                if i % 10 == 0:
                    time.sleep(0.01)
            end = leader_log.log_end_offset
            wait_until(lambda: entry.state.high_watermark == end and len(entry.acks) == 0, what="all acks")
        assert fetcher.log_end_offset == end
    leader_log.close()
    assert entry.published_high_watermarks == sorted(entry.published_high_watermarks)
    assert len(entry.completed) == 150
    for last_offset, error, positions in entry.completed:  # acknowledged only once the follower had it
        assert error == ErrorCode.NONE
        assert positions[1] > last_offset
    assert batches_from(follower_dir) == batches_from(leader_dir)


def test_divergent_follower_truncates_then_matches(dirs: tuple[Path, Path]) -> None:
    # KIP-101: the follower led epoch 1 briefly and wrote records nobody else got; the leader now leads
    # epoch 2 and wrote other records at those offsets.  The follower must drop its own and copy the leader's.
    leader_dir, follower_dir = dirs
    with Log.open(leader_dir, SMALL) as leader_log, Log.open(follower_dir, SMALL) as follower_log:
        append_batches(leader_log, 50, epoch=0, seed=2)
        for batch in leader_log.batches():
            follower_log.append_as_follower(batch)
        append_batches(follower_log, 30, epoch=1, seed=3)  # the old leader's unreplicated tail
        begin_leader_epoch(leader_log, 2)
        append_batches(leader_log, 40, epoch=2, seed=4)
        diverged_at = follower_log.leader_epoch_cache.entries[-1].start_offset
        assert follower_log.log_end_offset > diverged_at
    with TinyLeader(leader_epoch=2) as leader, Log.open(follower_dir, SMALL) as follower_log:
        leader.lead(TOPIC, 0, str(leader_dir), replicas=[0, 1], epoch_start_offset=diverged_at)
        fetcher = PartitionFetcher(follower_log, leader.info(), fast())
        outcomes = step_until(fetcher, lambda: fetcher.phase is FetchPhase.FETCHING)
        assert [o.action for o in outcomes] == ["truncated"]
        assert follower_log.log_end_offset == diverged_at
        end = LogReader(str(leader_dir), topic_partition=(TOPIC, 0)).log_end_offset
        step_until(fetcher, lambda: follower_log.log_end_offset == end)
        fetcher.close()
    assert segment_files(follower_dir) == segment_files(leader_dir)


def test_kip279_follower_needs_two_rounds_then_matches(dirs: tuple[Path, Path]) -> None:
    # Leader Y: epochs 0, 1, 3.  Follower X: epochs 0 (longer than Y's), 2.  X never saw epoch 1, Y never 2.
    leader_dir, follower_dir = dirs
    with Log.open(leader_dir, SMALL) as y, Log.open(follower_dir, SMALL) as x:
        append_batches(y, 20, epoch=0, seed=5)
        for batch in y.batches():
            x.append_as_follower(batch)
        append_batches(x, 10, epoch=0, seed=6)  # X led epoch 0 a little longer
        begin_leader_epoch(y, 1)
        append_batches(y, 15, epoch=1, seed=7)
        append_batches(x, 10, epoch=2, seed=8)  # X led epoch 2 while Y was away
        begin_leader_epoch(y, 3)
        append_batches(y, 15, epoch=3, seed=9)
        epoch1_start = y.leader_epoch_cache.entries[1].start_offset
    with TinyLeader(leader_epoch=3) as leader, Log.open(follower_dir, SMALL) as x:
        leader.lead(TOPIC, 0, str(leader_dir), replicas=[0, 1])
        fetcher = PartitionFetcher(x, leader.info(), fast())
        outcomes = step_until(fetcher, lambda: fetcher.phase is FetchPhase.FETCHING)
        assert [o.action for o in outcomes] == ["truncated", "truncated"]
        assert x.log_end_offset == epoch1_start
        end = LogReader(str(leader_dir), topic_partition=(TOPIC, 0)).log_end_offset
        step_until(fetcher, lambda: x.log_end_offset == end)
        fetcher.close()
    assert segment_files(follower_dir) == segment_files(leader_dir)


def test_former_leader_with_an_empty_latest_epoch_truncates_and_matches(dirs: tuple[Path, Path]) -> None:
    # X led epoch 1, was promoted again in epoch 3 (recorded at its log end) and died before appending;
    # Y led epochs 2 and 4.  X's epoch 3 holds no records: the rounds must get past it, not loop on it.
    leader_dir, follower_dir = dirs
    with Log.open(leader_dir, SMALL) as y, Log.open(follower_dir, SMALL) as x:
        append_batches(y, 10, epoch=0, seed=19)
        for batch in y.batches():
            x.append_as_follower(batch)
        append_batches(x, 10, epoch=1, seed=20)
        begin_leader_epoch(x, 3)
        begin_leader_epoch(y, 2)
        append_batches(y, 10, epoch=2, seed=21)
        begin_leader_epoch(y, 4)
        append_batches(y, 10, epoch=4, seed=22)
        common = x.leader_epoch_cache.entries[1].start_offset
        assert x.leader_epoch_cache.entries[-1].start_offset == x.log_end_offset  # (reopening would drop it)
        with TinyLeader(leader_epoch=4) as leader:
            leader.lead(TOPIC, 0, str(leader_dir), replicas=[0, 1])
            fetcher = PartitionFetcher(x, leader.info(), fast())
            outcomes = step_until(fetcher, lambda: fetcher.phase is FetchPhase.FETCHING, limit=10)
            assert [o.action for o in outcomes] == ["truncated", "truncated"]
            assert x.log_end_offset == common
            step_until(fetcher, lambda: x.log_end_offset == y.log_end_offset)
            fetcher.close()
    assert segment_files(follower_dir) == segment_files(leader_dir)


def test_leader_log_start_past_the_follower_restarts_it_there(dirs: tuple[Path, Path]) -> None:
    leader_dir, follower_dir = dirs
    with Log.open(leader_dir, SMALL) as leader_log:
        append_batches(leader_log, 300, epoch=0, seed=10)
        middle = leader_log.segments[3].base_offset + 1  # inside a batch: the follower starts at that batch
        leader_log.increment_log_start_offset(middle)
        start, end = leader_log.log_start_offset, leader_log.log_end_offset
    with TinyLeader(leader_epoch=0) as leader, Log.open(follower_dir, SMALL) as follower_log:
        leader.lead(TOPIC, 0, str(leader_dir), replicas=[0, 1])
        fetcher = PartitionFetcher(follower_log, leader.info(), fast())
        outcomes = step_until(fetcher, lambda: follower_log.log_end_offset == end)
        assert any("restarted at the leader's log start" in o.detail for o in outcomes)
        assert follower_log.log_start_offset == start
        fetcher.close()
    assert batches_from(follower_dir, start) == batches_from(leader_dir, start)


def test_fenced_follower_asks_again_and_follows_the_new_epoch(dirs: tuple[Path, Path]) -> None:
    leader_dir, follower_dir = dirs
    with Log.open(leader_dir, SMALL) as leader_log:
        append_batches(leader_log, 30, epoch=0, seed=11)
        begin_leader_epoch(leader_log, 3)
        append_batches(leader_log, 30, epoch=3, seed=12)
        end = leader_log.log_end_offset
    with TinyLeader(leader_epoch=3) as leader, Log.open(follower_dir, SMALL) as follower_log:
        leader.lead(TOPIC, 0, str(leader_dir), replicas=[0, 1])
        asked: list[LeaderInfo] = []

        def source() -> LeaderInfo:  # a stale view first (epoch 2), then the truth
            asked.append(leader.info()._replace(leader_epoch=2 if not asked else 3))
            return asked[-1]

        fetcher = PartitionFetcher(follower_log, source, fast())
        assert fetcher.step().detail == "the log is empty: nothing to truncate"
        fenced = fetcher.step()
        assert fenced.action == "backoff" and "Fetch from" in fenced.detail
        assert "epoch 2" in fenced.detail and "FENCED_LEADER_EPOCH" in fenced.detail
        assert fetcher.leader is not None and fetcher.leader.leader_epoch == 3
        assert fetcher.phase is FetchPhase.TRUNCATING  # a new epoch: truncate before fetching again
        step_until(fetcher, lambda: follower_log.log_end_offset == end)
        fetcher.close()
    assert segment_files(follower_dir) == segment_files(leader_dir)


def test_follower_ahead_of_the_leaders_epoch_waits(dirs: tuple[Path, Path]) -> None:
    leader_dir, follower_dir = dirs
    with Log.open(leader_dir, SMALL) as leader_log:
        append_batches(leader_log, 5, epoch=0, seed=13)
    with TinyLeader(leader_epoch=0) as leader, Log.open(follower_dir, SMALL) as follower_log:
        leader.lead(TOPIC, 0, str(leader_dir), replicas=[0, 1])
        fetcher = PartitionFetcher(follower_log, leader.info()._replace(leader_epoch=1), fast())
        follower_log.append_as_follower(next(iter(LogReader(str(leader_dir)).batches())))
        outcome = fetcher.step()  # the leader has not learned epoch 1 yet
        assert outcome.action == "backoff" and "UNKNOWN_LEADER_EPOCH" in outcome.detail
        fetcher.close()


def test_corrupt_answer_appends_nothing_and_is_fetched_again(dirs: tuple[Path, Path]) -> None:
    leader_dir, follower_dir = dirs
    with Log.open(leader_dir, SMALL) as leader_log:
        append_batches(leader_log, 40, epoch=0, seed=14)
        end = leader_log.log_end_offset
    with TinyLeader(leader_epoch=0) as leader, Log.open(follower_dir, SMALL) as follower_log:
        leader.lead(TOPIC, 0, str(leader_dir), replicas=[0, 1])
        fetcher = PartitionFetcher(follower_log, leader.info(), fast())
        step_until(fetcher, lambda: fetcher.phase is FetchPhase.FETCHING)
        leader.corrupt_next_fetch = True
        outcome = fetcher.step()
        assert outcome.action == "backoff"
        assert "stored CRC" in outcome.detail and "nothing of this answer was appended" in outcome.detail
        assert "Fetch answer from leader 127.0.0.1" in outcome.detail
        assert follower_log.log_end_offset == 0
        step_until(fetcher, lambda: follower_log.log_end_offset == end)
        fetcher.close()
    assert segment_files(follower_dir) == segment_files(leader_dir)


def test_stopped_follower_leaves_the_isr_and_rejoins(dirs: tuple[Path, Path]) -> None:
    lag_ms = 300
    leader_dir, follower_dir = dirs
    leader_log = Log.open(leader_dir, SMALL)
    append_batches(leader_log, 10, epoch=0, seed=15)
    with TinyLeader(leader_epoch=0) as leader, Log.open(follower_dir, SMALL) as follower_log:
        entry = leader.lead(
            TOPIC, 0, str(leader_dir), replicas=[0, 1], isr=[0, 1], lag_ms=lag_ms, min_insync_replicas=2
        )
        fetcher = PartitionFetcher(follower_log, leader.info(), fast())
        with running(fetcher):
            wait_until(lambda: entry.state.high_watermark == leader_log.log_end_offset, what="caught up")
        stopped_ms = leader.clock_ms()
        append_batches(leader_log, 5, epoch=0, seed=16)  # the leader moves on without it
        with leader.lock:
            assert entry.state.append_error(-1) == ErrorCode.NONE
            entry.acks.add("late", last_offset=leader_log.log_end_offset - 1, deadline_ms=stopped_ms + 20_000)
        wait_until(lambda: entry.state.isr == (0,), what="the ISR to shrink")
        assert leader.clock_ms() - stopped_ms >= lag_ms - 50  # not before the lag time (minus the last fetch)
        with leader.lock:
            assert entry.state.append_error(-1) == ErrorCode.NOT_ENOUGH_REPLICAS
            # The shrink let the HW pass it: answered, with NOT_ENOUGH_REPLICAS_AFTER_APPEND -- not silence.
            assert [(t, e) for t, e, _ in entry.completed if t == "late"] == [
                ("late", ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND)
            ]
        fetcher = PartitionFetcher(follower_log, leader.info(), fast())
        with running(fetcher):
            wait_until(lambda: entry.state.isr == (0, 1), what="the follower to rejoin")
            wait_until(lambda: fetcher.high_watermark == leader_log.log_end_offset, what="caught up again")
    leader_log.close()
    assert segment_files(follower_dir) == segment_files(leader_dir)


FOLLOWER_PROCESS = textwrap.dedent("""
    import sys, threading
    from storage.log import Log
    from storage.log_config import LogConfig
    from replicas.fetcher import FetcherConfig, PartitionFetcher
    from replicas.leader_connection import LeaderInfo
    config = LogConfig(segment_bytes=16384, index_interval_bytes=512, segment_index_bytes=4096)
    log = Log.open(sys.argv[1], config)
    fetching = FetcherConfig(broker_id=1, replica_fetch_max_bytes=2048, replica_fetch_wait_max_ms=50,
                           replica_fetch_backoff_ms=10)
    PartitionFetcher(log, LeaderInfo("127.0.0.1", int(sys.argv[2]), 0, 0), fetching).run(threading.Event())
""")


@pytest.mark.slow
def test_follower_killed_during_catch_up_resumes_and_matches(dirs: tuple[Path, Path]) -> None:
    leader_dir, follower_dir = dirs
    with Log.open(leader_dir, SMALL) as leader_log:
        append_batches(leader_log, 3000, epoch=0, seed=17, max_value_bytes=200)
        end = leader_log.log_end_offset
    with TinyLeader(leader_epoch=0) as leader:
        leader.lead(TOPIC, 0, str(leader_dir), replicas=[0, 1])
        follower_dir.mkdir(parents=True)
        child = subprocess.Popen(
            [sys.executable, "-c", FOLLOWER_PROCESS, str(follower_dir), str(leader.port)],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        try:

            def copied_bytes() -> int:
                return sum(p.stat().st_size for p in follower_dir.glob("*.log"))

            wait_until(
                lambda: copied_bytes() > 100_000 or child.poll() is not None, what="the catch-up to start"
            )
            assert child.poll() is None, "the follower process died on its own"
            os.kill(child.pid, signal.SIGKILL)
        finally:
            child.kill()
            child.wait()
        with LogReader(str(follower_dir), topic_partition=(TOPIC, 0)) as reader:
            assert 0 < reader.log_end_offset < end  # killed mid-way
        with Log.open(follower_dir, SMALL) as follower_log:  # recovery cuts any torn tail
            fetcher = PartitionFetcher(follower_log, leader.info(), fast(replica_fetch_max_bytes=1 << 20))
            with running(fetcher):
                wait_until(lambda: fetcher.log_end_offset == end, what="the restarted follower to catch up")
    assert batches_from(follower_dir) == batches_from(leader_dir)
    assert segment_files(follower_dir) == segment_files(leader_dir)


def test_sasl_plain_secret_is_required(dirs: tuple[Path, Path]) -> None:
    leader_dir, follower_dir = dirs
    with Log.open(leader_dir, SMALL) as leader_log:
        append_batches(leader_log, 10, epoch=0, seed=18)
        end = leader_log.log_end_offset
    with (
        TinyLeader(leader_epoch=0, sasl_plain=("replica", "s3cret")) as leader,
        Log.open(follower_dir, SMALL) as follower_log,
    ):
        leader.lead(TOPIC, 0, str(leader_dir), replicas=[0, 1])
        wrong = PartitionFetcher(follower_log, leader.info(), fast(sasl_plain=("replica", "guess")))
        outcome = wrong.step()
        assert (
            outcome.action == "backoff" and "SASL PLAIN authentication as 'replica' failed" in outcome.detail
        )
        wrong.close()
        assert follower_log.log_end_offset == 0
        right = PartitionFetcher(follower_log, leader.info(), fast(sasl_plain=("replica", "s3cret")))
        step_until(right, lambda: follower_log.log_end_offset == end)
        right.close()


def test_leader_from_metadata(dirs: tuple[Path, Path]) -> None:
    leader_dir, _ = dirs
    Log.open(leader_dir, SMALL).close()
    with TinyLeader(broker_id=4, leader_epoch=6) as leader:
        leader.lead(TOPIC, 0, str(leader_dir), replicas=[4, 1])
        with LeaderConnection.connect(leader.host, leader.port) as conn:
            assert leader_from_metadata(conn, TOPIC, 0) == LeaderInfo(leader.host, leader.port, 4, 6)
            assert leader_from_metadata(conn, TOPIC, 1) is None
            assert leader_from_metadata(conn, "other", 0) is None


def test_no_leader_and_unreachable_leader_back_off(dirs: tuple[Path, Path]) -> None:
    _, follower_dir = dirs
    with Log.open(follower_dir, SMALL) as follower_log:
        nobody = PartitionFetcher(follower_log, lambda: None, fast())
        assert nobody.step() == StepOutcome("backoff", 10, "no leader known for the partition")
        nobody.close()
        with TinyLeader() as gone:
            port = gone.port
        unreachable = PartitionFetcher(follower_log, LeaderInfo("127.0.0.1", port, 0, 0), fast())
        outcome = unreachable.step()
        assert outcome.action == "backoff" and "cannot connect: Connection refused" in outcome.detail
        unreachable.close()


def test_a_follower_whose_disk_is_full_backs_off_appends_nothing_then_catches_up(
        dirs: tuple[Path, Path]) -> None:
    """The follower's own disk fills (``storage.disk_faults``): each fetch answer is refused with
    KafkaStorageError, nothing of it is appended, the fetcher backs off and fetches again; with room again it
    catches up byte-identical."""
    leader_dir, follower_dir = dirs
    with Log.open(leader_dir, SMALL) as leader_log:
        append_batches(leader_log, 200, epoch=0, seed=3)
        end = leader_log.log_end_offset
    with TinyLeader(leader_epoch=0) as leader, Log.open(follower_dir, SMALL) as follower_log:
        leader.lead(TOPIC, 0, str(leader_dir), replicas=[0, 1], isr=[0])
        fetcher = PartitionFetcher(follower_log, leader.info(), fast())
        try:
            step_until(fetcher, lambda: follower_log.log_end_offset > 0)
            held = follower_log.log_end_offset
            DISK_FAULTS.arm("segment.write.torn", times=-1)
            try:
                outcomes = [fetcher.step() for _ in range(5)]
            finally:
                DISK_FAULTS.disarm()
            refused = [o for o in outcomes if o.action == "backoff" and "KAFKA_STORAGE_ERROR" in o.detail]
            assert refused, outcomes
            assert follower_log.log_end_offset == held
            step_until(fetcher, lambda: follower_log.log_end_offset == end)
        finally:
            fetcher.close()
    assert segment_files(follower_dir) == segment_files(leader_dir)
