"""Benchmarks: building and decoding a RecordBatch v2 of 10,000 records of 100 bytes.

Run: ``.venv/bin/python -m pytest bench/test_bench_builder.py --benchmark-enable -q``

Each benchmark stores ``records_per_s`` (and ``bytes_per_s``) in its ``extra_info``; the numba kernels are
compiled (or loaded from their cache) before timing.  For scale: a plain Python loop writing the same bytes,
and a numpy copy of the batch's bytes (the memory-bandwidth limit for producing them) measured in the same
run.  Target (issue 2): build >= 10,000,000 records/s.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from storage.batch_builder import ByteColumn, RecordColumns, build, build_batch, build_into, encoded_size
from storage.batch_header import BATCH_HEADER, HEADER_SIZE, LOG_OVERHEAD, MAGIC, write_crc
from storage.batch_reader import decode_batch, iter_records
from storage.compression import COMPRESSION_ZSTD

COUNT = 10_000
VALUE_BYTES = 100
TIMESTAMP_MS = 1_700_000_000_000


def _values() -> np.ndarray:
    """Log-like printable lines, 100 bytes each, so zstd sees realistic data."""
    lines = [
        f'{{"ts":{TIMESTAMP_MS + i},"level":"INFO","svc":"api-{i % 7}","msg":"request {i:08d} ok"}}'.encode()
        for i in range(COUNT)
    ]
    return np.frombuffer(b"".join(line.ljust(VALUE_BYTES)[:VALUE_BYTES] for line in lines), dtype=np.uint8)


@pytest.fixture(scope="module")
def columns() -> RecordColumns:
    offsets = np.arange(COUNT + 1, dtype=np.int64) * VALUE_BYTES
    return RecordColumns(ByteColumn(_values(), offsets))


def _report(benchmark: Any, records: int, size_bytes: int) -> None:
    stats = getattr(benchmark, "stats", None)
    if stats is not None:  # None under --benchmark-disable
        mean_s = stats.stats.mean
        benchmark.extra_info["records_per_s"] = round(records / mean_s)
        benchmark.extra_info["bytes_per_s"] = round(size_bytes / mean_s)


def _run(benchmark: Any, func: Callable[[], object], size_bytes: int, records: int = COUNT) -> None:
    func()  # compile or load the numba kernels, warm the allocator
    benchmark(func)
    _report(benchmark, records, size_bytes)


# ---------------------------------------------------------------------------------------------------------
# Building


def test_build_into_preallocated_buffer(benchmark: Any, columns: RecordColumns) -> None:
    """The producer's path: straight into (ring) memory, header stamped, CRC written."""
    size = encoded_size(columns)
    out = np.zeros(size + 4096, dtype=np.uint8)
    _run(benchmark, lambda: build_into(out, 64, columns, timestamp_ms=TIMESTAMP_MS), size)
    assert build_into(out, 64, columns, timestamp_ms=TIMESTAMP_MS) == size


def test_build_returning_bytes(benchmark: Any, columns: RecordColumns) -> None:
    size = encoded_size(columns)
    _run(benchmark, lambda: build(columns, timestamp_ms=TIMESTAMP_MS), size)


def test_build_zstd_into_preallocated_buffer(benchmark: Any, columns: RecordColumns) -> None:
    out = np.zeros(encoded_size(columns) + 4096, dtype=np.uint8)
    _run(
        benchmark,
        lambda: build_into(out, 0, columns, timestamp_ms=TIMESTAMP_MS, compression=COMPRESSION_ZSTD),
        encoded_size(columns),
    )


def test_build_batch_from_python_lists(benchmark: Any, columns: RecordColumns) -> None:
    """The convenience API: packing Python lists into columns dominates."""
    raw = columns.values.data.tobytes()
    values = [raw[i * VALUE_BYTES : (i + 1) * VALUE_BYTES] for i in range(COUNT)]
    _run(benchmark, lambda: build_batch(values, timestamp_ms=TIMESTAMP_MS), encoded_size(columns))


def _python_varint(value: int, out: bytearray) -> None:
    unsigned = (value << 1) ^ (value >> 63)
    while unsigned >= 0x80:
        out.append((unsigned & 0x7F) | 0x80)
        unsigned >>= 7
    out.append(unsigned)


def _python_loop_batch(values: list[bytes], timestamp_ms: int) -> bytearray:
    """For scale only: the same batch written by a plain Python loop, record by record."""
    out = bytearray(HEADER_SIZE)
    body = bytearray()
    for i, value in enumerate(values):
        body.clear()
        body.append(0)  # attributes
        body.append(0)  # timestampDelta 0
        _python_varint(i, body)  # offsetDelta
        body.append(1)  # null key
        _python_varint(len(value), body)
        body += value
        body.append(0)  # no headers
        _python_varint(len(body), out)
        out += body
    BATCH_HEADER.pack_into(
        out,
        0,
        0,
        len(out) - LOG_OVERHEAD,
        -1,
        MAGIC,
        0,
        0,
        len(values) - 1,
        timestamp_ms,
        timestamp_ms,
        -1,
        -1,
        -1,
        len(values),
    )
    write_crc(out, 0, len(out))
    return out


def test_plain_python_loop_for_scale(benchmark: Any, columns: RecordColumns) -> None:
    raw = columns.values.data.tobytes()
    values = [raw[i * VALUE_BYTES : (i + 1) * VALUE_BYTES] for i in range(COUNT)]
    assert bytes(_python_loop_batch(values, TIMESTAMP_MS)) == build(columns, timestamp_ms=TIMESTAMP_MS)
    _run(benchmark, lambda: _python_loop_batch(values, TIMESTAMP_MS), encoded_size(columns))


def test_memory_copy_of_the_batch_limit(benchmark: Any, columns: RecordColumns) -> None:
    """The physical limit for producing these bytes: copying them (numpy memcpy), same run."""
    batch = np.frombuffer(build(columns, timestamp_ms=TIMESTAMP_MS), dtype=np.uint8)
    out = np.empty_like(batch)
    _run(benchmark, lambda: np.copyto(out, batch), batch.size)


# ---------------------------------------------------------------------------------------------------------
# Decoding


@pytest.fixture(scope="module")
def batch(columns: RecordColumns) -> bytes:
    return build(columns, timestamp_ms=TIMESTAMP_MS)


def test_decode_to_arrays(benchmark: Any, batch: bytes) -> None:
    """The consumer's path: validate (CRC) and decode every record into arrays."""
    _run(benchmark, lambda: decode_batch(batch), len(batch))
    assert len(decode_batch(batch)) == COUNT


def test_decode_to_arrays_zstd(benchmark: Any, columns: RecordColumns) -> None:
    packed = build(columns, timestamp_ms=TIMESTAMP_MS, compression=COMPRESSION_ZSTD)
    _run(benchmark, lambda: decode_batch(packed), encoded_size(columns))


def test_iterate_records_in_python_for_scale(benchmark: Any, batch: bytes) -> None:
    _run(benchmark, lambda: sum(1 for _ in iter_records(batch)), len(batch))
