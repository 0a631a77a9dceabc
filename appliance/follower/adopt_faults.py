"""Named fault points of an adoption: the seam through which a test stops a replica between its steps.

An adoption (``appliance.follower.adoption``) copies a leader's segment into ``<base>.log.cleaned`` and
swaps it in (``storage.clean_swap``, whose own points are ``storage.clean_faults``).  Before each step that
a crash could interrupt, it calls :meth:`AdoptFaults.check` with the point's name (guarded by
``if ADOPT_FAULTS.armed:``).  A test arms a point in the replica process (:meth:`AdoptFaults.arm`):
``"error"`` raises ``OSError(EIO)`` (the adoption stops, the log stays as it was), ``"kill"`` sends the
process SIGKILL (the next start recovers: ``Log.open`` unlinks the ``*.cleaned`` file).

The points (:data:`FAULT_POINTS`), in the order an adoption meets them:

``adopt.fetched``  the first piece of the leader's segment is written to ``<base>.log.cleaned``
``adopt.copied``   the whole segment is copied, fsynced and checked against the leader's checksum; nothing
                   renamed yet (the swap comes next)

A process has one registry, :data:`ADOPT_FAULTS`; nothing outside tests arms it.
"""

from __future__ import annotations

import errno
import os
import signal
from typing import Final

__all__ = ["ADOPT_FAULTS", "FAULT_POINTS", "AdoptFaults"]

FAULT_POINTS: Final = ("adopt.fetched", "adopt.copied")
ACTIONS: Final = frozenset({"error", "kill"})


class AdoptFaults:
    """The adoption's fault points in this process (see the module docstring)."""

    __slots__ = ("_points", "armed")

    def __init__(self) -> None:
        self._points: dict[str, str] = {}  # point -> action
        self.armed = False

    def arm(self, point: str, action: str = "error") -> None:
        """Make the next call at ``point`` do ``action`` (once)."""
        if point not in FAULT_POINTS:
            raise ValueError(f"unknown adoption fault point {point!r}; known: {list(FAULT_POINTS)}")
        if action not in ACTIONS:
            raise ValueError(f"unknown fault action {action!r}; known: {sorted(ACTIONS)}")
        self._points[point] = action
        self.armed = True

    def check(self, point: str, path: str = "") -> None:
        """Do what is armed at ``point``, if anything."""
        action = self._points.pop(point, None)
        self.armed = bool(self._points)
        if action is None:
            return
        if action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        raise OSError(errno.EIO, f"{os.strerror(errno.EIO)} (fault point {point})", path or None)


ADOPT_FAULTS: Final = AdoptFaults()
