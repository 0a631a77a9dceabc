"""Every codec Kafka defines, at the level of one records section: what we write round-trips and stays within
its bound; every form Kafka's clients write is read (snappy raw and xerial, lz4 frames with and without a
content size, linked blocks, checksums, the KAFKA-3160 header checksum); garbage, truncation and
decompression bombs are a CorruptRecordError naming the codec, never a silent empty result."""

from __future__ import annotations

import os
import warnings

import cramjam
import lz4.frame
import pytest
import xxhash

from storage.codec_lz4 import lz4_compress
from storage.codec_snappy import XERIAL_MAGIC
from storage.compression import (
    CODECS_BY_NAME,
    COMPRESSION_LZ4,
    COMPRESSION_SNAPPY,
    SUPPORTED_CODECS,
    compress,
    compress_bound,
    decompress,
)
from storage.errors import CorruptRecordError

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka import codec as kafka_codec

LOG_LINES = b"".join(
    b"2026-11-27T10:00:%02d INFO api-%d GET /items/%d 200 in %d ms\n" % (i % 60, i % 7, i, i % 300)
    for i in range(5000)
)
INPUTS = {"empty": b"", "one byte": b"x", "log lines": LOG_LINES, "random": os.urandom(300_000)}


@pytest.mark.parametrize("codec", SUPPORTED_CODECS)
@pytest.mark.parametrize("name", INPUTS)
def test_what_we_write_reads_back_within_its_bound(codec: int, name: str) -> None:
    data = INPUTS[name]
    packed = compress(codec, data)
    assert len(packed) <= compress_bound(codec, len(data))
    assert bytes(decompress(codec, packed, where="test")) == data


def test_snappy_is_written_as_the_java_clients_xerial_stream_and_kafka_python_reads_it() -> None:
    packed = compress(COMPRESSION_SNAPPY, LOG_LINES)
    assert packed.startswith(XERIAL_MAGIC + b"\x00\x00\x00\x01\x00\x00\x00\x01")
    assert kafka_codec.snappy_decode(packed) == LOG_LINES


def test_snappy_raw_blocks_and_xerial_streams_of_other_writers_are_read() -> None:
    raw = bytes(cramjam.snappy.compress_raw(LOG_LINES))  # what librdkafka writes
    assert bytes(decompress(COMPRESSION_SNAPPY, raw)) == LOG_LINES
    xerial = kafka_codec.snappy_encode(LOG_LINES, xerial_compatible=True, xerial_blocksize=8192)
    assert xerial.startswith(XERIAL_MAGIC)
    assert bytes(decompress(COMPRESSION_SNAPPY, xerial)) == LOG_LINES
    # version fields written little-endian (some producers do): still read
    odd = XERIAL_MAGIC + b"\x01\x00\x00\x00\x01\x00\x00\x00" + xerial[16:]
    assert bytes(decompress(COMPRESSION_SNAPPY, odd)) == LOG_LINES


def test_lz4_is_written_as_kafkas_java_producer_writes_it() -> None:
    info = lz4.frame.get_frame_info(compress(COMPRESSION_LZ4, LOG_LINES))
    assert info["block_size"] == 64 << 10
    assert not info["block_linked"] and not info["content_checksum"] and not info["block_checksum"]
    assert info["content_size"] == 0  # not stored
    assert kafka_codec.lz4_decode(compress(COMPRESSION_LZ4, LOG_LINES)) == LOG_LINES


@pytest.mark.parametrize(
    "options",
    [
        {},  # python-lz4's defaults: content size stored (what kafka-python writes)
        {"block_linked": True, "content_checksum": True, "block_checksum": True},
        {"block_size": lz4.frame.BLOCKSIZE_MAX4MB, "store_size": False},
        {"compression_level": 9},
    ],
)
def test_lz4_frames_of_every_shape_are_read(options: dict[str, object]) -> None:
    frame = lz4.frame.compress(LOG_LINES, **options)
    assert bytes(decompress(COMPRESSION_LZ4, frame)) == LOG_LINES


def test_lz4_frames_one_after_the_other_are_read_as_librdkafka_does() -> None:
    frames = lz4_compress(LOG_LINES[:1000]) + lz4.frame.compress(LOG_LINES[1000:])
    assert bytes(decompress(COMPRESSION_LZ4, frames)) == LOG_LINES


def test_an_lz4_frame_with_the_old_kafka_header_checksum_is_read() -> None:
    quirky = kafka_codec.lz4_encode_old_kafka(LOG_LINES)  # KAFKA-3160: HC over the magic too
    with pytest.raises(RuntimeError, match="headerChecksum"):
        lz4.frame.decompress(quirky)  # the LZ4 library alone refuses it
    assert bytes(decompress(COMPRESSION_LZ4, quirky)) == LOG_LINES


def test_an_lz4_frame_with_any_other_wrong_header_checksum_is_refused() -> None:
    frame = bytearray(lz4_compress(LOG_LINES))
    frame[6] ^= 0x5A
    with pytest.raises(CorruptRecordError, match=r"^batch 9: not valid lz4 data: frame header checksum 0x"):
        decompress(COMPRESSION_LZ4, bytes(frame), where="batch 9")


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
@pytest.mark.parametrize("damage", ["garbage", "truncated", "bit flip", "empty"])
def test_damaged_data_is_an_error_naming_the_codec(codec: str, damage: str) -> None:
    number = CODECS_BY_NAME[codec]
    packed = compress(number, LOG_LINES)
    damaged = {
        "garbage": os.urandom(200),
        "truncated": packed[: len(packed) // 2],
        "bit flip": packed[:40] + bytes((packed[40] ^ 0xFF,)) + packed[41:],
        "empty": b"",
    }[damage]
    try:
        out = decompress(number, damaged, where="partition t-0 batch 5..9")
    except CorruptRecordError as error:
        assert str(error).startswith(f"partition t-0 batch 5..9: not valid {codec} data: ")
    else:  # a flipped literal byte decompresses to other bytes: never to nothing, and never silently
        assert damage == "bit flip" and len(out) == len(LOG_LINES) and out != LOG_LINES


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_decompression_is_bounded_for_every_codec(codec: str) -> None:
    number = CODECS_BY_NAME[codec]
    bomb = compress(number, bytes(4 << 20))
    assert len(bomb) < (4 << 20) // 20
    with pytest.raises(CorruptRecordError, match=rf"^b: {codec} .*(past|more than).* 1048576"):
        decompress(number, bomb, where="b", max_bytes=1 << 20)
    assert len(decompress(number, bomb, where="b", max_bytes=4 << 20)) == 4 << 20


def test_lz4_bounds_hold_for_frames_that_declare_their_size_and_for_those_that_do_not() -> None:
    declared = lz4.frame.compress(bytes(4 << 20), store_size=True)
    with pytest.raises(CorruptRecordError, match="lz4 records decompress past 1000 bytes"):
        decompress(COMPRESSION_LZ4, declared, where="b", max_bytes=1000)
    lying = bytearray(lz4.frame.compress(LOG_LINES, store_size=True))
    lying[6:14] = (1000).to_bytes(8, "little")  # declares 1000 bytes, holds all of LOG_LINES
    lying[14] = (xxhash.xxh32_intdigest(bytes(lying[4:14])) >> 8) & 0xFF
    with pytest.raises(CorruptRecordError, match=r"^b: not valid lz4 data: "):
        decompress(COMPRESSION_LZ4, bytes(lying), where="b")
    lying[6:14] = (1 << 30).to_bytes(8, "little")  # more than its blocks can hold: refused unread
    lying[14] = (xxhash.xxh32_intdigest(bytes(lying[4:14])) >> 8) & 0xFF
    with pytest.raises(CorruptRecordError, match="declares 1073741824 bytes, its blocks hold at most"):
        decompress(COMPRESSION_LZ4, bytes(lying), where="b")


def test_unknown_codecs_are_refused_by_number() -> None:
    with pytest.raises(CorruptRecordError, match=r"^w: unsupported compression codec 6 \(unknown\(6\)\)"):
        decompress(6, b"abc", where="w")
    with pytest.raises(ValueError, match="unsupported compression codec 5"):
        compress(5, b"abc")
