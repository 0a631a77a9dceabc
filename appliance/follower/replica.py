"""``appliance replica``: a follower process, one fetcher thread per partition, promotable to leader.

Theory of operation
-------------------
A replica holds copies of exactly the partitions of replicated topics whose replicas list its ``node.id``
(a topic created with an explicit assignment may name it for some partitions only; it records the whole
topic's metadata, with every partition's replicas, and has a log directory for its own partitions only),
in its own ``log.dirs`` (another disk, or another host).  It has no writers, no shared memory and no
Kafka listener: its only peer is the leader, reached through
:class:`~appliance.follower.leaders.LeaderDirectory` (the addresses of ``appliance.replica.leader``; the
highest leader epoch wins).  Start-up, in order::

    1. lock every log dir (.appliance.lock: no `appliance serve` on the same data), read the cluster secret
    2. open its topic metadata (<log.dirs[0]>/meta/topics.json, the same file `appliance serve` uses)
    3. bind its control socket (appliance.control.socket: `status`, `replica_status`, `promote`)
    4. one fetcher thread per partition it already holds (the leader may be down: they wait for it)
    5. READY=1; then every REFRESH_INTERVAL_MS: ask the leaders' Metadata (a thread), add the topics that
       appeared and the partitions added to them (recorded in its own topics.json first), drop the topics
       deleted, keep the last ISR seen

A topic's own settings (CreateTopics configs, AlterConfigs) are recorded from the leader's DescribeConfigs
(``appliance.follower.leaders``).  The followed logs of compacted topics are not cleaned here: an
adoption thread copies the leader's cleaned segments in (``appliance.follower.adoption``), sharing each
log with its fetcher through a ``replicas.log_guard.LogGuard``.

Each fetcher is a :class:`replicas.fetcher.PartitionFetcher` on a :class:`storage.log.Log` opened (and
recovered) by this process: Fetch with ``replica_id`` = ``node.id`` from its log end offset, the leader's
bytes checked (CRC) and appended unchanged at the same offsets, truncation by leader epoch before fetching
from a new leader or epoch.  With ``appliance.cluster.secret.file`` every connection authenticates
(SASL/PLAIN, ``replicas.cluster_auth``).  SIGTERM stops the fetchers (each checkpoints its high
watermark), closes the logs and exits 0.  Processes are titled ``appliance: replica <node.id>``; under
systemd it sends READY/STATUS/WATCHDOG/STOPPING like ``appliance serve``.

**Replicas `appliance serve` spawns.**  Each directory of ``appliance.replica.dirs`` gets a replica process
as an extra child of the supervisor (:func:`child_specs`): node ids are the ones after the leader's own
(node 0 with two replica dirs: nodes 1 and 2, the replicas ``assign_replicas`` gives a topic of factor 3);
they follow the broker's Unix listener (``appliance.unix.listener``), or its TCP listener when that has a
fixed port.  They die with their supervisor and cannot be promoted in place (the leader is their parent).

**Promotion** (``appliance replicas promote``, the ``promote`` control op): the replica stops its
fetchers, records itself as the leader of every partition it holds and ``exec``\\s ``appliance serve`` on
the same configuration.  What refuses a promotion and what each partition starts from:
``appliance.follower.promotion``.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import selectors
import shutil
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from appliance.config.cluster_id import meta_properties_path, read_cluster_id, write_cluster_id
from appliance.config.server_config import Config, ConfigError, parse_override
from appliance.config.topic_metadata import TopicMetadata
from appliance.follower.adoption import Adopter, AdoptTarget
from appliance.follower.leaders import REFRESH_INTERVAL_MS, ClusterView, LeaderDirectory, TopicView
from appliance.follower.promotion import (
    PromotionRefused,
    SyncVerdict,
    judge_sync,
    leadership,
    partitions_named,
    refuse_partial_topics,
    refuse_while_a_leader_answers,
    unclean_warning,
)
from appliance.server import sdnotify
from appliance.server.children import ChildContext, ChildSpec
from appliance.server.instance import lock_log_dirs
from appliance.server.metadata import MetadataStore
from appliance.server.proctitle import set_proctitle
from ipc.control import error_response, ok_response
from ipc.control_server import ControlServer
from ipc.kafka.errors import ErrorCode
from ipc.shm import Permissions
from ipc.state_page import monotonic_ms
from replicas.cluster_auth import read_cluster_secret, replica_credentials
from replicas.fetcher import FetcherConfig, FetchPhase, PartitionFetcher
from replicas.log_guard import LogGuard
from replicas.replica_state import PersistedReplicaState, write_replica_state
from storage.errors import ApplianceError
from storage.log import Log

__all__ = ["ReplicaNode", "child_specs", "replica_child", "replica_node_ids", "run_replica"]

_STATUS_INTERVAL_S: Final = 5.0
_JOIN_TIMEOUT_S: Final = 10.0
_REPLY_FLUSH_S: Final = 5.0  # how long a control reply queued at stop may wait for its reader

_log = logging.getLogger("appliance.replica")


@dataclass(eq=False)
class _Followed:
    """One partition this replica copies."""

    topic: str
    partition: int
    log: Log
    fetcher: PartitionFetcher
    stop: threading.Event
    guard: LogGuard
    thread: threading.Thread | None = None
    failure: str = ""

    @property
    def name(self) -> str:
        return f"{self.topic}-{self.partition}"


class ReplicaNode:
    """One replica process.  :meth:`run` returns the exit code.  See the module docstring."""

    def __init__(self, config: Config, leaders: Sequence[str], *, argv: Sequence[str] = (),
                 spawned_by: int | None = None) -> None:
        self.config = config
        self.node_id = config.node_id
        self.leaders = tuple(leaders)
        self.argv = list(argv)
        self.spawned_by = spawned_by
        self._lock_fds: list[int] = []
        self._store: MetadataStore | None = None
        self._directory: LeaderDirectory | None = None
        self._followed: dict[tuple[str, int], _Followed] = {}
        self._selector: selectors.BaseSelector | None = None
        self._control: ControlServer | None = None
        self._wakeup_r, self._wakeup_w = socket.socketpair()
        self._stop = threading.Event()
        self._view_seen: ClusterView | None = None
        self._refresher: threading.Thread | None = None
        self._exec_argv: list[str] | None = None
        self._watchdog_s = sdnotify.watchdog_interval_s()
        self._secret: str | None = None
        self._adopter: Adopter | None = None
        self.started_ms = monotonic_ms()

    # -- running --------------------------------------------------------------------------------------------

    def run(self) -> int:
        set_proctitle(f"appliance: replica {self.node_id}")
        self._install_signals()
        try:
            try:
                self._start()
            except (ApplianceError, OSError) as e:
                _log.error("replica %d: start-up failed: %s", self.node_id, e)
                return 1
            self._loop()
        finally:
            self._shutdown()
        if self._exec_argv is not None:
            _log.warning("replica %d: becoming the leader: exec %s", self.node_id, " ".join(self._exec_argv))
            logging.shutdown()
            sys.stderr.flush()
            os.execv(self._exec_argv[0], self._exec_argv)
        return 0

    def request_stop(self) -> None:
        self._stop.set()
        self._wake()

    def _wake(self) -> None:
        try:
            self._wakeup_w.send(b"x", socket.MSG_DONTWAIT)
        except OSError:
            pass

    def _install_signals(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        signal.signal(signal.SIGTERM, lambda *_: self.request_stop())
        if self.spawned_by is None:  # a child of the supervisor leaves Ctrl-C to it
            signal.signal(signal.SIGINT, lambda *_: self.request_stop())

    def _start(self) -> None:
        config = self.config
        self._lock_fds = lock_log_dirs(config.log_dirs)
        self._secret = read_cluster_secret(config.cluster_secret_file)
        self._store = MetadataStore.open(config.log_dirs)
        self._directory = LeaderDirectory(self.leaders, node_id=self.node_id,
                                          sasl_plain=replica_credentials(self.node_id, self._secret),
                                          timeout_ms=config.replica_socket_timeout_ms,
                                          cluster_id=read_cluster_id(config.log_dirs),
                                          on_cluster_id=self._keep_cluster_id)
        self._selector = selectors.DefaultSelector()
        self._wakeup_r.setblocking(False)
        self._selector.register(self._wakeup_r, selectors.EVENT_READ, "wakeup")
        self._bind_control_socket()
        for topic in self._store.topics.values():
            for partition in range(topic.partitions):
                if self.node_id in topic.partition_replicas(partition):
                    self._follow(topic, partition)
        self._refresher = threading.Thread(target=self._refresh_loop, name="leader-directory", daemon=True)
        self._refresher.start()
        self._adopter = Adopter(config, self.node_id, self._adopt_targets)
        self._adopter.start()
        text = (f"replica {self.node_id}: following {len(self._followed)} partitions from "
                f"{', '.join(self.leaders)}; control socket {config.control_socket}")
        _log.info("%s", text)
        sdnotify.ready(text)

    def _keep_cluster_id(self, cluster_id: str) -> None:
        """Store the cluster id learnt from the leader (``appliance.config.cluster_id``)."""
        try:
            write_cluster_id(self.config.log_dirs, cluster_id)
        except OSError as e:  # kept in memory meanwhile; learnt again at the next start
            _log.error("replica %d: cannot store cluster id %s in %s: %s", self.node_id, cluster_id,
                       meta_properties_path(self.config.log_dirs), e)

    def _bind_control_socket(self) -> None:
        assert self._selector is not None
        # as the supervisor's: 0600, or 0660 and chown'ed to appliance.shm.group when one is configured
        self._control = ControlServer.bind(
            self.config.control_socket, self._selector, lambda _connection, message: self._handle(message),
            permissions=Permissions(mode=self.config.shm_mode, gid=self.config.shm_gid), backlog=16, log=_log,
        )

    def _loop(self) -> None:
        selector = self._selector
        assert selector is not None
        next_status = time.monotonic() + _STATUS_INTERVAL_S
        next_watchdog = time.monotonic()
        while not self._stop.is_set():
            for key, events in selector.select(0.25):
                if key.data == "wakeup":
                    try:
                        while self._wakeup_r.recv(4096):
                            pass
                    except BlockingIOError:
                        pass
                elif self._control is not None:
                    self._control.on_event(key, events)
                if self._stop.is_set():
                    break
            if self._stop.is_set():
                break
            self._reconcile()
            now = time.monotonic()
            if self._watchdog_s is not None and now >= next_watchdog:
                sdnotify.watchdog()
                next_watchdog = now + self._watchdog_s
            if now >= next_status:
                next_status = now + _STATUS_INTERVAL_S
                sdnotify.status(self._status_line())

    def _status_line(self) -> str:
        fetching = sum(1 for f in self._followed.values() if f.fetcher.phase is FetchPhase.FETCHING)
        return f"replica {self.node_id}: {len(self._followed)} partitions, {fetching} fetching"

    # -- leaders and partitions -----------------------------------------------------------------------------

    def _refresh_loop(self) -> None:
        directory = self._directory
        assert directory is not None
        while not self._stop.is_set():
            try:
                view = directory.refresh()
            except Exception:  # a bug must not end the refreshes
                _log.exception("replica %d: refreshing the leaders' metadata failed", self.node_id)
                view = None
            if view is not None:
                self._wake()
            self._stop.wait(REFRESH_INTERVAL_MS / 1000)

    def _reconcile(self) -> None:
        """Follow the topics the leaders list with this node among their replicas; drop deleted ones."""
        directory = self._directory
        store = self._store
        if directory is None or store is None:
            return
        view = directory.view
        if view is None or view is self._view_seen:
            return
        self._view_seen = view
        for topic in view.topics.values():
            if self.node_id in topic.replicas:
                self._guarded(f"following topic {topic.name}", functools.partial(self._hold, topic))
        for name, local in store.topics.items():
            if self.node_id in local.nodes and name not in view.topics:
                self._guarded(f"removing topic {name}", functools.partial(self._forget_topic, local))

    def _guarded(self, what: str, step: Callable[[], None]) -> None:
        """One topic's step of a reconciliation; a failure (a full disk) is logged, retried at the next view,
        and costs no other topic."""
        try:
            step()
        except (ApplianceError, OSError) as e:
            _log.error("replica %d: %s failed (retried at the next refresh): %s", self.node_id, what, e)

    def _hold(self, topic: TopicView) -> None:
        """Record (if new) and follow every partition of a topic the leaders list with this node."""
        store = self._store
        assert store is not None
        local = store.topics.get(topic.name)
        if local is not None and local.partitions < topic.partitions:  # CreatePartitions at the leader
            added = tuple(topic.partition_replicas(p) for p in range(local.partitions, topic.partitions))
            local = store.set_partition_count(topic.name, topic.partitions, added)
            _log.info("replica %d: topic %s now has %d partitions, as at its leader (new ones' replicas %s)",
                      self.node_id, topic.name, topic.partitions, [list(r) for r in added])
        if local is not None and local.partitions != topic.partitions:
            _log.error("replica %d: topic %s has %d partitions at the leader and %d here; not following "
                       "it (remove this replica's copy)", self.node_id, topic.name, topic.partitions,
                       local.partitions)
            return
        configs = self._leader_configs(topic)
        if local is None:
            local = store.create_topic(topic.name, topic.partitions, len(topic.partition_replicas(0)),
                                       configs, replicas=topic.partition_replicas(0),
                                       assignments=topic.assignments, internal=True)  # the leader's copy
            mine = [p for p in range(topic.partitions) if self.node_id in topic.partition_replicas(p)]
            _log.info("replica %d: now holding topic %s (%d partitions, replicas %s; partitions %s here)",
                      self.node_id, topic.name, topic.partitions,
                      [list(topic.partition_replicas(p)) for p in range(topic.partitions)], mine)
        elif configs is not None and configs != dict(local.configs):
            local = store.set_configs(topic.name, configs)
            _log.info("replica %d: topic %s: settings %s, as its leader has them", self.node_id, topic.name,
                      configs)
        for partition in range(local.partitions):
            if (local.name, partition) not in self._followed and self.node_id in local.partition_replicas(
                    partition):
                self._follow(local, partition)

    def _leader_configs(self, topic: TopicView) -> dict[str, Any] | None:
        """The settings the leader reports set on ``topic``, parsed as the leader stores them (None: it
        reported none, or one does not parse here: keep what this replica has)."""
        if topic.configs is None:
            return None
        try:
            return dict(parse_override(f"{name}={value}") for name, value in topic.configs)
        except ConfigError as e:
            _log.error("replica %d: topic %s: the leader's settings do not load here (%s); keeping this "
                       "replica's", self.node_id, topic.name, e)
            return None

    def _follow(self, topic: TopicMetadata, partition: int) -> None:
        config = self.config
        directory = self._directory
        assert directory is not None
        path = topic.directory(partition)
        try:
            log = Log.open(path, config.log_config(topic.name, topic.configs),
                           topic_partition=(topic.name, partition), recover=True)
        except (ApplianceError, OSError) as e:
            _log.error("replica %d: cannot open %s-%d (%s): %s", self.node_id, topic.name, partition, path, e)
            return
        name = topic.name

        def leader() -> Any:
            return directory.leader_for(name, partition)

        guard = LogGuard()
        fetcher = PartitionFetcher(log, leader, FetcherConfig(
            broker_id=self.node_id,
            replica_fetch_max_bytes=config.replica_fetch_max_bytes,
            replica_fetch_wait_max_ms=config.replica_fetch_wait_max_ms,
            replica_fetch_backoff_ms=config.replica_fetch_backoff_ms,
            request_timeout_ms=config.replica_socket_timeout_ms,
            client_id=f"appliance-replica-{self.node_id}",
            sasl_plain=replica_credentials(self.node_id, self._secret),
        ), guard=guard)  # fmt: skip
        followed = _Followed(topic.name, partition, log, fetcher, threading.Event(), guard)
        followed.thread = threading.Thread(target=self._fetch_loop, args=(followed,),
                                           name=f"fetch {followed.name}", daemon=True)
        self._followed[(topic.name, partition)] = followed
        followed.thread.start()

    def _fetch_loop(self, followed: _Followed) -> None:
        backoff_s = max(self.config.replica_fetch_backoff_ms, 100) / 1000
        while not followed.stop.is_set():
            try:
                followed.fetcher.run(followed.stop)
                return
            except Exception as e:  # our own log failed (disk full, ...): retry after a back-off
                followed.failure = f"{type(e).__name__}: {e}"
                _log.exception("replica %d: fetching %s failed; retrying in %.1f s", self.node_id,
                               followed.name, backoff_s)
                followed.stop.wait(backoff_s)

    def _adopt_targets(self) -> list[AdoptTarget]:
        """The followed partitions of compacted topics now (the adoption thread's ``targets``)."""
        store = self._store
        targets = []
        for followed in list(self._followed.values()):
            topic = store.topics.get(followed.topic) if store is not None else None
            if topic is None or followed.stop.is_set():
                continue
            try:
                settings = self.config.topic(topic.name, topic.configs)
            except ApplianceError as e:
                _log.warning("replica %d: topic %s: its settings do not load: %s", self.node_id, topic.name,
                             e)
                continue
            if "compact" in settings.cleanup_policy:
                targets.append(AdoptTarget(followed.topic, followed.partition, followed.log, followed.guard,
                                           followed.fetcher))
        return targets

    def _unfollow(self, followed: _Followed) -> None:
        followed.stop.set()
        followed.guard.close()  # an adoption in progress stops; nothing more is swapped in
        followed.fetcher.close()
        if followed.thread is not None:
            followed.thread.join(_JOIN_TIMEOUT_S)
            if followed.thread.is_alive():
                _log.error("replica %d: the fetcher of %s did not stop in %.0f s", self.node_id,
                           followed.name, _JOIN_TIMEOUT_S)
        followed.log.close(clean=not (followed.thread is not None and followed.thread.is_alive()))

    def _forget_topic(self, topic: TopicMetadata) -> None:
        """The leaders no longer have the topic (deleted): stop, remove its copy and metadata."""
        store = self._store
        assert store is not None
        for partition in range(topic.partitions):
            followed = self._followed.pop((topic.name, partition), None)
            if followed is not None:
                self._unfollow(followed)
        store.delete_topic(topic.name)
        for partition in range(topic.partitions):
            shutil.rmtree(topic.directory(partition), ignore_errors=True)
        _log.info("replica %d: topic %s was deleted at the leader; its copy here is removed", self.node_id,
                  topic.name)

    # -- the control socket ---------------------------------------------------------------------------------

    def _handle(self, message: Mapping[str, Any]) -> dict[str, Any]:
        op = message.get("op")
        try:
            if op == "status" or op == "replica_status":
                return self._status()
            if op == "promote":
                return self._promote(message.get("partitions", "all"), bool(message.get("unclean", False)))
            return error_response(ErrorCode.INVALID_REQUEST, f"unknown op {op!r} for a replica; known: "
                                  "status, replica_status, promote")
        except PromotionRefused as e:
            return error_response(ErrorCode.INVALID_REQUEST, str(e))
        except Exception as e:  # a bug costs one request, not the replica
            _log.exception("replica %d: op %s failed", self.node_id, op)
            return error_response(ErrorCode.UNKNOWN_SERVER_ERROR, f"op {op} failed: {e!r}")

    def _status(self) -> dict[str, Any]:
        now = monotonic_ms()
        directory = self._directory
        view = directory.view if directory is not None else None
        partitions = []
        for (topic, partition), followed in sorted(self._followed.items()):
            fetcher = followed.fetcher
            fetched = fetcher.last_fetch_ms
            leader = fetcher.leader
            seen = view.partitions.get((topic, partition)) if view is not None else None
            partitions.append({
                "topic": topic,
                "partition": partition,
                "leader": leader.leader_id if leader is not None else -1,
                "leader_address": f"{leader.host}:{leader.port}" if leader and leader.port else
                (leader.host if leader else ""),
                "leader_epoch": leader.leader_epoch if leader is not None else -1,
                "phase": fetcher.phase.value,
                "log_start_offset": followed.log.log_start_offset,
                "log_end_offset": fetcher.log_end_offset,
                "high_watermark": fetcher.high_watermark,
                "isr_seen": list(seen.isr) if seen is not None else [],
                "in_isr": seen is not None and self.node_id in seen.isr,
                "isr_seen_ms_ago": now - view.at_ms if view is not None else -1,
                "last_fetch_ms_ago": -1 if fetched is None else max(0, now - fetched),
                "last_error": followed.failure or fetcher.last_error,
            })  # fmt: skip
        return ok_response(role="replica", node_id=self.node_id, pid=os.getpid(), leaders=list(self.leaders),
                           unreachable=directory.errors() if directory is not None else {},
                           partitions=partitions)

    # -- promotion ------------------------------------------------------------------------------------------

    def _promote(self, wanted: object, unclean: bool) -> dict[str, Any]:
        """Become the leader of every partition held (``appliance.follower.promotion``): the request is
        checked, then each partition's leadership is written, then the process ``exec``\\s a supervisor."""
        self._refuse_if_spawned()
        store = self._store
        assert store is not None
        refuse_partial_topics(store.topics.values(), self.node_id)
        named = partitions_named(wanted, set(self._followed), self.node_id)
        directory = self._directory
        assert directory is not None
        refuse_while_a_leader_answers(directory.refresh())
        verdicts = judge_sync(sorted(named), directory.view, directory.silent_since_ms,
                              lag_time_max_ms=self.config.replica_lag_time_max_ms, node_id=self.node_id)
        warning = unclean_warning(self._sync_problems(verdicts), unclean)
        if warning is not None:
            _log.warning("replica %d: %s", self.node_id, warning)
        promoted = self._lead_all(verdicts)
        self._followed.clear()
        self._exec_argv = [sys.executable, "-m", "appliance.cli", "serve", *self.argv,
                           "--override", "appliance.replica.leader="]
        self.request_stop()
        warnings = [] if warning is None else [warning]
        return ok_response(node_id=self.node_id, promoted=promoted, warnings=warnings,
                           listeners=[str(listener) for listener in self.config.listeners])

    def _lead_all(self, verdicts: list[SyncVerdict]) -> list[dict[str, Any]]:
        """Lead every partition, or none: if recording one fails (a full disk), the partitions already
        stopped follow again and the promotion is refused with the reason."""
        promoted = []
        try:
            for verdict in verdicts:
                promoted.append(self._lead(self._followed[verdict.key], verdict))
        except (ApplianceError, OSError) as e:
            for verdict in verdicts[: len(promoted) + 1]:
                self._follow_again(self._followed[verdict.key])
            topic, partition = verdicts[len(promoted)].key
            raise PromotionRefused(f"replica {self.node_id}: recording the leadership of {topic}-{partition} "
                                   f"failed ({e}); nothing was promoted and this replica follows its leader "
                                   "again: cure the cause, then promote again") from e
        return promoted

    def _follow_again(self, followed: _Followed) -> None:
        """Undo a partition's part of a failed promotion: follow it again if its fetcher was stopped."""
        store = self._store
        if not followed.stop.is_set() or store is None:
            return
        del self._followed[(followed.topic, followed.partition)]
        self._follow(store.get(followed.topic), followed.partition)

    def _refuse_if_spawned(self) -> None:
        if self.spawned_by is not None:
            raise PromotionRefused(
                f"replica {self.node_id} runs under the leader's supervisor (pid {self.spawned_by}); it "
                "cannot lead while its parent does.  Stop that appliance, then run `appliance serve` on this "
                "replica's log dir (with its own node.id), or promote a replica on another host")

    def _sync_problems(self, verdicts: list[SyncVerdict]) -> list[str]:
        """One line per partition not known to be in sync: its name, why, its log end."""
        problems = []
        for verdict in verdicts:
            if not verdict.in_isr:
                followed = self._followed[verdict.key]
                end = followed.fetcher.log_end_offset
                problems.append(f"{followed.name}: not in sync ({verdict.why_not}; log end {end})")
        return problems

    def _lead(self, followed: _Followed, verdict: SyncVerdict) -> dict[str, Any]:
        """Stop fetching ``followed`` and record this node as its leader (``replica-state.json``)."""
        fetcher = followed.fetcher
        lead = leadership(verdict, self.node_id, log_epoch=followed.log.latest_epoch,
                          fetched_epoch=fetcher.leader.leader_epoch if fetcher.leader else -1)
        self._unfollow(followed)
        high_watermark = fetcher.high_watermark
        write_replica_state(followed.log.directory, PersistedReplicaState(
            followed.topic, followed.partition, self.node_id, lead.previous_epoch, lead.isr, high_watermark))
        _log.warning("replica %d: %s promoted (previous epoch %d, ISR %s, high watermark %d, log end %d)",
                     self.node_id, followed.name, lead.previous_epoch, list(lead.isr), high_watermark,
                     followed.log.log_end_offset)
        return {"partition": followed.name, "previous_epoch": lead.previous_epoch, "isr": list(lead.isr),
                "high_watermark": high_watermark, "log_end_offset": followed.log.log_end_offset,
                "clean": verdict.in_isr}

    # -- stopping -------------------------------------------------------------------------------------------

    def _shutdown(self) -> None:
        sdnotify.stopping(f"replica {self.node_id}: stopping")
        self._stop.set()
        if self._adopter is not None:
            self._adopter.stop()
            self._adopter = None
        if self._directory is not None:
            self._directory.close()
        for followed in list(self._followed.values()):
            self._unfollow(followed)
        self._followed.clear()
        if self._refresher is not None:
            self._refresher.join(_JOIN_TIMEOUT_S)
        if self._control is not None:
            self._control.close(flush_s=_REPLY_FLUSH_S)  # the answer to promote goes out before the exec
            self._control = None
        if self._selector is not None:
            self._selector.close()
            self._selector = None
        for sock in (self._wakeup_r, self._wakeup_w):
            sock.close()
        for fd in self._lock_fds:
            os.close(fd)
        self._lock_fds = []
        _log.info("replica %d: stopped", self.node_id)


# -- entry points -----------------------------------------------------------------------------------------


def run_replica(config: Config, argv: Sequence[str]) -> int:
    """Run this process as a replica of ``appliance.replica.leader`` (``appliance replica``, or ``appliance
    serve`` with the setting: a former leader rejoining).  ``argv`` are the configuration arguments, kept for
    a promotion's ``exec``."""
    if not config.replica_leader:
        raise ConfigError("appliance replica: set appliance.replica.leader (the leader's HOST:PORT; several, "
                          "comma-separated, to follow whichever leads)")
    leaders = [item.strip() for item in config.replica_leader.split(",") if item.strip()]
    return ReplicaNode(config, leaders, argv=argv).run()


def replica_node_ids(config: Config) -> list[int]:
    """The node ids of the replicas ``appliance.replica.dirs`` gives: the smallest ids after the leader's."""
    ids: list[int] = []
    candidate = 0
    while len(ids) < len(config.replica_dirs):
        if candidate != config.node_id:
            ids.append(candidate)
        candidate += 1
    return ids


def _leader_address(config: Config) -> str:
    if config.unix_listener:
        return config.unix_listener
    for listener in config.listeners:
        if listener.port:
            host = listener.host if listener.host not in ("", "0.0.0.0", "::") else "127.0.0.1"
            return f"{host}:{listener.port}"
    raise ConfigError("appliance.replica.dirs: the replicas reach the broker through appliance.unix.listener "
                      "or a listener with a fixed port; this configuration has neither")


def replica_config(config: Config, directory: str, node_id: int) -> Config:
    """The configuration of the replica ``appliance serve`` runs on ``directory``."""
    return dataclasses.replace(
        config, log_dirs=(directory,), node_id=node_id, replica_dirs=(),
        replica_leader=_leader_address(config), control_socket=os.path.join(directory, ".appliance.sock"),
        unix_listener=None,
    )


def child_specs(config: Config) -> list[ChildSpec]:
    """The supervisor's hook (``EXTRA_CHILDREN``): one replica process per ``appliance.replica.dirs``."""
    specs = []
    for directory, node_id in zip(config.replica_dirs, replica_node_ids(config), strict=True):
        child = replica_config(config, directory, node_id)
        specs.append(ChildSpec(name=f"replica-{node_id}", target=_child_target(child),
                               title=f"appliance: replica {node_id}", stop_timeout_ms=15_000))
    return specs


def _child_target(config: Config) -> Callable[[ChildContext], int]:
    def target(context: ChildContext) -> int:
        return replica_child(config)

    return target


def replica_child(config: Config) -> int:
    """Body of a replica child of ``appliance serve`` (title, parent-death signal set by the supervisor)."""
    assert config.replica_leader is not None
    return ReplicaNode(config, [config.replica_leader], spawned_by=os.getppid()).run()

