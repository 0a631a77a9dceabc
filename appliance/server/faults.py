"""Named fault points in the supervisor's control operations, armed by a test-only setting.

Theory of operation
-------------------
A control operation that changes several things (the metadata file, the partition table, the directories)
calls :meth:`ControlFaults.hit` between its steps with the step's name.  In production nothing is armed and
``hit`` returns at once.  A test arms points with ``appliance.test.faults`` (``--override
'appliance.test.faults=["delete.stopped"]'``): each entry is ``NAME`` (fire once) or ``NAME:COUNT`` (fire
that many times); an armed point raises :class:`InjectedFault`, an ``OSError`` as the file system would
raise, so the operation meets exactly the error a full or failing disk gives at that step and takes the
path a real failure takes.  A point that has fired its count is spent: a retry then succeeds.

Some points are not errors. A *delay* point, ``NAME:MS``, makes the next operation of its kind slow by ``MS``
milliseconds without blocking the supervisor (:meth:`ControlFaults.delay_ms`; the operation waits in the
supervisor's loop), once (a point listed again delays the operation after, by its own ``MS``).
``attach.slow:MS`` holds the reply to the next ``attach`` or ``attach_many`` for MS milliseconds (the rings
are attached at once; only the answer waits, in the supervisor's loop, which serves everything else
meanwhile: a supervisor too busy to answer soon), once; ``create.slow_reply:MS`` holds the
same way the reply to the next ``create_topic`` answered at once (``"wait": false``, as the broker creates
``__consumer_offsets``). ``create.drop_connection`` closes the control connection a ``create_topic`` request
came on, without a reply and before anything changes (a lost broker-supervisor connection), once or COUNT
times.

The points (:data:`FAULT_POINTS`):

======================= =======================================================================
``metadata.write``      a write of the topic metadata file (ENOSPC: the disk is full)
``create.recorded``     create: the topic is in the metadata file, no partition started yet
``create.partition``    create: one partition is served, the others are not
``partitions.recorded`` add partitions: the new count is in the metadata file, no new partition served
``delete.recorded``     delete: the topic is marked for deletion, its writers still run
``delete.stopped``      delete: the writers stopped, the directories are still there
``delete.removed``      delete: the directories are gone, the metadata file still has the mark
``writer.stall``        a partition writer: its first round blocks after the append, before any
                        acknowledgement, until the writer is killed (:func:`writer_fault_point`)
``create.slow``         (delay, ``create.slow:MS``) create: the partitions start MS ms after recording
``create.drop_connection`` create: the request's connection is closed, nothing recorded
``attach.slow``         (delay, ``attach.slow:MS``) attach: the reply is sent MS ms late
``create.slow_reply``   (delay, ``create.slow_reply:MS``) create, not waiting: the reply is sent MS ms late
``group.store``         the broker's next group metadata append to ``__consumer_offsets`` is refused
                        NOT_ENOUGH_REPLICAS (``appliance.broker.offsets_topic``), once or COUNT times
``writer.unread_records`` every partition writer appends a CreateTime batch without reading its records
                        (its header's maxTimestamp trusted, as a writer before Kafka's LogValidator rule
                        did): bytes a reader must meet (garbage under a valid CRC) reach the log
======================= =======================================================================

``writer.stall`` is not raised by the supervisor: each writer's spec carries the armed list, and the writer
blocks once per partition directory (a marker file, ``.test-writer-stall``, keeps its successor from
blocking again), so a test sees the supervisor find a stuck writer, kill it and restart it.
"""

from __future__ import annotations

import errno
import logging
import os
import time
from collections.abc import Callable, Iterable
from typing import Final

from storage.errors import ConfigError

__all__ = ["DELAY_POINTS", "FAULT_POINTS", "UNREAD_RECORDS", "WRITER_STALL_MARKER", "ControlFaults",
           "InjectedFault", "writer_fault_point"]

WRITER_STALL_MARKER: Final = ".test-writer-stall"
UNREAD_RECORDS: Final = "writer.unread_records"

FAULT_POINTS: Final = frozenset({
    "metadata.write",
    "create.recorded",
    "create.partition",
    "partitions.recorded",
    "delete.recorded",
    "delete.stopped",
    "delete.removed",
    "writer.stall",
    "create.slow",
    "create.drop_connection",
    "attach.slow",
    "create.slow_reply",
    "group.store",
    UNREAD_RECORDS,
})  # fmt: skip
DELAY_POINTS: Final = frozenset({"create.slow", "attach.slow", "create.slow_reply"})  # NAME:MS, once

_ERRNO: Final = {"metadata.write": errno.ENOSPC}  # others: EIO

_log = logging.getLogger("appliance.supervisor")


class InjectedFault(OSError):
    """An armed fault point fired (tests only): handled like the file system error it imitates."""


class ControlFaults:
    """The armed fault points and how many times each still fires."""

    def __init__(self, armed: Iterable[str] = ()) -> None:
        self._remaining: dict[str, int] = {}
        self._delays_ms: dict[str, list[int]] = {}  # per point, the delays of its next operations in order
        for entry in armed:
            name, _, count = entry.partition(":")
            if name not in FAULT_POINTS:
                raise ConfigError(f"appliance.test.faults: unknown fault point {name!r}; known: "
                                  f"{sorted(FAULT_POINTS)}")  # fmt: skip
            try:
                times = int(count) if count else 1
            except ValueError:
                raise ConfigError(f"appliance.test.faults: {entry!r}: expected NAME or NAME:COUNT") from None
            if name in DELAY_POINTS:
                self._delays_ms.setdefault(name, []).append(times)
                continue
            self._remaining[name] = self._remaining.get(name, 0) + times
        if self._remaining or self._delays_ms:
            _log.warning("test fault points armed: %s, delays (ms): %s", self._remaining, self._delays_ms)

    def hit(self, point: str) -> None:
        """Raise :class:`InjectedFault` if ``point`` is armed (and count one firing); else nothing."""
        left = self._remaining.get(point, 0)
        if left <= 0:
            return
        self._remaining[point] = left - 1
        code = _ERRNO.get(point, errno.EIO)
        raise InjectedFault(code, f"{errno.errorcode[code]} at test fault point {point}")

    def fires(self, point: str) -> bool:
        """Whether ``point`` is armed (and count one firing), for points that are not errors."""
        left = self._remaining.get(point, 0)
        if left <= 0:
            return False
        self._remaining[point] = left - 1
        return True

    def delay_ms(self, point: str) -> int:
        """The next delay armed at ``point`` (0 if none); each delay listed is used once, in order."""
        delays = self._delays_ms.get(point)
        return delays.pop(0) if delays else 0


def writer_fault_point(armed: Iterable[str], directory: str) -> Callable[[str], None] | None:
    """The partition writer's fault point for ``appliance.test.faults`` (None when nothing of the writer's
    is armed): with ``writer.stall``, the first ``"appended"`` point reached in ``directory`` blocks."""
    if not any(entry.partition(":")[0] == "writer.stall" for entry in armed):
        return None
    marker = os.path.join(directory, WRITER_STALL_MARKER)

    def fault(point: str) -> None:
        if point != "appended":
            return
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        except FileExistsError:
            return  # fired once for this partition already
        _log.warning("test fault point writer.stall fired in %s: this writer blocks until killed", directory)
        while True:
            time.sleep(3600)

    return fault
