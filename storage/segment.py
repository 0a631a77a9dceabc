"""One log segment: ``<20-digit base offset>.log`` with its ``.index`` and ``.timeindex``.

Theory of operation
-------------------
A segment holds consecutive record batches, byte for byte as producers built them (with ``baseOffset`` and
``partitionLeaderEpoch`` stamped).  The ``.log`` file is opened ``O_APPEND`` by the log's single writer and
appended with one ``os.write`` per append call, or one ``os.writev`` of the batches' own buffers (ring
memory: no copy; ``IOV_MAX`` buffers per call); nothing is fsynced per append (the page cache holds it;
:meth:`LogSegment.flush` is ``fdatasync``).  After the bytes are written, the sparse indexes get their
entries, so an index entry never points at bytes that are not in the file yet.  The common append of one
batch (``Log.append_batches``' hot path, :meth:`LogSegment.append_batch`) checks the segment's *append
budget* instead of the roll rules themselves: bytes, offsets, timestamps and index entries left before a
roll rule could fire (:meth:`LogSegment.refresh_append_budget`); it writes the batch, indexes it by the rule
below and keeps the budget current as it goes.

Preallocation (``preallocate``): while a segment is active its disk blocks are reserved ahead of the
appends with ``fallocate(FALLOC_FL_KEEP_SIZE)`` (``storage.preallocate``: how far, and the binding), so the
file's size, and everything a reader sees, stays the data's; ext4 then skips its per-page block reservation
on each write.  The unused reservation is given back on seal and close (``ftruncate`` to the file's own size).

Index rule (Kafka's, applied per batch in order, identically by the live append and by the rebuild in
``storage.batch_scan.plan_index_entries``): remember the batch with the largest max timestamp so far; if more
than ``index.interval.bytes`` were appended since the last offset-index entry, add ``(batch last offset,
batch position)`` to ``.index`` and, if the max timestamp grew, ``(max timestamp, its offset)`` to
``.timeindex``.  On roll/close a last time entry records the segment's largest timestamp, then both indexes
are trimmed (``storage.index_file``).

Reading never maps the ``.log`` file: batch headers are read with ``pread`` (a file the writer truncates
under a reader would kill a mapping reader with SIGBUS; ``pread`` just returns fewer bytes).  To find the
batch holding offset ``o``: the offset index gives the last indexed batch ending at or before ``o``, then a
forward walk over at most ``index.interval.bytes`` of headers.  Readers in other processes
(``storage.log_reader``) use the same code in *verify* mode: every index answer is checked against the
header it points at, and a wrong one (stale, torn) falls back to walking from position 0.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, NamedTuple, TypeAlias

import numpy as np

from storage.batch_header import BATCH_HEADER, HEADER_SIZE, LOG_OVERHEAD, MAGIC, BatchHeader
from storage.batch_scan import SegmentScan, describe, plan_index_entries, scan_segment
from storage.errors import CorruptRecordError
from storage.index_file import IndexFile
from storage.log_config import INT32_MAX, LogConfig
from storage.offset_index import OFFSET_INDEX_ENTRY, OffsetIndex
from storage.preallocate import preallocation_helps, reservation_end, reserve_blocks
from storage.time_index import NO_TIMESTAMP, TIME_INDEX_ENTRY, TimeIndex

__all__ = [
    "INDEX_SUFFIX",
    "IOV_MAX",
    "LOG_SUFFIX",
    "OVER_BUDGET",
    "TIME_INDEX_SUFFIX",
    "BatchBuffer",
    "FetchSlice",
    "LogSegment",
    "OffsetAndTimestamp",
    "parse_segment_name",
    "segment_path",
    "write_fully",
    "write_rest",
]

LOG_SUFFIX: Final = ".log"
INDEX_SUFFIX: Final = ".index"
TIME_INDEX_SUFFIX: Final = ".timeindex"
_NAME_DIGITS: Final = 20
_CHUNK_BYTES: Final = 16 * 1024  # pread size when walking small batches
IOV_MAX: Final = os.sysconf("SC_IOV_MAX") if "SC_IOV_MAX" in os.sysconf_names else 1024  # buffers per writev
BatchBuffer: TypeAlias = "memoryview | bytes | bytearray"  # 1-D bytes (format "B"): len() counts bytes
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


def write_fully(fd: int, parts: Sequence[BatchBuffer], size_bytes: int) -> None:
    """Write ``parts`` (1-D byte buffers, ``size_bytes`` in all) in order: one ``os.write`` for one buffer,
    else one ``os.writev`` per :data:`IOV_MAX` buffers.  A regular file writes short only on trouble
    (ENOSPC-like, a signal); the rest is then written piece by piece (and a real error raises)."""
    if len(parts) == 1:
        written = os.write(fd, parts[0])
        if written < size_bytes:
            write_rest(fd, parts, written)
        return
    if len(parts) <= IOV_MAX:
        written = os.writev(fd, parts)
        if written < size_bytes:
            write_rest(fd, parts, written)
        return
    for first in range(0, len(parts), IOV_MAX):
        group = parts[first : first + IOV_MAX]
        written = os.writev(fd, group)
        if written < sum(len(part) for part in group):
            write_rest(fd, group, written)


def write_rest(fd: int, parts: Sequence[BatchBuffer], written: int) -> None:
    """Finish a short write: the bytes of ``parts`` after the first ``written``."""
    for part in parts:
        view = memoryview(part).cast("B")
        if written >= len(view):
            written -= len(view)
            continue
        view = view[written:]
        written = 0
        while view:
            view = view[os.write(fd, view) :]


@dataclass(frozen=True, slots=True)
class FetchSlice:
    """Bytes to send for a fetch: ``size_bytes`` bytes of ``path`` from ``position``, whole batches only.

    ``fd`` is an open read-only descriptor of that file owned by the log (or reader) that returned the
    slice: use it with ``os.sendfile(sock, fd, position, size_bytes)`` or :meth:`read_bytes`, never close it.
    It stays valid until the next call on that log/reader that may delete or close segments (retention,
    truncation, refresh, close).  ``first_offset`` is the base offset of the first batch sent (it may be
    below the offset asked for: Kafka sends the whole batch holding it); ``next_offset`` is where to fetch
    next.  An empty slice (``size_bytes == 0``) means nothing is readable there yet.
    """

    path: str
    fd: int
    position: int
    size_bytes: int
    first_offset: int
    next_offset: int

    def read_bytes(self) -> bytes:
        """The slice's bytes, read with pread (for tests and local consumers)."""
        parts = []
        done = 0
        while done < self.size_bytes:
            chunk = os.pread(self.fd, self.size_bytes - done, self.position + done)
            if not chunk:
                raise CorruptRecordError(
                    f"{self.path}: file ends at position {self.position + done}, slice needs "
                    f"{self.position + self.size_bytes}"
                )
            parts.append(chunk)
            done += len(chunk)
        return b"".join(parts)


class OffsetAndTimestamp(NamedTuple):
    offset: int
    timestamp: int  # ms


class _Headers:
    """Batch headers of a ``.log`` file read with pread, a chunk at a time, up to ``end``."""

    __slots__ = ("_at", "_buf", "_last_size", "end", "fd")

    def __init__(self, fd: int, end: int) -> None:
        self.fd = fd
        self.end = end
        self._buf = b""
        self._at = 0
        self._last_size = 0

    def at(self, position: int) -> BatchHeader | None:
        """The header of a whole, plausible batch at ``position`` (ending by ``end``), else None."""
        if position + HEADER_SIZE > self.end:
            return None
        rel = position - self._at
        if rel < 0 or rel + HEADER_SIZE > len(self._buf):
            want = HEADER_SIZE if self._last_size >= _CHUNK_BYTES else min(_CHUNK_BYTES, self.end - position)
            self._buf = os.pread(self.fd, want, position)
            self._at = position
            rel = 0
            if len(self._buf) < HEADER_SIZE:
                return None
        header = BatchHeader._make(BATCH_HEADER.unpack_from(self._buf, rel))
        size = header.batch_length + LOG_OVERHEAD
        if (header.magic != MAGIC or size < HEADER_SIZE or position + size > self.end
                or header.last_offset_delta < 0):
            return None
        self._last_size = size
        return header


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
        self.offset_index: OffsetIndex = OffsetIndex(IndexFile(self.index_path, OFFSET_INDEX_ENTRY,
                                                               writable=False), base_offset)
        self.time_index: TimeIndex = TimeIndex(IndexFile(self.time_index_path, TIME_INDEX_ENTRY,
                                                         writable=False), base_offset)
        self.index_identity: tuple[int, int] = (0, 0)  # (inode, size) of .index when a view mapped it
        # The append budget: what one batch may take with no roll rule able to fire, so append_batch (the
        # log's hot path) checks these instead of the rules.  refresh_append_budget recomputes it after
        # every change but append_batch's own, which keeps room_bytes and index_entries_left current.
        self.room_bytes = -1  # bytes before segment.bytes (or the reservation); -1: closed or empty
        self.last_offset_limit = base_offset + INT32_MAX  # relative offsets are int32
        self.timestamp_limit = _NO_LIMIT  # a batch max timestamp above it may be due for segment.ms
        self.index_entries_left = 0  # index entries that fit, in pages already faulted in (a lower bound)
        self.index_interval_bytes = config.index_interval_bytes
        # log.preallocate: while active, blocks are reserved (KEEP_SIZE) up to _reserved_end
        self._preallocate = config.preallocate  # False also after a failed fallocate, or on tmpfs
        self._reserved_end = 0

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
        segment._preallocate = segment._preallocate and preallocation_helps(fd)
        segment.read_fd = os.open(segment.log_path, os.O_RDONLY)
        for path in (segment.index_path, segment.time_index_path):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        segment._open_indexes_active(0, 0)
        return segment

    @classmethod
    def load(cls, directory: str, base_offset: int, config: LogConfig, *, active: bool,
             next_offset_limit: int | None) -> LogSegment:
        """Open an existing segment whose data is trusted (below the recovery point or cleanly closed).

        Its indexes are sanity-checked; one that fails is rebuilt from the ``.log`` file (which checks every
        batch: a corrupt one raises :class:`CorruptRecordError`).
        """
        segment = cls(directory, base_offset, config, writable=True)
        segment.read_fd = os.open(segment.log_path, os.O_RDONLY)
        segment.size_bytes = os.fstat(segment.read_fd).st_size
        problem = segment._load_indexes(next_offset_limit)
        if problem is not None:
            _log.warning("%s: rebuilding indexes: %s", segment.log_path, problem)
            scan = scan_segment(segment.log_path, base_offset,
                                index_interval_bytes=config.index_interval_bytes)
            if scan.error is not None or scan.valid_bytes != segment.size_bytes:
                segment.close()
                assert scan.error is not None
                raise CorruptRecordError(describe(segment.log_path, scan.error))
            segment._adopt_scan(scan, closed=not active)
        else:
            segment._restore_state_from_indexes()
        if active:
            segment.reopen_for_append()
        return segment

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
        try:
            self.offset_index = OffsetIndex.open_view(self.index_path, self.base_offset)
            self.time_index = TimeIndex.open_view(self.time_index_path, self.base_offset)
        except (FileNotFoundError, ValueError):
            self.offset_index = OffsetIndex(IndexFile(self.index_path, OFFSET_INDEX_ENTRY, writable=False),
                                            self.base_offset)
            self.time_index = TimeIndex(IndexFile(self.time_index_path, TIME_INDEX_ENTRY, writable=False),
                                        self.base_offset)

    def _load_indexes(self, next_offset_limit: int | None) -> str | None:
        for path, entry in ((self.index_path, OFFSET_INDEX_ENTRY), (self.time_index_path, TIME_INDEX_ENTRY)):
            try:
                size = os.stat(path).st_size
            except FileNotFoundError:
                return f"{os.path.basename(path)} is missing"
            if size % entry.size:
                return f"{os.path.basename(path)}: size {size} bytes is not a multiple of {entry.size}"
        self.offset_index = OffsetIndex.open_closed(self.index_path, self.base_offset)
        self.time_index = TimeIndex.open_closed(self.time_index_path, self.base_offset)
        problem = self.offset_index.sanity_problem(log_size_bytes=self.size_bytes,
                                                   next_offset_limit=next_offset_limit)
        if problem is None:
            problem = self.time_index.sanity_problem(next_offset_limit=next_offset_limit)
            problem = None if problem is None else f"{os.path.basename(self.time_index_path)}: {problem}"
        else:
            problem = f"{os.path.basename(self.index_path)}: {problem}"
        if problem is None:
            last = self.offset_index.last_entry()
            if last is not None:
                header = _Headers(self.read_fd, self.size_bytes).at(last.position)
                if header is None or header.last_offset != last.offset:
                    problem = (f"{os.path.basename(self.index_path)}: last entry {tuple(last)} does not "
                               "match the batch at its position")
        if problem is not None:
            self.offset_index.close()
            self.time_index.close()
        return problem

    def _restore_state_from_indexes(self) -> None:
        last = self.offset_index.last_entry()
        start = 0 if last is None else last.position
        self.bytes_since_last_index_entry = self.size_bytes - start
        headers = _Headers(self.read_fd, self.size_bytes)
        position, next_offset = start, self.base_offset
        header = headers.at(position)
        while header is not None:
            next_offset = header.last_offset + 1
            position += header.size
            header = headers.at(position)
        if position != self.size_bytes:
            raise CorruptRecordError(
                f"{self.log_path}: batch headers end at position {position} but the file has "
                f"{self.size_bytes} bytes (run recovery)"
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
        if closed:
            timestamps, relative = scan.time_timestamps, scan.time_relative_offsets
            if scan.max_timestamp > (int(timestamps[-1]) if len(timestamps) else NO_TIMESTAMP):
                timestamps = np.append(timestamps, scan.max_timestamp)
                relative = np.append(relative, scan.offset_of_max_timestamp - self.base_offset)
            self.offset_index = OffsetIndex.write_closed(self.index_path, self.base_offset,
                                                         scan.index_relative_offsets, scan.index_positions)
            self.time_index = TimeIndex.write_closed(self.time_index_path, self.base_offset, timestamps,
                                                     relative)
        else:
            for path in (self.index_path, self.time_index_path):
                try:
                    os.unlink(path)  # a fresh inode: a reader keeps mapping the old one safely
                except FileNotFoundError:
                    pass
            self._open_indexes_active(0, 0)
            self.offset_index.append_many(scan.index_relative_offsets, scan.index_positions)
            self.time_index.append_many(scan.time_timestamps, scan.time_relative_offsets)
        self.refresh_append_budget()

    def _open_indexes_active(self, index_entries: int, time_entries: int) -> None:
        max_bytes = self.config.segment_index_bytes
        self.offset_index = OffsetIndex.open_active(self.index_path, self.base_offset, max_bytes=max_bytes,
                                                    entries=index_entries)
        self.time_index = TimeIndex.open_active(self.time_index_path, self.base_offset, max_bytes=max_bytes,
                                                entries=time_entries)
        self.refresh_append_budget()

    def reopen_for_append(self) -> None:
        """Make this (closed) segment the active one again: append descriptor, indexes preallocated."""
        assert self.writable
        if self.append_fd >= 0 and self.offset_index.file.writable:
            return
        if self.append_fd < 0:
            self.append_fd = os.open(self.log_path, os.O_WRONLY | os.O_APPEND)
            self._preallocate = self._preallocate and preallocation_helps(self.append_fd)
        self._reserved_end = self.size_bytes  # what lies past it (a crash's leftover) is released on seal
        index_entries = self.offset_index.entries
        time_entries = self.time_index.entries
        self.offset_index.close()
        self.time_index.close()
        self._open_indexes_active(index_entries, time_entries)

    @property
    def is_active(self) -> bool:
        return self.append_fd >= 0

    # --- writing (the log's single writer) -----------------------------------------------------------------
    def append(self, data: BatchBuffer, batches: Sequence[tuple[int, int, int, int]]) -> int:
        """Write ``data`` (whole batches) with one ``os.write``: :meth:`append_parts` with one part."""
        return self.append_parts((data,), len(data), batches)

    def append_parts(self, parts: Sequence[BatchBuffer], size_bytes: int,
                     batches: Sequence[tuple[int, int, int, int]]) -> int:
        """Write whole batches and index them; returns the position written at.

        ``parts`` is one buffer holding every batch, or one buffer per batch (written with ``os.writev``
        straight from the caller's memory, :data:`IOV_MAX` buffers per call); ``size_bytes`` is their total.
        ``batches`` lists each batch's ``(base offset, last offset, size, max timestamp)`` for the indexes
        (the log checked there is room: ``index_room``).
        """
        start = self.size_bytes
        if start + size_bytes > self._reserved_end and self._preallocate:
            self._reserve_ahead(start + size_bytes)
        write_fully(self.append_fd, parts, size_bytes)
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
        written = _os_write(fd, view)
        if written != size_bytes:
            write_rest(fd, (view,), written)
        position = self.size_bytes
        if max_timestamp > self.max_timestamp:
            self.max_timestamp = max_timestamp
            self.offset_of_max_timestamp = last_offset
        if index_due:  # the index rule, after the bytes are in the file
            self.offset_index.file.append(last_offset - self.base_offset, position)  # in faulted-in pages
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
        if start + size_bytes > self._reserved_end and self._preallocate:
            self._reserve_ahead(start + size_bytes)
        write_fully(self.append_fd, parts, size_bytes)
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
        if self._preallocate and self._reserved_end < limit:
            limit = self._reserved_end  # past it append_parts reserves the next chunk first
        self.room_bytes = limit - size if size > 0 and self.append_fd >= 0 else -1
        rolling = self.rolling_timestamp
        self.timestamp_limit = rolling + config.segment_ms if rolling >= 0 else _NO_LIMIT
        # past the faulted-in pages of .index, IndexFile.append (the general path) faults in the next ones
        self.index_entries_left = min(self.index_room(), self.offset_index.file.prefaulted_entries_left())

    def _extend_reservation(self, size_bytes: int) -> bool:
        """:meth:`append_batch`, for a batch of ``size_bytes`` beyond ``room_bytes``: when only the blocks
        reserved ahead (``preallocate``) stand in its way, reserve the next chunk (as :meth:`append_parts`
        would) and recompute the budget.  Returns whether the batch now fits ``room_bytes``; False, with
        nothing done, for a closed or empty segment and for a batch that would pass ``segment.bytes``."""
        end = self.size_bytes + size_bytes
        if (self.room_bytes < 0 or not self._preallocate or end <= self._reserved_end
                or end > self.config.segment_bytes):
            return False
        self._reserve_ahead(end)
        self.refresh_append_budget()
        return self.room_bytes >= size_bytes

    def _reserve_ahead(self, end: int) -> None:
        """``log.preallocate``: reserve blocks through ``end`` and beyond (``reservation_end``).  Where
        that fails (a full disk, a file system without ``fallocate``) or would not help (tmpfs), this
        segment stops preallocating and its writes go on as without."""
        new_end = reservation_end(self.size_bytes, end, self.config.segment_bytes)
        error = reserve_blocks(self.append_fd, self._reserved_end, new_end - self._reserved_end)
        if error:
            _log.debug("%s: not preallocating (%s)", self.log_path, os.strerror(error))
            self._preallocate = False
            return
        self._reserved_end = new_end

    def _release_reserved(self) -> None:
        """Give back the blocks reserved past the end of the data (roll, close).  ``ftruncate`` to the file's
        own size frees them (checked on ext4 and tmpfs); the size, the bytes and the mtime (retention of
        segments without timestamps reads it) stay as they were."""
        if self.append_fd >= 0 and self.config.preallocate:  # (also a crash's leftover, on tmpfs too)
            st = os.fstat(self.append_fd)
            if st.st_blocks * 512 > st.st_size:
                os.ftruncate(self.append_fd, st.st_size)
                os.utime(self.append_fd, ns=(st.st_atime_ns, st.st_mtime_ns))
        self._reserved_end = 0

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
        self._reserved_end = min(self._reserved_end, position)
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
        headers = _Headers(self.read_fd, self.size_bytes)
        position = start
        header = headers.at(position)
        while header is not None:
            if header.max_timestamp > self.max_timestamp:
                self.max_timestamp, self.offset_of_max_timestamp = header.max_timestamp, header.last_offset
            position += header.size
            header = headers.at(position)
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
        self._release_reserved()
        os.close(self.append_fd)
        self.append_fd = -1
        self.room_bytes = -1

    def flush(self) -> None:
        """fdatasync the ``.log``; msync (active) or fsync (trimmed) the indexes."""
        os.fdatasync(self.read_fd)
        self.offset_index.flush()
        self.time_index.flush()

    def index_files_fsync(self) -> None:
        for path in (self.index_path, self.time_index_path):
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                continue
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def close(self) -> None:
        self.offset_index.close()
        self.time_index.close()
        self._release_reserved()
        for fd in (self.append_fd, self.read_fd):
            if fd >= 0:
                os.close(fd)
        self.append_fd = self.read_fd = -1
        self.room_bytes = -1

    def delete(self) -> None:
        """Close and unlink the three files (a reader's open descriptors keep working on the old inodes)."""
        self.close()
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
        headers = _Headers(self.read_fd, end)
        position = 0
        entry = self.offset_index.lookup(offset)
        if entry is not None and entry.position < end:
            position = entry.position
            if verify:
                header = headers.at(position)
                if header is None or header.last_offset != entry.offset:
                    position = 0
        header = headers.at(position)
        while header is not None:
            if header.last_offset >= offset:
                return position, header
            position += header.size
            header = headers.at(position)
        return None

    def end_of_data(self, *, verify: bool, end: int | None = None) -> tuple[int, int]:
        """``(position, next offset)`` after the last whole batch (walked from the last index entry)."""
        end = self._end() if end is None else end
        headers = _Headers(self.read_fd, end)
        position, next_offset = 0, self.base_offset
        entry = self.offset_index.last_entry()
        if entry is not None and entry.position < end:
            header = headers.at(entry.position)
            if header is not None and header.last_offset == entry.offset:
                position = entry.position
        header = headers.at(position)
        while header is not None:
            next_offset = header.last_offset + 1
            position += header.size
            header = headers.at(position)
        return position, next_offset

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
        headers = _Headers(self.read_fd, end)
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
        header = headers.at(stop)
        while header is not None and stop + header.size <= limit:
            stop += header.size
            next_offset = header.last_offset + 1
            header = headers.at(stop)
        return stop, next_offset

    def find_timestamp(self, timestamp: int, *, verify: bool) -> OffsetAndTimestamp | None:
        """Base offset and max timestamp of the first batch whose max timestamp is >= ``timestamp``."""
        end = self._end()
        entry = self.time_index.lookup(timestamp)
        found = self.find_batch(self.base_offset if entry is None else entry.offset, verify=verify, end=end)
        if found is None:
            return None
        position, header = found
        headers = _Headers(self.read_fd, end)
        current: BatchHeader | None = header
        while current is not None:
            if current.max_timestamp >= timestamp:
                return OffsetAndTimestamp(current.base_offset, current.max_timestamp)
            position += current.size
            current = headers.at(position)
        return None

    def largest_timestamp(self) -> int:
        """The segment's largest batch timestamp, or the file's mtime when it holds none (retention)."""
        if self.max_timestamp >= 0:
            return self.max_timestamp
        return int(os.stat(self.log_path).st_mtime * 1000)

