"""A segment's ``.log`` file as a run of record batches: writing batches to it, walking its batch headers,
and the slices of it that fetches send.

Theory of operation
-------------------
**Writing.**  The log's single writer appends to the file opened ``O_APPEND``: one ``os.write`` of one buffer,
or one ``os.writev`` of the batches' own buffers (ring memory: no copy), at most :data:`IOV_MAX` buffers per
call (:func:`write_fully`).  A regular file writes short only on trouble (a full disk, a signal); the rest is
then written piece by piece (:func:`write_rest`), and a real error raises.

**Walking.**  Nobody maps a ``.log`` file: a file the writer truncates under a mapping reader would kill it
with SIGBUS, where ``pread`` just returns fewer bytes.  :class:`BatchHeaders` reads the headers with
``pread``, a chunk at a time while batches are small, one header at a time once they are large, and stops
at the first position that does not hold a whole, plausible batch (magic 2, a length that fits, a
non-negative last offset delta) ending by ``end``.  Its walks start where an index entry (or position 0)
puts them and go forward; which entry to trust is the segment's business (``storage.segment``).

**Sending.**  A :class:`FetchSlice` names a byte range of whole batches in an open file, for ``sendfile``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Final, TypeAlias

from storage.batch_header import (
    BATCH_HEADER,
    BATCH_LENGTH_OFFSET,
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAGIC,
    BatchHeader,
)
from storage.errors import CorruptRecordError

__all__ = [
    "IOV_MAX",
    "BatchBuffer",
    "BatchHeaders",
    "FetchSlice",
    "split_batches",
    "write_fully",
    "write_rest",
]

IOV_MAX: Final = os.sysconf("SC_IOV_MAX") if "SC_IOV_MAX" in os.sysconf_names else 1024  # buffers per writev
BatchBuffer: TypeAlias = "memoryview | bytes | bytearray"  # 1-D bytes (format "B"): len() counts bytes
_CHUNK_BYTES: Final = 16 * 1024  # pread size when walking small batches


def write_fully(fd: int, parts: Sequence[BatchBuffer], size_bytes: int) -> None:
    """Write ``parts`` (1-D byte buffers, ``size_bytes`` in all) in order: one ``os.write`` for one buffer,
    else one ``os.writev`` per :data:`IOV_MAX` buffers; a short write is finished by :func:`write_rest`."""
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


def split_batches(data: bytes) -> Iterator[bytes]:
    """The batches of ``data``, which holds whole batches back to back (a slice's bytes), one by one."""
    position = 0
    while position < len(data):
        length = int.from_bytes(data[position + BATCH_LENGTH_OFFSET : position + LOG_OVERHEAD], "big")
        size = length + LOG_OVERHEAD
        yield data[position : position + size]
        position += size


class BatchHeaders:
    """The batch headers of a ``.log`` file up to position ``end``, read with ``pread`` (see above)."""

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

    def first_reaching(self, position: int, offset: int) -> tuple[int, BatchHeader] | None:
        """From the batch at ``position``: the position and header of the first whose last offset is >=
        ``offset``, or None."""
        header = self.at(position)
        while header is not None:
            if header.last_offset >= offset:
                return position, header
            position += header.size
            header = self.at(position)
        return None

    def end_from(self, position: int, next_offset: int) -> tuple[int, int]:
        """``(position, next offset)`` after the last whole batch, walked from the batch at ``position``
        (``next_offset``: the answer when no batch is there)."""
        header = self.at(position)
        while header is not None:
            next_offset = header.last_offset + 1
            position += header.size
            header = self.at(position)
        return position, next_offset

    def boundary_within(self, position: int, next_offset: int, limit: int) -> tuple[int, int]:
        """``(position, next offset)`` after the last whole batch that ends by ``limit``, walked from the
        batch at ``position`` (``next_offset``: the answer when none does)."""
        header = self.at(position)
        while header is not None and position + header.size <= limit:
            position += header.size
            next_offset = header.last_offset + 1
            header = self.at(position)
        return position, next_offset

    def max_timestamp_from(self, position: int, max_timestamp: int, offset_of_max: int) -> tuple[int, int]:
        """The largest max timestamp, and the last offset of its batch, over the batches from ``position``
        and the ``(max_timestamp, offset_of_max)`` given (the earlier batches')."""
        header = self.at(position)
        while header is not None:
            if header.max_timestamp > max_timestamp:
                max_timestamp, offset_of_max = header.max_timestamp, header.last_offset
            position += header.size
            header = self.at(position)
        return max_timestamp, offset_of_max
