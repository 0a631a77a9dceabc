"""What an append will write, decided before the log changes (the batches validated, stamped by a leader or
checked for a follower, described as rows the segment indexes by), and what it did (:class:`AppendInfo`).

An append goes in two halves.  This module is the first: pure functions over the appended buffers and their
headers that either raise (nothing was appended, the log is untouched) or return an :class:`AppendPlan`,
one ``(base offset, last offset, size, max timestamp)`` row per batch plus the record count and the byte
count.  The second half, writing the plan into segments and rolling where a roll rule says so, is the
log's (``storage.log``).

* A **leader** assigns offsets: :func:`stamp_as_leader` writes each batch's ``baseOffset`` and
  ``partitionLeaderEpoch`` in place.  The CRC does not cover them, so nothing is recomputed (except on a
  LogAppendTime log, where the leader also stamps the append time, which the CRC covers:
  ``storage.timestamp_rules``).  The header's
  first three fields, ``baseOffset``, ``batchLength`` and ``partitionLeaderEpoch``, lie back to back and
  are written with one ``pack`` (``batchLength`` with the validated value, which is what is there).
* A **follower** keeps the leader's offsets: :func:`check_as_follower` and :func:`check_walked` only refuse
  batches that do not start at the log end or do not move forward.
* :func:`validate_batches` checks untrusted bytes (magic, length, CRC, ``max.message.bytes``) batch by batch
  before any of that.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Final, NamedTuple

import numpy as np

from storage.batch_header import (
    BASE_OFFSET_OFFSET,
    BATCH_HEADER,
    BATCH_LENGTH_OFFSET,
    LOG_OVERHEAD,
    PARTITION_LEADER_EPOCH_OFFSET,
    RECORDS_COUNT_OFFSET,
    BatchHeader,
    check_batch,
    validate_batch,
)
from storage.batch_scan import BatchArrays
from storage.errors import InvalidRecordError, NotLeaderError
from storage.segment import BatchRow
from storage.timestamp_rules import stamp_log_append_time

__all__ = [
    "BATCH_LENGTH_FIELD",
    "FEW_BATCHES",
    "LAST_OFFSET_DELTA_FIELD",
    "MAX_TIMESTAMP_FIELD",
    "RECORDS_COUNT_FIELD",
    "AppendInfo",
    "AppendPlan",
    "check_as_follower",
    "check_leader_epoch",
    "check_walked",
    "pack_stamp",
    "stamp_as_leader",
    "validate_batches",
    "walked_records",
    "walked_rows",
    "writable_bytes",
]

# header fields by position: a tuple index is cheaper than a name (the log's hot path reads them too)
LAST_OFFSET_DELTA_FIELD: Final = BatchHeader._fields.index("last_offset_delta")
BATCH_LENGTH_FIELD: Final = BatchHeader._fields.index("batch_length")
MAX_TIMESTAMP_FIELD: Final = BatchHeader._fields.index("max_timestamp")
RECORDS_COUNT_FIELD: Final = BatchHeader._fields.index("records_count")

_STAMP_RUN: Final = struct.Struct(BATCH_HEADER.format[:4])  # baseOffset, batchLength, partitionLeaderEpoch
assert BatchHeader._fields[:3] == ("base_offset", "batch_length", "partition_leader_epoch")
assert (BASE_OFFSET_OFFSET, BATCH_LENGTH_OFFSET, _STAMP_RUN.size) == (0, 8, PARTITION_LEADER_EPOCH_OFFSET + 4)
pack_stamp = _STAMP_RUN.pack_into  # (buffer, position, base offset, batch length, leader epoch)

_RECORDS_COUNT_BYTES: Final = np.arange(RECORDS_COUNT_OFFSET, RECORDS_COUNT_OFFSET + 4)  # recordsCount
_BIG_INT32: Final = np.dtype(">i4")
_unpack_records_count = struct.Struct(">i").unpack_from  # at RECORDS_COUNT_OFFSET
_new_tuple = tuple.__new__  # NamedTuple construction without its Python-level __new__ (once per append)
FEW_BATCHES: Final = 64  # walked batches: below this many a Python loop per batch costs less than numpy


class AppendInfo(NamedTuple):
    """What an append did."""

    first_offset: int
    last_offset: int
    log_append_time_ms: int  # wall clock at the append (the batches' max timestamp on a LogAppendTime log)
    max_timestamp: int  # largest batch maxTimestamp appended (-1 if none carried one)
    offset_of_max_timestamp: int
    batch_count: int
    record_count: int
    position: int  # byte position of the first batch in its segment file
    segment_base_offset: int  # the segment the first batch went to
    size_bytes: int


class AppendPlan(NamedTuple):
    """The batches an append writes, in order, with their record and byte counts."""

    batches: list[BatchRow]
    records: int
    size_bytes: int


def validate_batches(view: memoryview, where: str, max_batch_bytes: int | None = None, *,
                     first: BatchHeader | int | None = None) -> list[BatchHeader]:
    """Every batch in ``view`` (magic, length, CRC; the size limit for leaders), before anything changes.
    ``first``: what ``check_batch(view, 0, whole=False)`` already returned (not computed twice)."""
    end = len(view)
    if end == 0:
        raise InvalidRecordError(f"{where}: no record batch in an empty buffer")
    headers = []
    position = 0
    while position < end:
        header = check_batch(view, position, whole=False) if position or first is None else first
        if isinstance(header, int):  # refused: validate_batch raises, saying why
            header = validate_batch(view, position, where=where)
        size = header.batch_length + LOG_OVERHEAD
        if max_batch_bytes is not None and size > max_batch_bytes:
            raise InvalidRecordError(
                f"{where}: record batch at position {position} is {size} bytes, larger than "
                f"max.message.bytes {max_batch_bytes}"
            )
        headers.append(header)
        position += size
    return headers


def check_leader_epoch(latest_epoch: int, leader_epoch: int, name: str) -> int:
    """``latest_epoch`` (the log's latest recorded epoch), after refusing an append of partition ``name`` in
    an older (:class:`NotLeaderError`: this writer was fenced) or a negative ``leader_epoch``."""
    if leader_epoch < latest_epoch:
        raise NotLeaderError(
            f"partition {name}: append in leader epoch {leader_epoch}, but epoch {latest_epoch} is "
            "already recorded; this writer was fenced"
        )
    if leader_epoch < 0:
        raise ValueError(f"partition {name}: leader epoch {leader_epoch} must be >= 0")
    return latest_epoch


def stamp_as_leader(parts: Sequence[memoryview], headers: Sequence[BatchHeader], first_offset: int,
                    leader_epoch: int, append_time_ms: int | None = None) -> AppendPlan:
    """Assign offsets from ``first_offset`` and stamp each batch in place with its base offset and
    ``leader_epoch``.  ``parts``: one buffer per batch, or one buffer holding every batch back to back.
    ``append_time_ms`` (a LogAppendTime log): also make each batch a LogAppendTime batch of that time
    (``storage.timestamp_rules``), and index it by that time."""
    whole = parts[0] if len(parts) != len(headers) else None
    batches: list[BatchRow] = []
    records = total = 0
    next_offset = first_offset
    for i, header in enumerate(headers):
        size = header[BATCH_LENGTH_FIELD] + LOG_OVERHEAD
        buffer, position = (parts[i], 0) if whole is None else (whole, total)
        pack_stamp(buffer, position, next_offset, size - LOG_OVERHEAD, leader_epoch)
        max_timestamp = header[MAX_TIMESTAMP_FIELD]
        if append_time_ms is not None:
            stamp_log_append_time(buffer, position, header, append_time_ms)
            max_timestamp = append_time_ms
        last = next_offset + header[LAST_OFFSET_DELTA_FIELD]
        batches.append((next_offset, last, size, max_timestamp))
        records += header[RECORDS_COUNT_FIELD]
        total += size
        next_offset = last + 1
    return _new_tuple(AppendPlan, (batches, records, total))


def check_as_follower(headers: Sequence[BatchHeader], log_end_offset: int, name: str) -> AppendPlan:
    """A leader's batches, offsets kept: the first must start at or after ``log_end_offset`` and offsets must
    move forward (:class:`InvalidRecordError` naming partition ``name`` otherwise).  A batch may start past
    the offset after the one before it: a compacted leader's log has such gaps, and a follower copies them
    (Kafka's follower checks only that offsets increase)."""
    expected = log_end_offset
    batches: list[BatchRow] = []
    records = position = 0
    for header in headers:
        if not batches and header.base_offset < expected:
            raise _below_log_end(name, header.base_offset, expected)
        if header.base_offset < expected:
            raise InvalidRecordError(
                f"partition {name}: follower append: record batch at position {position} has base "
                f"offset {header.base_offset}, expected at least {expected} (offsets must move forward)"
            )
        batches.append((header.base_offset, header.last_offset, header.size, header.max_timestamp))
        records += header.records_count
        expected = header.last_offset + 1
        position += header.size
    return _new_tuple(AppendPlan, (batches, records, position))


def check_walked(view: memoryview, batches: BatchArrays, log_end_offset: int, name: str) -> None:
    """Walked batches (``storage.batch_scan.walk_batches``' arrays) of a follower append: at least one, the
    first at position 0 and at or after ``log_end_offset``, the last ending at the end of ``view``."""
    count = len(batches.positions)
    if count == 0 or batches.positions[0] != 0 or int(batches.positions[-1] + batches.sizes[-1]) != len(
            view):
        raise InvalidRecordError(f"partition {name} append: follower append: the walked batches do not "
                                 f"cover the buffer of {len(view)} bytes ({count} batches)")
    first_base = int(batches.base_offsets[0])
    if first_base < log_end_offset:
        raise _below_log_end(name, first_base, log_end_offset)


def _below_log_end(name: str, base_offset: int, log_end_offset: int) -> InvalidRecordError:
    return InvalidRecordError(
        f"partition {name}: follower append: the first record batch has base offset {base_offset}, below "
        f"the log end offset {log_end_offset}: the logs diverged; truncate the follower, then fetch again")


def walked_rows(batches: BatchArrays) -> list[BatchRow]:
    """The walked batches as rows."""
    return list(zip(batches.base_offsets.tolist(), batches.last_offsets.tolist(), batches.sizes.tolist(),
                    batches.max_timestamps.tolist(), strict=True))


def walked_records(view: memoryview, batches: BatchArrays) -> int:
    """The records in the walked batches of ``view`` (their ``recordsCount`` fields summed): a loop for a
    few batches, where numpy's fixed cost per call would be more than the loop's."""
    if len(batches.positions) < FEW_BATCHES:
        return sum(_unpack_records_count(view, position + RECORDS_COUNT_OFFSET)[0]
                   for position in batches.positions.tolist())
    counts = np.frombuffer(view, dtype=np.uint8)[batches.positions[:, None] + _RECORDS_COUNT_BYTES]
    return int(counts.view(_BIG_INT32).sum())


def writable_bytes(buf: bytes | bytearray | memoryview) -> memoryview:
    """``buf`` as a writable 1-D byte memoryview: itself where it is one, else a copy (read-only bytes)."""
    view = memoryview(buf)
    if view.readonly:
        view = memoryview(bytearray(view))
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return view
