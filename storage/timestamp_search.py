"""ListOffsets by timestamp, to the record: which offset a timestamp, or the max-timestamp spec, names.

Theory of operation
-------------------
Kafka answers a ListOffsets query for a timestamp ``T`` with the first record, in offset order, whose
timestamp is at or after ``T`` and whose offset is at or after the log start offset; its own timestamp comes
with it.  Batches carry their largest timestamp in the header (``maxTimestamp``), and each segment's time
index maps growing timestamps to the batch that first reached them, so the search narrows in three steps:

1. **Segment.**  A segment whose largest timestamp is below ``T`` holds no answer and is skipped
   (:func:`segment_max_timestamp`: the writer's exact field, a closed segment's last time-index entry, or
   the headers walked from that entry for a reader's view of the active segment).
2. **Batch.**  The time index's last entry at or below ``T`` points at a batch every earlier batch of the
   segment stays below (entries are added only when the running maximum grows); from there the headers are
   walked to the first batch whose ``maxTimestamp`` reaches ``T`` (``LogSegment.find_batch_by_timestamp``).
3. **Record.**  That batch is read and decoded (decompressed when compressed; with LogAppendTime every
   record's timestamp is the batch's) and the first record at or after ``T`` (and at or after the log start
   offset) is the answer.  A batch whose records all lie below the log start offset lets the walk go on.

Timestamps need not grow with offsets: a later record may carry an earlier timestamp.  The answer is still
the first *in offset order* that reaches ``T``, which is what the three steps find: a batch skipped in
step 2 has its largest timestamp below ``T``, so none of its records qualifies.

The max-timestamp spec (``MAX_TIMESTAMP``, -3, ListOffsets v7+) names the record with the largest timestamp
at or after the log start offset, the first one in offset order when several share it.  It is found as the
largest timestamp ``M`` over the segments (their headers, the straddling batch at the log start decoded),
then the search above for ``M``: the first record reaching ``M`` is the first one equal to it.

The functions read through ``pread`` on the segment's read descriptor, so the writer (``storage.log``) and
a read-only view (``storage.log_reader``) share them; ``verify`` is the reader's flag (check index answers
against the headers and batch CRCs, since the writer may be appending meanwhile).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from storage.batch_header import BatchHeader
from storage.batch_reader import DecodedBatch, decode_batch
from storage.errors import CorruptRecordError
from storage.segment import LogSegment, OffsetAndTimestamp
from storage.segment_file import BatchHeaders
from storage.time_index import NO_TIMESTAMP

__all__ = [
    "MAX_TIMESTAMP",
    "largest_timestamp",
    "record_at_or_after",
    "record_of_max_timestamp",
    "segment_max_timestamp",
]

MAX_TIMESTAMP = -3  # ListOffsets v7+: the record with the largest timestamp (KIP-734)


def record_at_or_after(segments: Sequence[LogSegment], timestamp_ms: int, *, log_start_offset: int,
                       verify: bool) -> OffsetAndTimestamp | None:
    """The offset and timestamp of the first record at or after ``log_start_offset`` whose timestamp is >=
    ``timestamp_ms`` (>= 0), or None.  ``segments`` in offset order, the last one the active segment."""
    last = len(segments) - 1
    for i, segment in enumerate(segments):
        if segment_max_timestamp(segment, closed=i < last, verify=verify) < timestamp_ms:
            continue
        found = _in_segment(segment, timestamp_ms, log_start_offset, verify)
        if found is not None:
            return found
    return None


def record_of_max_timestamp(segments: Sequence[LogSegment], *, log_start_offset: int,
                            verify: bool) -> OffsetAndTimestamp | None:
    """The first record (offset order, at or after ``log_start_offset``) holding the largest timestamp."""
    top = largest_timestamp(segments, log_start_offset=log_start_offset, verify=verify)
    if top == NO_TIMESTAMP:
        return None
    return record_at_or_after(segments, top, log_start_offset=log_start_offset, verify=verify)


def largest_timestamp(segments: Sequence[LogSegment], *, log_start_offset: int, verify: bool) -> int:
    """The largest record timestamp at or after ``log_start_offset``, or ``NO_TIMESTAMP`` (no record)."""
    last = len(segments) - 1
    top = NO_TIMESTAMP
    for i, segment in enumerate(segments):
        if i < last and segments[i + 1].base_offset <= log_start_offset:
            continue  # every offset of this segment is below the log start
        if segment.base_offset < log_start_offset:
            top = max(top, _max_from(segment, log_start_offset, verify))
        else:
            top = max(top, segment_max_timestamp(segment, closed=i < last, verify=verify))
    return top


def segment_max_timestamp(segment: LogSegment, *, closed: bool, verify: bool) -> int:
    """The segment's largest batch timestamp (``NO_TIMESTAMP`` when empty), as cheaply as it is known."""
    if segment.writable:
        return segment.max_timestamp
    entry = segment.time_index.last_entry()
    if closed and entry is not None:
        return entry.timestamp  # a closed segment's final time-index entry holds its maximum
    end = os.fstat(segment.read_fd).st_size
    headers = BatchHeaders(segment.read_fd, end)
    if entry is None:
        return headers.max_timestamp_from(0, NO_TIMESTAMP, segment.base_offset - 1)[0]
    found = segment.find_batch(entry.offset, verify=verify, end=end)
    if found is None:
        return entry.timestamp
    return headers.max_timestamp_from(found[0], entry.timestamp, entry.offset)[0]


def _in_segment(segment: LogSegment, timestamp_ms: int, log_start_offset: int,
                verify: bool) -> OffsetAndTimestamp | None:
    """Steps 2 and 3 in one segment."""
    end = os.fstat(segment.read_fd).st_size if not segment.writable else segment.size_bytes
    entry = segment.time_index.lookup(timestamp_ms)
    from_offset = max(log_start_offset, segment.base_offset if entry is None else entry.offset)
    found = segment.find_batch(from_offset, verify=verify, end=end)
    headers = BatchHeaders(segment.read_fd, end)
    while found is not None:
        position, header = found
        if header.max_timestamp >= timestamp_ms and header.last_offset >= log_start_offset:
            batch = _decode(segment, position, header, verify)
            hit = np.flatnonzero((batch.timestamps >= timestamp_ms) & (batch.offsets >= log_start_offset))
            if hit.size:
                return OffsetAndTimestamp(int(batch.offsets[hit[0]]), int(batch.timestamps[hit[0]]))
        position += header.size
        following = headers.at(position)
        found = None if following is None else (position, following)
    return None


def _max_from(segment: LogSegment, log_start_offset: int, verify: bool) -> int:
    """The largest record timestamp at or after ``log_start_offset`` in the segment holding it."""
    end = os.fstat(segment.read_fd).st_size if not segment.writable else segment.size_bytes
    found = segment.find_batch(log_start_offset, verify=verify, end=end)
    if found is None:
        return NO_TIMESTAMP
    position, header = found
    batch = _decode(segment, position, header, verify)
    kept = batch.timestamps[batch.offsets >= log_start_offset]
    top = int(kept.max()) if kept.size else NO_TIMESTAMP
    return BatchHeaders(segment.read_fd, end).max_timestamp_from(position + header.size, top, 0)[0]


def _decode(segment: LogSegment, position: int, header: BatchHeader, verify: bool) -> DecodedBatch:
    """The batch at ``position`` decoded, its records' offsets and timestamps absolute."""
    data = os.pread(segment.read_fd, header.size, position)
    if len(data) < header.size:
        raise CorruptRecordError(
            f"{segment.log_path}: batch at position {position} (offsets {header.base_offset}.."
            f"{header.last_offset}) needs {header.size} bytes, the file ends after {len(data)}"
        )
    return decode_batch(data, where=f"{segment.log_path} at position {position}", verify_crc=verify)
