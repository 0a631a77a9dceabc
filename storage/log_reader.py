"""A read-only view of a partition log for other processes (broker, local consumers): no lock, no writes.

Theory of operation
-------------------
The log's single writer (``storage.log.Log``, in another process) appends, rolls, truncates and deletes
while a :class:`LogReader` reads the same directory.  The reader is safe against every one of those because:

* it never maps a ``.log`` file: headers are read with ``pread`` and data is sent with ``sendfile`` from its
  own descriptors, so a truncated file only yields fewer bytes (never SIGBUS) and a deleted one stays
  readable through the open descriptor;
* it maps index files read-only, and the writer never shrinks an index file in place (it renames a trimmed
  copy over it), so every mapped page stays valid;
* every index answer is a *hint*, checked against the batch header it points at (an entry ``(o, p)`` must
  point at a whole batch whose last offset is ``o``); a wrong hint falls back to walking from position 0;
* it only reads whole batches that end within the file's current size, and the writer writes a batch's
  bytes before its index entries and before publishing its offset (the high watermark), so a reader bounded
  by ``max_offset`` never sees a partial batch.

The reader's picture of the directory (which segments exist, the log start offset) is refreshed when the
directory's mtime changes (segment created or deleted, checkpoint renamed), on every call while the mtime
it listed at is still within the kernel's clock tick (a second change in the same tick leaves the mtime as
it was: ``storage.log_dir.mtime_settled``), and whenever an offset is beyond
the segments it knows or a segment it reads was deleted.  A clean (``storage.clean_swap``) replaces a group
of segments with renames: between its first and last rename some of the group's offsets are in no
``.log`` file, so a listing that shows a ``*.deleted`` or ``*.swap`` file is not used: the reader lists
again after a short sleep, until the swap is done (a swap takes a few fsyncs; one a crash left unfinished,
for ``swap_wait_s``, is a retriable ``SwapInProgressError``, a ``KafkaStorageError``: the log's next open
finishes it).  A listed
segment that is gone before it is opened (renamed by a swap, deleted) also makes the reader list again, and
a view whose file was replaced under the same name (the group's first segment) is reopened.  A view opened
before a swap keeps reading the replaced file (its descriptor holds it) until it is unlinked, and then the
reader lists again: every read sees each batch either as it was before a clean or as after it.  A
:class:`~storage.segment_file.FetchSlice` it returns stays valid until the next call on the reader.  Not
thread-safe: one reader per thread.
"""

from __future__ import annotations

import bisect
import os
import time
from collections.abc import Iterator

from storage.checkpoints import LeaderEpochCache, read_offset_checkpoint
from storage.clean_swap import DELETED_SUFFIX, SWAP_SUFFIX
from storage.errors import OffsetOutOfRangeError, SwapInProgressError, UnknownTopicOrPartitionError
from storage.log import EARLIEST_TIMESTAMP, LATEST_TIMESTAMP
from storage.log_config import LogConfig
from storage.log_dir import (
    LEADER_EPOCH_CHECKPOINT_FILE,
    LOG_START_OFFSET_CHECKPOINT_FILE,
    mtime_settled,
    parse_topic_partition,
    segment_base_offsets,
)
from storage.segment import LogSegment, OffsetAndTimestamp
from storage.segment_file import FetchSlice, split_batches
from storage.timestamp_search import MAX_TIMESTAMP, record_at_or_after, record_of_max_timestamp

__all__ = ["DEFAULT_SWAP_WAIT_S", "LogReader", "open_read_only"]

DEFAULT_SWAP_WAIT_S = 10.0  # how long a listing waits for a clean's swap to finish
_FIRST_DELAY_S = 0.0005
_MAX_DELAY_S = 0.05


class LogReader:
    """Reads a partition directory that a ``Log`` in another process may be writing.  See the module doc."""

    def __init__(self, directory: str, config: LogConfig | None = None, *,
                 topic_partition: tuple[str, int] | None = None,
                 swap_wait_s: float = DEFAULT_SWAP_WAIT_S) -> None:
        self.directory = directory
        self.config = config or LogConfig()
        tp = topic_partition or parse_topic_partition(directory) or (os.path.basename(directory), 0)
        self.topic_partition = tp
        self.name = f"{tp[0]}-{tp[1]}"
        self._segments: list[LogSegment] = []
        self._bases: list[int] = []
        self._checkpoint_start = 0
        self._dir_mtime_ns = -1
        self._epochs: LeaderEpochCache | None = None
        self._epochs_identity: tuple[int, int] = (0, 0)
        self.swap_wait_s = swap_wait_s
        if not os.path.isdir(directory):
            raise UnknownTopicOrPartitionError(f"partition {self.name}: no log directory {directory}")
        self.refresh()

    # --- the directory's picture ----------------------------------------------------------------------------
    def refresh(self) -> None:
        """Re-list the segments and re-read the log start offset: again while a clean's swap is in flight
        (up to ``swap_wait_s``, then :class:`SwapInProgressError`) or a listed segment is gone before it
        was opened, so the picture never misses a segment's offsets."""
        delay, waited = _FIRST_DELAY_S, 0.0
        while True:
            mtime_ns = os.stat(self.directory).st_mtime_ns
            # an mtime still in its tick is not trusted: the next call lists again (mtime_settled)
            self._dir_mtime_ns = mtime_ns if mtime_settled(mtime_ns, time.time_ns()) else -1
            names = os.listdir(self.directory)
            swapping = [n for n in names if n.endswith((DELETED_SUFFIX, SWAP_SUFFIX))]
            if not swapping and self._open_segments(segment_base_offsets(names)):
                break
            if waited >= self.swap_wait_s:
                self._dir_mtime_ns = -1  # the picture is not current: the next call lists again
                raise SwapInProgressError(
                    f"partition {self.name}: {self.directory} holds {sorted(swapping)}: a clean's swap has "
                    f"been unfinished for {waited:.1f} s (KAFKA_STORAGE_ERROR, retriable); the next open of "
                    "the log finishes or undoes it (restart the partition's writer)",
                    partition=self.name, directory=self.directory, cause="unfinished clean swap")
            time.sleep(delay)
            waited += delay
            delay = min(2 * delay, _MAX_DELAY_S)
        try:
            entries = read_offset_checkpoint(os.path.join(self.directory, LOG_START_OFFSET_CHECKPOINT_FILE))
        except Exception:  # a torn read cannot happen (atomic rename), but never fail a reader on it
            entries = None
        self._checkpoint_start = max(entries.values()) if entries else 0

    def _open_segments(self, bases: list[int]) -> bool:
        """Make the segments at ``bases`` the picture, keeping the views still on the same file; False (the
        picture unchanged) when one was renamed or deleted before it was opened."""
        known = {s.base_offset: s for s in self._segments}
        segments: list[LogSegment] = []
        for base in bases:
            segment = known.pop(base, None)
            if segment is not None and not segment.same_file():
                known[-1 - base] = segment  # a clean replaced it: its view is closed below
                segment = None
            if segment is None:
                try:
                    segment = LogSegment.open_view(self.directory, base, self.config)
                except FileNotFoundError:
                    for opened in segments:
                        if opened not in self._segments:
                            opened.close()
                    return False
            else:
                segment.refresh_view()
            segments.append(segment)
        for gone in known.values():
            gone.close()
        self._segments = segments
        self._bases = [s.base_offset for s in segments]
        return True

    def _maybe_refresh(self) -> None:
        if os.stat(self.directory).st_mtime_ns != self._dir_mtime_ns:
            self.refresh()

    def close(self) -> None:
        for segment in self._segments:
            segment.close()
        self._segments = []
        self._bases = []

    def __enter__(self) -> LogReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- offsets --------------------------------------------------------------------------------------------
    @property
    def log_start_offset(self) -> int:
        self._maybe_refresh()
        return self._start()

    def _start(self) -> int:
        first = self._segments[0].base_offset if self._segments else self._checkpoint_start
        return max(first, self._checkpoint_start)

    @property
    def log_end_offset(self) -> int:
        """The offset after the last whole batch on disk right now (the writer's end may be ahead)."""
        self._maybe_refresh()
        return self._end()[1]

    def _end(self) -> tuple[int, int]:
        if not self._segments:
            return 0, self._checkpoint_start
        last = self._segments[-1]
        return last.end_of_data(verify=True)

    @property
    def segment_base_offsets(self) -> list[int]:
        self._maybe_refresh()
        return list(self._bases)

    # --- reading --------------------------------------------------------------------------------------------
    def read(self, offset: int, max_bytes: int, *, max_offset: int | None = None) -> FetchSlice:
        """Same contract as ``Log.read``: whole batches from the one holding ``offset``."""
        self._maybe_refresh()
        for attempt in range(3):
            start = self._start()
            if offset < start:
                if attempt < 2:
                    self.refresh()
                    continue
                raise self._out_of_range(offset, start, self._end()[1])
            stale = False
            i = max(0, bisect.bisect_right(self._bases, offset) - 1)
            for segment in self._segments[i:]:
                st = os.fstat(segment.read_fd)
                if st.st_nlink == 0:  # deleted (retention, truncation) since we listed the directory
                    stale = True
                    break
                found = segment.read(max(offset, segment.base_offset), max_bytes, max_offset=max_offset,
                                     verify=True, end=st.st_size)
                if found is not None:
                    return found
            if not stale and offset <= self._end()[1]:
                break
            self.refresh()  # the writer may have rolled, appended or deleted since we looked
        end_position, end_offset = self._end()
        if offset > end_offset:
            raise self._out_of_range(offset, self._start(), end_offset)
        if offset < self._start():
            raise self._out_of_range(offset, self._start(), end_offset)
        if not self._segments:
            return FetchSlice(self.directory, -1, 0, 0, offset, offset)
        last = self._segments[-1]
        return FetchSlice(last.log_path, last.read_fd, end_position, 0, offset, offset)

    def _out_of_range(self, offset: int, start: int, end: int) -> OffsetOutOfRangeError:
        return OffsetOutOfRangeError(
            f"partition {self.name}: offset {offset} is out of range: the log holds offsets [{start}, {end}) "
            f"(log start offset {start}, log end offset {end})"
        )

    def batches(self, start_offset: int | None = None, *, max_offset: int | None = None,
                max_bytes: int = 1 << 20) -> Iterator[bytes]:
        """Every whole batch from ``start_offset`` (default: the log start) as bytes."""
        offset = self.log_start_offset if start_offset is None else start_offset
        while True:
            piece = self.read(offset, max_bytes, max_offset=max_offset)
            if piece.size_bytes == 0:
                return
            yield from split_batches(piece.read_bytes())
            offset = piece.next_offset

    def offset_for_timestamp(self, timestamp_ms: int) -> OffsetAndTimestamp | None:
        """Same contract as ``Log.offset_for_timestamp``."""
        self._maybe_refresh()
        if timestamp_ms == EARLIEST_TIMESTAMP:
            return OffsetAndTimestamp(self._start(), -1)
        if timestamp_ms == LATEST_TIMESTAMP:
            return OffsetAndTimestamp(self._end()[1], -1)
        if timestamp_ms == MAX_TIMESTAMP:
            return record_of_max_timestamp(self._segments, log_start_offset=self._start(), verify=True)
        return record_at_or_after(self._segments, timestamp_ms, log_start_offset=self._start(), verify=True)

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        """OffsetsForLeaderEpoch from the writer's ``leader-epoch-checkpoint`` and the end on disk."""
        path = os.path.join(self.directory, LEADER_EPOCH_CHECKPOINT_FILE)
        try:
            st = os.stat(path)
            identity = (st.st_ino, st.st_mtime_ns)
        except FileNotFoundError:
            identity = (0, 0)
        if self._epochs is None or identity != self._epochs_identity:
            self._epochs = LeaderEpochCache.load(path)
            self._epochs_identity = identity
        return self._epochs.end_offset_for(epoch, self.log_end_offset)


def open_read_only(directory: str | os.PathLike[str], config: LogConfig | None = None, *,
                   topic_partition: tuple[str, int] | None = None) -> LogReader:
    """A :class:`LogReader` on ``directory`` (no lock; the writer may be running)."""
    return LogReader(os.fspath(directory), config, topic_partition=topic_partition)
