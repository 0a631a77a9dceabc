"""Which records of a batch a clean keeps, and the kept records written out: two numba kernels.

A record survives a clean (Kafka's ``LogCleaner.shouldRetainRecord``) iff

1. its offset is at or past the end of the offset map (the map has not seen its key's later records), or
2. it has a key, **and** its offset is >= the latest offset the map holds for that key (or the map does not
   hold the key), **and** it has a value, or it is a tombstone (null value) still inside its grace period:
   its batch carries no delete horizon yet, or the clean's time is before it.

A record without a key is never kept: a compacted topic refuses keyless records at produce time (as Kafka
does), so one can only come from before the topic was compacted.

:func:`select_records` walks the records section once and marks what survives (``keep``), remembering where
each record and its ``timestampDelta`` lie; :func:`write_kept` then writes the kept records, verbatim, or
with their ``timestampDelta`` moved to a new ``baseTimestamp`` (the delete horizon, which Kafka stores in
``baseTimestamp``: a record's timestamp, ``baseTimestamp + timestampDelta``, does not change).  Record
offsets never change: ``offsetDelta`` stays relative to the batch's ``baseOffset``, which the clean keeps.
"""

from __future__ import annotations

from typing import Final, NamedTuple

import numba
import numpy as np

from storage.offset_map import MALFORMED_RECORDS, key_hash, map_get
from storage.varint import read_varint, read_varlong, size_of_varint, write_varint

__all__ = ["RecordMarks", "Selection", "select_records", "write_kept"]

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
    """Scratch arrays for one batch's records (at least ``count`` entries each)."""

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


@numba.njit(cache=True)
def select_records(data: np.ndarray, start: int, end: int, count: int, base_offset: int,
                   base_timestamp: int, drop_tombstones: bool, map_end: int, table: np.ndarray,
                   keep: np.ndarray, starts: np.ndarray, ends: np.ndarray,
                   delta_ends: np.ndarray, deltas: np.ndarray) -> tuple[int, int, int, int]:
    """Mark the records of ``data[start:end]`` that survive (rules in the module docstring);
    ``drop_tombstones``: the batch's delete horizon has passed.  Returns ``Selection``'s fields."""
    kept = 0
    tombstones = 0
    keyless = 0
    max_timestamp = _NO_TIMESTAMP
    at = start
    for i in range(count):
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
        tombstone = False
        if offset < map_end:
            if key_length < 0:
                survives = False
                keyless += 1
            else:
                h1, h2 = key_hash(data, p, key_length)
                survives = offset >= map_get(table, h1, h2)
                value_length, _ = read_varint(data, p + key_length, record_end)
                tombstone = value_length < 0
                if tombstone and drop_tombstones:
                    survives = False
        else:
            value_at = p + max(key_length, 0)
            value_length, _ = read_varint(data, value_at, record_end)
            tombstone = value_length < 0
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


@numba.njit(cache=True)
def write_kept(data: np.ndarray, count: int, keep: np.ndarray, starts: np.ndarray, ends: np.ndarray,
               delta_ends: np.ndarray, deltas: np.ndarray, rebase_ms: int, out: np.ndarray,
               at: int) -> int:
    """Write the kept records (``keep``) to ``out`` at ``at``; returns the position after them.  With
    ``rebase_ms`` (old ``baseTimestamp`` - new) every ``timestampDelta`` grows by it, so each record keeps
    its timestamp; ``out`` has room for the records plus 20 bytes each."""
    for i in range(count):
        if not keep[i]:
            continue
        if rebase_ms == 0:
            for k in range(ends[i] - starts[i]):
                out[np.uint64(at + k)] = data[np.uint64(starts[i] + k)]
            at += ends[i] - starts[i]
            continue
        _, body = read_varint(data, starts[i], ends[i])
        delta = deltas[i] + rebase_ms
        rest = ends[i] - delta_ends[i]
        at = write_varint(out, at, 1 + size_of_varint(delta) + rest)
        out[at] = data[body]  # the record's attributes byte
        at = write_varint(out, at + 1, delta)
        for k in range(rest):
            out[np.uint64(at + k)] = data[np.uint64(delta_ends[i] + k)]
        at += rest
    return at
