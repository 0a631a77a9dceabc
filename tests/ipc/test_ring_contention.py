"""The memory-ordering assumption (ipc/memory_order.py) under multi-process contention.

A producer process writes checksummed frames as fast as it can into a small ring (so it constantly
overwrites memory the consumer has just released) while a consumer process checks every frame: its seq
against the frame header, its CRC against its bytes.  The consumer acks each frame with the CRC it computed
and the producer checks those against what it sent, which exercises the reverse direction (ack slots, then
the ack cursor).  A control run with a deliberately wrong publish order shows the check catches torn frames.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import multiprocessing.synchronize
import secrets
import struct
import time
from collections import deque

import crc32c
import numpy as np
import pytest

from ipc.memory_order import publish_int32
from ipc.ring import RingConsumer, RingNames, RingProducer, create_ring, wait_for_frames, warm_up
from ipc.ring_layout import (
    FRAME_ALIGNMENT,
    FRAME_HEADER_BYTES,
    FRAME_SEQ_OFFSET,
    FRAME_TYPE_DATA,
    FRAME_TYPE_OFFSET,
)
from ipc.shm import ShmNames, list_objects, reclaim
from ipc.wakeup import Doorbell, Waiter

FORK = multiprocessing.get_context("fork")
PREFIX = struct.Struct("<qI")  # seq, CRC-32C of the payload that follows
POOL = np.random.default_rng(7).integers(0, 256, 1 << 20, dtype=np.uint8).tobytes()

warm_up()


def _produce(
    ring: RingNames,
    seconds: float,
    max_payload: int,
    wrong_order: bool,
    go: multiprocessing.synchronize.Event,
    report: multiprocessing.connection.Connection,
) -> None:
    producer = RingProducer.attach(ring, max_block_ms=10_000)
    rng = np.random.default_rng(11)
    pool = memoryview(POOL)
    sent_crcs: deque[int] = deque()
    ack_errors = frames = 0
    go.wait()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for size, offset in zip(
            rng.integers(0, max_payload, 256), rng.integers(0, len(POOL) - max_payload, 256), strict=True
        ):
            payload = pool[offset : offset + size]
            crc = crc32c.crc32c(payload)
            body = PREFIX.pack(frames, crc) + payload
            if wrong_order:
                _commit_length_first(producer, body)
            else:
                producer.send(body)
            sent_crcs.append(crc)
            frames += 1
        _, results = producer.poll_acks()
        for result in results.tolist():
            ack_errors += result != sent_crcs.popleft()
    while producer.acked_seq < frames and not wrong_order:
        producer.wait_acks(frames - 1, 1000)
    _, results = producer.poll_acks()
    ack_errors += sum(result != sent_crcs.popleft() for result in results.tolist())
    report.send((frames, ack_errors))
    producer.close()


def _commit_length_first(producer: RingProducer, body: bytes) -> None:
    """The WRONG commit order (length published before the body is written), to prove the test can fail."""
    index = producer.reserve(len(body)) - FRAME_HEADER_BYTES
    words32, words64 = producer._words32, producer._words64
    words32[(index + FRAME_TYPE_OFFSET) >> 2] = FRAME_TYPE_DATA
    words64[(index + FRAME_SEQ_OFFSET) >> 3] = producer.next_seq
    frame_bytes = (FRAME_HEADER_BYTES + len(body) + FRAME_ALIGNMENT - 1) & -FRAME_ALIGNMENT
    words32[((index + frame_bytes) % producer.capacity_bytes) >> 2] = 0
    publish_int32(words32, index >> 2, FRAME_HEADER_BYTES + len(body))  # too early
    producer._notifier.notify()
    time.sleep(0.0002)  # widen the window so the control run fails every time, not by luck
    producer.data[index + FRAME_HEADER_BYTES : index + FRAME_HEADER_BYTES + len(body)] = np.frombuffer(
        body, np.uint8
    )
    producer._tail += frame_bytes
    producer._next_seq += 1
    producer._reserved_body = -1


def _consume(
    ring: RingNames, go: multiprocessing.synchronize.Event, report: multiprocessing.connection.Connection
) -> None:
    consumer = RingConsumer.attach(ring)
    waiter = Waiter(Doorbell.open(ring.doorbell))
    frames = torn = 0
    go.wait()
    idle_since = time.monotonic()
    while time.monotonic() - idle_since < 0.5:  # stop 0.5 s after the producer went quiet
        chunk = consumer.peek(max_bytes=1 << 16)
        if chunk is None:
            wait_for_frames([consumer], waiter, 0.05)
            continue
        idle_since = time.monotonic()
        results = np.empty(chunk.count, np.int64)
        for i in range(chunk.count):
            body = chunk.body(i)
            seq, crc = PREFIX.unpack_from(body)
            computed = crc32c.crc32c(body[PREFIX.size :])
            torn += seq != chunk.first_seq + i or crc != computed
            results[i] = computed
        consumer.complete(chunk, results)
        frames += chunk.count
    report.send((frames, torn))
    consumer.close()


def run(seconds: float, max_payload: int, wrong_order: bool) -> tuple[int, int, int, int]:
    names = ShmNames(secrets.token_hex(8))
    ring = RingNames.for_producer(names, "contended", 0, 1)
    doorbell = Doorbell.create(ring.doorbell)
    create_ring(ring, capacity_bytes=64 * 1024, ack_slots=1024)
    go = FORK.Event()
    producer_report, producer_end = FORK.Pipe(duplex=False)
    consumer_report, consumer_end = FORK.Pipe(duplex=False)
    producer = FORK.Process(target=_produce, args=(ring, seconds, max_payload, wrong_order, go, producer_end))
    consumer = FORK.Process(target=_consume, args=(ring, go, consumer_end))
    try:
        consumer.start()
        producer.start()
        go.set()
        assert producer_report.poll(seconds + 30) and consumer_report.poll(30)
        sent, ack_errors = producer_report.recv()
        received, torn = consumer_report.recv()
        producer.join(10)
        consumer.join(10)
        assert producer.exitcode == 0 and consumer.exitcode == 0
        return sent, ack_errors, received, torn
    finally:
        for process in (producer, consumer):
            if process.is_alive():
                process.kill()
                process.join()
        doorbell.close()
        reclaim(names.instance)
        assert list_objects(names.instance) == ([], [])


@pytest.mark.slow
def test_no_torn_or_reordered_frame_under_contention() -> None:
    sent, ack_errors, received, torn = run(seconds=3.0, max_payload=2048, wrong_order=False)
    print(f"{sent} frames, {torn} torn, {ack_errors} wrong acks")
    assert (torn, ack_errors) == (0, 0)
    assert received == sent
    assert sent > 50_000  # thousands of laps around a 64 KiB ring


def test_the_check_catches_a_producer_that_publishes_the_length_first() -> None:
    sent, _, received, torn = run(seconds=0.5, max_payload=16_000, wrong_order=True)
    print(f"{sent} frames, {torn} torn")
    assert received == sent
    assert torn > 0
