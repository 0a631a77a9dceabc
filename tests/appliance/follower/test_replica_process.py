"""``appliance replica`` as a process, and what ``appliance replicas promote`` refuses or warns about.

A replica notifies systemd (READY, STOPPING), carries its title, stops cleanly on SIGTERM.  Promotion is
refused while the leader answers, for a subset of the partitions the replica holds, and for an out-of-sync
replica without ``--unclean``; with it, the promotion warns that acknowledged records may be lost, and the
old leader, returning as a replica, truncates the records the new leader never had: the logs end identical.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.replication_cluster import REPO, TOPIC, Node, followers, in_sync, wait_until

from appliance.client.producer import Producer
from appliance.config.topic_metadata import assign_replicas, read_topics
from appliance.server.metadata import MetadataStore
from appliance.server.proctitle import get_proctitle
from ipc.control import ControlError
from storage.errors import CorruptRecordError

SETTINGS = {
    "replica.lag.time.max.ms": 500,
    "replica.fetch.backoff.ms": 50,
    "replica.socket.timeout.ms": 3000,
    "min.insync.replicas": 1,
}
TOPICS = {TOPIC: {"partitions": 2, "replication.factor": 2}}


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[Node, Node]]:
    root = Path(os.path.realpath(tmp_path))
    n0 = Node(root, 0, settings=SETTINGS, topics=TOPICS)
    n1 = Node(root, 1, settings=SETTINGS, topics=TOPICS)
    n0.leaders = n1.leaders = f"{n0.address},{n1.address}"
    try:
        yield n0, n1
    finally:
        n0.close()
        n1.close()


class NotifySocket:
    """A Unix datagram socket standing in for systemd's NOTIFY_SOCKET."""

    def __init__(self) -> None:
        self.directory = tempfile.mkdtemp(prefix="la-n", dir="/tmp")
        self.path = os.path.join(self.directory, "n")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while True:
            try:
                self.lines += self.sock.recv(4096).decode().splitlines()
            except OSError:
                return

    def close(self) -> None:
        self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        self._thread.join(2)
        os.unlink(self.path)
        os.rmdir(self.directory)


def promote(node: Node, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "appliance.cli", "replicas", "promote", *args,
                           "--control-socket", node.control_socket], env=env, capture_output=True, text=True,
                          timeout=60)


def test_assign_replicas_and_the_metadata_file(tmp_path: Path) -> None:
    assert assign_replicas(0, 1) == ()
    assert assign_replicas(0, 3) == (0, 1, 2)
    assert assign_replicas(1, 3) == (1, 0, 2)
    assert assign_replicas(5, 2) == (5, 0)
    store = MetadataStore.open([str(tmp_path)])
    store.create_topic("t", 2, 3, replicas=(0, 1, 2))
    assert read_topics(store.path)["t"].replicas == (0, 1, 2)
    raw = store.path.read_text().replace('"replicas": [\n        0,\n        1,\n        2\n      ]',
                                          '"replicas": [0, 0, 1]')
    store.path.write_text(raw)
    with pytest.raises(CorruptRecordError, match="replicas must list 3 distinct node ids"):
        read_topics(store.path)


@pytest.mark.slow
def test_a_replica_process_notifies_is_titled_and_stops_cleanly(pair: tuple[Node, Node]) -> None:
    n0, n1 = pair
    n0.start("serve")
    n0.wait_role("leader")
    notify = NotifySocket()
    try:
        n1.start("replica", f"appliance.replica.leader={n0.address}", env={"NOTIFY_SOCKET": notify.path})
        wait_until("READY=1", lambda: any(line.startswith("READY=1") for line in notify.lines))
        assert get_proctitle(n1.pid) == "appliance: replica 1"
        wait_until("in sync", lambda: in_sync(n0, {1}, partition=0) and in_sync(n0, {1}, partition=1))
        status = n1.status()
        assert status["role"] == "replica" and status["node_id"] == 1
        assert sorted((p["topic"], p["partition"]) for p in status["partitions"]) == [(TOPIC, 0), (TOPIC, 1)]
        # it holds the topic in its own metadata (what a promotion serves from)
        assert read_topics(n1.data / "meta" / "topics.json")[TOPIC].replicas == (0, 1)
        n1.process.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
        assert n1.process.wait(20) == 0  # type: ignore[union-attr]
        assert any(line.startswith("STOPPING=1") for line in notify.lines)
        assert not os.path.exists(n1.control_socket)
    finally:
        notify.close()
    assert n0.stop() == 0


@pytest.mark.slow
def test_promotion_refusals_then_an_unclean_one_and_the_old_leader_truncates(pair: tuple[Node, Node]) -> None:
    n0, n1 = pair
    n0.start("serve")
    n0.wait_role("leader")
    n1.start("replica", f"appliance.replica.leader={n0.leaders}")
    wait_until("in sync", lambda: in_sync(n0, {1}, partition=0) and in_sync(n0, {1}, partition=1))
    with Producer({"appliance.control.socket": n0.control_socket, "acks": "all"}) as p:
        for i in range(200):
            p.send(TOPIC, b"both-%d" % i, partition=i % 2)
        p.flush(20)

    refused = promote(n1, "--all")
    assert refused.returncode == 1 and "still answers" in refused.stderr
    refused = promote(n1, f"{TOPIC}-0")
    assert refused.returncode == 1 and f"also name {TOPIC}-1" in refused.stderr
    with pytest.raises(ControlError, match="already leads"):
        n0.request({"op": "promote", "partitions": "all"})

    # the replica dies; the leader (min.insync.replicas 1) drops it from the ISR, takes writes alone, and
    # dies too; the replica comes back first: it never saw a leader since, it is not known to be in sync
    n1.kill()
    with Producer({"appliance.control.socket": n0.control_socket, "acks": "all"}) as p:
        for i in range(50):
            p.send(TOPIC, b"only-on-the-old-leader-%d" % i, partition=0)
        p.flush(10)
    assert not followers(n0, partition=0)[1]["in_isr"]
    n0.kill()
    n1.start("replica", f"appliance.replica.leader={n0.leaders}")
    n1.wait_role("replica")

    refused = promote(n1, "--all")
    assert refused.returncode == 1 and "not in sync" in refused.stderr and "--unclean" in refused.stderr
    assert "no leader was ever seen" in refused.stderr
    unclean = promote(n1, f"{TOPIC}-0", f"{TOPIC}-1", "--unclean", "--wait", "30")
    assert unclean.returncode == 0, unclean.stdout + unclean.stderr
    assert "WARNING: UNCLEAN PROMOTION" in unclean.stderr and "LOST" in unclean.stderr
    assert "UNCLEAN" in unclean.stdout
    n1.wait_role("leader")

    n0.start("serve", f"appliance.replica.leader={n0.leaders}")  # the old leader returns as a replica
    n0.wait_role("replica")
    wait_until("the old leader in sync",
               lambda: in_sync(n1, {0}, partition=0) and in_sync(n1, {0}, partition=1))
    assert "truncated from" in n0.log_text()
    for partition in (0, 1):
        assert n0.batches(partition=partition) == n1.batches(partition=partition)
    values = n0.values(partition=0)
    assert not any(v.startswith(b"only-on-the-old-leader") for v in values)

    # a replica frozen while its leader drops it from the ISR, writes alone and dies: its last view of the
    # ISR (with itself) is stale, and it says so
    n0.signal(signal.SIGSTOP)
    with Producer({"appliance.control.socket": n1.control_socket, "acks": "all"}) as p:
        p.send(TOPIC, b"while-frozen", partition=0).get(10)
    time.sleep(1.2)  # frozen well past replica.lag.time.max.ms (0.5 s) + one refresh interval (0.5 s)
    n1.kill()
    n0.signal(signal.SIGCONT)
    time.sleep(0.7)  # its next look at the leaders finds nobody
    refused = promote(n0, "--all")
    # Either reason is a correct refusal: which one depends on whether the thawed replica saw the ISR without
    # itself before its leader died (on a loaded machine it may have).
    assert refused.returncode == 1, refused.stderr
    assert "dropped from the ISR unseen" in refused.stderr or "not in sync" in refused.stderr
    assert n0.stop() == 0
