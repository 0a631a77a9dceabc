"""``message.timestamp.type`` and the CreateTime limits against ``appliance serve``, through real clients.

A LogAppendTime topic gets records from confluent-kafka, kafka-python and our local ``Producer``, all stamped
by their producers with an old CreateTime; every reader (confluent-kafka, kafka-python, our ``Consumer``
over TCP and over memory maps, ``appliance dump-log``) must see the append time with the LogAppendTime
type, and ``offsets_for_times`` must search by it; the producers' delivery reports (confluent-kafka's message
timestamp, kafka-python's ``RecordMetadata``) carry that append time, from the Produce response's
``log_append_time_ms``, while a CreateTime topic's carry the producer's own time.  A CreateTime topic with
``message.timestamp.before.max.ms`` / ``after.max.ms`` refuses a batch stamped out of range with Kafka's
INVALID_TIMESTAMP and appends nothing of it.  A batch a producer marked LogAppendTime itself (hand-built,
over Kafka's protocol and through a ring) is stored as CreateTime on a CreateTime topic and refused with
INVALID_TIMESTAMP on a LogAppendTime topic, as Kafka's LogValidator does.
"""

from __future__ import annotations

import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from typing import Any

import confluent_kafka
import pytest
from support.kafka_appliance import Appliance, served_appliance
from support.wire import WireClient, answers, produce

from appliance.client.consumer import Consumer
from appliance.client.producer import Producer
from ipc.control import ControlClient
from ipc.kafka import ApiKey, ErrorCode
from ipc.ring_publisher import RingPublisher, publish_and_wait
from storage.batch_builder import build_batch
from storage.batch_header import MAX_TIMESTAMP_OFFSET, parse_header, write_crc
from storage.errors import ApplianceError
from storage.timestamp_rules import stamp_log_append_time

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    import kafka
    import kafka.errors
    import kafka.structs

OLD_MS = 1_600_000_000_000  # what the producers stamp: long before the appliance's clock
TOPICS = ('[topics.lat]\npartitions = 1\n"message.timestamp.type" = "LogAppendTime"\n'
          '[topics.limited]\npartitions = 1\n"message.timestamp.before.max.ms" = 60000\n'
          '"message.timestamp.after.max.ms" = 60000\n'
          '[topics.plain]\npartitions = 1\n[topics.marked]\npartitions = 1\n'
          '[topics.claimed]\npartitions = 1\n')


@pytest.fixture(scope="module")
def appliance(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Appliance]:
    yield from served_appliance(tmp_path_factory.mktemp("appliance"), {}, TOPICS)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _confluent_records(appliance: Appliance, topic: str, count: int) -> list[tuple[int, int, int]]:
    """(offset, timestamp type, timestamp) of the first ``count`` records, by confluent-kafka."""
    consumer = confluent_kafka.Consumer({"bootstrap.servers": appliance.bootstrap, "group.id": "unused",
                                         "enable.auto.commit": False})
    try:
        consumer.assign([confluent_kafka.TopicPartition(topic, 0, confluent_kafka.OFFSET_BEGINNING)])
        out: list[tuple[int, int, int]] = []
        deadline = time.monotonic() + 30
        while len(out) < count and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=100, timeout=0.5):
                assert msg.error() is None, msg.error()
                kind, ts = msg.timestamp()
                out.append((msg.offset(), {confluent_kafka.TIMESTAMP_CREATE_TIME: 0,
                                           confluent_kafka.TIMESTAMP_LOG_APPEND_TIME: 1}[kind], ts))
        return out
    finally:
        consumer.close()


def _kafka_python_records(appliance: Appliance, topic: str, count: int) -> list[tuple[int, int, int]]:
    consumer = kafka.KafkaConsumer(bootstrap_servers=appliance.bootstrap, auto_offset_reset="earliest",
                                   enable_auto_commit=False)
    try:
        consumer.assign([kafka.structs.TopicPartition(topic, 0)])
        out: list[tuple[int, int, int]] = []
        deadline = time.monotonic() + 30
        while len(out) < count and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                out += [(r.offset, r.timestamp_type, r.timestamp) for r in records]
        found = consumer.offsets_for_times({kafka.structs.TopicPartition(topic, 0): OLD_MS + 1})
        assert [v.offset for v in found.values()] == [0]  # the producers' times are not what is searched
        return out
    finally:
        consumer.close()


def _ours(config: dict[str, Any], topic: str, count: int) -> list[tuple[int, int, int]]:
    with Consumer(config) as consumer:
        consumer.assign([(topic, 0)])
        consumer.seek_to_beginning((topic, 0))
        out: list[tuple[int, int, int]] = []
        deadline = time.monotonic() + 30
        while len(out) < count and time.monotonic() < deadline:
            out += [(r.offset, r.timestamp_type, r.timestamp) for r in consumer.poll(500)]
        return out


def test_every_client_sees_the_append_time_on_a_log_append_time_topic(appliance: Appliance) -> None:
    before = _now_ms()
    producer = confluent_kafka.Producer({"bootstrap.servers": appliance.bootstrap, "linger.ms": 5})
    for i in range(5):
        producer.produce("lat", value=b"ck-%d" % i, timestamp=OLD_MS)
    assert producer.flush(30) == 0
    kp = kafka.KafkaProducer(bootstrap_servers=appliance.bootstrap)
    for i in range(5):
        kp.send("lat", value=b"kp-%d" % i, timestamp_ms=OLD_MS)
    kp.flush(30)
    kp.close()
    with Producer({"appliance.data.dir": appliance.data_dir}) as ours:
        for i in range(5):
            ours.send("lat", b"own-%d" % i, timestamp=OLD_MS)
        ours.flush()
    after = _now_ms()
    for seen in (_confluent_records(appliance, "lat", 15), _kafka_python_records(appliance, "lat", 15),
                 _ours({"bootstrap.servers": appliance.bootstrap}, "lat", 15),
                 _ours({"appliance.data.dir": str(appliance.data_dir)}, "lat", 15)):
        assert [offset for offset, _, _ in seen] == list(range(15))
        assert all(kind == 1 and before <= ts <= after for _, kind, ts in seen), seen
    with Consumer({"appliance.data.dir": str(appliance.data_dir)}) as consumer:
        assert list(consumer.offsets_for_times({("lat", 0): before}).values()) == [0]
        assert list(consumer.offsets_for_times({("lat", 0): after + 1}).values()) == [None]
    segment = next((appliance.data_dir / "lat-0").glob("*.log"))
    dumped = subprocess.run([sys.executable, "-m", "appliance.cli", "dump-log", str(segment)],
                            capture_output=True, text=True, timeout=60, check=True).stdout
    assert dumped.count("timestampType: LogAppendTime") >= 3 and "CreateTime" not in dumped


def test_a_createtime_topic_refuses_records_outside_its_limits(appliance: Appliance) -> None:
    errors: list[Any] = []
    producer = confluent_kafka.Producer({"bootstrap.servers": appliance.bootstrap, "linger.ms": 5,
                                         "retries": 0})
    producer.produce("limited", value=b"old", timestamp=_now_ms() - 3_600_000,
                     on_delivery=lambda err, msg: errors.append(err))
    assert producer.flush(30) == 0
    producer.produce("limited", value=b"future", timestamp=_now_ms() + 3_600_000,
                     on_delivery=lambda err, msg: errors.append(err))
    assert producer.flush(30) == 0
    producer.produce("limited", value=b"now", on_delivery=lambda err, msg: errors.append(err))
    assert producer.flush(30) == 0
    assert [e.code() if e else None for e in errors] == [confluent_kafka.KafkaError.INVALID_TIMESTAMP] * 2 + [
        None]
    kp = kafka.KafkaProducer(bootstrap_servers=appliance.bootstrap, retries=0)
    with pytest.raises(kafka.errors.InvalidTimestampError):
        kp.send("limited", value=b"old", timestamp_ms=_now_ms() - 3_600_000).get(timeout=30)
    kp.close()
    seen = _ours({"bootstrap.servers": appliance.bootstrap}, "limited", 1)
    assert [(offset, kind) for offset, kind, _ in seen] == [(0, 0)]  # only "now", nothing of the others
    assert "INVALID_TIMESTAMP" in appliance.log_text() and "message.timestamp.before.max.ms" in (
        appliance.log_text())


def test_delivery_reports_carry_the_append_time_of_a_log_append_time_topic(appliance: Appliance) -> None:
    reports: list[tuple[str, int, int]] = []

    def delivered(err: Any, msg: Any) -> None:
        assert err is None, err
        kind, ts = msg.timestamp()
        reports.append((msg.topic(), kind, ts))

    before = _now_ms()
    producer = confluent_kafka.Producer({"bootstrap.servers": appliance.bootstrap, "linger.ms": 5})
    for topic in ("lat", "plain", "lat"):
        producer.produce(topic, value=b"report", timestamp=OLD_MS, on_delivery=delivered)
        assert producer.flush(30) == 0
    kp = kafka.KafkaProducer(bootstrap_servers=appliance.bootstrap)
    lat = kp.send("lat", value=b"report", timestamp_ms=OLD_MS).get(timeout=30)
    plain = kp.send("plain", value=b"report", timestamp_ms=OLD_MS).get(timeout=30)
    kp.close()
    after = _now_ms()
    stamped = [ts for topic, kind, ts in reports if topic == "lat"]
    assert [kind for topic, kind, _ in reports if topic == "lat"] == [
        confluent_kafka.TIMESTAMP_LOG_APPEND_TIME] * 2, reports
    assert all(before <= ts <= after for ts in stamped) and stamped == sorted(stamped), reports
    assert [(kind, ts) for topic, kind, ts in reports if topic == "plain"] == [
        (confluent_kafka.TIMESTAMP_CREATE_TIME, OLD_MS)]
    assert stamped[-1] <= lat.timestamp <= after and plain.timestamp == OLD_MS
    # what a consumer reads is what the reports said
    seen = _ours({"bootstrap.servers": appliance.bootstrap}, "lat", lat.offset + 1)
    read = {ts for _, _, ts in seen}
    assert set(stamped) | {lat.timestamp} <= read


def _marked_batch(first_ms: int, max_ms: int) -> bytearray:
    """A producer's batch marked LogAppendTime by its producer: records stamped first_ms, first_ms + 5."""
    batch = bytearray(build_batch([b"m1", b"m2"], timestamps=[first_ms, first_ms + 5]))
    stamp_log_append_time(memoryview(batch), 0, parse_header(batch), max_ms)
    return batch


def test_a_batch_a_producer_marked_log_append_time_is_kept_as_kafka_keeps_it(appliance: Appliance) -> None:
    host, port = appliance.bootstrap.split(":")
    wire = WireClient((host, int(port)))
    control = ControlClient.connect(str(appliance.data_dir / ".appliance.sock"), timeout_s=30)
    rings = {topic: RingPublisher.attach(control.attach(topic, 0).names, topic=topic, partition=0)
             for topic in ("marked", "lat")}
    first = _now_ms() - 1000
    try:
        request = produce(1, ("marked", 0, bytes(_marked_batch(first, first + 50))),
                          ("lat", 0, bytes(_marked_batch(first, first + 50))))
        response = wire.call(ApiKey.PRODUCE, 8, request)
        assert answers(response) == {("marked", 0): (ErrorCode.NONE, 0),
                                     ("lat", 0): (ErrorCode.INVALID_TIMESTAMP, -1)}
        assert publish_and_wait(rings["marked"], _marked_batch(first, first + 60), timeout_ms=10_000) == 2
        with pytest.raises(ApplianceError, match="INVALID_TIMESTAMP"):
            publish_and_wait(rings["lat"], _marked_batch(first, first + 60), timeout_ms=10_000)
    finally:
        for ring in rings.values():
            ring.close()
        control.close()
        wire.close()
    seen = _ours({"bootstrap.servers": appliance.bootstrap}, "marked", 4)
    assert seen == [(0, 0, first), (1, 0, first + 5), (2, 0, first), (3, 0, first + 5)]
    segment = next((appliance.data_dir / "marked-0").glob("*.log"))
    dumped = subprocess.run([sys.executable, "-m", "appliance.cli", "dump-log", str(segment)],
                            capture_output=True, text=True, timeout=60, check=True).stdout
    assert dumped.count("timestampType: CreateTime") == 2 and "LogAppendTime" not in dumped, dumped
    assert f"maxTimestamp: {first + 50} " in dumped and f"maxTimestamp: {first + 60} " in dumped, dumped
    assert "must not set the LogAppendTime type" in appliance.log_text()


def test_a_header_claiming_a_later_max_timestamp_is_stored_with_its_records(appliance: Appliance) -> None:
    """Kafka's LogValidator sets a CreateTime batch's maxTimestamp to its records' largest: a producer whose
    header claims a far later one is appended with the records' (the batch, the time index and ListOffsets
    by time, which confluent-kafka's offsets_for_times asks, see the records' timestamps)."""
    host, port = appliance.bootstrap.split(":")
    wire = WireClient((host, int(port)))
    first = _now_ms() - 1000
    batch = bytearray(build_batch([b"c1", b"c2"], timestamps=[first, first + 5]))
    batch[MAX_TIMESTAMP_OFFSET : MAX_TIMESTAMP_OFFSET + 8] = (first + 86_400_000).to_bytes(8, "big")
    write_crc(batch, 0, len(batch))
    try:
        response = wire.call(ApiKey.PRODUCE, 8, produce(1, ("claimed", 0, bytes(batch))))
        assert answers(response) == {("claimed", 0): (ErrorCode.NONE, 0)}
    finally:
        wire.close()
    consumer = confluent_kafka.Consumer({"bootstrap.servers": appliance.bootstrap, "group.id": "unused"})
    try:
        asked = [confluent_kafka.TopicPartition("claimed", 0, first + 3),
                 confluent_kafka.TopicPartition("claimed", 0, first + 60_000)]
        found = [consumer.offsets_for_times([tp], timeout=30)[0].offset for tp in asked]
    finally:
        consumer.close()
    assert found == [1, -1]  # the record stamped first + 5; none a minute later
    segment = next((appliance.data_dir / "claimed-0").glob("*.log"))
    dumped = subprocess.run([sys.executable, "-m", "appliance.cli", "dump-log", str(segment)],
                            capture_output=True, text=True, timeout=60, check=True).stdout
    assert f"maxTimestamp: {first + 5} " in dumped, dumped
