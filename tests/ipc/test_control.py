"""The control protocol: the line codec (sans-IO), error mapping, server-side buffers and the client.

The supervisor's side of each op is exercised against a real ``appliance serve`` in test_supervisor.py; here
the protocol is checked byte by byte, and the client against a small scripted server on a real Unix socket.
"""

from __future__ import annotations

import itertools
import json
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ipc.control import (
    Attachment,
    ControlClient,
    ControlError,
    LineDecoder,
    encode,
    error_response,
    ok_response,
    raise_for_error,
)
from ipc.control_server import ServerConnection
from ipc.kafka.errors import ErrorCode
from storage.errors import (
    ConfigError,
    ProtocolError,
    RequestTimeoutError,
    TopicExistsError,
    UnknownTopicOrPartitionError,
)

_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
_messages = st.lists(st.dictionaries(st.text(max_size=10), _json, max_size=5), min_size=1, max_size=6)


@settings(max_examples=80, deadline=None)
@given(messages=_messages, cuts=st.lists(st.integers(0, 10_000), max_size=8))
def test_messages_round_trip_wherever_the_stream_is_cut(
    messages: list[dict[str, Any]], cuts: list[int]
) -> None:
    stream = b"".join(encode(m) for m in messages)
    assert all(line.isascii() for line in stream.split(b"\n"))
    points = sorted({c % (len(stream) + 1) for c in cuts} | {0, len(stream)})
    decoder = LineDecoder()
    out: list[dict[str, Any]] = []
    for start, end in itertools.pairwise(points):
        out += decoder.feed(stream[start:end])
    assert out == messages
    assert decoder.pending_bytes == 0


def test_byte_by_byte_and_a_trailing_partial_line() -> None:
    stream = encode({"op": "metadata"}) + encode({"op": "status", "x": [1, 2]}) + b'{"op": "att'
    decoder = LineDecoder()
    out = []
    for i in range(len(stream)):
        out += decoder.feed(stream[i : i + 1])
    assert out == [{"op": "metadata"}, {"op": "status", "x": [1, 2]}]
    assert decoder.pending_bytes == len(b'{"op": "att')
    assert decoder.feed(b'ach"}\n') == [{"op": "attach"}]


@pytest.mark.parametrize(
    ("line", "match"),
    [
        (b"not json\n", "not UTF-8 JSON"),
        (b"[1, 2]\n", "JSON list, expected an object"),
        (b"42\n", "JSON int"),
        (b'"text"\n', "JSON str"),
        (b"\xff\xfe{}\n", "not UTF-8 JSON"),
        (b"\n", "not UTF-8 JSON"),
        (b'{"op": "x"} trailing\n', "not UTF-8 JSON"),
    ],
)
def test_malformed_lines_are_protocol_errors(line: bytes, match: str) -> None:
    with pytest.raises(ProtocolError, match=match):
        LineDecoder().feed(line)


def test_the_metadata_of_a_topic_of_5000_partitions_fits_one_line() -> None:
    partition = {"partition": 4999, "state_page": "/la-0123456789abcdef-state-a-topic-name-4999",
                 "doorbell": "/la-0123456789abcdef-doorbell-a-topic-name-4999", "log_end_offset": 2**40,
                 "high_watermark": 2**40, "log_start_offset": 2**39, "leader_epoch": 7, "writer_pid": 4194304,
                 "writer_uss_bytes": 6 << 20, "offline": None}  # fmt: skip
    reply = ok_response(topic={"name": "a-topic-name", "partitions": [partition] * 5000})
    assert len(encode(reply)) > 1 << 20  # more than the 1 MiB the protocol allowed before
    assert LineDecoder().feed(encode(reply)) == [reply]


def test_overlong_lines_are_refused_with_or_without_a_newline() -> None:
    with pytest.raises(ProtocolError, match="over 64"):
        LineDecoder(max_line_bytes=64).feed(b"{" + b" " * 80 + b"}\n")
    decoder = LineDecoder(max_line_bytes=64)
    decoder.feed(b"{" + b" " * 40)
    with pytest.raises(ProtocolError, match="without a newline"):
        decoder.feed(b" " * 40)


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=300))
def test_garbage_yields_objects_or_a_protocol_error_only(data: bytes) -> None:
    try:
        out = LineDecoder(max_line_bytes=128).feed(data)
    except ProtocolError:
        return
    assert all(isinstance(m, dict) for m in out)


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, UnknownTopicOrPartitionError),
        (ErrorCode.TOPIC_ALREADY_EXISTS, TopicExistsError),
        (ErrorCode.INVALID_CONFIG, ConfigError),
        (ErrorCode.INVALID_PARTITIONS, ConfigError),
        (ErrorCode.INVALID_REPLICATION_FACTOR, ConfigError),
        (ErrorCode.INVALID_TOPIC_EXCEPTION, ConfigError),
        (ErrorCode.TOPIC_DELETION_DISABLED, ConfigError),
        (ErrorCode.BROKER_NOT_AVAILABLE, ControlError),
        (ErrorCode.UNKNOWN_SERVER_ERROR, ControlError),
    ],
)
def test_error_replies_raise_the_matching_exception(code: ErrorCode, expected: type[Exception]) -> None:
    raise_for_error(ok_response(x=1))
    with pytest.raises(expected, match="because") as info:
        raise_for_error(error_response(code, "refused because of reasons"))
    assert isinstance(info.value, ControlError)
    assert info.value.error == code.name and info.value.code == int(code)


def test_a_reply_without_fields_still_raises() -> None:
    with pytest.raises(ControlError, match="refused") as info:
        raise_for_error({"ok": False})
    assert info.value.code == -1


# -- server-side buffers -------------------------------------------------------------------------------------


def test_server_connection_reads_messages_and_sees_the_peer_close() -> None:
    server_end, client_end = socket.socketpair()
    connection = ServerConnection(server_end, 1)
    try:
        assert connection.peer_pid > 0
        assert connection.receive() == ([], False)
        client_end.sendall(encode({"op": "a"}) + b'{"op": ')
        assert connection.receive() == ([{"op": "a"}], False)
        client_end.sendall(b'"b"}\n')
        client_end.close()
        assert connection.receive() == ([{"op": "b"}], True)
    finally:
        connection.close()


def test_server_connection_buffers_what_a_slow_reader_cannot_take_yet() -> None:
    server_end, client_end = socket.socketpair()
    connection = ServerConnection(server_end, 1)
    try:
        big = {"blob": "x" * (4 << 20)}
        connection.send(big)
        assert connection.wants_write
        received = bytearray()
        while connection.wants_write or not received.endswith(b"\n"):
            connection.flush()
            received += client_end.recv(1 << 20)
        assert json.loads(received) == big
    finally:
        connection.close()
        client_end.close()


# -- the client against a scripted server --------------------------------------------------------------------

Script = Callable[[dict[str, Any]], dict[str, Any] | None]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Callable[[Script], str]]:
    """Start a one-connection server at a path that answers each request with ``script(request)``
    (None: close the connection without answering)."""
    threads: list[threading.Thread] = []
    listeners: list[socket.socket] = []

    def start(script: Script) -> str:
        path = str(tmp_path / f"s{len(listeners)}.sock")
        listener = socket.socket(socket.AF_UNIX)
        listener.bind(path)
        listener.listen(1)
        listeners.append(listener)

        def serve() -> None:
            conn, _ = listener.accept()
            decoder = LineDecoder()
            with conn:
                try:
                    while data := conn.recv(65536):
                        for request in decoder.feed(data):
                            reply = script(request)
                            if reply is None:
                                return
                            if "id" in request:
                                reply = {**reply, "id": request["id"]}
                            conn.sendall(encode(reply))
                except OSError:
                    return  # the client went away (a test of timeouts)

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        threads.append(thread)
        return path

    yield start
    for listener in listeners:
        listener.close()
    for thread in threads:
        thread.join(2)


def test_client_requests_and_parses_replies(server: Callable[[Script], str]) -> None:
    def script(request: dict[str, Any]) -> dict[str, Any]:
        if request["op"] == "init_producer_id":
            return ok_response(producer_id=41, producer_epoch=0)
        if request["op"] == "attach":
            assert request == {"op": "attach", "topic": "t", "partition": 2, "producer_id": 41, "id": 2}
            return ok_response(session=9, ring="/r", space="/s", doorbell="/d", state_page="/p",
                               ring_bytes=65536, ack_slots=64, max_message_bytes=1000)  # fmt: skip
        return error_response(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"no topic {request.get('topic')!r}")

    with ControlClient.connect(server(script), timeout_s=2) as client:
        assert client.init_producer_id() == (41, 0)
        attachment = client.attach("t", 2, producer_id=41)
        assert isinstance(attachment, Attachment)
        assert (attachment.ring, attachment.names.space, attachment.names.doorbell) == ("/r", "/s", "/d")
        assert (attachment.session, attachment.ring_bytes, attachment.max_message_bytes) == (9, 65536, 1000)
        with pytest.raises(UnknownTopicOrPartitionError, match="no topic 'x'"):
            client.request({"op": "metadata", "topic": "x"})
        assert client.init_producer_id() == (41, 0), "an error reply leaves the connection usable"
    assert client.closed


def test_replies_out_of_order_are_matched_by_id(tmp_path: Path) -> None:
    """A server answering a later request first (a long operation answered when done): each request gets
    its own reply, and a reply after its request timed out is dropped."""
    path = str(tmp_path / "ooo.sock")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    listener.listen(1)

    def serve() -> None:
        conn, _ = listener.accept()
        decoder = LineDecoder()
        held: list[dict[str, Any]] = []
        with conn:
            while data := conn.recv(65536):
                for request in decoder.feed(data):
                    if request["op"] == "create_topic":
                        held.append(request)  # answered after the next request
                        continue
                    conn.sendall(encode({"ok": True, "op": request["op"], "id": request["id"]}))
                    for late in held:
                        conn.sendall(encode({"ok": True, "op": "late", "id": late["id"]}))
                    held.clear()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        with ControlClient.connect(path, timeout_s=2) as client:
            with pytest.raises(RequestTimeoutError):
                client.request({"op": "create_topic"}, timeout_s=0.1)
            assert client.request({"op": "status"})["op"] == "status"
            assert client.request({"op": "metadata"})["op"] == "metadata"
            assert client.late_replies == 1
    finally:
        listener.close()
        thread.join(2)


def test_client_times_out_and_reports_a_vanished_supervisor(server: Callable[[Script], str]) -> None:
    gate = threading.Event()

    def slow(request: dict[str, Any]) -> dict[str, Any]:
        gate.wait(2)
        return ok_response()

    client = ControlClient.connect(server(slow), timeout_s=0.2)
    with pytest.raises(RequestTimeoutError, match=r"no reply in 0\.2 s; the operation may still complete"):
        client.status()
    gate.set()
    assert client.status() == {"ok": True, "id": 2}, "the late reply to the first request is dropped"
    assert client.late_replies == 1
    assert client.request({"op": "status"}, timeout_s=1) == {"ok": True, "id": 3}
    client.close()

    client = ControlClient.connect(server(lambda request: None), timeout_s=2)
    with pytest.raises(ControlError, match="closed the control connection"):
        client.status()


def test_connecting_where_no_appliance_listens_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(ControlError, match=r"no appliance is listening.*appliance serve") as info:
        ControlClient.connect(tmp_path / "nothing.sock")
    assert info.value.error == "BROKER_NOT_AVAILABLE"


# -- the non-blocking mode (ipc.control_nowait) ------------------------------------------------------------


def _read_until(client: ControlClient, delivered: list[Any], count: int) -> None:
    """Call ``client.read()`` as an event loop would, when its socket is readable, until ``count`` replies
    were delivered (or 5 s passed)."""
    deadline = time.monotonic() + 5
    while len(delivered) < count:
        left_s = deadline - time.monotonic()
        assert left_s > 0, f"{len(delivered)} of {count} replies delivered"
        select.select([client], [], [], left_s)
        client.read()


def _holding_server(path: str, held_op: str, reply_first: bool) -> threading.Thread:
    """A one-connection server that holds its reply to ``held_op`` and sends it in the same write as its
    reply to the next request (``reply_first``: after it, else before it)."""
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    listener.listen(1)

    def serve() -> None:
        conn, _ = listener.accept()
        listener.close()
        decoder = LineDecoder()
        held: list[dict[str, Any]] = []
        with conn:
            while data := conn.recv(65536):
                for request in decoder.feed(data):
                    if request["op"] == held_op:
                        held.append(request)
                        continue
                    own = [encode({"ok": True, "op": request["op"], "id": request["id"]})]
                    late = [encode({"ok": True, "op": r["op"], "id": r["id"]}) for r in held]
                    held.clear()
                    conn.sendall(b"".join(own + late if reply_first else late + own))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread


def test_non_blocking_requests_are_answered_by_id_in_any_order(server: Callable[[Script], str]) -> None:
    def script(request: dict[str, Any]) -> dict[str, Any]:
        if request["op"] == "attach_many":
            return error_response(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "no topic 'nope'")
        return ok_response(op=request["op"])

    delivered: list[tuple[str, Any]] = []
    with ControlClient.connect(server(script), timeout_s=2) as client:
        first = client.send({"op": "metadata"}, lambda reply: delivered.append(("metadata", reply)))
        second = client.send({"op": "attach_many"}, lambda reply: delivered.append(("attach_many", reply)))
        assert second == first + 1
        assert client.owed == 2
        _read_until(client, delivered, 2)
        assert client.owed == 0
        assert client.status()["ok"] is True, "a blocking call on the same connection still works"
    replies = dict(delivered)
    assert replies["metadata"] == {"ok": True, "op": "metadata", "id": first}
    assert isinstance(replies["attach_many"], UnknownTopicOrPartitionError)
    assert isinstance(replies["attach_many"], ControlError)


@pytest.mark.parametrize("reply_first", [True, False], ids=["own-reply-first", "held-reply-first"])
def test_a_reply_read_by_a_blocking_call_is_delivered_by_the_next_read(tmp_path: Path,
                                                                        reply_first: bool) -> None:
    path = str(tmp_path / "held.sock")
    thread = _holding_server(path, "attach_many", reply_first)
    delivered: list[Any] = []
    try:
        with ControlClient.connect(path, timeout_s=2) as client:
            request_id = client.send({"op": "attach_many"}, delivered.append)
            assert client.status()["op"] == "status"  # its read took the held reply too
            assert (client.owed, client.arrived, delivered) == (0, 1, []), "delivered only by read()"
            assert client.read() == 1
            assert delivered == [{"ok": True, "op": "attach_many", "id": request_id}]
            assert client.late_replies == 0
    finally:
        thread.join(2)


def test_a_lost_connection_answers_every_owed_request(server: Callable[[Script], str]) -> None:
    delivered: list[Any] = []
    client = ControlClient.connect(server(lambda request: None), timeout_s=2)  # closes without a reply
    client.send({"op": "attach_many"}, delivered.append)
    _read_until(client, delivered, 1)
    assert isinstance(delivered[0], ControlError)
    assert delivered[0].error == "BROKER_NOT_AVAILABLE"
    assert "may have completed" in str(delivered[0])
    assert client.closed
    with pytest.raises(ControlError, match="is closed") as info:
        client.send({"op": "attach_many"}, delivered.append)
    assert info.value.error == "BROKER_NOT_AVAILABLE"


def test_a_forgotten_request_has_its_reply_dropped(server: Callable[[Script], str]) -> None:
    delivered: list[Any] = []
    with ControlClient.connect(server(lambda request: ok_response()), timeout_s=2) as client:
        client.forget(client.send({"op": "detach_many"}, delivered.append))
        assert client.owed == 0
        deadline = time.monotonic() + 5
        while client.late_replies == 0:
            assert time.monotonic() < deadline, "the reply never came"
            select.select([client], [], [], 0.1)
            client.read()
        assert delivered == []
