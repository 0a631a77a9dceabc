"""Compression codecs of the records section of a RecordBatch v2 (attribute bits 0-2): every codec Kafka
defines.

Kafka compresses the records that follow the 61-byte header as one stream; the header itself (and so the
CRC's coverage of it) stays in the clear.  Only the producer compresses and only the consumer decompresses:
the appliance moves compressed batches unchanged.

* 0 ``none``.
* 1 ``gzip`` via :mod:`zlib`: one gzip member, as Kafka's GZIPOutputStream writes.
* 2 ``snappy`` via ``cramjam`` (:mod:`storage.codec_snappy`): raw blocks (librdkafka) and the xerial stream
  (the Java client, kafka-python) are read; the xerial stream is written.
* 3 ``lz4`` via ``lz4`` and ``cramjam`` (:mod:`storage.codec_lz4`): the LZ4 frame format, with the
  KAFKA-3160 header checksum of old clients accepted on reading.
* 4 ``zstd`` via ``zstandard``: one frame written with its content size; on reading, any number of frames,
  with or without a content size (Kafka's Java client streams frames without one).

Decompression is bounded: ``max_bytes`` (:data:`DEFAULT_MAX_DECOMPRESSED_BYTES` unless the caller says)
caps what one batch may inflate to, for every codec, so a hostile batch cannot exhaust memory.  Data a codec
cannot read raises :class:`CorruptRecordError` "<where>: not valid lz4 data: ..." (or the codec's own
wording); an unknown codec (5-7) raises "unsupported compression codec N".
"""

from __future__ import annotations

import threading
import zlib

import zstandard

from storage.batch_header import COMPRESSION_NONE, COMPRESSION_ZSTD
from storage.codec_lz4 import lz4_compress, lz4_compress_bound, lz4_decompress
from storage.codec_snappy import snappy_compress, snappy_compress_bound, snappy_decompress
from storage.errors import CorruptRecordError

__all__ = [
    "CODECS_BY_NAME",
    "CODEC_NAMES",
    "COMPRESSION_GZIP",
    "COMPRESSION_LZ4",
    "COMPRESSION_NONE",
    "COMPRESSION_SNAPPY",
    "COMPRESSION_ZSTD",
    "DEFAULT_MAX_DECOMPRESSED_BYTES",
    "SUPPORTED_CODECS",
    "codec_name",
    "compress",
    "compress_bound",
    "decompress",
]

COMPRESSION_GZIP = 1
COMPRESSION_SNAPPY = 2
COMPRESSION_LZ4 = 3
CODEC_NAMES = {
    COMPRESSION_NONE: "none",
    COMPRESSION_GZIP: "gzip",
    COMPRESSION_SNAPPY: "snappy",
    COMPRESSION_LZ4: "lz4",
    COMPRESSION_ZSTD: "zstd",
}
SUPPORTED_CODECS = (COMPRESSION_NONE, COMPRESSION_GZIP, COMPRESSION_SNAPPY, COMPRESSION_LZ4, COMPRESSION_ZSTD)
CODECS_BY_NAME = {name: codec for codec, name in CODEC_NAMES.items()}  # compression.type values
DEFAULT_ZSTD_LEVEL = 3  # zstd's own default, as Kafka's producer uses
DEFAULT_GZIP_LEVEL = 6
# A bound on what one batch may decompress to, so a hostile frame cannot exhaust memory.
DEFAULT_MAX_DECOMPRESSED_BYTES = 1 << 30

_GZIP_WBITS = 16 + zlib.MAX_WBITS  # a gzip wrapper, not zlib's
_GZIP_WRAPPER_BYTES = 18  # 10-byte header + 8-byte trailer

_local = threading.local()  # zstandard (de)compressor objects are not shared across threads


def codec_name(codec: int) -> str:
    """``"zstd"`` for 4 and so on; ``"unknown(7)"`` for a codec Kafka does not define."""
    return CODEC_NAMES.get(codec, f"unknown({codec})")


def _unsupported(codec: int, where: str) -> CorruptRecordError:
    return CorruptRecordError(f"{where}: unsupported compression codec {codec} ({codec_name(codec)})")


def _zstd_compressor(level: int) -> zstandard.ZstdCompressor:
    cache: dict[int, zstandard.ZstdCompressor] | None = getattr(_local, "compressors", None)
    if cache is None:
        cache = _local.compressors = {}
    compressor = cache.get(level)
    if compressor is None:
        compressor = cache[level] = zstandard.ZstdCompressor(level=level, write_content_size=True)
    return compressor


def _zstd_decompressor() -> zstandard.ZstdDecompressor:
    decompressor: zstandard.ZstdDecompressor | None = getattr(_local, "decompressor", None)
    if decompressor is None:
        decompressor = _local.decompressor = zstandard.ZstdDecompressor()
    return decompressor


def compress_bound(codec: int, size_bytes: int) -> int:
    """Most bytes ``compress(codec, data)`` can return for ``size_bytes`` of input (to reserve ring space)."""
    if codec == COMPRESSION_NONE:
        return size_bytes
    if codec == COMPRESSION_ZSTD:
        # ZSTD_COMPRESSBOUND from zstd.h: worst case is stored blocks plus block and frame headers.
        small = ((128 << 10) - size_bytes) >> 11 if size_bytes < (128 << 10) else 0
        return size_bytes + (size_bytes >> 8) + small
    if codec == COMPRESSION_GZIP:
        # zlib's conservative deflateBound (valid for any settings) plus the gzip wrapper.
        return size_bytes + ((size_bytes + 7) >> 3) + ((size_bytes + 63) >> 6) + 5 + _GZIP_WRAPPER_BYTES
    if codec == COMPRESSION_LZ4:
        return lz4_compress_bound(size_bytes)
    if codec == COMPRESSION_SNAPPY:
        return snappy_compress_bound(size_bytes)
    raise ValueError(f"unsupported compression codec {codec} ({codec_name(codec)})")


def compress(codec: int, data: bytes | bytearray | memoryview, *, level: int | None = None) -> bytes:
    """Compress a records section with ``codec`` (0 to 4); ``level`` is the codec library's (snappy has
    none).  Raises ValueError for other codecs."""
    if codec == COMPRESSION_ZSTD:
        return _zstd_compressor(DEFAULT_ZSTD_LEVEL if level is None else level).compress(data)
    if codec == COMPRESSION_GZIP:
        packer = zlib.compressobj(DEFAULT_GZIP_LEVEL if level is None else level, zlib.DEFLATED, _GZIP_WBITS)
        return packer.compress(data) + packer.flush()
    if codec == COMPRESSION_LZ4:
        return lz4_compress(data, level)
    if codec == COMPRESSION_SNAPPY:
        return snappy_compress(data)
    if codec == COMPRESSION_NONE:
        return bytes(data)
    raise ValueError(f"unsupported compression codec {codec} ({codec_name(codec)})")


def decompress(
    codec: int,
    data: bytes | bytearray | memoryview,
    *,
    where: str = "buffer",
    max_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES,
) -> bytes | bytearray:
    """Undo ``compress``, reading every form Kafka's clients write (see the module doc).

    Corrupt or oversized input raises :class:`CorruptRecordError` prefixed by ``where`` and naming the
    codec; so does an unknown codec, as "unsupported compression codec N".
    """
    if codec == COMPRESSION_ZSTD:
        return _zstd_decompress(data, where, max_bytes)
    if codec == COMPRESSION_LZ4:
        return lz4_decompress(data, where, max_bytes)
    if codec == COMPRESSION_SNAPPY:
        return snappy_decompress(data, where, max_bytes)
    if codec == COMPRESSION_GZIP:
        return _gzip_decompress(data, where, max_bytes)
    if codec == COMPRESSION_NONE:
        return bytes(data)
    raise _unsupported(codec, where)


def _zstd_decompress(data: bytes | bytearray | memoryview, where: str, max_bytes: int) -> bytes:
    """Decompress every frame; a frame that declares its size is checked against ``max_bytes`` before
    inflating, one that does not (streamed frames) after."""
    parts: list[bytes] = []
    total = 0
    rest = bytes(data)
    if not rest:
        raise CorruptRecordError(f"{where}: not valid zstd data: no frame (0 bytes)")
    try:
        while rest:
            declared = zstandard.frame_content_size(rest)
            if declared > max_bytes - total:
                raise CorruptRecordError(
                    f"{where}: zstd frame declares {declared} bytes, more than the {max_bytes}-byte limit"
                )
            unpacker = _zstd_decompressor().decompressobj()
            chunk = unpacker.decompress(rest)
            if not unpacker.eof:
                raise CorruptRecordError(
                    f"{where}: not valid zstd data: the frame is truncated ({len(rest)} compressed bytes)"
                )
            total += len(chunk)
            if total > max_bytes:
                raise CorruptRecordError(f"{where}: zstd records decompress past {max_bytes} bytes")
            parts.append(chunk)
            rest = unpacker.unused_data
    except zstandard.ZstdError as exc:
        raise CorruptRecordError(f"{where}: not valid zstd data: {exc}") from None
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _gzip_decompress(data: bytes | bytearray | memoryview, where: str, max_bytes: int) -> bytes:
    unpacker = zlib.decompressobj(_GZIP_WBITS)
    try:
        out = unpacker.decompress(data, max_bytes + 1)
    except zlib.error as exc:
        raise CorruptRecordError(f"{where}: not valid gzip data: {exc}") from None
    if len(out) > max_bytes:
        raise CorruptRecordError(f"{where}: gzip records decompress past {max_bytes} bytes")
    if not unpacker.eof:
        raise CorruptRecordError(f"{where}: not valid gzip data: the stream is truncated")
    return out
