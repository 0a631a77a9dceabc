"""Which partition writers are stuck, read from shared memory without waking any of them.

Theory of operation
-------------------
A writer costs nothing while it sleeps: it stores no heartbeat.  Its state page's ``writer_busy_ms``
(``ipc.state_page``) says what it does: the monotonic ms its current work began (stored when it wakes, and
at most every 10 ms while rounds stream), or minus the ms it went to sleep on its doorbell.  A writer is
*stuck* when, for longer than the stall limit (``WRITER_STALL_S`` of ``appliance.server.supervisor``):

* it has been busy since the same moment -- a round, a timer or a command takes milliseconds, so it is
  blocked (a write that never returns, a lock, a loop); or
* it sleeps, and its doorbell holds a post it has not taken (``Doorbell.pending``): a producer published
  frames, or the supervisor sent a command, and the writer did not wake.  The ring can be seen only at a
  check, so the limit counts from the first check that saw the post with the same "asleep since" word; a
  writer that woke and slept again in between has a new word and starts a new count.

An idle writer whose doorbell nobody rang is healthy however long it sleeps.  A writer that died is not
this module's concern: the supervisor reaps it (SIGCHLD) and restarts it.  The check reads two words and a
semaphore value per partition: no system call, no writer woken.
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable, Iterator, Mapping
from typing import NamedTuple

from appliance.server.children import kill_quietly
from appliance.server.partitions import Partition
from ipc.state_page import monotonic_ms

__all__ = ["LivenessCheck", "Stuck"]

_log = logging.getLogger("appliance.supervisor")


class Stuck(NamedTuple):
    """Why a writer is taken for stuck, and for how long it has been so."""

    what: str
    for_s: float


class LivenessCheck:
    """The stuck-writer check; remembers when it first saw each unanswered doorbell."""

    def __init__(self, stall_s: Callable[[], float]) -> None:
        self._stall_s = stall_s  # read at each check (tests lower the supervisor's limit)
        self._rung: dict[tuple[str, int], tuple[int, float]] = {}  # partition -> (asleep word, first seen)

    def stuck(self, partitions: Mapping[tuple[str, int], Partition]) -> Iterator[tuple[Partition, Stuck]]:
        """The running writers stuck for longer than the limit (each running one, not stopping, not already
        killed, past opening its log)."""
        limit_s = self._stall_s()
        now_ms = monotonic_ms()
        now_s = time.monotonic()
        for key, part in partitions.items():
            verdict = self._judge(key, part, now_ms, now_s)
            if verdict is not None and verdict.for_s > limit_s:
                self._rung.pop(key, None)
                yield part, verdict
        for key in [k for k in self._rung if k not in partitions]:
            del self._rung[key]

    def kill_stuck(self, partitions: Mapping[tuple[str, int], Partition]) -> None:
        """SIGKILL (once) each running writer that is stuck, with one error line; the supervisor restarts
        it as after any death (the new writer recovers the log and answers every published frame)."""
        for part, verdict in self.stuck(partitions):
            _log.error("writer %s (pid %d) %s for %.1f s (limit %.1f s) at log end offset %d: it is stuck; "
                       "killing it and restarting it (the new writer recovers the log and answers every "
                       "published frame)", part.name, part.writer.pid, verdict.what, verdict.for_s,
                       self._stall_s(), part.page.log_end_offset)  # fmt: skip
            part.writer.stall_killed = True
            kill_quietly(part.writer.pid, signal.SIGKILL)

    def _judge(self, key: tuple[str, int], part: Partition, now_ms: int, now_s: float) -> Stuck | None:
        child = part.writer
        page = part.page
        if not child.pid or child.stopping or child.stall_killed or page.writer_pid != child.pid:
            self._rung.pop(key, None)
            return None
        word = page.writer_busy_ms
        if word > 0:
            self._rung.pop(key, None)
            return Stuck("has been busy in one round", (now_ms - word) / 1000)
        if word < 0 and part.doorbell.pending > 0:
            seen = self._rung.get(key)
            if seen is None or seen[0] != word:  # first seen, or it woke and slept again since
                seen = self._rung[key] = (word, now_s)
            return Stuck("has not woken for its rung doorbell", now_s - seen[1])
        self._rung.pop(key, None)
        return None
