"""Deleting groups and committed offsets with real admin clients against ``appliance serve``.

confluent-kafka's AdminClient sets offsets (``alter_consumer_group_offsets``), reads them
(``list_consumer_group_offsets``) and deletes groups (``delete_consumer_groups``: DeleteGroups);
kafka-python's KafkaAdminClient deletes groups and offsets (``delete_group_offsets``: OffsetDelete).  A group
with a member is not deleted, nor are the offsets of a topic it consumes.  One appliance for the module;
that a deletion survives a restart is shown in ``test_group_offsets_durable.py``.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
from support.kafka_appliance import Appliance, served_appliance
from support.wire import WireClient

from ipc.kafka import ApiKey, ErrorCode, FindCoordinatorRequest, OffsetFetchRequest, OffsetFetchRequestTopic

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import ConsumerGroupTopicPartitions, KafkaError, KafkaException, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient  # noqa: E402

with warnings.catch_warnings():  # kafka-python reads its schemas with a deprecated importlib call
    warnings.simplefilter("ignore", DeprecationWarning)
    import kafka
    import kafka.errors
    from kafka.admin import KafkaAdminClient

TOPIC = "admin"
OTHER = "admin-other"
PARTITIONS = 2


@pytest.fixture(scope="module")
def appliance(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Appliance]:
    for running in served_appliance(tmp_path_factory.mktemp("group-admin"), {TOPIC: PARTITIONS, OTHER: 1},
                                    extra='"group.initial.rebalance.delay.ms" = 0'):
        coordinator_ready(running.bootstrap)
        yield running


def coordinator_ready(bootstrap: str) -> None:
    """Wait for ``__consumer_offsets`` to be created and loaded (the first group request creates it): the
    admin calls of librdkafka give up on a coordinator that is not available yet."""
    host, port = bootstrap.rsplit(":", 1)
    client = WireClient((host, int(port)), client_id="ready")
    try:
        deadline = time.monotonic() + 30
        fetch = OffsetFetchRequest("ready", [OffsetFetchRequestTopic(TOPIC, [0])])
        while time.monotonic() < deadline:
            found = client.call(ApiKey.FIND_COORDINATOR, 2, FindCoordinatorRequest(key="ready", key_type=0))
            if found.error_code == ErrorCode.NONE \
                    and client.call(ApiKey.OFFSET_FETCH, 5, fetch).error_code == ErrorCode.NONE:
                return
            time.sleep(0.1)
        raise AssertionError("the group coordinator is not available after 30 s")
    finally:
        client.close()


def set_offsets(admin: Any, group: str, offsets: dict[tuple[str, int], int]) -> None:
    asked = ConsumerGroupTopicPartitions(group, [TopicPartition(t, p, o) for (t, p), o in offsets.items()])
    done = admin.alter_consumer_group_offsets([asked])[group].result(30)
    assert all(tp.error is None for tp in done.topic_partitions), done.topic_partitions


def committed(admin: Any, group: str, partitions: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
    asked = ConsumerGroupTopicPartitions(group, [TopicPartition(t, p) for t, p in partitions])
    done = admin.list_consumer_group_offsets([asked])[group].result(30)
    return {(tp.topic, tp.partition): tp.offset for tp in done.topic_partitions if tp.offset >= 0}


def delete_error(admin: Any, group: str) -> int | None:
    try:
        admin.delete_consumer_groups([group], request_timeout=30)[group].result(30)
    except KafkaException as e:
        code: int = e.args[0].code()
        return code
    return None


def member(bootstrap: str, group: str, topic: str) -> Any:
    """A confluent-kafka consumer of ``group`` subscribed to ``topic``, polled until it has partitions."""
    c = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                                  "session.timeout.ms": 6000, "heartbeat.interval.ms": 500})
    c.subscribe([topic])
    deadline = time.monotonic() + 30
    while not c.assignment() and time.monotonic() < deadline:
        c.poll(0.1)
    assert c.assignment()
    return c


def test_an_empty_group_is_deleted_and_a_missing_one_named(appliance: Appliance) -> None:
    admin = AdminClient({"bootstrap.servers": appliance.bootstrap})
    partitions = [(TOPIC, 0), (TOPIC, 1)]
    set_offsets(admin, "emptied", {(TOPIC, 0): 3, (TOPIC, 1): 4})
    assert committed(admin, "emptied", partitions) == {(TOPIC, 0): 3, (TOPIC, 1): 4}
    assert delete_error(admin, "emptied") is None
    assert committed(admin, "emptied", partitions) == {}
    assert delete_error(admin, "emptied") == KafkaError.GROUP_ID_NOT_FOUND
    assert delete_error(admin, "never-was") == KafkaError.GROUP_ID_NOT_FOUND


def test_a_group_with_a_member_is_not_deleted(appliance: Appliance) -> None:
    admin = AdminClient({"bootstrap.servers": appliance.bootstrap})
    set_offsets(admin, "busy", {(TOPIC, 0): 1})
    c = member(appliance.bootstrap, "busy", TOPIC)
    try:
        assert delete_error(admin, "busy") == KafkaError.NON_EMPTY_GROUP
        assert committed(admin, "busy", [(TOPIC, 0)]) == {(TOPIC, 0): 1}
    finally:
        c.close()
    assert delete_error(admin, "busy") is None  # empty once its member left


def test_kafka_python_deletes_offsets_of_topics_not_consumed(appliance: Appliance) -> None:
    admin = AdminClient({"bootstrap.servers": appliance.bootstrap})
    set_offsets(admin, "partly", {(TOPIC, 0): 5, (TOPIC, 1): 6, (OTHER, 0): 7})
    kp = KafkaAdminClient(bootstrap_servers=appliance.bootstrap)
    c = member(appliance.bootstrap, "partly", TOPIC)
    try:
        asked = [kafka.TopicPartition(TOPIC, 0), kafka.TopicPartition(OTHER, 0)]
        answer = kp.delete_group_offsets("partly", asked)
        assert answer == {kafka.TopicPartition(TOPIC, 0): kafka.errors.GroupSubscribedToTopicError,
                          kafka.TopicPartition(OTHER, 0): kafka.errors.NoError}
        left = committed(admin, "partly", [(TOPIC, 0), (TOPIC, 1), (OTHER, 0)])
        assert left == {(TOPIC, 0): 5, (TOPIC, 1): 6}
    finally:
        c.close()
    try:
        answer = kp.delete_group_offsets("partly", [kafka.TopicPartition(TOPIC, 0)])  # empty now
        assert answer == {kafka.TopicPartition(TOPIC, 0): kafka.errors.NoError}
        assert committed(admin, "partly", [(TOPIC, 0), (TOPIC, 1)]) == {(TOPIC, 1): 6}
        with pytest.raises(kafka.errors.GroupIdNotFoundError):
            kp.delete_group_offsets("no-such-group", [kafka.TopicPartition(TOPIC, 0)])
        deleted = kp.delete_groups(["partly", "no-such-group"])
        assert dict(deleted) == {"partly": "OK", "no-such-group": "GroupIdNotFoundError"}
    finally:
        kp.close()
    assert committed(admin, "partly", [(TOPIC, 1)]) == {}


def test_the_offsets_topic_keeps_its_partitions_and_its_records(appliance: Appliance) -> None:
    """DeleteTopics, CreatePartitions and DeleteRecords of ``__consumer_offsets`` are refused with
    INVALID_TOPIC_EXCEPTION, and the committed offsets are still there."""
    from confluent_kafka.admin import NewPartitions

    admin = AdminClient({"bootstrap.servers": appliance.bootstrap})
    set_offsets(admin, "kept", {(TOPIC, 0): 9})
    offsets = "__consumer_offsets"
    refusals = [
        admin.delete_topics([offsets], operation_timeout=10)[offsets],
        admin.create_partitions([NewPartitions(offsets, 10)])[offsets],
    ]
    refusals += list(admin.delete_records([TopicPartition(offsets, p, -1) for p in range(3)]).values())
    for future in refusals:
        with pytest.raises(KafkaException) as refused:
            future.result(30)
        assert refused.value.args[0].code() == KafkaError.TOPIC_EXCEPTION
    assert committed(admin, "kept", [(TOPIC, 0)]) == {(TOPIC, 0): 9}
