"""One partition's batches on the producer side: open, sealed, in flight, answered; sequence numbers.

Theory of operation
-------------------
A :class:`PartitionQueue` holds, for one partition of one topic:

* ``open``: the batch records are appended to now;
* ``sealed``: batches waiting to be published, in order (a full ring or ``max.in.flight`` holds them back);
* ``channel``: the path to the partition's writer (a ring), whose ``in_flight`` deque holds what was
  published and not answered yet;
* the next sequence number (idempotent producers number records per partition from 0, mod 2**31).

A batch gets its sequence numbers when it is first published and keeps them: a retry publishes the same
records under the same numbers, so a writer that appended it before answers with the first offsets again.

**Recovery.**  When the writer answers a batch with an error, nothing new is published to the partition
until every batch in flight has been answered (:meth:`acknowledged` sets ``recovering``): behind a refused
batch an idempotent producer's batches are refused as out of order, and they must go again in order.  Each
answered batch is then either to be sent again (a retriable code, or out of order behind a refused one) or
failed for good.  :meth:`end_recovery` walks them in publish order: the numbers of a batch failed for good
were never appended, so every later batch moves down by its record count (a running shift), and the
batches to send again go back to the front of ``sealed``, ahead of anything newer.  A batch that expires
(``delivery.timeout.ms``) before it could go again frees its numbers the same way.

The queue is plain bookkeeping: the producer holds its lock around every call and does the I/O.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from appliance.client.accumulator import DONE, PUBLISHED, SEALED, ProducerBatch
from ipc.ring_publisher import (
    KAFKA_STORAGE_ERROR,
    OUT_OF_ORDER_SEQUENCE_NUMBER,
    RETRIABLE_CODES,
    error_for_code,
)
from storage.errors import ApplianceError, KafkaStorageError, RequestTimeoutError

if TYPE_CHECKING:
    from appliance.client.route import BatchChannel

__all__ = ["SEQUENCE_MODULUS", "PartitionQueue"]

SEQUENCE_MODULUS = 1 << 31


class PartitionQueue:
    """The producer-side state of one partition (guarded by the producer's lock).  See the module doc."""

    __slots__ = ("answered", "channel", "collected_ns", "index", "next_sequence", "not_before_ns", "open",
                 "recovering", "sealed", "storage_detail", "topic_name")

    def __init__(self, topic_name: str, index: int, open_batch: ProducerBatch) -> None:
        self.topic_name = topic_name
        self.index = index
        self.open = open_batch  # records being appended
        self.sealed: deque[ProducerBatch] = deque()  # waiting to be published, in order
        self.channel: BatchChannel | None = None
        self.next_sequence = 0
        self.recovering = False  # an error answer: publish nothing new until every in-flight batch answered
        self.answered: list[ProducerBatch] = []  # answered with an error while recovering, in publish order
        self.not_before_ns = 0  # retry.backoff.ms: publish nothing before this monotonic time
        self.collected_ns = 0  # when the producer last read the acks of ``channel`` (monotonic ns)
        # where the partition's log dir is and what it has free, asked when a batch fails with a storage
        # error (the route's storage_detail; None: not known)
        self.storage_detail: Callable[[], tuple[str, str]] | None = None

    @property
    def name(self) -> str:
        return f"{self.topic_name}-{self.index}"

    def busy(self) -> bool:
        """Batches are sealed, in flight, or being recovered."""
        return bool(self.sealed or self.answered or (self.channel is not None and self.channel.in_flight))

    def number(self, batch: ProducerBatch) -> None:
        """Give ``batch`` its sequence numbers (idempotent producers; once, at its first publish)."""
        if batch.base_sequence < 0:
            batch.base_sequence = self.next_sequence
            self.next_sequence = (self.next_sequence + batch.record_count) % SEQUENCE_MODULUS

    def acknowledged(self, batch: ProducerBatch, result: int, *, retries: int,
                     delivery_timeout_ms: int) -> None:
        """The writer answered ``batch``: its base offset (>= 0), or minus a Kafka error code."""
        if result >= 0:
            if batch.state != DONE:  # (DONE: it expired meanwhile; it was appended all the same)
                batch.complete(result, None)
            return
        code = -result
        self.recovering = True
        batch.refused_code = code
        if batch.state != DONE:
            # behind a batch refused in this recovery, "out of order" only means "send me again in order"
            behind = code == OUT_OF_ORDER_SEQUENCE_NUMBER and bool(self.answered)
            retriable = code in RETRIABLE_CODES or behind
            expired = time.monotonic_ns() - batch.created_ns > delivery_timeout_ms * 1_000_000
            if retriable and batch.attempts <= retries and not expired:
                batch.state = SEALED
            elif code == KAFKA_STORAGE_ERROR:
                batch.complete(-1, self._storage_error(batch.describe()))
            else:
                batch.complete(-1, error_for_code(code, topic=self.topic_name, partition=self.index,
                                                  detail=batch.describe()))
        self.answered.append(batch)

    def end_recovery(self, retry_backoff_ms: int) -> None:
        """Every batch that was in flight has answered: send the refused ones again in order, ahead of
        anything newer, renumbered past those failed for good (after ``retry_backoff_ms``)."""
        shift = 0
        again: list[ProducerBatch] = []
        for batch in self.answered:
            if batch.state == DONE:
                if batch.base_sequence >= 0:
                    shift += batch.record_count  # never appended: its numbers are free again
            else:
                if shift and batch.base_sequence >= 0:
                    batch.base_sequence = (batch.base_sequence - shift) % SEQUENCE_MODULUS
                again.append(batch)
        self.answered = []
        self.recovering = False
        if shift:
            self._shift_queued(shift)
        for batch in reversed(again):
            self.sealed.appendleft(batch)
        if again:
            self.not_before_ns = time.monotonic_ns() + retry_backoff_ms * 1_000_000

    def _shift_queued(self, shift: int) -> None:
        for batch in self.sealed:
            if batch.base_sequence >= 0:
                batch.base_sequence = (batch.base_sequence - shift) % SEQUENCE_MODULUS
        self.next_sequence = (self.next_sequence - shift) % SEQUENCE_MODULUS

    def next_to_publish(self) -> ProducerBatch | None:
        """The first sealed batch still to be published (those that expired are dropped, their numbers
        freed); None if there is none or the queue must not publish now."""
        while self.sealed and not self.recovering and time.monotonic_ns() >= self.not_before_ns:
            batch = self.sealed[0]
            if batch.state != DONE:
                return batch
            self.sealed.popleft()
            if batch.base_sequence >= 0:  # a batch sent before, refused, then expired: free its numbers
                self._shift_queued(batch.record_count)
        return None

    def requeue(self, batches: list[ProducerBatch]) -> None:
        """Batches in flight on a channel given up (failed ring, appliance restart) go back to the front of
        ``sealed``, in order, with their sequence numbers."""
        for batch in reversed(batches):
            if batch.state != DONE:
                batch.state = SEALED
                self.sealed.appendleft(batch)

    def expire(self, now_ns: int, delivery_timeout_ms: int) -> None:
        """Fail the batches older than ``delivery.timeout.ms`` (their outcome is unknown).  A batch refused
        with KAFKA_STORAGE_ERROR and sent again is left to its answer (:meth:`acknowledged` fails it with
        the storage error if it is refused again) for as long again."""
        limit_ns = delivery_timeout_ms * 1_000_000
        for batch in self._in_send_order():
            if batch.state == DONE or now_ns - batch.created_ns <= limit_ns:
                continue
            if (batch.state == PUBLISHED and batch.refused_code == KAFKA_STORAGE_ERROR
                    and now_ns - batch.created_ns <= 2 * limit_ns):
                continue  # sent again after a storage error: its answer, due any moment, says how it ended
            batch.complete(-1, self._expired(batch, delivery_timeout_ms))

    def _expired(self, batch: ProducerBatch, delivery_timeout_ms: int) -> ApplianceError:
        """Why ``batch`` failed at ``delivery.timeout.ms``: the storage error it was last refused with,
        when that is what kept it out of the log (a full disk), else a timeout (outcome unknown)."""
        if batch.refused_code == KAFKA_STORAGE_ERROR and batch.state != PUBLISHED:
            return self._storage_error(f"{batch.describe()}, refused until delivery.timeout.ms "
                                       f"{delivery_timeout_ms} ran out")
        where = "in the ring, not acknowledged" if batch.state == PUBLISHED else "not published"
        return RequestTimeoutError(
            f"partition {self.name}: batch of {batch.describe()} {where} within "
            f"delivery.timeout.ms {delivery_timeout_ms}; it may still be appended"
        )

    def _storage_error(self, detail: str) -> ApplianceError:
        """KAFKA_STORAGE_ERROR for a batch (``detail``), naming the log dir and its free space where the
        route can say (a local appliance: :attr:`storage_detail`)."""
        error = error_for_code(KAFKA_STORAGE_ERROR, topic=self.topic_name, partition=self.index,
                               detail=detail)
        directory, cause = self.storage_detail() if self.storage_detail is not None else ("", "")
        if not directory:
            return error
        return KafkaStorageError(f"{error} (log directory {directory}: {cause})", partition=self.name,
                                 directory=directory, cause=cause)

    def abandon(self, error: RequestTimeoutError) -> None:
        """Fail everything not acknowledged (the producer closes; the caller closes the channel)."""
        pending = self._in_send_order()
        if self.open.values:
            pending.append(self.open)
        if self.channel is not None:
            self.channel.abandon_in_flight()
        for batch in pending:
            if batch.state != DONE:
                batch.complete(-1, error)

    def _in_send_order(self) -> list[ProducerBatch]:
        """The batches sealed and not done, oldest first (so that they complete, and their callbacks run,
        in send order): those answered with an error while recovering, those in flight, those queued."""
        batches = [batch for batch in self.answered if batch.state != DONE]
        if self.channel is not None:
            batches += [batch for _, batch in self.channel.in_flight]
        batches += self.sealed
        return batches
