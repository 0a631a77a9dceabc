"""Sharing a follower's log between its fetcher and the adoption thread: who may change it, and when.

Theory of operation
-------------------
A replica process opens each followed partition's :class:`storage.log.Log` once; that object is not
thread-safe.  Two threads use it: the partition's fetcher (``replicas.fetcher``: it appends, rolls,
truncates and moves the log start offset) and the replica's adoption thread
(``appliance.follower.adoption``: it reads closed segment files, copies the leader's cleaned segment into a
``.cleaned`` file and swaps it in).  One :class:`LogGuard` per followed partition says how:

1. **Every change to the log holds** :attr:`LogGuard.lock`: the fetcher's appends (each piece of an answer),
   rolls, truncations and log start moves; the adoption thread's listing of the segments
   (:meth:`Log.segments`, the offsets) and its ``Log.swap_cleaned``.  So a swap happens between two
   appends, never inside one, and the listing is of one moment.
2. **An adoption holds** :meth:`LogGuard.cleaning` for its whole length (the copy and the swap), without
   the lock while it copies.
3. **A cut below what an adoption may replace waits for it.**  A truncation that may cut a closed segment
   (below the follower's high watermark: only an unclean leader's history does it) goes through
   :meth:`LogGuard.cutting`: it asks the adoption in progress to stop (:meth:`LogGuard.check_cut`, called
   by the adoption between its Fetches, raises :class:`PassStopped`), waits for it, and cuts holding the
   lock.  The adoption's ``.cleaned`` file is unlinked; the log is compared again next round.
4. **Closing**: the owner calls :meth:`LogGuard.close` before it closes (or removes) the log: the adoption
   in progress stops at its next Fetch and is waited for, and a later swap is refused.

Order: the adoption first, then the lock (a cut and an adoption's swap both take them in that order).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

__all__ = ["LogGuard", "PassStopped"]


class PassStopped(Exception):
    """An adoption was asked to stop (a truncation waits for it, or the log is closing): nothing of it is
    swapped in; its ``.cleaned`` file is to be unlinked and the log compared again."""


class LogGuard:
    """The lock of one follower log and the adoption/cut hand-shake (see the module docstring)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.closed = False
        self._pass = threading.Lock()
        self._stops_wanted = 0  # cuts (or a close) waiting for the pass in progress
        self._count_lock = threading.Lock()

    @contextlib.contextmanager
    def cleaning(self) -> Iterator[None]:
        """Around one adoption (its copy and its swap)."""
        with self._pass:
            yield

    def check_cut(self) -> None:
        """Called by an adoption between Fetches: :class:`PassStopped` if a cut or a close waits for it."""
        if self._stops_wanted or self.closed:
            raise PassStopped("a truncation or a close of the log waits for this pass")

    @contextlib.contextmanager
    def cutting(self) -> Iterator[None]:
        """Around a truncation that may cut a closed segment: the adoption in progress stops first, then
        the lock is held for the cut."""
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
        """Mark the log closing and wait for an adoption in progress to stop (at its next Fetch): no swap
        is done, and no ``.cleaned`` file written, from the return on."""
        with self.lock:
            self.closed = True
        with self._pass:
            pass
