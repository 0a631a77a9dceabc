"""Duplicates a restarted partition writer re-reads: the *resume map* (``appliance.server.writer``).

A writer killed after appending a round but before releasing its frames leaves them in the rings; its
successor reads them again.  The producer state recovered from the log (snapshot + tail) recognises the last
five batches of each producer as duplicates; older ones (a round may append many batches of one producer)
are found here: the (producer id, epoch, first and last sequence) -> offsets of the log tail that the re-read
frames can cover, as many records as they hold (:func:`published_records` counts them when a ring is
attached), built from the log the first time a re-read frame looks out of order (:meth:`ResumeMap.lookup`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from ipc.ring import RingConsumer, RingFailedError
from storage.batch_header import HEADER_SIZE, LAST_OFFSET_DELTA_OFFSET, BatchHeader, parse_header
from storage.log import Log

__all__ = ["ResumeMap", "log_headers", "published_records"]

ResumeKey = tuple[int, int, int, int]  # producer id, epoch, first sequence, last sequence
_log = logging.getLogger("appliance.writer")


class ResumeMap:
    """The resume map of one writer's log, which ended at its log end offset when the writer opened it."""

    __slots__ = ("_built", "_built_records", "_end", "_log", "name", "records")

    def __init__(self, log: Log, name: str) -> None:
        self._log = log
        self.name = name
        self._end = log.log_end_offset
        self.records = 0  # records in the frames re-read from every ring attached (a previous writer's)
        self._built: dict[ResumeKey, tuple[int, int]] | None = None
        self._built_records = 0

    def lookup(self, header: BatchHeader) -> int | None:
        """The base offset of an appended batch with this batch's producer id, epoch and sequences, among
        the log's last records that re-read frames could cover; None if there is none."""
        if self.records == 0 or header.producer_id < 0:
            return None
        if self._built is None or self._built_records < self.records:
            self._built = self._build(self.records)
            self._built_records = self.records
        key = (header.producer_id, header.producer_epoch, header.base_sequence, header.last_sequence)
        found = self._built.get(key)
        return None if found is None else found[0]

    def _build(self, records: int) -> dict[ResumeKey, tuple[int, int]]:
        end = self._end
        start = max(self._log.log_start_offset, end - records)
        resume: dict[ResumeKey, tuple[int, int]] = {}
        for header in log_headers(self._log, start, max_offset=end):
            if header.producer_id >= 0 and header.base_sequence >= 0:
                key = (header.producer_id, header.producer_epoch, header.base_sequence, header.last_sequence)
                resume[key] = (header.base_offset, header.last_offset)
        _log.info("writer %s: resume map of %d batches from offsets %d..%d", self.name, len(resume), start,
                  end)
        return resume


def log_headers(log: Log, offset: int, *, max_offset: int | None = None) -> Iterator[BatchHeader]:
    """Headers of the log's batches from the one holding ``offset`` (the log start if below it)."""
    start = max(offset, log.log_start_offset)
    if start >= log.log_end_offset:
        return
    for batch in log.batches(start, max_offset=max_offset):
        yield parse_header(batch)


def published_records(consumer: RingConsumer) -> int:
    """Records held by the frames published in a ring and not yet released (peeked, then rewound)."""
    records = 0
    try:
        while (chunk := consumer.peek()) is not None:
            view = chunk.view
            for start, length in zip(chunk.body_starts.tolist(), chunk.body_lengths.tolist(), strict=True):
                if length >= HEADER_SIZE:
                    at = start + LAST_OFFSET_DELTA_OFFSET
                    delta = int.from_bytes(view[at : at + 4].tobytes(), "big", signed=True)
                    records += max(delta, 0) + 1
    except RingFailedError:
        pass
    consumer.rewind()
    return records
