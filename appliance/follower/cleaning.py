"""The replica's cleaner: a thread of ``appliance replica`` that compacts the follower logs it holds.

Theory of operation
-------------------
Kafka runs its log cleaner on every broker, over every replica the broker holds, leader or follower.  A
follower here copies the leader's bytes at the leader's offsets; without a cleaner of its own, what it
copied before the leader cleaned it would stay uncleaned here for good.  So each replica process runs one
:class:`FollowerCleaner` thread (with ``log.cleaner.enable``, the default), the same decisions as the
cleaner process of ``appliance serve`` (``appliance.cleaner``), on its own logs:

* **which log, up to where**: every followed partition of a topic whose ``cleanup.policy`` holds
  ``compact`` in this replica's own ``topics.json`` (the settings the leader's copy gives it) is listed as
  an ``appliance.cleaner.log_view.LogView`` and measured and picked by ``appliance.cleaner.choice``
  (``min.cleanable.dirty.ratio``, ``min.compaction.lag.ms``, ``max.compaction.lag.ms``); the cleanable bound
  is below the **follower's** high watermark (the fetcher's) and its active segment;
* **the pass**: ``appliance.cleaner.process.clean_pass`` (``storage.cleaner.clean_log``: the offset map
  within ``log.cleaner.dedupe.buffer.size``, ``delete.retention.ms``, the ``cleaner-offset-checkpoint`` in
  the follower's directory), its reads and writes throttled to ``log.cleaner.io.max.bytes.per.second``
  (``appliance.cleaner.throttle``, one for the process);
* **the swap**: this process owns its logs, so the thread swaps itself (``Log.swap_cleaned``) holding the
  partition's :class:`replicas.log_guard.LogGuard` lock, which the fetcher holds for every append,
  truncation and log start move: a swap lands between two appends.  It is refused (the pass ends, its
  ``.cleaned`` files are unlinked, the log is measured again next round) when the replaced segments are no
  longer consecutive closed segments of those sizes (``appliance.server.writer_admin.check_replaced``:
  retention, a truncation, the leader's log start moved) or the log is closing;
* **cuts**: a truncation below the follower's high watermark stops the pass in progress first
  (``LogGuard.cutting``): the pass checks between segments and ends (``PassStopped``).

A SIGKILL of the replica at any point of a pass leaves what a SIGKILL of the cleaner process leaves: at
most ``*.cleaned`` files and an interrupted swap, which ``Log.open`` (the replica's next start) finishes or
undoes (``storage.clean_swap``), and a checkpoint behind the swaps (the next pass cleans those segments
again, to the same result).

The thread runs at nice :data:`appliance.cleaner.process.NICENESS` (Linux lets a thread have its own); it
shares the process's interpreter with the fetchers.  Between rounds with nothing to clean it sleeps
``log.cleaner.backoff.ms``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

from appliance.cleaner.choice import Dirt, dirtiest
from appliance.cleaner.log_view import LogView
from appliance.cleaner.process import NICENESS, CleanRefusedError, clean_pass
from appliance.cleaner.throttle import Throttle
from appliance.config.server_config import Config, TopicConfig
from appliance.server.writer_admin import check_replaced
from replicas.fetcher import PartitionFetcher
from replicas.log_guard import LogGuard, PassStopped
from storage.cleaner import CleanResult
from storage.errors import CorruptRecordError, describe_os_error
from storage.log import Log

__all__ = ["CleanTarget", "FollowerCleaner"]

_JOIN_TIMEOUT_S: Final = 10.0

_log = logging.getLogger("appliance.replica")


@dataclass(frozen=True, eq=False)
class CleanTarget:
    """One followed partition as the cleaner needs it: its log, the guard it shares with its fetcher, the
    fetcher (its high watermark) and the topic's settings."""

    name: str
    log: Log
    guard: LogGuard
    fetcher: PartitionFetcher
    settings: TopicConfig


class FollowerCleaner:
    """The cleaner thread of one replica process (see the module docstring).  ``targets`` lists the
    followed partitions now (called from the thread)."""

    def __init__(self, config: Config, node_id: int, targets: Callable[[], Sequence[CleanTarget]]) -> None:
        self.config = config
        self.who = f"cleaner of replica {node_id}"
        self._targets = targets
        self._throttle = Throttle(config.cleaner_io_max_bytes_per_second)
        self._stop = threading.Event()
        self._uncleanable: set[str] = set()
        self._thread: threading.Thread | None = None
        self.passes = 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="cleaner", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread: a pass in progress ends at its next segment (nothing of it swapped after)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(_JOIN_TIMEOUT_S)
            if self._thread.is_alive():
                _log.error("%s: did not stop in %.0f s", self.who, _JOIN_TIMEOUT_S)

    def _run(self) -> None:
        with contextlib.suppress(OSError):  # Linux: a thread has its own nice value
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), NICENESS)
        _log.info("%s: started (dedupe buffer %d bytes, backoff %d ms)", self.who,
                  self.config.cleaner_dedupe_buffer_size, self.config.cleaner_backoff_ms)
        while not self._stop.is_set():
            try:
                result = self.round()
            except Exception:  # a bug must not end the cleaning of every other log
                _log.exception("%s: a round failed", self.who)
                result = None
            if result is None:
                self._stop.wait(self.config.cleaner_backoff_ms / 1000)

    def round(self) -> CleanResult | None:
        """Measure every compacted followed partition and clean the one picked; its result, or None."""
        now_ms = time.time_ns() // 1_000_000
        compacted = (t for t in self._targets()
                     if "compact" in t.settings.cleanup_policy and t.name not in self._uncleanable)
        views = ((target, self._view(target)) for target in compacted)
        chosen = dirtiest(((t, view, t.settings) for t, view in views if view is not None), now_ms)
        return None if chosen is None else self._clean(*chosen, now_ms)

    def _clean(self, target: CleanTarget, view: LogView, dirt: Dirt, now_ms: int) -> CleanResult | None:
        guard = target.guard

        def io_throttle(nbytes: int) -> None:
            if self._stop.is_set():
                raise PassStopped("the replica is stopping")
            guard.check_cut()
            self._throttle(nbytes)

        with guard.cleaning():
            try:
                result = clean_pass(self.who, target.name, view, dirt, now_ms=now_ms, config=self.config,
                                    delete_retention_ms=target.settings.delete_retention_ms,
                                    io_throttle=io_throttle)  # fmt: skip
            except PassStopped as exc:
                _log.info("%s: %s: pass stopped: %s; measured again next round", self.who, target.name, exc)
                return None
            except CorruptRecordError as exc:
                self._uncleanable.add(target.name)
                _log.error("%s: %s is not cleaned until the replica restarts: %s", self.who, target.name, exc)
                return None
        if result is not None:
            self.passes += 1
        return result

    def _view(self, target: CleanTarget) -> LogView | None:
        """The log as listed now, holding the guard's lock (None: closing, or a segment went)."""
        log = target.log
        with target.guard.lock:
            if target.guard.closed:
                return None
            segments = log.segments
            start, end = log.log_start_offset, log.log_end_offset
            high_watermark = target.fetcher.high_watermark
        try:  # a closed segment's newest record: when it was appended here (as the cleaner process sees it)
            infos = [s if s.is_active else s._replace(max_timestamp=os.stat(s.path).st_mtime_ns // 1_000_000)
                     for s in segments]
        except FileNotFoundError:
            return None  # deleted meanwhile (retention, a truncation): next round
        return LogView(log.directory, log.config, log.topic_partition, start, end, high_watermark, infos,
                       lambda base, replaced, sizes: self._swap(target, base, replaced, sizes))

    def _swap(self, target: CleanTarget, base_offset: int, replaced: Sequence[int],
              sizes: Sequence[int]) -> None:
        """Swap a cleaned group in, holding the guard's lock; :class:`CleanRefusedError` if the log changed
        under the pass or is closing."""
        log = target.log
        with target.guard.lock:
            if target.guard.closed:
                raise CleanRefusedError(f"partition {target.name} is closing; the segment cleaned at "
                                        f"{base_offset} is not swapped in")
            segments = log.segments
            bases = [s.base_offset for s in segments]
            size_of = {s.base_offset: s.size_bytes for s in segments}
            refused = check_replaced(log.directory, bases, target.name, base_offset, replaced, sizes,
                                     lambda base: size_of[base])
            if refused is not None:
                raise CleanRefusedError(refused)
            try:
                log.swap_cleaned(base_offset, replaced)
            except OSError as exc:  # finished or undone on the spot by the log; the pass ends
                raise CleanRefusedError(f"partition {target.name}: swapping in the segment cleaned at "
                                        f"{base_offset}: {describe_os_error(exc)}") from None

