"""Produce refused for a record's sake: a keyless record to a compacted topic, through ``appliance serve``.

The broker refuses the whole batch with INVALID_RECORD and Produce v8's ``record_errors`` naming the keyless
records' batch indexes (KIP-467); nothing of the batch is appended.  librdkafka (confluent-kafka 2.x) then
fails every message of that batch permanently, the keyless one and the 99 others alike, with INVALID_RECORD:
the batch is one unit of append, and librdkafka does not resend the other records on its own.  Our local
``Producer`` (the rings, no broker) checks the same rule before it publishes and reports the same way: the
keyless records fail with their own InvalidRecordError, the others with the batch's.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import confluent_kafka
import pytest
from support.kafka_appliance import Appliance, served_appliance
from support.wire import WireClient, produce

from appliance.client.producer import Producer
from ipc.kafka import ApiKey, ErrorCode
from storage.batch_builder import build_batch
from storage.compression import COMPRESSION_ZSTD
from storage.errors import InvalidRecordError

COMPACTED = '[topics.comp]\npartitions = 1\n"cleanup.policy" = "compact"\n'


@pytest.fixture(scope="module")
def appliance(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Appliance]:
    yield from served_appliance(tmp_path_factory.mktemp("appliance"), {"plain": 1}, COMPACTED)


@pytest.fixture
def wire(appliance: Appliance) -> Iterator[WireClient]:
    host, port = appliance.bootstrap.split(":")
    client = WireClient((host, int(port)))
    try:
        yield client
    finally:
        client.close()


def _end_offset(appliance: Appliance, topic: str) -> int:
    consumer = confluent_kafka.Consumer({"bootstrap.servers": appliance.bootstrap, "group.id": "t"})
    try:
        return int(consumer.get_watermark_offsets(confluent_kafka.TopicPartition(topic, 0), timeout=10)[1])
    finally:
        consumer.close()


def _produce_100(appliance: Appliance, topic: str, keyless: int) -> dict[int, Any]:
    """100 records in one batch, the one at ``keyless`` without a key; each record's delivery error.

    The topic's metadata is asked first and the linger is long, so no batch leaves while the 100 are queued
    (a loaded machine once split them 94 + 6); ``flush`` sends the one batch at once.
    """
    producer = confluent_kafka.Producer({"bootstrap.servers": appliance.bootstrap, "linger.ms": 60_000})
    producer.list_topics(topic, timeout=10)
    reports: dict[int, Any] = {}
    for i in range(100):
        producer.produce(topic, key=None if i == keyless else b"k%d" % i, value=b"v%d" % i,
                         on_delivery=lambda err, msg, i=i: reports.__setitem__(i, err))
    assert producer.flush(30) == 0
    return reports


def test_a_keyless_record_in_a_batch_of_100_fails_it_with_invalid_record(appliance: Appliance) -> None:
    before = _end_offset(appliance, "comp")
    reports = _produce_100(appliance, "comp", keyless=37)
    assert reports[37] is not None and reports[37].code() == confluent_kafka.KafkaError.INVALID_RECORD
    others = Counter(None if e is None else e.code() for i, e in reports.items() if i != 37)
    assert others == {confluent_kafka.KafkaError.INVALID_RECORD: 99}  # the whole batch, as librdkafka has it
    assert _end_offset(appliance, "comp") == before  # nothing appended


def test_keyed_records_to_a_compacted_topic_and_keyless_ones_elsewhere_are_appended(
    appliance: Appliance,
) -> None:
    before = _end_offset(appliance, "comp")
    producer = confluent_kafka.Producer({"bootstrap.servers": appliance.bootstrap, "linger.ms": 50})
    errors: list[Any] = []
    for i in range(20):
        producer.produce("comp", key=b"k%d" % i, value=b"v", on_delivery=lambda e, m: errors.append(e))
        producer.produce("plain", value=b"v", on_delivery=lambda e, m: errors.append(e))
    assert producer.flush(30) == 0
    assert errors == [None] * 40
    assert _end_offset(appliance, "comp") == before + 20


@pytest.mark.parametrize("compression", [0, COMPRESSION_ZSTD])
def test_produce_v8_names_every_keyless_record(wire: WireClient, appliance: Appliance,
                                               compression: int) -> None:
    keys = [None if i in (2, 7) else b"k%d" % i for i in range(10)]
    batch = build_batch([b"v"] * 10, keys, compression=compression)
    before = _end_offset(appliance, "comp")
    response = wire.call(ApiKey.PRODUCE, 8, produce(1, ("comp", 0, batch)))
    [answer] = response.responses[0].partition_responses
    assert answer.error_code == ErrorCode.INVALID_RECORD
    assert [e.batch_index for e in answer.record_errors] == [2, 7]
    assert "comp-0: record at batch index 7 has no key" in answer.record_errors[1].batch_index_error_message
    assert "comp-0" in answer.error_message and "batch index 2, 7" in answer.error_message
    assert "not appended" in answer.error_message
    assert _end_offset(appliance, "comp") == before


def test_produce_before_v8_gets_the_error_code_alone(wire: WireClient) -> None:
    batch = build_batch([b"v"], [None])
    response = wire.call(ApiKey.PRODUCE, 7, produce(1, ("comp", 0, batch)))
    [answer] = response.responses[0].partition_responses
    assert answer.error_code == ErrorCode.INVALID_RECORD


# -- the local producer (rings): the same refusal, reported to its callbacks ---------------------------------


def _local_producer(appliance: Appliance) -> Producer:
    return Producer({"appliance.data.dir": str(appliance.data_dir), "linger.ms": 300})


def test_the_local_producer_fails_the_keyless_record_with_its_own_reason(appliance: Appliance) -> None:
    before = _end_offset(appliance, "comp")
    producer = _local_producer(appliance)
    reports: dict[int, Any] = {}
    try:
        handles = [producer.send("comp", b"v", key=None if i == 37 else b"k%d" % i, partition=0,
                                 callback=lambda err, meta, i=i: reports.__setitem__(i, err))
                   for i in range(100)]
        producer.flush(30)
    finally:
        producer.close()
    assert isinstance(reports[37], InvalidRecordError)
    assert "compacted topic comp-0: record at batch index 37 has no key" in str(reports[37])
    assert {type(e) for i, e in reports.items() if i != 37} == {InvalidRecordError}
    assert "batch index 37" in str(reports[0]) and "not appended" in str(reports[0])
    with pytest.raises(InvalidRecordError, match="record at batch index 37 has no key"):
        handles[37].get(5)
    assert _end_offset(appliance, "comp") == before


def test_the_local_producer_sends_keyed_records_after_a_refused_batch(appliance: Appliance) -> None:
    before = _end_offset(appliance, "comp")
    producer = _local_producer(appliance)
    try:
        refused = producer.send_many("comp", [b"a", b"b", b"c"], keys=[b"x", None, b"z"], partition=0)
        with pytest.raises(InvalidRecordError, match="batch index 1"):
            refused.get(10)
        delivered = producer.send_many("comp", [b"a", b"b"], keys=[b"x", b"y"], partition=0)
        assert delivered.get(10) is not None
        assert producer.send("plain", b"no key").get(10).offset >= 0
    finally:
        producer.close()
    assert _end_offset(appliance, "comp") == before + 2
