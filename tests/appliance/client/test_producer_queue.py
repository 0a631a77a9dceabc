"""The producer's per-partition bookkeeping (sans-IO): sequence numbers, and what an error answer does to
the batches behind it, against a simple oracle (a list of record counts)."""

from __future__ import annotations

import time
from collections import deque
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from appliance.client.accumulator import DONE, SEALED, CallbackQueue, ProducerBatch
from appliance.client.partition_queue import SEQUENCE_MODULUS, PartitionQueue
from storage.errors import InvalidRecordError, NotEnoughReplicasError, RequestTimeoutError

MESSAGE_TOO_LARGE = 10
NOT_ENOUGH_REPLICAS = 19
OUT_OF_ORDER = 45


def _batch(records: int) -> ProducerBatch:
    batch = ProducerBatch(None, "t", 0, 1 << 20)  # type: ignore[arg-type]  # no handles are made here
    for i in range(records):
        batch.values.append(b"r%d" % i)
    batch.state = SEALED
    return batch


def _published(queue: PartitionQueue, counts: list[int]) -> list[ProducerBatch]:
    batches = [_batch(n) for n in counts]
    for batch in batches:
        queue.number(batch)
        batch.attempts = 1
    return batches


def _answer(queue: PartitionQueue, batch: ProducerBatch, result: int, **kw: Any) -> None:
    queue.acknowledged(batch, result, retries=kw.get("retries", 10),
                       delivery_timeout_ms=kw.get("timeout", 60_000))


def test_sequences_count_records_and_wrap() -> None:
    queue = PartitionQueue("t", 0, _batch(0))
    a, b = _published(queue, [3, 5])
    assert (a.base_sequence, b.base_sequence, queue.next_sequence) == (0, 3, 8)
    queue.number(a)  # a retry keeps its numbers
    assert a.base_sequence == 0 and queue.next_sequence == 8
    queue.next_sequence = SEQUENCE_MODULUS - 2
    (c,) = _published(queue, [4])
    assert c.base_sequence == SEQUENCE_MODULUS - 2 and queue.next_sequence == 2


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 50), min_size=1, max_size=8), st.data())
def test_an_error_answer_renumbers_the_batches_behind_it(counts: list[int], data: st.DataObject) -> None:
    queue = PartitionQueue("t", 0, _batch(0))
    queue.next_sequence = data.draw(st.sampled_from([0, 1000, SEQUENCE_MODULUS - 7]))
    start = queue.next_sequence
    batches = _published(queue, counts)
    failing = data.draw(st.integers(0, len(counts) - 1))
    fatal = data.draw(st.booleans())
    queued_later = _batch(data.draw(st.integers(1, 9)))  # sealed, never published: no numbers yet
    queue.sealed.append(queued_later)
    offset = 0
    for i, batch in enumerate(batches):
        if i < failing:
            _answer(queue, batch, offset)
            offset += batch.record_count
        elif i == failing:
            _answer(queue, batch, -(MESSAGE_TOO_LARGE if fatal else NOT_ENOUGH_REPLICAS))
        else:
            _answer(queue, batch, -OUT_OF_ORDER)  # what the writer says behind a refused batch
        assert queue.recovering == (i >= failing)
    queue.end_recovery(retry_backoff_ms=0)
    assert not queue.recovering and queue.answered == []
    # the oracle: the batches before the failing one are done; the failing one is done (fatal) or first again;
    # those behind it go again in order, numbered contiguously from where the failing one started
    assert all(b.state == DONE and b.error is None for b in batches[:failing])
    again = batches[failing + 1 :] if fatal else batches[failing:]
    if fatal:
        assert batches[failing].state == DONE and isinstance(batches[failing].error, InvalidRecordError)
    assert list(queue.sealed) == [*again, queued_later]
    expected = (start + sum(counts[:failing])) % SEQUENCE_MODULUS
    for batch in again:
        assert batch.state == SEALED and batch.base_sequence == expected
        expected = (expected + batch.record_count) % SEQUENCE_MODULUS
    assert queue.next_sequence == expected, "the next new batch follows the last one sent again"
    assert queued_later.base_sequence == -1


def test_a_retriable_error_keeps_the_numbers_and_waits_for_the_backoff() -> None:
    queue = PartitionQueue("t", 0, _batch(0))
    a, b = _published(queue, [2, 3])
    _answer(queue, a, -NOT_ENOUGH_REPLICAS)
    assert queue.next_to_publish() is None, "nothing new while batches are in flight after an error"
    _answer(queue, b, -OUT_OF_ORDER)
    queue.end_recovery(retry_backoff_ms=50)
    assert (a.base_sequence, b.base_sequence, queue.next_sequence) == (0, 2, 5)
    assert queue.next_to_publish() is None, "retry.backoff.ms"
    time.sleep(0.06)
    assert queue.next_to_publish() is a


def test_retries_run_out_then_the_batch_fails_with_the_writers_error() -> None:
    queue = PartitionQueue("t", 0, _batch(0))
    (a,) = _published(queue, [4])
    a.attempts = 3
    _answer(queue, a, -NOT_ENOUGH_REPLICAS, retries=2)
    assert a.state == DONE and isinstance(a.error, NotEnoughReplicasError)
    assert "t-0" in str(a.error) and "NOT_ENOUGH_REPLICAS" in str(a.error) and "4 records" in str(a.error)
    queue.end_recovery(retry_backoff_ms=0)
    assert queue.next_sequence == 0, "its numbers were never used"


def test_an_expired_batch_frees_its_numbers_and_others_move_down() -> None:
    queue = PartitionQueue("t", 0, _batch(0))
    a, b = _published(queue, [2, 3])
    queue.requeue([a, b])  # e.g. a ring failed: both go again, numbers kept
    a.created_ns -= 10_000 * 1_000_000
    queue.expire(time.monotonic_ns(), delivery_timeout_ms=5_000)
    assert a.state == DONE and isinstance(a.error, RequestTimeoutError) and "not published" in str(a.error)
    assert queue.next_to_publish() is b
    assert (b.base_sequence, queue.next_sequence) == (0, 3)


def test_a_late_success_after_expiry_starts_no_recovery() -> None:
    queue = PartitionQueue("t", 0, _batch(0))
    (a,) = _published(queue, [2])
    a.complete(-1, RequestTimeoutError("expired"))
    _answer(queue, a, 17)
    assert a.error is not None and not queue.recovering, "late success: no recovery, numbers used"
    assert queue.next_sequence == 2


@pytest.mark.parametrize("code", [OUT_OF_ORDER, MESSAGE_TOO_LARGE])
def test_a_first_error_that_is_not_behind_another_is_final(code: int) -> None:
    queue = PartitionQueue("t", 0, _batch(0))
    (a,) = _published(queue, [2])
    _answer(queue, a, -code)
    assert a.state == DONE and isinstance(a.error, InvalidRecordError)


class _Channel:
    """What PartitionQueue reads of a channel: the batches in flight, oldest first."""

    def __init__(self, batches: list[ProducerBatch]) -> None:
        self.in_flight = deque(enumerate(batches))

    def abandon_in_flight(self) -> list[ProducerBatch]:
        batches = [batch for _, batch in self.in_flight]
        self.in_flight.clear()
        return batches


@pytest.mark.parametrize("how", ["close", "delivery.timeout.ms"])
def test_batches_given_up_complete_in_send_order(how: str) -> None:
    """Closing, or delivery.timeout.ms running out for all of them, fails a partition's batches oldest
    first -- answered with an error while recovering, in flight, queued, open -- so their callbacks run in
    send order."""
    completions = CallbackQueue()
    ran: list[int] = []

    def made(number: int) -> ProducerBatch:
        batch = ProducerBatch(None, "t", 0, 1 << 20, completions=completions)  # type: ignore[arg-type]
        batch.append(b"r%d" % number, None, None, None, lambda error, meta, number=number: ran.append(number))
        batch.state = SEALED
        return batch

    queue = PartitionQueue("t", 0, made(5))
    refused, in_flight, also_in_flight, queued = (made(n) for n in range(1, 5))
    queue.answered.append(refused)  # answered with a retriable error, waiting for the others' answers
    queue.recovering = True
    queue.channel = _Channel([in_flight, also_in_flight])  # type: ignore[assignment]
    queue.sealed.append(queued)
    if how == "close":
        queue.abandon(RequestTimeoutError("closed"))
        assert ran == [1, 2, 3, 4, 5]
    else:
        queue.expire(time.monotonic_ns() + 10_000 * 1_000_000, delivery_timeout_ms=5_000)
        assert ran == [1, 2, 3, 4]
