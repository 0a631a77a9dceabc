"""Every codec Kafka clients write, end to end against a running ``appliance serve``: batches that
confluent-kafka and kafka-python compress with gzip, snappy, lz4 and zstd (small and large batches, headers,
null keys) read back identically through the Consumer's local (mmap) and TCP paths and through
``appliance dump-log --print-records``; what our Producer compresses with each codec, the Kafka clients read
identically; and a batch whose CRC is valid but whose compressed records are garbage is a clear error on both
paths (naming the partition, the offsets and the codec), never an empty read."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.codec_batches import (
    CODECS,
    Sent,
    as_sent,
    codecs_on_disk,
    confluent_producer,
    garbage_batch,
    log_records,
    produce_confluent,
    produce_kafka_python,
    send_batch,
)
from support.consumer_fixtures import RunningAppliance, start_appliance

from appliance.client.consumer import Consumer, ConsumerRecord, TopicPartition
from appliance.server.faults import UNREAD_RECORDS
from storage.compression import CODECS_BY_NAME
from storage.errors import CorruptRecordError

pytestmark = pytest.mark.slow

APPLIANCE = str(Path(sys.executable).with_name("appliance"))
PARTITION = {codec: i for i, codec in enumerate(CODECS)}  # each codec has a partition of each topic
SMALL, LARGE = 40, 600  # records sent one batch at a time / lingering into a few large batches


@pytest.fixture(scope="module")
def appliance(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningAppliance]:
    # The writers trust a CreateTime batch's header (the seam ``writer.unread_records``), so the garbage
    # batches below reach the log, as bytes written by an older writer or copied in from elsewhere would: a
    # producer's garbage is refused CORRUPT_MESSAGE at the append (tests/storage/test_timestamp_rules.py).
    running = start_appliance(tmp_path_factory.mktemp("codecs"),
                              {"confluent": 4, "kafka-python": 4, "own": 4, "bad": 4},
                              faults=[UNREAD_RECORDS])
    try:
        yield running
    finally:
        running.stop()
    assert "Traceback" not in running.log_text(), running.log_text()


def consumer(appliance: RunningAppliance, path: str) -> Consumer:
    where: dict[str, object] = ({"bootstrap.servers": appliance.bootstrap} if path == "tcp"
                                else {"appliance.data.dir": appliance.data_dir})
    return Consumer({**where, "auto.offset.reset": "earliest"})


def read(appliance: RunningAppliance, path: str, tp: TopicPartition, count: int) -> list[ConsumerRecord]:
    with consumer(appliance, path) as c:
        c.assign([tp])
        got: list[ConsumerRecord] = []
        deadline = time.monotonic() + 30
        while len(got) < count and time.monotonic() < deadline:
            got += c.poll(timeout_ms=300, max_records=10_000)
        assert c.poll(timeout_ms=100) == []
    return got


def dump_log_records(partition_dir: Path) -> list[tuple[int, Sent]]:
    """(offset, record) of every ``| offset:`` line ``appliance dump-log --print-records`` prints."""
    segments = sorted(str(p) for p in partition_dir.glob("*.log"))
    result = subprocess.run([APPLIANCE, "dump-log", "--print-records", "--max-bytes", "0", *segments],
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    out = []
    for line in result.stdout.splitlines():
        if not line.startswith("| offset: "):
            continue
        offset = int(line.split()[2])
        key = json.loads(line[line.index(" key: ") + 6 : line.index(" value: ")])
        value = json.loads(line[line.index(" value: ") + 8 : line.index(" headers: ")])
        headers = json.loads(line[line.index(" headers: ") + 10 :])
        out.append((offset, Sent(None if key is None else key.encode(), value.encode(),
                                 tuple((k, None if v is None else v.encode()) for k, v in headers.items()))))
    return out


Producing = Callable[..., None]


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("client", ["confluent", "kafka-python"])
def test_kafka_clients_batches_of_each_codec_read_back_identically_everywhere(
    appliance: RunningAppliance, client: str, codec: str
) -> None:
    send: Producing = produce_confluent if client == "confluent" else produce_kafka_python
    tp = TopicPartition(client, PARTITION[codec])
    small = log_records(SMALL, large=False, tag=f"{client}-{codec}-small")
    large = log_records(LARGE, large=True, tag=f"{client}-{codec}-large")
    # small batches of a few records each (one flush each), from one producer
    send(appliance.bootstrap, tp.topic, codec, small, linger_ms=0, partition=tp.partition, flush_every=4)
    send(appliance.bootstrap, tp.topic, codec, large, linger_ms=200, partition=tp.partition)
    directory = Path(appliance.data_dir) / f"{tp.topic}-{tp.partition}"
    # the client compressed with that codec (kafka-python leaves a batch that would grow uncompressed)
    assert CODECS_BY_NAME[codec] in codecs_on_disk(directory) <= {0, CODECS_BY_NAME[codec]}
    sent = small + large
    over_tcp = read(appliance, "tcp", tp, len(sent))
    through_mmap = read(appliance, "local", tp, len(sent))
    assert over_tcp == through_mmap
    assert as_sent(over_tcp) == sent
    assert [r.offset for r in over_tcp] == list(range(len(sent)))
    assert dump_log_records(directory) == list(enumerate(sent))


@pytest.mark.parametrize("codec", CODECS)
def test_what_our_producer_writes_with_each_codec_kafka_clients_read_identically(
    appliance: RunningAppliance, codec: str
) -> None:
    from appliance.client.producer import Producer

    tp = TopicPartition("own", PARTITION[codec])
    sent = log_records(300, large=True, tag=f"own-{codec}") + log_records(300, large=False, tag=codec)
    with Producer({"appliance.data.dir": appliance.data_dir, "compression.type": codec,
                   "linger.ms": 20}) as producer:
        for r in sent:
            producer.send(tp.topic, r.value, key=r.key, headers=list(r.headers), partition=tp.partition)
        producer.flush()
    assert codecs_on_disk(Path(appliance.data_dir) / f"own-{tp.partition}") == {CODECS_BY_NAME[codec]}
    ours = read(appliance, "local", tp, len(sent))
    assert read(appliance, "tcp", tp, len(sent)) == ours
    assert as_sent(ours) == sent
    expected = [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in ours]
    assert _confluent_read(appliance, tp, len(sent)) == expected
    assert _kafka_python_read(appliance, tp, len(sent)) == expected


def _confluent_read(appliance: RunningAppliance, tp: TopicPartition, count: int) -> list[Any]:
    import confluent_kafka

    c = confluent_kafka.Consumer({"bootstrap.servers": appliance.bootstrap, "group.id": "unused",
                                  "enable.auto.commit": False})
    c.assign([confluent_kafka.TopicPartition(tp.topic, tp.partition, confluent_kafka.OFFSET_BEGINNING)])
    rows: list[Any] = []
    deadline = time.monotonic() + 30
    while len(rows) < count and time.monotonic() < deadline:
        for msg in c.consume(num_messages=1000, timeout=0.5):
            assert msg.error() is None, msg.error()
            rows.append((msg.offset(), msg.timestamp()[1], msg.key(), msg.value(),
                         tuple(msg.headers() or ())))
    c.close()
    return rows


def _kafka_python_read(appliance: RunningAppliance, tp: TopicPartition, count: int) -> list[Any]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from kafka import KafkaConsumer
        from kafka import TopicPartition as KafkaTopicPartition

        c = KafkaConsumer(bootstrap_servers=appliance.bootstrap, enable_auto_commit=False,
                          max_partition_fetch_bytes=8 << 20)
    c.assign([KafkaTopicPartition(tp.topic, tp.partition)])
    c.seek_to_beginning()
    rows: list[Any] = []
    deadline = time.monotonic() + 30
    while len(rows) < count and time.monotonic() < deadline:
        for records in c.poll(timeout_ms=200).values():
            rows += [(r.offset, r.timestamp, r.key, r.value, tuple(r.headers)) for r in records]
    c.close()
    return rows


@pytest.mark.parametrize("codec", CODECS)
def test_a_garbage_payload_under_a_valid_crc_is_a_clear_error_on_both_paths(
    appliance: RunningAppliance, codec: str
) -> None:
    tp = TopicPartition("bad", PARTITION[codec])
    good = log_records(5, large=False, tag="before")
    with confluent_producer(appliance.bootstrap, codec, linger_ms=0) as send:
        send(tp.topic, good, tp.partition)
        garbage = garbage_batch(CODECS_BY_NAME[codec], 3)
        assert send_batch(appliance.bootstrap, tp.topic, tp.partition, garbage) == 5
        send(tp.topic, good, tp.partition)
    expected = (rf"^partition bad-{tp.partition} .*record batch at position \d+ \(offsets 5\.\.7\): "
                rf"not valid {codec} data: .*; the records cannot be read: seek to offset 8 to skip this "
                rf"batch$")
    for path in ("local", "tcp"):
        with consumer(appliance, path) as c:
            c.assign([tp])
            before: list[ConsumerRecord] = []
            with pytest.raises(CorruptRecordError, match=expected):  # the records before it, then the error
                deadline = time.monotonic() + 20
                while time.monotonic() < deadline:
                    before += c.poll(timeout_ms=300)
            assert as_sent(before) == good
            with pytest.raises(CorruptRecordError, match=expected):  # again: never skipped silently
                c.poll(timeout_ms=300)
            c.seek(tp, 8)  # what the message says to do
            after: list[ConsumerRecord] = []
            deadline = time.monotonic() + 20
            while len(after) < len(good) and time.monotonic() < deadline:
                after += c.poll(timeout_ms=300)
            assert [r.offset for r in after] == list(range(8, 13)) and as_sent(after) == good
    result = subprocess.run([APPLIANCE, "consume", tp.topic, "--partition", str(tp.partition),
                             "--data-dir", appliance.data_dir, "--from-beginning", "--timeout-ms", "3000"],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 1
    assert f"not valid {codec} data" in result.stderr and "seek to offset 8" in result.stderr
    assert "Processed a total of 5 messages" in result.stderr
