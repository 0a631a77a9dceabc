"""KafkaConnection and the Consumer's remote path against scripted Kafka-protocol servers on real loopback
sockets.

The scripted server decodes real requests with the codec and answers as a Kafka broker would -- or misbehaves
on purpose (silence, a connection closed mid-response, bytes that are not a response).  The consumer's
interoperation with the real broker and real clients is in test_consumer_remote.py.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from appliance.client.consumer import Consumer, TopicPartition
from ipc.kafka import (
    ApiKey,
    ApiVersion,
    ApiVersionsResponse,
    ErrorCode,
    FetchableTopicResponse,
    FetchResponse,
    FrameReader,
    ListOffsetsPartitionResponse,
    ListOffsetsResponse,
    ListOffsetsTopicResponse,
    MetadataRequest,
    MetadataResponse,
    MetadataResponseBroker,
    MetadataResponsePartition,
    MetadataResponseTopic,
    PartitionData,
    Request,
    UnsupportedVersionError,
    decode_request,
    encode_response,
    maybe_unsupported_version_reply,
    supported_api_versions,
)
from ipc.kafka_client import BrokerConnectionError, KafkaConnection, parse_bootstrap_servers
from storage.batch_builder import build_batch
from storage.errors import OffsetOutOfRangeError, ProtocolError, RequestTimeoutError

Handler = Callable[[Request, socket.socket], bytes | None]  # the framed reply, or None to send nothing


class ScriptedServer:
    """A loopback server that decodes each request and answers with ``handler(request, sock)``."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.requests: list[Request] = []
        self._stop = False
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        self.listener.settimeout(0.1)
        while not self._stop:
            try:
                sock, _ = self.listener.accept()
            except TimeoutError:
                continue
            threading.Thread(target=self._connection, args=(sock,), daemon=True).start()

    def _connection(self, sock: socket.socket) -> None:
        reader = FrameReader()
        sock.settimeout(0.1)
        with sock:
            while not self._stop:
                try:
                    data = sock.recv(65536)
                except TimeoutError:
                    continue
                except OSError:
                    return
                if not data:
                    return
                reader.feed(data)
                for frame in reader.frames():
                    try:
                        request = decode_request(frame)
                    except UnsupportedVersionError as exc:
                        reply = maybe_unsupported_version_reply(exc)
                        if reply is not None:
                            sock.sendall(reply)
                        continue
                    self.requests.append(request)
                    answer = self.handler(request, sock)
                    if answer is not None:
                        sock.sendall(answer)

    def close(self) -> None:
        self._stop = True
        self._thread.join()
        self.listener.close()


def versions_reply(request: Request, api_keys: list[ApiVersion] | None = None) -> bytes:
    return encode_response(request.header, ApiVersionsResponse(error_code=0,
                                                              api_keys=api_keys or supported_api_versions()))


@contextlib.contextmanager
def serve(handler: Handler) -> Iterator[ScriptedServer]:
    server = ScriptedServer(handler)
    try:
        yield server
    finally:
        server.close()


def answering(others: Handler) -> Handler:
    def handler(request: Request, sock: socket.socket) -> bytes | None:
        if request.header.api_key == ApiKey.API_VERSIONS:
            return versions_reply(request)
        return others(request, sock)

    return handler


def _metadata(request: Request) -> bytes:
    return encode_response(request.header, MetadataResponse(brokers=[], topics=[]))


# ------------------------------------------------------------------------------------------ KafkaConnection


def test_negotiates_the_highest_common_version() -> None:
    limited = [v if v.api_key != ApiKey.METADATA else ApiVersion(ApiKey.METADATA, 0, 4)
               for v in supported_api_versions()]

    def handler(request: Request, sock: socket.socket) -> bytes | None:
        if request.header.api_key == ApiKey.API_VERSIONS:
            return versions_reply(request, limited)
        return _metadata(request)

    with serve(handler) as server:
        with KafkaConnection("127.0.0.1", server.port, client_id="me") as conn:
            assert conn.version_for(ApiKey.METADATA) == 4
            assert conn.request(MetadataRequest(topics=None)).brokers == []
        metadata = server.requests[-1]
        assert (metadata.header.api_version, metadata.header.client_id) == (4, "me")


def test_a_broker_without_api_versions_v3_answers_in_v0_and_is_understood() -> None:
    def handler(request: Request, sock: socket.socket) -> bytes | None:
        if request.header.api_key == ApiKey.API_VERSIONS:  # an old broker: refuse v3 the way Kafka does
            body = ApiVersionsResponse(error_code=ErrorCode.UNSUPPORTED_VERSION,
                                       api_keys=supported_api_versions())
            return encode_response(request.header._replace(api_version=0), body)
        return _metadata(request)

    with serve(handler) as server:
        with KafkaConnection("127.0.0.1", server.port) as conn:
            assert conn.version_for(ApiKey.FETCH) == 11
            conn.request(MetadataRequest(topics=[]))


def test_pipelined_requests_come_back_in_order_and_partial_responses_wait() -> None:
    gate = threading.Event()

    def handler(request: Request, sock: socket.socket) -> bytes | None:
        if request.header.api_key == ApiKey.API_VERSIONS:
            return versions_reply(request)
        reply = _metadata(request)
        if len(reply) > 0 and not gate.is_set():
            sock.sendall(reply[:3])  # a piece of the size prefix, then the rest when the test says so
            gate.wait(5)
            return reply[3:]
        return reply

    with serve(handler) as server:
        with KafkaConnection("127.0.0.1", server.port) as conn:
            ids = [conn.send(MetadataRequest(topics=[])) for _ in range(3)]
            assert conn.in_flight == 3 and ids == sorted(ids)
            time.sleep(0.05)
            assert conn.receive(wait_ms=50) is None  # three bytes arrived, not a whole response
            gate.set()
            bodies = [conn.receive() for _ in ids]
            assert all(isinstance(b, MetadataResponse) for b in bodies) and conn.in_flight == 0
            with pytest.raises(RuntimeError, match="no request in flight"):
                conn.receive()


def test_no_answer_is_a_timeout_and_closes_the_connection() -> None:
    with serve(answering(lambda request, sock: None)) as server:
        conn = KafkaConnection("127.0.0.1", server.port, request_timeout_ms=200)
        started = time.monotonic()
        with pytest.raises(RequestTimeoutError, match=r"no Metadata response \(correlation id 2\)"):
            conn.request(MetadataRequest(topics=[]))
        assert 0.15 < time.monotonic() - started < 2
        assert conn.closed
        with pytest.raises(BrokerConnectionError, match="connection is closed"):
            conn.request(MetadataRequest(topics=[]))


def test_a_connection_closed_mid_response_is_a_connection_error() -> None:
    def handler(request: Request, sock: socket.socket) -> bytes | None:
        sock.sendall(_metadata(request)[:6])
        sock.shutdown(socket.SHUT_RDWR)
        return None

    with serve(answering(handler)) as server:
        conn = KafkaConnection("127.0.0.1", server.port)
        closed = r"the broker closed the connection in the middle of a response \(6 bytes in\)"
        with pytest.raises(BrokerConnectionError, match=closed):
            conn.request(MetadataRequest(topics=[]))
        assert conn.closed


@pytest.mark.parametrize(
    ("reply", "match"),
    [
        (lambda r: b"\xff\xff\xff\xf0", "response size -16 bytes"),
        (lambda r: b"\x7f\xff\xff\xff", "response size 2147483647 bytes, expected 0..1024"),
        (lambda r: _metadata(r)[:4] + b"\x00\x00\x00\x63" + _metadata(r)[8:],
         "correlation id 99, expected 2"),
        (lambda r: b"\x00\x00\x00\x06" + _metadata(r)[4:8] + b"\xff\xff", "Metadata v8 response"),
        (lambda r: _metadata(r)[:3] + bytes([_metadata(r)[3] + 1]) + _metadata(r)[4:] + b"\0", "trailing"),
    ],
)
def test_bytes_that_are_not_the_response_are_a_protocol_error(reply: Callable[[Request], bytes],
                                                                match: str) -> None:
    with serve(answering(lambda request, sock: reply(request))) as server:
        conn = KafkaConnection("127.0.0.1", server.port, max_response_bytes=1024)
        with pytest.raises(ProtocolError, match=match):
            conn.request(MetadataRequest(topics=[]))
        assert conn.closed


def test_nobody_listening_is_a_connection_error_naming_the_address() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: refused
        with pytest.raises(BrokerConnectionError, match=f"broker 127.0.0.1:{port}: cannot connect"):
            KafkaConnection("127.0.0.1", port)


def test_bootstrap_server_lists_are_parsed() -> None:
    assert parse_bootstrap_servers("a:1, b:2,[::1]:9092") == [("a", 1), ("b", 2), ("::1", 9092)]
    assert parse_bootstrap_servers(["h:9"]) == [("h", 9)]
    for bad in ("", "host", "h:0", "h:x", ":9"):
        with pytest.raises(ValueError):
            parse_bootstrap_servers(bad)


# -------------------------------------------------------------------------------------- a Kafka-like broker


class FakeLog:
    """One partition of ``count`` batches of 3 records, answered as Kafka does: Fetch returns bytes from the
    batch holding the offset, cut at ``partition_max_bytes`` even in the middle of a batch."""

    def __init__(self, batches: int) -> None:
        self.batches = [build_batch([b"r%d" % (3 * i + j) for j in range(3)], base_offset=3 * i)
                        for i in range(batches)]
        self.data = b"".join(self.batches)
        self.positions = []
        at = 0
        for batch in self.batches:
            self.positions.append(at)
            at += len(batch)
        self.end = 3 * batches
        self.start = 0
        self.fetches: list[tuple[int, int]] = []

    def handle(self, request: Request, sock: socket.socket) -> bytes | None:
        key, body, port = request.header.api_key, request.body, sock.getsockname()[1]
        if key == ApiKey.METADATA:
            part = MetadataResponsePartition(error_code=0, partition_index=0, leader_id=0, replica_nodes=[0],
                                             isr_nodes=[0])
            return encode_response(request.header, MetadataResponse(
                brokers=[MetadataResponseBroker(node_id=0, host="127.0.0.1", port=port)],
                topics=[MetadataResponseTopic(error_code=0, name="t", partitions=[part])]))
        if key == ApiKey.LIST_OFFSETS:
            timestamp = body.topics[0].partitions[0].timestamp
            offset = self.start if timestamp == -2 else self.end
            return encode_response(request.header, ListOffsetsResponse(topics=[ListOffsetsTopicResponse(
                name="t", partitions=[ListOffsetsPartitionResponse(partition_index=0, error_code=0,
                                                                   offset=offset)])]))
        if key == ApiKey.FETCH:
            asked = body.topics[0].partitions[0]
            self.fetches.append((asked.fetch_offset, asked.partition_max_bytes))
            part = PartitionData(partition_index=0, error_code=0, high_watermark=self.end,
                                 last_stable_offset=self.end, log_start_offset=self.start, records=b"")
            if not self.start <= asked.fetch_offset <= self.end:
                part.error_code = ErrorCode.OFFSET_OUT_OF_RANGE
            elif asked.fetch_offset < self.end:
                at = self.positions[asked.fetch_offset // 3]
                part.records = self.data[at : at + asked.partition_max_bytes]
            else:
                time.sleep(body.max_wait_ms / 1000)  # long poll with nothing to give
            return encode_response(request.header, FetchResponse(responses=[
                FetchableTopicResponse(topic="t", partitions=[part])]))
        raise AssertionError(f"unexpected request {request.header}")


def test_the_remote_consumer_skips_partial_trailing_batches_and_fetches_on_from_the_last_whole_one() -> None:
    fake = FakeLog(40)
    batch_bytes = len(fake.batches[0])
    with serve(answering(fake.handle)) as server:
        consumer = Consumer({"bootstrap.servers": f"127.0.0.1:{server.port}", "auto.offset.reset": "earliest",
                             "max.partition.fetch.bytes": int(batch_bytes * 2.5), "fetch.max.wait.ms": 20})
        consumer.assign([TopicPartition("t", 0)])
        got = []
        while len(got) < 120:
            got += consumer.poll(timeout_ms=2000)
        assert [r.value for r in got] == [b"r%d" % i for i in range(120)]
        assert consumer.poll(timeout_ms=50) == []
        # every fetch but the first continued at the first offset of the partial batch it got last time
        offsets = [offset for offset, _ in fake.fetches]
        assert offsets[:4] == [0, 6, 12, 18]
        consumer.close()


def test_the_remote_consumer_resets_an_out_of_range_position() -> None:
    fake = FakeLog(4)
    with serve(answering(fake.handle)) as server:
        strict = Consumer({"bootstrap.servers": f"127.0.0.1:{server.port}", "auto.offset.reset": "none",
                           "fetch.max.wait.ms": 10})
        strict.assign([("t", 0)])
        strict.seek(("t", 0), 50)
        with pytest.raises(OffsetOutOfRangeError, match="offset 50 is out of range"):
            for _ in range(20):
                strict.poll(timeout_ms=200)
        strict.close()
        fake.start = 6
        lenient = Consumer({"bootstrap.servers": f"127.0.0.1:{server.port}", "auto.offset.reset": "earliest",
                            "fetch.max.wait.ms": 10})
        lenient.assign([("t", 0)])
        lenient.seek(("t", 0), 2)
        got = []
        deadline = time.monotonic() + 5
        while len(got) < 6 and time.monotonic() < deadline:
            got += lenient.poll(timeout_ms=200)
        assert [r.offset for r in got] == list(range(6, 12))
        lenient.close()
