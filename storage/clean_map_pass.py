"""The cleaner's map pass (``storage.cleaner``, step 2): the dirty segments read through read-only
mappings, checked (structure and CRC) and their keys put in the offset map; what the pass learns of each
segment's batches kept for the rewrite (:class:`Walks`); the idempotent producers' last batches.
"""

from __future__ import annotations

import contextlib
import mmap
from collections.abc import Iterator, Sequence
from typing import Final, NamedTuple

import numpy as np

from storage.batch_header import (
    COMPRESSION_CODEC_MASK,
    HEADER_SIZE,
    PRODUCER_ID_OFFSET,
    BatchHeader,
    parse_header,
)
from storage.batch_reader import records_data
from storage.batch_scan import (
    WALK_CAPACITY,
    BatchArrays,
    describe,
    kernel_error,
    map_readonly,
    walk_batches,
)
from storage.crc32c_kernel import batch_crcs_ok
from storage.errors import ConfigError, CorruptRecordError
from storage.offset_map import (
    CRC_MISMATCH,
    GROW,
    MALFORMED_RECORDS,
    OffsetMap,
    put_batches,
    put_records,
)
from storage.segment_list import SegmentInfo

__all__ = [
    "WALKS_KEPT_BYTES",
    "Mapped",
    "Walked",
    "Walks",
    "index_segment",
    "malformed_records",
    "mapped_segment",
    "producer_last_offsets",
    "records_section",
    "walk_segment",
]

WALKS_KEPT_BYTES: Final = 4 << 20  # the per-batch columns of the walks kept for the rewrite (Walked)
_NO_PRODUCER: Final = -1


# --- reading segments ---------------------------------------------------------------------------------------
class Mapped(NamedTuple):
    view: memoryview
    array: np.ndarray


@contextlib.contextmanager
def mapped_segment(path: str) -> Iterator[Mapped]:
    """The file at ``path`` mapped read-only (an empty file: empty buffers)."""
    mm = map_readonly(path)
    if mm is None:
        yield Mapped(memoryview(b""), np.zeros(0, np.uint8))
        return
    mm.madvise(mmap.MADV_SEQUENTIAL)
    view = memoryview(mm)
    array = np.frombuffer(mm, dtype=np.uint8)
    try:
        yield Mapped(view, array)
    finally:
        del array
        with contextlib.suppress(BufferError):  # views still held by an error's traceback: unmapped with them
            view.release()
            mm.close()


def walk_segment(mapped: Mapped, info: SegmentInfo, *, check_crcs: bool = True) -> BatchArrays:
    """Every batch of the segment, checked (its structure and, with ``check_crcs``, its CRC: else the caller
    checks each as it reads it); :class:`CorruptRecordError` naming the file, the position and the offsets
    at the first invalid one (a CRC mismatch before it first)."""
    rows = min(WALK_CAPACITY, len(mapped.array) // HEADER_SIZE + 1)
    arrays = tuple(np.empty(rows, np.int64) for _ in range(7))
    parts: list[BatchArrays] = []
    position, expected, end = 0, info.base_offset, len(mapped.array)
    while True:
        count, stop, code = walk_batches(mapped.array, position, end, info.base_offset, expected, *arrays)
        batches = BatchArrays(*(a[:count].copy() for a in arrays))
        if check_crcs:
            _check_crcs(mapped, info, batches, 0)
        parts.append(batches)
        if count:
            expected = int(batches.last_offsets[-1]) + 1
        if code == 0 and stop == end:
            break
        if code != 1:  # not FULL: an invalid batch
            if not check_crcs:  # a CRC mismatch before it is the error, as when each part was checked
                for part in parts:
                    _check_crcs(mapped, info, part, 0)
            raise CorruptRecordError(describe(info.path, kernel_error(mapped.array, stop, code))
                                     + "; the log cannot be cleaned")
        position = stop
    return BatchArrays(*(np.concatenate(column) for column in zip(*parts, strict=True)))


def _check_crcs(mapped: Mapped, info: SegmentInfo, batches: BatchArrays, first: int,
                stop: int | None = None) -> None:
    """Check the CRCs of ``batches[first:stop]``: :class:`CorruptRecordError` at the first mismatch."""
    positions, sizes = batches.positions[first:stop], batches.sizes[first:stop]
    valid = batch_crcs_ok(mapped.array, positions, sizes)
    if valid < len(positions):
        raise _crc_mismatch(info.path, mapped, int(positions[valid]))


def _crc_mismatch(path: str, mapped: Mapped, position: int) -> CorruptRecordError:
    header = parse_header(mapped.view, position)
    return CorruptRecordError(
        f"{path}: record batch at position {position} (offsets {header.base_offset}..{header.last_offset}): "
        "CRC mismatch; the log cannot be cleaned: restore the segment from a replica or cut it with "
        "appliance repair")


def records_section(mapped: Mapped, position: int, header: BatchHeader,
                    path: str) -> tuple[np.ndarray, int, int]:
    """A batch's records section as ``(array, start, end)``: the mapping itself, or decompressed bytes."""
    if header.attributes & COMPRESSION_CODEC_MASK == 0:
        return mapped.array, position + HEADER_SIZE, position + header.size
    data = records_data(mapped.view, position, header, where=f"{path}")
    return data, 0, len(data)


def malformed_records(path: str, position: int, header: BatchHeader) -> CorruptRecordError:
    return CorruptRecordError(
        f"{path}: record batch at position {position} (offsets {header.base_offset}..{header.last_offset}): "
        "its records do not parse; the log cannot be cleaned: restore the segment from a replica or cut it "
        "with appliance repair")


# --- the offset map -----------------------------------------------------------------------------------------
class Walked(NamedTuple):
    """What the map pass keeps of a segment for the rewrite: its batches' positions and sizes, the first
    record entry of each (``OffsetMap.entries``; -1: none, its records are parsed again), each one's last
    offset and producer id (the producers' last batches, :func:`producer_last_offsets`), and the segment's
    bytes as the walk mapped them: the mapping stays while this holds them (:func:`mapped_segment` leaves a
    mapping whose array is still referenced to go with it), so the rewrite reads the pages the walk
    already faulted in instead of mapping the file again."""

    positions: np.ndarray
    sizes: np.ndarray
    batch_entries: np.ndarray
    last_offsets: np.ndarray
    producer_ids: np.ndarray
    segment: np.ndarray

    @classmethod
    def of(cls, array: np.ndarray, batches: BatchArrays, batch_entries: np.ndarray) -> Walked:
        """The walk ``batches`` of the segment mapped at ``array``."""
        return cls(batches.positions, batches.sizes, batch_entries, batches.last_offsets,
                   _producer_ids(array, batches.positions), array)

    @property
    def nbytes(self) -> int:
        """The memory of the per-batch columns (the mapping is the page cache's)."""
        return sum(column.nbytes for column in self[:5])


class Walks:
    """The :class:`Walked` of the segments the map pass walked and checked, for the rewrite of the same
    pass (the segments are closed: only the cleaner rewrites them, after this pass has read them), up to
    :data:`WALKS_KEPT_BYTES`; a segment not kept, or whose size changed, is walked again."""

    def __init__(self) -> None:
        self._kept: dict[int, tuple[int, Walked]] = {}
        self._bytes = 0

    def keep(self, info: SegmentInfo, size_bytes: int, walked: Walked) -> None:
        nbytes = walked.nbytes
        if self._bytes + nbytes <= WALKS_KEPT_BYTES:
            self._kept[info.base_offset] = (size_bytes, walked)
            self._bytes += nbytes

    def get(self, info: SegmentInfo) -> Walked | None:
        """The kept walk of the segment, left kept, if it was ``info.size_bytes`` long."""
        kept = self._kept.get(info.base_offset)
        return kept[1] if kept is not None and kept[0] == info.size_bytes else None

    def take(self, info: SegmentInfo) -> Walked | None:
        """:meth:`get`, the walk no longer kept."""
        walked = self.get(info)
        kept = self._kept.pop(info.base_offset, None)
        if kept is not None:
            self._bytes -= kept[1].nbytes
        return walked


def index_segment(omap: OffsetMap, info: SegmentInfo, walks: Walks) -> bool:
    """Put the keys of the segment's batches from ``omap.end_offset`` on; False when the map filled first.
    Uncompressed batches go through :func:`put_batches` in one call; it stops at a compressed batch (put
    here after decompressing) and before a batch that needs the table grown or does not fit.  Every batch
    of the segment has its CRC checked by the time this returns (``put_batches`` checks each just before it
    reads it, while its bytes are in the cache; the others are checked here), and a mismatch anywhere in
    the segment is the error raised, before any other error the segment's batches give."""
    with mapped_segment(info.path) as mapped:
        return _index_mapped(omap, info, mapped, walks)


def _index_mapped(omap: OffsetMap, info: SegmentInfo, mapped: Mapped, walks: Walks) -> bool:
    batches = walk_segment(mapped, info, check_crcs=False)
    batch_entries = np.full(len(batches.positions), -1, np.int64)
    walks.keep(info, len(mapped.array), Walked.of(mapped.array, batches, batch_entries))
    first = int(np.searchsorted(batches.last_offsets, omap.end_offset))
    _check_crcs(mapped, info, batches, 0, first)  # before the map's start: not read for the map
    checked = first
    try:
        while True:
            i, omap.size, code, omap.entry_count = put_batches(
                mapped.array, batches.positions, batches.sizes, first, omap.table, omap.size, omap.grow_at,
                omap.entries, omap.entry_count, batch_entries)
            if i > first:
                omap.end_offset = int(batches.last_offsets[i - 1]) + 1
            if code == 0:
                return True
            position = int(batches.positions[i])
            if code == CRC_MISMATCH:
                checked = len(batches.positions)  # the segment's first mismatch: the one reported
                raise _crc_mismatch(info.path, mapped, position)
            checked = i + 1  # put_batches checks a batch's CRC before anything else
            header = parse_header(mapped.view, position)
            if code == MALFORMED_RECORDS:
                raise malformed_records(info.path, position, header)
            if code == GROW:
                if header.records_count > omap.room:
                    if omap.size == 0:
                        raise _map_too_small(info.path, position, header.records_count, omap.capacity)
                    _check_crcs(mapped, info, batches, checked)  # past the map's end: copied by the rewrite
                    return False
                omap.grow()
                first = i
                continue
            data, start, end = records_section(mapped, position, header, info.path)
            size = put_records(data, start, end, header.records_count, header.base_offset, omap.table,
                               omap.size)
            if size == MALFORMED_RECORDS:
                raise malformed_records(info.path, position, header)
            omap.size = size
            omap.end_offset = header.last_offset + 1
            first = i + 1
    except (CorruptRecordError, ConfigError):
        _check_crcs(mapped, info, batches, checked)  # a CRC mismatch further on is reported first
        raise


def _map_too_small(path: str, position: int, records: int, capacity: int) -> ConfigError:
    return ConfigError(f"{path}: the batch at position {position} holds {records} records, more keys than "
                       f"log.cleaner.dedupe.buffer.size holds ({capacity}); raise it")


def producer_last_offsets(infos: Sequence[SegmentInfo], to_clean: Sequence[SegmentInfo],
                           walks: Walks) -> np.ndarray:
    """The last offsets of the idempotent producers' last batches in the log (``infos``), sorted: the
    batches a clean keeps even when they keep no record.  The segments the pass rewrites (``to_clean``)
    are known from their walks: the map pass's, or one made here (checked, and kept for the rewrite); the
    others' headers are walked (the active segment up to its size in ``infos``: a batch appended since
    can only make a kept batch superfluous, never drop a last one)."""
    rewritten = {info.base_offset for info in to_clean}
    ids: list[np.ndarray] = []
    lasts: list[np.ndarray] = []
    for info in infos:
        walked = walks.get(info)
        if walked is None:
            with mapped_segment(info.path) as mapped:
                if info.base_offset in rewritten:
                    walked = Walked.of(mapped.array, walk_segment(mapped, info), np.empty(0, np.int64))
                    walks.keep(info, len(mapped.array), walked)
                else:
                    walked = _walk_headers(mapped, info)
        ids.append(walked.producer_ids)
        lasts.append(walked.last_offsets)
    all_ids, all_lasts = np.concatenate(ids), np.concatenate(lasts)
    idempotent = all_ids != _NO_PRODUCER
    all_ids, all_lasts = all_ids[idempotent][::-1], all_lasts[idempotent][::-1]
    _, last_at = np.unique(all_ids, return_index=True)  # from the log's end: each producer's last batch
    return np.sort(all_lasts[last_at])


def _walk_headers(mapped: Mapped, info: SegmentInfo) -> Walked:
    """The batches of a segment the pass does not rewrite, their headers alone (no CRC): up to the first
    that is not whole (the active segment: up to ``info.size_bytes``)."""
    # the active segment up to its size when listed, never past what was mapped (it may have been truncated)
    end = min(info.size_bytes, len(mapped.array)) if info.is_active else len(mapped.array)
    arrays = tuple(np.empty(min(WALK_CAPACITY, end // HEADER_SIZE + 1), np.int64) for _ in range(7))
    parts: list[Walked] = []
    position = 0
    while position < end:
        count, position, code = walk_batches(mapped.array, position, end, info.base_offset, 0, *arrays)
        batches = BatchArrays(*(a[:count].copy() for a in arrays))
        parts.append(Walked.of(mapped.array, batches, batches.positions[:0]))
        if code != 1:
            break
    empty = np.empty(0, np.int64)
    return Walked(empty, empty, empty, np.concatenate([p.last_offsets for p in parts] or [empty]),
                   np.concatenate([p.producer_ids for p in parts] or [empty]), np.empty(0, np.uint8))


def _field(array: np.ndarray, positions: np.ndarray, offset: int, dtype: str) -> np.ndarray:
    """The header field at ``offset`` (of type ``dtype``, big-endian) of the batches at ``positions``."""
    width = np.dtype(dtype).itemsize
    at = positions[:, None] + (offset + np.arange(width))
    return array[at].copy().view(dtype).reshape(-1)


def _producer_ids(array: np.ndarray, positions: np.ndarray) -> np.ndarray:
    return _field(array, positions, PRODUCER_ID_OFFSET, ">i8")

