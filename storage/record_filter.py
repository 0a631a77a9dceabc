"""Which records of a batch a clean keeps, and the kept records written out: numba kernels.

A record survives a clean (Kafka's ``LogCleaner.shouldRetainRecord``) iff

1. its offset is at or past the end of the offset map (the map has not seen its key's later records), or
2. it has a key, **and** its offset is >= the latest offset the map holds for that key (or the map does not
   hold the key), **and** it has a value, or it is a tombstone (null value) still inside its grace period:
   its batch carries no delete horizon yet, or the clean's time is before it.

A record without a key is never kept: a compacted topic refuses keyless records at produce time (as Kafka
does), so one can only come from before the topic was compacted.

:func:`select_records` walks a batch's records section once and marks what survives (``keep``), remembering
where each record and its ``timestampDelta`` lie (:func:`select_batches` does it for a run of a segment's
uncompressed batches in one call, reading their headers itself, and says what to do with each batch:
:func:`batch_action`).  For a batch the map pass left record entries for (``storage.offset_map``: where
each record starts, its ``offsetDelta``, tombstone and keyless flags) :func:`select_entries` decides the
same from the entries and the map's latest-offset bitmap instead of parsing the records again, and reads
only the kept records' ``timestampDelta``; :func:`write_kept` then writes the kept records, verbatim, or
with their ``timestampDelta`` moved to a new ``baseTimestamp`` (the delete horizon, which Kafka stores in
``baseTimestamp``: a record's timestamp, ``baseTimestamp + timestampDelta``, does not change).  Record
offsets never change: ``offsetDelta`` stays relative to the batch's ``baseOffset``, which the clean keeps.
"""

from __future__ import annotations

from typing import Final, NamedTuple

import numba
import numpy as np

from storage.batch_header import (
    ATTRIBUTES_OFFSET,
    BASE_OFFSET_OFFSET,
    BASE_TIMESTAMP_OFFSET,
    COMPRESSION_CODEC_MASK,
    CONTROL_FLAG_MASK,
    HEADER_SIZE,
    RECORDS_COUNT_OFFSET,
)
from storage.batch_scan import read_be
from storage.offset_map import (
    ENTRY_KEYLESS,
    ENTRY_TOMBSTONE,
    MALFORMED_RECORDS,
    STOPPED,
    entry_offset_delta,
    entry_position,
    is_latest,
    key_hash,
    map_find,
    slot_offset,
)
from storage.varint import read_varint, read_varlong, size_of_varint, write_varint

__all__ = [
    "COPY",
    "DELETE_HORIZON_FLAG_MASK",
    "DROP",
    "MARKS_FULL",
    "RESULT_COLUMNS",
    "REWRITE",
    "RecordMarks",
    "Selection",
    "batch_action",
    "copy_bytes",
    "select_batches",
    "select_entries",
    "select_records",
    "write_kept",
]

DELETE_HORIZON_FLAG_MASK: Final = 0x40  # attribute bit 6: baseTimestamp holds the delete horizon (KIP-534)
COPY: Final = 1  # batch_action: the batch is copied byte for byte
DROP: Final = 2  # batch_action: no record survives
REWRITE: Final = 3  # batch_action: the kept records go in a new batch
RESULT_COLUMNS: Final = 6  # select_batches' results: action, kept, tombstones, max timestamp, keyless, mark
MARKS_FULL: Final = -4  # select_batches: the next batch's records do not fit the marks left
NOT_COVERED: Final = -5  # select_entries: a record's offset is outside the latest-offset bitmap
_KEYLESS_BIT = np.uint64(ENTRY_KEYLESS)
_TOMBSTONE_BIT = np.uint64(ENTRY_TOMBSTONE)
_NO_TIMESTAMP: Final = -1


class Selection(NamedTuple):
    """What :func:`select_records` found: kept records, of which tombstones; the largest kept timestamp
    (``baseTimestamp + timestampDelta``); ``MALFORMED_RECORDS`` in ``kept`` when the section does not parse;
    ``keyless`` counts the records dropped for having no key."""

    kept: int
    tombstones: int
    max_timestamp: int
    keyless: int


class RecordMarks(NamedTuple):
    """Scratch arrays for the records of a run of batches, one after the other."""

    keep: np.ndarray  # bool
    starts: np.ndarray  # int64: where the record's length varint starts
    ends: np.ndarray  # int64: where the record ends
    delta_ends: np.ndarray  # int64: where its timestampDelta ends
    deltas: np.ndarray  # int64: its timestampDelta

    @classmethod
    def make(cls, count: int) -> RecordMarks:
        return cls(np.zeros(count, np.bool_), np.zeros(count, np.int64), np.zeros(count, np.int64),
                   np.zeros(count, np.int64), np.zeros(count, np.int64))

    def fits(self, count: int) -> bool:
        return self.keep.shape[0] >= count


@numba.njit(cache=True, inline="always")
def _not_superseded(data: np.ndarray, key_at: int, key_length: int, offset: int, table: np.ndarray,
                    bits: np.ndarray, bits_base: int) -> bool:
    """Whether the record at ``offset`` (below the map's end) whose key is at ``data[key_at:]`` is at or
    past the latest offset the map holds for its key: its bit in the map's latest-offset bitmap
    (``storage.offset_map.is_latest``) where the bitmap covers it, else by hashing the key and looking it
    up (not in the map: not superseded)."""
    marked = is_latest(bits, bits_base, offset)
    if marked >= 0:
        return marked == 1
    h1, h2 = key_hash(data, key_at, key_length)
    slot, found = map_find(table, h1, h2)
    return not found or offset >= slot_offset(table, slot)


@numba.njit(cache=True, nogil=True)
def select_records(data: np.ndarray, start: int, end: int, count: int, base_offset: int,
                   base_timestamp: int, drop_tombstones: bool, map_end: int, table: np.ndarray,
                   bits: np.ndarray, bits_base: int, keep: np.ndarray, starts: np.ndarray, ends: np.ndarray,
                   delta_ends: np.ndarray, deltas: np.ndarray, mark_at: int) -> tuple[int, int, int, int]:
    """Mark the records of ``data[start:end]`` that survive (rules in the module docstring) in the marks
    from ``mark_at`` on; ``drop_tombstones``: the batch's delete horizon has passed; ``table``, ``bits``
    and ``bits_base``: the offset map's table and its latest-offset bitmap over the offsets from
    ``bits_base``.  Returns ``Selection``'s fields."""
    kept = 0
    tombstones = 0
    keyless = 0
    max_timestamp = _NO_TIMESTAMP
    at = start
    for n in range(count):
        i = mark_at + n
        length, after = read_varint(data, at, end)
        if after < 0 or length <= 0 or after + length > end:
            return MALFORMED_RECORDS, 0, 0, 0
        record_end = after + length
        delta, p = read_varlong(data, after + 1, record_end)
        if p < 0:
            return MALFORMED_RECORDS, 0, 0, 0
        starts[i] = at
        ends[i] = record_end
        delta_ends[i] = p
        deltas[i] = delta
        offset_delta, p = read_varint(data, p, record_end)
        if p < 0:
            return MALFORMED_RECORDS, 0, 0, 0
        key_length, p = read_varint(data, p, record_end)
        if p < 0 or key_length < -1 or p + key_length > record_end:
            return MALFORMED_RECORDS, 0, 0, 0
        offset = base_offset + offset_delta
        survives = True
        value_length, _ = read_varint(data, p + max(key_length, 0), record_end)
        tombstone = value_length < 0
        if offset < map_end:
            if key_length < 0:
                survives = False
                keyless += 1
            else:
                survives = (_not_superseded(data, p, key_length, offset, table, bits, bits_base)
                            and not (tombstone and drop_tombstones))
        keep[i] = survives
        if survives:
            kept += 1
            if tombstone:
                tombstones += 1
            if base_timestamp + delta > max_timestamp:
                max_timestamp = base_timestamp + delta
        at = record_end
    if at != end:
        return MALFORMED_RECORDS, 0, 0, 0
    return kept, tombstones, max_timestamp, keyless


@numba.njit(cache=True, nogil=True)
def select_entries(data: np.ndarray, end: int, count: int, base_offset: int, base_timestamp: int,
                   drop_tombstones: bool, map_end: int, entries: np.ndarray, entry_at: int, bits: np.ndarray,
                   bits_base: int, keep: np.ndarray, starts: np.ndarray, ends: np.ndarray,
                   delta_ends: np.ndarray, deltas: np.ndarray, mark_at: int) -> tuple[int, int, int, int]:
    """:func:`select_records` for a batch the map pass read, from its ``count`` record entries at
    ``entries[entry_at:]`` (``end``: where its records section ends): a record is kept iff it has a key,
    its offset's bit is set in ``bits`` (the map's latest-offset bitmap over the offsets from
    ``bits_base``) and it is not a tombstone to drop.  Marks as :func:`select_records` (the positions only
    for kept records).  Returns ``Selection``'s fields, or :data:`NOT_COVERED` as ``kept`` when a
    record's offset is at or past ``map_end`` or a keyed record's lies outside the bitmap (the caller
    selects the batch with :func:`select_records`)."""
    kept = 0
    tombstones = 0
    keyless = 0
    max_timestamp = _NO_TIMESTAMP
    for n in range(count):
        i = mark_at + n
        entry = entries[entry_at + n]
        offset = base_offset + entry_offset_delta(entry)
        if offset >= map_end:
            return NOT_COVERED, 0, 0, 0
        survives = False
        tombstone = entry & _TOMBSTONE_BIT != 0
        if entry & _KEYLESS_BIT:
            keyless += 1
        else:
            marked = is_latest(bits, bits_base, offset)
            if marked < 0:
                return NOT_COVERED, 0, 0, 0
            survives = marked == 1 and not (tombstone and drop_tombstones)
        keep[i] = survives
        if not survives:
            continue
        at = entry_position(entry)
        record_end = entry_position(entries[entry_at + n + 1]) if n + 1 < count else end
        _, after = read_varint(data, at, record_end)
        delta, p = read_varlong(data, after + 1, record_end)  # parsed by the map pass: well formed
        starts[i] = at
        ends[i] = record_end
        delta_ends[i] = p
        deltas[i] = delta
        kept += 1
        if tombstone:
            tombstones += 1
        if base_timestamp + delta > max_timestamp:
            max_timestamp = base_timestamp + delta
    return kept, tombstones, max_timestamp, keyless


@numba.njit(cache=True)
def batch_action(kept: int, count: int, tombstones: int, has_horizon: bool) -> int:
    """What the clean does with a selected batch: :data:`DROP` (no record kept), :data:`COPY` (all kept
    and no delete horizon to set) or :data:`REWRITE`."""
    if kept == 0:
        return DROP
    if kept == count and (tombstones == 0 or has_horizon):
        return COPY
    return REWRITE


@numba.njit(cache=True, nogil=True)
def select_batches(data: np.ndarray, positions: np.ndarray, sizes: np.ndarray, first: int, now_ms: int,
                   map_end: int, table: np.ndarray, bits: np.ndarray, bits_base: int, entries: np.ndarray,
                   batch_entries: np.ndarray, keep: np.ndarray, starts: np.ndarray, ends: np.ndarray,
                   delta_ends: np.ndarray, deltas: np.ndarray, results: np.ndarray) -> tuple[int, int]:
    """:func:`select_records` over the batches at ``positions[first:]`` of a segment (``data``: all of
    it), their marks one after the other from 0; a batch ``i`` whose ``batch_entries[i]`` is >= 0 (the
    array may be shorter: none) from its record entries there (:func:`select_entries`).
    ``results[i - first]``: the batch's action
    (:func:`batch_action`; :data:`COPY` also for a control batch and one from the map's end on, which are
    not read), ``Selection``'s fields and where its marks start (:data:`RESULT_COLUMNS`).  Returns
    ``(batch index, code)``: code 0 when all were selected; else the batch at the index was not:
    :data:`STOPPED` (compressed: the caller selects it), :data:`MARKS_FULL` (its records do not fit the
    marks or ``results`` left: the caller writes what was selected, then calls again) or
    ``MALFORMED_RECORDS``."""
    mark_at = 0
    for i in range(first, positions.shape[0]):
        row = i - first
        if row == results.shape[0]:
            return i, MARKS_FULL
        position = positions[i]
        attributes = read_be(data, position + ATTRIBUTES_OFFSET, 2)
        base_offset = read_be(data, position + BASE_OFFSET_OFFSET, 8)
        if attributes & CONTROL_FLAG_MASK or base_offset >= map_end:
            results[row, :] = 0
            results[row, 0] = COPY
            continue
        if attributes & COMPRESSION_CODEC_MASK:
            return i, STOPPED
        count = read_be(data, position + RECORDS_COUNT_OFFSET, 4)
        if mark_at + count > keep.shape[0]:
            return i, MARKS_FULL
        base_timestamp = read_be(data, position + BASE_TIMESTAMP_OFFSET, 8)
        has_horizon = attributes & DELETE_HORIZON_FLAG_MASK != 0
        drop_tombstones = has_horizon and now_ms >= base_timestamp
        kept = NOT_COVERED
        tombstones = max_timestamp = keyless = 0
        if i < batch_entries.shape[0] and batch_entries[i] >= 0:
            kept, tombstones, max_timestamp, keyless = select_entries(
                data, position + sizes[i], count, base_offset, base_timestamp, drop_tombstones, map_end,
                entries, batch_entries[i], bits, bits_base, keep, starts, ends, delta_ends, deltas, mark_at)
        if kept == NOT_COVERED:
            kept, tombstones, max_timestamp, keyless = select_records(
                data, position + HEADER_SIZE, position + sizes[i], count, base_offset, base_timestamp,
                drop_tombstones, map_end, table, bits, bits_base, keep, starts, ends, delta_ends, deltas,
                mark_at)
        if kept == MALFORMED_RECORDS:
            return i, MALFORMED_RECORDS
        results[row, 0] = batch_action(kept, count, tombstones, has_horizon)
        results[row, 1] = kept
        results[row, 2] = tombstones
        results[row, 3] = max_timestamp
        results[row, 4] = keyless
        results[row, 5] = mark_at
        mark_at += count
    return positions.shape[0], 0


@numba.njit(cache=True, inline="always")
def copy_bytes(data: np.ndarray, start: int, out: np.ndarray, at: int, count: int) -> None:
    """``data[start:start + count]`` to ``out[at:]``: a loop on unsigned indexes, which LLVM vectorizes
    (numba's slice assignment copies element by element with checks, several times slower)."""
    for k in range(count):
        out[np.uint64(at + k)] = data[np.uint64(start + k)]


@numba.njit(cache=True, nogil=True)
def write_kept(data: np.ndarray, first: int, count: int, keep: np.ndarray, starts: np.ndarray,
               ends: np.ndarray, delta_ends: np.ndarray, deltas: np.ndarray, rebase_ms: int, out: np.ndarray,
               at: int) -> int:
    """Write the kept records (``keep``) among the ``count`` marks from ``first`` to ``out`` at ``at``;
    returns the position after them.  With
    ``rebase_ms`` (old ``baseTimestamp`` - new) every ``timestampDelta`` grows by it, so each record keeps
    its timestamp; ``out`` has room for the records plus 20 bytes each.  Kept records that follow one
    another in ``data`` are copied together."""
    if rebase_ms == 0:
        run_start = run_end = 0
        for i in range(first, first + count):
            if not keep[i]:
                continue
            if starts[i] != run_end:
                copy_bytes(data, run_start, out, at, run_end - run_start)
                at += run_end - run_start
                run_start = starts[i]
            run_end = ends[i]
        copy_bytes(data, run_start, out, at, run_end - run_start)
        return at + run_end - run_start
    for i in range(first, first + count):
        if not keep[i]:
            continue
        _, body = read_varint(data, starts[i], ends[i])
        delta = deltas[i] + rebase_ms
        rest = ends[i] - delta_ends[i]
        at = write_varint(out, at, 1 + size_of_varint(delta) + rest)
        out[at] = data[body]  # the record's attributes byte
        at = write_varint(out, at + 1, delta)
        copy_bytes(data, delta_ends[i], out, at, rest)
        at += rest
    return at
