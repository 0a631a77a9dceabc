"""The log's one background thread: fsync rolled segments in roll order, then advance the recovery point.

A segment is rolled every ``segment.bytes`` (1 GiB by default); fsyncing it on the writer's thread would stall
appends for as long as the disk takes to absorb it.  Kafka flushes rolled segments asynchronously; so does
this.  The recovery point only moves past a segment once it and every earlier one are on disk, so recovery
after a crash only ever scans the active segment plus whatever was rolled but not yet fsynced.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
from collections.abc import Callable

__all__ = ["RolledSegmentFlusher"]


class RolledSegmentFlusher:
    """One background thread that fsyncs rolled segments in roll order, then advances the recovery point.

    The writer never waits for it on the append path; ``drain`` waits (before truncation, which may lower
    the recovery point, and before a clean close).  An fsync error is re-raised by the writer's next call.
    """

    def __init__(self, on_flushed: Callable[[int], None], name: str) -> None:
        self._on_flushed = on_flushed
        self._name = name
        self._queue: queue.Queue[tuple[int, tuple[str, ...], int] | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None  # set by the thread; raise_error() raises and clears it

    def submit(self, fd: int, index_paths: tuple[str, ...], upto_offset: int) -> None:
        """fsync ``fd`` (a dup the flusher closes) and the index files; then recovery point = upto_offset."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread.start()
        self._queue.put((fd, index_paths, upto_offset))

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                fd, index_paths, upto_offset = item
                try:
                    if self.error is None:
                        os.fdatasync(fd)
                        for path in index_paths:
                            with contextlib.suppress(FileNotFoundError):
                                index_fd = os.open(path, os.O_RDONLY)
                                try:
                                    os.fsync(index_fd)
                                finally:
                                    os.close(index_fd)
                        self._on_flushed(upto_offset)
                except BaseException as error:  # re-raised by the writer's next call
                    self.error = error
                finally:
                    os.close(fd)
            finally:
                self._queue.task_done()

    def drain(self) -> None:
        """Wait for every submitted segment; raise a flush error if one happened."""
        if self._thread is not None:
            self._queue.join()
        self.raise_error()

    def raise_error(self) -> None:
        if self.error is not None:
            error, self.error = self.error, None
            raise error

    def stop(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None
