"""Copying one Fetch answer into the follower log: its whole batches, checked, appended unchanged.

Theory of operation
-------------------
A Fetch answer arrives in pieces (``LeaderConnection.fetch`` hands each over while the rest is still
coming); :class:`AnswerCopier` appends each piece's whole batches to the follower log at the leader's offsets,
with the leader's epochs and bytes, before the next piece arrives.  One copier per answer
(``replicas.fetcher.PartitionFetcher`` makes it); it keeps how far the copy got (``fetch_offset``, the offset
after the last batch appended), the bytes appended, and why it stopped (``problem``).

Two ways through a piece:

* **walked** (:meth:`AnswerCopier._consume_walked`): a piece of many small batches (``_WALK_FROM_BATCHES``
  the size of its first) starting at our log end is walked by one ``storage.batch_scan.walk_batches`` call
  (magic, lengths, counts, offsets moving forward from our log end, up to ``_WALK_BATCHES`` batches a call,
  into arrays the fetcher allocates once: :func:`walk_arrays`), its CRCs checked in one loop
  (:func:`crc_mismatch`) and appended with one ``Log.append_walked_as_follower``;
* **checked** (:meth:`AnswerCopier._consume_checked`): batch by batch (:func:`whole_batches`: the hot-path
  ``check_batch``, then ``iter_batches`` where one is refused, which says why), batches we already hold
  skipped, the rest appended with one ``Log.append_as_follower``.  It takes whatever the walked way
  leaves, and every case that is not the plain one.

A partial batch at the end of an answer is normal: it is left for the next Fetch.  A corrupt batch stops the
copy after the whole batches before it; a batch across our log end (the logs diverged) stops it and asks
for a truncation first; a full disk stops it (the append that found no room appended nothing).

:func:`next_offset_after` reads only batch lengths and one header: where a Fetch sent ahead
(``replicas.fetcher``, "Fetching ahead") should start, before the answer is appended.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from typing import Final

import crc32c
import numpy as np
import numpy.typing as npt

from storage.batch_header import (
    ATTRIBUTES_OFFSET,
    BATCH_LENGTH_OFFSET,
    HEADER_SIZE,
    LOG_OVERHEAD,
    BatchHeader,
    check_batch,
    parse_header,
)
from storage.batch_reader import iter_batches
from storage.batch_scan import END, FULL, TRUNCATED, BatchArrays, walk_batches
from storage.errors import CorruptRecordError, InvalidRecordError, KafkaStorageError
from storage.log import Log

__all__ = ["AnswerCopier", "WalkArrays", "crc_mismatch", "next_offset_after", "walk_arrays", "whole_batches"]

_WALK_BATCHES: Final = 1024  # batches per walk_batches call while copying an answer
_WALK_FROM_BATCHES: Final = 100  # a piece that holds this many batches the size of its first is walked
_BATCH_LENGTH: Final = struct.Struct(">i")  # the batch length field (at BATCH_LENGTH_OFFSET): int32

# walk_batches' output (positions, sizes, base and last offsets, max timestamps, epochs, CRCs)
WalkArrays = tuple[npt.NDArray[np.int64], ...]


def walk_arrays() -> WalkArrays:
    """The arrays ``walk_batches`` fills, for one fetcher's copies (allocated once, reused by each)."""
    return tuple(np.empty(_WALK_BATCHES, dtype=np.int64) for _ in range(7))


class AnswerCopier:
    """Appends the whole batches of one Fetch answer to ``log``, piece by piece (see the module docstring).

    ``fetch_offset`` is the offset after the last batch appended; ``problem`` says why the copy stopped
    (and whether to truncate first), and the answer is then fetched again.
    """

    def __init__(self, log: Log, where: str, fetch_offset: int, arrays: WalkArrays,
                 on_log_end_offset: Callable[[int], None] | None) -> None:
        self.log = log
        self.where = where
        self.fetch_offset = fetch_offset
        self.appended_bytes = 0
        self.partial_tail_bytes = 0
        self.problem: tuple[str, bool] | None = None  # (reason, truncate again)
        self._walk_arrays = arrays  # walk_batches fills them: see walk_arrays()
        self._on_log_end_offset = on_log_end_offset

    def consume(self, records: memoryview, final: bool) -> int:
        if self.problem is not None:
            return 0
        size = len(records)
        first_bytes = size
        if size >= HEADER_SIZE:
            length = records[BATCH_LENGTH_OFFSET:LOG_OVERHEAD]
            first_bytes = int.from_bytes(length, "big", signed=True) + LOG_OVERHEAD
        # Many small batches (100 or more a piece: below 5 KB each in 512 KB pieces): one kernel walk and one
        # planned append cost far less than Python per batch.  Fewer, larger ones: the fixed cost of the
        # array calls does not pay off (docs/performance.md).
        used = self._consume_walked(records) if 0 < first_bytes * _WALK_FROM_BATCHES <= size else -1
        if used == len(records) or self.problem is not None:
            return used
        return self._consume_checked(records, final, max(used, 0))  # from the first batch not walked

    def _consume_walked(self, records: memoryview) -> int:
        """The plain case in few Python steps: whole batches from our log end on, walked by one kernel call
        (``walk_batches``: magic, lengths, counts, offsets moving forward from our log end), their CRCs
        checked in one loop, appended with one ``Log.append_walked_as_follower``.  Returns the bytes used
        (whole batches; a partial batch or a refused one at the end is left for :meth:`_consume_checked`,
        which says why), or -1 with nothing appended when the answer is not plain from its first batch on
        (batches we hold, a gap, a bad CRC...): then :meth:`_consume_checked` takes the whole piece."""
        log = self.log
        arrays = self._walk_arrays
        array = np.frombuffer(records, dtype=np.uint8)
        size = len(array)
        used = 0
        while True:
            fetch_offset = self.fetch_offset
            if fetch_offset != log.log_end_offset:
                return used if used else -1
            count, stop, code = walk_batches(array, used, size, fetch_offset, fetch_offset, *arrays)
            if count == 0 or (code != END and code != FULL and code != TRUNCATED):
                return used if used else -1
            positions = arrays[0][:count]
            sizes = arrays[1][:count]
            if crc_mismatch(records, positions.tolist(), sizes.tolist(), arrays[6][:count].tolist()):
                return used if used else -1
            batches = BatchArrays(positions - used if used else positions, sizes, arrays[2][:count],
                                  arrays[3][:count], arrays[4][:count], arrays[5][:count], arrays[6][:count])
            try:
                info = log.append_walked_as_follower(records[used:stop], batches)
            except InvalidRecordError as error:
                self.problem = (f"{error}; truncating again", True)
                return used
            except KafkaStorageError as error:  # a full disk: nothing appended; fetch again after a back-off
                self.problem = (str(error), False)
                return used
            self.appended_bytes += stop - used
            self.fetch_offset = info.last_offset + 1
            used = stop
            if self._on_log_end_offset is not None:
                self._on_log_end_offset(self.fetch_offset)
            if code != FULL or used == size:
                return used

    def _consume_checked(self, records: memoryview, final: bool, first: int = 0) -> int:
        """Batch by batch from position ``first`` (a header tuple per batch, one ``check_batch`` each):
        every case, said why when it is not the plain one."""
        log = self.log
        start = end = -1
        used = first
        headers = []
        try:
            for position, header in whole_batches(records, self.where, first):
                if header.base_offset + header.last_offset_delta < self.fetch_offset:
                    used = position + header.batch_length + LOG_OVERHEAD
                    continue  # a batch we already hold
                if (header.base_offset < self.fetch_offset and start < 0 and self.appended_bytes == 0
                        and log.log_start_offset == self.fetch_offset == log.log_end_offset):
                    # Our log is empty and starts inside this batch (we restarted at the leader's log start,
                    # which retention put mid-batch): start at the batch instead, as Kafka does.
                    log.truncate_fully_and_start_at(header.base_offset)
                    self.fetch_offset = header.base_offset
                if header.base_offset < self.fetch_offset:
                    self.problem = (f"{self.where}: batch at position {position} holds offsets "
                                    f"{header.base_offset}..{header.last_offset}, across our log end "
                                    f"{self.fetch_offset}: the logs diverged; truncating again", True)
                    return 0
                if start < 0:
                    start = position
                end = position + header.batch_length + LOG_OVERHEAD
                headers.append(header)
        except CorruptRecordError as error:
            corrupt: CorruptRecordError | None = error
        else:
            corrupt = None
        if start >= 0:
            try:
                info = log.append_as_follower(records[start:end], validated=headers)
            except InvalidRecordError as error:
                self.problem = (f"{error}; truncating again", True)
                return 0
            except KafkaStorageError as error:  # a full disk: nothing appended; fetch again after a back-off
                self.problem = (str(error), False)
                return 0
            self.appended_bytes += end - start
            self.fetch_offset = info.last_offset + 1
            used = end
            if self._on_log_end_offset is not None:
                self._on_log_end_offset(self.fetch_offset)
        if corrupt is not None:  # the whole batches before it are the leader's, at their offsets: kept
            done = ("was appended" if self.appended_bytes == 0
                    else f"from offset {self.fetch_offset} on was appended")
            self.problem = (f"{corrupt}; nothing of this answer {done}", False)
            return used
        if final:
            self.partial_tail_bytes = len(records) - used  # the whole batches were all used
        return used


def whole_batches(records: memoryview, where: str, position: int = 0) -> Iterator[tuple[int, BatchHeader]]:
    """``(position, header)`` of each whole batch in ``records``, magic, length and CRC checked: the hot path
    is ``check_batch`` (one unpack, one CRC call, no exception); at a batch it refuses, ``iter_batches``
    takes over, which raises :class:`CorruptRecordError` saying why, or stops quietly at a partial batch
    at the end (a Fetch answer may end in one)."""
    size = len(records)
    while position < size:
        header = check_batch(records, position, whole=False)
        if isinstance(header, int):
            yield from iter_batches(records, where=where, position=position, allow_truncated_tail=True)
            return
        yield position, header
        position += header.batch_length + LOG_OVERHEAD


def crc_mismatch(records: memoryview, positions: list[int], sizes: list[int], stored: list[int]) -> bool:
    """Whether any batch's stored CRC-32C differs from the one computed over its bytes."""
    checksum = crc32c.crc32c
    for position, size, crc in zip(positions, sizes, stored, strict=True):
        if checksum(records[position + ATTRIBUTES_OFFSET:position + size]) != crc:
            return True
    return False


def next_offset_after(records: memoryview, offset: int) -> int:
    """The offset after the last whole batch in ``records``, or ``offset`` if none ends past it: a walk of the
    batch lengths, then one header.  Nothing is checked here (the batches are, as they are appended): a length
    that cannot be a batch's ends the walk, and a Fetch sent ahead for a wrong offset is never used."""
    position, size, last = 0, len(records), -1
    unpack_length = _BATCH_LENGTH.unpack_from
    while size - position >= HEADER_SIZE:
        (length,) = unpack_length(records, position + BATCH_LENGTH_OFFSET)
        if not HEADER_SIZE <= length + LOG_OVERHEAD <= size - position:
            break
        last = position
        position += length + LOG_OVERHEAD
    if last < 0:
        return offset
    header = parse_header(records, last)
    return max(offset, header.base_offset + header.last_offset_delta + 1)
