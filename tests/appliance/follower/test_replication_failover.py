"""Replication with real processes on this host: a leader (``appliance serve``) and two ``appliance replica``
processes in other directories, under a continuous acks=all producer (3 replicas, min.insync.replicas=2).

Followers and the leader are SIGKILLed, a follower during its catch-up too; a replica is promoted with
``appliance replicas promote``; the old leader comes back as a replica of the new one.  At the end: every
acknowledged record is present exactly once on every in-sync replica, their logs are byte-identical up to
the high watermark, and the high watermark a consumer read never went backwards.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.replication_cluster import (
    REPO,
    TOPIC,
    AckedProducer,
    HighWatermarkWatcher,
    Node,
    followers,
    in_sync,
    wait_until,
)

from ipc.kafka import ErrorCode

LAG_MS = 1000
SETTINGS = {
    "replica.lag.time.max.ms": LAG_MS,
    "replica.fetch.backoff.ms": 50,
    "replica.socket.timeout.ms": 3000,
    "replica.fetch.max.bytes": 64 * 1024,  # small fetches: a restarted follower catches up in many steps
    "min.insync.replicas": 2,
    "segment.bytes": 256 * 1024,  # several segments: truncation and copies cross segment files
}
TOPICS = {TOPIC: {"partitions": 1, "replication.factor": 3}}


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[list[Node]]:
    root = Path(os.path.realpath(tmp_path))
    nodes = [Node(root, i, settings=SETTINGS, topics=TOPICS) for i in range(3)]
    leaders = ",".join(node.address for node in nodes)
    for node in nodes:
        node.leaders = leaders
    try:
        yield nodes
    finally:
        for node in nodes:
            node.close()


def start_replica(node: Node) -> None:
    node.start("replica", f"appliance.replica.leader={node.leaders}")


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "appliance.cli", *args], env=env, capture_output=True,
                          text=True, timeout=60)


@pytest.mark.slow
def test_kills_promotion_and_the_old_leader_rejoining_lose_no_acknowledged_record(
    cluster: list[Node],
) -> None:
    n0, n1, n2 = cluster
    n0.start("serve")
    n0.wait_role("leader")
    start_replica(n1)
    start_replica(n2)
    wait_until("both followers in the ISR", lambda: in_sync(n0, {1, 2}))

    producer = AckedProducer(cluster, batch_records=25).start()
    watcher = HighWatermarkWatcher(cluster).start()
    try:
        producer.wait_acked(2000)

        # 1. a follower dies: acks=all stall until it leaves the ISR, then go on with two replicas
        n2.kill()
        killed = time.monotonic()
        before = len(producer.acked)
        wait_until("follower 2 out of the ISR", lambda: not followers(n0)[2]["in_isr"], timeout_s=10)
        left_after = time.monotonic() - killed
        assert LAG_MS / 1000 * 0.9 <= left_after <= LAG_MS / 1000 + 2.5, left_after
        producer.wait_acked(before + 500, timeout_s=10)

        # 2. it restarts, and is killed again while catching up; the third start catches up
        start_replica(n2)
        wait_until("follower 2 fetching", lambda: followers(n0)[2]["log_end_offset"] > 0, timeout_s=20)
        assert not followers(n0)[2]["in_isr"]  # still behind: killed during its catch-up
        n2.kill()
        start_replica(n2)
        wait_until("follower 2 back in the ISR", lambda: followers(n0)[2]["in_isr"], timeout_s=30)
        producer.wait_acked(len(producer.acked) + 500, timeout_s=10)

        # 3. the leader dies; replica 1 (in sync) is promoted; the producer goes on with it
        n0.kill()
        acked_at_leader_death = len(producer.acked)
        time.sleep(0.3)
        promoted = cli("replicas", "promote", "--all", "--control-socket", n1.control_socket, "--wait", "30")
        assert promoted.returncode == 0, promoted.stdout + promoted.stderr + n1.log_text()[-3000:]
        assert "Promoted orders-0: node 1 leads it next" in promoted.stdout
        n1.wait_role("leader")
        producer.wait_acked(acked_at_leader_death + 500, timeout_s=30)
        wait_until("follower 2 follows node 1", lambda: in_sync(n1, {2}), timeout_s=30)

        # 4. the old leader comes back as a replica of the new one and truncates to it
        n0.start("serve", f"appliance.replica.leader={n0.leaders}")
        n0.wait_role("replica")
        producer.wait_acked(len(producer.acked) + 500, timeout_s=30)
    finally:
        producer.stop()
        watcher.stop()
    wait_until("all three in sync", lambda: in_sync(n1, {0, 2}), timeout_s=30)
    wait_until("the published high watermark at the log end",
               lambda: _partition(n1)["high_watermark"] == _partition(n1)["log_end_offset"], timeout_s=10)
    high_watermark = _partition(n1)["high_watermark"]

    # every acknowledged record exactly once on every in-sync replica
    acked = Counter(producer.acked)
    assert all(count == 1 for count in acked.values())
    for node in cluster:
        held = Counter(node.values())
        duplicates = [v for v, c in held.items() if c > 1]
        assert not duplicates, f"node {node.node_id}: {len(duplicates)} records twice, e.g. {duplicates[:3]}"
        missing = [v for v in acked if v not in held]
        assert not missing, f"node {node.node_id} lacks {len(missing)} acknowledged records: {missing[:3]}"
    # byte-identical logs up to the high watermark
    reference = n1.batches(upto=high_watermark)
    assert sum(len(b) for b in reference) > 256 * 1024  # several segments
    for node in (n0, n2):
        assert node.batches(upto=high_watermark) == reference, f"node {node.node_id} differs"
    # the high watermark a consumer saw never went backwards, across the leader change
    assert {leader for leader, _, _ in watcher.seen} >= {0, 1}
    assert watcher.backwards() == []
    # the old leader followed the new one, truncating first (what only it had, if anything, is gone)
    assert "following leader 1 at" in n0.log_text() and "truncating first" in n0.log_text()
    # what the producer saw: stalls, not silent losses; retriable errors only around the failures
    assert all(code in (ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.NOT_ENOUGH_REPLICAS,
                        ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND, ErrorCode.REQUEST_TIMED_OUT)
               for _, code in producer.errors), producer.errors
    for node in cluster:
        assert node.stop() == 0, node.log_text()[-3000:]


def _partition(leader: Node) -> dict[str, object]:
    return next(iter(followers(leader).values()))["partition"]  # type: ignore[no-any-return]
