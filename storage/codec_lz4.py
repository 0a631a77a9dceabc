"""Kafka's lz4 (attribute codec 3): one LZ4 frame over a batch's records section.

The frame format (little-endian), as RecordBatch v2 carries it::

    0        4     5    6                   (6|14)    (7|15|19)
    +--------+-----+----+---------------------+----+----------------------------------+-----------+-------+
    | magic  | FLG | BD | content size (opt.) | HC | blocks ...                       | end mark  | C.sum |
    | 184D2204     |    | 8 bytes, FLG bit 3  |    | size(4) data [block sum(4)]      | 0 (4)     | (opt.)|
    +--------+-----+----+---------------------+----+----------------------------------+-----------+-------+

FLG: bits 7-6 version (01), bit 5 block independence, bit 4 block checksums, bit 3 content size, bit 2
content checksum, bit 0 dictionary id (4 more descriptor bytes).  BD bits 6-4: the block maximum size (4: 64
KiB, 5: 256 KiB, 6: 1 MiB, 7: 4 MiB).  HC is the second byte of the xxHash32 of the descriptor (FLG up to
the byte before HC).  A block size word with bit 31 set holds its data uncompressed.

**Writing** (:func:`lz4_compress`, through the ``lz4`` package): what Kafka's Java producer writes and
every Kafka reader takes: 64 KiB blocks, independent, no block or content checksums, no content size.

**Reading** (:func:`lz4_decompress`, through ``cramjam``, which decompresses straight into a buffer it is
given): any frame the LZ4 library accepts, several frames one after the other too (librdkafka reads those).
Before decompressing, the frame's blocks are walked (a few bytes per 64 KiB block) to know how much it can
inflate to: the sum of its blocks' maximum sizes, or the declared content size when there is one (a frame
declaring more than its blocks can hold is corrupt; one declaring more than ``max_bytes`` is refused before
any byte is inflated); that bound, capped at ``max_bytes``, sizes the output buffer, so a hostile frame
cannot take more memory than the limit and a frame that would pass it is refused.

**The header checksum quirk (KAFKA-3160).**  Kafka's own LZ4 code before 0.10 computed HC over the magic
bytes as well as the descriptor; Kafka's clients (the Java client for magic 0, librdkafka and kafka-python
for old messages) read such frames by recomputing HC.  Here a frame whose HC is wrong but equals that old
computation is read the same way (its HC byte replaced by the right one before decompressing); any other
wrong HC is corrupt data.
"""

from __future__ import annotations

import struct
from typing import Final, NamedTuple

import cramjam
import lz4.frame
import xxhash

from storage.errors import CorruptRecordError

__all__ = [
    "FRAME_MAGIC",
    "FrameLayout",
    "frame_layout",
    "lz4_compress",
    "lz4_compress_bound",
    "lz4_decompress",
]

FRAME_MAGIC: Final = 0x184D2204
_MAGIC_BYTES: Final = struct.pack("<I", FRAME_MAGIC)
_WORD: Final = struct.Struct("<I")
_DESCRIPTOR_OFFSET: Final = 4  # FLG
_MIN_HEADER: Final = 7  # magic, FLG, BD, HC
_MAX_HEADER: Final = 19  # with content size and dictionary id
_FLG_VERSION_MASK: Final = 0xC0
_FLG_VERSION_01: Final = 0x40
_FLG_BLOCK_CHECKSUM: Final = 0x10
_FLG_CONTENT_SIZE: Final = 0x08
_FLG_CONTENT_CHECKSUM: Final = 0x04
_FLG_DICT_ID: Final = 0x01
_BLOCK_UNCOMPRESSED: Final = 0x80000000
_BLOCK_MAX_SIZES: Final = {4: 64 << 10, 5: 256 << 10, 6: 1 << 20, 7: 4 << 20}
_WRITE_BLOCK_BYTES: Final = 64 << 10


class FrameLayout(NamedTuple):
    """What walking one frame found."""

    end: int  # byte after the frame
    header_checksum_at: int  # position of HC
    content_size: int  # declared, or -1
    max_output_bytes: int  # content size if declared, else the sum of the blocks' maximum sizes


def lz4_compress_bound(size_bytes: int) -> int:
    """Most bytes :func:`lz4_compress` returns for ``size_bytes``: a block whose data does not shrink is
    stored as it is, so every block costs at most its size plus its 4-byte size word."""
    blocks = max(1, -(-size_bytes // _WRITE_BLOCK_BYTES))
    return _MAX_HEADER + size_bytes + 4 * blocks + 4 + 4  # + end mark + content checksum


def lz4_compress(data: bytes | bytearray | memoryview, level: int | None = None) -> bytes:
    """One LZ4 frame as Kafka's Java producer writes it (see the module doc); ``level`` is the LZ4 library's
    (0, the default: the fast compressor; 3 and above: LZ4 HC)."""
    return lz4.frame.compress(
        data,
        compression_level=0 if level is None else level,
        block_size=lz4.frame.BLOCKSIZE_MAX64KB,
        block_linked=False,
        content_checksum=False,
        block_checksum=False,
        store_size=False,
    )


def _header_checksum(descriptor: bytes | memoryview) -> int:
    return (xxhash.xxh32_intdigest(descriptor) >> 8) & 0xFF


def frame_layout(view: memoryview, start: int, where: str) -> FrameLayout:
    """Walk the frame at ``view[start:]``: its header, every block's size word, the end mark.  Raises
    :class:`CorruptRecordError` ("not valid lz4 data: ...") when the bytes cannot be an LZ4 frame."""
    end = len(view)

    def bad(why: str) -> CorruptRecordError:
        return CorruptRecordError(f"{where}: not valid lz4 data: {why} (frame at byte {start})")

    if end - start < _MIN_HEADER:
        raise bad(f"{end - start} bytes, an LZ4 frame header takes at least {_MIN_HEADER}")
    if view[start : start + 4] != _MAGIC_BYTES:
        raise bad(f"magic {bytes(view[start : start + 4]).hex()}, expected {_MAGIC_BYTES.hex()}")
    flg, bd = view[start + 4], view[start + 5]
    if flg & _FLG_VERSION_MASK != _FLG_VERSION_01:
        raise bad(f"frame version {flg >> 6}, expected 1")
    block_max = _BLOCK_MAX_SIZES.get((bd >> 4) & 0x07)
    if block_max is None:
        raise bad(f"block maximum size id {(bd >> 4) & 0x07}, expected 4 to 7")
    at = start + 6
    content_size = -1
    if flg & _FLG_CONTENT_SIZE:
        if end - at < 8:
            raise bad("truncated frame header")
        content_size = int.from_bytes(view[at : at + 8], "little")
        at += 8
    if flg & _FLG_DICT_ID:
        at += 4
    if at >= end:
        raise bad("truncated frame header")
    checksum_at = at
    at += 1
    block_extra = 4 if flg & _FLG_BLOCK_CHECKSUM else 0
    bound = 0
    while True:
        if end - at < 4:
            raise bad("truncated frame: it ends before its end mark")
        (word,) = _WORD.unpack_from(view, at)
        at += 4
        if word == 0:
            break
        size = word & ~_BLOCK_UNCOMPRESSED
        if size > block_max:
            raise bad(f"a block of {size} bytes at byte {at - 4}, more than the frame's {block_max}")
        at += size + block_extra
        bound += size if word & _BLOCK_UNCOMPRESSED else block_max
    if flg & _FLG_CONTENT_CHECKSUM:
        at += 4
    if at > end:
        raise bad("truncated frame: its last block runs past the data")
    if content_size > bound:
        raise bad(f"the frame declares {content_size} bytes, its blocks hold at most {bound}")
    return FrameLayout(at, checksum_at, content_size, content_size if content_size >= 0 else bound)


def lz4_decompress(data: bytes | bytearray | memoryview, where: str, max_bytes: int) -> bytearray:
    """Every frame of ``data`` decompressed, at most ``max_bytes`` in all (see the module doc).  Raises
    :class:`CorruptRecordError` prefixed by ``where`` for data that is not lz4 or inflates past the limit."""
    view = memoryview(data).cast("B")
    frames: list[tuple[memoryview | bytes, FrameLayout]] = []
    start = 0
    while start < len(view) or not frames:
        layout = frame_layout(view, start, where)
        frames.append((_with_kafka_header_checksum(view, start, layout, where), layout))
        start = layout.end
    bound = sum(layout.max_output_bytes for _, layout in frames)
    capped = bound > max_bytes
    if capped and all(layout.content_size >= 0 for _, layout in frames):
        raise CorruptRecordError(f"{where}: lz4 frames declare {bound} bytes, more than the {max_bytes}-byte "
                                 f"limit: lz4 records decompress past {max_bytes} bytes")
    out = bytearray(min(bound, max_bytes))
    written = 0
    for frame, layout in frames:
        try:
            count = cramjam.lz4.decompress_into(frame, memoryview(out)[written:])
        except cramjam.DecompressionError as exc:
            if capped and "whole buffer" in str(exc):
                raise CorruptRecordError(f"{where}: lz4 records decompress past {max_bytes} bytes") from None
            raise CorruptRecordError(f"{where}: not valid lz4 data: {exc}") from None
        if 0 <= layout.content_size != count:
            raise CorruptRecordError(
                f"{where}: not valid lz4 data: a frame declares {layout.content_size} bytes and holds {count}"
            )
        written += count
    del out[written:]
    return out


def _with_kafka_header_checksum(
    view: memoryview, start: int, layout: FrameLayout, where: str
) -> memoryview | bytes:
    """The frame's bytes, its HC replaced by the right one when it holds KAFKA-3160's (see the module doc)."""
    frame = view[start : layout.end]
    at = layout.header_checksum_at - start
    stored = frame[at]
    if stored == _header_checksum(frame[_DESCRIPTOR_OFFSET:at]):
        return frame
    if stored == _header_checksum(frame[:at]):
        return bytes(frame[:at]) + bytes((_header_checksum(frame[_DESCRIPTOR_OFFSET:at]),)) + frame[at + 1 :]
    raise CorruptRecordError(
        f"{where}: not valid lz4 data: frame header checksum {stored:#04x}, computed "
        f"{_header_checksum(frame[_DESCRIPTOR_OFFSET:at]):#04x} (frame at byte {start})"
    )
