"""The swaps of one cleaning pass: its groups' cleaned files fsynced on a thread, then swapped in together.

Theory of operation
-------------------
``storage.cleaner`` writes a pass's groups one after the other, each aside as ``<base>.log.cleaned`` (and its
indexes).  :class:`PassSwaps` takes each group as it is written: while its ``.log`` grows, a second thread
fdatasyncs what it holds so far whenever the pass asks and the thread is idle (:meth:`PassSwaps.write_back`);
once the ``.log`` is whole the thread fsyncs and closes it (:meth:`PassSwaps.sync`) while the pass writes
the group's indexes and the next group; then the group is gathered (:meth:`PassSwaps.gather`).  The groups
gathered are swapped in together by :meth:`PassSwaps.commit` (the log's ``swap_cleaned``: one swap,
``storage.clean_swap``, one set of directory fsyncs for all of them): at the end of the pass, or earlier,
queued on the same thread while the pass writes on, once the cleaned bytes held aside reach the log's
``segment.bytes`` or ``max_groups`` groups, so the disk never holds much more than the log beside it.  The
thread runs its tasks in order: a swap follows the fsyncs of its groups, and the swaps keep their order.

Errors: :meth:`PassSwaps.finish` waits for every task and raises the first error; :meth:`PassSwaps.abandon`
(the pass failed, or an earlier task did) also unlinks the files of the groups gathered but not swapped.  A
swap whose groups' fsyncs (or write-backs) failed unlinks their files and swaps nothing.  A failed swap is
finished or undone by the log (``storage.clean_swap.finish_interrupted_swap``), which unlinks every
``*.cleaned`` file in the directory: the pass, waiting for it before it raises its own error, reports the
swap's error first.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
from collections.abc import Sequence
from typing import Protocol

from storage.clean_swap import SwapGroup, cleaned_paths
from storage.log_config import LogConfig

__all__ = ["PassSwaps", "SwappableLog"]


class SwappableLog(Protocol):
    """What the swaps need of a log: its directory, its ``segment.bytes``, and its swap."""

    @property
    def directory(self) -> str: ...
    @property
    def config(self) -> LogConfig: ...
    def swap_cleaned(self, groups: Sequence[SwapGroup]) -> None: ...


class PassSwaps:
    """The swaps of one pass (see the module docstring)."""

    def __init__(self, log: SwappableLog, max_groups: int) -> None:
        self._log = log
        self._max_groups = max_groups
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="clean-swap")
        self._tasks: list[concurrent.futures.Future[None]] = []
        self._gathered: list[SwapGroup] = []
        self._held = 0

    def __enter__(self) -> PassSwaps:
        return self

    def __exit__(self, *exc: object) -> None:
        self._pool.shutdown(wait=True)

    def write_back(self, fd: int) -> None:
        """Fdatasync, on the thread, what the ``.log`` open at ``fd`` holds so far, while the pass writes on:
        the fsync that ends the group (:meth:`sync`) then has only the rest to wait for.  Nothing while the
        thread is still busy (each sync is a flush of the disk's cache: the thread must not fall behind)."""
        if not self._tasks or self._tasks[-1].done():
            self._tasks.append(self._pool.submit(os.fdatasync, fd))

    def sync(self, fd: int) -> None:
        """Fsync and close, on the thread, the ``.log`` open at ``fd``, written whole: the next group
        :meth:`gather` takes (its indexes are written meanwhile)."""
        self._tasks.append(self._pool.submit(_fsync_close, fd))

    def gather(self, group: SwapGroup, size_bytes: int) -> None:
        """Gather the group just written (``size_bytes`` long, its ``.log`` given to :meth:`sync`); an
        earlier task's error is raised here (the groups gathered unlinked)."""
        self._gathered.append(group)
        self._held += size_bytes
        if any(task.done() and task.exception() is not None for task in self._tasks):
            self.abandon()
        if len(self._gathered) >= self._max_groups or self._held >= self._log.config.segment_bytes:
            self.commit()

    def commit(self) -> None:
        """Queue the swap of the groups gathered, after their fsyncs."""
        if not self._gathered:
            return
        groups, fsyncs = self._gathered, self._tasks
        self._gathered, self._held, self._tasks = [], 0, []
        self._tasks.append(self._pool.submit(self._swap, groups, fsyncs))

    def settle(self) -> None:
        """Wait for the tasks queued so far to end, raising nothing (their errors stay for :meth:`finish`):
        before a descriptor a queued write-back may use is closed."""
        concurrent.futures.wait(self._tasks)

    def finish(self) -> None:
        """Wait for every task queued; the first error, if any, raised here."""
        tasks, self._tasks = self._tasks, []
        first = next((e for e in (task.exception() for task in tasks) if e is not None), None)
        if first is not None:
            raise first

    def abandon(self) -> None:
        """Wait for every task and unlink the files of the groups gathered; a task's error raised."""
        gathered, self._gathered, self._held = self._gathered, [], 0
        try:
            self.finish()
        finally:
            for group in gathered:
                _unlink_cleaned(self._log.directory, group.base_offset)

    def _swap(self, groups: list[SwapGroup], fsyncs: list[concurrent.futures.Future[None]]) -> None:
        failed = next((e for e in (f.exception() for f in fsyncs) if e is not None), None)
        if failed is not None:
            for group in groups:
                _unlink_cleaned(self._log.directory, group.base_offset)
            raise failed
        self._log.swap_cleaned(groups)


def _fsync_close(fd: int) -> None:
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _unlink_cleaned(directory: str, base_offset: int) -> None:
    for path in cleaned_paths(directory, base_offset):
        with contextlib.suppress(OSError):
            os.unlink(path)
