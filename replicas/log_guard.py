"""Sharing a follower's log between its fetcher and a cleaner thread: who may change it, and when.

Theory of operation
-------------------
A replica process opens each followed partition's :class:`storage.log.Log` once; that object is not
thread-safe.  Two threads use it: the partition's fetcher (``replicas.fetcher``: it appends, truncates and
moves the log start offset) and the replica's cleaner thread (``appliance.follower.cleaning``: it reads
closed segments through their files and swaps cleaned ones in).  One :class:`LogGuard` per followed
partition says how:

1. **Every change to the log holds** :attr:`LogGuard.lock`: the fetcher's appends (each piece of an answer),
   truncations and log start moves; the cleaner's listing of the segments (:meth:`Log.segments`, the
   offsets) and its ``Log.swap_cleaned``.  So a swap happens between two appends, never inside one, and
   the cleaner's listing is of one moment.
2. **A cleaning pass holds** :meth:`LogGuard.cleaning` for its whole length, without the lock: it reads
   closed segment files through read-only mappings while the fetcher appends to the active segment.
3. **A cut below what a pass may be reading waits for the pass.**  Shrinking a mapped file would fault
   the reader (SIGBUS), so a truncation that may cut a closed segment (below the follower's high
   watermark: only an unclean leader's history does it) goes through :meth:`LogGuard.cutting`: it asks the
   pass in progress to stop (:meth:`LogGuard.check_cut`, called by the pass after each segment it reads
   or writes, raises :class:`PassStopped`), waits for it, and cuts holding the lock.  The pass's
   ``.cleaned`` files are unlinked by the cleaner; the log is measured again next round.
4. **Closing**: the owner calls :meth:`LogGuard.close` before it closes (or removes) the log: the pass in
   progress stops at its next segment and is waited for, and a later pass or swap is refused.

Order: the pass first, then the lock (a cut and a pass's swap both take them in that order).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

__all__ = ["LogGuard", "PassStopped"]


class PassStopped(Exception):
    """A cleaning pass was asked to stop (a truncation waits for it, or the log is closing): nothing of it
    was swapped after this point; its ``.cleaned`` files are to be unlinked and the log measured again."""


class LogGuard:
    """The lock of one follower log and the pass/cut hand-shake (see the module docstring)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.closed = False
        self._pass = threading.Lock()
        self._stops_wanted = 0  # cuts (or a close) waiting for the pass in progress
        self._count_lock = threading.Lock()

    @contextlib.contextmanager
    def cleaning(self) -> Iterator[None]:
        """Around one cleaning pass over the log."""
        with self._pass:
            yield

    def check_cut(self) -> None:
        """Called by a pass between segments: :class:`PassStopped` if a cut or a close waits for it."""
        if self._stops_wanted or self.closed:
            raise PassStopped("a truncation or a close of the log waits for this pass")

    @contextlib.contextmanager
    def cutting(self) -> Iterator[None]:
        """Around a truncation that may cut a closed segment: the pass in progress stops first, then the
        lock is held for the cut."""
        with self._count_lock:
            self._stops_wanted += 1
        try:
            self._pass.acquire()
        finally:
            with self._count_lock:
                self._stops_wanted -= 1
        try:
            with self.lock:
                yield
        finally:
            self._pass.release()

    def close(self) -> None:
        """Mark the log closing and wait for a pass in progress to stop (at its next segment): no swap is
        done, and no ``.cleaned`` file written, from the return on."""
        with self.lock:
            self.closed = True
        with self._pass:
            pass
