"""Real consumer groups, unmodified clients, at-least-once through members joining, closing and SIGKILLed.

Each member is a process running confluent-kafka's ``Consumer`` (the ``range`` or the
``cooperative-sticky`` assignor) or kafka-python's ``KafkaConsumer``, subscribed to a 6-partition topic;
it writes every record it receives to its own file ("processing") and only then commits synchronously.
While records keep arriving, a campaign starts members (up to four), closes them (SIGTERM: the member
leaves the group) and SIGKILLs them (no LeaveGroup: the coordinator moves their partitions after
``session.timeout.ms``).  Then:

* every record produced was processed at least once, and none was skipped (per partition, the processed
  offsets cover 0 .. log end);
* the group's committed offsets reach the log end;
* a restarted group resumes from its committed offsets: a new member's first record of each partition is
  the committed offset, never an earlier or a later one.

aiokafka joins a group, consumes and commits.  Short in ``make test``, long in ``make soak``
(``tests/support/campaign.py``); one appliance for the module, short session timeouts.
"""

from __future__ import annotations

import asyncio
import random
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from support.campaign import rounds
from support.kafka_appliance import Appliance, served_appliance

from appliance.client.group_admin import LATEST, GroupAdmin

confluent_kafka = pytest.importorskip("confluent_kafka")

PARTITIONS = 6
PER_STEP = 8  # records produced to each partition before each campaign step
SESSION_TIMEOUT_MS = 3000
MAX_MEMBERS = 4

_MEMBER = r"""
import signal, sys, time, warnings
client, bootstrap, group, topic, assignor, out_path, session_ms = sys.argv[1:8]
PROCESS_S = 0.01  # each record takes a while, so that a kill lands between processing and commit
stopping = []
signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
out = open(out_path, "a", buffering=1)
if client == "confluent":
    import confluent_kafka
    c = confluent_kafka.Consumer({
        "bootstrap.servers": bootstrap, "group.id": group, "partition.assignment.strategy": assignor,
        "session.timeout.ms": int(session_ms), "heartbeat.interval.ms": 300, "max.poll.interval.ms": 20000,
        "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    c.subscribe([topic])
    while not stopping:
        got = [m for m in c.consume(num_messages=50, timeout=0.2) if m.error() is None]
        for m in got:
            out.write(f"{m.partition()} {m.offset()}\n")
            time.sleep(PROCESS_S)
        if got:
            try:
                c.commit(asynchronous=False)  # after processing: at least once
            except confluent_kafka.KafkaException:
                pass  # a rebalance took them: their next owner processes them again
    c.close()
else:
    warnings.simplefilter("ignore")
    from kafka import KafkaConsumer
    from kafka.coordinator.assignors.range import RangePartitionAssignor
    from kafka.errors import KafkaError
    c = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False,
                      auto_offset_reset="earliest", session_timeout_ms=int(session_ms),
                      heartbeat_interval_ms=300, max_poll_interval_ms=20000,
                      partition_assignment_strategy=[RangePartitionAssignor])
    while not stopping:
        got = c.poll(timeout_ms=200, max_records=50)
        for records in got.values():
            for r in records:
                out.write(f"{r.partition} {r.offset}\n")
                time.sleep(PROCESS_S)
        if got:
            try:
                c.commit()
            except KafkaError:
                pass
    c.close()
"""


@pytest.fixture(scope="module")
def appliance(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Appliance]:
    topics = {"cg-range": PARTITIONS, "cg-sticky": PARTITIONS, "cg-kp": PARTITIONS, "cg-aio": 2}
    extra = '"group.initial.rebalance.delay.ms" = 100\n"group.min.session.timeout.ms" = 1000'
    yield from served_appliance(tmp_path_factory.mktemp("group-campaign"), topics, extra=extra)


@dataclass
class Member:
    process: subprocess.Popen[bytes]
    out: Path  # the records it processed, "partition offset" per line

    def lines(self) -> int:
        return len(self.out.read_text().splitlines()) if self.out.exists() else 0


@dataclass
class Campaign:
    appliance: Appliance
    client: str
    assignor: str
    topic: str
    group: str
    workdir: Path
    produced: list[int] = field(default_factory=lambda: [0] * PARTITIONS)
    members: list[Member] = field(default_factory=list)
    started: int = 0
    kills: int = 0
    closes: int = 0

    def produce(self, per_partition: int) -> None:
        producer = confluent_kafka.Producer({"bootstrap.servers": self.appliance.bootstrap})
        for p in range(PARTITIONS):
            for _ in range(per_partition):
                producer.produce(self.topic, value=f"{p}-{self.produced[p]}", partition=p)
                self.produced[p] += 1
        assert producer.flush(30) == 0

    def start_member(self) -> Path:
        out = self.workdir / f"{self.group}-{self.started}.out"
        self.started += 1
        command = [
            sys.executable,
            "-c",
            _MEMBER,
            self.client,
            self.appliance.bootstrap,
            self.group,
            self.topic,
            self.assignor,
            str(out),
            str(SESSION_TIMEOUT_MS),
        ]
        with open(self.workdir / f"{out.name}.log", "wb") as log:  # the member keeps its own descriptor
            self.members.append(Member(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT), out))
        return out

    def close_member(self, member: Member) -> None:
        member.process.send_signal(signal.SIGTERM)
        member.process.wait(30)
        self.members.remove(member)
        self.closes += 1

    def kill_member(self, member: Member) -> None:
        """SIGKILL, as soon as the member is processing new records (between processing and commit)."""
        before = member.lines()
        deadline = time.monotonic() + 5
        while member.lines() == before and time.monotonic() < deadline:
            time.sleep(0.005)
        member.process.send_signal(signal.SIGKILL)
        member.process.wait()
        self.members.remove(member)
        self.kills += 1

    def processed(self, pattern: str = "*.out") -> dict[int, list[int]]:
        """Every (partition -> offsets) any member wrote, duplicates kept."""
        seen: dict[int, list[int]] = {p: [] for p in range(PARTITIONS)}
        for path in self.workdir.glob(f"{self.group}-{pattern}"):
            for line in path.read_text().splitlines():
                partition, offset = line.split()
                seen[int(partition)].append(int(offset))
        return seen

    def missing(self) -> dict[int, list[int]]:
        seen = self.processed()
        return {
            p: sorted(set(range(self.produced[p])) - set(seen[p]))[:5]
            for p in range(PARTITIONS)
            if set(range(self.produced[p])) - set(seen[p])
        }

    def stop_all(self) -> None:
        for member in list(self.members):
            if member.process.poll() is None:
                self.close_member(member)
            else:
                self.members.remove(member)

    def kill_all(self) -> None:
        for member in self.members:
            if member.process.poll() is None:
                member.process.kill()
                member.process.wait()
        self.members.clear()


def wait_for(condition: object, what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return
        time.sleep(0.2)
    raise AssertionError(f"gave up after {timeout_s} s waiting for {what}")


SCRIPTED = ["join", "kill", "join", "close"]  # the first steps; random ones after


def run_campaign(campaign: Campaign, steps: int, seed: int) -> None:
    rng = random.Random(seed)
    campaign.start_member()
    campaign.start_member()
    for step in range(steps):
        campaign.produce(PER_STEP)
        alive = len(campaign.members)
        action = SCRIPTED[step] if step < len(SCRIPTED) else rng.choice(["join", "close", "kill", "kill"])
        if (action == "join" and alive < MAX_MEMBERS) or alive <= 1:
            campaign.start_member()
        elif action == "close":
            campaign.close_member(rng.choice(campaign.members))
        else:
            campaign.kill_member(rng.choice(campaign.members))
        time.sleep(rng.uniform(0.2, 1.5))
    campaign.produce(PER_STEP)
    if not campaign.members:
        campaign.start_member()
    wait_for(lambda: not campaign.missing(), "every record processed", timeout_s=90)


def check_committed_and_resume(campaign: Campaign) -> None:
    """The group committed up to the log end; after more records, a new member starts at the commits."""
    tps = [(campaign.topic, p) for p in range(PARTITIONS)]
    with GroupAdmin(campaign.appliance.bootstrap) as admin:
        ends = admin.log_offsets(tps, LATEST)
        wait_for(lambda: admin.committed_offsets(campaign.group) == ends, "commits at the log end", 60)
        campaign.stop_all()
        committed = admin.committed_offsets(campaign.group)
    assert committed == {tp: campaign.produced[tp[1]] for tp in tps}
    campaign.produce(2)
    out = campaign.start_member()

    def resumed() -> dict[int, list[int]]:
        seen: dict[int, list[int]] = {p: [] for p in range(PARTITIONS)}
        for line in out.read_text().splitlines() if out.exists() else []:
            partition, offset = line.split()
            seen[int(partition)].append(int(offset))
        return seen

    wait_for(lambda: all(len(v) >= 2 for v in resumed().values()), "the restarted group's first records")
    for p, offsets in resumed().items():
        assert sorted(offsets)[:2] == [committed[(campaign.topic, p)], committed[(campaign.topic, p)] + 1], p
    campaign.stop_all()


@pytest.mark.campaign
@pytest.mark.parametrize(
    ("client", "assignor", "topic"),
    [
        ("confluent", "range", "cg-range"),
        ("confluent", "cooperative-sticky", "cg-sticky"),
        ("kafka-python", "range", "cg-kp"),
    ],
)
def test_members_join_close_and_die_and_every_record_is_processed(
    appliance: Appliance, tmp_path: Path, client: str, assignor: str, topic: str
) -> None:
    campaign = Campaign(appliance, client, assignor, topic, f"g-{topic}", tmp_path)
    steps = rounds(4, 40)
    try:
        run_campaign(campaign, steps, seed=sum(map(ord, topic)))
        check_committed_and_resume(campaign)
    finally:
        campaign.kill_all()
    seen = campaign.processed()
    total = sum(campaign.produced)
    duplicates = sum(len(v) for v in seen.values()) - total
    print(
        f"{client}/{assignor}: {steps} steps, {campaign.started} members started, {campaign.kills} killed, "
        f"{campaign.closes} closed; {total} records, {duplicates} processed twice or more"
    )
    for p in range(PARTITIONS):
        assert set(seen[p]) == set(range(campaign.produced[p])), p  # none skipped, none invented


def test_aiokafka_joins_a_group_consumes_and_commits(appliance: Appliance) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        aiokafka = pytest.importorskip("aiokafka")
    producer = confluent_kafka.Producer({"bootstrap.servers": appliance.bootstrap})
    for p in range(2):
        for i in range(5):
            producer.produce("cg-aio", value=f"{p}-{i}", partition=p)
    assert producer.flush(30) == 0

    async def consume() -> list[tuple[int, int]]:
        consumer = aiokafka.AIOKafkaConsumer(
            "cg-aio",
            bootstrap_servers=appliance.bootstrap,
            group_id="g-aio",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            session_timeout_ms=SESSION_TIMEOUT_MS,
            heartbeat_interval_ms=300,
        )
        await consumer.start()
        seen: list[tuple[int, int]] = []
        try:
            async with asyncio.timeout(60):
                while len(seen) < 10:
                    batches = await consumer.getmany(timeout_ms=500)
                    seen += [(r.partition, r.offset) for records in batches.values() for r in records]
            await consumer.commit()
        finally:
            await consumer.stop()
        return seen

    seen = asyncio.run(consume())
    assert sorted(seen) == [(p, i) for p in range(2) for i in range(5)]
    with GroupAdmin(appliance.bootstrap) as admin:
        assert admin.committed_offsets("g-aio") == {("cg-aio", 0): 5, ("cg-aio", 1): 5}
        group = admin.describe_group("g-aio")
    assert group.state == "Empty" and group.members == ()  # stop() left the group
