"""Topics over the Kafka protocol: create, list, describe, delete -- what ``kafka-topics.sh`` does with
``--bootstrap-server``, for ``appliance topics`` and any program that only knows a broker's address.

Theory of operation
-------------------
:class:`KafkaAdmin` talks through a :class:`~appliance.client.kafka_cluster.KafkaCluster`: the first bootstrap
server that answers, then each partition's leader at the address Metadata advertised for it.  Every call is
a few blocking round trips; nothing runs in the background.  Not thread-safe.

* **list** -- Metadata for every topic.
* **create** -- CreateTopics (one topic; ``-1`` partitions / replication factor: the broker's defaults),
  then Metadata for the partition count the broker chose.
* **delete** -- DeleteTopics.
* **describe** -- Metadata (never creating a topic: ``allow_auto_topic_creation`` false) gives partitions,
  leader, leader epoch, replicas and ISR.  Then, to each partition's leader, pipelined on one connection:

  ============================  ==================================================================
  ListOffsets earliest          log start offset
  ListOffsets latest            high watermark (a consumer's "latest", isolation read_uncommitted)
  ListOffsets latest, id -2     log end offset (Kafka's debugging replica id sees the log end)
  DescribeLogDirs               bytes on disk: the partition's segment files (``appliance.broker.log_dirs``)
  ============================  ==================================================================

  What the protocol versions spoken here do not carry is left unknown (None): the topic id (Metadata v10+)
  and the topic's configuration overrides (``describe_configs``, once the broker answers DescribeConfigs).
  A value a leader could not give (its partition error) is -1.

Errors are raised from the project's tree with Kafka's error name (the broker's message when it sent one):
``TOPIC_ALREADY_EXISTS`` as :class:`appliance.server.metadata.TopicExistsError`,
``UNKNOWN_TOPIC_OR_PARTITION`` as :class:`UnknownTopicOrPartitionError`, an invalid name, partition count,
replication factor or setting as :class:`ConfigError` (the control socket's mapping,
``appliance.control.raise_for_error``); an unreachable broker as
:class:`~ipc.kafka_client.BrokerConnectionError`. """

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from appliance.client.admin_configs import ConfigAdmin
from appliance.client.kafka_cluster import DEFAULT_BOOTSTRAP_SERVER, KafkaCluster
from ipc.kafka import (
    CreatableTopic,
    CreatableTopicConfig,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DeleteTopicsRequest,
    DeleteTopicsResponse,
    ErrorCode,
    ListOffsetsPartition,
    ListOffsetsRequest,
    ListOffsetsResponse,
    ListOffsetsTopic,
    MetadataResponse,
    MetadataResponseTopic,
    error_name,
)
from ipc.kafka.messages import DescribableLogDirTopic, DescribeLogDirsRequest, DescribeLogDirsResponse
from storage.errors import ApplianceError, ConfigError, TopicExistsError, UnknownTopicOrPartitionError

if TYPE_CHECKING:
    from ipc.control import PartitionInfo

__all__ = ["DEFAULT_BOOTSTRAP_SERVER", "KafkaAdmin", "PartitionDescription", "TopicDescription"]

CONSUMER_REPLICA_ID = -1  # ListOffsets as a consumer: "latest" is the high watermark
DEBUGGING_REPLICA_ID = -2  # ListOffsets as a tool: "latest" is the log end offset
EARLIEST_TIMESTAMP = -2
LATEST_TIMESTAMP = -1
NO_LEADER = -1


@dataclass(frozen=True, slots=True)
class PartitionDescription:
    """One partition as ``appliance topics describe`` shows it; -1 where its leader could not say."""

    partition: int
    leader: int  # node id, -1 none
    leader_epoch: int
    replicas: tuple[int, ...]  # leader first
    isr: tuple[int, ...]
    log_start_offset: int
    log_end_offset: int
    high_watermark: int
    size_bytes: int  # the segment files' bytes on the leader's disk
    committed_high_watermark: int = -1  # replicated, from the control socket only: what acks=all waits for
    local: PartitionInfo | None = None  # the control socket's view: writer pid, memory, restarts, followers
    offline_replicas: tuple[int, ...] = ()  # replicas whose copy cannot be served (a damaged log)
    offline_reason: str = ""  # why, when the control socket knows (a local description); else empty


@dataclass(frozen=True, slots=True)
class TopicDescription:
    name: str
    partitions: tuple[PartitionDescription, ...]
    replication_factor: int
    topic_id: str | None = None  # None: not known over this path (Metadata below v10)
    configs: Mapping[str, Any] | None = field(default=None)  # overrides; None: not known over this path

    @property
    def partition_count(self) -> int:
        return len(self.partitions)


class KafkaAdmin(ConfigAdmin):
    """Topic administration through a broker's Kafka protocol (see the module docstring); configuration,
    partitions and record deletion come from :class:`~appliance.client.admin_configs.ConfigAdmin`."""

    def __init__(
        self,
        bootstrap_servers: str = DEFAULT_BOOTSTRAP_SERVER,
        *,
        client_id: str = "appliance-admin",
        connect_timeout_ms: int = 10_000,
        request_timeout_ms: int = 30_000,
    ) -> None:
        self.request_timeout_ms = request_timeout_ms
        self._raise_for = _raise
        self.cluster = KafkaCluster.reached(bootstrap_servers, client_id=client_id,
                                            connect_timeout_ms=connect_timeout_ms,
                                            request_timeout_ms=request_timeout_ms)

    # -- metadata --------------------------------------------------------------------------------------------

    def _metadata(self, names: Sequence[str] | None) -> MetadataResponse:
        return self.cluster.metadata(names, auto_create=False)

    def list_topics(self) -> list[str]:
        """Every topic's name, sorted."""
        return sorted(t.name for t in self._metadata(None).topics if t.error_code == ErrorCode.NONE)

    # -- create / delete -------------------------------------------------------------------------------------

    def create_topic(
        self,
        name: str,
        partitions: int | None = None,
        replication_factor: int | None = None,
        configs: Mapping[str, object] | None = None,
    ) -> int:
        """Create ``name``; return its partition count.  ``None``: the broker's default (``num.partitions``,
        ``default.replication.factor``)."""
        topic = CreatableTopic(
            name=name,
            num_partitions=-1 if partitions is None else partitions,
            replication_factor=-1 if replication_factor is None else replication_factor,
            configs=[CreatableTopicConfig(name=k, value=_setting(v)) for k, v in (configs or {}).items()],
        )
        response: CreateTopicsResponse = self.cluster.any_connection().request(
            CreateTopicsRequest(topics=[topic], timeout_ms=self.request_timeout_ms)
        )
        for result in response.topics:
            _raise(result.error_code, name, result.error_message)
        if partitions is not None:
            return partitions
        (created,) = self._metadata([name]).topics
        _raise(created.error_code, name, None)
        return len(created.partitions)

    def delete_topic(self, name: str) -> None:
        """Delete ``name`` and its data."""
        response: DeleteTopicsResponse = self.cluster.any_connection().request(
            DeleteTopicsRequest(topic_names=[name], timeout_ms=self.request_timeout_ms)
        )
        for result in response.responses:
            _raise(result.error_code, name, None)

    # -- describe --------------------------------------------------------------------------------------------

    def describe_topics(self, names: Sequence[str] | None = None) -> list[TopicDescription]:
        """The named topics (None: every topic, sorted by name) with their partitions' offsets and sizes.
        An unknown or invalid name raises (the first one, in the order given)."""
        wanted = None if names is None else list(dict.fromkeys(names))
        metadata = self._metadata(wanted)
        topics: dict[str, MetadataResponseTopic] = {}
        for topic in metadata.topics:
            if wanted is not None:
                _raise(topic.error_code, topic.name, None)
            if topic.error_code == ErrorCode.NONE:
                topics[topic.name] = topic
        by_leader: dict[int, list[tuple[str, int]]] = {}
        for topic in topics.values():
            for p in topic.partitions:
                if p.leader_id != NO_LEADER:
                    by_leader.setdefault(p.leader_id, []).append((topic.name, p.partition_index))
        figures: dict[tuple[str, int], dict[str, int]] = {}
        for leader, partitions in by_leader.items():
            figures.update(self._partition_figures(leader, partitions))
        out = []
        for name in wanted if wanted is not None else sorted(topics):
            topic = topics[name]
            parts = []
            for p in sorted(topic.partitions, key=lambda p: p.partition_index):
                got = figures.get((name, p.partition_index), {})
                parts.append(
                    PartitionDescription(
                        partition=p.partition_index,
                        leader=p.leader_id,
                        leader_epoch=p.leader_epoch,
                        replicas=tuple(p.replica_nodes),
                        isr=tuple(p.isr_nodes),
                        log_start_offset=got.get("log_start_offset", -1),
                        log_end_offset=got.get("log_end_offset", -1),
                        high_watermark=got.get("high_watermark", -1),
                        size_bytes=got.get("size_bytes", -1),
                        offline_replicas=tuple(p.offline_replicas),
                    )
                )
            factor = len(parts[0].replicas) if parts else 0
            out.append(TopicDescription(name=name, partitions=tuple(parts), replication_factor=factor))
        return out

    def _partition_figures(
        self, leader: int, partitions: list[tuple[str, int]]
    ) -> dict[tuple[str, int], dict[str, int]]:
        """Offsets and sizes of ``partitions`` from their leader: four pipelined requests."""
        conn = self.cluster.connection_to(leader)
        grouped: dict[str, list[int]] = {}
        for topic, index in partitions:
            grouped.setdefault(topic, []).append(index)
        queries = (
            ("log_start_offset", CONSUMER_REPLICA_ID, EARLIEST_TIMESTAMP),
            ("high_watermark", CONSUMER_REPLICA_ID, LATEST_TIMESTAMP),
            ("log_end_offset", DEBUGGING_REPLICA_ID, LATEST_TIMESTAMP),
        )
        for _, replica_id, timestamp in queries:
            conn.send(
                ListOffsetsRequest(
                    replica_id=replica_id,
                    topics=[
                        ListOffsetsTopic(t, [ListOffsetsPartition(i, timestamp=timestamp) for i in ix])
                        for t, ix in grouped.items()
                    ],
                )
            )
        conn.send(DescribeLogDirsRequest([DescribableLogDirTopic(t, ix) for t, ix in grouped.items()]))
        figures: dict[tuple[str, int], dict[str, int]] = {key: {} for key in partitions}
        for what, _, _ in queries:
            offsets: ListOffsetsResponse = conn.receive()
            for answered in offsets.topics:
                for part in answered.partitions:
                    key = (answered.name, part.partition_index)
                    if part.error_code == ErrorCode.NONE and key in figures:
                        figures[key][what] = part.offset
        dirs: DescribeLogDirsResponse = conn.receive()
        for result in dirs.results:
            if result.error_code != ErrorCode.NONE:
                continue
            for dir_topic in result.topics:
                for dir_part in dir_topic.partitions:
                    key = (dir_topic.name, dir_part.partition_index)
                    if key in figures and not dir_part.is_future_key:
                        figures[key]["size_bytes"] = dir_part.partition_size
        return figures

    # -- lifetime --------------------------------------------------------------------------------------------

    def close(self) -> None:
        self.cluster.close()

    def __enter__(self) -> KafkaAdmin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _setting(value: object) -> str:
    """A topic setting as CreateTopics carries it: a string (lists comma-separated, booleans lower case)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return ",".join(str(v) for v in value)
    return str(value)


def _raise(code: int, topic: str, message: str | None) -> None:
    """Raise what a topic-level error code stands for (nothing for NONE)."""
    if code == ErrorCode.NONE:
        return
    name = error_name(code).partition("(")[0]
    if message and repr(topic) in message:  # the broker's own message names the topic
        text = f"{message} ({name})"
    else:
        detail = message or _DEFAULT_MESSAGES.get(code, f"refused by the broker with {error_name(code)}")
        text = f"topic {topic!r}: {detail} ({name})"
    raise _ERROR_CLASSES.get(code, ApplianceError)(text)


# The control socket's mapping (``appliance.control.raise_for_error``), for answers of the Kafka protocol.
_ERROR_CLASSES: dict[int, type[ApplianceError]] = {
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION: UnknownTopicOrPartitionError,
    ErrorCode.TOPIC_ALREADY_EXISTS: TopicExistsError,
    **{code: ConfigError for code in (
        ErrorCode.INVALID_TOPIC_EXCEPTION, ErrorCode.INVALID_PARTITIONS, ErrorCode.INVALID_REPLICATION_FACTOR,
        ErrorCode.INVALID_CONFIG, ErrorCode.INVALID_REQUEST, ErrorCode.TOPIC_DELETION_DISABLED,
    )},
}  # fmt: skip


_DEFAULT_MESSAGES: dict[int, str] = {
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION: "no such topic",
    ErrorCode.TOPIC_ALREADY_EXISTS: "the topic already exists",
    ErrorCode.INVALID_TOPIC_EXCEPTION: "not a legal topic name (1-249 of [A-Za-z0-9._-], not '.' or '..')",
    ErrorCode.TOPIC_DELETION_DISABLED: "topic deletion is disabled (delete.topic.enable=false)",
}
