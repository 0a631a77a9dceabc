"""A sparse, memory-mapped, fixed-entry index file, and the numba kernels that search it.

Theory of operation
-------------------
An index file is an array of fixed-size big-endian entries whose first field (the *key*) strictly increases:
relative offsets in ``.index`` files, timestamps in ``.timeindex`` files (see ``storage.offset_index`` and
``storage.time_index`` for the layouts).  Lookups answer "the last entry whose key is <= target" by a
binary search over the mapped bytes, in numba (:func:`index_search`); entries are read big-endian by hand
(numba has no non-native byte order), each with the field offsets derived from the layout's dtype.

Index files are *disposable*: they are not checksummed and are rebuilt from the segment's log file when a
sanity check fails or after an unclean stop.  Their lifecycle, as Kafka's:

* the active segment's index may hold up to ``segment.index.bytes``, but its file only ever covers blocks
  that are really allocated: it grows in chunks as entries need room (:meth:`IndexFile.reserve_entries`,
  ``posix_fallocate``, by as much as it holds, one page at least, :data:`_ALLOCATE_MAX_BYTES` at most)
  and is mapped read-write at that size; entries are appended in place; the allocated tail stays zero.
  A sparse file would be a trap: touching a page of a mapped hole makes the kernel allocate it then, and
  on a full file system that fault is SIGBUS, in the writer and in every reader mapping the file.  A
  failed allocation (``ENOSPC``) leaves the file and its mapping as they were and raises; opening an
  active index where there is no room maps what the file already holds;
* on roll or close it is *trimmed* to its used size.  Trimming writes the used bytes to a new file and
  renames it over the old one (``storage.atomic_file``, not durable: an index is rebuilt when it is lost),
  so the file a concurrent reader has mapped is never shrunk in place (touching a mapped page past the end
  of a shrunk file would kill the reader with SIGBUS); the old mapping is dropped only once the new file
  is in place, so a trim that fails (a full disk) leaves the index as it was;
* truncation (``truncate_to``) zeroes the dropped entries in place; the file is never shrunk.

Readers in other processes (``storage.log_reader``) map the files read-only and do not know how many
entries are used; :func:`count_used_entries` finds the boundary between the used entries and the zero
tail by binary search, and every answer is treated as a hint the reader checks against the log file.
"""

from __future__ import annotations

import mmap
import os
import struct
from typing import ClassVar, Final, Self

import numba
import numpy as np

from storage.atomic_file import write_atomically
from storage.disk_faults import DISK_FAULTS
from storage.errors import is_disk_full

__all__ = [
    "NOT_FOUND",
    "IndexFile",
    "SegmentIndex",
    "count_used_entries",
    "index_search",
    "index_search_many",
    "read_key",
]

NOT_FOUND: Final = -1  # kernel code: no entry has a key <= target (or the index is empty)

# Write-faulting the pages of a sparse mapped file one at a time, as appends reach them, costs a block
# reservation and an inode update each, and on a busy ext4 journal each can stall the writer.  The
# writer pre-faults pages ahead in chunks instead (MADV_POPULATE_WRITE, Linux >= 5.14; data is not touched),
# so an append only ever writes to a page that is already mapped writable.  A chunk is as large as what the
# file already holds, from one page to _POPULATE_BYTES: a new or quiet segment's index holds (and unmaps on
# roll or close) a page or two, not 256 KiB, and a busy one still faults once per 256 KiB.
_MADV_POPULATE_WRITE: Final = getattr(mmap, "MADV_POPULATE_WRITE", 23)
_POPULATE_BYTES: Final = 256 * 1024
_populate_supported = [True]
_ALLOCATE_MAX_BYTES: Final = 256 * 1024  # an active index file grows by at most this much at a time


@numba.njit(cache=True)
def read_key(buf: np.ndarray, at: int, size: int) -> int:
    """Signed big-endian integer of ``size`` bytes (4 or 8) at ``buf[at]``."""
    value = int(buf[at])
    if value >= 128:
        value -= 256
    for k in range(1, size):
        value = value * 256 + int(buf[at + k])
    return value


@numba.njit(cache=True)
def index_search(
    buf: np.ndarray, n_entries: int, entry_size: int, key_at: int, key_size: int, target: int
) -> int:
    """Slot of the last of the first ``n_entries`` entries whose key is <= ``target``, or NOT_FOUND."""
    lo = 0
    hi = n_entries - 1
    found = NOT_FOUND
    while lo <= hi:
        mid = (lo + hi) >> 1
        if read_key(buf, mid * entry_size + key_at, key_size) <= target:
            found = mid
            lo = mid + 1
        else:
            hi = mid - 1
    return found


@numba.njit(cache=True)
def index_search_many(
    buf: np.ndarray,
    n_entries: int,
    entry_size: int,
    key_at: int,
    key_size: int,
    targets: np.ndarray,
    out_slots: np.ndarray,
) -> int:
    """:func:`index_search` for every target; slots go to ``out_slots``.  Returns the number done."""
    n = min(targets.shape[0], out_slots.shape[0])
    for i in range(n):
        out_slots[i] = index_search(buf, n_entries, entry_size, key_at, key_size, targets[i])
    return n


@numba.njit(cache=True)
def count_used_entries(buf: np.ndarray, max_entries: int, entry_size: int) -> int:
    """Number of leading entries that are not all-zero (used entries come first, the zero tail last)."""
    lo = 0
    hi = max_entries
    while lo < hi:
        mid = (lo + hi) >> 1
        at = mid * entry_size
        zero = True
        for k in range(entry_size):
            if buf[at + k] != 0:
                zero = False
                break
        if zero:
            hi = mid
        else:
            lo = mid + 1
    return lo


class IndexFile:
    """One ``.index`` or ``.timeindex`` file: its mapping, used-entry count and lifecycle.

    The log's single writer knows ``entries`` exactly (the active segment's file is mapped read-write,
    closed ones read-only); it changes only through this class's methods and the active segment's hot path
    (:meth:`prefaulted_entries_left`).  A reader's view (:meth:`open_view`) has ``entries == -1`` and
    :meth:`used_entries` re-counts on demand.
    """

    __slots__ = ("_array", "_entry_bytes", "_pack", "_populated", "entries", "entry", "max_entries", "mm",
                 "path", "writable")

    def __init__(self, path: str, entry: struct.Struct, *, writable: bool) -> None:
        self.path = path
        self.entry = entry
        self._entry_bytes = entry.size
        self._pack = entry.pack_into
        self.writable = writable
        self.entries = 0
        self.max_entries = 0
        self.mm: mmap.mmap | None = None  # the mapping (None while the file is empty)
        self._array: np.ndarray = np.zeros(0, dtype=np.uint8)
        self._populated = 0  # bytes from the start of the mapping pre-faulted for writing

    # --- opening -----------------------------------------------------------------------------------------
    @classmethod
    def open_active(cls, path: str, entry: struct.Struct, *, max_bytes: int, entries: int) -> IndexFile:
        """Map ``path`` read-write with ``entries`` already used and room for ``max_bytes`` in all; the file
        is allocated for the used entries and one chunk more (:meth:`reserve_entries`), or, where the file
        system has no room, mapped as it is."""
        index = cls(path, entry, writable=True)
        index.max_entries = max(max_bytes // entry.size, entries)
        used = entries * entry.size
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            st = os.fstat(fd)
            current = st.st_size
            if current > index.max_entries * entry.size or st.st_blocks * 512 < current:
                # Larger than it may grow, or sparse (a crash's leftover, an older version's 10 MiB): keep
                # the used entries in a new, fully allocated file; a reader mapping the old one keeps it.
                data = os.pread(fd, used, 0)
                os.close(fd)
                fd = -1
                write_atomically(path, data, durable=False)
                fd = os.open(path, os.O_RDWR)
                current = len(data)
            index._map(fd, current, writable=True)
        finally:
            if fd >= 0:
                os.close(fd)
        index.entries = entries
        stale_end = index.mapped_bytes // entry.size
        if stale_end > entries:
            index._zero_from(entries, stale_end)  # old entries past the used ones (never on a fresh file)
        try:
            index.reserve_entries(entries + 1)
        except OSError as exc:
            if not is_disk_full(exc):
                raise
        index._populate(used)
        return index

    @classmethod
    def open_closed(cls, path: str, entry: struct.Struct) -> IndexFile:
        """Map a trimmed file read-only; every entry in it is used (sanity-check it before trusting)."""
        index = cls(path, entry, writable=False)
        fd = os.open(path, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            index._map(fd, size, writable=False)
        finally:
            os.close(fd)
        index.max_entries = size // entry.size
        index.entries = index.max_entries
        return index

    @classmethod
    def open_view(cls, path: str, entry: struct.Struct) -> IndexFile:
        """A reader's read-only map of a file the writer may still append to; count with used_entries()."""
        index = cls.open_closed(path, entry)
        index.entries = -1
        return index

    @classmethod
    def write_closed(cls, path: str, entry: struct.Struct, data: bytes) -> IndexFile:
        """Replace ``path`` by exactly ``data`` (a rebuilt, trimmed index) and map it."""
        write_atomically(path, data, durable=False)
        return cls.open_closed(path, entry)

    def _map(self, fd: int, size: int, *, writable: bool) -> None:
        if size == 0:
            self.mm = None
            self._array = np.zeros(0, dtype=np.uint8)
            return
        access = mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ
        self.mm = mmap.mmap(fd, size, access=access)
        self._array = np.frombuffer(self.mm, dtype=np.uint8)

    # --- reading -----------------------------------------------------------------------------------------
    @property
    def array(self) -> np.ndarray:
        """The mapped bytes as uint8 (what the kernels search)."""
        return self._array

    @property
    def mapped_bytes(self) -> int:
        return int(self._array.shape[0])

    def used_entries(self) -> int:
        """Exact for the writer; for a reader's view, the count of leading non-zero entries right now."""
        if self.entries >= 0:
            return self.entries
        return int(count_used_entries(self._array, self.max_entries, self.entry.size))

    def entry_at(self, slot: int) -> tuple[int, ...]:
        return self.entry.unpack_from(self._array.data, slot * self.entry.size)

    def used_bytes(self) -> bytes:
        return self._array[: self.used_entries() * self.entry.size].tobytes()

    def is_full(self, reserve: int = 0) -> bool:
        return self.entries + reserve >= self.max_entries

    # --- writing (the single writer only) ----------------------------------------------------------------
    def append(self, first: int, second: int) -> None:
        """Write one two-field entry after the used ones (the caller checked ``is_full``)."""
        at = self.entries * self._entry_bytes
        if at + self._entry_bytes > self._populated:
            if at + self._entry_bytes > self.mapped_bytes:
                self.reserve_entries(self.entries + 1)
            self._populate(at)
        self._pack(self.mm, at, first, second)  # type: ignore[arg-type]
        self.entries += 1

    def append_prefaulted(self, first: int, second: int) -> None:
        """:meth:`append` for the hot path, within :meth:`prefaulted_entries_left` (the caller counts them
        down): no page is faulted in and nothing is checked."""
        self._pack(self.mm, self.entries * self._entry_bytes, first, second)  # type: ignore[arg-type]
        self.entries += 1

    def prefaulted_entries_left(self) -> int:
        """How many more entries fit in the pages already faulted in for writing (0 if not writable): that
        many can be added by :meth:`append_prefaulted` with no page faulted in (the active segment's
        one-batch append, ``LogSegment.append_batch``, keeps the count)."""
        if not self.writable or self.mm is None:
            return 0
        return min(self.max_entries, self._populated // self.entry.size) - self.entries

    def _populate(self, start: int) -> None:
        """Pre-fault the pages from ``start`` for writing, as many bytes as ``start`` (one page at least,
        ``_POPULATE_BYTES`` at most; see above)."""
        end = min(self.mapped_bytes, start + min(max(start, mmap.PAGESIZE), _POPULATE_BYTES))
        begin = start - start % mmap.PAGESIZE
        if self.mm is None or not self.writable or end <= begin:
            return
        if _populate_supported[0]:
            try:
                self.mm.madvise(_MADV_POPULATE_WRITE, begin, end - begin)
            except OSError:  # an older kernel: fault page by page instead
                _populate_supported[0] = False
        self._populated = end

    def reserve_entries(self, entries: int) -> None:
        """Make the file hold room for ``entries`` entries (at most :attr:`max_entries`), allocated for
        real: grown with ``posix_fallocate`` to that, or by as much as it holds if that is more (one
        page at least, :data:`_ALLOCATE_MAX_BYTES` at most), and mapped again at its new size.  Raises
        the ``OSError`` (``ENOSPC``, ``EDQUOT``) with the file and its mapping as they were."""
        size = self.entry.size
        needed = min(entries, self.max_entries) * size
        current = self.mapped_bytes
        if needed <= current or not self.writable:
            return
        chunk = min(max(current, mmap.PAGESIZE), _ALLOCATE_MAX_BYTES)
        target = max(needed, current + chunk)
        target += -target % mmap.PAGESIZE  # whole pages: the last page is allocated anyway
        target = min(target - target % size, self.max_entries * size)
        fd = os.open(self.path, os.O_RDWR)
        try:
            try:
                if DISK_FAULTS.armed:
                    DISK_FAULTS.check("index.allocate", self.path)
                os.posix_fallocate(fd, current, target - current)
            except OSError:
                if os.fstat(fd).st_size != current:  # a partial allocation may have moved the end
                    os.ftruncate(fd, current)
                raise
            self.close()
            self._map(fd, target, writable=True)
        finally:
            os.close(fd)
        self._populated = 0  # a new mapping: its pages are faulted in again from the next entry on
        self._populate(self.entries * size)

    def append_encoded(self, data: bytes, *, reserve: int) -> None:
        """Append already-encoded entries in bulk (a rebuild), as many as fit leaving ``reserve`` slots."""
        count = min(len(data) // self.entry.size, self.max_entries - reserve - self.entries)
        if count <= 0:
            return
        at = self.entries * self.entry.size
        self.reserve_entries(self.entries + count)
        if at + count * self.entry.size > self._populated:  # as append: fault ahead once per chunk
            self._populate(at)
        self._array[at : at + count * self.entry.size] = np.frombuffer(data, dtype=np.uint8,
                                                                       count=count * self.entry.size)
        self.entries += count

    def truncate_entries(self, entries: int) -> None:
        """Keep the first ``entries``; the dropped ones are zeroed in place (the file keeps its size).

        Only the active, read-write mapped file is truncated (a closed segment is reopened active first).
        """
        if entries >= self.entries:
            return
        assert self.writable, self.path
        self._zero_from(entries, self.entries)
        self.entries = entries

    def _zero_from(self, start: int, stop: int | None = None) -> None:
        end = self.max_entries if stop is None else stop
        if self.mm is not None and end > start:
            self._array[start * self.entry.size : end * self.entry.size] = 0

    def trim(self) -> None:
        """Shrink the file to its used entries (new file renamed over the old) and map it read-only."""
        data = self.used_bytes()
        if DISK_FAULTS.armed:
            DISK_FAULTS.check("index.trim", self.path)
        write_atomically(self.path, data, durable=False)  # raises with the old file and mapping in place
        self.close()
        fd = os.open(self.path, os.O_RDONLY)
        try:
            self._map(fd, len(data), writable=False)
        finally:
            os.close(fd)
        self.max_entries = self.entries = len(data) // self.entry.size
        self.writable = False

    def flush(self) -> None:
        if self.mm is not None and self.writable:
            self.mm.flush()

    def close(self) -> None:
        self._array = np.zeros(0, dtype=np.uint8)  # drop the exported buffer before closing the map
        if self.mm is not None:
            self.mm.close()
            self.mm = None

    def delete(self) -> None:
        self.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


class SegmentIndex:
    """What a segment's offset index and time index share: one :class:`IndexFile` of ``ENTRY``-sized
    entries, the segment's base offset, and how they are opened, counted and closed.  The subclasses hold
    what differs: the entry's meaning, lookups and sanity rules."""

    __slots__ = ("base_offset", "file")
    ENTRY: ClassVar[struct.Struct]

    def __init__(self, file: IndexFile, base_offset: int) -> None:
        self.file = file
        self.base_offset = base_offset

    @classmethod
    def open_active(cls, path: str, base_offset: int, *, max_bytes: int, entries: int = 0) -> Self:
        """The active segment's index, mapped read-write at ``max_bytes`` (the writer's)."""
        return cls(IndexFile.open_active(path, cls.ENTRY, max_bytes=max_bytes, entries=entries), base_offset)

    @classmethod
    def open_closed(cls, path: str, base_offset: int) -> Self:
        """A closed segment's index, mapped read-only (the writer's)."""
        return cls(IndexFile.open_closed(path, cls.ENTRY), base_offset)

    @classmethod
    def open_view(cls, path: str, base_offset: int) -> Self:
        """A reader's view of any segment's index (entries counted on demand)."""
        return cls(IndexFile.open_view(path, cls.ENTRY), base_offset)

    @classmethod
    def _write_closed(cls, path: str, base_offset: int, encoded: bytes) -> Self:
        return cls(IndexFile.write_closed(path, cls.ENTRY, encoded), base_offset)

    @property
    def entries(self) -> int:
        return self.file.used_entries()

    def flush(self) -> None:
        self.file.flush()

    def trim(self) -> None:
        self.file.trim()

    def close(self) -> None:
        self.file.close()

    def delete(self) -> None:
        self.file.delete()
