"""The sparse time index of one segment: ``<base offset>.timeindex``, as Kafka lays it out.

Entry layout (12 bytes, big-endian)::

     0                   1                   2                   3
     0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
    +---------------------------------------------------------------+
    |            timestamp (int64, ms)      @0                      |  the segment's max timestamp so far
    |                                                               |
    +---------------------------------------------------------------+
    |            relativeOffset (int32)     @8                      |  where that max was first reached
    +---------------------------------------------------------------+

An entry ``(t, r)`` says: the largest batch max-timestamp among the batches up to offset ``base + r`` is
``t``, and it was first reached by the batch whose last offset is ``base + r``; every batch before that one
has a smaller max timestamp.  Entries are considered at every offset-index entry (each
``index.interval.bytes``) and added only when the max timestamp grew, so timestamps strictly increase.  When
the segment is rolled or closed one last entry is added (a slot is reserved for it), so the last entry of a
closed segment holds its largest timestamp.

:meth:`TimeIndex.lookup` returns the last entry with timestamp <= ``t``: every batch before its offset has a
smaller timestamp than ``t``, so the first batch whose max timestamp is >= ``t`` is at or after it.
"""

from __future__ import annotations

import struct
from typing import Final, NamedTuple

import numpy as np

from storage.index_file import NOT_FOUND, IndexFile, SegmentIndex, index_search

__all__ = ["NO_TIMESTAMP", "TIME_INDEX_DTYPE", "TIME_INDEX_ENTRY", "TimeIndex", "TimestampOffset"]

NO_TIMESTAMP: Final = -1
TIME_INDEX_ENTRY: Final = struct.Struct(">qi")
TIME_INDEX_DTYPE: Final = np.dtype([("timestamp", ">i8"), ("relative_offset", ">i4")])
_TIMESTAMP_AT: Final = TIME_INDEX_DTYPE.fields["timestamp"][1]  # type: ignore[index]
_RELATIVE_OFFSET_AT: Final = TIME_INDEX_DTYPE.fields["relative_offset"][1]  # type: ignore[index]
_TIMESTAMP_SIZE: Final = 8
assert TIME_INDEX_ENTRY.size == TIME_INDEX_DTYPE.itemsize == 12
assert (_TIMESTAMP_AT, _RELATIVE_OFFSET_AT) == (0, 8)


class TimestampOffset(NamedTuple):
    timestamp: int  # ms
    offset: int  # absolute


class TimeIndex(SegmentIndex):
    """One segment's ``.timeindex``: maybe_append (writer), lookup by timestamp, sanity check."""

    __slots__ = ("last_timestamp",)
    ENTRY = TIME_INDEX_ENTRY

    def __init__(self, file: IndexFile, base_offset: int) -> None:
        super().__init__(file, base_offset)
        self.last_timestamp = NO_TIMESTAMP  # of the last entry; maintained by the writer
        if file.entries > 0:
            self.last_timestamp = file.entry_at(file.entries - 1)[0]

    @classmethod
    def write_closed(cls, path: str, base_offset: int, timestamps: np.ndarray,
                     relative_offsets: np.ndarray) -> TimeIndex:
        return cls._write_closed(path, base_offset, encode(timestamps, relative_offsets))

    def is_full(self) -> bool:
        """Full when only the slot reserved for the entry written at roll/close is left."""
        return self.file.is_full(reserve=1)

    def entry(self, slot: int) -> TimestampOffset:
        timestamp, relative = self.file.entry_at(slot)
        return TimestampOffset(timestamp, self.base_offset + relative)

    def last_entry(self) -> TimestampOffset | None:
        n = self.entries
        return self.entry(n - 1) if n > 0 else None

    def maybe_append(self, timestamp: int, offset: int, *, final: bool = False) -> bool:
        """Add ``(timestamp, offset)`` if ``timestamp`` is larger than the last entry's.  Writer only.

        ``final`` (roll/close) may use the reserved last slot.  Returns whether an entry was added.
        """
        file = self.file
        if timestamp <= self.last_timestamp or file.entries + (0 if final else 1) >= file.max_entries:
            return False
        file.append(timestamp, offset - self.base_offset)
        self.last_timestamp = timestamp
        return True

    def append_many(self, timestamps: np.ndarray, relative_offsets: np.ndarray) -> None:
        """Bulk-append rebuilt entries (as many as fit, keeping the reserved slot).  Writer only."""
        self.file.append_encoded(encode(timestamps, relative_offsets), reserve=1)
        n = self.file.entries
        self.last_timestamp = self.file.entry_at(n - 1)[0] if n > 0 else NO_TIMESTAMP

    def lookup(self, timestamp: int) -> TimestampOffset | None:
        """The last entry whose timestamp is <= ``timestamp``, or None (scan from the segment's start)."""
        slot = int(index_search(self.file.array, self.entries, TIME_INDEX_ENTRY.size, _TIMESTAMP_AT,
                                _TIMESTAMP_SIZE, timestamp))
        return None if slot == NOT_FOUND else self.entry(slot)

    def truncate_to(self, offset: int) -> None:
        """Drop entries whose offset is >= ``offset``."""
        n = self.file.entries
        keep = n
        while keep > 0 and self.entry(keep - 1).offset >= offset:
            keep -= 1
        self.file.truncate_entries(keep)
        self.last_timestamp = self.entry(keep - 1).timestamp if keep > 0 else NO_TIMESTAMP

    def sanity_problem(self, *, next_offset_limit: int | None) -> str | None:
        """Why this index cannot be trusted, or None: (1) whole entries only, (2) timestamps strictly
        increase, (3) offsets never decrease, are >= base and stay below ``next_offset_limit``."""
        size = self.file.mapped_bytes
        if self.file.entries >= 0 and not self.file.writable and size % TIME_INDEX_ENTRY.size:
            return f"size {size} bytes is not a multiple of {TIME_INDEX_ENTRY.size}"
        n = self.entries
        if n == 0:
            return None
        entries = np.frombuffer(self.file.array, dtype=TIME_INDEX_DTYPE, count=n)
        timestamps = entries["timestamp"].astype(np.int64)
        relative = entries["relative_offset"].astype(np.int64)
        if np.any(np.diff(timestamps) <= 0) or timestamps[0] < 0:
            return "timestamps do not strictly increase from >= 0"
        if relative[0] < 0 or np.any(np.diff(relative) < 0):
            return "relative offsets decrease or are negative"
        if next_offset_limit is not None and self.base_offset + int(relative[-1]) >= next_offset_limit:
            return f"last offset {self.base_offset + int(relative[-1])} is not below {next_offset_limit}"
        return None


def encode(timestamps: np.ndarray, relative_offsets: np.ndarray) -> bytes:
    """Entries as the file holds them."""
    out = np.empty(len(timestamps), dtype=TIME_INDEX_DTYPE)
    out["timestamp"] = timestamps
    out["relative_offset"] = relative_offsets
    return out.tobytes()
