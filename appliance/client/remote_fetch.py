"""The consumer's remote path: Metadata, ListOffsets and pipelined Fetch requests over the Kafka protocol.

Theory of operation
-------------------
A :class:`RemoteCluster` holds one :class:`~ipc.kafka_client.KafkaConnection` per broker it talks to:
it bootstraps from ``bootstrap.servers``, learns from Metadata which broker leads each assigned partition,
and asks leaders for offsets (ListOffsets: earliest -2, latest -1, or a timestamp).

Fetching (:meth:`RemoteCluster.fetch`) keeps **one Fetch in flight per leader** and sends the next one as
soon as a response arrives, *before* the caller decodes it: the broker reads the next records (``sendfile``
from its page cache) while this process decodes the previous ones, so on two cores the two halves overlap,
as in Kafka's own consumer.  A Fetch asks every assigned partition the leader leads from its position, with
Kafka's ``fetch.min.bytes`` / ``fetch.max.wait.ms`` (the broker holds the request until that many bytes or
that long) and ``max.partition.fetch.bytes`` / ``fetch.max.bytes``.  Each partition's answer is used only
if the position it was fetched for is still the consumer's position (a ``seek`` in between makes it stale:
it is dropped and fetched again).

A Fetch response may end with a partial batch (Kafka cuts at ``max_bytes``, not at a batch boundary): the
decoder stops quietly before it (``record_arrays.STOP_TRUNCATED``) and the next fetch starts at the offset
after the last whole batch.  A response holding records but not one whole batch means the batch is larger
than the limit the broker applied; that is an error naming the sizes.

Partition errors in a response are Kafka's: ``OFFSET_OUT_OF_RANGE`` goes back to the consumer (which applies
``auto.offset.reset``); leadership errors refresh metadata and fetch again after ``retry.backoff.ms``;
``UNKNOWN_TOPIC_OR_PARTITION`` raises :class:`UnknownTopicOrPartitionError`; anything else raises
:class:`ApplianceError` naming the partition and the error.
"""

from __future__ import annotations

import select
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from appliance.client.record_arrays import DecodedRun, decode_run
from ipc.kafka import (
    ErrorCode,
    FetchPartition,
    FetchRequest,
    FetchResponse,
    FetchTopic,
    ListOffsetsPartition,
    ListOffsetsRequest,
    ListOffsetsResponse,
    ListOffsetsTopic,
    MetadataRequest,
    MetadataRequestTopic,
    MetadataResponse,
    error_name,
)
from ipc.kafka_client import BrokerConnectionError, KafkaConnection, parse_bootstrap_servers
from storage.errors import (
    ApplianceError,
    CorruptRecordError,
    OffsetOutOfRangeError,
    UnknownTopicOrPartitionError,
)

__all__ = ["FetchSettings", "PartitionFetch", "RemoteCluster"]

TopicPartitionKey = tuple[str, int]
EARLIEST = -2
LATEST = -1
_NO_LIMIT_OFFSET = 1 << 62
_RETRIABLE = {
    ErrorCode.NOT_LEADER_OR_FOLLOWER,
    ErrorCode.LEADER_NOT_AVAILABLE,
    ErrorCode.REPLICA_NOT_AVAILABLE,
    ErrorCode.UNKNOWN_LEADER_EPOCH,
    ErrorCode.FENCED_LEADER_EPOCH,
    ErrorCode.KAFKA_STORAGE_ERROR,
    ErrorCode.REQUEST_TIMED_OUT,
    ErrorCode.NOT_ENOUGH_REPLICAS,
}


@dataclass(frozen=True)
class FetchSettings:
    """Kafka's consumer fetch settings (the consumer's config, with units in the names)."""

    fetch_min_bytes: int = 1
    fetch_max_wait_ms: int = 500
    max_partition_fetch_bytes: int = 1_048_576
    fetch_max_bytes: int = 52_428_800
    check_crcs: bool = True
    client_id: str = "appliance-consumer"
    request_timeout_ms: int = 30_000
    connect_timeout_ms: int = 10_000
    retry_backoff_ms: int = 100


@dataclass
class PartitionFetch:
    """What one fetch brought for one partition: decoded records, or an out-of-range error."""

    topic: str
    partition: int
    fetch_offset: int
    run: DecodedRun | None = None
    high_watermark: int = -1
    log_start_offset: int = -1
    error: OffsetOutOfRangeError | None = None


@dataclass
class _InFlight:
    offsets: dict[TopicPartitionKey, int]
    sent_at: float


@dataclass
class _Broker:
    node_id: int
    host: str
    port: int
    connection: KafkaConnection | None = None
    in_flight: _InFlight | None = None
    retry_after: float = 0.0
    partitions: list[TopicPartitionKey] = field(default_factory=list)


class RemoteCluster:
    """Connections to the brokers leading a consumer's partitions.  Not thread-safe."""

    def __init__(self, bootstrap_servers: str | list[str], settings: FetchSettings) -> None:
        self.settings = settings
        self._bootstrap = parse_bootstrap_servers(bootstrap_servers)
        self._brokers: dict[int, _Broker] = {}
        self._leaders: dict[TopicPartitionKey, int] = {}
        self._partition_counts: dict[str, int] = {}
        self._bootstrap_connection: KafkaConnection | None = None
        self.high_watermarks: dict[TopicPartitionKey, int] = {}

    # --- connections ----------------------------------------------------------------------------------------
    def _connect(self, host: str, port: int) -> KafkaConnection:
        s = self.settings
        return KafkaConnection(
            host, port, client_id=s.client_id, connect_timeout_ms=s.connect_timeout_ms,
            request_timeout_ms=s.request_timeout_ms,
        )  # fmt: skip

    def _any_connection(self) -> KafkaConnection:
        for broker in self._brokers.values():
            if broker.connection is not None and not broker.connection.closed and not broker.in_flight:
                return broker.connection
        if self._bootstrap_connection is not None and not self._bootstrap_connection.closed:
            return self._bootstrap_connection
        errors = []
        for host, port in self._bootstrap:
            try:
                self._bootstrap_connection = self._connect(host, port)
                return self._bootstrap_connection
            except BrokerConnectionError as exc:
                errors.append(str(exc))
        raise BrokerConnectionError("no bootstrap server answered: " + "; ".join(errors))

    def _leader_connection(self, node_id: int) -> KafkaConnection:
        broker = self._brokers[node_id]
        if broker.connection is None or broker.connection.closed:
            bootstrap = self._bootstrap_connection
            if bootstrap is not None and not bootstrap.closed and (bootstrap.host, bootstrap.port) == (
                broker.host, broker.port,
            ):  # fmt: skip
                broker.connection, self._bootstrap_connection = bootstrap, None
            else:
                broker.connection = self._connect(broker.host, broker.port)
            broker.in_flight = None
        return broker.connection

    # --- metadata -------------------------------------------------------------------------------------------
    def refresh_metadata(self, topics: Iterable[str]) -> None:
        """Ask for the leaders of ``topics``' partitions.  UnknownTopicOrPartitionError for a topic the
        cluster does not have."""
        names = sorted(set(topics))
        deadline = time.monotonic() + self.settings.request_timeout_ms / 1000
        while True:
            connection = self._any_connection()
            response = connection.request(
                MetadataRequest(
                    topics=[MetadataRequestTopic(name=n) for n in names], allow_auto_topic_creation=False
                )
            )
            assert isinstance(response, MetadataResponse)
            pending = self._apply_metadata(response, connection)
            if not pending or time.monotonic() > deadline:
                break
            time.sleep(self.settings.retry_backoff_ms / 1000)  # a leader is being elected: ask again
        for topic, code in pending.items():
            raise ApplianceError(f"topic {topic!r}: metadata error {error_name(code)} for over "
                                 f"{self.settings.request_timeout_ms} ms")

    def _apply_metadata(self, response: MetadataResponse, via: KafkaConnection) -> dict[str, int]:
        for node in response.brokers:
            host = node.host or via.host
            known = self._brokers.get(node.node_id)
            if known is None or (known.host, known.port) != (host, node.port):
                if known is not None and known.connection is not None:
                    known.connection.close()
                self._brokers[node.node_id] = _Broker(node.node_id, host, node.port)
        pending: dict[str, int] = {}
        for topic in response.topics:
            if topic.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
                raise UnknownTopicOrPartitionError(f"topic {topic.name!r} does not exist on the cluster "
                                                   f"at {via.address}")
            if topic.error_code != ErrorCode.NONE:
                pending[topic.name] = topic.error_code
                continue
            self._partition_counts[topic.name] = len(topic.partitions)
            for part in topic.partitions:
                if part.error_code in _RETRIABLE or part.leader_id < 0:
                    pending[topic.name] = part.error_code or ErrorCode.LEADER_NOT_AVAILABLE
                self._leaders[(topic.name, part.partition_index)] = part.leader_id
        return pending

    def partitions_for(self, topic: str) -> list[int]:
        if topic not in self._partition_counts:
            self.refresh_metadata([topic])
        return list(range(self._partition_counts[topic]))

    def _leader(self, tp: TopicPartitionKey) -> int:
        if tp not in self._leaders or self._leaders[tp] not in self._brokers:
            self.refresh_metadata([tp[0]])
            if tp not in self._leaders:
                raise UnknownTopicOrPartitionError(
                    f"partition {tp[0]}-{tp[1]}: topic {tp[0]!r} has {self._partition_counts.get(tp[0], 0)} "
                    "partitions"
                )
        return self._leaders[tp]

    def assign(self, partitions: Iterable[TopicPartitionKey]) -> None:
        """Learn the leaders of ``partitions`` (raises for unknown ones); forget fetches in flight."""
        wanted = list(partitions)
        if wanted:
            self.refresh_metadata({t for t, _ in wanted})
        for tp in wanted:
            self._leader(tp)
        for broker in self._brokers.values():
            broker.partitions = [tp for tp in wanted if self._leaders.get(tp) == broker.node_id]

    # --- offsets --------------------------------------------------------------------------------------------
    def list_offsets(
        self, partitions: Iterable[TopicPartitionKey], timestamp: int
    ) -> dict[TopicPartitionKey, int]:
        """ListOffsets at ``timestamp`` (EARLIEST -2, LATEST -1 = the high watermark, or ms): offset per
        partition, -1 where no record has that timestamp."""
        by_leader: dict[int, list[TopicPartitionKey]] = {}
        for tp in partitions:
            by_leader.setdefault(self._leader(tp), []).append(tp)
        out: dict[TopicPartitionKey, int] = {}
        for node_id, tps in by_leader.items():
            topics: dict[str, list[ListOffsetsPartition]] = {}
            for topic, partition in tps:
                topics.setdefault(topic, []).append(
                    ListOffsetsPartition(partition_index=partition, timestamp=timestamp)
                )
            request = ListOffsetsRequest(
                replica_id=-1, isolation_level=0,
                topics=[ListOffsetsTopic(name=t, partitions=ps) for t, ps in topics.items()],
            )  # fmt: skip
            response = self._side_request(node_id, request)
            assert isinstance(response, ListOffsetsResponse)
            for topic_response in response.topics:
                for part in topic_response.partitions:
                    key = (topic_response.name, part.partition_index)
                    if part.error_code != ErrorCode.NONE:
                        self._raise_partition_error(key, part.error_code, "ListOffsets")
                    out[key] = part.offset
        return out

    def _side_request(self, node_id: int, body: Any) -> Any:
        """A request to a leader that may have a Fetch in flight: use a spare connection then."""
        broker = self._brokers[node_id]
        if broker.in_flight is None:
            return self._leader_connection(node_id).request(body)
        with self._connect(broker.host, broker.port) as spare:
            return spare.request(body)

    # --- fetching -------------------------------------------------------------------------------------------
    def fetch(self, positions: Mapping[TopicPartitionKey, int], timeout_s: float) -> list[PartitionFetch]:
        """Records for the partitions at ``positions``, waiting up to ``timeout_s`` for a response.  Sends a
        Fetch to every leader without one in flight, returns the partitions of the responses that arrive
        (stale ones dropped) and sends each of those leaders its next Fetch straight away."""
        deadline = time.monotonic() + timeout_s
        self._send_fetches(positions)
        results: list[PartitionFetch] = []
        while True:
            waiting = [b for b in self._brokers.values() if b.in_flight is not None and b.connection]
            remaining = deadline - time.monotonic()
            if not waiting:
                backing_off = [b.retry_after for b in self._brokers.values() if b.partitions]
                if results or remaining <= 0 or not backing_off:
                    return results
                time.sleep(min(remaining, max(0.0, min(backing_off) - time.monotonic())))
                self._send_fetches(positions)
                continue
            ready = self._ready(waiting, 0.0 if results else max(0.0, remaining))
            for broker in ready:
                try:
                    results.extend(self._receive(broker, positions))
                except BrokerConnectionError:
                    self._drop(broker)  # reconnect on the next send (raises if down)
            if results:
                self._send_fetches(self._advanced(positions, results))
                return results
            if remaining <= 0:
                return results
            self._send_fetches(positions)  # leaders whose response was all stale: fetch again

    @staticmethod
    def _advanced(positions: Mapping[TopicPartitionKey, int], results: list[PartitionFetch]) -> dict[
        TopicPartitionKey, int
    ]:
        advanced = dict(positions)
        for fetched in results:
            run = fetched.run
            if run is not None and run.next_offset >= 0:
                advanced[(fetched.topic, fetched.partition)] = run.next_offset
        return advanced

    def _drop(self, broker: _Broker) -> None:
        if broker.connection is not None:
            broker.connection.close()
        broker.connection, broker.in_flight = None, None
        broker.retry_after = time.monotonic() + self.settings.retry_backoff_ms / 1000

    def _ready(self, waiting: list[_Broker], wait_s: float) -> list[_Broker]:
        by_fd = {}
        for broker in waiting:
            assert broker.connection is not None
            by_fd[broker.connection.fileno()] = broker
        readable, _, _ = select.select(list(by_fd), [], [], wait_s)
        return [by_fd[fd] for fd in readable]

    def _send_fetches(self, positions: Mapping[TopicPartitionKey, int]) -> None:
        s = self.settings
        now = time.monotonic()
        for broker in self._brokers.values():
            if broker.in_flight is not None or not broker.partitions or now < broker.retry_after:
                continue
            offsets = {tp: positions[tp] for tp in broker.partitions if tp in positions}
            if not offsets:
                continue
            topics: dict[str, list[FetchPartition]] = {}
            for (topic, partition), offset in offsets.items():
                topics.setdefault(topic, []).append(
                    FetchPartition(partition=partition, fetch_offset=offset, log_start_offset=-1,
                                   partition_max_bytes=s.max_partition_fetch_bytes)
                )
            request = FetchRequest(
                replica_id=-1, max_wait_ms=s.fetch_max_wait_ms, min_bytes=s.fetch_min_bytes,
                max_bytes=s.fetch_max_bytes, isolation_level=0, session_id=0, session_epoch=-1,
                topics=[FetchTopic(topic=t, partitions=ps) for t, ps in topics.items()],
            )  # fmt: skip
            connection = self._leader_connection(broker.node_id)
            connection.send(request, timeout_ms=s.request_timeout_ms + s.fetch_max_wait_ms)
            broker.in_flight = _InFlight(offsets, now)

    def _receive(self, broker: _Broker, positions: Mapping[TopicPartitionKey, int]) -> list[PartitionFetch]:
        assert broker.connection is not None and broker.in_flight is not None
        response = broker.connection.receive(wait_ms=0)
        if response is None:
            return []  # part of it arrived; the rest comes later
        asked = broker.in_flight.offsets
        broker.in_flight = None
        assert isinstance(response, FetchResponse)
        if response.error_code != ErrorCode.NONE:
            raise ApplianceError(f"broker {broker.connection.address}: Fetch failed: "
                                 f"{error_name(response.error_code)}")
        results = []
        refresh = False
        for topic_response in response.responses:
            for part in topic_response.partitions:
                key = (topic_response.topic, part.partition_index)
                fetch_offset = asked.get(key)
                if fetch_offset is None or positions.get(key) != fetch_offset:
                    continue  # not asked, or the consumer seeked since: stale
                code = part.error_code
                if code == ErrorCode.OFFSET_OUT_OF_RANGE:
                    results.append(PartitionFetch(key[0], key[1], fetch_offset, error=OffsetOutOfRangeError(
                        f"partition {key[0]}-{key[1]}: offset {fetch_offset} is out of range (broker "
                        f"{broker.connection.address}: log start offset {part.log_start_offset}, high "
                        f"watermark {part.high_watermark})"
                    )))  # fmt: skip
                    continue
                if code in _RETRIABLE:
                    refresh = True
                    continue
                if code != ErrorCode.NONE:
                    self._raise_partition_error(key, code, "Fetch")
                self.high_watermarks[key] = part.high_watermark
                run = self._decode(key, fetch_offset, part.records, broker)
                results.append(PartitionFetch(key[0], key[1], fetch_offset, run, part.high_watermark,
                                              part.log_start_offset))
        if refresh:
            broker.retry_after = time.monotonic() + self.settings.retry_backoff_ms / 1000
            self.refresh_metadata({t for t, _ in asked})
            self.assign([tp for b in self._brokers.values() for tp in b.partitions])
        return results

    def _decode(self, key: TopicPartitionKey, fetch_offset: int, records: Any, broker: _Broker) -> DecodedRun:
        if records is None or len(records) == 0:
            return DecodedRun([], -1, 0, 0, 0, 0)
        buf = np.frombuffer(records, dtype=np.uint8)
        where = f"partition {key[0]}-{key[1]} fetch response from {broker.host}:{broker.port}"
        run = decode_run(
            buf, 0, len(buf), topic=key[0], partition=key[1], min_offset=fetch_offset,
            max_offset=_NO_LIMIT_OFFSET, max_bytes=_NO_LIMIT_OFFSET, check_crcs=self.settings.check_crcs,
            where=where, max_batches=max(16, len(buf) // 64),
        )  # fmt: skip
        if run.batch_count == 0:
            raise CorruptRecordError(
                f"{where}: {len(buf)} record bytes at offset {fetch_offset} hold no whole batch: the batch "
                f"is "
                f"larger than the fetch size (max.partition.fetch.bytes "
                f"{self.settings.max_partition_fetch_bytes}, fetch.max.bytes {self.settings.fetch_max_bytes})"
            )
        return run

    def _raise_partition_error(self, key: TopicPartitionKey, code: int, what: str) -> None:
        name = f"partition {key[0]}-{key[1]}"
        if code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
            raise UnknownTopicOrPartitionError(f"{name}: the broker does not know it ({what})")
        if code == ErrorCode.OFFSET_OUT_OF_RANGE:
            raise OffsetOutOfRangeError(f"{name}: offset out of range ({what})")
        raise ApplianceError(f"{name}: {what} failed with {error_name(code)}")

    def discard_in_flight(self) -> None:
        """Forget fetches in flight (their answers are read and dropped when they arrive)."""
        for broker in self._brokers.values():
            if broker.in_flight is not None:
                broker.in_flight.offsets = {}

    def close(self) -> None:
        for broker in self._brokers.values():
            if broker.connection is not None:
                broker.connection.close()
        if self._bootstrap_connection is not None:
            self._bootstrap_connection.close()
        self._brokers.clear()
