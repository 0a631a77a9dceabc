"""Malformed batches: every reader rejects them with a CorruptRecordError that says where and what."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from storage.batch_builder import build_batch
from storage.batch_header import (
    BATCH_HEADER,
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAGIC_OFFSET,
    RECORDS_COUNT_OFFSET,
    parse_header,
    write_crc,
)
from storage.batch_reader import decode_batch, iter_batches, iter_records
from storage.compression import CODECS_BY_NAME, COMPRESSION_ZSTD
from storage.errors import CorruptRecordError
from storage.varint import encode_varint

WHERE = "00000000000000000000.log"


def _valid(compression: int = 0) -> bytes:
    return build_batch(
        [b"value-0", None, b"value-2" * 20],
        keys=[b"k0", b"k1", None],
        headers=[[("h", b"v")], [], [("a", None), ("b", b"")]],
        timestamps=[1000, 1001, 999],
        base_offset=100,
        compression=compression,
    )


def _with_records(records: bytes, count: int, compression: int = 0) -> bytes:
    """A batch around a raw records section, with a correct CRC so that the record checks are reached."""
    batch = bytearray(HEADER_SIZE + len(records))
    BATCH_HEADER.pack_into(
        batch,
        0,
        500,
        len(batch) - LOG_OVERHEAD,
        0,
        2,
        0,
        compression,
        max(count - 1, 0),
        1000,
        1000,
        -1,
        -1,
        -1,
        count,
    )
    batch[HEADER_SIZE:] = records
    write_crc(batch, 0, len(batch))
    return bytes(batch)


def _record(body: bytes) -> bytes:
    return encode_varint(len(body)) + body


def _body(
    *,
    ts: bytes = b"\x00",
    offset: bytes = b"\x00",
    key: bytes = b"\x01",
    value: bytes = b"\x02v",
    headers: bytes = b"\x00",
) -> bytes:
    return b"\x00" + ts + offset + key + value + headers


def _all_readers_reject(batch: bytes, pattern: str) -> list[str]:
    """decode_batch, iter_records (both decoders) and iter_batches-level checks raise, matching pattern."""
    messages = []
    with pytest.raises(CorruptRecordError, match=pattern) as from_arrays:
        decode_batch(batch, where=WHERE)
    messages.append(str(from_arrays.value))
    with pytest.raises(CorruptRecordError, match=pattern) as from_iterator:
        list(iter_records(batch, where=WHERE))
    messages.append(str(from_iterator.value))
    for message in messages:
        assert message.startswith(WHERE + ": ")
    return messages


# ---------------------------------------------------------------------------------------------------------
# Header-level faults (magic, length, CRC)


def test_wrong_magic() -> None:
    batch = bytearray(_valid())
    batch[MAGIC_OFFSET] = 1
    _all_readers_reject(bytes(batch), r"position 0 \(base offset 100\): magic 1, expected 2")
    with pytest.raises(CorruptRecordError, match="magic 1, expected 2"):
        list(iter_batches(bytes(batch), where=WHERE, allow_truncated_tail=True))


def test_length_below_a_header_and_past_the_buffer() -> None:
    short = bytearray(_valid())
    BATCH_HEADER.pack_into(short, 0, *(parse_header(short)._replace(batch_length=20)))
    _all_readers_reject(bytes(short), "batchLength 20 gives 32 bytes, minimum 61")
    long = bytearray(_valid())
    BATCH_HEADER.pack_into(long, 0, *(parse_header(long)._replace(batch_length=len(long))))
    _all_readers_reject(bytes(long), f"truncated record batch at position 0: {len(long)} bytes left")


def test_bad_crc_names_stored_and_computed() -> None:
    batch = bytearray(_valid())
    batch[-1] ^= 0x01
    messages = _all_readers_reject(
        bytes(batch),
        r"position 0 \(offsets 100\.\.102\): stored CRC 0x[0-9a-f]{8}, "
        r"computed 0x[0-9a-f]{8}",
    )
    assert messages[0] == messages[1]
    # Without CRC checking the damage (inside a value) passes: the option is honoured.
    assert len(decode_batch(bytes(batch), verify_crc=False)) == 3


@pytest.mark.parametrize("compression", [0, COMPRESSION_ZSTD])
def test_every_truncation_of_a_valid_batch_is_rejected(compression: int) -> None:
    batch = _valid(compression)
    for cut in range(len(batch)):
        prefix = batch[:cut]
        with pytest.raises(CorruptRecordError, match=r"truncated record batch at position 0|buffer ends"):
            decode_batch(prefix)
        with pytest.raises(CorruptRecordError, match=r"truncated record batch at position 0|buffer ends"):
            list(iter_records(prefix))
        iterator = iter_batches(prefix, allow_truncated_tail=True)
        assert list(iterator) == []
        assert (iterator.position, iterator.truncated_tail_bytes) == (0, cut)
        if cut:
            with pytest.raises(
                CorruptRecordError, match=f"truncated record batch at position 0: {cut} bytes"
            ):
                list(iter_batches(prefix))


def test_truncated_tail_after_whole_batches_is_distinguishable() -> None:
    first = _valid()
    second = build_batch([b"x"], base_offset=103, timestamp_ms=5)
    fetched = first + second + first[:40]
    iterator = iter_batches(fetched, allow_truncated_tail=True)
    assert [position for position, _ in iterator] == [0, len(first)]
    assert iterator.position == len(first) + len(second)
    assert iterator.truncated_tail_bytes == 40
    strict = iter_batches(fetched, where=WHERE)
    with pytest.raises(
        CorruptRecordError,
        match=f"{WHERE}: truncated record batch at position "
        f"{len(first) + len(second)}: 40 bytes left, the batch needs",
    ):
        list(strict)
    assert strict.position == len(first) + len(second)


@pytest.mark.parametrize(
    "garbage", [b"\x00" * 12, b"\xff" * 80, b"garbage that is long enough to be a header"]
)
def test_trailing_garbage_is_an_error_naming_its_position(garbage: bytes) -> None:
    batch = _valid()
    iterator = iter_batches(batch + garbage, where=WHERE, allow_truncated_tail=True)
    assert next(iterator)[0] == 0
    with pytest.raises(CorruptRecordError, match=f"{WHERE}: record batch at position {len(batch)}"):
        next(iterator)
    assert iterator.position == len(batch)
    # The batch itself still decodes: readers of one batch look only at its bytes.
    assert len(decode_batch(batch + garbage)) == 3


# ---------------------------------------------------------------------------------------------------------
# Record-level faults (CRC correct, records malformed): both decoders give the same message.

GOOD = _record(_body())


@pytest.mark.parametrize(
    ("records", "count", "pattern"),
    [
        # a record's declared length runs past the data: truncated records
        (
            GOOD + encode_varint(40) + b"\x00\x00\x00",
            2,
            r"record 1 of 2 at position \d+: .*truncated records",
        ),
        # absurd varints: record length, timestamp delta, offset delta, key length
        (b"\xff\xff\xff\xff\xff\x01" + GOOD, 1, "record 0 of 1 at position 61: a varint is longer"),
        (_record(_body(ts=b"\xff" * 10 + b"\x01")), 1, "record 0 of 1 at position 63: a varint is longer"),
        (_record(_body(offset=b"\xff\xff\xff\xff\x7f")), 1, "at position 64: a varint is longer"),
        (_record(_body(key=b"\x80\x80\x80\x80\x80\x01")), 1, "at position 65: a varint is longer"),
        # negative lengths other than -1
        (_record(_body(key=encode_varint(-2))), 1, "at position 65: negative length"),
        (_record(_body(value=encode_varint(-5))), 1, "at position 66: negative length"),
        (encode_varint(-3) + GOOD, 1, "at position 61: negative length"),
        (
            _record(_body(headers=encode_varint(1) + encode_varint(-1) + b"\x00")),
            1,
            "at position 69: negative len",
        ),
        (_record(_body(headers=encode_varint(-1))), 1, "at position 68: negative header count"),
        # fields past the record, record length not matching its fields
        (_record(_body(value=encode_varint(50) + b"v")), 1, "at position 66: a field runs past"),
        (
            _record(_body(headers=b"\x02\x02h\x80")),
            1,
            "at position 71: a varint runs past the end of its record",
        ),
        (_record(_body() + b"\x00"), 1, "at position 69: the record's fields end before its declared length"),
        (_record(b""), 1, "record 0 of 1 at position 62: a field runs past"),
        # records count not matching the data
        (GOOD + GOOD, 1, "record 1 of 1 at position 69: bytes left over after the last record"),
        (GOOD, 3, "record 1 of 3 at position 69: the records end before recordsCount"),
        (b"", 2**31 - 1, f"record 0 of {2**31 - 1} at position 61: the records end before"),
    ],
)
def test_malformed_records_are_rejected_identically(records: bytes, count: int, pattern: str) -> None:
    batch = _with_records(records, count)
    from_arrays, from_iterator = _all_readers_reject(batch, pattern)
    assert from_arrays == from_iterator
    assert re.search(r"record batch at position 0 \(offsets 500\.\.", from_arrays)


def test_malformed_records_inside_zstd_name_decompressed_byte() -> None:
    import zstandard

    records = GOOD + GOOD
    batch = _with_records(zstandard.ZstdCompressor().compress(records), 1, COMPRESSION_ZSTD)
    from_arrays, from_iterator = _all_readers_reject(
        batch, "record 1 of 1 at byte 8 of the decompressed records"
    )
    assert from_arrays == from_iterator


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_a_garbage_payload_under_a_valid_crc_names_the_batch_and_the_codec(codec: str) -> None:
    garbage = b"\x28\xb5\x2f\xfd\x04\x22\x4d\x18 this is not compressed data \xff\xff\xff\xff" * 3
    batch = _with_records(garbage, 3, CODECS_BY_NAME[codec])
    messages = _all_readers_reject(
        batch, rf"record batch at position 0 \(offsets 500\.\.502\): not valid {codec} data: "
    )
    assert messages[0] == messages[1]


def test_truncated_compressed_payloads_and_unknown_codecs() -> None:
    for codec in ("gzip", "snappy", "lz4", "zstd"):
        valid = _valid(CODECS_BY_NAME[codec])
        cut = _with_records(valid[HEADER_SIZE:-4], 3, CODECS_BY_NAME[codec])
        _all_readers_reject(cut, f"not valid {codec} data: .*(truncated|corrupt|past|holds)")
    for codec in (5, 7):
        batch = _with_records(b"\x00" * 10, 1, codec)
        _all_readers_reject(batch, f"unsupported compression codec {codec} \\(unknown\\({codec}")


def test_negative_counts_in_the_header() -> None:
    batch = bytearray(_valid())
    batch[RECORDS_COUNT_OFFSET : RECORDS_COUNT_OFFSET + 4] = (-1).to_bytes(4, "big", signed=True)
    write_crc(batch, 0, len(batch))
    _all_readers_reject(bytes(batch), "recordsCount -1")


# ---------------------------------------------------------------------------------------------------------
# Fuzz: only CorruptRecordError escapes, and the two decoders agree.


def _outcome(read: object) -> tuple[str, object]:
    try:
        return ("ok", read())  # type: ignore[operator]
    except CorruptRecordError as exc:
        return ("error", str(exc))


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_fuzzed_records_sections_decoders_agree(data: st.DataObject) -> None:
    records = bytearray(_valid()[HEADER_SIZE:])
    for _ in range(data.draw(st.integers(min_value=1, max_value=4))):
        at = data.draw(st.integers(min_value=0, max_value=len(records) - 1))
        records[at] = data.draw(st.integers(min_value=0, max_value=255))
    cut = data.draw(st.integers(min_value=0, max_value=len(records)))
    count = data.draw(st.sampled_from([3, 2, 4, 0]))
    batch = _with_records(bytes(records[:cut]), count)
    from_arrays = _outcome(lambda: list(decode_batch(batch).records()))
    from_iterator = _outcome(lambda: list(iter_records(batch)))
    assert from_arrays == from_iterator


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_garbage_raises_only_corrupt_record_error(garbage: bytes) -> None:
    for read in (
        lambda: decode_batch(garbage),
        lambda: list(iter_records(garbage)),
        lambda: list(iter_batches(garbage)),
        lambda: list(iter_batches(garbage, allow_truncated_tail=True)),
        lambda: list(iter_batches(garbage, verify_crc=False)),
    ):
        _outcome(read)
