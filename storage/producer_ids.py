"""The broker's producer ids for InitProducerId: one allocator per broker and the file it keeps them in
(:class:`ProducerIdBlockAllocator`)."""

from __future__ import annotations

import fcntl
import os
import struct
from pathlib import Path

import crc32c as _crc32c

from storage.atomic_file import TMP_SUFFIX, write_atomically
from storage.errors import ApplianceError, ConfigError, CorruptRecordError, LogLockedError

__all__ = ["ID_FILE", "ProducerIdBlockAllocator"]

_INT64_MAX = (1 << 63) - 1

# The producer id file, declared once (20 bytes, big-endian).
#
#     0                   1                   2                   3
#     0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
#    +---------------------------------------------------------------+
#    |                   magic "APID"                    @0          |
#    +-------------------------------+-------------------------------+
#    |     version (uint16) @4       |     reserved (uint16) @6      |
#    +-------------------------------+-------------------------------+
#    |        reserved until (int64)                     @8          |  no id >= this was ever handed out
#    |                                                               |
#    +---------------------------------------------------------------+
#    |                   crc32c (uint32) of bytes 0..16  @16         |
#    +---------------------------------------------------------------+
ID_FILE = struct.Struct(">4sHHqI")
_ID_MAGIC = b"APID"
_ID_VERSION = 1
_ID_BODY = struct.Struct(">4sHHq")  # the part under the CRC
assert ID_FILE.size == 20 and _ID_BODY.size == 16


class ProducerIdBlockAllocator:
    """Unique, increasing producer ids for InitProducerId, persisted in the file at ``path``.

    Ids are reserved ``block_size`` at a time.  The end of the block is written whole and durably
    (``storage.atomic_file``) before the block's first id is handed out.  After a crash the next
    process starts at the end of the last block that was reserved, so no id is handed out twice.  One
    process owns the file at a time: a lock on ``<path>.lock`` is held until :meth:`close` (or until the
    process dies).  A damaged file raises :class:`CorruptRecordError`.  It is never reset silently, because
    that would hand out ids again.
    """

    def __init__(self, path: str | os.PathLike[str], *, block_size: int = 1000) -> None:
        if block_size < 1:
            raise ConfigError(f"{path}: producer id block size must be at least 1, got {block_size}")
        self.path = Path(path)
        self.block_size = block_size
        self._lock_fd: int | None = os.open(f"{self.path}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            self._lock_fd = None
            raise LogLockedError(
                f"{self.path}: producer id file is already in use by another allocator"
            ) from None
        try:
            self.path.with_name(self.path.name + TMP_SUFFIX).unlink(missing_ok=True)
            self._next_id = self._read_reserved_until()
        except BaseException:
            self.close()
            raise
        self._reserved_until = self._next_id  # nothing reserved by this process yet

    def _read_reserved_until(self) -> int:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return 0
        if len(data) != ID_FILE.size:
            raise CorruptRecordError(f"{self.path}: {len(data)} bytes, expected {ID_FILE.size}")
        magic, version, _reserved, reserved_until, stored_crc = ID_FILE.unpack(data)
        computed_crc = _crc32c.crc32c(data[: _ID_BODY.size])
        if magic != _ID_MAGIC or version != _ID_VERSION or stored_crc != computed_crc or reserved_until < 0:
            raise CorruptRecordError(
                f"{self.path}: magic {magic!r} (expected {_ID_MAGIC!r}), version {version} (expected "
                f"{_ID_VERSION}), stored CRC {stored_crc:#010x}, computed {computed_crc:#010x}, "
                f"reserved until {reserved_until}"
            )
        return int(reserved_until)

    @property
    def reserved_until(self) -> int:
        """The end (exclusive) of the block this process has reserved."""
        return self._reserved_until

    def allocate(self) -> int:
        """The next producer id.  Every 1 in ``block_size`` calls writes and syncs the file."""
        if self._lock_fd is None:
            raise ApplianceError(f"{self.path}: producer id allocator is closed")
        if self._next_id >= self._reserved_until:
            end = self._next_id + self.block_size
            if end > _INT64_MAX:
                raise ApplianceError(f"{self.path}: producer ids exhausted at {self._next_id}")
            body = _ID_BODY.pack(_ID_MAGIC, _ID_VERSION, 0, end)
            write_atomically(self.path, body + struct.pack(">I", _crc32c.crc32c(body)))
            self._reserved_until = end
        producer_id = self._next_id
        self._next_id += 1
        return producer_id

    def close(self) -> None:
        """Release the file.  The unused rest of the block is lost, which is harmless."""
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def __enter__(self) -> ProducerIdBlockAllocator:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
