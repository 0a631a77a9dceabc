"""The partition writer's timed work, and the moment it is next due.

Theory of operation
-------------------
A writer with nothing published sleeps on its doorbell (``ipc/wakeup.py``) until a producer or the
supervisor rings it, or until the earliest of these deadlines, computed (:meth:`WriterTimers.due_s`), never
polled:

* ``flush.ms`` -- only while the log holds data past its recovery point (unflushed), ``flush.ms`` after the
  last flush this writer saw (the recovery point moving is a flush; :meth:`WriterTimers.after_round` notes
  it, so an append that flushed by itself pushes the deadline on);
* ``log.retention.check.interval.ms`` -- retention (``Log.delete_retained_segments``; the new log start
  offset is published) and producer-id expiry (``producer.id.expiration.ms``), on one schedule.  Retention
  runs here because a log has exactly one writer process: a second process opening the log to delete
  segments would be refused the lock;
* while the log directory is full (``appliance.server.disk_space``): its next free-space measurement, so
  writes resume without a producer; never otherwise.

``segment.ms`` needs no deadline: as in Kafka, a segment is rolled by the append that finds it too old
(``storage.segment``), and retention never deletes the active segment, so an idle log has nothing to roll.
With none of these due the writer sleeps for :data:`LONGEST_SLEEP_S` at most (a guard, not a tick).

A partition with no writer
--------------------------
A writer runs only while its partition is written (``appliance.server.writer_demand``).  What a log with no
writer still has due is retention by time alone: :func:`idle_due_in_ms` is how long until its oldest closed
segment's largest timestamp is ``retention.ms`` old.  The writer reports it when it stops, the supervisor
computes it for every log it recovers at start-up, and starts the writer then (``run_timers``).  Nothing
else needs a process: a clean stop flushed everything (no ``flush.ms``), no producer writes (no roll, no
full log dir to re-measure), and producer-id expiry is applied when the next writer opens the log, before it
appends anything, which a producer sees exactly as an expiry done on time.  A due that has passed without a
deletion (a replicated partition's high watermark below the segment) is tried again
``log.retention.check.interval.ms`` later: Kafka's granularity stays the bound of the lateness.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Final

from appliance.server.disk_space import DiskSpace
from ipc.state_page import StatePage
from storage.errors import KafkaStorageError, describe_os_error, is_disk_full
from storage.log import Log
from storage.log_config import LONG_MAX
from storage.producer_state import ProducerStateManager

__all__ = ["LONGEST_SLEEP_S", "MIN_IDLE_DUE_MS", "WriterTimers", "idle_due_in_ms"]

LONGEST_SLEEP_S: Final = 3600.0
MIN_IDLE_DUE_MS: Final = 1000  # a partition with no writer is woken no sooner than this after its last one

_log = logging.getLogger("appliance.writer")


class WriterTimers:
    """The timers of one writer: :meth:`due_s` before it sleeps, :meth:`run` when it wakes with nothing to
    drain, :meth:`after_round` after each round."""

    def __init__(self, name: str, log: Log, state_page: StatePage, producer_state: ProducerStateManager,
                 disk: DiskSpace, *, retention_check_interval_ms: int, retention_enabled: bool) -> None:
        self.name = name
        self._log = log
        self._page = state_page
        self._producer_state = producer_state
        self._disk = disk
        self._retention_interval_s = retention_check_interval_ms / 1000
        self._retention_enabled = retention_enabled
        now = time.monotonic()
        self._next_retention_s = now + self._retention_interval_s
        flush_ms = log.config.flush_ms
        self._flush_interval_s = flush_ms / 1000 if flush_ms < LONG_MAX else None
        self._flushed_at_s = now
        self._recovery_point = log.recovery_point

    def after_round(self) -> None:
        """Note a flush the round's append made (the recovery point moved): ``flush.ms`` counts from it."""
        if self._flush_interval_s is not None and self._log.recovery_point != self._recovery_point:
            self._recovery_point = self._log.recovery_point
            self._flushed_at_s = time.monotonic()

    def due_s(self) -> float:
        """The monotonic time of the next timed work (see the module docstring)."""
        due = min(self._next_retention_s, time.monotonic() + LONGEST_SLEEP_S)
        if self._flush_interval_s is not None and self._log.recovery_point < self._log.log_end_offset:
            due = min(due, self._flushed_at_s + self._flush_interval_s)
        recheck_ns = self._disk.recheck_due_ns
        if recheck_ns is not None:
            due = min(due, recheck_ns / 1e9)
        return due

    def run(self) -> None:
        """Do what is due: measure a full log dir again, flush, retention and producer-id expiry."""
        now_ns = time.monotonic_ns()
        now = now_ns / 1e9
        if self._disk.error is not None:
            self._disk.refused(now_ns)  # full: measure again, so writes resume while idle
        try:
            self._flush_if_due(now)
            if now >= self._next_retention_s:
                self._next_retention_s = now + self._retention_interval_s
                self.run_retention()
        except (OSError, KafkaStorageError) as exc:  # a checkpoint on a full disk: tried again next time
            if isinstance(exc, OSError) and not is_disk_full(exc):
                raise
            _log.warning("writer %s: flush put off: %s", self.name,
                         describe_os_error(exc) if isinstance(exc, OSError) else exc)

    def _flush_if_due(self, now: float) -> None:
        if self._flush_interval_s is None or now < self._flushed_at_s + self._flush_interval_s:
            return
        self._flushed_at_s = now  # also when nothing was flushed: the deadline moves on, never spins
        self._log.maybe_flush()
        self._recovery_point = self._log.recovery_point

    def due_when_idle_in_ms(self) -> int | None:
        """How long until this log next needs its writer once it stops (:func:`idle_due_in_ms`)."""
        return idle_due_in_ms(self._log, retention_enabled=self._retention_enabled,
                              retention_check_interval_ms=int(self._retention_interval_s * 1000))

    def run_now(self) -> int:
        """Retention and producer-id expiry at once (the writer was started for them); segments deleted."""
        self._next_retention_s = time.monotonic() + self._retention_interval_s
        return self.run_retention()

    def run_retention(self) -> int:
        """Delete the segments retention allows, publish the log start offset, expire idle producers."""
        deleted = 0
        if self._retention_enabled:
            try:
                deleted = self._log.delete_retained_segments(high_watermark=self._page.high_watermark)
            except OSError as exc:  # the log start offset's checkpoint found no room: nothing was deleted
                if not is_disk_full(exc):
                    raise
                _log.warning("writer %s: retention put off: %s", self.name, describe_os_error(exc))
            if deleted:
                self._page.log_start_offset = self._log.log_start_offset
                _log.info("writer %s: retention deleted %d segments, log start offset now %d",
                          self.name, deleted, self._log.log_start_offset)  # fmt: skip
        self._producer_state.expire(time.time_ns() // 1_000_000)
        return deleted



def idle_due_in_ms(log: Log, *, retention_enabled: bool, retention_check_interval_ms: int,
                   now_ms: int | None = None) -> int | None:
    """How long until retention by time may delete a segment of ``log`` (module docstring, "A partition with
    no writer"): None if never without appends (no closed segment, ``retention.ms`` -1, or retention off)."""
    retention_ms = log.config.retention_ms
    segments = log.segments
    if not retention_enabled or retention_ms < 0 or len(segments) < 2:
        return None
    oldest = segments[0]
    if oldest.max_timestamp >= 0:
        largest_ms = oldest.max_timestamp
    else:  # a segment without timestamps: its file's modification time, as retention reads it
        try:
            largest_ms = int(os.stat(oldest.path).st_mtime * 1000)
        except FileNotFoundError:
            return MIN_IDLE_DUE_MS
    now = time.time_ns() // 1_000_000 if now_ms is None else now_ms
    due_in_ms = largest_ms + retention_ms + 1 - now
    if due_in_ms <= 0:  # due, yet not deleted: retried on Kafka's schedule
        due_in_ms = retention_check_interval_ms
    return max(due_in_ms, MIN_IDLE_DUE_MS)
