"""A small blocking Kafka client connection from a follower to its leader, over ``ipc.kafka``.

Theory of operation
-------------------
One TCP (or Unix) socket, one request in flight, one thread.  :meth:`LeaderConnection.request` encodes the
request (``ipc.kafka.encode_request``), sends it, reads the 4-byte size prefix, then receives the whole
response body with ``recv_into`` straight into a reusable buffer -- the only copy of the record bytes between
the kernel and the follower's log -- and decodes it (``ipc.kafka.decode_response``).  A Fetch response's
``records`` are memoryviews into that buffer: valid until the next request on the connection.

**Fetch answers are consumed as they arrive** (:meth:`LeaderConnection.fetch`).  A follower's Fetch names
one partition, and in its answer that partition's record bytes come last.  So once the fixed part before
them has arrived -- its length is known from encoding the same answer with no records; it is decoded (with
the records' length field read as 0) and checked: one topic, one partition, no error, the records running
to the frame's end -- the records are handed to the caller chunk by chunk (``on_records(view, final)``,
returning how many bytes it used: whole batches) while the rest is still arriving.  The follower appends
and checks what it has while the leader's ``sendfile`` goes on, instead of one after the other.  Anything
else (an error, another layout) is received whole and handed over once.

On connect the connection asks ApiVersions and then speaks, per API, the highest version both sides know;
with ``sasl_plain=(user, password)`` it authenticates (SaslHandshake + SaslAuthenticate, mechanism PLAIN)
before anything else.

Any failure leaves the connection closed; make a new one.  What escapes:

* :class:`~storage.errors.RequestTimeoutError` -- no complete answer within the timeout;
* :class:`~storage.errors.ProtocolError` -- the peer sent bytes that are not the answer (malformed frame,
  wrong correlation id, a frame larger than ``max_response_bytes``, no common version, failed SASL);
* ``ConnectionError`` (an ``OSError``) -- refused, reset, or closed by the peer (mid-frame included).
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any, Final, NamedTuple

from ipc.kafka import (
    APIS,
    DEFAULT_MAX_FRAME_BYTES,
    ApiKey,
    ApiVersionsRequest,
    ErrorCode,
    FetchableTopicResponse,
    FetchRequest,
    FetchResponse,
    MetadataRequest,
    MetadataRequestTopic,
    PartitionData,
    RequestHeader,
    SaslAuthenticateRequest,
    SaslHandshakeRequest,
    Struct,
    decode_response,
    encode_request,
    encode_response_parts,
    error_name,
)
from ipc.kafka.apis import api_for_request
from ipc.kafka.framing import SIZE_PREFIX
from storage.errors import ProtocolError, RequestTimeoutError

__all__ = ["DEFAULT_REQUEST_TIMEOUT_MS", "LeaderConnection", "LeaderInfo", "leader_from_metadata"]

DEFAULT_REQUEST_TIMEOUT_MS: Final = 30_000  # Kafka's replica.socket.timeout.ms
STREAM_CHUNK_BYTES: Final = 512 * 1024  # records are handed on in pieces of at least this much

# (on_records) view: the records received so far, from the first byte not used yet; final: no more come.
# Returns the bytes it used (whole batches, from the view's start).
RecordsConsumer = Callable[[memoryview, bool], int]
_INITIAL_BUFFER_BYTES: Final = 1 << 20
_CLIENT_SOFTWARE: Final = "log-appliance-replica"


class LeaderInfo(NamedTuple):
    """Where a partition's leader is and in which leader epoch (what a fetcher fetches from)."""

    host: str  # a Unix socket path with port 0
    port: int
    leader_id: int
    leader_epoch: int

    def __str__(self) -> str:
        return f"leader {self.leader_id} at {self.host}:{self.port} in epoch {self.leader_epoch}"


class LeaderConnection:
    """A connected, version-negotiated client socket.  Use :meth:`connect`."""

    def __init__(self, sock: socket.socket, address: str, *, client_id: str, timeout_ms: int,
                 max_response_bytes: int) -> None:
        self._sock: socket.socket | None = sock
        self.address = address
        self.client_id = client_id
        self.timeout_ms = timeout_ms
        self.max_response_bytes = max_response_bytes
        self._correlation_id = 0
        self._buffer = bytearray(_INITIAL_BUFFER_BYTES)
        self._versions: dict[int, int] = {}
        self._fetch_prefix: dict[tuple[int, str, int], int] = {}

    @classmethod
    def connect(cls, host: str, port: int, *, client_id: str = "appliance-replica",
                timeout_ms: int = DEFAULT_REQUEST_TIMEOUT_MS,
                max_response_bytes: int = DEFAULT_MAX_FRAME_BYTES,
                sasl_plain: tuple[str, str] | None = None) -> LeaderConnection:
        """Connect to ``host:port`` (a socket path with port 0: Unix), negotiate versions, authenticate."""
        address = f"{host}:{port}" if port else host
        try:
            if port:
                sock = socket.create_connection((host, port), timeout=timeout_ms / 1000)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            else:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.settimeout(timeout_ms / 1000)
                try:
                    sock.connect(host)
                except BaseException:
                    sock.close()
                    raise
        except TimeoutError:
            raise RequestTimeoutError(f"leader {address}: no connection within {timeout_ms} ms") from None
        conn = cls(sock, address, client_id=client_id, timeout_ms=timeout_ms,
                   max_response_bytes=max_response_bytes)
        try:
            conn._negotiate()
            if sasl_plain is not None:
                conn._authenticate_plain(*sasl_plain)
        except BaseException:
            conn.close()
            raise
        return conn

    @property
    def closed(self) -> bool:
        return self._sock is None

    def close(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()

    def shutdown(self) -> None:
        """Wake a thread blocked in :meth:`request` (from another thread); the connection is then unusable."""
        sock = self._sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def __enter__(self) -> LeaderConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def version_for(self, api_key: int) -> int:
        """The version this connection speaks for ``api_key`` (ProtocolError if the leader lacks it)."""
        version = self._versions.get(api_key)
        if version is None:
            raise ProtocolError(f"leader {self.address}: no common version of {APIS[api_key].name}")
        return version

    # --- requests -------------------------------------------------------------------------------------------
    def request(self, body: Struct, *, timeout_ms: int | None = None, version: int | None = None) -> Any:
        """Send one request and return the decoded response body (its records are views valid until the
        next request).  ``timeout_ms`` bounds the whole exchange (default: the connection's)."""
        spec = api_for_request(body)
        if version is None:
            version = self.version_for(spec.api_key)
        timeout = self.timeout_ms if timeout_ms is None else timeout_ms
        return self._exchange(spec.api_key, version, body, timeout)

    def fetch(self, request: FetchRequest, on_records: RecordsConsumer, *,
              timeout_ms: int | None = None) -> tuple[Any, bool]:
        """A Fetch of one partition whose records go to ``on_records`` as they arrive (see the module
        docstring).  Returns (the decoded answer, whether its records were handed to ``on_records``: False
        for an answer of another shape, an error, or no records -- the caller reads ``records`` itself)."""
        version = self.version_for(ApiKey.FETCH)
        topics = request.topics
        single = len(topics) == 1 and len(topics[0].partitions) == 1
        timeout = self.timeout_ms if timeout_ms is None else timeout_ms
        if not single:
            return self._exchange(ApiKey.FETCH, version, request, timeout), False
        prefix = self._prefix_bytes(version, topics[0].topic, topics[0].partitions[0].partition)
        streamed: list[bool] = [False]
        answer = self._exchange(ApiKey.FETCH, version, request, timeout,
                                stream=(prefix, on_records, streamed))
        return answer, streamed[0]

    def _prefix_bytes(self, version: int, topic: str, partition: int) -> int:
        """Bytes of a Fetch answer for (topic, partition) before its records (after the size prefix)."""
        key = (version, topic, partition)
        size = self._fetch_prefix.get(key)
        if size is None:
            empty = FetchResponse(error_code=ErrorCode.NONE, session_id=0, responses=[FetchableTopicResponse(
                topic=topic, partitions=[PartitionData(partition_index=partition, error_code=ErrorCode.NONE,
                                                       high_watermark=0, last_stable_offset=0,
                                                       log_start_offset=0, records=b"")])])
            parts = encode_response_parts(RequestHeader(ApiKey.FETCH, version, 0, self.client_id), empty)
            size = sum(len(p) for p in parts if isinstance(p, bytes | bytearray)) - SIZE_PREFIX.size
            self._fetch_prefix[key] = size
        return size

    def _exchange(self, api_key: int, version: int, body: Struct, timeout_ms: int,
                  stream: tuple[int, RecordsConsumer, list[bool]] | None = None) -> Any:
        sock = self._sock
        if sock is None:
            raise ConnectionError(f"leader {self.address}: the connection is closed")
        self._correlation_id = (self._correlation_id + 1) & 0x7FFFFFFF
        correlation_id = self._correlation_id
        frame = encode_request(RequestHeader(api_key, version, correlation_id, self.client_id), body)
        what = f"{APIS[api_key].name} v{version} (correlation id {correlation_id})"
        try:
            sock.settimeout(timeout_ms / 1000)
            sock.sendall(frame)
            size_bytes = self._receive_exact(sock, SIZE_PREFIX.size, what)
            (size,) = SIZE_PREFIX.unpack(size_bytes)
            if size < 4 or size > self.max_response_bytes:
                raise ProtocolError(f"leader {self.address}: response to {what} announces {size} bytes, "
                                    f"expected 4..{self.max_response_bytes}")
            if size > len(self._buffer):
                self._buffer = bytearray(size)  # never resized in place: older record views stay valid
            view = memoryview(self._buffer)[:size]
            if stream is not None and size > stream[0]:
                self._receive_streaming(sock, view, what, correlation_id, version, *stream)
            else:
                self._receive_into(sock, view, what)
            response = decode_response(view, api_key, version)
        except TimeoutError:
            self.close()
            raise RequestTimeoutError(f"leader {self.address}: no complete answer to {what} within "
                                      f"{timeout_ms} ms") from None
        except BaseException:
            self.close()
            raise
        if response.correlation_id != correlation_id:
            self.close()
            raise ProtocolError(f"leader {self.address}: response to {what} carries correlation id "
                                f"{response.correlation_id}, expected {correlation_id}")
        return response.body

    def _receive_streaming(self, sock: socket.socket, view: memoryview, what: str, correlation_id: int,
                           version: int, prefix: int, on_records: RecordsConsumer,
                           streamed: list[bool]) -> None:
        """Receive a Fetch answer, handing its records to ``on_records`` while they arrive when the answer
        has the expected shape (else receive it whole; the caller decodes it)."""
        self._receive_into(sock, view[:prefix], what)
        total = len(view)
        records_bytes = int.from_bytes(view[prefix - 4:prefix], "big", signed=True)
        clean = self._prefix_is_clean(view[:prefix], correlation_id, version)
        if records_bytes != total - prefix or not clean:
            self._receive_into(sock, view[prefix:], what)
            return
        streamed[0] = True
        records = view[prefix:]
        received = prefix
        used = 0
        while received < total:
            n = sock.recv_into(view[received:], total - received)
            if n == 0:
                raise ConnectionError(f"leader {self.address}: connection closed after {received} of {total} "
                                      f"bytes of the response to {what}")
            received += n
            if received - prefix - used >= STREAM_CHUNK_BYTES and received < total:
                used += on_records(records[used:received - prefix], False)
        on_records(records[used:], True)

    def _prefix_is_clean(self, prefix: memoryview, correlation_id: int, version: int) -> bool:
        """The fixed part decodes as an error-free answer about one partition (records read as empty)."""
        patched = bytearray(prefix)
        patched[-4:] = b"\0\0\0\0"
        try:
            head = decode_response(memoryview(patched), ApiKey.FETCH, version)
        except (ProtocolError, ValueError):
            return False
        body = head.body
        return (head.correlation_id == correlation_id and body.error_code == ErrorCode.NONE
                and len(body.responses) == 1 and len(body.responses[0].partitions) == 1
                and body.responses[0].partitions[0].error_code == ErrorCode.NONE)

    def _receive_exact(self, sock: socket.socket, size: int, what: str) -> bytes:
        buf = bytearray(size)
        self._receive_into(sock, memoryview(buf), what)
        return bytes(buf)

    def _receive_into(self, sock: socket.socket, view: memoryview, what: str) -> None:
        got = 0
        total = len(view)
        while got < total:
            n = sock.recv_into(view[got:], total - got)
            if n == 0:
                raise ConnectionError(f"leader {self.address}: connection closed after {got} of {total} "
                                      f"bytes of the response to {what}")
            got += n

    # --- setup ----------------------------------------------------------------------------------------------
    def _negotiate(self) -> None:
        """ApiVersions: per API, the highest version both speak."""
        ours = APIS[ApiKey.API_VERSIONS]
        answer = self._exchange(ApiKey.API_VERSIONS, ours.max_version,
                                ApiVersionsRequest(client_software_name=_CLIENT_SOFTWARE,
                                                   client_software_version="1"), self.timeout_ms)
        if answer.error_code not in (ErrorCode.NONE, ErrorCode.UNSUPPORTED_VERSION):
            raise ProtocolError(f"leader {self.address}: ApiVersions answered "
                                f"{error_name(answer.error_code)}")
        theirs = {v.api_key: (v.min_version, v.max_version) for v in answer.api_keys}
        for api_key, spec in APIS.items():
            if api_key in theirs:
                low = max(spec.min_version, theirs[api_key][0])
                high = min(spec.max_version, theirs[api_key][1])
                if low <= high:
                    self._versions[api_key] = high
        if answer.error_code == ErrorCode.UNSUPPORTED_VERSION and ApiKey.API_VERSIONS not in self._versions:
            raise ProtocolError(f"leader {self.address}: no common ApiVersions version ({theirs})")

    def _authenticate_plain(self, user: str, password: str) -> None:
        handshake = self.request(SaslHandshakeRequest(mechanism="PLAIN"))
        if handshake.error_code != ErrorCode.NONE:
            raise ProtocolError(f"leader {self.address}: SASL handshake for PLAIN answered "
                                f"{error_name(handshake.error_code)} (mechanisms {handshake.mechanisms})")
        token = b"\0" + user.encode() + b"\0" + password.encode()
        answer = self.request(SaslAuthenticateRequest(auth_bytes=token))
        if answer.error_code != ErrorCode.NONE:
            raise ProtocolError(f"leader {self.address}: SASL PLAIN authentication as {user!r} failed: "
                                f"{error_name(answer.error_code)} {answer.error_message or ''}".rstrip())


def leader_from_metadata(conn: LeaderConnection, topic: str, partition: int) -> LeaderInfo | None:
    """Ask ``conn``'s broker (Metadata) who leads ``topic-partition`` and in which epoch; None if nobody
    does (or the broker does not know the partition)."""
    answer = conn.request(MetadataRequest(topics=[MetadataRequestTopic(name=topic)],
                                          allow_auto_topic_creation=False))
    brokers = {b.node_id: b for b in answer.brokers}
    for t in answer.topics:
        if t.name != topic or t.error_code != ErrorCode.NONE:
            continue
        for p in t.partitions:
            if p.partition_index == partition and p.error_code == ErrorCode.NONE and p.leader_id in brokers:
                broker = brokers[p.leader_id]
                return LeaderInfo(broker.host, broker.port, p.leader_id, p.leader_epoch)
    return None

