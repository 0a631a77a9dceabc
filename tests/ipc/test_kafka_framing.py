"""Frames and headers: the FrameReader byte by byte, truncation, trailing bytes, size limits, and what the
codec says about unknown API keys and unsupported versions."""

from __future__ import annotations

import random

import pytest

from ipc.kafka import (
    DEFAULT_MAX_FRAME_BYTES,
    ApiKey,
    ApiVersionsRequest,
    FetchRequest,
    FrameReader,
    FrameTooLargeError,
    RequestHeader,
    UnknownApiKeyError,
    UnsupportedVersionError,
    decode_request,
    decode_response,
    encode_request,
    maybe_unsupported_version_reply,
)
from ipc.kafka.samples import sample_requests, sample_responses
from storage.errors import ProtocolError

SAMPLES = [s for seed in range(3) for s in sample_requests(random.Random(seed), advertised_only=False)]


def test_every_request_fed_byte_by_byte_yields_the_same_frame() -> None:
    for sample in SAMPLES:
        reader = FrameReader()
        frames = []
        for i in range(len(sample.frame)):
            reader.feed(sample.frame[i : i + 1])
            frame = reader.next_frame()
            if i < len(sample.frame) - 1:
                assert frame is None
                assert reader.bytes_needed() >= 1
            else:
                frames.append(frame)
        assert frames == [sample.frame[4:]]
        assert reader.buffered_bytes == 0
        assert decode_request(frames[0]) == (sample.header, sample.body)


def test_a_stream_of_frames_cut_anywhere_yields_the_frames_in_order() -> None:
    rng = random.Random(3)
    stream = b"".join(s.frame for s in SAMPLES)
    for _ in range(20):
        reader = FrameReader()
        got: list[bytes] = []
        position = 0
        while position < len(stream):
            step = rng.choice([1, 2, 3, 7, 100, 4096])
            reader.feed(memoryview(stream)[position : position + step])
            position += step
            got.extend(reader.frames())
        assert got == [s.frame[4:] for s in SAMPLES]


def test_every_truncation_of_every_request_body_is_a_protocol_error() -> None:
    for sample in SAMPLES:
        body = sample.frame[4:]
        for cut in range(len(body)):
            with pytest.raises(ProtocolError):
                decode_request(body[:cut])


@pytest.mark.parametrize("extra", [b"\x00", b"\xff" * 3, b"trailing!"])
def test_trailing_bytes_in_a_frame_body_are_a_protocol_error(extra: bytes) -> None:
    for sample in SAMPLES:
        with pytest.raises(ProtocolError, match="trailing bytes"):
            decode_request(sample.frame[4:] + extra)


def test_an_oversized_frame_is_refused_on_its_size_prefix_before_the_body_is_buffered() -> None:
    reader = FrameReader(max_frame_bytes=100)
    reader.feed(b"\x00\x00")
    reader.feed(b"\x00")
    with pytest.raises(FrameTooLargeError) as info:
        reader.feed(b"\x65")  # 101
    assert (info.value.size_bytes, info.value.max_frame_bytes) == (101, 100)
    assert reader.buffered_bytes == 4  # nothing of the body was waited for
    with pytest.raises(FrameTooLargeError):
        reader.feed(b"x" * 101)  # the stream cannot be resynchronised: it stays refused
    with pytest.raises(FrameTooLargeError):
        reader.next_frame()


def test_the_default_limit_is_socket_request_max_bytes() -> None:
    assert DEFAULT_MAX_FRAME_BYTES == 104_857_600
    reader = FrameReader()
    reader.feed(DEFAULT_MAX_FRAME_BYTES.to_bytes(4, "big"))
    assert reader.next_frame() is None
    assert reader.bytes_needed() == DEFAULT_MAX_FRAME_BYTES
    with pytest.raises(FrameTooLargeError, match="104857601"):
        FrameReader().feed((DEFAULT_MAX_FRAME_BYTES + 1).to_bytes(4, "big"))


def test_a_negative_frame_size_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError, match="negative"):
        FrameReader().feed(b"\xff\xff\xff\xfe")


def test_an_empty_frame_is_a_frame_and_an_invalid_request() -> None:
    reader = FrameReader()
    reader.feed(b"\x00\x00\x00\x00")
    assert reader.next_frame() == b""
    with pytest.raises(ProtocolError, match="header truncated"):
        decode_request(b"")


def test_an_unknown_api_key_names_it_and_the_correlation_id() -> None:
    body = (4444).to_bytes(2, "big") + (0).to_bytes(2, "big") + (99).to_bytes(4, "big") + b"\xff\xff"
    with pytest.raises(UnknownApiKeyError) as info:
        decode_request(body)
    assert (info.value.api_key, info.value.correlation_id) == (4444, 99)


@pytest.mark.parametrize(("version", "flexible_header"), [(3, False), (12, True), (-1, False)])
def test_an_unsupported_fetch_version_carries_its_parsed_header_and_gets_no_reply(
    version: int, flexible_header: bool
) -> None:
    """Fetch v12+ would use request header v2 (tagged fields): it still parses, so the correlation id is
    known; Kafka closes the connection for a version it does not enable, and so do we (reply is None)."""
    frame = encode_request(RequestHeader(ApiKey.FETCH, 11, 5, "cli"), FetchRequest())[4:]
    body = frame[:2] + version.to_bytes(2, "big", signed=True) + frame[4:]
    if flexible_header:
        header_end = 8 + 2 + len("cli")
        body = body[:header_end] + b"\x00" + body[header_end:]
    with pytest.raises(UnsupportedVersionError) as info:
        decode_request(body)
    assert info.value.header == RequestHeader(ApiKey.FETCH, version, 5, "cli")
    assert maybe_unsupported_version_reply(info.value) is None


def test_a_malformed_request_header_is_a_protocol_error_naming_the_api() -> None:
    frame = encode_request(RequestHeader(ApiKey.API_VERSIONS, 3, 5, "cli"), ApiVersionsRequest("a", "1"))[4:]
    bad_client_id_length = frame[:8] + b"\x7f\xff" + frame[10:]
    with pytest.raises(ProtocolError, match="ApiVersions v3 request header"):
        decode_request(bad_client_id_length)
    bad_tagged_fields = frame[:13] + b"\x05" + frame[14:]
    with pytest.raises(ProtocolError):
        decode_request(bad_tagged_fields)


def test_every_truncation_of_every_response_body_is_a_protocol_error() -> None:
    for seed in range(2):
        for sample in sample_responses(random.Random(seed)):
            body = sample.frame[4:]
            for cut in range(len(body)):
                with pytest.raises(ProtocolError):
                    decode_response(body[:cut], sample.spec.api_key, sample.version)
            with pytest.raises(ProtocolError, match="trailing bytes"):
                decode_response(body + b"\x00", sample.spec.api_key, sample.version)


def test_unknown_tagged_fields_in_a_flexible_header_and_body_are_skipped() -> None:
    """ApiVersions v3: request header v2 and the body end with tagged fields; tags we do not know (a newer
    client's) are skipped, as Kafka's readers do, and do not change what we decode."""
    frame = encode_request(RequestHeader(ApiKey.API_VERSIONS, 3, 5, "cli"), ApiVersionsRequest("kcat", "1.7"))
    body = frame[4:]
    header_end = 8 + 2 + len("cli")
    assert body[header_end] == 0 and body[-1] == 0  # both tagged sections empty
    unknown = b"\x02" + b"\x07\x02hi" + b"\x81\x01\x00"  # tags 7 and 129
    with_tags = body[:header_end] + unknown + body[header_end + 1 : -1] + unknown
    request = decode_request(with_tags)
    assert request.header == RequestHeader(ApiKey.API_VERSIONS, 3, 5, "cli")
    assert request.body == ApiVersionsRequest("kcat", "1.7")
