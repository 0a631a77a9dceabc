"""Metadata's ``allow_auto_topic_creation`` with the broker's ``auto.create.topics.enable``, with real
clients against ``appliance serve``: a missing topic asked for with both on is created with
``num.partitions`` (LEADER_NOT_AVAILABLE in that answer, the topic in a later one); with either off it is
UNKNOWN_TOPIC_OR_PARTITION and nothing is created."""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient
from support.kafka_appliance import Appliance, served_appliance

from ipc.kafka import ErrorCode, MetadataRequest, MetadataRequestTopic
from ipc.kafka_client import KafkaConnection

TIMEOUT_S = 30  # a first group in a fresh clone: its writers' kernels compiled as the suite runs


def serve(tmp_path_factory: pytest.TempPathFactory, name: str, extra: str) -> Iterator[Appliance]:
    yield from served_appliance(tmp_path_factory.mktemp(name), {}, extra)


@pytest.fixture(scope="module")
def appliance(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Appliance]:
    yield from serve(tmp_path_factory, "auto-create",
                     '"num.partitions" = 3\n"group.initial.rebalance.delay.ms" = 100')


@pytest.fixture(scope="module")
def disabled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Appliance]:
    yield from serve(tmp_path_factory, "no-auto-create", '"auto.create.topics.enable" = false')


def topic_names(appliance: Appliance) -> set[str]:
    admin = AdminClient({"bootstrap.servers": appliance.bootstrap})
    return set(admin.list_topics(timeout=TIMEOUT_S).topics)


def consumer(appliance: Appliance, allow: bool) -> Consumer:
    return Consumer({"bootstrap.servers": appliance.bootstrap, "group.id": "unused",
                     "allow.auto.create.topics": allow})  # fmt: skip


def metadata(appliance: Appliance, name: str, *, allow: bool) -> ErrorCode:
    host, port = appliance.bootstrap.split(":")
    with KafkaConnection(host, int(port)) as conn:
        answer = conn.request(MetadataRequest(topics=[MetadataRequestTopic(name=name)],
                                              allow_auto_topic_creation=allow))  # fmt: skip
    (topic,) = answer.topics
    return ErrorCode(topic.error_code)


def wait_for_partitions(appliance: Appliance, name: str) -> int:
    admin = AdminClient({"bootstrap.servers": appliance.bootstrap})
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        topic = admin.list_topics(name, timeout=TIMEOUT_S).topics[name]
        if topic.error is None and topic.partitions:
            return len(topic.partitions)
        time.sleep(0.1)
    raise AssertionError(f"topic {name!r} not created in {TIMEOUT_S} s")


def test_metadata_creates_a_missing_topic_answering_leader_not_available_first(appliance: Appliance) -> None:
    assert metadata(appliance, "asked", allow=True) == ErrorCode.LEADER_NOT_AVAILABLE
    assert wait_for_partitions(appliance, "asked") == 3  # num.partitions
    assert metadata(appliance, "asked", allow=True) == ErrorCode.NONE


def test_a_confluent_consumer_allowed_to_auto_create_gets_the_topic(appliance: Appliance) -> None:
    listing = consumer(appliance, allow=True)
    try:
        first = listing.list_topics("listed", timeout=TIMEOUT_S).topics["listed"]
        # LEADER_NOT_AVAILABLE while it is created; librdkafka may have asked again by the time it answers
        assert first.error is None or first.error.name() == "LEADER_NOT_AVAILABLE", first.error
    finally:
        listing.close()
    assert wait_for_partitions(appliance, "listed") == 3
    assigned = consumer(appliance, allow=True)
    try:
        assigned.assign([TopicPartition("assigned", 0, 0)])
        deadline = time.monotonic() + TIMEOUT_S
        while "assigned" not in topic_names(appliance) and time.monotonic() < deadline:
            assigned.poll(0.2)
    finally:
        assigned.close()
    assert "assigned" in topic_names(appliance)


def test_a_subscriber_to_a_missing_topic_gets_it_created_and_reads_what_is_then_produced(
    appliance: Appliance,
) -> None:
    """kafka-python's group consumer asks for the topics it subscribes to with creation allowed, as Java's
    does with ``allow.auto.create.topics``; librdkafka's (2.16) subscription never asks for creation."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from kafka import KafkaConsumer, KafkaProducer

    subscriber = KafkaConsumer(bootstrap_servers=appliance.bootstrap, group_id="subscriber",
                               auto_offset_reset="earliest", metadata_max_age_ms=500)  # fmt: skip
    try:
        subscriber.subscribe(["subscribed"])
        deadline = time.monotonic() + TIMEOUT_S
        while not subscriber.assignment() and time.monotonic() < deadline:
            subscriber.poll(200)
        assert sorted(tp.partition for tp in subscriber.assignment()) == [0, 1, 2], topic_names(appliance)
        producer = KafkaProducer(bootstrap_servers=appliance.bootstrap)
        try:
            producer.send("subscribed", b"after the subscription", partition=1).get(TIMEOUT_S)
        finally:
            producer.close()
        records: list = []
        while not records and time.monotonic() < deadline + TIMEOUT_S:
            records = [r for batch in subscriber.poll(200).values() for r in batch]
        assert [(r.partition, r.value) for r in records] == [(1, b"after the subscription")]
    finally:
        subscriber.close()


def test_a_kafka_python_producer_sending_to_a_missing_topic_gets_it_created(appliance: Appliance) -> None:
    with warnings.catch_warnings():  # kafka-python reads its schemas with a deprecated importlib call
        warnings.simplefilter("ignore", DeprecationWarning)
        from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=appliance.bootstrap)
    try:
        sent = producer.send("produced", b"first record").get(TIMEOUT_S)
    finally:
        producer.close()
    assert (sent.topic, sent.offset) == ("produced", 0)
    assert wait_for_partitions(appliance, "produced") == 3


def test_metadata_not_allowing_creation_or_with_a_bad_name_creates_nothing(appliance: Appliance) -> None:
    assert metadata(appliance, "not-allowed", allow=False) == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert metadata(appliance, "bad/name", allow=True) == ErrorCode.INVALID_TOPIC_EXCEPTION
    listing = consumer(appliance, allow=False)
    try:
        topic = listing.list_topics("consumer-default", timeout=TIMEOUT_S).topics["consumer-default"]
        assert topic.error is not None and topic.error.name() == "UNKNOWN_TOPIC_OR_PART"
    finally:
        listing.close()
    # a creation asked for after them, the same way, is recorded: one asked for by them would be by then
    assert metadata(appliance, "created-after", allow=True) == ErrorCode.LEADER_NOT_AVAILABLE
    wait_for_partitions(appliance, "created-after")
    assert not {"not-allowed", "bad/name", "consumer-default"} & topic_names(appliance)


def test_with_auto_create_topics_enable_false_nothing_is_created(disabled: Appliance) -> None:
    assert metadata(disabled, "wanted", allow=True) == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    listing = consumer(disabled, allow=True)
    try:
        topic = listing.list_topics("wanted", timeout=TIMEOUT_S).topics["wanted"]
        assert topic.error is not None and topic.error.name() == "UNKNOWN_TOPIC_OR_PART"
    finally:
        listing.close()
    time.sleep(0.5)  # a creation, had one been asked for, is recorded within milliseconds
    assert "wanted" not in topic_names(disabled)
