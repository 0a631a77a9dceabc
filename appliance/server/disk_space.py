"""Whether a partition's log directory may take writes: a full disk as a state of the partition writer.

Theory of operation
-------------------
A partition writer asks :class:`DiskSpace` before each append and tells it when an append failed:

* **Full.**  An append that met a full file system (``ENOSPC``, ``EDQUOT``: the log raised
  ``KafkaStorageError`` after cutting itself back, ``storage.log``) makes the directory *full*
  (:meth:`DiskSpace.failed`).
* **The reserve.**  ``log.dir.min.free.bytes``: before appending a round of ``n`` bytes the writer asks
  :meth:`DiskSpace.may_write`; where fewer than ``n`` plus the reserve would be free the directory is full
  too, before the file system is, so checkpoints, snapshots, trimmed indexes and the topic metadata (small
  files written whole) still find room.  Free bytes are what ``statvfs`` gives an unprivileged process
  (``f_bavail``).  ``statvfs`` is not called per round: the writer keeps an estimate (the last
  measurement less what it appended since) and measures again once the estimate nears the reserve, or a
  second after the last measurement (other partitions share the directory).
* **While full** every new batch is answered KAFKA_STORAGE_ERROR without touching the log
  (:meth:`DiskSpace.refused`), and the directory is measured again at most every
  :data:`RECHECK_INTERVAL_NS` when a frame arrives and on the writer's idle timer: once the free bytes
  reach the reserve plus :data:`RESUME_MARGIN_BYTES` (so one freed page does not flap the state), writes
  resume, with no restart.

A transition is logged once each way, naming the partition, the directory and the cause.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Final

from storage.errors import KafkaStorageError

__all__ = ["RECHECK_INTERVAL_NS", "RESUME_MARGIN_BYTES", "DiskSpace", "free_bytes"]

RECHECK_INTERVAL_NS: Final = 100_000_000  # while full: statvfs at most this often
_MEASURE_INTERVAL_NS: Final = 1_000_000_000  # while writable: statvfs at least this often (when appending)
RESUME_MARGIN_BYTES: Final = 1024 * 1024  # writes resume at the reserve plus this much free
_log = logging.getLogger("appliance.writer")


def free_bytes(directory: str) -> int:
    """Bytes an unprivileged process may still write in ``directory``'s file system (``f_bavail``)."""
    st = os.statvfs(directory)
    return st.f_bavail * st.f_frsize


class DiskSpace:
    """The write state of one partition's log directory (see the module docstring).  ``measure`` is how
    free bytes are measured (:func:`free_bytes` of the directory; a test may give its own)."""

    __slots__ = ("_estimate", "_measure", "_next_measure_ns", "directory", "error", "min_free_bytes",
                 "partition")

    def __init__(self, partition: str, directory: str, min_free_bytes: int,
                 measure: Callable[[], int] | None = None) -> None:
        self.partition = partition
        self.directory = directory  # the log dir (the partition directory's parent)
        self.min_free_bytes = min_free_bytes
        self.error: KafkaStorageError | None = None  # set while full: what refused batches are told
        self._measure = measure or (lambda: free_bytes(directory))
        self._estimate = -1  # free bytes at the last measurement, less what was appended since
        self._next_measure_ns = 0

    @property
    def full(self) -> bool:
        return self.error is not None

    @property
    def recheck_due_ns(self) -> int | None:
        """While full: the monotonic ns of the next measurement (the idle writer wakes for it); else None."""
        return self._next_measure_ns if self.error is not None else None

    def may_write(self, size_bytes: int, now_ns: int) -> bool:
        """Whether a round of ``size_bytes`` may be appended (False: the reserve would be broken, and the
        directory is full from now on)."""
        if self.min_free_bytes <= 0:
            return True
        self._estimate -= size_bytes
        if self._estimate - self.min_free_bytes >= 0 and now_ns < self._next_measure_ns:
            return True
        free = self._measure_now(now_ns, _MEASURE_INTERVAL_NS)
        if free - size_bytes >= self.min_free_bytes:
            self._estimate = free - size_bytes
            return True
        self._set_full(f"{free} bytes free, below log.dir.min.free.bytes {self.min_free_bytes}")
        return False

    def failed(self, error: KafkaStorageError) -> None:
        """An append failed for want of space (the log is back as before it)."""
        if self.error is None:
            self._set_full(error.cause)
        self._next_measure_ns = time.monotonic_ns() + RECHECK_INTERVAL_NS

    def refused(self, now_ns: int) -> bool:
        """Whether new batches are refused now: full, and a measurement (at most every
        :data:`RECHECK_INTERVAL_NS`) did not find the reserve plus :data:`RESUME_MARGIN_BYTES` free."""
        if self.error is None:
            return False
        if now_ns < self._next_measure_ns:
            return True
        free = self._measure_now(now_ns, RECHECK_INTERVAL_NS)
        if free < self.min_free_bytes + RESUME_MARGIN_BYTES:
            return True
        _log.warning("writer %s: log directory %s has %d bytes free again; accepting writes", self.partition,
                     self.directory, free)
        self.error = None
        self._estimate = free
        return False

    def _measure_now(self, now_ns: int, interval_ns: int) -> int:
        try:
            free = self._measure()
        except OSError as exc:  # the directory is gone or unreadable: nothing to go by, count it as full
            _log.warning("writer %s: cannot measure free space in %s: %s", self.partition, self.directory,
                         exc)
            free = 0
        self._next_measure_ns = now_ns + interval_ns
        return free

    def _set_full(self, cause: str) -> None:
        self.error = KafkaStorageError.for_partition(self.partition, self.directory, cause)
        self._next_measure_ns = time.monotonic_ns() + RECHECK_INTERVAL_NS
        _log.warning("writer %s: log directory %s cannot take writes (%s): new batches are answered "
                     "KAFKA_STORAGE_ERROR until it has room again", self.partition, self.directory, cause)
