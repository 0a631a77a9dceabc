"""One log segment: ``<20-digit base offset>.log`` with its ``.index`` and ``.timeindex``.

Theory of operation
-------------------
A segment holds consecutive record batches, byte for byte as producers built them (with ``baseOffset`` and
``partitionLeaderEpoch`` stamped).  The ``.log`` file is opened ``O_APPEND`` by the log's single writer and
appended with one write per append call (``storage.segment_file``: how the file is written and walked);
nothing is fsynced per append (the page cache holds it; :meth:`LogSegment.flush` is ``fdatasync``).  After
the bytes are written, the sparse indexes get their entries, so an index entry never points at bytes that
are not in the file yet.  The segment keeps its own accounting (size, next offset, max timestamp, bytes
since the last index entry); the log reads it and never writes it.

Roll rules (Kafka's): a non-empty active segment takes no batch that would pass ``segment.bytes``, whose
offsets do not fit its int32 relative offsets, that is due an index entry when the indexes are full, or
that comes ``segment.ms`` after its first batch's max timestamp (or after its creation when that batch had
no timestamp); the log rolls before such a batch.  :meth:`LogSegment.fits` and
:meth:`LogSegment.batches_that_fit` apply them.  The common append of one batch (``Log.append_batches``'
hot path, :meth:`LogSegment.append_batch`) checks the segment's *append budget* instead: bytes, offsets,
timestamps and index entries left before a rule could fire (:meth:`LogSegment.refresh_append_budget`); it
writes the batch, indexes it by the rule below and keeps the budget current as it goes.

Preallocation (``preallocate``): while a segment is active its disk blocks are reserved ahead of the
appends without changing its size, and given back on seal and close (``storage.preallocate``).

A full disk (``ENOSPC``, ``EDQUOT``): room in both indexes for every entry an append can add is allocated
before its bytes are written (``IndexFile.reserve_entries``); a write that fails, whole or part-way, is cut
back to the segment's size before it (``ftruncate``) and the error goes on, with the segment's accounting and
indexes untouched.  The segment is then exactly as before the append; the log undoes the rest (a roll).

Index rule (Kafka's, applied per batch in order, identically by the live append and by the rebuild in
``storage.batch_scan.plan_index_entries``): remember the batch with the largest max timestamp so far; if more
than ``index.interval.bytes`` were appended since the last offset-index entry, add ``(batch last offset,
batch position)`` to ``.index`` and, if the max timestamp grew, ``(max timestamp, its offset)`` to
``.timeindex``.  On roll/close a last time entry records the segment's largest timestamp, then both indexes
are trimmed (``storage.index_file``).

Reading never maps the ``.log`` file (``storage.segment_file``: its headers are read with ``pread``).  To
find the batch holding offset ``o``: the offset index gives the last indexed batch ending at or before
``o``, then a forward walk over at most ``index.interval.bytes`` of headers.  Readers in other processes
(``storage.log_reader``) use the same code in *verify* mode: every index answer is checked against the
header it points at, and a wrong one (stale, torn) falls back to walking from position 0.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from typing import Final, NamedTuple, TypeAlias

import numpy as np

from storage.batch_header import BatchHeader
from storage.batch_scan import SegmentScan, describe, plan_index_entries, scan_segment
from storage.disk_faults import DISK_FAULTS
from storage.errors import CorruptRecordError
from storage.log_config import INT32_MAX, LogConfig
from storage.preallocate import BlockReservation
from storage.segment_file import BatchBuffer, BatchHeaders, FetchSlice, write_fully, write_rest
from storage.segment_indexes import IndexPaths
from storage.time_index import NO_TIMESTAMP

__all__ = [
    "INDEX_SUFFIX",
    "LOG_SUFFIX",
    "OVER_BUDGET",
    "TIME_INDEX_SUFFIX",
    "BatchRow",
    "LogSegment",
    "OffsetAndTimestamp",
    "parse_segment_name",
    "segment_path",
]

LOG_SUFFIX: Final = ".log"
INDEX_SUFFIX: Final = ".index"
TIME_INDEX_SUFFIX: Final = ".timeindex"
_NAME_DIGITS: Final = 20
OVER_BUDGET: Final = -1  # append_batch: the batch is not within the append budget, nothing was written
_NO_LIMIT: Final = -(2**64)  # an append budget limit no int64 field is ever below or at
_os_write = os.write
_log = logging.getLogger(__name__)


def segment_path(directory: str, base_offset: int, suffix: str) -> str:
    return os.path.join(directory, f"{base_offset:0{_NAME_DIGITS}d}{suffix}")


def parse_segment_name(name: str, suffix: str = LOG_SUFFIX) -> int | None:
    """Base offset of a ``<20 digits><suffix>`` file name, else None."""
    stem = name[: -len(suffix)] if name.endswith(suffix) else ""
    if len(stem) != _NAME_DIGITS or not stem.isdigit():
        return None
    return int(stem)


BatchRow: TypeAlias = tuple[int, int, int, int]  # a batch's base offset, last offset, size, max timestamp


class OffsetAndTimestamp(NamedTuple):
    offset: int
    timestamp: int  # ms


class LogSegment:
    """A segment as the writer holds it (``writable``) or as a reader views it.

    The writer's fields are exact: ``size_bytes``, ``next_offset`` (offset after the last batch),
    ``max_timestamp`` and ``offset_of_max_timestamp``.  A reader's view only has the files; it asks for the
    size (``os.fstat``) at each read and verifies index answers.
    """

    def __init__(self, directory: str, base_offset: int, config: LogConfig, *, writable: bool) -> None:
        self.directory = directory
        self.base_offset = base_offset
        self.config = config
        self.writable = writable
        self.log_path = segment_path(directory, base_offset, LOG_SUFFIX)
        self.index_path = segment_path(directory, base_offset, INDEX_SUFFIX)
        self.time_index_path = segment_path(directory, base_offset, TIME_INDEX_SUFFIX)
        self.read_fd = -1
        self.append_fd = -1
        self.size_bytes = 0
        self.next_offset = base_offset
        self.max_timestamp = NO_TIMESTAMP
        self.offset_of_max_timestamp = base_offset - 1
        self.bytes_since_last_index_entry = 0
        self.rolling_timestamp = NO_TIMESTAMP  # max timestamp of the first batch (segment.ms)
        self.created_ms = int(time.time() * 1000)
        self._index_paths = IndexPaths(self.index_path, self.time_index_path, base_offset)
        self.offset_index, self.time_index = self._index_paths.unmapped()
        self.index_identity: tuple[int, int] = (0, 0)  # (inode, size) of .index when a view mapped it
        # The append budget: what one batch may take with no roll rule able to fire, so append_batch (the
        # log's hot path) checks these instead of the rules.  refresh_append_budget recomputes it after
        # every change but append_batch's own, which keeps room_bytes and index_entries_left current.
        self.room_bytes = -1  # bytes before segment.bytes (or the reservation); -1: closed or empty
        self.last_offset_limit = base_offset + INT32_MAX  # relative offsets are int32
        self.timestamp_limit = _NO_LIMIT  # a batch max timestamp above it may be due for segment.ms
        self.index_entries_left = 0  # index entries that fit, in pages already faulted in (a lower bound)
        self.index_interval_bytes = config.index_interval_bytes
        self._reservation = BlockReservation(config.preallocate, self.log_path)  # log.preallocate

    def __repr__(self) -> str:
        state = "active" if self.is_active else ("closed" if self.writable else "view")
        return (f"LogSegment({self.log_path!r}, {state}, size={self.size_bytes}, "
                f"next_offset={self.next_offset})")

    # --- opening --------------------------------------------------------------------------------------------
    @classmethod
    def create(cls, directory: str, base_offset: int, config: LogConfig) -> LogSegment:
        """A new, empty active segment (an existing empty ``.log`` of that name is reused)."""
        segment = cls(directory, base_offset, config, writable=True)
        try:
            fd = os.open(segment.log_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        except FileExistsError:
            if os.stat(segment.log_path).st_size != 0:
                raise CorruptRecordError(
                    f"{segment.log_path}: cannot create a new segment, a non-empty file is already there"
                ) from None
            fd = os.open(segment.log_path, os.O_WRONLY | os.O_APPEND)
        segment.append_fd = fd
        try:
            if DISK_FAULTS.armed:
                DISK_FAULTS.check("segment.create", segment.log_path)
            segment._reservation.attach(fd, 0)
            segment.read_fd = os.open(segment.log_path, os.O_RDONLY)
            segment._index_paths.unlink()
            segment._open_indexes_active(0, 0)
        except BaseException:
            segment.delete()  # a roll that failed leaves no file of the new segment behind
            raise
        return segment

    @classmethod
    def load(cls, directory: str, base_offset: int, config: LogConfig, *, active: bool,
             next_offset_limit: int | None) -> LogSegment:
        """Open an existing segment whose data is trusted (below the recovery point or cleanly closed).

        Its indexes are sanity-checked; one that fails is rebuilt from the ``.log`` file (which checks every
        batch: a corrupt one raises :class:`CorruptRecordError`).
        """
        segment = cls(directory, base_offset, config, writable=True)
        try:
            segment._load_trusted(active, next_offset_limit)
        except BaseException:
            segment.close()
            raise
        return segment

    def _load_trusted(self, active: bool, next_offset_limit: int | None) -> None:
        self.read_fd = os.open(self.log_path, os.O_RDONLY)
        self.size_bytes = os.fstat(self.read_fd).st_size
        headers = BatchHeaders(self.read_fd, self.size_bytes)
        indexes = self._index_paths.open_checked(headers, next_offset_limit)
        if isinstance(indexes, str):
            _log.warning("%s: rebuilding indexes: %s", self.log_path, indexes)
            scan = scan_segment(self.log_path, self.base_offset,
                                index_interval_bytes=self.config.index_interval_bytes)
            if scan.error is not None or scan.valid_bytes != self.size_bytes:
                assert scan.error is not None
                raise CorruptRecordError(describe(self.log_path, scan.error))
            self._adopt_scan(scan, closed=not active)
        else:
            self.offset_index, self.time_index = indexes
            self._restore_state_from_indexes()
        if active:
            self.reopen_for_append()

    @classmethod
    def from_scan(cls, directory: str, base_offset: int, config: LogConfig, scan: SegmentScan, *,
                  active: bool) -> LogSegment:
        """Open a segment just checked by recovery (its file already cut to ``scan.valid_bytes``)."""
        segment = cls(directory, base_offset, config, writable=True)
        segment.read_fd = os.open(segment.log_path, os.O_RDONLY)
        segment.size_bytes = scan.valid_bytes
        segment._adopt_scan(scan, closed=not active)
        if active:
            segment.reopen_for_append()
        return segment

    @classmethod
    def open_view(cls, directory: str, base_offset: int, config: LogConfig) -> LogSegment:
        """A reader's view: no lock, no writes; index files mapped read-only as they are now."""
        segment = cls(directory, base_offset, config, writable=False)
        segment.read_fd = os.open(segment.log_path, os.O_RDONLY)
        segment.refresh_view()
        return segment

    def same_file(self) -> bool:
        """Whether this view's descriptor holds the file at its path (a clean's swap may have put another)."""
        try:
            return os.stat(self.log_path).st_ino == os.fstat(self.read_fd).st_ino
        except FileNotFoundError:
            return False

    def refresh_view(self) -> None:
        """Re-map the index files if the writer replaced or grew them (reader views only)."""
        try:
            st = os.stat(self.index_path)
            identity = (st.st_ino, st.st_size)
        except FileNotFoundError:
            identity = (0, 0)
        if identity == self.index_identity:
            return
        self.offset_index.close()
        self.time_index.close()
        self.index_identity = identity
        self.offset_index, self.time_index = self._index_paths.open_view()

    def _restore_state_from_indexes(self) -> None:
        last = self.offset_index.last_entry()
        start = 0 if last is None else last.position
        self.bytes_since_last_index_entry = self.size_bytes - start
        headers = BatchHeaders(self.read_fd, self.size_bytes)
        position, next_offset = headers.end_from(start, self.base_offset)
        if position != self.size_bytes:
            raise CorruptRecordError(
                f"{self.log_path}: batch headers end at position {position} but the file has "
                f"{self.size_bytes} bytes"
            )
        self.next_offset = next_offset
        last_time = self.time_index.last_entry()
        if last_time is not None:
            self.max_timestamp, self.offset_of_max_timestamp = last_time
        first = headers.at(0)
        self.rolling_timestamp = NO_TIMESTAMP if first is None else first.max_timestamp

    def _adopt_scan(self, scan: SegmentScan, *, closed: bool) -> None:
        self.next_offset = scan.next_offset
        self.max_timestamp = scan.max_timestamp
        self.offset_of_max_timestamp = scan.offset_of_max_timestamp
        self.rolling_timestamp = scan.first_batch_max_timestamp
        last_position = int(scan.index_positions[-1]) if len(scan.index_positions) else 0
        self.bytes_since_last_index_entry = scan.valid_bytes - last_position
        self.offset_index.close()
        self.time_index.close()
        self.offset_index, self.time_index = self._index_paths.write_rebuilt(
            scan, closed=closed, max_bytes=self.config.segment_index_bytes)
        self.refresh_append_budget()

    def _open_indexes_active(self, index_entries: int, time_entries: int) -> None:
        self.offset_index, self.time_index = self._index_paths.open_active(self.config.segment_index_bytes,
                                                                           index_entries, time_entries)
        self.refresh_append_budget()

    def reopen_for_append(self) -> None:
        """Make this (closed) segment the active one again: append descriptor, indexes preallocated."""
        assert self.writable
        if self.append_fd >= 0 and self.offset_index.file.writable and self.time_index.file.writable:
            return
        if self.append_fd < 0:
            self.append_fd = os.open(self.log_path, os.O_WRONLY | os.O_APPEND)
        self._reservation.attach(self.append_fd, self.size_bytes)
        index_entries = self.offset_index.entries
        time_entries = self.time_index.entries
        self.offset_index.close()
        self.time_index.close()
        self._open_indexes_active(index_entries, time_entries)

    @property
    def is_active(self) -> bool:
        return self.append_fd >= 0

    # --- writing (the log's single writer) -----------------------------------------------------------------
    def append(self, data: BatchBuffer, batches: Sequence[BatchRow]) -> int:
        """Write ``data`` (whole batches) with one ``os.write``: :meth:`append_parts` with one part."""
        return self.append_parts((data,), len(data), batches)

    def append_parts(self, parts: Sequence[BatchBuffer], size_bytes: int,
                     batches: Sequence[BatchRow]) -> int:
        """Write whole batches and index them; returns the position written at.

        ``parts`` is one buffer holding every batch, or one buffer per batch (written with ``os.writev``
        straight from the caller's memory, :data:`IOV_MAX` buffers per call); ``size_bytes`` is their total.
        ``batches`` lists each batch's ``(base offset, last offset, size, max timestamp)`` for the indexes
        (the log checked there is room: ``index_room``).
        """
        start = self.size_bytes
        self._reserve_index_room(len(batches), size_bytes)
        reservation = self._reservation
        if start + size_bytes > reservation.end and reservation.enabled:
            reservation.reserve(self.append_fd, start, start + size_bytes, self.config.segment_bytes)
        self._write(parts, size_bytes, start)
        position = start
        interval = self.config.index_interval_bytes
        since = self.bytes_since_last_index_entry
        max_timestamp = self.max_timestamp
        offset_of_max = self.offset_of_max_timestamp
        base = self.base_offset
        add_offset_entry = self.offset_index.file.append
        time_index = self.time_index
        for _, last_offset, size, batch_max_timestamp in batches:
            if batch_max_timestamp > max_timestamp:
                max_timestamp, offset_of_max = batch_max_timestamp, last_offset
            if since > interval:
                add_offset_entry(last_offset - base, position)
                if max_timestamp > time_index.last_timestamp:
                    time_index.maybe_append(max_timestamp, offset_of_max)
                since = 0
            position += size
            since += size
        if start == 0:
            self.rolling_timestamp = batches[0][3]
        self.max_timestamp = max_timestamp
        self.offset_of_max_timestamp = offset_of_max
        self.bytes_since_last_index_entry = since
        self.size_bytes = position
        self.next_offset = batches[-1][1] + 1
        self.refresh_append_budget()
        return start

    def _reserve_index_room(self, batch_count: int, size_bytes: int) -> None:
        """Before ``batch_count`` batches of ``size_bytes`` are written: allocate room in both indexes for
        every entry they can add (one per ``index.interval.bytes``, and the time index's final one), so an
        append that fails for want of index space fails before its bytes reach the file."""
        entries = min(batch_count, size_bytes // max(self.index_interval_bytes, 1) + 1)
        offsets, times = self.offset_index.file, self.time_index.file
        offsets.reserve_entries(offsets.entries + entries)
        times.reserve_entries(times.entries + entries + 1)

    def _write(self, parts: Sequence[BatchBuffer], size_bytes: int, start: int) -> None:
        """Write ``parts`` at the end of the file, which holds ``start`` bytes; a write that fails (a full
        disk) is cut back to ``start`` before the error goes on."""
        try:
            if DISK_FAULTS.armed:
                DISK_FAULTS.check_write(self.append_fd, parts, self.log_path)
            write_fully(self.append_fd, parts, size_bytes)
        except OSError:
            self._cut_back(start)
            raise

    def _cut_back(self, start: int) -> None:
        """A write from ``start`` failed part-way: drop what reached the file (also any blocks reserved
        past it), so the segment is exactly as before the append.  Nothing else changed yet: the indexes
        and the accounting are updated only after the bytes are in."""
        os.ftruncate(self.append_fd, start)
        self._reservation.cut(start)
        _log.warning("%s: an append failed; the file was cut back to its %d bytes", self.log_path, start)

    def fits(self, size_bytes: int, last_offset: int, batch_count: int, max_timestamp: int,
             now_ms: int) -> bool:
        """Whether ``batch_count`` batches, ``size_bytes`` in all, ending at ``last_offset`` and none with a
        max timestamp above ``max_timestamp``, all go into this non-empty segment with no roll rule firing
        (an index entry counted for every batch).  False for an empty segment: see
        :meth:`batches_that_fit`."""
        config = self.config
        rolling = self.rolling_timestamp
        return (0 < self.size_bytes <= config.segment_bytes - size_bytes
                and last_offset - self.base_offset <= INT32_MAX
                and self.index_room() >= batch_count
                and (max_timestamp - rolling if rolling >= 0 else now_ms - self.created_ms)
                <= config.segment_ms)

    def batches_that_fit(self, batches: Sequence[BatchRow], now_ms: int) -> int:
        """How many of ``batches`` (``(base offset, last offset, size, max timestamp)``), from the first, go
        into this segment before a roll rule fires, each rule applied batch by batch with the index rule
        counting the entries; an empty segment takes the first batch whatever it is."""
        config = self.config
        size = self.size_bytes
        since = self.bytes_since_last_index_entry
        room = self.index_room()
        rolling = self.rolling_timestamp
        for i, (_, last, batch_size, max_timestamp) in enumerate(batches):
            if size > 0 and (
                size + batch_size > config.segment_bytes
                or last - self.base_offset > INT32_MAX
                or (since > config.index_interval_bytes and room <= 0)
                or (max_timestamp - rolling if rolling >= 0 else now_ms - self.created_ms) > config.segment_ms
            ):
                return i
            if since > config.index_interval_bytes:
                room -= 1
                since = 0
            if size == 0:
                rolling = max_timestamp
            since += batch_size
            size += batch_size
        return len(batches)

    def append_batch(self, view: BatchBuffer, size_bytes: int, last_offset: int, max_timestamp: int) -> int:
        """The log's hot path: write one stamped batch if it is within the append budget, index it by the
        index rule and account for it, with no roll rule evaluated.  Returns the position written at, or
        :data:`OVER_BUDGET` with nothing done (the log's general path then decides: roll, then
        :meth:`append_parts`).  ``view`` holds exactly the batch: ``size_bytes`` bytes whose offsets end at
        ``last_offset``, from :attr:`next_offset` on."""
        room = self.room_bytes - size_bytes
        if room < 0:
            if not self._extend_reservation(size_bytes):  # once per reserved chunk
                return OVER_BUDGET
            room = self.room_bytes - size_bytes
        since = self.bytes_since_last_index_entry
        index_due = since > self.index_interval_bytes
        if (last_offset > self.last_offset_limit or max_timestamp > self.timestamp_limit
                or (index_due and self.index_entries_left <= 0)):
            return OVER_BUDGET
        fd = self.append_fd
        position = self.size_bytes
        try:
            if DISK_FAULTS.armed:
                DISK_FAULTS.check_write(fd, (view,), self.log_path)
            written = _os_write(fd, view)
            if written != size_bytes:
                write_rest(fd, (view,), written)
        except OSError:
            self._cut_back(position)
            raise
        if max_timestamp > self.max_timestamp:
            self.max_timestamp = max_timestamp
            self.offset_of_max_timestamp = last_offset
        if index_due:  # the index rule, after the bytes are in the file
            self.offset_index.file.append_prefaulted(last_offset - self.base_offset, position)  # the budget
            top = self.max_timestamp
            if top > self.time_index.last_timestamp:
                self.time_index.maybe_append(top, self.offset_of_max_timestamp)
            self.index_entries_left -= 1  # a time entry only comes with an offset entry
            self.bytes_since_last_index_entry = size_bytes
        else:
            self.bytes_since_last_index_entry = since + size_bytes
        self.size_bytes = position + size_bytes
        self.room_bytes = room
        self.next_offset = last_offset + 1
        return position

    def append_walked(self, parts: Sequence[BatchBuffer], size_bytes: int, positions: np.ndarray,
                      sizes: np.ndarray, last_offsets: np.ndarray, max_timestamps: np.ndarray) -> int:
        """:meth:`append_parts` for many batches described by arrays (``storage.batch_scan.walk_batches``'
        output: int64, one row per batch, ``positions`` relative to the first batch); the index entries come
        from one ``plan_index_entries`` call (the same rule, no Python per batch).  Returns the position
        written at."""
        count = len(positions)
        start = self.size_bytes
        self._reserve_index_room(count, size_bytes)
        reservation = self._reservation
        if start + size_bytes > reservation.end and reservation.enabled:
            reservation.reserve(self.append_fd, start, start + size_bytes, self.config.segment_bytes)
        self._write(parts, size_bytes, start)
        time_index = self.time_index
        state = np.array([self.bytes_since_last_index_entry, self.max_timestamp, self.offset_of_max_timestamp,
                          time_index.last_timestamp], dtype=np.int64)
        out = np.empty((4, count), dtype=np.int64)
        n_index, n_time = plan_index_entries(positions + start if start else positions, sizes, last_offsets,
                                             max_timestamps, count, self.base_offset,
                                             self.config.index_interval_bytes, state, out[0], out[1], out[2],
                                             out[3])
        if n_index:
            self.offset_index.append_many(out[0, :n_index], out[1, :n_index])
        if n_time:
            time_index.append_many(out[2, :n_time], out[3, :n_time])
        if start == 0:
            self.rolling_timestamp = int(max_timestamps[0])
        since, self.max_timestamp, self.offset_of_max_timestamp, _ = state.tolist()
        self.bytes_since_last_index_entry = since
        self.size_bytes = start + size_bytes
        self.next_offset = int(last_offsets[-1]) + 1
        self.refresh_append_budget()
        return start

    def refresh_append_budget(self) -> None:
        """Recompute the append budget from the segment's state (after any change to it but
        :meth:`append_batch`'s own, which keeps the budget up to date as it goes).  A closed segment, an
        empty one and one whose first batch had no timestamp (its age decides, which needs the clock) get
        none: the log's general path (:meth:`append_parts` after its own roll checks) serves them."""
        config = self.config
        size = self.size_bytes
        limit = config.segment_bytes
        reservation = self._reservation
        if reservation.enabled and reservation.end < limit:
            limit = reservation.end  # past it append_parts reserves the next chunk first
        self.room_bytes = limit - size if size > 0 and self.append_fd >= 0 else -1
        rolling = self.rolling_timestamp
        self.timestamp_limit = rolling + config.segment_ms if rolling >= 0 else _NO_LIMIT
        # past the faulted-in pages of .index, IndexFile.append (the general path) faults in the next ones
        # (a time entry only comes with an offset entry; the time index keeps one slot for its final one)
        self.index_entries_left = min(self.index_room(), self.offset_index.file.prefaulted_entries_left(),
                                      self.time_index.file.prefaulted_entries_left() - 1)

    def _extend_reservation(self, size_bytes: int) -> bool:
        """:meth:`append_batch`, for a batch of ``size_bytes`` beyond ``room_bytes``: when only the blocks
        reserved ahead (``preallocate``) stand in its way, reserve the next chunk (as :meth:`append_parts`
        would) and recompute the budget.  Returns whether the batch now fits ``room_bytes``; False, with
        nothing done, for a closed or empty segment and for a batch that would pass ``segment.bytes``."""
        end = self.size_bytes + size_bytes
        reservation = self._reservation
        if (self.room_bytes < 0 or not reservation.enabled or end <= reservation.end
                or end > self.config.segment_bytes):
            return False
        reservation.reserve(self.append_fd, self.size_bytes, end, self.config.segment_bytes)
        self.refresh_append_budget()
        return self.room_bytes >= size_bytes

    def index_room(self) -> int:
        """How many more index entries fit before the segment must roll."""
        offsets = self.offset_index.file
        times = self.time_index.file
        offset_room = offsets.max_entries - offsets.entries
        time_room = times.max_entries - 1 - times.entries
        return offset_room if offset_room < time_room else time_room

    def truncate_to(self, offset: int) -> int:
        """Drop every batch whose last offset is >= ``offset`` (the segment must be active).  Returns bytes
        dropped."""
        found = self.find_batch(max(offset, self.base_offset), verify=False)
        if found is None:
            return 0
        position = found[0]
        dropped = self.size_bytes - position
        os.ftruncate(self.append_fd, position)  # also frees blocks reserved past it (log.preallocate)
        self._reservation.cut(position)
        self.offset_index.truncate_to(offset)
        self.time_index.truncate_to(offset)
        self.size_bytes = position
        last = self.offset_index.last_entry()
        self.bytes_since_last_index_entry = position - (0 if last is None else last.position)
        self._recompute_tail_state()
        self.refresh_append_budget()
        return dropped

    def _recompute_tail_state(self) -> None:
        """next_offset, max timestamp and rolling timestamp after a truncation."""
        last_time = self.time_index.last_entry()
        self.max_timestamp, self.offset_of_max_timestamp = (
            (NO_TIMESTAMP, self.base_offset - 1) if last_time is None else last_time
        )
        start = 0
        if last_time is not None:
            found = self.find_batch(last_time.offset, verify=False)
            start = 0 if found is None else found[0]
        headers = BatchHeaders(self.read_fd, self.size_bytes)
        self.max_timestamp, self.offset_of_max_timestamp = headers.max_timestamp_from(
            start, self.max_timestamp, self.offset_of_max_timestamp)
        self.next_offset = self.end_of_data(verify=False)[1]
        first = headers.at(0)
        self.rolling_timestamp = NO_TIMESTAMP if first is None else first.max_timestamp
        if self.size_bytes == 0:
            self.created_ms = int(time.time() * 1000)

    def seal(self) -> None:
        """Roll/close: record the largest timestamp, trim the indexes, close the append descriptor."""
        if self.append_fd < 0:
            return
        self.time_index.maybe_append(self.max_timestamp, self.offset_of_max_timestamp, final=True)
        self.offset_index.trim()
        self.time_index.trim()
        self._reservation.release(self.append_fd if self.config.preallocate else -1)
        os.close(self.append_fd)
        self.append_fd = -1
        self.room_bytes = -1

    def flush(self) -> None:
        """fdatasync the ``.log``; msync (active) or fsync (trimmed) the indexes."""
        os.fdatasync(self.read_fd)
        self.offset_index.flush()
        self.time_index.flush()

    def index_files_fsync(self) -> None:
        self._index_paths.fsync()

    def close(self) -> None:
        self.offset_index.close()
        self.time_index.close()
        self._reservation.release(self.append_fd if self.config.preallocate else -1)
        for fd in (self.append_fd, self.read_fd):
            if fd >= 0:
                os.close(fd)
        self.append_fd = self.read_fd = -1
        self.room_bytes = -1

    def delete(self) -> None:
        """Close and unlink the three files (a reader's open descriptors keep working on the old inodes)."""
        self.close()
        self.unlink()

    def unlink(self) -> None:
        """Unlink the three files and leave the segment open: its descriptors and index mappings keep
        reading the old inodes until :meth:`close` (``storage.segment_deleter``)."""
        for path in (self.log_path, self.index_path, self.time_index_path):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass

    # --- reading (writer and readers) -----------------------------------------------------------------------
    def _end(self) -> int:
        return self.size_bytes if self.writable else os.fstat(self.read_fd).st_size

    def find_batch(self, offset: int, *, verify: bool,
                   end: int | None = None) -> tuple[int, BatchHeader] | None:
        """Position and header of the first batch whose last offset is >= ``offset``, or None."""
        end = self._end() if end is None else end
        headers = BatchHeaders(self.read_fd, end)
        position = 0
        entry = self.offset_index.lookup(offset)
        if entry is not None and entry.position < end:
            position = entry.position
            if verify:
                header = headers.at(position)
                if header is None or header.last_offset != entry.offset:
                    position = 0
        return headers.first_reaching(position, offset)

    def end_of_data(self, *, verify: bool, end: int | None = None) -> tuple[int, int]:
        """``(position, next offset)`` after the last whole batch (walked from the last index entry)."""
        end = self._end() if end is None else end
        headers = BatchHeaders(self.read_fd, end)
        position = 0
        entry = self.offset_index.last_entry()
        if entry is not None and entry.position < end:
            header = headers.at(entry.position)
            if header is not None and header.last_offset == entry.offset:
                position = entry.position
        return headers.end_from(position, self.base_offset)

    def read(self, offset: int, max_bytes: int, *, max_offset: int | None, verify: bool,
             end: int | None = None) -> FetchSlice | None:
        """Whole batches from the one holding ``offset``: at least that batch, at most ``max_bytes`` after it,
        none whose last offset is >= ``max_offset``.  None if no batch here has an offset >= ``offset``."""
        end = self._end() if end is None else end
        found = self.find_batch(offset, verify=verify, end=end)
        if found is None:
            return None
        position, first = found
        if max_offset is not None and first.last_offset >= max_offset:
            return FetchSlice(self.log_path, self.read_fd, position, 0, offset, offset)
        limit = min(end, position + max(max_bytes, first.size))
        stop, next_offset = self._boundary(position, first, limit, end, verify)
        if max_offset is not None and next_offset > max_offset:
            high = self.find_batch(max_offset, verify=verify, end=end)
            if high is not None and high[0] < stop:
                stop, next_offset = high[0], high[1].base_offset
        return FetchSlice(self.log_path, self.read_fd, position, stop - position, first.base_offset,
                          next_offset)

    def _boundary(self, position: int, first: BatchHeader, limit: int, end: int,
                  verify: bool) -> tuple[int, int]:
        """The last batch boundary <= ``limit`` after the first batch, and the offset after it."""
        headers = BatchHeaders(self.read_fd, end)
        stop = position + first.size
        next_offset = first.last_offset + 1
        if stop >= limit:
            return stop, next_offset
        entry = self.offset_index.lookup_position(limit)
        if entry is not None and entry.position > stop:
            header = headers.at(entry.position)
            if header is not None and (not verify or header.last_offset == entry.offset):
                stop = entry.position
                next_offset = header.base_offset
        return headers.boundary_within(stop, next_offset, limit)

    def largest_timestamp(self) -> int:
        """The segment's largest batch timestamp, or the file's mtime when it holds none (retention)."""
        if self.max_timestamp >= 0:
            return self.max_timestamp
        return int(os.stat(self.log_path).st_mtime * 1000)

