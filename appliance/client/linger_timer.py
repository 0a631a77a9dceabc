"""The producer's one background thread: runs a round under the producer's lock at the next deadline.

Theory of operation
-------------------
The producer's caller thread does almost everything (appending, sealing full batches, publishing, reading
acks).  What it cannot do is act when it is not called: seal a batch whose ``linger.ms`` ran out, read the
acks of batches in flight so that callbacks run while the caller is busy elsewhere, or publish a batch held
back for lack of an in-flight slot as soon as an ack frees one.  A
:class:`RoundTimer` does that: its thread takes the producer's lock, calls ``round(now_ns)``, which does the
work and returns when it wants to run next (monotonic ns; -1: only when poked), and sleeps until then.

Waking it early: :meth:`RoundTimer.wake_by` (called with the producer's lock held) pokes the thread when the
new deadline is earlier than the one it planned.  The plan is written under the same lock the caller
holds, and a poke is a flag kept until the thread looks, so a poke that arrives between the round and the
sleep is not lost.  The thread starts with the first deadline (the producer's first batch), so a producer
that never sends never has one.  It never sleeps on a ring's semaphore: only the caller's thread does.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager

__all__ = ["RoundTimer"]

_log = logging.getLogger("appliance.producer")
_RETRY_NS = 10_000_000


class RoundTimer:
    """A daemon thread calling ``round(now_ns) -> next_ns`` under ``lock``.  See the module docstring."""

    def __init__(self, lock: AbstractContextManager[object], round: Callable[[int], int], name: str) -> None:
        self._lock = lock
        self._round = round
        self._name = name
        self._thread: threading.Thread | None = None
        self._wakeup = threading.Condition(threading.Lock())
        self._plan = 0  # monotonic ns of the next round (-1: only when poked); written under ``lock``
        self._poked = False
        self._stopped = False

    def wake_by(self, deadline_ns: int) -> None:
        """Make sure a round runs by ``deadline_ns`` (call with ``lock`` held)."""
        if self._thread is None:
            if not self._stopped:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            return
        if self._plan < 0 or self._plan > deadline_ns:
            self._plan = deadline_ns
            self._poke()

    def _poke(self) -> None:
        with self._wakeup:
            self._poked = True
            self._wakeup.notify()

    def _run(self) -> None:
        while True:
            with self._lock:
                if self._stopped:
                    return
                now = time.monotonic_ns()
                try:
                    next_ns = self._round(now)
                except Exception:  # a bug here must not stop lingering batches from being sent
                    _log.exception("%s: round failed; retrying in 10 ms", self._name)
                    next_ns = now + _RETRY_NS
                self._plan = next_ns
            with self._wakeup:
                if not self._poked:
                    timeout = None if next_ns < 0 else max(next_ns - time.monotonic_ns(), 0) / 1e9
                    self._wakeup.wait(timeout)
                self._poked = False

    def stop(self) -> None:
        """End the thread (after its current round) and wait for it, unless called from it."""
        self._stopped = True
        self._poke()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()
