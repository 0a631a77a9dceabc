"""A follower of a compacted topic: it records the topic's settings as its leader has them, and its log
directory becomes the leader's, file for file and byte for byte: a fresh replica of a cleaned leader, and a
replica that followed the leader while it cleaned (several passes, tombstones, segments merged), once it
has adopted the leader's cleaned segments (``appliance.follower.adoption``).

The replica is the one ``appliance.replica.dirs`` gives ``appliance serve`` (node 1, a child of the
supervisor, its log in its own directory); records are produced with confluent-kafka.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.harness import Appliance
from support.kafka_appliance import free_port
from support.segment_files import differences, wait_byte_identical

from appliance.config.topic_metadata import read_topics
from storage.batch_reader import iter_records
from storage.log_dir import CLEANER_OFFSET_CHECKPOINT_FILE, read_partition_checkpoint
from storage.log_reader import LogReader

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka.admin import (  # noqa: E402
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
)

TOPIC = "compacted"
KEYS = 30
COMPACT = {"cleanup.policy": "compact", "segment.bytes": "16384", "min.cleanable.dirty.ratio": "0.01",
           "delete.retention.ms": "0"}
Produced = dict[int, tuple[bytes, bytes | None]]  # offset -> (key, value) as acknowledged


class Pair:
    """An appliance on a fixed port with one replica (node 1) in ``replica``."""

    def __init__(self) -> None:
        self.port = free_port()
        self.app = Appliance(None, f"listeners=PLAINTEXT://127.0.0.1:{self.port}",
                             "log.cleaner.backoff.ms=50", "replica.fetch.backoff.ms=50")  # fmt: skip
        self.replica = self.app.cwd / "replica"
        self.app.overrides.append(f"appliance.replica.dirs={self.replica}")
        self.produced: Produced = {}

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def create(self) -> None:
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        admin.create_topics([NewTopic(TOPIC, 1, 2, config=COMPACT)])[TOPIC].result(30)

    def produce(self, rounds: int, tag: bytes, keys: range = range(KEYS)) -> None:
        """``rounds`` values of each of ``keys`` (acks=all: the follower has them when this returns)."""
        producer = confluent_kafka.Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 0,
                                             "batch.size": 1500, "acks": "all", "enable.idempotence": True})

        def delivered(err: Any, msg: Any) -> None:
            assert err is None, err
            self.produced[msg.offset()] = (msg.key(), msg.value())

        for r in range(rounds):
            for k in keys:
                producer.produce(TOPIC, key=b"k%02d" % k, value=tag + b"-%03d-" % r + b"v" * 100,
                                 on_delivery=delivered)
            producer.poll(0)
        assert producer.flush(60) == 0

    def produce_tombstones(self, keys: range) -> None:
        producer = confluent_kafka.Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 0,
                                             "acks": "all", "enable.idempotence": True})

        def delivered(err: Any, msg: Any) -> None:
            assert err is None, err
            self.produced[msg.offset()] = (msg.key(), None)

        for k in keys:
            producer.produce(TOPIC, key=b"k%02d" % k, value=None, on_delivery=delivered)
        assert producer.flush(60) == 0

    @property
    def end(self) -> int:
        return max(self.produced) + 1

    def wait_for_log(self, text: str, count: int = 1, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while self.app.log().count(text) < count:
            assert time.monotonic() < deadline, f"no {text!r} in the log:\n{self.app.log()}"
            time.sleep(0.05)

    def wait_for_copy(self, timeout_s: float = 60.0) -> None:
        """Until the follower's log reaches everything produced."""
        deadline = time.monotonic() + timeout_s
        while _log_end(self.replica / f"{TOPIC}-0") < self.end:
            assert time.monotonic() < deadline, f"the follower did not reach {self.end}:\n{self.app.log()}"
            time.sleep(0.05)


def _log_end(directory: Path) -> int:
    if not directory.exists():
        return -1
    with LogReader(str(directory)) as reader:
        return reader.log_end_offset


def _wait_for_checkpoint(directory: Path, offset: int, timeout_s: float = 60.0) -> None:
    """Until the cleaner of ``directory``'s log has cleaned past ``offset``."""
    deadline = time.monotonic() + timeout_s
    while (read_partition_checkpoint(str(directory), CLEANER_OFFSET_CHECKPOINT_FILE, (TOPIC, 0))
           or 0) <= offset:
        assert time.monotonic() < deadline, f"{directory} was not cleaned past {offset}"
        time.sleep(0.05)


def _stream(directory: Path) -> bytes:
    """The log's batches from its start, as one byte string."""
    with LogReader(str(directory)) as reader:
        return b"".join(reader.batches())


def _records(directory: Path) -> list[tuple[int, bytes, bytes | None]]:
    with LogReader(str(directory)) as reader:
        return [(r.offset, r.key or b"", r.value) for batch in reader.batches() for r in iter_records(batch)]


def _check(records: list[tuple[int, bytes, bytes | None]], produced: Produced) -> None:
    """Every record is the one produced at its offset; every key's latest record is there."""
    for offset, key, value in records:
        assert produced.get(offset) == (key, value), (offset, key, value)
    latest = {key: offset for offset, (key, _) in sorted(produced.items())}
    held = {key: offset for offset, key, _ in records}
    assert held == latest


@pytest.fixture
def pair() -> Iterator[Pair]:
    running = Pair()
    try:
        yield running
    finally:
        running.app.close()


def test_a_fresh_replica_of_a_cleaned_leader_copies_it_byte_for_byte(pair: Pair) -> None:
    pair.app.start()
    pair.create()
    pair.produce(12, b"a")
    b_from = pair.end
    pair.produce(10, b"b", range(KEYS // 2))  # half the keys again: gaps between the records kept
    # more, so that the segment holding b_from + KEYS is closed (its boundary depends on the batching) and
    # the cleaner may clean past it
    pair.produce(4, b"c")
    _wait_for_checkpoint(pair.app.data / f"{TOPIC}-0", b_from + KEYS)
    assert pair.app.stop() == 0, pair.app.log()
    leader = pair.app.data / f"{TOPIC}-0"
    leader_stream = _stream(leader)
    offsets = [offset for offset, _, _ in _records(leader)]
    assert len(offsets) < len(pair.produced), "the leader cleaned nothing"
    assert offsets != list(range(offsets[0], offsets[-1] + 1)), "no gap in the cleaned leader"

    shutil.rmtree(pair.replica)  # a fresh replica; no cleaning on either side from now on
    pair.app.overrides.append("log.cleaner.enable=false")
    pair.app.start()
    pair.wait_for_copy()
    wait_byte_identical(leader, pair.replica / f"{TOPIC}-0")
    assert pair.app.stop() == 0, pair.app.log()

    follower = pair.replica / f"{TOPIC}-0"
    assert _stream(follower) == leader_stream
    assert _stream(leader) == leader_stream
    assert differences(leader, follower) == []
    _check(_records(follower), pair.produced)


def test_a_follower_of_a_cleaning_leader_becomes_byte_identical_to_it(pair: Pair) -> None:
    pair.app.start()
    pair.create()
    pair.produce(1, b"a")
    pair.wait_for_copy()  # the follower follows from here on, a few milliseconds behind the leader
    for r in range(4):  # several passes of the leader's cleaner, groups merging as the log shrinks
        b_from = pair.end
        pair.produce(6, b"b%d" % r)
        pair.produce_tombstones(range(r * 3, r * 3 + 3))
        _wait_for_checkpoint(pair.app.data / f"{TOPIC}-0", b_from + KEYS)
    pair.produce(1, b"z", range(3))  # the cleaned tail below the high watermark
    pair.wait_for_copy()
    leader, follower = pair.app.data / f"{TOPIC}-0", pair.replica / f"{TOPIC}-0"
    wait_byte_identical(leader, follower)
    assert pair.app.stop() == 0, pair.app.log()
    assert "adopted the leader's segment" in pair.app.log()
    _check(_records(follower), pair.produced)
    assert len(_records(follower)) < len(pair.produced), "the leader cleaned nothing"
    assert not [p.name for p in follower.iterdir() if p.name.endswith((".cleaned", ".swap", ".deleted"))]


def test_the_replica_records_the_topic_settings_its_leader_has_and_their_changes(pair: Pair) -> None:
    pair.app.start()
    pair.create()

    def settings(directory: Path) -> dict[str, object] | None:
        path = directory / "meta" / "topics.json"
        found = read_topics(path).get(TOPIC) if path.exists() else None
        return None if found is None else dict(found.configs)

    def replica_has_the_leaders(retention: object) -> None:
        deadline = time.monotonic() + 30
        while True:
            leader = settings(pair.app.data)
            if leader is not None and leader.get("delete.retention.ms") == retention:
                if settings(pair.replica) == leader:
                    return
            assert time.monotonic() < deadline, (settings(pair.replica), leader)
            time.sleep(0.05)

    replica_has_the_leaders(0)
    assert (settings(pair.replica) or {}).get("cleanup.policy") == "compact"
    admin = AdminClient({"bootstrap.servers": pair.bootstrap})
    entry = ConfigEntry("delete.retention.ms", "1000", incremental_operation=AlterConfigOpType.SET)
    resource = ConfigResource("topic", TOPIC, incremental_configs=[entry])
    admin.incremental_alter_configs([resource])[resource].result(30)
    replica_has_the_leaders(1000)
