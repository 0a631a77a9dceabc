"""The partition log: a directory of segments with exactly one writer.

Theory of operation
-------------------
A partition ``<topic>-<partition>`` lives in one directory::

    my-topic-0/
        00000000000000000000.log          record batches, as producers built them (storage.segment)
        00000000000000000000.index        sparse offset index          (storage.offset_index)
        00000000000000000000.timeindex    sparse time index            (storage.time_index)
        00000000000001048576.log ...      later segments; the last one is the *active* segment
        leader-epoch-checkpoint           epoch -> start offset         (storage.checkpoints)
        recovery-point-offset-checkpoint  everything below this offset is fsynced
        log-start-offset-checkpoint       the first offset a reader may ask for
        .lock                             flock()ed by the one writer; holds its pid
        .clean-shutdown                   present only while the log is closed cleanly

**One writer.**  A :class:`Log` is the only object that changes the directory.  Opening takes an exclusive
``flock`` on ``.lock``; a second writer (another process, or a second ``Log`` in this one) gets
:class:`~storage.errors.LogLockedError`.  Do not fork while a ``Log`` is open: the child would share the lock
(an append in a forked child raises ``LogLockedError``).  Readers never lock: other processes (broker,
local consumers) use ``storage.log_reader.LogReader``, which reads the files while this writer appends,
rolls, truncates and deletes.

**Append.**  :meth:`Log.append` takes bytes holding one or more whole batches.  All are validated first
(magic, length, CRC: ``batch_header.validate_batch``), so a bad one appends nothing.  Then each batch is
stamped in place with its ``baseOffset`` and ``partitionLeaderEpoch`` (the CRC does not cover them, so
nothing is recomputed and a writable buffer is never copied), and the bytes go to the active segment with
one ``os.write`` per segment touched.  The active segment rolls before a batch when it would pass
``segment.bytes``, when ``segment.ms`` has passed since its first batch's timestamp, when an index is full,
or when the batch's offsets do not fit its int32 relative offsets.  Replicas use
:meth:`Log.append_as_follower`, which keeps the leader's offsets and epochs (or its twin for batches a
follower walked with ``storage.batch_scan.walk_batches``, :meth:`Log.append_walked_as_follower`).  The common
append (one batch, in the epoch already recorded, no roll rule near) takes a hot path: the log checks the
epoch and that it may write, stamps the batch and hands it to ``LogSegment.append_batch``, which writes and
indexes it if it is within the segment's *append budget* (one limit per roll rule,
``LogSegment.refresh_append_budget``); anything else goes to the general path, which decides.  The hot path
makes as few Python calls as it can: the kernel's 64 KiB copy into the page cache leaves the CPU's caches
and branch predictors cold, so the Python that runs between two such writes costs more than it does in a
loop, each call level (frame, arguments, return) included (docs/performance.md).  With
``preallocate`` (the default) the active segment's blocks are reserved ahead of the appends without changing
its size (``storage.segment``).

**Durability.**  Appends stay in the page cache.  ``flush.messages``/``flush.ms`` (default: never) fsync
the log; a rolled segment is fsynced in a background thread; :meth:`Log.close` fsyncs everything.  After
each fsync the *recovery point* (the offset below which everything is on disk) is checkpointed; after an
unclean stop ``storage.recovery`` checks only the segments from the recovery point on.

**Reads** return a :class:`~storage.segment.FetchSlice` (file, descriptor, position, size) for ``sendfile``:
whole batches from the one holding the offset, never past ``max_offset`` (the high watermark).
"""

from __future__ import annotations

import bisect
import contextlib
import fcntl
import logging
import os
import struct
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Final, NamedTuple

import numpy as np

from storage.atomic_file import fsync_directory, write_atomically
from storage.batch_header import (
    BASE_OFFSET_OFFSET,
    BATCH_HEADER,
    BATCH_LENGTH_OFFSET,
    LOG_OVERHEAD,
    PARTITION_LEADER_EPOCH_OFFSET,
    RECORDS_COUNT_OFFSET,
    BatchHeader,
    check_batch,
    stamp,
    validate_batch,
)
from storage.batch_scan import BatchArrays
from storage.checkpoints import LeaderEpochCache, read_offset_checkpoint, write_offset_checkpoint
from storage.errors import (
    CorruptRecordError,
    InvalidRecordError,
    LogLockedError,
    NotLeaderError,
    OffsetOutOfRangeError,
)
from storage.flusher import RolledSegmentFlusher
from storage.log_config import INT32_MAX, LONG_MAX, LogConfig
from storage.recovery import load_segments
from storage.retention import RetentionCandidate, segments_to_delete
from storage.segment import (
    INDEX_SUFFIX,
    LOG_SUFFIX,
    TIME_INDEX_SUFFIX,
    BatchBuffer,
    FetchSlice,
    LogSegment,
    OffsetAndTimestamp,
    parse_segment_name,
    segment_path,
)

__all__ = [
    "CLEAN_SHUTDOWN_FILE",
    "EARLIEST_TIMESTAMP",
    "LATEST_TIMESTAMP",
    "LEADER_EPOCH_CHECKPOINT_FILE",
    "LOCK_FILE",
    "LOG_START_OFFSET_CHECKPOINT_FILE",
    "RECOVERY_POINT_CHECKPOINT_FILE",
    "AppendInfo",
    "Log",
    "SegmentInfo",
    "list_segment_base_offsets",
    "parse_topic_partition",
]

LOCK_FILE: Final = ".lock"
CLEAN_SHUTDOWN_FILE: Final = ".clean-shutdown"
LEADER_EPOCH_CHECKPOINT_FILE: Final = "leader-epoch-checkpoint"
RECOVERY_POINT_CHECKPOINT_FILE: Final = "recovery-point-offset-checkpoint"
LOG_START_OFFSET_CHECKPOINT_FILE: Final = "log-start-offset-checkpoint"
EARLIEST_TIMESTAMP: Final = -2  # ListOffsets: the log start offset
LATEST_TIMESTAMP: Final = -1  # ListOffsets: the log end offset

_LAST_OFFSET_DELTA: Final = BatchHeader._fields.index("last_offset_delta")  # header fields by position:
_BATCH_LENGTH: Final = BatchHeader._fields.index("batch_length")  # a tuple index is cheaper than a name
_MAX_TIMESTAMP: Final = BatchHeader._fields.index("max_timestamp")
_RECORDS_COUNT: Final = BatchHeader._fields.index("records_count")

_new_tuple = tuple.__new__  # NamedTuple construction without its keyword handling (hot path)
# baseOffset, batchLength, partitionLeaderEpoch are the header's first three fields, back to back: the hot
# path stamps them with one pack (batchLength rewritten with the validated value) where stamp() does two.
_STAMP_RUN: Final = struct.Struct(BATCH_HEADER.format[:4])
assert BatchHeader._fields[:3] == ("base_offset", "batch_length", "partition_leader_epoch")
assert (BASE_OFFSET_OFFSET, BATCH_LENGTH_OFFSET, _STAMP_RUN.size) == (0, 8, PARTITION_LEADER_EPOCH_OFFSET + 4)
_pack_stamp = _STAMP_RUN.pack_into
_RECORDS_COUNT_BYTES: Final = np.arange(RECORDS_COUNT_OFFSET, RECORDS_COUNT_OFFSET + 4)  # recordsCount
_BIG_INT32: Final = np.dtype(">i4")
_unpack_records_count = struct.Struct(">i").unpack_from  # at RECORDS_COUNT_OFFSET
_PLANNED_APPEND_BATCHES: Final = 64  # append_walked_as_follower: from this many batches on, one kernel call
_time_ns = time.time_ns

_log = logging.getLogger(__name__)
_FORK_GENERATION = [0]  # bumped in every forked child: a Log opened before a fork refuses to append after it


def _forked() -> None:
    _FORK_GENERATION[0] += 1


os.register_at_fork(after_in_child=_forked)


class AppendInfo(NamedTuple):
    """What an append did."""

    first_offset: int
    last_offset: int
    log_append_time_ms: int  # wall clock at the append (the batches' timestamps are not rewritten)
    max_timestamp: int  # largest batch maxTimestamp appended (-1 if none carried one)
    offset_of_max_timestamp: int
    batch_count: int
    record_count: int
    position: int  # byte position of the first batch in its segment file
    segment_base_offset: int  # the segment the first batch went to
    size_bytes: int


class SegmentInfo(NamedTuple):
    base_offset: int
    path: str
    size_bytes: int
    next_offset: int
    max_timestamp: int
    is_active: bool


def parse_topic_partition(directory: str) -> tuple[str, int] | None:
    """``("my-topic", 3)`` for a directory named ``my-topic-3``, else None."""
    topic, sep, partition = os.path.basename(os.path.normpath(directory)).rpartition("-")
    if not sep or not topic or not partition.isdigit():
        return None
    return topic, int(partition)


def list_segment_base_offsets(directory: str) -> list[int]:
    """Base offsets of the ``.log`` files in ``directory``, sorted."""
    bases = []
    for name in os.listdir(directory):
        base = parse_segment_name(name, LOG_SUFFIX)
        if base is not None:
            bases.append(base)
    return sorted(bases)


class Log:
    """The log of one partition, held by its only writer.  See the module docstring.

    Offsets: ``log_start_offset`` <= every readable offset < ``log_end_offset`` (the next offset to assign).
    Not thread-safe: one thread calls it (a background thread only fsyncs rolled segments).
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
        self._fork_generation = _FORK_GENERATION[0]
        self._segments: list[LogSegment] = []
        self._bases: list[int] = []
        self._log_start_offset = 0
        self._recovery_point = 0
        self._epochs = LeaderEpochCache(os.path.join(directory, LEADER_EPOCH_CHECKPOINT_FILE))
        self._unflushed_records = 0
        self._last_flush = time.monotonic()
        self._flush_due_s = self._last_flush + config.flush_ms / 1000  # flush.ms after the last flush
        self._flush_messages = config.flush_messages
        self._flush_timed = config.flush_ms < LONG_MAX  # else the due time is never reached: no clock read
        self._checkpoint_lock = threading.Lock()
        self._flusher = RolledSegmentFlusher(self._set_recovery_point, f"flush-{self.name}")
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
        lock_fd = _lock(path, f"{tp[0]}-{tp[1]}")
        log = cls(path, config, tp, lock_fd)
        try:
            log._load(check_crc=recover)
        except BaseException:
            log._release()
            raise
        return log

    def _load(self, *, check_crc: bool) -> None:
        clean_marker = os.path.join(self.directory, CLEAN_SHUTDOWN_FILE)
        clean = os.path.exists(clean_marker)
        self._remove_stray_files()
        self._epochs = LeaderEpochCache.load(self._epochs.path)
        self._recovery_point = self._read_offset_checkpoint(RECOVERY_POINT_CHECKPOINT_FILE) or 0
        self._log_start_offset = self._read_offset_checkpoint(LOG_START_OFFSET_CHECKPOINT_FILE) or 0
        bases = list_segment_base_offsets(self.directory)
        # A crash between advancing the log start offset and deleting files leaves segments wholly below it.
        while len(bases) > 1 and bases[1] <= self._log_start_offset:
            _delete_segment_files(self.directory, bases.pop(0))
        if not bases:
            segment = LogSegment.create(self.directory, self._log_start_offset, self.config)
            self._segments = [segment]
            self._recovery_point = self._log_start_offset
        else:
            result = load_segments(self.directory, self.config, bases, clean=clean,
                                   recovery_point=self._recovery_point, check_crc=check_crc)
            self._segments = result.segments
            for epoch, start in result.epoch_starts:
                if epoch > self._epochs.latest_epoch:
                    self._epochs.assign(epoch, start)
            for segment in result.scanned:
                segment.flush()
        self._bases = [s.base_offset for s in self._segments]
        self._log_start_offset = max(self._log_start_offset, self._segments[0].base_offset)
        self._epochs.truncate_from_end(self.log_end_offset)
        self._epochs.truncate_from_start(self._log_start_offset)
        self._recovery_point = self.log_end_offset
        self._write_offset_checkpoint(RECOVERY_POINT_CHECKPOINT_FILE, self._recovery_point)
        self._write_offset_checkpoint(LOG_START_OFFSET_CHECKPOINT_FILE, self._log_start_offset)
        if clean:
            os.unlink(clean_marker)
            fsync_directory(self.directory)

    def _remove_stray_files(self) -> None:
        names = os.listdir(self.directory)
        logs = {parse_segment_name(n, LOG_SUFFIX) for n in names} - {None}
        for name in names:
            orphan = any(
                parse_segment_name(name, suffix) is not None and parse_segment_name(name, suffix) not in logs
                for suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX)
            )
            if name.endswith(".tmp") or orphan:
                os.unlink(os.path.join(self.directory, name))

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
                self._flusher.drain()
                self.active_segment.seal()
                for segment in self._segments:
                    if segment.next_offset > self._recovery_point or segment is self.active_segment:
                        segment.flush()
                        segment.index_files_fsync()
                self._set_recovery_point(self.log_end_offset)
                write_atomically(os.path.join(self.directory, CLEAN_SHUTDOWN_FILE), b"")
        finally:
            self._flusher.stop()
            for segment in self._segments:
                segment.close()
            self._release()

    def _release(self) -> None:
        self._closed = True
        self._append_generation = -1
        if self._lock_fd >= 0:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
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
        return sum(s.size_bytes for s in self._segments)

    @property
    def segments(self) -> list[SegmentInfo]:
        return [SegmentInfo(s.base_offset, s.log_path, s.size_bytes, s.next_offset, s.max_timestamp,
                            s is self._segments[-1]) for s in self._segments]

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
            view = _byte_view(view)
        max_batch_bytes = self.config.max_message_bytes
        first = check_batch(view, 0, whole=False)
        if not isinstance(first, int) and first[_BATCH_LENGTH] + LOG_OVERHEAD == len(view) <= max_batch_bytes:
            return self.append_batches((view,), (first,), leader_epoch=leader_epoch)  # one valid batch
        self._check_writable()
        headers = self._validate(view, max_batch_bytes, first=first)
        latest_epoch = self._check_leader_epoch(leader_epoch)
        first_offset = next_offset = self._segments[-1].next_offset
        batches: list[tuple[int, int, int, int]] = []
        records = position = 0
        for header in headers:
            stamp(view, position, next_offset, leader_epoch)
            last = next_offset + header.last_offset_delta
            size = header.batch_length + LOG_OVERHEAD
            batches.append((next_offset, last, size, header.max_timestamp))
            records += header.records_count
            next_offset = last + 1
            position += size
        if leader_epoch > latest_epoch:
            self._epochs.assign(leader_epoch, first_offset)
        return self._write((view,), position, batches, records)

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
        them) and the buffers go to the active segment with one ``os.writev`` per segment touched (at most
        ``IOV_MAX`` buffers per call), straight from the caller's memory.  Rolls and indexes as
        :meth:`append`.  Raises :class:`NotLeaderError` for an epoch older than the latest recorded,
        ``ValueError`` for mismatched arguments; then nothing was stamped or appended.  Untrusted bytes go
        through :meth:`append`, which validates.
        """
        count = len(views)
        if count == 1 == len(headers):  # the hot path (see the module docstring)
            header = headers[0]
            epochs = self._epochs.entries
            if (epochs and epochs[-1].epoch == leader_epoch  # the latest recorded epoch
                    and self._append_generation == _FORK_GENERATION[0]  # open, and not a forked child
                    and self._flusher.error is None):  # (else the general path raises it)
                segment = self._segments[-1]
                view = views[0]
                size = header[_BATCH_LENGTH] + LOG_OVERHEAD
                base = segment.next_offset
                last = base + header[_LAST_OFFSET_DELTA]
                max_timestamp = header[_MAX_TIMESTAMP]
                _pack_stamp(view, 0, base, size - LOG_OVERHEAD, leader_epoch)
                position = segment.append_batch(view, size, last, max_timestamp)
                if position >= 0:
                    records = header[_RECORDS_COUNT]
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
        latest_epoch = self._check_leader_epoch(leader_epoch)
        first_offset = next_offset = self._segments[-1].next_offset
        batches: list[tuple[int, int, int, int]] = []
        records = total = 0
        for view, header in zip(views, headers, strict=True):
            size = header[_BATCH_LENGTH] + LOG_OVERHEAD
            _pack_stamp(view, 0, next_offset, size - LOG_OVERHEAD, leader_epoch)  # as stamp(), in one pack
            last = next_offset + header[_LAST_OFFSET_DELTA]
            batches.append((next_offset, last, size, header[_MAX_TIMESTAMP]))
            records += header[_RECORDS_COUNT]
            total += size
            next_offset = last + 1
        if leader_epoch > latest_epoch:
            self._epochs.assign(leader_epoch, first_offset)
        return self._write(views, total, batches, records)

    def _check_leader_epoch(self, leader_epoch: int) -> int:
        """The latest recorded epoch, after refusing an append in an older (or negative) one."""
        latest_epoch = self._epochs.latest_epoch
        if leader_epoch < latest_epoch:
            raise NotLeaderError(
                f"partition {self.name}: append in leader epoch {leader_epoch}, but epoch {latest_epoch} is "
                "already recorded; this writer was fenced"
            )
        if leader_epoch < 0:
            raise ValueError(f"partition {self.name}: leader epoch {leader_epoch} must be >= 0")
        return latest_epoch

    def append_as_follower(self, buf: bytes | bytearray | memoryview, *,
                           validated: Sequence[BatchHeader] | None = None) -> AppendInfo:
        """Append a leader's batches unchanged (a replica): offsets and epochs are the batches' own.

        The first batch must start at the log end offset and offsets must move forward; each new
        ``partitionLeaderEpoch`` is recorded in the leader-epoch cache.  Raises :class:`CorruptRecordError` or
        :class:`InvalidRecordError`; then nothing was appended.  ``validated``: the headers of every batch in
        ``buf``, in order, as the caller's own check of these very bytes returned them (magic, length, CRC:
        ``storage.batch_reader.iter_batches``); they are not checked again.
        """
        self._check_writable()
        view = _byte_view(buf)
        if validated is None:
            headers = self._validate(view)
        else:
            headers = list(validated)
            if sum(h.size for h in headers) != len(view) or not headers:
                raise InvalidRecordError(f"{self._where}: follower append: the validated batches hold "
                                         f"{sum(h.size for h in headers)} bytes, the buffer {len(view)}")
        expected = self.log_end_offset
        batches: list[tuple[int, int, int, int]] = []
        records = position = 0
        for header in headers:
            if not batches and header.base_offset != expected:
                raise InvalidRecordError(
                    f"partition {self.name}: follower append: the first record batch has base offset "
                    f"{header.base_offset}, expected the log end offset {expected}"
                )
            if header.base_offset < expected:
                raise InvalidRecordError(
                    f"partition {self.name}: follower append: record batch at position {position} has base "
                    f"offset {header.base_offset}, expected at least {expected} (offsets must move forward)"
                )
            batches.append((header.base_offset, header.last_offset, header.size, header.max_timestamp))
            records += header.records_count
            expected = header.last_offset + 1
            position += header.size
        for header in headers:
            epoch = header.partition_leader_epoch
            if epoch >= 0 and epoch != self._epochs.latest_epoch:
                self._epochs.assign(epoch, header.base_offset)
        return self._write((view,), position, batches, records)

    def append_walked_as_follower(self, buf: bytes | bytearray | memoryview,
                                  batches: BatchArrays) -> AppendInfo:
        """:meth:`append_as_follower` for batches described by arrays instead of headers: the lean path of a
        follower copying many small batches at once (no header tuples; from 64 batches on no Python per
        batch at all: one ``plan_index_entries`` call gives the index entries, ``LogSegment.append_walked``).

        ``batches``: what ``storage.batch_scan.walk_batches(np.frombuffer(buf, np.uint8), 0, len(buf),
        s, self.log_end_offset, ...)`` returned for these very bytes (any ``s``), at least one row, the first
        at position 0, the last ending at ``len(buf)`` -- so offsets move forward from the log end -- with
        every stored CRC checked by the caller.  **The log trusts them** beyond the first base offset and
        the total length, which it checks (:class:`InvalidRecordError`; then nothing was appended).  Same
        effects as :meth:`append_as_follower`: epochs recorded, rolls, indexes, flushes.
        """
        self._check_writable()
        view = _byte_view(buf)
        count = len(batches.positions)
        if count == 0 or batches.positions[0] != 0 or int(batches.positions[-1] + batches.sizes[-1]) != len(
                view):
            raise InvalidRecordError(f"{self._where}: follower append: the walked batches do not cover the "
                                     f"buffer of {len(view)} bytes ({count} batches)")
        expected = self.log_end_offset
        first_base = int(batches.base_offsets[0])
        if first_base != expected:
            raise InvalidRecordError(
                f"partition {self.name}: follower append: the first record batch has base offset "
                f"{first_base}, expected the log end offset {expected}"
            )
        epochs = batches.epochs
        first_epoch = int(epochs[0])
        if (first_epoch != self._epochs.latest_epoch and first_epoch >= 0) or (
                count > 1 and not (epochs == first_epoch).all()):
            for epoch, base in zip(epochs.tolist(), batches.base_offsets.tolist(), strict=True):
                if epoch >= 0 and epoch != self._epochs.latest_epoch:
                    self._epochs.assign(epoch, base)
        if count < _PLANNED_APPEND_BATCHES:  # a few batches: Python per batch costs less than numpy per call
            positions = batches.positions.tolist()
            records = sum(_unpack_records_count(view, position + RECORDS_COUNT_OFFSET)[0]
                          for position in positions)
            rows = list(zip(batches.base_offsets.tolist(), batches.last_offsets.tolist(),
                            batches.sizes.tolist(), batches.max_timestamps.tolist(), strict=True))
            return self._write((view,), len(view), rows, records)
        return self._write_planned(view, batches, records=int(
            np.frombuffer(view, dtype=np.uint8)[batches.positions[:, None] + _RECORDS_COUNT_BYTES]
            .view(_BIG_INT32).sum()))

    def _write_planned(self, view: memoryview, batches: BatchArrays, *, records: int) -> AppendInfo:
        """:meth:`_write` for many batches given as arrays: the index entries planned by one kernel call
        (``LogSegment.append_walked``) where everything fits the active segment."""
        positions, sizes, base_offsets, last_offsets, max_timestamps, _, _ = batches
        count = len(positions)
        now_ms = _time_ns() // 1_000_000
        config = self.config
        segment = self._segments[-1]
        top = int(max_timestamps.argmax())
        max_timestamp = int(max_timestamps[top])
        first, last = int(base_offsets[0]), int(last_offsets[-1])
        offset_of_max = int(last_offsets[top]) if max_timestamp > -1 else first - 1
        max_timestamp = max(max_timestamp, -1)
        size_bytes = len(view)
        size = segment.size_bytes
        rolling = segment.rolling_timestamp
        if not (  # as _write: everything fits the active segment, which has aged less than segment.ms
            0 < size <= config.segment_bytes - size_bytes
            and last - segment.base_offset <= INT32_MAX
            and segment.index_room() >= count
            and (max_timestamp - rolling if rolling >= 0 else now_ms - segment.created_ms)
            <= config.segment_ms
        ):
            rows = list(zip(base_offsets.tolist(), last_offsets.tolist(), sizes.tolist(),
                            max_timestamps.tolist(), strict=True))
            return self._write((view,), size_bytes, rows, records)
        position = segment.append_walked((view,), size_bytes, positions, sizes, last_offsets, max_timestamps)
        self._unflushed_records += records
        if self._unflushed_records >= self._flush_messages or (
                self._flush_timed and time.monotonic() >= self._flush_due_s):
            self.flush()
        return _new_tuple(AppendInfo, (first, last, now_ms, max_timestamp, offset_of_max, count, records,
                                       position, segment.base_offset, size_bytes))

    def _validate(self, view: memoryview, max_batch_bytes: int | None = None, *,
                  first: BatchHeader | int | None = None) -> list[BatchHeader]:
        """Every batch in ``view`` (magic, length, CRC; size limit for leaders), before anything changes.
        ``first``: what ``check_batch(view, 0, whole=False)`` already returned (not computed twice)."""
        end = len(view)
        if end == 0:
            raise InvalidRecordError(f"{self._where}: no record batch in an empty buffer")
        headers = []
        position = 0
        while position < end:
            header = check_batch(view, position, whole=False) if position or first is None else first
            if isinstance(header, int):  # refused: validate_batch raises, saying why
                header = validate_batch(view, position, where=self._where)
            size = header.batch_length + LOG_OVERHEAD
            if max_batch_bytes is not None and size > max_batch_bytes:
                raise InvalidRecordError(
                    f"{self._where}: record batch at position {position} is {size} bytes, larger than "
                    f"max.message.bytes {max_batch_bytes}"
                )
            headers.append(header)
            position += size
        return headers

    def _write(self, parts: Sequence[BatchBuffer], size_bytes: int, batches: list[tuple[int, int, int, int]],
               records: int) -> AppendInfo:
        """Write stamped batches ``(base, last, size, max timestamp)``, rolling where needed, with one write
        per segment touched.  ``parts``: one buffer holding every batch, or one buffer per batch."""
        now_ms = time.time_ns() // 1_000_000
        config = self.config
        segment = self._segments[-1]
        max_timestamp, offset_of_max = -1, batches[0][0] - 1
        for batch in batches:
            if batch[3] > max_timestamp:
                max_timestamp, offset_of_max = batch[3], batch[1]
        size = segment.size_bytes
        rolling = segment.rolling_timestamp
        if (  # the common case: everything fits the active segment, which has aged less than segment.ms
            0 < size <= config.segment_bytes - size_bytes
            and batches[-1][1] - segment.base_offset <= INT32_MAX
            and segment.index_room() >= len(batches)
            and (max_timestamp - rolling if rolling >= 0 else now_ms - segment.created_ms)
            <= config.segment_ms
        ):
            first_segment = segment.base_offset
            first_position = segment.append_parts(parts, size_bytes, batches)
        else:
            first_position, first_segment = self._write_rolling(parts, batches, now_ms)
        self._unflushed_records += records
        if self._unflushed_records >= self._flush_messages or (
                self._flush_timed and time.monotonic() >= self._flush_due_s):
            self.flush()
        return _new_tuple(AppendInfo, (batches[0][0], batches[-1][1], now_ms, max_timestamp, offset_of_max,
                                       len(batches), records, first_position, first_segment, size_bytes))

    def _write_rolling(self, parts: Sequence[BatchBuffer], batches: list[tuple[int, int, int, int]],
                       now_ms: int) -> tuple[int, int]:
        """Batch by batch: roll before one that does not fit the active segment.  Returns the position and
        segment base offset of the first batch."""
        if len(parts) != len(batches):  # one buffer holding them all: one view per batch
            whole = memoryview(parts[0]).cast("B")
            at = 0
            pieces = []
            for batch in batches:
                pieces.append(whole[at : at + batch[2]])
                at += batch[2]
            parts = pieces
        config = self.config
        segment = self._segments[-1]
        size = segment.size_bytes
        since = segment.bytes_since_last_index_entry
        room = segment.index_room()
        rolling = segment.rolling_timestamp
        group_start = 0
        group_bytes = 0
        first_position = -1
        first_segment = segment.base_offset
        for i, (base, last, batch_size, max_timestamp) in enumerate(batches):
            if size > 0 and (
                size + batch_size > config.segment_bytes
                or last - segment.base_offset > INT32_MAX
                or (since > config.index_interval_bytes and room <= 0)
                or (max_timestamp - rolling if rolling >= 0 else now_ms - segment.created_ms)
                > config.segment_ms
            ):
                if i > group_start:
                    at = segment.append_parts(parts[group_start:i], group_bytes, batches[group_start:i])
                    if first_position < 0:
                        first_position, first_segment = at, segment.base_offset
                segment = self._roll(base)
                size, since, room, rolling = 0, 0, segment.index_room(), -1
                group_start, group_bytes = i, 0
            if since > config.index_interval_bytes:
                room -= 1
                since = 0
            if size == 0:
                rolling = max_timestamp
            since += batch_size
            size += batch_size
            group_bytes += batch_size
        at = segment.append_parts(parts[group_start:], group_bytes, batches[group_start:])
        if first_position < 0:
            first_position, first_segment = at, segment.base_offset
        return first_position, first_segment

    def _check_writable(self) -> None:
        if self._closed:
            raise LogLockedError(f"partition {self.name}: the log is closed")
        if _FORK_GENERATION[0] != self._fork_generation:
            raise LogLockedError(
                f"partition {self.name}: the log was opened by process {self._pid}, not this forked "
                f"process {os.getpid()}; a log has exactly one writer"
            )
        self._flusher.raise_error()

    # --- rolling and flushing -------------------------------------------------------------------------------
    def roll(self) -> int:
        """Start a new active segment at the log end offset (no-op when the active one is empty).
        Returns the active segment's base offset."""
        self._check_writable()
        if self.active_segment.size_bytes == 0:
            return self.active_segment.base_offset
        return self._roll(self.log_end_offset).base_offset

    def _roll(self, base_offset: int) -> LogSegment:
        old = self.active_segment
        old.seal()
        segment = LogSegment.create(self.directory, base_offset, self.config)
        self._segments.append(segment)
        self._bases.append(base_offset)
        self._flusher.submit(os.dup(old.read_fd), (old.index_path, old.time_index_path), old.next_offset)
        return segment

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
            i = max(0, bisect.bisect_right(self._bases, offset) - 1)
            for segment in self._segments[i:]:
                found = segment.read(max(offset, segment.base_offset), max_bytes, max_offset=max_offset,
                                     verify=False)
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
            yield from _split_batches(piece.read_bytes())
            offset = piece.next_offset

    def offset_for_timestamp(self, timestamp_ms: int) -> OffsetAndTimestamp | None:
        """ListOffsets: the base offset and max timestamp of the first batch whose max timestamp is >=
        ``timestamp_ms`` (a batch granularity answer: that batch may also hold earlier records), or None.

        ``EARLIEST_TIMESTAMP`` (-2) and ``LATEST_TIMESTAMP`` (-1) give the log start and end offsets.
        """
        if timestamp_ms == EARLIEST_TIMESTAMP:
            return OffsetAndTimestamp(self._log_start_offset, -1)
        if timestamp_ms == LATEST_TIMESTAMP:
            return OffsetAndTimestamp(self.log_end_offset, -1)
        for segment in self._segments:
            if segment.max_timestamp >= timestamp_ms:
                found = segment.find_timestamp(timestamp_ms, verify=False)
                if found is not None:
                    return OffsetAndTimestamp(max(found.offset, self._log_start_offset), found.timestamp)
        return None

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
        while len(self._segments) > 1 and self._segments[-1].base_offset > offset:
            self._segments.pop().delete()
            self._bases.pop()
        segment = self.active_segment
        segment.reopen_for_append()
        dropped = segment.truncate_to(offset)
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
        for segment in self._segments:
            segment.delete()
        self._segments = [LogSegment.create(self.directory, offset, self.config)]
        self._bases = [offset]
        self._set_recovery_point(offset)
        self._epochs.clear()

    def delete_retained_segments(self, now_ms: int | None = None, *,
                                 high_watermark: int | None = None) -> int:
        """Apply retention (``retention.ms``, ``retention.bytes``, the log start offset; never the active
        segment; only below ``high_watermark`` if given).  Returns the number of segments deleted."""
        self._check_writable()
        now = time.time_ns() // 1_000_000 if now_ms is None else now_ms
        candidates = [RetentionCandidate(s.base_offset, s.next_offset, s.size_bytes, s.largest_timestamp())
                      for s in self._segments]
        count = segments_to_delete(candidates, now_ms=now, retention_ms=self.config.retention_ms,
                                   retention_bytes=self.config.retention_bytes,
                                   log_start_offset=self._log_start_offset, high_watermark=high_watermark)
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
        count = 0
        while count < len(self._segments) - 1 and self._segments[count + 1].base_offset <= offset:
            count += 1
        if count:
            self._delete_first_segments(count)

    def _delete_first_segments(self, count: int) -> None:
        doomed = self._segments[:count]
        start = max(self._log_start_offset, self._segments[count].base_offset)
        if start != self._log_start_offset:
            self._log_start_offset = start
            self._write_offset_checkpoint(LOG_START_OFFSET_CHECKPOINT_FILE, start)  # before any unlink
            self._epochs.truncate_from_start(start)
        del self._segments[:count]
        del self._bases[:count]
        for segment in doomed:
            _log.info("partition %s: deleting segment %s (%d bytes, offsets %d..%d)", self.name,
                      segment.log_path, segment.size_bytes, segment.base_offset, segment.next_offset - 1)
            segment.delete()

    # --- checkpoints ----------------------------------------------------------------------------------------
    def _read_offset_checkpoint(self, name: str) -> int | None:
        entries = read_offset_checkpoint(os.path.join(self.directory, name))
        if not entries:
            return None
        key = self._checkpoint_key()
        if key in entries:
            return entries[key]
        if len(entries) == 1:
            return next(iter(entries.values()))
        raise CorruptRecordError(
            f"checkpoint file {os.path.join(self.directory, name)}: no entry for {key[0]} {key[1]}"
        )

    def _write_offset_checkpoint(self, name: str, offset: int) -> None:
        write_offset_checkpoint(os.path.join(self.directory, name), {self._checkpoint_key(): offset})

    def _checkpoint_key(self) -> tuple[str, int]:
        topic, partition = self.topic_partition
        return "_".join(topic.split()) or "_", partition


def _lock(directory: str, name: str) -> int:
    path = os.path.join(directory, LOCK_FILE)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").partition("\n")[0].strip() or "unknown"
        os.close(fd)
        raise LogLockedError(
            f"partition {name}: log directory {directory} is already open for writing by process {holder} "
            f"(flock on {path}); a log has exactly one writer"
        ) from None
    pid = f"{os.getpid()}\n".encode()
    os.pwrite(fd, pid, 0)
    os.ftruncate(fd, len(pid))  # after the write: a file truncated to 0 is flushed by ext4 on close (~30 µs)
    return fd


def _byte_view(buf: bytes | bytearray | memoryview) -> memoryview:
    view = memoryview(buf)
    if view.readonly:
        view = memoryview(bytearray(view))
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return view


def _delete_segment_files(directory: str, base_offset: int) -> None:
    for suffix in (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(segment_path(directory, base_offset, suffix))


def _split_batches(data: bytes) -> Iterator[bytes]:
    position = 0
    while position < len(data):
        length = int.from_bytes(data[position + BATCH_LENGTH_OFFSET : position + LOG_OVERHEAD], "big")
        size = length + LOG_OVERHEAD
        yield data[position : position + size]
        position += size
