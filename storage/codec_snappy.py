"""Kafka's snappy (attribute codec 2): a batch's records section as Snappy data, in one of two framings.

* **raw**: one Snappy block (a varint of the uncompressed length, then the compressed elements), what
  librdkafka (confluent-kafka, kcat) writes;
* **xerial**: the stream of the Java ``snappy-java`` library's ``SnappyOutputStream``, what the Java
  producer and kafka-python write::

      0                8            12           16
      +----------------+------------+------------+--------------+----------------+-----+
      | \\x82SNAPPY\\x00 | version    | compatible | chunk length | raw Snappy     | ... |
      | magic (8)      | int32 BE   | int32 BE   | int32 BE     | block          |     |
      +----------------+------------+------------+--------------+----------------+-----+

  each chunk a raw block of at most 32 KiB of input.

**Reading** (:func:`snappy_decompress`, through ``cramjam``): data starting with the xerial magic is read as
xerial, anything else as one raw block, as Kafka's readers do (snappy-java's ``SnappyInputStream`` falls back
to raw data; librdkafka and kafka-python look for the magic).  The version fields are not checked
(kafka-python ignores them too: some producers write them little-endian).  Every raw block states its
uncompressed length up front, so the total is known before any byte is inflated: over ``max_bytes`` it is
refused, else one buffer of exactly that size is filled block by block.

**Writing** (:func:`snappy_compress`): xerial, 32 KiB chunks, version 1, compatible 1: the format of the
Java client, the reference every other Kafka client must read to read what Java producers write (raw data,
the Java client reads only through snappy-java's fallback).
"""

from __future__ import annotations

import struct
from typing import Final

import cramjam

from storage.errors import CorruptRecordError

__all__ = ["XERIAL_MAGIC", "snappy_compress", "snappy_compress_bound", "snappy_decompress"]

XERIAL_MAGIC: Final = b"\x82SNAPPY\x00"
_XERIAL_HEADER: Final = struct.Struct(">8sii")  # magic, version, compatible version
_XERIAL_VERSION: Final = 1
_CHUNK_LENGTH: Final = struct.Struct(">i")
_CHUNK_INPUT_BYTES: Final = 32 << 10  # snappy-java's default block size
assert _XERIAL_HEADER.size == 16


def _max_block_bytes(size_bytes: int) -> int:
    """snappy's MaxCompressedLength: the most one raw block of ``size_bytes`` input takes."""
    return 32 + size_bytes + size_bytes // 6


def snappy_compress_bound(size_bytes: int) -> int:
    """Most bytes :func:`snappy_compress` returns for ``size_bytes`` of input."""
    full, rest = divmod(size_bytes, _CHUNK_INPUT_BYTES)
    bound = _XERIAL_HEADER.size + full * (_CHUNK_LENGTH.size + _max_block_bytes(_CHUNK_INPUT_BYTES))
    return bound + (_CHUNK_LENGTH.size + _max_block_bytes(rest) if rest else 0)


def snappy_compress(data: bytes | bytearray | memoryview) -> bytes:
    """The xerial stream of ``data`` (see the module doc)."""
    view = memoryview(data).cast("B")
    parts: list[bytes | cramjam.Buffer] = [
        _XERIAL_HEADER.pack(XERIAL_MAGIC, _XERIAL_VERSION, _XERIAL_VERSION)
    ]
    for at in range(0, len(view), _CHUNK_INPUT_BYTES):
        block = cramjam.snappy.compress_raw(view[at : at + _CHUNK_INPUT_BYTES])
        parts.append(_CHUNK_LENGTH.pack(len(block)))
        parts.append(block)
    return b"".join(parts)


def snappy_decompress(data: bytes | bytearray | memoryview, where: str, max_bytes: int) -> bytearray:
    """Raw or xerial snappy data decompressed, at most ``max_bytes``.  Raises :class:`CorruptRecordError`
    prefixed by ``where`` ("not valid snappy data: ...") for anything else."""
    view = memoryview(data).cast("B")
    if view[: len(XERIAL_MAGIC)] == XERIAL_MAGIC:
        blocks = _xerial_blocks(view, where)
    else:
        blocks = [view]
    sizes = [_declared_size(block, where) for block in blocks]
    total = sum(sizes)
    if total > max_bytes:
        raise CorruptRecordError(f"{where}: snappy records declare {total} bytes, more than the "
                                 f"{max_bytes}-byte limit")
    out = bytearray(total)
    at = 0
    for block, size in zip(blocks, sizes, strict=True):
        try:
            written = cramjam.snappy.decompress_raw_into(block, memoryview(out)[at : at + size])
        except cramjam.DecompressionError as exc:
            raise CorruptRecordError(f"{where}: not valid snappy data: {exc}") from None
        if written != size:
            raise CorruptRecordError(f"{where}: not valid snappy data: a block declares {size} bytes and "
                                     f"holds {written}")
        at += size
    return out


def _xerial_blocks(view: memoryview, where: str) -> list[memoryview]:
    """The raw blocks of a xerial stream, by their chunk lengths."""
    if len(view) < _XERIAL_HEADER.size:
        raise CorruptRecordError(f"{where}: not valid snappy data: a xerial header of {len(view)} bytes, "
                                 f"expected {_XERIAL_HEADER.size}")
    blocks = []
    at = _XERIAL_HEADER.size
    while at < len(view):
        if len(view) - at < _CHUNK_LENGTH.size:
            raise CorruptRecordError(f"{where}: not valid snappy data: xerial stream truncated at byte {at}")
        (length,) = _CHUNK_LENGTH.unpack_from(view, at)
        at += _CHUNK_LENGTH.size
        if length < 0 or length > len(view) - at:
            raise CorruptRecordError(
                f"{where}: not valid snappy data: xerial stream truncated: a chunk of {length} bytes at "
                f"byte {at - _CHUNK_LENGTH.size}, {len(view) - at} left"
            )
        blocks.append(view[at : at + length])
        at += length
    return blocks


def _declared_size(block: memoryview, where: str) -> int:
    try:
        return int(cramjam.snappy.decompress_raw_len(block))
    except cramjam.DecompressionError as exc:
        raise CorruptRecordError(f"{where}: not valid snappy data: {exc}") from None
