"""Streaming reads and the exactly-once sink on a real local[2] SparkSession against a real appliance:
a query stopped abruptly and restarted from its checkpoint delivers each record once downstream; micro-batches
replayed after a writing Python worker was SIGKILLed midway, after the driver died before its commit, and
after Spark lost its own commit write each record once; new topics are picked up; admission control caps
the batches."""

from __future__ import annotations

import json
import shutil
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from appliance.client.consumer import Consumer
from appliance.client.producer import Producer
from appliance.spark.commit_log import CommitLog
from appliance.spark.options import DEFAULT_COMMIT_LOG_TOPIC, parse_options
from appliance.spark.writer import SinkCommitMessage, TaskIdentity, commit_batch

pytestmark = pytest.mark.slow


def produce_values(appliance: Any, topic: str, partitions: int, count: int, tag: str) -> list[bytes]:
    values = []
    with Producer({"bootstrap.servers": appliance.bootstrap}) as producer:
        for partition in range(partitions):
            batch = [f"{tag}-{partition}-{i}".encode() for i in range(count)]
            keys = [None if i % 4 == 0 else b"k%d" % (i % 9) for i in range(count)]
            headers = [[("origin", tag.encode())]] * count
            producer.send_many(topic, batch, keys=keys, headers=headers, partition=partition).get()
            values += batch
    return values


def topic_values(appliance: Any, topic: str, partitions: int) -> list[bytes]:
    """Every value in the topic (each partition to its high watermark), offsets checked dense."""
    out = []
    with Consumer({"bootstrap.servers": appliance.bootstrap, "auto.offset.reset": "earliest"}) as consumer:
        tps = [(topic, p) for p in range(partitions)]
        ends = consumer.end_offsets(tps)
        consumer.assign(tps)
        got: dict[int, list[int]] = {p: [] for p in range(partitions)}
        deadline = time.monotonic() + 20
        while sum(map(len, got.values())) < sum(ends.values()) and time.monotonic() < deadline:
            for record in consumer.poll(timeout_ms=200, max_records=10_000):
                got[record.partition].append(record.offset)
                assert record.headers and record.headers[0][0] == "origin"
                out.append(record.value)
    assert all(offsets == list(range(len(offsets))) for offsets in got.values())
    return out


def stream(spark: Any, appliance: Any, topic: str, **options: str) -> Any:
    read = (spark.readStream.format("appliance").option("bootstrap.servers", appliance.bootstrap)
            .option("subscribe", topic).option("startingOffsets", "earliest")
            .option("includeHeaders", "true"))
    for key, value in options.items():
        read = read.option(key, value)
    return read.load().selectExpr("key", "value", "headers")


def sink(frame: Any, appliance: Any, topic: str, checkpoint: Path, **options: str) -> Any:
    write = (frame.writeStream.format("appliance").option("bootstrap.servers", appliance.bootstrap)
             .option("topic", topic).option("checkpointLocation", str(checkpoint)))
    for key, value in options.items():
        write = write.option(key, value)
    return write


def test_a_stream_stopped_abruptly_and_restarted_delivers_each_record_once(spark: Any, appliance: Any,
                                                                         tmp_path: Path) -> None:
    sent = produce_values(appliance, "stream-in", 2, 400, "first")
    checkpoint = tmp_path / "checkpoint"
    query = sink(stream(spark, appliance, "stream-in", maxRecordsPerTrigger="100"), appliance, "stream-out",
                 checkpoint).trigger(processingTime="0 seconds").start()
    with Consumer({"bootstrap.servers": appliance.bootstrap}) as consumer:
        deadline = time.monotonic() + 60
        while sum(consumer.end_offsets([("stream-out", 0), ("stream-out", 1)]).values()) < 200:
            assert time.monotonic() < deadline and query.isActive, query.exception()
            time.sleep(0.05)
    query.stop()  # in the middle of the run: the batch in flight is interrupted
    progress = query.recentProgress
    assert progress and all(p["numInputRows"] <= 100 for p in progress)  # maxRecordsPerTrigger
    assert len(topic_values(appliance, "stream-out", 2)) < 800
    sent += produce_values(appliance, "stream-in", 2, 300, "second")
    restarted = sink(stream(spark, appliance, "stream-in", maxRecordsPerTrigger="800"), appliance,
                     "stream-out", checkpoint).trigger(availableNow=True).start()
    restarted.awaitTermination(120)
    assert restarted.exception() is None
    assert all(p["numInputRows"] <= 800 for p in restarted.recentProgress)
    delivered = topic_values(appliance, "stream-out", 2)
    assert Counter(delivered) == Counter(sent)  # each record exactly once
    assert len(delivered) == 1400


def test_the_sink_writes_exactly_once_across_forced_replays(spark: Any, appliance: Any,
                                                           tmp_path: Path) -> None:
    sent = produce_values(appliance, "replay-in", 2, 250, "replay")  # batches of 200, 200, 100 records
    checkpoint = tmp_path / "checkpoint"

    def run(**options: str) -> Any:
        query = sink(stream(spark, appliance, "replay-in", maxRecordsPerTrigger="200"), appliance,
                     "replay-out", checkpoint, **options).trigger(availableNow=True).start()
        try:
            query.awaitTermination(120)
        except Exception as failed:  # a fault point ended the query
            return failed
        return query

    # 1. the Python worker writing a task of batch 1 is SIGKILLed: half of its rows acknowledged, a quarter
    #    in flight, a quarter never sent (the other task is cancelled wherever it was)
    failed = run(**{"appliance.test.faultPoint": "kill:1"})
    assert "Python worker exited unexpectedly" in str(failed) or "crashed" in str(failed), failed
    before = topic_values(appliance, "replay-out", 3)
    assert len(before) == len(set(before)) and 200 + 50 <= len(before) <= 200 + 150
    partial = len(before) - 200  # what batch 1's killed attempt left
    # 2. batch 1 again: the tasks find their earlier attempts' records and write the rest; batch 2 is written
    #    and then the driver dies before its commit record
    failed = run(**{"appliance.test.faultPoint": "commit:2"})
    assert "fault point commit:2" in str(failed)
    assert Counter(topic_values(appliance, "replay-out", 3)) == Counter(sent)  # every record, once
    # 3. batch 2 again: everything of it is there already, nothing is written
    query = run()
    assert query.exception() is None
    assert Counter(topic_values(appliance, "replay-out", 3)) == Counter(sent)
    # 4. Spark loses the record of its last commit: batch 2 runs again, the sink's commit log has it
    last = checkpoint / "commits" / "2"
    assert last.exists() and not (checkpoint / "commits" / "3").exists()
    last.unlink()
    (checkpoint / "commits" / ".2.crc").unlink(missing_ok=True)
    query = run()
    assert query.exception() is None and (checkpoint / "commits" / "2").exists()
    assert Counter(topic_values(appliance, "replay-out", 3)) == Counter(sent)
    # the driver's commit path called once more for a committed batch appends nothing
    query_id = json.loads((checkpoint / "metadata").read_text())["id"]
    options = parse_options({"bootstrap.servers": appliance.bootstrap, "topic": "replay-out"})
    commit_batch(options, [SinkCommitMessage(TaskIdentity(query_id, 2, 0), -1, 0)], 2)
    log = CommitLog(appliance.bootstrap, DEFAULT_COMMIT_LOG_TOPIC)
    entries = [entry for key, entry in log._backwards() if key == query_id.encode()]
    commits = {e["batch"]: e["records"] for e in entries if e["kind"] == "commit"}
    assert sorted(commits) == [0, 1, 2] and len([e for e in entries if e["kind"] == "commit"]) == 3
    assert commits[0] == 200 and commits[1] == 200 - partial  # batch 1's replay wrote only what was missing
    assert commits[2] == 0  # batch 2's replay wrote nothing
    shutil.rmtree(checkpoint)


def test_new_topics_are_picked_up_and_bytes_per_trigger_cap_batches(spark: Any, appliance: Any,
                                                                   tmp_path: Path) -> None:
    seen: list[tuple[int, list[bytes]]] = []

    def collect(frame: Any, batch_id: int) -> None:
        seen.append((batch_id, [bytes(r.value) for r in frame.select("value").collect()]))

    def run(max_bytes: int) -> None:
        query = (spark.readStream.format("appliance").option("bootstrap.servers", appliance.bootstrap)
                 .option("subscribePattern", "pattern-.*").option("startingOffsets", "earliest")
                 .option("maxBytesPerTrigger", str(max_bytes)).load()
                 .writeStream.foreachBatch(collect).option("checkpointLocation", str(tmp_path / "checkpoint"))
                 .trigger(availableNow=True).start())
        query.awaitTermination(120)
        assert query.exception() is None

    first = produce_values(appliance, "pattern-a", 1, 45, "a")
    run(120)
    assert Counter(v for _, values in seen for v in values) == Counter(first)
    assert len(seen) >= 3  # 45 records of about 8 key and value bytes: about 120 bytes per batch
    seen.clear()
    later = produce_values(appliance, "pattern-b", 1, 60, "b")  # a new topic, created by producing to it
    later += produce_values(appliance, "pattern-a", 1, 20, "a2")
    run(1 << 20)
    assert Counter(v for _, values in seen for v in values) == Counter(later)
