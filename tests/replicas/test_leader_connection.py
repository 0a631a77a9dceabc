"""The follower's blocking client connection against scripted peers: what a bad or silent leader gets.

Each test runs a real loopback TCP server thread that answers ApiVersions properly and then the next request
with exactly the bytes the test chose: a good answer, a truncated frame, an oversized size prefix, garbage,
a wrong correlation id, trailing bytes, or silence.  Only the connection's documented errors may escape, and
the connection is closed afterwards.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from collections.abc import Callable, Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ipc.kafka import (
    ApiKey,
    ApiVersion,
    ApiVersionsResponse,
    FrameReader,
    MetadataRequest,
    MetadataResponse,
    Request,
    RequestHeader,
    decode_request,
    encode_request,
    encode_response,
    supported_api_versions,
)
from replicas.leader_connection import LeaderConnection
from storage.errors import BrokerConnectionError, ProtocolError, RequestTimeoutError

Script = Callable[[Request], bytes | None]  # the raw bytes to send back; None closes the connection


class Close(bytes):
    """Send these bytes, then close the connection."""


def api_versions(request: Request) -> bytes:
    return encode_response(
        request.header, ApiVersionsResponse(error_code=0, api_keys=supported_api_versions())
    )


def metadata_frame(request: Request, correlation_id: int | None = None) -> bytes:
    header = (
        request.header if correlation_id is None else request.header._replace(correlation_id=correlation_id)
    )
    return encode_response(header, MetadataResponse(brokers=[], topics=[]))


@contextlib.contextmanager
def scripted_leader(*script: Script) -> Iterator[tuple[str, int]]:
    server = socket.create_server(("127.0.0.1", 0))
    done = threading.Event()

    def serve() -> None:
        with contextlib.suppress(OSError):
            conn, _ = server.accept()
            with conn:
                frames = FrameReader()
                steps = list(script)
                while steps:
                    data = conn.recv(65536)
                    if not data:
                        return
                    frames.feed(data)
                    while steps and (frame := frames.next_frame()) is not None:
                        reply = steps.pop(0)(decode_request(frame))
                        if reply is None:
                            return
                        conn.sendall(reply)
                        if isinstance(reply, Close):
                            return
                done.wait(10)  # keep the connection open (silence) until the test ends

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[:2]
    finally:
        done.set()
        with contextlib.suppress(OSError):
            server.shutdown(socket.SHUT_RDWR)
        server.close()
        thread.join(timeout=10)


def connect(address: tuple[str, int], timeout_ms: int = 2000) -> LeaderConnection:
    return LeaderConnection.connect(address[0], address[1], timeout_ms=timeout_ms, max_response_bytes=1 << 16)


def test_good_exchange_and_version_negotiation() -> None:
    def old_broker(request: Request) -> bytes:  # speaks Metadata v1..v4 only
        versions = [
            v if v.api_key != ApiKey.METADATA else ApiVersion(ApiKey.METADATA, 1, 4)
            for v in supported_api_versions()
        ]
        return encode_response(request.header, ApiVersionsResponse(error_code=0, api_keys=versions))

    seen: list[int] = []

    def metadata(request: Request) -> bytes:
        seen.append(request.header.api_version)
        return metadata_frame(request)

    with scripted_leader(old_broker, metadata) as address, connect(address) as conn:
        assert conn.version_for(ApiKey.METADATA) == 4
        assert conn.request(MetadataRequest(topics=None)) == MetadataResponse(brokers=[], topics=[])
    assert seen == [4]


def expect_failure(reply: Script, error: type[BaseException], match: str, timeout_ms: int = 2000) -> None:
    with scripted_leader(api_versions, reply) as address:
        conn = connect(address, timeout_ms)
        with pytest.raises(error, match=match):
            conn.request(MetadataRequest(topics=None))
        assert conn.closed


def closed_after(cut: int) -> str:
    """What the error says when the peer closed after ``cut`` bytes of the answer (size prefix included)."""
    return "the broker closed the connection" + (
        rf" in the middle of a response \({cut} bytes in\)" if cut else "$"
    )


def test_peer_closing_mid_frame() -> None:
    for cut in (0, 2, 4, 7):  # inside the size prefix, right after it, inside the body
        expect_failure(
            lambda r, cut=cut: Close(metadata_frame(r)[:cut]),  # type: ignore[misc]
            ConnectionError,  # BrokerConnectionError is one: callers written for socket errors catch it
            closed_after(cut),
        )


def test_answer_cut_at_every_byte() -> None:
    request = encode_request(RequestHeader(ApiKey.METADATA, 8, 2, "x"), MetadataRequest(topics=None))
    whole = len(metadata_frame(decode_request(request[4:])))
    for cut in range(whole):
        expect_failure(
            lambda r, cut=cut: Close(metadata_frame(r)[:cut]),  # type: ignore[misc]
            BrokerConnectionError,
            closed_after(cut),
        )


@settings(max_examples=60, deadline=None)
@given(body=st.binary(max_size=64))
def test_fuzzed_answers_raise_only_protocol_errors(body: bytes) -> None:
    def fuzz(request: Request) -> bytes:
        payload = struct.pack(">i", request.header.correlation_id) + body
        return struct.pack(">i", len(payload)) + payload

    with scripted_leader(api_versions, fuzz) as address:
        conn = connect(address)
        try:
            answer = conn.request(MetadataRequest(topics=None))
        except ProtocolError:
            assert conn.closed
        else:
            assert isinstance(answer, MetadataResponse)


def test_oversized_and_negative_size_prefix() -> None:
    expect_failure(
        lambda r: struct.pack(">i", 1 << 20) + b"x" * 10,
        ProtocolError,
        r"response size 1048576 bytes, expected 0\.\.65536",
    )
    expect_failure(lambda r: struct.pack(">i", -5), ProtocolError, r"response size -5 bytes")


def test_garbage_body() -> None:
    def garbage(request: Request) -> bytes:
        body = struct.pack(">i", request.header.correlation_id) + b"\xff" * 9
        return struct.pack(">i", len(body)) + body

    expect_failure(garbage, ProtocolError, "Metadata v8 response")


def test_trailing_bytes_after_the_body() -> None:
    def trailing(request: Request) -> bytes:
        frame = metadata_frame(request)
        return struct.pack(">i", len(frame) - 4 + 3) + frame[4:] + b"abc"

    expect_failure(trailing, ProtocolError, "3 trailing bytes")


def test_wrong_correlation_id() -> None:
    expect_failure(
        lambda r: metadata_frame(r, correlation_id=r.header.correlation_id + 7),
        ProtocolError,
        r"response correlation id \d+, expected \d+",
    )


def test_silent_leader_times_out() -> None:
    expect_failure(
        lambda r: b"",
        RequestTimeoutError,
        r"no Metadata response \(correlation id \d+\) within the request timeout",
        timeout_ms=200,
    )


def test_refused_connection() -> None:
    with scripted_leader() as address:
        pass
    with pytest.raises(BrokerConnectionError, match=rf"broker 127.0.0.1:{address[1]}: cannot connect"):
        connect(address)


def test_api_versions_error_is_refused() -> None:
    def broken(request: Request) -> bytes:
        return encode_response(request.header, ApiVersionsResponse(error_code=42, api_keys=[]))

    with scripted_leader(broken) as address, pytest.raises(ProtocolError, match=r"INVALID_REQUEST\(42\)"):
        connect(address)
