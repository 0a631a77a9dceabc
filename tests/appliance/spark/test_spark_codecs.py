"""The Spark source and sink with every codec Kafka clients write, on the session's SparkSession and
``appliance serve``: batches that confluent-kafka and kafka-python compress with gzip, snappy, lz4 and zstd
read back exactly; the sink writes lz4 and snappy batches that read back exactly; a batch whose compressed
records are garbage under a valid CRC fails the query naming the partition, the offsets and the codec."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from support.codec_batches import (
    CODECS,
    codecs_on_disk,
    confluent_producer,
    garbage_batch,
    log_records,
    produce_confluent,
    produce_kafka_python,
    send_batch,
)

from storage.compression import CODECS_BY_NAME

pytestmark = pytest.mark.slow


def read(spark: Any, appliance: Any, **options: str) -> list[tuple[int, int, bytes | None, bytes, tuple]]:
    read = (spark.read.format("appliance").option("bootstrap.servers", appliance.bootstrap)
            .option("includeHeaders", "true"))
    for key, value in options.items():
        read = read.option(key, value)
    rows = [(r.partition, r.offset, None if r.key is None else bytes(r.key), bytes(r.value),
             tuple((h.key, None if h.value is None else bytes(h.value)) for h in r.headers))
            for r in read.load().collect()]
    return sorted(rows, key=lambda row: (row[0], row[1]))


def test_every_codec_of_both_kafka_clients_reads_back_and_the_sink_writes_lz4_and_snappy(
    spark: Any, appliance: Any
) -> None:
    expected = []
    for partition, codec in enumerate(CODECS):  # partition i: codec i, from both clients
        sent = []
        for send, tag in ((produce_confluent, "ck"), (produce_kafka_python, "kp")):
            records = log_records(30, large=False, tag=tag) + log_records(200, large=True, tag=tag)
            send(appliance.bootstrap, "codecs-in", codec, records, linger_ms=100, partition=partition)
            sent += records
        expected += [(partition, offset, r.key, r.value, r.headers) for offset, r in enumerate(sent)]
        directory = Path(appliance.serve.data) / f"codecs-in-{partition}"
        assert CODECS_BY_NAME[codec] in codecs_on_disk(directory)
    assert read(spark, appliance, subscribe="codecs-in") == expected
    frame = (spark.read.format("appliance").option("bootstrap.servers", appliance.bootstrap)
             .option("subscribe", "codecs-in").option("includeHeaders", "true").load())
    for codec, partitions in (("lz4", "0, 1"), ("snappy", "2, 3")):
        (frame.where(f"partition IN ({partitions})").selectExpr("key", "value", "headers", "partition",
                                                                "'codecs-out' AS topic")
         .write.format("appliance").option("bootstrap.servers", appliance.bootstrap)
         .option("compression.type", codec).mode("append").save())
    assert [(p, k, v, h) for p, _, k, v, h in read(spark, appliance, subscribe="codecs-out")] == [
        (p, k, v, h) for p, _, k, v, h in expected]
    for partition in range(4):
        written = "lz4" if partition < 2 else "snappy"
        assert codecs_on_disk(Path(appliance.serve.data) / f"codecs-out-{partition}") == {
            CODECS_BY_NAME[written]}


def test_a_garbage_payload_fails_the_query_naming_partition_offsets_and_codec(spark: Any,
                                                                               appliance: Any) -> None:
    good = log_records(5, large=False, tag="good")
    for partition, codec in enumerate(CODECS):
        with confluent_producer(appliance.bootstrap, codec, linger_ms=0) as send:
            send("codecs-bad", good, partition)
            send_batch(appliance.bootstrap, "codecs-bad", partition, garbage_batch(CODECS_BY_NAME[codec], 3))
            send("codecs-bad", good, partition)
    for partition, codec in enumerate(CODECS):
        only = json.dumps({"codecs-bad": {str(p): 13 if p == partition else 0 for p in range(4)}})
        with pytest.raises(Exception) as caught:
            read(spark, appliance, subscribe="codecs-bad", endingOffsets=only)
        message = str(caught.value)
        assert f"partition codecs-bad-{partition} " in message, message
        assert "(offsets 5..7): not valid " + codec + " data: " in message, message
        assert "seek to offset 8 to skip this batch" in message, message
    after = read(spark, appliance, subscribe="codecs-bad", startingOffsets=json.dumps(
        {"codecs-bad": {str(p): 8 for p in range(4)}}))
    assert len(after) == 4 * len(good)
