"""The configuration and partition-administration messages: DescribeConfigs, AlterConfigs,
IncrementalAlterConfigs, CreatePartitions, DeleteRecords.

Every version of each also goes through the schema-wide suites (round trips, kafka-python's bytes, every
truncation, trailing bytes, the fuzzer).  Here: bytes written by hand from Kafka's JSON definitions, the
fields that exist in some versions only, bad lengths and nulls, and which versions are advertised.
"""

from __future__ import annotations

import struct

import pytest

from ipc.kafka import (
    APIS,
    AlterableConfig,
    AlterConfigOp,
    AlterConfigsRequest,
    AlterConfigsResource,
    ApiKey,
    ConfigSource,
    ConfigType,
    CreatePartitionsAssignment,
    CreatePartitionsRequest,
    CreatePartitionsTopic,
    DeleteRecordsPartition,
    DeleteRecordsPartitionResult,
    DeleteRecordsRequest,
    DeleteRecordsResponse,
    DeleteRecordsTopic,
    DeleteRecordsTopicResult,
    DescribeConfigsRequest,
    DescribeConfigsResource,
    DescribeConfigsResourceResult,
    DescribeConfigsResponse,
    DescribeConfigsResult,
    DescribeConfigsSynonym,
    IncrementalAlterableConfig,
    IncrementalAlterConfigsRequest,
    IncrementalAlterConfigsResource,
    RequestHeader,
    ResourceType,
    UnsupportedVersionError,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
    supported_api_versions,
)
from storage.errors import ProtocolError

NEW_APIS = {
    ApiKey.DELETE_RECORDS: (0, 1),
    ApiKey.DESCRIBE_CONFIGS: (0, 4),
    ApiKey.ALTER_CONFIGS: (0, 1),
    ApiKey.CREATE_PARTITIONS: (0, 1),
    ApiKey.INCREMENTAL_ALTER_CONFIGS: (0, 0),
}


def _string(text: str) -> bytes:
    data = text.encode()
    return struct.pack(">h", len(data)) + data


def _header(api_key: int, version: int, correlation_id: int = 7, client: str = "t") -> bytes:
    return struct.pack(">hhi", api_key, version, correlation_id) + _string(client)


def test_the_versions_spoken_are_kafkas_and_the_non_flexible_ones_are_advertised() -> None:
    for key, (low, high) in NEW_APIS.items():
        assert (APIS[key].min_version, APIS[key].max_version) == (low, high)
        assert APIS[key].advertised
    advertised = {v.api_key: (v.min_version, v.max_version) for v in supported_api_versions()}
    assert set(NEW_APIS) <= set(advertised)
    assert advertised[ApiKey.DESCRIBE_CONFIGS] == (0, 3)  # v4 is flexible: spoken by the client only
    assert ApiKey.CREATE_TOPICS in advertised and ApiKey.METADATA in advertised


def test_a_describe_configs_v1_request_reads_as_kafka_lays_it_out() -> None:
    body = (
        _header(ApiKey.DESCRIBE_CONFIGS, 1)
        + struct.pack(">i", 2)  # resources
        + struct.pack(">b", ResourceType.TOPIC)
        + _string("orders")
        + struct.pack(">i", -1)  # configuration_keys: null, every key
        + struct.pack(">b", ResourceType.BROKER)
        + _string("0")
        + struct.pack(">i", 1)
        + _string("log.retention.ms")
        + b"\x01"  # include_synonyms
    )
    request = decode_request(body)
    assert request.header == RequestHeader(ApiKey.DESCRIBE_CONFIGS, 1, 7, "t")
    assert request.body == DescribeConfigsRequest(
        resources=[
            DescribeConfigsResource(ResourceType.TOPIC, "orders", None),
            DescribeConfigsResource(ResourceType.BROKER, "0", ["log.retention.ms"]),
        ],
        include_synonyms=True,
    )
    assert encode_request(request.header, request.body)[4:] == body


def test_describe_configs_results_carry_is_default_in_v0_and_source_synonyms_type_and_doc_later() -> None:
    entry = DescribeConfigsResourceResult(
        name="retention.ms",
        value="86400000",
        read_only=False,
        is_default=True,
        config_source=ConfigSource.TOPIC_CONFIG,
        is_sensitive=False,
        synonyms=[DescribeConfigsSynonym("log.retention.ms", "604800000", ConfigSource.DEFAULT_CONFIG)],
        config_type=ConfigType.LONG,
        documentation="how long to keep a closed segment",
    )
    response = DescribeConfigsResponse(
        results=[DescribeConfigsResult(0, None, ResourceType.TOPIC, "t", [entry])]
    )
    sizes = {}
    for version in range(5):
        header = RequestHeader(ApiKey.DESCRIBE_CONFIGS, version, 9, "c")
        frame = encode_response(header, response)
        sizes[version] = len(frame)
        (got,) = decode_response(frame[4:], ApiKey.DESCRIBE_CONFIGS, version).body.results[0].configs
        assert got.is_default is (version == 0)
        assert got.config_source == (-1 if version == 0 else ConfigSource.TOPIC_CONFIG)
        assert got.synonyms == ([] if version == 0 else entry.synonyms)
        assert got.config_type == (ConfigType.LONG if version >= 3 else 0)
        assert got.documentation == (entry.documentation if version >= 3 else None)
    assert sizes[1] == sizes[2] < sizes[3]  # v2 is v1 (throttling); v3 adds the type and documentation


def test_incremental_alter_configs_carries_an_operation_per_key() -> None:
    request = IncrementalAlterConfigsRequest(
        resources=[
            IncrementalAlterConfigsResource(
                ResourceType.TOPIC,
                "orders",
                [
                    IncrementalAlterableConfig("retention.ms", AlterConfigOp.SET, "1000"),
                    IncrementalAlterableConfig("segment.bytes", AlterConfigOp.DELETE, None),
                ],
            )
        ],
        validate_only=True,
    )
    frame = encode_request(RequestHeader(ApiKey.INCREMENTAL_ALTER_CONFIGS, 0, 1, "c"), request)
    expected = (
        struct.pack(">i", 1)
        + struct.pack(">b", ResourceType.TOPIC)
        + _string("orders")
        + struct.pack(">i", 2)
        + _string("retention.ms")
        + struct.pack(">b", AlterConfigOp.SET)
        + _string("1000")
        + _string("segment.bytes")
        + struct.pack(">b", AlterConfigOp.DELETE)
        + struct.pack(">h", -1)
        + b"\x01"
    )
    assert frame.endswith(expected)
    assert decode_request(frame[4:]).body == request


def test_create_partitions_assignments_may_be_null_and_delete_records_round_trips() -> None:
    for assignments in (None, [CreatePartitionsAssignment([0]), CreatePartitionsAssignment([1, 0])]):
        request = CreatePartitionsRequest([CreatePartitionsTopic("t", 3, assignments)], 5000, False)
        frame = encode_request(RequestHeader(ApiKey.CREATE_PARTITIONS, 1, 2, None), request)
        assert decode_request(frame[4:]).body == request
    delete = DeleteRecordsRequest([DeleteRecordsTopic("t", [DeleteRecordsPartition(0, 42)])], 3000)
    frame = encode_request(RequestHeader(ApiKey.DELETE_RECORDS, 1, 3, "c"), delete)
    assert frame[-16:] == struct.pack(">iqi", 0, 42, 3000)
    answer = DeleteRecordsResponse(
        5, [DeleteRecordsTopicResult("t", [DeleteRecordsPartitionResult(0, 42, 0)])]
    )
    frame = encode_response(RequestHeader(ApiKey.DELETE_RECORDS, 1, 3, "c"), answer)
    assert decode_response(frame[4:], ApiKey.DELETE_RECORDS, 1).body == answer


def _describe_request(resources: bytes, count: int) -> bytes:
    return _header(ApiKey.DESCRIBE_CONFIGS, 0) + struct.pack(">i", count) + resources


@pytest.mark.parametrize(
    ("body", "said"),
    [
        (_describe_request(b"", 0x7FFFFFFF), "array"),  # more resources than the frame could hold
        (_describe_request(b"", -2), "array"),  # a negative count that is not null
        (_describe_request(b"\x02" + struct.pack(">h", -1) + struct.pack(">i", -1), 1), "null"),  # null name
        (
            _describe_request(b"\x02" + struct.pack(">h", 200) + b"abc" + b"\xff" * 4, 1),
            "string",
        ),  # past the end
        (
            _describe_request(b"\x02" + _string("t") + struct.pack(">i", 5) + _string("k"), 1),
            "",
        ),  # 5 keys, 1 given
    ],
    ids=["huge-count", "negative-count", "null-name", "long-name", "short-keys"],
)
def test_bad_lengths_and_nulls_are_protocol_errors_naming_the_request(body: bytes, said: str) -> None:
    with pytest.raises(ProtocolError, match="DescribeConfigs v0 request") as info:
        decode_request(body)
    assert said in str(info.value)


def test_an_alter_configs_value_may_be_null_but_a_name_may_not() -> None:
    request = AlterConfigsRequest(
        [AlterConfigsResource(ResourceType.TOPIC, "t", [AlterableConfig("k", None)])]
    )
    frame = encode_request(RequestHeader(ApiKey.ALTER_CONFIGS, 1, 4, "c"), request)
    assert decode_request(frame[4:]).body == request
    with pytest.raises(ValueError, match=r"AlterableConfig\.name"):
        encode_request(
            RequestHeader(ApiKey.ALTER_CONFIGS, 1, 4, "c"),
            AlterConfigsRequest([AlterConfigsResource(2, "t", [AlterableConfig(None, "v")])]),  # type: ignore[arg-type]
        )


@pytest.mark.parametrize(
    ("api_key", "version"), [(ApiKey.INCREMENTAL_ALTER_CONFIGS, 1), (ApiKey.ALTER_CONFIGS, 2)]
)
def test_flexible_versions_of_the_alter_apis_are_not_spoken(api_key: int, version: int) -> None:
    with pytest.raises(UnsupportedVersionError):
        decode_request(_header(api_key, version) + b"\x00")
