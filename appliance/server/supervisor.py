"""``appliance serve``: the supervisor, the process systemd starts and every other process's parent.

Theory of operation
-------------------
Start-up, in this order (each step needs the previous one)::

    1. load the configuration (defaults, --config FILE, --override KEY=VALUE ...)
    2. lock every log dir (.appliance.lock) and the instance's shared-memory names (/dev/shm/la-<id>.lock):
       a second appliance on the same data dir, or with the same instance id, stops here
    3. reclaim the instance's shared memory a crashed run left (ipc.shm.reclaim)
    4. open the topic metadata store; create the configured topics that are missing
    5. recover every partition log (storage Log.open: torn tails cut, indexes rebuilt) and close it cleanly
    6. load the numba kernels (ipc.ring.warm_up), so the forked writers share them
    7. create each partition's state page (offsets published) and doorbell
    8. bind the control socket (0600, or 0660 with appliance.shm.group)
    9. fork one writer per partition, then the extra children (the broker), after all imports
   10. sd_notify READY=1 (after the extra children that asked for it said they are ready)

Then it serves the control socket (``appliance/control.py``), restarts a child that dies (a writer recovers
its log as it opens it; the supervisor logs the exit status or signal and backs off when a child keeps
dying), pings the systemd watchdog, and updates ``STATUS=``.

Who writes what: the supervisor owns the topic metadata, producer id allocation, the rings' existence
(create/unlink) and each state page's leader epoch; each writer owns its partition's log, log end offset,
high watermark (replication factor 1), log start offset and heartbeat; producers own their rings' frames.

Stop (SIGTERM or SIGINT): ``STOPPING=1``; the control socket closes (no new producers); the extra children
get SIGTERM; each writer is told to stop: it drains every ring, appends and acknowledges everything that
was published, snapshots its producer state and closes its log cleanly.  Then every shared-memory object
of the instance is removed and the process exits 0.  A child still running after
``appliance.shutdown.timeout.ms`` is killed (and the next start recovers its log).

Replication: a topic of replication factor R > 1 is assigned R node ids (``appliance.server.metadata.
assign_replicas``); this node leads all of them.  For such a partition the supervisor, while it recovers the
log, starts a new leader epoch at its log end (``replicas.leader_epochs.begin_leader_epoch``: every start of
a leader is a new epoch, so a follower holding records this leader lost or never had truncates them) and
seeds the state page from ``replica-state.json`` (the checkpointed high watermark, the ISR size, the
topic's ``min.insync.replicas``); the writer does not publish the high watermark of such a partition, the
broker's replication layer does (``appliance.broker.replication``).  ``appliance.replica.dirs`` adds one
replica process per directory as extra children (``appliance.replica.child_specs``).  With
``appliance.replica.leader`` set, ``appliance serve`` runs as a replica of that leader instead
(``appliance.replica``): how a former leader rejoins after a failover.

Extra children: :data:`EXTRA_CHILDREN` names factories (``"module:function"``, called with the Config and
returning a :class:`ChildSpec`, a list of them, or None).  Each is forked after the writers, restarted
like them, and gets a :class:`ChildContext`: the config, the shared-memory names, and
:meth:`ChildContext.connect`, a :class:`~appliance.control.ControlClient` through which it reads metadata,
creates topics and attaches rings as a producer, like any local producer.
"""

from __future__ import annotations

import argparse
import ctypes
import fcntl
import gc
import importlib
import json
import logging
import os
import selectors
import shutil
import signal
import socket
import sys
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from appliance.config.server_config import (
    Config,
    ConfigError,
    add_config_arguments,
    check_topic_name,
    config_from_args,
)
from appliance.config.topic_metadata import META_DIR, TopicMetadata, assign_replicas
from appliance.server import sdnotify
from appliance.server.metadata import MetadataStore
from appliance.server.proctitle import set_proctitle
from appliance.server.writer import WriterSpec, writer_main
from ipc.control import ControlClient, encode, error_response, ok_response
from ipc.control_server import ControlServer, ServerConnection
from ipc.kafka.errors import ErrorCode
from ipc.ring import RingNames, create_ring, unlink_ring, warm_up
from ipc.ring_layout import DEFAULT_ACK_SLOTS
from ipc.shm import SHM_DIR, Permissions, ShmNames, reclaim
from ipc.state_page import StatePage, monotonic_ms
from ipc.wakeup import Doorbell
from replicas.leader_epochs import begin_leader_epoch
from replicas.replica_state import read_replica_state
from storage.errors import ApplianceError, LogLockedError, TopicExistsError, UnknownTopicOrPartitionError
from storage.log import Log
from storage.log_config import LogConfig
from storage.producer_ids import ProducerIdBlockAllocator

__all__ = [
    "EXTRA_CHILDREN",
    "ChildContext",
    "ChildSpec",
    "Supervisor",
    "lock_file",
    "lock_log_dirs",
    "main",
    "shm_names_for",
    "unique_memory_bytes",
]

# Factories of extra children, "module:function"; function(config) -> ChildSpec | None.  The broker adds
# itself here ("appliance.broker.broker:child_spec").
EXTRA_CHILDREN: tuple[str, ...] = (
    "appliance.broker.broker:child_spec",
    "appliance.follower.replica:child_specs",
)

# A writer whose heartbeat (state page) is this old while its process lives is killed and restarted: it is
# stuck (a writer beats at least every 100 ms, busy or idle).  Tests lower it.
WRITER_STALL_S: float = 60.0

MAX_REPLICATION_FACTOR: Final = 100  # default.replication.factor's bound
# Producer ids of node N start at N << 40: a replica promoted to leader never hands out an id its former
# leader gave (the producer-ids file is per node).  Node ids must differ below 2**22.
_PRODUCER_ID_NODE_SHIFT: Final = 40
_LOCK_FILE: Final = ".appliance.lock"
_PRODUCER_ID_FILE: Final = "producer-ids"
_STATUS_INTERVAL_S: Final = 5.0
_MEMORY_REPORT_AFTER_S: Final = 2.0
_MEMORY_INTERVAL_S: Final = 30.0
_CRASH_WINDOW_S: Final = 60.0
_MAX_RESTART_DELAY_S: Final = 10.0
_PR_SET_PDEATHSIG: Final = 1

_log = logging.getLogger("appliance.supervisor")


def lock_file(path: str, what: str) -> int:
    """Lock ``path`` (created 0600) for this process and write its pid there; the descriptor holds the lock.

    ApplianceError naming the holder's pid when another process holds it (``what``: what the lock guards).
    """
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise ApplianceError(f"{what} is in use by another appliance (pid {holder}, lock {path})") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def lock_log_dirs(log_dirs: Sequence[str]) -> list[int]:
    """Create every log dir and lock it (:func:`lock_file`): one appliance or replica per data dir."""
    fds: list[int] = []
    try:
        for directory in log_dirs:
            os.makedirs(directory, exist_ok=True)
            fds.append(lock_file(os.path.join(directory, _LOCK_FILE), f"log dir {directory}"))
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return fds


def shm_names_for(config: Config) -> ShmNames:
    """The shared-memory names of the appliance ``config`` describes: ``ipc.shm``'s instance of the first
    log dir (16 hex digits of BLAKE2b over its real path; fixed width, so no instance's prefix is another's).

    Shared memory is named after the data dir (:attr:`Config.instance_id`), so every local process
    (producers, consumers, tools) finds it from the data dir alone.
    """
    return ShmNames(config.instance_id)


def unique_memory_bytes(pid: int) -> int:
    """Unique set size of ``pid``: its ``Private_*`` memory in ``/proc/PID/smaps_rollup`` (0 if unreadable).

    Pages shared copy-on-write with the supervisor (code, numba kernels, imported modules) are not counted.
    """
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            text = f.read()
    except OSError:
        return 0
    total_kib = 0
    for line in text.splitlines():
        if line.startswith(b"Private_"):
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                total_kib += int(parts[1])
    return total_kib * 1024


# -- extra children ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ChildContext:
    """What an extra child gets: the configuration and the ways to reach the supervisor."""

    config: Config
    shm_names: ShmNames
    metadata_path: str  # <first log dir>/meta/topics.json (read with appliance.server.metadata.read_topics)
    ready_fd: int  # write end of the readiness pipe (-1: the supervisor does not wait)
    broker_wake_fd: int = -1  # the eventfd writers add to after each round (the broker selects on it)

    def connect(self, timeout_s: float = 30.0) -> ControlClient:
        """A control connection (metadata, create_topic, init_producer_id, attach ...)."""
        return ControlClient.connect(self.config.control_socket, timeout_s=timeout_s)

    def ready(self) -> None:
        """Tell the supervisor this child is ready (listeners bound); READY=1 waits for it if asked."""
        if self.ready_fd >= 0:
            try:
                os.write(self.ready_fd, b"R")
            finally:
                os.close(self.ready_fd)
                object.__setattr__(self, "ready_fd", -1)


@dataclass(frozen=True)
class ChildSpec:
    """An extra child process the supervisor forks (after the writers), restarts and stops."""

    name: str  # "broker"
    target: Callable[[ChildContext], int]  # runs in the child; returns its exit code
    title: str = ""  # process title; default "appliance: <name>"
    wait_ready: bool = False  # READY=1 waits until the child calls ChildContext.ready()
    restart: bool = True
    stop_timeout_ms: int = 10_000  # after SIGTERM, then SIGKILL


def _load_extra_children(config: Config) -> list[ChildSpec]:
    specs: list[ChildSpec] = []
    for entry in EXTRA_CHILDREN:
        module_name, _, func_name = entry.partition(":")
        factory = getattr(importlib.import_module(module_name), func_name)
        spec = factory(config)
        if isinstance(spec, list | tuple):
            specs += spec
        elif spec is not None:
            specs.append(spec)
    return specs


# -- bookkeeping ---------------------------------------------------------------------------------------------


@dataclass
class _Child:
    """A running (or restarting) child process."""

    role: str  # "writer" or "extra"
    name: str  # "orders-3", "broker"
    pid: int = 0
    started_s: float = 0.0
    restarts: int = 0
    crashes: list[float] = field(default_factory=list)
    restart_at_s: float | None = None
    stopping: bool = False
    channel: socket.socket | None = None  # writers: the command channel
    inbox: bytearray = field(default_factory=bytearray)
    ready_fd: int = -1  # extras: read end of the readiness pipe
    ready: bool = True
    uss_bytes: int = 0
    uss_measured_s: float = 0.0
    stall_killed: bool = False


@dataclass
class _Partition:
    topic: str
    partition: int
    directory: str
    spec: WriterSpec
    page: StatePage
    doorbell: Doorbell
    writer: _Child
    rings: dict[str, _RingRecord] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"{self.topic}-{self.partition}"


@dataclass
class _RingRecord:
    names: RingNames
    topic: str
    partition: int
    session: int
    connection: int
    producer_id: int
    detaching: bool = False


# -- the supervisor ------------------------------------------------------------------------------------------


class Supervisor:
    """One appliance instance.  :meth:`run` returns the exit code."""

    def __init__(self, config: Config, *, extra_children: Sequence[ChildSpec] = ()) -> None:
        self.config = config
        self.names = shm_names_for(config)
        self.permissions = Permissions(mode=config.shm_mode, gid=config.shm_gid)
        self.extra_specs = list(extra_children)
        self.started_s = time.monotonic()
        self._lock_fds: list[int] = []
        self._instance_locked = False
        self._instance_lock_path = SHM_DIR / f"la-{self.names.instance}.lock"
        self._store: MetadataStore | None = None
        self._allocator: ProducerIdBlockAllocator | None = None
        self._partitions: dict[tuple[str, int], _Partition] = {}
        self._extras: dict[str, tuple[ChildSpec, _Child]] = {}
        self._children_by_pid: dict[int, _Child] = {}
        self._rings: dict[str, _RingRecord] = {}
        self._next_session = 0
        self._selector: selectors.BaseSelector | None = None
        self._control: ControlServer | None = None
        self._wakeup_r: socket.socket | None = None
        self._wakeup_w: socket.socket | None = None
        self._broker_wake_fd = -1  # an eventfd every writer adds to after a round, the broker selects on
        self._stop_requested = False
        self._ready_sent = False
        self._status_text = ""
        self._next_status_s = 0.0
        self._next_memory_s = 0.0
        self._next_heartbeat_check_s = 0.0
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

    # -- start-up -----------------------------------------------------------------------------------------

    def _start(self) -> None:
        config = self.config
        set_proctitle("appliance: supervisor")
        self._selector = selectors.DefaultSelector()
        self._wakeup_r, self._wakeup_w = socket.socketpair()
        self._wakeup_r.setblocking(False)
        self._wakeup_w.setblocking(False)
        self._selector.register(self._wakeup_r, selectors.EVENT_READ, ("wakeup", None))
        # Inherited by every forked child (CLOEXEC only acts on exec): writers add to it, the broker reads it.
        self._broker_wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._install_signals()  # a SIGTERM during a long recovery stops the start-up cleanly
        self._lock_fds += lock_log_dirs(config.log_dirs)
        instance = f"instance {config.instance_id} (shared memory {self.names.prefix}*)"
        self._lock_fds.append(lock_file(str(self._instance_lock_path), instance))
        self._instance_locked = True
        removed = reclaim(self.names.instance)
        if removed:
            _log.warning("reclaimed %d shared-memory objects a previous run left (%s ...)", len(removed),
                         removed[0])  # fmt: skip
        self._store = MetadataStore.open(config.log_dirs)
        for name, declared in config.topics.items():
            if name not in self._store:
                self._check_replication(name, declared.replication_factor)
                replicas = assign_replicas(config.node_id, declared.replication_factor)
                self._store.create_topic(name, declared.partitions, declared.replication_factor,
                                         replicas=replicas)
                _log.info("created configured topic %s with %d partitions", name, declared.partitions)
            elif self._store.get(name).partitions != declared.partitions:
                _log.warning("topic %s has %d partitions; the configuration declares %d (not changed)",
                             name, self._store.get(name).partitions, declared.partitions)  # fmt: skip
        self._allocator = ProducerIdBlockAllocator(
            os.path.join(config.log_dirs[0], META_DIR, _PRODUCER_ID_FILE)
        )
        started = time.monotonic()
        partitions = [(topic, p) for topic in self._store.topics.values() for p in range(topic.partitions)]
        prepared = []
        for topic, p in partitions:
            if self._stop_requested:
                return
            prepared.append(self._prepare_partition(topic, p))
        _log.info(
            "recovered %d partition logs in %.0f ms", len(prepared), (time.monotonic() - started) * 1000
        )
        warm_up()
        self._bind_control_socket()
        for partition in prepared:
            self._spawn_writer(partition)
        for spec in self.extra_specs:
            child = _Child(role="extra", name=spec.name)
            self._extras[spec.name] = (spec, child)
            self._spawn_extra(spec, child)
        self._next_memory_s = time.monotonic() + _MEMORY_REPORT_AFTER_S
        self._maybe_ready()

    def _check_replication(self, name: str, replication_factor: int) -> None:
        if not 1 <= replication_factor <= MAX_REPLICATION_FACTOR:
            raise ConfigError(
                f"topic {name!r}: replication factor {replication_factor}, expected "
                f"1..{MAX_REPLICATION_FACTOR}"
            )

    def _log_config_overrides(self, topic: TopicMetadata) -> dict[str, Any]:
        return dict(topic.configs)

    def _prepare_partition(self, topic: TopicMetadata, partition: int) -> _Partition:
        """Recover the partition's log (and close it cleanly), create its state page and doorbell."""
        config = self.config
        directory = topic.directory(partition)
        log_config = config.log_config(topic.name, self._log_config_overrides(topic))
        effective = config.topic(topic.name, self._log_config_overrides(topic))
        if effective.message_timestamp_type == "LogAppendTime" and partition == 0:
            _log.warning("topic %s: message.timestamp.type LogAppendTime is not applied yet; batches keep "
                         "their CreateTime timestamps", topic.name)  # fmt: skip
        self._extend_start_timeout()
        log = self._open_log(directory, log_config, (topic.name, partition))
        replicated = topic.replication_factor > 1
        isr_size = 1
        try:
            end, start = log.log_end_offset, log.log_start_offset
            if replicated:
                # A new leader epoch at every start of a leader, before any append: a follower holding
                # records this log lost or never had truncates them (replicas.leader_epochs).
                persisted = read_replica_state(directory)
                previous = max(log.latest_epoch, persisted.leader_epoch if persisted is not None else -1)
                epoch = previous + 1
                epoch_start = begin_leader_epoch(log, epoch)
                known = persisted.high_watermark if persisted is not None else 0
                high_watermark = max(start, min(known, end))
                if persisted is not None and persisted.leader_id == config.node_id and persisted.isr:
                    isr_size = len(set(persisted.isr) | {config.node_id})
            else:
                epoch = max(log.latest_epoch, 0)
                epoch_start = log.leader_epoch_cache.entries[-1][1] if log.latest_epoch >= 0 else end
                high_watermark = end
        finally:
            log.close(clean=True)
        names = self.names
        page_name = names.state_page(topic.name, partition)
        doorbell_name = names.doorbell(topic.name, partition)
        page = StatePage.create(page_name, self.permissions)
        try:
            page.log_end_offset = end
            page.high_watermark = high_watermark
            page.log_start_offset = start
            page.min_insync_replicas = effective.min_insync_replicas
            if replicated:  # the broker's replication layer owns these from now on
                page.committed_high_watermark = high_watermark
                page.isr_size = isr_size
            page.set_leader_epoch(epoch, epoch_start)
            doorbell = Doorbell.create(doorbell_name, self.permissions)
        except BaseException:
            page.close()
            page.unlink()
            raise
        spec = WriterSpec(
            topic=topic.name,
            partition=partition,
            directory=directory,
            log_config=log_config,
            leader_epoch=epoch,
            state_page=page_name,
            doorbell=doorbell_name,
            publish_high_watermark=topic.replication_factor == 1,
            broker_wake_fd=self._broker_wake_fd,
            retention_check_interval_ms=config.retention_check_interval_ms,
            retention_enabled="delete" in effective.cleanup_policy,
        )
        part = _Partition(topic.name, partition, directory, spec, page, doorbell, _Child("writer", spec.name))
        self._partitions[(topic.name, partition)] = part
        return part

    def _open_log(self, directory: str, log_config: LogConfig, tp: tuple[str, int]) -> Log:
        """Open (recovering) a log; wait up to 30 s for a previous run's writer still holding it (a writer
        orphaned by a killed supervisor drains and exits on its own: PR_SET_PDEATHSIG)."""
        deadline = time.monotonic() + 30
        waited = False
        while True:
            try:
                return Log.open(directory, log_config, topic_partition=tp, recover=True)
            except LogLockedError as exc:
                if time.monotonic() > deadline or self._stop_requested:
                    raise
                if not waited:
                    _log.warning("%s; waiting for it to exit", exc)
                    waited = True
                time.sleep(0.05)

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
        assert self._selector is not None
        self._control = ControlServer.bind(
            self.config.control_socket, self._selector, self._handle,
            permissions=self.permissions, backlog=128, log=_log, on_close=self._connection_closed,
        )

    # -- children -----------------------------------------------------------------------------------------

    def _fork(self, title: str, body: Callable[[], int], keep: Sequence[int]) -> int:
        """Fork a child that runs ``body`` and exits with its code; never returns in the child."""
        parent = os.getpid()
        sys.stderr.flush()
        gc.freeze()  # objects made so far stay out of the collector: its writes would unshare their pages
        pid = os.fork()
        if pid:
            return pid
        code = 1
        try:
            self._become_child(parent, keep)
            set_proctitle(title)
            code = body()
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:
            _log.exception("%s failed", title)
            code = 1
        finally:
            logging.shutdown()
            sys.stderr.flush()
            os._exit(code)

    def _become_child(self, parent: int, keep: Sequence[int]) -> None:
        """In a fresh child: own signals, no systemd variables, none of the supervisor's sockets."""
        signal.set_wakeup_fd(-1)
        for signum in (signal.SIGTERM, signal.SIGCHLD, signal.SIGHUP):
            signal.signal(signum, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        sdnotify.forget()
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)  # the supervisor died before the line above
        if self._selector is not None:
            self._selector.close()
        for sock in (self._wakeup_r, self._wakeup_w):
            if sock is not None:
                sock.close()
        if self._control is not None:
            self._control.close_in_child()
        for child in self._all_children():
            if child.channel is not None and child.channel.fileno() not in keep:
                child.channel.close()
            if child.ready_fd >= 0 and child.ready_fd not in keep:
                os.close(child.ready_fd)
        for fd in self._lock_fds:
            os.close(fd)
        self._lock_fds = []
        if self._allocator is not None:
            self._allocator.close()

    def _all_children(self) -> list[_Child]:
        return [p.writer for p in self._partitions.values()] + [c for _, c in self._extras.values()]

    def _spawn_writer(self, part: _Partition) -> None:
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
            self._tell_writer(part, self._attach_command(record))
            if record.detaching:
                self._tell_writer(part, {"op": "detach", "ring": record.names.ring})
        _log.info("writer %s started (pid %d)", part.name, pid)

    def _spawn_extra(self, spec: ChildSpec, child: _Child) -> None:
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

    def _tell_writer(self, part: _Partition, command: Mapping[str, Any]) -> None:
        """Send a command to the partition's writer (if it runs) and ring its doorbell."""
        channel = part.writer.channel
        if channel is None:
            return  # restarting: it gets the ring list when it starts
        data = encode(command)
        channel.setblocking(True)
        try:
            channel.sendall(data)
        except OSError as exc:
            _log.warning("writer %s: command %s not delivered: %s", part.name, command.get("op"), exc)
        finally:
            channel.setblocking(False)
        part.doorbell.ring()

    @staticmethod
    def _attach_command(record: _RingRecord) -> dict[str, Any]:
        names = record.names
        return {"op": "attach", "ring": names.ring, "space": names.space, "doorbell": names.doorbell}

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

    def _child_exited(self, child: _Child, status: int) -> None:
        how = _describe_exit(status)
        clean = os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
        if child.channel is not None:
            self._unregister(child.channel)
            child.channel.close()
            child.channel = None
        if child.ready_fd >= 0:
            self._unregister(child.ready_fd)
            os.close(child.ready_fd)
            child.ready_fd = -1
        child.pid = 0
        if child.stopping:
            log = _log.info if clean else _log.warning
            log("%s %s stopped: %s", child.role, child.name, how)
            return
        now = time.monotonic()
        child.crashes = [t for t in child.crashes if now - t < _CRASH_WINDOW_S] + [now]
        recent = len(child.crashes)
        delay = 0.0 if recent <= 1 else min(_MAX_RESTART_DELAY_S, 0.25 * 2 ** (recent - 2))
        if child.role == "extra" and not self._extras[child.name][0].restart:
            _log.error("%s %s died (%s); not restarted", child.role, child.name, how)
            return
        if self._stop_requested:
            return
        what = "recovering its partition log and restarting it" if child.role == "writer" else "restarting it"
        _log.error("%s %s %s; %s%s (%d deaths in the last %d s)", child.role, child.name, how, what,
                   f" in {delay:.2f} s" if delay else "", recent, _CRASH_WINDOW_S)  # fmt: skip
        child.restart_at_s = now + delay

    def _restart_due(self) -> None:
        now = time.monotonic()
        for part in list(self._partitions.values()):
            child = part.writer
            if child.pid == 0 and child.restart_at_s is not None and child.restart_at_s <= now:
                child.restarts += 1
                self._spawn_writer(part)
        for spec, child in self._extras.values():
            if child.pid == 0 and child.restart_at_s is not None and child.restart_at_s <= now:
                child.restarts += 1
                self._spawn_extra(spec, child)

    # -- the loop -----------------------------------------------------------------------------------------

    def _loop(self) -> None:
        selector = self._selector
        assert selector is not None
        while not self._stop_requested:
            self._serve_events(selector, self._timeout())
            self._reap()
            self._restart_due()
            self._timers()

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
        deadlines += [c.restart_at_s for c in self._all_children() if c.restart_at_s is not None]
        return max(0.0, min(deadlines) - now)

    def _drain_wakeup(self) -> None:
        assert self._wakeup_r is not None
        try:
            while self._wakeup_r.recv(4096):
                pass
        except BlockingIOError:
            pass

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
        if now >= self._next_heartbeat_check_s:
            self._next_heartbeat_check_s = now + min(1.0, WRITER_STALL_S / 4)
            self._check_heartbeats()

    def _check_heartbeats(self) -> None:
        """Kill (once) a writer that claimed its state page but stopped beating: it is stuck."""
        now_ms = monotonic_ms()
        for part in self._partitions.values():
            child = part.writer
            page = part.page
            if not child.pid or child.stopping or child.stall_killed or page.writer_pid != child.pid:
                continue  # not running, stopping, already killed, or still opening its log
            stale_s = (now_ms - page.writer_heartbeat_ms) / 1000
            if stale_s > WRITER_STALL_S:
                _log.error("writer %s (pid %d) has not beaten its heartbeat for %.1f s (limit %.1f s): it is "
                           "stuck; killing it", part.name, child.pid, stale_s, WRITER_STALL_S)  # fmt: skip
                child.stall_killed = True
                try:
                    os.kill(child.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def _measure_memory(self) -> None:
        for child in self._all_children():
            self._refresh_memory(child, 0.0)
        if not self._memory_reported:
            self._memory_reported = True
            own = unique_memory_bytes(os.getpid())
            for child in self._all_children():
                if child.pid:
                    _log.info(
                        "%s %s (pid %d): unique memory %.1f MiB (the supervisor's: %.1f MiB)",
                        child.role, child.name, child.pid, child.uss_bytes / 2**20, own / 2**20,
                    )  # fmt: skip

    @staticmethod
    def _refresh_memory(child: _Child, max_age_s: float) -> None:
        now = time.monotonic()
        if child.pid and now - child.uss_measured_s >= max_age_s:
            child.uss_bytes = unique_memory_bytes(child.pid)
            child.uss_measured_s = now

    def _update_status(self) -> None:
        writers = sum(1 for p in self._partitions.values() if p.writer.pid)
        text = (
            f"serving {len(self._topics())} topics, {writers}/{len(self._partitions)} partition writers, "
            f"{len(self._rings)} producer rings"
        )
        if text != self._status_text and self._ready_sent:
            self._status_text = text
            self._notify(sdnotify.status, text)

    def _child_ready(self, child: _Child) -> None:
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
            f"ready: {len(self._topics())} topics, {len(self._partitions)} partitions, control socket "
            f"{self.config.control_socket}"
        )
        self._status_text = text
        self._notify(sdnotify.ready, text)
        _log.info("%s (instance %s, shared memory %s*)", text, self.config.instance_id, self.names.prefix)

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

    # -- writers' messages --------------------------------------------------------------------------------

    def _read_writer(self, part: _Partition) -> None:
        child = part.writer
        channel = child.channel
        if channel is None:
            return
        try:
            data = channel.recv(1 << 16)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._unregister(channel)  # the writer is exiting; reaped with its status
            return
        child.inbox += data
        while (end := child.inbox.find(b"\n")) >= 0:
            line = bytes(child.inbox[:end])
            del child.inbox[: end + 1]
            try:
                message = json.loads(line)
            except ValueError:
                _log.error("writer %s sent a malformed line %r", part.name, line[:80])
                continue
            if message.get("op") == "detached":
                self._ring_detached(part, str(message.get("ring")))

    def _ring_detached(self, part: _Partition, ring: str) -> None:
        record = part.rings.pop(ring, None)
        self._rings.pop(ring, None)
        if record is not None:
            unlink_ring(record.names)
            _log.debug("ring %s detached and removed", ring)

    # -- the control socket -------------------------------------------------------------------------------

    def _connection_closed(self, connection: ServerConnection) -> None:
        for record in [r for r in self._rings.values() if r.connection == connection.id]:
            self._detach(record)

    def _detach(self, record: _RingRecord) -> None:
        if record.detaching:
            return
        record.detaching = True
        part = self._partitions.get((record.topic, record.partition))
        if part is None:
            unlink_ring(record.names)
            self._rings.pop(record.names.ring, None)
            return
        self._tell_writer(part, {"op": "detach", "ring": record.names.ring})

    def _handle(self, connection: ServerConnection, message: Mapping[str, Any]) -> dict[str, Any]:
        op = message.get("op")
        handler = self._OPS.get(op) if isinstance(op, str) else None
        if handler is None:
            return error_response(ErrorCode.INVALID_REQUEST, f"unknown op {op!r}; known: {sorted(self._OPS)}")
        try:
            return handler(self, connection, message)
        except UnknownTopicOrPartitionError as exc:
            return error_response(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, str(exc))
        except TopicExistsError as exc:
            return error_response(ErrorCode.TOPIC_ALREADY_EXISTS, str(exc))
        except ConfigError as exc:
            return error_response(ErrorCode.INVALID_CONFIG, str(exc))
        except (KeyError, TypeError, ValueError) as exc:
            return error_response(ErrorCode.INVALID_REQUEST, f"op {op}: bad or missing field: {exc!r}")
        except (ApplianceError, OSError) as exc:
            _log.error("op %s failed: %s", op, exc)
            return error_response(ErrorCode.UNKNOWN_SERVER_ERROR, f"op {op} failed: {exc}")
        except Exception as exc:  # a bug must cost one request, not the appliance
            _log.exception("op %s failed unexpectedly (request %.200r)", op, message)
            return error_response(ErrorCode.UNKNOWN_SERVER_ERROR, f"op {op} failed: {exc!r}")

    def _topics(self) -> dict[str, TopicMetadata]:
        store = self._store
        return {} if store is None else store.topics

    def _topic_json(self, topic: TopicMetadata) -> dict[str, Any]:
        node = self.config.node_id
        now_ms = monotonic_ms()
        partitions = []
        for p in range(topic.partitions):
            part = self._partitions[(topic.name, p)]
            self._refresh_memory(part.writer, 5.0)
            page = part.page
            epoch, _ = page.leader_epoch()
            followers = _followers_json(page, now_ms) if topic.replication_factor > 1 else []
            partitions.append({
                "partition": p,
                "state_page": page.name,
                "doorbell": part.spec.doorbell,
                "directory": part.directory,
                "leader_epoch": epoch,
                "log_start_offset": page.log_start_offset,
                "log_end_offset": page.log_end_offset,
                "high_watermark": page.high_watermark,
                "committed_high_watermark": page.committed_high_watermark,
                "leader": node,
                "isr": [node] + [f["replica_id"] for f in followers if f["in_isr"]],
                "followers": followers,
                "writer_pid": part.writer.pid,
                "writer_uss_bytes": part.writer.uss_bytes,
                "writer_restarts": part.writer.restarts,
                "rings": len(part.rings),
            })  # fmt: skip
        return {
            "name": topic.name,
            "topic_id": topic.topic_id,
            "replication_factor": topic.replication_factor,
            "replicas": [node, *(r for r in topic.replicas if r != node)],
            "min_insync_replicas": self.config.topic(topic.name, topic.configs).min_insync_replicas,
            "configs": self._effective_overrides(topic),
            "max_message_bytes": self._partitions[(topic.name, 0)].spec.log_config.max_message_bytes,
            "partitions": partitions,
        }

    def _effective_overrides(self, topic: TopicMetadata) -> dict[str, Any]:
        """The topic's own settings: the configuration file's [topics.NAME] and those given at creation."""
        overrides = self.config.topic(topic.name, topic.configs).overrides
        return {k: v for k, v in overrides.items() if k not in ("partitions", "replication.factor")}

    def _op_metadata(self, connection: ServerConnection, message: Mapping[str, Any]) -> dict[str, Any]:
        store = self._store
        assert store is not None
        wanted = message.get("topics")
        if wanted is None:
            topics = list(store.topics.values())
        else:
            topics = [store.get(str(name)) for name in wanted]
        return ok_response(
            instance_id=self.config.instance_id,
            shm_prefix=self.names.prefix,
            node_id=self.config.node_id,
            topics=[self._topic_json(t) for t in topics],
        )

    def _op_create_topic(self, connection: ServerConnection, message: Mapping[str, Any]) -> dict[str, Any]:
        name = message["topic"]
        reason = check_topic_name(name) if isinstance(name, str) else "a topic name must be a string"
        if reason is not None:
            return error_response(ErrorCode.INVALID_TOPIC_EXCEPTION, f"topic {name!r}: {reason}")
        partitions = message.get("partitions") or self.config.num_partitions
        replication = message.get("replication_factor") or self.config.default_replication_factor
        configs = dict(message.get("configs") or {})
        if not isinstance(partitions, int) or not 1 <= partitions <= 100_000:
            return error_response(ErrorCode.INVALID_PARTITIONS, f"topic {name!r}: {partitions!r} partitions")
        if not isinstance(replication, int) or replication > MAX_REPLICATION_FACTOR or replication < 1:
            return error_response(
                ErrorCode.INVALID_REPLICATION_FACTOR,
                f"topic {name!r}: replication factor {replication!r}, expected 1..{MAX_REPLICATION_FACTOR}",
            )
        for key in ("partitions", "replication.factor", "num.partitions", "default.replication.factor"):
            if key in configs:
                return error_response(
                    ErrorCode.INVALID_CONFIG, f"topic {name!r}: give {key} as its own field"
                )
        self.config.log_config(name, configs)  # validates: ConfigError -> INVALID_CONFIG
        topic = self._create_topic(name, partitions, replication, configs)
        return ok_response(topic=self._topic_json(topic))

    def _create_topic(
        self, name: str, partitions: int, replication: int, configs: Mapping[str, Any]
    ) -> TopicMetadata:
        store = self._store
        assert store is not None
        if self._stop_requested:
            raise ApplianceError("the appliance is stopping")
        topic = store.create_topic(name, partitions, replication, configs,
                                   replicas=assign_replicas(self.config.node_id, replication))
        for p in range(partitions):
            self._spawn_writer(self._prepare_partition(topic, p))
        _log.info("created topic %s with %d partitions", name, partitions)
        return topic

    def _op_delete_topic(self, connection: ServerConnection, message: Mapping[str, Any]) -> dict[str, Any]:
        if not self.config.delete_topic_enable:
            return error_response(ErrorCode.TOPIC_DELETION_DISABLED, "delete.topic.enable is false")
        store = self._store
        assert store is not None
        topic = store.get(str(message["topic"]))
        parts = [self._partitions.pop((topic.name, p)) for p in range(topic.partitions)]
        self._stop_writers(parts, self.config.shutdown_timeout_ms)
        for part in parts:
            for record in part.rings.values():
                self._rings.pop(record.names.ring, None)
                unlink_ring(record.names)
            self._release_partition(part)
        store.delete_topic(topic.name)
        for part in parts:
            if os.path.isdir(part.directory):  # renamed first, as Kafka does: a crash leaves no half topic
                doomed = f"{part.directory}.{uuid.uuid4().hex}-delete"
                os.rename(part.directory, doomed)
                shutil.rmtree(doomed, ignore_errors=True)
        _log.info("deleted topic %s (%d partitions)", topic.name, topic.partitions)
        return ok_response()

    def _op_init_producer_id(
        self, connection: ServerConnection, message: Mapping[str, Any]
    ) -> dict[str, Any]:
        assert self._allocator is not None
        node_base = (self.config.node_id % 2**22) << _PRODUCER_ID_NODE_SHIFT
        return ok_response(producer_id=node_base + self._allocator.allocate(), producer_epoch=0)

    def _op_attach(self, connection: ServerConnection, message: Mapping[str, Any]) -> dict[str, Any]:
        name = str(message["topic"])
        partition = message["partition"]
        store = self._store
        assert store is not None
        if self._stop_requested:
            return error_response(ErrorCode.BROKER_NOT_AVAILABLE, "the appliance is stopping")
        if name not in store:
            if not self.config.auto_create_topics_enable:
                raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist (auto-creation is off)")
            if check_topic_name(name) is not None:
                return error_response(
                    ErrorCode.INVALID_TOPIC_EXCEPTION, f"topic {name!r}: {check_topic_name(name)}"
                )
            self._check_replication(name, self.config.default_replication_factor)
            self._create_topic(name, self.config.num_partitions, self.config.default_replication_factor, {})
        topic = store.get(name)
        if (
            not isinstance(partition, int)
            or isinstance(partition, bool)
            or not 0 <= partition < topic.partitions
        ):
            raise UnknownTopicOrPartitionError(
                f"topic {name!r} has partitions 0..{topic.partitions - 1}, not {partition!r}"
            )
        part = self._partitions[(name, partition)]
        self._next_session += 1
        session = self._next_session
        names = RingNames.for_producer(self.names, name, partition, session)
        create_ring(names, capacity_bytes=self.config.ring_bytes, permissions=self.permissions)
        producer_id = message.get("producer_id", -1)
        record = _RingRecord(names, name, partition, session, connection.id,
                             producer_id if isinstance(producer_id, int) else -1)  # fmt: skip
        part.rings[names.ring] = record
        self._rings[names.ring] = record
        self._tell_writer(part, self._attach_command(record))
        _log.debug("pid %d attached ring %s (producer id %s)", connection.peer_pid, names.ring, producer_id)
        return ok_response(
            topic=name,
            partition=partition,
            session=session,
            ring=names.ring,
            space=names.space,
            doorbell=names.doorbell,
            state_page=part.page.name,
            ring_bytes=self.config.ring_bytes,
            ack_slots=DEFAULT_ACK_SLOTS,
            max_message_bytes=part.spec.log_config.max_message_bytes,
        )

    def _op_detach(self, connection: ServerConnection, message: Mapping[str, Any]) -> dict[str, Any]:
        ring = str(message["ring"])
        record = self._rings.get(ring)
        if record is None or record.connection != connection.id:
            return error_response(
                ErrorCode.INVALID_REQUEST, f"ring {ring} is not attached through this connection"
            )
        self._detach(record)
        return ok_response()

    def _op_status(self, connection: ServerConnection, message: Mapping[str, Any]) -> dict[str, Any]:
        children = []
        for child in self._all_children():
            children.append({
                "role": child.role, "name": child.name, "pid": child.pid, "restarts": child.restarts,
                "uss_bytes": unique_memory_bytes(child.pid) if child.pid else 0,
            })  # fmt: skip
        return ok_response(
            pid=os.getpid(),
            uptime_s=round(time.monotonic() - self.started_s, 3),
            instance_id=self.config.instance_id,
            shm_prefix=self.names.prefix,
            uss_bytes=unique_memory_bytes(os.getpid()),
            children=children,
            rings=len(self._rings),
            connections=len(self._control.connections) if self._control is not None else 0,
        )

    def _op_replica_status(
        self, connection: ServerConnection, message: Mapping[str, Any]
    ) -> dict[str, Any]:
        """This node leads: every topic with its replication state (``appliance replicas status``)."""
        return ok_response(role="leader", node_id=self.config.node_id,
                           topics=[self._topic_json(t) for t in self._topics().values()])

    def _op_promote(self, connection: ServerConnection, message: Mapping[str, Any]) -> dict[str, Any]:
        return error_response(ErrorCode.INVALID_REQUEST, f"node {self.config.node_id} already leads its "
                              "partitions: promote a replica (through its control socket), not the leader")

    _OPS: Final[dict[str, Callable[[Supervisor, ServerConnection, Mapping[str, Any]], dict[str, Any]]]] = {
        "metadata": _op_metadata,
        "replica_status": _op_replica_status,
        "promote": _op_promote,
        "create_topic": _op_create_topic,
        "delete_topic": _op_delete_topic,
        "init_producer_id": _op_init_producer_id,
        "attach": _op_attach,
        "detach": _op_detach,
        "status": _op_status,
    }

    # -- stopping -----------------------------------------------------------------------------------------

    def _stop_writers(self, parts: Sequence[_Partition], timeout_ms: int) -> bool:
        """Tell the writers to drain and stop; wait; kill what is left.  True if all stopped cleanly."""
        running = [p for p in parts if p.writer.pid]
        for part in parts:
            part.writer.stopping = True
            part.writer.restart_at_s = None
        for part in running:
            self._tell_writer(part, {"op": "stop", "timeout_ms": int(timeout_ms * 0.8)})
        return self._wait_children([p.writer for p in running], timeout_ms)

    def _wait_children(self, children: Sequence[_Child], timeout_ms: int) -> bool:
        deadline = time.monotonic() + timeout_ms / 1000
        clean = True
        while any(c.pid for c in children) and time.monotonic() < deadline:
            for child in children:
                if child.channel is not None:
                    try:
                        while child.channel.recv(1 << 16):
                            pass  # "detached" replies: the rings go anyway
                    except (BlockingIOError, OSError):
                        pass
            self._serve_control_for(0.005)
            self._reap()
        for child in children:
            if child.pid:
                clean = False
                _log.error("%s %s (pid %d) did not stop in %d ms; killing it", child.role, child.name,
                           child.pid, timeout_ms)  # fmt: skip
                try:
                    os.kill(child.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        while any(c.pid for c in children):
            time.sleep(0.005)
            self._reap()
        return clean

    def _serve_control_for(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` while still answering control requests (metadata, status; the ops that
        change state refuse while stopping): a child that asks for metadata as it stops must not wait out
        its control timeout on us."""
        if self._selector is None:
            time.sleep(timeout_s)
        else:
            self._serve_events(self._selector, timeout_s)

    def _release_partition(self, part: _Partition) -> None:
        part.page.close()
        part.page.unlink()
        part.doorbell.close()
        part.doorbell.unlink()

    def _shutdown(self) -> None:
        """Stop everything that was started, in reverse order; remove shared memory and the socket."""
        started = time.monotonic()
        if self._selector is not None:
            self._notify(sdnotify.stopping, "stopping: draining rings")
            _log.info("stopping: draining %d rings of %d partitions", len(self._rings), len(self._partitions))
        if self._control is not None:
            self._control.stop_accepting()
        timeout_ms = self.config.shutdown_timeout_ms
        extras = [child for _, child in self._extras.values()]
        for _, child in self._extras.values():
            child.stopping = True
            child.restart_at_s = None
            if child.pid:
                try:
                    os.kill(child.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        if any(c.pid for c in extras):
            stop_ms = max(spec.stop_timeout_ms for spec, _ in self._extras.values())
            if not self._wait_children(extras, min(stop_ms, timeout_ms)):
                self._exit_code = 1
        parts = list(self._partitions.values())
        if parts and not self._stop_writers(parts, timeout_ms):
            self._exit_code = 1
        if self._control is not None:
            self._control.close()
        for record in self._rings.values():
            unlink_ring(record.names)
        self._rings.clear()
        for part in parts:
            self._release_partition(part)
        self._partitions.clear()
        if self._allocator is not None:
            self._allocator.close()
        leftovers = reclaim(self.names.instance) if self._instance_locked else []
        if leftovers:
            _log.warning("removed %d shared-memory objects still present at stop", len(leftovers))
        if self._selector is not None:
            signal.set_wakeup_fd(-1)
            self._selector.close()
            self._selector = None
            for sock in (self._wakeup_r, self._wakeup_w):
                if sock is not None:
                    sock.close()
            if self._broker_wake_fd >= 0:
                os.close(self._broker_wake_fd)
                self._broker_wake_fd = -1
            _log.info("stopped in %.0f ms", (time.monotonic() - started) * 1000)
        if self._instance_locked:
            try:
                os.unlink(self._instance_lock_path)  # still locked by us: nobody else can be using it
            except FileNotFoundError:
                pass
        for fd in self._lock_fds:
            os.close(fd)
        self._lock_fds = []


def _followers_json(page: StatePage, now_ms: int) -> list[dict[str, Any]]:
    """The replica table of a state page as the ``followers`` of ``metadata`` (control.FollowerInfo)."""
    end = page.log_end_offset
    out = []
    for row in page.replicas():
        known = row.log_end_offset >= 0
        if known and row.log_end_offset >= end:
            lag_ms = 0
        else:
            lag_ms = -1 if row.last_caught_up_ms < 0 else max(0, now_ms - row.last_caught_up_ms)
        out.append({
            "replica_id": row.replica_id,
            "in_isr": row.in_isr,
            "log_end_offset": row.log_end_offset,
            "lag_records": max(0, end - row.log_end_offset) if known else -1,
            "lag_ms": lag_ms,
            "last_fetch_ms_ago": -1 if row.last_fetch_ms < 0 else max(0, now_ms - row.last_fetch_ms),
        })  # fmt: skip
    return out


def _describe_exit(status: int) -> str:
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        try:
            name = signal.Signals(signum).name
        except ValueError:
            name = "unknown signal"
        return f"was killed by signal {signum} ({name})"
    if os.WIFEXITED(status):
        return f"exited with status {os.WEXITSTATUS(status)}"
    return f"ended with wait status {status}"


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level, logging.INFO),
        stream=sys.stderr,
        format="%(asctime)s.%(msecs)03d %(levelname)s [%(process)d] %(name)s: %(message)s",
        datefmt="%Y-%m-%dT%H:%M:%S",
        force=True,
    )


def main(argv: list[str]) -> int:
    """``appliance serve [--config FILE] [--override KEY=VALUE]...``"""
    parser = argparse.ArgumentParser(prog="appliance serve", description="run the log appliance (supervisor)")
    add_config_arguments(parser)
    args = parser.parse_args(argv)
    try:
        config = config_from_args(args)
        _setup_logging(config.log_level)
        if config.replica_leader:  # a former leader rejoining, or a node told to follow
            from appliance.follower.replica import run_replica

            return run_replica(config, argv)
        extras = _load_extra_children(config)
    except ConfigError as exc:
        print(f"appliance serve: {exc}", file=sys.stderr)
        return 1
    return Supervisor(config, extra_children=extras).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
