"""Wake up when a partition's files change: Linux inotify on the partition directory, through ctypes.

Theory of operation
-------------------
A local consumer that has read everything below the high watermark must wait for the partition writer's
next append.  Sleeping in a loop costs a wake-up per look and, on a virtual machine, a timer wake-up can come
milliseconds late; spinning costs a core.  The writer's append is an ``os.write`` to a segment file in the
partition directory, and the kernel can tell any number of watchers about it without the writer knowing
they exist: an inotify watch on the directory reports ``IN_MODIFY`` for every write to a file in it (and
``IN_CREATE`` / ``IN_MOVED_TO`` / ``IN_DELETE`` when segments roll, are compacted or deleted).  The watcher
sleeps in ``select`` on the inotify descriptor and is woken by the writer's ``write`` system call itself --
the same cross-core wake-up a semaphore gives (a few microseconds), at no cost to an idle system.

The event says "bytes were written", not "the high watermark moved": the writer publishes the high
watermark right *after* its write, and a replicated partition's high watermark moves later still (when
followers catch up), with no write here.  So an event only ends a sleep; the caller then looks at the high
watermark, spins briefly for it, and keeps a timeout on every wait so that high-watermark-only changes are
seen too.  Events carry nothing the caller needs: :meth:`DirectoryWatch.drain` just empties the queue
(an overflowed queue is fine: it means "something changed").

Where inotify is missing or out of watches (``fs.inotify.max_user_watches``), :meth:`DirectoryWatch.open`
returns None and the caller falls back to timed sleeps.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import select
from collections.abc import Sequence
from typing import Final

__all__ = ["DirectoryWatch", "wait_any"]

IN_MODIFY: Final = 0x00000002
IN_MOVED_TO: Final = 0x00000080
IN_CREATE: Final = 0x00000100
IN_DELETE: Final = 0x00000200
IN_NONBLOCK: Final = os.O_NONBLOCK
IN_CLOEXEC: Final = os.O_CLOEXEC
_MASK: Final = IN_MODIFY | IN_MOVED_TO | IN_CREATE | IN_DELETE
_DRAIN_BYTES: Final = 64 * 1024

_libc: ctypes.CDLL | None = None


def _load_libc() -> ctypes.CDLL | None:
    global _libc
    if _libc is None:
        name = ctypes.util.find_library("c")
        if name is None:
            return None
        libc = ctypes.CDLL(name, use_errno=True)
        if not hasattr(libc, "inotify_init1"):
            return None
        libc.inotify_init1.argtypes = [ctypes.c_int]
        libc.inotify_init1.restype = ctypes.c_int
        libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        libc.inotify_add_watch.restype = ctypes.c_int
        _libc = libc
    return _libc


class DirectoryWatch:
    """An inotify descriptor watching one directory for writes, new, renamed and deleted files."""

    def __init__(self, fd: int, path: str) -> None:
        self.fd = fd
        self.path = path

    @classmethod
    def open(cls, path: str) -> DirectoryWatch | None:
        """Watch ``path``; None where inotify is unavailable (the caller then polls on a timer)."""
        libc = _load_libc()
        if libc is None:
            return None
        fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            return None  # EMFILE: too many inotify instances for this user
        if libc.inotify_add_watch(fd, os.fsencode(path), _MASK) < 0:
            os.close(fd)
            return None  # ENOSPC (max_user_watches) or the directory went away
        return cls(fd, path)

    def fileno(self) -> int:
        return self.fd

    def drain(self) -> bool:
        """Empty the event queue; whether there was anything in it."""
        seen = False
        while True:
            try:
                data = os.read(self.fd, _DRAIN_BYTES)
            except BlockingIOError:
                return seen
            if not data:
                return seen
            seen = True

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def wait_any(watches: Sequence[DirectoryWatch], timeout_s: float) -> bool:
    """Sleep until one of ``watches`` has an event or ``timeout_s`` passes; drain what arrived.  Returns
    whether an event arrived."""
    readable, _, _ = select.select(watches, [], [], max(0.0, timeout_s))
    for watch in readable:
        watch.drain()
    return bool(readable)
