"""appliance.client.record_arrays: many batches per numba call, against storage's own per-record reader as the
oracle; both kernels' pure-Python twins; malformed input of every kind."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from appliance.client.record_arrays import (
    BAD_LENGTH,
    BAD_MAGIC,
    BAD_OFFSETS,
    STOP_END,
    STOP_MAX_BYTES,
    STOP_MAX_OFFSET,
    STOP_TABLE_FULL,
    STOP_TRUNCATED,
    STOP_UNDECODABLE,
    TABLE_COLUMNS,
    ConsumerRecord,
    _decode_run,
    _scan_batches,
    decode_run,
    scan_batches,
)
from storage.batch_builder import build_batch
from storage.batch_header import BATCH_LENGTH_OFFSET, COMPRESSION_NONE, COMPRESSION_ZSTD, RECORDS_COUNT_OFFSET
from storage.batch_reader import iter_batches, iter_records
from storage.errors import CorruptRecordError

_bytes = st.binary(max_size=30)
_record = st.tuples(st.one_of(st.none(), _bytes), st.one_of(st.none(), _bytes),
                    st.lists(st.tuples(st.text(max_size=4), st.one_of(st.none(), _bytes)), max_size=2))
_batches = st.lists(
    st.tuples(st.lists(_record, min_size=1, max_size=8),
              st.sampled_from([COMPRESSION_NONE, COMPRESSION_ZSTD]),
              st.integers(0, 1), st.booleans()),
    min_size=1, max_size=8,
)  # fmt: skip


def _decode(arr: np.ndarray, **kw: object):  # type: ignore[no-untyped-def]
    args = {"topic": "t", "partition": 0, "min_offset": 0, "max_offset": 1 << 62, "max_bytes": 1 << 40} | kw
    return decode_run(arr, 0, len(arr), **args)  # type: ignore[arg-type]


def make_run(batches: list) -> bytes:  # type: ignore[type-arg]
    out, offset = [], 0
    for records, compression, timestamp_type, control in batches:
        out.append(build_batch([r[1] for r in records], [r[0] for r in records], [r[2] for r in records],
                               [1000 + i for i in range(len(records))], base_offset=offset,
                               compression=compression, timestamp_type=timestamp_type, is_control=control))
        offset += len(records) + 3  # a gap, as compaction leaves
    return b"".join(out)


Row = tuple[int, int, int, bytes | None, bytes | None, tuple]  # type: ignore[type-arg]


def oracle(buf: bytes, min_offset: int = 0) -> list[Row]:
    out = []
    for position, header in iter_batches(buf):
        if header.is_control:
            continue
        for r in iter_records(buf, position):
            if r.offset >= min_offset:
                out.append((r.offset, r.timestamp, header.timestamp_type, r.key, r.value, r.headers))
    return out


def decoded(buf: bytes, **kw: int) -> list[Row]:
    arr = np.frombuffer(buf, dtype=np.uint8)
    args = {"min_offset": 0, "max_offset": 1 << 62, "max_bytes": 1 << 40} | kw
    run = decode_run(arr, 0, len(arr), topic="t", partition=3, **args)
    out = []
    for chunk in run.chunks:
        for r in chunk.records():
            assert (r.topic, r.partition) == ("t", 3)
            out.append((r.offset, r.timestamp, r.timestamp_type, r.key, r.value, r.headers))
        assert [chunk.record(i)[2:] for i in range(len(chunk))] == [tuple(r)[2:] for r in chunk.records()]
    return out


@settings(max_examples=150, deadline=None)
@given(batches=_batches, min_offset=st.integers(0, 60))
def test_decodes_what_storage_reads_record_by_record(batches: list, min_offset: int) -> None:  # type: ignore[type-arg]
    buf = make_run(batches)
    assert decoded(buf, min_offset=min_offset) == oracle(buf, min_offset)


@settings(max_examples=60, deadline=None)
@given(batches=_batches, max_offset=st.integers(0, 80), max_bytes=st.integers(1, 3000))
def test_stops_below_max_offset_and_within_max_bytes(batches: list, max_offset: int, max_bytes: int) -> None:  # type: ignore[type-arg]
    buf = make_run(batches)
    arr = np.frombuffer(buf, dtype=np.uint8)
    run = decode_run(arr, 0, len(arr), topic="t", partition=0, min_offset=0, max_offset=max_offset,
                     max_bytes=max_bytes)
    headers = [h for _, h in iter_batches(buf)]
    taken = headers[: run.batch_count]
    assert all(h.last_offset < max_offset for h in taken)
    if run.batch_count > 1:
        assert sum(h.size for h in taken) <= max_bytes
    if run.batch_count < len(headers):
        nxt = headers[run.batch_count]
        assert run.stop_code in (STOP_MAX_OFFSET, STOP_MAX_BYTES)
        assert nxt.last_offset >= max_offset or sum(h.size for h in taken) + nxt.size > max_bytes
    else:
        assert run.stop_code == STOP_END
    assert run.next_offset == (taken[-1].last_offset + 1 if taken else -1)
    assert run.size_bytes == sum(h.size for h in taken) == run.stop_position


@settings(max_examples=40, deadline=None)
@given(batches=_batches, rows=st.integers(1, 4))
def test_kernels_and_their_python_twins_agree(batches: list, rows: int) -> None:  # type: ignore[type-arg]
    buf = np.frombuffer(make_run(batches), dtype=np.uint8)
    for position, end in ((0, len(buf)), (0, len(buf) - 1), (0, len(buf) // 2)):
        fast, slow = (np.zeros((rows, TABLE_COLUMNS), np.int64) for _ in range(2))
        assert _scan_batches(buf, position, end, 1 << 40, 1 << 40, fast) == \
            _scan_batches.py_func(buf, position, end, 1 << 40, 1 << 40, slow)
        assert (fast == slow).all()
    table = scan_batches(buf, 0, len(buf), max_offset=1 << 40, max_bytes=1 << 40).table
    plain = [i for i in range(len(table)) if table[i, 5] & 0x27 == 0]  # uncompressed, not control
    if not plain:
        return
    row = plain[0]
    total = int(table[row, 4])
    outs = []
    for kernel in (_decode_run, _decode_run.py_func):
        arrays = [np.zeros(total, t) for t in (np.int64, np.int64, np.int8, np.int64, np.int32, np.int64,
                                                 np.int32, np.int64, np.int32)]
        outs.append((kernel(buf, table, row, row + 1, *arrays), arrays))
    assert outs[0][0] == outs[1][0]
    for a, b in zip(outs[0][1], outs[1][1], strict=True):
        assert (a == b).all()


# ----------------------------------------------------------------------------------------- malformed input


def _run() -> bytes:
    return make_run([([(b"k", b"value-%d" % i, [("h", b"x")]) for i in range(3)], COMPRESSION_NONE, 0, False)
                     for _ in range(3)])


def test_every_truncation_is_a_clean_stop_or_a_named_error() -> None:
    buf = _run()
    sizes = [h.size for _, h in iter_batches(buf)]
    for cut in range(len(buf) + 1):
        arr = np.frombuffer(buf[:cut], dtype=np.uint8)
        run = decode_run(arr, 0, cut, topic="t", partition=0, min_offset=0, max_offset=1 << 62,
                         max_bytes=1 << 40)
        whole = sum(1 for i in range(len(sizes)) if sum(sizes[: i + 1]) <= cut)
        assert run.batch_count == whole
        assert run.stop_code == (STOP_END if cut == sum(sizes[:whole]) else STOP_TRUNCATED)


def test_garbage_after_the_last_batch_is_an_error_naming_the_position() -> None:
    buf = _run()
    arr = np.frombuffer(buf + b"\x00" * 7 + b"\xff" * 80, dtype=np.uint8)
    with pytest.raises(CorruptRecordError, match=f"position {len(buf)} .*impossible batchLength"):
        _decode(arr, where="segment X")


@pytest.mark.parametrize(
    ("mutate", "code", "match"),
    [
        (lambda b: b.__setitem__(16, 1), BAD_MAGIC, "magic is not 2"),
        (lambda b: b.__setitem__(slice(BATCH_LENGTH_OFFSET, BATCH_LENGTH_OFFSET + 4), b"\0\0\0\x05"),
         BAD_LENGTH,
         "impossible batchLength"),
        (lambda b: b.__setitem__(slice(RECORDS_COUNT_OFFSET, RECORDS_COUNT_OFFSET + 4), b"\x7f\xff\xff\xff"),
         BAD_LENGTH, "recordsCount"),
    ],
)
def test_bad_headers_are_refused_with_their_code(mutate, code, match) -> None:  # type: ignore[no-untyped-def]
    buf = bytearray(_run())
    mutate(buf)
    arr = np.frombuffer(bytes(buf), dtype=np.uint8)
    table = np.zeros((4, TABLE_COLUMNS), np.int64)
    assert _scan_batches(arr, 0, len(arr), 1 << 62, 1 << 40, table)[2] == code
    with pytest.raises(CorruptRecordError, match=f"segment X: record batch at position 0 .*{match}"):
        _decode(arr, where="segment X")


def test_offsets_going_backwards_are_refused() -> None:
    first = build_batch([b"a", b"b"], base_offset=10)
    second = build_batch([b"c"], base_offset=11)  # overlaps 10..11
    arr = np.frombuffer(first + second, dtype=np.uint8)
    table = np.zeros((4, TABLE_COLUMNS), np.int64)
    assert _scan_batches(arr, 0, len(arr), 1 << 62, 1 << 40, table) == (1, len(first), BAD_OFFSETS)
    with pytest.raises(CorruptRecordError, match=f"position {len(first)} .*offsets go backwards"):
        _decode(arr)


def test_bad_crc_and_bad_records_name_the_batch_and_record() -> None:
    buf = bytearray(_run())
    at = bytes(buf).index(b"value-1")
    buf[at] ^= 0xFF
    arr = np.frombuffer(bytes(buf), dtype=np.uint8)
    with pytest.raises(CorruptRecordError, match=r"position 0 .*stored CRC .* computed"):
        _decode(arr)
    # A record whose length runs past its batch, CRC recomputed so only the record decoder can tell.
    from storage.batch_header import HEADER_SIZE, write_crc

    good = bytearray(build_batch([b"abc"]))
    good[HEADER_SIZE] = 0x7E  # record length varint: 63
    write_crc(good, 0, len(good))
    arr = np.frombuffer(bytes(good), dtype=np.uint8)
    with pytest.raises(CorruptRecordError, match=r"record 0 of 1 .*runs past the end of the records"):
        _decode(arr)


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=300), prefix=st.booleans())
def test_random_bytes_raise_only_corrupt_record_errors(data: bytes, prefix: bool) -> None:
    buf = (_run() if prefix else b"") + data
    arr = np.frombuffer(buf, dtype=np.uint8)
    try:
        _decode(arr,
                   check_crcs=False)
    except CorruptRecordError:
        pass


def test_a_full_table_stops_cleanly_and_the_rest_can_be_read_after() -> None:
    buf = _run()
    arr = np.frombuffer(buf, dtype=np.uint8)
    first = _decode(arr, max_batches=2)
    assert first.stop_code == STOP_TABLE_FULL and first.batch_count == 2
    rest = decode_run(arr, first.stop_position, len(arr), topic="t", partition=0,
                      min_offset=first.next_offset,
                      max_offset=1 << 62, max_bytes=1 << 40)
    assert rest.stop_code == STOP_END and rest.batch_count == 1


def test_record_arrays_api() -> None:
    buf = build_batch([b"v0", None, b"v2"], [None, b"k1", b"k2"], [[], [("a", b"1"), ("b", None)], []],
                      [5, 6, 7])
    arr = np.frombuffer(buf, dtype=np.uint8)
    (chunk,) = decode_run(arr, 0, len(arr), topic="x", partition=1, min_offset=0, max_offset=1 << 62,
                          max_bytes=1 << 40).chunks
    assert len(chunk) == 3 and chunk.next_offset == 3
    assert chunk.keys() == [None, b"k1", b"k2"] and chunk.values() == [b"v0", None, b"v2"]
    assert chunk.headers(1) == (("a", b"1"), ("b", None)) and chunk.headers(0) == ()
    assert chunk.records()[1] == ConsumerRecord("x", 1, 1, 6, 0, b"k1", None, (("a", b"1"), ("b", None)))
    tail = chunk.slice(1)
    assert tail.offsets.tolist() == [1, 2] and tail.values() == [None, b"v2"]
    assert np.shares_memory(tail.data, chunk.data)


@pytest.mark.parametrize("bad_codec", ["none", "lz4"])
def test_a_batch_that_does_not_decode_ends_the_run_before_it_and_then_raises(bad_codec: str) -> None:
    from storage.batch_header import BATCH_HEADER, HEADER_SIZE, LOG_OVERHEAD, stamp, write_crc
    from storage.compression import CODECS_BY_NAME

    good = [bytearray(build_batch([b"v%d" % i for i in range(n)], timestamp_ms=1)) for n in (3, 2)]
    records = b"\x0e\x00\x00\x00\x01\x05" + b"x" * 9 if bad_codec == "none" else b"not lz4 at all"
    bad = bytearray(HEADER_SIZE + len(records))
    BATCH_HEADER.pack_into(bad, 0, 0, len(bad) - LOG_OVERHEAD, 0, 2, 0, CODECS_BY_NAME[bad_codec], 0, 5, 5,
                           -1, -1, -1, 1)
    bad[HEADER_SIZE:] = records
    write_crc(bad, 0, len(bad))
    after = bytearray(build_batch([b"after"], timestamp_ms=2))
    for batch, base in ((good[0], 0), (good[1], 3), (bad, 5), (after, 6)):
        stamp(batch, 0, base, partition_leader_epoch=0)
    buf = np.frombuffer(bytes(good[0] + good[1] + bad + after), dtype=np.uint8)
    run = decode_run(buf, 0, len(buf), topic="t", partition=0, min_offset=1, max_offset=1 << 62,
                     max_bytes=1 << 30, where="t-0")
    assert [o for c in run.chunks for o in c.offsets.tolist()] == [1, 2, 3, 4]  # what precedes it
    assert (run.next_offset, run.stop_code, run.batch_count) == (5, STOP_UNDECODABLE, 2)
    assert run.stop_position == len(good[0]) + len(good[1])
    with pytest.raises(CorruptRecordError, match=r"^t-0: record batch at position \d+ \(offsets 5\.\.5\): "
                       r".*; the records cannot be read: seek to offset 6 to skip this batch$"):
        decode_run(buf, run.stop_position, len(buf), topic="t", partition=0, min_offset=5,
                   max_offset=1 << 62, max_bytes=1 << 30, where="t-0")
