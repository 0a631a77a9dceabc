"""The broker's second control connection: requests answered later, their replies read from the broker's loop.

Theory of operation
-------------------
The broker's first control connection (``ipc.control.ControlClient``, in ``appliance.broker.control_cluster``)
is blocking: a call waits for its reply, which is right for the short calls of the hot and warm paths
(attaching rings, producer ids, metadata).  Creating a topic of a thousand partitions takes the supervisor
seconds, and the broker must serve its other clients meanwhile, so topic changes go over this second
connection, which never waits:

1. :meth:`ControlChannel.send` numbers the request (``"id"``, as ``ipc.control`` describes), remembers
   what to call with its answer, and writes the line.  A request is a short line and the supervisor reads
   its sockets all the time, so the write is a blocking ``sendall`` bounded by :data:`SEND_TIMEOUT_S`; a
   write that cannot finish in that time means the supervisor is wedged and counts as a lost connection.
2. The socket is in the broker's selector.  When it is readable, :meth:`ControlChannel.read` takes what
   arrived (a non-blocking read), splits it into replies (``ipc.control.LineDecoder``) and hands
   each reply to the callback of its id.  A reply whose id nobody waits for any more (the broker stopped
   waiting: :meth:`ControlChannel.forget`) is dropped and counted in :attr:`ControlChannel.late_replies`.
3. A lost connection (end of file, a reset, a line that is not a reply) closes the channel and answers
   every request still owed with a ``ControlError`` BROKER_NOT_AVAILABLE: the operation may or may not have
   happened in the supervisor, which the caller says in its retriable answer.  The owner reconnects later
   (``appliance.broker.control_cluster``: on a timer with back-off).

The channel attaches no rings: closing it costs the supervisor nothing but the replies it still owed.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable, Mapping
from typing import Any, Final

from ipc.control import ControlClient, ControlError, LineDecoder, encode, raise_for_error
from ipc.kafka import ErrorCode
from storage.errors import ApplianceError, ProtocolError

__all__ = ["SEND_TIMEOUT_S", "ControlChannel", "Reply"]

log = logging.getLogger("appliance.broker")

SEND_TIMEOUT_S: Final = 1.0  # writing one request line: longer means the supervisor is not reading
_RECV_BYTES: Final = 1 << 16

# the successful reply, or what a failed one (or the lost connection) raises
Reply = Callable[[dict[str, Any] | ApplianceError], None]


def _lost(path: str, why: str) -> ControlError:
    code = ErrorCode.BROKER_NOT_AVAILABLE
    return ControlError(f"control connection to {path} lost ({why}) before the supervisor answered; the "
                        "operation may have completed", code.name, int(code))  # fmt: skip


class ControlChannel:
    """A non-blocking control connection: send requests, read their replies when the socket is readable."""

    def __init__(self, sock: socket.socket, path: str) -> None:
        self.path = path
        self.sock: socket.socket | None = sock
        self._decoder = LineDecoder()
        self._owed: dict[int, Reply] = {}
        self._last_id = 0
        self.late_replies = 0

    @classmethod
    def connect(cls, path: str, *, timeout_s: float = SEND_TIMEOUT_S) -> ControlChannel:
        """Connect to the control socket at ``path``; ControlError (BROKER_NOT_AVAILABLE) if none listens."""
        with ControlClient.connect(path, timeout_s=timeout_s) as client:  # its errors say what to do
            sock = socket.socket(fileno=os.dup(client.fileno()))  # the connection, ours; the client closes
        sock.settimeout(SEND_TIMEOUT_S)
        return cls(sock, path)

    @property
    def closed(self) -> bool:
        return self.sock is None

    @property
    def owed(self) -> int:
        """Requests sent and not answered yet (nor forgotten)."""
        return len(self._owed)

    def send(self, message: Mapping[str, Any], on_reply: Reply) -> int:
        """Send one request; ``on_reply`` gets its reply (or the error) later, from :meth:`read`.  Returns the
        request's id.  If the channel is closed or breaks now, ``on_reply`` is called at once."""
        self._last_id += 1
        request_id = self._last_id
        self._owed[request_id] = on_reply
        if self.sock is None:
            self._fail_all("the channel is closed")
            return request_id
        try:
            self.sock.settimeout(SEND_TIMEOUT_S)
            self.sock.sendall(encode({**message, "id": request_id}))
        except OSError as e:  # a timeout too: the supervisor is not reading its socket
            self._fail_all(f"sending {message.get('op')!r}: {e or type(e).__name__}")
        return request_id

    def forget(self, request_id: int) -> None:
        """Stop waiting for a request's reply: it is dropped when it comes."""
        self._owed.pop(request_id, None)

    def read(self) -> None:
        """Take the replies that arrived and answer their requests; never blocks."""
        sock = self.sock
        if sock is None:
            return
        try:
            sock.settimeout(0.0)  # a socket with a timeout waits for data even with MSG_DONTWAIT
            data = sock.recv(_RECV_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            self._fail_all(str(e))
            return
        if not data:
            self._fail_all("the supervisor closed it")
            return
        try:
            replies = self._decoder.feed(data)
        except ProtocolError as e:
            self._fail_all(f"a malformed reply: {e}")
            return
        for reply in replies:
            self._answer(reply)

    def _answer(self, reply: dict[str, Any]) -> None:
        request_id = reply.get("id")
        on_reply = self._owed.pop(request_id, None) if isinstance(request_id, int) else None
        if on_reply is None:
            self.late_replies += 1
            return
        try:
            raise_for_error(reply)
        except ControlError as e:
            on_reply(e)
            return
        on_reply(reply)

    def _fail_all(self, why: str) -> None:
        """Close, and answer every request owed with the lost connection."""
        self.close()
        owed, self._owed = self._owed, {}
        if owed:
            log.warning("control channel to %s lost (%s): %d request(s) unanswered", self.path, why,
                        len(owed))  # fmt: skip
        for on_reply in owed.values():
            on_reply(_lost(self.path, why))

    def close(self) -> None:
        sock, self.sock = self.sock, None
        if sock is not None:
            sock.close()
