"""A follower's connection to its leader: ``ipc.kafka_client.KafkaConnection`` plus a follower's own needs.

Theory of operation
-------------------
The socket, ApiVersions negotiation, framing, correlation ids and timeouts are ``KafkaConnection``'s (one
request in flight here, one thread).  This layer adds three things:

**SASL/PLAIN.**  ``connect(..., sasl_plain=(user, password))`` authenticates (SaslHandshake +
SaslAuthenticate, mechanism PLAIN) right after version negotiation, before anything else.

**Fetch answers are consumed as they arrive** (:meth:`LeaderConnection.fetch`, or its two halves
:meth:`~LeaderConnection.send_fetch` and :meth:`~LeaderConnection.receive_fetch`).  A follower's Fetch names
one partition, and in its answer that partition's record bytes come last.  So once the fixed part before
them has arrived -- its length is known from encoding the same answer with no records; it is decoded (with
the records' length field read as 0) and checked: one topic, one partition, no error, the records running
to the frame's end -- the records are handed to the caller chunk by chunk (``on_records(view, final)``,
returning how many bytes it used: whole batches) while the rest is still arriving.  The follower appends
and checks what it has while the leader's ``sendfile`` goes on, instead of one after the other.  That
decoded fixed part, with the records filled in, is the answer: the frame is not decoded a second time.
Anything else (an error, another layout) is received whole, decoded, and handed over once.  The bytes are
watched through ``KafkaConnection.receive_frame(on_body=...)``; the framing stays there.

Once the whole answer is in, and before its last records go to ``on_records``, ``on_complete(answer,
rest)`` may send the next request (a follower fetching ahead: ``replicas.fetcher``): the connection is
between responses then, and the leader prepares the next answer while this one's tail is checked and
appended.  Kafka answers the requests of a connection in order, so several may be in flight.

**A follower's Fetch is encoded once** (:meth:`LeaderConnection.send_follower_fetch`): from one Fetch to
the next only the correlation id, ``fetch_offset`` and ``log_start_offset`` move, so the request is encoded
once per :class:`FollowerFetch` (leader epoch, sizes...) by the codec, with marker values in those three
fields, and each Fetch is a copy of that frame with the three patched in where the markers were (a small
fraction of building and encoding one: docs/performance.md).  Likewise the fixed part of a clean answer is
not decoded by the codec each time: it is unpacked with one ``struct`` layout derived from the codec's own
encoding of the same answer (its constant bytes compared, the correlation id, throttle time, high
watermark, last stable offset and log start offset read); any difference -- an error code, another shape --
takes the codec's decode.  Neither re-declares the protocol's layout: both are found in what ``ipc.kafka``
encodes.

**One receive buffer per connection.**  Fetch answers are received into a buffer the connection keeps and
reuses (grown to the largest answer), not a fresh zeroed ``bytearray`` each: their ``records`` views are
valid until the next Fetch answer is received on the connection.

**Where a leader is**: :func:`leader_from_metadata`.

Any failure leaves the connection closed; make a new one.  What escapes:

* :class:`~storage.errors.RequestTimeoutError` -- no complete answer within the timeout;
* :class:`~storage.errors.ProtocolError` -- the peer sent bytes that are not the answer (malformed frame,
  wrong correlation id, a frame larger than ``max_response_bytes``, no common version, failed SASL);
* :class:`~storage.errors.BrokerConnectionError` (also a ``ConnectionError``, an ``OSError``) -- refused,
  reset, or closed by the peer (mid-frame included).
"""

from __future__ import annotations

import operator
import struct
from collections.abc import Callable
from typing import Any, Final, NamedTuple

from ipc.kafka import (
    DEFAULT_MAX_FRAME_BYTES,
    ApiKey,
    ErrorCode,
    FetchableTopicResponse,
    FetchPartition,
    FetchRequest,
    FetchResponse,
    FetchTopic,
    MetadataRequest,
    MetadataRequestTopic,
    PartitionData,
    RequestHeader,
    SaslAuthenticateRequest,
    SaslHandshakeRequest,
    decode_response,
    encode_request,
    encode_response_parts,
    error_name,
)
from ipc.kafka.framing import SIZE_PREFIX
from ipc.kafka_client import KafkaConnection
from storage.errors import ProtocolError

__all__ = ["DEFAULT_REQUEST_TIMEOUT_MS", "FetchInFlight", "FollowerFetch", "LeaderConnection", "LeaderInfo",
           "leader_from_metadata"]

DEFAULT_REQUEST_TIMEOUT_MS: Final = 30_000  # Kafka's replica.socket.timeout.ms
STREAM_CHUNK_BYTES: Final = 512 * 1024  # records are handed on in pieces of at least this much

# (on_records) view: the records received so far, from the first byte not used yet; final: no more come.
# Returns the bytes it used (whole batches, from the view's start).
RecordsConsumer = Callable[[memoryview, bool], int]
# (on_complete) answer: the whole Fetch answer, decoded; rest: its records not handed to on_records yet.
AnswerObserver = Callable[[Any, memoryview], None]


class LeaderInfo(NamedTuple):
    """Where a partition's leader is and in which leader epoch (what a fetcher fetches from)."""

    host: str  # a Unix socket path with port 0
    port: int
    leader_id: int
    leader_epoch: int

    def __str__(self) -> str:
        return f"leader {self.leader_id} at {self.host}:{self.port} in epoch {self.leader_epoch}"


class FollowerFetch(NamedTuple):
    """A follower's Fetch of one partition but for the offsets that move from one Fetch to the next
    (:meth:`LeaderConnection.send_follower_fetch` encodes it once per value)."""

    replica_id: int
    topic: str
    partition: int
    current_leader_epoch: int
    max_wait_ms: int
    min_bytes: int
    max_bytes: int  # the request's max_bytes and the partition's partition_max_bytes

    def request(self, fetch_offset: int, log_start_offset: int) -> FetchRequest:
        """The whole request, as the codec takes it."""
        return FetchRequest(
            replica_id=self.replica_id, max_wait_ms=self.max_wait_ms, min_bytes=self.min_bytes,
            max_bytes=self.max_bytes, isolation_level=0, session_id=0, session_epoch=-1,
            topics=[FetchTopic(topic=self.topic, partitions=[FetchPartition(
                partition=self.partition, current_leader_epoch=self.current_leader_epoch,
                fetch_offset=fetch_offset, log_start_offset=log_start_offset,
                partition_max_bytes=self.max_bytes)])],
        )


class FetchInFlight(NamedTuple):
    """A Fetch sent by :meth:`LeaderConnection.send_fetch`; pass it to :meth:`~LeaderConnection.receive_fetch`
    (answers come in the order their requests were sent)."""

    correlation_id: int
    version: int
    prefix_bytes: int  # the answer's bytes before its records; 0: not a one-partition Fetch, not streamed
    shape: _AnswerShape | None = None  # how a clean answer's fixed part looks (None: not streamed)


class LeaderConnection(KafkaConnection):
    """A connected, version-negotiated (and, if asked, authenticated) connection.  Use :meth:`connect`."""

    def __init__(self, host: str, port: int, **options: Any) -> None:
        super().__init__(host, port, **options)
        self._answer_shapes: dict[tuple[int, str, int], _AnswerShape] = {}  # (version, topic, partition)
        self._request_templates: dict[FollowerFetch, _RequestTemplate] = {}
        self._answer_buffer = bytearray()  # Fetch answers are received here (see the module docstring)

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
        return self.receive_fetch(self.send_fetch(request, timeout_ms=timeout_ms), on_records)

    def send_fetch(self, request: FetchRequest, *, timeout_ms: int | None = None) -> FetchInFlight:
        """Send a Fetch without waiting for its answer (``timeout_ms`` bounds that wait, from now)."""
        topics = request.topics
        version = self.version_for(ApiKey.FETCH)
        shape = None
        if len(topics) == 1 and len(topics[0].partitions) == 1:
            shape = self._answer_shape(version, topics[0].topic, topics[0].partitions[0].partition)
        correlation_id = self.send(request, version=version, timeout_ms=timeout_ms)
        return FetchInFlight(correlation_id, version, shape.prefix_bytes if shape else 0, shape)

    def send_follower_fetch(self, fetch: FollowerFetch, fetch_offset: int, log_start_offset: int, *,
                            timeout_ms: int | None = None) -> FetchInFlight:
        """:meth:`send_fetch` of ``fetch.request(fetch_offset, log_start_offset)``, the frame copied from the
        one encoded for ``fetch`` with the offsets patched in (see the module docstring)."""
        template = self._request_templates.get(fetch)
        if template is None:
            template = self._request_templates[fetch] = self._request_template(fetch)
        if template.frame is None:  # the markers were not found once each: encode every time
            return self.send_fetch(fetch.request(fetch_offset, log_start_offset), timeout_ms=timeout_ms)
        frame = template.frame
        correlation_at, fetch_offset_at, log_start_offset_at = template.positions

        def encode(correlation_id: int) -> bytearray:
            patched = bytearray(frame)
            _INT32.pack_into(patched, correlation_at, correlation_id)
            _INT64.pack_into(patched, fetch_offset_at, fetch_offset)
            _INT64.pack_into(patched, log_start_offset_at, log_start_offset)
            return patched

        correlation_id = self.send_encoded(encode, ApiKey.FETCH, template.version, timeout_ms=timeout_ms)
        return FetchInFlight(correlation_id, template.version, template.shape.prefix_bytes, template.shape)

    def _request_template(self, fetch: FollowerFetch) -> _RequestTemplate:
        version = self.version_for(ApiKey.FETCH)
        shape = self._answer_shape(version, fetch.topic, fetch.partition)
        frame = encode_request(RequestHeader(ApiKey.FETCH, version, _MARK_CORRELATION_ID, self.client_id),
                               fetch.request(_MARK_FETCH_OFFSET, _MARK_LOG_START_OFFSET))
        marks = ((_INT32, _MARK_CORRELATION_ID), (_INT64, _MARK_FETCH_OFFSET),
                 (_INT64, _MARK_LOG_START_OFFSET))
        positions = [_find_once(frame, field.pack(value)) for field, value in marks]
        if min(positions) < 0:
            return _RequestTemplate(version, None, (), shape)
        return _RequestTemplate(version, frame, tuple(positions), shape)

    def receive_fetch(self, sent: FetchInFlight, on_records: RecordsConsumer, *,
                      on_complete: AnswerObserver | None = None) -> tuple[Any, bool]:
        """The answer to ``sent`` (the oldest Fetch in flight), as :meth:`fetch` returns it.  For a streamed
        answer, ``on_complete(answer, rest)`` is called once all of it is in, before ``rest`` (the records
        not used yet) goes to ``on_records`` as the final piece; it may send the next request."""
        stream = _RecordsStream(sent, on_records)
        frame = self.receive_frame(on_body=stream.observe if sent.prefix_bytes else None,
                                   allocate=self._allocate)
        assert frame is not None
        answer = stream.head
        if stream.records is None or answer is None:
            try:
                return decode_response(frame.body, ApiKey.FETCH, frame.api_version).body, False
            except ProtocolError as exc:
                self.close()
                raise ProtocolError(f"broker {self.address}: {exc}") from None
        answer.responses[0].partitions[0].records = stream.records
        rest = stream.records[stream.used_bytes:]
        try:
            if on_complete is not None:
                on_complete(answer, rest)
            on_records(rest, True)
        except BaseException:
            self.close()
            raise
        return answer, True

    def _allocate(self, size: int) -> memoryview:
        if len(self._answer_buffer) < size:
            self._answer_buffer = bytearray(size)  # a new one: views into the old stay valid
        return memoryview(self._answer_buffer)[:size]

    def close(self) -> None:
        super().close()
        self._answer_buffer = bytearray()

    def _answer_shape(self, version: int, topic: str, partition: int) -> _AnswerShape:
        key = (version, topic, partition)
        shape = self._answer_shapes.get(key)
        if shape is None:
            shape = self._answer_shapes[key] = _AnswerShape(version, topic, partition, self.client_id)
        return shape

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

    def __init__(self, sent: FetchInFlight, on_records: RecordsConsumer) -> None:
        self.prefix_bytes = sent.prefix_bytes
        self.correlation_id = sent.correlation_id
        self.version = sent.version
        self.shape = sent.shape
        self.on_records = on_records
        self.checked = False
        self.records: memoryview | None = None  # set once the answer is known to have the streamable shape
        self.head: Any = None  # then: the fixed part, decoded (the answer with empty records)
        self.used_bytes = 0

    def observe(self, body: memoryview, received_bytes: int) -> None:
        prefix = self.prefix_bytes
        total = len(body)
        if not self.checked:
            if received_bytes < prefix:
                return
            self.checked = True
            records_bytes = int.from_bytes(body[prefix - 4:prefix], "big", signed=True)
            if total <= prefix or records_bytes != total - prefix:
                return
            self.head = self._clean_prefix(body[:prefix])
            if self.head is None:
                return
            self.records = body[prefix:]
        records = self.records
        if records is None or received_bytes >= total:
            return
        if received_bytes - prefix - self.used_bytes >= STREAM_CHUNK_BYTES:
            self.used_bytes += self.on_records(records[self.used_bytes:received_bytes - prefix], False)

    def _clean_prefix(self, prefix: memoryview) -> Any:
        """The fixed part decoded (records read as empty) if it is an error-free answer about one
        partition, else None."""
        if self.shape is not None:
            answer = self.shape.parse(prefix, self.correlation_id)
            if answer is not None:
                return answer
        patched = bytearray(prefix)
        patched[-4:] = b"\0\0\0\0"
        try:
            head = decode_response(memoryview(patched), ApiKey.FETCH, self.version)
        except (ProtocolError, ValueError):
            return None
        body = head.body
        clean = (head.correlation_id == self.correlation_id and body.error_code == ErrorCode.NONE
                 and len(body.responses) == 1 and len(body.responses[0].partitions) == 1
                 and body.responses[0].partitions[0].error_code == ErrorCode.NONE)
        return body if clean else None


# Markers: encoded in place of the fields that move, then looked for in the frame (each must occur once).
_MARK_CORRELATION_ID: Final = 0x5A3C96E1
_MARK_THROTTLE_MS: Final = 0x3C5AE196
_MARK_FETCH_OFFSET: Final = 0x0F1E2D3C4B5A6978
_MARK_LOG_START_OFFSET: Final = 0x7A6B5C4D3E2F1001
_MARK_HIGH_WATERMARK: Final = 0x1D2C3B4A59687706
_MARK_LAST_STABLE_OFFSET: Final = 0x2E3D4C5B6A798817
_INT32: Final = struct.Struct(">i")
_INT64: Final = struct.Struct(">q")


class _RequestTemplate(NamedTuple):
    version: int
    frame: bytes | None  # the request encoded with the markers (None: a marker not found once)
    positions: tuple[int, ...]  # of the correlation id, fetch_offset, log_start_offset in frame
    shape: _AnswerShape


class _AnswerShape:
    """How the fixed part of a clean answer (no error, one topic, one partition, no session) to a Fetch of
    (version, topic, partition) looks: the codec's encoding of such an answer, with markers in the fields
    that move from one answer to the next, turned into one ``struct`` layout (constant runs as ``Ns``)."""

    __slots__ = ("constant", "constants", "layout", "moving", "partition", "prefix_bytes", "topic")

    def __init__(self, version: int, topic: str, partition: int, client_id: str) -> None:
        self.topic = topic
        self.partition = partition
        marks = [(_INT32, _MARK_CORRELATION_ID), (_INT32, _MARK_THROTTLE_MS), (_INT64, _MARK_HIGH_WATERMARK),
                 (_INT64, _MARK_LAST_STABLE_OFFSET), (_INT64, _MARK_LOG_START_OFFSET)]
        empty = FetchResponse(throttle_time_ms=_MARK_THROTTLE_MS, error_code=ErrorCode.NONE, session_id=0,
                              responses=[FetchableTopicResponse(topic=topic, partitions=[PartitionData(
                                  partition_index=partition, error_code=ErrorCode.NONE,
                                  high_watermark=_MARK_HIGH_WATERMARK,
                                  last_stable_offset=_MARK_LAST_STABLE_OFFSET,
                                  log_start_offset=_MARK_LOG_START_OFFSET, records=b"")])])
        parts = encode_response_parts(RequestHeader(ApiKey.FETCH, version, _MARK_CORRELATION_ID, client_id),
                                      empty)
        prefix = b"".join(bytes(p) for p in parts if isinstance(p, bytes | bytearray))[SIZE_PREFIX.size:]
        self.prefix_bytes = len(prefix)
        positions = [_find_once(prefix, field.pack(value)) for field, value in marks]
        if min(positions) < 0:  # an older version without some field, or a marker met twice: decode always
            self.layout: struct.Struct | None = None
            return
        # In the order of the bytes: runs of constant bytes ("Ns") and the fields that move, among them the
        # records' length (the last 4 bytes, checked by the caller).
        fields = sorted([*zip(positions, (field for field, _ in marks), strict=True),
                         (len(prefix) - 4, _INT32)])
        fmt, at = ">", 0
        constant: list[int] = []  # indexes of the constant runs among the unpacked values
        moving: list[tuple[int, int]] = []  # (position, index among the values) of the fields that move
        for position, field in fields:
            if position > at:
                constant.append(len(constant) + len(moving))
                fmt += f"{position - at}s"
            moving.append((position, len(constant) + len(moving)))
            fmt += field.format.lstrip(">")
            at = position + field.size
        self.layout = struct.Struct(fmt)
        values = self.layout.unpack(prefix)
        self.constant = operator.itemgetter(*constant)
        self.constants = self.constant(values)
        where = dict(moving)  # position -> index among the values
        self.moving = operator.itemgetter(*(where[position] for position in positions))

    def parse(self, prefix: memoryview, correlation_id: int) -> FetchResponse | None:
        """The answer (records empty) if ``prefix`` is a clean answer to ``correlation_id``, else None."""
        layout = self.layout
        if layout is None or len(prefix) != self.prefix_bytes:
            return None
        values = layout.unpack(prefix)
        if self.constant(values) != self.constants:
            return None
        answer_to, throttle_ms, high_watermark, last_stable_offset, log_start_offset = self.moving(values)
        if answer_to != correlation_id:
            return None
        return FetchResponse(throttle_time_ms=throttle_ms, error_code=ErrorCode.NONE, session_id=0,
                             responses=[FetchableTopicResponse(topic=self.topic, partitions=[PartitionData(
                                 partition_index=self.partition, error_code=ErrorCode.NONE,
                                 high_watermark=high_watermark, last_stable_offset=last_stable_offset,
                                 log_start_offset=log_start_offset, records=b"")])])


def _find_once(frame: bytes, marker: bytes) -> int:
    """Where ``marker`` is in ``frame``, or -1 unless it occurs exactly once."""
    position = frame.find(marker)
    return position if position >= 0 and frame.find(marker, position + 1) < 0 else -1


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

