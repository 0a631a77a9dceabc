"""The partition log: a directory of segments with exactly one writer.

Theory of operation
-------------------
A partition ``<topic>-<partition>`` lives in one directory of segments and small checkpoint files
(``storage.log_dir`` lists them).

**One writer.**  A :class:`Log` is the only object that changes the directory.  Opening takes an exclusive
``flock`` on ``.lock``; a second writer (another process, or a second ``Log`` in this one) gets
:class:`~storage.errors.LogLockedError`.  Do not fork while a ``Log`` is open: the child would share the lock
(an append in a forked child raises ``LogLockedError``).  Readers never lock: other processes (broker,
local consumers) use ``storage.log_reader.LogReader``, which reads the files while this writer appends,
rolls, truncates and deletes.

**Opening** (``storage.log_loader``) cleans up what a crash left, recovers the segments that may hold
unflushed data (``storage.recovery``) and reconciles the checkpoints and the leader-epoch cache with them.

**Append.**  :meth:`Log.append` takes bytes holding one or more whole batches, validates them all first, so
a bad one appends nothing, and stamps each in place with its ``baseOffset`` and ``partitionLeaderEpoch``
(``storage.append_plan``); the bytes go to the active segment with one ``os.write`` per segment touched,
rolling before a batch the active segment refuses (its roll rules: ``LogSegment.batches_that_fit``).  The
segments themselves and every change to their list (a roll, the cut-back of a failed append, truncation,
retention's deletions) are ``storage.segment_list``; the segments retention deletes and a clean replaces
are closed ``file.delete.delay.ms`` later by ``storage.segment_deleter``, and at once by :meth:`Log.close`.
Replicas use :meth:`Log.append_as_follower`, which keeps the leader's offsets and epochs (or its twin for
batches a follower walked with ``storage.batch_scan.walk_batches``, :meth:`Log.append_walked_as_follower`).
The common append (one batch, in the epoch already recorded, no roll rule near) takes a hot path: the log
checks the epoch and that it may write, stamps the batch and hands it to ``LogSegment.append_batch``, which
writes and indexes it if it is within the segment's *append budget*; anything else goes to the general
path, which decides.  The hot path makes as few Python calls as it can: the kernel's copy of a large batch
into the page cache leaves the CPU's caches and branch predictors cold, so the Python between two such
writes costs more than it does in a loop, each call level (frame, arguments, return) included
(docs/performance.md).

**Durability.**  Appends stay in the page cache.  ``flush.messages``/``flush.ms`` (default: never) fsync
the log; a rolled segment is fsynced in a background thread; :meth:`Log.close` fsyncs everything.  After
each fsync the *recovery point* (the offset below which everything is on disk) is checkpointed; after an
unclean stop ``storage.recovery`` checks only the segments from the recovery point on.

**Reads** return a :class:`~storage.segment_file.FetchSlice` (file, descriptor, position, size) for
``sendfile``: whole batches from the one holding the offset, never past ``max_offset`` (the high watermark).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator, Sequence

from storage.append_plan import (
    BATCH_LENGTH_FIELD,
    FEW_BATCHES,
    LAST_OFFSET_DELTA_FIELD,
    MAX_TIMESTAMP_FIELD,
    RECORDS_COUNT_FIELD,
    AppendInfo,
    AppendPlan,
    check_as_follower,
    check_leader_epoch,
    check_walked,
    pack_stamp,
    stamp_as_leader,
    validate_batches,
    walked_records,
    walked_rows,
    writable_bytes,
)
from storage.append_undo import AppendUndo
from storage.batch_header import LOG_OVERHEAD, BatchHeader, check_batch
from storage.batch_scan import BatchArrays
from storage.checkpoints import LeaderEpochCache
from storage.clean_shutdown import CleanStop, write_clean_stop
from storage.clean_swap import SwapGroup
from storage.errors import (
    InvalidRecordError,
    KafkaStorageError,
    LogLockedError,
    OffsetOutOfRangeError,
    describe_os_error,
    is_disk_full,
)
from storage.flusher import RolledSegmentFlusher
from storage.list_offsets import EARLIEST_TIMESTAMP, LATEST_TIMESTAMP, offset_for_timestamp
from storage.log_config import LONG_MAX, LogConfig
from storage.log_dir import (
    CLEAN_SHUTDOWN_FILE,
    FORK_GENERATION,
    LEADER_EPOCH_CHECKPOINT_FILE,
    LOG_START_OFFSET_CHECKPOINT_FILE,
    RECOVERY_POINT_CHECKPOINT_FILE,
    lock_log_directory,
    parse_topic_partition,
    unlock_log_directory,
    write_partition_checkpoint,
)
from storage.log_loader import load_log
from storage.segment import LogSegment, OffsetAndTimestamp
from storage.segment_deleter import SegmentDeleter
from storage.segment_file import BatchBuffer, FetchSlice, split_batches
from storage.segment_list import SegmentInfo, SegmentList
from storage.timestamp_rules import LOG_APPEND_TIME, stamp_log_append_time

__all__ = [
    "EARLIEST_TIMESTAMP",
    "LATEST_TIMESTAMP",
    "FetchSlice",
    "Log",
    "OffsetAndTimestamp",
    "SegmentInfo",
]

_new_tuple = tuple.__new__  # NamedTuple construction without its keyword handling (hot path)
_time_ns = time.time_ns

_log = logging.getLogger(__name__)


class Log:
    """The log of one partition, held by its only writer.  See the module docstring.

    Offsets: ``log_start_offset`` <= every readable offset < ``log_end_offset`` (the next offset to assign).
    Not thread-safe: one thread calls it (background threads only fsync rolled segments and close retired
    ones: ``storage.flusher``, ``storage.segment_deleter``).
    """

    def __init__(self, directory: str, config: LogConfig, topic_partition: tuple[str, int],
                 lock_fd: int) -> None:
        self.directory = directory
        self.config = config
        self.topic_partition = topic_partition
        self.name = f"{topic_partition[0]}-{topic_partition[1]}"
        self._where = f"partition {self.name} append"
        self._lock_fd = lock_fd
        self._pid = os.getpid()
        self._fork_generation = FORK_GENERATION[0]
        self._log_start_offset = 0
        self._recovery_point = 0
        self._epochs = LeaderEpochCache(os.path.join(directory, LEADER_EPOCH_CHECKPOINT_FILE))
        self._unflushed_records = 0
        self._last_flush = time.monotonic()
        self._flush_due_s = self._last_flush + config.flush_ms / 1000  # flush.ms after the last flush
        self._flush_messages = config.flush_messages
        self._flush_timed = config.flush_ms < LONG_MAX  # else the due time is never reached: no clock read
        self._log_append_time = config.message_timestamp_type == LOG_APPEND_TIME  # leaders stamp the time
        self._checkpoint_lock = threading.Lock()
        self._flusher = RolledSegmentFlusher(self._set_recovery_point, f"flush-{self.name}")
        deleter = SegmentDeleter(f"delete-{self.name}")
        self._segment_list = SegmentList(directory, config, self._flusher, deleter, self.name)
        self._undo = AppendUndo(self._segment_list, self.name, directory)
        self._segments = self._segment_list.segments  # the same list: the hot path reads [-1] with no call
        self._closed = False
        self._append_generation = self._fork_generation  # -1 once closed: one comparison on the hot path

    # --- opening and closing --------------------------------------------------------------------------------
    @classmethod
    def open(cls, directory: str | os.PathLike[str], config: LogConfig | None = None, *,
             topic_partition: tuple[str, int] | None = None, recover: bool = True) -> Log:
        """Open (creating if needed) the log in ``directory`` as its only writer.

        Raises :class:`LogLockedError` if another writer holds it.  After an unclean stop the segments past
        the recovery point are checked and a torn tail is cut (``storage.recovery``); ``recover=False`` skips
        the CRC check of those segments (their structure is still walked and a torn tail still cut).  A
        corrupt closed segment raises :class:`CorruptRecordError` naming the file, position and offsets.
        """
        path = os.fspath(directory)
        config = config or LogConfig()
        tp = topic_partition or parse_topic_partition(path) or (os.path.basename(os.path.normpath(path)), 0)
        os.makedirs(path, exist_ok=True)
        lock_fd = lock_log_directory(path, f"{tp[0]}-{tp[1]}")
        log = cls(path, config, tp, lock_fd)
        try:
            log._load(check_crc=recover)
        except BaseException:
            log._release()
            raise
        return log

    def _load(self, *, check_crc: bool) -> None:
        loaded = load_log(self.directory, self.config, self.topic_partition, check_crc=check_crc)
        self._segment_list.load(loaded.segments)
        self._log_start_offset = loaded.log_start_offset
        self._recovery_point = loaded.recovery_point
        self._epochs = loaded.epochs

    def close(self, *, clean: bool = True) -> None:
        """Close the log and release the lock.

        ``clean=True`` (the default) fsyncs everything, trims the active segment's indexes, checkpoints the
        recovery point and leaves ``.clean-shutdown`` so the next open checks nothing.  ``clean=False`` just
        closes the files and the lock, leaving the directory as a crash of this process would (the next open
        recovers the segments past the recovery point).
        """
        if self._closed:
            return
        try:
            if clean:
                self._close_cleanly()
        finally:
            self._flusher.stop()
            self._segment_list.close()
            self._release()

    def _close_cleanly(self) -> None:
        """fsync, seal, checkpoint, ``.clean-shutdown``; on a full disk the log is left as an unclean stop
        leaves it (no ``.clean-shutdown``: the next open recovers from the recovery point)."""
        try:
            self._flusher.drain()
            self.active_segment.seal()
            for segment in self._segments:
                if segment.next_offset > self._recovery_point or segment is self.active_segment:
                    segment.flush()
                    segment.index_files_fsync()
            self._set_recovery_point(self.log_end_offset)
            marker = os.path.join(self.directory, CLEAN_SHUTDOWN_FILE)
            write_clean_stop(marker, CleanStop.of(self.active_segment))
        except OSError as exc:
            if not is_disk_full(exc):
                raise
            _log.warning("partition %s: cannot close cleanly, %s; the next open recovers the log",
                         self.name, describe_os_error(exc))

    def _release(self) -> None:
        self._closed = True
        self._append_generation = -1
        if self._lock_fd >= 0:
            unlock_log_directory(self._lock_fd)
            self._lock_fd = -1

    def __enter__(self) -> Log:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"Log({self.directory!r}, start={self._log_start_offset}, end={self.log_end_offset}, "
                f"segments={len(self._segments)})")

    # --- offsets and segments -------------------------------------------------------------------------------
    @property
    def active_segment(self) -> LogSegment:
        return self._segments[-1]

    @property
    def log_start_offset(self) -> int:
        return self._log_start_offset

    @property
    def log_end_offset(self) -> int:
        """The next offset to assign."""
        return self._segments[-1].next_offset

    @property
    def recovery_point(self) -> int:
        return self._recovery_point

    @property
    def size_bytes(self) -> int:
        return self._segment_list.size_bytes

    @property
    def segments(self) -> list[SegmentInfo]:
        return self._segment_list.infos()

    @property
    def leader_epoch_cache(self) -> LeaderEpochCache:
        return self._epochs

    @property
    def latest_epoch(self) -> int:
        """The latest leader epoch recorded, or -1."""
        return self._epochs.latest_epoch

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        """OffsetsForLeaderEpoch: ``(epoch, end offset)``; see ``LeaderEpochCache.end_offset_for``."""
        return self._epochs.end_offset_for(epoch, self.log_end_offset)

    # --- appending ------------------------------------------------------------------------------------------
    def append(self, buf: bytes | bytearray | memoryview, *, leader_epoch: int) -> AppendInfo:
        """Append the batches in ``buf`` as the leader in ``leader_epoch``: assign offsets from the log end.

        ``buf`` is stamped in place (``baseOffset``, ``partitionLeaderEpoch``) unless it is read-only, in
        which case it is copied first.  Raises :class:`CorruptRecordError` for an invalid batch,
        :class:`InvalidRecordError` for one larger than ``max.message.bytes``, :class:`NotLeaderError` for an
        epoch older than the latest recorded; then nothing was appended.
        """
        view = memoryview(buf)
        if view.readonly or view.ndim != 1 or view.format != "B":
            view = writable_bytes(view)
        max_batch_bytes = self.config.max_message_bytes
        first = check_batch(view, 0, whole=False)
        if (not isinstance(first, int)
                and first[BATCH_LENGTH_FIELD] + LOG_OVERHEAD == len(view) <= max_batch_bytes):
            return self.append_batches((view,), (first,), leader_epoch=leader_epoch)  # one valid batch
        self._check_writable()
        headers = validate_batches(view, self._where, max_batch_bytes, first=first)
        return self._append_as_leader((view,), headers, leader_epoch)

    def append_batches(self, views: Sequence[memoryview], headers: Sequence[BatchHeader], *,
                       leader_epoch: int) -> AppendInfo:
        """Append batches that the caller has validated, as the leader in ``leader_epoch``, with no copy.

        The zero-copy path of a partition writer: ``views[i]`` holds exactly one batch (a ring frame's
        body) and ``headers[i]`` is its header as :func:`~storage.batch_header.check_batch` or
        :func:`~storage.batch_header.validate_batch` returned it.  **The log trusts them**: it does not look
        at magic, length, CRC or ``max.message.bytes`` again.  The caller guarantees that

        1. each header came from validating that very buffer (so ``len(views[i]) == headers[i].size``),
           and each batch is within ``max.message.bytes``;
        2. every buffer is a writable 1-D byte memoryview (e.g. ``memoryview(uint8_array)[a:b]``) that
           nothing else writes until this returns (ring memory published to, and owned by, the writer).

        Each buffer is stamped in place (``baseOffset``, ``partitionLeaderEpoch``; the CRC does not cover
        them; on a LogAppendTime log also the append time and the CRC: ``storage.timestamp_rules``) and the
        buffers go to the active segment with one ``os.writev`` per segment touched (at most
        ``IOV_MAX`` buffers per call), straight from the caller's memory.  Rolls and indexes as
        :meth:`append`.  Raises :class:`NotLeaderError` for an epoch older than the latest recorded,
        ``ValueError`` for mismatched arguments; then nothing was stamped or appended.  Untrusted bytes go
        through :meth:`append`, which validates.
        """
        count = len(views)
        if count == 1 == len(headers):  # the hot path (see the module docstring)
            header = headers[0]
            if (leader_epoch == self._epochs.latest_epoch >= 0  # the latest recorded epoch
                    and self._append_generation == FORK_GENERATION[0]  # open, and not a forked child
                    and self._flusher.error is None):  # (else the general path raises it)
                segment = self._segments[-1]
                view = views[0]
                size = header[BATCH_LENGTH_FIELD] + LOG_OVERHEAD
                base = segment.next_offset
                last = base + header[LAST_OFFSET_DELTA_FIELD]
                max_timestamp = header[MAX_TIMESTAMP_FIELD]
                pack_stamp(view, 0, base, size - LOG_OVERHEAD, leader_epoch)
                if self._log_append_time:
                    max_timestamp = _time_ns() // 1_000_000
                    stamp_log_append_time(view, 0, header, max_timestamp)
                try:
                    position = segment.append_batch(view, size, last, max_timestamp)
                except OSError as exc:
                    error = self._undo.failed(exc, base, len(self._segments), self._epochs)
                    if error is None:
                        raise
                    raise error from exc
                if position >= 0:
                    records = header[RECORDS_COUNT_FIELD]
                    self._unflushed_records += records
                    if self._unflushed_records >= self._flush_messages or (
                            self._flush_timed and time.monotonic() >= self._flush_due_s):
                        self.flush()
                    offset_of_max = last
                    if max_timestamp < 0:
                        max_timestamp, offset_of_max = -1, base - 1
                    now_ms = _time_ns() // 1_000_000
                    return _new_tuple(AppendInfo, (base, last, now_ms, max_timestamp, offset_of_max, 1,
                                                   records, position, segment.base_offset, size))
        self._check_writable()
        if count == 0 or count != len(headers):
            raise ValueError(f"{self._where}: {count} buffers and {len(headers)} headers; need as many, >= 1")
        return self._append_as_leader(views, headers, leader_epoch)

    def _append_as_leader(self, parts: Sequence[memoryview], headers: Sequence[BatchHeader],
                          leader_epoch: int) -> AppendInfo:
        """The general path of a leader's append: epoch checked, batches stamped, epoch recorded, written."""
        latest_epoch = check_leader_epoch(self._epochs.latest_epoch, leader_epoch, self.name)
        first_offset = self._segments[-1].next_offset
        append_time_ms = _time_ns() // 1_000_000 if self._log_append_time else None
        plan = stamp_as_leader(parts, headers, first_offset, leader_epoch, append_time_ms)
        with self._undo.undone_if_failed(first_offset, self._epochs):
            if leader_epoch > latest_epoch:
                self._epochs.assign(leader_epoch, first_offset)
            return self._write(parts, plan)

    def append_as_follower(self, buf: bytes | bytearray | memoryview, *,
                           validated: Sequence[BatchHeader] | None = None) -> AppendInfo:
        """Append a leader's batches unchanged (a replica): offsets and epochs are the batches' own.

        The first batch must start at or after the log end offset and offsets must move forward (a gap
        between batches, as a compacted leader has them, is copied as it is); each new
        ``partitionLeaderEpoch`` is recorded in the leader-epoch cache.  Raises :class:`CorruptRecordError` or
        :class:`InvalidRecordError`; then nothing was appended.  ``validated``: the headers of every batch in
        ``buf``, in order, as the caller's own check of these very bytes returned them (magic, length, CRC:
        ``storage.batch_reader.iter_batches``); they are not checked again.
        """
        self._check_writable()
        view = writable_bytes(buf)
        if validated is None:
            headers = validate_batches(view, self._where)
        else:
            headers = list(validated)
            if sum(h.size for h in headers) != len(view) or not headers:
                raise InvalidRecordError(f"{self._where}: follower append: the validated batches hold "
                                         f"{sum(h.size for h in headers)} bytes, the buffer {len(view)}")
        plan = check_as_follower(headers, self.log_end_offset, self.name)
        with self._undo.undone_if_failed(self.log_end_offset, self._epochs):
            for header in headers:
                epoch = header.partition_leader_epoch
                if epoch >= 0 and epoch != self._epochs.latest_epoch:
                    self._epochs.assign(epoch, header.base_offset)
            return self._write((view,), plan)

    def append_walked_as_follower(self, buf: bytes | bytearray | memoryview,
                                  batches: BatchArrays) -> AppendInfo:
        """:meth:`append_as_follower` for batches described by arrays instead of headers: the lean path of a
        follower copying many small batches at once (no header tuples; from 64 batches on no Python per
        batch at all: one ``plan_index_entries`` call gives the index entries, ``LogSegment.append_walked``).

        ``batches``: what ``storage.batch_scan.walk_batches(np.frombuffer(buf, np.uint8), 0, len(buf),
        s, self.log_end_offset, ...)`` returned for these very bytes (any ``s``), at least one row, the first
        at position 0, the last ending at ``len(buf)`` -- so offsets move forward from the log end, gaps
        allowed -- with every stored CRC checked by the caller.  **The log trusts them** beyond the first
        base offset and the total length, which it checks (:class:`InvalidRecordError`; then nothing was
        appended).  Same effects as :meth:`append_as_follower`: epochs recorded, rolls, indexes, flushes.
        """
        self._check_writable()
        view = writable_bytes(buf)
        check_walked(view, batches, self.log_end_offset, self.name)
        with self._undo.undone_if_failed(self.log_end_offset, self._epochs):
            return self._append_walked(view, batches)

    def _append_walked(self, view: memoryview, batches: BatchArrays) -> AppendInfo:
        count = len(batches.positions)
        epochs = batches.epochs
        first_epoch = int(epochs[0])
        if (first_epoch != self._epochs.latest_epoch and first_epoch >= 0) or (
                count > 1 and not (epochs == first_epoch).all()):
            for epoch, base in zip(epochs.tolist(), batches.base_offsets.tolist(), strict=True):
                if epoch >= 0 and epoch != self._epochs.latest_epoch:
                    self._epochs.assign(epoch, base)
        records = walked_records(view, batches)
        if count < FEW_BATCHES:  # a Python loop per batch, else one kernel call
            return self._write((view,), AppendPlan(walked_rows(batches), records, len(view)))
        return self._write_planned(view, batches, records=records)

    def _write_planned(self, view: memoryview, batches: BatchArrays, *, records: int) -> AppendInfo:
        """:meth:`_write` for many batches given as arrays: the index entries planned by one kernel call
        (``LogSegment.append_walked``) where everything fits the active segment."""
        positions, sizes, base_offsets, last_offsets, max_timestamps, _, _ = batches
        count = len(positions)
        now_ms = _time_ns() // 1_000_000
        segment = self._segments[-1]
        top = int(max_timestamps.argmax())
        max_timestamp = int(max_timestamps[top])
        first, last = int(base_offsets[0]), int(last_offsets[-1])
        offset_of_max = int(last_offsets[top]) if max_timestamp > -1 else first - 1
        max_timestamp = max(max_timestamp, -1)
        size_bytes = len(view)
        if not segment.fits(size_bytes, last, count, max_timestamp, now_ms):
            return self._write((view,), AppendPlan(walked_rows(batches), records, size_bytes))
        position = segment.append_walked((view,), size_bytes, positions, sizes, last_offsets, max_timestamps)
        self._count_unflushed(records)
        return _new_tuple(AppendInfo, (first, last, now_ms, max_timestamp, offset_of_max, count, records,
                                       position, segment.base_offset, size_bytes))

    def _write(self, parts: Sequence[BatchBuffer], plan: AppendPlan) -> AppendInfo:
        """Write stamped batches, rolling where a roll rule says so, with one write per segment touched.
        ``parts``: one buffer holding every batch, or one buffer per batch."""
        now_ms = time.time_ns() // 1_000_000
        batches = plan.batches
        segment = self._segments[-1]
        max_timestamp, offset_of_max = -1, batches[0][0] - 1
        for batch in batches:
            if batch[3] > max_timestamp:
                max_timestamp, offset_of_max = batch[3], batch[1]
        if segment.fits(plan.size_bytes, batches[-1][1], len(batches), max_timestamp, now_ms):  # common case
            first_segment = segment.base_offset
            first_position = segment.append_parts(parts, plan.size_bytes, batches)
        else:
            first_position, first_segment = self._segment_list.write_rolling(parts, batches, now_ms)
        self._count_unflushed(plan.records)
        return _new_tuple(AppendInfo, (batches[0][0], batches[-1][1], now_ms, max_timestamp, offset_of_max,
                                       len(batches), plan.records, first_position, first_segment,
                                       plan.size_bytes))

    def _count_unflushed(self, records: int) -> None:
        """Count appended records towards ``flush.messages`` and flush when it or ``flush.ms`` is due (the
        hot path does the same inline)."""
        self._unflushed_records += records
        if self._unflushed_records >= self._flush_messages or (
                self._flush_timed and time.monotonic() >= self._flush_due_s):
            self.flush()

    def _check_writable(self) -> None:
        if self._closed:
            raise LogLockedError(f"partition {self.name}: the log is closed")
        if FORK_GENERATION[0] != self._fork_generation:
            raise LogLockedError(
                f"partition {self.name}: the log was opened by process {self._pid}, not this forked "
                f"process {os.getpid()}; a log has exactly one writer"
            )
        try:
            self._flusher.raise_error()
        except OSError as exc:  # a rolled segment's recovery point not checkpointed: nothing is lost
            if not is_disk_full(exc):
                raise
            raise KafkaStorageError.for_partition(self.name, os.path.dirname(self.directory) or ".",
                                                  describe_os_error(exc)) from exc

    # --- rolling and flushing -------------------------------------------------------------------------------
    def roll(self, base_offset: int | None = None) -> int:
        """Start a new active segment at the log end offset (no-op when the active one is empty).
        Returns the active segment's base offset.

        ``base_offset`` (a follower copying its leader's segment boundaries, ``replicas.fetcher``): start the
        new segment there instead, at or above the log end offset (the offsets between are a gap, as a
        cleaned segment has); the active segment is closed even if empty.  No-op if it is the active one's."""
        self._check_writable()
        if base_offset is not None:
            if base_offset == self.active_segment.base_offset:
                return base_offset
            if base_offset < self.log_end_offset:
                raise ValueError(f"partition {self.name}: cannot roll at {base_offset}, below the log end "
                                 f"offset {self.log_end_offset}")
            return self._segment_list.roll(base_offset).base_offset
        if self.active_segment.size_bytes == 0:
            return self.active_segment.base_offset
        return self._segment_list.roll(self.log_end_offset).base_offset

    def _set_recovery_point(self, offset: int) -> None:
        with self._checkpoint_lock:
            if offset != self._recovery_point:
                self._recovery_point = offset
                self._write_offset_checkpoint(RECOVERY_POINT_CHECKPOINT_FILE, offset)

    def flush(self) -> None:
        """fsync every segment holding data past the recovery point; the recovery point becomes the log
        end offset."""
        self._check_writable()
        self._flusher.drain()
        for segment in self._segments:
            if segment.next_offset > self._recovery_point:
                segment.flush()
                if not segment.is_active:
                    segment.index_files_fsync()
        self._set_recovery_point(self.log_end_offset)
        self._unflushed_records = 0
        self._last_flush = time.monotonic()
        self._flush_due_s = self._last_flush + self.config.flush_ms / 1000

    def maybe_flush(self) -> bool:
        """Flush if ``flush.ms`` has passed since the last flush and data is waiting (call on idle)."""
        if self._unflushed_records and (time.monotonic() - self._last_flush) * 1000 >= self.config.flush_ms:
            self.flush()
            return True
        return False

    # --- reading --------------------------------------------------------------------------------------------
    def read(self, offset: int, max_bytes: int, *, max_offset: int | None = None) -> FetchSlice:
        """Whole batches from the one holding ``offset``, for ``sendfile``.

        At least one whole batch (even if larger than ``max_bytes``), else as many whole batches as fit in
        ``max_bytes``, all from one segment, none whose last offset is >= ``max_offset`` (the high watermark).
        At the log end, or when the batch holding ``offset`` reaches ``max_offset``, the slice is empty.
        Raises :class:`OffsetOutOfRangeError` below the log start offset or above the log end offset.
        """
        end = self.log_end_offset
        if offset < self._log_start_offset or offset > end:
            raise OffsetOutOfRangeError(
                f"partition {self.name}: offset {offset} is out of range: the log holds offsets "
                f"[{self._log_start_offset}, {end}) (log start offset {self._log_start_offset}, "
                f"log end offset {end})"
            )
        if offset < end:
            found = self._segment_list.read(offset, max_bytes, max_offset)
            if found is not None:
                return found
        active = self.active_segment
        return FetchSlice(active.log_path, active.read_fd, active.size_bytes, 0, offset, offset)

    def batches(self, start_offset: int | None = None, *, max_offset: int | None = None,
                max_bytes: int = 1 << 20) -> Iterator[bytes]:
        """Every batch from ``start_offset`` (default: the log start) as bytes: a convenience for tests and
        tools; the data path uses :meth:`read` and ``sendfile``."""
        offset = self._log_start_offset if start_offset is None else start_offset
        while offset < self.log_end_offset:
            piece = self.read(offset, max_bytes, max_offset=max_offset)
            if piece.size_bytes == 0:
                return
            yield from split_batches(piece.read_bytes())
            offset = piece.next_offset

    def offset_for_timestamp(self, timestamp_ms: int) -> OffsetAndTimestamp | None:
        """ListOffsets: the offset and timestamp ``timestamp_ms`` names, or None (``storage.list_offsets``).
        """
        return offset_for_timestamp(self._segments, timestamp_ms, log_start_offset=self._log_start_offset,
                                    log_end_offset=self.log_end_offset)

    # --- truncation, retention ------------------------------------------------------------------------------
    def truncate_to(self, offset: int) -> int:
        """Drop every batch whose last offset is >= ``offset`` (a replica diverged); returns the new log end.

        A batch holding ``offset`` is dropped whole (the new end is then its base offset).  Later segments are
        deleted, the leader-epoch cache forgets epochs starting at or after the new end.  Below the first
        segment the log is emptied and restarts at ``offset``.
        """
        self._check_writable()
        self._flusher.drain()
        if offset >= self.log_end_offset:
            return self.log_end_offset
        if offset < self._segments[0].base_offset:
            self.truncate_fully_and_start_at(offset)
            return offset
        segment, dropped = self._segment_list.truncate_to(offset)
        end = self.log_end_offset
        _log.info("partition %s: truncated to offset %d (log end offset now %d, %d bytes dropped from %s)",
                  self.name, offset, end, dropped, segment.log_path)
        if end < self._log_start_offset:
            self._log_start_offset = end
            self._write_offset_checkpoint(LOG_START_OFFSET_CHECKPOINT_FILE, end)
        if self._recovery_point > end:
            self._set_recovery_point(end)
        self._epochs.truncate_from_end(end)
        return end

    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Delete every segment and restart the empty log at ``offset`` (a replica far behind its leader)."""
        self._check_writable()
        self._flusher.drain()
        self._log_start_offset = offset
        self._write_offset_checkpoint(LOG_START_OFFSET_CHECKPOINT_FILE, offset)
        self._segment_list.reset(offset)
        self._set_recovery_point(offset)
        self._epochs.clear()

    def delete_retained_segments(self, now_ms: int | None = None, *,
                                 high_watermark: int | None = None) -> int:
        """Apply retention (``retention.ms``, ``retention.bytes``, the log start offset; never the active
        segment; only below ``high_watermark`` if given).  Returns the number of segments deleted."""
        self._check_writable()
        now = time.time_ns() // 1_000_000 if now_ms is None else now_ms
        count = self._segment_list.retention_count(now, self._log_start_offset, high_watermark)
        if count:
            self._delete_first_segments(count)
        return count

    def increment_log_start_offset(self, offset: int) -> None:
        """Move the log start offset forward (DeleteRecords); segments wholly below it are deleted."""
        self._check_writable()
        if offset > self.log_end_offset:
            raise OffsetOutOfRangeError(
                f"partition {self.name}: cannot move the log start offset to {offset}, past the log end "
                f"offset {self.log_end_offset}"
            )
        if offset <= self._log_start_offset:
            return
        self._log_start_offset = offset
        self._write_offset_checkpoint(LOG_START_OFFSET_CHECKPOINT_FILE, offset)
        self._epochs.truncate_from_start(offset)
        count = self._segment_list.count_wholly_below(offset)
        if count:
            self._delete_first_segments(count)

    def _delete_first_segments(self, count: int) -> None:
        start = max(self._log_start_offset, self._segments[count].base_offset)
        if start != self._log_start_offset:
            # before any unlink, and before the log changes: a checkpoint that finds no room changes nothing
            self._write_offset_checkpoint(LOG_START_OFFSET_CHECKPOINT_FILE, start)
            self._log_start_offset = start
            self._epochs.truncate_from_start(start)
        self._segment_list.remove_first(count)

    def swap_cleaned(self, groups: Sequence[SwapGroup]) -> None:
        """Swap each group's cleaned segment (``storage.cleaner``) in for its closed segments, in one swap
        (the renames and their recovery: ``storage.clean_swap``)."""
        self._check_writable()
        self._flusher.drain()
        self._segment_list.swap_cleaned(groups)

    # --- checkpoints ----------------------------------------------------------------------------------------
    def _write_offset_checkpoint(self, name: str, offset: int) -> None:
        write_partition_checkpoint(self.directory, name, self.topic_partition, offset)
