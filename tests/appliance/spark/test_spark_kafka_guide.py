"""Code written for Spark's Kafka source runs against the appliance with one line changed.

The jobs below are written as the Structured Streaming + Kafka Integration Guide writes its examples -- its
option names and values (``kafka.bootstrap.servers``, ``subscribe`` of ``topic1,topic2``, its offset JSON,
``subscribePattern`` ``topic.*``, ``includeHeaders``), its ``selectExpr`` casts, its sink -- with
``format("kafka")`` replaced by ``format("appliance")`` and the guide's ``host1:port1`` by the appliance's
address (and a batch write's mode made explicit, ``mode("append")``: Spark takes no other default from a
Python data source); a real ``local[2]`` session reads and writes a real ``appliance serve``, and the rows
equal a plain-Python computation over the records produced.  Bad input is refused while Spark plans the query,
naming the option.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from support.spark_planning import planning_error

from appliance.client.consumer import Consumer
from appliance.client.producer import Producer

pytestmark = pytest.mark.slow

FORMAT = "appliance"  # the one changed line: Spark's Kafka source is format("kafka")

Record = tuple[str, int, int, str | None, str, tuple[tuple[str, bytes], ...]]  # topic, partition, offset,...


def produce(appliance: Any, topic: str, partitions: int, count: int, tag: str) -> list[Record]:
    """``count`` records per partition (some keys null, a header on every third); what they became."""
    out: list[Record] = []
    with Producer({"bootstrap.servers": appliance.bootstrap}) as producer:
        for partition in range(partitions):
            values = [f"{tag}-{topic}-{partition}-{i}".encode() for i in range(count)]
            keys = [None if i % 5 == 0 else f"k{i % 7}".encode() for i in range(count)]
            headers = [[("n", str(i).encode())] if i % 3 == 0 else [] for i in range(count)]
            placed = producer.send_many(topic, values, keys=keys, headers=headers, partition=partition).get()
            for i, key in enumerate(keys):
                out.append((topic, partition, int(placed.offsets[i]), None if key is None else key.decode(),
                            values[i].decode(), tuple((k, v) for k, v in headers[i])))
    return out


def test_a_batch_job_written_for_spark_kafka_source_reads_the_same_rows(spark: Any, appliance: Any) -> None:
    records = produce(appliance, "topic1", 2, 80, "batch") + produce(appliance, "topic2", 1, 40, "batch")
    bootstrap = appliance.bootstrap  # the guide's "host1:port1,host2:port2"

    # Subscribe to multiple topics, specifying explicit Kafka offsets (the guide's values)
    df = spark \
        .read \
        .format(FORMAT) \
        .option("kafka.bootstrap.servers", bootstrap) \
        .option("subscribe", "topic1,topic2") \
        .option("startingOffsets", """{"topic1":{"0":23,"1":-2},"topic2":{"0":-2}}""") \
        .option("endingOffsets", """{"topic1":{"0":50,"1":-1},"topic2":{"0":-1}}""") \
        .load()
    rows = df.selectExpr("CAST(key AS STRING)", "CAST(value AS STRING)").collect()
    expected = [(r[3], r[4]) for r in records
                if (r[0], r[1]) != ("topic1", 0) or 23 <= r[2] < 50]
    assert Counter((r.key, r.value) for r in rows) == Counter(expected)
    assert df.columns == ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType"]

    # Subscribe to a pattern, at the earliest and latest offsets
    df = spark \
        .read \
        .format(FORMAT) \
        .option("kafka.bootstrap.servers", bootstrap) \
        .option("subscribePattern", "topic.*") \
        .option("startingOffsets", "earliest") \
        .option("endingOffsets", "latest") \
        .load()
    rows = df.selectExpr("topic", "partition", "offset", "CAST(key AS STRING)", "CAST(value AS STRING)")
    assert sorted(tuple(r) for r in rows.collect()) == sorted(r[:5] for r in records)

    # Write key-value data from a DataFrame to a specific Kafka topic specified in an option; a batch write
    # needs mode("append"): Spark refuses its default mode (ErrorIfExists) for every Python data source
    with pytest.raises(Exception, match="UNSUPPORTED_DATA_SOURCE_SAVE_MODE"):
        df.selectExpr("value").write.format(FORMAT).option("kafka.bootstrap.servers", bootstrap) \
            .option("topic", "guide-out").save()
    df.selectExpr("CAST(key AS STRING)", "CAST(value AS STRING)") \
        .write \
        .format(FORMAT) \
        .option("kafka.bootstrap.servers", bootstrap) \
        .option("topic", "guide-out") \
        .mode("append") \
        .save()
    copied = spark.read.format(FORMAT).option("kafka.bootstrap.servers", bootstrap) \
        .option("subscribe", "guide-out").load().selectExpr("CAST(key AS STRING)", "CAST(value AS STRING)")
    assert Counter(tuple(r) for r in copied.collect()) == Counter((r[3], r[4]) for r in records)


def test_a_streaming_job_written_for_spark_kafka_source_delivers_the_same_rows(spark: Any, appliance: Any,
                                                                              tmp_path: Path) -> None:
    bootstrap = appliance.bootstrap
    before = produce(appliance, "topic3", 2, 30, "before")  # a stream starts at latest: never read

    # Subscribe to 1 topic, with headers
    df = spark \
        .readStream \
        .format(FORMAT) \
        .option("kafka.bootstrap.servers", bootstrap) \
        .option("subscribe", "topic3") \
        .option("includeHeaders", "true") \
        .load()
    seen: list[tuple[Any, ...]] = []
    echo = df.selectExpr("CAST(key AS STRING)", "CAST(value AS STRING)", "headers") \
        .writeStream \
        .foreachBatch(lambda batch, _: seen.extend(tuple(r) for r in batch.collect())) \
        .option("checkpointLocation", str(tmp_path / "echo")) \
        .start()
    # Write key-value data from a DataFrame to a specific Kafka topic specified in an option
    ds = df \
        .selectExpr("CAST(key AS STRING)", "CAST(value AS STRING)") \
        .writeStream \
        .format(FORMAT) \
        .option("kafka.bootstrap.servers", bootstrap) \
        .option("topic", "guide-stream-out") \
        .option("checkpointLocation", str(tmp_path / "sink")) \
        .start()
    try:
        for query in (echo, ds):  # the first trigger has run: the starting offsets (latest) are fixed
            deadline = time.monotonic() + 60
            while "Waiting for" not in query.status["message"] or query.status["isTriggerActive"]:
                assert query.isActive and time.monotonic() < deadline, (query.exception(), query.status)
                time.sleep(0.1)
        after = produce(appliance, "topic3", 2, 50, "after")
        expected = Counter((r[3], r[4]) for r in after)
        deadline = time.monotonic() + 90
        while Counter(r[:2] for r in seen) != expected or sink_rows(appliance) != expected:
            assert time.monotonic() < deadline, (len(seen), echo.exception(), ds.exception())
            time.sleep(0.2)
        headers = {(r[0], r[1]): tuple((h.key, bytes(h.value)) for h in r[2]) for r in seen}
        assert headers == {(r[3], r[4]): r[5] for r in after}
        assert not set(headers) & {(r[3], r[4]) for r in before}
    finally:
        echo.stop()
        ds.stop()


def sink_rows(appliance: Any) -> Counter[tuple[str | None, str]]:
    out: Counter[tuple[str | None, str]] = Counter()
    with Consumer({"bootstrap.servers": appliance.bootstrap, "auto.offset.reset": "earliest"}) as consumer:
        tps = [("guide-stream-out", 0), ("guide-stream-out", 1)]
        ends = consumer.end_offsets(tps)
        consumer.assign(tps)
        deadline = time.monotonic() + 10
        while sum(out.values()) < sum(ends.values()) and time.monotonic() < deadline:
            for record in consumer.poll(timeout_ms=200, max_records=10_000):
                assert record.value is not None
                out[(None if record.key is None else record.key.decode(), record.value.decode())] += 1
    return out


def test_include_headers_decides_the_headers_column(spark: Any, appliance: Any) -> None:
    records = produce(appliance, "headers", 1, 12, "h")

    def read(**options: str) -> Any:
        frame = spark.read.format(FORMAT).option("kafka.bootstrap.servers", appliance.bootstrap) \
            .option("subscribe", "headers")
        for key, value in options.items():
            frame = frame.option(key, value)
        return frame.load()

    spark_types = [("key", "binary"), ("value", "binary"), ("topic", "string"), ("partition", "int"),
                   ("offset", "bigint"), ("timestamp", "timestamp"), ("timestampType", "int")]
    without = read()
    assert without.dtypes == spark_types == read(includeHeaders="false").dtypes
    assert len(without.collect()) == 12
    with_headers = read(includeHeaders="true")
    assert with_headers.dtypes == [*spark_types, ("headers", "array<struct<key:string,value:binary>>")]
    ordered = with_headers.orderBy("offset").collect()
    got = [tuple((h.key, bytes(h.value)) for h in r.headers) for r in ordered]
    assert got == [r[5] for r in records]
    streamed = spark.readStream.format(FORMAT).option("kafka.bootstrap.servers", appliance.bootstrap) \
        .option("subscribe", "headers").load()
    assert streamed.dtypes == spark_types


def test_bad_input_is_an_error_at_planning_time_naming_the_option(spark: Any, appliance: Any) -> None:
    def batch(**options: str) -> Any:
        frame = spark.read.format(FORMAT).option("kafka.bootstrap.servers", appliance.bootstrap)
        for key, value in options.items():
            frame = frame.option(key, value)
        return frame.load().collect()

    def stream(**options: str) -> Any:
        frame = spark.readStream.format(FORMAT).option("kafka.bootstrap.servers", appliance.bootstrap)
        for key, value in options.items():
            frame = frame.option(key, value)
        return frame.load().writeStream.format("noop").start().awaitTermination(60)

    cases = [  # the first three through a stream too
        ({"subscribe": "topic1", "startingOffsets": """{"topic1":{"0":23,"1":-2}"""},
         "option startingOffsets: '{\"topic1\":{\"0\":23,\"1\":-2}' is not earliest, latest or valid JSON"),
        ({"subscribe": "topic1", "startingTimestamp": "1000", "startingOffsetsByTimestampStrategy": "first"},
         "option startingOffsetsByTimestampStrategy='first': expected one of error, latest"),
        ({"subscribe": "topic1", "assign": """{"topic1":[0,1]}"""},
         "only one of the options assign, subscribe, subscribePattern can be set; got assign and subscribe"),
        ({"subscribe": "topic1", "startingOffsetsByTimestamp": """{"topic1":{"0":1000}"""},
         "option startingOffsetsByTimestamp: '{\"topic1\":{\"0\":1000}' is not valid JSON"),
        ({"assign": """{"topic1":[0,7]}"""}, "option assign: topic 'topic1' has no partition 7"),
        ({"subscribe": "topic1", "kafka.auto.offset.reset": "earliest"},
         "'kafka.auto.offset.reset' is not supported"),
    ]
    for number, (options, expected) in enumerate(cases):
        for action in (batch, stream) if number < 3 else (batch,):
            message = planning_error(lambda action=action, options=options: action(**options))
            assert expected in message, (options, message)
    # writes: the sink's column rules, before any row is sent
    frame = spark.createDataFrame([(1, "v")], "partition BIGINT, value STRING")
    message = planning_error(lambda: frame.write.format(FORMAT).option("kafka.bootstrap.servers",
                                                                       appliance.bootstrap)
                             .option("topic", "guide-out").mode("append").save())
    assert "partition attribute unsupported type bigint; partition must be a(n) int" in message
    nulls = spark.createDataFrame([(None, "v")], "topic STRING, value STRING")
    with pytest.raises(Exception, match="a null topic is present in the data; use the topic option"):
        nulls.write.format(FORMAT).option("kafka.bootstrap.servers", appliance.bootstrap).mode("append") \
            .save()
