"""``check_batch``, the hot-path twin of ``validate_batch`` for a buffer holding exactly one batch.

The oracle is ``validate_batch``: ``check_batch(body)`` returns the header exactly when ``validate_batch``
accepts ``body`` and the batch fills it, and a negative code (never an exception) otherwise.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest
from batchgen import build_batch
from hypothesis import given, settings
from hypothesis import strategies as st

from storage.batch_header import (
    BATCH_LENGTH_OFFSET,
    CHECK_BAD_COUNTS,
    CHECK_BAD_CRC,
    CHECK_BAD_LENGTH,
    CHECK_BAD_MAGIC,
    CHECK_TRUNCATED,
    CRC_OFFSET,
    HEADER_SIZE,
    LAST_OFFSET_DELTA_OFFSET,
    MAGIC_OFFSET,
    RECORDS_COUNT_OFFSET,
    BatchHeader,
    check_batch,
    parse_header,
    validate_batch,
)
from storage.errors import CorruptRecordError

GOOD = bytes(build_batch([b"hello", b"", b"world" * 20], producer_id=7))


def _oracle(body: bytes) -> BatchHeader | None:
    try:
        header = validate_batch(body, 0)
    except CorruptRecordError:
        return None
    return header if header.size == len(body) else None


def _check(body: bytes) -> BatchHeader | int:
    return check_batch(memoryview(np.frombuffer(bytearray(body), dtype=np.uint8)))


def _patched(offset: int, fmt: str, value: int) -> bytes:
    out = bytearray(GOOD)
    struct.pack_into(fmt, out, offset, value)
    return bytes(out)


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b"", CHECK_TRUNCATED),
        (GOOD[:HEADER_SIZE - 1], CHECK_TRUNCATED),
        (_patched(MAGIC_OFFSET, ">b", 1), CHECK_BAD_MAGIC),
        (_patched(BATCH_LENGTH_OFFSET, ">i", 10), CHECK_BAD_LENGTH),
        (_patched(BATCH_LENGTH_OFFSET, ">i", len(GOOD)), CHECK_BAD_LENGTH),
        (GOOD[:-1], CHECK_BAD_LENGTH),
        (GOOD + b"\x00", CHECK_BAD_LENGTH),
        (GOOD + GOOD, CHECK_BAD_LENGTH),
        (_patched(LAST_OFFSET_DELTA_OFFSET, ">i", -1), CHECK_BAD_COUNTS),
        (_patched(RECORDS_COUNT_OFFSET, ">i", -3), CHECK_BAD_COUNTS),
        (_patched(CRC_OFFSET, ">I", 12345), CHECK_BAD_CRC),
        (GOOD[:-1] + bytes([GOOD[-1] ^ 1]), CHECK_BAD_CRC),
    ],
    ids=["empty", "short", "magic", "length low", "length high", "truncated", "trailing byte",
         "two batches", "negative delta", "negative count", "stored crc", "data crc"],
)
def test_each_broken_rule_has_its_code(body: bytes, code: int) -> None:
    assert _check(body) == code
    assert _oracle(body) is None


def test_a_valid_batch_gives_its_header_and_stamped_fields_do_not_matter() -> None:
    header = _check(GOOD)
    assert header == parse_header(GOOD) and isinstance(header, BatchHeader)
    assert header.producer_id == 7 and header.records_count == 3
    stamped = _patched(0, ">q", 123_456_789)  # baseOffset and leader epoch are not under the CRC
    stamped = bytes(bytearray(stamped[:12]) + struct.pack(">i", 9) + stamped[16:])
    assert _check(stamped) == parse_header(stamped)


def test_every_truncation_is_refused() -> None:
    for n in range(len(GOOD)):
        code = _check(GOOD[:n])
        assert isinstance(code, int) and code < 0, n


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_agrees_with_validate_batch_on_damaged_batches(data: st.DataObject) -> None:
    body = bytearray(GOOD)
    for _ in range(data.draw(st.integers(0, 3))):
        at = data.draw(st.integers(0, len(body) - 1))
        body[at] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(body) + 4))
    body = body[:cut] + bytes(max(0, cut - len(body)))
    got = _check(bytes(body))
    expected = _oracle(bytes(body))
    if expected is None:
        assert isinstance(got, int) and got < 0
    else:
        assert got == expected


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=200))
def test_garbage_is_a_code_never_an_exception(garbage: bytes) -> None:
    got = _check(garbage)
    assert isinstance(got, int) or got == _oracle(garbage)


def test_inside_a_larger_buffer_each_batch_is_checked_where_it_starts() -> None:
    second = bytes(build_batch([b"x" * 100]))
    buf = memoryview(bytearray(GOOD + second + b"\x00\x00"))  # trailing bytes after the last batch
    first = check_batch(buf, 0, whole=False)
    assert first == parse_header(GOOD)
    assert check_batch(buf, len(GOOD), whole=False) == parse_header(second)
    assert check_batch(buf, 0) == CHECK_BAD_LENGTH  # whole: the batch must end where the buffer ends
    assert check_batch(buf, len(GOOD) + len(second), whole=False) == CHECK_TRUNCATED
    cut = memoryview(bytearray(GOOD + second[:-1]))
    assert check_batch(cut, len(GOOD), whole=False) == CHECK_BAD_LENGTH


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_agrees_with_validate_batch_at_a_position(data: st.DataObject) -> None:
    buf = bytearray(bytes(build_batch([b"pre"])) + GOOD + bytes(data.draw(st.integers(0, 30))))
    for _ in range(data.draw(st.integers(0, 3))):
        at = data.draw(st.integers(0, len(buf) - 1))
        buf[at] = data.draw(st.integers(0, 255))
    buf = buf[: data.draw(st.integers(0, len(buf)))]
    position = data.draw(st.integers(0, len(buf)))
    got = check_batch(memoryview(buf), position, whole=False)
    try:
        expected = validate_batch(bytes(buf), position)
    except CorruptRecordError:
        assert isinstance(got, int) and got < 0
    else:
        assert got == expected
