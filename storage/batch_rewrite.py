"""The cleaned form of selected batches, written in numba: copies, rewritten batches and empty batches.

``storage.record_filter`` decides what a clean does with each batch of a run (``select_batches``'s results:
an action, the kept records' marks).  This module writes the outcome into one output buffer, the batches in
order, so that no Python runs per batch:

* :data:`~storage.record_filter.COPY`: the batch's bytes, unchanged (consecutive copies are one copy);
* :data:`~storage.record_filter.REWRITE`: the batch's header with its kept records
  (:func:`~storage.record_filter.write_kept`): the same base offset, last offset delta, producer fields,
  partition leader epoch and codec; ``batchLength``, ``recordsCount``, ``maxTimestamp`` and, for a
  tombstone kept for the first time, the delete horizon (attribute bit 6 and ``baseTimestamp``) set anew;
* :data:`~storage.record_filter.DROP`: nothing, unless the batch is the last of an idempotent producer in
  the log: then Kafka's empty batch (``DefaultRecordBatch.writeEmptyHeader``), the header with no records,
  no codec, base and max timestamp its max timestamp, so the producer's last sequence survives.

A batch written anew needs its CRC-32C (``attributes`` to the end): the kernel lists where each lies and the
caller computes them, all in one call (:func:`fill_crcs`, ``storage.crc32c_kernel``).  Compressed batches
are selected and rewritten by the caller (it decompresses and compresses): it uses :func:`write_header` and
:func:`write_empty` for their headers.
"""

from __future__ import annotations

from typing import Final

import numba
import numpy as np

from storage.batch_header import (
    ATTRIBUTES_OFFSET,
    BASE_OFFSET_OFFSET,
    BASE_TIMESTAMP_OFFSET,
    BATCH_LENGTH_OFFSET,
    CONTROL_FLAG_MASK,
    HEADER_SIZE,
    LAST_OFFSET_DELTA_OFFSET,
    LOG_OVERHEAD,
    MAX_TIMESTAMP_OFFSET,
    PRODUCER_ID_OFFSET,
    RECORDS_COUNT_OFFSET,
    TIMESTAMP_TYPE_MASK,
    TRANSACTIONAL_FLAG_MASK,
)
from storage.batch_scan import read_be
from storage.crc32c_kernel import fill_batch_crcs
from storage.record_filter import COPY, DELETE_HORIZON_FLAG_MASK, DROP, copy_bytes, write_kept

__all__ = ["RECORD_SLACK_BYTES", "fill_crcs", "fitting_stop", "output_bound", "write_empty", "write_header",
           "write_selected"]

RECORD_SLACK_BYTES: Final = 20  # write_kept's room per record: a timestampDelta and a length varint may grow
_EMPTY_KEPT_ATTRIBUTES: Final = TIMESTAMP_TYPE_MASK | TRANSACTIONAL_FLAG_MASK | CONTROL_FLAG_MASK
_NO_PRODUCER: Final = -1


@numba.njit(cache=True, inline="always")
def _put_be(out: np.ndarray, at: int, value: int, size: int) -> None:
    """``value`` as a big-endian integer of ``size`` bytes at ``out[at]``."""
    for k in range(size - 1, -1, -1):
        out[at + k] = value & 0xFF
        value >>= 8


@numba.njit(cache=True)
def write_header(data: np.ndarray, position: int, out: np.ndarray, at: int, attributes: int,
                 base_timestamp: int, max_timestamp: int, records_count: int, size: int) -> None:
    """The header of the batch at ``data[position]`` to ``out[at]``, with these fields set; ``size``: the
    new batch's bytes.  The CRC is left to :func:`fill_crcs`."""
    for k in range(HEADER_SIZE):
        out[at + k] = data[position + k]
    _put_be(out, at + BATCH_LENGTH_OFFSET, size - LOG_OVERHEAD, 4)
    _put_be(out, at + ATTRIBUTES_OFFSET, attributes, 2)
    _put_be(out, at + BASE_TIMESTAMP_OFFSET, base_timestamp, 8)
    _put_be(out, at + MAX_TIMESTAMP_OFFSET, max_timestamp, 8)
    _put_be(out, at + RECORDS_COUNT_OFFSET, records_count, 4)


@numba.njit(cache=True)
def write_empty(data: np.ndarray, position: int, out: np.ndarray, at: int) -> int:
    """Kafka's empty batch for the batch at ``data[position]`` to ``out[at]``; returns the end."""
    attributes = read_be(data, position + ATTRIBUTES_OFFSET, 2) & _EMPTY_KEPT_ATTRIBUTES
    max_timestamp = read_be(data, position + MAX_TIMESTAMP_OFFSET, 8)
    write_header(data, position, out, at, attributes, max_timestamp, max_timestamp, 0, HEADER_SIZE)
    return at + HEADER_SIZE


@numba.njit(cache=True)
def _is_producer_last(data: np.ndarray, position: int, producer_last: np.ndarray) -> bool:
    """Whether the batch at ``data[position]`` is an idempotent producer's last in the log:
    ``producer_last`` holds the last offsets of those batches, sorted (an offset names one batch)."""
    if read_be(data, position + PRODUCER_ID_OFFSET, 8) == _NO_PRODUCER:
        return False
    last = (read_be(data, position + BASE_OFFSET_OFFSET, 8)
            + read_be(data, position + LAST_OFFSET_DELTA_OFFSET, 4))
    at = np.searchsorted(producer_last, last)
    return at < producer_last.shape[0] and producer_last[at] == last


@numba.njit(cache=True)
def _write_rewritten(data: np.ndarray, position: int, size: int, row: np.ndarray, keep: np.ndarray,
                     starts: np.ndarray, ends: np.ndarray, delta_ends: np.ndarray, deltas: np.ndarray,
                     horizon_ms: int, out: np.ndarray, at: int) -> int:
    """The batch at ``data[position]`` with only its kept records (``row``: its ``select_batches``
    results) to ``out[at]``; returns the end."""
    kept, tombstones, max_kept_timestamp, mark_at = row[1], row[2], row[3], row[5]
    attributes = read_be(data, position + ATTRIBUTES_OFFSET, 2)
    base_timestamp = read_be(data, position + BASE_TIMESTAMP_OFFSET, 8)
    set_horizon = tombstones > 0 and attributes & DELETE_HORIZON_FLAG_MASK == 0
    new_base_timestamp = horizon_ms if set_horizon else base_timestamp
    if set_horizon:
        attributes |= DELETE_HORIZON_FLAG_MASK
    count = read_be(data, position + RECORDS_COUNT_OFFSET, 4)
    stop = write_kept(data, mark_at, count, keep, starts, ends, delta_ends, deltas,
                      base_timestamp - new_base_timestamp, out, at + HEADER_SIZE)
    max_timestamp = max_kept_timestamp
    if attributes & TIMESTAMP_TYPE_MASK:  # LogAppendTime: the broker's time stays the batch's
        max_timestamp = read_be(data, position + MAX_TIMESTAMP_OFFSET, 8)
    write_header(data, position, out, at, attributes, new_base_timestamp, max_timestamp, kept, stop - at)
    return stop


@numba.njit(cache=True)
def output_bound(sizes: np.ndarray, first: int, stop: int, results: np.ndarray) -> int:
    """The bytes :func:`write_selected` may write for the batches ``[first, stop)`` at most."""
    total = 0
    for i in range(first, stop):
        total += sizes[i] + RECORD_SLACK_BYTES * results[i - first, 1]
    return total


@numba.njit(cache=True)
def fitting_stop(sizes: np.ndarray, first: int, stop: int, results: np.ndarray, room: int) -> int:
    """The largest ``end`` in ``[first, stop]`` such that :func:`write_selected` of the batches
    ``[first, end)`` writes at most ``room`` bytes (:func:`output_bound`)."""
    total = 0
    for i in range(first, stop):
        total += sizes[i] + RECORD_SLACK_BYTES * results[i - first, 1]
        if total > room:
            return i
    return stop


@numba.njit(cache=True, nogil=True)
def write_selected(data: np.ndarray, positions: np.ndarray, sizes: np.ndarray, first: int, stop: int,
                   results: np.ndarray, keep: np.ndarray, starts: np.ndarray, ends: np.ndarray,
                   delta_ends: np.ndarray, deltas: np.ndarray, horizon_ms: int, producer_last: np.ndarray,
                   out: np.ndarray, crc_spans: np.ndarray) -> tuple[int, int]:
    """Write the cleaned form of the batches ``[first, stop)`` (``results[i - first]``: their
    ``select_batches`` results) to ``out`` (room: :func:`output_bound`); ``horizon_ms``: the delete horizon
    a batch gets (now + ``delete.retention.ms``).  ``crc_spans[n]``: ``(start, end)`` in ``out`` of the
    n-th batch written anew.  Returns ``(bytes written, batches written anew)``."""
    at = 0
    spans = 0
    copy_from = copy_to = 0
    for i in range(first, stop + 1):
        action = results[i - first, 0] if i < stop else 0
        position = positions[i] if i < stop else 0
        if action == COPY:
            if copy_to != position:
                copy_from = position
            copy_to = position + sizes[i]
            continue
        if copy_to > copy_from:
            copy_bytes(data, copy_from, out, at, copy_to - copy_from)
            at += copy_to - copy_from
        copy_from = copy_to = 0
        if i == stop:
            break
        start = at
        if action == DROP:
            if not _is_producer_last(data, position, producer_last):
                continue
            at = write_empty(data, position, out, at)
        else:
            at = _write_rewritten(data, position, sizes[i], results[i - first], keep, starts, ends,
                                  delta_ends, deltas, horizon_ms, out, at)
        crc_spans[spans, 0] = start
        crc_spans[spans, 1] = at
        spans += 1
    return at, spans


def fill_crcs(out: np.ndarray, crc_spans: np.ndarray) -> None:
    """Compute and store the CRC of each batch at ``crc_spans`` (``(start, end)`` rows) in ``out``
    (``storage.crc32c_kernel``: one call for all of them)."""
    fill_batch_crcs(out, crc_spans)
