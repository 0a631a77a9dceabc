"""Committed offsets survive the appliance: they are records of the compacted topic ``__consumer_offsets``.

Each test runs ``appliance serve`` as a real process tree: a confluent-kafka consumer commits, the whole
appliance stops (SIGTERM) or is SIGKILLed right after the commit was acknowledged, it starts again on the
same data, and a new consumer of the group resumes at the committed offsets; a group or an offset deleted
before the restart stays deleted.  The records are read back
from the segment files with the storage reader and decoded here against Kafka's schemas (OffsetCommitKey
v1, OffsetCommitValue v3), in the partition Kafka's ``abs(groupId.hashCode()) % partitions`` names.
A client's Produce to the topic is refused; Metadata lists it as internal.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from support.campaign import SOAK
from support.harness import Appliance
from support.kafka_appliance import free_port
from support.wire import WireClient

from ipc.kafka import (
    ApiKey,
    DescribeGroupsRequest,
    ErrorCode,
    FindCoordinatorRequest,
    HeartbeatRequest,
    JoinGroupRequest,
    JoinGroupRequestProtocol,
    LeaveGroupRequest,
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
with warnings.catch_warnings():  # kafka-python reads its schemas with a deprecated importlib call
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka import TopicPartition
    from kafka.admin import KafkaAdminClient
    from kafka.errors import NoError

TOPIC = "resume"
PARTITIONS = 2
PER_PARTITION = 10
OFFSETS_PARTITIONS = 3  # offsets.topic.num.partitions' default here
OFFSETS = "__consumer_offsets"


class Running(NamedTuple):
    app: Appliance
    bootstrap: str


@pytest.fixture
def running() -> Iterator[Running]:
    port = free_port()
    app = Appliance(None, f"listeners=PLAINTEXT://127.0.0.1:{port}", f"num.partitions={PARTITIONS}",
                    "group.initial.rebalance.delay.ms=0")
    log = ""
    try:
        app.start()
        yield Running(app, f"127.0.0.1:{port}")
        log = app.log()
    finally:
        app.close()
    assert "Traceback" not in log, log


def produce(bootstrap: str) -> None:
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap})
    for p in range(PARTITIONS):
        for i in range(PER_PARTITION):
            producer.produce(TOPIC, key=b"k%d" % i, value=b"%d-%d" % (p, i), partition=p)
    assert producer.flush(30) == 0


def consumer(bootstrap: str, group: str) -> Any:
    return confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                                     "auto.offset.reset": "earliest", "enable.auto.commit": False,
                                     "session.timeout.ms": 6000, "heartbeat.interval.ms": 500})


def consume_all_then_commit(bootstrap: str, group: str, commits: dict[int, int]) -> None:
    """A member of ``group`` reads every record, then commits ``commits`` (partition -> offset)."""
    c = consumer(bootstrap, group)
    try:
        c.subscribe([TOPIC])
        seen = 0
        deadline = time.monotonic() + 60
        while seen < PARTITIONS * PER_PARTITION and time.monotonic() < deadline:
            message = c.poll(0.2)
            if message is not None and message.error() is None:
                seen += 1
        assert seen == PARTITIONS * PER_PARTITION
        offsets = [confluent_kafka.TopicPartition(TOPIC, p, o, f"m{p}") for p, o in commits.items()]
        result = c.commit(offsets=offsets, asynchronous=False)
        assert all(tp.error is None for tp in result), result
    finally:
        c.close()


def resumes_at(bootstrap: str, group: str, commits: dict[int, int]) -> None:
    """A new member of ``group`` sees ``commits`` as committed and reads from there on."""
    c = consumer(bootstrap, group)
    try:
        asked = [confluent_kafka.TopicPartition(TOPIC, p) for p in commits]
        committed = c.committed(asked, timeout=60)
        assert {tp.partition: (tp.offset, plain(tp.metadata)) for tp in committed} == {
            p: (o, f"m{p}") for p, o in commits.items()}
        c.subscribe([TOPIC])
        first: dict[int, int] = {}
        deadline = time.monotonic() + 60
        while len(first) < len(commits) and time.monotonic() < deadline:
            message = c.poll(0.2)
            if message is not None and message.error() is None:
                first.setdefault(message.partition(), message.offset())
        assert first == commits
    finally:
        c.close()


def plain(metadata: str | None) -> str | None:
    """A commit's metadata as given: confluent-kafka sends its C string's terminating NUL with it."""
    return None if metadata is None else metadata.rstrip("\x00")


def java_hash_partition(group: str, partitions: int) -> int:
    """Kafka's ``Utils.abs(group.hashCode()) % partitions``, written out for the test."""
    units = group.encode("utf-16-be")  # Java strings are UTF-16 code units
    h = 0
    for (unit,) in struct.iter_unpack(">H", units):
        h = (h * 31 + unit) % (1 << 32)
    signed = h - (1 << 32) if h >= 1 << 31 else h
    return (0 if signed == -(1 << 31) else abs(signed)) % partitions


def _string(data: bytes, pos: int) -> tuple[str, int]:
    (size,) = struct.unpack_from(">h", data, pos)
    return data[pos + 2:pos + 2 + size].decode(), pos + 2 + size


def offset_records(data_dir: Path, partition: int) -> list[tuple[tuple[str, str, int], Any]]:
    """The offset commit records of ``__consumer_offsets-<partition>`` decoded as OffsetCommitKey v1 /
    OffsetCommitValue v3: ((group, topic, partition), (offset, leader epoch, metadata, timestamp)); the
    group metadata records (key version 2) are left out."""
    out = []
    with LogReader(str(data_dir / f"{OFFSETS}-{partition}")) as reader:
        for batch in reader.batches():
            for record in iter_records(batch):
                key = record.key
                assert key is not None
                (key_version,) = struct.unpack_from(">h", key, 0)
                if key_version == 2:
                    continue
                assert key_version == 1
                group, pos = _string(key, 2)
                topic, pos = _string(key, pos)
                (index,) = struct.unpack_from(">i", key, pos)
                assert pos + 4 == len(key)
                value = None
                if record.value is not None:
                    version, offset, epoch = struct.unpack_from(">hqi", record.value, 0)
                    assert version == 3
                    metadata, pos = _string(record.value, 14)
                    (timestamp,) = struct.unpack_from(">q", record.value, pos)
                    assert pos + 8 == len(record.value)
                    value = (offset, epoch, metadata, timestamp)
                out.append(((group, topic, index), value))
    return out


def check_records(data_dir: Path, group: str, commits: dict[int, int], before_ms: int) -> None:
    home = java_hash_partition(group, OFFSETS_PARTITIONS)
    for partition in range(OFFSETS_PARTITIONS):
        records = offset_records(data_dir, partition)
        mine = [(k, v) for k, v in records if k[0] == group]
        if partition != home:
            assert mine == []
            continue
        latest = {k[2]: v for k, v in mine if k[1] == TOPIC}
        found = {p: (v[0], plain(v[2])) for p, v in latest.items()}
        assert found == {p: (o, f"m{p}") for p, o in commits.items()}
        assert all(before_ms <= v[3] <= time.time() * 1000 for v in latest.values())


def simple_commit(bootstrap: str, group: str, commits: dict[int, int]) -> None:
    """A commit outside a generation, as an admin tool makes."""
    c = consumer(bootstrap, group)
    try:
        offsets = [confluent_kafka.TopicPartition(TOPIC, p, o, f"m{p}") for p, o in commits.items()]
        assert all(tp.error is None for tp in c.commit(offsets=offsets, asynchronous=False))
    finally:
        c.close()


def committed_now(bootstrap: str, group: str) -> dict[int, int]:
    c = consumer(bootstrap, group)
    try:
        asked = [confluent_kafka.TopicPartition(TOPIC, p) for p in range(PARTITIONS)]
        return {tp.partition: tp.offset for tp in c.committed(asked, timeout=60) if tp.offset >= 0}
    finally:
        c.close()


def test_commits_and_deletions_survive_a_stop_and_start_of_the_appliance(running: Running) -> None:
    """Commits, a group deleted (DeleteGroups) and an offset deleted (OffsetDelete) are all as they were
    answered after the restart; the deletions are tombstones in the group's partition."""
    app, bootstrap = running
    produce(bootstrap)
    commits = {0: 3, 1: 7}
    before_ms = int(time.time() * 1000)
    consume_all_then_commit(bootstrap, "stopped", commits)
    simple_commit(bootstrap, "deleted", {0: 1, 1: 2})
    simple_commit(bootstrap, "pruned", {0: 4, 1: 5})
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        assert dict(admin.delete_groups(["deleted"])) == {"deleted": "OK"}
        assert list(admin.delete_group_offsets("pruned", [TopicPartition(TOPIC, 0)]).values()) == [NoError]
    finally:
        admin.close()
    assert app.stop() == 0
    check_records(app.data, "stopped", commits, before_ms)
    deleted = offset_records(app.data, java_hash_partition("deleted", OFFSETS_PARTITIONS))
    assert [v for k, v in deleted if k[0] == "deleted"][-2:] == [None, None]
    app.start()
    resumes_at(bootstrap, "stopped", commits)
    assert committed_now(bootstrap, "deleted") == {}
    assert committed_now(bootstrap, "pruned") == {1: 5}
    home = app.data / f"{OFFSETS}-{java_hash_partition('stopped', OFFSETS_PARTITIONS)}"
    dump = subprocess.run(
        [sys.executable, "-m", "appliance.cli", "dump-log", "--print-records",
         *sorted(map(str, home.glob("*.log")))],
        capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert dump.returncode == 0, dump.stderr
    # dump-log decodes the records of __consumer_offsets: the commits and the group's metadata
    commit_key = '{"type": "offset_commit", "group": "stopped", "topic": "resume", "partition": 1}'
    assert f'key: {commit_key} value: {{"offset": 7, "leader_epoch": -1, "metadata": "m1' in dump.stdout
    group_key = '{"type": "group_metadata", "group": "stopped"}'
    assert f'key: {group_key} value: {{"protocol_type": "consumer", "generation": ' in dump.stdout


def wire_client(bootstrap: str, client_id: str) -> WireClient:
    host, port = bootstrap.rsplit(":", 1)
    return WireClient((host, int(port)), client_id=client_id)


def until_loaded(client: WireClient, group: str) -> None:
    """FindCoordinator until the coordinator answers, then OffsetFetch until the group's partition of
    ``__consumer_offsets`` is loaded (COORDINATOR_LOAD_IN_PROGRESS meanwhile)."""
    deadline = time.monotonic() + 30
    fetch = OffsetFetchRequest(group, [OffsetFetchRequestTopic(TOPIC, [0])])
    while time.monotonic() < deadline:
        found = client.call(ApiKey.FIND_COORDINATOR, 2, FindCoordinatorRequest(key=group, key_type=0))
        if found.error_code == ErrorCode.NONE and client.call(ApiKey.OFFSET_FETCH, 5, fetch).error_code == 0:
            return
        time.sleep(0.1)
    raise AssertionError(f"group {group}: coordinator not loaded after 30 s")


def join_and_sync(client: WireClient, group: str) -> tuple[str, int]:
    """A one-member group led by ``client`` (JoinGroup v3, SyncGroup v3): its member id and generation."""
    join = JoinGroupRequest(group_id=group, session_timeout_ms=60000, rebalance_timeout_ms=60000,
                            member_id="", protocol_type="consumer",
                            protocols=[JoinGroupRequestProtocol("range", b"sub")])
    joined = client.call(ApiKey.JOIN_GROUP, 3, join)
    assert joined.error_code == ErrorCode.NONE, joined
    sync = SyncGroupRequest(group_id=group, generation_id=joined.generation_id, member_id=joined.member_id,
                            assignments=[SyncGroupRequestAssignment(joined.member_id, b"all")])
    assert client.call(ApiKey.SYNC_GROUP, 3, sync).error_code == ErrorCode.NONE
    return joined.member_id, joined.generation_id


def member_commit(client: WireClient, group: str, member: tuple[str, int], commits: dict[int, int]) -> None:
    parts = [OffsetCommitRequestPartition(partition_index=p, committed_offset=o, committed_metadata=f"m{p}")
             for p, o in commits.items()]
    body = OffsetCommitRequest(group_id=group, generation_id_or_member_epoch=member[1], member_id=member[0],
                               topics=[OffsetCommitRequestTopic(TOPIC, parts)])
    answer = client.call(ApiKey.OFFSET_COMMIT, 7, body)
    assert [p.error_code for p in answer.topics[0].partitions] == [ErrorCode.NONE] * len(commits)


def groups_over_every_partition(count: int) -> list[str]:
    """``count`` group ids whose ``__consumer_offsets`` partitions cover every partition."""
    names = [f"killed-{i}" for i in range(200)]
    chosen = [next(n for n in names if java_hash_partition(n, OFFSETS_PARTITIONS) == p)
              for p in range(OFFSETS_PARTITIONS)]
    return chosen + [n for n in names if n not in chosen][:count - len(chosen)]


def test_commits_and_generations_acknowledged_survive_a_sigkill_of_every_process(running: Running) -> None:
    """Several groups over every partition of ``__consumer_offsets``, each with a member, a generation and
    acknowledged commits (and one simple commit, as an admin tool makes); the whole appliance is SIGKILLed
    right after the last acknowledgement.  After the restart every commit is there, and every group is
    Stable at its generation with its member, whose heartbeat of that generation is answered NONE (the
    loaded members' sessions start again, as in Kafka)."""
    app, bootstrap = running
    produce(bootstrap)
    groups = groups_over_every_partition(5)
    expected: dict[str, dict[int, int]] = {}
    members: dict[str, tuple[str, int]] = {}
    client = wire_client(bootstrap, "killed")
    try:
        until_loaded(client, groups[0])
        for i, group in enumerate(groups):
            members[group] = join_and_sync(client, group)
            expected[group] = {0: 10 + i, 1: 20 + i}
            member_commit(client, group, members[group], expected[group])
        simple_commit(bootstrap, "killed", {0: 5, 1: 2})
        app.kill_tree()  # right after the acknowledgements
    finally:
        client.close()
    app.start()
    resumes_at(bootstrap, "killed", {0: 5, 1: 2})
    check_records(app.data, "killed", {0: 5, 1: 2}, 0)
    client = wire_client(bootstrap, "after")
    try:
        for group in groups:
            until_loaded(client, group)
            member_id, generation = members[group]
            heartbeat = HeartbeatRequest(group_id=group, generation_id=generation, member_id=member_id)
            assert client.call(ApiKey.HEARTBEAT, 3, heartbeat).error_code == ErrorCode.NONE, group
            (described,) = client.call(ApiKey.DESCRIBE_GROUPS, 4, DescribeGroupsRequest([group])).groups
            assert described.group_state == "Stable"
            assert [m.member_id for m in described.members] == [member_id]
            fetch = OffsetFetchRequest(group, [OffsetFetchRequestTopic(TOPIC, list(range(PARTITIONS)))])
            fetched = client.call(ApiKey.OFFSET_FETCH, 5, fetch).topics[0].partitions
            assert {p.partition_index: p.committed_offset for p in fetched} == expected[group], group
    finally:
        client.close()


def test_clients_may_not_produce_to_the_offsets_topic_and_see_it_internal(running: Running) -> None:
    app, bootstrap = running
    produce(bootstrap)
    consume_all_then_commit(bootstrap, "first", {0: 1, 1: 1})
    before = [offset_records(app.data, p) for p in range(OFFSETS_PARTITIONS)]
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "retries": 0})
    errors: list[Any] = []
    producer.produce(OFFSETS, key=b"forged", value=b"forged", partition=0,
                     on_delivery=lambda err, msg: errors.append(err))
    producer.flush(30)
    assert len(errors) == 1 and errors[0] is not None
    assert errors[0].code() == confluent_kafka.KafkaError.TOPIC_EXCEPTION, errors[0]
    assert [offset_records(app.data, p) for p in range(OFFSETS_PARTITIONS)] == before
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        described = admin.describe_topics([OFFSETS, TOPIC])
    finally:
        admin.close()
    internal = {t.get("topic", t.get("name")): t["is_internal"] for t in described}
    assert internal == {OFFSETS: True, TOPIC: False}
    assert len(next(t for t in described if t.get("topic", t.get("name")) == OFFSETS)["partitions"]) == 3


def test_the_offsets_topic_is_replicated_where_a_replica_exists() -> None:
    """With one replica (``appliance.replica.dirs``), ``offsets.topic.replication.factor`` (3) is capped
    at the two copies that exist, and the replica's copy holds the commit's records."""
    port = free_port()
    app = Appliance(None, f"listeners=PLAINTEXT://127.0.0.1:{port}", f"num.partitions={PARTITIONS}",
                    "group.initial.rebalance.delay.ms=0")
    app.overrides.append(f"appliance.replica.dirs={app.cwd / 'replica'}")
    log = ""
    try:
        app.start()
        bootstrap = f"127.0.0.1:{port}"
        produce(bootstrap)
        consume_all_then_commit(bootstrap, "copied", {0: 4, 1: 6})
        admin = KafkaAdminClient(bootstrap_servers=bootstrap)
        try:
            (described,) = admin.describe_topics([OFFSETS])
        finally:
            admin.close()
        replicas = [p.get("replicas", p.get("replica_nodes")) for p in described["partitions"]]
        assert [len(r) for r in replicas] == [2] * OFFSETS_PARTITIONS, described
        home = java_hash_partition("copied", OFFSETS_PARTITIONS)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            replica = app.cwd / "replica"
            records = offset_records(replica, home) if (replica / f"{OFFSETS}-{home}").is_dir() else []
            copied = {k[2]: v[0] for k, v in records if k[0] == "copied" and v}
            if copied == {0: 4, 1: 6}:
                break
            time.sleep(0.2)
        assert copied == {0: 4, 1: 6}, app.log()
        log = app.log()
    finally:
        app.close()
    assert "Traceback" not in log, log


def test_a_commit_whose_append_is_not_acknowledged_is_refused_and_not_stored() -> None:
    """The writer of the group's ``__consumer_offsets`` partition stalls before acknowledging (test fault
    point ``writer.stall``): the OffsetCommit is answered COORDINATOR_NOT_AVAILABLE after
    ``offsets.commit.timeout.ms`` and OffsetFetch still shows no commit."""
    port = free_port()
    app = Appliance(None, f"listeners=PLAINTEXT://127.0.0.1:{port}", f"topics.{TOPIC}.partitions=1",
                    "offsets.commit.timeout.ms=1000", 'appliance.test.faults=["writer.stall"]')
    log = ""
    try:
        app.start()
        client = WireClient(("127.0.0.1", port), client_id="stalled")
        try:
            deadline = time.monotonic() + 30
            fetch = OffsetFetchRequest("stalled", [OffsetFetchRequestTopic(TOPIC, [0])])
            while True:  # the first group request creates the topic; wait for it to be loaded
                client.call(ApiKey.FIND_COORDINATOR, 2, FindCoordinatorRequest(key="stalled", key_type=0))
                fetched = client.call(ApiKey.OFFSET_FETCH, 5, fetch)
                if fetched.error_code == ErrorCode.NONE or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
            assert fetched.topics[0].partitions[0].committed_offset == -1
            part = OffsetCommitRequestPartition(partition_index=0, committed_offset=5, committed_metadata="m")
            commit = OffsetCommitRequest(group_id="stalled", generation_id_or_member_epoch=-1, member_id="",
                                         topics=[OffsetCommitRequestTopic(TOPIC, [part])])
            answer = client.call(ApiKey.OFFSET_COMMIT, 7, commit)
            assert answer.topics[0].partitions[0].error_code == ErrorCode.COORDINATOR_NOT_AVAILABLE
            fetched = client.call(ApiKey.OFFSET_FETCH, 5, fetch)
            assert fetched.error_code == ErrorCode.NONE
            assert fetched.topics[0].partitions[0].committed_offset == -1
        finally:
            client.close()
        log = app.log()
    finally:
        app.close()
    assert "test fault point writer.stall fired" in log
    assert "answered COORDINATOR_NOT_AVAILABLE, nothing stored" in log


@pytest.mark.campaign
@pytest.mark.skipif(not SOAK, reason="offsets.retention.minutes counts minutes (a 60 s wait): make soak")
def test_offsets_past_their_retention_are_deleted_for_good() -> None:
    """``offsets.retention.minutes=1``: a group that never had members and a group that emptied lose their
    offsets about a minute later (tombstones), the emptied group goes too, and both stay so after a
    restart."""
    port = free_port()
    app = Appliance(None, f"listeners=PLAINTEXT://127.0.0.1:{port}", f"num.partitions={PARTITIONS}",
                    "group.initial.rebalance.delay.ms=0", "offsets.retention.minutes=1",
                    "offsets.retention.check.interval.ms=500")
    bootstrap = f"127.0.0.1:{port}"
    log = ""
    try:
        app.start()
        produce(bootstrap)
        simple_commit(bootstrap, "expiring", {0: 3})
        client = wire_client(bootstrap, "retention")
        try:
            until_loaded(client, "emptied")
            member = join_and_sync(client, "emptied")
            member_commit(client, "emptied", member, {1: 4})
            leave = LeaveGroupRequest(group_id="emptied", member_id=member[0])
            assert client.call(ApiKey.LEAVE_GROUP, 1, leave).error_code == ErrorCode.NONE
        finally:
            client.close()
        assert committed_now(bootstrap, "expiring") == {0: 3}
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and (committed_now(bootstrap, "expiring")
                                               or committed_now(bootstrap, "emptied")):
            time.sleep(1)
        assert committed_now(bootstrap, "expiring") == {} and committed_now(bootstrap, "emptied") == {}
        assert "committed offsets expired (offsets.retention.minutes)" in app.log()
        assert app.stop() == 0
        app.start()
        assert committed_now(bootstrap, "expiring") == {} and committed_now(bootstrap, "emptied") == {}
        admin = KafkaAdminClient(bootstrap_servers=bootstrap)
        try:
            assert "emptied" not in [g[0] for g in admin.list_groups()]
        finally:
            admin.close()
        log = app.log()
    finally:
        app.close()
    assert "Traceback" not in log, log
