"""DescribeSegments, the appliance's own API for its replicas (``appliance.broker.segment_requests``),
against a live broker: a replica is answered the leader's closed segments with the CRC-32C of each file; a
client (``replica_id`` -1), an unknown topic or partition get a clear error; malformed requests close
their connection; no request changes a file.
"""

from __future__ import annotations

import hashlib
import random
import socket
import struct
from collections.abc import Iterator
from pathlib import Path

import crc32c
import pytest
from support.kafka_appliance import Appliance, served_appliance
from support.wire import WireClient

from ipc.kafka import (
    ApiKey,
    ErrorCode,
    PartitionProduceData,
    ProduceRequest,
    TopicProduceData,
    supported_api_versions,
)
from ipc.kafka.appliance_messages import DescribeSegmentsRequest, DescribeSegmentsTopic
from ipc.kafka.samples import mutate, sample_requests
from storage.batch_builder import build_batch

TOPIC = "segs"


@pytest.fixture(scope="module")
def appliance(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Appliance]:
    extra = f'"auto.create.topics.enable" = false\n[topics.{TOPIC}]\npartitions = 1\n"segment.bytes" = 1024\n'
    yield from served_appliance(tmp_path_factory.mktemp("segments"), {}, extra)


@pytest.fixture(scope="module")
def client(appliance: Appliance) -> Iterator[WireClient]:
    host, port = appliance.bootstrap.rsplit(":", 1)
    wire = WireClient((host, int(port)))
    for i in range(20):  # several segments of 1024 bytes
        request = ProduceRequest(acks=1, timeout_ms=10_000, topic_data=[TopicProduceData(TOPIC, [
            PartitionProduceData(index=0, records=build_batch([b"v%03d-" % i + b"x" * 200]))])])
        assert wire.call(ApiKey.PRODUCE, 8, request).responses[0].partition_responses[0].error_code == 0
    yield wire
    wire.close()


def _ask(client: WireClient, replica_id: int, topics: dict[str, list[int]], checksums: bool = True) -> object:
    return client.call(ApiKey.DESCRIBE_SEGMENTS, 0, DescribeSegmentsRequest(
        replica_id=replica_id, checksums=checksums,
        topics=[DescribeSegmentsTopic(name, partitions) for name, partitions in topics.items()]))


def _files(directory: Path) -> dict[str, str]:
    """The segment files' digests (the writer rewrites its checkpoints on its own schedule)."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())
            if p.name.endswith((".log", ".index", ".timeindex"))}


def test_a_replica_is_answered_the_closed_segments_with_their_checksums(appliance: Appliance,
                                                                         client: WireClient) -> None:
    directory = appliance.data_dir / f"{TOPIC}-0"
    before = _files(directory)
    answer = _ask(client, 1, {TOPIC: [0]})
    assert answer.error_code == ErrorCode.NONE  # type: ignore[attr-defined]
    found = answer.topics[0].partitions[0]  # type: ignore[attr-defined]
    assert found.error_code == ErrorCode.NONE and found.error_message is None
    logs = sorted(p for p in directory.iterdir() if p.name.endswith(".log"))
    assert len(logs) >= 3
    assert [s.base_offset for s in found.segments] == [int(p.name[:20]) for p in logs[:-1]]
    assert found.active_base_offset == int(logs[-1].name[:20])
    for segment, after, path in zip(found.segments, logs[1:], logs, strict=False):
        data = path.read_bytes()
        assert (segment.next_offset, segment.size_bytes) == (int(after.name[:20]), len(data))
        assert segment.checksum == crc32c.crc32c(data)
    unchecked = _ask(client, 1, {TOPIC: [0]}, checksums=False).topics[0].partitions[0]  # type: ignore[attr-defined]
    assert {s.checksum for s in unchecked.segments} == {-1}
    assert _files(directory) == before


def test_a_client_an_unknown_topic_or_partition_get_a_clear_error_and_change_nothing(
        appliance: Appliance, client: WireClient) -> None:
    directory = appliance.data_dir / f"{TOPIC}-0"
    before = _files(directory)
    refused = _ask(client, -1, {TOPIC: [0]})
    assert refused.error_code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED  # type: ignore[attr-defined]
    assert "replica" in refused.error_message and refused.topics == []  # type: ignore[attr-defined]
    answer = _ask(client, 1, {"nosuch": [0], TOPIC: [7]})
    by_name = {t.name: t.partitions[0] for t in answer.topics}  # type: ignore[attr-defined]
    for name, index in (("nosuch", 0), (TOPIC, 7)):
        assert by_name[name].error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        assert f"{name}-{index}" in by_name[name].error_message and by_name[name].segments == []
    assert ApiKey.DESCRIBE_SEGMENTS not in {v.api_key for v in supported_api_versions()}
    assert _files(directory) == before


def test_malformed_requests_close_their_connection_and_the_broker_answers_on(appliance: Appliance,
                                                                             client: WireClient) -> None:
    rng = random.Random(5)
    samples = [s for s in sample_requests(rng, advertised_only=False)
               if s.spec.api_key == ApiKey.DESCRIBE_SEGMENTS]
    host, port = appliance.bootstrap.rsplit(":", 1)
    for _ in range(200):
        body = mutate(rng.choice(samples).frame[4:], rng)
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(struct.pack(">i", len(body)) + body)
            sock.shutdown(socket.SHUT_WR)
            while sock.recv(65536):  # an answer, or the broker closing the connection
                pass
    assert _ask(client, 1, {TOPIC: [0]}).topics[0].partitions[0].error_code == 0  # type: ignore[attr-defined]
