"""Group answers a client can tell from Kafka's, against ``appliance serve`` (Kafka's ``GroupCoordinator`` and
``GroupMetadataManager`` as the reference): the protocol type ListGroups gives a group no member ever joined;
what OffsetCommit v1's commit timestamp and v2-v4's ``retention_time_ms`` do to an offset's expiry, written
to ``__consumer_offsets`` as Kafka writes it (OffsetCommitValue v1 carries ``expire_timestamp``) so that it
holds after a restart; and the group's state while the record of its new assignment is being appended
(CompletingRebalance, as Kafka's: a SIGSTOPped replica of ``__consumer_offsets`` holds the append).
"""

from __future__ import annotations

import os
import signal
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest
from support.harness import Appliance
from support.kafka_appliance import free_port
from support.wire import WireClient

from appliance.coordinator.offset_records import partition_for
from ipc.kafka import (
    ApiKey,
    DescribeGroupsRequest,
    ErrorCode,
    FindCoordinatorRequest,
    HeartbeatRequest,
    JoinGroupRequest,
    JoinGroupRequestProtocol,
    ListGroupsRequest,
    MetadataRequest,
    MetadataRequestTopic,
    OffsetCommitRequest,
    OffsetCommitRequestPartition,
    OffsetCommitRequestTopic,
    OffsetFetchRequest,
    OffsetFetchRequestTopic,
    SyncGroupRequest,
    SyncGroupRequestAssignment,
)
from storage.batch_reader import iter_records
from storage.log_reader import LogReader

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

TOPIC = "conform"
OFFSETS_PARTITIONS = 3  # offsets.topic.num.partitions' default here
DAY_MS = 86_400_000
RETENTION_MS = 7 * DAY_MS  # offsets.retention.minutes' default (10080)


class Running(NamedTuple):
    app: Appliance
    bootstrap: str


def _started(app: Appliance, port: int) -> str:
    """Start ``app`` (listening on ``port``) and create the topic the tests use; its bootstrap address."""
    app.start()
    bootstrap = f"127.0.0.1:{port}"
    admin = AdminClient({"bootstrap.servers": bootstrap})  # held until the creation's answer
    admin.create_topics([NewTopic(TOPIC, 2, 1)])[TOPIC].result(30)
    return bootstrap


@pytest.fixture
def running() -> Iterator[Running]:
    port = free_port()
    app = Appliance(None, f"listeners=PLAINTEXT://127.0.0.1:{port}", "group.initial.rebalance.delay.ms=0",
                    "offsets.retention.check.interval.ms=200")
    log = ""
    try:
        bootstrap = _started(app, port)
        yield Running(app, bootstrap)
        log = app.log()
    finally:
        app.close()
    assert "Traceback" not in log, log


def wire(bootstrap: str) -> WireClient:
    host, port = bootstrap.rsplit(":", 1)
    return WireClient((host, int(port)), client_id="conform")


def until_loaded(client: WireClient, group: str) -> None:
    """FindCoordinator, then OffsetFetch until the group's partition of ``__consumer_offsets`` is loaded."""
    deadline = time.monotonic() + 30
    fetch = OffsetFetchRequest(group, [OffsetFetchRequestTopic(TOPIC, [0])])
    while time.monotonic() < deadline:
        found = client.call(ApiKey.FIND_COORDINATOR, 2, FindCoordinatorRequest(key=group, key_type=0))
        if found.error_code == ErrorCode.NONE and client.call(ApiKey.OFFSET_FETCH, 5, fetch).error_code == 0:
            return
        time.sleep(0.1)
    raise AssertionError(f"group {group}: coordinator not loaded after 30 s")


def simple_commit(client: WireClient, version: int, group: str, offsets: dict[int, int], *,
                  retention_ms: int = -1, stamps: dict[int, int] | None = None) -> None:  # fmt: skip
    """An OffsetCommit outside a generation (generation -1, no member id), as an admin tool sends it."""
    parts = [OffsetCommitRequestPartition(p, o, commit_timestamp=(stamps or {}).get(p, -1),
                                          committed_metadata="")
             for p, o in offsets.items()]  # fmt: skip
    body = OffsetCommitRequest(group_id=group, generation_id_or_member_epoch=-1, member_id="",
                               retention_time_ms=retention_ms,
                               topics=[OffsetCommitRequestTopic(TOPIC, parts)])
    answer = client.call(ApiKey.OFFSET_COMMIT, version, body)
    assert [p.error_code for p in answer.topics[0].partitions] == [ErrorCode.NONE] * len(offsets), answer


def committed(client: WireClient, group: str) -> dict[int, int]:
    """The group's committed offsets of :data:`TOPIC`, partition -> offset (none: left out)."""
    asked = OffsetFetchRequest(group, [OffsetFetchRequestTopic(TOPIC, [0, 1])])
    answer = client.call(ApiKey.OFFSET_FETCH, 5, asked)
    return {p.partition_index: p.committed_offset for p in answer.topics[0].partitions
            if p.committed_offset >= 0}


def offset_values(data_dir: Path, group: str) -> dict[int, tuple[int, ...]]:
    """The latest OffsetCommitValue of each of ``group``'s partitions of :data:`TOPIC`, decoded here from
    Kafka's schemas: (version, offset, commit_timestamp, expire_timestamp or -1)."""
    latest: dict[int, tuple[int, ...]] = {}
    home = data_dir / f"__consumer_offsets-{partition_for(group, OFFSETS_PARTITIONS)}"
    with LogReader(str(home)) as reader:
        for batch in reader.batches():
            for record in iter_records(batch):
                key, value = record.key, record.value
                assert key is not None
                if struct.unpack_from(">h", key)[0] != 1 or value is None:
                    continue  # group metadata, or a tombstone
                (size,) = struct.unpack_from(">h", key, 2)
                if key[4:4 + size].decode() != group:
                    continue
                (partition,) = struct.unpack_from(">i", key, len(key) - 4)
                version, offset = struct.unpack_from(">hq", value)
                pos = 10 if version == 1 else 14  # v3 has a leader epoch after the offset
                (meta_size,) = struct.unpack_from(">h", value, pos)
                pos += 2 + meta_size
                if version == 1:  # offset, metadata, commit_timestamp, expire_timestamp
                    latest[partition] = (version, offset, *struct.unpack_from(">qq", value, pos))
                else:
                    latest[partition] = (version, offset, struct.unpack_from(">q", value, pos)[0], -1)
    return latest


def test_a_group_that_only_commits_has_no_protocol_type(running: Running) -> None:
    """As Kafka's ListGroups: a group's protocol type is empty until a member joins; librdkafka's
    ``is_simple_consumer_group`` is true for it (a group of ``assign()`` consumers, or an admin tool's)."""
    client = wire(running.bootstrap)
    try:
        until_loaded(client, "commits-only")
        simple_commit(client, 2, "commits-only", {0: 3})
        join = JoinGroupRequest(group_id="has-members", session_timeout_ms=60000, rebalance_timeout_ms=60000,
                                member_id="", protocol_type="consumer",
                                protocols=[JoinGroupRequestProtocol("range", b"sub")])
        joined = client.call(ApiKey.JOIN_GROUP, 3, join)
        sync = SyncGroupRequest(group_id="has-members", generation_id=joined.generation_id,
                                member_id=joined.member_id,
                                assignments=[SyncGroupRequestAssignment(joined.member_id, b"")])
        assert client.call(ApiKey.SYNC_GROUP, 3, sync).error_code == ErrorCode.NONE
        listed = client.call(ApiKey.LIST_GROUPS, 2, ListGroupsRequest())
        types = {g.group_id: g.protocol_type for g in listed.groups}
        assert types == {"commits-only": "", "has-members": "consumer"}
        admin = AdminClient({"bootstrap.servers": running.bootstrap})
        result = admin.list_consumer_groups().result(30)
        simple = {g.group_id: g.is_simple_consumer_group for g in result.valid}
        assert simple == {"commits-only": True, "has-members": False}, result.errors
    finally:
        client.close()


def test_a_commits_own_retention_and_timestamp_expire_it_and_outlive_a_restart(running: Running) -> None:
    """``offsets.retention.minutes`` is its default (7 days); a commit's own retention, or its own old
    commit timestamp, expires it at the next check (every 200 ms here), and the retention asked is in
    ``__consumer_offsets`` (value version 1, ``expire_timestamp``), so it still counts after a restart."""
    app, bootstrap = running
    own_ms = 10_000
    client = wire(bootstrap)
    try:
        until_loaded(client, "own-retention")
        until_loaded(client, "old-stamp")
        before_ms = int(time.time() * 1000)
        started = time.monotonic()
        simple_commit(client, 2, "own-retention", {0: 4}, retention_ms=own_ms)
        simple_commit(client, 2, "own-retention", {1: 6})  # -1: offsets.retention.minutes
        simple_commit(client, 1, "old-stamp", {0: 7, 1: 8}, stamps={0: before_ms - RETENTION_MS - DAY_MS})
        deadline = time.monotonic() + 10
        while committed(client, "old-stamp") != {1: 8}:  # committed 8 days ago, by its own timestamp
            assert time.monotonic() < deadline, committed(client, "old-stamp")
            time.sleep(0.1)
    finally:
        client.close()
    values = offset_values(app.data, "own-retention")
    assert values[1][0] == 3 and values[1][3] == -1
    version, offset, stamp, expire = values[0]
    assert (version, offset, expire - stamp) == (1, 4, own_ms) and before_ms <= stamp <= time.time() * 1000
    assert app.stop() == 0
    app.start()
    client = wire(bootstrap)
    try:
        until_loaded(client, "own-retention")
        assert time.monotonic() - started < own_ms / 1000 - 1, "the machine is too slow for this test"
        assert committed(client, "own-retention") == {0: 4, 1: 6}, "loaded with its expire timestamp"
        deadline = time.monotonic() + own_ms / 1000 + 10
        while committed(client, "own-retention") != {1: 6}:
            assert time.monotonic() < deadline, committed(client, "own-retention")
            time.sleep(0.2)
        assert time.monotonic() - started >= own_ms / 1000 - 0.5, "expired no sooner than asked"
        assert committed(client, "old-stamp") == {1: 8}
    finally:
        client.close()
    assert "committed offsets expired" in app.log()


def test_a_retention_past_the_longest_time_never_expires_the_commit(running: Running) -> None:
    """``retention_time_ms`` Long.MAX_VALUE ("forever"): the broker's time plus it does not fit the record's
    int64 ``expire_timestamp``; it is answered NONE and kept until that latest time (the connection open,
    no traceback in the broker's log: the fixture checks)."""
    app, bootstrap = running
    client = wire(bootstrap)
    try:
        until_loaded(client, "forever")
        simple_commit(client, 2, "forever", {0: 9}, retention_ms=2**63 - 1)
        time.sleep(0.5)  # past two retention checks
        assert committed(client, "forever") == {0: 9}
    finally:
        client.close()
    assert offset_values(app.data, "forever")[0][::3] == (1, 2**63 - 1)


def replica_pid(app: Appliance) -> int:
    """The pid of the supervisor's child titled "appliance: replica 1"."""
    for pid in app.children():
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if f.read().rstrip(b"\0") == b"appliance: replica 1":
                return pid
    raise AssertionError("no replica child")


def test_a_group_is_completing_its_rebalance_until_the_assignment_is_stored() -> None:
    """Kafka answers the leader's SyncGroup after the group's record is appended, and the group is
    CompletingRebalance until then: DescribeGroups says so (no assignment shown), an OffsetCommit of the
    new generation is REBALANCE_IN_PROGRESS, a heartbeat NONE.  The append waits for the ISR of
    ``__consumer_offsets`` (acks=all): its replica is SIGSTOPped until it leaves the ISR."""
    port = free_port()
    lag_ms = 2000
    app = Appliance(None, f"listeners=PLAINTEXT://127.0.0.1:{port}", "group.initial.rebalance.delay.ms=0",
                    f"replica.lag.time.max.ms={lag_ms}", "replica.fetch.backoff.ms=50")
    app.overrides.append(f"appliance.replica.dirs={app.cwd / 'replica'}")
    group = "completing"
    home = partition_for(group, OFFSETS_PARTITIONS)
    stopped = 0
    log = ""
    try:
        bootstrap = _started(app, port)
        member, other = wire(bootstrap), wire(bootstrap)
        until_loaded(member, group)
        deadline = time.monotonic() + 30
        while True:  # the replica follows the group's partition: the append waits for it
            asked = MetadataRequest(topics=[MetadataRequestTopic("__consumer_offsets")])
            (topic,) = member.call(ApiKey.METADATA, 1, asked).topics
            if sorted(topic.partitions[home].isr_nodes) == [0, 1]:
                break
            assert time.monotonic() < deadline, topic
            time.sleep(0.1)
        join = JoinGroupRequest(group_id=group, session_timeout_ms=60000, rebalance_timeout_ms=60000,
                                member_id="", protocol_type="consumer",
                                protocols=[JoinGroupRequestProtocol("range", b"sub")])
        joined = member.call(ApiKey.JOIN_GROUP, 3, join)
        generation, member_id = joined.generation_id, joined.member_id
        stopped = replica_pid(app)
        os.kill(stopped, signal.SIGSTOP)
        sync = SyncGroupRequest(group_id=group, generation_id=generation, member_id=member_id,
                                assignments=[SyncGroupRequestAssignment(member_id, b"mine")])
        member.send(ApiKey.SYNC_GROUP, 3, sync)
        sent = time.monotonic()
        time.sleep(0.3)
        (described,) = other.call(ApiKey.DESCRIBE_GROUPS, 1, DescribeGroupsRequest([group])).groups
        assert described.group_state == "CompletingRebalance", described
        assert [m.member_assignment for m in described.members] == [b""]
        part = OffsetCommitRequestPartition(0, 1, committed_metadata="")
        commit = OffsetCommitRequest(group_id=group, generation_id_or_member_epoch=generation,
                                     member_id=member_id, topics=[OffsetCommitRequestTopic(TOPIC, [part])])
        refused = other.call(ApiKey.OFFSET_COMMIT, 7, commit).topics[0].partitions[0].error_code
        assert refused == ErrorCode.REBALANCE_IN_PROGRESS
        beat = HeartbeatRequest(group_id=group, generation_id=generation, member_id=member_id)
        assert other.call(ApiKey.HEARTBEAT, 3, beat).error_code == ErrorCode.NONE
        _, synced = member.recv(ApiKey.SYNC_GROUP, 3)  # once the replica left the ISR
        assert time.monotonic() - sent >= 0.5, "answered before the append was acknowledged"
        assert (synced.error_code, synced.assignment) == (ErrorCode.NONE, b"mine")
        (described,) = other.call(ApiKey.DESCRIBE_GROUPS, 1, DescribeGroupsRequest([group])).groups
        assigned = [m.member_assignment for m in described.members]
        assert (described.group_state, assigned) == ("Stable", [b"mine"])
        member.close()
        other.close()
        log = app.log()
    finally:
        if stopped:
            os.kill(stopped, signal.SIGCONT)
        app.close()
    assert "Traceback" not in log, log
