"""The ISR under a stalled follower, with the replicas ``appliance serve`` spawns on other directories.

A follower stopped with SIGSTOP leaves the ISR once it has not caught up for ``replica.lag.time.max.ms``
and rejoins once it runs again; acks=all producers -- over the Kafka protocol and local ones over rings --
stall only while the stopped follower still counts, and get NotEnoughReplicas errors (not silence) while
the ISR is below ``min.insync.replicas``.  ``appliance topics describe`` and ``appliance replicas status``
show the leader, the replicas, the ISR and each follower's lag.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.replication_cluster import (
    REPO,
    TOPIC,
    AckedProducer,
    Node,
    followers,
    in_sync,
    log_batches,
    wait_until,
)

from appliance.client.producer import Producer
from ipc.kafka import ErrorCode
from storage.errors import NotEnoughReplicasError

LAG_MS = 1000


@pytest.fixture
def leader(tmp_path: Path) -> Iterator[Node]:
    root = Path(os.path.realpath(tmp_path))
    node = Node(root, 0, settings={
        "appliance.replica.dirs": [str(root / "r1"), str(root / "r2")],
        "replica.lag.time.max.ms": LAG_MS,
        "replica.fetch.backoff.ms": 50,
        "min.insync.replicas": 2,
    }, topics={TOPIC: {"partitions": 1, "replication.factor": 3}})
    node.start("serve")
    try:
        node.wait_role("leader")
        yield node
    finally:
        node.close()


def replica_pids(leader: Node) -> dict[int, int]:
    """node id -> pid of the replica children of the leader's supervisor (titled "appliance: replica N")."""
    found = {}
    with open(f"/proc/{leader.pid}/task/{leader.pid}/children") as f:
        children = [int(p) for p in f.read().split()]
    for pid in children:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            title = f.read().rstrip(b"\0").decode(errors="replace")
        if title.startswith("appliance: replica "):
            found[int(title.split()[2])] = pid
    return found


def cli(*args: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "appliance.cli", *args], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.mark.slow
def test_a_stopped_follower_leaves_the_isr_and_rejoins_and_too_few_replicas_are_errors(leader: Node) -> None:
    wait_until("replicas 1 and 2 in the ISR", lambda: in_sync(leader, {1, 2}))
    pids = replica_pids(leader)
    assert sorted(pids) == [1, 2]
    replicas_dir = Path(leader.root)
    assert (replicas_dir / "r1" / f"{TOPIC}-0").is_dir() and (replicas_dir / "r2" / f"{TOPIC}-0").is_dir()

    producer = AckedProducer([leader], batch_records=10, timeout_ms=30_000).start()
    local = Producer({"appliance.control.socket": leader.control_socket, "acks": "all", "linger.ms": 1})
    try:
        producer.wait_acked(500)
        assert local.send(TOPIC, b"local-1").get(10).offset >= 0

        # one follower stops: it leaves the ISR after replica.lag.time.max.ms; the ISR {0, 1} still has
        # min.insync.replicas, so acks=all goes on after a stall of about the lag time
        os.kill(pids[2], signal.SIGSTOP)
        stopped = time.monotonic()
        wait_until("follower 2 out of the ISR", lambda: not followers(leader)[2]["in_isr"], timeout_s=10,
                   interval_s=0.01)
        left = time.monotonic() - stopped
        assert LAG_MS / 1000 * 0.9 <= left <= LAG_MS / 1000 + 1.0, left
        acked = len(producer.acked)
        producer.wait_acked(acked + 200, timeout_s=10)
        assert local.send(TOPIC, b"local-2").get(10).offset >= 0
        stalls = [answered - sent for sent, answered, code in producer.answers if answered > stopped]
        assert max(stalls) <= LAG_MS / 1000 + 1.5  # a stall, never silence

        # the other one stops too: the ISR falls below min.insync.replicas -> NotEnoughReplicas, promptly
        os.kill(pids[1], signal.SIGSTOP)
        both = time.monotonic()
        wait_until("only the leader in the ISR", lambda: not followers(leader)[1]["in_isr"], timeout_s=10)
        wait_until("the producer gets NotEnoughReplicas errors",
                   lambda: any(t > both and code in (ErrorCode.NOT_ENOUGH_REPLICAS,
                                                     ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND)
                               for t, code in producer.errors), timeout_s=10)
        answered_late = [answered - max(sent, both) for sent, answered, _ in producer.answers
                         if answered > both]
        assert max(answered_late) <= LAG_MS / 1000 + 1.5, "an acks=all request waited silently"
        with Producer({"appliance.control.socket": leader.control_socket, "acks": "all", "retries": 0,
                       "enable.idempotence": False, "linger.ms": 0}) as strict:
            with pytest.raises(NotEnoughReplicasError, match="NOT_ENOUGH_REPLICAS"):
                strict.send(TOPIC, b"refused").get(10)
        status = cli("replicas", "status", "--control-socket", leader.control_socket)
        assert f"Topic: {TOPIC}\tPartition: 0\tLeader: 0" in status and "Isr: 0\t" in status
        assert "Follower: 1\tInIsr: no" in status and "Follower: 2\tInIsr: no" in status

        # both run again: they catch up, rejoin the ISR, and acks=all succeeds again
        os.kill(pids[1], signal.SIGCONT)
        os.kill(pids[2], signal.SIGCONT)
        wait_until("both followers back in the ISR", lambda: in_sync(leader, {1, 2}), timeout_s=20)
        acked = len(producer.acked)
        producer.wait_acked(acked + 200, timeout_s=20)
        assert local.send(TOPIC, b"local-3").get(10).offset >= 0
    finally:
        for pid in pids.values():
            os.kill(pid, signal.SIGCONT)
        local.close()
        producer.stop()

    described = cli("topics", "describe", TOPIC, "--control-socket", leader.control_socket)
    assert "ReplicationFactor: 3" in described
    assert "Leader: 0\tReplicas: 0,1,2\tIsr: 0,1,2" in described
    assert "\t\tFollower: 1\tInIsr: yes" in described
    assert "LagRecords: " in described and "LagMs: " in described
    wait_until("all in sync", lambda: in_sync(leader, {1, 2}))
    end = followers(leader)[1]["partition"]["log_end_offset"]
    reference = leader.batches()
    for name in ("r1", "r2"):
        assert log_batches(Path(leader.root) / name / f"{TOPIC}-0", upto=end) == reference
    assert leader.stop() == 0, leader.log_text()[-3000:]
