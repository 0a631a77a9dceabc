"""The Spark source reads a compacted partition, gaps and all: the rows the local Consumer reads, each key's
latest value at the offset it was produced at."""

from __future__ import annotations

import time
from typing import Any

import pytest

from appliance.client.consumer import Consumer
from appliance.client.producer import Producer

pytestmark = pytest.mark.slow

TOPIC = "compacted"
RECORDS = 600
KEYS = 20


def consumer_rows(appliance: Any) -> list[tuple[int, bytes, bytes]]:
    with Consumer({"bootstrap.servers": appliance.bootstrap, "auto.offset.reset": "earliest"}) as consumer:
        consumer.assign([(TOPIC, 0)])
        stop = next(iter(consumer.end_offsets([(TOPIC, 0)]).values()))
        rows: list[tuple[int, bytes, bytes]] = []
        deadline = time.monotonic() + 30
        while consumer.position((TOPIC, 0)) < stop and time.monotonic() < deadline:
            rows += [(r.offset, r.key, r.value) for r in consumer.poll(200)]
    return rows


def test_spark_reads_a_compacted_partition_with_its_gaps(spark: Any, appliance: Any) -> None:
    produced: dict[int, tuple[bytes, bytes]] = {}
    with Producer({"bootstrap.servers": appliance.bootstrap}) as producer:
        for start in range(0, RECORDS, KEYS):  # one batch of every key at a time: segments roll as it goes
            keys = [b"k%d" % (i % KEYS) for i in range(start, start + KEYS)]
            values = [b"value %d " % i + b"x" * 40 for i in range(start, start + KEYS)]
            placed = producer.send_many(TOPIC, values, keys=keys, partition=0).get()
            produced.update(zip(placed.offsets, zip(keys, values, strict=True), strict=True))
    latest = {key: (offset, value) for offset, (key, value) in sorted(produced.items())}
    deadline = time.monotonic() + 90
    while len(rows := consumer_rows(appliance)) > RECORDS // 2:
        assert time.monotonic() < deadline, f"{TOPIC} not cleaned in 90 s"
        time.sleep(0.5)
    frame = spark.read.format("appliance").option("bootstrap.servers", appliance.bootstrap) \
        .option("subscribe", TOPIC).load()
    read = sorted((r.offset, bytes(r.key), bytes(r.value)) for r in frame.collect())
    # the cleaner may clean more between the two reads: Spark reads at most what the Consumer read
    assert set(read) <= set(rows) and len(read) < RECORDS, "Spark reads the compacted partition"
    assert all(produced[offset] == (key, value) for offset, key, value in read), "offsets kept"
    assert {key: (offset, value) for offset, key, value in read} == latest
