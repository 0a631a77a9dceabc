"""Log compaction: one pass of Kafka's log cleaner over a partition log.

Theory of operation
-------------------
A compacted log keeps, for every key, at least its latest record.  The log splits in two at the *first dirty
offset* (``cleaner-offset-checkpoint``; the log start offset when there is none): below it every segment has
been cleaned, from it on nothing has.  :func:`clean_log` runs one pass:

1. **The cleanable bound** is the smallest of the caller's ``upper_bound`` (the high watermark, the
   ``min.compaction.lag.ms`` bound: the caller decides) and the active segment's base offset: the active
   segment and every segment that reaches the bound are never read for the map nor rewritten.
2. **The offset map** (``storage.offset_map``) is filled from the dirty closed segments, batch by batch, in
   offset order: every key's latest offset.  Compressed batches are decompressed; each batch's CRC is
   checked first (by ``put_batches``, just before it parses the batch, while its bytes are in the cache),
   and a corrupt batch stops the pass before anything changed (``CorruptRecordError`` naming the file, the
   position and the offsets).  When the next batch's records might not fit the map
   (``log.cleaner.dedupe.buffer.size`` at load 0.9) the map stops there: its ``end_offset`` is where this
   pass ends, and the rest is the next pass's (``CleanResult.done`` is False).  Then one walk of the map's
   table marks every key's latest offset in a bitmap over the pass's offsets (``OffsetMap.mark_latest``).
   While the dirty batches are parsed each record's entry (where it starts, its offset delta, whether it is
   a tombstone or keyless) is kept too, as long as the buffer has room for them after the map's own arrays
   (``OffsetMap.entries``), so the rewrite decides those records without parsing them again.
3. **The groups**: every closed segment below the map's end, from the first, is rewritten, in groups of
   consecutive segments whose sizes add up to at most ``segment.bytes``, whose indexes would fit
   ``segment.index.bytes`` and whose offsets fit int32 relative offsets (Kafka's ``groupSegmentsBySize``).
4. **Each group** is written as one segment named after its first segment's base offset
   (``<base>.log.cleaned`` and its indexes), batch by batch (:class:`_Selector`):

   * a batch wholly past the map's end, a control batch, or one that keeps all its records (and needs no
     delete horizon) is copied byte for byte;
   * otherwise its kept records (``storage.record_filter``) are written in a new batch with the **same base
     offset and last offset delta** (offsets are never renumbered: gaps appear), the same producer id,
     epoch, base sequence, partition leader epoch and codec (a zstd batch is written as zstd), and a new
     CRC;
   * a tombstone kept for the first time gets its batch a **delete horizon**: attribute bit 6 set and
     ``baseTimestamp`` = now + ``delete.retention.ms`` (KIP-534); a later pass at or after the horizon
     drops the tombstones of that batch;
   * a batch that keeps no record disappears, unless it is the last batch of an idempotent producer in the
     log: it stays as a header with no records, as Kafka's ``RETAIN_EMPTY`` (codec none, base and max
     timestamp its max timestamp), so the producer's last sequence survives.  Those last batches are found
     before the first group is written (:func:`producer_last_offsets`) from the walks of the segments
     the pass rewrites (the map pass's, or one made then and kept for the rewrite) and the headers of the
     segments after them.

   The kernels write straight into the output buffer, written out to ``<base>.log.cleaned`` each time it
   fills; every ``WRITE_BACK_BYTES`` a second thread fdatasyncs what is written so far, and once the
   ``.log`` is whole it fsyncs it while the group's indexes and the next group are written.  The groups are
   swapped in together (``Log.swap_cleaned``, ``storage.clean_swap``: one set of directory fsyncs for all of
   them) at the end of the pass, or earlier, on that thread, once the cleaned files held aside add up to
   ``segment.bytes`` or :data:`_SWAP_GROUPS` groups (``storage.clean_pass_swaps``): the disk holds at most
   that much more than the log.
5. **The checkpoint**: ``cleaner-offset-checkpoint`` gets the map's end, the new first dirty offset.

Memory: the offset map's arrays (at most the dedupe buffer; smaller when the dirty section holds fewer
offsets than the buffer holds keys), the marks of up to ``_MARKS`` records (:class:`_Selector`), one
compressed batch's decompressed records and its rewrite, the output buffered up to ``OUT_CHUNK_BYTES``
before each write, and the batch positions, sizes, last offsets and producer ids the map pass found and
their first record entries (up to ``WALKS_KEPT_BYTES``), so the rewrite neither walks nor checks those
segments again.  Segments are read through read-only mappings, a walked segment's kept from its walk to its
rewrite (no second mapping to fault in); the record kernels take a segment's uncompressed batches in one call
(``put_batches``, ``select_batches``, ``storage.batch_rewrite.write_selected``) and hand compressed ones
back.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Sequence
from typing import Final, NamedTuple, Protocol

import numpy as np

from storage.batch_header import (
    COMPRESSION_CODEC_MASK,
    HEADER_SIZE,
    TIMESTAMP_TYPE_MASK,
    BatchHeader,
    parse_header,
)
from storage.batch_rewrite import (
    RECORD_SLACK_BYTES,
    fill_crcs,
    fitting_stop,
    output_bound,
    write_empty,
    write_header,
    write_selected,
)
from storage.batch_scan import describe
from storage.batch_scan import scan_segment as _scan_segment
from storage.clean_faults import CLEAN_FAULTS
from storage.clean_map_pass import (
    Mapped,
    Walked,
    Walks,
    index_segment,
    malformed_records,
    mapped_segment,
    producer_last_offsets,
    records_section,
    walk_segment,
)
from storage.clean_output import OUT_CHUNK_BYTES, CleanOutput
from storage.clean_pass_swaps import PassSwaps
from storage.clean_swap import SwapGroup, cleaned_paths
from storage.compression import compress
from storage.errors import CorruptRecordError
from storage.log_config import INT32_MAX, LogConfig
from storage.log_dir import (
    CLEANER_OFFSET_CHECKPOINT_FILE,
    read_partition_checkpoint,
    write_partition_checkpoint,
)
from storage.offset_index import OFFSET_INDEX_ENTRY
from storage.offset_map import (
    DEFAULT_DEDUPE_BUFFER_BYTES,
    MALFORMED_RECORDS,
    STOPPED,
    OffsetMap,
)
from storage.record_filter import (
    COPY,
    DELETE_HORIZON_FLAG_MASK,
    DROP,
    MARKS_FULL,
    RESULT_COLUMNS,
    RecordMarks,
    Selection,
    batch_action,
    select_batches,
    select_records,
    write_kept,
)
from storage.segment_indexes import IndexPaths
from storage.segment_list import SegmentInfo

__all__ = [
    "DEFAULT_DELETE_RETENTION_MS",
    "DELETE_HORIZON_FLAG_MASK",
    "CleanResult",
    "CleanableLog",
    "CleanedSegment",
    "IoThrottle",
    "clean_log",
    "first_dirty_offset",
]

DEFAULT_DELETE_RETENTION_MS: Final = 86_400_000  # Kafka's delete.retention.ms
_MARKS: Final = 1 << 14  # records (and batches) selected per select_batches call
_NO_PRODUCER: Final = -1
_SWAP_GROUPS: Final = 64  # groups swapped in together at most (also: their cleaned bytes up to segment.bytes)


class CleanedSegment(NamedTuple):
    """A group written aside as ``<base_offset>.log.cleaned`` (+ indexes), to replace ``replaced``."""

    base_offset: int
    replaced: tuple[int, ...]
    size_bytes: int


class CleanResult(NamedTuple):
    """What one pass did.  The map covered ``[start_offset, end_offset)``; ``end_offset`` is the new first
    dirty offset; ``done``: it reached the cleanable bound (else the keys did not all fit: run again)."""

    start_offset: int
    end_offset: int
    done: bool
    keys: int
    segments_cleaned: int
    groups: int
    bytes_read: int
    bytes_written: int
    records_dropped_keyless: int


IoThrottle = Callable[[int], None]  # called with the bytes just read or written; may sleep


class CleanableLog(Protocol):
    """What a pass needs of a log: ``storage.log.Log`` (in the process that holds it), or a read-only view
    whose ``swap_cleaned`` asks that process to swap (``appliance.cleaner``)."""

    @property
    def directory(self) -> str: ...
    @property
    def config(self) -> LogConfig: ...
    @property
    def topic_partition(self) -> tuple[str, int]: ...
    @property
    def log_start_offset(self) -> int: ...
    @property
    def log_end_offset(self) -> int: ...
    @property
    def segments(self) -> list[SegmentInfo]: ...
    def swap_cleaned(self, groups: Sequence[SwapGroup]) -> None: ...


def first_dirty_offset(log: CleanableLog) -> int:
    """The first offset no clean has seen: ``cleaner-offset-checkpoint``, or the log start offset when the
    file is missing or names an offset outside the log (Kafka's rule)."""
    stored = read_partition_checkpoint(log.directory, CLEANER_OFFSET_CHECKPOINT_FILE, log.topic_partition)
    if stored is None or stored < log.log_start_offset or stored > log.log_end_offset:
        return log.log_start_offset
    return stored


def clean_log(log: CleanableLog, *, upper_bound: int, now_ms: int | None = None,
              dedupe_buffer_bytes: int = DEFAULT_DEDUPE_BUFFER_BYTES,
              delete_retention_ms: int = DEFAULT_DELETE_RETENTION_MS,
              offset_map: OffsetMap | None = None, io_throttle: IoThrottle | None = None) -> CleanResult:
    """One cleaning pass over ``log`` (steps 1-5 of the module docstring).  ``io_throttle``, if given, is
    called after each segment read for the map and each segment rewritten, with the bytes read and written
    (``log.cleaner.io.max.bytes.per.second``: it sleeps to keep the rate)."""
    now = time.time_ns() // 1_000_000 if now_ms is None else now_ms
    infos = log.segments
    closed = [s for s in infos if not s.is_active]
    bound = min(upper_bound, infos[-1].base_offset)
    start = first_dirty_offset(log)
    dirty = _dirty_segments(closed, start, bound)
    if offset_map is None:
        # the dirty section's offsets: at least its records, so at least its keys
        omap = OffsetMap(dedupe_buffer_bytes,
                         max_keys=sum(info.next_offset - max(info.base_offset, start) for info in dirty))
    else:
        omap = offset_map
    omap.clear(start)
    walks = Walks()
    for info in dirty:
        fitted = index_segment(omap, info, walks)
        if io_throttle is not None:
            io_throttle(info.size_bytes)
        if not fitted:
            break
    omap.mark_latest()
    end = omap.end_offset
    done = not dirty or end >= dirty[-1].next_offset
    if end <= start:
        return CleanResult(start, start, done, 0, 0, 0, 0, 0, 0)
    to_clean = [s for s in closed if s.base_offset < end]
    producer_last = producer_last_offsets(infos, to_clean, walks)
    written = read = 0
    groups = _group_segments(to_clean, log.config)
    selector = _Selector(omap, producer_last, now, delete_retention_ms, walks)
    with PassSwaps(log, _SWAP_GROUPS) as swaps:
        for group in groups:
            try:
                cleaned = _write_group(log.directory, group, selector, log.config, swaps, io_throttle)
            except BaseException:
                swaps.abandon()  # a failed swap unlinks every .cleaned file as it undoes: its error first
                raise
            read += sum(s.size_bytes for s in group)
            written += cleaned.size_bytes
        swaps.commit()
        swaps.finish()
    if CLEAN_FAULTS.armed:
        CLEAN_FAULTS.check("clean.checkpoint", log.directory)
    write_partition_checkpoint(log.directory, CLEANER_OFFSET_CHECKPOINT_FILE, log.topic_partition, end)
    return CleanResult(start, end, done, omap.size, len(to_clean), len(groups), read, written,
                       selector.keyless)


def _dirty_segments(closed: Sequence[SegmentInfo], start: int, bound: int) -> list[SegmentInfo]:
    """The closed segments holding offsets from ``start`` on, up to the first that reaches ``bound``."""
    dirty = []
    for info in closed:
        if info.next_offset <= start:
            continue
        if info.next_offset > bound:
            break
        dirty.append(info)
    return dirty



# --- grouping and writing -----------------------------------------------------------------------------------
def _group_segments(infos: Sequence[SegmentInfo], config: LogConfig) -> list[list[SegmentInfo]]:
    """Consecutive segments in groups within ``segment.bytes``, the index size and int32 relative offsets."""
    groups: list[list[SegmentInfo]] = []
    for info in infos:
        group = groups[-1] if groups else None
        if group is not None:
            size = sum(s.size_bytes for s in group) + info.size_bytes
            entries = size // max(1, config.index_interval_bytes) + len(group) + 1
            index_bytes = entries * OFFSET_INDEX_ENTRY.size
            if (size <= config.segment_bytes and index_bytes <= config.segment_index_bytes
                    and info.next_offset - 1 - group[0].base_offset <= INT32_MAX):
                group.append(info)
                continue
        groups.append([info])
    return groups


class _Selector:
    """Writes the cleaned form of segments' batches, in offset order across a pass's groups: a record the
    map read is its key's latest iff its bit is set in ``omap.latest_bits`` (older ones are looked up).
    Uncompressed batches are selected and written in numba, a run at a time (``select_batches``,
    ``write_selected``); compressed ones one by one here."""

    def __init__(self, omap: OffsetMap, producer_last: np.ndarray, now_ms: int, delete_retention_ms: int,
                 walks: Walks) -> None:
        self.omap = omap
        self.walks = walks
        self.producer_last = producer_last
        self.now_ms = now_ms
        self.horizon_ms = now_ms + delete_retention_ms
        self.marks = RecordMarks.make(_MARKS)
        self.results = np.empty((_MARKS, RESULT_COLUMNS), np.int64)
        self.crc_spans = np.empty((_MARKS, 2), np.int64)
        self.out_buffer = np.empty(OUT_CHUNK_BYTES, np.uint8)
        self.keyless = 0

    def clean_segment(self, info: SegmentInfo, out: CleanOutput) -> None:
        """Write the segment's batches as the clean keeps them to ``out`` (module docstring, step 4): read
        through the mapping its kept walk holds, else mapped and walked here."""
        walked = self.walks.take(info)
        if walked is not None:
            self._clean_mapped(Mapped(walked.segment.data, walked.segment), info, out, walked)
            return
        with mapped_segment(info.path) as mapped:
            self._clean_mapped(mapped, info, out, None)

    def _clean_mapped(self, mapped: Mapped, info: SegmentInfo, out: CleanOutput,
                      walked: Walked | None) -> None:
        if walked is None:
            batches = walk_segment(mapped, info)
            walked = Walked.of(mapped.array, batches, np.empty(0, np.int64))
        positions, sizes, batch_entries = walked[:3]
        omap = self.omap
        first = 0
        while first < len(positions):
            i, code = select_batches(
                mapped.array, positions, sizes, first, self.now_ms, omap.end_offset, omap.table,
                omap.latest_bits, omap.start_offset, omap.entries, batch_entries, *self.marks, self.results)
            self._write_run(mapped, positions, sizes, first, i, out)
            if code == 0:
                return
            position = int(positions[i])
            header = parse_header(mapped.view, position)
            if code == MALFORMED_RECORDS:
                raise malformed_records(info.path, position, header)
            if code == MARKS_FULL and i == first:
                self.marks = RecordMarks.make(max(header.records_count, 2 * len(self.marks.keep)))
            elif code == STOPPED:
                self._write_compressed(mapped, position, header, info.path, out)
                i += 1
            first = i

    def _write_run(self, mapped: Mapped, positions: np.ndarray, sizes: np.ndarray, first: int, stop: int,
                   out: CleanOutput) -> None:
        """Write the batches ``[first, stop)`` that ``select_batches`` selected (``write_selected``)."""
        self.keyless += int(self.results[: stop - first, 4].sum())
        run_first = first
        while first < stop:
            results = self.results[first - run_first :]
            room = out.room()
            end = fitting_stop(sizes, first, stop, results, len(room))
            if end == first:  # not even the next batch fits: the buffer written out (or grown) first
                room = out.room(output_bound(sizes, first, first + 1, results))
                end = first + 1
            written, spans = write_selected(mapped.array, positions, sizes, first, end, results, *self.marks,
                                            self.horizon_ms, self.producer_last, room, self.crc_spans)
            fill_crcs(room, self.crc_spans[:spans])
            out.advance(written)
            first = end

    def _write_compressed(self, mapped: Mapped, position: int, header: BatchHeader, path: str,
                          out: CleanOutput) -> None:
        """Select and write one compressed batch, decompressed here and compressed again."""
        omap = self.omap
        count = header.records_count
        if not self.marks.fits(count):
            self.marks = RecordMarks.make(max(count, 2 * len(self.marks.keep)))
        has_horizon = bool(header.attributes & DELETE_HORIZON_FLAG_MASK)
        data, start, end = records_section(mapped, position, header, path)
        selection = Selection(*select_records(
            data, start, end, count, header.base_offset, header.base_timestamp,
            has_horizon and self.now_ms >= header.base_timestamp, omap.end_offset, omap.table,
            omap.latest_bits, omap.start_offset, *self.marks, 0))
        if selection.kept == MALFORMED_RECORDS:
            raise malformed_records(path, position, header)
        self.keyless += selection.keyless
        action = batch_action(selection.kept, count, selection.tombstones, has_horizon)
        if action == COPY:
            out.add(mapped.array[position : position + header.size])
        elif action == DROP:
            if header.producer_id != _NO_PRODUCER and self._is_producer_last(header.last_offset):
                piece = np.empty(HEADER_SIZE, np.uint8)
                write_empty(mapped.array, position, piece, 0)
                fill_crcs(piece, np.array([[0, HEADER_SIZE]], np.int64))
                out.add(piece)
        else:
            out.add(self._recompressed(mapped, position, header, data, start, end, selection))

    def _is_producer_last(self, last_offset: int) -> bool:
        """Whether ``last_offset`` ends an idempotent producer's last batch in the log."""
        at = int(np.searchsorted(self.producer_last, last_offset))
        return at < len(self.producer_last) and int(self.producer_last[at]) == last_offset

    def _recompressed(self, mapped: Mapped, position: int, header: BatchHeader, data: np.ndarray,
                      start: int, end: int, selection: Selection) -> np.ndarray:
        """A compressed batch with only its kept records, compressed with its codec again (the fields as
        ``storage.batch_rewrite`` sets them)."""
        count = header.records_count
        set_horizon = selection.tombstones > 0 and not header.attributes & DELETE_HORIZON_FLAG_MASK
        base_timestamp = self.horizon_ms if set_horizon else header.base_timestamp
        records = np.empty(end - start + RECORD_SLACK_BYTES * count, np.uint8)
        stop = write_kept(data, 0, count, *self.marks, header.base_timestamp - base_timestamp, records, 0)
        body = compress(header.attributes & COMPRESSION_CODEC_MASK, records[:stop].data)
        attributes = header.attributes | (DELETE_HORIZON_FLAG_MASK if set_horizon else 0)
        log_append_time = header.attributes & TIMESTAMP_TYPE_MASK
        max_timestamp = header.max_timestamp if log_append_time else selection.max_timestamp
        piece = np.empty(HEADER_SIZE + len(body), np.uint8)
        write_header(mapped.array, position, piece, 0, attributes, base_timestamp, max_timestamp,
                     selection.kept, len(piece))
        piece[HEADER_SIZE:] = np.frombuffer(body, np.uint8)
        fill_crcs(piece, np.array([[0, len(piece)]], np.int64))
        return piece


def _write_group(directory: str, group: Sequence[SegmentInfo], selector: _Selector, config: LogConfig,
                 swaps: PassSwaps, io_throttle: IoThrottle | None = None) -> CleanedSegment:
    """Write the group's cleaned segment and its indexes aside and hand it to ``swaps``: its ``.log`` is
    fsynced (and closed) on their thread from the moment it is written, while its indexes are built here.
    On an error nothing is left."""
    base = group[0].base_offset
    paths = cleaned_paths(directory, base)
    out = CleanOutput(paths[0], selector.out_buffer, swaps)
    fd: int | None = out.fd
    ok = False
    try:
        for info in group:
            written = out.size_bytes
            selector.clean_segment(info, out)
            out.flush()
            if io_throttle is not None:
                io_throttle(info.size_bytes + out.size_bytes - written)
        swaps.sync(out.fd)
        fd = None
        # the structure checked again, not the CRCs: the batches copied had theirs checked as they were read,
        # the others got theirs computed over their final bytes
        scan = _scan_segment(paths[0], base, index_interval_bytes=config.index_interval_bytes,
                             check_crc=False)
        if scan.error is not None:  # the batches were checked as they were read and written: a bug, not data
            raise CorruptRecordError(describe(paths[0], scan.error) + " (in a cleaned segment)")
        indexes = IndexPaths(paths[1], paths[2], base).write_rebuilt(
            scan, closed=True, max_bytes=config.segment_index_bytes)
        indexes.offset_index.close()
        indexes.time_index.close()
        cleaned = CleanedSegment(base, tuple(s.base_offset for s in group), out.size_bytes)
        swaps.gather(SwapGroup(cleaned.base_offset, cleaned.replaced), cleaned.size_bytes)
        ok = True
    finally:
        if not ok:
            if fd is not None:
                swaps.settle()  # a write-back queued on the descriptor runs before it is closed
            _discard(fd, paths)
    return cleaned


def _discard(fd: int | None, paths: Sequence[str]) -> None:
    """Close a cleaned segment's ``.log`` descriptor (None: ``PassSwaps`` closes it) and unlink its
    files."""
    if fd is not None:
        os.close(fd)
    for path in paths:
        with contextlib.suppress(OSError):
            os.unlink(path)
