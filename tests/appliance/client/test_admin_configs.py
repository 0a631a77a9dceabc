"""The admin client's configuration, partition and record-deletion calls, against the codec only.

The broker has no handlers for these APIs yet, so a small stand-in answers on a real loopback socket: it
decodes each request with the codec, records it, and answers with canned responses.  What is checked is
what a user sees: the requests the calls send and what they return or raise.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from appliance.client.admin import KafkaAdmin
from ipc.kafka import (
    APIS,
    AlterConfigOp,
    AlterConfigsResourceResponse,
    AlterConfigsResponse,
    ApiKey,
    ApiVersion,
    ApiVersionsResponse,
    ConfigSource,
    ConfigType,
    CreatePartitionsResponse,
    CreatePartitionsTopicResult,
    DeleteRecordsPartitionResult,
    DeleteRecordsResponse,
    DeleteRecordsTopicResult,
    DescribeConfigsResourceResult,
    DescribeConfigsResponse,
    DescribeConfigsResult,
    DescribeConfigsSynonym,
    ErrorCode,
    FrameReader,
    IncrementalAlterConfigsResponse,
    MetadataResponse,
    MetadataResponseBroker,
    MetadataResponsePartition,
    MetadataResponseTopic,
    ResourceType,
    decode_request,
    encode_response,
)
from storage.errors import ConfigError

Answer = Callable[[Any], Any]


class StandIn:
    """A Kafka protocol server (a thread per connection) answering from ``answers`` by API key."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.requests: list[Any] = []
        self.answers: dict[int, Answer] = {
            ApiKey.API_VERSIONS: lambda _: ApiVersionsResponse(
                error_code=0,
                api_keys=[ApiVersion(s.api_key, s.min_version, s.max_version) for s in APIS.values()],
            ),
            ApiKey.METADATA: lambda _: MetadataResponse(
                brokers=[MetadataResponseBroker(0, "127.0.0.1", self.port, None)],
                controller_id=0,
                topics=[
                    MetadataResponseTopic(
                        0, "t", False, [MetadataResponsePartition(0, 0, 0, 0, [0], [0], [])]
                    )
                ],
            ),
        }
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            reader = FrameReader()
            while data := conn.recv(65536):
                reader.feed(data)
                for frame in reader.frames():
                    request = decode_request(frame)
                    self.requests.append(request.body)
                    answer = self.answers[request.header.api_key](request.body)
                    conn.sendall(encode_response(request.header, answer))

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def stand_in() -> Iterator[StandIn]:
    server = StandIn()
    try:
        yield server
    finally:
        server.close()


def test_describe_configs_returns_each_setting_with_its_source_and_synonyms(stand_in: StandIn) -> None:
    entry = DescribeConfigsResourceResult(
        name="retention.ms", value="1000", read_only=False, config_source=ConfigSource.TOPIC_CONFIG,
        is_sensitive=False, config_type=ConfigType.LONG, documentation="keep",
        synonyms=[DescribeConfigsSynonym("retention.ms", "1000", ConfigSource.TOPIC_CONFIG),
                  DescribeConfigsSynonym("log.retention.ms", "604800000", ConfigSource.DEFAULT_CONFIG)],
    )  # fmt: skip
    stand_in.answers[ApiKey.DESCRIBE_CONFIGS] = lambda _: DescribeConfigsResponse(
        results=[DescribeConfigsResult(0, None, ResourceType.TOPIC, "t", [entry])]
    )
    with KafkaAdmin(f"127.0.0.1:{stand_in.port}") as admin:
        got = admin.describe_configs(ResourceType.TOPIC, "t", ["retention.ms"])
    (asked,) = [r for r in stand_in.requests if type(r).__name__ == "DescribeConfigsRequest"]
    assert asked.resources[0].configuration_keys == ["retention.ms"] and asked.include_synonyms
    config = got["retention.ms"]
    assert (config.value, config.source, config.config_type) == (
        "1000",
        ConfigSource.TOPIC_CONFIG,
        ConfigType.LONG,
    )
    assert [s.name for s in config.synonyms] == ["retention.ms", "log.retention.ms"]


def test_an_invalid_config_answer_raises_config_error_with_the_brokers_message(stand_in: StandIn) -> None:
    message = "topic 't' configs: segment.bytes = 1: must be between 14 and 2147483647"
    stand_in.answers[ApiKey.INCREMENTAL_ALTER_CONFIGS] = lambda _: IncrementalAlterConfigsResponse(
        responses=[AlterConfigsResourceResponse(ErrorCode.INVALID_CONFIG, message, ResourceType.TOPIC, "t")]
    )
    stand_in.answers[ApiKey.ALTER_CONFIGS] = lambda _: AlterConfigsResponse(
        responses=[AlterConfigsResourceResponse(0, None, ResourceType.TOPIC, "t")]
    )
    with KafkaAdmin(f"127.0.0.1:{stand_in.port}") as admin:
        with pytest.raises(ConfigError, match=r"segment\.bytes = 1: must be between 14 .*INVALID_CONFIG"):
            admin.incremental_alter_configs(
                ResourceType.TOPIC, "t", set_configs={"segment.bytes": "1"}, delete_configs=["retention.ms"]
            )
        admin.alter_configs(ResourceType.TOPIC, "t", {"retention.ms": "5"}, validate_only=True)
    incremental, whole = stand_in.requests[-2:]
    assert [(c.name, c.config_operation, c.value) for c in incremental.resources[0].configs] == [
        ("segment.bytes", AlterConfigOp.SET, "1"), ("retention.ms", AlterConfigOp.DELETE, None),
    ]  # fmt: skip
    assert whole.validate_only and whole.resources[0].configs[0].value == "5"


def test_create_partitions_and_delete_records_send_kafkas_requests(stand_in: StandIn) -> None:
    stand_in.answers[ApiKey.CREATE_PARTITIONS] = lambda body: CreatePartitionsResponse(
        results=[CreatePartitionsTopicResult(t.name, 0, None) for t in body.topics]
    )
    stand_in.answers[ApiKey.DELETE_RECORDS] = lambda body: DeleteRecordsResponse(
        topics=[DeleteRecordsTopicResult(t.name, [DeleteRecordsPartitionResult(p.partition_index, p.offset, 0)
                                                  for p in t.partitions]) for t in body.topics]
    )  # fmt: skip
    with KafkaAdmin(f"127.0.0.1:{stand_in.port}") as admin:
        admin.create_partitions("t", 4)
        assert admin.delete_records({("t", 0): 42}) == {("t", 0): 42}
    grown = next(r for r in stand_in.requests if type(r).__name__ == "CreatePartitionsRequest")
    assert (grown.topics[0].name, grown.topics[0].count, grown.topics[0].assignments) == ("t", 4, None)
