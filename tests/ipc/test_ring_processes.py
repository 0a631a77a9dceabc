"""Rings between real processes: round trips, producers and writers SIGKILLed at random moments,
back-pressure released by another process, many producers on one doorbell, idle CPU."""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import resource
import secrets
import signal
import struct
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ipc.ring import RingConsumer, RingNames, RingProducer, create_ring, unlink_ring, wait_for_frames, warm_up
from ipc.ring_layout import PRODUCER_STATE_CLOSED
from ipc.shm import ShmNames, list_objects, reclaim
from ipc.wakeup import Doorbell, Waiter
from storage.errors import BackPressureError

FORK = multiprocessing.get_context("fork")
POOL = np.random.default_rng(3).integers(0, 256, 1 << 20, dtype=np.uint8).tobytes()
LOG_RECORD = struct.Struct("<qI")  # seq, body length: the test writer's "log" records

warm_up()  # children are forked with the kernels loaded, as the supervisor does


@contextmanager
def instance() -> Iterator[ShmNames]:
    names = ShmNames(secrets.token_hex(8))
    Doorbell.create(names.doorbell("orders", 0)).close()
    try:
        yield names
    finally:
        reclaim(names.instance)
        assert list_objects(names.instance) == ([], [])


def new_ring(names: ShmNames, producer: int, capacity_bytes: int, ack_slots: int = 1024) -> RingNames:
    ring = RingNames.for_producer(names, "orders", 0, producer)
    create_ring(ring, capacity_bytes=capacity_bytes, ack_slots=ack_slots)
    return ring


def intended(seed: int, seq: int, max_size: int) -> bytes:
    """The body a producer of ``seed`` sends as frame ``seq``: its seq, then a slice of POOL."""
    mix = (seed * 1_000_003 + seq * 7919 + 12345) * 2654435761
    size = mix % (max_size + 1)
    offset = (mix >> 20) % (len(POOL) - max_size)
    return struct.pack("<q", seq) + POOL[offset : offset + size]


def wait_readable(connection: multiprocessing.connection.Connection, what: str) -> object:
    assert connection.poll(30), f"timed out waiting for {what}"
    return connection.recv()


@contextmanager
def child(target: object, *args: object) -> Iterator[multiprocessing.Process]:
    process = FORK.Process(target=target, args=args)  # type: ignore[arg-type]
    process.start()
    try:
        yield process  # type: ignore[misc]
    finally:
        if process.is_alive():
            process.kill()
        process.join()


# -- round trip across processes ----------------------------------------------------------------------------


def _send_sizes(ring: RingNames, sizes: list[int], report: multiprocessing.connection.Connection) -> None:
    producer = RingProducer.attach(ring, max_block_ms=10_000)
    for seq, size in enumerate(sizes):
        producer.send(intended(0, seq, size)[: size + 8])
    assert producer.wait_acks(len(sizes) - 1, 10_000) if sizes else True
    first, results = producer.poll_acks()
    report.send((first, results.tolist()))
    producer.close()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sizes=st.lists(st.one_of(st.integers(0, 100), st.integers(1000, 3000)), max_size=300),
    budgets=st.lists(st.integers(1, 20_000), min_size=1, max_size=10),
)
def test_frames_cross_processes_in_order_and_whole(sizes: list[int], budgets: list[int]) -> None:
    with instance() as names:
        ring = new_ring(names, 1, capacity_bytes=8192, ack_slots=64)
        consumer = RingConsumer.attach(ring)
        waiter = Waiter(Doorbell.open(ring.doorbell))
        report, report_end = FORK.Pipe(duplex=False)
        received: list[bytes] = []
        with child(_send_sizes, ring, sizes, report_end) as producer:
            step = 0
            while len(received) < len(sizes):
                chunk = consumer.peek(budgets[step % len(budgets)])
                step += 1
                if chunk is None:
                    assert wait_for_frames([consumer], waiter, 10.0)
                    continue
                received += [chunk.body(i).tobytes() for i in range(chunk.count)]
                consumer.complete(chunk, np.arange(chunk.first_seq, chunk.first_seq + chunk.count) + 1000)
            assert wait_readable(report, "acks") == (0, [seq + 1000 for seq in range(len(sizes))])
            producer.join(10)
            assert producer.exitcode == 0
        assert received == [intended(0, seq, size)[: size + 8] for seq, size in enumerate(sizes)]
        assert consumer.producer_state == PRODUCER_STATE_CLOSED and not consumer.producer_alive()
        consumer.close()


# -- producers killed at random moments ---------------------------------------------------------------------


def _produce_forever(
    ring: RingNames, seed: int, max_size: int, ready: multiprocessing.connection.Connection
) -> None:
    producer = RingProducer.attach(ring, max_block_ms=60_000, track_acks=False)
    ready.send("ready")
    seq = 0
    while True:
        producer.send(intended(seed, seq, max_size))
        seq += 1


@pytest.mark.slow
def test_producers_sigkilled_mid_write_leave_only_whole_frames_and_block_no_one() -> None:
    rng = np.random.default_rng(2024)
    seen_per_kill = []
    with instance() as names:
        for producer_id in range(100):
            ring = new_ring(names, producer_id, capacity_bytes=256 * 1024)
            consumer = RingConsumer.attach(ring)
            ready, ready_end = FORK.Pipe(duplex=False)
            seen = 0
            with child(_produce_forever, ring, producer_id, 60_000, ready_end) as producer:
                wait_readable(ready, "the producer")
                kill_at = time.monotonic() + rng.uniform(0, 0.004)
                killed = False
                while True:
                    if not killed and time.monotonic() >= kill_at:
                        os.kill(producer.pid or 0, signal.SIGKILL)
                        producer.join()
                        killed = True
                    chunk = consumer.peek(max_bytes=int(rng.integers(1, 1 << 20)))
                    if chunk is None:
                        if killed:
                            break
                        continue
                    for i in range(chunk.count):  # whole frames, in order, exactly what was intended
                        assert chunk.first_seq + i == seen
                        assert chunk.body(i).tobytes() == intended(producer_id, seen, 60_000)
                        seen += 1
                    consumer.complete(chunk, np.zeros(chunk.count, np.int64))
            assert producer.exitcode == -signal.SIGKILL
            assert not consumer.has_data()  # at most an unpublished frame is left, and nobody reads it
            assert not consumer.producer_alive()  # the writer can tell the producer is gone
            seen_per_kill.append(seen)
            consumer.close()
            unlink_ring(ring)
        # The partition keeps accepting: a fresh producer on a fresh ring, served by the same process.
        ring = new_ring(names, 1000, capacity_bytes=256 * 1024)
        consumer = RingConsumer.attach(ring)
        with RingProducer.attach(ring) as producer_ring:
            for seq in range(50):
                producer_ring.send(intended(1000, seq, 500))
        frames = []
        while (chunk := consumer.peek()) is not None:
            frames += [chunk.body(i).tobytes() for i in range(chunk.count)]
            consumer.complete(chunk, np.zeros(chunk.count, np.int64))
        assert frames == [intended(1000, seq, 500) for seq in range(50)]
        consumer.close()
        unlink_ring(ring)
    print("frames seen before each kill:", sorted(seen_per_kill))
    assert min(seen_per_kill) < max(seen_per_kill)  # the kills landed at many different moments
    assert sum(count > 0 for count in seen_per_kill) >= 10  # loose: a loaded CI machine starts children late


# -- writers killed at random moments -----------------------------------------------------------------------


def _write_log(
    ring: RingNames, log_path: str, stop_after: str, ready: multiprocessing.connection.Connection
) -> None:
    """A stand-in partition writer: peek -> append to a log file -> ack -> release."""
    consumer = RingConsumer.attach(ring)
    waiter = Waiter(Doorbell.open(ring.doorbell))
    log = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.truncate(log, read_log(Path(log_path))[1])  # recovery: a SIGKILL can cut a write() short
    ready.send("ready")
    rng = np.random.default_rng(os.getpid())
    while True:
        chunk = consumer.peek(max_bytes=int(rng.integers(1, 4000)))
        if chunk is None:
            wait_for_frames([consumer], waiter, 0.1)
            continue
        seqs = np.arange(chunk.first_seq, chunk.first_seq + chunk.count)
        records = [
            LOG_RECORD.pack(seq, len(chunk.body(i))) + chunk.body(i).tobytes() for i, seq in enumerate(seqs)
        ]
        os.write(log, b"".join(records))  # "append": one write per chunk
        if stop_after == "append":
            break
        time.sleep(0.0001)  # widen the append -> ack -> release windows for random kills to land in
        consumer.ack(chunk.first_seq, seqs * 3 + 1)
        if stop_after == "ack":
            break
        time.sleep(0.0001)
        consumer.release(chunk.end_position)
    ready.send("stopped")
    signal.pause()  # killed here: after peek (and append, and maybe ack) but before release


def read_log(path: Path) -> tuple[list[tuple[int, bytes]], int]:
    """The whole records of the stand-in log, and where they end (a torn last record is not counted)."""
    data = path.read_bytes() if path.exists() else b""
    records, position = [], 0
    while position + LOG_RECORD.size <= len(data):
        seq, size = LOG_RECORD.unpack_from(data, position)
        if position + LOG_RECORD.size + size > len(data):
            break
        records.append((seq, data[position + LOG_RECORD.size : position + LOG_RECORD.size + size]))
        position += LOG_RECORD.size + size
    return records, position


@pytest.mark.parametrize("stop_after", ["append", "ack"])
def test_writer_killed_after_peek_before_release_loses_nothing(tmp_path: Path, stop_after: str) -> None:
    with instance() as names:
        ring = new_ring(names, 1, capacity_bytes=64 * 1024)
        producer = RingProducer.attach(ring)
        bodies = [intended(5, seq, 3000) for seq in range(20)]
        for body in bodies:
            producer.send(body)
        ready, ready_end = FORK.Pipe(duplex=False)
        log_path = tmp_path / "log"
        with child(_write_log, ring, str(log_path), stop_after, ready_end) as writer:
            wait_readable(ready, "the writer")
            assert wait_readable(ready, "the writer's peek") == "stopped"
            writer.kill()
        unreleased, _ = read_log(log_path)
        assert unreleased and [seq for seq, _ in unreleased] == list(range(len(unreleased)))
        acknowledged = producer.acked_seq
        assert acknowledged == (0 if stop_after == "append" else len(unreleased))
        # A new writer re-reads every unreleased frame from the head, including those already acknowledged.
        successor = RingConsumer.attach(ring)
        assert successor.head_position == 0
        chunk = successor.peek()
        assert chunk is not None and (chunk.first_seq, chunk.count) == (0, 20)
        assert [chunk.body(i).tobytes() for i in range(20)] == bodies
        successor.complete(chunk, np.arange(20) * 3 + 1)  # dedup gives the same answers again
        first, results = producer.poll_acks()
        assert (first, results.tolist()) == (0, [seq * 3 + 1 for seq in range(20)])
        producer.send(b"after")
        assert successor.peek() is not None
        producer.close()
        successor.close()


@pytest.mark.slow
def test_writers_sigkilled_at_random_moments_lose_nothing_acknowledged(tmp_path: Path) -> None:
    rng = np.random.default_rng(99)
    total = 6000
    with instance() as names:
        ring = new_ring(names, 1, capacity_bytes=4 << 20, ack_slots=8192)
        producer = RingProducer.attach(ring)
        for seq in range(total):
            producer.send(intended(9, seq, 400))
        log_path = tmp_path / "log"
        incarnations = 0
        while producer.acked_seq < total:
            incarnations += 1
            ready, ready_end = FORK.Pipe(duplex=False)
            with child(_write_log, ring, str(log_path), "never", ready_end) as writer:
                wait_readable(ready, "the writer")
                if incarnations < 40:
                    time.sleep(rng.uniform(0, 0.004))
                else:
                    producer.wait_acks(total - 1, 20_000)
                writer.kill()
            acknowledged = producer.acked_seq  # read after the kill: nothing can ack any more
            logged = {seq for seq, _ in read_log(log_path)[0]}
            assert logged >= set(range(acknowledged)), "an acknowledged frame is missing from the log"
        records, end = read_log(log_path)
        assert end == log_path.stat().st_size
        first_copies = dict(reversed(records))
        assert sorted(first_copies) == list(range(total))
        assert all(body == intended(9, seq, 400) for seq, body in records)
        first, results = producer.poll_acks()
        assert (first, results.tolist()) == (0, [seq * 3 + 1 for seq in range(total)])
        print(f"{incarnations} writer incarnations, {len(records) - total} frames appended twice")
        assert incarnations > 20 and len(records) > total
        producer.close()


# -- back-pressure across processes -------------------------------------------------------------------------


def _drain_later(ring: RingNames, delay_s: float) -> None:
    consumer = RingConsumer.attach(ring)
    time.sleep(delay_s)
    while (chunk := consumer.peek()) is not None:
        consumer.complete(chunk, np.zeros(chunk.count, np.int64))


def test_a_blocked_producer_is_woken_by_the_writer_process_freeing_space() -> None:
    with instance() as names:
        ring = new_ring(names, 1, capacity_bytes=16 * 1024)
        producer = RingProducer.attach(ring, max_block_ms=10_000)
        while producer.try_reserve(1000) >= 0:
            producer.commit(1000)
        with child(_drain_later, ring, 0.1) as writer:
            started = time.monotonic()
            producer.send(b"x" * 1000)  # blocks until the other process frees space, then goes through
            waited = time.monotonic() - started
            writer.join(10)
        assert 0.05 < waited < 5.0
        producer.close()


# -- one writer, many producers, one doorbell ---------------------------------------------------------------


def _produce_some(ring: RingNames, seed: int, count: int) -> None:
    producer = RingProducer.attach(ring, max_block_ms=20_000)
    rng = np.random.default_rng(seed)
    for seq in range(count):
        producer.send(intended(seed, seq, 2000))
        if rng.random() < 0.02:
            time.sleep(0.002)  # idle gaps: the writer goes to sleep and must be woken
    producer.wait_acks(count - 1, 20_000)
    producer.close()


def test_one_writer_serves_many_producers_through_one_doorbell() -> None:
    with instance() as names:
        rings = [new_ring(names, producer, capacity_bytes=32 * 1024) for producer in range(4)]
        consumers = [RingConsumer.attach(ring) for ring in rings]
        waiter = Waiter(Doorbell.open(rings[0].doorbell))
        counts = [400, 400, 400, 100_000]  # the last one is SIGKILLed halfway through
        received: list[list[bytes]] = [[] for _ in rings]
        processes = [
            FORK.Process(target=_produce_some, args=(ring, i, counts[i])) for i, ring in enumerate(rings)
        ]
        for process in processes:
            process.start()
        try:
            deadline = time.monotonic() + 60
            while any(len(received[i]) < counts[i] for i in range(3)) or processes[3].is_alive():
                assert time.monotonic() < deadline
                if len(received[3]) > 500 and processes[3].is_alive():
                    processes[3].kill()
                    processes[3].join()
                if not wait_for_frames(consumers, waiter, 0.5):
                    continue
                for i, consumer in enumerate(consumers):
                    while (chunk := consumer.peek()) is not None:
                        received[i] += [chunk.body(j).tobytes() for j in range(chunk.count)]
                        consumer.complete(chunk, np.zeros(chunk.count, np.int64))
            for process in processes:
                process.join(20)
        finally:
            for process in processes:
                if process.is_alive():
                    process.kill()
                process.join()
        for i in range(3):
            assert processes[i].exitcode == 0
            assert received[i] == [intended(i, seq, 2000) for seq in range(counts[i])]
        assert processes[3].exitcode == -signal.SIGKILL
        assert received[3] == [intended(3, seq, 2000) for seq in range(len(received[3]))]  # a clean prefix
        assert waiter.sleeps > 0  # the writer really slept and was woken by the producers
        assert [consumer.producer_alive() for consumer in consumers] == [False] * 4
        for consumer in consumers:
            consumer.close()


# -- idle CPU -----------------------------------------------------------------------------------------------


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _idle_writer(ring: RingNames, report: multiprocessing.connection.Connection) -> None:
    consumer = RingConsumer.attach(ring)
    waiter = Waiter(Doorbell.open(ring.doorbell))
    cpu, wall = _cpu_seconds(), time.monotonic()
    woke = wait_for_frames([consumer], waiter, 1.0)
    report.send((woke, _cpu_seconds() - cpu, time.monotonic() - wall))


def _blocked_producer(ring: RingNames, report: multiprocessing.connection.Connection) -> None:
    producer = RingProducer.attach(ring, max_block_ms=1000)
    while producer.try_reserve(1000) >= 0:
        producer.commit(1000)
    cpu, wall = _cpu_seconds(), time.monotonic()
    try:
        producer.send(b"x" * 1000)
        outcome = "sent"
    except BackPressureError:
        outcome = "back-pressure"
    report.send((outcome, _cpu_seconds() - cpu, time.monotonic() - wall))


def test_waiting_writer_and_blocked_producer_use_under_one_percent_cpu() -> None:
    with instance() as names:
        idle_ring = new_ring(names, 1, capacity_bytes=16 * 1024)
        full_ring = new_ring(names, 2, capacity_bytes=16 * 1024)
        writer_report, writer_end = FORK.Pipe(duplex=False)
        producer_report, producer_end = FORK.Pipe(duplex=False)
        with child(_idle_writer, idle_ring, writer_end), child(_blocked_producer, full_ring, producer_end):
            woke, writer_cpu, writer_wall = wait_readable(writer_report, "the idle writer")  # type: ignore[misc]
            outcome, producer_cpu, producer_wall = wait_readable(producer_report, "the producer")  # type: ignore[misc]
        assert not woke and outcome == "back-pressure"
        assert writer_wall >= 1.0 and producer_wall >= 1.0
        assert writer_cpu < 0.01 * writer_wall, f"idle writer used {writer_cpu * 1000:.1f} ms CPU"
        assert producer_cpu < 0.01 * producer_wall, f"blocked producer used {producer_cpu * 1000:.1f} ms CPU"
