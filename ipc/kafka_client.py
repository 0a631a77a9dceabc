"""A small blocking Kafka protocol client: one connection, requests out, responses in, with timeouts.

Theory of operation
-------------------
This is the thin driver under the sans-IO codec (``ipc.kafka``): it owns a socket, a correlation-id counter
and a queue of requests in flight, and nothing else.  It is what the Consumer's remote path, the admin and
producer clients and the follower fetchers (``replicas.leader_connection`` builds on it) use to talk to a
broker::

    with KafkaConnection("127.0.0.1", 9092, client_id="replica-1") as conn:
        response = conn.request(MetadataRequest(topics=None))          # blocks; returns the body
        cid = conn.send(FetchRequest(...))                             # pipelining: send now...
        fetched = conn.receive()                                       # ...read later (in order)

**Versions.**  On connect the client sends ApiVersions (v3, answered in the v0 layout by a broker that does
not speak v3 -- the codec handles that) and remembers the broker's ranges; every request then goes out at the
highest version both sides speak (:meth:`KafkaConnection.version_for`), unless the caller pins one.
``negotiate_versions=False`` skips the round trip and uses this codec's highest versions.

**Framing.**  Kafka answers requests on a connection in the order they were sent.  A response is a 4-byte
size and a body; the body is received straight into a ``bytearray`` of exactly that size (``recv_into``: the
kernel's copy is the only one) and decoded by ``ipc.kafka.decode_response``, whose ``records`` fields are
memoryviews into that bytearray -- a Fetch response's record batches are never copied again.  A size above
``max_response_bytes`` or a correlation id other than the oldest request's is a protocol error.

**Time.**  Every blocking step has a deadline: connecting (``connect_timeout_ms``), sending, and each
response (``request_timeout_ms`` from the moment its request was sent).  :meth:`receive` with ``wait_ms``
returns ``None`` when a response has not fully arrived in that time, keeping what arrived; that is how a
caller multiplexes several connections (``select`` on :meth:`fileno`) or long-polls with a shorter timeout.

**Errors** (all from the project's tree, ``storage.errors``): :class:`BrokerConnectionError` when the
connection cannot be made or breaks (refused, reset, closed by the broker, a send that cannot complete);
:class:`RequestTimeoutError` when a deadline passes; :class:`ProtocolError` when the bytes are not a valid
response.  After any of them the connection is closed -- its stream position is unknown -- and the outcome
of requests in flight is unknown (an idempotent producer may resend; a fetcher simply fetches again).
Error codes *inside* a response body are data, never raised here: the caller reads ``error_code`` fields.

**Watching a response arrive.**  ``receive(on_body=...)`` calls an observer after every piece of the
response body lands in its buffer (the whole body's view and how many bytes are in); that is the one hook
``replicas.leader_connection`` needs to append a Fetch answer's records while the rest is still coming,
without a second copy of the framing.

**Raw frames into a reused buffer.**  :meth:`KafkaConnection.receive_frame` is :meth:`receive` without the
decoding: it checks the correlation id and returns the body's bytes (a :class:`ResponseFrame`), received into
the buffer an ``allocate(size)`` callback hands out -- a caller that uses each response before asking for
the next (a follower's fetcher) reuses one buffer instead of a fresh, zeroed ``bytearray`` per response.
Views into such a buffer are only valid until the next response is received into it.

This module is in ``ipc`` (it imports nothing from ``appliance`` or ``replicas``) so both can use it.
"""

from __future__ import annotations

import collections
import select
import socket
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any, NamedTuple, Self

from ipc.kafka import (
    APIS,
    ApiKey,
    ApiVersionsRequest,
    ApiVersionsResponse,
    ErrorCode,
    RequestHeader,
    decode_response,
    encode_request,
    error_name,
    peek_correlation_id,
)
from ipc.kafka.apis import api_for_request
from ipc.kafka.framing import SIZE_PREFIX
from ipc.kafka.schema import Struct
from storage.errors import BrokerConnectionError, ProtocolError, RequestTimeoutError

__all__ = [
    "DEFAULT_CLIENT_ID",
    "DEFAULT_CONNECT_TIMEOUT_MS",
    "DEFAULT_MAX_RESPONSE_BYTES",
    "DEFAULT_REQUEST_TIMEOUT_MS",
    "BodyAllocator",
    "BodyObserver",
    "BrokerConnectionError",
    "KafkaConnection",
    "ResponseFrame",
    "parse_bootstrap_servers",
]

DEFAULT_CLIENT_ID = "log-appliance"
DEFAULT_CONNECT_TIMEOUT_MS = 10_000  # Kafka's socket.connection.setup.timeout.ms
DEFAULT_REQUEST_TIMEOUT_MS = 30_000  # Kafka's request.timeout.ms
DEFAULT_MAX_RESPONSE_BYTES = 1 << 30  # a response larger than this is not one we asked for
_SOFTWARE_NAME = "log-appliance"
_SOFTWARE_VERSION = "0.1.0"
_RECV_CHUNK_BYTES = 4 << 20

# (on_body) body: a view of the whole response body being received (after the size prefix);
# received_bytes: how many of its bytes have arrived -- len(body) on the last call.
BodyObserver = Callable[[memoryview, int], None]
# (allocate) size -> a writable buffer of exactly ``size`` bytes to receive a response body into.
BodyAllocator = Callable[[int], memoryview]


class _Pending(NamedTuple):
    correlation_id: int
    api_key: int
    api_version: int
    deadline: float  # time.monotonic()


class ResponseFrame(NamedTuple):
    """A response body as received (:meth:`KafkaConnection.receive_frame`), its correlation id checked."""

    correlation_id: int
    api_key: int
    api_version: int
    body: bytearray | memoryview  # the bytes after the size prefix: response header, then the body


def parse_bootstrap_servers(text: str | list[str] | tuple[str, ...]) -> list[tuple[str, int]]:
    """``"host:port,host2:port2"`` (or a list of ``host:port``) -> ``[(host, port), ...]``; IPv6 as
    ``[::1]:9092``.  Raises ValueError naming the bad entry."""
    items = text.split(",") if isinstance(text, str) else list(text)
    servers = []
    for raw in items:
        item = raw.strip()
        if not item:
            continue
        host, sep, port_text = item.rpartition(":")
        if not sep or not port_text.isdigit() or not host:
            raise ValueError(f"bootstrap server {item!r}: expected HOST:PORT")
        port = int(port_text)
        if not 0 < port < 65536:
            raise ValueError(f"bootstrap server {item!r}: port {port} out of range 1-65535")
        servers.append((host.removeprefix("[").removesuffix("]"), port))
    if not servers:
        raise ValueError(f"bootstrap servers {text!r}: no HOST:PORT given")
    return servers


class KafkaConnection:
    """One connection to a Kafka-protocol broker.  Not thread-safe: one thread drives it."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        client_id: str = DEFAULT_CLIENT_ID,
        connect_timeout_ms: int = DEFAULT_CONNECT_TIMEOUT_MS,
        request_timeout_ms: int = DEFAULT_REQUEST_TIMEOUT_MS,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        negotiate_versions: bool = True,
        _sock: socket.socket | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.address = f"{host}:{port}" if _sock is None or _sock.family != socket.AF_UNIX else host
        self.client_id = client_id
        self.request_timeout_ms = request_timeout_ms
        self.max_response_bytes = max_response_bytes
        self.api_versions: dict[int, tuple[int, int]] = {}  # the broker's (min, max) per API key
        self._correlation_id = 0
        self._pending: collections.deque[_Pending] = collections.deque()
        self._size = bytearray(SIZE_PREFIX.size)
        self._size_got = 0
        self._body: bytearray | memoryview | None = None
        self._body_got = 0
        if _sock is None:
            try:
                _sock = socket.create_connection((host, port), timeout=connect_timeout_ms / 1000)
            except TimeoutError:
                raise BrokerConnectionError(
                    f"broker {self.address}: no connection within {connect_timeout_ms} ms "
                    "(socket.connection.setup.timeout.ms)"
                ) from None
            except OSError as exc:
                raise BrokerConnectionError(
                    f"broker {self.address}: cannot connect: {exc.strerror or exc}"
                ) from None
            _sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock: socket.socket | None = _sock
        if negotiate_versions:
            self._negotiate()

    @classmethod
    def over_unix_socket(cls, path: str, **kwargs: Any) -> Self:
        """Connect to the broker's Unix-domain listener (``appliance.unix.listener``) instead of TCP."""
        timeout_ms = kwargs.pop("connect_timeout_ms", DEFAULT_CONNECT_TIMEOUT_MS)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout_ms / 1000)
        try:
            sock.connect(path)
        except OSError as exc:
            sock.close()
            raise BrokerConnectionError(f"broker {path}: cannot connect: {exc.strerror or exc}") from None
        return cls(path, 0, _sock=sock, **kwargs)

    # --- versions -------------------------------------------------------------------------------------------
    def _negotiate(self) -> None:
        response = self.request(
            ApiVersionsRequest(
                client_software_name=_SOFTWARE_NAME, client_software_version=_SOFTWARE_VERSION
            ),
            version=APIS[ApiKey.API_VERSIONS].max_version,
        )
        assert isinstance(response, ApiVersionsResponse)
        answered = response.error_code in (ErrorCode.NONE, ErrorCode.UNSUPPORTED_VERSION)
        if not answered or not response.api_keys:
            self.close()
            raise ProtocolError(
                f"broker {self.address}: ApiVersions failed with {error_name(response.error_code)}"
            )
        self.api_versions = {v.api_key: (v.min_version, v.max_version) for v in response.api_keys}

    def version_for(self, api_key: int) -> int:
        """The highest version of ``api_key`` both this codec and the broker speak.  ProtocolError if none."""
        spec = APIS[api_key]
        theirs = self.api_versions.get(api_key) if self.api_versions else (spec.min_version, spec.max_version)
        if theirs is None:
            raise ProtocolError(f"broker {self.address} does not support {spec.name}")
        low, high = max(spec.min_version, theirs[0]), min(spec.max_version, theirs[1])
        if low > high:
            raise ProtocolError(
                f"broker {self.address} speaks {spec.name} v{theirs[0]}-v{theirs[1]}, this client "
                f"v{spec.min_version}-v{spec.max_version}: no common version"
            )
        return high

    # --- requests -------------------------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._sock is None

    @property
    def in_flight(self) -> int:
        """Requests sent whose responses have not been received."""
        return len(self._pending)

    def fileno(self) -> int:
        return -1 if self._sock is None else self._sock.fileno()

    def request(self, body: Struct, *, version: int | None = None, timeout_ms: int | None = None) -> Any:
        """Send ``body`` and return the response body.  Responses to earlier :meth:`send` calls must have been
        received first (Kafka answers in order)."""
        if self._pending:
            raise RuntimeError(f"broker {self.address}: {len(self._pending)} responses not received yet")
        self.send(body, version=version, timeout_ms=timeout_ms)
        response = self.receive()
        assert response is not None
        return response

    def send(self, body: Struct, *, version: int | None = None, timeout_ms: int | None = None) -> int:
        """Send a request without waiting; return its correlation id.  ``timeout_ms`` (default
        ``request_timeout_ms``) bounds the wait for its response."""
        self._live_socket()
        spec = api_for_request(body)
        api_version = self.version_for(spec.api_key) if version is None else version
        client_id = self.client_id
        return self.send_encoded(
            lambda correlation_id: encode_request(RequestHeader(spec.api_key, api_version, correlation_id,
                                                                client_id), body),
            spec.api_key, api_version, timeout_ms=timeout_ms)

    def send_encoded(self, encode: Callable[[int], bytes | bytearray | memoryview], api_key: int,
                     api_version: int, *, timeout_ms: int | None = None) -> int:
        """:meth:`send` for a caller that encodes the request itself: ``encode(correlation_id)`` returns the
        whole frame (size prefix included) of an ``api_key`` request at ``api_version`` -- a follower patches
        the offsets into a Fetch it encoded once (``replicas.leader_connection``)."""
        sock = self._live_socket()
        self._correlation_id = (self._correlation_id + 1) & 0x7FFFFFFF
        correlation_id = self._correlation_id
        frame = encode(correlation_id)
        timeout_s = (self.request_timeout_ms if timeout_ms is None else timeout_ms) / 1000
        deadline = time.monotonic() + timeout_s
        try:
            sock.settimeout(timeout_s)
            sock.sendall(frame)
        except TimeoutError:
            self._fail()
            raise RequestTimeoutError(
                f"broker {self.address}: {APIS[api_key].name} request (correlation id {correlation_id}) not "
                f"sent within {timeout_s * 1000:.0f} ms"
            ) from None
        except OSError as exc:
            self._fail()
            raise BrokerConnectionError(
                f"broker {self.address}: sending {APIS[api_key].name} (correlation id {correlation_id}) "
                f"failed: {exc.strerror or exc}"
            ) from None
        self._pending.append(_Pending(correlation_id, api_key, api_version, deadline))
        return correlation_id

    def receive(self, wait_ms: float | None = None, *, on_body: BodyObserver | None = None) -> Any:
        """The body of the oldest in-flight request's response.

        ``wait_ms=None`` blocks until it arrives or its request times out (:class:`RequestTimeoutError`).
        With ``wait_ms``, returns ``None`` if it has not fully arrived within that time (bytes that did arrive
        are kept for the next call).  Decoding errors raise :class:`ProtocolError`.

        ``on_body(body, received_bytes)``, if given, is called after each piece of this response's body
        arrives, before it is decoded: a way to use a large response while the rest is still coming (the
        bytes are final once received; the view stays valid).  An exception from it closes the connection
        and propagates.
        """
        arrived = self._next_frame(wait_ms, on_body, None)
        if arrived is None:
            return None
        pending, frame = arrived
        try:
            response = decode_response(frame, pending.api_key, pending.api_version)
        except ProtocolError as exc:
            self._fail()
            raise ProtocolError(f"broker {self.address}: {exc}") from None
        self._check_correlation_id(response.correlation_id, pending)
        return response.body

    def receive_frame(self, wait_ms: float | None = None, *, on_body: BodyObserver | None = None,
                      allocate: BodyAllocator | None = None) -> ResponseFrame | None:
        """:meth:`receive` without decoding: the oldest in-flight request's response as bytes, its
        correlation id checked (:class:`ProtocolError` otherwise), or ``None`` as :meth:`receive`.

        ``allocate(size)``, if given, returns the buffer (exactly ``size`` bytes) to receive the body into;
        by default a new ``bytearray``.  Decode it with ``ipc.kafka.decode_response(frame.body,
        frame.api_key, frame.api_version)``."""
        arrived = self._next_frame(wait_ms, on_body, allocate)
        if arrived is None:
            return None
        pending, frame = arrived
        if len(frame) < 4:
            self._fail()
            raise ProtocolError(f"broker {self.address}: a {len(frame)}-byte response, shorter than its "
                                "correlation id")
        self._check_correlation_id(peek_correlation_id(frame), pending)
        return ResponseFrame(pending.correlation_id, pending.api_key, pending.api_version, frame)

    def _next_frame(self, wait_ms: float | None, on_body: BodyObserver | None,
                    allocate: BodyAllocator | None) -> tuple[_Pending, bytearray | memoryview] | None:
        sock = self._live_socket()
        if not self._pending:
            raise RuntimeError(f"broker {self.address}: no request in flight")
        pending = self._pending[0]
        now = time.monotonic()
        until = pending.deadline if wait_ms is None else min(pending.deadline, now + wait_ms / 1000)
        frame = self._read_frame(sock, until, on_body, allocate)
        if frame is None:
            if time.monotonic() < pending.deadline:
                return None
            self._fail()
            spec = APIS[pending.api_key]
            raise RequestTimeoutError(
                f"broker {self.address}: no {spec.name} response (correlation id {pending.correlation_id}) "
                f"within the request timeout"
            )
        self._pending.popleft()
        return pending, frame

    def _check_correlation_id(self, correlation_id: int, pending: _Pending) -> None:
        if correlation_id != pending.correlation_id:
            self._fail()
            raise ProtocolError(
                f"broker {self.address}: response correlation id {correlation_id}, expected "
                f"{pending.correlation_id} (responses must come in request order)"
            )

    def wait_readable(self, wait_ms: float) -> bool:
        """Whether bytes (or EOF) are waiting on the socket within ``wait_ms``."""
        sock = self._live_socket()
        readable, _, _ = select.select([sock], [], [], max(0.0, wait_ms / 1000))
        return bool(readable)

    # --- the byte stream ------------------------------------------------------------------------------------
    def _read_frame(
        self, sock: socket.socket, until: float, on_body: BodyObserver | None,
        allocate: BodyAllocator | None = None,
    ) -> bytearray | memoryview | None:
        """Receive the next response body; None if ``until`` (monotonic) passes first."""
        size_view = memoryview(self._size)
        while self._size_got < SIZE_PREFIX.size:
            got = self._recv(sock, size_view[self._size_got :], until)
            if got is None:
                return None
            self._size_got += got
        if self._body is None:
            (size,) = SIZE_PREFIX.unpack(self._size)
            if size < 0 or size > self.max_response_bytes:
                self._fail()
                raise ProtocolError(
                    f"broker {self.address}: response size {size} bytes, expected 0.."
                    f"{self.max_response_bytes}"
                )
            self._body = bytearray(size) if allocate is None else allocate(size)
            self._body_got = 0
        body = self._body
        with memoryview(body) as view:
            while self._body_got < len(body):
                want = min(len(body) - self._body_got, _RECV_CHUNK_BYTES)
                got = self._recv(sock, view[self._body_got : self._body_got + want], until)
                if got is None:
                    return None
                self._body_got += got
                if on_body is not None:
                    try:
                        on_body(view, self._body_got)
                    except BaseException:
                        self._fail()
                        raise
        self._body = None
        self._size_got = 0
        return body

    def _recv(self, sock: socket.socket, into: memoryview, until: float) -> int | None:
        """Bytes received into ``into``, or None if none came before ``until`` (one non-blocking try at
        least, so ``receive(wait_ms=0)`` collects what is already there)."""
        try:
            sock.settimeout(max(0.0, until - time.monotonic()))  # 0: non-blocking
            got = sock.recv_into(into)
        except (TimeoutError, BlockingIOError):
            return None
        except OSError as exc:
            self._fail()
            raise BrokerConnectionError(
                f"broker {self.address}: receiving a response failed: {exc.strerror or exc}"
            ) from None
        if got == 0:
            midway = self._size_got + (self._body_got if self._body is not None else 0)
            self._fail()
            raise BrokerConnectionError(
                f"broker {self.address}: the broker closed the connection"
                + (f" in the middle of a response ({midway} bytes in)" if midway else "")
            )
        return got

    def _live_socket(self) -> socket.socket:
        if self._sock is None:
            raise BrokerConnectionError(f"broker {self.address}: the connection is closed")
        return self._sock

    def _fail(self) -> None:
        self.close()

    # --- lifetime -------------------------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Wake a thread blocked on this connection (call from another thread): its wait ends with
        :class:`BrokerConnectionError` and the connection is then unusable."""
        sock = self._sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        sock, self._sock = self._sock, None
        self._pending.clear()
        self._body = None
        self._size_got = 0
        if sock is not None:
            sock.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._sock is None else f"{len(self._pending)} in flight"
        return f"{type(self).__name__}({self.address!r}, client_id={self.client_id!r}, {state})"
