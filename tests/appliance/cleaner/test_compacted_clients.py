"""Real clients read a compacted partition, gaps and all, from a running ``appliance serve``.

The cleaner process rewrites the closed segments of a topic with ``cleanup.policy=compact``: superseded
records disappear and the survivors keep their offsets.  kafka-python, kcat and the local ``Consumer`` each
read the partition from the start and see the same records: every key's latest value, each at the offset it
was produced at, in offset order, with gaps where superseded records were.
"""

from __future__ import annotations

import itertools
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import confluent_kafka
import pytest
from support.kafka_appliance import KCAT, Appliance, served_appliance

from appliance.client.consumer import Consumer
from ipc.kafka import ErrorCode, FetchPartition, FetchRequest, FetchResponse, FetchTopic
from ipc.kafka_client import KafkaConnection
from storage.batch_header import parse_header
from storage.segment_file import split_batches

TOPIC = "compacted"
KEYS = 10
RECORDS = 300

_CONFIG = f"""
"log.cleaner.backoff.ms" = 100
[topics.{TOPIC}]
partitions = 1
"cleanup.policy" = "compact"
"segment.bytes" = 1024
"min.cleanable.dirty.ratio" = 0.01
"""


class Produced:
    """What was produced: (offset, key, value) in offset order."""

    def __init__(self, rows: list[tuple[int, str, str]]) -> None:
        self.rows = rows
        self.by_offset = {offset: (key, value) for offset, key, value in rows}
        self.latest = {key: (offset, value) for offset, key, value in rows}


@pytest.fixture(scope="module")
def appliance(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Appliance]:
    tmp: Path = tmp_path_factory.mktemp("compacted")
    yield from served_appliance(tmp, {}, extra=_CONFIG)


@pytest.fixture(scope="module")
def produced(appliance: Appliance) -> Produced:
    settings = {"bootstrap.servers": appliance.bootstrap, "linger.ms": 0, "acks": "all"}
    producer = confluent_kafka.Producer(settings)
    rows: list[tuple[int, str, str]] = []

    def delivered(error: Any, message: Any) -> None:
        assert error is None, error
        rows.append((message.offset(), message.key().decode(), message.value().decode()))

    for i in range(RECORDS):
        producer.produce(TOPIC, key=f"k{i % KEYS}", value=f"value-{i:04d}-" + "x" * 40, partition=0,
                         on_delivery=delivered)
        producer.flush(30)
    assert len(rows) == RECORDS
    result = Produced(sorted(rows))
    _wait_for_clean(appliance)
    return result


def kafka_python_rows(appliance: Appliance) -> list[tuple[int, str, str]]:
    with warnings.catch_warnings():  # kafka-python reads its schemas with a deprecated importlib call
        warnings.simplefilter("ignore", DeprecationWarning)
        from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=appliance.bootstrap, enable_auto_commit=False,
                             auto_offset_reset="earliest")
    try:
        tp = TopicPartition(TOPIC, 0)
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        end = consumer.end_offsets([tp])[tp]
        rows: list[tuple[int, str, str]] = []
        deadline = time.monotonic() + 30
        while consumer.position(tp) < end and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=200).values():
                rows += [(r.offset, r.key.decode(), r.value.decode()) for r in records]
        return rows
    finally:
        consumer.close()


def _wait_for_clean(appliance: Appliance) -> None:
    """Until the cleaner has removed superseded records from the start of the log."""
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if len(kafka_python_rows(appliance)) < RECORDS // 2:
            return
        time.sleep(0.5)
    raise AssertionError(f"the cleaner did not clean {TOPIC} in 90 s:\n{appliance.log_text()[-4000:]}")


def check_compacted(rows: list[tuple[int, str, str]], produced: Produced) -> None:
    offsets = [offset for offset, _, _ in rows]
    assert offsets == sorted(set(offsets)), "offsets must increase"
    assert len(rows) < RECORDS, "superseded records must be gone"
    assert any(b - a > 1 for a, b in itertools.pairwise(offsets)) or offsets[0] > 0, "no gaps"
    for offset, key, value in rows:
        assert produced.by_offset[offset] == (key, value), f"offset {offset} changed"
    seen = {key: (offset, value) for offset, key, value in rows}
    assert seen == produced.latest, "every key's latest value, at its own offset"


def test_kafka_python_reads_the_compacted_partition(appliance: Appliance, produced: Produced) -> None:
    check_compacted(kafka_python_rows(appliance), produced)


@pytest.mark.skipif(KCAT is None, reason="kcat is not installed (make install provisions it)")
def test_kcat_reads_the_compacted_partition(appliance: Appliance, produced: Produced) -> None:
    import subprocess

    assert KCAT is not None
    out = subprocess.run(
        [KCAT, "-b", appliance.bootstrap, "-C", "-t", TOPIC, "-p", "0", "-o", "beginning", "-e", "-q",
         "-f", "%o\t%k\t%s\n"], capture_output=True, timeout=60, check=True).stdout.decode()
    rows = [(int(o), k, v) for o, k, v in (line.split("\t") for line in out.splitlines())]
    check_compacted(rows, produced)


@pytest.mark.parametrize("where", ["remote", "local"])
def test_local_consumer_reads_the_compacted_partition(appliance: Appliance, produced: Produced,
                                                      where: str) -> None:
    config = ({"bootstrap.servers": appliance.bootstrap} if where == "remote"
              else {"log.dirs": str(appliance.data_dir)})
    with Consumer({**config, "auto.offset.reset": "earliest"}) as consumer:
        consumer.assign([(TOPIC, 0)])
        end = consumer.end_offsets([(TOPIC, 0)])
        stop = next(iter(end.values()))
        rows: list[tuple[int, str, str]] = []
        started = time.monotonic()
        moves = [(0.0, consumer.position((TOPIC, 0)))]  # (seconds, position) each time the position moved
        while moves[-1][1] < stop and time.monotonic() < started + 30:
            rows += [(r.offset, r.key.decode(), r.value.decode()) for r in consumer.poll(200)]
            position = consumer.position((TOPIC, 0))
            if position != moves[-1][1]:
                moves.append((round(time.monotonic() - started, 2), position))
    still = time.monotonic() - started - moves[-1][0]
    assert moves[-1][1] >= stop, (f"the consumer stopped at offset {moves[-1][1]} of {stop} for {still:.1f} "
                                  f"s; its positions: {moves}; rows {[o for o, _, _ in rows]}")
    check_compacted(rows, produced)


def _fetch_batches(connection: KafkaConnection, offset: int) -> tuple[int, list[tuple[int, int]]]:
    """One Fetch at ``offset`` answered at once: its error code and each batch's (base, last) offsets."""
    response = connection.request(FetchRequest(
        replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20, isolation_level=0, session_id=0,
        session_epoch=-1, topics=[FetchTopic(topic=TOPIC, partitions=[FetchPartition(
            partition=0, fetch_offset=offset, log_start_offset=-1, partition_max_bytes=1 << 20)])]))
    assert isinstance(response, FetchResponse)
    part = response.responses[0].partitions[0]
    batches = [parse_header(batch) for batch in split_batches(bytes(part.records or b""))]
    return part.error_code, [(b.base_offset, b.last_offset) for b in batches]


def test_a_fetch_at_every_offset_starts_at_the_first_batch_reaching_it(appliance: Appliance,
                                                                       produced: Produced) -> None:
    """Kafka's contract, gaps included, while the cleaner may still be swapping: a Fetch at any offset below
    the high watermark answers records at once, from the first batch whose last offset reaches it, and no
    key's latest record between the offset and that batch is skipped."""
    latest = sorted(offset for offset, _ in produced.latest.values())
    host, port = appliance.bootstrap.rsplit(":", 1)
    with KafkaConnection(host, int(port), client_id="gap-fetch") as connection:
        for offset in range(RECORDS):
            code, batches = _fetch_batches(connection, offset)
            assert code == ErrorCode.NONE, f"fetch at {offset}: error {code}"
            assert batches, f"fetch at {offset}: no records below the high watermark {RECORDS}"
            base, last = batches[0]
            assert last >= offset, f"fetch at {offset}: its first batch [{base}, {last}] ends before it"
            skipped = [o for o in latest if offset <= o < base]
            assert not skipped, f"fetch at {offset}: its first batch starts at {base}, past {skipped}"
