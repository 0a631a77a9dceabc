"""A follower's connection to its leader: ``ipc.kafka_client.KafkaConnection`` plus a follower's own needs.

Theory of operation
-------------------
The socket, ApiVersions negotiation, framing, correlation ids and timeouts are ``KafkaConnection``'s (one
request in flight here, one thread).  This layer adds three things:

**SASL/PLAIN.**  ``connect(..., sasl_plain=(user, password))`` authenticates (SaslHandshake +
SaslAuthenticate, mechanism PLAIN) right after version negotiation, before anything else.

**Fetch answers are consumed as they arrive** (:meth:`LeaderConnection.fetch`).  A follower's Fetch names
one partition, and in its answer that partition's record bytes come last.  So once the fixed part before
them has arrived -- its length is known from encoding the same answer with no records; it is decoded (with
the records' length field read as 0) and checked: one topic, one partition, no error, the records running
to the frame's end -- the records are handed to the caller chunk by chunk (``on_records(view, final)``,
returning how many bytes it used: whole batches) while the rest is still arriving.  The follower appends
and checks what it has while the leader's ``sendfile`` goes on, instead of one after the other.  Anything
else (an error, another layout) is received whole and handed over once.  The bytes are watched through
``KafkaConnection.receive(on_body=...)``; the framing stays there.

**Where a leader is**: :func:`leader_from_metadata`.

Any failure leaves the connection closed; make a new one.  What escapes:

* :class:`~storage.errors.RequestTimeoutError` -- no complete answer within the timeout;
* :class:`~storage.errors.ProtocolError` -- the peer sent bytes that are not the answer (malformed frame,
  wrong correlation id, a frame larger than ``max_response_bytes``, no common version, failed SASL);
* :class:`~storage.errors.BrokerConnectionError` (also a ``ConnectionError``, an ``OSError``) -- refused,
  reset, or closed by the peer (mid-frame included).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, NamedTuple

from ipc.kafka import (
    DEFAULT_MAX_FRAME_BYTES,
    ApiKey,
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
    decode_response,
    encode_response_parts,
    error_name,
)
from ipc.kafka.framing import SIZE_PREFIX
from ipc.kafka_client import KafkaConnection
from storage.errors import ProtocolError

__all__ = ["DEFAULT_REQUEST_TIMEOUT_MS", "LeaderConnection", "LeaderInfo", "leader_from_metadata"]

DEFAULT_REQUEST_TIMEOUT_MS: Final = 30_000  # Kafka's replica.socket.timeout.ms
STREAM_CHUNK_BYTES: Final = 512 * 1024  # records are handed on in pieces of at least this much

# (on_records) view: the records received so far, from the first byte not used yet; final: no more come.
# Returns the bytes it used (whole batches, from the view's start).
RecordsConsumer = Callable[[memoryview, bool], int]


class LeaderInfo(NamedTuple):
    """Where a partition's leader is and in which leader epoch (what a fetcher fetches from)."""

    host: str  # a Unix socket path with port 0
    port: int
    leader_id: int
    leader_epoch: int

    def __str__(self) -> str:
        return f"leader {self.leader_id} at {self.host}:{self.port} in epoch {self.leader_epoch}"


class LeaderConnection(KafkaConnection):
    """A connected, version-negotiated (and, if asked, authenticated) connection.  Use :meth:`connect`."""

    def __init__(self, host: str, port: int, **options: Any) -> None:
        super().__init__(host, port, **options)
        self._fetch_prefix: dict[tuple[int, str, int], int] = {}  # (version, topic, partition) -> bytes

    @classmethod
    def connect(cls, host: str, port: int, *, client_id: str = "appliance-replica",
                timeout_ms: int = DEFAULT_REQUEST_TIMEOUT_MS,
                max_response_bytes: int = DEFAULT_MAX_FRAME_BYTES,
                sasl_plain: tuple[str, str] | None = None) -> LeaderConnection:
        """Connect to ``host:port`` (a socket path with port 0: Unix), negotiate versions, authenticate.
        ``timeout_ms`` bounds the connect and each exchange."""
        options: dict[str, Any] = {"client_id": client_id, "connect_timeout_ms": timeout_ms,
                                   "request_timeout_ms": timeout_ms, "max_response_bytes": max_response_bytes}
        conn = cls(host, port, **options) if port else cls.over_unix_socket(host, **options)
        if sasl_plain is not None:
            try:
                conn._authenticate_plain(*sasl_plain)
            except BaseException:
                conn.close()
                raise
        return conn

    @property
    def timeout_ms(self) -> int:
        """The default bound of each exchange (``request_timeout_ms``)."""
        return self.request_timeout_ms

    @timeout_ms.setter
    def timeout_ms(self, value: int) -> None:
        self.request_timeout_ms = value

    def fetch(self, request: FetchRequest, on_records: RecordsConsumer, *,
              timeout_ms: int | None = None) -> tuple[Any, bool]:
        """A Fetch of one partition whose records go to ``on_records`` as they arrive (see the module
        docstring).  Returns (the decoded answer, whether its records were handed to ``on_records``: False
        for an answer of another shape, an error, or no records -- the caller reads ``records`` itself)."""
        topics = request.topics
        if not (len(topics) == 1 and len(topics[0].partitions) == 1):
            return self.request(request, timeout_ms=timeout_ms), False
        version = self.version_for(ApiKey.FETCH)
        prefix = self._prefix_bytes(version, topics[0].topic, topics[0].partitions[0].partition)
        correlation_id = self.send(request, version=version, timeout_ms=timeout_ms)
        stream = _RecordsStream(prefix, correlation_id, version, on_records)
        answer = self.receive(on_body=stream.observe)
        if stream.records is None:
            return answer, False
        try:
            on_records(stream.records[stream.used_bytes:], True)
        except BaseException:
            self.close()
            raise
        return answer, True

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


class _RecordsStream:
    """Watches one Fetch answer arrive (a ``KafkaConnection`` body observer) and hands its records to
    ``on_records`` in pieces while more is coming -- if the fixed part before them is clean."""

    def __init__(self, prefix_bytes: int, correlation_id: int, version: int,
                 on_records: RecordsConsumer) -> None:
        self.prefix_bytes = prefix_bytes
        self.correlation_id = correlation_id
        self.version = version
        self.on_records = on_records
        self.checked = False
        self.records: memoryview | None = None  # set once the answer is known to have the streamable shape
        self.used_bytes = 0

    def observe(self, body: memoryview, received_bytes: int) -> None:
        prefix = self.prefix_bytes
        total = len(body)
        if not self.checked:
            if received_bytes < prefix:
                return
            self.checked = True
            records_bytes = int.from_bytes(body[prefix - 4:prefix], "big", signed=True)
            if total <= prefix or records_bytes != total - prefix or not self._prefix_is_clean(body[:prefix]):
                return
            self.records = body[prefix:]
        records = self.records
        if records is None or received_bytes >= total:
            return
        if received_bytes - prefix - self.used_bytes >= STREAM_CHUNK_BYTES:
            self.used_bytes += self.on_records(records[self.used_bytes:received_bytes - prefix], False)

    def _prefix_is_clean(self, prefix: memoryview) -> bool:
        """The fixed part decodes as an error-free answer about one partition (records read as empty)."""
        patched = bytearray(prefix)
        patched[-4:] = b"\0\0\0\0"
        try:
            head = decode_response(memoryview(patched), ApiKey.FETCH, self.version)
        except (ProtocolError, ValueError):
            return False
        body = head.body
        return (head.correlation_id == self.correlation_id and body.error_code == ErrorCode.NONE
                and len(body.responses) == 1 and len(body.responses[0].partitions) == 1
                and body.responses[0].partitions[0].error_code == ErrorCode.NONE)


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

