"""SIGKILL of a replica in the middle of an adoption (``appliance.follower.adoption``): at the named fault
point between the copy and the swap (``appliance.follower.adopt_faults``) and inside the swap, before and
after its commit (``storage.clean_faults``); ``rounds(2, 3)`` of them.  Each start of the replica recovers
a valid log (the ``.cleaned`` file unlinked, an uncommitted swap undone, a committed one finished) and,
once started without a fault (the leader restarted without its cleaner, so that its files stay put), its
segment files become the leader's, byte for byte; every key's latest record is there.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.campaign import rounds
from support.replication_cluster import REPO, Node
from support.segment_files import differences, wait_byte_identical, wait_log_end

from storage.batch_reader import iter_records
from storage.log import Log
from storage.log_config import LogConfig
from storage.log_reader import LogReader

confluent_kafka = pytest.importorskip("confluent_kafka")

TOPIC = "adopted"
KEYS = 20
SETTINGS = {"replica.fetch.backoff.ms": 50, "replica.socket.timeout.ms": 3000, "min.insync.replicas": 1,
            "log.cleaner.backoff.ms": 50}
TOPICS = {TOPIC: {"partitions": 1, "replication.factor": 2, "cleanup.policy": "compact",
                  "segment.bytes": 2048, "min.cleanable.dirty.ratio": 0.01, "delete.retention.ms": 0}}
FAULTY = Path(__file__).with_name("faulty_replica.py")
# (fault point, what the kill leaves in the replica's partition directory)
KILLS = [("adopt.copied", ".log.cleaned"), ("clean.deleted", ".deleted"), ("clean.swap", ".log.swap")]


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[Node, Node]]:
    root = Path(os.path.realpath(tmp_path))
    n0 = Node(root, 0, settings=SETTINGS, topics=TOPICS)
    n1 = Node(root, 1, settings=SETTINGS, topics=TOPICS)
    try:
        yield n0, n1
    finally:
        n1.close()
        n0.close()


def _start_faulty(node: Node, leader: Node, point: str) -> None:
    """``appliance replica`` on ``node`` with a SIGKILL armed at ``point`` (``faulty_replica.py``)."""
    args = [sys.executable, str(FAULTY), point, "replica", "--config", str(node.config_path),
            "--override", f"appliance.replica.leader={leader.address}"]
    log = node.root / f"n{node.node_id}-{len(node.logs)}.log"
    node.logs.append(log)
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{FAULTY.parent}"}
    env.pop("NOTIFY_SOCKET", None)
    with open(log, "wb") as out:
        node.process = subprocess.Popen(args, cwd=node.root, env=env, stdout=out, stderr=out,
                                        start_new_session=True)


def _produce(leader: Node, rounds: int, tag: bytes, produced: dict[int, tuple[bytes, bytes]]) -> None:
    # idempotent: a request that outlives its timeout (a follower killed mid-produce holds acks=all until
    # the ISR shrinks, replica.lag.time.max.ms 30 s, librdkafka's request.timeout.ms too) is retried, and
    # without it the retry appends the records again at offsets the oracle never hears of
    producer = confluent_kafka.Producer({"bootstrap.servers": leader.address, "linger.ms": 0,
                                         "batch.size": 600, "acks": "all", "enable.idempotence": True})

    def delivered(err: Any, msg: Any) -> None:
        assert err is None, err
        produced[msg.offset()] = (msg.key(), msg.value())

    for r in range(rounds):
        for k in range(KEYS):
            producer.produce(TOPIC, key=b"k%02d" % k, value=tag + b"-%02d-" % r + b"v" * 60,
                             on_delivery=delivered)
        producer.poll(0)
    assert producer.flush(60) == 0


def _killed(node: Node, wait_s: float = 1.5) -> bool:
    assert node.process is not None
    try:
        node.process.wait(wait_s)
    except subprocess.TimeoutExpired:
        return False
    return True


def _wait_killed(node: Node, timeout_s: float = 30.0) -> None:
    assert node.process is not None
    try:
        code = node.process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        text = node.log_text()[-4000:]
        raise AssertionError(f"the replica was not killed at its fault point:\n{text}") from None
    assert code == -9, node.log_text()[-4000:]


@pytest.mark.campaign
def test_a_replica_killed_in_the_middle_of_adoptions_recovers_and_converges(pair: tuple[Node, Node]) -> None:
    n0, n1 = pair
    n0.start("serve")
    n0.wait_role("leader")
    produced: dict[int, tuple[bytes, bytes]] = {}
    leader_dir, follower_dir = Path(n0.directory(TOPIC)), Path(n1.directory(TOPIC))
    for round_, (point, left) in enumerate(KILLS[: rounds(2, len(KILLS))]):
        _start_faulty(n1, n0, point)
        _produce(n0, 2, b"r%d" % round_, produced)
        wait_log_end(follower_dir, max(produced) + 1)
        for more in range(30):  # the leader cleans what the replica holds; the replica adopts, and dies
            _produce(n0, 2, b"r%d-%d" % (round_, more), produced)
            if _killed(n1):
                break
        _wait_killed(n1)
        names = os.listdir(follower_dir)
        assert [n for n in names if n.endswith(left)], (point, sorted(names))
        with Log.open(str(follower_dir), LogConfig(segment_bytes=2048), topic_partition=(TOPIC, 0)) as log:
            assert log.log_end_offset > 0  # recovered: the swap finished or undone, the copy unlinked
        assert not [n for n in os.listdir(follower_dir) if n.endswith((".cleaned", ".swap", ".deleted"))]
    # The leader restarted without its cleaner: a pass after the follower caught up would change the
    # leader's files again before both are stopped and compared.
    assert n0.stop() == 0
    n0.start("serve", "log.cleaner.enable=false")
    n0.wait_role("leader")
    n1.start("replica", f"appliance.replica.leader={n0.address}")
    n1.wait_role("replica")
    _produce(n0, 1, b"end", produced)
    wait_byte_identical(leader_dir, follower_dir, timeout_s=90)
    assert n1.stop() == 0
    assert n0.stop() == 0
    assert differences(leader_dir, follower_dir) == []
    with LogReader(str(follower_dir)) as reader:
        records = {r.offset: (r.key, r.value) for b in reader.batches() for r in iter_records(b)}
        assert reader.log_end_offset == max(produced) + 1
    latest = {key: offset for offset, (key, _) in sorted(produced.items())}
    assert {key: offset for offset, (key, _) in sorted(records.items())} == latest
    assert all(produced[offset] == record for offset, record in records.items())
    assert len(records) < len(produced), "nothing was cleaned"
