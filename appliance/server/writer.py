"""The partition writer: the one process that appends to a partition's log.

Theory of operation
-------------------
The supervisor forks one writer per partition (after its imports, so code and numba kernels are shared
copy-on-write) and commands it over a socketpair (``appliance.server.writer_channel``: attach and detach
rings, stop, run timers, reload settings, DeleteRecords, swap a cleaned segment in).

**One drain round** (:meth:`PartitionWriter.drain_round`):

1. peek every ring: the published frames after its read cursor, up to ``peek_bytes`` each, in one chunk;
2. for each frame, in ring order then frame order: validate, once (one RecordBatch v2 per frame, exactly
   filling it: ``batch_header.check_batch`` checks magic, length and CRC; then ``max.message.bytes``, and
   a CreateTime topic's timestamp rules: maxTimestamp set to the records', the limits: INVALID_TIMESTAMP,
   ``storage.timestamp_rules``; the records of every uncompressed CreateTime frame of a ring's chunk are
   walked in one numba call before the frames are, ``records_max_timestamps``, and a batch whose header
   already holds its records' max timestamp, with no limit set, goes on at once), then
   ask the idempotence state (``storage.producer_state``): append -> the offset it will get, and the state is
   updated at once so a retry later in the same round is seen as a duplicate; duplicate -> the offset the
   original got, nothing appended; anything else -> minus the Kafka error code;
3. ONE append of every accepted frame of every ring, straight from ring memory: ``Log.append_batches``
   trusts the headers of step 2, stamps offsets into the frames in place and writes them with one
   ``os.writev`` per segment touched (no copy, no second validation);
4. publish the new log end offset in the state page (and the high watermark: while a partition has no
   followers, replication factor 1, the writer owns it and HW = LEO);
5. acknowledge every frame (its result in the ring's ack slot) and only then release the ring space;
6. wake the local consumers sleeping on the high watermark (``ipc.state_page``; last, because a woken
   consumer often takes the writer's core at once), and the broker: one ``eventfd_write`` on the
   appliance's broker wake-up eventfd (``WriterSpec.broker_wake_fd``), which the broker watches in its
   ``select`` while it holds a Fetch or leads a replicated partition (``appliance.broker.broker``), so a held
   fetch and the high watermark of a partition whose followers are in sync move without the broker polling.

A writer killed anywhere loses nothing acknowledged: acks are written after the append, space is released
after the acks.  A restarted writer reads the unreleased frames again.  Those it had appended are
duplicates: the producer state recovered from the log (snapshot + tail) recognises the last five batches of
each producer; older ones are found in the *resume map* (``appliance.server.resume_map``).

Bad input never stops the writer: a frame that is not one valid batch is answered CORRUPT_MESSAGE (a bad
CRC, garbage, a length that does not match), MESSAGE_TOO_LARGE or INVALID_TIMESTAMP, nothing of it is
appended, the ring goes on.
A frame the ring protocol itself cannot trust (a bad frame length, type or sequence) fails that ring
(``RingFailedError`` for its producer, ``ipc/ring.py``); the other rings are served as before.

**Between rounds** the writer reads its commands and stamps "busy since" in the state page
(``StatePage.writer_busy``) on every loop after one that found nothing to drain, but at most every 10 ms
while rounds follow one another: right after a large ``writev`` the caches are cold, and the command poll
and the stamp then cost a measurable share of each round (docs/performance.md, "What the naps changed").

**Idle**: with nothing published the writer runs its timers, stamps "asleep" in the state page and sleeps
on its doorbell (``ipc/wakeup.py``) until a producer or the supervisor rings it or its next timer is due
(``appliance.server.writer_timers``: ``flush.ms`` while data is unflushed, retention and producer-id expiry,
the re-measure of a full log dir), with no other wake-up.  Its liveness costs nothing: the supervisor sees
a dead writer exit, a stuck one in shared memory (``appliance.server.liveness``).

**A full log directory** (``appliance.server.disk_space``) is a state, not a crash.  An append that meets
``ENOSPC``/``EDQUOT`` raises ``KafkaStorageError`` with the log already back as it was (``storage.log``), and
a round that would leave less than ``log.dir.min.free.bytes`` free is not appended at all; either way every
frame of the round given an offset is answered KAFKA_STORAGE_ERROR (56, retriable) and the producer state
is reloaded as it was before the round (so a retry is not taken for a duplicate).  From then on new batches
are answered KAFKA_STORAGE_ERROR without touching the log (retries of appended ones still get their
offsets), until a measurement of the log dir, at most every 100 ms when frames arrive and on the idle
timer, finds room: then writes resume.  Acks, liveness stamps, retention and commands go on throughout;
a flush, a retention pass or a snapshot that finds no room is put off, not fatal.

**Fault points** (for crash tests, never set in production): ``faults(name)`` is called at ``"appended"``
(the round is in the log, nothing acknowledged) and ``"acknowledged"`` (acks published, space not
released); a test makes it raise to stop the writer exactly there, as a SIGKILL would, or block there
(``writer.stall`` of ``appliance.server.faults``, armed through ``appliance.test.faults``).

**Orphaned**: when the supervisor dies (killed) the kernel sends the writer SIGTERM (``PR_SET_PDEATHSIG``)
and its channel reaches EOF: the writer drains its rings as at a stop, fsyncs the log, and closes it
*without* the clean-shutdown marker: nobody stopped the appliance cleanly, so the next start checks the
log as after a crash (``storage.recovery``).

**Snapshots** of the producer state are written when the active segment rolls (not fsynced: a lost one is
detected and an older one used) and at a clean stop (fsynced), at the log end offset, so a restart replays
at most about one segment's headers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np

from appliance.server.disk_space import DiskSpace
from appliance.server.faults import UNREAD_RECORDS
from appliance.server.publish_trace import PublishTrace
from appliance.server.resume_map import ResumeMap, log_headers, published_records
from appliance.server.writer_admin import delete_records, swap_cleaned
from appliance.server.writer_channel import WriterChannel
from appliance.server.writer_spec import DEFAULT_PEEK_BYTES, WriterSpec
from appliance.server.writer_timers import WriterTimers
from ipc.kafka.errors import ErrorCode
from ipc.ring import Chunk, RingConsumer, RingFailedError, RingNames
from ipc.state_page import StatePage
from ipc.wakeup import Doorbell, Waiter
from storage.batch_header import (
    HEADER_SIZE,
    TIMESTAMP_TYPE_MASK,
    BatchHeader,
    check_batch,
    validate_batch,
)
from storage.errors import (
    CorruptRecordError,
    KafkaStorageError,
    describe_os_error,
    is_disk_full,
)
from storage.log import Log
from storage.log_config import LogConfig
from storage.producer_state import (
    DUPLICATE_SEQUENCE_NUMBER,
    NONE,
    OUT_OF_ORDER_SEQUENCE_NUMBER,
    ProducerStateManager,
)
from storage.timestamp_rules import (
    LOG_APPEND_TIME,
    NO_TIMESTAMP,
    NOT_WALKED,
    apply_timestamp_rules,
    limits_of,
    records_max_timestamps,
)

__all__ = ["DEFAULT_PEEK_BYTES", "FaultPoint", "PartitionWriter", "RoundStats", "WriterSpec"]

_HOUSEKEEPING_INTERVAL_NS: Final = 10_000_000  # commands, busy stamp: at most this often in a stream
_DEFAULT_STOP_TIMEOUT_MS: Final = 10_000
_ERRORS_LOGGED_PER_RING: Final = (
    5  # then one line per 1000 bad frames: a hostile producer cannot flood the log
)

_log = logging.getLogger("appliance.writer")

FaultPoint = Callable[[str], None]  # called with a fault point's name; raising there stops the writer


@dataclass(slots=True)
class _Ring:
    """One ring the writer serves."""

    names: RingNames
    consumer: RingConsumer
    resumed_records: int  # records in frames already published when we attached (a previous writer's)
    detaching: bool = False
    failed: bool = False
    bad_frames: int = 0
    reported: bool = False  # "detached" sent

    @property
    def name(self) -> str:
        return self.names.ring


@dataclass(slots=True)
class RoundStats:
    """What the writer has done since it started (for tests and the status op)."""

    rounds: int = 0
    frames: int = 0
    appended_batches: int = 0
    duplicates: int = 0
    rejected: int = 0
    appended_bytes: int = 0
    rings_failed: int = 0
    resume_hits: int = 0
    by_error: dict[int, int] = field(default_factory=dict)


class PartitionWriter:
    """The writer of one partition.  :meth:`open`, attach rings, :meth:`run` (or :meth:`drain_round` in
    tests), :meth:`close`.  Single-threaded."""

    def __init__(
        self,
        spec: WriterSpec,
        log: Log,
        state: ProducerStateManager,
        state_page: StatePage,
        doorbell: Doorbell,
        channel: socket.socket | None,
        faults: FaultPoint | None = None,
        free_bytes: Callable[[], int] | None = None,
    ) -> None:
        self.spec = spec
        self._faults = faults
        self.name = spec.name
        self.log = log
        self.producer_state = state
        self.state_page = state_page
        self._doorbell = doorbell
        self._waiter = Waiter(doorbell)
        self._channel = WriterChannel(spec.name, channel)
        self.rings: dict[str, _Ring] = {}
        self.stats = RoundStats()
        self._max_message_bytes = spec.log_config.max_message_bytes
        self._take_timestamp_settings(spec.log_config)
        self._active_base = log.active_segment.base_offset
        self._resume = ResumeMap(log, spec.name)
        self._stopping = False
        self._stop_timeout_ms = _DEFAULT_STOP_TIMEOUT_MS
        self._idle_stop = False  # stopped because no producer needs it: its lines at debug level
        self._closed = False
        self._trace = PublishTrace.maybe_open(spec.topic, spec.partition)  # benchmarks only
        self.disk = DiskSpace(spec.name, os.path.dirname(os.path.normpath(spec.directory)) or ".",
                              spec.log_dir_min_free_bytes, free_bytes)
        self.timers = WriterTimers(spec.name, log, state_page, state, self.disk,
                                   retention_check_interval_ms=spec.retention_check_interval_ms,
                                   retention_enabled=spec.retention_enabled)

    # -- lifetime -----------------------------------------------------------------------------------------

    @classmethod
    def open(
        cls, spec: WriterSpec, channel: socket.socket | None = None, *, faults: FaultPoint | None = None,
        free_bytes: Callable[[], int] | None = None,
    ) -> PartitionWriter:
        """Open (recovering if the last stop was unclean) the log, load the producer state, claim the state
        page and publish the offsets.  LogLockedError if another writer holds the log.  ``free_bytes``:
        how the log dir's free bytes are measured (default ``statvfs``; a test's seam)."""
        started = time.monotonic()
        log = Log.open(spec.directory, spec.log_config, topic_partition=(spec.topic, spec.partition))
        try:
            state = ProducerStateManager(spec.name, producer_id_expiration_ms=spec.producer_id_expiration_ms)
            now_ms = time.time_ns() // 1_000_000
            replay_from = state.recover(
                spec.directory,
                log_end_offset=log.log_end_offset,
                headers_from=lambda offset: log_headers(log, offset),
                append_time_ms=now_ms,
            )
            state.expire(now_ms)
            page = StatePage.attach(spec.state_page)
            try:
                doorbell = Doorbell.open(spec.doorbell)
            except BaseException:
                page.close()
                raise
        except BaseException:
            log.close(clean=False)
            raise
        writer = cls(spec, log, state, page, doorbell, channel, faults, free_bytes)
        page.claim_writer()
        writer._publish_offsets()
        page.log_start_offset = log.log_start_offset
        _log.info(
            "writer %s: log offsets %d..%d, %d producers (state replayed from offset %d) in %.0f ms",
            spec.name, log.log_start_offset, log.log_end_offset, len(state), replay_from,
            (time.monotonic() - started) * 1000,
        )  # fmt: skip
        return writer

    def close(self, *, clean: bool = True) -> None:
        """Detach every ring (they stay for a successor), snapshot the producer state and close the log."""
        if self._closed:
            return
        self._closed = True
        for ring in self.rings.values():
            ring.consumer.close()
        self.rings.clear()
        try:
            if clean:
                self._snapshot(self.log.log_end_offset, durable=True)
            self.log.close(clean=clean)
        finally:
            if self._trace is not None:
                self._trace.flush()
            self.state_page.close()
            self._doorbell.close()

    # -- rings --------------------------------------------------------------------------------------------

    def attach_ring(self, names: RingNames) -> None:
        """Serve ``names.ring`` from now on (resuming at its read cursor if a previous writer served it)."""
        if names.ring in self.rings:
            return
        consumer = RingConsumer.attach(names)
        resumed = published_records(consumer)
        self.rings[names.ring] = _Ring(names, consumer, resumed)
        self._resume.records += resumed
        _log.debug("writer %s: serving ring %s (%d records waiting)", self.name, names.ring, resumed)

    def detach_ring(self, ring_name: str) -> None:
        """Drain what is published in the ring, then stop serving it and report "detached"."""
        ring = self.rings.get(ring_name)
        if ring is None:
            self._send({"op": "detached", "ring": ring_name})
            return
        ring.detaching = True

    def _finish_detaches(self) -> None:
        for ring in [r for r in self.rings.values() if r.detaching]:
            if not ring.failed and ring.consumer.has_data():
                continue
            ring.consumer.close()
            del self.rings[ring.name]
            self._send({"op": "detached", "ring": ring.name})

    # -- the drain round ----------------------------------------------------------------------------------

    def drain_round(self) -> int:
        """Peek every ring, validate, dedup, append once, publish offsets, ack; return the frames handled."""
        if self._trace is not None:
            self._trace.round_start_ns = time.monotonic_ns()
        chunks: list[tuple[_Ring, Chunk]] = []
        for ring in self.rings.values():
            if ring.failed:
                continue
            try:
                chunk = ring.consumer.peek(self.spec.peek_bytes)
            except RingFailedError as exc:
                ring.failed = True
                self.stats.rings_failed += 1
                _log.warning("writer %s: %s", self.name, exc)
                continue
            if chunk is not None:
                chunks.append((ring, chunk))
        if not chunks:
            return 0
        state = self.producer_state
        end_before = next_offset = self.log.log_end_offset
        now_ms = time.time_ns() // 1_000_000
        full = self.disk.error is not None and self.disk.refused(time.monotonic_ns())
        pieces: list[memoryview] = []
        headers: list[BatchHeader] = []
        total_bytes = 0
        all_results = []
        frames = 0
        max_message_bytes = self._max_message_bytes
        limits = self._timestamp_limits
        for ring, chunk in chunks:
            results = np.empty(chunk.count, np.int64)
            view = memoryview(chunk.view)  # type: ignore[arg-type]
            starts = chunk.body_starts.tolist()
            lengths = chunk.body_lengths.tolist()
            walked = self._walk_records(chunk, results)
            for i in range(chunk.count):
                body = view[starts[i] : starts[i] + lengths[i]]
                header = check_batch(body)  # the one validation: magic, length, CRC (the log trusts it)
                if isinstance(header, int) or lengths[i] > max_message_bytes:
                    results[i] = -self._refuse(ring, chunk.first_seq + i, body)
                    continue
                if limits is None and walked and header.max_timestamp == walked[i] >= NO_TIMESTAMP:
                    pass  # a CreateTime batch whose header holds its records' max timestamp already
                elif self._read_records or header.attributes & TIMESTAMP_TYPE_MASK:  # Kafka's rules
                    header, late = apply_timestamp_rules(
                        body, header, now_ms, limits, log_append_time=self._log_append_time,
                        walked=NOT_WALKED if walked is None else walked[i])
                    if late is not None:
                        code = ErrorCode.CORRUPT_MESSAGE if late.corrupt else ErrorCode.INVALID_TIMESTAMP
                        results[i] = -code  # Kafka's answers; nothing of the batch is appended
                        self._reject(ring, chunk.first_seq + i, code, late.reason)
                        continue
                verdict = state.check(header)
                if verdict.code == NONE:
                    if full:  # the log directory cannot take writes (disk_space): nothing is appended
                        results[i] = -ErrorCode.KAFKA_STORAGE_ERROR
                        self._count_error(ErrorCode.KAFKA_STORAGE_ERROR)
                        continue
                    results[i] = next_offset
                    state.update(header, next_offset, now_ms)
                    pieces.append(body)
                    headers.append(header)
                    total_bytes += lengths[i]
                    next_offset += header.last_offset_delta + 1
                elif verdict.code == DUPLICATE_SEQUENCE_NUMBER:
                    results[i] = verdict.base_offset
                    self.stats.duplicates += 1
                else:
                    found = (
                        self._resume.lookup(header)
                        if verdict.code == OUT_OF_ORDER_SEQUENCE_NUMBER
                        else None
                    )
                    if found is not None:
                        results[i] = found
                        self.stats.duplicates += 1
                        self.stats.resume_hits += 1
                    else:
                        results[i] = -verdict.code
                        self._reject(ring, chunk.first_seq + i, verdict.code, state.describe(header, verdict))
            all_results.append(results)
            frames += chunk.count
        if pieces and not self._append_or_refuse(pieces, headers, total_bytes, next_offset):
            self._refuse_round(all_results, end_before)
            pieces = []
        if self._faults is not None:
            self._faults("appended")
        for (ring, chunk), results in zip(chunks, all_results, strict=True):
            ring.consumer.ack(chunk.first_seq, results)
        if self._faults is not None:
            self._faults("acknowledged")
        for ring, chunk in chunks:
            ring.consumer.release(chunk.end_position)
        if pieces and self.spec.publish_high_watermark:
            self.state_page.wake_readers()  # local consumers sleeping on the high watermark (ipc.state_page)
        if self.spec.broker_wake_fd >= 0:
            _wake_broker(self.spec.broker_wake_fd)  # new LEO/HW, acks, ring space: the broker re-checks
        self.stats.rounds += 1
        self.stats.frames += frames
        return frames

    def _take_timestamp_settings(self, log_config: LogConfig) -> None:
        """The topic's timestamp rules as the rounds use them: the CreateTime limits (None: nothing to
        check), LogAppendTime or not, and whether a CreateTime batch's records are read for their max
        timestamp (not on a LogAppendTime topic, nor with the test seam ``writer.unread_records`` armed:
        the header trusted as it comes)."""
        self._timestamp_limits = limits_of(log_config)
        self._log_append_time = log_config.message_timestamp_type == LOG_APPEND_TIME
        self._read_records = not self._log_append_time and UNREAD_RECORDS not in self.spec.test_faults

    def _walk_records(self, chunk: Chunk, out: np.ndarray) -> list[int] | None:
        """Each frame's records' max timestamp (``storage.timestamp_rules.records_max_timestamps``: one
        numba call over the chunk, written to ``out``, the chunk's results array, before any result is), or
        None where a CreateTime batch's records are not read (a LogAppendTime topic, the test seam)."""
        if not self._read_records:
            return None
        records_max_timestamps(chunk.view, chunk.body_starts, chunk.body_lengths, out)
        walked: list[int] = out.tolist()
        return walked

    def _append_or_refuse(self, pieces: list[memoryview], headers: list[BatchHeader], total_bytes: int,
                          expected_end: int) -> bool:
        """:meth:`_append`, unless the log directory is below its reserve or the append meets a full disk
        (the log is then back as before it); False when nothing was appended for lack of space."""
        if not self.disk.may_write(total_bytes, time.monotonic_ns()):
            return False
        try:
            self._append(pieces, headers, total_bytes, expected_end)
        except KafkaStorageError as exc:
            self.disk.failed(exc)
            return False
        return True

    def _refuse_round(self, all_results: list[np.ndarray], end_before: int) -> None:
        """The round's batches were not appended (no space): every frame given an offset from
        ``end_before`` on (appended ones, and duplicates of them within the round) is answered
        KAFKA_STORAGE_ERROR, and the producer state forgets them (reloaded as it was at ``end_before``)."""
        refused = 0
        for results in all_results:
            mask = results >= end_before
            results[mask] = -ErrorCode.KAFKA_STORAGE_ERROR
            refused += int(mask.sum())
        self.stats.by_error[ErrorCode.KAFKA_STORAGE_ERROR] = (
            self.stats.by_error.get(ErrorCode.KAFKA_STORAGE_ERROR, 0) + refused)
        self.producer_state.truncate_to(
            end_before, self.spec.directory, headers_from=lambda offset: log_headers(self.log, offset),
            append_time_ms=time.time_ns() // 1_000_000)
        self._publish_offsets()

    def _count_error(self, code: int) -> None:
        self.stats.by_error[code] = self.stats.by_error.get(code, 0) + 1

    def _refuse(self, ring: _Ring, seq: int, body: memoryview) -> int:
        """A frame ``check_batch`` refused or too large: log why (validating again for the full story,
        the cold path) and return the Kafka error code to answer it with."""
        size = len(body)
        if size < HEADER_SIZE:
            reason = f"{size} bytes, a record batch needs at least {HEADER_SIZE}"
        else:
            try:
                header = validate_batch(body, 0, where="frame")
            except CorruptRecordError as exc:
                reason = str(exc)
            else:
                if header.size == size:  # a valid batch, refused for its size
                    self._reject(ring, seq, ErrorCode.MESSAGE_TOO_LARGE,
                                 f"record batch of {size} bytes, larger than max.message.bytes "
                                 f"{self._max_message_bytes}")  # fmt: skip
                    return ErrorCode.MESSAGE_TOO_LARGE
                reason = (f"the frame holds {size} bytes but its record batch is {header.size} bytes "
                          "(a frame carries exactly one batch)")  # fmt: skip
        self._reject(ring, seq, ErrorCode.CORRUPT_MESSAGE, reason)
        return ErrorCode.CORRUPT_MESSAGE

    def _reject(self, ring: _Ring, seq: int, code: int, reason: str) -> None:
        self.stats.rejected += 1
        self.stats.by_error[code] = self.stats.by_error.get(code, 0) + 1
        ring.bad_frames += 1
        if ring.bad_frames <= _ERRORS_LOGGED_PER_RING or ring.bad_frames % 1000 == 0:
            _log.warning(
                "writer %s: ring %s frame %d refused with %s (%d), nothing appended: %s%s",
                self.name, ring.name, seq, _error_name(code), code, reason,
                f" [{ring.bad_frames} refused in this ring so far]" if ring.bad_frames > 1 else "",
            )  # fmt: skip

    def _append(self, pieces: list[memoryview], headers: list[BatchHeader], total_bytes: int,
                expected_end: int) -> None:
        """Append the accepted frames straight from ring memory, then publish the offsets.

        ``Log.append_batches`` trusts the headers ``check_batch`` returned (nothing is validated twice),
        stamps offsets and the leader epoch into the frames in place (published, unreleased frames are the
        writer's to rewrite: ``ipc/ring.py``) and writes them with one ``os.writev`` per segment touched:
        no copy.
        """
        if self._trace is not None:
            self._trace.append_start_ns = time.monotonic_ns()
        info = self.log.append_batches(pieces, headers, leader_epoch=self.spec.leader_epoch)
        end = info.last_offset + 1
        if end != expected_end:  # the log and this writer disagree about offsets: never ack a guess
            raise CorruptRecordError(
                f"writer {self.name}: the log appended offsets {info.first_offset}..{info.last_offset}, "
                f"the acknowledgements were computed up to {expected_end - 1}"
            )
        self.stats.appended_batches += len(pieces)
        self.stats.appended_bytes += total_bytes
        self._publish_offsets()
        if self.log.active_segment.base_offset != self._active_base:
            self._active_base = self.log.active_segment.base_offset
            self._snapshot_quickly(self.log.log_end_offset)

    def _snapshot_quickly(self, offset: int) -> None:
        """Snapshot the producer state at a roll without fsync (an fsync here would stall the round).  Safe:
        a snapshot lost or torn by a power cut fails its CRC and the previous one is used; one above the
        recovered log end is deleted.  The clean stop writes a durable one."""
        self._snapshot(offset, durable=False)

    def _snapshot(self, offset: int, *, durable: bool) -> None:
        """A producer-state snapshot at ``offset``; on a full disk none (nothing of it is left behind) and
        the writer goes on: the next start replays the log from an older snapshot."""
        try:
            self.producer_state.write_snapshot(self.spec.directory, offset, durable=durable)
        except OSError as exc:
            if not is_disk_full(exc):
                raise
            _log.warning("writer %s: no producer-state snapshot at offset %d: %s", self.name, offset,
                         describe_os_error(exc))

    def _publish_offsets(self) -> None:
        end = self.log.log_end_offset
        self.state_page.log_end_offset = end
        if self.spec.publish_high_watermark:  # readers are woken after the acks (end of drain_round)
            self.state_page.set_high_watermark(end, wake_readers=False)
        if self._trace is not None:
            self._trace.published(end)

    # -- the loop -----------------------------------------------------------------------------------------

    def request_stop(self, timeout_ms: int = _DEFAULT_STOP_TIMEOUT_MS) -> None:
        """Finish: drain every ring (for at most ``timeout_ms``), then :meth:`run` returns."""
        self._stopping = True
        self._stop_timeout_ms = timeout_ms

    @property
    def stopping(self) -> bool:
        return self._stopping

    def run(self) -> int:
        """Serve until told to stop (or the channel closes); return the exit code (0 after a clean drain)."""
        page = self.state_page
        housekeeping_due_ns = 0
        while not self._stopping:
            now_ns = time.monotonic_ns()
            if now_ns >= housekeeping_due_ns:  # after a loop with nothing to drain; else every 10 ms
                page.writer_busy(now_ns // 1_000_000)
                self.handle_commands()
                housekeeping_due_ns = now_ns + _HOUSEKEEPING_INTERVAL_NS
            handled = self.drain_round() if not self._stopping else 0
            if self.rings and any(ring.detaching for ring in self.rings.values()):
                self._finish_detaches()
            if handled:
                self.timers.after_round()
                continue
            housekeeping_due_ns = 0
            self.timers.run()
            flags = [ring.consumer.waiting_flag for ring in self.rings.values() if not ring.failed]
            sleep_s = self.timers.due_s() - time.monotonic()
            if self._trace is not None:  # benchmarks only: the trace reaches its file within 0.1 s of idling
                sleep_s = min(sleep_s, 0.1)
            page.writer_asleep()
            if not self._waiter.park(flags, self._has_work, sleep_s) and self._trace is not None:
                self._trace.flush()  # idle: a benchmark's trace reaches its file between runs
        deadline = time.monotonic() + self._stop_timeout_ms / 1000
        while self.drain_round() and time.monotonic() < deadline:
            page.writer_busy()
        for ring in list(self.rings.values()):
            ring.detaching = True
        self._finish_detaches()
        self._send({"op": "next_due", "in_ms": self.timers.due_when_idle_in_ms()})
        _log.log(
            logging.DEBUG if self._idle_stop else logging.INFO,
            "writer %s: stopped at log end offset %d (%d rounds, %d batches appended, %d duplicates, "
            "%d refused)",
            self.name, self.log.log_end_offset, self.stats.rounds, self.stats.appended_batches,
            self.stats.duplicates, self.stats.rejected,
        )  # fmt: skip
        return 0

    def _has_work(self) -> bool:
        if self._stopping:
            return True
        for ring in self.rings.values():
            if ring.consumer.has_data():
                return True
        return self._channel.readable()

    def run_retention(self) -> int:
        """Retention and producer-id expiry now (``WriterTimers.run_retention``); segments deleted."""
        return self.timers.run_retention()

    # -- commands -----------------------------------------------------------------------------------------

    def handle_commands(self) -> None:
        """Apply every command waiting on the channel (never blocks); stop when the supervisor is gone."""
        commands = self._channel.receive()
        if commands is None:
            self.request_stop()
            return
        for command in commands:
            self.apply(command)

    def apply(self, command: dict[str, Any]) -> None:
        op = command.get("op")
        if op == "attach":
            names = RingNames(ring=command["ring"], space=command["space"], doorbell=command["doorbell"])
            try:
                self.attach_ring(names)
            except (FileNotFoundError, CorruptRecordError) as exc:
                _log.error("writer %s: cannot serve ring %s: %s", self.name, names.ring, exc)
                self._send({"op": "detached", "ring": names.ring})
        elif op == "detach":
            self.detach_ring(command["ring"])
        elif op == "stop":
            self._idle_stop = bool(command.get("idle", False))
            self.request_stop(int(command.get("timeout_ms", _DEFAULT_STOP_TIMEOUT_MS)))
        elif op == "run_timers":
            self.timers.run_now()
            self._send({"op": "timers_done"})
        elif op == "reload_config":
            self.reload_config(LogConfig.from_properties(command["log_config"]),
                               bool(command.get("retention_enabled", True)))
        elif op == "delete_records":
            reply = delete_records(self.log, self.state_page, self.name, int(command["offset"]))
            self._send({"op": "records_deleted", "id": command.get("id"), **reply})
        elif op == "swap_cleaned":
            reply = swap_cleaned(self.log, self.name, list(command["groups"]))
            self._send({"op": "cleaned_swapped", "id": command.get("id"), **reply})
        else:
            _log.error("writer %s: unknown command %r ignored", self.name, command)

    def reload_config(self, log_config: LogConfig, retention_enabled: bool) -> None:
        """Serve with the topic's new settings from now on: the log is closed cleanly and opened again with
        them (between rounds: every appended batch stays, the producer state in memory stays valid), so a
        new ``segment.bytes`` or ``retention.ms`` applies to the next append and the next retention pass."""
        spec = self.spec
        if log_config == spec.log_config and retention_enabled == spec.retention_enabled:
            return
        self.spec = spec = dataclasses.replace(spec, log_config=log_config,
                                               retention_enabled=retention_enabled)
        self.log.close(clean=True)
        self.log = log = Log.open(spec.directory, log_config, topic_partition=(spec.topic, spec.partition))
        self._max_message_bytes = log_config.max_message_bytes
        self._take_timestamp_settings(log_config)
        self._active_base = log.active_segment.base_offset
        resumed = self._resume.records
        self._resume = ResumeMap(log, spec.name)
        self._resume.records = resumed
        self.timers = WriterTimers(spec.name, log, self.state_page, self.producer_state, self.disk,
                                   retention_check_interval_ms=spec.retention_check_interval_ms,
                                   retention_enabled=retention_enabled)
        _log.info("writer %s: settings reloaded (%s)", self.name, log_config)

    def _send(self, message: dict[str, Any]) -> None:
        self._channel.send(message)


# -- helpers -------------------------------------------------------------------------------------------------


def _wake_broker(fd: int) -> None:
    """Add one to the broker's wake-up eventfd (non-blocking; a counter already at its maximum, or a
    descriptor gone, is not this writer's problem: the broker's fallback tick re-checks anyway)."""
    with contextlib.suppress(OSError):
        os.eventfd_write(fd, 1)


def _error_name(code: int) -> str:
    try:
        return ErrorCode(code).name
    except ValueError:
        return f"error {code}"
