"""Topic and broker configuration, partitions and record deletion over the Kafka protocol: what
``kafka-configs.sh``, ``kafka-topics.sh --alter --partitions`` and ``kafka-delete-records.sh`` send.

:class:`ConfigAdmin` is a part of :class:`appliance.client.admin.KafkaAdmin` (its ``cluster`` and
``request_timeout_ms``); each call is one or a few blocking round trips:

* **describe_configs** -- DescribeConfigs (synonyms and documentation asked for) to the bootstrap broker;
  the answer as :class:`ConfigEntry` rows by name.
* **alter_configs** -- AlterConfigs: the resource's whole set of overrides (what is not given is reset).
* **incremental_alter_configs** -- IncrementalAlterConfigs: set some keys, delete (reset) others.
* **create_partitions** -- CreatePartitions: the topic's new total partition count.
* **delete_records** -- DeleteRecords to each partition's leader: move the log start offset forward;
  returns each partition's new low watermark.

The broker answers them (``appliance.broker.config_requests``, ``appliance.broker.partition_requests``); a
broker that does not has no version in common with the client, and the call raises ``ProtocolError`` saying
so.  A resource's error is raised like the other admin calls' (``INVALID_CONFIG`` as :class:`ConfigError`,
naming the key).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from ipc.kafka import (
    AlterableConfig,
    AlterConfigOp,
    AlterConfigsRequest,
    AlterConfigsResource,
    AlterConfigsResponse,
    CreatePartitionsRequest,
    CreatePartitionsResponse,
    CreatePartitionsTopic,
    DeleteRecordsPartition,
    DeleteRecordsRequest,
    DeleteRecordsResponse,
    DeleteRecordsTopic,
    DescribeConfigsRequest,
    DescribeConfigsResource,
    DescribeConfigsResponse,
    ErrorCode,
    IncrementalAlterableConfig,
    IncrementalAlterConfigsRequest,
    IncrementalAlterConfigsResource,
    IncrementalAlterConfigsResponse,
    ResourceType,
)

if TYPE_CHECKING:
    from appliance.client.kafka_cluster import KafkaCluster

__all__ = ["ConfigAdmin", "ConfigEntry", "ConfigSynonym"]

RaiseFor = Callable[[int, str, "str | None"], None]  # admin._raise: error code, resource name, message


class ConfigSynonym(NamedTuple):
    name: str
    value: str | None
    source: int  # ipc.kafka.ConfigSource


@dataclass(frozen=True, slots=True)
class ConfigEntry:
    """One described setting, as DescribeConfigs gives it."""

    name: str
    value: str | None  # None for a sensitive value or one not set
    source: int  # ipc.kafka.ConfigSource (-1 from a v0 answer)
    read_only: bool
    sensitive: bool
    synonyms: tuple[ConfigSynonym, ...]  # the value's sources, most specific first
    config_type: int  # ipc.kafka.ConfigType (0 below v3)
    documentation: str | None


class ConfigAdmin:
    """The configuration calls of the admin client (module docstring)."""

    cluster: KafkaCluster
    request_timeout_ms: int
    _raise_for: RaiseFor

    def describe_configs(
        self, resource_type: ResourceType, name: str, keys: Sequence[str] | None = None
    ) -> dict[str, ConfigEntry]:
        """The settings of a topic (by name) or a broker (by node id as text), all or ``keys``."""
        request = DescribeConfigsRequest(
            resources=[DescribeConfigsResource(resource_type, name, None if keys is None else list(keys))],
            include_synonyms=True,
            include_documentation=True,
        )
        response: DescribeConfigsResponse = self.cluster.any_connection().request(request)
        out: dict[str, ConfigEntry] = {}
        for result in response.results:
            self._raise_for(result.error_code, result.resource_name, result.error_message)
            for c in result.configs:
                synonyms = tuple(ConfigSynonym(s.name, s.value, s.source) for s in c.synonyms)
                out[c.name] = ConfigEntry(c.name, c.value, c.config_source, c.read_only, c.is_sensitive,
                                          synonyms, c.config_type, c.documentation)  # fmt: skip
        return out

    def alter_configs(
        self, resource_type: ResourceType, name: str, configs: Mapping[str, str | None], *,
        validate_only: bool = False,
    ) -> None:  # fmt: skip
        """Replace the resource's overrides with ``configs`` (Kafka's AlterConfigs: absent keys reset)."""
        given = [AlterableConfig(k, v) for k, v in configs.items()]
        resource = AlterConfigsResource(resource_type, name, given)
        response: AlterConfigsResponse = self.cluster.any_connection().request(
            AlterConfigsRequest([resource], validate_only)
        )
        for result in response.responses:
            self._raise_for(result.error_code, result.resource_name, result.error_message)

    def incremental_alter_configs(
        self, resource_type: ResourceType, name: str, *, set_configs: Mapping[str, str] | None = None,
        delete_configs: Sequence[str] = (), validate_only: bool = False,
    ) -> None:  # fmt: skip
        """Set ``set_configs`` and reset ``delete_configs`` to their defaults, the rest unchanged."""
        set_items = (set_configs or {}).items()
        configs = [IncrementalAlterableConfig(k, AlterConfigOp.SET, v) for k, v in set_items]
        configs += [IncrementalAlterableConfig(k, AlterConfigOp.DELETE, None) for k in delete_configs]
        resource = IncrementalAlterConfigsResource(resource_type, name, configs)
        response: IncrementalAlterConfigsResponse = self.cluster.any_connection().request(
            IncrementalAlterConfigsRequest([resource], validate_only)
        )
        for result in response.responses:
            self._raise_for(result.error_code, result.resource_name, result.error_message)

    def create_partitions(self, topic: str, count: int, *, validate_only: bool = False) -> None:
        """Grow ``topic`` to ``count`` partitions in all (the broker places the new ones)."""
        request = CreatePartitionsRequest(
            [CreatePartitionsTopic(topic, count, None)], self.request_timeout_ms, validate_only
        )
        response: CreatePartitionsResponse = self.cluster.any_connection().request(request)
        for result in response.results:
            self._raise_for(result.error_code, result.name, result.error_message)

    def delete_records(self, before: Mapping[tuple[str, int], int]) -> dict[tuple[str, int], int]:
        """Delete the records below each partition's offset (-1: the high watermark), at its leader;
        returns each partition's log start offset afterwards."""
        self.cluster.metadata(sorted({topic for topic, _ in before}))
        by_leader: dict[int, dict[str, list[DeleteRecordsPartition]]] = {}
        for (topic, partition), offset in before.items():
            leader = self.cluster.leaders.get((topic, partition), -1)
            if leader < 0:
                self._raise_for(ErrorCode.LEADER_NOT_AVAILABLE, f"{topic}-{partition}", None)
            topics = by_leader.setdefault(leader, {})
            topics.setdefault(topic, []).append(DeleteRecordsPartition(partition, offset))
        low: dict[tuple[str, int], int] = {}
        for leader, topics in by_leader.items():
            request = DeleteRecordsRequest(
                [DeleteRecordsTopic(t, parts) for t, parts in topics.items()], self.request_timeout_ms
            )
            response: DeleteRecordsResponse = self.cluster.connection_to(leader).request(request)
            for answered in response.topics:
                for part in answered.partitions:
                    self._raise_for(part.error_code, f"{answered.name}-{part.partition_index}", None)
                    low[(answered.name, part.partition_index)] = part.low_watermark
        return low
