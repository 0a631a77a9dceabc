"""Names beginning with ``__`` are refused on every path that creates a topic,
against a real ``appliance serve``: CreateTopics (confluent-kafka), Metadata auto-creation (the wire codec),
``appliance topics create`` over the control socket, and a local Producer's attach.  Nothing is created.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest
from support.kafka_appliance import REPO, Appliance, served_appliance

from appliance.client.producer import Producer
from ipc.kafka import ErrorCode, MetadataRequest, MetadataRequestTopic
from ipc.kafka_client import KafkaConnection
from storage.errors import ApplianceError

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

RESERVED = "reserved for the appliance's internal topics"


@pytest.fixture(scope="module")
def appliance(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Appliance]:
    yield from served_appliance(tmp_path_factory.mktemp("refusals"), {"seeded": 1})


def topic_names(appliance: Appliance) -> set[str]:
    return set(AdminClient({"bootstrap.servers": appliance.bootstrap}).list_topics(timeout=10).topics)


def topics_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "appliance.cli", "topics", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=60)  # fmt: skip


def create_over_kafka(appliance: Appliance, topic: NewTopic) -> confluent_kafka.KafkaError:
    admin = AdminClient({"bootstrap.servers": appliance.bootstrap})
    future = admin.create_topics([topic], request_timeout=30)[topic.topic]
    with pytest.raises(confluent_kafka.KafkaException) as caught:
        future.result(30)
    error: confluent_kafka.KafkaError = caught.value.args[0]
    return error


def test_internal_names_are_refused_on_every_creation_path(appliance: Appliance) -> None:
    before = topic_names(appliance)
    error = create_over_kafka(appliance, NewTopic("__consumer_offsets", 1, 1))
    assert error.code() == confluent_kafka.KafkaError.TOPIC_EXCEPTION
    assert RESERVED in error.str()

    host, port = appliance.bootstrap.split(":")
    with KafkaConnection(host, int(port)) as conn:
        answer = conn.request(MetadataRequest(topics=[MetadataRequestTopic(name="__auto")],
                                              allow_auto_topic_creation=True))  # fmt: skip
    assert [(t.name, t.error_code) for t in answer.topics] == [
        ("__auto", ErrorCode.INVALID_TOPIC_EXCEPTION)]

    result = topics_cli("create", "__by_cli", "--data-dir", str(appliance.data_dir))
    assert result.returncode == 1
    assert RESERVED in result.stderr, result.stderr

    with Producer({"appliance.data.dir": str(appliance.data_dir), "linger.ms": 0}) as producer:
        with pytest.raises(ApplianceError, match=r"reserved for the appliance.s internal topics"):
            producer.send("__local", b"x").get(10)

    assert topic_names(appliance) == before
    assert not [p for p in appliance.data_dir.iterdir() if p.name.startswith("__")]
