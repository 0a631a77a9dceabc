"""The codec's front door: Fetch responses with FileRegion parts sent through a real socket with
os.sendfile, encoder errors, ApiVersions quirks, error codes."""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path

import pytest

from ipc.kafka import (
    ApiKey,
    ApiVersionsResponse,
    ErrorCode,
    FetchableTopicResponse,
    FetchResponse,
    FileRegion,
    FrameReader,
    MetadataResponse,
    MetadataResponseBroker,
    PartitionData,
    PartitionProduceData,
    ProduceRequest,
    RequestHeader,
    TopicProduceData,
    decode_response,
    encode_request,
    encode_response,
    encode_response_parts,
    error_name,
    frame_size,
    peek_correlation_id,
    supported_api_versions,
)
from storage.errors import ProtocolError

FETCH_V11 = RequestHeader(ApiKey.FETCH, 11, 4242, "consumer-1")


def send_parts(sock: socket.socket, parts: list[bytes | FileRegion]) -> None:
    """What the broker does: bytes with sendall, regions with os.sendfile until every byte has left."""
    for part in parts:
        if isinstance(part, FileRegion):
            sent = 0
            while sent < part.size:
                sent += os.sendfile(sock.fileno(), part.fd, part.position + sent, part.size - sent)
        else:
            sock.sendall(part)


def receive_frame(sock: socket.socket) -> bytes:
    reader = FrameReader()
    while (frame := reader.next_frame()) is None:
        data = sock.recv(65536)
        assert data, "peer closed before a whole frame arrived"
        reader.feed(data)
    return frame


def test_a_fetch_response_with_file_regions_goes_through_sendfile_and_decodes(tmp_path: Path) -> None:
    segment = tmp_path / "00000000000000000000.log"
    content = os.urandom(300_000)
    segment.write_bytes(content)
    fd = os.open(segment, os.O_RDONLY)
    try:
        body = FetchResponse(
            responses=[
                FetchableTopicResponse(
                    "events",
                    [
                        PartitionData(0, high_watermark=1000, records=FileRegion(fd, 4096, 200_000)),
                        PartitionData(1, high_watermark=5, records=b"inline-bytes"),
                        PartitionData(2, error_code=ErrorCode.OFFSET_OUT_OF_RANGE, records=None),
                        PartitionData(3, high_watermark=7, records=FileRegion(fd, 0, 17)),
                        PartitionData(4, high_watermark=0, records=FileRegion(fd, 10, 0)),
                    ],
                ),
            ]
        )
        parts = encode_response_parts(FETCH_V11, body)
        assert [type(p).__name__ for p in parts] == ["bytes", "FileRegion", "bytes", "FileRegion", "bytes"]
        total = frame_size(parts)
        assert int.from_bytes(parts[0][:4], "big") == total - 4  # type: ignore[index]

        left, right = socket.socketpair()
        with left, right:
            sender = threading.Thread(target=send_parts, args=(left, parts))
            sender.start()
            frame = receive_frame(right)
            sender.join()
        assert len(frame) == total - 4
        response = decode_response(frame, ApiKey.FETCH, 11)
        assert response.correlation_id == 4242
        got = response.body.responses[0].partitions
        assert got[0].records == content[4096 : 4096 + 200_000]
        assert got[1].records == b"inline-bytes"
        assert got[2].records is None and got[2].error_code == ErrorCode.OFFSET_OUT_OF_RANGE
        assert got[3].records == content[:17]
        assert got[4].records == b""
    finally:
        os.close(fd)


def test_file_regions_cannot_be_joined_into_plain_bytes() -> None:
    body = FetchResponse(
        responses=[FetchableTopicResponse("t", [PartitionData(0, records=FileRegion(3, 0, 10))])]
    )
    with pytest.raises(ValueError, match="encode_response_parts"):
        encode_response(FETCH_V11, body)


def test_large_record_bytes_become_their_own_part_without_a_copy() -> None:
    records = os.urandom(1 << 20)
    body = FetchResponse(responses=[FetchableTopicResponse("t", [PartitionData(0, records=records)])])
    parts = encode_response_parts(FETCH_V11, body)
    assert any(part is records for part in parts)
    assert b"".join(p for p in parts if isinstance(p, bytes)) == encode_response(FETCH_V11, body)


def test_encoding_a_value_that_does_not_fit_names_the_field() -> None:
    too_big = MetadataResponse(brokers=[MetadataResponseBroker(node_id=1 << 40, host="h", port=9092)])
    with pytest.raises(ValueError, match=r"MetadataResponseBroker\.node_id"):
        encode_response(RequestHeader(ApiKey.METADATA, 8, 1), too_big)
    null_host = MetadataResponse(brokers=[MetadataResponseBroker(node_id=1, host=None, port=9092)])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"host.*null"):
        encode_response(RequestHeader(ApiKey.METADATA, 8, 1), null_host)


def test_encoding_checks_the_header_against_the_body() -> None:
    with pytest.raises(ValueError, match="does not match"):
        encode_response(RequestHeader(ApiKey.PRODUCE, 8, 1), FetchResponse())
    with pytest.raises(ValueError, match="not supported"):
        encode_response(RequestHeader(ApiKey.FETCH, 12, 1), FetchResponse())
    with pytest.raises(ValueError, match="not a request"):
        encode_request(RequestHeader(ApiKey.FETCH, 11, 1), FetchResponse())
    with pytest.raises(ValueError, match="FileRegion"):
        region = PartitionProduceData(0, FileRegion(0, 0, 1))
        encode_request(
            RequestHeader(ApiKey.PRODUCE, 8, 1), ProduceRequest(topic_data=[TopicProduceData("t", [region])])
        )


def test_an_api_versions_error_answer_is_read_in_the_v0_layout() -> None:
    v0_answer = encode_response(
        RequestHeader(ApiKey.API_VERSIONS, 0, 8),
        ApiVersionsResponse(error_code=ErrorCode.UNSUPPORTED_VERSION, api_keys=supported_api_versions()),
    )
    response = decode_response(v0_answer[4:], ApiKey.API_VERSIONS, 3)  # we asked v3, the broker answered v0
    assert response.body.error_code == 35
    assert response.body.api_keys == supported_api_versions()


def test_peek_correlation_id_reads_the_first_four_bytes() -> None:
    frame = encode_response(RequestHeader(ApiKey.FETCH, 11, -7), FetchResponse())
    assert peek_correlation_id(frame[4:]) == -7
    with pytest.raises(ProtocolError):
        peek_correlation_id(b"\x00\x01")


def test_error_codes_are_kafkas_numbers() -> None:
    expected = {
        "NONE": 0,
        "OFFSET_OUT_OF_RANGE": 1,
        "CORRUPT_MESSAGE": 2,
        "UNKNOWN_TOPIC_OR_PARTITION": 3,
        "INVALID_FETCH_SIZE": 4,
        "LEADER_NOT_AVAILABLE": 5,
        "NOT_LEADER_OR_FOLLOWER": 6,
        "REQUEST_TIMED_OUT": 7,
        "MESSAGE_TOO_LARGE": 10,
        "INVALID_TOPIC_EXCEPTION": 17,
        "NOT_ENOUGH_REPLICAS": 19,
        "NOT_ENOUGH_REPLICAS_AFTER_APPEND": 20,
        "INVALID_REQUIRED_ACKS": 21,
        "UNSUPPORTED_SASL_MECHANISM": 33,
        "ILLEGAL_SASL_STATE": 34,
        "UNSUPPORTED_VERSION": 35,
        "TOPIC_ALREADY_EXISTS": 36,
        "INVALID_PARTITIONS": 37,
        "INVALID_REPLICATION_FACTOR": 38,
        "INVALID_REQUEST": 42,
        "OUT_OF_ORDER_SEQUENCE_NUMBER": 45,
        "DUPLICATE_SEQUENCE_NUMBER": 46,
        "INVALID_PRODUCER_EPOCH": 47,
        "SASL_AUTHENTICATION_FAILED": 58,
        "UNKNOWN_PRODUCER_ID": 59,
        "FENCED_LEADER_EPOCH": 74,
        "UNKNOWN_LEADER_EPOCH": 75,
        "UNKNOWN_SERVER_ERROR": -1,
    }
    assert {name: ErrorCode[name].value for name in expected} == expected
    assert error_name(35) == "UNSUPPORTED_VERSION(35)"
    assert error_name(9999) == "UNKNOWN_ERROR_CODE(9999)"
