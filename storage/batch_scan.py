"""Walk the record batches of a segment file fast: structure in numba, CRC with hardware crc32c.

Theory of operation
-------------------
Recovery and index rebuilding must check every batch of a file at memory speed.  The work is split so that
no Python runs per byte and little runs per batch:

1. :func:`walk_batches` (numba) walks batch headers over the file's bytes (a read-only mmap) and checks the
   structure of each batch: (1) a whole header is present, (2) magic is 2, (3) ``batchLength`` covers at
   least a header and the batch lies inside the file, (4) ``lastOffsetDelta`` and ``recordsCount`` are not
   negative, (5) offsets move forward (``baseOffset`` >= the previous batch's next offset and >= the
   segment's base offset) and (6) the last offset fits the segment's int32 relative offsets.  It fills
   per-batch arrays (position, size, offsets, max timestamp, leader epoch, stored CRC) and stops at the
   first batch that breaks a rule, or when its arrays are full.
2. Python checks each batch's CRC-32C (``crc32c``, the CPU's CRC instruction, over a memoryview slice: no
   copy).
3. :func:`plan_index_entries` (numba) derives the sparse index entries from the valid batches with the
   same rule the live append uses (``storage.segment``): an offset-index entry for a batch when more than
   ``index.interval.bytes`` were appended since the last entry, a time-index entry there when the max
   timestamp grew.

The first batch that fails (1)-(6) or its CRC ends the valid prefix; :class:`SegmentScan` says where and
why, and the caller (``storage.recovery``) decides whether that is a torn tail to cut or an error: it asks
:func:`valid_batches_after` whether any valid batch follows the damage (every position after it is tried:
:func:`next_candidate` in numba for the structure, then the CRC).
"""

from __future__ import annotations

import mmap
import os
from typing import Final, NamedTuple

import crc32c
import numba
import numpy as np

from storage.batch_header import (
    ATTRIBUTES_OFFSET,
    BASE_OFFSET_OFFSET,
    BATCH_LENGTH_OFFSET,
    CRC_OFFSET,
    HEADER_SIZE,
    LAST_OFFSET_DELTA_OFFSET,
    LOG_OVERHEAD,
    MAGIC,
    MAGIC_OFFSET,
    MAX_TIMESTAMP_OFFSET,
    PARTITION_LEADER_EPOCH_OFFSET,
    RECORDS_COUNT_OFFSET,
)
from storage.errors import CorruptRecordError
from storage.time_index import NO_TIMESTAMP

__all__ = [
    "BAD_COUNTS",
    "BAD_LENGTH",
    "BAD_MAGIC",
    "BAD_OFFSETS",
    "END",
    "FULL",
    "TRUNCATED",
    "WALK_CAPACITY",
    "BatchArrays",
    "FoundBatch",
    "ScanError",
    "SegmentScan",
    "check_crcs",
    "kernel_error",
    "map_readonly",
    "next_candidate",
    "plan_index_entries",
    "read_be",
    "scan_segment",
    "valid_batches_after",
    "walk_batches",
]

# walk_batches codes: >= 0 means the walk may continue, < 0 names the rule the batch at stop broke.
END: Final = 0  # reached the end of the bytes on a batch boundary
FULL: Final = 1  # output arrays full; call again from the returned position
TRUNCATED: Final = -1  # header or batch runs past the end of the file (a torn write)
BAD_MAGIC: Final = -2
BAD_LENGTH: Final = -3
BAD_COUNTS: Final = -4
BAD_OFFSETS: Final = -5
BAD_CRC: Final = -6  # found by the Python CRC pass, not the kernel

REASONS: Final = {
    TRUNCATED: "batch runs past the end of the file",
    BAD_MAGIC: "magic is not 2",
    BAD_LENGTH: "batchLength is smaller than a batch header",
    BAD_COUNTS: "lastOffsetDelta or recordsCount is negative",
    BAD_OFFSETS: "offsets go backwards or overflow the segment's relative offsets",
    BAD_CRC: "CRC-32C mismatch",
}

_INT32_MAX: Final = 2**31 - 1
WALK_CAPACITY: Final = 1 << 16  # batches per kernel call


@numba.njit(cache=True)
def read_be(buf: np.ndarray, at: int, size: int) -> int:
    """The signed big-endian integer of ``size`` bytes at ``buf[at]`` (a header field, in numba)."""
    value = int(buf[at])
    if value >= 128:
        value -= 256
    for k in range(1, size):
        value = value * 256 + int(buf[at + k])
    return value


@numba.njit(cache=True)
def walk_batches(
    buf: np.ndarray,
    start: int,
    end: int,
    segment_base_offset: int,
    min_base_offset: int,
    positions: np.ndarray,
    sizes: np.ndarray,
    base_offsets: np.ndarray,
    last_offsets: np.ndarray,
    max_timestamps: np.ndarray,
    epochs: np.ndarray,
    crcs: np.ndarray,
) -> tuple[int, int, int]:
    """Walk from ``start`` to ``end``; returns ``(batches found, stop position, code)``."""
    capacity = positions.shape[0]
    n = 0
    pos = start
    expected = min_base_offset
    while True:
        if pos == end:
            return n, pos, END
        if n == capacity:
            return n, pos, FULL
        if end - pos < HEADER_SIZE:
            return n, pos, TRUNCATED
        if buf[pos + MAGIC_OFFSET] != MAGIC:
            return n, pos, BAD_MAGIC
        size = read_be(buf, pos + BATCH_LENGTH_OFFSET, 4) + LOG_OVERHEAD
        if size < HEADER_SIZE:
            return n, pos, BAD_LENGTH
        if size > end - pos:
            return n, pos, TRUNCATED
        delta = read_be(buf, pos + LAST_OFFSET_DELTA_OFFSET, 4)
        if delta < 0 or read_be(buf, pos + RECORDS_COUNT_OFFSET, 4) < 0:
            return n, pos, BAD_COUNTS
        base = read_be(buf, pos + BASE_OFFSET_OFFSET, 8)
        last = base + delta
        if base < expected or last - segment_base_offset > _INT32_MAX:
            return n, pos, BAD_OFFSETS
        positions[n] = pos
        sizes[n] = size
        base_offsets[n] = base
        last_offsets[n] = last
        max_timestamps[n] = read_be(buf, pos + MAX_TIMESTAMP_OFFSET, 8)
        epochs[n] = read_be(buf, pos + PARTITION_LEADER_EPOCH_OFFSET, 4)
        crcs[n] = read_be(buf, pos + CRC_OFFSET, 4) & 0xFFFFFFFF
        n += 1
        pos += size
        expected = last + 1


@numba.njit(cache=True)
def plan_index_entries(
    positions: np.ndarray,
    sizes: np.ndarray,
    last_offsets: np.ndarray,
    max_timestamps: np.ndarray,
    count: int,
    segment_base_offset: int,
    index_interval_bytes: int,
    state: np.ndarray,
    index_relative_offsets: np.ndarray,
    index_positions: np.ndarray,
    time_timestamps: np.ndarray,
    time_relative_offsets: np.ndarray,
) -> tuple[int, int]:
    """Sparse index entries for ``count`` consecutive valid batches; returns (offset entries, time entries).

    ``state`` carries across calls: ``[bytes since last index entry, max timestamp so far, offset of it,
    last time-index timestamp]``; start it at ``[0, NO_TIMESTAMP, base - 1, NO_TIMESTAMP]``.
    """
    n_index = 0
    n_time = 0
    for i in range(count):
        if max_timestamps[i] > state[1]:
            state[1] = max_timestamps[i]
            state[2] = last_offsets[i]
        if state[0] > index_interval_bytes:
            index_relative_offsets[n_index] = last_offsets[i] - segment_base_offset
            index_positions[n_index] = positions[i]
            n_index += 1
            if state[1] > state[3]:
                time_timestamps[n_time] = state[1]
                time_relative_offsets[n_time] = state[2] - segment_base_offset
                state[3] = state[1]
                n_time += 1
            state[0] = 0
        state[0] += sizes[i]
    return n_index, n_time


class BatchArrays(NamedTuple):
    """Per-batch arrays of one kernel call (views of the first ``count`` rows)."""

    positions: np.ndarray
    sizes: np.ndarray
    base_offsets: np.ndarray
    last_offsets: np.ndarray
    max_timestamps: np.ndarray
    epochs: np.ndarray
    crcs: np.ndarray


class ScanError(NamedTuple):
    """The first batch that is not valid: where, which rule, and what its header claims."""

    position: int
    code: int
    reason: str
    base_offset: int | None  # from its header, when a header was there to read
    last_offset: int | None


class SegmentScan(NamedTuple):
    """What a scan found in one segment file: the valid prefix and the index entries it implies."""

    valid_bytes: int
    next_offset: int  # offset after the last valid batch (the segment base offset if none)
    batch_count: int
    max_timestamp: int  # NO_TIMESTAMP if none
    offset_of_max_timestamp: int
    first_batch_max_timestamp: int  # NO_TIMESTAMP if no batch
    index_relative_offsets: np.ndarray
    index_positions: np.ndarray
    time_timestamps: np.ndarray
    time_relative_offsets: np.ndarray
    epoch_starts: list[tuple[int, int]]  # (partition leader epoch, base offset) where the epoch changes
    error: ScanError | None


def map_readonly(path: str) -> mmap.mmap | None:
    """The file at ``path`` mapped read-only, whole as it is now (None: the file is empty); the
    descriptor is closed at once (the mapping keeps the file)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        return mmap.mmap(fd, size, access=mmap.ACCESS_READ) if size else None
    finally:
        os.close(fd)


def scan_segment(
    path: str, base_offset: int, *, index_interval_bytes: int, check_crc: bool = True
) -> SegmentScan:
    """Check every batch of the segment file at ``path``; never raises for bad data (see ``error``)."""
    mm = map_readonly(path)
    if mm is None:
        return _scan(memoryview(b""), np.zeros(0, np.uint8), base_offset, index_interval_bytes, check_crc)
    try:
        mm.madvise(mmap.MADV_SEQUENTIAL)
        view = memoryview(mm)
        array = np.frombuffer(mm, dtype=np.uint8)
        try:
            return _scan(view, array, base_offset, index_interval_bytes, check_crc)
        finally:
            del array
            view.release()
    finally:
        mm.close()


def _scan(view: memoryview, array: np.ndarray, base_offset: int, interval: int,
          check_crc: bool) -> SegmentScan:
    end = len(view)
    arrays = tuple(np.empty(WALK_CAPACITY, dtype=np.int64) for _ in range(7))
    index_rel: list[np.ndarray] = []
    index_pos: list[np.ndarray] = []
    time_ts: list[np.ndarray] = []
    time_rel: list[np.ndarray] = []
    out = tuple(np.empty(WALK_CAPACITY, dtype=np.int64) for _ in range(4))
    state = np.array([0, NO_TIMESTAMP, base_offset - 1, NO_TIMESTAMP], dtype=np.int64)
    epoch_starts: list[tuple[int, int]] = []
    last_epoch = -1
    batch_count = 0
    first_ts = NO_TIMESTAMP
    pos = 0
    next_offset = base_offset
    error: ScanError | None = None
    while True:
        count, stop, code = walk_batches(array, pos, end, base_offset, next_offset, *arrays)
        batches = BatchArrays(*(a[:count] for a in arrays))
        valid = count
        if check_crc and count:
            valid = check_crcs(view, batches)
            if valid < count:
                bad = int(batches.positions[valid])
                error = ScanError(bad, BAD_CRC, REASONS[BAD_CRC], int(batches.base_offsets[valid]),
                                  int(batches.last_offsets[valid]))
        if valid:
            if batch_count == 0:
                first_ts = int(batches.max_timestamps[0])
            n_index, n_time = plan_index_entries(batches.positions, batches.sizes, batches.last_offsets,
                                                 batches.max_timestamps, valid, base_offset, interval, state,
                                                 *out)
            index_rel.append(out[0][:n_index].copy())
            index_pos.append(out[1][:n_index].copy())
            time_ts.append(out[2][:n_time].copy())
            time_rel.append(out[3][:n_time].copy())
            for epoch, first in _epoch_changes(batches.epochs[:valid], batches.base_offsets[:valid]):
                if epoch != last_epoch:
                    epoch_starts.append((epoch, first))
                    last_epoch = epoch
            batch_count += valid
            next_offset = int(batches.last_offsets[valid - 1]) + 1
            pos = int(batches.positions[valid - 1] + batches.sizes[valid - 1])
        if error is not None:
            break
        if code == FULL:
            continue
        pos = stop
        if code != END:
            error = kernel_error(array, stop, code)
        break
    return SegmentScan(
        valid_bytes=pos,
        next_offset=next_offset,
        batch_count=batch_count,
        max_timestamp=int(state[1]),
        offset_of_max_timestamp=int(state[2]),
        first_batch_max_timestamp=first_ts,
        index_relative_offsets=_concat(index_rel),
        index_positions=_concat(index_pos),
        time_timestamps=_concat(time_ts),
        time_relative_offsets=_concat(time_rel),
        epoch_starts=epoch_starts,
        error=error,
    )


def check_crcs(view: memoryview, batches: BatchArrays) -> int:
    """Number of leading batches whose stored CRC matches."""
    positions = batches.positions.tolist()
    sizes = batches.sizes.tolist()
    stored = batches.crcs.tolist()
    checksum = crc32c.crc32c
    for i, position in enumerate(positions):
        if checksum(view[position + ATTRIBUTES_OFFSET : position + sizes[i]]) != stored[i]:
            return i
    return len(positions)


def _epoch_changes(epochs: np.ndarray, base_offsets: np.ndarray) -> list[tuple[int, int]]:
    if len(epochs) == 0:
        return []
    starts = np.flatnonzero(np.concatenate(([True], epochs[1:] != epochs[:-1])))
    return [(int(epochs[i]), int(base_offsets[i])) for i in starts if epochs[i] >= 0]


def kernel_error(array: np.ndarray, position: int, code: int) -> ScanError:
    """The :class:`ScanError` for :func:`walk_batches`' ``code`` at ``position``, with the batch's offsets
    when its header is whole."""
    base: int | None = None
    last: int | None = None
    if len(array) - position >= HEADER_SIZE:
        base = int(read_be(array, position + BASE_OFFSET_OFFSET, 8))
        last = base + int(read_be(array, position + LAST_OFFSET_DELTA_OFFSET, 4))
    return ScanError(position, code, REASONS.get(code, f"code {code}"), base, last)


def _concat(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def describe(path: str, error: ScanError) -> str:
    """One line naming the file, the position, the offsets and the broken rule."""
    offsets = "" if error.base_offset is None else f" (offsets {error.base_offset}..{error.last_offset})"
    return f"{path}: invalid record batch at position {error.position}{offsets}: {error.reason}"


def raise_for(path: str, error: ScanError) -> None:
    raise CorruptRecordError(describe(path, error))


# -- after an invalid batch: does anything valid follow? --------------------------------------------------


@numba.njit(cache=True)
def next_candidate(buf: np.ndarray, start: int, end: int, segment_base_offset: int) -> int:
    """The first position at or after ``start`` where a batch passes the structural rules (1)-(6) on its
    own (magic 2, a length inside the file, counts not negative, offsets inside the segment's range), or
    -1.  The caller checks its CRC."""
    pos = start
    while pos + HEADER_SIZE <= end:
        if buf[pos + MAGIC_OFFSET] == MAGIC:
            size = read_be(buf, pos + BATCH_LENGTH_OFFSET, 4) + LOG_OVERHEAD
            if HEADER_SIZE <= size <= end - pos:
                delta = read_be(buf, pos + LAST_OFFSET_DELTA_OFFSET, 4)
                base = read_be(buf, pos + BASE_OFFSET_OFFSET, 8)
                if (delta >= 0 and read_be(buf, pos + RECORDS_COUNT_OFFSET, 4) >= 0
                        and base >= segment_base_offset and base + delta - segment_base_offset <= _INT32_MAX):
                    return pos
        pos += 1
    return -1


class FoundBatch(NamedTuple):
    """A valid batch found past damage: where it starts, its size and offsets."""

    position: int
    size: int
    base_offset: int
    last_offset: int


def valid_batches_after(path: str, start: int, segment_base_offset: int, *,
                        limit: int | None = None) -> list[FoundBatch]:
    """The valid batches (structure and CRC-32C) at or after position ``start`` of the segment file, found
    by trying every position (:func:`next_candidate`), in file order; at most ``limit`` of them.

    Random bytes pass the structural rules rarely and the CRC practically never (one in 2**32), so a batch
    found is one that was written there."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        if size - start < HEADER_SIZE:
            return []
        mm = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
    finally:
        os.close(fd)
    found: list[FoundBatch] = []
    try:
        view = memoryview(mm)
        array = np.frombuffer(mm, dtype=np.uint8)
        try:
            pos = start
            while limit is None or len(found) < limit:
                pos = int(next_candidate(array, pos, size, segment_base_offset))
                if pos < 0:
                    break
                length = int(read_be(array, pos + BATCH_LENGTH_OFFSET, 4)) + LOG_OVERHEAD
                stored = int(read_be(array, pos + CRC_OFFSET, 4)) & 0xFFFFFFFF
                if crc32c.crc32c(view[pos + ATTRIBUTES_OFFSET : pos + length]) != stored:
                    pos += 1
                    continue
                base = int(read_be(array, pos + BASE_OFFSET_OFFSET, 8))
                delta = int(read_be(array, pos + LAST_OFFSET_DELTA_OFFSET, 4))
                found.append(FoundBatch(pos, length, base, base + delta))
                pos += length
        finally:
            del array
            view.release()
    finally:
        mm.close()
    return found
