"""``ipc.control_server.ControlServer`` on a real Unix socket, driven by a real selector loop in a
thread.

The supervisor and the replica process both serve their control socket with it; their own tests exercise
the ops.  Here: the socket's permissions, refusing a second server, replies larger than the socket buffer,
malformed streams, ``on_close`` and the socket file's removal.
"""

from __future__ import annotations

import logging
import os
import selectors
import socket
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ipc.control import ControlClient, LineDecoder, encode, ok_response
from ipc.control_server import ControlServer, ServerConnection
from ipc.kafka.errors import ErrorCode
from ipc.shm import Permissions
from storage.errors import ApplianceError

_log = logging.getLogger("test-control-server")


class Served:
    """A ControlServer whose selector loop runs in a thread until :meth:`stop`."""

    def __init__(self, path: str) -> None:
        self.selector = selectors.DefaultSelector()
        self.closed: list[int] = []
        self.server = ControlServer.bind(path, self.selector, self._handle, permissions=Permissions(),
                                         backlog=8, log=_log, on_close=lambda c: self.closed.append(c.id))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    @staticmethod
    def _handle(connection: ServerConnection, message: dict[str, Any]) -> dict[str, Any]:
        if message.get("op") == "big":
            return ok_response(blob="x" * int(message["bytes"]))
        return ok_response(echo=message, connection=connection.id)

    def _loop(self) -> None:
        while not self._stop.is_set():
            for key, events in self.selector.select(timeout=0.02):
                assert self.server.on_event(key, events)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.server.close()
        self.selector.close()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    s = Served(str(tmp_path / "ctl.sock"))
    try:
        yield s
    finally:
        s.stop()


def _raw(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(5)
    sock.connect(path)
    return sock


def _replies(sock: socket.socket, count: int) -> list[dict[str, Any]]:
    decoder, out = LineDecoder(max_line_bytes=1 << 24), []
    while len(out) < count:
        data = sock.recv(1 << 16)
        if not data:
            break
        out += decoder.feed(data)
    return out


def test_the_socket_is_owner_only_and_a_second_server_is_refused(served: Served) -> None:
    path = served.server.path
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    with pytest.raises(ApplianceError, match="in use by another appliance"):
        ControlServer.bind(path, selectors.DefaultSelector(), Served._handle, permissions=Permissions(),
                           backlog=1, log=_log)
    with ControlClient.connect(path) as client:  # the first server still answers
        assert client.request({"op": "ping"})["echo"] == {"op": "ping", "id": 1}  # numbered by the client


def test_a_socket_file_left_by_a_dead_server_is_replaced(tmp_path: Path) -> None:
    path = str(tmp_path / "ctl.sock")
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(path)
    stale.close()  # the file stays, nobody listens
    s = Served(path)
    try:
        with ControlClient.connect(path) as client:
            assert client.request({"op": "ping"})["connection"] == 1
    finally:
        s.stop()
    assert not os.path.exists(path)


def test_replies_larger_than_the_socket_buffer_arrive_whole_and_in_order(served: Served) -> None:
    sock = _raw(served.server.path)
    try:
        sock.sendall(encode({"op": "big", "bytes": 3_000_000}) + encode({"op": "after"}))
        big, after = _replies(sock, 2)
    finally:
        sock.close()
    assert big["blob"] == "x" * 3_000_000
    assert after["echo"] == {"op": "after"}


def test_a_malformed_stream_gets_invalid_request_then_only_that_connection_closes(served: Served) -> None:
    good = ControlClient.connect(served.server.path)
    bad = _raw(served.server.path)
    try:
        bad.sendall(b"this is not json\n")
        replies = _replies(bad, 2)
        assert len(replies) == 1 and replies[0]["error"] == ErrorCode.INVALID_REQUEST.name
        assert bad.recv(1) == b""  # closed after the one reply
        assert good.request({"op": "still"})["echo"] == {"op": "still", "id": 1}
    finally:
        bad.close()
        good.close()


def test_on_close_runs_for_each_connection_that_ends_and_close_removes_the_file(tmp_path: Path) -> None:
    path = str(tmp_path / "ctl.sock")
    s = Served(path)
    try:
        for _ in range(3):
            with ControlClient.connect(path) as client:
                client.request({"op": "ping"})
        deadline = time.monotonic() + 5
        while len(s.closed) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)  # on_close runs in the server's loop thread
        assert sorted(s.closed) == [1, 2, 3]
        assert s.server.connections == {}
    finally:
        s.stop()
    assert not os.path.exists(path)
