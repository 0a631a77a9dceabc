"""``appliance.Producer`` over TCP: a :class:`~appliance.client.route.Route` to the partition leaders behind
``bootstrap.servers``, speaking Kafka's Produce.

Theory of operation
-------------------
The producer does not care how a built batch reaches its partition (``appliance.client.route``): it asks
its route for a partition count and a producer id, opens one *channel* per partition, publishes batches
into it and collects ``(batch, base offset or -error code)`` answers in publish order.  Its accumulator,
sequence numbers, retries, renumbering after a refused batch and time-outs are the same whichever route
carries the batches.  :class:`TcpRoute` is the route for a remote appliance (or any Kafka broker):

* ``partitions_for`` -- Metadata (creating the topic when the broker's ``auto.create.topics.enable``
  allows), asked again every ``retry.backoff.ms`` while a partition has no leader, up to ``max.block.ms``.
  Kafka's Metadata does not carry a topic's ``max.message.bytes``: as Kafka's producer does, batches are
  bounded by ``max.request.size`` and the broker refuses a larger one (``MESSAGE_TOO_LARGE``);
* ``init_producer_id`` -- InitProducerId (an idempotent producer id, epoch 0);
* ``open_channel`` -- a :class:`TcpChannel`: its **own connection** to the partition's leader.  A batch is
  one Produce request (``acks`` 1 or -1, ``timeout_ms`` = ``request.timeout.ms``) sent as soon as it is
  built, straight into the request frame (:class:`ProduceFrame`); up to
  ``max.in.flight.requests.per.connection`` requests are outstanding (5 for an idempotent
  producer, the batches a broker remembers per producer for de-duplication).  Kafka answers a connection's
  requests in order, so answers match the ``in_flight`` queue one for one, and a partition's answers come
  in the order of its batches -- which the producer's recovery relies on.  One connection per partition
  keeps that true without bookkeeping across partitions, and a broken connection costs only its own
  partition a resend.

**Failures.**  A connection that breaks, or a request not answered within ``request.timeout.ms``, leaves
the outcome of its requests unknown: the channel raises
:class:`~appliance.client.route.ConnectionLostError` (a :class:`~ipc.ring.RingFailedError`, which the
producer answers as it answers a failed ring: by taking the answers that did arrive, dropping the channel
and publishing every unanswered batch again, in order, with the same sequence numbers, through a new one;
a connection that keeps breaking is opened again until the publish's time limit has passed, ``max.block.ms``
for a send).  The broker's
idempotence state recognises a batch it appended before and answers with its original offsets, so it
appears once in the log.  An answer ``NOT_LEADER_OR_FOLLOWER`` (or no leader)
is a retriable error for the producer and marks the channel stale: the next publish raises
:class:`ConnectionLostError`, and the new channel goes to the leader a fresh Metadata names.  When no
broker can be reached at all, :meth:`TcpRoute.alive` turns false (the bootstrap connection reads end of
stream, or connecting failed) and the producer waits in :meth:`TcpRoute.reconnect` for a bootstrap server to
answer again, up to ``max.block.ms``, as it waits for a restarted local appliance.

``acks=0`` is refused over TCP (:class:`ConfigError`): a Produce with acks=0 gets no answer, and the
connection client here matches every request to one.

**Threads.**  The producer calls every method under its lock except :meth:`TcpChannel.wait_acked`, which
only waits for the socket to become readable (``select``) and touches no state, as a ring wait only parks
on a semaphore; the bytes are read under the lock by :meth:`TcpChannel.poll`.

Fault points (tests only): ``route.faults["lose-response"] = n`` breaks a channel's connection as each of
the next ``n`` Produce answers arrives, dropping it unread, as a network failure would: the broker
appended that request's batch (and maybe those of the requests behind it, also in flight), the producer
does not know, and sends them all again; the broker recognises the duplicates.
"""

from __future__ import annotations

import select
import struct
import time
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

import numpy as np

from appliance.client.kafka_cluster import KafkaCluster
from appliance.client.producer_config import ProducerConfig
from appliance.client.route import ConnectionLostError
from ipc.kafka import (
    APIS,
    ApiKey,
    ErrorCode,
    InitProducerIdRequest,
    InitProducerIdResponse,
    PartitionProduceData,
    ProduceRequest,
    ProduceResponse,
    RequestHeader,
    TopicProduceData,
    encode_request,
    error_name,
)
from ipc.kafka.framing import REQUEST_HEADER_FIXED, SIZE_PREFIX
from ipc.kafka_client import BrokerConnectionError, KafkaConnection
from storage.errors import (
    ApplianceError,
    BackPressureError,
    ConfigError,
    ProtocolError,
    RequestTimeoutError,
    UnknownTopicOrPartitionError,
)

if TYPE_CHECKING:
    from appliance.client.accumulator import ProducerBatch
    from appliance.client.route import BatchChannel

__all__ = ["ConnectionLostError", "FrameBuffer", "ProduceFrame", "TcpChannel", "TcpRoute"]

_WAIT_SLICE_S = 0.1  # a publish waiting for an in-flight slot re-checks this often
_RECORDS_LENGTH = struct.Struct(">i")  # the records field's length prefix (Produce v3-v8)
_CORRELATION_ID = struct.Struct(">i")
_CORRELATION_ID_AT = REQUEST_HEADER_FIXED.size - _CORRELATION_ID.size  # the last field of the fixed header
# Answers after which the partition's leader must be looked up again.
_LEADER_MOVED = frozenset({
    ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.LEADER_NOT_AVAILABLE, ErrorCode.FENCED_LEADER_EPOCH,
})  # fmt: skip
# InitProducerId answers worth asking again (the broker is starting, or moving its coordinator).
_RETRY_INIT = frozenset({
    ErrorCode.COORDINATOR_NOT_AVAILABLE, ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
    ErrorCode.REQUEST_TIMED_OUT, ErrorCode.NOT_ENOUGH_REPLICAS,
})  # fmt: skip


class FrameBuffer:
    """The memory a route's Produce frames are built in, one frame at a time, grown to the largest.

    One per route, shared by its channels: the producer publishes under its lock, and ``sendall`` has
    handed a frame to the kernel before the next publish begins, so no two frames need it at once.
    Reusing it spares every batch fresh pages (on a virtual machine each first touch is a page fault)."""

    def __init__(self) -> None:
        self.data = np.empty(0, np.uint8)

    def at_least(self, size: int) -> np.ndarray:
        if len(self.data) < size:
            self.data = np.empty(size, np.uint8)
        return self.data


class ProduceFrame:
    """One partition's Produce request frame, encoded once; each batch is built in place at its end.

    The codec speaks Produce v3-v8, none of them flexible: a request for one partition of one topic ends
    with its records field, an INT32 length and the batch.  So the request is encoded once with empty
    records (:attr:`head`, its last four bytes that length), and a batch is built right after it in the
    route's :class:`FrameBuffer`; then only the size prefix, the records length and (as the connection
    sends it) the correlation id, in the fixed request header, are written.  No copy of the batch is made
    before the socket's."""

    def __init__(self, *, version: int, client_id: str | None, topic: str, partition: int, acks: int,
                 timeout_ms: int, buffer: FrameBuffer) -> None:
        self.version = version
        request = ProduceRequest(
            transactional_id=None,
            acks=acks,
            timeout_ms=timeout_ms,
            topic_data=[TopicProduceData(topic, [PartitionProduceData(partition, b"")])],
        )  # fmt: skip
        head = encode_request(RequestHeader(ApiKey.PRODUCE, version, 0, client_id), request)
        if APIS[ApiKey.PRODUCE].is_flexible(version) or head[-_RECORDS_LENGTH.size:] != bytes(4):
            raise ProtocolError(f"Produce v{version} does not end with its records (built in place)")
        self.head = np.frombuffer(head, np.uint8)
        self.buffer = buffer

    def build(self, max_bytes: int, build: Callable[[np.ndarray], int]) -> memoryview | None:
        """The whole frame with the batch ``build(region)`` wrote at the start of ``region`` (its size
        returned); None if it wrote nothing (``size`` not in ``1..max_bytes``)."""
        records_at = len(self.head)
        frame = self.buffer.at_least(records_at + max_bytes)
        frame[:records_at] = self.head
        size = build(frame[records_at : records_at + max_bytes])
        if not 0 < size <= max_bytes:
            return None
        view = frame.data[: records_at + size]
        SIZE_PREFIX.pack_into(view, 0, records_at + size - SIZE_PREFIX.size)
        _RECORDS_LENGTH.pack_into(view, records_at - _RECORDS_LENGTH.size, size)
        return view

    @staticmethod
    def with_correlation_id(frame: memoryview, correlation_id: int) -> memoryview:
        """``frame`` (from :meth:`build`) with ``correlation_id`` written into its request header."""
        _CORRELATION_ID.pack_into(frame, SIZE_PREFIX.size + _CORRELATION_ID_AT, correlation_id)
        return frame

    def send(self, connection: KafkaConnection, frame: memoryview) -> int:
        """Send a frame :meth:`build` returned; its correlation id."""
        return connection.send_encoded(partial(self.with_correlation_id, frame), ApiKey.PRODUCE, self.version)


class TcpChannel:
    """One partition's batches as Produce requests on a connection to its leader
    (``appliance.client.route.BatchChannel``)."""

    def __init__(self, connection: KafkaConnection, *, topic: str, partition: int, acks: int,
                 request_timeout_ms: int, max_in_flight: int, max_body_bytes: int,
                 faults: dict[str, int] | None = None, buffer: FrameBuffer | None = None) -> None:
        self.connection = connection
        self.frame = ProduceFrame(version=connection.version_for(ApiKey.PRODUCE),
                                  client_id=connection.client_id, topic=topic, partition=partition, acks=acks,
                                  timeout_ms=request_timeout_ms, buffer=buffer or FrameBuffer())
        self.faults = {} if faults is None else faults  # the route's fault points (see the module docstring)
        self.topic = topic
        self.partition = partition
        self.acks = acks
        self.request_timeout_ms = request_timeout_ms
        self.max_in_flight = max_in_flight
        self.max_body_bytes = max_body_bytes
        self.track_acks = True
        self.in_flight: deque[tuple[int, ProducerBatch]] = deque()  # (request seq, batch), oldest first
        self.completed: deque[tuple[ProducerBatch, int]] = deque()
        self.last_ack_ns = time.monotonic_ns()
        self._next_seq = 0
        self._stale: str | None = None  # why the next publish must go through a new channel

    @property
    def name(self) -> str:
        return f"{self.topic}-{self.partition}@{self.connection.address}"

    # -- publishing ------------------------------------------------------------------------------------------

    def publish_into(self, max_bytes: int, build: Callable[[np.ndarray], int], token: ProducerBatch, *,
                     timeout_ms: int | None = None) -> int:
        """Build a batch (``build(region)`` writes it at the start of ``region`` and returns its size) and
        send it as one Produce request; return its request seq.  Waits for an in-flight slot up to
        ``timeout_ms`` (:class:`BackPressureError`, nothing sent)."""
        if self._stale is not None:
            raise ConnectionLostError(f"channel {self.name}: {self._stale}; open a new one")
        deadline = time.monotonic() + (self.request_timeout_ms if timeout_ms is None else timeout_ms) / 1000
        while len(self.in_flight) >= self.max_in_flight:
            self.poll()
            if len(self.in_flight) < self.max_in_flight:
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise BackPressureError(
                    f"partition {self.topic}-{self.partition}: {len(self.in_flight)} Produce requests to "
                    f"{self.connection.address} await answers (max.in.flight {self.max_in_flight}); "
                    "nothing was sent, slow down or retry"
                )
            self._wait_readable(min(remaining, _WAIT_SLICE_S))
        frame = self.frame.build(max_bytes, build)
        if frame is None:
            raise ValueError(f"channel {self.name}: the builder wrote no batch into {max_bytes} bytes")
        try:
            self.frame.send(self.connection, frame)
        except (BrokerConnectionError, RequestTimeoutError) as exc:
            # the request may be on its way: the producer sends it again through a new channel
            raise ConnectionLostError(f"channel {self.name}: {exc}") from None
        seq = self._next_seq
        self._next_seq += 1
        if not self.in_flight:
            self.last_ack_ns = time.monotonic_ns()  # the answer clock starts with the oldest request
        self.in_flight.append((seq, token))
        return seq

    # -- answers ---------------------------------------------------------------------------------------------

    def poll(self) -> int:
        """Move the answers that arrived to :attr:`completed` (base offset, or minus Kafka's error code);
        return how many.  Raises :class:`ConnectionLostError` when the connection broke or an answer is
        overdue (the requests still in :attr:`in_flight` were answered by nobody)."""
        count = 0
        while self.in_flight:
            try:
                response = self.connection.receive(wait_ms=0)
            except (BrokerConnectionError, RequestTimeoutError, ProtocolError) as exc:
                raise ConnectionLostError(
                    f"channel {self.name}: {exc}; {len(self.in_flight)} batches unanswered"
                ) from None
            if response is None:
                break
            if self.faults and self.faults.get("lose-response", 0) > 0:  # lost on its way back
                self.faults["lose-response"] -= 1
                self.connection.close()
                raise ConnectionLostError(
                    f"channel {self.name}: fault point lose-response; {len(self.in_flight)} unanswered"
                )
            _, batch = self.in_flight.popleft()
            self.completed.append((batch, self._result(response)))
            count += 1
        if count:
            self.last_ack_ns = time.monotonic_ns()
        return count

    def _result(self, response: ProduceResponse) -> int:
        for topic in response.responses:
            for part in topic.partition_responses:
                if topic.name == self.topic and part.index == self.partition:
                    if part.error_code == ErrorCode.NONE:
                        return int(part.base_offset)
                    if part.error_code in _LEADER_MOVED:
                        self._stale = f"the broker answered {error_name(part.error_code)}"
                    return -int(part.error_code)
        self._stale = "a Produce answer without this partition"
        return -int(ErrorCode.NETWORK_EXCEPTION)

    def wait_acked(self, seq: int, timeout_ms: float) -> bool:
        """Wait until request ``seq`` may be answered (answered already, or bytes arrived) or ``timeout_ms``
        passes; True unless the time ran out.  Reads nothing: :meth:`poll` collects, under the caller's
        lock."""
        try:
            if self.in_flight[0][0] > seq:
                return True
        except IndexError:  # nothing in flight (or emptied by the thread holding the lock just now)
            return True
        return self._wait_readable(max(timeout_ms, 1) / 1000)

    def _wait_readable(self, timeout_s: float) -> bool:
        fd = self.connection.fileno()
        if fd < 0:
            return True  # closed: poll() says why
        try:
            readable, _, _ = select.select([fd], [], [], timeout_s)
        except (OSError, ValueError):  # closed by another thread meanwhile
            return True
        return bool(readable)

    def take_completed(self) -> list[tuple[ProducerBatch, int]]:
        """The ``(batch, result)`` pairs answered since the last call, in publish order."""
        done = list(self.completed)
        self.completed.clear()
        return done

    def abandon_in_flight(self) -> list[ProducerBatch]:
        """Forget the requests awaiting answers; return their batches in publish order (to send again)."""
        batches = [batch for _, batch in self.in_flight]
        self.in_flight.clear()
        return batches

    def close(self) -> None:
        """Close the connection (answers not received are lost; the batches were handed back first)."""
        self.connection.close()


class TcpRoute:
    """The partitions behind ``bootstrap.servers``, one connection per partition to its leader."""

    def __init__(self, config: ProducerConfig) -> None:
        if config.acks == 0:
            raise ConfigError(
                "producer setting acks=0 is not supported over bootstrap.servers (a Produce with acks=0 has "
                "no answer): use acks=1 or all, or the local appliance"
            )
        self.config = config
        self.path = config.bootstrap_servers  # (named in the producer's reconnect log line)
        try:
            self.cluster = KafkaCluster(
                config.bootstrap_servers,
                client_id=config.client_id or "appliance-producer",
                connect_timeout_ms=min(config.request_timeout_ms, 10_000),
                request_timeout_ms=config.request_timeout_ms,
            )
        except ValueError as exc:
            raise ConfigError(f"producer setting bootstrap.servers: {exc}") from None
        self.faults: dict[str, int] = {}  # fault points for tests (see the module docstring)
        self._frames = FrameBuffer()  # every channel's Produce frames are built here
        self._lost = False  # a connection attempt failed: alive() is false until reconnect() succeeds
        self._opened: set[tuple[str, int]] = set()  # partitions that had a channel (ask again for a new one)
        self._until_connected(self.config.max_block_ms)

    # -- the cluster -----------------------------------------------------------------------------------------

    def _until_connected(self, timeout_ms: int) -> None:
        """Connect to a bootstrap server, trying every ``retry.backoff.ms`` up to ``timeout_ms``."""
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            try:
                self.cluster.any_connection()
                self._lost = False
                return
            except BrokerConnectionError as exc:
                if time.monotonic() >= deadline:
                    raise BrokerConnectionError(
                        f"{exc} (waited max.block.ms {self.config.max_block_ms} ms)"
                    ) from None
                time.sleep(min(self.config.retry_backoff_ms, 1000) / 1000)

    def partitions_for(self, topic: str) -> tuple[int, int]:
        """(partition count, the largest batch: ``max.request.size``); UnknownTopicOrPartitionError if the
        topic does not exist (and the broker does not create it) or its name is not legal."""
        deadline = time.monotonic() + self.config.max_block_ms / 1000
        while True:
            try:
                metadata = self.cluster.metadata([topic], auto_create=True)
            except BrokerConnectionError:
                self._until_connected(max(0, int((deadline - time.monotonic()) * 1000)))
                continue
            answer = next((t for t in metadata.topics if t.name == topic), None)
            code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION if answer is None else answer.error_code
            where = self.cluster.bootstrap_servers
            if code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
                raise UnknownTopicOrPartitionError(
                    f"topic {topic!r} does not exist on the appliance at {where} (and the broker does not "
                    "create topics automatically: create it with `appliance topics create`)"
                )
            if code == ErrorCode.INVALID_TOPIC_EXCEPTION:
                raise UnknownTopicOrPartitionError(
                    f"topic {topic!r} is not a legal topic name (1-249 of [A-Za-z0-9._-], not '.' or '..')"
                )
            if code == ErrorCode.NONE and answer is not None and answer.partitions and all(
                p.leader_id >= 0 for p in answer.partitions
            ):
                return len(answer.partitions), self.config.max_request_size
            if time.monotonic() >= deadline:
                raise RequestTimeoutError(
                    f"topic {topic!r}: no leader for every partition within max.block.ms "
                    f"{self.config.max_block_ms} ms (Metadata from {where}: {error_name(code)})"
                )
            time.sleep(self.config.retry_backoff_ms / 1000)  # being created, or electing a leader

    def requires_keys(self, topic: str) -> bool:
        """Never here: the broker checks a compacted topic's keys and answers INVALID_RECORD."""
        return False

    def init_producer_id(self) -> tuple[int, int]:
        """An idempotent producer id and epoch from InitProducerId."""
        deadline = time.monotonic() + self.config.max_block_ms / 1000
        while True:
            response: InitProducerIdResponse = self.cluster.any_connection().request(
                InitProducerIdRequest(transactional_id=None, transaction_timeout_ms=60_000)
            )
            if response.error_code == ErrorCode.NONE:
                return int(response.producer_id), int(response.producer_epoch)
            if response.error_code not in _RETRY_INIT or time.monotonic() >= deadline:
                raise ApplianceError(
                    f"InitProducerId at {self.cluster.bootstrap_servers} failed: "
                    f"{error_name(response.error_code)}"
                )
            time.sleep(self.config.retry_backoff_ms / 1000)

    # -- channels --------------------------------------------------------------------------------------------

    def open_channel(self, topic: str, partition: int, producer_id: int, *, track_acks: bool,
                     max_in_flight: int, max_block_ms: int, acks: int = 1) -> BatchChannel:
        """A new connection to the partition's leader (the one ``partitions_for`` found for a first channel,
        asked again for a replacement: it may have moved).  When no broker
        answers, :class:`BackPressureError` with :meth:`alive` false: the producer waits in
        :meth:`reconnect`."""
        del producer_id, track_acks, max_block_ms  # (the batch carries the id; acks=0 is refused)
        key = (topic, partition)
        try:
            if key in self._opened or self.cluster.leaders.get(key, -1) < 0:
                self.cluster.metadata([topic], auto_create=False)  # a new channel: the leader may have moved
            self._opened.add(key)
            leader = self.cluster.leaders.get(key, -1)
            if leader < 0:
                time.sleep(self.config.retry_backoff_ms / 1000)  # (the producer tries again at once)
                raise BackPressureError(f"partition {topic}-{partition} has no leader now; retrying")
            connection = self.cluster.open_connection(leader)
        except BrokerConnectionError as exc:
            self._lost = True
            raise BackPressureError(f"partition {topic}-{partition}: {exc}") from None
        return TcpChannel(connection, topic=topic, partition=partition, acks=acks,
                          request_timeout_ms=self.config.request_timeout_ms, max_in_flight=max_in_flight,
                          max_body_bytes=self.config.max_request_size, faults=self.faults,
                          buffer=self._frames)  # fmt: skip

    def drop_channel(self, channel: BatchChannel) -> None:
        channel.close()

    def storage_detail(self, topic: str, partition: int) -> tuple[str, str]:
        """Unknown over TCP: the broker's answer says only KAFKA_STORAGE_ERROR (and its error_message)."""
        return "", ""

    def alive(self) -> bool:
        """False when the broker went away: a connection attempt failed, or the bootstrap connection ended."""
        return not self._lost and self.cluster.bootstrap_alive()

    def reconnect(self, timeout_ms: int) -> None:
        """Wait (up to ``timeout_ms``) until a bootstrap server answers again."""
        self.cluster.close()
        self._until_connected(timeout_ms)

    def close(self) -> None:
        self.cluster.close()

    def __repr__(self) -> str:
        return f"TcpRoute({self.cluster.bootstrap_servers!r})"
