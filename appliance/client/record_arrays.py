"""What a consumer gets: record batches decoded into arrays, many batches per numba call, and records on top.

Theory of operation
-------------------
Both consumer paths end with a run of whole RecordBatch v2 batches in a buffer: a read-only memory map of a
segment file (local path) or the ``records`` bytes of a Fetch response (remote path).  :func:`decode_run`
turns such a run into :class:`RecordArrays` in three steps, so that the per-batch Python work is a few
hundred nanoseconds and the per-record work happens inside numba:

1. :func:`_scan_batches` (numba) walks the batch headers from a position and fills a *batch table* (one
   ``int64`` row per batch: position, size, offsets, count, attributes, CRC, timestamps; columns named by the
   ``COL_*`` constants).  It stops cleanly at the end of the buffer, at a batch whose last offset reaches
   ``max_offset`` (the high watermark: nothing at or above it is returned), after ``max_bytes``, or at a
   partial batch (a Fetch response may end with one; a segment file does while its writer appends).  It
   returns a named negative code for bytes that cannot be a batch (magic, length, offsets going backwards).
2. In Python, the CRC-32C of every batch is checked (``check.crcs``; the ``crc32c`` package runs at memory
   speed), then consecutive uncompressed batches are grouped into one *chunk*.
3. :func:`_decode_run` (numba) decodes every record of a chunk into one set of arrays, batch after batch,
   with storage's own record kernel (``storage.batch_reader``), and rebases key/value/header positions so
   they index the whole buffer.  **No key or value is copied**: ``RecordArrays.data`` *is* the buffer.
   A compressed batch becomes a chunk of its own over its decompressed bytes (``storage.batch_reader.
   decode_batch``, every codec of ``storage.compression``).  Control batches (transaction markers) are
   skipped, as Kafka's consumers skip them.  A batch whose records do not decode -- compressed data that is
   not valid for its codec, a malformed record -- is never skipped and never an empty result: the run ends
   before it, and a run that starts at it raises naming the partition, the batch's offsets and the reason.

Records below ``min_offset`` (a position inside a batch: Kafka always hands out whole batches) are sliced
off, which costs nothing (array views).  :meth:`RecordArrays.records` builds :class:`ConsumerRecord` tuples
for the per-record API; it copies the chunk's bytes once and slices ``bytes`` from that copy.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from itertools import repeat
from typing import Final, NamedTuple

import numba
import numpy as np

from storage.batch_header import (
    ATTRIBUTES_OFFSET,
    BASE_OFFSET_OFFSET,
    BASE_TIMESTAMP_OFFSET,
    BATCH_LENGTH_OFFSET,
    COMPRESSION_CODEC_MASK,
    CONTROL_FLAG_MASK,
    CRC_OFFSET,
    HEADER_SIZE,
    LAST_OFFSET_DELTA_OFFSET,
    LOG_OVERHEAD,
    MAGIC,
    MAGIC_OFFSET,
    MAX_TIMESTAMP_OFFSET,
    PARTITION_LEADER_EPOCH_OFFSET,
    RECORDS_COUNT_OFFSET,
    TIMESTAMP_TYPE_MASK,
    compute_crc,
)
from storage.batch_reader import RecordAccessors, decode_batch, decode_headers, decode_records
from storage.compression import DEFAULT_MAX_DECOMPRESSED_BYTES
from storage.errors import CorruptRecordError

__all__ = [
    "BAD_LENGTH",
    "BAD_MAGIC",
    "BAD_OFFSETS",
    "STOP_END",
    "STOP_MAX_BYTES",
    "STOP_MAX_OFFSET",
    "STOP_TABLE_FULL",
    "STOP_TRUNCATED",
    "STOP_UNDECODABLE",
    "ConsumerRecord",
    "DecodedRun",
    "RecordArrays",
    "decode_run",
    "scan_batches",
]


class ConsumerRecord(NamedTuple):
    """One record as ``Consumer.poll`` returns it (field names as in Kafka's ConsumerRecord)."""

    topic: str
    partition: int
    offset: int
    timestamp: int  # ms
    timestamp_type: int  # 0 CreateTime, 1 LogAppendTime
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]


# ---------------------------------------------------------------------------------------------------------
# Step 1: the batch table.

# Columns of the batch table (int64 rows), one per batch header field a consumer needs.
COL_POSITION: Final = 0  # byte index of the batch in the buffer
COL_SIZE: Final = 1  # whole batch, LOG_OVERHEAD included
COL_BASE_OFFSET: Final = 2
COL_LAST_OFFSET: Final = 3
COL_RECORDS_COUNT: Final = 4
COL_ATTRIBUTES: Final = 5
COL_CRC: Final = 6  # as stored (uint32)
COL_BASE_TIMESTAMP: Final = 7
COL_MAX_TIMESTAMP: Final = 8
COL_LEADER_EPOCH: Final = 9
TABLE_COLUMNS: Final = 10

# Why _scan_batches stopped (>= 0), or what is wrong with the bytes (< 0).
STOP_END: Final = 0  # the buffer ends exactly after the last batch
STOP_MAX_OFFSET: Final = 1  # the next batch reaches max_offset (the high watermark)
STOP_MAX_BYTES: Final = 2  # the next batch would pass max_bytes
STOP_TABLE_FULL: Final = 3  # the table has no more rows
STOP_TRUNCATED: Final = 4  # the buffer ends inside the next batch (a partial trailing batch)
STOP_UNDECODABLE: Final = 5  # the next batch's records do not decode (decode_run: the next read raises)
BAD_MAGIC: Final = -1  # magic is not 2
BAD_LENGTH: Final = -2  # batchLength below a header, negative lastOffsetDelta/recordsCount, or a record
#                         count an uncompressed batch cannot hold
BAD_OFFSETS: Final = -3  # a batch starts below the end of the one before it: offsets go backwards

_SCAN_MESSAGES: Final = {
    BAD_MAGIC: "magic is not 2",
    BAD_LENGTH: "impossible batchLength, lastOffsetDelta or recordsCount",
    BAD_OFFSETS: "base offset below the previous batch's last offset: offsets go backwards",
}
_MIN_RECORD_BYTES: Final = 7  # length, attributes, timestampDelta, offsetDelta, key, value, header count


@numba.njit(cache=True, inline="always")
def _be16(buf: np.ndarray, at: int) -> int:
    """Unsigned big-endian 16 bits (attributes: only the low bits are defined)."""
    return int((np.int64(buf[at]) << 8) | np.int64(buf[at + 1]))


@numba.njit(cache=True, inline="always")
def _be32(buf: np.ndarray, at: int) -> int:
    value = (np.int64(buf[at]) << 24) | (np.int64(buf[at + 1]) << 16) | (np.int64(buf[at + 2]) << 8)
    value |= np.int64(buf[at + 3])
    return int(value - (np.int64(1) << 32) if value >= (np.int64(1) << 31) else value)


@numba.njit(cache=True, inline="always")
def _be64(buf: np.ndarray, at: int) -> int:
    high = _be32(buf, at)
    low = _be32(buf, at + 4) & 0xFFFFFFFF
    return (high << 32) | low


@numba.njit(cache=True)
def _scan_batches(
    buf: np.ndarray, position: int, end: int, max_offset: int, max_bytes: int, table: np.ndarray
) -> tuple[int, int, int]:
    """Walk whole batches of ``buf[position:end]`` into ``table``: ``(rows, stop position, code)``.

    ``code`` is a STOP_* reason (>= 0) or a BAD_* code (< 0; then ``stop position`` is the bad batch's).
    The first batch is taken whatever its size (as Kafka does); later ones only within ``max_bytes``.  Once
    the batches read reach ``max_offset`` the walk stops without reading further: bytes past the high
    watermark may be a batch being written.
    """
    start = position
    rows = 0
    previous_end: int = -(1 << 62)
    while rows < table.shape[0]:
        remaining = end - position
        if remaining <= 0:
            return rows, position, STOP_END
        if rows > 0 and previous_end >= max_offset:
            # Not one byte past the high watermark is looked at: the writer may be writing the next batch
            # right now, and a header read mid-copy is torn.  (The first batch is below it: the caller's.)
            return rows, position, STOP_MAX_OFFSET
        if remaining < HEADER_SIZE:
            return rows, position, STOP_TRUNCATED
        size = _be32(buf, position + BATCH_LENGTH_OFFSET) + LOG_OVERHEAD
        if size < HEADER_SIZE:
            return rows, position, BAD_LENGTH
        if buf[position + MAGIC_OFFSET] != MAGIC:
            return rows, position, BAD_MAGIC
        base_offset = _be64(buf, position + BASE_OFFSET_OFFSET)
        delta = _be32(buf, position + LAST_OFFSET_DELTA_OFFSET)
        count = _be32(buf, position + RECORDS_COUNT_OFFSET)
        attributes = _be16(buf, position + ATTRIBUTES_OFFSET)
        if delta < 0 or count < 0:
            return rows, position, BAD_LENGTH
        if attributes & COMPRESSION_CODEC_MASK == 0 and count * _MIN_RECORD_BYTES > size - HEADER_SIZE:
            return rows, position, BAD_LENGTH
        if base_offset < previous_end:
            return rows, position, BAD_OFFSETS
        last_offset = base_offset + delta
        if last_offset >= max_offset:
            return rows, position, STOP_MAX_OFFSET
        if size > remaining:
            return rows, position, STOP_TRUNCATED
        if rows > 0 and position + size - start > max_bytes:
            return rows, position, STOP_MAX_BYTES
        row = table[rows]
        row[COL_POSITION] = position
        row[COL_SIZE] = size
        row[COL_BASE_OFFSET] = base_offset
        row[COL_LAST_OFFSET] = last_offset
        row[COL_RECORDS_COUNT] = count
        row[COL_ATTRIBUTES] = attributes
        row[COL_CRC] = _be32(buf, position + CRC_OFFSET) & 0xFFFFFFFF
        row[COL_BASE_TIMESTAMP] = _be64(buf, position + BASE_TIMESTAMP_OFFSET)
        row[COL_MAX_TIMESTAMP] = _be64(buf, position + MAX_TIMESTAMP_OFFSET)
        row[COL_LEADER_EPOCH] = _be32(buf, position + PARTITION_LEADER_EPOCH_OFFSET)
        previous_end = last_offset + 1
        position += size
        rows += 1
    return rows, position, STOP_TABLE_FULL



class ScanResult(NamedTuple):
    table: np.ndarray  # int64 rows x TABLE_COLUMNS, only the scanned rows
    stop_position: int
    code: int


def scan_batches(
    buf: np.ndarray, position: int, end: int, *, max_offset: int, max_bytes: int, max_batches: int = 4096
) -> ScanResult:
    """Python face of :func:`_scan_batches` (it allocates the table)."""
    table = np.empty((max_batches, TABLE_COLUMNS), dtype=np.int64)
    rows, stop, code = _scan_batches(buf, position, end, max_offset, max_bytes, table)
    return ScanResult(table[:rows], stop, code)


# ---------------------------------------------------------------------------------------------------------
# Step 3: a chunk of uncompressed batches into one set of arrays.


@numba.njit(cache=True)
def _decode_run(
    buf: np.ndarray,
    table: np.ndarray,
    first_row: int,
    end_row: int,
    offsets: np.ndarray,
    timestamps: np.ndarray,
    timestamp_types: np.ndarray,
    key_positions: np.ndarray,
    key_lengths: np.ndarray,
    value_positions: np.ndarray,
    value_lengths: np.ndarray,
    header_positions: np.ndarray,
    header_counts: np.ndarray,
) -> tuple[int, int, int, int]:
    """Decode the records of table rows ``[first_row, end_row)`` (uncompressed batches of ``buf``) into the
    output arrays, positions indexing ``buf``.  ``(code, row, record index, byte position)``; code 0 = ok,
    else one of storage.batch_reader's record codes for that row's batch."""
    at = 0
    for row in range(first_row, end_row):
        start = table[row, COL_POSITION] + HEADER_SIZE
        stop = table[row, COL_POSITION] + table[row, COL_SIZE]
        count = table[row, COL_RECORDS_COUNT]
        attributes = table[row, COL_ATTRIBUTES]
        log_append_time = attributes & TIMESTAMP_TYPE_MASK != 0
        code, where, index = decode_records(
            buf[start:stop],
            count,
            table[row, COL_BASE_OFFSET],
            table[row, COL_BASE_TIMESTAMP],
            log_append_time,
            table[row, COL_MAX_TIMESTAMP],
            offsets[at : at + count],
            timestamps[at : at + count],
            key_positions[at : at + count],
            key_lengths[at : at + count],
            value_positions[at : at + count],
            value_lengths[at : at + count],
            header_positions[at : at + count],
            header_counts[at : at + count],
        )
        if code != 0:
            return code, row, index, start + where
        for i in range(at, at + count):
            key_positions[i] += start
            value_positions[i] += start
            header_positions[i] += start
            timestamp_types[i] = 1 if log_append_time else 0
        at += count
    return 0, end_row, 0, 0


@dataclass(frozen=True, slots=True)
class RecordArrays(RecordAccessors):
    """Records of one partition decoded into arrays.  Record ``i`` has offset ``offsets[i]``, timestamp
    ``timestamps[i]`` (ms), key ``data[key_positions[i]:][:key_lengths[i]]`` (null when the length is -1),
    value likewise, and ``header_counts[i]`` headers encoded from ``data[header_positions[i]]``.

    ``data`` is the buffer itself -- a read-only view of the segment's memory map (local path), of the Fetch
    response (remote path), or the decompressed records of a compressed batch -- so holding a RecordArrays
    keeps that buffer alive.  Offsets increase; they are dense unless the log was compacted.
    """

    topic: str
    partition: int
    data: np.ndarray  # uint8
    offsets: np.ndarray  # int64
    timestamps: np.ndarray  # int64 ms
    timestamp_types: np.ndarray  # int8: 0 CreateTime, 1 LogAppendTime
    key_positions: np.ndarray  # int64, into data
    key_lengths: np.ndarray  # int32, -1 = null
    value_positions: np.ndarray  # int64, into data
    value_lengths: np.ndarray  # int32, -1 = null
    header_positions: np.ndarray  # int64, into data
    header_counts: np.ndarray  # int32

    def __len__(self) -> int:
        return len(self.offsets)

    @property
    def next_offset(self) -> int:
        """The offset after the last record here."""
        return int(self.offsets[-1]) + 1 if len(self.offsets) else -1

    def record(self, index: int) -> ConsumerRecord:
        return ConsumerRecord(
            self.topic,
            self.partition,
            int(self.offsets[index]),
            int(self.timestamps[index]),
            int(self.timestamp_types[index]),
            self.key(index),
            self.value(index),
            self.headers(index),
        )

    def slice(self, start: int, stop: int | None = None) -> RecordArrays:
        """Records ``[start, stop)`` as views (nothing copied)."""
        s = slice(start, stop)
        return RecordArrays(
            self.topic,
            self.partition,
            self.data,
            self.offsets[s],
            self.timestamps[s],
            self.timestamp_types[s],
            self.key_positions[s],
            self.key_lengths[s],
            self.value_positions[s],
            self.value_lengths[s],
            self.header_positions[s],
            self.header_counts[s],
        )

    def values(self) -> list[bytes | None]:
        """Every value as bytes (one copy of the span, then slices)."""
        base, blob = self._blob()
        return _slices(blob, self.value_positions, self.value_lengths, base)

    def keys(self) -> list[bytes | None]:
        base, blob = self._blob()
        return _slices(blob, self.key_positions, self.key_lengths, base)

    def records(self) -> list[ConsumerRecord]:
        """Every record as a :class:`ConsumerRecord` (the per-record API; a few hundred ns each)."""
        count = len(self.offsets)
        if count == 0:
            return []
        base, blob = self._blob()
        keys = _slices(blob, self.key_positions, self.key_lengths, base)
        values = _slices(blob, self.value_positions, self.value_lengths, base)
        if self.header_counts.any():
            view = self.data.data
            headers: Iterator[tuple[tuple[str, bytes | None], ...]] | list[
                tuple[tuple[str, bytes | None], ...]
            ] = [
                () if n == 0 else decode_headers(view, p, n)
                for p, n in zip(self.header_positions.tolist(), self.header_counts.tolist(), strict=True)
            ]
        else:
            headers = repeat((), count)
        types = self.timestamp_types
        type_list: list[int] | Iterator[int] = (
            repeat(int(types[0]), count) if not types.any() or types.all() else types.tolist()
        )
        make = ConsumerRecord._make
        return list(
            map(
                make,
                zip(
                    repeat(self.topic, count),
                    repeat(self.partition, count),
                    self.offsets.tolist(),
                    self.timestamps.tolist(),
                    type_list,
                    keys,
                    values,
                    headers,
                    strict=True,
                ),
            )
        )

    def _blob(self) -> tuple[int, bytes]:
        """The bytes every key and value lies in, copied once: ``(start position, bytes)``."""
        if len(self.offsets) == 0:
            return 0, b""
        lo = int(min(self.key_positions.min(), self.value_positions.min()))
        hi = int(max((self.key_positions + np.maximum(self.key_lengths, 0)).max(),
                     (self.value_positions + np.maximum(self.value_lengths, 0)).max()))
        return lo, self.data[lo:hi].tobytes()


def _slices(blob: bytes, positions: np.ndarray, lengths: np.ndarray, base: int) -> list[bytes | None]:
    if len(lengths) and lengths.max() < 0:
        return [None] * len(lengths)  # all null (keys, usually)
    starts = (positions - base).tolist()
    if lengths.min(initial=0) >= 0:
        ends = (positions - base + lengths).tolist()
        return [blob[s:e] for s, e in zip(starts, ends, strict=True)]
    return [None if n < 0 else blob[s : s + n] for s, n in zip(starts, lengths.tolist(), strict=True)]


# ---------------------------------------------------------------------------------------------------------
# The whole thing.


class DecodedRun(NamedTuple):
    chunks: list[RecordArrays]  # in offset order; never empty chunks
    next_offset: int  # after the last batch scanned (control batches included); -1 if none
    stop_position: int  # byte position after the last batch scanned
    stop_code: int  # STOP_* (why the scan ended)
    batch_count: int
    size_bytes: int  # bytes of whole batches scanned


def decode_run(
    buf: np.ndarray,
    position: int,
    end: int,
    *,
    topic: str,
    partition: int,
    min_offset: int,
    max_offset: int,
    max_bytes: int,
    check_crcs: bool = True,
    where: str = "buffer",
    max_batches: int = 4096,
    max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES,
) -> DecodedRun:
    """Decode the whole batches of ``buf[position:end]`` (uint8 array) with last offset below ``max_offset``,
    at most ``max_bytes`` of them (but at least one), dropping records below ``min_offset``.

    Raises :class:`CorruptRecordError` naming ``where``, the byte position and the offsets for bytes that
    are not valid batches (bad magic, length, CRC), and for records that do not decode (compressed data
    that is not valid for its codec, a malformed record) when they are in the first batch: then the message
    says which offset to seek to.  Records that do not decode in a later batch end the run before it
    (``stop_code`` :data:`STOP_UNDECODABLE`), so the records before it are delivered and the next read,
    starting at it, raises: as Kafka's consumer returns the records before a corrupt batch and then fails.
    A partial trailing batch is not an error: ``stop_code`` is then :data:`STOP_TRUNCATED` and
    ``stop_position`` where it starts.
    """
    table = np.empty((max_batches, TABLE_COLUMNS), dtype=np.int64)
    rows, stop, code = _scan_batches(buf, position, end, max_offset, max_bytes, table)
    if code < 0:
        base = int.from_bytes(buf[stop : stop + 8].tobytes(), "big", signed=True) if end - stop >= 8 else -1
        raise CorruptRecordError(
            f"{where}: record batch at position {stop} (base offset {base}): {_SCAN_MESSAGES[code]}"
        )
    table = table[:rows]
    if check_crcs:
        _check_crcs(buf, table, where)
    chunks: list[RecordArrays] = []
    row = 0
    while row < rows:
        attributes = int(table[row, COL_ATTRIBUTES])
        if attributes & CONTROL_FLAG_MASK:
            row += 1
            continue
        end_row = row + 1
        try:
            if attributes & COMPRESSION_CODEC_MASK:
                chunk = _decode_compressed(buf, table, row, topic, partition, where, max_decompressed_bytes)
            else:
                while end_row < rows and not int(table[end_row, COL_ATTRIBUTES]) & (
                    COMPRESSION_CODEC_MASK | CONTROL_FLAG_MASK
                ):
                    end_row += 1
                chunk = _decode_plain(buf, table, row, end_row, topic, partition, where)
        except CorruptRecordError as exc:
            bad = _first_undecodable(buf, table, row, end_row, where, max_decompressed_bytes)
            if bad > row:  # the plain batches before it in this chunk are sound
                _keep(chunks, _decode_plain(buf, table, row, bad, topic, partition, where), min_offset)
            if bad > 0:  # what precedes the bad batch now; the read that starts at it raises
                return _run_before(chunks, table, bad, position, STOP_UNDECODABLE)
            skip_to = int(table[bad, COL_LAST_OFFSET]) + 1
            raise CorruptRecordError(f"{exc}; the records cannot be read: seek to offset {skip_to} to skip "
                                     f"this batch") from None
        row = end_row
        _keep(chunks, chunk, min_offset)
    next_offset = int(table[rows - 1, COL_LAST_OFFSET]) + 1 if rows else -1
    return DecodedRun(chunks, next_offset, stop, code, rows, stop - position)


def _keep(chunks: list[RecordArrays], chunk: RecordArrays, min_offset: int) -> None:
    """Append ``chunk`` without its records below ``min_offset`` (views), unless nothing is left."""
    if len(chunk) and int(chunk.offsets[-1]) >= min_offset:
        if int(chunk.offsets[0]) < min_offset:
            chunk = chunk.slice(int(np.searchsorted(chunk.offsets, min_offset)))
        chunks.append(chunk)


def _first_undecodable(buf: np.ndarray, table: np.ndarray, row: int, end_row: int, where: str,
                       max_decompressed_bytes: int) -> int:
    """The first table row in ``[row, end_row)`` whose records do not decode (the cold path of an error)."""
    for bad in range(row, end_row - 1):
        try:
            decode_batch(buf.data, int(table[bad, COL_POSITION]), where=where, verify_crc=False,
                         max_decompressed_bytes=max_decompressed_bytes)
        except CorruptRecordError:
            return bad
    return end_row - 1


def _run_before(chunks: list[RecordArrays], table: np.ndarray, row: int, position: int,
                code: int) -> DecodedRun:
    """The run cut before table row ``row``: its batches are read again (from there) by the next read."""
    stop = int(table[row, COL_POSITION])
    return DecodedRun(chunks, int(table[row, COL_BASE_OFFSET]), stop, code, row, stop - position)


def _check_crcs(buf: np.ndarray, table: np.ndarray, where: str) -> None:
    view = buf.data
    for position, size, stored, base, last in table[
        :, [COL_POSITION, COL_SIZE, COL_CRC, COL_BASE_OFFSET, COL_LAST_OFFSET]
    ].tolist():
        computed = compute_crc(view, position, size)
        if computed != stored:
            raise CorruptRecordError(
                f"{where}: record batch at position {position} (offsets {base}..{last}): "
                f"stored CRC {stored:#010x}, computed {computed:#010x}"
            )


def _decode_plain(
    buf: np.ndarray, table: np.ndarray, row: int, end_row: int, topic: str, partition: int, where: str
) -> RecordArrays:
    total = int(table[row:end_row, COL_RECORDS_COUNT].sum())
    offsets = np.empty(total, dtype=np.int64)
    timestamps = np.empty(total, dtype=np.int64)
    timestamp_types = np.empty(total, dtype=np.int8)
    key_positions = np.empty(total, dtype=np.int64)
    key_lengths = np.empty(total, dtype=np.int32)
    value_positions = np.empty(total, dtype=np.int64)
    value_lengths = np.empty(total, dtype=np.int32)
    header_positions = np.empty(total, dtype=np.int64)
    header_counts = np.empty(total, dtype=np.int32)
    code, bad_row, index, at = _decode_run(
        buf, table, row, end_row, offsets, timestamps, timestamp_types, key_positions, key_lengths,
        value_positions, value_lengths, header_positions, header_counts,
    )  # fmt: skip
    if code != 0:
        # storage's decoder finds the same fault and words it (record index, byte position, what is wrong)
        decode_batch(buf.data, int(table[bad_row, COL_POSITION]), where=where, verify_crc=False)
        raise CorruptRecordError(
            f"{where}: record batch at position {int(table[bad_row, COL_POSITION])}: record {index} at "
            f"position {at}: error code {code}"
        )  # not reached: decode_batch raised
    return RecordArrays(
        topic, partition, buf, offsets, timestamps, timestamp_types, key_positions, key_lengths,
        value_positions, value_lengths, header_positions, header_counts,
    )  # fmt: skip


def _decode_compressed(
    buf: np.ndarray, table: np.ndarray, row: int, topic: str, partition: int, where: str,
    max_decompressed_bytes: int,
) -> RecordArrays:  # fmt: skip
    decoded = decode_batch(
        buf.data, int(table[row, COL_POSITION]), where=where, verify_crc=False,
        max_decompressed_bytes=max_decompressed_bytes,
    )  # fmt: skip
    types = np.full(len(decoded), decoded.header.timestamp_type, dtype=np.int8)
    return RecordArrays(
        topic, partition, decoded.data, decoded.offsets, decoded.timestamps, types, decoded.key_positions,
        decoded.key_lengths, decoded.value_positions, decoded.value_lengths, decoded.header_positions,
        decoded.header_counts,
    )  # fmt: skip
