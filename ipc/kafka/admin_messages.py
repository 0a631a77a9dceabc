"""Configuration and partition-administration messages, declared once from Apache Kafka's JSON definitions.

DescribeConfigs (32), AlterConfigs (33), IncrementalAlterConfigs (44), CreatePartitions (37) and
DeleteRecords (21): what ``kafka-configs.sh``, ``kafka-topics.sh --alter --partitions``,
``kafka-delete-records.sh`` and every AdminClient's ``describe_configs`` / ``alter_configs`` /
``incremental_alter_configs`` / ``create_partitions`` / ``delete_records`` send.  Same conventions as
:mod:`ipc.kafka.messages`: Kafka's field names in snake_case, Kafka's version ranges and nullability, only
the fields of the versions we speak (see :mod:`ipc.kafka.apis`).

Kafka names the nested structs of AlterConfigs and IncrementalAlterConfigs alike (``AlterConfigsResource``,
``AlterableConfig``) although IncrementalAlterConfigs' carry an operation: here the incremental ones are
``IncrementalAlterConfigsResource`` and ``IncrementalAlterableConfig``.  Both answer with the same
``AlterConfigsResourceResponse``.

The numbers these messages carry as plain integers are named here, with Kafka's values:
:class:`ResourceType` (``ConfigResource.Type``), :class:`ConfigSource`
(``DescribeConfigsResponse.ConfigSource``), :class:`ConfigType` (``DescribeConfigsResponse.ConfigType``) and
:class:`AlterConfigOp` (``AlterConfigOp.OpType``).
"""

# ruff: noqa: RUF009 -- ``wire()`` returns a dataclasses.field(); a field specifier, not a shared default.

from __future__ import annotations

import enum
from dataclasses import dataclass

from ipc.kafka.schema import ARRAY, BOOL, INT8, INT16, INT32, INT64, STRING, Struct, wire

__all__ = [
    "AlterConfigOp",
    "AlterConfigsRequest",
    "AlterConfigsResource",
    "AlterConfigsResourceResponse",
    "AlterConfigsResponse",
    "AlterableConfig",
    "ConfigSource",
    "ConfigType",
    "CreatePartitionsAssignment",
    "CreatePartitionsRequest",
    "CreatePartitionsResponse",
    "CreatePartitionsTopic",
    "CreatePartitionsTopicResult",
    "DeleteRecordsPartition",
    "DeleteRecordsPartitionResult",
    "DeleteRecordsRequest",
    "DeleteRecordsResponse",
    "DeleteRecordsTopic",
    "DeleteRecordsTopicResult",
    "DescribeConfigsRequest",
    "DescribeConfigsResource",
    "DescribeConfigsResourceResult",
    "DescribeConfigsResponse",
    "DescribeConfigsResult",
    "DescribeConfigsSynonym",
    "IncrementalAlterConfigsRequest",
    "IncrementalAlterConfigsResource",
    "IncrementalAlterConfigsResponse",
    "IncrementalAlterableConfig",
    "ResourceType",
]


class ResourceType(enum.IntEnum):
    """What a config resource names (``resource_type``, Kafka's ``ConfigResource.Type``): a topic by its
    name, a broker by its node id (``""``: the cluster-wide default)."""

    UNKNOWN = 0
    TOPIC = 2
    BROKER = 4
    BROKER_LOGGER = 8
    CLIENT_METRICS = 16
    GROUP = 32


class ConfigSource(enum.IntEnum):
    """Where a described value comes from (``config_source``, v1+; a synonym's ``source``)."""

    UNKNOWN = 0
    TOPIC_CONFIG = 1  # set on this topic (CreateTopics, AlterConfigs, [topics.NAME])
    DYNAMIC_BROKER_CONFIG = 2
    DYNAMIC_DEFAULT_BROKER_CONFIG = 3
    STATIC_BROKER_CONFIG = 4  # the broker's configuration file
    DEFAULT_CONFIG = 5  # Kafka's (or the appliance's) default
    DYNAMIC_BROKER_LOGGER_CONFIG = 6
    CLIENT_METRICS_CONFIG = 7
    GROUP_CONFIG = 8


class ConfigType(enum.IntEnum):
    """A described setting's data type (``config_type``, v3+)."""

    UNKNOWN = 0
    BOOLEAN = 1
    STRING = 2
    INT = 3
    SHORT = 4
    LONG = 5
    DOUBLE = 6
    LIST = 7
    CLASS = 8
    PASSWORD = 9


class AlterConfigOp(enum.IntEnum):
    """IncrementalAlterConfigs' ``config_operation``: set, delete (back to the default), append to or
    subtract from a list setting."""

    SET = 0
    DELETE = 1
    APPEND = 2
    SUBTRACT = 3


# -- DescribeConfigs (key 32) ----------------------------------------------------------------------------


@dataclass(slots=True)
class DescribeConfigsResource(Struct):
    resource_type: int = wire(INT8)
    resource_name: str = wire(STRING)
    configuration_keys: list[str] | None = wire(ARRAY(STRING), nullable="0+", default=None)  # None: all


@dataclass(slots=True)
class DescribeConfigsRequest(Struct):
    resources: list[DescribeConfigsResource] = wire(ARRAY(DescribeConfigsResource))
    include_synonyms: bool = wire(BOOL, "1+")
    include_documentation: bool = wire(BOOL, "3+")


@dataclass(slots=True)
class DescribeConfigsSynonym(Struct):
    name: str = wire(STRING, "1+")
    value: str | None = wire(STRING, "1+", nullable="0+", default=None)
    source: int = wire(INT8, "1+")


@dataclass(slots=True)
class DescribeConfigsResourceResult(Struct):
    name: str = wire(STRING)
    value: str | None = wire(STRING, nullable="0+", default=None)
    read_only: bool = wire(BOOL)
    is_default: bool = wire(BOOL, "0")
    config_source: int = wire(INT8, "1+", default=-1)
    is_sensitive: bool = wire(BOOL)
    synonyms: list[DescribeConfigsSynonym] = wire(ARRAY(DescribeConfigsSynonym), "1+")
    config_type: int = wire(INT8, "3+")
    documentation: str | None = wire(STRING, "3+", nullable="0+", default=None)


@dataclass(slots=True)
class DescribeConfigsResult(Struct):
    error_code: int = wire(INT16)
    error_message: str | None = wire(STRING, nullable="0+", default=None)
    resource_type: int = wire(INT8)
    resource_name: str = wire(STRING)
    configs: list[DescribeConfigsResourceResult] = wire(ARRAY(DescribeConfigsResourceResult))


@dataclass(slots=True)
class DescribeConfigsResponse(Struct):
    throttle_time_ms: int = wire(INT32)
    results: list[DescribeConfigsResult] = wire(ARRAY(DescribeConfigsResult))


# -- AlterConfigs (key 33) -------------------------------------------------------------------------------


@dataclass(slots=True)
class AlterableConfig(Struct):
    name: str = wire(STRING)
    value: str | None = wire(STRING, nullable="0+", default=None)


@dataclass(slots=True)
class AlterConfigsResource(Struct):
    resource_type: int = wire(INT8)
    resource_name: str = wire(STRING)
    configs: list[AlterableConfig] = wire(ARRAY(AlterableConfig))  # the whole set: what is absent is reset


@dataclass(slots=True)
class AlterConfigsRequest(Struct):
    resources: list[AlterConfigsResource] = wire(ARRAY(AlterConfigsResource))
    validate_only: bool = wire(BOOL)


@dataclass(slots=True)
class AlterConfigsResourceResponse(Struct):
    error_code: int = wire(INT16)
    error_message: str | None = wire(STRING, nullable="0+", default=None)
    resource_type: int = wire(INT8)
    resource_name: str = wire(STRING)


@dataclass(slots=True)
class AlterConfigsResponse(Struct):
    throttle_time_ms: int = wire(INT32)
    responses: list[AlterConfigsResourceResponse] = wire(ARRAY(AlterConfigsResourceResponse))


# -- IncrementalAlterConfigs (key 44) --------------------------------------------------------------------


@dataclass(slots=True)
class IncrementalAlterableConfig(Struct):
    name: str = wire(STRING)
    config_operation: int = wire(INT8)  # AlterConfigOp
    value: str | None = wire(STRING, nullable="0+", default=None)


@dataclass(slots=True)
class IncrementalAlterConfigsResource(Struct):
    resource_type: int = wire(INT8)
    resource_name: str = wire(STRING)
    configs: list[IncrementalAlterableConfig] = wire(ARRAY(IncrementalAlterableConfig))


@dataclass(slots=True)
class IncrementalAlterConfigsRequest(Struct):
    resources: list[IncrementalAlterConfigsResource] = wire(ARRAY(IncrementalAlterConfigsResource))
    validate_only: bool = wire(BOOL)


@dataclass(slots=True)
class IncrementalAlterConfigsResponse(Struct):
    throttle_time_ms: int = wire(INT32)
    responses: list[AlterConfigsResourceResponse] = wire(ARRAY(AlterConfigsResourceResponse))


# -- CreatePartitions (key 37) ---------------------------------------------------------------------------


@dataclass(slots=True)
class CreatePartitionsAssignment(Struct):
    broker_ids: list[int] = wire(ARRAY(INT32))


@dataclass(slots=True)
class CreatePartitionsTopic(Struct):
    name: str = wire(STRING)
    count: int = wire(INT32)  # the new partition count, not the number added
    assignments: list[CreatePartitionsAssignment] | None = wire(
        ARRAY(CreatePartitionsAssignment), nullable="0+", default=None
    )  # one per new partition, or None: the broker assigns


@dataclass(slots=True)
class CreatePartitionsRequest(Struct):
    topics: list[CreatePartitionsTopic] = wire(ARRAY(CreatePartitionsTopic))
    timeout_ms: int = wire(INT32)
    validate_only: bool = wire(BOOL)


@dataclass(slots=True)
class CreatePartitionsTopicResult(Struct):
    name: str = wire(STRING)
    error_code: int = wire(INT16)
    error_message: str | None = wire(STRING, nullable="0+", default=None)


@dataclass(slots=True)
class CreatePartitionsResponse(Struct):
    throttle_time_ms: int = wire(INT32)
    results: list[CreatePartitionsTopicResult] = wire(ARRAY(CreatePartitionsTopicResult))


# -- DeleteRecords (key 21) ------------------------------------------------------------------------------


@dataclass(slots=True)
class DeleteRecordsPartition(Struct):
    partition_index: int = wire(INT32)
    offset: int = wire(INT64)  # the new log start offset; -1: the high watermark


@dataclass(slots=True)
class DeleteRecordsTopic(Struct):
    name: str = wire(STRING)
    partitions: list[DeleteRecordsPartition] = wire(ARRAY(DeleteRecordsPartition))


@dataclass(slots=True)
class DeleteRecordsRequest(Struct):
    topics: list[DeleteRecordsTopic] = wire(ARRAY(DeleteRecordsTopic))
    timeout_ms: int = wire(INT32)


@dataclass(slots=True)
class DeleteRecordsPartitionResult(Struct):
    partition_index: int = wire(INT32)
    low_watermark: int = wire(INT64)  # the log start offset after the deletion
    error_code: int = wire(INT16)


@dataclass(slots=True)
class DeleteRecordsTopicResult(Struct):
    name: str = wire(STRING)
    partitions: list[DeleteRecordsPartitionResult] = wire(ARRAY(DeleteRecordsPartitionResult))


@dataclass(slots=True)
class DeleteRecordsResponse(Struct):
    throttle_time_ms: int = wire(INT32)
    topics: list[DeleteRecordsTopicResult] = wire(ARRAY(DeleteRecordsTopicResult))
