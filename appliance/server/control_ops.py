"""The control operations the supervisor answers: topics, producer ids, rings, status, replication state.

The protocol (one JSON request, one JSON answer; the ops and their fields) is ``ipc.control``; the socket
server is ``ipc.control_server``.  :meth:`ControlOps.handle` is the server's handler: it dispatches on
``"op"`` and turns what an op raises into the Kafka error its client expects:

=================================== ===============================
UnknownTopicOrPartitionError        UNKNOWN_TOPIC_OR_PARTITION
TopicExistsError                    TOPIC_ALREADY_EXISTS
ConfigError                         INVALID_CONFIG
a missing or mistyped field         INVALID_REQUEST
OSError (a file system error)       KAFKA_STORAGE_ERROR (logged)
ApplianceError                      UNKNOWN_SERVER_ERROR (logged)
anything else (a bug)               UNKNOWN_SERVER_ERROR (logged with its traceback): a bug costs one request
=================================== ===============================

The ops read the topic metadata store, the partitions' state pages and the ring table; what starts or stops
processes (a new topic's writers, a deleted topic's, the writer of a partition a producer attaches to: they
run on demand, ``appliance.server.writer_demand``) they ask of the supervisor (:class:`Supervised`).
A partition with no writer running is described with ``writer_pid`` 0 and its state page's offsets.
While the supervisor stops, the ops that would create something refuse and the others still answer.
Creating and deleting a topic are all-or-nothing (``appliance.server.topic_changes``); altering a topic's
settings, adding partitions and deleting records are ``appliance.server.topic_admin``; the cleaner's
``swap_cleaned`` is ``appliance.server.clean_handoff``.

``metadata`` describes each topic on its own: a partition the supervisor does not serve is reported with
``offline`` saying so, and a topic that cannot be described at all is listed with ``error`` and
``message`` (logged with its name); the other topics are answered in full.  Topics marked for deletion are
not listed.

Unique memory (``/proc/PID/smaps_rollup``) takes milliseconds a process to read: ``metadata`` and ``status``
answer each writer's last measure and renew the stalest ones for at most :data:`_WRITER_MEMORY_BUDGET_S` a
request, so their cost does not grow with the partition count; ``status`` with ``"memory": true`` measures
every child now (what a benchmark wants).

Producer ids of node N start at N << 40: a replica promoted to leader never hands out an id its former
leader gave (the producer-ids file is per node).  Node ids must differ below 2**22.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from typing import Any, Final, Protocol

from appliance.config.server_config import Config, ConfigError, check_new_topic_name
from appliance.config.topic_metadata import TopicMetadata, assign_replicas
from appliance.server.children import Child, unique_memory_bytes
from appliance.server.clean_handoff import swap_cleaned
from appliance.server.metadata import MetadataStore
from appliance.server.partitions import Partition
from appliance.server.rings import RingTable
from appliance.server.topic_admin import TopicAdmin
from appliance.server.topic_changes import Done, TopicChanges
from ipc.control import error_response, ok_response
from ipc.control_server import CloseConnection, ServerConnection
from ipc.kafka.errors import ErrorCode
from ipc.ring_layout import HEADER_BYTES, ack_slots_for
from ipc.shm import ShmNames
from ipc.state_page import StatePage, monotonic_ms
from storage.errors import ApplianceError, TopicExistsError, UnknownTopicOrPartitionError
from storage.producer_ids import ProducerIdBlockAllocator

__all__ = ["MAX_REPLICATION_FACTOR", "ControlOps", "Supervised", "check_replication_factor"]

MAX_REPLICATION_FACTOR: Final = 100  # default.replication.factor's bound
_MAX_PARTITIONS: Final = 100_000
_PRODUCER_ID_NODE_SHIFT: Final = 40  # module docstring
_WRITER_MEMORY_MAX_AGE_S: Final = 5.0  # a writer's unique memory in metadata is this old, or older ...
_WRITER_MEMORY_BUDGET_S: Final = 0.02  # ... when measuring them all would hold one request longer than this

_log = logging.getLogger("appliance.supervisor")

# test seams (appliance.server.faults): the op whose reply a delay point holds
_SLOW_REPLY_POINTS: Final = {"attach": "attach.slow", "attach_many": "attach.slow",
                             "create_topic": "create.slow_reply"}  # fmt: skip

_Op = Callable[["ControlOps", ServerConnection, Mapping[str, Any]], "dict[str, Any] | None"]


class Supervised(Protocol):
    """What the control operations need of the supervisor."""

    config: Config
    names: ShmNames
    started_s: float

    @property
    def stopping(self) -> bool: ...

    def children(self) -> list[Child]: ...

    def control_connections(self) -> int: ...

    def need_writer(self, part: Partition, *, ahead: bool = False) -> None: ...

    def wake_partition(self, part: Partition) -> None: ...


def check_replication_factor(name: str, replication_factor: int) -> None:
    """ConfigError unless 1 <= ``replication_factor`` <= :data:`MAX_REPLICATION_FACTOR`."""
    if not 1 <= replication_factor <= MAX_REPLICATION_FACTOR:
        raise ConfigError(
            f"topic {name!r}: replication factor {replication_factor}, expected 1..{MAX_REPLICATION_FACTOR}"
        )


class ControlOps:
    """The supervisor's answers on its control socket.  See the module docstring."""

    def __init__(self, supervisor: Supervised, store: MetadataStore, allocator: ProducerIdBlockAllocator,
                 partitions: Mapping[tuple[str, int], Partition], rings: RingTable,
                 changes: TopicChanges) -> None:  # fmt: skip
        self.supervisor = supervisor
        self.config = supervisor.config
        self.store = store
        self.changes = changes
        self.allocator = allocator
        self.partitions = partitions
        self.rings = rings
        self.admin = TopicAdmin(supervisor, self.config, store, changes, partitions)
        self.requests: dict[str, int] = {}  # requests answered since start, by op (``status``)
        self._measure_until_s = 0.0  # writers' memory is measured for a request until then
        self._late: list[tuple[float, ServerConnection, Mapping[str, Any], dict[str, Any]]] = []  # faults

    def handle(self, connection: ServerConnection, message: Mapping[str, Any]) -> dict[str, Any] | None:
        """Answer one request (module docstring: which exception becomes which error); None: answered
        later (``create_topic``)."""
        op = message.get("op")
        handler = self._OPS.get(op) if isinstance(op, str) else None
        if handler is None:
            return error_response(ErrorCode.INVALID_REQUEST, f"unknown op {op!r}; known: {sorted(self._OPS)}")
        self.requests[str(op)] = self.requests.get(str(op), 0) + 1
        self._measure_until_s = time.monotonic() + _WRITER_MEMORY_BUDGET_S
        try:
            reply = handler(self, connection, message)
        except CloseConnection:
            raise
        except Exception as exc:
            reply = _error_reply(op, exc, message)
        point = _SLOW_REPLY_POINTS.get(str(op))
        if reply is not None and point is not None:
            delay_ms = self.changes.faults.delay_ms(point)
            if delay_ms > 0:  # the test seam: this answer waits (appliance.server.faults)
                self._late.append((time.monotonic() + delay_ms / 1000, connection, message, reply))
                _log.warning("test fault point %s: the reply to %s waits %d ms", point, op, delay_ms)
                return None
        return reply

    def reply_late(self, now_s: float) -> None:
        """Send the replies the slow-reply test seams held whose time has come (the supervisor's loop)."""
        if not self._late:
            return
        due = [late for late in self._late if late[0] <= now_s]
        self._late = [late for late in self._late if late[0] > now_s]
        for _, connection, message, reply in due:
            _log.warning("test fault point: replying to %s now", message.get("op"))
            connection.reply(message, reply)

    def _reply_later(self, connection: ServerConnection, message: Mapping[str, Any]) -> Done:
        """The ``done`` of a topic being created: answer the creator when it is whole or rolled back."""

        def done(topic: TopicMetadata | None, error: BaseException | None) -> None:
            if topic is not None:
                connection.reply(message, ok_response(topic=self._topic_json(topic)))
            else:
                connection.reply(message, _error_reply(message.get("op"), error, message))

        return done

    def connection_closed(self, connection: ServerConnection) -> None:
        """A client went away: let go of every ring it attached."""
        for record in self.rings.of_connection(connection.id):
            self.rings.detach(record, self.partitions.get((record.topic, record.partition)))

    # -- topics -------------------------------------------------------------------------------------------

    def _op_metadata(self, connection: ServerConnection, message: Mapping[str, Any]) -> dict[str, Any]:
        wanted = message.get("topics")
        creating = self.changes.being_created
        if wanted is None:
            topics = [t for t in self.store.topics.values() if t.name not in creating]
        else:
            topics = [self.store.get(str(name)) for name in wanted]
            for topic in topics:
                if topic.name in creating:
                    raise UnknownTopicOrPartitionError(f"topic {topic.name!r} is still being created")
        return ok_response(
            instance_id=self.config.instance_id,
            shm_prefix=self.supervisor.names.prefix,
            node_id=self.config.node_id,
            topics=[self._topic_json_or_error(t) for t in topics],
        )

    def _op_create_topic(
        self, connection: ServerConnection, message: Mapping[str, Any]
    ) -> dict[str, Any] | None:
        name = message["topic"]
        internal = message.get("internal") is True  # the broker creating __consumer_offsets
        reason = (check_new_topic_name(name, internal=internal) if isinstance(name, str)
                  else "a topic name must be a string")
        if reason is not None:
            return error_response(ErrorCode.INVALID_TOPIC_EXCEPTION, f"topic {name!r}: {reason}")
        partitions = message.get("partitions") or self.config.num_partitions
        replication = message.get("replication_factor") or self.config.default_replication_factor
        configs = dict(message.get("configs") or {})
        if not isinstance(partitions, int) or not 1 <= partitions <= _MAX_PARTITIONS:
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
        if self.changes.faults.fires("create.drop_connection"):
            raise CloseConnection("test fault point create.drop_connection")
        replicas = self._replicas(message.get("replicas"), replication)
        if isinstance(replicas, str):
            return error_response(ErrorCode.INVALID_REPLICA_ASSIGNMENT, f"topic {name!r}: {replicas}")
        assignments = self._assignments(message.get("assignments"), partitions, replication)
        if isinstance(assignments, str):
            return error_response(ErrorCode.INVALID_REPLICA_ASSIGNMENT, f"topic {name!r}: {assignments}")
        done = self._reply_later(connection, message)
        topic = self.changes.begin_create(name, partitions, replication, configs, replicas, done,
                                          internal=internal, assignments=assignments)
        if message.get("wait", True) is False:
            return ok_response(topic=self._topic_json(topic))
        return None  # answered by done() once every partition is served (topic_changes)

    def _replicas(self, asked: object, replication: int) -> tuple[int, ...] | str:
        """The replicas to record: an explicit assignment's (checked by the broker:
        ``appliance.config.replica_assignment``; checked again here for its shape), else assigned."""
        node_id = self.config.node_id
        if asked is None:
            return assign_replicas(node_id, replication)
        if not isinstance(asked, list) or not all(isinstance(n, int) and n >= 0 for n in asked):
            return f"replicas {asked!r}: expected a list of node ids"
        if replication == 1 and asked in ([], [node_id]):
            return ()
        if len(asked) != replication or len(set(asked)) != len(asked) or node_id not in asked:
            return (f"replicas {asked}: expected {replication} distinct node ids, this node ({node_id}) "
                    "among them")  # fmt: skip
        return tuple(asked)

    def _assignments(self, asked: object, partitions: int,
                     replication: int) -> tuple[tuple[int, ...], ...] | str:  # fmt: skip
        """Each partition's replicas of an explicit assignment (checked by the broker:
        ``appliance.config.replica_assignment``; checked again here for its shape), or () if none."""
        if asked is None:
            return ()
        node_id = self.config.node_id
        if not isinstance(asked, list) or len(asked) != partitions:
            return f"assignments {asked!r}: expected the replicas of each of {partitions} partitions"
        out = []
        for index, nodes in enumerate(asked):
            if (not isinstance(nodes, list) or len(nodes) != replication or len(set(nodes)) != len(nodes)
                    or not all(isinstance(n, int) and n >= 0 for n in nodes) or node_id not in nodes):
                return (f"partition {index}: replicas {nodes!r}: expected {replication} distinct node ids, "
                        f"this node ({node_id}) among them")  # fmt: skip
            out.append(tuple(nodes))
        return tuple(out)

    def _create_topic(
        self, name: str, partitions: int, replication: int, configs: Mapping[str, Any]
    ) -> TopicMetadata:
        replicas = assign_replicas(self.config.node_id, replication)
        return self.changes.create(name, partitions, replication, configs, replicas)

    def _op_delete_topic(self, connection: ServerConnection, message: Mapping[str, Any]) -> dict[str, Any]:
        if not self.config.delete_topic_enable:
            return error_response(ErrorCode.TOPIC_DELETION_DISABLED, "delete.topic.enable is false")
        pending = self.changes.delete(str(message["topic"]))
        if pending:  # recorded: gone for clients; the rest is finished later (topic_changes)
            return ok_response(pending=f"the deletion is recorded and finishes later: {pending}")
        return ok_response()

    def _op_alter_topic_configs(
        self, connection: ServerConnection, message: Mapping[str, Any]
    ) -> dict[str, Any]:
        return self.admin.alter_configs(message)

    def _op_create_partitions(
        self, connection: ServerConnection, message: Mapping[str, Any]
    ) -> dict[str, Any]:
        if self.supervisor.stopping:
            return error_response(ErrorCode.BROKER_NOT_AVAILABLE, "the appliance is stopping")
        result = self.admin.create_partitions(message)
        return result if isinstance(result, dict) else ok_response(topic=self._topic_json(result))

    def _op_delete_records(
        self, connection: ServerConnection, message: Mapping[str, Any]
    ) -> dict[str, Any] | None:
        return self.admin.delete_records(message, lambda reply: connection.reply(message, reply))

    # -- producers ----------------------------------------------------------------------------------------

    def _op_swap_cleaned(
        self, connection: ServerConnection, message: Mapping[str, Any]
    ) -> dict[str, Any] | None:
        part = self._partition(str(message["topic"]), message["partition"])
        return swap_cleaned(part, message, lambda reply: connection.reply(message, reply))

    def _op_init_producer_id(
        self, connection: ServerConnection, message: Mapping[str, Any]
    ) -> dict[str, Any]:
        node_base = (self.config.node_id % 2**22) << _PRODUCER_ID_NODE_SHIFT
        reserve = self.store.reserve
        if reserve is None:
            producer_id = self.allocator.allocate()
        else:  # a new block of ids is an atomic rewrite in the meta directory, like the topic metadata
            path = self.allocator.path
            producer_id = reserve.write(self.allocator.allocate, f"reserving producer ids in {path}",
                                        tmp=f"{path}.tmp")
        return ok_response(producer_id=node_base + producer_id, producer_epoch=0)

    def _op_attach(self, connection: ServerConnection, message: Mapping[str, Any]) -> dict[str, Any]:
        name = str(message["topic"])
        partition = message["partition"]
        if self.supervisor.stopping:
            return error_response(ErrorCode.BROKER_NOT_AVAILABLE, "the appliance is stopping")
        if name not in self.store:
            refusal = self._auto_create(name)
            if refusal is not None:
                return refusal
        part = self._partition(name, partition)
        if part.offline:
            return error_response(ErrorCode.KAFKA_STORAGE_ERROR,
                                  f"partition {part.name} is offline: {part.offline}", offline=True)
        producer_id = message.get("producer_id", -1)
        capacity = _ring_capacity(message.get("ring_bytes"), self.config.ring_initial_bytes,
                                  self.config.ring_bytes)
        ahead = message.get("ahead") is True
        record = self.rings.attach(part, connection.id, producer_id if isinstance(producer_id, int) else -1,
                                   capacity, ahead=ahead)
        # started if it does not run (the frames wait in the ring meanwhile); ahead: at the first frame
        self.supervisor.need_writer(part, ahead=ahead)
        _log.debug("pid %d attached ring %s (producer id %s)", connection.peer_pid, record.names.ring,
                   producer_id)  # fmt: skip
        names = record.names
        return ok_response(
            topic=name,
            partition=partition,
            session=record.session,
            ring=names.ring,
            space=names.space,
            doorbell=names.doorbell,
            state_page=part.page.name,
            ring_bytes=capacity,
            ring_bytes_max=self.config.ring_bytes,
            ack_slots=ack_slots_for(capacity),
            max_message_bytes=part.spec.log_config.max_message_bytes,
        )

    def _op_attach_many(self, connection: ServerConnection, message: Mapping[str, Any]) -> dict[str, Any]:
        """``attach`` for each [topic, partition] of ``partitions``: one reply each, in order; those also in
        ``ahead`` attached ahead of need (``appliance.server.writer_demand``)."""
        producer_id = message.get("producer_id", -1)
        ahead = {(str(t), p) for t, p in message.get("ahead") or ()}
        results = []
        for topic, partition in message["partitions"]:
            one = {"op": "attach", "topic": topic, "partition": partition, "producer_id": producer_id,
                   "ahead": (str(topic), partition) in ahead}  # fmt: skip
            try:
                results.append(self._op_attach(connection, one))
            except Exception as exc:
                results.append(_error_reply("attach", exc, one))
        return ok_response(results=results)

    def _auto_create(self, name: str) -> dict[str, Any] | None:
        """Create a topic a producer attaches to (auto.create.topics.enable); the refusal, if any."""
        if not self.config.auto_create_topics_enable:
            raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist (auto-creation is off)")
        reason = check_new_topic_name(name)
        if reason is not None:
            return error_response(ErrorCode.INVALID_TOPIC_EXCEPTION, f"topic {name!r}: {reason}")
        check_replication_factor(name, self.config.default_replication_factor)
        self._create_topic(name, self.config.num_partitions, self.config.default_replication_factor, {})
        return None

    def _partition(self, name: str, partition: object) -> Partition:
        topic = self.store.get(name)
        if (
            not isinstance(partition, int)
            or isinstance(partition, bool)
            or not 0 <= partition < topic.partitions
        ):
            raise UnknownTopicOrPartitionError(
                f"topic {name!r} has partitions 0..{topic.partitions - 1}, not {partition!r}"
            )
        part = self.partitions.get((name, partition))
        if part is None:
            raise UnknownTopicOrPartitionError(f"partition {name}-{partition} is not served now (see the "
                                               "supervisor's log)")  # fmt: skip
        return part

    def _op_detach(self, connection: ServerConnection, message: Mapping[str, Any]) -> dict[str, Any]:
        ring = str(message["ring"])
        record = self.rings.get(ring)
        if record is None or record.connection != connection.id:
            return error_response(
                ErrorCode.INVALID_REQUEST, f"ring {ring} is not attached through this connection"
            )
        self.rings.detach(record, self.partitions.get((record.topic, record.partition)))
        return ok_response()

    def _op_detach_many(self, connection: ServerConnection, message: Mapping[str, Any]) -> dict[str, Any]:
        """``detach`` for each ring of ``rings``; the first refusal is the reply (the others are done)."""
        refusal = None
        for ring in message["rings"]:
            reply = self._op_detach(connection, {"op": "detach", "ring": ring})
            if refusal is None and not reply.get("ok", True):
                refusal = reply
        return refusal or ok_response()

    # -- the node -----------------------------------------------------------------------------------------

    def _op_status(self, connection: ServerConnection, message: Mapping[str, Any]) -> dict[str, Any]:
        """Every child with its unique memory as last measured (``uss_age_s`` old): the stalest measures are
        renewed for at most the request's budget, all of them with ``"memory": true`` (costs milliseconds per
        child)."""
        everyone = self.supervisor.children()
        if message.get("memory") is True:
            self._measure_until_s = float("inf")
        for child in sorted(everyone, key=lambda c: c.uss_measured_s):
            if time.monotonic() >= self._measure_until_s:
                break
            child.refresh_memory(0.0 if message.get("memory") is True else _WRITER_MEMORY_MAX_AGE_S)
        now_s = time.monotonic()
        children = []
        for child in everyone:
            children.append({
                "role": child.role, "name": child.name, "pid": child.pid, "restarts": child.restarts,
                "uss_bytes": child.uss_bytes if child.pid else 0,
                "uss_age_s": round(now_s - child.uss_measured_s, 3) if child.uss_measured_s else None,
            })  # fmt: skip
        return ok_response(
            pid=os.getpid(),
            uptime_s=round(time.monotonic() - self.supervisor.started_s, 3),
            instance_id=self.config.instance_id,
            shm_prefix=self.supervisor.names.prefix,
            uss_bytes=unique_memory_bytes(os.getpid()),
            children=children,
            rings=len(self.rings),
            connections=self.supervisor.control_connections(),
            requests=dict(self.requests),
        )

    def _op_replica_status(
        self, connection: ServerConnection, message: Mapping[str, Any]
    ) -> dict[str, Any]:
        """This node leads: every topic with its replication state (``appliance replicas status``)."""
        return ok_response(role="leader", node_id=self.config.node_id,
                           topics=[self._topic_json(t) for t in self.store.topics.values()])

    def _op_promote(self, connection: ServerConnection, message: Mapping[str, Any]) -> dict[str, Any]:
        return error_response(ErrorCode.INVALID_REQUEST, f"node {self.config.node_id} already leads its "
                              "partitions: promote a replica (through its control socket), not the leader")

    _OPS: Final[dict[str, _Op]] = {
        "metadata": _op_metadata,
        "replica_status": _op_replica_status,
        "promote": _op_promote,
        "create_topic": _op_create_topic,
        "delete_topic": _op_delete_topic,
        "alter_topic_configs": _op_alter_topic_configs,
        "create_partitions": _op_create_partitions,
        "delete_records": _op_delete_records,
        "swap_cleaned": _op_swap_cleaned,
        "init_producer_id": _op_init_producer_id,
        "attach": _op_attach,
        "attach_many": _op_attach_many,
        "detach": _op_detach,
        "detach_many": _op_detach_many,
        "status": _op_status,
    }

    # -- a topic as JSON ----------------------------------------------------------------------------------

    def _topic_json_or_error(self, topic: TopicMetadata) -> dict[str, Any]:
        """The topic as JSON; if that fails, its name with an error (module docstring)."""
        try:
            return self._topic_json(topic)
        except Exception as exc:
            _log.exception("metadata: cannot describe topic %s", topic.name)
            return {"name": topic.name, "topic_id": topic.topic_id,
                    "error": ErrorCode.LEADER_NOT_AVAILABLE.name,
                    "message": f"topic {topic.name!r} cannot be described now: {exc!r}"}  # fmt: skip

    def _topic_json(self, topic: TopicMetadata) -> dict[str, Any]:
        node = self.config.node_id
        now_ms = monotonic_ms()
        replicated = topic.replication_factor > 1
        partitions = []
        for p in range(topic.partitions):
            part = self.partitions.get((topic.name, p))
            if part is None:
                partitions.append(self._unserved_json(topic, p, node))
            else:
                partitions.append(self._partition_json(part, node, now_ms, replicated))
            partitions[-1]["replicas"] = list(topic.partition_replicas(p) or (node,))
        effective = self.config.topic(topic.name, topic.configs)
        return {
            "name": topic.name,
            "topic_id": topic.topic_id,
            "replication_factor": topic.replication_factor,
            "replicas": [node, *(r for r in topic.nodes if r != node)],
            "min_insync_replicas": effective.min_insync_replicas,
            "configs": self._effective_overrides(topic),
            "max_message_bytes": effective.max_message_bytes,
            "cleanup_policy": list(effective.cleanup_policy),
            "partitions": partitions,
        }

    def _unserved_json(self, topic: TopicMetadata, partition: int, node: int) -> dict[str, Any]:
        """A partition of a recorded topic that has no writer, state page or doorbell here: offline."""
        names = self.supervisor.names
        return {
            "partition": partition, "state_page": names.state_page(topic.name, partition),
            "doorbell": names.doorbell(topic.name, partition), "directory": topic.directory(partition),
            "leader_epoch": -1, "log_start_offset": -1, "log_end_offset": -1, "high_watermark": -1,
            "leader": node, "isr": [node], "writer_pid": 0,
            "offline": f"partition {topic.name}-{partition} is not served (see the supervisor's log)",
        }  # fmt: skip

    def _partition_json(self, part: Partition, node: int, now_ms: int, replicated: bool) -> dict[str, Any]:
        # reading /proc/PID/smaps_rollup takes milliseconds: a request measures the stalest writers for a
        # bounded time, the next ones the rest, so metadata of thousands of partitions is answered at once
        if time.monotonic() < self._measure_until_s:
            part.writer.refresh_memory(_WRITER_MEMORY_MAX_AGE_S)
        page = part.page
        epoch, _ = page.leader_epoch()
        followers = _followers_json(page, now_ms) if replicated else []
        return {
            "partition": part.partition,
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
            "offline": part.offline,
        }

    def _effective_overrides(self, topic: TopicMetadata) -> dict[str, Any]:
        """The topic's own settings: the configuration file's [topics.NAME] and those given at creation."""
        overrides = self.config.topic(topic.name, topic.configs).overrides
        return {k: v for k, v in overrides.items() if k not in ("partitions", "replication.factor")}


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


def _error_reply(op: object, exc: BaseException | None, message: Mapping[str, Any]) -> dict[str, Any]:
    """The reply for what an op raised (module docstring: which exception becomes which error)."""
    if isinstance(exc, UnknownTopicOrPartitionError):
        return error_response(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, str(exc))
    if isinstance(exc, TopicExistsError):
        return error_response(ErrorCode.TOPIC_ALREADY_EXISTS, str(exc))
    if isinstance(exc, ConfigError):
        return error_response(ErrorCode.INVALID_CONFIG, str(exc))
    if isinstance(exc, KeyError | TypeError | ValueError):
        return error_response(ErrorCode.INVALID_REQUEST, f"op {op}: bad or missing field: {exc!r}")
    if isinstance(exc, OSError):
        _log.error("op %s failed: %s", op, exc)
        return error_response(ErrorCode.KAFKA_STORAGE_ERROR, f"op {op} failed: {exc}")
    if isinstance(exc, ApplianceError):
        _log.error("op %s failed: %s", op, exc)
        return error_response(ErrorCode.UNKNOWN_SERVER_ERROR, f"op {op} failed: {exc}")
    # a bug must cost one request, not the appliance
    _log.error("op %s failed unexpectedly (request %.200r)", op, message, exc_info=exc)
    return error_response(ErrorCode.UNKNOWN_SERVER_ERROR, f"op {op} failed: {exc!r}")


def _ring_capacity(requested: object, initial_bytes: int, max_bytes: int) -> int:
    """The capacity of a ring ``attach`` creates: the one asked for (``ring_bytes``, a producer growing its
    ring), else ``appliance.ring.initial.bytes``; rounded up to a page, at most ``appliance.ring.bytes``."""
    if not isinstance(requested, int) or isinstance(requested, bool) or requested <= 0:
        requested = initial_bytes
    pages = -(-requested // HEADER_BYTES)
    return min(max(pages * HEADER_BYTES, initial_bytes), max_bytes)
