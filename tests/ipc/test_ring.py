"""The producer ring in one process: round trips against a list oracle, acks, back-pressure, bad frames.

Everything runs on real POSIX shared memory and semaphores; cross-process behaviour is in
test_ring_processes.py and test_ring_contention.py.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from ipc.memory_order import publish_int32, publish_int64
from ipc.ring import (
    PRODUCER_NAP_FOR_S,
    RESERVE_ACKS_FULL,
    RESERVE_FAILED,
    RESERVE_FULL,
    Chunk,
    RingConsumer,
    RingFailedError,
    RingNames,
    RingProducer,
    create_ring,
    unlink_ring,
    wait_for_frames,
    warm_up,
)
from ipc.ring_layout import (
    ACK_SEQ_WORD,
    FRAME_ALIGNMENT,
    FRAME_HEADER_BYTES,
    FRAME_SEQ_OFFSET,
    FRAME_TYPE_DATA,
    FRAME_TYPE_OFFSET,
    FRAME_TYPE_PADDING,
    HEADER_BYTES,
    RING_FAILED_BAD_LENGTH,
    RING_FAILED_BAD_PADDING,
    RING_FAILED_BAD_SEQ,
    RING_FAILED_BAD_TYPE,
    RingMemory,
    align_frame,
    max_body_bytes,
)
from ipc.ring_scan import (
    ACK_WORDS_PER_SLOT,
    SCAN_BAD_LENGTH,
    SCAN_BAD_PADDING,
    SCAN_BAD_SEQ,
    SCAN_BAD_TYPE,
    SCAN_OK,
    scan_frames,
    write_acks,
)
from ipc.shm import SharedSegment, ShmNames, list_objects, reclaim, shm_path
from ipc.wakeup import Doorbell, Waiter
from storage.errors import BackPressureError, CorruptRecordError

warm_up()


@contextmanager
def ring_pair(
    capacity_bytes: int = 8192, ack_slots: int = 64, *, track_acks: bool = True, max_block_ms: int = 1000
) -> Iterator[tuple[RingProducer, RingConsumer, RingNames]]:
    """A fresh instance with one ring, its producer and consumer; everything removed afterwards."""
    names = ShmNames(secrets.token_hex(8))
    ring_names = RingNames.for_producer(names, "orders", 0, 1)
    Doorbell.create(ring_names.doorbell).close()
    create_ring(ring_names, capacity_bytes=capacity_bytes, ack_slots=ack_slots)
    producer = RingProducer.attach(ring_names, max_block_ms=max_block_ms, track_acks=track_acks)
    consumer = RingConsumer.attach(ring_names)
    try:
        yield producer, consumer, ring_names
    finally:
        producer.close()
        consumer.close()
        reclaim(names.instance)
        assert list_objects(names.instance) == ([], [])


def body_for(seq: int, size: int) -> bytes:
    """A body whose bytes depend on its seq, so a misplaced or stale body never matches."""
    pattern = np.arange(size, dtype=np.uint32) * 2654435761 + seq * 40503
    return (pattern >> 7).astype(np.uint8).tobytes()


def drain(consumer: RingConsumer, max_bytes: int = 1 << 30) -> list[tuple[int, bytes]]:
    """Peek everything, ack each frame with ``seq * 2 + 1``, release; return (seq, body) in order."""
    frames: list[tuple[int, bytes]] = []
    while (chunk := consumer.peek(max_bytes)) is not None:
        frames += [(chunk.first_seq + i, chunk.body(i).tobytes()) for i in range(chunk.count)]
        seqs = np.arange(chunk.first_seq, chunk.first_seq + chunk.count)
        consumer.complete(chunk, seqs * 2 + 1)
    return frames


# -- round trips --------------------------------------------------------------------------------------------

_sizes = st.one_of(st.integers(0, 64), st.integers(300, 2000), st.just(2000))
_send = st.tuples(st.just("send"), _sizes, _sizes)  # bytes reserved, bytes committed (capped at reserved)
_ops = st.lists(
    st.one_of(
        _send,
        _send,
        _send,
        st.tuples(st.just("drain"), st.integers(1, 6000), st.integers(0, 3)),  # max_bytes, chunks to take
        st.just(("acks", 0, 0)),
    ),
    min_size=20,
    max_size=200,
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=_ops, capacity_bytes=st.sampled_from([4096, 8192]))
def test_round_trip_matches_a_list_oracle(ops: list[tuple[str, int, int]], capacity_bytes: int) -> None:
    with ring_pair(capacity_bytes, ack_slots=16) as (producer, consumer, _):
        sent: list[bytes] = []
        received: list[bytes] = []
        acks: list[int] = []

        def consume(max_bytes: int, chunks: int) -> None:
            for _ in range(chunks):
                chunk = consumer.peek(max_bytes)
                if chunk is None:
                    return
                assert chunk.first_seq == len(received)
                assert chunk.view.size == chunk.end_position - chunk.start_position
                received.extend(chunk.body(i).tobytes() for i in range(chunk.count))
                seqs = np.arange(chunk.first_seq, chunk.first_seq + chunk.count)
                consumer.complete(chunk, seqs * 2 + 1)

        for op, a, b in ops:
            if op == "send":
                reserve_bytes = min(a, producer.max_body_bytes)
                index = producer.try_reserve(reserve_bytes)
                while index < 0:
                    if index == RESERVE_ACKS_FULL:
                        first, results = producer.poll_acks()
                        assert first == len(acks)
                        acks.extend(results.tolist())
                        if results.size == 0:
                            consume(1 << 20, 1000)
                    else:
                        assert index == RESERVE_FULL
                        consume(1 << 20, 1000)
                    index = producer.try_reserve(reserve_bytes)
                commit_bytes = min(b, reserve_bytes)
                body = body_for(len(sent), commit_bytes)
                producer.data[index : index + commit_bytes] = np.frombuffer(body, np.uint8)
                assert producer.commit(commit_bytes) == len(sent)
                sent.append(body)
            elif op == "drain":
                consume(a, b)
            else:
                first, results = producer.poll_acks()
                assert first == len(acks)
                acks.extend(results.tolist())
            assert received == sent[: len(received)]  # always a prefix, never a torn or reordered frame
        consume(1 << 30, 1 << 30)
        first, results = producer.poll_acks()
        assert first == len(acks)
        acks.extend(results.tolist())
        assert received == sent
        assert acks == [seq * 2 + 1 for seq in range(len(sent))]
        assert not consumer.has_data()
        event(f"laps around the ring: {min(consumer.head_position // capacity_bytes, 3)}")


def test_largest_frame_fits_an_empty_ring_wherever_the_cursor_stands() -> None:
    with ring_pair(capacity_bytes=64 * 1024, ack_slots=8, max_block_ms=0) as (producer, consumer, _):
        largest = producer.max_body_bytes
        assert largest == max_body_bytes(64 * 1024)
        for step, size in enumerate([1000, largest, 7, largest, 30000, largest, largest]):
            body = body_for(step, size)
            producer.send(body)
            assert drain(consumer) == [(step, body)]
            producer.poll_acks()
        with pytest.raises(ValueError, match="at most"):
            producer.try_reserve(largest + 1)


def test_one_mebibyte_batches_through_a_sixteen_mebibyte_ring() -> None:
    with ring_pair(capacity_bytes=16 << 20, ack_slots=64) as (producer, consumer, _):
        bodies = [body_for(seq, (1 << 20) - seq) for seq in range(40)]
        received: list[tuple[int, bytes]] = []
        for body in bodies:
            if producer.try_reserve(len(body)) < 0:
                received += drain(consumer, max_bytes=4 << 20)
            producer.send(body)
        received += drain(consumer)
        assert received == list(enumerate(bodies))


def test_reserved_region_is_writable_in_place() -> None:
    with ring_pair() as (producer, consumer, _):
        index = producer.reserve(100)
        view = producer.reserved_view()
        assert len(view) == 100
        view[:5] = b"hello"
        producer.data[index + 5 : index + 10] = np.frombuffer(b"world", np.uint8)
        producer.commit(10)
        assert drain(consumer) == [(0, b"helloworld")]
        with pytest.raises(ValueError, match="nothing reserved"):
            producer.reserved_view()


def test_commit_beyond_the_reservation_is_refused() -> None:
    with ring_pair() as (producer, consumer, _):
        with pytest.raises(ValueError, match="0 reserved"):
            producer.commit(1)
        producer.reserve(10)
        with pytest.raises(ValueError, match="commit of 11 body bytes, 10 reserved"):
            producer.commit(11)
        producer.abort()
        with pytest.raises(ValueError):
            producer.commit(0)
        assert consumer.peek() is None


# -- acks ---------------------------------------------------------------------------------------------------


def test_acks_come_back_in_order_with_their_results() -> None:
    with ring_pair(ack_slots=4) as (producer, consumer, _):
        for seq in range(4):
            producer.send(body_for(seq, 10))
        assert producer.try_reserve(10) == RESERVE_ACKS_FULL  # 4 frames unread: slots would be overwritten
        assert producer.poll_acks()[1].size == 0
        chunk = consumer.peek()
        assert chunk is not None and chunk.count == 4
        consumer.ack(0, [100, -2])  # base offset 100; minus CORRUPT_MESSAGE for frame 1
        assert producer.acked_seq == 2
        assert producer.wait_acks(1, timeout_ms=0)
        assert not producer.wait_acks(2, timeout_ms=10)
        with pytest.raises(ValueError, match="skip frames"):
            consumer.ack(3, [7])
        consumer.ack(2, [102, 103])
        consumer.release(chunk.end_position)
        # Reserve takes the published acks into its backlog to make room; poll_acks still returns them all.
        producer.send(body_for(4, 10))
        first, results = producer.poll_acks()
        assert (first, results.tolist()) == (0, [100, -2, 102, 103])
        assert producer.poll_acks()[0] == 4


@pytest.mark.parametrize("ack_after_s", [0.0005, 0.03])
def test_a_producer_waiting_for_an_ack_naps_first_then_sleeps_on_its_semaphore(ack_after_s: float) -> None:
    """An ack within PRODUCER_NAP_FOR_S finds the producer napping: the writer's ack posts nothing.  A later
    one finds it asleep on its semaphore and wakes it with one post."""
    with ring_pair() as (producer, consumer, _):
        seq = producer.send(body_for(0, 10))
        acked_at: list[float] = []

        def ack_later() -> None:
            time.sleep(ack_after_s)
            chunk = consumer.peek()
            assert chunk is not None
            acked_at.append(time.monotonic())
            consumer.ack(chunk.first_seq, [5])
            consumer.release(chunk.end_position)

        thread = threading.Thread(target=ack_later)
        waited_from = time.monotonic()
        thread.start()
        try:
            assert producer.wait_acks(seq, timeout_ms=2000)
        finally:
            thread.join()
        if ack_after_s > PRODUCER_NAP_FOR_S:
            assert producer._waiter.sleeps == 1
        elif acked_at[0] - waited_from < PRODUCER_NAP_FOR_S / 2:  # (a loaded machine may ack later)
            assert producer._waiter.sleeps == 0
        assert producer.poll_acks()[1].tolist() == [5]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chunks=st.lists(st.integers(1, 48), min_size=1, max_size=12), polls=st.data())
def test_acks_read_a_few_or_many_at_a_time_match_an_oracle(chunks: list[int], polls: st.DataObject) -> None:
    """Acks are read as ints from the slots when few arrived, with numpy when many did: both agree with
    what the writer answered, in order, across the wrap of the slot array."""
    with ring_pair(capacity_bytes=65536, ack_slots=48) as (producer, consumer, _):
        answered: list[int] = []
        received: list[int] = []
        for count in chunks:
            for _ in range(count):
                producer.send(body_for(producer.next_seq, 24))
            chunk = consumer.peek()
            assert chunk is not None and chunk.count == count
            results = [(chunk.first_seq + i) * 7 - 3 * (i % 2) for i in range(count)]
            consumer.complete(chunk, results)
            answered += results
            if polls.draw(st.booleans()):
                first, got = producer.poll_ack_list()
                assert first == len(received)
                received += got
        first, got = producer.poll_ack_list()
        assert first == len(received) and received + got == answered
        assert producer.poll_ack_list() == (len(answered), [])
        assert producer.poll_acks()[1].size == 0


@pytest.mark.parametrize("count", [3, 40])  # read with the loop, with numpy
def test_an_ack_slot_holding_another_frame_is_reported(count: int) -> None:
    with ring_pair(capacity_bytes=65536, ack_slots=48) as (producer, consumer, _):
        for _ in range(count):
            producer.send(body_for(producer.next_seq, 8))
        chunk = consumer.peek()
        assert chunk is not None
        consumer.complete(chunk, list(range(count)))
        slots = RingMemory(producer.name)
        try:
            slots.acks[(count - 1) * ACK_WORDS_PER_SLOT + ACK_SEQ_WORD] = 999  # the last frame's slot
        finally:
            slots.close()
        with pytest.raises(CorruptRecordError, match=f"slot for frame {count - 1} holds frame 999"):
            producer.poll_ack_list()


def test_a_restarted_consumer_may_ack_again_with_the_same_result() -> None:
    with ring_pair() as (producer, consumer, names):
        producer.send(b"a")
        producer.send(b"b")
        chunk = consumer.peek()
        assert chunk is not None
        consumer.ack(chunk.first_seq, [10, 11])  # acked, then "killed" before release
        consumer.close()
        again = RingConsumer.attach(names)
        replay = again.peek()
        assert replay is not None and (replay.first_seq, replay.count) == (0, 2)
        again.complete(replay, [10, 11])
        assert producer.poll_acks()[1].tolist() == [10, 11]
        again.close()


def test_acks_zero_producer_never_waits_for_acks() -> None:
    with ring_pair(ack_slots=2, track_acks=False) as (producer, consumer, _):
        for seq in range(10):
            producer.send(body_for(seq, 5))
        assert len(drain(consumer)) == 10
        assert producer.acked_seq == 10
        with pytest.raises(ValueError, match="track_acks"):
            producer.poll_acks()


def test_write_acks_twin_matches_kernel() -> None:
    results = np.array([5, -1, 9, 11, -87], np.int64)
    compiled, twin = np.zeros(8, np.int64), np.zeros(8, np.int64)
    assert write_acks(compiled, 4, 6, results) == write_acks.py_func(twin, 4, 6, results) == 5
    assert compiled.tolist() == twin.tolist() == [8, 9, 9, 11, 10, -87, 7, -1]  # 10 overwrote 6


# -- back-pressure ------------------------------------------------------------------------------------------


def test_full_ring_blocks_for_max_block_ms_then_raises_and_drops_nothing() -> None:
    with ring_pair(capacity_bytes=8192, max_block_ms=200) as (producer, consumer, names):
        sent = []
        while producer.try_reserve(500) >= 0:
            body = body_for(len(sent), 500)
            producer.send(body)
            sent.append(body)
        started = time.monotonic()
        with pytest.raises(BackPressureError) as raised:
            producer.send(body_for(len(sent), 500))
        waited = time.monotonic() - started
        assert 0.2 <= waited < 2.0
        message = str(raised.value)
        assert names.ring in message and "full for 200 ms" in message and "nothing was written" in message
        assert drain(consumer) == list(enumerate(sent))  # nothing dropped, nothing half-written
        producer.send(b"after")  # and the ring works again
        assert drain(consumer) == [(len(sent), b"after")]


def test_full_ring_with_explicit_timeout_zero_fails_at_once() -> None:
    with ring_pair(capacity_bytes=4096) as (producer, _, _names):
        while producer.try_reserve(1000) >= 0:
            producer.commit(1000)
        started = time.monotonic()
        with pytest.raises(BackPressureError):
            producer.reserve(1000, timeout_ms=0)
        assert time.monotonic() - started < 0.1


# -- bad frames ---------------------------------------------------------------------------------------------


def corrupt(consumer: RingConsumer, producer: RingProducer, how: str) -> int:
    """Damage the header of the next frame the consumer will read (as a buggy producer would); return
    the expected failure code."""
    index = consumer.head_position % consumer.capacity_bytes
    words32 = producer._words32  # the real mapping: the producer's own memory, written as a bug would
    words64 = producer._words64
    if how == "length past the end":
        publish_int32(words32, index >> 2, consumer.capacity_bytes - index + 1)
        return RING_FAILED_BAD_LENGTH
    if how == "length below a header":
        publish_int32(words32, index >> 2, FRAME_HEADER_BYTES - 1)
        return RING_FAILED_BAD_LENGTH
    if how == "huge length":
        publish_int32(words32, index >> 2, 0x7FFFFFFF)
        return RING_FAILED_BAD_LENGTH
    if how == "unknown type":
        words32[(index + FRAME_TYPE_OFFSET) >> 2] = 7
        return RING_FAILED_BAD_TYPE
    if how == "sequence jump":
        words64[(index + FRAME_SEQ_OFFSET) >> 3] += 5
        return RING_FAILED_BAD_SEQ
    if how == "short padding":
        words32[(index + FRAME_TYPE_OFFSET) >> 2] = FRAME_TYPE_PADDING
        return RING_FAILED_BAD_PADDING
    raise AssertionError(how)


@pytest.mark.parametrize(
    "how",
    [
        "length past the end",
        "length below a header",
        "huge length",
        "unknown type",
        "sequence jump",
        "short padding",
    ],
)
def test_bad_frame_fails_the_ring_and_the_producer_gets_a_clear_error(how: str) -> None:
    with ring_pair(capacity_bytes=8192, max_block_ms=100) as (producer, consumer, names):
        for seq in range(3):
            producer.send(body_for(seq, 100))
        chunk = consumer.peek(max_bytes=1)  # frame 0 only
        assert chunk is not None and chunk.count == 1
        consumer.complete(chunk, [0])
        bad_position = consumer.head_position
        code = corrupt(consumer, producer, how)
        with pytest.raises(RingFailedError) as raised:
            consumer.peek()
        assert consumer.failed and consumer.failure() == (code, bad_position, consumer.failure()[2])
        assert not consumer.has_data()  # a failed ring never wakes its writer again
        with pytest.raises(RingFailedError):
            consumer.peek()
        # The producer sees it on its next call, with the ring, the reason and the position.
        assert producer.try_reserve(10) == RESERVE_FAILED
        with pytest.raises(RingFailedError) as seen:
            producer.send(b"more")
        for message in (str(raised.value), str(seen.value)):
            assert names.ring in message and f"position {bad_position}" in message
        with pytest.raises(RingFailedError):
            producer.wait_acks(1, timeout_ms=1000)
        with pytest.raises(RingFailedError):
            producer.check_failed()
        assert producer.wait_acks(0, timeout_ms=0)  # what was acknowledged before stays acknowledged
        assert isinstance(seen.value, CorruptRecordError)


def test_valid_frames_before_a_bad_one_are_still_delivered() -> None:
    with ring_pair() as (producer, consumer, _):
        for seq in range(4):
            producer.send(body_for(seq, 50))
        index = (3 * align_frame(FRAME_HEADER_BYTES + 50)) % consumer.capacity_bytes
        publish_int32(producer._words32, index >> 2, 3)  # frame 3: length smaller than a header
        chunk = consumer.peek()
        assert chunk is not None and (chunk.first_seq, chunk.count) == (0, 3)
        consumer.complete(chunk, [0, 1, 2])
        with pytest.raises(RingFailedError, match="bad frame length"):
            consumer.peek()
        assert producer.wait_acks(2, timeout_ms=0)


def test_a_failed_ring_does_not_stop_the_writer_serving_other_rings() -> None:
    names = ShmNames(secrets.token_hex(8))
    doorbell = Doorbell.create(names.doorbell("orders", 0))
    rings = [RingNames.for_producer(names, "orders", 0, producer) for producer in (1, 2)]
    try:
        for ring in rings:
            create_ring(ring, capacity_bytes=4096, ack_slots=8)
        producers = [RingProducer.attach(ring, max_block_ms=0) for ring in rings]
        consumers = [RingConsumer.attach(ring) for ring in rings]
        producers[0].send(b"x" * 40)
        publish_int32(producers[0]._words32, 0, 1 << 20)
        producers[1].send(b"fine")
        waiter = Waiter(doorbell)
        served: list[bytes] = []
        for _ in range(3):
            assert wait_for_frames([c for c in consumers if not c.failed], waiter, 0.5)
            for consumer in consumers:
                if consumer.failed:
                    continue
                try:
                    served += [frame for _, frame in drain(consumer)]
                except RingFailedError:
                    pass
            producers[1].send(b"still fine")
        assert served == [b"fine", b"still fine", b"still fine"]
        assert consumers[0].failed and not consumers[1].failed
        for endpoint in (*producers, *consumers):
            endpoint.close()
    finally:
        doorbell.close()
        reclaim(names.instance)


@settings(max_examples=200, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    small_words=st.booleans(),
    head=st.integers(0, 4096 // FRAME_ALIGNMENT - 1),
    patches=st.lists(st.tuples(st.integers(0, 1023), st.integers(-(2**31), 2**31 - 1)), max_size=16),
    first_length=st.none() | st.integers(FRAME_HEADER_BYTES, 4096),
)
def test_garbage_in_the_ring_fails_it_or_yields_frames_inside_the_ring(
    seed: int, small_words: bool, head: int, patches: list[tuple[int, int]], first_length: int | None
) -> None:
    rng = np.random.default_rng(seed)
    if small_words:  # many plausible lengths, types and seqs: the scan goes deep before it fails
        words = rng.integers(-4, 3000, 1024).astype(np.int32)
    else:
        words = rng.integers(-(2**31), 2**31, 1024, dtype=np.int64).astype(np.int32)
    for index, value in patches:
        words[index] = value
    head *= FRAME_ALIGNMENT
    if first_length is not None:
        words[head >> 2] = first_length
        words[(head + FRAME_TYPE_OFFSET) >> 2] = FRAME_TYPE_DATA
    position = 3 * 4096 + head
    results = []
    for kernel in (scan_frames, scan_frames.py_func):
        starts, lengths, info = np.empty(64, np.int64), np.empty(64, np.int64), np.empty(6, np.int64)
        count = kernel(words, words.view(np.int64), 4096, position, -1, 1 << 20, starts, lengths, info)
        results.append((count, starts[:count].tolist(), lengths[:count].tolist(), info.tolist()))
    assert results[0] == results[1]  # the pure-Python twin agrees with the kernel
    count, starts_list, lengths_list, info_list = results[0]
    start, end, status = info_list[0], info_list[1], info_list[4]
    assert status in (SCAN_OK, SCAN_BAD_LENGTH, SCAN_BAD_TYPE, SCAN_BAD_SEQ, SCAN_BAD_PADDING)
    assert position <= start <= end
    if count:
        assert (start % 4096) + (end - start) <= 4096  # a chunk never wraps
    for body_start, body_length in zip(starts_list, lengths_list, strict=True):
        assert FRAME_HEADER_BYTES <= body_start and body_start + body_length <= end - start


def test_scan_twin_matches_kernel_on_a_real_ring_with_padding() -> None:
    with ring_pair(capacity_bytes=4096, ack_slots=64) as (producer, consumer, _):
        for seq in range(3):
            producer.send(body_for(seq, 1000))
        drain(consumer)
        for seq in range(3, 6):
            producer.send(body_for(seq, 600))  # the second one wraps behind a padding frame
        memory = consumer._memory
        outputs = []
        for kernel in (scan_frames, scan_frames.py_func):
            starts, lengths, info = np.empty(8, np.int64), np.empty(8, np.int64), np.empty(6, np.int64)
            count = kernel(
                memory.data32, memory.data64, 4096, consumer.head_position, 3, 1 << 20, starts, lengths, info
            )
            outputs.append((count, starts[:count].tolist(), lengths[:count].tolist(), info.tolist()))
        assert outputs[0] == outputs[1]
        assert outputs[0][0] == 1  # the chunk stops before the padding frame
        assert drain(consumer) == [(seq, body_for(seq, 600)) for seq in range(3, 6)]


# -- attaching ----------------------------------------------------------------------------------------------


def test_a_ring_serves_one_producer_session() -> None:
    with ring_pair() as (_, _consumer, names):
        with pytest.raises(ValueError, match="already had a producer"):
            RingProducer.attach(names)


def test_attaching_something_that_is_not_a_ring_is_refused() -> None:
    names = ShmNames(secrets.token_hex(8))
    ring_names = RingNames.for_producer(names, "t", 0, 0)
    try:
        SharedSegment.create(ring_names.ring, 3 * HEADER_BYTES).close()
        with pytest.raises(CorruptRecordError, match=r"magic 0x00000000 version 0, expected 0x4752414c"):
            RingConsumer.attach(ring_names)
        segment = SharedSegment.open(ring_names.ring)
        header = segment.buf[:HEADER_BYTES].cast("q")
        segment.buf[:8] = bytes.fromhex("4c41524701000000")  # magic + version, then a lying capacity
        publish_int64(header, 1, 1 << 20)
        header.release()
        segment.close()
        with pytest.raises(CorruptRecordError, match="does not fit"):
            RingConsumer.attach(ring_names)
        with pytest.raises(FileNotFoundError, match="does not exist"):
            RingConsumer.attach(RingNames.for_producer(names, "t", 0, 9))
    finally:
        reclaim(names.instance)


def test_create_ring_validates_its_sizes() -> None:
    names = RingNames.for_producer(ShmNames(secrets.token_hex(8)), "t", 0, 0)
    for capacity in (0, 4095, 5000, 2 << 30):
        with pytest.raises(ValueError, match="capacity"):
            create_ring(names, capacity_bytes=capacity)
    with pytest.raises(ValueError, match="ack slots"):
        create_ring(names, ack_slots=0)
    assert not shm_path(names.ring).exists()


def test_unlinked_ring_keeps_working_for_those_who_mapped_it() -> None:
    with ring_pair() as (producer, consumer, names):
        unlink_ring(names)
        assert not shm_path(names.ring).exists()
        producer.send(b"still here")
        assert drain(consumer) == [(0, b"still here")]


# -- the consumer's cursor ----------------------------------------------------------------------------------


def test_peek_continues_after_unreleased_chunks_and_release_checks_its_argument() -> None:
    with ring_pair() as (producer, consumer, _):
        for seq in range(4):
            producer.send(body_for(seq, 100))
        first = consumer.peek(max_bytes=1)
        second = consumer.peek(max_bytes=1)
        assert isinstance(first, Chunk) and isinstance(second, Chunk)
        assert (first.first_seq, second.first_seq) == (0, 1)
        with pytest.raises(ValueError, match="outside"):
            consumer.release(second.end_position + FRAME_ALIGNMENT)
        consumer.complete(first, [0])
        consumer.rewind()
        again = consumer.peek()
        assert again is not None and (again.first_seq, again.count) == (1, 3)
        consumer.complete(again, [1, 2, 3])
        assert consumer.head_position == again.end_position


def test_idle_writer_wait_times_out_and_wakes_on_a_frame() -> None:
    with ring_pair() as (producer, consumer, names):
        doorbell = Doorbell.open(names.doorbell)
        waiter = Waiter(doorbell)
        started = time.monotonic()
        assert not wait_for_frames([consumer], waiter, 0.05)
        assert 0.05 <= time.monotonic() - started < 2.0
        producer.send(b"x")
        assert wait_for_frames([consumer], waiter, 5.0)
        doorbell.close()


def test_naps_stop_after_a_park_that_timed_out_until_a_park_finds_work() -> None:
    """A waiter in slices (a flush behind a stalled writer) naps in its first slice only."""
    with ring_pair() as (_, _, names):
        doorbell = Doorbell.open(names.doorbell)
        waiter = Waiter(doorbell, spin_iterations=0, nap_s=50e-6, nap_for_s=0.05)  # naps long enough to
        flag = memoryview(bytearray(8)).cast("q")  # be seen on a loaded machine, within a park of 0.2 s
        looks = 0

        def nothing() -> bool:
            nonlocal looks
            looks += 1
            return False

        def counted_park(ready: Callable[[], bool]) -> int:
            nonlocal looks
            looks = 0
            waiter.park([(flag, 0)], ready, 0.2)
            return looks

        assert counted_park(nothing) >= 3, "naps: a look after each, then the two of the sleep"
        assert counted_park(nothing) == 2, "after a timeout: no naps, only the sleep's two looks"
        assert waiter.park([(flag, 0)], lambda: True, 0.005)
        assert counted_park(nothing) >= 3, "work found: naps again"
        assert flag[0] == 0
        doorbell.close()


def test_closing_while_views_are_still_held_leaves_them_valid() -> None:
    with ring_pair() as (producer, consumer, _):
        producer.send(b"kept")
        chunk = consumer.peek()
        assert chunk is not None
        data = producer.data
        producer.close()
        consumer.close()
        assert chunk.body(0).tobytes() == b"kept"  # the mapping lives as long as a view of it
        data[:4] = 0
        producer.close()  # closing twice is harmless
