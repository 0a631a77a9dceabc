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
each ack.  A publisher is used by one thread at a time (the caller serialises).

To hand one already-built batch to a partition and wait for its answer, as the broker does for a Produce
request::

    publisher = RingPublisher.attach(names, topic="orders", partition=3, max_block_ms=60_000)
    base_offset = publish_and_wait(publisher, batch_bytes, timeout_ms=30_000)   # raises on an error ack
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

import numpy as np

from ipc.ring import RingNames, RingProducer
from storage.errors import (
    ApplianceError,
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
    "RingPublisher",
    "error_for_code",
    "publish_and_wait",
]

T = TypeVar("T")

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


class RingPublisher(Generic[T]):
    """One partition ring, producer end: publish frames with tokens, collect ``(token, result)`` acks."""

    def __init__(
        self,
        ring: RingProducer,
        *,
        topic: str,
        partition: int,
        max_in_flight: int | None = None,
    ) -> None:
        self.ring = ring
        self.topic = topic
        self.partition = partition
        self.track_acks = ring.track_acks
        self.max_in_flight = max_in_flight if max_in_flight is not None else ring.ack_slots
        if self.max_in_flight < 1:
            raise ValueError(f"max_in_flight must be at least 1, got {max_in_flight}")
        self.max_body_bytes = ring.max_body_bytes
        self.in_flight: deque[tuple[int, T]] = deque()  # (frame seq, token), oldest first
        self.completed: deque[tuple[T, int]] = deque()  # acked, not yet taken by the caller
        self.last_ack_ns = time.monotonic_ns()  # when an ack last arrived (or the ring was attached)

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
    ) -> RingPublisher[T]:
        """Open a freshly created ring (the supervisor's ``attach`` answer) as its one producer."""
        ring = RingProducer.attach(names, max_block_ms=max_block_ms, track_acks=track_acks)
        return cls(ring, topic=topic, partition=partition, max_in_flight=max_in_flight)

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
        index = self.ring.reserve(size, self._remaining_ms(deadline_ns))
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
        index = self.ring.reserve(max_bytes, self._remaining_ms(deadline_ns))
        try:
            size = build(self.ring.data[index : index + max_bytes])
        except BaseException:
            self.ring.abort()
            raise
        if not 0 < size <= max_bytes:
            self.ring.abort()
            raise ValueError(f"ring {self.name}: builder wrote {size} bytes into a {max_bytes}-byte frame")
        return self._committed(self.ring.commit(size), token)

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
        from storage.errors import BackPressureError

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
        and polls under its own lock; :meth:`poll` collects the acks afterwards."""
        return self.ring.wait_acks(seq, int(max(timeout_ms, 1)))

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
        """Mark the ring closed: the writer drains what was published, then the supervisor unlinks it."""
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
