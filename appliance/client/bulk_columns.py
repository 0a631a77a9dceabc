"""``send_many``'s input as record columns: lists, 2-D arrays or (data, offsets) in, ``RecordColumns`` out.

Nothing here creates one Python object per record: a 2-D ``uint8`` array becomes a column without a copy
(its rows back to back, offsets every ``width`` bytes), slices of a column are views (offsets keep
pointing into the same data), and only grouping by partition copies (one numba gather per column,
:func:`take_records`).  The Spark sink's writer uses the same helpers on the columns it takes from Arrow.

Routing by key (:func:`key_partitions`, :func:`partition_groups`): Kafka's murmur2 partition of each key,
``-1`` for a null key (the producer then gives runs of about a batch of those to its sticky partition),
then the record indexes of each partition in input order, so that a partition's records keep the order
they were given in.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numba
import numpy as np

from appliance.client.accumulator import (
    HEADER_OVERHEAD_BYTES,
    KEY_ESTIMATE_BYTES,
    RECORD_ESTIMATE_BYTES,
    TIMESTAMP_ESTIMATE_BYTES,
    Header,
    as_bytes,
    pack_column,
)
from appliance.client.partitioner import murmur2_column
from storage.batch_builder import ByteColumn, HeaderColumns, RecordColumns

__all__ = [
    "batch_cuts",
    "bulk_columns",
    "key_partitions",
    "partition_groups",
    "record_bounds",
    "slice_columns",
    "take_column",
    "take_records",
    "to_column",
]


def bulk_columns(values: Any, keys: Any, headers: Sequence[Sequence[Header]] | HeaderColumns | None,
                 timestamps: Any) -> RecordColumns:
    """``send_many``'s arguments as checked columns (ValueError / TypeError naming what is wrong)."""
    value_column = to_column(values, "values")
    count = value_column.item_count
    key_column = None if keys is None else to_column(keys, "keys")
    if key_column is not None and key_column.item_count != count:
        raise ValueError(f"send_many: {key_column.item_count} keys for {count} values")
    header_columns = None
    if headers is not None:
        header_columns = headers if isinstance(headers, HeaderColumns) else HeaderColumns.from_lists(headers)
        if len(header_columns.offsets) != count + 1:
            raise ValueError(f"send_many: {len(header_columns.offsets) - 1} header lists for {count} values")
    stamps = None
    if timestamps is not None:
        stamps = np.ascontiguousarray(timestamps, dtype=np.int64)
        if stamps.shape != (count,):
            raise ValueError(f"send_many: timestamps of shape {stamps.shape} for {count} values")
        if count and int(stamps.min()) < 0:
            raise ValueError("send_many: timestamps must be >= 0 (ms since the epoch)")
    return RecordColumns(value_column, key_column, header_columns, stamps)


def key_partitions(keys: ByteColumn, partitions: int) -> np.ndarray:
    """Each record's partition by Kafka's murmur2 of its key (int64); -1 for a null key."""
    targets = np.empty(keys.item_count, np.int64)
    data = np.ascontiguousarray(keys.data, np.uint8)
    offsets = np.ascontiguousarray(keys.offsets, np.int64)
    if murmur2_column(data, offsets, partitions, targets) < 0:
        raise ValueError("send_many: keys offsets decrease or point past the keys data")
    if keys.nulls is not None:
        targets[np.asarray(keys.nulls, bool)] = -1
    return targets


def partition_groups(targets: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """``(partition, record indexes)`` for each partition in ``targets``, the indexes in input order."""
    order = np.argsort(targets, kind="stable")
    bounds = np.flatnonzero(np.diff(targets[order])) + 1
    return [(int(targets[chunk[0]]), chunk) for chunk in np.split(order, bounds)]


def batch_cuts(sizes: np.ndarray, room_bytes: int) -> list[tuple[int, int, int]]:
    """Cut records of (bounded) ``sizes`` into consecutive batches of at most ``room_bytes`` each (at least
    one record each): ``(start, stop, records-section bytes at most)``."""
    ends = np.cumsum(sizes)
    cuts = []
    start = 0
    while start < len(sizes):
        base = int(ends[start - 1]) if start else 0
        stop = max(int(np.searchsorted(ends, base + room_bytes, side="right")), start + 1)
        cuts.append((start, stop, int(ends[stop - 1]) - base))
        start = stop
    return cuts


def record_bounds(columns: RecordColumns) -> np.ndarray:
    """Bytes each record takes in a batch, at most (the ``batch.size`` accounting of
    ``appliance.client.accumulator``), for a whole column set."""
    sizes = np.diff(np.asarray(columns.values.offsets, np.int64)) + RECORD_ESTIMATE_BYTES
    if columns.values.nulls is not None:
        sizes[np.asarray(columns.values.nulls, bool)] = RECORD_ESTIMATE_BYTES
    if columns.keys is not None:
        sizes += np.diff(np.asarray(columns.keys.offsets, np.int64)) + KEY_ESTIMATE_BYTES
    if columns.timestamps is not None:
        sizes += TIMESTAMP_ESTIMATE_BYTES
    headers = columns.headers
    if headers is not None and len(headers.keys.offsets) > 1:
        each = (np.diff(np.asarray(headers.keys.offsets, np.int64))
                + np.diff(np.asarray(headers.values.offsets, np.int64)) + HEADER_OVERHEAD_BYTES)
        cumulative = np.concatenate(([0], np.cumsum(each)))
        index = np.asarray(headers.offsets, np.int64)
        sizes += cumulative[index[1:]] - cumulative[index[:-1]]
    return sizes


def to_column(items: Any, what: str) -> ByteColumn:
    """``send_many`` input as a ByteColumn (no copy for arrays)."""
    if isinstance(items, ByteColumn):
        return items
    if isinstance(items, np.ndarray):
        if items.ndim != 2:
            raise ValueError(
                f"send_many {what}: a numpy array must be 2-D (one record per row), got {items.ndim}-D"
            )
        rows = np.ascontiguousarray(items).view(np.uint8).reshape(len(items), -1)
        width = rows.shape[1]
        return ByteColumn(rows.reshape(-1), np.arange(len(rows) + 1, dtype=np.int64) * width)
    if isinstance(items, tuple) and len(items) == 2 and isinstance(items[1], np.ndarray):
        data, offsets = items
        if isinstance(data, np.ndarray):
            data = data.reshape(-1).view(np.uint8)
        else:
            data = np.frombuffer(data, np.uint8)
        return ByteColumn(data, np.ascontiguousarray(offsets, np.int64))
    if isinstance(items, (list, tuple)):
        converted = [as_bytes(item, what[:-1]) for item in items]
        return pack_column(converted, any(item is None for item in converted))
    raise TypeError(
        f"send_many {what}: expected a list of bytes, a 2-D uint8 array, (data, offsets) or a ByteColumn"
    )


def slice_columns(columns: RecordColumns, start: int, stop: int) -> RecordColumns:
    """Records ``start:stop`` of ``columns`` as views (offsets keep pointing into the same data)."""
    def cut(column: ByteColumn | None) -> ByteColumn | None:
        if column is None:
            return None
        nulls = None if column.nulls is None else column.nulls[start:stop]
        return ByteColumn(column.data, column.offsets[start : stop + 1], nulls)

    headers = None
    if columns.headers is not None:
        headers = HeaderColumns(columns.headers.offsets[start : stop + 1], columns.headers.keys,
                                columns.headers.values)
    values = cut(columns.values)
    assert values is not None
    stamps = None if columns.timestamps is None else columns.timestamps[start:stop]
    return RecordColumns(values, cut(columns.keys), headers, stamps)


@numba.njit(cache=True)
def _gather(data: np.ndarray, offsets: np.ndarray, indexes: np.ndarray, out: np.ndarray,
            out_offsets: np.ndarray) -> None:
    """Copy the strings ``indexes`` of (data, offsets) back to back into ``out``; fill ``out_offsets``."""
    position = 0
    out_offsets[0] = 0
    for n in range(indexes.shape[0]):
        i = indexes[n]
        start = offsets[i]
        for k in range(offsets[i + 1] - start):
            out[position + k] = data[start + k]
        position += offsets[i + 1] - start
        out_offsets[n + 1] = position


def take_column(column: ByteColumn, indexes: np.ndarray) -> ByteColumn:
    """The strings at ``indexes`` of ``column``, copied into a new column."""
    offsets = np.ascontiguousarray(column.offsets, np.int64)
    picks = np.ascontiguousarray(indexes, np.int64)
    lengths = offsets[picks + 1] - offsets[picks]
    out = np.empty(int(lengths.sum()), np.uint8)
    out_offsets = np.empty(len(picks) + 1, np.int64)
    _gather(np.ascontiguousarray(column.data, np.uint8), offsets, picks, out, out_offsets)
    nulls = None if column.nulls is None else np.asarray(column.nulls, np.bool_)[picks]
    return ByteColumn(out, out_offsets, nulls)


def take_records(columns: RecordColumns, indexes: np.ndarray) -> RecordColumns:
    """The records at ``indexes``, copied into new columns (headers included: the header index of each
    picked record, then one gather of their names and one of their values)."""
    headers = None
    if columns.headers is not None:
        h = columns.headers
        index = np.asarray(h.offsets, np.int64)
        counts = index[indexes + 1] - index[indexes]
        header_picks = np.repeat(index[indexes], counts) + (
            np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts))
        new_index = np.zeros(len(indexes) + 1, np.int64)
        np.cumsum(counts, out=new_index[1:])
        headers = HeaderColumns(new_index, take_column(h.keys, header_picks),
                                take_column(h.values, header_picks))
    keys = None if columns.keys is None else take_column(columns.keys, indexes)
    stamps = None if columns.timestamps is None else columns.timestamps[indexes]
    return RecordColumns(take_column(columns.values, indexes), keys, headers, stamps)
