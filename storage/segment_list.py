"""The segment list of a partition log: its segments, oldest first, and every change to the list as a whole.

Theory of operation
-------------------
A log's offsets are split across segments, each holding ``[base_offset, next_offset)`` and each starting
where the one before it ends; the last one is the *active segment*, the only one that takes appends.
:class:`SegmentList` holds them in that order with their base offsets beside them (for ``bisect``) and is the
one place the list changes:

* **rolling** (:meth:`~SegmentList.roll`): the active segment is sealed (its indexes trimmed), a new one
  created at the given base offset, and the sealed one handed to the background flusher
  (``storage.flusher``); :meth:`~SegmentList.write_rolling` writes batches across as many rolls as the roll
  rules (``LogSegment.batches_that_fit``) ask for;
* **cutting back** a failed append (:meth:`~SegmentList.cut_back`), in this order: the segments the append
  rolled to are deleted, newest first; the segment it started in is the active one again (reopened if a roll
  had sealed it); its bytes from the append's first offset on are dropped (a write that failed part-way has
  already cut back its own, ``LogSegment``);
* **truncating** a replica (:meth:`~SegmentList.truncate_to`): the segments above the offset are deleted,
  the one holding it is reopened and cut; :meth:`~SegmentList.reset` deletes them all and starts over;
* **retention** (:meth:`~SegmentList.remove_first`): the oldest segments leave the list, then their files
  are unlinked;
* **a clean's swap** (:meth:`~SegmentList.swap_cleaned`): groups of closed segments are each replaced by the
  one segment a clean wrote aside for it (``storage.clean_swap``, which unlinks the replaced files).

The segments retention and a swap take out of the list are not closed here: they are retired to the log's
deleter (``storage.segment_deleter``), which closes them ``file.delete.delay.ms`` later on its own thread,
so this thread never waits for the kernel to free their pages and a reader in flight keeps reading them
for the delay.  The segments a cut-back, a truncation or a reset deletes are closed and unlinked at once.

Reads go through :meth:`~SegmentList.read`, from the segment holding the offset on (timestamps:
``storage.timestamp_search`` over ``segments``).

``segments`` is a plain list that is changed in place and never replaced, so its owner
(``storage.log.Log``) keeps it and reads the active segment as ``segments[-1]`` on the append hot path
without a call.  The list is not thread-safe: the log's one writing thread calls it.
"""

from __future__ import annotations

import bisect
import logging
import os
from collections.abc import Sequence
from typing import NamedTuple

from storage.clean_swap import SwapGroup, finish_interrupted_swap, swap_in
from storage.flusher import RolledSegmentFlusher
from storage.log_config import LogConfig
from storage.retention import RetentionCandidate, segments_to_delete
from storage.segment import BatchRow, LogSegment
from storage.segment_deleter import SegmentDeleter
from storage.segment_file import BatchBuffer, FetchSlice

__all__ = ["SegmentInfo", "SegmentList"]

_log = logging.getLogger(__name__)


class SegmentInfo(NamedTuple):
    base_offset: int
    path: str
    size_bytes: int
    next_offset: int
    max_timestamp: int
    is_active: bool


class SegmentList:
    """The segments of one log, oldest first, and their base offsets.  See the module docstring."""

    def __init__(self, directory: str, config: LogConfig, flusher: RolledSegmentFlusher,
                 deleter: SegmentDeleter, name: str) -> None:
        self.directory = directory
        self.config = config
        self.name = name  # the partition, for log lines
        self.segments: list[LogSegment] = []  # changed in place, never replaced
        self.bases: list[int] = []  # segments[i].base_offset, for bisect
        self._flusher = flusher
        self._deleter = deleter

    def load(self, segments: Sequence[LogSegment]) -> None:
        """Take the segments a log's opening loaded (``storage.log_loader``)."""
        self.segments[:] = segments
        self.bases[:] = [s.base_offset for s in segments]

    def __len__(self) -> int:
        return len(self.segments)

    @property
    def active(self) -> LogSegment:
        return self.segments[-1]

    @property
    def size_bytes(self) -> int:
        return sum(s.size_bytes for s in self.segments)

    def close(self) -> None:
        """Close every segment, those retired to the deleter too."""
        for segment in self.segments:
            segment.close()
        self._deleter.close()

    def infos(self) -> list[SegmentInfo]:
        active = self.segments[-1]
        return [SegmentInfo(s.base_offset, s.log_path, s.size_bytes, s.next_offset, s.max_timestamp,
                            s is active) for s in self.segments]

    # --- rolling --------------------------------------------------------------------------------------------
    def roll(self, base_offset: int) -> LogSegment:
        """Seal the active segment, hand it to the flusher and start a new active one at ``base_offset``."""
        old = self.segments[-1]
        old.seal()
        segment = LogSegment.create(self.directory, base_offset, self.config)
        self.segments.append(segment)
        self.bases.append(base_offset)
        self._flusher.submit(os.dup(old.read_fd), (old.index_path, old.time_index_path), old.next_offset)
        return segment

    def write_rolling(self, parts: Sequence[BatchBuffer], batches: list[BatchRow],
                      now_ms: int) -> tuple[int, int]:
        """Write stamped batches batch by batch: as many as the active segment takes, then a roll before the
        next.  ``parts``: one buffer holding every batch, or one buffer per batch.  Returns the position and
        segment base offset of the first batch."""
        if len(parts) != len(batches):  # one buffer holding them all: one view per batch
            whole = memoryview(parts[0]).cast("B")
            at = 0
            pieces = []
            for batch in batches:
                pieces.append(whole[at : at + batch[2]])
                at += batch[2]
            parts = pieces
        segment = self.segments[-1]
        first_position, first_segment = -1, segment.base_offset
        start = 0
        while True:
            stop = start + segment.batches_that_fit(batches[start:], now_ms)
            if stop > start:
                group = batches[start:stop]
                at = segment.append_parts(parts[start:stop], sum(batch[2] for batch in group), group)
                if first_position < 0:
                    first_position, first_segment = at, segment.base_offset
            if stop == len(batches):
                return first_position, first_segment
            segment = self.roll(batches[stop][0])
            start = stop

    # --- cutting back, truncating, retention ----------------------------------------------------------------
    def cut_back(self, end: int, segment_count: int) -> None:
        """Put the list back as it was before a failed append that started at offset ``end`` with
        ``segment_count`` segments (the order is in the module docstring)."""
        while len(self.segments) > segment_count:
            self.bases.pop()
            self.segments.pop().delete()
        segment = self.segments[-1]
        segment.reopen_for_append()
        if segment.next_offset > end:
            segment.truncate_to(end)

    def truncate_to(self, offset: int) -> tuple[LogSegment, int]:
        """Delete the segments above ``offset`` (never the first), reopen the one left last and cut it at
        ``offset`` (``LogSegment.truncate_to``).  Returns it and the bytes dropped from it."""
        while len(self.segments) > 1 and self.segments[-1].base_offset > offset:
            self.segments.pop().delete()
            self.bases.pop()
        segment = self.segments[-1]
        segment.reopen_for_append()
        return segment, segment.truncate_to(offset)

    def reset(self, offset: int) -> None:
        """Delete every segment; one empty active segment at ``offset`` is left."""
        for segment in self.segments:
            segment.delete()
        self.segments[:] = [LogSegment.create(self.directory, offset, self.config)]
        self.bases[:] = [offset]

    def retention_count(self, now_ms: int, log_start_offset: int, high_watermark: int | None) -> int:
        """How many of the oldest segments retention deletes (``storage.retention``, with this list's
        ``retention.ms`` and ``retention.bytes``)."""
        candidates = [RetentionCandidate(s.base_offset, s.next_offset, s.size_bytes, s.largest_timestamp())
                      for s in self.segments]
        return segments_to_delete(candidates, now_ms=now_ms, retention_ms=self.config.retention_ms,
                                  retention_bytes=self.config.retention_bytes,
                                  log_start_offset=log_start_offset, high_watermark=high_watermark)

    def count_wholly_below(self, offset: int) -> int:
        """How many of the oldest segments hold only offsets below ``offset`` (never the active one)."""
        count = 0
        while count < len(self.segments) - 1 and self.segments[count + 1].base_offset <= offset:
            count += 1
        return count

    def remove_first(self, count: int) -> None:
        """Remove the ``count`` oldest segments (never the active one) from the list, then unlink their
        files and retire them to the deleter."""
        doomed = self.segments[:count]
        del self.segments[:count]
        del self.bases[:count]
        for segment in doomed:
            _log.info("partition %s: deleting segment %s (%d bytes, offsets %d..%d)", self.name,
                      segment.log_path, segment.size_bytes, segment.base_offset, segment.next_offset - 1)
            segment.unlink()
        self._deleter.retire(doomed, self.config.file_delete_delay_ms)

    def swap_cleaned(self, groups: Sequence[SwapGroup]) -> None:
        """Replace each group's closed segments (``replaced``) by the segment a clean wrote aside at its
        ``base_offset`` (``storage.clean_swap.swap_in``, all groups in one swap), then load them.  A step that
        fails is finished or undone on the spot, group by group (``finish_interrupted_swap``) and raised; the
        list then holds what the directory holds."""
        spans = []
        for base_offset, replaced in groups:
            i = bisect.bisect_left(self.bases, base_offset)
            j = i + len(replaced)
            if self.bases[i:j] != list(replaced) or replaced[0] != base_offset or j >= len(self.segments):
                raise ValueError(f"partition {self.name}: segments {list(replaced)} are not consecutive "
                                 f"closed segments of the log (it has {self.bases})")
            spans.append((i, j))
        firsts = [self.segments[i] for i, _ in spans]
        try:
            swap_in(self.directory, groups)
        except OSError:
            finish_interrupted_swap(self.directory)
            for (i, j), first in reversed(list(zip(spans, firsts, strict=True))):
                if os.stat(first.log_path).st_ino != os.fstat(first.read_fd).st_ino:  # that group committed
                    self._adopt_cleaned(i, j)
            raise
        for i, j in reversed(spans):  # from the last: the earlier groups' positions stay as they were
            self._adopt_cleaned(i, j)

    def _adopt_cleaned(self, i: int, j: int) -> None:
        base_offset = self.bases[i]
        replaced = self.bases[i:j]
        self._deleter.retire(self.segments[i:j], self.config.file_delete_delay_ms)  # unlinked by swap_in
        segment = LogSegment.load(self.directory, base_offset, self.config, active=False,
                                  next_offset_limit=self.bases[j])
        self.segments[i:j] = [segment]
        self.bases[i:j] = [base_offset]
        _log.info("partition %s: swapped in a cleaned segment at %d (%d bytes) for segments %s", self.name,
                  base_offset, segment.size_bytes, replaced)

    # --- reading --------------------------------------------------------------------------------------------
    def read(self, offset: int, max_bytes: int, max_offset: int | None) -> FetchSlice | None:
        """Whole batches from the segment holding ``offset`` on (``LogSegment.read``), or None when none
        is readable there."""
        i = max(0, bisect.bisect_right(self.bases, offset) - 1)
        for segment in self.segments[i:]:
            found = segment.read(max(offset, segment.base_offset), max_bytes, max_offset=max_offset,
                                 verify=False)
            if found is not None:
                return found
        return None
