"""acks=all writes waiting for the high watermark of one partition.

Theory of operation
-------------------
An acks=all produce is appended at once, but answered only when every in-sync replica has it: when the high
watermark passes its last offset (``last_offset < high_watermark``).  Until then it waits here, keyed by its
last offset, with a deadline (the request's ``timeout_ms``; for local producers ``delivery.timeout.ms``).

Each waiter leaves exactly once, with one of:

* ``NONE`` -- the high watermark passed it and the ISR still has ``min.insync.replicas`` members;
* ``NOT_ENOUGH_REPLICAS_AFTER_APPEND`` -- the high watermark passed it, but only because the ISR shrank
  below ``min.insync.replicas`` (Kafka's answer: the record is in the log, fewer replicas than asked hold it;
  an idempotent producer may resend, the duplicate is dropped);
* ``REQUEST_TIMED_OUT`` -- its deadline passed first (outcome unknown to the producer: it may retry);
* whatever :meth:`PendingAcks.fail_all` is given (``NOT_LEADER_OR_FOLLOWER`` when this replica stops leading).

Writes that find the ISR already too small are refused *before* the append
(``PartitionReplicaState.append_error``) and never come here.

Sans-IO and single-threaded like ``replica_state``: the owner calls :meth:`complete` when the high watermark
advances (``ReplicaUpdate.high_watermark_advanced``), :meth:`expire` from its timer (``next_deadline_ms``
says when), and delivers the returned ``(token, error)`` pairs itself.  Both queues are heaps with lazy
removal, so each call costs O(log n) per waiter it releases.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from ipc.kafka import ErrorCode

__all__ = ["PendingAcks"]

T = TypeVar("T")


@dataclass(slots=True)
class _Waiter(Generic[T]):
    last_offset: int
    deadline_ms: int
    sequence: int
    token: T = field(compare=False)
    done: bool = field(default=False, compare=False)


class PendingAcks(Generic[T]):
    """acks=all waiters of one partition; ``token`` is whatever the owner needs to answer one (a request
    and its batch index, a ring slot...)."""

    def __init__(self, name: str = "") -> None:
        self.name = name
        self._by_offset: list[tuple[int, int, _Waiter[T]]] = []
        self._by_deadline: list[tuple[int, int, _Waiter[T]]] = []
        self._sequence = itertools.count()
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def add(self, token: T, *, last_offset: int, deadline_ms: int) -> None:
        """Wait until the high watermark passes ``last_offset`` or ``deadline_ms`` comes."""
        sequence = next(self._sequence)
        waiter = _Waiter(last_offset, deadline_ms, sequence, token)
        heapq.heappush(self._by_offset, (last_offset, sequence, waiter))
        heapq.heappush(self._by_deadline, (deadline_ms, sequence, waiter))
        self._count += 1

    def complete(self, high_watermark: int, *, isr_size: int,
                 min_insync_replicas: int) -> list[tuple[T, ErrorCode]]:
        """Release every waiter whose last offset is below ``high_watermark``, in offset order."""
        error = ErrorCode.NONE
        if isr_size < min_insync_replicas:
            error = ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND
        out: list[tuple[T, ErrorCode]] = []
        heap = self._by_offset
        while heap and heap[0][0] < high_watermark:
            waiter = heapq.heappop(heap)[2]
            if not waiter.done:
                waiter.done = True
                self._count -= 1
                out.append((waiter.token, error))
        self._trim()
        return out

    def expire(self, now_ms: int) -> list[tuple[T, ErrorCode]]:
        """Release every waiter whose deadline is at or before ``now_ms`` with REQUEST_TIMED_OUT."""
        out: list[tuple[T, ErrorCode]] = []
        heap = self._by_deadline
        while heap and heap[0][0] <= now_ms:
            waiter = heapq.heappop(heap)[2]
            if not waiter.done:
                waiter.done = True
                self._count -= 1
                out.append((waiter.token, ErrorCode.REQUEST_TIMED_OUT))
        self._trim()
        return out

    def fail_all(self, error: ErrorCode) -> list[tuple[T, ErrorCode]]:
        """Release every waiter with ``error`` (leadership lost, shutdown), in offset order."""
        out = [(w.token, error) for _, _, w in sorted(self._by_offset) if not w.done]
        for _, _, waiter in self._by_offset:
            waiter.done = True
        self._by_offset.clear()
        self._by_deadline.clear()
        self._count = 0
        return out

    def next_deadline_ms(self) -> int | None:
        """The earliest deadline still pending (when to call :meth:`expire`), or None."""
        self._trim()
        return self._by_deadline[0][0] if self._by_deadline else None

    def _trim(self) -> None:
        """Drop released waiters from the tops of both heaps (lazy removal); rebuild a heap that is mostly
        released waiters, so memory stays proportional to the waiters still pending."""
        for heap in (self._by_offset, self._by_deadline):
            while heap and heap[0][2].done:
                heapq.heappop(heap)
            if len(heap) > 2 * self._count + 64:
                heap[:] = [entry for entry in heap if not entry[2].done]
                heapq.heapify(heap)
