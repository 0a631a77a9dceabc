"""``appliance.client.bulk_columns``: ``send_many``'s input as columns, and the copies that group records by
partition, against a plain oracle (lists of bytes); the numba gather kernel against its Python twin."""

from __future__ import annotations

import numpy as np

from appliance.client.bulk_columns import _gather, bulk_columns, take_records
from storage.batch_builder import ByteColumn


def test_take_records_and_its_kernel_match_a_plain_oracle() -> None:
    rng = np.random.default_rng(3)
    values = [bytes(rng.integers(0, 256, int(rng.integers(0, 20)), np.uint8)) for _ in range(200)]
    keys = [None if i % 4 == 0 else b"k%d" % i for i in range(200)]
    headers = [[(f"h{j}", None if j % 2 else b"x" * j) for j in range(i % 3)] for i in range(200)]
    columns = bulk_columns(values, keys, headers, None)
    picks = rng.permutation(200)[:120]
    taken = take_records(columns, picks)
    assert _column_items(taken.values) == [values[i] for i in picks]
    assert _column_items(taken.keys) == [keys[i] for i in picks]
    assert taken.headers is not None
    names = _column_items(taken.headers.keys)
    header_values = _column_items(taken.headers.values)
    index = taken.headers.offsets
    for out, i in enumerate(picks):
        first, last = index[out], index[out + 1]
        pairs = list(zip(names[first:last], header_values[first:last], strict=True))
        assert pairs == [(k.encode(), v) for k, v in headers[i]]
    # the numba kernel's pure-Python twin gathers the same bytes
    column = ByteColumn.from_list(values)
    out = np.empty(sum(len(values[i]) for i in picks), np.uint8)
    out_offsets = np.empty(len(picks) + 1, np.int64)
    _gather.py_func(column.data, column.offsets, picks.astype(np.int64), out, out_offsets)
    assert out.tobytes() == b"".join(values[i] for i in picks)


def _column_items(column: ByteColumn | None) -> list[bytes | None]:
    assert column is not None
    items: list[bytes | None] = []
    for i in range(column.item_count):
        if column.nulls is not None and column.nulls[i]:
            items.append(None)
        else:
            items.append(bytes(column.data[column.offsets[i] : column.offsets[i + 1]]))
    return items
