"""The sink's commit log: exactly-once writes without transactions, keyed by (query id, batch id).

Theory of operation
-------------------
Kafka's own Spark sink is at-least-once: a micro-batch that Spark runs again after a crash is written
again.  The appliance has no transactions either, so the sink makes a replayed batch write nothing twice
with two things it does have -- idempotent producers (a producer id on every batch header) and an ordinary
one-partition topic, the *commit log* (option ``commitLogTopic``, default ``appliance-spark-commits``) -- and
one rule: every record a task writes carries the producer id of that task attempt, and that producer id is
in the commit log *before* the first record is written.

Records of the commit log (key: the query id, value: JSON)::

    {"kind": "intent", "batch": N, "task": T, "producerId": P, "topic": "out", "start": {"0": 41, "1": 7}}
    {"kind": "commit", "batch": N, "records": R, "tasks": K}

The protocol, for micro-batch ``N`` of query ``Q`` (``appliance.spark.writer`` runs it):

1. **Task ``T`` starts** (on an executor; Spark tells it ``Q``, ``N`` and ``T``).  It reads the commit log
   backwards from its end (:meth:`CommitLog.state`) until it meets a ``commit`` of ``Q`` for a batch below
   ``N`` -- batch ``N``'s records all come after it, because Spark commits batch ``N - 1`` before it starts
   batch ``N``.  A ``commit`` of ``Q`` for ``N`` (or later) means the batch is complete: the task writes
   nothing.
2. **Intent.**  Before its first record to a topic, the attempt appends an ``intent`` naming its producer id
   and the topic's high watermarks, and waits for it (acks=all).  Everything this attempt writes to that
   topic lies above those offsets and carries that producer id.
3. **Write** with the idempotent producer (retries inside the attempt are de-duplicated by the broker).
4. **Commit.**  When every task succeeded, Spark calls the sink's commit on the driver with ``N``: if the log
   has no ``commit`` of ``Q`` for ``N`` yet, it appends one.  Spark records the batch as done only after.

A crash anywhere leaves one of these states, and the replay of batch ``N`` (same offsets, same rows)
converges to each row exactly once:

* *before any intent*: nothing of the attempt was written; the replay writes everything;
* *after intents, before the commit record* (tasks died midway, or the driver died before step 4): the
  replayed task finds the intents of earlier attempts of ``(Q, N, T)``, reads back from each topic, above
  the recorded offsets, the records carrying those producer ids (:meth:`CommitLog.written_rows`), and writes
  only the rows of its input not among them (a multiset difference on topic, key, value and headers: rows
  routed by murmur2 of their key land where they landed before; rows without a key may land on another
  partition, which does not change what a reader of the topic sees);
* *after the commit record* (Spark died before recording the batch): every task skips; the driver's commit
  finds the record and appends nothing.

What it assumes, and says so: a micro-batch replays the same rows into the same task numbers (true for
Spark's micro-batch engine with a deterministic query: Spark disables adaptive execution for streams);
earlier attempts of a task are dead when a replay runs (speculative execution must stay off, its default);
records of a batch that is never replayed (a query abandoned for good after a failure) stay in the topic, as
with any Kafka producer.  Readers see a batch's records as they are written, not at its commit (there are
no transactions to hide them): exactly-once here means each row is in the topic once, in the end.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from appliance.client.consumer import Consumer, TopicPartition
from appliance.client.producer import Producer
from ipc.kafka import (
    CreatableTopic,
    CreateTopicsRequest,
    CreateTopicsResponse,
    ErrorCode,
    FetchPartition,
    FetchRequest,
    FetchResponse,
    FetchTopic,
    MetadataRequest,
    MetadataRequestTopic,
    MetadataResponse,
    error_name,
)
from ipc.kafka_client import BrokerConnectionError, KafkaConnection, parse_bootstrap_servers
from storage.batch_reader import Record, iter_batches, iter_records
from storage.errors import ApplianceError, UnknownTopicOrPartitionError

__all__ = ["BatchState", "CommitLog", "Intent", "RowKey"]

# a written row as the replay compares it: topic, key, value, headers
RowKey = tuple[str, bytes | None, bytes | None, tuple[tuple[str, bytes | None], ...]]
_WINDOW_RECORDS = 5000  # the backward scan reads the log in windows of this many records
_FETCH_BYTES = 8 << 20


@dataclass(frozen=True)
class Intent:
    """An attempt of task ``task`` of batch ``batch`` writes to ``topic`` as ``producer_id``, above
    ``start`` (partition -> high watermark before its first record)."""

    batch: int
    task: int
    producer_id: int
    topic: str
    start: dict[int, int]


@dataclass
class BatchState:
    """What the commit log says about one batch of one query (and one task of it)."""

    committed: bool = False
    intents: list[Intent] = field(default_factory=list)


class CommitLog:
    """The commit log topic of a sink (see the module docstring)."""

    def __init__(self, bootstrap_servers: str, topic: str) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.topic = topic

    # -- the topic -----------------------------------------------------------------------------------------

    def _connection(self) -> KafkaConnection:
        errors = []
        for host, port in parse_bootstrap_servers(self.bootstrap_servers):
            try:
                return KafkaConnection(host, port, client_id="appliance-spark-sink")
            except BrokerConnectionError as exc:
                errors.append(str(exc))
        raise BrokerConnectionError("no bootstrap server answered: " + "; ".join(errors))

    def ensure_topic(self) -> None:
        """Create the commit log topic (one partition: one order) unless it exists."""
        with self._connection() as connection:
            found = connection.request(MetadataRequest(topics=[MetadataRequestTopic(name=self.topic)],
                                                       allow_auto_topic_creation=False))
            assert isinstance(found, MetadataResponse)
            if found.topics and found.topics[0].error_code == ErrorCode.NONE:
                if len(found.topics[0].partitions) != 1:
                    count = len(found.topics[0].partitions)
                    raise ApplianceError(f"commit log topic {self.topic!r} has {count} partitions; it needs "
                                         "exactly one (one order of commits)")
                return
            created = connection.request(CreateTopicsRequest(
                topics=[CreatableTopic(name=self.topic, num_partitions=1, replication_factor=-1)]))
            assert isinstance(created, CreateTopicsResponse)
            code = created.topics[0].error_code
            if code not in (ErrorCode.NONE, ErrorCode.TOPIC_ALREADY_EXISTS):
                raise ApplianceError(f"cannot create the sink's commit log topic {self.topic!r}: "
                                     f"{error_name(code)} {created.topics[0].error_message or ''}")

    # -- reading -------------------------------------------------------------------------------------------

    def state(self, query_id: str, batch_id: int, task: int | None = None) -> BatchState:
        """Whether ``(query_id, batch_id)`` is committed and, for ``task``, the intents of its attempts
        (oldest first).  Reads backwards until a commit of the query for an earlier batch."""
        state = BatchState()
        key = query_id.encode("utf-8")
        for entry_key, entry in self._backwards():
            if entry_key != key:
                continue
            kind, batch = entry.get("kind"), int(entry.get("batch", -1))
            if kind == "commit":
                state.committed = batch >= batch_id
                break
            if kind == "intent" and batch == batch_id and entry.get("task") == task:
                start = {int(p): int(o) for p, o in entry["start"].items()}
                state.intents.insert(0, Intent(batch, int(entry["task"]), int(entry["producerId"]),
                                               str(entry["topic"]), start))
        return state

    def _backwards(self) -> Iterator[tuple[bytes | None, dict[str, Any]]]:
        """Commit log entries, newest first."""
        tp = TopicPartition(self.topic, 0)
        with Consumer({"bootstrap.servers": self.bootstrap_servers, "auto.offset.reset": "earliest",
                       "client.id": "appliance-spark-sink"}) as consumer:
            consumer.assign([tp])
            log_start, end = consumer.beginning_offsets([tp])[tp], consumer.end_offsets([tp])[tp]
            while end > log_start:
                begin = max(log_start, end - _WINDOW_RECORDS)
                consumer.seek(tp, begin)
                window = []
                while consumer.position(tp) < end:
                    records = consumer.poll(timeout_ms=1000, max_records=end - begin)
                    if not records and consumer.position(tp) < end:
                        raise ApplianceError(f"commit log {self.topic}: offsets {begin}..{end - 1} do not "
                                             "arrive")
                    window += [r for r in records if r.offset < end]
                for record in reversed(window):
                    try:
                        entry = json.loads(record.value or b"")
                    except ValueError:
                        continue  # not ours
                    if isinstance(entry, dict):
                        yield record.key, entry
                end = begin

    def written_rows(self, intents: Iterable[Intent]) -> Counter[RowKey]:
        """The rows the attempts behind ``intents`` managed to write: records above each intent's start
        offsets whose batches carry its producer id."""
        rows: Counter[RowKey] = Counter()
        by_topic: dict[str, tuple[dict[int, int], set[int]]] = {}
        for intent in intents:
            start, producers = by_topic.setdefault(intent.topic, ({}, set()))
            for partition, offset in intent.start.items():
                start[partition] = min(start.get(partition, offset), offset)
            producers.add(intent.producer_id)
        for topic, (start, producers) in by_topic.items():
            for partition, offset in sorted(start.items()):
                for record in self._records_of(topic, partition, offset, producers):
                    rows[(topic, record.key, record.value, tuple(record.headers))] += 1
        return rows

    def _records_of(self, topic: str, partition: int, offset: int, producers: set[int]) -> Iterator[Record]:
        """Records of ``topic-partition`` from ``offset`` to the high watermark whose batch header carries
        one of ``producers`` (a raw Fetch: the consumer's arrays do not keep batch headers)."""
        with self._leader(topic, partition) as connection:
            while True:
                response = connection.request(FetchRequest(
                    replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=_FETCH_BYTES, isolation_level=0,
                    session_id=0, session_epoch=-1, topics=[FetchTopic(topic=topic, partitions=[
                        FetchPartition(partition=partition, fetch_offset=offset, log_start_offset=-1,
                                       partition_max_bytes=_FETCH_BYTES)])]))  # fmt: skip
                assert isinstance(response, FetchResponse)
                part = response.responses[0].partitions[0]
                if part.error_code != ErrorCode.NONE:
                    raise ApplianceError(f"sink replay: reading back {topic}-{partition} from offset "
                                         f"{offset} failed: {error_name(part.error_code)}")
                records = bytes(part.records or b"")
                batches = iter_batches(records, where=f"{topic}-{partition}", allow_truncated_tail=True)
                moved = False
                for position, header in batches:
                    if header.producer_id in producers:
                        for record in iter_records(records, position, where=f"{topic}-{partition}"):
                            if record.offset >= offset:
                                yield record
                    offset = max(offset, header.base_offset + header.last_offset_delta + 1)
                    moved = True
                if not moved:
                    if records:  # a batch larger than the fetch: never expected (batches are <= 1 MiB)
                        raise ApplianceError(f"sink replay: {topic}-{partition} at offset {offset}: a batch "
                                             f"larger than {_FETCH_BYTES} bytes")
                    return

    def _leader(self, topic: str, partition: int) -> KafkaConnection:
        with self._connection() as connection:
            found = connection.request(MetadataRequest(topics=[MetadataRequestTopic(name=topic)],
                                                       allow_auto_topic_creation=False))
        assert isinstance(found, MetadataResponse)
        for meta in found.topics:
            for part in meta.partitions:
                if part.partition_index == partition:
                    for broker in found.brokers:
                        if broker.node_id == part.leader_id:
                            return KafkaConnection(broker.host or connection.host, broker.port,
                                                   client_id="appliance-spark-sink")
        raise UnknownTopicOrPartitionError(f"sink replay: partition {topic}-{partition} has no leader")

    # -- writing -------------------------------------------------------------------------------------------

    def record_intent(self, producer: Producer, query_id: str, intent: Intent) -> None:
        """Append an intent and wait until it is acknowledged (before the attempt's first record)."""
        entry = {"kind": "intent", "batch": intent.batch, "task": intent.task,
                 "producerId": intent.producer_id, "topic": intent.topic,
                 "start": {str(p): o for p, o in sorted(intent.start.items())}}
        self._append(producer, query_id, entry)

    def record_commit(self, producer: Producer, query_id: str, batch_id: int, records: int,
                      tasks: int) -> None:
        self._append(producer, query_id, {"kind": "commit", "batch": batch_id, "records": records,
                                          "tasks": tasks})

    def _append(self, producer: Producer, query_id: str, entry: dict[str, Any]) -> None:
        value = json.dumps(entry, separators=(",", ":")).encode("utf-8")
        producer.send_many(self.topic, [value], keys=[query_id.encode("utf-8")], partition=0).get()
