"""A kill campaign against the cleaner: SIGKILL the cleaner process, the replica process (while it adopts
the leader's cleaned segments), or the whole appliance, at random moments while the leader cleans a
compacted topic produced to with confluent-kafka; after each kill (and a restart of what was killed)
reading the partition from the start gives each key's latest value at its original offset, every record
read is one that was produced at that offset, and once the follower has caught up its segment files are
the leader's, byte for byte (docs/replication.md, "Compacted topics").  At the end both logs open and read
whole.

``rounds(5, 50)`` kills: five in ``make test``, fifty under ``make soak`` (``APPLIANCE_SOAK=1``).
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest
from support.campaign import rounds
from support.harness import Appliance, _title
from support.kafka_appliance import free_port
from support.segment_files import differences, wait_byte_identical, wait_log_end

from storage.batch_reader import iter_records
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
ADOPTED = "kills-0: adopted the leader's segment"  # the replica's log line after an adoption's swap


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
    leader_dir, follower_dir = app.data / f"{TOPIC}-0", campaign.replica_dir / f"{TOPIC}-0"
    kills = rounds(5, 50)
    converged_s = []
    for kill in range(kills):
        passes = app.log().count(LEADER_PASS)
        campaign.produce()
        campaign.wait_for_a_pass(passes)
        time.sleep(campaign.random.uniform(0.0, 1.5))  # the replica adopts what each swap changed
        if kill % 3 == 0:
            os.kill(campaign.cleaner_pid(), signal.SIGKILL)
        elif kill % 3 == 1:
            os.kill(campaign.replica_pid(), signal.SIGKILL)  # the supervisor starts it again
        else:
            app.kill_tree()
            app.start()
        campaign.check()
        wait_log_end(follower_dir, max(campaign.produced) + 1)
        converged_s.append(wait_byte_identical(leader_dir, follower_dir, timeout_s=120))
    campaign.cleaner_pid()  # restarted after its last kill
    campaign.replica_pid()
    logs = "".join(p.read_text(errors="replace") for p in app.cwd.glob("serve-*.log"))
    print(f"\n{kills} kills; leader passes begun {logs.count(LEADER_PASS)}, finished "
          f"{logs.count('cleaner: kills-0 cleaned offsets')}; groups swapped at the leader "
          f"{logs.count('swapped in a cleaned segment at')}; segments adopted by the follower "
          f"{logs.count(ADOPTED)}; byte-identical after each round within {max(converged_s):.1f} s "
          f"(median {sorted(converged_s)[len(converged_s) // 2]:.1f} s)")
    assert app.stop() == 0, app.log()
    config = LogConfig.from_properties({"segment.bytes": 16384})
    for directory in (leader_dir, follower_dir):
        names = os.listdir(directory)
        assert not [n for n in names if n.endswith((".cleaned", ".swap", ".deleted"))], (directory, names)
        with Log.open(str(directory), config, topic_partition=(TOPIC, 0)) as log:  # recovers, reads whole
            assert log.log_end_offset == max(campaign.produced) + 1
            assert list(log.batches())
    assert differences(leader_dir, follower_dir) == []
    with LogReader(str(follower_dir)) as reader:
        campaign.check([(r.offset, r.key or b"", r.value) for b in reader.batches() for r in iter_records(b)])
