"""A kill campaign against the cleaner: SIGKILL the cleaner process, the replica process while its cleaner
thread cleans, or the whole appliance, at random moments while they clean a compacted topic produced to
with confluent-kafka; after each kill (and a restart of what was killed) reading the partition from the
start gives each key's latest value at its original offset, every record read is one that was produced at
that offset, and the files open and read whole.

At the end the follower (cleaned by its own cleaner, docs/replication.md "Compacted topics") is checked
against the leader with the strongest property that holds for two logs cleaned at their own moments: the
same log end; every record both hold is the same record (key, value, timestamp, headers); a record only one
side holds is superseded on the other (a later record of its key is there) or a tombstone; and the bytes
of the section neither side's cleaner has reached (from the later of the two active segments on) are
identical.

``rounds(5, 50)`` kills: five in ``make test``, fifty under ``make soak`` (``APPLIANCE_SOAK=1``).
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from support.campaign import rounds
from support.harness import Appliance, _title
from support.kafka_appliance import free_port

from storage.batch_header import parse_header
from storage.batch_reader import Record, iter_records
from storage.log import Log
from storage.log_config import LogConfig
from storage.log_reader import LogReader

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

TOPIC = "kills"
KEYS = 30
CONFIGS = {"cleanup.policy": "compact", "segment.bytes": "16384", "min.cleanable.dirty.ratio": "0.01",
           "delete.retention.ms": "0"}
Produced = dict[int, tuple[bytes, bytes | None]]  # offset -> (key, value) as acknowledged
LEADER_PASS = "cleaner: cleaning kills-0"  # the cleaner process's log line as a pass begins
FOLLOWER_PASS = "cleaner of replica 1: cleaning kills-0"  # the replica's cleaner thread's


class Campaign:
    """The appliance, what was produced, and the checks."""

    def __init__(self) -> None:
        self.port = free_port()
        # the throttle makes a pass last a second or two, so most kills land inside one
        self.app = Appliance(None, f"listeners=PLAINTEXT://127.0.0.1:{self.port}",
                             "log.cleaner.backoff.ms=50", "replica.fetch.backoff.ms=50",
                             "log.cleaner.io.max.bytes.per.second=50000")  # fmt: skip
        self.replica_dir = self.app.cwd / "replica"
        self.app.overrides.append(f"appliance.replica.dirs={self.replica_dir}")
        self.produced: Produced = {}
        self.round = 0
        self.random = random.Random(int(os.environ.get("CLEANER_KILL_SEED", "17")))

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def produce(self) -> None:
        producer = confluent_kafka.Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 0,
                                             "batch.size": 1500, "enable.idempotence": True})

        def delivered(err: Any, msg: Any) -> None:
            assert err is None, err
            self.produced[msg.offset()] = (msg.key(), msg.value())

        for r in range(8):
            for k in range(KEYS):
                tombstone = (k + r + self.round) % 17 == 0
                value = None if tombstone else b"r%03d-%02d-" % (self.round, r) + b"y" * 80
                producer.produce(TOPIC, key=b"k%02d" % k, value=value, on_delivery=delivered)
            producer.poll(0)
        assert producer.flush(60) == 0
        self.round += 1

    def cleaner_pid(self, timeout_s: float = 20.0) -> int:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for pid in self.app.children():
                if _title(pid) == "appliance: cleaner":
                    return pid
            time.sleep(0.05)
        raise AssertionError(f"no cleaner process; log:\n{self.app.log()}")

    def replica_pid(self, timeout_s: float = 20.0) -> int:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for pid in self.app.children():
                if _title(pid) == "appliance: replica 1":
                    return pid
            time.sleep(0.05)
        raise AssertionError(f"no replica process; log:\n{self.app.log()}")

    def wait_for_a_pass(self, passes_before: int, started: str = LEADER_PASS) -> None:
        deadline = time.monotonic() + 60
        while self.app.log().count(started) <= passes_before:
            assert time.monotonic() < deadline, f"no clean started; log:\n{self.app.log()}"
            time.sleep(0.02)

    def check(self, records: list[tuple[int, bytes, bytes | None]] | None = None) -> None:
        """Reading from the start: each record read was produced at its offset; each key's latest record
        is there (a tombstone may be gone)."""
        records = self.read() if records is None else records
        for offset, key, value in records:
            assert self.produced.get(offset) == (key, value), (offset, key, value)
        offsets = [r[0] for r in records]
        assert offsets == sorted(set(offsets))
        latest: dict[bytes, tuple[int, bytes | None]] = {}
        for offset, (key, value) in sorted(self.produced.items()):
            latest[key] = (offset, value)
        read = {key: offset for offset, key, _ in records}
        for key, (offset, value) in latest.items():
            if value is not None:
                assert read.get(key) == offset, (key, offset, read.get(key))

    def read(self) -> list[tuple[int, bytes, bytes | None]]:
        consumer = confluent_kafka.Consumer({"bootstrap.servers": self.bootstrap,
                                             "group.id": f"g{time.monotonic_ns()}",
                                             "auto.offset.reset": "earliest", "enable.auto.commit": False})
        try:
            end = max(self.produced) + 1
            consumer.assign([confluent_kafka.TopicPartition(TOPIC, 0, confluent_kafka.OFFSET_BEGINNING)])
            out: list[tuple[int, bytes, bytes | None]] = []
            deadline = time.monotonic() + 60
            while (not out or out[-1][0] < end - 1) and time.monotonic() < deadline:
                msg = consumer.poll(0.5)
                if msg is not None and msg.error() is None:
                    out.append((msg.offset(), msg.key(), msg.value()))
            assert out and out[-1][0] == end - 1, f"read up to {out[-1][0] if out else None}, not {end - 1}"
            return out
        finally:
            consumer.close()


@pytest.fixture
def campaign() -> Iterator[Campaign]:
    running = Campaign()
    running.app.start()
    try:
        yield running
    finally:
        running.app.close()


@pytest.mark.campaign
def test_sigkill_of_the_cleaner_or_the_appliance_while_it_cleans_loses_nothing(campaign: Campaign) -> None:
    app = campaign.app
    admin = AdminClient({"bootstrap.servers": campaign.bootstrap})
    admin.create_topics([NewTopic(TOPIC, 1, 2, config=CONFIGS)])[TOPIC].result(30)
    del admin  # its handle would keep reconnecting while the appliance is down
    kills = rounds(5, 50)
    for kill in range(kills):
        started = FOLLOWER_PASS if kill % 3 == 1 else LEADER_PASS
        passes = app.log().count(started)
        campaign.produce()
        campaign.wait_for_a_pass(passes, started)
        time.sleep(campaign.random.uniform(0.0, 1.0))
        if kill % 3 == 0:
            os.kill(campaign.cleaner_pid(), signal.SIGKILL)
        elif kill % 3 == 1:
            os.kill(campaign.replica_pid(), signal.SIGKILL)  # the supervisor starts it again
        else:
            app.kill_tree()
            app.start()
        campaign.check()
    campaign.cleaner_pid()  # restarted after its last kill
    campaign.replica_pid()
    _wait_for_copy(campaign.replica_dir / f"{TOPIC}-0", max(campaign.produced) + 1)
    logs = "".join(p.read_text(errors="replace") for p in app.cwd.glob("serve-*.log"))
    print(f"\n{kills} kills; leader passes begun {logs.count(LEADER_PASS)}, finished "
          f"{logs.count('cleaner: kills-0 cleaned offsets')}; follower passes begun "
          f"{logs.count(FOLLOWER_PASS)}, finished "
          f"{logs.count('cleaner of replica 1: kills-0 cleaned offsets')}; "
          f"groups swapped {logs.count('swapped in a cleaned segment at')}")
    assert app.stop() == 0, app.log()
    config = LogConfig.from_properties({"segment.bytes": 16384})
    with Log.open(str(app.data / f"{TOPIC}-0"), config, topic_partition=(TOPIC, 0)) as log:
        assert log.log_end_offset == max(campaign.produced) + 1
        batches = list(log.batches())
    assert batches
    leader_dir, follower_dir = app.data / f"{TOPIC}-0", campaign.replica_dir / f"{TOPIC}-0"
    for directory in (leader_dir, follower_dir):
        names = os.listdir(directory)
        assert not [n for n in names if n.endswith((".cleaned", ".swap", ".deleted"))], (directory, names)
    with Log.open(str(follower_dir), config, topic_partition=(TOPIC, 0)) as log:  # recovers, reads whole
        assert log.log_end_offset == max(campaign.produced) + 1
    leader, follower = _copy(leader_dir), _copy(follower_dir)
    campaign.check([(r.offset, r.key or b"", r.value) for r in follower.records])
    _check_follower(leader, follower)


class _Copy(NamedTuple):
    """One side's log as read from its files after the stop."""

    records: list[Record]
    batches: dict[int, bytes]  # base offset -> the batch's bytes
    active_base_offset: int


def _copy(directory: Path) -> _Copy:
    with LogReader(str(directory)) as reader:
        batches = {parse_header(memoryview(b), 0).base_offset: b for b in reader.batches()}
    active = max(int(n[:20]) for n in os.listdir(directory) if n.endswith(".log"))
    return _Copy([r for b in batches.values() for r in iter_records(b)], batches, active)


def _check_follower(leader: _Copy, follower: _Copy) -> None:
    """The follower against the leader (the module docstring's last paragraph)."""
    mine = {r.offset: r for r in leader.records}
    theirs = {r.offset: r for r in follower.records}
    for offset in mine.keys() & theirs.keys():
        assert mine[offset] == theirs[offset], (offset, mine[offset], theirs[offset])
    for one, other, name in ((mine, theirs, "follower"), (theirs, mine, "leader")):
        latest = {}
        for offset, record in sorted(other.items()):
            latest[record.key] = offset
        for offset in one.keys() - other.keys():
            record = one[offset]
            assert record.value is None or latest.get(record.key, -1) > offset, (
                f"the {name} lacks offset {offset} ({record}) and holds no later record of its key")
    uncleaned_from = max(leader.active_base_offset, follower.active_base_offset)
    tail = {b: data for b, data in leader.batches.items() if b >= uncleaned_from}
    assert tail == {b: data for b, data in follower.batches.items() if b >= uncleaned_from}
    assert tail, "no batch past both active segments' bases"


def _wait_for_copy(directory: Path, end: int) -> None:
    """Until the follower has copied up to ``end``."""
    deadline = time.monotonic() + 60
    while True:
        with LogReader(str(directory)) as reader:
            if reader.log_end_offset >= end:
                return
        assert time.monotonic() < deadline, f"the follower did not reach offset {end}"
        time.sleep(0.1)
