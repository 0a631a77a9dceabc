"""Batch and streaming writes: DataFrame rows -> records, through the idempotent producer over TCP.

A write takes the columns Spark's Kafka sink takes, by its rules (checked while Spark plans the write:
``appliance.spark.schema.check_write_columns``): ``value`` (binary or string, required), ``key`` (binary
or string), and optionally ``topic`` (string; option ``topic``, when set, overrides it), ``partition``
(int; else murmur2 of the key, as Kafka's producer, or a sticky partition for null keys) and ``headers``
(``array<struct<key: string, value: binary>>``); other columns are ignored.  Each task runs
:func:`write_task` on an executor: Arrow batches come in (``DataSourceArrowWriter``: no per-row Python),
their buffers become byte columns (``appliance.spark.arrow_columns``), and :class:`appliance.Producer`
with ``bootstrap.servers`` (and the ``kafka.*`` options it knows) encodes and sends them over TCP.  A
task fails with the first delivery error of its records.

Streaming writes are **exactly once** by ``(query id, batchId)`` through the sink's commit log (the
protocol, its crash cases and its assumptions are in ``appliance.spark.commit_log``).  A batch write is
exactly once the same way when given ``txnAppId`` (a stable id of the job) and ``txnVersion`` (the
``batchId`` of ``foreachBatch``), and at-least-once otherwise (a retried task writes its rows again, as
Kafka's sink does).  ``mode("overwrite")`` is refused for batch writes (a topic is append-only); a streaming
query in ``complete`` output mode appends its whole result table each batch, as Kafka's sink does.

Fault points for tests, option ``appliance.test.faultPoint``: ``kill:N`` makes every task of batch ``N``
SIGKILL its own process (the Python worker) after half of its rows were acknowledged and a quarter more
sent without waiting; ``commit:N`` makes the driver's commit of batch ``N`` fail before its commit record is
appended.
"""

from __future__ import annotations

import os
import signal
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from appliance.client.bulk_columns import take_records
from appliance.client.producer import BulkHandle, Producer
from appliance.spark.arrow_columns import byte_column, header_columns
from appliance.spark.commit_log import CommitLog, Intent, RowKey
from appliance.spark.options import LATEST, SourceOptions
from appliance.spark.planning import ClusterView
from storage.batch_builder import RecordColumns
from storage.errors import ApplianceError, ConfigError, InvalidRecordError

__all__ = [
    "ApplianceBatchWriter",
    "ApplianceStreamWriter",
    "SinkCommitMessage",
    "TaskIdentity",
    "commit_batch",
    "write_task",
]

_SINK_COLUMNS = frozenset({"topic", "key", "value", "headers", "partition"})
QUERY_ID_PROPERTY = "sql.streaming.queryId"  # local properties Spark sets on a micro-batch's tasks
BATCH_ID_PROPERTY = "streaming.sql.batchId"


@dataclass(frozen=True)
class TaskIdentity:
    """Which write a task belongs to: the query (or txnAppId), its batch, the task's partition number."""

    query_id: str
    batch_id: int
    task: int


@dataclass(frozen=True)
class SinkCommitMessage(WriterCommitMessage):
    """What a task reports to the driver's commit."""

    identity: TaskIdentity | None
    producer_id: int
    records: int
    skipped: bool = False  # the batch was committed before: nothing written


class _TaskWriter:
    """The rows of one task attempt, to records: routing, intents, the replay's multiset difference."""

    def __init__(self, options: SourceOptions, identity: TaskIdentity | None) -> None:
        self.options = options
        self.identity = identity
        settings = {"compression.type": options.compression, "client.id": "appliance-spark-writer",
                    **options.producer_settings(), "bootstrap.servers": options.bootstrap_servers}
        self.producer = Producer(settings)
        self.sent: list[BulkHandle] = []  # sends not seen done yet, and those that failed
        self.log = CommitLog(options.bootstrap_servers, options.commit_log_topic)
        self.intended: set[str] = set()
        self.already: Counter[RowKey] | None = None  # a replay: rows earlier attempts wrote
        self.records = 0

    def start(self) -> bool:
        """False if the batch is committed (write nothing)."""
        if self.identity is None:
            return True
        state = self.log.state(self.identity.query_id, self.identity.batch_id, self.identity.task)
        if state.committed:
            return False
        if state.intents:
            self.already = self.log.written_rows(state.intents)
        return True

    def write(self, batch: pa.RecordBatch) -> None:
        """Send the rows of ``batch`` (those an earlier attempt did not write, on a replay)."""
        if self.already is not None and batch.num_rows:
            batch = batch.filter(pa.array(self._not_written(_columns(batch), batch.num_rows)))
        count = batch.num_rows
        if count == 0:
            return
        columns = _columns(batch)
        records = RecordColumns(
            byte_column(columns["value"], "value"),
            byte_column(columns["key"], "key") if "key" in columns else None,
            header_columns(columns["headers"]) if "headers" in columns else None,
        )
        names, topic_codes = self._topics(columns, count)
        partitions = self._partitions(columns, count)
        if len(names) == 1 and partitions is None:
            self._send(names[0], records, None)
        else:  # one send per (topic, explicit partition or -1 = by key), rows in their order
            if partitions is None:
                partitions = np.full(count, -1, np.int64)
            groups = topic_codes * (int(partitions.max()) + 2) + (partitions + 1)
            order = np.argsort(groups, kind="stable")
            bounds = np.flatnonzero(np.diff(groups[order])) + 1
            for rows in np.split(order, bounds):
                partition = int(partitions[rows[0]])
                self._send(names[int(topic_codes[rows[0]])], take_records(records, rows),
                           None if partition < 0 else partition)
        self.records += count

    def _topics(self, columns: dict[str, pa.Array], count: int) -> tuple[list[str], np.ndarray]:
        """The topics of the rows: their names and, per row, an index into them.  Option ``topic``
        overrides a topic column, as in Spark's Kafka sink; a null topic without it is an error."""
        if self.options.topic is not None:
            return [self.options.topic], np.zeros(count, np.int64)
        column = columns["topic"]
        if column.null_count:
            raise InvalidRecordError("a null topic is present in the data; use the topic option for setting "
                                     "a default topic")
        encoded = column.dictionary_encode()
        names = [str(name) for name in encoded.dictionary.to_pylist()]
        return names, np.asarray(encoded.indices.to_numpy(zero_copy_only=False), np.int64)

    @staticmethod
    def _partitions(columns: dict[str, pa.Array], count: int) -> np.ndarray | None:
        """The explicit partition of each row, -1 where the column is null (route by key); None without
        a partition column."""
        if "partition" not in columns:
            return None
        column = columns["partition"]
        if not pa.types.is_integer(column.type):
            raise InvalidRecordError(f"column 'partition': expected an integer, got {column.type}")
        out = np.asarray(pc.fill_null(column, -1).to_numpy(zero_copy_only=False), np.int64)
        if len(out) != count or bool((out < -1).any()):
            raise InvalidRecordError("column 'partition': a partition number is negative")
        return out

    def _send(self, topic: str, records: RecordColumns, partition: int | None) -> None:
        if self.identity is not None and topic not in self.intended:
            self._intend(topic)
        self.sent.append(self.producer.send_many(topic, records.values, keys=records.keys,
                                                 partition=partition, headers=records.headers))
        self.sent = [handle for handle in self.sent if not handle.done() or handle.error is not None]

    def _intend(self, topic: str) -> None:
        """Record where this attempt's records to ``topic`` will start, before the first of them."""
        assert self.identity is not None
        view = ClusterView(self.options.bootstrap_servers)
        try:
            partitions = [(topic, p) for p in range(len(self.producer.partitions_for(topic)))]
            high = view.offsets(partitions, LATEST)
        finally:
            view.close()
        intent = Intent(self.identity.batch_id, self.identity.task, self.producer.producer_id, topic,
                        {p: high[(topic, p)] for _, p in partitions})
        self.log.record_intent(self.producer, self.identity.query_id, intent)
        self.intended.add(topic)

    def _not_written(self, columns: dict[str, pa.Array], count: int) -> list[bool]:
        """Per row: True unless an earlier attempt wrote it (each earlier record cancels one equal row)."""
        assert self.already is not None
        topics = columns["topic"].to_pylist() if "topic" in columns and self.options.topic is None else (
            [self.options.topic] * count)
        keys = columns["key"].to_pylist() if "key" in columns else [None] * count
        values = columns["value"].to_pylist()
        headers = columns["headers"].to_pylist() if "headers" in columns else [None] * count
        keep = []
        for topic, key, value, pairs in zip(topics, keys, values, headers, strict=True):
            row: RowKey = (
                topic or "",
                key.encode("utf-8") if isinstance(key, str) else key,
                value.encode("utf-8") if isinstance(value, str) else value,
                tuple((h["key"], h["value"]) for h in pairs or ()),
            )
            if self.already[row] > 0:
                self.already[row] -= 1
                keep.append(False)
            else:
                keep.append(True)
        return keep

    def finish(self) -> None:
        """Wait until every record is acknowledged; raise the first delivery error; close the producer."""
        self.producer.flush()
        for handle in self.sent:
            handle.get(0)
        self.producer.close()

    def abandon(self) -> None:
        """Give up after an error: close without waiting (records not acknowledged fail; each may or may
        not have been appended).  An error while closing is not reported: the one that made the task give
        up is."""
        try:
            self.producer.close(timeout=0)
        except ApplianceError:
            pass


def _columns(batch: pa.RecordBatch) -> dict[str, pa.Array]:
    """The sink's columns by name (matched exactly, as Spark's Kafka sink does); others are ignored."""
    return {name: batch.column(i) for i, name in enumerate(batch.schema.names) if name in _SINK_COLUMNS}


def write_task(options: SourceOptions, batches: Iterator[pa.RecordBatch],
               identity: TaskIdentity | None) -> SinkCommitMessage:
    """Write one task's rows (see the module docstring); the message for the driver's commit."""
    writer = _TaskWriter(options, identity)
    try:
        if not writer.start():
            writer.finish()
            return SinkCommitMessage(identity, writer.producer.producer_id, 0, skipped=True)
        killed = identity is not None and options.fault_point == ("kill", identity.batch_id)
        for batch in batches:
            if killed:
                _die_midway(writer, batch)
            writer.write(batch)
        writer.finish()
    except BaseException:
        writer.abandon()
        raise
    return SinkCommitMessage(identity, writer.producer.producer_id, writer.records)


def _die_midway(writer: _TaskWriter, batch: pa.RecordBatch) -> None:
    """Fault point ``kill:N``: the first half of the rows written and acknowledged, the third quarter sent
    without waiting (requests in flight), the last quarter never sent, then SIGKILL of this process -- no
    clean-up runs."""
    half, three_quarters = batch.num_rows // 2, batch.num_rows * 3 // 4
    writer.write(batch.slice(0, half))
    writer.producer.flush()
    writer.write(batch.slice(half, three_quarters - half))
    os.kill(os.getpid(), signal.SIGKILL)


def commit_batch(options: SourceOptions, messages: list[WriterCommitMessage | None], batch_id: int) -> None:
    """The driver's commit of a batch: append its commit record unless the log has it already."""
    ours = [m for m in messages if isinstance(m, SinkCommitMessage) and m.identity is not None]
    if not ours:
        return
    identity = ours[0].identity
    assert identity is not None
    if options.fault_point == ("commit", batch_id):
        raise ApplianceError(f"fault point commit:{batch_id}: the driver stops before committing batch "
                             f"{batch_id} of {identity.query_id}")
    log = CommitLog(options.bootstrap_servers, options.commit_log_topic)
    if log.state(identity.query_id, batch_id).committed:
        return  # a replayed batch whose commit record made it
    with Producer({"bootstrap.servers": options.bootstrap_servers,
                   "client.id": "appliance-spark-commit"}) as producer:
        log.record_commit(producer, identity.query_id, batch_id, sum(m.records for m in ours), len(ours))


def _stream_identity() -> TaskIdentity:
    context = TaskContext.get()
    query_id = context.getLocalProperty(QUERY_ID_PROPERTY) if context is not None else None
    batch_id = context.getLocalProperty(BATCH_ID_PROPERTY) if context is not None else None
    if context is None or query_id is None or batch_id is None:
        raise ApplianceError("appliance streaming sink: the task carries no streaming query id and batch id "
                             f"(Spark's local properties {QUERY_ID_PROPERTY}, {BATCH_ID_PROPERTY})")
    return TaskIdentity(query_id, int(batch_id), context.partitionId())


class ApplianceBatchWriter(DataSourceArrowWriter):
    """``df.write.format("appliance").mode("append").save()``."""

    def __init__(self, options: SourceOptions, overwrite: bool) -> None:
        if overwrite:
            raise ConfigError("appliance data source: mode('overwrite') cannot be honoured: a topic is "
                              "append-only; use mode('append')")
        self.options = options
        if options.txn_app_id is not None:
            CommitLog(options.bootstrap_servers, options.commit_log_topic).ensure_topic()

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommitMessage:
        identity = None
        if self.options.txn_app_id is not None and self.options.txn_version is not None:
            context = TaskContext.get()
            task = context.partitionId() if context is not None else 0
            identity = TaskIdentity(self.options.txn_app_id, self.options.txn_version, task)
        return write_task(self.options, iterator, identity)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        if self.options.txn_version is not None:
            commit_batch(self.options, messages, self.options.txn_version)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Nothing to undo: rows written stay (a retry with the same txnVersion completes the batch)."""


class ApplianceStreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("appliance")``: exactly once by (query id, batchId)."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        CommitLog(options.bootstrap_servers, options.commit_log_topic).ensure_topic()

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommitMessage:
        return write_task(self.options, iterator, _stream_identity())

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        commit_batch(self.options, messages, batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing to undo: Spark replays the batch (same rows), and the commit log makes it complete."""
