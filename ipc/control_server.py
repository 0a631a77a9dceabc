"""The control socket's server side: one connection's buffers, and the listening socket with its connections.

The protocol (one JSON object per line, one reply per request, in order) and the client are
``appliance.control``; this module is what the supervisor and a replica process serve it with.
:class:`ServerConnection` is one accepted connection: non-blocking reads decoded into messages, replies
queued and written as the socket takes them.  :class:`ControlServer` is the listening socket (created with
the service's permissions) and its connections, driven by the owner's selector loop: it answers each request
with the owner's :data:`Handler` and tells the owner when a connection closes.

A handler may answer later: it returns None and keeps the connection and the request, and calls
:meth:`ServerConnection.reply` when the operation is done (a connection closed meanwhile drops the reply).
Every reply carries its request's ``"id"`` when the request had one, so the client matches replies that come
out of request order, or after it stopped waiting.
"""

from __future__ import annotations

import logging
import os
import selectors
import socket
from collections.abc import Callable, Mapping
from typing import Any

from ipc.control import LineDecoder, encode, error_response
from ipc.kafka.errors import ErrorCode
from ipc.shm import Permissions
from storage.errors import ApplianceError, ProtocolError

__all__ = ["CloseConnection", "ControlServer", "Handler", "ServerConnection"]


class CloseConnection(Exception):
    """Raised by a handler: close this connection without a reply (the owner's ``on_close`` runs)."""


class ServerConnection:
    """The supervisor's end of one client connection: non-blocking reads into messages, buffered writes."""

    def __init__(self, sock: socket.socket, connection_id: int,
                 on_blocked: Callable[[ServerConnection], None] | None = None) -> None:  # fmt: skip
        sock.setblocking(False)
        self.sock = sock
        self.id = connection_id
        self.peer_pid = _peer_pid(sock)
        self.closed = False
        self._decoder = LineDecoder()
        self._out = bytearray()
        self._on_blocked = on_blocked  # a reply outside the server's own turn did not fit the socket

    def reply(self, request: Mapping[str, Any], response: Mapping[str, Any]) -> None:
        """Send ``response`` to ``request`` (with its ``"id"``); nothing if the connection has closed."""
        if self.closed:
            return
        request_id = request.get("id")
        self.send({**response, "id": request_id} if request_id is not None else response)
        if self.wants_write and self._on_blocked is not None:
            self._on_blocked(self)

    def fileno(self) -> int:
        return self.sock.fileno()

    def receive(self) -> tuple[list[dict[str, Any]], bool]:
        """(messages that arrived, whether the peer closed).  ProtocolError for a malformed stream."""
        messages: list[dict[str, Any]] = []
        while True:
            try:
                data = self.sock.recv(1 << 16)
            except BlockingIOError:
                return messages, False
            except ConnectionResetError:
                return messages, True
            if not data:
                return messages, True
            messages += self._decoder.feed(data)

    def send(self, message: Mapping[str, Any]) -> None:
        """Queue a message and write as much as the socket takes now."""
        self._out += encode(message)
        self.flush()

    def flush(self) -> bool:
        """Write queued bytes; True when nothing is left (else wait for the socket to be writable)."""
        while self._out:
            try:
                sent = self.sock.send(self._out)
            except BlockingIOError:
                return False
            except (BrokenPipeError, ConnectionResetError):
                self._out.clear()
                return True
            del self._out[:sent]
        return True

    def finish(self, timeout_s: float) -> None:
        """Write queued bytes, waiting up to ``timeout_s`` for each write (the last reply before a close)."""
        self.sock.settimeout(timeout_s)
        try:
            self.flush()
        except TimeoutError:
            pass
        finally:
            self.sock.setblocking(False)

    @property
    def wants_write(self) -> bool:
        return bool(self._out)

    def close(self) -> None:
        self.closed = True
        self.sock.close()


def _peer_pid(sock: socket.socket) -> int:
    try:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
    except OSError:
        return 0
    return int.from_bytes(creds[:4], "little", signed=True)


Handler = Callable[[ServerConnection, Mapping[str, Any]], "dict[str, Any] | None"]  # None: replied later


class ControlServer:
    """The listening control socket and its connections, driven by the owner's selector loop.

    The supervisor and a replica process both serve one.  :meth:`bind` creates the socket; the owner hands
    every key its selector returns to :meth:`on_event` first, which returns False for keys that are not the
    control socket's.  Each request is answered by ``handle(connection, request)``, in order; a reply the
    socket cannot take at once is written when the socket becomes writable.  A stream that is not
    newline-separated JSON objects gets one INVALID_REQUEST reply and the connection is closed.
    ``on_close(connection)`` runs for every connection that closes while the server runs, not at
    :meth:`close`.
    """

    def __init__(
        self,
        path: str,
        listener: socket.socket,
        selector: selectors.BaseSelector,
        handle: Handler,
        *,
        log: logging.Logger,
        on_close: Callable[[ServerConnection], None] | None = None,
    ) -> None:
        self.path = path
        self.connections: dict[int, ServerConnection] = {}
        self._listener: socket.socket | None = listener
        self._selector = selector
        self._handle = handle
        self._on_close = on_close
        self._log = log
        self._next_connection = 0
        selector.register(listener, selectors.EVENT_READ, self)

    @classmethod
    def bind(
        cls,
        path: str,
        selector: selectors.BaseSelector,
        handle: Handler,
        *,
        permissions: Permissions,
        backlog: int,
        log: logging.Logger,
        on_close: Callable[[ServerConnection], None] | None = None,
    ) -> ControlServer:
        """Listen at ``path``, created with ``permissions`` (mode, and group when it names one).

        A socket file left by a previous run is replaced; ApplianceError if another process answers there.
        """
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if os.path.exists(path):
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.connect(path)
            except OSError:
                os.unlink(path)  # a previous run's leftover
            else:
                raise ApplianceError(f"control socket {path} is in use by another appliance")
            finally:
                probe.close()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            old_umask = os.umask(0o777 & ~permissions.mode)  # never a moment with wider permissions
            try:
                listener.bind(path)
            finally:
                os.umask(old_umask)
            os.chmod(path, permissions.mode)
            if permissions.gid is not None:
                os.chown(path, -1, permissions.gid)
            listener.listen(backlog)
            listener.setblocking(False)
        except BaseException:
            listener.close()
            raise
        return cls(path, listener, selector, handle, log=log, on_close=on_close)

    def on_event(self, key: selectors.SelectorKey, events: int) -> bool:
        """Serve ``key`` if it is the control socket's (then True) after the selector reported ``events``."""
        if key.data is self:
            self._accept()
            return True
        if not isinstance(key.data, ServerConnection):
            return False
        if self.connections.get(key.data.id) is key.data:  # else closed earlier in the same round
            self._serve(key.data, events)
        return True

    def _accept(self) -> None:
        while self._listener is not None:
            try:
                sock, _ = self._listener.accept()
            except BlockingIOError:
                return
            except OSError as exc:
                self._log.warning("control socket accept failed: %s", exc)
                return
            self._next_connection += 1
            connection = ServerConnection(sock, self._next_connection, self._watch)
            self.connections[connection.id] = connection
            self._selector.register(sock, selectors.EVENT_READ, connection)

    def _serve(self, connection: ServerConnection, events: int) -> None:
        if events & selectors.EVENT_WRITE and connection.flush():
            self._watch(connection)
        if not events & selectors.EVENT_READ:
            return
        try:
            messages, closed = connection.receive()
        except ProtocolError as exc:
            self._log.warning("control connection %d (pid %d): %s; closing it", connection.id,
                              connection.peer_pid, exc)  # fmt: skip
            connection.send(error_response(ErrorCode.INVALID_REQUEST, str(exc)))
            self._close_connection(connection)
            return
        for message in messages:
            if connection.closed:
                break
            try:
                response = self._handle(connection, message)
            except CloseConnection as exc:
                self._log.warning("control connection %d (pid %d) closed without a reply to %r: %s",
                                  connection.id, connection.peer_pid, message.get("op"), exc)  # fmt: skip
                self._close_connection(connection)
                return
            if response is not None:
                connection.reply(message, response)
        if closed:
            self._close_connection(connection)
        else:
            self._watch(connection)

    def _watch(self, connection: ServerConnection) -> None:
        if connection.closed or self.connections.get(connection.id) is not connection:
            return
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if connection.wants_write else 0)
        self._selector.modify(connection.sock, events, connection)

    def _close_connection(self, connection: ServerConnection) -> None:
        self._unregister(connection.sock)
        self.connections.pop(connection.id, None)
        connection.close()
        if self._on_close is not None:
            self._on_close(connection)

    def _unregister(self, sock: socket.socket) -> None:
        try:
            self._selector.unregister(sock)
        except (KeyError, ValueError):
            pass

    def stop_accepting(self) -> None:
        """Close the listening socket and remove its file: no new connections; open ones stay."""
        listener, self._listener = self._listener, None
        if listener is None:
            return
        self._unregister(listener)
        listener.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def close(self, *, flush_s: float = 0.0) -> None:
        """Stop accepting and close every connection, first giving queued replies up to ``flush_s`` each."""
        self.stop_accepting()
        for connection in list(self.connections.values()):
            if flush_s > 0 and connection.wants_write:
                connection.finish(flush_s)
            self._unregister(connection.sock)
            connection.close()
        self.connections.clear()

    def close_in_child(self) -> None:
        """In a forked child: close the inherited descriptors; the socket file stays the parent's."""
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        for connection in self.connections.values():
            connection.close()
