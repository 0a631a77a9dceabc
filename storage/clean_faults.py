"""Named fault points of a clean: the seam through which a test stops a clean at a chosen step.

Theory of operation
-------------------
Every step of a clean that changes files (``storage.cleaner`` writing the cleaned segment,
``storage.clean_swap`` swapping it in) calls :meth:`CleanFaults.check` with its point's name first
(``if CLEAN_FAULTS.armed:`` guards it, so a clean pays one attribute load).  A test arms a point
(:meth:`CleanFaults.arm`) with what should happen there: ``"error"`` raises ``OSError(EIO)`` (a failed
step: the clean stops, the log stays valid), ``"kill"`` sends the process SIGKILL (a crash at exactly that
step: the next ``Log.open`` recovers).

The points (:data:`FAULT_POINTS`), in the order a clean meets them:

``clean.write``      while writing ``<base>.log.cleaned``, after its first part
``clean.cleaned``    the swap's cleaned segments and their indexes are written (``*.cleaned``), nothing
                     renamed yet
``clean.deleted``    every group's replaced segments' files are renamed ``*.deleted``
``clean.indexes``    once a group: its cleaned indexes are renamed ``*.swap``, its cleaned ``.log`` not yet
                     (that group uncommitted; the groups before it committed, those after it not)
``clean.swap``       once a group: its ``<base>.log.swap`` exists: that group is committed, the groups
                     after it not yet (``after=k`` lands between the k-th and the next group's commit)
``clean.committed``  every group of the swap is committed and the directory fsynced
``clean.unlinked``   the ``*.deleted`` files are unlinked
``clean.installed``  the swap files are renamed into place
``clean.checkpoint`` before ``cleaner-offset-checkpoint`` is written

A process has one registry, :data:`CLEAN_FAULTS`; nothing outside tests arms it.
"""

from __future__ import annotations

import errno
import os
import signal
from typing import Final

__all__ = ["CLEAN_FAULTS", "FAULT_POINTS", "CleanFaults"]

FAULT_POINTS: Final = ("clean.write", "clean.cleaned", "clean.deleted", "clean.indexes", "clean.swap",
                       "clean.committed", "clean.unlinked", "clean.installed", "clean.checkpoint")
ACTIONS: Final = frozenset({"error", "kill"})


class CleanFaults:
    """The clean's fault points in this process (see the module docstring)."""

    __slots__ = ("_points", "armed")

    def __init__(self) -> None:
        self._points: dict[str, tuple[str, int]] = {}  # point -> (action, calls to let through first)
        self.armed = False

    def arm(self, point: str, action: str = "error", *, after: int = 0) -> None:
        """Make the ``after``-th next call at ``point`` (0: the next one) do ``action`` (once)."""
        if point not in FAULT_POINTS:
            raise ValueError(f"unknown clean fault point {point!r}; known: {list(FAULT_POINTS)}")
        if action not in ACTIONS:
            raise ValueError(f"unknown fault action {action!r}; known: {sorted(ACTIONS)}")
        self._points[point] = (action, after)
        self.armed = True

    def disarm(self) -> None:
        self._points.clear()
        self.armed = False

    def check(self, point: str, path: str = "") -> None:
        """Do what is armed at ``point``, if it is due now; else nothing."""
        armed = self._points.get(point)
        if armed is None:
            return
        action, after = armed
        if after > 0:
            self._points[point] = (action, after - 1)
            return
        del self._points[point]
        self.armed = bool(self._points)
        if action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        raise OSError(errno.EIO, f"{os.strerror(errno.EIO)} (fault point {point})", path or None)


CLEAN_FAULTS: Final = CleanFaults()
