"""``log.preallocate``: reserving a segment's disk blocks ahead of its appends, without changing its size.

While a segment is active, ``storage.segment`` reserves its blocks ahead of the appends with
``fallocate(FALLOC_FL_KEEP_SIZE)`` (:func:`reservation_end` says how far, :func:`reserve_blocks` asks the
kernel, a :class:`BlockReservation` keeps one segment's account), so the file's size, and everything a
reader sees, stays the data's; ext4 then skips its per-page block reservation on each write.  The unused
reservation is given back on roll and close (``ftruncate`` to the file's own size).  Python has no
``os.fallocate``, so the C library's is bound here with ctypes; where there is none, or the file lives in
memory (:func:`preallocation_helps`), nothing is reserved.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
from collections.abc import Callable
from typing import Final

from storage.disk_faults import DISK_FAULTS

__all__ = [
    "PREALLOCATE_MAX_AHEAD_BYTES",
    "PREALLOCATE_MIN_AHEAD_BYTES",
    "BlockReservation",
    "preallocation_helps",
    "reservation_end",
    "reserve_blocks",
]

PREALLOCATE_MIN_AHEAD_BYTES: Final = 1024 * 1024  # log.preallocate: reserve ahead as much as the segment
PREALLOCATE_MAX_AHEAD_BYTES: Final = 32 * 1024 * 1024  # holds, within these bounds (see reservation_end)
_FALLOC_FL_KEEP_SIZE: Final = 0x01  # <linux/falloc.h>: reserve blocks, leave the file size alone
_MEMORY_FILE_SYSTEMS: Final = frozenset({0x01021994, 0x858458F6})  # statfs f_type of tmpfs, ramfs
_log = logging.getLogger("storage.segment")


def _libc_fallocate() -> Callable[[int, int, int, int], int] | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        function = getattr(libc, "fallocate64", None) or libc.fallocate
    except (OSError, AttributeError):  # not glibc/musl on Linux
        return None
    function.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)
    function.restype = ctypes.c_int
    return function


def _libc_fstatfs_type() -> Callable[[int], int] | None:
    try:
        fstatfs = ctypes.CDLL(None, use_errno=True).fstatfs
    except (OSError, AttributeError):
        return None

    def file_system_type(fd: int) -> int:
        buf = ctypes.create_string_buffer(256)  # struct statfs; f_type (a C long) comes first
        return ctypes.c_long.from_buffer(buf).value if fstatfs(fd, buf) == 0 else -1

    return file_system_type


_fallocate = _libc_fallocate()
_file_system_type = _libc_fstatfs_type()


def reservation_end(size_bytes: int, end: int, segment_bytes: int) -> int:
    """``log.preallocate``'s schedule: with ``size_bytes`` in the segment and a write to reach ``end``,
    reserve blocks through ``end`` and as far again beyond the data as the segment already holds, from
    :data:`PREALLOCATE_MIN_AHEAD_BYTES` to :data:`PREALLOCATE_MAX_AHEAD_BYTES` (an idle partition reserves
    little, a busy one one ``fallocate`` per 32 MiB); never past ``segment.bytes`` unless one batch is."""
    ahead = min(max(size_bytes, PREALLOCATE_MIN_AHEAD_BYTES), PREALLOCATE_MAX_AHEAD_BYTES)
    return min(max(end, size_bytes + ahead), max(end, segment_bytes))


def preallocation_helps(fd: int) -> bool:
    """False on a memory file system (tmpfs, ramfs): reserving there allocates and zeroes the pages a
    write would allocate anyway, and holds memory; it saves nothing."""
    return _file_system_type is None or _file_system_type(fd) not in _MEMORY_FILE_SYSTEMS


def reserve_blocks(fd: int, position: int, length_bytes: int) -> int:
    """Reserve disk blocks for bytes ``[position, position + length_bytes)`` of ``fd`` without changing the
    file's size: ``fallocate(2)`` with ``FALLOC_FL_KEEP_SIZE`` (Python has no ``os.fallocate``, and
    ``os.posix_fallocate`` grows the file, which readers would see).  Returns 0, or the errno saying why not
    (``ENOSPC``; ``EOPNOTSUPP`` where the file system cannot; ``ENOSYS`` without a C library to ask)."""
    if _fallocate is None:
        return errno.ENOSYS
    if DISK_FAULTS.armed:
        try:
            DISK_FAULTS.check("segment.preallocate")
        except OSError as exc:
            return exc.errno or errno.ENOSPC
    while _fallocate(fd, _FALLOC_FL_KEEP_SIZE, position, length_bytes) != 0:
        error = ctypes.get_errno()
        if error != errno.EINTR:
            return error
    return 0


class BlockReservation:
    """One segment's blocks reserved ahead of its appends: through which position (:attr:`end`), and
    whether it reserves at all (:attr:`enabled`: ``log.preallocate``, until a ``fallocate`` fails or the
    file turns out to live in memory)."""

    __slots__ = ("enabled", "end", "path")

    def __init__(self, enabled: bool, path: str) -> None:
        self.enabled = enabled
        self.end = 0
        self.path = path  # the segment file, for the log line

    def attach(self, fd: int, size_bytes: int) -> None:
        """An append descriptor opened on a file holding ``size_bytes``: what lies past them (a crash's
        leftover) counts as not reserved, and is given back by :meth:`release`."""
        self.enabled = self.enabled and preallocation_helps(fd)
        self.end = size_bytes

    def reserve(self, fd: int, size_bytes: int, end: int, segment_bytes: int) -> None:
        """For a file holding ``size_bytes`` and a write to reach ``end``: reserve blocks through
        :func:`reservation_end`.  Where that fails (a full disk, a file system without ``fallocate``) the
        segment stops reserving and its writes go on as without."""
        new_end = reservation_end(size_bytes, end, segment_bytes)
        error = reserve_blocks(fd, self.end, new_end - self.end)
        if error:
            _log.debug("%s: not preallocating (%s)", self.path, os.strerror(error))
            self.enabled = False
            return
        self.end = new_end

    def cut(self, size_bytes: int) -> None:
        """The file was truncated to ``size_bytes`` (which also freed the blocks past it)."""
        self.end = min(self.end, size_bytes)

    def release(self, fd: int) -> None:
        """Give back the blocks reserved past the end of the data of ``fd`` (-1: none to give back).
        ``ftruncate`` to the file's own size frees them (checked on ext4 and tmpfs); the size, the bytes
        and the mtime (retention of segments without timestamps reads it) stay as they were."""
        if fd >= 0:
            st = os.fstat(fd)
            if st.st_blocks * 512 > st.st_size:
                os.ftruncate(fd, st.st_size)
                os.utime(fd, ns=(st.st_atime_ns, st.st_mtime_ns))
        self.end = 0
