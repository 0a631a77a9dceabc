"""Undoing a failed append: the log put back exactly as it was before it, and the error to raise.

An append that fails part-way (``OSError`` from a write, a roll or an index; a full disk most often) may
have rolled to new segments, written some of its batches and recorded a new leader epoch.
:class:`AppendUndo` puts all of it back, in this order: the segment list (``SegmentList.cut_back``: the
segments the append rolled to deleted, the bytes from the append's first offset on dropped), then the
leader epochs recorded from that offset on.  A full disk is then raised as
:class:`~storage.errors.KafkaStorageError` naming the partition and the log directory (Kafka's
``KAFKA_STORAGE_ERROR``: the producer retries); any other error is raised as it is.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator

from storage.checkpoints import LeaderEpochCache
from storage.errors import KafkaStorageError, describe_os_error, is_disk_full
from storage.segment_list import SegmentList

__all__ = ["AppendUndo"]

_log = logging.getLogger("storage.log")


class AppendUndo:
    """The undo of a failed append to one log (see the module docstring)."""

    def __init__(self, segment_list: SegmentList, name: str, directory: str) -> None:
        self._segment_list = segment_list
        self._name = name  # the partition
        self._directory = directory

    @contextlib.contextmanager
    def undone_if_failed(self, end: int, epochs: LeaderEpochCache) -> Iterator[None]:
        """Around an append from log end offset ``end`` (the general paths): an ``OSError`` puts the log
        back as it was, and a full disk is raised as :class:`KafkaStorageError`."""
        count = len(self._segment_list)
        try:
            yield
        except OSError as exc:
            error = self.failed(exc, end, count, epochs)
            if error is None:
                raise
            raise error from exc

    def failed(self, exc: OSError, end: int, segment_count: int,
               epochs: LeaderEpochCache) -> KafkaStorageError | None:
        """An append from log end offset ``end`` with ``segment_count`` segments failed with ``exc``: put
        the log back exactly as it was (:meth:`undo`) and return the error to raise for a full disk (None:
        raise ``exc``)."""
        self.undo(end, segment_count, epochs)
        if not is_disk_full(exc):
            return None
        return KafkaStorageError.for_partition(self._name, os.path.dirname(self._directory) or ".",
                                               describe_os_error(exc))

    def undo(self, end: int, segment_count: int, epochs: LeaderEpochCache) -> None:
        """Cut the log back to log end offset ``end`` and ``segment_count`` segments after a failed append:
        the segment list first (``SegmentList.cut_back``), then the leader epochs recorded from ``end`` on."""
        self._segment_list.cut_back(end, segment_count)
        try:
            epochs.truncate_from_end(end)
        except OSError as exc:  # the cache is right in memory; its file is reconciled at the next open
            _log.warning("partition %s: cannot rewrite the leader-epoch checkpoint: %s", self._name, exc)
        _log.warning("partition %s: an append failed; the log is back at log end offset %d", self._name,
                     self._segment_list.active.next_offset)
