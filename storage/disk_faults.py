"""Named fault points on the append path: the seam through which a test makes a disk "fill up" at a
chosen step of an append, a roll or a snapshot.

Theory of operation
-------------------
Every step of the append path that asks the file system for space calls :meth:`DiskFaults.check` with its
point's name first (``if DISK_FAULTS.armed:`` guards it, so production pays one attribute load).  A test
arms a point (:meth:`DiskFaults.arm`): the next call there (or the ``after``-th) raises the ``OSError`` a
full file system raises (``ENOSPC`` by default, ``EDQUOT`` for a quota), as many ``times`` as asked.  The
code under test then meets exactly what a full disk gives it, at exactly that step.

The points (:data:`FAULT_POINTS`):

``segment.write``       the ``write``/``writev`` of batches to the active ``.log``: nothing is written
``segment.write.torn``  the same, after half of the bytes reached the file (a short write, then ENOSPC)
``segment.preallocate`` reserving a segment's blocks ahead (``log.preallocate``): the reservation fails
``segment.create``      a roll's new ``.log`` file, just after it was created
``index.allocate``      allocating room in an ``.index``/``.timeindex`` file for more entries
``index.trim``          writing a segment's trimmed index at a roll or a clean close
``snapshot.write``      writing a producer-state snapshot
``checkpoint.write``    writing a checkpoint file (recovery point, log start offset, leader epochs)

A process has one registry, :data:`DISK_FAULTS`; tests disarm it when they finish
(:meth:`DiskFaults.disarm`).  Nothing outside tests arms it.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

__all__ = ["DISK_FAULTS", "FAULT_POINTS", "DiskFaults"]

FAULT_POINTS: Final = frozenset({
    "segment.write", "segment.write.torn", "segment.preallocate", "segment.create", "index.allocate",
    "index.trim", "snapshot.write", "checkpoint.write",
})


@dataclass(slots=True)
class _Armed:
    error: int  # the errno raised
    after: int  # calls to let through first
    times: int  # failures left (-1: every call from then on)


class DiskFaults:
    """The fault points of this process (see the module docstring).  ``armed`` is True while any is."""

    __slots__ = ("_points", "armed", "hits")

    def __init__(self) -> None:
        self._points: dict[str, _Armed] = {}
        self.armed = False
        self.hits: dict[str, int] = {}  # failures raised so far, by point (for a test's own checks)

    def arm(self, point: str, *, error: int = errno.ENOSPC, after: int = 0, times: int = 1) -> None:
        """Make the ``after``-th next call at ``point`` (0: the next one) and the ``times - 1`` after it
        fail with ``OSError(error)``; ``times=-1``: every call from then on, until disarmed."""
        if point not in FAULT_POINTS:
            raise ValueError(f"unknown fault point {point!r}; known: {sorted(FAULT_POINTS)}")
        self._points[point] = _Armed(error, after, times)
        self.armed = True

    def disarm(self, point: str | None = None) -> None:
        """Disarm ``point`` (None: every point) and forget the counts."""
        if point is None:
            self._points.clear()
            self.hits.clear()
        else:
            self._points.pop(point, None)
        self.armed = bool(self._points)

    def check(self, point: str, path: str = "") -> None:
        """Raise the armed ``OSError`` if ``point`` is due to fail now (see :meth:`arm`); else nothing."""
        armed = self._points.get(point)
        if armed is None:
            return
        if armed.after > 0:
            armed.after -= 1
            return
        if armed.times > 0:
            armed.times -= 1
            if armed.times == 0:
                self.disarm(point)
        self.hits[point] = self.hits.get(point, 0) + 1
        raise OSError(armed.error, f"{os.strerror(armed.error)} (fault point {point})", path or None)

    def check_write(self, fd: int, parts: Sequence[memoryview | bytes | bytearray], path: str = "") -> None:
        """The two write points: ``segment.write`` fails before a byte is written; ``segment.write.torn``
        writes the first half of the bytes of ``parts`` to ``fd`` and then fails, as a short write followed
        by ENOSPC does."""
        self.check("segment.write", path)
        if "segment.write.torn" not in self._points:
            return
        data = b"".join(bytes(part) for part in parts)
        try:
            self.check("segment.write.torn", path)
        except OSError:
            os.write(fd, data[: len(data) // 2])
            raise


DISK_FAULTS: Final = DiskFaults()
