"""Records as Arrow columns and back: decoded record arrays -> ``pyarrow.RecordBatch`` (reads), Arrow
columns -> the producer's byte columns (writes).

Theory of operation
-------------------
A read ends in :class:`appliance.client.record_arrays.RecordArrays`: every key and value still lies where it
was in the fetched buffer, between record headers, named by a position and a length (-1 = null).  Arrow wants
each binary column contiguous (an ``int32`` offsets buffer, a data buffer, a validity bitmap), so one numba
pass per column (:func:`_gather`) copies the bytes back to back and writes the offsets: the only per-byte work
of a read besides the decoding.  Headers are parsed from their varints by :func:`_parse_headers` into
positions, then gathered the same way into ``list<struct<key: string, value: binary>>``.  ``topic`` and
``partition`` are constants per chunk, ``timestamp`` is milliseconds times 1000 (Spark's microseconds, UTC).
The result carries exactly the Arrow schema Spark derives (``to_arrow_schema``) from
``appliance.spark.schema.SCHEMA``, which Spark checks field by field.

A write goes the other way without copying: an Arrow ``binary`` or ``string`` column already *is* a data
buffer with offsets, so :func:`byte_column` wraps its buffers as a
:class:`~storage.batch_builder.ByteColumn` (offsets widened to ``int64``, the validity bitmap unpacked to a
null mask) for ``storage.batch_builder`` to encode.
"""

from __future__ import annotations

from typing import Final

import numba
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.pandas.types import to_arrow_schema

from appliance.client.record_arrays import RecordArrays
from appliance.spark.schema import SCHEMA, SCHEMA_WITHOUT_HEADERS
from storage.batch_builder import ByteColumn, HeaderColumns
from storage.errors import CorruptRecordError, InvalidRecordError
from storage.varint import read_varint

__all__ = ["ARROW_SCHEMA", "ARROW_SCHEMA_WITHOUT_HEADERS", "byte_column", "header_columns", "to_record_batch"]

ARROW_SCHEMA: Final = to_arrow_schema(SCHEMA, timezone="UTC")
ARROW_SCHEMA_WITHOUT_HEADERS: Final = to_arrow_schema(SCHEMA_WITHOUT_HEADERS, timezone="UTC")
_HEADERS_TYPE: Final = ARROW_SCHEMA.field("headers").type
_MAX_ARROW_BYTES: Final = (1 << 31) - 1  # int32 offsets

_BAD_HEADER: Final = -1  # a header's varints or lengths run past the record


@numba.njit(cache=True)
def _gather(data: np.ndarray, positions: np.ndarray, lengths: np.ndarray, out: np.ndarray,
            out_offsets: np.ndarray) -> int:
    """Copy ``data[positions[i]:][:lengths[i]]`` back to back into ``out`` (null, length -1: nothing) and
    write Arrow's int32 ``out_offsets``; return the bytes written."""
    at = 0
    out_offsets[0] = 0
    for i in range(positions.size):
        length = lengths[i]
        if length > 0:
            start = positions[i]
            for k in range(length):
                out[np.uint64(at + k)] = data[np.uint64(start + k)]
            at += length
        out_offsets[i + 1] = at
    return at


@numba.njit(cache=True)
def _parse_headers(data: np.ndarray, header_positions: np.ndarray, header_counts: np.ndarray,
                   key_positions: np.ndarray, key_lengths: np.ndarray, value_positions: np.ndarray,
                   value_lengths: np.ndarray) -> int:
    """Positions and lengths of every header's key and value, record after record; the number of headers,
    or ``_BAD_HEADER``.  (The record decoder validated these bytes already: this is a second reading.)"""
    end = data.size
    h = 0
    for i in range(header_positions.size):
        at = header_positions[i]
        for _ in range(header_counts[i]):
            length, at = read_varint(data, at, end)
            if at < 0 or length < 0 or at + length > end:
                return _BAD_HEADER
            key_positions[h] = at
            key_lengths[h] = length
            at += length
            length, at = read_varint(data, at, end)
            if at < 0 or at + max(length, 0) > end:
                return _BAD_HEADER
            value_positions[h] = at
            value_lengths[h] = length
            at += max(length, 0)
            h += 1
    return h


def _binary(data: np.ndarray, positions: np.ndarray, lengths: np.ndarray, arrow_type: pa.DataType,
            where: str) -> pa.Array:
    count = len(positions)
    total = int(np.maximum(lengths, 0).sum())
    if total > _MAX_ARROW_BYTES:
        raise InvalidRecordError(f"{where}: {total} bytes in one Arrow column (at most {_MAX_ARROW_BYTES})")
    out = np.empty(total, np.uint8)
    offsets = np.empty(count + 1, np.int32)
    _gather(data, positions, lengths, out, offsets)
    valid = lengths >= 0
    nulls = count - int(np.count_nonzero(valid))
    bitmap = pa.py_buffer(np.packbits(valid, bitorder="little")) if nulls else None
    return pa.Array.from_buffers(arrow_type, count, [bitmap, pa.py_buffer(offsets), pa.py_buffer(out)],
                                 null_count=nulls)


def _headers(records: RecordArrays, where: str) -> pa.Array:
    count = len(records)
    counts = np.ascontiguousarray(records.header_counts, np.int32)
    list_offsets = np.zeros(count + 1, np.int32)
    np.cumsum(counts, out=list_offsets[1:])
    total = int(list_offsets[-1])
    key_positions = np.empty(total, np.int64)
    key_lengths = np.empty(total, np.int32)
    value_positions = np.empty(total, np.int64)
    value_lengths = np.empty(total, np.int32)
    if total:
        found = _parse_headers(records.data, np.ascontiguousarray(records.header_positions, np.int64), counts,
                               key_positions, key_lengths, value_positions, value_lengths)
        if found != total:
            raise CorruptRecordError(f"{where}: record headers do not parse ({total} announced)")
    keys = _binary(records.data, key_positions, key_lengths, pa.string(), where)
    values = _binary(records.data, value_positions, value_lengths, pa.binary(), where)
    element = _HEADERS_TYPE.value_type
    structs = pa.StructArray.from_arrays([keys, values], fields=[element.field(0), element.field(1)])
    return pa.ListArray.from_arrays(pa.array(list_offsets, pa.int32()), structs, type=_HEADERS_TYPE)


def to_record_batch(records: RecordArrays, include_headers: bool = True) -> pa.RecordBatch:
    """One chunk of decoded records as an Arrow record batch with :data:`ARROW_SCHEMA` (without the headers
    column, and without parsing headers, unless ``include_headers``)."""
    count = len(records)
    where = f"partition {records.topic}-{records.partition}"
    data = records.data
    name = records.topic.encode("utf-8")
    topics = pa.Array.from_buffers(pa.string(), count, [
        None, pa.py_buffer(np.arange(count + 1, dtype=np.int32) * len(name)), pa.py_buffer(name * count)])
    micros = np.ascontiguousarray(records.timestamps, np.int64) * 1000
    columns = [
        _binary(data, records.key_positions, records.key_lengths, pa.binary(), where),
        _binary(data, records.value_positions, records.value_lengths, pa.binary(), where),
        topics,
        pa.array(np.full(count, records.partition, np.int32)),
        pa.array(np.ascontiguousarray(records.offsets, np.int64)),
        pa.Array.from_buffers(ARROW_SCHEMA.field("timestamp").type, count, [None, pa.py_buffer(micros)]),
        pa.array(np.asarray(records.timestamp_types, np.int32)),
    ]
    if not include_headers:
        return pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA_WITHOUT_HEADERS)
    return pa.RecordBatch.from_arrays([*columns, _headers(records, where)], schema=ARROW_SCHEMA)


# ---------------------------------------------------------------------------------------------------------
# Writes: Arrow columns as the producer's byte columns.


def byte_column(array: pa.Array, what: str) -> ByteColumn:
    """An Arrow ``binary``/``string`` (or large) column as a ByteColumn over the same data buffer."""
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    kind = array.type
    offset_type: type[np.signedinteger] = np.int32
    if pa.types.is_binary(kind) or pa.types.is_string(kind):
        pass
    elif pa.types.is_large_binary(kind) or pa.types.is_large_string(kind):
        offset_type = np.int64
    else:
        raise InvalidRecordError(f"column {what!r}: expected binary or string, got {kind}")
    count = len(array)
    validity, offsets_buffer, data_buffer = array.buffers()
    offsets = np.frombuffer(offsets_buffer, offset_type)[array.offset : array.offset + count + 1]
    data = np.frombuffer(data_buffer, np.uint8) if data_buffer is not None else np.zeros(0, np.uint8)
    nulls = None
    if array.null_count:
        nulls = ~np.unpackbits(np.frombuffer(validity, np.uint8), bitorder="little")[
            array.offset : array.offset + count].astype(np.bool_)
    return ByteColumn(data, offsets.astype(np.int64), nulls)


def header_columns(array: pa.Array) -> HeaderColumns:
    """A ``list<struct<key: string, value: binary>>`` column as HeaderColumns (a null list: no headers)."""
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    if not (pa.types.is_list(array.type) or pa.types.is_large_list(array.type)) or not pa.types.is_struct(
        array.type.value_type
    ):
        raise InvalidRecordError(f"column 'headers': expected array<struct<key: string, value: binary>>, got "
                                 f"{array.type}")
    if array.null_count:  # a null list: no headers (Arrow does not promise empty offsets for it)
        array = pc.if_else(array.is_null(), pa.scalar([], type=array.type), array)
    count = len(array)
    list_offsets = np.asarray(array.offsets, np.int64)  # accounts for the array's own slice offset
    base = int(list_offsets[0]) if count else 0
    structs = array.values.slice(base, int(list_offsets[-1]) - base if count else 0)
    fields = {structs.type.field(i).name: i for i in range(structs.type.num_fields)}
    if "key" not in fields or "value" not in fields:
        raise InvalidRecordError(f"column 'headers': its structs need fields key and value, got "
                                 f"{list(fields)}")
    flat = structs.flatten()
    keys = byte_column(flat[fields["key"]], "headers.key")
    if keys.nulls is not None and bool(keys.nulls.any()):
        raise InvalidRecordError("column 'headers': a header key is null (header names cannot be null)")
    return HeaderColumns(list_offsets - base, keys, byte_column(flat[fields["value"]], "headers.value"))
