"""Real Kafka clients, unmodified, against a running appliance (supervisor, partition writers, broker).

kcat (the Debian package, librdkafka 2.0), confluent-kafka (librdkafka 2.x) and kafka-python each list
metadata, produce and consume over TCP; what one client produces, the others read back identically.  The
appliance runs as ``appliance serve`` does: a supervisor process forking the writers and the broker.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
from support.kafka_appliance import KCAT, Appliance, served_appliance

needs_kcat = pytest.mark.skipif(KCAT is None, reason="kcat is not installed (make install provisions it)")

# `appliance serve`, with the broker as its child whether or not the supervisor lists it already.










@pytest.fixture(scope="module")
def appliance(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Appliance]:
    yield from served_appliance(
        tmp_path_factory.mktemp("appliance"), {"kcat": 2, "ck": 3, "kp": 1, "mixed": 1, "cross": 1}
    )


def kafka_python_read(consumer: Any, count: int, timeout_s: float = 20) -> list[Any]:
    """The next ``count`` records from an assigned kafka-python consumer."""
    out: list[Any] = []
    deadline = time.monotonic() + timeout_s
    while len(out) < count and time.monotonic() < deadline:
        for records in consumer.poll(timeout_ms=200, max_records=count - len(out)).values():
            out += records
    return out


def kcat(*args: str, input: bytes | None = None, timeout: float = 30) -> str:
    assert KCAT is not None
    result = subprocess.run([KCAT, *args], input=input, capture_output=True, timeout=timeout)
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    return result.stdout.decode()


def kcat_consume(bootstrap: str, topic: str, partition: int, count: int) -> list[tuple[int, str, str]]:
    """(offset, key, value) of the first ``count`` records of a partition, read by kcat."""
    out = kcat(
        "-b",
        bootstrap,
        "-C",
        "-t",
        topic,
        "-p",
        str(partition),
        "-o",
        "beginning",
        "-c",
        str(count),
        "-e",
        "-q",
        "-f",
        "%o\t%k\t%s\n",
    )
    rows = [line.split("\t") for line in out.splitlines()]
    return [(int(o), k, v) for o, k, v in rows]


# -- kcat ------------------------------------------------------------------------------------------------


@needs_kcat
def test_kcat_lists_metadata(appliance: Appliance) -> None:
    out = kcat("-b", appliance.bootstrap, "-L")
    assert f"broker 0 at {appliance.bootstrap} (controller)" in out
    assert 'topic "kcat" with 2 partitions:' in out
    assert "partition 0, leader 0, replicas: 0, isrs: 0" in out
    assert "partition 1, leader 0, replicas: 0, isrs: 0" in out
    json_out = kcat("-b", appliance.bootstrap, "-L", "-J", "-t", "ck")
    assert '"topic":"ck"' in json_out and '"partitions":[' in json_out


@needs_kcat
@pytest.mark.parametrize("codec", ["none", "zstd"])
def test_kcat_produces_and_consumes(appliance: Appliance, codec: str) -> None:
    partition = 0 if codec == "none" else 1
    lines = [f"key-{i}\tvalue-{codec}-{i}" for i in range(500)]
    kcat(
        "-b",
        appliance.bootstrap,
        "-P",
        "-t",
        "kcat",
        "-p",
        str(partition),
        "-z",
        codec,
        "-K",
        "\t",
        input=("\n".join(lines) + "\n").encode(),
    )
    rows = kcat_consume(appliance.bootstrap, "kcat", partition, 500)
    assert rows == [(i, f"key-{i}", f"value-{codec}-{i}") for i in range(500)]


@needs_kcat
def test_kcat_producing_to_an_unknown_topic_creates_it(appliance: Appliance) -> None:
    kcat("-b", appliance.bootstrap, "-P", "-t", "auto-created", "-p", "0", input=b"hello\n")
    assert kcat_consume(appliance.bootstrap, "auto-created", 0, 1) == [(0, "", "hello")]
    assert (appliance.data_dir / "auto-created-0").is_dir()


# -- confluent-kafka -------------------------------------------------------------------------------------


def test_confluent_kafka_idempotent_zstd_producer_and_assign_consumer(appliance: Appliance) -> None:
    confluent_kafka = pytest.importorskip("confluent_kafka")
    producer = confluent_kafka.Producer(
        {
            "bootstrap.servers": appliance.bootstrap,
            "enable.idempotence": True,
            "compression.type": "zstd",
            "linger.ms": 5,
        }
    )
    reports: list[tuple[Any, int, int]] = []

    def on_delivery(err: Any, msg: Any) -> None:
        reports.append((err, msg.partition(), msg.offset()))

    sent = {}
    for i in range(3000):
        key, value = b"k%d" % (i % 11), b"confluent-%d" % i
        producer.produce("ck", value=value, key=key, on_delivery=on_delivery)
        sent[value] = key
    assert producer.flush(30) == 0
    assert [r for r in reports if r[0] is not None] == []
    by_partition: dict[int, list[int]] = {}
    for _, partition, offset in reports:
        by_partition.setdefault(partition, []).append(offset)
    for offsets in by_partition.values():  # dense, each exactly once
        assert sorted(offsets) == list(range(len(offsets)))

    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": appliance.bootstrap,
            "group.id": "unused-with-assign",
            "enable.auto.commit": False,
        }
    )
    consumer.assign(
        [confluent_kafka.TopicPartition("ck", p, confluent_kafka.OFFSET_BEGINNING) for p in range(3)]
    )
    got: dict[bytes, bytes] = {}
    deadline = time.monotonic() + 30
    while len(got) < len(sent) and time.monotonic() < deadline:
        for message in consumer.consume(1000, 0.5):
            assert message.error() is None, message.error()
            got[message.value()] = message.key()
    consumer.close()
    assert got == sent


# -- kafka-python ----------------------------------------------------------------------------------------


def test_kafka_python_connects_without_pinning_api_version_produces_and_consumes(
    appliance: Appliance,
) -> None:
    kafka = pytest.importorskip("kafka")
    producer = kafka.KafkaProducer(bootstrap_servers=appliance.bootstrap)
    futures = [producer.send("kp", key=b"k", value=b"kafka-python-%d" % i) for i in range(200)]
    producer.flush(30)
    offsets = [f.get(10).offset for f in futures]
    producer.close()
    assert offsets == list(range(200))

    consumer = kafka.KafkaConsumer(bootstrap_servers=appliance.bootstrap, enable_auto_commit=False)
    tp = kafka.TopicPartition("kp", 0)
    consumer.assign([tp])
    consumer.seek_to_beginning(tp)
    values = [m.value for m in kafka_python_read(consumer, 200)]
    consumer.close()
    assert values == [b"kafka-python-%d" % i for i in range(200)]


def test_kafka_python_admin_creates_and_deletes_topics(appliance: Appliance) -> None:
    kafka = pytest.importorskip("kafka")
    from kafka.admin import NewTopic

    admin = kafka.KafkaAdminClient(bootstrap_servers=appliance.bootstrap)
    try:
        admin.create_topics([NewTopic("made-by-admin", num_partitions=3, replication_factor=1)])
        assert "made-by-admin" in admin.list_topics()
        assert all((appliance.data_dir / f"made-by-admin-{p}").is_dir() for p in range(3))
        with pytest.raises(kafka.errors.TopicAlreadyExistsError):
            admin.create_topics([NewTopic("made-by-admin", num_partitions=1, replication_factor=1)])
        with pytest.raises(kafka.errors.InvalidTopicError):
            admin.create_topics([NewTopic("../escape", num_partitions=1, replication_factor=1)])
        admin.delete_topics(["made-by-admin"])
        assert "made-by-admin" not in admin.list_topics()
    finally:
        admin.close()
    assert not (appliance.data_dir.parent / "escape-0").exists()


# -- one client's records, read by the others ------------------------------------------------------------


@needs_kcat
def test_what_one_client_produces_the_others_read_identically(appliance: Appliance) -> None:
    confluent_kafka = pytest.importorskip("confluent_kafka")
    kafka = pytest.importorskip("kafka")
    kcat("-b", appliance.bootstrap, "-P", "-t", "mixed", "-p", "0", "-K", ":", input=b"a:from-kcat\n")
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": appliance.bootstrap, "enable.idempotence": True, "compression.type": "zstd"}
    )
    producer.produce("mixed", key=b"b", value="from-confluent é".encode(), partition=0)
    assert producer.flush(10) == 0
    kp = kafka.KafkaProducer(bootstrap_servers=appliance.bootstrap, compression_type="zstd")
    kp.send("mixed", key=b"c", value=b"from-kafka-python", partition=0).get(10)
    kp.close()
    expected = [(0, "a", "from-kcat"), (1, "b", "from-confluent é"), (2, "c", "from-kafka-python")]
    assert kcat_consume(appliance.bootstrap, "mixed", 0, 3) == expected
    consumer = kafka.KafkaConsumer(bootstrap_servers=appliance.bootstrap, enable_auto_commit=False)
    tp = kafka.TopicPartition("mixed", 0)
    consumer.assign([tp])
    consumer.seek_to_beginning()
    seen = [(m.offset, m.key.decode(), m.value.decode()) for m in kafka_python_read(consumer, 3)]
    end = consumer.end_offsets([tp])[tp]
    consumer.close()
    assert (seen, end) == (expected, 3)  # the three records, and nothing after them


def test_the_broker_process_is_titled(appliance: Appliance) -> None:
    titles = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                parent = int(f.read().rsplit(b")", 1)[1].split()[1])
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().rstrip(b"\0").replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if parent == appliance.process.pid:
            titles.append(cmdline)
    assert "appliance: broker" in titles


@needs_kcat
def test_records_cross_between_kafka_clients_and_the_appliance_clients(appliance: Appliance) -> None:
    """What kcat, confluent-kafka and kafka-python produce, ``appliance.Consumer`` reads identically on the
    remote and the local path; what ``appliance.Producer`` produces, kcat reads identically."""
    confluent_kafka = pytest.importorskip("confluent_kafka")
    kafka = pytest.importorskip("kafka")
    from appliance.client.consumer import Consumer
    from appliance.client.producer import Producer

    kcat(
        "-b",
        appliance.bootstrap,
        "-P",
        "-t",
        "cross",
        "-p",
        "0",
        "-K",
        ":",
        "-z",
        "zstd",
        input=b"k1:from kcat\n",
    )
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": appliance.bootstrap, "enable.idempotence": True, "compression.type": "zstd"}
    )
    producer.produce("cross", key=b"k2", value="from confluent é".encode(), partition=0)
    assert producer.flush(10) == 0
    kp = kafka.KafkaProducer(bootstrap_servers=appliance.bootstrap)
    kp.send("cross", key=b"k3", value=b"from kafka-python", partition=0).get(10)
    kp.close()
    with Producer({"appliance.data.dir": str(appliance.data_dir)}) as ours:
        ours.send("cross", b"from appliance.Producer", key=b"k4", partition=0).get(10)
    expected = [
        (0, b"k1", b"from kcat"),
        (1, b"k2", "from confluent é".encode()),
        (2, b"k3", b"from kafka-python"),
        (3, b"k4", b"from appliance.Producer"),
    ]
    for settings in (
        {"bootstrap.servers": appliance.bootstrap},
        {"appliance.data.dir": str(appliance.data_dir)},
    ):
        with Consumer({**settings, "auto.offset.reset": "earliest"}) as consumer:
            consumer.assign([("cross", 0)])
            got: list[Any] = []
            deadline = time.monotonic() + 10
            while len(got) < len(expected) and time.monotonic() < deadline:
                got += consumer.poll(timeout_ms=200)
        assert [(r.offset, r.key, r.value) for r in got] == expected, settings
    rows = kcat_consume(appliance.bootstrap, "cross", 0, 4)
    assert [(o, k.encode(), v.encode()) for o, k, v in rows] == expected
