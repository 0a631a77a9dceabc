"""Segments that left a log, closed later on a thread of their own: Kafka's ``file.delete.delay.ms``.

Theory of operation
-------------------
A segment leaves its log's segment list when a clean's swap replaces it (``SegmentList.swap_cleaned``) or
retention deletes it (``SegmentList.remove_first``).  Its files are unlinked where they always were (the
swap's step 4, ``storage.clean_swap``; retention right after the log start offset checkpoint), so what a
crash leaves behind and what the next open does with it are unchanged.  What waits is the close of the
segment's descriptors and index mappings: :meth:`SegmentDeleter.retire` holds the segments, and the
deleter's thread closes each ``file.delete.delay.ms`` after it was retired.  Two things follow:

1. **Whoever changed the list does not pay for freeing the files.**  Closing the last descriptor of an
   unlinked file makes the kernel drop its page cache and free its blocks there and then, work that grows
   with the file; a swap in the writer's thread, or a clean waiting for its swap, would wait for all of it.
   The deleter's thread pays instead, outside the GIL (``os.close`` and ``munmap`` release it).
2. **Readers in flight keep reading.**  A :class:`~storage.segment_file.FetchSlice` that ``Log.read``
   returned before the change names the old segment's descriptor; it stays open, on the old bytes, for the
   delay.  Readers in other processes (the broker's ``LogReader``, local consumers, followers' leaders)
   hold descriptors and mappings of their own, which POSIX keeps readable after the unlink whatever this
   process does; the delay is for this process's own readers.

Kafka renames a deleted segment's files ``.deleted`` and a scheduler deletes them after the delay; here
the files are unlinked at once and only held open, so the names are gone (a listing never sees them) and a
crash during the delay leaves nothing to clean up.  The disk blocks come back when the deleter closes.

The thread starts at the first :meth:`~SegmentDeleter.retire` and ends when nothing is held (a log that
never cleans or deletes has none); :meth:`~SegmentDeleter.close` (``Log.close``) closes whatever is still
held at once, on the caller's thread.  A child forked while segments are held (the supervisor forks its
writers) closes its copies of them at once: it has no deleter thread, and would otherwise keep the
unlinked files' blocks for its whole life.  An error closing a segment is logged with its path: the files are
already unlinked, there is nothing else to do.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections.abc import Sequence
from typing import NamedTuple, Protocol

__all__ = ["HeldFile", "Retirable", "SegmentDeleter", "hold_files"]

_log = logging.getLogger(__name__)


class Retirable(Protocol):
    """What the deleter needs of a segment: its path (for the log) and its close."""

    @property
    def log_path(self) -> str: ...
    def close(self) -> None: ...


class HeldFile(NamedTuple):
    """A file held open by a descriptor alone (no segment object): for a process that swaps a log's
    segments without holding them open itself (the supervisor, while no writer runs), so that the swap's
    unlink is not the last reference and the deleter's close frees the file instead."""

    log_path: str
    fd: int

    def close(self) -> None:
        os.close(self.fd)


def hold_files(paths: Sequence[str]) -> list[HeldFile]:
    """``paths`` opened read-only, to retire after they are unlinked; a path already gone is skipped.  Any
    other error is raised with nothing left open."""
    held: list[HeldFile] = []
    try:
        for path in paths:
            try:
                held.append(HeldFile(path, os.open(path, os.O_RDONLY | os.O_CLOEXEC)))
            except FileNotFoundError:
                continue
    except BaseException:
        _close_all(held)
        raise
    return held


class _Held(NamedTuple):
    due_s: float  # time.monotonic() at which it is closed
    segment: Retirable


class SegmentDeleter:
    """The segments one log retired, closed after a delay on a thread (see the module docstring)."""

    def __init__(self, name: str) -> None:
        self._name = name  # the thread's name: ``delete-<partition>``
        self._cond = threading.Condition()
        self._held: list[_Held] = []  # in the order retired
        self._thread: threading.Thread | None = None
        self._closed = False
        _ALL.add(self)

    def retire(self, segments: Sequence[Retirable], delay_ms: int) -> None:
        """Close ``segments`` (out of the log's list, their files unlinked or about to be) ``delay_ms``
        from now, on the deleter's thread; at once, here, if the deleter is closed."""
        if not segments:
            return
        due_s = time.monotonic() + delay_ms / 1000
        with self._cond:
            if not self._closed:
                self._held.extend(_Held(due_s, segment) for segment in segments)
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                    self._thread.start()
                self._cond.notify()
                return
        _close_all(segments)

    @property
    def held(self) -> int:
        """How many retired segments are still open."""
        with self._cond:
            return len(self._held)

    def close(self) -> None:
        """Close every segment still held, now, and stop the thread (later retirements close at once)."""
        with self._cond:
            self._closed = True
            held, self._held = self._held, []
            thread = self._thread
            self._cond.notify()
        if thread is not None:
            thread.join()
        _close_all([h.segment for h in held])

    def forget_after_fork(self) -> None:
        """In a forked child (no thread runs there): close this process's copies of the held segments now
        and start over with a fresh condition."""
        held, self._held = self._held, []
        self._cond = threading.Condition()
        self._thread = None
        _close_all([h.segment for h in held])

    def _run(self) -> None:
        while True:
            with self._cond:
                due = self._take_due()
                if due is None:
                    self._thread = None
                    return
            _close_all(due)

    def _take_due(self) -> list[Retirable] | None:
        """Wait (holding the condition) until some segments are due and take them; None when none are
        held any more."""
        while self._held:
            now = time.monotonic()
            due = [h.segment for h in self._held if h.due_s <= now]
            if due:
                self._held = [h for h in self._held if h.due_s > now]
                return due
            self._cond.wait(min(h.due_s for h in self._held) - now)
        return None


_ALL: weakref.WeakSet[SegmentDeleter] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """In a forked child: every deleter's held segments closed (the child's copies), no thread."""
    for deleter in list(_ALL):
        deleter.forget_after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _close_all(segments: Sequence[Retirable]) -> None:
    for segment in segments:
        try:
            segment.close()
        except OSError as exc:
            _log.warning("cannot close the retired segment %s: %s (its files are already unlinked)",
                         segment.log_path, exc)
