"""The producer's batches: records gathered for one partition, then built into ring memory, then acknowledged.

Theory of operation
-------------------
A :class:`ProducerBatch` holds the records ``Producer.send`` appended for one partition: the values in one
plain Python list (a list append is the cheapest thing Python can do per record).  Keys, headers and
explicit timestamps are *sparse*: ``(index, ...)`` entries for the records that have them, so the value-only
per-record path appends to ``values`` alone and never pads anything, whatever records came before.  A
:class:`ColumnBatch` holds a slice of ``Producer.send_many``'s columns instead: numpy buffers and offsets,
never split into Python objects.

:meth:`ProducerBatch.plan` turns a batch into what ``storage.batch_builder.build_into`` takes (which
writes the whole RecordBatch v2 straight into the reserved ring frame): a value-only batch as its
``values`` list itself (the builder reads each value in place), any other as columns.  It bounds the
built size without a sizing pass of its own (the builder does the exact one): per record at most 13 bytes
of varints and attributes besides its value (4 more with a key, 10 per header besides its name and value,
and 9 more for *every* record of a batch holding an explicit timestamp: deltas from the first timestamp
may then be large).  The same bound is the ``batch.size`` accounting (``room_bytes``), so a batch never
outgrows it.  Who may append to or seal an open batch: whoever holds the producer's :class:`AppendToken`.

Life of a batch (``state``)::

    OPEN ── sealed: full, linger.ms passed, flush, get() ──> SEALED ── published into the ring ──> PUBLISHED
                                                                                                   │
                         DONE  <── ack: base offset, or an error (then ``error``) ─────────────────┘

**Completion and callbacks** (Kafka's guarantees, which hold whichever thread collects an ack).  A batch is
completed exactly once (:meth:`ProducerBatch.complete`: a second answer for a done batch changes nothing):
it becomes DONE at once, for the producer's bookkeeping, and its callbacks run through the producer's
:class:`CallbackQueue`, which runs whole batches one after another in the order they completed.  The
producer completes batches under its lock, each partition's in publish order, so the callbacks of records
sent to one partition run in send order: also when a callback causes more completions on its own thread
(it sends with ``linger.ms=0``, calls ``get`` or ``flush``: the acks that collects complete their batches
at once, but their callbacks wait in the queue until the running batch's callbacks returned).  Callbacks of
different partitions keep no order between them.  A handle resolves -- ``done()``, ``get()``, and so
``flush()`` -- only once its batch's callbacks ran (``settled``): Kafka's future completes after them.  From
within a callback, ``get`` of a record whose callbacks wait behind the running one returns once it is
acknowledged (waiting for them there would wait for itself).

("linger.ms passed" seals a batch only once its partition can take it: an in-flight slot free, nothing
queued ahead; until then records keep joining it.  See ``appliance.client.sender``.)

A batch's ``base_sequence`` (idempotent producers) is given when it is first published and kept for ever:
a retry publishes the very same records with the very same sequence, which the writer recognises.
Handles (:class:`RecordHandle`, :class:`BulkHandle`) point at batches; a record's offset is its batch's base
offset plus its index, computed only when asked for.  A handle that must wait (``get``) calls the
:class:`BatchWaiter` its batches were made with: the producer's sender seals, publishes and waits for them.
This module knows nothing of the producer itself.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple, Protocol

import numpy as np

from storage.batch_builder import ByteColumn, HeaderColumns, RecordColumns, Records
from storage.batch_header import HEADER_SIZE
from storage.compression import compress_bound
from storage.errors import ApplianceError

__all__ = [
    "DONE",
    "HEADER_OVERHEAD_BYTES",
    "KEY_ESTIMATE_BYTES",
    "OPEN",
    "PUBLISHED",
    "RECORD_ESTIMATE_BYTES",
    "SEALED",
    "TIMESTAMP_ESTIMATE_BYTES",
    "AppendToken",
    "BatchWaiter",
    "BulkHandle",
    "BulkMetadata",
    "CallbackQueue",
    "ColumnBatch",
    "ProducerBatch",
    "RecordHandle",
    "RecordMetadata",
    "as_bytes",
    "check_headers",
    "pack_column",
    "record_payload",
]

OPEN, SEALED, PUBLISHED, DONE = 0, 1, 2, 3

HEADER_OVERHEAD_BYTES = 10  # per record header: name length and value length varints, at most
# batch.size accounting (the room left in a batch): what a record takes besides its key, value and headers,
# at most, for batches below 128 MiB: attributes 1, timestampDelta 1 (no explicit timestamps), offsetDelta
# <= 4, keyLength 1 (null key), valueLength <= 4, headerCount 1, length <= 4 -- 13 would do for any mix
# that occurs (a length needs 4 bytes only beyond 1 MiB, when a batch has a single record).  A key adds
# up to 4 more bytes of length, an explicit timestamp up to 9 more of delta.
RECORD_ESTIMATE_BYTES = 13
KEY_ESTIMATE_BYTES = 4
TIMESTAMP_ESTIMATE_BYTES = 9

Callback = Callable[[ApplianceError | None, Any], object]
Header = tuple[str, bytes | None]


class BatchWaiter(Protocol):
    """How a handle waits for its batches: seal them if still open, publish them, and return once each is
    acknowledged or failed; RequestTimeoutError after ``timeout`` seconds (they keep going).  The
    producer's ``Sender.await_batches``."""

    def __call__(self, batches: Sequence[ProducerBatch], timeout: float | None) -> None: ...


class RecordMetadata(NamedTuple):
    """Where a record went: Kafka's RecordMetadata.  ``offset`` is -1 with acks=0 (nobody waited)."""

    topic: str
    partition: int
    offset: int
    timestamp: int  # ms: the record's CreateTime


class BulkMetadata(NamedTuple):
    """Where each record of a ``send_many`` went, in the order given (numpy arrays of equal length)."""

    topic: str
    partitions: np.ndarray  # int32
    offsets: np.ndarray  # int64; -1 with acks=0
    timestamps: np.ndarray  # int64 ms


def pack_column(items: Sequence[Any], has_nulls: bool) -> ByteColumn:
    """A list of byte strings (``None`` = null when ``has_nulls``) as one buffer with offsets."""
    count = len(items)
    offsets = np.empty(count + 1, np.int64)
    offsets[0] = 0
    if not has_nulls:
        np.cumsum(np.fromiter(map(len, items), np.int64, count), out=offsets[1:])
        return ByteColumn(np.frombuffer(b"".join(items), np.uint8), offsets)
    nulls = np.fromiter((item is None for item in items), np.bool_, count)
    present = [b"" if item is None else item for item in items]
    np.cumsum(np.fromiter(map(len, present), np.int64, count), out=offsets[1:])
    return ByteColumn(np.frombuffer(b"".join(present), np.uint8), offsets, nulls)


_TOKEN_WAIT_LIMIT_S = 10.0  # a token not given back for this long is a bug, not contention


class AppendToken:
    """Whoever holds this token may append records to a producer's open batches or seal them.

    Why not the producer's lock: an uncontended ``RLock`` acquire and release costs more than everything
    else ``send`` does for a record but the handle (docs/performance.md, "The producer: figures behind its
    design").  The token is one object in a one-item list (:attr:`free`): ``free.pop()`` takes it and
    ``free.append(None)`` gives it back, each one C call that CPython runs atomically (no other thread runs
    in between).

    * The per-record path (``Producer.send`` with a value only) takes it with ``free.pop()`` and never waits:
      if it is taken (``IndexError``) it goes the general way instead.  It holds it for a few bytecodes
      (read the open batch, append the value, count the room) and gives it back.
    * Every other path that touches open batches (the general per-record path, sealing -- full, linger.ms,
      flush, get, close -- and send_many) holds the producer's lock first and then :meth:`take` s the token,
      waiting only for a per-record path on another thread to give it back (a few bytecodes; the wait gives
      up the GIL with ``time.sleep(0)`` so that thread runs), then :meth:`give` s it back.

    So a batch is sealed only while no ``send`` is between reading it and appending to it, and records are
    appended only to open batches.  Rules that keep the waits short and deadlock-free: lock order is
    producer lock, then token; while holding the token nothing blocks, takes it again, or runs user code
    (callbacks run under the producer's lock only, so a callback may send).  What the token cannot allow: a
    ``send`` from a signal handler or a finalizer (``__del__``) that interrupted a ``send`` on the same
    thread: it would wait for itself, and after 10 s it raises RuntimeError (a re-entrant lock would let it
    go on and could give two records one index).  Set a flag there and send from the loop.
    """

    __slots__ = ("free",)

    def __init__(self) -> None:
        self.free: list[None] = [None]  # empty while someone holds the token

    def take(self) -> None:
        """Take the token (with the producer's lock held); waits while a ``send`` holds it."""
        free = self.free
        try:
            free.pop()
            return
        except IndexError:
            pass
        deadline = time.monotonic() + _TOKEN_WAIT_LIMIT_S
        while True:
            time.sleep(0)  # a send() on another thread holds it for a few bytecodes: let it run
            try:
                free.pop()
                return
            except IndexError:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"producer append token not given back for {_TOKEN_WAIT_LIMIT_S} s: send() called "
                        "from a signal handler or __del__ that interrupted send() on this thread?"
                    ) from None

    def give(self) -> None:
        self.free.append(None)

    def __enter__(self) -> None:
        self.take()

    def __exit__(self, *exc: object) -> None:
        self.free.append(None)


class CallbackQueue:
    """Runs completed batches' callbacks one batch after another, in the order the batches completed.

    :meth:`run` is called (with the producer's lock held, so by one thread at a time) by every batch that
    completes.  When no batch's callbacks are running it runs them at once; when they are -- a callback
    caused the completion (it sent and so collected acks, or waited with ``get``/``flush``) -- the batch
    waits in the queue and the loop already running runs its callbacks after the running batch's.  So a
    later batch's callbacks never run in the middle of an earlier one's.  One queue per producer."""

    __slots__ = ("_queue", "_running")

    def __init__(self) -> None:
        self._queue: deque[ProducerBatch] = deque()
        self._running = False

    def run(self, batch: ProducerBatch) -> None:
        queue = self._queue
        queue.append(batch)
        if self._running:
            return  # (a callback's doing: the loop below, further up this thread's stack, runs it)
        self._running = True
        try:
            while queue:
                queue.popleft().settle()
        finally:
            self._running = False  # (an exception out of a callback, e.g. KeyboardInterrupt: the batches
            # still queued run with the next completion)


class ProducerBatch:
    """Records for one partition from the first append to the ack.  See the module docstring.

    ``completions``: the producer's :class:`CallbackQueue` (None: a queue of the batch's own, for batches
    made outside a producer)."""

    __slots__ = (
        "attempts",
        "base_offset",
        "base_sequence",
        "callbacks",
        "completions",
        "created_ns",
        "error",
        "extra_bytes",
        "first_append_ns",
        "headers",
        "keys",
        "null_values",
        "partition",
        "plan_cache",
        "record_bytes",
        "record_errors",
        "refused_code",
        "room_bytes",
        "settled",
        "size_bytes",
        "state",
        "timestamp_ms",
        "timestamps",
        "topic",
        "values",
        "waiter",
    )

    def __init__(self, waiter: BatchWaiter, topic: str, partition: int, size_bytes: int, *,
                 completions: CallbackQueue | None = None) -> None:
        self.waiter = waiter  # how a handle waits for this batch (the producer's sender)
        self.completions = completions if completions is not None else CallbackQueue()
        self.topic = topic
        self.partition = partition
        self.values: list[bytes | None] = []  # every record's value, in order
        # The optional parts are sparse, (index, ...) for the records that have them, so the per-record path
        # (value only) appends to ``values`` alone and never has to pad the others.
        self.keys: list[tuple[int, bytes]] | None = None
        self.headers: list[tuple[int, Sequence[Header]]] | None = None
        self.timestamps: dict[int, int] | None = None
        self.callbacks: list[tuple[int, Callback]] | None = None
        self.null_values = False
        # batch.size accounting: what a value-only record takes besides its value, at most (more once a
        # record of the batch has an explicit timestamp: every record's delta may then be large)
        self.record_bytes = RECORD_ESTIMATE_BYTES
        self.size_bytes = size_bytes  # records-section bytes the batch may hold (batch.size)
        self.room_bytes = size_bytes  # records-section bytes left (a bound, not an estimate)
        self.extra_bytes = 0  # key and header bytes and their length varints
        self.plan_cache: tuple[Records, int] | None = None
        self.created_ns = time.monotonic_ns()
        self.first_append_ns = 0  # monotonic ns of the first record (linger.ms counts from it)
        self.timestamp_ms = 0  # CreateTime of records sent without a timestamp (the first append's clock)
        self.state = OPEN
        self.settled = False  # DONE and its callbacks ran: handles resolve
        self.base_sequence = -1
        self.base_offset = -1
        self.error: ApplianceError | None = None
        self.record_errors: Mapping[int, ApplianceError] | None = None  # index -> its own delivery error
        self.attempts = 0
        self.refused_code = 0  # the Kafka error code of the last answer refusing it (0: none yet)

    @property
    def record_count(self) -> int:
        return len(self.values)

    # -- the general per-record path (the producer inlines the value-only case) -----------------------

    def append(
        self,
        value: bytes | None,
        key: bytes | None,
        headers: Sequence[Header] | None,
        timestamp: int | None,
        callback: Callback | None,
    ) -> int:
        """Append one record (already validated, room checked with :meth:`needs`); return its index."""
        values = self.values
        index = len(values)
        if index == 0:
            self.started()
        if timestamp is not None:
            if self.timestamps is None:
                self.timestamps = {}
                self.record_bytes += TIMESTAMP_ESTIMATE_BYTES
                self.room_bytes -= TIMESTAMP_ESTIMATE_BYTES * index  # the records already in
            self.timestamps[index] = timestamp
        extra = 0
        if key is not None:
            if self.keys is None:
                self.keys = []
            self.keys.append((index, key))
            extra += len(key) + KEY_ESTIMATE_BYTES
        if headers:
            if self.headers is None:
                self.headers = []
            self.headers.append((index, headers))
            for name, header_value in headers:
                extra += HEADER_OVERHEAD_BYTES + len(name.encode("utf-8"))
                if header_value is not None:
                    extra += len(header_value)
        if callback is not None:
            if self.callbacks is None:
                self.callbacks = []
            self.callbacks.append((index, callback))
        if value is None:
            self.null_values = True
        values.append(value)
        self.extra_bytes += extra
        self.room_bytes -= self.record_bytes + extra + (0 if value is None else len(value))
        return index

    def needs(self, payload_bytes: int, timestamped: bool) -> int:
        """Room a record of ``payload_bytes`` (:func:`record_payload`) takes in this batch, at most."""
        if timestamped and self.timestamps is None:  # the first explicit timestamp widens every record
            return payload_bytes + self.record_bytes + TIMESTAMP_ESTIMATE_BYTES * (len(self.values) + 1)
        return payload_bytes + self.record_bytes

    def started(self) -> None:
        """The first record arrives: start the linger clock and delivery.timeout.ms's (an empty batch
        waits for its first record as long as the partition is quiet), and take the batch's CreateTime."""
        self.first_append_ns = self.created_ns = time.monotonic_ns()
        self.timestamp_ms = time.time_ns() // 1_000_000

    # -- building -------------------------------------------------------------------------------------

    def plan(self, compression: int) -> tuple[Records, int]:
        """The records as the numba builder takes them, and the most bytes the built batch can take (ring
        space to reserve).  Computed once: a retry builds the same bytes from the same records.

        Value-only batches (the per-record path's) go as the ``values`` list itself, which the builder reads
        in place: no per-record work here at all, and the bound is the ``batch.size`` accounting's
        (``size_bytes - room_bytes``).  Others are packed into columns."""
        if self.plan_cache is None and self.keys is None and self.headers is None and self.timestamps is None:
            self.plan_cache = (self.values, self.size_bytes - self.room_bytes)
        if self.plan_cache is None:
            count = len(self.values)
            values = pack_column(self.values, self.null_values)
            keys = None
            if self.keys is not None:
                key_list: list[bytes | None] = [None] * count
                for index, key in self.keys:
                    key_list[index] = key
                keys = pack_column(key_list, len(self.keys) < count)
            headers = None
            if self.headers is not None:
                header_lists: list[Sequence[Header]] = [()] * count
                for index, pairs in self.headers:
                    header_lists[index] = pairs
                headers = HeaderColumns.from_lists(header_lists)
            stamps = None
            if self.timestamps is not None:
                stamps = np.full(count, self.timestamp_ms, np.int64)
                stamps[list(self.timestamps)] = list(self.timestamps.values())
            records_bytes = int(values.offsets[-1]) + self.extra_bytes + self.record_bytes * count
            self.plan_cache = (RecordColumns(values, keys, headers, stamps), records_bytes)
        columns, records_bytes = self.plan_cache
        return columns, HEADER_SIZE + compress_bound(compression, records_bytes)

    def timestamp_of(self, index: int) -> int:
        if self.timestamps is None:
            return self.timestamp_ms
        return self.timestamps.get(index, self.timestamp_ms)

    # -- completion -----------------------------------------------------------------------------------

    def complete(self, base_offset: int, error: ApplianceError | None,
                 record_errors: Mapping[int, ApplianceError] | None = None) -> None:
        """The writer answered (or the producer gave up): the batch is DONE; its callbacks run through the
        producer's :class:`CallbackQueue` (now, or after those already running), then handles resolve.  A
        batch already done stays as it was (a batch completes once).

        ``record_errors`` (with ``error``): the batch was refused for the sake of these records (by index),
        each with its own error; the others fail with ``error`` (Kafka's KIP-467 record errors)."""
        if self.state == DONE:
            return
        self.base_offset = base_offset
        self.error = error
        self.record_errors = record_errors if error is not None else None
        self.state = DONE
        self.plan_cache = None  # the records are in the log now (or never will be): free them
        self.keys = self.headers = None
        self.values = _CountOnly(len(self.values))  # type: ignore[assignment]
        self.completions.run(self)

    def settle(self) -> None:
        """Run the callbacks of a done batch (its :class:`CallbackQueue` calls this), then resolve its
        handles."""
        self.run_callbacks()
        self.settled = True

    def run_callbacks(self) -> None:
        if self.callbacks:
            callbacks, self.callbacks = self.callbacks, None
            error = self.error
            for index, callback in callbacks:
                _call(callback, self.error_of(index), None if error else self.metadata(index))

    def error_of(self, index: int) -> ApplianceError | None:
        """The delivery error of record ``index`` of a done batch (None: delivered)."""
        if self.record_errors is not None:
            return self.record_errors.get(index, self.error)
        return self.error

    def metadata(self, index: int) -> RecordMetadata:
        offset = self.base_offset + index if self.base_offset >= 0 else -1
        return RecordMetadata(self.topic, self.partition, offset, self.timestamp_of(index))

    def describe(self) -> str:
        sequence = f", sequence {self.base_sequence}" if self.base_sequence >= 0 else ""
        return f"{self.record_count} records{sequence}"


class ColumnBatch(ProducerBatch):
    """A batch cut from ``send_many``'s columns: ``indexes`` says which input records it holds."""

    __slots__ = ("_columns", "bulk", "encoded_bound", "indexes")

    def __init__(self, waiter: BatchWaiter, topic: str, partition: int, columns: RecordColumns,
                 indexes: np.ndarray | slice, encoded_bound: int, timestamp_ms: int,
                 bulk: BulkHandle, *, completions: CallbackQueue | None = None) -> None:
        super().__init__(waiter, topic, partition, 0, completions=completions)
        self._columns = columns
        self.indexes = indexes
        self.encoded_bound = encoded_bound  # records section bytes, at most (before compression)
        self.timestamp_ms = timestamp_ms
        self.first_append_ns = self.created_ns
        self.bulk = bulk
        count = columns.values.item_count
        self.values = _CountOnly(count)  # type: ignore[assignment]
        self.state = SEALED

    def plan(self, compression: int) -> tuple[Records, int]:
        return self._columns, HEADER_SIZE + compress_bound(compression, self.encoded_bound)

    def timestamp_of(self, index: int) -> int:
        stamps = self._columns.timestamps
        return self.timestamp_ms if stamps is None else int(stamps[index])

    def column_timestamps(self) -> np.ndarray | None:
        return self._columns.timestamps

    def run_callbacks(self) -> None:
        super().run_callbacks()
        self.bulk.batch_done(self.error)


class _CountOnly:
    """Stands in for the values list of a ColumnBatch: only its length is ever asked for."""

    __slots__ = ("_count",)

    def __init__(self, count: int) -> None:
        self._count = count

    def __len__(self) -> int:
        return self._count


def _call(callback: Callback, error: ApplianceError | None, metadata: object) -> None:
    """Run a user callback; an exception in it is reported, never allowed to break the producer."""
    try:
        callback(error, metadata)
    except Exception:  # a user's bug must not lose other records' acks
        import logging

        logging.getLogger("appliance.producer").exception("producer callback %r raised", callback)


class RecordHandle:
    """What ``send`` returns: resolves to the record's :class:`RecordMetadata` (Kafka's Future)."""

    __slots__ = ("_batch", "_index")

    def __init__(self, batch: ProducerBatch, index: int) -> None:
        self._batch = batch
        self._index = index

    def get(self, timeout: float | None = None) -> RecordMetadata:
        """Wait until the writer acknowledged the record (sealing and publishing its batch now if it still
        lingers); return where it went.  Raises the delivery error, or RequestTimeoutError after ``timeout``
        seconds (the record may still be delivered later)."""
        batch = self._batch
        if not batch.settled:
            batch.waiter([batch], timeout)
        error = batch.error_of(self._index)
        if error is not None:
            raise error
        return batch.metadata(self._index)

    def done(self) -> bool:
        """True once the record is acknowledged or failed and its batch's callbacks ran (never waits,
        never publishes)."""
        return self._batch.settled

    def exception(self) -> ApplianceError | None:
        """The delivery error of a done record, else None."""
        return self._batch.error_of(self._index)

    def __repr__(self) -> str:
        batch = self._batch
        state = ("open", "sealed", "published", "done")[batch.state]
        return f"<RecordHandle {batch.topic}-{batch.partition}[{self._index}] {state}>"


class BulkHandle:
    """What ``send_many`` returns: resolves to one :class:`BulkMetadata` for the whole lot."""

    __slots__ = ("_callback", "_pending", "batches", "count", "error", "topic", "waiter")

    def __init__(self, waiter: BatchWaiter, topic: str, count: int, callback: Callback | None) -> None:
        self.waiter = waiter
        self.topic = topic
        self.count = count
        self.batches: list[ColumnBatch] = []
        self.error: ApplianceError | None = None
        self._pending = 0
        self._callback = callback

    def add(self, batch: ColumnBatch) -> None:
        self.batches.append(batch)
        self._pending += 1

    def batch_done(self, error: ApplianceError | None) -> None:
        """One of the batches is done (its callbacks run now): the last one runs the callback, and only
        then is the whole lot done."""
        if error is not None and self.error is None:
            self.error = error
        if self._pending == 1 and self._callback is not None:
            callback, self._callback = self._callback, None
            _call(callback, self.error, None if self.error else self.metadata())
        self._pending -= 1

    def finish_empty(self) -> None:
        """No records at all: done at once."""
        if self._callback is not None:
            callback, self._callback = self._callback, None
            _call(callback, None, self.metadata())

    def done(self) -> bool:
        return self._pending == 0

    def get(self, timeout: float | None = None) -> BulkMetadata:
        """Wait for every batch; return where each record went.  Raises the first delivery error (the
        other batches may have been appended: see ``batches``), or RequestTimeoutError after ``timeout``."""
        if self._pending:
            self.waiter(self.batches, timeout)
        if self.error is not None:
            raise self.error
        return self.metadata()

    def metadata(self) -> BulkMetadata:
        partitions = np.empty(self.count, np.int32)
        offsets = np.empty(self.count, np.int64)
        timestamps = np.empty(self.count, np.int64)
        for batch in self.batches:
            n = batch.record_count
            partitions[batch.indexes] = batch.partition
            if batch.base_offset >= 0:
                offsets[batch.indexes] = np.arange(batch.base_offset, batch.base_offset + n, dtype=np.int64)
            else:
                offsets[batch.indexes] = -1
            stamps = batch.column_timestamps()
            timestamps[batch.indexes] = batch.timestamp_ms if stamps is None else stamps
        return BulkMetadata(self.topic, partitions, offsets, timestamps)


# -- record checks (the general per-record path and send_many) --------------------------------------


def as_bytes(value: object, what: str) -> bytes | None:
    if value is None or value.__class__ is bytes:
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, np.ndarray):
        return value.tobytes()
    raise TypeError(
        f"record {what} must be bytes (or bytearray, memoryview, None), got {type(value).__name__}; "
        "encode it first, e.g. text.encode()"
    )


def check_headers(headers: Iterable[Header]) -> list[Header]:
    checked = []
    for header in headers:
        if not (isinstance(header, tuple) and len(header) == 2 and isinstance(header[0], str)):
            raise TypeError(f"record header {header!r}: expected a (str, bytes | None) pair")
        checked.append((header[0], as_bytes(header[1], f"header {header[0]!r} value")))
    return checked


def record_payload(value: bytes | None, key: bytes | None, headers: Sequence[Header] | None) -> int:
    """A record's bytes in a batch besides the per-record varints a value-only record has: the value, the
    key and its length, the headers and their lengths (batch.size accounting: a bound)."""
    size = 0 if value is None else len(value)
    if key is not None:
        size += len(key) + KEY_ESTIMATE_BYTES
    for name, header_value in headers or ():
        size += HEADER_OVERHEAD_BYTES + len(name.encode("utf-8"))
        size += 0 if header_value is None else len(header_value)
    return size
