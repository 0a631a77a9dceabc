"""Topic administration the supervisor answers: a topic's settings altered, partitions added, records deleted.

Theory of operation
-------------------
These are the control operations behind Kafka's AlterConfigs / IncrementalAlterConfigs, CreatePartitions
and DeleteRecords (the broker turns the Kafka requests into them: ``appliance.broker.config_requests``,
``appliance.broker.partition_requests``) and behind ``appliance configs`` and ``appliance topics alter``.

**Altering settings** (``alter_topic_configs``: ``set``, ``delete``, ``replace``, ``validate_only``).  The
new override set is the stored one (or nothing, with ``replace``: AlterConfigs replaces the whole set)
without the ``delete`` keys, with the ``set`` values.  It is validated whole through the settings catalog
(``appliance.config.topic_configs``, as a creation's are): a bad key or value is INVALID_CONFIG naming it,
and nothing changes.  Then, in this order:

1. the metadata file is rewritten atomically with the new overrides (through the meta reserve, so a full
   disk does not refuse it): the commit point; a failed write changes nothing;
2. each served partition's writer spec gets the new ``LogConfig`` (the next writer started uses it), and a
   running writer is told ``reload_config``: it reopens its log with the new settings between two rounds
   (``appliance.server.writer``);
3. if what retention does changed (``retention.ms``, ``retention.bytes``, ``cleanup.policy``), each
   partition is woken (``Supervisor.wake_partition``): a running writer runs its timers now, a partition
   with no writer has one started for them, which reports its next due at its stop -- the due time of a
   partition with no writer is recomputed with the new settings.

The settings of the configuration file's ``[topics.NAME]`` table are not in the stored set: they apply at
every start, under the stored ones (a stored value wins), and AlterConfigs cannot remove them.

**Adding partitions** (``create_partitions``: ``count``, ``validate_only``): all-or-nothing as a topic's
creation is (``appliance.server.topic_changes``, "Add partitions"); answered when the new partitions are
served.  Replicated topics are refused: their followers would not learn of the new partitions.

**Deleting records** (``delete_records``: ``partition``, ``offset``): the partition's writer moves its log
start offset (one writer per log and per state-page field), so the op is a command the writer answers
(``Partition.ask_writer``); a partition with no writer running has one started for it.  The reply
(``low_watermark``) comes when the writer has done it.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from typing import Any, Final, Protocol

from appliance.config.server_config import Config, ConfigError, parse_override
from appliance.config.topic_metadata import TopicMetadata
from appliance.server.metadata import MetadataStore
from appliance.server.partitions import Partition
from appliance.server.topic_changes import TopicChanges
from ipc.control import error_response, ok_response
from ipc.kafka.errors import ErrorCode
from storage.errors import UnknownTopicOrPartitionError

__all__ = ["NOT_TOPIC_SETTINGS", "Administered", "TopicAdmin"]

# Given as their own fields (CreateTopics, CreatePartitions), never as a topic's settings
NOT_TOPIC_SETTINGS: Final = frozenset(
    {"partitions", "replication.factor", "num.partitions", "default.replication.factor"}
)
_RETENTION_FIELDS: Final = ("retention_ms", "retention_bytes")

Reply = Callable[[dict[str, Any]], None]

_log = logging.getLogger("appliance.supervisor")


class Administered(Protocol):
    """What the administration ops need of the supervisor."""

    def wake_partition(self, part: Partition) -> None: ...


class TopicAdmin:
    """The supervisor's answers to ``alter_topic_configs``, ``create_partitions`` and ``delete_records``
    (module docstring)."""

    def __init__(self, supervisor: Administered, config: Config, store: MetadataStore, changes: TopicChanges,
                 partitions: Mapping[tuple[str, int], Partition]) -> None:  # fmt: skip
        self.supervisor = supervisor
        self.config = config
        self.store = store
        self.changes = changes
        self.partitions = partitions

    # -- settings -----------------------------------------------------------------------------------------

    def alter_configs(self, message: Mapping[str, Any]) -> dict[str, Any]:
        """``alter_topic_configs``: validate the new override set; unless ``validate_only``, store and apply
        it.  The reply's ``configs``: the topic's stored overrides afterwards."""
        name = str(message["topic"])
        topic = self.store.get(name)
        new = {} if message.get("replace") else dict(topic.configs)
        for key in message.get("delete") or ():
            new.pop(str(key), None)
        for key, value in dict(message.get("set") or {}).items():
            new[str(key)] = parse_override(f"{key}={value}")[1] if isinstance(value, str) else value
        refused = sorted(NOT_TOPIC_SETTINGS & set(new))
        if refused:
            raise ConfigError(f"topic {name!r}: {refused[0]} is not a topic setting; use CreatePartitions "
                              "(`appliance topics alter --partitions N`) for the count")  # fmt: skip
        self.config.log_config(name, new)  # validates every key and value: ConfigError -> INVALID_CONFIG
        if message.get("validate_only"):
            return ok_response(configs=_json(new))
        before = self.config.topic(name, dict(topic.configs))
        topic = self.store.set_configs(name, new)
        self._apply(topic, before.cleanup_policy)
        _log.info("topic %s: settings altered; its overrides are now %s", name, _json(new) or "none")
        return ok_response(configs=_json(new))

    def _apply(self, topic: TopicMetadata, policy_before: tuple[str, ...]) -> None:
        """Steps 2 and 3 of the module docstring, for every served partition of ``topic``."""
        effective = self.config.topic(topic.name, dict(topic.configs))
        log_config = self.config.log_config(topic.name, dict(topic.configs))
        retention_enabled = "delete" in effective.cleanup_policy
        for index in range(topic.partitions):
            part = self.partitions.get((topic.name, index))
            if part is None or part.offline:
                continue
            old = part.spec
            part.spec = dataclasses.replace(old, log_config=log_config, retention_enabled=retention_enabled)
            if topic.replication_factor == 1:  # else the broker's replication layer owns it
                part.page.min_insync_replicas = effective.min_insync_replicas
            part.tell_writer({"op": "reload_config", "log_config": log_config.to_properties(),
                              "retention_enabled": retention_enabled})  # fmt: skip
            retention_changed = old.retention_enabled != retention_enabled or any(
                getattr(old.log_config, f) != getattr(log_config, f) for f in _RETENTION_FIELDS
            )
            if retention_changed or policy_before != effective.cleanup_policy:
                self.supervisor.wake_partition(part)

    # -- partitions ---------------------------------------------------------------------------------------

    def create_partitions(self, message: Mapping[str, Any]) -> dict[str, Any] | TopicMetadata:
        """``create_partitions``: the error reply, or the topic with its new count (``validate_only``: as it
        is, nothing changed)."""
        name = str(message["topic"])
        count = message["count"]
        topic = self.store.get(name)
        if name in self.changes.being_created:
            raise UnknownTopicOrPartitionError(f"topic {name!r} is still being created")
        if not isinstance(count, int) or isinstance(count, bool) or count <= topic.partitions:
            return error_response(ErrorCode.INVALID_PARTITIONS, f"topic {name!r} has {topic.partitions} "
                                  f"partitions; the new count must be larger, not {count!r}")  # fmt: skip
        assignments = self._new_assignments(message.get("assignments"), topic, count)
        if isinstance(assignments, str):
            return error_response(ErrorCode.INVALID_REPLICA_ASSIGNMENT, f"topic {name!r}: {assignments}")
        if message.get("validate_only"):
            return topic  # as it is: it would be given count partitions
        return self.changes.add_partitions(name, count, assignments)

    def _new_assignments(self, asked: object, topic: TopicMetadata,
                         count: int) -> tuple[tuple[int, ...], ...] | str:  # fmt: skip
        """The new partitions' replicas of an explicit assignment (checked by the broker:
        ``appliance.config.replica_assignment``; checked again here for its shape), or () if none."""
        if asked is None:
            return ()
        node_id, factor, added = self.config.node_id, topic.replication_factor, count - topic.partitions
        if not isinstance(asked, list) or len(asked) != added:
            return f"assignments {asked!r}: expected the replicas of each of the {added} new partitions"
        out = []
        for index, nodes in enumerate(asked, start=topic.partitions):
            if (not isinstance(nodes, list) or len(nodes) != factor or len(set(nodes)) != len(nodes)
                    or not all(isinstance(n, int) and n >= 0 for n in nodes) or node_id not in nodes):
                return (f"partition {index}: replicas {nodes!r}: expected {factor} distinct node ids, this "
                        f"node ({node_id}) among them")  # fmt: skip
            out.append(tuple(nodes))
        return tuple(out) if factor > 1 else ()

    # -- records ------------------------------------------------------------------------------------------

    def delete_records(self, message: Mapping[str, Any], reply: Reply) -> dict[str, Any] | None:
        """``delete_records``: the error reply now, or None: ``reply`` is called when the writer answered."""
        name, index, offset = str(message["topic"]), message["partition"], message["offset"]
        topic = self.store.get(name)
        part = self.partitions.get((name, index)) if isinstance(index, int) else None
        if part is None:
            raise UnknownTopicOrPartitionError(f"topic {name!r} has partitions 0..{topic.partitions - 1}, "
                                               f"not {index!r}")  # fmt: skip
        if part.offline:
            return error_response(ErrorCode.KAFKA_STORAGE_ERROR, f"partition {part.name} is offline: "
                                  f"{part.offline}", offline=True)  # fmt: skip
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
            return error_response(ErrorCode.OFFSET_OUT_OF_RANGE, f"partition {part.name}: offset {offset!r}: "
                                  "expected an offset at least 0")  # fmt: skip

        def answered(answer: dict[str, Any]) -> None:
            if answer.get("ok"):
                reply(ok_response(low_watermark=int(answer["low_watermark"])))
            else:
                code = ErrorCode.__members__.get(str(answer.get("error")), ErrorCode.UNKNOWN_SERVER_ERROR)
                reply(error_response(code, str(answer.get("message", "the writer refused"))))

        if part.ask_writer({"op": "delete_records", "offset": offset}, answered):
            self.supervisor.wake_partition(part)  # no writer takes it now: one is started for it
        return None


def _json(configs: Mapping[str, Any]) -> dict[str, Any]:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in configs.items()}
