"""The core APIs' messages, declared once from Apache Kafka's JSON message definitions.

Source: ``clients/src/main/resources/common/message/<Name>Request.json`` / ``<Name>Response.json``.  Each
class lists the fields that exist in the versions this appliance speaks (see :mod:`ipc.kafka.apis`), with
Kafka's version ranges, nullability and defaults; attribute names are Kafka's field names in snake_case
(as kafka-python names them too).  Fields that only exist in versions we do not speak are left out.

``records`` fields decode as a zero-copy ``memoryview`` into the request frame (keep the frame alive while
you hold it) and encode from ``bytes``/``memoryview`` or a :class:`~ipc.kafka.regions.FileRegion`.
"""

# ruff: noqa: RUF009 -- ``wire()`` returns a dataclasses.field(); a field specifier, not a shared default.

from __future__ import annotations

from dataclasses import dataclass

from ipc.kafka.regions import FileRegion
from ipc.kafka.schema import (
    ARRAY,
    BOOL,
    INT8,
    INT16,
    INT32,
    INT64,
    RECORDS,
    STRING,
    Struct,
    wire,
)

__all__ = [
    "AbortedTransaction",
    "ApiVersion",
    "ApiVersionsRequest",
    "ApiVersionsResponse",
    "BatchIndexAndErrorMessage",
    "CreatableReplicaAssignment",
    "CreatableTopic",
    "CreatableTopicConfig",
    "CreatableTopicResult",
    "CreateTopicsRequest",
    "CreateTopicsResponse",
    "DeletableTopicResult",
    "DeleteTopicsRequest",
    "DeleteTopicsResponse",
    "DescribableLogDirTopic",
    "DescribeLogDirsPartition",
    "DescribeLogDirsRequest",
    "DescribeLogDirsResponse",
    "DescribeLogDirsResult",
    "DescribeLogDirsTopic",
    "EpochEndOffset",
    "FetchPartition",
    "FetchRequest",
    "FetchResponse",
    "FetchTopic",
    "FetchableTopicResponse",
    "FinalizedFeatureKey",
    "ForgottenTopic",
    "InitProducerIdRequest",
    "InitProducerIdResponse",
    "ListOffsetsPartition",
    "ListOffsetsPartitionResponse",
    "ListOffsetsRequest",
    "ListOffsetsResponse",
    "ListOffsetsTopic",
    "ListOffsetsTopicResponse",
    "MetadataRequest",
    "MetadataRequestTopic",
    "MetadataResponse",
    "MetadataResponseBroker",
    "MetadataResponsePartition",
    "MetadataResponseTopic",
    "OffsetForLeaderEpochRequest",
    "OffsetForLeaderEpochResponse",
    "OffsetForLeaderPartition",
    "OffsetForLeaderTopic",
    "OffsetForLeaderTopicResult",
    "PartitionData",
    "PartitionProduceData",
    "PartitionProduceResponse",
    "ProduceRequest",
    "ProduceResponse",
    "RecordsValue",
    "SupportedFeatureKey",
    "TopicProduceData",
    "TopicProduceResponse",
]

RecordsValue = bytes | bytearray | memoryview | FileRegion | None
NO_AUTHORIZED_OPERATIONS = -2147483648


# -- ApiVersions (key 18) --------------------------------------------------------------------------------


@dataclass(slots=True)
class ApiVersionsRequest(Struct):
    client_software_name: str = wire(STRING, "3+")
    client_software_version: str = wire(STRING, "3+")


@dataclass(slots=True)
class ApiVersion(Struct):
    api_key: int = wire(INT16)
    min_version: int = wire(INT16)
    max_version: int = wire(INT16)


@dataclass(slots=True)
class SupportedFeatureKey(Struct):
    name: str = wire(STRING)
    min_version: int = wire(INT16)
    max_version: int = wire(INT16)


@dataclass(slots=True)
class FinalizedFeatureKey(Struct):
    name: str = wire(STRING)
    max_version_level: int = wire(INT16)
    min_version_level: int = wire(INT16)


@dataclass(slots=True)
class ApiVersionsResponse(Struct):
    error_code: int = wire(INT16)
    api_keys: list[ApiVersion] = wire(ARRAY(ApiVersion))
    throttle_time_ms: int = wire(INT32, "1+")
    supported_features: list[SupportedFeatureKey] = wire(ARRAY(SupportedFeatureKey), "3+", tag=0)
    finalized_features_epoch: int = wire(INT64, "3+", tag=1, default=-1)
    finalized_features: list[FinalizedFeatureKey] = wire(ARRAY(FinalizedFeatureKey), "3+", tag=2)
    zk_migration_ready: bool = wire(BOOL, "3+", tag=3)


# -- Produce (key 0) -------------------------------------------------------------------------------------


@dataclass(slots=True)
class PartitionProduceData(Struct):
    index: int = wire(INT32)
    records: RecordsValue = wire(RECORDS, nullable="0+")


@dataclass(slots=True)
class TopicProduceData(Struct):
    name: str = wire(STRING)
    partition_data: list[PartitionProduceData] = wire(ARRAY(PartitionProduceData))


@dataclass(slots=True)
class ProduceRequest(Struct):
    transactional_id: str | None = wire(STRING, "3+", nullable="3+", default=None)
    acks: int = wire(INT16)
    timeout_ms: int = wire(INT32)
    topic_data: list[TopicProduceData] = wire(ARRAY(TopicProduceData))


@dataclass(slots=True)
class BatchIndexAndErrorMessage(Struct):
    batch_index: int = wire(INT32, "8+")
    batch_index_error_message: str | None = wire(STRING, "8+", nullable="8+", default=None)


@dataclass(slots=True)
class PartitionProduceResponse(Struct):
    index: int = wire(INT32)
    error_code: int = wire(INT16)
    base_offset: int = wire(INT64)
    log_append_time_ms: int = wire(INT64, "2+", default=-1)
    log_start_offset: int = wire(INT64, "5+", default=-1)
    record_errors: list[BatchIndexAndErrorMessage] = wire(ARRAY(BatchIndexAndErrorMessage), "8+")
    error_message: str | None = wire(STRING, "8+", nullable="8+", default=None)


@dataclass(slots=True)
class TopicProduceResponse(Struct):
    name: str = wire(STRING)
    partition_responses: list[PartitionProduceResponse] = wire(ARRAY(PartitionProduceResponse))


@dataclass(slots=True)
class ProduceResponse(Struct):
    responses: list[TopicProduceResponse] = wire(ARRAY(TopicProduceResponse))
    throttle_time_ms: int = wire(INT32, "1+")


# -- Fetch (key 1) ---------------------------------------------------------------------------------------


@dataclass(slots=True)
class FetchPartition(Struct):
    partition: int = wire(INT32)
    current_leader_epoch: int = wire(INT32, "9+", default=-1)
    fetch_offset: int = wire(INT64)
    log_start_offset: int = wire(INT64, "5+", default=-1)
    partition_max_bytes: int = wire(INT32)


@dataclass(slots=True)
class FetchTopic(Struct):
    topic: str = wire(STRING, "0-12")
    partitions: list[FetchPartition] = wire(ARRAY(FetchPartition))


@dataclass(slots=True)
class ForgottenTopic(Struct):
    topic: str = wire(STRING, "7-12")
    partitions: list[int] = wire(ARRAY(INT32), "7+")


@dataclass(slots=True)
class FetchRequest(Struct):
    replica_id: int = wire(INT32, "0-14", default=-1)
    max_wait_ms: int = wire(INT32)
    min_bytes: int = wire(INT32)
    max_bytes: int = wire(INT32, "3+", default=0x7FFFFFFF)
    isolation_level: int = wire(INT8, "4+")
    session_id: int = wire(INT32, "7+")
    session_epoch: int = wire(INT32, "7+", default=-1)
    topics: list[FetchTopic] = wire(ARRAY(FetchTopic))
    forgotten_topics_data: list[ForgottenTopic] = wire(ARRAY(ForgottenTopic), "7+")
    rack_id: str = wire(STRING, "11+")


@dataclass(slots=True)
class AbortedTransaction(Struct):
    producer_id: int = wire(INT64, "4+")
    first_offset: int = wire(INT64, "4+")


@dataclass(slots=True)
class PartitionData(Struct):
    partition_index: int = wire(INT32)
    error_code: int = wire(INT16)
    high_watermark: int = wire(INT64)
    last_stable_offset: int = wire(INT64, "4+", default=-1)
    log_start_offset: int = wire(INT64, "5+", default=-1)
    aborted_transactions: list[AbortedTransaction] | None = wire(
        ARRAY(AbortedTransaction), "4+", nullable="4+", default=None
    )
    preferred_read_replica: int = wire(INT32, "11+", default=-1)
    records: RecordsValue = wire(RECORDS, nullable="0+")


@dataclass(slots=True)
class FetchableTopicResponse(Struct):
    topic: str = wire(STRING, "0-12")
    partitions: list[PartitionData] = wire(ARRAY(PartitionData))


@dataclass(slots=True)
class FetchResponse(Struct):
    throttle_time_ms: int = wire(INT32, "1+")
    error_code: int = wire(INT16, "7+")
    session_id: int = wire(INT32, "7+")
    responses: list[FetchableTopicResponse] = wire(ARRAY(FetchableTopicResponse))


# -- ListOffsets (key 2) ---------------------------------------------------------------------------------


@dataclass(slots=True)
class ListOffsetsPartition(Struct):
    partition_index: int = wire(INT32)
    current_leader_epoch: int = wire(INT32, "4+", default=-1)
    timestamp: int = wire(INT64)  # -3 max timestamp (v7+), -2 earliest, -1 latest, else a timestamp in ms


@dataclass(slots=True)
class ListOffsetsTopic(Struct):
    name: str = wire(STRING)
    partitions: list[ListOffsetsPartition] = wire(ARRAY(ListOffsetsPartition))


@dataclass(slots=True)
class ListOffsetsRequest(Struct):
    replica_id: int = wire(INT32, default=-1)
    isolation_level: int = wire(INT8, "2+")
    topics: list[ListOffsetsTopic] = wire(ARRAY(ListOffsetsTopic))


@dataclass(slots=True)
class ListOffsetsPartitionResponse(Struct):
    partition_index: int = wire(INT32)
    error_code: int = wire(INT16)
    timestamp: int = wire(INT64, "1+", default=-1)
    offset: int = wire(INT64, "1+", default=-1)
    leader_epoch: int = wire(INT32, "4+", default=-1)


@dataclass(slots=True)
class ListOffsetsTopicResponse(Struct):
    name: str = wire(STRING)
    partitions: list[ListOffsetsPartitionResponse] = wire(ARRAY(ListOffsetsPartitionResponse))


@dataclass(slots=True)
class ListOffsetsResponse(Struct):
    throttle_time_ms: int = wire(INT32, "2+")
    topics: list[ListOffsetsTopicResponse] = wire(ARRAY(ListOffsetsTopicResponse))


# -- Metadata (key 3) ------------------------------------------------------------------------------------


@dataclass(slots=True)
class MetadataRequestTopic(Struct):
    name: str = wire(STRING)


@dataclass(slots=True)
class MetadataRequest(Struct):
    # None (null) asks for every topic; [] for none.
    topics: list[MetadataRequestTopic] | None = wire(ARRAY(MetadataRequestTopic), nullable="1+", default=None)
    allow_auto_topic_creation: bool = wire(BOOL, "4+", default=True)
    include_cluster_authorized_operations: bool = wire(BOOL, "8-10")
    include_topic_authorized_operations: bool = wire(BOOL, "8+")


@dataclass(slots=True)
class MetadataResponseBroker(Struct):
    node_id: int = wire(INT32)
    host: str = wire(STRING)
    port: int = wire(INT32)
    rack: str | None = wire(STRING, "1+", nullable="1+", default=None)


@dataclass(slots=True)
class MetadataResponsePartition(Struct):
    error_code: int = wire(INT16)
    partition_index: int = wire(INT32)
    leader_id: int = wire(INT32)
    leader_epoch: int = wire(INT32, "7+", default=-1)
    replica_nodes: list[int] = wire(ARRAY(INT32))
    isr_nodes: list[int] = wire(ARRAY(INT32))
    offline_replicas: list[int] = wire(ARRAY(INT32), "5+")


@dataclass(slots=True)
class MetadataResponseTopic(Struct):
    error_code: int = wire(INT16)
    name: str = wire(STRING)
    is_internal: bool = wire(BOOL, "1+")
    partitions: list[MetadataResponsePartition] = wire(ARRAY(MetadataResponsePartition))
    topic_authorized_operations: int = wire(INT32, "8+", default=NO_AUTHORIZED_OPERATIONS)


@dataclass(slots=True)
class MetadataResponse(Struct):
    throttle_time_ms: int = wire(INT32, "3+")
    brokers: list[MetadataResponseBroker] = wire(ARRAY(MetadataResponseBroker))
    cluster_id: str | None = wire(STRING, "2+", nullable="2+", default=None)
    controller_id: int = wire(INT32, "1+", default=-1)
    topics: list[MetadataResponseTopic] = wire(ARRAY(MetadataResponseTopic))
    cluster_authorized_operations: int = wire(INT32, "8-10", default=NO_AUTHORIZED_OPERATIONS)


# -- CreateTopics (key 19) -------------------------------------------------------------------------------


@dataclass(slots=True)
class CreatableReplicaAssignment(Struct):
    partition_index: int = wire(INT32)
    broker_ids: list[int] = wire(ARRAY(INT32))


@dataclass(slots=True)
class CreatableTopicConfig(Struct):
    name: str = wire(STRING)
    value: str | None = wire(STRING, nullable="0+", default=None)


@dataclass(slots=True)
class CreatableTopic(Struct):
    name: str = wire(STRING)
    num_partitions: int = wire(INT32, default=-1)  # -1: the broker's default (v4+)
    replication_factor: int = wire(INT16, default=-1)
    assignments: list[CreatableReplicaAssignment] = wire(ARRAY(CreatableReplicaAssignment))
    configs: list[CreatableTopicConfig] = wire(ARRAY(CreatableTopicConfig))


@dataclass(slots=True)
class CreateTopicsRequest(Struct):
    topics: list[CreatableTopic] = wire(ARRAY(CreatableTopic))
    timeout_ms: int = wire(INT32, default=60000)
    validate_only: bool = wire(BOOL, "1+")


@dataclass(slots=True)
class CreatableTopicResult(Struct):
    name: str = wire(STRING)
    error_code: int = wire(INT16)
    error_message: str | None = wire(STRING, "1+", nullable="0+", default=None)


@dataclass(slots=True)
class CreateTopicsResponse(Struct):
    throttle_time_ms: int = wire(INT32, "2+")
    topics: list[CreatableTopicResult] = wire(ARRAY(CreatableTopicResult))


# -- DeleteTopics (key 20) -------------------------------------------------------------------------------


@dataclass(slots=True)
class DeleteTopicsRequest(Struct):
    topic_names: list[str] = wire(ARRAY(STRING), "0-5")
    timeout_ms: int = wire(INT32)


@dataclass(slots=True)
class DeletableTopicResult(Struct):
    name: str = wire(STRING)
    error_code: int = wire(INT16)


@dataclass(slots=True)
class DeleteTopicsResponse(Struct):
    throttle_time_ms: int = wire(INT32, "1+")
    responses: list[DeletableTopicResult] = wire(ARRAY(DeletableTopicResult))


# -- InitProducerId (key 22) -----------------------------------------------------------------------------


@dataclass(slots=True)
class InitProducerIdRequest(Struct):
    transactional_id: str | None = wire(STRING, nullable="0+", default=None)
    transaction_timeout_ms: int = wire(INT32)


@dataclass(slots=True)
class InitProducerIdResponse(Struct):
    throttle_time_ms: int = wire(INT32)
    error_code: int = wire(INT16)
    producer_id: int = wire(INT64, default=-1)
    producer_epoch: int = wire(INT16, default=-1)


# -- OffsetForLeaderEpoch (key 23) -----------------------------------------------------------------------


@dataclass(slots=True)
class OffsetForLeaderPartition(Struct):
    partition: int = wire(INT32)
    current_leader_epoch: int = wire(INT32, "2+", default=-1)
    leader_epoch: int = wire(INT32)


@dataclass(slots=True)
class OffsetForLeaderTopic(Struct):
    topic: str = wire(STRING)
    partitions: list[OffsetForLeaderPartition] = wire(ARRAY(OffsetForLeaderPartition))


@dataclass(slots=True)
class OffsetForLeaderEpochRequest(Struct):
    replica_id: int = wire(INT32, "3+", default=-2)
    topics: list[OffsetForLeaderTopic] = wire(ARRAY(OffsetForLeaderTopic))


@dataclass(slots=True)
class EpochEndOffset(Struct):
    error_code: int = wire(INT16)
    partition: int = wire(INT32)
    leader_epoch: int = wire(INT32, "1+", default=-1)
    end_offset: int = wire(INT64, default=-1)


@dataclass(slots=True)
class OffsetForLeaderTopicResult(Struct):
    topic: str = wire(STRING)
    partitions: list[EpochEndOffset] = wire(ARRAY(EpochEndOffset))


@dataclass(slots=True)
class OffsetForLeaderEpochResponse(Struct):
    throttle_time_ms: int = wire(INT32, "2+")
    topics: list[OffsetForLeaderTopicResult] = wire(ARRAY(OffsetForLeaderTopicResult))


# -- DescribeLogDirs (key 35) ----------------------------------------------------------------------------


@dataclass(slots=True)
class DescribableLogDirTopic(Struct):
    topic: str = wire(STRING)
    partitions: list[int] = wire(ARRAY(INT32))


@dataclass(slots=True)
class DescribeLogDirsRequest(Struct):
    # None (null) asks for every partition of every topic
    topics: list[DescribableLogDirTopic] | None = wire(
        ARRAY(DescribableLogDirTopic), nullable="0+", default=None
    )


@dataclass(slots=True)
class DescribeLogDirsPartition(Struct):
    partition_index: int = wire(INT32)
    partition_size: int = wire(INT64)  # bytes of the partition's segment files
    offset_lag: int = wire(INT64)  # current log: max(0, high watermark - log end offset)
    is_future_key: bool = wire(BOOL)


@dataclass(slots=True)
class DescribeLogDirsTopic(Struct):
    name: str = wire(STRING)
    partitions: list[DescribeLogDirsPartition] = wire(ARRAY(DescribeLogDirsPartition))


@dataclass(slots=True)
class DescribeLogDirsResult(Struct):
    error_code: int = wire(INT16)
    log_dir: str = wire(STRING)
    topics: list[DescribeLogDirsTopic] = wire(ARRAY(DescribeLogDirsTopic))


@dataclass(slots=True)
class DescribeLogDirsResponse(Struct):
    throttle_time_ms: int = wire(INT32)
    results: list[DescribeLogDirsResult] = wire(ARRAY(DescribeLogDirsResult))
