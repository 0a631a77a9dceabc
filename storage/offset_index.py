"""The sparse offset index of one segment: ``<base offset>.index``, as Kafka lays it out.

Entry layout (8 bytes, big-endian)::

     0                   1                   2                   3
     0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
    +---------------------------------------------------------------+
    |            relativeOffset (int32)     @0                      |  lastOffset - segment base offset
    +---------------------------------------------------------------+
    |            position (int32)           @4                      |  byte position of that batch
    +---------------------------------------------------------------+

An entry ``(r, p)`` says: the batch starting at byte ``p`` of the ``.log`` file has last offset
``base + r``.  Entries are written every ``index.interval.bytes`` of appended log (never for the batch at
position 0), so both fields strictly increase and every position is > 0.  Offsets are stored relative to
the segment's base offset in 4 bytes, which is why a segment rolls before a relative offset would overflow
an int32.

:meth:`OffsetIndex.lookup` answers "where do I start scanning for offset ``o``": the last entry whose offset
is <= ``o`` (the batch there ends at or before ``o``, so the batch holding ``o`` is at or after it), else
position 0.  :meth:`OffsetIndex.lookup_position` answers the same question by byte position.
"""

from __future__ import annotations

import struct
from typing import Final, NamedTuple

import numpy as np

from storage.index_file import NOT_FOUND, SegmentIndex, index_search, index_search_many

__all__ = ["OFFSET_INDEX_DTYPE", "OFFSET_INDEX_ENTRY", "IndexEntry", "OffsetIndex"]

OFFSET_INDEX_ENTRY: Final = struct.Struct(">ii")
OFFSET_INDEX_DTYPE: Final = np.dtype([("relative_offset", ">i4"), ("position", ">i4")])
_RELATIVE_OFFSET_AT: Final = OFFSET_INDEX_DTYPE.fields["relative_offset"][1]  # type: ignore[index]
_POSITION_AT: Final = OFFSET_INDEX_DTYPE.fields["position"][1]  # type: ignore[index]
_FIELD_SIZE: Final = 4
assert OFFSET_INDEX_ENTRY.size == OFFSET_INDEX_DTYPE.itemsize == 8
assert (_RELATIVE_OFFSET_AT, _POSITION_AT) == (0, 4)


class IndexEntry(NamedTuple):
    offset: int  # absolute offset (the last offset of the batch at ``position``)
    position: int


class OffsetIndex(SegmentIndex):
    """One segment's ``.index``: append (writer), lookup by offset or position, sanity check."""

    __slots__ = ()
    ENTRY = OFFSET_INDEX_ENTRY

    @classmethod
    def write_closed(cls, path: str, base_offset: int, relative_offsets: np.ndarray,
                     positions: np.ndarray) -> OffsetIndex:
        return cls._write_closed(path, base_offset, encode(relative_offsets, positions))

    def is_full(self) -> bool:
        return self.file.is_full()

    def append(self, offset: int, position: int) -> None:
        """Add ``(offset, position)``: the batch at ``position`` ends with ``offset``.  Writer only."""
        self.file.append(offset - self.base_offset, position)

    def entry(self, slot: int) -> IndexEntry:
        relative, position = self.file.entry_at(slot)
        return IndexEntry(self.base_offset + relative, position)

    def last_entry(self) -> IndexEntry | None:
        n = self.entries
        return self.entry(n - 1) if n > 0 else None

    def append_many(self, relative_offsets: np.ndarray, positions: np.ndarray) -> None:
        """Bulk-append rebuilt entries (as many as fit).  Writer only."""
        self.file.append_encoded(encode(relative_offsets, positions), reserve=0)

    def lookup_slot(self, offset: int) -> int:
        """Slot of the last entry whose offset is <= ``offset``, or NOT_FOUND."""
        return int(index_search(self.file.array, self.entries, OFFSET_INDEX_ENTRY.size, _RELATIVE_OFFSET_AT,
                                _FIELD_SIZE, offset - self.base_offset))

    def lookup(self, offset: int) -> IndexEntry | None:
        """The last entry whose offset is <= ``offset`` (start scanning there), or None (scan from 0)."""
        slot = self.lookup_slot(offset)
        return None if slot == NOT_FOUND else self.entry(slot)

    def lookup_position(self, position: int) -> IndexEntry | None:
        """The last entry whose position is <= ``position``, or None."""
        slot = int(index_search(self.file.array, self.entries, OFFSET_INDEX_ENTRY.size, _POSITION_AT,
                                _FIELD_SIZE, position))
        return None if slot == NOT_FOUND else self.entry(slot)

    def lookup_many(self, offsets: np.ndarray) -> np.ndarray:
        """Slots (NOT_FOUND = -1) of the last entry <= each of ``offsets`` (int64), in one numba call."""
        targets = np.asarray(offsets, dtype=np.int64) - self.base_offset
        slots = np.empty(targets.shape[0], dtype=np.int64)
        index_search_many(self.file.array, self.entries, OFFSET_INDEX_ENTRY.size, _RELATIVE_OFFSET_AT,
                          _FIELD_SIZE, targets, slots)
        return slots

    def truncate_to(self, offset: int) -> None:
        """Drop entries whose offset is >= ``offset`` (their batches were truncated away)."""
        slot = self.lookup_slot(offset - 1)
        self.file.truncate_entries(slot + 1)

    def sanity_problem(self, *, log_size_bytes: int, next_offset_limit: int | None) -> str | None:
        """Why this index cannot be trusted, or None.  Checks Kafka's rules and ours:

        (1) whole entries only, (2) relative offsets strictly increase and are >= 0, (3) positions strictly
        increase, are > 0 and inside the log file, (4) offsets stay below ``next_offset_limit``.
        """
        size = self.file.mapped_bytes
        if self.file.entries >= 0 and not self.file.writable and size % OFFSET_INDEX_ENTRY.size:
            return f"size {size} bytes is not a multiple of {OFFSET_INDEX_ENTRY.size}"
        n = self.entries
        entries = np.frombuffer(self.file.array, dtype=OFFSET_INDEX_DTYPE, count=n)
        relative = entries["relative_offset"].astype(np.int64)
        positions = entries["position"].astype(np.int64)
        if n == 0:
            return None
        if relative[0] < 0 or np.any(np.diff(relative) <= 0):
            return "relative offsets do not strictly increase from >= 0"
        if positions[0] <= 0 or np.any(np.diff(positions) <= 0):
            return "positions do not strictly increase from > 0"
        if positions[-1] >= log_size_bytes:
            return f"last position {int(positions[-1])} is not inside the {log_size_bytes}-byte log file"
        if next_offset_limit is not None and self.base_offset + int(relative[-1]) >= next_offset_limit:
            return f"last offset {self.base_offset + int(relative[-1])} is not below {next_offset_limit}"
        return None


def encode(relative_offsets: np.ndarray, positions: np.ndarray) -> bytes:
    """Entries as the file holds them."""
    out = np.empty(len(relative_offsets), dtype=OFFSET_INDEX_DTYPE)
    out["relative_offset"] = relative_offsets
    out["position"] = positions
    return out.tobytes()
