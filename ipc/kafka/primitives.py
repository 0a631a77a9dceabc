"""The Kafka protocol's primitive types: how each is laid out, read and written.

Every multi-byte integer is big-endian (network order)::

    int8  int16  int32  int64  uint32        1, 2, 4, 8, 4 bytes, two's complement (uint32: unsigned)
    bool                                     int8, 0 = false, anything else = true
    string           int16 N, N bytes UTF-8             N >= 0
    nullable string  int16 N, N bytes UTF-8             N = -1: null
    bytes            int32 N, N bytes                   N >= 0
    nullable bytes   int32 N, N bytes                   N = -1: null  (the ``records`` fields)
    array            int32 N, N elements                N = -1: null (only where the schema allows)

Flexible versions (KIP-482) use "compact" forms whose length is an *unsigned varint* holding N + 1
(0 = null), and end every structure with a tagged-fields section::

    unsigned varint   7 bits per byte, least significant group first, high bit = "more follows"
                      (at most 5 bytes for 32-bit values, 10 for 64-bit)
    varint / varlong  the same after zig-zag mapping (0, -1, 1, -2 -> 0, 1, 2, 3), as records use
    compact string    uvarint N+1, N bytes UTF-8
    compact bytes     uvarint N+1, N bytes
    compact array     uvarint N+1, N elements
    tagged fields     uvarint count, then count x (uvarint tag, uvarint size, size bytes), tags ascending

Readers have the shape ``read_x(mv, pos) -> (value, new_pos)`` over a ``memoryview`` of unsigned bytes and
raise :class:`ProtocolError` naming the position, what was expected and what was found.  Writers append to
a ``bytearray``.  Bulk bytes are sliced, never looped over.
"""

from __future__ import annotations

import struct

from storage.errors import ProtocolError

__all__ = [
    "BOOL",
    "INT8",
    "INT16",
    "INT32",
    "INT64",
    "UINT32",
    "check_available",
    "read_array_length",
    "read_bytes",
    "read_compact_array_length",
    "read_compact_bytes",
    "read_compact_string",
    "read_int16",
    "read_int32",
    "read_nullable_string",
    "read_string",
    "read_tagged_fields",
    "read_uvarint",
    "read_uvarlong",
    "read_varint",
    "read_varlong",
    "write_array_length",
    "write_bytes",
    "write_compact_array_length",
    "write_compact_bytes",
    "write_compact_string",
    "write_int16",
    "write_int32",
    "write_string",
    "write_tagged_fields",
    "write_uvarint",
    "write_varint",
]

INT8 = struct.Struct(">b")
INT16 = struct.Struct(">h")
INT32 = struct.Struct(">i")
INT64 = struct.Struct(">q")
UINT32 = struct.Struct(">I")
BOOL = struct.Struct(">?")

_MAX_UVARINT_BYTES = 5  # 32-bit values
_MAX_UVARLONG_BYTES = 10  # 64-bit values


def check_available(mv: memoryview, pos: int, need_bytes: int, what: str) -> int:
    """Return ``pos + need_bytes`` or raise if the buffer ends before it."""
    end = pos + need_bytes
    if end > len(mv):
        raise ProtocolError(
            f"truncated {what}: needs {need_bytes} bytes at position {pos}, only {len(mv) - pos} remain"
        )
    return end


def read_int16(mv: memoryview, pos: int) -> tuple[int, int]:
    end = check_available(mv, pos, 2, "int16")
    return INT16.unpack_from(mv, pos)[0], end


def read_int32(mv: memoryview, pos: int) -> tuple[int, int]:
    end = check_available(mv, pos, 4, "int32")
    return INT32.unpack_from(mv, pos)[0], end


def write_int16(out: bytearray, value: int) -> None:
    out += INT16.pack(value)


def write_int32(out: bytearray, value: int) -> None:
    out += INT32.pack(value)


# -- variable-length integers ----------------------------------------------------------------------------


def _read_unsigned(mv: memoryview, pos: int, max_bytes: int, what: str) -> tuple[int, int]:
    """Shared body of the varint readers: at most ``max_bytes`` bytes, and the value must fit the type's
    width (32 bits for 5 bytes, 64 for 10) -- a longer or overflowing encoding is refused, never wrapped."""
    width_bits = 32 if max_bytes == _MAX_UVARINT_BYTES else 64
    value = 0
    shift = 0
    limit = len(mv)
    for i in range(max_bytes):
        if pos + i >= limit:
            raise ProtocolError(f"truncated {what} at position {pos}: input ends after {i} bytes")
        byte = mv[pos + i]
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            if value >> width_bits:
                raise ProtocolError(f"{what} at position {pos} overflows {width_bits} bits")
            return value, pos + i + 1
        shift += 7
    raise ProtocolError(f"{what} at position {pos} is longer than {max_bytes} bytes")


def read_uvarint(mv: memoryview, pos: int) -> tuple[int, int]:
    """Unsigned varint holding a 32-bit value (lengths, counts, tags)."""
    return _read_unsigned(mv, pos, _MAX_UVARINT_BYTES, "unsigned varint")


def read_uvarlong(mv: memoryview, pos: int) -> tuple[int, int]:
    return _read_unsigned(mv, pos, _MAX_UVARLONG_BYTES, "unsigned varlong")


def read_varint(mv: memoryview, pos: int) -> tuple[int, int]:
    """Zig-zag varint (int32)."""
    u, end = _read_unsigned(mv, pos, _MAX_UVARINT_BYTES, "varint")
    return (u >> 1) ^ -(u & 1), end


def read_varlong(mv: memoryview, pos: int) -> tuple[int, int]:
    """Zig-zag varlong (int64)."""
    u, end = _read_unsigned(mv, pos, _MAX_UVARLONG_BYTES, "varlong")
    return (u >> 1) ^ -(u & 1), end


def write_uvarint(out: bytearray, value: int) -> None:
    if value < 0 or value >> 64:
        raise ValueError(f"unsigned varint out of range: {value}")
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def write_varint(out: bytearray, value: int) -> None:
    """Zig-zag varint/varlong (the width is the caller's: int32 or int64 range)."""
    if not -(1 << 63) <= value < (1 << 63):
        raise ValueError(f"varlong out of range: {value}")
    write_uvarint(out, (value << 1) ^ (value >> 63))


# -- lengths ---------------------------------------------------------------------------------------------


def read_array_length(mv: memoryview, pos: int, min_element_bytes: int, nullable: bool) -> tuple[int, int]:
    """int32 element count; -1 = null (returned as -1 only when ``nullable``).  A count that cannot fit in
    the remaining bytes (each element needs at least ``min_element_bytes``) is refused before any list is
    allocated."""
    end = check_available(mv, pos, 4, "array length")
    n = INT32.unpack_from(mv, pos)[0]
    return _check_count(mv, pos, end, n, min_element_bytes, nullable, "array")


def read_compact_array_length(
    mv: memoryview, pos: int, min_element_bytes: int, nullable: bool
) -> tuple[int, int]:
    u, end = read_uvarint(mv, pos)
    return _check_count(mv, pos, end, u - 1, min_element_bytes, nullable, "compact array")


def _check_count(
    mv: memoryview, pos: int, end: int, n: int, min_element_bytes: int, nullable: bool, what: str
) -> tuple[int, int]:
    if n < 0:
        if n == -1 and nullable:
            return -1, end
        expected = ">= 0 or -1" if nullable else ">= 0"
        raise ProtocolError(f"{what} at position {pos}: length {n} (expected {expected})")
    if n * min_element_bytes > len(mv) - end:
        raise ProtocolError(
            f"{what} at position {pos}: {n} elements of >= {min_element_bytes} bytes cannot fit in the "
            f"{len(mv) - end} bytes that remain"
        )
    return n, end


def write_array_length(out: bytearray, n: int) -> None:
    out += INT32.pack(n)


def write_compact_array_length(out: bytearray, n: int) -> None:
    write_uvarint(out, n + 1)


# -- strings and bytes -----------------------------------------------------------------------------------


def _utf8(mv: memoryview, pos: int, end: int) -> str:
    try:
        return str(mv[pos:end], "utf-8")
    except UnicodeDecodeError as e:
        raise ProtocolError(
            f"string at position {pos} is not valid UTF-8: {e.reason} at byte {e.start}"
        ) from None


def read_string(mv: memoryview, pos: int) -> tuple[str, int]:
    """Non-null string (int16 length)."""
    s, end = read_nullable_string(mv, pos)
    if s is None:
        raise ProtocolError(f"string at position {pos}: length -1 (null) where null is not allowed")
    return s, end


def read_nullable_string(mv: memoryview, pos: int) -> tuple[str | None, int]:
    start = check_available(mv, pos, 2, "string length")
    n = INT16.unpack_from(mv, pos)[0]
    if n < 0:
        if n == -1:
            return None, start
        raise ProtocolError(f"string at position {pos}: length {n} (expected >= 0 or -1)")
    end = check_available(mv, start, n, "string")
    return _utf8(mv, start, end), end


def read_compact_string(mv: memoryview, pos: int, nullable: bool) -> tuple[str | None, int]:
    u, start = read_uvarint(mv, pos)
    if u == 0:
        if nullable:
            return None, start
        raise ProtocolError(f"compact string at position {pos}: null where null is not allowed")
    end = check_available(mv, start, u - 1, "compact string")
    return _utf8(mv, start, end), end


def read_bytes(mv: memoryview, pos: int, nullable: bool) -> tuple[memoryview | None, int]:
    """int32-length bytes, returned as a zero-copy slice of ``mv``."""
    start = check_available(mv, pos, 4, "bytes length")
    n = INT32.unpack_from(mv, pos)[0]
    if n < 0:
        if n == -1 and nullable:
            return None, start
        expected = ">= 0 or -1" if nullable else ">= 0"
        raise ProtocolError(f"bytes at position {pos}: length {n} (expected {expected})")
    end = check_available(mv, start, n, "bytes")
    return mv[start:end], end


def read_compact_bytes(mv: memoryview, pos: int, nullable: bool) -> tuple[memoryview | None, int]:
    u, start = read_uvarint(mv, pos)
    if u == 0:
        if nullable:
            return None, start
        raise ProtocolError(f"compact bytes at position {pos}: null where null is not allowed")
    end = check_available(mv, start, u - 1, "compact bytes")
    return mv[start:end], end


def _encode_utf8(value: str) -> bytes:
    data = value.encode("utf-8")
    if len(data) > 0x7FFF:
        raise ValueError(f"string of {len(data)} bytes exceeds the int16 length limit 32767")
    return data


def write_string(out: bytearray, value: str | None) -> None:
    """String or nullable string (int16 length; None -> -1)."""
    if value is None:
        out += INT16.pack(-1)
        return
    data = _encode_utf8(value)
    out += INT16.pack(len(data))
    out += data


def write_compact_string(out: bytearray, value: str | None) -> None:
    if value is None:
        out.append(0)
        return
    data = value.encode("utf-8")
    write_uvarint(out, len(data) + 1)
    out += data


def write_bytes(out: bytearray, value: bytes | bytearray | memoryview | None) -> None:
    if value is None:
        out += INT32.pack(-1)
        return
    out += INT32.pack(len(value) if not isinstance(value, memoryview) else value.nbytes)
    out += value


def write_compact_bytes(out: bytearray, value: bytes | bytearray | memoryview | None) -> None:
    if value is None:
        out.append(0)
        return
    write_uvarint(out, (len(value) if not isinstance(value, memoryview) else value.nbytes) + 1)
    out += value


# -- tagged fields ---------------------------------------------------------------------------------------


def read_tagged_fields(mv: memoryview, pos: int) -> tuple[dict[int, memoryview], int]:
    """The tagged-fields section: ``{tag: raw value bytes}``.  Tags must be strictly ascending and each
    value must lie inside the buffer."""
    count, pos = read_uvarint(mv, pos)
    if count > len(mv) - pos:
        raise ProtocolError(
            f"tagged fields at position {pos}: {count} fields cannot fit in {len(mv) - pos} bytes"
        )
    fields: dict[int, memoryview] = {}
    last_tag = -1
    for _ in range(count):
        tag_pos = pos
        tag, pos = read_uvarint(mv, pos)
        if tag <= last_tag:
            raise ProtocolError(
                f"tagged field at position {tag_pos}: tag {tag} after tag {last_tag} (tags must ascend)"
            )
        size, pos = read_uvarint(mv, pos)
        end = check_available(mv, pos, size, f"tagged field {tag}")
        fields[tag] = mv[pos:end]
        pos = end
        last_tag = tag
    return fields, pos


def write_tagged_fields(out: bytearray, fields: dict[int, bytes]) -> None:
    write_uvarint(out, len(fields))
    for tag in sorted(fields):
        value = fields[tag]
        write_uvarint(out, tag)
        write_uvarint(out, len(value))
        out += value
