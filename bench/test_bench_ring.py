"""Benchmarks: frames through a producer ring between two processes, and wakeup round trips.

Run: ``.venv/bin/python -m pytest bench/test_bench_ring.py --benchmark-enable -q -s``

Throughput: a producer process copies frames of 1 KiB, 64 KiB and 1 MiB into a 16 MiB ring as fast as it
can; this process peeks them, acks and releases them, either without touching the bytes ("peek-release":
the ring's own cost on top of the producer's one copy) or copying every chunk out first, as the writer's
``writev`` into the page cache would ("peek-copy-release").  Each benchmark stores ``frames_per_s``,
``bytes_per_s`` and ``ratio_to_memcpy`` in ``extra_info``: the ring's bytes/s over a single-threaded numpy
copy between two 16 MiB buffers (the ring's working set) measured in the same run.  With one copy per byte a
ring with no overhead of its own reaches about 1.0; with two copies (one per process, both drawing on the
same memory bandwidth) about 0.5.

Wakeups: a ping-pong of empty frames (frame, ack, release each way) between two processes through two rings,
every wait a real semaphore sleep (``spin_iterations=0``), and with the default bounded spin; against a bare
posix_ipc semaphore ping-pong measured in the same run.  ``extra_info`` holds microseconds per round trip.
(On the 2-vCPU development VM the spin makes ping-pong slower, not faster: a spinning vCPU delays the other
one; it still pays off for throughput, where it avoids most sleeps.)
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import secrets
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import posix_ipc
import pytest

from bench import limits as perf_limits
from ipc.ring import RingConsumer, RingNames, RingProducer, create_ring, wait_for_frames, warm_up
from ipc.shm import ShmNames, reclaim
from ipc.wakeup import Doorbell, Waiter

FORK = multiprocessing.get_context("fork")
RING_BYTES = 16 << 20
ROUND_BYTES = 256 << 20  # bytes moved per timed round, whatever the frame size

warm_up()


@pytest.fixture(scope="module")
def memcpy_bytes_per_s() -> float:
    """A single-threaded numpy copy between two buffers the size of the ring (the same working set)."""
    rate = perf_limits.memcpy_bytes_per_s(RING_BYTES, copies=16, rounds=5)
    print(f"\nmemcpy (numpy, 16 MiB buffers): {rate / 1e9:.2f} GB/s")
    return rate


def _timed(func: Any) -> float:
    started = time.perf_counter()
    func()
    return time.perf_counter() - started


def _new_instance() -> tuple[ShmNames, list[Doorbell]]:
    return ShmNames(secrets.token_hex(8)), []


def _ring(names: ShmNames, partition: int, bells: list[Doorbell], capacity_bytes: int) -> RingNames:
    ring = RingNames.for_producer(names, "bench", partition, 1)
    bells.append(Doorbell.create(ring.doorbell))
    create_ring(ring, capacity_bytes=capacity_bytes, ack_slots=1 << 16)
    return ring


# -- throughput ---------------------------------------------------------------------------------------------


def _producer_loop(
    ring: RingNames, frame_bytes: int, commands: multiprocessing.connection.Connection
) -> None:
    producer = RingProducer.attach(ring, max_block_ms=60_000, track_acks=False)
    source = memoryview(np.random.default_rng(1).integers(0, 256, frame_bytes, dtype=np.uint8).tobytes())
    while (count := commands.recv()) > 0:
        for _ in range(count):
            producer.send(source)
    producer.close()


@pytest.fixture
def ring_between_processes(request: pytest.FixtureRequest) -> Iterator[tuple[RingConsumer, Any, int, Waiter]]:
    frame_bytes: int = request.param
    names, bells = _new_instance()
    ring = _ring(names, 0, bells, RING_BYTES)
    consumer = RingConsumer.attach(ring, max_frames_per_peek=1 << 14)
    commands, commands_end = FORK.Pipe()
    producer = FORK.Process(target=_producer_loop, args=(ring, frame_bytes, commands_end))
    producer.start()
    try:
        yield consumer, commands, frame_bytes, Waiter(bells[0])
    finally:
        commands.send(0)
        producer.join(30)
        if producer.is_alive():
            producer.kill()
            producer.join()
        consumer.close()
        for bell in bells:
            bell.close()
        reclaim(names.instance)


@pytest.mark.parametrize("consumer_copies", [False, True], ids=["peek-release", "peek-copy-release"])
@pytest.mark.parametrize("ring_between_processes", [1 << 10, 64 << 10, 1 << 20], indirect=True, ids=str)
def test_ring_throughput(
    benchmark: Any,
    ring_between_processes: tuple[RingConsumer, Any, int, Waiter],
    memcpy_bytes_per_s: float,
    consumer_copies: bool,
) -> None:
    consumer, commands, frame_bytes, waiter = ring_between_processes
    frames = ROUND_BYTES // frame_bytes
    sink = np.empty(RING_BYTES, np.uint8)

    def one_round() -> None:
        commands.send(frames)
        received = 0
        while received < frames:
            chunk = consumer.peek(max_bytes=4 << 20)
            if chunk is None:
                wait_for_frames([consumer], waiter, 5.0)
                continue
            if consumer_copies:
                np.copyto(sink[: chunk.view.size], chunk.view)  # what writev would copy into the page cache
            consumer.complete(chunk, np.zeros(chunk.count, np.int64))
            received += chunk.count

    one_round()  # warm: pages mapped, kernels loaded
    benchmark.pedantic(one_round, rounds=3, iterations=1)
    stats = getattr(benchmark, "stats", None)
    elapsed = stats.stats.mean if stats is not None else _timed(one_round)
    bytes_per_s = frames * frame_bytes / elapsed
    benchmark.extra_info["frames_per_s"] = round(frames / elapsed)
    benchmark.extra_info["bytes_per_s"] = round(bytes_per_s)
    benchmark.extra_info["ratio_to_memcpy"] = round(bytes_per_s / memcpy_bytes_per_s, 3)
    mode = "consumer copies out" if consumer_copies else "consumer only peeks"
    print(
        f"\nring, {frame_bytes} B frames, {mode}: {frames / elapsed:,.0f} frames/s, "
        f"{bytes_per_s / 1e9:.2f} GB/s, {bytes_per_s / memcpy_bytes_per_s:.2f} x memcpy"
    )


# -- wakeup latency -----------------------------------------------------------------------------------------


def _pong(ping: RingNames, pong: RingNames, spin_iterations: int, rounds: int) -> None:
    inbox = RingConsumer.attach(ping)
    outbox = RingProducer.attach(pong, track_acks=False)
    waiter = Waiter(Doorbell.open(ping.doorbell), spin_iterations)
    for _ in range(rounds):
        while (chunk := inbox.peek()) is None:
            wait_for_frames([inbox], waiter, 5.0)
        inbox.complete(chunk, np.zeros(chunk.count, np.int64))
        outbox.send(b"")
    outbox.close()


def _ring_round_trip_us(spin_iterations: int, rounds: int) -> float:
    names, bells = _new_instance()
    try:
        ping = _ring(names, 0, bells, 1 << 16)
        pong = _ring(names, 1, bells, 1 << 16)
        partner = FORK.Process(target=_pong, args=(ping, pong, spin_iterations, rounds + 100))
        partner.start()
        outbox = RingProducer.attach(ping, track_acks=False)
        time.sleep(0.05)
        inbox = RingConsumer.attach(pong)
        waiter = Waiter(bells[1], spin_iterations)
        started = 0.0
        for i in range(rounds + 100):
            if i == 100:
                started = time.perf_counter()
            outbox.send(b"")
            while (chunk := inbox.peek()) is None:
                wait_for_frames([inbox], waiter, 5.0)
            inbox.complete(chunk, np.zeros(chunk.count, np.int64))
        elapsed = time.perf_counter() - started
        partner.join(30)
        outbox.close()
        inbox.close()
        return elapsed / rounds * 1e6
    finally:
        for bell in bells:
            bell.close()
        reclaim(names.instance)


def _semaphore_partner(ping_name: str, pong_name: str, rounds: int) -> None:
    ping, pong = posix_ipc.Semaphore(ping_name), posix_ipc.Semaphore(pong_name)
    for _ in range(rounds):
        ping.acquire(5)
        pong.release()


def _semaphore_round_trip_us(rounds: int) -> float:
    names, bells = _new_instance()
    try:
        ping = Doorbell.create(names.doorbell("sem", 0))
        pong = Doorbell.create(names.doorbell("sem", 1))
        bells += [ping, pong]
        partner = FORK.Process(target=_semaphore_partner, args=(ping.name, pong.name, rounds + 100))
        partner.start()
        started = 0.0
        for i in range(rounds + 100):
            if i == 100:
                started = time.perf_counter()
            ping.ring()
            assert pong.sleep(5.0)
        elapsed = time.perf_counter() - started
        partner.join(30)
        return elapsed / rounds * 1e6
    finally:
        for bell in bells:
            bell.close()
        reclaim(names.instance)


def test_wakeup_round_trip(benchmark: Any) -> None:
    rounds = 5000
    results: dict[str, float] = {}

    def measure() -> None:
        results["semaphore_us"] = _semaphore_round_trip_us(rounds)
        results["ring_sleeping_us"] = _ring_round_trip_us(0, rounds)
        results["ring_spinning_us"] = _ring_round_trip_us(64, rounds)

    benchmark.pedantic(measure, rounds=1, iterations=1)
    benchmark.extra_info.update({key: round(value, 2) for key, value in results.items()})
    print(
        f"\nround trip: bare semaphores {results['semaphore_us']:.1f} us; ring frame + ack with a semaphore "
        f"sleep each way {results['ring_sleeping_us']:.1f} us; with the bounded spin "
        f"{results['ring_spinning_us']:.1f} us"
    )
