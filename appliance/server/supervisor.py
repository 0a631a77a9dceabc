"""The supervisor: the process systemd starts (``appliance serve``) and every other process's parent.

Theory of operation
-------------------
Start-up, in this order (each step needs the previous one)::

    1. load the configuration (defaults, --config FILE, --override KEY=VALUE ...; ``appliance.cli.serve``)
    2. lock every log dir (.appliance.lock) and the instance's shared-memory names (/dev/shm/la-<id>.lock):
       a second appliance on the same data dir, or with the same instance id, stops here
       (``appliance.server.instance``)
    3. reclaim the instance's shared memory a crashed run left (ipc.shm.reclaim)
    4. the cluster id (created at a node's first start: ``appliance.config.cluster_id``); open the topic
       metadata store; finish the topic deletions a failure or crash interrupted
       (``appliance.server.topic_changes``); create the configured topics that are missing
    5. recover every partition log (storage Log.open: torn tails cut, indexes rebuilt) and close it cleanly
       (``appliance.server.partitions``); a log damaged beyond that takes its partition offline alone
    6. load the numba kernels (ipc.ring.warm_up), so the forked writers share them
    7. create each partition's state page (offsets published) and doorbell
    8. bind the control socket (0600, or 0660 with appliance.shm.group)
    9. fork the extra children (the broker, the replicas of appliance.replica.dirs:
       ``appliance.server.children``), after all imports; no writer (with appliance.writer.idle.ms -1:
       one per partition that is not offline, first)
   10. sd_notify READY=1 (after the extra children that asked for it said they are ready)

Then it serves the control socket (``appliance.server.control_ops``), forks a partition's writer when a
producer attaches to it, stops it once nobody has written for ``appliance.writer.idle.ms`` and starts it
again when its retention is due (``appliance.server.writer_demand``), restarts a child that dies (a writer
recovers its log as it opens it; the supervisor logs the exit status or signal and backs off when a child
keeps dying), kills a writer that is stuck (``appliance.server.liveness``: busy in one round, or asleep
through its rung doorbell, for :data:`WRITER_STALL_S`) and restarts it, pings the systemd watchdog, updates
``STATUS=``, and every second retries the topic deletions that have not finished and re-creates the meta
directory's reserve if a full disk took it (``appliance.server.meta_reserve``).

Who writes what: the supervisor owns the topic metadata, producer id allocation, the rings' existence
(create/unlink: ``appliance.server.rings``) and each state page's leader epoch; each writer owns its
partition's log, log end offset, high watermark (replication factor 1), log start offset and liveness word;
producers own their rings' frames.

Stop (SIGTERM or SIGINT): ``STOPPING=1``; the control socket closes (no new producers); the extra children
get SIGTERM; each running writer is told to stop: it drains every ring, appends and acknowledges everything
that was published, snapshots its producer state and closes its log cleanly.  Then every shared-memory
object of the instance is removed and the process exits 0.  A child still running after
``appliance.shutdown.timeout.ms`` is killed (and the next start recovers its log).  While it waits for its
children the supervisor still answers control requests (the ops that would create something refuse), so a
child asking for metadata as it stops does not wait out its control timeout.

With ``appliance.replica.leader`` set, ``appliance serve`` runs a replica of that leader instead of a
supervisor (``appliance.cli.serve``): how a former leader rejoins after a failover.
"""

from __future__ import annotations

import logging
import os
import selectors
import signal
import socket
import time
from collections.abc import Callable, Sequence
from typing import Any, Final

from appliance.config.cluster_id import ensure_cluster_id, meta_properties_path
from appliance.config.server_config import Config
from appliance.config.topic_metadata import META_DIR, TopicMetadata, assign_replicas
from appliance.server import sdnotify
from appliance.server.children import (
    CRASH_WINDOW_S,
    Child,
    ChildContext,
    ChildSpec,
    Restarts,
    describe_exit,
    fork_child,
    kill_quietly,
    measure_memory,
    wait_children,
)
from appliance.server.control_ops import ControlOps, check_replication_factor
from appliance.server.faults import ControlFaults
from appliance.server.instance import InstanceLocks, shm_names_for
from appliance.server.liveness import LivenessCheck
from appliance.server.metadata import MetadataStore
from appliance.server.partitions import Partition, recover_partition
from appliance.server.proctitle import set_proctitle
from appliance.server.rings import RingTable
from appliance.server.topic_changes import TopicChanges
from appliance.server.writer_demand import WriterDemand
from appliance.server.writer_process import writer_main
from ipc.control_server import ControlServer
from ipc.ring import warm_up
from ipc.shm import Permissions, reclaim
from storage.errors import ApplianceError
from storage.producer_ids import ProducerIdBlockAllocator

__all__ = ["WRITER_STALL_S", "Supervisor"]

# A writer busy in one round this long, or asleep this long after its doorbell was rung (state page and
# doorbell, read without waking it), is killed and restarted: it is stuck (a round takes milliseconds).
# Tests lower it.
WRITER_STALL_S: float = 60.0

_PRODUCER_ID_FILE: Final = "producer-ids"
_STATUS_INTERVAL_S: Final = 5.0
_MEMORY_REPORT_AFTER_S: Final = 2.0
_MEMORY_INTERVAL_S: Final = 30.0
_PENDING_INTERVAL_S: Final = 1.0  # unfinished deletions and a missing metadata reserve: retried this often

_log = logging.getLogger("appliance.supervisor")


class Supervisor:
    """One appliance instance.  :meth:`run` returns the exit code."""

    def __init__(self, config: Config, *, extra_children: Sequence[ChildSpec] = ()) -> None:
        self.config = config
        self.names = shm_names_for(config)
        self.permissions = Permissions(mode=config.shm_mode, gid=config.shm_gid)
        self.extra_specs = list(extra_children)
        self.started_s = time.monotonic()
        self._locks = InstanceLocks(self.names)
        self._store: MetadataStore | None = None
        self._changes: TopicChanges | None = None
        self._next_pending_s = 0.0
        self._allocator: ProducerIdBlockAllocator | None = None
        self._partitions: dict[tuple[str, int], Partition] = {}
        self._rings = RingTable(self.names, self.permissions, config.ring_bytes)
        self._extras: dict[str, tuple[ChildSpec, Child]] = {}
        self._children_by_pid: dict[int, Child] = {}
        self._restarts = Restarts()  # children waiting to be restarted
        self._selector: selectors.BaseSelector | None = None
        self._control: ControlServer | None = None
        self._ops: ControlOps | None = None  # its answers (and the attach.slow seam's held replies)
        self._wakeup_r: socket.socket | None = None
        self._wakeup_w: socket.socket | None = None
        self._broker_wake_fd = -1  # an eventfd every writer adds to after a round, the broker selects on
        self._stop_requested = False
        self._ready_sent = False
        self._status_text = ""
        self._next_status_s = 0.0
        self._next_memory_s = 0.0
        self._next_liveness_check_s = 0.0
        self._liveness = LivenessCheck(lambda: WRITER_STALL_S)
        self._demand = WriterDemand(self._spawn_writer, idle_ms=config.writer_idle_ms,
                                    stop_timeout_ms=config.shutdown_timeout_ms,
                                    retention_check_interval_ms=config.retention_check_interval_ms)
        self._memory_reported = False
        self._watchdog_s = sdnotify.watchdog_interval_s()
        self._next_watchdog_s = 0.0
        self._last_extend_s = 0.0
        self._exit_code = 0

    # -- run ----------------------------------------------------------------------------------------------

    def run(self) -> int:
        try:
            try:
                self._start()
            except (ApplianceError, OSError) as exc:
                _log.error("start-up failed: %s", exc)
                return 1
            self._loop()
            return self._exit_code
        finally:
            self._shutdown()

    def request_stop(self) -> None:
        self._stop_requested = True

    @property
    def stopping(self) -> bool:
        return self._stop_requested

    # -- start-up -----------------------------------------------------------------------------------------

    def _start(self) -> None:
        set_proctitle("appliance: supervisor")
        self._open_selector()
        self._install_signals()  # a SIGTERM during a long recovery stops the start-up cleanly
        self._lock_instance()
        self._open_metadata()
        prepared = self._recover_partitions()
        if prepared is None:
            return
        warm_up()
        self._bind_control_socket()
        for partition in prepared:  # with writer.idle.ms -1; else on demand (appliance.server.writer_demand)
            if not partition.offline and self._demand.resident:  # an offline one gets no writer
                self._spawn_writer(partition)
        for spec in self.extra_specs:
            child = Child(role="extra", name=spec.name)
            self._extras[spec.name] = (spec, child)
            self._spawn_extra(spec, child)
        self._next_memory_s = time.monotonic() + _MEMORY_REPORT_AFTER_S
        self._maybe_ready()

    def _open_selector(self) -> None:
        self._selector = selectors.DefaultSelector()
        self._wakeup_r, self._wakeup_w = socket.socketpair()
        self._wakeup_r.setblocking(False)
        self._wakeup_w.setblocking(False)
        self._selector.register(self._wakeup_r, selectors.EVENT_READ, ("wakeup", None))
        # Inherited by every forked child (CLOEXEC only acts on exec): writers add to it, the broker reads it.
        self._broker_wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)

    def _lock_instance(self) -> None:
        """Lock the log dirs and the instance's names; remove what a crashed run left in shared memory."""
        self._locks.acquire(self.config, self.names)
        removed = reclaim(self.names.instance)
        if removed:
            _log.warning("reclaimed %d shared-memory objects a previous run left (%s ...)", len(removed),
                         removed[0])  # fmt: skip

    def _open_metadata(self) -> None:
        """Open the topic metadata, create the configured topics that are missing, open the producer ids."""
        config = self.config
        cluster_id = ensure_cluster_id(config.log_dirs, config.instance_id)
        _log.info("cluster id %s (%s)", cluster_id, meta_properties_path(config.log_dirs))
        faults = ControlFaults(config.test_faults)
        store = self._store = MetadataStore.open(config.log_dirs, reserve=True, faults=faults)
        self._changes = TopicChanges(self, store, faults)
        self._changes.finish_pending()
        for name, declared in config.topics.items():
            if name in store.deleting:
                _log.error("configured topic %s is not created: its earlier deletion has not finished yet "
                           "(see above); it is created at the next start after it finished", name)
            elif name not in store:
                check_replication_factor(name, declared.replication_factor)
                replicas = assign_replicas(config.node_id, declared.replication_factor)
                store.create_topic(name, declared.partitions, declared.replication_factor, replicas=replicas)
                _log.info("created configured topic %s with %d partitions", name, declared.partitions)
            elif store.get(name).partitions != declared.partitions:
                _log.warning("topic %s has %d partitions; the configuration declares %d (not changed)",
                             name, store.get(name).partitions, declared.partitions)  # fmt: skip
        self._allocator = ProducerIdBlockAllocator(
            os.path.join(config.log_dirs[0], META_DIR, _PRODUCER_ID_FILE)
        )

    def _recover_partitions(self) -> list[Partition] | None:
        """Recover every partition of every topic; None if a stop is asked for meanwhile."""
        store = self._store
        assert store is not None
        started = time.monotonic()
        partitions = [(topic, p) for topic in store.topics.values() for p in range(topic.partitions)]
        prepared = []
        for topic, p in partitions:
            if self._stop_requested:
                return None
            prepared.append(self._prepare_partition(topic, p))
        offline = [p.name for p in prepared if p.offline]
        elapsed_ms = (time.monotonic() - started) * 1000
        _log.info("recovered %d partition logs in %.0f ms%s", len(prepared), elapsed_ms,
                  f"; OFFLINE (damaged, not served): {', '.join(offline)}" if offline else "")  # fmt: skip
        return prepared

    def _prepare_partition(self, topic: TopicMetadata, partition: int) -> Partition:
        """Recover the partition's log, create its state page and doorbell; it is served from now on."""
        self._extend_start_timeout()
        part = recover_partition(
            self.config, topic, partition, names=self.names, permissions=self.permissions,
            broker_wake_fd=self._broker_wake_fd, should_stop=lambda: self._stop_requested,
        )  # fmt: skip
        self._partitions[(topic.name, partition)] = part
        self._demand.register(part)
        return part

    def _extend_start_timeout(self) -> None:
        now = time.monotonic()
        if not self._ready_sent and now - self.started_s > 5 and now - self._last_extend_s > 5:
            self._last_extend_s = now
            self._notify(sdnotify.extend_timeout, 30)

    def _install_signals(self) -> None:
        assert self._wakeup_w is not None
        signal.set_wakeup_fd(self._wakeup_w.fileno(), warn_on_full_buffer=False)

        def on_stop(signum: int, frame: object) -> None:
            self._stop_requested = True

        signal.signal(signal.SIGTERM, on_stop)
        signal.signal(signal.SIGINT, on_stop)
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)  # wakes the selector; reaped in the loop
        signal.signal(
            signal.SIGHUP, lambda signum, frame: _log.info("SIGHUP ignored (restart to reconfigure)")
        )

    def _bind_control_socket(self) -> None:
        assert self._selector is not None and self._store is not None and self._allocator is not None
        assert self._changes is not None
        ops = ControlOps(self, self._store, self._allocator, self._partitions, self._rings, self._changes)
        self._ops = ops
        self._control = ControlServer.bind(
            self.config.control_socket, self._selector, ops.handle,
            permissions=self.permissions, backlog=128, log=_log, on_close=ops.connection_closed,
        )

    # -- what the control operations ask of it ------------------------------------------------------------

    def start_partition(self, topic: TopicMetadata, partition: int) -> None:
        """Recover one partition of a new topic; start its writer if writers are resident (else on demand)."""
        part = self._prepare_partition(topic, partition)
        if not part.offline and self._demand.resident:
            self._spawn_writer(part)

    def need_writer(self, part: Partition, *, ahead: bool = False) -> None:
        """A producer attached a ring to ``part``: its writer starts unless it runs (ahead: at a frame)."""
        (self._demand.hold if ahead else self._demand.need)(part)

    def wake_partition(self, part: Partition) -> None:
        """Run ``part``'s timers now, starting its writer for them if none runs (a topic's settings changed,
        so what its log has due was computed with old ones)."""
        self._demand.wake(part)

    def stop_partitions(self, topic: TopicMetadata, first: int = 0) -> None:
        """Stop the writers of those of the topic's partitions from ``first`` on served here; unlink their
        rings, state pages and doorbells.  One not served (any more) is skipped: a deletion may repeat it."""
        keys = [(topic.name, p) for p in range(first, topic.partitions)]
        keys = [key for key in keys if key in self._partitions]
        parts = [self._partitions[key] for key in keys]
        self._stop_writers(parts, self.config.shutdown_timeout_ms)
        for key, part in zip(keys, parts, strict=True):
            self._rings.drop_partition(part)
            self._demand.forget(part)
            part.release()
            del self._partitions[key]

    def children(self) -> list[Child]:
        """Every child: the writers, then the extra children."""
        return [p.writer for p in self._partitions.values()] + [c for _, c in self._extras.values()]

    def control_connections(self) -> int:
        return len(self._control.connections) if self._control is not None else 0

    # -- children -----------------------------------------------------------------------------------------

    def _fork(self, title: str, body: Callable[[], int], keep: Sequence[int]) -> int:
        """Fork a child running ``body``; it keeps, of the supervisor's descriptors, only ``keep``."""
        return fork_child(title, body, lambda: self._close_inherited(keep))

    def _close_inherited(self, keep: Sequence[int]) -> None:
        """In a fresh child: none of the supervisor's sockets, channels, pipes or locks but ``keep``."""
        if self._selector is not None:
            self._selector.close()
        for sock in (self._wakeup_r, self._wakeup_w):
            if sock is not None:
                sock.close()
        if self._control is not None:
            self._control.close_in_child()
        for child in self._children_by_pid.values():  # a running child's channel or readiness pipe
            if child.channel is not None and child.channel.fileno() not in keep:
                child.channel.close()
            if child.ready_fd >= 0 and child.ready_fd not in keep:
                os.close(child.ready_fd)
        self._locks.close_fds()
        if self._allocator is not None:
            self._allocator.close()

    def _spawn_writer(self, part: Partition) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        spec = part.spec
        child = part.writer
        pid = self._fork(
            f"appliance: writer {part.name}", lambda: writer_main(spec, theirs), (theirs.fileno(),)
        )
        theirs.close()
        ours.setblocking(False)
        child.pid = pid
        child.stall_killed = False
        child.channel = ours
        child.inbox.clear()
        child.started_s = time.monotonic()
        child.restart_at_s = None
        self._children_by_pid[pid] = child
        assert self._selector is not None
        self._selector.register(ours, selectors.EVENT_READ, ("writer", part))
        for record in part.rings.values():
            part.tell_writer(record.attach_command())
            if record.detaching:
                part.tell_writer({"op": "detach", "ring": record.names.ring})
        part.deliver_queued()
        self._demand.started(part)
        (_log.info if child.restarts or self._demand.resident else _log.debug)(
            "writer %s started (pid %d)", part.name, pid)

    def _spawn_extra(self, spec: ChildSpec, child: Child) -> None:
        ready_r, ready_w = (-1, -1)
        if spec.wait_ready and not self._ready_sent:
            ready_r, ready_w = os.pipe()
        context = ChildContext(self.config, self.names, self._metadata_path(), ready_w, self._broker_wake_fd)
        title = spec.title or f"appliance: {spec.name}"
        pid = self._fork(title, lambda: spec.target(context), (ready_w,))
        if ready_w >= 0:
            os.close(ready_w)
            child.ready_fd = ready_r
            child.ready = False
            assert self._selector is not None
            self._selector.register(ready_r, selectors.EVENT_READ, ("ready", child))
        child.pid = pid
        child.started_s = time.monotonic()
        child.restart_at_s = None
        self._children_by_pid[pid] = child
        _log.info("%s started (pid %d)", spec.name, pid)

    def _metadata_path(self) -> str:
        store = self._store
        assert store is not None
        return str(store.path)

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            child = self._children_by_pid.pop(pid, None)
            if child is not None:
                self._child_exited(child, status)

    def _child_exited(self, child: Child, status: int) -> None:
        how = describe_exit(status)
        clean = os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
        part = self._demand.running_part(child.pid) if child.role == "writer" else None
        if child.role == "writer":
            self._read_last_reports(child, how)
        idle_exit = child.role == "writer" and self._demand.exited(child, clean, how)
        self._forget_descriptors(child)
        child.pid = 0
        child.uss_bytes = 0
        if idle_exit:  # stopped because nobody writes (writer_demand): not a crash
            return
        if child.stopping:
            log = _log.info if clean else _log.warning
            log("%s %s stopped: %s", child.role, child.name, how)
            return
        now = time.monotonic()
        delay = child.died(now)
        if child.role == "extra" and not self._extras[child.name][0].restart:
            _log.error("%s %s died (%s); not restarted", child.role, child.name, how)
            return
        if self._stop_requested:
            return
        what = "recovering its partition log and restarting it" if child.role == "writer" else "restarting it"
        _log.error("%s %s %s; %s%s (%d deaths in the last %d s)", child.role, child.name, how, what,
                   f" in {delay:.2f} s" if delay else "", len(child.crashes), CRASH_WINDOW_S)  # fmt: skip
        child.restart_at_s = now + delay
        if part is not None:
            self._restarts.add(child, lambda: self._spawn_writer(part))
        elif child.role == "extra":
            self._restarts.add(child, lambda: self._spawn_extra(self._extras[child.name][0], child))

    def _read_last_reports(self, child: Child, how: str) -> None:
        """Read what an exited writer sent last (its ``next_due``, replies) before its channel is closed;
        the commands it did not answer are answered with an error."""
        part = self._demand.running_part(child.pid)
        if part is not None:
            self._read_writer(part)
            part.writer_gone(how)

    def _forget_descriptors(self, child: Child) -> None:
        """Close the supervisor's end of a dead child's channel and readiness pipe."""
        if child.channel is not None:
            self._unregister(child.channel)
            child.channel.close()
            child.channel = None
        if child.ready_fd >= 0:
            self._unregister(child.ready_fd)
            os.close(child.ready_fd)
            child.ready_fd = -1

    def _restart_due(self) -> None:
        self._restarts.run_due(time.monotonic())

    # -- the loop -----------------------------------------------------------------------------------------

    def _loop(self) -> None:
        selector = self._selector
        assert selector is not None
        while not self._stop_requested:
            self._serve_events(selector, self._timeout())
            self._reap()
            self._restart_due()
            self._demand.start_queued()  # writers producers asked for (writer_demand)
            self._timers()
            if self._ops is not None:
                self._ops.reply_late(time.monotonic())  # the attach.slow test seam (faults)
            if self._changes is not None:
                self._changes.step()  # topics being created: a few partitions a turn (topic_changes)

    def _serve_events(self, selector: selectors.BaseSelector, timeout_s: float) -> None:
        """One wait of up to ``timeout_s``, then serve what is ready: control connections, writers' channels,
        children reporting ready, the signal wake-up."""
        for key, events in selector.select(timeout_s):
            if self._control is not None and self._control.on_event(key, events):
                continue
            kind, data = key.data
            if kind == "writer":
                self._read_writer(data)
            elif kind == "ready":
                self._child_ready(data)
            else:
                self._drain_wakeup()

    def _timeout(self) -> float:
        now = time.monotonic()
        deadlines = [now + 1.0, self._next_status_s, self._next_memory_s]
        if self._watchdog_s is not None:
            deadlines.append(self._next_watchdog_s)
        for due_s in (self._changes.next_step_s() if self._changes is not None else None,
                      self._demand.next_deadline_s(), self._restarts.next_s()):  # fmt: skip
            if due_s is not None:
                deadlines.append(due_s)
        return max(0.0, min(deadlines) - now)

    def _drain_wakeup(self) -> None:
        assert self._wakeup_r is not None
        try:
            while self._wakeup_r.recv(4096):
                pass
        except BlockingIOError:
            pass

    def _read_writer(self, part: Partition) -> None:
        messages = part.read_writer()
        if messages is None:
            channel = part.writer.channel
            if channel is not None:
                self._unregister(channel)  # the writer is exiting; reaped with its status
            return
        for message in messages:
            if message.get("op") == "detached":
                self._rings.detached(part, str(message.get("ring")))
                self._demand.rings_changed(part)
            elif not part.take_reply(message):
                self._demand.on_message(part, message)

    def _timers(self) -> None:
        now = time.monotonic()
        if self._watchdog_s is not None and now >= self._next_watchdog_s:
            self._notify(sdnotify.watchdog)
            self._next_watchdog_s = now + self._watchdog_s
        if now >= self._next_status_s:
            self._next_status_s = now + _STATUS_INTERVAL_S
            self._update_status()
        if now >= self._next_memory_s:
            self._next_memory_s = now + _MEMORY_INTERVAL_S
            self._measure_memory()
        if now >= self._next_liveness_check_s:
            self._next_liveness_check_s = now + min(1.0, WRITER_STALL_S / 4)
            self._liveness.kill_stuck(self._demand.running_partitions())  # restarted as after any death
            self._demand.check()  # idle writers stopped, stopped ones whose timers are due started
        if now >= self._next_pending_s:
            self._next_pending_s = now + _PENDING_INTERVAL_S
            self._finish_pending()

    def _finish_pending(self) -> None:
        """Retry unfinished topic deletions; re-create the metadata reserve a full disk took."""
        if self._changes is not None and self._changes.pending:
            self._changes.finish_pending()
        reserve = self._store.reserve if self._store is not None else None
        if reserve is not None and not reserve.complete:
            reserve.ensure()

    def _measure_memory(self) -> None:
        measure_memory(self.children(), log_each=not self._memory_reported)
        self._memory_reported = True

    def _update_status(self) -> None:
        writers = self._demand.running
        text = (
            f"serving {self._topic_count()} topics, {writers}/{len(self._partitions)} partition writers, "
            f"{len(self._rings)} producer rings"
        )
        if text != self._status_text and self._ready_sent:
            self._status_text = text
            self._notify(sdnotify.status, text)

    def _child_ready(self, child: Child) -> None:
        try:
            os.read(child.ready_fd, 16)
        except OSError:
            pass
        self._unregister(child.ready_fd)
        os.close(child.ready_fd)
        child.ready_fd = -1
        child.ready = True
        self._maybe_ready()

    def _maybe_ready(self) -> None:
        if self._ready_sent or any(not c.ready for _, c in self._extras.values()):
            return
        self._ready_sent = True
        text = (
            f"ready: {self._topic_count()} topics, {len(self._partitions)} partitions, control socket "
            f"{self.config.control_socket}"
        )
        self._status_text = text
        self._notify(sdnotify.ready, text)
        _log.info("%s (instance %s, shared memory %s*)", text, self.config.instance_id, self.names.prefix)

    def _topic_count(self) -> int:
        return 0 if self._store is None else len(self._store.topics)

    def _notify(self, func: Callable[..., bool], *args: Any) -> None:
        try:
            func(*args)
        except OSError as exc:
            _log.warning("sd_notify failed: %s", exc)

    def _unregister(self, fileobj: socket.socket | int) -> None:
        if self._selector is None:
            return
        try:
            self._selector.unregister(fileobj)
        except (KeyError, ValueError):
            pass

    # -- stopping -----------------------------------------------------------------------------------------

    def _stop_writers(self, parts: Sequence[Partition], timeout_ms: int) -> bool:
        """Tell the writers to drain and stop; wait; kill what is left.  True if all stopped cleanly."""
        running = [p for p in parts if p.writer.pid]
        for part in parts:
            part.writer.stopping = True
            part.writer.restart_at_s = None
            self._demand.stop_for_good(part)
        for part in running:
            part.tell_writer({"op": "stop", "timeout_ms": int(timeout_ms * 0.8)})
        return self._wait_children([p.writer for p in running], timeout_ms)

    def _stop_extras(self, timeout_ms: int) -> bool:
        """SIGTERM the extra children; wait; kill what is left.  True if all stopped cleanly."""
        extras = [child for _, child in self._extras.values()]
        for child in extras:
            child.stopping = True
            child.restart_at_s = None
            if child.pid:
                kill_quietly(child.pid, signal.SIGTERM)
        if not any(c.pid for c in extras):
            return True
        stop_ms = max(spec.stop_timeout_ms for spec, _ in self._extras.values())
        return self._wait_children(extras, min(stop_ms, timeout_ms))

    def _wait_children(self, children: Sequence[Child], timeout_ms: int) -> bool:
        def turn() -> None:
            self._serve_control_for(0.005)
            self._reap()

        return wait_children(children, timeout_ms, turn, self._reap)

    def _serve_control_for(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` while still answering control requests (module docstring, "Stop")."""
        if self._selector is None:
            time.sleep(timeout_s)
        else:
            self._serve_events(self._selector, timeout_s)

    def _shutdown(self) -> None:
        """Stop everything that was started, in reverse order; remove shared memory and the socket."""
        started = time.monotonic()
        if self._selector is not None:
            self._notify(sdnotify.stopping, "stopping: draining rings")
            _log.info("stopping: draining %d rings of %d partitions", len(self._rings), len(self._partitions))
        if self._control is not None:
            self._control.stop_accepting()
        if self._changes is not None:
            self._changes.abandon_creates()
        timeout_ms = self.config.shutdown_timeout_ms
        if not self._stop_extras(timeout_ms):
            self._exit_code = 1
        parts = list(self._partitions.values())
        if parts and not self._stop_writers(parts, timeout_ms):
            self._exit_code = 1
        if self._control is not None:
            self._control.close()
        self._rings.unlink_all()
        for part in parts:
            part.release()
        self._partitions.clear()
        if self._allocator is not None:
            self._allocator.close()
        leftovers = reclaim(self.names.instance) if self._locks.locked else []
        if leftovers:
            _log.warning("removed %d shared-memory objects still present at stop", len(leftovers))
        self._close_selector(started)
        self._locks.release()

    def _close_selector(self, started_s: float) -> None:
        """Close the selector, the signal wake-up and the broker's eventfd (the children have stopped)."""
        if self._selector is None:
            return
        signal.set_wakeup_fd(-1)
        self._selector.close()
        self._selector = None
        for sock in (self._wakeup_r, self._wakeup_w):
            if sock is not None:
                sock.close()
        if self._broker_wake_fd >= 0:
            os.close(self._broker_wake_fd)
            self._broker_wake_fd = -1
        _log.info("stopped in %.0f ms", (time.monotonic() - started_s) * 1000)
