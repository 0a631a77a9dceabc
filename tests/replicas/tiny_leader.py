"""A tiny but real partition leader for the replication tests: TCP on loopback, the Kafka protocol through
``ipc.kafka``, record bytes sent with ``os.sendfile`` from a real log directory, followers tracked by the
real ``replicas.replica_state``.

It is a test fixture, not a stub of what is under test: the follower (``replicas.fetcher``) talks to it
exactly as it would to the broker, and the leader-side logic it runs is the project's own.  It serves
ApiVersions, SaslHandshake/SaslAuthenticate (PLAIN, when credentials are set), Metadata, Fetch (long poll),
ListOffsets and OffsetsForLeaderEpoch for the partitions it is given.  The tests append to the leader's
``Log`` in their own thread; the server reads the directory with a ``LogReader`` per connection, as the
broker does.

Fault points (set them from the test): ``corrupt_next_fetch`` flips a byte inside the records of the next
non-empty Fetch answer; ``leader_epoch`` can be changed to fence followers.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ipc.kafka import (
    ApiKey,
    ApiVersionsResponse,
    ErrorCode,
    FetchableTopicResponse,
    FetchResponse,
    FileRegion,
    FrameReader,
    ListOffsetsPartitionResponse,
    ListOffsetsResponse,
    ListOffsetsTopicResponse,
    MetadataResponse,
    MetadataResponseBroker,
    MetadataResponsePartition,
    MetadataResponseTopic,
    OffsetForLeaderEpochResponse,
    OffsetForLeaderTopicResult,
    PartitionData,
    SaslAuthenticateResponse,
    SaslHandshakeResponse,
    decode_request,
    encode_response_parts,
    supported_api_versions,
)
from ipc.kafka.appliance_messages import (
    DescribeSegmentsPartition,
    DescribeSegmentsResponse,
    DescribeSegmentsTopicResult,
)
from replicas.acks import PendingAcks
from replicas.leader_connection import LeaderInfo
from replicas.leader_epochs import answer_offset_for_leader_epoch, check_current_leader_epoch
from replicas.replica_state import PartitionReplicaState
from storage.batch_header import RECORDS_OFFSET
from storage.errors import NotLeaderError, OffsetOutOfRangeError
from storage.log import EARLIEST_TIMESTAMP, LATEST_TIMESTAMP
from storage.log_reader import LogReader


def monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


@dataclass
class LeaderPartition:
    topic: str
    partition: int
    directory: str
    state: PartitionReplicaState
    acks: PendingAcks[Any] = field(default_factory=PendingAcks)
    published_high_watermarks: list[int] = field(default_factory=list)  # what a state page would have seen
    # Released acks=all waiters: (token, error, {ISR follower: its log end offset at that moment}).
    completed: list[tuple[Any, ErrorCode, dict[int, int]]] = field(default_factory=list)


class TinyLeader:
    def __init__(
        self,
        *,
        broker_id: int = 0,
        leader_epoch: int = 0,
        clock_ms: Callable[[], int] = monotonic_ms,
        sasl_plain: tuple[str, str] | None = None,
        tick_ms: int = 10,
    ) -> None:
        self.broker_id = broker_id
        self.leader_epoch = leader_epoch
        self.clock_ms = clock_ms
        self.sasl_plain = sasl_plain
        self.tick_ms = tick_ms
        self.partitions: dict[tuple[str, int], LeaderPartition] = {}
        self.corrupt_next_fetch = False
        self.corrupt_position: int | None = None  # where in the records to flip a byte (default: batch 1's)
        self.cut_at_max_bytes = False  # answer exactly partition_max_bytes, a partial batch at the end
        self.fetches_served = 0
        self.lock = threading.RLock()  # replica state is single-owner: the server threads take turns
        self._server = socket.create_server(("127.0.0.1", 0))
        self.host, self.port = self._server.getsockname()[:2]
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._connections: list[socket.socket] = []
        self._tick_readers: dict[tuple[str, int], LogReader] = {}

    # --- setup ---------------------------------------------------------------------------------------------
    def lead(
        self,
        topic: str,
        partition: int,
        directory: str,
        *,
        replicas: list[int],
        isr: list[int] | None = None,
        lag_ms: int = 30_000,
        min_insync_replicas: int = 1,
        epoch_start_offset: int = 0,
    ) -> LeaderPartition:
        with LogReader(directory, topic_partition=(topic, partition)) as reader:
            end = reader.log_end_offset
        state = PartitionReplicaState.become_leader(
            directory,
            topic,
            partition,
            broker_id=self.broker_id,
            replicas=replicas,
            leader_epoch=self.leader_epoch,
            epoch_start_offset=epoch_start_offset,
            leader_log_end_offset=end,
            now_ms=self.clock_ms(),
            isr=isr,
            replica_lag_time_max_ms=lag_ms,
            min_insync_replicas=min_insync_replicas,
        )
        entry = LeaderPartition(topic, partition, directory, state)
        self.partitions[(topic, partition)] = entry
        return entry

    def info(self) -> LeaderInfo:
        return LeaderInfo(self.host, self.port, self.broker_id, self.leader_epoch)

    def start(self) -> TinyLeader:
        for target in (self._accept_loop, self._tick_loop):
            thread = threading.Thread(target=target, daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            self._server.shutdown(socket.SHUT_RDWR)  # wakes the accept(); close() alone would not
        self._server.close()
        for conn in list(self._connections):
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        for thread in self._threads:
            thread.join(timeout=5)
        for reader in self._tick_readers.values():
            reader.close()

    def __enter__(self) -> TinyLeader:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- the broker's periodic work ------------------------------------------------------------------------
    def tick(self) -> None:
        """What the broker does on its timer: follow the LEO, shrink the ISR, expire acks."""
        now = self.clock_ms()
        with self.lock:
            for key, entry in self.partitions.items():
                end = self._reader(self._tick_readers, key).log_end_offset
                self._publish(entry, entry.state.maybe_shrink_isr(end, now).high_watermark)
                self._record(entry, entry.acks.expire(now))

    def _publish(self, entry: LeaderPartition, high_watermark: int) -> None:
        seen = entry.published_high_watermarks
        if not seen or seen[-1] != high_watermark:
            seen.append(high_watermark)
        self._record(
            entry,
            entry.acks.complete(
                high_watermark,
                isr_size=len(entry.state.isr),
                min_insync_replicas=entry.state.min_insync_replicas,
            ),
        )

    def _record(self, entry: LeaderPartition, released: list[tuple[Any, ErrorCode]]) -> None:
        state = entry.state
        positions = {r: state.follower(r).log_end_offset for r in state.isr if r != self.broker_id}
        entry.completed.extend((token, error, positions) for token, error in released)

    def _tick_loop(self) -> None:
        while not self._stop.wait(self.tick_ms / 1000):
            self.tick()

    # --- serving -------------------------------------------------------------------------------------------
    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            conn.setsockopt(
                socket.IPPROTO_TCP, socket.TCP_NODELAY, 1
            )  # header, sendfile, tail: no Nagle stall
            self._connections.append(conn)
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            thread.start()
            self._threads.append(thread)

    def _serve(self, conn: socket.socket) -> None:
        readers: dict[tuple[str, int], LogReader] = {}
        frames = FrameReader()
        authenticated = self.sasl_plain is None
        try:
            while not self._stop.is_set():
                data = conn.recv(1 << 16)
                if not data:
                    return
                frames.feed(data)
                while (frame := frames.next_frame()) is not None:
                    request = decode_request(frame)
                    key = request.header.api_key
                    if not authenticated and key not in (
                        ApiKey.API_VERSIONS,
                        ApiKey.SASL_HANDSHAKE,
                        ApiKey.SASL_AUTHENTICATE,
                    ):
                        return  # Kafka closes an unauthenticated connection that skips SASL
                    body, authenticated = self._answer(request.body, key, readers, authenticated)
                    self._send(conn, encode_response_parts(request.header, body))
        except OSError:
            return
        finally:
            for reader in readers.values():
                reader.close()
            conn.close()

    def _send(self, conn: socket.socket, parts: list[bytes | FileRegion]) -> None:
        for part in parts:
            if isinstance(part, FileRegion):
                position, left = part.position, part.size
                while left:
                    sent = os.sendfile(conn.fileno(), part.fd, position, left)
                    if sent == 0:
                        raise OSError("sendfile: file ended early")
                    position += sent
                    left -= sent
            else:
                conn.sendall(part)

    def _reader(self, readers: dict[tuple[str, int], LogReader], key: tuple[str, int]) -> LogReader:
        if key not in readers:
            entry = self.partitions[key]
            readers[key] = LogReader(entry.directory, topic_partition=key)
        return readers[key]

    def _answer(
        self, body: Any, key: int, readers: dict[tuple[str, int], LogReader], authenticated: bool
    ) -> tuple[Any, bool]:
        if key == ApiKey.API_VERSIONS:
            return ApiVersionsResponse(error_code=0, api_keys=supported_api_versions()), authenticated
        if key == ApiKey.SASL_HANDSHAKE:
            ok = body.mechanism == "PLAIN"
            return SaslHandshakeResponse(
                error_code=0 if ok else ErrorCode.UNSUPPORTED_SASL_MECHANISM, mechanisms=["PLAIN"]
            ), authenticated
        if key == ApiKey.SASL_AUTHENTICATE:
            assert self.sasl_plain is not None
            expected = b"\0" + self.sasl_plain[0].encode() + b"\0" + self.sasl_plain[1].encode()
            if bytes(body.auth_bytes) == expected:
                return SaslAuthenticateResponse(error_code=0, auth_bytes=b""), True
            return SaslAuthenticateResponse(
                error_code=ErrorCode.SASL_AUTHENTICATION_FAILED, error_message="bad secret", auth_bytes=b""
            ), False
        if key == ApiKey.METADATA:
            return self._metadata(body), authenticated
        if key == ApiKey.FETCH:
            return self._fetch(body, readers), authenticated
        if key == ApiKey.LIST_OFFSETS:
            return self._list_offsets(body, readers), authenticated
        if key == ApiKey.OFFSET_FOR_LEADER_EPOCH:
            return self._offsets_for_leader_epoch(body, readers), authenticated
        if key == ApiKey.DESCRIBE_SEGMENTS:  # no segments described: the follower rolls by its own rule
            return DescribeSegmentsResponse(error_code=ErrorCode.NONE, topics=[
                DescribeSegmentsTopicResult(name=t.name, partitions=[
                    DescribeSegmentsPartition(partition_index=p, error_code=ErrorCode.NONE)
                    for p in t.partitions]) for t in body.topics]), authenticated
        raise AssertionError(f"the tiny leader does not serve api key {key}")

    def _metadata(self, body: Any) -> MetadataResponse:
        topics = []
        for (topic, partition), entry in sorted(self.partitions.items()):
            topics.append(
                MetadataResponseTopic(
                    error_code=0,
                    name=topic,
                    partitions=[
                        MetadataResponsePartition(
                            error_code=0,
                            partition_index=partition,
                            leader_id=self.broker_id,
                            leader_epoch=self.leader_epoch,
                            replica_nodes=list(entry.state.replicas),
                            isr_nodes=list(entry.state.isr),
                        )
                    ],
                )
            )
        return MetadataResponse(
            brokers=[MetadataResponseBroker(node_id=self.broker_id, host=self.host, port=self.port)],
            topics=topics,
        )

    def _fetch(self, body: Any, readers: dict[tuple[str, int], LogReader]) -> FetchResponse:
        responses = []
        deadline = self.clock_ms() + body.max_wait_ms
        for topic in body.topics:
            partitions = []
            for fp in topic.partitions:
                partitions.append(self._fetch_partition(body.replica_id, topic.topic, fp, readers, deadline))
            responses.append(FetchableTopicResponse(topic=topic.topic, partitions=partitions))
        self.fetches_served += 1
        return FetchResponse(responses=responses)

    def _fetch_partition(
        self,
        replica_id: int,
        topic: str,
        fp: Any,
        readers: dict[tuple[str, int], LogReader],
        deadline_ms: int,
    ) -> PartitionData:
        def error(code: int) -> PartitionData:
            return PartitionData(
                partition_index=fp.partition, error_code=code, high_watermark=-1, records=None
            )

        key = (topic, fp.partition)
        if key not in self.partitions:
            return error(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
        fenced = check_current_leader_epoch(fp.current_leader_epoch, self.leader_epoch)
        if fenced != ErrorCode.NONE:
            return error(fenced)
        entry = self.partitions[key]
        reader = self._reader(readers, key)
        end = reader.log_end_offset
        if fp.fetch_offset < reader.log_start_offset:
            return error(ErrorCode.OFFSET_OUT_OF_RANGE)
        with self.lock:
            if replica_id < 0:
                return error(ErrorCode.UNKNOWN_SERVER_ERROR)  # the tiny leader serves followers only
            try:
                update = entry.state.follower_fetched(
                    replica_id, fp.fetch_offset, leader_log_end_offset=end, now_ms=self.clock_ms()
                )
            except OffsetOutOfRangeError:
                return error(ErrorCode.OFFSET_OUT_OF_RANGE)
            except NotLeaderError:
                return error(ErrorCode.NOT_LEADER_OR_FOLLOWER)
            self._publish(entry, update.high_watermark)
        while (
            fp.fetch_offset >= reader.log_end_offset
            and self.clock_ms() < deadline_ms
            and not self._stop.is_set()
        ):
            time.sleep(0.001)  # the long poll
        piece = reader.read(fp.fetch_offset, fp.partition_max_bytes)
        records: bytes | FileRegion
        if piece.size_bytes and self.cut_at_max_bytes:
            more = reader.read(fp.fetch_offset, 2 * fp.partition_max_bytes)
            records = more.read_bytes()[: fp.partition_max_bytes]
        elif piece.size_bytes and self.corrupt_next_fetch:
            self.corrupt_next_fetch = False
            damaged = bytearray(piece.read_bytes())
            at = RECORDS_OFFSET + 2 if self.corrupt_position is None else self.corrupt_position
            damaged[at] ^= 0xFF
            records = bytes(damaged)
        else:
            records = FileRegion(piece.fd, piece.position, piece.size_bytes) if piece.size_bytes else b""
        return PartitionData(
            partition_index=fp.partition,
            error_code=0,
            high_watermark=entry.state.high_watermark,
            last_stable_offset=entry.state.high_watermark,
            log_start_offset=reader.log_start_offset,
            records=records,
        )

    def _list_offsets(self, body: Any, readers: dict[tuple[str, int], LogReader]) -> ListOffsetsResponse:
        topics = []
        for topic in body.topics:
            partitions = []
            for p in topic.partitions:
                reader = self._reader(readers, (topic.name, p.partition_index))
                if p.timestamp == EARLIEST_TIMESTAMP:
                    offset = reader.log_start_offset
                elif p.timestamp == LATEST_TIMESTAMP:
                    offset = reader.log_end_offset
                else:
                    raise AssertionError("the tiny leader lists only the earliest and latest offsets")
                partitions.append(
                    ListOffsetsPartitionResponse(
                        partition_index=p.partition_index,
                        error_code=0,
                        timestamp=-1,
                        offset=offset,
                        leader_epoch=self.leader_epoch,
                    )
                )
            topics.append(ListOffsetsTopicResponse(name=topic.name, partitions=partitions))
        return ListOffsetsResponse(topics=topics)

    def _offsets_for_leader_epoch(
        self, body: Any, readers: dict[tuple[str, int], LogReader]
    ) -> OffsetForLeaderEpochResponse:
        topics = []
        for topic in body.topics:
            answers = []
            for p in topic.partitions:
                reader = self._reader(readers, (topic.topic, p.partition))
                answers.append(
                    answer_offset_for_leader_epoch(
                        partition=p.partition,
                        requested_epoch=p.leader_epoch,
                        current_leader_epoch=p.current_leader_epoch,
                        leader_epoch=self.leader_epoch,
                        end_offset_for=reader.end_offset_for_epoch,
                    )
                )
            topics.append(OffsetForLeaderTopicResult(topic=topic.topic, partitions=answers))
        return OffsetForLeaderEpochResponse(topics=topics)
