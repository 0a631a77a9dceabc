"""The partitions this node leads, as the supervisor keeps them: each one's log recovered before its writer
starts, its state page and doorbell, its writer's spec and command channel, the producer rings it serves.

Recovery (:func:`recover_partition`) opens the log with ``recover=True`` (torn tails cut, indexes rebuilt)
and closes it cleanly, so the writer forked next opens a log with nothing to repair.  A writer of the
previous run still holding the log's lock (its supervisor was killed; it drains and exits on its own,
``PR_SET_PDEATHSIG``) is waited for, up to 30 s.  Then the state page is created and seeded with the
offsets the log has (log end, log start, leader epoch and its start), and the partition's doorbell.

Replication
-----------
A topic of replication factor R > 1 is assigned R node ids (``appliance.config.topic_metadata.
assign_replicas``); this node leads all of them.  For such a partition, while the log is open, a new leader
epoch begins at its log end (``replicas.leader_epochs.begin_leader_epoch``: every start of a leader is a new
epoch, so a follower holding records this leader lost or never had truncates them), and the state page is
seeded from ``replica-state.json`` (the checkpointed high watermark, the ISR size, the topic's
``min.insync.replicas``).  The writer does not publish the high watermark of such a partition: the broker's
replication layer does (``appliance.broker.replication``).

Offline
-------
A log that does not open because it is damaged beyond what recovery cuts by itself (``storage.recovery``
rule 4: an invalid batch with valid batches after it; rule 5) takes only its partition *offline*: the
supervisor logs one error naming the file, the position, the offsets, the reason and what to do, writes the
reason into the directory's ``.offline`` note (local consumers read it), and keeps the partition with
``offline`` set: a state page and doorbell exist (so names stay valid) but no writer is started, ``attach``
is refused with KAFKA_STORAGE_ERROR, ``metadata`` reports the reason, and the broker answers the partition
with KAFKA_STORAGE_ERROR.  Every other partition starts and serves.  ``appliance repair`` and a restart
bring it back (the note is removed when the log opens).

The writer's channel carries JSON lines both ways (``appliance.server.writer``): :meth:`Partition.tell_writer`
sends a command and rings the doorbell, :meth:`Partition.read_writer` reads the writer's reports.
:meth:`Partition.ask_writer` sends a command the writer answers (DeleteRecords): numbered with an ``"id"``
its reply carries, queued for the next writer while none runs (:meth:`Partition.deliver_queued` at its
start), and answered with an error if the writer exits before it replied (:meth:`Partition.writer_gone`).
"""

from __future__ import annotations

import itertools
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from appliance.config.server_config import Config
from appliance.config.topic_metadata import TopicMetadata
from appliance.server.children import Child
from appliance.server.writer import WriterSpec
from appliance.server.writer_timers import idle_due_in_ms
from ipc.control import encode
from ipc.ring import RingNames
from ipc.shm import Permissions, ShmNames
from ipc.state_page import StatePage
from ipc.wakeup import Doorbell
from replicas.leader_epochs import begin_leader_epoch
from replicas.replica_state import read_replica_state
from storage.errors import CorruptRecordError, LogLockedError
from storage.log import Log
from storage.log_config import LogConfig
from storage.log_dir import write_offline_note

__all__ = ["Partition", "RingRecord", "open_log", "recover_partition"]

_OPEN_WAIT_S = 30.0  # for a previous run's writer to let go of the log
_COMMAND_IDS = itertools.count(1)  # numbers the commands a writer answers (ask_writer)

Answer = Callable[[dict[str, Any]], None]  # a writer's reply to ask_writer, or an error reply

_log = logging.getLogger("appliance.supervisor")


@dataclass
class RingRecord:
    """A producer ring attached to a partition: its names, its owner, whether it is being let go."""

    names: RingNames
    topic: str
    partition: int
    session: int
    connection: int  # the control connection it was attached through
    producer_id: int
    detaching: bool = False
    ahead: bool = False  # attached ahead of need: its first frame posts the doorbell (writer_demand)

    def attach_command(self) -> dict[str, Any]:
        """The writer's command to serve this ring."""
        names = self.names
        return {"op": "attach", "ring": names.ring, "space": names.space, "doorbell": names.doorbell}


@dataclass
class Partition:
    """A partition this node leads: its directory, writer spec, state page, doorbell, writer, rings."""

    topic: str
    partition: int
    directory: str
    spec: WriterSpec
    page: StatePage
    doorbell: Doorbell
    writer: Child
    rings: dict[str, RingRecord] = field(default_factory=dict)
    offline: str = ""  # why the log was not opened (module docstring, "Offline"); empty: served
    idle_due_in_ms: int | None = None  # at recovery: when the log needs a writer with no producer
    queued: list[dict[str, Any]] = field(default_factory=list)  # ask_writer's commands for the next writer
    waiting: dict[int, Answer] = field(default_factory=dict)  # command id -> who wants the writer's reply

    @property
    def name(self) -> str:
        return f"{self.topic}-{self.partition}"

    def tell_writer(self, command: Mapping[str, Any]) -> None:
        """Send a command to the partition's writer (if it runs) and ring its doorbell.  A writer told to
        stop gets no other command: a ring attached meanwhile is handed to the next writer (a stopping
        writer lets go of every ring it serves, and the supervisor would unlink it)."""
        channel = self.writer.channel
        if channel is None:
            return  # not running, or restarting: the next writer gets the ring list when it starts
        if self.writer.stopping and command.get("op") != "stop":
            return
        data = encode(command)
        channel.setblocking(True)
        try:
            channel.sendall(data)
        except OSError as exc:
            _log.warning("writer %s: command %s not delivered: %s", self.name, command.get("op"), exc)
        finally:
            channel.setblocking(False)
        self.doorbell.ring()

    def ask_writer(self, command: Mapping[str, Any], answer: Answer) -> bool:
        """Send ``command`` (numbered) to the writer, whose reply goes to ``answer``; while no writer can
        take it (none runs, or it is stopping) it is queued for the next one.  Returns whether it was
        queued: then the caller starts a writer (``Supervisor.wake_partition``)."""
        numbered = {**command, "id": next(_COMMAND_IDS)}
        self.waiting[numbered["id"]] = answer
        if self.writer.channel is None or self.writer.stopping:
            self.queued.append(numbered)
            return True
        self.tell_writer(numbered)
        return False

    def deliver_queued(self) -> None:
        """A writer was started: hand it the commands that waited for one."""
        queued, self.queued = self.queued, []
        for command in queued:
            self.tell_writer(command)

    def take_reply(self, message: Mapping[str, Any]) -> bool:
        """Whether ``message`` answered an :meth:`ask_writer` (then its ``answer`` was called)."""
        command_id = message.get("id")
        answer = self.waiting.pop(command_id, None) if isinstance(command_id, int) else None
        if answer is None:
            return False
        answer(dict(message))
        return True

    def writer_gone(self, how: str) -> None:
        """The writer exited: the commands it was given and did not answer are answered with an error
        (those still queued wait for the next writer)."""
        queued = {command["id"] for command in self.queued}
        for command_id in [i for i in self.waiting if i not in queued]:
            self.waiting.pop(command_id)({"ok": False, "error": "NOT_LEADER_OR_FOLLOWER",
                                          "message": f"the writer of {self.name} {how} before it answered; "
                                                     "retry"})  # fmt: skip

    def read_writer(self) -> list[dict[str, Any]] | None:
        """The complete messages the writer sent since the last call; None at end of file (it is exiting)."""
        child = self.writer
        channel = child.channel
        if channel is None:
            return []
        try:
            data = channel.recv(1 << 16)
        except BlockingIOError:
            return []
        except OSError:
            data = b""
        if not data:
            return None
        child.inbox += data
        messages = []
        while (end := child.inbox.find(b"\n")) >= 0:
            line = bytes(child.inbox[:end])
            del child.inbox[: end + 1]
            try:
                messages.append(json.loads(line))
            except ValueError:
                _log.error("writer %s sent a malformed line %r", self.name, line[:80])
        return messages

    def release(self) -> None:
        """Close and remove the state page and the doorbell (the writer has stopped)."""
        self.page.close()
        self.page.unlink()
        self.doorbell.close()
        self.doorbell.unlink()


class _StartingState(NamedTuple):
    """What a partition's state page starts with."""

    log_end_offset: int
    log_start_offset: int
    leader_epoch: int
    epoch_start_offset: int
    high_watermark: int
    isr_size: int  # replicated partitions: the in-sync replicas, leader included


def recover_partition(config: Config, topic: TopicMetadata, partition: int, *, names: ShmNames,
                      permissions: Permissions, broker_wake_fd: int,
                      should_stop: Callable[[], bool]) -> Partition:  # fmt: skip
    """Recover the partition's log (and close it cleanly), create its state page and doorbell."""
    directory = topic.directory(partition)
    log_config = config.log_config(topic.name, dict(topic.configs))
    effective = config.topic(topic.name, dict(topic.configs))
    replicated = topic.replication_factor > 1
    offline = ""
    due_in_ms: int | None = None
    try:
        log = open_log(directory, log_config, (topic.name, partition), should_stop)
    except CorruptRecordError as exc:
        offline = (f"{exc}; run `appliance repair {directory}` (or restore the partition from a replica), "
                   "then restart the appliance")
        _log.error("partition %s-%d is OFFLINE, its log was not opened: %s (the other partitions serve)",
                   topic.name, partition, offline)  # fmt: skip
        state = _StartingState(0, 0, 0, 0, high_watermark=0, isr_size=1)
    else:
        try:
            state = _starting_state(log, directory, replicated, config.node_id)
            due_in_ms = idle_due_in_ms(log, retention_enabled="delete" in effective.cleanup_policy,
                                       retention_check_interval_ms=config.retention_check_interval_ms)
        finally:
            log.close(clean=True)
    write_offline_note(directory, offline or None)
    page_name = names.state_page(topic.name, partition)
    doorbell_name = names.doorbell(topic.name, partition)
    page = StatePage.create(page_name, permissions)
    try:
        _seed_page(page, state, effective.min_insync_replicas, replicated)
        doorbell = Doorbell.create(doorbell_name, permissions)
    except BaseException:
        page.close()
        page.unlink()
        raise
    spec = WriterSpec(
        topic=topic.name,
        partition=partition,
        directory=directory,
        log_config=log_config,
        leader_epoch=state.leader_epoch,
        state_page=page_name,
        doorbell=doorbell_name,
        publish_high_watermark=topic.replication_factor == 1,
        broker_wake_fd=broker_wake_fd,
        retention_check_interval_ms=config.retention_check_interval_ms,
        log_dir_min_free_bytes=config.log_dir_min_free_bytes,
        retention_enabled="delete" in effective.cleanup_policy,
        test_faults=tuple(config.test_faults),
    )
    return Partition(topic.name, partition, directory, spec, page, doorbell, Child("writer", spec.name),
                     offline=offline, idle_due_in_ms=due_in_ms)


def open_log(
    directory: str, log_config: LogConfig, tp: tuple[str, int], should_stop: Callable[[], bool]
) -> Log:
    """Open (recovering) a log; wait up to 30 s for a previous run's writer still holding it (a writer
    orphaned by a killed supervisor drains and exits on its own: PR_SET_PDEATHSIG)."""
    deadline = time.monotonic() + _OPEN_WAIT_S
    waited = False
    while True:
        try:
            return Log.open(directory, log_config, topic_partition=tp, recover=True)
        except LogLockedError as exc:
            if time.monotonic() > deadline or should_stop():
                raise
            if not waited:
                _log.warning("%s; waiting for it to exit", exc)
                waited = True
            time.sleep(0.05)


def _starting_state(log: Log, directory: str, replicated: bool, node_id: int) -> _StartingState:
    """The offsets of the recovered log; for a replicated partition, a new leader epoch begun at its end
    and the high watermark and ISR size of ``replica-state.json`` (module docstring, "Replication")."""
    end, start = log.log_end_offset, log.log_start_offset
    if not replicated:
        epoch = max(log.latest_epoch, 0)
        epoch_start = log.leader_epoch_cache.entries[-1][1] if log.latest_epoch >= 0 else end
        return _StartingState(end, start, epoch, epoch_start, high_watermark=end, isr_size=1)
    # A new leader epoch at every start of a leader, before any append: a follower holding records this
    # log lost or never had truncates them (replicas.leader_epochs).
    persisted = read_replica_state(directory)
    previous = max(log.latest_epoch, persisted.leader_epoch if persisted is not None else -1)
    epoch = previous + 1
    epoch_start = begin_leader_epoch(log, epoch)
    known = persisted.high_watermark if persisted is not None else 0
    isr_size = 1
    if persisted is not None and persisted.leader_id == node_id and persisted.isr:
        isr_size = len(set(persisted.isr) | {node_id})
    return _StartingState(end, start, epoch, epoch_start, max(start, min(known, end)), isr_size)


def _seed_page(page: StatePage, state: _StartingState, min_insync_replicas: int, replicated: bool) -> None:
    page.log_end_offset = state.log_end_offset
    page.high_watermark = state.high_watermark
    page.log_start_offset = state.log_start_offset
    page.min_insync_replicas = min_insync_replicas
    if replicated:  # the broker's replication layer owns these from now on
        page.committed_high_watermark = state.high_watermark
        page.isr_size = state.isr_size
    page.set_leader_epoch(state.leader_epoch, state.epoch_start_offset)
