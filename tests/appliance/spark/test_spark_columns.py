"""The pieces under the data source, without a SparkSession: records -> Arrow batches against the record
API as oracle (numba kernels and their pure-Python twins), Arrow columns -> byte columns, offset ranges ->
tasks, admission control's shares, and the checkpointed offset's fixed text."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from appliance.client.record_arrays import decode_run
from appliance.spark.arrow_columns import (
    ARROW_SCHEMA,
    _gather,
    _parse_headers,
    byte_column,
    header_columns,
    to_record_batch,
)
from appliance.spark.planning import OffsetRange, split_ranges
from appliance.spark.stream_reader import decode_offsets, encode_offsets, prorate
from storage.batch_builder import build_batch
from storage.batch_header import COMPRESSION_NONE, COMPRESSION_ZSTD
from storage.errors import ConfigError

records = st.lists(st.tuples(
    st.none() | st.binary(max_size=12),  # key
    st.none() | st.binary(max_size=40),  # value
    st.lists(st.tuples(st.text(max_size=5), st.none() | st.binary(max_size=6)), max_size=3),  # headers
    st.integers(0, 2**40),  # timestamp ms
), min_size=1, max_size=30)


@settings(max_examples=60, deadline=None)
@given(st.lists(records, min_size=1, max_size=4), st.sampled_from([COMPRESSION_NONE, COMPRESSION_ZSTD]))
def test_record_batches_hold_what_the_records_say(batches: list[list[tuple]], compression: int) -> None:
    data = b""
    base = 0
    for batch in batches:
        data += build_batch([r[1] for r in batch], keys=[r[0] for r in batch], headers=[r[2] for r in batch],
                            timestamps=[r[3] for r in batch], base_offset=base, compression=compression)
        base += len(batch)
    buffer = np.frombuffer(data, np.uint8)
    run = decode_run(buffer, 0, len(buffer), topic="t", partition=3, min_offset=0, max_offset=1 << 62,
                     max_bytes=1 << 62)
    for chunk in run.chunks:
        table = to_record_batch(chunk)
        assert table.schema.equals(ARROW_SCHEMA)
        rows = table.to_pylist()
        micros = table.column("timestamp").cast(pa.int64()).to_pylist()
        for row, micro, expected in zip(rows, micros, chunk.records(), strict=True):
            assert (row["key"], row["value"], row["topic"], row["partition"], row["offset"]) == (
                expected.key, expected.value, "t", 3, expected.offset)
            assert micro == expected.timestamp * 1000 and row["timestampType"] == 0
            assert [(h["key"], h["value"]) for h in row["headers"]] == list(expected.headers)


def test_the_kernels_and_their_python_twins_agree_and_refuse_truncated_headers() -> None:
    data = np.frombuffer(b"..abc.hello..xy", np.uint8)
    positions = np.array([2, 6, 0, 13], np.int64)
    lengths = np.array([3, 5, -1, 2], np.int32)
    for kernel in (_gather, _gather.py_func):
        out = np.zeros(10, np.uint8)
        offsets = np.zeros(5, np.int32)
        assert kernel(data, positions, lengths, out, offsets) == 10
        assert out.tobytes() == b"abchelloxy" and offsets.tolist() == [0, 3, 8, 8, 10]
    # two headers: "k" -> "vv" and "e" -> null, as zig-zag varints (1 -> 2, 2 -> 4, -1 -> 1)
    encoded = np.frombuffer(bytes([2]) + b"k" + bytes([4]) + b"vv" + bytes([2]) + b"e" + bytes([1]), np.uint8)
    def outputs() -> list[np.ndarray]:
        return [np.zeros(2, np.int64), np.zeros(2, np.int32), np.zeros(2, np.int64), np.zeros(2, np.int32)]

    for kernel in (_parse_headers, _parse_headers.py_func):
        found = outputs()
        count = kernel(encoded, np.array([0], np.int64), np.array([2], np.int32), *found)
        assert count == 2
        assert [f.tolist() for f in found] == [[1, 6], [1, 1], [3, 8], [2, -1]]
        for cut in range(1, len(encoded)):  # every truncation is refused, never read past the end
            code = kernel(encoded[:cut], np.array([0], np.int64), np.array([2], np.int32), *outputs())
            assert code < 0


def test_arrow_columns_become_byte_columns_without_copying() -> None:
    values = pa.array([b"a", None, b"ccc", b"", b"dd"], pa.binary()).slice(1)
    column = byte_column(values, "value")
    assert column.nulls is not None and column.nulls.tolist() == [True, False, False, False]
    items = [None if n else bytes(column.data[a:b])
             for n, a, b in zip(column.nulls, column.offsets[:-1], column.offsets[1:], strict=True)]
    assert items == [None, b"ccc", b"", b"dd"]
    large = byte_column(pa.array(["x", "yz"], pa.large_string()), "key")
    assert large.offsets.tolist() == [0, 1, 3] and large.nulls is None
    headers_type = ARROW_SCHEMA.field("headers").type
    last = [{"key": "b", "value": None}, {"key": "c", "value": b"22"}]
    pairs = [[{"key": "a", "value": b"1"}], None, [], last]
    headers = pa.array(pairs, headers_type)
    columns = header_columns(headers.slice(1))
    assert columns.offsets.tolist() == [0, 0, 0, 2]
    assert bytes(columns.keys.data[columns.keys.offsets[0]:columns.keys.offsets[2]]) == b"bc"
    with pytest.raises(Exception, match="expected binary or string"):
        byte_column(pa.array([1, 2]), "value")
    with pytest.raises(Exception, match="a header key is null"):
        header_columns(pa.array([[{"key": None, "value": b"1"}]], headers_type))


ranges = st.lists(st.tuples(st.integers(0, 2), st.integers(0, 10**6), st.integers(0, 5000)), max_size=6,
                  unique_by=lambda r: r[0])


@settings(max_examples=150, deadline=None)
@given(ranges, st.none() | st.integers(1, 40), st.integers(1, 3000))
def test_offset_ranges_cut_into_tasks_cover_each_offset_once(spans: list[tuple[int, int, int]],
                                                             min_partitions: int | None, limit: int) -> None:
    given_ranges = [OffsetRange("t", p, start, start + n, "h:1") for p, start, n in spans]
    tasks = split_ranges(given_ranges, min_partitions, limit)
    assert tasks == split_ranges(given_ranges, min_partitions, limit)  # a replay plans the same tasks
    for p, start, n in spans:
        mine = sorted((t.from_offset, t.until_offset) for t in tasks if t.partition == p)
        covered = [o for a, b in mine for o in range(a, b)]
        assert covered == list(range(start, start + n))
    assert all(0 < t.record_count <= limit for t in tasks)
    total = sum(n for _, _, n in spans)
    if min_partitions is not None:
        assert len(tasks) >= min(min_partitions, total)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.tuples(st.sampled_from("ab"), st.integers(0, 5)), st.integers(0, 10**6),
                       max_size=8), st.integers(0, 10**6))
def test_admission_shares_sum_to_the_limit(waiting: dict[tuple[str, int], int], limit: int) -> None:
    taken = prorate(waiting, limit)
    assert sum(taken.values()) == min(limit, sum(waiting.values()))
    assert all(0 <= taken[tp] <= waiting[tp] for tp in waiting)
    total = sum(waiting.values())
    if total > limit:
        for tp, n in waiting.items():  # within one record of the proportional share
            assert abs(taken[tp] - n * limit / total) < 1 + 1e-9


def test_checkpointed_offsets_have_one_text() -> None:
    offsets = {("b", 10): 5, ("a", 2): 7, ("b", 9): 1, ("a", 0): 0}
    text = json.dumps(encode_offsets(offsets))
    assert text == '{"a": {"0": 0, "2": 7}, "b": {"9": 1, "10": 5}}'
    assert decode_offsets(json.loads(text)) == offsets
    assert json.dumps(encode_offsets(decode_offsets(json.loads(text)))) == text
    with pytest.raises(ConfigError, match="is not"):
        decode_offsets({"a": 3})
