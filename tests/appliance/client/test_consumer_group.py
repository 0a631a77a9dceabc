"""``appliance.Consumer`` with ``group.id`` against ``appliance serve``: subscribe, rebalances, commits.

Each member runs on its own thread (a member blocks in its JoinGroup until the rebalance ends, as in Kafka),
or in its own process where it is SIGKILLed.  One appliance for the module, with a short initial rebalance
delay and a low minimum session timeout so that a killed member's partitions move within seconds.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from support.campaign import rounds
from support.kafka_appliance import REPO, Appliance, served_appliance

from appliance import Consumer, GroupError, KafkaAdmin, TopicPartition
from ipc.kafka import DescribeGroupsRequest, ErrorCode
from ipc.kafka_client import KafkaConnection
from storage.errors import ConfigError

confluent_kafka = pytest.importorskip("confluent_kafka")

SIX = 6
TOPICS = {"one": SIX, "split-range": SIX, "split-cooperative-sticky": SIX, "resume": 1, "auto": 2,
          "mixed-range": SIX, "mixed-cooperative-sticky": SIX, "killed": SIX, "bad": 1, "pat-a": 2,
          "pat-b": 1}


@pytest.fixture(scope="module")
def appliance(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Appliance]:
    yield from served_appliance(
        tmp_path_factory.mktemp("consumer-groups"), TOPICS,
        extra='"group.initial.rebalance.delay.ms" = 100\n"group.min.session.timeout.ms" = 1000\n'
              '"group.max.session.timeout.ms" = 60000',
    )


def produce(appliance: Appliance, topic: str, per_partition: int) -> None:
    producer = confluent_kafka.Producer({"bootstrap.servers": appliance.bootstrap})
    for p in range(TOPICS[topic]):
        for i in range(per_partition):
            producer.produce(topic, value=f"{p}-{i}", partition=p)
    assert producer.flush(30) == 0


def group_consumer(appliance: Appliance, group: str, *, local: bool = False, **extra: Any) -> Consumer:
    where = ({"appliance.data.dir": str(appliance.data_dir)} if local
             else {"bootstrap.servers": appliance.bootstrap})
    return Consumer({**where, "group.id": group, "auto.offset.reset": "earliest", "session.timeout.ms": 3000,
                     "heartbeat.interval.ms": 200, "enable.auto.commit": False, **extra})


def wait_for(done: Callable[[], bool], what: str | Callable[[], str], timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() >= deadline:
            said = what if isinstance(what, str) else what()
            raise AssertionError(f"gave up after {timeout_s} s waiting for {said}")
        time.sleep(0.05)


class Member(threading.Thread):
    """A consumer polling on its own thread, recording its callbacks and records; stopped and closed by
    :meth:`stop` (the consumer is used only by this thread)."""

    def __init__(self, consumer: Consumer, topics: Any, *, commit_each: bool = False) -> None:
        super().__init__(daemon=True)
        self.consumer, self.topics, self.commit_each = consumer, topics, commit_each
        self.events: list[tuple[str, set[int]]] = []
        self.records: list[Any] = []
        self.error: BaseException | None = None
        self._stop_event = threading.Event()

    def _callback(self, kind: str) -> Callable[[Any, list[TopicPartition]], None]:
        return lambda consumer, parts: self.events.append((kind, {tp.partition for tp in parts}))

    def run(self) -> None:
        try:
            self.consumer.subscribe(self.topics, on_assign=self._callback("assign"),
                                    on_revoke=self._callback("revoke"), on_lost=self._callback("lost"))
            while not self._stop_event.is_set():
                got = self.consumer.poll(100)
                self.records += got
                if got and self.commit_each:
                    self.consumer.commit()
        except BaseException as exc:
            self.error = exc
        finally:
            self.consumer.close()

    def owned(self) -> set[int]:
        parts: set[int] = set()
        for kind, changed in self.events:
            parts = parts | changed if kind == "assign" else parts - changed
        return parts

    def stop(self) -> None:
        self._stop_event.set()
        self.join(30)
        assert not self.is_alive()
        assert self.error is None, repr(self.error)


def test_one_member_gets_every_partition_through_the_local_path(appliance: Appliance) -> None:
    produce(appliance, "one", 3)
    member = Member(group_consumer(appliance, "g-one", local=True), ["one"])
    member.start()
    try:
        wait_for(lambda: len(member.records) == SIX * 3, "every record")
    finally:
        member.stop()
    assert member.events == [("assign", set(range(SIX))), ("revoke", set(range(SIX)))]  # close() revokes
    assert sorted(r.value.decode() for r in member.records) == sorted(f"{p}-{i}" for p in range(SIX)
                                                                      for i in range(3))


@pytest.mark.parametrize("assignor", ["range", "cooperative-sticky"])
def test_two_members_split_the_partitions_and_one_takes_over_on_close(appliance: Appliance,
                                                                      assignor: str) -> None:
    topic = f"split-{assignor}"
    settings = {"partition.assignment.strategy": assignor}
    a = Member(group_consumer(appliance, f"g-{topic}", **settings), [topic])
    b = Member(group_consumer(appliance, f"g-{topic}", **settings), [topic])
    a.start()
    try:
        wait_for(lambda: a.owned() == set(range(SIX)), "a owning every partition")
        b.start()
        wait_for(lambda: len(a.owned()) == 3 and len(b.owned()) == 3, "a and b with 3 each")
        assert a.owned() | b.owned() == set(range(SIX))
        a_events_before = len(a.events)
        b.stop()
        wait_for(lambda: a.owned() == set(range(SIX)), "a owning every partition again")
        a_history = list(a.events)
    finally:
        if b.is_alive():
            b.stop()
        a.stop()
    revoked_by_a = [parts for kind, parts in a_history if kind == "revoke"]
    if assignor == "range":  # eager: everything is revoked before each rebalance
        assert revoked_by_a[0] == set(range(SIX))
        assert ("revoke", b.owned() | {p for k, ps in b.events if k == "assign" for p in ps}) in b.events
        assert a_history[a_events_before:][-2:] == [("revoke", a_history[a_events_before][1]),
                                                     ("assign", set(range(SIX)))]
    else:  # cooperative: only what moves is revoked, and b's leaving revokes nothing of a's
        moved = {p for k, ps in b.events if k == "assign" for p in ps}
        assert set().union(*revoked_by_a) == moved and len(moved) == 3
        assert all(kind == "assign" for kind, _ in a_history[a_events_before:])
        assert b.events[-1] == ("revoke", moved)


def test_a_new_member_resumes_at_the_committed_offset(appliance: Appliance) -> None:
    produce(appliance, "resume", 10)
    first = group_consumer(appliance, "g-resume")
    try:
        first.subscribe(["resume"])
        got: list[Any] = []
        wait_for(lambda: bool(got.extend(first.poll(100, max_records=4))) or len(got) >= 4, "4 records")
        first.commit({TopicPartition("resume", 0): 4})  # offsets 0..3 processed
        assert first.committed([("resume", 0)]) == {TopicPartition("resume", 0): 4}
    finally:
        first.close()
    second = group_consumer(appliance, "g-resume")
    try:
        second.subscribe(["resume"])
        later: list[Any] = []
        wait_for(lambda: bool(later.extend(second.poll(100))) or len(later) > 0, "a record")
        assert later[0].offset == 4
        assert second.position(("resume", 0)) == 10
        second.commit()  # the positions
        assert second.committed([("resume", 0)]) == {TopicPartition("resume", 0): 10}
        answers: list[tuple[GroupError | None, dict[tuple[str, int], int]]] = []
        second.commit({("resume", 0): 7}, asynchronous=True, callback=lambda e, o: answers.append((e, o)))
        wait_for(lambda: bool(second.poll(50)) or len(answers) == 1, "the asynchronous commit's answer")
        assert answers == [(None, {("resume", 0): 7})]
        assert second.committed([("resume", 0)]) == {TopicPartition("resume", 0): 7}
    finally:
        second.close()


def test_auto_commit_and_close_commit_the_positions(appliance: Appliance) -> None:
    produce(appliance, "auto", 5)
    auto = {"enable.auto.commit": True, "auto.commit.interval.ms": 100}
    consumer = group_consumer(appliance, "g-auto", **auto)
    try:
        consumer.subscribe(["auto"])
        got: list[Any] = []
        wait_for(lambda: bool(got.extend(consumer.poll(100))) or len(got) >= 10, "every record")
        tps = [TopicPartition("auto", p) for p in range(2)]

        def auto_committed() -> bool:
            consumer.poll(50)  # auto commit runs inside poll
            return consumer.committed(tps) == dict.fromkeys(tps, 5)

        wait_for(auto_committed, "the auto commit of both partitions")
    finally:
        consumer.close()
    produce(appliance, "auto", 1)  # offset 5 of each partition
    consumer = group_consumer(appliance, "g-auto", **{**auto, "auto.commit.interval.ms": 60000})
    try:
        consumer.subscribe(["auto"])
        got = []
        wait_for(lambda: bool(got.extend(consumer.poll(100))) or len(got) >= 2, "the 2 new records")
        assert sorted(r.offset for r in got) == [5, 5]
    finally:
        consumer.close()  # commits the positions: the interval has not passed
    check = group_consumer(appliance, "g-auto")
    try:
        assert check.committed([("auto", 0), ("auto", 1)]) == {TopicPartition("auto", 0): 6,
                                                                 TopicPartition("auto", 1): 6}
    finally:
        check.close()


@pytest.mark.parametrize(("assignor", "leader"), [("range", "ours"), ("cooperative-sticky", "theirs")])
def test_a_mixed_group_with_a_confluent_kafka_member(appliance: Appliance, assignor: str, leader: str,
                                                     ) -> None:
    """Our member and a librdkafka one share a group, each assigning as the leader in one of the cases:
    the ConsumerProtocol bytes are the same on both sides."""
    topic = f"mixed-{assignor}"
    group = f"g-{topic}"
    produce(appliance, topic, 2)
    ours = Member(group_consumer(appliance, group, **{"partition.assignment.strategy": assignor}), [topic])
    theirs = confluent_kafka.Consumer({
        "bootstrap.servers": appliance.bootstrap, "group.id": group, "auto.offset.reset": "earliest",
        "enable.auto.commit": False, "session.timeout.ms": 6000, "heartbeat.interval.ms": 200,
        "partition.assignment.strategy": assignor,
    })
    seen: set[tuple[int, int]] = set()

    def theirs_owned() -> set[int]:
        return {tp.partition for tp in theirs.assignment()}

    def poll_theirs_until(done: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + 30
        while not done():
            assert time.monotonic() < deadline, f"{what}: ours {ours.events}, theirs {theirs_owned()}"
            message = theirs.poll(0.1)
            if message is not None and message.error() is None:
                seen.add((message.partition(), message.offset()))

    try:
        if leader == "ours":
            ours.start()
            wait_for(lambda: ours.owned() == set(range(SIX)), "our member owning every partition")
            theirs.subscribe([topic])
        else:
            theirs.subscribe([topic])
            poll_theirs_until(lambda: theirs_owned() == set(range(SIX)), "theirs owning every partition")
            ours.start()
        poll_theirs_until(lambda: len(ours.owned()) == 3 and len(theirs_owned()) == 3, "3 each")
        assert ours.owned() | theirs_owned() == set(range(SIX))
        poll_theirs_until(lambda: len(seen | {(r.partition, r.offset) for r in ours.records}) == SIX * 2,
                          "every record read by one of the two")
        ours.stop()  # its LeaveGroup gives everything to theirs
        poll_theirs_until(lambda: theirs_owned() == set(range(SIX)), "theirs owning every partition again")
    finally:
        if ours.is_alive():
            ours.stop()
        theirs.close()


_VICTIM = """
import sys
from appliance import Consumer
c = Consumer({"bootstrap.servers": sys.argv[1], "group.id": sys.argv[2], "auto.offset.reset": "earliest",
              "session.timeout.ms": 2000, "heartbeat.interval.ms": 200, "enable.auto.commit": False})
c.subscribe([sys.argv[3]], on_assign=lambda c, parts: print("assigned", len(parts), flush=True))
while True:
    for record in c.poll(100, max_records=int(sys.argv[4])):
        print("record", record.partition, record.offset, flush=True)
        c.commit({(record.topic, record.partition): record.offset + 1})
"""


@pytest.mark.campaign
def test_a_killed_members_partitions_move_and_no_record_is_skipped(appliance: Appliance) -> None:
    """At least once, none skipped: each record is committed after it is processed; a member SIGKILLed
    mid-stream loses its partitions to the survivor after session.timeout.ms."""
    per_round = 20
    processed: list[tuple[int, int]] = []
    survivor = Member(group_consumer(appliance, "g-killed"), ["killed"],
                      commit_each=True)

    def processed_at_least_once() -> set[tuple[int, int]]:
        return {(r.partition, r.offset) for r in list(survivor.records)} | set(processed)

    survivor.start()
    try:
        for round_number in range(rounds(1, 5)):
            command = [sys.executable, "-c", _VICTIM, appliance.bootstrap, "g-killed", "killed", "3"]
            victim = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd=REPO)
            try:
                assert victim.stdout is not None
                for line in victim.stdout:  # produce once the victim has partitions of its own
                    if line.startswith("assigned") and line.split()[1] != "0":
                        break
                produce(appliance, "killed", per_round)
                this_round = 0
                for line in victim.stdout:
                    if line.startswith("record"):
                        _, partition, offset = line.split()
                        processed.append((int(partition), int(offset)))
                        this_round += 1
                        if this_round == 7:
                            break
            finally:
                victim.send_signal(signal.SIGKILL)  # no LeaveGroup: its session timeout tells the coordinator
                victim.wait()
                if victim.stdout is not None:
                    victim.stdout.close()
            expected = {(p, o) for p in range(SIX) for o in range((round_number + 1) * per_round)}

            def missing(expected: set[tuple[int, int]] = expected) -> str:
                return (f"every record: missing {sorted(expected - processed_at_least_once())}, survivor "
                        f"events {survivor.events}")

            wait_for(lambda expected=expected: processed_at_least_once() == expected, missing)  # type: ignore[misc]
            wait_for(lambda: survivor.owned() == set(range(SIX)), "the survivor owning every partition")
    finally:
        survivor.stop()
    assert processed_at_least_once() == {(p, o) for p in range(SIX) for o in range(rounds(1, 5) * per_round)}


def test_a_pattern_subscription_reads_every_matching_topic_also_one_created_later(appliance: Appliance,
                                                                                  ) -> None:
    produce(appliance, "pat-a", 1)
    produce(appliance, "pat-b", 1)
    member = Member(group_consumer(appliance, "g-pat", local=True, **{"metadata.max.age.ms": 200}),
                    re.compile(r"pat-.*"))
    member.start()
    try:
        wait_for(lambda: len(member.records) == 3, "a record of each partition")
        with KafkaAdmin(appliance.bootstrap) as admin:
            admin.create_topic("pat-c", 1)
        producer = confluent_kafka.Producer({"bootstrap.servers": appliance.bootstrap})
        producer.produce("pat-c", value=b"later", partition=0)
        assert producer.flush(30) == 0
        wait_for(lambda: len(member.records) == 4, "the record of the topic created later")
    finally:
        member.stop()
    read = sorted((r.topic, r.partition) for r in member.records)
    assert read == [("pat-a", 0), ("pat-a", 1), ("pat-b", 0), ("pat-c", 0)]


def test_bad_group_settings_are_refused_clearly(appliance: Appliance) -> None:
    with pytest.raises(ConfigError, match="unknown assignor 'sticky'"):
        group_consumer(appliance, "g-bad", **{"partition.assignment.strategy": "sticky"})
    with pytest.raises(ConfigError, match=r"heartbeat\.interval\.ms"):
        group_consumer(appliance, "g-bad", **{"heartbeat.interval.ms": 5000})
    consumer = group_consumer(appliance, "g-bad", **{"session.timeout.ms": 120_000})
    try:
        consumer.subscribe(["bad"])
        refusal = r"INVALID_SESSION_TIMEOUT.*session\.timeout\.ms=120000"
        with pytest.raises(GroupError, match=refusal) as caught:
            consumer.poll(100)
        assert caught.value.code == ErrorCode.INVALID_SESSION_TIMEOUT
    finally:
        consumer.close()
    no_group = Consumer({"bootstrap.servers": appliance.bootstrap})
    try:
        with pytest.raises(ConfigError, match=r"need group\.id"):
            no_group.subscribe(["bad"])
    finally:
        no_group.close()


def test_a_member_not_polling_within_max_poll_interval_loses_its_partitions(appliance: Appliance) -> None:
    events: list[tuple[str, set[int]]] = []

    def record(kind: str) -> Callable[[Any, list[TopicPartition]], None]:
        return lambda consumer, parts: events.append((kind, {tp.partition for tp in parts}))

    consumer = group_consumer(appliance, "g-slow", **{"max.poll.interval.ms": 1000})
    try:
        consumer.subscribe(["bad"], on_assign=record("assign"), on_revoke=record("revoke"),
                           on_lost=record("lost"))
        wait_for(lambda: bool(consumer.poll(50)) or events == [("assign", {0})], "the assignment")
        time.sleep(2.5)  # no poll: the heartbeat thread leaves the group
        with pytest.raises(GroupError, match=r"commit refused for bad-0: UNKNOWN_MEMBER_ID.*poll\(\) again"):
            consumer.commit({("bad", 0): 0})  # the partition may be another member's now
        wait_for(lambda: bool(consumer.poll(50)) or len(events) >= 3, "the rejoin")
        assert events[:3] == [("assign", {0}), ("lost", {0}), ("assign", {0})]
    finally:
        consumer.close()


def describe(appliance: Appliance, group: str) -> Any:
    host, port = appliance.bootstrap.rsplit(":", 1)
    with KafkaConnection(host, int(port)) as conn:
        return conn.request(DescribeGroupsRequest(groups=[group])).groups[0]


def test_a_static_member_joins_under_its_instance_id_and_does_not_leave_on_close(appliance: Appliance,
                                                                                 ) -> None:
    static = {"group.instance.id": "worker-1", "session.timeout.ms": 1000, "heartbeat.interval.ms": 100}
    consumer = group_consumer(appliance, "g-static", **static)
    try:
        consumer.subscribe(["bad"])
        wait_for(lambda: bool(consumer.poll(50)) or consumer.assignment() == [("bad", 0)], "the assignment")
        described = describe(appliance, "g-static")
        assert [m.group_instance_id for m in described.members] == ["worker-1"]
        assert described.protocol_data == "cooperative-sticky"
    finally:
        consumer.close()
    assert [m.group_instance_id for m in describe(appliance, "g-static").members] == ["worker-1"]
    wait_for(lambda: describe(appliance, "g-static").members == [], "the session timeout to remove it")
