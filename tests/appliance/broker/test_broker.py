"""The broker process over real sockets: versions, metadata, offsets, fetches bounded by the high watermark,
long polls, per-partition errors, malformed frames, back-pressure, the Unix socket.

These tests own the partition log and its state page themselves -- they play the partition writer and the
replica-state owner -- so they can hold the high watermark below the log end offset, which a real writer
with replication factor 1 never does.  The broker runs in a forked process, as under ``appliance serve``,
against :class:`StaticCluster`, a metadata owner with a fixed topic list standing in for the supervisor.
The same broker against the real supervisor is exercised in ``test_kafka_clients.py``.
"""

from __future__ import annotations

import contextlib
import os
import random
import socket
import stat
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support.wire import WireClient, answers, offsets_in, produce, start_broker

from appliance.broker.partitions import TopicMeta
from appliance.config.server_config import Config, config_from_mapping
from ipc.kafka import (
    ApiKey,
    ApiVersionsRequest,
    DescribeGroupsRequest,
    ErrorCode,
    FetchPartition,
    FetchRequest,
    FetchTopic,
    FindCoordinatorRequest,
    HeartbeatRequest,
    JoinGroupRequest,
    JoinGroupRequestProtocol,
    ListGroupsRequest,
    ListOffsetsPartition,
    ListOffsetsRequest,
    ListOffsetsTopic,
    MetadataRequest,
    MetadataRequestTopic,
    OffsetCommitRequest,
    OffsetCommitRequestPartition,
    OffsetCommitRequestTopic,
    OffsetFetchRequest,
    OffsetFetchRequestTopic,
    RequestHeader,
    decode_request,
    encode_request,
    supported_api_versions,
)
from ipc.kafka.samples import mutate, sample_requests
from ipc.shm import ShmNames, unlink_shared_memory
from ipc.state_page import StatePage
from storage.batch_builder import build_batch
from storage.errors import ProtocolError
from storage.log import Log

# -- a client speaking the wire protocol, one request at a time ------------------------------------------




# -- the broker under test, with the test as writer ------------------------------------------------------






@dataclass
class Standalone:
    config: Config
    tcp: tuple[str, int]
    unix: str
    logs: dict[int, Log]
    pages: dict[int, StatePage]
    process: Any
    log_path: str
    clients: list[WireClient]

    def log_text(self) -> str:
        """What the broker logged (warnings and errors)."""
        with open(self.log_path) as f:
            return f.read()

    def append(
        self, values: list[bytes], partition: int = 0, timestamp_ms: int | None = None, publish: bool = True
    ) -> int:
        """Append a batch as the writer does, publish LEO (HW too if ``publish``); return its base offset."""
        log = self.logs[partition]
        base = log.log_end_offset
        log.append(bytearray(build_batch(values, timestamp_ms=timestamp_ms)), leader_epoch=0)
        page = self.pages[partition]
        page.log_end_offset = log.log_end_offset
        if publish:
            page.high_watermark = log.log_end_offset
        return base

    def set_high_watermark(self, offset: int, partition: int = 0) -> None:
        self.pages[partition].high_watermark = offset

    def client(self, address: tuple[str, int] | str | None = None, **kwargs: Any) -> WireClient:
        """A connected client, closed when the test ends."""
        client = WireClient(address or self.tcp, **kwargs)
        self.clients.append(client)
        return client


TOPIC = "events"


@pytest.fixture
def standalone(tmp_path: Any, request: pytest.FixtureRequest) -> Iterator[Standalone]:
    """The broker in a forked process; ``indirect`` parameters: ``{"free_descriptors": N}``."""
    options = getattr(request, "param", {})
    log_dir = tmp_path / "data"
    log_dir.mkdir()
    config = config_from_mapping(
        {
            "log.dirs": [str(log_dir)],
            "listeners": "PLAINTEXT://127.0.0.1:0",
            "socket.request.max.bytes": 1 << 20,
        }
    )
    names = ShmNames.for_data_dir(str(log_dir))
    logs, pages = {}, {}
    for partition in (0, 1):
        directory = log_dir / f"{TOPIC}-{partition}"
        logs[partition] = Log.open(
            str(directory), config.log_config(TOPIC), topic_partition=(TOPIC, partition)
        )
        name = names.state_page(TOPIC, partition)
        unlink_shared_memory(name)
        pages[partition] = StatePage.create(name)
        pages[partition].set_leader_epoch(0, 0)
    topics = {
        TOPIC: TopicMeta(TOPIC, 2),
        "nodir": TopicMeta("nodir", 1),  # exists, but no log here yet
        "elsewhere": TopicMeta("elsewhere", 1, replicas={0: (7, 0)}),  # led by node 7
        # the supervisor could not describe it
        "broken": TopicMeta("broken", 0, error=ErrorCode.LEADER_NOT_AVAILABLE, error_message="bad"),
    }
    log_path = str(tmp_path / "broker.log")
    process, addresses = start_broker(config, topics, log_path, options.get("free_descriptors"))
    try:
        running = Standalone(
            config, addresses["PLAINTEXT"], addresses["UNIX"], logs, pages, process, log_path, []
        )
        yield running
    finally:
        for client in running.clients:
            client.close()
        process.terminate()
        process.join(10)
        for log in logs.values():
            log.close()
        for page in pages.values():
            page.close()
            page.unlink()
    assert process.exitcode == 0, f"the broker exited with {process.exitcode}"


def fetch_request(
    offset: int,
    *,
    partition: int = 0,
    topic: str = TOPIC,
    max_wait_ms: int = 0,
    min_bytes: int = 1,
    partition_max_bytes: int = 1 << 20,
    max_bytes: int = 50 << 20,
    **kwargs: Any,
) -> FetchRequest:
    part = FetchPartition(
        partition=partition,
        fetch_offset=offset,
        partition_max_bytes=partition_max_bytes,
        current_leader_epoch=kwargs.pop("current_leader_epoch", -1),
    )
    return FetchRequest(
        max_wait_ms=max_wait_ms,
        min_bytes=min_bytes,
        max_bytes=max_bytes,
        topics=[FetchTopic(topic=topic, partitions=[part])],
        **kwargs,
    )




# -- ApiVersions -----------------------------------------------------------------------------------------


def test_api_versions_at_every_version_and_the_v0_reply_to_an_unknown_one(standalone: Standalone) -> None:
    client = standalone.client()
    for version in range(4):
        response = client.call(ApiKey.API_VERSIONS, version, ApiVersionsRequest("pytest", "1.0"))
        assert response.error_code == ErrorCode.NONE
        assert response.api_keys == supported_api_versions()
    # ApiVersions v4 (as kafka-python's probe sends it): the v0-format error listing what we speak
    frame = bytearray(
        encode_request(
            RequestHeader(ApiKey.API_VERSIONS, 3, 99, "probe"), ApiVersionsRequest("pytest", "1.0")
        )
    )
    struct.pack_into(">h", frame, 6, 4)
    client.sock.sendall(frame)
    correlation_id, response = client.recv(ApiKey.API_VERSIONS, 0)
    assert correlation_id == 99
    assert response.error_code == ErrorCode.UNSUPPORTED_VERSION
    assert response.api_keys == supported_api_versions()
    # the connection stays usable
    assert client.call(ApiKey.API_VERSIONS, 3, ApiVersionsRequest("pytest", "1.0")).error_code == 0


# -- Metadata --------------------------------------------------------------------------------------------


def test_metadata_names_this_broker_topics_partitions_leaders_and_errors(standalone: Standalone) -> None:
    client = standalone.client()
    host, port = standalone.tcp
    for version in range(1, 9):
        response = client.call(ApiKey.METADATA, version, MetadataRequest(topics=None))
        assert [(b.node_id, b.host, b.port) for b in response.brokers] == [(0, host, port)]
        assert response.controller_id == 0
        topics = {t.name: t for t in response.topics}
        assert set(topics) == {TOPIC, "nodir", "elsewhere", "broken"}
        broken = topics["broken"]
        assert (broken.error_code, broken.partitions) == (ErrorCode.LEADER_NOT_AVAILABLE, [])
        events = topics[TOPIC]
        assert events.error_code == 0
        assert [
            (p.partition_index, p.leader_id, p.replica_nodes, p.isr_nodes, p.error_code)
            for p in events.partitions
        ] == [(0, 0, [0], [0], 0), (1, 0, [0], [0], 0)]
        assert topics["elsewhere"].partitions[0].leader_id == 7
        assert topics["nodir"].partitions[0].error_code == ErrorCode.LEADER_NOT_AVAILABLE
    asked = [MetadataRequestTopic(n) for n in ("missing", "../../etc", "a" * 250, TOPIC)]
    response = client.call(ApiKey.METADATA, 8, MetadataRequest(topics=asked, allow_auto_topic_creation=False))
    codes = {t.name: t.error_code for t in response.topics}
    assert codes == {
        "missing": ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        "../../etc": ErrorCode.INVALID_TOPIC_EXCEPTION,
        "a" * 250: ErrorCode.INVALID_TOPIC_EXCEPTION,
        TOPIC: ErrorCode.NONE,
    }
    # auto-creation is asked of the metadata owner, and its refusal is reported
    response = client.call(ApiKey.METADATA, 8, MetadataRequest(topics=[MetadataRequestTopic("fresh")]))
    assert response.topics[0].error_code == ErrorCode.POLICY_VIOLATION
    assert client.call(ApiKey.METADATA, 8, MetadataRequest(topics=[])).topics == []
    assert "metadata: topic broken: LEADER_NOT_AVAILABLE: bad" in standalone.log_text()
    # a name in the internal namespace is not auto-created (not even asked of the metadata owner)
    response = client.call(ApiKey.METADATA, 8, MetadataRequest(topics=[MetadataRequestTopic("__offsets")]))
    assert response.topics[0].error_code == ErrorCode.INVALID_TOPIC_EXCEPTION


# -- Fetch -----------------------------------------------------------------------------------------------


def test_fetch_never_returns_records_at_or_above_the_high_watermark(standalone: Standalone) -> None:
    for i in range(3):
        standalone.append([b"v%d-%d" % (i, j) for j in range(10)], publish=False)
    standalone.set_high_watermark(20)  # the third batch is on disk but not committed
    client = standalone.client()
    part = client.call(ApiKey.FETCH, 11, fetch_request(0)).responses[0].partitions[0]
    assert (part.error_code, part.high_watermark, part.last_stable_offset, part.log_start_offset) == (
        0,
        20,
        20,
        0,
    )
    assert offsets_in(part.records) == list(range(20))
    for offset in (20, 25, 30):  # between the high watermark and the log end: empty, no error
        part = client.call(ApiKey.FETCH, 11, fetch_request(offset)).responses[0].partitions[0]
        assert (part.error_code, offsets_in(part.records)) == (0, [])
    part = client.call(ApiKey.FETCH, 11, fetch_request(31)).responses[0].partitions[0]
    assert part.error_code == ErrorCode.OFFSET_OUT_OF_RANGE
    assert (part.high_watermark, part.log_start_offset) == (20, 0)
    standalone.set_high_watermark(30)
    part = client.call(ApiKey.FETCH, 4, fetch_request(25)).responses[0].partitions[0]
    assert offsets_in(part.records) == list(range(20, 30))  # the whole batch holding offset 25


def test_fetch_sizes_follow_kip_74(standalone: Standalone) -> None:
    for _ in range(4):
        standalone.append([b"x" * 100] * 10)
        standalone.append([b"y" * 100] * 10, partition=1)
    client = standalone.client()
    both = FetchRequest(
        max_wait_ms=0,
        min_bytes=1,
        max_bytes=1,
        topics=[
            FetchTopic(
                TOPIC,
                [
                    FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=1),
                    FetchPartition(partition=1, fetch_offset=0, partition_max_bytes=1 << 20),
                ],
            )
        ],
    )
    first, second = client.call(ApiKey.FETCH, 11, both).responses[0].partitions
    assert offsets_in(first.records) == list(range(10))  # one whole batch, however small the limits
    assert offsets_in(second.records) == []  # no room left in max_bytes
    part = (
        client.call(ApiKey.FETCH, 11, fetch_request(0, partition_max_bytes=2000)).responses[0].partitions[0]
    )
    assert offsets_in(part.records) == list(range(10))  # a second batch would pass 2000 bytes


def test_a_produce_whose_ring_attach_is_refused_gets_the_refusal(standalone: Standalone) -> None:
    """This broker's metadata owner refuses every ring (``support.wire.StaticCluster``): the Produce, held
    while the attach was on its way, is answered with the refusal, and the connection stays usable."""
    client = standalone.client()
    request = produce(1, (TOPIC, 0, build_batch([b"a"])), (TOPIC, 1, build_batch([b"b"])))
    response = client.call(ApiKey.PRODUCE, 8, request)
    assert answers(response) == {(TOPIC, 0): (ErrorCode.NOT_LEADER_OR_FOLLOWER, -1),
                                 (TOPIC, 1): (ErrorCode.NOT_LEADER_OR_FOLLOWER, -1)}  # fmt: skip
    assert "no writer in this test" in (response.responses[0].partition_responses[0].error_message or "")
    again = client.call(ApiKey.PRODUCE, 8, produce(1, (TOPIC, 0, build_batch([b"c"]))))
    assert answers(again) == {(TOPIC, 0): (ErrorCode.NOT_LEADER_OR_FOLLOWER, -1)}  # asked again, refused
    assert standalone.logs[0].log_end_offset == 0


def test_fetch_errors_are_per_partition_as_kafka_reports_them(standalone: Standalone) -> None:
    standalone.append([b"a"] * 5)
    client = standalone.client()

    def code(**kwargs: Any) -> int:
        response = client.call(ApiKey.FETCH, 11, fetch_request(kwargs.pop("offset", 0), **kwargs))
        return response.responses[0].partitions[0].error_code

    assert code(topic="missing") == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert code(partition=5) == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert code(topic="nodir") == ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert code(topic="elsewhere") == ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert code(offset=6) == ErrorCode.OFFSET_OUT_OF_RANGE
    assert code(offset=-1) == ErrorCode.OFFSET_OUT_OF_RANGE
    assert code(current_leader_epoch=3) == ErrorCode.UNKNOWN_LEADER_EPOCH
    standalone.pages[0].set_leader_epoch(2, 5)
    assert code(current_leader_epoch=1) == ErrorCode.FENCED_LEADER_EPOCH
    assert code(current_leader_epoch=2) == ErrorCode.NONE
    assert code(offset=5) == ErrorCode.NONE  # at the log end: empty, no error
    response = client.call(ApiKey.FETCH, 11, fetch_request(0, session_id=77, session_epoch=3))
    assert (response.error_code, response.responses) == (ErrorCode.FETCH_SESSION_ID_NOT_FOUND, [])
    response = client.call(ApiKey.FETCH, 11, fetch_request(0, session_id=0, session_epoch=0))
    assert (response.error_code, response.session_id) == (0, 0)  # no session is created: full fetches go on


def test_long_poll_wakes_when_the_high_watermark_moves_and_times_out_otherwise(
    standalone: Standalone,
) -> None:
    standalone.append([b"old"] * 3)
    client = standalone.client()
    started = time.monotonic()
    part = client.call(ApiKey.FETCH, 11, fetch_request(3, max_wait_ms=300)).responses[0].partitions[0]
    assert time.monotonic() - started >= 0.29
    assert (part.error_code, offsets_in(part.records)) == (0, [])

    client.send(ApiKey.FETCH, 11, fetch_request(3, max_wait_ms=20_000))
    time.sleep(0.1)
    standalone.append([b"new"] * 2, publish=False)  # on disk, not committed: still waiting
    time.sleep(0.1)
    published = time.monotonic()
    standalone.set_high_watermark(5)
    _, response = client.recv(ApiKey.FETCH, 11)
    assert time.monotonic() - published < 1.0
    assert offsets_in(response.responses[0].partitions[0].records) == [3, 4]

    # min_bytes: one small batch is not enough, the second one is
    client.send(ApiKey.FETCH, 11, fetch_request(5, max_wait_ms=20_000, min_bytes=150))
    standalone.append([b"z"])
    time.sleep(0.2)
    standalone.append([b"z" * 100])
    _, response = client.recv(ApiKey.FETCH, 11)
    assert offsets_in(response.responses[0].partitions[0].records) == [5, 6]


def test_a_held_fetch_keeps_later_requests_of_its_connection_in_order(standalone: Standalone) -> None:
    client = standalone.client()
    first = client.send(ApiKey.FETCH, 11, fetch_request(0, max_wait_ms=300))
    second = client.send(ApiKey.METADATA, 8, MetadataRequest(topics=[]))
    other = standalone.client()  # meanwhile other connections are served at once
    started = time.monotonic()
    assert other.call(ApiKey.METADATA, 8, MetadataRequest(topics=[])).topics == []
    assert time.monotonic() - started < 0.25
    assert client.recv(ApiKey.FETCH, 11)[0] == first
    assert client.recv(ApiKey.METADATA, 8)[0] == second


# -- ListOffsets -----------------------------------------------------------------------------------------


def test_list_offsets_earliest_latest_and_by_timestamp(standalone: Standalone) -> None:
    for i in range(4):
        standalone.append([b"r"] * 5, timestamp_ms=1_000_000 + i * 1000, publish=False)
    standalone.set_high_watermark(15)
    client = standalone.client()

    def query(timestamp: int, version: int = 5, replica_id: int = -1) -> tuple[int, int, int]:
        request = ListOffsetsRequest(
            replica_id=replica_id,
            topics=[ListOffsetsTopic(TOPIC, [ListOffsetsPartition(partition_index=0, timestamp=timestamp)])],
        )
        part = client.call(ApiKey.LIST_OFFSETS, version, request).topics[0].partitions[0]
        return part.error_code, part.offset, part.timestamp

    for version in range(1, 6):
        assert query(-2, version) == (0, 0, -1)
        assert query(-1, version) == (0, 15, -1)  # the high watermark, not the log end (20)
    assert query(-1, replica_id=1) == (0, 20, -1)  # a follower gets the log end offset
    assert query(1_001_000) == (0, 5, 1_001_000)
    assert query(1_001_500) == (0, 10, 1_002_000)
    assert query(1_003_000) == (0, -1, -1)  # only above the high watermark
    assert query(0) == (0, 0, 1_000_000)
    request = ListOffsetsRequest(
        topics=[ListOffsetsTopic("missing", [ListOffsetsPartition(0, timestamp=-1)])]
    )
    part = client.call(ApiKey.LIST_OFFSETS, 5, request).topics[0].partitions[0]
    assert part.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


# -- bad peers -------------------------------------------------------------------------------------------


def _malformed(frame_body: bytes) -> bool:
    try:
        decode_request(frame_body)
    except ProtocolError:
        return True
    return False


def test_malformed_frames_close_only_their_connection_with_a_log_line(standalone: Standalone) -> None:
    good = standalone.client()
    rng = random.Random(4)
    samples = [s for s in sample_requests(rng) if s.spec.api_key != ApiKey.API_VERSIONS]
    size_limit = standalone.config.socket_request_max_bytes
    bad_frames = [
        struct.pack(">i", -1),  # negative size
        struct.pack(">i", size_limit + 1),  # over socket.request.max.bytes
        struct.pack(">ihhi", 8, 999, 0, 1),  # unknown api key
        struct.pack(">ihhih", 10, ApiKey.FETCH, 99, 1, -1),  # unsupported version of Fetch
        struct.pack(">ihhi", 8, ApiKey.METADATA, 8, 1),  # header cut short (no client id)
    ]
    while len(bad_frames) < 60:
        sample = rng.choice(samples)
        broken = mutate(sample.frame[4:], rng)
        if _malformed(broken):
            bad_frames.append(struct.pack(">i", len(broken)) + broken)
    for frame in bad_frames:
        bad = standalone.client()
        bad.sock.sendall(frame)
        assert bad.is_closed_by_peer(timeout_s=5), frame[:40]
        bad.close()
        assert good.call(ApiKey.API_VERSIONS, 3, ApiVersionsRequest("pytest", "1")).error_code == 0
    assert standalone.process.is_alive()
    logged = standalone.log_text()
    assert "exceeds socket.request.max.bytes" in logged
    assert "bad frame" in logged
    assert "Traceback" not in logged


def test_a_client_that_does_not_read_is_held_back_without_harming_others(standalone: Standalone) -> None:
    standalone.append([b"p" * 1000] * 50)  # ~50 KB per fetch response
    greedy = standalone.client()
    greedy.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    # a 30 KB client id makes each request big, so that kernel buffers fill with few of them
    request = encode_request(RequestHeader(ApiKey.FETCH, 11, 0, "g" * 30_000), fetch_request(0))
    sent = 0
    rest = b""
    greedy.sock.setblocking(False)
    deadline = time.monotonic() + 5
    with contextlib.suppress(BlockingIOError):
        while time.monotonic() < deadline:  # never reads a response
            n = greedy.sock.send(request)
            sent += 1
            if n < len(request):
                rest = request[n:]
                break
    # Without back-pressure the broker would read on forever, queueing responses; with it, the requests
    # that got through fit in its send queue limit plus what the kernel buffers on both sides.
    assert sent * len(request) < 64 << 20, f"the broker kept reading: {sent} requests of {len(request)} bytes"
    polite = standalone.client()
    started = time.monotonic()
    for _ in range(20):
        assert polite.call(ApiKey.API_VERSIONS, 3, ApiVersionsRequest("pytest", "1")).error_code == 0
    assert time.monotonic() - started < 2.0
    greedy.sock.setblocking(True)
    greedy.sock.settimeout(10)
    finisher = threading.Thread(target=greedy.sock.sendall, args=(rest,))
    finisher.start()
    for i in range(sent):  # every request is answered, in order
        correlation_id, response = greedy.recv(ApiKey.FETCH, 11)
        assert correlation_id == 0
        assert offsets_in(response.responses[0].partitions[0].records) == list(range(50)), i
    finisher.join()


def test_many_concurrent_connections(standalone: Standalone) -> None:
    standalone.append([b"c"] * 10)
    errors: list[BaseException] = []

    def work() -> None:
        try:
            client = standalone.client()
            for _ in range(5):
                assert client.call(ApiKey.METADATA, 8, MetadataRequest(topics=None)).topics
                records = client.call(ApiKey.FETCH, 11, fetch_request(0)).responses[0].partitions[0].records
                assert offsets_in(records) == list(range(10))
            client.close()
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(100)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not errors, errors[:3]


def test_unix_listener_is_owner_only_and_speaks_kafka(standalone: Standalone) -> None:
    mode = os.stat(standalone.unix).st_mode
    assert stat.S_ISSOCK(mode)
    assert stat.S_IMODE(mode) == 0o600
    standalone.append([b"u"] * 3)
    client = standalone.client(standalone.unix)
    assert client.call(ApiKey.API_VERSIONS, 3, ApiVersionsRequest("pytest", "1")).error_code == 0
    records = client.call(ApiKey.FETCH, 11, fetch_request(0)).responses[0].partitions[0].records
    assert offsets_in(records) == [0, 1, 2]


def test_sigterm_stops_the_broker_and_removes_its_unix_socket(standalone: Standalone) -> None:
    client = standalone.client()
    client.send(ApiKey.FETCH, 11, fetch_request(0, max_wait_ms=30_000))  # a held request does not delay exit
    time.sleep(0.1)
    started = time.monotonic()
    standalone.process.terminate()
    standalone.process.join(10)
    assert standalone.process.exitcode == 0
    assert time.monotonic() - started < 5
    assert not os.path.exists(standalone.unix)
    assert client.is_closed_by_peer(1)


def test_a_partition_named_twice_in_one_fetch_is_answered_once(standalone: Standalone) -> None:
    standalone.append([b"d"] * 2)
    twice = FetchRequest(
        max_wait_ms=0,
        min_bytes=1,
        topics=[
            FetchTopic(TOPIC, [FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=1 << 20)] * 2)
        ],
    )
    first, second = standalone.client().call(ApiKey.FETCH, 11, twice).responses[0].partitions
    assert (first.error_code, offsets_in(first.records)) == (0, [0, 1])
    assert (second.error_code, offsets_in(second.records)) == (ErrorCode.INVALID_REQUEST, [])


@pytest.mark.parametrize("standalone", [{"free_descriptors": 60}], indirect=True)
def test_out_of_descriptors_the_broker_pauses_accepting_and_keeps_serving(standalone: Standalone) -> None:
    standalone.append([b"f"] * 3)
    standalone.append([b"g"] * 2, partition=1)
    first = standalone.client()
    first.call(ApiKey.FETCH, 11, fetch_request(0))  # partition 0's files are open before the flood
    clients: list[WireClient] = []
    try:
        for _ in range(100):  # more than the broker may open: the rest wait in the listen backlog
            clients.append(WireClient(standalone.tcp, timeout_s=0.5))
        # The existing connection keeps being answered throughout, with records: connections never take the
        # descriptors kept in reserve, so even partition 1, first read now, attaches its state page and
        # opens its log at the height of the flood.
        answer = first.call(ApiKey.FETCH, 11, fetch_request(0)).responses[0].partitions[0]
        assert (answer.error_code, offsets_in(answer.records)) == (0, [0, 1, 2])
        answer = first.call(ApiKey.FETCH, 11, fetch_request(0, partition=1)).responses[0].partitions[0]
        assert (answer.error_code, offsets_in(answer.records)) == (0, [0, 1])
        for client in clients:
            client.send(ApiKey.API_VERSIONS, 3, ApiVersionsRequest("pytest", "1"))
        time.sleep(0.5)
        for client in clients:  # those accepted have their answer by now; the others wait in the backlog
            client.sock.setblocking(False)
            with contextlib.suppress(BlockingIOError, ConnectionError):
                client.sock.recv(4)
    finally:
        for client in clients:
            client.close()
    late = WireClient(standalone.tcp)  # descriptors are free again: accepted after the pause
    try:
        assert late.call(ApiKey.API_VERSIONS, 3, ApiVersionsRequest("pytest", "1")).error_code == 0
        deadline = time.monotonic() + 5.0  # and the partition serves records again
        while True:
            answer = first.call(ApiKey.FETCH, 11, fetch_request(0)).responses[0].partitions[0]
            if answer.error_code == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert (answer.error_code, offsets_in(answer.records)) == (0, [0, 1, 2])
    finally:
        late.close()
    assert "not accepting for" in standalone.log_text()


def test_group_requests_wait_while_the_offsets_topic_is_not_loaded(standalone: Standalone) -> None:
    """This broker's cluster creates no topics, so ``__consumer_offsets`` is never there: FindCoordinator
    answers COORDINATOR_NOT_AVAILABLE, every other request naming a group COORDINATOR_LOAD_IN_PROGRESS
    (both retriable), and nothing changes."""
    client = standalone.client()
    assert client.call(ApiKey.LIST_GROUPS, 2, ListGroupsRequest()).error_code == ErrorCode.NONE  # no topic
    found = client.call(ApiKey.FIND_COORDINATOR, 2, FindCoordinatorRequest(key="g", key_type=0))
    assert found.error_code == ErrorCode.COORDINATOR_NOT_AVAILABLE
    loading = ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
    join = JoinGroupRequest(group_id="g", session_timeout_ms=10_000, rebalance_timeout_ms=10_000,
                            member_id="", protocol_type="consumer",
                            protocols=[JoinGroupRequestProtocol("range", b"")])
    for version in (0, 5):
        assert client.call(ApiKey.JOIN_GROUP, version, join).error_code == loading
    beat = HeartbeatRequest(group_id="g", generation_id=1, member_id="m")
    assert client.call(ApiKey.HEARTBEAT, 3, beat).error_code == loading
    part = OffsetCommitRequestPartition(partition_index=0, committed_offset=5, committed_metadata=None)
    commit = OffsetCommitRequest(group_id="g", generation_id_or_member_epoch=-1, member_id="",
                                 topics=[OffsetCommitRequestTopic(TOPIC, [part])])
    for version in (2, 7):
        answer = client.call(ApiKey.OFFSET_COMMIT, version, commit)
        assert answer.topics[0].partitions[0].error_code == loading
    fetch = OffsetFetchRequest("g", [OffsetFetchRequestTopic(TOPIC, [0])])
    fetched = client.call(ApiKey.OFFSET_FETCH, 1, fetch)  # v1: the error is per partition
    assert fetched.topics[0].partitions[0].error_code == loading
    assert client.call(ApiKey.OFFSET_FETCH, 5, fetch).error_code == loading
    described = client.call(ApiKey.DESCRIBE_GROUPS, 4, DescribeGroupsRequest(["g"])).groups[0]
    assert described.error_code == loading
    assert "cannot create __consumer_offsets yet" in Path(standalone.log_path).read_text()
