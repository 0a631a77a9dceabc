"""Real Kafka clients, unmodified, consuming as a group from ``appliance serve``.

confluent-kafka consumers with a ``group.id`` share a topic's partitions and take over a leaving member's;
a commit is where a new consumer of the group resumes; kafka-python's KafkaConsumer and ``kcat -G`` consume
as groups.  One appliance for the module, ``group.initial.rebalance.delay.ms`` small.
"""

from __future__ import annotations

import contextlib
import random
import signal
import socket
import struct
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
from support.consumer_fixtures import poll_until
from support.kafka_appliance import KCAT, Appliance, served_appliance
from support.wire import WireClient

from ipc.kafka import (
    ApiKey,
    DescribeGroupsRequest,
    ErrorCode,
    JoinGroupRequest,
    JoinGroupRequestProtocol,
    LeaveGroupRequest,
    MemberIdentity,
    OffsetCommitRequest,
    OffsetCommitRequestPartition,
    OffsetCommitRequestTopic,
    OffsetFetchRequest,
    OffsetFetchRequestTopic,
)
from ipc.kafka.samples import mutate, sample_requests

confluent_kafka = pytest.importorskip("confluent_kafka")
with warnings.catch_warnings():  # kafka-python reads its schemas with a deprecated importlib call
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka import KafkaConsumer

PARTITIONS = 4
PER_PARTITION = 5


@pytest.fixture(scope="module")
def appliance(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Appliance]:
    yield from served_appliance(
        tmp_path_factory.mktemp("groups"),
        {"split": PARTITIONS, "resume": 1, "kp": 2, "kcat": 2, "one": PARTITIONS, "bad": PARTITIONS,
         "killed": PARTITIONS, "static": PARTITIONS},
        extra='"group.initial.rebalance.delay.ms" = 100',
    )


def produce(bootstrap: str, topic: str, partitions: int, per_partition: int) -> None:
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap})
    for p in range(partitions):
        for i in range(per_partition):
            producer.produce(topic, key=f"k{i}", value=f"{topic}-{p}-{i}", partition=p)
    assert producer.flush(30) == 0


def consumer(bootstrap: str, group: str, **extra: Any) -> Any:
    return confluent_kafka.Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "session.timeout.ms": 6000,
        "heartbeat.interval.ms": 500,
        **extra,
    })


def assigned(c: Any) -> set[int]:
    return {tp.partition for tp in c.assignment()}


def test_one_member_gets_every_partition(appliance: Appliance) -> None:
    produce(appliance.bootstrap, "one", PARTITIONS, PER_PARTITION)
    c = consumer(appliance.bootstrap, "g-one")
    try:
        c.subscribe(["one"])
        seen: list[Any] = []
        poll_until([c], lambda: len(seen) >= PARTITIONS * PER_PARTITION, seen)
        assert assigned(c) == set(range(PARTITIONS))
        assert sorted(m.value().decode() for m in seen) == sorted(
            f"one-{p}-{i}" for p in range(PARTITIONS) for i in range(PER_PARTITION))
    finally:
        c.close()


@pytest.mark.parametrize("assignor", ["range", "cooperative-sticky"])
def test_two_members_split_the_partitions_and_a_leavers_move(appliance: Appliance, assignor: str) -> None:
    produce(appliance.bootstrap, "split", PARTITIONS, PER_PARTITION)
    group = f"g-split-{assignor}"
    a, b = (consumer(appliance.bootstrap, group, **{"partition.assignment.strategy": assignor})
            for _ in range(2))
    try:
        a.subscribe(["split"])
        b.subscribe(["split"])
        seen: list[Any] = []
        poll_until([a, b], lambda: len(assigned(a)) == 2 and len(assigned(b)) == 2, seen)
        assert assigned(a) | assigned(b) == set(range(PARTITIONS))
        b.close()  # LeaveGroup: a rebalance gives its partitions to a
        poll_until([a], lambda: assigned(a) == set(range(PARTITIONS)), seen)
    finally:
        a.close()


_MEMBER_SCRIPT = """
import sys, confluent_kafka
c = confluent_kafka.Consumer({"bootstrap.servers": sys.argv[1], "group.id": sys.argv[2],
                              "session.timeout.ms": 6000, "heartbeat.interval.ms": 500})
c.subscribe([sys.argv[3]], on_assign=lambda c, parts: print("assigned", len(parts), flush=True))
while True:
    c.poll(0.2)
"""


def test_a_killed_members_partitions_move_after_its_session_timeout(appliance: Appliance) -> None:
    produce(appliance.bootstrap, "killed", PARTITIONS, 1)
    survivor = consumer(appliance.bootstrap, "g-killed")
    command = [sys.executable, "-c", _MEMBER_SCRIPT, appliance.bootstrap, "g-killed", "killed"]
    victim = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        assert victim.stdout is not None
        assert victim.stdout.readline().startswith("assigned")  # it is a member before the survivor joins
        survivor.subscribe(["killed"])
        seen: list[Any] = []
        poll_until([survivor], lambda: len(assigned(survivor)) == PARTITIONS // 2, seen)
        victim.send_signal(signal.SIGKILL)  # no LeaveGroup: only its session timeout tells the coordinator
        victim.wait()
        poll_until([survivor], lambda: assigned(survivor) == set(range(PARTITIONS)), seen)
    finally:
        if victim.poll() is None:
            victim.kill()
            victim.wait()
        if victim.stdout is not None:
            victim.stdout.close()
        survivor.close()


def test_a_new_consumer_resumes_at_the_committed_offset(appliance: Appliance) -> None:
    produce(appliance.bootstrap, "resume", 1, 10)
    first = consumer(appliance.bootstrap, "g-resume")
    first.subscribe(["resume"])
    seen: list[Any] = []
    try:
        poll_until([first], lambda: len(seen) >= 4, seen)
        first.commit(message=seen[3], asynchronous=False)  # offsets 0..3 processed: resume at 4
    finally:
        first.close()
    second = consumer(appliance.bootstrap, "g-resume")
    second.subscribe(["resume"])
    later: list[Any] = []
    try:
        poll_until([second], lambda: len(later) >= 1, later)
        assert later[0].offset() == 4
        tp = second.committed([confluent_kafka.TopicPartition("resume", 0)], timeout=10)[0]
        assert tp.offset == 4
    finally:
        second.close()


def test_kafka_python_consumes_as_a_group(appliance: Appliance) -> None:
    produce(appliance.bootstrap, "kp", 2, 3)
    c = KafkaConsumer("kp", bootstrap_servers=appliance.bootstrap, group_id="g-kp",
                      auto_offset_reset="earliest", enable_auto_commit=False, consumer_timeout_ms=20000)
    try:
        values = []
        for record in c:
            values.append(record.value.decode())
            if len(values) == 6:
                break
        assert sorted(values) == sorted(f"kp-{p}-{i}" for p in range(2) for i in range(3))
        c.commit()
        assert {tp.partition for tp in c.assignment()} == {0, 1}
    finally:
        c.close()


@pytest.mark.skipif(KCAT is None, reason="kcat is not installed (make install provisions it)")
def test_kcat_consumes_as_a_group(appliance: Appliance) -> None:
    assert KCAT is not None
    produce(appliance.bootstrap, "kcat", 2, 3)
    result = subprocess.run(
        [KCAT, "-b", appliance.bootstrap, "-G", "g-kcat", "-o", "beginning", "-c", "6", "-q", "-f", "%s\n",
         "-X", "topic.auto.offset.reset=earliest", "kcat"],
        capture_output=True, timeout=60,
    )
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    expected = sorted(f"kcat-{p}-{i}" for p in range(2) for i in range(3))
    assert sorted(result.stdout.decode().split()) == expected


GROUP_KEYS = {ApiKey.FIND_COORDINATOR, ApiKey.JOIN_GROUP, ApiKey.SYNC_GROUP, ApiKey.HEARTBEAT,
              ApiKey.LEAVE_GROUP, ApiKey.OFFSET_COMMIT, ApiKey.OFFSET_FETCH, ApiKey.LIST_GROUPS,
              ApiKey.DESCRIBE_GROUPS}


def wire_client(appliance: Appliance) -> WireClient:
    host, port = appliance.bootstrap.rsplit(":", 1)
    return WireClient((host, int(port)), client_id="bad")


def test_bad_group_requests_get_kafkas_errors_and_change_nothing(appliance: Appliance) -> None:
    produce(appliance.bootstrap, "bad", PARTITIONS, PER_PARTITION)
    member = consumer(appliance.bootstrap, "g-bad")
    member.subscribe(["bad"])
    seen: list[Any] = []
    try:
        poll_until([member], lambda: len(seen) >= PARTITIONS * PER_PARTITION, seen)
        member.commit(asynchronous=False)
        client = wire_client(appliance)
        try:
            join = JoinGroupRequest(group_id="g-bad", session_timeout_ms=1, rebalance_timeout_ms=1000,
                                    member_id="", protocol_type="consumer",
                                    protocols=[JoinGroupRequestProtocol("range", b"\xff garbage")])
            assert client.call(ApiKey.JOIN_GROUP, 5, join).error_code == ErrorCode.INVALID_SESSION_TIMEOUT
            join.group_id = ""
            join.session_timeout_ms = 10_000
            assert client.call(ApiKey.JOIN_GROUP, 5, join).error_code == ErrorCode.INVALID_GROUP_ID
            part = OffsetCommitRequestPartition(partition_index=0, committed_offset=0,
                                                committed_metadata=None)
            stale = OffsetCommitRequest(group_id="g-bad", generation_id_or_member_epoch=1,
                                        member_id="intruder",
                                        topics=[OffsetCommitRequestTopic("bad", [part])])
            answer = client.call(ApiKey.OFFSET_COMMIT, 7, stale)
            assert answer.topics[0].partitions[0].error_code == ErrorCode.UNKNOWN_MEMBER_ID
            fetch = OffsetFetchRequest("g-bad", [OffsetFetchRequestTopic("bad", [0])])
            committed = client.call(ApiKey.OFFSET_FETCH, 5, fetch).topics[0].partitions[0].committed_offset
            assert committed == PER_PARTITION  # the member's commit, not the intruder's 0
            group = client.call(ApiKey.DESCRIBE_GROUPS, 4, DescribeGroupsRequest(["g-bad"])).groups[0]
            assert group.group_state == "Stable" and len(group.members) == 1
        finally:
            client.close()
        # malformed group requests, each on its own connection: closed or answered, never harmful
        rng = random.Random(19)
        samples = [s for s in sample_requests(rng) if s.spec.api_key in GROUP_KEYS]
        host, port = appliance.bootstrap.rsplit(":", 1)
        for _ in range(300):
            body = mutate(rng.choice(samples).frame[4:], rng)
            with socket.create_connection((host, int(port)), timeout=2) as sock:
                sock.sendall(struct.pack(">i", len(body)) + body)
                sock.settimeout(0.2)
                with contextlib.suppress(OSError):
                    sock.recv(65536)
        member.poll(1.0)
        assert assigned(member) == set(range(PARTITIONS))
        client = wire_client(appliance)
        try:
            group = client.call(ApiKey.DESCRIBE_GROUPS, 4, DescribeGroupsRequest(["g-bad"])).groups[0]
            assert group.group_state == "Stable" and len(group.members) == 1
        finally:
            client.close()
        assert appliance.process.poll() is None
        assert "Traceback" not in appliance.log_text()
    finally:
        member.close()


def _loaded_call(client: WireClient, api_key: ApiKey, version: int, body: Any) -> Any:
    """``body``'s answer once the coordinator has its group loaded (retriable errors are retried)."""
    retriable = {ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, ErrorCode.COORDINATOR_NOT_AVAILABLE}
    deadline = time.monotonic() + 30
    while True:
        answer = client.call(api_key, version, body)
        codes = {answer.error_code} if hasattr(answer, "error_code") else {
            p.error_code for t in answer.topics for p in t.partitions}
        if not codes & retriable or time.monotonic() > deadline:
            return answer
        time.sleep(0.1)


def test_commits_to_partitions_that_do_not_exist_are_refused_as_kafka_refuses_them(
        appliance: Appliance) -> None:
    client = wire_client(appliance)
    try:
        def part(index: int) -> OffsetCommitRequestPartition:
            return OffsetCommitRequestPartition(partition_index=index, committed_offset=3,
                                                committed_metadata=None)
        commit = OffsetCommitRequest(group_id="g-nowhere", generation_id_or_member_epoch=-1, member_id="",
                                     topics=[OffsetCommitRequestTopic("one", [part(0), part(PARTITIONS)]),
                                             OffsetCommitRequestTopic("no-such-topic", [part(0)])])
        answer = _loaded_call(client, ApiKey.OFFSET_COMMIT, 7, commit)
        codes = [[p.error_code for p in t.partitions] for t in answer.topics]
        assert codes == [[ErrorCode.NONE, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION],
                         [ErrorCode.UNKNOWN_TOPIC_OR_PARTITION]]
        fetch = OffsetFetchRequest("g-nowhere", None)  # every committed partition of the group
        stored = client.call(ApiKey.OFFSET_FETCH, 5, fetch).topics
        assert [(t.name, [(p.partition_index, p.committed_offset) for p in t.partitions])
                for t in stored] == [("one", [(0, 3)])]
    finally:
        client.close()


def test_leave_group_v3_answers_each_member_and_no_top_level_error(appliance: Appliance) -> None:
    client = wire_client(appliance)
    try:
        join = JoinGroupRequest(group_id="g-no-members", session_timeout_ms=10_000,
                                rebalance_timeout_ms=10_000, member_id="", protocol_type="consumer",
                                protocols=[JoinGroupRequestProtocol("range", b"")])
        required = _loaded_call(client, ApiKey.JOIN_GROUP, 4, join)  # the group exists, a member id pending
        assert required.error_code == ErrorCode.MEMBER_ID_REQUIRED
        nobody = [MemberIdentity("nobody", None)]
        for group in ("g-no-members", "g-never-seen"):
            leave = LeaveGroupRequest(group_id=group, member_id="", members=nobody)
            answer = _loaded_call(client, ApiKey.LEAVE_GROUP, 3, leave)
            assert answer.error_code == ErrorCode.NONE  # Kafka's v3+: the group's error only
            assert [(m.member_id, m.error_code) for m in answer.members] == [
                ("nobody", ErrorCode.UNKNOWN_MEMBER_ID)]
            old = LeaveGroupRequest(group_id=group, member_id="nobody", members=[])
            assert client.call(ApiKey.LEAVE_GROUP, 2, old).error_code == ErrorCode.UNKNOWN_MEMBER_ID
    finally:
        client.close()


def test_a_static_member_restarted_in_its_session_gets_its_partitions_back_without_a_rebalance(
        appliance: Appliance) -> None:
    """``group.instance.id``: a member closed (a static member sends no LeaveGroup) and started again
    inside ``session.timeout.ms`` gets the same partitions, and the other member sees no revoke or
    assign (its callbacks) and keeps its own."""
    group = "g-static"
    events: list[tuple[str, set[int]]] = []

    def static(instance: str) -> Any:
        return consumer(appliance.bootstrap, group, **{"group.instance.id": instance,
                                                       "session.timeout.ms": 30000})

    a, b = static("a"), static("b")
    restarted = None
    try:
        a.subscribe(["static"])
        b.subscribe(["static"], on_assign=lambda c, ps: events.append(("assign", {p.partition for p in ps})),
                    on_revoke=lambda c, ps: events.append(("revoke", {p.partition for p in ps})))
        poll_until([a, b], lambda: len(assigned(a)) == 2 and len(assigned(b)) == 2, [])
        before_a, before_b, seen_events = assigned(a), assigned(b), list(events)
        a.close()
        restarted = static("a")
        restarted.subscribe(["static"])
        poll_until([restarted, b], lambda: len(assigned(restarted)) == 2, [])
        deadline = time.monotonic() + 2  # heartbeats go on: still no rebalance
        while time.monotonic() < deadline:
            restarted.poll(0.1)
            b.poll(0.1)
        assert assigned(restarted) == before_a and assigned(b) == before_b
        assert events == seen_events, events
    finally:
        for c in (restarted, b):
            if c is not None:
                c.close()
