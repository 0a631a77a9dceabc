"""The broker as the replica-state owner of a replicated partition, over real sockets.

The broker runs in a forked process against a fixed topic list (``test_broker.StaticCluster``); the test
plays the partition writer (it appends to the log and publishes the log end offset in the state page) and
the followers (Fetch with a replica id, through ``replicas.leader_connection``).  What a follower's fetches
do to the ISR, the committed high watermark (told to followers) and the published one (what consumers
read), fencing, OffsetsForLeaderEpoch, the ISR shrinking on the broker's timer, the state page's replica
fields, and SASL/PLAIN with the cluster secret.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support.wire import WireClient, start_broker

from appliance.broker.partitions import TopicMeta
from appliance.config.server_config import config_from_mapping
from ipc.kafka import (
    ApiKey,
    ErrorCode,
    FetchPartition,
    FetchRequest,
    FetchTopic,
    ListOffsetsPartition,
    ListOffsetsRequest,
    ListOffsetsTopic,
    MetadataRequest,
    MetadataRequestTopic,
    OffsetForLeaderEpochRequest,
    OffsetForLeaderPartition,
    OffsetForLeaderTopic,
    SaslAuthenticateRequest,
    SaslHandshakeRequest,
)
from ipc.kafka.appliance_messages import DescribeSegmentsRequest, DescribeSegmentsTopic
from ipc.shm import ShmNames, unlink_shared_memory
from ipc.state_page import ReplicaRow, StatePage
from replicas.leader_connection import LeaderConnection
from replicas.leader_epochs import begin_leader_epoch
from replicas.replica_state import read_replica_state
from storage.batch_builder import build_batch
from storage.errors import ProtocolError
from storage.log import Log

TOPIC = "rep"
LAG_MS = 400
SECRET = "correct horse battery staple"


@dataclass
class Leader:
    log: Log
    page: StatePage
    address: tuple[str, int]
    directory: Path
    log_path: str
    connections: list[LeaderConnection]

    def append(self, count: int, epoch: int = 1) -> None:
        self.log.append(bytearray(build_batch([b"r%d" % i for i in range(count)])), leader_epoch=epoch)
        self.page.log_end_offset = self.log.log_end_offset

    def connect(self, *, sasl: bool = True, password: str = SECRET) -> LeaderConnection:
        """A connection (as a replica: authenticated), closed when the test ends."""
        conn = LeaderConnection.connect(*self.address, timeout_ms=5000,
                                        sasl_plain=("replica-test", password) if sasl else None)
        self.connections.append(conn)
        return conn


@pytest.fixture
def leader(tmp_path: Path) -> Iterator[Leader]:
    data = tmp_path / "data"
    data.mkdir()
    secret = tmp_path / "secret"
    secret.write_text(SECRET + "\n")
    secret.chmod(0o600)
    config = config_from_mapping({
        "log.dirs": [str(data)], "listeners": "PLAINTEXT://127.0.0.1:0", "replica.lag.time.max.ms": LAG_MS,
        "appliance.cluster.secret.file": str(secret),
    })
    directory = data / f"{TOPIC}-0"
    log = Log.open(str(directory), config.log_config(TOPIC), topic_partition=(TOPIC, 0))
    names = ShmNames.for_data_dir(str(data))
    unlink_shared_memory(names.state_page(TOPIC, 0))
    page = StatePage.create(names.state_page(TOPIC, 0))
    start = begin_leader_epoch(log, 1)  # as the supervisor does for a leader of a replicated partition
    page.set_leader_epoch(1, start)
    page.committed_high_watermark = 0
    topics = {TOPIC: TopicMeta(TOPIC, 1, replication_factor=3, replicas={0: (0, 1, 2)},
                               min_insync_replicas=2)}
    log_path = str(tmp_path / "broker.log")
    process, addresses = start_broker(config, topics, log_path)
    try:
        running = Leader(log, page, addresses["PLAINTEXT"], directory, log_path, [])
        yield running
        for conn in running.connections:
            conn.close()
    finally:
        process.terminate()
        process.join(10)
        log.close()
        page.close()
        page.unlink()
    assert process.exitcode == 0


def fetch(conn: LeaderConnection, replica_id: int, offset: int, *, epoch: int = 1,
          max_wait_ms: int = 0) -> Any:
    answer = conn.request(FetchRequest(
        replica_id=replica_id, max_wait_ms=max_wait_ms, min_bytes=1, max_bytes=1 << 20, topics=[FetchTopic(
            TOPIC, [FetchPartition(partition=0, fetch_offset=offset, current_leader_epoch=epoch,
                                   partition_max_bytes=1 << 20)])],
    ), timeout_ms=10_000)
    return answer.responses[0].partitions[0] if answer.error_code == 0 else answer


def consumer_high_watermark(conn: LeaderConnection) -> int:
    answer = conn.request(ListOffsetsRequest(replica_id=-1, isolation_level=0, topics=[
        ListOffsetsTopic(TOPIC, [ListOffsetsPartition(partition_index=0, timestamp=-1)])]))
    return int(answer.topics[0].partitions[0].offset)


def until(what: str, condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Poll ``condition`` until true: the broker's loop runs its timer (the ISR check, every
    ``replica.lag.time.max.ms`` / 8) when it gets the CPU, later on a loaded machine."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s} s"
        time.sleep(0.01)


def replica_rows(leader: Leader) -> dict[int, ReplicaRow]:
    return {row.replica_id: row for row in leader.page.replicas()}


def isr(conn: LeaderConnection) -> list[int]:
    answer = conn.request(MetadataRequest(topics=[MetadataRequestTopic(TOPIC)],
                                          allow_auto_topic_creation=False))
    return list(answer.topics[0].partitions[0].isr_nodes)


def test_follower_fetches_move_the_isr_and_the_committed_then_the_published_high_watermark(
    leader: Leader,
) -> None:
    f1 = leader.connect()
    consumer = leader.connect(sasl=False)
    leader.append(10)
    # the broker's timer sees the log end: with an ISR of one, the high watermark follows it
    until("the high watermark at the log end", lambda: consumer_high_watermark(consumer) == 10)
    assert isr(consumer) == [0]
    assert not leader.page.enough_replicas()  # ISR 1 < min.insync.replicas 2

    part = fetch(f1, 1, 0)  # behind the high watermark: copies, does not join yet
    assert (part.error_code, part.high_watermark, len(part.records) > 0) == (0, 10, True)
    assert isr(consumer) == [0]
    part = fetch(f1, 1, 10)  # caught up: joins
    assert isr(consumer) == [0, 1] and leader.page.isr_size == 2 and leader.page.enough_replicas()

    leader.append(10)  # LEO 20: the HW waits for follower 1
    time.sleep(0.05)
    assert (leader.page.committed_high_watermark, consumer_high_watermark(consumer)) == (10, 10)
    part = fetch(f1, 1, 10)
    assert [part.error_code, part.high_watermark] == [0, 10]  # records 10..19, HW not moved yet
    # it has them: the committed HW moves and is in this answer (a long poll is not waited out for news) ...
    started = time.monotonic()
    part = fetch(f1, 1, 20, max_wait_ms=5000)
    assert part.high_watermark == 20 and time.monotonic() - started < 1
    assert leader.page.committed_high_watermark == 20
    # ... but consumers see it once the follower is known to have read that answer: its next fetch
    assert consumer_high_watermark(consumer) == 10
    fetch(f1, 1, 20)
    last_caught_up = time.monotonic()
    assert consumer_high_watermark(consumer) == 20 == leader.page.high_watermark
    # the replica table is rewritten on the broker's timer, at most every 100 ms
    until("follower 1's fetch in the replica table",
          lambda: 1 in (rows := replica_rows(leader)) and rows[1].log_end_offset == 20)
    rows = replica_rows(leader)
    assert set(rows) == {1, 2} and rows[1].in_isr
    assert not rows[2].in_isr and rows[2].log_end_offset == -1
    persisted = read_replica_state(str(leader.directory))
    assert persisted is not None and persisted.isr == (0, 1) and persisted.leader_id == 0

    # follower 1 stops fetching while records come: it leaves the ISR on the broker's timer after the lag
    leader.append(5)
    while isr(consumer) != [0]:
        assert time.monotonic() - last_caught_up < LAG_MS / 1000 + 2, "the ISR did not shrink"
        time.sleep(0.01)
    assert time.monotonic() - last_caught_up >= LAG_MS / 1000
    assert leader.page.isr_size == 1 and leader.page.committed_high_watermark == 25
    assert consumer_high_watermark(consumer) == 25  # an ISR of one: nobody else needs to be told
    fetch(f1, 1, 25)  # back at the end: rejoins
    assert isr(consumer) == [0, 1]


def test_fencing_unknown_replicas_and_offsets_out_of_range(leader: Leader) -> None:
    leader.append(5)
    f = leader.connect()
    assert fetch(f, 1, 0, epoch=0).error_code == ErrorCode.FENCED_LEADER_EPOCH
    assert fetch(f, 1, 0, epoch=2).error_code == ErrorCode.UNKNOWN_LEADER_EPOCH
    assert fetch(f, 7, 0).error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER  # not an assigned replica
    assert fetch(f, 2, 6).error_code == ErrorCode.OFFSET_OUT_OF_RANGE  # past the log end
    assert fetch(f, 2, 5).error_code == ErrorCode.NONE


def test_offsets_for_leader_epoch_answer_where_each_epoch_ends(leader: Leader) -> None:
    leader.append(5)  # epoch 1: offsets 0..4
    leader.log.leader_epoch_cache.assign(3, leader.log.log_end_offset)
    leader.append(5, epoch=3)  # epoch 3: offsets 5..9
    f = leader.connect()

    def ask(epoch: int, current: int = -1) -> tuple[int, int, int]:
        answer = f.request(OffsetForLeaderEpochRequest(replica_id=1, topics=[OffsetForLeaderTopic(
            TOPIC, [OffsetForLeaderPartition(partition=0, current_leader_epoch=current,
                                             leader_epoch=epoch)])]))
        p = answer.topics[0].partitions[0]
        return p.error_code, p.leader_epoch, p.end_offset

    assert ask(1) == (0, 1, 5)
    assert ask(2) == (0, 1, 5)  # the largest epoch at or below 2 is 1; it ends where 3 begins
    assert ask(3) == (0, 3, 10)  # the latest epoch ends at the log end
    assert ask(0) == (0, 0, 0)  # older than any epoch here: it ends where the first one starts (Kafka)
    assert ask(1, current=0)[0] == ErrorCode.FENCED_LEADER_EPOCH


def test_replica_requests_need_the_cluster_secret(leader: Leader) -> None:
    leader.append(5)
    raw = WireClient(leader.address)
    try:
        # a consumer needs nothing
        body = FetchRequest(replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20, topics=[FetchTopic(
            TOPIC, [FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=1 << 20)])])
        assert raw.call(ApiKey.FETCH, 11, body).responses[0].partitions[0].error_code == 0
        # replica requests without authenticating are refused, and the connection stays usable
        body.replica_id = 1
        assert raw.call(ApiKey.FETCH, 11, body).error_code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
        offsets = ListOffsetsRequest(replica_id=1, isolation_level=0, topics=[
            ListOffsetsTopic(TOPIC, [ListOffsetsPartition(partition_index=0, timestamp=-1)])])
        answer = raw.call(ApiKey.LIST_OFFSETS, 5, offsets)
        assert answer.topics[0].partitions[0].error_code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
        segments = DescribeSegmentsRequest(replica_id=1, checksums=True,
                                           topics=[DescribeSegmentsTopic(TOPIC, [0])])
        refused = raw.call(ApiKey.DESCRIBE_SEGMENTS, 0, segments)
        assert refused.error_code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
        assert "SASL" in refused.error_message
        # SASL v0 (raw tokens) is refused; an unknown mechanism too; PLAIN is offered
        v0 = raw.call(ApiKey.SASL_HANDSHAKE, 0, SaslHandshakeRequest("PLAIN"))
        assert v0.error_code == ErrorCode.ILLEGAL_SASL_STATE
        assert raw.call(ApiKey.SASL_HANDSHAKE, 1, SaslHandshakeRequest("GSSAPI")).mechanisms == ["PLAIN"]
        assert raw.call(ApiKey.SASL_HANDSHAKE, 1, SaslHandshakeRequest("PLAIN")).error_code == 0
        # a wrong secret: refused, and the broker closes the connection
        wrong = raw.call(ApiKey.SASL_AUTHENTICATE, 1, SaslAuthenticateRequest(b"\0replica-1\0guess"))
        assert wrong.error_code == ErrorCode.SASL_AUTHENTICATION_FAILED
        assert raw.is_closed_by_peer()
    finally:
        raw.close()
    with pytest.raises(ProtocolError, match="SASL_AUTHENTICATION_FAILED"):
        leader.connect(password="guess")
    # the right one: replica fetches are served
    with leader.connect() as f:
        assert fetch(f, 1, 0).error_code == ErrorCode.NONE
        described = f.request(segments, version=0)  # the appliance's own API: answered once authenticated
        assert described.error_code == ErrorCode.NONE
        assert described.topics[0].partitions[0].error_code == ErrorCode.NONE
    assert "SASL authentication refused" in Path(leader.log_path).read_text()


def test_a_cluster_secret_file_must_be_readable_and_hold_a_line(tmp_path: Path) -> None:
    from replicas.cluster_auth import parse_plain_token, read_cluster_secret
    from storage.errors import ConfigError

    assert read_cluster_secret(None) is None
    with pytest.raises(ConfigError, match="cannot read it"):
        read_cluster_secret(str(tmp_path / "missing"))
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(ConfigError, match="empty"):
        read_cluster_secret(str(empty))
    good = tmp_path / "good"
    good.write_text("s3cret\n")
    os.chmod(good, 0o600)
    assert read_cluster_secret(str(good)) == "s3cret"
    assert parse_plain_token(b"\0user\0pw") == ("", "user", "pw")
    for bad in (b"", b"user\0pw", b"\0\0pw", b"\0user\0", b"\0u\0p\0x", b"\0\xff\0pw"):
        assert parse_plain_token(bad) is None
