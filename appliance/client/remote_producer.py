"""``RemoteProducer``: Kafka's idempotent producer over the Kafka protocol (TCP), for hosts without the rings.

Theory of operation
-------------------
``appliance.Producer`` reaches partition writers through shared-memory rings, so it only works on the
appliance's host.  A Spark executor on another machine (or any client that only knows ``bootstrap.servers``)
produces through the broker instead: Metadata to find each partition's leader, InitProducerId for an
idempotent identity, Produce (v3-8) to append.  This module is that client; it speaks through
:class:`~ipc.kafka_client.KafkaConnection` (one per broker) and the sans-IO codec ``ipc.kafka``.

**Batches.**  Records come in bulk (:meth:`RemoteProducer.send_many`: lists, 2-D arrays, ``(data, offsets)``
or :class:`~storage.batch_builder.ByteColumn` columns), are routed to partitions (an explicit partition; else
Kafka's murmur2 of the key, ``appliance.client.partitioner``; else whole batches to a sticky partition) and
cut into batches of about ``batch.size`` bytes.  Each batch is encoded once by ``storage.batch_builder`` with
the producer id, epoch and the partition's next sequence number, and from then on it is *bytes*: a retry sends
the very same bytes.

**Pipelining.**  Per broker connection at most ``max.in.flight.requests.per.connection`` (<= 5 when
idempotent) Produce requests are outstanding; each request carries at most one batch per partition (as
Kafka's protocol requires), the oldest unsent batch of every partition that broker leads.  Kafka answers a
connection's requests in order, so responses are matched to requests by arrival.  A partition's first batch
under a producer id goes alone (nothing else of that partition in flight until it is acknowledged): a broker
accepts an unknown producer at any sequence, so a later batch must not overtake the first one.

**Exactly once per partition.**  What the broker's de-duplication needs from the client (the rules are in
``storage.producer_state``): a batch is never re-encoded differently, sequences have no gaps, at most five
batches of a partition are unacknowledged at any time.  So:

* *retriable* answers (``NOT_LEADER_OR_FOLLOWER``, ``REQUEST_TIMED_OUT``, ``NOT_ENOUGH_REPLICAS``, a storage
  error, ``CORRUPT_MESSAGE``) and *lost* answers (the connection broke, a response did not come within
  ``request.timeout.ms``) **rewind** the partition: its oldest unacknowledged batch and everything behind it
  is sent again, in order, after ``retry.backoff.ms`` (and a metadata refresh).  A batch that had in fact
  been appended is answered as a duplicate with its original offsets, so it appears once in the log.
  Answers to requests sent before the rewind are stale and ignored (each batch counts its attempts);
* a *final* error (``MESSAGE_TOO_LARGE``, ``INVALID_RECORD``, an unknown topic after a metadata refresh, a
  fenced epoch, ...) fails that batch.  It was not appended, so the batches behind it are **re-numbered**
  (their base sequence moved down by its record count; the header field and the CRC rewritten, the records
  untouched) and sent again;
* a batch not acknowledged within ``delivery.timeout.ms`` of its creation fails with
  :class:`RequestTimeoutError`: its outcome is unknown.  The batches queued behind it fail with it (their
  sequences follow an unknown one), and the partition continues under a new producer id, from sequence 0.

Errors are reported per batch (:class:`SendResult`): :meth:`SendResult.get` and :meth:`RemoteProducer.flush`
raise the first one, from the ``storage.errors`` tree, naming the partition, the batch and Kafka's code.

**Progress** happens on the caller's thread only, inside :meth:`send_many` (which sends what it can without
waiting), :meth:`RemoteProducer.poll`, :meth:`SendResult.get` and :meth:`RemoteProducer.flush`.  When more
than ``_MAX_BUFFERED_BYTES`` of encoded batches wait, ``send_many`` drives the connections until they drain
below it, for at most ``max.block.ms`` (:class:`BackPressureError`, the records of that call not queued).
There is no background thread and no ``linger.ms``: a bulk call is its own batch boundary.  Not thread-safe.

``acks=0`` is not offered over TCP (an idempotent producer needs ``acks=all``; a fire-and-forget Produce has
no response to pipeline against).

Fault points (tests only): ``producer.faults["lose-response"] = n`` breaks the connection as each of the
next ``n`` Produce responses arrives, dropping it unread, as a network failure would: the broker appended
that request's batches (and maybe those of the requests behind it, also in flight), the producer does not
know, and resends them all; the broker recognises the duplicates.
"""

from __future__ import annotations

import select
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numba
import numpy as np

from appliance.client.partitioner import StickyPartitioner, murmur2_column
from appliance.client.producer_config import ProducerConfig
from ipc.kafka import (
    ErrorCode,
    InitProducerIdRequest,
    InitProducerIdResponse,
    MetadataRequest,
    MetadataRequestTopic,
    MetadataResponse,
    PartitionProduceData,
    ProduceRequest,
    ProduceResponse,
    TopicProduceData,
    error_name,
)
from ipc.kafka_client import BrokerConnectionError, KafkaConnection, parse_bootstrap_servers
from storage.batch_builder import ByteColumn, HeaderColumns, RecordColumns, build
from storage.batch_header import (
    BASE_SEQUENCE_OFFSET,
    HEADER_SIZE,
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    NO_SEQUENCE,
    write_crc,
)
from storage.compression import compress_bound
from storage.errors import (
    ApplianceError,
    BackPressureError,
    ConfigError,
    CorruptRecordError,
    InvalidRecordError,
    NotEnoughReplicasError,
    NotLeaderError,
    ProtocolError,
    RequestTimeoutError,
    UnknownTopicOrPartitionError,
)

__all__ = ["BatchMetadata", "RemoteProducer", "SendResult", "record_columns", "slice_columns", "take_records"]

_MAX_BUFFERED_BYTES = 64 << 20  # encoded batches waiting for acks before send_many blocks
_MAX_REQUEST_BYTES = 16 << 20  # record bytes per Produce request (the broker allows 100 MiB)
_SEQUENCE_MODULUS = 1 << 31
_RECORD_OVERHEAD_BYTES = 22  # per record, at most: varints, attributes, a timestamp delta
_HEADER_OVERHEAD_BYTES = 10  # per record header: its two length varints

_RETRIABLE = frozenset({
    ErrorCode.CORRUPT_MESSAGE, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.LEADER_NOT_AVAILABLE,
    ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.REQUEST_TIMED_OUT, ErrorCode.NETWORK_EXCEPTION,
    ErrorCode.NOT_ENOUGH_REPLICAS, ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND, ErrorCode.KAFKA_STORAGE_ERROR,
})  # fmt: skip
_ERROR_CLASSES: dict[int, type[ApplianceError]] = {
    ErrorCode.CORRUPT_MESSAGE: CorruptRecordError,
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION: UnknownTopicOrPartitionError,
    ErrorCode.NOT_LEADER_OR_FOLLOWER: NotLeaderError,
    ErrorCode.REQUEST_TIMED_OUT: RequestTimeoutError,
    ErrorCode.NOT_ENOUGH_REPLICAS: NotEnoughReplicasError,
    ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND: NotEnoughReplicasError,
}
_DUPLICATE_SEQUENCE_NUMBER = 46  # older brokers' answer to a duplicate: appended before, offset unknown


class BatchMetadata(NamedTuple):
    """Where one batch of a send went: its records have offsets ``base_offset .. base_offset + count - 1``
    (``base_offset`` -1 when an old broker answered a duplicate without offsets)."""

    topic: str
    partition: int
    base_offset: int
    record_count: int


@dataclass(eq=False, slots=True)
class _Batch:
    topic: str
    partition: int
    record_count: int
    data: bytearray  # the encoded RecordBatch v2, sent unchanged by every attempt
    base_sequence: int
    created_ns: int
    attempt: int = 0  # bumped by every rewind: answers to older attempts are stale
    sent: bool = False  # the current attempt is in flight
    base_offset: int = -1
    error: ApplianceError | None = None
    done: bool = False


class SendResult:
    """The batches one :meth:`RemoteProducer.send_many` call queued.  :meth:`get` waits for them."""

    def __init__(self, producer: RemoteProducer, batches: list[_Batch]) -> None:
        self._producer = producer
        self._batches = batches

    @property
    def done(self) -> bool:
        return all(b.done for b in self._batches)

    @property
    def record_count(self) -> int:
        return sum(b.record_count for b in self._batches)

    def get(self, timeout: float | None = None) -> list[BatchMetadata]:
        """Wait until every batch is acknowledged or failed; raise the first failure, else return where each
        batch went.  RequestTimeoutError after ``timeout`` seconds (the batches keep going)."""
        self._producer._drive_until(lambda: self.done, timeout)
        failed = [b for b in self._batches if b.error is not None]
        if failed:
            self._producer._failed = [b for b in self._producer._failed if b not in failed]  # reported here
            raise failed[0].error  # type: ignore[misc]
        return [BatchMetadata(b.topic, b.partition, b.base_offset, b.record_count) for b in self._batches]


@dataclass(eq=False)
class _Partition:
    topic: str
    partition: int
    producer_id: int
    producer_epoch: int
    leader: int = -1
    next_sequence: int = 0
    acked_once: bool = False  # a batch under the current producer id was acknowledged
    queue: deque[_Batch] = field(default_factory=deque)  # unacknowledged batches, oldest first
    retry_after_ns: int = 0

    @property
    def name(self) -> str:
        return f"{self.topic}-{self.partition}"

    def in_flight(self) -> int:
        return sum(1 for b in self.queue if b.sent)

    def next_unsent(self) -> _Batch | None:
        for batch in self.queue:
            if not batch.sent:
                return batch
        return None


@dataclass(eq=False)
class _Broker:
    node_id: int
    host: str
    port: int
    connection: KafkaConnection | None = None
    requests: deque[list[tuple[_Batch, int]]] = field(default_factory=deque)  # per request: (batch, attempt)
    retry_after_ns: int = 0


class RemoteProducer:
    """Kafka's idempotent producer over TCP (see the module docstring).  Not thread-safe.

    ``RemoteProducer({"bootstrap.servers": "127.0.0.1:9092", "compression.type": "zstd"})``; settings are
    ``appliance.Producer``'s (:class:`~appliance.client.producer_config.ProducerConfig`, Kafka's names), and
    ``bootstrap.servers`` is required.  A context manager (flush and close on exit).
    """

    def __init__(self, config: Mapping[str, object] | None = None, *,
                 connect: Callable[[str, int], KafkaConnection] | None = None, **kwargs: object) -> None:
        self.config = ProducerConfig.from_settings(config, **kwargs)
        cfg = self.config
        if not cfg.bootstrap_servers:
            raise ConfigError("remote producer: set bootstrap.servers (HOST:PORT of the appliance's broker)")
        try:
            self._bootstrap = parse_bootstrap_servers(cfg.bootstrap_servers)
        except ValueError as exc:
            raise ConfigError(f"producer setting bootstrap.servers: {exc}") from None
        if cfg.acks == 0:
            raise ConfigError("producer setting acks=0 is not supported over bootstrap.servers: use 1 or all")
        self._connect = connect or self._default_connect
        self._brokers: dict[int, _Broker] = {}
        self._bootstrap_connection: KafkaConnection | None = None
        self._partition_counts: dict[str, int] = {}
        self._partitions: dict[tuple[str, int], _Partition] = {}
        self._sticky: dict[str, StickyPartitioner] = {}
        self._leaders: dict[tuple[str, int], int] = {}
        self._buffered_bytes = 0
        self._failed: list[_Batch] = []  # failed batches not yet raised by flush()
        self._closed = False
        self.faults: dict[str, int] = {}
        self.producer_id, self.producer_epoch = NO_PRODUCER_ID, NO_PRODUCER_EPOCH
        if cfg.idempotent:
            self.producer_id, self.producer_epoch = self._init_producer_id()

    # -- connections and metadata ---------------------------------------------------------------------------

    def _default_connect(self, host: str, port: int) -> KafkaConnection:
        cfg = self.config
        return KafkaConnection(host, port, client_id=cfg.client_id or "appliance-remote-producer",
                               connect_timeout_ms=min(cfg.request_timeout_ms, 10_000),
                               request_timeout_ms=cfg.request_timeout_ms)

    def _any_connection(self) -> KafkaConnection:
        for broker in self._brokers.values():
            if broker.connection is not None and not broker.connection.closed and not broker.requests:
                return broker.connection
        if self._bootstrap_connection is not None and not self._bootstrap_connection.closed:
            return self._bootstrap_connection
        errors = []
        for host, port in self._bootstrap:
            try:
                self._bootstrap_connection = self._connect(host, port)
                return self._bootstrap_connection
            except BrokerConnectionError as exc:
                errors.append(str(exc))
        raise BrokerConnectionError("no bootstrap server answered: " + "; ".join(errors))

    def _init_producer_id(self) -> tuple[int, int]:
        deadline = time.monotonic() + self.config.max_block_ms / 1000
        while True:
            response = self._any_connection().request(
                InitProducerIdRequest(transactional_id=None, transaction_timeout_ms=60_000))
            assert isinstance(response, InitProducerIdResponse)
            if response.error_code == ErrorCode.NONE:
                return response.producer_id, response.producer_epoch
            if response.error_code not in _RETRIABLE or time.monotonic() > deadline:
                raise ApplianceError(f"InitProducerId failed: {error_name(response.error_code)}")
            time.sleep(self.config.retry_backoff_ms / 1000)

    def partitions_for(self, topic: str) -> list[int]:
        """The topic's partitions (created first if the broker's ``auto.create.topics.enable`` allows).
        UnknownTopicOrPartitionError if the topic does not exist and cannot be created."""
        if topic not in self._partition_counts:
            self._refresh_metadata([topic])
        return list(range(self._partition_counts[topic]))

    def _refresh_metadata(self, topics: Sequence[str]) -> None:
        names = sorted(set(topics))
        deadline = time.monotonic() + self.config.max_block_ms / 1000
        while True:
            connection = self._any_connection()
            response = connection.request(MetadataRequest(
                topics=[MetadataRequestTopic(name=n) for n in names], allow_auto_topic_creation=True))
            assert isinstance(response, MetadataResponse)
            for node in response.brokers:
                host = node.host or connection.host
                known = self._brokers.get(node.node_id)
                if known is None or (known.host, known.port) != (host, node.port):
                    if known is not None:
                        self._drop_connection(known, "the broker moved")
                    self._brokers[node.node_id] = _Broker(node.node_id, host, node.port)
            pending: dict[str, int] = {}
            for topic in response.topics:
                if topic.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
                    raise UnknownTopicOrPartitionError(
                        f"topic {topic.name!r} does not exist on the cluster at {connection.address} (and "
                        "the broker does not create topics automatically)")
                if topic.error_code == ErrorCode.INVALID_TOPIC_EXCEPTION:
                    raise UnknownTopicOrPartitionError(f"topic {topic.name!r} is not a valid topic name")
                if topic.error_code != ErrorCode.NONE or not topic.partitions:
                    pending[topic.name] = topic.error_code or ErrorCode.LEADER_NOT_AVAILABLE
                    continue
                self._partition_counts[topic.name] = len(topic.partitions)
                for part in topic.partitions:
                    self._leaders[(topic.name, part.partition_index)] = part.leader_id
                    state = self._partitions.get((topic.name, part.partition_index))
                    if state is not None:
                        state.leader = part.leader_id
                    if part.leader_id < 0:
                        pending[topic.name] = part.error_code or ErrorCode.LEADER_NOT_AVAILABLE
            if not pending:
                return
            if time.monotonic() > deadline:
                detail = ", ".join(f"{t}: {error_name(c)}" for t, c in sorted(pending.items()))
                raise RequestTimeoutError(
                    f"metadata not available within max.block.ms {self.config.max_block_ms}: {detail}")
            time.sleep(self.config.retry_backoff_ms / 1000)  # a topic is being created: ask again

    def _partition(self, topic: str, partition: int) -> _Partition:
        key = (topic, partition)
        state = self._partitions.get(key)
        if state is None:
            count = len(self.partitions_for(topic))
            if not 0 <= partition < count:
                raise UnknownTopicOrPartitionError(
                    f"partition {topic}-{partition}: topic {topic!r} has {count} partitions (0..{count - 1})")
            state = _Partition(topic, partition, self.producer_id, self.producer_epoch,
                               leader=self._leaders.get(key, -1))
            self._partitions[key] = state
        return state

    # -- queueing -------------------------------------------------------------------------------------------

    def send_many(self, topic: str, values: Any, keys: Any = None, partition: int | None = None,
                  headers: Sequence[Sequence[tuple[str, bytes | None]]] | HeaderColumns | None = None,
                  timestamps: Any = None) -> SendResult:
        """Queue many records; return a :class:`SendResult` (``.get()`` waits for the acks).

        ``values`` / ``keys``: a list of bytes (None = null), a 2-D ``uint8`` array (one record per row), a
        ``(data, offsets)`` pair or a :class:`ByteColumn`.  ``headers``: per record a list of ``(name,
        value)`` pairs, or :class:`HeaderColumns`.  ``timestamps``: int64 ms per record (default: now).
        Routing: ``partition`` if given; else the murmur2 partition of each key (null keys: sticky); else
        whole batches to a sticky partition.  The records are encoded before this returns.
        """
        self._check_open()
        columns = record_columns(values, keys, headers, timestamps)
        count = columns.values.item_count
        partitions = self.partitions_for(topic)
        if count == 0:
            return SendResult(self, [])
        groups: list[tuple[int | None, np.ndarray | None]]
        if partition is not None:
            if not 0 <= partition < len(partitions):
                raise UnknownTopicOrPartitionError(
                    f"partition {topic}-{partition}: topic {topic!r} has {len(partitions)} partitions")
            groups = [(partition, None)]
        elif columns.keys is not None:
            groups = list(_key_groups(columns.keys, len(partitions), _record_bounds(columns),
                                      self._batch_room(), self._sticky_for(topic)))
        else:
            groups = [(None, None)]
        batches: list[_Batch] = []
        for target, indexes in groups:
            part_columns = columns if indexes is None else take_records(columns, indexes)
            batches += self._queue(topic, target, part_columns)
        self._pump()
        self._apply_back_pressure()
        return SendResult(self, batches)

    def send_columns(self, topic: str, partition: int, columns: RecordColumns) -> SendResult:
        """Queue records already in columns for one partition (cut into batches of ``batch.size``)."""
        self._check_open()
        if columns.values.item_count == 0:
            return SendResult(self, [])
        batches = self._queue(topic, partition, columns)
        self._pump()
        self._apply_back_pressure()
        return SendResult(self, batches)

    def _queue(self, topic: str, target: int | None, columns: RecordColumns) -> list[_Batch]:
        """Encode ``columns`` into batches of about batch.size for ``target`` (None: the sticky partition,
        moving on after each batch) and queue them."""
        cfg = self.config
        room = self._batch_room()
        sizes = _record_bounds(columns)
        if int(sizes.max()) + HEADER_SIZE > cfg.max_request_size:
            big = int(np.argmax(sizes))
            raise InvalidRecordError(
                f"topic {topic}: record {big} takes up to {int(sizes[big])} bytes, more than a batch of "
                f"max.request.size {cfg.max_request_size} bytes holds; nothing of this call was queued")
        batches = []
        for start, stop in _cuts(sizes, room):
            if target is None:
                sticky = self._sticky_for(topic)
                part_index = sticky.current
                sticky.switch(part_index)
            else:
                part_index = target
            state = self._partition(topic, part_index)
            piece = slice_columns(columns, start, stop)
            batch = self._encode(state, piece)
            state.queue.append(batch)
            self._buffered_bytes += len(batch.data)
            batches.append(batch)
        return batches

    def _batch_room(self) -> int:
        """Records-section bytes per batch: batch.size within max.request.size, less the header and the
        worst-case growth of compression."""
        cfg = self.config
        room = min(cfg.batch_size, cfg.max_request_size)
        if cfg.compression:
            room -= compress_bound(cfg.compression, room) - room
        return max(room - HEADER_SIZE, 1)

    def _sticky_for(self, topic: str) -> StickyPartitioner:
        sticky = self._sticky.get(topic)
        if sticky is None:
            sticky = self._sticky[topic] = StickyPartitioner(len(self.partitions_for(topic)))
        return sticky

    def _encode(self, state: _Partition, columns: RecordColumns) -> _Batch:
        cfg = self.config
        count = columns.values.item_count
        idempotent = state.producer_id >= 0
        data = bytearray(build(
            columns, producer_id=state.producer_id, producer_epoch=state.producer_epoch,
            base_sequence=state.next_sequence if idempotent else NO_SEQUENCE,
            compression=cfg.compression, compression_level=cfg.compression_level,
        ))  # fmt: skip
        batch = _Batch(state.topic, state.partition, count, data, state.next_sequence, time.monotonic_ns())
        if idempotent:
            state.next_sequence = (state.next_sequence + count) % _SEQUENCE_MODULUS
        return batch

    def _apply_back_pressure(self) -> None:
        if self._buffered_bytes <= _MAX_BUFFERED_BYTES:
            return
        try:
            self._drive_until(lambda: self._buffered_bytes <= _MAX_BUFFERED_BYTES,
                              self.config.max_block_ms / 1000)
        except RequestTimeoutError:
            raise BackPressureError(
                f"remote producer: {self._buffered_bytes} bytes of batches still unacknowledged after "
                f"max.block.ms {self.config.max_block_ms}; the records were queued, slow down") from None

    # -- progress -------------------------------------------------------------------------------------------

    def poll(self, timeout_ms: float = 0) -> int:
        """Send what can be sent and read the responses that arrive within ``timeout_ms``; the number of
        batches that finished."""
        self._check_open()
        return self._pump(timeout_ms / 1000)

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every queued batch is acknowledged or failed; raise the first failure not raised yet
        (by an earlier flush or :meth:`SendResult.get`).  RequestTimeoutError after ``timeout`` seconds."""
        self._check_open()
        self._drive_until(lambda: not any(s.queue for s in self._partitions.values()), timeout)
        failed = [b for b in self._failed if b.error is not None]
        self._failed.clear()
        if failed:
            raise failed[0].error  # type: ignore[misc]

    def _drive_until(self, finished: Callable[[], bool], timeout: float | None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not finished():
            remaining = 0.05 if deadline is None else min(0.05, deadline - time.monotonic())
            if remaining <= 0:
                unacked = sum(len(s.queue) for s in self._partitions.values())
                raise RequestTimeoutError(f"remote producer: {unacked} batches not acknowledged within "
                                          f"{timeout} s; they keep going")
            self._pump(remaining)

    def _pump(self, wait_s: float = 0.0) -> int:
        """One round: expire old batches, send requests, read responses (waiting up to ``wait_s``)."""
        now = time.monotonic_ns()
        self._expire(now)
        self._send_requests(now)
        return self._read_responses(wait_s)

    def _expire(self, now_ns: int) -> None:
        limit_ns = self.config.delivery_timeout_ms * 1_000_000
        for state in self._partitions.values():
            if state.queue and now_ns - state.queue[0].created_ns > limit_ns:
                first = state.queue[0]
                error = RequestTimeoutError(
                    f"partition {state.name}: batch of {first.record_count} records (sequence "
                    f"{first.base_sequence}) not acknowledged within delivery.timeout.ms "
                    f"{self.config.delivery_timeout_ms}; it may or may not have been appended")
                for batch in list(state.queue):
                    self._finish(state, batch, error=error if batch is first else RequestTimeoutError(
                        f"partition {state.name}: batch (sequence {batch.base_sequence}) queued behind one "
                        "whose outcome is unknown; not sent"))
                    batch.attempt += 1
                if state.producer_id >= 0:  # sequences after an unknown outcome: start afresh
                    state.producer_id, state.producer_epoch = self._init_producer_id()
                    state.next_sequence = 0
                    state.acked_once = False

    def _send_requests(self, now_ns: int) -> None:
        cfg = self.config
        by_leader: dict[int, list[_Partition]] = {}
        for state in self._partitions.values():
            if state.queue and now_ns >= state.retry_after_ns:
                by_leader.setdefault(state.leader, []).append(state)
        if -1 in by_leader:
            self._refresh_metadata(sorted({s.topic for s in by_leader[-1]}))
            return
        for node_id, states in by_leader.items():
            broker = self._brokers.get(node_id)
            if broker is None:
                self._refresh_metadata(sorted({s.topic for s in states}))
                return
            if now_ns < broker.retry_after_ns:
                continue
            while len(broker.requests) < min(cfg.max_in_flight, 5 if cfg.idempotent else cfg.max_in_flight):
                picked: list[tuple[_Batch, int]] = []
                size = 0
                for state in states:
                    limit = cfg.max_in_flight if state.acked_once else 1
                    batch = state.next_unsent()
                    if batch is None or state.in_flight() >= limit:
                        continue
                    if picked and size + len(batch.data) > _MAX_REQUEST_BYTES:
                        continue
                    picked.append((batch, batch.attempt))
                    size += len(batch.data)
                if not picked:
                    break
                if not self._send(broker, picked):
                    break

    def _send(self, broker: _Broker, picked: list[tuple[_Batch, int]]) -> bool:
        topics: dict[str, list[PartitionProduceData]] = {}
        for batch, _ in picked:
            topics.setdefault(batch.topic, []).append(PartitionProduceData(index=batch.partition,
                                                                           records=batch.data))
        request = ProduceRequest(
            transactional_id=None, acks=self.config.acks, timeout_ms=self.config.request_timeout_ms,
            topic_data=[TopicProduceData(name=t, partition_data=p) for t, p in topics.items()],
        )  # fmt: skip
        try:
            if broker.connection is None or broker.connection.closed:
                broker.connection = self._connect(broker.host, broker.port)
            broker.connection.send(request)
        except (BrokerConnectionError, RequestTimeoutError, ProtocolError) as exc:
            self._connection_lost(broker, str(exc))
            return False
        for batch, _ in picked:
            batch.sent = True
        broker.requests.append(picked)
        return True

    def _read_responses(self, wait_s: float) -> int:
        finished = 0
        deadline = time.monotonic() + wait_s
        while True:
            waiting = [b for b in self._brokers.values() if b.requests and b.connection is not None]
            if not waiting:
                if wait_s > 0 and any(s.queue for s in self._partitions.values()):
                    time.sleep(max(0.0, min(deadline - time.monotonic(), 0.005)))
                return finished
            got_any = False
            for broker in waiting:
                assert broker.connection is not None
                try:
                    response = broker.connection.receive(wait_ms=0)
                except (BrokerConnectionError, RequestTimeoutError, ProtocolError) as exc:
                    self._connection_lost(broker, str(exc))
                    continue
                if response is None:
                    continue
                if self.faults.get("lose-response", 0) > 0:  # the answer is lost on its way back
                    self.faults["lose-response"] -= 1
                    self._connection_lost(broker, "fault point lose-response")
                    continue
                got_any = True
                assert isinstance(response, ProduceResponse)
                finished += self._handle_response(broker, broker.requests.popleft(), response)
            if got_any:
                self._send_requests(time.monotonic_ns())
                continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return finished
            fds = [b.connection.fileno() for b in waiting if b.connection is not None]
            if fds:
                select.select(fds, [], [], min(remaining, 0.05))

    def _handle_response(self, broker: _Broker, picked: list[tuple[_Batch, int]],
                         response: ProduceResponse) -> int:
        answers: dict[tuple[str, int], Any] = {}
        for topic in response.responses:
            for part in topic.partition_responses:
                answers[(topic.name, part.index)] = part
        finished = 0
        refresh: set[str] = set()
        for batch, attempt in picked:
            if batch.attempt != attempt or batch.done:
                continue  # answered after a rewind: the batch is being sent again
            state = self._partitions[(batch.topic, batch.partition)]
            answer = answers.get((batch.topic, batch.partition))
            code = ErrorCode.NETWORK_EXCEPTION if answer is None else answer.error_code
            if code == ErrorCode.NONE or code == _DUPLICATE_SEQUENCE_NUMBER:
                base = answer.base_offset if answer is not None and code == ErrorCode.NONE else -1
                self._finish(state, batch, base_offset=base)
                finished += 1
            elif code in _RETRIABLE:
                if code in (ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                            ErrorCode.LEADER_NOT_AVAILABLE):
                    refresh.add(batch.topic)
                self._rewind(state)
            elif code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER and state.queue[0] is not batch:
                self._rewind(state)  # an earlier batch of this partition is being sent again
            else:
                detail = answer.error_message if answer is not None and answer.error_message else ""
                cls = _ERROR_CLASSES.get(code, InvalidRecordError if code > 0 else ApplianceError)
                self._fail_and_renumber(state, batch, cls(
                    f"partition {state.name}: batch of {batch.record_count} records (sequence "
                    f"{batch.base_sequence}) refused by the broker at {broker.host}:{broker.port}: "
                    f"{error_name(code)}" + (f": {detail}" if detail else "")))
                finished += 1
        if refresh:
            try:
                self._refresh_metadata(sorted(refresh))
            except UnknownTopicOrPartitionError as exc:
                for state in self._partitions.values():
                    if state.topic in refresh:
                        for batch in list(state.queue):
                            self._finish(state, batch, error=UnknownTopicOrPartitionError(str(exc)))
        return finished

    # -- outcomes -------------------------------------------------------------------------------------------

    def _finish(self, state: _Partition, batch: _Batch, *, base_offset: int = -1,
                error: ApplianceError | None = None) -> None:
        batch.done, batch.sent = True, False
        batch.base_offset, batch.error = base_offset, error
        if batch in state.queue:
            state.queue.remove(batch)
            self._buffered_bytes -= len(batch.data)
        if error is None:
            state.acked_once = True
        else:
            self._failed.append(batch)

    def _rewind(self, state: _Partition) -> None:
        """Send every unacknowledged batch of the partition again, in order, after retry.backoff.ms."""
        for batch in state.queue:
            if batch.sent:
                batch.sent = False
                batch.attempt += 1
        state.retry_after_ns = time.monotonic_ns() + self.config.retry_backoff_ms * 1_000_000

    def _fail_and_renumber(self, state: _Partition, failed: _Batch, error: ApplianceError) -> None:
        """``failed`` was not appended: the batches behind it take its sequence numbers and go again."""
        behind = [b for b in state.queue if b is not failed and b.base_sequence != failed.base_sequence]
        self._finish(state, failed, error=error)
        if state.producer_id < 0:
            return
        shift = failed.record_count
        for batch in behind:
            batch.base_sequence = (batch.base_sequence - shift) % _SEQUENCE_MODULUS
            view = memoryview(batch.data)
            view[BASE_SEQUENCE_OFFSET : BASE_SEQUENCE_OFFSET + 4] = batch.base_sequence.to_bytes(4, "big")
            write_crc(view, 0, len(batch.data))
        state.next_sequence = (state.next_sequence - shift) % _SEQUENCE_MODULUS
        self._rewind(state)

    def _connection_lost(self, broker: _Broker, why: str) -> None:
        """The outcome of every request in flight on ``broker`` is unknown: send them all again."""
        touched = {(b.topic, b.partition) for request in broker.requests for b, _ in request}
        self._drop_connection(broker, why)
        broker.retry_after_ns = time.monotonic_ns() + self.config.retry_backoff_ms * 1_000_000
        for key in touched:
            self._rewind(self._partitions[key])

    @staticmethod
    def _drop_connection(broker: _Broker, why: str) -> None:
        del why  # kept for a debugger; the batches say what happened
        if broker.connection is not None:
            broker.connection.close()
        broker.connection = None
        broker.requests.clear()

    # -- lifetime -------------------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the remote producer is closed")

    def close(self, timeout: float | None = None) -> None:
        """Flush (up to ``timeout`` seconds, default delivery.timeout.ms) and close the connections.  Raises
        the first delivery failure not yet raised."""
        if self._closed:
            return
        try:
            self.flush(self.config.delivery_timeout_ms / 1000 if timeout is None else timeout)
        finally:
            self._closed = True
            for broker in self._brokers.values():
                self._drop_connection(broker, "closed")
            if self._bootstrap_connection is not None:
                self._bootstrap_connection.close()

    def discard(self) -> None:
        """Close the connections without waiting: unacknowledged batches are abandoned (each may or may not
        be appended).  For giving up after an error."""
        self._closed = True
        for broker in self._brokers.values():
            self._drop_connection(broker, "discarded")
        if self._bootstrap_connection is not None:
            self._bootstrap_connection.close()

    def __enter__(self) -> RemoteProducer:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.discard()

    def __repr__(self) -> str:
        unacked = sum(len(s.queue) for s in self._partitions.values())
        state = "closed" if self._closed else f"{unacked} unacknowledged batches"
        return f"RemoteProducer({self.config.bootstrap_servers!r}, producer id {self.producer_id}, {state})"


# -- columns ----------------------------------------------------------------------------------------------


def _column(items: Any, what: str) -> ByteColumn:
    if isinstance(items, ByteColumn):
        return items
    if isinstance(items, np.ndarray):
        if items.ndim != 2:
            raise ValueError(f"send_many {what}: a numpy array must be 2-D (one record per row), got "
                             f"{items.ndim}-D")
        rows = np.ascontiguousarray(items).view(np.uint8).reshape(len(items), -1)
        return ByteColumn(rows.reshape(-1), np.arange(len(rows) + 1, dtype=np.int64) * rows.shape[1])
    if isinstance(items, tuple) and len(items) == 2 and isinstance(items[1], np.ndarray):
        data, offsets = items
        if isinstance(data, np.ndarray):
            data = data.reshape(-1).view(np.uint8)
        else:
            data = np.frombuffer(data, np.uint8)
        return ByteColumn(data, np.ascontiguousarray(offsets, np.int64))
    if isinstance(items, list | tuple):
        for item in items:
            if item is not None and not isinstance(item, bytes | bytearray | memoryview):
                raise TypeError(f"send_many {what}: items must be bytes or None, got {type(item).__name__}; "
                                "encode text first")
        return ByteColumn.from_list(items)
    raise TypeError(f"send_many {what}: expected a list of bytes, a 2-D uint8 array, (data, offsets) or a "
                    "ByteColumn")


def record_columns(values: Any, keys: Any = None,
                   headers: Sequence[Sequence[tuple[str, bytes | None]]] | HeaderColumns | None = None,
                   timestamps: Any = None) -> RecordColumns:
    """``send_many``'s arguments as :class:`RecordColumns` (no copy for arrays and columns), checked for
    equal lengths."""
    value_column = _column(values, "values")
    count = value_column.item_count
    key_column = None if keys is None else _column(keys, "keys")
    header_columns = None
    if headers is not None:
        header_columns = headers if isinstance(headers, HeaderColumns) else HeaderColumns.from_lists(headers)
    stamps = None if timestamps is None else np.ascontiguousarray(timestamps, np.int64)
    for name, length in (("keys", None if key_column is None else key_column.item_count),
                         ("headers", None if header_columns is None else len(header_columns.offsets) - 1),
                         ("timestamps", None if stamps is None else len(stamps))):
        if length is not None and length != count:
            raise ValueError(f"send_many {name}: {length} entries for {count} values")
    return RecordColumns(value_column, key_column, header_columns, stamps)


def _record_bounds(columns: RecordColumns) -> np.ndarray:
    """An upper bound of the bytes each record takes in a batch (batch cutting)."""
    sizes = np.diff(np.asarray(columns.values.offsets, np.int64)) + _RECORD_OVERHEAD_BYTES
    if columns.keys is not None:
        sizes += np.diff(np.asarray(columns.keys.offsets, np.int64))
    headers = columns.headers
    if headers is not None and len(headers.keys.offsets) > 1:
        each = (np.diff(np.asarray(headers.keys.offsets, np.int64))
                + np.diff(np.asarray(headers.values.offsets, np.int64)) + _HEADER_OVERHEAD_BYTES)
        cumulative = np.concatenate(([0], np.cumsum(each)))
        index = np.asarray(headers.offsets, np.int64)
        sizes += cumulative[index[1:]] - cumulative[index[:-1]]
    return sizes


def _cuts(sizes: np.ndarray, room_bytes: int) -> list[tuple[int, int]]:
    """``[start, stop)`` record ranges whose bounds sum to at most ``room_bytes`` (at least one record)."""
    cuts = []
    total = np.concatenate(([0], np.cumsum(sizes)))
    start, count = 0, len(sizes)
    while start < count:
        stop = int(np.searchsorted(total, total[start] + room_bytes, side="right")) - 1
        stop = min(max(stop, start + 1), count)
        cuts.append((start, stop))
        start = stop
    return cuts


def slice_columns(columns: RecordColumns, start: int, stop: int) -> RecordColumns:
    """Records ``start:stop`` as views (offsets keep pointing into the same data)."""
    def cut(column: ByteColumn | None) -> ByteColumn | None:
        if column is None:
            return None
        nulls = None if column.nulls is None else column.nulls[start:stop]
        return ByteColumn(column.data, column.offsets[start : stop + 1], nulls)

    headers = None
    if columns.headers is not None:
        headers = HeaderColumns(columns.headers.offsets[start : stop + 1], columns.headers.keys,
                                columns.headers.values)
    values = cut(columns.values)
    assert values is not None
    stamps = None if columns.timestamps is None else columns.timestamps[start:stop]
    return RecordColumns(values, cut(columns.keys), headers, stamps)


@numba.njit(cache=True)
def _gather(data: np.ndarray, offsets: np.ndarray, picks: np.ndarray, out: np.ndarray,
            out_offsets: np.ndarray) -> int:
    """Copy the strings ``picks`` of a column back to back into ``out``; fill ``out_offsets``.  Returns the
    bytes copied (``out`` is sized by the caller from the same offsets)."""
    at = 0
    out_offsets[0] = 0
    for i in range(picks.size):
        start = offsets[picks[i]]
        end = offsets[picks[i] + 1]
        for k in range(end - start):
            out[np.uint64(at + k)] = data[np.uint64(start + k)]
        at += end - start
        out_offsets[i + 1] = at
    return at


def _take(column: ByteColumn, indexes: np.ndarray) -> ByteColumn:
    offsets = np.ascontiguousarray(column.offsets, np.int64)
    picks = np.ascontiguousarray(indexes, np.int64)
    out = np.empty(int((offsets[picks + 1] - offsets[picks]).sum()), np.uint8)
    out_offsets = np.empty(len(picks) + 1, np.int64)
    _gather(np.ascontiguousarray(column.data, np.uint8), offsets, picks, out, out_offsets)
    nulls = None if column.nulls is None else np.asarray(column.nulls, np.bool_)[picks]
    return ByteColumn(out, out_offsets, nulls)


def take_records(columns: RecordColumns, indexes: np.ndarray) -> RecordColumns:
    """The records at ``indexes``, copied into new columns (grouping by partition)."""
    headers = None
    if columns.headers is not None:
        h = columns.headers
        index = np.asarray(h.offsets, np.int64)
        counts = index[indexes + 1] - index[indexes]
        header_picks = np.repeat(index[indexes], counts) + (
            np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts))
        new_index = np.zeros(len(indexes) + 1, np.int64)
        np.cumsum(counts, out=new_index[1:])
        headers = HeaderColumns(new_index, _take(h.keys, header_picks), _take(h.values, header_picks))
    keys = None if columns.keys is None else _take(columns.keys, indexes)
    stamps = None if columns.timestamps is None else columns.timestamps[indexes]
    return RecordColumns(_take(columns.values, indexes), keys, headers, stamps)


def _key_groups(keys: ByteColumn, partitions: int, sizes: np.ndarray, room_bytes: int,
                sticky: StickyPartitioner) -> list[tuple[int, np.ndarray]]:
    """Record indexes per partition, each in send order: keyed records by murmur2 of the key (as Kafka);
    records with a null key in runs of about a batch, each run to the sticky partition of its time."""
    targets = np.empty(keys.item_count, np.int64)
    code = murmur2_column(np.ascontiguousarray(keys.data, np.uint8),
                          np.ascontiguousarray(keys.offsets, np.int64), partitions, targets)
    if code < 0:
        raise ValueError(f"send_many keys: offsets entry {-1 - code + 1} is decreasing or past the data")
    if keys.nulls is not None and bool(np.any(keys.nulls)):
        unkeyed = np.flatnonzero(np.asarray(keys.nulls, np.bool_))
        for start, stop in _cuts(sizes[unkeyed], room_bytes):
            targets[unkeyed[start:stop]] = sticky.current
            sticky.switch(sticky.current)
    order = np.argsort(targets, kind="stable")
    bounds = np.flatnonzero(np.diff(targets[order])) + 1
    return [(int(targets[chunk[0]]), chunk) for chunk in np.split(order, bounds)]
