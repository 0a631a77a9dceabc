"""Publish whole RecordBatch v2 frames into one partition's ring and match the writer's acks to them.

Theory of operation
-------------------
A :class:`RingPublisher` is the producer end of one (producer, partition) ring (``ipc.ring.RingProducer``)
plus the bookkeeping both local producers and the broker need:

* **publish**: a batch goes into the ring either already built (:meth:`RingPublisher.publish`, one copy: the
  broker's Produce requests, a retry of saved bytes) or built in place (:meth:`RingPublisher.publish_into`:
  the caller's builder writes straight into ring memory, e.g. ``storage.batch_builder.build_into``).  Each
  published frame carries a caller *token* (the producer's batch object, the broker's pending request).
* **acks**: the partition writer answers every frame, in frame order, with one int64: the base offset it
  assigned (>= 0) or minus a Kafka error code.  :meth:`RingPublisher.poll` reads the acks that arrived (a
  couple of loads when none did) and moves ``(token, result)`` pairs to :attr:`RingPublisher.completed`, in
  publish order; :meth:`RingPublisher.wait` sleeps on the ring's semaphore until the oldest frame is
  answered.  With ``track_acks=False`` (acks=0) nothing is tracked: the ring still applies back-pressure.
* **in flight**: at most ``max_in_flight`` frames await their acks (Kafka's
  ``max.in.flight.requests.per.connection``, 5 for an idempotent producer, whose broker remembers the last 5
  batches per producer for de-duplication); publishing more first waits for acks, up to ``max_block_ms``.

Waiting never spins: it parks on the ring's producer semaphore (``ipc.wakeup``), which the writer posts after
each ack.  A publisher is used by one thread at a time (the caller serialises); only :meth:`wait_acked` may
be called from another thread meanwhile.

**Growing.**  A ring starts small (``appliance.ring.initial.bytes``) and, given a :class:`RingGrowth` (how
to attach a larger ring to the same partition and let go of one), the publisher replaces it by one twice as
large, up to the supervisor's ``appliance.ring.bytes``, when a frame finds no room (the producer would have
to wait for space) or does not fit at all (then as large as that frame needs).  Order and idempotence stay
exact because the two rings are never both written:

G1  attach the larger ring (the supervisor creates it and hands it to the partition's writer); publish
    nothing more into the old one
G2  wait until every frame published in the old ring is acknowledged (``ack_seq`` reaches its next seq):
    the writer has appended (or refused) all of them, in order
G3  close the old ring and detach it (the supervisor unlinks it once the writer let it go)
G4  publish from then on into the new ring; frame seqs restart at 0 there, the batches' producer sequences
    simply continue

A crash at any step leaves what any producer crash leaves: published frames are appended, in ring order,
and the old ring is drained before the new one ever holds a frame.  While G2 waits, a publish with no time
left raises :class:`BackPressureError` (nothing published), as a full ring does; the broker retries it on
a later poll.  If attaching the larger ring fails, the publisher stops growing and keeps its ring.

To hand one already-built batch to a partition and wait for its answer, as the broker does for a Produce
request::

    publisher = RingPublisher.attach(names, topic="orders", partition=3, max_block_ms=60_000)
    base_offset = publish_and_wait(publisher, batch_bytes, timeout_ms=30_000)   # raises on an error ack
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

import numpy as np

from ipc.ring import RESERVE_FULL, RingNames, RingProducer
from ipc.ring_layout import MAX_CAPACITY_BYTES, max_body_bytes
from storage.errors import (
    ApplianceError,
    BackPressureError,
    CorruptRecordError,
    InvalidRecordError,
    KafkaStorageError,
    NotEnoughReplicasError,
    NotLeaderError,
    RequestTimeoutError,
    UnknownTopicOrPartitionError,
)

__all__ = [
    "RETRIABLE_CODES",
    "RingGrowth",
    "RingPublisher",
    "error_for_code",
    "grown_capacity",
    "publish_and_wait",
]

T = TypeVar("T")

_log = logging.getLogger("appliance.producer")

# Kafka error codes an ack may carry, by what the producer does about them.
CORRUPT_MESSAGE = 2
UNKNOWN_TOPIC_OR_PARTITION = 3
NOT_LEADER_OR_FOLLOWER = 6
REQUEST_TIMED_OUT = 7
MESSAGE_TOO_LARGE = 10
RECORD_LIST_TOO_LARGE = 18
NOT_ENOUGH_REPLICAS = 19
NOT_ENOUGH_REPLICAS_AFTER_APPEND = 20
OUT_OF_ORDER_SEQUENCE_NUMBER = 45
INVALID_PRODUCER_EPOCH = 47
INVALID_TXN_STATE = 48
KAFKA_STORAGE_ERROR = 56
UNKNOWN_PRODUCER_ID = 59
INVALID_RECORD = 87

# Sending the same batch again may succeed (Kafka's RetriableException subclasses among ack codes).
RETRIABLE_CODES = frozenset(
    {
        CORRUPT_MESSAGE,
        NOT_LEADER_OR_FOLLOWER,
        REQUEST_TIMED_OUT,
        NOT_ENOUGH_REPLICAS,
        NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        KAFKA_STORAGE_ERROR,
    }
)

_ERROR_CLASSES: dict[int, type[ApplianceError]] = {
    CORRUPT_MESSAGE: CorruptRecordError,
    UNKNOWN_TOPIC_OR_PARTITION: UnknownTopicOrPartitionError,
    NOT_LEADER_OR_FOLLOWER: NotLeaderError,
    REQUEST_TIMED_OUT: RequestTimeoutError,
    MESSAGE_TOO_LARGE: InvalidRecordError,
    RECORD_LIST_TOO_LARGE: InvalidRecordError,
    NOT_ENOUGH_REPLICAS: NotEnoughReplicasError,
    NOT_ENOUGH_REPLICAS_AFTER_APPEND: NotEnoughReplicasError,
    OUT_OF_ORDER_SEQUENCE_NUMBER: InvalidRecordError,
    INVALID_PRODUCER_EPOCH: InvalidRecordError,
    INVALID_TXN_STATE: InvalidRecordError,
    UNKNOWN_PRODUCER_ID: InvalidRecordError,
    INVALID_RECORD: InvalidRecordError,
    KAFKA_STORAGE_ERROR: KafkaStorageError,
}
_ADVICE: dict[int, str] = {
    KAFKA_STORAGE_ERROR: (
        ": the partition's log directory cannot take writes (its file system is full, or its free space is "
        "below log.dir.min.free.bytes; the writer's log names the directory and the cause); nothing was "
        "appended.  Free space there (delete topics, lower retention.ms or retention.bytes): writes resume "
        "by themselves"
    ),
}


def error_for_code(code: int, *, topic: str, partition: int, detail: str = "") -> ApplianceError:
    """The storage.errors exception for a Kafka error code the partition writer answered with.

    ``detail`` says which batch (records, sequence, ...).  The message names the partition and the code.
    """
    from ipc.kafka.errors import error_name  # cold path: keep the codec out of the producer's start-up

    cls = _ERROR_CLASSES.get(code, ApplianceError)
    what = f" ({detail})" if detail else ""
    advice = (" (retriable)" if code in RETRIABLE_CODES else "") + _ADVICE.get(code, "")
    error = cls(
        f"partition {topic}-{partition}: batch{what} refused by the writer: {error_name(code)}{advice}"
    )
    if isinstance(error, KafkaStorageError):
        error.partition = f"{topic}-{partition}"
        error.cause = "KAFKA_STORAGE_ERROR"
    return error


@dataclass(frozen=True, slots=True)
class RingGrowth:
    """How a publisher gets a larger ring for its partition and lets go of the one it replaces.

    ``attach(capacity_bytes)`` attaches a new ring of at least that capacity to the same partition (the
    supervisor's ``attach`` with ``ring_bytes``) and returns its names; ``release(ring)`` detaches a ring
    (the writer drains it, the supervisor unlinks it); ``max_ring_bytes`` is the largest capacity the
    supervisor gives (``appliance.ring.bytes``).  Either callable may raise; the publisher then stops
    growing (``attach``) or logs it (``release``).
    """

    attach: Callable[[int], RingNames]
    release: Callable[[str], None]
    max_ring_bytes: int


def grown_capacity(capacity_bytes: int, body_bytes: int, max_ring_bytes: int) -> int:
    """The capacity a ring of ``capacity_bytes`` grows to: doubled, and doubled again until a body of
    ``body_bytes`` fits, at most ``max_ring_bytes``."""
    capacity = capacity_bytes * 2
    while max_body_bytes(capacity) < body_bytes and capacity < max_ring_bytes:
        capacity *= 2
    return min(capacity, max_ring_bytes, MAX_CAPACITY_BYTES)


class RingPublisher(Generic[T]):
    """One partition ring, producer end: publish frames with tokens, collect ``(token, result)`` acks;
    with a :class:`RingGrowth`, the ring is replaced by a larger one as traffic needs (module docstring)."""

    def __init__(
        self,
        ring: RingProducer,
        *,
        topic: str,
        partition: int,
        max_in_flight: int | None = None,
        growth: RingGrowth | None = None,
    ) -> None:
        self.ring = ring
        self.topic = topic
        self.partition = partition
        self.track_acks = ring.track_acks
        self.max_in_flight = max_in_flight if max_in_flight is not None else ring.ack_slots
        if self.max_in_flight < 1:
            raise ValueError(f"max_in_flight must be at least 1, got {max_in_flight}")
        self.growth = growth if growth is not None and growth.max_ring_bytes > ring.capacity_bytes else None
        # the largest body a publish takes: the ring's, or the largest ring's it may grow to
        self.max_body_bytes = max(ring.max_body_bytes, max_body_bytes(growth.max_ring_bytes)
                                  if self.growth is not None and growth is not None else 0)
        self.in_flight: deque[tuple[int, T]] = deque()  # (frame seq, token), oldest first
        self.completed: deque[tuple[T, int]] = deque()  # acked, not yet taken by the caller
        self.last_ack_ns = time.monotonic_ns()  # when an ack last arrived (or the ring was attached)
        self.grown = 0  # how many times the ring was replaced by a larger one
        self._successor: RingNames | None = None  # G1 done, waiting for G2
        self._retired: list[RingProducer] = []  # replaced rings a waiting thread may still read
        self._waiters = 0  # threads inside wait_acked
        self._waiters_lock = threading.Lock()

    @classmethod
    def attach(
        cls,
        names: RingNames,
        *,
        topic: str,
        partition: int,
        max_block_ms: int = 60_000,
        track_acks: bool = True,
        max_in_flight: int | None = None,
        growth: RingGrowth | None = None,
    ) -> RingPublisher[T]:
        """Open a freshly created ring (the supervisor's ``attach`` answer) as its one producer."""
        ring = RingProducer.attach(names, max_block_ms=max_block_ms, track_acks=track_acks)
        return cls(ring, topic=topic, partition=partition, max_in_flight=max_in_flight, growth=growth)

    @property
    def capacity_bytes(self) -> int:
        """The current ring's data capacity."""
        return self.ring.capacity_bytes

    @property
    def growing(self) -> bool:
        """A larger ring is attached and the old one is draining (G1 done, G2 not yet)."""
        return self._successor is not None

    @property
    def name(self) -> str:
        return self.ring.name

    @property
    def max_block_ms(self) -> int:
        return self.ring.max_block_ms

    # -- publishing ---------------------------------------------------------------------------------------

    def publish(self, batch: bytes | bytearray | memoryview | np.ndarray, token: T, *,
                timeout_ms: int | None = None) -> int:
        """Copy one already-built batch into the ring and publish it; return its frame seq.

        Waits for an in-flight slot and for ring space up to ``timeout_ms`` (default ``max_block_ms``):
        :class:`BackPressureError` then, and nothing was published.
        """
        body = memoryview(batch).cast("B") if not isinstance(batch, np.ndarray) else batch.reshape(-1)
        size = len(body)
        deadline_ns = self._deadline_ns(timeout_ms)
        self._wait_for_slot(deadline_ns)
        index = self._reserve(size, deadline_ns)
        self.ring.data[index : index + size] = np.frombuffer(body, np.uint8)
        return self._committed(self.ring.commit(size), token)

    def publish_into(self, max_bytes: int, build: Callable[[np.ndarray], int], token: T, *,
                     timeout_ms: int | None = None) -> int:
        """Reserve ``max_bytes`` of ring memory, let ``build(region)`` write a batch at the start of the
        ``region`` array and return its size, publish it; return the frame seq.

        ``build`` returning a size <= 0 or raising publishes nothing (the reservation is dropped).
        """
        deadline_ns = self._deadline_ns(timeout_ms)
        self._wait_for_slot(deadline_ns)
        index = self._reserve(max_bytes, deadline_ns)
        try:
            size = build(self.ring.data[index : index + max_bytes])
        except BaseException:
            self.ring.abort()
            raise
        if not 0 < size <= max_bytes:
            self.ring.abort()
            raise ValueError(f"ring {self.name}: builder wrote {size} bytes into a {max_bytes}-byte frame")
        return self._committed(self.ring.commit(size), token)

    def _reserve(self, body_bytes: int, deadline_ns: int) -> int:
        """Reserve a frame for ``body_bytes`` in the ring, growing it first when it is full or too small
        (G1-G4); the body's index into ``self.ring.data``.  BackPressureError at the deadline."""
        ring = self.ring
        if self._successor is None:
            growth = self.growth
            can_grow = growth is not None and ring.capacity_bytes < growth.max_ring_bytes
            if body_bytes <= ring.max_body_bytes:
                index = ring.try_reserve(body_bytes)
                if index >= 0:
                    return index
                if index != RESERVE_FULL or not can_grow:
                    return ring.reserve(body_bytes, self._remaining_ms(deadline_ns))
            if not can_grow or not self._grow(body_bytes):
                return ring.reserve(body_bytes, self._remaining_ms(deadline_ns))  # (raises if too large)
        if not self._switch(deadline_ns):
            raise BackPressureError(
                f"ring {self.name}: partition {self.topic}-{self.partition} is moving to a larger ring; "
                f"{ring.next_seq - ring.acked_seq} frames of the old one await acknowledgement; nothing "
                "was written, retry"
            )
        return self.ring.reserve(body_bytes, self._remaining_ms(deadline_ns))

    def _grow(self, body_bytes: int) -> bool:
        """G1: attach a larger ring (the successor); False if that failed (growing stops then)."""
        growth = self.growth
        assert growth is not None
        capacity = grown_capacity(self.ring.capacity_bytes, body_bytes, growth.max_ring_bytes)
        try:
            self._successor = growth.attach(capacity)
        except Exception as exc:  # a larger ring is an optimisation: keep the one we have
            _log.warning("partition %s-%d: cannot attach a ring of %d bytes, keeping ring %s (%d bytes): %s",
                         self.topic, self.partition, capacity, self.name, self.ring.capacity_bytes, exc)
            self.growth = None
            self.max_body_bytes = self.ring.max_body_bytes
            return False
        return True

    def _switch(self, deadline_ns: int) -> bool:
        """G2-G4: wait (up to the deadline) until the old ring is acknowledged to its last frame, then
        publish into the successor from now on; False if the old ring still has frames unanswered."""
        old = self.ring
        while True:
            self.poll()
            if old.acked_seq >= old.next_seq:
                break
            remaining_ms = self._remaining_ms(deadline_ns)
            if remaining_ms <= 0:
                return False
            old.wait_acks(old.next_seq - 1, min(remaining_ms, 100))
        successor, self._successor = self._successor, None
        assert successor is not None and self.growth is not None
        self.ring = RingProducer.attach(successor, max_block_ms=old.max_block_ms, track_acks=old.track_acks)
        self.grown += 1
        if self.ring.capacity_bytes >= self.growth.max_ring_bytes:
            self.max_body_bytes = self.ring.max_body_bytes
        self._retire(old)
        return True

    def _retire(self, old: RingProducer) -> None:
        """G3: unmap the replaced ring (later, if a thread is waiting in :meth:`wait_acked`) and detach it."""
        with self._waiters_lock:
            self._retired.append(old)
            if not self._waiters:
                self._close_retired()
        if self.growth is not None:
            try:
                self.growth.release(old.name)
            except Exception as exc:  # the supervisor unlinks it with the connection anyway
                _log.warning("partition %s-%d: detaching replaced ring %s: %s", self.topic, self.partition,
                             old.name, exc)

    def _close_retired(self) -> None:
        """(With the waiters' lock held, no waiter inside.)"""
        for old in self._retired:
            old.close()
        self._retired.clear()

    def _committed(self, seq: int, token: T) -> int:
        if self.track_acks:
            if not self.in_flight:
                self.last_ack_ns = time.monotonic_ns()  # the ack clock starts with the oldest frame
            self.in_flight.append((seq, token))
        return seq

    def _deadline_ns(self, timeout_ms: int | None) -> int:
        return time.monotonic_ns() + (self.max_block_ms if timeout_ms is None else timeout_ms) * 1_000_000

    @staticmethod
    def _remaining_ms(deadline_ns: int) -> int:
        return max(0, (deadline_ns - time.monotonic_ns()) // 1_000_000)

    def _wait_for_slot(self, deadline_ns: int) -> None:
        """Block until fewer than ``max_in_flight`` frames await acks (BackPressureError at the deadline)."""
        if not self.track_acks or len(self.in_flight) < self.max_in_flight:
            return
        while True:
            self.poll()
            if len(self.in_flight) < self.max_in_flight:
                return
            remaining_ms = self._remaining_ms(deadline_ns)
            if remaining_ms <= 0:
                raise BackPressureError(
                    f"ring {self.name}: partition {self.topic}-{self.partition} has {len(self.in_flight)} "
                    f"batches awaiting acknowledgement (max.in.flight {self.max_in_flight}) after "
                    f"max.block.ms; nothing was written, slow down or retry"
                )
            self.ring.wait_acks(self.in_flight[0][0], min(remaining_ms, 100))

    # -- acks ---------------------------------------------------------------------------------------------

    def poll(self) -> int:
        """Move acks that arrived to :attr:`completed`; return how many.  Raises RingFailedError if the
        writer failed this ring (the frames still in :attr:`in_flight` were not appended)."""
        if self._retired:
            with self._waiters_lock:
                if not self._waiters:
                    self._close_retired()
        if not self.in_flight:
            return 0
        ring = self.ring
        if ring.acked_seq <= self.in_flight[0][0]:
            ring.check_failed()
            return 0
        first, results = ring.poll_ack_list()
        in_flight = self.in_flight
        count = len(results)
        if in_flight[0][0] != first or count > len(in_flight):
            raise CorruptRecordError(
                f"ring {self.name}: acks for frames {first}..{first + count - 1}, expected frame "
                f"{in_flight[0][0]} next and at most {len(in_flight)} acks"
            )
        popleft = in_flight.popleft
        append = self.completed.append
        for result in results:
            append((popleft()[1], result))
        self.last_ack_ns = time.monotonic_ns()
        return count

    def wait(self, timeout_ms: float) -> int:
        """Sleep until the oldest in-flight frame is acknowledged (or ``timeout_ms``); then :meth:`poll`."""
        if not self.in_flight:
            return 0
        count = self.poll()
        if count or timeout_ms <= 0:
            return count
        self.ring.wait_acks(self.in_flight[0][0], int(max(timeout_ms, 1)))
        return self.poll()

    def wait_acked(self, seq: int, timeout_ms: float) -> bool:
        """Sleep until frame ``seq`` is acknowledged or ``timeout_ms`` passes; True if it was.  Reads only
        the ring header (no bookkeeping changes), so a thread may wait here while another one publishes
        and polls under its own lock; :meth:`poll` collects the acks afterwards.  (If the ring is replaced
        meanwhile, the replaced one stays mapped until this returns; the wait then ends early or late by
        at most ``timeout_ms``, and the caller looks again.)"""
        with self._waiters_lock:
            self._waiters += 1
            ring = self.ring
        try:
            return ring.wait_acks(seq, int(max(timeout_ms, 1)))
        except ValueError:  # the ring was closed under us (the publisher closed): look again
            return True
        finally:
            with self._waiters_lock:
                self._waiters -= 1

    def take_completed(self) -> list[tuple[T, int]]:
        """The ``(token, result)`` pairs acknowledged since the last call, in publish order."""
        done = list(self.completed)
        self.completed.clear()
        return done

    def abandon_in_flight(self) -> list[T]:
        """Forget the frames awaiting acks (the ring failed or is being replaced); return their tokens in
        publish order so the caller can send them again (through a new ring)."""
        tokens = [token for _, token in self.in_flight]
        self.in_flight.clear()
        return tokens

    def close(self) -> None:
        """Mark the ring closed and unmap it: the writer drains what was published, then the supervisor
        unlinks it.  A successor attached for growing and not used yet is detached."""
        successor, self._successor = self._successor, None
        if successor is not None and self.growth is not None:
            try:
                self.growth.release(successor.ring)
            except Exception as exc:  # the supervisor unlinks it with the connection anyway
                _log.warning("partition %s-%d: detaching unused ring %s: %s", self.topic, self.partition,
                             successor.ring, exc)
        with self._waiters_lock:
            if not self._waiters:
                self._close_retired()
        self.ring.close()


def publish_and_wait(publisher: RingPublisher[object], batch: bytes | bytearray | memoryview,
                     *, timeout_ms: int) -> int:
    """Publish one already-built batch and wait for its ack; return the base offset the writer assigned.

    Raises :class:`BackPressureError` if it could not be published within ``max_block_ms``,
    :class:`RequestTimeoutError` if no ack came within ``timeout_ms`` (the outcome is unknown), or the
    exception :func:`error_for_code` maps an error ack to.  Acks of other frames published earlier through
    ``publisher`` stay in its :attr:`~RingPublisher.completed` queue.
    """
    token = object()
    publisher.publish(batch, token)
    deadline_ns = time.monotonic_ns() + timeout_ms * 1_000_000
    while True:
        publisher.poll()
        for i, (done, result) in enumerate(publisher.completed):
            if done is token:
                del publisher.completed[i]
                if result < 0:
                    raise error_for_code(-result, topic=publisher.topic, partition=publisher.partition,
                                         detail=f"{len(batch)} bytes")
                return result
        remaining_ms = (deadline_ns - time.monotonic_ns()) / 1e6
        if remaining_ms <= 0:
            raise RequestTimeoutError(
                f"partition {publisher.topic}-{publisher.partition}: no ack within {timeout_ms} ms for a "
                f"{len(batch)}-byte batch in ring {publisher.name}; it may still be appended"
            )
        publisher.wait(min(remaining_ms, 100.0))
