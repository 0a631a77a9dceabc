"""acks=all for local producers: a batch the writer appended completes once the high watermark passes it.

Theory of operation
-------------------
A local producer's batch goes into a ring; the partition's writer appends it and acknowledges it with its
base offset.  That is acks=1.  For acks=all a :class:`CommittedChannel` wraps the ring's
:class:`~ipc.ring_publisher.RingPublisher` and keeps every acknowledged batch until the partition's
high watermark -- read from its state page (``ipc.state_page``) -- passes its last offset, as the broker
does for a Produce request with ``acks=-1`` (``appliance.broker.replication``).  With replication factor 1
the writer publishes HW = LEO before it acknowledges, so a batch completes at its first poll; with followers
it completes once every in-sync replica holds it and knows it.

``min.insync.replicas`` is honoured from the same page (its ``isr_size`` and ``min_insync_replicas``,
published by the partition's replica-state owner):

* a batch is not published while the ISR is smaller: it completes with NOT_ENOUGH_REPLICAS, which the
  producer retries like any retriable error (``retries``, ``retry.backoff.ms``, ``delivery.timeout.ms``;
  with ``retries=0`` the caller sees :class:`~storage.errors.NotEnoughReplicasError` at once);
* a batch the high watermark passes while the ISR is smaller completes with
  NOT_ENOUGH_REPLICAS_AFTER_APPEND: it is in the log but held by fewer replicas than asked (an idempotent
  producer's retry is recognised as a duplicate).

Batches complete strictly in publish order (the high watermark passes them in that order), so the producer's
recovery of refused batches sees them as the ring reports them.  Waiting for the high watermark polls the
page every :data:`HIGH_WATERMARK_POLL_S` (nothing posts a semaphore when it moves); waiting for the writer's
ack parks on the ring's semaphore.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Final, Generic, TypeVar

import numpy as np

from ipc.ring_publisher import NOT_ENOUGH_REPLICAS, NOT_ENOUGH_REPLICAS_AFTER_APPEND, RingPublisher
from ipc.state_page import StatePage

__all__ = ["HIGH_WATERMARK_POLL_S", "CommittedChannel"]

T = TypeVar("T")

HIGH_WATERMARK_POLL_S: Final = 0.0003  # a waiter re-reads the high watermark this often
_REFUSED = -1  # the frame seq of a batch refused before it was published


class CommittedChannel(Generic[T]):
    """A ring to a partition's writer with acks=all semantics (``appliance.client.route.BatchChannel``)."""

    def __init__(self, publisher: RingPublisher[T], page: StatePage, records: Callable[[T], int]) -> None:
        self.publisher = publisher
        self.page = page
        self._records = records
        self.track_acks = True
        self.max_body_bytes = publisher.max_body_bytes
        self.in_flight: deque[tuple[int, T]] = deque()  # published (or refused), not complete, in order
        self.completed: deque[tuple[T, int]] = deque()
        self._results: dict[int, int] = {}  # id(token) -> the writer's answer, while waiting for the HW

    @property
    def name(self) -> str:
        return self.publisher.name

    @property
    def last_ack_ns(self) -> int:
        return self.publisher.last_ack_ns

    @last_ack_ns.setter
    def last_ack_ns(self, value: int) -> None:
        self.publisher.last_ack_ns = value

    def publish_into(self, max_bytes: int, build: Callable[[np.ndarray], int], token: T, *,
                     timeout_ms: int | None = None) -> int:
        """Publish a batch (see ``RingPublisher.publish_into``); below ``min.insync.replicas`` nothing is
        published and the batch completes with NOT_ENOUGH_REPLICAS."""
        if not self.page.enough_replicas():
            self.in_flight.append((_REFUSED, token))
            self._results[id(token)] = -NOT_ENOUGH_REPLICAS
            return _REFUSED
        seq = self.publisher.publish_into(max_bytes, build, token, timeout_ms=timeout_ms)
        self.in_flight.append((seq, token))
        return seq

    def poll(self) -> int:
        """Collect the writer's acks, complete what the high watermark passed; the number completed.
        RingFailedError if the writer failed the ring."""
        try:
            self.publisher.poll()
        finally:
            for token, result in self.publisher.take_completed():
                self._results[id(token)] = result
        count = 0
        page = self.page
        high_watermark = -1
        while self.in_flight:
            _, token = self.in_flight[0]
            answer = self._results.get(id(token))
            if answer is None:
                break  # the writer has not answered it yet
            result = answer
            if result >= 0:
                if high_watermark < 0:
                    high_watermark = page.high_watermark
                if high_watermark <= result + self._records(token) - 1:
                    break  # appended, not committed yet
                if not page.enough_replicas():
                    result = -NOT_ENOUGH_REPLICAS_AFTER_APPEND
            self.in_flight.popleft()
            del self._results[id(token)]
            self.completed.append((token, result))
            count += 1
        return count

    def wait_acked(self, seq: int, timeout_ms: float) -> bool:
        """Sleep until frame ``seq`` is acknowledged by the writer, or -- already acknowledged -- until the
        high watermark moves (or ``timeout_ms``).  Reads only shared memory: no bookkeeping changes."""
        if seq == _REFUSED:
            return True  # complete at the next poll
        if self.publisher.ring.acked_seq <= seq:
            return self.publisher.wait_acked(seq, timeout_ms)
        page = self.page
        before = page.high_watermark, page.isr_size
        deadline = time.monotonic() + max(timeout_ms, 0) / 1000
        while time.monotonic() < deadline:
            time.sleep(HIGH_WATERMARK_POLL_S)
            if (page.high_watermark, page.isr_size) != before:
                return True
        return False

    def take_completed(self) -> list[tuple[T, int]]:
        done = list(self.completed)
        self.completed.clear()
        return done

    def abandon_in_flight(self) -> list[T]:
        """Forget everything not complete (the ring failed or is replaced); tokens in publish order.  Those
        the writer already appended are recognised as duplicates when sent again."""
        tokens = [token for _, token in self.in_flight]
        self.in_flight.clear()
        self._results.clear()
        self.publisher.abandon_in_flight()
        return tokens

    def close(self) -> None:
        self.publisher.close()
        self.page.close()
