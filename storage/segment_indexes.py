"""A segment's two indexes, ``.index`` and ``.timeindex``, opened together for each of the segment's roles:
the active segment's (mapped read-write, preallocated), a closed segment's (trimmed, checked before they are
trusted), a reader's view (mapped read-only as they are now) and a rebuild's (written from a scan of the
``.log`` file).  The indexes are disposable: any doubt about them is answered by rebuilding them.
"""

from __future__ import annotations

import contextlib
import os
from typing import NamedTuple

import numpy as np

from storage.batch_scan import SegmentScan
from storage.index_file import IndexFile
from storage.offset_index import OFFSET_INDEX_ENTRY, OffsetIndex
from storage.segment_file import BatchHeaders
from storage.time_index import NO_TIMESTAMP, TIME_INDEX_ENTRY, TimeIndex

__all__ = ["IndexPaths", "SegmentIndexes"]


class SegmentIndexes(NamedTuple):
    offset_index: OffsetIndex
    time_index: TimeIndex


class IndexPaths(NamedTuple):
    """Where a segment's indexes are, and the segment's base offset (their entries are relative to it)."""

    index_path: str
    time_index_path: str
    base_offset: int

    def unmapped(self) -> SegmentIndexes:
        """Empty stand-ins, mapping nothing (before a segment opens its files, or when a view finds none)."""
        return SegmentIndexes(OffsetIndex(IndexFile(self.index_path, OFFSET_INDEX_ENTRY, writable=False),
                                          self.base_offset),
                              TimeIndex(IndexFile(self.time_index_path, TIME_INDEX_ENTRY, writable=False),
                                        self.base_offset))

    def open_active(self, max_bytes: int, index_entries: int, time_entries: int) -> SegmentIndexes:
        """Both mapped read-write and grown to ``max_bytes`` (``segment.index.bytes``), with that many
        entries already used."""
        return SegmentIndexes(
            OffsetIndex.open_active(self.index_path, self.base_offset, max_bytes=max_bytes,
                                    entries=index_entries),
            TimeIndex.open_active(self.time_index_path, self.base_offset, max_bytes=max_bytes,
                                  entries=time_entries))

    def open_view(self) -> SegmentIndexes:
        """Both mapped read-only as they are now (a reader's view); stand-ins when they are gone."""
        try:
            return SegmentIndexes(OffsetIndex.open_view(self.index_path, self.base_offset),
                                  TimeIndex.open_view(self.time_index_path, self.base_offset))
        except (FileNotFoundError, ValueError):
            return self.unmapped()

    def open_checked(self, headers: BatchHeaders, next_offset_limit: int | None) -> SegmentIndexes | str:
        """A closed segment's trimmed indexes, or what is wrong with them: a file missing or of a size no
        whole number of entries fills, an entry out of order or out of range (the log ends at
        ``headers.end``; the next segment starts at ``next_offset_limit``), or a last offset-index entry
        that does not point at the batch it names."""
        for path, entry in ((self.index_path, OFFSET_INDEX_ENTRY), (self.time_index_path, TIME_INDEX_ENTRY)):
            try:
                size = os.stat(path).st_size
            except FileNotFoundError:
                return f"{os.path.basename(path)} is missing"
            if size % entry.size:
                return f"{os.path.basename(path)}: size {size} bytes is not a multiple of {entry.size}"
        indexes = SegmentIndexes(OffsetIndex.open_closed(self.index_path, self.base_offset),
                                 TimeIndex.open_closed(self.time_index_path, self.base_offset))
        problem = indexes.offset_index.sanity_problem(log_size_bytes=headers.end,
                                                      next_offset_limit=next_offset_limit)
        if problem is None:
            problem = indexes.time_index.sanity_problem(next_offset_limit=next_offset_limit)
            problem = None if problem is None else f"{os.path.basename(self.time_index_path)}: {problem}"
        else:
            problem = f"{os.path.basename(self.index_path)}: {problem}"
        if problem is None:
            last = indexes.offset_index.last_entry()
            if last is not None:
                header = headers.at(last.position)
                if header is None or header.last_offset != last.offset:
                    problem = (f"{os.path.basename(self.index_path)}: last entry {tuple(last)} does not "
                               "match the batch at its position")
        if problem is None:
            return indexes
        indexes.offset_index.close()
        indexes.time_index.close()
        return problem

    def write_rebuilt(self, scan: SegmentScan, *, closed: bool, max_bytes: int) -> SegmentIndexes:
        """Both rebuilt from ``scan`` (the entries the index rule gives for the valid batches): trimmed,
        with the final time entry, for a closed segment; as new active files otherwise (new inodes: a
        reader keeps mapping the old ones safely)."""
        if closed:
            timestamps, relative = scan.time_timestamps, scan.time_relative_offsets
            if scan.max_timestamp > (int(timestamps[-1]) if len(timestamps) else NO_TIMESTAMP):
                timestamps = np.append(timestamps, scan.max_timestamp)
                relative = np.append(relative, scan.offset_of_max_timestamp - self.base_offset)
            return SegmentIndexes(
                OffsetIndex.write_closed(self.index_path, self.base_offset, scan.index_relative_offsets,
                                         scan.index_positions),
                TimeIndex.write_closed(self.time_index_path, self.base_offset, timestamps, relative))
        self.unlink()
        indexes = self.open_active(max_bytes, 0, 0)
        indexes.offset_index.append_many(scan.index_relative_offsets, scan.index_positions)
        indexes.time_index.append_many(scan.time_timestamps, scan.time_relative_offsets)
        return indexes

    def unlink(self) -> None:
        """Remove both files (those that exist)."""
        for path in (self.index_path, self.time_index_path):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    def fsync(self) -> None:
        """``fsync`` both files (those that exist)."""
        for path in (self.index_path, self.time_index_path):
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                continue
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
