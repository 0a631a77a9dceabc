"""Tiny builder of valid, uncompressed RecordBatch v2 batches for the storage tests.

Independent of the project's record builder on purpose: the log must not depend on it, and its tests
should not either.  Records are minimal but valid Kafka v2 records (null key, a value, no headers).
"""

from __future__ import annotations

from collections.abc import Sequence

from storage.batch_header import BATCH_HEADER, HEADER_SIZE, LOG_OVERHEAD, MAGIC, write_crc

DEFAULT_TIMESTAMP_MS = 1_700_000_000_000


def _varint(value: int) -> bytes:
    zigzag = (value << 1) ^ (value >> 63)
    out = bytearray()
    while True:
        byte = zigzag & 0x7F
        zigzag >>= 7
        if zigzag:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _record(offset_delta: int, timestamp_delta: int, value: bytes) -> bytes:
    body = (
        b"\x00"  # attributes
        + _varint(timestamp_delta)
        + _varint(offset_delta)
        + _varint(-1)  # null key
        + _varint(len(value))
        + value
        + _varint(0)  # no headers
    )
    return _varint(len(body)) + body


def build_batch(
    values: Sequence[bytes],
    *,
    base_offset: int = 0,
    timestamp_ms: int = DEFAULT_TIMESTAMP_MS,
    timestamps_ms: Sequence[int] | None = None,
    leader_epoch: int = -1,
    producer_id: int = -1,
) -> bytearray:
    """One valid batch holding ``values`` (at least one), offsets ``base_offset ..``."""
    assert values, "a batch holds at least one record"
    stamps = list(timestamps_ms) if timestamps_ms is not None else [timestamp_ms] * len(values)
    first = stamps[0]
    pairs = enumerate(zip(stamps, values, strict=True))
    records = b"".join(_record(i, ts - first, v) for i, (ts, v) in pairs)
    size = HEADER_SIZE + len(records)
    buf = bytearray(size)
    BATCH_HEADER.pack_into(
        buf, 0, base_offset, size - LOG_OVERHEAD, leader_epoch, MAGIC, 0, 0, len(values) - 1,
        first, max(stamps), producer_id, -1, -1, len(values),
    )
    buf[HEADER_SIZE:] = records
    write_crc(buf, 0, size)
    return buf


def batch_of_size(size: int, *, base_offset: int = 0, timestamp_ms: int = DEFAULT_TIMESTAMP_MS,
                  records: int = 1) -> bytearray:
    """A valid batch of exactly ``size`` bytes with ``records`` records; padding goes in the values."""
    overhead = len(build_batch([b""] * records, timestamp_ms=timestamp_ms))
    extra = size - overhead
    assert extra >= 0, f"size {size} < minimum {overhead}"
    # Value lengths grow the varint prefix; adjust until exact.
    for fudge in range(0, 8):
        values = [b""] * records
        values[0] = b"x" * max(0, extra - fudge)
        batch = build_batch(values, base_offset=base_offset, timestamp_ms=timestamp_ms)
        if len(batch) == size:
            return batch
    raise AssertionError(f"cannot build a batch of exactly {size} bytes")
