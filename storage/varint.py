"""Zig-zag variable-length integers, as Kafka's records use them (protobuf's encoding).

A value ``v`` is first zig-zag mapped to an unsigned ``u`` (0, -1, 1, -2, ... -> 0, 1, 2, 3, ...) so that
small negative numbers stay short, then written least significant group first, 7 bits per byte, the high
bit of each byte saying "another byte follows"::

    v = 300  ->  u = 600 = 0b100_1011000  ->  [1_1011000] [0_0000100]  ->  d8 04

A *varint* holds an int32 and takes at most 5 bytes; a *varlong* holds an int64 and takes at most 10.  A
longer encoding, or a last byte carrying bits past the type's width, is corrupt ("absurd"), never wrapped.

How the arithmetic stays inside int64 (so a numba kernel and its pure-Python twin compute the same
thing): ``u`` does not fit an int64 for every int64 ``v`` (``u`` of ``-2**63`` is ``2**64 - 1``), so ``u``
is never formed.  It is split as ``u = 2 * half + sign`` where ``half = v`` for ``v >= 0`` and ``half = ~v``
(that is ``-v - 1``) for ``v < 0``; ``half`` is always in ``[0, 2**63)``.  The first byte carries ``sign``
and the low 6 bits of ``half``; every further byte carries 7 more bits of ``half``.  Decoding rebuilds
``half`` the same way.

Hot-path helpers (``read_*``/``write_*``/``size_of_*``) are numba functions that return a position,
negative on error (``VARINT_TOO_LONG``, ``VARINT_TRUNCATED``); kernels inline them.  ``parse_varint`` is
their pure-Python twin for any buffer (same codes); ``decode_varint``/``decode_varlong`` raise
:class:`CorruptRecordError` naming the byte position instead.
"""

from __future__ import annotations

import sys

import numba
import numpy as np

from storage.errors import CorruptRecordError
from storage.llvm_arrays import load_word

__all__ = [
    "MAX_VARINT_BYTES",
    "MAX_VARLONG_BYTES",
    "VARINT_TOO_LONG",
    "VARINT_TRUNCATED",
    "decode_varint",
    "decode_varlong",
    "encode_varint",
    "parse_varint",
    "read_varint",
    "read_varint_call",
    "read_varint_quick",
    "read_varlong",
    "read_varlong_call",
    "short_varint",
    "size_of_varint",
    "size_of_varlong",
    "varint_error",
    "write_varint",
]

MAX_VARINT_BYTES = 5  # int32: 32 bits in 7-bit groups
MAX_VARLONG_BYTES = 10  # int64: 64 bits in 7-bit groups

# Named negative codes returned in place of a position.
VARINT_TRUNCATED = -1  # the buffer ends inside the varint
VARINT_TOO_LONG = -2  # more bytes than the type allows, or bits past its width

_LITTLE_ENDIAN = sys.byteorder == "little"
_CONTINUE = np.uint64(0x80)  # a byte's "another byte follows" bit
_GROUP = np.uint64(0x7F)  # a byte's 7 bits of the value
_SECOND_CONTINUES = np.uint64(0x8000)  # the second byte's "another follows" bit, in a little-endian word
_SECOND_GROUP = np.uint64(0x7F << 7)  # the second byte's 7 bits, in place, once the word is shifted by 1

# Bits the last allowed byte may carry: 32 - 28 = 4 for int32, 64 - 63 = 1 for int64.
_VARINT_LAST_BYTE_MAX = 0x0F
_VARLONG_LAST_BYTE_MAX = 0x01


@numba.njit(cache=True, inline="always")
def size_of_varint(value: int) -> int:
    """Bytes taken by the zig-zag encoding of ``value`` (varint and varlong encode alike)."""
    half = value if value >= 0 else ~value
    rest = half >> 6
    size = 1
    while rest != 0:
        size += 1
        rest >>= 7
    return size


size_of_varlong = size_of_varint  # same encoding, wider range


@numba.njit(cache=True, inline="always")
def write_varint(out: np.ndarray, position: int, value: int) -> int:
    """Write the zig-zag encoding of ``value`` at ``position``; return the position after it.

    The caller has checked that ``size_of_varint(value)`` bytes fit.
    """
    sign = 0
    half = value
    if value < 0:
        sign = 1
        half = ~value
    group = ((half & 0x3F) << 1) | sign
    rest = half >> 6
    while rest != 0:
        out[position] = group | 0x80
        position += 1
        group = rest & 0x7F
        rest >>= 7
    out[position] = group
    return position + 1


@numba.njit(cache=True, inline="always")
def _read_zigzag(
    buf: np.ndarray, position: int, end: int, max_bytes: int, last_byte_max: int
) -> tuple[int, int]:
    """Shared decoder: return (value, next position), or (0, negative code).

    Written as a bounded ``for`` loop with the width check after it: numba compiles the obvious
    ``while`` loop, or a check inside the loop, an order of magnitude slower (docs/storage.md).
    """
    if position >= end:
        return 0, VARINT_TRUNCATED
    first = np.int64(buf[position])
    half = (first & 0x7F) >> 1
    position += 1
    byte = first
    shift = 6
    for _ in range(max_bytes - 1):
        if byte < 0x80:
            break
        if position >= end:
            return 0, VARINT_TRUNCATED
        byte = np.int64(buf[position])
        position += 1
        half |= (byte & 0x7F) << shift
        shift += 7
    if shift == 7 * max_bytes - 1 and byte > last_byte_max:  # read max_bytes: the last may hold few bits
        return 0, VARINT_TOO_LONG
    value = half if first & 1 == 0 else ~half
    return int(value), position


@numba.njit(cache=True, inline="always")
def short_varint(word: np.uint64) -> tuple[int, int]:
    """The varint (or varlong) that starts ``word`` (eight bytes read little-endian), when it takes one
    or two bytes: ``(value, bytes taken)``; ``(0, 0)`` when it is longer (the caller reads it with
    :func:`read_varint`).  Most of a record's varints are that short: a kernel that loads a word at once
    decodes them without a loop."""
    if word & _CONTINUE == 0:
        zigzag = np.int64(word & _GROUP)
        size = 1
    elif word & _SECOND_CONTINUES == 0:
        zigzag = np.int64((word & _GROUP) | ((word >> np.uint64(1)) & _SECOND_GROUP))
        size = 2
    else:
        return 0, 0
    return int((zigzag >> 1) ^ -(zigzag & 1)), size


@numba.njit(cache=True, inline="always")
def read_varint(buf: np.ndarray, position: int, end: int) -> tuple[int, int]:
    """Decode an int32 varint at ``position`` (bytes before ``end``): (value, next position or code)."""
    return _read_zigzag(buf, position, end, MAX_VARINT_BYTES, _VARINT_LAST_BYTE_MAX)


@numba.njit(cache=True, inline="always")
def read_varlong(buf: np.ndarray, position: int, end: int) -> tuple[int, int]:
    """Decode an int64 varlong at ``position`` (bytes before ``end``): (value, next position or code)."""
    return _read_zigzag(buf, position, end, MAX_VARLONG_BYTES, _VARLONG_LAST_BYTE_MAX)


@numba.njit(cache=True)
def read_varint_call(buf: np.ndarray, position: int, end: int) -> tuple[int, int]:
    """:func:`read_varint`, called rather than inlined: a kernel's rare path (numba counts the references
    to an array passed into an inlined loop, an atomic instruction each: ``storage.llvm_arrays``)."""
    return read_varint(buf, position, end)


@numba.njit(cache=True)
def read_varlong_call(buf: np.ndarray, position: int, end: int) -> tuple[int, int]:
    """:func:`read_varlong`, called rather than inlined (as :func:`read_varint_call`)."""
    return read_varlong(buf, position, end)


@numba.njit(cache=True, inline="always")
def read_varint_quick(buf: np.ndarray, position: int, end: int) -> tuple[int, int]:
    """:func:`read_varint` for a varint likely one or two bytes long: one 8-byte load
    (:func:`short_varint`) where eight bytes from ``position`` lie inside ``buf``; else, or when it is
    longer, :func:`read_varint` itself."""
    if _LITTLE_ENDIAN and position + 8 <= buf.shape[0]:
        value, size = short_varint(load_word(buf, position))  # type: ignore[call-arg]  # numba: typing
        if size:
            return (value, position + size) if position + size <= end else (0, VARINT_TRUNCATED)
    return read_varint_call(buf, position, end)


# ---------------------------------------------------------------------------------------------------------
# Cold path: plain Python, raising.


def varint_error(code: int, kind: str, position: int) -> str:
    """Text for a negative code from ``read_varint``/``read_varlong`` at byte ``position``."""
    if code == VARINT_TRUNCATED:
        return f"{kind} at byte {position} runs past the end of the data"
    if code == VARINT_TOO_LONG:
        limit = MAX_VARINT_BYTES if kind == "varint" else MAX_VARLONG_BYTES
        return f"{kind} at byte {position} is longer than {limit} bytes or overflows its width"
    return f"{kind} at byte {position}: error code {code}"


def encode_varint(value: int) -> bytes:
    """The zig-zag encoding of ``value`` as bytes (any int64)."""
    if not -(1 << 63) <= value < (1 << 63):
        raise ValueError(f"varlong out of int64 range: {value}")
    out = np.zeros(MAX_VARLONG_BYTES, dtype=np.uint8)
    end = write_varint(out, 0, value)
    return out[:end].tobytes()


def parse_varint(
    buf: bytes | bytearray | memoryview, position: int, end: int, wide: bool = False
) -> tuple[int, int]:
    """Pure-Python twin of ``read_varint`` (``wide=False``) / ``read_varlong`` (``wide=True``) for any buffer:
    ``(value, next position)`` or ``(0, negative code)``."""
    max_bytes = MAX_VARLONG_BYTES if wide else MAX_VARINT_BYTES
    last_max = _VARLONG_LAST_BYTE_MAX if wide else _VARINT_LAST_BYTE_MAX
    if position >= end:
        return 0, VARINT_TRUNCATED
    first = buf[position]
    half = (first & 0x7F) >> 1
    at = position + 1
    shift = 6
    byte = first
    count = 1
    while byte & 0x80:
        if at >= end:
            return 0, VARINT_TRUNCATED
        byte = buf[at]
        at += 1
        count += 1
        if count == max_bytes and byte > last_max:
            return 0, VARINT_TOO_LONG
        half |= (byte & 0x7F) << shift
        shift += 7
    return (half if first & 1 == 0 else ~half), at


def _decode(
    buf: bytes | bytearray | memoryview, position: int, end: int | None, wide: bool
) -> tuple[int, int]:
    value, after = parse_varint(buf, position, len(buf) if end is None else end, wide)
    if after < 0:
        raise CorruptRecordError(varint_error(after, "varlong" if wide else "varint", position))
    return value, after


def decode_varint(
    buf: bytes | bytearray | memoryview, position: int, end: int | None = None
) -> tuple[int, int]:
    """Decode an int32 varint at ``position``; return (value, next position).  Raises on corrupt bytes."""
    return _decode(buf, position, end, False)


def decode_varlong(
    buf: bytes | bytearray | memoryview, position: int, end: int | None = None
) -> tuple[int, int]:
    """Decode an int64 varlong at ``position``; return (value, next position).  Raises on corrupt bytes."""
    return _decode(buf, position, end, True)
