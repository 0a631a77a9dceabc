"""``appliance.Producer``: Kafka's producer, for processes on the appliance's host over shared-memory rings,
and for any host over TCP to a broker (``bootstrap.servers``): the same API and guarantees either way.

Theory of operation
-------------------
**Where records go.**  A *route* (``appliance.client.route``) finds a topic's partitions, gives the
producer its id, and opens one *channel* per partition the producer sends to.  The local route (the
default) connects to the supervisor's control socket (``appliance.control.socket``, default
``<appliance.data.dir>/.appliance.sock``) and asks it, per partition, for a ring that partition's writer
serves (``appliance.control``).  Everything after that is shared memory: batches go into the ring
(``ipc.ring_publisher``), the writer appends them and answers each with its base offset (or an error code)
in the ring's ack slots.  Keep the producer open while producing: the control connection is what keeps its
rings alive.  Given ``bootstrap.servers`` the route is ``appliance.client.tcp_route.TcpRoute``: Metadata
and InitProducerId from the brokers, one connection per partition to its leader, one Produce request per
batch.  Nothing else in the producer knows which route carries its batches.

**The per-record path** (``send`` with a value and nothing else) takes no lock: it takes the producer's
*append token* (``accumulator.AppendToken``: one atomic ``list.pop``, given back with one ``list.append``),
appends the value to the open batch of the topic's sticky partition (a Python list), counts the room left,
and returns a :class:`RecordHandle` pointing at (batch, index) (what each step costs: docs/performance.md,
"The producer: figures behind its design").  Sealing needs the token too, so no other thread (the timer, a
flush, another sender) seals a batch between a send reading it and appending to it; a send that finds the
token taken, its batch full, or its batch empty (the first record starts ``linger.ms``) goes the general
way, under the lock.  Everything else waits for the batch to be *sealed*: when the next record would pass
``batch.size``, when ``linger.ms`` has passed since its first record, or on ``flush``/``get``.  Then the
whole batch is encoded at once by ``storage.batch_builder``'s numba kernels straight into the channel's
frame (reserve -> build -> commit), with the producer id, epoch and the partition's next sequence number; a
value-only batch is handed over as its list, whose values the builder reads where they lie (no
``b"".join``, no per-record ``len``): each value is copied once, into the ring.  Records with keys,
headers, timestamps, callbacks or an explicit partition take the general path; ``send_many`` hands whole
columns (lists, 2-D arrays, buffer + offsets: ``appliance.client.bulk_columns``) to the builder without
ever creating one Python object per record, each partition's records in the order given.

**Publishing, acks, lingering and waiting** are the sender's (``appliance.client.sender``): it publishes
sealed batches, collects acks on the caller's thread and on one background thread, seals batches whose
``linger.ms`` ran out when their partition can take them, and recovers from refusals, failed channels and
an appliance that went away.

**Order and exactly once.**  Records sent to one partition are appended in the order sent.  With
``enable.idempotence`` (the default with ``acks=all``) every batch carries the producer id, epoch and its
first sequence number; at most ``max.in.flight.requests.per.connection`` (5) batches per partition await
acks, the number the writer remembers per producer.  A batch is never rebuilt differently: a retry (an error
ack with a retriable code, a channel that failed, an appliance restart) publishes the same records with the
same sequence, so a batch that was appended before is acknowledged with its first offsets instead of
appended again.  After a non-retriable error the batches behind the failed one are re-numbered and sent
again in order (``appliance.client.partition_queue``).  A writer restart needs nothing from the producer:
the ring outlives the writer, and the new writer reads the unacknowledged frames again.

**Callbacks** run once per record, when its batch is acknowledged or failed, on whichever thread collected
the answer (the caller's, or the sender's timer thread), under the producer's lock: keep them short; a
callback may send.  As in Kafka, the callbacks of records sent to one partition run in send order (also when
a callback sends, calls ``get`` or ``flush``, which collect acks: those batches' callbacks run after the
running batch's), those of different partitions in no particular order, and a handle is done, ``get``
returns and ``flush`` returns only after the record's callback ran (``accumulator.CallbackQueue``).

**Back-pressure and time-outs.**  A full ring (the writer is slower, stopped, or gone; over TCP, every
in-flight slot taken) blocks ``send`` for up to ``max.block.ms``, then raises :class:`BackPressureError`;
the record that raised was not accepted, the ones before it were.  A batch not acknowledged within
``delivery.timeout.ms`` of its creation fails with :class:`RequestTimeoutError`: its outcome is unknown (it
may still be appended).  ``acks=0`` never waits for acks (handles resolve with offset -1 as soon as the
batch is in the ring) but never drops either; it is local only (a Produce with acks=0 has no answer).

``acks=1`` and ``acks=all`` behave the same while partitions have no followers: the writer acknowledges
after appending, and the high watermark equals the log end offset.  With followers ``all`` waits for the
high watermark (``appliance.client.commit_channel``; over TCP, the broker does).  As in Kafka, idempotence
needs ``acks=all``: left at its default it is switched off for ``acks`` 0 or 1, asked for explicitly with
them it is a configuration error.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from appliance.client.accumulator import (
    RECORD_ESTIMATE_BYTES,
    SEALED,
    TIMESTAMP_ESTIMATE_BYTES,
    AppendToken,
    BulkHandle,
    BulkMetadata,
    Callback,
    CallbackQueue,
    ColumnBatch,
    Header,
    ProducerBatch,
    RecordHandle,
    RecordMetadata,
    as_bytes,
    check_headers,
    record_payload,
)
from appliance.client.bulk_columns import (
    batch_cuts,
    bulk_columns,
    key_partitions,
    partition_groups,
    record_bounds,
    slice_columns,
    take_records,
)
from appliance.client.partition_queue import PartitionQueue
from appliance.client.partitioner import KeyPartitioner, StickyPartitioner
from appliance.client.producer_config import DEFAULTS, ProducerConfig
from appliance.client.route import LocalRoute, Route
from appliance.client.sender import Sender
from ipc.control import ControlError
from storage.batch_builder import HeaderColumns, RecordColumns
from storage.batch_header import HEADER_SIZE
from storage.errors import (
    ApplianceError,
    InvalidRecordError,
    RequestTimeoutError,
    UnknownTopicOrPartitionError,
)

__all__ = [
    "DEFAULTS",
    "BulkHandle",
    "BulkMetadata",
    "Producer",
    "ProducerConfig",
    "RecordHandle",
    "RecordMetadata",
]

_new_handle = object.__new__


class _Topic:
    __slots__ = ("batch_room", "keys", "max_message_bytes", "name", "partitions", "sticky", "sticky_batch")

    def __init__(self, name: str, max_message_bytes: int, batch_room: int) -> None:
        self.name = name
        self.max_message_bytes = max_message_bytes
        self.batch_room = batch_room  # records-section bytes per batch: batch.size within max.message.bytes
        self.partitions: list[PartitionQueue] = []
        self.sticky: StickyPartitioner
        self.keys: KeyPartitioner
        self.sticky_batch: ProducerBatch  # the open batch of the sticky partition (the per-record path's)


class Producer:
    """Kafka's producer for the appliance.  See the module docstring; settings in :data:`DEFAULTS`.

    ``Producer({"acks": "all", "linger.ms": 5})`` or ``Producer(acks="all", linger_ms=5)``; over TCP
    ``Producer({"bootstrap.servers": "host:9092"})``.  A context manager (``close`` on exit).  Thread-safe.
    """

    def __init__(self, config: Mapping[str, object] | None = None, *, route: Route | None = None,
                 **kwargs: object) -> None:
        self.config = ProducerConfig.from_settings(config, **kwargs)
        cfg = self.config
        if route is None:
            if cfg.bootstrap_servers:
                from appliance.client.tcp_route import TcpRoute

                route = TcpRoute(cfg)
            else:
                route = LocalRoute(cfg.control_socket, timeout_ms=cfg.max_block_ms)
        self._route: Route = route
        self._lock = threading.RLock()
        self._token = AppendToken()  # who may append to or seal open batches (see AppendToken)
        self._completions = CallbackQueue()  # runs the callbacks of completed batches, batch by batch
        self._topics: dict[str, _Topic] = {}
        self._all_topics: dict[str, _Topic] = {}  # kept after close (for error messages)
        self._lingering: dict[PartitionQueue, None] = {}  # open batch has records: oldest first
        self._closed = False
        self._send_at_once = cfg.linger_ms == 0  # a batch goes as soon as it can (Sender.send_now)
        try:
            self.producer_id, self.producer_epoch = route.init_producer_id()
        except BaseException:
            route.close()
            raise
        self._sender = Sender(cfg, route, self._lock, producer_id=self.producer_id,
                              producer_epoch=self.producer_epoch, lingering=self._lingering, seal=self._seal)
        self._waiter = self._sender.await_batches  # how this producer's handles wait (BatchWaiter)

    # -- the per-record path --------------------------------------------------------------------------------

    def send(
        self,
        topic: str,
        value: bytes | bytearray | memoryview | None,
        key: bytes | bytearray | memoryview | None = None,
        headers: Sequence[Header] | None = None,
        partition: int | None = None,
        timestamp: int | None = None,
        callback: Callback | None = None,
    ) -> RecordHandle:
        """Queue one record; return a handle resolving to its :class:`RecordMetadata`.

        ``callback(error, metadata)`` runs once it is acknowledged (error None) or failed.  ``timestamp``
        is CreateTime in ms (default: the clock when its batch got its first record).  Raises
        BackPressureError after ``max.block.ms`` of a full ring, InvalidRecordError for a record larger
        than ``max.request.size``, TypeError for a value that is not bytes; then the record was not queued.
        """
        state = self._topics.get(topic)
        if (state is None or value.__class__ is not bytes or key is not None or partition is not None
                or headers is not None or timestamp is not None or callback is not None):
            return self._send_general(topic, value, key, headers, partition, timestamp, callback)
        free = self._token.free
        try:
            free.pop()  # take the append token (see AppendToken); held: the general path waits for it
        except IndexError:
            return self._send_general(topic, value, None, None, None, None, None)
        batch = state.sticky_batch  # (open while we hold the token)
        values = batch.values
        index = len(values)
        room = batch.room_bytes - len(value) - batch.record_bytes
        if room < 0 or index == 0:  # full, or its first record (starts linger.ms): the general path
            free.append(None)
            return self._send_general(topic, value, None, None, None, None, None)
        values.append(value)
        batch.room_bytes = room
        free.append(None)
        handle = _new_handle(RecordHandle)  # (no __init__ frame: cheaper than calling the class)
        handle._batch = batch
        handle._index = index
        return handle

    def _send_general(
        self,
        topic: str,
        value: bytes | bytearray | memoryview | None,
        key: bytes | bytearray | memoryview | None,
        headers: Sequence[Header] | None,
        partition: int | None,
        timestamp: int | None,
        callback: Callback | None,
    ) -> RecordHandle:
        value = as_bytes(value, "value")
        key = as_bytes(key, "key")
        if headers is not None:
            headers = check_headers(headers)
        if timestamp is not None and (not isinstance(timestamp, int) or timestamp < 0):
            raise ValueError(f"timestamp {timestamp!r}: expected milliseconds since the epoch (>= 0)")
        if callback is not None and not callable(callback):
            raise TypeError(f"callback {callback!r} is not callable")
        with self._lock:
            state = self._topic(topic)
            part = None
            if partition is not None:
                part = state.partitions[_check_partition(state, partition)]
            elif key is not None:
                part = state.partitions[state.keys.partition(key)]
            payload = record_payload(value, key, headers)
            timestamped = timestamp is not None
            token = self._token
            free = token.free
            while True:
                try:
                    free.pop()  # (token.take() without a call, when nobody holds it)
                except IndexError:
                    token.take()
                try:
                    batch = part.open if part is not None else state.sticky_batch
                    if batch.room_bytes >= batch.needs(payload, timestamped):
                        if not batch.values:
                            self._first_record(state.partitions[batch.partition], batch)
                        index = batch.append(value, key, headers, timestamp, callback)
                        break
                    if not batch.values:  # larger than batch.size: alone in a batch, within max.request.size
                        self._check_fits(state, state.partitions[batch.partition], payload, timestamped)
                        self._first_record(state.partitions[batch.partition], batch)
                        index = batch.append(value, key, headers, timestamp, callback)
                        break
                finally:
                    free.append(None)  # token.give()
                self._make_room(state, state.partitions[batch.partition], payload, timestamped)
            if index == 0 and self._send_at_once:
                self._sender.send_now(state.partitions[batch.partition])
        return RecordHandle(batch, index)

    def _topic(self, name: str) -> _Topic:
        """The topic's state, asking the appliance for its partitions the first time."""
        state = self._topics.get(name)
        if state is not None:
            return state
        self._check_open()
        if not isinstance(name, str):
            raise TypeError(f"topic {name!r}: expected a str")
        try:
            count, max_message_bytes = self._route.partitions_for(name)
        except ControlError:
            if self._route.alive():
                raise
            self._sender.reconnect()
            count, max_message_bytes = self._route.partitions_for(name)
        state = _Topic(name, max_message_bytes, self.config.batch_room(max_message_bytes))
        state.partitions = [PartitionQueue(name, i, self._new_batch(state, i)) for i in range(count)]
        state.sticky = StickyPartitioner(count)
        state.keys = KeyPartitioner(count)
        state.sticky_batch = state.partitions[state.sticky.current].open
        self._topics[name] = self._all_topics[name] = state
        self._sender.add_topic(name, state.partitions)
        return state

    def _new_batch(self, topic: _Topic, partition: int) -> ProducerBatch:
        return ProducerBatch(self._waiter, topic.name, partition, topic.batch_room,
                             completions=self._completions)

    def _first_record(self, part: PartitionQueue, batch: ProducerBatch) -> None:
        """A batch gets its first record: start its linger clock, make sure the timer thread will seal it
        (at linger.ms=0 the caller tries first, see ``Sender.send_now``; the timer only for a batch held)."""
        batch.started()
        self._lingering[part] = None
        if not self._send_at_once:
            self._sender.wake_by(batch.first_append_ns + self.config.linger_ms * 1_000_000)

    def _make_room(self, state: _Topic, part: PartitionQueue, payload_bytes: int, timestamped: bool) -> None:
        """A record of ``payload_bytes`` does not fit the open batch of ``part``: seal it (unless a flush or
        the timer did meanwhile) and publish what is sealed.  Raises InvalidRecordError for a record no
        batch can hold, BackPressureError when publishing blocked for max.block.ms; then nothing changed
        for this record."""
        self._check_fits(state, part, payload_bytes, timestamped)
        batch = part.open
        if batch.values and batch.room_bytes < batch.needs(payload_bytes, timestamped):
            self._seal(part)
        self._sender.publish_pending(part, self.config.max_block_ms)

    def _check_fits(self, state: _Topic, part: PartitionQueue, payload_bytes: int, timestamped: bool) -> None:
        """InvalidRecordError for a record no batch can hold (ApplianceError once closed)."""
        self._check_open()
        limit = min(self.config.max_request_size, state.max_message_bytes)
        largest = payload_bytes + RECORD_ESTIMATE_BYTES + (TIMESTAMP_ESTIMATE_BYTES if timestamped else 0)
        if largest + HEADER_SIZE > limit:
            raise InvalidRecordError(
                f"topic {part.name}: a record of up to {largest} bytes does "
                f"not fit a batch of max.request.size {self.config.max_request_size} / max.message.bytes "
                f"{state.max_message_bytes}; it was not sent"
            )

    def _seal(self, part: PartitionQueue) -> None:
        """Close the open batch of ``part`` (it has records) and queue it for publishing (with the producer's
        lock held)."""
        with self._token:
            batch = part.open
            batch.state = SEALED
            part.sealed.append(batch)
            self._sender.pending(part)
            self._lingering.pop(part, None)
            topic = self._all_topics[part.topic_name]
            part.open = self._new_batch(topic, part.index)
            if topic.sticky.current == part.index:
                topic.sticky_batch = topic.partitions[topic.sticky.switch(part.index)].open

    def flush(self, timeout: float | None = None) -> None:
        """Send every queued record now and wait until each is acknowledged or failed.

        Raises RequestTimeoutError after ``timeout`` seconds (records keep going).  Delivery errors are
        reported through handles and callbacks, not raised here.
        """
        with self._lock:
            for state in self._topics.values():
                for part in state.partitions:
                    if part.open.values:
                        self._seal(part)
            waiting = self._sender.unacknowledged()
        self._waiter(waiting, timeout)

    # -- bulk -----------------------------------------------------------------------------------------------

    def send_many(
        self,
        topic: str,
        values: Any,
        keys: Any = None,
        partition: int | None = None,
        headers: Sequence[Sequence[Header]] | HeaderColumns | None = None,
        timestamps: Any = None,
        callback: Callback | None = None,
    ) -> BulkHandle:
        """Queue many records at once; return one handle resolving to :class:`BulkMetadata`.

        ``values`` (and ``keys``): a list of bytes (None = null), a 2-D ``uint8`` array of fixed-size
        records (one per row), a ``(data, offsets)`` pair (record ``i`` is ``data[offsets[i]:offsets[i+1]]``)
        or a :class:`ByteColumn`.  ``timestamps``: int64 ms per record (default: now).  Records are cut into
        batches of about ``batch.size`` bytes; with keys each goes to its key's partition (records with a
        null key in runs of about a batch to the sticky partition), without keys and partition whole
        batches go to the sticky partition; each partition's records keep the order given.  The arrays are
        read when the batches are built: do not change them until the handle is done.
        """
        columns = bulk_columns(values, keys, headers, timestamps)
        count = columns.values.item_count
        if callback is not None and not callable(callback):
            raise TypeError(f"callback {callback!r} is not callable")
        sizes = record_bounds(columns)
        now_ms = time.time_ns() // 1_000_000
        with self._lock:
            state = self._topic(topic)
            bulk = BulkHandle(self._waiter, topic, count, callback)
            if count == 0:
                bulk.finish_empty()
                return bulk
            self._check_bulk_fits(state, sizes)
            touched: dict[PartitionQueue, None] = {}
            for target, indexes in self._bulk_groups(state, columns, sizes, partition):
                if indexes is None:
                    self._queue_bulk(state, target, columns, sizes, None, now_ms, bulk, touched)
                else:
                    self._queue_bulk(state, target, take_records(columns, indexes), sizes[indexes], indexes,
                                     now_ms, bulk, touched)
            for part in touched:
                self._sender.publish_pending(part, self.config.max_block_ms)
        return bulk

    def _check_bulk_fits(self, state: _Topic, sizes: np.ndarray) -> None:
        """InvalidRecordError naming the first record no batch can hold (nothing is queued then)."""
        limit = min(self.config.max_request_size, state.max_message_bytes)
        if int(sizes.max()) + HEADER_SIZE > limit:
            big = int(np.argmax(sizes))
            raise InvalidRecordError(
                f"topic {state.name}: record {big} takes up to {int(sizes[big])} bytes, more than a "
                f"batch of max.request.size {self.config.max_request_size} / max.message.bytes "
                f"{state.max_message_bytes}; nothing was sent"
            )

    def _bulk_groups(self, state: _Topic, columns: RecordColumns, sizes: np.ndarray,
                     partition: int | None) -> list[tuple[int | None, np.ndarray | None]]:
        """Where ``send_many``'s records go: ``(partition, record indexes)`` in input order per partition;
        ``(None, None)``: all of them, whole batches to the sticky partition; indexes None: all of them."""
        if partition is not None:
            return [(_check_partition(state, partition), None)]
        if columns.keys is None:
            return [(None, None)]
        targets = key_partitions(columns.keys, len(state.partitions))
        unkeyed = np.flatnonzero(targets < 0)
        for start, stop, _ in batch_cuts(sizes[unkeyed], max(state.batch_room, 1)):
            targets[unkeyed[start:stop]] = state.sticky.current  # a run of about a batch: one partition
            with self._token:
                state.sticky.switch(state.sticky.current)
                state.sticky_batch = state.partitions[state.sticky.current].open
        return list(partition_groups(targets))

    def _queue_bulk(self, state: _Topic, target: int | None, columns: RecordColumns, sizes: np.ndarray,
                    indexes: np.ndarray | None, now_ms: int, bulk: BulkHandle,
                    touched: dict[PartitionQueue, None]) -> None:
        """Cut ``columns`` into batches of about batch.size; queue them behind the partition's open batch
        (``target``, or the sticky partition, moving on after each batch)."""
        for start, stop, bound in batch_cuts(sizes, max(state.batch_room, 1)):
            part_index = target if target is not None else state.sticky.current
            part = state.partitions[part_index]
            if part.open.values:
                self._seal(part)
            where = slice(start, stop) if indexes is None else indexes[start:stop]
            batch = ColumnBatch(self._waiter, state.name, part_index, slice_columns(columns, start, stop),
                                where, bound, now_ms, bulk, completions=self._completions)
            bulk.add(batch)
            part.sealed.append(batch)
            self._sender.pending(part)
            touched[part] = None
            if target is None:
                with self._token:
                    state.sticky.switch(part_index)
                    state.sticky_batch = state.partitions[state.sticky.current].open

    # -- lifetime -------------------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise ApplianceError("the producer is closed")

    def close(self, timeout: float | None = None) -> None:
        """Flush (up to ``timeout`` seconds), then release the channels and the route (control connection
        or broker connections).  Records not acknowledged by then fail with RequestTimeoutError."""
        if self._closed:
            return
        try:
            self.flush(timeout)
        except RequestTimeoutError:
            pass
        finally:
            with self._lock:
                with self._token:  # a send() racing close either appended already or sees it closed
                    self._closed = True
                    self._topics = {}
                for state in self._all_topics.values():
                    for part in state.partitions:
                        if part.open.values:
                            self._seal(part)  # (its records fail below, callbacks outside the token)
                self._sender.abandon_all()
            self._sender.stop()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def partitions_for(self, topic: str) -> list[int]:
        """The partition numbers of ``topic`` (asking the appliance the first time)."""
        with self._lock:
            return list(range(len(self._topic(topic).partitions)))


def _check_partition(state: _Topic, partition: object) -> int:
    count = len(state.partitions)
    if not isinstance(partition, int) or isinstance(partition, bool) or not 0 <= partition < count:
        raise UnknownTopicOrPartitionError(
            f"topic {state.name!r} has partitions 0..{len(state.partitions) - 1}, not {partition!r}"
        )
    return partition
