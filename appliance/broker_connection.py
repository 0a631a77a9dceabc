"""One client connection of the broker: bytes in through a FrameReader, responses out in request order.

Theory of operation
-------------------
The broker runs one thread and one ``selectors`` loop; a :class:`Connection` is the state it keeps per
socket.  It never blocks: the socket is non-blocking, and whatever cannot be sent now waits in the
connection's *send queue* until the socket is writable again.

**Order.**  Kafka answers the requests of one connection in the order they arrived (clients match responses
to requests by position as well as by correlation id).  So a connection handles one request at a time: a
request that cannot be answered at once -- a Fetch waiting for records (long poll), a Produce waiting for
the partition writer's ack -- *parks* the connection; the frames behind it stay in the FrameReader until its
response is queued (:meth:`unpark`).  Queued responses leave in order because they sit in one queue.

**Back-pressure.**  A connection stops *reading* (the loop drops its read interest) while it is parked, or
while its send queue holds more than :data:`SEND_QUEUE_LIMIT_BYTES` of unsent response bytes.  While it
reads, every complete frame is handled before the next ``recv``, so at most one ``recv`` of requests
(:data:`RECV_BYTES`) waits in the frame reader.  A client that sends requests faster than it reads responses
is therefore held back by TCP flow control, not by broker memory.  Kafka mutes a channel in the same
situations.

**Record bytes.**  A response comes from ``ipc.kafka.encode_response_parts`` as ``bytes`` parts and
:class:`~ipc.kafka.FileRegion` parts.  Bytes are written with ``send`` (``MSG_MORE`` while more parts follow,
so a small header rides in the same TCP segment as the records after it), regions with ``os.sendfile``
straight from the segment file.  A region's descriptor belongs to the partition's ``LogReader`` and is only
valid until that reader's next call; a region that must wait in the queue therefore gets its own ``dup`` of
the descriptor, closed once the region is sent.  The frame's size prefix already counts every region, so a
file that turns out shorter than the region (truncated under us) cannot be padded: the connection is closed.
"""

from __future__ import annotations

import collections
import logging
import os
import socket
from collections.abc import Iterable

from ipc.kafka import FileRegion, FrameReader

__all__ = [
    "RECV_BYTES",
    "SEND_QUEUE_LIMIT_BYTES",
    "Connection",
    "ConnectionClosed",
]

log = logging.getLogger("appliance.broker")

SEND_QUEUE_LIMIT_BYTES = 4 * 1024 * 1024  # stop reading requests while more than this waits to be sent
RECV_BYTES = 256 * 1024  # one recv() at most

_MSG_MORE = getattr(socket, "MSG_MORE", 0)
_SENDFILE_CHUNK_BYTES = 1 << 30  # os.sendfile moves at most ~2 GiB per call on Linux


class ConnectionClosed(Exception):
    """The peer went away (EOF, reset) or the connection must be dropped; the loop closes it."""


class _Region:
    """A FileRegion in the send queue: a descriptor we own (a dup) and what is left to send of it."""

    __slots__ = ("fd", "owned", "position", "remaining")

    def __init__(self, fd: int, position: int, remaining: int, owned: bool) -> None:
        self.fd = fd
        self.position = position
        self.remaining = remaining
        self.owned = owned

    def release(self) -> None:
        if self.owned and self.fd >= 0:
            os.close(self.fd)
        self.fd = -1


class Connection:
    """The broker's state for one accepted socket (TCP or Unix).  See the module docstring."""

    __slots__ = (
        "_queue",
        "closed",
        "listener",
        "parked",
        "peer",
        "queued_bytes",
        "reader",
        "sock",
        "want_read",
        "want_write",
    )

    def __init__(self, sock: socket.socket, peer: str, listener: str, max_frame_bytes: int) -> None:
        sock.setblocking(False)
        self.sock = sock
        self.peer = peer  # "127.0.0.1:53412" or "unix:/path" -- for log lines
        self.listener = listener  # the listener it came through (its advertised address goes in Metadata)
        self.reader = FrameReader(max_frame_bytes)
        self._queue: collections.deque[memoryview | _Region] = collections.deque()
        self.queued_bytes = 0  # response bytes queued and not yet sent
        self.parked = False  # a request is being answered later; hold the frames behind it
        self.closed = False
        self.want_read = True  # the interest the loop registered for this socket
        self.want_write = False

    def __repr__(self) -> str:
        return f"Connection({self.peer} via {self.listener})"

    # -- reading ------------------------------------------------------------------------------------------

    def receive(self, scratch: memoryview) -> int:
        """One ``recv`` into ``scratch``, fed to the frame reader; the byte count (0: nothing to read now).

        Raises :class:`ConnectionClosed` at EOF or on a reset, and ``ProtocolError`` from the reader
        (a size prefix that is negative or above ``socket.request.max.bytes``)."""
        try:
            n = self.sock.recv_into(scratch, min(len(scratch), RECV_BYTES))
        except (BlockingIOError, InterruptedError):
            return 0
        except OSError as e:
            raise ConnectionClosed(f"recv: {e}") from None
        if n == 0:
            raise ConnectionClosed("closed by the peer")
        self.reader.feed(scratch[:n])
        return n

    @property
    def may_handle(self) -> bool:
        """May the next buffered request be handled now (not parked, send queue not over its limit)?"""
        return not self.parked and not self.closed and self.queued_bytes <= SEND_QUEUE_LIMIT_BYTES

    @property
    def may_read(self) -> bool:
        """Read more?  Only while requests may be handled: a parked or backed-up connection is muted."""
        return self.may_handle

    # -- writing ------------------------------------------------------------------------------------------

    def respond(self, parts: Iterable[bytes | FileRegion]) -> bool:
        """Queue one response (its parts in order) and send what the socket takes now; True when the whole
        queue is sent.  Call it in the same turn the regions were read (their descriptors are only valid
        until the partition reader's next call); regions still queued on return own a ``dup``."""
        self._append(parts)
        return self.send_queued()

    def _append(self, parts: Iterable[bytes | FileRegion]) -> None:
        for part in parts:
            if isinstance(part, FileRegion):
                if part.size > 0:
                    self._queue.append(_Region(part.fd, part.position, part.size, owned=False))
                    self.queued_bytes += part.size
            elif part:
                self._queue.append(memoryview(part))
                self.queued_bytes += len(part)

    def send_queued(self) -> bool:
        """Send as much of the queue as the socket takes now; True when the queue is empty.

        Regions left unsent get a descriptor of their own (see the module docstring) before returning.
        Raises :class:`ConnectionClosed` if the peer is gone or a segment file is shorter than its region."""
        queue = self._queue
        fileno = self.sock.fileno()
        try:
            while queue:
                part = queue[0]
                if isinstance(part, memoryview):
                    flags = _MSG_MORE if len(queue) > 1 else 0
                    sent = self.sock.send(part, flags)
                    self.queued_bytes -= sent
                    if sent < len(part):
                        queue[0] = part[sent:]
                        break
                    queue.popleft()
                else:
                    sent = os.sendfile(
                        fileno, part.fd, part.position, min(part.remaining, _SENDFILE_CHUNK_BYTES)
                    )
                    if sent == 0:
                        raise ConnectionClosed(
                            f"segment file (fd {part.fd}) ends before position "
                            f"{part.position + part.remaining}: truncated while its bytes were being sent"
                        )
                    self.queued_bytes -= sent
                    part.position += sent
                    part.remaining -= sent
                    if part.remaining:
                        break
                    part.release()
                    queue.popleft()
        except (BlockingIOError, InterruptedError):
            pass
        except OSError as e:
            raise ConnectionClosed(f"send: {e}") from None
        if queue:
            self._own_regions()
            return False
        return True

    def _own_regions(self) -> None:
        for part in self._queue:
            if isinstance(part, _Region) and not part.owned:
                part.fd = os.dup(part.fd)
                part.owned = True

    @property
    def has_queued(self) -> bool:
        return bool(self._queue)

    # -- lifetime -----------------------------------------------------------------------------------------

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for part in self._queue:
            if isinstance(part, _Region):
                part.release()
        self._queue.clear()
        self.queued_bytes = 0
        try:
            self.sock.close()
        except OSError as e:  # pragma: no cover -- close() of a socket we own does not fail in practice
            log.debug("%s: close: %s", self.peer, e)
