"""Batch reads and writes through ``format("appliance")`` on a real local[2] SparkSession against a real
``appliance serve``: what was produced comes back exactly (keys, values, headers, timestamps, offsets,
several partitions, zstd), and bad input is refused while Spark plans the query, on the driver."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest
from support.spark_planning import planning_error

from appliance.client.consumer import Consumer
from appliance.client.producer import Producer

pytestmark = pytest.mark.slow

Row = tuple[int, int, bytes | None, bytes | None, int, tuple[tuple[str, bytes | None], ...]]


def reader(spark: Any, appliance: Any, **options: str) -> Any:
    read = (spark.read.format("appliance").option("bootstrap.servers", appliance.bootstrap)
            .option("includeHeaders", "true"))
    for key, value in options.items():
        read = read.option(key, value)
    return read.load()


def as_rows(frame: Any) -> list[Row]:
    out = []
    for r in frame.selectExpr("*", "unix_millis(timestamp) AS timestamp_ms").collect():
        stamp_ms = r.timestamp_ms
        headers = tuple((h.key, None if h.value is None else bytes(h.value)) for h in r.headers)
        key = None if r.key is None else bytes(r.key)
        value = None if r.value is None else bytes(r.value)
        assert r.topic and r.timestampType == 0
        out.append((r.partition, r.offset, key, value, stamp_ms, headers))
    return sorted(out, key=lambda row: (row[0], row[1]))


def produce(appliance: Any, topic: str, partitions: int, count: int, **settings: Any) -> list[Row]:
    """Records with null and non-null keys and values, headers (one with a null value), explicit
    timestamps; where each landed, from the producer's acknowledgements."""
    sent: list[Row] = []
    config = {"bootstrap.servers": appliance.bootstrap, "batch.size": 8192, **settings}
    with Producer(config) as producer:
        for partition in range(partitions):
            keys = [None if i % 7 == 0 else b"key-%d" % (i % 40) for i in range(count)]
            values = [None if i % 11 == 5 else b"value %d of %d" % (i, partition) for i in range(count)]
            headers = [[("n", b"%d" % i), ("null", None)] if i % 3 == 0 else [] for i in range(count)]
            stamps = [1_700_000_000_000 + 1000 * i + partition for i in range(count)]
            placed = producer.send_many(topic, values, keys=keys, headers=headers, timestamps=stamps,
                                        partition=partition).get()
            assert placed.offsets[0] == 0
            for i in range(count):
                sent.append((partition, i, keys[i], values[i], stamps[i],
                             tuple((name, value) for name, value in headers[i])))
    return sent


def test_batch_read_returns_exactly_what_was_produced(spark: Any, appliance: Any) -> None:
    sent = produce(appliance, "batch-read", 3, 1500)
    frame = reader(spark, appliance, subscribe="batch-read", maxRecordsPerPartition="400")
    assert frame.rdd.getNumPartitions() == 12  # 3 partitions of 1500 records, cut into 4 tasks each
    assert as_rows(frame) == sent
    # offset ranges: a JSON map for some partitions, the defaults (earliest, latest) for the others
    ranged = reader(spark, appliance, subscribe="batch-read", startingOffsets='{"batch-read": {"1": 100}}',
                    endingOffsets='{"batch-read": {"1": 250, "2": 10}}', minPartitions="7")
    assert as_rows(ranged) == [r for r in sent if r[0] == 0 or (r[0] == 1 and 100 <= r[1] < 250)
                               or (r[0] == 2 and r[1] < 10)]


def test_zstd_batches_read_back_and_spark_writes_back(spark: Any, appliance: Any) -> None:
    sent = produce(appliance, "batch-zstd", 2, 800, **{"compression.type": "zstd"})
    frame = reader(spark, appliance, subscribe="batch-zstd")
    assert as_rows(frame) == sent
    # the batch writer: key, value, headers, topic and partition columns, through the producer over TCP
    columns = frame.selectExpr("key", "value", "headers", "partition", "'write-out' AS topic")
    (columns.write.format("appliance").option("bootstrap.servers", appliance.bootstrap)
     .option("compression.type", "zstd").mode("append").save())
    copied = as_rows(reader(spark, appliance, subscribe="write-out"))

    def contents(rows: list[Row], partition: int) -> list[tuple[Any, ...]]:
        return [(k, v, h) for p, _, k, v, _, h in rows if p == partition]

    assert all(contents(sent, p) == contents(copied, p) for p in (0, 1))  # same records, same order
    with pytest.raises(Exception, match=r"mode\('overwrite'\) cannot be honoured"):
        (frame.select("value").write.format("appliance").option("bootstrap.servers", appliance.bootstrap)
         .option("topic", "write-out").mode("overwrite").save())


def test_bad_input_is_refused_at_planning_time(spark: Any, appliance: Any) -> None:
    """Through Spark, one case of each kind; every other option error is in test_spark_options."""
    produce(appliance, "bad-input", 2, 50)
    cases = [  # an unknown topic, malformed JSON (at load()), offsets out of range
        ({"subscribe": "no-such-topic"}, "option subscribe: topic 'no-such-topic' does not exist on the "
         f"appliance at {appliance.bootstrap} (its topics: "),
        ({"subscribe": "bad-input", "startingOffsets": '{"bad-input": {"0": 5'},
         "is not earliest, latest or valid JSON (Expecting ',' delimiter at line 1 column "),
        ({"subscribe": "bad-input", "startingOffsets": '{"bad-input": {"0": 500}}'},
         "option startingOffsets: partition bad-input-0 offset 500 is past the end of the partition (log "
         "start offset 0, high watermark 50)"),
        ({"subscribe": "bad-input", "endingOffsets": '{"bad-input": {"1": 51}}'},
         "option endingOffsets: partition bad-input-1 offset 51 is past the end of the partition"),
    ]
    for options, expected in cases:
        message = planning_error(lambda options=options: reader(spark, appliance, **options).collect())
        assert expected in message, (options, message)
    stream = (spark.readStream.format("appliance").option("bootstrap.servers", appliance.bootstrap)
              .option("subscribe", "bad-input").option("startingOffsets", '{"bad-input": {"1": 99}}'))
    query = stream.load().writeStream.format("noop").start()
    with pytest.raises(Exception) as caught:
        query.awaitTermination(60)
    assert "partition bad-input-1 offset 99 is past the end of the partition" in str(caught.value)
    assert "stage failure" not in str(caught.value)  # the driver's initialOffset, not a task


def test_records_lost_to_retention_fail_or_are_skipped_as_failOnDataLoss_says(spark: Any,
                                                                              appliance: Any) -> None:
    with Producer({"bootstrap.servers": appliance.bootstrap, "batch.size": 1024}) as producer:
        producer.send_many("short-lived", [b"%04d" % i + b"." * 96 for i in range(400)], partition=0).get()
    with Consumer({"bootstrap.servers": appliance.bootstrap}) as consumer:
        deadline = time.monotonic() + 20  # the writer applies retention every 100 ms
        while (start := consumer.beginning_offsets([("short-lived", 0)])[("short-lived", 0)]) == 0:
            assert time.monotonic() < deadline, "retention deleted nothing"
            time.sleep(0.1)
    from_zero = {"subscribe": "short-lived", "startingOffsets": '{"short-lived": {"0": 0}}'}
    message = planning_error(lambda: reader(spark, appliance, **from_zero).collect())
    found = re.search(r"offset 0 is below the log start offset (\d+): records 0\.\.(\d+) were deleted "
                      r"\(retention\); set failOnDataLoss=false to read from (\d+)", message)
    assert found is not None, message
    assert int(found[1]) >= start and int(found[2]) == int(found[1]) - 1 and found[3] == found[1]
    rows = reader(spark, appliance, **from_zero, failOnDataLoss="false").select("offset").collect()
    offsets = sorted(r.offset for r in rows)
    assert offsets[0] >= int(found[1]) and offsets == list(range(offsets[0], 400))
