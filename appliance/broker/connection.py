"""One client connection of the broker: bytes in through a FrameReader, responses out in request order.

Theory of operation
-------------------
The broker runs one thread and one ``selectors`` loop; a :class:`Connection` is the state it keeps per
socket.  It never blocks: the socket is non-blocking, and whatever cannot be sent now waits in the
connection's *send queue* until the socket is writable again.

**Order.**  Kafka answers the requests of one connection in the order they arrived (clients match responses
to requests by position as well as by correlation id).  A request that cannot be answered at once takes a
:class:`ResponseSlot` -- its place in the response order -- and is answered into it later; responses of
later requests wait behind an unfilled slot.  Two kinds of requests wait:

* a Produce waiting for the partition writers' acks takes a slot and the connection goes on handling the
  requests behind it, up to :data:`MAX_PENDING_RESPONSES` unfilled slots -- so a client that pipelines
  (librdkafka keeps up to 5 produce requests in flight) keeps the writers busy;
* a Fetch waiting for records (long poll) takes a slot and *parks* the connection: nothing behind it is
  handled until it is answered, as in Kafka, and the frames behind it stay in the FrameReader.

**Back-pressure.**  A connection stops *reading* (the loop drops its read interest) while it is parked, or
has :data:`MAX_PENDING_RESPONSES` unfilled slots, or while its send queue holds more than
:data:`SEND_QUEUE_LIMIT_BYTES` of unsent response bytes.  While it
reads, every complete frame is handled before the next ``recv``, so at most one ``recv`` of requests
(:data:`RECV_BYTES`) waits in the frame reader.  A client that sends requests faster than it reads responses
is therefore held back by TCP flow control, not by broker memory.  Kafka mutes a channel in the same
situations.

**Record bytes.**  A response comes from ``ipc.kafka.encode_response_parts`` as ``bytes`` parts and
:class:`~ipc.kafka.FileRegion` parts.  Bytes are written with ``send`` (``MSG_MORE`` while more parts follow,
so a small header rides in the same TCP segment as the records after it), regions with ``os.sendfile``
straight from the segment file.  A region's descriptor belongs to the partition's ``LogReader`` and is only
valid until that reader's next call; a region that must wait (in the send queue, or in a slot behind an
unfilled one) therefore gets its own ``dup`` of the descriptor, closed once the region is sent.  The
frame's size prefix already counts every region, so a file that turns out shorter than the region
(truncated under us) cannot be padded: the connection is closed.
"""

from __future__ import annotations

import collections
import logging
import os
import socket
from collections.abc import Iterable

from ipc.kafka import FileRegion, FrameReader

__all__ = [
    "MAX_PENDING_RESPONSES",
    "RECV_BYTES",
    "SEND_QUEUE_LIMIT_BYTES",
    "Connection",
    "ConnectionClosed",
    "ResponseSlot",
]

log = logging.getLogger("appliance.broker")

SEND_QUEUE_LIMIT_BYTES = 4 * 1024 * 1024  # stop reading requests while more than this waits to be sent
RECV_BYTES = 256 * 1024  # one recv() at most
MAX_PENDING_RESPONSES = 16  # unfilled response slots (requests waiting for acks) before reading stops

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


class ResponseSlot:
    """The place of one waiting request's response in its connection's response order."""

    __slots__ = ("connection", "items")

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self.items: list[memoryview | _Region] | None = None  # None until the response is known


class Connection:
    """The broker's state for one accepted socket (TCP or Unix).  See the module docstring."""

    __slots__ = (
        "_queue",
        "_slots",
        "closed",
        "listener",
        "parked",
        "peer",
        "principal",
        "queued_bytes",
        "reader",
        "sasl_mechanism",
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
        self._slots: collections.deque[ResponseSlot] = collections.deque()  # reserved, oldest first
        self.queued_bytes = 0  # response bytes queued and not yet sent
        self.parked = False  # a request is being answered later; hold the frames behind it
        self.closed = False
        self.want_read = True  # the interest the loop registered for this socket
        self.want_write = False
        self.sasl_mechanism: str | None = None  # after a successful SaslHandshake
        self.principal: str | None = None  # after SaslAuthenticate: a replica (replicas.cluster_auth)

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
        """May the next buffered request be handled now (not parked, not too many responses pending, send
        queue not over its limit)?"""
        return (
            not self.parked
            and not self.closed
            and self.queued_bytes <= SEND_QUEUE_LIMIT_BYTES
            and len(self._slots) < MAX_PENDING_RESPONSES
        )

    @property
    def may_read(self) -> bool:
        """Read more?  Only while requests may be handled: a parked or backed-up connection is muted."""
        return self.may_handle

    # -- writing ------------------------------------------------------------------------------------------

    def respond(self, parts: Iterable[bytes | FileRegion]) -> None:
        """Answer the request being handled now: queue its response (behind any unfilled slot) and send
        what the socket takes.  Call it in the same turn the regions were read (their descriptors are only
        valid until the partition reader's next call); regions that must wait get a ``dup``."""
        if self._slots:
            self.fill(self.reserve(), parts)
            return
        self._enqueue(_items(parts))
        self.send_queued()

    def reserve(self) -> ResponseSlot:
        """Take the next place in the response order for a request answered later (:meth:`fill`)."""
        slot = ResponseSlot(self)
        self._slots.append(slot)
        return slot

    def fill(self, slot: ResponseSlot, parts: Iterable[bytes | FileRegion]) -> None:
        """Answer a waiting request (``parts`` empty: no response, acks=0); queue every response that is
        now at the head of the order, and send what the socket takes."""
        if self.closed:
            return
        slots = self._slots
        items = _items(parts)
        if slot is not slots[0]:
            for item in items:
                if isinstance(item, _Region):
                    item.fd = os.dup(item.fd)  # it waits behind other responses: own the descriptor
                    item.owned = True
        slot.items = items
        while slots and slots[0].items is not None:
            head = slots.popleft()
            self._enqueue(head.items or [])
            head.items = None
        self.send_queued()

    @property
    def pending_responses(self) -> int:
        """Reserved slots not yet filled or not yet queued."""
        return len(self._slots)

    def _enqueue(self, items: list[memoryview | _Region]) -> None:
        self._queue.extend(items)
        self.queued_bytes += sum(_size(item) for item in items)

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
        for slot in self._slots:
            for item in slot.items or ():
                if isinstance(item, _Region):
                    item.release()
        self._slots.clear()
        self.queued_bytes = 0
        try:
            self.sock.close()
        except OSError as e:  # pragma: no cover -- close() of a socket we own does not fail in practice
            log.debug("%s: close: %s", self.peer, e)


def _items(parts: Iterable[bytes | FileRegion]) -> list[memoryview | _Region]:
    """Send-queue items for a response's parts (empty parts dropped; regions not owned yet)."""
    items: list[memoryview | _Region] = []
    for part in parts:
        if isinstance(part, FileRegion):
            if part.size > 0:
                items.append(_Region(part.fd, part.position, part.size, owned=False))
        elif part:
            items.append(memoryview(part))
    return items


def _size(item: memoryview | _Region) -> int:
    return item.remaining if isinstance(item, _Region) else len(item)
