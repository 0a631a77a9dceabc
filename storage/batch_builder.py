"""Build Kafka RecordBatch v2 batches from columns of records, many at once, with numba.

Theory of operation
-------------------
A producer holds many records; encoding them one at a time in Python costs interpreter time for every
field of every record (docs/storage.md).  Here the records arrive as *columns*: every value concatenated
into one ``uint8`` buffer with an ``int64`` offsets array (record ``i`` is
``data[offsets[i]:offsets[i + 1]]``) and an optional null mask; the same for keys and for header keys and
values; an optional ``int64`` timestamps array.  Two numba kernels then walk the columns: ``_records_size``
validates the columns and computes the exact size of the records section (and the max timestamp),
``_encode_records`` writes it.  The 61-byte header (``storage.batch_header``) is
packed once and the CRC-32C written last by ``batch_header.write_crc``.

Because the size is exact and computed first, a batch can be written straight into a caller's buffer at a
position (the producer's shared-memory ring): :func:`build_into` returns the bytes written, or
:data:`NO_SPACE` (negative, nothing written) when it would not fit.  With compression the records are encoded
into a scratch buffer, compressed, and then copied in; :func:`max_encoded_size` bounds the result.

**Value lists.**  :func:`build_into` and :func:`build` also take a plain Python list of ``bytes`` (or None)
values, the producer's per-record path: value-only records (null keys, no headers, the batch's timestamp)
read where CPython keeps them by the kernels of ``storage.value_lists``, every value copied exactly once,
into the batch.

Each record, as Kafka's DefaultRecord lays it out (all integers zig-zag varints, see ``storage.varint``)::

    length          varint   bytes after this field
    attributes      int8     unused, 0
    timestampDelta  varlong  timestamp - baseTimestamp (baseTimestamp = first record's timestamp)
    offsetDelta     varint   i (0, 1, 2, ...)
    keyLength       varint   -1 = null key
    key             bytes
    valueLength     varint   -1 = null value
    value           bytes
    headerCount     varint
    headers         [keyLength varint, key utf-8 (never null), valueLength varint (-1 = null), value]
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numba
import numpy as np

from storage.batch_header import (
    BATCH_HEADER,
    COMPRESSION_NONE,
    CONTROL_FLAG_MASK,
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAGIC,
    NO_PARTITION_LEADER_EPOCH,
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    NO_SEQUENCE,
    TIMESTAMP_TYPE_MASK,
    TRANSACTIONAL_FLAG_MASK,
    write_crc,
)
from storage.compression import SUPPORTED_CODECS, codec_name, compress, compress_bound
from storage.record_encoding import (
    MAX_INT32,
    OK,
    RECORD_ATTRIBUTES,
    TOO_LONG,
    check_records_section,
    copy_bytes,
)
from storage.value_lists import VALUE_LISTS_IN_PLACE, encode_value_list, value_list_records_size
from storage.varint import size_of_varint, write_varint

__all__ = [
    "NO_SPACE",
    "RECORD_ATTRIBUTES",
    "VALUE_LISTS_IN_PLACE",
    "ByteColumn",
    "HeaderColumns",
    "RecordColumns",
    "Records",
    "build",
    "build_batch",
    "build_into",
    "encoded_size",
    "max_encoded_size",
    "records_size",
]

NO_SPACE = -1  # build_into: the batch does not fit between position and the end of the buffer

_TIMESTAMP_LIMIT = 1 << 62  # |timestamp| bound so deltas cannot overflow int64

# Named negative codes of _records_size (caller's columns are inconsistent), besides TOO_LONG.
_BAD_OFFSETS = -2  # offsets decrease, start below 0 or end past the data
_BAD_HEADER_INDEX = -4  # header offsets decrease or point past the header columns
_BAD_TIMESTAMP = -5  # a timestamp outside +-2**62 ms
_COLUMN_NAMES = ("keys", "values", "header keys", "header values", "header offsets", "timestamps")


class ByteColumn(NamedTuple):
    """``n`` byte strings, any of them null: ``data[offsets[i]:offsets[i + 1]]`` unless ``nulls[i]``."""

    data: np.ndarray  # uint8, the strings back to back
    offsets: np.ndarray  # int64, n + 1 entries, non-decreasing
    nulls: np.ndarray | None = None  # bool, n entries, True = null; None = no nulls

    @property
    def item_count(self) -> int:
        """Number of strings (null ones included)."""
        return len(self.offsets) - 1

    @classmethod
    def from_list(cls, items: Sequence[bytes | bytearray | memoryview | None]) -> ByteColumn:
        """Pack a list of byte strings (None = null) into one buffer."""
        count = len(items)
        lengths = np.fromiter((0 if item is None else len(item) for item in items), np.int64, count)
        offsets = np.zeros(count + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        data = np.frombuffer(b"".join(item for item in items if item is not None), dtype=np.uint8)
        nulls = None
        if any(item is None for item in items):
            nulls = np.fromiter((item is None for item in items), np.bool_, count)
        return cls(data, offsets, nulls)


class HeaderColumns(NamedTuple):
    """Record headers: record ``i`` has headers ``offsets[i]`` up to ``offsets[i + 1]`` of keys/values."""

    offsets: np.ndarray  # int64, n + 1 entries, non-decreasing, offsets[n] <= number of headers
    keys: ByteColumn  # UTF-8 header names, never null
    values: ByteColumn  # header values, nullable

    @classmethod
    def from_lists(cls, headers: Sequence[Sequence[tuple[str, bytes | None]]]) -> HeaderColumns:
        """Pack per-record lists of ``(name, value)`` pairs."""
        counts = np.fromiter((len(pairs) for pairs in headers), np.int64, len(headers))
        offsets = np.zeros(len(headers) + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        flat = [pair for pairs in headers for pair in pairs]
        keys = ByteColumn.from_list([name.encode("utf-8") for name, _ in flat])
        values = ByteColumn.from_list([value for _, value in flat])
        return cls(offsets, keys, values)


class RecordColumns(NamedTuple):
    """The records of one batch, as columns.  Only ``values`` is required; ``len(values)`` records."""

    values: ByteColumn
    keys: ByteColumn | None = None  # None = every key null
    headers: HeaderColumns | None = None  # None = no headers
    timestamps: np.ndarray | None = None  # int64 ms; None = every record gets the batch's timestamp_ms

    @classmethod
    def from_lists(
        cls,
        values: Sequence[bytes | None],
        keys: Sequence[bytes | None] | None = None,
        headers: Sequence[Sequence[tuple[str, bytes | None]]] | None = None,
        timestamps: Sequence[int] | None = None,
    ) -> RecordColumns:
        return cls(
            ByteColumn.from_list(values),
            None if keys is None else ByteColumn.from_list(keys),
            None if headers is None else HeaderColumns.from_lists(headers),
            None if timestamps is None else np.array(timestamps, dtype=np.int64),
        )


# ---------------------------------------------------------------------------------------------------------
# Kernels.  Empty arrays stand for absent columns: no key offsets = all keys null, no nulls = none null,
# no header offsets = no headers, no timestamps = every delta 0.


@numba.njit(cache=True, inline="always")
def _check_column(data_len: int, offsets: np.ndarray) -> int:
    """Index of the first bad entry of ``offsets``, or -1 if every entry is fine."""
    if offsets.size == 0:
        return -1
    if offsets[0] < 0:
        return 0
    for i in range(offsets.size - 1):
        length = offsets[i + 1] - offsets[i]
        if length < 0 or length > MAX_INT32:
            return i + 1
    if offsets[offsets.size - 1] > data_len:
        return offsets.size - 1
    return -1


@numba.njit(cache=True)
def _records_size(
    key_data: np.ndarray,
    key_offsets: np.ndarray,
    key_nulls: np.ndarray,
    value_data: np.ndarray,
    value_offsets: np.ndarray,
    value_nulls: np.ndarray,
    header_index: np.ndarray,
    header_key_data: np.ndarray,
    header_key_offsets: np.ndarray,
    header_value_data: np.ndarray,
    header_value_offsets: np.ndarray,
    header_value_nulls: np.ndarray,
    timestamps: np.ndarray,
) -> tuple[int, int, int, int]:
    """Validate the columns and size the records section: ``(size_bytes, max_ts_delta, code, column)``.

    ``code`` is 0 or a named negative code; then ``column`` indexes ``_COLUMN_NAMES`` and ``size_bytes``
    holds the bad entry's index.
    """
    count = value_offsets.size - 1
    bad = _check_column(key_data.size, key_offsets)
    if bad >= 0:
        return bad, 0, _BAD_OFFSETS, 0
    bad = _check_column(value_data.size, value_offsets)
    if bad >= 0:
        return bad, 0, _BAD_OFFSETS, 1
    bad = _check_column(header_key_data.size, header_key_offsets)
    if bad >= 0:
        return bad, 0, _BAD_OFFSETS, 2
    bad = _check_column(header_value_data.size, header_value_offsets)
    if bad >= 0:
        return bad, 0, _BAD_OFFSETS, 3
    has_headers = header_index.size > 0
    if has_headers:
        header_count = header_key_offsets.size - 1
        if header_index[0] < 0:
            return 0, 0, _BAD_HEADER_INDEX, 4
        for i in range(count):
            if header_index[i + 1] < header_index[i] or header_index[i + 1] > header_count:
                return i + 1, 0, _BAD_HEADER_INDEX, 4
    has_timestamps = timestamps.size > 0
    max_delta = 0
    if has_timestamps:
        for i in range(count):
            if timestamps[i] >= _TIMESTAMP_LIMIT or timestamps[i] <= -_TIMESTAMP_LIMIT:
                return i, 0, _BAD_TIMESTAMP, 5
    has_keys = key_offsets.size > 0
    has_key_nulls = key_nulls.size > 0
    has_value_nulls = value_nulls.size > 0
    has_header_value_nulls = header_value_nulls.size > 0
    total = 0
    for i in range(count):
        body = 1 + size_of_varint(i)  # attributes, offsetDelta
        if has_timestamps:
            delta = timestamps[i] - timestamps[0]
            max_delta = max(max_delta, delta)
            body += size_of_varint(delta)
        else:
            body += 1
        if not has_keys or (has_key_nulls and key_nulls[i]):
            body += 1
        else:
            length = key_offsets[i + 1] - key_offsets[i]
            body += size_of_varint(length) + length
        if has_value_nulls and value_nulls[i]:
            body += 1
        else:
            length = value_offsets[i + 1] - value_offsets[i]
            body += size_of_varint(length) + length
        if has_headers:
            first = header_index[i]
            last = header_index[i + 1]
            body += size_of_varint(last - first)
            for h in range(first, last):
                length = header_key_offsets[h + 1] - header_key_offsets[h]
                body += size_of_varint(length) + length
                if has_header_value_nulls and header_value_nulls[h]:
                    body += 1
                else:
                    length = header_value_offsets[h + 1] - header_value_offsets[h]
                    body += size_of_varint(length) + length
        else:
            body += 1
        if body > MAX_INT32:
            return i, 0, TOO_LONG, 1
        total += size_of_varint(body) + body
    return total, max_delta, OK, -1


@numba.njit(cache=True)
def _encode_records(
    out: np.ndarray,
    position: int,
    key_data: np.ndarray,
    key_offsets: np.ndarray,
    key_nulls: np.ndarray,
    value_data: np.ndarray,
    value_offsets: np.ndarray,
    value_nulls: np.ndarray,
    header_index: np.ndarray,
    header_key_data: np.ndarray,
    header_key_offsets: np.ndarray,
    header_value_data: np.ndarray,
    header_value_offsets: np.ndarray,
    header_value_nulls: np.ndarray,
    timestamps: np.ndarray,
) -> int:
    """Write the records section at ``position`` (checked and sized by ``_records_size``); return its end."""
    count = value_offsets.size - 1
    has_keys = key_offsets.size > 0
    has_key_nulls = key_nulls.size > 0
    has_value_nulls = value_nulls.size > 0
    has_headers = header_index.size > 0
    has_header_value_nulls = header_value_nulls.size > 0
    has_timestamps = timestamps.size > 0
    for i in range(count):
        delta = timestamps[i] - timestamps[0] if has_timestamps else 0
        key_null = not has_keys or (has_key_nulls and key_nulls[i])
        value_null = has_value_nulls and value_nulls[i]
        key_length = -1 if key_null else key_offsets[i + 1] - key_offsets[i]
        value_length = -1 if value_null else value_offsets[i + 1] - value_offsets[i]
        first = header_index[i] if has_headers else 0
        last = header_index[i + 1] if has_headers else 0
        body = 1 + size_of_varint(delta) + size_of_varint(i)
        body += size_of_varint(key_length) + max(key_length, 0)
        body += size_of_varint(value_length) + max(value_length, 0)
        body += size_of_varint(last - first)
        for h in range(first, last):
            length = header_key_offsets[h + 1] - header_key_offsets[h]
            body += size_of_varint(length) + length
            if has_header_value_nulls and header_value_nulls[h]:
                body += 1
            else:
                length = header_value_offsets[h + 1] - header_value_offsets[h]
                body += size_of_varint(length) + length
        position = write_varint(out, position, body)
        out[position] = RECORD_ATTRIBUTES
        position = write_varint(out, position + 1, delta)
        position = write_varint(out, position, i)
        position = write_varint(out, position, key_length)
        if not key_null:
            position = copy_bytes(out, position, key_data, key_offsets[i], key_offsets[i + 1])
        position = write_varint(out, position, value_length)
        if not value_null:
            position = copy_bytes(out, position, value_data, value_offsets[i], value_offsets[i + 1])
        position = write_varint(out, position, last - first)
        for h in range(first, last):
            start = header_key_offsets[h]
            end = header_key_offsets[h + 1]
            position = write_varint(out, position, end - start)
            position = copy_bytes(out, position, header_key_data, start, end)
            if has_header_value_nulls and header_value_nulls[h]:
                position = write_varint(out, position, -1)
            else:
                start = header_value_offsets[h]
                end = header_value_offsets[h + 1]
                position = write_varint(out, position, end - start)
                position = copy_bytes(out, position, header_value_data, start, end)
    return position


# ---------------------------------------------------------------------------------------------------------
# Python face.

_EMPTY_U8 = np.zeros(0, dtype=np.uint8)
_EMPTY_I64 = np.zeros(0, dtype=np.int64)
_EMPTY_BOOL = np.zeros(0, dtype=np.bool_)
for _empty in (_EMPTY_U8, _EMPTY_I64, _EMPTY_BOOL):
    _empty.flags.writeable = False


def _readonly(array: np.ndarray | None, dtype: type, length: int | None, what: str) -> np.ndarray:
    """A read-only contiguous 1-D view (one kernel signature whatever the caller passes), checked."""
    if array is None:
        if dtype is np.uint8:
            return _EMPTY_U8
        return _EMPTY_I64 if dtype is np.int64 else _EMPTY_BOOL
    view: np.ndarray = np.ascontiguousarray(array, dtype=dtype).view()
    if view.ndim != 1:
        raise ValueError(f"{what}: expected a 1-D array, got shape {view.shape}")
    if length is not None and view.size != length:
        raise ValueError(f"{what}: {view.size} entries, expected {length}")
    view.flags.writeable = False
    return view


def _column_arrays(column: ByteColumn | None, count: int, what: str) -> tuple[np.ndarray, ...]:
    if column is None:
        return _EMPTY_U8, _EMPTY_I64, _EMPTY_BOOL
    return (
        _readonly(column.data, np.uint8, None, f"{what} data"),
        _readonly(column.offsets, np.int64, count + 1, f"{what} offsets"),
        _readonly(column.nulls, np.bool_, count, f"{what} nulls"),
    )


def _kernel_args(columns: RecordColumns) -> tuple[np.ndarray, ...]:
    count = len(columns.values.offsets) - 1
    if count < 1:
        raise ValueError(f"a record batch needs at least one record, got {count}")
    keys = _column_arrays(columns.keys, count, "keys")
    values = _column_arrays(columns.values, count, "values")
    header_keys: tuple[np.ndarray, ...]
    header_values: tuple[np.ndarray, ...]
    if columns.headers is None:
        header_index = _EMPTY_I64
        header_keys = header_values = (_EMPTY_U8, _EMPTY_I64, _EMPTY_BOOL)
    else:
        header_index = _readonly(columns.headers.offsets, np.int64, count + 1, "header offsets")
        total = len(columns.headers.keys.offsets) - 1
        if columns.headers.keys.nulls is not None and bool(np.any(columns.headers.keys.nulls)):
            raise ValueError("header keys: a header key cannot be null")
        header_keys = _column_arrays(columns.headers.keys._replace(nulls=None), total, "header keys")
        header_values = _column_arrays(columns.headers.values, total, "header values")
    timestamps = _readonly(columns.timestamps, np.int64, count, "timestamps")
    return (*keys, *values, header_index, *header_keys[:2], *header_values, timestamps)


def _sized(args: tuple[np.ndarray, ...]) -> tuple[int, int]:
    """(records section bytes, max timestamp delta), raising ValueError for inconsistent columns."""
    size, max_delta, code, column = _records_size(*args)
    if code == _BAD_OFFSETS:
        raise ValueError(
            f"{_COLUMN_NAMES[column]}: offsets entry {size} is negative, below the entry before it, past the "
            f"end of the data, or more than {MAX_INT32} bytes after the entry before it"
        )
    if code == _BAD_HEADER_INDEX:
        raise ValueError(f"header offsets: entry {size} decreases or points past the header columns")
    if code == _BAD_TIMESTAMP:
        raise ValueError(f"timestamps: entry {size} is outside +-2**62 ms")
    check_records_section(size, code)
    return size, max_delta


Records = RecordColumns | list  # a batch's records: columns, or a list of values (bytes or None)


class _Encoder(NamedTuple):
    """What sizing found out about a batch's records, and how to write them."""

    encode: Callable[[np.ndarray, int], int]  # encode(out, position) -> end of the records section
    records_bytes: int  # exact size of the records section
    record_count: int
    max_delta: int  # largest timestamp delta
    first_timestamp: int | None  # the first record's own timestamp (None: the batch's timestamp_ms)


def _encoder(records: Records) -> _Encoder:
    """Check and size ``records`` (ValueError / TypeError for bad ones)."""
    if isinstance(records, list):
        if not VALUE_LISTS_IN_PLACE:
            return _encoder(RecordColumns(ByteColumn.from_list(records)))
        return _list_encoder(records)
    args = _kernel_args(records)
    records_bytes, max_delta = _sized(args)
    return _Encoder(
        lambda out, position: int(_encode_records(out, position, *args)),
        records_bytes,
        records.values.item_count,
        max_delta,
        None if records.timestamps is None else int(args[-1][0]),
    )


def _list_encoder(values: list[bytes | None]) -> _Encoder:
    size = value_list_records_size(values)
    count = len(values)
    return _Encoder(
        lambda out, position: encode_value_list(out, position, values, count, size), size, count, 0, None
    )


def records_size(columns: Records) -> int:
    """Exact bytes of the uncompressed records section of these columns (or list of values)."""
    return _encoder(columns).records_bytes


def encoded_size(columns: Records) -> int:
    """Exact bytes of the whole uncompressed batch (header included): what :func:`build_into` will write."""
    return HEADER_SIZE + records_size(columns)


def max_encoded_size(columns: Records, compression: int = COMPRESSION_NONE) -> int:
    """Bytes to reserve for the batch: exact without compression, an upper bound with it."""
    return HEADER_SIZE + compress_bound(compression, records_size(columns))


_local = threading.local()


def _scratch(size_bytes: int) -> np.ndarray:
    """A per-thread reusable buffer of at least ``size_bytes`` (fresh 1 MiB allocations page-fault)."""
    buffer: np.ndarray | None = getattr(_local, "scratch", None)
    if buffer is None or buffer.size < size_bytes:
        buffer = _local.scratch = np.empty(max(size_bytes, 1 << 16), dtype=np.uint8)
    return buffer


def _writable_u8(out: bytearray | memoryview | np.ndarray) -> np.ndarray:
    if isinstance(out, np.ndarray):
        array = out
    else:
        view = memoryview(out)
        array = np.frombuffer(view.cast("B") if view.format != "B" else view, dtype=np.uint8)
    if array.dtype != np.uint8 or array.ndim != 1 or not array.flags.c_contiguous:
        raise TypeError(f"output buffer: need 1-D contiguous uint8, got {array.dtype} shape {array.shape}")
    if not array.flags.writeable:
        raise TypeError("output buffer is read-only")
    return array


def _attributes(compression: int, timestamp_type: int, is_transactional: bool, is_control: bool) -> int:
    if compression not in SUPPORTED_CODECS:
        raise ValueError(f"unsupported compression codec {compression} ({codec_name(compression)})")
    if timestamp_type not in (0, 1):
        raise ValueError(f"timestamp_type must be 0 (CreateTime) or 1 (LogAppendTime), got {timestamp_type}")
    attributes = compression
    if timestamp_type:
        attributes |= TIMESTAMP_TYPE_MASK
    if is_transactional:
        attributes |= TRANSACTIONAL_FLAG_MASK
    if is_control:
        attributes |= CONTROL_FLAG_MASK
    return attributes


def build_into(
    out: bytearray | memoryview | np.ndarray,
    position: int,
    columns: Records,
    *,
    base_offset: int = 0,
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = NO_PRODUCER_EPOCH,
    base_sequence: int = NO_SEQUENCE,
    timestamp_ms: int | None = None,
    timestamp_type: int = 0,
    is_transactional: bool = False,
    is_control: bool = False,
    compression: int = COMPRESSION_NONE,
    compression_level: int | None = None,
) -> int:
    """Write one complete batch (header stamped, CRC written) into ``out`` at ``position``.

    Returns the bytes written, or :data:`NO_SPACE` when the batch does not fit before the end of ``out``
    (then nothing in ``out`` was changed).  ``out`` is any writable byte buffer: a bytearray, a memoryview,
    an mmap, a uint8 numpy array over shared memory.  ``columns`` may also be a ``list`` of values (bytes
    or None: value-only records, read in place; see the module docstring).  ``timestamp_ms`` is every
    record's timestamp when ``columns.timestamps`` is None (default: now); otherwise it is ignored.  Raises
    ValueError for inconsistent columns or settings, TypeError for a list item that is not bytes or None.
    """
    array = _writable_u8(out)
    if position < 0 or position > array.size:
        raise ValueError(f"position {position} outside the {array.size}-byte buffer")
    encoder, header = _plan(
        columns,
        base_offset,
        partition_leader_epoch,
        producer_id,
        producer_epoch,
        base_sequence,
        timestamp_ms,
        _attributes(compression, timestamp_type, is_transactional, is_control),
    )
    return _write(array, position, encoder, compression, compression_level, header)


def _plan(
    columns: Records,
    base_offset: int,
    partition_leader_epoch: int,
    producer_id: int,
    producer_epoch: int,
    base_sequence: int,
    timestamp_ms: int | None,
    attributes: int,
) -> tuple[_Encoder, tuple[int, ...]]:
    """Check and size the records: (their encoder, header fields)."""
    encoder = _encoder(columns)
    if encoder.first_timestamp is not None:
        base_timestamp = encoder.first_timestamp
    else:
        base_timestamp = int(time.time() * 1000) if timestamp_ms is None else timestamp_ms
    count = encoder.record_count
    header = (
        base_offset,
        0,  # batchLength, filled in by _write
        partition_leader_epoch,
        MAGIC,
        0,  # CRC, written by _write over the finished bytes
        attributes,
        count - 1,  # lastOffsetDelta
        base_timestamp,
        base_timestamp + encoder.max_delta,  # maxTimestamp
        producer_id,
        producer_epoch,
        base_sequence,
        count,  # recordsCount
    )
    return encoder, header


def _write(
    array: np.ndarray,
    position: int,
    encoder: _Encoder,
    compression: int,
    compression_level: int | None,
    header: tuple[int, ...],
) -> int:
    """Encode (and compress) the records, then pack the header and write the CRC; NO_SPACE if too big."""
    room = array.size - position
    records_bytes = encoder.records_bytes
    if compression == COMPRESSION_NONE:
        size = HEADER_SIZE + records_bytes
        if size > room:
            return NO_SPACE
        end = encoder.encode(array, position + HEADER_SIZE)
        assert end == position + size, (end, position, size)
    else:
        scratch = np.empty(records_bytes, dtype=np.uint8)  # not _scratch(): build() may be using it
        encoder.encode(scratch, 0)
        packed = compress(compression, scratch.data, level=compression_level)
        size = HEADER_SIZE + len(packed)
        if size > room:
            return NO_SPACE
        array[position + HEADER_SIZE : position + size] = np.frombuffer(packed, dtype=np.uint8)
    view = array.data
    BATCH_HEADER.pack_into(view, position, header[0], size - LOG_OVERHEAD, *header[2:])
    write_crc(view, position, size)
    return size


def build(
    columns: Records,
    *,
    base_offset: int = 0,
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = NO_PRODUCER_EPOCH,
    base_sequence: int = NO_SEQUENCE,
    timestamp_ms: int | None = None,
    timestamp_type: int = 0,
    is_transactional: bool = False,
    is_control: bool = False,
    compression: int = COMPRESSION_NONE,
    compression_level: int | None = None,
) -> bytes:
    """One complete batch as bytes; arguments as :func:`build_into`."""
    encoder, header = _plan(
        columns,
        base_offset,
        partition_leader_epoch,
        producer_id,
        producer_epoch,
        base_sequence,
        timestamp_ms,
        _attributes(compression, timestamp_type, is_transactional, is_control),
    )
    out = _scratch(HEADER_SIZE + compress_bound(compression, encoder.records_bytes))
    size = _write(out, 0, encoder, compression, compression_level, header)
    assert size > 0
    return out[:size].tobytes()


def build_batch(
    values: Sequence[bytes | None],
    keys: Sequence[bytes | None] | None = None,
    headers: Sequence[Sequence[tuple[str, bytes | None]]] | None = None,
    timestamps: Sequence[int] | None = None,
    *,
    base_offset: int = 0,
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = NO_PRODUCER_EPOCH,
    base_sequence: int = NO_SEQUENCE,
    timestamp_ms: int | None = None,
    timestamp_type: int = 0,
    is_transactional: bool = False,
    is_control: bool = False,
    compression: int = COMPRESSION_NONE,
    compression_level: int | None = None,
) -> bytes:
    """Convenience: one batch from Python lists (``None`` = null key/value; headers as (str, bytes|None))."""
    count = len(values)
    for name, column in (("keys", keys), ("headers", headers), ("timestamps", timestamps)):
        if column is not None and len(column) != count:
            raise ValueError(f"{name}: {len(column)} entries for {count} values")
    return build(
        RecordColumns.from_lists(values, keys, headers, timestamps),
        base_offset=base_offset,
        partition_leader_epoch=partition_leader_epoch,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        timestamp_ms=timestamp_ms,
        timestamp_type=timestamp_type,
        is_transactional=is_transactional,
        is_control=is_control,
        compression=compression,
        compression_level=compression_level,
    )
