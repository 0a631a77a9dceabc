"""Batch reads: plan offset ranges on the driver, fetch them on executors as Arrow record batches.

``spark.read.format("appliance")...load()`` becomes one Spark task per :class:`OffsetRange` (see
``appliance.spark.planning``: one per partition, large partitions cut into several).  A task runs
:func:`read_range` on an executor: a remote :class:`appliance.client.consumer.Consumer` (the Kafka protocol
over TCP, so it runs on any host that reaches the broker) seeks to the range's first offset and polls record
arrays until the range's end; each chunk becomes one ``pyarrow.RecordBatch``
(``appliance.spark.arrow_columns``) -- Spark takes Arrow batches without converting rows in Python.

A range is planned below the high watermark, so its records exist unless retention deleted them meanwhile:
then ``failOnDataLoss=true`` (the default) fails the task naming the lost offsets, and ``false`` skips to
what is left.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition

from appliance.client.consumer import Consumer, TopicPartition
from appliance.spark.options import SourceOptions
from appliance.spark.planning import OffsetRange, plan_batch
from storage.errors import ApplianceError, OffsetOutOfRangeError

__all__ = ["ApplianceBatchReader", "read_range"]

_FETCH_SETTINGS = {
    "auto.offset.reset": "none",
    "max.partition.fetch.bytes": 8 << 20,
    "fetch.max.bytes": 64 << 20,
    "fetch.max.wait.ms": 200,
    "client.id": "appliance-spark-executor",
}
_STALL_S = 120.0  # no progress below the planned end this long: the log lost them (pollTimeoutMs default)


def read_range(task: OffsetRange) -> Iterator[pa.RecordBatch]:
    """The records of ``task`` as Arrow record batches, in offset order."""
    from appliance.spark.arrow_columns import to_record_batch  # executors only: numba kernels, pyarrow

    tp = TopicPartition(task.topic, task.partition)
    name = f"partition {task.topic}-{task.partition}"
    settings = {**_FETCH_SETTINGS, **dict(task.consumer_settings), "auto.offset.reset": "none"}
    consumer = Consumer({**settings, "bootstrap.servers": task.bootstrap_servers})
    stall_s = _STALL_S if task.poll_timeout_ms is None else task.poll_timeout_ms / 1000
    try:
        consumer.assign([tp])
        position = task.from_offset
        consumer.seek(tp, position)
        last_progress = time.monotonic()
        while position < task.until_offset:
            try:
                chunks = consumer.poll_batch(timeout_ms=500, max_records=task.until_offset - position)
            except OffsetOutOfRangeError as exc:
                start = consumer.beginning_offsets([tp])[tp]  # retention deleted records since planning
                if task.fail_on_data_loss or start <= position:
                    lost = f"{position}..{min(start, task.until_offset) - 1}"
                    raise OffsetOutOfRangeError(
                        f"appliance data source: {name}: offsets {lost} were deleted before this task read "
                        f"them (log start offset now {start}); set failOnDataLoss=false to skip lost records "
                        f"({exc})") from None
                position = start
                consumer.seek(tp, position)
                continue
            for chunk in chunks:
                if len(chunk) and int(chunk.offsets[-1]) >= task.until_offset:
                    chunk = chunk.slice(0, int((chunk.offsets < task.until_offset).sum()))
                if len(chunk):
                    position = int(chunk.offsets[-1]) + 1
                    last_progress = time.monotonic()
                    yield to_record_batch(chunk, task.include_headers)
            if not chunks:
                position = max(position, consumer.position(tp))  # a gap (compaction, control batches)
                if time.monotonic() - last_progress > stall_s:
                    raise ApplianceError(
                        f"appliance data source: {name}: no records at offset {position} for "
                        f"{stall_s:g} s (kafkaConsumer.pollTimeoutMs), planned up to {task.until_offset} "
                        f"(high watermark now {consumer.end_offsets([tp])[tp]}): was the topic deleted and "
                        "created again?")
    finally:
        consumer.close()


class ApplianceBatchReader(DataSourceReader):
    """``spark.read.format("appliance")``: ``partitions()`` on the driver, ``read()`` on executors."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    def partitions(self) -> list[InputPartition]:
        return list(plan_batch(self.options))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, OffsetRange):
            return iter(())  # Spark's stand-in task when there are no ranges
        return read_range(partition)
