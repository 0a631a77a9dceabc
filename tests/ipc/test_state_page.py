"""The partition state page: fields seen across mappings and processes, the seqlock under contention."""

from __future__ import annotations

import multiprocessing
import multiprocessing.synchronize
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ipc.shm import SharedSegment, ShmNames, reclaim
from ipc.state_page import (
    MAX_REPLICA_ROWS,
    NO_LEADER_EPOCH,
    STATE_PAGE,
    STATE_PAGE_BYTES,
    ReplicaRow,
    StatePage,
    monotonic_ms,
)
from storage.errors import CorruptRecordError, RequestTimeoutError

FORK = multiprocessing.get_context("fork")


@pytest.fixture
def page(tmp_path: Path) -> Iterator[StatePage]:
    names = ShmNames.for_data_dir(tmp_path)
    page = StatePage.create(names.state_page("orders", 3))
    yield page
    page.close()
    reclaim(names.instance)


def test_a_new_page_has_zero_offsets_and_no_epoch(page: StatePage) -> None:
    assert page.snapshot() == {
        "log_end_offset": 0,
        "high_watermark": 0,
        "log_start_offset": 0,
        "leader_epoch": NO_LEADER_EPOCH,
        "epoch_start_offset": 0,
        "writer_pid": 0,
        "writer_busy_ms": 0,
        "committed_high_watermark": -1,  # not replicated: one in-sync replica, min.insync.replicas 1
        "isr_size": 1,
        "min_insync_replicas": 1,
    }
    assert page.enough_replicas()
    assert page.replicas() == []
    assert STATE_PAGE.itemsize == STATE_PAGE_BYTES


def test_replica_fields_and_the_replica_table_cross_mappings(page: StatePage) -> None:
    reader = StatePage.attach(page.name)
    page.committed_high_watermark = 120
    page.isr_size = 1
    page.min_insync_replicas = 2
    assert (reader.committed_high_watermark, reader.isr_size, reader.min_insync_replicas) == (120, 1, 2)
    assert not reader.enough_replicas()
    rows = [ReplicaRow(1, True, 120, 5_000, 5_001), ReplicaRow(2, False, -1, -1, -1)]
    page.publish_replicas(rows)
    assert reader.replicas() == rows
    many = [ReplicaRow(i, False, i, i, i) for i in range(1, MAX_REPLICA_ROWS + 5)]
    page.publish_replicas(many)
    assert reader.replicas() == many[:MAX_REPLICA_ROWS]  # the table holds what fits
    page.publish_replicas([])
    assert reader.replicas() == []
    reader.close()


def test_fields_written_through_one_mapping_are_read_through_another(page: StatePage) -> None:
    reader = StatePage.attach(page.name)
    page.log_end_offset = 1_000_000_007
    page.high_watermark = 999
    page.log_start_offset = 17
    page.set_leader_epoch(4, 900)
    assert (reader.log_end_offset, reader.high_watermark, reader.log_start_offset) == (1_000_000_007, 999, 17)
    assert reader.leader_epoch() == (4, 900)
    page.log_end_offset = 2**62
    assert reader.log_end_offset == 2**62
    reader.close()
    reader.close()


def test_writer_liveness_needs_a_live_pid_and_no_endless_round(page: StatePage) -> None:
    assert not page.writer_alive(stale_after_ms=1000)  # nobody claimed it
    page.claim_writer()
    assert page.writer_pid == os.getpid() and page.writer_alive(stale_after_ms=1000)
    page.writer_busy(now_ms=monotonic_ms() - 5000)
    assert not page.writer_alive(stale_after_ms=1000)  # alive, but busy in one round for 5 s
    now = monotonic_ms()
    page.writer_asleep(now_ms=now - min(3_600_000, now - 1))  # the clock starts at boot: at most that long
    assert page.writer_alive(stale_after_ms=1000), "asleep for an hour is healthy"
    assert page.writer_busy_ms < 0
    page.writer_busy()
    assert page.writer_alive(stale_after_ms=1000)


def _claim_then_hang(name: str, ready: multiprocessing.synchronize.Event) -> None:
    page = StatePage.attach(name)
    page.claim_writer()
    ready.set()
    signal.pause()


def test_a_sigkilled_writer_is_seen_dead_by_pid(page: StatePage) -> None:
    ready = FORK.Event()
    writer = FORK.Process(target=_claim_then_hang, args=(page.name, ready))
    writer.start()
    assert ready.wait(20)
    assert page.writer_pid == writer.pid and page.writer_alive(stale_after_ms=60_000)
    writer.kill()
    writer.join()
    assert not page.writer_alive(stale_after_ms=60_000)


def _hammer(name: str, seconds: float, go: multiprocessing.synchronize.Event) -> None:
    page = StatePage.attach(name)
    go.wait()
    deadline = time.monotonic() + seconds
    epoch = 0
    while time.monotonic() < deadline:
        for _ in range(100):
            epoch += 1
            page.set_leader_epoch(epoch, epoch * 7 + 3)
            page.log_end_offset = epoch
    page.close()


def test_seqlock_pairs_and_offsets_are_never_torn_under_contention(page: StatePage) -> None:
    go = FORK.Event()
    writer = FORK.Process(target=_hammer, args=(page.name, 1.0, go))
    writer.start()
    reader = StatePage.attach(page.name)
    reads = 0
    last_epoch, last_end = NO_LEADER_EPOCH, 0
    try:
        go.set()
        while writer.is_alive() or reads == 0:
            epoch, start_offset = reader.leader_epoch()
            end = reader.log_end_offset
            if epoch > 0:
                assert start_offset == epoch * 7 + 3  # the pair always belongs together
            assert epoch >= last_epoch and end >= last_end  # published values never go back
            last_epoch, last_end = epoch, end
            reads += 1
        writer.join()
        assert writer.exitcode == 0
        final = reader.log_end_offset  # the writer has exited: nothing moves any more
        assert final >= last_end and reader.leader_epoch() == (final, final * 7 + 3)
        assert reads > 1000
    finally:
        reader.close()
        if writer.is_alive():
            writer.kill()
            writer.join()


def test_a_writer_that_died_mid_update_is_repaired_by_its_successor(page: StatePage) -> None:
    page.set_leader_epoch(1, 10)
    words = SharedSegment.open(page.name)
    sequence = words.buf[:STATE_PAGE_BYTES].cast("q")
    seqlock_word = STATE_PAGE.fields["epoch_seqlock"][1] // 8  # type: ignore[index]
    sequence[seqlock_word] += 1  # odd: a writer died between its two seqlock stores
    started = time.monotonic()
    with pytest.raises(RequestTimeoutError, match=rf"state page {page.name}: leader epoch seqlock"):
        page.leader_epoch()
    assert time.monotonic() - started < 2.0
    page.set_leader_epoch(2, 20)  # the successor's first write makes it consistent again
    assert page.leader_epoch() == (2, 20)
    assert sequence[seqlock_word] % 2 == 0
    sequence.release()
    words.close()


def test_attaching_something_that_is_not_a_state_page_is_refused(tmp_path: Path) -> None:
    names = ShmNames.for_data_dir(tmp_path)
    try:
        SharedSegment.create(names.state_page("t", 0), STATE_PAGE_BYTES).close()
        with pytest.raises(CorruptRecordError, match=r"magic 0x00000000 version 0, expected 0x5453414c"):
            StatePage.attach(names.state_page("t", 0))
        SharedSegment.create(names.state_page("t", 1), 64).close()
        with pytest.raises(CorruptRecordError, match="64 bytes, expected 4096"):
            StatePage.attach(names.state_page("t", 1))
        with pytest.raises(FileExistsError):
            StatePage.create(names.state_page("t", 0))
    finally:
        reclaim(names.instance)
