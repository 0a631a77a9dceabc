"""The clean-shutdown marker: ``.clean-shutdown``, left by a clean close, with what start-up checks.

A clean close (``Log.close(clean=True)``) fsyncs every segment and index, then writes the marker
atomically.  It records the active segment as the close left it, one JSON object::

    {"version": 1,
     "active_segment": 1048576,      base offset of the last segment
     "size_bytes": 869,              its .log file's size
     "last_batch": [536, 1048590, 1048599]}   position, base and last offset of its last batch (null: empty)

The next open (``storage.log_loader``) trusts the close, and scans nothing (``storage.recovery`` rule 1),
only if the directory still matches: the last ``.log`` file is that segment, has that size, and the batch
header at that position names those offsets and ends at the end of the file.  One ``stat`` and one
``pread``.  Anything else (bytes appended after the stop, a tail cut, a segment added or removed, a marker
that does not parse) means the files changed after the close: :meth:`CleanStop.check` says what, and the
log is opened as after a crash.  An empty marker (written by an older version) records nothing and is
trusted as it was then; closed segments are checked when they load either way (rule 2's fallback).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from storage.atomic_file import write_atomically
from storage.segment import LOG_SUFFIX, LogSegment, segment_path
from storage.segment_file import BatchHeaders

__all__ = ["CleanStop", "read_clean_stop", "write_clean_stop"]

_VERSION: Final = 1


@dataclass(frozen=True, slots=True)
class CleanStop:
    """What a clean close recorded of the active segment; ``active_segment`` -1: nothing recorded."""

    active_segment: int
    size_bytes: int
    last_batch: tuple[int, int, int] | None  # position, base offset, last offset

    @classmethod
    def of(cls, segment: LogSegment) -> CleanStop:
        """The record of a sealed active segment (its last batch found through its index)."""
        last = None
        if segment.next_offset > segment.base_offset:
            found = segment.find_batch(segment.next_offset - 1, verify=False)
            if found is not None:
                position, header = found
                last = (position, header.base_offset, header.last_offset)
        return cls(segment.base_offset, segment.size_bytes, last)

    def encode(self) -> bytes:
        return json.dumps({"version": _VERSION, "active_segment": self.active_segment,
                           "size_bytes": self.size_bytes,
                           "last_batch": None if self.last_batch is None else list(self.last_batch)}).encode()

    def check(self, directory: str, base_offsets: Sequence[int]) -> str | None:
        """What differs between the directory and this record, or None if it matches."""
        if self.active_segment < 0:
            return None
        last = base_offsets[-1] if base_offsets else None
        if last != self.active_segment:
            return f"the last segment is {last}, the clean stop recorded {self.active_segment}"
        path = segment_path(directory, last, LOG_SUFFIX)
        fd = os.open(path, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            if size != self.size_bytes:
                return f"{path} has {size} bytes, the clean stop recorded {self.size_bytes}"
            if self.last_batch is None:
                return None
            position, base, last_offset = self.last_batch
            header = BatchHeaders(fd, size).at(position)
        finally:
            os.close(fd)
        if header is None or (header.base_offset, header.last_offset) != (base, last_offset) \
                or position + header.size != size:
            return (f"{path}: the last batch is not the one the clean stop recorded (offsets {base}.."
                    f"{last_offset} at position {position})")
        return None


def write_clean_stop(path: str, record: CleanStop) -> None:
    """Write the marker atomically (fsynced)."""
    write_atomically(path, record.encode())


def read_clean_stop(path: str) -> CleanStop | str | None:
    """The marker's record; None when there is no marker; a string saying why when it does not parse."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    if not data.strip():
        return CleanStop(-1, 0, None)
    try:
        raw = json.loads(data)
        batch = raw["last_batch"]
        return CleanStop(int(raw["active_segment"]), int(raw["size_bytes"]),
                         None if batch is None else (int(batch[0]), int(batch[1]), int(batch[2])))
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        return f"{path} does not parse ({exc!r})"
