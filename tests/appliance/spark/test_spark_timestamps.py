"""Timestamp options and micro-batch shaping of Spark's Kafka source, on a real ``local[2]`` session against
a real ``appliance serve``.

``startingTimestamp``, ``endingTimestamp`` and the ``*OffsetsByTimestamp`` maps (with
``startingOffsetsByTimestampStrategy``) read the offsets a list oracle computes from records with known,
unordered timestamps: per partition, from the first record whose timestamp is >= the start to the first
whose timestamp is >= the end.  ``minOffsetsPerTrigger`` holds micro-batches back until enough records
wait, ``maxOffsetsPerTrigger`` caps them, and ``maxTriggerDelay`` lets a small one through.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from appliance.client.producer import Producer

pytestmark = pytest.mark.slow

TOPIC = "times"
T0 = 1_700_000_000_000
PER_PARTITION = 30


@pytest.fixture(scope="module")
def stamps(appliance: Any) -> list[list[int]]:
    """The timestamps of the records of each partition of TOPIC, by offset (ms; unordered, some equal)."""
    rng = random.Random(21)
    out = []
    with Producer({"bootstrap.servers": appliance.bootstrap}) as producer:
        for partition in range(2):
            times = [T0 + rng.randrange(0, 3000, 100) for _ in range(PER_PARTITION)]
            values = [b"%d-%d" % (partition, i) for i in range(PER_PARTITION)]
            placed = producer.send_many(TOPIC, values, timestamps=times, partition=partition).get()
            assert placed.offsets[0] == 0
            out.append(times)
    return out


def first_at_or_after(times: list[int], timestamp: int) -> int | None:
    return next((offset for offset, t in enumerate(times) if t >= timestamp), None)


Point = tuple[str, Any] | None  # ("global", ts) | ("map", [ts0, ts1]) | None
points = st.one_of(st.none(), st.tuples(st.just("global"), st.integers(T0 - 500, T0 + 3500)),
                   st.tuples(st.just("map"), st.lists(st.integers(T0 - 500, T0 + 3500), min_size=2,
                                                      max_size=2)))


def options_for(which: str, point: Point) -> dict[str, str]:
    if point is None:
        return {}
    if point[0] == "global":
        return {f"{which}Timestamp": str(point[1])}
    stamps_json = ", ".join(f'"{p}": {t}' for p, t in enumerate(point[1]))
    return {f"{which}OffsetsByTimestamp": f'{{"{TOPIC}": {{{stamps_json}}}}}'}


def at(point: Point, partition: int) -> int | None:
    return None if point is None else point[1] if point[0] == "global" else point[1][partition]


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@example(start=("global", T0 + 3500), end=None, strategy=None)  # no record that late: an error
@example(start=("global", T0 + 3500), end=None, strategy="latest")  # ... or nothing to read
@example(start=("map", [T0 + 2900, T0 + 1000]), end=("global", T0 + 100), strategy="error")  # start > end
@given(start=points, end=points, strategy=st.sampled_from(["error", "latest", None]))
def test_timestamp_options_read_what_the_list_oracle_says(spark: Any, appliance: Any, stamps: list[list[int]],
                                                          start: Point, end: Point,
                                                          strategy: str | None) -> None:
    options = {**options_for("starting", start), **options_for("ending", end)}
    if strategy is not None:
        options["startingOffsetsByTimestampStrategy"] = strategy
    firsts, lasts, failures = {}, {}, []
    for partition, times in enumerate(stamps):  # every starting offset is resolved first, then checked
        wanted = at(start, partition)
        first = 0 if wanted is None else first_at_or_after(times, wanted)
        if first is None and strategy in ("error", None):
            failures.append(f"no record of partition {TOPIC}-{partition} has a timestamp >= {wanted}")
        firsts[partition] = len(times) if first is None else first
        wanted = at(end, partition)
        last = None if wanted is None else first_at_or_after(times, wanted)
        lasts[partition] = len(times) if last is None else last
    for partition in firsts:
        if firsts[partition] > lasts[partition]:
            failures.append(f"partition {TOPIC}-{partition}: the resolved start offset {firsts[partition]}")
    failure = failures[0] if failures else None
    expected = {partition: range(firsts[partition], lasts[partition]) for partition in firsts}
    read = spark.read.format("appliance").option("kafka.bootstrap.servers", appliance.bootstrap) \
        .option("subscribe", TOPIC)
    for key, value in options.items():
        read = read.option(key, value)
    if failure is not None:
        with pytest.raises(Exception) as caught:
            read.load().collect()
        assert failure in str(caught.value), (options, str(caught.value)[:2000])
        assert "stage failure" not in str(caught.value)  # planning, not a task
        return
    rows = read.load().selectExpr("partition", "offset", "unix_millis(timestamp) AS ms").collect()
    got = sorted((r.partition, r.offset) for r in rows)
    assert got == [(p, o) for p, offsets in expected.items() for o in offsets], options
    assert all(r.ms == stamps[r.partition][r.offset] for r in rows)


def test_a_stream_starts_at_a_timestamp(spark: Any, appliance: Any, stamps: list[list[int]],
                                        tmp_path: Path) -> None:
    got: list[tuple[int, int]] = []
    query = (spark.readStream.format("appliance").option("kafka.bootstrap.servers", appliance.bootstrap)
             .option("subscribe", TOPIC).option("startingOffsetsByTimestamp",
                                                f'{{"{TOPIC}": {{"0": {T0 + 1500}, "1": {T0 + 9999}}}}}')
             .option("startingOffsetsByTimestampStrategy", "latest").load()
             .writeStream.foreachBatch(lambda b, _: got.extend((r.partition, r.offset) for r in b.collect()))
             .option("checkpointLocation", str(tmp_path / "checkpoint")).trigger(availableNow=True).start())
    query.awaitTermination(120)
    assert query.exception() is None
    first = first_at_or_after(stamps[0], T0 + 1500)
    assert first is not None
    assert sorted(got) == [(0, o) for o in range(first, PER_PARTITION)]  # partition 1: at its latest offset


def batch_sizes(spark: Any, appliance: Any, topic: str, checkpoint: Path, **options: str) -> tuple[Any, list]:
    sizes: list[int] = []
    read = (spark.readStream.format("appliance").option("kafka.bootstrap.servers", appliance.bootstrap)
            .option("subscribe", topic).option("startingOffsets", "earliest"))
    for key, value in options.items():
        read = read.option(key, value)
    query = (read.load().writeStream.foreachBatch(lambda b, _: sizes.append(b.count()))
             .option("checkpointLocation", str(checkpoint)).trigger(processingTime="100 milliseconds")
             .start())
    return query, sizes


def wait_for(query: Any, done: Any, what: str) -> None:
    deadline = time.monotonic() + 90
    while not done():
        assert query.isActive and time.monotonic() < deadline, (what, query.exception())
        time.sleep(0.1)


def send(appliance: Any, topic: str, partitions: int, count: int) -> None:
    with Producer({"bootstrap.servers": appliance.bootstrap}) as producer:
        for partition in range(partitions):
            producer.send_many(topic, [b"x" * 10] * count, partition=partition).get()


def test_min_and_max_offsets_per_trigger_shape_micro_batches(spark: Any, appliance: Any,
                                                             tmp_path: Path) -> None:
    send(appliance, "trigger-min", 2, 15)
    query, sizes = batch_sizes(spark, appliance, "trigger-min", tmp_path / "min", minOffsetsPerTrigger="50",
                               maxOffsetsPerTrigger="100", maxTriggerDelay="1h")
    try:
        wait_for(query, lambda: sizes == [30], "the first trigger goes ahead with what there is")
        send(appliance, "trigger-min", 2, 10)  # 20 waiting: fewer than minOffsetsPerTrigger
        time.sleep(2)
        assert sizes == [30], "a micro-batch ran before minOffsetsPerTrigger records waited"
        send(appliance, "trigger-min", 2, 90)  # 200 waiting: two batches of maxOffsetsPerTrigger
        wait_for(query, lambda: sum(sizes) == 230, "every record read")
        assert all(50 <= size <= 100 for size in sizes[1:]), sizes
    finally:
        query.stop()
    # maxTriggerDelay: a batch smaller than minOffsetsPerTrigger once the delay has passed
    send(appliance, "trigger-delay", 1, 5)
    query, sizes = batch_sizes(spark, appliance, "trigger-delay", tmp_path / "delay",
                               minOffsetsPerTrigger="1000", maxTriggerDelay="2s")
    try:
        wait_for(query, lambda: sizes == [5], "the first trigger goes ahead")
        send(appliance, "trigger-delay", 1, 5)
        wait_for(query, lambda: sum(sizes) == 10, "maxTriggerDelay lets 5 records through")
        assert sizes == [5, 5]
    finally:
        query.stop()
