"""The producer's sender: publishes sealed batches into their partitions' channels, collects the answers,
decides when lingering batches go, and waits for batches on behalf of handles and ``flush``.

Theory of operation
-------------------
``appliance.client.producer`` appends records to open batches and seals them; each partition's
:class:`~appliance.client.partition_queue.PartitionQueue` holds the sealed ones in order.  The sender
owns everything after that.  It works under the producer's lock, on whichever thread calls it (the
caller's, or the timer thread's round), and does not know whether a channel is a shared-memory ring or a
TCP connection to a broker (``appliance.client.route``).

**Publishing.**  :meth:`Sender.publish_pending` publishes a partition's sealed batches in order: each is
built by ``storage.batch_builder``'s numba kernels straight into the channel's frame (a reserved ring
frame, or the body of a Produce request), with the producer id, epoch and the partition's next sequence
number.  At most ``max.in.flight.requests.per.connection`` batches per partition await answers, the
number the writer (or the broker) remembers per producer; what finds no slot free stays queued.

**Acks** are collected on the caller's thread whenever the producer touches a channel anyway (publishing,
``flush``, ``get``), and always before a publish that finds every in-flight slot taken.  One background
thread (``appliance.client.linger_timer``), started with the first batch, runs :meth:`Sender._round`: it
seals batches whose ``linger.ms`` ran out and, while batches are in flight, collects their acks every
millisecond (every 0.2 ms while a batch waits for a slot), so that callbacks run and queued batches go as
soon as a slot frees, whatever the caller does -- except while the caller publishes (and so collects the
acks of the partitions it publishes to) itself at least every millisecond, every partition with frames in
flight had its acks collected within the last millisecond and nothing waits: then it looks only every 10
ms (a partition the caller stops publishing to is collected at that look), since every wake-up of a thread
costs CPU (docs/performance.md).  The thread never touches a batch while the caller's thread does (it
holds the producer's lock, and the append token to seal) and never sleeps on a ring semaphore.  A callback
runs on whichever thread collected its ack: keep it short.  Both threads collect under the producer's lock
and complete each partition's batches in publish order, and the callbacks go through the producer's
``accumulator.CallbackQueue`` (a batch at a time, never nested), so each partition's callbacks run in send
order whichever thread runs them.  Waits (:meth:`Sender.await_batches`: ``get``,
``flush``) nap, then park on the oldest in-flight frame's channel (a ring's semaphore, a socket's
``select``) outside the lock, then collect under the lock.

**When a lingering batch goes.**  A batch is sealed when it is full, when ``flush``/``get`` asks for it,
or when its ``linger.ms`` ran out *and* its partition can take it now (an in-flight slot free, nothing
queued ahead of it): while every slot is taken the open batch keeps gathering records and goes, larger,
with the first ack that frees a slot (Kafka's accumulator does the same), instead of queueing many small
batches that then drain one ack at a time.  ``linger.ms=0`` means "as soon as possible"
(:meth:`Sender.send_now`): the record that opens a batch seals and publishes it on the caller's thread
when none of the partition's batches is in flight (after collecting acks); the records sent while one is
gather in the open batch, which the timer thread publishes at its next look (within 0.2 ms, a slot free)
-- Kafka's sender sends what is ready and lets records batch up while it is busy.  And while records
stream (a batch opened within 1 ms of the previous one) the caller does not publish the first record of a
batch alone: it wakes the timer thread at once, which publishes the batch with the records sent by the
time it runs -- one batch per burst instead of the first record alone and then the rest.

**Answers, retries and renumbering.**  An answer is a base offset or an error code
(:meth:`PartitionQueue.acknowledged`).  A retry (a retriable error code, a channel that failed, an
appliance restart) publishes the same records with the same sequence, so a batch that was appended before
is acknowledged with its first offsets instead of appended again; after a non-retriable error the batches
behind the failed one are renumbered and sent again in order (``appliance.client.partition_queue``).  A
channel that fails (the writer failed the ring; over TCP, a connection that broke or an answer that did
not come within ``request.timeout.ms``) is replaced: the answers that arrived are taken, every unanswered
batch goes back to the front of the queue with its sequence, and the next publish opens a new channel.

**The appliance going away.**  When the supervisor stops or dies its control connection closes (over TCP:
no bootstrap server answers).  A sender that notices (a publish blocked for 200 ms, or 250 ms without an
ack while frames are in flight) reconnects (waiting up to ``max.block.ms``), keeps its producer id, takes
the acks the old writers left in its rings, and sends everything still unacknowledged again, as above.
A batch not acknowledged within ``delivery.timeout.ms`` of its creation fails with
:class:`~storage.errors.RequestTimeoutError` (:meth:`Sender._expire`): its outcome is unknown.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

import numpy as np

from appliance.client.accumulator import DONE, OPEN, PUBLISHED, SEALED, ProducerBatch
from appliance.client.linger_timer import RoundTimer
from appliance.client.partition_queue import PartitionQueue
from appliance.client.producer_config import ProducerConfig
from appliance.client.route import BatchChannel, ConnectionLostError, Route
from ipc.control import ControlError
from ipc.ring import RingFailedError
from storage.batch_builder import NO_SPACE, Records, build_into
from storage.batch_builder import build as build_bytes
from storage.errors import (
    ApplianceError,
    BackPressureError,
    InvalidRecordError,
    PartitionOfflineError,
    RequestTimeoutError,
)
from storage.record_checks import keyless_columns, refusal

__all__ = ["Sender"]

_log = logging.getLogger("appliance.producer")

_WAIT_SLICE_MS = 50  # a caller's wait parks on a channel at most this long before re-checking
_PUBLISH_SLICE_MS = 200  # a blocked publish checks this often whether the supervisor is still there
_SILENCE_NS = 250_000_000  # no ack for this long with frames in flight: is the supervisor still there?
_IDLE_NS = 2_000_000  # the caller counts as quiet (may have lost its supervisor) after 2 ms
_ACK_POLL_NS = 1_000_000  # the timer thread's ack polling period while batches are in flight
_HELD_POLL_NS = 200_000  # ... while batches wait for an in-flight slot (every ack lets one go)
_ACTIVE_POLL_NS = 10_000_000  # ... while the caller itself publishes (and collects acks) every poll period
_FULL_ROUND_NS = 100_000_000  # a full round (delivery.timeout.ms, a supervisor gone) at least this often
_STREAM_NS = 1_000_000  # linger.ms=0: a batch opened within this of the previous one goes by the timer thread
_CALLER_MAX_IN_FLIGHT = 1  # linger.ms=0: the caller publishes at once only while no batch is in flight


class Sender:
    """Publishing, acks, recovery, lingering and waiting for one producer (see the module docstring).

    ``lingering`` is the producer's record of the partitions whose open batch has records, oldest first
    (read here, written by the producer); ``seal(part)`` seals the open batch of ``part`` (the producer's,
    with its lock held).  Every method but :meth:`await_batches` and :meth:`stop` is called with ``lock``
    held."""

    def __init__(self, config: ProducerConfig, route: Route, lock: threading.RLock, *, producer_id: int,
                 producer_epoch: int, lingering: Mapping[PartitionQueue, None],
                 seal: Callable[[PartitionQueue], None]) -> None:
        self.config = config
        self.route = route
        self.producer_id = producer_id
        self.producer_epoch = producer_epoch
        self._lock = lock
        self._lingering = lingering
        self._seal = seal
        self._queues: dict[str, list[PartitionQueue]] = {}  # every topic's partitions, by topic name
        self._publishing: dict[PartitionQueue, None] = {}  # partitions with batches sealed or in flight
        self._closed = False
        self._last_activity_ns = time.monotonic_ns()
        self._opened_ns = 0  # when a record last opened a batch at linger.ms=0 (monotonic ns; see send_now)
        self._next_full_round_ns = 0  # the timer thread's next round that does everything (see _round)
        linger_ns = config.linger_ms * 1_000_000
        self._timer = RoundTimer(lock, lambda now: self._round(now, linger_ns), "appliance-producer-linger")

    def add_topic(self, name: str, partitions: list[PartitionQueue]) -> None:
        """The producer's queues of a topic it now knows (kept after close, for error messages)."""
        self._queues[name] = partitions

    def pending(self, part: PartitionQueue) -> None:
        """``part`` has sealed batches to publish."""
        self._publishing[part] = None

    def wake_by(self, deadline_ns: int) -> None:
        """Make sure the timer thread runs a round by ``deadline_ns`` (monotonic ns)."""
        self._timer.wake_by(deadline_ns)

    def unacknowledged(self) -> list[ProducerBatch]:
        """Every batch sealed, in flight, or being recovered, not yet done (``flush`` waits for them)."""
        waiting: list[ProducerBatch] = []
        for part in self._publishing:
            waiting += part.sealed
            waiting += [batch for batch in part.answered if batch.state != DONE]
            if part.channel is not None:
                waiting += [batch for _, batch in part.channel.in_flight]
        return waiting

    # -- when batches go --------------------------------------------------------------------------------

    def send_now(self, part: PartitionQueue) -> None:
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
        if part.open.values and self.can_publish(part, now, _CALLER_MAX_IN_FLIGHT):
            self._seal(part)
            try:
                self.publish_pending(part, 0)
            except BackPressureError:
                pass  # the ring is full of bytes: it stays queued, the timer publishes it when it can
        # the timer thread collects the acks (callbacks run while the caller is away) and lets held ones go;
        # while nothing is held, a round planned within _ACTIVE_POLL_NS will do (no poke: see _round)
        self._timer.wake_by(now + (_HELD_POLL_NS if part.sealed or part.open.values else _ACTIVE_POLL_NS))

    def can_publish(self, part: PartitionQueue, now_ns: int, limit: int = 1 << 30) -> bool:
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

    # -- publishing -------------------------------------------------------------------------------------

    def publish_pending(self, part: PartitionQueue, timeout_ms: int, *, caller: bool = True) -> None:
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
        failures = 0
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
                    self._publish_first(part, batch, min(_remaining_ms(deadline_ns), _PUBLISH_SLICE_MS))
                except RingFailedError as exc:
                    failures += 1
                    self._channel_failed(part, exc, failures, deadline_ns, timeout_ms)
                except (BackPressureError, ControlError) as exc:
                    self._no_room(part, exc, deadline_ns, timeout_ms)
        finally:
            self._after_publishing(part, now, caller)

    def _channel_failed(self, part: PartitionQueue, exc: RingFailedError, failures: int, deadline_ns: int,
                        timeout_ms: int) -> None:
        """The channel of ``part`` failed while publishing: replace it (its unanswered batches go back to
        the queue).  A ring failing a third time in one publish is an error; a lost connection is opened
        again until ``timeout_ms`` has passed, then it is back-pressure."""
        self._replace_channel(part)
        if failures <= 2:
            return
        if not isinstance(exc, ConnectionLostError):
            raise ApplianceError(f"partition {part.name}: new rings keep failing: {exc}") from exc
        if time.monotonic_ns() >= deadline_ns:
            raise BackPressureError(
                f"partition {part.name}: its connection broke {failures} times within {timeout_ms} ms ({exc})"
            ) from exc

    def _no_room(self, part: PartitionQueue, exc: BackPressureError | ControlError, deadline_ns: int,
                 timeout_ms: int) -> None:
        """A publish found no room within its slice (or the control socket failed): reconnect if the
        appliance went away; raise once ``timeout_ms`` has passed (or for a control error); else return,
        to try again.  An offline partition (its log is damaged) fails its queued batches with that error."""
        if isinstance(exc, PartitionOfflineError):
            for batch in part.sealed:
                if batch.state != DONE:
                    batch.complete(-1, exc)
            return
        if not self.route.alive():
            self.reconnect()
            return
        if isinstance(exc, ControlError) or time.monotonic_ns() >= deadline_ns:
            if timeout_ms <= _PUBLISH_SLICE_MS:
                raise exc
            raise BackPressureError(
                f"partition {part.name}: no room to publish for max.block.ms {timeout_ms} ms ({exc})"
            ) from None

    def _after_publishing(self, part: PartitionQueue, now_ns: int, caller: bool) -> None:
        """Collect the acks a publish's wait read (also after an error: they are complete, not in flight,
        and must not wait in the channel's ``completed`` for the next call); after a caller's publish,
        have the timer thread look at the acks by _ACTIVE_POLL_NS from now, whatever it planned before (a
        far linger.ms, or nothing): this publish collects this partition's acks only."""
        channel = part.channel
        if channel is not None:
            self._collect(part)
            if caller and channel.in_flight:
                self._timer.wake_by(now_ns + _ACTIVE_POLL_NS)

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
            channel = part.channel = self.route.open_channel(
                part.topic_name, part.index, self.producer_id,
                track_acks=cfg.acks != 0,
                max_in_flight=cfg.max_in_flight,
                max_block_ms=cfg.max_block_ms,
                acks=cfg.acks,
            )
            route, topic, index = self.route, part.topic_name, part.index
            part.storage_detail = lambda: route.storage_detail(topic, index)
        return channel

    def _publish(self, part: PartitionQueue, batch: ProducerBatch, timeout_ms: int) -> None:
        """Build ``batch`` straight into a channel frame and publish it (BackPressureError: not published)."""
        cfg = self.config
        channel = self._channel(part)
        columns, max_bytes = batch.plan(cfg.compression)
        if self.route.requires_keys(part.topic_name) and self._refuse_keyless(part, batch, columns):
            return
        if cfg.idempotent:
            part.number(batch)
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

    @staticmethod
    def _refuse_keyless(part: PartitionQueue, batch: ProducerBatch, columns: Records) -> bool:
        """Fail ``batch`` (not sent, no sequence used) if it has keyless records: each of them with its own
        InvalidRecordError, the others with the batch's, as the broker answers (``storage.record_checks``)."""
        keyless = keyless_columns(columns)
        if not keyless.size:
            return False
        refused = refusal(part.name, keyless)
        pairs = zip(refused.indexes, refused.record_messages, strict=True)
        batch.complete(-1, InvalidRecordError(refused.message), {i: InvalidRecordError(m) for i, m in pairs})
        return True

    def _replace_channel(self, part: PartitionQueue, *, detach: bool = True) -> None:
        """The channel failed (the writer failed our ring: frames before the bad one were appended and
        acknowledged, none after; a TCP connection broke): take the acks that arrived, queue the rest again
        in order with the same sequences (a batch appended after all is recognised as a duplicate), and
        drop the channel; the next publish opens a new one."""
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
                self.route.drop_channel(channel)
            else:
                channel.close()
        except ApplianceError:
            pass

    def reconnect(self) -> None:
        """The supervisor went away (stopped, restarted, crashed): connect to the next one (up to
        max.block.ms), take the acks the old writers left in our rings, queue every batch still
        unacknowledged again in order with the same sequences (the new writers recognise those already
        appended), and attach new rings as batches are published."""
        _log.warning("producer %d: the appliance at %s went away; reconnecting", self.producer_id,
                     getattr(self.route, "path", "?"))
        self.route.reconnect(self.config.max_block_ms)
        for parts in self._queues.values():
            for part in parts:
                if part.channel is not None:
                    self._replace_channel(part, detach=False)
                    self._publishing[part] = None

    # -- acks -------------------------------------------------------------------------------------------

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

    # -- waiting ----------------------------------------------------------------------------------------

    def await_batches(self, batches: Sequence[ProducerBatch], timeout: float | None) -> None:
        """Seal, publish and wait for ``batches`` (handles' get, flush): the producer's
        :class:`~appliance.client.accumulator.BatchWaiter`.  RequestTimeoutError after ``timeout`` seconds.
        Takes the producer's lock for each step; waits without it."""
        deadline_ns = None if timeout is None else time.monotonic_ns() + int(timeout * 1e9)
        pending = [batch for batch in batches if not batch.settled]  # (without the lock: callbacks ran)
        while pending:
            with self._lock:
                pending = self._advance(pending, deadline_ns)
                if not pending:
                    return
                part = self._partition_of(pending[0])
                wait_on = self._oldest_in_flight(pending[0])
            remaining = _remaining_ms(deadline_ns)
            if remaining <= 0:
                raise RequestTimeoutError(
                    f"{len(pending)} batches (first: partition {part.name}, {pending[0].describe()}) not "
                    f"acknowledged within {timeout} s; they may still be delivered"
                )
            if wait_on is not None:
                self._wait_for_ack(wait_on[0], wait_on[1], remaining)
            else:
                time.sleep(min(remaining, self.config.retry_backoff_ms, _WAIT_SLICE_MS) / 1000)

    def _advance(self, pending: list[ProducerBatch], deadline_ns: int | None) -> list[ProducerBatch]:
        """One step of a wait, with the lock held: seal the batches still open, publish what their
        partitions can take, fail what expired; the batches not done yet.  (Under the lock a batch that is
        DONE has had its callbacks run, or they wait in the producer's CallbackQueue behind a callback this
        very thread is running: waiting for them would wait for itself.)"""
        for batch in pending:
            if batch.state == OPEN:
                part = self._partition_of(batch)
                if part.open is batch and batch.values:
                    self._seal(part)
        parts = {self._partition_of(batch): None for batch in pending}
        for part in parts:
            try:  # a full ring is not an error for a waiter: it waits on, up to its timeout
                self.publish_pending(part, min(_remaining_ms(deadline_ns), _WAIT_SLICE_MS))
            except BackPressureError:
                pass
        self._expire(time.monotonic_ns())
        return [batch for batch in pending if batch.state != DONE]

    def _oldest_in_flight(self, batch: ProducerBatch) -> tuple[BatchChannel, int] | None:
        """The channel of ``batch``'s partition and its oldest frame in flight (acks come in order)."""
        channel = self._partition_of(batch).channel
        if channel is not None and channel.in_flight:
            return channel, channel.in_flight[0][0]
        return None

    def _wait_for_ack(self, channel: BatchChannel, seq: int, remaining_ms: int) -> None:
        """Outside the lock: park on the channel until frame ``seq`` may be answered (a ring's semaphore, a
        socket's select; only its header or its readiness is read).  A long silence may mean the appliance
        went away: reconnect then, under the lock."""
        try:
            acked = channel.wait_acked(seq, min(remaining_ms, _WAIT_SLICE_MS))
        except RingFailedError:
            acked = True  # handled under the lock on the next round
        if not acked and time.monotonic_ns() - channel.last_ack_ns > _SILENCE_NS:
            with self._lock:
                if not self._closed and not self.route.alive():
                    self.reconnect()

    def _partition_of(self, batch: ProducerBatch) -> PartitionQueue:
        return self._queues[batch.topic][batch.partition]

    # -- the timer thread's round -----------------------------------------------------------------------

    def _silent(self, now: int) -> bool:
        """Some partition has frames in flight and no ack came for a while."""
        for part in self._publishing:
            channel = part.channel
            if channel is not None and channel.in_flight and now - channel.last_ack_ns > _SILENCE_NS:
                return True
        return False

    def _round(self, now: int, linger_ns: int) -> int:
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
                # collected then (each wake-up of this thread costs CPU; waking _ACK_POLL_NS after each
                # partition's last collect would wake it per batch with the sticky partitioner).
                return min(self._last_activity_ns + _ACTIVE_POLL_NS, due)
        self._next_full_round_ns = now + _FULL_ROUND_NS
        quiet = now - self._last_activity_ns > _IDLE_NS
        if quiet and self._silent(now) and not self.route.alive():
            self.reconnect()
        held = self._collect_and_publish()
        next_wake, lingering_held = self._seal_lingering(now, linger_ns)
        held = held or lingering_held
        self._expire(now)
        if self._publishing or held:
            poll_at = now + (_HELD_POLL_NS if held else _ACK_POLL_NS)
            next_wake = poll_at if next_wake < 0 else min(next_wake, poll_at)
        elif next_wake < 0 and now - self._last_activity_ns < _ACTIVE_POLL_NS:
            # nothing in flight, but the caller is publishing: a planned round spares each of its publishes
            # a poke (a wake-up of this thread); after _ACTIVE_POLL_NS of quiet the thread sleeps until poked
            next_wake = self._last_activity_ns + _ACTIVE_POLL_NS
        return next_wake

    def _collect_and_publish(self) -> bool:
        """Collect every publishing partition's acks and publish what can go without waiting; True if a
        sealed batch still waits for a slot."""
        held = False
        for part in list(self._publishing):
            try:
                self._collect(part)
                if part.sealed and not part.recovering:
                    self.publish_pending(part, 0, caller=False)
                held = held or (bool(part.sealed) and not part.recovering)
            except ApplianceError:
                pass  # reported to the caller through the batches (or on its next call)
        return held

    def _seal_lingering(self, now: int, linger_ns: int) -> tuple[int, bool]:
        """Seal and publish the open batches whose linger.ms ran out and whose partition can take them
        (oldest first); when the next one's linger.ms runs out (-1: none lingers), and whether one was
        held back for lack of a slot."""
        held = False
        for part in list(self._lingering):  # oldest first
            batch = part.open
            if now < batch.first_append_ns + linger_ns:
                return batch.first_append_ns + linger_ns, held
            try:
                if not self.can_publish(part, now):
                    held = True
                    continue
                self._seal(part)
                self.publish_pending(part, 0, caller=False)
            except ApplianceError:
                pass
        return -1, held

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

    # -- lifetime ---------------------------------------------------------------------------------------

    def abandon_all(self) -> None:
        """The producer closes: fail every batch not acknowledged and close the channels."""
        self._closed = True
        for parts in self._queues.values():
            for part in parts:
                part.abandon(RequestTimeoutError(
                    f"partition {part.name}: the producer closed before the batch was acknowledged"
                ))
                if part.channel is not None:
                    part.channel.close()
                    part.channel = None

    def stop(self) -> None:
        """End the timer thread (without the lock: its round may be waiting for it), close the route."""
        self._timer.stop()
        self.route.close()


def _remaining_ms(deadline_ns: int | None) -> int:
    if deadline_ns is None:
        return 2**62
    return max(0, (deadline_ns - time.monotonic_ns()) // 1_000_000)


def _build_frame(region: np.ndarray, **build: Any) -> int:
    """Write one batch at the start of ``region`` (a reserved channel frame); its size, or -1 if too big."""
    size = build_into(region, 0, build.pop("columns"), **build)
    return size if size != NO_SPACE else -1
