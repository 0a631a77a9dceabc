"""Writers on demand: a partition's writer process runs only while the partition is being written.

Theory of operation
-------------------
The supervisor keeps, for every partition it serves, the log recovered, the state page and the doorbell
(``appliance.server.partitions``); readers need nothing more: local consumers, the broker's ``sendfile``
fetches, followers, ``metadata`` and ``appliance status`` read the files and the state page, which stays as
the last writer left it.  Only appending needs the writer, so :class:`WriterDemand` starts it when a
producer needs it and stops it when none has for ``appliance.writer.idle.ms``::

    not running ──attach (a producer's ring)──> queued ──a loop turn──> running ──rings gone, idle.ms,
         ^                                                                |        asleep──> stopping
         │                    next due (heap) ──> queued, quick exit ─────┘                    |
         └──── exit (clean: its next due scheduled; a ring attached meanwhile: queued again) ──┘

* **Start.**  ``attach`` / ``attach_many`` (a local producer, or the broker for a Kafka Produce) create the
  ring and answer at once; the partition is queued (:meth:`WriterDemand.need`) and the supervisor forks the
  queued writers a few per loop turn (at most :data:`STARTS_PER_TURN`, and no more once
  :data:`STARTS_BUDGET_S` of the turn went to forking), so a first produce to a thousand partitions does
  not hold the control socket while a thousand processes are forked: every control request (the broker's
  attaches and detaches among them) waits for at most one such slice.  Frames published meanwhile wait
  in the ring, and the doorbell keeps its posts: a new writer drains every ring it is handed before it
  first sleeps.  A writer that crashed is restarted with the supervisor's back-off as before; a writer told
  to stop for good (shutdown, topic deletion) is never started again.
* **Rings attached ahead.**  A producer attaching rings to more partitions than it writes now (the broker's
  and the local Producer's attach-ahead, ``attach_many``'s ``ahead``) does not start their writers: such a
  partition is *held* (:meth:`WriterDemand.hold`), its ring created with the doorbell posted by the first
  frame published (``ipc.ring_setup``), and the supervisor looks at the held partitions' doorbells every
  :data:`HELD_POLL_S` while any is held: a post (:attr:`~ipc.wakeup.Doorbell.pending`) with a frame at the
  head of one of its rings (a post alone may be a producer closing its ring) queues the writer like an
  attach.  A held partition whose ahead rings are let go unused has them unlinked without a writer
  (``appliance.server.rings``).
* **Stop.**  The supervisor owns the ring table, so the decision has no race with an attach: a running
  writer whose partition has had no ring for ``appliance.writer.idle.ms`` and whose state page says it
  sleeps (``writer_busy_ms`` negative) is sent the clean stop (``{"op": "stop", "idle": true}``: drain,
  snapshot the producer state, close with the clean-shutdown marker), :meth:`WriterDemand.check`, once a
  second, at most :data:`IDLE_STOPS_AT_ONCE` at a time: a clean stop fsyncs the log, its indexes, the
  checkpoint, the producer-state snapshot and the clean-shutdown marker, and a few hundred writers going idle
  together (a producer of a wide topic closing) would queue their fsyncs behind each other in the file
  system's journal, each stop lasting for as long as all of them, with the supervisor's own writes stalled
  behind; the others wait (longest idle first) and the next takes the slot a stopping writer frees as it
  exits, so each stop is timed from its own start.  That exit is not a crash: no restart, no back-off, a
  debug line.  Once told to stop, a writer gets no other command (``Partition.tell_writer``); a ring
  attached meanwhile is handed to a new writer started when the old one has exited (its log lock is free
  then: one writer per log).  A stopping writer that has not exited after ``appliance.shutdown.timeout.ms``
  is killed; the next writer recovers its log.
* **Timers of a partition with no writer.**  A stopping writer reports when its log next needs it
  (``{"op": "next_due", "in_ms": ...}``: retention by time, ``appliance.server.writer_timers``), and so does
  recovery at start-up for every log (``Partition.idle_due_in_ms``).  The supervisor keeps these deadlines
  in a heap; at one it starts the writer with ``run_timers``, and when the writer answers ``timers_done``
  with still no ring attached it is stopped at once rather than after the idle time.  :meth:`WriterDemand.
  wake` is the same start for anything that changes what a log has due (a topic's settings altered).

``appliance.writer.idle.ms`` = -1 keeps the writers resident: every served partition's writer is started
with the supervisor (or its topic) and never stopped for idleness.  0 stops a writer as soon as its last
ring is let go (it has just drained it; the stop is queued behind that).
"""

from __future__ import annotations

import heapq
import logging
import signal
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from appliance.server.children import Child, kill_quietly
from appliance.server.partitions import Partition
from ipc.ring import ring_has_frames

__all__ = ["HELD_POLL_S", "IDLE_STOPS_AT_ONCE", "STARTS_BUDGET_S", "STARTS_PER_TURN", "WriterDemand"]

STARTS_PER_TURN: Final = 16  # the most queued writers forked per loop turn; control requests served between
STARTS_BUDGET_S: Final = 0.05  # a turn forks no further writer once its forks took this long (at least one)
HELD_POLL_S: Final = 0.02  # how often the doorbells of partitions with rings attached ahead are looked at
IDLE_STOPS_AT_ONCE: Final = 8  # the most writers stopping for idleness at a time (each clean stop fsyncs)

_log = logging.getLogger("appliance.supervisor")

_Key = tuple[str, int]


@dataclass
class _Demand:
    """What the supervisor knows of one partition's need for a writer."""

    part: Partition
    idle_since_s: float = 0.0  # when it last had no ring, or its writer started
    idle_stop_s: float | None = None  # when its running writer was told to stop for idleness
    quick_exit: bool = False  # started for its timers: stopped when they ran, unless a ring came
    due_in_ms: int | None = None  # what the writer reported at its stop
    due_s: float | None = None  # the deadline in the heap (monotonic), if one is


class WriterDemand:
    """Which writers run, which are queued to start, when an idle one stops and a stopped one is next due.
    See the module docstring; ``spawn`` forks a partition's writer (the supervisor's)."""

    def __init__(self, spawn: Callable[[Partition], None], *, idle_ms: int, stop_timeout_ms: int,
                 retention_check_interval_ms: int) -> None:  # fmt: skip
        self._spawn = spawn
        self.resident = idle_ms < 0
        self._idle_s = max(idle_ms, 0) / 1000
        self._stop_timeout_s = stop_timeout_ms / 1000
        self._retry_ms = retention_check_interval_ms
        self._demand: dict[_Key, _Demand] = {}
        self._running: dict[int, _Demand] = {}  # by writer pid
        self._queue: deque[_Key] = deque()
        self._queued: set[_Key] = set()
        self._heap: list[tuple[float, _Key]] = []
        self._held: dict[_Key, tuple[Partition, int]] = {}  # rings attached ahead: the doorbell posts seen
        self._next_held_poll_s = 0.0
        self._to_stop: deque[tuple[_Demand, bool]] = deque()  # idle writers waiting for a stop slot (and
        # whether they must still be seen asleep then), longest idle first
        self._stopping: set[int] = set()  # pids of the writers told to stop for idleness, not exited yet

    # -- partitions served ----------------------------------------------------------------------------------

    def register(self, part: Partition) -> None:
        """A partition is served from now on (recovered at start-up, or of a new topic)."""
        key = (part.topic, part.partition)
        self._demand[key] = _Demand(part, idle_since_s=time.monotonic())
        if not part.offline and not self.resident and part.idle_due_in_ms is not None:
            self._schedule(self._demand[key], part.idle_due_in_ms)

    def forget(self, part: Partition) -> None:
        """The partition is no longer served (its topic was deleted; its writer has stopped)."""
        key = (part.topic, part.partition)
        self._demand.pop(key, None)
        self._queued.discard(key)
        self._held.pop(key, None)

    def stop_for_good(self, part: Partition) -> None:
        """The supervisor stops this writer itself (shutdown, deletion): nothing here starts it again."""
        key = (part.topic, part.partition)
        self._queued.discard(key)
        demand = self._demand.get(key)
        self._stopping.discard(part.writer.pid)
        if demand is not None:
            demand.idle_stop_s = None
            demand.quick_exit = False
            demand.due_s = None

    # -- starting -------------------------------------------------------------------------------------------

    def need(self, part: Partition) -> None:
        """A producer attached a ring: start the writer unless it runs, is restarting or being stopped for
        good (one stopping for idleness is followed by a new one at its exit)."""
        key = (part.topic, part.partition)
        demand = self._demand.get(key)
        self._held.pop(key, None)
        if demand is not None:
            demand.quick_exit = False  # a producer came: the writer stays for the idle time
        child = part.writer
        if part.offline or child.pid or child.restart_at_s is not None or child.stopping:
            return
        self._enqueue(key)

    def hold(self, part: Partition) -> None:
        """A producer attached a ring ahead of need: the writer starts at its first frame (module
        docstring), unless something else needs it first."""
        key = (part.topic, part.partition)
        if key in self._demand and not part.writer.pid and key not in self._queued and key not in self._held:
            self._held[key] = (part, 0)

    def _poll_held(self, now: float) -> None:
        """Queue the writers of held partitions whose doorbell was posted and that have a frame (a post
        alone may be a producer closing its ring, or an old one: its rings are looked at once a post);
        forget those with no ring left."""
        if now < self._next_held_poll_s:
            return
        self._next_held_poll_s = now + HELD_POLL_S
        for key, (part, seen) in list(self._held.items()):
            if part.writer.pid or key in self._queued or not part.rings:
                del self._held[key]
                continue
            posts = part.doorbell.pending
            if posts <= seen:
                continue
            self._held[key] = (part, posts)
            if any(ring_has_frames(r.names) for r in part.rings.values()):
                del self._held[key]
                self.need(part)

    def wake(self, part: Partition) -> None:
        """Run the partition's timers now (its next due came, or what it has due changed: the hook for a
        topic whose settings are altered): a running writer is told ``run_timers``, a stopped one is
        started for them and stopped again when they ran."""
        demand = self._demand.get((part.topic, part.partition))
        child = part.writer
        if demand is None or part.offline or child.restart_at_s is not None:
            return
        if child.pid:
            part.tell_writer({"op": "run_timers"})  # not delivered to a stopping one: it reports anew
            return
        if child.stopping:
            return
        demand.quick_exit = True
        self._enqueue((part.topic, part.partition))

    def start_queued(self) -> None:
        """Fork queued writers: up to :data:`STARTS_PER_TURN`, until :data:`STARTS_BUDGET_S` has passed."""
        begun = time.monotonic()
        if self._held:
            self._poll_held(begun)
        for _ in range(min(STARTS_PER_TURN, len(self._queue))):
            if time.monotonic() - begun >= STARTS_BUDGET_S:
                return
            key = self._queue.popleft()
            if key not in self._queued:
                continue  # forgotten or stopped for good meanwhile
            self._queued.discard(key)
            demand = self._demand.get(key)
            if demand is not None and not demand.part.writer.pid and not demand.part.writer.stopping:
                self._spawn(demand.part)

    def started(self, part: Partition) -> None:
        """The supervisor forked the partition's writer (first start, on demand, or a restart)."""
        demand = self._demand.get((part.topic, part.partition))
        if demand is None:
            return
        self._running[part.writer.pid] = demand
        demand.idle_since_s = time.monotonic()
        demand.due_s = None  # a running writer keeps its own timers; it reports the next due at its stop
        demand.due_in_ms = None
        if demand.quick_exit:
            part.tell_writer({"op": "run_timers"})

    def running_part(self, pid: int) -> Partition | None:
        """The partition whose running writer has ``pid``."""
        demand = self._running.get(pid)
        return None if demand is None else demand.part

    def running_partitions(self) -> dict[_Key, Partition]:
        """The partitions whose writer runs (stopping ones included), by (topic, partition)."""
        return {(d.part.topic, d.part.partition): d.part for d in self._running.values()}

    def next_deadline_s(self) -> float | None:
        """When the supervisor's loop must turn next for this: now if writers are queued, else the heap's
        first deadline (stale entries included: they cost one turn) or the next look at held partitions."""
        if self._queue:
            return time.monotonic()
        due = self._heap[0][0] if self._heap else None
        if self._held:
            due = self._next_held_poll_s if due is None else min(due, self._next_held_poll_s)
        return due

    # -- what the writers report ----------------------------------------------------------------------------

    def on_message(self, part: Partition, message: dict[str, Any]) -> None:
        """A report of the partition's writer (``next_due``, ``timers_done``); others are not ours."""
        demand = self._demand.get((part.topic, part.partition))
        if demand is None:
            return
        op = message.get("op")
        if op == "next_due":
            in_ms = message.get("in_ms")
            demand.due_in_ms = in_ms if isinstance(in_ms, int) else None
        elif op == "timers_done" and demand.quick_exit and not part.rings and not part.writer.stopping:
            self._offer_stop(demand)

    def rings_changed(self, part: Partition) -> None:
        """A ring of the partition was let go: the idle time counts from its last one."""
        demand = self._demand.get((part.topic, part.partition))
        if demand is None or part.rings:
            return
        demand.idle_since_s = time.monotonic()
        if self._idle_s == 0 and not self.resident and part.writer.pid and not part.writer.stopping:
            self._offer_stop(demand)  # writer.idle.ms 0: at once (or at the next free stop slot)

    def exited(self, child: Child, clean: bool, how: str) -> bool:
        """A writer exited (called before ``child.pid`` is cleared).  True if it was stopped for idleness:
        then it is handled here (a ring attached meanwhile starts a new one; else its next due is
        scheduled) and the supervisor neither restarts it nor counts a death."""
        demand = self._running.pop(child.pid, None)
        slot = child.pid in self._stopping
        self._stopping.discard(child.pid)
        try:
            return self._exited(demand, child, clean, how)
        finally:
            if slot:
                self._stop_next()  # the next idle writer takes the stop slot freed

    def _exited(self, demand: _Demand | None, child: Child, clean: bool, how: str) -> bool:
        if demand is None or demand.idle_stop_s is None:
            return False
        part = demand.part
        demand.idle_stop_s = None
        demand.quick_exit = False
        child.stopping = False
        if clean:
            _log.debug("writer %s stopped: no producer attached", part.name)
        else:
            _log.warning("writer %s %s as it stopped for idleness; the next writer recovers its log",
                         part.name, how)  # fmt: skip
        if part.queued or any(not r.ahead or r.detaching or ring_has_frames(r.names)
                              for r in part.rings.values()):  # fmt: skip
            self._enqueue((part.topic, part.partition))  # attached (or a command queued) while it stopped
            return True
        if part.rings:  # only rings attached ahead: their first frame starts the writer
            self._held[(part.topic, part.partition)] = (part, 0)
        due_in_ms = demand.due_in_ms if clean else self._retry_ms
        if due_in_ms is not None:
            self._schedule(demand, due_in_ms)
        return True

    # -- the supervisor's clock -----------------------------------------------------------------------------

    def check(self) -> None:
        """Once a second: stop the running writers idle long enough (at most :data:`IDLE_STOPS_AT_ONCE`
        at a time, the others as those exit); kill one that does not stop; start the partitions whose next
        due has come."""
        now = time.monotonic()
        self._fire_due(now)
        if self.resident:
            return
        idle: list[_Demand] = []
        for demand in list(self._running.values()):
            part = demand.part
            child = part.writer
            if demand.idle_stop_s is not None:
                if now - demand.idle_stop_s > self._stop_timeout_s:
                    _log.error("writer %s (pid %d) did not stop in %.0f s after it was told to (idle); "
                               "killing it", part.name, child.pid, self._stop_timeout_s)  # fmt: skip
                    demand.idle_stop_s = now  # once
                    kill_quietly(child.pid, signal.SIGKILL)
                continue
            if self._stoppable(demand, now):
                idle.append(demand)
        idle.sort(key=lambda d: d.idle_since_s)
        self._to_stop = deque((demand, True) for demand in idle)
        self._stop_next()

    def _stoppable(self, demand: _Demand, now: float, *, asleep: bool = True) -> bool:
        """Whether the partition's running writer is to be stopped for idleness now: no ring, idle for the
        idle time (or started for its timers only), asleep with its log open (unless ``asleep`` is False:
        it has just drained its last ring or run its timers)."""
        part = demand.part
        child = part.writer
        if self._running.get(child.pid) is not demand or child.stopping or child.stall_killed or part.rings:
            return False
        if not asleep:  # still started for its timers only, or writer.idle.ms 0
            return demand.quick_exit or self._idle_s == 0
        if not demand.quick_exit and now - demand.idle_since_s < self._idle_s:
            return False
        page = part.page
        return page.writer_pid == child.pid and page.writer_busy_ms < 0  # opened its log, and asleep

    def _offer_stop(self, demand: _Demand) -> None:
        """Stop this idle writer as soon as a stop slot is free."""
        self._to_stop.appendleft((demand, False))
        self._stop_next()

    def _stop_next(self) -> None:
        """Tell idle writers to stop while fewer than :data:`IDLE_STOPS_AT_ONCE` are stopping.  A clean stop
        fsyncs the log, its indexes, checkpoints and snapshot; hundreds at once queue behind each other in
        the file system's journal (and stall the supervisor's own writes), so each stop is timed from its
        own start and is short."""
        now = time.monotonic()
        while self._to_stop and len(self._stopping) < IDLE_STOPS_AT_ONCE:
            demand, asleep = self._to_stop.popleft()
            if self._stoppable(demand, now, asleep=asleep):
                self._stop_idle(demand, now)

    def _stop_idle(self, demand: _Demand, now: float) -> None:
        part = demand.part
        part.writer.stopping = True
        demand.idle_stop_s = now
        self._stopping.add(part.writer.pid)
        _log.debug("writer %s (pid %d) told to stop: no producer attached", part.name, part.writer.pid)
        part.tell_writer({"op": "stop", "idle": True, "timeout_ms": int(self._stop_timeout_s * 800)})

    def _fire_due(self, now: float) -> None:
        while self._heap and self._heap[0][0] <= now:
            due_s, key = heapq.heappop(self._heap)
            demand = self._demand.get(key)
            if demand is None or demand.due_s != due_s:
                continue  # stale: forgotten, started since, or rescheduled
            demand.due_s = None
            self.wake(demand.part)

    def _schedule(self, demand: _Demand, in_ms: int) -> None:
        demand.due_s = time.monotonic() + in_ms / 1000
        heapq.heappush(self._heap, (demand.due_s, (demand.part.topic, demand.part.partition)))

    def _enqueue(self, key: _Key) -> None:
        if key not in self._queued:
            self._queued.add(key)
            self._queue.append(key)

    @property
    def running(self) -> int:
        """Writers running now."""
        return len(self._running)
