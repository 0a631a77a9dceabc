"""The Consumer against a running ``appliance serve`` (supervisor, partition writers, broker): records
produced by kafka-python, confluent-kafka and appliance.Producer read back identically through the Consumer's
remote (TCP) and local (mmap) paths, and what the appliance's Producer writes reads back identically through
the Kafka clients."""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.consumer_fixtures import RunningAppliance, start_appliance

from appliance.client.consumer import Consumer, ConsumerRecord, TopicPartition
from ipc.kafka_client import BrokerConnectionError
from storage.errors import OffsetOutOfRangeError, UnknownTopicOrPartitionError

pytestmark = pytest.mark.slow

Row = tuple[int, int, bytes | None, bytes | None, tuple[tuple[str, bytes | None], ...]]


@pytest.fixture(scope="module")
def appliance(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningAppliance]:
    running = start_appliance(tmp_path_factory.mktemp("appliance"),
                              {"kp": 2, "ck": 1, "own": 2, "offsets": 1, "wake": 1})
    try:
        yield running
    finally:
        running.stop()
    assert "Traceback" not in running.log_text(), running.log_text()


def remote(appliance: RunningAppliance, **settings: object) -> Consumer:
    return Consumer({"bootstrap.servers": appliance.bootstrap, "auto.offset.reset": "earliest", **settings})


def local(appliance: RunningAppliance, **settings: object) -> Consumer:
    return Consumer({"appliance.data.dir": appliance.data_dir, "auto.offset.reset": "earliest", **settings})


def read_all(consumer: Consumer, partitions: list[TopicPartition], count: int) -> dict[int, list[Row]]:
    consumer.assign(partitions)
    out: dict[int, list[Row]] = {tp.partition: [] for tp in partitions}
    got = 0
    deadline = time.monotonic() + 30
    while got < count and time.monotonic() < deadline:
        for r in consumer.poll(timeout_ms=500, max_records=5000):
            out[r.partition].append((r.offset, r.timestamp, r.key, r.value, r.headers))
            got += 1
    assert consumer.poll(timeout_ms=100) == []
    consumer.close()
    return out


def both_paths(appliance: RunningAppliance, topic: str, partitions: int, count: int) -> dict[int, list[Row]]:
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    over_tcp = read_all(remote(appliance), tps, count)
    through_mmap = read_all(local(appliance), tps, count)
    assert over_tcp == through_mmap
    assert sum(len(rows) for rows in over_tcp.values()) == count
    return over_tcp


def test_kafka_python_records_read_back_identically_on_both_paths(appliance: RunningAppliance) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from kafka import KafkaProducer

        producer = KafkaProducer(bootstrap_servers=appliance.bootstrap, linger_ms=2)
    sent: dict[int, list[tuple[bytes | None, bytes, tuple[tuple[str, bytes], ...]]]] = {0: [], 1: []}
    for i in range(2000):
        key = None if i % 5 == 0 else b"key-%d" % (i % 13)
        headers = [("n", b"%d" % i), ("kind", b"kp")] if i % 3 else []
        producer.send("kp", value=b"kafka-python-%d" % i, key=key, headers=headers, partition=i % 2)
        sent[i % 2].append((key, b"kafka-python-%d" % i, tuple(headers)))
    producer.flush()
    producer.close()
    rows = both_paths(appliance, "kp", 2, 2000)
    for partition in (0, 1):
        assert [(k, v, h) for _, _, k, v, h in rows[partition]] == sent[partition]
        assert [o for o, *_ in rows[partition]] == list(range(1000))


def test_confluent_idempotent_zstd_records_read_back_identically_on_both_paths(
    appliance: RunningAppliance,
) -> None:
    confluent_kafka = pytest.importorskip("confluent_kafka")
    producer = confluent_kafka.Producer({"bootstrap.servers": appliance.bootstrap, "enable.idempotence": True,
                                         "compression.type": "zstd", "linger.ms": 5})
    for i in range(3000):
        producer.produce("ck", value=b"confluent-%d" % i, key=None if i % 2 else b"k%d" % i,
                         headers={"i": b"%d" % i}, timestamp=1_700_000_000_000 + i)
    assert producer.flush(30) == 0
    rows = both_paths(appliance, "ck", 1, 3000)[0]
    assert [(o, t, k, v, h) for o, t, k, v, h in rows] == [
        (i, 1_700_000_000_000 + i, None if i % 2 else b"k%d" % i, b"confluent-%d" % i, (("i", b"%d" % i),))
        for i in range(3000)
    ]


def test_what_the_appliance_producer_writes_kafka_clients_read_as_the_consumer_does(
    appliance: RunningAppliance,
) -> None:
    from appliance.client.producer import Producer

    with Producer({"appliance.data.dir": appliance.data_dir, "linger.ms": 1}) as producer:
        for i in range(1500):
            producer.send("own", b"own-%d" % i, key=b"k%d" % (i % 4), headers=[("h", b"%d" % i)],
                          partition=i % 2)
        producer.flush()
    ours = both_paths(appliance, "own", 2, 1500)
    confluent_kafka = pytest.importorskip("confluent_kafka")
    consumer = confluent_kafka.Consumer({"bootstrap.servers": appliance.bootstrap, "group.id": "unused",
                                         "enable.auto.commit": False})
    consumer.assign([confluent_kafka.TopicPartition("own", p, confluent_kafka.OFFSET_BEGINNING)
                     for p in (0, 1)])
    theirs: dict[int, list[Row]] = {0: [], 1: []}
    deadline = time.monotonic() + 30
    while sum(map(len, theirs.values())) < 1500 and time.monotonic() < deadline:
        for msg in consumer.consume(num_messages=1000, timeout=0.5):
            assert msg.error() is None, msg.error()
            theirs[msg.partition()].append((msg.offset(), msg.timestamp()[1], msg.key(), msg.value(),
                                            tuple(msg.headers() or ())))
    consumer.close()
    assert theirs == ours
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from kafka import KafkaConsumer
        from kafka import TopicPartition as KafkaTopicPartition

        kp = KafkaConsumer(bootstrap_servers=appliance.bootstrap, enable_auto_commit=False)
    kp.assign([KafkaTopicPartition("own", 1)])
    kp.seek_to_beginning()
    rows: list[Row] = []
    deadline = time.monotonic() + 30
    while len(rows) < len(ours[1]) and time.monotonic() < deadline:
        for records in kp.poll(timeout_ms=200).values():
            rows += [(r.offset, r.timestamp, r.key, r.value, tuple(r.headers)) for r in records]
    kp.close()
    assert rows == ours[1]


def test_offsets_seeks_and_out_of_range_over_tcp(appliance: RunningAppliance) -> None:
    from appliance.client.producer import Producer

    with Producer({"appliance.data.dir": appliance.data_dir}) as producer:
        for i in range(100):
            producer.send("offsets", b"%d" % i, partition=0, timestamp=1_000_000 + 10 * i)
        producer.flush()
    tp = TopicPartition("offsets", 0)
    for consumer in (remote(appliance, **{"auto.offset.reset": "none"}),
                     local(appliance, **{"auto.offset.reset": "none"})):
        with consumer:
            assert consumer.partitions_for_topic("offsets") == [0]
            consumer.assign([tp])
            with pytest.raises(OffsetOutOfRangeError, match="no position"):
                consumer.poll(timeout_ms=0)
            assert consumer.beginning_offsets([tp]) == {tp: 0}
            assert consumer.end_offsets([tp]) == {tp: 100}
            consumer.seek_to_end()
            assert consumer.position(tp) == 100
            consumer.seek(tp, 95)
            assert [r.value for r in _poll_until(consumer, 5)] == [b"95", b"96", b"97", b"98", b"99"]
            offset = consumer.offsets_for_times({tp: 1_000_000 + 10 * 42})[tp]
            assert offset is not None and offset <= 42
            consumer.seek(tp, 1000)
            with pytest.raises(OffsetOutOfRangeError, match="offset 1000"):
                _poll_until(consumer, 1, timeout_s=5)


def _poll_until(consumer: Consumer, count: int, timeout_s: float = 10) -> list[ConsumerRecord]:
    out: list[ConsumerRecord] = []
    deadline = time.monotonic() + timeout_s
    while len(out) < count and time.monotonic() < deadline:
        out += consumer.poll(timeout_ms=200)
    return out


def test_a_long_poll_returns_as_soon_as_a_record_is_produced(appliance: RunningAppliance) -> None:
    from appliance.client.producer import Producer

    producer = Producer({"appliance.data.dir": appliance.data_dir, "linger.ms": 0})
    consumers = [remote(appliance, **{"fetch.max.wait.ms": 5000}), local(appliance)]
    try:
        for consumer in consumers:
            consumer.assign([("wake", 0)])
            consumer.seek_to_end()
            assert consumer.poll(timeout_ms=100) == []
        timer = threading.Timer(0.3, lambda: producer.send("wake", b"now").get())
        timer.start()
        started = time.monotonic()
        woke = []
        for consumer in consumers:
            got = consumer.poll(timeout_ms=10_000)
            woke.append(time.monotonic() - started)
            assert [r.value for r in got] == [b"now"]
        timer.join()
        assert max(woke) < 3.0, woke
    finally:
        producer.close()
        for consumer in consumers:
            consumer.close()


def test_kafka_connection_over_the_brokers_unix_socket(appliance: RunningAppliance) -> None:
    from ipc.kafka import ApiKey, MetadataRequest
    from ipc.kafka_client import KafkaConnection

    path = str(Path(appliance.data_dir) / ".broker.sock")  # appliance.unix.listener's default
    with KafkaConnection.over_unix_socket(path, client_id="unix-test") as conn:
        assert conn.version_for(ApiKey.FETCH) == 11
        names = {t.name for t in conn.request(MetadataRequest(topics=None)).topics}
    assert {"kp", "ck", "own"} <= names


def test_unknown_topics_and_absent_brokers_are_clear_errors(appliance: RunningAppliance,
                                                            tmp_path: Path) -> None:
    for consumer in (remote(appliance), local(appliance)):
        with consumer, pytest.raises(UnknownTopicOrPartitionError, match="nope"):
            consumer.assign([("nope", 0)])
    from support.consumer_fixtures import free_port

    port = free_port()
    consumer = Consumer({"bootstrap.servers": f"127.0.0.1:{port}"})
    with pytest.raises(BrokerConnectionError, match=f"127.0.0.1:{port}: cannot connect"):
        consumer.assign([("kp", 0)])
    consumer.close()
    nowhere: Any = Consumer({"appliance.data.dir": str(tmp_path)})
    with pytest.raises(UnknownTopicOrPartitionError, match="no directory kp-0"):
        nowhere.assign([("kp", 0)])
