"""Read Kafka RecordBatch v2 batches: walk a buffer batch by batch, iterate records, decode to arrays.

Theory of operation
-------------------
Three levels, each cheaper than the next is thorough:

1. :func:`iter_batches` walks consecutive batches in a buffer (a segment's bytes, a fetch response's
   records) reading 12 bytes per batch to find the next one, checking magic and length, and by default the
   CRC (``batch_header.validate_batch``).  It yields ``(position, BatchHeader)``.  A Kafka fetch response may
   end with a partial batch: with ``allow_truncated_tail=True`` the walk stops quietly there and says how many
   bytes were left (``truncated_tail_bytes``); otherwise a partial batch is an error.  A wrong magic, an
   impossible length or a bad CRC is always an error naming the position and offsets.
2. :func:`iter_records` decodes one batch's records lazily in plain Python into :class:`Record` tuples.
3. :func:`decode_batch` decodes every record of a batch at once with a numba kernel into arrays
   (:class:`DecodedBatch`): offsets, timestamps, and the positions and lengths of keys and values inside the
   (decompressed) records section.  No key or value is copied; this is the consumer's fast path.

Both record decoders check the same rules: every varint within its width (5 bytes for int32, 10 for int64);
every length >= -1 (``-1`` = null; header keys and counts >= 0); every field inside its record's declared
length and the record consuming exactly that length; exactly ``recordsCount`` records filling the records
section.  With timestamp type LogAppendTime every record's timestamp is the batch's ``maxTimestamp``.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

import numba
import numpy as np

from storage.batch_header import (
    BATCH_LENGTH_OFFSET,
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAGIC,
    MAGIC_OFFSET,
    BatchHeader,
    parse_header,
    validate_batch,
)
from storage.compression import DEFAULT_MAX_DECOMPRESSED_BYTES, decompress
from storage.errors import CorruptRecordError
from storage.varint import (
    VARINT_TOO_LONG,
    VARINT_TRUNCATED,
    decode_varint,
    parse_varint,
    read_varint,
    read_varlong,
)

__all__ = [
    "BAD_RECORD_CODES",
    "BatchIterator",
    "DecodedBatch",
    "Record",
    "RecordAccessors",
    "decode_batch",
    "decode_headers",
    "decode_records",
    "iter_batches",
    "iter_records",
    "records_data",
]

Bytes = bytes | bytearray | memoryview | mmap.mmap  # any byte buffer (pass a numpy array as array.data)


class Record(NamedTuple):
    """One record as a reader sees it; ``offset`` and ``timestamp`` (ms) are absolute."""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = ()


# ---------------------------------------------------------------------------------------------------------
# Level 1: batch by batch.


class BatchIterator:
    """Iterator of ``(position, BatchHeader)`` over consecutive batches in ``buf[position:end]``.

    After the loop ``position`` is the end of the last whole batch; when a truncated tail stopped the walk
    (``allow_truncated_tail=True``) ``truncated_tail_bytes`` is its size, else 0.  On an error ``position``
    is the offending batch's position, so a recovery can truncate there.
    """

    def __init__(
        self,
        buf: Bytes,
        *,
        where: str = "buffer",
        position: int = 0,
        end: int | None = None,
        verify_crc: bool = True,
        allow_truncated_tail: bool = False,
    ) -> None:
        self._view = memoryview(buf).cast("B") if end is None else memoryview(buf).cast("B")[:end]
        self.where = where
        self.position = position
        self.verify_crc = verify_crc
        self.allow_truncated_tail = allow_truncated_tail
        self.truncated_tail_bytes = 0

    def __iter__(self) -> BatchIterator:
        return self

    def __next__(self) -> tuple[int, BatchHeader]:
        view = self._view
        position = self.position
        remaining = len(view) - position
        if remaining <= 0:
            raise StopIteration
        if remaining >= MAGIC_OFFSET + 1 and view[position + MAGIC_OFFSET] != MAGIC:
            header_start = int.from_bytes(view[position : position + 8], "big", signed=True)
            raise CorruptRecordError(
                f"{self.where}: record batch at position {position} (base offset {header_start}): "
                f"magic {view[position + MAGIC_OFFSET]}, expected {MAGIC}"
            )
        if remaining >= LOG_OVERHEAD:
            batch_length = int.from_bytes(
                view[position + BATCH_LENGTH_OFFSET : position + LOG_OVERHEAD], "big", signed=True
            )
            size = batch_length + LOG_OVERHEAD
            if size < HEADER_SIZE:
                raise CorruptRecordError(
                    f"{self.where}: record batch at position {position}: batchLength {batch_length} "
                    f"gives {size} bytes, minimum {HEADER_SIZE}"
                )
        else:
            size = HEADER_SIZE
        if size > remaining:
            if self.allow_truncated_tail:
                self.truncated_tail_bytes = remaining
                raise StopIteration
            raise CorruptRecordError(
                f"{self.where}: truncated record batch at position {position}: {remaining} bytes left, "
                f"the batch needs {size}"
            )
        if self.verify_crc:
            header = validate_batch(view, position, where=self.where)
        else:
            header = parse_header(view, position)
            if header.last_offset_delta < 0 or header.records_count < 0:
                raise CorruptRecordError(
                    f"{self.where}: record batch at position {position} (base offset {header.base_offset}): "
                    f"lastOffsetDelta {header.last_offset_delta}, recordsCount {header.records_count}"
                )
        self.position = position + size
        return position, header


def iter_batches(
    buf: Bytes,
    *,
    where: str = "buffer",
    position: int = 0,
    end: int | None = None,
    verify_crc: bool = True,
    allow_truncated_tail: bool = False,
) -> BatchIterator:
    """Walk the batches of ``buf`` from ``position``; see :class:`BatchIterator`."""
    return BatchIterator(
        buf,
        where=where,
        position=position,
        end=end,
        verify_crc=verify_crc,
        allow_truncated_tail=allow_truncated_tail,
    )


def _context(where: str, position: int, header: BatchHeader) -> str:
    return (
        f"{where}: record batch at position {position} (offsets {header.base_offset}..{header.last_offset})"
    )


def _checked_header(buf: Bytes, position: int, where: str, verify_crc: bool) -> BatchHeader:
    iterator = BatchIterator(buf, where=where, position=position, verify_crc=verify_crc)
    try:
        return next(iterator)[1]
    except StopIteration:
        raise CorruptRecordError(f"{where}: no record batch at position {position}: buffer ends") from None


def records_data(
    buf: Bytes,
    position: int,
    header: BatchHeader,
    *,
    where: str = "buffer",
    max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES,
) -> np.ndarray:
    """The batch's records section as a read-only uint8 array: a view of ``buf`` when uncompressed, the
    decompressed bytes otherwise."""
    start = position + HEADER_SIZE
    end = position + header.size
    if header.compression == 0:
        data = np.frombuffer(buf, dtype=np.uint8, count=end - start, offset=start)
    else:
        plain = decompress(
            header.compression,
            memoryview(buf)[start:end],
            where=_context(where, position, header),
            max_bytes=max_decompressed_bytes,
        )
        data = np.frombuffer(plain, dtype=np.uint8)
    view = data.view()
    view.flags.writeable = False  # one kernel signature whatever the buffer
    return view


# ---------------------------------------------------------------------------------------------------------
# Level 2: records one by one, in Python.


def iter_records(
    buf: Bytes,
    position: int = 0,
    *,
    where: str = "buffer",
    verify_crc: bool = True,
    max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES,
) -> Iterator[Record]:
    """Validate the batch at ``position`` and yield its records lazily.

    Raises :class:`CorruptRecordError` naming ``where``, the batch position and offsets, the record index and
    the byte position, when the batch is invalid (possibly after yielding the records before the fault).
    """
    header = _checked_header(buf, position, where, verify_crc)
    data = records_data(buf, position, header, where=where, max_decompressed_bytes=max_decompressed_bytes)
    # Indexing bytes is faster than indexing a memoryview, by more than the copy costs (docs/storage.md).
    return _iter_records(data.tobytes(), position, header, where)


def _iter_records(view: bytes, position: int, header: BatchHeader, where: str) -> Iterator[Record]:
    """The Python twin of ``decode_records``: same checks, same codes, same error positions, but lazy."""
    end = len(view)
    log_append_time = header.timestamp_type == 1
    at = 0
    for index in range(header.records_count):
        try:
            if at >= end:
                raise _Malformed(MISSING_RECORDS, at)
            length, after = _varint(view, at, end)
            if length < 0:
                raise _Malformed(NEGATIVE_LENGTH, at)
            at = after
            record_end = at + length
            if record_end > end:
                raise _Malformed(RECORD_PAST_SECTION, at)
            if at >= record_end:
                raise _Malformed(PAST_RECORD_END, at)
            at += 1  # attributes: no bits defined
            timestamp_delta, at = _varint(view, at, record_end, wide=True)
            offset_delta, at = _varint(view, at, record_end)
            key, at = _nullable(view, at, record_end)
            value, at = _nullable(view, at, record_end)
            header_count, after = _varint(view, at, record_end)
            if header_count < 0:
                raise _Malformed(NEGATIVE_COUNT, at)
            at = after
            headers = []
            for _ in range(header_count):
                name_length, after = _varint(view, at, record_end)
                if name_length < 0:
                    raise _Malformed(NEGATIVE_LENGTH, at)
                if after + name_length > record_end:
                    raise _Malformed(PAST_RECORD_END, at)
                name = bytes(view[after : after + name_length]).decode("utf-8", "replace")
                header_value, at = _nullable(view, after + name_length, record_end)
                headers.append((name, header_value))
            if at != record_end:
                raise _Malformed(LENGTH_MISMATCH, at)
        except _Malformed as fault:
            raise CorruptRecordError(
                _record_error(where, position, header, fault.code, fault.at, index)
            ) from None
        timestamp = header.max_timestamp if log_append_time else header.base_timestamp + timestamp_delta
        yield Record(header.base_offset + offset_delta, timestamp, key, value, tuple(headers))
    if at != end:
        raise CorruptRecordError(
            _record_error(where, position, header, TRAILING_BYTES, at, header.records_count)
        )


class _Malformed(Exception):
    def __init__(self, code: int, at: int) -> None:
        super().__init__(code, at)
        self.code = code
        self.at = at


def _varint(view: bytes | memoryview, at: int, limit: int, wide: bool = False) -> tuple[int, int]:
    value, after = parse_varint(view, at, limit, wide)
    if after < 0:
        raise _Malformed(after, at)
    return value, after


def _nullable(view: bytes | memoryview, at: int, limit: int) -> tuple[bytes | None, int]:
    length, after = _varint(view, at, limit)
    if length < -1:
        raise _Malformed(NEGATIVE_LENGTH, at)
    if length == -1:
        return None, after
    if after + length > limit:
        raise _Malformed(PAST_RECORD_END, at)
    return bytes(view[after : after + length]), after + length


# ---------------------------------------------------------------------------------------------------------
# Level 3: a whole batch into arrays, with numba.

# Named negative codes of decode_records (also used by the Python decoder above).
TRUNCATED = VARINT_TRUNCATED  # a varint runs past its record
# VARINT_TOO_LONG (from storage.varint): a varint longer than its type allows
NEGATIVE_LENGTH = -3  # a length below -1 (or below 0 where null is not allowed)
PAST_RECORD_END = -4  # a key, value or header runs past its record's declared length
RECORD_PAST_SECTION = -5  # a record's declared length runs past the records section: truncated records
LENGTH_MISMATCH = -6  # a record's fields end before its declared length
TRAILING_BYTES = -7  # bytes left after recordsCount records
MISSING_RECORDS = -8  # the records section ends before recordsCount records
NEGATIVE_COUNT = -9  # a negative header count

assert (TRUNCATED, VARINT_TOO_LONG) == (-1, -2)

_MESSAGES = {
    TRUNCATED: "a varint runs past the end of its record",
    VARINT_TOO_LONG: "a varint is longer than its type allows (5 bytes int32, 10 bytes int64)",
    NEGATIVE_LENGTH: "negative length (only -1, null, is allowed, and not for a record or header name)",
    PAST_RECORD_END: "a field runs past the record's declared length",
    RECORD_PAST_SECTION: "the record's declared length runs past the end of the records: truncated records",
    LENGTH_MISMATCH: "the record's fields end before its declared length",
    TRAILING_BYTES: "bytes left over after the last record: recordsCount is smaller than the data",
    MISSING_RECORDS: "the records end before recordsCount records: recordsCount is larger than the data",
    NEGATIVE_COUNT: "negative header count",
}


BAD_RECORD_CODES = tuple(sorted(_MESSAGES))


def _record_error(where: str, position: int, header: BatchHeader, code: int, at: int, index: int) -> str:
    """The message for a record-level fault: batch, record index, byte position (absolute in the buffer
    when the batch is uncompressed), and what is wrong."""
    if header.compression:
        located = f"byte {at} of the decompressed records"
    else:
        located = f"position {position + HEADER_SIZE + at}"
    what = _MESSAGES.get(code, f"error code {code}")
    return (
        f"{_context(where, position, header)}: record {index} of {header.records_count} at {located}: {what}"
    )


@numba.njit(cache=True, inline="always")
def _skip_nullable(data: np.ndarray, at: int, limit: int) -> tuple[int, int, int]:
    """(position of the bytes, length (-1 = null), next position) or (error position, 0, negative code)."""
    length, after = read_varint(data, at, limit)
    if after < 0:
        return at, 0, after
    if length < -1:
        return at, 0, NEGATIVE_LENGTH
    if length == -1:
        return after, -1, after
    if after + length > limit:
        return at, 0, PAST_RECORD_END
    return after, length, after + length


@numba.njit(cache=True)
def decode_records(
    data: np.ndarray,
    count: int,
    base_offset: int,
    base_timestamp: int,
    log_append_time: bool,
    max_timestamp: int,
    offsets: np.ndarray,
    timestamps: np.ndarray,
    key_positions: np.ndarray,
    key_lengths: np.ndarray,
    value_positions: np.ndarray,
    value_lengths: np.ndarray,
    header_positions: np.ndarray,
    header_counts: np.ndarray,
) -> tuple[int, int, int]:
    """Decode ``count`` records from ``data`` into the output arrays: ``(code, error position, record)``.

    ``data`` is a batch's records section; each output array holds at least ``count`` entries.  ``code`` is 0
    on success, else one of :data:`BAD_RECORD_CODES`; positions index ``data``.
    """
    end = data.size
    at = 0
    for i in range(count):
        if at >= end:
            return MISSING_RECORDS, at, i
        length, after = read_varint(data, at, end)
        if after < 0:
            return after, at, i
        if length < 0:
            return NEGATIVE_LENGTH, at, i
        at = after
        record_end = at + length
        if record_end > end:
            return RECORD_PAST_SECTION, at, i
        if at >= record_end:
            return PAST_RECORD_END, at, i
        at += 1  # attributes: no bits defined
        delta, after = read_varlong(data, at, record_end)
        if after < 0:
            return after, at, i
        at = after
        offset_delta, after = read_varint(data, at, record_end)
        if after < 0:
            return after, at, i
        at = after
        position, length, after = _skip_nullable(data, at, record_end)
        if after < 0:
            return after, position, i
        key_positions[i] = position
        key_lengths[i] = length
        at = after
        position, length, after = _skip_nullable(data, at, record_end)
        if after < 0:
            return after, position, i
        value_positions[i] = position
        value_lengths[i] = length
        at = after
        header_count, after = read_varint(data, at, record_end)
        if after < 0:
            return after, at, i
        if header_count < 0:
            return NEGATIVE_COUNT, at, i
        at = after
        header_positions[i] = at
        header_counts[i] = header_count
        for _ in range(header_count):
            name_length, after = read_varint(data, at, record_end)
            if after < 0:
                return after, at, i
            if name_length < 0:
                return NEGATIVE_LENGTH, at, i
            if after + name_length > record_end:
                return PAST_RECORD_END, at, i
            at = after + name_length
            position, length, after = _skip_nullable(data, at, record_end)
            if after < 0:
                return after, position, i
            at = after
        if at != record_end:
            return LENGTH_MISMATCH, at, i
        offsets[i] = base_offset + offset_delta
        timestamps[i] = max_timestamp if log_append_time else base_timestamp + delta
    if at != end:
        return TRAILING_BYTES, at, count
    return 0, at, count


def decode_headers(view: memoryview, at: int, count: int) -> tuple[tuple[str, bytes | None], ...]:
    """``count`` headers at ``at`` that the record kernel already validated: name length, name, value length,
    value (-1 = null)."""
    pairs: list[tuple[str, bytes | None]] = []
    for _ in range(count):
        name_length, at = decode_varint(view, at)
        name = bytes(view[at : at + name_length]).decode("utf-8", "replace")
        at += name_length
        value_length, at = decode_varint(view, at)
        if value_length < 0:
            pairs.append((name, None))
        else:
            pairs.append((name, bytes(view[at : at + value_length])))
            at += value_length
    return tuple(pairs)


class RecordAccessors:
    """Per-record access to records decoded into arrays, written once for every such class
    (:class:`DecodedBatch` here, the consumer's ``RecordArrays``): they hold ``data`` and the position and
    length arrays named below, and inherit ``key``, ``value`` and ``headers`` from here."""

    __slots__ = ()
    data: np.ndarray  # uint8
    key_positions: np.ndarray  # int64, into data
    key_lengths: np.ndarray  # int32, -1 = null
    value_positions: np.ndarray  # int64
    value_lengths: np.ndarray  # int32, -1 = null
    header_positions: np.ndarray  # int64
    header_counts: np.ndarray  # int32

    def key(self, index: int) -> bytes | None:
        length = int(self.key_lengths[index])
        start = int(self.key_positions[index])
        return None if length < 0 else self.data[start : start + length].tobytes()

    def value(self, index: int) -> bytes | None:
        length = int(self.value_lengths[index])
        start = int(self.value_positions[index])
        return None if length < 0 else self.data[start : start + length].tobytes()

    def headers(self, index: int) -> tuple[tuple[str, bytes | None], ...]:
        count = int(self.header_counts[index])
        if count == 0:
            return ()
        return decode_headers(self.data.data, int(self.header_positions[index]), count)


@dataclass(frozen=True, slots=True)
class DecodedBatch(RecordAccessors):
    """A batch decoded into arrays.  Record ``i`` has offset ``offsets[i]``, timestamp ``timestamps[i]``, key
    ``data[key_positions[i]:][:key_lengths[i]]`` (null when the length is -1), value likewise, and
    ``header_counts[i]`` headers starting at ``data[header_positions[i]]`` (decoded by :meth:`headers`).

    ``data`` is the records section: a read-only view of the caller's buffer when the batch is uncompressed
    (keep that buffer alive and unchanged), the decompressed bytes otherwise.
    """

    position: int  # of the batch in the buffer it was decoded from
    header: BatchHeader
    data: np.ndarray  # uint8
    offsets: np.ndarray  # int64
    timestamps: np.ndarray  # int64 ms
    key_positions: np.ndarray  # int64, into data
    key_lengths: np.ndarray  # int32, -1 = null
    value_positions: np.ndarray  # int64
    value_lengths: np.ndarray  # int32, -1 = null
    header_positions: np.ndarray  # int64
    header_counts: np.ndarray  # int32

    def __len__(self) -> int:
        return len(self.offsets)

    def record(self, index: int) -> Record:
        return Record(
            int(self.offsets[index]),
            int(self.timestamps[index]),
            self.key(index),
            self.value(index),
            self.headers(index),
        )

    def records(self) -> Iterator[Record]:
        return (self.record(index) for index in range(len(self)))


def decode_batch(
    buf: Bytes,
    position: int = 0,
    *,
    where: str = "buffer",
    verify_crc: bool = True,
    max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES,
) -> DecodedBatch:
    """Validate the batch at ``position`` and decode all its records into arrays (see :class:`DecodedBatch`).

    Raises :class:`CorruptRecordError` naming ``where``, the batch position and offsets, the record index and
    the byte position when anything in the batch is malformed.
    """
    header = _checked_header(buf, position, where, verify_crc)
    data = records_data(buf, position, header, where=where, max_decompressed_bytes=max_decompressed_bytes)
    count = header.records_count
    # Every record takes at least 2 bytes, so a hostile count fails inside the data: size the arrays by it.
    slots = min(count, data.size)
    offsets = np.empty(slots, dtype=np.int64)
    timestamps = np.empty(slots, dtype=np.int64)
    key_positions = np.empty(slots, dtype=np.int64)
    key_lengths = np.empty(slots, dtype=np.int32)
    value_positions = np.empty(slots, dtype=np.int64)
    value_lengths = np.empty(slots, dtype=np.int32)
    header_positions = np.empty(slots, dtype=np.int64)
    header_counts = np.empty(slots, dtype=np.int32)
    code, at, index = decode_records(
        data,
        count,
        header.base_offset,
        header.base_timestamp,
        header.timestamp_type == 1,
        header.max_timestamp,
        offsets,
        timestamps,
        key_positions,
        key_lengths,
        value_positions,
        value_lengths,
        header_positions,
        header_counts,
    )
    if code != 0:
        raise CorruptRecordError(_record_error(where, position, header, code, at, index))
    return DecodedBatch(
        position,
        header,
        data,
        offsets,
        timestamps,
        key_positions,
        key_lengths,
        value_positions,
        value_lengths,
        header_positions,
        header_counts,
    )
