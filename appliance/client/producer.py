"""``appliance.Producer``: Kafka's producer, for processes on the appliance's host, over shared-memory rings
(or, given ``bootstrap.servers``, over TCP to a broker: ``appliance.client.tcp_route``; the same API and
guarantees).

Theory of operation
-------------------
**Where records go.**  The producer connects to the supervisor's control socket (``appliance.control.socket``,
default ``<appliance.data.dir>/.appliance.sock``), asks it for a producer id and, per partition it sends to,
for a ring that partition's writer serves (``appliance.control``).  Everything after that is shared memory:
batches go into the ring (``ipc.ring_publisher``), the writer appends them and answers each with its
base offset (or an error code) in the ring's ack slots.  Keep the producer open while producing: the control
connection is what keeps its rings alive.

**The per-record path** (``send`` with a value and nothing else) takes no lock: it takes the producer's
*append token* (``accumulator.AppendToken``: one atomic ``list.pop``, given back with one ``list.append``),
appends the value to the open batch of the topic's sticky partition (a Python list), counts the room left,
and returns a :class:`RecordHandle` pointing at (batch, index): about 0.3 us of CPU, of which the handle is
~0.08 us and the token ~0.02 us (the producer's ``RLock`` took ~0.1 us).  Sealing needs the token too, so
no other thread (the timer, a flush, another sender) seals a batch between a send reading it and
appending to it; a send that finds the token taken, its batch full, or its batch empty (the first record
starts ``linger.ms``) goes the general way, under the lock.  Everything else waits for the batch to be
*sealed*: when the next record would pass ``batch.size``, when ``linger.ms`` has passed since its first
record, or on ``flush``/``get``.  Then the whole batch is encoded at once by ``storage.batch_builder``'s
numba kernels straight into the ring frame (reserve -> build -> commit), with the producer id, epoch and
the partition's next sequence number; a value-only batch is handed over as its list, whose values the
builder reads where they lie (no ``b"".join``, no per-record ``len``): each value is copied once, into
the ring.  Records with keys, headers, timestamps, callbacks or an explicit partition take the general
path (about 1 us more); ``send_many`` hands whole columns (lists, 2-D arrays, buffer + offsets) to the builder
without ever creating one Python object per record.

**Acks** are collected on the caller's thread whenever the producer touches the ring anyway (publishing,
``flush``, ``get``), and always before a publish that finds every in-flight slot taken: reading them costs two
loads when none arrived, ~1 us for a few.  One background thread (``appliance.client.linger_timer``), started
with the first batch, seals batches whose ``linger.ms`` ran out and, while batches are in flight, collects
their acks every millisecond (every 0.2 ms while a batch waits for a slot), so that callbacks run and queued
batches go as soon as a slot frees, whatever the caller does -- except while the caller publishes (and so
collects the acks of the partitions it publishes to) itself at least every millisecond, every partition with
frames in flight had its acks collected within the last millisecond and nothing waits: then it looks only
every 10 ms (a partition the caller stops publishing to is collected at that look), since a wake-up of a
thread costs 40-50 us of CPU on a VM (at linger.ms=0 and 100,000 sends/s the 1 ms looks and the pokes took
~10% of a core); it never touches a batch while the caller's thread does (it holds the producer's lock, and
the append token to seal) and never sleeps on a ring semaphore.  A callback runs on whichever thread collected
its ack: keep it short.  Waits (``get``, ``flush``) nap, then park on the ring's semaphore (``ipc.wakeup``,
``ipc.ring.PRODUCER_NAP_S``) outside the lock, reading only the ring header, then collect under the lock.

**Sealing and max.in.flight.**  A batch is sealed when it is full, when ``flush``/``get`` asks for it, or
when its ``linger.ms`` ran out *and* its partition can take it now (an in-flight slot free, nothing queued
ahead of it): while every slot is taken the open batch keeps gathering records and goes, larger, with the
first ack that frees a slot (Kafka's accumulator does the same), instead of queueing many small batches
that then drain one ack at a time.  ``linger.ms=0`` means "as soon as possible": the record that opens a
batch seals and publishes it on the caller's thread (no hand-over to the timer thread) when none of the
partition's batches is in flight (after collecting acks); the records sent while one is gather in the open
batch, which the timer thread publishes at its next look (within 0.2 ms, a slot free) -- Kafka's sender
sends what is ready and lets records batch up while it is busy.  Publishing from the caller whenever one
of the five slots was free made a burst of sends one batch per record while the writer acknowledged each
within a publish's time (~15 us): each batch then costs a round in the producer, the writer and the
consumer (measured at 100,000 records/s sent in 2 ms bursts: 14% less CPU, p50 0.65 -> 0.55 ms).  And
while records stream (a batch opened within 1 ms of the previous one) the caller does not publish the
first record of a batch alone: it wakes the timer thread at once, which publishes the batch with the
records sent by the time it runs -- one batch per burst instead of the first record alone and then the
rest (at 100,000 records/s in 0.2 ms bursts: p99 1.17-1.67 -> 0.84-0.90 ms, p50 0.33-0.36 -> 0.31-0.32
ms, 3 alternating pairs at load ~1.3).

**Order and exactly once.**  Records sent to one partition are appended in the order sent.  With
``enable.idempotence`` (the default with ``acks=all``) every batch carries the producer id, epoch and its
first sequence number; at most ``max.in.flight.requests.per.connection`` (5) batches per partition await
acks, the number the writer remembers per producer.  A batch is never rebuilt differently: a retry (an error
ack with a retriable code, a ring that failed, an appliance restart) publishes the same records with the same
sequence, so a batch that was appended before is acknowledged with its first offsets instead of appended
again.  After a non-retriable error the batches behind the failed one are re-numbered and sent again in
order (``appliance.client.partition_queue``).  A writer restart needs nothing from the producer: the ring
outlives the writer, and the new writer reads the unacknowledged frames again.

**The appliance going away.**  When the supervisor stops or dies its control connection closes.  A producer
that notices (a publish blocked for 200 ms, or 250 ms without an ack while frames are in flight) reconnects
to the next supervisor on the same socket (waiting up to ``max.block.ms``), keeps its producer id, takes the
acks the old writers left in its rings, and sends everything still unacknowledged again, as above.

**Back-pressure and time-outs.**  A full ring (the writer is slower, stopped, or gone) blocks ``send`` for
up to ``max.block.ms``, then raises :class:`BackPressureError`; the record that raised was not accepted, the
ones before it were.  A batch not acknowledged within ``delivery.timeout.ms`` of its creation fails with
:class:`RequestTimeoutError`: its outcome is unknown (it may still be appended).  ``acks=0`` never waits for
acks (handles resolve with offset -1 as soon as the batch is in the ring) but never drops either.

``acks=1`` and ``acks=all`` behave the same while partitions have no followers: the writer acknowledges
after appending, and the high watermark equals the log end offset.  (Replication later makes ``all`` wait
for ``min.insync.replicas``.)  As in Kafka, idempotence needs ``acks=all``: left at its default it is
switched off for ``acks`` 0 or 1, asked for explicitly with them it is a configuration error.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

import numpy as np

from appliance.client.accumulator import (
    DONE,
    OPEN,
    PUBLISHED,
    RECORD_ESTIMATE_BYTES,
    SEALED,
    TIMESTAMP_ESTIMATE_BYTES,
    AppendToken,
    BulkHandle,
    BulkMetadata,
    Callback,
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
from appliance.client.linger_timer import RoundTimer
from appliance.client.partition_queue import PartitionQueue
from appliance.client.partitioner import KeyPartitioner, StickyPartitioner
from appliance.client.producer_config import DEFAULTS, ProducerConfig
from appliance.client.route import BatchChannel, LocalRoute, Route
from ipc.control import ControlError
from ipc.ring import RingFailedError
from storage.batch_builder import NO_SPACE, HeaderColumns, RecordColumns, build_into
from storage.batch_builder import build as build_bytes
from storage.batch_header import HEADER_SIZE
from storage.errors import (
    ApplianceError,
    BackPressureError,
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

_log = logging.getLogger("appliance.producer")
_new_handle = object.__new__

_WAIT_SLICE_MS = 50  # a caller's wait parks on a ring semaphore at most this long before re-checking
_PUBLISH_SLICE_MS = 200  # a blocked publish checks this often whether the supervisor is still there
_SILENCE_NS = 250_000_000  # no ack for this long with frames in flight: is the supervisor still there?
_IDLE_NS = 2_000_000  # the caller counts as quiet (may have lost its supervisor) after 2 ms
_ACK_POLL_NS = 1_000_000  # the timer thread's ack polling period while batches are in flight
_HELD_POLL_NS = 200_000  # ... while batches wait for an in-flight slot (every ack lets one go)
_ACTIVE_POLL_NS = 10_000_000  # ... while the caller itself publishes (and collects acks) every poll period
_FULL_ROUND_NS = 100_000_000  # a full round (delivery.timeout.ms, a supervisor gone) at least this often
_STREAM_NS = 1_000_000  # linger.ms=0: a batch opened within this of the previous one goes by the timer thread
_CALLER_MAX_IN_FLIGHT = 1  # linger.ms=0: the caller publishes at once only while no batch is in flight

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
    """Kafka's producer for the local appliance.  See the module docstring; settings in :data:`DEFAULTS`.

    ``Producer({"acks": "all", "linger.ms": 5})`` or ``Producer(acks="all", linger_ms=5)``; a context
    manager (``close`` on exit).  Thread-safe.
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
        self._topics: dict[str, _Topic] = {}
        self._all_topics: dict[str, _Topic] = {}  # kept after close (for error messages)
        self._lingering: dict[PartitionQueue, None] = {}  # open batch has records: oldest first
        self._publishing: dict[PartitionQueue, None] = {}  # partitions with batches sealed or in flight
        self._closed = False
        self._last_activity_ns = time.monotonic_ns()
        self._opened_ns = 0  # when send() last opened a batch at linger.ms=0 (monotonic ns; see _send_now)
        self._next_full_round_ns = 0  # the timer thread's next round that does everything (see _timer_round)
        linger_ns = self.config.linger_ms * 1_000_000
        self._send_at_once = linger_ns == 0  # linger.ms=0: a batch goes as soon as it can (see _send_now)
        self._timer = RoundTimer(self._lock, lambda now: self._timer_round(now, linger_ns),
                                 "appliance-producer-linger")
        try:
            self.producer_id, self.producer_epoch = route.init_producer_id()
        except BaseException:
            route.close()
            raise
        from ipc.ring import warm_up

        warm_up()

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
        handle = _new_handle(RecordHandle)  # (40 ns cheaper than calling the class: no __init__ frame)
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
                self._send_now(state.partitions[batch.partition])
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
            self._reconnect()
            count, max_message_bytes = self._route.partitions_for(name)
        state = _Topic(name, max_message_bytes, self.config.batch_room(max_message_bytes))
        state.partitions = [PartitionQueue(name, i, self._new_batch(state, i)) for i in range(count)]
        state.sticky = StickyPartitioner(count)
        state.keys = KeyPartitioner(count)
        state.sticky_batch = state.partitions[state.sticky.current].open
        self._topics[name] = self._all_topics[name] = state
        return state

    def _new_batch(self, topic: _Topic, partition: int) -> ProducerBatch:
        return ProducerBatch(self, topic.name, partition, topic.batch_room)

    def _first_record(self, part: PartitionQueue, batch: ProducerBatch) -> None:
        """A batch gets its first record: start its linger clock, make sure the timer thread will seal it
        (at linger.ms=0 the caller tries first, see :meth:`_send_now`; the timer only for a batch held)."""
        batch.started()
        self._lingering[part] = None
        if not self._send_at_once:
            self._timer.wake_by(batch.first_append_ns + self.config.linger_ms * 1_000_000)

    def _send_now(self, part: PartitionQueue) -> None:
        """linger.ms=0: a record opened a batch of ``part``.  In a stream (the previous batch was opened
        less than _STREAM_NS ago) the timer thread is woken at once and publishes the batch when it runs,
        with the records sent meanwhile (Kafka's sender thread, woken by the first record of a batch, does
        the same).  After a pause, the caller seals and publishes it itself if it can go at once (none of
        the partition's batches in flight after collecting acks, nothing queued ahead of it); otherwise it
        stays open, gathering records, until the timer thread's next look."""
        now = time.monotonic_ns()
        streaming, self._opened_ns = now - self._opened_ns < _STREAM_NS, now
        if streaming and part.open.values:
            self._timer.wake_by(now)  # it publishes the batch with what gathered by the time it runs
            return
        if part.open.values and self._can_publish(part, now, _CALLER_MAX_IN_FLIGHT):
            self._seal(part)
            try:
                self._publish_pending(part, 0)
            except BackPressureError:
                pass  # the ring is full of bytes: it stays queued, the timer publishes it when it can
        # the timer thread collects the acks (callbacks run while the caller is away) and lets held ones go;
        # while nothing is held, a round planned within _ACTIVE_POLL_NS will do (no poke: see _timer_round)
        self._timer.wake_by(now + (_HELD_POLL_NS if part.sealed or part.open.values else _ACTIVE_POLL_NS))

    def _can_publish(self, part: PartitionQueue, now_ns: int, limit: int = 1 << 30) -> bool:
        """A batch of ``part`` sealed at ``now_ns`` would be published at once: nothing is queued ahead of
        it, no recovery or retry back-off holds the partition, and fewer than max.in.flight (and ``limit``)
        of its batches await acks (acks collected first when that many do)."""
        if part.sealed or part.recovering or part.not_before_ns > now_ns:
            return False
        return self._in_flight_room(part, limit)

    def _in_flight_room(self, part: PartitionQueue, limit: int = 1 << 30) -> bool:
        """Fewer than max.in.flight (and ``limit``) batches of ``part`` await acks, after collecting those
        that arrived."""
        channel = part.channel
        if channel is None or not channel.track_acks:
            return True
        limit = min(limit, self.config.max_in_flight)
        if len(channel.in_flight) < limit:
            return True
        self._collect(part)
        channel = part.channel
        return channel is None or len(channel.in_flight) < limit

    def _make_room(self, state: _Topic, part: PartitionQueue, payload_bytes: int, timestamped: bool) -> None:
        """A record of ``payload_bytes`` does not fit the open batch of ``part``: seal it (unless a flush or
        the timer did meanwhile) and publish what is sealed.  Raises InvalidRecordError for a record no
        batch can hold, BackPressureError when publishing blocked for max.block.ms; then nothing changed
        for this record."""
        self._check_fits(state, part, payload_bytes, timestamped)
        batch = part.open
        if batch.values and batch.room_bytes < batch.needs(payload_bytes, timestamped):
            self._seal(part)
        self._publish_pending(part, self.config.max_block_ms)

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
            self._publishing[part] = None
            self._lingering.pop(part, None)
            topic = self._all_topics[part.topic_name]
            part.open = self._new_batch(topic, part.index)
            if topic.sticky.current == part.index:
                topic.sticky_batch = topic.partitions[topic.sticky.switch(part.index)].open

    # -- publishing -----------------------------------------------------------------------------------------

    def _publish_pending(self, part: PartitionQueue, timeout_ms: int, *, caller: bool = True) -> None:
        """Publish the sealed batches of ``part`` in order (waiting up to ``timeout_ms`` for room), then
        collect the acks that arrived (also when it raises).  BackPressureError: the first unpublished
        batch stays queued.  Whenever all in-flight slots are taken, the acks that arrived are collected
        before publishing (or waiting); with ``timeout_ms`` 0, what finds no slot free then stays queued,
        without an error.

        Waits are cut in slices; between two, a supervisor that went away is noticed and reconnected to
        (a full ring nobody drains any more is not back-pressure but a restart)."""
        now = time.monotonic_ns()
        if caller:
            self._last_activity_ns = now
        deadline_ns = now + timeout_ms * 1_000_000
        ring_failures = 0
        try:
            while (batch := part.next_to_publish()) is not None:
                room = self._in_flight_room(part)  # (collects the acks that arrived when every slot is taken)
                if part.next_to_publish() is not batch:
                    # Those acks changed the queue: an error answer started a recovery (nothing new goes
                    # until every batch in flight answered), the last answer ended one (the refused batches
                    # went back to the front of ``sealed``, renumbered, for after retry.backoff.ms), or the
                    # ring failed (its batches went back too).  Pick again: publishing ``batch`` now would
                    # send it out of order, and taking it off the queue would drop the batch put back
                    # first (never sent, never completed, and no flush() waits for it).
                    continue
                if not room and timeout_ms <= 0:
                    return  # (acks were collected)
                try:
                    self._publish_first(part, batch, min(self._remaining_ms(deadline_ns), _PUBLISH_SLICE_MS))
                except RingFailedError as exc:
                    ring_failures += 1
                    self._replace_channel(part)
                    if ring_failures > 2:
                        raise ApplianceError(f"partition {part.name}: new rings keep failing: {exc}") from exc
                    continue
                except (BackPressureError, ControlError) as exc:
                    if not self._route.alive():
                        self._reconnect()
                        continue
                    if isinstance(exc, ControlError) or time.monotonic_ns() >= deadline_ns:
                        if timeout_ms <= _PUBLISH_SLICE_MS:
                            raise
                        raise BackPressureError(
                            f"partition {part.name}: no room to publish for max.block.ms {timeout_ms} ms "
                            f"({exc})"
                        ) from None
                    continue
        finally:
            # (also after an error: acks a publish's wait read from the ring are complete, not in flight,
            # and must not wait in the channel's ``completed`` for the next call)
            channel = part.channel
            if channel is not None:
                self._collect(part)
                if caller and channel.in_flight:
                    # the timer thread looks at the acks by _ACTIVE_POLL_NS from now, whatever it planned
                    # before (a far linger.ms, or nothing): this publish collects this partition's acks only
                    self._timer.wake_by(now + _ACTIVE_POLL_NS)

    def _publish_first(self, part: PartitionQueue, batch: ProducerBatch, timeout_ms: int) -> None:
        """:meth:`_publish` ``batch``, the first of ``part.sealed``, off the queue: publishing may complete it
        and so run its callback on this thread (acks=0, a batch too large or refused by the builder), and a
        callback that sends to this partition publishes what is queued behind it itself, so must not find
        it there.  Whatever stops it before it is published (a failed ring, no room, an interrupt) puts it
        back first; then the batches in flight on a failed ring go back before it."""
        part.sealed.popleft()
        try:
            self._publish(part, batch, timeout_ms)
        except BaseException:
            if batch.state == SEALED:
                part.sealed.appendleft(batch)
            raise

    def _channel(self, part: PartitionQueue) -> BatchChannel:
        channel = part.channel
        if channel is None:
            cfg = self.config
            channel = part.channel = self._route.open_channel(
                part.topic_name, part.index, self.producer_id,
                track_acks=cfg.acks != 0,
                max_in_flight=cfg.max_in_flight,
                max_block_ms=cfg.max_block_ms,
                acks=cfg.acks,
            )
        return channel

    def _publish(self, part: PartitionQueue, batch: ProducerBatch, timeout_ms: int) -> None:
        """Build ``batch`` straight into a ring frame and publish it (BackPressureError: not published)."""
        cfg = self.config
        channel = self._channel(part)
        if cfg.idempotent:
            part.number(batch)
        columns, max_bytes = batch.plan(cfg.compression)
        if max_bytes > channel.max_body_bytes:  # only a single huge record's bound can get here
            max_bytes = len(build_bytes(columns, compression=cfg.compression,
                                        compression_level=cfg.compression_level))  # the exact size
            if max_bytes > channel.max_body_bytes:
                batch.complete(-1, InvalidRecordError(
                    f"partition {part.name}: a batch of {batch.describe()} encodes to {max_bytes} bytes, "
                    f"more than a ring frame holds ({channel.max_body_bytes}); it was not sent"
                ))
                return
        build = partial(
            _build_frame, columns=columns,
            producer_id=self.producer_id if cfg.idempotent else -1,
            producer_epoch=self.producer_epoch if cfg.idempotent else -1,
            base_sequence=batch.base_sequence, timestamp_ms=batch.timestamp_ms,
            compression=cfg.compression, compression_level=cfg.compression_level,
        )  # fmt: skip
        try:
            channel.publish_into(max_bytes, build, batch, timeout_ms=timeout_ms)
        except (ValueError, TypeError) as exc:  # the builder refused the columns: nothing was published
            batch.complete(-1, InvalidRecordError(
                f"partition {part.name}: batch of {batch.describe()} could not be built: {exc}"
            ))
            return
        batch.attempts += 1
        if channel.track_acks:
            batch.state = PUBLISHED
        else:
            batch.complete(-1, None)

    def _replace_channel(self, part: PartitionQueue, *, detach: bool = True) -> None:
        """The writer failed our ring (frames before the bad one were appended and acknowledged, none after):
        take the acks that arrived, queue the rest again in order with the same sequences (a batch appended
        after all is recognised as a duplicate), and drop the ring; the next publish attaches a new one."""
        channel = part.channel
        if channel is None:
            return
        try:
            channel.poll()
        except RingFailedError:
            pass
        for batch, result in channel.take_completed():
            self._acknowledged(part, batch, result)
        part.channel = None
        part.requeue(channel.abandon_in_flight())
        try:
            if detach:
                self._route.drop_channel(channel)
            else:
                channel.close()
        except ApplianceError:
            pass

    def _reconnect(self) -> None:
        """The supervisor went away (stopped, restarted, crashed): connect to the next one (up to
        max.block.ms), take the acks the old writers left in our rings, queue every batch still
        unacknowledged again in order with the same sequences (the new writers recognise those already
        appended), and attach new rings as batches are published."""
        _log.warning("producer %d: the appliance at %s went away; reconnecting", self.producer_id,
                     getattr(self._route, "path", "?"))
        self._route.reconnect(self.config.max_block_ms)
        for state in self._all_topics.values():
            for part in state.partitions:
                if part.channel is not None:
                    self._replace_channel(part, detach=False)
                    self._publishing[part] = None

    # -- acks -----------------------------------------------------------------------------------------------

    def _collect(self, part: PartitionQueue) -> None:
        """Read the acks that arrived for ``part`` and complete their batches (callbacks run here)."""
        channel = part.channel
        if channel is None:
            return
        part.collected_ns = time.monotonic_ns()
        try:
            channel.poll()
        except RingFailedError:
            self._replace_channel(part)
            return
        for batch, result in channel.take_completed():
            self._acknowledged(part, batch, result)
        if part.recovering and not channel.in_flight:
            part.end_recovery(self.config.retry_backoff_ms)
        if not part.busy():
            self._publishing.pop(part, None)

    def _acknowledged(self, part: PartitionQueue, batch: ProducerBatch, result: int) -> None:
        cfg = self.config
        part.acknowledged(batch, result, retries=cfg.retries, delivery_timeout_ms=cfg.delivery_timeout_ms)

    def _expire(self, now_ns: int) -> None:
        """Fail batches older than delivery.timeout.ms (their outcome is unknown)."""
        for part in list(self._publishing):
            part.expire(now_ns, self.config.delivery_timeout_ms)

    # -- waiting --------------------------------------------------------------------------------------------

    def _await_batches(self, batches: Sequence[ProducerBatch], timeout: float | None) -> None:
        """Seal, publish and wait for ``batches`` (handles' get, flush).  RequestTimeoutError after
        ``timeout`` seconds."""
        deadline_ns = None if timeout is None else time.monotonic_ns() + int(timeout * 1e9)
        pending = [batch for batch in batches if batch.state != DONE]
        while pending:
            wait_on: tuple[BatchChannel, int] | None = None
            with self._lock:
                for batch in pending:
                    if batch.state == OPEN:
                        part = self._partition_of(batch)
                        if part.open is batch and batch.values:
                            self._seal(part)
                parts = {self._partition_of(batch): None for batch in pending}
                for part in parts:
                    try:  # a full ring is not an error for a waiter: it waits on, up to its timeout
                        self._publish_pending(part, min(self._remaining_ms(deadline_ns), _WAIT_SLICE_MS))
                    except BackPressureError:
                        pass
                self._expire(time.monotonic_ns())
                pending = [batch for batch in pending if batch.state != DONE]
                if not pending:
                    return
                part = self._partition_of(pending[0])
                channel = part.channel
                if channel is not None and channel.in_flight:
                    wait_on = (channel, channel.in_flight[0][0])  # acks come in order: the oldest frame's
            remaining = self._remaining_ms(deadline_ns)
            if remaining <= 0:
                raise RequestTimeoutError(
                    f"{len(pending)} batches (first: partition {part.name}, {pending[0].describe()}) not "
                    f"acknowledged within {timeout} s; they may still be delivered"
                )
            if wait_on is not None:  # outside the lock: only parks on the ring's semaphore, reads its header
                try:
                    acked = wait_on[0].wait_acked(wait_on[1], min(remaining, _WAIT_SLICE_MS))
                except RingFailedError:
                    acked = True  # handled under the lock on the next round
                if not acked and time.monotonic_ns() - wait_on[0].last_ack_ns > _SILENCE_NS:
                    with self._lock:
                        if not self._closed and not self._route.alive():
                            self._reconnect()
            else:
                time.sleep(min(remaining, self.config.retry_backoff_ms, _WAIT_SLICE_MS) / 1000)

    @staticmethod
    def _remaining_ms(deadline_ns: int | None) -> int:
        if deadline_ns is None:
            return 2**62
        return max(0, (deadline_ns - time.monotonic_ns()) // 1_000_000)

    def _partition_of(self, batch: ProducerBatch) -> PartitionQueue:
        return self._all_topics[batch.topic].partitions[batch.partition]

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
            waiting: list[ProducerBatch] = []
            for part in self._publishing:
                waiting += part.sealed
                waiting += [batch for batch in part.answered if batch.state != DONE]
                if part.channel is not None:
                    waiting += [batch for _, batch in part.channel.in_flight]
        self._await_batches(waiting, timeout)

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
            bulk = BulkHandle(self, topic, count, callback)
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
                self._publish_pending(part, self.config.max_block_ms)
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
            batch = ColumnBatch(self, state.name, part_index, slice_columns(columns, start, stop), where,
                                bound, now_ms, bulk)
            bulk.add(batch)
            part.sealed.append(batch)
            self._publishing[part] = None
            touched[part] = None
            if target is None:
                with self._token:
                    state.sticky.switch(part_index)
                    state.sticky_batch = state.partitions[state.sticky.current].open

    # -- the timer thread's round -------------------------------------------------------------------------

    def _silent(self, now: int) -> bool:
        """Some partition has frames in flight and no ack came for a while."""
        for part in self._publishing:
            channel = part.channel
            if channel is not None and channel.in_flight and now - channel.last_ack_ns > _SILENCE_NS:
                return True
        return False

    def _timer_round(self, now: int, linger_ns: int) -> int:
        """Collect acks, publish what can go without blocking, seal the lingering batches whose partition
        can take them; return when to wake next (-1: when woken).

        Acks are collected in every round while batches are in flight, whatever the caller does: a slot
        freed is a queued batch that can go.  A batch whose linger.ms ran out stays open while its
        partition cannot take it (every in-flight slot taken, batches queued ahead of it): records keep
        joining it, and it goes, as one larger batch, with the first round that finds a slot."""
        if now - self._last_activity_ns < _ACK_POLL_NS and now < self._next_full_round_ns:
            due = self._next_due(now, linger_ns)
            if due > now:
                # The caller published less than a poll period ago, the acks of every partition with
                # frames in flight were collected less than a poll period ago (a publish collects those
                # of its own partition only) and nothing waits for a slot or its linger.ms: acks are as
                # fresh as this round would make them.  Look again _ACTIVE_POLL_NS after the caller's last
                # publish, or when a linger.ms runs out: a partition the caller stopped publishing to is
                # collected then (a wake-up of this thread costs 40-50 us of CPU on a VM: at linger.ms=0
                # and 100,000 sends/s, polling every 1 ms took ~10% of a core; waking _ACK_POLL_NS after
                # each partition's last collect would wake it per batch with the sticky partitioner).
                return min(self._last_activity_ns + _ACTIVE_POLL_NS, due)
        self._next_full_round_ns = now + _FULL_ROUND_NS
        quiet = now - self._last_activity_ns > _IDLE_NS
        if quiet and self._silent(now) and not self._route.alive():
            self._reconnect()
        held = False
        for part in list(self._publishing):
            try:
                self._collect(part)
                if part.sealed and not part.recovering:
                    self._publish_pending(part, 0, caller=False)
                held = held or (bool(part.sealed) and not part.recovering)
            except ApplianceError:
                pass  # reported to the caller through the batches (or on its next call)
        next_wake = -1
        for part in list(self._lingering):  # oldest first
            batch = part.open
            if now < batch.first_append_ns + linger_ns:
                next_wake = batch.first_append_ns + linger_ns
                break
            try:
                if not self._can_publish(part, now):
                    held = True
                    continue
                self._seal(part)
                self._publish_pending(part, 0, caller=False)
            except ApplianceError:
                pass
        self._expire(now)
        if self._publishing or held:
            poll_at = now + (_HELD_POLL_NS if held else _ACK_POLL_NS)
            next_wake = poll_at if next_wake < 0 else min(next_wake, poll_at)
        elif next_wake < 0 and now - self._last_activity_ns < _ACTIVE_POLL_NS:
            # nothing in flight, but the caller is publishing: a planned round spares each of its publishes
            # a poke (a wake-up of this thread); after _ACTIVE_POLL_NS of quiet the thread sleeps until poked
            next_wake = self._last_activity_ns + _ACTIVE_POLL_NS
        return next_wake

    def _next_due(self, now_ns: int, linger_ns: int) -> int:
        """When the timer must act (monotonic ns): 0 if a sealed batch waits for a slot or the acks of a
        partition with frames in flight were last collected _ACK_POLL_NS ago or more, else when the oldest
        open batch's linger.ms runs out (2**62 if no batch has records)."""
        for part in self._publishing:
            if part.sealed:
                return 0
            channel = part.channel
            if channel is not None and channel.in_flight and now_ns - part.collected_ns >= _ACK_POLL_NS:
                return 0
        for part in self._lingering:  # oldest first
            return part.open.first_append_ns + linger_ns
        return 1 << 62

    # -- lifetime -------------------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise ApplianceError("the producer is closed")

    def close(self, timeout: float | None = None) -> None:
        """Flush (up to ``timeout`` seconds), then release the rings and the control connection.
        Records not acknowledged by then fail with RequestTimeoutError."""
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
                for state in self._all_topics.values():
                    for part in state.partitions:
                        self._abandon(part)
            self._timer.stop()
            self._route.close()

    def _abandon(self, part: PartitionQueue) -> None:
        part.abandon(RequestTimeoutError(
            f"partition {part.name}: the producer closed before the batch was acknowledged"
        ))
        if part.channel is not None:
            part.channel.close()
            part.channel = None

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


def _build_frame(region: np.ndarray, **build: Any) -> int:
    """Write one batch at the start of ``region`` (a reserved ring frame); its size, or -1 if too big."""
    size = build_into(region, 0, build.pop("columns"), **build)
    return size if size != NO_SPACE else -1
