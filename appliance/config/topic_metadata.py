"""The topic metadata file: which topics exist, their partitions, ids, per-topic settings and log dirs.

Theory of operation
-------------------
In the single-host default the supervisor owns cluster metadata (``appliance.server.metadata``, the one
writer).  It keeps it in one JSON file in the first log dir, ``<log.dirs[0]>/meta/topics.json``::

    {
      "version": 1,
      "topics": {
        "orders": {
          "topic_id": "4f6c1f1e-0c4d-4a53-9d7a-6a0f6f3e2b11",   a UUID, as Kafka gives every topic
          "partitions": 3,
          "replication_factor": 1,
          "configs": {"retention.ms": 86400000},                  topic-level overrides given at creation
          "log_dirs": ["/srv/a", "/srv/b", "/srv/a"],             where each partition's directory lives
          "replicas": [0, 1, 2]                                   replicated topics: the node ids holding
        },                                                        a copy (every partition alike)
        "spread": {
          ...,
          "replication_factor": 2,
          "assignments": [[0, 1], [2, 0], [0, 2]]                 or, when partitions differ: each
        }                                                         partition's replicas, in the order given
      },
      "deleting": {"old": {...}}                                  topics whose deletion has not finished,
    }                                                             as under "topics" (optional)

Any process may read the file at any time with :func:`read_topics` (each read sees one whole version); it
learns of changes through the control socket.  A topic under ``"deleting"`` is gone for every reader (the
supervisor finishes removing it: ``appliance.server.topic_changes``); only the store reads that part
(:func:`read_pending_deletes`).  A damaged file stops the start with
:class:`~storage.errors.CorruptRecordError` naming the file and what is wrong: metadata is never guessed or
reset silently (the logs would be orphaned).

**Replicas per partition.**  A topic whose partitions all have the same replicas keeps the per-topic form
(``"replicas"``, absent for a factor of 1), the only form files written before per-partition replica sets
knew, so those load unchanged; a topic created with an explicit assignment whose partitions differ
(``appliance.config.replica_assignment``) keeps ``"assignments"`` instead, one list per partition in the
order the assignment gave it (its first node is Kafka's *preferred* leader, which need not be the node
that leads it here).  :meth:`TopicMetadata.partition_replicas` answers for either form; :func:`with_replicas`
builds a topic from per-partition lists, choosing the form. """

from __future__ import annotations

import dataclasses
import json
import os
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from appliance.config.server_config import check_topic_name
from storage.errors import CorruptRecordError, UnknownTopicOrPartitionError

__all__ = [
    "MAX_PARTITIONS",
    "META_DIR",
    "TOPICS_FILE",
    "VERSION",
    "TopicMetadata",
    "assign_replicas",
    "partition_directory",
    "read_pending_deletes",
    "read_topics",
    "topics_path",
    "with_replicas",
]


META_DIR: Final = "meta"
TOPICS_FILE: Final = "topics.json"
VERSION: Final = 1
MAX_PARTITIONS: Final = 100_000


@dataclass(frozen=True, slots=True)
class TopicMetadata:
    """One topic as the store records it."""

    name: str
    topic_id: str  # a UUID string
    partitions: int
    replication_factor: int
    configs: Mapping[str, Any] = field(default_factory=dict)  # overrides given at creation (Kafka names)
    log_dirs: tuple[str, ...] = ()  # the log dir of each partition
    replicas: tuple[int, ...] = ()  # node ids holding a copy (replication factor > 1); () for factor 1
    # per partition, when partitions differ (then ``replicas`` is ()): its node ids in the order assigned
    assignments: tuple[tuple[int, ...], ...] = ()

    def partition_replicas(self, partition: int) -> tuple[int, ...]:
        """The node ids holding ``partition`` in the order recorded (() for a factor of 1: this node)."""
        if self.assignments:
            return self.assignments[partition]
        return self.replicas

    @property
    def nodes(self) -> tuple[int, ...]:
        """Every node holding a copy of some partition, in order of first mention (() for factor 1)."""
        if not self.assignments:
            return self.replicas
        return tuple(dict.fromkeys(node for replicas in self.assignments for node in replicas))

    def directory(self, partition: int) -> str:
        """The partition's log directory, ``<log dir>/<topic>-<partition>``."""
        if not 0 <= partition < self.partitions:
            raise UnknownTopicOrPartitionError(
                f"topic {self.name!r} has partitions 0..{self.partitions - 1}, not {partition}"
            )
        return partition_directory(self.log_dirs[partition], self.name, partition)

    def to_json(self) -> dict[str, Any]:
        return {
            "topic_id": self.topic_id,
            "partitions": self.partitions,
            "replication_factor": self.replication_factor,
            "configs": dict(self.configs),
            "log_dirs": list(self.log_dirs),
            **({"replicas": list(self.replicas)} if self.replicas else {}),
            **({"assignments": [list(r) for r in self.assignments]} if self.assignments else {}),
        }


def with_replicas(topic: TopicMetadata, replicas: list[tuple[int, ...]]) -> TopicMetadata:
    """``topic`` with ``replicas[p]`` the replicas of partition ``p`` (one list per partition): the
    per-topic form when they are all the same (() for a factor of 1), else the per-partition form."""
    if topic.replication_factor <= 1:
        return dataclasses.replace(topic, replicas=(), assignments=())
    if all(r == replicas[0] for r in replicas):
        return dataclasses.replace(topic, replicas=replicas[0], assignments=())
    return dataclasses.replace(topic, replicas=(), assignments=tuple(replicas))


def assign_replicas(node_id: int, replication_factor: int) -> tuple[int, ...]:
    """The replicas of a new topic created on ``node_id``: itself, then the smallest other node ids."""
    if replication_factor <= 1:
        return ()
    others = [i for i in range(replication_factor) if i != node_id][: replication_factor - 1]
    return (node_id, *others)


def partition_directory(log_dir: str, topic: str, partition: int) -> str:
    """``<log_dir>/<topic>-<partition>``: Kafka's name for a partition directory."""
    return os.path.join(log_dir, f"{topic}-{partition}")


def topics_path(log_dirs: Iterable[str]) -> Path:
    return Path(next(iter(log_dirs))) / META_DIR / TOPICS_FILE


def _fail(path: Path, what: str) -> CorruptRecordError:
    return CorruptRecordError(
        f"{path}: {what}; the topic metadata is damaged (restore it from a backup, or remove the file to "
        "start with only the configured topics: their logs are kept)"
    )


def _parse_topic(path: Path, name: object, raw: object) -> TopicMetadata:
    if not isinstance(name, str) or check_topic_name(name) is not None:
        raise _fail(path, f"topic name {name!r} is not a legal topic name")
    if not isinstance(raw, dict):
        raise _fail(path, f"topic {name!r}: expected an object, got {type(raw).__name__}")
    topic_id = raw.get("topic_id")
    partitions = raw.get("partitions")
    replication = raw.get("replication_factor")
    configs = raw.get("configs", {})
    log_dirs = raw.get("log_dirs")
    try:
        uuid.UUID(str(topic_id))
    except ValueError:
        raise _fail(path, f"topic {name!r}: topic_id {topic_id!r} is not a UUID") from None
    if (
        not isinstance(partitions, int)
        or isinstance(partitions, bool)
        or not 1 <= partitions <= MAX_PARTITIONS
    ):
        raise _fail(path, f"topic {name!r}: partitions {partitions!r}, expected 1..{MAX_PARTITIONS}")
    if not isinstance(replication, int) or isinstance(replication, bool) or replication < 1:
        raise _fail(path, f"topic {name!r}: replication_factor {replication!r}, expected >= 1")
    if not isinstance(configs, dict) or not all(isinstance(k, str) for k in configs):
        raise _fail(path, f"topic {name!r}: configs must be an object of settings")
    if (
        not isinstance(log_dirs, list)
        or len(log_dirs) != partitions
        or not all(isinstance(d, str) and os.path.isabs(d) for d in log_dirs)
    ):
        raise _fail(path, f"topic {name!r}: log_dirs must list {partitions} absolute paths, got {log_dirs!r}")
    replicas = raw.get("replicas", [])
    if (
        not isinstance(replicas, list)
        or not all(isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in replicas)
        or len(set(replicas)) != len(replicas)
        or (replicas and len(replicas) != replication)
    ):
        raise _fail(path, f"topic {name!r}: replicas must list {replication} distinct node ids, "
                          f"got {replicas!r}")
    assignments = _parse_assignments(path, name, raw.get("assignments", []), partitions, replication)
    if assignments and replicas:
        raise _fail(path, f"topic {name!r}: both replicas and assignments; expected one of them")
    return TopicMetadata(name, str(topic_id), partitions, replication, dict(configs),
                         tuple(log_dirs), tuple(replicas), assignments)


def _parse_assignments(path: Path, name: str, raw: object, partitions: int,
                       replication: int) -> tuple[tuple[int, ...], ...]:  # fmt: skip
    """The per-partition form (absent: ()): ``partitions`` lists of ``replication`` distinct node ids."""
    if raw == []:
        return ()
    if not isinstance(raw, list) or len(raw) != partitions:
        raise _fail(path, f"topic {name!r}: assignments must list the replicas of {partitions} partitions")
    for index, nodes in enumerate(raw):
        if (
            not isinstance(nodes, list)
            or not all(isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in nodes)
            or len(set(nodes)) != len(nodes)
            or len(nodes) != replication
        ):
            raise _fail(path, f"topic {name!r} partition {index}: replicas must list {replication} distinct "
                              f"node ids, got {nodes!r}")  # fmt: skip
    return tuple(tuple(nodes) for nodes in raw)


def read_topics(path: str | os.PathLike[str]) -> dict[str, TopicMetadata]:
    """The topics recorded in the file at ``path`` (none if there is no file); CorruptRecordError if damaged.

    For readers in other processes; the file may be replaced under them at any time (each read sees one
    whole version).
    """
    return _read_part(Path(path), "topics")


def read_pending_deletes(path: str | os.PathLike[str]) -> dict[str, TopicMetadata]:
    """The topics the file marks for deletion (``"deleting"``): the store finishes removing them."""
    return _read_part(Path(path), "deleting")


def _read_part(file: Path, part: str) -> dict[str, TopicMetadata]:
    try:
        data = file.read_bytes()
    except FileNotFoundError:
        return {}
    try:
        document = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _fail(file, f"not valid JSON ({exc})") from None
    if not isinstance(document, dict) or document.get("version") != VERSION:
        version = document.get("version") if isinstance(document, dict) else None
        raise _fail(file, f"version {version!r}, expected {VERSION}")
    topics = document.get(part, {} if part == "deleting" else None)
    if not isinstance(topics, dict):
        raise _fail(file, f'no "{part}" object')
    return {name: _parse_topic(file, name, raw) for name, raw in topics.items()}
